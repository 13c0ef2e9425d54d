//! The I/O side of sluice-rollout-weights: reads what `decide` needs (the route of the kind
//! `spec.routeRef.kind` names, through the route seam's field-preserving view, and its installed
//! CRD; the canary workload; the gate verdicts of the shared analysis), writes the status it returns (server-side apply fenced by
//! resourceVersion), then carries out its route writes and Events.
//!
//! Owns the order of effects: the status decision first (a deposed leader's stale decision is
//! refused there and nothing else happens), then the route write (read-modify-write with a
//! resourceVersion precondition under this operator's field manager), then a second fenced
//! status write recording the route's resourceVersion; Events and the transition log line last.
//! An abort is the exception: its route write comes first (fenced by leadership and the route's
//! resourceVersion; weight 0 is never the unsafe direction), and one status write then records
//! the decision and when the route was reverted, so the revert waits for no other request. Holds a finalizer so that deleting a
//! Rollout hands its route back (ownership annotation and this manager's managedFields entry
//! removed, nothing else). Must never decide anything and never write a route another Rollout
//! owns.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::Service,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry, jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{
        WatchStreamExt,
        controller::Action as ControllerAction,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use prometheus_client::registry::Registry;
use sluice_analysis::{Engine, EngineOptions, PrometheusConfig, PrometheusSource};
use sluice_api::v1alpha1::{
    GateTemplate, GateTemplateSpec, Rollout, RolloutPhase, RolloutStatus, rollout::RouteKindName,
};
use sluice_runtime::{
    Categorized, Category,
    error::ReconcileFailure,
    events::{Announces, EventRecorder},
    leader::Leadership,
    write::{self, RetryPolicy, Updated, WriteError},
};

use crate::{
    FIELD_MANAGER,
    analysis::{self, Analyzer},
    decide::RouteObs,
    decide::{self, Action, Observations},
    metrics::{self, RolloutMetrics},
    observe,
    record::{self, Outcome},
    route::{self, Driven, RouteKind, Wired, grpc::Grpc, http::Http},
    route_edit::{CrdSupport, Desired, EditError, Target},
};

/// The finalizer that makes deleting a Rollout hand its route back first.
pub const FINALIZER: &str = "sluice.dev/route-hand-back";
/// Name of the HTTPRoute CustomResourceDefinition read to learn which fields it keeps.
pub const HTTPROUTE_CRD: &str = <Wired as RouteKind>::CRD;
/// How far in the past gate queries are evaluated (ingestion of the newest samples).
pub const QUERY_LAG: Duration = Duration::from_secs(2);
/// How long the installed CRDs' field support (and whether they are installed) is cached.
const CRD_TTL: Duration = Duration::from_secs(60);

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// The operator's Event recorder.
    pub recorder: EventRecorder,
    /// The clock; tests pin it.
    pub clock: fn() -> Timestamp,
    /// Whether free-form PromQL gates are allowed (`--allow-free-form-promql`).
    pub allow_free_form_promql: bool,
    /// The `cluster` label value of this cluster's series.
    pub cluster: String,
    /// The shared gate analysis (`None`: no metrics source; no weight step is ever judged).
    pub analyzer: Option<Arc<Analyzer<PrometheusSource>>>,
    /// Captures pre-change baselines (`None`: no metrics source); same source as `analyzer`.
    pub baselines: Option<Arc<Engine<PrometheusSource>>>,
    /// The operator's metrics.
    pub metrics: RolloutMetrics,
    /// Webhook notifications of aborts and promotions (`main` shares the runtime's).
    pub notifier: sluice_runtime::notify::Notifier,
    /// Whether this replica leads: checked right before every route write.
    pub leadership: Leadership,
    /// The controller's own store of Rollouts, once the controller runs (see
    /// [`crate::triggers::sharing_store`]): a reconcile waiting on analysis watches it for a
    /// manual control and gives way to it at once.
    pub rollouts: RolloutStore,
    /// Every GateTemplate, from a watch ([`Context::with_gate_template_cache`]); `None`: read
    /// with a GET when needed.
    gate_templates: Option<(Store<GateTemplate>, Arc<AtomicBool>)>,
    /// Per route CRD: when it was read, and its field support (`None`: not installed).
    crd: Mutex<HashMap<&'static str, (Instant, Option<CrdSupport>)>>,
}

/// Where the Rollout controller publishes its store for the reconciles: the store of the
/// controller that runs now. Each term of leadership runs a new controller with a new store, and
/// publishes it here in place of the last term's, which no longer updates.
#[derive(Clone, Debug, Default)]
pub struct RolloutStore(Arc<RwLock<Option<Store<Rollout>>>>);

impl RolloutStore {
    /// Publishes `store`, the running controller's, in place of any earlier one.
    pub fn publish(&self, store: Store<Rollout>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
    }

    /// The running controller's store; `None` before a controller ran.
    pub fn current(&self) -> Option<Store<Rollout>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// When a decision made from a stale Rollout is tried again if the watch has not delivered the
/// newer one by then.
const STALE_RETRY: Duration = Duration::from_millis(250);

/// How often a reconcile waiting on analysis looks for a manual control in the store.
const CONTROL_POLL: Duration = Duration::from_millis(100);

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context reading the system clock, without a metrics source, recording metrics into a
    /// registry of its own.
    pub fn new(client: Client, recorder: EventRecorder) -> Self {
        Self {
            client,
            recorder,
            clock: Timestamp::now,
            allow_free_form_promql: false,
            cluster: String::new(),
            analyzer: None,
            baselines: None,
            metrics: metrics::register(&mut Registry::default()),
            notifier: sluice_runtime::notify::Notifier::disabled(),
            leadership: Leadership::always(),
            rollouts: RolloutStore::default(),
            gate_templates: None,
            crd: Mutex::new(HashMap::new()),
        }
    }

