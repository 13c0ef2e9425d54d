//! End to end: deleting a Rollout before promotion cancels it. The canary is aborted first —
//! canary weight 0 and the cohort and mirror rules removed, in one write, exactly as any abort —
//! and only then is the route handed back (ownership annotation and this manager's
//! managedFields entry removed), so no canary traffic is left on a route nobody judges.

mod common;

use std::time::Duration;

use common::*;
use kube::api::PostParams;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_rollout_mid_canary_aborts_then_hands_back() {
    let budget = Duration::from_secs(90);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let original = serde_json::to_value(routes(&g.client).get("checkout").await.unwrap()).unwrap();
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a canary at 5% with its mirror rule kept.
    let steps = json!([
        {"mirror": {"percent": 100, "duration": "1s"}},
        {"setWeight": {"weight": 5, "duration": "600s"}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(steps, json!({"keepMirror": true})),
        )
        .await
        .unwrap();
    share_confirmed_at_step(&g.client, "5% confirmed by telemetry", 1, budget).await;
    let at_five = routes(&g.client).get("checkout").await.unwrap();
    assert_eq!(weights(&at_five), (95, 5));
    assert!(rule_names(&at_five).contains(&"sluice-mirror".to_owned()));

    // When the Rollout is deleted (a release engineer cancelling it).
    delete_rollout(&g.client, Duration::from_secs(15)).await;

    // Then the canary is at 0, the mirror rule is gone and the route is handed back: the route
    // is the original one, but for the canary backend left at weight 0.
    let back = routes(&g.client).get("checkout").await.unwrap();
    assert_eq!(weights(&back), (100, 0));
    assert_eq!(
        rule_names(&back),
        vec!["admin".to_owned(), "main".to_owned()]
    );
    let managers: Vec<String> = back
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.iter().any(|m| m == "sluice-rollout-weights"),
        "managedFields after hand-back: {managers:?}"
    );
    let back = serde_json::to_value(&back).unwrap();
    assert_eq!(
        back["metadata"]["annotations"], original["metadata"]["annotations"],
        "ownership annotation removed"
    );
    let mut want = original.clone();
    want["spec"]["rules"][1]["backendRefs"] = json!([
        {"group": "", "kind": "Service", "name": STABLE, "port": 80, "weight": 100},
        {"group": "", "kind": "Service", "name": CANARY, "port": 80, "weight": 0}
    ]);
    assert_eq!(back["spec"], want["spec"], "spec after abort and hand-back");
    assert!(
        !events(&g.client, "AbortedOnDelete").await.is_empty(),
        "a Warning Event says the deletion aborted the canary"
    );
    ctl.stop().await;
}
