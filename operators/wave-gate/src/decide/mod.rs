//! The pure heart of sluice-wave-gate: (spec, current status, observations, now) → (actions, next
//! status).
//!
//! Status is the state machine: each wave's state and its timestamps (admitted, converged,
//! finished) live in `status.waves`, so a restarted operator continues the same soak from
//! `convergedAt` and never admits a wave twice. Owns adoption, admission (with cross-site waits
//! and their audited releases), convergence, the soak and its gates, the halt with its pins and
//! the decisions set back, supersession and emergency changes. Must never do I/O or read the
//! clock, and never produce a decision list that misses a cluster (see `decisions`).
//!
//! One file per phase, the shared model below them: `model` (observations, actions, the
//! decision, the ApplicationSet checks, timing helpers and the context every phase writes
//! into), `adopt`, `change` (a new revision), `progress` (emergency and the active wave's
//! step), `admit`, `converge`, `soak` and `halt` (its pins and the decisions set back); this
//! module holds [`decide`] and the step between phases. Unit tests sit beside them in
//! `tests.rs` and `scenario_tests.rs`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sluice_api::external::argocd::UnsafeApplicationSet;
use sluice_api::v1alpha1::wave_gate::{
    ChangeOutcome, ChangeRecord, DriftExporter, WaveState, WaveStatus, conditions as types, reasons,
};
use sluice_api::v1alpha1::{WaveGatePhase, WaveGateSpec, WaveGateStatus};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::{Notice, Severity},
};

use crate::{decisions, validity};

mod admit;
mod adopt;
mod change;
mod converge;
mod halt;
mod model;
mod progress;
#[cfg(test)]
mod scenario_tests;
mod soak;
#[cfg(test)]
mod tests;

pub use adopt::*;
use change::*;
pub use halt::*;
pub use model::*;
use progress::*;
pub use soak::*;

/// Decides the next status of a WaveGate.
pub fn decide(
    spec: &WaveGateSpec,
    status: Option<&WaveGateStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut cx = Machine {
        spec,
        obs,
        now,
        decision: Decision::starting_from(status.cloned().unwrap_or_default()),
    };
    cx.decision.status.observed_generation = obs.generation;
    let requeue = step(&mut cx);
    // Released pins this WaveGate created go, once no halt may still create or count them (a
    // halt's pins are created and judged only until it pinned back): revert gave their
    // Applications back, and a Released pin holds nothing.
    if cx
        .decision
        .status
        .halt
        .as_ref()
        .is_none_or(|h| h.pinned_at.is_some())
    {
        cx.decision
            .actions
            .extend(obs.released_pins.iter().cloned().map(Action::DeletePin));
    }
    cx.decision.status.phase = phase(&cx.decision.status);
    let active = active_wave(&cx.decision.status);
    let shown = match (&cx.decision.status.halt, active) {
        (Some(h), _) => spec.waves.iter().position(|w| w.name == h.wave),
        (None, Some(i)) => Some(i),
        (None, None) if !cx.decision.status.waves.is_empty() => {
            Some(cx.decision.status.waves.len() - 1)
        }
        _ => None,
    };
    cx.decision.status.current_wave_index = shown.map(|i| i as u32);
    cx.decision.status.current_wave = shown
        .and_then(|i| spec.waves.get(i))
        .map(|w| w.name.clone());
    cx.decision.requeue = requeue;
    cx.decision
}

fn phase(s: &WaveGateStatus) -> WaveGatePhase {
    let refused =
        |t: &str| cond::find(&s.conditions, t).is_some_and(|c| c.status == Status::False.as_str());
    if refused(types::READY) || refused(types::APPLICATION_SET_SAFE) {
        return WaveGatePhase::Refused;
    }
    if s.decisions.is_empty() {
        return WaveGatePhase::Pending;
    }
    if s.halt.is_some() {
        return WaveGatePhase::Halted;
    }
    match active_wave(s).map(|i| s.waves[i].state) {
        None => WaveGatePhase::Complete,
        Some(WaveState::Soaking) => WaveGatePhase::Soaking,
        Some(WaveState::Waiting) => WaveGatePhase::WaitingForSite,
        Some(_) => WaveGatePhase::Progressing,
    }
}

