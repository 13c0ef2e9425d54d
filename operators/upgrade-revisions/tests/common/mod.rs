//! Given/When/Then fixtures for the upgrade end-to-end tests: an API emulator with Istio revision
//! tags `stable` → 1-27 and `canary` → 1-28, namespaces and Deployments whose pods the cluster
//! simulator creates and injects, a real Prometheus the simulated mesh writes its telemetry to
//! (including the certificate authority's issuance counter), the operator in-process, and a
//! sampler of the simulator's own SVID counter (the truth the budget is checked against).

#![allow(dead_code)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    apps::v1::Deployment,
    core::v1::{Namespace, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use kube_emulator::Emulator;
use serde_json::{Value, json};
use sluice_api::v1alpha1::RevisionUpgrade;
use sluice_runtime::{
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive},
};
use sluice_sim::cluster::pods::is_ready;
use sluice_sim::{ClusterConfig, Scenario, SvidCounter, World};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::eventually::{eventually, eventually_every, object_until};
use sluice_testkit::mesh_config::revision_tag_webhooks;
use sluice_testkit::prometheus::Prometheus;
use sluice_upgrade_revisions::{
    OPERATOR,
    fleet::injected_revision,
    metrics::{self, UpgradeMetrics},
    reconcile::{self, FleetCache},
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The cluster's name (its `cluster` label).
pub const CLUSTER: &str = "cluster-1";
/// The RevisionUpgrade's name.
pub const NAME: &str = "istio-1-28";
/// Window the operator measures background issuance over in these tests.
pub const ISSUANCE_WINDOW: Duration = Duration::from_secs(5);

/// Whether the prerequisites are there: skips (or, under CI, fails) naming what is missing.
pub fn prerequisites() -> bool {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds()).is_some()
}

/// A namespace of the fleet: name, risk tier label, Deployments (name, replicas).
pub struct NsSpec {
    pub name: &'static str,
    pub tier: Option<&'static str>,
    pub deployments: Vec<(&'static str, i32)>,
}

/// How long the fixture waits for the initial pods: 30 s plus 250 ms per pod (the simulated
/// kubelet readies a few pods per second on a loaded machine).
pub fn settle_time(pods: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(250 * pods)
}

/// The default fleet: one low-risk namespace, one tier-2, one tier-1 (the last wave takes it).
pub fn three_tiers() -> Vec<NsSpec> {
    vec![
        NsSpec {
            name: "edge",
            tier: Some("low"),
            deployments: vec![("gw", 2)],
        },
        NsSpec {
            name: "shop",
            tier: Some("tier-2"),
            deployments: vec![("cart", 3), ("search", 3)],
        },
        NsSpec {
            name: "payments",
            tier: Some("tier-1"),
            deployments: vec![("ledger", 4), ("api", 4)],
        },
    ]
}

/// Live pods among `pods`: (on 1-27, on 1-28, Ready).
pub fn count_revisions<'a>(pods: impl Iterator<Item = &'a Pod>) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    for p in pods.filter(|p| p.metadata.deletion_timestamp.is_none()) {
        match p
            .metadata
            .annotations
            .as_ref()
            .and_then(injected_revision)
            .as_deref()
        {
            Some("1-27") => out.0 += 1,
            Some("1-28") => out.1 += 1,
            _ => {}
        }
        if is_ready(p) {
            out.2 += 1;
        }
    }
    out
}

pub fn pods_of(fleet: &[NsSpec]) -> u64 {
    fleet
        .iter()
        .flat_map(|n| n.deployments.iter().map(|d| d.1 as u64))
        .sum()
}

/// Samples of the simulator's SVID counter: (time since the sampler started, count).
#[derive(Clone, Default)]
pub struct Samples(pub Arc<Mutex<Vec<(Duration, u64)>>>);

/// The running local world.
pub struct Harness {
    pub emu: Emulator,
    pub client: Client,
    pub prometheus: Prometheus,
    pub world: World,
    pub svid: SvidCounter,
    pub metrics: UpgradeMetrics,
    pub controller: Option<(CancellationToken, JoinHandle<()>, Vec<JoinHandle<()>>)>,
    pub samples: Samples,
    sampler: Option<JoinHandle<()>>,
    /// Window the operator measures background issuance over.
    pub issuance_window: Duration,
}

