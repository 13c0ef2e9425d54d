//! End to end over the whole path a mesh change takes through one site, with every component
//! real or simulated as the issue asks: a management cluster and three workload clusters
//! (Kubernetes API emulators; the workload clusters enforce RBAC), the simulated Argo CD whose
//! ApplicationSet generates one Application per cluster from the WaveGate through the duck
//! ConfigMap (`clusterDecisionResource`, `applicationsSync: create-update`,
//! `preserveResourcesOnDeletion: true`, the sync policy ignored for every generated
//! Application), a real registry holding cosign-signed OCI bundles of
//! mesh configuration, a real Prometheus fed by the simulated mesh (`sluice-sim`), and the
//! wave-gate and revert operators running in-process.
//!
//! Scenario a: a new revision crosses every wave of the site in order. Scenario b: mesh-attributed
//! errors rise in the canary cluster; the change halts in wave 0, only the canary cluster is
//! pinned, revert applies the previous bundle there, the decisions go back, and the pin releases
//! once Argo CD reports the canary's Application Synced at the previous revision. It prints
//! `halt_to_pin_ms` and `breach_to_reverted_ms`.
//!
//! Without the released CRDs (`.tools/crds`), `prometheus` or `docker-registry` a scenario fails
//! under CI and is skipped and counted otherwise (`sluice_testkit::prereq`). Every scenario runs inside its own time budget; the scenarios run one at a time so
//! their figures are not taken while the other scenario loads the machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_emulator::{ADMIN_TOKEN, Emulator, Options};
use sluice_analysis::{Engine, EngineOptions, PrometheusConfig, PrometheusSource};
use sluice_api::{
    external::argocd::{Application, ApplicationSet},
    v1alpha1::{
        BundlePin, BundlePinPhase, Verdict, WaveGate, WaveGatePhase,
        bundle_pin::{conditions as pin_conditions, reasons as pin_reasons},
        wave_gate::{DUCK_MATCH_KEY, DUCK_RESOURCE, DUCK_STATUS_LIST_KEY, HaltReason, WaveState},
    },
};
use sluice_argocd::{ArgoCd, ArgoCdOptions, cluster_secret};
use sluice_bundle::{
    BundleClient, ManifestFile, Manifests, Metadata, RegistryOptions, SigningKey, render,
};
use sluice_runtime::{
    conditions::find,
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
};
use sluice_sim::Scenario;
use sluice_sim::mesh::{Event, ResponseFlag};
use sluice_testkit::eventually::Wait;
use sluice_testkit::mesh_config::{checkout_route, http_route_resource as route_resource};
use sluice_testkit::secrets::secret;
use sluice_testkit::{prometheus::Prometheus, registry::Registry};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Argo CD's namespace in the management cluster (Applications, WaveGate, BundlePins).
const ARGOCD: &str = "argocd";
/// Namespace of revert's per-cluster identity Secrets.
const SYSTEM: &str = "sluice-system";
/// Namespace of the mesh configuration in every workload cluster.
const SHOP: &str = "shop";
/// The site and its clusters, one per wave: canary, then one, then the rest.
const SITE: &str = "eu";
const CLUSTERS: [&str; 3] = ["eu-1", "eu-2", "eu-3"];
/// The ApplicationSet of the site.
const APPSET: &str = "mesh-eu";
/// The duck ConfigMap the chart ships.
const DUCK: &str = "sluice-wavegate-decisions";
/// Canary weight of the route in each revision's bundle.
const WEIGHT_A: u64 = 0;
const WEIGHT_B: u64 = 10;
/// Requests per second the simulated mesh sends through each cluster's route.
const RPS: f64 = 100.0;
/// Time budget of one scenario, setup included.
const SCENARIO_BUDGET: Duration = Duration::from_secs(58);
/// How a scenario waits: every 20 ms within the scenario's budget (the outer timeout catches the
/// rest), failing with the WaveGate's status ([`Fleet::status_seen`]).
const WAIT: Wait = Wait::within(SCENARIO_BUDGET).every(Duration::from_millis(20));

/// The scenarios share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The released upstream CRDs (`.tools/crds`); when missing the test fails under CI and is
/// skipped and counted otherwise.
fn upstream() -> Option<PathBuf> {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
}

