//! The pure heart of sluice-revert: (spec, current status, observations, now) → (actions, next
//! status).
//!
//! Today it validates what CEL cannot express and sets `status.observedGeneration`, the phase
//! and the `Ready` condition; the operator's state machine grows here. Must never do I/O or
//! read the clock.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{BundlePinPhase, BundlePinSpec, BundlePinStatus, bundle_pin::reasons};
use sluice_runtime::{conditions as cond, events::Severity};

use crate::validity;

/// What the reconcile saw besides the object's spec and status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    /// `metadata.generation` of the object.
    pub generation: Option<i64>,
}

/// Something the reconcile must do after the status is written.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the BundlePin.
    Event {
        /// Normal or Warning.
        severity: Severity,
        /// CamelCase reason.
        reason: &'static str,
        /// CamelCase action.
        action: &'static str,
        /// Human-readable note.
        note: String,
    },
}

/// When to look at the object again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only when the object (or something it watches) changes.
    AwaitChange,
    /// After this long, even without a change.
    After(Duration),
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Effects to carry out after the status write succeeded.
    pub actions: Vec<Action>,
    /// The status to write (equal to the current one when nothing changed).
    pub status: BundlePinStatus,
    /// When to reconcile again.
    pub requeue: Requeue,
}

/// The Event action name of validation outcomes.
pub const VALIDATE: &str = "Validate";

/// Decides the next status of a BundlePin.
pub fn decide(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    decide_validity(&validity::problems(spec), status, obs, now)
}

/// The validity part of [`decide`], given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut next = status.cloned().unwrap_or_default();
    next.observed_generation = obs.generation;
    let validity = cond::set_validity(&mut next.conditions, problems, obs.generation, now);
    if !validity.valid {
        next.phase = BundlePinPhase::Refused;
    } else if validity.was_invalid && next.phase == BundlePinPhase::Refused {
        next.phase = BundlePinPhase::Verifying;
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
        // An invalid spec is waited on (no requeue loop); a valid one has nothing timed to do
        // yet.
        requeue: Requeue::AwaitChange,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_api::v1alpha1::bundle_pin::conditions;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn obs(generation: i64) -> Observations {
        Observations {
            generation: Some(generation),
        }
    }

    fn problem() -> Vec<String> {
        vec!["spec.bundle.digest: example problem".to_owned()]
    }

    struct Row {
        name: &'static str,
        problems: Vec<String>,
        status: Option<BundlePinStatus>,
        generation: i64,
        now: i64,
        want_phase: BundlePinPhase,
        want_ready: (&'static str, &'static str),
        want_transition: i64,
        want_events: Vec<&'static str>,
    }

    fn run(row: &Row) -> Decision {
        decide_validity(
            &row.problems,
            row.status.as_ref(),
            &obs(row.generation),
            t(row.now),
        )
    }

    #[test]
    fn validity_transitions() {
        let invalid_at_0 = decide_validity(&problem(), None, &obs(1), t(0)).status;
        let valid_at_0 = decide_validity(&[], None, &obs(1), t(0)).status;
        let table = vec![
            Row {
                name: "new valid object",
                problems: vec![],
                status: None,
                generation: 1,
                now: 0,
                want_phase: BundlePinPhase::Verifying,
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
                want_phase: BundlePinPhase::Refused,
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
                want_phase: BundlePinPhase::Refused,
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
                want_phase: BundlePinPhase::Verifying,
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
                want_phase: BundlePinPhase::Verifying,
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
                want_phase: BundlePinPhase::Refused,
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
                .map(|a| match a {
                    Action::Event { reason, .. } => *reason,
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
                    ready.message.contains("spec.bundle.digest"),
                    "{}: message names the field",
                    row.name
                );
            }
        }
    }

    #[test]
    fn identical_reconcile_produces_an_identical_status() {
        let first = decide_validity(&problem(), None, &obs(3), t(0));
        let second = decide_validity(&problem(), Some(&first.status), &obs(3), t(120));
        assert_eq!(
            first.status, second.status,
            "no status write on an identical reconcile"
        );
        assert!(second.actions.is_empty());
    }
}
