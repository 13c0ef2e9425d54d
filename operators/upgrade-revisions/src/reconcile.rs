//! The I/O side of sluice-upgrade-revisions: reads what `decide` needs (the fleet from watch
//! caches, the issuance counter and gate verdicts from the metrics source), writes the status it
//! returns (server-side apply fenced by resourceVersion), then carries out its actions: relabels
//! (a JSON patch that only applies while the label still has the expected value), evictions
//! (a client without automatic retries, so a PodDisruptionBudget's 429 comes back at once) and
//! rollout restarts.
//!
//! Owns the order of effects: status first (including the issuance tokens the restarts spend),
//! actions only after the status write succeeded, so a deposed leader whose write is refused
//! restarts nothing, and a crash between the two loses tokens rather than overspending them.
//! Must never decide anything.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt, stream};
use k8s_openapi::{
    api::{
        admissionregistration::v1::MutatingWebhookConfiguration,
        apps::v1::{DaemonSet, Deployment, StatefulSet},
        core::v1::{Namespace, Pod, PodTemplateSpec},
        policy::v1::PodDisruptionBudget,
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{EvictParams, ListParams, PartialObjectMeta, Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        controller::Action as ControllerAction,
        reflector::{self, Store},
        watcher,
    },
};
use serde_json::json;
use sluice_analysis::{Engine, EngineOptions, GateAction, GateCheck, PrometheusSource};
use sluice_api::v1alpha1::GateQuery;
use sluice_api::v1alpha1::{
    BaselineSource, CapturedBaseline, GateTemplate, GateVerdict, RevisionUpgrade,
    RevisionUpgradeSpec, RevisionUpgradeStatus, Verdict, VerdictReason,
    revision_upgrade::{NamespaceState, UpgradeWaveState, UpgradeWaveStatus},
};
use sluice_runtime::{
    Categorized, Category,
    events::EventRecorder,
    leader::{Leadership, NotLeader},
    projection::Projection,
    write::{self, WriteError},
};
use tokio::task::JoinHandle;

use crate::{
    FIELD_MANAGER,
    decide::{self, Action, Fleet, GateReport, Observations, Requeue},
    fleet::{self, NamespaceView, PodView, RESTARTED_AT_ANNOTATION, Workload, WorkloadView},
    metrics::UpgradeMetrics,
    pacing::{self, IssuanceReading},
};

/// Default length of the window background issuance is measured over.
pub const DEFAULT_ISSUANCE_WINDOW: Duration = Duration::from_secs(60);
/// Evictions sent at once.
const EVICTION_CONCURRENCY: usize = 32;

/// Watch caches of the objects the operator reads every tick. Pods are kept only as the
/// operator's views of them (never whole Pod objects: a cluster holds tens of thousands).
#[derive(Clone)]
pub struct FleetCache {
    namespaces: Store<Namespace>,
    views: PodViews,
    webhooks: Store<MutatingWebhookConfiguration>,
    deployments: Store<Deployment>,
    statefulsets: Store<StatefulSet>,
    daemonsets: Store<DaemonSet>,
    pdbs: Store<PodDisruptionBudget>,
    births: Births,
}

/// Every meshed pod as the operator reads it, kept up to date from the pod watch: each pod's
/// annotation is parsed once per change instead of once per tick (a tick reads every pod of the
/// cluster; at 40,000 pods the parsing would cost more than the rest of the tick).
#[derive(Clone, Default)]
struct PodViews(Arc<Mutex<Projection<PodKey, Arc<PodView>>>>);

/// A pod's (namespace, name).
type PodKey = (String, String);

impl PodViews {
    fn follow(&self, event: &watcher::Event<Pod>) {
        self.0.lock().expect("pod views lock").follow(
            event,
            |p| Some((p.namespace().unwrap_or_default(), p.name_any())),
            |p| PodView::from_pod(p).map(Arc::new),
        );
    }

    /// Whether every pod was listed once (until then the fleet is unknown, not empty).
    fn synced(&self) -> bool {
        self.0.lock().expect("pod views lock").synced()
    }

    /// Whether the pod `namespace/name` is known and not being deleted.
    fn alive(&self, key: &str) -> bool {
        let Some((ns, name)) = key.split_once('/') else {
            return false;
        };
        let ix = self.0.lock().expect("pod views lock");
        ix.entries()
            .get(&(ns.to_owned(), name.to_owned()))
            .is_some_and(|v| !v.terminating)
    }

    /// Every view, shared: a tick hands tens of thousands to `decide`.
    fn all(&self) -> Vec<Arc<PodView>> {
        self.0
            .lock()
            .expect("pod views lock")
            .entries()
            .values()
            .cloned()
            .collect()
    }
}

/// When each meshed pod created since the watch started was first seen: (time in ms,
/// namespace), oldest first, the last [`BIRTHS_KEPT`]. A new meshed pod is a new certificate,
/// so the births in the namespaces sluice is moving are its own issuance, timed within the
/// watch's delay of the certificate instead of the (much longer, load-dependent) delay between
/// an eviction and its replacement.
#[derive(Clone, Default)]
struct Births(Arc<Mutex<VecDeque<(i64, String)>>>);

/// How long births are kept.
const BIRTHS_KEPT: Duration = Duration::from_secs(600);

impl Births {
    fn record(&self, at: i64, namespace: String) {
        let mut b = self.0.lock().expect("births lock");
        b.push_back((at, namespace));
        let horizon = at - BIRTHS_KEPT.as_millis() as i64;
        while b.front().is_some_and(|(t, _)| *t < horizon) {
            b.pop_front();
        }
    }

    /// Births in `(from, to]` (ms) in namespaces `namespaces` holds.
    fn count(&self, from: i64, to: i64, namespaces: &BTreeSet<String>) -> u32 {
        let b = self.0.lock().expect("births lock");
        b.iter()
            .filter(|(t, ns)| *t > from && *t <= to && namespaces.contains(ns))
            .count() as u32
    }
}

/// Watches pods into their views, recording the first sighting of every meshed pod created
/// after the initial listing.
fn spawn_pod_watch(api: Api<Pod>, births: Births, views: PodViews) -> JoinHandle<()> {
    let mut known: std::collections::HashSet<String> = std::collections::HashSet::new();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .for_each(move |event| {
            if let Ok(e) = &event {
                views.follow(e);
            }
            match event {
                Ok(watcher::Event::InitApply(pod)) => {
                    known.insert(pod.uid().unwrap_or_default());
                }
                Ok(watcher::Event::Apply(pod)) => {
                    let meshed = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(fleet::injected_revision)
                        .is_some();
                    if known.insert(pod.uid().unwrap_or_default()) && meshed {
                        births.record(
                            Timestamp::now().as_millisecond(),
                            pod.namespace().unwrap_or_default(),
                        );
                    }
                }
                Ok(watcher::Event::Delete(pod)) => {
                    known.remove(&pod.uid().unwrap_or_default());
                }
                _ => {}
            }
            futures::future::ready(())
        });
    tokio::spawn(stream)
}

impl std::fmt::Debug for FleetCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetCache").finish_non_exhaustive()
    }
}

