//! End to end on the API emulator with the cluster simulator and a real Prometheus: workloads
//! without a PodDisruptionBudget keep their availability floor through an upgrade. The Eviction
//! API honours PodDisruptionBudgets only, so without sluice's own floor the budget alone would
//! evict every replica of a Deployment within a second. The floor is measured from a pod watch,
//! not from the operator's numbers: `min_available_margin`, the least over time and workloads
//! of Available − (replicas − maxUnavailable), must stay ≥ 0.

mod common;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{Harness, NsSpec, condition, deployment_with, pods_of};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    RevisionUpgradePhase,
    revision_upgrade::{conditions, reasons},
};
use sluice_sim::cluster::pods::is_ready;

/// The fleet's workloads: (name, replicas, maxUnavailable sluice must keep: the workload's own,
/// else 1; 0 for the single replica, which surges).
const WORKLOADS: [(&str, i32, i32); 4] = [
    ("web", 4, 1),    // no maxUnavailable of its own: the default 1
    ("cart", 5, 2),   // its own maxUnavailable: 2
    ("search", 3, 1), // its own maxUnavailable: 1
    ("solo", 1, 0),   // one replica: rollout restart (surge)
];

fn shaped(ns: &str, name: &str, replicas: i32) -> Value {
    let rolling = match name {
        "web" | "solo" => json!({"maxSurge": 1}),
        "cart" => json!({"maxSurge": 1, "maxUnavailable": 2}),
        _ => json!({"maxSurge": 1, "maxUnavailable": 1}),
    };
    deployment_with(ns, name, replicas, rolling)
}

/// Samples every workload's Available pods (Ready, not terminating) from a pod watch every
/// 20 ms; returns the least margin seen and where.
fn sample_margin(client: kube::Client) -> (tokio::task::JoinHandle<()>, Arc<Mutex<(i64, String)>>) {
    let least = Arc::new(Mutex::new((i64::MAX, String::new())));
    let out = least.clone();
    let handle = tokio::spawn(async move {
        let (pods, writer) = reflector::store();
        let watch = reflector::reflector(
            writer,
            watcher(Api::<Pod>::all(client), watcher::Config::default()),
        )
        .default_backoff()
        .for_each(|_| async {});
        tokio::spawn(watch);
        let _ = pods.wait_until_ready().await;
        let start = std::time::Instant::now();
        loop {
            let mut available: BTreeMap<String, i64> = BTreeMap::new();
            for p in pods.state() {
                if p.metadata.deletion_timestamp.is_none() && is_ready(&p) {
                    let app = p.labels().get("app").cloned().unwrap_or_default();
                    *available.entry(app).or_default() += 1;
                }
            }
            for (name, replicas, max_unavailable) in WORKLOADS {
                let a = available.get(name).copied().unwrap_or(0);
                let margin = a - i64::from(replicas - max_unavailable);
                let mut l = least.lock().unwrap();
                if margin < l.0 {
                    *l = (
                        margin,
                        format!(
                            "{name}: {a} Available of {replicas} at {:?}",
                            start.elapsed()
                        ),
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (handle, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_without_a_pdb_never_drop_below_their_floor() {
    let fleet = vec![NsSpec {
        name: "shop",
        tier: Some("low"),
        deployments: WORKLOADS.iter().map(|(n, r, _)| (*n, *r)).collect(),
    }];
    let Some(mut h) = Harness::given_shaped(&fleet, common::ISSUANCE_WINDOW, shaped, "[]").await
    else {
        return;
    };
    let pods = pods_of(&fleet);
    let (sampler, least) = sample_margin(h.client.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.start_operator().await;
    h.sample_issuance();

    // A budget that alone would evict all of web's pods in one second.
    h.when_upgrade(json!({
        "waves": [{"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "2s"}],
        "issuanceBudget": {"rate": 20, "depth": 20, "peakPerSecond": 20},
    }))
    .await;

    let done = h
        .until(Duration::from_secs(90), "phase Complete", |o| {
            o.status.as_ref().map(|s| s.phase) == Some(RevisionUpgradePhase::Complete)
        })
        .await;
    sampler.abort();
    let (margin, at) = least.lock().unwrap().clone();
    println!("min_available_margin {margin} ({at})");
    assert!(margin >= 0, "a workload went below its floor: {at}");
    assert_eq!(
        h.revisions().await,
        (0, pods, pods),
        "every pod Ready on 1-28"
    );
    // The single replica was restarted by its controller (a surge), not evicted.
    assert_eq!(
        h.metrics
            .restarts(common::NAME, "rollout_restart", "started"),
        1
    );
    assert_eq!(
        h.metrics.restarts(common::NAME, "evict", "started"),
        pods - 1
    );
    let (s, r, m) = condition(&done, conditions::REINJECTED_BY_OLD_REVISION).unwrap();
    assert_eq!(
        (s.as_str(), r.as_str()),
        ("False", reasons::NO_REINJECTION),
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_pinning_the_old_revision_are_reported_and_never_evicted() {
    fn pinned(ns: &str, name: &str, replicas: i32) -> Value {
        let mut d = deployment_with(
            ns,
            name,
            replicas,
            json!({"maxSurge": 1, "maxUnavailable": 1}),
        );
        if name == "legacy" {
            d["spec"]["template"]["metadata"]["labels"]["istio.io/rev"] = json!("stable");
        }
        d
    }
    let fleet = vec![NsSpec {
        name: "shop",
        tier: Some("low"),
        deployments: vec![("web", 2), ("legacy", 2)],
    }];
    let Some(mut h) = Harness::given_shaped(&fleet, common::ISSUANCE_WINDOW, pinned, "[]").await
    else {
        return;
    };
    h.start_operator().await;
    h.when_upgrade(json!({
        "waves": [{"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "2s"}],
    }))
    .await;
    let done = h
        .until(Duration::from_secs(60), "the wave passed", |o| {
            o.status.as_ref().is_some_and(|s| {
                s.waves.first().is_some_and(|w| {
                    w.state == sluice_api::v1alpha1::revision_upgrade::UpgradeWaveState::Passed
                })
            })
        })
        .await;
    let (s, r, m) = condition(&done, conditions::POD_REVISION_OVERRIDE).unwrap();
    assert_eq!(
        (s.as_str(), r.as_str()),
        ("True", reasons::POD_REVISION_OVERRIDE),
        "{m}"
    );
    assert!(m.contains("Deployment shop/legacy"), "{m}");
    assert_eq!(
        h.namespace_revisions("shop").await,
        (2, 2),
        "legacy stays on 1-27, web moved"
    );
    assert_eq!(
        h.metrics.restarts(common::NAME, "evict", "started"),
        2,
        "only web's pods"
    );
    let (s, _, m) = condition(&done, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert_eq!(s, "False", "{m}");
    h.shutdown().await;
}
