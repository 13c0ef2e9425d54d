//! The pure heart of sluice-wave-gate: (spec, current status, observations, now) → (actions, next
//! status).
//!
//! Status is the state machine: each wave's state and its timestamps (admitted, converged,
//! finished) live in `status.waves`, so a restarted operator continues the same soak from
//! `convergedAt` and never admits a wave twice. Owns adoption, admission (with cross-site waits
//! and their audited releases), convergence, the soak and its gates, the halt with its pins and
//! the decisions set back, supersession and emergency changes. Must never do I/O or read the
//! clock, and never produce a decision list that misses a cluster (see `decisions`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sluice_analysis::GateAction;
use sluice_api::external::argocd::{SYNC_STATUS_SYNCED, UnsafeApplicationSet};
use sluice_api::v1alpha1::{
    BundlePinPhase, GateVerdict, Verdict, VerdictReason, WaveGatePhase, WaveGateSpec,
    WaveGateStatus,
    wave_gate::{
        ChangeOutcome, ChangeRecord, DriftExporter, HaltReason, HaltStatus, WaveState, WaveStatus,
        conditions as types, reasons,
    },
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Severity,
};

use crate::{
    decisions,
    pins::{self, AppRef, PinPlan},
    validity,
};

/// Most changes kept in `status.history`.
pub const MAX_HISTORY: usize = 32;

/// An Argo CD Application of the site, reduced to what a wave needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppView {
    /// Application name.
    pub name: String,
    /// Application namespace.
    pub namespace: String,
    /// The Argo CD cluster it deploys to (`spec.destination.name`).
    pub cluster: String,
    /// `status.sync.status`.
    pub sync_status: Option<String>,
    /// `status.sync.revision`.
    pub synced_revision: Option<String>,
    /// `status.health.status` is Healthy.
    pub healthy: bool,
}

impl AppView {
    /// Synced at `revision`.
    pub fn synced_at(&self, revision: &str) -> bool {
        self.sync_status.as_deref() == Some(SYNC_STATUS_SYNCED)
            && self.synced_revision.as_deref() == Some(revision)
    }
}

/// What the reconcile found of the ApplicationSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplicationSetView {
    /// Not found.
    Missing,
    /// Found, with its safety problems (empty: safe).
    Found(Vec<UnsafeApplicationSet>),
}

/// A gate verdict of this tick and what the gate's policy makes of it.
#[derive(Debug, Clone, PartialEq)]
pub struct EvaluatedGate {
    /// The verdict (carries consecutive failures and `inconclusiveSince` forward).
    pub verdict: GateVerdict,
    /// Proceed, Wait, Pause or Abort (`sluice_analysis::action`).
    pub action: GateAction,
}

/// What the reconcile saw besides the object's spec and status.
#[derive(Debug, Clone, PartialEq)]
pub struct Observations {
    /// The WaveGate's namespace (pin names, messages).
    pub namespace: String,
    /// The WaveGate's name.
    pub name: String,
    /// `metadata.generation` of the object.
    pub generation: Option<i64>,
    /// Whether the platform allows free-form PromQL in namespaced objects.
    pub allow_free_form_promql: bool,
    /// The ApplicationSet named by `spec.applicationSetRef`.
    pub application_set: ApplicationSetView,
    /// The ApplicationSet's Applications.
    pub applications: Vec<AppView>,
    /// Proxies behind `spec.sourceCommit` per cluster of the active wave (`None`: no series).
    pub drift: BTreeMap<String, Option<f64>>,
    /// Gate verdicts evaluated this reconcile for the soaking wave (`None`: not due).
    pub gates: Option<Vec<EvaluatedGate>>,
    /// `(site, wave)` pairs other sites report passed at `spec.revision` (global metrics view).
    pub passed_elsewhere: BTreeSet<(String, String)>,
    /// Names of the BundlePins that exist in the namespace.
    pub existing_pins: BTreeSet<String>,
    /// Phase revert reports for each existing BundlePin (absent: no status yet).
    pub pin_phases: BTreeMap<String, BundlePinPhase>,
    /// BundlePins this WaveGate created (its annotation names it) that revert reports Released:
    /// deleted once no halt still needs them.
    pub released_pins: BTreeSet<String>,
    /// How long a halt waits for revert to put its pins in force before the decisions go back
    /// anyway (revert down or slow must not keep the canary on the halted revision).
    pub pin_wait: Duration,
    /// Argo CD's `argocd-cmd-params-cm` data in the ApplicationSet's namespace (`None`: not
    /// found or not readable; the defaults apply): the controller-level sync policy.
    pub controller_params: Option<BTreeMap<String, String>>,
    /// Names of the decision resources the ApplicationSet's clusterDecisionResource generators
    /// read.
    pub decision_resources: Vec<String>,
    /// Applications the ApplicationSet owns whose destination matches no cluster of the
    /// WaveGate (at most 16 names kept).
    pub unmatched_applications: Vec<String>,
}

/// `argocd-cmd-params-cm` key of the ApplicationSet controller's `--policy`.
pub const CONTROLLER_POLICY_KEY: &str = "applicationsetcontroller.policy";
/// `argocd-cmd-params-cm` key of `--enable-policy-override`.
pub const POLICY_OVERRIDE_KEY: &str = "applicationsetcontroller.enable.policy.override";

/// Why the ApplicationSet controller's own policy makes the ApplicationSet unsafe: with
/// `--policy` set and `--enable-policy-override` not true, Argo CD applies the controller's
/// policy instead of the ApplicationSet's `applicationsSync`; `sync` and `create-delete` delete
/// an Application whose cluster leaves the decisions.
pub fn controller_policy_problem(params: Option<&BTreeMap<String, String>>) -> Option<String> {
    let params = params?;
    let policy = params.get(CONTROLLER_POLICY_KEY).map(|p| p.trim())?;
    if policy.is_empty() || matches!(policy, "create-update" | "create-only") {
        return None;
    }
    let override_on = params
        .get(POLICY_OVERRIDE_KEY)
        .is_some_and(|v| v.trim() == "true");
    (!override_on).then(|| {
        format!(
            "the ApplicationSet controller runs with {CONTROLLER_POLICY_KEY}={policy} and {POLICY_OVERRIDE_KEY} not true (argocd-cmd-params-cm), so Argo CD ignores applicationsSync: create-update and would delete Applications; set the controller policy to create-update or enable the override"
        )
    })
}

/// Why the ApplicationSet does not read this WaveGate: its clusterDecisionResource generators
/// name other resources (a generator selecting by labels names none and is not judged).
pub fn binding_problem(names: &[String], wave_gate: &str) -> Option<String> {
    (!names.is_empty() && !names.iter().any(|n| n == wave_gate)).then(|| {
        format!(
            "its clusterDecisionResource generator reads {} , not this WaveGate {wave_gate}; the WaveGate's decisions would gate nothing",
            names.join(", ")
        )
    })
}

/// Default of [`Observations::pin_wait`].
pub const DEFAULT_PIN_WAIT: Duration = Duration::from_secs(30);

impl Default for Observations {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            name: String::new(),
            generation: None,
            allow_free_form_promql: false,
            application_set: ApplicationSetView::Found(Vec::new()),
            applications: Vec::new(),
            drift: BTreeMap::new(),
            gates: None,
            passed_elsewhere: BTreeSet::new(),
            existing_pins: BTreeSet::new(),
            released_pins: BTreeSet::new(),
            pin_phases: BTreeMap::new(),
            pin_wait: DEFAULT_PIN_WAIT,
            controller_params: None,
            decision_resources: Vec::new(),
            unmatched_applications: Vec::new(),
        }
    }
}

/// Something the reconcile must do after the status is written.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the WaveGate.
    Event {
        /// Normal or Warning.
        severity: Severity,
        /// CamelCase reason.
        reason: &'static str,
        /// CamelCase action.
        action: &'static str,
        /// Human-readable note.
        note: String,
    },
    /// Annotate the ApplicationSet so Argo CD regenerates its Applications now.
    NudgeApplicationSet,
    /// Create a BundlePin (already existing is fine: names are deterministic).
    CreatePin(PinPlan),
    /// Delete a BundlePin this WaveGate created that revert released (already gone is fine).
    DeletePin(String),
}

/// When to look at the object again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only when the object (or something it watches) changes.
    AwaitChange,
    /// After this long, even without a change.
    After(Duration),
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Effects to carry out after the status write succeeded.
    pub actions: Vec<Action>,
    /// The status to write (equal to the current one when nothing changed).
    pub status: WaveGateStatus,
    /// When to reconcile again.
    pub requeue: Requeue,
}

/// Event action names.
pub mod actions {
    /// Validation outcomes.
    pub const VALIDATE: &str = "Validate";
    /// ApplicationSet checks.
    pub const CHECK_APPLICATION_SET: &str = "CheckApplicationSet";
    /// Adoption.
    pub const ADOPT: &str = "Adopt";
    /// Wave admission.
    pub const ADMIT: &str = "Admit";
    /// Soak start and end.
    pub const SOAK: &str = "Soak";
    /// Halts.
    pub const HALT: &str = "Halt";
    /// Pins and decisions set back.
    pub const PIN: &str = "Pin";
    /// New revisions.
    pub const CHANGE: &str = "Change";
}

/// The Event action name of validation outcomes.
pub const VALIDATE: &str = actions::VALIDATE;

fn ts(t: &Time) -> Timestamp {
    t.0
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(t)
}

/// `t` rounded up to a whole second (the precision of a status time).
pub fn ceil_second(t: Timestamp) -> Timestamp {
    t.round(
        k8s_openapi::jiff::TimestampRound::new()
            .smallest(k8s_openapi::jiff::Unit::Second)
            .mode(k8s_openapi::jiff::RoundMode::Ceil),
    )
    .unwrap_or(t)
}

fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
}

fn parse_or(d: &sluice_api::v1alpha1::DurationString, default: Duration) -> Duration {
    d.parse().unwrap_or(default)
}

/// The analysis interval of `spec` (validated; 30 s if unreadable).
pub fn interval(spec: &WaveGateSpec) -> Duration {
    parse_or(&spec.analysis_interval, Duration::from_secs(30))
}

fn soak(spec: &WaveGateSpec, i: usize) -> Duration {
    spec.soak_of(i).map_or(Duration::from_secs(600), |s| {
        parse_or(&s, Duration::from_secs(600))
    })
}

fn convergence_timeout(spec: &WaveGateSpec) -> Duration {
    parse_or(&spec.convergence_timeout, Duration::from_secs(1800))
}

/// Whether a wave state means the wave's clusters run the change's revision.
fn admitted(state: WaveState) -> bool {
    matches!(
        state,
        WaveState::Converging
            | WaveState::Soaking
            | WaveState::Passed
            | WaveState::Failed
            | WaveState::Skipped
    )
}

fn done(state: WaveState) -> bool {
    matches!(state, WaveState::Passed | WaveState::Skipped)
}

/// The wave the change works on: the first that is not done.
pub fn active_wave(status: &WaveGateStatus) -> Option<usize> {
    status.waves.iter().position(|w| !done(w.state))
}

/// When the soak of wave `i` ends (`None` while it has not converged).
pub fn soak_end(spec: &WaveGateSpec, status: &WaveGateStatus, i: usize) -> Option<Timestamp> {
    let w = status.waves.get(i)?;
    Some(add(ts(w.converged_at.as_ref()?), soak(spec, i)))
}

/// The soaking wave whose gates are due at `now`: never evaluated in this soak, last evaluated
/// an interval ago, or not yet evaluated since the soak ended. The reconcile evaluates gates
/// only then, so the analysis interval holds across restarts.
pub fn gates_due(spec: &WaveGateSpec, status: &WaveGateStatus, now: Timestamp) -> Option<usize> {
    if status.halt.is_some() {
        return None;
    }
    let i = active_wave(status)?;
    let w = &status.waves[i];
    if w.state != WaveState::Soaking {
        return None;
    }
    let end = soak_end(spec, status, i)?;
    let evaluated: Vec<Timestamp> = w
        .gates
        .iter()
        .filter(|g| g.reason != VerdictReason::Skipped)
        .map(|g| ts(&g.evaluated_at))
        .collect();
    let Some(oldest) = evaluated.iter().min().copied() else {
        return Some(i);
    };
    let stale_for_end = now >= end && oldest < end;
    (add(oldest, interval(spec)) <= now || stale_for_end).then_some(i)
}

