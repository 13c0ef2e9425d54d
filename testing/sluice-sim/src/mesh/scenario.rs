//! Scenario data files: the services, versions, traffic, faults and control-plane signals a
//! simulated mesh produces, and how they change over time (`scenarios/*.yaml`). Owns the file
//! format, its validation and the pure evaluation "what holds at time t"; never reads a clock or
//! the API (the telemetry loop passes the elapsed time in).
//!
//! The first version listed for a service is its **stable** version: factors such as
//! `error_ratio_factor: 2.3` are taken relative to it ("v2.14 returns 5xx at 2.3× stable").

use crate::duration::serde_human;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// A whole scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Scenario name (the file name without `.yaml` by convention).
    pub name: String,
    /// What the scenario shows, in one sentence.
    #[serde(default)]
    pub description: String,
    /// How long a route change takes to reach the proxies: a weight written at t is what
    /// traffic follows from t + delay. Default 2 s.
    #[serde(default = "default_delay", with = "serde_human")]
    pub propagation_delay: Duration,
    /// Control-plane signals per cluster (xDS pushes and rejections, drift).
    #[serde(default)]
    pub clusters: Vec<ClusterScenario>,
    /// Simulated services.
    pub services: Vec<ServiceScenario>,
    /// Changes over time, applied in order of `at`.
    #[serde(default)]
    pub events: Vec<Event>,
}

fn default_delay() -> Duration {
    Duration::from_secs(2)
}

/// Control-plane behaviour of one cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterScenario {
    /// Cluster name (the `cluster` label).
    pub name: String,
    /// xDS pushes per second (`pilot_xds_pushes`). Default 1.
    #[serde(default = "one")]
    pub xds_pushes_per_second: f64,
    /// xDS rejections (NACKs) per second (`pilot_total_xds_rejects`). Default 0.
    #[serde(default)]
    pub xds_rejects_per_second: f64,
    /// How proxies converge on a newly applied config revision (drift metrics).
    #[serde(default)]
    pub drift: Drift,
    /// Share (0..1) of the requests the cluster's sources send that the mesh itself fails
    /// (the destination never sees them). Absent: no mesh-failure series at all; `0`: the
    /// series exist at zero from the start, so a later fault is measured from its first tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh_failure_ratio: Option<f64>,
    /// The Envoy response flag (and so the response code) of those failures. Default `UF`.
    #[serde(default)]
    pub mesh_failure_flag: ResponseFlag,
    /// Whether those failures carry `failure_origin="mesh"` (a platform that attributes
    /// failures, seed ADR-30); false: only the response flag tells them apart. Default true.
    #[serde(default = "yes")]
    pub mesh_failure_origin: bool,
}

fn yes() -> bool {
    true
}

/// `failure_origin` of requests the mesh failed.
pub const FAILURE_ORIGIN_MESH: &str = "mesh";

/// An Envoy response flag a mesh-caused failure carries (`response_flags`), with the response
/// code Envoy returns with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseFlag {
    /// Upstream connection failure (503).
    #[default]
    UF,
    /// Upstream retry limit (or maximum connect attempts) reached (503).
    URX,
    /// No healthy upstream host (503).
    UH,
    /// Upstream overflow: circuit breaking (503).
    UO,
    /// Upstream request timeout (504).
    UT,
    /// No route configured for the request (404).
    NR,
}

impl ResponseFlag {
    /// The `response_flags` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseFlag::UF => "UF",
            ResponseFlag::URX => "URX",
            ResponseFlag::UH => "UH",
            ResponseFlag::UO => "UO",
            ResponseFlag::UT => "UT",
            ResponseFlag::NR => "NR",
        }
    }

    /// The response code Envoy returns with the flag.
    pub fn response_code(self) -> u16 {
        match self {
            ResponseFlag::UT => 504,
            ResponseFlag::NR => 404,
            ResponseFlag::UF | ResponseFlag::URX | ResponseFlag::UH | ResponseFlag::UO => 503,
        }
    }
}

/// Mesh-caused failures in one cluster at one time (see [`ClusterScenario::mesh_failure_ratio`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeshFailure {
    /// Share of the sources' requests that fail (0..1).
    pub ratio: f64,
    /// Their response flag.
    pub flag: ResponseFlag,
    /// Whether they carry `failure_origin="mesh"`.
    pub origin: bool,
}

