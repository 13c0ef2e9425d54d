//! What the reconcile must fetch before [`super::decide`] runs: whether the pin is over, whether
//! (and which) bundle to verify, which Applications to observe, whether to read revision content.

use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec, BundlePinStatus,
    bundle_pin::{BundleRef, ReleasePolicy},
};

use super::model::{AppKey, app_key, holds_application};

/// Whether the pin is over: Released or Refused, or Failed with no Application left suspended.
/// A Failed pin that still holds an Application waits for a release (explicit or by deletion).
pub fn is_over(status: Option<&BundlePinStatus>) -> bool {
    let Some(s) = status else { return false };
    match s.phase {
        BundlePinPhase::Released | BundlePinPhase::Refused => true,
        BundlePinPhase::Failed => !s.applications.iter().any(holds_application),
        _ => false,
    }
}

/// Whether the reconcile must verify the bundle for this status (it needs the objects to
/// apply them). Release never does: it needs only what verification recorded, so a rotated
/// key, a garbage-collected digest or a registry outage never keeps automation suspended.
pub fn needs_verification(status: Option<&BundlePinStatus>) -> bool {
    matches!(
        status.map(|s| s.phase).unwrap_or_default(),
        BundlePinPhase::Verifying | BundlePinPhase::Pinning
    )
}

/// The bundle the reconcile verifies and acts on: the one the status recorded as verified once
/// there is one (so a changed `spec.bundle` is never pulled, applied or released by mistake),
/// else `spec.bundle`.
pub fn bundle_to_verify(spec: &BundlePinSpec, status: Option<&BundlePinStatus>) -> BundleRef {
    match status.and_then(|s| s.to_digest.clone()) {
        Some(digest) => BundleRef {
            repository: status
                .and_then(|s| s.to_repository.clone())
                .unwrap_or_else(|| spec.bundle.repository.clone()),
            digest,
        },
        None => spec.bundle.clone(),
    }
}

/// The Applications the reconcile observes: the ones the status recorded once verification
/// passed (the pin acts on those only), else `spec.targets` (namespace defaulted to `pin_ns`).
pub fn targets_to_observe(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    pin_ns: &str,
) -> Vec<AppKey> {
    match status {
        Some(s) if s.to_digest.is_some() && !s.applications.is_empty() => {
            s.applications.iter().map(app_key).collect()
        }
        _ => spec_targets(spec, pin_ns),
    }
}

pub(super) fn spec_targets(spec: &BundlePinSpec, pin_ns: &str) -> Vec<AppKey> {
    spec.targets
        .iter()
        .map(|t| AppKey {
            namespace: t.namespace.clone().unwrap_or_else(|| pin_ns.to_owned()),
            name: t.name.clone(),
        })
        .collect()
}

/// Whether the reconcile should fetch the content digest of each target's synced revision.
pub fn needs_revision_content(spec: &BundlePinSpec, status: Option<&BundlePinStatus>) -> bool {
    spec.release_policy == ReleasePolicy::OnMatchingContent
        && status.is_some_and(|s| s.phase == BundlePinPhase::Pinned)
}
