//! End to end on the API emulator: the cluster behaviour replaces pods on a rolling restart and
//! on eviction, honours surge/unavailability budgets and PodDisruptionBudgets, injects each new
//! pod with the revision its namespace's tag points to at that moment, and counts one SVID per
//! injected pod.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kube_emulator::Emulator;
use serde_json::json;
use sluice_sim::cluster::injection::injected_revision;
use sluice_sim::{ClusterConfig, World};
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::mesh_config::revision_tag_webhooks;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const NS: &str = "shop";

/// Given: an emulator with revision tags `stable` → 1-27 and `canary` → 1-28, and namespace
/// `shop` on tag `stable`.
async fn given_a_meshed_cluster() -> (Emulator, Client) {
    let emu = Emulator::start().await;
    let client = emu.client();
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for mwc in revision_tag_webhooks() {
        let mwc: MutatingWebhookConfiguration = serde_json::from_value(mwc).unwrap();
        mwcs.create(&PostParams::default(), &mwc).await.unwrap();
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": NS, "labels": {"istio.io/rev": "stable"}}}),
    )
    .unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    (emu, client)
}

fn world(client: &Client) -> World {
    world_with_readiness(client, Duration::from_millis(300))
}

fn world_with_readiness(client: &Client, delay: Duration) -> World {
    let mut config = ClusterConfig::new("cluster-1");
    config.readiness_delay = delay;
    World::builder()
        .cluster_with(config, client.clone())
        .start()
        .unwrap()
}

async fn retag_namespace(client: &Client, tag: &str) {
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.patch(
        NS,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"istio.io/rev": tag}}})),
    )
    .await
    .unwrap();
}

