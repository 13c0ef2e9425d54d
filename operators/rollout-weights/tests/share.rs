//! End to end, judgement on what the mesh reports: a weight the mesh applies only half of is
//! held and reported, never judged on the written weight, and fails after its deadline; low
//! traffic lengthens a step instead of passing it; Prometheus going away stops promotion and the
//! Inconclusive policy applies, with the condition saying why.

mod common;

use std::time::Duration;

use common::*;
use kube::api::PostParams;
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase, Verdict, VerdictReason,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::conditions::find;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distorted_share_is_held_reported_and_fails_after_its_deadline() {
    let budget = Duration::from_secs(60);
    let Some(g) = given(scenario("distorted-share", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a 5% step on a mesh that applies half of any canary weight.
    let steps = json!([{"setWeight": {"weight": 5}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(steps, json!({"appliedShareDeadline": "15s"})),
        )
        .await
        .unwrap();

    // Then the step is held: 5% written, ~2.5% reported (counted over the few intervals since
    // the write, so it reads anywhere well below the ±20% band of 4–6%), the condition and an
    // Event say so.
    let held = rollout_until(&g.client, "share reported as not applied", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.applied_share.is_some_and(|a| (0.5..3.5).contains(&a))
                && find(&s.conditions, conditions::APPLIED_SHARE_CONFIRMED)
                    .is_some_and(|c| c.reason == reasons::SHARE_NOT_YET_APPLIED)
        })
    })
    .await;
    let s = held.status.unwrap();
    assert_eq!(s.desired_weight, Some(5));
    assert_eq!(s.phase, RolloutPhase::Progressing);
    // The canary's health is judged from the first second; only the share gate waits for the
    // confirmation.
    assert!(
        !s.gates.iter().any(|g| g.gate == "applied-share"),
        "the share gate is not judged before the share is confirmed: {:?}",
        s.gates
    );
    let c = find(&s.conditions, conditions::APPLIED_SHARE_CONFIRMED).unwrap();
    assert!(
        c.message.contains("canary weight 5% written"),
        "{}",
        c.message
    );
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (95, 5)
    );
    eventually("a ShareNotYetApplied Event", budget, async || {
        let e = events(&g.client, reasons::SHARE_NOT_YET_APPLIED).await;
        (!e.is_empty()).then_some(()).ok_or("none".to_owned())
    })
    .await;

    // And after the deadline the rollout aborts for it, never having passed the step.
    let aborted = rollout_until(&g.client, "abort after the share deadline", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == RolloutPhase::Aborted)
    })
    .await;
    let s = aborted.status.unwrap();
    assert_eq!(
        s.abort.unwrap().reason,
        AbortReason::AppliedShareNotConfirmed
    );
    assert!(
        s.history.iter().all(|h| h.share_confirmed_at.is_none()),
        "{:?}",
        s.history
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_traffic_lengthens_the_step_and_never_passes_it() {
    let Some(g) = given(scenario("canary-promote", 3.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a 50% step of 2 s at 3 requests per second (6 canary requests per 4 s window, fewer
    // than the gates' minimum of 100).
    let steps = json!([{"setWeight": {"weight": 50}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    rollout_until(&g.client, "share confirmed", Duration::from_secs(40), |r| {
        r.status
            .as_ref()
            .and_then(|s| s.history.last())
            .is_some_and(|h| h.share_confirmed_at.is_some())
    })
    .await;

    // When three times the step's duration has passed.
    tokio::time::sleep(Duration::from_secs(6)).await;

    // Then the step is still running, its gates Inconclusive for too few samples.
    let r = rollouts(&g.client).get("checkout").await.unwrap();
    let s = r.status.unwrap();
    assert_eq!(s.phase, RolloutPhase::Progressing, "{s:#?}");
    assert_eq!(s.current_step_index, Some(0), "no pass on no data");
    assert!(
        s.gates.iter().any(|v| v.verdict == Verdict::Inconclusive
            && v.reason == VerdictReason::TooFewSamples),
        "{:#?}",
        s.gates
    );
    assert!(
        !s.gates.iter().all(|v| v.verdict == Verdict::Pass),
        "{:#?}",
        s.gates
    );
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (50, 50)
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_down_stops_promotion_and_the_inconclusive_policy_applies() {
    let budget = Duration::from_secs(60);
    let Some(mut g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a 5% step analysed with a Pause-after-3s Inconclusive policy, share confirmed.
    let steps = json!([{"setWeight": {"weight": 5, "duration": "60s"}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(
                steps,
                json!({"inconclusive": {"action": "Pause", "after": "3s"}}),
            ),
        )
        .await
        .unwrap();
    rollout_until(&g.client, "share confirmed", budget, |r| {
        r.status
            .as_ref()
            .and_then(|s| s.history.last())
            .is_some_and(|h| h.share_confirmed_at.is_some())
    })
    .await;

    // When Prometheus goes away.
    drop(g.prometheus.take());

    // Then the condition says why, and after 3 s of Inconclusive the rollout is held (Paused).
    let paused = rollout_until(&g.client, "held by the Inconclusive policy", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == RolloutPhase::Paused
                && find(&s.conditions, conditions::PROGRESSING)
                    .is_some_and(|c| c.reason == reasons::INCONCLUSIVE)
        })
    })
    .await;
    let s = paused.status.unwrap();
    let held = find(&s.conditions, conditions::PROGRESSING).unwrap();
    assert!(
        held.message.contains("QueryError") || held.message.contains("Timeout"),
        "the condition says why: {}",
        held.message
    );
    assert!(
        s.gates.iter().all(|v| v.verdict == Verdict::Inconclusive
            && matches!(v.reason, VerdictReason::QueryError | VerdictReason::Timeout)),
        "{:#?}",
        s.gates
    );
    assert_eq!(s.current_step_index, Some(0));
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (95, 5),
        "no promotion"
    );
    ctl.stop().await;
}
