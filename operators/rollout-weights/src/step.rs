//! The Rollout state machine: given a valid spec, the status decided so far, what the route and
//! the mesh look like, and `now`, decides the next status and the route writes.
//!
//! Owns ownership, waiting for the canary, step progression, the applied-share check that must
//! pass before a weight step's analysis clock starts, acting on gate verdicts, the controls
//! (abort, paused, promoteThroughStep, promoteFull, retry), abort and its verification, pin
//! detection and hand-back. Everything it needs to resume lives in the status it returns, so a
//! restarted operator reaches the same decision. Must never do I/O or read the clock.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    GateVerdict, RolloutPhase, RolloutSpec, RolloutStatus, Verdict,
    bundle_pin::FIELD_MANAGER as REVERT_FIELD_MANAGER,
    rollout::{
        AbortReason, AbortStatus, OwnedRouteStatus, RouteKindName, StepKind, StepOutcome,
        StepRecord, conditions, reasons,
    },
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Severity,
};

use crate::route_edit::{Desired, Mirror};

/// When to look at the object again.
pub use sluice_runtime::decision::Requeue;

/// What the reconcile saw, for the state machine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    /// `metadata.generation` of the object.
    pub generation: Option<i64>,
    /// What the route looks like.
    pub route: RouteObs,
    /// Whether the canary workload is ready (`None`: not read).
    pub canary_ready: Option<bool>,
    /// The canary version: the hash of the canary workload's pod template (`None`: not read),
    /// see [`crate::observe::workload_version`].
    pub canary_version: Option<String>,
    /// Whether the canary Service exists (`None`: not read). Without it the canary's share of
    /// requests gets 500s, so no live weight goes to it.
    pub canary_service: Option<bool>,
    /// Verdicts evaluated this tick with the action each calls for (empty: no analysis ran).
    pub gates: Vec<(GateVerdict, GateAction)>,
    /// Canary share of the route's requests the mesh reports, percent (`None`: no data).
    pub applied_share: Option<f64>,
    /// The Rollout is being deleted (hand back the route).
    pub deleting: bool,
    /// Configuration problems of the gates found by this tick's analysis, each naming the gate
    /// and field (`None`: no analysis ran, so nothing was learned either way).
    pub config_problems: Option<Vec<String>>,
    /// Why the metrics source could not answer this tick (`None`: it answered or was not asked).
    pub analysis_error: Option<String>,
    /// The pre-change baselines this tick's analysis judged against, to keep in
    /// `status.capturedBaselines` (`None`: no analysis ran; the status keeps its own).
    pub baselines: Option<Vec<sluice_api::v1alpha1::CapturedBaseline>>,
}

/// An effect the reconcile carries out.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the Rollout.
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
    /// Bring the route's owned parts to this state (a no-op write is skipped), taking ownership.
    WriteRoute(Desired),
    /// Remove the ownership annotation from the route.
    HandBack,
    /// The route, stable or canary Service changed under a running rollout: abort on the
    /// route the weights were written to (with the Services they were written for), then hand
    /// that route back. The reconcile forgets `status.ownedRoute` once both succeeded.
    Release {
        /// The kind of the route the weights were written to.
        kind: RouteKindName,
        /// The route the weights were written to.
        route: String,
        /// Its managed rule's name, if named.
        rule_name: Option<String>,
        /// The stable Service written for (`None`: the spec's, from before this was recorded).
        stable: Option<String>,
        /// The canary Service written for (`None`: the spec's).
        canary: Option<String>,
    },
}

impl Action {
    /// The reason of an Event; `None` for any other action.
    pub fn event_reason(&self) -> Option<&'static str> {
        match self {
            Action::Event { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// The outcome of [`step`].
pub type Decision = sluice_runtime::decision::Decision<RolloutStatus, Action>;

/// A canary share at or below this (percent) counts as ~0 when verifying an abort.
pub const REVERTED_SHARE_PERCENT: f64 = 0.5;
/// History entries kept in status.
pub const MAX_HISTORY: usize = 64;

/// The route as the reconcile found it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum RouteObs {
    /// Not read (the decision then only validates).
    #[default]
    Unknown,
    /// No route of that name (of the Rollout's kind).
    Missing,
    /// The route exists but cannot be governed (no managed rule, ambiguous, a step whose edit
    /// does not fit, ...).
    Unusable {
        /// Condition reason (bounded).
        reason: &'static str,
        /// What is wrong and what to do.
        message: String,
        /// This operator's parts of the route when they could be read (only a step's edit does
        /// not fit): the steps are refused, but abort and hand-back, which only remove what
        /// this operator added, still apply.
        state: Option<RouteState>,
    },
    /// The route and this operator's parts of it.
    Present(RouteState),
}

/// This operator's parts of the route.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteState {
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// The ownership annotation's value.
    pub owner: Option<String>,
    /// `<namespace>/<name>` of this Rollout.
    pub me: String,
    /// The canary backend's weight on the managed rule (0 when absent).
    pub canary_weight: u32,
    /// Whether the cohort rule is present.
    pub cohort: bool,
    /// Whether the mirror rule is present.
    pub mirror: bool,
    /// Field manager of the newest managedFields entry (who wrote last).
    pub last_writer: Option<String>,
}

/// Event action names.
pub mod event_actions {
    /// Route ownership taken or handed back.
    pub const OWN: &str = "Own";
    /// A step started or finished.
    pub const STEP: &str = "Step";
    /// The applied share was judged.
    pub const SHARE: &str = "Share";
    /// The rollout aborted or its abort was verified.
    pub const ABORT: &str = "Abort";
    /// Promotion.
    pub const PROMOTE: &str = "Promote";
    /// A foreign edit was restored.
    pub const RESTORE: &str = "Restore";
}

/// The route parts a step wants: weight of the last setWeight at or before `index` (100 for
/// promote), and the mirror and cohort rules of earlier steps until the first weight step
/// (kept afterwards when `keepMirror` / `keepCohort`).
pub fn desired_at(spec: &RolloutSpec, index: usize) -> Desired {
    let mut d = Desired::abort();
    let mut weighted = false;
    for step in spec.steps.iter().take(index + 1) {
        if let Some(m) = &step.mirror {
            d.mirror = Some(Mirror {
                percent: m.percent,
                methods: m
                    .methods
                    .iter()
                    .copied()
                    .filter(|x| x.is_idempotent_read())
                    .collect(),
                grpc_methods: m.grpc_methods.clone(),
            });
        }
        if let Some(c) = &step.header_cohort {
            d.cohort = Some(c.header.clone());
        }
        if let Some(w) = &step.set_weight {
            d.weight = w.weight;
            weighted = true;
        }
        if step.promote.is_some() {
            d.weight = 100;
            weighted = true;
        }
    }
    if weighted {
        if !spec.keep_mirror || d.weight == 100 {
            d.mirror = None;
        }
        if !spec.keep_cohort || d.weight == 100 {
            d.cohort = None;
        }
    }
    d
}

/// The canary share (percent) step `index` should show: its weight, or, while a kept cohort
/// rule is on the route and its share was measured during the cohort step, the cohort's share
/// plus the weight of the rest: `c + (100 − c) × w / 100`.
pub fn expected_share(spec: &RolloutSpec, status: &RolloutStatus, index: usize) -> f64 {
    let d = desired_at(spec, index);
    let w = f64::from(d.weight);
    match (d.cohort.is_some(), status.cohort_share) {
        (true, Some(c)) => c + (100.0 - c) * w / 100.0,
        _ => w,
    }
}

fn dur(s: &sluice_api::v1alpha1::DurationString, fallback: Duration) -> Duration {
    s.parse().unwrap_or(fallback)
}

fn since(t: Option<&Time>, now: Timestamp) -> Duration {
    t.map_or(Duration::ZERO, |t| now.duration_since(t.0).unsigned_abs())
}

struct Machine<'a> {
    spec: &'a RolloutSpec,
    obs: &'a Observations,
    now: Timestamp,
    next: RolloutStatus,
    actions: Vec<Action>,
    requeue: Option<Duration>,
}

