//! End to end over the Kubernetes API emulator: the WaveGate and BundlePin CRDs from `crds/` installed, the
//! wave-gate controller running in-process; an invalid WaveGate gets `Ready=False`
//! (`InvalidSpec`) naming the field and a Warning Event, and once fixed, `Ready=True` (and,
//! with no ApplicationSet to govern, refused without publishing a decision).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use sluice_api::v1alpha1::{
    WaveGate, WaveGatePhase,
    wave_gate::{conditions, reasons},
};
use sluice_runtime::{
    conditions::find,
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::object_until;
use sluice_wave_gate::{OPERATOR, reconcile};
use tokio_util::sync::CancellationToken;

/// How long the operator gets to write a status.
const WAIT: Duration = Duration::from_secs(15);

fn ready(obj: &WaveGate) -> Option<(String, String)> {
    let c = find(&obj.status.as_ref()?.conditions, conditions::READY)?;
    Some((c.status.clone(), c.reason.clone()))
}

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

    let ctx = Arc::new(reconcile::Context::new(
        client.clone(),
        EventRecorder::new(client.clone(), OPERATOR),
    ));
    let (hooks, _registry) = Hooks::standalone();
    let shutdown = CancellationToken::new();
    let controller = tokio::spawn(drive(
        Api::<WaveGate>::all(client.clone()),
        watcher::Config::default(),
        ctx,
        reconcile::reconcile,
        Leadership::always(),
        shutdown.clone(),
        hooks,
    ));

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
    let seen = object_until(&api, "site-a", "Ready=False InvalidSpec", WAIT, |o| {
        ready(o) == Some(("False".into(), reasons::INVALID_SPEC.into()))
    })
    .await;
    let status = seen.status.as_ref().unwrap();
    assert_eq!(status.phase, WaveGatePhase::Refused);
    assert_eq!(status.observed_generation, seen.metadata.generation);
    let message = &find(&status.conditions, conditions::READY).unwrap().message;
    assert!(
        message.contains("spec.convergenceTimeout"),
        "message names the field: {message}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warned = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some(reasons::INVALID_SPEC)
                && e.type_.as_deref() == Some("Warning")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("spec.convergenceTimeout"))
        });
    assert!(warned, "a Warning InvalidSpec Event names the field");

    // When the spec is fixed, then it is Ready for the new generation.
    api.patch(
        "site-a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"convergenceTimeout": "30m"}})),
    )
    .await
    .unwrap();
    let fixed = object_until(&api, "site-a", "Ready=True for generation 2", WAIT, |o| {
        ready(o) == Some(("True".into(), reasons::VALID.into()))
            && o.status.as_ref().and_then(|s| s.observed_generation) == o.metadata.generation
    })
    .await;
    assert_eq!(fixed.metadata.generation, Some(2));
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

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("controller stops on shutdown")
        .unwrap();
    emu.shutdown().await;
}
