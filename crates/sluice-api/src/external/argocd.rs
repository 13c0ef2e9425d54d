//! Typed views of Argo CD `Application` and `ApplicationSet` (argoproj.io/v1alpha1, v3.5.1):
//! sources, destination, sync policy (incl. `automated.enabled`), operation, sync/health/operation
//! state, tracked resources; ApplicationSet generators (incl. clusterDecisionResource), sync
//! policy and `ignoreApplicationDifferences`.
//!
//! Owns lossless parsing and pure checks. Never decides a pin or a wave.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Extra, external_resource};

/// The API group of Argo CD.
pub const GROUP: &str = "argoproj.io";
/// Sync status Argo CD reports when live state equals the target revision.
pub const SYNC_STATUS_SYNCED: &str = "Synced";
/// Health status of a healthy Application.
pub const HEALTH_HEALTHY: &str = "Healthy";
/// `applicationsSync` value the WaveGate requires.
pub const APPLICATIONS_SYNC_CREATE_UPDATE: &str = "create-update";

/// An Argo CD Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Application {
    /// `argoproj.io/v1alpha1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `Application`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state.
    #[serde(default)]
    pub spec: ApplicationSpec,
    /// A requested or running operation (sync); removing it terminates a running sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
    /// Observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ApplicationStatus>,
    /// Unmodelled top-level fields.
    #[serde(flatten)]
    pub extra: Extra,
}

external_resource!(
    Application,
    "argoproj.io",
    "v1alpha1",
    "Application",
    "applications",
    k8s_openapi::NamespaceResourceScope
);

/// `spec` of an Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSpec {
    /// Argo CD project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Single source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ApplicationSource>,
    /// Multiple sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<ApplicationSource>>,
    /// Destination cluster and namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ApplicationDestination>,
    /// Sync policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_policy: Option<SyncPolicy>,
    /// Unmodelled fields (ignoreDifferences, info, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A source of manifests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSource {
    /// Repository URL; `oci://...` for an OCI source.
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    /// Tag, branch or digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<String>,
    /// Path in the repository (`.` for an OCI bundle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Helm chart name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
    /// Unmodelled fields (helm, kustomize, directory, plugin, ref, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ApplicationSource {
    /// Whether this is an OCI source (`repoURL` starts with `oci://`).
    pub fn is_oci(&self) -> bool {
        self.repo_url.starts_with("oci://")
    }
}

/// Destination of an Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationDestination {
    /// API server URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Cluster name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Target namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Sync policy of an Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicy {
    /// Automated sync; `enabled: false` turns it off while keeping prune/selfHeal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automated: Option<SyncPolicyAutomated>,
    /// Sync options (`RespectIgnoreDifferences=true`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_options: Option<Vec<String>>,
    /// Unmodelled fields (retry, managedNamespaceMetadata, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Automated sync settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicyAutomated {
    /// Whether automation is on; absent means on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Prune resources removed from the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<bool>,
    /// Revert live changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_heal: Option<bool>,
    /// Allow syncing to an empty source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_empty: Option<bool>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl SyncPolicy {
    /// Whether automated sync is active (present and not `enabled: false`).
    pub fn is_automated(&self) -> bool {
        self.automated
            .as_ref()
            .is_some_and(|a| a.enabled != Some(false))
    }
}

/// An operation on an Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// A sync operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncOperation>,
    /// Who started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiated_by: Option<OperationInitiator>,
    /// Unmodelled fields (retry, info).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A sync operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncOperation {
    /// Revision to sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Revisions to sync (multi-source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions: Option<Vec<String>>,
    /// Prune during the sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<bool>,
    /// Sync options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_options: Option<Vec<String>>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Who started an operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationInitiator {
    /// User name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Started by automation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automated: Option<bool>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status` of an Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    /// Sync state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncStatus>,
    /// Health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// Last or running operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_state: Option<OperationState>,
    /// Resources Argo CD tracks for the Application.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceStatus>>,
    /// Source type (Helm, Kustomize, Directory, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_type: Option<String>,
    /// Unmodelled fields (history, conditions, summary, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Sync state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    /// Synced, OutOfSync or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Revision compared (a digest for an OCI source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Revisions compared (multi-source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions: Option<Vec<String>>,
    /// Unmodelled fields (comparedTo).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Health.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    /// Healthy, Progressing, Degraded, Suspended, Missing or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// State of the last or running operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationState {
    /// Running, Terminating, Failed, Error or Succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Start time (RFC 3339, kept as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// End time (RFC 3339, kept as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The operation, kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Value>,
    /// Unmodelled fields (syncResult, retryCount).
    #[serde(flatten)]
    pub extra: Extra,
}

