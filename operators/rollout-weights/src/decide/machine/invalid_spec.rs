//! A started Rollout whose spec became invalid: progress stops, a live canary keeps being judged
//! (or is aborted when the gates' own fields are invalid), an abort keeps being verified. Never
//! advances a step.

use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::conditions::Status;

use super::model::{Machine, RouteObs};

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
    pub(super) fn run_invalid(&mut self, problems: &[String]) {
        let RouteObs::Present(route) = self.obs.route.clone() else {
            return;
        };
        if route.owner.as_ref().is_some_and(|o| *o != route.me) {
            return;
        }
        let index = self.decision.status.current_step_index.unwrap_or(0) as usize;
        let first = problems.first().cloned().unwrap_or_default();
        match self.decision.status.phase {
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
                    self.decision.condition(
                        self.stamp(),
                        conditions::PROGRESSING,
                        Status::True,
                        reasons::INVALID_SPEC,
                        format!(
                            "step {index} held at canary weight {} while the spec is invalid ({first}); the gates still judge the canary and a Fail aborts",
                            self.decision.status.desired_weight.unwrap_or(0)
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
