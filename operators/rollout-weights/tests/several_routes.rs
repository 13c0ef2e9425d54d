//! End to end, several routes per Rollout: the checkout Service is reached north-south (the
//! HTTPRoute `checkout` on the ingress Gateway) and east-west (the GAMMA HTTPRoute
//! `checkout-mesh`, whose parentRef is the stable Service). One plan: both routes carry the same
//! canary weight at every step; when the canary's 5xx ratio breaches its gate (`canary-abort`'s
//! fault), both are aborted to weight 0, each written on its own, and the status' figure runs to
//! the last route reverted; deleting the Rollout hands both back. Prints `detect_to_revert_ms`
//! (the abort decision → the last route reverted) and `abort_latency_ms` (fault → both routes
//! seen at 0). A Rollout deleted after its routeRef is gone still takes the live canary off the
//! other route and hands it back. A route that leaves `spec.additionalRoutes` after promotion is
//! handed back at the promoted weight: no abort sends it back to the old version. Mirror and
//! header-cohort steps go to both routes, and the first weight step takes their rules off both.

mod common;

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::*;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sluice_api::{external::http_route::HttpRoute, v1alpha1::rollout::AbortReason};
use sluice_rollout_weights::route;

/// The east-west twin of the rich route: parented on the stable Service (GAMMA), its one rule
/// sending to it.
fn mesh_route() -> HttpRoute {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "checkout-mesh", "namespace": NS},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": STABLE, "port": 80}],
            "rules": [{
                "name": "main",
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"name": STABLE, "port": 80, "weight": 100}]
            }]
        }
    }))
    .unwrap()
}

/// This operator's rules (names) on (checkout, checkout-mesh).
type OurRules = (Vec<String>, Vec<String>);

/// Canary weights seen on (checkout, checkout-mesh) by a fast poller, in order, deduplicated.
type Seen = Arc<Mutex<Vec<(i32, i32)>>>;

