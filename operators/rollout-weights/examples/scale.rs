//! Scale benchmark of rollout-weights (not run in CI; one command away):
//!
//! ```text
//! cargo build --release -p sluice-rollout-weights --bins --examples
//! cargo run --release -p sluice-rollout-weights --example scale -- revert 1 100 1000
//! cargo run --release -p sluice-rollout-weights --example scale -- memory 10000
//! ```
//!
//! `revert N...`: N Rollouts at a 5% step on the API emulator, the controller in-process with
//! the real Prometheus, synthetic Istio request counters written by remote write (1 s
//! interval). Once every share is confirmed, the canaries' 5xx ratio triples; every Rollout
//! aborts. Prints `detect_to_revert_ms` p50/p99 (abort decision on the failing verdict → route
//! reverted, from the operator's histogram), `fault_to_revert_s` p50/p99 (from the status, 1 s
//! resolution), and the analysis ticks and queries it took.
//!
//! `memory N`: N HTTPRoutes, N canary Deployments and N Rollouts, the operator *binary* against
//! the emulator; prints the binary's resident memory (now and peak) once every Rollout has a
//! status, and the most sockets it held open at once (one per API request in flight). The
//! binary's reconcile bound is its default unless `SLUICE_MAX_CONCURRENT_RECONCILES` is set.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_emulator::Emulator;
use prometheus_client::registry::Registry;
use serde_json::json;
use sluice_api::v1alpha1::{Rollout, RolloutPhase};
use sluice_rollout_weights::{OPERATOR, metrics, reconcile};
use sluice_runtime::{
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
};
use sluice_testkit::{
    prometheus::{Prometheus, now_ms},
    remote_write::Series,
};
use tokio_util::sync::CancellationToken;

const NS: &str = "bench";
const CLUSTER: &str = "c1";
const RPS: f64 = 1000.0;
const WEIGHT: f64 = 0.05;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

async fn emulator() -> Emulator {
    let emu = Emulator::start().await;
    let crd = sluice_testkit::prereq::httproute_crd()
        .unwrap_or_else(|missing| panic!("the scale benchmark needs {missing}"));
    emu.load_manifest_file(crd)
        .expect("the released HTTPRoute CRD (.tools/crds) loads");
    emu.load_manifest_file(repo().join("crds/rollouts.sluice.dev.yaml"))
        .unwrap();
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    emu
}

/// Creates route, ready canary Deployment, canary Service (without it the canary is held at
/// weight 0) and (when `rollouts`) Rollout number `i`.
async fn objects(emu: &Emulator, client: &Client, n: usize, rollouts: bool) {
    let mut yaml = String::new();
    for i in 0..n {
        yaml.push_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: r{i}\n  namespace: {NS}\nspec:\n  parentRefs: [{{name: gw}}]\n  rules:\n  - name: main\n    backendRefs: [{{name: stable-{i}, port: 80, weight: 100}}]\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: canary-{i}\n  namespace: {NS}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: c{i}}}}}\n  template:\n    metadata: {{labels: {{app: c{i}}}}}\n    spec: {{containers: [{{name: a, image: x}}]}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: canary-{i}\n  namespace: {NS}\nspec:\n  selector: {{app: c{i}}}\n  ports: [{{port: 80}}]\n---\n"
        ));
    }
    emu.load_yaml(&yaml).expect("routes and deployments load");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let d = deployments.clone();
            async move {
                d.patch_status(
                    &format!("canary-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1}})),
                )
                .await
                .expect("deployment status");
            }
        })
        .await;
    if rollouts {
        create_rollouts(client, n).await;
    }
}

fn rollout(i: usize) -> Rollout {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": format!("r{i}"), "namespace": NS},
        "spec": {
            "routeRef": {"name": format!("r{i}")},
            "stableService": {"name": format!("stable-{i}")},
            "canaryService": {"name": format!("canary-{i}")},
            "canaryWorkload": {"name": format!("canary-{i}")},
            "analysisInterval": "1s",
            "appliedShareDeadline": "10m",
            "gates": [
                {"name": "applied-share", "builtin": "AppliedShare", "window": "4s"},
                {"name": "error-ratio", "builtin": "ErrorRatioVsStable", "window": "4s"}
            ],
            "steps": [{"setWeight": {"weight": 5, "duration": "10m"}}, {"promote": {}}]
        }
    }))
    .unwrap()
}

