//! Argo CD's resource tracking on the objects revert writes, so an object the bad change deleted
//! and revert recreated is reported by Argo CD as the Application's (Synced once Git agrees)
//! and the pin can release.
//!
//! Mirrors Argo CD v3 (`util/argo/resource_tracking.go`, `util/settings/settings.go`): the
//! method is `argocd-cm`'s `application.resourceTrackingMethod` (`annotation` when absent,
//! `label`, `annotation+label`); the annotation `argocd.argoproj.io/tracking-id` holds
//! `<instance>:<group>/<kind>:<namespace>/<name>` (the namespace defaults to the Application's
//! destination namespace); the label (`application.instanceLabelKey`, default
//! `app.kubernetes.io/instance`) holds the instance name, truncated to 63 characters only with
//! `annotation+label`; `installationID` adds `argocd.argoproj.io/installation-id`. The instance
//! name is the Application's name, or `<namespace>_<name>` outside Argo CD's namespace.
//!
//! Pure: reads no ConfigMap (the reconcile passes its data) and writes nothing.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Argo CD's settings ConfigMap.
pub const ARGOCD_CM: &str = "argocd-cm";
/// The tracking annotation.
pub const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// The installation id annotation.
pub const INSTALLATION_ANNOTATION: &str = "argocd.argoproj.io/installation-id";
/// Default instance label key.
pub const DEFAULT_LABEL_KEY: &str = "app.kubernetes.io/instance";
/// Kubernetes' label value limit.
const LABEL_MAX: usize = 63;

/// How Argo CD tracks resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// `argocd.argoproj.io/tracking-id` (v3's default).
    #[default]
    Annotation,
    /// The instance label only.
    Label,
    /// Both.
    AnnotationAndLabel,
}

/// Argo CD's tracking settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracking {
    /// The method.
    pub method: Method,
    /// The instance label key.
    pub label_key: String,
    /// `installationID`, when set.
    pub installation_id: Option<String>,
    /// Argo CD's namespace (the controller's).
    pub controller_namespace: String,
}

impl Tracking {
    /// From `argocd-cm`'s data (`None`: the ConfigMap is absent, so Argo CD's defaults).
    pub fn from_config(
        data: Option<&BTreeMap<String, String>>,
        controller_namespace: &str,
    ) -> Self {
        let get = |k: &str| {
            data.and_then(|d| d.get(k))
                .map(String::as_str)
                .filter(|v| !v.is_empty())
        };
        Tracking {
            method: match get("application.resourceTrackingMethod") {
                Some("label") => Method::Label,
                Some("annotation+label") => Method::AnnotationAndLabel,
                _ => Method::Annotation,
            },
            label_key: get("application.instanceLabelKey")
                .unwrap_or(DEFAULT_LABEL_KEY)
                .to_owned(),
            installation_id: get("installationID").map(str::to_owned),
            controller_namespace: controller_namespace.to_owned(),
        }
    }

    /// The instance name of Application `namespace/name`.
    pub fn instance(&self, namespace: &str, name: &str) -> String {
        if namespace.is_empty() || namespace == self.controller_namespace {
            name.to_owned()
        } else {
            format!("{namespace}_{name}")
        }
    }

    /// Adds the Application's tracking to `object` (a bundle object about to be written);
    /// `default_ns` is the Application's destination namespace.
    pub fn stamp(
        &self,
        object: &mut Value,
        app_namespace: &str,
        app_name: &str,
        default_ns: Option<&str>,
    ) {
        let instance = self.instance(app_namespace, app_name);
        let (group, kind) = {
            let api_version = object["apiVersion"].as_str().unwrap_or_default();
            let group = api_version
                .rsplit_once('/')
                .map_or("", |(g, _)| g)
                .to_owned();
            (
                group,
                object["kind"].as_str().unwrap_or_default().to_owned(),
            )
        };
        let ns = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .or(default_ns)
            .unwrap_or_default()
            .to_owned();
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
            return;
        };
        if matches!(self.method, Method::Annotation | Method::AnnotationAndLabel) {
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            annotations[TRACKING_ANNOTATION] =
                json!(format!("{instance}:{group}/{kind}:{ns}/{name}"));
            if let Some(id) = &self.installation_id {
                annotations[INSTALLATION_ANNOTATION] = json!(id);
            }
        }
        let label = match self.method {
            Method::Annotation => None,
            Method::Label => Some(instance.clone()),
            Method::AnnotationAndLabel => Some(truncate_label(&instance)),
        };
        if let Some(label) = label {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            labels[self.label_key.as_str()] = json!(label);
        }
    }
}

/// Argo CD's `TruncateLabel`: at most 63 characters, ending alphanumerically.
fn truncate_label(v: &str) -> String {
    if v.len() <= LABEL_MAX {
        return v.to_owned();
    }
    let mut out: String = v.chars().take(LABEL_MAX).collect();
    while out
        .chars()
        .last()
        .is_some_and(|c| !c.is_ascii_alphanumeric())
    {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Value {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "checkout"}})
    }

    #[test]
    fn settings_default_to_annotation_tracking() {
        let t = Tracking::from_config(None, "argocd");
        assert_eq!(t.method, Method::Annotation);
        assert_eq!(t.label_key, DEFAULT_LABEL_KEY);
        let data: BTreeMap<String, String> = [
            ("application.resourceTrackingMethod", "annotation+label"),
            (
                "application.instanceLabelKey",
                "argocd.argoproj.io/instance",
            ),
            ("installationID", "site-east"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let t = Tracking::from_config(Some(&data), "argocd");
        assert_eq!(t.method, Method::AnnotationAndLabel);
        assert_eq!(t.label_key, "argocd.argoproj.io/instance");
        assert_eq!(t.installation_id.as_deref(), Some("site-east"));
    }

    #[test]
    fn stamps_what_argo_cd_writes() {
        let table: [(&str, Method, &str, Value); 3] = [
            (
                "annotation, Application in Argo CD's namespace, destination namespace",
                Method::Annotation,
                "argocd",
                json!({"annotations": {TRACKING_ANNOTATION: "mesh-c1:gateway.networking.k8s.io/HTTPRoute:shop/checkout"}}),
            ),
            (
                "label, Application in another namespace",
                Method::Label,
                "teams",
                json!({"labels": {DEFAULT_LABEL_KEY: "teams_mesh-c1"}}),
            ),
            (
                "both",
                Method::AnnotationAndLabel,
                "argocd",
                json!({
                    "annotations": {TRACKING_ANNOTATION: "mesh-c1:gateway.networking.k8s.io/HTTPRoute:shop/checkout"},
                    "labels": {DEFAULT_LABEL_KEY: "mesh-c1"}
                }),
            ),
        ];
        for (name, method, app_ns, want) in table {
            let t = Tracking {
                method,
                ..Tracking::from_config(None, "argocd")
            };
            let mut o = route();
            t.stamp(&mut o, app_ns, "mesh-c1", Some("shop"));
            let mut meta = o["metadata"].clone();
            meta.as_object_mut().unwrap().remove("name");
            assert_eq!(meta, want, "{name}");
        }
    }

    #[test]
    fn labels_are_truncated_as_argo_cd_does() {
        let long = format!("{}-{}", "a".repeat(62), "b");
        assert_eq!(truncate_label(&long), "a".repeat(62));
        assert_eq!(truncate_label("short"), "short");
    }
}
