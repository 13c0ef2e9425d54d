//! What every reconcile shares: the clients, the watch caches, the metrics source, and what one
//! RevisionUpgrade's reconciles remember between ticks (forgotten when it is deleted). Owns
//! building the metrics source from the operator's flags; never decides or writes.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use sluice_analysis::{Engine, EngineOptions, PrometheusSource};
use sluice_api::v1alpha1::RevisionUpgrade;
use sluice_runtime::{events::EventRecorder, leader::Leadership};
use tokio::task::JoinHandle;

use crate::{cache::FleetCache, decide::GateReport, metrics::UpgradeMetrics};

/// Where the operator reads metrics, and the label that scopes them to this cluster.
pub struct Metrics {
    /// The gate engine over the metrics source.
    pub engine: Engine<PrometheusSource>,
    /// The `cluster` label value of this cluster's series.
    pub cluster: String,
    /// Window background issuance is measured over.
    pub issuance_window: Duration,
    /// The issuance counters' series selector, `{{cluster}}` replaced by [`Metrics::cluster`]
    /// (default [`crate::issuance::DEFAULT_ISSUANCE_SERIES`]).
    pub issuance_series: String,
}

impl Metrics {
    /// Reads issuance from `series` (a selector; `{{cluster}}` is this cluster's label value).
    pub fn with_issuance_series(mut self, series: impl Into<String>) -> Self {
        self.issuance_series = series.into();
        self
    }
}

/// What one RevisionUpgrade's reconciles remember between ticks (lost on restart, which only
/// makes the operator more careful: its own restarts then count as background for a window).
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// Restarts started: (time in ms, count).
    pub(crate) own: VecDeque<(i64, u32)>,
    /// Granted restarts that did not happen (refused, gone, failed, cancelled), to refund.
    pub(crate) unused: u32,
    /// Pods whose eviction a PodDisruptionBudget refused since the last grant.
    pub(crate) blocked: Vec<String>,
    /// Latest gate report and when it was made.
    pub(crate) gates: Option<(Timestamp, GateReport)>,
    /// Pods (`namespace/name`) whose restart is scheduled or was sent, with when (ms): never
    /// candidates while the fleet reading still shows them.
    pub(crate) in_progress: HashMap<String, i64>,
    /// When the next grant's first restart may start (the running schedule's next free slot).
    pub(crate) next_free: Option<tokio::time::Instant>,
    /// When the previous tick read the fleet (the next horizon covers the time between ticks).
    pub(crate) last_tick: Option<tokio::time::Instant>,
    /// Bumped to cancel the restarts scheduled but not yet started (pause, over budget).
    pub(crate) epoch: u64,
    /// The schedules running in the background.
    pub(crate) pacers: Vec<JoinHandle<()>>,
}

pub(crate) type Memories = Arc<Mutex<HashMap<String, Memory>>>;

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// A client without automatic retries, for evictions (a refused eviction is answered 429).
    pub evict_client: Client,
    /// The operator's Event recorder.
    pub recorder: EventRecorder,
    /// The clock; tests pin it.
    pub clock: fn() -> Timestamp,
    /// Whether free-form PromQL gates are allowed (`--allow-free-form-promql`).
    pub allow_free_form_promql: bool,
    /// The fleet's watch caches (`None`: validate only).
    pub fleet: Option<FleetCache>,
    /// The metrics source (`None`: no issuance reading, so no restarts, and no gates).
    pub metrics_source: Option<Metrics>,
    /// The operator's metrics.
    pub metrics: UpgradeMetrics,
    /// Webhook notifications of completion, abort and hold (`main` shares the runtime's).
    pub notifier: sluice_runtime::notify::Notifier,
    /// Whether this replica leads: checked right before every relabel, eviction and rollout
    /// restart; the background schedules stop when it is lost.
    pub leadership: Leadership,
    pub(crate) memory: Memories,
}

