//! End to end with the operator binary: killed with SIGKILL in the middle of a weight step and
//! started again, it resumes from the status it wrote — no step repeated, none skipped; and with
//! two replicas, killing the leader hands over to the standby within the Lease duration, which
//! carries the rollout on to promotion.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::PostParams};
use serde_json::json;
use sluice_api::v1alpha1::{RolloutPhase, rollout::StepOutcome};

const LEASE_DURATION: Duration = Duration::from_secs(4);

fn steps() -> serde_json::Value {
    json!([
        {"setWeight": {"weight": 1}},
        {"setWeight": {"weight": 5, "duration": "4s"}},
        {"setWeight": {"weight": 25}},
        {"promote": {}}
    ])
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .get_opt("sluice-rollout-weights")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

fn assert_each_step_once(r: &sluice_api::v1alpha1::Rollout) {
    let s = r.status.as_ref().unwrap();
    let runs: Vec<(u32, Option<u32>, Option<StepOutcome>)> = s
        .history
        .iter()
        .map(|h| (h.index, h.weight, h.outcome))
        .collect();
    assert_eq!(
        runs,
        vec![
            (0, Some(1), Some(StepOutcome::Passed)),
            (1, Some(5), Some(StepOutcome::Passed)),
            (2, Some(25), Some(StepOutcome::Passed)),
        ],
        "each step ran once, in order: {:#?}",
        s.history
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_step_resumes_without_repeating_or_skipping() {
    let budget = Duration::from_secs(90);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    g.emu.write_kubeconfig(&kubeconfig).unwrap();
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let mut a = Binary::start(&kubeconfig, &prom, "replica-a", free_port());

    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps(), json!({})))
        .await
        .unwrap();

    // Given the rollout in the middle of its 5% step, analysis running.
    share_confirmed_at_step(&g.client, "5% confirmed", 1, budget).await;

    // When the operator is killed and started again.
    a.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _a = Binary::start(&kubeconfig, &prom, "replica-a", free_port());

    // Then it promotes, having run every step exactly once.
    let done = rollout_until(&g.client, "Promoted after the restart", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == RolloutPhase::Promoted)
    })
    .await;
    assert_each_step_once(&done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_within_the_lease_duration() {
    let budget = Duration::from_secs(90);
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    g.emu.write_kubeconfig(&kubeconfig).unwrap();
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();

    // Given two replicas, a leading.
    let mut a = Binary::start(&kubeconfig, &prom, "replica-a", free_port());
    eventually("replica-a leads", Duration::from_secs(20), async || {
        let h = holder(&g.client).await;
        (h.as_deref() == Some("replica-a"))
            .then_some(())
            .ok_or(format!("{h:?}"))
    })
    .await;
    let _b = Binary::start(&kubeconfig, &prom, "replica-b", free_port());
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps(), json!({})))
        .await
        .unwrap();
    rollout_until(&g.client, "1% step running", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.current_step_index == Some(0))
    })
    .await;

    // When the leader is killed (no Lease release).
    a.kill();
    let killed = Instant::now();

    // Then replica-b holds the Lease within the Lease duration (plus one retry period).
    eventually("replica-b leads", Duration::from_secs(15), async || {
        let h = holder(&g.client).await;
        (h.as_deref() == Some("replica-b"))
            .then_some(())
            .ok_or(format!("{h:?}"))
    })
    .await;
    let took = killed.elapsed();
    println!("takeover_ms={}", took.as_millis());
    assert!(
        took <= LEASE_DURATION + Duration::from_secs(3),
        "takeover took {took:?}, the Lease lasts {LEASE_DURATION:?}"
    );

    // And the standby carries the rollout on to promotion, each step once.
    let done = rollout_until(&g.client, "Promoted by the new leader", budget, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == RolloutPhase::Promoted)
    })
    .await;
    assert_each_step_once(&done);
}
