//! Gate analysis for every Rollout of one controller: which gate checks a Rollout needs this
//! tick, when its next analysis is due, and one shared [`Engine`] that evaluates the checks of
//! all Rollouts due at the same moment in one batched tick (one query per gate template and
//! window, however many Rollouts there are).
//!
//! Owns the analysis schedule (a grid of the analysis interval, so Rollouts with the same
//! interval are due together and share a tick) and the translation of engine outcomes into the
//! state machine's observations. Must never write to the cluster and never judge a step itself:
//! the state machine (`decide::machine`) does, from the verdicts returned here.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use sluice_analysis::{
    CheckOutcome, Engine, GateAction, GateCheck, MetricsSource, Observation, Reporter,
    ServiceScope, SourceWorkloads, Vars, action,
    decide::{SequentialKind, sequential_kind},
    engine::SequentialScope,
    resolve_gate,
    sequential::{DEFAULT_FALSE_ABORT_RATE, per_test_alpha},
};
use sluice_api::v1alpha1::{
    BuiltinGate, Gate, GateQuery, GateTemplateSpec, GateVerdict, InconclusivePolicy, RolloutPhase,
    RolloutSpec, RolloutStatus, rollout::StepKind,
};
use tokio::sync::oneshot;

/// Name of the share check added when a Rollout's gates have no AppliedShare gate: the share is
/// always measured, because no weight step is judged before it is confirmed.
pub const SHARE_CHECK: &str = "sluice-applied-share";

/// What a Rollout needs analysed this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The checks, gates first, the share check last.
    pub checks: Vec<GateCheck>,
    /// Gate names whose verdicts the state machine judges (the share check may be hidden).
    pub judged: Vec<String>,
    /// Index of the check whose value is the applied share.
    pub share_index: usize,
    /// Gates that could not be resolved (a missing GateTemplate, a bad duration).
    pub problems: Vec<Misconfigured>,
    /// The Rollout's Inconclusive policy, for the gates that could not be resolved.
    pub inconclusive: InconclusivePolicy,
    /// Overrides a locked GateTemplate refuses, one message per gate naming the gate, the
    /// template and the fields: the gate is judged as the template defines it, and the Rollout
    /// is not Ready until the overrides are removed.
    pub refused: Vec<String>,
}

/// A gate that cannot be evaluated as configured: a missing GateTemplate, a template variable
/// the Rollout cannot supply, refused inline PromQL, a bad duration. A configuration error, not
/// a metrics outage: the gate is Inconclusive (its policy applies after its deadline) and the
/// Rollout reports `Ready=False`.
#[derive(Debug, Clone, PartialEq)]
pub struct Misconfigured {
    /// The gate's name.
    pub gate: String,
    /// What is wrong, naming the field.
    pub message: String,
    /// The gate's previous verdict (its Inconclusive streak).
    pub previous: Option<GateVerdict>,
}

pub use sluice_analysis::policy_action;

/// What the analysis produced for the state machine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Findings {
    /// Judged verdicts with the action each calls for.
    pub gates: Vec<(GateVerdict, GateAction)>,
    /// Applied share in percent (`None`: no data).
    pub applied_share: Option<f64>,
    /// Why the metrics source did not answer.
    pub error: Option<String>,
    /// Configuration problems of the gates (each `gate <name>: ...`), empty when none.
    pub problems: Vec<String>,
}

fn current_kind(spec: &RolloutSpec, status: &RolloutStatus) -> Option<StepKind> {
    status
        .current_step_index
        .and_then(|i| spec.steps.get(i as usize))
        .and_then(|s| s.kind())
}

/// Whether the Rollout is in a state that is analysed: whenever the canary receives traffic
/// (a weight written, a cohort or mirror rule on the route) in any step, held or not — a pause
/// step, `spec.paused`, a mirror or cohort step, an invalid spec held — plus a weight step
/// from its first second and a header-cohort step that later steps keep (its share), and an
/// abort whose revert is not yet verified from telemetry (share only). Pausing holds progress,
/// never safety.
pub fn wants_analysis(spec: &RolloutSpec, status: &RolloutStatus) -> bool {
    match status.phase {
        RolloutPhase::Progressing | RolloutPhase::Paused => {
            let live = status.desired_weight.unwrap_or(0) > 0
                || status.cohort_active
                || status.mirror_active;
            live || match current_kind(spec, status) {
                Some(StepKind::SetWeight) => true,
                Some(StepKind::HeaderCohort) => spec.keep_cohort,
                _ => false,
            }
        }
        RolloutPhase::Aborted => status
            .abort
            .as_ref()
            .is_some_and(|a| a.route_reverted_at.is_some() && a.revert_verified_at.is_none()),
        _ => false,
    }
}

/// Whether the spec asks for a manual control the status has not acted on yet: `spec.abort`
/// (not yet Aborted), `spec.retry` above `status.retriesHandled` on an Aborted Rollout,
/// `spec.promoteFull` or `spec.promoteThroughStep` reaching the current step of a running plan,
/// `spec.paused` on a Progressing one. Such a control is decided before any analysis runs: a
/// metrics source that is slow or never answers never delays it.
pub fn control_pending(spec: &RolloutSpec, status: &RolloutStatus) -> bool {
    let running = matches!(
        status.phase,
        RolloutPhase::Progressing | RolloutPhase::Paused | RolloutPhase::WaitingForCanary
    );
    let step = status.current_step_index.unwrap_or(0);
    (spec.abort && status.phase != RolloutPhase::Aborted)
        || (status.phase == RolloutPhase::Aborted
            && !spec.abort
            && spec.retry > status.retries_handled)
        || (running && spec.promote_full)
        || (running && spec.promote_through_step.is_some_and(|p| p >= step))
        || (spec.paused && status.phase == RolloutPhase::Progressing)
}

/// Whether the current step is a weight step whose applied share the mesh confirmed: only then
/// is a share gate judged (the gates on the canary's health are judged from the first second).
pub fn share_confirmed(spec: &RolloutSpec, status: &RolloutStatus) -> bool {
    current_kind(spec, status) == Some(StepKind::SetWeight)
        && status.history.last().is_some_and(|h| {
            Some(h.index) == status.current_step_index && h.share_confirmed_at.is_some()
        })
}

