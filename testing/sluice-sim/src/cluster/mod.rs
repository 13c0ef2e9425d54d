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
//!
//! On a real API server with kube-controller-manager ([`ClusterConfig::on_real_control_plane`])
//! only the kubelet part runs, with binding, the nodes' Node objects and Leases ([`nodes`]) and
//! the end of graceful deletion: the real
//! controllers own Deployments, ReplicaSets, PDB status and garbage collection.

pub mod controllers;
pub mod injection;
pub mod nodes;
pub mod pdb;
pub mod pods;
pub mod rolling;
pub mod svid;
pub mod webhook;

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
    /// With `kubelet`: bind unscheduled pods to [`ClusterConfig::nodes`] through the binding
    /// subresource, and remove terminating pods bound to a node (delete with grace period 0), as
    /// kube-scheduler and the kubelet do. Needed on a real API server, where the real workload
    /// controllers create unscheduled pods and deletion is graceful. Default false.
    pub binds_and_finalizes: bool,
    /// Register a Node object (Ready, with an InternalIP) per entry of [`ClusterConfig::nodes`]
    /// and renew its Lease in `kube-node-lease`, as each kubelet does ([`nodes`]). Needed on a
    /// real API server: the real DaemonSet controller places pods only on Nodes, and the node
    /// lifecycle controller taints a node whose Lease lapses. Default false.
    pub node_objects: bool,
    /// How often each node's Lease is renewed (the kubelet renews at a quarter of its 40 s
    /// duration). Default 10 s.
    pub lease_renew_interval: Duration,
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
            binds_and_finalizes: false,
            node_objects: false,
            lease_renew_interval: Duration::from_secs(10),
        }
    }

    /// For a real API server with kube-controller-manager running the workload, disruption and
    /// garbage-collector controllers (`sluice_testkit::control_plane`): the simulator plays only
    /// the scheduler's binding and the kubelet (its Node and Lease, readiness after the delay, pod
    /// IPs, the end of graceful deletions); the real controllers create the pods and compute
    /// workload and PDB status.
    pub fn on_real_control_plane(name: impl Into<String>) -> Self {
        Self {
            workloads: false,
            disruption: false,
            binds_and_finalizes: true,
            node_objects: true,
            ..Self::new(name)
        }
    }
}

/// Errors of the cluster behaviour.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum ClusterError {
    /// An API call failed.
    #[error(
        "{action} failed: {source}; the simulator retries in a second — check the API server is reachable and the identity may do this"
    )]
    #[strum(serialize = "ApiError")]
    Api {
        /// What was being done, with kind/namespace/name.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object lacks a field the controllers need.
    #[error("{what} has no {field}; fix the object (the simulator waits for a change)")]
    #[strum(serialize = "InvalidObject")]
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
        self.into()
    }
}
