//! Building pods from workload templates the way the real controllers name and label them:
//! template hashes, pod names, ownerReferences, readiness. Pure apart from the random name
//! suffix; never writes to the API.

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The alphabet Kubernetes uses for generated name suffixes and hashes (no vowels, no look-alikes).
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Deployment pods' template hash label.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// StatefulSet and DaemonSet pods' revision label.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
/// StatefulSet pod name label.
pub const STS_POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
/// StatefulSet pod ordinal label.
pub const POD_INDEX: &str = "apps.kubernetes.io/pod-index";
/// DaemonSet template generation label.
pub const POD_TEMPLATE_GENERATION: &str = "pod-template-generation";

/// A stable hash of a pod template, encoded like Kubernetes' `pod-template-hash` (FNV-1a of the
/// template, safe-encoded). The same template always gives the same hash.
pub fn template_hash(template: &PodTemplateSpec) -> String {
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// A random 5-character suffix from Kubernetes' name alphabet.
pub fn random_suffix() -> String {
    static SEED: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos ^ SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    (0..5)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHANUMS[(x % ALPHANUMS.len() as u64) as usize] as char
        })
        .collect()
}

/// The owner of a pod being built.
#[derive(Debug, Clone)]
pub struct Owner {
    /// `Deployment`, `StatefulSet` or `DaemonSet`.
    pub kind: &'static str,
    /// Owner name.
    pub name: String,
    /// Owner uid.
    pub uid: String,
}

/// Builds a pod from a template: the template's labels and annotations plus `extra_labels`, a
/// controller ownerReference (`apps/v1`), the given name and namespace, and `node` as
/// `spec.nodeName` (the simulated scheduler's choice).
pub fn pod_from_template(
    template: &PodTemplateSpec,
    owner: &Owner,
    namespace: &str,
    name: String,
    extra_labels: BTreeMap<String, String>,
    node: Option<String>,
) -> Pod {
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.extend(extra_labels);
    let mut spec = template.spec.clone().unwrap_or_default();
    if spec.node_name.is_none() {
        spec.node_name = node;
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: tmeta.annotations,
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: owner.kind.into(),
                name: owner.name.clone(),
                uid: owner.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Whether a pod is Ready (condition `Ready=True`).
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether a pod is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether `pod` is controlled by the object with `uid`.
pub fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.controller == Some(true) && r.uid == uid)
    })
}

/// A label value of a pod.
pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(image: &str) -> PodTemplateSpec {
        serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "checkout"}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "app", "image": image}]}
        }))
        .unwrap()
    }

    #[test]
    fn template_hash_is_stable_and_changes_with_the_template() {
        let a = template_hash(&template("checkout:1"));
        assert_eq!(a, template_hash(&template("checkout:1")));
        assert_ne!(a, template_hash(&template("checkout:2")));
        assert!(a.bytes().all(|b| ALPHANUMS.contains(&b)), "{a}");
    }

    #[test]
    fn suffixes_use_the_kubernetes_alphabet_and_differ() {
        let names: std::collections::BTreeSet<String> = (0..50).map(|_| random_suffix()).collect();
        assert!(names.len() > 45, "suffixes collide too often: {names:?}");
        assert!(
            names
                .iter()
                .all(|n| n.len() == 5 && n.bytes().all(|b| ALPHANUMS.contains(&b)))
        );
    }

    #[test]
    fn pod_carries_labels_owner_and_node() {
        let owner = Owner {
            kind: "Deployment",
            name: "checkout".into(),
            uid: "u-1".into(),
        };
        let extra = BTreeMap::from([(POD_TEMPLATE_HASH.to_string(), "h".to_string())]);
        let pod = pod_from_template(
            &template("x"),
            &owner,
            "shop",
            "checkout-h-abcde".into(),
            extra,
            Some("node-1".into()),
        );
        assert_eq!(label(&pod, "app"), Some("checkout"));
        assert_eq!(label(&pod, POD_TEMPLATE_HASH), Some("h"));
        assert!(controlled_by(&pod, "u-1"));
        assert!(!controlled_by(&pod, "u-2"));
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("shop"));
    }
}