fn watch_both(client: &kube::Client) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let api = routes(client);
    let out = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            if let (Ok(a), Ok(b)) = (api.get("checkout").await, api.get("checkout-mesh").await) {
                let now = (weights(&a).1, weights(&b).1);
                let mut s = out.lock().unwrap_or_else(|e| e.into_inner());
                if s.last() != Some(&now) {
                    s.push(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    (seen, task)
}

/// Creates the east-west route, starts the operator and creates the Rollout with `steps` on both
/// routes.
async fn start_on_both_routes(g: &Given, steps: serde_json::Value) -> Controller {
    routes(&g.client)
        .create(&PostParams::default(), &mesh_route())
        .await
        .expect("mesh route created");
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let with_mesh = json!({"additionalRoutes": [{"name": "checkout-mesh"}]});
    create_rollout(&g.client, &rollout(steps, with_mesh)).await;
    ctl
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gate_aborts_every_route_and_deletion_hands_each_back() {
    let budget = Duration::from_secs(100);
    let Some(g) = given(scenario("canary-abort", 4000.0)).await else {
        return;
    };
    // Given the east-west route beside the ingress route, and a Rollout naming both.
    let (seen, poller) = watch_both(&g.client);
    let steps = json!([
        {"setWeight": {"weight": 1, "duration": "3s"}},
        {"setWeight": {"weight": 5, "duration": "120s"}},
        {"setWeight": {"weight": 50}},
        {"promote": {}}
    ]);
    let ctl = start_on_both_routes(&g, steps).await;

    // Then both routes are owned and carry the step's weight.
    share_confirmed_at_step(&g.client, "1% confirmed by telemetry", 0, budget).await;
    let (a, b) = (
        routes(&g.client).get("checkout").await.unwrap(),
        routes(&g.client).get("checkout-mesh").await.unwrap(),
    );
    assert_eq!((weights(&a), weights(&b)), ((99, 1), (99, 1)));
    let me = Some("shop/checkout".to_owned());
    assert_eq!(
        (route::owner(&a).cloned(), route::owner(&b).cloned()),
        (me.clone(), me)
    );

    // When the fault starts, Then both routes are reverted and the abort recorded once.
    let fault = g.started + Duration::from_secs(30);
    let both_zero = eventually("both routes reverted", budget, async || {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .skip_while(|w| w.0 == 0 && w.1 == 0)
            .any(|w| *w == (0, 0))
            .then(Instant::now)
            .ok_or(format!("{s:?}"))
    })
    .await;
    let status = abort_recorded(&g.client, budget).await;
    assert_eq!(
        status.abort.as_ref().unwrap().reason,
        AbortReason::GateFailed
    );
    let detect_ms = status
        .abort_detect_to_revert_ms
        .expect("abortDetectToRevertMs set with routeRevertedAt");
    let mesh = &status.additional_owned_routes;
    assert_eq!(mesh.len(), 1, "{mesh:?}");
    assert_eq!(mesh[0].name, "checkout-mesh");
    assert_eq!(mesh[0].written_weight, Some(0));
    // The figure runs to the last route reverted: never before either route's revert.
    let reverted_at = status
        .abort
        .as_ref()
        .unwrap()
        .route_reverted_at
        .clone()
        .unwrap();
    assert!(
        mesh[0]
            .weight_written_at
            .as_ref()
            .is_some_and(|t| t.0 <= reverted_at.0),
        "{mesh:?} vs {reverted_at:?}"
    );

    // The same weight on both routes at every step: every weight either route carried, the
    // other carried too.
    {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        let on = |pick: fn(&(i32, i32)) -> i32| s.iter().map(pick).collect::<BTreeSet<i32>>();
        assert_eq!(on(|w| w.0), on(|w| w.1), "{s:?}");
        assert!(on(|w| w.0).contains(&1), "{s:?}");
        assert_eq!(s.last(), Some(&(0, 0)));
    }
    println!(
        "several routes: abort_latency_ms={} detect_to_revert_ms={detect_ms} routes=2",
        both_zero.saturating_duration_since(fault).as_millis()
    );

    // When the Rollout is deleted, Then both routes are handed back, weights left at 0.
    delete_rollout(&g.client, budget).await;
    for name in ["checkout", "checkout-mesh"] {
        let r = routes(&g.client).get(name).await.unwrap();
        assert_eq!(route::owner(&r), None, "{name} handed back");
        assert_eq!(weights(&r), (100, 0), "{name}");
    }

    poller.abort();
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_after_the_route_ref_is_gone_reverts_and_hands_back_the_other_route() {
    let budget = Duration::from_secs(100);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    // Given both routes at a confirmed 1%.
    let steps = json!([
        {"setWeight": {"weight": 1, "duration": "120s"}},
        {"promote": {}}
    ]);
    let ctl = start_on_both_routes(&g, steps).await;
    share_confirmed_at_step(&g.client, "1% confirmed by telemetry", 0, budget).await;
    let mesh = routes(&g.client).get("checkout-mesh").await.unwrap();
    assert_eq!(weights(&mesh), (99, 1));

    // When routeRef goes (Git removed it), then the Rollout is deleted.
    routes(&g.client)
        .delete("checkout", &DeleteParams::default())
        .await
        .expect("routeRef deleted");
    delete_rollout(&g.client, budget).await;

    // Then the other route is back at 100/0 and handed back: the canary did not outlive the
    // Rollout.
    let mesh = routes(&g.client).get("checkout-mesh").await.unwrap();
    assert_eq!(route::owner(&mesh), None, "checkout-mesh handed back");
    assert_eq!(weights(&mesh), (100, 0));

    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_leaving_the_spec_after_promotion_keeps_the_promoted_weight_and_is_handed_back() {
    let budget = Duration::from_secs(100);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    // Given a Rollout Promoted on both routes (100% canary).
    let steps = json!([
        {"setWeight": {"weight": 1, "duration": "3s"}},
        {"promote": {}}
    ]);
    let ctl = start_on_both_routes(&g, steps).await;
    rollout_until(&g.client, "Promoted", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == sluice_api::v1alpha1::RolloutPhase::Promoted)
    })
    .await;
    // The status is written before the route writes it decided (reconcile's order of effects),
    // so the promoted weight reaches the east-west route just after the phase does.
    eventually("checkout-mesh at the promoted 0/100", budget, async || {
        let r = routes(&g.client)
            .get("checkout-mesh")
            .await
            .map_err(|e| e.to_string())?;
        (weights(&r) == (0, 100))
            .then_some(())
            .ok_or_else(|| format!("weights {:?}", weights(&r)))
    })
    .await;

    // When the east-west route leaves spec.additionalRoutes.
    rollouts(&g.client)
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"additionalRoutes": null}})),
        )
        .await
        .expect("additionalRoutes removed");

    // Then it is handed back as it stands: the promoted canary keeps its traffic there, and
    // routeRef stays owned at 100%.
    let mesh = eventually("checkout-mesh handed back", budget, async || {
        let r = routes(&g.client)
            .get("checkout-mesh")
            .await
            .map_err(|e| e.to_string())?;
        route::owner(&r)
            .is_none()
            .then_some(r.clone())
            .ok_or(format!("{:?}", r.metadata.annotations))
    })
    .await;
    assert_eq!(weights(&mesh), (0, 100), "the promoted weight is kept");
    let main = routes(&g.client).get("checkout").await.unwrap();
    assert_eq!(weights(&main), (0, 100));
    assert_eq!(
        route::owner(&main).map(String::as_str),
        Some("shop/checkout")
    );
    let forgotten = rollout_until(&g.client, "the release recorded", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.additional_owned_routes.is_empty())
    })
    .await;
    assert_eq!(
        forgotten.status.unwrap().phase,
        sluice_api::v1alpha1::RolloutPhase::Promoted
    );

    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_and_cohort_steps_go_to_both_routes_and_the_first_weight_takes_them_off_both() {
    let budget = Duration::from_secs(100);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let steps = json!([
        {"mirror": {"percent": 50, "duration": "3s"}},
        {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "3s"}},
        {"setWeight": {"weight": 5, "duration": "3s"}},
        {"promote": {}}
    ]);
    let ctl = start_on_both_routes(&g, steps).await;
    // This operator's rules on (checkout, checkout-mesh), as a fast poller sees them.
    let ours = |r: &HttpRoute| -> Vec<String> {
        rule_names(r)
            .into_iter()
            .filter(|n| n.starts_with("sluice-"))
            .collect()
    };
    let seen: Arc<Mutex<Vec<OurRules>>> = Arc::default();
    let poller = {
        let (api, seen) = (routes(&g.client), seen.clone());
        tokio::spawn(async move {
            loop {
                if let (Ok(a), Ok(b)) = (api.get("checkout").await, api.get("checkout-mesh").await)
                {
                    let now = (ours(&a), ours(&b));
                    let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                    if s.last() != Some(&now) {
                        s.push(now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    rollout_until(&g.client, "Promoted", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == sluice_api::v1alpha1::RolloutPhase::Promoted)
    })
    .await;
    poller.abort();

    // Both routes carried the mirror rule, then the mirror and the cohort rules (the mirror
    // stays until the first weight), then none: every set of rules one route carried, the
    // other carried too.
    let s = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let on = |pick: fn(&OurRules) -> &Vec<String>| {
        s.iter()
            .map(pick)
            .cloned()
            .collect::<BTreeSet<Vec<String>>>()
    };
    assert_eq!(on(|w| &w.0), on(|w| &w.1), "{s:?}");
    for rules in [
        vec!["sluice-mirror".to_owned()],
        vec!["sluice-cohort".to_owned(), "sluice-mirror".to_owned()],
    ] {
        assert!(on(|w| &w.0).contains(&rules), "{rules:?} never seen: {s:?}");
    }
    assert_eq!(s.last(), Some(&(Vec::new(), Vec::new())), "{s:?}");
    for name in ["checkout", "checkout-mesh"] {
        let r = routes(&g.client).get(name).await.unwrap();
        assert_eq!(weights(&r), (0, 100), "{name}");
    }
    ctl.stop().await;
}
