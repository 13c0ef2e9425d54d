//! Condition helpers shared by every kind's status.
//!
//! Owns how a condition is set on a status list: `lastTransitionTime` is kept when status,
//! reason and message did not change, and conditions are compared ignoring time (as linkerd's
//! policy controller does) so an identical reconcile produces an identical status and no write.
//! Must never read the clock: `now` is a parameter.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

/// The `status` field of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not yet known.
    Unknown,
}

impl Status {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// Builds a condition stamped with `now` as its transition time; [`set`] decides whether that
/// time is kept.
pub fn new(
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: Time(now),
    }
}

/// The generation and time a decision stamps the conditions it sets with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The object's `metadata.generation` the decision read (`observedGeneration`).
    pub generation: Option<i64>,
    /// The decision's time (`lastTransitionTime` of a condition that changed).
    pub now: Timestamp,
}

impl Stamp {
    /// The stamp of a decision made from `generation` at `now`.
    pub fn new(generation: Option<i64>, now: Timestamp) -> Self {
        Stamp { generation, now }
    }

    /// Sets the condition `type_` in `conditions` ([`new`] then [`set`]); true when its status,
    /// reason, message or observed generation changed.
    pub fn set(
        self,
        conditions: &mut Vec<Condition>,
        type_: &str,
        status: Status,
        reason: &str,
        message: impl Into<String>,
    ) -> bool {
        set(
            conditions,
            new(type_, status, reason, message, self.generation, self.now),
        )
    }
}

/// Whether two conditions say the same thing (type, status, reason, message, observed
/// generation), ignoring `lastTransitionTime`.
pub fn same_ignoring_time(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

/// Whether two condition lists say the same thing, ignoring transition times and order.
pub fn lists_equal_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|ca| b.iter().any(|cb| same_ignoring_time(ca, cb)))
}

/// Problems listed in one condition message at most; the rest are counted.
pub const MAX_LISTED_PROBLEMS: usize = 5;

/// Joins validation problems (each naming its field, e.g. `spec.steps[2].setWeight.weight:
/// ...`) into one condition message, listing at most [`MAX_LISTED_PROBLEMS`].
pub fn problems_message(problems: &[String]) -> String {
    let listed = problems
        .iter()
        .take(MAX_LISTED_PROBLEMS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    match problems.len().saturating_sub(MAX_LISTED_PROBLEMS) {
        0 => listed,
        more => format!("{listed}; and {more} more"),
    }
}

/// Finds the condition of `type_`.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == Status::True.as_str())
}

/// Sets `next` in `conditions`, replacing the condition of the same type. If status, reason
/// and message are unchanged the existing `lastTransitionTime` is kept. Returns whether the
/// list changed in anything but time.
pub fn set(conditions: &mut Vec<Condition>, mut next: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == next.type_) {
        Some(current) => {
            let unchanged_state = current.status == next.status
                && current.reason == next.reason
                && current.message == next.message;
            if unchanged_state {
                next.last_transition_time = current.last_transition_time.clone();
            }
            let changed = !same_ignoring_time(current, &next);
            *current = next;
            changed
        }
        None => {
            conditions.push(next);
            true
        }
    }
}

/// Removes the condition of `type_`; returns whether one was removed.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

/// Condition type every sluice kind carries: whether the spec was accepted.
pub const READY: &str = "Ready";
/// Reason of `Ready=True` once the spec passed validation.
pub const VALID: &str = "Valid";
/// Reason of `Ready=False` while the spec is invalid.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// What [`set_validity`] did to a status's conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validity {
    /// The spec had no problems.
    pub valid: bool,
    /// `Ready` was `InvalidSpec` before this decision.
    pub was_invalid: bool,
    /// `Ready` changed status, reason or message: worth an Event.
    pub transitioned: bool,
    /// The `Ready` condition's message.
    pub message: String,
}

