//! The validity step of [`super::decide`]: a spec with problems CEL cannot express is refused
//! (Ready False) before any verification; a fixed spec clears the refusal.

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{BundlePinPhase, BundlePinStatus, bundle_pin::reasons};
use sluice_runtime::{conditions as cond, events::Severity};

use super::model::{Action, Decision, Observations, Requeue, VALIDATE};

/// The validity part of [`decide`](super::decide), given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut next = status.cloned().unwrap_or_default();
    next.observed_generation = obs.generation;
    let validity = cond::set_validity(&mut next.conditions, problems, obs.generation, now);
    let was_refused_for_spec = validity.was_invalid && next.phase == BundlePinPhase::Refused;
    if !validity.valid {
        // Only a pin that has not touched anything may be refused for its spec.
        if matches!(
            next.phase,
            BundlePinPhase::Verifying | BundlePinPhase::Refused
        ) {
            next.phase = BundlePinPhase::Refused;
        }
    } else if was_refused_for_spec {
        next.phase = BundlePinPhase::Verifying;
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
        // An invalid spec is waited on (no requeue loop).
        requeue: Requeue::AwaitChange,
    }
}
