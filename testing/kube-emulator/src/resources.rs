//! The resource registry: which kinds the emulator serves, under which group/version/plural, and
//! what discovery says about them (namespaced, short names, verbs, subresources).
//!
//! Owns the built-in kind table and the translation of a CustomResourceDefinition into served
//! resources. Never stores objects and never validates them; it only describes kinds.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// Identifies one storage table: objects of one resource, shared by all served versions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableKey {
    /// API group (`""` for the core group).
    pub group: String,
    /// Plural resource name, such as `rollouts`.
    pub plural: String,
}

/// One served resource at one group/version.
#[derive(Clone, Debug)]
pub struct ResourceType {
    /// API group (`""` for the core group).
    pub group: String,
    /// Version, such as `v1`.
    pub version: String,
    /// Kind, such as `Pod`.
    pub kind: String,
    /// Plural resource name, such as `pods`.
    pub plural: String,
    /// Singular resource name, such as `pod`.
    pub singular: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names for kubectl (`po`, `deploy`).
    pub short_names: Vec<String>,
    /// Categories for kubectl (`all`).
    pub categories: Vec<String>,
    /// Whether the kind has a `status` subresource (status separated from spec).
    pub has_status: bool,
    /// Whether `metadata.generation` is maintained (bumped on spec changes).
    pub tracks_generation: bool,
    /// The CRD's `openAPIV3Schema` for custom resources; `None` for built-ins.
    pub schema: Option<Arc<Value>>,
    /// The CRD's additional printer columns (kubectl table output).
    pub printer_columns: Vec<Value>,
    /// Whether this is the storage version (the version `kubectl` prefers).
    pub preferred: bool,
}

impl ResourceType {
    /// The storage table this resource is kept in.
    pub fn table(&self) -> TableKey {
        TableKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as kube-apiserver writes it in messages (`rollouts.sluice.dev`, `pods`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Verbs discovery advertises.
    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    /// Whether this is a custom resource (served from a CRD).
    pub fn is_custom(&self) -> bool {
        self.schema.is_some()
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    short: &[&str],
    has_status: bool,
    tracks_generation: bool,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: Vec::new(),
        has_status,
        tracks_generation,
        schema: None,
        printer_columns: Vec::new(),
        preferred: true,
    }
}

/// The built-in kinds every emulator serves.
pub fn builtins() -> Vec<ResourceType> {
    let mut all = vec![
        builtin(
            "",
            "v1",
            "Namespace",
            "namespaces",
            false,
            &["ns"],
            true,
            false,
        ),
        builtin(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["sa"],
            false,
            false,
        ),
        builtin("", "v1", "Pod", "pods", true, &["po"], true, true),
        builtin("", "v1", "Service", "services", true, &["svc"], true, false),
        builtin("", "v1", "Secret", "secrets", true, &[], false, false),
        builtin(
            "",
            "v1",
            "ConfigMap",
            "configmaps",
            true,
            &["cm"],
            false,
            false,
        ),
        builtin("", "v1", "Event", "events", true, &["ev"], false, false),
        builtin(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            true,
            &["ev"],
            false,
            false,
        ),
        builtin(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
            &["deploy"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "StatefulSet",
            "statefulsets",
            true,
            &["sts"],
            true,
            true,
        ),
        builtin(
            "apps",
            "v1",
            "DaemonSet",
            "daemonsets",
            true,
            &["ds"],
            true,
            true,
        ),
        builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            &["pdb"],
            true,
            true,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            false,
            &[],
            true,
            true,
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
            &[],
            false,
            true,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
            &[],
            false,
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            &[],
            false,
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            &["crd", "crds"],
            true,
            true,
        ),
    ];
    for r in &mut all {
        if matches!(
            r.plural.as_str(),
            "pods" | "services" | "deployments" | "statefulsets" | "daemonsets"
        ) {
            r.categories = vec!["all".into()];
        }
    }
    all
}

/// Why a CustomResourceDefinition could not be served.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CrdError {
    /// A required field of the CRD is missing or has the wrong type.
    #[error(
        "CustomResourceDefinition {name:?}: {field} is missing or not a {expected}; set it and re-apply"
    )]
    MissingField {
        /// CRD name.
        name: String,
        /// Field path.
        field: &'static str,
        /// Expected type.
        expected: &'static str,
    },
    /// `metadata.name` is not `<plural>.<group>`.
    #[error(
        "CustomResourceDefinition {name:?}: metadata.name must be spec.names.plural+\".\"+spec.group ({expected:?})"
    )]
    NameMismatch {
        /// CRD name.
        name: String,
        /// The name it must have.
        expected: String,
    },
}

