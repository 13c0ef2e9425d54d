//! End to end, the route hand-off DESIGN.md relies on, on the released Gateway API HTTPRoute CRD
//! (atomic `spec.rules`): while rollout-weights owns a route's rules, Argo CD (selfHeal,
//! `ignoreDifferences.managedFieldsManagers: [rollout-weights]`, `RespectIgnoreDifferences=true`,
//! `ServerSideApply=true`) reports the route Synced and never reverts the weights; once the
//! manager's managedFields entry is removed (hand-back), self-heal applies Git's route again.

mod common;

use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use sluice_testkit::git::GitRepo;

const BUDGET: Duration = Duration::from_secs(60);

const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: web
spec:
  parentRefs:
  - name: mesh-gateway
  rules:
  - backendRefs:
    - name: web-stable
      port: 80
      weight: 100
";

fn routes(site: &Site) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
    );
    Api::namespaced_with(site.workload("east-1"), DEST_NS, &ar)
}

async fn weights(site: &Site) -> Vec<i64> {
    let route = serde_json::to_value(routes(site).get("web").await.expect("route")).unwrap();
    route
        .pointer("/spec/rules/0/backendRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("weight").and_then(Value::as_i64))
        .collect()
}

#[tokio::test]
async fn an_owned_route_is_left_to_its_owner_until_hand_back() {
    if !have_git() {
        return;
    }
    let Some(crd) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::httproute_crd()) else {
        return;
    };
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    site.workloads[0]
        .1
        .load_manifest_file(&crd)
        .expect("HTTPRoute CRD");
    let repo = GitRepo::new().unwrap();
    repo.commit_files(&[("mesh/route.yaml", ROUTE)], "route")
        .unwrap();
    let mut app = application(
        "route",
        &repo.url(),
        "main",
        "east-1",
        json!({
            "automated": {"selfHeal": true},
            "syncOptions": ["ServerSideApply=true", "RespectIgnoreDifferences=true"],
        }),
    );
    app["spec"]["source"]["path"] = json!("mesh");
    app["spec"]["ignoreDifferences"] = json!([{
        "group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "managedFieldsManagers": ["rollout-weights"],
    }]);
    site.create_app(app).await;
    eventually("route synced", BUDGET, async || {
        (str_at(&site.app("route").await, "/status/sync/status") == "Synced").then_some(())
    })
    .await;
    assert_eq!(weights(&site).await, vec![100]);

    // rollout-weights rewrites the atomic rules with a read-modify-write update.
    let mut route = routes(&site).get("web").await.unwrap();
    route.data["spec"]["rules"] = json!([{"backendRefs": [
        {"name": "web-stable", "port": 80, "weight": 90},
        {"name": "web-canary", "port": 80, "weight": 10},
    ]}]);
    routes(&site)
        .replace(
            "web",
            &PostParams {
                field_manager: Some("rollout-weights".into()),
                ..Default::default()
            },
            &route,
        )
        .await
        .expect("rollout-weights updates the rules");
    always(
        "Argo CD leaves the owned rules alone and reports Synced",
        Duration::from_secs(3),
        async || {
            str_at(&site.app("route").await, "/status/sync/status") == "Synced"
                && weights(&site).await == vec![90, 10]
        },
    )
    .await;

    // Hand-back: the manager's managedFields entry is removed; self-heal applies Git's rules.
    let mut route = routes(&site).get("web").await.unwrap();
    let kept: Vec<_> = route
        .metadata
        .managed_fields
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.manager.as_deref() != Some("rollout-weights"))
        .collect();
    route.metadata.managed_fields = Some(kept);
    routes(&site)
        .replace("web", &PostParams::default(), &route)
        .await
        .expect("hand-back");
    eventually("Git's route restored by self-heal", BUDGET, async || {
        (weights(&site).await == vec![100]).then_some(())
    })
    .await;
    eventually("Synced again", BUDGET, async || {
        (str_at(&site.app("route").await, "/status/sync/status") == "Synced").then_some(())
    })
    .await;
    site.stop().await;
}
