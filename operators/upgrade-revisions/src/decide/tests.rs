use super::*;

use k8s_openapi::jiff::Timestamp;

use sluice_api::v1alpha1::{
    RevisionUpgradePhase, RevisionUpgradeStatus, revision_upgrade::reasons,
};
use sluice_runtime::conditions as cond;

use sluice_api::v1alpha1::revision_upgrade::conditions;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn obs(generation: i64) -> Observations {
    Observations {
        generation: Some(generation),
        ..Observations::default()
    }
}

fn problem() -> Vec<String> {
    vec!["spec.waves[0].selector: example problem".to_owned()]
}

struct Row {
    name: &'static str,
    problems: Vec<String>,
    status: Option<RevisionUpgradeStatus>,
    generation: i64,
    now: i64,
    want_phase: RevisionUpgradePhase,
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
            want_phase: RevisionUpgradePhase::Pending,
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
            want_phase: RevisionUpgradePhase::Invalid,
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
            want_phase: RevisionUpgradePhase::Invalid,
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
            want_phase: RevisionUpgradePhase::Pending,
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
            want_phase: RevisionUpgradePhase::Pending,
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
            want_phase: RevisionUpgradePhase::Invalid,
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
                ready.message.contains("spec.waves[0].selector"),
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
