//! The shared model of the upgrade's decision, below its phases: what the reconcile observed
//! (`Observations`, `Fleet`), what it must do (`Action`), the `Decision`, the timing constants,
//! and one `Machine` with the per-namespace counts and helpers every phase uses. Must never do I/O
//! or read the clock.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    CapturedBaseline, GateVerdict, RevisionUpgradeSpec, RevisionUpgradeStatus,
    revision_upgrade::{NamespaceState, RestartMode},
};
use sluice_runtime::{
    conditions::{self as cond},
    events::Notice,
};

use crate::{
    availability_floor::{self, Plan},
    fleet::{NamespaceView, PodView, Workload, WorkloadView},
    pacing::{self, IssuanceReading},
};

/// Time between two ticks of an active upgrade.
pub const TICK: Duration = pacing::TICK;
/// Time between two looks at an idle (pending on a problem, aborted or complete) upgrade.
pub const IDLE: Duration = Duration::from_secs(30);
/// Time between two looks while a relabel is awaited: restarts start as soon as the new label
/// is seen, not a whole tick later.
pub const RELABEL_RECHECK: Duration = Duration::from_millis(250);

/// Whether a namespace of the upgrade was asked to move and its new label is not seen yet.
pub(super) fn awaiting_relabel(status: &RevisionUpgradeStatus) -> bool {
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
    /// Gates that could not be resolved (a missing or unreadable GateTemplate, a field that does
    /// not parse): absent from `verdicts` and `action`. [`decide`](super::decide) judges each
    /// Inconclusive under the upgrade's `spec.inconclusive`, its streak carried in the status,
    /// so the policy applies once its deadline passes.
    pub unresolved: Vec<UnresolvedGate>,
    /// What is wrong with the gates' configuration, one message per problem naming the gate and
    /// the field (`spec.gates <name>: ...`): the upgrade reports `Ready=False` (reason
    /// [`GATE_MISCONFIGURED`]) until an evaluation finds none. A failed read of a GateTemplate
    /// is not one (it is retried at the next evaluation).
    pub misconfigured: Vec<String>,
}

/// A gate of the current wave that could not be resolved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnresolvedGate {
    /// The gate's name.
    pub gate: String,
    /// Why, naming the field: the message of its Inconclusive verdict.
    pub message: String,
}

pub use sluice_api::v1alpha1::revision_upgrade::reasons::GATE_MISCONFIGURED;

/// Something the reconcile must do after the status is written.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the RevisionUpgrade.
    Event(Notice),
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
    /// Restarts were granted: the next grant's first restart may start this long after the
    /// tick (the schedule's last slot plus one peak spacing), so consecutive grants never
    /// overlap. The last one of a decision counts.
    ScheduleBusy(Duration),
}

sluice_runtime::decision_types! {
    /// The outcome of [`decide`](super::decide): the effects to carry out after the status write
    /// succeeded, the status to write, and when to reconcile again.
    RevisionUpgradeStatus, Action
}

/// What an Event of this operator is about: its `action`, as the Events API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum EventAction {
    /// Wave transitions.
    Wave,
    /// Relabels.
    Relabel,
    /// Aborts and rollbacks.
    Abort,
    /// Completion.
    Complete,
    /// Resume.
    Resume,
}

/// Event reasons this module adds to the kind's condition reasons.
pub mod event_reasons {
    /// A wave started.
    pub const WAVE_STARTED: &str = "WaveStarted";
    /// A wave passed its soak.
    pub const WAVE_PASSED: &str = "WavePassed";
    /// The upgrade was resumed after an abort.
    pub const RESUMED: &str = "Resumed";
}

pub(super) fn to_ms(t: &Time) -> i64 {
    t.0.as_millisecond()
}

pub(super) fn elapsed(since: &Time, now: Timestamp) -> Duration {
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

/// One tick of a valid upgrade: what every phase reads (the spec, the observations, the fleet
/// and its counts, the time) and the decision it writes into, the one shape of the operators'
/// pure machines.
pub(super) struct Machine<'a> {
    pub(super) spec: &'a RevisionUpgradeSpec,
    pub(super) obs: &'a Observations,
    pub(super) fleet: &'a Fleet,
    /// The fleet's pods by namespace, built once per tick: a tick counts every namespace of
    /// the upgrade several times, and a fleet holds tens of thousands of pods.
    pub(super) by_ns: BTreeMap<&'a str, Vec<&'a Arc<PodView>>>,
    /// Non-terminating pods per workload (namespace, workload), built once per tick.
    pub(super) by_workload: BTreeMap<(&'a str, &'a Workload), u32>,
    pub(super) now: Timestamp,
    /// The current wave's gates as judged this tick ([`Observations::gates`] with its
    /// unresolved gates judged under `spec.inconclusive`).
    pub(super) gates: Option<&'a GateReport>,
    /// The decision this tick writes into.
    pub(super) decision: &'a mut Decision,
    /// Pods this tick did not offer for restart because their workload is at its
    /// availability floor.
    pub(super) held_by_floor: u32,
}

/// Per-namespace reading of this tick.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct NsCount {
    pub(super) pods: u32,
    pub(super) done: u32,
    pub(super) bare_not_done: u32,
    /// Pods not on the target that are not restarted: Job pods, pods whose own label pins
    /// another revision, workloads stopped after a re-injection, and single pods of
    /// controllers that cannot be rollout-restarted.
    pub(super) held_not_done: u32,
    pub(super) not_ready: u32,
}

impl Machine<'_> {
    pub(super) fn generation(&self) -> Option<i64> {
        self.obs.generation
    }

    /// The generation and time this decision stamps its conditions with.
    pub(super) fn stamp(&self) -> cond::Stamp {
        cond::Stamp::new(self.generation(), self.now)
    }

    pub(super) fn ns_view(&self, name: &str) -> Option<&NamespaceView> {
        self.fleet.namespaces.iter().find(|n| n.name == name)
    }

    pub(super) fn count(&self, ns: &str, target: &str) -> NsCount {
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
    pub(super) fn tag_of(&self, target: &str) -> &str {
        if target == self.spec.to_revision {
            &self.spec.to_tag
        } else {
            &self.spec.from_tag
        }
    }

    /// Whether a pod's own `istio.io/rev` label pins a revision other than `target`.
    pub(super) fn overrides(&self, p: &PodView, target: &str) -> bool {
        p.rev_label
            .as_deref()
            .is_some_and(|l| l != target && l != self.tag_of(target))
    }

    /// Whether a pod of a controller is left on its revision rather than restarted (see
    /// [`NsCount::held_not_done`]).
    pub(super) fn held(&self, p: &PodView, target: &str) -> bool {
        let Some(w) = &p.workload else {
            return false;
        };
        if w.kind == "Job" || self.overrides(p, target) {
            return true;
        }
        if self
            .decision
            .status
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
    pub(super) fn workload_view(&self, namespace: &str, w: &Workload) -> Option<&WorkloadView> {
        self.fleet.workloads.get(&(namespace.to_owned(), w.clone()))
    }

    /// The availability-floor plan of a workload; `pods` are its pods (only needed for an
    /// eviction's allowance).
    pub(super) fn plan_of(
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
    pub(super) fn surging(&self, namespace: &str) -> bool {
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
}
