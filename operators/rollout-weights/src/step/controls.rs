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
        if spec.abort && self.next.phase != RolloutPhase::Aborted {
            self.abort(AbortReason::Manual, "spec.abort is true".into(), None);
        }
        if self.next.phase == RolloutPhase::Aborted
            && !spec.abort
            && spec.retry > self.next.retries_handled
        {
            self.next.retries_handled = spec.retry;
            self.next.abort = None;
            self.next.abort_detect_to_revert_ms = None;
            self.next.phase = RolloutPhase::WaitingForCanary;
            self.next.current_step_index = None;
            // The canary-ready deadline of the retry counts from the retry.
            self.next.current_step_started_at = Some(Time(self.now));
            self.next.canary_version = None;
            // Nothing measured in the aborted attempt carries over into the new one.
            self.next.gates.clear();
            self.next.applied_share = None;
            self.next.applied_share_observed_at = None;
            self.next.cohort_share = None;
            self.next.promoted_at = None;
            self.next.captured_baselines.clear();
            self.event(Notice::normal(
                reasons::STEP_IN_PROGRESS,
                EventAction::Step,
                format!("retry {} from the first step", spec.retry),
            ));
        }
    }
}