/// Sets the `Ready` condition from a spec's validation problems (empty when valid), keeping
/// `lastTransitionTime` when nothing changed. Shared by every operator's decide step.
pub fn set_validity(
    conditions: &mut Vec<Condition>,
    problems: &[String],
    generation: Option<i64>,
    now: Timestamp,
) -> Validity {
    let before = find(conditions, READY).cloned();
    let was_invalid = before.as_ref().is_some_and(|c| c.reason == INVALID_SPEC);
    let valid = problems.is_empty();
    let ready = if valid {
        new(READY, Status::True, VALID, "spec is valid", generation, now)
    } else {
        new(
            READY,
            Status::False,
            INVALID_SPEC,
            problems_message(problems),
            generation,
            now,
        )
    };
    let transitioned = before.as_ref().is_none_or(|b| {
        b.status != ready.status || b.reason != ready.reason || b.message != ready.message
    });
    let message = ready.message.clone();
    set(conditions, ready);
    Validity {
        valid,
        was_invalid,
        transitioned,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn ready(status: Status, reason: &str, msg: &str, gen_: i64, at: i64) -> Condition {
        new("Ready", status, reason, msg, Some(gen_), t(at))
    }

    #[test]
    fn transition_time_follows_status_reason_and_message() {
        // (initial, next, want transition time, want changed)
        let table = [
            (
                ready(Status::True, "Valid", "ok", 1, 0),
                ready(Status::True, "Valid", "ok", 1, 60),
                t(0),
                false,
            ),
            (
                ready(Status::True, "Valid", "ok", 1, 0),
                ready(Status::True, "Valid", "ok", 2, 60),
                t(0),
                true,
            ),
            (
                ready(Status::True, "Valid", "ok", 1, 0),
                ready(Status::False, "Valid", "ok", 1, 60),
                t(60),
                true,
            ),
            (
                ready(Status::False, "InvalidSpec", "spec.steps[1]: bad", 1, 0),
                ready(Status::False, "InvalidSpec", "spec.steps[2]: bad", 1, 60),
                t(60),
                true,
            ),
            (
                ready(Status::False, "InvalidSpec", "x", 1, 0),
                ready(Status::False, "Other", "x", 1, 60),
                t(60),
                true,
            ),
        ];
        for (i, (initial, next, want_time, want_changed)) in table.into_iter().enumerate() {
            let mut list = vec![initial];
            let changed = set(&mut list, next);
            assert_eq!(list.len(), 1, "row {i}");
            assert_eq!(list[0].last_transition_time.0, want_time, "row {i}");
            assert_eq!(changed, want_changed, "row {i}");
        }
    }

    #[test]
    fn identical_reconciles_keep_the_first_time() {
        let mut list = Vec::new();
        for minute in 0..5 {
            set(
                &mut list,
                ready(Status::True, "Valid", "ok", 3, minute * 60),
            );
        }
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time.0, t(0));
    }

    #[test]
    fn other_types_are_left_alone() {
        let mut list = vec![new("Paused", Status::False, "NotPaused", "", None, t(0))];
        assert!(set(&mut list, ready(Status::True, "Valid", "ok", 1, 5)));
        assert_eq!(list.len(), 2);
        assert_eq!(find(&list, "Paused").unwrap().last_transition_time.0, t(0));
        assert!(is_true(&list, "Ready"));
        assert!(!is_true(&list, "Paused"));
        assert!(remove(&mut list, "Paused"));
        assert!(!remove(&mut list, "Paused"));
    }

    #[test]
    fn problem_messages_are_bounded() {
        let many: Vec<String> = (0..8)
            .map(|i| format!("spec.waves[{i}].name: empty"))
            .collect();
        let table = [
            (&many[..1], "spec.waves[0].name: empty".to_owned()),
            (
                &many[..2],
                "spec.waves[0].name: empty; spec.waves[1].name: empty".to_owned(),
            ),
            (&many[..], format!("{}; and 3 more", many[..5].join("; "))),
        ];
        for (input, want) in table {
            assert_eq!(problems_message(input), want);
        }
    }

    #[test]
    fn list_comparison_ignores_time_and_order() {
        let a = vec![
            ready(Status::True, "Valid", "ok", 1, 0),
            new("Paused", Status::False, "NotPaused", "", None, t(0)),
        ];
        let mut b = vec![
            new("Paused", Status::False, "NotPaused", "", None, t(9)),
            ready(Status::True, "Valid", "ok", 1, 9),
        ];
        assert!(lists_equal_ignoring_time(&a, &b));
        b[1].message = "changed".into();
        assert!(!lists_equal_ignoring_time(&a, &b));
        assert!(!lists_equal_ignoring_time(&a, &b[..1]));
    }

    #[test]
    fn a_stamp_sets_at_its_generation_and_keeps_the_transition_time_of_an_unchanged_condition() {
        let mut conditions = Vec::new();
        let at = |generation, secs| Stamp {
            generation: Some(generation),
            now: t(secs),
        };
        assert!(at(1, 0).set(&mut conditions, "Ready", Status::True, "Valid", "ok"));
        assert!(!at(1, 30).set(&mut conditions, "Ready", Status::True, "Valid", "ok"));
        assert_eq!(conditions, vec![ready(Status::True, "Valid", "ok", 1, 0)]);
        assert!(at(2, 60).set(&mut conditions, "Ready", Status::True, "Valid", "ok"));
        assert_eq!(conditions, vec![ready(Status::True, "Valid", "ok", 2, 0)]);
        assert!(at(2, 90).set(&mut conditions, "Ready", Status::False, "InvalidSpec", "no"));
        assert_eq!(
            conditions,
            vec![ready(Status::False, "InvalidSpec", "no", 2, 90)]
        );
    }
}