fn spawn_reflector<K>(api: Api<K>) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    // Managed fields are never read: not kept.
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .modify(|o| o.meta_mut().managed_fields = None)
        .touched_objects()
        .for_each(|_| async {});
    (reader, tokio::spawn(stream))
}

impl FleetCache {
    /// Starts watching namespaces, pods and mutating webhook configurations; the returned tasks
    /// run until aborted.
    pub fn start(client: &Client) -> (Self, Vec<JoinHandle<()>>) {
        let births = Births::default();
        let (namespaces, a) = spawn_namespace_reflector(Api::<Namespace>::all(client.clone()));
        let views = PodViews::default();
        let b = spawn_pod_watch(
            Api::<Pod>::all(client.clone()),
            births.clone(),
            views.clone(),
        );
        let (webhooks, c) =
            spawn_reflector(Api::<MutatingWebhookConfiguration>::all(client.clone()));
        let (deployments, d) = spawn_reflector(Api::<Deployment>::all(client.clone()));
        let (statefulsets, e) = spawn_reflector(Api::<StatefulSet>::all(client.clone()));
        let (daemonsets, f) = spawn_reflector(Api::<DaemonSet>::all(client.clone()));
        let (pdbs, g) = spawn_reflector(Api::<PodDisruptionBudget>::all(client.clone()));
        (
            Self {
                namespaces,
                views,
                webhooks,
                deployments,
                statefulsets,
                daemonsets,
                pdbs,
                births,
            },
            vec![a, b, c, d, e, f, g],
        )
    }

    async fn ready(&self) -> bool {
        let wait = async {
            let _ = self.namespaces.wait_until_ready().await;
            let _ = self.webhooks.wait_until_ready().await;
            let _ = self.deployments.wait_until_ready().await;
            let _ = self.statefulsets.wait_until_ready().await;
            let _ = self.daemonsets.wait_until_ready().await;
            let _ = self.pdbs.wait_until_ready().await;
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .is_ok()
            && self.views.synced()
    }

    fn read(&self) -> Fleet {
        let namespaces = self
            .namespaces
            .state()
            .iter()
            .map(|n| NamespaceView::from_namespace(n))
            .collect();
        let pods = self.views.all();
        let mwcs: Vec<MutatingWebhookConfiguration> = self
            .webhooks
            .state()
            .iter()
            .map(|m| (**m).clone())
            .collect();
        let workloads = self.workloads();
        let restarted_at = workloads
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.restarted_at.clone()?)))
            .collect();
        Fleet {
            namespaces,
            pods,
            tags: revision_tags(&mwcs),
            restarted_at,
            workloads,
        }
    }

    /// Every Deployment, StatefulSet and DaemonSet as the availability floor reads it.
    fn workloads(&self) -> BTreeMap<(String, Workload), WorkloadView> {
        let mut pdbs: HashMap<String, Vec<LabelSelector>> = HashMap::new();
        for p in self.pdbs.state() {
            if let Some(sel) = p.spec.as_ref().and_then(|s| s.selector.clone()) {
                pdbs.entry(p.namespace().unwrap_or_default())
                    .or_default()
                    .push(sel);
            }
        }
        let mut out = BTreeMap::new();
        let mut add = |ns: String,
                       kind: &str,
                       name: String,
                       template: &PodTemplateSpec,
                       replicas: u32,
                       max_unavailable: Option<IntOrString>,
                       min_ready_seconds: Option<i32>| {
            let meta = template.metadata.as_ref();
            let labels = meta.and_then(|m| m.labels.clone()).unwrap_or_default();
            let pdb = pdbs
                .get(&ns)
                .is_some_and(|sels| sels.iter().any(|s| fleet::selects(s, &labels)));
            let restarted_at = meta
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
                .cloned();
            out.insert(
                (
                    ns,
                    Workload {
                        kind: kind.to_owned(),
                        name,
                    },
                ),
                WorkloadView {
                    replicas,
                    max_unavailable,
                    min_ready_seconds: min_ready_seconds.unwrap_or(0).max(0) as u32,
                    pdb,
                    restarted_at,
                },
            );
        };
        for d in self.deployments.state() {
            let spec = &d.spec;
            let max_unavailable = spec
                .strategy
                .as_ref()
                .filter(|s| s.type_.as_deref() != Some("Recreate"))
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone());
            add(
                d.namespace().unwrap_or_default(),
                "Deployment",
                d.name_any(),
                &spec.template,
                spec.replicas.unwrap_or(1).max(0) as u32,
                max_unavailable,
                spec.min_ready_seconds,
            );
        }
        for s in self.statefulsets.state() {
            let spec = &s.spec;
            let max_unavailable = spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone());
            add(
                s.namespace().unwrap_or_default(),
                "StatefulSet",
                s.name_any(),
                &spec.template,
                spec.replicas.unwrap_or(1).max(0) as u32,
                max_unavailable,
                spec.min_ready_seconds,
            );
        }
        for ds in self.daemonsets.state() {
            let spec = &ds.spec;
            let max_unavailable = spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone());
            let replicas = ds
                .status
                .as_ref()
                .map_or(0, |s| s.desired_number_scheduled.max(0) as u32);
            add(
                ds.namespace().unwrap_or_default(),
                "DaemonSet",
                ds.name_any(),
                &spec.template,
                replicas,
                max_unavailable,
                spec.min_ready_seconds,
            );
        }
        out
    }
}