/// The analysis slot `t` falls in: analyses run once per slot of length `interval`, counted
/// from the Unix epoch, so every Rollout with that interval is due at the same instant.
pub fn slot(t: Timestamp, interval: Duration) -> i128 {
    let ms = interval.as_millis().max(1) as i128;
    i128::from(t.as_millisecond()).div_euclid(ms)
}

/// Whether an analysis is due at `now` given the last one (`None`: never analysed).
pub fn due(last: Option<Timestamp>, now: Timestamp, interval: Duration) -> bool {
    last.is_none_or(|l| slot(now, interval) > slot(l, interval))
}

/// Time from `now` to the start of the next slot (plus a few milliseconds, so the wake-up lands
/// inside it).
pub fn until_next_slot(now: Timestamp, interval: Duration) -> Duration {
    let ms = interval.as_millis().max(1) as i128;
    let next = (slot(now, interval) + 1) * ms;
    let left = next - i128::from(now.as_millisecond());
    Duration::from_millis(u64::try_from(left).unwrap_or(0) + 5)
}

/// The last analysis the status records (gate verdicts or the applied share).
pub fn last_analysis(status: &RolloutStatus) -> Option<Timestamp> {
    let gates = status.gates.iter().map(|g| g.evaluated_at.0).max();
    let share = status.applied_share_observed_at.as_ref().map(|t| t.0);
    gates.max(share)
}

/// Whether the canary's health gates read the destination reporter this tick: the canary
/// receives mirrored copies (`status.mirrorActive`) and no live weight, as in a mirror step (and a
/// cohort or pause step before the first weight while the mirror rule stays). Istio's source
/// reporter never sees a mirrored copy, so the source-reported canary figures would stay at 0 and
/// a failing canary would never be judged; the receiving proxies report every request the canary
/// serves, mirrored or live (a cohort's), keyed on its workload. Once a weight is live the gates
/// read the source reporter, like the share.
pub fn judged_at_destination(status: &RolloutStatus) -> bool {
    status.mirror_active && status.desired_weight.unwrap_or(0) == 0
}

/// How the Rollout's built-in service gates read Istio's request metrics this tick: the
/// destination reporter while [`judged_at_destination`], and only the clients of
/// `spec.trafficSource` when set (every client otherwise).
pub fn service_scope(spec: &RolloutSpec, status: &RolloutStatus) -> ServiceScope {
    ServiceScope {
        reporter: if judged_at_destination(status) {
            Reporter::Destination
        } else {
            Reporter::Source
        },
        sources: spec.traffic_source.as_ref().map(|t| SourceWorkloads {
            workloads: t.workloads.clone(),
            namespace: t.namespace.clone(),
        }),
    }
}

/// Builds the checks of one Rollout: its effective gates (with the Rollout's share tolerance
/// and Inconclusive policy where a gate sets none) and the share check. During an abort only
/// the share is measured. A share gate is measured always but judged only once the current
/// weight step's share is confirmed; every other gate is judged in every analysed state. The
/// built-in service gates read Istio's metrics as [`service_scope`] says (the destination
/// reporter, keyed on the canary and stable workloads, for a mirror step). `templates` holds the
/// GateTemplates the gates reference.
pub fn plan(
    spec: &RolloutSpec,
    status: &RolloutStatus,
    owner: (&str, &str),
    cluster: &str,
    templates: &HashMap<String, GateTemplateSpec>,
) -> Plan {
    let (namespace, name) = owner;
    let mut vars = Vars::new();
    vars.insert("cluster".into(), cluster.into());
    vars.insert("namespace".into(), namespace.into());
    vars.insert("route".into(), spec.route_ref.name.clone());
    vars.insert("stableService".into(), spec.stable_service.name.clone());
    vars.insert("canaryService".into(), spec.canary_service.name.clone());
    vars.insert("canaryWorkload".into(), spec.canary_workload.name.clone());
    vars.insert(
        "stableWorkload".into(),
        spec.stable_workload_name().to_owned(),
    );
    let scope = service_scope(spec, status);
    let aborting = status.phase == RolloutPhase::Aborted;
    let share_judged = share_confirmed(spec, status);
    let target = match status.current_step_index {
        Some(i) if !aborting => crate::decide::expected_share(spec, status, i as usize) / 100.0,
        _ => 0.0,
    };
    let previous = |gate: &str| status.gates.iter().find(|g| g.gate == gate).cloned();
    let owner_label = format!("Rollout {namespace}/{name}");
    let mut checks = Vec::new();
    let mut judged = Vec::new();
    let mut problems = Vec::new();
    let mut share_index = None;
    let gates = if aborting {
        Vec::new()
    } else {
        spec.effective_gates()
    };
    let mut refused = Vec::new();
    for gate in gates {
        let template = gate.template_ref.as_ref().and_then(|t| templates.get(t));
        let overrides = gate.locked_overrides(template);
        if !overrides.is_empty() {
            refused.push(format!(
                "spec.gates {}: GateTemplate {} is locked: {} cannot be overridden (the template's values apply)",
                gate.name,
                gate.template_ref.as_deref().unwrap_or_default(),
                overrides.join(", ")
            ));
        }
        let mut resolved = match resolve_gate(&gate, template, Some(&spec.inconclusive)) {
            Ok(r) => r,
            Err(e) => {
                problems.push(Misconfigured {
                    gate: gate.name.clone(),
                    message: format!("spec.gates {}: {e}", gate.name),
                    previous: previous(&gate.name),
                });
                judged.push(gate.name.clone());
                continue;
            }
        };
        if let Some(share) = resolved.comparison.share.as_mut() {
            share
                .tolerance_percent
                .get_or_insert(spec.applied_share_tolerance_percent);
        }
        let is_share = resolved.query == GateQuery::Builtin(BuiltinGate::AppliedShare)
            && resolved.comparison.share.is_some();
        let mut check = GateCheck::new(owner_label.clone(), resolved, vars.clone());
        check.share_target = Some(target);
        check.previous = previous(&gate.name);
        check.scope = scope.clone();
        if is_share && share_index.is_none() {
            share_index = Some(checks.len());
        }
        if !is_share || share_judged {
            judged.push(gate.name.clone());
        }
        checks.push(check);
    }
    let share_index = match share_index {
        Some(i) => i,
        None => {
            let mut g = Gate::builtin(SHARE_CHECK, BuiltinGate::AppliedShare);
            // The share is read over the shortest window any gate uses (at least 4 scrape
            // intervals are the gates' concern), so a revert shows up as soon as possible.
            g.definition.window = spec
                .gates
                .iter()
                .filter_map(|g| g.definition.window.clone())
                .min_by_key(|w| w.parse().unwrap_or(Duration::MAX));
            if let Ok(mut resolved) = g.resolve(None) {
                if let Some(share) = resolved.comparison.share.as_mut() {
                    share.tolerance_percent = Some(spec.applied_share_tolerance_percent);
                }
                let mut check = GateCheck::new(owner_label, resolved, vars);
                check.share_target = Some(target);
                check.scope = scope.clone();
                checks.push(check);
            }
            checks.len().saturating_sub(1)
        }
    };
    if !aborting && let Some(since) = status.current_step_started_at.as_ref() {
        let share_since = (current_kind(spec, status) == Some(StepKind::SetWeight))
            .then(|| share_counted_from(spec, status, since.0));
        scope_sequential(spec, &mut checks, since.0, share_since);
    }
    Plan {
        checks,
        judged,
        share_index,
        problems,
        inconclusive: spec.inconclusive.clone(),
        refused,
    }
}

