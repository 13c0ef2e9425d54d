//! Each operator binary, authenticated as its chart ServiceAccount, against a Kubernetes API
//! emulator that enforces exactly the RBAC the chart renders (default values for wave-gate and
//! revert beside Argo CD, workload-cluster values for rollout-weights and upgrade-revisions):
//! each exercises its real write paths, logs no denial and reaches the expected phase; and one
//! operator with one rule taken out of its ClusterRole fails visibly. With
//! `SLUICE_E2E_CONTROL_PLANE=real` every cluster is a real kube-apiserver v1.37.2 instead
//! (`scripts/install-control-plane.sh`), enforcing the chart's RBAC and admission policy itself.
//! With `KUBECONFIG` and `SLUICE_E2E_CLUSTER=1` the scenarios run against that cluster, where the
//! chart is installed.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use sluice_api::{
    external::{
        argocd::{Application, ApplicationSet},
        http_route::HttpRoute,
    },
    v1alpha1::{
        RevisionUpgrade, RevisionUpgradePhase, Rollout, RolloutPhase, WaveGate, WaveGatePhase,
        rollout::ROUTE_OWNER_ANNOTATION,
    },
};
use sluice_e2e::{
    binaries::{self, Operator},
    chart::{self, Mode},
    eventually,
    process::{OperatorProcess, free_port},
    repo_root,
    target::{self, Target},
};
use sluice_sim::{ClusterConfig, Scenario, World};
use sluice_testkit::prometheus::Prometheus;

/// Budget of each scenario's main wait.
const BUDGET: Duration = Duration::from_secs(45);
/// The workload cluster's name (the `cluster` label of its telemetry).
const CLUSTER: &str = "cluster-1";

/// What every scenario needs, or `None` with the reason printed.
struct Prereqs {
    upstream: PathBuf,
    rendered: Vec<Value>,
    prometheus: Prometheus,
}

