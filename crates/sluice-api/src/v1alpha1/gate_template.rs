//! `GateTemplate`: a cluster-scoped, platform-reviewed gate definition that namespaced owners
//! reference by name (the normal way to use custom PromQL, see issue 5's policy).
//!
//! Owns the kind's wire shape only. Never evaluates a query.

// Repeated `printcolumn(type_ = "string", ...)` entries are distinct columns, not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::gate::GateDefinition;

/// A shared gate definition, referenced from `spec.gates[].templateRef` of Rollouts, WaveGates
/// and RevisionUpgrades. Cluster-scoped so that only the platform team (cluster RBAC) writes
/// PromQL that runs with the operators' view of every team's metrics.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "GateTemplate",
    plural = "gatetemplates",
    shortname = "sgt",
    category = "sluice",
    doc = "A shared, cluster-scoped gate definition (PromQL template or built-in gate, comparison, window, minimum samples) referenced by name from sluice gates.",
    printcolumn(name = "Builtin", type_ = "string", json_path = ".spec.builtin"),
    printcolumn(name = "Window", type_ = "string", json_path = ".spec.window"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.promql) != has(self.builtin)",
    "message": "set exactly one of promql or builtin"
}]))]
pub struct GateTemplateSpec {
    /// What this template checks, for people reading `kubectl get gatetemplates -o yaml`.
    /// At most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub description: Option<String>,
    /// The gate definition: `promql` or `builtin`, comparison, window (default 2m), minSamples
    /// (default 100), consecutiveFailures (default 2), inconclusive policy (default Pause after
    /// 5m), interval (default: the owner's).
    #[serde(flatten)]
    pub definition: GateDefinition,
    /// Default values of extra `{{key}}` variables; gates may override them. At most 16 entries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::common::variables_schema")]
    pub variables: BTreeMap<String, String>,
}
