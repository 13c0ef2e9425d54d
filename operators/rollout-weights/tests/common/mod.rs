//! Given/When/Then fixtures of the rollout-weights end-to-end tests: the API emulator serving
//! the released Gateway API HTTPRoute CRD and sluice's Rollout CRD, a real Prometheus, the
//! simulated world (cluster behaviour + mesh telemetry from the routes actually stored), a rich
//! `shop/checkout` route, and the controller in-process or as the binary. A world without a
//! metrics source ([`given_route`]) serves either route kind: the `shop/checkout` HTTPRoute or
//! the `shop/payments` GRPCRoute (the released GRPCRoute CRD), for the Rollout of that kind
//! ([`rollout_on`]) and the controller started for that kind ([`Controller::start_on`]).
#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{apps::v1::Deployment, events::v1::Event};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_emulator::Emulator;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use sluice_api::{
    external::http_route::HttpRoute,
    v1alpha1::{Rollout, RolloutPhase, RolloutStatus},
};
use sluice_rollout_weights::{
    OPERATOR, metrics, orphans, reconcile,
    route::{RouteKind, grpc::Grpc},
    triggers,
};
use sluice_runtime::{
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive_with},
};
use sluice_sim::{ClusterConfig, Scenario, World};
use sluice_testkit::crds::{emulator_with, sluice_crd};
use sluice_testkit::prereq::{Upstream, or_skip, upstream_file};
use sluice_testkit::prometheus::Prometheus;
use tokio_util::sync::CancellationToken;

/// The one wait of the test kit, for the scenarios that `use common::*`.
pub use sluice_testkit::eventually::eventually;

/// The route kinds a fixture Rollout can govern.
pub use sluice_api::v1alpha1::rollout::RouteKindName;

pub const NS: &str = "shop";
pub const STABLE: &str = "checkout-v2-13";
pub const CANARY: &str = "checkout-v2-14";
pub const CLUSTER: &str = "cluster-1";

/// The GRPCRoute of the GRPCRoute kind's world, its managed rule and its two Services.
pub const GRPC_ROUTE: &str = "payments";
pub const GRPC_RULE: &str = "charge";
pub const GRPC_STABLE: &str = "payments-v1";
pub const GRPC_CANARY: &str = "payments-v2";

/// The released GRPCRoute CRD (Gateway API v1.6.1), fetched by the install script.
const GRPCROUTE_FILE: &str = "gateway.networking.k8s.io_grpcroutes.yaml";

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

/// A GRPCRoute with every part of the v1.6.1 schema the operator must carry over: parentRefs,
/// hostnames, method and header matches, filters (a RequestMirror among them), a second backend
/// at weight 0 with filters of its own, and a second rule.
pub fn payments_route() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {
            "name": GRPC_ROUTE, "namespace": NS,
            "labels": {"app": "payments"},
            "annotations": {"team": "payments"}
        },
        "spec": {
            "parentRefs": [{"name": "mesh-gw", "namespace": "gateways", "sectionName": "grpc"}],
            "hostnames": ["payments.example.com"],
            "rules": [
                {
                    "name": GRPC_RULE,
                    "matches": [{
                        "method": {"type": "Exact", "service": "pay.v1.Payments", "method": "Charge"},
                        "headers": [{"type": "Exact", "name": "x-tenant", "value": "a"}]
                    }],
                    "filters": [
                        {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "grpc"}]}},
                        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 9000}, "percent": 5}}
                    ],
                    "backendRefs": [
                        {"name": GRPC_STABLE, "port": 80, "weight": 100},
                        {"name": "audit", "port": 9000, "weight": 0, "filters": [
                            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-audit", "value": "1"}]}}
                        ]}
                    ]
                },
                {
                    "name": "health",
                    "matches": [{"method": {"service": "grpc.health.v1.Health"}}],
                    "backendRefs": [{"name": "health", "port": 9000}]
                }
            ]
        }
    })
}

/// The `routeRef` of a fixture Rollout on `kind`, and that route's stable and canary Services:
/// the HTTPRoute `checkout` (its managed rule found by the stable backend) from checkout-v2-13
/// to checkout-v2-14, or the GRPCRoute `payments`' rule `charge` from payments-v1 to payments-v2.
pub fn route_of(kind: RouteKindName) -> (Value, &'static str, &'static str) {
    match kind {
        RouteKindName::HttpRoute => (json!({"name": "checkout"}), STABLE, CANARY),
        RouteKindName::GrpcRoute => (
            json!({"kind": "GRPCRoute", "name": GRPC_ROUTE, "ruleName": GRPC_RULE}),
            GRPC_STABLE,
            GRPC_CANARY,
        ),
    }
}