impl Drop for Context {
    /// Stops the schedules still running: restarts are started only by a live operator.
    fn drop(&mut self) {
        if let Ok(memory) = self.memory.lock() {
            for m in memory.values() {
                for p in &m.pacers {
                    p.abort();
                }
            }
        }
    }
}

sluice_runtime::opaque_debug!(Context);

impl Context {
    /// A context reading the system clock, validating only (no fleet cache, no metrics source).
    pub fn new(client: Client, recorder: EventRecorder) -> Self {
        Self {
            evict_client: client.clone(),
            client,
            recorder,
            clock: Timestamp::now,
            allow_free_form_promql: false,
            fleet: None,
            metrics_source: None,
            metrics: UpgradeMetrics::default(),
            notifier: sluice_runtime::notify::Notifier::disabled(),
            leadership: Leadership::always(),
            memory: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A context that moves namespaces: fleet caches, a metrics source, an eviction client
    /// without automatic retries.
    pub fn full(
        client: Client,
        evict_client: Client,
        recorder: EventRecorder,
        fleet: FleetCache,
        metrics_source: Option<Metrics>,
        metrics: UpgradeMetrics,
    ) -> Self {
        let mut ctx = Self::new(client, recorder);
        ctx.evict_client = evict_client;
        ctx.fleet = Some(fleet);
        ctx.metrics_source = metrics_source;
        ctx.metrics = metrics;
        ctx
    }

    /// Follows RevisionUpgrade deletions until aborted. A deleted upgrade's scheduled
    /// restarts stop and its metric series are removed; after a relist, so are those of
    /// upgrades deleted while the watch was down. (A deleted object is never reconciled, so
    /// the reconcile cannot do it.)
    /// `watch_client` is the client for watches (no read timeout).
    pub fn forget_deleted(&self, watch_client: &Client) -> JoinHandle<()> {
        let api: Api<PartialObjectMeta<RevisionUpgrade>> = Api::all(watch_client.clone());
        let (memory, metrics) = (self.memory.clone(), self.metrics.clone());
        let mut listed: BTreeSet<String> = BTreeSet::new();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .for_each(move |event| {
                let forget = |name: &str| {
                    if let Some(m) = memory.lock().expect("memory lock").remove(name) {
                        m.pacers.iter().for_each(JoinHandle::abort);
                    }
                    metrics.forget(name);
                    tracing::debug!(upgrade = name, "deleted: schedules stopped, series removed");
                };
                match event {
                    Ok(watcher::Event::Delete(m)) => forget(&m.name_any()),
                    Ok(watcher::Event::Init) => listed.clear(),
                    Ok(watcher::Event::InitApply(m)) => {
                        listed.insert(m.name_any());
                    }
                    Ok(watcher::Event::InitDone) => {
                        let mut known = metrics.upgrades();
                        known.extend(memory.lock().expect("memory lock").keys().cloned());
                        known.difference(&listed).for_each(|n| forget(n));
                    }
                    Ok(watcher::Event::Apply(_)) => {}
                    Err(e) => tracing::debug!(error = %e, "RevisionUpgrade watch interrupted"),
                }
                futures::future::ready(())
            });
        tokio::spawn(stream)
    }
}

/// Builds the metrics source from `prometheus` (a URL of Prometheus or Thanos Query, or the
/// settings `MetricsSourceArgs` made from the flags: credentials, headers, CA, timeout).
pub fn metrics_source(
    prometheus: impl Into<sluice_analysis::PrometheusConfig>,
    cluster: &str,
    issuance_window: Duration,
    allow_free_form_promql: bool,
) -> Result<Metrics, sluice_analysis::EngineError> {
    let source = PrometheusSource::new(prometheus.into());
    let engine = Engine::new(
        source,
        EngineOptions {
            allow_inline_promql_in_namespaced: allow_free_form_promql,
            ..EngineOptions::default()
        },
    )?;
    Ok(Metrics {
        engine,
        cluster: cluster.to_owned(),
        issuance_window,
        issuance_series: crate::issuance::DEFAULT_ISSUANCE_SERIES.to_owned(),
    })
}
