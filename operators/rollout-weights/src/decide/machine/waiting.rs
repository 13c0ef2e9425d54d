//! The WaitingForCanary phase: no live weight until the canary workload is ready and its Service
//! exists, then the first step (or promotion on `promoteFull`); an abort once the canary-ready
//! deadline passed.

use std::time::Duration;

use sluice_api::v1alpha1::rollout::{AbortReason, conditions, reasons};
use sluice_runtime::conditions::Status;

use super::model::{Machine, dur, since};

impl Machine<'_> {
    pub(super) fn waiting(&mut self) {
        let spec = self.spec;
        let service_missing = self.obs.canary_service == Some(false);
        match self.obs.canary_ready {
            Some(true) if !service_missing => {
                self.decision.status.canary_version = self.obs.canary_version.clone();
                self.decision.status.steps_hash = Some(crate::observe::steps_hash(spec));
                self.decision.condition(
                    self.stamp(),
                    conditions::CANARY_READY,
                    Status::True,
                    "Ready",
                    format!(
                        "{} {} is ready",
                        spec.canary_workload.kind, spec.canary_workload.name
                    ),
                );
                if spec.promote_full {
                    self.promote("spec.promoteFull".into());
                } else {
                    self.start_step(0);
                    self.progressing();
                }
            }
            _ => {
                let deadline = dur(&spec.canary_ready_deadline, Duration::from_secs(600));
                // From ownership, or from the retry or new canary version that restarted the
                // wait.
                let waited = since(
                    self.decision
                        .status
                        .current_step_started_at
                        .as_ref()
                        .or(self
                            .decision
                            .status
                            .owned_route
                            .as_ref()
                            .and_then(|o| o.owned_since.as_ref())),
                    self.now,
                );
                let msg = if service_missing {
                    format!(
                        "canary Service {} does not exist; no live weight until it does",
                        spec.canary_service.name
                    )
                } else {
                    format!(
                        "{} {} is not ready; no live weight until it is",
                        spec.canary_workload.kind, spec.canary_workload.name
                    )
                };
                self.decision.condition(
                    self.stamp(),
                    conditions::CANARY_READY,
                    Status::False,
                    reasons::WAITING_FOR_CANARY,
                    msg.clone(),
                );
                if waited >= deadline {
                    self.abort(
                        AbortReason::CanaryNotReady,
                        format!("{msg}; deadline {}s passed", deadline.as_secs()),
                        None,
                    );
                } else {
                    self.wake(self.interval().min(deadline - waited));
                }
            }
        }
    }
}