impl OperationState {
    /// Whether the operation is still running (Running or Terminating).
    pub fn is_running(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Running") | Some("Terminating"))
    }
}

/// A resource Argo CD tracks for an Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    /// API group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// API version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Sync status of the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Health of the resource, kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Value>,
    /// Unmodelled fields (hook, requiresPruning, syncWave, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl Application {
    /// The sources (`spec.source` or `spec.sources`).
    pub fn sources(&self) -> Vec<&ApplicationSource> {
        self.spec
            .source
            .iter()
            .chain(self.spec.sources.iter().flatten())
            .collect()
    }

    /// Whether every source is OCI (pins apply to OCI-sourced Applications only).
    pub fn is_oci_sourced(&self) -> bool {
        let s = self.sources();
        !s.is_empty() && s.iter().all(|s| s.is_oci())
    }

    /// `status.sync.revision`.
    pub fn synced_revision(&self) -> Option<&str> {
        self.status.as_ref()?.sync.as_ref()?.revision.as_deref()
    }

    /// Whether Argo CD reports the Application Synced at `revision`.
    pub fn is_synced_at(&self, revision: &str) -> bool {
        let Some(sync) = self.status.as_ref().and_then(|s| s.sync.as_ref()) else {
            return false;
        };
        sync.status.as_deref() == Some(SYNC_STATUS_SYNCED)
            && sync.revision.as_deref() == Some(revision)
    }

    /// Whether Argo CD reports the Application Healthy.
    pub fn is_healthy(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.health.as_ref())
            .and_then(|h| h.status.as_deref())
            == Some(HEALTH_HEALTHY)
    }
}

/// An Argo CD ApplicationSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSet {
    /// `argoproj.io/v1alpha1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `ApplicationSet`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state.
    #[serde(default)]
    pub spec: ApplicationSetSpec,
    /// Observed state, kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unmodelled top-level fields.
    #[serde(flatten)]
    pub extra: Extra,
}

external_resource!(
    ApplicationSet,
    "argoproj.io",
    "v1alpha1",
    "ApplicationSet",
    "applicationsets",
    k8s_openapi::NamespaceResourceScope
);

/// `spec` of an ApplicationSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetSpec {
    /// Generators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generators: Option<Vec<ApplicationSetGenerator>>,
    /// Sync policy of the generated Applications.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_policy: Option<ApplicationSetSyncPolicy>,
    /// Application fields the controller leaves alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_application_differences: Option<Vec<ApplicationSetResourceIgnoreDifferences>>,
    /// Whether templates are Go templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub go_template: Option<bool>,
    /// The Application template, kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Value>,
    /// Unmodelled fields (strategy, templatePatch, preservedFields, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// One generator (only clusterDecisionResource is modelled).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetGenerator {
    /// The Cluster Decision Resource generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_decision_resource: Option<DuckTypeGenerator>,
    /// Unmodelled generators (clusters, list, git, matrix, merge, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// The clusterDecisionResource generator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuckTypeGenerator {
    /// ConfigMap naming the duck type (apiVersion, kind = plural resource, statusListKey,
    /// matchKey).
    #[serde(default)]
    pub config_map_ref: String,
    /// Name of the decision resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Label selector of decision resources, kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<Value>,
    /// Re-read period, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_after_seconds: Option<i64>,
    /// Unmodelled fields (template, values).
    #[serde(flatten)]
    pub extra: Extra,
}

