//! Scenarios `waves-clean` and `waves-breach`: a mesh configuration change crossing the fleet in
//! cluster waves under wave-gate, one WaveGate per site beside that site's Argo CD.
//!
//! Both start the same way. CI publishes two signed bundles of the fleet's mesh configuration
//! (the route `shop/checkout-internal`): the one the fleet runs and the change. Each site gets an
//! ApplicationSet whose clusterDecisionResource generator reads the site's WaveGate (duck
//! ConfigMap, `applicationsSync: create-update`, `preserveResourcesOnDeletion: true`, automated
//! sync whose `/spec/syncPolicy` differences the ApplicationSet ignores, so revert may suspend
//! it), and a WaveGate that adopts the running bundle. Argo CD syncs it everywhere; then the
//! WaveGates are given the change.
//!
//! - `waves-clean`: two sites in the seed's fleet order — east's canary cluster (`east-1`), then
//!   one cluster per site (`west-1`, waiting for east's canary through the global metrics view),
//!   then the rest (`east-2` waiting for west's first wave, `west-2`). Passes when both WaveGates
//!   complete with every wave passed in that order, every Application Synced at the change and
//!   its route in every workload cluster. Figures: time per wave (admitted → passed, as watched),
//!   `total_ms` (change given → both complete).
//! - `waves-breach`: site east only. Once the canary wave soaks, the change's too-short request
//!   timeout makes the mesh fail requests in `east-1`; the mesh-error-ratio gate fails, wave-gate
//!   halts in wave 0 and creates a BundlePin of the previous bundle for `east-1` only, which the
//!   revert operator applies and later releases when Argo CD reports the previous revision.
//!   Figures: `halt_to_pin_ms` (first Fail verdict seen → BundlePin seen), `breach_to_reverted_ms`
//!   (fault injected → the pinned bundle's route back in `east-1`, with `reverted_by` naming the
//!   field manager that wrote it: Argo CD syncing the set-back decision may get there before
//!   revert), `breach_to_pinned_ms` (fault injected → the BundlePin Pinned: revert verified and
//!   applied it), all watched at [`FAST_POLL`].
//!
//! The scenario plays only what the platform around sluice does: CI (the bundles), the platform's
//! drift exporter (when Argo CD reports a cluster Synced at a revision, the mesh simulator is told
//! the bundle's source commit was applied there: `config_applied`), the global metrics view (each
//! wave-gate's `sluice_wavegate_wave_passed` carried into Prometheus) and the fault. It never
//! writes a decision, an Application, a BundlePin or a workload object: only Argo CD, wave-gate
//! and revert do.
//!
//! The fault is the mesh simulator's own (`testing/sluice-sim/CONTRACT.md`, mesh-attributed
//! failures): from a known instant a share of `east-1`'s requests fail in the mesh with Envoy's
//! `UT` flag (upstream request timeout), reported by the source proxy with
//! `failure_origin="mesh"`; it is lifted once the previous bundle is back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};
use sluice_api::external::argocd::Application;
use sluice_api::v1alpha1::bundle_pin::BundlePinPhase;
use sluice_api::v1alpha1::wave_gate::{HaltReason, WaveState};
use sluice_api::v1alpha1::{BundlePin, Verdict, WaveGate, WaveGatePhase};
use sluice_sim::mesh::Event as MeshEvent;
use sluice_sim::mesh::scenario::ResponseFlag;
use sluice_testkit::prometheus::now_ms;
use sluice_testkit::remote_write::Series;

use super::bundles::{self, Change, Published};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{DUCK_CONFIGMAP, SHOP, STABLE};
use crate::operators::{ARGOCD_NAMESPACE, Operator};
use crate::sandbox::{PUBLIC_KEYS_SECRET, Sandbox};

/// Registry repository of the fleet's mesh configuration bundles.
pub const REPOSITORY: &str = "mesh/config";
/// Directory of the fleet's mesh configuration in the intent repository.
pub const BUNDLE_DIR: &str = "fleet/mesh";
/// The route the bundles carry (namespace [`SHOP`]).
pub const BUNDLE_ROUTE: &str = "checkout-internal";
/// Request timeout of checkout's internal route in the bundle the fleet runs.
pub const RUNNING_TIMEOUT: &str = "10s";
/// Request timeout in `waves-clean`'s change (harmless).
pub const CLEAN_TIMEOUT: &str = "8s";
/// Request timeout in `waves-breach`'s change: too short, so the mesh times requests out.
pub const BREACH_TIMEOUT: &str = "250ms";
/// Soak of every wave in `waves-clean` (seconds-scale; the seed's is 10 and 15 minutes).
pub const SOAK: &str = "2s";
/// Soak of the canary wave in `waves-breach`: long enough for the fault to land in it.
pub const BREACH_SOAK: &str = "60s";
/// Name of a site's first wave when it is the fleet's canary.
pub const CANARY_WAVE: &str = "canary";
/// Name of the first wave of every other site.
pub const ONE_PER_SITE_WAVE: &str = "one-per-site";
/// Name of every site's last wave.
pub const REST_WAVE: &str = "rest";
/// The metric each wave-gate exports per wave its site passed (its README's cross-site
/// contract), carried into Prometheus by the global metrics view.
pub const WAVE_PASSED_METRIC: &str = "sluice_wavegate_wave_passed";
/// The scrape job wave-gate's own metrics carry at every site (the chart's ServiceMonitor names
/// it after the component); wave-gate's `--wave-passed-job` default.
pub const WAVE_GATE_JOB: &str = "wave-gate";
/// The drift exporter's gauge (sluice's contract; the simulator plays the exporter).
pub const DRIFT_METRIC: &str = "sluice_drift_proxies_behind";
/// Share of the canary cluster's requests the mesh fails during the breach.
pub const MESH_FAILURE_RATIO: f64 = 0.15;
/// The canary cluster of the fleet.
pub const CANARY_CLUSTER: &str = "east-1";
/// How often the platform's parts (drift exporter, global view) act.
pub const PLATFORM_TICK: Duration = Duration::from_millis(250);
/// How often the breach is watched.
pub const FAST_POLL: Duration = Duration::from_millis(20);
/// How often waves are watched.
pub const POLL: Duration = Duration::from_millis(100);

const APPLICATION_SET: (&str, &str, &str, &str) = (
    "argoproj.io",
    "v1alpha1",
    "ApplicationSet",
    "applicationsets",
);
const HTTPROUTE: (&str, &str, &str, &str) =
    ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes");

/// The `waves-clean` registry entry.
pub const CLEAN: ScenarioDef = ScenarioDef {
    name: "waves-clean",
    description: "a signed mesh bundle crosses east and west in the fleet order (east-1, then \
                  west-1, then east-2 and west-2) under one WaveGate per site; pass when both \
                  complete in that order with every Application Synced at it (time per wave, \
                  total_ms)",
    budget: Duration::from_secs(110),
    run: start_clean,
};

/// The `waves-breach` registry entry.
pub const BREACH: ScenarioDef = ScenarioDef {
    name: "waves-breach",
    description: "a bundle whose route times requests out reaches east-1 and mesh-attributed \
                  errors rise; pass when wave-gate halts in wave 0, pins east-1 alone back to the \
                  previous signed bundle and revert applies it (halt_to_pin_ms, \
                  breach_to_reverted_ms)",
    budget: Duration::from_secs(110),
    run: start_breach,
};