/// Watches namespaces into a store, keeping only the managed-field entries of Argo CD's
/// managers (what [`fleet::argo_cd_manages_labels`] reads).
fn spawn_namespace_reflector(api: Api<Namespace>) -> (Store<Namespace>, JoinHandle<()>) {
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .modify(|ns| {
            if let Some(fields) = ns.metadata.managed_fields.as_mut() {
                fields.retain(|f| {
                    f.manager
                        .as_deref()
                        .is_some_and(|m| m.starts_with("argocd"))
                });
            }
        })
        .touched_objects()
        .for_each(|_| async {});
    (reader, tokio::spawn(stream))
}

/// Revision tags from the injector webhooks: `istio-revision-tag-<tag>` labelled
/// `istio.io/tag=<tag>` and `istio.io/rev=<revision>`.
pub fn revision_tags(mwcs: &[MutatingWebhookConfiguration]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for m in mwcs {
        let name = m.name_any();
        let Some(tag) = name.strip_prefix("istio-revision-tag-") else {
            continue;
        };
        let labels = m.labels();
        if let Some(rev) = labels.get("istio.io/rev") {
            let tag = labels
                .get("istio.io/tag")
                .cloned()
                .unwrap_or_else(|| tag.to_owned());
            out.insert(tag, rev.clone());
        }
    }
    out
}

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
struct Memory {
    /// Restarts started: (time in ms, count).
    own: VecDeque<(i64, u32)>,
    /// Granted restarts that did not happen (refused, gone, failed, cancelled), to refund.
    unused: u32,
    /// Pods whose eviction a PodDisruptionBudget refused since the last grant.
    blocked: Vec<String>,
    /// Latest gate report and when it was made.
    gates: Option<(Timestamp, GateReport)>,
    /// Pods (`namespace/name`) whose restart is scheduled or was sent, with when (ms): never
    /// candidates while the fleet reading still shows them.
    in_progress: HashMap<String, i64>,
    /// When the next grant's first restart may start (the running schedule's next free slot).
    next_free: Option<tokio::time::Instant>,
    /// When the previous tick read the fleet (the next horizon covers the time between ticks).
    last_tick: Option<tokio::time::Instant>,
    /// Bumped to cancel the restarts scheduled but not yet started (pause, over budget).
    epoch: u64,
    /// The schedules running in the background.
    pacers: Vec<JoinHandle<()>>,
}

type Memories = Arc<Mutex<HashMap<String, Memory>>>;

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
    /// The platform's per-object series (exported while this replica leads; a deleted
    /// RevisionUpgrade's are removed by the runtime).
    pub signals: sluice_runtime::metrics::ObjectSignals,
    /// Webhook notifications of completion, abort and hold (`main` shares the runtime's).
    pub notifier: sluice_runtime::notify::Notifier,
    /// Whether this replica leads: checked right before every relabel, eviction and rollout
    /// restart; the background schedules stop when it is lost.
    pub leadership: Leadership,
    memory: Memories,
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

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

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
            signals: sluice_runtime::metrics::ObjectSignals::default(),
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

