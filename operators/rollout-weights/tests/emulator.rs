//! End to end over the Kubernetes API emulator: the CRDs from `crds/` installed, the
//! rollout-weights controller running in-process; an invalid Rollout gets `Ready=False`
//! (`InvalidSpec`) naming the field, and once fixed, `Ready=True`.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use sluice_api::v1alpha1::{
    Rollout, RolloutPhase,
    rollout::{conditions, reasons},
};
use sluice_rollout_weights::{OPERATOR, reconcile};
use sluice_runtime::{
    conditions::find,
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
    server::Readiness,
};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::object_until;
use tokio_util::sync::CancellationToken;

/// How long the operator gets to write a status.
const WAIT: Duration = Duration::from_secs(15);

fn ready_reason(obj: &Rollout) -> Option<(String, String)> {
    let status = obj.status.as_ref()?;
    let c = find(&status.conditions, conditions::READY)?;
    Some((c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn invalid_rollout_is_named_then_ready_once_fixed() {
    let emu = emulator_with([sluice_crd("rollouts.sluice.dev.yaml")]).await;
    let client = emu.client();
    let api: Api<Rollout> = Api::namespaced(client.clone(), "default");

    let ctx = Arc::new(reconcile::Context::new(
        client.clone(),
        EventRecorder::new(client.clone(), OPERATOR),
    ));
    let (hooks, registry) = Hooks::standalone();
    hooks.health.set_leader(true);
    let shutdown = CancellationToken::new();
    let controller = tokio::spawn(drive(
        Api::<Rollout>::all(client.clone()),
        watcher::Config::default(),
        ctx,
        reconcile::reconcile,
        Leadership::always(),
        shutdown.clone(),
        hooks.clone(),
    ));

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

    // Then it is Invalid, and the condition names the field.
    let seen = object_until(&api, "checkout", "Ready=False InvalidSpec", WAIT, |o| {
        ready_reason(o) == Some(("False".into(), reasons::INVALID_SPEC.into()))
    })
    .await;
    let status = seen.status.as_ref().unwrap();
    assert_eq!(status.phase, RolloutPhase::Invalid);
    assert_eq!(status.observed_generation, seen.metadata.generation);
    let ready = find(&status.conditions, conditions::READY).unwrap();
    assert!(
        ready.message.contains("spec.analysisInterval"),
        "message names the field: {}",
        ready.message
    );
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

    // And a Warning Event says so.
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
                && e.reporting_controller.as_deref() == Some(OPERATOR)
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("spec.analysisInterval"))
        });
    assert!(warned, "a Warning InvalidSpec Event names the field");

    // When the spec is fixed.
    api.patch(
        "checkout",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"analysisInterval": "30s"}})),
    )
    .await
    .unwrap();

    // Then it is Ready for the new generation.
    let fixed = object_until(&api, "checkout", "Ready=True for generation 2", WAIT, |o| {
        ready_reason(o) == Some(("True".into(), reasons::VALID.into()))
            && o.status.as_ref().and_then(|s| s.observed_generation) == o.metadata.generation
    })
    .await;
    assert_eq!(fixed.metadata.generation, Some(2));
    assert_eq!(fixed.status.as_ref().unwrap().phase, RolloutPhase::Pending);

    // And an identical state causes no further writes (no hot loop).
    let rv = fixed.metadata.resource_version.clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        api.get("checkout").await.unwrap().metadata.resource_version,
        rv
    );

    assert_eq!(hooks.health.readiness(), Readiness::Ready, "caches synced");
    let metrics = sluice_runtime::metrics::encode(&registry);
    assert!(
        metrics.contains("sluice_reconciles_total{kind=\"Rollout\"}"),
        "{metrics}"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("controller stops on shutdown")
        .unwrap();
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let seen = loop {
        let t = api.get("errors").await.unwrap();
        if ready(&t).is_some() {
            break t;
        }
        assert!(tokio::time::Instant::now() < deadline, "no status: {t:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let t = api.get("errors").await.unwrap();
        if ready(&t).is_some_and(|r| r.0 == "True") {
            assert_eq!(ready(&t).unwrap().1, "Valid");
            assert_eq!(
                t.status.as_ref().unwrap().observed_generation,
                t.metadata.generation
            );
            assert_ne!(t.metadata.generation, seen.metadata.generation);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never Ready: {:?}",
            t.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = routes.get("orphan").await.unwrap();
        let a = r.metadata.annotations.clone().unwrap_or_default();
        if !a.contains_key(ROUTE_OWNER_ANNOTATION) {
            assert_eq!(a.get("team").map(String::as_str), Some("payments"));
            assert_eq!(r.spec, created.spec, "rules untouched");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "annotation kept: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "shop");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let found = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(sluice_rollout_weights::orphans::ORPHANED_OWNERSHIP)
            });
        if let Some(e) = found {
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
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no OrphanedOwnership Event"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