impl Machine<'_> {
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

    fn wake(&mut self, after: Duration) {
        let after = after.max(Duration::from_millis(200));
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        let c = cond::new(
            type_,
            status,
            reason,
            message,
            self.obs.generation,
            self.now,
        );
        cond::set(&mut self.next.conditions, c);
    }

    fn interval(&self) -> Duration {
        dur(&self.spec.analysis_interval, Duration::from_secs(30))
    }

    fn write(&mut self, d: Desired) {
        self.next.desired_weight = Some(d.weight);
        self.next.cohort_active = d.cohort.is_some();
        self.next.mirror_active = d.mirror.is_some();
        let owned = self
            .next
            .owned_route
            .get_or_insert_with(OwnedRouteStatus::default);
        owned.name = self.spec.route_ref.name.clone();
        owned.kind = Some(self.spec.route_ref.kind);
        owned.rule_name = self.spec.route_ref.rule_name.clone();
        owned.stable_service = Some(self.spec.stable_service.name.clone());
        owned.canary_service = Some(self.spec.canary_service.name.clone());
        // A new weight is in force only once the API server accepts the write: the reconcile
        // records that instant (the applied share counts from it).
        if owned.written_weight != Some(d.weight) {
            owned.weight_written_at = None;
        }
        owned.written_weight = Some(d.weight);
        owned.cohort_rule_name = d
            .cohort
            .is_some()
            .then(|| crate::route_edit::COHORT_RULE.into());
        owned.mirror_rule_name = d
            .mirror
            .is_some()
            .then(|| crate::route_edit::MIRROR_RULE.into());
        if owned.owned_since.is_none() {
            owned.owned_since = Some(Time(self.now));
        }
        self.actions.push(Action::WriteRoute(d));
    }

    fn abort(&mut self, reason: AbortReason, message: String, gate: Option<GateVerdict>) {
        let idx = self.next.current_step_index;
        let first_failed_at = gate.as_ref().map(|g| {
            let back = self.interval() * g.consecutive_failures.saturating_sub(1);
            Time(
                g.evaluated_at
                    .0
                    .checked_sub(
                        k8s_openapi::jiff::SignedDuration::try_from(back).unwrap_or_default(),
                    )
                    .unwrap_or(g.evaluated_at.0),
            )
        });
        self.finish_step(StepOutcome::Aborted);
        self.next.phase = RolloutPhase::Aborted;
        self.next.abort = Some(AbortStatus {
            reason,
            message: Some(truncate(&message)),
            gate,
            step_index: idx,
            first_failed_at,
            decided_at: Time(self.now),
            route_reverted_at: None,
            revert_verified_at: None,
        });
        let why = match reason {
            AbortReason::GateFailed => reasons::GATE_FAILED,
            AbortReason::Manual => reasons::ABORTED_MANUALLY,
            AbortReason::PinnedByBundlePin => reasons::PINNED_BY_BUNDLE_PIN,
            AbortReason::InconclusiveTimeout => reasons::INCONCLUSIVE,
            AbortReason::AppliedShareNotConfirmed => reasons::SHARE_NOT_YET_APPLIED,
            AbortReason::CanaryNotReady => reasons::WAITING_FOR_CANARY,
            AbortReason::InvalidSpec => reasons::INVALID_SPEC,
        };
        self.condition(conditions::PROGRESSING, Status::False, why, message.clone());
        if reason != AbortReason::PinnedByBundlePin {
            self.write(Desired::abort());
        }
        self.event(
            Severity::Warning,
            why,
            event_actions::ABORT,
            format!("rollout aborted: {message}"),
        );
    }

    fn finish_step(&mut self, outcome: StepOutcome) {
        let idx = self.next.current_step_index;
        if let Some(rec) = self
            .next
            .history
            .iter_mut()
            .rev()
            .find(|r| Some(r.index) == idx && r.finished_at.is_none())
        {
            rec.finished_at = Some(Time(self.now));
            rec.outcome = Some(outcome);
        }
    }

    fn start_step(&mut self, index: usize) {
        self.next.gates.clear();
        self.next.applied_share = None;
        self.next.applied_share_observed_at = None;
        cond::remove(
            &mut self.next.conditions,
            conditions::APPLIED_SHARE_CONFIRMED,
        );
        let Some(step) = self.spec.steps.get(index) else {
            self.promote("all steps passed".into());
            return;
        };
        let kind = step.kind().unwrap_or(StepKind::Pause);
        if kind == StepKind::Promote {
            self.next.current_step_index = Some(index as u32);
            self.promote(format!("step {index} promotes"));
            return;
        }
        self.next.phase = RolloutPhase::Progressing;
        self.next.current_step_index = Some(index as u32);
        self.next.current_step_started_at = Some(Time(self.now));
        self.next.history.push(StepRecord {
            index: index as u32,
            kind,
            weight: step.set_weight.as_ref().map(|w| w.weight),
            started_at: Time(self.now),
            share_confirmed_at: None,
            finished_at: None,
            outcome: None,
        });
        let excess = self.next.history.len().saturating_sub(MAX_HISTORY);
        self.next.history.drain(..excess);
        let d = desired_at(self.spec, index);
        let note = format!(
            "step {index} ({kind:?}) started, canary weight {}",
            d.weight
        );
        self.condition(
            conditions::PROGRESSING,
            Status::True,
            reasons::STEP_IN_PROGRESS,
            note.clone(),
        );
        self.event(
            Severity::Normal,
            reasons::STEP_IN_PROGRESS,
            event_actions::STEP,
            note,
        );
        self.write(d);
    }

    fn promote(&mut self, why: String) {
        self.next.phase = RolloutPhase::Promoted;
        self.next.promoted_at = Some(Time(self.now));
        self.condition(
            conditions::PROGRESSING,
            Status::False,
            reasons::PROMOTED,
            why.clone(),
        );
        self.event(
            Severity::Normal,
            reasons::PROMOTED,
            event_actions::PROMOTE,
            format!("promoted to 100%: {why}"),
        );
        self.write(Desired {
            weight: 100,
            cohort: None,
            mirror: None,
        });
    }

    /// Judges the verdicts evaluated this tick while the canary receives traffic but the step
    /// does not advance on them (a pause step, `spec.paused`, a mirror or cohort step, a weight
    /// step whose share is not yet confirmed, an invalid spec held): records each verdict and
    /// the applied share, and aborts on a Fail. `held` says what holds the step, for the abort
    /// message. Returns true when it aborted. A Fail is the safe direction and needs no
    /// confirmed share; an Inconclusive verdict's policy applies only to a confirmed weight
    /// step, where it can hold or complete the step.
    fn judge_live(&mut self, index: usize, held: &str) -> bool {
        if let Some(s) = self.obs.applied_share {
            self.next.applied_share = Some(s);
            self.next.applied_share_observed_at = Some(Time(self.now));
        }
        for (v, _) in &self.obs.gates {
            self.next.gates.retain(|g| g.gate != v.gate);
            self.next.gates.push(v.clone());
        }
        self.next.gates.sort_by(|a, b| a.gate.cmp(&b.gate));
        let failed = self
            .obs
            .gates
            .iter()
            .find(|(v, act)| v.verdict == Verdict::Fail && *act == GateAction::Abort);
        let Some((v, _)) = failed else {
            return false;
        };
        let msg = format!(
            "gate {} failed at step {index} ({held}): value {:?} vs threshold {:?} ({})",
            v.gate,
            v.value,
            v.threshold,
            v.message.clone().unwrap_or_default()
        );
        self.abort(AbortReason::GateFailed, msg, Some(v.clone()));
        true
    }

    /// Runs the current step; returns true when it completed.
    fn run_step(&mut self, index: usize) -> bool {
        let spec = self.spec;
        let Some(step) = spec.steps.get(index) else {
            return true;
        };
        if spec
            .promote_through_step
            .is_some_and(|p| p as usize >= index)
        {
            return true;
        }
        let started = self.next.current_step_started_at.clone();
        let elapsed = since(started.as_ref(), self.now);
        let duration = spec
            .step_duration_of(index)
            .map(|d| dur(&d, Duration::from_secs(300)));
        match step.kind() {
            Some(StepKind::Mirror | StepKind::HeaderCohort) => {
                let held = if step.kind() == Some(StepKind::Mirror) {
                    "mirror step"
                } else {
                    "cohort step, cohort traffic against stable"
                };
                if self.judge_live(index, held) {
                    return false;
                }
                if step.kind() == Some(StepKind::HeaderCohort)
                    && let Some(share) = self.obs.applied_share
                {
                    // The cohort's share, for the expected share of later steps that keep it:
                    // the highest reading, since the windowed share climbs from 0 to it.
                    self.next.cohort_share =
                        Some(self.next.cohort_share.map_or(share, |c| c.max(share)));
                }
                let d = duration.unwrap_or_default();
                if elapsed >= d {
                    return true;
                }
                self.wake(d - elapsed);
                false
            }
            Some(StepKind::Pause) if self.judge_live(index, "pause step") => false,
            Some(StepKind::Pause) => match duration {
                Some(d) if elapsed >= d => true,
                Some(d) => {
                    self.next.phase = RolloutPhase::Paused;
                    self.condition(
                        conditions::PROGRESSING,
                        Status::True,
                        reasons::PAUSED,
                        format!("pause step {index} for {}s", d.as_secs()),
                    );
                    self.wake(d - elapsed);
                    false
                }
                None => {
                    self.next.phase = RolloutPhase::Paused;
                    self.condition(conditions::PROGRESSING, Status::True, reasons::PAUSED, format!("pause step {index} waits for spec.promoteThroughStep >= {index} or spec.promoteFull"));
                    false
                }
            },
            Some(StepKind::SetWeight) => self.run_weight(index, duration.unwrap_or_default()),
            Some(StepKind::Promote) | None => true,
        }
    }

    fn run_weight(&mut self, index: usize, duration: Duration) -> bool {
        let target = expected_share(self.spec, &self.next, index);
        let tol = f64::from(self.spec.applied_share_tolerance_percent) / 100.0;
        let interval = self.interval();
        // Verdicts, a share or an error: the analysis ran this tick. Between analyses the
        // reconcile only checks deadlines and leaves the judgement as it was.
        let analysed = !self.obs.gates.is_empty()
            || self.obs.applied_share.is_some()
            || self.obs.analysis_error.is_some();
        if analysed {
            self.next.phase = RolloutPhase::Progressing;
        }
        if let Some(s) = self.obs.applied_share {
            self.next.applied_share = Some(s);
            self.next.applied_share_observed_at = Some(Time(self.now));
        }
        let confirmed = self
            .next
            .history
            .last()
            .and_then(|r| r.share_confirmed_at.clone());
        let Some(confirmed) = confirmed else {
            // The gates judge the canary from the first second of the step: only the share
            // gate waits for the confirmation (the plan does not judge it before).
            if self.judge_live(index, "share not yet confirmed") {
                return false;
            }
            let within = self
                .obs
                .applied_share
                .is_some_and(|s| (s - target).abs() <= tol * target.max(f64::EPSILON));
            if within {
                if let Some(rec) = self.next.history.last_mut() {
                    rec.share_confirmed_at = Some(Time(self.now));
                }
                let note = format!(
                    "applied share {:.2}% within ±{:.0}% of {target}%; analysis starts",
                    self.obs.applied_share.unwrap_or_default(),
                    tol * 100.0
                );
                self.condition(
                    conditions::APPLIED_SHARE_CONFIRMED,
                    Status::True,
                    reasons::SHARE_WITHIN_TOLERANCE,
                    note.clone(),
                );
                self.event(
                    Severity::Normal,
                    reasons::SHARE_WITHIN_TOLERANCE,
                    event_actions::SHARE,
                    note,
                );
                self.wake(interval);
                return false;
            }
            let deadline = dur(&self.spec.applied_share_deadline, Duration::from_secs(600));
            let elapsed = since(self.next.current_step_started_at.as_ref(), self.now);
            let seen = match (self.obs.applied_share, &self.obs.analysis_error) {
                (Some(s), _) => format!("{s:.2}%"),
                (None, Some(e)) => format!("no data (metrics unavailable: {e})"),
                (None, None) => "no data".to_owned(),
            };
            let note = format!(
                "canary weight {target}% written; the mesh reports {seen} (needs ±{:.0}%); the step is not judged on the written weight",
                tol * 100.0
            );
            // Aborting needs the mesh to report a wrong share: with no reading in the last two
            // intervals (a metrics outage), the step is held instead, never aborted on missing
            // data (the canary's gates then have no data either: a Fail still aborts).
            let recent = self
                .next
                .applied_share_observed_at
                .as_ref()
                .is_some_and(|t| since(Some(t), self.now) <= interval * 2);
            if elapsed >= deadline && !recent {
                self.next.phase = RolloutPhase::Paused;
                self.condition(
                    conditions::PROGRESSING,
                    Status::True,
                    reasons::METRICS_UNAVAILABLE,
                    format!(
                        "{note}; deadline {}s passed without share data: held until the mesh reports the share, never aborted on missing data",
                        deadline.as_secs()
                    ),
                );
                self.wake(interval);
                return false;
            }
            if elapsed >= deadline {
                self.abort(
                    AbortReason::AppliedShareNotConfirmed,
                    format!("{note}; deadline {}s passed", deadline.as_secs()),
                    None,
                );
                return false;
            }
            if !analysed {
                self.wake(interval.min(deadline - elapsed));
                return false;
            }
            let was = cond::find(&self.next.conditions, conditions::APPLIED_SHARE_CONFIRMED)
                .map(|c| c.reason.clone());
            self.condition(
                conditions::APPLIED_SHARE_CONFIRMED,
                Status::False,
                reasons::SHARE_NOT_YET_APPLIED,
                note.clone(),
            );
            if was.as_deref() != Some(reasons::SHARE_NOT_YET_APPLIED) && elapsed >= interval * 2 {
                self.event(
                    Severity::Warning,
                    reasons::SHARE_NOT_YET_APPLIED,
                    event_actions::SHARE,
                    note,
                );
            }
            self.wake(interval);
            return false;
        };
        // The share is confirmed: judge the gates evaluated since.
        if let Some(e) = &self.obs.analysis_error {
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::STEP_IN_PROGRESS,
                format!("step {index} held: metrics unavailable ({e}); no promotion without data"),
            );
        } else if cond::find(&self.next.conditions, conditions::PROGRESSING).is_some_and(|c| {
            c.message
                .starts_with(&format!("step {index} held: metrics"))
        }) {
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::STEP_IN_PROGRESS,
                format!("step {index} analysing: metrics available again"),
            );
        }
        for (v, act) in &self.obs.gates {
            if v.evaluated_at.0 < confirmed.0 {
                continue;
            }
            self.next.gates.retain(|g| g.gate != v.gate);
            self.next.gates.push(v.clone());
            match act {
                GateAction::Abort => {
                    let (reason, why) = if v.verdict == Verdict::Fail {
                        (AbortReason::GateFailed, "failed")
                    } else {
                        (
                            AbortReason::InconclusiveTimeout,
                            "stayed inconclusive (policy Abort)",
                        )
                    };
                    let msg = format!(
                        "gate {} {why} at step {index}: value {:?} vs threshold {:?} ({})",
                        v.gate,
                        v.value,
                        v.threshold,
                        v.message.clone().unwrap_or_default()
                    );
                    self.abort(reason, msg, Some(v.clone()));
                    return false;
                }
                GateAction::Pause => {
                    self.next.phase = RolloutPhase::Paused;
                    self.condition(conditions::PROGRESSING, Status::True, reasons::INCONCLUSIVE, format!("gate {} inconclusive for too long ({}: {}); held (policy Pause) until it passes or a person acts", v.gate, v.reason.as_str(), v.message.clone().unwrap_or_default()));
                }
                GateAction::Proceed | GateAction::Wait => {}
            }
        }
        self.next.gates.sort_by(|a, b| a.gate.cmp(&b.gate));
        let names: Vec<String> = self
            .spec
            .effective_gates()
            .into_iter()
            .map(|g| g.name)
            .collect();
        // A gate passes the step on Pass, or on a sustained Inconclusive whose policy is
        // Continue ("treat the gate as passed"), judged on this tick's verdicts.
        let continued = |n: &String| {
            self.obs.gates.iter().any(|(v, act)| {
                &v.gate == n && v.verdict == Verdict::Inconclusive && *act == GateAction::Proceed
            })
        };
        let all_pass = names.iter().all(|n| {
            self.next
                .gates
                .iter()
                .any(|g| &g.gate == n && g.verdict == Verdict::Pass)
                || continued(n)
        });
        let analysed = since(Some(&confirmed), self.now);
        if all_pass && analysed >= duration {
            return true;
        }
        self.wake(
            interval.min(
                duration
                    .saturating_sub(analysed)
                    .max(Duration::from_millis(200)),
            ),
        );
        false
    }

    /// Whether the route or a Service changed under a running rollout; if so, releases the
    /// route the weights were written to and starts over from Pending.
    fn target_changed(&mut self) -> bool {
        let spec = self.spec;
        let Some(owned) = self.next.owned_route.clone() else {
            return false;
        };
        let differs = |was: &Option<String>, now: &str| was.as_deref().is_some_and(|w| w != now);
        // An empty name is a status that never recorded one: nothing to compare.
        let moved = (!owned.name.is_empty()
            && (owned.name != spec.route_ref.name || owned.rule_name != spec.route_ref.rule_name))
            || owned.kind.is_some_and(|k| k != spec.route_ref.kind)
            || differs(&owned.stable_service, &spec.stable_service.name)
            || differs(&owned.canary_service, &spec.canary_service.name);
        let pinned = self
            .next
            .abort
            .as_ref()
            .is_some_and(|a| a.reason == AbortReason::PinnedByBundlePin);
        if !moved || pinned {
            return false;
        }
        let kind = spec.route_ref.kind.as_str();
        let old_kind = owned.kind.unwrap_or(spec.route_ref.kind);
        let was = old_kind.as_str();
        let note = format!(
            "the rollout's target changed ({was} {} with {} / {} -> {kind} {} with {} / {}): the canary is aborted on {was} {} and it is handed back; the rollout starts over",
            owned.name,
            owned.stable_service.as_deref().unwrap_or("?"),
            owned.canary_service.as_deref().unwrap_or("?"),
            spec.route_ref.name,
            spec.stable_service.name,
            spec.canary_service.name,
            owned.name
        );
        self.actions.push(Action::Release {
            kind: old_kind,
            route: owned.name.clone(),
            rule_name: owned.rule_name.clone(),
            stable: owned.stable_service.clone(),
            canary: owned.canary_service.clone(),
        });
        self.event(
            Severity::Warning,
            reasons::TARGET_CHANGED,
            event_actions::OWN,
            note.clone(),
        );
        if self.obs.deleting {
            return true;
        }
        self.finish_step(StepOutcome::Restarted);
        self.next.phase = RolloutPhase::Pending;
        self.next.current_step_index = None;
        self.next.current_step_started_at = None;
        self.next.desired_weight = Some(0);
        self.next.cohort_active = false;
        self.next.mirror_active = false;
        self.next.gates.clear();
        self.next.applied_share = None;
        self.next.applied_share_observed_at = None;
        self.next.cohort_share = None;
        self.next.promoted_at = None;
        self.next.canary_version = None;
        self.next.abort = None;
        self.next.abort_detect_to_revert_ms = None;
        self.condition(
            conditions::PROGRESSING,
            Status::True,
            reasons::TARGET_CHANGED,
            note,
        );
        self.wake(Duration::from_millis(200));
        true
    }

    fn run(&mut self) {
        let spec = self.spec;
        if self.target_changed() {
            return;
        }
        let route = match &self.obs.route {
            RouteObs::Unknown => return,
            RouteObs::Missing => {
                let msg = format!(
                    "{} {} not found in the Rollout's namespace",
                    spec.route_ref.kind.as_str(),
                    spec.route_ref.name
                );
                self.route_problem(reasons::ROUTE_NOT_FOUND, msg);
                return;
            }
            RouteObs::Unusable {
                reason,
                message,
                state,
            } => {
                let (r, m) = (*reason, message.clone());
                self.route_problem(r, m);
                match state {
                    Some(st) => st.clone(),
                    None => {
                        if self.obs.deleting {
                            // The reconcile hands back only a route this Rollout owns.
                            self.hand_back();
                        }
                        return;
                    }
                }
            }
            RouteObs::Present(r) => r.clone(),
        };
        // Only the steps are refused on a route they do not fit: a live canary is still judged,
        // aborted and handed back.
        let blocked = matches!(self.obs.route, RouteObs::Unusable { .. });
        if let Some(other) = route.owner.as_ref().filter(|o| **o != route.me) {
            let msg = format!(
                "{} {} is owned by Rollout {other}; one Rollout per route",
                spec.route_ref.kind.as_str(),
                spec.route_ref.name
            );
            self.route_problem(reasons::ROUTE_OWNED_BY_OTHER, msg);
            return;
        }
        let pinned = self
            .next
            .abort
            .as_ref()
            .is_some_and(|a| a.reason == AbortReason::PinnedByBundlePin);
        if self.obs.deleting {
            if route.owner.is_some() {
                // Deleting a Rollout before promotion cancels it: the canary is aborted in the
                // same way as any abort, then the route is handed back. A promoted canary is
                // the new stable and stays until Git says otherwise; a pinned route is the
                // pin's.
                let live = route.canary_weight > 0 || route.cohort || route.mirror;
                let pin = pinned || route.last_writer.as_deref() == Some(REVERT_FIELD_MANAGER);
                if live && self.next.phase != RolloutPhase::Promoted && !pin {
                    self.actions.push(Action::WriteRoute(Desired::abort()));
                    self.event(
                        Severity::Warning,
                        reasons::ABORTED_ON_DELETE,
                        event_actions::ABORT,
                        format!(
                            "deleted before promotion: canary weight 0 and cohort and mirror rules removed on {} {} before hand-back",
                            spec.route_ref.kind.as_str(),
                            spec.route_ref.name
                        ),
                    );
                }
                self.hand_back();
            }
            return;
        }
        let last_written = self
            .next
            .owned_route
            .as_ref()
            .and_then(|o| o.last_written_resource_version.clone());
        let changed_by_other = last_written.is_some() && route.resource_version != last_written;
        if changed_by_other && !pinned {
            let drifted = Some(route.canary_weight)
                != self
                    .next
                    .owned_route
                    .as_ref()
                    .and_then(|o| o.written_weight)
                || route.cohort != self.next.cohort_active
                || route.mirror != self.next.mirror_active;
            // A BundlePin is recognised by who rewrote spec.rules since our last write, whether
            // or not the owned weights changed: a pin restoring the very weights this Rollout
            // wrote still outranks it.
            if route.last_writer.as_deref() == Some(REVERT_FIELD_MANAGER) {
                let msg = format!(
                    "a BundlePin rewrote {} {}; the pin wins and this rollout stops",
                    spec.route_ref.kind.as_str(),
                    spec.route_ref.name
                );
                if self.next.phase == RolloutPhase::Aborted {
                    if let Some(a) = self.next.abort.as_mut() {
                        a.reason = AbortReason::PinnedByBundlePin;
                    }
                } else {
                    self.abort(AbortReason::PinnedByBundlePin, msg.clone(), None);
                }
                self.condition(
                    conditions::ROUTE_OWNED,
                    Status::False,
                    reasons::PINNED_BY_BUNDLE_PIN,
                    msg,
                );
                return;
            }
            if drifted {
                self.event(Severity::Warning, reasons::FOREIGN_EDIT_RESTORED, event_actions::RESTORE, format!(
                    "{} {} was edited by {}: canary weight {} (wrote {:?}), cohort {}, mirror {}; restoring",
                    spec.route_ref.kind.as_str(),
                    spec.route_ref.name,
                    route.last_writer.clone().unwrap_or_else(|| "an unknown writer".into()),
                    route.canary_weight,
                    self.next.owned_route.as_ref().and_then(|o| o.written_weight),
                    route.cohort,
                    route.mirror
                ));
                self.condition(
                    conditions::ROUTE_OWNED,
                    Status::True,
                    reasons::FOREIGN_EDIT_RESTORED,
                    "a foreign edit of owned weights was restored",
                );
            }
        }
        if pinned {
            // The pin wins while revert holds the route. Once it released it (its field
            // ownership is gone), an explicit retry starts the rollout again from here.
            let released = route.last_writer.as_deref() != Some(REVERT_FIELD_MANAGER);
            if !(released && !spec.abort && spec.retry > self.next.retries_handled) {
                return;
            }
            if let Some(o) = self.next.owned_route.as_mut() {
                // The route as the pin left it is the starting point, not a foreign edit.
                o.last_written_resource_version = route.resource_version.clone();
            }
        }
        // A restore stays reported (RouteOwned=True, ForeignEditRestored) until ownership
        // changes; otherwise the route is simply owned.
        let restored = cond::find(&self.next.conditions, conditions::ROUTE_OWNED)
            .is_some_and(|c| c.status == "True" && c.reason == reasons::FOREIGN_EDIT_RESTORED);
        if route.owner.is_some() && !restored && !blocked {
            self.condition(
                conditions::ROUTE_OWNED,
                Status::True,
                "Owned",
                format!(
                    "{} {} is owned by this Rollout",
                    spec.route_ref.kind.as_str(),
                    spec.route_ref.name
                ),
            );
        }

        // Controls.
        if spec.abort && self.next.phase != RolloutPhase::Aborted {
            self.abort(AbortReason::Manual, "spec.abort is true".into(), None);
        }
        if self.next.phase == RolloutPhase::Aborted
            && !spec.abort
            && spec.retry > self.next.retries_handled
        {
            self.next.retries_handled = spec.retry;
            self.next.abort = None;
            self.next.abort_detect_to_revert_ms = None;
            self.next.phase = RolloutPhase::WaitingForCanary;
            self.next.current_step_index = None;
            // The canary-ready deadline of the retry counts from the retry.
            self.next.current_step_started_at = Some(Time(self.now));
            self.next.canary_version = None;
            // Nothing measured in the aborted attempt carries over into the new one.
            self.next.gates.clear();
            self.next.applied_share = None;
            self.next.applied_share_observed_at = None;
            self.next.cohort_share = None;
            self.next.promoted_at = None;
            self.next.captured_baselines.clear();
            self.event(
                Severity::Normal,
                reasons::STEP_IN_PROGRESS,
                event_actions::STEP,
                format!("retry {} from the first step", spec.retry),
            );
        }
        self.plan_changes();
        if blocked && self.next.phase != RolloutPhase::Aborted {
            let live = matches!(
                self.next.phase,
                RolloutPhase::Progressing | RolloutPhase::Paused
            );
            let index = self.next.current_step_index.unwrap_or(0) as usize;
            if !live || !self.judge_live(index, "the route does not fit the steps") {
                return;
            }
        }
        match self.next.phase {
            RolloutPhase::Aborted => self.aborted(&route),
            RolloutPhase::Invalid => {}
            RolloutPhase::Pending => {
                self.next.phase = RolloutPhase::WaitingForCanary;
                self.event(
                    Severity::Normal,
                    "Owned",
                    event_actions::OWN,
                    format!(
                        "took ownership of {} {}",
                        spec.route_ref.kind.as_str(),
                        spec.route_ref.name
                    ),
                );
                self.write(Desired::abort());
                self.waiting();
            }
            RolloutPhase::WaitingForCanary => {
                self.write(Desired::abort());
                self.waiting();
            }
            RolloutPhase::Promoted => {
                self.write(desired_promoted());
                let deadline = dur(&spec.hand_back_deadline, Duration::from_secs(86_400));
                let waited = since(self.next.promoted_at.as_ref(), self.now);
                if waited >= deadline {
                    let already = cond::find(&self.next.conditions, conditions::HAND_BACK_OVERDUE)
                        .is_some_and(|c| c.status == "True");
                    let note = format!(
                        "promoted {}s ago; the Git change making the canary stable should delete this Rollout",
                        waited.as_secs()
                    );
                    self.condition(
                        conditions::HAND_BACK_OVERDUE,
                        Status::True,
                        reasons::HAND_BACK_OVERDUE,
                        note.clone(),
                    );
                    if !already {
                        self.event(
                            Severity::Warning,
                            reasons::HAND_BACK_OVERDUE,
                            event_actions::PROMOTE,
                            note,
                        );
                    }
                } else {
                    self.wake(deadline - waited);
                }
            }
            RolloutPhase::Progressing | RolloutPhase::Paused => self.progressing(),
        }
    }

    fn waiting(&mut self) {
        let spec = self.spec;
        let service_missing = self.obs.canary_service == Some(false);
        match self.obs.canary_ready {
            Some(true) if !service_missing => {
                self.next.canary_version = self.obs.canary_version.clone();
                self.next.steps_hash = Some(crate::observe::steps_hash(spec));
                self.condition(
                    conditions::CANARY_READY,
                    Status::True,
                    "Ready",
                    format!(
                        "{} {} is ready",
                        spec.canary_workload.kind, spec.canary_workload.name
                    ),
                );
                if spec.promote_full {
                    self.promote("spec.promoteFull".into());
                } else {
                    self.start_step(0);
                    self.progressing();
                }
            }
            _ => {
                let deadline = dur(&spec.canary_ready_deadline, Duration::from_secs(600));
                // From ownership, or from the retry or new canary version that restarted the
                // wait.
                let waited = since(
                    self.next.current_step_started_at.as_ref().or(self
                        .next
                        .owned_route
                        .as_ref()
                        .and_then(|o| o.owned_since.as_ref())),
                    self.now,
                );
                let msg = if service_missing {
                    format!(
                        "canary Service {} does not exist; no live weight until it does",
                        spec.canary_service.name
                    )
                } else {
                    format!(
                        "{} {} is not ready; no live weight until it is",
                        spec.canary_workload.kind, spec.canary_workload.name
                    )
                };
                self.condition(
                    conditions::CANARY_READY,
                    Status::False,
                    reasons::WAITING_FOR_CANARY,
                    msg.clone(),
                );
                if waited >= deadline {
                    self.abort(
                        AbortReason::CanaryNotReady,
                        format!("{msg}; deadline {}s passed", deadline.as_secs()),
                        None,
                    );
                } else {
                    self.wake(self.interval().min(deadline - waited));
                }
            }
        }
    }

    fn progressing(&mut self) {
        let spec = self.spec;
        if spec.promote_full {
            self.finish_step(StepOutcome::Promoted);
            self.promote("spec.promoteFull".into());
            return;
        }
        let mut index = self.next.current_step_index.unwrap_or(0) as usize;
        if self.obs.canary_service == Some(false) {
            self.hold_without_service(index);
            return;
        }
        if spec.paused {
            if self.judge_live(index, "spec.paused") {
                return;
            }
            self.next.phase = RolloutPhase::Paused;
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::PAUSED,
                "spec.paused is true",
            );
            // A weight step whose share is not yet confirmed starts its deadline over when
            // resumed: a pause never turns into an AppliedShareNotConfirmed abort on resume.
            let unconfirmed = spec.steps.get(index).and_then(|s| s.kind())
                == Some(StepKind::SetWeight)
                && self
                    .next
                    .history
                    .last()
                    .is_some_and(|h| h.share_confirmed_at.is_none());
            if unconfirmed {
                self.next.current_step_started_at = Some(Time(self.now));
            }
            self.write(desired_at(spec, index));
            return;
        }
        // Bounded: each pass completes a step or stops.
        for _ in 0..=spec.steps.len() {
            let Some(_) = spec.steps.get(index) else {
                self.promote("all steps passed".into());
                return;
            };
            if !self.run_step(index) {
                if self.next.phase != RolloutPhase::Aborted {
                    self.write(desired_at(spec, index));
                }
                return;
            }
            let outcome = if spec
                .promote_through_step
                .is_some_and(|p| p as usize >= index)
            {
                StepOutcome::Promoted
            } else {
                StepOutcome::Passed
            };
            self.finish_step(outcome);
            index += 1;
            self.start_step(index);
            if self.next.phase == RolloutPhase::Promoted {
                return;
            }
        }
    }

    /// What changed under a running plan: a new canary version (from the canary workload's
    /// pod template) sets the canary weight to 0 and restarts from step 0 once the new version
    /// is ready, also after promotion (a promoted canary serving a version nobody judged is
    /// what the rollout exists to prevent); new `spec.steps` restart the plan at the step that
    /// matches the current weight (see [`Machine::replan`]).
    fn plan_changes(&mut self) {
        let spec = self.spec;
        let hash = crate::observe::steps_hash(spec);
        let running = matches!(
            self.next.phase,
            RolloutPhase::Progressing | RolloutPhase::Paused | RolloutPhase::Promoted
        );
        if running
            && let (Some(was), Some(seen)) = (&self.next.canary_version, &self.obs.canary_version)
            && was != seen
        {
            let note = format!(
                "new canary version of {} {} (pod template {was} -> {seen}): canary weight 0; the rollout starts over from step 0 once it is ready",
                spec.canary_workload.kind, spec.canary_workload.name
            );
            self.finish_step(StepOutcome::Restarted);
            self.next.phase = RolloutPhase::WaitingForCanary;
            self.next.current_step_index = None;
            self.next.current_step_started_at = Some(Time(self.now));
            self.next.canary_version = None;
            self.next.promoted_at = None;
            self.next.cohort_share = None;
            self.next.gates.clear();
            self.next.applied_share = None;
            self.next.applied_share_observed_at = None;
            cond::remove(&mut self.next.conditions, conditions::HAND_BACK_OVERDUE);
            cond::remove(
                &mut self.next.conditions,
                conditions::APPLIED_SHARE_CONFIRMED,
            );
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::CANARY_VERSION_CHANGED,
                note.clone(),
            );
            self.event(
                Severity::Warning,
                reasons::CANARY_VERSION_CHANGED,
                event_actions::STEP,
                note,
            );
            self.next.steps_hash = Some(hash);
            return;
        }
        match self.next.steps_hash.clone() {
            None => self.next.steps_hash = Some(hash),
            Some(was) if was != hash => {
                self.next.steps_hash = Some(hash);
                if matches!(
                    self.next.phase,
                    RolloutPhase::Progressing | RolloutPhase::Paused
                ) {
                    self.replan();
                }
            }
            Some(_) => {}
        }
    }

    /// New `spec.steps` mid-rollout: the plan restarts at the weight step whose weight is the
    /// current one, else at the last weight step below it, else at step 0 — never further than
    /// the weight already judged, never straight to 100%. The restarted step is judged in full.
    fn replan(&mut self) {
        let spec = self.spec;
        let current = self.next.desired_weight.unwrap_or(0);
        let weight_steps: Vec<usize> = (0..spec.steps.len())
            .filter(|i| spec.steps[*i].kind() == Some(StepKind::SetWeight))
            .collect();
        let index = if current == 0 {
            0
        } else {
            weight_steps
                .iter()
                .copied()
                .find(|i| desired_at(spec, *i).weight == current)
                .or_else(|| {
                    weight_steps
                        .iter()
                        .copied()
                        .rfind(|i| desired_at(spec, *i).weight < current)
                })
                .unwrap_or(0)
        };
        self.finish_step(StepOutcome::Restarted);
        let note = format!(
            "spec.steps changed at canary weight {current}%: the plan restarts at step {index}"
        );
        self.event(
            Severity::Normal,
            reasons::STEPS_CHANGED,
            event_actions::STEP,
            note,
        );
        self.start_step(index);
    }

    /// The canary Service is gone mid-rollout: its share of requests would get 500s that no
    /// gate attributes to the canary. Holds the canary at weight 0 (no cohort, no mirror) and
    /// keeps the step's clock and share confirmation at their start, so the step starts over
    /// once the Service is back; never aborts for it and never advances.
    fn hold_without_service(&mut self, index: usize) {
        let msg = format!(
            "canary Service {} does not exist: canary weight 0 until it does, then step {index} starts over",
            self.spec.canary_service.name
        );
        let before =
            cond::find(&self.next.conditions, conditions::CANARY_READY).map(|c| c.reason.clone());
        self.condition(
            conditions::CANARY_READY,
            Status::False,
            reasons::CANARY_SERVICE_MISSING,
            msg.clone(),
        );
        self.condition(
            conditions::PROGRESSING,
            Status::True,
            reasons::CANARY_SERVICE_MISSING,
            msg.clone(),
        );
        if before.as_deref() != Some(reasons::CANARY_SERVICE_MISSING) {
            self.event(
                Severity::Warning,
                reasons::CANARY_SERVICE_MISSING,
                event_actions::STEP,
                msg,
            );
        }
        self.next.phase = RolloutPhase::Paused;
        self.next.current_step_started_at = Some(Time(self.now));
        self.next.gates.clear();
        if let Some(rec) = self.next.history.last_mut() {
            rec.share_confirmed_at = None;
        }
        cond::remove(
            &mut self.next.conditions,
            conditions::APPLIED_SHARE_CONFIRMED,
        );
        self.write(Desired::abort());
        self.wake(self.interval());
    }

    fn aborted(&mut self, route: &RouteState) {
        let reverted = route.canary_weight == 0 && !route.cohort && !route.mirror;
        if !self
            .actions
            .iter()
            .any(|a| matches!(a, Action::WriteRoute(_)))
        {
            self.write(Desired::abort());
        }
        let Some(a) = self.next.abort.clone() else {
            return;
        };
        let mut a = a;
        if reverted && a.route_reverted_at.is_none() {
            a.route_reverted_at = Some(Time(self.now));
        }
        if a.route_reverted_at.is_some() && a.revert_verified_at.is_none() {
            match self.obs.applied_share {
                Some(s)
                    if s <= REVERTED_SHARE_PERCENT
                        && a.route_reverted_at.as_ref().is_some_and(|t| t.0 < self.now) =>
                {
                    a.revert_verified_at = Some(Time(self.now));
                    self.event(
                        Severity::Normal,
                        "RevertVerified",
                        event_actions::ABORT,
                        format!("the mesh reports canary share {s:.2}% after the abort"),
                    );
                }
                _ => self.wake(self.interval()),
            }
        }
        self.next.abort = Some(a);
    }

    fn hand_back(&mut self) {
        self.actions.push(Action::HandBack);
        self.event(
            Severity::Normal,
            "HandedBack",
            event_actions::OWN,
            format!(
                "{} {} handed back",
                self.spec.route_ref.kind.as_str(),
                self.spec.route_ref.name
            ),
        );
    }

    fn route_problem(&mut self, reason: &'static str, message: String) {
        let before =
            cond::find(&self.next.conditions, conditions::ROUTE_OWNED).map(|c| c.reason.clone());
        self.condition(
            conditions::ROUTE_OWNED,
            Status::False,
            reason,
            message.clone(),
        );
        if before.as_deref() != Some(reason) {
            self.event(Severity::Warning, reason, event_actions::OWN, message);
        }
        self.wake(self.interval());
    }
}