/// ApplicationSet sync policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetSyncPolicy {
    /// create-only, create-update, create-delete or sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applications_sync: Option<String>,
    /// Keep the Applications' resources when an Application is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_resources_on_deletion: Option<bool>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Application fields the ApplicationSet controller must not overwrite.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetResourceIgnoreDifferences {
    /// Application name this applies to; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// JSON pointers (e.g. `/spec/syncPolicy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_pointers: Option<Vec<String>>,
    /// jq path expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jq_path_expressions: Option<Vec<String>>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ApplicationSetResourceIgnoreDifferences {
    /// Whether this entry keeps the controller off `spec.syncPolicy.automated` (a JSON pointer
    /// or jq path to it, to `spec.syncPolicy`, or to the whole `spec`), whatever its `name`.
    pub fn covers_sync_policy(&self) -> bool {
        self.json_pointers
            .iter()
            .flatten()
            .any(|p| p == "/spec/syncPolicy" || p == "/spec/syncPolicy/automated" || p == "/spec")
            || self.jq_path_expressions.iter().flatten().any(|e| {
                e == ".spec.syncPolicy" || e == ".spec.syncPolicy.automated" || e == ".spec"
            })
    }
}

/// Why an ApplicationSet is unsafe to drive from a WaveGate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnsafeApplicationSet {
    /// `syncPolicy.applicationsSync` is not `create-update` (found value, if any).
    ApplicationsSync(Option<String>),
    /// `syncPolicy.preserveResourcesOnDeletion` is not true.
    ResourcesNotPreserved,
    /// No `ignoreApplicationDifferences` entry without a `name` covers `/spec/syncPolicy`, so
    /// the controller would undo revert's suspension of a generated Application's automated
    /// sync and revert refuses every pin (`ApplicationSetWouldRevert`).
    SyncPolicyNotIgnored,
    /// The Applications the ApplicationSet renders do not follow the WaveGate's decisions: the
    /// template's `targetRevision` or destination does not read the decision's parameters, a
    /// `templatePatch` may change them, or a RollingSync strategy syncs the Applications itself
    /// (what is wrong, for the message).
    TemplateNotFromDecisions(String),
}

impl std::fmt::Display for UnsafeApplicationSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnsafeApplicationSet::ApplicationsSync(found) => write!(
                f,
                "spec.syncPolicy.applicationsSync is {}; set it to create-update so an empty decision list never deletes Applications",
                found
                    .as_deref()
                    .map_or("unset".to_owned(), |v| format!("{v:?}"))
            ),
            UnsafeApplicationSet::ResourcesNotPreserved => write!(
                f,
                "spec.syncPolicy.preserveResourcesOnDeletion is not true; set it so deleting an Application never deletes its mesh configuration"
            ),
            UnsafeApplicationSet::SyncPolicyNotIgnored => write!(
                f,
                "spec.ignoreApplicationDifferences has no entry without a name covering /spec/syncPolicy; add {{jsonPointers: [\"/spec/syncPolicy\"]}} (no name) so revert can suspend a generated Application's automated sync when a halt pins it back (it refuses the pin otherwise: ApplicationSetWouldRevert)"
            ),
            UnsafeApplicationSet::TemplateNotFromDecisions(what) => f.write_str(what),
        }
    }
}

/// Whether a template string is exactly one action reading one of `params`: `{{.revision}}`
/// (Go templates, `{{- .revision -}}` too) or `{{revision}}` (Argo CD's fasttemplate, whose tag
/// is trimmed of spaces).
fn template_reads_only(s: &str, params: &[&str], go: bool) -> bool {
    let Some(inner) = s
        .trim()
        .strip_prefix("{{")
        .and_then(|r| r.strip_suffix("}}"))
    else {
        return false;
    };
    if inner.contains("{{") || inner.contains("}}") {
        return false;
    }
    let inner = if go {
        inner
            .trim()
            .trim_start_matches('-')
            .trim_end_matches('-')
            .trim()
    } else {
        inner.trim()
    };
    params.iter().any(|p| {
        if go {
            inner.strip_prefix('.') == Some(p)
        } else {
            inner == *p
        }
    })
}