async fn prereqs(mode: Mode) -> Option<Prereqs> {
    let upstream = sluice_e2e::upstream()?;
    if target::real_mode() {
        sluice_testkit::control_plane::require()?;
    }
    let rendered = if target::cluster_mode() {
        Vec::new()
    } else {
        match chart::render(&repo_root(), mode) {
            Ok(d) => d,
            Err(e) if e.category() == "helm_missing" => {
                sluice_testkit::prereq::Missing::new(
                    e.to_string(),
                    sluice_testkit::prereq::INSTALL_TOOLS,
                )
                .skip();
                return None;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let prometheus = Prometheus::start_or_skip().await?;
    Some(Prereqs {
        upstream,
        rendered,
        prometheus,
    })
}

async fn target(p: &Prereqs, rendered: &[Value], namespaces: &[&str]) -> Target {
    if target::cluster_mode() {
        let t = Target::cluster().await.expect("cluster reachable");
        let api: Api<Namespace> = Api::all(t.admin());
        for ns in namespaces {
            let body: Namespace =
                serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
            // Already there is fine: the namespaces are the cluster's.
            let _ = api.create(&PostParams::default(), &body).await;
        }
        return t;
    }
    let crds = target::crd_files(&repo_root(), &p.upstream);
    if target::real_mode() {
        return Target::real(&crds, rendered, namespaces)
            .await
            .expect("real control plane with the chart's RBAC")
            .expect("the control plane's binaries (prereqs checks them)");
    }
    Target::emulated(&crds, rendered, namespaces)
        .await
        .expect("emulator with the chart's RBAC")
}

/// The negative check's setup: the prerequisites for `mode` and the chart's RBAC with the rule of
/// `op`'s ClusterRole that grants `group`/`resource` taken out. `None`, with the reason printed,
/// on a real cluster (whose RBAC this suite does not edit) or without the prerequisites.
async fn without_grant(
    mode: Mode,
    op: Operator,
    group: &str,
    resource: &str,
) -> Option<(Prereqs, Vec<Value>)> {
    if target::cluster_mode() {
        println!("skipping: the negative check edits RBAC, which only the emulator does here");
        return None;
    }
    let p = prereqs(mode).await?;
    let role = chart::service_account(op.component());
    let (rendered, removed) = chart::without_rule(&p.rendered, "ClusterRole", &role, |r| {
        chart::rule_grants(r, group, resource)
    });
    assert!(
        removed.is_some(),
        "the chart grants {} {group}/{resource} in ClusterRole {role}",
        op.component()
    );
    Some((p, rendered))
}

/// Waits for the first denial in `op`'s log and prints it.
async fn denial_logged(op: &OperatorProcess) -> String {
    let denied = eventually("a denial in the operator's log", BUDGET, async || {
        let d = op.denials();
        d.first().cloned().ok_or(op.log())
    })
    .await;
    println!("denied as expected: {denied}");
    denied
}

/// The simulator's cluster behaviour for `t`: on the emulator, its own workload and disruption
/// controllers and injection; on a real control plane only the kubelet (binding, pod IPs,
/// readiness after `readiness_delay`, the end of graceful deletions), since kube-controller-manager
/// runs the real Deployment, ReplicaSet and disruption controllers there.
fn cluster_config(t: &Target, readiness_delay: Duration) -> ClusterConfig {
    let mut config = if t.control_plane().is_some() {
        ClusterConfig::on_real_control_plane(CLUSTER)
    } else {
        ClusterConfig::new(CLUSTER)
    };
    config.readiness_delay = readiness_delay;
    config
}

/// On a real control plane, serves Istio's injector for the world's cluster as a real mutating
/// admission webhook (the real ReplicaSet controller creates the pods there); nothing on the
/// emulator, where the simulator's workload controllers inject.
async fn serve_injector(t: &Target, world: &mut World) {
    if let Some(cp) = t.control_plane() {
        world
            .serve_injector(CLUSTER, t.admin(), cp.ca())
            .await
            .expect("injector webhook registered");
    }
}

/// Ends a scenario: the operator this process started (none on a real cluster, or one already
/// stopped) must still be running; then it and the world stop before the target does, and the
/// scenario's duration is printed.
async fn finish(
    mut op: Option<OperatorProcess>,
    world: impl Into<Option<World>>,
    t: Target,
    started: std::time::Instant,
) {
    if let Some(op) = &mut op {
        op.assert_healthy();
    }
    drop(op);
    drop(world.into());
    t.stop().await;
    println!("scenario took {:.1?}", started.elapsed());
}

/// Starts `op` as the chart would (its Deployment's arguments, its ServiceAccount's identity)
/// with `env`; `None` on a real cluster, where the chart's Deployment runs it.
fn run(
    t: &Target,
    rendered: &[Value],
    op: Operator,
    env_extra: &[(&str, String)],
    logs: &tempfile::TempDir,
) -> Option<OperatorProcess> {
    let kubeconfig =
        t.service_account_kubeconfig(chart::NAMESPACE, &chart::service_account(op.component()))?;
    let binary = binaries::path(op).unwrap_or_else(|e| panic!("{e}"));
    let args = chart::deployment_args(rendered, op.component(), free_port())
        .unwrap_or_else(|| panic!("the chart renders no Deployment for {}", op.component()));
    // The chart's downward-API variables, then the scenario's settings.
    let mut env: Vec<(String, String)> = vec![
        ("POD_NAME".into(), format!("{}-0", op.binary())),
        ("POD_NAMESPACE".into(), chart::NAMESPACE.into()),
    ];
    env.extend(env_extra.iter().map(|(k, v)| ((*k).into(), v.clone())));
    Some(
        OperatorProcess::start(&binary, &kubeconfig, &args, &env, logs.path())
            .expect("operator binary starts"),
    )
}

async fn create<K>(client: &Client, ns: Option<&str>, body: Value) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let obj: K = serde_json::from_value(body).expect("fixture deserializes");
    let api: Api<K> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::default_namespaced(client.clone()),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .expect("fixture created")
}

fn deployment_and_service(ns: &str, name: &str, replicas: i32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: example/{name}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  selector: {{app: {name}}}\n  ports:\n  - port: 80\n"
    )
}

// ---------------------------------------------------------------------------------------------
// rollout-weights

const SHOP: &str = "shop";
const STABLE: &str = "checkout-v2-13";
const CANARY: &str = "checkout-v2-14";

/// The shop's checkout route, two versions, and the world making Deployments ready and
/// reporting the mesh's telemetry into Prometheus.
async fn shop(t: &Target, prom: &Prometheus) -> Option<World> {
    if t.is_cluster() {
        return None;
    }
    for name in [STABLE, CANARY] {
        t.load_yaml(&deployment_and_service(SHOP, name, 1))
            .await
            .expect("shop fixtures load");
    }
    let route = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "checkout", "namespace": SHOP},
        "spec": {
            "parentRefs": [{"name": "mesh-gw", "namespace": "gateways"}],
            "rules": [{"name": "main", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                       "backendRefs": [{"name": STABLE, "port": 80, "weight": 100}]}]
        }
    });
    create::<HttpRoute>(&t.admin(), Some(SHOP), route).await;
    let mut scenario = Scenario::shipped("canary-promote").expect("shipped scenario");
    for s in &mut scenario.services {
        s.requests_per_second = 4000.0;
    }
    let mut world = World::builder()
        .cluster_with(cluster_config(t, Duration::from_millis(300)), t.admin())
        .telemetry(prom.url(), scenario, Duration::from_secs(1))
        .start()
        .expect("world starts");
    serve_injector(t, &mut world).await;
    Some(world)
}