/// A reconcile that did not complete; retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Writing the status failed.
    #[error("writing RevisionUpgrade status: {0}")]
    Status(#[from] WriteError),
    /// Relabelling a namespace failed.
    #[error(
        "relabelling namespace {namespace} istio.io/rev: {source}; check the operator may patch namespaces"
    )]
    Relabel {
        /// Namespace.
        namespace: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Restarting a workload failed.
    #[error(
        "restarting {kind} {namespace}/{name}: {source}; check the operator may patch workloads"
    )]
    RolloutRestart {
        /// Workload kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// This replica no longer leads: the write was not sent.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// Listing workloads failed.
    #[error("listing workloads in {namespace}: {source}; check the operator may list workloads")]
    Workloads {
        /// Namespace.
        namespace: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
}

impl Categorized for ReconcileError {
    fn category(&self) -> Category {
        match self {
            ReconcileError::Status(e) => e.category(),
            ReconcileError::NotLeader(e) => e.category(),
            ReconcileError::Relabel { source, .. }
            | ReconcileError::RolloutRestart { source, .. }
            | ReconcileError::Workloads { source, .. } => Category::of_kube(source),
        }
    }
}

/// Reconciles one RevisionUpgrade.
#[tracing::instrument(skip_all, fields(kind = "RevisionUpgrade", name = obj.name_any()))]
pub async fn reconcile(
    obj: Arc<RevisionUpgrade>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    let api: Api<RevisionUpgrade> = Api::all(ctx.client.clone());
    let name = obj.name_any();
    let now = (ctx.clock)();
    let mut obs = Observations {
        generation: obj.metadata.generation,
        allow_free_form_promql: ctx.allow_free_form_promql,
        ..Observations::default()
    };
    let valid = crate::validity::problems(&obj.spec, ctx.allow_free_form_promql).is_empty();
    if valid && let Some(cache) = &ctx.fleet {
        if let Some(wait) = decide::not_due_for(obj.status.as_ref(), obs.generation, now) {
            return Ok(ControllerAction::requeue(wait));
        }
        if !cache.ready().await {
            return Ok(ControllerAction::requeue(Duration::from_secs(1)));
        }
        obs.fleet = Some(cache.read());
        obs.earlier_upgrade = earlier_upgrade(&api, &obj).await;
        let complete = obj
            .status
            .as_ref()
            .is_some_and(|s| s.completed_at.is_some());
        if !complete {
            read_metrics(&ctx, &name, &obj.spec, obj.status.as_ref(), &mut obs, now).await;
        }
        let mut memory = ctx.memory.lock().expect("memory lock");
        let m = memory.entry(name.clone()).or_default();
        obs.unused_grants = m.unused;
        obs.blocked = m.blocked.clone();
        // A pod whose restart was sent stays out of the candidates while the watch cache still
        // shows it alive (the watch may lag the eviction), at most a minute.
        // A workload's rollout restart is kept 30 s: by then its new template is read.
        let (pods_kept, workloads_kept) =
            (now.as_millisecond() - 60_000, now.as_millisecond() - 30_000);
        m.in_progress.retain(|key, at| {
            let workload = key.matches('/').count() == 2;
            if workload {
                *at > workloads_kept
            } else {
                *at > pods_kept && cache.views.alive(key)
            }
        });
        obs.in_progress = m.in_progress.keys().cloned().collect();
        let tick = tokio::time::Instant::now();
        let between = m
            .last_tick
            .replace(tick)
            .map_or(pacing::TICK, |t| tick.saturating_duration_since(t));
        // Without memory (a new leader), the previous leader's last schedule may still be
        // running for up to the longest horizon after its grant.
        let inherited = obj
            .status
            .as_ref()
            .and_then(|s| s.issuance_budget.as_ref())
            .filter(|b| b.own_restarts_last_second > 0)
            .and_then(|b| b.updated_at.as_ref())
            .map_or(Duration::ZERO, |at| {
                let since = now.duration_since(at.0).unsigned_abs();
                pacing::MAX_HORIZON.saturating_sub(since)
            });
        obs.pacing = pacing::Window {
            busy_for: m
                .next_free
                .map_or(inherited, |f| f.saturating_duration_since(tick)),
            horizon: between
                .mul_f64(1.5)
                .clamp(pacing::DEFAULT_HORIZON, pacing::MAX_HORIZON),
        };
    }
    let started = tokio::time::Instant::now();
    let decision = decide::decide(&obj.spec, obj.status.as_ref(), &obs, now);
    if obj.status.as_ref() != Some(&decision.status) {
        write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &decision.status).await?;
        tracing::debug!(phase = ?decision.status.phase, "status written");
        if let Some(n) = crate::notice::notice(obj.status.as_ref(), &decision.status) {
            ctx.notifier.notify(obj.as_ref(), n);
        }
    }
    ctx.signals.set(
        crate::metrics::OBJECT_KIND,
        "",
        &name,
        crate::metrics::object_signal(&decision.status),
    );
    let granted = decision
        .status
        .issuance_budget
        .as_ref()
        .and_then(|b| b.updated_at.clone())
        != obj
            .status
            .as_ref()
            .and_then(|s| s.issuance_budget.as_ref())
            .and_then(|b| b.updated_at.clone());
    if granted {
        // The refunds and refusals read for this grant were consumed by it (more may have
        // arrived meanwhile from a running schedule: they stay for the next grant).
        let mut memory = ctx.memory.lock().expect("memory lock");
        let m = memory.entry(name.clone()).or_default();
        m.unused = m.unused.saturating_sub(obs.unused_grants);
        m.blocked.retain(|p| !obs.blocked.contains(p));
    }
    let hold = obj.spec.paused
        || decision
            .status
            .issuance_budget
            .as_ref()
            .is_some_and(|b| b.throttled);
    let outcome = act(&ctx, &obj, &decision, hold).await;
    if let Some(fleet) = &obs.fleet {
        let in_flight = in_flight(&decision.status, &fleet.pods);
        ctx.metrics.observe(
            &name,
            &obj.spec,
            &decision.status,
            &fleet::proxies_by_revision(&fleet.pods),
            in_flight,
        );
    }
    outcome?;
    Ok(match decision.requeue {
        Requeue::AwaitChange => ControllerAction::await_change(),
        // The next tick is due a tick after this one started (restarts run in the background).
        Requeue::After(d) => ControllerAction::requeue(
            d.saturating_sub(started.elapsed())
                .max(Duration::from_millis(50)),
        ),
    })
}

/// The oldest other RevisionUpgrade of the cluster still in progress, if it was created before
/// `obj` (creation time, then name): one issuance budget per cluster. A listing error is taken
/// as none (the next tick lists again).
async fn earlier_upgrade(api: &Api<RevisionUpgrade>, obj: &RevisionUpgrade) -> Option<String> {
    use sluice_api::v1alpha1::RevisionUpgradePhase as P;
    let list = api.list(&ListParams::default()).await.ok()?;
    let key = |u: &RevisionUpgrade| {
        (
            u.metadata.creation_timestamp.as_ref().map(|t| t.0),
            u.name_any(),
        )
    };
    let mine = key(obj);
    list.items
        .iter()
        .filter(|u| u.name_any() != mine.1 && u.metadata.deletion_timestamp.is_none())
        .filter(|u| {
            !matches!(
                u.status.as_ref().map(|s| s.phase),
                Some(P::Complete | P::Aborted | P::Invalid)
            )
        })
        .filter(|u| key(u) < mine)
        .min_by_key(|u| key(u))
        .map(|u| u.name_any())
}

