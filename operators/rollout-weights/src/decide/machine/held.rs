//! The verdicts judged while a step is held (a pause step, `spec.paused`, a mirror or cohort step,
//! a weight step whose share is not yet confirmed, an invalid spec, a route the steps do not
//! fit): a Fail aborts, nothing advances. Never leaves a live canary unjudged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{Verdict, rollout::AbortReason};

use super::model::Machine;

impl Machine<'_> {
    /// Judges the verdicts evaluated this tick while the canary receives traffic but the step
    /// does not advance on them (a pause step, `spec.paused`, a mirror or cohort step, a weight
    /// step whose share is not yet confirmed, an invalid spec held): records each verdict and
    /// the applied share, and aborts on a Fail. `held` says what holds the step, for the abort
    /// message. Returns true when it aborted. A Fail is the safe direction and needs no
    /// confirmed share; an Inconclusive verdict's policy applies only to a confirmed weight
    /// step, where it can hold or complete the step.
    pub(super) fn judge_live(&mut self, index: usize, held: &str) -> bool {
        if let Some(s) = self.obs.applied_share {
            self.decision.status.applied_share = Some(s);
            self.decision.status.applied_share_observed_at = Some(Time(self.now));
        }
        for (v, _) in &self.obs.gates {
            self.decision.status.gates.retain(|g| g.gate != v.gate);
            self.decision.status.gates.push(v.clone());
        }
        self.decision
            .status
            .gates
            .sort_by(|a, b| a.gate.cmp(&b.gate));
        let failed = self
            .obs
            .gates
            .iter()
            .find(|(v, act)| v.verdict == Verdict::Fail && *act == GateAction::Abort);
        let Some((v, _)) = failed else {
            return false;
        };
        let msg = format!(
            "gate {} failed at step {index} ({held}): value {:?} vs threshold {:?} ({})",
            v.gate,
            v.value,
            v.threshold,
            v.message.clone().unwrap_or_default()
        );
        self.abort(AbortReason::GateFailed, msg, Some(v.clone()));
        true
    }
}
