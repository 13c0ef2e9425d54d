//! The shared model of the Rollout state machine, below its phases: what the reconcile observed
//! (`Observations`, `RouteObs`, `RouteState`), what it must do (`Action`), the `Decision`, the
//! Event action names, the route parts a step wants (`desired_at`, `expected_share`), and the
//! `Machine` every phase writes into with its helpers (Events, conditions, wake-ups, route
//! writes). Must never do I/O or read the clock.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    GateVerdict, RolloutSpec, RolloutStatus,
    rollout::{OwnedRouteStatus, RouteKindName},
};
use sluice_runtime::{
    conditions::{self as cond},
    events::Notice,
};

use crate::route_edit::{Desired, Mirror};

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
    /// What each of `spec.additionalRoutes` looks like, in the spec's order (empty: none, or
    /// not read).
    pub additional_routes: Vec<AdditionalRouteObs>,
}

/// One of `spec.additionalRoutes` as the reconcile found it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdditionalRouteObs {
    /// Its kind.
    pub kind: RouteKindName,
    /// Its name.
    pub name: String,
    /// What it looks like.
    pub route: RouteObs,
}

/// Whether `owned` records the route `kind` `name` (a status written before kinds were recorded
/// counts as HTTPRoute).
pub fn is_route(owned: &OwnedRouteStatus, kind: RouteKindName, name: &str) -> bool {
    owned.name == name && owned.kind.unwrap_or_default() == kind
}

/// An effect the reconcile carries out.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the Rollout.
    Event(Notice),
    /// Bring the route's owned parts to this state (a no-op write is skipped), taking ownership;
    /// the same on every one of `spec.additionalRoutes`, each written on its own.
    WriteRoute(Desired),
    /// Remove the ownership annotation from the route and from every additional route.
    HandBack,
    /// The route, stable or canary Service changed under a running rollout: abort on the
    /// route the weights were written to (with the Services they were written for), then hand
    /// that route back. The reconcile forgets `status.ownedRoute` once both succeeded. Also for
    /// an additional route that left `spec.additionalRoutes` (or whose Services changed): the
    /// reconcile then forgets its entry of `status.additionalOwnedRoutes`. A Promoted rollout's
    /// route is handed back as it stands, as a deletion would: no abort.
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
        /// Whether the canary is aborted on it before the hand-back (false once Promoted: the
        /// promoted version keeps its traffic; the old one may already be scaled down).
        abort: bool,
    },
}

sluice_runtime::decision_types! {
    /// The outcome of [`step`](super::step).
    RolloutStatus, Action
}

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

/// What an Event of this operator is about: its `action`, as the Events API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum EventAction {
    /// Route ownership taken or handed back.
    Own,
    /// A step started or finished.
    Step,
    /// The applied share was judged.
    Share,
    /// The rollout aborted or its abort was verified.
    Abort,
    /// Promotion.
    Promote,
    /// A foreign edit was restored.
    Restore,
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

pub(super) fn dur(s: &sluice_api::v1alpha1::DurationString, fallback: Duration) -> Duration {
    s.parse().unwrap_or(fallback)
}

pub(super) fn since(t: Option<&Time>, now: Timestamp) -> Duration {
    t.map_or(Duration::ZERO, |t| now.duration_since(t.0).unsigned_abs())
}

/// What every phase reads (the spec, the observations, the time) and the decision it writes
/// into: the one shape of the operators' pure machines.
pub(super) struct Machine<'a> {
    pub(super) spec: &'a RolloutSpec,
    pub(super) obs: &'a Observations,
    pub(super) now: Timestamp,
    pub(super) decision: Decision,
}

impl Machine<'_> {
    /// Looks again after `after` at the latest, never sooner than 200 ms.
    pub(super) fn wake(&mut self, after: Duration) {
        self.decision.wake(after.max(Duration::from_millis(200)));
    }

    /// The generation and time this decision stamps its conditions with.
    pub(super) fn stamp(&self) -> cond::Stamp {
        cond::Stamp::new(self.obs.generation, self.now)
    }

    pub(super) fn interval(&self) -> Duration {
        dur(&self.spec.analysis_interval, Duration::from_secs(30))
    }

    pub(super) fn write(&mut self, d: Desired) {
        self.decision.status.desired_weight = Some(d.weight);
        self.decision.status.cohort_active = d.cohort.is_some();
        self.decision.status.mirror_active = d.mirror.is_some();
        let owned = self
            .decision
            .status
            .owned_route
            .get_or_insert_with(OwnedRouteStatus::default);
        owned.name = self.spec.route_ref.name.clone();
        owned.kind = Some(self.spec.route_ref.kind);
        owned.rule_name = self.spec.route_ref.rule_name.clone();
        owned.stable_service = Some(self.spec.stable_service.name.clone());
        owned.canary_service = Some(self.spec.canary_service.name.clone());
        record_parts(owned, &d);
        if owned.owned_since.is_none() {
            owned.owned_since = Some(Time(self.now));
        }
        // Every additional route gets the same parts (weight, cohort and mirror rules), each
        // recorded on its own.
        for r in &self.spec.additional_routes {
            let at = match self
                .decision
                .status
                .additional_owned_routes
                .iter()
                .position(|o| is_route(o, r.kind, &r.name))
            {
                // Written for another managed rule: released first (and forgotten), then
                // recorded afresh.
                Some(at)
                    if self.decision.status.additional_owned_routes[at].rule_name
                        != r.rule_name =>
                {
                    continue;
                }
                Some(at) => at,
                None => {
                    self.decision
                        .status
                        .additional_owned_routes
                        .push(OwnedRouteStatus {
                            name: r.name.clone(),
                            kind: Some(r.kind),
                            owned_since: Some(Time(self.now)),
                            ..OwnedRouteStatus::default()
                        });
                    self.decision.status.additional_owned_routes.len() - 1
                }
            };
            let owned = &mut self.decision.status.additional_owned_routes[at];
            owned.rule_name = r.rule_name.clone();
            owned.stable_service = Some(self.spec.stable_service.name.clone());
            owned.canary_service = Some(self.spec.canary_service.name.clone());
            record_parts(owned, &d);
        }
        self.decision.actions.push(Action::WriteRoute(d));
    }
}

/// Records on a route's ownership the parts `d` writes: its weight (a new weight is in force
/// only once the API server accepts the write: the reconcile records that instant, and the
/// applied share counts from it) and which of this operator's rules it carries.
fn record_parts(owned: &mut OwnedRouteStatus, d: &Desired) {
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
}
