//! What changed under a running plan: a new canary version restarts from step 0 once it is
//! ready; new `spec.steps` restart the plan at the step matching the current weight. Never goes
//! further than the weight already judged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{StepKind, StepOutcome, conditions, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{EventAction, Machine, desired_at};

impl Machine<'_> {
    /// What changed under a running plan: a new canary version (from the canary workload's
    /// pod template) sets the canary weight to 0 and restarts from step 0 once the new version
    /// is ready, also after promotion (a promoted canary serving a version nobody judged is
    /// what the rollout exists to prevent); new `spec.steps` restart the plan at the step that
    /// matches the current weight (see [`Machine::replan`]).
    pub(super) fn plan_changes(&mut self) {
        let spec = self.spec;
        let hash = crate::observe::steps_hash(spec);
        let running = matches!(
            self.decision.status.phase,
            RolloutPhase::Progressing | RolloutPhase::Paused | RolloutPhase::Promoted
        );
        if running
            && let (Some(was), Some(seen)) = (
                &self.decision.status.canary_version,
                &self.obs.canary_version,
            )
            && was != seen
        {
            let note = format!(
                "new canary version of {} {} (pod template {was} -> {seen}): canary weight 0; the rollout starts over from step 0 once it is ready",
                spec.canary_workload.kind, spec.canary_workload.name
            );
            self.finish_step(StepOutcome::Restarted);
            self.decision.status.phase = RolloutPhase::WaitingForCanary;
            self.decision.status.current_step_index = None;
            self.decision.status.current_step_started_at = Some(Time(self.now));
            self.decision.status.canary_version = None;
            self.decision.status.promoted_at = None;
            self.decision.status.cohort_share = None;
            self.decision.status.gates.clear();
            self.decision.status.applied_share = None;
            self.decision.status.applied_share_observed_at = None;
            cond::remove(
                &mut self.decision.status.conditions,
                conditions::HAND_BACK_OVERDUE,
            );
            cond::remove(
                &mut self.decision.status.conditions,
                conditions::APPLIED_SHARE_CONFIRMED,
            );
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::CANARY_VERSION_CHANGED,
                note.clone(),
            );
            self.decision.event(Notice::warning(
                reasons::CANARY_VERSION_CHANGED,
                EventAction::Step,
                note,
            ));
            self.decision.status.steps_hash = Some(hash);
            return;
        }
        match self.decision.status.steps_hash.clone() {
            None => self.decision.status.steps_hash = Some(hash),
            Some(was) if was != hash => {
                self.decision.status.steps_hash = Some(hash);
                if matches!(
                    self.decision.status.phase,
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
        let current = self.decision.status.desired_weight.unwrap_or(0);
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
        self.decision.event(Notice::normal(
            reasons::STEPS_CHANGED,
            EventAction::Step,
            note,
        ));
        self.start_step(index);
    }
}
