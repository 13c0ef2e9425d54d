//! The parts of Argo CD's `Application` and `ApplicationSet` (argoproj.io/v1alpha1) that the
//! simulation reads, with Argo CD's field names. Objects are handled as `DynamicObject`s; these
//! structs are lenient views (unknown fields ignored, everything defaulted) of `spec` and
//! `operation`. This module only declares shapes and constants; it must never do I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// API group of Argo CD's kinds.
pub const GROUP: &str = "argoproj.io";
/// API version of Argo CD's kinds.
pub const VERSION: &str = "v1alpha1";
/// Label marking a cluster Secret.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// Annotation tracking (Argo CD v3's default): `<app>:<group>/<kind>:<namespace>/<name>`.
pub const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Field manager of every write to destination clusters.
pub const FIELD_MANAGER: &str = "argocd-controller";
/// Field manager of the ApplicationSet controller's writes of Applications.
pub const APPSET_FIELD_MANAGER: &str = "argocd-applicationset-controller";
/// Finalizer that makes deleting an Application delete its resources (cascade).
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
/// Background variant of [`RESOURCES_FINALIZER`].
pub const RESOURCES_FINALIZER_BACKGROUND: &str =
    "resources-finalizer.argocd.argoproj.io/background";
/// Annotation asking the ApplicationSet controller to regenerate now; removed once done.
pub const APPSET_REFRESH_ANNOTATION: &str = "argocd.argoproj.io/application-set-refresh";
/// Per-resource sync wave annotation (integer, default 0).
pub const SYNC_WAVE_ANNOTATION: &str = "argocd.argoproj.io/sync-wave";
/// Per-resource sync options annotation (`Prune=false`, ...).
pub const SYNC_OPTIONS_ANNOTATION: &str = "argocd.argoproj.io/sync-options";
/// Per-resource compare options annotation (`IgnoreExtraneous`, ...).
pub const COMPARE_OPTIONS_ANNOTATION: &str = "argocd.argoproj.io/compare-options";
/// Annotation asking for a refresh of one Application (`normal` or `hard`); removed once done.
pub const APP_REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

/// `Application.spec` (the fields simulated).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ApplicationSpec {
    /// AppProject name (not enforced: every Application behaves as in `default`).
    pub project: String,
    /// The single source.
    pub source: Option<ApplicationSource>,
    /// Multiple sources (not simulated: reported as InvalidSpecError).
    pub sources: Vec<ApplicationSource>,
    /// Where the manifests go.
    pub destination: Destination,
    /// Sync policy.
    pub sync_policy: Option<SyncPolicy>,
    /// Differences ignored when comparing.
    pub ignore_differences: Vec<IgnoreDifference>,
    /// How many history entries to keep (default 10).
    pub revision_history_limit: Option<i64>,
}

/// `spec.source`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ApplicationSource {
    /// Git URL (local path or `file://`) or `oci://host/repository`.
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    /// Directory inside the repository or bundle.
    pub path: String,
    /// Branch, tag, commit sha, `HEAD` (git) or tag/digest (OCI).
    pub target_revision: String,
    /// Directory source options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directory: Option<DirectorySource>,
}

/// `spec.source.directory`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DirectorySource {
    /// Read subdirectories too.
    pub recurse: bool,
}

/// `spec.destination`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Destination {
    /// Cluster name (the cluster Secret's `name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Cluster API server URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Namespace for namespaced objects that do not set one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `spec.syncPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyncPolicy {
    /// Automated sync; absent means manual.
    pub automated: Option<Automated>,
    /// Sync options (`ApplyOutOfSyncOnly=true`, `ServerSideApply=true`, ...).
    pub sync_options: Vec<String>,
}

/// `spec.syncPolicy.automated`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Automated {
    /// `false` turns automation off while keeping the settings; absent means on.
    pub enabled: Option<bool>,
    /// Delete tracked resources no longer in the source.
    pub prune: bool,
    /// Sync again when the live state drifts from the same revision.
    pub self_heal: bool,
    /// Allow a sync that would leave the Application with no resources.
    pub allow_empty: bool,
}

/// One `spec.ignoreDifferences` entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IgnoreDifference {
    /// API group ("" for core).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Object name; empty matches every name.
    pub name: String,
    /// Object namespace; empty matches every namespace.
    pub namespace: String,
    /// RFC 6901 pointers.
    pub json_pointers: Vec<String>,
    /// jq paths; only simple paths (`.a.b`, `.a["b"]`, `.a[0]`) are supported.
    pub jq_path_expressions: Vec<String>,
    /// Fields owned by these managers (live object's managedFields) are ignored.
    pub managed_fields_managers: Vec<String>,
}

/// The top-level `operation` field (a requested operation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Operation {
    /// A sync operation.
    pub sync: Option<SyncOperation>,
    /// Who asked.
    pub initiated_by: Option<Value>,
}