impl ApplicationSet {
    /// The WaveGate's safety check: `applicationsSync: create-update`,
    /// `preserveResourcesOnDeletion: true`, and an `ignoreApplicationDifferences` entry without a
    /// name filter covering the sync policy of every generated Application (what revert needs
    /// to pin one). Returns every problem found.
    pub fn wave_gate_safety(&self) -> Vec<UnsafeApplicationSet> {
        let policy = self.spec.sync_policy.as_ref();
        let mut out = Vec::new();
        let sync = policy.and_then(|p| p.applications_sync.clone());
        if sync.as_deref() != Some(APPLICATIONS_SYNC_CREATE_UPDATE) {
            out.push(UnsafeApplicationSet::ApplicationsSync(sync));
        }
        if policy.and_then(|p| p.preserve_resources_on_deletion) != Some(true) {
            out.push(UnsafeApplicationSet::ResourcesNotPreserved);
        }
        if !self.ignores_sync_policy_of_all() {
            out.push(UnsafeApplicationSet::SyncPolicyNotIgnored);
        }
        out.extend(
            self.template_problems()
                .into_iter()
                .map(UnsafeApplicationSet::TemplateNotFromDecisions),
        );
        out
    }

    /// Whether the Applications this ApplicationSet renders follow the decisions: the
    /// template's (a clusterDecisionResource generator's own `template` wins field by field, as
    /// Argo CD merges it) `source.targetRevision` (every `sources[]` entry) is the decision's
    /// `revision` parameter alone, its destination is the decision's cluster (`destination.name`
    /// from `name` or `clusterName`, or `destination.server` from `server`, the parameters
    /// Argo CD's duck-type generator sets, `applicationset/generators/duck_type.go`), no
    /// `templatePatch` touches either, and the strategy is not RollingSync (which forces
    /// automated sync off and syncs the Applications step by step itself,
    /// `Progressive-Syncs.md`). One message per problem.
    pub fn template_problems(&self) -> Vec<String> {
        let go = self.spec.go_template == Some(true);
        let generator_template = self
            .spec
            .generators
            .iter()
            .flatten()
            .filter_map(|g| g.cluster_decision_resource.as_ref())
            .find_map(|c| c.extra.get("template"));
        let field = |pointer: &str| -> Option<&Value> {
            generator_template
                .and_then(|t| t.pointer(pointer))
                .filter(|v| !v.is_null() && v.as_str() != Some(""))
                .or_else(|| self.spec.template.as_ref().and_then(|t| t.pointer(pointer)))
                .filter(|v| !v.is_null() && v.as_str() != Some(""))
        };
        let reads = |v: Option<&Value>, params: &[&str]| -> bool {
            v.and_then(Value::as_str)
                .is_some_and(|s| template_reads_only(s, params, go))
        };
        let mut out = Vec::new();
        let sources: Vec<String> = match field("/spec/sources").and_then(Value::as_array) {
            Some(list) => (0..list.len())
                .map(|i| format!("/spec/sources/{i}/targetRevision"))
                .collect(),
            None => vec!["/spec/source/targetRevision".to_owned()],
        };
        let revision = if go { "{{.revision}}" } else { "{{revision}}" };
        for pointer in sources {
            let v = field(&pointer);
            if !reads(v, &["revision"]) {
                out.push(format!(
                    "the template's {} is {}, not the decision's revision ({revision}): the Applications would not follow the waves",
                    pointer.trim_start_matches('/').replace('/', "."),
                    v.map_or("unset".to_owned(), ToString::to_string)
                ));
            }
        }
        let name = field("/spec/destination/name");
        let server = field("/spec/destination/server");
        let by_name = reads(name, &["name", "clusterName"]);
        let by_server = name.is_none() && reads(server, &["server"]);
        if !(by_name || by_server) {
            let cluster = if go {
                "{{.clusterName}}"
            } else {
                "{{clusterName}}"
            };
            out.push(format!(
                "the template's destination ({}) is not the decision's cluster (destination.name {cluster}): an Application could land on a cluster the decision does not name",
                serde_json::json!({"name": name, "server": server})
            ));
        }
        if let Some(patch) = self.spec.extra.get("templatePatch") {
            let text = patch
                .as_str()
                .map_or_else(|| patch.to_string(), str::to_owned);
            if text.contains("targetRevision") || text.contains("destination") {
                out.push(
                    "spec.templatePatch sets targetRevision or destination, which the WaveGate cannot check; move them to the template".into(),
                );
            }
        }
        if self
            .spec
            .extra
            .get("strategy")
            .and_then(|s| s.get("type"))
            .and_then(Value::as_str)
            == Some("RollingSync")
        {
            out.push(
                "spec.strategy is RollingSync, which turns automated sync off on every generated Application and syncs them step by step itself, competing with the waves; remove the strategy (AllAtOnce)".into(),
            );
        }
        out
    }

