//! End to end over the Kubernetes API emulator: the BundlePin CRD from `crds/` installed, the
//! revert controller running in-process; an invalid BundlePin gets `Ready=False`
//! (`InvalidSpec`) naming the field and a Warning Event, and once fixed, `Ready=True`; the
//! API server refuses a change of `spec.bundle` or `spec.targets` (CEL transition rules).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use sluice_api::v1alpha1::{
    BundlePin, BundlePinPhase,
    bundle_pin::{conditions, reasons},
};
use sluice_revert::{OPERATOR, reconcile};
use sluice_runtime::{
    conditions::find,
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::object_until;
use tokio_util::sync::CancellationToken;

/// How long the operator gets to write a status.
const WAIT: Duration = Duration::from_secs(15);

fn ready(obj: &BundlePin) -> Option<(String, String)> {
    let c = find(&obj.status.as_ref()?.conditions, conditions::READY)?;
    Some((c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn invalid_bundle_pin_is_named_then_ready_once_fixed() {
    let emu = emulator_with([sluice_crd("bundlepins.sluice.dev.yaml")]).await;
    let client = emu.client();
    let api: Api<BundlePin> = Api::namespaced(client.clone(), "default");

    let ctx = Arc::new(
        reconcile::Context::new(
            client.clone(),
            EventRecorder::new(client.clone(), OPERATOR),
            reconcile::Settings::default(),
            sluice_revert::metrics::register(&mut Default::default()),
        )
        .unwrap(),
    );
    let (hooks, _registry) = Hooks::standalone();
    let shutdown = CancellationToken::new();
    let controller = tokio::spawn(drive(
        Api::<BundlePin>::all(client.clone()),
        watcher::Config::default(),
        ctx,
        reconcile::reconcile,
        Leadership::always(),
        shutdown.clone(),
        hooks,
    ));

    // Given an object the schema accepts but that is invalid (a Secret among the allowed kinds).
    let mut body = serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "BundlePin",
        "metadata": {"name": "revert-1", "namespace": "default"},
        "spec": {"targets": [{"name": "mesh-config-c1"}], "bundle": {"repository": "oci://registry.example/mesh", "digest": "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, "publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]}, "reason": "bad route"},
    });
    for (k, v) in serde_json::json!({"allowedKinds": [{"group": "networking.istio.io", "kind": "VirtualService"}, {"group": "", "kind": "Secret"}]}).as_object().unwrap() {
        body["spec"][k] = v.clone();
    }
    let invalid: BundlePin = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &invalid)
        .await
        .expect("the API server accepts it");

    // Then it is refused with a condition naming the field, and a Warning Event.
    let seen = object_until(&api, "revert-1", "Ready=False InvalidSpec", WAIT, |o| {
        ready(o) == Some(("False".into(), reasons::INVALID_SPEC.into()))
    })
    .await;
    let status = seen.status.as_ref().unwrap();
    assert_eq!(status.phase, BundlePinPhase::Refused);
    assert_eq!(status.observed_generation, seen.metadata.generation);
    let message = &find(&status.conditions, conditions::READY).unwrap().message;
    assert!(
        message.contains("spec.allowedKinds[1]"),
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
                    .is_some_and(|n| n.contains("spec.allowedKinds[1]"))
        });
    assert!(warned, "a Warning InvalidSpec Event names the field");

    // When the spec is fixed, then it is Ready for the new generation.
    api.patch(
        "revert-1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"allowedKinds": [{"group": "networking.istio.io", "kind": "VirtualService"}]}})),
    )
    .await
    .unwrap();
    let fixed = object_until(&api, "revert-1", "Ready=True for generation 2", WAIT, |o| {
        ready(o) == Some(("True".into(), reasons::VALID.into()))
            && o.status.as_ref().and_then(|s| s.observed_generation) == o.metadata.generation
    })
    .await;
    assert_eq!(fixed.metadata.generation, Some(2));
    assert_eq!(
        fixed.status.as_ref().unwrap().phase,
        BundlePinPhase::Verifying
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("controller stops on shutdown")
        .unwrap();
    emu.shutdown().await;
}

#[tokio::test]
async fn the_api_server_refuses_a_changed_bundle_or_targets_and_says_what_to_do() {
    let emu = emulator_with([sluice_crd("bundlepins.sluice.dev.yaml")]).await;
    let api: Api<BundlePin> = Api::namespaced(emu.client(), "default");
    let pin: BundlePin = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "BundlePin",
        "metadata": {"name": "revert-1", "namespace": "default"},
        "spec": {"targets": [{"name": "mesh-config-c1"}], "bundle": {"repository": "oci://registry.example/mesh", "digest": format!("sha256:{}", "a".repeat(64))}, "publicKeysSecretRef": {"name": "cosign"}, "reason": "bad route"},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pin).await.unwrap();

    struct Row {
        name: &'static str,
        patch: serde_json::Value,
        /// `None`: accepted; `Some(words)`: 422 whose message holds every word.
        refused_with: Option<&'static [&'static str]>,
    }
    let table = [
        Row {
            name: "digest",
            patch: serde_json::json!({"spec": {"bundle": {"digest": format!("sha256:{}", "b".repeat(64))}}}),
            refused_with: Some(&["spec.bundle", "immutable", "create a new BundlePin"]),
        },
        Row {
            name: "repository",
            patch: serde_json::json!({"spec": {"bundle": {"repository": "oci://registry.example/other"}}}),
            refused_with: Some(&["spec.bundle", "immutable", "create a new BundlePin"]),
        },
        Row {
            name: "target added",
            patch: serde_json::json!({"spec": {"targets": [{"name": "mesh-config-c1"}, {"name": "mesh-config-c2"}]}}),
            refused_with: Some(&["spec.targets", "immutable", "create a new BundlePin"]),
        },
        Row {
            name: "target renamed",
            patch: serde_json::json!({"spec": {"targets": [{"name": "mesh-config-c2"}]}}),
            refused_with: Some(&["spec.targets", "immutable", "create a new BundlePin"]),
        },
        Row {
            name: "explicit release",
            patch: serde_json::json!({"spec": {"release": true, "releaseReason": "forward fix 43"}}),
            refused_with: None,
        },
    ];
    for row in table {
        let got = api
            .patch(
                "revert-1",
                &PatchParams::default(),
                &Patch::Merge(&row.patch),
            )
            .await;
        match (row.refused_with, got) {
            (None, Ok(_)) => {}
            (None, Err(e)) => panic!("{}: refused: {e}", row.name),
            (Some(_), Ok(o)) => panic!("{}: accepted: {:?}", row.name, o.spec),
            (Some(words), Err(kube::Error::Api(s))) => {
                assert_eq!(s.code, 422, "{}: {s:?}", row.name);
                for w in words {
                    assert!(
                        s.message.contains(w),
                        "{}: {w:?} not in {}",
                        row.name,
                        s.message
                    );
                }
            }
            (Some(_), Err(e)) => panic!("{}: {e}", row.name),
        }
    }
    let kept = api.get("revert-1").await.unwrap();
    assert_eq!(
        kept.spec.bundle.digest,
        format!("sha256:{}", "a".repeat(64))
    );
    assert_eq!(kept.spec.targets.len(), 1);
    assert!(kept.spec.release);
    emu.shutdown().await;
}