fn start_clean(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run_clean(sandbox).boxed()
}

fn start_breach(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run_breach(sandbox).boxed()
}

// ---------------------------------------------------------------------------------------------
// Pure parts: what is created, how progress is read and judged.

/// One site of the scenario: its name and workload clusters (first one first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// Site name (`east`): the WaveGate's name and `spec.site`.
    pub name: String,
    /// Workload clusters in order; the first goes first.
    pub clusters: Vec<String>,
}

impl Site {
    /// The site's management cluster (`east-mgmt`).
    pub fn management(&self) -> String {
        format!("{}-mgmt", self.name)
    }

    /// The site's ApplicationSet.
    pub fn application_set(&self) -> String {
        format!("mesh-{}", self.name)
    }
}

/// The name of a site's first wave: the fleet's canary for the first site, else one cluster per
/// site.
pub fn first_wave_name(site_index: usize) -> &'static str {
    if site_index == 0 {
        CANARY_WAVE
    } else {
        ONE_PER_SITE_WAVE
    }
}

/// The seed's fleet order as per-site waves plus cross-site waits: the first site's first cluster
/// (the canary), then one cluster per other site (each waiting for the canary), then the rest of
/// every site (each waiting for every other site's first wave). `first_soak` is the soak of every
/// site's first wave, `soak` of the rest.
pub fn fleet_waves(sites: &[Site], first_soak: &str, soak: &str) -> Vec<Value> {
    sites
        .iter()
        .enumerate()
        .map(|(i, site)| {
            let others = |exclude: usize| -> Vec<Value> {
                sites
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != exclude)
                    .map(|(j, s)| json!({"site": s.name, "wave": first_wave_name(j)}))
                    .collect()
            };
            let first_wait: Vec<Value> = if i == 0 {
                Vec::new()
            } else {
                vec![json!({"site": sites[0].name, "wave": CANARY_WAVE})]
            };
            let mut waves = vec![json!({
                "name": first_wave_name(i),
                "clusters": site.clusters.iter().take(1).collect::<Vec<_>>(),
                "soak": first_soak,
                "waitFor": first_wait,
            })];
            if site.clusters.len() > 1 {
                waves.push(json!({
                    "name": REST_WAVE,
                    "clusters": site.clusters.iter().skip(1).collect::<Vec<_>>(),
                    "soak": soak,
                    "waitFor": others(i),
                }));
            }
            Value::Array(waves)
        })
        .collect()
}

/// The route the bundles carry: checkout's internal route with the given request timeout.
pub fn bundle_route(timeout: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {BUNDLE_ROUTE}\n  namespace: {SHOP}\n\
         spec:\n  parentRefs:\n  - name: mesh\n    namespace: istio-system\n  rules:\n  - backendRefs:\n    \
         - name: {STABLE}\n      port: 80\n    timeouts:\n      request: {timeout}\n"
    )
}

/// The request timeout of a route object (`spec.rules[0].timeouts.request`).
pub fn route_timeout(route: &Value) -> Option<&str> {
    route
        .pointer("/spec/rules/0/timeouts/request")
        .and_then(Value::as_str)
}

/// A site's ApplicationSet: one Application per decision of the site's WaveGate, at the
/// decision's revision of `repository` (`host:port/path`), synced automatically into [`SHOP`].
pub fn application_set(site: &Site, repository: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": site.application_set(), "namespace": ARGOCD_NAMESPACE},
        "spec": {
            "goTemplate": true,
            "generators": [{"clusterDecisionResource": {"configMapRef": DUCK_CONFIGMAP, "name": site.name}}],
            "template": {
                "metadata": {"name": "mesh-{{.clusterName}}"},
                "spec": {
                    "project": "default",
                    "source": {"repoURL": format!("oci://{repository}"), "targetRevision": "{{.revision}}", "path": "."},
                    "destination": {"name": "{{.clusterName}}", "namespace": SHOP},
                    "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
                }
            },
            "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
            // revert suspends a pinned Application's automation; the ApplicationSet must not
            // undo it.
            "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}],
        }
    })
}

/// A site's WaveGate at `revision` (source commit `commit`), with seconds-scale gates: the
/// built-in mesh-error-ratio, xds-nack-increase and proxies-behind over 5 s windows (at least 4
/// telemetry intervals of 1 s), the platform's drift exporter, and [`STARVED_GATE`].
pub fn wave_gate(site: &Site, repository: &str, published: &Published, waves: Value) -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "WaveGate",
        "metadata": {"name": site.name, "namespace": ARGOCD_NAMESPACE},
        "spec": {
            "site": site.name,
            "applicationSetRef": {"name": site.application_set()},
            "repository": format!("oci://{repository}"),
            "revision": published.manifest_digest,
            "sourceCommit": published.commit,
            "waves": waves,
            "defaultSoak": SOAK,
            "convergenceTimeout": "40s",
            "analysisInterval": "1s",
            "gates": [
                {"name": "mesh-error-ratio", "builtin": "MeshErrorRatio", "window": "5s", "minSamples": 50, "consecutiveFailures": 1},
                {"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "5s", "minSamples": 3, "consecutiveFailures": 1},
                {"name": "proxies-behind", "builtin": "ProxiesBehind", "window": "5s", "minSamples": 1, "consecutiveFailures": 1},
                {"name": STARVED_GATE, "builtin": "MeshErrorRatio", "window": "5s", "minSamples": 1_000_000_000u64,
                 "inconclusive": {"action": "Continue", "after": STARVED_AFTER}}
            ],
            "driftGate": {"exporter": "Platform", "metric": DRIFT_METRIC},
            "pin": {"publicKeysSecretRef": {"name": PUBLIC_KEYS_SECRET}},
        }
    })
}

/// A gate the sandbox's traffic never gives its samples, as a gate on a low-traffic service:
/// Inconclusive through every soak (what `SluiceWaveAnalysisInconclusive` reports, naming the
/// site and the gate), its policy Continue treats it as passed after [`STARVED_AFTER`], so the
/// waves still pass within their soak.
pub const STARVED_GATE: &str = "mesh-error-ratio-starved";
/// How long [`STARVED_GATE`] is Inconclusive before its policy lets the wave go on.
pub const STARVED_AFTER: &str = "1s";

/// The samples of `metric` in a Prometheus text exposition: labels and value per line.
pub fn parse_exposition(text: &str, metric: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = if let Some(body) = rest.strip_prefix('{') {
            let Some((labels, value)) = split_labels(body) else {
                continue;
            };
            (labels, value)
        } else if rest.starts_with(' ') {
            (Vec::new(), rest)
        } else {
            // Another metric sharing the prefix (`..._total`, `..._bucket`).
            continue;
        };
        let Some(value) = value.split_whitespace().next().and_then(|v| v.parse().ok()) else {
            continue;
        };
        out.push((labels, value));
    }
    out
}

/// `k="v",k2="v2"} rest` → the labels and `rest`; quotes and backslashes may be escaped.
fn split_labels(body: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = body;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, e) = chars.next()?;
                    value.push(if e == 'n' { '\n' } else { e });
                }
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((name.trim().to_string(), value));
        rest = &after[end + 1..];
    }
}

/// What was watched of one wave: when it was first seen admitted and passed (since the change was
/// given), and its last state.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveSeen {
    /// Site.
    pub site: String,
    /// Wave name.
    pub wave: String,
    /// First seen Converging, Soaking or Passed.
    pub admitted: Option<Duration>,
    /// First seen Passed.
    pub passed: Option<Duration>,
    /// Last state seen.
    pub state: Option<WaveState>,
}