fn checkout_rollout() -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "checkout", "namespace": SHOP},
        "spec": {
            "routeRef": {"name": "checkout"},
            "stableService": {"name": STABLE},
            "canaryService": {"name": CANARY},
            "canaryWorkload": {"name": CANARY},
            "analysisInterval": "1s",
            "canaryReadyDeadline": "60s",
            "appliedShareDeadline": "60s",
            "steps": [{"setWeight": {"weight": 5, "duration": "120s"}}, {"promote": {}}],
        }
    })
}

fn canary_weight(route: &HttpRoute) -> Option<i32> {
    let rule = route.rule_by_name("main")?;
    rule.backend(CANARY).map(|b| b.effective_weight())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_weights_owns_the_route_and_writes_a_weight() {
    let started = std::time::Instant::now();
    if target::cluster_mode() {
        println!("skipping on a real cluster: the mesh simulator makes the canary ready here");
        return;
    }
    let Some(p) = prereqs(Mode::Workload).await else {
        return;
    };
    let t = target(&p, &p.rendered, &[SHOP]).await;
    let world = shop(&t, &p.prometheus).await;
    let logs = tempfile::tempdir().unwrap();
    let op = run(
        &t,
        &p.rendered,
        Operator::RolloutWeights,
        &[
            ("SLUICE_PROMETHEUS_URL", p.prometheus.url().to_owned()),
            ("SLUICE_CLUSTER", CLUSTER.to_owned()),
        ],
        &logs,
    );

    // When a Rollout of checkout asks for 5%.
    let client = t.admin();
    create::<Rollout>(&client, Some(SHOP), checkout_rollout()).await;

    // Then the route is owned and carries the weight, and the Rollout is Progressing.
    let routes: Api<HttpRoute> = Api::namespaced(client.clone(), SHOP);
    eventually("route owned at 5%", BUDGET, async || {
        let r = routes.get("checkout").await.map_err(|e| e.to_string())?;
        let owned = r
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ROUTE_OWNER_ANNOTATION));
        (owned && canary_weight(&r) == Some(5))
            .then_some(())
            .ok_or(format!(
                "owned {owned}, canary weight {:?}",
                canary_weight(&r)
            ))
    })
    .await;
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), SHOP);
    eventually("Rollout Progressing", BUDGET, async || {
        let r = rollouts.get("checkout").await.map_err(|e| e.to_string())?;
        let phase = r.status.as_ref().map(|s| s.phase);
        (phase == Some(RolloutPhase::Progressing))
            .then_some(())
            .ok_or(format!("{phase:?}"))
    })
    .await;
    // And the chart's owned-route policy is in force beside its RBAC: the administrator may
    // not change the owned route's rules.
    let mut r = routes.get("checkout").await.unwrap();
    let rules = r.spec.rules.as_mut().expect("rules");
    rules[0].backend_mut(STABLE).expect("stable backend").weight = Some(50);
    let denied = routes.replace("checkout", &PostParams::default(), &r).await;
    match denied {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
            println!("owned-route policy denied the administrator: {}", e.message)
        }
        other => panic!(
            "the owned-route policy must deny a foreign change to an owned route's rules: {other:?}"
        ),
    }
    finish(op, world, t, started).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_weights_without_its_route_grant_fails_visibly() {
    let started = std::time::Instant::now();
    // Given the chart's RBAC with the HTTPRoute rule taken out of rollout-weights' ClusterRole.
    let Some((p, rendered)) = without_grant(
        Mode::Workload,
        Operator::RolloutWeights,
        "gateway.networking.k8s.io",
        "httproutes",
    )
    .await
    else {
        return;
    };
    let t = target(&p, &rendered, &[SHOP]).await;
    let world = shop(&t, &p.prometheus).await;
    let logs = tempfile::tempdir().unwrap();
    let op = run(
        &t,
        &rendered,
        Operator::RolloutWeights,
        &[
            ("SLUICE_PROMETHEUS_URL", p.prometheus.url().to_owned()),
            ("SLUICE_CLUSTER", CLUSTER.to_owned()),
        ],
        &logs,
    )
    .expect("emulated");
    create::<Rollout>(&t.admin(), Some(SHOP), checkout_rollout()).await;

    // Then its log reports the denial, and the route is untouched.
    denial_logged(&op).await;
    let routes: Api<HttpRoute> = Api::namespaced(t.admin(), SHOP);
    let r = routes.get("checkout").await.unwrap();
    assert_eq!(
        canary_weight(&r),
        None,
        "no weight written without the grant"
    );
    // A denied operator may well have stopped: it is not checked, only stopped first.
    drop(op);
    finish(None, world, t, started).await;
}