/// Pods of moving namespaces not yet Ready on their target revision.
fn in_flight(status: &RevisionUpgradeStatus, pods: &[Arc<PodView>]) -> u64 {
    let moving: BTreeSet<&str> = status
        .namespaces
        .iter()
        .filter(|n| {
            matches!(
                n.state,
                NamespaceState::Restarting | NamespaceState::RollingBack
            )
        })
        .map(|n| n.name.as_str())
        .collect();
    pods.iter()
        .filter(|p| (p.terminating || !p.ready) && moving.contains(p.namespace.as_str()))
        .count() as u64
}

/// Reads the issuance counter and, when due, the gates of the current wave.
async fn read_metrics(
    ctx: &Context,
    name: &str,
    spec: &RevisionUpgradeSpec,
    status: Option<&RevisionUpgradeStatus>,
    obs: &mut Observations,
    now: Timestamp,
) {
    let Some(m) = &ctx.metrics_source else {
        obs.issuance_problem = Some(
            "no metrics source is configured (--prometheus-url), so issuance cannot be observed"
                .into(),
        );
        return;
    };
    match issuance(ctx, name, m, status, now).await {
        Ok(r) => obs.issuance = Some(r),
        Err(why) => obs.issuance_problem = Some(why),
    }
    obs.gates = gates(ctx, name, m, spec, status, now).await;
}

/// Issuance over the last window (the sum of every CA replica's increase, resets handled), and
/// sluice's own issuance in the same window: the meshed pods first seen in the namespaces it is
/// moving in the window, at most the restarts it started since a minute before the window (a
/// pod created there for another reason is not taken for sluice's beyond what it started).
async fn issuance(
    ctx: &Context,
    name: &str,
    m: &Metrics,
    status: Option<&RevisionUpgradeStatus>,
    now: Timestamp,
) -> Result<IssuanceReading, String> {
    use sluice_analysis::MetricsSource;
    let window = m.issuance_window;
    let series = crate::issuance::series(&m.issuance_series, &m.cluster);
    let answer = m
        .engine
        .source()
        .query(&crate::issuance::query(&series, window), now)
        .await
        .map_err(|e| format!("reading {series}: {e}"))?;
    let part = |p: &str| {
        answer
            .iter()
            .find(|s| s.labels.get("part").map(String::as_str) == Some(p))
            .map(|s| s.value)
    };
    let now_s = now.as_millisecond() as f64 / 1000.0;
    let issued = crate::issuance::interpret(
        &series,
        part("value"),
        part("ts"),
        part("early"),
        window,
        now_s,
    )?;
    let (t0, t1) = (now_s - window.as_secs_f64(), now_s);
    let span = window.as_secs_f64();
    let (t0_ms, t1_ms) = ((t0 * 1000.0) as i64, (t1 * 1000.0) as i64);
    let moving: BTreeSet<String> = status
        .map(|s| {
            s.namespaces
                .iter()
                .filter(|n| {
                    matches!(
                        n.state,
                        NamespaceState::Restarting
                            | NamespaceState::RollingBack
                            | NamespaceState::Moved
                    )
                })
                .map(|n| n.name.clone())
                .collect()
        })
        .unwrap_or_default();
    let births = ctx
        .fleet
        .as_ref()
        .map_or(0, |f| f.births.count(t0_ms, t1_ms, &moving));
    let mut memory = ctx.memory.lock().expect("memory lock");
    let mem = memory.entry(name.to_owned()).or_default();
    let horizon = now.as_millisecond() - 2 * window.as_millis() as i64 - 60_000;
    while mem.own.front().is_some_and(|(t, _)| *t < horizon) {
        mem.own.pop_front();
    }
    let started: u32 = mem
        .own
        .iter()
        .filter(|(t, _)| *t > t0_ms - 60_000 && *t <= t1_ms)
        .map(|(_, n)| n)
        .sum();
    Ok(IssuanceReading {
        window_seconds: span,
        issued,
        own: f64::from(births.min(started)),
    })
}