/// Where a weight step starts counting requests toward its applied share: one analysis
/// interval after the API server accepted the write of the step's weight
/// (`status.ownedRoute.weightWrittenAt`), and never before the step began. The interval after
/// the write absorbs the mesh applying it (an xDS push reaches the sidecars within seconds) and
/// the counters' scrape lag (15 s by default), so the seconds before the weight is in force
/// never read as a low share. Until the write is accepted nothing is counted
/// ([`Timestamp::MAX`]): the share waits, neither confirming nor failing.
pub fn share_counted_from(
    spec: &RolloutSpec,
    status: &RolloutStatus,
    step_began: Timestamp,
) -> Timestamp {
    let interval: Duration = spec
        .analysis_interval
        .parse()
        .unwrap_or(Duration::from_secs(30));
    let written = weight_in_force_since(spec, status);
    match written {
        Some(at) => {
            let settled =
                at.0.checked_add(
                    k8s_openapi::jiff::SignedDuration::try_from(interval).unwrap_or_default(),
                )
                .unwrap_or(Timestamp::MAX);
            settled.max(step_began)
        }
        None => Timestamp::MAX,
    }
}

/// When the desired weight came into force on every route: the latest of the instants the API
/// server accepted it on `routeRef` and on each of `spec.additionalRoutes` (there is no atomic
/// write across routes, so a step's weight counts as written only once every route took it);
/// `None` while any route has not.
pub fn weight_in_force_since<'a>(
    spec: &RolloutSpec,
    status: &'a RolloutStatus,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    let in_force = |o: &'a sluice_api::v1alpha1::rollout::OwnedRouteStatus| {
        (o.written_weight.is_some() && o.written_weight == status.desired_weight)
            .then_some(o.weight_written_at.as_ref())
            .flatten()
    };
    let mut latest = in_force(status.owned_route.as_ref()?)?;
    for r in &spec.additional_routes {
        let owned = status
            .additional_owned_routes
            .iter()
            .find(|o| crate::decide::is_route(o, r.kind, &r.name))?;
        let at = in_force(owned)?;
        if at.0 > latest.0 {
            latest = at;
        }
    }
    Some(latest)
}

/// Gives the built-in canary gates their sequential test at the analysis interval (a gate's own
/// `interval` wins): the canary's health (5xx, p99) on the counts since the current step began,
/// the applied share of a weight step on the counts since `share_since` (see
/// [`share_counted_from`]; `None` outside weight steps, where the share stays the windowed
/// reading: a header-cohort step measures its cohort's latest share). The rollout's false-abort
/// budget for a healthy canary (1%) is spent over every step that can carry a live canary times
/// the health gates; the share's failing side has its own bound (z = 4 on enough requests).
fn scope_sequential(
    spec: &RolloutSpec,
    checks: &mut [GateCheck],
    since: Timestamp,
    share_since: Option<Timestamp>,
) {
    let interval: Duration = spec
        .analysis_interval
        .parse()
        .unwrap_or(Duration::from_secs(30));
    let health = |c: &GateCheck| {
        matches!(
            sequential_kind(&c.gate),
            Some(SequentialKind::Errors | SequentialKind::SlowRequests)
        )
    };
    let gates = checks.iter().filter(|c| health(c)).count();
    let steps = spec
        .steps
        .iter()
        .filter(|s| s.kind() != Some(StepKind::Promote))
        .count();
    let alpha = per_test_alpha(DEFAULT_FALSE_ABORT_RATE, steps.max(1) * gates.max(1));
    for c in checks {
        let from = if health(c) {
            Some(since)
        } else if sequential_kind(&c.gate) == Some(SequentialKind::Share) {
            share_since
        } else {
            None
        };
        if let Some(since) = from {
            c.sequential = Some(SequentialScope {
                since,
                interval: c.gate.interval.unwrap_or(interval),
                alpha,
            });
        }
    }
}

/// Reads the engine's outcomes for one Rollout's plan: verdicts of the judged gates with their
/// actions, the applied share (percent), and the first reason the source failed.
pub fn findings(plan: &Plan, outcomes: &[CheckOutcome], now: Timestamp) -> Findings {
    let mut out = Findings::default();
    out.problems.extend(plan.refused.iter().cloned());
    for p in &plan.problems {
        let message = format!("configuration error: {}", p.message);
        let v = sluice_analysis::unevaluated(&p.gate, &message, p.previous.as_ref(), now);
        let act = policy_action(&plan.inconclusive, &v, now);
        out.problems.push(p.message.clone());
        out.gates.push((v, act));
    }
    for (i, (check, outcome)) in plan.checks.iter().zip(outcomes).enumerate() {
        if let Some(Observation::Failed { message, .. }) = &outcome.observation {
            out.error.get_or_insert_with(|| message.clone());
        }
        // A sequential share is a reading only on enough route requests since the step began
        // (its verdict's minimum): below it the step waits, neither confirming on noise nor
        // aborting on it. Without a target (a header-cohort step measuring the cohort) any
        // reading counts.
        let enough = check.sequential.is_none()
            || check.share_target.is_none_or(|t| t <= 0.0)
            || match &outcome.verdict {
                Ok(v) => v.samples.unwrap_or(0) >= v.min_samples.unwrap_or(u64::MAX),
                Err(_) => false,
            };
        if i == plan.share_index
            && enough
            && let Some(Observation::Measured { value: Some(v), .. }) = &outcome.observation
            && v.is_finite()
        {
            out.applied_share = Some(v * 100.0);
        }
        match &outcome.verdict {
            Ok(v) if plan.judged.contains(&check.gate.name) => {
                out.gates.push((v.clone(), action(&check.gate, v, now)));
            }
            Ok(_) => {}
            // A check that cannot be planned is a configuration problem, never an outage.
            Err(e) if plan.judged.contains(&check.gate.name) => {
                let msg = format!("spec.gates {}: {e}", check.gate.name);
                let why = format!("configuration error: {msg}");
                let v = sluice_analysis::unevaluated(
                    &check.gate.name,
                    &why,
                    check.previous.as_ref(),
                    now,
                );
                out.gates.push((v.clone(), action(&check.gate, &v, now)));
                out.problems.push(msg);
            }
            Err(e) => out.problems.push(e.to_string()),
        }
    }
    out
}