async fn create(client: &Client, value: Value) {
    let obj: kube::api::DynamicObject = serde_json::from_value(value.clone()).unwrap();
    let kind = value["kind"].as_str().unwrap();
    let ns = value["metadata"]["namespace"].as_str().map(str::to_owned);
    match kind {
        "Namespace" => {
            let o: Namespace = serde_json::from_value(value).unwrap();
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &o)
                .await
                .unwrap();
        }
        "Deployment" => {
            let o: Deployment = serde_json::from_value(value).unwrap();
            Api::<Deployment>::namespaced(client.clone(), ns.as_deref().unwrap())
                .create(&PostParams::default(), &o)
                .await
                .unwrap();
        }
        "MutatingWebhookConfiguration" => {
            let o: MutatingWebhookConfiguration = serde_json::from_value(value).unwrap();
            Api::<MutatingWebhookConfiguration>::all(client.clone())
                .create(&PostParams::default(), &o)
                .await
                .unwrap();
        }
        other => panic!("fixture cannot create {other} {}", obj.name_any()),
    }
}

impl Harness {
    /// Given: the local world with `fleet`'s namespaces on tag `stable` and their pods Ready on
    /// revision 1-27, Prometheus holding at least one issuance window of telemetry.
    pub async fn given(fleet: &[NsSpec]) -> Option<Harness> {
        Self::given_with_window(fleet, ISSUANCE_WINDOW).await
    }

    /// [`Harness::given`], the operator measuring background issuance over `issuance_window`.
    pub async fn given_with_window(fleet: &[NsSpec], issuance_window: Duration) -> Option<Harness> {
        Self::given_shaped(fleet, issuance_window, deployment, "[]").await
    }

