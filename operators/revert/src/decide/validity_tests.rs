use super::*;

use k8s_openapi::jiff::Timestamp;
use sluice_runtime::events::Announces;

use sluice_api::v1alpha1::{BundlePinPhase, BundlePinSpec, BundlePinStatus, bundle_pin::reasons};
use sluice_runtime::{
    conditions as cond,
    validity::checks::{self, Seen},
};

use sluice_api::v1alpha1::bundle_pin::conditions;

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
    vec!["spec.bundle.digest: example problem".to_owned()]
}

#[test]
fn a_target_outside_the_application_namespace_is_refused() {
    let spec: BundlePinSpec = serde_json::from_value(serde_json::json!({
            "targets": [{"name": "mesh-c1"}, {"name": "mesh-c2", "namespace": "team-a"}],
            "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": format!("sha256:{}", "c".repeat(64))},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "5xx after change 42",
        }))
        .unwrap();
    let obs = Observations {
        generation: Some(1),
        pin: ("argocd".into(), "pin-1".into()),
        application_namespace: Some("argocd".into()),
        ..Observations::default()
    };
    let d = decide(&spec, None, &obs, t(0));
    assert_eq!(d.status.phase, BundlePinPhase::Refused);
    let ready = cond::find(&d.status.conditions, conditions::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reasons::INVALID_SPEC)
    );
    assert!(
        ready.message.contains(
            "spec.targets[1].namespace: revert may patch Applications only in namespace argocd"
        ),
        "{}",
        ready.message
    );
    assert!(
        !ready.message.contains("spec.targets[0]"),
        "{}",
        ready.message
    );
    assert!(
        d.actions.iter().all(|a| matches!(a, Action::Event(_))),
        "a refused pin touches nothing: {:?}",
        d.actions
    );

    // Revert watching every namespace refuses none.
    let everywhere = Observations {
        application_namespace: None,
        ..obs
    };
    let d = decide(&spec, None, &everywhere, t(0));
    assert_ne!(d.status.phase, BundlePinPhase::Refused);
}

fn run(p: &[String], s: Option<&BundlePinStatus>, g: i64, now: Timestamp) -> Seen<BundlePinStatus> {
    let d = decide_validity(p, s, &obs(g), now);
    Seen::new(d.status, &d.actions, d.requeue, Announces::event_reason)
}

#[test]
fn validity_transitions() {
    use BundlePinPhase::{Refused, Verifying};
    // Each shared transition's phase, in order: refused while invalid, verifying once fixed.
    let phases = [Verifying, Refused, Refused, Verifying, Verifying, Refused];
    let (problem, field) = (problem(), "spec.bundle.digest");
    checks::transitions((&problem, field), run, VALIDITY_STEP.fields, phases, |s| {
        s.phase
    });
}

#[test]
fn identical_reconcile_produces_an_identical_status() {
    checks::identical_reconcile(&problem(), run);
}
