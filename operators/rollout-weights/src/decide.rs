//! The pure heart of sluice-rollout-weights: (spec, current status, observations, now) → (actions,
//! next status, requeue).
//!
//! Owns the order of judgement: validity first (what CEL cannot express; sets
//! `status.observedGeneration`, the `Ready` condition and phase `Invalid`), then, for a valid spec
//! only, the state machine in [`crate::step`]. Must never do I/O or read the clock.

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{RolloutPhase, RolloutSpec, RolloutStatus, rollout::reasons};
use sluice_runtime::{conditions as cond, events::Severity};

pub use crate::step::{Action, Decision, Observations, Requeue};
use crate::{step, validity};

/// The Event action name of validation outcomes.
pub const VALIDATE: &str = "Validate";

/// Decides the next status of a Rollout: validity, then the state machine when the spec is
/// valid. `allow_free_form_promql` is the platform's policy for free-form PromQL gates.
pub fn decide(
    spec: &RolloutSpec,
    status: Option<&RolloutStatus>,
    obs: &Observations,
    allow_free_form_promql: bool,
    now: Timestamp,
) -> Decision {
    let checked = decide_validity(
        &validity::problems(spec, allow_free_form_promql),
        status,
        obs.generation,
        now,
    );
    if checked.status.phase == RolloutPhase::Invalid {
        // An invalid spec is waited on; a Rollout being deleted still hands its route back.
        if !obs.deleting {
            return checked;
        }
    }
    let mut next = step::step(spec, checked.status, obs, now);
    let mut actions = checked.actions;
    actions.append(&mut next.actions);
    next.actions = actions;
    next
}

/// The validity part of [`decide`], given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&RolloutStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> Decision {
    let mut next = status.cloned().unwrap_or_default();
    next.observed_generation = generation;
    let validity = cond::set_validity(&mut next.conditions, problems, generation, now);
    if !validity.valid {
        next.phase = RolloutPhase::Invalid;
    } else if validity.was_invalid && next.phase == RolloutPhase::Invalid {
        next.phase = RolloutPhase::Pending;
    }
    let note = validity.message;

    let mut actions = Vec::new();
    if validity.transitioned {
        actions.push(if validity.valid {
            Action::Event {
                severity: Severity::Normal,
                reason: reasons::VALID,
                action: VALIDATE,
                note: "spec accepted".to_owned(),
            }
        } else {
            Action::Event {
                severity: Severity::Warning,
                reason: reasons::INVALID_SPEC,
                action: VALIDATE,
                note,
            }
        });
    }
    Decision {
        actions,
        status: next,
        // An invalid spec is waited on (no requeue loop).
        requeue: Requeue::AwaitChange,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_api::v1alpha1::rollout::conditions;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn obs(generation: i64) -> Option<i64> {
        Some(generation)
    }

    fn problem() -> Vec<String> {
        vec!["spec.steps[2].setWeight.weight: example problem".to_owned()]
    }

    struct Row {
        name: &'static str,
        problems: Vec<String>,
        status: Option<RolloutStatus>,
        generation: i64,
        now: i64,
        want_phase: RolloutPhase,
        want_ready: (&'static str, &'static str),
        want_transition: i64,
        want_events: Vec<&'static str>,
    }

    fn run(row: &Row) -> Decision {
        decide_validity(
            &row.problems,
            row.status.as_ref(),
            obs(row.generation),
            t(row.now),
        )
    }

    #[test]
    fn validity_transitions() {
        let invalid_at_0 = decide_validity(&problem(), None, obs(1), t(0)).status;
        let valid_at_0 = decide_validity(&[], None, obs(1), t(0)).status;
        let table = vec![
            Row {
                name: "new valid object",
                problems: vec![],
                status: None,
                generation: 1,
                now: 0,
                want_phase: RolloutPhase::Pending,
                want_ready: ("True", reasons::VALID),
                want_transition: 0,
                want_events: vec![reasons::VALID],
            },
            Row {
                name: "new invalid object",
                problems: problem(),
                status: None,
                generation: 1,
                now: 0,
                want_phase: RolloutPhase::Invalid,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 0,
                want_events: vec![reasons::INVALID_SPEC],
            },
            Row {
                name: "identical reconcile of an invalid object",
                problems: problem(),
                status: Some(invalid_at_0.clone()),
                generation: 1,
                now: 60,
                want_phase: RolloutPhase::Invalid,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 0,
                want_events: vec![],
            },
            Row {
                name: "invalid object fixed",
                problems: vec![],
                status: Some(invalid_at_0),
                generation: 2,
                now: 60,
                want_phase: RolloutPhase::Pending,
                want_ready: ("True", reasons::VALID),
                want_transition: 60,
                want_events: vec![reasons::VALID],
            },
            Row {
                name: "valid object, new generation, still valid",
                problems: vec![],
                status: Some(valid_at_0.clone()),
                generation: 2,
                now: 60,
                want_phase: RolloutPhase::Pending,
                want_ready: ("True", reasons::VALID),
                want_transition: 0,
                want_events: vec![],
            },
            Row {
                name: "valid object broken by an edit",
                problems: problem(),
                status: Some(valid_at_0),
                generation: 2,
                now: 60,
                want_phase: RolloutPhase::Invalid,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 60,
                want_events: vec![reasons::INVALID_SPEC],
            },
        ];
        for row in &table {
            let d = run(row);
            let ready = cond::find(&d.status.conditions, conditions::READY)
                .unwrap_or_else(|| panic!("{}: no Ready condition", row.name));
            assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
            assert_eq!(
                d.status.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert_eq!(
                ready.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                row.want_ready,
                "{}",
                row.name
            );
            assert_eq!(
                ready.last_transition_time.0,
                t(row.want_transition),
                "{}",
                row.name
            );
            let events: Vec<_> = d
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Event { reason, .. } => Some(*reason),
                    _ => None,
                })
                .collect();
            assert_eq!(events, row.want_events, "{}", row.name);
            assert_eq!(
                d.requeue,
                Requeue::AwaitChange,
                "{}: never a hot requeue",
                row.name
            );
            if row.want_ready.0 == "False" {
                assert!(
                    ready.message.contains("spec.steps[2].setWeight.weight"),
                    "{}: message names the field",
                    row.name
                );
            }
        }
    }

    #[test]
    fn identical_reconcile_produces_an_identical_status() {
        let first = decide_validity(&problem(), None, obs(3), t(0));
        let second = decide_validity(&problem(), Some(&first.status), obs(3), t(120));
        assert_eq!(
            first.status, second.status,
            "no status write on an identical reconcile"
        );
        assert!(second.actions.is_empty());
    }
}
