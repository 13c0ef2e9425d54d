//! End to end, changes under a running rollout: a new canary version (the canary Deployment's
//! pod template changes) sets the canary weight to 0 at once — seen through the watch on the
//! canary workload, not at the next analysis — and the rollout starts over from step 0 once the
//! new version is ready; a rollout restart of the same version (`restartedAt`, as an Istio
//! revision upgrade does) is not a new version. A new canary Service aborts the old canary on
//! the route (weight 0, never left live beside the new one) before the rollout starts over.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{StepOutcome, reasons},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_canary_version_restarts_the_rollout_from_zero() {
    let budget = Duration::from_secs(60);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let deployments: Api<Deployment> = Api::namespaced(g.client.clone(), NS);
    // Every canary weight the route shows, with when it was first seen: a watch sees every
    // write, however short-lived (a poll can miss a weight held for one reconcile).
    let seen: Arc<Mutex<Vec<(Instant, i32)>>> = Arc::default();
    let poller = {
        let (seen, api) = (seen.clone(), routes(&g.client));
        tokio::spawn(async move {
            loop {
                let Ok(stream) = api.watch(&WatchParams::default(), "0").await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(event)) = stream.next().await {
                    let (WatchEvent::Added(r) | WatchEvent::Modified(r)) = event else {
                        continue;
                    };
                    if r.metadata.name.as_deref() != Some("checkout") {
                        continue;
                    }
                    let w = weights(&r).1;
                    let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                    if s.last().map(|l| l.1) != Some(w) {
                        s.push((Instant::now(), w));
                    }
                }
            }
        })
    };

    // Given a canary at 5%, held by a pause step (no analysis-driven requeue is needed to see
    // the change: the canary workload is watched), with a long analysis interval.
    let steps = json!([
        {"setWeight": {"weight": 5}},
        {"pause": {"untilPromoted": true}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    rollout_until(&g.client, "held at 5%", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == RolloutPhase::Paused
                && s.current_step_index == Some(1)
                && s.canary_version.is_some()
        })
    })
    .await;
    let version = rollouts(&g.client)
        .get("checkout")
        .await
        .unwrap()
        .status
        .unwrap()
        .canary_version;

    // When the same version is restarted (as an Istio revision upgrade does), nothing changes.
    deployments
        .patch(
            CANARY,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-12-01T22:00:00Z"
            }}}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let same = rollouts(&g.client)
        .get("checkout")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        (
            same.phase,
            same.current_step_index,
            same.canary_version.clone()
        ),
        (RolloutPhase::Paused, Some(1), version.clone()),
        "a restart is not a new version"
    );

    // When a new version is deployed to the canary Deployment.
    deployments
        .patch(
            CANARY,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "example/checkout-v2-14:patched"}
            ]}}}})),
        )
        .await
        .unwrap();
    let changed = Instant::now();

    // Then the canary weight is 0 at once (the route watch sees it: the new version is ready
    // again within a second here, so the rollout is soon back at 5%), and the rollout starts
    // over from step 0.
    let to_zero = eventually("canary at 0", budget, async || {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .find(|(at, w)| *at >= changed && *w == 0)
            .map(|(at, _)| at.duration_since(changed))
            .ok_or_else(|| {
                let after: Vec<_> = s
                    .iter()
                    .map(|(at, w)| (at.checked_duration_since(changed), *w))
                    .collect();
                format!("weights seen (time after the new version, weight): {after:?}")
            })
    })
    .await;
    let restarted = rollout_until(
        &g.client,
        "restarted at step 0 on the new version",
        budget,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.current_step_index == Some(0)
                    && s.canary_version.is_some()
                    && s.canary_version != version
            })
        },
    )
    .await
    .status
    .unwrap();
    assert!(
        restarted
            .history
            .iter()
            .any(|h| h.index == 1 && h.outcome == Some(StepOutcome::Restarted)),
        "{:?}",
        restarted.history
    );
    assert!(
        !events(&g.client, reasons::CANARY_VERSION_CHANGED)
            .await
            .is_empty()
    );
    println!(
        "new canary version → canary weight 0 in {} ms",
        to_zero.as_millis()
    );
    assert!(
        to_zero < Duration::from_secs(5),
        "seen through the workload watch: {to_zero:?}"
    );
    poller.abort();
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_canary_service_aborts_the_old_canary_before_starting_over() {
    let budget = Duration::from_secs(60);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    g.emu.load_yaml(&deployment("checkout-v2-15")).unwrap();
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given v2.14 at 5%.
    let steps = json!([{"setWeight": {"weight": 5, "duration": "600s"}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    rollout_until(&g.client, "5% confirmed", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.history
                .last()
                .is_some_and(|h| h.share_confirmed_at.is_some())
        })
    })
    .await;

    // When the Rollout is edited to canary v2.15 instead.
    rollouts(&g.client)
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"canaryService": {"name": "checkout-v2-15"},
                                          "canaryWorkload": {"name": "checkout-v2-15"}}})),
        )
        .await
        .unwrap();

    // Then v2.14 goes to 0 (not left live beside the new canary) and v2.15 starts at 5%.
    let both = eventually("v2.14 at 0, v2.15 at 5", budget, async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        let rule = r.rule_by_name("main").ok_or("no managed rule")?;
        let w = |n: &str| rule.backend(n).map(|b| b.effective_weight());
        let got = (w(STABLE), w(CANARY), w("checkout-v2-15"));
        (got == (Some(95), Some(0), Some(5)))
            .then_some(got)
            .ok_or(format!("{got:?}"))
    })
    .await;
    println!("after the edit: stable, v2.14, v2.15 = {both:?}");
    assert!(
        !events(&g.client, reasons::TARGET_CHANGED).await.is_empty(),
        "a Warning Event says the target changed"
    );
    ctl.stop().await;
}