/// Why the waves did not keep the fleet order, given what was watched and the waits each wave
/// had (`(site, wave) → [(other site, other wave)]`); empty when they kept it.
pub fn order_problems(
    seen: &[WaveSeen],
    waits: &BTreeMap<(String, String), Vec<(String, String)>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let find = |site: &str, wave: &str| seen.iter().find(|w| w.site == site && w.wave == wave);
    for (i, w) in seen.iter().enumerate() {
        let Some(admitted) = w.admitted else {
            problems.push(format!("{}/{} was never admitted", w.site, w.wave));
            continue;
        };
        if w.passed.is_none() {
            problems.push(format!("{}/{} never passed", w.site, w.wave));
        }
        // Within a site, the previous wave passed first.
        if let Some(prev) = seen[..i].iter().rev().find(|p| p.site == w.site) {
            match prev.passed {
                Some(p) if p <= admitted => {}
                _ => problems.push(format!(
                    "{}/{} was admitted before {}/{} passed",
                    w.site, w.wave, prev.site, prev.wave
                )),
            }
        }
        for (site, wave) in waits
            .get(&(w.site.clone(), w.wave.clone()))
            .into_iter()
            .flatten()
        {
            match find(site, wave).and_then(|o| o.passed) {
                Some(p) if p <= admitted => {}
                _ => problems.push(format!(
                    "{}/{} was admitted before {site}/{wave} passed",
                    w.site, w.wave
                )),
            }
        }
    }
    problems
}

/// The waits of every wave of `gates`, keyed by (site, wave).
pub fn waits_of(gates: &[WaveGate]) -> BTreeMap<(String, String), Vec<(String, String)>> {
    gates
        .iter()
        .flat_map(|g| {
            g.spec.waves.iter().map(|w| {
                (
                    (g.spec.site.clone(), w.name.clone()),
                    w.wait_for
                        .iter()
                        .map(|x| (x.site.clone(), x.wave.clone()))
                        .collect(),
                )
            })
        })
        .collect()
}

/// The field managers owning a route's `spec.rules` (who wrote the rules in force).
pub fn rules_managers(route: &Value) -> Vec<String> {
    route
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.pointer("/fieldsV1/f:spec/f:rules").is_some())
        .filter_map(|e| e.get("manager").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Whether a BundlePin has applied its bundle (Pinned, or already on to its release).
pub fn applied(pin: &BundlePin) -> bool {
    pin.status.as_ref().is_some_and(|s| {
        matches!(
            s.phase,
            BundlePinPhase::Pinned | BundlePinPhase::Releasing | BundlePinPhase::Released
        )
    })
}

/// Whether wave `i` of a WaveGate shows a Fail verdict (or the change halted).
pub fn failed_in(gate: &WaveGate, i: usize) -> bool {
    gate.status.as_ref().is_some_and(|s| {
        s.halt.is_some()
            || s.waves
                .get(i)
                .is_some_and(|w| w.gates.iter().any(|g| g.verdict == Verdict::Fail))
    })
}

/// Milliseconds of a duration, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(7 + 12)]
}

// ---------------------------------------------------------------------------------------------
// The platform around sluice: drift exporter, global metrics view.

/// What the platform's parts keep between ticks.
#[derive(Debug, Default)]
struct PlatformState {
    /// Bundle manifest digest → its source commit.
    commits: BTreeMap<String, String>,
    /// The revision each cluster last applied, as the drift exporter saw it.
    applied: BTreeMap<String, String>,
}

struct Platform<'a> {
    sandbox: &'a Sandbox,
    sites: Vec<Site>,
    state: Mutex<PlatformState>,
}

impl Platform<'_> {
    fn lock(&self) -> std::sync::MutexGuard<'_, PlatformState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the drift exporter and the global metrics view until dropped.
    async fn run(&self) {
        loop {
            self.drift_exporter().await;
            self.global_view().await;
            tokio::time::sleep(PLATFORM_TICK).await;
        }
    }

    /// When Argo CD reports a cluster's Application Synced and Healthy at a bundle revision, the
    /// cluster applied that bundle's source commit: tell the mesh, whose proxies then converge.
    async fn drift_exporter(&self) {
        for site in &self.sites {
            let Some(client) = self.sandbox.client(&site.management()) else {
                continue;
            };
            let apps: Api<Application> = Api::namespaced(client, ARGOCD_NAMESPACE);
            let Ok(list) = apps.list(&ListParams::default()).await else {
                continue;
            };
            for app in list.items {
                let Some(cluster) = app.spec.destination.as_ref().and_then(|d| d.name.clone())
                else {
                    continue;
                };
                let Some(revision) = app.synced_revision().map(str::to_owned) else {
                    continue;
                };
                if !app.is_synced_at(&revision) || !app.is_healthy() {
                    continue;
                }
                let commit = {
                    let mut state = self.lock();
                    if state.applied.get(&cluster) == Some(&revision) {
                        continue;
                    }
                    let Some(commit) = state.commits.get(&revision).cloned() else {
                        continue;
                    };
                    state.applied.insert(cluster.clone(), revision.clone());
                    commit
                };
                if let Some(mesh) = self.sandbox.world(&cluster).and_then(|w| w.mesh()) {
                    mesh.config_applied(&cluster, &commit);
                    self.sandbox.say(format!(
                        "{cluster}: drift exporter: Argo CD applied {} (commit {}); proxies now converge on it",
                        short(&revision),
                        bundles::tag_of(&commit)
                    ));
                }
            }
        }
    }

    /// Carries each site's wave-gate progress metric into Prometheus, as the global metrics view
    /// (Thanos) would.
    async fn global_view(&self) {
        let at = now_ms();
        for site in &self.sites {
            let mut series = Vec::new();
            let Some(port) = self
                .sandbox
                .metrics_port(&site.management(), Operator::WaveGate)
            else {
                continue;
            };
            let Some(text) = scrape(port).await else {
                continue;
            };
            for (labels, value) in parse_exposition(&text, WAVE_PASSED_METRIC) {
                // The scrape's own target label: wave-gate trusts this series only from its
                // job (`--wave-passed-job`, the chart's ServiceMonitor job by default).
                let mut s = Series::new(WAVE_PASSED_METRIC).label("job", WAVE_GATE_JOB);
                for (k, v) in labels {
                    s = s.label(k, v);
                }
                series.push(s.sample(at, value));
            }
            // Into the site's management cluster's store: under Thanos each cluster has its own
            // Prometheus, and the other site reads this one through Thanos Query.
            if !series.is_empty() {
                let _ = self
                    .sandbox
                    .metrics()
                    .write_to(&site.management(), &series)
                    .await;
            }
        }
    }
}

/// `GET /metrics` of a local operator over plain HTTP/1.0 (no client library needed); `None` on
/// any failure.
async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), get)
        .await
        .ok()
        .flatten()
}

// ---------------------------------------------------------------------------------------------
// Steps.

fn api_err(action: String, cluster: &str) -> impl FnOnce(kube::Error) -> ScenarioError {
    let cluster = cluster.to_string();
    move |source| ScenarioError::Api {
        action,
        cluster,
        source,
    }
}

fn client(sandbox: &Sandbox, cluster: &str) -> Result<kube::Client, ScenarioError> {
    sandbox
        .client(cluster)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {cluster}")))
}