fn step(cx: &mut Machine<'_>) -> Requeue {
    let spec = cx.spec;
    let every = interval(spec);

    // 1. The spec.
    let problems = validity::problems(spec, cx.obs.allow_free_form_promql);
    let v = cond::set_validity(
        &mut cx.decision.status.conditions,
        &problems,
        cx.obs.generation,
        cx.now,
    );
    if v.transitioned {
        if v.valid {
            cx.decision.event(Notice::normal(
                reasons::VALID,
                sluice_runtime::validity::VALIDATE,
                "spec accepted",
            ));
        } else {
            cx.decision.event(Notice::warning(
                reasons::INVALID_SPEC,
                sluice_runtime::validity::VALIDATE,
                v.message,
            ));
        }
    }
    if !v.valid {
        // Waited on: the object must change.
        return Requeue::AwaitChange;
    }

    // 2. The ApplicationSet must never delete Applications or their resources.
    let (safe, reason, message) = match &cx.obs.application_set {
        ApplicationSetView::Missing => (
            false,
            reasons::APPLICATION_SET_NOT_FOUND,
            format!(
                "ApplicationSet {} not found; create it or fix spec.applicationSetRef",
                spec.application_set_ref.name
            ),
        ),
        ApplicationSetView::Found(p) if p.is_empty() => (
            true,
            reasons::APPLICATION_SET_OK,
            "applicationsSync is create-update, preserveResourcesOnDeletion is true, ignoreApplicationDifferences covers /spec/syncPolicy of every Application and the template takes each Application's revision and cluster from its decision".into(),
        ),
        ApplicationSetView::Found(p) => (
            false,
            match p[0] {
                UnsafeApplicationSet::ApplicationsSync(_) => reasons::APPLICATIONS_SYNC_UNSAFE,
                UnsafeApplicationSet::ResourcesNotPreserved => reasons::RESOURCES_NOT_PRESERVED,
                UnsafeApplicationSet::SyncPolicyNotIgnored => reasons::SYNC_POLICY_NOT_IGNORED,
                UnsafeApplicationSet::TemplateNotFromDecisions(_) => {
                    reasons::TEMPLATE_NOT_FROM_DECISIONS
                }
            },
            format!(
                "ApplicationSet {}: {}; the WaveGate publishes nothing until it is fixed",
                spec.application_set_ref.name,
                p.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
    };
    // The controller-level policy and the generator binding, beyond the ApplicationSet's spec.
    let (safe, reason, message) = match (
        safe,
        controller_policy_problem(cx.obs.controller_params.as_ref()),
        binding_problem(&cx.obs.decision_resources, &cx.obs.name),
    ) {
        (true, Some(p), _) => (
            false,
            reasons::APPLICATIONS_SYNC_UNSAFE,
            format!(
                "ApplicationSet {}: {p}; the WaveGate publishes nothing until it is fixed",
                spec.application_set_ref.name
            ),
        ),
        (true, None, Some(b)) => (
            false,
            reasons::NOT_THIS_WAVE_GATE,
            format!(
                "ApplicationSet {}: {b}; the WaveGate publishes nothing until it is fixed",
                spec.application_set_ref.name
            ),
        ),
        other => (other.0, reason, message),
    };
    let status = if safe { Status::True } else { Status::False };
    if cx.decision.condition(
        cx.stamp(),
        types::APPLICATION_SET_SAFE,
        status,
        reason,
        message.clone(),
    ) {
        cx.decision.event(Notice {
            severity: if safe {
                Severity::Normal
            } else {
                Severity::Warning
            },
            reason,
            action: EventAction::CheckApplicationSet.into(),
            note: message,
        });
    }
    if !safe {
        return Requeue::After(every);
    }

    // 3. The drift signal, stated explicitly.
    match spec.drift_gate.exporter {
        DriftExporter::None => cx.decision.condition(
            cx.stamp(),
            types::DRIFT_SIGNAL,
            Status::False,
            reasons::DRIFT_EXPORTER_ABSENT,
            "driftGate.exporter is None: the platform has no drift exporter, so proxies' acknowledgement is not checked and the proxies-behind gate is reported as skipped",
        ),
        DriftExporter::Platform => cx.decision.condition(
            cx.stamp(),
            types::DRIFT_SIGNAL,
            Status::True,
            reasons::DRIFT_SIGNAL_PRESENT,
            format!(
                "reading {} by {} and {}",
                spec.drift_gate.metric.as_deref().unwrap_or_default(),
                spec.drift_gate.cluster_label,
                spec.drift_gate.commit_label
            ),
        ),
    };

    // 4. Adoption: publish the revision the site runs for every cluster.
    if cx.decision.status.decisions.is_empty() {
        match adoption_revision(spec, cx.obs) {
            Ok(r) => {
                cx.decision.status.decisions = decisions::complete(spec, &[], &r);
                cx.decision.status.current_revision = Some(r.clone());
                if r == spec.revision {
                    cx.decision.status.source_commit = spec.source_commit.clone();
                }
                cx.decision.status.waves.clear();
                cx.decision.status.history.push(ChangeRecord {
                    revision: r.clone(),
                    previous_revision: None,
                    started_at: Time(cx.now),
                    finished_at: Some(Time(cx.now)),
                    outcome: Some(ChangeOutcome::Complete),
                    reason: Some("adopted: the revision the site ran".into()),
                });
                let note = format!(
                    "adopted: every cluster of site {} published at {r}",
                    spec.site
                );
                cx.decision.condition(
                    cx.stamp(),
                    types::PROGRESSING,
                    Status::False,
                    reasons::ADOPTED,
                    note.clone(),
                );
                cx.decision
                    .event(Notice::normal(reasons::ADOPTED, EventAction::Adopt, note));
                cx.decision.actions.push(Action::NudgeApplicationSet);
            }
            Err(why) => {
                if cx.decision.condition(
                    cx.stamp(),
                    types::PROGRESSING,
                    Status::Unknown,
                    reasons::ADOPTION_PENDING,
                    why.clone(),
                ) {
                    cx.decision.event(Notice::warning(
                        reasons::ADOPTION_PENDING,
                        EventAction::Adopt,
                        why,
                    ));
                }
                return Requeue::After(every);
            }
        }
    } else {
        // Keep the list complete if spec.waves changed.
        let fallback = cx
            .decision
            .status
            .previous_revision
            .clone()
            .or(cx.decision.status.current_revision.clone())
            .unwrap_or_else(|| spec.revision.clone());
        cx.decision.status.decisions =
            decisions::complete(spec, &cx.decision.status.decisions, &fallback);
    }
    align_waves(cx);

    // 5. A halt: pins first, then decisions back; nothing else moves until both are done.
    let new_revision =
        cx.decision.status.current_revision.as_deref() != Some(spec.revision.as_str());
    let mut halt_requeue = Requeue::AwaitChange;
    if let Some(h) = &cx.decision.status.halt {
        let pinned = h.pinned_at.is_some() || cx.decision.status.previous_revision.is_none();
        let r = finish_halt(cx);
        if !new_revision || (!pinned && spec.supersede_halted) {
            return r;
        }
        halt_requeue = r;
    }

    // 6. A new revision. While an unfinished halt holds it (no supersede), the halt's own
    // requeue (its pin wait) is kept: waiting only for a change would lose the fallback.
    if new_revision && let Some(r) = start_change(cx) {
        return match &cx.decision.status.halt {
            Some(h) if h.pinned_at.is_none() => r.sooner(halt_requeue),
            _ => r,
        };
    }

    // 7. Move the change on.
    progress(cx)
}

/// Keeps `status.waves` in spec order, carrying each wave's state by name.
fn align_waves(cx: &mut Machine<'_>) {
    if cx.decision.status.waves.is_empty() {
        return;
    }
    let old: BTreeMap<String, WaveStatus> = cx
        .decision
        .status
        .waves
        .drain(..)
        .map(|w| (w.name.clone(), w))
        .collect();
    cx.decision.status.waves = cx
        .spec
        .waves
        .iter()
        .map(|w| {
            old.get(&w.name).cloned().unwrap_or_else(|| WaveStatus {
                name: w.name.clone(),
                ..WaveStatus::default()
            })
        })
        .collect();
}
