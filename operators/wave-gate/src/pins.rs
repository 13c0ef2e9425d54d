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
    /// The pin's deadline (`spec.pinDeadlineSeconds`): the halt's pin wait, so a pin not in
    /// force when the decisions go back has revert give its Applications their sync policy
    /// back at that moment, and Argo CD syncs the set-back decision itself.
    pub deadline_seconds: u32,
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

/// Which halt a pin belongs to: the halted revision, the revision it pins back to and when the
/// halt happened (whole seconds, as the status keeps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaltKey<'a> {
    /// The revision that halted.
    pub revision: &'a str,
    /// The revision the pins restore.
    pub previous: &'a str,
    /// When it halted, seconds since the epoch.
    pub halted_at: i64,
}

/// The pin name for `cluster` of a halt of WaveGate `namespace/name`: readable prefixes plus a
/// hash of the WaveGate, the halt (halted and previous revision, halt time) and the cluster, so
/// the same halt always gives the same name (a restarted operator finds its pins) and another
/// halt — the same revision rolled out again after an earlier halt — never reuses an old pin.
/// At most 63 characters, a valid DNS label.
pub fn pin_name(namespace: &str, name: &str, halt: HaltKey<'_>, cluster: &str) -> String {
    let mut h = Sha256::new();
    let at = halt.halted_at.to_string();
    for part in [namespace, name, halt.revision, halt.previous, &at, cluster] {
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

/// The BundlePin object for `plan`, in the WaveGate's namespace, owned by the WaveGate (uid
/// `owner_uid`): deleting the WaveGate deletes its pins (revert's finalizer first gives every
/// Application its sync policy back).
pub fn bundle_pin(
    spec: &WaveGateSpec,
    namespace: &str,
    wave_gate: &str,
    owner_uid: Option<&str>,
    plan: &PinPlan,
) -> BundlePin {
    let targets: Vec<ApplicationTarget> = plan
        .applications
        .iter()
        .take(MAX_TARGETS)
        .map(|a| ApplicationTarget {
            name: a.name.clone(),
            namespace: Some(a.namespace.clone()),
        })
        .collect();
    // Built from its wire form so every field this pin does not set takes the kind's own
    // default (a halt's pin hands over nothing, keeps the CRD's deadline and prune bound).
    let spec: BundlePinSpec = serde_json::from_value(serde_json::json!({
        "targets": targets,
        "bundle": BundleRef {
            repository: spec.repository.clone(),
            digest: plan.digest.clone(),
        },
        "publicKeysSecretRef": spec.pin.public_keys_secret_ref,
        "releasePolicy": ReleasePolicy::OnMatchingContent,
        "reason": plan.reason.chars().take(1024).collect::<String>(),
        "pinDeadlineSeconds": plan.deadline_seconds,
    }))
    .expect("a BundlePin spec built from its own types");
    let mut pin = BundlePin::new(&plan.name, spec);
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
        owner_references: owner_uid.map(|uid| {
            vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "sluice.dev/v1alpha1".into(),
                    kind: "WaveGate".into(),
                    name: wave_gate.to_owned(),
                    uid: uid.to_owned(),
                    controller: Some(true),
                    block_owner_deletion: Some(false),
                },
            ]
        }),
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
        let prev = format!("sha256:{}", "a".repeat(64));
        let halt = |revision, halted_at| HaltKey {
            revision,
            previous: &prev,
            halted_at,
        };
        let a = pin_name("argocd", "eu-west", halt(&rev, 100), "eu-west-1");
        assert_eq!(
            a,
            pin_name("argocd", "eu-west", halt(&rev, 100), "eu-west-1")
        );
        assert!(a.starts_with("wg-eu-west-eu-west-1-"), "{a}");
        let cases = [
            pin_name("argocd", "eu-west", halt(&other, 100), "eu-west-1"),
            pin_name("argocd", "eu-west", halt(&rev, 100), "eu-west-2"),
            pin_name("argocd", "us-east", halt(&rev, 100), "eu-west-1"),
            pin_name("other", "eu-west", halt(&rev, 100), "eu-west-1"),
            // The same revision halting again later (B-11): a new pin, never the old one.
            pin_name("argocd", "eu-west", halt(&rev, 200), "eu-west-1"),
            pin_name(
                "argocd",
                "eu-west",
                HaltKey {
                    revision: &rev,
                    previous: &other,
                    halted_at: 100,
                },
                "eu-west-1",
            ),
        ];
        for c in &cases {
            assert_ne!(&a, c);
        }
        let long = pin_name(
            "ns",
            &"x".repeat(253),
            halt(&rev, 100),
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