fn dynamic(
    client: kube::Client,
    namespace: &str,
    (group, version, kind, plural): (&str, &str, &str, &str),
) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client, namespace, &resource)
}

fn gates_api(sandbox: &Sandbox, site: &Site) -> Result<Api<WaveGate>, ScenarioError> {
    Ok(Api::namespaced(
        client(sandbox, &site.management())?,
        ARGOCD_NAMESPACE,
    ))
}

/// The sites of the sandbox's topology, first `count` of them.
fn sites(sandbox: &Sandbox, count: usize) -> Vec<Site> {
    crate::topology::SITES
        .iter()
        .take(count)
        .map(|name| Site {
            name: (*name).to_string(),
            clusters: sandbox
                .clusters()
                .iter()
                .filter(|c| c.spec.site == *name && c.spec.role == crate::topology::Role::Workload)
                .map(|c| c.spec.name.clone())
                .collect(),
        })
        .collect()
}

/// Publishes the route with `timeout` as a signed bundle of the fleet's mesh configuration.
async fn publish(
    sandbox: &Sandbox,
    timeout: &str,
    message: &str,
) -> Result<Published, ScenarioError> {
    let path = format!("{BUNDLE_DIR}/route-{BUNDLE_ROUTE}.yaml");
    let route = bundle_route(timeout);
    let files = [(path.as_str(), route.as_str())];
    let published = bundles::publish_bundle(
        sandbox,
        &Change {
            files: &files,
            message,
            dir: BUNDLE_DIR,
            repository: REPOSITORY,
        },
    )
    .await?;
    sandbox.git().push().map_err(|e| ScenarioError::Bundle {
        step: "git push",
        message: e.to_string(),
    })?;
    sandbox.say(format!(
        "waves: CI published commit {} ({message}) as {} and signed it",
        bundles::tag_of(&published.commit),
        published.reference
    ));
    Ok(published)
}

