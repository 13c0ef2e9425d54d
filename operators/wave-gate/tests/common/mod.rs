//! The local world of the wave-gate end-to-end tests: the Kubernetes API emulator with the
//! WaveGate, BundlePin and upstream Argo CD CRDs; a real Prometheus fed by remote write with the
//! mesh's signals per cluster (requests and mesh-attributed failures, xDS pushes and NACKs, the
//! drift exporter's contract); a stand-in for Argo CD that syncs each Application to the
//! revision the WaveGate decides for its cluster; the global metrics view, carrying each
//! operator's `sluice_wavegate_wave_passed` into Prometheus; and the wave-gate controller running
//! in-process.
//!
//! Given/When/Then helpers; every wait has a budget and fails with the last status seen.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use prometheus_client::{encoding::text::encode, registry::Registry};
use sluice_analysis::{Engine, EngineOptions, PrometheusConfig, PrometheusSource};
use sluice_api::{
    external::argocd::Application,
    v1alpha1::{BundlePin, WaveGate},
};
use sluice_runtime::{
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::eventually;
use sluice_testkit::{
    prometheus::{Prometheus, now_ms},
    remote_write::Series,
};
use sluice_wave_gate::{OPERATOR, metrics, reconcile};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The Argo CD namespace of the management cluster.
pub const NS: &str = "argocd";
/// How long a halt waits for revert to hold its pins in these tests (no revert runs here).
pub const PIN_WAIT: Duration = Duration::from_secs(2);

/// A manifest digest made of one repeated hex character.
pub fn rev(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

/// The bundle's source commit of a revision in this world (the drift exporter's label).
pub fn commit(revision: &str) -> String {
    revision[7..19].to_owned()
}

/// The released Argo CD CRDs (`.tools/crds/argo-cd-v3.5.1`); when missing the test fails under
/// CI and is skipped and counted otherwise.
pub fn upstream() -> Option<PathBuf> {
    use sluice_testkit::prereq;
    prereq::or_skip(prereq::upstream_dir(prereq::Upstream::ArgoCd))
}

/// The mesh signals of one cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterMesh {
    /// Commit the drift exporter evaluates (the synced revision's commit).
    pub commit: Option<String>,
    /// Proxies behind `commit`, once applied (0 = acknowledged).
    pub stuck_behind: f64,
    /// Mesh-attributed failures per second.
    pub mesh_errors_per_s: f64,
    /// xDS NACKs per second.
    pub nacks_per_s: f64,
    requests: f64,
    errors: f64,
    pushes: f64,
    rejects: f64,
}

/// The world of one scenario.
pub struct World {
    pub emu: kube_emulator::Emulator,
    pub client: Client,
    pub prom: Arc<Prometheus>,
    pub mesh: Arc<Mutex<BTreeMap<String, ClusterMesh>>>,
    /// Time Argo CD takes to sync a new decision.
    pub sync_delay: Duration,
    registries: Arc<Mutex<Vec<Arc<Mutex<Registry>>>>>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// A running wave-gate controller.
pub struct Operator {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Operator {
    /// Stops the controller (as a SIGTERM would) and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the controller stops within 10 s")
            .expect("controller task");
    }
}

impl World {
    /// Starts the world, or returns `None` (with the reason printed) when Prometheus or the
    /// upstream CRDs are absent.
    pub async fn start(clusters: &[&str]) -> Option<World> {
        // Operator logs (warnings and up) show in a failing test's output.
        // SLUICE_TEST_LOG raises the level (e.g. info) when a scenario needs a closer look.
        let level = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        let _ = sluice_runtime::telemetry::init(sluice_runtime::config::LogFormat::Text, &level);
        let argocd = upstream()?;
        let prom = Arc::new(Prometheus::start_or_skip().await?);
        let emu = emulator_with([
            sluice_crd("wavegates.sluice.dev.yaml"),
            sluice_crd("bundlepins.sluice.dev.yaml"),
            argocd.join("application-crd.yaml"),
            argocd.join("applicationset-crd.yaml"),
        ])
        .await;
        let client = emu.client();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap(),
            )
            .await
            .expect("namespace created");
        let mesh: BTreeMap<String, ClusterMesh> = clusters
            .iter()
            .map(|c| ((*c).to_owned(), ClusterMesh::default()))
            .collect();
        let mut w = World {
            emu,
            client,
            prom,
            mesh: Arc::new(Mutex::new(mesh)),
            sync_delay: Duration::from_millis(300),
            registries: Arc::default(),
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
        };
        w.tasks.push(tokio::spawn(telemetry(
            w.prom.clone(),
            w.mesh.clone(),
            w.shutdown.clone(),
        )));
        w.tasks.push(tokio::spawn(global_view(
            w.prom.clone(),
            w.registries.clone(),
            w.shutdown.clone(),
        )));
        w.tasks.push(tokio::spawn(argo_cd(
            w.client.clone(),
            w.mesh.clone(),
            w.sync_delay,
            w.shutdown.clone(),
        )));
        Some(w)
    }

    /// Given an ApplicationSet `name` with the given sync policy, and one Application per
    /// cluster it generated, Synced at `at` and Healthy.
    pub async fn application_set(
        &self,
        name: &str,
        sync_policy: serde_json::Value,
        clusters: &[&str],
        at: &str,
    ) {
        self.application_set_with(name, sync_policy, safe_ignore(), clusters, at)
            .await;
    }

    /// As [`World::application_set`], with `ignore` as its `ignoreApplicationDifferences`.
    pub async fn application_set_with(
        &self,
        name: &str,
        sync_policy: serde_json::Value,
        ignore: serde_json::Value,
        clusters: &[&str],
        at: &str,
    ) {
        let sets: Api<sluice_api::external::argocd::ApplicationSet> =
            Api::namespaced(self.client.clone(), NS);
        let set: sluice_api::external::argocd::ApplicationSet =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "ApplicationSet",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "goTemplate": true,
                    // It reads the site's WaveGate (named by the site, the set `mesh-<site>`).
                    "generators": [{"clusterDecisionResource": {"configMapRef": "sluice-wavegates", "name": name.strip_prefix("mesh-").unwrap_or(name), "requeueAfterSeconds": 30}}],
                    "template": {
                        "metadata": {"name": "mesh-{{.clusterName}}"},
                        "spec": {"project": "mesh", "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": "{{.revision}}", "path": "."}, "destination": {"name": "{{.clusterName}}", "namespace": "istio-config"}}
                    },
                    "syncPolicy": sync_policy,
                    "ignoreApplicationDifferences": ignore,
                }
            }))
            .unwrap();
        let set = sets.create(&PostParams::default(), &set).await.unwrap();
        let uid = set.metadata.uid.clone().unwrap();
        let apps: Api<Application> = Api::namespaced(self.client.clone(), NS);
        for c in clusters {
            let app: Application = serde_json::from_value(serde_json::json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application",
                "metadata": {"name": format!("mesh-{c}"), "namespace": NS, "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"project": "mesh", "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": at, "path": "."}, "destination": {"name": c, "namespace": "istio-config"}},
                "status": {"sync": {"status": "Synced", "revision": at}, "health": {"status": "Healthy"}},
            }))
            .unwrap();
            apps.create(&PostParams::default(), &app).await.unwrap();
            self.mesh
                .lock()
                .unwrap()
                .entry((*c).to_owned())
                .or_default()
                .commit = Some(commit(at));
        }
    }

    /// Creates a WaveGate.
    pub async fn wave_gate(&self, body: serde_json::Value) -> WaveGate {
        let wg: WaveGate = serde_json::from_value(body).unwrap();
        self.wave_gates()
            .create(&PostParams::default(), &wg)
            .await
            .expect("the API server accepts the WaveGate")
    }

    /// The WaveGates API.
    pub fn wave_gates(&self) -> Api<WaveGate> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Merge-patches a WaveGate's spec.
    pub async fn patch_spec(&self, name: &str, spec: serde_json::Value) {
        self.wave_gates()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .expect("spec patch accepted");
    }

    /// Starts the wave-gate controller in-process (its metrics join the global view).
    pub fn operator(&self) -> Operator {
        let engine = Engine::new(
            PrometheusSource::new(PrometheusConfig::new(self.prom.url())),
            EngineOptions::default(),
        )
        .unwrap();
        let mut registry = Registry::default();
        let m = metrics::register(&mut registry);
        self.registries
            .lock()
            .unwrap()
            .push(Arc::new(Mutex::new(registry)));
        let ctx = Arc::new(reconcile::Context {
            engine: Some(Arc::new(engine)),
            metrics: Some(m),
            // No revert runs here: a halt waits this long for pins in force, then sets back.
            pin_wait: PIN_WAIT,
            ..reconcile::Context::new(
                self.client.clone(),
                EventRecorder::new(self.client.clone(), OPERATOR),
            )
        });
        let (hooks, _r) = Hooks::standalone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(drive(
            Api::<WaveGate>::all(self.client.clone()),
            watcher::Config::default(),
            ctx,
            reconcile::reconcile,
            Leadership::always(),
            shutdown.clone(),
            hooks,
        ));
        Operator { shutdown, task }
    }

    /// Events with `reason` about WaveGate `name`.
    pub async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .collect()
    }

    /// Events with `reason` about WaveGate `name`, once at least one is there. The operator
    /// publishes a decision's Events after the status write that recorded it, so a test that
    /// has just seen the status waits for them; fails after `budget`.
    pub async fn events_published(&self, name: &str, reason: &str, budget: Duration) -> Vec<Event> {
        let what = format!("a {reason} Event about WaveGate {name}");
        eventually(&what, budget, async || {
            let events = self.events(name, reason).await;
            (!events.is_empty()).then_some(events)
        })
        .await
    }

    /// The BundlePins in the namespace.
    pub async fn pins(&self) -> Vec<BundlePin> {
        let pins: Api<BundlePin> = Api::namespaced(self.client.clone(), NS);
        pins.list(&ListParams::default()).await.unwrap().items
    }

    /// The revision each Application reports Synced at, by cluster.
    pub async fn synced(&self) -> BTreeMap<String, String> {
        let apps: Api<Application> = Api::namespaced(self.client.clone(), NS);
        apps.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|a| {
                Some((
                    a.spec.destination.as_ref()?.name.clone()?,
                    a.synced_revision()?.to_owned(),
                ))
            })
            .collect()
    }

    /// Changes one cluster's mesh signals.
    pub fn mesh(&self, cluster: &str, f: impl FnOnce(&mut ClusterMesh)) {
        f(self
            .mesh
            .lock()
            .unwrap()
            .entry(cluster.to_owned())
            .or_default());
    }

    /// Stops the background tasks and the emulator.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.emu.shutdown().await;
    }
}

