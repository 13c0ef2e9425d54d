//! End to end over the Kubernetes API emulator: the CRDs from `crds/` installed, the
//! rollout-weights controller running in-process; an invalid Rollout gets `Ready=False`
//! (`InvalidSpec`) naming the field, and once fixed, `Ready=True`.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use sluice_api::v1alpha1::{Rollout, RolloutPhase};
use sluice_rollout_weights::{OPERATOR, reconcile};
use sluice_runtime::{
    conditions::find, events::EventRecorder, leader::Leadership, server::Readiness,
};
use sluice_testkit::controller::RunningController;
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::invalid_spec::{ready_once_fixed, refused_naming};

#[tokio::test]
async fn invalid_rollout_is_named_then_ready_once_fixed() {
    let emu = emulator_with([sluice_crd("rollouts.sluice.dev.yaml")]).await;
    let client = emu.client();
    let api: Api<Rollout> = Api::namespaced(client.clone(), "default");

    let ctx = reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
    let controller = RunningController::start(&client, ctx, reconcile::reconcile);

    // Given a Rollout the schema accepts but whose analysis interval is zero.
    let invalid: Rollout = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "checkout", "namespace": "default"},
        "spec": {
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "checkout-v1"},
            "canaryService": {"name": "checkout-v2"},
            "canaryWorkload": {"name": "checkout-v2"},
            "steps": [{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 50}}],
            "analysisInterval": "0s",
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &invalid)
        .await
        .expect("the API server accepts it");

    // Then it is Invalid, and the condition names the field; a Warning Event says so.
    let (seen, warnings) = refused_naming(&api, "checkout", "spec.analysisInterval").await;
    assert_eq!(seen.status.as_ref().unwrap().phase, RolloutPhase::Invalid);
    let managers: Vec<_> = seen
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m == OPERATOR),
        "status written by {OPERATOR}: {managers:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|e| e.reporting_controller.as_deref() == Some(OPERATOR)),
        "a Warning InvalidSpec Event names the field"
    );

    // When the spec is fixed, then it is Ready for the new generation.
    let fixed = ready_once_fixed(
        &api,
        "checkout",
        serde_json::json!({"analysisInterval": "30s"}),
    )
    .await;
    assert_eq!(fixed.status.as_ref().unwrap().phase, RolloutPhase::Pending);

    // And an identical state causes no further writes (no hot loop).
    let rv = fixed.metadata.resource_version.clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        api.get("checkout").await.unwrap().metadata.resource_version,
        rv
    );

    assert_eq!(
        controller.hooks.health.readiness(),
        Readiness::Ready,
        "caches synced"
    );
    let metrics = sluice_runtime::metrics::encode(&controller.registry);
    assert!(
        metrics.contains("sluice_reconciles_total{kind=\"Rollout\"}"),
        "{metrics}"
    );

    controller.stop().await;
    emu.shutdown().await;
}

/// A GateTemplate whose PromQL does not parse is `Ready=False` naming `spec.promql`, written by
/// rollout-weights' field manager; once fixed it is `Ready=True` at the new generation.
#[tokio::test]
async fn a_gate_template_gets_ready_from_validation() {
    use sluice_api::v1alpha1::GateTemplate;
    let emu = emulator_with([sluice_crd("gatetemplates.sluice.dev.yaml")]).await;
    let client = emu.client();
    let api: Api<GateTemplate> = Api::all(client.clone());
    let controller = tokio::spawn(sluice_rollout_weights::template_status::run(
        client.clone(),
        client.clone(),
        Leadership::always(),
    ));
    let template = |q: &str| -> GateTemplate {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "GateTemplate",
            "metadata": {"name": "errors"},
            "spec": {"promql": q, "comparison": {"absolute": {"op": "LessThan", "value": 0.01}}},
        }))
        .unwrap()
    };
    api.create(
        &PostParams::default(),
        &template(r#"sum(rate(x{service="{{canaryService}}"}[{{window}}])"#),
    )
    .await
    .expect("the API server accepts it");

    let ready = |t: &GateTemplate| {
        t.status
            .as_ref()
            .and_then(|s| find(&s.conditions, "Ready"))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let seen = eventually_every(
        "a Ready condition",
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || {
            let t = api.get("errors").await.unwrap();
            match ready(&t) {
                Some(_) => Ok(t),
                None => Err(format!("no status: {t:?}")),
            }
        },
    )
    .await;
    let (status, reason, message) = ready(&seen).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert!(
        message.contains("spec.promql: template is not valid PromQL"),
        "{message}"
    );
    assert_eq!(
        seen.status.as_ref().unwrap().observed_generation,
        seen.metadata.generation
    );
    let managers: Vec<_> = seen
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == OPERATOR), "{managers:?}");

    api.patch(
        "errors",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"promql": r#"sum(rate(x{service="{{canaryService}}"}[{{window}}]))"#}})),
    )
    .await
    .unwrap();
    let t = eventually_every(
        "Ready=True",
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || {
            let t = api.get("errors").await.unwrap();
            if ready(&t).is_some_and(|r| r.0 == "True") {
                Ok(t)
            } else {
                Err(format!("never Ready: {:?}", t.status))
            }
        },
    )
    .await;
    assert_eq!(ready(&t).unwrap().1, "Valid");
    assert_eq!(
        t.status.as_ref().unwrap().observed_generation,
        t.metadata.generation
    );
    assert_ne!(t.metadata.generation, seen.metadata.generation);
    controller.abort();
}

