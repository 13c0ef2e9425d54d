//! The Rollout state machine: given a valid spec, the status decided so far, what the route and
//! the mesh look like, and `now`, decides the next status and the route writes.
//!
//! Owns ownership, waiting for the canary, step progression, the applied-share check that must
//! pass before a weight step's analysis clock starts, acting on gate verdicts, the controls
//! (abort, paused, promoteThroughStep, promoteFull, retry), abort and its verification, pin
//! detection and hand-back. Everything it needs to resume lives in the status it returns, so a
//! restarted operator reaches the same decision. Must never do I/O or read the clock.
//!
//! One file per phase, the shared model below them: `model` (observations, actions, the
//! decision, the route parts a step wants, and the `Machine` every phase writes into with its
//! helpers), `target_changed` (the route or a Service changed under a running rollout),
//! `controls` (abort, retry), `plan_changes` (a new canary version, new steps), `waiting`
//! (Pending, WaitingForCanary), `progressing` (the steps in order; pause, mirror and cohort
//! steps; the canary Service gone), `weight` (a weight step: the applied share, then the
//! gates), `held` (the verdicts judged while a step is held), `aborted` (the abort and its
//! verification), `promoted` (promotion, the hand-back deadline, hand-back) and `invalid_spec`
//! (a started Rollout whose spec became invalid); this module holds [`step`], [`invalid`] and
//! the step between phases: reading the route, its ownership, deletion, foreign edits and pins.
//! Unit tests sit beside them in `tests.rs`.

mod aborted;
mod controls;
mod held;
mod invalid_spec;
mod model;
mod plan_changes;
mod progressing;
mod promoted;
mod target_changed;
#[cfg(test)]
mod tests;
mod waiting;
mod weight;

pub use invalid_spec::JUDGED_FIELDS;
pub use model::*;

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{
    RolloutPhase, RolloutSpec, RolloutStatus,
    bundle_pin::FIELD_MANAGER as REVERT_FIELD_MANAGER,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use crate::route_edit::Desired;

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
    drive(spec, status, obs, now, |m| m.run_invalid(problems))
}

/// Runs the state machine for a valid spec from `status`.
pub fn step(
    spec: &RolloutSpec,
    status: RolloutStatus,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    drive(spec, status, obs, now, |m| m.run())
}