    /// The same context reading GateTemplates from a cache kept by a watch on `watch_client`
    /// (one watch for all Rollouts, instead of a GET per template per analysis). An edit of a
    /// template is in the cache as soon as the watch delivers it; the Rollouts using it are
    /// reconciled through [`crate::triggers::with_triggers`]. Must be called inside the runtime.
    pub fn with_gate_template_cache(mut self, watch_client: Client) -> Self {
        let (reader, writer) = reflector::store();
        let api: Api<GateTemplate> = Api::all(watch_client);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        let listed = Arc::new(AtomicBool::new(false));
        let (ready, flag) = (reader.clone(), listed.clone());
        tokio::spawn(async move {
            if ready.wait_until_ready().await.is_ok() {
                flag.store(true, Ordering::Release);
            }
        });
        tokio::spawn(async move {
            use futures::StreamExt;
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "GateTemplate watch failed; retrying");
                }
            }
        });
        self.gate_templates = Some((reader, listed));
        self
    }

    /// The same context judging weight steps with metrics from `prometheus` (a URL of Prometheus
    /// or Thanos Query, or the settings `MetricsSourceArgs` made from the flags), series scoped by
    /// `cluster`, recording into `metrics`.
    pub fn with_analysis(
        mut self,
        prometheus: impl Into<PrometheusConfig>,
        cluster: &str,
        metrics: RolloutMetrics,
    ) -> Result<Self, sluice_analysis::EngineError> {
        let config = prometheus.into();
        let engine = Engine::new(
            PrometheusSource::new(config.clone()),
            engine_options(self.allow_free_form_promql),
        )?;
        self.baselines = Some(Arc::new(Engine::new(
            PrometheusSource::new(config),
            engine_options(self.allow_free_form_promql),
        )?));
        let observer = metrics.clone();
        self.analyzer = Some(Arc::new(Analyzer::new(
            engine,
            Duration::from_millis(40),
            QUERY_LAG,
            move |t| observer.tick(t),
        )));
        self.cluster = cluster.to_owned();
        self.metrics = metrics;
        Ok(self)
    }

    /// The field support of kind `K`'s installed CRD; `None` when it is not installed. A CRD
    /// that cannot be read is assumed installed, keeping rule names and mirror percent. An
    /// installed CRD's support is kept for [`CRD_TTL`]; a missing one is read again on every
    /// call (only the Rollouts on that kind pay for it), so a CRD installed later is used by the
    /// next reconcile, which its routes' watch triggers at once.
    async fn crd_support<K: RouteKind>(&self) -> Option<CrdSupport> {
        if let Some((at, Some(s))) = self
            .crd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(K::CRD)
            .copied()
            && at.elapsed() < CRD_TTL
        {
            return Some(s);
        }
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let support = match api.get_opt(K::CRD).await {
            Ok(Some(crd)) => Some(match serde_json::to_value(&crd) {
                Ok(v) => CrdSupport::from_crd(&v),
                Err(_) => CrdSupport::ALL,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, crd = K::CRD, kind = K::KIND, "cannot read the route CRD; assuming it keeps rule names and mirror percent");
                Some(CrdSupport::ALL)
            }
        };
        self.crd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(K::CRD, (Instant::now(), support));
        support
    }
}

/// The engine's options: the platform's `--allow-free-form-promql` reaches the engine too, so
/// a gate that validation accepts is also evaluated (not refused at query time).
pub fn engine_options(allow_free_form_promql: bool) -> EngineOptions {
    EngineOptions {
        allow_inline_promql_in_namespaced: allow_free_form_promql,
        ..EngineOptions::default()
    }
}

/// A reconcile that did not complete; retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Leadership lost before a write, the Rollout without a namespace, or its status write
    /// failed.
    #[error(transparent)]
    Failure(ReconcileFailure),
    /// Reading an object failed.
    #[error("reading {what} for Rollout {rollout}: {source}; retrying")]
    Read {
        /// What was read.
        what: String,
        /// `<namespace>/<name>` of the Rollout.
        rollout: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Writing the route failed.
    #[error("writing the route: {0}")]
    Route(WriteError),
    /// The route changed between the read and the write so that the edit no longer applies.
    #[error("editing the route for Rollout {rollout}: {source}")]
    Edit {
        /// `<namespace>/<name>` of the Rollout.
        rollout: String,
        /// Why the edit failed.
        #[source]
        source: EditError,
    },
    /// The route changed after it was read for the decision; the decision is not carried out.
    #[error(
        "{kind} {route} changed after Rollout {rollout} read it (resourceVersion {read} is stale); deciding again from the new route"
    )]
    RouteChanged {
        /// Route kind.
        kind: &'static str,
        /// Route name.
        route: String,
        /// `<namespace>/<name>` of the Rollout.
        rollout: String,
        /// The resourceVersion the decision was made from.
        read: String,
    },
    /// Adding or removing the finalizer failed.
    #[error("updating the finalizer of Rollout {rollout}: {source}")]
    Finalizer {
        /// `<namespace>/<name>` of the Rollout.
        rollout: String,
        /// Write error.
        #[source]
        source: WriteError,
    },
}

sluice_runtime::reconcile_failures!(ReconcileError::Failure);

impl Categorized for ReconcileError {
    fn category(&self) -> Category {
        match self {
            ReconcileError::Failure(e) => e.category(),
            ReconcileError::Read { source, .. } => Category::of_kube(source),
            ReconcileError::Route(e) | ReconcileError::Finalizer { source: e, .. } => e.category(),
            ReconcileError::Edit { .. } | ReconcileError::RouteChanged { .. } => Category::Conflict,
        }
    }
}

fn read_err(what: impl Into<String>, rollout: &str) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    let rollout = rollout.to_owned();
    move |source| ReconcileError::Read {
        what,
        rollout,
        source,
    }
}

/// Adds or removes [`FINALIZER`]: read-modify-write under [`FIELD_MANAGER`], re-read on a 409.
// Not `kube::runtime::finalizer`: its JSON patches carry no field manager (the entry would be
// owned by a manager named after the client's User-Agent, not this operator's one manager), and
// its `test` of the cached finalizer list (by index, on removal) turns a list changed since the
// watch read it into a failed reconcile (422, `Rejected`, back-off; on deletion the hand-back
// runs again) instead of a re-read.
async fn set_finalizer(
    api: &Api<Rollout>,
    name: &str,
    key: &str,
    present: bool,
) -> Result<(), ReconcileError> {
    write::update_with_retry(
        api,
        FIELD_MANAGER,
        name,
        RetryPolicy::default(),
        |r: &mut Rollout| {
            let list = r.metadata.finalizers.get_or_insert_with(Vec::new);
            let has = list.iter().any(|f| f == FINALIZER);
            if has == present {
                return false;
            }
            if present {
                list.push(FINALIZER.to_owned());
            } else {
                list.retain(|f| f != FINALIZER);
            }
            true
        },
    )
    .await
    .map(|_| ())
    .map_err(|source| ReconcileError::Finalizer {
        rollout: key.to_owned(),
        source,
    })
}