    /// Whether an `ignoreApplicationDifferences` entry without a `name` covers the sync policy,
    /// i.e. of every Application the ApplicationSet generates, whatever its name.
    pub fn ignores_sync_policy_of_all(&self) -> bool {
        self.spec
            .ignore_application_differences
            .iter()
            .flatten()
            .filter(|d| d.name.is_none())
            .any(ApplicationSetResourceIgnoreDifferences::covers_sync_policy)
    }

    /// Whether `ignoreApplicationDifferences` keeps the controller off the generated
    /// Applications' sync policy (needed before revert suspends their automation), for the
    /// Application named `app`.
    pub fn ignores_sync_policy(&self, app: &str) -> bool {
        self.spec
            .ignore_application_differences
            .iter()
            .flatten()
            .filter(|d| d.name.as_deref().is_none_or(|n| n == app))
            .any(ApplicationSetResourceIgnoreDifferences::covers_sync_policy)
    }

    /// Names of the decision resources the clusterDecisionResource generators read.
    pub fn decision_resource_names(&self) -> Vec<&str> {
        self.spec
            .generators
            .iter()
            .flatten()
            .filter_map(|g| g.cluster_decision_resource.as_ref())
            .filter_map(|c| c.name.as_deref())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::roundtrip::assert_roundtrip;
    use serde_json::json;

    fn app() -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "mesh-eu-1", "namespace": "argocd", "labels": {"site": "eu"}, "finalizers": ["resources-finalizer.argocd.argoproj.io"]},
            "spec": {
                "project": "mesh",
                "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": "sha256:aaaa", "path": ".", "directory": {"recurse": true}},
                "destination": {"name": "eu-1", "namespace": "istio-config"},
                "syncPolicy": {
                    "automated": {"enabled": true, "prune": true, "selfHeal": true},
                    "syncOptions": ["RespectIgnoreDifferences=true", "ServerSideApply=true"],
                    "retry": {"limit": 5, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}},
                    "futurePolicyField": {"x": [1, 2]}
                },
                "ignoreDifferences": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "managedFieldsManagers": ["sluice-rollout-weights"]}],
                "revisionHistoryLimit": 3
            },
            "operation": {"sync": {"revision": "sha256:bbbb", "prune": true, "syncStrategy": {"hook": {}}}, "initiatedBy": {"automated": true}, "retry": {"limit": 1}},
            "status": {
                "sync": {"status": "Synced", "revision": "sha256:aaaa", "comparedTo": {"source": {"repoURL": "oci://registry.local:5000/mesh/config"}, "destination": {"name": "eu-1"}}},
                "health": {"status": "Healthy", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                "operationState": {"phase": "Running", "startedAt": "2026-01-01T00:00:00Z", "operation": {"sync": {"revision": "sha256:bbbb"}}, "syncResult": {"resources": []}, "retryCount": 0},
                "resources": [{"group": "gateway.networking.k8s.io", "version": "v1", "kind": "HTTPRoute", "namespace": "shop", "name": "checkout", "status": "Synced", "health": {"status": "Healthy"}, "syncWave": 1, "requiresPruning": false}],
                "sourceType": "Directory",
                "reconciledAt": "2026-01-01T00:00:01Z",
                "history": [{"id": 1, "revision": "sha256:aaaa", "deployedAt": "2026-01-01T00:00:00Z"}],
                "summary": {"images": []}
            }
        })
    }

    fn app_set() -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "ApplicationSet",
            "metadata": {"name": "mesh-config", "namespace": "argocd"},
            "spec": {
                "goTemplate": true,
                "goTemplateOptions": ["missingkey=error"],
                "generators": [
                    {"clusterDecisionResource": {"configMapRef": "sluice-wavegate-duck", "name": "eu-west", "requeueAfterSeconds": 30, "values": {"site": "eu"}}},
                    {"list": {"elements": [{"cluster": "x"}]}}
                ],
                "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
                "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}],
                "template": {"metadata": {"name": "mesh-{{.clusterName}}"}, "spec": {"project": "mesh", "source": {"repoURL": "oci://r/m", "targetRevision": "{{.revision}}", "path": "."}, "destination": {"name": "{{.clusterName}}"}}},
                "strategy": {"type": "AllAtOnce"}
            },
            "status": {"conditions": [{"type": "ResourcesUpToDate", "status": "True"}]}
        })
    }

    #[test]
    fn application_round_trips_unchanged() {
        let a: Application = assert_roundtrip(&app());
        assert!(a.is_oci_sourced());
        assert!(a.is_synced_at("sha256:aaaa"));
        assert!(!a.is_synced_at("sha256:bbbb"));
        assert!(a.is_healthy());
        assert!(a.spec.sync_policy.as_ref().unwrap().is_automated());
        assert!(
            a.status
                .as_ref()
                .unwrap()
                .operation_state
                .as_ref()
                .unwrap()
                .is_running()
        );
    }

    #[test]
    fn suspending_automation_keeps_everything_else() {
        let doc = app();
        let mut a: Application = serde_json::from_value(doc.clone()).unwrap();
        a.spec
            .sync_policy
            .as_mut()
            .unwrap()
            .automated
            .as_mut()
            .unwrap()
            .enabled = Some(false);
        a.operation = None;
        let mut want = doc;
        want["spec"]["syncPolicy"]["automated"]["enabled"] = json!(false);
        want.as_object_mut().unwrap().remove("operation");
        assert_eq!(serde_json::to_value(&a).unwrap(), want);
        assert!(!a.spec.sync_policy.unwrap().is_automated());
    }

    #[test]
    fn the_safety_check_covers_the_template_the_application_set_renders() {
        // (what changes, problems expected, words of the message)
        type Change = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(&str, Change, usize, &str)> = vec![
            ("as rendered from the decisions", Box::new(|_| {}), 0, ""),
            (
                "Go template with trim markers",
                Box::new(|d| {
                    d["spec"]["template"]["spec"]["source"]["targetRevision"] =
                        json!("{{- .revision -}}")
                }),
                0,
                "",
            ),
            (
                "a fixed revision",
                Box::new(|d| {
                    d["spec"]["template"]["spec"]["source"]["targetRevision"] = json!("sha256:aaaa")
                }),
                1,
                "spec.source.targetRevision is \"sha256:aaaa\", not the decision's revision ({{.revision}})",
            ),
            (
                "another parameter",
                Box::new(|d| {
                    d["spec"]["template"]["spec"]["source"]["targetRevision"] =
                        json!("{{.values.rev}}")
                }),
                1,
                "not the decision's revision",
            ),
            (
                "a default that hides a missing revision",
                Box::new(|d| {
                    d["spec"]["template"]["spec"]["source"]["targetRevision"] =
                        json!("{{.revision | default \"main\"}}")
                }),
                1,
                "not the decision's revision",
            ),
            (
                "the generator's own template overrides it",
                Box::new(|d| {
                    d["spec"]["generators"][0]["clusterDecisionResource"]["template"] =
                        json!({"metadata": {}, "spec": {"source": {"targetRevision": "main"}}})
                }),
                1,
                "spec.source.targetRevision is \"main\"",
            ),
            (
                "a fixed destination",
                Box::new(|d| {
                    d["spec"]["template"]["spec"]["destination"] = json!({"name": "eu-1"})
                }),
                1,
                "is not the decision's cluster",
            ),
            (
                "destination by the decision's server",
                Box::new(|d| {
                    d["spec"]["template"]["spec"]["destination"] = json!({"server": "{{.server}}"})
                }),
                0,
                "",
            ),
            (
                "fasttemplate syntax without goTemplate",
                Box::new(|d| {
                    d["spec"]["goTemplate"] = json!(false);
                    d["spec"]["template"]["spec"]["source"]["targetRevision"] =
                        json!("{{ revision }}");
                    d["spec"]["template"]["spec"]["destination"] = json!({"name": "{{name}}"});
                }),
                0,
                "",
            ),
            (
                "Go syntax without goTemplate renders literally",
                Box::new(|d| d["spec"]["goTemplate"] = json!(false)),
                2,
                "({{revision}})",
            ),
            (
                "templatePatch over the revision",
                Box::new(|d| {
                    d["spec"]["templatePatch"] =
                        json!("spec:\n  source:\n    targetRevision: main\n")
                }),
                1,
                "spec.templatePatch sets targetRevision or destination",
            ),
            (
                "RollingSync",
                Box::new(|d| {
                    d["spec"]["strategy"] =
                        json!({"type": "RollingSync", "rollingSync": {"steps": []}})
                }),
                1,
                "spec.strategy is RollingSync",
            ),
        ];
        for (name, change, problems, words) in cases {
            let mut doc = app_set();
            change(&mut doc);
            let s: ApplicationSet = serde_json::from_value(doc).unwrap();
            let found = s.wave_gate_safety();
            assert_eq!(found.len(), problems, "{name}: {found:?}");
            for p in &found {
                assert!(
                    matches!(p, UnsafeApplicationSet::TemplateNotFromDecisions(_)),
                    "{name}"
                );
            }
            if problems > 0 {
                assert!(
                    found.iter().any(|p| p.to_string().contains(words)),
                    "{name}: {found:?}"
                );
            }
        }
    }

    #[test]
    fn application_set_round_trips_and_safety_table() {
        let s: ApplicationSet = assert_roundtrip(&app_set());
        assert_eq!(s.wave_gate_safety(), vec![]);
        assert!(s.ignores_sync_policy("mesh-eu-1"));
        assert_eq!(s.decision_resource_names(), vec!["eu-west"]);

        let cases: &[(Value, usize)] = &[
            (
                json!({"applicationsSync": "sync", "preserveResourcesOnDeletion": true}),
                1,
            ),
            (json!({"preserveResourcesOnDeletion": true}), 1),
            (json!({"applicationsSync": "create-update"}), 1),
            (
                json!({"applicationsSync": "create-update", "preserveResourcesOnDeletion": false}),
                1,
            ),
            (json!({}), 2),
        ];
        for (policy, problems) in cases {
            let mut doc = app_set();
            doc["spec"]["syncPolicy"] = policy.clone();
            let s: ApplicationSet = serde_json::from_value(doc).unwrap();
            let found = s.wave_gate_safety();
            assert_eq!(found.len(), *problems, "{policy}: {found:?}");
            assert!(
                found
                    .iter()
                    .all(|p| p.to_string().contains("spec.syncPolicy"))
            );
        }
        let mut doc = app_set();
        doc["spec"]["ignoreApplicationDifferences"] =
            json!([{"name": "other", "jsonPointers": ["/spec/syncPolicy"]}]);
        let s: ApplicationSet = serde_json::from_value(doc).unwrap();
        assert!(!s.ignores_sync_policy("mesh-eu-1"));
    }

    /// The third check: an entry without a name covering the sync policy of every generated
    /// Application (what revert needs before it suspends one's automated sync).
    #[test]
    fn sync_policy_ignored_for_every_application_table() {
        // (ignoreApplicationDifferences, safe for the WaveGate, revert's view of mesh-eu-1)
        let cases: &[(Value, bool, bool)] = &[
            (json!([{"jsonPointers": ["/spec/syncPolicy"]}]), true, true),
            (
                json!([{"jsonPointers": ["/spec/syncPolicy/automated"]}]),
                true,
                true,
            ),
            (json!([{"jsonPointers": ["/spec"]}]), true, true),
            (
                json!([{"jqPathExpressions": [".spec.syncPolicy"]}]),
                true,
                true,
            ),
            (
                json!([{"jsonPointers": ["/spec/source"]}, {"jqPathExpressions": [".spec.syncPolicy.automated"]}]),
                true,
                true,
            ),
            (json!(null), false, false),
            (json!([]), false, false),
            (
                json!([{"jsonPointers": ["/spec/source/targetRevision"]}]),
                false,
                false,
            ),
            (
                json!([{"jsonPointers": ["/spec/syncPolicy/retry"]}]),
                false,
                false,
            ),
            // A name filter covers one Application, not every generated one.
            (
                json!([{"name": "mesh-eu-1", "jsonPointers": ["/spec/syncPolicy"]}]),
                false,
                true,
            ),
            (
                json!([{"name": "mesh-eu-2", "jsonPointers": ["/spec/syncPolicy"]}]),
                false,
                false,
            ),
            (
                json!([{"name": "mesh-eu-1", "jsonPointers": ["/spec/syncPolicy"]}, {"jsonPointers": ["/spec/syncPolicy"]}]),
                true,
                true,
            ),
        ];
        for (ignore, safe, revert_view) in cases {
            let mut doc = app_set();
            if ignore.is_null() {
                doc["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("ignoreApplicationDifferences");
            } else {
                doc["spec"]["ignoreApplicationDifferences"] = ignore.clone();
            }
            let s: ApplicationSet = serde_json::from_value(doc).unwrap();
            let found = s.wave_gate_safety();
            let want = if *safe {
                vec![]
            } else {
                vec![UnsafeApplicationSet::SyncPolicyNotIgnored]
            };
            assert_eq!(found, want, "{ignore}");
            assert_eq!(s.ignores_sync_policy("mesh-eu-1"), *revert_view, "{ignore}");
        }
        let msg = UnsafeApplicationSet::SyncPolicyNotIgnored.to_string();
        for want in [
            "spec.ignoreApplicationDifferences",
            r#"{jsonPointers: ["/spec/syncPolicy"]}"#,
            "no name",
            "ApplicationSetWouldRevert",
        ] {
            assert!(msg.contains(want), "{msg} should say {want}");
        }
    }

    /// Every field this view names exists in the released Argo CD CRDs.
    #[test]
    fn field_names_exist_upstream() {
        use sluice_testkit::prereq;
        let Some(dir) = prereq::or_skip(prereq::upstream_dir(prereq::Upstream::ArgoCd)) else {
            return;
        };
        let load = |f: &str| -> Value {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            let crd: Value = serde_yaml::from_str(&text).unwrap();
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
        };
        let (app, set) = (
            load("application-crd.yaml"),
            load("applicationset-crd.yaml"),
        );
        let p = |v: &Value, path: &[&str]| -> bool {
            let mut node = v;
            for seg in path {
                node = if *seg == "[]" {
                    &node["items"]
                } else {
                    &node["properties"][*seg]
                };
                if node.is_null() {
                    return false;
                }
            }
            true
        };
        for path in [
            &["spec", "source", "repoURL"][..],
            &["spec", "source", "targetRevision"],
            &["spec", "source", "path"],
            &["spec", "sources"],
            &["spec", "destination", "server"],
            &["spec", "destination", "name"],
            &["spec", "syncPolicy", "automated", "enabled"],
            &["spec", "syncPolicy", "automated", "selfHeal"],
            &["spec", "syncPolicy", "automated", "allowEmpty"],
            &["spec", "syncPolicy", "syncOptions"],
            &["operation", "sync", "revision"],
            &["operation", "initiatedBy", "username"],
            &["status", "sync", "status"],
            &["status", "sync", "revision"],
            &["status", "health", "status"],
            &["status", "operationState", "phase"],
            &["status", "operationState", "startedAt"],
            &["status", "resources", "[]", "kind"],
            &["status", "resources", "[]", "health"],
            &["status", "sourceType"],
        ] {
            assert!(p(&app, path), "upstream Application has no field {path:?}");
        }
        for path in [
            &[
                "spec",
                "generators",
                "[]",
                "clusterDecisionResource",
                "configMapRef",
            ][..],
            &[
                "spec",
                "generators",
                "[]",
                "clusterDecisionResource",
                "requeueAfterSeconds",
            ],
            &["spec", "syncPolicy", "applicationsSync"],
            &["spec", "syncPolicy", "preserveResourcesOnDeletion"],
            &["spec", "ignoreApplicationDifferences", "[]", "jsonPointers"],
            &[
                "spec",
                "ignoreApplicationDifferences",
                "[]",
                "jqPathExpressions",
            ],
            &["spec", "goTemplate"],
            &["spec", "template"],
        ] {
            assert!(
                p(&set, path),
                "upstream ApplicationSet has no field {path:?}"
            );
        }
    }
}
