//! Benchmark (not a test, not in CI): how fast the cluster simulator brings up and replaces the
//! pods of many Deployments on the API emulator. Prints the time until every initial pod is
//! Ready, then deletes every pod at once (as a wave of evictions would) and prints the time until
//! every replacement is created and until every replacement is Ready, in pods per second.
//!
//! `cargo run [--release] -p sluice-sim --example cluster_bench -- [workloads] [replicas]`
//! (defaults 200 × 10). Workloads are spread over 20 namespaces. `BENCH_VERBOSE=1` prints the
//! counts every 5 s.

use std::time::{Duration, Instant};

use std::collections::HashSet;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use kube_emulator::Emulator;
use serde_json::json;
use sluice_sim::cluster::ClusterTasks;
use sluice_sim::cluster::pods::{is_ready, is_terminating};
use sluice_sim::{ClusterConfig, SvidCounter};

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// (Ready live pods, live pods whose uid is not in `old`), from a watch cache (a
/// list of every pod twice a second would cost the emulator more than the simulator does).
fn count(store: &Store<Pod>, old: &HashSet<String>) -> (usize, usize) {
    let pods = store.state();
    let live: Vec<&Pod> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| !is_terminating(p))
        .collect();
    let ready = live.iter().filter(|p| is_ready(p)).count();
    let fresh = live
        .iter()
        .filter(|p| !old.contains(&p.uid().unwrap_or_default()))
        .count();
    (ready, fresh)
}

/// Waits until `total` live pods not in `old` exist and all are Ready; returns the time from
/// `started` until they all existed and until they were all Ready.
async fn settle(
    store: &Store<Pod>,
    old: &HashSet<String>,
    total: usize,
    started: Instant,
) -> (Duration, Duration) {
    let mut created_at = None;
    let verbose = std::env::var_os("BENCH_VERBOSE").is_some();
    let mut said = Instant::now();
    loop {
        let (ready, fresh) = count(store, old);
        if verbose && said.elapsed() >= Duration::from_secs(5) {
            said = Instant::now();
            println!(
                "{:>6.1}s: {fresh} of {total} created, {ready} Ready",
                started.elapsed().as_secs_f64()
            );
        }
        if created_at.is_none() && fresh == total {
            created_at = Some(started.elapsed());
        }
        if fresh == total && ready == total {
            let up = started.elapsed();
            return (created_at.unwrap_or(up), up);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main]
async fn main() {
    let workloads: usize = arg(1, 200);
    let replicas: i32 = arg(2, 10);
    let total = workloads * replicas as usize;
    let namespaces = 20.min(workloads.max(1));
    let emu = Emulator::start().await;
    let client = emu.client();
    for i in 0..namespaces {
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{i:02}")}
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    for w in 0..workloads {
        let ns = format!("ns-{:02}", w % namespaces);
        let name = format!("app-{w:04}");
        let d: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": format!("{name}:1")}]}
                }
            }
        }))
        .unwrap();
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }
    println!(
        "fleet: {workloads} Deployments × {replicas} = {total} pods in {namespaces} namespaces"
    );
    let mut config = ClusterConfig::new("cluster-1");
    config.readiness_delay = Duration::from_millis(200);
    let started = Instant::now();
    let _tasks = ClusterTasks::start(client.clone(), config, SvidCounter::default());
    let (store, writer) = reflector::store();
    tokio::spawn(
        reflector::reflector(
            writer,
            watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .for_each(|_| async {}),
    );
    let (created, up) = settle(&store, &HashSet::new(), total, started).await;
    println!(
        "initial: all created in {:.1}s ({:.0} pods/s), all Ready in {:.1}s ({:.0} pods/s)",
        created.as_secs_f64(),
        total as f64 / created.as_secs_f64(),
        up.as_secs_f64(),
        total as f64 / up.as_secs_f64()
    );

    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let old: HashSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
    let started = Instant::now();
    // 32 deletes in flight, as an operator evicting at a high rate would have.
    futures::stream::iter(pods)
        .for_each_concurrent(32, |p| {
            let client = client.clone();
            async move {
                Api::<Pod>::namespaced(client, &p.namespace().unwrap())
                    .delete(&p.name_any(), &DeleteParams::default())
                    .await
                    .unwrap();
            }
        })
        .await;
    let deleted = started.elapsed();
    let (created, up) = settle(&store, &old, total, started).await;
    println!(
        "replacement: deletes took {:.1}s; all replacements created in {:.1}s ({:.0} pods/s), all Ready in {:.1}s ({:.0} pods/s)",
        deleted.as_secs_f64(),
        created.as_secs_f64(),
        total as f64 / created.as_secs_f64(),
        up.as_secs_f64(),
        total as f64 / up.as_secs_f64()
    );
}
