//! Scale benchmark of rollout-weights (not run in CI; one command away):
//!
//! ```text
//! cargo build --release -p sluice-rollout-weights --bins --examples
//! cargo run --release -p sluice-rollout-weights --example scale -- revert 1 100 1000
//! cargo run --release -p sluice-rollout-weights --example scale -- revert 1000 --interval 30s --control-plane real
//! cargo run --release -p sluice-rollout-weights --example scale -- memory 10000
//! ```
//!
//! `revert N... [--interval 30s] [--control-plane emulator|real] [--status-echoes reconcile|ignore]`: N Rollouts at a 5% step on
//! the API emulator (in this process) or a real kube-apiserver and etcd, the controller
//! in-process as the binary runs it (triggers, GateTemplate cache) with the real Prometheus,
//! synthetic Istio request counters written by remote write every second. The Rollouts'
//! analysis interval is `--interval` (default 1s; windows 4 intervals). Once every share is
//! confirmed, the canaries' 5xx ratio triples; every Rollout aborts. Prints
//! `detect_to_revert_ms` p50/p99 (abort decision on the failing verdict → route reverted, from
//! the operator's histogram), `fault_to_revert_s` p50/p99 (from the status, 1 s resolution),
//! `reconcile_ms` p50/p99 (every reconcile of the run, from the runtime's histogram),
//! the analysis ticks and queries it took and the queries per analysis interval, and where the
//! time went: seconds until every share was confirmed, CPU seconds of this process (operator,
//! emulator and telemetry writer), of Prometheus and of the real API server and etcd, and the remote writes' durations.
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
        atomic::{AtomicBool, AtomicU64, Ordering},
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
use sluice_rollout_weights::{OPERATOR, metrics, reconcile, triggers};
use sluice_runtime::{
    changes::PrimaryChanges,
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive_with},
};
use sluice_testkit::{
    control_plane::ControlPlane,
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
    emu.load_yaml(&definitions()).expect("the CRDs load");
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    emu
}

/// The released HTTPRoute CRD and sluice's Rollout and GateTemplate CRDs, as one YAML stream.
fn definitions() -> String {
    let crd = sluice_testkit::prereq::httproute_crd()
        .unwrap_or_else(|missing| panic!("the scale benchmark needs {missing}"));
    let read =
        |p: PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    [
        read(crd),
        read(repo().join("crds/rollouts.sluice.dev.yaml")),
        read(repo().join("crds/gatetemplates.sluice.dev.yaml")),
    ]
    .join("\n---\n")
}

/// Where the benchmark's objects live: the embedded API emulator (in this process, sharing its
/// two cores with the controller), or a real kube-apiserver and etcd (`--control-plane real`,
/// separate processes, built by scripts/install-tools.sh).
enum World {
    Emulator(Emulator),
    Real(Box<ControlPlane>),
}

impl World {
    async fn start(real: bool) -> Self {
        if !real {
            return World::Emulator(emulator().await);
        }
        let cp = ControlPlane::start()
            .await
            .unwrap_or_else(|e| panic!("the real control plane did not start: {e}"));
        cp.install_crds(&definitions())
            .await
            .expect("the CRDs install on the real API server");
        cp.apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
        ))
        .await
        .expect("namespace");
        World::Real(Box::new(cp))
    }

    async fn client(&self) -> Client {
        match self {
            World::Emulator(emu) => emu.client(),
            World::Real(cp) => cp.client().await.expect("client of the real API server"),
        }
    }

    async fn load_yaml(&self, yaml: &str) {
        match self {
            World::Emulator(emu) => {
                emu.load_yaml(yaml).expect("objects load");
            }
            World::Real(cp) => {
                // One request per object: applied 32 at a time.
                let docs: Vec<String> = yaml
                    .split("\n---\n")
                    .filter(|d| !d.trim().is_empty())
                    .map(str::to_owned)
                    .collect();
                stream::iter(docs)
                    .for_each_concurrent(32, |d| async move {
                        cp.apply_yaml(&d).await.expect("object applies");
                    })
                    .await;
            }
        }
    }

    /// The API server's process, for its CPU seconds (none for the in-process emulator).
    fn api_pids(&self) -> Vec<u32> {
        match self {
            World::Emulator(_) => Vec::new(),
            World::Real(cp) => cp.pids(),
        }
    }
}

