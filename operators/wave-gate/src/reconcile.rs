//! The I/O side of sluice-wave-gate: reads what `decide` needs (the ApplicationSet and its
//! Applications, the BundlePins, the drift signal, the wave's gates, other sites' progress),
//! writes the status it returns (server-side apply fenced by resourceVersion), then carries out
//! its actions (Events, the ApplicationSet refresh nudge, BundlePins).
//!
//! Owns the order of effects: status first, actions only after the status write succeeded, so
//! a deposed leader whose write is refused publishes nothing and pins nothing. Refuses to write
//! a status whose decision list misses a cluster once the list was published. Must never decide
//! anything, and never writes an Argo CD object beyond the refresh annotation.
//!
//! Writes the status as `decide` returned it (the apply body only names dropped fields as nulls):
//! what the actions leave behind (pins created or deleted) is observed from the caches on the
//! next reconcile, never folded into the status here. Holds no finalizer: the pins carry the
//! WaveGate's ownerReference, so deleting it leaves their deletion to the garbage collector.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action as ControllerAction,
};
use sluice_analysis::{Engine, Observation, PrometheusSource, action as gate_action};
use sluice_api::{
    external::argocd::{Application, ApplicationSet},
    v1alpha1::{
        BundlePin, GateTemplate, WaveGate, WaveGateSpec, WaveGateStatus, wave_gate::WaveState,
    },
};
use sluice_runtime::{
    Categorized, Category, error::ReconcileFailure, events::EventRecorder, leader::Leadership,
    write,
};

use crate::{
    FIELD_MANAGER,
    decide::{
        self, Action, AppView, ApplicationSetView, EvaluatedGate, Observations, active_wave,
        gates_due,
    },
    decisions, gates,
    metrics::{WAVE_PASSED_METRIC, WaveGateMetrics},
    pins,
};

/// The annotation that makes Argo CD's ApplicationSet controller regenerate now.
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/application-set-refresh";

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
    /// The gate engine over the global metrics view; `None`: no metrics source configured (no
    /// gate, drift or cross-site wait can then pass).
    pub engine: Option<Arc<Engine<PrometheusSource>>>,
    /// The operator's metrics.
    pub metrics: Option<WaveGateMetrics>,
    /// Webhook notifications of halts (`main` shares the runtime's).
    pub notifier: sluice_runtime::notify::Notifier,
    /// How long a halt waits for revert to hold its pins before setting decisions back
    /// (`--pin-wait-seconds`).
    pub pin_wait: std::time::Duration,
    /// Whether this replica leads: checked right before the ApplicationSet nudge and every
    /// BundlePin creation.
    pub leadership: Leadership,
    /// The watch caches of Applications and of wave-gate's BundlePins a reconcile reads
    /// (never a list per reconcile). Their watches should run on the watch client.
    pub caches: Arc<crate::cache::Caches>,
    /// The scrape `job` of wave-gate's own metrics (`--wave-passed-job`): a cross-site wait
    /// trusts only `sluice_wavegate_wave_passed` series of that job, not the same series exposed
    /// by any other scraped workload. Empty: not pinned.
    pub wave_passed_job: String,
}

sluice_runtime::opaque_debug!(Context);

impl Context {
    /// A context reading the system clock, without a metrics source or metrics.
    pub fn new(client: Client, recorder: EventRecorder) -> Self {
        Self {
            caches: Arc::new(crate::cache::Caches::new(client.clone())),
            client,
            recorder,
            clock: Timestamp::now,
            allow_free_form_promql: false,
            engine: None,
            metrics: None,
            notifier: sluice_runtime::notify::Notifier::disabled(),
            pin_wait: crate::decide::DEFAULT_PIN_WAIT,
            leadership: Leadership::always(),
            wave_passed_job: DEFAULT_WAVE_PASSED_JOB.to_owned(),
        }
    }
}

