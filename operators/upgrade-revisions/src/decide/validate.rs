//! The validity step of [`super::decide`]: a spec with problems CEL cannot express is held
//! Pending (Ready False) before anything moves; a fixed spec clears it.

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{RevisionUpgradePhase, RevisionUpgradeStatus};
use sluice_runtime::validity::Step;

use super::model::{Action, Decision, Observations};

/// RevisionUpgrade's validity step: an invalid spec is Invalid whatever it was doing; a fixed
/// one starts again from Pending.
pub(crate) const VALIDITY_STEP: Step<RevisionUpgradeStatus> = Step {
    fields: |s| (&mut s.observed_generation, &mut s.conditions),
    phase: |next, validity| {
        if !validity.valid {
            next.phase = RevisionUpgradePhase::Invalid;
        } else if validity.was_invalid && next.phase == RevisionUpgradePhase::Invalid {
            next.phase = RevisionUpgradePhase::Pending;
        }
    },
};

/// The validity part of [`decide`](super::decide), given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&RevisionUpgradeStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let d = VALIDITY_STEP.decide(problems, status, obs.generation, now, Action::Event);
    Decision {
        actions: d.actions,
        status: d.status,
        // An invalid spec is waited on (no requeue loop); a valid one without a fleet reading
        // has nothing timed to do.
        requeue: d.requeue,
    }
}
