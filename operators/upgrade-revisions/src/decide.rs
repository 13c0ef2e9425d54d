//! The pure heart of sluice-upgrade-revisions: (spec, current status, observations, now) →
//! (actions, next status). The status is the state machine: a restarted operator reaches the
//! same decision from the status it wrote and what it observes.
//!
//! Owns the upgrade's transitions: waves started in order, namespaces relabelled from the old
//! tag to the new one, meshed pods restarted within the issuance budget ([`crate::pacing`]),
//! progress counted from the revision the injector recorded in each pod, soaks judged by gates,
//! abort (a gate's Fail or `spec.abort`) retagging the unfinished waves' namespaces back and
//! restarting them, explicit resume, completion when no proxy runs the old revision. Must never
//! do I/O or read the clock, never restart a pod already on the target revision (so evictions
//! already done are never repeated), never evict a bare pod (nothing would replace it), never
//! touch a namespace relabelled by someone else, and never remove the old control plane.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    CapturedBaseline, GateVerdict, RevisionUpgradePhase, RevisionUpgradeSpec,
    RevisionUpgradeStatus,
    revision_upgrade::{
        IssuanceBudgetStatus, NamespaceProgress, NamespaceState, ProxyCounts, RelabelDetection,
        RestartMode, UpgradeWaveState, UpgradeWaveStatus, WorkloadReport, conditions, reasons,
    },
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Severity,
};

use crate::{
    availability_floor::{self, Plan},
    fleet::{self, NamespaceView, PodView, Workload, WorkloadView},
    pacing::{self, Hold, IssuanceReading},
    validity,
};

/// Time between two ticks of an active upgrade.
pub const TICK: Duration = pacing::TICK;
/// Time between two looks at an idle (pending on a problem, aborted or complete) upgrade.
pub const IDLE: Duration = Duration::from_secs(30);
/// Time between two looks while a relabel is awaited: restarts start as soon as the new label
/// is seen, not a whole tick later.
pub const RELABEL_RECHECK: Duration = Duration::from_millis(250);

/// Whether a namespace of the upgrade was asked to move and its new label is not seen yet.
fn awaiting_relabel(status: &RevisionUpgradeStatus) -> bool {
    status.namespaces.iter().any(|n| {
        matches!(
            n.state,
            NamespaceState::Restarting | NamespaceState::RollingBack
        ) && n.relabelled_at.is_none()
    })
}

/// What the reconcile saw besides the object's spec and status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    /// `metadata.generation` of the object.
    pub generation: Option<i64>,
    /// Whether the platform allows free-form PromQL in gates (off by default: it runs with the
    /// operator's view of all metrics).
    pub allow_free_form_promql: bool,
    /// The fleet, when read this tick (`None`: validity only).
    pub fleet: Option<Fleet>,
    /// The latest issuance reading (`None`: none yet, or the metrics source failed).
    pub issuance: Option<IssuanceReading>,
    /// Why there is no issuance reading, when there is none.
    pub issuance_problem: Option<String>,
    /// Gate verdicts of the current wave (`None`: no metrics source configured).
    pub gates: Option<GateReport>,
    /// Restarts granted at the previous tick that did not happen (refused, pod gone).
    pub unused_grants: u32,
    /// Pods (`namespace/name`) whose eviction a PodDisruptionBudget refused at the previous tick.
    pub blocked: Vec<String>,
    /// Pods (`namespace/name`) and workloads ([`workload_key`]) whose restart is scheduled or
    /// was sent and which the fleet reading may still show: never candidates, so no restart is
    /// repeated.
    pub in_progress: BTreeSet<String>,
    /// Where this tick's restarts may be scheduled: after the previous grant's schedule, up to
    /// the horizon (the expected time to the next tick, with room to spare).
    pub pacing: pacing::Window,
    /// An older RevisionUpgrade of the cluster still in progress (not Complete, Aborted or
    /// Invalid), by creation time then name: one budget per cluster, so this one waits.
    pub earlier_upgrade: Option<String>,
}

/// The fleet as read this tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    /// Every namespace.
    pub namespaces: Vec<NamespaceView>,
    /// Every meshed pod of the namespaces in the upgrade, shared with the watch cache that
    /// read them (a tick reads tens of thousands).
    pub pods: Vec<Arc<PodView>>,
    /// Revision tags found in the cluster's injector webhooks: tag → revision.
    pub tags: BTreeMap<String, String>,
    /// The `kubectl.kubernetes.io/restartedAt` template annotation of workloads in the upgrade,
    /// keyed by namespace and workload.
    pub restarted_at: BTreeMap<(String, Workload), String>,
    /// The workload controllers sluice reads (Deployments, StatefulSets, DaemonSets), keyed by
    /// namespace and workload: replicas, own maxUnavailable, PodDisruptionBudget coverage.
    pub workloads: BTreeMap<(String, Workload), WorkloadView>,
}

/// How long after a namespace's new label was first seen a pod created on another revision
/// than the label's is taken as re-injected by that revision (the injector reads namespace
/// labels from a cache that may lag the write by a moment).
pub const REINJECTION_GRACE: Duration = Duration::from_secs(2);

/// At most this many workloads or namespaces are listed in a status report.
pub const REPORT_LIMIT: usize = 64;

/// The gates of the current wave, evaluated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GateReport {
    /// The wave the verdicts judge.
    pub wave: String,
    /// Latest verdict per gate.
    pub verdicts: Vec<GateVerdict>,
    /// What the verdicts ask for together: the most severe of the gates' actions.
    pub action: Option<GateAction>,
    /// The pre-wave baselines the verdicts were judged against (window ending at the wave's
    /// start), kept in `status.capturedBaselines`.
    pub baselines: Vec<CapturedBaseline>,
}

/// Something the reconcile must do after the status is written.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the RevisionUpgrade.
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
    /// Change a namespace's `istio.io/rev` label from `from` to `to` (only if it still is
    /// `from`).
    Relabel {
        /// Namespace.
        namespace: String,
        /// Expected current value.
        from: String,
        /// New value.
        to: String,
    },
    /// Evict a pod through the Eviction API.
    Evict {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// When, after the tick: the issuance budget's schedule.
        after: Duration,
    },
    /// Restart a workload by setting its pod template's `restartedAt` annotation.
    RolloutRestart {
        /// Namespace.
        namespace: String,
        /// The workload.
        workload: Workload,
        /// The annotation value: the namespace's relabel time, so repeating it changes nothing.
        restarted_at: String,
        /// Tokens granted for it: its pods not yet on the target revision.
        pods: u32,
        /// When, after the tick: the issuance budget's schedule.
        after: Duration,
    },
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
    pub status: RevisionUpgradeStatus,
    /// When to reconcile again.
    pub requeue: Requeue,
    /// When restarts were granted: how long after the tick the next grant may start its first
    /// restart (the schedule's last slot plus one peak spacing). Zero otherwise.
    pub busy_for: Duration,
}

/// The Event action name of validation outcomes.
pub const VALIDATE: &str = "Validate";
/// The Event action name of wave transitions.
pub const WAVE: &str = "Wave";
/// The Event action name of relabels.
pub const RELABEL: &str = "Relabel";
/// The Event action name of aborts and rollbacks.
pub const ABORT: &str = "Abort";
/// The Event action name of completion.
pub const COMPLETE: &str = "Complete";
/// The Event action name of resume.
pub const RESUME: &str = "Resume";

/// Event reasons this module adds to the kind's condition reasons.
pub mod event_reasons {
    /// A wave started.
    pub const WAVE_STARTED: &str = "WaveStarted";
    /// A wave passed its soak.
    pub const WAVE_PASSED: &str = "WavePassed";
    /// The upgrade was resumed after an abort.
    pub const RESUMED: &str = "Resumed";
}

fn to_ms(t: &Time) -> i64 {
    t.0.as_millisecond()
}

fn elapsed(since: &Time, now: Timestamp) -> Duration {
    Duration::from_millis((now.as_millisecond() - to_ms(since)).max(0) as u64)
}

/// How long until the object is due for a tick, or `None` when it is due now: a new
/// generation is always due; otherwise one tick after the last (`status.proxies.observedAt`),
/// or [`RELABEL_RECHECK`] after it while a relabel is awaited. Reconciles triggered by the
/// operator's own status writes therefore do nothing.
pub fn not_due_for(
    status: Option<&RevisionUpgradeStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Duration> {
    let status = status?;
    if status.observed_generation != generation {
        return None;
    }
    let last = status.proxies.as_ref()?.observed_at.as_ref()?;
    let since = elapsed(last, now);
    let every = if awaiting_relabel(status) {
        RELABEL_RECHECK
    } else {
        TICK
    };
    (since < every).then(|| every - since)
}

/// The key of a workload's rollout restart in [`Observations::in_progress`]
/// (`namespace/Kind/name`; a pod's is `namespace/name`).
pub fn workload_key(namespace: &str, workload: &Workload) -> String {
    format!("{namespace}/{}/{}", workload.kind, workload.name)
}

/// Decides the next status of a RevisionUpgrade.
pub fn decide(
    spec: &RevisionUpgradeSpec,
    status: Option<&RevisionUpgradeStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut d = decide_validity(
        &validity::problems(spec, obs.allow_free_form_promql),
        status,
        obs,
        now,
    );
    if d.status.phase == RevisionUpgradePhase::Invalid {
        return d;
    }
    if let Some(fleet) = &obs.fleet {
        let mut by_ns: BTreeMap<&str, Vec<&Arc<PodView>>> = BTreeMap::new();
        let mut by_workload: BTreeMap<(&str, &Workload), u32> = BTreeMap::new();
        for p in &fleet.pods {
            by_ns.entry(p.namespace.as_str()).or_default().push(p);
            if let Some(w) = p.workload.as_ref().filter(|_| !p.terminating) {
                *by_workload.entry((p.namespace.as_str(), w)).or_default() += 1;
            }
        }
        Tick {
            spec,
            obs,
            fleet,
            by_ns,
            by_workload,
            now,
            next: &mut d.status,
            actions: &mut d.actions,
            busy_for: &mut d.busy_for,
            held_by_floor: 0,
        }
        .run();
        d.requeue = Requeue::After(match d.status.phase {
            RevisionUpgradePhase::Complete | RevisionUpgradePhase::Aborted => IDLE,
            _ if awaiting_relabel(&d.status) => RELABEL_RECHECK,
            _ => TICK,
        });
    }
    d
}

/// The validity part of [`decide`], given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&RevisionUpgradeStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut next = status.cloned().unwrap_or_default();
    next.observed_generation = obs.generation;
    let validity = cond::set_validity(&mut next.conditions, problems, obs.generation, now);
    if !validity.valid {
        next.phase = RevisionUpgradePhase::Invalid;
    } else if validity.was_invalid && next.phase == RevisionUpgradePhase::Invalid {
        next.phase = RevisionUpgradePhase::Pending;
    }
    let note = validity.message;

    let mut actions = Vec::new();
    if validity.transitioned {
        actions.push(if validity.valid {
            Action::Event {
                severity: Severity::Normal,
                reason: reasons::VALID,
                action: VALIDATE,
                note: "spec accepted".to_owned(),
            }
        } else {
            Action::Event {
                severity: Severity::Warning,
                reason: reasons::INVALID_SPEC,
                action: VALIDATE,
                note,
            }
        });
    }
    Decision {
        actions,
        status: next,
        // An invalid spec is waited on (no requeue loop); a valid one without a fleet reading
        // has nothing timed to do.
        requeue: Requeue::AwaitChange,
        busy_for: Duration::ZERO,
    }
}

/// One tick of a valid upgrade.
struct Tick<'a> {
    spec: &'a RevisionUpgradeSpec,
    obs: &'a Observations,
    fleet: &'a Fleet,
    /// The fleet's pods by namespace, built once per tick: a tick counts every namespace of
    /// the upgrade several times, and a fleet holds tens of thousands of pods.
    by_ns: BTreeMap<&'a str, Vec<&'a Arc<PodView>>>,
    /// Non-terminating pods per workload (namespace, workload), built once per tick.
    by_workload: BTreeMap<(&'a str, &'a Workload), u32>,
    now: Timestamp,
    next: &'a mut RevisionUpgradeStatus,
    actions: &'a mut Vec<Action>,
    busy_for: &'a mut Duration,
    /// Pods this tick did not offer for restart because their workload is at its
    /// availability floor.
    held_by_floor: u32,
}

/// Per-namespace reading of this tick.
#[derive(Debug, Default, Clone, Copy)]
struct NsCount {
    pods: u32,
    done: u32,
    bare_not_done: u32,
    /// Pods not on the target that are not restarted: Job pods, pods whose own label pins
    /// another revision, workloads stopped after a re-injection, and single pods of
    /// controllers that cannot be rollout-restarted.
    held_not_done: u32,
    not_ready: u32,
}

