//! End to end on the API emulator with the cluster simulator and a real Prometheus: the
//! `RolloutRestart` option. Workloads whose PodDisruptionBudgets allow no eviction must surge:
//! sluice sets their pod template's `kubectl.kubernetes.io/restartedAt` (as `kubectl rollout
//! restart` does), paced by the same issuance budget as evictions (a workload costs its pods),
//! and the Deployments replace their pods themselves. The simulator's own SVID counter is checked
//! against the budget.

mod common;

use std::time::{Duration, Instant};

use common::{Harness, NsSpec, pods_of};
use k8s_openapi::api::{apps::v1::Deployment, policy::v1::PodDisruptionBudget};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;
use sluice_api::v1alpha1::RevisionUpgradePhase;
use sluice_testkit::eventually::eventually;
use sluice_upgrade_revisions::fleet::RESTARTED_AT_ANNOTATION;

const RATE: f64 = 8.0;
const DEPTH: f64 = 8.0;
const PEAK: f64 = 10.0;
/// Pods per Deployment (what one rollout restart costs).
const REPLICAS: i32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_restart_surges_workloads_no_eviction_could_move_within_the_budget() {
    let names = ["ledger", "api", "web", "auth", "risk", "fx"];
    let fleet = vec![NsSpec {
        name: "payments",
        tier: None,
        deployments: names.iter().map(|n| (*n, REPLICAS)).collect(),
    }];
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    let pods = pods_of(&fleet);
    // Given a PodDisruptionBudget per Deployment that allows no disruption at all.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), "payments");
    for n in names {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": n, "namespace": "payments"},
            "spec": {"minAvailable": REPLICAS, "selector": {"matchLabels": {"app": n}}}
        }))
        .unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    }
    eventually(
        "every PDB allowing 0 disruptions",
        Duration::from_secs(15),
        || async {
            let list = pdbs.list(&ListParams::default()).await.unwrap();
            list.items
                .iter()
                .all(|p| {
                    p.status.as_ref().is_some_and(|s| {
                        s.expected_pods == Some(REPLICAS) && s.disruptions_allowed == Some(0)
                    })
                })
                .then_some(())
        },
    )
    .await;
    h.start_operator().await;
    h.sample_issuance();
    let issued_before = h.svid.get();

    // When the upgrade restarts workloads instead of evicting pods.
    h.when_upgrade(json!({
        "restart": "RolloutRestart",
        "waves": [{"name": "all", "namespaceSelector": {}, "soak": "1s"}],
    }))
    .await;

    // Then each Deployment's restart is requested once, no sooner than the bucket allows:
    // (time since the first request, Deployment) as they appear.
    let deployments: Api<Deployment> = Api::namespaced(h.client.clone(), "payments");
    let mut requested: Vec<(Duration, String, String)> = Vec::new();
    let mut first: Option<Instant> = None;
    // The longest time between two looks: a request may be seen that late.
    let mut slack = Duration::ZERO;
    let mut looked = Instant::now();
    eventually(
        "the upgrade Complete within 60 s",
        Duration::from_secs(60),
        async || {
            slack = slack.max(looked.elapsed());
            looked = Instant::now();
            for d in deployments.list(&ListParams::default()).await.unwrap() {
                let name = d.metadata.name.clone().unwrap_or_default();
                let marker = d
                    .spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.as_ref())
                    .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
                    .cloned();
                if let Some(marker) = marker
                    && !requested.iter().any(|r| r.1 == name)
                {
                    let t0 = *first.get_or_insert_with(Instant::now);
                    requested.push((t0.elapsed(), name, marker));
                }
            }
            let o = h.upgrade().await;
            if o.status.as_ref().map(|s| s.phase) == Some(RevisionUpgradePhase::Complete) {
                Ok(())
            } else {
                Err(format!(
                    "restarts requested {requested:?}; status {:#?}",
                    o.status
                ))
            }
        },
    )
    .await;
    println!("rollout restarts requested at {requested:?}");
    assert_eq!(requested.len(), names.len(), "every Deployment restarted");
    // The bucket plans with 95% of depth 8 and rate 8; polling may see the first request up to
    // one look late, so each request is allowed that much refill more.
    println!("longest time between two looks: {slack:?}");
    for (k, (at, name, _)) in requested.iter().enumerate() {
        let cost = (k as f64 + 1.0) * f64::from(REPLICAS);
        let allowed = DEPTH + RATE * (at.as_secs_f64() + slack.as_secs_f64());
        assert!(
            cost <= allowed,
            "{name}: {cost} pods' restarts requested {at:?} after the first, more than the budget's {allowed:.1}"
        );
    }
    // Every restart carries the namespace's relabel time, so repeating it changes nothing.
    let done = h.upgrade().await;
    let relabelled = done.status.as_ref().unwrap().namespaces[0]
        .relabelled_at
        .as_ref()
        .unwrap()
        .0
        .to_string();
    assert!(
        requested.iter().all(|r| r.2 == relabelled),
        "restartedAt markers {requested:?} != relabel time {relabelled}"
    );
    assert_eq!(h.namespace_revisions("payments").await, (0, pods));
    assert_eq!(
        h.metrics
            .restarts(common::NAME, "rollout_restart", "started"),
        6
    );
    assert_eq!(
        h.metrics.restarts(common::NAME, "evict", "started"),
        0,
        "no eviction"
    );
    assert_eq!(
        h.svid.get() - issued_before,
        pods,
        "one certificate per pod: each workload restarted once"
    );
    let (ratio, at) = h.peak_issuance_ratio(RATE, DEPTH, PEAK);
    println!("peak_issuance_ratio {ratio:.3} ({at})");
    assert!(
        ratio <= 1.0,
        "issuance exceeded the budget: {ratio:.3}, {at}"
    );
    h.shutdown().await;
}