/// The verdict recorded for a gate the platform declared it cannot evaluate (no drift
/// exporter): Inconclusive, reason Skipped. Reported, and never counted as a pass of that gate.
pub fn skipped_verdict(gate: &str, now: Timestamp) -> GateVerdict {
    GateVerdict {
        gate: gate.to_owned(),
        verdict: Verdict::Inconclusive,
        reason: VerdictReason::Skipped,
        message: Some(
            "skipped: driftGate.exporter is None (the platform has no drift exporter); proxies' acknowledgement is not checked"
                .into(),
        ),
        value: None,
        baseline: None,
        threshold: None,
        samples: None,
        min_samples: None,
        consecutive_failures: 0,
        inconclusive_since: None,
        evaluated_at: Time(now),
    }
}

/// What a wave's clusters report.
#[derive(Debug, Clone, PartialEq)]
struct Convergence {
    counts: sluice_api::v1alpha1::wave_gate::ApplicationCounts,
    proxies_behind: Option<f64>,
    ok: bool,
    detail: String,
}

fn convergence(
    spec: &WaveGateSpec,
    wave: usize,
    revision: &str,
    obs: &Observations,
) -> Convergence {
    let clusters = &spec.waves[wave].clusters;
    let apps: Vec<&AppView> = obs
        .applications
        .iter()
        .filter(|a| clusters.contains(&a.cluster))
        .collect();
    let counts = sluice_api::v1alpha1::wave_gate::ApplicationCounts {
        total: apps.len() as u32,
        synced: apps.iter().filter(|a| a.synced_at(revision)).count() as u32,
        healthy: apps.iter().filter(|a| a.healthy).count() as u32,
    };
    let mut problems = Vec::new();
    let without: Vec<&str> = clusters
        .iter()
        .filter(|c| !apps.iter().any(|a| &a.cluster == *c))
        .map(String::as_str)
        .collect();
    if !without.is_empty() {
        problems.push(format!(
            "no Application for cluster(s) {}",
            without.join(", ")
        ));
    }
    if counts.synced < counts.total || counts.healthy < counts.total {
        problems.push(format!(
            "{}/{} Applications Synced at the revision, {}/{} Healthy",
            counts.synced, counts.total, counts.healthy, counts.total
        ));
    }
    let mut proxies_behind = None;
    if spec.drift_gate.exporter == DriftExporter::Platform {
        let mut sum = 0.0;
        let mut missing = Vec::new();
        let mut behind = Vec::new();
        for c in clusters {
            match obs.drift.get(c).copied().flatten() {
                Some(v) if !v.is_nan() => {
                    sum += v;
                    if v > f64::from(spec.drift_gate.max_proxies_behind) {
                        behind.push(format!("{c}={v}"));
                    }
                }
                _ => missing.push(c.as_str()),
            }
        }
        if missing.len() < clusters.len() {
            proxies_behind = Some(sum);
        }
        if !missing.is_empty() {
            problems.push(format!(
                "no drift signal for cluster(s) {} (a missing signal never passes)",
                missing.join(", ")
            ));
        }
        if !behind.is_empty() {
            problems.push(format!(
                "proxies behind (max {}): {}",
                spec.drift_gate.max_proxies_behind,
                behind.join(", ")
            ));
        }
    }
    Convergence {
        counts,
        proxies_behind,
        ok: problems.is_empty(),
        detail: problems.join("; "),
    }
}

/// The revision a not-yet-adopted site runs: `spec.previousRevision`, else the one revision
/// every Application reports Synced at, else (a site without Applications) `spec.revision`.
pub fn adoption_revision(spec: &WaveGateSpec, obs: &Observations) -> Result<String, String> {
    if let Some(p) = &spec.previous_revision {
        return Ok(p.clone());
    }
    let clusters: BTreeSet<&str> = spec.all_clusters().collect();
    let apps: Vec<&AppView> = obs
        .applications
        .iter()
        .filter(|a| clusters.contains(a.cluster.as_str()))
        .collect();
    if apps.is_empty() {
        // Applications that exist but are not observed for the site's clusters (a destination
        // the WaveGate cannot match) are not "no Applications": publishing spec.revision for
        // every cluster would skip every wave.
        if !obs.unmatched_applications.is_empty() {
            return Err(format!(
                "no Application is observed for the site's clusters, but the ApplicationSet owns Applications whose destination matches none ({}); list their servers in spec.clusterServers or set spec.previousRevision to the revision the site runs",
                obs.unmatched_applications.join(", ")
            ));
        }
        // A site with no Applications at all is new: it starts at spec.revision.
        return Ok(spec.revision.clone());
    }
    let revisions: BTreeSet<Option<&str>> = apps
        .iter()
        .map(|a| {
            (a.sync_status.as_deref() == Some(SYNC_STATUS_SYNCED))
                .then_some(a.synced_revision.as_deref())
                .flatten()
        })
        .collect();
    match revisions.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(r)] if decisions::is_digest(r) => Ok((*r).to_owned()),
        _ => Err(
            "the site's Applications are not all Synced at one digest revision; set spec.previousRevision to the revision the site runs"
                .into(),
        ),
    }
}

struct Ctx<'a> {
    spec: &'a WaveGateSpec,
    obs: &'a Observations,
    now: Timestamp,
    next: WaveGateStatus,
    actions: Vec<Action>,
}

impl Ctx<'_> {
    fn event(
        &mut self,
        severity: Severity,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) {
        self.actions.push(Action::Event {
            severity,
            reason,
            action,
            note,
        });
    }

    /// Sets a condition; true when it changed status, reason or message.
    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: String) -> bool {
        let before = cond::find(&self.next.conditions, type_).cloned();
        let c = cond::new(
            type_,
            status,
            reason,
            message,
            self.obs.generation,
            self.now,
        );
        let changed = before.is_none_or(|b| !cond::same_ignoring_time(&b, &c));
        cond::set(&mut self.next.conditions, c);
        changed
    }

    fn history_finish(&mut self, outcome: ChangeOutcome) {
        if let Some(last) = self.next.history.last_mut()
            && last.outcome.is_none()
        {
            last.outcome = Some(outcome);
            last.finished_at = Some(Time(self.now));
        }
    }

    fn history_start(&mut self, reason: Option<String>) {
        self.next.history.push(ChangeRecord {
            revision: self.spec.revision.clone(),
            previous_revision: self.next.previous_revision.clone(),
            started_at: Time(self.now),
            finished_at: None,
            outcome: None,
            reason,
        });
        let excess = self.next.history.len().saturating_sub(MAX_HISTORY);
        self.next.history.drain(..excess);
    }

    fn history_note(&mut self, note: &str) {
        if let Some(last) = self.next.history.last_mut() {
            let text = match &last.reason {
                Some(r) => format!("{r}; {note}"),
                None => note.to_owned(),
            };
            last.reason = Some(text.chars().take(1024).collect());
        }
    }
}

/// Decides the next status of a WaveGate.
pub fn decide(
    spec: &WaveGateSpec,
    status: Option<&WaveGateStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut cx = Ctx {
        spec,
        obs,
        now,
        next: status.cloned().unwrap_or_default(),
        actions: Vec::new(),
    };
    cx.next.observed_generation = obs.generation;
    let requeue = step(&mut cx);
    // Released pins this WaveGate created go, once no halt may still create or count them (a
    // halt's pins are created and judged only until it pinned back): revert gave their
    // Applications back, and a Released pin holds nothing.
    if cx.next.halt.as_ref().is_none_or(|h| h.pinned_at.is_some()) {
        cx.actions
            .extend(obs.released_pins.iter().cloned().map(Action::DeletePin));
    }
    cx.next.phase = phase(&cx.next);
    let active = active_wave(&cx.next);
    let shown = match (&cx.next.halt, active) {
        (Some(h), _) => spec.waves.iter().position(|w| w.name == h.wave),
        (None, Some(i)) => Some(i),
        (None, None) if !cx.next.waves.is_empty() => Some(cx.next.waves.len() - 1),
        _ => None,
    };
    cx.next.current_wave_index = shown.map(|i| i as u32);
    cx.next.current_wave = shown
        .and_then(|i| spec.waves.get(i))
        .map(|w| w.name.clone());
    Decision {
        actions: cx.actions,
        status: cx.next,
        requeue,
    }
}

fn phase(s: &WaveGateStatus) -> WaveGatePhase {
    let refused =
        |t: &str| cond::find(&s.conditions, t).is_some_and(|c| c.status == Status::False.as_str());
    if refused(types::READY) || refused(types::APPLICATION_SET_SAFE) {
        return WaveGatePhase::Refused;
    }
    if s.decisions.is_empty() {
        return WaveGatePhase::Pending;
    }
    if s.halt.is_some() {
        return WaveGatePhase::Halted;
    }
    match active_wave(s).map(|i| s.waves[i].state) {
        None => WaveGatePhase::Complete,
        Some(WaveState::Soaking) => WaveGatePhase::Soaking,
        Some(WaveState::Waiting) => WaveGatePhase::WaitingForSite,
        Some(_) => WaveGatePhase::Progressing,
    }
}

