//! Istio sidecar injection, decided and applied the way the injector webhook does it: which
//! revision (if any) injects a pod, from the namespace labels, the pod's own labels and the
//! revision-tag webhooks; and the mutation that records that revision where current Istio
//! records it. Pure. In a real cluster Istio's webhook does this at admission; here the simulated
//! workload controllers are the pod creators, so they apply it when they create a pod. Never
//! labels a pod with `istio.io/rev` (current injectors do not).

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use std::collections::{BTreeMap, BTreeSet};

/// Namespace label naming a revision or revision tag.
pub const REV_LABEL: &str = "istio.io/rev";
/// Namespace label `enabled`/`disabled` (the default revision; ignores `istio.io/rev`).
pub const INJECTION_LABEL: &str = "istio-injection";
/// Pod label or annotation opting a pod in or out.
pub const INJECT_POD_KEY: &str = "sidecar.istio.io/inject";
/// Pod annotation the injector writes (JSON with the injecting `revision`).
pub const STATUS_ANNOTATION: &str = "sidecar.istio.io/status";
/// Webhook label naming a tag.
pub const TAG_LABEL: &str = "istio.io/tag";
/// Name prefix of a revision tag's MutatingWebhookConfiguration.
pub const TAG_WEBHOOK_PREFIX: &str = "istio-revision-tag-";
/// Name (or name prefix, `-<revision>`) of a revision's own injector webhook.
pub const REVISION_WEBHOOK_PREFIX: &str = "istio-sidecar-injector";
/// The revision and tag that `istio-injection=enabled` means.
pub const DEFAULT_TAG: &str = "default";
/// Containers, init containers and volumes the injector adds (recorded in the status annotation).
pub const INIT_CONTAINERS: &[&str] = &["istio-init"];
/// See [`INIT_CONTAINERS`].
pub const CONTAINERS: &[&str] = &["istio-proxy"];
/// See [`INIT_CONTAINERS`].
pub const VOLUMES: &[&str] = &[
    "workload-socket",
    "credential-socket",
    "workload-certs",
    "istio-envoy",
    "istio-data",
    "istio-podinfo",
    "istio-token",
    "istiod-ca-cert",
];

/// The injector webhooks installed in a cluster: tags and the revisions they point to, and
/// revisions with their own injector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Webhooks {
    /// Tag name → revision (from `istio-revision-tag-<tag>`, label `istio.io/rev`).
    pub tags: BTreeMap<String, String>,
    /// Revisions with their own injector (`istio-sidecar-injector[-<rev>]`).
    pub revisions: BTreeSet<String>,
}

impl Webhooks {
    /// Reads the tags and revisions from MutatingWebhookConfigurations, as istioctl and the Istio
    /// charts write them. A tag webhook without an `istio.io/rev` label is ignored.
    pub fn from_configurations(mwcs: &[MutatingWebhookConfiguration]) -> Self {
        let mut out = Webhooks::default();
        for mwc in mwcs {
            let name = mwc.metadata.name.as_deref().unwrap_or_default();
            let labels = mwc.metadata.labels.clone().unwrap_or_default();
            let rev = labels.get(REV_LABEL).cloned();
            if let Some(tag) = name.strip_prefix(TAG_WEBHOOK_PREFIX) {
                if let Some(rev) = rev {
                    let tag = labels
                        .get(TAG_LABEL)
                        .cloned()
                        .unwrap_or_else(|| tag.to_string());
                    out.tags.insert(tag, rev);
                }
            } else if let Some(rest) = name.strip_prefix(REVISION_WEBHOOK_PREFIX) {
                let from_name = rest.strip_prefix('-').unwrap_or(DEFAULT_TAG);
                let from_name = if from_name.is_empty() {
                    DEFAULT_TAG
                } else {
                    from_name
                };
                out.revisions
                    .insert(rev.unwrap_or_else(|| from_name.to_string()));
            }
        }
        out
    }

    /// The revision a tag or revision name resolves to: a tag first, then a revision's own
    /// injector.
    pub fn resolve(&self, name: &str) -> Option<&str> {
        self.tags
            .get(name)
            .map(String::as_str)
            .or_else(|| self.revisions.get(name).map(String::as_str))
    }
}

/// Why a pod is not injected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The pod opted out (`sidecar.istio.io/inject: "false"`).
    PodOptOut,
    /// The namespace says `istio-injection=disabled`.
    NamespaceDisabled,
    /// Neither namespace nor pod selects a revision.
    NotSelected,
    /// A revision or tag was selected, but no injector webhook serves it.
    NoWebhook(String),
}

/// The injection decision for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Inject with this revision.
    Inject(String),
    /// Leave the pod alone.
    Skip(Skip),
}