/// The mesh configuration of one revision: the checkout route with `canary` percent on the
/// canary backend.
fn route(canary: u64) -> String {
    checkout_route(SHOP, "checkout", canary)
}

/// The simulated mesh: checkout in every cluster, split by the route Argo CD (or revert)
/// applied there; proxies (20 per cluster) on `commit` at the start and converging on a newly
/// applied commit within a second; mesh-attributed failure series (Envoy flag `UF`,
/// `failure_origin="mesh"`) at zero in every cluster until a fault raises them.
fn mesh_scenario(commit: &str) -> Scenario {
    let mut text = String::from("name: fleet\npropagation_delay: 1s\nclusters:\n");
    for c in CLUSTERS {
        text.push_str(&format!(
            "  - name: {c}\n    xds_pushes_per_second: 10\n    mesh_failure_ratio: 0\n    drift: {{commit: \"{commit}\", convergence: 1s, proxies: 20}}\n"
        ));
    }
    text.push_str("services:\n");
    for c in CLUSTERS {
        text.push_str(&format!(
            "  - name: checkout\n    namespace: {SHOP}\n    cluster: {c}\n    route: checkout\n    requests_per_second: {RPS}\n    versions:\n      - {{name: v1, backend: checkout-stable}}\n      - {{name: v2, backend: checkout-canary}}\n"
        ));
    }
    Scenario::from_yaml(&text).expect("the fleet's mesh scenario is valid")
}

/// A signed bundle in the registry.
#[derive(Debug, Clone)]
struct Revision {
    /// Manifest digest (what decisions and pins name).
    digest: String,
    /// The bundle's source commit (the drift exporter's `commit` label).
    commit: String,
}

/// A running operator (wave-gate or revert).
struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self, what: &str) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap_or_else(|_| panic!("{what} stops within 10 s of its shutdown signal"))
            .unwrap_or_else(|e| panic!("{what} task: {e}"));
    }
}

/// The fleet of one scenario.
struct Fleet {
    registry: Registry,
    prom: Arc<Prometheus>,
    mgmt: Emulator,
    workloads: BTreeMap<&'static str, Emulator>,
    client: Client,
    a: Revision,
    b: Revision,
    argocd: ArgoCd,
    sim: Arc<sluice_sim::World>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    wave_gate: Option<Running>,
    revert: Option<Running>,
}

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
        .expect("a namespace object");
    api.create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

