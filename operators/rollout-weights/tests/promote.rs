//! End to end, `canary-promote`: a healthy canary goes through mirror, header cohort and
//! 1 → 5 → 25 → 50 → 100 on the emulator with the real Prometheus and the simulated mesh, each
//! weight step judged on the share the mesh reports; then deleting the Rollout hands the route
//! back with everything outside the managed rule's weights exactly as it was.

mod common;

use std::time::Duration;

use common::*;
use kube::api::PostParams;
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{ROUTE_OWNER_ANNOTATION, StepOutcome, conditions, reasons},
};
use sluice_runtime::conditions::find;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_canary_promotes_step_by_step_and_hands_back() {
    let budget = Duration::from_secs(110);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let original = serde_json::to_value(routes(&g.client).get("checkout").await.unwrap()).unwrap();

    // Given a Rollout through mirror, cohort and every weight step.
    let steps = json!([
        {"mirror": {"percent": 50, "duration": "2s"}},
        {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "2s"}},
        {"setWeight": {"weight": 1}},
        {"setWeight": {"weight": 5}},
        {"setWeight": {"weight": 25}},
        {"setWeight": {"weight": 50}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();

    // Then the mirror rule, then the cohort rule appear on the route (each step's extra rule).
    eventually("the mirror rule on the route", budget, async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        let names = rule_names(&r);
        names
            .iter()
            .any(|n| n == "sluice-mirror")
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await;
    eventually("the cohort rule on the route", budget, async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        let names = rule_names(&r);
        names
            .iter()
            .any(|n| n == "sluice-cohort")
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await;

    // And every weight step is written, its share confirmed by telemetry, then passed.
    let promoted = rollout_until(&g.client, "phase Promoted", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == RolloutPhase::Promoted)
    })
    .await;
    let status = promoted.status.clone().unwrap();
    let weights_passed: Vec<u32> = status
        .history
        .iter()
        .filter(|h| h.outcome == Some(StepOutcome::Passed))
        .filter_map(|h| h.weight)
        .collect();
    assert_eq!(
        weights_passed,
        vec![1, 5, 25, 50],
        "history: {:#?}",
        status.history
    );
    for h in status.history.iter().filter(|h| h.weight.is_some()) {
        assert!(
            h.share_confirmed_at.is_some(),
            "step {} judged only after the share was confirmed: {h:?}",
            h.index
        );
    }
    assert!(
        status
            .history
            .iter()
            .filter(|h| h.index < 2)
            .all(|h| h.outcome == Some(StepOutcome::Passed)),
        "mirror and cohort steps passed: {:#?}",
        status.history
    );

    // Then the route is at 100% canary, without cohort or mirror rules, still owned.
    // (The status is written before the route, so the route may trail by one write.)
    let route = eventually("route at 100% canary", Duration::from_secs(5), async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        (weights(&r) == (0, 100))
            .then_some(r.clone())
            .ok_or(format!("{:?}", weights(&r)))
    })
    .await;
    assert_eq!(rule_names(&route), vec!["admin", "main"]);
    assert_eq!(
        route
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(ROUTE_OWNER_ANNOTATION)
            .map(String::as_str),
        Some("shop/checkout")
    );
    let progressing = find(&status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(progressing.reason, reasons::PROMOTED);
    eventually("the phase metric", Duration::from_secs(5), async || {
        let m = ctl.metrics();
        m.contains("sluice_rollouts{phase=\"Promoted\"} 1")
            .then_some(())
            .ok_or(m)
    })
    .await;

    // When the Rollout is deleted (the Git change making v2.14 stable prunes it).
    delete_rollout(&g.client, Duration::from_secs(15)).await;

    // Then the route is handed back: annotation and this manager's managedFields entry gone, and
    // everything else equals the original route but for the managed rule's backends.
    let back = routes(&g.client).get("checkout").await.unwrap();
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
    let mut want = original.clone();
    // (`group` and `kind` are the CRD's defaults, filled in by the API server.)
    want["spec"]["rules"][1]["backendRefs"] = json!([
        {"group": "", "kind": "Service", "name": STABLE, "port": 80, "weight": 0},
        {"group": "", "kind": "Service", "name": CANARY, "port": 80, "weight": 100}
    ]);
    assert_eq!(back["spec"], want["spec"], "spec after hand-back");
    assert_eq!(
        back["metadata"]["annotations"],
        original["metadata"]["annotations"]
    );
    assert_eq!(back["metadata"]["labels"], original["metadata"]["labels"]);
    println!("promotion and hand-back took {:?}", g.started.elapsed());

    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_cohort_counts_in_the_expected_share() {
    let budget = Duration::from_secs(90);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a cohort step kept into a 5% step (2% of requests carry the cohort header).
    let steps = json!([
        {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "10s"}},
        {"setWeight": {"weight": 5, "duration": "2s"}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(steps, json!({"keepCohort": true})),
        )
        .await
        .unwrap();

    // Then the 5% step is confirmed at 2 + 98 × 5% ≈ 6.9%, with the cohort rule still there.
    let r = rollout_until(
        &g.client,
        "5% step confirmed with the kept cohort",
        budget,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.current_step_index == Some(1)
                    && s.history
                        .last()
                        .is_some_and(|h| h.share_confirmed_at.is_some())
            })
        },
    )
    .await;
    let s = r.status.unwrap();
    let cohort = s
        .cohort_share
        .expect("cohort share measured in the cohort step");
    assert!((1.5..2.5).contains(&cohort), "cohort share {cohort}");
    let share = s.applied_share.unwrap();
    assert!((5.5..8.5).contains(&share), "applied share {share}");
    assert!(
        rule_names(&routes(&g.client).get("checkout").await.unwrap())
            .contains(&"sluice-cohort".to_owned())
    );
    rollout_until(&g.client, "Promoted", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == RolloutPhase::Promoted)
    })
    .await;
    ctl.stop().await;
}