fn desired_promoted() -> Desired {
    Desired {
        weight: 100,
        cohort: None,
        mirror: None,
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(1024).collect()
}

/// Fields of the spec the gates of a live canary need: while any of them is invalid the canary
/// cannot be judged, so it is aborted; any other problem (a step, a deadline) holds the canary
/// where it is and keeps judging it.
pub const JUDGED_FIELDS: [&str; 7] = [
    "spec.gates",
    "spec.analysisInterval",
    "spec.inconclusive",
    "spec.appliedShareTolerancePercent",
    "spec.routeRef",
    "spec.stableService",
    "spec.canaryService",
];

impl Machine<'_> {
    /// The state machine while the spec is invalid (`problems` non-empty) for a Rollout that
    /// already started: nothing advances, but a live canary is never left unjudged.
    fn run_invalid(&mut self, problems: &[String]) {
        let RouteObs::Present(route) = self.obs.route.clone() else {
            return;
        };
        if route.owner.as_ref().is_some_and(|o| *o != route.me) {
            return;
        }
        let index = self.next.current_step_index.unwrap_or(0) as usize;
        let first = problems.first().cloned().unwrap_or_default();
        match self.next.phase {
            RolloutPhase::Progressing | RolloutPhase::Paused => {
                let unjudgeable = problems
                    .iter()
                    .find(|p| JUDGED_FIELDS.iter().any(|f| p.starts_with(f)));
                if self.spec.abort {
                    self.abort(AbortReason::Manual, "spec.abort is true".into(), None);
                } else if let Some(p) = unjudgeable {
                    self.abort(
                        AbortReason::InvalidSpec,
                        format!(
                            "the spec became invalid in a field the gates need ({p}); a live canary is never left unjudged"
                        ),
                        None,
                    );
                } else if !self.judge_live(index, "spec invalid") {
                    self.condition(
                        conditions::PROGRESSING,
                        Status::True,
                        reasons::INVALID_SPEC,
                        format!(
                            "step {index} held at canary weight {} while the spec is invalid ({first}); the gates still judge the canary and a Fail aborts",
                            self.next.desired_weight.unwrap_or(0)
                        ),
                    );
                    self.wake(self.interval());
                    return;
                }
                self.aborted(&route);
            }
            RolloutPhase::Aborted => self.aborted(&route),
            _ => {}
        }
    }
}