async fn create_rollouts(client: &Client, n: usize) {
    let api: Api<Rollout> = Api::namespaced(client.clone(), NS);
    stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &rollout(i))
                    .await
                    .expect("rollout created");
            }
        })
        .await;
}

/// Writes the synthetic counters every second: per service, stable and canary requests at a
/// 95/5 split, 2% 5xx; the canary's 5xx ratio triples once `fault` is set.
fn telemetry(url: &str, n: usize, fault: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let client = sluice_testkit::remote_write::RemoteWriteClient::new(url);
    tokio::spawn(async move {
        let mut totals: HashMap<(usize, bool, bool), f64> = HashMap::new();
        loop {
            let ts = now_ms();
            let bad = fault.load(Ordering::Relaxed);
            let mut series = Vec::with_capacity(n * 4);
            for i in 0..n {
                for canary in [false, true] {
                    let share = if canary { WEIGHT } else { 1.0 - WEIGHT };
                    let err = if canary && bad { 0.06 } else { 0.02 };
                    for error in [false, true] {
                        let add = RPS * share * if error { err } else { 1.0 - err };
                        let total = totals.entry((i, canary, error)).or_insert(0.0);
                        *total += add;
                        let service = if canary {
                            format!("canary-{i}")
                        } else {
                            format!("stable-{i}")
                        };
                        series.push(
                            Series::new("istio_requests_total")
                                .label("reporter", "source")
                                .label("cluster", CLUSTER)
                                .label("destination_service_namespace", NS)
                                .label("destination_service_name", service)
                                .label("response_code", if error { "500" } else { "200" })
                                .label("response_flags", "-")
                                .sample(ts, *total),
                        );
                    }
                }
            }
            if let Err(e) = client.write(&series).await {
                eprintln!("remote write failed: {e}");
            }
            let spent = (now_ms() - ts).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(1000u64.saturating_sub(spent))).await;
        }
    })
}

/// Quantile from a Prometheus histogram in OpenMetrics text (linear within a bucket, like
/// histogram_quantile).
fn quantile(metrics: &str, name: &str, q: f64) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let v: f64 = l.split_whitespace().nth(1)?.parse().ok()?;
            Some((le, v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (le, c) in buckets {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let f = if c > prev.1 {
                (rank - prev.1) / (c - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * f);
        }
        prev = (le, c);
    }
    None
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}_total ")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn revert(n: usize) {
    let prom = Prometheus::start().await.expect("prometheus binary");
    let emu = emulator().await;
    let client = emu.client();
    objects(&emu, &client, n, false).await;
    let fault = Arc::new(AtomicBool::new(false));
    let writer = telemetry(prom.url(), n, fault.clone());

    let mut registry = Registry::default();
    let m = metrics::register(&mut registry);
    let ctx = reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR))
        .with_analysis(prom.url(), CLUSTER, m)
        .unwrap();
    let (hooks, _) = Hooks::standalone();
    let shutdown = CancellationToken::new();
    let ctl = tokio::spawn(drive(
        Api::<Rollout>::all(client.clone()),
        watcher::Config::default(),
        Arc::new(ctx),
        reconcile::reconcile,
        Leadership::always(),
        shutdown.clone(),
        hooks,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    create_rollouts(&client, n).await;

    let api: Api<Rollout> = Api::namespaced(client.clone(), NS);
    let started = Instant::now();
    loop {
        let list = api.list(&Default::default()).await.unwrap();
        let confirmed = list
            .items
            .iter()
            .filter(|r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.history.last())
                    .is_some_and(|h| h.share_confirmed_at.is_some())
            })
            .count();
        if confirmed == n {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "only {confirmed}/{n} shares confirmed"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let before = registry_text(&registry);
    let (ticks0, queries0) = (
        gauge(&before, "sluice_rollout_analysis_ticks"),
        gauge(&before, "sluice_rollout_analysis_queries"),
    );
    let analysis_started = Instant::now();

    let fault_at = k8s_openapi::jiff::Timestamp::now();
    fault.store(true, Ordering::Relaxed);
    let mut reverted: Vec<f64>;
    loop {
        let list = api.list(&Default::default()).await.unwrap();
        reverted = list
            .items
            .iter()
            .filter_map(|r| {
                r.status
                    .as_ref()?
                    .abort
                    .as_ref()?
                    .route_reverted_at
                    .as_ref()
            })
            .map(|t| t.0.duration_since(fault_at).as_secs_f64())
            .collect();
        if reverted.len() == n {
            break;
        }
        let aborted = list
            .items
            .iter()
            .filter(|r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.phase == RolloutPhase::Aborted)
            })
            .count();
        assert!(
            analysis_started.elapsed() < Duration::from_secs(300),
            "only {aborted}/{n} aborted, {} reverted",
            reverted.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = analysis_started.elapsed();
    let text = registry_text(&registry);
    reverted.sort_by(f64::total_cmp);
    let ticks = gauge(&text, "sluice_rollout_analysis_ticks") - ticks0;
    let queries = gauge(&text, "sluice_rollout_analysis_queries") - queries0;
    println!(
        "rollouts={n} detect_to_revert_ms p50={:.0} p99={:.0} fault_to_revert_s p50={:.0} p99={:.0} ticks={ticks} queries={queries} queries_per_tick={:.2} ticks_per_second={:.2} last_tick_rollouts={}",
        quantile(&text, "sluice_rollout_detect_to_revert_seconds", 0.5).unwrap_or(f64::NAN)
            * 1000.0,
        quantile(&text, "sluice_rollout_detect_to_revert_seconds", 0.99).unwrap_or(f64::NAN)
            * 1000.0,
        pct(&reverted, 0.5),
        pct(&reverted, 0.99),
        queries / ticks.max(1.0),
        ticks / elapsed.as_secs_f64(),
        gauge(&text, "sluice_rollout_analysis_rollouts_per_tick"),
    );
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), ctl).await;
    writer.abort();
}

