//! The shared model of the WaveGate decision, below its phases: what the reconcile observed
//! (`Observations`), what it must do (`Action`), the `Decision` it returns, the ApplicationSet
//! checks beyond its spec, the timing helpers every phase reads, and the context (`Machine`) every
//! phase writes the next status, its conditions, history and Events into. Must never do I/O or
//! read the clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sluice_analysis::GateAction;
use sluice_api::external::argocd::{SYNC_STATUS_SYNCED, UnsafeApplicationSet};
use sluice_api::v1alpha1::wave_gate::{ChangeOutcome, ChangeRecord, WaveState};
use sluice_api::v1alpha1::{BundlePinPhase, GateVerdict, WaveGateSpec, WaveGateStatus};
use sluice_runtime::{
    conditions::{self as cond},
    events::Notice,
};

use crate::pins::PinPlan;

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
    Event(Notice),
    /// Annotate the ApplicationSet so Argo CD regenerates its Applications now.
    NudgeApplicationSet,
    /// Create a BundlePin (already existing is fine: names are deterministic).
    CreatePin(PinPlan),
    /// Delete a BundlePin this WaveGate created that revert released (already gone is fine).
    DeletePin(String),
}

sluice_runtime::decision_types! {
    /// The outcome of [`decide`]: effects are carried out after the status write succeeded.
    WaveGateStatus, Action
}

/// What an Event of this operator is about: its `action`, as the Events API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum EventAction {
    /// ApplicationSet checks.
    CheckApplicationSet,
    /// Adoption.
    Adopt,
    /// Wave admission.
    Admit,
    /// Soak start and end.
    Soak,
    /// Halts.
    Halt,
    /// Pins and decisions set back.
    Pin,
    /// New revisions.
    Change,
}

pub(super) fn ts(t: &Time) -> Timestamp {
    t.0
}

pub(super) fn add(t: Timestamp, d: Duration) -> Timestamp {
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

pub(super) fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
}

pub(super) fn parse_or(d: &sluice_api::v1alpha1::DurationString, default: Duration) -> Duration {
    d.parse().unwrap_or(default)
}

/// The analysis interval of `spec` (validated; 30 s if unreadable).
pub fn interval(spec: &WaveGateSpec) -> Duration {
    parse_or(&spec.analysis_interval, Duration::from_secs(30))
}

pub(super) fn soak(spec: &WaveGateSpec, i: usize) -> Duration {
    spec.soak_of(i).map_or(Duration::from_secs(600), |s| {
        parse_or(&s, Duration::from_secs(600))
    })
}

pub(super) fn convergence_timeout(spec: &WaveGateSpec) -> Duration {
    parse_or(&spec.convergence_timeout, Duration::from_secs(1800))
}

/// Whether a wave state means the wave's clusters run the change's revision.
pub(super) fn admitted(state: WaveState) -> bool {
    matches!(
        state,
        WaveState::Converging
            | WaveState::Soaking
            | WaveState::Passed
            | WaveState::Failed
            | WaveState::Skipped
    )
}

pub(super) fn done(state: WaveState) -> bool {
    matches!(state, WaveState::Passed | WaveState::Skipped)
}

/// The wave the change works on: the first that is not done.
pub fn active_wave(status: &WaveGateStatus) -> Option<usize> {
    status.waves.iter().position(|w| !done(w.state))
}

/// What every phase reads (the spec, the observations, the time) and the decision it writes
/// into: the one shape of the operators' pure machines.
pub(super) struct Machine<'a> {
    pub(super) spec: &'a WaveGateSpec,
    pub(super) obs: &'a Observations,
    pub(super) now: Timestamp,
    pub(super) decision: Decision,
}

impl Machine<'_> {
    /// The generation and time this decision stamps its conditions with.
    pub(super) fn stamp(&self) -> cond::Stamp {
        cond::Stamp::new(self.obs.generation, self.now)
    }

    pub(super) fn history_finish(&mut self, outcome: ChangeOutcome) {
        if let Some(last) = self.decision.status.history.last_mut()
            && last.outcome.is_none()
        {
            last.outcome = Some(outcome);
            last.finished_at = Some(Time(self.now));
        }
    }

    pub(super) fn history_start(&mut self, reason: Option<String>) {
        sluice_runtime::decision::record_bounded(
            &mut self.decision.status.history,
            ChangeRecord {
                revision: self.spec.revision.clone(),
                previous_revision: self.decision.status.previous_revision.clone(),
                started_at: Time(self.now),
                finished_at: None,
                outcome: None,
                reason,
            },
            MAX_HISTORY,
        );
    }

    pub(super) fn history_note(&mut self, note: &str) {
        if let Some(last) = self.decision.status.history.last_mut() {
            let text = match &last.reason {
                Some(r) => format!("{r}; {note}"),
                None => note.to_owned(),
            };
            last.reason = Some(text.chars().take(1024).collect());
        }
    }
}