// ---------------------------------------------------------------------------------------------
// wave-gate

const ARGOCD: &str = "argocd";

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wave_gate_adopts_and_publishes_decisions() {
    let started = std::time::Instant::now();
    let Some(p) = prereqs(Mode::Management).await else {
        return;
    };
    let t = target(&p, &p.rendered, &[ARGOCD]).await;
    let logs = tempfile::tempdir().unwrap();
    let op = run(
        &t,
        &p.rendered,
        Operator::WaveGate,
        &[("SLUICE_PROMETHEUS_URL", p.prometheus.url().to_owned())],
        &logs,
    );
    let client = t.admin();
    let clusters = ["eu-1", "eu-2", "eu-3"];

    // Given the site's ApplicationSet (safe policy) and its Applications Synced at a.
    let set: ApplicationSet = create(
        &client,
        Some(ARGOCD),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "metadata": {"name": "mesh-eu", "namespace": ARGOCD},
            "spec": {
                "goTemplate": true,
                "generators": [{"clusterDecisionResource": {"configMapRef": "sluice-wavegates", "name": "eu", "requeueAfterSeconds": 30}}],
                "template": {
                    "metadata": {"name": "mesh-{{.clusterName}}"},
                    "spec": {"project": "mesh", "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": "{{.revision}}", "path": "."}, "destination": {"name": "{{.clusterName}}", "namespace": "istio-config"}}
                },
                "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
                "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}],
            }
        }),
    )
    .await;
    let uid = set.metadata.uid.clone().unwrap();
    for c in clusters {
        create::<Application>(
            &client,
            Some(ARGOCD),
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": format!("mesh-{c}"), "namespace": ARGOCD, "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "mesh-eu", "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"project": "mesh", "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": digest('a'), "path": "."}, "destination": {"name": c, "namespace": "istio-config"}},
                "status": {"sync": {"status": "Synced", "revision": digest('a')}, "health": {"status": "Healthy"}},
            }),
        )
        .await;
    }

    // When the WaveGate asks for b.
    create::<WaveGate>(
        &client,
        Some(ARGOCD),
        json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
            "metadata": {"name": "eu", "namespace": ARGOCD},
            "spec": {
                "site": "eu",
                "applicationSetRef": {"name": "mesh-eu"},
                "repository": "oci://registry.local:5000/mesh/config",
                "revision": digest('b'),
                "sourceCommit": "bbbbbbbbbbbb",
                "waves": [
                    {"name": "canary", "clusters": ["eu-1"], "soak": "3s"},
                    {"name": "rest", "clusters": ["eu-2", "eu-3"]}
                ],
                "convergenceTimeout": "120s",
                "analysisInterval": "1s",
                "defaultSoak": "3s",
                "driftGate": {"exporter": "Platform", "metric": "sluice_drift_proxies_behind"},
                "pin": {"publicKeysSecretRef": {"name": "cosign-keys"}},
            }
        }),
    )
    .await;

    // Then it adopts the site and publishes every cluster's decision: the canary at b, the rest
    // still at a.
    let gates: Api<WaveGate> = Api::namespaced(client.clone(), ARGOCD);
    let seen = eventually("decisions published, wave 0 admitted", BUDGET, async || {
        let g = gates.get("eu").await.map_err(|e| e.to_string())?;
        let s = g.status.clone().unwrap_or_default();
        (s.phase == WaveGatePhase::Progressing && s.decisions.len() == clusters.len())
            .then_some(s)
            .ok_or(format!("{:?}", g.status))
    })
    .await;
    for d in &seen.decisions {
        let want = if d.cluster_name == "eu-1" {
            digest('b')
        } else {
            digest('a')
        };
        assert_eq!(d.revision, want, "decision for {}", d.cluster_name);
    }
    t.assert_cluster_operator_not_denied(Operator::WaveGate.component())
        .await;
    finish(op, None, t, started).await;
}