/// Creates route, ready canary Deployment, canary Service (without it the canary is held at
/// weight 0) and (when `rollouts`) Rollout number `i`.
async fn objects(world: &World, client: &Client, n: usize, rollouts: bool) {
    let mut yaml = String::new();
    for i in 0..n {
        yaml.push_str(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: r{i}\n  namespace: {NS}\nspec:\n  parentRefs: [{{name: gw}}]\n  rules:\n  - name: main\n    backendRefs: [{{name: stable-{i}, port: 80, weight: 100}}]\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: canary-{i}\n  namespace: {NS}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: c{i}}}}}\n  template:\n    metadata: {{labels: {{app: c{i}}}}}\n    spec: {{containers: [{{name: a, image: x}}]}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: canary-{i}\n  namespace: {NS}\nspec:\n  selector: {{app: c{i}}}\n  ports: [{{port: 80}}]\n---\n"
        ));
    }
    world.load_yaml(&yaml).await;
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
        create_rollouts(client, n, Duration::from_secs(1)).await;
    }
}

fn rollout(i: usize, interval: Duration) -> Rollout {
    let every = format!("{}s", interval.as_secs().max(1));
    let window = format!("{}s", 4 * interval.as_secs().max(1));
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": format!("r{i}"), "namespace": NS},
        "spec": {
            "routeRef": {"name": format!("r{i}")},
            "stableService": {"name": format!("stable-{i}")},
            "canaryService": {"name": format!("canary-{i}")},
            "canaryWorkload": {"name": format!("canary-{i}")},
            "analysisInterval": every,
            "appliedShareDeadline": "60m",
            "gates": [
                {"name": "applied-share", "builtin": "AppliedShare", "window": window},
                {"name": "error-ratio", "builtin": "ErrorRatioVsStable", "window": window}
            ],
            "steps": [{"setWeight": {"weight": 5, "duration": "60m"}}, {"promote": {}}]
        }
    }))
    .unwrap()
}

async fn create_rollouts(client: &Client, n: usize, interval: Duration) {
    let api: Api<Rollout> = Api::namespaced(client.clone(), NS);
    stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &rollout(i, interval))
                    .await
                    .expect("rollout created");
            }
        })
        .await;
}

/// Durations of the remote writes (ms): count, sum, max.
#[derive(Default)]
struct Writes {
    count: AtomicU64,
    sum_ms: AtomicU64,
    max_ms: AtomicU64,
}

/// Writes the synthetic counters every second: per service, stable and canary requests at a
/// 95/5 split, 2% 5xx; the canary's 5xx ratio triples once `fault` is set.
fn telemetry(
    url: &str,
    n: usize,
    fault: Arc<AtomicBool>,
    writes: Arc<Writes>,
) -> tokio::task::JoinHandle<()> {
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
            let sent = Instant::now();
            if let Err(e) = client.write(&series).await {
                eprintln!("remote write failed: {e}");
            }
            let took = sent.elapsed().as_millis() as u64;
            writes.count.fetch_add(1, Ordering::Relaxed);
            writes.sum_ms.fetch_add(took, Ordering::Relaxed);
            writes.max_ms.fetch_max(took, Ordering::Relaxed);
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

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the command (which may hold spaces): utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(11) + ticks(12)) / 100.0
}