/// `operation.sync`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyncOperation {
    /// Revision to sync to; the source's targetRevision when empty.
    pub revision: String,
    /// Prune tracked resources no longer in the source.
    pub prune: bool,
    /// Sync options of this operation (added to the Application's).
    pub sync_options: Vec<String>,
    /// Sync only these resources (all when empty).
    pub resources: Vec<SyncOperationResource>,
}

/// `operation.sync.resources[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyncOperationResource {
    /// Group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// Whether a sync option list holds `Name=true`.
pub fn has_option(options: &[String], name: &str) -> bool {
    options.iter().any(|o| {
        o.split_once('=')
            .is_some_and(|(k, v)| k.trim() == name && v.trim().eq_ignore_ascii_case("true"))
    })
}

/// `ApplicationSet.spec` (the fields simulated).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ApplicationSetSpec {
    /// Generators; their parameter sets are concatenated.
    pub generators: Vec<Generator>,
    /// The Application template (`metadata` and `spec`), kept as JSON for rendering.
    pub template: Value,
    /// `{{.name}}` Go-template syntax instead of `{{name}}`.
    pub go_template: bool,
    /// Policy of this ApplicationSet.
    pub sync_policy: Option<AppSetSyncPolicy>,
    /// Fields of generated Applications the controller leaves as they are.
    pub ignore_application_differences: Vec<ApplicationMatchExpression>,
}

/// `spec.syncPolicy` of an ApplicationSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AppSetSyncPolicy {
    /// `create-only`, `create-update`, `create-delete` or `sync` (default).
    pub applications_sync: Option<String>,
    /// Generated Applications get no resources finalizer, so deleting them keeps their resources.
    pub preserve_resources_on_deletion: bool,
}

/// One `spec.ignoreApplicationDifferences` entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ApplicationMatchExpression {
    /// Application name; empty matches all.
    pub name: String,
    /// RFC 6901 pointers into the Application.
    pub json_pointers: Vec<String>,
    /// Simple jq paths into the Application.
    pub jq_path_expressions: Vec<String>,
}

/// One `spec.generators[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Generator {
    /// The cluster generator.
    pub clusters: Option<ClusterGenerator>,
    /// The clusterDecisionResource generator.
    pub cluster_decision_resource: Option<DuckGenerator>,
    /// Other generators are kept so an unsupported one is reported, not ignored.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `generators[].clusters`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterGenerator {
    /// Label selector over cluster Secrets.
    pub selector: LabelSelector,
    /// Extra parameters `values.<k>`.
    pub values: BTreeMap<String, String>,
    /// Template override merged over the ApplicationSet's template.
    pub template: Option<Value>,
}

/// `generators[].clusterDecisionResource`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DuckGenerator {
    /// ConfigMap (in the Argo CD namespace) giving apiVersion, kind, statusListKey, matchKey.
    pub config_map_ref: String,
    /// Name of the decision resource (or use `labelSelector`).
    pub name: String,
    /// Label selector of decision resources (or use `name`).
    pub label_selector: LabelSelector,
    /// Extra parameters `values.<k>`.
    pub values: BTreeMap<String, String>,
    /// Requeue period (not used: the simulation requeues every resync).
    pub requeue_after_seconds: Option<i64>,
    /// Template override merged over the ApplicationSet's template.
    pub template: Option<Value>,
}

/// A Kubernetes label selector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    /// Exact matches.
    pub match_labels: BTreeMap<String, String>,
    /// Expressions.
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One selector expression.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    /// Values for `In`/`NotIn`.
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether the selector selects nothing in particular (matches everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => !value.is_some_and(|v| e.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }

    /// The selector in the `?labelSelector=` query syntax.
    pub fn to_query(&self) -> String {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for e in &self.match_expressions {
            parts.push(match e.operator.as_str() {
                "In" => format!("{} in ({})", e.key, e.values.join(",")),
                "NotIn" => format!("{} notin ({})", e.key, e.values.join(",")),
                "Exists" => e.key.clone(),
                _ => format!("!{}", e.key),
            });
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_like_kubernetes() {
        let labels: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())]
            .into_iter()
            .collect();
        let sel = |json: Value| -> LabelSelector { serde_json::from_value(json).unwrap() };
        let cases = [
            (serde_json::json!({}), true),
            (serde_json::json!({"matchLabels": {"env": "prod"}}), true),
            (serde_json::json!({"matchLabels": {"env": "dev"}}), false),
            (
                serde_json::json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]}),
                true,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}),
                false,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
                false,
            ),
        ];
        for (json, want) in cases {
            assert_eq!(sel(json.clone()).matches(&labels), want, "{json}");
        }
    }

    #[test]
    fn sync_options_are_read_as_argo_cd_does() {
        let opts = vec![
            "ApplyOutOfSyncOnly=true".to_string(),
            "ServerSideApply=false".to_string(),
        ];
        assert!(has_option(&opts, "ApplyOutOfSyncOnly"));
        assert!(!has_option(&opts, "ServerSideApply"));
        assert!(!has_option(&opts, "RespectIgnoreDifferences"));
    }
}
