//! End to end over the Kubernetes API emulator: the RevisionUpgrade CRD from `crds/` installed, the
//! upgrade-revisions controller running in-process; an invalid RevisionUpgrade gets `Ready=False`
//! (`InvalidSpec`) naming the field and a Warning Event, and once fixed, `Ready=True`.

use std::time::Duration;

use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use sluice_api::v1alpha1::{RevisionUpgrade, RevisionUpgradePhase};
use sluice_runtime::events::EventRecorder;
use sluice_testkit::controller::RunningController;
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::invalid_spec::{ready_once_fixed, refused_naming};
use sluice_upgrade_revisions::{OPERATOR, reconcile};

/// An emulator with the RevisionUpgrade CRD from `crds/` installed.
async fn emulator_with_crd() -> kube_emulator::Emulator {
    emulator_with([sluice_crd("revisionupgrades.sluice.dev.yaml")]).await
}

#[tokio::test]
async fn invalid_revision_upgrade_is_named_then_ready_once_fixed() {
    let emu = emulator_with_crd().await;
    let client = emu.client();
    let api: Api<RevisionUpgrade> = Api::all(client.clone());

    let ctx = reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
    let controller = RunningController::start(&client, ctx, reconcile::reconcile);

    // Given an object the schema accepts but that is invalid (a zero analysis interval).
    let mut body = serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "RevisionUpgrade",
        "metadata": {"name": "istio-1-28"},
        "spec": {"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"},
    });
    for (k, v) in serde_json::json!({"analysisInterval": "0s"})
        .as_object()
        .unwrap()
    {
        body["spec"][k] = v.clone();
    }
    let invalid: RevisionUpgrade = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &invalid)
        .await
        .expect("the API server accepts it");

    // Then it is refused with a condition naming the field, and a Warning Event.
    let (seen, _) = refused_naming(&api, "istio-1-28", "spec.analysisInterval").await;
    assert_eq!(
        seen.status.as_ref().unwrap().phase,
        RevisionUpgradePhase::Invalid
    );

    // When the spec is fixed, then it is Ready for the new generation.
    let fixed = ready_once_fixed(
        &api,
        "istio-1-28",
        serde_json::json!({"analysisInterval": "30s"}),
    )
    .await;
    assert_eq!(
        fixed.status.as_ref().unwrap().phase,
        RevisionUpgradePhase::Pending
    );

    controller.stop().await;
    emu.shutdown().await;
}

#[tokio::test]
async fn a_deleted_upgrade_leaves_no_metric_series() {
    let emu = emulator_with_crd().await;
    let client = emu.client();
    let api: Api<RevisionUpgrade> = Api::all(client.clone());
    let mut registry = prometheus_client::registry::Registry::default();
    let mut ctx =
        reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
    ctx.metrics = sluice_upgrade_revisions::metrics::register(&mut registry);
    let forgetting = ctx.forget_deleted(&ctx.client);
    let body = serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "RevisionUpgrade",
        "metadata": {"name": "istio-1-28"},
        "spec": {"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"},
    });
    let upgrade: RevisionUpgrade = serde_json::from_value(body).unwrap();
    let created = api.create(&PostParams::default(), &upgrade).await.unwrap();
    ctx.metrics.observe(
        "istio-1-28",
        &created.spec,
        &Default::default(),
        &[("1-27".to_owned(), 5)].into_iter().collect(),
        2,
    );
    let series = |registry: &prometheus_client::registry::Registry| {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out.lines()
            .filter(|l| l.contains("upgrade=\"istio-1-28\""))
            .count()
    };
    assert!(series(&registry) > 10, "the upgrade has its series");

    // When it is deleted, then every series naming it goes.
    api.delete("istio-1-28", &Default::default()).await.unwrap();
    eventually_every(
        "no series of the deleted upgrade",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || match series(&registry) {
            0 => Ok(()),
            n => Err(format!("series of the deleted upgrade remain: {n}")),
        },
    )
    .await;
    forgetting.abort();
}

#[tokio::test]
async fn tags_and_revisions_cannot_change_mid_flight() {
    let emu = emulator_with_crd().await;
    let api: Api<RevisionUpgrade> = Api::all(emu.client());
    let obj: RevisionUpgrade = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RevisionUpgrade",
        "metadata": {"name": "istio-1-28"},
        "spec": {"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    for (field, value) in [
        ("toRevision", "1-29"),
        ("toTag", "next"),
        ("fromRevision", "1-26"),
        ("fromTag", "old"),
    ] {
        let patch = serde_json::json!({"spec": {field: value}});
        let err = api
            .patch("istio-1-28", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err("an edit of the move is refused");
        assert!(err.to_string().contains("immutable"), "{field}: {err}");
    }
    // Other fields stay editable (pause, abort, the budget).
    let patch = serde_json::json!({"spec": {"paused": true}});
    api.patch("istio-1-28", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("spec.paused is editable");
    emu.shutdown().await;
}
