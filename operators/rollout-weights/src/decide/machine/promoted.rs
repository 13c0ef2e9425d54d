//! The Promoted phase and hand-back: promotion to 100%, the hand-back deadline (`HandBackOverdue`)
//! and giving the route back. Never removes a promoted canary: Git makes it stable.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{conditions, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use crate::route_edit::Desired;

use super::model::{Action, EventAction, Machine, dur, since};

impl Machine<'_> {
    pub(super) fn promote(&mut self, why: String) {
        self.decision.status.phase = RolloutPhase::Promoted;
        self.decision.status.promoted_at = Some(Time(self.now));
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::False,
            reasons::PROMOTED,
            why.clone(),
        );
        self.decision.event(Notice::normal(
            reasons::PROMOTED,
            EventAction::Promote,
            format!("promoted to 100%: {why}"),
        ));
        self.write(Desired {
            weight: 100,
            cohort: None,
            mirror: None,
        });
    }

    /// Promoted: holds the canary at 100% and, once `spec.handBackDeadline` passed without
    /// the Git change that deletes this Rollout, reports the hand-back overdue.
    pub(super) fn promoted(&mut self) {
        let spec = self.spec;
        self.write(desired_promoted());
        let deadline = dur(&spec.hand_back_deadline, Duration::from_secs(86_400));
        let waited = since(self.decision.status.promoted_at.as_ref(), self.now);
        if waited >= deadline {
            let already = cond::find(
                &self.decision.status.conditions,
                conditions::HAND_BACK_OVERDUE,
            )
            .is_some_and(|c| c.status == "True");
            let note = format!(
                "promoted {}s ago; the Git change making the canary stable should delete this Rollout",
                waited.as_secs()
            );
            self.decision.condition(
                self.stamp(),
                conditions::HAND_BACK_OVERDUE,
                Status::True,
                reasons::HAND_BACK_OVERDUE,
                note.clone(),
            );
            if !already {
                self.decision.event(Notice::warning(
                    reasons::HAND_BACK_OVERDUE,
                    EventAction::Promote,
                    note,
                ));
            }
        } else {
            self.wake(deadline - waited);
        }
    }

    pub(super) fn hand_back(&mut self) {
        self.decision.actions.push(Action::HandBack);
        self.decision.event(Notice::normal(
            "HandedBack",
            EventAction::Own,
            format!(
                "{} {} handed back",
                self.spec.route_ref.kind.as_str(),
                self.spec.route_ref.name
            ),
        ));
    }
}

fn desired_promoted() -> Desired {
    Desired {
        weight: 100,
        cohort: None,
        mirror: None,
    }
}