impl CrdError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// The resources a CRD serves: one per served version.
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceType>, CrdError> {
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let s = |ptr: &'static str| -> Result<String, CrdError> {
        crd.pointer(ptr)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(CrdError::MissingField {
                name: name.clone(),
                field: ptr,
                expected: "string",
            })
    };
    let group = s("/spec/group")?;
    let plural = s("/spec/names/plural")?;
    let kind = s("/spec/names/kind")?;
    let singular = crd
        .pointer("/spec/names/singular")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_ascii_lowercase());
    let expected = format!("{plural}.{group}");
    if name != expected {
        return Err(CrdError::NameMismatch { name, expected });
    }
    let namespaced = crd.pointer("/spec/scope").and_then(Value::as_str) != Some("Cluster");
    let strs = |ptr: &str| -> Vec<String> {
        crd.pointer(ptr)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strs("/spec/names/shortNames");
    let categories = strs("/spec/names/categories");
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .ok_or(CrdError::MissingField {
            name: name.clone(),
            field: "/spec/versions",
            expected: "list",
        })?;
    let mut out = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let Some(version) = v.get("name").and_then(Value::as_str) else {
            continue;
        };
        let schema = v
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        out.push(ResourceType {
            group: group.clone(),
            version: version.to_string(),
            kind: kind.clone(),
            plural: plural.clone(),
            singular: singular.clone(),
            namespaced,
            short_names: short_names.clone(),
            categories: categories.clone(),
            has_status: v.pointer("/subresources/status").is_some(),
            tracks_generation: true,
            schema: Some(Arc::new(schema)),
            printer_columns: v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            preferred: v.get("storage").and_then(Value::as_bool).unwrap_or(false),
        });
    }
    Ok(out)
}

/// All served resources, indexed for request routing and discovery.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// (group, version, plural) → resource.
    by_path: BTreeMap<(String, String, String), Arc<ResourceType>>,
    /// CRD name → the keys it registered.
    crds: BTreeMap<String, Vec<(String, String, String)>>,
}

impl Registry {
    /// A registry with the built-in kinds.
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        for t in builtins() {
            r.insert(t);
        }
        r
    }

    fn insert(&mut self, t: ResourceType) {
        self.by_path.insert(
            (t.group.clone(), t.version.clone(), t.plural.clone()),
            Arc::new(t),
        );
    }

    /// Looks up the resource served at `group/version/plural`.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_path
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Serves (or re-serves) the resources of a CRD.
    pub fn put_crd(&mut self, crd: &Value) -> Result<(), CrdError> {
        let types = from_crd(crd)?;
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.remove_crd(&name);
        let mut keys = Vec::new();
        for t in types {
            keys.push((t.group.clone(), t.version.clone(), t.plural.clone()));
            self.insert(t);
        }
        self.crds.insert(name, keys);
        Ok(())
    }

    /// Stops serving a CRD's resources.
    pub fn remove_crd(&mut self, name: &str) {
        if let Some(keys) = self.crds.remove(name) {
            for k in keys {
                self.by_path.remove(&k);
            }
        }
    }

    /// Every served resource, ordered by group, version and plural.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.by_path.values()
    }

    /// The version a group prefers (the storage version, else the first served).
    pub fn preferred_version(&self, group: &str) -> Option<String> {
        let mut first = None;
        for t in self.by_path.values().filter(|t| t.group == group) {
            if t.preferred {
                return Some(t.version.clone());
            }
            first.get_or_insert_with(|| t.version.clone());
        }
        first
    }

    /// Any served version of the resource stored in `table` (used to render watch events).
    pub fn any_version(&self, table: &TableKey) -> Option<Arc<ResourceType>> {
        self.by_path
            .values()
            .find(|t| t.group == table.group && t.plural == table.plural)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_translation_table() {
        type Want = Result<(&'static str, bool, usize), &'static str>;
        let cases: Vec<(Value, Want)> = vec![
            (
                json!({"metadata":{"name":"rollouts.sluice.dev"},"spec":{"group":"sluice.dev","scope":"Namespaced",
                    "names":{"plural":"rollouts","kind":"Rollout"},
                    "versions":[{"name":"v1alpha1","served":true,"storage":true,"subresources":{"status":{}}}]}}),
                Ok(("Rollout", true, 1)),
            ),
            (
                json!({"metadata":{"name":"things.x.io"},"spec":{"group":"x.io","scope":"Cluster",
                    "names":{"plural":"things","kind":"Thing"},
                    "versions":[{"name":"v1","served":true},{"name":"v0","served":false}]}}),
                Ok(("Thing", false, 1)),
            ),
            (
                json!({"metadata":{"name":"wrong"},"spec":{"group":"x.io","names":{"plural":"things","kind":"Thing"},"versions":[]}}),
                Err("name_mismatch"),
            ),
            (
                json!({"metadata":{"name":"a.b"},"spec":{}}),
                Err("missing_field"),
            ),
        ];
        for (crd, want) in cases {
            match (from_crd(&crd), want) {
                (Ok(types), Ok((kind, namespaced, n))) => {
                    assert_eq!(types.len(), n);
                    assert_eq!(types[0].kind, kind);
                    assert_eq!(types[0].namespaced, namespaced);
                }
                (Err(e), Err(cat)) => assert_eq!(e.category(), cat),
                (got, want) => panic!("{crd}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn qualified_names_match_apiserver_wording() {
        let r = Registry::with_builtins();
        assert_eq!(r.get("", "v1", "pods").unwrap().qualified(), "pods");
        assert_eq!(
            r.get("apps", "v1", "deployments").unwrap().qualified(),
            "deployments.apps"
        );
        assert_eq!(r.get("", "v1", "pods").unwrap().api_version(), "v1");
    }
}