/// The current wave's gate report: evaluated every analysis interval, reused in between.
async fn gates(
    ctx: &Context,
    name: &str,
    m: &Metrics,
    spec: &RevisionUpgradeSpec,
    status: Option<&RevisionUpgradeStatus>,
    now: Timestamp,
) -> Option<GateReport> {
    let status = status?;
    if status.aborted_at.is_some() {
        return None;
    }
    let index = status.current_wave_index? as usize;
    let wave = status.waves.get(index)?;
    if !matches!(
        wave.state,
        UpgradeWaveState::Restarting | UpgradeWaveState::Soaking
    ) {
        return None;
    }
    let interval = spec
        .analysis_interval
        .parse()
        .unwrap_or(Duration::from_secs(30));
    {
        let memory = ctx.memory.lock().expect("memory lock");
        if let Some((at, report)) = memory.get(name).and_then(|m| m.gates.as_ref())
            && report.wave == wave.name
            && now.duration_since(*at)
                < jiff::SignedDuration::try_from(interval).unwrap_or_default()
        {
            return Some(report.clone());
        }
    }
    // The namespaces the wave moves: a gate naming `{{namespace}}` is judged once per each.
    let namespaces: Vec<String> = status
        .namespaces
        .iter()
        .filter(|n| n.wave == wave.name)
        .map(|n| n.name.clone())
        .collect();
    let mut checks = Vec::new();
    // The gate (index into `names`) each check judges.
    let mut of_gate: Vec<usize> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut problems: Vec<GateVerdict> = Vec::new();
    for gate in spec.effective_gates() {
        let template = match &gate.template_ref {
            Some(t) => match Api::<GateTemplate>::all(ctx.client.clone())
                .get_opt(t)
                .await
            {
                Ok(found) => found.map(|g| g.spec),
                Err(e) => {
                    problems.push(problem(
                        &gate.name,
                        format!("reading GateTemplate {t}: {e}"),
                        now,
                    ));
                    continue;
                }
            },
            None => None,
        };
        let resolved = match gate.resolve(template.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                problems.push(problem(&gate.name, e.to_string(), now));
                continue;
            }
        };
        let per_namespace =
            matches!(&resolved.query, GateQuery::PromQl(q) if q.contains("{{namespace}}"));
        let scopes: Vec<Option<&str>> = if per_namespace {
            namespaces.iter().map(|n| Some(n.as_str())).collect()
        } else {
            vec![None]
        };
        let previous = wave.gates.iter().find(|v| v.gate == gate.name).cloned();
        names.push(gate.name.clone());
        for scope in scopes {
            let mut vars: BTreeMap<String, String> = [
                ("cluster", m.cluster.as_str()),
                ("revision", spec.to_revision.as_str()),
                ("tag", spec.to_tag.as_str()),
                ("wave", wave.name.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            if let Some(ns) = scope {
                vars.insert("namespace".into(), ns.to_owned());
            }
            let owner = match scope {
                Some(ns) => format!("RevisionUpgrade {name} namespace {ns}"),
                None => format!("RevisionUpgrade {name}"),
            };
            let mut check = GateCheck::new(owner, resolved.clone(), vars);
            check.owner_namespaced = false;
            check.previous = previous.clone();
            checks.push(check);
            of_gate.push(names.len() - 1);
        }
    }
    let (baselines, missing_baselines) =
        pre_wave_baselines(m, status, wave, &mut checks, now).await;
    let report = m.engine.tick(&checks, now).await;
    let severity = |a: GateAction| match a {
        GateAction::Proceed => 0,
        GateAction::Wait => 1,
        GateAction::Pause => 2,
        GateAction::Abort => 3,
    };
    // Per gate, the worst of its checks: Fail, then Inconclusive, then Pass; a namespace with no
    // traffic at all (NoData) is no news unless every namespace of the gate has none.
    let rank = |v: &GateVerdict| match (v.verdict, v.reason) {
        (Verdict::Fail, _) => 3,
        (Verdict::Inconclusive, VerdictReason::NoData) => 1,
        (Verdict::Inconclusive, _) => 2,
        (Verdict::Pass, _) => 0,
    };
    let mut worst: Vec<Option<(GateVerdict, GateAction)>> = vec![None; names.len()];
    for (i, ((check, outcome), gate)) in
        checks.iter().zip(report.outcomes).zip(&of_gate).enumerate()
    {
        let (mut verdict, a) = match outcome.verdict {
            Ok(v) => {
                let a = sluice_analysis::action(&check.gate, &v, now);
                (v, a)
            }
            Err(e) => {
                // A query that cannot be built or run is Inconclusive under the gate's own
                // policy (sustained, it pauses, aborts or continues), never an eternal Wait.
                let mut v = problem(&check.gate.name, e.to_string(), now);
                v.inconclusive_since = check
                    .previous
                    .as_ref()
                    .filter(|p| p.verdict == Verdict::Inconclusive)
                    .and_then(|p| p.inconclusive_since.clone())
                    .or(Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        now,
                    )));
                let a = sluice_analysis::action(&check.gate, &v, now);
                (v, a)
            }
        };
        if let Some(why) = missing_baselines.get(&i) {
            let m = verdict.message.take().unwrap_or_default();
            verdict.message = Some(format!("{m}: {why}"));
        }
        if check.vars.contains_key("namespace")
            && let Some(ns) = check.vars.get("namespace")
        {
            let m = verdict.message.take().unwrap_or_default();
            let mut m = format!("namespace {ns}: {m}");
            m.truncate(1000);
            verdict.message = Some(m);
        }
        let slot = &mut worst[*gate];
        if slot.as_ref().is_none_or(|(w, _)| rank(&verdict) > rank(w)) {
            *slot = Some((verdict, a));
        }
    }
    let mut verdicts = Vec::new();
    let mut action = GateAction::Proceed;
    for (v, a) in worst.into_iter().flatten() {
        if severity(a) > severity(action) {
            action = a;
        }
        verdicts.push(v);
    }
    if !problems.is_empty() && severity(GateAction::Wait) > severity(action) {
        action = GateAction::Wait;
    }
    verdicts.extend(problems);
    let report = GateReport {
        wave: wave.name.clone(),
        verdicts,
        action: Some(action),
        baselines,
    };
    ctx.memory
        .lock()
        .expect("memory lock")
        .entry(name.to_owned())
        .or_default()
        .gates = Some((now, report.clone()));
    Some(report)
}

