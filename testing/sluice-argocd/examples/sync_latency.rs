//! Benchmark (not a test): how long the simulated Argo CD takes from a git push to the
//! Application reporting Synced at the new commit, with automated sync, on kube-emulator.
//!
//! `cargo run --release -p sluice-argocd --example sync_latency -- [RUNS] [OBJECTS] [RESYNC_MS]`
//! (defaults 10 runs, 20 ConfigMaps, 1000 ms resync). Needs git and the released CRDs
//! (`bash scripts/install-tools.sh`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube_emulator::{ADMIN_TOKEN, Emulator, Options};
use serde_json::{Value, json};
use sluice_argocd::{ArgoCd, ArgoCdOptions, cluster_secret};
use sluice_testkit::git::GitRepo;

fn manifests(objects: usize, value: usize) -> Vec<(String, String)> {
    (0..objects)
        .map(|i| {
            (
                format!("mesh/cm-{i}.yaml"),
                format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata:\n  value: \"{value}\"\n"),
            )
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let runs = args.first().copied().unwrap_or(10);
    let objects = args.get(1).copied().unwrap_or(20);
    let resync = Duration::from_millis(args.get(2).copied().unwrap_or(1000) as u64);
    let crds = sluice_testkit::prereq::upstream_dir(sluice_testkit::prereq::Upstream::ArgoCd)
        .unwrap_or_else(|missing| panic!("the benchmark needs {missing}"));
    let mgmt = Emulator::start_with(Options {
        manifests: vec![
            crds.join("application-crd.yaml"),
            crds.join("applicationset-crd.yaml"),
        ],
        ..Default::default()
    })
    .await
    .expect("management emulator with the released Argo CD CRDs");
    mgmt.load_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: argocd\n")
        .unwrap();
    let workload = Emulator::start().await;
    workload
        .load_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: mesh\n")
        .unwrap();
    Api::<Secret>::namespaced(mgmt.client(), "argocd")
        .create(
            &PostParams::default(),
            &cluster_secret(
                "east-1",
                &workload.base_url(),
                ADMIN_TOKEN,
                &BTreeMap::new(),
            ),
        )
        .await
        .unwrap();
    let argocd = ArgoCd::start(
        mgmt.client(),
        ArgoCdOptions {
            resync,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let repo = GitRepo::new().unwrap();
    let files = manifests(objects, 0);
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    repo.commit_files(&refs, "v0").unwrap();
    let apps: Api<DynamicObject> = Api::namespaced_with(
        mgmt.client(),
        "argocd",
        &sluice_argocd::app_controller::application_resource(),
    );
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "bench", "namespace": "argocd"},
        "spec": {"project": "default",
                 "source": {"repoURL": repo.url(), "path": "mesh", "targetRevision": "main"},
                 "destination": {"name": "east-1", "namespace": "mesh"},
                 "syncPolicy": {"automated": {}, "syncOptions": ["ServerSideApply=true"]}}
    }))
    .unwrap();
    let wait_synced = async |sha: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let a = serde_json::to_value(apps.get("bench").await.unwrap()).unwrap();
            if a.pointer("/status/sync/status").and_then(Value::as_str) == Some("Synced")
                && a.pointer("/status/sync/revision").and_then(Value::as_str) == Some(sha)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not Synced at {sha} within 120 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let first = Instant::now();
    apps.create(&PostParams::default(), &app).await.unwrap();
    wait_synced(&repo.head().unwrap()).await;
    let initial = first.elapsed();
    let mut latencies = Vec::new();
    for run in 1..=runs {
        let files = manifests(objects, run);
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        let start = Instant::now();
        let sha = repo.commit_files(&refs, &format!("v{run}")).unwrap();
        wait_synced(&sha).await;
        latencies.push(start.elapsed());
    }
    latencies.sort();
    println!(
        "objects={objects} resync_ms={} initial_sync_ms={} push_to_synced_ms: median={} p90={} max={} (runs={runs})",
        resync.as_millis(),
        initial.as_millis(),
        percentile(&latencies, 0.5).as_millis(),
        percentile(&latencies, 0.9).as_millis(),
        latencies.last().unwrap().as_millis()
    );
    argocd.stop().await;
    workload.shutdown().await;
    mgmt.shutdown().await;
}