impl Fleet {
    /// Starts the fleet at revision a (adopted by the WaveGate, synced by Argo CD, applied in
    /// every cluster), or returns `None` with the reason printed.
    async fn start(canary_soak: &str) -> Option<Fleet> {
        let level = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        let _ = sluice_runtime::telemetry::init(sluice_runtime::config::LogFormat::Text, &level);
        let upstream = upstream()?;
        let prom = Arc::new(Prometheus::start_or_skip().await?);
        let registry = Registry::start_or_skip().await?;

        // The management cluster: WaveGate, BundlePin and Argo CD's CRDs.
        let mgmt = Emulator::start_with(Options {
            manifests: vec![
                repo_root().join("crds/wavegates.sluice.dev.yaml"),
                repo_root().join("crds/bundlepins.sluice.dev.yaml"),
                upstream.join("argo-cd-v3.5.1/application-crd.yaml"),
                upstream.join("argo-cd-v3.5.1/applicationset-crd.yaml"),
            ],
            ..Default::default()
        })
        .await
        .expect("the management emulator starts");
        let client = mgmt.client();
        for ns in [ARGOCD, SYSTEM] {
            namespace(&client, ns).await;
        }

        // The workload clusters: HTTPRoutes, RBAC on, revert's least-privilege identity. Argo
        // CD reaches each with its own cluster Secret; revert with its own identity, never
        // Argo CD's.
        let mut workloads = BTreeMap::new();
        for c in CLUSTERS {
            let w = Emulator::start_with(Options {
                rbac: true,
                manifests: vec![
                    upstream.join("gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml"),
                ],
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("the workload emulator of {c} starts: {e}"));
            w.load_yaml(&sluice_testkit::rbac::revert_target())
                .unwrap_or_else(|e| panic!("revert's role in {c}: {e}"));
            namespace(&w.client_with_token(ADMIN_TOKEN), SHOP).await;
            let token = w.service_account_token(SYSTEM, "sluice-revert-target");
            Api::<Secret>::namespaced(client.clone(), SYSTEM)
                .create(
                    &PostParams::default(),
                    &secret(
                        &format!("revert-{c}"),
                        &[("sluice.dev/revert-cluster", "true")],
                        &[("name", c), ("server", &w.base_url()), ("token", &token)],
                    ),
                )
                .await
                .expect("revert's identity Secret");
            Api::<Secret>::namespaced(client.clone(), ARGOCD)
                .create(
                    &PostParams::default(),
                    &cluster_secret(c, &w.base_url(), ADMIN_TOKEN, &BTreeMap::new()),
                )
                .await
                .expect("Argo CD's cluster Secret");
            workloads.insert(c, w);
        }

        // Two signed bundles of the mesh configuration: a (canary 0) and b (canary 10).
        let signer = SigningKey::generate().expect("a cosign key");
        Api::<Secret>::namespaced(client.clone(), ARGOCD)
            .create(
                &PostParams::default(),
                &secret("cosign", &[], &[("cosign.pub", signer.public_key().pem())]),
            )
            .await
            .expect("the cosign public key Secret");
        let repo = registry.repository("mesh/config");
        let bundles = BundleClient::new(RegistryOptions::default());
        let mut pushed = Vec::new();
        for (weight, commit) in [(WEIGHT_A, "1a".repeat(20)), (WEIGHT_B, "2b".repeat(20))] {
            let manifests = Manifests::from_files(vec![ManifestFile {
                path: "checkout.yaml".into(),
                contents: route(weight).into_bytes(),
            }])
            .expect("the route is a valid manifest");
            let artifact = render(
                &manifests,
                &Metadata {
                    source_commit: Some(commit.clone()),
                    ..Metadata::default()
                },
            )
            .expect("the bundle renders");
            let p = bundles
                .push(&artifact, &repo)
                .await
                .expect("the bundle is pushed");
            bundles
                .sign(&p.reference, &signer)
                .await
                .expect("the bundle is signed");
            pushed.push(Revision {
                digest: p.manifest_digest.clone(),
                commit,
            });
        }
        let (a, b) = (pushed[0].clone(), pushed[1].clone());

        // The duck ConfigMap and the site's ApplicationSet over the WaveGate.
        let duck: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": DUCK, "namespace": ARGOCD},
            "data": {"apiVersion": "sluice.dev/v1alpha1", "kind": DUCK_RESOURCE, "statusListKey": DUCK_STATUS_LIST_KEY, "matchKey": DUCK_MATCH_KEY},
        }))
        .expect("the duck ConfigMap");
        Api::<ConfigMap>::namespaced(client.clone(), ARGOCD)
            .create(&PostParams::default(), &duck)
            .await
            .expect("the duck ConfigMap is created");
        let set: ApplicationSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "metadata": {"name": APPSET, "namespace": ARGOCD},
            "spec": {
                "goTemplate": true,
                "generators": [{"clusterDecisionResource": {"configMapRef": DUCK, "name": SITE, "requeueAfterSeconds": 30}}],
                "template": {
                    "metadata": {"name": "mesh-{{.clusterName}}"},
                    "spec": {
                        "project": "default",
                        "source": {"repoURL": format!("oci://{repo}"), "targetRevision": "{{.revision}}", "path": "."},
                        "destination": {"name": "{{.clusterName}}", "namespace": SHOP},
                        "syncPolicy": {"automated": {"prune": true, "selfHeal": true}, "syncOptions": ["ServerSideApply=true"]},
                    }
                },
                "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
                // revert suspends automation on a pinned Application; the generator keeps off it.
                "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}],
            }
        }))
        .expect("the ApplicationSet");
        Api::<ApplicationSet>::namespaced(client.clone(), ARGOCD)
            .create(&PostParams::default(), &set)
            .await
            .expect("the ApplicationSet is created");

        let argocd = ArgoCd::start(
            client.clone(),
            ArgoCdOptions {
                insecure_registries: vec![registry.host()],
                ..Default::default()
            },
        )
        .await
        .expect("the simulated Argo CD starts");

        // The simulated mesh, telemetry only (the workload clusters hold no workloads).
        let mut sim = sluice_sim::World::builder();
        for (c, w) in &workloads {
            sim = sim.telemetry_only(*c, w.client_with_token(ADMIN_TOKEN));
        }
        let sim = Arc::new(
            sim.prometheus(prom.url())
                .scenario(mesh_scenario(&a.commit))
                .interval(Duration::from_secs(1))
                .start()
                .expect("the simulated mesh starts"),
        );

        let mut fleet = Fleet {
            registry,
            prom,
            mgmt,
            workloads,
            client,
            a,
            b,
            argocd,
            sim,
            stop: CancellationToken::new(),
            tasks: Vec::new(),
            wave_gate: None,
            revert: None,
        };
        fleet.tasks.push(tokio::spawn(config_applied(
            fleet.client.clone(),
            fleet.sim.clone(),
            [
                (fleet.a.digest.clone(), fleet.a.commit.clone()),
                (fleet.b.digest.clone(), fleet.b.commit.clone()),
            ]
            .into(),
            fleet.stop.clone(),
        )));
        fleet.wave_gate = Some(fleet.start_wave_gate());
        fleet.revert = Some(fleet.start_revert());

        // Given the site at a: the WaveGate adopts a (no Applications yet), Argo CD generates
        // and syncs every Application, the route is applied in every cluster.
        let spec = fleet.spec(&fleet.a, canary_soak);
        let wg: WaveGate = serde_json::from_value(serde_json::json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
            "metadata": {"name": SITE, "namespace": ARGOCD},
            "spec": spec,
        }))
        .expect("the WaveGate");
        fleet
            .wave_gates()
            .create(&PostParams::default(), &wg)
            .await
            .expect("the API server accepts the WaveGate");
        let a = fleet.a.digest.clone();
        WAIT.until_seeing(
            "every Application Synced at a and Healthy",
            async || {
                let apps = fleet.apps().await;
                (apps.len() == CLUSTERS.len()
                    && apps.values().all(|x| x.is_synced_at(&a) && x.is_healthy()))
                .then_some(())
            },
            async || fleet.status_seen().await,
        )
        .await;
        for c in CLUSTERS {
            assert_eq!(fleet.canary_weight(c).await, Some(WEIGHT_A), "{c} runs a");
        }
        Some(fleet)
    }

    /// The WaveGate spec of the site at `revision`: three waves, second-scale gates.
    fn spec(&self, revision: &Revision, canary_soak: &str) -> serde_json::Value {
        serde_json::json!({
            "site": SITE,
            "applicationSetRef": {"name": APPSET},
            "repository": format!("oci://{}", self.registry.repository("mesh/config")),
            "revision": revision.digest,
            "sourceCommit": revision.commit,
            "waves": [
                {"name": "canary", "clusters": ["eu-1"], "soak": canary_soak},
                {"name": "one", "clusters": ["eu-2"], "soak": "2s"},
                {"name": "rest", "clusters": ["eu-3"], "soak": "2s"}
            ],
            "convergenceTimeout": "30s",
            "analysisInterval": "1s",
            "defaultSoak": "2s",
            "gates": [
                {"name": "mesh-error-ratio", "builtin": "MeshErrorRatio", "window": "5s", "minSamples": 50, "consecutiveFailures": 1},
                {"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "5s", "minSamples": 5, "consecutiveFailures": 1},
                {"name": "proxies-behind", "builtin": "ProxiesBehind", "window": "5s", "minSamples": 1, "consecutiveFailures": 1}
            ],
            "driftGate": {"exporter": "Platform", "metric": "sluice_drift_proxies_behind"},
            "pin": {"publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]}},
        })
    }

    fn start_wave_gate(&self) -> Running {
        let engine = Engine::new(
            PrometheusSource::new(PrometheusConfig::new(self.prom.url())),
            EngineOptions::default(),
        )
        .expect("the gate engine");
        let ctx = Arc::new(sluice_wave_gate::reconcile::Context {
            engine: Some(Arc::new(engine)),
            metrics: Some(sluice_wave_gate::metrics::register(&mut Default::default())),
            ..sluice_wave_gate::reconcile::Context::new(
                self.client.clone(),
                EventRecorder::new(self.client.clone(), sluice_wave_gate::OPERATOR),
            )
        });
        let (hooks, _registry) = Hooks::standalone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(drive(
            Api::<WaveGate>::all(self.client.clone()),
            watcher::Config::default(),
            ctx,
            sluice_wave_gate::reconcile::reconcile,
            Leadership::always(),
            stop.clone(),
            hooks,
        ));
        Running { stop, task }
    }

    fn start_revert(&self) -> Running {
        use sluice_revert::reconcile::{Context, Settings, reconcile};
        let ctx = Arc::new(
            Context::new(
                self.client.clone(),
                EventRecorder::new(self.client.clone(), sluice_revert::OPERATOR),
                Settings {
                    cluster_namespace: SYSTEM.into(),
                    registry: RegistryOptions::default(),
                    git: None,
                    forge: None,
                    ..Settings::default()
                },
                sluice_revert::metrics::register(&mut Default::default()),
            )
            .expect("revert's context"),
        );
        let (hooks, _registry) = Hooks::standalone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(drive(
            Api::<BundlePin>::all(self.client.clone()),
            watcher::Config::default(),
            ctx,
            reconcile,
            Leadership::always(),
            stop.clone(),
            hooks,
        ));
        Running { stop, task }
    }

    fn wave_gates(&self) -> Api<WaveGate> {
        Api::namespaced(self.client.clone(), ARGOCD)
    }

    async fn wave_gate(&self) -> WaveGate {
        self.wave_gates()
            .get(SITE)
            .await
            .expect("the WaveGate is readable")
    }

    /// The site's Applications by cluster.
    async fn apps(&self) -> BTreeMap<String, Application> {
        Api::<Application>::namespaced(self.client.clone(), ARGOCD)
            .list(&ListParams::default())
            .await
            .expect("Applications are listable")
            .items
            .into_iter()
            .filter_map(|a| Some((a.spec.destination.as_ref()?.name.clone()?, a)))
            .collect()
    }

    async fn pins(&self) -> Vec<BundlePin> {
        Api::<BundlePin>::namespaced(self.client.clone(), ARGOCD)
            .list(&ListParams::default())
            .await
            .expect("BundlePins are listable")
            .items
    }

    /// The checkout route in `cluster` as stored there.
    async fn route(&self, cluster: &str) -> Option<DynamicObject> {
        let w = &self.workloads[cluster];
        Api::<DynamicObject>::namespaced_with(
            w.client_with_token(ADMIN_TOKEN),
            SHOP,
            &route_resource(),
        )
        .get_opt("checkout")
        .await
        .expect("the route is readable")
    }

    /// The canary weight of the route in `cluster`, `None` while absent.
    async fn canary_weight(&self, cluster: &str) -> Option<u64> {
        let r = self.route(cluster).await?;
        r.data["spec"]["rules"][0]["backendRefs"][1]["weight"].as_u64()
    }

    /// Field managers of the route in `cluster`.
    async fn managers(&self, cluster: &str) -> Vec<String> {
        self.route(cluster)
            .await
            .and_then(|r| r.metadata.managed_fields)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect()
    }

    /// Asks for `revision` (spec.revision and its source commit).
    async fn change_to(&self, revision: &Revision) {
        self.wave_gates()
            .patch(
                SITE,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"revision": revision.digest, "sourceCommit": revision.commit}})),
            )
            .await
            .expect("the spec patch is accepted");
    }

    /// What a timed-out [`WAIT`] shows: the WaveGate's status, read once the budget is spent.
    async fn status_seen(&self) -> String {
        format!("WaveGate status: {:#?}", self.wave_gate().await.status)
    }

    async fn stop(mut self) {
        if let Some(r) = self.wave_gate.take() {
            r.stop("the wave-gate operator").await;
        }
        if let Some(r) = self.revert.take() {
            r.stop("the revert operator").await;
        }
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.argocd.stop().await;
        if let Ok(sim) = Arc::try_unwrap(self.sim) {
            sim.stop();
        }
        for (_, w) in self.workloads {
            w.shutdown().await;
        }
        self.mgmt.shutdown().await;
        drop(self.registry);
    }
}

