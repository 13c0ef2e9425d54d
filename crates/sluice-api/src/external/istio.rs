//! Istio helpers: revision-tag MutatingWebhookConfigurations (`istio-revision-tag-<tag>`,
//! labelled `istio.io/tag` and `istio.io/rev`), the injector's `sidecar.istio.io/status` pod
//! annotation, and namespace injection labels.
//!
//! Owns naming and pure parsing. Never writes a webhook, label or pod.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Prefix of a revision tag's webhook name.
pub const REVISION_TAG_WEBHOOK_PREFIX: &str = "istio-revision-tag-";
/// Label naming the tag on a revision-tag webhook.
pub const TAG_LABEL: &str = "istio.io/tag";
/// Label naming the revision (on a tag webhook), or the revision/tag a namespace injects with.
pub const REV_LABEL: &str = "istio.io/rev";
/// Legacy namespace injection label (`enabled` ignores `istio.io/rev`).
pub const INJECTION_LABEL: &str = "istio-injection";
/// Pod annotation the injector writes, JSON with a `revision` field.
pub const SIDECAR_STATUS_ANNOTATION: &str = "sidecar.istio.io/status";
/// Pod annotation recent injectors also write with the injecting revision.
pub const REV_ANNOTATION: &str = "istio.io/rev";

/// The webhook name of revision tag `tag`.
pub fn revision_tag_webhook_name(tag: &str) -> String {
    format!("{REVISION_TAG_WEBHOOK_PREFIX}{tag}")
}

/// A revision tag as its webhook declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionTag {
    /// The tag (e.g. `stable`).
    pub tag: String,
    /// The revision it points to (e.g. `1-27`).
    pub revision: String,
}

impl RevisionTag {
    /// Reads a tag from its webhook: the name must be `istio-revision-tag-<tag>`, the
    /// `istio.io/tag` label (when present) must equal `<tag>`, and `istio.io/rev` names the
    /// revision. `None` for any other webhook.
    pub fn from_webhook(w: &MutatingWebhookConfiguration) -> Option<Self> {
        let name = w.metadata.name.as_deref()?;
        let tag = name.strip_prefix(REVISION_TAG_WEBHOOK_PREFIX)?;
        let labels = w.metadata.labels.as_ref()?;
        if labels.get(TAG_LABEL).is_some_and(|t| t != tag) {
            return None;
        }
        let revision = labels.get(REV_LABEL)?;
        Some(Self {
            tag: tag.to_owned(),
            revision: revision.clone(),
        })
    }
}

/// The injector's `sidecar.istio.io/status` annotation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SidecarStatus {
    /// The revision that injected the pod (absent in very old injectors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Injected init containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<String>>,
    /// Injected containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<String>>,
    /// Unmodelled fields (volumes, imagePullSecrets, ...).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// Why an injector annotation could not be read.
#[derive(Clone, Debug, PartialEq, Eq, strum::IntoStaticStr)]
pub enum SidecarStatusError {
    /// The annotation is not valid JSON of the expected shape.
    #[strum(serialize = "MalformedSidecarStatus")]
    Malformed(String),
}

impl SidecarStatusError {
    /// A bounded category for metrics labels and Event reasons.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for SidecarStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SidecarStatusError::Malformed(e) => write!(
                f,
                "pod annotation {SIDECAR_STATUS_ANNOTATION} is not the injector's JSON ({e}); the pod is counted as revision unknown"
            ),
        }
    }
}

impl std::error::Error for SidecarStatusError {}

/// Parses the `sidecar.istio.io/status` annotation value.
pub fn parse_sidecar_status(value: &str) -> Result<SidecarStatus, SidecarStatusError> {
    serde_json::from_str(value).map_err(|e| SidecarStatusError::Malformed(e.to_string()))
}

/// The revision the injector recorded for a pod, from its annotations: the
/// `sidecar.istio.io/status` JSON's `revision`, else the `istio.io/rev` annotation. `Ok(None)`
/// for a pod without a sidecar.
pub fn injected_revision(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<String>, SidecarStatusError> {
    if let Some(v) = annotations.get(SIDECAR_STATUS_ANNOTATION) {
        let status = parse_sidecar_status(v)?;
        if let Some(r) = status.revision.filter(|r| !r.is_empty()) {
            return Ok(Some(r));
        }
    }
    Ok(annotations
        .get(REV_ANNOTATION)
        .filter(|r| !r.is_empty())
        .cloned())
}

/// How a namespace selects sidecar injection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceInjection {
    /// `istio-injection=enabled`: the default revision injects, `istio.io/rev` is ignored.
    LegacyEnabled,
    /// `istio.io/rev=<value>` (a tag or a revision).
    Revision(String),
    /// Neither (or `istio-injection=disabled`).
    None,
}

