//! End to end over the Kubernetes API emulator: the BundlePin CRD from `crds/` installed, the
//! revert controller running in-process; an invalid BundlePin gets `Ready=False`
//! (`InvalidSpec`) naming the field and a Warning Event, and once fixed, `Ready=True`; the
//! API server refuses a change of `spec.bundle` or `spec.targets` (CEL transition rules).

use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use sluice_api::v1alpha1::{BundlePin, BundlePinPhase};
use sluice_revert::reconcile;
use sluice_runtime::events::EventRecorder;
use sluice_testkit::controller::RunningController;
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::invalid_spec::{ready_once_fixed, refused_naming};

#[tokio::test]
async fn invalid_bundle_pin_is_named_then_ready_once_fixed() {
    let emu = emulator_with([sluice_crd("bundlepins.sluice.dev.yaml")]).await;
    let client = emu.client();
    let api: Api<BundlePin> = Api::namespaced(client.clone(), "default");

    let ctx = reconcile::Context::new(
        client.clone(),
        EventRecorder::new(client.clone(), sluice_revert::OPERATOR),
        reconcile::Settings::default(),
        sluice_revert::metrics::register(&mut Default::default()),
    )
    .unwrap();
    let controller = RunningController::start(&client, ctx, reconcile::reconcile);

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
    let (seen, _) = refused_naming(&api, "revert-1", "spec.allowedKinds[1]").await;
    assert_eq!(seen.status.as_ref().unwrap().phase, BundlePinPhase::Refused);

    // When the spec is fixed, then it is Ready for the new generation.
    let fixed = ready_once_fixed(
        &api,
        "revert-1",
        serde_json::json!({"allowedKinds": [{"group": "networking.istio.io", "kind": "VirtualService"}]}),
    )
    .await;
    assert_eq!(
        fixed.status.as_ref().unwrap().phase,
        BundlePinPhase::Verifying
    );

    controller.stop().await;
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