fn registry_text(registry: &Registry) -> String {
    sluice_runtime::metrics::encode(registry)
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Open sockets of process `pid` (its API connections and its listener).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

async fn memory(n: usize) {
    let emu = emulator().await;
    let client = emu.client();
    let t = Instant::now();
    objects(&emu, &client, n, true).await;
    println!(
        "created {n} routes, deployments and rollouts in {:?}",
        t.elapsed()
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    emu.write_kubeconfig(&kubeconfig).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The binary next to this example's directory (build it first: `--bins --examples`).
    let binary = std::env::var("SLUICE_ROLLOUT_WEIGHTS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            std::env::current_exe()
                .unwrap()
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("sluice-rollout-weights")
        });
    let mut child = std::process::Command::new(&binary)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--lease-namespace", "default", "--leader-election-disabled"])
        .args([
            "--prometheus-url",
            "http://127.0.0.1:9",
            "--cluster",
            CLUSTER,
        ])
        .args(["--log-format", "text", "--log-level", "error"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .spawn()
        .expect("binary starts");
    let pid = child.id();
    let api: Api<Rollout> = Api::namespaced(client.clone(), NS);
    let started = Instant::now();
    let mut peak = 0;
    let mut peak_sockets = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        peak = peak.max(rss_kib(pid).unwrap_or(0));
        peak_sockets = peak_sockets.max(sockets(pid));
        let list = api.list(&Default::default()).await.unwrap();
        let written = list
            .items
            .iter()
            .filter(|r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.desired_weight.is_some())
            })
            .count();
        if written == n || started.elapsed() > Duration::from_secs(300) {
            println!(
                "{written}/{n} Rollouts own their route after {:?}",
                started.elapsed()
            );
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let now = rss_kib(pid).unwrap_or(0);
    peak = peak.max(now);
    println!(
        "rollouts={n} httproutes={n} max_concurrent_reconciles={} resident_memory_mib={:.1} peak_mib={:.1} peak_sockets={peak_sockets}",
        std::env::var("SLUICE_MAX_CONCURRENT_RECONCILES").unwrap_or_else(|_| "default".into()),
        now as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, sizes) = match args.split_first() {
        Some((m, rest)) if !rest.is_empty() => (
            m.clone(),
            rest.iter().map(|s| s.parse().expect("a number")).collect(),
        ),
        Some((m, _)) if m == "memory" => (m.clone(), vec![10_000]),
        _ => ("revert".to_owned(), vec![1, 100, 1000]),
    };
    for n in sizes {
        match mode.as_str() {
            "revert" => revert(n).await,
            "memory" => memory(n).await,
            other => panic!("unknown mode {other}: use revert or memory"),
        }
    }
}
