//! The BundlePins a halted change creates: one per admitted cluster, pinning that cluster's
//! Applications to the previous revision.
//!
//! Owns their deterministic names (so a restart or a retried reconcile never creates two) and
//! their shape. Pure; never creates anything itself and never pins a cluster the change did not
//! admit.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};
use sluice_api::v1alpha1::{
    BundlePin, BundlePinSpec, WaveGateSpec,
    bundle_pin::{ApplicationTarget, BundleRef, ReleasePolicy},
};

/// Label on every BundlePin the operator creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Annotation naming the WaveGate that created a pin (`namespace/name`).
pub const WAVE_GATE_ANNOTATION: &str = "sluice.dev/wave-gate";
/// Annotation naming the cluster a pin reverts.
pub const CLUSTER_ANNOTATION: &str = "sluice.dev/cluster";

/// An Application of a cluster, as a pin target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AppRef {
    /// Application name.
    pub name: String,
    /// Application namespace.
    pub namespace: String,
}

/// A pin to create for one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinPlan {
    /// Deterministic name (see [`pin_name`]).
    pub name: String,
    /// The cluster it reverts.
    pub cluster: String,
    /// The cluster's Applications (1..64).
    pub applications: Vec<AppRef>,
    /// The revision pinned to (the previous one).
    pub digest: String,
    /// Why (audit).
    pub reason: String,
}

fn dns_part(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .take(max)
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The pin name for `cluster` when the change to `revision` halted on WaveGate
/// `namespace/name`: readable prefixes plus a hash of all four, so the same halt always gives
/// the same name and different halts (another revision, another WaveGate) never collide. At
/// most 63 characters, a valid DNS label.
pub fn pin_name(namespace: &str, name: &str, revision: &str, cluster: &str) -> String {
    let mut h = Sha256::new();
    for part in [namespace, name, revision, cluster] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let hash = hex::encode(&h.finalize()[..5]);
    let wg = dns_part(name, 24);
    let cl = dns_part(cluster, 24);
    let mut out = String::from("wg");
    for p in [wg, cl, hash] {
        if !p.is_empty() {
            out.push('-');
            out.push_str(&p);
        }
    }
    out
}

/// Most Applications one pin targets (the BundlePin CRD's bound).
pub const MAX_TARGETS: usize = 64;

/// The BundlePin object for `plan`, in the WaveGate's namespace.
pub fn bundle_pin(
    spec: &WaveGateSpec,
    namespace: &str,
    wave_gate: &str,
    plan: &PinPlan,
) -> BundlePin {
    let mut pin = BundlePin::new(
        &plan.name,
        BundlePinSpec {
            targets: plan
                .applications
                .iter()
                .take(MAX_TARGETS)
                .map(|a| ApplicationTarget {
                    name: a.name.clone(),
                    namespace: Some(a.namespace.clone()),
                })
                .collect(),
            bundle: BundleRef {
                repository: spec.repository.clone(),
                digest: plan.digest.clone(),
            },
            public_keys_secret_ref: spec.pin.public_keys_secret_ref.clone(),
            allowed_kinds: Vec::new(),
            release_policy: ReleasePolicy::OnMatchingContent,
            release: false,
            release_reason: None,
            reason: plan.reason.chars().take(1024).collect(),
            git_revert: None,
        },
    );
    pin.metadata = ObjectMeta {
        name: Some(plan.name.clone()),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            crate::OPERATOR.to_owned(),
        )])),
        annotations: Some(BTreeMap::from([
            (
                WAVE_GATE_ANNOTATION.to_owned(),
                format!("{namespace}/{wave_gate}"),
            ),
            (CLUSTER_ANNOTATION.to_owned(), plan.cluster.clone()),
        ])),
        ..ObjectMeta::default()
    };
    pin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_bounded_and_distinct() {
        let rev = format!("sha256:{}", "b".repeat(64));
        let other = format!("sha256:{}", "c".repeat(64));
        let a = pin_name("argocd", "eu-west", &rev, "eu-west-1");
        assert_eq!(a, pin_name("argocd", "eu-west", &rev, "eu-west-1"));
        assert!(a.starts_with("wg-eu-west-eu-west-1-"), "{a}");
        let cases = [
            pin_name("argocd", "eu-west", &other, "eu-west-1"),
            pin_name("argocd", "eu-west", &rev, "eu-west-2"),
            pin_name("argocd", "us-east", &rev, "eu-west-1"),
            pin_name("other", "eu-west", &rev, "eu-west-1"),
        ];
        for c in &cases {
            assert_ne!(&a, c);
        }
        let long = pin_name(
            "ns",
            &"x".repeat(253),
            &rev,
            "Cluster_With.Odd/Chars-and-a-very-long-name-indeed",
        );
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{long}"
        );
        assert!(!long.ends_with('-'), "{long}");
    }
}