/// A reconcile that did not complete; retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Leadership lost before a write, the WaveGate without a namespace, or its status write
    /// failed.
    #[error(transparent)]
    Failure(ReconcileFailure),
    /// A watch cache the decision reads from has not listed yet.
    #[error("reading {what} for WaveGate {namespace}/{name}: {source}; retrying")]
    Cache {
        /// What was read.
        what: &'static str,
        /// WaveGate namespace.
        namespace: String,
        /// WaveGate name.
        name: String,
        /// Why the cache is not ready.
        source: crate::cache::NotReady,
    },
    /// Reading an object the decision needs failed.
    #[error("reading {what} for WaveGate {namespace}/{name}: {source}; retrying")]
    Read {
        /// What was read.
        what: &'static str,
        /// WaveGate namespace.
        namespace: String,
        /// WaveGate name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// The decided status would publish an incomplete decision list; nothing was written.
    #[error("WaveGate {namespace}/{name}: refusing to publish status: {why}")]
    Unpublishable {
        /// WaveGate namespace.
        namespace: String,
        /// WaveGate name.
        name: String,
        /// What is wrong with the list.
        why: String,
    },
    /// Creating a BundlePin or nudging the ApplicationSet failed.
    #[error("{what} for WaveGate {namespace}/{name}: {source}; retrying")]
    Act {
        /// What was attempted.
        what: String,
        /// WaveGate namespace.
        namespace: String,
        /// WaveGate name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

sluice_runtime::reconcile_failures!(ReconcileError::Failure, status of WaveGate);

impl Categorized for ReconcileError {
    fn category(&self) -> Category {
        match self {
            ReconcileError::Failure(e) => e.category(),
            ReconcileError::Unpublishable { .. } => Category::Internal,
            ReconcileError::Read { source, .. } | ReconcileError::Act { source, .. } => {
                Category::of_kube(source)
            }
            // A watch that cannot list: the API server is away, or the watch is forbidden (its
            // error names which).
            ReconcileError::Cache { .. } => Category::ApiUnavailable,
        }
    }
}

/// Argo CD's command-parameters ConfigMap (the ApplicationSet controller's flags).
pub const ARGOCD_CMD_PARAMS: &str = "argocd-cmd-params-cm";

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The Applications of `set`: those it owns, by their destination cluster (its name, or its
/// server mapped by `spec.clusterServers`).
fn applications(spec: &WaveGateSpec, set: &str, apps: &[Arc<Application>]) -> Vec<AppView> {
    apps.iter()
        .filter(|a| {
            a.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "ApplicationSet" && o.name == set)
        })
        .filter_map(|a| {
            let d = a.spec.destination.as_ref()?;
            let cluster = spec.cluster_of_destination(d.name.as_deref(), d.server.as_deref());
            if cluster.is_none() {
                tracing::warn!(
                    application = a.metadata.name.as_deref().unwrap_or_default(),
                    server = d.server.as_deref().unwrap_or_default(),
                    "Application's destination matches no cluster of the WaveGate; list its server in spec.clusterServers"
                );
            }
            let cluster = cluster?;
            let sync = a.status.as_ref().and_then(|s| s.sync.as_ref());
            Some(AppView {
                name: a.metadata.name.clone().unwrap_or_default(),
                namespace: a.metadata.namespace.clone().unwrap_or_default(),
                cluster,
                sync_status: sync.and_then(|s| s.status.clone()),
                synced_revision: sync.and_then(|s| s.revision.clone()),
                healthy: a.is_healthy(),
            })
        })
        .collect()
}

/// Applications `set` owns whose destination matches no cluster of the WaveGate
/// (`namespace/name`, at most 16).
fn unmatched(spec: &WaveGateSpec, set: &str, apps: &[Arc<Application>]) -> Vec<String> {
    apps.iter()
        .filter(|a| {
            a.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "ApplicationSet" && o.name == set)
        })
        .filter(|a| {
            let d = a.spec.destination.as_ref();
            spec.cluster_of_destination(
                d.and_then(|d| d.name.as_deref()),
                d.and_then(|d| d.server.as_deref()),
            )
            .is_none_or(|c| spec.wave_of_cluster(&c).is_none())
        })
        .take(16)
        .map(|a| {
            format!(
                "{}/{}",
                a.metadata.namespace.as_deref().unwrap_or_default(),
                a.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

fn owner(ns: &str, name: &str) -> String {
    format!("WaveGate {ns}/{name}")
}

/// Reads the drift signal of the active wave's clusters.
async fn drift(
    engine: &Engine<PrometheusSource>,
    spec: &WaveGateSpec,
    wave: usize,
    owner: &str,
    now: Timestamp,
) -> BTreeMap<String, Option<f64>> {
    let checks = gates::drift_checks(spec, wave, owner, &engine.options().cluster_label);
    if checks.is_empty() {
        return BTreeMap::new();
    }
    let only: Vec<_> = checks.iter().map(|(_, c)| c.clone()).collect();
    let report = engine.tick(&only, now).await;
    checks
        .into_iter()
        .zip(report.outcomes)
        .map(|((cluster, _), outcome)| {
            let value = match outcome.observation {
                Some(Observation::Measured { value, .. }) => value.filter(|v| !v.is_nan()),
                _ => None,
            };
            (cluster, value)
        })
        .collect()
}

/// Evaluates the gates of soaking wave `wave`.
async fn evaluate_gates(
    ctx: &Context,
    spec: &WaveGateSpec,
    status: &WaveGateStatus,
    wave: usize,
    owner: &str,
    now: Timestamp,
) -> Result<Vec<EvaluatedGate>, kube::Error> {
    let api: Api<GateTemplate> = Api::all(ctx.client.clone());
    let templates = sluice_analysis::read_templates(&spec.effective_gates(), |name| {
        let api = api.clone();
        async move { Ok::<_, kube::Error>(api.get_opt(&name).await?.map(|t| t.spec)) }
    })
    .await?;
    let previous = status
        .waves
        .get(wave)
        .map(|w| w.gates.clone())
        .unwrap_or_default();
    let cluster_label = ctx
        .engine
        .as_ref()
        .map_or("cluster".to_owned(), |e| e.options().cluster_label.clone());
    let w = gates::wave_checks(spec, status, wave, owner, &templates, &cluster_label);
    let mut out = Vec::new();
    let unresolved_action = |v: &sluice_api::v1alpha1::GateVerdict| {
        sluice_analysis::policy_action(&spec.inconclusive, v, now)
    };
    for (gate, why) in w.unresolved {
        let prev = sluice_api::v1alpha1::gate::find_verdict(&previous, &gate);
        let v = sluice_analysis::unevaluated(&gate, &why, prev, now);
        out.push(EvaluatedGate {
            action: unresolved_action(&v),
            verdict: v,
        });
    }
    match &ctx.engine {
        Some(engine) => {
            let report = engine.tick(&w.checks, now).await;
            for (check, outcome) in w.checks.iter().zip(report.outcomes) {
                let v = match outcome.verdict {
                    Ok(v) => v,
                    Err(e) => sluice_analysis::unevaluated(
                        &check.gate.name,
                        &e.to_string(),
                        check.previous.as_ref(),
                        now,
                    ),
                };
                let action = gate_action(&check.gate, &v, now);
                out.push(EvaluatedGate { verdict: v, action });
            }
        }
        None => {
            for check in &w.checks {
                let v = sluice_analysis::unevaluated(
                    &check.gate.name,
                    "no metrics source is configured (--prometheus-url); the gate cannot be evaluated",
                    check.previous.as_ref(),
                    now,
                );
                let action = gate_action(&check.gate, &v, now);
                out.push(EvaluatedGate { verdict: v, action });
            }
        }
    }
    Ok(out)
}

/// Default of `--wave-passed-job`: the chart's ServiceMonitor names each operator's scrape job
/// after its component label.
pub const DEFAULT_WAVE_PASSED_JOB: &str = "wave-gate";

/// The query of other sites' progress at `revision`, trusting only series of scrape job `job`
/// (when set).
pub fn passed_elsewhere_query(revision: &str, job: &str) -> String {
    use sluice_analysis::template::escape_string;
    let job = if job.is_empty() {
        String::new()
    } else {
        format!(", job=\"{}\"", escape_string(job))
    };
    format!(
        "max by (site, wave) (last_over_time({WAVE_PASSED_METRIC}{{revision=\"{}\"{job}}}[5m])) > 0",
        escape_string(revision)
    )
}

/// Other sites' progress at `revision`: `(site, wave)` pairs reported passed by series of scrape
/// job `job`.
async fn passed_elsewhere(
    engine: &Engine<PrometheusSource>,
    revision: &str,
    job: &str,
    now: Timestamp,
) -> BTreeSet<(String, String)> {
    use sluice_analysis::MetricsSource;
    let q = passed_elsewhere_query(revision, job);
    match engine.source().query(&q, now).await {
        Ok(series) => series
            .into_iter()
            .filter_map(|s| Some((s.labels.get("site")?.clone(), s.labels.get("wave")?.clone())))
            .collect(),
        Err(e) => {
            tracing::warn!(category = e.category(), error = %e, "reading other sites' progress failed");
            BTreeSet::new()
        }
    }
}

/// The applied status: `next`, with every top-level field the previous status had and `next`
/// drops (a halt cleared by a superseding change) sent as an explicit null, so the apply removes
/// it whole instead of leaving an emptied object behind.
fn status_body(previous: Option<&WaveGateStatus>, next: &WaveGateStatus) -> serde_json::Value {
    let mut body = serde_json::to_value(next).unwrap_or_default();
    if let (Some(prev), Some(map)) = (
        previous.and_then(|p| serde_json::to_value(p).ok()),
        body.as_object_mut(),
    ) && let Some(old) = prev.as_object()
    {
        for key in old.keys() {
            if !map.contains_key(key) {
                map.insert(key.clone(), serde_json::Value::Null);
            }
        }
    }
    body
}

/// Reconciles one WaveGate.
#[tracing::instrument(skip_all, fields(kind = "WaveGate", namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(
    obj: Arc<WaveGate>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    let ns = ReconcileFailure::namespace_of(obj.as_ref())?;
    let name = obj.name_any();
    let api: Api<WaveGate> = Api::namespaced(ctx.client.clone(), &ns);
    let now = (ctx.clock)();
    let spec = &obj.spec;
    let status = obj.status.as_ref();
    let read = |what: &'static str| {
        let (ns, name) = (ns.clone(), name.clone());
        move |source| ReconcileError::Read {
            what,
            namespace: ns,
            name,
            source,
        }
    };
    let cached = |what: &'static str| {
        let (ns, name) = (ns.clone(), name.clone());
        move |source| ReconcileError::Cache {
            what,
            namespace: ns,
            name,
            source,
        }
    };

    let mut obs = Observations {
        namespace: ns.clone(),
        name: name.clone(),
        generation: obj.metadata.generation,
        allow_free_form_promql: ctx.allow_free_form_promql,
        pin_wait: ctx.pin_wait,
        ..Observations::default()
    };
    if crate::validity::problems(spec, ctx.allow_free_form_promql).is_empty() {
        let set_ns = spec
            .application_set_ref
            .namespace
            .clone()
            .unwrap_or_else(|| ns.clone());
        let sets: Api<ApplicationSet> = Api::namespaced(ctx.client.clone(), &set_ns);
        obs.application_set = match sets
            .get_opt(&spec.application_set_ref.name)
            .await
            .map_err(read("the ApplicationSet"))?
        {
            None => ApplicationSetView::Missing,
            Some(s) => {
                obs.decision_resources = s
                    .decision_resource_names()
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                ApplicationSetView::Found(s.wave_gate_safety())
            }
        };
        // The controller-level policy (--policy, --enable-policy-override) from Argo CD's
        // parameters ConfigMap; unreadable counts as absent (Argo CD's defaults).
        let params: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(ctx.client.clone(), &set_ns);
        obs.controller_params = match params.get_opt(ARGOCD_CMD_PARAMS).await {
            Ok(cm) => cm.and_then(|c| c.data),
            Err(e) => {
                tracing::debug!(error = %e, "reading {ARGOCD_CMD_PARAMS}; taken as absent");
                None
            }
        };
        if obs.application_set != ApplicationSetView::Missing {
            let listed = ctx
                .caches
                .applications(&set_ns)
                .await
                .map_err(cached("Applications"))?;
            obs.unmatched_applications = unmatched(spec, &spec.application_set_ref.name, &listed);
            obs.applications = applications(spec, &spec.application_set_ref.name, &listed);
        }
        let current = status.cloned().unwrap_or_default();
        // wave-gate's own pins (label-selected on the server): a halt's, and the released ones
        // to delete.
        let listed = ctx.caches.pins(&ns).await.map_err(cached("BundlePins"))?;
        let this_gate = format!("{ns}/{name}");
        obs.released_pins = listed
            .iter()
            .filter(|p| {
                p.annotations().get(pins::WAVE_GATE_ANNOTATION) == Some(&this_gate)
                    && p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().map(|s| s.phase)
                        == Some(sluice_api::v1alpha1::BundlePinPhase::Released)
            })
            .map(|p| p.name_any())
            .collect();
        if current.halt.is_some() {
            obs.existing_pins = listed.iter().map(|p| p.name_any()).collect();
            obs.pin_phases = listed
                .iter()
                .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.phase)))
                .collect();
        }
        let same_change = current.current_revision.as_deref() == Some(spec.revision.as_str());
        let who = owner(&ns, &name);
        if same_change && current.halt.is_none() {
            if let Some(i) = active_wave(&current) {
                let state = current.waves[i].state;
                if let Some(engine) = &ctx.engine {
                    if matches!(state, WaveState::Converging | WaveState::Soaking) {
                        obs.drift = drift(engine, spec, i, &who, now).await;
                    }
                    if matches!(state, WaveState::Pending | WaveState::Waiting)
                        && !spec.waves[i].wait_for.is_empty()
                    {
                        obs.passed_elsewhere =
                            passed_elsewhere(engine, &spec.revision, &ctx.wave_passed_job, now)
                                .await;
                    }
                }
            }
            if let Some(i) = gates_due(spec, &current, now) {
                obs.gates = Some(
                    evaluate_gates(&ctx, spec, &current, i, &who, now)
                        .await
                        .map_err(read("GateTemplates"))?,
                );
            }
        } else if !same_change
            && let Some(engine) = &ctx.engine
            && !spec.waves[0].wait_for.is_empty()
        {
            obs.passed_elsewhere =
                passed_elsewhere(engine, &spec.revision, &ctx.wave_passed_job, now).await;
        }
    }

    let decision = decide::decide(spec, status, &obs, now);
    let published_before = status.is_some_and(|s| !s.decisions.is_empty());
    decisions::publishable(spec, &decision.status.decisions, published_before).map_err(|why| {
        ReconcileError::Unpublishable {
            namespace: ns.clone(),
            name: name.clone(),
            why,
        }
    })?;
    if status != Some(&decision.status) {
        let body = status_body(status, &decision.status);
        write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &body).await?;
        if let Some(n) = crate::notice::notice(status, &decision.status) {
            ctx.notifier.notify(obj.as_ref(), n);
        }
        tracing::info!(phase = ?decision.status.phase, wave = ?decision.status.current_wave, "status written");
    }
    if let Some(m) = &ctx.metrics {
        m.record(&ns, &name, spec, status, &decision.status, now);
    }
    for action in &decision.actions {
        match action {
            Action::Event(notice) => ctx.recorder.announce(obj.as_ref(), notice).await,
            Action::NudgeApplicationSet => {
                let set_ns = spec
                    .application_set_ref
                    .namespace
                    .clone()
                    .unwrap_or_else(|| ns.clone());
                let sets: Api<ApplicationSet> = Api::namespaced(ctx.client.clone(), &set_ns);
                let patch =
                    serde_json::json!({"metadata": {"annotations": {REFRESH_ANNOTATION: "true"}}});
                ctx.leadership.ensure()?;
                if let Err(e) = sets
                    .patch(
                        &spec.application_set_ref.name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    // A missed nudge only delays Argo CD until its own requeue; never fatal.
                    tracing::warn!(error = %e, "nudging the ApplicationSet to refresh failed");
                }
            }
            Action::DeletePin(pin) => {
                let pins: Api<BundlePin> = Api::namespaced(ctx.client.clone(), &ns);
                ctx.leadership.ensure()?;
                match pins.delete(pin, &Default::default()).await {
                    Ok(_) => tracing::info!(pin = %pin, "released BundlePin deleted"),
                    Err(e) if is_status(&e, 404) => {}
                    Err(source) => {
                        return Err(ReconcileError::Act {
                            what: format!("deleting released BundlePin {pin}"),
                            namespace: ns.clone(),
                            name: name.clone(),
                            source,
                        });
                    }
                }
            }
            Action::CreatePin(plan) => {
                let pin = pins::bundle_pin(spec, &ns, &name, obj.metadata.uid.as_deref(), plan);
                let pins: Api<BundlePin> = Api::namespaced(ctx.client.clone(), &ns);
                ctx.leadership.ensure()?;
                match pins.create(&FIELD_MANAGER.post_params(), &pin).await {
                    Ok(_) => {
                        tracing::info!(pin = %plan.name, cluster = %plan.cluster, digest = %plan.digest, "BundlePin created")
                    }
                    Err(e) if is_status(&e, 409) => {}
                    Err(source) => {
                        return Err(ReconcileError::Act {
                            what: format!("creating BundlePin {}", plan.name),
                            namespace: ns.clone(),
                            name: name.clone(),
                            source,
                        });
                    }
                }
            }
        }
    }
    Ok(decision.requeue.action(
        std::time::Duration::ZERO,
        std::time::Duration::from_millis(50),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_waits_trust_only_wave_gates_scrape_job() {
        let q = passed_elsewhere_query("sha256:ab", "wave-gate");
        assert_eq!(
            q,
            "max by (site, wave) (last_over_time(sluice_wavegate_wave_passed{revision=\"sha256:ab\", job=\"wave-gate\"}[5m])) > 0"
        );
        assert!(!passed_elsewhere_query("sha256:ab", "").contains("job="));
        assert!(passed_elsewhere_query("r", "a\"b").contains(r#"job="a\"b""#));
    }
}
