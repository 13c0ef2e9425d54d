//! What the operator sees of the fleet, reduced to what `decide` needs: namespaces with their
//! labels, meshed pods with the revision the injector recorded, their controller and whether
//! they are going away; and the pure readings of those (injected revision, wave membership,
//! proxy counts, the workload a pod belongs to).
//!
//! Pure; never reads the cluster. Progress is counted from the injector's
//! `sidecar.istio.io/status` annotation, never from labels sluice wrote.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};
use kube::{
    ResourceExt,
    core::{Selector, SelectorExt},
};
use sluice_api::v1alpha1::{
    RevisionUpgradeSpec,
    revision_upgrade::{INJECTION_LABEL, NamespaceWave, ProxyCounts, REV_LABEL},
};

/// Pod annotation the injector writes: JSON with the injecting `revision`.
pub const STATUS_ANNOTATION: &str = "sidecar.istio.io/status";
/// Pod-template annotation `kubectl rollout restart` sets.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";
/// Pod label Deployments put on their pods (the ReplicaSet name's suffix).
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Annotation Argo CD's annotation tracking (the default in Argo CD v3) sets on what it manages.
pub const ARGOCD_TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";

/// A namespace: name and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceView {
    /// Namespace name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Whether Argo CD manages it (so a self-healing Application would put Git's
    /// `istio.io/rev` back).
    pub argo_cd_managed: bool,
}

impl NamespaceView {
    /// Reads a Namespace object.
    pub fn from_namespace(ns: &Namespace) -> Self {
        Self {
            name: ns.name_any(),
            labels: ns.labels().clone(),
            argo_cd_managed: argo_cd_manages_labels(ns),
        }
    }

    /// The `istio.io/rev` label.
    pub fn rev(&self) -> Option<&str> {
        self.labels.get(REV_LABEL).map(String::as_str)
    }

    /// Whether the namespace uses `istio-injection=enabled` (which ignores `istio.io/rev`).
    pub fn injection_enabled(&self) -> bool {
        self.labels.get(INJECTION_LABEL).map(String::as_str) == Some("enabled")
    }
}

/// Whether Argo CD manages a namespace's labels: it carries Argo CD's tracking annotation (a
/// `Namespace` manifest in an Application, or `managedNamespaceMetadata`), or a field manager
/// of Argo CD's (`argocd-controller`, server-side apply) owns its `istio.io/rev` label.
pub fn argo_cd_manages_labels(ns: &Namespace) -> bool {
    if ns.annotations().contains_key(ARGOCD_TRACKING_ANNOTATION) {
        return true;
    }
    let rev_field = format!("\"f:{REV_LABEL}\"");
    ns.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| {
            f.manager
                .as_deref()
                .is_some_and(|m| m.starts_with("argocd"))
        })
        .any(|f| {
            f.fields_v1
                .as_ref()
                .is_some_and(|v| v.0.to_string().contains(&rev_field))
        })
}

/// The workload controller a pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Workload {
    /// Deployment, StatefulSet, DaemonSet, or another controller kind.
    pub kind: String,
    /// Its name.
    pub name: String,
}

/// A meshed pod (one carrying the injector's status annotation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Revision the injector recorded.
    pub revision: String,
    /// Controller, if any; `None` is a bare pod (an eviction would not replace it).
    pub workload: Option<Workload>,
    /// Whether it is being deleted.
    pub terminating: bool,
    /// Whether it is Ready.
    pub ready: bool,
    /// Since when it is Ready (the Ready condition's last transition, ms since the epoch).
    pub ready_since_ms: Option<i64>,
    /// When it was created (ms since the epoch).
    pub created_ms: Option<i64>,
    /// Its own `istio.io/rev` label (a pod-level revision override), if any.
    pub rev_label: Option<String>,
}

/// What the operator reads of a workload controller: its desired replicas, its own
/// `rollingUpdate.maxUnavailable`, `minReadySeconds`, whether a PodDisruptionBudget covers
/// its pods, and its pod template's restart marker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadView {
    /// Desired replicas (a DaemonSet's desired number scheduled).
    pub replicas: u32,
    /// Its own `rollingUpdate.maxUnavailable`, when it declares one.
    pub max_unavailable: Option<IntOrString>,
    /// Seconds a Ready pod must stay Ready to count as Available.
    pub min_ready_seconds: u32,
    /// Whether a PodDisruptionBudget selects its pods (the Eviction API then keeps its floor).
    pub pdb: bool,
    /// Its pod template's `kubectl.kubernetes.io/restartedAt` annotation.
    pub restarted_at: Option<String>,
}

impl WorkloadView {
    /// Resolves an int-or-percent against `total` the way Kubernetes does for maxUnavailable
    /// (a percentage rounds down); an unparsable value counts as 0.
    pub fn scaled(value: &IntOrString, total: u32) -> u32 {
        match value {
            IntOrString::Int(i) => (*i).max(0) as u32,
            IntOrString::String(s) => {
                let pct: f64 = s.trim_end_matches('%').trim().parse().unwrap_or(0.0);
                (pct.max(0.0) * f64::from(total) / 100.0).floor() as u32
            }
        }
    }
}

