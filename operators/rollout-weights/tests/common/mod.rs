//! Given/When/Then fixtures of the rollout-weights end-to-end tests: the API emulator serving
//! the released Gateway API HTTPRoute CRD and sluice's Rollout CRD, a real Prometheus, the
//! simulated world (cluster behaviour + mesh telemetry from the routes actually stored), a rich
//! `shop/checkout` route, and the controller in-process or as the binary.
#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
    runtime::watcher,
};
use kube_emulator::Emulator;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use sluice_api::{external::http_route::HttpRoute, v1alpha1::Rollout};
use sluice_rollout_weights::{OPERATOR, metrics, reconcile, triggers};
use sluice_runtime::{
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive_with},
};
use sluice_sim::{ClusterConfig, Scenario, World};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::prometheus::Prometheus;
use tokio_util::sync::CancellationToken;

/// The one wait of the test kit, for the scenarios that `use common::*`.
pub use sluice_testkit::eventually::eventually;

pub const NS: &str = "shop";
pub const STABLE: &str = "checkout-v2-13";
pub const CANARY: &str = "checkout-v2-14";
pub const CLUSTER: &str = "cluster-1";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The released HTTPRoute CRD (Gateway API v1.6.1), fetched by the install script.
pub fn upstream_httproute_crd() -> PathBuf {
    sluice_testkit::prereq::httproute_crd().expect("checked by prerequisites()")
}

/// Whether the prerequisites are there: skips (or, under CI, fails) naming what is missing.
pub fn prerequisites() -> bool {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::httproute_crd()).is_some()
}

/// A scenario from `scenarios/` with the traffic raised so that a 1% step has enough requests
/// in a 4 s window (the sim's counters are expected counts, so this costs nothing).
pub fn scenario(name: &str, rps: f64) -> Scenario {
    let mut s = Scenario::shipped(name).expect("shipped scenario loads");
    for svc in &mut s.services {
        svc.requests_per_second = rps;
    }
    s
}

/// The rich route: hostnames, parentRefs with an unmodelled field, labels and annotations, an
/// admin rule with a filter and its own backend, and the managed rule with a header filter and
/// timeouts.
pub fn rich_route() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": "checkout", "namespace": NS,
            "labels": {"app": "checkout"},
            "annotations": {"team": "payments"}
        },
        "spec": {
            "parentRefs": [{"name": "mesh-gw", "namespace": "gateways", "sectionName": "https"}],
            "hostnames": ["shop.example.com"],
            "rules": [
                {
                    "name": "admin",
                    "matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}],
                    "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-admin", "value": "1"}]}}],
                    "backendRefs": [{"name": "admin", "port": 8080}]
                },
                {
                    "name": "main",
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "checkout"}]}}],
                    "timeouts": {"request": "10s"},
                    "backendRefs": [{"name": STABLE, "port": 80, "weight": 100}]
                }
            ]
        }
    })
}

/// A Rollout of `shop/checkout` from v2.13 to v2.14 with seconds-scale settings and `steps`;
/// `patch` overrides top-level spec fields.
pub fn rollout(steps: Value, patch: Value) -> Rollout {
    let mut spec = json!({
        "routeRef": {"name": "checkout"},
        "stableService": {"name": STABLE},
        "canaryService": {"name": CANARY},
        "canaryWorkload": {"name": CANARY},
        "analysisInterval": "1s",
        "stepDuration": "2s",
        "appliedShareDeadline": "60s",
        "canaryReadyDeadline": "60s",
        // Seconds-scale gates: a 4 s window (4 of the world's 1 s intervals), and three
        // consecutive share failures, since a seconds-long window moves more between two
        // readings than the production's minutes-long one.
        "gates": [
            {"name": "applied-share", "builtin": "AppliedShare", "window": "4s", "consecutiveFailures": 3},
            {"name": "error-ratio", "builtin": "ErrorRatioVsStable", "window": "4s"},
            {"name": "latency-p99", "builtin": "LatencyP99VsStable", "window": "4s"}
        ],
        "steps": steps,
    });
    for (k, v) in patch.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "checkout", "namespace": NS},
        "spec": spec,
    }))
    .expect("fixture Rollout deserializes")
}

/// A Deployment and its Service `name` in the shop namespace, as YAML.
pub fn deployment(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: example/{name}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  selector: {{app: {name}}}\n  ports:\n  - port: 80\n"
    )
}

/// The local world of one test.
pub struct Given {
    pub emu: Emulator,
    pub prometheus: Option<Prometheus>,
    pub world: Option<World>,
    pub client: Client,
    pub started: Instant,
}

impl Given {
    /// From now on the canary (`checkout` v2.14) returns 5xx at `factor` × stable's ratio.
    pub fn canary_errors_at(&self, factor: f64) {
        self.world
            .as_ref()
            .and_then(|w| w.mesh())
            .expect("mesh simulator")
            .apply_now(sluice_sim::mesh::scenario::Event {
                service: Some("checkout".into()),
                version: Some("v2.14".into()),
                error_ratio_factor: Some(factor),
                ..Default::default()
            });
    }
}

