use super::*;

use k8s_openapi::jiff::Timestamp;

use sluice_api::v1alpha1::{RevisionUpgradePhase, RevisionUpgradeStatus};
use sluice_runtime::validity::checks;

fn obs(generation: i64) -> Observations {
    Observations {
        generation: Some(generation),
        ..Observations::default()
    }
}

fn problem() -> Vec<String> {
    vec!["spec.waves[0].selector: example problem".to_owned()]
}

fn run(
    problems: &[String],
    status: Option<&RevisionUpgradeStatus>,
    generation: i64,
    now: Timestamp,
) -> checks::Seen<RevisionUpgradeStatus> {
    let d = decide_validity(problems, status, &obs(generation), now);
    checks::Seen {
        events: checks::event_reasons(&d.actions, Action::event_reason),
        status: d.status,
        requeue: d.requeue,
    }
}

#[test]
fn validity_transitions() {
    // Each shared transition's phase, in order: invalid is Invalid, fixed is Pending again.
    let phases = [
        RevisionUpgradePhase::Pending,
        RevisionUpgradePhase::Invalid,
        RevisionUpgradePhase::Invalid,
        RevisionUpgradePhase::Pending,
        RevisionUpgradePhase::Pending,
        RevisionUpgradePhase::Invalid,
    ];
    let field = "spec.waves[0].selector";
    let outcomes = checks::transitions(&problem(), field, run, VALIDITY_STEP.fields);
    for ((name, status), want) in outcomes.into_iter().zip(phases) {
        assert_eq!(status.phase, want, "{name}");
    }
}

#[test]
fn identical_reconcile_produces_an_identical_status() {
    checks::identical_reconcile(&problem(), run);
}