/// The wave-gate spec of a site with the gates the tests use (second-scale windows).
pub fn spec(site: &str, waves: serde_json::Value, revision: &str) -> serde_json::Value {
    serde_json::json!({
        "site": site,
        "applicationSetRef": {"name": format!("mesh-{site}")},
        "repository": "oci://registry.local:5000/mesh/config",
        "revision": revision,
        "sourceCommit": commit(revision),
        "waves": waves,
        "convergenceTimeout": "45s",
        "analysisInterval": "1s",
        "defaultSoak": "3s",
        "gates": [
            {"name": "mesh-error-ratio", "builtin": "MeshErrorRatio", "window": "5s", "minSamples": 50, "consecutiveFailures": 1},
            {"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "5s", "minSamples": 5, "consecutiveFailures": 1},
            {"name": "proxies-behind", "builtin": "ProxiesBehind", "window": "5s", "minSamples": 1, "consecutiveFailures": 1}
        ],
        "driftGate": {"exporter": "Platform", "metric": "sluice_drift_proxies_behind"},
        "pin": {"publicKeysSecretRef": {"name": "cosign-keys"}},
    })
}

/// A WaveGate object.
pub fn object(name: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "WaveGate",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
}

/// The ApplicationSet sync policy a WaveGate accepts.
pub fn safe_policy() -> serde_json::Value {
    serde_json::json!({"applicationsSync": "create-update", "preserveResourcesOnDeletion": true})
}

/// The `ignoreApplicationDifferences` a WaveGate accepts: no name filter, so the controller
/// stays off every generated Application's sync policy while revert suspends it.
pub fn safe_ignore() -> serde_json::Value {
    serde_json::json!([{"jsonPointers": ["/spec/syncPolicy"]}])
}

/// The mesh's telemetry, written once a second with the same timestamp for every series.
async fn telemetry(
    prom: Arc<Prometheus>,
    mesh: Arc<Mutex<BTreeMap<String, ClusterMesh>>>,
    stop: CancellationToken,
) {
    let rw = prom.remote_write();
    let step = 1.0;
    loop {
        let at = now_ms();
        let mut series = Vec::new();
        {
            let mut m = mesh.lock().unwrap();
            for (cluster, c) in m.iter_mut() {
                c.requests += 100.0 * step;
                c.errors += c.mesh_errors_per_s * step;
                c.pushes += 10.0 * step;
                c.rejects += c.nacks_per_s * step;
                let base = |name: &str| Series::new(name).label("cluster", cluster.as_str());
                series.push(
                    base("istio_requests_total")
                        .label("reporter", "source")
                        .label("response_code", "200")
                        .label("response_flags", "-")
                        .sample(at, c.requests),
                );
                series.push(
                    base("istio_requests_total")
                        .label("reporter", "source")
                        .label("response_code", "503")
                        .label("response_flags", "UF")
                        .label("failure_origin", "mesh")
                        .sample(at, c.errors),
                );
                series.push(base("pilot_xds_pushes").sample(at, c.pushes));
                series.push(base("pilot_total_xds_rejects").sample(at, c.rejects));
                if let Some(commit) = &c.commit {
                    series.push(
                        base("sluice_drift_proxies_behind")
                            .label("commit", commit.as_str())
                            .sample(at, c.stuck_behind),
                    );
                    series.push(
                        base("sluice_drift_proxies")
                            .label("commit", commit.as_str())
                            .sample(at, 20.0),
                    );
                }
            }
        }
        if let Err(e) = rw.write(&series).await {
            eprintln!("telemetry write failed: {e}");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(1000)) => {}
        }
    }
}