/// Whether a label selector selects `labels` (an empty selector selects everything, as a
/// PodDisruptionBudget's does in `policy/v1`).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// The injecting revision recorded in a pod's `sidecar.istio.io/status` annotation.
pub fn injected_revision(annotations: &BTreeMap<String, String>) -> Option<String> {
    /// The one field read; the rest of the annotation (containers, volumes, ...) is skipped
    /// without being built, since every tick reads it for every pod of the cluster.
    #[derive(serde::Deserialize)]
    struct Status {
        revision: Option<String>,
    }
    let raw = annotations.get(STATUS_ANNOTATION)?;
    serde_json::from_str::<Status>(raw).ok()?.revision
}

/// The workload controlling a pod: the Deployment behind a ReplicaSet (the ReplicaSet's name
/// minus `-<pod-template-hash>`), or the controller itself.
pub fn workload_of(pod: &Pod) -> Option<Workload> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    if owner.kind == "ReplicaSet"
        && let Some(hash) = pod.labels().get(POD_TEMPLATE_HASH)
        && let Some(deploy) = owner.name.strip_suffix(&format!("-{hash}"))
    {
        return Some(Workload {
            kind: "Deployment".into(),
            name: deploy.into(),
        });
    }
    Some(Workload {
        kind: owner.kind.clone(),
        name: owner.name.clone(),
    })
}

/// Since when the pod is Ready (ms), `None` when it is not.
fn ready_since(pod: &Pod) -> Option<Option<i64>> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map(|t| t.0.as_millisecond())
        })
}

impl PodView {
    /// Reads a Pod; `None` when it is not meshed.
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let revision = injected_revision(pod.annotations())?;
        let ready = ready_since(pod);
        Some(Self {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            revision,
            workload: workload_of(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            ready: ready.is_some(),
            ready_since_ms: ready.flatten(),
            created_ms: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond()),
            rev_label: pod.labels().get(REV_LABEL).cloned(),
        })
    }
}

/// Proxies per injecting revision (terminating pods excluded).
pub fn proxy_counts(spec: &RevisionUpgradeSpec, pods: &[Arc<PodView>]) -> ProxyCounts {
    let mut c = ProxyCounts::default();
    for p in pods.iter().filter(|p| !p.terminating) {
        if p.revision == spec.from_revision {
            c.old += 1;
        } else if p.revision == spec.to_revision {
            c.new += 1;
        } else {
            c.other += 1;
        }
    }
    c
}

/// Proxies per revision, every revision seen (for the metric).
pub fn proxies_by_revision(pods: &[Arc<PodView>]) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<&str, u64> = BTreeMap::new();
    for p in pods.iter().filter(|p| !p.terminating) {
        *out.entry(p.revision.as_str()).or_default() += 1;
    }
    out.into_iter().map(|(r, n)| (r.to_owned(), n)).collect()
}

/// Why a wave selector could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.waves[{index}].namespaceSelector: {message}; fix the selector")]
pub struct SelectorError {
    /// Index of the wave.
    pub index: usize,
    /// The parse error.
    pub message: String,
}

fn selector(wave: &NamespaceWave, index: usize) -> Result<Selector, SelectorError> {
    Selector::try_from(wave.namespace_selector.clone()).map_err(|e| SelectorError {
        index,
        message: e.to_string(),
    })
}