    /// [`Harness::given_with_window`], each Deployment built by `shape(namespace, name,
    /// replicas)`.
    /// `services` is the simulated mesh's traffic (the scenario's `services:` YAML list).
    pub async fn given_shaped(
        fleet: &[NsSpec],
        issuance_window: Duration,
        shape: fn(&str, &str, i32) -> Value,
        services: &str,
    ) -> Option<Harness> {
        if !prerequisites() {
            return None;
        }
        let prometheus = Prometheus::start_or_skip().await?;
        let emu = emulator_with([
            sluice_crd("revisionupgrades.sluice.dev.yaml"),
            sluice_crd("gatetemplates.sluice.dev.yaml"),
        ])
        .await;
        let client = emu.client();
        for mwc in revision_tag_webhooks() {
            create(&client, mwc).await;
        }
        for ns in fleet {
            let mut labels = json!({"istio.io/rev": "stable"});
            if let Some(t) = ns.tier {
                labels["sluice.dev/risk-tier"] = json!(t);
            }
            create(
                &client,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns.name, "labels": labels}}),
            )
            .await;
            for (d, replicas) in &ns.deployments {
                create(&client, shape(ns.name, d, *replicas)).await;
            }
        }
        let scenario = Scenario::from_yaml(&format!(
            "name: revision-upgrade\nclusters:\n  - name: {CLUSTER}\n    xds_pushes_per_second: 4\nservices: {services}\n"
        ))
        .unwrap();
        let mut config = ClusterConfig::new(CLUSTER);
        config.readiness_delay = Duration::from_millis(200);
        let world = World::builder()
            .cluster_with(config, client.clone())
            .telemetry(prometheus.url(), scenario, Duration::from_secs(1))
            .start()
            .unwrap();
        let svid = world.svid(CLUSTER).unwrap().clone();
        let total = pods_of(fleet);
        let h = Harness {
            emu,
            client,
            prometheus,
            world,
            svid,
            metrics: UpgradeMetrics::default(),
            controller: None,
            samples: Samples::default(),
            sampler: None,
            issuance_window,
        };
        let settle = Instant::now();
        let said = std::cell::Cell::new(Instant::now());
        // Counted from a watch cache: listing every pod of a large fleet is the costliest read
        // of the emulator and would slow the simulator it waits for.
        let (pods, writer) = reflector::store();
        let watch = tokio::spawn(
            reflector::reflector(
                writer,
                watcher(
                    Api::<Pod>::all(h.client.clone()),
                    watcher::Config::default(),
                ),
            )
            .default_backoff()
            .for_each(|_| async {}),
        );
        eventually_every(
            "every pod Ready on 1-27",
            settle_time(total),
            Duration::from_millis(100.max(total / 40)),
            || async {
                let (old, new, ready) = count_revisions(pods.state().iter().map(|p| p.as_ref()));
                if said.get().elapsed() > Duration::from_secs(10) {
                    said.set(Instant::now());
                    println!(
                        "{:.0}s: {old} pods on 1-27, {new} on 1-28, {ready} Ready of {total}",
                        settle.elapsed().as_secs_f64()
                    );
                }
                (old == total && new == 0 && ready == total).then_some(())
            },
        )
        .await;
        watch.abort();
        // One issuance window of telemetry after the initial pods, so their certificates are
        // not mistaken for background issuance during the upgrade.
        tokio::time::sleep(issuance_window + Duration::from_secs(1)).await;
        Some(h)
    }

    /// Starts (or restarts) the operator in-process with fresh memory.
    pub async fn start_operator(&mut self) {
        self.start_operator_with(Leadership::always()).await;
    }

    /// Starts the operator leading while the returned sender says `true`; sending `false`
    /// deposes it (as a lost Lease would).
    pub async fn start_operator_leading(&mut self) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(true);
        self.start_operator_with(Leadership::from_receiver(rx))
            .await;
        tx
    }

    async fn start_operator_with(&mut self, leadership: Leadership) {
        let mut registry = prometheus_client::registry::Registry::default();
        self.metrics = metrics::register(&mut registry);
        let mut config = self.emu.client_config();
        config.default_retry = false;
        let evict_client = Client::try_from(config).unwrap();
        let (fleet, watchers) = FleetCache::start(&self.client);
        let source =
            reconcile::metrics_source(self.prometheus.url(), CLUSTER, self.issuance_window, false)
                .unwrap();
        let mut ctx = reconcile::Context::full(
            self.client.clone(),
            evict_client,
            EventRecorder::new(self.client.clone(), OPERATOR),
            fleet,
            Some(source),
            self.metrics.clone(),
        );
        ctx.leadership = leadership.clone();
        let ctx = Arc::new(ctx);
        let (hooks, _registry) = Hooks::standalone();
        let shutdown = CancellationToken::new();
        let controller = tokio::spawn(drive(
            Api::<RevisionUpgrade>::all(self.client.clone()),
            watcher::Config::default(),
            ctx,
            reconcile::reconcile,
            leadership,
            shutdown.clone(),
            hooks,
        ));
        self.controller = Some((shutdown, controller, watchers));
    }

    /// Stops the operator (as a crash or a lost Lease would, mid-work).
    pub async fn stop_operator(&mut self) {
        if let Some((shutdown, handle, watchers)) = self.controller.take() {
            shutdown.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
            for w in watchers {
                w.abort();
            }
        }
    }

    /// Starts sampling the simulator's SVID counter every 20 ms.
    pub fn sample_issuance(&mut self) {
        let svid = self.svid.clone();
        let samples = self.samples.clone();
        let start = Instant::now();
        self.sampler = Some(tokio::spawn(async move {
            loop {
                samples
                    .0
                    .lock()
                    .unwrap()
                    .push((start.elapsed(), svid.get()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }

    /// Issues `per_second` SVIDs per second on the simulator's counter (certificates issued
    /// elsewhere in the cluster), until the returned task is aborted.
    pub fn background_issuance(&self, per_second: f64) -> JoinHandle<()> {
        let svid = self.svid.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut issued = 0u64;
            loop {
                let due = (start.elapsed().as_secs_f64() * per_second) as u64;
                while issued < due {
                    svid.issue();
                    issued += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }

    /// Applies a RevisionUpgrade 1-27 → 1-28 with a small budget (8/s, depth 8, 10 in any second), short soaks and an xDS NACK
    /// gate; `patch` overrides spec fields.
    pub async fn when_upgrade(&self, patch: Value) {
        let mut spec = json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28",
            "waves": [
                {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "2s"},
                {"name": "tier-2", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-2"}}, "soak": "2s"},
                {"name": "tier-1", "namespaceSelector": {}, "soak": "2s"},
            ],
            "issuanceBudget": {"rate": 8, "depth": 8, "peakPerSecond": 10},
            "analysisInterval": "1s",
            "gates": [{"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "4s",
                       "minSamples": 1, "consecutiveFailures": 1}],
        });
        for (k, v) in patch.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let obj: RevisionUpgrade = serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "RevisionUpgrade",
            "metadata": {"name": NAME}, "spec": spec,
        }))
        .unwrap();
        Api::<RevisionUpgrade>::all(self.client.clone())
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
    }

    pub async fn upgrade(&self) -> RevisionUpgrade {
        Api::<RevisionUpgrade>::all(self.client.clone())
            .get(NAME)
            .await
            .unwrap()
    }

    /// Waits for the upgrade to satisfy `check`, printing its status on timeout.
    pub async fn until(
        &self,
        within: Duration,
        what: &str,
        check: impl Fn(&RevisionUpgrade) -> bool,
    ) -> RevisionUpgrade {
        let api = Api::<RevisionUpgrade>::all(self.client.clone());
        object_until(&api, NAME, what, within, check).await
    }

    /// Live pods: (on 1-27, on 1-28, Ready), listed fresh from the API.
    pub async fn revisions(&self) -> (u64, u64, u64) {
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        count_revisions(pods.items.iter())
    }

    /// Pods of namespace `ns` by injected revision: (1-27, 1-28).
    pub async fn namespace_revisions(&self, ns: &str) -> (u64, u64) {
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let (old, new, _) = count_revisions(pods.items.iter());
        (old, new)
    }

    pub async fn namespace_tag(&self, ns: &str) -> Option<String> {
        Api::<Namespace>::all(self.client.clone())
            .get(ns)
            .await
            .unwrap()
            .labels()
            .get("istio.io/rev")
            .cloned()
    }

    /// The largest, over every window between two samples, of issuance ÷ what the budget
    /// allows in that window: `min(depth + rate × w, peak × ⌈w⌉)`.
    pub fn peak_issuance_ratio(&self, rate: f64, depth: f64, peak: f64) -> (f64, String) {
        let s = self.samples.0.lock().unwrap().clone();
        let mut worst = (0.0, String::new());
        for i in 0..s.len() {
            for j in i + 1..s.len() {
                let issued = (s[j].1 - s[i].1) as f64;
                if issued == 0.0 {
                    continue;
                }
                let w = (s[j].0 - s[i].0).as_secs_f64();
                let allowed = (depth + rate * w).min(peak * w.ceil().max(1.0));
                let ratio = issued / allowed;
                if ratio > worst.0 {
                    worst = (
                        ratio,
                        format!(
                            "{issued} SVIDs in {w:.2}s (allowed {allowed:.1}) at {:?}",
                            s[i].0
                        ),
                    );
                }
            }
        }
        worst
    }

    pub async fn shutdown(mut self) {
        self.stop_operator().await;
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        let Harness { world, emu, .. } = self;
        world.stop();
        emu.shutdown().await;
    }
}

/// A pod as the deletion log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSeen {
    pub uid: String,
    pub name: String,
    /// The revision the injector recorded (`None`: not injected).
    pub revision: Option<String>,
}

impl PodSeen {
    fn of(p: &Pod) -> PodSeen {
        PodSeen {
            uid: p.metadata.uid.clone().unwrap_or_default(),
            name: p.name_any(),
            revision: p.metadata.annotations.as_ref().and_then(injected_revision),
        }
    }
}

/// What the API reported about a namespace's pods since the watch started.
#[derive(Debug, Clone, Default)]
pub struct DeletionLog {
    /// The pods of the watch's first listing (the fleet before anything was restarted).
    pub initial: Vec<PodSeen>,
    /// Every pod deleted since, in the order the API reported it (a pod that went while the
    /// watch was relisting is recorded when the relist misses it).
    pub deleted: Vec<PodSeen>,
    /// The first listing is in.
    pub synced: bool,
}

impl DeletionLog {
    /// Deleted pods by uid: how many times each was reported deleted.
    pub fn deletions_by_uid(&self) -> BTreeMap<&str, u32> {
        let mut out = BTreeMap::new();
        for p in &self.deleted {
            *out.entry(p.uid.as_str()).or_default() += 1;
        }
        out
    }
}

/// A watch of a namespace's pods recording every deletion the API reports: the evictions that
/// happened, counted from the cluster rather than from whoever sent them (an eviction in flight
/// when its operator stops is carried out but never reported back to it).
pub struct PodDeletions {
    log: Arc<Mutex<DeletionLog>>,
    task: JoinHandle<()>,
}

impl PodDeletions {
    /// What the watch recorded so far.
    pub fn log(&self) -> DeletionLog {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for PodDeletions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Applies one watch event to `log`; `alive` is what the watch last knew to exist, `relist` the
/// pods of a listing in progress.
fn record_pod_event(
    log: &Mutex<DeletionLog>,
    alive: &mut BTreeMap<String, PodSeen>,
    relist: &mut Option<BTreeSet<String>>,
    event: watcher::Event<Pod>,
) {
    let mut log = log.lock().unwrap();
    match event {
        watcher::Event::Init => *relist = Some(BTreeSet::new()),
        watcher::Event::InitApply(p) => {
            let seen = PodSeen::of(&p);
            if let Some(r) = relist.as_mut() {
                r.insert(seen.uid.clone());
            }
            if !log.synced {
                log.initial.push(seen.clone());
            }
            alive.insert(seen.uid.clone(), seen);
        }
        watcher::Event::InitDone => {
            let listed = relist.take().unwrap_or_default();
            let gone: Vec<String> = alive
                .keys()
                .filter(|uid| !listed.contains(*uid))
                .cloned()
                .collect();
            for uid in gone {
                if let Some(p) = alive.remove(&uid) {
                    log.deleted.push(p);
                }
            }
            log.synced = true;
        }
        watcher::Event::Apply(p) => {
            let seen = PodSeen::of(&p);
            alive.insert(seen.uid.clone(), seen);
        }
        watcher::Event::Delete(p) => {
            let seen = PodSeen::of(&p);
            alive.remove(&seen.uid);
            log.deleted.push(seen);
        }
    }
}

impl Harness {
    /// Starts recording the pods of namespace `ns` deleted from now on; returns once the
    /// watch's first listing is in.
    pub async fn watch_pod_deletions(&self, ns: &str) -> PodDeletions {
        let log = Arc::new(Mutex::new(DeletionLog::default()));
        let events = watcher(
            Api::<Pod>::namespaced(self.client.clone(), ns),
            watcher::Config::default(),
        )
        .default_backoff();
        let task = tokio::spawn({
            let log = log.clone();
            async move {
                let mut alive = BTreeMap::new();
                let mut relist = None;
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    if let Ok(event) = event {
                        record_pod_event(&log, &mut alive, &mut relist, event);
                    }
                }
            }
        });
        let deletions = PodDeletions { log, task };
        eventually(
            "the pod watch's first listing",
            Duration::from_secs(10),
            || async { deletions.log().synced.then_some(()) },
        )
        .await;
        deletions
    }
}

/// A Deployment of `replicas` pods that tolerates one unavailable pod (so sluice evicts its
/// pods one at a time; a single replica surges).
pub fn deployment(ns: &str, name: &str, replicas: i32) -> Value {
    deployment_with(
        ns,
        name,
        replicas,
        json!({"maxSurge": 1, "maxUnavailable": 1}),
    )
}

/// A Deployment with this `rollingUpdate` strategy.
pub fn deployment_with(ns: &str, name: &str, replicas: i32, rolling_update: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": format!("{name}:1")}]}
            }
        }
    })
}

pub fn condition(obj: &RevisionUpgrade, type_: &str) -> Option<(String, String, String)> {
    let c = sluice_runtime::conditions::find(&obj.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}
