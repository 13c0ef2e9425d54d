//! The controls a person sets on a running Rollout: `spec.abort` and `spec.retry`. (`paused`,
//! `promoteThroughStep` and `promoteFull` act in `progressing`.)

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{AbortReason, reasons},
};
use sluice_runtime::events::Notice;

use super::model::{EventAction, Machine};

impl Machine<'_> {
    /// The controls on a Rollout that owns its route: `spec.abort` aborts, and a `spec.retry`
    /// raised after an abort (with `spec.abort` false) starts the rollout over from the
    /// wait for the canary, keeping nothing measured in the aborted attempt.
    pub(super) fn controls(&mut self) {
        let spec = self.spec;
        if spec.abort && self.decision.status.phase != RolloutPhase::Aborted {
            self.abort(AbortReason::Manual, "spec.abort is true".into(), None);
        }
        if self.decision.status.phase == RolloutPhase::Aborted
            && !spec.abort
            && spec.retry > self.decision.status.retries_handled
        {
            self.decision.status.retries_handled = spec.retry;
            self.decision.status.abort = None;
            self.decision.status.abort_detect_to_revert_ms = None;
            self.decision.status.phase = RolloutPhase::WaitingForCanary;
            self.decision.status.current_step_index = None;
            // The canary-ready deadline of the retry counts from the retry.
            self.decision.status.current_step_started_at = Some(Time(self.now));
            self.decision.status.canary_version = None;
            // Nothing measured in the aborted attempt carries over into the new one.
            self.decision.status.gates.clear();
            self.decision.status.applied_share = None;
            self.decision.status.applied_share_observed_at = None;
            self.decision.status.cohort_share = None;
            self.decision.status.promoted_at = None;
            self.decision.status.captured_baselines.clear();
            self.decision.event(Notice::normal(
                reasons::STEP_IN_PROGRESS,
                EventAction::Step,
                format!("retry {} from the first step", spec.retry),
            ));
        }
    }
}