/// Classifies a namespace's labels.
pub fn namespace_injection(labels: &BTreeMap<String, String>) -> NamespaceInjection {
    match labels.get(INJECTION_LABEL).map(String::as_str) {
        Some("enabled") => NamespaceInjection::LegacyEnabled,
        Some(_) => NamespaceInjection::None,
        None => labels.get(REV_LABEL).map_or(NamespaceInjection::None, |r| {
            NamespaceInjection::Revision(r.clone())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn webhook(name: &str, labels: &[(&str, &str)]) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            webhooks: None,
        }
    }

    #[test]
    fn revision_tag_table() {
        let ok = Some(RevisionTag {
            tag: "stable".into(),
            revision: "1-27".into(),
        });
        let cases = [
            (
                webhook(
                    "istio-revision-tag-stable",
                    &[(TAG_LABEL, "stable"), (REV_LABEL, "1-27")],
                ),
                ok.clone(),
            ),
            (
                webhook("istio-revision-tag-stable", &[(REV_LABEL, "1-27")]),
                ok,
            ),
            (
                webhook(
                    "istio-revision-tag-stable",
                    &[(TAG_LABEL, "canary"), (REV_LABEL, "1-28")],
                ),
                None,
            ),
            (
                webhook("istio-revision-tag-stable", &[(TAG_LABEL, "stable")]),
                None,
            ),
            (
                webhook("istio-sidecar-injector-1-27", &[(REV_LABEL, "1-27")]),
                None,
            ),
        ];
        for (w, want) in cases {
            assert_eq!(RevisionTag::from_webhook(&w), want, "{:?}", w.metadata);
        }
        assert_eq!(
            revision_tag_webhook_name("canary"),
            "istio-revision-tag-canary"
        );
    }

    #[test]
    fn injected_revision_table() {
        let status = r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null,"revision":"1-28"}"#;
        type Case<'a> = (Vec<(&'a str, &'a str)>, Result<Option<&'a str>, &'a str>);
        let cases: Vec<Case> = vec![
            (vec![(SIDECAR_STATUS_ANNOTATION, status)], Ok(Some("1-28"))),
            (
                vec![
                    (SIDECAR_STATUS_ANNOTATION, status),
                    (REV_ANNOTATION, "1-27"),
                ],
                Ok(Some("1-28")),
            ),
            (
                vec![
                    (
                        SIDECAR_STATUS_ANNOTATION,
                        r#"{"containers":["istio-proxy"]}"#,
                    ),
                    (REV_ANNOTATION, "1-27"),
                ],
                Ok(Some("1-27")),
            ),
            (vec![(REV_ANNOTATION, "1-27")], Ok(Some("1-27"))),
            (vec![], Ok(None)),
            (
                vec![(SIDECAR_STATUS_ANNOTATION, "not json")],
                Err("MalformedSidecarStatus"),
            ),
        ];
        for (ann, want) in cases {
            let map: BTreeMap<String, String> = ann
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let got = injected_revision(&map);
            match want {
                Ok(r) => assert_eq!(got.unwrap().as_deref(), r, "{ann:?}"),
                Err(cat) => assert_eq!(got.unwrap_err().category(), cat, "{ann:?}"),
            }
        }
        let parsed = parse_sidecar_status(status).unwrap();
        assert_eq!(
            serde_json::to_value(&parsed).unwrap(),
            serde_json::from_str::<Value>(status).unwrap(),
            "unmodelled fields are kept"
        );
    }

    #[test]
    fn namespace_injection_table() {
        let cases: &[(&[(&str, &str)], NamespaceInjection)] = &[
            (
                &[(INJECTION_LABEL, "enabled")],
                NamespaceInjection::LegacyEnabled,
            ),
            (
                &[(INJECTION_LABEL, "enabled"), (REV_LABEL, "canary")],
                NamespaceInjection::LegacyEnabled,
            ),
            (
                &[(INJECTION_LABEL, "disabled"), (REV_LABEL, "canary")],
                NamespaceInjection::None,
            ),
            (
                &[(REV_LABEL, "stable")],
                NamespaceInjection::Revision("stable".into()),
            ),
            (&[], NamespaceInjection::None),
        ];
        for (labels, want) in cases {
            let map: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(&namespace_injection(&map), want, "{labels:?}");
        }
    }
}