impl Tick<'_> {
    fn generation(&self) -> Option<i64> {
        self.obs.generation
    }

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

    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: String) {
        let c = cond::new(type_, status, reason, message, self.generation(), self.now);
        cond::set(&mut self.next.conditions, c);
    }

    fn ns_view(&self, name: &str) -> Option<&NamespaceView> {
        self.fleet.namespaces.iter().find(|n| n.name == name)
    }

    fn count(&self, ns: &str, target: &str) -> NsCount {
        let mut c = NsCount::default();
        for p in self
            .by_ns
            .get(ns)
            .into_iter()
            .flatten()
            .filter(|p| !p.terminating)
        {
            c.pods += 1;
            if p.revision == target {
                c.done += 1;
                if !p.ready {
                    c.not_ready += 1;
                }
            } else if p.workload.is_none() {
                c.bare_not_done += 1;
            } else if self.held(p, target) {
                c.held_not_done += 1;
            }
        }
        c
    }

    /// The tag that selects `target` (the to tag forward, the from tag in a rollback).
    fn tag_of(&self, target: &str) -> &str {
        if target == self.spec.to_revision {
            &self.spec.to_tag
        } else {
            &self.spec.from_tag
        }
    }

    /// Whether a pod's own `istio.io/rev` label pins a revision other than `target`.
    fn overrides(&self, p: &PodView, target: &str) -> bool {
        p.rev_label
            .as_deref()
            .is_some_and(|l| l != target && l != self.tag_of(target))
    }

    /// Whether a pod of a controller is left on its revision rather than restarted (see
    /// [`NsCount::held_not_done`]).
    fn held(&self, p: &PodView, target: &str) -> bool {
        let Some(w) = &p.workload else {
            return false;
        };
        if w.kind == "Job" || self.overrides(p, target) {
            return true;
        }
        if self
            .next
            .reinjected_by_old_revision
            .iter()
            .any(|r| r.namespace == p.namespace && r.kind == w.kind && r.name == w.name)
        {
            return true;
        }
        // Only a controller a rollout restart cannot restart is ever held by its floor.
        self.spec.restart == RestartMode::Evict
            && !availability_floor::ROLLOUT_RESTARTABLE.contains(&w.kind.as_str())
            && self.plan_of(&p.namespace, w, &[], |_| false) == Plan::Hold
    }

    /// The workload's view, when sluice reads its controller.
    fn workload_view(&self, namespace: &str, w: &Workload) -> Option<&WorkloadView> {
        self.fleet.workloads.get(&(namespace.to_owned(), w.clone()))
    }

    /// The availability-floor plan of a workload; `pods` are its pods (only needed for an
    /// eviction's allowance).
    fn plan_of(
        &self,
        namespace: &str,
        w: &Workload,
        pods: &[&PodView],
        being_evicted: impl Fn(&PodView) -> bool,
    ) -> Plan {
        let view = self.workload_view(namespace, w);
        let observed = self.by_workload.get(&(namespace, w)).copied().unwrap_or(0);
        if pods.is_empty() {
            // Only whether it can be evicted at all is asked.
            let (_, _, no_eviction) =
                availability_floor::shape(&self.spec.disruption, view, observed);
            if view.is_some_and(|v| v.pdb) || !no_eviction {
                return Plan::Budget;
            }
        }
        availability_floor::plan(
            &self.spec.disruption,
            &w.kind,
            view,
            pods,
            being_evicted,
            self.now.as_millisecond(),
        )
    }

    /// Whether a namespace holds a workload restarted by rollout restart (which surges above
    /// its replicas while it runs).
    fn surging(&self, namespace: &str) -> bool {
        if self.spec.restart == RestartMode::RolloutRestart {
            return true;
        }
        self.by_workload
            .iter()
            .filter(|((ns, _), _)| *ns == namespace)
            .any(|((ns, w), n)| {
                availability_floor::surges(
                    &self.spec.disruption,
                    &w.kind,
                    self.workload_view(ns, w),
                    *n,
                )
            })
    }

    fn run(mut self) {
        let counts = fleet::proxy_counts(self.spec, &self.fleet.pods);
        self.next.proxies = Some(ProxyCounts {
            observed_at: Some(Time(self.now)),
            ..counts
        });
        self.report_injection_label();
        if self.next.completed_at.is_some() {
            self.next.phase = RevisionUpgradePhase::Complete;
            return;
        }
        self.report_overrides();
        self.controls();
        self.watch_relabels();
        let rolling_back = self
            .next
            .namespaces
            .iter()
            .any(|n| n.state == NamespaceState::RollingBack);
        if rolling_back || self.next.aborted_at.is_some() {
            self.roll_back();
        } else {
            self.forward();
        }
        self.set_phase();
        self.retirable();
    }

    fn report_injection_label(&mut self) {
        let legacy = fleet::injection_enabled(&self.fleet.namespaces);
        if legacy.is_empty() {
            self.condition(
                conditions::INJECTION_LABEL_FOUND,
                Status::False,
                reasons::LEGACY_INJECTION_LABEL,
                "no namespace uses istio-injection=enabled".into(),
            );
        } else {
            let msg = format!(
                "{} namespace(s) use istio-injection=enabled, which ignores istio.io/rev, so relabelling cannot move them: {}; replace that label with istio.io/rev={} to include them",
                legacy.len(),
                legacy.join(", "),
                self.spec.from_tag
            );
            if self.next.injection_enabled_namespaces != legacy {
                self.event(
                    Severity::Warning,
                    reasons::LEGACY_INJECTION_LABEL,
                    RELABEL,
                    msg.clone(),
                );
            }
            self.condition(
                conditions::INJECTION_LABEL_FOUND,
                Status::True,
                reasons::LEGACY_INJECTION_LABEL,
                msg,
            );
        }
        self.next.injection_enabled_namespaces = legacy;
    }

    /// Abort and resume.
    fn controls(&mut self) {
        let rolling_back = self
            .next
            .namespaces
            .iter()
            .any(|n| n.state == NamespaceState::RollingBack);
        // A resume is acted on once the rollback has finished (it is not acknowledged before).
        if self.spec.resume > self.next.resumes_handled && !self.spec.abort && !rolling_back {
            self.next.resumes_handled = self.spec.resume;
            if self.next.aborted_at.is_some() {
                self.resume();
            }
        }
        let active = self.next.aborted_at.is_none()
            && self.next.current_wave_index.is_some()
            && self.next.completed_at.is_none();
        if self.spec.abort && active {
            self.start_rollback(
                reasons::ABORTED_MANUALLY,
                "aborted by spec.abort".to_owned(),
                UpgradeWaveState::RolledBack,
            );
        }
    }

    fn resume(&mut self) {
        // Namespaces that were rolled back become candidates again; the failed wave restarts.
        self.next
            .namespaces
            .retain(|n| !matches!(n.state, NamespaceState::RolledBack));
        let mut restarted = None;
        for w in &mut self.next.waves {
            if matches!(
                w.state,
                UpgradeWaveState::Failed | UpgradeWaveState::RolledBack
            ) {
                restarted.get_or_insert(w.name.clone());
                *w = UpgradeWaveStatus {
                    name: w.name.clone(),
                    ..UpgradeWaveStatus::default()
                };
            }
        }
        self.next.aborted_at = None;
        let note = format!(
            "resumed by spec.resume={}; wave {} starts again",
            self.spec.resume,
            restarted.as_deref().unwrap_or("(none)")
        );
        self.event(Severity::Normal, event_reasons::RESUMED, RESUME, note);
    }

    /// Retags the namespaces of waves that have not passed back to the old tag.
    fn start_rollback(&mut self, reason: &'static str, why: String, wave_state: UpgradeWaveState) {
        let passed: BTreeSet<String> = self
            .next
            .waves
            .iter()
            .filter(|w| w.state == UpgradeWaveState::Passed)
            .map(|w| w.name.clone())
            .collect();
        let mut back = Vec::new();
        for n in &mut self.next.namespaces {
            if passed.contains(&n.wave) {
                continue;
            }
            match n.state {
                NamespaceState::Pending => n.state = NamespaceState::RolledBack,
                NamespaceState::Restarting | NamespaceState::Moved => {
                    n.state = NamespaceState::RollingBack;
                    n.relabelled_at = None;
                    n.done_at = None;
                    n.pods = 0;
                    back.push(n.name.clone());
                }
                NamespaceState::RollingBack | NamespaceState::RolledBack => {}
            }
        }
        for w in &mut self.next.waves {
            if !matches!(
                w.state,
                UpgradeWaveState::Passed | UpgradeWaveState::Pending
            ) {
                w.state = wave_state;
                w.finished_at = Some(Time(self.now));
            }
        }
        self.next.aborted_at = Some(Time(self.now));
        let msg = format!(
            "{why}; retagging {} namespace(s) back to {} and restarting them within the issuance budget; waves that passed stay on {}",
            back.len(),
            self.spec.from_tag,
            self.spec.to_revision
        );
        self.condition(conditions::PROGRESSING, Status::True, reason, msg.clone());
        self.event(Severity::Warning, reason, ABORT, msg);
    }

    /// Detects namespaces relabelled by someone else after sluice moved them (and clears the
    /// report once the label is back on the new tag).
    fn watch_relabels(&mut self) {
        let mut found = Vec::new();
        for n in &self.next.namespaces {
            let moved = matches!(n.state, NamespaceState::Restarting | NamespaceState::Moved)
                && n.relabelled_at.is_some();
            if !moved {
                continue;
            }
            let rev = self
                .ns_view(&n.name)
                .and_then(NamespaceView::rev)
                .unwrap_or("")
                .to_owned();
            if rev != self.spec.to_tag {
                found.push((n.name.clone(), rev));
            }
        }
        let before: BTreeSet<String> = self
            .next
            .relabelled_back
            .iter()
            .map(|r| r.namespace.clone())
            .collect();
        let mut list = Vec::new();
        for (namespace, rev) in found {
            if let Some(old) = self
                .next
                .relabelled_back
                .iter()
                .find(|r| r.namespace == namespace && r.found == rev)
            {
                list.push(old.clone());
                continue;
            }
            if !before.contains(&namespace) {
                self.event(
                    Severity::Warning,
                    reasons::NAMESPACE_RELABELLED_BACK,
                    RELABEL,
                    format!(
                        "namespace {namespace} was relabelled istio.io/rev={rev:?} by someone else after sluice set {}; its pods are not restarted until the label is {} again (with Argo CD, see the README's ignoreDifferences setting)",
                        self.spec.to_tag, self.spec.to_tag
                    ),
                );
            }
            list.push(RelabelDetection {
                namespace,
                found: rev,
                detected_at: Time(self.now),
            });
        }
        if list.is_empty() {
            self.condition(
                conditions::RELABELLED_BACK,
                Status::False,
                reasons::NAMESPACE_RELABELLED_BACK,
                "every moved namespace keeps the new tag".into(),
            );
        } else {
            let names: Vec<&str> = list.iter().map(|r| r.namespace.as_str()).collect();
            self.condition(
                conditions::RELABELLED_BACK,
                Status::True,
                reasons::NAMESPACE_RELABELLED_BACK,
                format!(
                    "namespace(s) relabelled by someone else after sluice moved them: {}; their wave cannot finish until istio.io/rev={} is restored (with Argo CD, ignore that label's differences)",
                    names.join(", "),
                    self.spec.to_tag
                ),
            );
        }
        self.next.relabelled_back = list;
    }

    fn tags_ok(&mut self) -> bool {
        let mut problems = Vec::new();
        for (tag, rev) in [
            (&self.spec.from_tag, &self.spec.from_revision),
            (&self.spec.to_tag, &self.spec.to_revision),
        ] {
            match self.fleet.tags.get(tag) {
                Some(found) if found == rev => {}
                Some(found) => problems.push(format!(
                    "revision tag {tag} points to revision {found}, not {rev}"
                )),
                None => problems.push(format!(
                    "revision tag {tag} has no injector webhook (MutatingWebhookConfiguration istio-revision-tag-{tag})"
                )),
            }
        }
        if problems.is_empty() {
            return true;
        }
        let msg = format!(
            "{}; nothing is moved until the tags point to the spec's revisions (istioctl tag set)",
            problems.join("; ")
        );
        let known = cond::find(&self.next.conditions, conditions::PROGRESSING)
            .is_some_and(|c| c.reason == reasons::TAG_MISMATCH && c.message == msg);
        if !known {
            self.event(Severity::Warning, reasons::TAG_MISMATCH, WAVE, msg.clone());
        }
        self.condition(
            conditions::PROGRESSING,
            Status::False,
            reasons::TAG_MISMATCH,
            msg,
        );
        false
    }

    fn forward(&mut self) {
        if !self.tags_ok() {
            return;
        }
        if let Some(other) = &self.obs.earlier_upgrade {
            // One issuance budget per cluster: two upgrades would each spend all of it, and
            // could move the same namespaces.
            let msg = format!(
                "RevisionUpgrade {other} was created earlier and is still in progress; this one starts no relabel, restart or wave until it is Complete, Aborted or deleted"
            );
            let known = cond::find(&self.next.conditions, conditions::PROGRESSING)
                .is_some_and(|c| c.reason == reasons::WAITING_FOR_UPGRADE && c.message == msg);
            if !known {
                self.event(
                    Severity::Normal,
                    reasons::WAITING_FOR_UPGRADE,
                    WAVE,
                    msg.clone(),
                );
            }
            self.condition(
                conditions::PROGRESSING,
                Status::False,
                reasons::WAITING_FOR_UPGRADE,
                msg,
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        if self.spec.paused {
            self.condition(
                conditions::PROGRESSING,
                Status::False,
                reasons::PAUSED,
                "held by spec.paused: no relabel, restart or wave starts".into(),
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        // A wave that started (its namespaces relabelled or moving) may not leave the spec:
        // nothing would finish or roll back its namespaces. The upgrade holds until it is back
        // or the upgrade is aborted (which retags them).
        let removed: Vec<String> = self
            .next
            .waves
            .iter()
            .filter(|w| w.state != UpgradeWaveState::Pending)
            .filter(|w| !self.spec.waves.iter().any(|s| s.name == w.name))
            .filter(|w| {
                self.next.namespaces.iter().any(|n| {
                    n.wave == w.name
                        && matches!(n.state, NamespaceState::Restarting | NamespaceState::Moved)
                })
            })
            .map(|w| w.name.clone())
            .collect();
        if !removed.is_empty() {
            let msg = format!(
                "wave(s) {} started but were removed from spec.waves: their namespaces would be left half-moved; put them back, or set spec.abort to retag them",
                removed.join(", ")
            );
            let known = cond::find(&self.next.conditions, conditions::PROGRESSING)
                .is_some_and(|c| c.reason == reasons::STARTED_WAVE_REMOVED && c.message == msg);
            if !known {
                self.event(
                    Severity::Warning,
                    reasons::STARTED_WAVE_REMOVED,
                    WAVE,
                    msg.clone(),
                );
            }
            self.condition(
                conditions::PROGRESSING,
                Status::False,
                reasons::STARTED_WAVE_REMOVED,
                msg,
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        if self.next.waves.len() != self.spec.waves.len()
            || self
                .next
                .waves
                .iter()
                .zip(&self.spec.waves)
                .any(|(s, w)| s.name != w.name)
        {
            // Keep the readings of waves that still exist, in spec order.
            let old = std::mem::take(&mut self.next.waves);
            self.next.waves =
                self.spec
                    .waves
                    .iter()
                    .map(|w| {
                        old.iter().find(|s| s.name == w.name).cloned().unwrap_or(
                            UpgradeWaveStatus {
                                name: w.name.clone(),
                                ..UpgradeWaveStatus::default()
                            },
                        )
                    })
                    .collect();
        }
        // The current wave: the first that has not passed.
        let Some(index) = self
            .next
            .waves
            .iter()
            .position(|w| w.state != UpgradeWaveState::Passed)
        else {
            self.next.current_wave = None;
            self.next.current_wave_index = None;
            self.update_counts(&self.spec.to_revision.clone());
            return;
        };
        self.next.current_wave = Some(self.next.waves[index].name.clone());
        self.next.current_wave_index = Some(index as u32);
        if self.next.waves[index].state == UpgradeWaveState::Pending {
            self.start_wave(index);
        }
        let target = self.spec.to_revision.clone();
        self.relabel(
            index,
            &self.spec.from_tag.clone(),
            &self.spec.to_tag.clone(),
        );
        self.update_counts(&target);
        let wave_name = self.next.waves[index].name.clone();
        // Gates judge the wave from its start; a Fail aborts at any point.
        if let Some(report) = self.obs.gates.as_ref().filter(|g| g.wave == wave_name) {
            self.next.waves[index].gates = report.verdicts.clone();
            self.next.captured_baselines = report.baselines.clone();
            if report.action == Some(GateAction::Abort) {
                let failed: Vec<String> = report
                    .verdicts
                    .iter()
                    .filter(|v| v.verdict != sluice_api::v1alpha1::Verdict::Pass)
                    .map(|v| {
                        format!(
                            "{} {:?} ({})",
                            v.gate,
                            v.verdict,
                            v.message.as_deref().unwrap_or(v.reason.as_str())
                        )
                    })
                    .collect();
                self.start_rollback(
                    reasons::GATE_FAILED,
                    format!("wave {wave_name}: gate(s) failed: {}", failed.join("; ")),
                    UpgradeWaveState::Failed,
                );
                self.roll_back();
                return;
            }
        }
        match self.next.waves[index].state {
            UpgradeWaveState::Restarting => self.restart_wave(index),
            UpgradeWaveState::Soaking => self.soak(index),
            _ => {}
        }
    }

    fn start_wave(&mut self, index: usize) {
        let taken: BTreeSet<String> = self
            .next
            .namespaces
            .iter()
            .map(|n| n.name.clone())
            .collect();
        let members = match fleet::wave_members(self.spec, index, &self.fleet.namespaces, &taken) {
            Ok(m) => m,
            Err(e) => {
                self.condition(
                    conditions::PROGRESSING,
                    Status::False,
                    reasons::INVALID_SPEC,
                    e.to_string(),
                );
                return;
            }
        };
        let wave = &mut self.next.waves[index];
        wave.state = UpgradeWaveState::Restarting;
        wave.started_at = Some(Time(self.now));
        wave.namespaces = members.len() as u32;
        let name = wave.name.clone();
        for m in &members {
            self.next.namespaces.push(NamespaceProgress {
                name: m.clone(),
                wave: name.clone(),
                ..NamespaceProgress::default()
            });
        }
        let proxies: u32 = members.iter().map(|m| self.count(m, "").pods).sum();
        self.event(
            Severity::Normal,
            event_reasons::WAVE_STARTED,
            WAVE,
            format!(
                "wave {name} started: {} namespace(s), {proxies} proxies, moving from tag {} ({}) to {} ({})",
                members.len(),
                self.spec.from_tag,
                self.spec.from_revision,
                self.spec.to_tag,
                self.spec.to_revision
            ),
        );
    }

    /// Relabels the namespaces of wave `index` (or every rolling-back namespace when `index` is
    /// `usize::MAX`) from `from` to `to`, and records when the new label was first seen.
    fn relabel(&mut self, index: usize, from: &str, to: &str) {
        let wave = self.next.waves.get(index).map(|w| w.name.clone());
        // When the relabel was asked for (the wave's start, or the abort, which asks at once):
        // it is asked again only a tick later, while the quicker rechecks wait for the watch to
        // show it.
        let asked = match &wave {
            Some(_) => self.next.waves[index].started_at.clone(),
            None => self.next.aborted_at.clone(),
        };
        let asked = asked.as_ref();
        let mut actions = Vec::new();
        for i in 0..self.next.namespaces.len() {
            let n = &self.next.namespaces[i];
            let ours = match &wave {
                Some(w) => &n.wave == w,
                None => n.state == NamespaceState::RollingBack,
            };
            if !ours {
                continue;
            }
            let rev = self
                .fleet
                .namespaces
                .iter()
                .find(|v| v.name == n.name)
                .and_then(NamespaceView::rev)
                .map(str::to_owned);
            let n = &mut self.next.namespaces[i];
            match n.state {
                NamespaceState::Pending => {
                    n.state = NamespaceState::Restarting;
                    actions.push(Action::Relabel {
                        namespace: n.name.clone(),
                        from: from.into(),
                        to: to.into(),
                    });
                }
                NamespaceState::Restarting | NamespaceState::RollingBack
                    if n.relabelled_at.is_none() =>
                {
                    if rev.as_deref() == Some(to) {
                        n.relabelled_at = Some(Time(self.now));
                    } else if rev.as_deref() == Some(from)
                        && asked.is_none_or(|t| t.0 == self.now || elapsed(t, self.now) >= TICK)
                    {
                        // The previous relabel did not land (or not yet): ask again.
                        actions.push(Action::Relabel {
                            namespace: n.name.clone(),
                            from: from.into(),
                            to: to.into(),
                        });
                    }
                }
                _ => {}
            }
        }
        self.actions.extend(actions);
    }

    /// Stops (and reports) every workload of a moving namespace carrying its target label
    /// whose pod created after the new label was seen runs another revision than the target:
    /// its pods would come back on that revision however often they were evicted.
    fn detect_reinjection(&mut self, state: NamespaceState, target: &str, label: &str) {
        let grace = REINJECTION_GRACE.as_millis() as i64;
        let mut found: Vec<WorkloadReport> = Vec::new();
        for n in self.next.namespaces.iter().filter(|n| n.state == state) {
            let Some(seen) = n.relabelled_at.as_ref() else {
                continue;
            };
            if self.ns_view(&n.name).and_then(NamespaceView::rev) != Some(label) {
                continue;
            }
            for p in self.by_ns.get(n.name.as_str()).into_iter().flatten() {
                let Some(w) = &p.workload else { continue };
                let late = p.created_ms.is_some_and(|c| c > to_ms(seen) + grace);
                if !late || p.terminating || p.revision == target || w.kind == "Job" {
                    continue;
                }
                if self.overrides(p, target) {
                    continue; // its own label says so: reported as an override
                }
                let known = |r: &WorkloadReport| {
                    r.namespace == p.namespace && r.kind == w.kind && r.name == w.name
                };
                if self.next.reinjected_by_old_revision.iter().any(known) || found.iter().any(known)
                {
                    continue;
                }
                found.push(WorkloadReport {
                    namespace: p.namespace.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                    pod: p.name.clone(),
                    found: p.revision.clone(),
                    detected_at: Time(self.now),
                });
            }
        }
        for r in found {
            if self.next.reinjected_by_old_revision.len() >= REPORT_LIMIT {
                break;
            }
            self.event(
                Severity::Warning,
                reasons::REINJECTED_BY_OLD_REVISION,
                RELABEL,
                format!(
                    "{} {}/{}: pod {} was created after namespace {} carried istio.io/rev={label} and was injected by revision {}, not {target}; the workload is not restarted again (check a pod-level istio.io/rev label added at admission, or the {label} tag's injector)",
                    r.kind, r.namespace, r.name, r.pod, r.namespace, r.found
                ),
            );
            self.next.reinjected_by_old_revision.push(r);
        }
        if self.next.reinjected_by_old_revision.is_empty() {
            self.condition(
                conditions::REINJECTED_BY_OLD_REVISION,
                Status::False,
                reasons::NO_REINJECTION,
                "every replacement came back on its namespace's new revision".into(),
            );
        } else {
            let list: Vec<String> = self
                .next
                .reinjected_by_old_revision
                .iter()
                .map(|r| format!("{} {}/{} ({})", r.kind, r.namespace, r.name, r.found))
                .collect();
            self.condition(
                conditions::REINJECTED_BY_OLD_REVISION,
                Status::True,
                reasons::REINJECTED_BY_OLD_REVISION,
                format!(
                    "replacement pods came back on another revision than their namespace's label selects, so these workloads are stopped, not evicted again: {}",
                    list.join(", ")
                ),
            );
        }
    }

    /// Reports the workloads whose pods pin a revision with their own `istio.io/rev` label
    /// (relabelling the namespace cannot move them; they are not restarted), and the
    /// namespaces whose labels Argo CD manages.
    fn report_overrides(&mut self) {
        let ours: BTreeSet<String> = self
            .next
            .namespaces
            .iter()
            .map(|n| n.name.clone())
            .chain(
                self.fleet
                    .namespaces
                    .iter()
                    .filter(|n| n.rev() == Some(self.spec.from_tag.as_str()))
                    .map(|n| n.name.clone()),
            )
            .collect();
        let mut overrides: Vec<WorkloadReport> = Vec::new();
        for ns in &ours {
            for p in self.by_ns.get(ns.as_str()).into_iter().flatten() {
                let (Some(w), Some(label)) = (&p.workload, &p.rev_label) else {
                    continue;
                };
                let target = &self.spec.to_revision;
                if p.terminating || !self.overrides(p, target) {
                    continue;
                }
                if overrides
                    .iter()
                    .any(|r| r.namespace == p.namespace && r.kind == w.kind && r.name == w.name)
                {
                    continue;
                }
                let detected_at = self
                    .next
                    .pod_revision_overrides
                    .iter()
                    .find(|r| r.namespace == p.namespace && r.kind == w.kind && r.name == w.name)
                    .map_or(Time(self.now), |r| r.detected_at.clone());
                overrides.push(WorkloadReport {
                    namespace: p.namespace.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                    pod: p.name.clone(),
                    found: label.clone(),
                    detected_at,
                });
            }
        }
        overrides.sort_by(|a, b| {
            (&a.namespace, &a.kind, &a.name).cmp(&(&b.namespace, &b.kind, &b.name))
        });
        overrides.truncate(REPORT_LIMIT);
        let new: Vec<String> = overrides
            .iter()
            .filter(|r| {
                !self
                    .next
                    .pod_revision_overrides
                    .iter()
                    .any(|o| o.namespace == r.namespace && o.kind == r.kind && o.name == r.name)
            })
            .map(|r| {
                format!(
                    "{} {}/{} (istio.io/rev={})",
                    r.kind, r.namespace, r.name, r.found
                )
            })
            .collect();
        if !new.is_empty() {
            self.event(
                Severity::Warning,
                reasons::POD_REVISION_OVERRIDE,
                RELABEL,
                format!(
                    "pods pin their revision with their own istio.io/rev label, which wins over the namespace's, so they are not restarted: {}; set their label to {} (or remove it) to move them",
                    new.join(", "),
                    self.spec.to_tag
                ),
            );
        }
        if overrides.is_empty() {
            self.condition(
                conditions::POD_REVISION_OVERRIDE,
                Status::False,
                reasons::NO_POD_OVERRIDE,
                "no pod of the upgrade's namespaces pins another revision".into(),
            );
        } else {
            let list: Vec<String> = overrides
                .iter()
                .map(|r| {
                    format!(
                        "{} {}/{} (istio.io/rev={})",
                        r.kind, r.namespace, r.name, r.found
                    )
                })
                .collect();
            self.condition(
                conditions::POD_REVISION_OVERRIDE,
                Status::True,
                reasons::POD_REVISION_OVERRIDE,
                format!(
                    "pods pin their revision with their own istio.io/rev label and are not restarted: {}; set it to {} (or remove it) to move them",
                    list.join(", "),
                    self.spec.to_tag
                ),
            );
        }
        self.next.pod_revision_overrides = overrides;

        let mut argo: Vec<String> = self
            .fleet
            .namespaces
            .iter()
            .filter(|n| n.argo_cd_managed && ours.contains(&n.name))
            .map(|n| n.name.clone())
            .collect();
        argo.sort();
        argo.truncate(REPORT_LIMIT);
        let setting = format!(
            "a self-healing Application puts Git's istio.io/rev back after sluice moves them; in each Application set ignoreDifferences (group \"\", kind Namespace, managedFieldsManagers [{}], or jsonPointers [/metadata/labels/istio.io~1rev]) with syncOptions RespectIgnoreDifferences=true, then change the label in Git to {} once the upgrade completes",
            crate::FIELD_MANAGER.as_str(),
            self.spec.to_tag
        );
        let new: Vec<&String> = argo
            .iter()
            .filter(|n| !self.next.argo_cd_managed_namespaces.contains(n))
            .collect();
        if !new.is_empty() {
            let note = format!(
                "Argo CD manages namespace(s) {}: {setting}",
                new.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.event(
                Severity::Warning,
                reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS,
                RELABEL,
                note,
            );
        }
        if argo.is_empty() {
            self.condition(
                conditions::ARGO_CD_MANAGED_NAMESPACES,
                Status::False,
                reasons::NO_ARGO_CD_NAMESPACES,
                "no namespace of the upgrade carries Argo CD's tracking".into(),
            );
        } else {
            self.condition(
                conditions::ARGO_CD_MANAGED_NAMESPACES,
                Status::True,
                reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS,
                format!(
                    "Argo CD manages namespace(s) {}: {setting}",
                    argo.join(", ")
                ),
            );
        }
        self.next.argo_cd_managed_namespaces = argo;
    }

    /// Recounts the pods of every namespace in the upgrade against its direction's target.
    fn update_counts(&mut self, forward_target: &str) {
        for i in 0..self.next.namespaces.len() {
            let n = &self.next.namespaces[i];
            let target = match n.state {
                NamespaceState::RollingBack | NamespaceState::RolledBack => {
                    self.spec.from_revision.clone()
                }
                _ => forward_target.to_owned(),
            };
            let name = n.name.clone();
            let c = self.count(&name, &target);
            let surging = self.next.namespaces[i].relabelled_at.is_some() && self.surging(&name);
            let n = &mut self.next.namespaces[i];
            // While its pods are being replaced, a namespace keeps the most pods it was seen
            // with, so an evicted pod whose replacement does not exist yet is still awaited.
            // Rollout restarts surge above the workloads' replicas: there the count stays the
            // one seen before the restarts were asked for (the new label's first sighting).
            n.pods = match n.state {
                NamespaceState::Restarting | NamespaceState::RollingBack if surging => n.pods,
                NamespaceState::Restarting | NamespaceState::RollingBack => n.pods.max(c.pods),
                _ => c.pods,
            };
            n.pods_done = c.done;
            n.bare_pods = c.bare_not_done;
        }
    }

    /// The pods to restart in namespaces that carry their target label, in a stable order
    /// (namespace, name), pods a PodDisruptionBudget refused last tick at the end.
    fn candidates(&self, state: NamespaceState, target: &str, label: &str) -> Vec<&Arc<PodView>> {
        let namespaces: BTreeSet<&str> = self
            .next
            .namespaces
            .iter()
            .filter(|n| n.state == state && n.relabelled_at.is_some())
            .filter(|n| self.ns_view(&n.name).and_then(NamespaceView::rev) == Some(label))
            .map(|n| n.name.as_str())
            .collect();
        // `namespace/name` keys split once, so the pods are matched without formatting each.
        fn split<'k>(keys: impl IntoIterator<Item = &'k String>) -> BTreeSet<(&'k str, &'k str)> {
            keys.into_iter().filter_map(|k| k.split_once('/')).collect()
        }
        let blocked = split(&self.obs.blocked);
        let in_progress = split(&self.obs.in_progress);
        let mut pods: Vec<(bool, &Arc<PodView>)> = namespaces
            .iter()
            .flat_map(|ns| self.by_ns.get(ns).into_iter().flatten())
            .copied()
            .filter(|p| !p.terminating && p.revision != target && p.workload.is_some())
            .filter(|p| !in_progress.contains(&(p.namespace.as_str(), p.name.as_str())))
            .filter(|p| !self.held(p, target))
            .map(|p| {
                (
                    blocked.contains(&(p.namespace.as_str(), p.name.as_str())),
                    p,
                )
            })
            .collect();
        pods.sort_by(|(a_blocked, a), (b_blocked, b)| {
            (a_blocked, &a.namespace, &a.name).cmp(&(b_blocked, &b.namespace, &b.name))
        });
        pods.into_iter().map(|(_, p)| p).collect()
    }

    /// Grants restarts from the issuance budget and turns them into actions.
    fn restart(&mut self, pods: Vec<Arc<PodView>>) -> u32 {
        // One unit of work: a pod to evict, or a workload to restart (costing its pods). An
        // eviction's action is built only once it is granted: a wave offers thousands.
        enum Unit {
            Evict(Arc<PodView>),
            RolloutRestart {
                namespace: String,
                workload: Workload,
                restarted_at: String,
                pods: u32,
            },
        }
        let mut units: Vec<(u32, Unit)> = Vec::new();
        let mut by_workload: BTreeMap<(String, Workload), u32> = BTreeMap::new();
        // Evictions left per workload without a PodDisruptionBudget: its availability floor.
        let mut allowance: BTreeMap<(String, Workload), Option<u32>> = BTreeMap::new();
        let in_progress: BTreeSet<&str> = self.obs.in_progress.iter().map(String::as_str).collect();
        let mut floored = 0u32;
        let mut plan_started: BTreeSet<(&str, &Workload)> = BTreeSet::new();
        for p in &pods {
            let Some(w) = p.workload.as_ref() else {
                continue;
            };
            let restartable = self.spec.restart == RestartMode::RolloutRestart
                && availability_floor::ROLLOUT_RESTARTABLE.contains(&w.kind.as_str());
            if restartable {
                *by_workload
                    .entry((p.namespace.clone(), w.clone()))
                    .or_default() += 1;
                continue;
            }
            let key = (p.namespace.clone(), w.clone());
            if !allowance.contains_key(&key) {
                let mine: Vec<&PodView> = self
                    .by_ns
                    .get(p.namespace.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|q| q.workload.as_ref() == Some(w))
                    .map(|q| q.as_ref())
                    .collect();
                let plan = self.plan_of(&p.namespace, w, &mine, |q| {
                    in_progress.contains(format!("{}/{}", q.namespace, q.name).as_str())
                });
                let left = match plan {
                    Plan::Budget => None,
                    Plan::Evict { allowed, .. } => Some(allowed),
                    Plan::RolloutRestart => {
                        *by_workload.entry(key.clone()).or_default() += 1;
                        plan_started.insert((p.namespace.as_str(), w));
                        Some(0)
                    }
                    Plan::Hold => Some(0),
                };
                allowance.insert(key.clone(), left);
                if plan == Plan::RolloutRestart {
                    continue;
                }
            }
            let left = allowance.get_mut(&key).expect("inserted above");
            match left {
                None => units.push((1, Unit::Evict(p.clone()))),
                Some(0) => match by_workload.get_mut(&(p.namespace.clone(), w.clone())) {
                    // A surging workload costs each of its pods not yet moved.
                    Some(n) if plan_started.contains(&(p.namespace.as_str(), w)) => *n += 1,
                    _ => floored += 1,
                },
                Some(n) => {
                    *n -= 1;
                    units.push((1, Unit::Evict(p.clone())));
                }
            }
        }
        self.held_by_floor = floored;
        for ((namespace, workload), n) in by_workload {
            let marker = self
                .next
                .namespaces
                .iter()
                .find(|x| x.name == namespace)
                .and_then(|x| x.relabelled_at.as_ref())
                // Whole seconds, as the API stores the status time: the marker is the same
                // before and after the status round-trips, so a restart is never repeated.
                .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default();
            let key = (namespace.clone(), workload.clone());
            if self.fleet.restarted_at.get(&key) == Some(&marker) {
                continue; // already restarted for this move; its controller is replacing pods
            }
            if self
                .obs
                .in_progress
                .contains(&workload_key(&namespace, &workload))
            {
                continue; // its restart is scheduled or was just sent
            }
            units.push((
                n,
                Unit::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at: marker,
                    pods: n,
                },
            ));
        }
        let wanted: u32 = units.iter().map(|u| u.0).sum();
        let mut previous = self.next.issuance_budget.clone();
        let due = previous
            .as_ref()
            .and_then(|p| p.updated_at.as_ref())
            .is_none_or(|t| elapsed(t, self.now) >= pacing::TICK);
        if due && let Some(p) = previous.as_mut() {
            pacing::refund(p, &self.spec.issuance_budget, self.obs.unused_grants);
        }
        let costs: Vec<u32> = units.iter().map(|u| u.0).collect();
        let g = pacing::grant(
            &self.spec.issuance_budget,
            previous.as_ref(),
            self.obs.issuance.as_ref(),
            &costs,
            self.obs.pacing,
            self.now,
        );
        for ((_, unit), start) in units.into_iter().zip(&g.starts) {
            let Some(start) = start else { continue };
            let action = match unit {
                Unit::Evict(p) => Action::Evict {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    after: *start,
                },
                Unit::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at,
                    pods,
                } => Action::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at,
                    pods,
                    after: *start,
                },
            };
            self.actions.push(action);
        }
        if g.restarts > 0 {
            *self.busy_for = g.busy_for;
        }
        if wanted > 0 || g.held_by != Some(Hold::NoReading) {
            self.budget_conditions(g.held_by, &g.state);
        }
        self.next.issuance_budget = Some(g.state);
        g.restarts
    }

    fn budget_conditions(&mut self, held: Option<Hold>, state: &IssuanceBudgetStatus) {
        match held {
            Some(Hold::OverBudget) => {
                let b = &self.spec.issuance_budget;
                self.condition(
                    conditions::BUDGET_THROTTLED,
                    Status::True,
                    reasons::OVER_BUDGET,
                    format!(
                        "observed issuance {:.1}/s (background {:.1}/s) is over the budget of {}/s with depth {}; restarts are held until it recovers",
                        state.observed_rate, state.background_rate, b.rate, b.depth
                    ),
                );
            }
            Some(Hold::NoReading) => {
                let why = self
                    .obs
                    .issuance_problem
                    .clone()
                    .unwrap_or_else(|| "no issuance reading yet".into());
                self.condition(
                    conditions::BUDGET_THROTTLED,
                    Status::True,
                    reasons::OVER_BUDGET,
                    format!("{why}; restarts are held: background issuance is unknown, and no data is not zero"),
                );
            }
            Some(Hold::NotDue) => {}
            _ => self.condition(
                conditions::BUDGET_THROTTLED,
                Status::False,
                reasons::WITHIN_BUDGET,
                format!(
                    "background issuance {:.1}/s leaves {:.1} restarts/s",
                    state.background_rate,
                    pacing::headroom(&self.spec.issuance_budget, state.background_rate)
                ),
            ),
        }
    }

    fn restart_wave(&mut self, index: usize) {
        let target = self.spec.to_revision.clone();
        self.detect_reinjection(
            NamespaceState::Restarting,
            &target,
            &self.spec.to_tag.clone(),
        );
        let pods: Vec<Arc<PodView>> = self
            .candidates(
                NamespaceState::Restarting,
                &target,
                &self.spec.to_tag.clone(),
            )
            .into_iter()
            .cloned()
            .collect();
        let remaining = pods.len();
        let started = self.restart(pods);
        // Namespaces whose every restartable pod runs the target are moved; the replacements'
        // readiness is what PodDisruptionBudgets gate while restarting, and what the wave waits
        // for before it passes its soak.
        let wave = self.next.waves[index].name.clone();
        let mut pending = 0;
        for i in 0..self.next.namespaces.len() {
            let n = &self.next.namespaces[i];
            if n.wave != wave || n.state != NamespaceState::Restarting {
                continue;
            }
            let c = self.count(&n.name.clone(), &target);
            let labelled = n.relabelled_at.is_some()
                && self.ns_view(&n.name).and_then(NamespaceView::rev)
                    == Some(self.spec.to_tag.as_str());
            let n = &mut self.next.namespaces[i];
            let expected = n.pods;
            let settled =
                c.done + c.bare_not_done + c.held_not_done == c.pods && c.pods >= expected;
            if labelled && settled {
                n.state = NamespaceState::Moved;
                n.done_at = Some(Time(self.now));
            } else {
                pending += 1;
            }
        }
        let blocked = !self.obs.blocked.is_empty();
        if pending == 0 {
            let w = &mut self.next.waves[index];
            w.state = UpgradeWaveState::Soaking;
            w.soak_started_at = Some(Time(self.now));
            let soak = self
                .spec
                .soak_of(index)
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            let msg =
                format!("wave {wave}: every namespace moved; soaking {soak} with gates evaluated");
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                msg.clone(),
            );
            self.event(Severity::Normal, reasons::SOAKING, WAVE, msg);
        } else if blocked {
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::DISRUPTION_BUDGET_BLOCKED,
                format!(
                    "wave {wave}: a PodDisruptionBudget refused the eviction of {}; retried each tick (check the budget's minAvailable/maxUnavailable and that its pods are Ready)",
                    self.obs.blocked.join(", ")
                ),
            );
        } else if self.held_by_floor > 0 && started == 0 {
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::AT_AVAILABILITY_FLOOR,
                format!(
                    "wave {wave}: {pending} namespace(s) moving; {} pod(s) wait until their workload (no PodDisruptionBudget) has more than replicas - maxUnavailable pods Available (default maxUnavailable {})",
                    self.held_by_floor, self.spec.disruption.default_max_unavailable
                ),
            );
        } else {
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::WAVE_RESTARTING,
                format!(
                    "wave {wave}: {pending} namespace(s) moving, {remaining} pod(s) to restart, {started} restart(s) started this tick, {} waiting for their workload's availability floor",
                    self.held_by_floor
                ),
            );
        }
    }

    fn soak(&mut self, index: usize) {
        let wave = self.next.waves[index].name.clone();
        let soak = self
            .spec
            .soak_of(index)
            .and_then(|s| s.parse().ok())
            .unwrap_or(Duration::from_secs(900));
        let started = self.next.waves[index]
            .soak_started_at
            .clone()
            .unwrap_or(Time(self.now));
        let gates = self.obs.gates.as_ref().filter(|g| g.wave == wave);
        let action = gates.and_then(|g| g.action);
        if action == Some(GateAction::Pause) {
            self.condition(
                conditions::PROGRESSING,
                Status::False,
                reasons::PAUSED,
                format!("wave {wave}: a gate stayed Inconclusive past its policy's limit (Pause); the soak holds until it passes or the upgrade is aborted"),
            );
            return;
        }
        if elapsed(&started, self.now) < soak {
            return;
        }
        let target = self.spec.to_revision.clone();
        let members: Vec<String> = self
            .next
            .namespaces
            .iter()
            .filter(|n| n.wave == wave)
            .map(|n| n.name.clone())
            .collect();
        let unready: u32 = members
            .iter()
            .map(|n| self.count(n, &target).not_ready)
            .sum();
        if unready > 0 {
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                format!("wave {wave}: soak elapsed; waiting for {unready} pod(s) on {target} to become Ready"),
            );
            return;
        }
        let passed = match gates {
            None => false,
            Some(g) => g.verdicts.is_empty() || action == Some(GateAction::Proceed),
        };
        if !passed {
            let why = if self.obs.gates.is_none() {
                "no metrics source is configured (--prometheus-url), so gates cannot pass"
            } else if gates.is_none() {
                "gates are evaluated next"
            } else {
                "waiting for every gate to pass"
            };
            self.condition(
                conditions::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                format!("wave {wave}: soak elapsed; {why}"),
            );
            return;
        }
        let w = &mut self.next.waves[index];
        w.state = UpgradeWaveState::Passed;
        w.finished_at = Some(Time(self.now));
        self.event(
            Severity::Normal,
            event_reasons::WAVE_PASSED,
            WAVE,
            format!("wave {wave} passed its soak with every gate green"),
        );
        // Start the next wave in the same tick, so no tick is lost between waves.
        if index + 1 < self.next.waves.len() {
            self.forward();
        } else {
            self.next.current_wave = None;
            self.next.current_wave_index = None;
        }
    }

    fn roll_back(&mut self) {
        if self.spec.paused {
            self.condition(
                conditions::PROGRESSING,
                Status::False,
                reasons::PAUSED,
                "held by spec.paused: the rollback starts no relabel or restart".into(),
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        let (from_tag, to_tag) = (self.spec.from_tag.clone(), self.spec.to_tag.clone());
        self.relabel(usize::MAX, &to_tag, &from_tag);
        self.update_counts(&self.spec.to_revision.clone());
        let target = self.spec.from_revision.clone();
        self.detect_reinjection(NamespaceState::RollingBack, &target, &from_tag);
        let pods: Vec<Arc<PodView>> = self
            .candidates(NamespaceState::RollingBack, &target, &from_tag)
            .into_iter()
            .cloned()
            .collect();
        self.restart(pods);
        let mut pending = 0;
        for i in 0..self.next.namespaces.len() {
            if self.next.namespaces[i].state != NamespaceState::RollingBack {
                continue;
            }
            let name = self.next.namespaces[i].name.clone();
            let c = self.count(&name, &target);
            let labelled = self.next.namespaces[i].relabelled_at.is_some();
            let n = &mut self.next.namespaces[i];
            let expected = n.pods;
            let settled =
                c.done + c.bare_not_done + c.held_not_done == c.pods && c.pods >= expected;
            if labelled && settled && c.not_ready == 0 {
                n.state = NamespaceState::RolledBack;
                n.done_at = Some(Time(self.now));
            } else {
                pending += 1;
            }
        }
        if pending > 0 {
            return;
        }
        for w in &mut self.next.waves {
            if w.state == UpgradeWaveState::Failed {
                w.state = UpgradeWaveState::RolledBack;
            }
        }
        let p = self.next.proxies.clone().unwrap_or_default();
        let was = cond::find(&self.next.conditions, conditions::PROGRESSING)
            .is_some_and(|c| c.reason == reasons::ROLLED_BACK);
        let msg = format!(
            "rolled back: {} prox(ies) on {}, {} on {}; a mixed fleet is a valid stopping point; set spec.abort=false and increase spec.resume to try again",
            p.old, self.spec.from_revision, p.new, self.spec.to_revision
        );
        self.condition(
            conditions::PROGRESSING,
            Status::False,
            reasons::ROLLED_BACK,
            msg.clone(),
        );
        if !was {
            self.event(Severity::Warning, reasons::ROLLED_BACK, ABORT, msg);
        }
    }

    fn set_phase(&mut self) {
        let n = &self.next;
        let rolling_back = n
            .namespaces
            .iter()
            .any(|x| x.state == NamespaceState::RollingBack);
        let throttled = n.issuance_budget.as_ref().is_some_and(|b| b.throttled);
        let gate_pause = self.obs.gates.as_ref().and_then(|g| g.action) == Some(GateAction::Pause);
        let current = n
            .current_wave_index
            .and_then(|i| n.waves.get(i as usize))
            .map(|w| w.state);
        let tag_problem = cond::find(&n.conditions, conditions::PROGRESSING)
            .is_some_and(|c| c.reason == reasons::TAG_MISMATCH);
        let all_passed =
            !n.waves.is_empty() && n.waves.iter().all(|w| w.state == UpgradeWaveState::Passed);
        self.next.phase = if rolling_back {
            if self.spec.paused {
                RevisionUpgradePhase::Paused
            } else {
                RevisionUpgradePhase::RollingBack
            }
        } else if n.aborted_at.is_some() {
            RevisionUpgradePhase::Aborted
        } else if all_passed {
            RevisionUpgradePhase::Progressing
        } else if n.waves.iter().all(|w| w.state == UpgradeWaveState::Pending) {
            if self.spec.paused {
                RevisionUpgradePhase::Paused
            } else {
                RevisionUpgradePhase::Pending
            }
        } else if tag_problem || self.spec.paused || gate_pause {
            RevisionUpgradePhase::Paused
        } else {
            match current {
                Some(UpgradeWaveState::Soaking) => RevisionUpgradePhase::Soaking,
                Some(UpgradeWaveState::Restarting) if throttled => RevisionUpgradePhase::Paused,
                _ => RevisionUpgradePhase::Progressing,
            }
        };
    }

    fn retirable(&mut self) {
        let p = self.next.proxies.clone().unwrap_or_default();
        let all_passed = !self.next.waves.is_empty()
            && self
                .next
                .waves
                .iter()
                .all(|w| w.state == UpgradeWaveState::Passed);
        // Namespaces whose next pods the old revision would inject: labelled with its revision
        // name, or still on the old tag (created after their wave, or with no pods now).
        let mut referencing: Vec<String> = self
            .fleet
            .namespaces
            .iter()
            .filter(|n| {
                !n.injection_enabled()
                    && (n.rev() == Some(self.spec.from_revision.as_str())
                        || n.rev() == Some(self.spec.from_tag.as_str()))
            })
            .map(|n| format!("{} (istio.io/rev={})", n.name, n.rev().unwrap_or_default()))
            .collect();
        referencing.sort();
        if all_passed && p.old == 0 && referencing.is_empty() && self.next.aborted_at.is_none() {
            self.next.completed_at = Some(Time(self.now));
            self.next.phase = RevisionUpgradePhase::Complete;
            let msg = format!(
                "zero proxies run revision {}; its control plane may be removed (sluice never removes it)",
                self.spec.from_revision
            );
            self.condition(
                conditions::OLD_REVISION_RETIRABLE,
                Status::True,
                reasons::NO_OLD_PROXIES,
                msg.clone(),
            );
            self.condition(
                conditions::PROGRESSING,
                Status::False,
                reasons::NO_OLD_PROXIES,
                format!("complete: {} proxies on {}", p.new, self.spec.to_revision),
            );
            self.event(Severity::Normal, reasons::NO_OLD_PROXIES, COMPLETE, msg);
            return;
        }
        let mut where_ = Vec::new();
        let bare: u32 = self.next.namespaces.iter().map(|n| n.bare_pods).sum();
        if bare > 0 {
            where_.push(format!(
                "{bare} bare pod(s) with no controller (restart them yourself)"
            ));
        }
        if !self.next.injection_enabled_namespaces.is_empty() {
            where_.push("namespaces with istio-injection=enabled".to_owned());
        }
        if !self.next.reinjected_by_old_revision.is_empty() {
            where_.push(format!(
                "{} workload(s) re-injected by the old revision",
                self.next.reinjected_by_old_revision.len()
            ));
        }
        if !self.next.pod_revision_overrides.is_empty() {
            where_.push(format!(
                "{} workload(s) pinning a revision with a pod label",
                self.next.pod_revision_overrides.len()
            ));
        }
        let jobs = self
            .fleet
            .pods
            .iter()
            .filter(|p| {
                !p.terminating
                    && p.revision == self.spec.from_revision
                    && p.workload.as_ref().is_some_and(|w| w.kind == "Job")
            })
            .count();
        if jobs > 0 {
            where_.push(format!(
                "{jobs} Job pod(s), never evicted: their next pods get the new revision"
            ));
        }
        if all_passed {
            where_.push("namespaces no wave selected".to_owned());
        }
        if all_passed && !referencing.is_empty() {
            let n = referencing.len();
            referencing.truncate(REPORT_LIMIT);
            where_.push(format!(
                "{n} namespace(s) whose next pods {} would inject: {}; relabel them istio.io/rev={} before removing it",
                self.spec.from_revision,
                referencing.join(", "),
                self.spec.to_tag
            ));
        }
        let msg = if where_.is_empty() {
            format!(
                "{} prox(ies) still run revision {}",
                p.old, self.spec.from_revision
            )
        } else {
            format!(
                "{} prox(ies) still run revision {} (including {})",
                p.old,
                self.spec.from_revision,
                where_.join(", ")
            )
        };
        self.condition(
            conditions::OLD_REVISION_RETIRABLE,
            Status::False,
            reasons::OLD_PROXIES_REMAIN,
            msg,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_api::v1alpha1::revision_upgrade::conditions;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn obs(generation: i64) -> Observations {
        Observations {
            generation: Some(generation),
            ..Observations::default()
        }
    }

    fn problem() -> Vec<String> {
        vec!["spec.waves[0].selector: example problem".to_owned()]
    }

    struct Row {
        name: &'static str,
        problems: Vec<String>,
        status: Option<RevisionUpgradeStatus>,
        generation: i64,
        now: i64,
        want_phase: RevisionUpgradePhase,
        want_ready: (&'static str, &'static str),
        want_transition: i64,
        want_events: Vec<&'static str>,
    }

    fn run(row: &Row) -> Decision {
        decide_validity(
            &row.problems,
            row.status.as_ref(),
            &obs(row.generation),
            t(row.now),
        )
    }

    #[test]
    fn validity_transitions() {
        let invalid_at_0 = decide_validity(&problem(), None, &obs(1), t(0)).status;
        let valid_at_0 = decide_validity(&[], None, &obs(1), t(0)).status;
        let table = vec![
            Row {
                name: "new valid object",
                problems: vec![],
                status: None,
                generation: 1,
                now: 0,
                want_phase: RevisionUpgradePhase::Pending,
                want_ready: ("True", reasons::VALID),
                want_transition: 0,
                want_events: vec![reasons::VALID],
            },
            Row {
                name: "new invalid object",
                problems: problem(),
                status: None,
                generation: 1,
                now: 0,
                want_phase: RevisionUpgradePhase::Invalid,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 0,
                want_events: vec![reasons::INVALID_SPEC],
            },
            Row {
                name: "identical reconcile of an invalid object",
                problems: problem(),
                status: Some(invalid_at_0.clone()),
                generation: 1,
                now: 60,
                want_phase: RevisionUpgradePhase::Invalid,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 0,
                want_events: vec![],
            },
            Row {
                name: "invalid object fixed",
                problems: vec![],
                status: Some(invalid_at_0),
                generation: 2,
                now: 60,
                want_phase: RevisionUpgradePhase::Pending,
                want_ready: ("True", reasons::VALID),
                want_transition: 60,
                want_events: vec![reasons::VALID],
            },
            Row {
                name: "valid object, new generation, still valid",
                problems: vec![],
                status: Some(valid_at_0.clone()),
                generation: 2,
                now: 60,
                want_phase: RevisionUpgradePhase::Pending,
                want_ready: ("True", reasons::VALID),
                want_transition: 0,
                want_events: vec![],
            },
            Row {
                name: "valid object broken by an edit",
                problems: problem(),
                status: Some(valid_at_0),
                generation: 2,
                now: 60,
                want_phase: RevisionUpgradePhase::Invalid,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 60,
                want_events: vec![reasons::INVALID_SPEC],
            },
        ];
        for row in &table {
            let d = run(row);
            let ready = cond::find(&d.status.conditions, conditions::READY)
                .unwrap_or_else(|| panic!("{}: no Ready condition", row.name));
            assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
            assert_eq!(
                d.status.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert_eq!(
                ready.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                row.want_ready,
                "{}",
                row.name
            );
            assert_eq!(
                ready.last_transition_time.0,
                t(row.want_transition),
                "{}",
                row.name
            );
            let events: Vec<_> = d
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Event { reason, .. } => Some(*reason),
                    _ => None,
                })
                .collect();
            assert_eq!(events, row.want_events, "{}", row.name);
            assert_eq!(
                d.requeue,
                Requeue::AwaitChange,
                "{}: never a hot requeue",
                row.name
            );
            if row.want_ready.0 == "False" {
                assert!(
                    ready.message.contains("spec.waves[0].selector"),
                    "{}: message names the field",
                    row.name
                );
            }
        }
    }

    #[test]
    fn identical_reconcile_produces_an_identical_status() {
        let first = decide_validity(&problem(), None, &obs(3), t(0));
        let second = decide_validity(&problem(), Some(&first.status), &obs(3), t(120));
        assert_eq!(
            first.status, second.status,
            "no status write on an identical reconcile"
        );
        assert!(second.actions.is_empty());
    }
}

#[cfg(test)]
mod upgrade_tests {
    //! The upgrade's transitions, driven against a small model of the cluster: relabels change
    //! namespace labels, an eviction replaces the pod with one injected by the revision its
    //! namespace's tag points to.

    use super::*;
    use std::collections::BTreeSet;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn spec() -> RevisionUpgradeSpec {
        serde_json::from_value(serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28",
            "waves": [
                {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "3s"},
                {"name": "tier-2", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-2"}}, "soak": "3s"},
                {"name": "tier-1", "namespaceSelector": {}, "soak": "3s"},
            ],
            "issuanceBudget": {"rate": 10, "depth": 20, "peakPerSecond": 20},
        }))
        .unwrap()
    }

    /// A small cluster: namespaces with labels, pods, and the injector.
    #[derive(Clone)]
    struct Model {
        namespaces: Vec<NamespaceView>,
        pods: Vec<PodView>,
        evicted: Vec<String>,
        serial: u32,
    }

    fn ns(name: &str, tier: Option<&str>, rev: &str) -> NamespaceView {
        let mut labels = BTreeMap::from([("istio.io/rev".to_owned(), rev.to_owned())]);
        if let Some(t) = tier {
            labels.insert("sluice.dev/risk-tier".into(), t.into());
        }
        NamespaceView {
            name: name.into(),
            labels,
            argo_cd_managed: false,
        }
    }

    fn pod(namespace: &str, name: &str, revision: &str, bare: bool) -> PodView {
        PodView {
            namespace: namespace.into(),
            name: name.into(),
            revision: revision.into(),
            workload: (!bare).then(|| Workload {
                kind: "Deployment".into(),
                name: "app".into(),
            }),
            terminating: false,
            ready: true,
            ready_since_ms: Some(0),
            created_ms: Some(0),
            rev_label: None,
        }
    }

    /// The model's workloads: one Deployment `app` per namespace, covered by a
    /// PodDisruptionBudget (the Eviction API keeps its floor; the model grants every eviction).
    fn covered_apps(namespaces: &[NamespaceView]) -> BTreeMap<(String, Workload), WorkloadView> {
        namespaces
            .iter()
            .map(|n| {
                (
                    (
                        n.name.clone(),
                        Workload {
                            kind: "Deployment".into(),
                            name: "app".into(),
                        },
                    ),
                    WorkloadView {
                        replicas: 30,
                        pdb: true,
                        ..WorkloadView::default()
                    },
                )
            })
            .collect()
    }

    impl Model {
        /// Namespaces `a` (low, 2 pods), `b` (tier-2, 12 pods), `c` (no tier, 30 pods).
        fn new() -> Self {
            let mut pods = Vec::new();
            for (n, count) in [("a", 2), ("b", 12), ("c", 30)] {
                for i in 0..count {
                    pods.push(pod(n, &format!("{n}-{i}"), "1-27", false));
                }
            }
            Self {
                namespaces: vec![
                    ns("a", Some("low"), "stable"),
                    ns("b", Some("tier-2"), "stable"),
                    ns("c", None, "stable"),
                    ns("kube-system", None, ""),
                ],
                pods,
                evicted: Vec::new(),
                serial: 0,
            }
        }

        fn fleet(&self) -> Fleet {
            Fleet {
                namespaces: self.namespaces.clone(),
                pods: self.pods.iter().cloned().map(Arc::new).collect(),
                tags: BTreeMap::from([
                    ("stable".to_owned(), "1-27".to_owned()),
                    ("canary".to_owned(), "1-28".to_owned()),
                ]),
                restarted_at: BTreeMap::new(),
                workloads: covered_apps(&self.namespaces),
            }
        }

        fn label(&mut self, namespace: &str, value: &str) {
            let n = self
                .namespaces
                .iter_mut()
                .find(|n| n.name == namespace)
                .unwrap();
            n.labels.insert("istio.io/rev".into(), value.into());
        }

        fn apply(&mut self, actions: &[Action]) {
            for a in actions {
                match a {
                    Action::Relabel {
                        namespace,
                        from,
                        to,
                    } => {
                        let n = self
                            .namespaces
                            .iter_mut()
                            .find(|n| &n.name == namespace)
                            .unwrap();
                        if n.rev() == Some(from.as_str()) {
                            n.labels.insert("istio.io/rev".into(), to.clone());
                        }
                    }
                    Action::Evict {
                        namespace,
                        pod: name,
                        ..
                    } => {
                        let key = format!("{namespace}/{name}");
                        assert!(!self.evicted.contains(&key), "{key} evicted twice");
                        self.evicted.push(key);
                        let tag = self
                            .namespaces
                            .iter()
                            .find(|n| &n.name == namespace)
                            .and_then(|n| n.rev().map(str::to_owned))
                            .unwrap();
                        let rev = if tag == "canary" { "1-28" } else { "1-27" };
                        self.pods
                            .retain(|p| !(&p.namespace == namespace && &p.name == name));
                        self.serial += 1;
                        self.pods.push(pod(
                            namespace,
                            &format!("{namespace}-n{}", self.serial),
                            rev,
                            false,
                        ));
                    }
                    _ => {}
                }
            }
        }
    }

    fn gates(wave: Option<&str>, action: GateAction) -> Option<GateReport> {
        Some(GateReport {
            wave: wave.unwrap_or_default().to_owned(),
            verdicts: Vec::new(),
            action: Some(action),
            baselines: Vec::new(),
        })
    }

    fn observe(
        model: &Model,
        status: Option<&RevisionUpgradeStatus>,
        action: GateAction,
    ) -> Observations {
        Observations {
            generation: Some(1),
            fleet: Some(model.fleet()),
            issuance: Some(IssuanceReading {
                window_seconds: 10.0,
                issued: 0.0,
                own: 0.0,
            }),
            gates: gates(status.and_then(|s| s.current_wave.as_deref()), action),
            ..Observations::default()
        }
    }

    fn evictions(d: &Decision) -> usize {
        d.actions
            .iter()
            .filter(|a| matches!(a, Action::Evict { .. }))
            .count()
    }

    fn event_reasons(d: &Decision) -> Vec<&'static str> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    /// Runs ticks one second apart until `stop` holds or 200 ticks passed; `lose` names ticks
    /// whose actions are lost (the operator died after writing status) and `again` ticks that
    /// are decided twice (a restarted operator deciding from the status just written).
    fn run(
        model: &mut Model,
        mut status: Option<RevisionUpgradeStatus>,
        start: i64,
        lose: &BTreeSet<i64>,
        again: &BTreeSet<i64>,
        gate: impl Fn(&RevisionUpgradeStatus, i64) -> GateAction,
        stop: impl Fn(&RevisionUpgradeStatus) -> bool,
    ) -> (RevisionUpgradeStatus, i64) {
        let s = spec();
        for tick in start..start + 200 {
            let now = tick * 1000;
            let action = status
                .as_ref()
                .map_or(GateAction::Proceed, |st| gate(st, tick));
            let d = decide(
                &s,
                status.as_ref(),
                &observe(model, status.as_ref(), action),
                t(now),
            );
            if !lose.contains(&tick) {
                model.apply(&d.actions);
            }
            let granted = evictions(&d) > 0;
            status = Some(d.status);
            if again.contains(&tick) {
                let d2 = decide(
                    &s,
                    status.as_ref(),
                    &observe(model, status.as_ref(), action),
                    t(now + 300),
                );
                if granted {
                    assert_eq!(
                        evictions(&d2),
                        0,
                        "tick {tick}: a second decision within a tick of a grant restarts nothing"
                    );
                }
                model.apply(&d2.actions);
                status = Some(d2.status);
            }
            if stop(status.as_ref().unwrap()) {
                return (status.unwrap(), tick);
            }
        }
        panic!("no stop after 200 ticks: {status:#?}");
    }

    fn complete(s: &RevisionUpgradeStatus) -> bool {
        s.phase == RevisionUpgradePhase::Complete
    }

    #[test]
    fn first_tick_starts_the_first_wave_and_relabels_its_namespaces() {
        let model = Model::new();
        let d = decide(
            &spec(),
            None,
            &observe(&model, None, GateAction::Proceed),
            t(0),
        );
        assert_eq!(d.status.phase, RevisionUpgradePhase::Progressing);
        assert_eq!(d.status.current_wave.as_deref(), Some("low-risk"));
        assert_eq!(
            d.actions
                .iter()
                .filter(|a| matches!(a, Action::Relabel { .. }))
                .collect::<Vec<_>>(),
            vec![&Action::Relabel {
                namespace: "a".into(),
                from: "stable".into(),
                to: "canary".into()
            }]
        );
        assert_eq!(evictions(&d), 0, "no restart before the new label is seen");
        assert!(event_reasons(&d).contains(&event_reasons::WAVE_STARTED));
        assert_eq!(d.status.namespaces.len(), 1);
        assert_eq!(d.status.namespaces[0].state, NamespaceState::Restarting);
        assert_eq!(
            d.requeue,
            Requeue::After(RELABEL_RECHECK),
            "the new labels are looked for sooner than a tick"
        );
        let p = d.status.proxies.unwrap();
        assert_eq!((p.old, p.new), (44, 0));
    }

    #[test]
    fn full_upgrade_moves_every_wave_within_the_budget_and_retires_the_old_revision() {
        let mut model = Model::new();
        let mut per_tick: Vec<(i64, usize)> = Vec::new();
        // When each eviction starts, ms: the tick plus its place in the budget's schedule.
        let mut starts: Vec<i64> = Vec::new();
        let s = spec();
        let mut status: Option<RevisionUpgradeStatus> = None;
        let mut tick = 0;
        while !status.as_ref().is_some_and(complete) {
            assert!(tick < 200, "not complete: {status:#?}");
            let d = decide(
                &s,
                status.as_ref(),
                &observe(&model, status.as_ref(), GateAction::Proceed),
                t(tick * 1000),
            );
            per_tick.push((tick, evictions(&d)));
            for a in &d.actions {
                if let Action::Evict { after, .. } = a {
                    starts.push(tick * 1000 + after.as_millis() as i64);
                }
            }
            model.apply(&d.actions);
            status = Some(d.status);
            tick += 1;
        }
        let st = status.unwrap();
        assert_eq!(
            model.evicted.len(),
            44,
            "every old pod evicted exactly once"
        );
        assert!(st.completed_at.is_some());
        let c = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::NO_OLD_PROXIES)
        );
        assert!(st.waves.iter().all(|w| w.state == UpgradeWaveState::Passed));
        assert_eq!(st.proxies.as_ref().map(|p| (p.old, p.new)), Some((0, 44)));
        // Budget: depth 20 (planned at 19), rate 10 (planned at 9.5), peak 20 (spaced at
        // 18/s), checked on every window between two scheduled starts.
        starts.sort();
        for (i, &start) in starts.iter().enumerate() {
            for (k, &end) in starts[i..].iter().enumerate() {
                let (sum, w) = ((k + 1) as f64, (end - start) as f64 / 1000.0);
                assert!(sum <= 20.0 + 10.0 * w, "{sum} restarts in {w}s");
                if w < 1.0 {
                    assert!(sum <= 20.0, "{sum} restarts in {w}s over the peak");
                }
            }
        }
        assert_eq!(
            per_tick[1].1, 2,
            "wave 1 restarts its 2 pods once relabelled"
        );
        assert!(
            per_tick.iter().any(|&(_, n)| n == 12),
            "wave 2 (12 pods) fits the bucket"
        );
        assert!(
            per_tick.iter().all(|&(_, n)| n <= 19 + 19),
            "never more than the bucket and its refill over the 2 s horizon"
        );
        let completes = event_reasons(&decide(
            &s,
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t(tick * 1000 + 5000),
        ));
        assert!(
            !completes.contains(&reasons::NO_OLD_PROXIES),
            "completion is announced once"
        );
    }

    #[test]
    fn restart_at_any_tick_never_repeats_an_eviction_and_still_completes() {
        let (_, ticks) = run(
            &mut Model::new(),
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            |_, _| GateAction::Proceed,
            complete,
        );
        for point in 0..=ticks {
            let mut model = Model::new();
            let lose = BTreeSet::from([point]);
            let again = BTreeSet::from([point + 1]);
            let (st, _) = run(
                &mut model,
                None,
                0,
                &lose,
                &again,
                |_, _| GateAction::Proceed,
                complete,
            );
            assert_eq!(
                st.proxies.as_ref().unwrap().old,
                0,
                "restart at tick {point}"
            );
            assert_eq!(
                model.evicted.len(),
                44,
                "restart at tick {point}: each old pod evicted once"
            );
        }
    }

    #[test]
    fn a_gate_failure_in_the_second_wave_retags_it_back_and_keeps_the_first() {
        let mut model = Model::new();
        let fail_in_tier2 = |st: &RevisionUpgradeStatus, _| {
            let restarted = st
                .namespaces
                .iter()
                .any(|n| n.name == "b" && n.pods_done >= 6);
            if st.current_wave.as_deref() == Some("tier-2") && restarted {
                GateAction::Abort
            } else {
                GateAction::Proceed
            }
        };
        let (st, _) = run(
            &mut model,
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            fail_in_tier2,
            |s| s.phase == RevisionUpgradePhase::Aborted,
        );
        let state = |n: &str| st.namespaces.iter().find(|x| x.name == n).map(|x| x.state);
        assert_eq!(
            state("a"),
            Some(NamespaceState::Moved),
            "the passed wave stays moved"
        );
        assert_eq!(state("b"), Some(NamespaceState::RolledBack));
        assert_eq!(state("c"), None, "the third wave never started");
        assert_eq!(model.namespaces[1].rev(), Some("stable"), "b retagged back");
        assert_eq!(st.waves[0].state, UpgradeWaveState::Passed);
        assert_eq!(st.waves[1].state, UpgradeWaveState::RolledBack);
        let p = st.proxies.clone().unwrap();
        assert_eq!(
            (p.old, p.new),
            (42, 2),
            "a mixed fleet: wave 1 on the new revision"
        );
        let c = cond::find(&st.conditions, conditions::PROGRESSING).unwrap();
        assert_eq!(c.reason, reasons::ROLLED_BACK);
        assert!(c.message.contains("mixed fleet"), "{}", c.message);
        assert!(
            model
                .pods
                .iter()
                .filter(|p| p.namespace == "b")
                .all(|p| p.revision == "1-27")
        );

        // Resume is explicit: nothing moves while aborted; spec.resume restarts the failed wave.
        let s = spec();
        let d = decide(
            &s,
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t(400_000),
        );
        assert_eq!(
            d.actions
                .iter()
                .filter(|a| !matches!(a, Action::Event { .. }))
                .count(),
            0
        );
        assert_eq!(d.status.phase, RevisionUpgradePhase::Aborted);
        let mut resumed = s.clone();
        resumed.resume = 1;
        let d = decide(
            &resumed,
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t(401_000),
        );
        assert_eq!(d.status.resumes_handled, 1);
        assert!(event_reasons(&d).contains(&event_reasons::RESUMED));
        assert_eq!(d.status.current_wave.as_deref(), Some("tier-2"));
        assert!(d.actions.contains(&Action::Relabel {
            namespace: "b".into(),
            from: "stable".into(),
            to: "canary".into()
        }));
        let again = decide(
            &resumed,
            Some(&d.status),
            &observe(&model, Some(&d.status), GateAction::Proceed),
            t(402_000),
        );
        assert!(
            !event_reasons(&again).contains(&event_reasons::RESUMED),
            "a resume is acted on once"
        );
    }

    #[test]
    fn a_resume_during_the_rollback_waits_for_it_to_finish() {
        let mut model = Model::new();
        let (st, tick) = run(
            &mut model,
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            |_, _| GateAction::Proceed,
            |s| {
                s.namespaces
                    .iter()
                    .any(|n| n.name == "b" && n.pods_done >= 6)
            },
        );
        let mut s = spec();
        s.abort = true;
        let d = decide(
            &s,
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t((tick + 1) * 1000),
        );
        model.apply(&d.actions);
        assert_eq!(d.status.phase, RevisionUpgradePhase::RollingBack);
        s.abort = false;
        s.resume = 1;
        let d = decide(
            &s,
            Some(&d.status),
            &observe(&model, Some(&d.status), GateAction::Proceed),
            t((tick + 2) * 1000),
        );
        assert_eq!(
            d.status.resumes_handled, 0,
            "not acknowledged while rolling back"
        );
        model.apply(&d.actions);
        let mut status = d.status;
        let mut now = tick + 3;
        while status.resumes_handled == 0 {
            assert!(now < tick + 100, "resume never acted on: {status:#?}");
            let d = decide(
                &s,
                Some(&status),
                &observe(&model, Some(&status), GateAction::Proceed),
                t(now * 1000),
            );
            model.apply(&d.actions);
            status = d.status;
            now += 1;
        }
        assert_eq!(status.current_wave.as_deref(), Some("tier-2"));
        assert!(
            status
                .namespaces
                .iter()
                .any(|n| n.name == "b" && n.state == NamespaceState::Restarting),
            "the failed wave takes its namespace again: {:?}",
            status.namespaces
        );
    }

    #[test]
    fn a_namespace_is_not_moved_before_its_evicted_pods_are_replaced() {
        let mut model = Model::new();
        let s = spec();
        let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
        model.apply(&first.actions);
        let second = decide(
            &s,
            Some(&first.status),
            &observe(&model, Some(&first.status), GateAction::Proceed),
            t(1000),
        );
        assert_eq!(evictions(&second), 2);
        // The evictions happened but the controller has not created the replacements yet.
        model.pods.retain(|p| p.namespace != "a");
        let third = decide(
            &s,
            Some(&second.status),
            &observe(&model, Some(&second.status), GateAction::Proceed),
            t(2000),
        );
        let a = third
            .status
            .namespaces
            .iter()
            .find(|n| n.name == "a")
            .unwrap();
        assert_eq!(
            (a.state, a.pods, a.pods_done),
            (NamespaceState::Restarting, 2, 0)
        );
        model.pods.push(pod("a", "a-x", "1-28", false));
        model.pods.push(pod("a", "a-y", "1-28", false));
        let fourth = decide(
            &s,
            Some(&third.status),
            &observe(&model, Some(&third.status), GateAction::Proceed),
            t(3000),
        );
        let a = fourth
            .status
            .namespaces
            .iter()
            .find(|n| n.name == "a")
            .unwrap();
        assert_eq!(a.state, NamespaceState::Moved);
    }

    #[test]
    fn replacements_not_ready_hold_the_soak_not_the_move() {
        let mut model = Model::new();
        let s = spec();
        let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
        model.apply(&first.actions);
        let second = decide(
            &s,
            Some(&first.status),
            &observe(&model, Some(&first.status), GateAction::Proceed),
            t(1000),
        );
        model.apply(&second.actions);
        for p in model.pods.iter_mut().filter(|p| p.namespace == "a") {
            p.ready = false;
        }
        let mut status = second.status;
        for at in [2000, 6000] {
            let d = decide(
                &s,
                Some(&status),
                &observe(&model, Some(&status), GateAction::Proceed),
                t(at),
            );
            status = d.status;
        }
        let a = status.namespaces.iter().find(|n| n.name == "a").unwrap();
        assert_eq!(a.state, NamespaceState::Moved, "moved once replaced");
        assert_eq!(status.waves[0].state, UpgradeWaveState::Soaking);
        let c = cond::find(&status.conditions, conditions::PROGRESSING).unwrap();
        assert!(
            c.message.contains("2 pod(s) on 1-28 to become Ready"),
            "{}",
            c.message
        );
        for p in model.pods.iter_mut() {
            p.ready = true;
        }
        let d = decide(
            &s,
            Some(&status),
            &observe(&model, Some(&status), GateAction::Proceed),
            t(7000),
        );
        assert_eq!(d.status.waves[0].state, UpgradeWaveState::Passed);
    }

    #[test]
    fn manual_abort_rolls_back_the_current_wave() {
        let mut model = Model::new();
        let (st, tick) = run(
            &mut model,
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            |_, _| GateAction::Proceed,
            |s| {
                s.namespaces
                    .iter()
                    .any(|n| n.name == "b" && n.relabelled_at.is_some())
            },
        );
        let mut s = spec();
        s.abort = true;
        let d = decide(
            &s,
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t((tick + 1) * 1000),
        );
        assert_eq!(d.status.phase, RevisionUpgradePhase::RollingBack);
        assert!(event_reasons(&d).contains(&reasons::ABORTED_MANUALLY));
        assert!(d.actions.contains(&Action::Relabel {
            namespace: "b".into(),
            from: "canary".into(),
            to: "stable".into()
        }));
        assert!(d.status.aborted_at.is_some());
    }

    #[test]
    fn relabel_back_by_someone_else_is_reported_and_not_fought() {
        let mut model = Model::new();
        let (st, tick) = run(
            &mut model,
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            |_, _| GateAction::Proceed,
            |s| s.current_wave.as_deref() == Some("tier-2"),
        );
        model.label("a", "stable");
        let s = spec();
        let d = decide(
            &s,
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t((tick + 1) * 1000),
        );
        assert_eq!(d.status.relabelled_back.len(), 1);
        assert_eq!(d.status.relabelled_back[0].namespace, "a");
        assert_eq!(d.status.relabelled_back[0].found, "stable");
        assert!(cond::is_true(
            &d.status.conditions,
            conditions::RELABELLED_BACK
        ));
        assert!(event_reasons(&d).contains(&reasons::NAMESPACE_RELABELLED_BACK));
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::Relabel { namespace, .. } if namespace == "a")),
            "never fights the other writer"
        );
        let d2 = decide(
            &s,
            Some(&d.status),
            &observe(&model, Some(&d.status), GateAction::Proceed),
            t((tick + 2) * 1000),
        );
        assert!(
            !event_reasons(&d2).contains(&reasons::NAMESPACE_RELABELLED_BACK),
            "reported once"
        );
        assert_eq!(
            d2.status.relabelled_back, d.status.relabelled_back,
            "detection time kept"
        );
        model.label("a", "canary");
        let d3 = decide(
            &s,
            Some(&d2.status),
            &observe(&model, Some(&d2.status), GateAction::Proceed),
            t((tick + 3) * 1000),
        );
        assert!(d3.status.relabelled_back.is_empty());
        assert!(!cond::is_true(
            &d3.status.conditions,
            conditions::RELABELLED_BACK
        ));
    }

    #[test]
    fn legacy_injection_and_bare_pods_are_reported_and_bare_pods_never_evicted() {
        let mut model = Model::new();
        model.namespaces.push(NamespaceView {
            name: "legacy".into(),
            labels: BTreeMap::from([("istio-injection".to_owned(), "enabled".to_owned())]),
            argo_cd_managed: false,
        });
        model.pods.push(pod("a", "debug", "1-27", true));
        let (st, _) = run(
            &mut model,
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            |_, _| GateAction::Proceed,
            |s| s.waves.iter().all(|w| w.state == UpgradeWaveState::Passed),
        );
        assert!(!model.evicted.contains(&"a/debug".to_owned()));
        assert_eq!(st.injection_enabled_namespaces, vec!["legacy"]);
        assert!(cond::is_true(
            &st.conditions,
            conditions::INJECTION_LABEL_FOUND
        ));
        assert_eq!(
            st.namespaces
                .iter()
                .find(|n| n.name == "a")
                .unwrap()
                .bare_pods,
            1
        );
        assert_ne!(
            st.phase,
            RevisionUpgradePhase::Complete,
            "a bare pod still runs the old revision"
        );
        let c = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
        assert_eq!(c.status, "False");
        assert!(c.message.contains("bare pod"), "{}", c.message);
    }

    #[test]
    fn holds_nothing_moves_without_tags_reading_or_while_paused() {
        let model = Model::new();
        let s = spec();
        // Tag mismatch.
        let mut o = observe(&model, None, GateAction::Proceed);
        o.fleet
            .as_mut()
            .unwrap()
            .tags
            .insert("canary".into(), "1-26".into());
        let d = decide(&s, None, &o, t(0));
        assert!(d.actions.iter().all(|a| matches!(a, Action::Event { .. })));
        assert!(event_reasons(&d).contains(&reasons::TAG_MISMATCH));
        assert_eq!(d.status.phase, RevisionUpgradePhase::Pending);
        // Paused.
        let mut paused = s.clone();
        paused.paused = true;
        let d = decide(
            &paused,
            None,
            &observe(&model, None, GateAction::Proceed),
            t(0),
        );
        assert!(d.actions.iter().all(|a| matches!(a, Action::Event { .. })));
        assert_eq!(d.status.phase, RevisionUpgradePhase::Paused);
        // No issuance reading: relabels happen, restarts do not.
        let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
        let mut m2 = model.clone();
        m2.apply(&first.actions);
        let mut o = observe(&m2, Some(&first.status), GateAction::Proceed);
        o.issuance = None;
        o.issuance_problem = Some("no series".into());
        let d = decide(&s, Some(&first.status), &o, t(1000));
        assert_eq!(evictions(&d), 0);
        let c = cond::find(&d.status.conditions, conditions::BUDGET_THROTTLED).unwrap();
        assert!(c.message.contains("no series"), "{}", c.message);
        // Over budget: background at the full rate holds restarts and says so.
        let mut o = observe(&m2, Some(&first.status), GateAction::Proceed);
        o.issuance = Some(IssuanceReading {
            window_seconds: 10.0,
            issued: 150.0,
            own: 0.0,
        });
        let d = decide(&s, Some(&first.status), &o, t(1000));
        assert_eq!(evictions(&d), 0);
        assert!(cond::is_true(
            &d.status.conditions,
            conditions::BUDGET_THROTTLED
        ));
        assert_eq!(d.status.phase, RevisionUpgradePhase::Paused);
        assert!(d.status.issuance_budget.as_ref().unwrap().throttled);
    }

    #[test]
    fn a_refused_eviction_is_retried_last_and_reported() {
        let mut model = Model::new();
        let s = spec();
        let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
        model.apply(&first.actions);
        let mut o = observe(&model, Some(&first.status), GateAction::Proceed);
        o.blocked = vec!["a/a-0".into()];
        o.unused_grants = 1;
        let d = decide(&s, Some(&first.status), &o, t(1000));
        let order: Vec<&str> = d
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict { pod, .. } => Some(pod.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(order, vec!["a-1", "a-0"], "the refused pod goes last");
        let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
        assert_eq!(c.reason, reasons::DISRUPTION_BUDGET_BLOCKED);
        assert!(c.message.contains("a/a-0"), "{}", c.message);
    }

    #[test]
    fn restarts_scheduled_or_sent_are_never_candidates_again() {
        let mut model = Model::new();
        let s = spec();
        let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
        model.apply(&first.actions);
        let o = observe(&model, Some(&first.status), GateAction::Proceed);
        let d = decide(&s, Some(&first.status), &o, t(1000));
        let scheduled: Vec<(&str, Duration)> = d
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict { pod, after, .. } => Some((pod.as_str(), *after)),
                _ => None,
            })
            .collect();
        // Peak 20 planned at 19/s, less one: consecutive starts 1/18 s apart.
        let spacing = Duration::from_secs_f64(1.0 / 18.0);
        assert_eq!(scheduled, vec![("a-0", Duration::ZERO), ("a-1", spacing)]);
        assert!(
            (d.busy_for.as_secs_f64() - 2.0 / 18.0).abs() < 1e-6,
            "the next grant starts one spacing after the last slot: {:?}",
            d.busy_for
        );

        let mut o = observe(&model, Some(&first.status), GateAction::Proceed);
        o.in_progress = BTreeSet::from(["a/a-0".to_owned()]);
        let d = decide(&s, Some(&first.status), &o, t(1000));
        let pods: Vec<&str> = d
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict { pod, .. } => Some(pod.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(pods, vec!["a-1"], "a-0's eviction is already on its way");
    }

    #[test]
    fn not_due_within_a_tick_of_the_last_unless_the_generation_changed() {
        let st = RevisionUpgradeStatus {
            observed_generation: Some(1),
            proxies: Some(ProxyCounts {
                observed_at: Some(Time(t(0))),
                ..ProxyCounts::default()
            }),
            issuance_budget: Some(IssuanceBudgetStatus::default()),
            ..RevisionUpgradeStatus::default()
        };
        assert_eq!(
            not_due_for(Some(&st), Some(1), t(400)),
            Some(Duration::from_millis(600))
        );
        assert_eq!(not_due_for(Some(&st), Some(1), t(1000)), None);
        assert_eq!(not_due_for(Some(&st), Some(2), t(400)), None);
        assert_eq!(not_due_for(None, Some(1), t(400)), None);
        // While a relabel is awaited, the next look comes a quarter of a tick after the last.
        let mut awaiting = st.clone();
        awaiting.namespaces.push(NamespaceProgress {
            name: "a".into(),
            wave: "low-risk".into(),
            state: NamespaceState::Restarting,
            ..NamespaceProgress::default()
        });
        assert_eq!(
            not_due_for(Some(&awaiting), Some(1), t(100)),
            Some(Duration::from_millis(150))
        );
        assert_eq!(not_due_for(Some(&awaiting), Some(1), t(250)), None);
        awaiting.namespaces[0].relabelled_at = Some(Time(t(0)));
        assert_eq!(
            not_due_for(Some(&awaiting), Some(1), t(250)),
            Some(Duration::from_millis(750)),
            "the label was seen: back to one tick"
        );
    }

    /// A namespace `a` (first wave) with workloads without a PodDisruptionBudget, whose
    /// replacements become Ready two ticks after they are created, as a kubelet would.
    struct FloorModel {
        namespaces: Vec<NamespaceView>,
        pods: Vec<PodView>,
        workloads: BTreeMap<(String, Workload), WorkloadView>,
        restarted_at: BTreeMap<(String, Workload), String>,
        /// Pods created after the relabel on the old revision (a re-injection).
        reinject: Option<&'static str>,
        evicted: Vec<String>,
        rollout_restarts: Vec<String>,
        serial: u32,
    }

    fn workload(kind: &str, name: &str) -> Workload {
        Workload {
            kind: kind.into(),
            name: name.into(),
        }
    }

    impl FloorModel {
        /// `web` (4 replicas, no maxUnavailable of its own), `solo` (1 replica), `batch` (a
        /// Job pod), `pinned` (2 replicas whose pods carry `istio.io/rev: stable`).
        fn new() -> Self {
            let mut pods = Vec::new();
            let mut add = |w: &str, kind: &str, n: usize, label: Option<&str>| {
                for i in 0..n {
                    let mut p = pod("a", &format!("{w}-{i}"), "1-27", false);
                    p.workload = Some(workload(kind, w));
                    p.rev_label = label.map(str::to_owned);
                    pods.push(p);
                }
            };
            add("web", "Deployment", 4, None);
            add("solo", "Deployment", 1, None);
            add("batch", "Job", 1, None);
            add("pinned", "Deployment", 2, Some("stable"));
            let view = |replicas| WorkloadView {
                replicas,
                ..WorkloadView::default()
            };
            Self {
                namespaces: vec![ns("a", Some("low"), "stable")],
                pods,
                workloads: BTreeMap::from([
                    (("a".into(), workload("Deployment", "web")), view(4)),
                    (("a".into(), workload("Deployment", "solo")), view(1)),
                    (("a".into(), workload("Deployment", "pinned")), view(2)),
                ]),
                restarted_at: BTreeMap::new(),
                reinject: None,
                evicted: Vec::new(),
                rollout_restarts: Vec::new(),
                serial: 0,
            }
        }

        fn fleet(&self) -> Fleet {
            Fleet {
                namespaces: self.namespaces.clone(),
                pods: self.pods.iter().cloned().map(Arc::new).collect(),
                tags: BTreeMap::from([
                    ("stable".to_owned(), "1-27".to_owned()),
                    ("canary".to_owned(), "1-28".to_owned()),
                ]),
                restarted_at: self.restarted_at.clone(),
                workloads: self.workloads.clone(),
            }
        }

        fn replacement(&mut self, w: &Workload, now: i64) -> PodView {
            self.serial += 1;
            let label = self.namespaces[0].rev().unwrap_or("").to_owned();
            let mut rev = if label == "canary" { "1-28" } else { "1-27" };
            if self.reinject == Some(w.name.as_str()) {
                rev = "1-27";
            }
            let mut p = pod("a", &format!("{}-n{}", w.name, self.serial), rev, false);
            p.workload = Some(w.clone());
            p.ready = false;
            p.ready_since_ms = None;
            p.created_ms = Some(t(now).as_millisecond());
            p
        }

        /// One tick of the cluster: replacements older than two seconds become Ready, then
        /// the actions are carried out.
        fn apply(&mut self, actions: &[Action], now: i64) {
            for p in &mut self.pods {
                if !p.ready
                    && p.created_ms
                        .is_some_and(|c| t(now).as_millisecond() - c >= 2000)
                {
                    p.ready = true;
                    p.ready_since_ms = Some(t(now).as_millisecond());
                }
            }
            for a in actions {
                match a {
                    Action::Relabel { namespace, to, .. } => {
                        let n = self.namespaces.iter_mut().find(|n| &n.name == namespace);
                        n.unwrap().labels.insert("istio.io/rev".into(), to.clone());
                    }
                    Action::Evict { pod: name, .. } => {
                        let key = format!("a/{name}");
                        assert!(!self.evicted.contains(&key), "{key} evicted twice");
                        self.evicted.push(key);
                        let gone = self.pods.iter().position(|p| &p.name == name).unwrap();
                        let w = self.pods.remove(gone).workload.unwrap();
                        let r = self.replacement(&w, now);
                        self.pods.push(r);
                    }
                    Action::RolloutRestart {
                        workload: w,
                        restarted_at,
                        ..
                    } => {
                        self.rollout_restarts.push(w.name.clone());
                        self.restarted_at
                            .insert(("a".into(), w.clone()), restarted_at.clone());
                        // The controller surges: the new pod first, the old one once it is Ready
                        // (modelled as at once with the new one Ready: the floor is kept).
                        let mut r = self.replacement(w, now);
                        r.ready = true;
                        r.ready_since_ms = Some(now);
                        self.pods.retain(|p| p.workload.as_ref() != Some(w));
                        self.pods.push(r);
                    }
                    Action::Event { .. } => {}
                }
            }
        }

        fn available(&self, name: &str) -> usize {
            self.pods
                .iter()
                .filter(|p| {
                    p.workload.as_ref().is_some_and(|w| w.name == name) && p.ready && !p.terminating
                })
                .count()
        }
    }

    fn observe_floor(model: &FloorModel, status: Option<&RevisionUpgradeStatus>) -> Observations {
        Observations {
            generation: Some(1),
            fleet: Some(model.fleet()),
            issuance: Some(IssuanceReading {
                window_seconds: 10.0,
                issued: 0.0,
                own: 0.0,
            }),
            gates: gates(
                status.and_then(|s| s.current_wave.as_deref()),
                GateAction::Proceed,
            ),
            ..Observations::default()
        }
    }

    /// Runs ticks one second apart until complete (or 120 ticks), checking `web` never has
    /// fewer than 3 Available pods and `solo` never none.
    fn run_floor(model: &mut FloorModel) -> (RevisionUpgradeStatus, Vec<Decision>) {
        let s = spec();
        let mut status: Option<RevisionUpgradeStatus> = None;
        let mut decisions = Vec::new();
        for tick in 0..120 {
            let now = tick * 1000;
            let d = decide(
                &s,
                status.as_ref(),
                &observe_floor(model, status.as_ref()),
                t(now),
            );
            model.apply(&d.actions, now);
            assert!(
                model.available("web") >= 3,
                "tick {tick}: web below its floor of 3: {:?}",
                model.pods
            );
            assert!(
                model.available("solo") >= 1,
                "tick {tick}: solo has no Available pod"
            );
            status = Some(d.status.clone());
            decisions.push(d);
            if status.as_ref().is_some_and(complete) {
                break;
            }
        }
        (status.unwrap(), decisions)
    }

    #[test]
    fn a_workload_without_a_pdb_keeps_its_floor_and_a_single_replica_surges() {
        let mut model = FloorModel::new();
        let (st, decisions) = run_floor(&mut model);
        let web_evicted = model
            .evicted
            .iter()
            .filter(|k| k.starts_with("a/web"))
            .count();
        assert_eq!(
            web_evicted, 4,
            "each web pod evicted once: {:?}",
            model.evicted
        );
        assert!(
            decisions.iter().all(|d| d
                .actions
                .iter()
                .filter(|a| matches!(a, Action::Evict { pod, .. } if pod.starts_with("web")))
                .count()
                <= 1),
            "never two web pods in one grant"
        );
        assert_eq!(
            model.rollout_restarts,
            vec!["solo".to_owned()],
            "solo surged once"
        );
        assert!(
            !model
                .evicted
                .iter()
                .any(|k| k.contains("solo") || k.contains("batch") || k.contains("pinned")),
            "the single replica, the Job pod and the pinned pods are never evicted: {:?}",
            model.evicted
        );
        // The wave still moves: the Job and the pinned pods are held, not awaited for ever.
        assert_eq!(st.waves[0].state, UpgradeWaveState::Passed, "{st:#?}");
        let c = cond::find(&st.conditions, conditions::POD_REVISION_OVERRIDE).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::POD_REVISION_OVERRIDE)
        );
        assert!(c.message.contains("Deployment a/pinned"), "{}", c.message);
        assert_eq!(st.pod_revision_overrides.len(), 1);
        let r = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
        assert_eq!(r.status, "False", "{}", r.message);
        assert!(r.message.contains("Job pod"), "{}", r.message);
        let overrides_reported = decisions
            .iter()
            .flat_map(event_reasons)
            .filter(|r| *r == reasons::POD_REVISION_OVERRIDE)
            .count();
        assert_eq!(overrides_reported, 1, "the override is announced once");
    }

    #[test]
    fn without_the_floor_the_same_grant_would_take_web_down() {
        // The scenario's premise: the budget alone grants every web pod in one tick.
        let mut model = FloorModel::new();
        for w in model.workloads.values_mut() {
            w.pdb = true;
        }
        let s = spec();
        let d0 = decide(&s, None, &observe_floor(&model, None), t(0));
        model.apply(&d0.actions, 0);
        let d1 = decide(
            &s,
            Some(&d0.status),
            &observe_floor(&model, Some(&d0.status)),
            t(1000),
        );
        let web = d1
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Evict { pod, .. } if pod.starts_with("web")))
            .count();
        assert_eq!(web, 4, "a PodDisruptionBudget is left to the Eviction API");
    }

    #[test]
    fn a_replacement_back_on_the_old_revision_stops_its_workload() {
        let mut model = FloorModel::new();
        model.reinject = Some("web");
        let (st, decisions) = run_floor(&mut model);
        let web_evicted = model
            .evicted
            .iter()
            .filter(|k| k.starts_with("a/web"))
            .count();
        // The first replacement is created in the same second the new label was seen, within
        // REINJECTION_GRACE, so it gets the benefit of the doubt once; the next one stops web.
        assert!(
            web_evicted <= 2,
            "web is not evicted in a loop: {:?}",
            model.evicted
        );
        assert_eq!(model.available("web"), 4, "web keeps its pods");
        assert_eq!(st.reinjected_by_old_revision.len(), 1, "{st:#?}");
        let r = &st.reinjected_by_old_revision[0];
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.found.as_str()),
            ("Deployment", "web", "1-27")
        );
        let c = cond::find(&st.conditions, conditions::REINJECTED_BY_OLD_REVISION).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::REINJECTED_BY_OLD_REVISION)
        );
        let warned = decisions
            .iter()
            .flat_map(event_reasons)
            .filter(|r| *r == reasons::REINJECTED_BY_OLD_REVISION)
            .count();
        assert_eq!(warned, 1, "reported once");
        assert_eq!(
            st.waves[0].state,
            UpgradeWaveState::Passed,
            "the rest of the wave moves on"
        );
        let retirable = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
        assert!(
            retirable.message.contains("re-injected"),
            "{}",
            retirable.message
        );
    }

    #[test]
    fn namespaces_argo_cd_manages_are_reported_with_the_setting() {
        let mut model = FloorModel::new();
        model.namespaces[0].argo_cd_managed = true;
        model.namespaces.push(ns("elsewhere", None, "other"));
        model.namespaces[1].argo_cd_managed = true;
        let d = decide(&spec(), None, &observe_floor(&model, None), t(0));
        assert_eq!(d.status.argo_cd_managed_namespaces, vec!["a".to_owned()]);
        let c = cond::find(&d.status.conditions, conditions::ARGO_CD_MANAGED_NAMESPACES).unwrap();
        assert_eq!(c.status, "True");
        assert!(
            c.message.contains("RespectIgnoreDifferences=true"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("sluice-upgrade-revisions"),
            "{}",
            c.message
        );
        assert!(event_reasons(&d).contains(&reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS));
        let again = decide(
            &spec(),
            Some(&d.status),
            &observe_floor(&model, Some(&d.status)),
            t(1000),
        );
        assert!(!event_reasons(&again).contains(&reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS));
    }

    #[test]
    fn removing_a_started_wave_holds_the_upgrade() {
        let mut model = Model::new();
        // Wave low-risk started and its namespace is moving.
        let d0 = decide(
            &spec(),
            None,
            &observe(&model, None, GateAction::Proceed),
            t(0),
        );
        model.apply(&d0.actions);
        let d1 = decide(
            &spec(),
            Some(&d0.status),
            &observe(&model, Some(&d0.status), GateAction::Proceed),
            t(1000),
        );
        model.apply(&d1.actions);
        let mut edited = spec();
        edited.waves.remove(0);
        let d = decide(
            &edited,
            Some(&d1.status),
            &observe(&model, Some(&d1.status), GateAction::Proceed),
            t(2000),
        );
        let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::STARTED_WAVE_REMOVED),
            "{}",
            c.message
        );
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::Relabel { .. } | Action::Evict { .. })),
            "nothing moves: {:?}",
            d.actions
        );
        assert!(
            d.status.waves.iter().any(|w| w.name == "low-risk"),
            "its state is kept"
        );
        // Aborting retags it back.
        let mut aborted = edited.clone();
        aborted.abort = true;
        let d = decide(
            &aborted,
            Some(&d.status),
            &observe(&model, Some(&d.status), GateAction::Proceed),
            t(3000),
        );
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::Relabel { to, .. } if to == "stable")),
            "{:?}",
            d.actions
        );
    }

    #[test]
    fn a_second_upgrade_waits_for_the_first() {
        let model = Model::new();
        let mut o = observe(&model, None, GateAction::Proceed);
        o.earlier_upgrade = Some("istio-1-27".into());
        let d = decide(&spec(), None, &o, t(0));
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::Relabel { .. } | Action::Evict { .. })),
            "nothing moves while an earlier upgrade runs: {:?}",
            d.actions
        );
        assert_eq!(d.status.phase, RevisionUpgradePhase::Pending);
        let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::WAITING_FOR_UPGRADE)
        );
        assert!(c.message.contains("istio-1-27"), "{}", c.message);
        // Once the first is done, this one starts.
        let d2 = decide(
            &spec(),
            Some(&d.status),
            &observe(&model, Some(&d.status), GateAction::Proceed),
            t(1000),
        );
        assert!(
            d2.actions
                .iter()
                .any(|a| matches!(a, Action::Relabel { .. }))
        );
    }

    #[test]
    fn the_old_revision_is_not_retirable_while_a_namespace_still_selects_it() {
        let mut model = Model::new();
        // Labelled with the old revision's name (no wave selects it) and without pods now.
        model.namespaces.push(ns("cron", None, "1-27"));
        let (st, _) = run(
            &mut model,
            None,
            0,
            &BTreeSet::new(),
            &BTreeSet::new(),
            |_, _| GateAction::Proceed,
            |s| s.waves.iter().all(|w| w.state == UpgradeWaveState::Passed),
        );
        assert_eq!(st.proxies.as_ref().unwrap().old, 0);
        let d = decide(
            &spec(),
            Some(&st),
            &observe(&model, Some(&st), GateAction::Proceed),
            t(400_000),
        );
        assert!(
            d.status.completed_at.is_none(),
            "not complete while cron selects 1-27"
        );
        let c = cond::find(&d.status.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
        assert_eq!(c.status, "False");
        assert!(
            c.message.contains("cron (istio.io/rev=1-27)"),
            "{}",
            c.message
        );
        // Relabelled to the new tag, the old revision is retirable.
        model.label("cron", "canary");
        let d = decide(
            &spec(),
            Some(&d.status),
            &observe(&model, Some(&d.status), GateAction::Proceed),
            t(401_000),
        );
        assert!(
            d.status.completed_at.is_some(),
            "{:#?}",
            d.status.conditions
        );
    }
}