/// A caller waiting on a tick: where its checks start in the batch, how many, and where to
/// send its outcomes.
type Waiter = (usize, usize, oneshot::Sender<Arc<[CheckOutcome]>>);

/// One tick's worth of checks from every Rollout that asked within the gathering window.
struct Pending {
    checks: Vec<GateCheck>,
    waiters: Vec<Waiter>,
    generation: u64,
}

/// The figures of one batched tick, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickFigures {
    /// Rollouts in the tick.
    pub rollouts: usize,
    /// Checks in the tick.
    pub checks: usize,
    /// Queries sent.
    pub queries: usize,
    /// Queries that failed.
    pub failed_queries: usize,
}

/// The shared engine and the batcher in front of it. Reconciles that are due at the same
/// moment call [`Analyzer::evaluate`]; the first one gathers the others' checks for a short
/// window and runs one [`Engine::tick`] for all of them.
pub struct Analyzer<S> {
    engine: Engine<S>,
    gather: Duration,
    lag: Duration,
    pending: Mutex<Option<Pending>>,
    generation: Mutex<u64>,
    last: Mutex<HashMap<String, Timestamp>>,
    observer: Box<dyn Fn(TickFigures) + Send + Sync>,
}

impl<S> std::fmt::Debug for Analyzer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyzer")
            .field("gather", &self.gather)
            .finish_non_exhaustive()
    }
}