fn step(cx: &mut Ctx<'_>) -> Requeue {
    let spec = cx.spec;
    let every = interval(spec);

    // 1. The spec.
    let problems = validity::problems(spec, cx.obs.allow_free_form_promql);
    let v = cond::set_validity(
        &mut cx.next.conditions,
        &problems,
        cx.obs.generation,
        cx.now,
    );
    if v.transitioned {
        if v.valid {
            cx.event(
                Severity::Normal,
                reasons::VALID,
                actions::VALIDATE,
                "spec accepted".into(),
            );
        } else {
            cx.event(
                Severity::Warning,
                reasons::INVALID_SPEC,
                actions::VALIDATE,
                v.message,
            );
        }
    }
    if !v.valid {
        // Waited on: the object must change.
        return Requeue::AwaitChange;
    }

    // 2. The ApplicationSet must never delete Applications or their resources.
    let (safe, reason, message) = match &cx.obs.application_set {
        ApplicationSetView::Missing => (
            false,
            reasons::APPLICATION_SET_NOT_FOUND,
            format!(
                "ApplicationSet {} not found; create it or fix spec.applicationSetRef",
                spec.application_set_ref.name
            ),
        ),
        ApplicationSetView::Found(p) if p.is_empty() => (
            true,
            reasons::APPLICATION_SET_OK,
            "applicationsSync is create-update, preserveResourcesOnDeletion is true, ignoreApplicationDifferences covers /spec/syncPolicy of every Application and the template takes each Application's revision and cluster from its decision".into(),
        ),
        ApplicationSetView::Found(p) => (
            false,
            match p[0] {
                UnsafeApplicationSet::ApplicationsSync(_) => reasons::APPLICATIONS_SYNC_UNSAFE,
                UnsafeApplicationSet::ResourcesNotPreserved => reasons::RESOURCES_NOT_PRESERVED,
                UnsafeApplicationSet::SyncPolicyNotIgnored => reasons::SYNC_POLICY_NOT_IGNORED,
                UnsafeApplicationSet::TemplateNotFromDecisions(_) => {
                    reasons::TEMPLATE_NOT_FROM_DECISIONS
                }
            },
            format!(
                "ApplicationSet {}: {}; the WaveGate publishes nothing until it is fixed",
                spec.application_set_ref.name,
                p.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
    };
    // The controller-level policy and the generator binding, beyond the ApplicationSet's spec.
    let (safe, reason, message) = match (
        safe,
        controller_policy_problem(cx.obs.controller_params.as_ref()),
        binding_problem(&cx.obs.decision_resources, &cx.obs.name),
    ) {
        (true, Some(p), _) => (
            false,
            reasons::APPLICATIONS_SYNC_UNSAFE,
            format!(
                "ApplicationSet {}: {p}; the WaveGate publishes nothing until it is fixed",
                spec.application_set_ref.name
            ),
        ),
        (true, None, Some(b)) => (
            false,
            reasons::NOT_THIS_WAVE_GATE,
            format!(
                "ApplicationSet {}: {b}; the WaveGate publishes nothing until it is fixed",
                spec.application_set_ref.name
            ),
        ),
        other => (other.0, reason, message),
    };
    let status = if safe { Status::True } else { Status::False };
    if cx.condition(types::APPLICATION_SET_SAFE, status, reason, message.clone()) {
        let severity = if safe {
            Severity::Normal
        } else {
            Severity::Warning
        };
        cx.event(severity, reason, actions::CHECK_APPLICATION_SET, message);
    }
    if !safe {
        return Requeue::After(every);
    }

    // 3. The drift signal, stated explicitly.
    match spec.drift_gate.exporter {
        DriftExporter::None => cx.condition(
            types::DRIFT_SIGNAL,
            Status::False,
            reasons::DRIFT_EXPORTER_ABSENT,
            "driftGate.exporter is None: the platform has no drift exporter, so proxies' acknowledgement is not checked and the proxies-behind gate is reported as skipped".into(),
        ),
        DriftExporter::Platform => cx.condition(
            types::DRIFT_SIGNAL,
            Status::True,
            reasons::DRIFT_SIGNAL_PRESENT,
            format!(
                "reading {} by {} and {}",
                spec.drift_gate.metric.as_deref().unwrap_or_default(),
                spec.drift_gate.cluster_label,
                spec.drift_gate.commit_label
            ),
        ),
    };

    // 4. Adoption: publish the revision the site runs for every cluster.
    if cx.next.decisions.is_empty() {
        match adoption_revision(spec, cx.obs) {
            Ok(r) => {
                cx.next.decisions = decisions::complete(spec, &[], &r);
                cx.next.current_revision = Some(r.clone());
                if r == spec.revision {
                    cx.next.source_commit = spec.source_commit.clone();
                }
                cx.next.waves.clear();
                cx.next.history.push(ChangeRecord {
                    revision: r.clone(),
                    previous_revision: None,
                    started_at: Time(cx.now),
                    finished_at: Some(Time(cx.now)),
                    outcome: Some(ChangeOutcome::Complete),
                    reason: Some("adopted: the revision the site ran".into()),
                });
                let note = format!(
                    "adopted: every cluster of site {} published at {r}",
                    spec.site
                );
                cx.condition(
                    types::PROGRESSING,
                    Status::False,
                    reasons::ADOPTED,
                    note.clone(),
                );
                cx.event(Severity::Normal, reasons::ADOPTED, actions::ADOPT, note);
                cx.actions.push(Action::NudgeApplicationSet);
            }
            Err(why) => {
                if cx.condition(
                    types::PROGRESSING,
                    Status::Unknown,
                    reasons::ADOPTION_PENDING,
                    why.clone(),
                ) {
                    cx.event(
                        Severity::Warning,
                        reasons::ADOPTION_PENDING,
                        actions::ADOPT,
                        why,
                    );
                }
                return Requeue::After(every);
            }
        }
    } else {
        // Keep the list complete if spec.waves changed.
        let fallback = cx
            .next
            .previous_revision
            .clone()
            .or(cx.next.current_revision.clone())
            .unwrap_or_else(|| spec.revision.clone());
        cx.next.decisions = decisions::complete(spec, &cx.next.decisions, &fallback);
    }
    align_waves(cx);

    // 5. A halt: pins first, then decisions back; nothing else moves until both are done.
    let new_revision = cx.next.current_revision.as_deref() != Some(spec.revision.as_str());
    let mut halt_requeue = Requeue::AwaitChange;
    if let Some(h) = &cx.next.halt {
        let pinned = h.pinned_at.is_some() || cx.next.previous_revision.is_none();
        let r = finish_halt(cx);
        if !new_revision || (!pinned && spec.supersede_halted) {
            return r;
        }
        halt_requeue = r;
    }

    // 6. A new revision. While an unfinished halt holds it (no supersede), the halt's own
    // requeue (its pin wait) is kept: waiting only for a change would lose the fallback.
    if new_revision && let Some(r) = start_change(cx) {
        return match &cx.next.halt {
            Some(h) if h.pinned_at.is_none() => sooner(r, halt_requeue),
            _ => r,
        };
    }

    // 7. Move the change on.
    progress(cx)
}

/// The earlier of two requeues (waiting for a change is the latest).
fn sooner(a: Requeue, b: Requeue) -> Requeue {
    match (a, b) {
        (Requeue::After(x), Requeue::After(y)) => Requeue::After(x.min(y)),
        (Requeue::After(x), Requeue::AwaitChange) | (Requeue::AwaitChange, Requeue::After(x)) => {
            Requeue::After(x)
        }
        (Requeue::AwaitChange, Requeue::AwaitChange) => Requeue::AwaitChange,
    }
}

/// Keeps `status.waves` in spec order, carrying each wave's state by name.
fn align_waves(cx: &mut Ctx<'_>) {
    if cx.next.waves.is_empty() {
        return;
    }
    let old: BTreeMap<String, WaveStatus> = cx
        .next
        .waves
        .drain(..)
        .map(|w| (w.name.clone(), w))
        .collect();
    cx.next.waves = cx
        .spec
        .waves
        .iter()
        .map(|w| {
            old.get(&w.name).cloned().unwrap_or_else(|| WaveStatus {
                name: w.name.clone(),
                ..WaveStatus::default()
            })
        })
        .collect();
}

/// Starts the change to `spec.revision`, or returns why it waits.
fn start_change(cx: &mut Ctx<'_>) -> Option<Requeue> {
    let spec = cx.spec;
    let halted = cx.next.halt.is_some();
    if halted && !spec.supersede_halted {
        let note = format!(
            "spec.revision {} waits: the change to {} halted; set spec.supersedeHalted to start the new revision from the first wave",
            spec.revision,
            cx.next.current_revision.as_deref().unwrap_or("?")
        );
        if cx.condition(
            types::PROGRESSING,
            Status::False,
            reasons::BLOCKED_BY_HALT,
            note.clone(),
        ) {
            cx.event(
                Severity::Warning,
                reasons::BLOCKED_BY_HALT,
                actions::CHANGE,
                note,
            );
        }
        return Some(Requeue::AwaitChange);
    }
    // Drift is read by spec.sourceCommit: the same commit as the previous revision's reads
    // the old commit's drift (about 0) and would converge at once.
    if spec.drift_gate.exporter == DriftExporter::Platform
        && spec.source_commit.is_some()
        && spec.source_commit == cx.next.source_commit
    {
        let note = format!(
            "spec.revision {} waits: spec.sourceCommit {} is the commit of the previous revision {}; set the new bundle's commit (its org.opencontainers.image.revision)",
            spec.revision,
            spec.source_commit.as_deref().unwrap_or_default(),
            cx.next.current_revision.as_deref().unwrap_or("?")
        );
        if cx.condition(
            types::PROGRESSING,
            Status::False,
            reasons::SOURCE_COMMIT_UNCHANGED,
            note.clone(),
        ) {
            cx.event(
                Severity::Warning,
                reasons::SOURCE_COMMIT_UNCHANGED,
                actions::CHANGE,
                note,
            );
        }
        return Some(Requeue::AwaitChange);
    }
    let in_progress = !cx.next.waves.is_empty() && active_wave(&cx.next).is_some();
    let complete = !halted && !in_progress;
    if halted || in_progress {
        cx.history_finish(ChangeOutcome::Superseded);
        let note = format!(
            "the change to {} is superseded by {}; starting again from wave {}",
            cx.next.current_revision.as_deref().unwrap_or("?"),
            spec.revision,
            spec.waves[0].name
        );
        cx.event(Severity::Normal, reasons::SUPERSEDED, actions::CHANGE, note);
    }
    // What a breach pins back to: the spec's word, else the last completed revision.
    let previous = spec.previous_revision.clone().or_else(|| {
        if complete {
            cx.next.current_revision.clone()
        } else {
            cx.next.previous_revision.clone()
        }
    });
    // Superseding a change mid-way: clusters of waves admitted but not yet passed would stay on
    // the superseded revision unjudged (the new change judges only its own active wave), so they
    // go back to the previous revision; waves that passed keep it (it was judged there).
    if in_progress
        && !halted
        && let Some(prev) = previous.as_deref()
    {
        let back: Vec<String> = spec
            .waves
            .iter()
            .zip(&cx.next.waves)
            .filter(|(_, ws)| admitted(ws.state) && !done(ws.state))
            .flat_map(|(w, _)| w.clusters.iter().cloned())
            .collect();
        if !back.is_empty() {
            decisions::set_revision(&mut cx.next.decisions, &back, prev);
            cx.history_note(&format!(
                "superseded mid-wave: {} set back to {prev} until the new change reaches them",
                back.join(", ")
            ));
        }
    }
    cx.next.previous_revision = previous;
    cx.next.current_revision = Some(spec.revision.clone());
    cx.next.source_commit = spec.source_commit.clone();
    cx.next.halt = None;
    cond::remove(&mut cx.next.conditions, types::HALTED);
    cx.next.waves = spec
        .waves
        .iter()
        .map(|w| WaveStatus {
            name: w.name.clone(),
            ..WaveStatus::default()
        })
        .collect();
    cx.history_start(None);
    None
}

fn emergency_applies(spec: &WaveGateSpec) -> Option<&str> {
    spec.emergency
        .as_ref()
        .filter(|e| e.revision == spec.revision)
        .map(|e| e.reason.as_str())
}

fn progress(cx: &mut Ctx<'_>) -> Requeue {
    let spec = cx.spec;
    let every = interval(spec);
    if let Some(reason) = emergency_applies(spec)
        && active_wave(&cx.next).is_some()
    {
        let reason = reason.to_owned();
        let rev = spec.revision.clone();
        for (i, w) in spec.waves.iter().enumerate() {
            let ws = &mut cx.next.waves[i];
            if done(ws.state) {
                continue;
            }
            ws.state = WaveState::Skipped;
            ws.revision = Some(rev.clone());
            ws.admitted_at.get_or_insert(Time(cx.now));
            ws.finished_at = Some(Time(cx.now));
            ws.waiting_for = None;
            decisions::set_revision(&mut cx.next.decisions, &w.clusters, &rev);
        }
        cx.history_note(&format!("emergency: {reason}"));
        cx.history_finish(ChangeOutcome::Emergency);
        let note = format!(
            "emergency change: every wave admitted at {rev} without soak or gates; reason: {reason}"
        );
        cx.condition(
            types::PROGRESSING,
            Status::False,
            reasons::EMERGENCY,
            note.clone(),
        );
        cx.event(Severity::Warning, reasons::EMERGENCY, actions::ADMIT, note);
        cx.actions.push(Action::NudgeApplicationSet);
        return Requeue::AwaitChange;
    }

    // Several steps may happen in one reconcile (a wave passes, the next is admitted).
    for _ in 0..=spec.waves.len() {
        let Some(i) = active_wave(&cx.next) else {
            if !cx.next.waves.is_empty() {
                let note = format!("every wave runs {}", spec.revision);
                if cx.condition(
                    types::PROGRESSING,
                    Status::False,
                    reasons::COMPLETE,
                    note.clone(),
                ) {
                    cx.history_finish(ChangeOutcome::Complete);
                    cx.event(Severity::Normal, reasons::COMPLETE, actions::ADMIT, note);
                }
            }
            return Requeue::AwaitChange;
        };
        match cx.next.waves[i].state {
            WaveState::Pending | WaveState::Waiting => return admit(cx, i),
            WaveState::Converging => {
                if let Some(r) = converge(cx, i) {
                    return r;
                }
            }
            WaveState::Soaking => {
                if let Some(r) = soak_step(cx, i) {
                    return r;
                }
            }
            // A failed or reverted wave without a halt record cannot arise; hold.
            _ => return Requeue::After(every),
        }
    }
    Requeue::After(every)
}

fn admit(cx: &mut Ctx<'_>, i: usize) -> Requeue {
    let spec = cx.spec;
    let wave = &spec.waves[i];
    let rev = spec.revision.clone();
    let mut waiting = Vec::new();
    let mut released = Vec::new();
    for wait in &wave.wait_for {
        if cx
            .obs
            .passed_elsewhere
            .contains(&(wait.site.clone(), wait.wave.clone()))
        {
            continue;
        }
        match spec
            .wait_releases
            .iter()
            .find(|r| r.site == wait.site && r.revision == rev)
        {
            Some(r) => released.push(format!("site {} released: {}", r.site, r.reason)),
            None => waiting.push(format!("site {} past wave {}", wait.site, wait.wave)),
        }
    }
    if !waiting.is_empty() {
        let what = waiting.join(", ");
        let ws = &mut cx.next.waves[i];
        ws.state = WaveState::Waiting;
        ws.waiting_for = Some(what.clone());
        let note = format!("wave {} waits for {what} at {rev}", wave.name);
        if cx.condition(
            types::PROGRESSING,
            Status::True,
            reasons::WAITING_FOR_SITE,
            note.clone(),
        ) {
            cx.event(
                Severity::Normal,
                reasons::WAITING_FOR_SITE,
                actions::ADMIT,
                note,
            );
        }
        return Requeue::After(interval(spec));
    }
    for r in &released {
        let note = format!("wave {}: cross-site wait {r}", wave.name);
        cx.history_note(&note);
        cx.event(
            Severity::Warning,
            reasons::WAIT_RELEASED,
            actions::ADMIT,
            note,
        );
    }
    let ws = &mut cx.next.waves[i];
    ws.state = WaveState::Converging;
    ws.revision = Some(rev.clone());
    ws.admitted_at = Some(Time(cx.now));
    ws.waiting_for = None;
    decisions::set_revision(&mut cx.next.decisions, &wave.clusters, &rev);
    let note = format!(
        "wave {} ({}) admitted at {rev}",
        wave.name,
        wave.clusters.join(", ")
    );
    cx.condition(
        types::PROGRESSING,
        Status::True,
        reasons::WAVE_ADMITTED,
        note.clone(),
    );
    cx.event(
        Severity::Normal,
        reasons::WAVE_ADMITTED,
        actions::ADMIT,
        note,
    );
    cx.actions.push(Action::NudgeApplicationSet);
    Requeue::After(interval(spec).min(convergence_timeout(spec)))
}

fn converge(cx: &mut Ctx<'_>, i: usize) -> Option<Requeue> {
    let spec = cx.spec;
    let c = convergence(spec, i, &spec.revision, cx.obs);
    let ws = &mut cx.next.waves[i];
    ws.applications = Some(c.counts.clone());
    ws.proxies_behind = c.proxies_behind;
    let admitted_at = ws.admitted_at.as_ref().map_or(cx.now, ts);
    if c.ok {
        ws.state = WaveState::Soaking;
        // Status times have whole-second precision: the soak starts at the next whole second,
        // so the soak a restarted operator reads back is never shorter than the one decided.
        ws.converged_at = Some(Time(ceil_second(cx.now)));
        ws.gates.clear();
        let end = add(ceil_second(cx.now), soak(spec, i));
        let note = format!(
            "wave {} converged at {}; soaking until {end}",
            spec.waves[i].name, spec.revision
        );
        cx.condition(
            types::PROGRESSING,
            Status::True,
            reasons::SOAKING,
            note.clone(),
        );
        cx.event(Severity::Normal, reasons::SOAKING, actions::SOAK, note);
        // Gates are due at once.
        return Some(Requeue::After(Duration::ZERO));
    }
    let deadline = add(admitted_at, convergence_timeout(spec));
    if cx.now >= deadline {
        let message = format!(
            "wave {} did not converge within {}: {}",
            spec.waves[i].name, spec.convergence_timeout, c.detail
        );
        halt(cx, i, HaltReason::ConvergenceTimeout, message, None);
        return Some(finish_halt(cx));
    }
    Some(Requeue::After(interval(spec).min(until(cx.now, deadline))))
}

fn soak_step(cx: &mut Ctx<'_>, i: usize) -> Option<Requeue> {
    let spec = cx.spec;
    let every = interval(spec);
    let c = convergence(spec, i, &spec.revision, cx.obs);
    {
        let ws = &mut cx.next.waves[i];
        ws.applications = Some(c.counts.clone());
        ws.proxies_behind = c.proxies_behind;
    }
    if let Some(evaluated) = &cx.obs.gates {
        let mut verdicts: Vec<GateVerdict> = evaluated.iter().map(|g| g.verdict.clone()).collect();
        if spec.drift_gate.exporter == DriftExporter::None {
            for g in spec.effective_gates() {
                if g.definition.builtin == Some(sluice_api::v1alpha1::BuiltinGate::ProxiesBehind)
                    && !verdicts.iter().any(|v| v.gate == g.name)
                {
                    verdicts.push(skipped_verdict(&g.name, cx.now));
                }
            }
        }
        cx.next.waves[i].gates = verdicts;
        if let Some(bad) = evaluated.iter().find(|g| g.action == GateAction::Abort) {
            let reason = if bad.verdict.verdict == Verdict::Fail {
                HaltReason::GateFailed
            } else {
                HaltReason::InconclusiveTimeout
            };
            let v = &bad.verdict;
            let message = format!(
                "wave {}: gate {} {:?} ({}): value {}, threshold {}, samples {}{}",
                spec.waves[i].name,
                v.gate,
                v.verdict,
                v.reason.as_str(),
                v.value.map_or("none".into(), |x| x.to_string()),
                v.threshold.map_or("none".into(), |x| x.to_string()),
                v.samples.map_or("unknown".into(), |x| x.to_string()),
                v.message
                    .as_deref()
                    .map(|m| format!("; {m}"))
                    .unwrap_or_default()
            );
            halt(cx, i, reason, message, Some(v.clone()));
            return Some(finish_halt(cx));
        }
    }
    let end = soak_end(spec, &cx.next, i).unwrap_or(cx.now);
    if cx.now < end {
        let next_eval = cx.next.waves[i]
            .gates
            .iter()
            .filter(|g| g.reason != VerdictReason::Skipped)
            .map(|g| add(ts(&g.evaluated_at), every))
            .min()
            .unwrap_or(cx.now);
        return Some(Requeue::After(until(cx.now, next_eval.min(end))));
    }
    // The soak has ended: every gate green, evaluated after the end, and still converged.
    let ws = &cx.next.waves[i];
    let fresh = !ws.gates.is_empty()
        && ws
            .gates
            .iter()
            .filter(|g| g.reason != VerdictReason::Skipped)
            .all(|g| ts(&g.evaluated_at) >= end);
    let green = cx
        .obs
        .gates
        .as_ref()
        .is_some_and(|gs| gs.iter().all(|g| g.action == GateAction::Proceed));
    if fresh && green && c.ok {
        let ws = &mut cx.next.waves[i];
        ws.state = WaveState::Passed;
        ws.finished_at = Some(Time(cx.now));
        let note = format!(
            "wave {} passed at {}: soak ended with every gate green",
            spec.waves[i].name, spec.revision
        );
        cx.condition(
            types::PROGRESSING,
            Status::True,
            reasons::WAVE_PASSED,
            note.clone(),
        );
        cx.event(Severity::Normal, reasons::WAVE_PASSED, actions::SOAK, note);
        return None;
    }
    // Say what holds the wave past its soak (readable in `kubectl describe`).
    if let Some(gs) = &cx.obs.gates {
        let mut holding: Vec<String> = gs
            .iter()
            .filter(|g| g.action != GateAction::Proceed)
            .map(|g| {
                let paused = if g.action == GateAction::Pause {
                    ", paused by policy"
                } else {
                    ""
                };
                format!(
                    "{} {:?} ({}{paused})",
                    g.verdict.gate,
                    g.verdict.verdict,
                    g.verdict.reason.as_str()
                )
            })
            .collect();
        if !c.ok {
            holding.push(c.detail.clone());
        }
        if !holding.is_empty() {
            let note = format!(
                "wave {} soaked but is held: {}",
                spec.waves[i].name,
                holding.join("; ")
            );
            cx.condition(types::PROGRESSING, Status::True, reasons::SOAKING, note);
        }
    }
    if !c.ok && cx.now >= add(end, convergence_timeout(spec)) {
        let message = format!(
            "wave {} lost convergence during its soak and did not regain it within {}: {}",
            spec.waves[i].name, spec.convergence_timeout, c.detail
        );
        halt(cx, i, HaltReason::ConvergenceTimeout, message, None);
        return Some(finish_halt(cx));
    }
    Some(Requeue::After(every))
}

fn admitted_clusters(spec: &WaveGateSpec, s: &WaveGateStatus) -> Vec<String> {
    spec.waves
        .iter()
        .zip(&s.waves)
        .filter(|(_, ws)| admitted(ws.state))
        .flat_map(|(w, _)| w.clusters.iter().cloned())
        .collect()
}

/// The pins of a halt: one per admitted cluster that has Applications.
pub fn pin_plans(spec: &WaveGateSpec, status: &WaveGateStatus, obs: &Observations) -> Vec<PinPlan> {
    let (Some(h), Some(previous)) = (&status.halt, &status.previous_revision) else {
        return Vec::new();
    };
    let revision = status.current_revision.as_deref().unwrap_or(&spec.revision);
    h.reverted_clusters
        .iter()
        .flat_map(|c| {
            let mut applications: Vec<AppRef> = obs
                .applications
                .iter()
                .filter(|a| &a.cluster == c)
                .map(|a| AppRef {
                    name: a.name.clone(),
                    namespace: a.namespace.clone(),
                })
                .collect();
            applications.sort();
            // A pin targets at most MAX_TARGETS Applications: a cluster with more gets several
            // pins (none is left out); the first keeps the cluster's plain name.
            applications
                .chunks(pins::MAX_TARGETS)
                .enumerate()
                .map(|(i, chunk)| {
                    let key = if i == 0 {
                        c.clone()
                    } else {
                        format!("{c}/{i}")
                    };
                    PinPlan {
                        name: pins::pin_name(
                            &obs.namespace,
                            &obs.name,
                            pins::HaltKey {
                                revision,
                                previous,
                                halted_at: h.halted_at.0.as_second(),
                            },
                            &key,
                        ),
                        cluster: c.clone(),
                        applications: chunk.to_vec(),
                        digest: previous.clone(),
                        // The CRD's bounds: 10..3600 s.
                        deadline_seconds: obs.pin_wait.as_secs().clamp(10, 3600) as u32,
                        reason: format!(
                            "WaveGate {}/{} halted {revision} in wave {}: {}",
                            obs.namespace,
                            obs.name,
                            h.wave,
                            h.message.as_deref().unwrap_or_default()
                        ),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn halt(
    cx: &mut Ctx<'_>,
    i: usize,
    reason: HaltReason,
    message: String,
    gate: Option<GateVerdict>,
) {
    let spec = cx.spec;
    cx.next.waves[i].state = WaveState::Failed;
    cx.next.waves[i].finished_at = Some(Time(cx.now));
    let reverted = admitted_clusters(spec, &cx.next);
    cx.next.halt = Some(HaltStatus {
        reason,
        message: Some(message.chars().take(4096).collect()),
        wave: spec.waves[i].name.clone(),
        gate,
        halted_at: Time(cx.now),
        pins: Vec::new(),
        reverted_clusters: reverted,
        pinned_at: None,
    });
    let names: Vec<String> = pin_plans(spec, &cx.next, cx.obs)
        .into_iter()
        .map(|p| p.name)
        .collect();
    if let Some(h) = cx.next.halt.as_mut() {
        h.pins = names;
    }
    let r = match reason {
        HaltReason::ConvergenceTimeout => reasons::CONVERGENCE_TIMEOUT,
        HaltReason::GateFailed | HaltReason::InconclusiveTimeout => reasons::GATE_FAILED,
    };
    let note = format!("halted: {message}");
    cx.condition(types::HALTED, Status::True, r, note.clone());
    cx.condition(types::PROGRESSING, Status::False, r, note.clone());
    cx.history_finish(ChangeOutcome::Halted);
    cx.event(Severity::Warning, r, actions::HALT, note);
}

/// Pins first; once every pin exists, the admitted clusters' decisions go back to the previous
/// revision so Argo CD converges on what the pins applied.
fn finish_halt(cx: &mut Ctx<'_>) -> Requeue {
    let spec = cx.spec;
    let Some(h) = cx.next.halt.clone() else {
        return Requeue::AwaitChange;
    };
    if h.pinned_at.is_some() {
        return Requeue::AwaitChange;
    }
    let Some(previous) = cx.next.previous_revision.clone() else {
        let note = "halted, but no previous revision is known (set spec.previousRevision); nothing pinned and decisions unchanged".to_owned();
        if cx.condition(
            types::HALTED,
            Status::True,
            reasons::GATE_FAILED,
            note.clone(),
        ) {
            cx.event(Severity::Warning, reasons::GATE_FAILED, actions::PIN, note);
        }
        return Requeue::AwaitChange;
    };
    let plans = pin_plans(spec, &cx.next, cx.obs);
    let missing: Vec<PinPlan> = plans
        .into_iter()
        .filter(|p| !cx.obs.existing_pins.contains(&p.name))
        .collect();
    if !missing.is_empty() {
        cx.actions
            .extend(missing.into_iter().map(Action::CreatePin));
        // The pins' creation is observed on the next reconcile.
        return Requeue::After(Duration::from_millis(200));
    }
    // The decisions go back only once revert holds every pin (automation suspended, bundle
    // applied): set back earlier, Argo CD would sync the previous revision itself, racing revert
    // and leaving its audit without the halted revision. A pin revert refused or failed, or one
    // not in force within `pin_wait`, does not hold the set-back: Argo CD then reverts.
    let plans = pin_plans(spec, &cx.next, cx.obs);
    let phase = |name: &str| cx.obs.pin_phases.get(name).copied();
    let pending: Vec<&str> = plans
        .iter()
        .map(|p| p.name.as_str())
        .filter(|n| {
            !matches!(
                phase(n),
                Some(
                    BundlePinPhase::Pinned
                        | BundlePinPhase::Released
                        | BundlePinPhase::Refused
                        | BundlePinPhase::Failed
                )
            )
        })
        .collect();
    let waited = until(h.halted_at.0, cx.now);
    if !pending.is_empty() && waited < cx.obs.pin_wait {
        return Requeue::After(Duration::from_millis(250));
    }
    // A pin not in force by the pin wait reaches its own deadline (`pinDeadlineSeconds`, set to
    // the pin wait) at the same moment: revert then gives each Application its recorded sync
    // policy back, so Argo CD itself syncs the decision set back. (Assuming Argo CD acts while
    // revert keeps automation suspended would leave the cluster on the halted revision.)
    let mut caveats: Vec<String> = plans
        .iter()
        .filter_map(|p| match phase(&p.name) {
            Some(ph @ (BundlePinPhase::Refused | BundlePinPhase::Failed)) => Some(format!(
                "revert reports {} {ph:?} (automation given back): Argo CD reverts {} from the decision",
                p.name, p.cluster
            )),
            _ => None,
        })
        .collect();
    if !pending.is_empty() {
        caveats.push(format!(
            "{} not in force after {}s: at their deadline revert gives automation back, and the decisions are set back without waiting longer",
            pending.join(", "),
            cx.obs.pin_wait.as_secs()
        ));
    }
    decisions::set_revision(&mut cx.next.decisions, &h.reverted_clusters, &previous);
    for ws in cx.next.waves.iter_mut() {
        if admitted(ws.state) && ws.state != WaveState::Failed {
            ws.state = WaveState::Reverted;
        }
    }
    let mut note = format!(
        "pinned back to {previous}: {} BundlePin(s) ({}) for cluster(s) {}; their decisions set back",
        h.pins.len(),
        h.pins.join(", "),
        h.reverted_clusters.join(", ")
    );
    if !caveats.is_empty() {
        note.push_str(&format!(" ({})", caveats.join("; ")));
    }
    if let Some(hh) = cx.next.halt.as_mut() {
        hh.pinned_at = Some(Time(cx.now));
    }
    cx.condition(
        types::HALTED,
        Status::True,
        reasons::PINNED_BACK,
        note.clone(),
    );
    cx.event(Severity::Warning, reasons::PINNED_BACK, actions::PIN, note);
    cx.actions.push(Action::NudgeApplicationSet);
    Requeue::AwaitChange
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_api::v1alpha1::wave_gate::{conditions, reasons};

    fn rev(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn spec_with(patch: serde_json::Value) -> WaveGateSpec {
        let mut base = serde_json::json!({
            "site": "eu",
            "applicationSetRef": {"name": "mesh"},
            "repository": "oci://registry.local/mesh",
            "revision": rev('b'),
            "sourceCommit": "abc1234",
            "waves": [
                {"name": "canary", "clusters": ["c1"], "soak": "10s"},
                {"name": "rest", "clusters": ["c2", "c3"], "soak": "10s"}
            ],
            "convergenceTimeout": "60s",
            "analysisInterval": "5s",
            "driftGate": {"exporter": "Platform", "metric": "sluice_drift_proxies_behind"},
            "pin": {"publicKeysSecretRef": {"name": "keys"}},
        });
        for (k, v) in patch.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn spec() -> WaveGateSpec {
        spec_with(serde_json::json!({}))
    }

    fn app(cluster: &str, at: &str, healthy: bool) -> AppView {
        AppView {
            name: format!("mesh-{cluster}"),
            namespace: "argocd".into(),
            cluster: cluster.into(),
            sync_status: Some("Synced".into()),
            synced_revision: Some(at.into()),
            healthy,
        }
    }

    /// Observations where clusters in `on_b` run revision b (the rest a), all healthy, drift 0.
    fn obs(on_b: &[&str]) -> Observations {
        let apps = ["c1", "c2", "c3"]
            .iter()
            .map(|c| {
                let r = if on_b.contains(c) { rev('b') } else { rev('a') };
                app(c, &r, true)
            })
            .collect();
        Observations {
            namespace: "argocd".into(),
            name: "eu".into(),
            generation: Some(1),
            applications: apps,
            drift: ["c1", "c2", "c3"]
                .iter()
                .map(|c| ((*c).to_owned(), Some(0.0)))
                .collect(),
            ..Observations::default()
        }
    }

    fn verdict(gate: &str, v: Verdict, at: i64) -> EvaluatedGate {
        EvaluatedGate {
            verdict: GateVerdict {
                gate: gate.into(),
                verdict: v,
                reason: match v {
                    Verdict::Pass => VerdictReason::ThresholdMet,
                    Verdict::Fail => VerdictReason::ThresholdBreached,
                    Verdict::Inconclusive => VerdictReason::NoData,
                },
                message: None,
                value: Some(if v == Verdict::Fail { 0.2 } else { 0.0 }),
                baseline: None,
                threshold: Some(0.01),
                samples: Some(1000),
                min_samples: Some(100),
                consecutive_failures: u32::from(v == Verdict::Fail),
                inconclusive_since: None,
                evaluated_at: Time(t(at)),
            },
            action: match v {
                Verdict::Pass => GateAction::Proceed,
                Verdict::Fail => GateAction::Abort,
                Verdict::Inconclusive => GateAction::Wait,
            },
        }
    }

    fn all_gates(v: Verdict, at: i64) -> Option<Vec<EvaluatedGate>> {
        Some(
            ["mesh-error-ratio", "xds-nack-increase", "proxies-behind"]
                .iter()
                .map(|g| verdict(g, v, at))
                .collect(),
        )
    }

    fn events(d: &Decision) -> Vec<&'static str> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    fn pins_of(d: &Decision) -> Vec<&PinPlan> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePin(p) => Some(p),
                _ => None,
            })
            .collect()
    }

    fn revisions(d: &Decision) -> Vec<(String, String)> {
        d.status
            .decisions
            .iter()
            .map(|x| (x.cluster_name.clone(), x.revision[7..8].to_owned()))
            .collect()
    }

    fn on(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| ((*a).into(), (*b).into()))
            .collect()
    }

    /// Runs decide and checks the invariants every decision must keep.
    fn run(
        s: &WaveGateSpec,
        status: Option<&WaveGateStatus>,
        o: &Observations,
        now: i64,
    ) -> Decision {
        let d = decide(s, status, o, t(now));
        let required = status.is_some_and(|st| !st.decisions.is_empty());
        assert_eq!(
            decisions::publishable(s, &d.status.decisions, required),
            Ok(()),
            "decision list complete: {:?}",
            d.status.decisions
        );
        let again = decide(s, Some(&d.status), o, t(now));
        assert_eq!(
            again.status.decisions, d.status.decisions,
            "re-deciding from the written status changes no decision"
        );
        d
    }

    /// A change to b whose wave 0 converged at 10 s and soaks until 20 s.
    fn soaking() -> WaveGateStatus {
        let s = spec();
        let d0 = run(&s, None, &obs(&[]), 0);
        assert_eq!(d0.status.waves[0].state, WaveState::Converging);
        let d1 = run(&s, Some(&d0.status), &obs(&["c1"]), 10);
        assert_eq!(d1.status.waves[0].state, WaveState::Soaking);
        d1.status
    }

    #[test]
    fn adoption_then_wave_zero_admitted() {
        let s = spec();
        let d = run(&s, None, &obs(&[]), 0);
        assert_eq!(
            revisions(&d),
            on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
            "adopted at a for all, then wave 0 admitted at b"
        );
        assert_eq!(d.status.previous_revision, Some(rev('a')));
        assert_eq!(d.status.current_revision, Some(rev('b')));
        assert_eq!(d.status.phase, WaveGatePhase::Progressing);
        assert_eq!(d.status.current_wave.as_deref(), Some("canary"));
        assert_eq!(
            events(&d),
            vec![
                reasons::VALID,
                reasons::APPLICATION_SET_OK,
                reasons::ADOPTED,
                reasons::WAVE_ADMITTED
            ]
        );
        assert!(d.actions.contains(&Action::NudgeApplicationSet));
        assert_eq!(d.status.waves[0].admitted_at, Some(Time(t(0))));
        assert_eq!(d.status.history.len(), 2);
    }

    /// (name, spec patch, observations, want published revisions, want phase)
    type AdoptionRow = (
        &'static str,
        serde_json::Value,
        Observations,
        Vec<(String, String)>,
        WaveGatePhase,
    );

    #[test]
    fn adoption_table() {
        let mixed = {
            let mut o = obs(&["c2"]);
            o.applications[0].sync_status = Some("OutOfSync".into());
            o
        };
        let none = Observations {
            applications: vec![],
            ..obs(&[])
        };
        // (name, spec patch, observations, want published revisions, want phase)
        let cases: Vec<AdoptionRow> = vec![
            (
                "apps agree on a",
                serde_json::json!({}),
                obs(&[]),
                on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
                WaveGatePhase::Progressing,
            ),
            (
                "apps already at b",
                serde_json::json!({}),
                obs(&["c1", "c2", "c3"]),
                on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]),
                WaveGatePhase::Complete,
            ),
            (
                "apps disagree",
                serde_json::json!({}),
                mixed.clone(),
                vec![],
                WaveGatePhase::Pending,
            ),
            (
                "apps disagree, previousRevision set",
                serde_json::json!({"previousRevision": rev('c')}),
                mixed,
                on(&[("c1", "b"), ("c2", "c"), ("c3", "c")]),
                WaveGatePhase::Progressing,
            ),
            (
                "no apps yet",
                serde_json::json!({}),
                none.clone(),
                on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]),
                WaveGatePhase::Complete,
            ),
            (
                "apps exist but none observed for the site's clusters",
                serde_json::json!({}),
                Observations {
                    unmatched_applications: vec!["argocd/mesh-by-server".into()],
                    ..none
                },
                vec![],
                WaveGatePhase::Pending,
            ),
        ];
        for (name, patch, o, want, phase) in cases {
            let d = run(&spec_with(patch), None, &o, 0);
            assert_eq!(revisions(&d), want, "{name}");
            assert_eq!(d.status.phase, phase, "{name}");
            if phase == WaveGatePhase::Pending {
                let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
                assert_eq!(c.reason, reasons::ADOPTION_PENDING, "{name}");
                assert!(
                    c.message.contains("previousRevision"),
                    "{name}: {}",
                    c.message
                );
                assert!(matches!(d.requeue, Requeue::After(_)), "{name}");
            }
        }
    }

    #[test]
    fn unsafe_application_set_is_refused_table() {
        let published = run(&spec(), None, &obs(&[]), 0).status;
        let cases = [
            (
                ApplicationSetView::Missing,
                reasons::APPLICATION_SET_NOT_FOUND,
            ),
            (
                ApplicationSetView::Found(vec![UnsafeApplicationSet::ApplicationsSync(Some(
                    "sync".into(),
                ))]),
                reasons::APPLICATIONS_SYNC_UNSAFE,
            ),
            (
                ApplicationSetView::Found(vec![UnsafeApplicationSet::ResourcesNotPreserved]),
                reasons::RESOURCES_NOT_PRESERVED,
            ),
            (
                ApplicationSetView::Found(vec![UnsafeApplicationSet::SyncPolicyNotIgnored]),
                reasons::SYNC_POLICY_NOT_IGNORED,
            ),
            (
                ApplicationSetView::Found(vec![UnsafeApplicationSet::TemplateNotFromDecisions(
                    "spec.strategy is RollingSync".into(),
                )]),
                reasons::TEMPLATE_NOT_FROM_DECISIONS,
            ),
        ];
        for (view, reason) in cases {
            for status in [None, Some(&published)] {
                let o = Observations {
                    application_set: view.clone(),
                    ..obs(&[])
                };
                let d = run(&spec(), status, &o, 5);
                assert_eq!(d.status.phase, WaveGatePhase::Refused, "{reason}");
                let c = cond::find(&d.status.conditions, conditions::APPLICATION_SET_SAFE).unwrap();
                assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
                assert!(events(&d).contains(&reason), "{reason}: a Warning Event");
                assert_eq!(
                    d.status.decisions,
                    status.map(|s| s.decisions.clone()).unwrap_or_default(),
                    "{reason}: nothing published or changed"
                );
                assert!(!d.actions.contains(&Action::NudgeApplicationSet));
            }
        }
    }

    #[test]
    fn convergence_table() {
        let s = spec();
        let admitted = run(&s, None, &obs(&[]), 0).status;
        let mut unhealthy = obs(&["c1"]);
        unhealthy.applications[0].healthy = false;
        let mut behind = obs(&["c1"]);
        behind.drift.insert("c1".into(), Some(4.0));
        let mut no_signal = obs(&["c1"]);
        no_signal.drift.insert("c1".into(), None);
        let mut no_app = obs(&["c1"]);
        no_app.applications.remove(0);
        // (name, observations, now, want state, want detail in the halt)
        let cases = [
            ("converged", obs(&["c1"]), 10, WaveState::Soaking, None),
            ("not synced yet", obs(&[]), 10, WaveState::Converging, None),
            (
                "unhealthy",
                unhealthy.clone(),
                10,
                WaveState::Converging,
                None,
            ),
            (
                "proxies behind",
                behind.clone(),
                10,
                WaveState::Converging,
                None,
            ),
            (
                "no drift signal",
                no_signal.clone(),
                10,
                WaveState::Converging,
                None,
            ),
            (
                "not synced at timeout",
                obs(&[]),
                60,
                WaveState::Failed,
                Some("0/1 Applications Synced"),
            ),
            (
                "proxies never acknowledge",
                behind,
                61,
                WaveState::Failed,
                Some("c1=4"),
            ),
            (
                "drift signal missing at timeout",
                no_signal,
                61,
                WaveState::Failed,
                Some("no drift signal for cluster(s) c1"),
            ),
            (
                "no Application at timeout",
                no_app,
                61,
                WaveState::Failed,
                Some("no Application for cluster(s) c1"),
            ),
        ];
        for (name, o, now, want, detail) in cases {
            let d = run(&s, Some(&admitted), &o, now);
            assert_eq!(d.status.waves[0].state, want, "{name}");
            match detail {
                None => assert!(d.status.halt.is_none(), "{name}"),
                Some(text) => {
                    let h = d.status.halt.as_ref().unwrap();
                    assert_eq!(h.reason, HaltReason::ConvergenceTimeout, "{name}");
                    assert!(
                        h.message.as_deref().unwrap().contains(text),
                        "{name}: {:?}",
                        h.message
                    );
                    assert_eq!(d.status.phase, WaveGatePhase::Halted, "{name}");
                }
            }
        }
    }

    #[test]
    fn soak_and_gates_table() {
        let s = spec();
        let base = soaking();
        let mut unhealthy = obs(&["c1"]);
        unhealthy.applications[0].healthy = false;
        // (name, observations, gates, now, want wave 0 state, want wave 1 state)
        let cases = [
            (
                "green before the soak ends",
                obs(&["c1"]),
                all_gates(Verdict::Pass, 15),
                15,
                WaveState::Soaking,
                WaveState::Pending,
            ),
            (
                "green after the soak ends",
                obs(&["c1"]),
                all_gates(Verdict::Pass, 20),
                20,
                WaveState::Passed,
                WaveState::Converging,
            ),
            (
                "soak ended, gates not re-read",
                obs(&["c1"]),
                None,
                20,
                WaveState::Soaking,
                WaveState::Pending,
            ),
            (
                "inconclusive at the end holds",
                obs(&["c1"]),
                all_gates(Verdict::Inconclusive, 20),
                20,
                WaveState::Soaking,
                WaveState::Pending,
            ),
            (
                "unhealthy at the end holds",
                unhealthy,
                all_gates(Verdict::Pass, 20),
                20,
                WaveState::Soaking,
                WaveState::Pending,
            ),
            (
                "a gate fails",
                obs(&["c1"]),
                Some(vec![
                    verdict("mesh-error-ratio", Verdict::Fail, 15),
                    verdict("xds-nack-increase", Verdict::Pass, 15),
                ]),
                15,
                WaveState::Failed,
                WaveState::Pending,
            ),
        ];
        for (name, mut o, gates, now, w0, w1) in cases {
            o.gates = gates;
            let d = run(&s, Some(&base), &o, now);
            assert_eq!(d.status.waves[0].state, w0, "{name}");
            assert_eq!(d.status.waves[1].state, w1, "{name}");
            assert_eq!(
                d.status.waves[0].converged_at,
                Some(Time(t(10))),
                "{name}: the soak clock never resets"
            );
            if w1 == WaveState::Converging {
                assert_eq!(
                    revisions(&d),
                    on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]),
                    "{name}"
                );
                assert!(events(&d).contains(&reasons::WAVE_PASSED));
                assert!(events(&d).contains(&reasons::WAVE_ADMITTED));
            }
        }
    }

    #[test]
    fn gates_are_due_once_per_interval_and_after_the_soak_ends() {
        let s = spec();
        let base = soaking();
        assert_eq!(
            gates_due(&s, &base, t(10)),
            Some(0),
            "first evaluation at once"
        );
        let mut o = obs(&["c1"]);
        o.gates = all_gates(Verdict::Pass, 11);
        let d = run(&s, Some(&base), &o, 11);
        assert_eq!(gates_due(&s, &d.status, t(12)), None);
        assert_eq!(
            gates_due(&s, &d.status, t(16)),
            Some(0),
            "an interval later"
        );
        assert_eq!(gates_due(&s, &d.status, t(20)), Some(0), "the soak ended");
        assert_eq!(d.requeue, Requeue::After(Duration::from_secs(5)));
    }

    #[test]
    fn restart_during_a_soak_continues_the_same_soak() {
        let s = spec();
        let base = soaking();
        // A restarted operator decides from the written status alone.
        let d = run(&s, Some(&base), &obs(&["c1"]), 14);
        assert_eq!(d.status.waves[0].converged_at, Some(Time(t(10))));
        assert_eq!(d.status.waves[0].admitted_at, Some(Time(t(0))));
        assert!(
            !events(&d).contains(&reasons::WAVE_ADMITTED),
            "no re-admission"
        );
        assert!(!events(&d).contains(&reasons::SOAKING), "no new soak");
        assert!(!d.actions.contains(&Action::NudgeApplicationSet));
    }

    #[test]
    fn released_pins_of_this_wave_gate_are_deleted_once_the_halt_no_longer_needs_them() {
        let s = spec();
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let halted = run(&s, Some(&soaking()), &o, 15);
        let name = pins_of(&halted)[0].name.clone();
        let deleted = |d: &Decision| -> Vec<String> {
            d.actions
                .iter()
                .filter_map(|a| match a {
                    Action::DeletePin(n) => Some(n.clone()),
                    _ => None,
                })
                .collect()
        };
        // A pin released (spec.release by hand) before the halt pinned back is still counted
        // by the halt: kept.
        let mut o = obs(&["c1"]);
        o.existing_pins.insert(name.clone());
        o.pin_phases.insert(name.clone(), BundlePinPhase::Released);
        o.released_pins.insert(name.clone());
        let mut before = halted.status.clone();
        before.halt.as_mut().unwrap().pinned_at = None;
        let d = run(&s, Some(&before), &o, 16);
        assert!(
            d.status.halt.as_ref().unwrap().pinned_at.is_some(),
            "a Released pin lets the decisions go back"
        );
        // Pinned back: the released pin goes, now and on every later reconcile it still exists.
        assert_eq!(deleted(&d), vec![name.clone()]);
        let later = run(&s, Some(&d.status), &o, 100);
        assert_eq!(deleted(&later), vec![name.clone()]);
        assert_eq!(later.status, d.status);
        // Still in force (Pinned): kept.
        let mut held = o.clone();
        held.released_pins.clear();
        held.pin_phases.insert(name.clone(), BundlePinPhase::Pinned);
        assert!(deleted(&run(&s, Some(&d.status), &held, 100)).is_empty());
        // While the halt still creates and counts its pins: never deleted.
        let mut creating = obs(&["c1"]);
        creating.released_pins.insert(name.clone());
        let d = run(&s, Some(&halted.status), &creating, 16);
        assert!(deleted(&d).is_empty(), "{:?}", d.actions);
    }

    #[test]
    fn breach_halts_pins_admitted_clusters_then_sets_decisions_back() {
        let s = spec();
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let halted = run(&s, Some(&soaking()), &o, 15);
        let h = halted.status.halt.as_ref().unwrap();
        assert_eq!(h.reason, HaltReason::GateFailed);
        assert_eq!(h.gate.as_ref().unwrap().gate, "mesh-error-ratio");
        assert!(
            h.message
                .as_deref()
                .unwrap()
                .contains("value 0.2, threshold 0.01"),
            "{:?}",
            h.message
        );
        assert_eq!(
            h.reverted_clusters,
            vec!["c1".to_owned()],
            "only wave 0 was admitted"
        );
        let pins = pins_of(&halted);
        assert_eq!(pins.len(), 1);
        assert_eq!(pins[0].cluster, "c1");
        assert_eq!(pins[0].digest, rev('a'));
        assert_eq!(h.pins, vec![pins[0].name.clone()]);
        assert_eq!(
            revisions(&halted),
            on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
            "decisions go back only after the pins exist"
        );
        assert!(events(&halted).contains(&reasons::GATE_FAILED));

        // A retried reconcile (pin creation failed) asks for the same pin again.
        let retry = run(&s, Some(&halted.status), &obs(&["c1"]), 16);
        assert_eq!(pins_of(&retry).len(), 1);
        assert_eq!(pins_of(&retry)[0].name, pins[0].name);

        // Once the pin exists but revert does not hold it yet: no second pin, decisions wait.
        let mut o = obs(&["c1"]);
        o.existing_pins.insert(pins[0].name.clone());
        for phase in [
            None,
            Some(BundlePinPhase::Verifying),
            Some(BundlePinPhase::Pinning),
        ] {
            if let Some(ph) = phase {
                o.pin_phases.insert(pins[0].name.clone(), ph);
            }
            let waiting = run(&s, Some(&halted.status), &o, 16);
            assert!(pins_of(&waiting).is_empty());
            assert_eq!(
                revisions(&waiting),
                on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
                "decisions wait for revert to hold the pin ({phase:?})"
            );
            assert_eq!(waiting.status.halt.as_ref().unwrap().pinned_at, None);
        }
        // Revert waited out: the decisions go back anyway, and the note says why.
        let late = run(&s, Some(&halted.status), &o, 15 + 31);
        assert_eq!(
            revisions(&late),
            on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
        );
        let note = &cond::find(&late.status.conditions, types::HALTED)
            .unwrap()
            .message;
        assert!(note.contains("not in force after 30s"), "{note}");
        // Revert refused the pin: no reason to wait, Argo CD reverts from the decision.
        o.pin_phases
            .insert(pins[0].name.clone(), BundlePinPhase::Refused);
        let refused = run(&s, Some(&halted.status), &o, 16);
        assert_eq!(
            revisions(&refused),
            on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
        );
        // Revert holds the pin: decisions back, waves reverted, no second pin.
        o.pin_phases
            .insert(pins[0].name.clone(), BundlePinPhase::Pinned);
        let pinned = run(&s, Some(&halted.status), &o, 16);
        assert!(pins_of(&pinned).is_empty());
        assert_eq!(
            revisions(&pinned),
            on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
        );
        assert_eq!(
            pinned.status.halt.as_ref().unwrap().pinned_at,
            Some(Time(t(16)))
        );
        assert_eq!(pinned.status.phase, WaveGatePhase::Halted);
        assert_eq!(pinned.status.waves[0].state, WaveState::Failed);
        assert_eq!(
            pinned.status.waves[1].state,
            WaveState::Pending,
            "no later wave admitted"
        );
        assert!(events(&pinned).contains(&reasons::PINNED_BACK));
        let later = run(&s, Some(&pinned.status), &o, 100);
        assert_eq!(later.status, pinned.status, "a halt stays put");
        assert!(later.actions.is_empty());
    }

    #[test]
    fn new_revision_after_a_halt_table() {
        let s = spec();
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let halted = run(&s, Some(&soaking()), &o, 15);
        let mut o = obs(&[]);
        o.existing_pins = halted
            .status
            .halt
            .as_ref()
            .unwrap()
            .pins
            .iter()
            .cloned()
            .collect();
        o.pin_phases = o
            .existing_pins
            .iter()
            .map(|p| (p.clone(), BundlePinPhase::Pinned))
            .collect();
        let pinned = run(&s, Some(&halted.status), &o, 16).status;
        for (supersede, want_admitted) in [(false, false), (true, true)] {
            let s2 = spec_with(
                serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678", "supersedeHalted": supersede}),
            );
            let d = run(&s2, Some(&pinned), &o, 30);
            if want_admitted {
                assert_eq!(d.status.halt, None);
                assert_eq!(d.status.current_revision, Some(rev('c')));
                assert_eq!(
                    d.status.previous_revision,
                    Some(rev('a')),
                    "the halted revision is never a pin target"
                );
                assert_eq!(revisions(&d), on(&[("c1", "c"), ("c2", "a"), ("c3", "a")]));
                assert!(events(&d).contains(&reasons::SUPERSEDED));
                let h = &d.status.history;
                assert_eq!(h[h.len() - 2].outcome, Some(ChangeOutcome::Halted));
            } else {
                assert_eq!(d.status.phase, WaveGatePhase::Halted);
                assert_eq!(revisions(&d), on(&[("c1", "a"), ("c2", "a"), ("c3", "a")]));
                let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
                assert_eq!(c.reason, reasons::BLOCKED_BY_HALT);
                assert!(events(&d).contains(&reasons::BLOCKED_BY_HALT));
            }
        }
    }

    #[test]
    fn a_new_revision_during_a_soak_starts_again_from_wave_zero() {
        let s2 = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
        let d = run(&s2, Some(&soaking()), &obs(&["c1"]), 15);
        assert_eq!(d.status.current_revision, Some(rev('c')));
        assert_eq!(
            d.status.previous_revision,
            Some(rev('a')),
            "pins go back to the last completed revision"
        );
        assert_eq!(d.status.waves[0].state, WaveState::Converging);
        assert_eq!(d.status.waves[0].admitted_at, Some(Time(t(15))));
        assert_eq!(
            d.status.waves[0].converged_at, None,
            "a fresh soak for the new revision"
        );
        assert_eq!(revisions(&d), on(&[("c1", "c"), ("c2", "a"), ("c3", "a")]));
        assert!(events(&d).contains(&reasons::SUPERSEDED));
        let h = &d.status.history;
        assert_eq!(h[h.len() - 2].outcome, Some(ChangeOutcome::Superseded));
        assert_eq!(h[h.len() - 1].revision, rev('c'));
    }

    #[test]
    fn superseding_in_a_later_wave_sets_its_unjudged_clusters_back() {
        let s = spec();
        // Wave 0 passes, wave 1 is admitted on b.
        let passed = run(
            &s,
            Some(&soaking()),
            &{
                let mut o = obs(&["c1"]);
                o.gates = all_gates(Verdict::Pass, 25);
                o
            },
            25,
        );
        assert!(
            passed.status.waves[1].state != WaveState::Pending,
            "wave 1 admitted: {:?}",
            passed.status.waves
        );
        assert_eq!(
            revisions(&passed),
            on(&[("c1", "b"), ("c2", "b"), ("c3", "b")])
        );
        // Superseded by c while wave 1 soaks unjudged by c.
        let s2 = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
        let d = run(&s2, Some(&passed.status), &obs(&["c1", "c2", "c3"]), 26);
        assert_eq!(
            revisions(&d),
            on(&[("c1", "c"), ("c2", "a"), ("c3", "a")]),
            "wave 1 never stays on the superseded revision ungated"
        );
    }

    #[test]
    fn a_new_revision_with_the_previous_commit_is_refused() {
        // A completed change to b at commit abc1234.
        let s = spec();
        let done = run(
            &s,
            Some(&soaking()),
            &{
                let mut o = obs(&["c1"]);
                o.gates = all_gates(Verdict::Pass, 25);
                o
            },
            25,
        );
        assert_eq!(done.status.source_commit.as_deref(), Some("abc1234"));
        // Git bumps the revision but forgets sourceCommit: drift would read abc1234's (~0).
        let forgot = spec_with(serde_json::json!({"revision": rev('c')}));
        let d = run(&forgot, Some(&done.status), &obs(&["c1", "c2", "c3"]), 30);
        assert_eq!(d.status.current_revision, Some(rev('b')), "not started");
        let c = cond::find(&d.status.conditions, types::PROGRESSING).unwrap();
        assert_eq!(c.reason, reasons::SOURCE_COMMIT_UNCHANGED, "{}", c.message);
        assert!(events(&d).contains(&reasons::SOURCE_COMMIT_UNCHANGED));
        // With the new commit it starts.
        let fixed = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
        let d = run(&fixed, Some(&d.status), &obs(&["c1", "c2", "c3"]), 31);
        assert_eq!(d.status.current_revision, Some(rev('c')));
        assert_eq!(d.status.source_commit.as_deref(), Some("cde5678"));
    }

    #[test]
    fn the_controller_policy_and_the_generator_binding_are_checked() {
        let params = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let table = [
            (None, false),
            (Some(params(&[])), false),
            (Some(params(&[(CONTROLLER_POLICY_KEY, "sync")])), true),
            (
                Some(params(&[(CONTROLLER_POLICY_KEY, "create-delete")])),
                true,
            ),
            (
                Some(params(&[(CONTROLLER_POLICY_KEY, "create-update")])),
                false,
            ),
            (
                Some(params(&[(CONTROLLER_POLICY_KEY, "create-only")])),
                false,
            ),
            (
                Some(params(&[
                    (CONTROLLER_POLICY_KEY, "sync"),
                    (POLICY_OVERRIDE_KEY, "true"),
                ])),
                false,
            ),
            (
                Some(params(&[
                    (CONTROLLER_POLICY_KEY, "sync"),
                    (POLICY_OVERRIDE_KEY, "false"),
                ])),
                true,
            ),
        ];
        for (p, unsafe_) in table {
            assert_eq!(
                controller_policy_problem(p.as_ref()).is_some(),
                unsafe_,
                "{p:?}"
            );
        }
        assert!(
            binding_problem(&[], "eu").is_none(),
            "a label selector is not judged"
        );
        assert!(binding_problem(&["eu".into()], "eu").is_none());
        assert!(binding_problem(&["us".into()], "eu").is_some());

        // The WaveGate publishes nothing while the controller's policy would delete.
        let s = spec();
        let mut o = obs(&[]);
        o.controller_params = Some(params(&[(CONTROLLER_POLICY_KEY, "sync")]));
        let d = run(&s, None, &o, 0);
        assert!(d.status.decisions.is_empty(), "nothing published");
        let c = cond::find(&d.status.conditions, types::APPLICATION_SET_SAFE).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::APPLICATIONS_SYNC_UNSAFE)
        );
        let mut o = obs(&[]);
        o.decision_resources = vec!["other".into()];
        o.name = "eu".into();
        let d = run(&s, None, &o, 0);
        let c = cond::find(&d.status.conditions, types::APPLICATION_SET_SAFE).unwrap();
        assert_eq!(c.reason, reasons::NOT_THIS_WAVE_GATE, "{}", c.message);
    }

    #[test]
    fn a_cluster_with_more_applications_than_a_pin_holds_gets_several_pins() {
        let s = spec();
        let mut o = obs(&["c1"]);
        let template = o
            .applications
            .iter()
            .find(|a| a.cluster == "c1")
            .unwrap()
            .clone();
        o.applications.retain(|a| a.cluster != "c1");
        for i in 0..(pins::MAX_TARGETS + 6) {
            let mut a = template.clone();
            a.name = format!("mesh-c1-{i:03}");
            o.applications.push(a);
        }
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let halted = run(&s, Some(&soaking()), &o, 15);
        let plans = pins_of(&halted);
        assert_eq!(plans.len(), 2, "no Application left out");
        assert_eq!(plans[0].applications.len(), pins::MAX_TARGETS);
        assert_eq!(plans[1].applications.len(), 6);
        assert_ne!(plans[0].name, plans[1].name);
        assert!(plans.iter().all(|p| p.cluster == "c1"));
    }

    #[test]
    fn emergency_admits_every_wave_audited() {
        let s = spec_with(
            serde_json::json!({"emergency": {"revision": rev('b'), "reason": "CVE fix"}}),
        );
        let d = run(&s, None, &obs(&[]), 0);
        assert_eq!(revisions(&d), on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]));
        assert!(d.status.waves.iter().all(|w| w.state == WaveState::Skipped));
        assert_eq!(d.status.phase, WaveGatePhase::Complete);
        assert!(events(&d).contains(&reasons::EMERGENCY));
        let last = d.status.history.last().unwrap();
        assert_eq!(last.outcome, Some(ChangeOutcome::Emergency));
        assert!(last.reason.as_deref().unwrap().contains("CVE fix"));
    }

    #[test]
    fn an_emergency_for_another_revision_is_ignored() {
        // Argo CD keeps an action-written emergency across a Git sync that moves spec.revision:
        // the stale emergency must not skip the waves of the new revision.
        let s = spec_with(
            serde_json::json!({"emergency": {"revision": rev('a'), "reason": "CVE fix"}}),
        );
        assert_eq!(s.revision, rev('b'));
        let d = run(&s, None, &obs(&[]), 0);
        assert_eq!(
            revisions(&d),
            on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
            "only the first wave moves; the spec is not refused"
        );
        assert_ne!(d.status.phase, WaveGatePhase::Complete);
        assert!(!events(&d).contains(&reasons::EMERGENCY));
        assert!(crate::validity::problems(&s, false).is_empty());
    }

    #[test]
    fn cross_site_waits_table() {
        let s = spec_with(serde_json::json!({"waves": [
            {"name": "canary", "clusters": ["c1"], "soak": "10s"},
            {"name": "rest", "clusters": ["c2", "c3"], "soak": "10s", "waitFor": [{"site": "us", "wave": "canary"}]}
        ]}));
        let mut st = run(&s, None, &obs(&[]), 0).status;
        let mut o = obs(&["c1"]);
        st = run(&s, Some(&st), &o, 1).status;
        o.gates = all_gates(Verdict::Pass, 11);
        let d = run(&s, Some(&st), &o, 11);
        assert_eq!(d.status.waves[0].state, WaveState::Passed);
        assert_eq!(d.status.waves[1].state, WaveState::Waiting);
        assert_eq!(d.status.phase, WaveGatePhase::WaitingForSite);
        assert!(
            d.status.waves[1]
                .waiting_for
                .as_deref()
                .unwrap()
                .contains("site us past wave canary")
        );
        let waiting = d.status;
        // (name, spec, passed elsewhere, want state, want event)
        let released = {
            let mut r = s.clone();
            r.wait_releases = vec![sluice_api::v1alpha1::wave_gate::WaitRelease {
                site: "us".into(),
                revision: rev('b'),
                reason: "us partitioned; change approved".into(),
            }];
            r
        };
        let other_rev = {
            let mut r = released.clone();
            r.wait_releases[0].revision = rev('c');
            r
        };
        let cases = [
            ("still waiting", s.clone(), false, WaveState::Waiting, None),
            (
                "the other site passed",
                s.clone(),
                true,
                WaveState::Converging,
                None,
            ),
            (
                "released explicitly",
                released,
                false,
                WaveState::Converging,
                Some(reasons::WAIT_RELEASED),
            ),
            (
                "a release for another revision",
                other_rev,
                false,
                WaveState::Waiting,
                None,
            ),
        ];
        for (name, sp, passed, want, event) in cases {
            let mut o = obs(&["c1"]);
            if passed {
                o.passed_elsewhere.insert(("us".into(), "canary".into()));
            }
            let d = run(&sp, Some(&waiting), &o, 20);
            assert_eq!(d.status.waves[1].state, want, "{name}");
            if let Some(e) = event {
                assert!(events(&d).contains(&e), "{name}");
                assert!(
                    d.status
                        .history
                        .last()
                        .unwrap()
                        .reason
                        .as_deref()
                        .unwrap()
                        .contains("partitioned"),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn no_drift_exporter_converges_without_it_and_reports_the_gate_skipped() {
        let s = spec_with(serde_json::json!({"driftGate": {"exporter": "None"}}));
        let mut o = obs(&[]);
        o.drift.clear();
        let st = run(&s, None, &o, 0).status;
        let mut o = obs(&["c1"]);
        o.drift.clear();
        let d = run(&s, Some(&st), &o, 5);
        assert_eq!(d.status.waves[0].state, WaveState::Soaking);
        let c = cond::find(&d.status.conditions, conditions::DRIFT_SIGNAL).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::DRIFT_EXPORTER_ABSENT)
        );
        o.gates = Some(vec![
            verdict("mesh-error-ratio", Verdict::Pass, 6),
            verdict("xds-nack-increase", Verdict::Pass, 6),
        ]);
        let d = run(&s, Some(&d.status), &o, 6);
        let skipped = d.status.waves[0]
            .gates
            .iter()
            .find(|g| g.gate == "proxies-behind")
            .unwrap();
        assert_eq!(skipped.reason, VerdictReason::Skipped);
        assert_eq!(
            skipped.verdict,
            Verdict::Inconclusive,
            "a missing signal is never a pass"
        );
    }

    #[test]
    fn a_wave_added_to_the_spec_keeps_the_list_complete() {
        let s = spec();
        let st = run(&s, None, &obs(&[]), 0).status;
        let grown = spec_with(serde_json::json!({"waves": [
            {"name": "canary", "clusters": ["c1"], "soak": "10s"},
            {"name": "rest", "clusters": ["c2", "c3", "c4"], "soak": "10s"}
        ]}));
        let d = run(&grown, Some(&st), &obs(&[]), 1);
        assert_eq!(
            revisions(&d),
            on(&[("c1", "b"), ("c2", "a"), ("c3", "a"), ("c4", "a")]),
            "a new cluster runs the previous revision until its wave"
        );
    }

    #[test]
    fn invalid_spec_publishes_nothing_new() {
        let s = spec_with(serde_json::json!({"convergenceTimeout": "0s"}));
        let d = run(&s, None, &obs(&[]), 0);
        assert_eq!(d.status.phase, WaveGatePhase::Refused);
        assert!(d.status.decisions.is_empty());
        assert_eq!(events(&d), vec![reasons::INVALID_SPEC]);
        assert_eq!(d.requeue, Requeue::AwaitChange);
    }

    #[test]
    fn a_halts_pins_give_automation_back_when_the_decisions_go_back() {
        let s = spec();
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let halted = run(&s, Some(&soaking()), &o, 15);
        // The pin's deadline is the halt's pin wait: a pin still pinning when the decisions go
        // back has revert restore its Applications' sync policy at that moment.
        assert_eq!(pins_of(&halted)[0].deadline_seconds, 30);
        let name = pins_of(&halted)[0].name.clone();
        let mut o = obs(&["c1"]);
        o.existing_pins.insert(name.clone());
        o.pin_phases.insert(name, BundlePinPhase::Pinning);
        let late = run(&s, Some(&halted.status), &o, 15 + 31);
        assert_eq!(
            revisions(&late),
            on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
        );
        let note = &cond::find(&late.status.conditions, types::HALTED)
            .unwrap()
            .message;
        assert!(note.contains("revert gives automation back"), "{note}");
    }

    #[test]
    fn a_new_revision_during_a_pending_halt_keeps_the_halts_timer() {
        let s = spec();
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let halted = run(&s, Some(&soaking()), &o, 15);
        let name = pins_of(&halted)[0].name.clone();
        let mut o = obs(&["c1"]);
        o.existing_pins.insert(name.clone());
        o.pin_phases.insert(name, BundlePinPhase::Pinning);
        // A forward fix is pushed while revert is still pinning (no supersedeHalted).
        let s2 = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
        let d = run(&s2, Some(&halted.status), &o, 16);
        assert!(
            matches!(d.requeue, Requeue::After(_)),
            "the pin wait must still fire: {:?}",
            d.requeue
        );
        let later = run(&s2, Some(&d.status), &o, 15 + 31);
        assert_eq!(
            revisions(&later),
            on(&[("c1", "a"), ("c2", "a"), ("c3", "a")]),
            "the fallback sets the decisions back"
        );
    }

    #[test]
    fn the_same_revision_halting_again_gets_new_pins() {
        let s = spec();
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
        let first = run(&s, Some(&soaking()), &o, 15);
        // The same change, halting again later (rolled out again after a supersede).
        let d0 = run(&s, None, &obs(&[]), 3600);
        let again = run(&s, Some(&d0.status), &obs(&["c1"]), 3610).status;
        let mut o = obs(&["c1"]);
        o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 3615)]);
        let second = run(&s, Some(&again), &o, 3615);
        assert_ne!(
            pins_of(&first)[0].name,
            pins_of(&second)[0].name,
            "an old (maybe Released) pin is never taken for this halt's"
        );
    }
}

