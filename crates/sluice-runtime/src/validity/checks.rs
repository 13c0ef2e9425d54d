//! The checks every operator's validity tests share: the transitions of the validity step
//! (new, identical, fixed and broken objects), an identical reconcile writing nothing, and
//! problems that name their field. Each operator's tests call these with its own decide step
//! and keep their own assertions on the phase.
//!
//! Test support only: asserts, never decides anything and never touches the cluster.

use std::fmt::Debug;

use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;

use super::Fields;
use crate::{conditions as cond, decision::Requeue};

/// What a validity step returned, as the checks read it.
#[derive(Debug, Clone)]
pub struct Seen<S> {
    /// The next status.
    pub status: S,
    /// The reasons of the Events it asked for, in order.
    pub events: Vec<&'static str>,
    /// When it asked to look again.
    pub requeue: Requeue,
}

impl<S> Seen<S> {
    /// What a step returned: its next status, the reasons of the Events among its `actions`
    /// (`reason` reads one action's) and its requeue.
    pub fn new<A>(
        status: S,
        actions: &[A],
        requeue: Requeue,
        reason: fn(&A) -> Option<&'static str>,
    ) -> Self {
        Seen {
            status,
            events: actions.iter().filter_map(reason).collect(),
            requeue,
        }
    }
}

/// The time `secs` seconds after the checks' fixed start.
pub fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("a time in range")
}

/// A status to start from.
#[derive(Debug, Clone, Copy)]
enum From {
    New,
    InvalidAt0,
    ValidAt0,
}

/// One transition every validity step goes through.
struct Case {
    name: &'static str,
    invalid: bool,
    from: From,
    generation: i64,
    now: i64,
    want_ready: (&'static str, &'static str),
    want_transition: i64,
    want_event: bool,
}

const CASES: [Case; 6] = [
    Case {
        name: "new valid object",
        invalid: false,
        from: From::New,
        generation: 1,
        now: 0,
        want_ready: ("True", cond::VALID),
        want_transition: 0,
        want_event: true,
    },
    Case {
        name: "new invalid object",
        invalid: true,
        from: From::New,
        generation: 1,
        now: 0,
        want_ready: ("False", cond::INVALID_SPEC),
        want_transition: 0,
        want_event: true,
    },
    Case {
        name: "identical reconcile of an invalid object",
        invalid: true,
        from: From::InvalidAt0,
        generation: 1,
        now: 60,
        want_ready: ("False", cond::INVALID_SPEC),
        want_transition: 0,
        want_event: false,
    },
    Case {
        name: "invalid object fixed",
        invalid: false,
        from: From::InvalidAt0,
        generation: 2,
        now: 60,
        want_ready: ("True", cond::VALID),
        want_transition: 60,
        want_event: true,
    },
    Case {
        name: "valid object, new generation, still valid",
        invalid: false,
        from: From::ValidAt0,
        generation: 2,
        now: 60,
        want_ready: ("True", cond::VALID),
        want_transition: 0,
        want_event: false,
    },
    Case {
        name: "valid object broken by an edit",
        invalid: true,
        from: From::ValidAt0,
        generation: 2,
        now: 60,
        want_ready: ("False", cond::INVALID_SPEC),
        want_transition: 60,
        want_event: true,
    },
];

/// Runs the validity step `run` (problems, status, generation, now) through every shared
/// transition and asserts what the step owns: the observed generation on the status and on
/// `Ready`, `Ready`'s status, reason and transition time, the Events, no hot requeue, and a
/// message that names `field` (the field `problem` is about). `fields` are the step's own
/// ([`Step::fields`](super::Step::fields)). What the operator owns is asserted from `phases`:
/// the phase `phase` reads from each case's next status, in order (new valid, new invalid,
/// identical invalid, invalid fixed, valid still valid, valid broken).
pub fn transitions<S: Clone, P: PartialEq + Debug>(
    (problem, field): (&[String], &str),
    run: impl Fn(&[String], Option<&S>, i64, Timestamp) -> Seen<S>,
    fields: Fields<S>,
    phases: [P; 6],
    phase: fn(&S) -> P,
) {
    let invalid_at_0 = run(problem, None, 1, t(0)).status;
    let valid_at_0 = run(&[], None, 1, t(0)).status;
    for (case, want_phase) in CASES.iter().zip(phases) {
        let name = case.name;
        let problems = if case.invalid { problem } else { &[] };
        let from = match case.from {
            From::New => None,
            From::InvalidAt0 => Some(&invalid_at_0),
            From::ValidAt0 => Some(&valid_at_0),
        };
        let seen = run(problems, from, case.generation, t(case.now));
        let mut written = seen.status.clone();
        let (observed, conditions) = fields(&mut written);
        let observed = *observed;
        let ready = cond::find(conditions, cond::READY)
            .unwrap_or_else(|| panic!("{name}: no Ready condition"));
        assert_eq!(observed, Some(case.generation), "{name}");
        assert_eq!(ready.observed_generation, Some(case.generation), "{name}");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            case.want_ready,
            "{name}"
        );
        assert_eq!(
            ready.last_transition_time.0,
            t(case.want_transition),
            "{name}"
        );
        let want_events = if case.want_event {
            vec![case.want_ready.1]
        } else {
            vec![]
        };
        assert_eq!(seen.events, want_events, "{name}");
        assert_eq!(
            seen.requeue,
            Requeue::AwaitChange,
            "{name}: never a hot requeue"
        );
        if case.invalid {
            assert!(
                ready.message.contains(field),
                "{name}: message names the field"
            );
        }
        assert_eq!(phase(&seen.status), want_phase, "{name}");
    }
}

/// Asserts that reconciling an invalid object again, later, writes an identical status and
/// publishes nothing.
pub fn identical_reconcile<S: PartialEq + Debug>(
    problem: &[String],
    run: impl Fn(&[String], Option<&S>, i64, Timestamp) -> Seen<S>,
) {
    let first = run(problem, None, 3, t(0));
    let second = run(problem, Some(&first.status), 3, t(120));
    assert_eq!(
        first.status, second.status,
        "no status write on an identical reconcile"
    );
    assert!(second.events.is_empty());
}

/// A spec fixture: `base` with each top-level field of `patch` replaced.
pub fn patched<T: DeserializeOwned>(mut base: serde_json::Value, patch: &serde_json::Value) -> T {
    for (k, v) in patch.as_object().expect("a patch is an object") {
        base[k] = v.clone();
    }
    serde_json::from_value(base).expect("fixture deserializes")
}

/// Asserts that the problems `problems_of` finds in the fixture spec patched with each row's
/// patch are exactly one per field the row names, in order, each starting with its field's
/// path. The fixture itself (the empty patch) must have none: every row changes a valid spec.
pub fn problems_name_their_fields<const N: usize>(
    problems_of: impl Fn(&serde_json::Value) -> Vec<String>,
    rows: [(serde_json::Value, Vec<&str>); N],
) {
    let valid = problems_of(&serde_json::json!({}));
    assert!(valid.is_empty(), "the fixture spec is not valid: {valid:?}");
    for (patch, want) in rows {
        let got = problems_of(&patch);
        assert_eq!(got.len(), want.len(), "{patch}: {got:?}");
        for (g, w) in got.iter().zip(&want) {
            assert!(g.starts_with(&format!("{w}: ")), "{patch}: {g}");
        }
    }
}
