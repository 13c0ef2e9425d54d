//! The Aborted phase: the abort itself (canary weight 0, cohort and mirror rules removed, unless a
//! BundlePin holds the route) and its verification (the route reverted, then the mesh reporting
//! the canary's share at ~0). Never writes a live weight.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::{
    GateVerdict, RolloutPhase,
    rollout::{AbortReason, AbortStatus, StepOutcome, conditions, reasons},
};
use sluice_runtime::{conditions::Status, events::Notice};

use crate::route_edit::Desired;

use super::model::{Action, EventAction, Machine, REVERTED_SHARE_PERCENT, RouteObs, RouteState};

impl Machine<'_> {
    /// A BundlePin rewrote a route this Rollout owns (`message` names it): the pin wins. The
    /// rollout stops (an abort already under way keeps going, now for this reason) without
    /// writing the route again, and RouteOwned says why.
    pub(super) fn stopped_by_bundle_pin(&mut self, message: String) {
        if self.decision.status.phase == RolloutPhase::Aborted {
            if let Some(a) = self.decision.status.abort.as_mut() {
                a.reason = AbortReason::PinnedByBundlePin;
            }
        } else {
            self.abort(AbortReason::PinnedByBundlePin, message.clone(), None);
        }
        self.decision.condition(
            self.stamp(),
            conditions::ROUTE_OWNED,
            Status::False,
            reasons::PINNED_BY_BUNDLE_PIN,
            message,
        );
    }

    pub(super) fn abort(
        &mut self,
        reason: AbortReason,
        message: String,
        gate: Option<GateVerdict>,
    ) {
        let idx = self.decision.status.current_step_index;
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
        self.decision.status.phase = RolloutPhase::Aborted;
        self.decision.status.abort = Some(AbortStatus {
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
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::False,
            why,
            message.clone(),
        );
        if reason != AbortReason::PinnedByBundlePin {
            self.write(Desired::abort());
        }
        self.decision.event(Notice::warning(
            why,
            EventAction::Abort,
            format!("rollout aborted: {message}"),
        ));
    }

    pub(super) fn aborted(&mut self, route: &RouteState) {
        // Reverted once every route is: the primary and each additional route read.
        let reverted = route.canary_weight == 0
            && !route.cohort
            && !route.mirror
            && self.obs.additional_routes.iter().all(|a| match &a.route {
                RouteObs::Present(r) | RouteObs::Unusable { state: Some(r), .. } => {
                    r.canary_weight == 0
                }
                _ => true,
            });
        if !self
            .decision
            .actions
            .iter()
            .any(|a| matches!(a, Action::WriteRoute(_)))
        {
            self.write(Desired::abort());
        }
        let Some(a) = self.decision.status.abort.clone() else {
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
                    self.decision.event(Notice::normal(
                        "RevertVerified",
                        EventAction::Abort,
                        format!("the mesh reports canary share {s:.2}% after the abort"),
                    ));
                }
                _ => self.wake(self.interval()),
            }
        }
        self.decision.status.abort = Some(a);
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(1024).collect()
}