async fn live_pods(client: &Client, app: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn revision(p: &Pod) -> Option<String> {
    p.metadata.annotations.as_ref().and_then(injected_revision)
}

/// How often the scenarios poll the simulated cluster.
const POLL: Duration = Duration::from_millis(25);

/// Waits until `app` has exactly `n` live pods, all Ready, and returns them.
async fn all_ready(client: &Client, app: &str, n: usize) -> Vec<Pod> {
    eventually_every(
        &format!("{n} ready pods of {app}"),
        Duration::from_secs(20),
        POLL,
        || async {
            let pods = live_pods(client, app).await;
            (pods.len() == n && pods.iter().all(ready)).then_some(pods)
        },
    )
    .await
}

fn deployment(name: &str, replicas: i32, surge: i32, unavailable: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
            "template": {
                "metadata": {"labels": {"app": name, "version": "v1"}},
                "spec": {"containers": [{"name": "app", "image": format!("{name}:1")}]}
            }
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn rolling_restart_replaces_every_pod_with_the_new_revision_within_budgets() {
    let (_emu, client) = given_a_meshed_cluster().await;
    let world = world(&client);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deploys
        .create(&PostParams::default(), &deployment("checkout", 4, 1, 1))
        .await
        .unwrap();

    let first = all_ready(&client, "checkout", 4).await;
    for p in &first {
        assert_eq!(
            revision(p).as_deref(),
            Some("1-27"),
            "{} injected by the stable tag",
            p.name_any()
        );
        let owner = &p.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("Deployment", "checkout", Some(true))
        );
        let hash = p.labels()["pod-template-hash"].clone();
        assert!(
            p.name_any().starts_with(&format!("checkout-{hash}-")),
            "{}",
            p.name_any()
        );
        assert!(
            !p.labels().contains_key("istio.io/rev"),
            "the injector never labels istio.io/rev"
        );
        let containers: Vec<&str> = p
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(containers, ["app", "istio-proxy"]);
    }
    assert_eq!(
        world.svid("cluster-1").unwrap().get(),
        4,
        "one SVID per injected pod"
    );
    eventually_every(
        "deployment status",
        Duration::from_secs(10),
        POLL,
        || async {
            let d = deploys.get("checkout").await.unwrap();
            let s = d.status.unwrap_or_default();
            (s.ready_replicas == Some(4)
                && s.updated_replicas == Some(4)
                && s.observed_generation == Some(1))
            .then_some(())
        },
    )
    .await;

    // When: the namespace moves to the canary tag and the Deployment is restarted.
    retag_namespace(&client, "canary").await;
    deploys
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T00:00:00Z"}}}}})),
        )
        .await
        .unwrap();

    // Then: pods are replaced within maxSurge 1 / maxUnavailable 1, all on 1-28.
    let old: BTreeSet<String> = first.iter().map(|p| p.name_any()).collect();
    let (mut max_total, mut min_ready) = (0, usize::MAX);
    let done = eventually_every(
        "the rolling restart finished",
        Duration::from_secs(30),
        Duration::from_millis(10),
        async || {
            let pods = live_pods(&client, "checkout").await;
            max_total = max_total.max(pods.len());
            min_ready = min_ready.min(pods.iter().filter(|p| ready(p)).count());
            if pods.len() == 4
                && pods
                    .iter()
                    .all(|p| ready(p) && !old.contains(&p.name_any()))
            {
                Ok(pods)
            } else {
                Err(format!(
                    "rolling restart did not finish: {:?}",
                    pods.iter()
                        .map(|p| (p.name_any(), ready(p)))
                        .collect::<Vec<_>>()
                ))
            }
        },
    )
    .await;
    for p in &done {
        assert_eq!(
            revision(p).as_deref(),
            Some("1-28"),
            "{} injected by the canary tag",
            p.name_any()
        );
    }
    assert!(max_total <= 5, "maxSurge 1 exceeded: saw {max_total} pods");
    assert!(
        min_ready >= 3,
        "maxUnavailable 1 exceeded: saw {min_ready} ready pods"
    );
    assert_eq!(
        world.svid("cluster-1").unwrap().get(),
        8,
        "four more SVIDs for four new pods"
    );
    eventually_every(
        "deployment status after restart",
        Duration::from_secs(10),
        POLL,
        || async {
            let s = deploys
                .get("checkout")
                .await
                .unwrap()
                .status
                .unwrap_or_default();
            (s.ready_replicas == Some(4)
                && s.updated_replicas == Some(4)
                && s.replicas == Some(4)
                && s.observed_generation == Some(2))
            .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn eviction_replaces_the_pod_with_the_new_revision_and_the_budget_holds_the_second() {
    let (_emu, client) = given_a_meshed_cluster().await;
    // Readiness takes long enough that the replacement cannot be Ready before the second
    // eviction arrives, even on a loaded machine.
    let world = world_with_readiness(&client, Duration::from_secs(3));
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deploys
        .create(&PostParams::default(), &deployment("web", 3, 1, 0))
        .await
        .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let first = all_ready(&client, "web", 3).await;
    let budget = |allowed: i32| {
        let pdbs = pdbs.clone();
        async move {
            let s = pdbs.get("web").await.unwrap().status?;
            (s.disruptions_allowed == Some(allowed)
                && s.current_healthy == Some(3)
                && s.expected_pods == Some(3)
                && s.desired_healthy == Some(2))
            .then_some(())
        }
    };
    eventually_every(
        "PDB status allowing one disruption",
        Duration::from_secs(10),
        POLL,
        || budget(1),
    )
    .await;
    assert_eq!(world.svid("cluster-1").unwrap().get(), 3);

    // When: the namespace moves to canary and one pod is evicted, then a second right away.
    retag_namespace(&client, "canary").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // kube-rs retries 429 answers by itself, so the refusal shows as waiting: the second eviction
    // only gets through once the replacement is Ready (3 s) and the budget allows one again.
    let t0 = Instant::now();
    pods.evict(&first[0].name_any(), &EvictParams::default())
        .await
        .unwrap();
    let waited = eventually_every(
        "the budget to allow the second eviction",
        Duration::from_secs(30).saturating_sub(t0.elapsed()),
        Duration::from_millis(100),
        async || match pods
            .evict(&first[1].name_any(), &EvictParams::default())
            .await
        {
            Ok(_) => Ok(t0.elapsed()),
            Err(kube::Error::Api(s)) if s.code == 429 => {
                Err("budget never allowed the second eviction".to_string())
            }
            Err(e) => panic!("second eviction failed: {e}"),
        },
    )
    .await;
    assert!(
        waited >= Duration::from_secs(2),
        "second eviction went through after {waited:?}, before the replacement was Ready"
    );
    let at_second: Vec<Pod> = live_pods(&client, "web").await;
    let replacement = at_second
        .iter()
        .find(|p| !first.iter().any(|f| f.name_any() == p.name_any()))
        .expect("a replacement pod exists");
    assert!(
        ready(replacement),
        "the budget allowed the second eviction only with the replacement Ready"
    );
    assert_eq!(revision(replacement).as_deref(), Some("1-28"));

    // Then: both evicted pods are replaced by pods injected by 1-28; the third keeps 1-27.
    let after = all_ready(&client, "web", 3).await;
    let names: BTreeSet<String> = after.iter().map(|p| p.name_any()).collect();
    assert!(!names.contains(&first[0].name_any()) && !names.contains(&first[1].name_any()));
    let mut revisions: Vec<String> = after.iter().filter_map(revision).collect();
    revisions.sort();
    assert_eq!(revisions, ["1-27", "1-28", "1-28"]);
    assert_eq!(
        world.svid("cluster-1").unwrap().get(),
        5,
        "one SVID per replacement"
    );
    eventually_every(
        "PDB allowing one disruption again",
        Duration::from_secs(10),
        POLL,
        || budget(1),
    )
    .await;
}

#[tokio::test]
async fn statefulset_and_daemonset_own_pods_named_like_the_real_controllers() {
    let (_emu, client) = given_a_meshed_cluster().await;
    let world = world(&client);
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": NS},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "db:1"}]}}}
    }))
    .unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    sets.create(&PostParams::default(), &sts).await.unwrap();
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent", "sidecar.istio.io/inject": "false"}},
                              "spec": {"containers": [{"name": "agent", "image": "agent:1"}]}}}
    }))
    .unwrap();
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    dss.create(&PostParams::default(), &ds).await.unwrap();

    let db = all_ready(&client, "db", 2).await;
    let names: BTreeSet<String> = db.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["db-0".to_string(), "db-1".to_string()])
    );
    let agents = all_ready(&client, "agent", 3).await;
    let nodes: BTreeSet<String> = agents
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(nodes.len(), 3, "one agent per node");
    assert!(
        agents.iter().all(|p| revision(p).is_none()),
        "opted-out pods are not injected"
    );
    assert_eq!(
        world.svid("cluster-1").unwrap().get(),
        2,
        "only the injected db pods cost SVIDs"
    );

    eventually_every("workload status", Duration::from_secs(10), POLL, || async {
        let s = sets.get("db").await.unwrap().status?;
        let d = dss.get("agent").await.unwrap().status?;
        (s.ready_replicas == Some(2) && d.number_ready == 3 && d.desired_number_scheduled == 3)
            .then_some(())
    })
    .await;

    // A deleted StatefulSet pod comes back under its name, injected by the tag's new revision.
    retag_namespace(&client, "canary").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    let db = eventually_every(
        "db-0 recreated on 1-28",
        Duration::from_secs(20),
        POLL,
        || async {
            let pods = live_pods(&client, "db").await;
            let back = pods.iter().find(|p| {
                p.name_any() == "db-0" && ready(p) && revision(p).as_deref() == Some("1-28")
            });
            (pods.len() == 2 && back.is_some()).then_some(pods)
        },
    )
    .await;
    assert_eq!(db.len(), 2);
    // Deleting a workload deletes its pods (garbage collection of dependents).
    dss.delete("agent", &DeleteParams::default()).await.unwrap();
    eventually_every(
        "agent pods collected",
        Duration::from_secs(10),
        POLL,
        || async { live_pods(&client, "agent").await.is_empty().then_some(()) },
    )
    .await;
}
