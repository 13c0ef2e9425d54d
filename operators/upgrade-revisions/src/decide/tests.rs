use super::*;

use k8s_openapi::jiff::Timestamp;
use sluice_runtime::events::Announces;

use sluice_api::v1alpha1::{RevisionUpgradePhase, RevisionUpgradeStatus};
use sluice_runtime::validity::checks::{self, Seen};

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
    p: &[String],
    s: Option<&RevisionUpgradeStatus>,
    g: i64,
    now: Timestamp,
) -> Seen<RevisionUpgradeStatus> {
    let d = decide_validity(p, s, &obs(g), now);
    Seen::new(d.status, &d.actions, d.requeue, Announces::event_reason)
}

#[test]
fn validity_transitions() {
    use RevisionUpgradePhase::{Invalid, Pending};
    // Each shared transition's phase, in order: invalid is Invalid, fixed is Pending again.
    let phases = [Pending, Invalid, Invalid, Pending, Pending, Invalid];
    let (problem, field) = (problem(), "spec.waves[0].selector");
    checks::transitions((&problem, field), run, VALIDITY_STEP.fields, phases, |s| {
        s.phase
    });
}

#[test]
fn identical_reconcile_produces_an_identical_status() {
    checks::identical_reconcile(&problem(), run);
}