impl ClusterScenario {
    /// The cluster's mesh failures, if its failure series exist.
    pub fn mesh_failure(&self) -> Option<MeshFailure> {
        self.mesh_failure_ratio.map(|ratio| MeshFailure {
            ratio,
            flag: self.mesh_failure_flag,
            origin: self.mesh_failure_origin,
        })
    }
}

fn one() -> f64 {
    1.0
}

/// Drift of proxies behind the newest applied config commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drift {
    /// The config commit in force at t=0 (all proxies on it). Empty: no drift series until a
    /// commit is applied at run time.
    #[serde(default)]
    pub commit: String,
    /// Time for all proxies (but `stuck`) to pick up a new commit, linearly. Default 5 s.
    #[serde(default = "default_convergence", with = "serde_human")]
    pub convergence: Duration,
    /// Proxies that never pick up a new commit. Default 0.
    #[serde(default)]
    pub stuck: u32,
    /// Proxies in the cluster; absent: the injected pods the simulator sees.
    #[serde(default)]
    pub proxies: Option<u32>,
}

fn default_convergence() -> Duration {
    Duration::from_secs(5)
}

impl Default for Drift {
    fn default() -> Self {
        Self {
            commit: String::new(),
            convergence: default_convergence(),
            stuck: 0,
            proxies: None,
        }
    }
}

/// One simulated service: its route, traffic and versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceScenario {
    /// Logical service name (e.g. `checkout`).
    pub name: String,
    /// Namespace of the route and backend Services.
    pub namespace: String,
    /// Cluster the service runs in. Default: the first cluster given to the world.
    #[serde(default)]
    pub cluster: Option<String>,
    /// What the service speaks: `http` (the default) or `grpc`. A gRPC service is routed by a
    /// GRPCRoute and reports as Istio does for gRPC (see [`Protocol`]).
    #[serde(default)]
    pub protocol: Protocol,
    /// HTTPRoute (a GRPCRoute for a gRPC service; in `namespace`) whose stored rules split the
    /// traffic. Absent: all traffic goes to the first version.
    #[serde(default)]
    pub route: Option<String>,
    /// `source_workload` of the source reporter (the gateway or client). Default
    /// `istio-ingressgateway`.
    #[serde(default = "default_source")]
    pub source_workload: String,
    /// `source_workload_namespace` of the source reporter: the namespace the gateway or client
    /// runs in. Default `istio-system`.
    #[serde(default = "default_source_namespace")]
    pub source_namespace: String,
    /// Requests per second arriving at the route.
    pub requests_per_second: f64,
    /// Request path (matched against path matches). Default `/`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Further request paths, each with its share of the requests; `path` takes the rest. For a
    /// gRPC service, the calls of its other methods (`/<service>/<method>`). Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_paths: Vec<PathShare>,
    /// Share of requests that are idempotent (GET); method matches see the rest as POST.
    /// Default 0.8.
    #[serde(default = "default_idempotent")]
    pub idempotent_share: f64,
    /// Requests carrying a cohort header.
    #[serde(default)]
    pub cohort: Option<Cohort>,
    /// Versions; the first is stable.
    pub versions: Vec<VersionScenario>,
}

/// A request path and its share of a service's requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathShare {
    /// Request path.
    pub path: String,
    /// Share of the service's requests (0..1).
    pub share: f64,
}

impl ServiceScenario {
    /// Every request path with its share of the requests: `path` with what [`Self::other_paths`]
    /// leaves, then each of those.
    pub fn path_shares(&self) -> Vec<(&str, f64)> {
        let others: f64 = self.other_paths.iter().map(|p| p.share).sum();
        std::iter::once((self.path.as_str(), (1.0 - others).max(0.0)))
            .chain(self.other_paths.iter().map(|p| (p.path.as_str(), p.share)))
            .collect()
    }
}

fn default_source() -> String {
    "istio-ingressgateway".to_string()
}
fn default_source_namespace() -> String {
    "istio-system".to_string()
}
fn default_path() -> String {
    "/".to_string()
}
fn default_idempotent() -> f64 {
    0.8
}