/// A Rollout of `shop/checkout` on the `checkout` HTTPRoute from v2.13 to v2.14 with
/// seconds-scale settings and `steps`; `patch` overrides top-level spec fields.
pub fn rollout(steps: Value, patch: Value) -> Rollout {
    rollout_on(RouteKindName::HttpRoute, steps, patch)
}

/// A Rollout `shop/checkout` on the route of `kind` ([`route_of`]) with seconds-scale settings
/// and `steps`; `patch` overrides top-level spec fields.
pub fn rollout_on(kind: RouteKindName, steps: Value, patch: Value) -> Rollout {
    let (route_ref, stable, canary) = route_of(kind);
    let mut spec = json!({
        "routeRef": route_ref,
        "stableService": {"name": stable},
        "canaryService": {"name": canary},
        "canaryWorkload": {"name": canary},
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
        .telemetry(prometheus.url(), scenario, Duration::from_secs(1))
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

/// Whether the released CRD of a world's route kind is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteCrd {
    /// Served, and the kind's route stored.
    Installed,
    /// Not served, and no route of the kind.
    Missing,
}

/// The emulator alone, without a metrics source or a simulated world (the steps are passed with
/// `promoteThroughStep`), for Rollouts on `kind` ([`route_of`]): the released HTTPRoute CRD (the
/// controller watches HTTPRoutes whatever the kind), sluice's CRDs, the namespace, and the
/// kind's two Deployments (ready) and Services; with `crd` installed, the kind's released CRD
/// and its route ([`rich_route`], [`payments_route`]). `None` when a prerequisite is missing.
pub async fn given_route(kind: RouteKindName, crd: RouteCrd) -> Option<Given> {
    let installed = crd == RouteCrd::Installed;
    let mut files = Vec::new();
    if kind != RouteKindName::HttpRoute || installed {
        files.push(or_skip(sluice_testkit::prereq::httproute_crd())?);
    }
    files.push(sluice_crd("rollouts.sluice.dev.yaml"));
    files.push(sluice_crd("gatetemplates.sluice.dev.yaml"));
    if kind == RouteKindName::GrpcRoute && installed {
        files.push(or_skip(upstream_file(
            Upstream::GatewayApi,
            GRPCROUTE_FILE,
        ))?);
    }
    let emu = emulator_with(files).await;
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    let client = emu.client();
    let (_, stable, canary) = route_of(kind);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    for name in [stable, canary] {
        emu.load_yaml(&deployment(name)).unwrap();
        let d = deployments.get(name).await.unwrap();
        let status = json!({"status": {
            "observedGeneration": d.metadata.generation.unwrap_or(1),
            "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1
        }});
        deployments
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    if installed {
        match kind {
            RouteKindName::HttpRoute => {
                let route: HttpRoute = serde_json::from_value(rich_route()).unwrap();
                routes(&client)
                    .create(&PostParams::default(), &route)
                    .await
                    .expect("the released schema accepts the route");
            }
            RouteKindName::GrpcRoute => {
                let route: DynamicObject = serde_json::from_value(payments_route()).unwrap();
                grpc_routes(&client)
                    .create(&PostParams::default(), &route)
                    .await
                    .expect("the released schema accepts the route");
            }
        }
    }
    Some(Given {
        emu,
        prometheus: None,
        world: None,
        client,
        started: Instant::now(),
    })
}

/// Installs the released GRPCRoute CRD into the running emulator, as a cluster's owner would
/// after the operator started.
pub fn install_grpc_route_crd(emu: &Emulator) {
    let file = upstream_file(Upstream::GatewayApi, GRPCROUTE_FILE)
        .expect("the GRPCRoute CRD was there when the test started");
    emu.load_manifest_file(&file)
        .unwrap_or_else(|e| panic!("loading {}: {e}", file.display()));
}

pub fn routes(client: &Client) -> Api<HttpRoute> {
    Api::namespaced(client.clone(), NS)
}

pub fn grpc_routes(client: &Client) -> Api<DynamicObject> {
    Grpc::api(client.clone(), Some(NS))
}

pub fn rollouts(client: &Client) -> Api<Rollout> {
    Api::namespaced(client.clone(), NS)
}

/// Creates `rollout`.
pub async fn create_rollout(client: &Client, rollout: &Rollout) {
    rollouts(client)
        .create(&PostParams::default(), rollout)
        .await
        .expect("Rollout created");
}

/// The controller running in-process.
pub struct Controller {
    /// The operator's own metrics and the runtime's (`sluice_object_*`, `sluice_rollouts`).
    registries: [Registry; 2],
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// The orphaned-ownership sweeps; they have no shutdown of their own, so `stop` aborts them.
    sweeps: Vec<tokio::task::JoinHandle<()>>,
}

impl Controller {
    /// Starts the controller on `client` for Rollouts on HTTPRoutes, judging with metrics from
    /// `prometheus_url`.
    pub fn start(client: &Client, prometheus_url: &str) -> Controller {
        Controller::spawn(
            client,
            Some(prometheus_url),
            triggers::Watched::new(client, None),
            Vec::new(),
        )
    }

    /// Starts the controller on `client` for Rollouts on routes of `kind`, judging with metrics
    /// from `prometheus_url` or, when `None`, without a metrics source (no weight step is
    /// judged: the steps are passed with `promoteThroughStep`). For GRPCRoutes, as `main`
    /// wires them: watched, and their orphaned ownership swept, once their CRD is installed
    /// (looked for every 200 ms).
    pub async fn start_on(
        client: &Client,
        kind: RouteKindName,
        prometheus_url: Option<&str>,
    ) -> Controller {
        let mut watched = triggers::Watched::new(client, None);
        let mut sweeps = Vec::new();
        if kind == RouteKindName::GrpcRoute {
            let grpc = triggers::GrpcRoutes {
                poll: Duration::from_millis(200),
                ..triggers::GrpcRoutes::new(client, client, None)
            };
            watched.grpc_routes = Some(grpc.clone());
            sweeps.push(tokio::spawn(orphans::run_when_installed(
                grpc,
                client.clone(),
                Leadership::always(),
                EventRecorder::new(client.clone(), OPERATOR),
            )));
        }
        Controller::spawn(client, prometheus_url, watched, sweeps)
    }

    /// The Rollout controller with its triggers on `watched`, beside the running `sweeps`.
    fn spawn(
        client: &Client,
        prometheus_url: Option<&str>,
        watched: triggers::Watched,
        sweeps: Vec<tokio::task::JoinHandle<()>>,
    ) -> Controller {
        let mut registry = Registry::default();
        let m = metrics::register(&mut registry);
        let mut ctx =
            reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
        ctx = match prometheus_url {
            Some(url) => ctx.with_analysis(url, CLUSTER, m).expect("engine starts"),
            None => {
                ctx.metrics = m;
                ctx
            }
        };
        let ctx = ctx.with_gate_template_cache(client.clone());
        let (hooks, shared) = Hooks::standalone();
        metrics::read_at_scrape(&hooks.metrics.objects());
        let hooks = hooks.with_primary_changes(sluice_rollout_weights::PRIMARY_CHANGES);
        hooks.health.set_leader(true);
        let shutdown = CancellationToken::new();
        let extend = triggers::sharing_store(
            ctx.rollouts.clone(),
            triggers::with_triggers(watched, watcher::Config::default()),
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
            registries: [registry, shared],
            shutdown,
            task,
            sweeps,
        }
    }

    /// The operator's metrics, encoded.
    pub fn metrics(&self) -> String {
        let [own, shared] = &self.registries;
        sluice_runtime::metrics::encode(own) + &sluice_runtime::metrics::encode(shared)
    }

    /// Stops the controller, then the sweeps.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        for sweep in self.sweeps {
            sweep.abort();
        }
    }
}

/// Waits until the Rollout's abort records its routes reverted (`status.abort.routeRevertedAt`)
/// and returns its status, whose phase is Aborted.
pub async fn abort_recorded(client: &Client, within: Duration) -> RolloutStatus {
    let aborted = rollout_until(client, "abort recorded", within, |r| {
        r.status
            .as_ref()
            .and_then(|s| s.abort.as_ref())
            .is_some_and(|a| a.route_reverted_at.is_some())
    })
    .await;
    let status = aborted.status.expect("an aborted Rollout has a status");
    assert_eq!(status.phase, RolloutPhase::Aborted, "{status:#?}");
    status
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