impl<S: MetricsSource + Send + Sync + 'static> Analyzer<S> {
    /// An analyzer over `engine`; `gather` is how long the first caller of a tick waits for
    /// others to join it; queries are evaluated `lag` in the past, so that a remote write or
    /// scrape still being ingested is not half-visible (one series of a ratio one sample
    /// shorter than the other skews the ratio); `observer` receives each tick's figures.
    pub fn new(
        engine: Engine<S>,
        gather: Duration,
        lag: Duration,
        observer: impl Fn(TickFigures) + Send + Sync + 'static,
    ) -> Self {
        Self {
            engine,
            gather,
            lag,
            pending: Mutex::new(None),
            generation: Mutex::new(0),
            last: Mutex::default(),
            observer: Box::new(observer),
        }
    }

    /// When `key` (`<namespace>/<name>`) was last analysed by this process.
    pub fn last(&self, key: &str) -> Option<Timestamp> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }

    /// Forgets `key` (the Rollout is gone).
    pub fn forget(&self, key: &str) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Evaluates `checks` of Rollout `key` together with every other Rollout asking in the same
    /// gathering window; returns one outcome per check, in order.
    ///
    /// The tick runs on a task of its own: a caller that stops waiting (its reconcile turned to
    /// a manual control) never cancels the tick of the others.
    pub async fn evaluate(
        self: &Arc<Self>,
        key: &str,
        checks: Vec<GateCheck>,
    ) -> Arc<[CheckOutcome]> {
        let (tx, rx) = oneshot::channel();
        let leader = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match pending.as_mut() {
                Some(p) => {
                    let from = p.checks.len();
                    let n = checks.len();
                    p.checks.extend(checks);
                    p.waiters.push((from, n, tx));
                    None
                }
                None => {
                    let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
                    *g += 1;
                    let n = checks.len();
                    *pending = Some(Pending {
                        checks,
                        waiters: vec![(0, n, tx)],
                        generation: *g,
                    });
                    Some(*g)
                }
            }
        };
        if let Some(generation) = leader {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(this.gather).await;
                let batch = {
                    let mut pending = this.pending.lock().unwrap_or_else(|e| e.into_inner());
                    match pending.take() {
                        Some(p) if p.generation == generation => Some(p),
                        other => {
                            *pending = other;
                            None
                        }
                    }
                };
                if let Some(batch) = batch {
                    this.run(batch).await;
                }
            });
        }
        let outcomes = rx.await.unwrap_or_else(|_| Arc::from(Vec::new()));
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), Timestamp::now());
        outcomes
    }

    async fn run(&self, batch: Pending) {
        let lag = k8s_openapi::jiff::SignedDuration::try_from(self.lag).unwrap_or_default();
        let now = Timestamp::now();
        let at = now.checked_sub(lag).unwrap_or(now);
        let report = self.engine.tick(&batch.checks, at).await;
        (self.observer)(TickFigures {
            rollouts: batch.waiters.len(),
            checks: batch.checks.len(),
            queries: report.queries,
            failed_queries: report.failed_queries,
        });
        let outcomes: Vec<CheckOutcome> = report.outcomes;
        for (from, n, tx) in batch.waiters {
            let mine: Arc<[CheckOutcome]> = outcomes
                .get(from..from + n)
                .map(|s| Arc::from(s.to_vec()))
                .unwrap_or_else(|| Arc::from(Vec::new()));
            let _ = tx.send(mine);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use sluice_api::v1alpha1::rollout::{OwnedRouteStatus, StepRecord};
    use sluice_api::v1alpha1::{InconclusiveAction, Verdict, VerdictReason};

    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    /// A Rollout in its first step, the canary at 5% since t(0), the weight written then.
    fn at_five_percent() -> RolloutStatus {
        RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            desired_weight: Some(5),
            current_step_started_at: Some(Time(t(0))),
            owned_route: Some(OwnedRouteStatus {
                written_weight: Some(5),
                weight_written_at: Some(Time(t(0))),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn spec(gates: serde_json::Value) -> RolloutSpec {
        serde_json::from_value(serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "appliedShareTolerancePercent": 10,
            "inconclusive": {"action": "Abort", "after": "30s"},
            "gates": gates,
            "steps": [{"setWeight": {"weight": 5}}],
        }))
        .unwrap()
    }

    /// A metrics source that answers nothing and records every query it is sent.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    impl MetricsSource for Recorder {
        async fn query(
            &self,
            promql: &str,
            _: Timestamp,
        ) -> Result<Vec<sluice_analysis::SeriesValue>, sluice_analysis::SourceError> {
            self.0.lock().unwrap().push(promql.to_owned());
            Ok(Vec::new())
        }

        async fn query_range(
            &self,
            promql: &str,
            _: Timestamp,
            _: Timestamp,
            _: Duration,
        ) -> Result<Vec<sluice_analysis::RangeValues>, sluice_analysis::SourceError> {
            self.0.lock().unwrap().push(promql.to_owned());
            Ok(Vec::new())
        }
    }

    /// Every query the engine sends for the Rollout's plan at `now`.
    async fn queries_of(spec: &RolloutSpec, status: &RolloutStatus, now: Timestamp) -> Vec<String> {
        let recorder = Recorder::default();
        let engine =
            Engine::new(recorder.clone(), sluice_analysis::EngineOptions::default()).unwrap();
        let p = plan(spec, status, ("shop", "checkout"), "c1", &HashMap::new());
        let report = engine.tick(&p.checks, now).await;
        assert!(
            report.outcomes.iter().all(|o| o.verdict.is_ok()),
            "{:?}",
            report.outcomes
        );
        recorder.0.lock().unwrap().clone()
    }

    /// The selectors (`{...}`) of `query`.
    fn selectors(query: &str) -> Vec<&str> {
        query
            .split("istio_")
            .skip(1)
            .filter_map(|s| s.split_once('{').and_then(|(_, rest)| rest.split_once('}')))
            .map(|(sel, _)| sel)
            .collect()
    }

    fn telemetry_spec(steps: serde_json::Value, patch: serde_json::Value) -> RolloutSpec {
        let mut v = serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "checkout-v1"},
            "canaryService": {"name": "checkout-v2"},
            "canaryWorkload": {"name": "checkout-v2-deploy"},
            "steps": steps,
        });
        for (k, x) in patch.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[tokio::test]
    async fn a_mirror_step_judges_the_canary_on_what_its_destination_reports() {
        let s = telemetry_spec(
            serde_json::json!([{"mirror": {"duration": "10m"}}, {"setWeight": {"weight": 5}}]),
            serde_json::json!({"stableWorkload": {"name": "checkout-v1-deploy"}}),
        );
        let mirror = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            desired_weight: Some(0),
            mirror_active: true,
            current_step_started_at: Some(Time(t(0))),
            ..Default::default()
        };
        assert!(judged_at_destination(&mirror));
        let p = plan(&s, &mirror, ("shop", "checkout"), "c1", &HashMap::new());
        for c in &p.checks {
            assert_eq!(c.scope.reporter, Reporter::Destination, "{}", c.gate.name);
            assert_eq!(c.vars["canaryWorkload"], "checkout-v2-deploy");
            assert_eq!(c.vars["stableWorkload"], "checkout-v1-deploy");
        }
        let sent = queries_of(&s, &mirror, t(300_000)).await;
        let (health, share): (Vec<&String>, Vec<&String>) = sent
            .iter()
            .partition(|q| q.contains("response_code") || q.contains("_bucket"));
        // Error ratio (counters of requests and 5xx) and p99 (bucket counters).
        assert_eq!(health.len(), 2, "{sent:#?}");
        for q in health {
            for sel in selectors(q) {
                assert!(sel.starts_with(r#"reporter="destination", cluster="c1", destination_workload_namespace="shop", destination_workload=~"checkout-v1-deploy|checkout-v2-deploy""#), "{sel}");
                assert!(!sel.contains("destination_service_name"), "{sel}");
            }
        }
        // The share of a mirror step is the live share: mirrored copies never count.
        assert_eq!(share.len(), 1, "{sent:#?}");
        for sel in selectors(share[0]) {
            assert!(sel.starts_with(r#"reporter="source""#), "{sel}");
            assert!(sel.contains("checkout-v2"), "{sel}");
        }
        // Without spec.stableWorkload the stable workload is named like the stable Service.
        let mut plain = s.clone();
        plain.stable_workload = None;
        let sent = queries_of(&plain, &mirror, t(300_000)).await;
        assert!(
            sent.iter()
                .any(|q| q.contains(r#"destination_workload=~"checkout-v1|checkout-v2-deploy""#)),
            "{sent:#?}"
        );
        // Once a weight is live the gates read the source reporter again, kept mirror or not.
        let weighted = RolloutStatus {
            current_step_index: Some(1),
            desired_weight: Some(5),
            ..mirror.clone()
        };
        assert!(!judged_at_destination(&weighted));
        let sent = queries_of(&s, &weighted, t(300_000)).await;
        assert!(!sent.is_empty());
        assert!(
            sent.iter().all(|q| !q.contains("reporter=\"destination\"")),
            "{sent:#?}"
        );
    }

    #[tokio::test]
    async fn a_traffic_source_scopes_the_share_and_the_gates_to_its_clients() {
        let steps =
            serde_json::json!([{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 50}}]);
        let status = at_five_percent();
        // Default: every source in the mesh.
        let sent = queries_of(
            &telemetry_spec(steps.clone(), serde_json::json!({})),
            &status,
            t(300_000),
        )
        .await;
        assert_eq!(
            sent.len(),
            2,
            "requests+5xx counters (share and errors), buckets: {sent:#?}"
        );
        assert!(
            sent.iter().all(|q| !q.contains("source_workload")),
            "{sent:#?}"
        );
        // Scoped to the gateway: every selector of the share's and the gates' queries.
        let gateway = telemetry_spec(
            steps.clone(),
            serde_json::json!({"trafficSource": {"workloads": ["istio-ingressgateway", "edge-gw"], "namespace": "istio-system"}}),
        );
        let sent = queries_of(&gateway, &status, t(300_000)).await;
        assert_eq!(sent.len(), 2, "{sent:#?}");
        for q in &sent {
            for sel in selectors(q) {
                assert!(sel.starts_with(r#"reporter="source", source_workload_namespace="istio-system", source_workload=~"istio-ingressgateway|edge-gw", cluster="c1""#), "{sel}");
            }
        }
        // The destination view of mirrored copies is restricted to the same clients (the share
        // counts nothing here: no weight write accepted yet).
        let mirror = RolloutStatus {
            desired_weight: Some(0),
            mirror_active: true,
            owned_route: None,
            ..status.clone()
        };
        let sent = queries_of(&gateway, &mirror, t(300_000)).await;
        assert_eq!(sent.len(), 2, "{sent:#?}");
        assert!(sent.iter().all(|q| q.contains("reporter=\"destination\"")));
        for q in &sent {
            for sel in selectors(q) {
                assert!(sel.contains(r#"source_workload_namespace="istio-system", source_workload=~"istio-ingressgateway|edge-gw""#), "{sel}");
            }
        }
    }

    #[test]
    fn schedule_is_a_shared_grid() {
        let i = Duration::from_secs(2);
        let table = [
            ("never analysed", None, 0, true),
            ("same slot", Some(t(100)), 1_900, false),
            ("next slot", Some(t(1_999)), 2_000, true),
            ("long ago", Some(t(0)), 10_000, true),
        ];
        for (name, last, now, want) in table {
            assert_eq!(due(last, t(now), i), want, "{name}");
        }
        // Two Rollouts analysed at different moments of a slot wake at the same instant.
        let a = t(300) + until_next_slot(t(300), i);
        let b = t(1_700) + until_next_slot(t(1_700), i);
        assert_eq!(a, b);
        assert!(due(Some(t(1_700)), a, i));
    }

    #[test]
    fn a_live_canary_is_analysed_in_every_state() {
        let spec: RolloutSpec = serde_json::from_value(serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "steps": [
                {"pause": {"duration": "1m"}},
                {"mirror": {}},
                {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
                {"setWeight": {"weight": 1}},
                {"pause": {"untilPromoted": true}},
                {"promote": {}}
            ],
        }))
        .unwrap();
        let st = |phase, index: u32, weight: u32, cohort: bool, mirror: bool| RolloutStatus {
            phase,
            current_step_index: Some(index),
            desired_weight: Some(weight),
            cohort_active: cohort,
            mirror_active: mirror,
            ..Default::default()
        };
        use RolloutPhase::*;
        let table = [
            (
                "pause before any traffic",
                st(Paused, 0, 0, false, false),
                false,
            ),
            ("mirror step", st(Progressing, 1, 0, false, true), true),
            ("cohort step", st(Progressing, 2, 0, true, false), true),
            ("weight step", st(Progressing, 3, 1, false, false), true),
            (
                "pause untilPromoted at 1%",
                st(Paused, 4, 1, false, false),
                true,
            ),
            ("spec.paused at 1%", st(Paused, 3, 1, false, false), true),
            (
                "held by an invalid spec",
                st(Progressing, 9, 1, false, false),
                true,
            ),
            (
                "waiting for the canary",
                st(WaitingForCanary, 0, 0, false, false),
                false,
            ),
            ("promoted", st(Promoted, 5, 100, false, false), false),
            (
                "never started, invalid",
                st(Invalid, 0, 0, false, false),
                false,
            ),
        ];
        for (name, status, want) in table {
            assert_eq!(wants_analysis(&spec, &status), want, "{name}");
        }
    }

    #[test]
    fn plan_table() {
        let unconfirmed = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            desired_weight: Some(5),
            history: vec![StepRecord {
                index: 0,
                kind: StepKind::SetWeight,
                weight: Some(5),
                started_at: Time(t(0)),
                share_confirmed_at: None,
                finished_at: None,
                outcome: None,
            }],
            ..Default::default()
        };
        let mut progressing = unconfirmed.clone();
        progressing.history[0].share_confirmed_at = Some(Time(t(1_000)));
        let aborted = RolloutStatus {
            phase: RolloutPhase::Aborted,
            desired_weight: Some(0),
            ..Default::default()
        };
        let templates = HashMap::new();
        // (name, gates, status, checks, judged, share check name, problems)
        let table = [
            (
                "defaults: three built-ins, the share judged as a gate",
                serde_json::json!([]),
                progressing.clone(),
                3,
                3,
                "applied-share",
                0,
            ),
            (
                "share not yet confirmed: measured, not judged; the other gates judged",
                serde_json::json!([]),
                unconfirmed,
                3,
                2,
                "applied-share",
                0,
            ),
            (
                "no share gate: a hidden share check is added",
                serde_json::json!([{"name": "errors", "builtin": "ErrorRatioVsStable", "window": "10s"}]),
                progressing.clone(),
                2,
                1,
                SHARE_CHECK,
                0,
            ),
            (
                "missing template is a problem, not a check (judged: Inconclusive)",
                serde_json::json!([{"name": "t", "templateRef": "absent"}]),
                progressing,
                1,
                1,
                SHARE_CHECK,
                1,
            ),
            (
                "abort: the share only",
                serde_json::json!([]),
                aborted,
                1,
                0,
                SHARE_CHECK,
                0,
            ),
        ];
        for (name, gates, status, checks, judged, share, problems) in table {
            let s = spec(gates);
            let p = plan(&s, &status, ("shop", "checkout"), "c1", &templates);
            assert_eq!(p.checks.len(), checks, "{name}");
            assert_eq!(p.judged.len(), judged, "{name}");
            assert_eq!(p.checks[p.share_index].gate.name, share, "{name}");
            assert_eq!(p.problems.len(), problems, "{name}: {:?}", p.problems);
            let target = if status.phase == RolloutPhase::Aborted {
                0.0
            } else {
                0.05
            };
            for c in &p.checks {
                assert_eq!(c.share_target, Some(target), "{name}");
                assert_eq!(c.vars["cluster"], "c1", "{name}");
                assert_eq!(c.vars["canaryService"], "v2", "{name}");
                if let Some(share) = &c.gate.comparison.share {
                    assert_eq!(share.tolerance_percent, Some(10), "{name}");
                }
            }
        }
        // The Rollout's Inconclusive policy applies to gates that set none.
        let p = plan(
            &spec(serde_json::json!([])),
            &RolloutStatus::default(),
            ("shop", "checkout"),
            "c1",
            &templates,
        );
        assert!(p.checks.iter().all(|c| c.gate.inconclusive_action
            == sluice_api::v1alpha1::InconclusiveAction::Abort
            && c.gate.inconclusive_after == Duration::from_secs(30)));
    }

    #[test]
    fn the_canary_gates_are_judged_sequentially_from_the_step_start() {
        let s = spec(serde_json::json!([]));
        let status = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            desired_weight: Some(5),
            current_step_started_at: Some(Time(t(7_000))),
            ..Default::default()
        };
        let p = plan(&s, &status, ("shop", "checkout"), "c1", &HashMap::new());
        assert_eq!(p.checks.len(), 3);
        for c in p.checks.iter().filter(|c| c.gate.name != "applied-share") {
            let scope = c
                .sequential
                .unwrap_or_else(|| panic!("{} has no sequential test", c.gate.name));
            assert_eq!(scope.since, t(7_000), "{}", c.gate.name);
            assert_eq!(scope.interval, Duration::from_secs(30), "{}", c.gate.name);
            // 1% per rollout over 1 step × 2 gates, each test at most 2α.
            assert!(
                (scope.alpha - 0.01 / 4.0).abs() < 1e-12,
                "{}: {}",
                c.gate.name,
                scope.alpha
            );
        }
        // The weight's write not yet accepted: the share counts nothing yet.
        let share = |p: &Plan| {
            p.checks
                .iter()
                .find(|c| c.gate.name == "applied-share")
                .unwrap()
                .sequential
                .map(|s| s.since)
        };
        assert_eq!(share(&p), Some(Timestamp::MAX));
        // Accepted at 9 s: counted from one interval (30 s) later, never before the step.
        let mut written = status.clone();
        written.owned_route = Some(OwnedRouteStatus {
            written_weight: Some(5),
            weight_written_at: Some(Time(t(9_000))),
            ..Default::default()
        });
        let p = plan(&s, &written, ("shop", "checkout"), "c1", &HashMap::new());
        assert_eq!(share(&p), Some(t(39_000)));
        // The write of a previous weight (or of another step's) is not this step's.
        let mut stale = written.clone();
        stale.owned_route.as_mut().unwrap().written_weight = Some(1);
        let p = plan(&s, &stale, ("shop", "checkout"), "c1", &HashMap::new());
        assert_eq!(share(&p), Some(Timestamp::MAX));
        // A weight in force long before the step (a step that keeps the weight): the step's start.
        let mut kept = written.clone();
        kept.owned_route.as_mut().unwrap().weight_written_at = Some(Time(t(-600_000)));
        let p = plan(&s, &kept, ("shop", "checkout"), "c1", &HashMap::new());
        assert_eq!(share(&p), Some(t(7_000)));
        // A custom threshold keeps its rule; an abort's share check is the instant reading.
        let custom = spec(serde_json::json!([
            {"name": "errors", "builtin": "ErrorRatioVsStable", "comparison": {"absolute": {"op": "LessOrEqual", "value": 0.01}}}
        ]));
        let p = plan(
            &custom,
            &status,
            ("shop", "checkout"),
            "c1",
            &HashMap::new(),
        );
        let errors = p.checks.iter().find(|c| c.gate.name == "errors").unwrap();
        assert_eq!(errors.sequential, None);
        let aborted = RolloutStatus {
            phase: RolloutPhase::Aborted,
            ..status
        };
        let p = plan(&s, &aborted, ("shop", "checkout"), "c1", &HashMap::new());
        assert!(p.checks.iter().all(|c| c.sequential.is_none()));
    }

    #[test]
    fn a_rollout_cannot_weaken_a_locked_gate_template() {
        let template: GateTemplateSpec = serde_json::from_value(serde_json::json!({
            "builtin": "ErrorRatioVsStable",
            "comparison": {"absolute": {"op": "LessOrEqual", "value": 0.01}},
            "window": "2m",
            "locked": true,
        }))
        .unwrap();
        let templates = HashMap::from([("platform-5xx".to_owned(), template.clone())]);
        let s = spec(serde_json::json!([
            {"name": "errors", "templateRef": "platform-5xx",
             "comparison": {"absolute": {"op": "LessOrEqual", "value": 0.5}},
             "window": "30m", "inconclusive": {"action": "Continue", "after": "1s"}}
        ]));
        let status = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            desired_weight: Some(5),
            ..Default::default()
        };
        let p = plan(&s, &status, ("shop", "checkout"), "c1", &templates);
        let errors = p.checks.iter().find(|c| c.gate.name == "errors").unwrap();
        // Judged as the platform defined it: its threshold, its window, the default policy (not
        // the gate's Continue, nor the Rollout's Abort after 30s).
        assert_eq!(
            errors.gate.comparison.absolute.as_ref().map(|a| a.value),
            Some(0.01)
        );
        assert_eq!(errors.gate.window, Duration::from_secs(120));
        assert_eq!(errors.gate.inconclusive_action, InconclusiveAction::Pause);
        assert_eq!(errors.gate.inconclusive_after, Duration::from_secs(300));
        assert!(p.judged.contains(&"errors".to_owned()));
        assert_eq!(
            p.refused,
            vec![
                "spec.gates errors: GateTemplate platform-5xx is locked: comparison, window, \
                 inconclusive cannot be overridden (the template's values apply)"
                    .to_owned()
            ]
        );
        // The refusal reaches the Rollout's Ready condition through the findings.
        let f = findings(&p, &[], t(0));
        assert_eq!(f.problems, p.refused);
        // Unlocked, the same overrides apply and nothing is refused.
        let open = GateTemplateSpec {
            locked: false,
            ..template
        };
        let templates = HashMap::from([("platform-5xx".to_owned(), open)]);
        let p = plan(&s, &status, ("shop", "checkout"), "c1", &templates);
        let errors = p.checks.iter().find(|c| c.gate.name == "errors").unwrap();
        assert_eq!(errors.gate.window, Duration::from_secs(1800));
        assert!(p.refused.is_empty());
    }

    #[test]
    fn a_sequential_share_is_read_only_on_enough_route_requests() {
        let s = spec(serde_json::json!([]));
        let status = at_five_percent();
        let p = plan(&s, &status, ("shop", "checkout"), "c1", &HashMap::new());
        let outcome = |samples: u64| CheckOutcome {
            observation: Some(Observation::Measured {
                value: Some(0.05),
                samples: Some(samples as f64),
                baseline: None,
                distribution: None,
            }),
            verdict: Ok(GateVerdict {
                gate: "applied-share".into(),
                verdict: if samples >= 1_500 {
                    Verdict::Pass
                } else {
                    Verdict::Inconclusive
                },
                reason: VerdictReason::TooFewSamples,
                message: None,
                value: Some(0.05),
                baseline: None,
                threshold: Some(0.05),
                samples: Some(samples),
                min_samples: Some(1_500),
                consecutive_failures: 0,
                inconclusive_since: None,
                evaluated_at: Time(t(0)),
            }),
        };
        for (samples, want) in [(40, None), (1_500, Some(5.0))] {
            let outcomes: Vec<CheckOutcome> = p.checks.iter().map(|_| outcome(samples)).collect();
            let f = findings(&p, &outcomes, t(0));
            assert_eq!(
                f.applied_share.map(|v| (v * 1e6).round() / 1e6),
                want,
                "{samples} route requests"
            );
        }
    }

    #[test]
    fn findings_read_share_verdicts_and_errors() {
        let s = spec(serde_json::json!([{"name": "errors", "builtin": "ErrorRatioVsStable"}]));
        let status = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            desired_weight: Some(5),
            ..Default::default()
        };
        let p = plan(&s, &status, ("shop", "checkout"), "c1", &HashMap::new());
        let verdict = |gate: &str, v: sluice_api::v1alpha1::Verdict| {
            GateVerdict::new(
                gate,
                v,
                sluice_api::v1alpha1::VerdictReason::ThresholdMet,
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(0)),
            )
        };
        let measured = |v: Option<f64>| {
            Some(Observation::Measured {
                value: v,
                samples: Some(1000.0),
                baseline: None,
                distribution: None,
            })
        };
        let outcomes = vec![
            CheckOutcome {
                observation: measured(Some(0.03)),
                verdict: Ok(verdict("errors", sluice_api::v1alpha1::Verdict::Pass)),
            },
            CheckOutcome {
                observation: measured(Some(0.051)),
                verdict: Ok(verdict(SHARE_CHECK, sluice_api::v1alpha1::Verdict::Pass)),
            },
        ];
        let f = findings(&p, &outcomes, t(0));
        assert_eq!(f.gates.len(), 1, "the hidden share check is not judged");
        assert_eq!(f.gates[0].1, GateAction::Proceed);
        assert!((f.applied_share.unwrap() - 5.1).abs() < 1e-9);
        assert_eq!(f.error, None);

        let failed = vec![
            CheckOutcome {
                observation: Some(Observation::Failed {
                    reason: sluice_api::v1alpha1::VerdictReason::QueryError,
                    message: "connection refused".into(),
                }),
                verdict: Ok(verdict(
                    "errors",
                    sluice_api::v1alpha1::Verdict::Inconclusive,
                )),
            },
            CheckOutcome {
                observation: measured(None),
                verdict: Ok(verdict(
                    SHARE_CHECK,
                    sluice_api::v1alpha1::Verdict::Inconclusive,
                )),
            },
        ];
        let f = findings(&p, &failed, t(0));
        assert_eq!(f.applied_share, None, "no data is not a share of 0");
        assert_eq!(f.error.as_deref(), Some("connection refused"));
        assert_eq!(f.gates[0].1, GateAction::Wait);
    }

    #[test]
    fn a_misconfigured_gate_is_inconclusive_and_its_policy_applies_never_an_outage() {
        let s = spec(serde_json::json!([{"name": "t", "templateRef": "absent"}]));
        let status = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            ..Default::default()
        };
        let p = plan(&s, &status, ("shop", "checkout"), "c1", &HashMap::new());
        let f = findings(&p, &[], t(0));
        assert_eq!(f.error, None, "not a metrics outage");
        assert_eq!(f.problems.len(), 1);
        assert!(
            f.problems[0].starts_with("spec.gates t: "),
            "{:?}",
            f.problems
        );
        let (v, act) = f.gates.iter().find(|(v, _)| v.gate == "t").unwrap();
        assert_eq!(v.verdict, Verdict::Inconclusive);
        assert_eq!(*act, GateAction::Wait, "within the policy's 30s");
        // The streak carries over from the status: 30 s later the policy (Abort here) applies.
        let later = RolloutStatus {
            gates: vec![v.clone()],
            ..status
        };
        let p = plan(&s, &later, ("shop", "checkout"), "c1", &HashMap::new());
        let f = findings(&p, &[], t(30_000));
        let (_, act) = f.gates.iter().find(|(v, _)| v.gate == "t").unwrap();
        assert_eq!(*act, GateAction::Abort);
    }

    #[test]
    fn a_weight_counts_as_written_only_once_every_route_accepted_it() {
        let mut s = spec(serde_json::json!([]));
        s.additional_routes = serde_json::from_value(serde_json::json!([
            {"name": "checkout-mesh"},
            {"kind": "GRPCRoute", "name": "checkout-grpc"}
        ]))
        .unwrap();
        let owned = |name: &str, kind, at: Option<i64>| OwnedRouteStatus {
            name: name.into(),
            kind: Some(kind),
            written_weight: Some(5),
            weight_written_at: at.map(|ms| Time(t(ms))),
            ..Default::default()
        };
        use sluice_api::v1alpha1::rollout::RouteKindName::{GrpcRoute, HttpRoute};
        let mut st = RolloutStatus {
            desired_weight: Some(5),
            owned_route: Some(owned("checkout", HttpRoute, Some(1_000))),
            additional_owned_routes: vec![owned("checkout-mesh", HttpRoute, Some(4_000))],
            ..Default::default()
        };
        // One route not yet recorded at all, then recorded but its write not yet accepted.
        assert_eq!(weight_in_force_since(&s, &st), None);
        assert_eq!(share_counted_from(&s, &st, t(0)), Timestamp::MAX);
        st.additional_owned_routes
            .push(owned("checkout-grpc", GrpcRoute, None));
        assert_eq!(weight_in_force_since(&s, &st), None);
        // Every route accepted it: the latest acceptance, plus one interval.
        st.additional_owned_routes[1].weight_written_at = Some(Time(t(9_000)));
        assert_eq!(weight_in_force_since(&s, &st), Some(&Time(t(9_000))));
        assert_eq!(share_counted_from(&s, &st, t(0)), t(39_000));
        // A route still carrying an earlier weight does not count.
        st.additional_owned_routes[0].written_weight = Some(1);
        assert_eq!(weight_in_force_since(&s, &st), None);
    }
}
