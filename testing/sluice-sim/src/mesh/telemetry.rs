//! The telemetry loop: on a fixed interval, read every simulated route through the Kubernetes
//! API, hold each change back for the propagation delay, split the scenario's traffic over the
//! routes in force, add the interval's requests to the cumulative counters and remote-write
//! every series to Prometheus at one timestamp. Owns the clock of the simulated mesh; never
//! writes to the Kubernetes API.

use super::route::RouteModel;
use super::scenario::{Event, Protocol, Scenario};
use super::series::{ClusterGauges, MeshCounters, drift_behind};
use super::split::{Propagation, Split, request_classes_by_path, split};
use crate::cluster::SvidCounter;
use crate::cluster::injection::injected_revision;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use prost::Message;
use sluice_runtime::projection::Projection;
use sluice_testkit::remote_write::{TimeSeries, WriteRequest};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Default write interval (production-like); tests use 1 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// One cluster the telemetry covers.
#[derive(Clone)]
pub struct MeshCluster {
    /// Cluster name (`cluster` label).
    pub name: String,
    /// Client for that cluster's API (routes and pods are read through it).
    pub client: Client,
    /// The cluster's SVID counter, when the cluster behaviour runs there.
    pub svid: Option<SvidCounter>,
}

impl std::fmt::Debug for MeshCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshCluster")
            .field("name", &self.name)
            .finish()
    }
}

/// What the loop has done so far.
#[derive(Debug, Clone, Default)]
pub struct MeshStats {
    /// Ticks completed (written or not).
    pub ticks: u64,
    /// Series in the last write.
    pub series_last_tick: usize,
    /// Samples accepted by Prometheus in total.
    pub samples_written: u64,
    /// Writes Prometheus refused or that failed in transport.
    pub write_errors: u64,
    /// The last write or read error.
    pub last_error: Option<String>,
    /// The split in force at the last tick, per service (`namespace/name`).
    pub last_split: BTreeMap<String, Split>,
    /// Time the last write took (building and sending every series).
    pub last_write: Duration,
    /// Longest write so far; above the interval, the loop falls behind.
    pub max_write: Duration,
    /// Total time spent writing.
    pub write_time: Duration,
}

struct Shared {
    started: Instant,
    events: Mutex<Vec<Event>>,
    commits: Mutex<BTreeMap<String, (String, Instant)>>,
    stats: Mutex<MeshStats>,
}

/// The running telemetry; dropping it stops the loop.
pub struct MeshTelemetry {
    handles: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MeshTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshTelemetry")
            .field("started", &self.shared.started)
            .finish()
    }
}

/// The route kind a service of `protocol` is routed by: HTTPRoute, or GRPCRoute for gRPC.
fn route_resource(protocol: Protocol) -> ApiResource {
    let (kind, plural) = match protocol {
        Protocol::Http => ("HTTPRoute", "httproutes"),
        Protocol::Grpc => ("GRPCRoute", "grpcroutes"),
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind),
        plural,
    )
}

impl MeshTelemetry {
    /// Starts writing `scenario`'s telemetry for `clusters` to the Prometheus at
    /// `prometheus_url` (its base URL; remote write goes to `/api/v1/write`) every `interval`.
    /// Services without a `cluster` belong to the first cluster.
    pub fn start(
        scenario: Scenario,
        clusters: Vec<MeshCluster>,
        prometheus_url: &str,
        interval: Duration,
    ) -> Self {
        let shared = Arc::new(Shared {
            started: Instant::now(),
            events: Mutex::new(Vec::new()),
            commits: Mutex::new(BTreeMap::new()),
            stats: Mutex::new(MeshStats::default()),
        });
        let mut handles = Vec::new();
        let mut pod_stores = BTreeMap::new();
        for c in &clusters {
            let proxies = ProxyRevisions::default();
            let stream = watcher(
                Api::<Pod>::all(c.client.clone()),
                watcher::Config::default(),
            )
            .default_backoff();
            let p = proxies.clone();
            handles.push(tokio::spawn(async move {
                futures::pin_mut!(stream);
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(event) => p.follow(&event),
                        Err(e) => {
                            tracing::debug!(error = %e, "pod watch for proxy counts interrupted")
                        }
                    }
                }
            }));
            pod_stores.insert(c.name.clone(), proxies);
        }
        let rw = RemoteWriter::new(prometheus_url);
        let s = shared.clone();
        handles.push(tokio::spawn(async move {
            run(scenario, clusters, pod_stores, rw, interval, s).await;
        }));
        Self { handles, shared }
    }

    /// When the mesh clock started (scenario time 0).
    pub fn started(&self) -> Instant {
        self.shared.started
    }

    /// Scenario time now.
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Applies `event` from now on (its `at` is replaced by the current scenario time).
    pub fn apply_now(&self, mut event: Event) {
        event.at = self.elapsed();
        self.shared.events.lock().expect("events lock").push(event);
    }

    /// Records that config `commit` was applied in `cluster` now: every proxy is behind it at
    /// first and converges as the scenario's drift settings say.
    pub fn config_applied(&self, cluster: &str, commit: &str) {
        self.shared
            .commits
            .lock()
            .expect("commits lock")
            .insert(cluster.to_string(), (commit.to_string(), Instant::now()));
    }

    /// A snapshot of the loop's statistics.
    pub fn stats(&self) -> MeshStats {
        self.shared.stats.lock().expect("stats lock").clone()
    }

    /// Stops the loop and its watchers.
    pub fn abort(&self) {
        for h in &self.handles {
            h.abort();
        }
    }
}