// ---------------------------------------------------------------------------------------------
// upgrade-revisions

/// The `edge` namespace on revision tag `stable` (1-27) with two meshed pods of a Deployment
/// without a PodDisruptionBudget whose `maxUnavailable: 1` lets upgrade-revisions evict one pod
/// at a time (with `maxUnavailable: 0` it would restart the Deployment instead), the revision-tag
/// webhooks, and the world injecting pods and reporting xDS telemetry; returns once both pods
/// run 1-27.
async fn edge_fleet(t: &Target, prom: &Prometheus) -> World {
    for (name, tag, rev) in [
        ("istio-revision-tag-stable", Some("stable"), "1-27"),
        ("istio-revision-tag-canary", Some("canary"), "1-28"),
        ("istio-sidecar-injector-1-27", None, "1-27"),
        ("istio-sidecar-injector-1-28", None, "1-28"),
    ] {
        let tag = tag
            .map(|t| format!("\n    istio.io/tag: {t}"))
            .unwrap_or_default();
        t.load_yaml(&format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata:\n  name: {name}\n  labels:\n    istio.io/rev: \"{rev}\"{tag}\n"
        ))
        .await
        .expect("webhook fixture");
    }
    t.load_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: edge\n  labels:\n    istio.io/rev: stable\n    sluice.dev/risk-tier: low\n",
    )
    .await
    .unwrap();
    let scenario = Scenario::from_yaml(&format!(
        "name: revision-upgrade\nclusters:\n  - name: {CLUSTER}\n    xds_pushes_per_second: 4\nservices: []\n"
    ))
    .unwrap();
    let mut world = World::builder()
        .cluster_with(cluster_config(t, Duration::from_millis(200)), t.admin())
        .telemetry(prom.url(), scenario, Duration::from_secs(1))
        .start()
        .unwrap();
    // The injector serves before the Deployment exists: on a real control plane the ReplicaSet
    // controller creates its pods at once, and a pod created before the webhook is registered
    // stays uninjected.
    serve_injector(t, &mut world).await;
    t.load_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: gw\n  namespace: edge\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {app: gw}\n  strategy:\n    type: RollingUpdate\n    rollingUpdate: {maxSurge: 1, maxUnavailable: 1}\n  template:\n    metadata:\n      labels: {app: gw}\n    spec:\n      containers:\n      - name: app\n        image: gw:1\n",
    )
    .await
    .unwrap();
    let client = t.admin();

    eventually("both pods injected by 1-27", BUDGET, async || {
        let r = revisions(&client).await?;
        (r == (2, 0)).then_some(()).ok_or(format!("{r:?}"))
    })
    .await;
    world
}

/// Pods of `edge` by injected revision: (1-27, 1-28).
async fn revisions(client: &Client) -> Result<(usize, usize), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "edge");
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = (0, 0);
    for pod in list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let status = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("sidecar.istio.io/status"))
            .cloned()
            .unwrap_or_default();
        if status.contains("\"1-27\"") {
            out.0 += 1;
        } else if status.contains("\"1-28\"") {
            out.1 += 1;
        }
    }
    Ok(out)
}