/// A machine from `status`, moved by `run`, as the decision it reached.
fn drive(
    spec: &RolloutSpec,
    status: RolloutStatus,
    obs: &Observations,
    now: Timestamp,
    run: impl FnOnce(&mut Machine<'_>),
) -> Decision {
    let mut m = Machine {
        spec,
        obs,
        now,
        decision: Decision::starting_from(status),
    };
    run(&mut m);
    m.decision
}

impl Machine<'_> {
    /// Says that another writer's edit of an owned route (`note` names it) was restored.
    fn foreign_edit_restored(&mut self, note: String) {
        self.decision.event(Notice::warning(
            reasons::FOREIGN_EDIT_RESTORED,
            EventAction::Restore,
            note,
        ));
        self.decision.condition(
            self.stamp(),
            conditions::ROUTE_OWNED,
            Status::True,
            reasons::FOREIGN_EDIT_RESTORED,
            "a foreign edit of owned weights was restored",
        );
    }

    /// The step between phases: a changed target first, then the route as read, its ownership,
    /// deletion, foreign edits and pins, the controls and plan changes, then the phase.
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
                self.delete_without_route_ref(false);
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
                        self.delete_without_route_ref(true);
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
        // Every additional route is read like routeRef: a problem on one blocks or refuses
        // exactly as the same problem on routeRef would, naming that route.
        let Some((extra, extra_unfit)) = self.additional_route_states() else {
            return;
        };
        let blocked = blocked || extra_unfit;
        let pinned = self
            .decision
            .status
            .abort
            .as_ref()
            .is_some_and(|a| a.reason == AbortReason::PinnedByBundlePin);
        if self.obs.deleting {
            self.delete(Some(&route), &extra);
            return;
        }
        let last_written = self
            .decision
            .status
            .owned_route
            .as_ref()
            .and_then(|o| o.last_written_resource_version.clone());
        let changed_by_other = last_written.is_some() && route.resource_version != last_written;
        if changed_by_other && !pinned {
            let drifted = Some(route.canary_weight)
                != self
                    .decision
                    .status
                    .owned_route
                    .as_ref()
                    .and_then(|o| o.written_weight)
                || route.cohort != self.decision.status.cohort_active
                || route.mirror != self.decision.status.mirror_active;
            // A BundlePin is recognised by who rewrote spec.rules since our last write, whether
            // or not the owned weights changed: a pin restoring the very weights this Rollout
            // wrote still outranks it.
            if route.last_writer.as_deref() == Some(REVERT_FIELD_MANAGER) {
                self.stopped_by_bundle_pin(format!(
                    "a BundlePin rewrote {} {}; the pin wins and this rollout stops",
                    spec.route_ref.kind.as_str(),
                    spec.route_ref.name
                ));
                return;
            }
            if drifted {
                let note = format!(
                    "{} {} was edited by {}: canary weight {} (wrote {:?}), cohort {}, mirror {}; restoring",
                    spec.route_ref.kind.as_str(),
                    spec.route_ref.name,
                    route.last_writer.as_deref().unwrap_or("an unknown writer"),
                    route.canary_weight,
                    self.decision
                        .status
                        .owned_route
                        .as_ref()
                        .and_then(|o| o.written_weight),
                    route.cohort,
                    route.mirror
                );
                self.foreign_edit_restored(note);
            }
        }
        // A BundlePin that rewrote an additional route outranks this Rollout there too: the
        // rollout stops as it would for routeRef, and no route is written again.
        if !pinned {
            let pinned_extra = spec.additional_routes.iter().zip(&extra).find(|(r, st)| {
                let last = self
                    .decision
                    .status
                    .additional_owned_routes
                    .iter()
                    .find(|o| is_route(o, r.kind, &r.name))
                    .and_then(|o| o.last_written_resource_version.clone());
                last.is_some()
                    && st.resource_version != last
                    && st.last_writer.as_deref() == Some(REVERT_FIELD_MANAGER)
            });
            if let Some((r, _)) = pinned_extra {
                self.stopped_by_bundle_pin(format!(
                    "a BundlePin rewrote {} {} (spec.additionalRoutes); the pin wins and this rollout stops",
                    r.kind.as_str(),
                    r.name
                ));
                return;
            }
            // Anyone else's edit of an additional route's owned weight is said as on routeRef;
            // the next write restores it.
            let edits: Vec<String> = spec
                .additional_routes
                .iter()
                .zip(&extra)
                .filter_map(|(r, st)| {
                    let owned = self
                        .decision.status
                        .additional_owned_routes
                        .iter()
                        .find(|o| is_route(o, r.kind, &r.name))?;
                    let edited = owned.last_written_resource_version.is_some()
                        && st.resource_version != owned.last_written_resource_version
                        && owned.written_weight != Some(st.canary_weight);
                    edited.then(|| {
                        format!(
                            "{} {} (spec.additionalRoutes) was edited by {}: canary weight {} (wrote {:?}); restoring",
                            r.kind.as_str(),
                            r.name,
                            st.last_writer.as_deref().unwrap_or("an unknown writer"),
                            st.canary_weight,
                            owned.written_weight
                        )
                    })
                })
                .collect();
            for note in edits {
                self.foreign_edit_restored(note);
            }
        }
        if pinned {
            // The pin wins while revert holds the route. Once it released it (its field
            // ownership is gone), an explicit retry starts the rollout again from here.
            let released = route.last_writer.as_deref() != Some(REVERT_FIELD_MANAGER);
            if !(released && !spec.abort && spec.retry > self.decision.status.retries_handled) {
                return;
            }
            if let Some(o) = self.decision.status.owned_route.as_mut() {
                // The route as the pin left it is the starting point, not a foreign edit.
                o.last_written_resource_version = route.resource_version.clone();
            }
        }
        // A restore stays reported (RouteOwned=True, ForeignEditRestored) until ownership
        // changes; otherwise the route is simply owned.
        let restored = cond::find(&self.decision.status.conditions, conditions::ROUTE_OWNED)
            .is_some_and(|c| c.status == "True" && c.reason == reasons::FOREIGN_EDIT_RESTORED);
        if route.owner.is_some() && !restored && !blocked {
            self.decision.condition(
                self.stamp(),
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

        self.controls();
        self.plan_changes();
        if blocked && self.decision.status.phase != RolloutPhase::Aborted {
            let live = matches!(
                self.decision.status.phase,
                RolloutPhase::Progressing | RolloutPhase::Paused
            );
            let index = self.decision.status.current_step_index.unwrap_or(0) as usize;
            if !live || !self.judge_live(index, "the route does not fit the steps") {
                return;
            }
        }
        match self.decision.status.phase {
            RolloutPhase::Aborted => self.aborted(&route),
            RolloutPhase::Invalid => {}
            RolloutPhase::Pending => {
                self.decision.status.phase = RolloutPhase::WaitingForCanary;
                self.decision.event(Notice::normal(
                    "Owned",
                    EventAction::Own,
                    format!(
                        "took ownership of {} {}",
                        spec.route_ref.kind.as_str(),
                        spec.route_ref.name
                    ),
                ));
                self.write(Desired::abort());
                self.waiting();
            }
            RolloutPhase::WaitingForCanary => {
                self.write(Desired::abort());
                self.waiting();
            }
            RolloutPhase::Promoted => self.promoted(),
            RolloutPhase::Progressing | RolloutPhase::Paused => self.progressing(),
        }
    }

    /// Deleting a Rollout before promotion cancels it: the canary is aborted on every route it
    /// owns in the same way as any abort, then the routes are handed back. A promoted canary is
    /// the new stable and stays until Git says otherwise; a pinned route is the pin's. `route`
    /// is routeRef's state, `None` when it cannot be read (gone, or without its managed rule):
    /// the additional routes are then still aborted and handed back, so their canary does not
    /// outlive the Rollout (the reconcile writes and hands back only routes that exist and this
    /// Rollout owns).
    fn delete(&mut self, route: Option<&RouteState>, extra: &[RouteState]) {
        let spec = self.spec;
        let extra_owned: Vec<&RouteState> = extra
            .iter()
            .filter(|r| r.owner.as_ref() == Some(&r.me))
            .collect();
        if route.is_some_and(|r| r.owner.is_none()) && extra_owned.is_empty() {
            return;
        }
        let pinned = self
            .decision
            .status
            .abort
            .as_ref()
            .is_some_and(|a| a.reason == AbortReason::PinnedByBundlePin)
            || route
                .into_iter()
                .chain(extra_owned.iter().copied())
                .any(|r| r.last_writer.as_deref() == Some(REVERT_FIELD_MANAGER));
        let live = route.is_some_and(|r| r.canary_weight > 0 || r.cohort || r.mirror)
            || extra_owned.iter().any(|r| r.canary_weight > 0);
        let route_ref = format!("{} {}", spec.route_ref.kind.as_str(), spec.route_ref.name);
        // The additional routes it owns, by kind and name, for the notes.
        let obs = self.obs;
        let additional = || {
            obs.additional_routes
                .iter()
                .filter(|o| match &o.route {
                    RouteObs::Present(st)
                    | RouteObs::Unusable {
                        state: Some(st), ..
                    } => st.owner.as_ref() == Some(&st.me),
                    _ => false,
                })
                .map(|o| format!("{} {}", o.kind.as_str(), o.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if live && self.decision.status.phase != RolloutPhase::Promoted && !pinned {
            self.decision
                .actions
                .push(Action::WriteRoute(Desired::abort()));
            let note = match route {
                Some(_) => format!(
                    "deleted before promotion: canary weight 0 and cohort and mirror rules removed on {route_ref} before hand-back"
                ),
                None => format!(
                    "deleted before promotion: canary weight 0 on {} (spec.additionalRoutes) before hand-back; {route_ref} (spec.routeRef) could not be read",
                    additional()
                ),
            };
            self.decision.event(Notice::warning(
                reasons::ABORTED_ON_DELETE,
                EventAction::Abort,
                note,
            ));
        }
        if route.is_some() {
            self.hand_back();
        } else {
            self.decision.actions.push(Action::HandBack);
            let note = format!(
                "{} (spec.additionalRoutes) handed back; {route_ref} (spec.routeRef) could not be read, and is handed back too if it is there and owned",
                additional()
            );
            self.decision
                .event(Notice::normal("HandedBack", EventAction::Own, note));
        }
    }

    /// Deleting while routeRef cannot be read: [`Machine::delete`] with the additional routes'
    /// states (every readable one, whatever the others). Without an additional route it owns,
    /// routeRef alone is handed back when it `exists` (the reconcile does so only if this
    /// Rollout owns it), and nothing happens when it is gone.
    fn delete_without_route_ref(&mut self, exists: bool) {
        if !self.obs.deleting {
            return;
        }
        let extra = self
            .additional_route_states()
            .map(|(extra, _)| extra)
            .unwrap_or_default();
        if extra.iter().any(|r| r.owner.as_ref() == Some(&r.me)) {
            self.delete(None, &extra);
        } else if exists {
            self.hand_back();
        }
    }

    /// The states of `spec.additionalRoutes`, in the spec's order, and whether one of them does
    /// not fit the steps (its parts still readable: the steps are refused while abort and
    /// hand-back still apply). A problem is reported as on routeRef (`RouteOwned=False`, naming
    /// that route). `None` when one of them stops the rollout as the same problem on routeRef
    /// would (missing, no managed rule, owned by another Rollout, not read); while deleting,
    /// those are left out instead, so the others are still handed back.
    fn additional_route_states(&mut self) -> Option<(Vec<RouteState>, bool)> {
        let (spec, obs) = (self.spec, self.obs);
        let mut out = Vec::new();
        let mut stop = false;
        let mut unfit = false;
        for r in &spec.additional_routes {
            let what = format!("spec.additionalRoutes: {} {}", r.kind.as_str(), r.name);
            let seen = obs
                .additional_routes
                .iter()
                .find(|o| o.kind == r.kind && o.name == r.name)
                .map(|o| &o.route);
            match seen {
                None | Some(RouteObs::Unknown) => stop = true,
                Some(RouteObs::Missing) => {
                    if !obs.deleting {
                        self.route_problem(
                            reasons::ROUTE_NOT_FOUND,
                            format!("{what} not found in the Rollout's namespace"),
                        );
                    }
                    stop = true;
                }
                Some(RouteObs::Unusable {
                    reason,
                    message,
                    state,
                }) => {
                    if !obs.deleting {
                        self.route_problem(reason, format!("{what}: {message}"));
                    }
                    match state {
                        Some(st) => {
                            unfit = true;
                            out.push(st.clone());
                        }
                        None => stop = true,
                    }
                }
                Some(RouteObs::Present(st)) => match st.owner.as_ref().filter(|o| **o != st.me) {
                    Some(other) => {
                        if !obs.deleting {
                            self.route_problem(
                                reasons::ROUTE_OWNED_BY_OTHER,
                                format!(
                                    "{what} is owned by Rollout {other}; one Rollout per route"
                                ),
                            );
                        }
                        stop = true;
                    }
                    None => out.push(st.clone()),
                },
            }
        }
        (!stop || obs.deleting).then_some((out, unfit))
    }

    fn route_problem(&mut self, reason: &'static str, message: String) {
        let before = cond::find(&self.decision.status.conditions, conditions::ROUTE_OWNED)
            .map(|c| c.reason.clone());
        self.decision.condition(
            self.stamp(),
            conditions::ROUTE_OWNED,
            Status::False,
            reason,
            message.clone(),
        );
        if before.as_deref() != Some(reason) {
            self.decision
                .event(Notice::warning(reason, EventAction::Own, message));
        }
        self.wake(self.interval());
    }
}
