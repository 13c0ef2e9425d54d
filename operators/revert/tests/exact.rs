//! End to end with the simulated Argo CD (`sluice-argocd`): a pin restores every object
//! exactly, also the fields the bad change added outside atomic lists. The bad revision adds a
//! DestinationRule `trafficPolicy.connectionPool` and an annotation on the checkout route;
//! server-side apply of the good bundle under revert's own manager would leave both (only the
//! manager that applied a field removes it by omitting it). After the pin both are gone, under
//! Argo CD's server-side and client-side sync alike, and Argo CD reports the pinned content
//! Synced so the pin releases. A field someone else set is not wiped: the pin says which field
//! keeps the object from equalling the bundle and is not declared Pinned.
//!
//! The workload cluster serves Istio's released DestinationRule CRD (v1.28.0, fetched by
//! `scripts/install-tools.sh`, read through `sluice_testkit::prereq::destination_rule_crd`):
//! `spec.trafficPolicy` is a structure whose fields merge one by one under server-side apply,
//! and `spec.subsets` a list without `x-kubernetes-list-type` (atomic).

mod support;

use std::time::Duration;

use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};
use sluice_api::{
    external::argocd::Application,
    v1alpha1::{
        BundlePinPhase,
        bundle_pin::{conditions, reasons},
    },
};
use sluice_runtime::conditions::find;
use sluice_testkit::eventually::eventually_every;
use support::*;

const BUDGET: Duration = Duration::from_secs(45);

/// Istio's released DestinationRule CRD (see the module docs).
fn destination_rule_crd() -> Option<String> {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::destination_rule_crd())
}

fn destination_rules(w: &World) -> Api<DynamicObject> {
    Api::namespaced_with(
        w.workload_admin.clone(),
        SHOP,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "DestinationRule"),
            "destinationrules",
        ),
    )
}

/// The checkout DestinationRule; the bad change adds a connection pool of one connection.
fn destination_rule(bad: bool) -> String {
    let pool = if bad {
        "\n    connectionPool:\n      tcp:\n        maxConnections: 1\n      http:\n        http1MaxPendingRequests: 1"
    } else {
        ""
    };
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: checkout\n  namespace: {SHOP}\nspec:\n  host: checkout\n  subsets:\n  - name: stable\n    labels: {{version: v2-13}}\n  trafficPolicy:\n    loadBalancer:\n      simple: ROUND_ROBIN{pool}\n"
    )
}

/// The checkout route; the bad change adds an annotation (outside every list).
fn checkout_route(bad: bool) -> String {
    let text = route("checkout", 10);
    if bad {
        text.replacen(
            "metadata:\n",
            "metadata:\n  annotations:\n    shop.example/debug-headers: \"on\"\n",
            1,
        )
    } else {
        text
    }
}

async fn application(w: &World, revision: &str, server_side: bool) {
    let mut policy = original_policy();
    if !server_side {
        policy["syncOptions"] = json!(["RespectIgnoreDifferences=true"]);
    }
    let app: Application = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": APP, "namespace": ARGOCD},
        "spec": {
            "project": "default",
            "source": {"repoURL": format!("oci://{}", w.repo), "targetRevision": revision, "path": "."},
            "destination": {"name": CLUSTER, "namespace": SHOP},
            "syncPolicy": policy,
        }
    }))
    .unwrap();
    w.apps().create(&PostParams::default(), &app).await.unwrap();
}

async fn synced(w: &World, digest: &str, what: &str) {
    let apps = w.apps();
    eventually_every(what, BUDGET, POLL, || {
        let apps = apps.clone();
        async move {
            let a = apps.get(APP).await.ok()?;
            a.is_synced_at(digest).then_some(())
        }
    })
    .await;
}

/// (connectionPool of the DestinationRule, debug annotation of the route).
async fn bad_fields(w: &World) -> (Option<Value>, Option<Value>) {
    let dr = destination_rules(w).get("checkout").await.unwrap();
    let route = w.routes().get("checkout").await.unwrap();
    (
        dr.data
            .pointer("/spec/trafficPolicy/connectionPool")
            .cloned(),
        route
            .metadata
            .annotations
            .and_then(|a| a.get("shop.example/debug-headers").cloned())
            .map(Value::from),
    )
}