/// Runs the state machine for a Rollout that already started while its spec is invalid
/// (`problems`, each `path: what is wrong`): progress stops; a live canary keeps being judged
/// when the gates' own fields are valid and is aborted otherwise; an abort keeps being
/// verified; `spec.abort` is honoured.
pub fn invalid(
    spec: &RolloutSpec,
    status: RolloutStatus,
    obs: &Observations,
    now: Timestamp,
    problems: &[String],
) -> Decision {
    let mut m = Machine {
        spec,
        obs,
        now,
        next: status,
        actions: Vec::new(),
        requeue: None,
    };
    m.run_invalid(problems);
    Decision {
        actions: m.actions,
        status: m.next,
        requeue: m.requeue.map_or(Requeue::AwaitChange, Requeue::After),
    }
}

/// Runs the state machine for a valid spec from `status`.
pub fn step(
    spec: &RolloutSpec,
    status: RolloutStatus,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut m = Machine {
        spec,
        obs,
        now,
        next: status,
        actions: Vec::new(),
        requeue: None,
    };
    m.run();
    Decision {
        actions: m.actions,
        status: m.next,
        requeue: m.requeue.map_or(Requeue::AwaitChange, Requeue::After),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn spec() -> RolloutSpec {
        serde_json::from_value(serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "analysisInterval": "1s",
            "steps": [{"mirror": {"duration": "2s"}}, {"setWeight": {"weight": 5, "duration": "2s"}}, {"promote": {}}]
        }))
        .unwrap()
    }

    fn route(w: u32, mirror: bool) -> RouteObs {
        RouteObs::Present(RouteState {
            resource_version: Some("1".into()),
            owner: Some("shop/checkout".into()),
            me: "shop/checkout".into(),
            canary_weight: w,
            mirror,
            ..RouteState::default()
        })
    }

    fn writes(d: &Decision) -> Vec<u32> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::WriteRoute(d) => Some(d.weight),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn no_weight_before_ready_then_mirror_then_share_then_abort_on_fail() {
        let s = spec();
        let mut obs = Observations {
            route: route(0, false),
            canary_ready: Some(false),
            ..Default::default()
        };
        let d = step(&s, RolloutStatus::default(), &obs, t(0));
        assert_eq!(d.status.phase, RolloutPhase::WaitingForCanary);
        assert_eq!(writes(&d), vec![0], "ownership taken at weight 0");
        obs.canary_ready = Some(true);
        let d = step(&s, d.status, &obs, t(1));
        assert_eq!(d.status.current_step_index, Some(0));
        assert!(d.status.mirror_active);
        obs.route = route(0, true);
        let d = step(&s, d.status, &obs, t(4));
        assert_eq!(d.status.current_step_index, Some(1), "mirror step elapsed");
        assert_eq!(d.status.desired_weight, Some(5));
        assert!(
            !d.status.mirror_active,
            "mirror ends at the first weight step"
        );
        // Share not yet applied.
        obs.route = route(5, false);
        let fail = GateVerdict {
            gate: "error-ratio".into(),
            verdict: Verdict::Fail,
            reason: sluice_api::v1alpha1::VerdictReason::ThresholdBreached,
            message: None,
            value: Some(0.023),
            baseline: Some(0.01),
            threshold: Some(0.015),
            samples: Some(1000),
            min_samples: Some(100),
            consecutive_failures: 1,
            inconclusive_since: None,
            evaluated_at: Time(t(5)),
        };
        obs.gates = vec![(fail.clone(), GateAction::Abort)];
        obs.applied_share = Some(1.0);
        // A Fail needs no confirmed share: failing is the safe direction.
        let early = step(&s, d.status.clone(), &obs, t(5));
        assert_eq!(
            early.status.phase,
            RolloutPhase::Aborted,
            "judged from the first second"
        );
        // Without a Fail, the step is never judged on the written weight.
        obs.gates.clear();
        let d = step(&s, d.status, &obs, t(5));
        assert_eq!(
            d.status.phase,
            RolloutPhase::Progressing,
            "never judged on the written weight"
        );
        assert!(
            d.status
                .history
                .last()
                .unwrap()
                .share_confirmed_at
                .is_none()
        );
        obs.applied_share = Some(5.3);
        obs.gates.clear();
        let d = step(&s, d.status, &obs, t(6));
        assert!(
            d.status
                .history
                .last()
                .unwrap()
                .share_confirmed_at
                .is_some()
        );
        let mut f = fail;
        f.evaluated_at = Time(t(7));
        obs.gates = vec![(f, GateAction::Abort)];
        let d = step(&s, d.status, &obs, t(7));
        assert_eq!(d.status.phase, RolloutPhase::Aborted);
        assert_eq!(writes(&d), vec![0], "abort writes weight 0 once");
        let a = d.status.abort.clone().unwrap();
        assert_eq!(a.reason, AbortReason::GateFailed);
        obs.route = route(0, false);
        obs.gates.clear();
        obs.applied_share = Some(0.1);
        let d2 = step(&s, d.status.clone(), &obs, t(8));
        assert!(
            d2.status
                .abort
                .as_ref()
                .unwrap()
                .route_reverted_at
                .is_some()
        );
        let d3 = step(&s, d2.status, &obs, t(9));
        assert!(
            d3.status.abort.unwrap().revert_verified_at.is_some(),
            "share ~0 verified"
        );
        // A restarted operator with the same status decides the same.
        assert_eq!(
            step(&s, d.status.clone(), &obs, t(8)).status.phase,
            RolloutPhase::Aborted
        );
    }

    #[test]
    fn kept_cohort_counts_in_the_expected_share() {
        let with = |keep: bool| -> RolloutSpec {
            serde_json::from_value(serde_json::json!({
                "routeRef": {"name": "checkout"},
                "stableService": {"name": "v1"},
                "canaryService": {"name": "v2"},
                "canaryWorkload": {"name": "v2"},
                "keepCohort": keep,
                "steps": [
                    {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "2s"}},
                    {"setWeight": {"weight": 10}}
                ]
            }))
            .unwrap()
        };
        // The cohort step records the share it measured.
        let obs = Observations {
            route: route(0, false),
            canary_ready: Some(true),
            applied_share: Some(2.0),
            ..Default::default()
        };
        let st = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(0),
            current_step_started_at: Some(Time(t(0))),
            ..Default::default()
        };
        let d = step(&with(true), st, &obs, t(1));
        assert_eq!(d.status.cohort_share, Some(2.0));
        let table = [
            ("kept cohort measured", true, Some(2.0), 2.0 + 98.0 * 0.1),
            ("kept cohort not measured", true, None, 10.0),
            ("cohort ends at the weight step", false, Some(2.0), 10.0),
        ];
        for (name, keep, share, want) in table {
            let st = RolloutStatus {
                cohort_share: share,
                ..Default::default()
            };
            let got = expected_share(&with(keep), &st, 1);
            assert!((got - want).abs() < 1e-9, "{name}: {got} != {want}");
        }
    }

    #[test]
    fn a_bundle_pin_that_leaves_the_weights_equal_still_stops_the_rollout() {
        let s = spec();
        let st = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(1),
            desired_weight: Some(5),
            owned_route: Some(OwnedRouteStatus {
                last_written_resource_version: Some("1".into()),
                written_weight: Some(5),
                ..Default::default()
            }),
            ..Default::default()
        };
        let RouteObs::Present(mut r) = route(5, false) else {
            unreachable!()
        };
        r.resource_version = Some("2".into());
        r.last_writer = Some(REVERT_FIELD_MANAGER.into());
        let obs = Observations {
            route: RouteObs::Present(r),
            ..Default::default()
        };
        let d = step(&s, st, &obs, t(0));
        assert_eq!(
            d.status.abort.as_ref().map(|a| a.reason),
            Some(AbortReason::PinnedByBundlePin)
        );
        assert!(writes(&d).is_empty(), "never writes over the pin");
    }

    #[test]
    fn bundle_pin_rewrite_aborts_and_stops() {
        let s = spec();
        let st = RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(1),
            owned_route: Some(OwnedRouteStatus {
                last_written_resource_version: Some("1".into()),
                written_weight: Some(5),
                ..Default::default()
            }),
            ..Default::default()
        };
        let RouteObs::Present(mut r) = route(0, false) else {
            unreachable!()
        };
        r.resource_version = Some("2".into());
        r.last_writer = Some(REVERT_FIELD_MANAGER.into());
        let obs = Observations {
            route: RouteObs::Present(r),
            canary_ready: Some(true),
            ..Default::default()
        };
        let d = step(&s, st, &obs, t(0));
        assert_eq!(
            d.status.abort.as_ref().unwrap().reason,
            AbortReason::PinnedByBundlePin
        );
        assert!(writes(&d).is_empty(), "never fights the pin");
    }

    #[test]
    fn controls_table() {
        let progressing = |idx: u32| RolloutStatus {
            phase: RolloutPhase::Progressing,
            current_step_index: Some(idx),
            current_step_started_at: Some(Time(t(0))),
            ..Default::default()
        };
        let aborted = RolloutStatus {
            phase: RolloutPhase::Aborted,
            abort: Some(AbortStatus {
                reason: AbortReason::Manual,
                message: None,
                gate: None,
                step_index: Some(1),
                first_failed_at: None,
                decided_at: Time(t(0)),
                route_reverted_at: Some(Time(t(0))),
                revert_verified_at: None,
            }),
            abort_detect_to_revert_ms: Some(812),
            ..Default::default()
        };
        let with = |patch: serde_json::Value| {
            let mut v = serde_json::to_value(spec()).unwrap();
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            serde_json::from_value::<RolloutSpec>(v).unwrap()
        };
        type Row = (
            &'static str,
            RolloutSpec,
            RolloutStatus,
            i64,
            RolloutPhase,
            Option<u32>,
        );
        let table: Vec<Row> = vec![
            (
                "manual abort",
                with(serde_json::json!({"abort": true})),
                progressing(1),
                1,
                RolloutPhase::Aborted,
                Some(0),
            ),
            (
                "paused holds the weight",
                with(serde_json::json!({"paused": true})),
                progressing(1),
                1,
                RolloutPhase::Paused,
                Some(5),
            ),
            (
                "promoteFull",
                with(serde_json::json!({"promoteFull": true})),
                progressing(1),
                1,
                RolloutPhase::Promoted,
                Some(100),
            ),
            (
                "promoteThroughStep skips analysis",
                with(serde_json::json!({"promoteThroughStep": 1})),
                progressing(1),
                1,
                RolloutPhase::Promoted,
                Some(100),
            ),
            (
                "share reported wrong past the deadline: abort",
                with(serde_json::json!({"appliedShareDeadline": "3s"})),
                RolloutStatus {
                    applied_share: Some(2.0),
                    applied_share_observed_at: Some(Time(t(4))),
                    ..progressing(1)
                },
                4,
                RolloutPhase::Aborted,
                Some(0),
            ),
            (
                "no share data past the deadline (metrics outage): held, never aborted",
                with(serde_json::json!({"appliedShareDeadline": "3s"})),
                progressing(1),
                4,
                RolloutPhase::Paused,
                Some(5),
            ),
            (
                "share not yet applied: hold",
                spec(),
                progressing(1),
                2,
                RolloutPhase::Progressing,
                Some(5),
            ),
            (
                "retry restarts",
                with(serde_json::json!({"retry": 1})),
                aborted.clone(),
                1,
                RolloutPhase::Progressing,
                Some(0),
            ),
            (
                "aborted stays aborted",
                spec(),
                aborted,
                1,
                RolloutPhase::Aborted,
                Some(0),
            ),
        ];
        for (name, s, st, now, phase, weight) in table {
            let obs = Observations {
                route: route(5, false),
                canary_ready: Some(true),
                ..Default::default()
            };
            let d = step(&s, st, &obs, t(now));
            assert_eq!(d.status.phase, phase, "{name}");
            assert_eq!(d.status.desired_weight, weight, "{name}");
            // The millisecond figure lives exactly as long as the revert it measures.
            let reverted = d
                .status
                .abort
                .as_ref()
                .is_some_and(|a| a.route_reverted_at.is_some());
            assert_eq!(
                d.status.abort_detect_to_revert_ms.is_some(),
                reverted,
                "{name}: abortDetectToRevertMs {:?} with abort {:?}",
                d.status.abort_detect_to_revert_ms,
                d.status.abort
            );
        }
    }

    fn verdict(gate: &str, verdict: Verdict, at: i64) -> GateVerdict {
        GateVerdict {
            gate: gate.into(),
            verdict,
            reason: if verdict == Verdict::Fail {
                sluice_api::v1alpha1::VerdictReason::ThresholdBreached
            } else {
                sluice_api::v1alpha1::VerdictReason::TooFewSamples
            },
            message: None,
            value: Some(0.046),
            baseline: Some(0.02),
            threshold: Some(0.03),
            samples: Some(1000),
            min_samples: Some(100),
            consecutive_failures: u32::from(verdict == Verdict::Fail) * 2,
            inconclusive_since: (verdict == Verdict::Inconclusive).then(|| Time(t(0))),
            evaluated_at: Time(t(at)),
        }
    }

    /// A Rollout in step `index` since t(0), with what the route carries in that step.
    fn live(s: &RolloutSpec, index: u32, phase: RolloutPhase, confirmed: bool) -> RolloutStatus {
        let d = desired_at(s, index as usize);
        let kind = s.steps[index as usize].kind().unwrap();
        RolloutStatus {
            phase,
            current_step_index: Some(index),
            current_step_started_at: Some(Time(t(0))),
            desired_weight: Some(d.weight),
            cohort_active: d.cohort.is_some(),
            mirror_active: d.mirror.is_some(),
            owned_route: Some(OwnedRouteStatus {
                written_weight: Some(d.weight),
                owned_since: Some(Time(t(0))),
                ..Default::default()
            }),
            history: vec![StepRecord {
                index,
                kind,
                weight: Some(d.weight),
                started_at: Time(t(0)),
                share_confirmed_at: confirmed.then(|| Time(t(0))),
                finished_at: None,
                outcome: None,
            }],
            ..Default::default()
        }
    }

    fn live_route(s: &RolloutSpec, st: &RolloutStatus) -> RouteObs {
        let d = desired_at(s, st.current_step_index.unwrap_or(0) as usize);
        RouteObs::Present(RouteState {
            resource_version: Some("1".into()),
            owner: Some("shop/checkout".into()),
            me: "shop/checkout".into(),
            canary_weight: d.weight,
            cohort: d.cohort.is_some(),
            mirror: d.mirror.is_some(),
            ..RouteState::default()
        })
    }

    fn held_spec(pause: serde_json::Value, patch: serde_json::Value) -> RolloutSpec {
        let mut v = serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "analysisInterval": "30s",
            "steps": [
                {"mirror": {"duration": "10m"}},
                {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "10m"}},
                {"setWeight": {"weight": 1, "duration": "10m"}},
                {"pause": pause},
                {"setWeight": {"weight": 50}},
                {"promote": {}}
            ]
        });
        for (k, x) in patch.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    /// Every state in which the canary receives traffic, held or not: (name, spec, status).
    fn live_states() -> Vec<(&'static str, RolloutSpec, RolloutStatus)> {
        use RolloutPhase::*;
        let until = serde_json::json!({"untilPromoted": true});
        let timed = serde_json::json!({"duration": "1h"});
        let plain = held_spec(until.clone(), serde_json::json!({}));
        let paused = held_spec(until.clone(), serde_json::json!({"paused": true}));
        let timed_spec = held_spec(timed, serde_json::json!({}));
        vec![
            (
                "mirror step",
                plain.clone(),
                live(&plain, 0, Progressing, false),
            ),
            (
                "cohort step",
                plain.clone(),
                live(&plain, 1, Progressing, false),
            ),
            (
                "weight step, first second, share not confirmed",
                plain.clone(),
                live(&plain, 2, Progressing, false),
            ),
            (
                "weight step, share confirmed",
                plain.clone(),
                live(&plain, 2, Progressing, true),
            ),
            (
                "pause untilPromoted at 1%",
                plain.clone(),
                live(&plain, 3, Paused, false),
            ),
            (
                "timed pause at 1%",
                timed_spec.clone(),
                live(&timed_spec, 3, Paused, false),
            ),
            (
                "spec.paused at 1%",
                paused.clone(),
                live(&paused, 2, Paused, true),
            ),
            (
                "spec.paused at 1%, share not confirmed",
                paused.clone(),
                live(&paused, 2, Progressing, false),
            ),
            (
                "spec.paused in the mirror step",
                paused.clone(),
                live(&paused, 0, Paused, false),
            ),
        ]
    }

    #[test]
    fn a_fail_aborts_in_every_state_the_canary_receives_traffic() {
        for (name, s, st) in live_states() {
            let obs = Observations {
                route: live_route(&s, &st),
                gates: vec![(verdict("error-ratio", Verdict::Fail, 60), GateAction::Abort)],
                applied_share: Some(0.9),
                ..Default::default()
            };
            let d = step(&s, st, &obs, t(60));
            assert_eq!(d.status.phase, RolloutPhase::Aborted, "{name}");
            assert_eq!(writes(&d), vec![0], "{name}: one write, canary 0");
            assert!(
                d.actions
                    .iter()
                    .any(|a| matches!(a, Action::WriteRoute(w) if *w == Desired::abort())),
                "{name}: cohort and mirror removed in the same write"
            );
            let a = d.status.abort.as_ref().unwrap();
            assert_eq!(a.reason, AbortReason::GateFailed, "{name}");
            assert_eq!(a.gate.as_ref().unwrap().gate, "error-ratio", "{name}");
            assert_eq!(
                a.decided_at,
                Time(t(60)),
                "{name}: decided on the verdict's tick"
            );
        }
    }

    #[test]
    fn without_a_fail_a_held_canary_stays_held_and_keeps_its_verdicts() {
        for (name, s, st) in live_states() {
            let before = (st.phase, st.current_step_index, st.desired_weight);
            let obs = Observations {
                route: live_route(&s, &st),
                gates: vec![
                    (
                        verdict("error-ratio", Verdict::Pass, 60),
                        GateAction::Proceed,
                    ),
                    // An Inconclusive whose policy says Abort applies only to a confirmed weight
                    // step; a hold never aborts on missing data.
                    (
                        verdict("latency-p99", Verdict::Inconclusive, 60),
                        GateAction::Abort,
                    ),
                ],
                applied_share: Some(0.9),
                ..Default::default()
            };
            let d = step(&s, st, &obs, t(60));
            if name == "weight step, share confirmed" {
                assert_eq!(
                    d.status.phase,
                    RolloutPhase::Aborted,
                    "{name}: policy Abort"
                );
                continue;
            }
            assert_ne!(d.status.phase, RolloutPhase::Aborted, "{name}");
            assert_eq!(
                (d.status.current_step_index, d.status.desired_weight),
                (before.1, before.2),
                "{name}: no step advanced"
            );
            assert_eq!(d.status.gates.len(), 2, "{name}: verdicts recorded");
            assert_eq!(d.status.applied_share, Some(0.9), "{name}: share recorded");
        }
    }

    fn kinds(d: &Decision) -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::WriteRoute(w) => Some(format!("write {}", w.weight)),
                Action::HandBack => Some("hand back".into()),
                Action::Release { kind, route, .. } => {
                    Some(format!("release {} {route}", kind.as_str()))
                }
                Action::Event { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_retry_starts_clean_and_works_after_a_released_pin() {
        use RolloutPhase::*;
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({"retry": 1}),
        );
        let mut st = live(&s, 2, Aborted, true);
        st.abort = Some(AbortStatus {
            reason: AbortReason::PinnedByBundlePin,
            message: None,
            gate: None,
            step_index: Some(2),
            first_failed_at: None,
            decided_at: Time(t(0)),
            route_reverted_at: None,
            revert_verified_at: None,
        });
        st.cohort_share = Some(4.0);
        st.applied_share = Some(1.1);
        st.gates = vec![verdict("error-ratio", Verdict::Pass, 30)];
        if let Some(o) = st.owned_route.as_mut() {
            o.last_written_resource_version = Some("1".into());
        }
        let route = |writer: &str| {
            let RouteObs::Present(mut r) = live_route(&s, &st) else {
                unreachable!()
            };
            r.resource_version = Some("7".into());
            r.canary_weight = 0;
            r.last_writer = Some(writer.into());
            RouteObs::Present(r)
        };
        // While revert holds the route, the pin wins and the retry waits.
        let obs = Observations {
            route: route(REVERT_FIELD_MANAGER),
            ..Default::default()
        };
        let d = step(&s, st.clone(), &obs, t(600));
        assert_eq!(d.status.phase, Aborted);
        assert_eq!(d.status.retries_handled, 0);
        // Released (Argo CD wrote the rules last): the retry starts over, clean.
        let obs = Observations {
            route: route("argocd-controller"),
            canary_ready: Some(true),
            ..Default::default()
        };
        let d = step(&s, st, &obs, t(600));
        assert_ne!(d.status.phase, Aborted, "{:?}", d.status.abort);
        assert_eq!(d.status.retries_handled, 1);
        assert!(d.status.abort.is_none());
        assert_eq!(d.status.cohort_share, None);
        assert!(
            d.status.gates.iter().all(|g| g.evaluated_at.0 >= t(600)),
            "{:?}",
            d.status.gates
        );
        assert_eq!(
            d.status
                .owned_route
                .as_ref()
                .and_then(|o| o.last_written_resource_version.as_deref()),
            Some("7")
        );
    }

    #[test]
    fn deleting_before_promotion_aborts_then_hands_back() {
        use RolloutPhase::*;
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        let mut pinned = live(&s, 2, Aborted, true);
        pinned.abort = Some(AbortStatus {
            reason: AbortReason::PinnedByBundlePin,
            message: None,
            gate: None,
            step_index: Some(2),
            first_failed_at: None,
            decided_at: Time(t(0)),
            route_reverted_at: None,
            revert_verified_at: None,
        });
        let mut promoted = live(&s, 5, Promoted, true);
        promoted.desired_weight = Some(100);
        let table = [
            (
                "mirror step",
                live(&s, 0, Progressing, false),
                vec!["write 0", "hand back"],
            ),
            (
                "cohort step",
                live(&s, 1, Progressing, false),
                vec!["write 0", "hand back"],
            ),
            (
                "1%",
                live(&s, 2, Progressing, true),
                vec!["write 0", "hand back"],
            ),
            (
                "paused at 1%",
                live(&s, 3, Paused, true),
                vec!["write 0", "hand back"],
            ),
            (
                "promoted: the canary is the new stable",
                promoted,
                vec!["hand back"],
            ),
            ("pinned: the route is the pin's", pinned, vec!["hand back"]),
        ];
        for (name, st, want) in table {
            let mut obs = Observations {
                route: live_route(&s, &st),
                deleting: true,
                ..Default::default()
            };
            if name.starts_with("promoted")
                && let RouteObs::Present(r) = &mut obs.route
            {
                r.canary_weight = 100;
            }
            let d = step(&s, st, &obs, t(60));
            assert_eq!(kinds(&d), want, "{name}");
        }
        // Already at 0 with no extra rules: nothing to abort.
        let st = live(&s, 2, Aborted, true);
        let obs = Observations {
            route: route(0, false),
            deleting: true,
            ..Default::default()
        };
        assert_eq!(kinds(&step(&s, st, &obs, t(60))), vec!["hand back"]);
    }

    #[test]
    fn a_route_the_steps_do_not_fit_never_blocks_abort_or_hand_back() {
        use RolloutPhase::*;
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        let st = live(&s, 3, Paused, true);
        let RouteObs::Present(state) = live_route(&s, &st) else {
            unreachable!()
        };
        let unusable = |state: Option<RouteState>| RouteObs::Unusable {
            reason: reasons::ROUTE_FULL,
            message: "step 0: no room for the mirror rule".into(),
            state,
        };
        let fail = vec![(verdict("error-ratio", Verdict::Fail, 60), GateAction::Abort)];
        let pass = vec![(
            verdict("error-ratio", Verdict::Pass, 60),
            GateAction::Proceed,
        )];
        let with_abort = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({"abort": true}),
        );
        type Row = (
            &'static str,
            RolloutSpec,
            RouteObs,
            bool,
            Vec<(GateVerdict, GateAction)>,
            Vec<&'static str>,
            RolloutPhase,
        );
        let table: Vec<Row> = vec![
            (
                "held, judged, no Fail: nothing written",
                s.clone(),
                unusable(Some(state.clone())),
                false,
                pass,
                vec![],
                Paused,
            ),
            (
                "a Fail aborts",
                s.clone(),
                unusable(Some(state.clone())),
                false,
                fail.clone(),
                vec!["write 0"],
                Aborted,
            ),
            (
                "spec.abort aborts",
                with_abort,
                unusable(Some(state.clone())),
                false,
                vec![],
                vec!["write 0"],
                Aborted,
            ),
            (
                "deleted: abort, then hand back",
                s.clone(),
                unusable(Some(state)),
                true,
                vec![],
                vec!["write 0", "hand back"],
                Paused,
            ),
            (
                "deleted, parts unreadable: hand back",
                s.clone(),
                unusable(None),
                true,
                vec![],
                vec!["hand back"],
                Paused,
            ),
        ];
        for (name, spec, route, deleting, gates, want, phase) in table {
            let obs = Observations {
                route,
                deleting,
                gates,
                ..Default::default()
            };
            let d = step(&spec, st.clone(), &obs, t(60));
            assert_eq!(kinds(&d), want, "{name}");
            assert_eq!(d.status.phase, phase, "{name}");
            let owned = cond::find(&d.status.conditions, conditions::ROUTE_OWNED).unwrap();
            assert_eq!(
                (owned.status.as_str(), owned.reason.as_str()),
                ("False", reasons::ROUTE_FULL),
                "{name}: the refusal stays reported"
            );
        }
    }

    #[test]
    fn a_missing_canary_service_holds_at_zero_and_the_step_starts_over() {
        let s = spec();
        // Before any live weight: the canary waits for its Service as for its readiness.
        let waiting = RolloutStatus {
            phase: RolloutPhase::WaitingForCanary,
            owned_route: Some(OwnedRouteStatus {
                owned_since: Some(Time(t(0))),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut obs = Observations {
            route: route(0, false),
            canary_ready: Some(true),
            canary_service: Some(false),
            ..Default::default()
        };
        let d = step(&s, waiting, &obs, t(1));
        assert_eq!(d.status.phase, RolloutPhase::WaitingForCanary);
        assert_eq!(writes(&d), vec![0]);
        // Mid-rollout at 5%, share confirmed: the Service goes away.
        let st = live(&s, 1, RolloutPhase::Progressing, true);
        obs.route = route(5, false);
        obs.canary_ready = None;
        let d = step(&s, st, &obs, t(120));
        assert_eq!(d.status.phase, RolloutPhase::Paused, "held, not aborted");
        assert_eq!(writes(&d), vec![0], "no request goes to a missing backend");
        assert!(d.status.abort.is_none());
        assert!(
            d.status
                .history
                .last()
                .unwrap()
                .share_confirmed_at
                .is_none()
        );
        let c = cond::find(&d.status.conditions, conditions::CANARY_READY).unwrap();
        assert_eq!(c.reason, reasons::CANARY_SERVICE_MISSING);
        // Long past every deadline, still held.
        obs.route = route(0, false);
        let d = step(&s, d.status, &obs, t(3_600));
        assert_eq!(
            (d.status.phase, writes(&d)),
            (RolloutPhase::Paused, vec![0])
        );
        // The Service is back: the step starts over at its weight, judged on the share again.
        obs.canary_service = Some(true);
        let d = step(&s, d.status, &obs, t(3_601));
        assert_eq!(writes(&d), vec![5]);
        assert_eq!(d.status.current_step_index, Some(1));
        assert_eq!(d.status.current_step_started_at, Some(Time(t(3_600))));
        assert!(d.status.abort.is_none());
    }

    #[test]
    fn new_steps_restart_at_the_step_matching_the_weight_never_further() {
        use RolloutPhase::*;
        let old = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        let with_steps = |steps: serde_json::Value| {
            let mut v = serde_json::to_value(&old).unwrap();
            v["steps"] = steps;
            serde_json::from_value::<RolloutSpec>(v).unwrap()
        };
        let hashed = |mut st: RolloutStatus| {
            st.steps_hash = Some(crate::observe::steps_hash(&old));
            st
        };
        let mut at_fifty = live(&old, 4, Progressing, true);
        at_fifty.desired_weight = Some(50);
        type Row = (
            &'static str,
            RolloutSpec,
            RolloutStatus,
            Option<u32>,
            u32,
            RolloutPhase,
        );
        let table: Vec<Row> = vec![
            (
                "unchanged steps: nothing restarts",
                old.clone(),
                hashed(live(&old, 3, Paused, false)),
                Some(3),
                1,
                Paused,
            ),
            (
                "list shrunk below the index: restart at the 1% step, not promoted",
                with_steps(serde_json::json!([{"setWeight": {"weight": 1}}, {"promote": {}}])),
                hashed(live(&old, 3, Paused, false)),
                Some(0),
                1,
                Progressing,
            ),
            (
                "no step at 50%: the last weight step below it",
                with_steps(
                    serde_json::json!([{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 25}}, {"promote": {}}]),
                ),
                hashed(at_fifty),
                Some(1),
                25,
                Progressing,
            ),
            (
                "nothing at or below the weight: from step 0",
                with_steps(
                    serde_json::json!([{"mirror": {"duration": "1m"}}, {"setWeight": {"weight": 10}}, {"promote": {}}]),
                ),
                hashed(live(&old, 2, Progressing, true)),
                Some(0),
                0,
                Progressing,
            ),
            (
                "a status from before the hash: adopted, nothing restarts",
                with_steps(serde_json::json!([{"setWeight": {"weight": 1}}, {"promote": {}}])),
                live(&old, 0, Progressing, false),
                Some(0),
                1,
                Progressing,
            ),
        ];
        for (name, spec, st, index, weight, phase) in table {
            let obs = Observations {
                route: live_route(&old, &st),
                ..Default::default()
            };
            let d = step(&spec, st, &obs, t(60));
            assert_eq!(d.status.current_step_index, index, "{name}");
            assert_eq!(d.status.desired_weight, Some(weight), "{name}");
            assert_eq!(d.status.phase, phase, "{name}");
            assert!(!writes(&d).contains(&100), "{name}: never straight to 100%");
            assert_eq!(
                d.status.steps_hash,
                Some(crate::observe::steps_hash(&spec)),
                "{name}"
            );
        }
    }

    #[test]
    fn a_new_canary_version_restarts_from_step_zero_at_weight_zero() {
        use RolloutPhase::*;
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        let versioned = |mut st: RolloutStatus| {
            st.canary_version = Some("aaaa".into());
            st.steps_hash = Some(crate::observe::steps_hash(&s));
            st
        };
        let mut promoted = live(&s, 5, Promoted, true);
        promoted.desired_weight = Some(100);
        promoted.promoted_at = Some(Time(t(0)));
        for (name, st) in [
            ("paused at 1%", versioned(live(&s, 3, Paused, false))),
            ("weight step", versioned(live(&s, 2, Progressing, true))),
            ("promoted", versioned(promoted)),
        ] {
            let mut obs = Observations {
                route: live_route(&s, &st),
                canary_ready: Some(false),
                canary_version: Some("aaaa".into()),
                ..Default::default()
            };
            let same = step(&s, st.clone(), &obs, t(3_600));
            assert_eq!(
                same.status.phase, st.phase,
                "{name}: same version, nothing restarts"
            );
            obs.canary_version = Some("bbbb".into());
            let d = step(&s, st, &obs, t(3_600));
            assert_eq!(d.status.phase, WaitingForCanary, "{name}");
            assert_eq!(writes(&d), vec![0], "{name}: canary weight 0 at once");
            assert_eq!(d.status.current_step_index, None, "{name}");
            assert!(d.status.promoted_at.is_none(), "{name}");
            assert!(d.status.abort.is_none(), "{name}");
            // Still rolling out, long after ownership was taken: the ready deadline counts from
            // the new version, so it waits rather than aborts.
            let d = step(&s, d.status, &obs, t(3_700));
            assert_eq!(d.status.phase, WaitingForCanary, "{name}");
            // Ready: the new version is judged from step 0.
            obs.canary_ready = Some(true);
            let d = step(&s, d.status, &obs, t(3_800));
            assert_eq!(d.status.current_step_index, Some(0), "{name}");
            assert_eq!(d.status.canary_version.as_deref(), Some("bbbb"), "{name}");
        }
    }

    #[test]
    fn a_sustained_inconclusive_under_continue_lets_the_step_complete() {
        use RolloutPhase::*;
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        // The 1% step (10 minutes) is over; one gate has no data for long enough.
        let st = live(&s, 2, Progressing, true);
        let gates = |act| {
            vec![
                (
                    verdict("error-ratio", Verdict::Pass, 900),
                    GateAction::Proceed,
                ),
                (
                    verdict("applied-share", Verdict::Pass, 900),
                    GateAction::Proceed,
                ),
                (verdict("latency-p99", Verdict::Inconclusive, 900), act),
            ]
        };
        for (name, act, want_index) in [
            (
                "policy Continue: the gate counts as passed",
                GateAction::Proceed,
                Some(3),
            ),
            (
                "still within its wait: the step waits",
                GateAction::Wait,
                Some(2),
            ),
        ] {
            let obs = Observations {
                route: live_route(&s, &st),
                gates: gates(act),
                applied_share: Some(1.0),
                ..Default::default()
            };
            let d = step(&s, st.clone(), &obs, t(900));
            assert_eq!(d.status.current_step_index, want_index, "{name}");
            assert_ne!(d.status.phase, Aborted, "{name}");
        }
    }

    #[test]
    fn a_new_route_or_service_releases_the_old_route_before_starting_over() {
        use RolloutPhase::*;
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        let with =
            |patch: serde_json::Value| held_spec(serde_json::json!({"untilPromoted": true}), patch);
        let mut st = live(&s, 2, Progressing, true);
        if let Some(o) = st.owned_route.as_mut() {
            o.name = "checkout".into();
            o.kind = Some(RouteKindName::HttpRoute);
            o.stable_service = Some("v1".into());
            o.canary_service = Some("v2".into());
        }
        let mut unrecorded = st.clone();
        if let Some(o) = unrecorded.owned_route.as_mut() {
            o.kind = None;
            o.stable_service = None;
            o.canary_service = None;
        }
        type Row = (
            &'static str,
            RolloutSpec,
            RolloutStatus,
            bool,
            Vec<&'static str>,
            RolloutPhase,
        );
        let table: Vec<Row> = vec![
            (
                "unchanged",
                s.clone(),
                st.clone(),
                false,
                vec![],
                Progressing,
            ),
            (
                "new canary Service",
                with(serde_json::json!({"canaryService": {"name": "v3"}})),
                st.clone(),
                false,
                vec!["release HTTPRoute checkout"],
                Pending,
            ),
            (
                "new stable Service",
                with(serde_json::json!({"stableService": {"name": "v0"}})),
                st.clone(),
                false,
                vec!["release HTTPRoute checkout"],
                Pending,
            ),
            (
                "new route",
                with(serde_json::json!({"routeRef": {"name": "checkout-b"}})),
                st.clone(),
                false,
                vec!["release HTTPRoute checkout"],
                Pending,
            ),
            (
                "deleted after the edit: only the old route is released",
                with(serde_json::json!({"routeRef": {"name": "checkout-b"}})),
                st.clone(),
                true,
                vec!["release HTTPRoute checkout"],
                Progressing,
            ),
            (
                "same name, new kind",
                with(serde_json::json!({"routeRef": {"name": "checkout", "kind": "GRPCRoute"}})),
                st.clone(),
                false,
                vec!["release HTTPRoute checkout"],
                Pending,
            ),
            (
                "status from before the Services were recorded",
                with(serde_json::json!({"canaryService": {"name": "v3"}})),
                unrecorded,
                false,
                vec![],
                Progressing,
            ),
        ];
        for (name, spec, st, deleting, want, phase) in table {
            let obs = Observations {
                route: live_route(&s, &st),
                deleting,
                ..Default::default()
            };
            let d = step(&spec, st, &obs, t(60));
            let got = kinds(&d);
            let got: Vec<&str> = got
                .iter()
                .map(String::as_str)
                .filter(|k| k.starts_with("release") || want.is_empty() && k.starts_with("hand"))
                .collect();
            assert_eq!(got, want, "{name}");
            assert_eq!(d.status.phase, phase, "{name}");
            if phase == Pending {
                assert!(
                    writes(&d).is_empty(),
                    "{name}: nothing written to the new route yet"
                );
                assert!(d.status.abort.is_none(), "{name}");
            }
        }
    }

    #[test]
    fn an_overdue_hand_back_emits_one_event() {
        let s = spec();
        let st = RolloutStatus {
            phase: RolloutPhase::Promoted,
            promoted_at: Some(Time(t(0))),
            ..Default::default()
        };
        let obs = Observations {
            route: route(100, false),
            ..Default::default()
        };
        let overdue = |d: &Decision| {
            d.actions
                .iter()
                .filter(|a| matches!(a, Action::Event { reason, .. } if *reason == reasons::HAND_BACK_OVERDUE))
                .count()
        };
        let d = step(&s, st.clone(), &obs, t(3_600));
        assert_eq!(overdue(&d), 0, "within the deadline");
        let d = step(&s, st, &obs, t(86_400));
        assert_eq!(overdue(&d), 1, "a Warning Event when it becomes overdue");
        let d = step(&s, d.status, &obs, t(90_000));
        assert_eq!(overdue(&d), 0, "once");
    }

    #[test]
    fn resuming_an_unconfirmed_step_never_aborts_for_the_time_spent_paused() {
        let s = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({"paused": true}),
        );
        let resumed = held_spec(
            serde_json::json!({"untilPromoted": true}),
            serde_json::json!({}),
        );
        let st = live(&s, 2, RolloutPhase::Progressing, false);
        let obs = Observations {
            route: live_route(&s, &st),
            applied_share: Some(0.5),
            ..Default::default()
        };
        // Paused for an hour, past the 10-minute share deadline, the share still climbing.
        let d = step(&s, st, &obs, t(3_600));
        assert_eq!(d.status.phase, RolloutPhase::Paused);
        let d = step(&resumed, d.status, &obs, t(3_601));
        assert_ne!(
            d.status.phase,
            RolloutPhase::Aborted,
            "{:?}",
            d.status.abort
        );
    }
}