/// The pre-wave baselines of the `checks` compared with `baseline: PreChangeWindow`: each
/// check's own reading (same gate, same namespace) over the window that ends when the wave
/// started, before its first relabel and restart. Kept ones (status) are reused; missing ones are
/// captured now (queried at the wave's start, so a later capture reads the same pre-wave data).
/// Returns the baselines to keep and, per check left without one, why (the check then stays
/// Inconclusive `BaselineMissing` under its gate's policy, and the capture is tried again at the
/// next evaluation).
async fn pre_wave_baselines(
    m: &Metrics,
    status: &RevisionUpgradeStatus,
    wave: &UpgradeWaveStatus,
    checks: &mut [GateCheck],
    now: Timestamp,
) -> (Vec<CapturedBaseline>, BTreeMap<usize, String>) {
    let mut kept = Vec::new();
    let mut why = BTreeMap::new();
    let Some(start) = wave.started_at.as_ref().map(|t| t.0) else {
        return (kept, why);
    };
    let mut missing = Vec::new();
    for (i, check) in checks.iter_mut().enumerate() {
        let pre_wave = check
            .gate
            .comparison
            .relative
            .as_ref()
            .is_some_and(|r| r.baseline == BaselineSource::PreChangeWindow);
        if !pre_wave {
            continue;
        }
        let scope = check.vars.get("namespace").cloned();
        match status
            .captured_baselines
            .iter()
            .find(|b| b.gate == check.gate.name && b.scope == scope && b.window_end.0 == start)
        {
            Some(b) => {
                check.captured_baseline = Some(b.clone());
                kept.push(b.clone());
            }
            None => missing.push(i),
        }
    }
    if missing.is_empty() {
        return (kept, why);
    }
    let wanted: Vec<GateCheck> = missing.iter().map(|&i| checks[i].clone()).collect();
    let captured = m.engine.capture_baselines(&wanted, start, now).await;
    for (&i, result) in missing.iter().zip(captured) {
        match result {
            Ok(mut b) => {
                b.scope = checks[i].vars.get("namespace").cloned();
                checks[i].captured_baseline = Some(b.clone());
                kept.push(b);
            }
            Err(e) => {
                why.insert(
                    i,
                    format!("no baseline captured before the wave started ({e})"),
                );
            }
        }
    }
    (kept, why)
}

/// A gate that could not be evaluated: Inconclusive with the reason in the message.
fn problem(gate: &str, message: String, now: Timestamp) -> GateVerdict {
    let mut message = message;
    message.truncate(1000);
    GateVerdict {
        gate: gate.chars().take(63).collect(),
        verdict: Verdict::Inconclusive,
        reason: VerdictReason::QueryError,
        message: Some(message),
        value: None,
        baseline: None,
        threshold: None,
        samples: None,
        min_samples: None,
        consecutive_failures: 0,
        inconclusive_since: None,
        evaluated_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    }
}

/// Carries out the decision's actions: Events and relabels at once, then the restarts in the
/// background at the times the budget scheduled them, counted from now (after the status
/// write), so the next tick's decision and writes overlap them and restarts flow as tokens
/// accrue. `hold` cancels the restarts of earlier schedules not yet started (their tokens are
/// refunded). Restart outcomes go to memory for the next tick (refunds, refusals, own
/// issuance); the first relabel error is returned after every action was tried.
async fn act(
    ctx: &Arc<Context>,
    obj: &RevisionUpgrade,
    decision: &decide::Decision,
    hold: bool,
) -> Result<(), ReconcileError> {
    let name = obj.name_any();
    let mut first_error = None;
    let mut restarts = Vec::new();
    for action in &decision.actions {
        match action {
            Action::Event {
                severity,
                reason,
                action,
                note,
            } => {
                ctx.recorder
                    .publish(obj, *severity, reason, action, note)
                    .await;
            }
            Action::Relabel {
                namespace,
                from,
                to,
            } => {
                if let Err(e) = relabel(&ctx.client, &ctx.leadership, namespace, from, to).await {
                    tracing::warn!(namespace, error = %e, "relabel failed; retried next tick");
                    first_error.get_or_insert(e);
                }
            }
            Action::Evict { .. } | Action::RolloutRestart { .. } => restarts.push(action.clone()),
        }
    }
    let base = tokio::time::Instant::now();
    let epoch = {
        let mut memory = ctx.memory.lock().expect("memory lock");
        let m = memory.entry(name.clone()).or_default();
        m.pacers.retain(|p| !p.is_finished());
        if hold {
            m.epoch += 1;
            m.next_free = None;
        }
        if !restarts.is_empty() {
            m.next_free = Some(base + decision.busy_for);
            let at = (ctx.clock)().as_millisecond();
            for r in &restarts {
                match r {
                    Action::Evict { namespace, pod, .. } => {
                        m.in_progress.insert(format!("{namespace}/{pod}"), at);
                    }
                    Action::RolloutRestart {
                        namespace,
                        workload,
                        ..
                    } => {
                        m.in_progress
                            .insert(decide::workload_key(namespace, workload), at);
                    }
                    _ => {}
                }
            }
        }
        m.epoch
    };
    if !restarts.is_empty() {
        let pacer = Pacer {
            name: name.clone(),
            client: ctx.client.clone(),
            evict_client: ctx.evict_client.clone(),
            clock: ctx.clock,
            metrics: ctx.metrics.clone(),
            memory: ctx.memory.clone(),
            leadership: ctx.leadership.clone(),
            epoch,
        };
        let handle = tokio::spawn(pacer.run(base, restarts));
        let mut memory = ctx.memory.lock().expect("memory lock");
        memory.entry(name).or_default().pacers.push(handle);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One grant's restarts, started in the background at their scheduled times.
struct Pacer {
    name: String,
    client: Client,
    evict_client: Client,
    clock: fn() -> Timestamp,
    metrics: UpgradeMetrics,
    memory: Memories,
    leadership: Leadership,
    epoch: u64,
}

impl Pacer {
    /// Cancelled by a later tick (pause, over budget), or because this replica no longer leads.
    fn cancelled(&self) -> bool {
        !self.leadership.is_leader()
            || self
                .memory
                .lock()
                .expect("memory lock")
                .get(&self.name)
                .is_none_or(|m| m.epoch != self.epoch)
    }

    /// Starts every restart at `base` plus its offset (at bounded concurrency, in order), and
    /// records each outcome as it comes.
    async fn run(self, base: tokio::time::Instant, restarts: Vec<Action>) {
        let this = &self;
        stream::iter(restarts)
            .map(|action| async move {
                let after = match &action {
                    Action::Evict { after, .. } | Action::RolloutRestart { after, .. } => *after,
                    _ => Duration::ZERO,
                };
                // Leadership lost while waiting: the restart is recorded as cancelled at once.
                let mut leadership = this.leadership.clone();
                tokio::select! {
                    _ = tokio::time::sleep_until(base + after) => {}
                    _ = leadership.lost() => {}
                }
                this.start(action).await;
            })
            .buffer_unordered(EVICTION_CONCURRENCY)
            .for_each(|()| async {})
            .await;
    }

    async fn start(&self, action: Action) {
        let (key, mode, cost) = match &action {
            Action::Evict { namespace, pod, .. } => (format!("{namespace}/{pod}"), "evict", 1),
            Action::RolloutRestart {
                namespace,
                workload,
                pods,
                ..
            } => (
                decide::workload_key(namespace, workload),
                "rollout_restart",
                *pods,
            ),
            _ => return,
        };
        let outcome = if self.cancelled() {
            EvictOutcome::Cancelled
        } else {
            match &action {
                Action::Evict { .. } | Action::RolloutRestart { .. }
                    if self.leadership.ensure().is_err() =>
                {
                    EvictOutcome::Cancelled
                }
                Action::Evict { namespace, pod, .. } => {
                    let api: Api<Pod> = Api::namespaced(self.evict_client.clone(), namespace);
                    match api.evict(pod, &EvictParams::default()).await {
                        Ok(_) => EvictOutcome::Started(1),
                        Err(kube::Error::Api(s)) if s.code == 429 => EvictOutcome::Blocked,
                        Err(kube::Error::Api(s)) if s.code == 404 => EvictOutcome::Gone,
                        Err(e) => {
                            tracing::warn!(namespace, pod, error = %e, "eviction failed; retried next tick");
                            EvictOutcome::Error
                        }
                    }
                }
                Action::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at,
                    ..
                } => match rollout_restart(&self.client, namespace, workload, restarted_at).await {
                    Ok(pods) => EvictOutcome::Started(pods),
                    Err(e) => {
                        tracing::warn!(error = %e, "rollout restart failed; retried next tick");
                        EvictOutcome::Error
                    }
                },
                _ => return,
            }
        };
        let at = (self.clock)().as_millisecond();
        let result = match outcome {
            EvictOutcome::Started(_) => "started",
            EvictOutcome::Blocked => "blocked",
            EvictOutcome::Gone => "gone",
            EvictOutcome::Error => "error",
            EvictOutcome::Cancelled => "cancelled",
        };
        if !matches!(outcome, EvictOutcome::Cancelled) {
            self.metrics.restart(&self.name, mode, result);
        }
        let mut memory = self.memory.lock().expect("memory lock");
        let Some(m) = memory.get_mut(&self.name) else {
            return;
        };
        match outcome {
            EvictOutcome::Started(pods) => {
                // Rollout restarts: their pods are replaced over time; counted when requested.
                let pos = m.own.partition_point(|(t, _)| *t <= at);
                m.own.insert(pos, (at, pods));
            }
            EvictOutcome::Blocked => {
                m.unused += cost;
                m.in_progress.remove(&key);
                if !m.blocked.contains(&key) {
                    m.blocked.push(key);
                    m.blocked.sort();
                }
            }
            EvictOutcome::Gone | EvictOutcome::Error | EvictOutcome::Cancelled => {
                m.unused += cost;
                m.in_progress.remove(&key);
            }
        }
    }
}

enum EvictOutcome {
    /// Started; this many pods will be replaced.
    Started(u32),
    Blocked,
    Gone,
    Error,
    Cancelled,
}

/// Patch parameters under the operator's field manager, so its writes are attributed to it in
/// `managedFields` (Argo CD's `ignoreDifferences.managedFieldsManagers` keys on that name).
fn owned_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.as_str().to_owned()),
        ..PatchParams::default()
    }
}

