//! End to end over the Kubernetes API emulator: the WaveGate and BundlePin CRDs from `crds/` installed, the
//! wave-gate controller running in-process; an invalid WaveGate gets `Ready=False`
//! (`InvalidSpec`) naming the field and a Warning Event, and once fixed, `Ready=True` (and,
//! with no ApplicationSet to govern, refused without publishing a decision).

use kube::{Api, api::PostParams};
use sluice_api::v1alpha1::{
    WaveGate, WaveGatePhase,
    wave_gate::{conditions, reasons},
};
use sluice_runtime::{conditions::find, events::EventRecorder};
use sluice_testkit::controller::RunningController;
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::object_until;
use sluice_testkit::invalid_spec::{WAIT, ready_once_fixed, refused_naming};
use sluice_wave_gate::{OPERATOR, reconcile};

#[tokio::test]
async fn invalid_wave_gate_is_named_then_ready_once_fixed() {
    // wave-gate lists its own BundlePins on every pass (a halt's, and released ones to delete):
    // the chart installs that CRD beside the WaveGate one.
    let emu = emulator_with([
        sluice_crd("wavegates.sluice.dev.yaml"),
        sluice_crd("bundlepins.sluice.dev.yaml"),
    ])
    .await;
    let client = emu.client();
    let api: Api<WaveGate> = Api::namespaced(client.clone(), "default");

    let ctx = reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
    let controller = RunningController::start(&client, ctx, reconcile::reconcile);

    // Given an object the schema accepts but that is invalid (a zero convergence timeout).
    let mut body = serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "WaveGate",
        "metadata": {"name": "site-a", "namespace": "default"},
        "spec": {"site": "site-a", "applicationSetRef": {"name": "mesh-config", "namespace": "argocd"}, "repository": "oci://registry.example/mesh", "revision": "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2", "c3"]}], "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]}}},
    });
    for (k, v) in serde_json::json!({"convergenceTimeout": "0s"})
        .as_object()
        .unwrap()
    {
        body["spec"][k] = v.clone();
    }
    let invalid: WaveGate = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &invalid)
        .await
        .expect("the API server accepts it");

    // Then it is refused with a condition naming the field, and a Warning Event.
    let (seen, _) = refused_naming(&api, "site-a", "spec.convergenceTimeout").await;
    assert_eq!(seen.status.as_ref().unwrap().phase, WaveGatePhase::Refused);

    // When the spec is fixed, then it is Ready for the new generation.
    ready_once_fixed(
        &api,
        "site-a",
        serde_json::json!({"convergenceTimeout": "30m"}),
    )
    .await;
    // Valid, but its ApplicationSet does not exist: refused, nothing published.
    let fixed = object_until(&api, "site-a", "ApplicationSetSafe=False", WAIT, |o| {
        o.status.as_ref().is_some_and(|s| {
            find(&s.conditions, conditions::APPLICATION_SET_SAFE)
                .is_some_and(|c| c.reason == reasons::APPLICATION_SET_NOT_FOUND)
        })
    })
    .await;
    let status = fixed.status.as_ref().unwrap();
    assert_eq!(status.phase, WaveGatePhase::Refused);
    assert!(status.decisions.is_empty(), "nothing published");

    controller.stop().await;
    emu.shutdown().await;
}
