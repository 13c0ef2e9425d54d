//! Cluster behaviour, deliberately small: what kube-controller-manager (Deployment, StatefulSet,
//! DaemonSet and disruption controllers), the kubelet (readiness after a delay) and Istio's sidecar
//! injector (revision by tag, one SVID per injected pod) do for sluice's operators to observe.
//!
//! Runs as tokio tasks with kube-runtime controllers over a `kube::Client`, so it works on the API
//! emulator or any cluster without those components. Differences from a real cluster, on purpose:
//! Deployments own their pods directly (no ReplicaSets; pods still carry `pod-template-hash` and
//! real-looking names); pods are scheduled round-robin over [`ClusterConfig::nodes`] when created;
//! injection happens when the simulator creates a pod (a real cluster's injector webhook does it at
//! admission); every pod without a Ready condition becomes Ready after
//! [`ClusterConfig::readiness_delay`]; deleting a workload deletes its pods (the garbage
//! collector's background propagation). Never deletes or changes objects other than the pods of
//! simulated workloads, pod status (the kubelet's part) and workload and PDB status.

pub mod controllers;
pub mod injection;
pub mod pdb;
pub mod pods;
pub mod rolling;
pub mod svid;

pub use controllers::ClusterTasks;
pub use svid::SvidCounter;

use std::time::Duration;

/// Settings of the cluster behaviour in one cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Cluster name (the `cluster` label of its telemetry).
    pub name: String,
    /// Time from a pod's first sighting to Ready. Default 1 s; tests use less.
    pub readiness_delay: Duration,
    /// Node names pods are scheduled on and DaemonSets cover. Default `node-0`..`node-2`.
    pub nodes: Vec<String>,
    /// Run the kubelet model (pod phase and readiness). Default true.
    pub kubelet: bool,
    /// Run the workload controllers (Deployment, StatefulSet, DaemonSet). Default true.
    pub workloads: bool,
    /// Run the disruption controller (PDB status). Default true.
    pub disruption: bool,
}

impl ClusterConfig {
    /// Defaults for a cluster called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            readiness_delay: Duration::from_secs(1),
            nodes: (0..3).map(|i| format!("node-{i}")).collect(),
            kubelet: true,
            workloads: true,
            disruption: true,
        }
    }
}

/// Errors of the cluster behaviour.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// An API call failed.
    #[error(
        "{action} failed: {source}; the simulator retries in a second — check the API server is reachable and the identity may do this"
    )]
    Api {
        /// What was being done, with kind/namespace/name.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object lacks a field the controllers need.
    #[error("{what} has no {field}; fix the object (the simulator waits for a change)")]
    Invalid {
        /// Kind/namespace/name.
        what: String,
        /// The missing field.
        field: &'static str,
    },
}

impl ClusterError {
    /// Bounded error category for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            ClusterError::Api { .. } => "ApiError",
            ClusterError::Invalid { .. } => "InvalidObject",
        }
    }
}