/// Sets `istio.io/rev` from `from` to `to` only while it is still `from` (a JSON patch `test`).
async fn relabel(
    client: &Client,
    leadership: &Leadership,
    namespace: &str,
    from: &str,
    to: &str,
) -> Result<(), ReconcileError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/istio.io~1rev", "value": from},
        {"op": "replace", "path": "/metadata/labels/istio.io~1rev", "value": to},
    ]))
    .expect("a well-formed JSON patch");
    leadership.ensure()?;
    match api
        .patch(namespace, &owned_params(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        // The label is no longer `from`: someone else changed it; the next tick reads it.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => Ok(()),
        Err(source) => Err(ReconcileError::Relabel {
            namespace: namespace.to_owned(),
            source,
        }),
    }
}

/// Sets the workload's pod-template `restartedAt` annotation; returns its replica count (the
/// SVIDs the restart will cost).
async fn rollout_restart(
    client: &Client,
    namespace: &str,
    workload: &Workload,
    restarted_at: &str,
) -> Result<u32, ReconcileError> {
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: restarted_at}}}}});
    let params = owned_params();
    let err = |source| ReconcileError::RolloutRestart {
        kind: workload.kind.clone(),
        namespace: namespace.to_owned(),
        name: workload.name.clone(),
        source,
    };
    let replicas = match workload.kind.as_str() {
        "Deployment" => Api::<Deployment>::namespaced(client.clone(), namespace)
            .patch(&workload.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(err)?
            .spec
            .replicas
            .unwrap_or(1),
        "StatefulSet" => Api::<StatefulSet>::namespaced(client.clone(), namespace)
            .patch(&workload.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(err)?
            .spec
            .replicas
            .unwrap_or(1),
        _ => Api::<DaemonSet>::namespaced(client.clone(), namespace)
            .patch(&workload.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(err)?
            .status
            .map(|s| s.desired_number_scheduled)
            .unwrap_or(1),
    };
    Ok(replicas.max(0) as u32)
}