/// Whether the canary workload is ready, and its version (the pod template's hash).
async fn canary_workload(
    ctx: &Context,
    ns: &str,
    obj: &Rollout,
    key: &str,
) -> Result<(bool, Option<String>), ReconcileError> {
    let w = &obj.spec.canary_workload;
    let (group, version) = match w.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", w.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &w.kind);
    let plural = format!("{}s", w.kind.to_ascii_lowercase());
    let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
    let got = api
        .get_opt(&w.name)
        .await
        .map_err(read_err(format!("{} {}", w.kind, w.name), key))?;
    Ok(match got {
        Some(o) => {
            let v = serde_json::to_value(&o).unwrap_or_default();
            (observe::workload_ready(&v), observe::workload_version(&v))
        }
        None => (false, None),
    })
}

/// The pre-change baselines of `checks` for the current change: those kept in status for it,
/// and the missing ones captured now over the window ending at the change's start (one query per
/// template). Returns the baselines to keep and a problem per gate whose baseline could not be
/// captured (that gate stays Inconclusive, so its policy applies, and the Rollout is not Ready).
async fn pre_change_baselines(
    ctx: &Context,
    status: &RolloutStatus,
    checks: &mut [sluice_analysis::GateCheck],
) -> (Vec<sluice_api::v1alpha1::CapturedBaseline>, Vec<String>) {
    let Some(start) = crate::baseline::change_start(status) else {
        return (status.captured_baselines.clone(), Vec::new());
    };
    let (mut kept, missing) = crate::baseline::attach(checks, &status.captured_baselines, start);
    let mut problems = Vec::new();
    let Some(engine) = ctx.baselines.as_ref().filter(|_| !missing.is_empty()) else {
        return (kept, problems);
    };
    let wanted: Vec<_> = missing.iter().map(|&i| checks[i].clone()).collect();
    let captured = engine
        .capture_baselines(&wanted, start, (ctx.clock)())
        .await;
    for (&i, result) in missing.iter().zip(captured) {
        match result {
            Ok(b) => {
                checks[i].captured_baseline = Some(b.clone());
                kept.push(b);
            }
            Err(e) => problems.push(format!(
                "spec.gates {}: comparison.relative.baseline PreChangeWindow: no baseline captured before the change began ({e})",
                checks[i].gate.name
            )),
        }
    }
    (kept, problems)
}

/// Whether the canary Service exists in the Rollout's namespace.
async fn canary_service(
    ctx: &Context,
    ns: &str,
    obj: &Rollout,
    key: &str,
) -> Result<bool, ReconcileError> {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    let name = &obj.spec.canary_service.name;
    Ok(api
        .get_opt(name)
        .await
        .map_err(read_err(format!("Service {name}"), key))?
        .is_some())
}

/// The GateTemplates the Rollout's gates reference (a missing one is absent), from the cache
/// once its watch has listed them, else read one by one.
async fn templates(
    ctx: &Context,
    obj: &Rollout,
    key: &str,
) -> Result<HashMap<String, GateTemplateSpec>, ReconcileError> {
    let mut out = HashMap::new();
    if let Some((cache, _)) = ctx
        .gate_templates
        .as_ref()
        .filter(|(_, listed)| listed.load(Ordering::Acquire))
    {
        for name in obj
            .spec
            .gates
            .iter()
            .filter_map(|g| g.template_ref.as_ref())
        {
            if let Some(t) = cache.get(&ObjectRef::new(name)) {
                out.insert(name.clone(), t.spec.clone());
            }
        }
        return Ok(out);
    }
    let api: Api<GateTemplate> = Api::all(ctx.client.clone());
    for g in &obj.spec.gates {
        if let Some(name) = &g.template_ref
            && !out.contains_key(name)
            && let Some(t) = api
                .get_opt(name)
                .await
                .map_err(read_err(format!("GateTemplate {name}"), key))?
        {
            out.insert(name.clone(), t.spec);
        }
    }
    Ok(out)
}

/// The outcome of a route write.
struct Written<R> {
    route: R,
    changed: bool,
}

/// Brings the route's owned parts to `desired`, only if the route is still at `read` (the
/// resourceVersion the decision was made from): a route rewritten in between (by a BundlePin,
/// by a person) is decided on again, never overwritten blindly.
#[allow(clippy::too_many_arguments)]
async fn write_route<K: Driven>(
    leadership: &Leadership,
    api: &Api<K::Route>,
    route_name: &str,
    read: Option<&K::Route>,
    target: &Target,
    desired: &Desired,
    crd: CrdSupport,
    key: &str,
) -> Result<Option<Written<K::Route>>, ReconcileError> {
    let mut edit_error = None;
    let mut foreign = false;
    let mut changed_since_read = false;
    leadership.ensure()?;
    let dt = K::dynamic_type();
    let mut edit = |r: &mut K::Route| {
        edit_error = None;
        foreign = false;
        if route::owner(r).is_some_and(|o| *o != target.owner) {
            foreign = true;
            return false;
        }
        match K::apply(r, target, desired, crd) {
            Ok(next) if next == *r => false,
            Ok(next) => {
                *r = next;
                true
            }
            Err(e) => {
                edit_error = Some(e);
                false
            }
        }
    };
    let result = match read {
        // The route as this reconcile read it (or last wrote it): edited and written in one
        // request, fenced by its resourceVersion; a 409 means it changed since.
        Some(read) => {
            match write::replace_as_read_with(api, &dt, FIELD_MANAGER, read, &mut edit).await {
                Err(WriteError::Stale { .. }) => {
                    changed_since_read = true;
                    Ok(Updated::Unchanged(read.clone()))
                }
                other => other,
            }
        }
        // Not read (absent then): whatever exists now was not what the decision saw.
        None => {
            write::update_with_retry_with(
                api,
                &dt,
                FIELD_MANAGER,
                route_name,
                RetryPolicy::default(),
                |_| {
                    changed_since_read = true;
                    false
                },
            )
            .await
        }
    };
    if let Some(source) = edit_error {
        return Err(ReconcileError::Edit {
            rollout: key.to_owned(),
            source,
        });
    }
    if foreign {
        return Ok(None);
    }
    if changed_since_read {
        return Err(ReconcileError::RouteChanged {
            kind: K::KIND,
            route: route_name.to_owned(),
            rollout: key.to_owned(),
            read: read
                .and_then(|r| r.meta().resource_version.clone())
                .unwrap_or_default(),
        });
    }
    match result {
        Ok(Updated::Unchanged(route)) => Ok(Some(Written {
            route,
            changed: false,
        })),
        Ok(Updated::Written { object, .. }) => Ok(Some(Written {
            route: object,
            changed: true,
        })),
        Err(e) => Err(ReconcileError::Route(e)),
    }
}