/// The protocol a service speaks, which decides how its answers are reported.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP: an error is a 500 (`response_code`), no `request_protocol` or
    /// `grpc_response_status` label.
    #[default]
    Http,
    /// gRPC: `request_protocol="grpc"`; every answer the application gives is HTTP 200 with its
    /// status in `grpc_response_status` (0 OK, an error 14 UNAVAILABLE), and a failure the mesh
    /// answers itself keeps its HTTP code with the gRPC status Envoy derives from it (istio/proxy
    /// `source/extensions/filters/http/istio_stats/istio_stats.cc`, `IstioStatsFilter::log`).
    Grpc,
}

impl Protocol {
    /// The `request_protocol` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// gRPC status OK.
pub const GRPC_OK: u8 = 0;
/// gRPC status UNAVAILABLE: what a failing gRPC version answers.
pub const GRPC_UNAVAILABLE: u8 = 14;

/// The gRPC status Envoy reports for an HTTP status without a `grpc-status` (Envoy's
/// `Grpc::Utility::httpToGrpcStatus`): what a gRPC request the mesh failed carries.
pub fn grpc_status_of_http(code: u16) -> u8 {
    match code {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => GRPC_UNAVAILABLE,
        _ => 2,
    }
}

/// A cohort header some requests carry (e.g. `x-cohort: staff`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cohort {
    /// Header name (matched case-insensitively).
    pub header: String,
    /// Header value.
    pub value: String,
    /// Share of requests carrying it (0..1).
    pub share: f64,
}

/// One version of a service, served by its own backend Service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionScenario {
    /// `destination_version` (e.g. `v2.14`).
    pub name: String,
    /// Backend Service name in the route's `backendRefs` (`destination_service_name`).
    pub backend: String,
    /// `destination_workload`. Default: the backend name.
    #[serde(default)]
    pub workload: Option<String>,
    /// Share of responses that are errors (0..1): 5xx for HTTP, UNAVAILABLE on HTTP 200 for gRPC.
    /// Default 0.
    #[serde(default)]
    pub error_ratio: f64,
    /// Median latency in ms. Default 20.
    #[serde(default = "default_p50")]
    pub p50_ms: f64,
    /// 99th percentile latency in ms. Default 100.
    #[serde(default = "default_p99")]
    pub p99_ms: f64,
    /// Distortion of the applied share: this backend's stored weight is multiplied by the
    /// factor before traffic is split (1 = faithful). Default 1.
    #[serde(default = "one")]
    pub weight_factor: f64,
}

fn default_p50() -> f64 {
    20.0
}
fn default_p99() -> f64 {
    100.0
}

/// A change from time `at` on. `service` (and `version`) select what it changes; `cluster`
/// selects cluster signals. Every field left out keeps its value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// Time since the world started.
    #[serde(with = "serde_human")]
    pub at: Duration,
    /// Service name the change applies to.
    #[serde(default)]
    pub service: Option<String>,
    /// Version name within the service (error and latency fields need one).
    #[serde(default)]
    pub version: Option<String>,
    /// Cluster the xDS fields apply to.
    #[serde(default)]
    pub cluster: Option<String>,
    /// New request rate of the service.
    #[serde(default)]
    pub requests_per_second: Option<f64>,
    /// New absolute error ratio of the version.
    #[serde(default)]
    pub error_ratio: Option<f64>,
    /// Error ratio as a multiple of the stable version's (at the same time).
    #[serde(default)]
    pub error_ratio_factor: Option<f64>,
    /// New p50 latency (ms) of the version.
    #[serde(default)]
    pub p50_ms: Option<f64>,
    /// New p99 latency (ms) of the version.
    #[serde(default)]
    pub p99_ms: Option<f64>,
    /// Latency (p50 and p99) as a multiple of the stable version's.
    #[serde(default)]
    pub latency_factor: Option<f64>,
    /// New weight distortion factor of the version.
    #[serde(default)]
    pub weight_factor: Option<f64>,
    /// New xDS rejection rate of the cluster.
    #[serde(default)]
    pub xds_rejects_per_second: Option<f64>,
    /// New count of proxies stuck behind in the cluster.
    #[serde(default)]
    pub drift_stuck: Option<u32>,
    /// New share of the cluster's requests the mesh fails (a fault: `0` ends it).
    #[serde(default)]
    pub mesh_failure_ratio: Option<f64>,
    /// New response flag of the cluster's mesh failures.
    #[serde(default)]
    pub mesh_failure_flag: Option<ResponseFlag>,
}