/// Given the good revision synced, then the bad one; returns (good digest, world, Argo CD).
async fn given_the_bad_change_synced(
    server_side: bool,
) -> Option<(World, sluice_argocd::ArgoCd, String)> {
    let crd = destination_rule_crd()?;
    let w = World::start().await?;
    w.workload.load_yaml(&crd).expect("DestinationRule CRD");
    let argocd = sluice_argocd::ArgoCd::start(
        w.mgmt_client.clone(),
        sluice_argocd::ArgoCdOptions {
            insecure_registries: vec![w.registry.host()],
            ..Default::default()
        },
    )
    .await
    .expect("simulated Argo CD starts");
    let (good, _) = w
        .bundle(
            &[checkout_route(false), destination_rule(false)],
            "1111111",
            Some(&w.signer),
        )
        .await;
    application(&w, &good.digest, server_side).await;
    synced(&w, &good.digest, "Argo CD synced the good revision").await;
    let (bad, _) = w
        .bundle(
            &[checkout_route(true), destination_rule(true)],
            "2222222",
            Some(&w.signer),
        )
        .await;
    w.point_at(&bad.digest).await;
    synced(&w, &bad.digest, "Argo CD synced the bad revision").await;
    let (pool, annotation) = bad_fields(&w).await;
    assert!(
        pool.is_some() && annotation.is_some(),
        "the bad change is live"
    );
    Some((w, argocd, good.digest))
}

async fn pin_phase(w: &World, name: &str, want: BundlePinPhase) -> sluice_api::v1alpha1::BundlePin {
    let pins = w.pins();
    eventually_every(&format!("{name} {want:?}"), BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get(name).await.ok()?;
            (p.status.as_ref()?.phase == want).then_some(p)
        }
    })
    .await
}

async fn pin_restores_fields_outside_atomic_lists(server_side: bool) {
    let Some((mut w, argocd, good)) = given_the_bad_change_synced(server_side).await else {
        return;
    };

    // When a human pins the good bundle.
    w.start_revert();
    w.create_pin("pin-exact", &good, json!({})).await;
    pin_phase(&w, "pin-exact", BundlePinPhase::Pinned).await;

    // Then the objects are the good bundle's: the connection pool and the annotation are gone.
    assert_eq!(
        bad_fields(&w).await,
        (None, None),
        "Pinned while a field of the bad change is live"
    );
    let dr = destination_rules(&w).get("checkout").await.unwrap();
    assert_eq!(
        dr.data["spec"]["trafficPolicy"],
        json!({"loadBalancer": {"simple": "ROUND_ROBIN"}})
    );
    assert_eq!(w.canary_weight("checkout").await, Some(10));

    // And held: several of Argo CD's resyncs later, nothing of the bad change is back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(bad_fields(&w).await, (None, None));

    // When the revert reaches Git, CI renders the good content under a new digest; Argo CD
    // reports it Synced (nothing left over) and the pin releases.
    let (same, _) = w
        .bundle(
            &[checkout_route(false), destination_rule(false)],
            "3333333",
            Some(&w.signer),
        )
        .await;
    w.point_at(&same.digest).await;
    let released = pin_phase(&w, "pin-exact", BundlePinPhase::Released).await;
    assert_eq!(
        find(&released.status.unwrap().conditions, conditions::RELEASED)
            .unwrap()
            .reason,
        reasons::CONTENT_MATCHED
    );
    synced(&w, &same.digest, "Argo CD Synced at the merged revert").await;
    assert_eq!(bad_fields(&w).await, (None, None));
    drop(argocd);
}

#[tokio::test]
async fn a_pin_removes_what_the_bad_change_added_outside_atomic_lists_server_side_sync() {
    pin_restores_fields_outside_atomic_lists(true).await;
}

#[tokio::test]
async fn a_pin_removes_what_the_bad_change_added_outside_atomic_lists_client_side_sync() {
    pin_restores_fields_outside_atomic_lists(false).await;
}