/// Hands route `route_name` back if `me` owns it: the ownership annotation and this manager's
/// managedFields entry removed, nothing else.
pub(crate) async fn hand_back<K: Driven>(
    leadership: &Leadership,
    api: &Api<K::Route>,
    route_name: &str,
    me: &str,
) -> Result<(), ReconcileError> {
    leadership.ensure()?;
    let result = write::update_with_retry_with(
        api,
        &K::dynamic_type(),
        FIELD_MANAGER,
        route_name,
        RetryPolicy::default(),
        |r: &mut K::Route| {
            if route::owner(r).is_none_or(|o| o != me) {
                return false;
            }
            let mut next = route::without_owner(r);
            let kept: Vec<ManagedFieldsEntry> = next
                .meta_mut()
                .managed_fields
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e.manager.as_deref() != Some(FIELD_MANAGER.as_str()))
                .collect();
            // An empty list would leave managedFields as they were; one empty entry clears them.
            next.meta_mut().managed_fields = Some(if kept.is_empty() {
                vec![ManagedFieldsEntry::default()]
            } else {
                kept
            });
            *r = next;
            true
        },
    )
    .await;
    match result {
        Ok(_) => Ok(()),
        Err(WriteError::Api {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Ok(()),
        Err(e) => Err(ReconcileError::Route(e)),
    }
}

/// Aborts on the route the weights were written to (`old`: that route's Services) and hands
/// it back: the canary it was written for gets weight 0 and the cohort and mirror rules go,
/// then the ownership annotation and this manager's entry. Nothing to do on a route that is
/// gone or not ours; an abort that no longer applies (its managed rule is gone) still lets the
/// hand-back happen.
async fn release<K: Driven>(
    leadership: &Leadership,
    api: &Api<K::Route>,
    route_name: &str,
    old: &Target,
    abort: bool,
    crd: CrdSupport,
    key: &str,
) -> Result<(), ReconcileError> {
    let Some(route) = api
        .get_opt(route_name)
        .await
        .map_err(read_err(K::describe(route_name), key))?
    else {
        return Ok(());
    };
    let ours = route::owner(&route) == Some(&old.owner);
    if !ours {
        return Ok(());
    }
    if !abort {
        return hand_back::<K>(leadership, api, route_name, &old.owner).await;
    }
    match write_route::<K>(
        leadership,
        api,
        route_name,
        Some(&route),
        old,
        &Desired::abort(),
        crd,
        key,
    )
    .await
    {
        Ok(_) => {}
        Err(ReconcileError::Edit { source, .. }) => {
            tracing::warn!(error = %source, route = route_name, "the abort before release does not apply; handing the route back as it is");
        }
        Err(e) => return Err(e),
    }
    hand_back::<K>(leadership, api, route_name, &old.owner).await
}

/// [`release`] on a route of kind `K` other than the Rollout's own (its `routeRef.kind` changed):
/// nothing to do when that kind's CRD is not installed.
async fn release_of<K: Driven>(
    ctx: &Context,
    ns: &str,
    route_name: &str,
    old: &Target,
    abort: bool,
    key: &str,
) -> Result<(), ReconcileError> {
    let Some(crd) = ctx.crd_support::<K>().await else {
        return Ok(());
    };
    let api = K::api(ctx.client.clone(), Some(ns));
    release::<K>(&ctx.leadership, &api, route_name, old, abort, crd, key).await
}

/// The figures and log line of an abort's revert, once every route is reverted.
fn reverted_log(ctx: &Context, status: &RolloutStatus, r: record::Reverted) {
    ctx.metrics.reverted(r.from_first_failure, r.from_decision);
    tracing::info!(
        reason = ?status.abort.as_ref().map(|a| a.reason),
        detect_to_revert_ms = record::millis(r.from_decision),
        routes = 1 + status.additional_owned_routes.len(),
        "route reverted: canary weight 0, cohort and mirror rules removed"
    );
}

/// Whether this decision reverts the route of an abort not yet carried out: its route write then
/// goes first.
fn reverts_first(actions: &[Action], next: &RolloutStatus) -> bool {
    next.phase == RolloutPhase::Aborted
        && next
            .abort
            .as_ref()
            .is_some_and(|a| a.route_reverted_at.is_none())
        && actions
            .iter()
            .any(|a| matches!(a, Action::WriteRoute(d) if *d == Desired::abort()))
}

/// Records an abort decided from `obj` (its route already reverted, or its route write failed).
/// When a newer Rollout is stored (this operator's own last status write not yet seen), the abort
/// is recorded on that one, as long as its spec, phase and step are the ones the abort was decided
/// from: what changed in between is this operator's own bookkeeping of the same step, which the
/// abort supersedes. Otherwise `false`: the newer Rollout is to be decided again at once.
async fn record_abort(
    api: &Api<Rollout>,
    obj: &Rollout,
    status: &RolloutStatus,
) -> Result<bool, ReconcileError> {
    match write::apply_status(api, FIELD_MANAGER, obj, status).await {
        Ok(_) => return Ok(true),
        Err(WriteError::Stale { .. }) => {}
        Err(e) => return Err(ReconcileFailure::status::<Rollout>(e).into()),
    }
    let newer = api
        .get(&obj.name_any())
        .await
        .map_err(|source| ReconcileError::Read {
            what: "the Rollout, to record its abort".into(),
            rollout: format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
            source,
        })?;
    let place = |r: &Rollout| r.status.as_ref().map(|s| (s.phase, s.current_step_index));
    if newer.metadata.generation != obj.metadata.generation || place(&newer) != place(obj) {
        tracing::info!("the Rollout changed while its route was reverted; deciding again");
        return Ok(false);
    }
    match write::apply_status(api, FIELD_MANAGER, &newer, status).await {
        Ok(_) => Ok(true),
        Err(WriteError::Stale { .. }) => Ok(false),
        Err(e) => Err(ReconcileFailure::status::<Rollout>(e).into()),
    }
}

fn same_status(a: Option<&RolloutStatus>, b: &RolloutStatus) -> bool {
    // Compared as stored: times are kept to the second.
    serde_json::to_value(a.cloned().unwrap_or_default()).ok() == serde_json::to_value(b).ok()
}

/// Resolves when the running controller's store holds a newer generation of the Rollout asking
/// for a manual control the status has not acted on; never, without a store.
async fn control_arrives(
    rollouts: &RolloutStore,
    ns: &str,
    name: &str,
    obj: &Rollout,
    status: &RolloutStatus,
) {
    let at = ObjectRef::new(name).within(ns);
    loop {
        tokio::time::sleep(CONTROL_POLL).await;
        // Read each time: a reconcile started late in one term may wait into the next.
        if let Some(now) = rollouts.current().and_then(|store| store.get(&at))
            && now.metadata.generation != obj.metadata.generation
            && analysis::control_pending(&now.spec, status)
        {
            return;
        }
    }
}

/// One of `spec.additionalRoutes` as this reconcile read it, of route kind `K`.
struct Additional<K: Driven> {
    name: String,
    routes: Api<K::Route>,
    target: Target,
    crd: CrdSupport,
    /// The route as read, then as last written (absent: missing, or its CRD not installed).
    latest: Option<K::Route>,
}

impl<K: Driven> Additional<K> {
    /// Reads route `r` (of kind `K`) as the primary is read: its CRD installed, the route, and
    /// the state machine's view of it against its own managed rule; with `with_others` (a step
    /// mirrors), also the namespace's routes of its kind its mirror rule competes with.
    async fn read(
        ctx: &Context,
        ns: &str,
        spec: &sluice_api::v1alpha1::RolloutSpec,
        r: &sluice_api::v1alpha1::rollout::RouteRef,
        primary: &Target,
        with_others: bool,
        key: &str,
    ) -> Result<(Self, RouteObs), ReconcileError> {
        let target = Target {
            rule_name: r.rule_name.clone(),
            ..primary.clone()
        };
        let routes = K::api(ctx.client.clone(), Some(ns));
        let installed = ctx.crd_support::<K>().await;
        let not_installed = installed
            .is_none()
            .then(|| K::not_installed(&r.name))
            .flatten();
        let crd = installed.unwrap_or(CrdSupport::ALL);
        let latest = match not_installed {
            Some(_) => None,
            None => routes
                .get_opt(&r.name)
                .await
                .map_err(read_err(K::describe(&r.name), key))?,
        };
        let others = match &latest {
            Some(_) if with_others => {
                routes
                    .list(&Default::default())
                    .await
                    .map_err(read_err(format!("{}s in {ns}", K::KIND), key))?
                    .items
            }
            _ => Vec::new(),
        };
        let obs = match (&latest, not_installed) {
            (_, Some(obs)) => obs,
            (None, None) => K::missing(&r.name),
            (Some(route), None) => K::observe(route, &others, &target, spec, crd),
        };
        let me = Self {
            name: r.name.clone(),
            routes,
            target,
            crd,
            latest,
        };
        Ok((me, obs))
    }

    /// Brings the route's owned parts to `desired`, fenced by the resourceVersion read (or last
    /// written); the outcome to record, `None` when there is nothing to write (the route missing,
    /// or owned by another Rollout).
    async fn write(
        &mut self,
        ctx: &Context,
        desired: &Desired,
        key: &str,
    ) -> Result<Option<Outcome>, ReconcileError> {
        let Some(read) = self.latest.as_ref() else {
            return Ok(None);
        };
        let in_place = route::owner(read) == Some(&self.target.owner)
            && K::apply(read, &self.target, desired, self.crd).as_ref() == Ok(read);
        let written = if in_place {
            Some(Written {
                route: read.clone(),
                changed: false,
            })
        } else {
            write_route::<K>(
                &ctx.leadership,
                &self.routes,
                &self.name,
                Some(read),
                &self.target,
                desired,
                self.crd,
                key,
            )
            .await?
        };
        let Some(w) = written else { return Ok(None) };
        ctx.metrics
            .route_write(if w.changed { "Written" } else { "Unchanged" });
        let outcome = Outcome::AdditionalRouteWritten {
            kind: kind_name::<K>(),
            name: self.name.clone(),
            resource_version: w.route.meta().resource_version.clone(),
            at: (ctx.clock)(),
            abort: *desired == Desired::abort(),
        };
        self.latest = Some(w.route);
        Ok(Some(outcome))
    }

    async fn hand_back(&self, ctx: &Context) -> Result<(), ReconcileError> {
        if self.latest.is_none() {
            return Ok(());
        }
        hand_back::<K>(
            &ctx.leadership,
            &self.routes,
            &self.name,
            &self.target.owner,
        )
        .await
    }
}

/// The kind name of route kind `K`.
fn kind_name<K: RouteKind>() -> RouteKindName {
    if K::KIND == Grpc::KIND {
        RouteKindName::GrpcRoute
    } else {
        RouteKindName::HttpRoute
    }
}

/// An additional route of either kind.
enum AnyAdditional {
    Http(Additional<Http>),
    Grpc(Additional<Grpc>),
}

impl AnyAdditional {
    /// Reads every one of `spec.additionalRoutes`, in order, with what the state machine sees
    /// (`with_others`: as [`Additional::read`]).
    async fn read_all(
        ctx: &Context,
        ns: &str,
        spec: &sluice_api::v1alpha1::RolloutSpec,
        primary: &Target,
        with_others: bool,
        key: &str,
    ) -> Result<(Vec<Self>, Vec<crate::decide::AdditionalRouteObs>), ReconcileError> {
        let mut routes = Vec::new();
        let mut seen = Vec::new();
        for r in &spec.additional_routes {
            let (route, obs) = match r.kind {
                RouteKindName::HttpRoute => {
                    let (a, o) =
                        Additional::<Http>::read(ctx, ns, spec, r, primary, with_others, key)
                            .await?;
                    (AnyAdditional::Http(a), o)
                }
                RouteKindName::GrpcRoute => {
                    let (a, o) =
                        Additional::<Grpc>::read(ctx, ns, spec, r, primary, with_others, key)
                            .await?;
                    (AnyAdditional::Grpc(a), o)
                }
            };
            routes.push(route);
            seen.push(crate::decide::AdditionalRouteObs {
                kind: r.kind,
                name: r.name.clone(),
                route: obs,
            });
        }
        Ok((routes, seen))
    }

    async fn write(
        &mut self,
        ctx: &Context,
        desired: &Desired,
        key: &str,
    ) -> Result<Option<Outcome>, ReconcileError> {
        match self {
            AnyAdditional::Http(a) => a.write(ctx, desired, key).await,
            AnyAdditional::Grpc(a) => a.write(ctx, desired, key).await,
        }
    }

    async fn hand_back(&self, ctx: &Context) -> Result<(), ReconcileError> {
        match self {
            AnyAdditional::Http(a) => a.hand_back(ctx).await,
            AnyAdditional::Grpc(a) => a.hand_back(ctx).await,
        }
    }
}

/// Reconciles one Rollout, on the kind of route its `spec.routeRef.kind` names.
#[tracing::instrument(skip_all, fields(kind = "Rollout", namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(
    obj: Arc<Rollout>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    match obj.spec.route_ref.kind {
        RouteKindName::HttpRoute => reconcile_on::<Http>(obj, ctx).await,
        RouteKindName::GrpcRoute => reconcile_on::<Grpc>(obj, ctx).await,
    }
}