/// An HTTPRoute whose ownership annotation names a Rollout that does not exist is reported (a
/// Warning Event on the route) and freed (the annotation removed); a route owned by an existing
/// Rollout keeps its annotation.
#[tokio::test]
async fn an_orphaned_route_ownership_is_reported_and_removed() {
    use k8s_openapi::api::core::v1::Namespace;
    use sluice_api::{external::http_route::HttpRoute, v1alpha1::rollout::ROUTE_OWNER_ANNOTATION};
    let Some(crd) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::httproute_crd()) else {
        return;
    };
    let emu = emulator_with([sluice_crd("rollouts.sluice.dev.yaml"), crd]).await;
    let client = emu.client();
    let _ = Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await;
    let routes: Api<HttpRoute> = Api::namespaced(client.clone(), "shop");
    let route = |name: &str, owner: &str| -> HttpRoute {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": "shop",
                "annotations": {ROUTE_OWNER_ANNOTATION: owner, "team": "payments"}},
            "spec": {"rules": [{"backendRefs": [{"name": "v1", "port": 80, "weight": 100}]}]},
        }))
        .unwrap()
    };
    // A Rollout that exists owns "kept"; "orphan" names one that is gone.
    let owner: Rollout = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {
            "routeRef": {"name": "kept"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "steps": [{"setWeight": {"weight": 5}}],
        },
    }))
    .unwrap();
    Api::<Rollout>::namespaced(client.clone(), "shop")
        .create(&PostParams::default(), &owner)
        .await
        .unwrap();
    routes
        .create(&PostParams::default(), &route("kept", "shop/cart"))
        .await
        .unwrap();
    let created = routes
        .create(&PostParams::default(), &route("orphan", "shop/checkout"))
        .await
        .unwrap();

    let controller = tokio::spawn(sluice_rollout_weights::orphans::run(
        routes.clone(),
        client.clone(),
        Leadership::always(),
        EventRecorder::new(client.clone(), OPERATOR),
    ));
    let (r, a) = eventually_every(
        "the orphan's ownership annotation removed",
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || {
            let r = routes.get("orphan").await.unwrap();
            let a = r.metadata.annotations.clone().unwrap_or_default();
            if a.contains_key(ROUTE_OWNER_ANNOTATION) {
                Err(format!("annotation kept: {a:?}"))
            } else {
                Ok((r, a))
            }
        },
    )
    .await;
    assert_eq!(a.get("team").map(String::as_str), Some("payments"));
    assert_eq!(r.spec, created.spec, "rules untouched");
    let events: Api<Event> = Api::namespaced(client.clone(), "shop");
    let e = eventually_every(
        "an OrphanedOwnership Event",
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(sluice_rollout_weights::orphans::ORPHANED_OWNERSHIP)
                })
                .ok_or_else(|| "no OrphanedOwnership Event".to_string())
        },
    )
    .await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("orphan")
    );
    assert!(
        e.note
            .as_deref()
            .unwrap_or_default()
            .contains("Rollout shop/checkout does not exist"),
        "{:?}",
        e.note
    );
    let kept = routes.get("kept").await.unwrap();
    assert_eq!(
        kept.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ROUTE_OWNER_ANNOTATION))
            .map(String::as_str),
        Some("shop/cart")
    );
    controller.abort();
}
