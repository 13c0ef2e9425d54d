//! Spec drift: how the spec differs from what the pin verified and holds. A changed spec never
//! redirects a pin; it is reported (Verified False) until the spec matches again.

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{
    BundlePinSpec, BundlePinStatus,
    bundle_pin::{conditions, reasons},
};
use sluice_runtime::conditions::{self as cond, Status};

use super::model::{Decision, EventAction, Observations, condition};
use super::plan::spec_targets;

/// How the spec differs from what the pin verified and holds (empty: it does not, or nothing
/// is recorded yet): (reason, message). The CRD makes `spec.bundle` and `spec.targets`
/// immutable; this is the defence for a store that did not enforce it.
pub fn spec_drift(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    pin_ns: &str,
) -> Vec<(&'static str, String)> {
    let Some(status) = status else {
        return Vec::new();
    };
    let Some(held) = status.to_digest.as_deref() else {
        return Vec::new();
    };
    let mut drift = Vec::new();
    let repo_changed = status
        .to_repository
        .as_deref()
        .is_some_and(|r| r != spec.bundle.repository);
    if held != spec.bundle.digest || repo_changed {
        drift.push((
            reasons::BUNDLE_CHANGED,
            format!(
                "spec.bundle is now {} but this pin verified and holds {}@{held}; nothing of the new bundle is applied. Restore spec.bundle, or create a new BundlePin for the new bundle and release this one (spec.release: true)",
                spec.bundle.reference(),
                status
                    .to_repository
                    .as_deref()
                    .unwrap_or(&spec.bundle.repository)
                    .trim_start_matches("oci://"),
            ),
        ));
    }
    if !status.applications.is_empty() {
        let mut want: Vec<String> = spec_targets(spec, pin_ns)
            .iter()
            .map(|k| format!("{}/{}", k.namespace, k.name))
            .collect();
        let mut held: Vec<String> = status
            .applications
            .iter()
            .map(|a| format!("{}/{}", a.namespace, a.name))
            .collect();
        want.sort();
        held.sort();
        if want != held {
            drift.push((
                reasons::TARGETS_CHANGED,
                format!(
                    "spec.targets now lists {} but this pin verified and holds {}; no other Application is touched. Restore spec.targets, or create a new BundlePin for the other Applications",
                    want.join(", "),
                    held.join(", ")
                ),
            ));
        }
    }
    drift
}

/// Reports a spec that no longer matches what the pin verified (condition + Warning Event),
/// or that it matches again. Returns whether it differs.
pub(super) fn check_drift(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
) -> bool {
    let before = d.status.clone();
    let drift = spec_drift(spec, Some(&before), &obs.pin.0);
    if let Some((reason, _)) = drift.first() {
        let message = drift
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reason,
            message,
            obs.generation,
            now,
            EventAction::Verify,
        );
        return true;
    }
    if cond::find(&d.status.conditions, conditions::VERIFIED).is_some_and(|c| {
        c.reason == reasons::BUNDLE_CHANGED || c.reason == reasons::TARGETS_CHANGED
    }) {
        condition(
            d,
            conditions::VERIFIED,
            Status::True,
            reasons::SIGNATURE_VERIFIED,
            format!(
                "spec.bundle and spec.targets match the verified pin again ({})",
                before.to_digest.as_deref().unwrap_or_default()
            ),
            obs.generation,
            now,
            EventAction::Verify,
        );
    }
    false
}