/// [`reconcile`] on a route of kind `K`.
async fn reconcile_on<K: Driven>(
    obj: Arc<Rollout>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    let ns = ReconcileFailure::namespace_of(obj.as_ref())?;
    let name = obj.name_any();
    let key = format!("{ns}/{name}");
    let api: Api<Rollout> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = obj.metadata.deletion_timestamp.is_some();
    let has_finalizer = obj.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(ControllerAction::await_change());
    }
    if !deleting && !has_finalizer {
        // Before the route is ever touched, so deleting the Rollout always hands it back.
        set_finalizer(&api, &name, &key, true).await?;
        return Ok(ControllerAction::await_change());
    }

    // Observations.
    let target = observe::target(&obj.spec, &ns, &name);
    let routes = K::api(ctx.client.clone(), Some(&ns));
    let installed = ctx.crd_support::<K>().await;
    let not_installed = installed
        .is_none()
        .then(|| K::not_installed(&obj.spec.route_ref.name))
        .flatten();
    let crd = installed.unwrap_or(CrdSupport::ALL);
    let route = match not_installed {
        // No such resource to read: the condition says why.
        Some(_) => None,
        None => routes
            .get_opt(&obj.spec.route_ref.name)
            .await
            .map_err(read_err(K::describe(&obj.spec.route_ref.name), &key))?,
    };
    // A mirror rule competes with every route on the same parent and hostname: the namespace's
    // routes are read only when a step mirrors.
    let with_others = !deleting && obj.spec.steps.iter().any(|s| s.mirror.is_some());
    let others = match &route {
        Some(_) if with_others => {
            routes
                .list(&Default::default())
                .await
                .map_err(read_err(format!("{}s in {ns}", K::KIND), &key))?
                .items
        }
        _ => Vec::new(),
    };
    let route_obs = match (&route, not_installed) {
        (_, Some(obs)) => obs,
        (None, None) => K::missing(&obj.spec.route_ref.name),
        (Some(r), None) => K::observe(r, &others, &target, &obj.spec, crd),
    };
    let (mut additional, additional_obs) =
        AnyAdditional::read_all(&ctx, &ns, &obj.spec, &target, with_others, &key).await?;
    let current = obj.status.clone().unwrap_or_default();
    // Readiness before any live weight; the version whenever a plan runs (a new version
    // restarts it).
    let (canary_ready, canary_version) = match current.phase {
        RolloutPhase::Invalid => (None, None),
        _ if deleting => (None, None),
        _ => {
            let (ready, version) = canary_workload(&ctx, &ns, &obj, &key).await?;
            (Some(ready), version)
        }
    };
    let canary_service = match current.phase {
        RolloutPhase::Pending
        | RolloutPhase::WaitingForCanary
        | RolloutPhase::Progressing
        | RolloutPhase::Paused
            if !deleting =>
        {
            Some(canary_service(&ctx, &ns, &obj, &key).await?)
        }
        _ => None,
    };
    let mut obs = Observations {
        generation: obj.metadata.generation,
        route: route_obs,
        canary_ready,
        canary_version,
        canary_service,
        deleting,
        additional_routes: additional_obs,
        ..Observations::default()
    };
    let interval: Duration = obj
        .spec
        .analysis_interval
        .parse()
        .unwrap_or(Duration::from_secs(30));
    let analysing = !deleting
        && matches!(obs.route, RouteObs::Present(_))
        && analysis::wants_analysis(&obj.spec, &current);
    // A manual control is decided before any analysis: an abort during a metrics brownout is
    // carried out now, not after the queries' retries. Only a control that changes the phase or
    // the step counts (one the state machine holds, e.g. a promotion while paused, leaves the
    // analysis to run as usual).
    let controlled = analysis::control_pending(&obj.spec, &current)
        .then(|| {
            decide::decide(
                &obj.spec,
                obj.status.as_ref(),
                &obs,
                ctx.allow_free_form_promql,
                (ctx.clock)(),
            )
        })
        .filter(|d| {
            d.status.phase != current.phase
                || d.status.current_step_index != current.current_step_index
                || d.status.retries_handled != current.retries_handled
        });
    if controlled.is_some() {
        tracing::debug!("manual control decided before analysis");
    } else if analysing && let Some(analyzer) = &ctx.analyzer {
        let last = analyzer.last(&key).max(analysis::last_analysis(&current));
        if analysis::due(last, (ctx.clock)(), interval) {
            let analysed = async {
                let templates = templates(&ctx, &obj, &key).await?;
                let mut plan =
                    analysis::plan(&obj.spec, &current, (&ns, &name), &ctx.cluster, &templates);
                let (baselines, baseline_problems) =
                    pre_change_baselines(&ctx, &current, &mut plan.checks).await;
                let outcomes = analyzer.evaluate(&key, plan.checks.clone()).await;
                Ok::<_, ReconcileError>((plan, baselines, baseline_problems, outcomes))
            };
            let (plan, baselines, baseline_problems, outcomes) = tokio::select! {
                r = analysed => r?,
                () = control_arrives(&ctx.rollouts, &ns, &name, &obj, &current) => {
                    // The Rollout as it is now is reconciled next, control first.
                    tracing::info!("a manual control arrived while analysing; deciding it now");
                    return Ok(ControllerAction::requeue(Duration::ZERO));
                }
            };
            let mut found = analysis::findings(&plan, &outcomes, (ctx.clock)());
            found.problems.extend(baseline_problems);
            obs.baselines = Some(baselines);
            if let Some(s) = found.applied_share {
                ctx.metrics.share(s);
            }
            for (v, _) in &found.gates {
                ctx.metrics.verdict(v.verdict, v.reason);
            }
            obs.gates = found.gates;
            obs.applied_share = found.applied_share;
            obs.analysis_error = found.error;
            obs.config_problems = Some(found.problems);
        }
    } else if analysing {
        obs.analysis_error = Some("no metrics source is configured (--prometheus-url)".into());
    }

    // Decide.
    let now = (ctx.clock)();
    let decision = match controlled {
        Some(d) => d,
        None => decide::decide(
            &obj.spec,
            obj.status.as_ref(),
            &obs,
            ctx.allow_free_form_promql,
            now,
        ),
    };
    let mut status = decision.status.clone();
    // An abort reverts the route before anything else is written (see the module's order).
    let abort_first = !deleting && reverts_first(&decision.actions, &status);

    // 1. The decision, fenced by the resourceVersion it was made from.
    let mut stored = obj.as_ref().clone();
    if !deleting && !abort_first && !same_status(obj.status.as_ref(), &status) {
        stored = match write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &status).await {
            Ok(s) => s,
            // Decided from a Rollout older than the stored one (its own last status write not
            // yet in the watch): nothing was done, and the newer one is reconciled as soon as
            // the watch delivers it. Not a failure: no per-object back-off, which would leave
            // a busy Rollout unanalysed for minutes.
            Err(WriteError::Stale { .. }) => {
                tracing::debug!("decided from a stale Rollout; deciding again from the newer one");
                return Ok(ControllerAction::requeue(STALE_RETRY));
            }
            Err(e) => return Err(ReconcileFailure::status::<Rollout>(e).into()),
        };
        // The transition is recorded: tell whoever asked (an abort, a promotion).
        if let Some(n) = crate::notice::notice(obj.status.as_ref(), &status) {
            ctx.notifier.notify(obj.as_ref(), n);
        }
    }

    // 2. The route.
    let mut route_changed = false;
    // An abort's first failed route write: the other routes are reverted all the same, the
    // abort recorded, then this returned.
    let mut failed: Option<ReconcileError> = None;
    // Later writes of the same decision build on the route the earlier ones left.
    let mut latest = route.clone();
    for action in &decision.actions {
        match action {
            Action::WriteRoute(d) => {
                // The route already in that state (the common case between steps): no request.
                let in_place = latest.as_ref().filter(|r| {
                    route::owner(*r) == Some(&target.owner)
                        && K::apply(r, &target, d, crd).as_ref() == Ok(*r)
                });
                let written = match in_place {
                    Some(r) => Ok(Some(Written {
                        route: r.clone(),
                        changed: false,
                    })),
                    // routeRef was not read (gone, or its kind not installed): only a deletion
                    // decides a write then, for the additional routes alone.
                    None if route.is_none() => Ok(None),
                    None => {
                        write_route::<K>(
                            &ctx.leadership,
                            &routes,
                            &obj.spec.route_ref.name,
                            latest.as_ref(),
                            &target,
                            d,
                            crd,
                            &key,
                        )
                        .await
                    }
                };
                let written = match written {
                    Ok(w) => w,
                    Err(ReconcileError::Edit { source, .. }) if deleting => {
                        // The abort before hand-back cannot apply to this route (its managed
                        // rule is gone): hand it back as it is rather than keep it locked.
                        tracing::warn!(error = %source, "the abort before hand-back does not apply; handing the route back as it is");
                        None
                    }
                    Err(e) if abort_first => {
                        // No atomic write across routes: every other route is still reverted.
                        ctx.metrics.route_write("Failed");
                        failed.get_or_insert(e);
                        None
                    }
                    Err(e) => {
                        ctx.metrics.route_write("Failed");
                        return Err(e);
                    }
                };
                if let Some(w) = written {
                    latest = Some(w.route.clone());
                    ctx.metrics
                        .route_write(if w.changed { "Written" } else { "Unchanged" });
                    if w.changed {
                        ctx.metrics.weight_written(d.weight);
                        route_changed = true;
                    }
                    let outcome = Outcome::RouteWritten {
                        resource_version: w.route.meta().resource_version.clone(),
                        at: (ctx.clock)(),
                        abort: *d == Desired::abort(),
                    };
                    if let Some(r) = record::record(&mut status, &outcome) {
                        reverted_log(&ctx, &status, r);
                    }
                }
                // Every additional route takes the same parts, each written on its own: a
                // failure on one leaves the others written (retried from the status).
                for extra in &mut additional {
                    match extra.write(&ctx, d, &key).await {
                        Ok(Some(outcome)) => {
                            if let Some(r) = record::record(&mut status, &outcome) {
                                reverted_log(&ctx, &status, r);
                            }
                        }
                        Ok(None) => {}
                        Err(ReconcileError::Edit { source, .. }) if deleting => {
                            tracing::warn!(error = %source, "the abort before hand-back does not apply to an additional route; handing it back as it is");
                        }
                        Err(e) => {
                            ctx.metrics.route_write("Failed");
                            tracing::warn!(error = %e, "an additional route's write failed; the other routes are written");
                            failed.get_or_insert(e);
                        }
                    }
                }
            }
            Action::HandBack => {
                // routeRef not read (gone, or its kind not installed): nothing there to hand back.
                if route.is_some() {
                    hand_back::<K>(
                        &ctx.leadership,
                        &routes,
                        &obj.spec.route_ref.name,
                        &target.owner,
                    )
                    .await?;
                }
                for extra in &additional {
                    extra.hand_back(&ctx).await?;
                }
            }
            Action::Release {
                kind,
                route,
                rule_name,
                stable,
                canary,
                abort,
            } => {
                let old = Target {
                    owner: target.owner.clone(),
                    stable: stable
                        .clone()
                        .unwrap_or_else(|| obj.spec.stable_service.name.clone()),
                    canary: canary
                        .clone()
                        .unwrap_or_else(|| obj.spec.canary_service.name.clone()),
                    canary_port: None,
                    rule_name: rule_name.clone(),
                    zero_other_backends: false,
                };
                match kind {
                    k if k.as_str() == K::KIND => {
                        release::<K>(&ctx.leadership, &routes, route, &old, *abort, crd, &key)
                            .await?
                    }
                    // routeRef.kind changed: the old route is of the other kind.
                    RouteKindName::HttpRoute => {
                        release_of::<Http>(&ctx, &ns, route, &old, *abort, &key).await?
                    }
                    RouteKindName::GrpcRoute => {
                        release_of::<Grpc>(&ctx, &ns, route, &old, *abort, &key).await?
                    }
                }
                ctx.metrics.route_write("Released");
                // An additional route's release forgets its own entry only.
                let primary = status
                    .owned_route
                    .as_ref()
                    .is_some_and(|o| crate::decide::is_route(o, *kind, route));
                let additional = status
                    .additional_owned_routes
                    .iter()
                    .any(|o| crate::decide::is_route(o, *kind, route));
                let outcome = if additional && !primary {
                    Outcome::AdditionalReleased {
                        kind: *kind,
                        name: route.clone(),
                    }
                } else {
                    Outcome::Released
                };
                record::record(&mut status, &outcome);
            }
            Action::Event(_) => {}
        }
    }
    if let Some(e) = failed {
        if abort_first {
            // The abort is recorded all the same, with the routes that did revert, so it is
            // retried from the status rather than decided again on the next analysis tick.
            if let Err(record) = record_abort(&api, &obj, &status).await {
                tracing::warn!(error = %record, "could not record the abort whose route write failed");
            }
        }
        return Err(e);
    }
    let was_verified = current
        .abort
        .as_ref()
        .is_some_and(|a| a.revert_verified_at.is_some());
    if !was_verified
        && let Some(a) = status.abort.as_ref()
        && let (Some(rev), Some(ver)) = (&a.route_reverted_at, &a.revert_verified_at)
    {
        ctx.metrics
            .revert_verified(ver.0.duration_since(rev.0).unsigned_abs());
    }
    if current.abort.is_none()
        && let Some(a) = &status.abort
    {
        ctx.metrics.abort(&format!("{:?}", a.reason));
    }

    // 3. What the route write left behind, fenced by the first write (for an abort, the one
    // status write: the decision and the revert together).
    if !deleting && !same_status(stored.status.as_ref(), &status) {
        if abort_first {
            if !record_abort(&api, &obj, &status).await? {
                return Ok(ControllerAction::requeue(Duration::ZERO));
            }
            if let Some(n) = crate::notice::notice(obj.status.as_ref(), &status) {
                ctx.notifier.notify(obj.as_ref(), n);
            }
        } else {
            write::apply_status(&api, FIELD_MANAGER, &stored, &status)
                .await
                .map_err(ReconcileFailure::status::<Rollout>)?;
        }
    }

    // 4. Events and one log line per transition, only after the writes succeeded.
    for notice in decision.actions.iter().filter_map(Action::notice) {
        tracing::info!(
            reason = notice.reason,
            action = notice.action,
            phase = ?status.phase,
            step = status.current_step_index,
            desired_weight = status.desired_weight,
            applied_share = status.applied_share,
            route_changed,
            "{}",
            notice.note
        );
        ctx.recorder.announce(obj.as_ref(), notice).await;
    }

    if deleting {
        // Every hand-back above succeeded (errors returned early): let the deletion finish.
        set_finalizer(&api, &name, &key, false).await?;
        if let Some(a) = &ctx.analyzer {
            a.forget(&key);
        }
        return Ok(ControllerAction::await_change());
    }

    let mut requeue = decision.requeue.after();
    if ctx.analyzer.is_some()
        && status.phase != RolloutPhase::Invalid
        && analysis::wants_analysis(&obj.spec, &status)
    {
        let next = analysis::until_next_slot((ctx.clock)(), interval);
        requeue = Some(requeue.map_or(next, |r| r.min(next)));
    }
    Ok(match requeue {
        None => ControllerAction::await_change(),
        Some(d) => ControllerAction::requeue(d),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};

    /// Rollout `shop/checkout` at `generation`, asking for an abort when `abort`.
    fn rollout(generation: i64, abort: bool) -> Rollout {
        let spec = serde_json::from_value(serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "abort": abort,
            "steps": [{"setWeight": {"weight": 1, "duration": "2m"}}]
        }))
        .expect("Rollout spec fixture");
        let mut r = Rollout::new("checkout", spec);
        r.metadata.namespace = Some("shop".into());
        r.metadata.generation = Some(generation);
        r
    }

    #[tokio::test]
    async fn a_manual_abort_reaches_a_waiting_reconcile_through_the_store_of_the_current_term() {
        let rollouts = RolloutStore::default();
        // The first term's controller published its store, then this replica lost the Lease
        // and led again: the second term's controller published a new store.
        let (first, mut first_writer) = reflector::store::<Rollout>();
        rollouts.publish(first);
        first_writer.apply_watcher_event(&watcher::Event::Apply(rollout(1, false)));
        let (second, mut second_writer) = reflector::store::<Rollout>();
        rollouts.publish(second);

        let obj = rollout(1, false);
        let status = RolloutStatus {
            phase: RolloutPhase::Progressing,
            ..RolloutStatus::default()
        };
        // The abort arrives in the second term: only its store sees it.
        second_writer.apply_watcher_event(&watcher::Event::Apply(rollout(2, true)));
        tokio::time::timeout(
            Duration::from_secs(5),
            control_arrives(&rollouts, "shop", "checkout", &obj, &status),
        )
        .await
        .expect("the wait gives way to the abort the current store holds");
    }

    #[tokio::test]
    async fn without_a_newer_generation_asking_for_a_control_the_wait_goes_on() {
        let rollouts = RolloutStore::default();
        let (store, mut writer) = reflector::store::<Rollout>();
        rollouts.publish(store);
        writer.apply_watcher_event(&watcher::Event::Apply(rollout(2, false)));
        let status = RolloutStatus {
            phase: RolloutPhase::Progressing,
            ..RolloutStatus::default()
        };
        let waited = tokio::time::timeout(
            CONTROL_POLL * 5,
            control_arrives(&rollouts, "shop", "checkout", &rollout(1, false), &status),
        )
        .await;
        assert!(waited.is_err(), "no control was asked for");
    }

    #[test]
    fn the_free_form_promql_flag_reaches_the_engine() {
        assert!(engine_options(true).allow_inline_promql_in_namespaced);
        assert!(!engine_options(false).allow_inline_promql_in_namespaced);
        assert_eq!(
            engine_options(true).cluster_label,
            EngineOptions::default().cluster_label
        );
    }
}