/// The global metrics view: each operator's site progress, scraped into Prometheus.
async fn global_view(
    prom: Arc<Prometheus>,
    registries: Arc<Mutex<Vec<Arc<Mutex<Registry>>>>>,
    stop: CancellationToken,
) {
    let rw = prom.remote_write();
    loop {
        let at = now_ms();
        let mut series = Vec::new();
        let regs: Vec<_> = registries.lock().unwrap().clone();
        for r in regs {
            let mut text = String::new();
            encode(&mut text, &r.lock().unwrap()).unwrap();
            for line in text.lines() {
                let Some(rest) = line.strip_prefix(&format!("{}{{", metrics::WAVE_PASSED_METRIC))
                else {
                    continue;
                };
                let Some((labels, value)) = rest.rsplit_once("} ") else {
                    continue;
                };
                // The scrape adds the job label (the chart's ServiceMonitor names it after the
                // component); a cross-site wait trusts only that job's series.
                let mut s = Series::new(metrics::WAVE_PASSED_METRIC)
                    .label("job", reconcile::DEFAULT_WAVE_PASSED_JOB);
                for pair in labels.split(',') {
                    if let Some((k, v)) = pair.split_once('=') {
                        s = s.label(k, v.trim_matches('"'));
                    }
                }
                series.push(s.sample(at, value.parse().unwrap_or(0.0)));
            }
        }
        if !series.is_empty()
            && let Err(e) = rw.write(&series).await
        {
            eprintln!("global view write failed: {e}");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Argo CD as far as the wave gate relies on it: each Application follows the revision its
/// cluster's decision names, `sync_delay` after the decision appears (Synced, Healthy), and the
/// drift exporter then evaluates the new commit. It never deletes an Application.
async fn argo_cd(
    client: Client,
    mesh: Arc<Mutex<BTreeMap<String, ClusterMesh>>>,
    delay: Duration,
    stop: CancellationToken,
) {
    let gates: Api<WaveGate> = Api::namespaced(client.clone(), NS);
    let apps: Api<Application> = Api::namespaced(client.clone(), NS);
    let mut seen: BTreeMap<(String, String), Instant> = BTreeMap::new();
    loop {
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        if let Ok(list) = gates.list(&ListParams::default()).await {
            for g in list.items {
                for d in g.status.map(|s| s.decisions).unwrap_or_default() {
                    wanted.insert(d.cluster_name, d.revision);
                }
            }
        }
        if let Ok(list) = apps.list(&ListParams::default()).await {
            for a in list.items {
                let Some(cluster) = a.spec.destination.as_ref().and_then(|d| d.name.clone()) else {
                    continue;
                };
                let Some(want) = wanted.get(&cluster) else {
                    continue;
                };
                if a.synced_revision() == Some(want.as_str()) {
                    continue;
                }
                let first = *seen
                    .entry((cluster.clone(), want.clone()))
                    .or_insert_with(Instant::now);
                if first.elapsed() < delay {
                    continue;
                }
                let name = a.metadata.name.clone().unwrap_or_default();
                let patch = serde_json::json!({
                    "spec": {"source": {"targetRevision": want}},
                    "status": {"sync": {"status": "Synced", "revision": want}, "health": {"status": "Healthy"}},
                });
                if apps
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    mesh.lock().unwrap().entry(cluster).or_default().commit = Some(commit(want));
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
