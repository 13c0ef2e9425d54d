//! The validity step of [`super::decide`]: a spec with problems CEL cannot express is held
//! Pending (Ready False) before anything moves; a fixed spec clears it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{
    RevisionUpgradePhase, RevisionUpgradeStatus, revision_upgrade::reasons,
};
use sluice_runtime::{conditions as cond, events::Severity};

use super::model::{Action, Decision, Observations, Requeue, VALIDATE};

/// The validity part of [`decide`](super::decide), given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&RevisionUpgradeStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut next = status.cloned().unwrap_or_default();
    next.observed_generation = obs.generation;
    let validity = cond::set_validity(&mut next.conditions, problems, obs.generation, now);
    if !validity.valid {
        next.phase = RevisionUpgradePhase::Invalid;
    } else if validity.was_invalid && next.phase == RevisionUpgradePhase::Invalid {
        next.phase = RevisionUpgradePhase::Pending;
    }
    let note = validity.message;

    let mut actions = Vec::new();
    if validity.transitioned {
        actions.push(if validity.valid {
            Action::Event {
                severity: Severity::Normal,
                reason: reasons::VALID,
                action: VALIDATE,
                note: "spec accepted".to_owned(),
            }
        } else {
            Action::Event {
                severity: Severity::Warning,
                reason: reasons::INVALID_SPEC,
                action: VALIDATE,
                note,
            }
        });
    }
    Decision {
        actions,
        status: next,
        // An invalid spec is waited on (no requeue loop); a valid one without a fleet reading
        // has nothing timed to do.
        requeue: Requeue::AwaitChange,
        busy_for: Duration::ZERO,
    }
}
