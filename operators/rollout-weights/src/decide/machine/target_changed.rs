//! The release check: the route, its rule or a Service changed under a running rollout, so the
//! canary is aborted on the route the weights were written to, that route is handed back, and
//! the rollout starts over from Pending. A Promoted rollout's routes are handed back as they
//! stand, as a deletion would: aborting them would send their traffic back to the version the
//! promotion replaced, which may be scaled down by then. Never releases a route a BundlePin
//! holds.

use std::time::Duration;

use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{AbortReason, StepOutcome, conditions, reasons},
};
use sluice_runtime::{conditions::Status, events::Notice};

use sluice_api::v1alpha1::rollout::OwnedRouteStatus;

use super::model::{Action, EventAction, Machine, is_route};

impl Machine<'_> {
    /// Whether the route or a Service changed under a running rollout; if so, releases the
    /// route the weights were written to and starts over from Pending.
    pub(super) fn target_changed(&mut self) -> bool {
        let spec = self.spec;
        let Some(owned) = self.decision.status.owned_route.clone() else {
            self.additional_routes_dropped();
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
            .decision
            .status
            .abort
            .as_ref()
            .is_some_and(|a| a.reason == AbortReason::PinnedByBundlePin);
        if pinned {
            return false;
        }
        if !moved {
            self.additional_routes_dropped();
            return false;
        }
        // The weights of every additional route were written for the old Services too.
        for o in self.decision.status.additional_owned_routes.clone() {
            self.release(&o);
        }
        let kind = spec.route_ref.kind.as_str();
        let old_kind = owned.kind.unwrap_or(spec.route_ref.kind);
        let was = old_kind.as_str();
        let what = if self.aborts_on_release() {
            "the canary is aborted on"
        } else {
            "the promoted canary keeps its weight on"
        };
        let note = format!(
            "the rollout's target changed ({was} {} with {} / {} -> {kind} {} with {} / {}): {what} {was} {} and it is handed back; the rollout starts over",
            owned.name,
            owned.stable_service.as_deref().unwrap_or("?"),
            owned.canary_service.as_deref().unwrap_or("?"),
            spec.route_ref.name,
            spec.stable_service.name,
            spec.canary_service.name,
            owned.name
        );
        self.decision.actions.push(Action::Release {
            kind: old_kind,
            route: owned.name.clone(),
            rule_name: owned.rule_name.clone(),
            stable: owned.stable_service.clone(),
            canary: owned.canary_service.clone(),
            abort: self.aborts_on_release(),
        });
        self.decision.event(Notice::warning(
            reasons::TARGET_CHANGED,
            EventAction::Own,
            note.clone(),
        ));
        if self.obs.deleting {
            return true;
        }
        self.finish_step(StepOutcome::Restarted);
        self.decision.status.phase = RolloutPhase::Pending;
        self.decision.status.current_step_index = None;
        self.decision.status.current_step_started_at = None;
        self.decision.status.desired_weight = Some(0);
        self.decision.status.cohort_active = false;
        self.decision.status.mirror_active = false;
        self.decision.status.gates.clear();
        self.decision.status.applied_share = None;
        self.decision.status.applied_share_observed_at = None;
        self.decision.status.cohort_share = None;
        self.decision.status.promoted_at = None;
        self.decision.status.canary_version = None;
        self.decision.status.abort = None;
        self.decision.status.abort_detect_to_revert_ms = None;
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::True,
            reasons::TARGET_CHANGED,
            note,
        );
        self.wake(Duration::from_millis(200));
        true
    }

    /// Releases each additional route this Rollout wrote to that `spec.additionalRoutes` no
    /// longer names (or names with another managed rule): the canary aborted on it, then the
    /// route handed back; the reconcile forgets it once both succeeded. The rollout goes on on
    /// the routes still named.
    fn additional_routes_dropped(&mut self) {
        let spec = self.spec;
        for o in self.decision.status.additional_owned_routes.clone() {
            let named = spec.additional_routes.iter().any(|r| {
                is_route(&o, r.kind, &r.name) && (o.rule_name == r.rule_name || o.name.is_empty())
            });
            if named {
                continue;
            }
            let kind = o.kind.unwrap_or_default().as_str();
            let what = if self.aborts_on_release() {
                "the canary is aborted on it"
            } else {
                "the promoted canary keeps its weight on it"
            };
            self.release(&o);
            self.decision.event(Notice::normal(
                reasons::TARGET_CHANGED,
                EventAction::Own,
                format!(
                    "{kind} {} left spec.additionalRoutes: {what} and it is handed back",
                    o.name
                ),
            ));
        }
    }

    /// Aborts on the route `owned` records (unless Promoted) and hands it back (see
    /// [`Action::Release`]).
    fn release(&mut self, owned: &OwnedRouteStatus) {
        self.decision.actions.push(Action::Release {
            kind: owned.kind.unwrap_or_default(),
            route: owned.name.clone(),
            rule_name: owned.rule_name.clone(),
            stable: owned.stable_service.clone(),
            canary: owned.canary_service.clone(),
            abort: self.aborts_on_release(),
        });
    }

    /// Whether a release aborts the canary first: not once Promoted (the status as read, before
    /// this step starts over).
    fn aborts_on_release(&self) -> bool {
        self.decision.status.phase != RolloutPhase::Promoted
    }
}
