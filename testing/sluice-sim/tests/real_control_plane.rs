//! The simulator on a real kube-apiserver with kube-controller-manager
//! (`sluice_testkit::control_plane`), playing only the scheduler's binding and the kubelet
//! (`ClusterConfig::on_real_control_plane`): the real Deployment and ReplicaSet controllers create
//! the pods, the simulated kubelet binds them and makes them Ready, the real disruption controller
//! computes PodDisruptionBudget status, the real Eviction API refuses and grants evictions by it,
//! the kubelet ends the graceful deletion and the ReplicaSet replaces the pod; deleting the
//! Deployment lets the real garbage collector remove the rest. And Istio's injector is a real
//! mutating admission webhook the API server calls when the ReplicaSet controller creates pods.

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use sluice_sim::ClusterConfig;
use sluice_sim::cluster::webhook::InjectorWebhook;
use sluice_sim::cluster::{ClusterTasks, SvidCounter};
use sluice_testkit::control_plane::{self, ControlPlane, Options};
use sluice_testkit::eventually::Wait;

/// How the scenarios wait: within 60 s, polling every 200 ms, printing how long each wait took.
const WAIT: Wait = Wait::within(Duration::from_secs(60))
    .every(Duration::from_millis(200))
    .timed();

async fn running_ready(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let list = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .map_err(|e| e.to_string())?;
    let ready: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.phase.as_deref() == Some("Running")
                    && s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .collect();
    Ok(ready)
}

/// Waits until `n` pods labelled `app=web` are Running and Ready, and returns them.
async fn wait_running_ready(pods: &Api<Pod>, n: usize, what: &str) -> Vec<Pod> {
    WAIT.until(what, || async {
        let ready = running_ready(pods).await?;
        (ready.len() == n)
            .then_some(ready.clone())
            .ok_or(format!("{} ready", ready.len()))
    })
    .await
}

async fn pdb_allowed(pdbs: &Api<PodDisruptionBudget>, want: i32) -> Result<(), String> {
    let pdb = pdbs.get("web").await.map_err(|e| e.to_string())?;
    let status = pdb.status.unwrap_or_default();
    (status.disruptions_allowed == Some(want) && status.current_healthy == Some(2))
        .then_some(())
        .ok_or(format!("{status:?}"))
}

#[tokio::test]
async fn real_controllers_and_evictions_with_the_simulated_kubelet() {
    if control_plane::require().is_none() {
        return;
    }
    let started = Instant::now();
    let cp = ControlPlane::start_with(Options {
        controller_manager: true,
        ..Options::default()
    })
    .await
    .unwrap();
    println!("control plane ready: {:.1?}", started.elapsed());
    // A refused eviction is a 429, which kube-rs would otherwise retry for minutes.
    let mut config = cp.config();
    config.default_retry = false;
    let client = Client::try_from(config).unwrap();
    let mut config = ClusterConfig::on_real_control_plane("c1");
    config.readiness_delay = Duration::from_millis(300);
    let tasks = ClusterTasks::start(client.clone(), config, SvidCounter::new());
    let ns = cp.namespace("sim").await.unwrap();

    // Given a Deployment of two and a PodDisruptionBudget that wants both.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "web:1"}]}
                    }
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    pdbs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Then the real controllers create the pods, the simulated kubelet binds them and makes them
    // Ready, and the real Deployment controller reports them available.
    let ready = wait_running_ready(&pods, 2, "two pods bound, Running and Ready").await;
    assert!(
        ready
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()),
        "bound to a node"
    );
    WAIT.until("the Deployment available", || async {
        let d = deployments.get("web").await.map_err(|e| e.to_string())?;
        let available = d.status.and_then(|s| s.available_replicas);
        (available == Some(2))
            .then_some(())
            .ok_or(format!("{available:?}"))
    })
    .await;
    WAIT.until("the real disruption controller allows none", || {
        pdb_allowed(&pdbs, 0)
    })
    .await;

    // When a pod is evicted while the budget allows none: refused by the real Eviction API.
    let victim = ready[0].metadata.name.clone().unwrap();
    let err = pods
        .evict(&victim, &EvictParams::default())
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected a 429, got {err}");
    };
    assert_eq!(status.code, 429, "{status:?}");
    assert_eq!(
        status.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );

    // When the budget allows one: the eviction is granted, the kubelet ends the graceful
    // deletion, and the ReplicaSet replaces the pod.
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
    )
    .await
    .unwrap();
    WAIT.until("the budget allows one", || pdb_allowed(&pdbs, 1))
        .await;
    pods.evict(&victim, &EvictParams::default()).await.unwrap();
    WAIT.until("the evicted pod gone and replaced", || async {
        let gone = pods
            .get_opt(&victim)
            .await
            .map_err(|e| e.to_string())?
            .is_none();
        let ready = running_ready(&pods).await?;
        (gone && ready.len() == 2)
            .then_some(())
            .ok_or(format!("gone {gone}, {} ready", ready.len()))
    })
    .await;

    // When the Deployment is deleted: the real garbage collector removes its ReplicaSet and
    // pods, and the kubelet ends each pod's graceful deletion.
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    WAIT.until("every pod gone", || async {
        let left = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        (left == 0).then_some(()).ok_or(format!("{left} left"))
    })
    .await;
    drop(tasks);
}