/// Starts the emulator (CRDs, namespace, both versions' Deployments and Services, the rich
/// route), Prometheus and the world playing `scenario`. `None` when a prerequisite is missing.
pub async fn given(scenario: Scenario) -> Option<Given> {
    if !prerequisites() {
        return None;
    }
    let prometheus = Prometheus::start_or_skip().await?;
    let emu = emulator_with([
        upstream_httproute_crd(),
        sluice_crd("rollouts.sluice.dev.yaml"),
        sluice_crd("gatetemplates.sluice.dev.yaml"),
    ])
    .await;
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    let client = emu.client();
    for name in [STABLE, CANARY] {
        emu.load_yaml(&deployment(name)).unwrap();
    }
    let route: HttpRoute = serde_json::from_value(rich_route()).unwrap();
    routes(&client)
        .create(&PostParams::default(), &route)
        .await
        .expect("route created");
    let mut config = ClusterConfig::new(CLUSTER);
    config.readiness_delay = Duration::from_millis(300);
    let world = World::builder()
        .cluster_with(config, client.clone())
        .prometheus(prometheus.url())
        .scenario(scenario)
        .interval(Duration::from_secs(1))
        .start()
        .expect("world starts");
    Some(Given {
        emu,
        prometheus: Some(prometheus),
        world: Some(world),
        client,
        started: Instant::now(),
    })
}

pub fn routes(client: &Client) -> Api<HttpRoute> {
    Api::namespaced(client.clone(), NS)
}

pub fn rollouts(client: &Client) -> Api<Rollout> {
    Api::namespaced(client.clone(), NS)
}

/// The controller running in-process.
pub struct Controller {
    pub registry: Registry,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    /// Starts the controller on `client`, judging with metrics from `prometheus_url`.
    pub fn start(client: &Client, prometheus_url: &str) -> Controller {
        let mut registry = Registry::default();
        let m = metrics::register(&mut registry);
        let ctx =
            reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR))
                .with_analysis(prometheus_url, CLUSTER, m)
                .expect("engine starts")
                .with_gate_template_cache(client.clone());
        let (hooks, _) = Hooks::standalone();
        let hooks = hooks.with_primary_changes(sluice_rollout_weights::PRIMARY_CHANGES);
        hooks.health.set_leader(true);
        let shutdown = CancellationToken::new();
        let extend = triggers::sharing_store(
            ctx.rollouts.clone(),
            triggers::with_triggers(
                triggers::Watched::new(client, None),
                watcher::Config::default(),
            ),
        );
        let task = tokio::spawn(drive_with(
            Api::<Rollout>::all(client.clone()),
            watcher::Config::default(),
            Arc::new(ctx),
            reconcile::reconcile,
            Leadership::always(),
            shutdown.clone(),
            hooks,
            extend,
        ));
        Controller {
            registry,
            shutdown,
            task,
        }
    }

    /// The operator's metrics, encoded.
    pub fn metrics(&self) -> String {
        sluice_runtime::metrics::encode(&self.registry)
    }

    /// Stops the controller.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// Waits until the Rollout satisfies `check`.
pub async fn rollout_until(
    client: &Client,
    what: &str,
    within: Duration,
    check: impl Fn(&Rollout) -> bool,
) -> Rollout {
    let api = rollouts(client);
    eventually(what, within, async || {
        let r = api.get("checkout").await.map_err(|e| e.to_string())?;
        if check(&r) {
            Ok(r)
        } else {
            Err(format!("{:#?}", r.status))
        }
    })
    .await
}

/// Waits until the Rollout is at step `step` with that step's share confirmed by telemetry.
pub async fn share_confirmed_at_step(
    client: &Client,
    what: &str,
    step: u32,
    within: Duration,
) -> Rollout {
    rollout_until(client, what, within, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.current_step_index == Some(step)
                && s.history
                    .last()
                    .is_some_and(|h| h.share_confirmed_at.is_some())
        })
    })
    .await
}

/// The route's managed rule backend weights as (stable, canary).
pub fn weights(route: &HttpRoute) -> (i32, i32) {
    let rule = route.rule_by_name("main").expect("managed rule");
    let w = |n: &str| rule.backend(n).map_or(0, |b| b.effective_weight());
    (w(STABLE), w(CANARY))
}

/// Names of the rules on the route.
pub fn rule_names(route: &HttpRoute) -> Vec<String> {
    route
        .rules()
        .iter()
        .map(|r| r.name.clone().unwrap_or_default())
        .collect()
}

/// Events about the Rollout with `reason`.
pub async fn events(client: &Client, reason: &str) -> Vec<Event> {
    sluice_testkit::events::with_reason(client, NS, reason).await
}

/// Deletes the Rollout and waits until it is gone (the finalizer handed the route back).
pub async fn delete_rollout(client: &Client, within: Duration) {
    let api = rollouts(client);
    api.delete("checkout", &DeleteParams::default())
        .await
        .expect("delete accepted");
    eventually(
        "Rollout deleted after hand-back",
        within,
        async || match api.get_opt("checkout").await {
            Ok(None) => Ok(()),
            Ok(Some(r)) => Err(format!(
                "still there: finalizers {:?}",
                r.metadata.finalizers
            )),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
}

/// The operator binary as a child process; killed on drop.
pub struct Binary(pub Option<Child>);

impl Binary {
    /// Starts the binary against the emulator with `identity` and short Lease settings.
    pub fn start(
        kubeconfig: &Path,
        prometheus_url: &str,
        identity: &str,
        metrics_port: u16,
    ) -> Binary {
        let child = Command::new(env!("CARGO_BIN_EXE_sluice-rollout-weights"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--lease-namespace", "default", "--identity", identity])
            .args([
                "--lease-duration-seconds",
                "4",
                "--lease-renew-seconds",
                "2",
                "--lease-retry-seconds",
                "1",
            ])
            .args(["--prometheus-url", prometheus_url, "--cluster", CLUSTER])
            .args(["--log-format", "text", "--log-level", "warn"])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("binary starts");
        Binary(Some(child))
    }

    /// SIGKILL: no Lease release, no graceful anything.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