impl Drop for MeshTelemetry {
    fn drop(&mut self) {
        self.abort();
    }
}

/// (cluster, namespace, route name, the kind by its protocol).
type RouteKey = (String, String, String, Protocol);

/// Series per remote-write request: large enough to amortise HTTP, small enough to stay far
/// below Prometheus' request size limits.
const SERIES_PER_REQUEST: usize = 10_000;

/// Remote write 1.0 to a Prometheus (protobuf `WriteRequest`, snappy block format).
struct RemoteWriter {
    url: String,
    http: reqwest::Client,
}

impl RemoteWriter {
    fn new(prometheus_url: &str) -> Self {
        Self {
            url: format!("{}/api/v1/write", prometheus_url.trim_end_matches('/')),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .no_proxy()
                .build()
                .unwrap_or_default(),
        }
    }

    async fn write(&self, series: Vec<TimeSeries>) -> Result<(), String> {
        let mut series = series;
        while !series.is_empty() {
            let rest = series.split_off(series.len().min(SERIES_PER_REQUEST));
            let body = WriteRequest { timeseries: series }.encode_to_vec();
            let body = snap::raw::Encoder::new()
                .compress_vec(&body)
                .map_err(|e| format!("snappy encoding failed: {e}"))?;
            let response = self
                .http
                .post(&self.url)
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                .body(body)
                .send()
                .await
                .map_err(|e| format!("sending failed: {e}"))?;
            let status = response.status();
            if !status.is_success() {
                let text = response.text().await.unwrap_or_default();
                return Err(format!("Prometheus answered {status}: {}", text.trim()));
            }
            series = rest;
        }
        Ok(())
    }
}

async fn list_routes(
    client: &Client,
    protocol: Protocol,
) -> Result<BTreeMap<(String, String), RouteModel>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &route_resource(protocol));
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|obj| {
            let ns = obj.metadata.namespace.clone()?;
            let name = obj.metadata.name.clone()?;
            let value = serde_json::to_value(&obj).ok()?;
            Some(((ns, name), RouteModel::from_object(&value)))
        })
        .collect())
}

/// The injected revision of every live meshed pod of one cluster, kept from its pod watch: each
/// pod's annotation is parsed once per change, not once per tick (a tick at 40,000 pods would
/// otherwise parse them all every interval).
#[derive(Clone, Default)]
struct ProxyRevisions(Arc<Mutex<Projection<(String, String), String>>>);

impl ProxyRevisions {
    fn follow(&self, event: &watcher::Event<Pod>) {
        self.0.lock().expect("proxy revisions lock").follow(
            event,
            |p| {
                Some((
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                ))
            },
            // Terminating pods no longer count as proxies.
            |p| {
                p.metadata
                    .deletion_timestamp
                    .is_none()
                    .then(|| p.metadata.annotations.as_ref().and_then(injected_revision))
                    .flatten()
            },
        );
    }
}

fn proxies_by_revision(proxies: &ProxyRevisions) -> BTreeMap<String, u64> {
    let ix = proxies.0.lock().expect("proxy revisions lock");
    let mut out: BTreeMap<&str, u64> = BTreeMap::new();
    for rev in ix.entries().values() {
        *out.entry(rev.as_str()).or_default() += 1;
    }
    out.into_iter().map(|(r, n)| (r.to_owned(), n)).collect()
}