/// A RevisionUpgrade moving the low-risk wave from stable (1-27) to canary (1-28).
fn istio_upgrade() -> RevisionUpgrade {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RevisionUpgrade",
        "metadata": {"name": "istio-1-28"},
        "spec": {
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28",
            "waves": [{"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "2s"}],
            "issuanceBudget": {"rate": 8, "depth": 8, "peakPerSecond": 10},
            "analysisInterval": "1s",
            "gates": [{"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "4s", "minSamples": 1, "consecutiveFailures": 1}],
        }
    }))
    .expect("fixture RevisionUpgrade deserializes")
}

fn upgrade_env(prom: &Prometheus) -> Vec<(&'static str, String)> {
    vec![
        ("SLUICE_PROMETHEUS_URL", prom.url().to_owned()),
        ("SLUICE_CLUSTER", CLUSTER.to_owned()),
        ("SLUICE_ISSUANCE_WINDOW_SECONDS", "5".to_owned()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_revisions_relabels_a_namespace_and_evicts_its_pods() {
    let started = std::time::Instant::now();
    let Some(p) = prereqs(Mode::Workload).await else {
        return;
    };
    let t = target(&p, &p.rendered, &[]).await;
    if t.is_cluster() {
        println!(
            "skipping on a real cluster: it needs Istio's injector, which the simulator plays here"
        );
        return;
    }
    let world = edge_fleet(&t, &p.prometheus).await;
    let client = t.admin();
    let revisions = async || revisions(&client).await;

    let logs = tempfile::tempdir().unwrap();
    let op = run(
        &t,
        &p.rendered,
        Operator::UpgradeRevisions,
        &upgrade_env(&p.prometheus),
        &logs,
    );

    // When the namespace's wave moves from stable (1-27) to canary (1-28).
    let upgrade = istio_upgrade();
    let upgrades: Api<RevisionUpgrade> = Api::all(client.clone());
    upgrades
        .create(&PostParams::default(), &upgrade)
        .await
        .unwrap();

    // Then the namespace is relabelled, its pods are evicted onto 1-28, and the upgrade is
    // Complete.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    eventually("edge relabelled to canary", BUDGET, async || {
        let ns = namespaces.get("edge").await.map_err(|e| e.to_string())?;
        let tag = ns
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("istio.io/rev"))
            .cloned();
        (tag.as_deref() == Some("canary"))
            .then_some(())
            .ok_or(format!("{tag:?}"))
    })
    .await;
    eventually("pods restarted onto 1-28", BUDGET, async || {
        let r = revisions().await?;
        (r == (0, 2)).then_some(()).ok_or(format!("{r:?}"))
    })
    .await;
    eventually("RevisionUpgrade Complete", BUDGET, async || {
        let u = upgrades
            .get("istio-1-28")
            .await
            .map_err(|e| e.to_string())?;
        let phase = u.status.as_ref().map(|s| s.phase);
        (phase == Some(RevisionUpgradePhase::Complete))
            .then_some(())
            .ok_or(format!("{:?}", u.status))
    })
    .await;
    finish(op, world, t, started).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_revisions_without_its_eviction_grant_fails_visibly() {
    let started = std::time::Instant::now();
    // Given the chart's RBAC with the pods/eviction rule taken out of upgrade-revisions' role.
    let Some((p, rendered)) = without_grant(
        Mode::Workload,
        Operator::UpgradeRevisions,
        "",
        "pods/eviction",
    )
    .await
    else {
        return;
    };
    let t = target(&p, &rendered, &[]).await;
    let world = edge_fleet(&t, &p.prometheus).await;
    let logs = tempfile::tempdir().unwrap();
    let op = run(
        &t,
        &rendered,
        Operator::UpgradeRevisions,
        &upgrade_env(&p.prometheus),
        &logs,
    )
    .expect("emulated or real");
    let upgrades: Api<RevisionUpgrade> = Api::all(t.admin());
    upgrades
        .create(&PostParams::default(), &istio_upgrade())
        .await
        .unwrap();

    // Then its log reports the denied eviction, and no pod moved to 1-28.
    denial_logged(&op).await;
    assert_eq!(revisions(&t.admin()).await, Ok((2, 0)), "no pod restarted");
    // A denied operator may well have stopped: it is not checked, only stopped first.
    drop(op);
    finish(None, world, t, started).await;
}

// ---------------------------------------------------------------------------------------------
// revert

/// The destination cluster's name in Argo CD and in revert's identity Secret.
const DESTINATION: &str = "c1";
/// The Secret of cosign public keys the chart lets revert read.
const KEYS_SECRET: &str = "sluice-cosign-public-keys";

fn pin_route(canary: u32) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: checkout\n  namespace: {SHOP}\nspec:\n  parentRefs:\n    - name: mesh-gateway\n  rules:\n    - backendRefs:\n        - name: checkout-stable\n          port: 8080\n          weight: {}\n        - name: checkout-canary\n          port: 8080\n          weight: {canary}\n",
        100 - canary
    )
}

