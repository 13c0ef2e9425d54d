//! `GateTemplate`: a cluster-scoped, platform-reviewed gate definition that namespaced owners
//! reference by name (the normal way to use custom PromQL, see issue 5's policy).
//!
//! Owns the kind's wire shape only. Never evaluates a query.

// Repeated `printcolumn(type_ = "string", ...)` entries are distinct columns, not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
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
    status = "GateTemplateStatus",
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
    /// Default values of extra `{{key}}` variables; gates may override them unless the template
    /// is `locked`. At most 16 entries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::common::variables_schema")]
    pub variables: BTreeMap<String, String>,
    /// The platform's gate: a gate referencing a locked template is judged exactly as the
    /// template defines it. Any field the gate sets beside `templateRef` (`promql`, `builtin`,
    /// `comparison`, `window`, `minSamples`, `consecutiveFailures`, `inconclusive`, `interval`,
    /// `variables`) is refused: it is not applied, and the owner reports `Ready=False` (reason
    /// `GateMisconfigured`) naming the gate, the template and the field. The owner's default
    /// Inconclusive policy does not apply to it either (the template's, or Pause after 5m).
    /// Default false: gates may override the template's fields.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub locked: bool,
}

/// Observed state of a GateTemplate, written by rollout-weights (its field manager): whether the
/// template is usable, checked as the operators would use it, before any gate references it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateTemplateStatus {
    /// The metadata.generation the conditions reflect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions, one per type. `Ready`: True (reason `Valid`) when the fields, the variables
    /// and the PromQL (parsed with every `{{variable}}` given a placeholder) are valid; False
    /// (reason `InvalidSpec`) with each problem as `field: what is wrong`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