async fn run(
    scenario: Scenario,
    clusters: Vec<MeshCluster>,
    pod_stores: BTreeMap<String, ProxyRevisions>,
    rw: RemoteWriter,
    interval: Duration,
    shared: Arc<Shared>,
) {
    let default_cluster = clusters.first().map(|c| c.name.clone()).unwrap_or_default();
    let mut counters = MeshCounters::default();
    let mut routes: BTreeMap<RouteKey, Propagation<Option<RouteModel>>> = BTreeMap::new();
    let mut last_read_error: BTreeMap<String, String> = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let dt = now.duration_since(last).as_secs_f64();
        last = now;
        let t = now.duration_since(shared.started);
        let extra = shared.events.lock().expect("events lock").clone();
        let state = scenario.state_at(t, &extra);
        // Read the stored routes of every cluster that has routed services, of each kind its
        // services are routed by (GRPCRoutes only where a gRPC service runs).
        for c in &clusters {
            for protocol in [Protocol::Http, Protocol::Grpc] {
                let in_cluster = |s: &&super::scenario::ServiceScenario| {
                    s.route.is_some()
                        && s.protocol == protocol
                        && s.cluster.as_deref().unwrap_or(&default_cluster) == c.name
                };
                if !state.services.iter().any(|s| in_cluster(&s)) {
                    continue;
                }
                let reader = format!("{}/{}", c.name, protocol.as_str());
                match list_routes(&c.client, protocol).await {
                    Ok(listed) => {
                        last_read_error.remove(&reader);
                        for svc in state.services.iter().filter(in_cluster) {
                            let Some(route) = &svc.route else { continue };
                            let stored =
                                listed.get(&(svc.namespace.clone(), route.clone())).cloned();
                            routes
                                .entry((
                                    c.name.clone(),
                                    svc.namespace.clone(),
                                    route.clone(),
                                    protocol,
                                ))
                                .or_default()
                                .observe(now, stored);
                        }
                    }
                    Err(e) => {
                        let msg = format!(
                            "listing {}s in cluster {}: {e}",
                            route_resource(protocol).kind,
                            c.name
                        );
                        if last_read_error.get(&reader) != Some(&msg) {
                            tracing::warn!(error = %msg, "mesh telemetry keeps the routes it last read");
                            last_read_error.insert(reader, msg.clone());
                        }
                        shared.stats.lock().expect("stats lock").last_error = Some(msg);
                    }
                }
            }
        }
        let mut splits = BTreeMap::new();
        for svc in &state.services {
            let cluster = svc
                .cluster
                .clone()
                .unwrap_or_else(|| default_cluster.clone());
            let classes = request_classes_by_path(
                &svc.path_shares(),
                svc.idempotent_share,
                svc.cohort
                    .as_ref()
                    .map(|c| (c.header.as_str(), c.value.as_str(), c.share)),
            );
            let factor = |b: &str| {
                svc.versions
                    .iter()
                    .find(|v| v.backend == b)
                    .map_or(1.0, |v| v.weight_factor)
            };
            let s = match &svc.route {
                None => split(None, &classes, &svc.versions[0].backend, factor),
                Some(route) => {
                    let key = (
                        cluster.clone(),
                        svc.namespace.clone(),
                        route.clone(),
                        svc.protocol,
                    );
                    match routes
                        .get_mut(&key)
                        .and_then(|p| p.effective(now, state.propagation_delay))
                    {
                        Some(Some(model)) => {
                            split(Some(model), &classes, &svc.versions[0].backend, factor)
                        }
                        // No route in force: the gateway has nowhere to send the requests.
                        _ => Split {
                            unrouted: 1.0,
                            ..Default::default()
                        },
                    }
                }
            };
            let failure = state
                .clusters
                .iter()
                .find(|c| c.name == cluster)
                .and_then(|c| c.mesh_failure());
            counters.add_service_in(svc, &cluster, &s, dt, failure);
            splits.insert(format!("{}/{}", svc.namespace, svc.name), s);
        }
        let mut gauges = BTreeMap::new();
        let commits = shared.commits.lock().expect("commits lock").clone();
        for c in &clusters {
            let cs = state.clusters.iter().find(|x| x.name == c.name);
            let (pushes, rejects) = cs.map_or((1.0, 0.0), |x| {
                (x.xds_pushes_per_second, x.xds_rejects_per_second)
            });
            counters.add_xds(&c.name, pushes, rejects, dt);
            let by_rev = pod_stores
                .get(&c.name)
                .map(proxies_by_revision)
                .unwrap_or_default();
            let drift_cfg = cs.map(|x| x.drift.clone()).unwrap_or_default();
            let total = drift_cfg
                .proxies
                .map(u64::from)
                .unwrap_or_else(|| by_rev.values().sum());
            let drift = match commits.get(&c.name) {
                Some((commit, at)) => Some((
                    commit.clone(),
                    total,
                    drift_behind(
                        total,
                        u64::from(drift_cfg.stuck),
                        now.duration_since(*at),
                        drift_cfg.convergence,
                    ),
                )),
                None if !drift_cfg.commit.is_empty() => Some((drift_cfg.commit.clone(), total, 0)),
                None => None,
            };
            gauges.insert(
                c.name.clone(),
                ClusterGauges {
                    proxies_by_revision: by_rev,
                    drift,
                    svids: c.svid.as_ref().map(SvidCounter::by_replica),
                },
            );
        }
        let ts = jiff::Timestamp::now().as_millisecond();
        let write_started = Instant::now();
        let series = counters.series(ts, &gauges);
        let n = series.len();
        let result = rw.write(series).await;
        let took = write_started.elapsed();
        let mut stats = shared.stats.lock().expect("stats lock");
        stats.last_write = took;
        stats.max_write = stats.max_write.max(took);
        stats.write_time += took;
        stats.ticks += 1;
        stats.series_last_tick = n;
        stats.last_split = splits;
        match result {
            Ok(()) => stats.samples_written += n as u64,
            Err(e) => {
                stats.write_errors += 1;
                let msg = format!("remote write to {}: {e}", rw.url);
                if stats.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(error = %msg, "mesh telemetry write failed; counters keep growing and the next write carries them");
                }
                stats.last_error = Some(msg);
            }
        }
    }
}