/// A scenario that cannot be used.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("reading scenario {path}: {source}")]
    #[strum(serialize = "ScenarioUnreadable")]
    Read {
        /// File path.
        path: String,
        /// IO error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or has unknown fields.
    #[error("parsing scenario {origin}: {source}; see scenarios/README.md for the format")]
    #[strum(serialize = "ScenarioMalformed")]
    Parse {
        /// File path or `<inline>`.
        origin: String,
        /// YAML error (with line and column).
        #[source]
        source: serde_yaml::Error,
    },
    /// The scenario is well-formed but inconsistent.
    #[error("scenario {name}: {reason}")]
    #[strum(serialize = "ScenarioInvalid")]
    Invalid {
        /// Scenario name.
        name: String,
        /// What is wrong and where.
        reason: String,
    },
}

impl ScenarioError {
    /// Bounded error category for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

impl Scenario {
    /// Parses and validates a scenario from YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, ScenarioError> {
        Self::parse(text, "<inline>")
    }

    /// Reads, parses and validates a scenario file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ScenarioError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The scenarios shipped in the repository's `scenarios/` directory.
    pub fn shipped_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
    }

    /// Loads a shipped scenario by name (`scenarios/<name>.yaml`).
    pub fn shipped(name: &str) -> Result<Self, ScenarioError> {
        Self::from_file(Self::shipped_dir().join(format!("{name}.yaml")))
    }

    fn parse(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = serde_yaml::from_str(text).map_err(|source| ScenarioError::Parse {
            origin: origin.to_string(),
            source,
        })?;
        s.validate()?;
        Ok(s)
    }

    /// Checks references and ranges; every problem names the field.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |reason: String| ScenarioError::Invalid {
            name: self.name.clone(),
            reason,
        };
        let ratio = |v: f64| (0.0..=1.0).contains(&v);
        for s in &self.services {
            let at = format!("services[{}]", s.name);
            if s.versions.is_empty() {
                return Err(bad(format!(
                    "{at}.versions is empty; list at least the stable version"
                )));
            }
            if !(s.requests_per_second >= 0.0 && s.requests_per_second.is_finite()) {
                return Err(bad(format!(
                    "{at}.requests_per_second must be a non-negative number"
                )));
            }
            if !ratio(s.idempotent_share) {
                return Err(bad(format!("{at}.idempotent_share must be within 0..1")));
            }
            if let Some(c) = &s.cohort
                && !ratio(c.share)
            {
                return Err(bad(format!("{at}.cohort.share must be within 0..1")));
            }
            for p in &s.other_paths {
                if !p.path.starts_with('/') || !ratio(p.share) {
                    return Err(bad(format!(
                        "{at}.other_paths[{}]: need a path starting with / and a share within 0..1",
                        p.path
                    )));
                }
            }
            if s.other_paths.iter().map(|p| p.share).sum::<f64>() > 1.0 {
                return Err(bad(format!(
                    "{at}.other_paths: the shares add up to more than 1"
                )));
            }
            for v in &s.versions {
                let at = format!("{at}.versions[{}]", v.name);
                if !ratio(v.error_ratio) {
                    return Err(bad(format!("{at}.error_ratio must be within 0..1")));
                }
                if !(v.p50_ms > 0.0 && v.p99_ms >= v.p50_ms) {
                    return Err(bad(format!("{at}: need 0 < p50_ms <= p99_ms")));
                }
                if v.weight_factor < 0.0 {
                    return Err(bad(format!("{at}.weight_factor must not be negative")));
                }
            }
        }
        for c in &self.clusters {
            if let Some(r) = c.mesh_failure_ratio
                && !ratio(r)
            {
                return Err(bad(format!(
                    "clusters[{}].mesh_failure_ratio must be within 0..1",
                    c.name
                )));
            }
        }
        for (i, e) in self.events.iter().enumerate() {
            let at = format!("events[{i}]");
            if (e.mesh_failure_ratio.is_some() || e.mesh_failure_flag.is_some())
                && e.cluster.is_none()
            {
                return Err(bad(format!(
                    "{at} changes mesh failures but does not name the cluster"
                )));
            }
            if let Some(r) = e.mesh_failure_ratio
                && !ratio(r)
            {
                return Err(bad(format!("{at}.mesh_failure_ratio must be within 0..1")));
            }
            if let Some(name) = &e.service {
                let Some(svc) = self.services.iter().find(|s| &s.name == name) else {
                    return Err(bad(format!(
                        "{at}.service {name:?} is not a listed service"
                    )));
                };
                if let Some(v) = &e.version
                    && !svc.versions.iter().any(|x| &x.name == v)
                {
                    return Err(bad(format!(
                        "{at}.version {v:?} is not a version of {name}"
                    )));
                }
            }
            let version_fields = e.error_ratio.is_some()
                || e.error_ratio_factor.is_some()
                || e.p50_ms.is_some()
                || e.p99_ms.is_some()
                || e.latency_factor.is_some()
                || e.weight_factor.is_some();
            if version_fields && (e.service.is_none() || e.version.is_none()) {
                return Err(bad(format!(
                    "{at} changes a version's behaviour but does not name service and version"
                )));
            }
            if let Some(r) = e.error_ratio
                && !ratio(r)
            {
                return Err(bad(format!("{at}.error_ratio must be within 0..1")));
            }
        }
        Ok(())
    }

    /// What holds at `t` after start: the scenario with every event at or before `t` applied
    /// (file events first in time order, then `extra` run-time events in time order).
    pub fn state_at(&self, t: Duration, extra: &[Event]) -> Scenario {
        let mut state = self.clone();
        let mut events: Vec<&Event> = self.events.iter().chain(extra.iter()).collect();
        events.sort_by_key(|e| e.at);
        for e in events.into_iter().filter(|e| e.at <= t) {
            state.apply(e);
        }
        state.events.clear();
        state
    }

    fn apply(&mut self, e: &Event) {
        if let Some(cluster) = &e.cluster {
            let c = match self.clusters.iter_mut().position(|c| &c.name == cluster) {
                Some(i) => &mut self.clusters[i],
                None => {
                    self.clusters.push(ClusterScenario {
                        name: cluster.clone(),
                        xds_pushes_per_second: 1.0,
                        xds_rejects_per_second: 0.0,
                        drift: Drift::default(),
                        mesh_failure_ratio: None,
                        mesh_failure_flag: ResponseFlag::default(),
                        mesh_failure_origin: true,
                    });
                    self.clusters.last_mut().expect("just pushed")
                }
            };
            if let Some(r) = e.xds_rejects_per_second {
                c.xds_rejects_per_second = r;
            }
            if let Some(s) = e.drift_stuck {
                c.drift.stuck = s;
            }
            if let Some(r) = e.mesh_failure_ratio {
                c.mesh_failure_ratio = Some(r);
            }
            if let Some(f) = e.mesh_failure_flag {
                c.mesh_failure_flag = f;
            }
        }
        let Some(svc) = e
            .service
            .as_ref()
            .and_then(|n| self.services.iter_mut().find(|s| &s.name == n))
        else {
            return;
        };
        if let Some(r) = e.requests_per_second {
            svc.requests_per_second = r;
        }
        let stable = svc.versions[0].clone();
        let Some(v) = e
            .version
            .as_ref()
            .and_then(|n| svc.versions.iter_mut().find(|v| &v.name == n))
        else {
            return;
        };
        if let Some(r) = e.error_ratio {
            v.error_ratio = r;
        }
        if let Some(f) = e.error_ratio_factor {
            v.error_ratio = (stable.error_ratio * f).clamp(0.0, 1.0);
        }
        if let Some(p) = e.p50_ms {
            v.p50_ms = p;
        }
        if let Some(p) = e.p99_ms {
            v.p99_ms = p;
        }
        if let Some(f) = e.latency_factor {
            v.p50_ms = stable.p50_ms * f;
            v.p99_ms = stable.p99_ms * f;
        }
        if let Some(f) = e.weight_factor {
            v.weight_factor = f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = r#"
name: canary-5xx
description: checkout v2.14 returns 5xx at 2.3x stable from t=30s
propagation_delay: 3s
clusters:
  - name: east-1
    xds_rejects_per_second: 0
services:
  - name: checkout
    namespace: shop
    route: checkout
    requests_per_second: 200
    cohort: {header: x-cohort, value: staff, share: 0.05}
    versions:
      - {name: v2.13, backend: checkout-v2-13, error_ratio: 0.01, p50_ms: 20, p99_ms: 80}
      - {name: v2.14, backend: checkout-v2-14, error_ratio: 0.01, p50_ms: 20, p99_ms: 80}
events:
  - {at: 30s, service: checkout, version: v2.14, error_ratio_factor: 2.3}
  - {at: 40s, service: checkout, version: v2.14, latency_factor: 2}
  - {at: 50s, cluster: east-1, xds_rejects_per_second: 4}
"#;

    #[test]
    fn parses_with_defaults() {
        let s = Scenario::from_yaml(CANARY).unwrap();
        assert_eq!(s.propagation_delay, Duration::from_secs(3));
        let svc = &s.services[0];
        assert_eq!(svc.source_workload, "istio-ingressgateway");
        assert_eq!(svc.source_namespace, "istio-system");
        assert_eq!(svc.idempotent_share, 0.8);
        assert_eq!(svc.path_shares(), [("/", 1.0)]);
        assert_eq!(svc.versions[1].weight_factor, 1.0);
        assert_eq!(s.clusters[0].xds_pushes_per_second, 1.0);
    }

    #[test]
    fn state_over_time_table() {
        let s = Scenario::from_yaml(CANARY).unwrap();
        // (t seconds, canary error ratio, canary p99, east-1 rejects/s)
        let cases = [
            (0, 0.01, 80.0, 0.0),
            (29, 0.01, 80.0, 0.0),
            (30, 0.023, 80.0, 0.0),
            (45, 0.023, 160.0, 0.0),
            (60, 0.023, 160.0, 4.0),
        ];
        for (t, err, p99, rejects) in cases {
            let st = s.state_at(Duration::from_secs(t), &[]);
            let v = &st.services[0].versions[1];
            assert!(
                (v.error_ratio - err).abs() < 1e-9,
                "t={t}: error {}",
                v.error_ratio
            );
            assert!((v.p99_ms - p99).abs() < 1e-9, "t={t}: p99 {}", v.p99_ms);
            assert_eq!(st.clusters[0].xds_rejects_per_second, rejects, "t={t}");
            assert_eq!(
                st.services[0].versions[0].error_ratio, 0.01,
                "stable unchanged"
            );
        }
        let extra = [Event {
            at: Duration::from_secs(10),
            service: Some("checkout".into()),
            version: Some("v2.14".into()),
            weight_factor: Some(0.5),
            ..Default::default()
        }];
        let st = s.state_at(Duration::from_secs(11), &extra);
        assert_eq!(st.services[0].versions[1].weight_factor, 0.5);
    }

    #[test]
    fn mesh_failures_over_time_table() {
        let text = r#"
name: mesh-fault
clusters:
  - {name: east-1, mesh_failure_ratio: 0}
  - {name: east-2}
services:
  - name: checkout
    namespace: shop
    requests_per_second: 100
    versions: [{name: v1, backend: checkout-v1}]
events:
  - {at: 10s, cluster: east-1, mesh_failure_ratio: 0.2}
  - {at: 20s, cluster: east-1, mesh_failure_flag: NR}
  - {at: 30s, cluster: east-1, mesh_failure_ratio: 0}
  - {at: 40s, cluster: west-1, mesh_failure_ratio: 0.5, mesh_failure_flag: UT}
"#;
        let s = Scenario::from_yaml(text).unwrap();
        let failure = |st: &Scenario, c: &str| {
            st.clusters
                .iter()
                .find(|x| x.name == c)
                .and_then(ClusterScenario::mesh_failure)
        };
        let f = |ratio: f64, flag: ResponseFlag| {
            Some(MeshFailure {
                ratio,
                flag,
                origin: true,
            })
        };
        // (t seconds, east-1, east-2, west-1)
        let cases = [
            (0, f(0.0, ResponseFlag::UF), None, None),
            (10, f(0.2, ResponseFlag::UF), None, None),
            (20, f(0.2, ResponseFlag::NR), None, None),
            (30, f(0.0, ResponseFlag::NR), None, None),
            (40, f(0.0, ResponseFlag::NR), None, f(0.5, ResponseFlag::UT)),
        ];
        for (t, east1, east2, west1) in cases {
            let st = s.state_at(Duration::from_secs(t), &[]);
            assert_eq!(failure(&st, "east-1"), east1, "t={t} east-1");
            assert_eq!(failure(&st, "east-2"), east2, "t={t} east-2");
            assert_eq!(failure(&st, "west-1"), west1, "t={t} west-1");
        }
        // (flag, label, response code): Envoy's codes for its response flags.
        let flags = [
            (ResponseFlag::UF, "UF", 503),
            (ResponseFlag::URX, "URX", 503),
            (ResponseFlag::UH, "UH", 503),
            (ResponseFlag::UO, "UO", 503),
            (ResponseFlag::UT, "UT", 504),
            (ResponseFlag::NR, "NR", 404),
        ];
        for (flag, label, code) in flags {
            assert_eq!((flag.as_str(), flag.response_code()), (label, code));
            let parsed: ResponseFlag = serde_yaml::from_str(label).unwrap();
            assert_eq!(parsed, flag);
        }
        let unlabelled = text.replace(
            "{name: east-1, mesh_failure_ratio: 0}",
            "{name: east-1, mesh_failure_ratio: 0, mesh_failure_origin: false}",
        );
        let st = Scenario::from_yaml(&unlabelled)
            .unwrap()
            .state_at(Duration::ZERO, &[]);
        assert!(!failure(&st, "east-1").unwrap().origin);
        // Invalid: (replacement of the east-1 fault event, what the error names)
        let invalid = [
            (
                "{at: 10s, mesh_failure_ratio: 0.2}",
                "does not name the cluster",
            ),
            (
                "{at: 10s, mesh_failure_flag: UF}",
                "does not name the cluster",
            ),
            (
                "{at: 10s, cluster: east-1, mesh_failure_ratio: 1.2}",
                "mesh_failure_ratio must be within 0..1",
            ),
            (
                "{at: 10s, cluster: east-1, mesh_failure_flag: XX}",
                "unknown variant",
            ),
        ];
        for (event, want) in invalid {
            let bad = text.replace("{at: 10s, cluster: east-1, mesh_failure_ratio: 0.2}", event);
            let err = Scenario::from_yaml(&bad).unwrap_err();
            assert!(
                err.to_string().contains(want),
                "{err} should mention {want}"
            );
        }
        let bad = text.replace("mesh_failure_ratio: 0}", "mesh_failure_ratio: -0.1}");
        let err = Scenario::from_yaml(&bad).unwrap_err();
        assert!(
            err.to_string()
                .contains("clusters[east-1].mesh_failure_ratio"),
            "{err}"
        );
    }

    #[test]
    fn invalid_scenarios_name_the_field() {
        let cases = [
            (
                CANARY.replace("error_ratio: 0.01, p50", "error_ratio: 1.5, p50"),
                "error_ratio",
            ),
            (
                CANARY.replace(
                    "service: checkout, version: v2.14, error",
                    "service: cart, version: v2.14, error",
                ),
                "not a listed service",
            ),
            (
                CANARY.replace("version: v2.14, latency", "version: v9, latency"),
                "not a version",
            ),
            (
                CANARY.replace(
                    "{at: 40s, service: checkout, version: v2.14, latency_factor: 2}",
                    "{at: 40s, latency_factor: 2}",
                ),
                "does not name service",
            ),
            (
                CANARY.replace(
                    "p99_ms: 80}\n      - {name: v2.14",
                    "p99_ms: 5}\n      - {name: v2.14",
                ),
                "p50_ms <= p99_ms",
            ),
            (
                CANARY.replace("route: checkout", "route: checkout\n    colour: blue"),
                "unknown field",
            ),
            (
                CANARY.replace(
                    "route: checkout",
                    "route: checkout\n    other_paths: [{path: /a, share: 0.6}, {path: /b, share: 0.6}]",
                ),
                "add up to more than 1",
            ),
            (
                CANARY.replace(
                    "route: checkout",
                    "route: checkout\n    other_paths: [{path: a, share: 0.1}]",
                ),
                "other_paths[a]",
            ),
        ];
        for (text, want) in cases {
            let err = Scenario::from_yaml(&text).unwrap_err();
            assert!(
                err.to_string().contains(want),
                "{err} should mention {want}"
            );
        }
    }

    #[test]
    fn shipped_scenarios_are_valid() {
        let dir = Scenario::shipped_dir();
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let s = Scenario::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    path.file_stem().unwrap().to_str().unwrap(),
                    s.name,
                    "file name and scenario name must agree"
                );
                n += 1;
            }
        }
        assert!(n >= 2, "expected shipped scenarios in {}", dir.display());
    }
}