#[tokio::test]
async fn a_field_another_manager_set_keeps_the_pin_from_being_declared_and_is_named() {
    let Some((mut w, argocd, good)) = given_the_bad_change_synced(true).await else {
        return;
    };
    // Someone tuned the rule by hand after the bad sync (not Argo CD: revert leaves it).
    destination_rules(&w)
        .patch(
            "checkout",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"exportTo": ["."]}})),
        )
        .await
        .unwrap();

    w.start_revert();
    w.create_pin("pin-exact", &good, json!({})).await;
    let pins = w.pins();
    let held = eventually_every("Pinned=False NotRestored", BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get("pin-exact").await.ok()?;
            let c = find(&p.status.as_ref()?.conditions, conditions::PINNED)?.clone();
            (c.reason == reasons::NOT_RESTORED).then_some((p, c))
        }
    })
    .await;
    let (pin, c) = held;
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains("/spec/exportTo"),
        "names the field: {}",
        c.message
    );
    assert_ne!(pin.status.unwrap().phase, BundlePinPhase::Pinned);
    // Argo CD's fields are gone all the same; the person's stays.
    let (pool, annotation) = bad_fields(&w).await;
    assert_eq!((pool, annotation), (None, None));
    let dr = destination_rules(&w).get("checkout").await.unwrap();
    assert_eq!(dr.data["spec"]["exportTo"], json!(["."]));

    // Once the person's field is removed, the pin is declared.
    destination_rules(&w)
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "remove", "path": "/spec/exportTo"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    pin_phase(&w, "pin-exact", BundlePinPhase::Pinned).await;
    drop(argocd);
}

#[tokio::test]
async fn an_object_the_bad_change_deleted_comes_back_tracked_so_argo_cd_agrees_and_the_pin_releases()
 {
    let Some(crd) = destination_rule_crd() else {
        return;
    };
    let Some(mut w) = World::start().await else {
        return;
    };
    w.workload.load_yaml(&crd).expect("DestinationRule CRD");
    let argocd = sluice_argocd::ArgoCd::start(
        w.mgmt_client.clone(),
        sluice_argocd::ArgoCdOptions {
            insecure_registries: vec![w.registry.host()],
            ..Default::default()
        },
    )
    .await
    .expect("simulated Argo CD starts");
    let good_objects = [checkout_route(false), destination_rule(false)];
    let (good, _) = w.bundle(&good_objects, "1111111", Some(&w.signer)).await;
    application(&w, &good.digest, true).await;
    synced(&w, &good.digest, "Argo CD synced the good revision").await;
    // The bad change drops the DestinationRule; Argo CD prunes it.
    let (bad, _) = w
        .bundle(&[checkout_route(false)], "2222222", Some(&w.signer))
        .await;
    w.point_at(&bad.digest).await;
    synced(&w, &bad.digest, "Argo CD synced the bad revision").await;
    assert!(
        destination_rules(&w)
            .get_opt("checkout")
            .await
            .unwrap()
            .is_none()
    );

    // The pin recreates it, carrying Argo CD's tracking for the Application.
    w.start_revert();
    w.create_pin("pin-tracked", &good.digest, json!({})).await;
    pin_phase(&w, "pin-tracked", BundlePinPhase::Pinned).await;
    let dr = destination_rules(&w).get("checkout").await.unwrap();
    assert_eq!(
        dr.metadata
            .annotations
            .unwrap_or_default()
            .get("argocd.argoproj.io/tracking-id")
            .map(String::as_str),
        Some("mesh-c1:networking.istio.io/DestinationRule:shop/checkout")
    );

    // Git agrees (the same content, a new digest): Argo CD reports Synced, the pin releases.
    let (same, _) = w.bundle(&good_objects, "3333333", Some(&w.signer)).await;
    w.point_at(&same.digest).await;
    pin_phase(&w, "pin-tracked", BundlePinPhase::Released).await;
    synced(&w, &same.digest, "Argo CD Synced at the merged revert").await;
    drop(argocd);
}