fn secret(
    name: &str,
    labels: &[(&str, &str)],
    data: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Renders and pushes a bundle holding the checkout route at `canary`, signed when `key` is
/// given; returns its manifest digest.
async fn bundle(
    client: &sluice_bundle::BundleClient,
    repo: &str,
    canary: u32,
    key: Option<&sluice_bundle::SigningKey>,
) -> String {
    let files = sluice_bundle::Manifests::from_files(vec![sluice_bundle::ManifestFile {
        path: "route.yaml".into(),
        contents: pin_route(canary).into_bytes(),
    }])
    .expect("valid manifests");
    let artifact = sluice_bundle::render(
        &files,
        &sluice_bundle::Metadata {
            source_commit: Some(format!("c0ffee{canary}")),
            ..Default::default()
        },
    )
    .expect("bundle renders");
    let pushed = client.push(&artifact, repo).await.expect("bundle pushed");
    if let Some(key) = key {
        client
            .sign(&pushed.reference, key)
            .await
            .expect("bundle signed");
    }
    pushed.manifest_digest
}

fn pin(name: &str, repo: &str, digest: &str) -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "BundlePin",
        "metadata": {"name": name, "namespace": ARGOCD},
        "spec": {
            "targets": [{"name": "mesh-c1"}],
            "bundle": {"repository": format!("oci://{repo}"), "digest": digest},
            "publicKeysSecretRef": {"name": KEYS_SECRET, "keys": ["cosign.pub"]},
            "reason": "5xx after change 42",
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revert_refuses_an_unsigned_bundle_and_pins_a_signed_one_with_its_target_identity() {
    let started = std::time::Instant::now();
    if target::cluster_mode() {
        println!("skipping on a real cluster: it needs the local registry and a second cluster");
        return;
    }
    let Some(p) = prereqs(Mode::Management).await else {
        return;
    };
    let Some(registry) = sluice_testkit::registry::Registry::start_or_skip().await else {
        return;
    };
    let workload_rendered = match chart::render(&repo_root(), Mode::Workload) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    // Given a management cluster with the chart's default RBAC and a workload cluster with the
    // workload-mode RBAC (revert's target identity).
    let mgmt = target(&p, &p.rendered, &[ARGOCD]).await;
    let crds = target::crd_files(&repo_root(), &p.upstream);
    let workload = if target::real_mode() {
        Target::real(&crds, &workload_rendered, &[SHOP])
            .await
            .expect("workload control plane")
            .expect("the control plane's binaries")
    } else {
        Target::emulated(&crds, &workload_rendered, &[SHOP])
            .await
            .expect("workload emulator")
    };
    let target_sa = workload_rendered
        .iter()
        .find(|d| {
            d["kind"] == "ServiceAccount"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("revert"))
        })
        .and_then(|d| d["metadata"]["name"].as_str())
        .expect("workload mode renders revert's target ServiceAccount")
        .to_owned();
    let target_token = workload
        .service_account_token(chart::NAMESPACE, &target_sa)
        .expect("the target identity's token");
    let server = workload.base_url().unwrap();
    let mut identity = vec![
        ("name", DESTINATION),
        ("server", server.as_str()),
        ("token", target_token.as_str()),
    ];
    let ca = workload.ca_pem();
    if let Some(ca) = &ca {
        identity.push(("ca.crt", ca.as_str()));
    }
    let admin = mgmt.admin();
    let system: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(admin.clone(), chart::NAMESPACE);
    system
        .create(
            &PostParams::default(),
            &secret(
                "revert-c1",
                &[("sluice.dev/revert-cluster", "true")],
                &identity,
            ),
        )
        .await
        .unwrap();
    let signer = sluice_bundle::SigningKey::generate().unwrap();
    let argocd_secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(admin.clone(), ARGOCD);
    argocd_secrets
        .create(
            &PostParams::default(),
            &secret(
                KEYS_SECRET,
                &[],
                &[("cosign.pub", signer.public_key().pem())],
            ),
        )
        .await
        .unwrap();
    let repo = registry.repository("mesh/config");
    let bundles = sluice_bundle::BundleClient::new(sluice_bundle::RegistryOptions::default());
    let bad = bundle(&bundles, &repo, 50, Some(&signer)).await;
    let unsigned = bundle(&bundles, &repo, 1, None).await;
    let good = bundle(&bundles, &repo, 0, Some(&signer)).await;
    create::<Application>(
        &admin,
        Some(ARGOCD),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "mesh-c1", "namespace": ARGOCD},
            "spec": {
                "project": "default",
                "source": {"repoURL": format!("oci://{repo}"), "targetRevision": bad, "path": "."},
                "destination": {"name": DESTINATION, "namespace": SHOP},
                "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
            },
            // Argo CD deployed the good bundle, then the bad one: a pin goes back to a revision
            // this Application ran (revert refuses any other unless the pin allows it).
            "status": {
                "sync": {"status": "Synced", "revision": bad},
                "health": {"status": "Healthy"},
                "history": [
                    {"id": 0, "revision": good, "deployedAt": "2026-12-01T10:00:00Z",
                     "source": {"repoURL": format!("oci://{repo}"), "targetRevision": good, "path": "."}},
                    {"id": 1, "revision": bad, "deployedAt": "2026-12-01T11:00:00Z",
                     "source": {"repoURL": format!("oci://{repo}"), "targetRevision": bad, "path": "."}},
                ],
            },
        }),
    )
    .await;
    let logs = tempfile::tempdir().unwrap();
    let mut op = run(
        &mgmt,
        &p.rendered,
        Operator::Revert,
        &[
            ("SLUICE_REVERT_INSECURE_REGISTRIES", registry.host()),
            // A missing signature is retried for this long after the pin's creation (the
            // default 120 s covers a replicated registry); the scenario's budget is 45 s.
            ("SLUICE_REVERT_SIGNATURE_GRACE_SECONDS", "3".into()),
        ],
        &logs,
    )
    .expect("emulated");
    let pins: Api<sluice_api::v1alpha1::BundlePin> = Api::namespaced(admin.clone(), ARGOCD);
    let phase_of = async |name: &str| -> Result<sluice_api::v1alpha1::BundlePin, String> {
        let p = pins.get(name).await.map_err(|e| e.to_string())?;
        Ok(p)
    };

    // When a pin names an unsigned bundle: refused, with a condition, nothing applied.
    create::<sluice_api::v1alpha1::BundlePin>(
        &admin,
        Some(ARGOCD),
        pin("unsigned", &repo, &unsigned),
    )
    .await;
    let refused = eventually("unsigned pin Refused", BUDGET, async || {
        let p = phase_of("unsigned").await?;
        let s = p.status.clone().unwrap_or_default();
        (s.phase == sluice_api::v1alpha1::BundlePinPhase::Refused)
            .then_some(s)
            .ok_or(format!("{:?}", p.status))
    })
    .await;
    assert!(
        refused.conditions.iter().any(|c| c.status == "False"
            && c.reason == sluice_api::v1alpha1::bundle_pin::reasons::UNSIGNED),
        "a condition says Unsigned: {:?}",
        refused.conditions
    );
    let routes = Api::<HttpRoute>::namespaced(workload.admin(), SHOP);
    assert!(
        routes.get_opt("checkout").await.unwrap().is_none(),
        "nothing applied"
    );
    pins.delete("unsigned", &Default::default()).await.unwrap();

    // When a pin names the signed good bundle: applied to the workload cluster with revert's
    // own identity there, and Pinned.
    create::<sluice_api::v1alpha1::BundlePin>(&admin, Some(ARGOCD), pin("good", &repo, &good))
        .await;
    eventually("signed pin Pinned", BUDGET, async || {
        let p = phase_of("good").await?;
        let phase = p.status.as_ref().map(|s| s.phase);
        (phase == Some(sluice_api::v1alpha1::BundlePinPhase::Pinned))
            .then_some(())
            .ok_or(format!("{:?}", p.status))
    })
    .await;
    let route = routes
        .get("checkout")
        .await
        .expect("route applied by the pin");
    let managers: Vec<String> = route
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.is_empty(),
        "applied with server-side apply: {managers:?}"
    );
    let weight = route
        .rules()
        .first()
        .and_then(|r| r.backend("checkout-canary"))
        .map(|b| b.effective_weight());
    assert_eq!(weight, Some(0), "the pinned bundle's weight");
    // And the Application's automated sync is suspended while pinned (revert's write in argocd).
    let app = Api::<Application>::namespaced(admin.clone(), ARGOCD)
        .get("mesh-c1")
        .await
        .unwrap();
    let app = serde_json::to_value(&app).unwrap();
    assert_eq!(
        app["spec"]["syncPolicy"]["automated"]["enabled"],
        json!(false),
        "automated sync suspended: {}",
        app["spec"]["syncPolicy"]
    );
    op.assert_healthy();
    drop(op);
    mgmt.stop().await;
    workload.stop().await;
    println!("scenario took {:.1?}", started.elapsed());
}