#[tokio::test]
async fn the_injector_is_a_real_mutating_webhook() {
    if control_plane::require().is_none() {
        return;
    }
    let cp = ControlPlane::start_with(Options {
        controller_manager: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let client = cp.client().await.unwrap();
    let mut config = ClusterConfig::on_real_control_plane("c1");
    config.readiness_delay = Duration::from_millis(300);
    let svid = SvidCounter::new();
    let tasks = ClusterTasks::start(client.clone(), config, svid.clone());
    let webhook = InjectorWebhook::start(client.clone(), cp.ca(), svid.clone())
        .await
        .unwrap();
    assert!(webhook.url().starts_with("https://127.0.0.1:"));

    // Given revision 1-27's injector and a namespace on it.
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mwcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "istio-sidecar-injector-1-27", "labels": {"istio.io/rev": "1-27"}}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let ns = cp.namespace("meshed").await.unwrap();
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"istio.io/rev": "1-27"}}})),
        )
        .await
        .unwrap();

    // When the real ReplicaSet controller creates a Deployment's pods.
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "web:1"}]}
                    }
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    // Then the API server has the webhook inject them at admission, each counting one SVID.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ready = wait_running_ready(&pods, 2, "two injected pods Ready").await;
    for pod in &ready {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            sluice_sim::cluster::injection::injected_revision(&annotations).as_deref(),
            Some("1-27"),
            "{annotations:?}"
        );
        let containers: Vec<&str> = pod
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(containers, ["web", "istio-proxy"]);
    }
    assert_eq!(svid.get(), 2);
    drop(webhook);
    drop(tasks);
}

#[tokio::test]
async fn simulated_nodes_are_ready_renew_their_leases_and_take_the_pods() {
    if control_plane::require().is_none() {
        return;
    }
    // The node lifecycle controller runs too: it taints a node whose Lease lapses or whose Ready
    // condition is not True.
    let mut controllers = control_plane::CONTROLLERS.to_vec();
    controllers.push("node-lifecycle-controller");
    let cp = ControlPlane::start_with(Options {
        controller_manager: true,
        controllers,
        ..Options::default()
    })
    .await
    .unwrap();
    let client = cp.client().await.unwrap();
    let mut config = ClusterConfig::on_real_control_plane("c1");
    config.readiness_delay = Duration::from_millis(300);
    config.lease_renew_interval = Duration::from_millis(500);
    let names = config.nodes.clone();
    let tasks = ClusterTasks::start(client.clone(), config, SvidCounter::new());
    let ns = cp.namespace("nodes").await.unwrap();

    // Then every simulated node is registered Ready with its InternalIP.
    let nodes: Api<Node> = Api::all(client.clone());
    let ips = WAIT
        .until("three Nodes Ready with an InternalIP", || async {
            let list = nodes
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let mut ips = std::collections::BTreeMap::new();
            for n in &list.items {
                let status = n.status.clone().unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let ip = status
                    .addresses
                    .iter()
                    .flatten()
                    .find(|a| a.type_ == "InternalIP")
                    .map(|a| a.address.clone());
                if let (true, Some(ip)) = (ready, ip) {
                    ips.insert(n.name_any(), ip);
                }
            }
            (ips.keys().cloned().collect::<Vec<_>>() == names)
                .then_some(ips.clone())
                .ok_or(format!("{ips:?}"))
        })
        .await;

    // And each node's Lease is held by the node and renewed.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew_time = |lease: &Lease| {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.clone())
            .map(|t| t.0)
    };
    let first = WAIT
        .until("node-0's Lease", || async {
            leases.get("node-0").await.map_err(|e| e.to_string())
        })
        .await;
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-0"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &first.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", "node-0")
    );
    let before = renew_time(&first).expect("a renew time");
    WAIT.until("node-0's Lease renewed", || async {
        let now = leases.get("node-0").await.map_err(|e| e.to_string())?;
        let t = renew_time(&now).ok_or("no renew time")?;
        (t > before)
            .then_some(())
            .ok_or(format!("renewTime still {t}"))
    })
    .await;

    // When a DaemonSet is created, the real DaemonSet controller places a pod per Node; the
    // simulated kubelet binds each to the node it names, Running and Ready with that node's IP.
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(client.clone(), &ns);
    daemonsets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "agent"},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "agent", "image": "agent:1"}]}
                    }
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ready = wait_running_ready(&pods, 3, "a Ready pod on each node").await;
    let mut placed: Vec<(String, String)> = ready
        .iter()
        .map(|p| {
            let node = p.spec.as_ref().unwrap().node_name.clone().unwrap();
            let host = p.status.as_ref().unwrap().host_ip.clone().unwrap();
            (node, host)
        })
        .collect();
    placed.sort();
    let want: Vec<(String, String)> = ips.into_iter().collect();
    assert_eq!(
        placed, want,
        "one pod per node, each reporting its node's IP"
    );

    // And the node lifecycle controller, watching the renewed Leases, left every node
    // untainted (a not-ready or unreachable node is tainted).
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in nodes.list(&ListParams::default()).await.unwrap().items {
        let taints = n.spec.clone().and_then(|s| s.taints).unwrap_or_default();
        assert!(taints.is_empty(), "{} is tainted: {taints:?}", n.name_any());
    }
    drop(tasks);
}