async fn revert(n: usize, interval: Duration, real: bool, changes: PrimaryChanges) {
    let prom = Prometheus::start().await.expect("prometheus binary");
    let prom_pid = prom.pid().to_string();
    let world = World::start(real).await;
    let client = world.client().await;
    objects(&world, &client, n, false).await;
    // CPU seconds of the real API server and its etcd (0 with the in-process emulator).
    let api_cpu = || {
        world
            .api_pids()
            .iter()
            .map(|p| cpu_seconds(&p.to_string()))
            .sum::<f64>()
    };
    let fault = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Writes::default());
    let writer = telemetry(prom.url(), n, fault.clone(), writes.clone());
    let budget = Duration::from_secs(300).max(interval * 12);

    let mut registry = Registry::default();
    let m = metrics::register(&mut registry);
    let ctx = reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR))
        .with_analysis(prom.url(), CLUSTER, m)
        .unwrap()
        .with_gate_template_cache(client.clone());
    // As the binary runs it: the triggers, and the store shared with the reconciles.
    let extend = triggers::sharing_store(
        ctx.rollouts.clone(),
        triggers::with_triggers(
            triggers::Watched::new(&client, None),
            watcher::Config::default(),
        ),
    );
    let (hooks, runtime_registry) = Hooks::standalone();
    let hooks = hooks.with_primary_changes(changes);
    let shutdown = CancellationToken::new();
    let ctl = tokio::spawn(drive_with(
        Api::<Rollout>::all(client.clone()),
        watcher::Config::default(),
        Arc::new(ctx),
        reconcile::reconcile,
        Leadership::always(),
        shutdown.clone(),
        hooks,
        extend,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cpu0 = (cpu_seconds("self"), cpu_seconds(&prom_pid));
    create_rollouts(&client, n, interval).await;

    let api: Api<Rollout> = Api::namespaced(client.clone(), NS);
    let started = Instant::now();
    let (mut next_report, mut last_report, mut last_cpu) =
        (Duration::from_secs(15), Instant::now(), cpu0);
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
        if started.elapsed() >= next_report {
            next_report += Duration::from_secs(15);
            let written = list
                .items
                .iter()
                .filter(|r| {
                    r.status
                        .as_ref()
                        .is_some_and(|s| s.desired_weight == Some(5))
                })
                .count();
            let mut phases: std::collections::BTreeMap<String, usize> = Default::default();
            for r in &list.items {
                let s = r.status.clone().unwrap_or_default();
                let what = match &s.abort {
                    Some(a) => format!("Aborted:{:?}", a.reason),
                    None => format!("{:?}", s.phase),
                };
                *phases.entry(what).or_default() += 1;
            }
            println!("  phases {phases:?}");
            // Reconciles run and failed, by category (a failure backs off per object).
            let rt = registry_text(&runtime_registry);
            let lines: Vec<&str> = rt
                .lines()
                .filter(|l| {
                    l.starts_with("sluice_reconciles_total")
                        || l.starts_with("sluice_reconcile_errors_total")
                })
                .collect();
            println!("  runtime {lines:?}");
            // One Rollout still waiting for its share, as its status says.
            if let Some(r) = list.items.iter().find(|r| {
                r.status.as_ref().is_some_and(|s| {
                    s.desired_weight == Some(5)
                        && s.history
                            .last()
                            .is_some_and(|h| h.share_confirmed_at.is_none())
                })
            }) {
                let s = r.status.clone().unwrap_or_default();
                let gates: Vec<String> = s
                    .gates
                    .iter()
                    .map(|g| {
                        format!(
                            "{} {:?} {:?} value={:?} samples={:?} at={} {}",
                            g.gate,
                            g.verdict,
                            g.reason,
                            g.value,
                            g.samples,
                            g.evaluated_at.0,
                            g.message.clone().unwrap_or_default()
                        )
                    })
                    .collect();
                println!(
                    "  waiting: {} share={:?} observed_at={:?} written_at={:?} gates={gates:?}",
                    r.metadata.name.clone().unwrap_or_default(),
                    s.applied_share,
                    s.applied_share_observed_at.map(|t| t.0),
                    s.owned_route
                        .as_ref()
                        .and_then(|o| o.weight_written_at.clone())
                        .map(|t| t.0),
                );
            }
            let text = registry_text(&registry);
            let cpu = (cpu_seconds("self"), cpu_seconds(&prom_pid));
            let secs = last_report.elapsed().as_secs_f64();
            println!(
                "  t={:.0}s weight_written={written} share_confirmed={confirmed} ticks={} \
                 queries={} rollouts_last_tick={} failed_queries={} \
                 cpu%(this process, prometheus)=({:.0}, {:.0})",
                started.elapsed().as_secs_f64(),
                gauge(&text, "sluice_rollout_analysis_ticks"),
                gauge(&text, "sluice_rollout_analysis_queries"),
                gauge(&text, "sluice_rollout_analysis_rollouts_per_tick"),
                gauge(&text, "sluice_rollout_analysis_failed_queries"),
                100.0 * (cpu.0 - last_cpu.0) / secs,
                100.0 * (cpu.1 - last_cpu.1) / secs,
            );
            last_cpu = cpu;
            last_report = Instant::now();
        }
        assert!(
            started.elapsed() < budget,
            "only {confirmed}/{n} shares confirmed after {budget:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let confirmed_after = started.elapsed();
    // Steady state: three intervals with every share confirmed and nothing failing.
    let steady0 = registry_text(&registry);
    tokio::time::sleep(interval * 3).await;
    let steady = registry_text(&registry);
    let steady_per_interval = |name: &str| (gauge(&steady, name) - gauge(&steady0, name)) / 3.0;
    println!(
        "rollouts={n} interval_s={} steady: queries_per_interval={:.2} ticks_per_interval={:.2}",
        interval.as_secs(),
        steady_per_interval("sluice_rollout_analysis_queries"),
        steady_per_interval("sluice_rollout_analysis_ticks"),
    );
    let cpu1 = (cpu_seconds("self"), cpu_seconds(&prom_pid));
    let api_cpu1 = api_cpu();
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
            analysis_started.elapsed() < budget,
            "only {aborted}/{n} aborted, {} reverted",
            reverted.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = analysis_started.elapsed();
    let cpu2 = (cpu_seconds("self"), cpu_seconds(&prom_pid));
    let api_cpu2 = api_cpu();
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
    // Every reconcile of the run, as the runtime measures it (an analysing one includes the
    // wait for its tick's queries).
    let rt = registry_text(&runtime_registry);
    println!(
        "rollouts={n} reconcile_ms p50={:.0} p99={:.0} reconciles={}",
        quantile(&rt, "sluice_reconcile_duration_seconds", 0.5).unwrap_or(f64::NAN) * 1000.0,
        quantile(&rt, "sluice_reconcile_duration_seconds", 0.99).unwrap_or(f64::NAN) * 1000.0,
        rt.lines()
            .find(|l| l.starts_with("sluice_reconcile_duration_seconds_count"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("0"),
    );
    // What started them: the events of the Rollout watch by what they changed (the rest are
    // requeues and the triggers of other kinds).
    println!("rollouts={n} status_echoes={changes:?} watch_changes:");
    for l in rt
        .lines()
        .filter(|l| l.starts_with("sluice_watch_changes_total"))
    {
        println!("  {l}");
    }
    let count = writes.count.load(Ordering::Relaxed).max(1);
    println!(
        "rollouts={n} interval_s={} queries_per_interval={:.2} confirmed_all_after_s={:.1} \
         cpu_s_until_confirmed(this process, prometheus)=({:.1}, {:.1}) \
         cpu_s_fault_to_all_reverted(this process, prometheus, api server and etcd)=({:.1}, {:.1}, {:.1}) \
         over {:.1} s world={} remote_write_ms mean={:.0} max={} writes={count}",
        interval.as_secs(),
        queries / (elapsed.as_secs_f64() / interval.as_secs_f64()).max(1.0),
        confirmed_after.as_secs_f64(),
        cpu1.0 - cpu0.0,
        cpu1.1 - cpu0.1,
        cpu2.0 - cpu1.0,
        cpu2.1 - cpu1.1,
        api_cpu2 - api_cpu1,
        elapsed.as_secs_f64(),
        if real { "real" } else { "emulator" },
        writes.sum_ms.load(Ordering::Relaxed) as f64 / count as f64,
        writes.max_ms.load(Ordering::Relaxed),
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
    let world = World::Emulator(emulator().await);
    let client = world.client().await;
    let t = Instant::now();
    objects(&world, &client, n, true).await;
    println!(
        "created {n} routes, deployments and rollouts in {:?}",
        t.elapsed()
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let World::Emulator(emu) = &world else {
        unreachable!("memory runs on the emulator")
    };
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
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut interval = Duration::from_secs(1);
    if let Some(at) = args.iter().position(|a| a == "--interval") {
        let value = args
            .get(at + 1)
            .expect("--interval needs a value, e.g. 30s");
        let secs: u64 = value
            .trim_end_matches('s')
            .parse()
            .expect("--interval in whole seconds, e.g. 30s");
        interval = Duration::from_secs(secs.max(1));
        args.drain(at..at + 2);
    }
    let mut real = false;
    if let Some(at) = args.iter().position(|a| a == "--control-plane") {
        real = match args.get(at + 1).map(String::as_str) {
            Some("real") => true,
            Some("emulator") => false,
            other => panic!("--control-plane emulator|real, not {other:?}"),
        };
        args.drain(at..at + 2);
    }
    let mut changes = sluice_rollout_weights::PRIMARY_CHANGES;
    if let Some(at) = args.iter().position(|a| a == "--status-echoes") {
        changes = match args.get(at + 1).map(String::as_str) {
            Some("reconcile") => PrimaryChanges::Every,
            Some("ignore") => PrimaryChanges::IgnoreStatusOnly,
            other => panic!("--status-echoes reconcile|ignore, not {other:?}"),
        };
        args.drain(at..at + 2);
    }
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
            "revert" => revert(n, interval, real, changes).await,
            "memory" => memory(n).await,
            other => panic!("unknown mode {other}: use revert or memory"),
        }
    }
}
