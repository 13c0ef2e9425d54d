//! The current wave's gates as the upgrade judges them: a gate that could not be resolved (a
//! missing or unreadable GateTemplate, a field that does not parse) is Inconclusive under the
//! upgrade's `spec.inconclusive`, its streak carried in the status, so that policy applies once
//! its deadline passes (never an endless wait); and a gate that cannot be evaluated as
//! configured makes the upgrade `Ready=False` (reason [`GATE_MISCONFIGURED`]) naming the gate
//! and the field, until an evaluation finds none or the upgrade finishes (Complete, Aborted: no
//! gate is evaluated any more). Must never judge a resolved gate (the signals
//! did, under its own policy) nor read the clock.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use sluice_api::v1alpha1::{
    RevisionUpgradePhase, RevisionUpgradeSpec, RevisionUpgradeStatus, gate::find_verdict,
    revision_upgrade::conditions,
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{Decision, GATE_MISCONFIGURED, GateReport, Observations};

/// `report` with its unresolved gates judged: each Inconclusive (its streak carried from its
/// verdict in `status`) with the action `spec.inconclusive` calls for, combined with the
/// resolved gates' action.
pub(super) fn judge(
    spec: &RevisionUpgradeSpec,
    status: &RevisionUpgradeStatus,
    report: &GateReport,
    now: Timestamp,
) -> GateReport {
    let mut judged = report.clone();
    if report.unresolved.is_empty() {
        return judged;
    }
    let previous = status
        .waves
        .iter()
        .find(|w| w.name == report.wave)
        .map(|w| w.gates.as_slice())
        .unwrap_or_default();
    let mut actions = Vec::new();
    for u in &report.unresolved {
        let v =
            sluice_analysis::unevaluated(&u.gate, &u.message, find_verdict(previous, &u.gate), now);
        actions.push(sluice_analysis::policy_action(&spec.inconclusive, &v, now));
        judged.verdicts.push(v);
    }
    judged.action =
        Some(sluice_analysis::combined_action(report.action.into_iter().chain(actions)).0);
    judged
}

/// `status` as the validity step should see it: a `Ready=False` of this module's is "valid" to
/// it, so keeping or clearing it never reads as the spec being accepted again.
pub(super) fn masked(status: Option<&RevisionUpgradeStatus>) -> Option<RevisionUpgradeStatus> {
    status.cloned().map(|mut s| {
        if let Some(c) = s
            .conditions
            .iter_mut()
            .find(|c| c.type_ == conditions::READY && c.reason == GATE_MISCONFIGURED)
        {
            c.status = Status::True.as_str().into();
            c.reason = cond::VALID.into();
            c.message = "spec is valid".into();
        }
        s
    })
}

/// Sets `Ready` of a valid spec from the gates' configuration: False naming every problem
/// (one Warning Event when found or changed) when the latest evaluation found any; True again,
/// from `now`, when an evaluation found none; between evaluations the last finding stands.
pub(super) fn set_ready(
    d: &mut Decision,
    before: Option<&RevisionUpgradeStatus>,
    obs: &Observations,
    now: Timestamp,
) {
    let before = before
        .and_then(|s| cond::find(&s.conditions, conditions::READY))
        .filter(|c| c.reason == GATE_MISCONFIGURED)
        .cloned();
    match (obs.gates.as_ref().map(|g| &g.misconfigured), before) {
        (Some(found), before) if !found.is_empty() => {
            let message = cond::problems_message(found);
            let changed = before.as_ref().is_none_or(|b| b.message != message);
            let mut c = cond::new(
                conditions::READY,
                Status::False,
                GATE_MISCONFIGURED,
                message.clone(),
                obs.generation,
                now,
            );
            if let Some(b) = before.filter(|_| !changed) {
                c.last_transition_time = b.last_transition_time;
            }
            replace(&mut d.status.conditions, c);
            if changed {
                d.event(Notice::warning(
                    GATE_MISCONFIGURED,
                    sluice_runtime::validity::VALIDATE,
                    format!(
                        "a gate cannot be evaluated as configured; it stays Inconclusive under its Inconclusive policy: {message}"
                    ),
                ));
            }
        }
        (Some(_), Some(_)) => {
            // Fixed: Ready again from now (the validity step kept the problem's time).
            if let Some(c) = d
                .status
                .conditions
                .iter_mut()
                .find(|c| c.type_ == conditions::READY)
            {
                c.last_transition_time = Time(now);
            }
        }
        (None, Some(before)) => replace(&mut d.status.conditions, before),
        _ => {}
    }
}

/// A finished upgrade (Complete, or Aborted until a resume) evaluates no gate any more: its
/// `Ready` says whether the spec is valid, not what the run's last gate evaluation found, so a
/// `GateMisconfigured` finding does not stay on the finished object. Ready again from `now`; a
/// resume evaluates the gates again and finds it again if it still holds.
pub(super) fn settle_when_finished(d: &mut Decision, generation: Option<i64>, now: Timestamp) {
    if !matches!(
        d.status.phase,
        RevisionUpgradePhase::Complete | RevisionUpgradePhase::Aborted
    ) {
        return;
    }
    let misconfigured = cond::find(&d.status.conditions, conditions::READY)
        .is_some_and(|c| c.reason == GATE_MISCONFIGURED);
    if misconfigured {
        cond::set_validity(&mut d.status.conditions, &[], generation, now);
    }
}

/// Puts `c` in place of the condition of its type, its transition time as given.
fn replace(conditions: &mut Vec<Condition>, c: Condition) {
    match conditions.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) => *x = c,
        None => conditions.push(c),
    }
}