/// Decides like Istio's webhooks select pods: `istio-injection=enabled` on the namespace means
/// the default tag (and wins over `istio.io/rev`); otherwise the pod's `istio.io/rev` label, then
/// the namespace's, names a tag or revision; a pod `sidecar.istio.io/inject=true` label alone means
/// the default tag; `sidecar.istio.io/inject=false` (label or annotation) always opts out.
pub fn decide(
    namespace_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
    webhooks: &Webhooks,
) -> Decision {
    let pod_says = pod_labels
        .get(INJECT_POD_KEY)
        .or_else(|| pod_annotations.get(INJECT_POD_KEY))
        .map(String::as_str);
    if pod_says == Some("false") {
        return Decision::Skip(Skip::PodOptOut);
    }
    let selected = match namespace_labels.get(INJECTION_LABEL).map(String::as_str) {
        Some("disabled") => return Decision::Skip(Skip::NamespaceDisabled),
        Some("enabled") => DEFAULT_TAG.to_string(),
        _ => match pod_labels
            .get(REV_LABEL)
            .or_else(|| namespace_labels.get(REV_LABEL))
        {
            Some(rev) => rev.clone(),
            None if pod_says == Some("true") => DEFAULT_TAG.to_string(),
            None => return Decision::Skip(Skip::NotSelected),
        },
    };
    match webhooks.resolve(&selected) {
        Some(rev) => Decision::Inject(rev.to_string()),
        None => Decision::Skip(Skip::NoWebhook(selected)),
    }
}

/// The `sidecar.istio.io/status` annotation value the injector writes for `revision`.
pub fn status_annotation(revision: &str) -> String {
    serde_json::json!({
        "initContainers": INIT_CONTAINERS,
        "containers": CONTAINERS,
        "volumes": VOLUMES,
        "imagePullSecrets": null,
        "revision": revision,
    })
    .to_string()
}

/// The injecting revision recorded on a pod (from `sidecar.istio.io/status`), if injected.
pub fn injected_revision(annotations: &BTreeMap<String, String>) -> Option<String> {
    /// The one field read; the rest of the annotation is skipped without being built.
    #[derive(serde::Deserialize)]
    struct Status {
        revision: Option<String>,
    }
    let raw = annotations.get(STATUS_ANNOTATION)?;
    serde_json::from_str::<Status>(raw).ok()?.revision
}