/// The drift exporter's input, as the sandbox drives it: when Argo CD reports a cluster's
/// Application Synced at a revision, that revision's source commit was applied there.
async fn config_applied(
    client: Client,
    sim: Arc<sluice_sim::World>,
    commits: BTreeMap<String, String>,
    stop: CancellationToken,
) {
    let apps: Api<Application> = Api::namespaced(client, ARGOCD);
    let mut applied: BTreeMap<String, String> = BTreeMap::new();
    loop {
        if let Ok(list) = apps.list(&ListParams::default()).await {
            for a in list.items {
                let Some(cluster) = a.spec.destination.as_ref().and_then(|d| d.name.clone()) else {
                    continue;
                };
                let Some(rev) = a.synced_revision().map(str::to_owned) else {
                    continue;
                };
                let synced = a
                    .status
                    .as_ref()
                    .and_then(|s| s.sync.as_ref())
                    .and_then(|s| s.status.as_deref())
                    == Some("Synced");
                if !synced || applied.get(&cluster) == Some(&rev) {
                    continue;
                }
                if let (Some(commit), Some(mesh)) = (commits.get(&rev), sim.mesh()) {
                    mesh.config_applied(&cluster, commit);
                }
                applied.insert(cluster, rev);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

fn wave_state(g: &WaveGate, i: usize) -> Option<WaveState> {
    g.status.as_ref()?.waves.get(i).map(|w| w.state)
}

fn any_fail(g: &WaveGate) -> bool {
    g.status.as_ref().is_some_and(|s| {
        s.waves
            .iter()
            .any(|w| w.gates.iter().any(|v| v.verdict == Verdict::Fail))
    })
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Runs `scenario` alone on the machine within its budget.
async fn within_budget<F: std::future::Future<Output = ()>>(name: &str, scenario: F) {
    let started = Instant::now();
    tokio::time::timeout(SCENARIO_BUDGET, scenario)
        .await
        .unwrap_or_else(|_| panic!("scenario {name} exceeded its budget of {SCENARIO_BUDGET:?}"));
    println!(
        "scenario {name} took {} ms (budget {SCENARIO_BUDGET:?})",
        ms(started.elapsed())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_revision_crosses_every_wave_of_the_site_in_order() {
    let _alone = ONE_AT_A_TIME.lock().await;
    within_budget("clean", async {
        let Some(f) = Fleet::start("2s").await else {
            return;
        };
        // When the site asks for b.
        f.change_to(&f.b).await;
        // Then each cluster's Application reaches b in wave order: record when each is first
        // seen Synced at b, until the change is Complete.
        let mut synced_at_b: BTreeMap<String, jiff::Timestamp> = BTreeMap::new();
        let b = f.b.digest.clone();
        let done = loop {
            for (c, a) in f.apps().await {
                if a.is_synced_at(&b) {
                    synced_at_b.entry(c).or_insert_with(jiff::Timestamp::now);
                }
            }
            let g = f.wave_gate().await;
            if g.status.as_ref().is_some_and(|s| {
                s.phase == WaveGatePhase::Complete
                    && s.current_revision.as_deref() == Some(b.as_str())
            }) {
                break g;
            }
            assert!(
                g.status.as_ref().is_none_or(|s| s.halt.is_none()),
                "the clean change halted: {:#?}",
                g.status
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let s = done.status.expect("status");
        assert!(
            s.decisions.iter().all(|d| d.revision == b),
            "{:#?}",
            s.decisions
        );
        assert_eq!(s.waves.len(), 3);
        for (i, wave) in s.waves.iter().enumerate() {
            assert_eq!(wave.state, WaveState::Passed, "wave {i}");
            let (admitted, converged, finished) = (
                wave.admitted_at.as_ref().expect("admittedAt").0,
                wave.converged_at.as_ref().expect("convergedAt").0,
                wave.finished_at.as_ref().expect("finishedAt").0,
            );
            assert!(
                admitted <= converged && converged < finished,
                "wave {i} timestamps"
            );
            assert!(
                finished.duration_since(converged) >= jiff::SignedDuration::from_secs(2),
                "wave {i} soaked its 2 s"
            );
            let names: Vec<&str> = wave.gates.iter().map(|g| g.gate.as_str()).collect();
            assert_eq!(names.len(), 3, "every gate was read in wave {i}: {names:?}");
            assert!(
                wave.gates.iter().all(|g| g.verdict == Verdict::Pass),
                "every gate green at the end of wave {i}'s soak: {:#?}",
                wave.gates
            );
            if i > 0 {
                let before = s.waves[i - 1].finished_at.as_ref().unwrap().0;
                assert!(
                    admitted >= before,
                    "wave {i} admitted before wave {} passed",
                    i - 1
                );
                // Argo CD moved the cluster only once the wave before had passed.
                let seen = synced_at_b[CLUSTERS[i]];
                assert!(
                    seen >= before,
                    "{} Synced at b at {seen}, before wave {} passed at {before}",
                    CLUSTERS[i],
                    i - 1
                );
            }
        }
        // Every Application Synced at b and Healthy; b's route applied in every cluster.
        let apps = f.apps().await;
        assert_eq!(apps.len(), CLUSTERS.len());
        for (c, a) in &apps {
            assert!(a.is_synced_at(&b) && a.is_healthy(), "{c}: {:#?}", a.status);
        }
        for c in CLUSTERS {
            assert_eq!(f.canary_weight(c).await, Some(WEIGHT_B), "{c} runs b");
        }
        assert!(f.pins().await.is_empty(), "a clean change pins nothing");
        f.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breach_in_the_canary_halts_pins_back_through_revert_and_releases() {
    let _alone = ONE_AT_A_TIME.lock().await;
    within_budget("breach", async {
        let Some(f) = Fleet::start("30s").await else {
            return;
        };
        let (a, b) = (f.a.digest.clone(), f.b.digest.clone());
        f.change_to(&f.b).await;
        WAIT.until_seeing(
            "wave 0 soaking at b",
            async || {
                let g = f.wave_gate().await;
                (wave_state(&g, 0) == Some(WaveState::Soaking)).then_some(())
            },
            async || f.status_seen().await,
        )
        .await;
        assert_eq!(f.canary_weight("eu-1").await, Some(WEIGHT_B), "the canary runs b");

        // When mesh-attributed errors rise in the canary cluster (~23% of its requests).
        f.sim
            .mesh()
            .expect("the simulated mesh runs")
            .apply_now(Event {
                cluster: Some("eu-1".into()),
                mesh_failure_ratio: Some(0.23),
                mesh_failure_flag: Some(ResponseFlag::UF),
                ..Default::default()
            });
        let fault = Instant::now();
        let (mut first_fail, mut pin_seen, mut reverted) = (None, None, None);
        let mut applied_by = Vec::new();
        let mut polls = 0u32;
        while reverted.is_none() {
            // The previous bundle applied in the canary cluster: a's route is live again. The
            // route is read first, so the Fail verdict and the pin that precede it are seen in
            // the same round at the latest.
            if f.canary_weight("eu-1").await == Some(WEIGHT_A) {
                reverted = Some(Instant::now());
                applied_by = f.managers("eu-1").await;
            }
            let g = f.wave_gate().await;
            if first_fail.is_none() && any_fail(&g) {
                first_fail = Some(Instant::now());
            }
            if pin_seen.is_none() && !f.pins().await.is_empty() {
                pin_seen = Some(Instant::now());
            }
            // No later wave ever moves.
            polls += 1;
            if polls.is_multiple_of(5) {
                for c in ["eu-2", "eu-3"] {
                    assert_eq!(f.canary_weight(c).await, Some(WEIGHT_A), "{c} left a");
                }
            }
            assert!(
                fault.elapsed() < SCENARIO_BUDGET,
                "the canary is not back at a; WaveGate {:#?}",
                g.status
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // revert's own application of the pinned bundle: the pin in force (Pinned, or already
        // Released when Argo CD agreed within one poll).
        let pin_in_force = WAIT
            .until_seeing(
                "the pin in force",
                async || {
                    let in_force = f.pins().await.iter().any(|p| {
                        p.status.as_ref().is_some_and(|s| {
                            matches!(s.phase, BundlePinPhase::Pinned | BundlePinPhase::Released)
                        })
                    });
                    in_force.then(Instant::now)
                },
                async || f.status_seen().await,
            )
            .await;
        // Argo CD's automation is suspended before the decision goes back, so the first write
        // of a's route in the canary is revert's.
        assert!(
            applied_by.iter().any(|m| m == "sluice-revert"),
            "revert wrote a's route first; managers: {applied_by:?}"
        );
        let first_fail = first_fail.expect("a Fail verdict precedes the set-back");
        let pin_seen = pin_seen.expect("the BundlePin precedes the set-back");
        println!(
            "halt_to_pin_ms={} breach_to_reverted_ms={} breach_to_pin_in_force_ms={} (fault to first Fail verdict {} ms; route managers when a was live again: {applied_by:?}; API polled every 10 ms)",
            ms(pin_seen.saturating_duration_since(first_fail)),
            ms(reverted.unwrap() - fault),
            ms(pin_in_force - fault),
            ms(first_fail - fault),
        );

        // Then the change halted in wave 0 on the mesh error ratio, with its value.
        let halted = WAIT
            .until_seeing(
                "halted and pinned back",
                async || {
                    let g = f.wave_gate().await;
                    g.status
                        .as_ref()
                        .and_then(|s| s.halt.as_ref())
                        .is_some_and(|h| h.pinned_at.is_some())
                        .then_some(g)
                },
                async || f.status_seen().await,
            )
            .await;
        let s = halted.status.clone().unwrap();
        let h = s.halt.as_ref().unwrap();
        assert_eq!(s.phase, WaveGatePhase::Halted);
        assert_eq!(h.reason, HaltReason::GateFailed);
        assert_eq!(h.wave, "canary");
        let gate = h.gate.as_ref().expect("the failing gate is recorded");
        assert_eq!(gate.gate, "mesh-error-ratio");
        assert!(gate.value.unwrap() > 0.01, "its value is recorded: {gate:?}");
        assert_eq!(s.waves[1].state, WaveState::Pending, "no later wave admitted");
        assert_eq!(s.waves[2].state, WaveState::Pending, "no later wave admitted");
        assert_eq!(h.reverted_clusters, vec!["eu-1".to_owned()]);
        // The decisions are back at a for every cluster.
        assert!(s.decisions.iter().all(|d| d.revision == a), "{:#?}", s.decisions);

        // Only the canary cluster was pinned, to a, through its Application.
        let pins = f.pins().await;
        assert_eq!(pins.len(), 1, "{pins:#?}");
        let pin = &pins[0];
        assert_eq!(pin.spec.bundle.digest, a);
        let targets: Vec<&str> = pin.spec.targets.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(targets, ["mesh-eu-1"]);
        assert_eq!(h.pins, vec![pin.metadata.name.clone().unwrap()]);

        // And the pin releases once Argo CD reports the canary's Application Synced at a.
        let name = pin.metadata.name.clone().unwrap();
        let released = WAIT
            .until_seeing(
                "the pin Released",
                async || {
                    let p = Api::<BundlePin>::namespaced(f.client.clone(), ARGOCD)
                        .get(&name)
                        .await
                        .ok()?;
                    (p.status.as_ref()?.phase == BundlePinPhase::Released).then_some(p)
                },
                async || f.status_seen().await,
            )
            .await;
        let app = f.apps().await.remove("eu-1").expect("the canary's Application");
        assert!(
            app.is_synced_at(&a),
            "released while Argo CD reports {:?}",
            app.status.as_ref().and_then(|s| s.sync.as_ref())
        );
        let rs = released.status.unwrap();
        // revert applied the pinned bundle in the canary cluster before it released.
        assert!(rs.pinned_at.is_some(), "the pin was in force: {rs:#?}");
        assert_eq!(rs.applied_objects, 1, "revert applied a's route: {rs:#?}");
        assert_eq!(rs.applications.len(), 1);
        assert_eq!(rs.applications[0].destination.as_deref(), Some("eu-1"));
        // The decision went back only once revert held the pin, so revert, not Argo CD, moved
        // the canary off the halted revision: its audit names b as what it pinned away from.
        assert_eq!(
            rs.from_digest.as_deref(),
            Some(b.as_str()),
            "revert pinned the canary away from the halted revision: {rs:#?}"
        );
        let rc = find(&rs.conditions, pin_conditions::RELEASED).expect("Released condition");
        assert_eq!(rc.reason, pin_reasons::CONTENT_MATCHED, "{rc:?}");
        assert!(
            app.spec.sync_policy.as_ref().is_some_and(|p| p.is_automated()),
            "automation restored on release: {:?}",
            app.spec.sync_policy
        );
        // The canary runs a; the rest never left it; b is nowhere.
        for c in CLUSTERS {
            assert_eq!(f.canary_weight(c).await, Some(WEIGHT_A), "{c} runs a");
        }
        for (c, x) in f.apps().await {
            assert!(!x.is_synced_at(&b), "{c} still at b");
        }
        f.stop().await;
    })
    .await;
}
