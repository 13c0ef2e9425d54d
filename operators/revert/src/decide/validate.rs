//! The validity step of [`super::decide`]: a spec with problems CEL cannot express is refused
//! (Ready False) before any verification; a fixed spec clears the refusal.

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{BundlePinPhase, BundlePinStatus};
use sluice_runtime::validity::Step;

use super::model::{Action, Decision, Observations};

/// BundlePin's validity step: only a pin that has not touched anything may be refused for its
/// spec, and only a pin refused for its spec goes back to verifying when it is fixed.
pub(crate) const VALIDITY_STEP: Step<BundlePinStatus> = Step {
    fields: |s| (&mut s.observed_generation, &mut s.conditions),
    phase: |next, validity| {
        let was_refused_for_spec = validity.was_invalid && next.phase == BundlePinPhase::Refused;
        if !validity.valid {
            if matches!(
                next.phase,
                BundlePinPhase::Verifying | BundlePinPhase::Refused
            ) {
                next.phase = BundlePinPhase::Refused;
            }
        } else if was_refused_for_spec {
            next.phase = BundlePinPhase::Verifying;
        }
    },
};

/// The validity part of [`decide`](super::decide), given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    VALIDITY_STEP.decide(problems, status, obs.generation, now, Action::Event)
}
