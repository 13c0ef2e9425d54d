//! End to end: `spec.trafficSource` judges the applied share on the traffic the route carries.
//! A north-south route behind a gateway carries only the gateway's requests, while the stable
//! Service also serves the mesh's own clients, which never pass through the route. Here the
//! simulated mesh sends 4,000 requests/s from `istio-system/istio-ingressgateway` through the
//! route and 12,000 requests/s from `shop/frontend` straight to the stable Service (every series
//! carries `source_workload` and `source_workload_namespace`, as Istio's source reporter does).
//! At a 10% step the route gives the canary 10% of the gateway's traffic, which is 2.5% of all
//! traffic to the two Services:
//! - scoped to the gateway, the applied share reads about 10% and is confirmed;
//! - unscoped (the default, every source in the mesh), it reads about 2.5%, is never confirmed,
//!   and the canary is aborted as `AppliedShareNotConfirmed` at the share deadline — which is why
//!   the field exists.

mod common;

use std::time::Duration;

use common::*;
use kube::api::PostParams;
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase, Verdict,
    rollout::{AbortReason, Rollout},
};
use sluice_sim::mesh::scenario::Scenario;

/// The gateway's requests per second through the route.
const GATEWAY_RPS: f64 = 4000.0;
/// The mesh clients' requests per second straight to the stable Service.
const INTERNAL_RPS: f64 = 12000.0;

/// `canary-abort`'s service through the gateway, with the fault removed, and the same stable
/// version also called by `shop/frontend` without the route.
fn gateway_and_mesh_clients() -> Scenario {
    let mut s = scenario("canary-abort", GATEWAY_RPS);
    s.events.clear();
    let mut internal = s.services[0].clone();
    internal.name = "checkout-internal".into();
    internal.route = None;
    internal.cohort = None;
    internal.source_workload = "frontend".into();
    internal.source_namespace = NS.into();
    internal.requests_per_second = INTERNAL_RPS;
    s.services.push(internal);
    s
}

/// The applied-share verdict of `r`, as (verdict, observed share).
fn applied_share(r: &Rollout) -> Option<(Verdict, Option<f64>)> {
    r.status
        .as_ref()?
        .gates
        .iter()
        .find(|v| v.gate == "applied-share")
        .map(|v| (v.verdict, v.value))
}

async fn start(traffic_source: serde_json::Value) -> Option<(Given, Controller)> {
    let g = given(gateway_and_mesh_clients()).await?;
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(
                json!([
                    {"setWeight": {"weight": 10}},
                    {"pause": {"untilPromoted": true}},
                    {"promote": {}}
                ]),
                json!({"trafficSource": traffic_source, "appliedShareDeadline": "30s"}),
            ),
        )
        .await
        .unwrap();
    Some((g, ctl))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_to_the_gateway_the_share_reads_what_the_route_gives_and_is_confirmed() {
    let Some((g, _ctl)) = start(json!({
        "workloads": ["istio-ingressgateway"],
        "namespace": "istio-system"
    }))
    .await
    else {
        return;
    };
    let r = rollout_until(
        &g.client,
        "the gateway-scoped applied share is confirmed at 10%",
        Duration::from_secs(90),
        |r| matches!(applied_share(r), Some((Verdict::Pass, Some(_)))),
    )
    .await;
    let (_, share) = applied_share(&r).unwrap();
    let share = share.unwrap();
    println!("gateway-scoped applied share: {share:.4}");
    // 10% with the tolerance, less what the reading's window holds from before the mesh applied
    // the weight; far from the 2.5% an unscoped reading gives.
    assert!(
        (0.07..=0.12).contains(&share),
        "the route gives the canary 10% of the gateway's requests; read {share}: {:#?}",
        r.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unscoped_the_mesh_clients_dilute_the_share_and_the_canary_is_aborted_unconfirmed() {
    let Some((g, _ctl)) = start(serde_json::Value::Null).await else {
        return;
    };
    let r = rollout_until(
        &g.client,
        "the unscoped Rollout is aborted at its share deadline",
        Duration::from_secs(90),
        |r| r.status.as_ref().is_some_and(|s| s.abort.is_some()),
    )
    .await;
    let status = r.status.as_ref().unwrap();
    let abort = status.abort.as_ref().unwrap();
    println!(
        "unscoped applied share: {:?}%; abort: {:?}",
        status.applied_share, abort.message
    );
    assert_eq!(status.phase, RolloutPhase::Aborted);
    assert_eq!(abort.reason, AbortReason::AppliedShareNotConfirmed);
    // The share is read as a percentage: 10% of 4,000 of 16,000 requests/s is 2.5%.
    let share = status.applied_share.expect("an applied share was read");
    assert!(share < 4.0, "the mesh clients dilute the share: {share}%");
    assert!(
        abort
            .message
            .as_deref()
            .is_some_and(|m| m.contains("canary weight 10% written; the mesh reports")),
        "the abort says what was written and what the mesh reports: {:?}",
        abort.message
    );
    assert_ne!(
        applied_share(&r).map(|(v, _)| v),
        Some(Verdict::Pass),
        "a diluted share never confirms the 10% step"
    );
}