#[cfg(test)]
mod supersede_after_block {
    use super::*;

    #[test]
    fn blocked_then_superseded() {
        let rev = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let s: WaveGateSpec = serde_json::from_value(serde_json::json!({
            "site": "eu", "applicationSetRef": {"name": "mesh"}, "repository": "oci://r.local/m",
            "revision": rev('c'), "sourceCommit": "abc1234",
            "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2"]}],
            "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "k"}},
        }))
        .unwrap();
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "phase": "Halted", "currentRevision": rev('b'), "previousRevision": rev('a'),
            "decisions": [{"clusterName": "c1", "revision": rev('a'), "wave": "canary"}, {"clusterName": "c2", "revision": rev('a'), "wave": "rest"}],
            "waves": [{"name": "canary", "state": "Failed"}, {"name": "rest", "state": "Pending"}],
            "halt": {"reason": "GateFailed", "wave": "canary", "haltedAt": "2027-01-01T00:00:00Z", "pinnedAt": "2027-01-01T00:00:01Z", "revertedClusters": ["c1"], "pins": ["p"]},
        })).unwrap();
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let o = Observations {
            applications: vec![],
            ..Observations::default()
        };
        let blocked = decide(&s, Some(&status), &o, t);
        assert_eq!(blocked.status.phase, WaveGatePhase::Halted);
        let mut s2 = s.clone();
        s2.supersede_halted = true;
        let d = decide(&s2, Some(&blocked.status), &o, t);
        assert_eq!(d.status.current_revision, Some(rev('c')), "{:#?}", d.status);
    }
}

