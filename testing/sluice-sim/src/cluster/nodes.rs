//! The simulated kubelets' own objects on a real API server: one Node per
//! [`ClusterConfig::nodes`](super::ClusterConfig::nodes) entry, registered Ready with an
//! InternalIP, and its Lease in `kube-node-lease` renewed every
//! [`ClusterConfig::lease_renew_interval`](super::ClusterConfig::lease_renew_interval), as the
//! kubelet does (kubelet's `nodeLeaseDurationSeconds` 40, renewed at a quarter of it), so
//! kube-controller-manager's node lifecycle controller, when it runs, keeps the nodes Ready and
//! untainted; the Ready condition's heartbeat is posted every [`STATUS_REPORT`]. Without Nodes
//! the real DaemonSet controller would create no pods at all.
//!
//! Never deletes a Node or Lease (they outlive the simulator, as a stopped kubelet's do).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::{ClusterConfig, ClusterError};

/// Namespace of the node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The Lease duration the kubelet sets (`nodeLeaseDurationSeconds`).
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// How often the Ready condition's heartbeat is posted (the kubelet's
/// `nodeStatusReportFrequency` is 5 m; the Lease is what the node lifecycle controller reads
/// between reports).
pub const STATUS_REPORT: Duration = Duration::from_secs(60);

/// The InternalIP of the `index`th simulated node: 10.0.0.(index + 1) (pods report it as their
/// `hostIP`).
pub fn node_ip(index: usize) -> String {
    format!("10.0.{}.{}", (index + 1) / 250, (index + 1) % 250)
}

/// The InternalIP of `node` among `nodes`; the first node's when it is not one of them.
pub fn ip_of(nodes: &[String], node: &str) -> String {
    node_ip(nodes.iter().position(|n| n == node).unwrap_or(0))
}

/// A time as the API's MicroTime (`2026-01-02T03:04:05.000006Z`).
pub fn micro_time(at: jiff::Timestamp) -> String {
    format!(
        "{}.{:06}Z",
        at.strftime("%Y-%m-%dT%H:%M:%S"),
        at.subsec_microsecond()
    )
}

fn now_seconds() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn api_err(action: String) -> impl FnOnce(kube::Error) -> ClusterError {
    move |source| ClusterError::Api { action, source }
}

fn conflict_or_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The Node object a kubelet registers (status comes through the status subresource).
fn node_object(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }},
        "spec": {},
    })
}

/// The status a Ready kubelet posts.
fn node_status(name: &str, ip: &str, now: &str) -> Value {
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({"status": {
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status (simulated)"),
        ],
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "250"},
        "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "250"},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "sluice-sim",
            "containerRuntimeVersion": "sim://1", "kubeletVersion": "sim", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64",
        },
    }})
}

/// Registers `name` (Node and Ready status) and its Lease; returns once both exist.
async fn register(client: &Client, name: &str, ip: &str) -> Result<(), ClusterError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(node_object(name)).expect("a valid Node"),
        )
        .await;
    let node = match created {
        Ok(n) => n,
        Err(e) if conflict_or_exists(&e) => nodes
            .get(name)
            .await
            .map_err(api_err(format!("reading Node {name}")))?,
        Err(e) => return Err(api_err(format!("registering Node {name}"))(e)),
    };
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&node_status(name, ip, &now_seconds())),
        )
        .await
        .map_err(api_err(format!("posting the status of Node {name}")))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE, "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": node.uid().unwrap_or_default(),
        }]},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": micro_time(jiff::Timestamp::now()),
        },
    });
    match leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(lease).expect("a valid Lease"),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if conflict_or_exists(&e) => Ok(()),
        Err(e) => Err(api_err(format!(
            "creating Lease {NODE_LEASE_NAMESPACE}/{name}"
        ))(e)),
    }
}

async fn renew(client: &Client, name: &str) -> Result<(), ClusterError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let patch = json!({"spec": {
        "holderIdentity": name,
        "leaseDurationSeconds": LEASE_DURATION_SECONDS,
        "renewTime": micro_time(jiff::Timestamp::now()),
    }});
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(api_err(format!(
            "renewing Lease {NODE_LEASE_NAMESPACE}/{name}"
        )))
}

/// Runs the kubelets' node loop for `config.nodes` until aborted: registers each node, then
/// renews its Lease every `config.lease_renew_interval` and posts its Ready heartbeat every
/// [`STATUS_REPORT`]. A failure is logged and retried on the next tick (a node not yet
/// registered is registered again).
pub async fn run(client: Client, config: ClusterConfig) {
    let mut registered = vec![false; config.nodes.len()];
    let mut last_report = Instant::now();
    loop {
        let report = last_report.elapsed() >= STATUS_REPORT;
        for (i, name) in config.nodes.iter().enumerate() {
            let ip = node_ip(i);
            let result = if !registered[i] {
                register(&client, name, &ip).await
            } else if report {
                let nodes: Api<Node> = Api::all(client.clone());
                match nodes
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(&node_status(name, &ip, &now_seconds())),
                    )
                    .await
                {
                    Ok(_) => renew(&client, name).await,
                    Err(e) => Err(api_err(format!("posting the status of Node {name}"))(e)),
                }
            } else {
                renew(&client, name).await
            };
            match result {
                Ok(()) => registered[i] = true,
                Err(e) => {
                    tracing::warn!(cluster = %config.name, node = %name, category = e.category(), "{e}");
                    if matches!(&e, ClusterError::Api { source: kube::Error::Api(s), .. } if s.code == 404)
                    {
                        registered[i] = false;
                    }
                }
            }
        }
        if report {
            last_report = Instant::now();
        }
        tokio::time::sleep(config.lease_renew_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ips_are_distinct_and_the_micro_time_has_six_digits() {
        let ips: std::collections::BTreeSet<String> = (0..600).map(node_ip).collect();
        assert_eq!(ips.len(), 600);
        assert_eq!(node_ip(0), "10.0.0.1");
        let nodes = vec!["node-0".to_string(), "node-1".to_string()];
        assert_eq!(ip_of(&nodes, "node-1"), "10.0.0.2");
        let t: jiff::Timestamp = "2026-01-02T03:04:05.000006Z".parse().unwrap();
        assert_eq!(micro_time(t), "2026-01-02T03:04:05.000006Z");
        let t: jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(micro_time(t), "2026-01-02T03:04:05.000000Z");
    }

    #[test]
    fn the_registered_status_is_ready_with_the_node_ip() {
        let s = node_status("node-1", "10.0.0.2", "2026-01-02T03:04:05Z");
        let ready = s["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "True");
        assert_eq!(s["status"]["addresses"][0]["address"], "10.0.0.2");
        let node: Node = serde_json::from_value(node_object("node-1")).unwrap();
        assert_eq!(node.labels()["kubernetes.io/hostname"], "node-1");
    }
}
