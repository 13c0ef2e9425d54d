//! The validity step every operator's decide step starts with: the spec's problems (those CEL
//! cannot express) set `Ready`, the status records the generation it was decided from, a change
//! of `Ready` is worth one Event, and an object decided here is waited on, never requeued hot.
//!
//! Owns that step's shape, its Event reasons and notes. Never decides which phase an invalid or
//! a fixed object is in: that stays with each operator ([`Step::phase`]).

pub mod checks;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Condition, jiff::Timestamp};

use crate::{
    conditions::{self as cond, Validity},
    decision::{Decision, Requeue},
    events::Notice,
};

/// The Event action of the validity step.
pub const VALIDATE: &str = "Validate";

/// The note of the Event that accepts a spec.
pub const ACCEPTED: &str = "spec accepted";

/// Where an operator's status keeps what the validity step writes: the generation the decision
/// was made from and the conditions list that holds `Ready`.
pub type Fields<S> = fn(&mut S) -> (&mut Option<i64>, &mut Vec<Condition>);

/// One operator's validity step: where its status keeps the generation and conditions, and how
/// its phase follows `Ready`.
#[derive(Debug, Clone, Copy)]
pub struct Step<S> {
    /// The status's observed generation and conditions.
    pub fields: Fields<S>,
    /// Moves the phase once `Ready` is set (an invalid object held or refused, a fixed one
    /// cleared).
    pub phase: fn(&mut S, &Validity),
}

impl<S: Clone + Default> Step<S> {
    /// The validity part of a decide step, given the spec's problems (empty when valid): the
    /// next status, the Event when `Ready` changed (`event` wraps its [`Notice`] into the
    /// operator's own action), and [`Requeue::AwaitChange`] — an invalid spec is
    /// waited on, and validity alone has nothing timed to do.
    pub fn decide<A>(
        &self,
        problems: &[String],
        status: Option<&S>,
        generation: Option<i64>,
        now: Timestamp,
        event: impl FnOnce(Notice) -> A,
    ) -> Decision<S, A> {
        let mut next = status.cloned().unwrap_or_default();
        let (observed, conditions) = (self.fields)(&mut next);
        *observed = generation;
        let validity = cond::set_validity(conditions, problems, generation, now);
        (self.phase)(&mut next, &validity);
        let mut actions = Vec::new();
        if validity.transitioned {
            actions.push(event(if validity.valid {
                Notice::normal(cond::VALID, VALIDATE, ACCEPTED)
            } else {
                Notice::warning(cond::INVALID_SPEC, VALIDATE, validity.message)
            }));
        }
        Decision {
            actions,
            status: next,
            requeue: Requeue::AwaitChange,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Severity;
    use checks::Seen;

    /// A status with only what the step writes and a phase that follows `Ready`.
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Status {
        observed_generation: Option<i64>,
        conditions: Vec<Condition>,
        invalid: bool,
    }

    const STEP: Step<Status> = Step {
        fields: |s| (&mut s.observed_generation, &mut s.conditions),
        phase: |s, v| s.invalid = !v.valid,
    };

    fn run(p: &[String], s: Option<&Status>, g: i64, now: Timestamp) -> Seen<Status> {
        let d = STEP.decide(p, s, Some(g), now, |n| n.reason);
        Seen::new(d.status, &d.actions, d.requeue, |reason| Some(reason))
    }

    fn problem() -> Vec<String> {
        vec!["spec.example: example problem".to_owned()]
    }

    #[test]
    fn validity_transitions() {
        // Invalid exactly while the spec has problems.
        let phases = [false, true, true, false, false, true];
        let (problem, field) = (problem(), "spec.example");
        checks::transitions((&problem, field), run, STEP.fields, phases, |s| s.invalid);
    }

    #[test]
    fn identical_reconcile_produces_an_identical_status() {
        checks::identical_reconcile(&problem(), run);
    }

    #[test]
    fn events_carry_the_validate_action_severity_and_note() {
        let d = STEP.decide(&problem(), None, Some(1), checks::t(0), |n| n);
        let n = &d.actions[0];
        assert_eq!(
            (n.severity, n.reason, n.action),
            (Severity::Warning, cond::INVALID_SPEC, VALIDATE)
        );
        assert!(
            n.note.contains("spec.example: example problem"),
            "{}",
            n.note
        );
        let d = STEP.decide(&[], Some(&d.status), Some(2), checks::t(60), |n| n);
        assert_eq!(
            d.actions,
            vec![Notice::normal(cond::VALID, VALIDATE, ACCEPTED)]
        );
    }
}
