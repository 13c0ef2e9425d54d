//! End to end: a canary Service that goes away mid-rollout never leaves its share of requests
//! failing unjudged (Gateway API answers 500 for a backend that does not exist). The canary is
//! held at weight 0 with `CanaryReady=False` (`CanaryServiceMissing`), never aborted for it, and
//! its step starts over at its weight once the Service is back.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{conditions, reasons},
};
use sluice_runtime::conditions::find;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_canary_service_holds_the_canary_at_zero_until_it_is_back() {
    let budget = Duration::from_secs(60);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let services: Api<Service> = Api::namespaced(g.client.clone(), NS);

    // Given a canary at 5%, confirmed by telemetry.
    let steps = json!([{"setWeight": {"weight": 5, "duration": "600s"}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    rollout_until(&g.client, "5% confirmed by telemetry", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.history
                .last()
                .is_some_and(|h| h.share_confirmed_at.is_some())
        })
    })
    .await;
    let canary = services.get(CANARY).await.unwrap();

    // When the canary Service is deleted.
    services
        .delete(CANARY, &DeleteParams::default())
        .await
        .unwrap();

    // Then the canary is held at 0, Paused, not aborted, and the condition says why.
    eventually("canary at 0", budget, async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        (weights(&r) == (100, 0))
            .then_some(())
            .ok_or(format!("{:?}", weights(&r)))
    })
    .await;
    let held = rollout_until(&g.client, "held for the Service", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            find(&s.conditions, conditions::CANARY_READY)
                .is_some_and(|c| c.reason == reasons::CANARY_SERVICE_MISSING)
        })
    })
    .await
    .status
    .unwrap();
    assert_eq!(held.phase, RolloutPhase::Paused);
    assert!(held.abort.is_none());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = rollout_until(&g.client, "still held", budget, |_| true)
        .await
        .status
        .unwrap();
    assert_eq!(still.phase, RolloutPhase::Paused, "{still:?}");

    // And once the Service is back, the step starts over at 5% and is confirmed again.
    let mut again = canary.clone();
    again.metadata.resource_version = None;
    again.metadata.uid = None;
    again.metadata.creation_timestamp = None;
    again.metadata.managed_fields = None;
    services
        .create(&PostParams::default(), &again)
        .await
        .unwrap();
    rollout_until(&g.client, "5% confirmed again", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == RolloutPhase::Progressing
                && s.history
                    .last()
                    .is_some_and(|h| h.share_confirmed_at.is_some())
        })
    })
    .await;
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (95, 5)
    );
    ctl.stop().await;
}