/// Mutates `pod` as the injector of `revision` would: status and `istio.io/rev` annotations,
/// `security.istio.io/tlsMode` and canonical-service labels, the `istio-init` init container, the
/// `istio-proxy` container and the sidecar volumes. Idempotent.
pub fn inject(pod: &mut Pod, revision: &str) {
    let meta = &mut pod.metadata;
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    let canonical_name = labels
        .get("service.istio.io/canonical-name")
        .or_else(|| labels.get("app.kubernetes.io/name"))
        .or_else(|| labels.get("app"))
        .cloned()
        .or_else(|| {
            meta.generate_name
                .clone()
                .map(|g| g.trim_end_matches('-').to_string())
        })
        .or_else(|| meta.name.clone())
        .unwrap_or_default();
    let canonical_rev = labels
        .get("service.istio.io/canonical-revision")
        .or_else(|| labels.get("app.kubernetes.io/version"))
        .or_else(|| labels.get("version"))
        .cloned()
        .unwrap_or_else(|| "latest".to_string());
    labels.insert("security.istio.io/tlsMode".into(), "istio".into());
    labels.insert("service.istio.io/canonical-name".into(), canonical_name);
    labels.insert("service.istio.io/canonical-revision".into(), canonical_rev);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(STATUS_ANNOTATION.into(), status_annotation(revision));
    annotations.insert(REV_LABEL.into(), revision.into());
    let spec = pod.spec.get_or_insert_with(Default::default);
    if let Some(first) = spec.containers.first() {
        annotations
            .entry("kubectl.kubernetes.io/default-container".into())
            .or_insert_with(|| first.name.clone());
    }
    let image = format!("istio/proxyv2:{revision}");
    let init = spec.init_containers.get_or_insert_with(Vec::new);
    if !init.iter().any(|c| c.name == "istio-init") {
        init.push(Container {
            name: "istio-init".into(),
            image: Some(image.clone()),
            args: Some(vec!["istio-iptables".into()]),
            ..Default::default()
        });
    }
    if !spec.containers.iter().any(|c| c.name == "istio-proxy") {
        spec.containers.push(Container {
            name: "istio-proxy".into(),
            image: Some(image),
            args: Some(vec!["proxy".into(), "sidecar".into()]),
            ..Default::default()
        });
    }
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for name in VOLUMES {
        if !volumes.iter().any(|v| v.name == *name) {
            volumes.push(Volume {
                name: (*name).into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn mwc(name: &str, labels: &[(&str, &str)]) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(map(labels)),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn world() -> Webhooks {
        Webhooks::from_configurations(&[
            mwc(
                "istio-revision-tag-stable",
                &[("istio.io/tag", "stable"), ("istio.io/rev", "1-27")],
            ),
            mwc(
                "istio-revision-tag-canary",
                &[("istio.io/tag", "canary"), ("istio.io/rev", "1-28")],
            ),
            mwc(
                "istio-revision-tag-default",
                &[("istio.io/tag", "default"), ("istio.io/rev", "1-27")],
            ),
            mwc("istio-sidecar-injector-1-27", &[("istio.io/rev", "1-27")]),
            mwc("istio-sidecar-injector-1-28", &[("istio.io/rev", "1-28")]),
            mwc("istio-revision-tag-broken", &[]),
            mwc("unrelated", &[("istio.io/rev", "9-99")]),
        ])
    }

    #[test]
    fn webhooks_are_read_like_istioctl_writes_them() {
        let w = world();
        assert_eq!(w.tags.get("stable").map(String::as_str), Some("1-27"));
        assert_eq!(w.tags.get("canary").map(String::as_str), Some("1-28"));
        assert!(!w.tags.contains_key("broken"));
        assert_eq!(
            w.revisions.iter().map(String::as_str).collect::<Vec<_>>(),
            vec!["1-27", "1-28"]
        );
        let only_default = Webhooks::from_configurations(&[mwc("istio-sidecar-injector", &[])]);
        assert_eq!(only_default.resolve("default"), Some("default"));
    }

    #[test]
    fn decision_table() {
        let w = world();
        let inject = |r: &str| Decision::Inject(r.to_string());
        // (namespace labels, pod labels, pod annotations, want)
        type Pairs<'a> = Vec<(&'a str, &'a str)>;
        let cases: Vec<(Pairs, Pairs, Pairs, Decision)> = vec![
            (
                vec![("istio.io/rev", "stable")],
                vec![],
                vec![],
                inject("1-27"),
            ),
            (
                vec![("istio.io/rev", "canary")],
                vec![],
                vec![],
                inject("1-28"),
            ),
            // A revision name works directly.
            (
                vec![("istio.io/rev", "1-28")],
                vec![],
                vec![],
                inject("1-28"),
            ),
            // istio-injection=enabled means the default tag and wins over istio.io/rev.
            (
                vec![("istio-injection", "enabled"), ("istio.io/rev", "canary")],
                vec![],
                vec![],
                inject("1-27"),
            ),
            (
                vec![("istio-injection", "disabled"), ("istio.io/rev", "canary")],
                vec![],
                vec![],
                Decision::Skip(Skip::NamespaceDisabled),
            ),
            // The pod's own istio.io/rev label overrides the namespace's.
            (
                vec![("istio.io/rev", "stable")],
                vec![("istio.io/rev", "canary")],
                vec![],
                inject("1-28"),
            ),
            (
                vec![("istio.io/rev", "stable")],
                vec![("sidecar.istio.io/inject", "false")],
                vec![],
                Decision::Skip(Skip::PodOptOut),
            ),
            (
                vec![("istio-injection", "enabled")],
                vec![],
                vec![("sidecar.istio.io/inject", "false")],
                Decision::Skip(Skip::PodOptOut),
            ),
            (
                vec![],
                vec![("sidecar.istio.io/inject", "true")],
                vec![],
                inject("1-27"),
            ),
            (vec![], vec![], vec![], Decision::Skip(Skip::NotSelected)),
            (
                vec![("istio.io/rev", "nightly")],
                vec![],
                vec![],
                Decision::Skip(Skip::NoWebhook("nightly".into())),
            ),
        ];
        for (ns, pod, ann, want) in cases {
            let got = decide(&map(&ns), &map(&pod), &map(&ann), &w);
            assert_eq!(got, want, "ns={ns:?} pod={pod:?} ann={ann:?}");
        }
    }

    #[test]
    fn inject_records_revision_like_the_injector() {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some("checkout-abc".into()),
                labels: Some(map(&[("app", "checkout"), ("version", "v2.14")])),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        inject(&mut pod, "1-28");
        inject(&mut pod, "1-28");
        let ann = pod.metadata.annotations.clone().unwrap();
        assert_eq!(injected_revision(&ann).as_deref(), Some("1-28"));
        assert_eq!(ann.get("istio.io/rev").map(String::as_str), Some("1-28"));
        let status: serde_json::Value = serde_json::from_str(&ann[STATUS_ANNOTATION]).unwrap();
        assert_eq!(status["containers"], serde_json::json!(["istio-proxy"]));
        assert_eq!(status["initContainers"], serde_json::json!(["istio-init"]));
        assert_eq!(status["volumes"].as_array().unwrap().len(), VOLUMES.len());
        let labels = pod.metadata.labels.clone().unwrap();
        assert!(
            !labels.contains_key("istio.io/rev"),
            "injector never labels istio.io/rev"
        );
        assert_eq!(labels["service.istio.io/canonical-name"], "checkout");
        assert_eq!(labels["service.istio.io/canonical-revision"], "v2.14");
        let spec = pod.spec.unwrap();
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["app", "istio-proxy"]);
        assert_eq!(spec.init_containers.unwrap().len(), 1);
        assert_eq!(spec.volumes.unwrap().len(), VOLUMES.len());
        assert_eq!(injected_revision(&BTreeMap::new()), None);
    }
}
