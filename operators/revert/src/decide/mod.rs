//! The pure heart of sluice-revert: (spec, current status, observations, now) → (actions, next
//! status).
//!
//! Status is the state machine: Verifying → Pinning → Pinned → Released, or Refused. Each step
//! is decided from what the status recorded and what the reconcile observed, so a restarted
//! operator reaches the same decision: the original sync policy is recorded in the status
//! before any Application is touched, effects are idempotent (suspend, server-side apply, prune,
//! restore), and the git revert is asked for until the status records it (the git client never
//! pushes a branch twice, nor reports a branch another pin pushed): a failure that may pass is
//! asked again after a growing back-off, one that cannot ([`crate::record`] tells them
//! apart) waits for a change of the spec. Must never do I/O or read the clock; never emits an effect before the
//! bundle's signature and kinds are verified and every target is found suitable.
//!
//! One file per phase, the shared model below them: `model` (observations, actions, the
//! decision, constants, condition and Event helpers), `plan` (what the reconcile fetches
//! first), `validate`, `drift`, `verifying`, `pinning`, `pinned`, `git` (the revert
//! branch and its attempts) and `release`; this module holds [`decide`] and the step between
//! phases. Unit tests sit beside them in `tests.rs` and `validity_tests.rs`.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec, BundlePinStatus,
    bundle_pin::{PinHistoryEntry, conditions, reasons},
};
use sluice_runtime::conditions as cond;

use crate::validity;

mod drift;
mod git;
mod model;
mod pinned;
mod pinning;
mod plan;
mod release;
#[cfg(test)]
mod tests;
mod validate;
#[cfg(test)]
mod validity_tests;
mod verifying;

pub use drift::*;
pub use git::*;
pub use model::*;
pub use pinned::*;
pub use pinning::*;
pub use plan::*;
use release::*;
pub use validate::*;
use verifying::*;

/// Decides the next status of a BundlePin.
pub fn decide(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut problems = validity::problems(spec);
    problems.extend(validity::unreachable_targets(
        spec,
        &obs.pin.0,
        obs.application_namespace.as_deref(),
    ));
    let validity = decide_validity(&problems, status, obs, now);
    if validity.status.phase == BundlePinPhase::Refused
        && cond::find(&validity.status.conditions, conditions::READY)
            .is_some_and(|c| c.status == "False")
    {
        return validity;
    }
    let mut d = validity;
    let before = d.status.phase;
    if d.status.created_by.is_none() {
        d.status.created_by = obs.created_by.clone();
    }
    step(spec, obs, now, &mut d);
    if d.status.phase != before {
        record(&mut d, now);
    }
    d
}

/// Appends the phase just entered to the status history (bounded), with the reason and
/// message of the condition that decided it.
fn record(d: &mut Decision, now: Timestamp) {
    let phase = d.status.phase;
    let by_type = match phase {
        BundlePinPhase::Pinned | BundlePinPhase::Failed => conditions::PINNED,
        BundlePinPhase::Released => conditions::RELEASED,
        _ => conditions::VERIFIED,
    };
    let c = cond::find(&d.status.conditions, by_type)
        .or_else(|| cond::find(&d.status.conditions, conditions::READY));
    let message = c.map(|c| c.message.chars().take(1024).collect::<String>());
    let entry = PinHistoryEntry {
        at: Time(now),
        phase,
        reason: c.map(|c| c.reason.clone()).unwrap_or_default(),
        from_digest: d.status.from_digest.clone(),
        to_digest: d.status.to_digest.clone(),
        created_by: d.status.created_by.clone(),
        message,
    };
    sluice_runtime::decision::record_bounded(&mut d.status.history, entry, MAX_HISTORY);
}

/// The state machine after validation.
fn step(spec: &BundlePinSpec, obs: &Observations, now: Timestamp, d: &mut Decision) {
    let gen_ = obs.generation;
    if !matches!(
        d.status.phase,
        BundlePinPhase::Released | BundlePinPhase::Refused
    ) && let Some(by) = superseded_by(obs, &d.status)
    {
        handed_over(by.name.clone(), now, gen_, d);
        return;
    }
    if d.status.phase == BundlePinPhase::Failed && spec.release && !is_over(Some(&d.status)) {
        // A failed pin may have suspended some Applications: a release gives them back.
        release(
            spec,
            obs,
            now,
            d,
            reasons::RELEASED_EXPLICITLY,
            format!(
                "released after a failure: {}",
                spec.release_reason.as_deref().unwrap_or("no reason given")
            ),
        );
        return;
    }
    if matches!(
        d.status.phase,
        BundlePinPhase::Released | BundlePinPhase::Refused | BundlePinPhase::Failed
    ) {
        d.requeue = Requeue::AwaitChange;
        return;
    }
    // A changed spec never redirects a pin: it keeps holding what it verified, applies nothing
    // new, and still releases (explicitly, on deletion, or on matching content).
    let drifted = check_drift(spec, obs, now, d);
    match d.status.phase {
        BundlePinPhase::Released | BundlePinPhase::Refused | BundlePinPhase::Failed => {
            d.requeue = Requeue::AwaitChange;
        }
        _ if spec.release => release(
            spec,
            obs,
            now,
            d,
            reasons::RELEASED_EXPLICITLY,
            format!(
                "released explicitly: {}",
                spec.release_reason.as_deref().unwrap_or("no reason given")
            ),
        ),
        BundlePinPhase::Verifying => verifying(spec, obs, now, d, gen_),
        BundlePinPhase::Pinning
            if deadline_left(spec, &d.status, now).is_some_and(|l| l.is_zero()) =>
        {
            give_back(spec, obs, now, d)
        }
        // Waits for the spec to be restored, or for a release; the object's change wakes it
        // (and the deadline, which gives automation back).
        BundlePinPhase::Pinning if drifted => {
            d.requeue =
                deadline_left(spec, &d.status, now).map_or(Requeue::AwaitChange, Requeue::After)
        }
        BundlePinPhase::Pinning => pinning(spec, obs, now, d, gen_),
        BundlePinPhase::Pinned => pinned(spec, obs, now, d, gen_),
        BundlePinPhase::Releasing => release(
            spec,
            obs,
            now,
            d,
            reasons::CONTENT_MATCHED,
            "Argo CD reports the pinned content".into(),
        ),
    }
}