/// Polls until `check` holds for every site's WaveGate; returns them.
async fn gates_until(
    sandbox: &Sandbox,
    sites: &[Site],
    mut check: impl FnMut(&WaveGate) -> bool,
) -> Result<Vec<WaveGate>, ScenarioError> {
    loop {
        let mut all = Vec::new();
        for site in sites {
            if let Ok(g) = gates_api(sandbox, site)?.get(&site.name).await
                && check(&g)
            {
                all.push(g);
            }
        }
        if all.len() == sites.len() {
            return Ok(all);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The revision each workload cluster's Application reports Synced and Healthy at.
async fn synced(sandbox: &Sandbox, sites: &[Site]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for site in sites {
        let Some(client) = sandbox.client(&site.management()) else {
            continue;
        };
        let apps: Api<Application> = Api::namespaced(client, ARGOCD_NAMESPACE);
        let Ok(list) = apps.list(&ListParams::default()).await else {
            continue;
        };
        for a in list.items {
            if let (Some(cluster), Some(rev)) = (
                a.spec.destination.as_ref().and_then(|d| d.name.clone()),
                a.synced_revision(),
            ) && a.is_synced_at(rev)
                && a.is_healthy()
            {
                out.insert(cluster, rev.to_string());
            }
        }
    }
    out
}

/// The request timeout of the bundle's route in a workload cluster (`None`: no route).
async fn timeout_in(sandbox: &Sandbox, cluster: &str) -> Result<Option<String>, ScenarioError> {
    Ok(route_in(sandbox, cluster)
        .await?
        .and_then(|v| route_timeout(&v).map(str::to_owned)))
}

/// The bundle's route in a workload cluster, as JSON (`None`: no route).
async fn route_in(sandbox: &Sandbox, cluster: &str) -> Result<Option<Value>, ScenarioError> {
    let routes = dynamic(client(sandbox, cluster)?, SHOP, HTTPROUTE);
    Ok(routes
        .get_opt(BUNDLE_ROUTE)
        .await
        .ok()
        .flatten()
        .and_then(|r| serde_json::to_value(r).ok()))
}

/// The common start: both bundles published, each site's ApplicationSet and WaveGate created,
/// and the running bundle synced by Argo CD into every workload cluster of the sites.
async fn set_up(
    platform: &Platform<'_>,
    change_timeout: &str,
    first_soak: &str,
) -> Result<(Published, Published, Vec<WaveGate>), ScenarioError> {
    let sandbox = platform.sandbox;
    let sites = &platform.sites;
    let running = publish(
        sandbox,
        RUNNING_TIMEOUT,
        &format!("mesh: checkout-internal request timeout {RUNNING_TIMEOUT}"),
    )
    .await?;
    let change = publish(
        sandbox,
        change_timeout,
        &format!("mesh: checkout-internal request timeout {change_timeout}"),
    )
    .await?;
    {
        let mut state = platform.lock();
        state
            .commits
            .insert(running.manifest_digest.clone(), running.commit.clone());
        state
            .commits
            .insert(change.manifest_digest.clone(), change.commit.clone());
    }
    let repository = sandbox.registry().repository(REPOSITORY);
    let waves = fleet_waves(sites, first_soak, SOAK);
    for (site, waves) in sites.iter().zip(waves) {
        let mgmt = site.management();
        let c = client(sandbox, &mgmt)?;
        let set: DynamicObject = serde_json::from_value(application_set(site, &repository))
            .map_err(|e| ScenarioError::Missing(format!("a valid ApplicationSet ({e})")))?;
        dynamic(c.clone(), ARGOCD_NAMESPACE, APPLICATION_SET)
            .create(&PostParams::default(), &set)
            .await
            .map_err(api_err(
                format!("creating ApplicationSet {}", site.application_set()),
                &mgmt,
            ))?;
        let gate: WaveGate = serde_json::from_value(wave_gate(site, &repository, &running, waves))
            .map_err(|e| ScenarioError::Missing(format!("a valid WaveGate ({e})")))?;
        let created = gates_api(sandbox, site)?
            .create(&PostParams::default(), &gate)
            .await
            .map_err(api_err(format!("creating WaveGate {}", site.name), &mgmt))?;
        let plan = created
            .spec
            .waves
            .iter()
            .map(|w| {
                let wait = w
                    .wait_for
                    .iter()
                    .map(|x| format!("{} past {}", x.site, x.wave))
                    .collect::<Vec<_>>();
                if wait.is_empty() {
                    format!("{} [{}]", w.name, w.clusters.join(", "))
                } else {
                    format!(
                        "{} [{}] after {}",
                        w.name,
                        w.clusters.join(", "),
                        wait.join(" and ")
                    )
                }
            })
            .collect::<Vec<_>>()
            .join(", then ");
        sandbox.say(format!(
            "{mgmt}: ApplicationSet {} reads WaveGate {} (waves: {plan})",
            site.application_set(),
            site.name
        ));
    }
    let gates = gates_until(sandbox, sites, |g| {
        g.status.as_ref().is_some_and(|s| {
            s.phase == WaveGatePhase::Complete
                && s.current_revision.as_deref() == Some(running.manifest_digest.as_str())
        })
    })
    .await?;
    sandbox.say(format!(
        "waves: both WaveGates adopted {}; Argo CD syncs it everywhere",
        short(&running.manifest_digest)
    ));
    let clusters: Vec<&String> = sites.iter().flat_map(|s| &s.clusters).collect();
    loop {
        let now = synced(sandbox, sites).await;
        if clusters
            .iter()
            .all(|c| now.get(*c) == Some(&running.manifest_digest))
        {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    sandbox.say(format!(
        "waves: every workload cluster ({}) runs {} (route {SHOP}/{BUNDLE_ROUTE}, request timeout {RUNNING_TIMEOUT})",
        clusters
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        short(&running.manifest_digest)
    ));
    Ok((running, change, gates))
}

/// Gives every site's WaveGate the change.
async fn give_change(
    sandbox: &Sandbox,
    sites: &[Site],
    change: &Published,
) -> Result<Instant, ScenarioError> {
    let patch =
        json!({"spec": {"revision": change.manifest_digest, "sourceCommit": change.commit}});
    let given = Instant::now();
    for site in sites {
        gates_api(sandbox, site)?
            .patch(&site.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err(
                format!("giving WaveGate {} the change", site.name),
                &site.management(),
            ))?;
    }
    sandbox.say(format!(
        "waves: WaveGates {} now ask for {} (commit {})",
        sites
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(" and "),
        short(&change.manifest_digest),
        bundles::tag_of(&change.commit)
    ));
    Ok(given)
}

/// A plain-words line for a wave that changed state.
fn narrate_wave(gate: &WaveGate, i: usize) -> Option<String> {
    let s = gate.status.as_ref()?;
    let w = s.waves.get(i)?;
    let clusters = gate.spec.waves.get(i)?.clusters.join(", ");
    let site = &gate.spec.site;
    let readings = || {
        w.gates
            .iter()
            .map(|g| {
                format!(
                    "{} {:?} ({})",
                    g.gate,
                    g.verdict,
                    g.value.map_or("no data".to_string(), |v| format!("{v:.3}"))
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(match w.state {
        WaveState::Waiting => format!(
            "{site}: wave {} waits: {}",
            w.name,
            w.waiting_for.as_deref().unwrap_or("for another site")
        ),
        WaveState::Converging => format!(
            "{site}: wave {} admitted: {clusters} at {}; Argo CD syncs, proxies must acknowledge",
            w.name,
            short(w.revision.as_deref().unwrap_or_default())
        ),
        WaveState::Soaking => format!(
            "{site}: wave {} converged ({clusters} Synced, Healthy, {} proxies behind); soaking with gates green",
            w.name,
            w.proxies_behind.unwrap_or_default()
        ),
        WaveState::Passed => format!("{site}: wave {} passed: {}", w.name, readings()),
        WaveState::Failed => format!("{site}: wave {} failed: {}", w.name, readings()),
        WaveState::Reverted => format!(
            "{site}: wave {} pinned back to {}",
            w.name,
            short(s.previous_revision.as_deref().unwrap_or_default())
        ),
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// waves-clean

async fn run_clean(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let platform = Platform {
        sandbox,
        sites: sites(sandbox, 2),
        state: Mutex::default(),
    };
    tokio::select! {
        result = clean(&platform) => result,
        () = platform.run() => Err(ScenarioError::Missing("a platform that keeps running".into())),
    }
}

async fn clean(platform: &Platform<'_>) -> Result<Outcome, ScenarioError> {
    let sandbox = platform.sandbox;
    let sites = &platform.sites;
    let (_, change, gates) = set_up(platform, CLEAN_TIMEOUT, SOAK).await?;
    let waits = waits_of(&gates);
    let given = give_change(sandbox, sites, &change).await?;

    // Watch every wave of both sites until both complete (or one halts).
    let mut seen: Vec<WaveSeen> = gates
        .iter()
        .flat_map(|g| {
            g.spec.waves.iter().map(|w| WaveSeen {
                site: g.spec.site.clone(),
                wave: w.name.clone(),
                admitted: None,
                passed: None,
                state: None,
            })
        })
        .collect();
    let mut order = Vec::new();
    // Each round stamps what it saw with the instant it began. The sites are read one after the
    // other, and a wave of one may wait for a wave of the other: read apart, the wave that
    // waited could be seen admitted in the same round that first sees what it waited for passed,
    // but at an earlier instant. Stamped with the round, the two are seen together, in order.
    let finals = loop {
        let mut finals = Vec::new();
        let round = given.elapsed();
        for site in sites {
            let Ok(g) = gates_api(sandbox, site)?.get(&site.name).await else {
                continue;
            };
            let Some(status) = g.status.as_ref() else {
                continue;
            };
            if status.current_revision.as_deref() != Some(change.manifest_digest.as_str()) {
                continue;
            }
            for (i, w) in status.waves.iter().enumerate() {
                let Some(rec) = seen
                    .iter_mut()
                    .find(|r| r.site == site.name && r.wave == w.name)
                else {
                    continue;
                };
                let at = round;
                if rec.state != Some(w.state) {
                    rec.state = Some(w.state);
                    if let Some(line) = narrate_wave(&g, i) {
                        sandbox.say(line);
                    }
                }
                if matches!(
                    w.state,
                    WaveState::Converging | WaveState::Soaking | WaveState::Passed
                ) && rec.admitted.is_none()
                {
                    rec.admitted = Some(at);
                }
                if w.state == WaveState::Passed && rec.passed.is_none() {
                    rec.passed = Some(at);
                    order.push(format!("{}/{}", site.name, w.name));
                }
            }
            if matches!(
                status.phase,
                WaveGatePhase::Complete | WaveGatePhase::Halted | WaveGatePhase::Refused
            ) {
                finals.push(g);
            }
        }
        if finals.len() == sites.len() {
            break finals;
        }
        tokio::time::sleep(POLL).await;
    };
    let total = given.elapsed();

    let now = synced(sandbox, sites).await;
    let mut problems = order_problems(&seen, &waits);
    for g in &finals {
        let phase = g.status.as_ref().map(|s| s.phase);
        if phase != Some(WaveGatePhase::Complete) {
            problems.push(format!("WaveGate {} ended {phase:?}", g.spec.site));
        }
    }
    for site in sites {
        for c in &site.clusters {
            if now.get(c) != Some(&change.manifest_digest) {
                problems.push(format!(
                    "{c}'s Application is not Synced and Healthy at the change"
                ));
            }
            let t = timeout_in(sandbox, c).await?;
            if t.as_deref() != Some(CLEAN_TIMEOUT) {
                problems.push(format!(
                    "{c}'s route has request timeout {t:?}, not the change's {CLEAN_TIMEOUT}"
                ));
            }
        }
        let pins: Api<BundlePin> =
            Api::namespaced(client(sandbox, &site.management())?, ARGOCD_NAMESPACE);
        let count = pins
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or_default();
        if count > 0 {
            problems.push(format!("{count} BundlePins in {}", site.management()));
        }
    }
    let pass = problems.is_empty();
    let summary = if pass {
        format!(
            "{} crossed every wave of east and west in the fleet order ({}) in {:.1} s",
            short(&change.manifest_digest),
            order.join(", "),
            total.as_secs_f64()
        )
    } else {
        problems.join("; ")
    };
    sandbox.say(format!("waves-clean: {summary}"));
    let mut figures = Map::new();
    for w in &seen {
        if let (Some(a), Some(p)) = (w.admitted, w.passed) {
            figures.insert(
                format!("{}_{}_ms", w.site, w.wave.replace('-', "_")),
                Value::from(ms(p.saturating_sub(a))),
            );
        }
    }
    figures.insert("total_ms".into(), Value::from(ms(total)));
    figures.insert("wave_order".into(), Value::from(order.join(",")));
    figures.insert("soak".into(), Value::from(SOAK));
    figures.insert(
        "revision".into(),
        Value::from(change.manifest_digest.clone()),
    );
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

// ---------------------------------------------------------------------------------------------
// waves-breach

async fn run_breach(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let platform = Platform {
        sandbox,
        sites: sites(sandbox, 1),
        state: Mutex::default(),
    };
    tokio::select! {
        result = breach(&platform) => result,
        () = platform.run() => Err(ScenarioError::Missing("a platform that keeps running".into())),
    }
}

/// What the breach watch saw, since the fault.
#[derive(Debug, Default, Clone)]
struct BreachSeen {
    fail: Option<Duration>,
    pin: Option<Duration>,
    reverted: Option<Duration>,
    pinned: Option<Duration>,
}

/// Every BundlePin of a namespace as a watch saw it: the names seen, and the version in which
/// each was first seen Released. Stops watching when dropped.
struct PinLog {
    seen: Arc<Mutex<PinsSeen>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct PinsSeen {
    names: Vec<String>,
    released: BTreeMap<String, BundlePin>,
}

impl PinLog {
    fn watch(pins: Api<BundlePin>) -> Self {
        let seen = Arc::new(Mutex::new(PinsSeen::default()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(pins, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(pin) = event else { continue };
                let name = pin.name_any();
                let mut seen = log.lock().unwrap_or_else(|e| e.into_inner());
                if !seen.names.contains(&name) {
                    seen.names.push(name.clone());
                }
                if pin
                    .status
                    .as_ref()
                    .is_some_and(|s| s.phase == BundlePinPhase::Released)
                {
                    seen.released.entry(name).or_insert(pin);
                }
            }
        });
        Self { seen, task }
    }

    /// Every pin seen, as it was when Released, once each has been; `None` before.
    fn all_released(&self) -> Option<Vec<BundlePin>> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let all =
            !seen.names.is_empty() && seen.names.iter().all(|n| seen.released.contains_key(n));
        all.then(|| seen.released.values().cloned().collect())
    }
}

impl Drop for PinLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn breach(platform: &Platform<'_>) -> Result<Outcome, ScenarioError> {
    let sandbox = platform.sandbox;
    let sites = &platform.sites;
    let site = sites
        .first()
        .ok_or_else(|| ScenarioError::Missing("a site".into()))?;
    let mgmt = site.management();
    let (running, change, _) = set_up(platform, BREACH_TIMEOUT, BREACH_SOAK).await?;
    give_change(sandbox, sites, &change).await?;
    let gates = gates_api(sandbox, site)?;
    let mut last = None;
    loop {
        if let Ok(g) = gates.get(&site.name).await {
            let state = g.status.as_ref().and_then(|s| {
                (s.current_revision.as_deref() == Some(change.manifest_digest.as_str()))
                    .then(|| s.waves.first().map(|w| w.state))
                    .flatten()
            });
            if state != last {
                last = state;
                if let Some(line) = narrate_wave(&g, 0) {
                    sandbox.say(line);
                }
            }
            if state == Some(WaveState::Soaking) {
                break;
            }
        }
        tokio::time::sleep(POLL).await;
    }

    // The fault, from a known instant.
    let mesh = sandbox
        .world(CANARY_CLUSTER)
        .and_then(|w| w.mesh())
        .ok_or_else(|| ScenarioError::Missing(format!("simulated mesh in {CANARY_CLUSTER}")))?;
    sandbox.say(format!(
        "{CANARY_CLUSTER}: the change's {BREACH_TIMEOUT} request timeout is too short: the mesh now times out {:.0}% of its requests (Envoy flag UT)",
        MESH_FAILURE_RATIO * 100.0
    ));
    mesh.apply_now(MeshEvent {
        cluster: Some(CANARY_CLUSTER.into()),
        mesh_failure_ratio: Some(MESH_FAILURE_RATIO),
        mesh_failure_flag: Some(ResponseFlag::UT),
        ..Default::default()
    });
    let pins: Api<BundlePin> = Api::namespaced(client(sandbox, &mgmt)?, ARGOCD_NAMESPACE);
    // wave-gate deletes the pins it created moments after revert releases them: only a watch
    // started before the fault sees each one Released.
    let pin_log = PinLog::watch(pins.clone());
    let fault = Instant::now();

    // Watch the verdict, the pin and the route in the canary cluster closely. Each round reads
    // them against their causal order (the route, written by revert from the pin; the pins,
    // created by wave-gate once its status says Fail; then the WaveGate) and stamps what it
    // saw with the instant it began: whatever a round sees, it also sees everything that had to
    // come before it, so the figures keep that order however slowly a round runs. A round whose
    // pins or WaveGate read failed records nothing (a failed route read sees no route).
    let mut seen = BreachSeen::default();
    let mut reverted_by = Vec::new();
    while seen.fail.is_none()
        || seen.pin.is_none()
        || seen.reverted.is_none()
        || seen.pinned.is_none()
    {
        let round = fault.elapsed();
        let route = route_in(sandbox, CANARY_CLUSTER).await?;
        let read = async {
            let list = pins.list(&ListParams::default()).await.ok()?;
            let gate = gates.get(&site.name).await.ok()?;
            Some((list.items, gate))
        };
        if let Some((listed, gate)) = read.await {
            if seen.fail.is_none() && failed_in(&gate, 0) {
                seen.fail = Some(round);
                if let Some(line) = narrate_wave(&gate, 0) {
                    sandbox.say(line);
                }
            }
            if seen.pin.is_none() && !listed.is_empty() {
                seen.pin = Some(round);
                sandbox.say(format!(
                    "{mgmt}: wave-gate created a BundlePin of {}",
                    short(&running.manifest_digest)
                ));
            }
            if seen.pinned.is_none() && !listed.is_empty() && listed.iter().all(applied) {
                seen.pinned = Some(round);
                sandbox.say(format!(
                    "{mgmt}: revert verified the signature and applied the pinned bundle to {CANARY_CLUSTER}"
                ));
            }
            if seen.reverted.is_none()
                && let Some(route) = route
                && route_timeout(&route) == Some(RUNNING_TIMEOUT)
            {
                seen.reverted = Some(round);
                reverted_by = rules_managers(&route);
                sandbox.say(format!(
                    "{CANARY_CLUSTER}: the previous bundle's route is back (request timeout {RUNNING_TIMEOUT}), written by {}",
                    reverted_by.join(", ")
                ));
            }
        }
        tokio::time::sleep(FAST_POLL).await;
    }

    // The mesh recovers with the previous config.
    mesh.apply_now(MeshEvent {
        cluster: Some(CANARY_CLUSTER.into()),
        mesh_failure_ratio: Some(0.0),
        ..Default::default()
    });
    let halted = loop {
        let g = gates.get(&site.name).await.ok();
        if let Some(g) = g
            && g.status
                .as_ref()
                .and_then(|s| s.halt.as_ref())
                .is_some_and(|h| h.pinned_at.is_some())
        {
            break g;
        }
        tokio::time::sleep(POLL).await;
    };
    sandbox.say(format!(
        "{}: halted and pinned back; decisions: {}",
        site.name,
        halted
            .status
            .as_ref()
            .map(|s| s
                .decisions
                .iter()
                .map(|d| format!("{}={}", d.cluster_name, short(&d.revision)))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    ));
    // revert releases the pin once Argo CD reports the previous revision again.
    let released = loop {
        if let Some(released) = pin_log.all_released() {
            break released;
        }
        tokio::time::sleep(POLL).await;
    };
    let released_at = fault.elapsed();
    sandbox.say(format!(
        "{mgmt}: revert released the pin: Argo CD reports {CANARY_CLUSTER} Synced at {} again",
        short(&running.manifest_digest)
    ));
    let now = synced(sandbox, sites).await;
    let east_rest = site.clusters.get(1).cloned().unwrap_or_default();
    let rest_timeout = timeout_in(sandbox, &east_rest).await?;

    let status = halted.status.clone().unwrap_or_default();
    let halt = status.halt.clone();
    let mut problems = Vec::new();
    let gate = halt.as_ref().and_then(|h| h.gate.clone());
    match &halt {
        Some(h) if h.reason == HaltReason::GateFailed && h.wave == first_wave_name(0) => {}
        other => problems.push(format!(
            "the change did not halt on a gate in wave {}: {other:?}",
            first_wave_name(0)
        )),
    }
    if gate.as_ref().map(|g| g.gate.as_str()) != Some("mesh-error-ratio") {
        problems.push(format!(
            "the failing gate was {:?}, not mesh-error-ratio",
            gate.as_ref().map(|g| &g.gate)
        ));
    }
    if status
        .waves
        .iter()
        .skip(1)
        .any(|w| w.state != WaveState::Pending)
    {
        problems.push("a later wave was admitted after the breach".into());
    }
    let targets: Vec<String> = released
        .iter()
        .flat_map(|p| p.spec.targets.iter().map(|t| t.name.clone()))
        .collect();
    if targets != [format!("mesh-{CANARY_CLUSTER}")] {
        problems.push(format!(
            "pins target {targets:?}, not the canary cluster's Application alone"
        ));
    }
    if released
        .iter()
        .any(|p| p.spec.bundle.digest != running.manifest_digest)
    {
        problems.push("a pin names another bundle than the previous one".into());
    }
    if status
        .decisions
        .iter()
        .any(|d| d.revision != running.manifest_digest)
    {
        problems.push("decisions were not set back to the previous revision".into());
    }
    if now.get(CANARY_CLUSTER) != Some(&running.manifest_digest) {
        problems.push(format!(
            "Argo CD does not report {CANARY_CLUSTER} Synced at the previous revision"
        ));
    }
    if rest_timeout.as_deref() != Some(RUNNING_TIMEOUT) {
        problems.push(format!(
            "{east_rest}'s route changed ({rest_timeout:?}) although its wave was never admitted"
        ));
    }
    let pass = problems.is_empty();
    let gate_text = gate
        .as_ref()
        .map(|g| {
            format!(
                "{} at {:.3} (threshold {})",
                g.gate,
                g.value.unwrap_or_default(),
                g.threshold.map_or("none".to_string(), |t| format!("{t}"))
            )
        })
        .unwrap_or_default();
    let (fail, pin, reverted, pinned) = (
        seen.fail.unwrap_or_default(),
        seen.pin.unwrap_or_default(),
        seen.reverted.unwrap_or_default(),
        seen.pinned.unwrap_or_default(),
    );
    let summary = if pass {
        format!(
            "halted in wave {} on {gate_text}; BundlePin {} ms after the Fail verdict; the previous bundle back in {CANARY_CLUSTER} {} ms after the fault (written by {}), revert's pin applied {} ms after the fault; {east_rest} never left it; pin released",
            first_wave_name(0),
            ms(pin.saturating_sub(fail)),
            ms(reverted),
            reverted_by.join(", "),
            ms(pinned)
        )
    } else {
        problems.join("; ")
    };
    sandbox.say(format!("waves-breach: {summary}"));
    let mut figures = Map::new();
    figures.insert(
        "halt_to_pin_ms".into(),
        Value::from(ms(pin.saturating_sub(fail))),
    );
    figures.insert("breach_to_reverted_ms".into(), Value::from(ms(reverted)));
    figures.insert("fault_to_fail_ms".into(), Value::from(ms(fail)));
    figures.insert("breach_to_pinned_ms".into(), Value::from(ms(pinned)));
    figures.insert(
        "pin_to_pinned_ms".into(),
        Value::from(ms(pinned.saturating_sub(pin))),
    );
    figures.insert("reverted_by".into(), Value::from(reverted_by.join(",")));
    figures.insert("fault_to_released_ms".into(), Value::from(ms(released_at)));
    figures.insert("watch_poll_ms".into(), Value::from(ms(FAST_POLL)));
    figures.insert(
        "failed_gate".into(),
        gate.as_ref()
            .map_or(Value::Null, |g| Value::from(g.gate.clone())),
    );
    figures.insert(
        "failed_value".into(),
        gate.as_ref()
            .and_then(|g| g.value)
            .map_or(Value::Null, Value::from),
    );
    figures.insert(
        "pins".into(),
        Value::from(
            released
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
                .join(","),
        ),
    );
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, clusters: &[&str]) -> Site {
        Site {
            name: name.into(),
            clusters: clusters.iter().map(|c| (*c).to_string()).collect(),
        }
    }

    fn two_sites() -> Vec<Site> {
        vec![
            site("east", &["east-1", "east-2"]),
            site("west", &["west-1", "west-2"]),
        ]
    }

    #[test]
    fn fleet_order_is_canary_then_one_per_site_then_the_rest() {
        let waves = fleet_waves(&two_sites(), "3s", "2s");
        // (site, wave index, name, clusters, waits)
        let cases = [
            (0, 0, "canary", vec!["east-1"], vec![]),
            (0, 1, "rest", vec!["east-2"], vec![("west", "one-per-site")]),
            (
                1,
                0,
                "one-per-site",
                vec!["west-1"],
                vec![("east", "canary")],
            ),
            (1, 1, "rest", vec!["west-2"], vec![("east", "canary")]),
        ];
        for (s, i, name, clusters, waits) in cases {
            let w = &waves[s][i];
            assert_eq!(w["name"], name, "site {s} wave {i}");
            assert_eq!(w["clusters"], json!(clusters), "site {s} wave {i}");
            let got: Vec<(String, String)> = w["waitFor"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    (
                        x["site"].as_str().unwrap().to_string(),
                        x["wave"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let want: Vec<(String, String)> = waits
                .iter()
                .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
                .collect();
            assert_eq!(got, want, "site {s} wave {i}");
        }
        assert_eq!(waves[0][0]["soak"], "3s");
        assert_eq!(waves[0][1]["soak"], "2s");
        // One site alone: no waits at all.
        let alone = fleet_waves(&[site("east", &["east-1", "east-2"])], "60s", "3s");
        assert_eq!(alone[0][1]["waitFor"], json!([]));
    }

    #[test]
    fn the_created_objects_parse_as_the_api_types() {
        let sites = two_sites();
        let published = Published {
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            tag: "0123456789ab".into(),
            repository: "127.0.0.1:5000/mesh/config".into(),
            reference: "x".into(),
            manifest_digest: format!("sha256:{}", "a".repeat(64)),
            content_digest: format!("sha256:{}", "b".repeat(64)),
        };
        let waves = fleet_waves(&sites, "3s", "3s");
        let g: WaveGate = serde_json::from_value(wave_gate(
            &sites[1],
            "127.0.0.1:5000/mesh/config",
            &published,
            waves[1].clone(),
        ))
        .unwrap();
        assert_eq!(g.spec.site, "west");
        assert_eq!(g.spec.application_set_ref.name, "mesh-west");
        assert_eq!(g.spec.repository, "oci://127.0.0.1:5000/mesh/config");
        assert_eq!(
            g.spec.source_commit.as_deref(),
            Some(published.commit.as_str())
        );
        assert_eq!(g.spec.waves[0].wait_for[0].site, "east");
        assert_eq!(g.spec.effective_gates().len(), 4);
        let set = application_set(&sites[0], "127.0.0.1:5000/mesh/config");
        assert_eq!(
            set["spec"]["generators"][0]["clusterDecisionResource"]["name"],
            "east"
        );
        assert_eq!(
            set["spec"]["syncPolicy"]["applicationsSync"],
            "create-update"
        );
        assert_eq!(
            set["spec"]["syncPolicy"]["preserveResourcesOnDeletion"],
            true
        );
        let typed: sluice_api::external::argocd::ApplicationSet =
            serde_json::from_value(set).unwrap();
        assert!(
            typed.wave_gate_safety().is_empty(),
            "the WaveGate accepts it"
        );
        assert!(
            typed.ignores_sync_policy("mesh-east-1"),
            "revert accepts it"
        );
    }

    #[test]
    fn the_writer_of_the_rules_is_read_from_managed_fields() {
        let entry = |manager: &str, fields: Value| json!({"manager": manager, "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": fields});
        let rules = json!({"f:spec": {"f:rules": {}}});
        let labels = json!({"f:metadata": {"f:labels": {}}});
        // (managed fields, owners of spec.rules)
        let cases = [
            (
                json!([entry("argocd-controller", rules.clone())]),
                vec!["argocd-controller"],
            ),
            (
                json!([
                    entry("argocd-controller", labels),
                    entry("sluice-revert", rules)
                ]),
                vec!["sluice-revert"],
            ),
            (json!([]), vec![]),
            (Value::Null, vec![]),
        ];
        for (managed, want) in cases {
            let route = json!({"metadata": {"managedFields": managed}});
            assert_eq!(rules_managers(&route), want, "{managed}");
        }
    }

    #[test]
    fn the_bundle_route_carries_its_timeout() {
        for t in [RUNNING_TIMEOUT, CLEAN_TIMEOUT, BREACH_TIMEOUT] {
            let v: Value = serde_yaml::from_str(&bundle_route(t)).unwrap();
            assert_eq!(v["kind"], "HTTPRoute");
            assert_eq!(v["metadata"]["namespace"], SHOP);
            assert_eq!(route_timeout(&v), Some(t));
        }
        assert_eq!(route_timeout(&json!({"spec": {"rules": [{}]}})), None);
    }

    #[test]
    fn wave_progress_is_read_from_the_exposition() {
        let text = "# HELP sluice_wavegate_wave_passed Waves passed.\n\
                    # TYPE sluice_wavegate_wave_passed gauge\n\
                    sluice_wavegate_wave_passed{site=\"east\",revision=\"sha256:ab\",wave=\"canary\"} 1\n\
                    sluice_wavegate_wave_passed{site=\"we\\\"st\",wave=\"rest\"} 0\n\
                    sluice_wavegate_wave_passed_total 3\n\
                    sluice_wavegate_current_wave{site=\"east\"} 1\n\
                    sluice_wavegate_wave_passed 2\n\
                    sluice_wavegate_wave_passed{broken 1\n";
        let got = parse_exposition(text, WAVE_PASSED_METRIC);
        let want = vec![
            (
                vec![
                    ("site".to_string(), "east".to_string()),
                    ("revision".to_string(), "sha256:ab".to_string()),
                    ("wave".to_string(), "canary".to_string()),
                ],
                1.0,
            ),
            (
                vec![
                    ("site".to_string(), "we\"st".to_string()),
                    ("wave".to_string(), "rest".to_string()),
                ],
                0.0,
            ),
            (vec![], 2.0),
        ];
        assert_eq!(got, want);
    }

    fn seen(site: &str, wave: &str, admitted: Option<u64>, passed: Option<u64>) -> WaveSeen {
        WaveSeen {
            site: site.into(),
            wave: wave.into(),
            admitted: admitted.map(Duration::from_secs),
            passed: passed.map(Duration::from_secs),
            state: None,
        }
    }

    #[test]
    fn fleet_order_is_judged_from_what_was_watched() {
        let waits: BTreeMap<(String, String), Vec<(String, String)>> = [
            (("east", "rest"), vec![("west", "one-per-site")]),
            (("west", "one-per-site"), vec![("east", "canary")]),
        ]
        .into_iter()
        .map(|((s, w), v)| {
            (
                (s.to_string(), w.to_string()),
                v.into_iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
            )
        })
        .collect();
        let good = vec![
            seen("east", "canary", Some(0), Some(10)),
            seen("east", "rest", Some(20), Some(30)),
            seen("west", "one-per-site", Some(10), Some(20)),
            seen("west", "rest", Some(20), Some(30)),
        ];
        // (name, what was seen, problems expected)
        let cases = [
            ("in order", good.clone(), 0),
            (
                "west before the canary passed",
                {
                    let mut s = good.clone();
                    s[2].admitted = Some(Duration::from_secs(5));
                    s
                },
                1,
            ),
            (
                "east rest before west's first wave",
                {
                    let mut s = good.clone();
                    s[1].admitted = Some(Duration::from_secs(15));
                    s
                },
                1,
            ),
            (
                "west rest before west's first passed",
                {
                    let mut s = good.clone();
                    s[3].admitted = Some(Duration::from_secs(12));
                    s
                },
                1,
            ),
            (
                "a wave never passed",
                {
                    let mut s = good.clone();
                    s[3].passed = None;
                    s
                },
                1,
            ),
            (
                "a wave never admitted",
                {
                    let mut s = good;
                    s[3].admitted = None;
                    s[3].passed = None;
                    s
                },
                1,
            ),
        ];
        for (name, s, want) in cases {
            let problems = order_problems(&s, &waits);
            assert_eq!(problems.len(), want, "{name}: {problems:?}");
        }
    }

    #[test]
    fn a_fail_verdict_or_a_halt_counts_as_failed() {
        let gate = |status: Value| -> WaveGate {
            serde_json::from_value(json!({
                "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
                "metadata": {"name": "east", "namespace": "argocd"},
                "spec": {
                    "site": "east", "applicationSetRef": {"name": "mesh-east"},
                    "repository": "oci://r/m", "revision": format!("sha256:{}", "a".repeat(64)),
                    "waves": [{"name": "canary", "clusters": ["east-1"]}],
                    "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "k"}},
                },
                "status": status,
            }))
            .unwrap()
        };
        let verdict = |v: &str| json!({"gate": "mesh-error-ratio", "verdict": v, "reason": "ThresholdMet", "evaluatedAt": "2026-01-01T00:00:00Z", "consecutiveFailures": 0});
        let wave = |v: &str| json!({"phase": "Soaking", "waves": [{"name": "canary", "state": "Soaking", "gates": [verdict(v)]}]});
        let cases = [
            (json!({"phase": "Soaking"}), false),
            (wave("Pass"), false),
            (wave("Inconclusive"), false),
            (wave("Fail"), true),
        ];
        for (status, want) in cases {
            assert_eq!(failed_in(&gate(status.clone()), 0), want, "{status}");
        }
    }
}