/// The namespaces of wave `index`: on the from tag, not using `istio-injection=enabled`, not
/// in `taken` (already in the upgrade), matching this wave's selector and no earlier wave's.
/// Sorted by name.
pub fn wave_members(
    spec: &RevisionUpgradeSpec,
    index: usize,
    namespaces: &[NamespaceView],
    taken: &BTreeSet<String>,
) -> Result<Vec<String>, SelectorError> {
    let Some(wave) = spec.waves.get(index) else {
        return Ok(Vec::new());
    };
    let own = selector(wave, index)?;
    let earlier = spec.waves[..index]
        .iter()
        .enumerate()
        .map(|(i, w)| selector(w, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out: Vec<String> = namespaces
        .iter()
        .filter(|ns| ns.rev() == Some(spec.from_tag.as_str()) && !ns.injection_enabled())
        .filter(|ns| !taken.contains(&ns.name))
        .filter(|ns| own.matches(&ns.labels) && !earlier.iter().any(|s| s.matches(&ns.labels)))
        .map(|ns| ns.name.clone())
        .collect();
    out.sort();
    Ok(out)
}

/// Namespaces using `istio-injection=enabled`, sorted: they ignore `istio.io/rev`, so moving
/// them is not possible by relabelling; they are reported.
pub fn injection_enabled(namespaces: &[NamespaceView]) -> Vec<String> {
    let mut out: Vec<String> = namespaces
        .iter()
        .filter(|ns| ns.injection_enabled())
        .map(|ns| ns.name.clone())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(name: &str, labels: &[(&str, &str)]) -> NamespaceView {
        NamespaceView {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            argo_cd_managed: false,
        }
    }

    fn spec() -> RevisionUpgradeSpec {
        serde_json::from_value(json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"
        }))
        .unwrap()
    }

    #[test]
    fn injected_revision_reads_the_status_annotation_only() {
        let table = [
            (
                json!({"sidecar.istio.io/status": "{\"revision\":\"1-27\",\"containers\":[\"istio-proxy\"]}"}),
                Some("1-27"),
            ),
            (json!({"istio.io/rev": "1-28"}), None),
            (json!({"sidecar.istio.io/status": "not json"}), None),
            (
                json!({"sidecar.istio.io/status": "{\"containers\":[]}"}),
                None,
            ),
            (json!({"sidecar.istio.io/status": "{\"revision\":5}"}), None),
        ];
        for (annotations, want) in table {
            let a: BTreeMap<String, String> = serde_json::from_value(annotations.clone()).unwrap();
            assert_eq!(injected_revision(&a).as_deref(), want, "{annotations}");
        }
    }

    #[test]
    fn workload_is_the_deployment_behind_a_replicaset() {
        let pod = |owner: serde_json::Value, labels: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "a",
                "labels": labels, "ownerReferences": owner}}))
            .unwrap()
        };
        let rs = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "u", "controller": true}]);
        let sts = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u", "controller": true}]);
        let not_controller =
            json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]);
        let table = [
            (
                pod(rs.clone(), json!({"pod-template-hash": "5d8f"})),
                Some(("Deployment", "web")),
            ),
            (pod(rs, json!({})), Some(("ReplicaSet", "web-5d8f"))),
            (pod(sts, json!({})), Some(("StatefulSet", "db"))),
            (pod(not_controller, json!({})), None),
            (pod(json!([]), json!({})), None),
        ];
        for (i, (p, want)) in table.into_iter().enumerate() {
            let got = workload_of(&p);
            assert_eq!(
                got.as_ref().map(|w| (w.kind.as_str(), w.name.as_str())),
                want,
                "row {i}"
            );
        }
    }

    #[test]
    fn waves_take_each_namespace_once_and_skip_legacy_injection() {
        let all = vec![
            ns(
                "a-low",
                &[("istio.io/rev", "stable"), ("sluice.dev/risk-tier", "low")],
            ),
            ns(
                "b-t2",
                &[
                    ("istio.io/rev", "stable"),
                    ("sluice.dev/risk-tier", "tier-2"),
                ],
            ),
            ns(
                "c-t1",
                &[
                    ("istio.io/rev", "stable"),
                    ("sluice.dev/risk-tier", "tier-1"),
                ],
            ),
            ns("d-none", &[("istio.io/rev", "stable")]),
            ns(
                "e-other-tag",
                &[("istio.io/rev", "canary"), ("sluice.dev/risk-tier", "low")],
            ),
            ns(
                "f-legacy",
                &[("istio-injection", "enabled"), ("istio.io/rev", "stable")],
            ),
            ns("g-unmeshed", &[]),
        ];
        let s = spec();
        let none = BTreeSet::new();
        assert_eq!(wave_members(&s, 0, &all, &none).unwrap(), vec!["a-low"]);
        assert_eq!(wave_members(&s, 1, &all, &none).unwrap(), vec!["b-t2"]);
        assert_eq!(
            wave_members(&s, 2, &all, &none).unwrap(),
            vec!["c-t1", "d-none"],
            "the last default wave takes every remaining namespace on the from tag"
        );
        let taken = BTreeSet::from(["c-t1".to_owned()]);
        assert_eq!(wave_members(&s, 2, &all, &taken).unwrap(), vec!["d-none"]);
        assert_eq!(
            wave_members(&s, 3, &all, &none).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(injection_enabled(&all), vec!["f-legacy"]);
    }

    #[test]
    fn proxy_counts_by_injected_revision_skip_terminating_pods() {
        let p = |rev: &str, terminating: bool| {
            Arc::new(PodView {
                namespace: "a".into(),
                name: "p".into(),
                revision: rev.into(),
                workload: None,
                terminating,
                ready: true,
                ready_since_ms: None,
                created_ms: None,
                rev_label: None,
            })
        };
        let pods = vec![
            p("1-27", false),
            p("1-27", true),
            p("1-28", false),
            p("1-26", false),
        ];
        let c = proxy_counts(&spec(), &pods);
        assert_eq!((c.old, c.new, c.other), (1, 1, 1));
        assert_eq!(proxies_by_revision(&pods).get("1-27"), Some(&1));
    }
}