#[cfg(test)]
mod soak_precision {
    use super::*;

    #[test]
    fn the_soak_starts_at_the_next_whole_second() {
        let at = |ms: i64| Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap();
        for (ms, want) in [(0, 0), (1, 1000), (280, 1000), (999, 1000), (1000, 1000)] {
            assert_eq!(ceil_second(at(ms)), at(want), "{ms} ms");
        }
        // Round trip through the wire format keeps the value exactly.
        let t = Time(ceil_second(at(280)));
        let back: Time = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}

#[cfg(test)]
mod held_after_soak {
    use super::*;

    #[test]
    fn a_wave_held_past_its_soak_says_why() {
        let rev = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let s: WaveGateSpec = serde_json::from_value(serde_json::json!({
            "site": "eu", "applicationSetRef": {"name": "mesh"}, "repository": "oci://r.local/m",
            "revision": rev('b'), "previousRevision": rev('a'),
            "waves": [{"name": "canary", "clusters": ["c1"], "soak": "10s"}],
            "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "k"}},
        }))
        .unwrap();
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "currentRevision": rev('b'), "previousRevision": rev('a'),
            "decisions": [{"clusterName": "c1", "revision": rev('b'), "wave": "canary"}],
            "waves": [{"name": "canary", "state": "Soaking", "admittedAt": "2027-01-15T08:00:00Z", "convergedAt": "2027-01-15T08:00:00Z"}],
        }))
        .unwrap();
        let now: Timestamp = "2027-01-15T08:00:20Z".parse().unwrap();
        let verdict = GateVerdict {
            gate: "mesh-error-ratio".into(),
            verdict: Verdict::Inconclusive,
            reason: VerdictReason::NoData,
            message: None,
            value: None,
            baseline: None,
            threshold: None,
            samples: None,
            min_samples: None,
            consecutive_failures: 0,
            inconclusive_since: Some(Time(now)),
            evaluated_at: Time(now),
        };
        let o = Observations {
            applications: vec![AppView {
                name: "mesh-c1".into(),
                namespace: "argocd".into(),
                cluster: "c1".into(),
                sync_status: Some("Synced".into()),
                synced_revision: Some(rev('b')),
                healthy: true,
            }],
            gates: Some(vec![EvaluatedGate {
                verdict,
                action: GateAction::Pause,
            }]),
            ..Observations::default()
        };
        let d = decide(&s, Some(&status), &o, now);
        assert_eq!(d.status.waves[0].state, WaveState::Soaking);
        let c = cond::find(&d.status.conditions, types::PROGRESSING).unwrap();
        assert!(
            c.message
                .contains("mesh-error-ratio Inconclusive (NoData, paused by policy)"),
            "{}",
            c.message
        );
    }
}
