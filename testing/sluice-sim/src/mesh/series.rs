//! The metric series the simulated mesh exports: Istio's request counters and duration
//! histograms per reporter, control-plane counters and gauges, the drift contract and the SVID
//! counter (all documented in `testing/sluice-sim/CONTRACT.md`). Owns the cumulative counter
//! state and the fixed label sets; pure (the telemetry loop feeds it elapsed time and
//! observations and ships the series).
//!
//! Counters hold expected counts (real numbers), so measured shares are exact up to the
//! propagation and rate-window effects that a real mesh also shows.

use super::latency::{ISTIO_BUCKETS_MS, LogNormal};
use super::scenario::{
    FAILURE_ORIGIN_MESH, GRPC_OK, GRPC_UNAVAILABLE, MeshFailure, Protocol, ServiceScenario,
    VersionScenario, grpc_status_of_http,
};
use super::split::Split;
use sluice_testkit::remote_write::{Label, Sample, TimeSeries};
use std::collections::BTreeMap;

/// `istio_requests_total`.
pub const REQUESTS_TOTAL: &str = "istio_requests_total";
/// `istio_request_duration_milliseconds` (histogram base name).
pub const REQUEST_DURATION: &str = "istio_request_duration_milliseconds";
/// xDS rejections (NACKs) per cluster.
pub const XDS_REJECTS: &str = "pilot_total_xds_rejects";
/// xDS pushes per cluster.
pub const XDS_PUSHES: &str = "pilot_xds_pushes";
/// Connected proxies per revision.
pub const PROXIES_PER_REVISION: &str = "pilot_xds";
/// Drift contract: proxies whose acknowledged config is not `commit`.
pub const DRIFT_BEHIND: &str = "sluice_drift_proxies_behind";
/// Drift contract: proxies evaluated for `commit`.
pub const DRIFT_PROXIES: &str = "sluice_drift_proxies";
/// SVIDs issued.
pub const SVID_ISSUED: &str = "citadel_server_success_cert_issuance_count";
/// CSRs received (one per SVID here).
pub const CSR_COUNT: &str = "citadel_server_csr_count";
/// `destination_version` of a backend the scenario does not list.
pub const UNKNOWN_VERSION: &str = "unknown";

/// The fixed label set of Istio request metrics (plus `le` on buckets).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// `source` or `destination`.
    pub reporter: &'static str,
    /// `cluster`.
    pub cluster: String,
    /// `source_workload`.
    pub source_workload: String,
    /// `source_workload_namespace`.
    pub source_namespace: String,
    /// `destination_service_name` (the backend Service).
    pub service: String,
    /// `destination_service_namespace`.
    pub namespace: String,
    /// `destination_version`.
    pub version: String,
    /// `destination_workload` (its namespace, `destination_workload_namespace`, is `namespace`:
    /// every version runs beside its Service).
    pub workload: String,
    /// `response_code`.
    pub code: u16,
    /// `response_flags`.
    pub flags: &'static str,
    /// `failure_origin`, only on requests the mesh failed (absent from every other series).
    pub failure_origin: Option<&'static str>,
    /// `grpc_response_status`, with `request_protocol="grpc"`, on the requests of a gRPC service
    /// only (HTTP series carry neither label, as before gRPC services existed).
    pub grpc_status: Option<u8>,
}

fn label(name: &str, value: &str) -> Label {
    Label {
        name: name.to_string(),
        value: value.to_string(),
    }
}

fn one_sample(labels: Vec<Label>, timestamp_ms: i64, value: f64) -> TimeSeries {
    TimeSeries {
        labels,
        samples: vec![Sample {
            value,
            timestamp: timestamp_ms,
        }],
    }
}

/// A wire series with `__name__` and the given labels, sorted by name as remote write requires.
pub fn simple_series(
    name: &str,
    labels: &[(&str, &str)],
    timestamp_ms: i64,
    value: f64,
) -> TimeSeries {
    let mut all: Vec<Label> = std::iter::once(label("__name__", name))
        .chain(labels.iter().map(|(n, v)| label(n, v)))
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    one_sample(all, timestamp_ms, value)
}

/// The metric name of a wire series.
pub fn name_of(series: &TimeSeries) -> &str {
    series
        .labels
        .iter()
        .find(|l| l.name == "__name__")
        .map_or("", |l| l.value.as_str())
}

impl RequestKey {
    /// The key's labels with `__name__`, in the sorted order remote write requires; `le` (for
    /// buckets) sorts between `destination_workload_namespace` (or `failure_origin`) and `reporter`, at
    /// [`le_index`].
    fn labels(&self, name: &str) -> Vec<Label> {
        let mut labels = vec![
            label("__name__", name),
            label("cluster", &self.cluster),
            label("destination_service_name", &self.service),
            label("destination_service_namespace", &self.namespace),
            label("destination_version", &self.version),
            label("destination_workload", &self.workload),
            label("destination_workload_namespace", &self.namespace),
            label("reporter", self.reporter),
            label("response_code", &self.code.to_string()),
            label("response_flags", self.flags),
            label("source_workload", &self.source_workload),
            label("source_workload_namespace", &self.source_namespace),
        ];
        if let Some(origin) = self.failure_origin {
            labels.insert(7, label("failure_origin", origin));
        }
        if let Some(status) = self.grpc_status {
            // Sorted: `grpc_response_status` right before `reporter`, `request_protocol` right
            // after it.
            let at = labels
                .iter()
                .position(|l| l.name == "reporter")
                .expect("reporter is always there");
            labels.insert(at, label("grpc_response_status", &status.to_string()));
            labels.insert(at + 2, label("request_protocol", Protocol::Grpc.as_str()));
        }
        labels
    }
}

/// Where `le` goes in sorted `labels` (before the first label name after it).
fn le_index(labels: &[Label]) -> usize {
    labels
        .iter()
        .position(|l| l.name.as_str() > "le")
        .unwrap_or(labels.len())
}

#[derive(Debug, Clone, Default)]
struct Histogram {
    buckets: [f64; ISTIO_BUCKETS_MS.len()],
    sum: f64,
    count: f64,
}

/// Cumulative counters of the whole simulated mesh.
#[derive(Debug, Clone, Default)]
pub struct MeshCounters {
    requests: BTreeMap<RequestKey, f64>,
    durations: BTreeMap<RequestKey, Histogram>,
    xds_pushes: BTreeMap<String, f64>,
    xds_rejects: BTreeMap<String, f64>,
}

/// Per-cluster gauges observed at one tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterGauges {
    /// Injected proxies per revision (from the pods' `sidecar.istio.io/status`).
    pub proxies_by_revision: BTreeMap<String, u64>,
    /// Drift: `(commit, proxies evaluated, proxies behind)`, if a commit is known.
    pub drift: Option<(String, u64, u64)>,
    /// SVIDs issued so far per istiod replica, (revision, pod) → count, if the cluster
    /// behaviour runs in this cluster.
    pub svids: Option<BTreeMap<(String, String), u64>>,
}

/// `destination_service_name` of a mirrored copy at the destination: the request's host (here
/// the service's name) with the `-shadow` suffix Envoy appends to a mirrored request's `Host`.
pub fn shadow_host(svc: &ServiceScenario) -> String {
    format!("{}-shadow", svc.name)
}

fn version_for<'a>(svc: &'a ServiceScenario, backend: &str) -> Option<&'a VersionScenario> {
    svc.versions.iter().find(|v| v.backend == backend)
}

impl MeshCounters {
    /// Adds `dt_seconds` of one service's traffic, split as `split` says. Every listed version
    /// gets its series (zero while unused); backends the scenario does not list appear as
    /// [`UNKNOWN_VERSION`] with no errors and stable latency.
    pub fn add_service(
        &mut self,
        svc: &ServiceScenario,
        cluster: &str,
        split: &Split,
        dt_seconds: f64,
    ) {
        self.add_service_in(svc, cluster, split, dt_seconds, None);
    }

    /// [`MeshCounters::add_service`] in a cluster whose mesh fails `failure.ratio` of the
    /// served requests: the source reporter counts them with the failure's response code and
    /// flag (and `failure_origin="mesh"` if the failure says so), the destination never sees
    /// them; the rest is served as without a failure. With a failure (even at ratio 0) the
    /// failure series of every served backend exist.
    pub fn add_service_in(
        &mut self,
        svc: &ServiceScenario,
        cluster: &str,
        split: &Split,
        dt_seconds: f64,
        failure: Option<MeshFailure>,
    ) {
        let failed_share = failure.map_or(0.0, |f| f.ratio);
        let total = svc.requests_per_second * dt_seconds;
        let stable = &svc.versions[0];
        let mut backends: Vec<&str> = svc.versions.iter().map(|v| v.backend.as_str()).collect();
        for b in split.served.keys().chain(split.mirrored.keys()) {
            if !backends.contains(&b.as_str()) {
                backends.push(b);
            }
        }
        for backend in backends {
            let v = version_for(svc, backend);
            let (version, workload, error_ratio, dist) = match v {
                Some(v) => (
                    v.name.as_str(),
                    v.workload.as_deref().unwrap_or(backend),
                    v.error_ratio,
                    LogNormal::from_p50_p99(v.p50_ms, v.p99_ms),
                ),
                None => (
                    UNKNOWN_VERSION,
                    backend,
                    0.0,
                    LogNormal::from_p50_p99(stable.p50_ms, stable.p99_ms),
                ),
            };
            let attempted = total * split.served.get(backend).copied().unwrap_or(0.0);
            let failed = attempted * failed_share;
            let served = attempted - failed;
            let mirrored = total * split.mirrored.get(backend).copied().unwrap_or(0.0);
            let grpc = svc.protocol == Protocol::Grpc;
            let key = |reporter, code, grpc_status, flags, failure_origin| RequestKey {
                reporter,
                cluster: cluster.to_string(),
                source_workload: svc.source_workload.clone(),
                source_namespace: svc.source_namespace.clone(),
                service: backend.to_string(),
                namespace: svc.namespace.clone(),
                version: version.to_string(),
                workload: workload.to_string(),
                code,
                flags,
                failure_origin,
                grpc_status,
            };
            if let Some(f) = failure {
                let origin = f.origin.then_some(FAILURE_ORIGIN_MESH);
                let code = f.flag.response_code();
                let status = grpc.then(|| grpc_status_of_http(code));
                self.count(
                    key("source", code, status, f.flag.as_str(), origin),
                    failed,
                    &dist,
                );
            }
            // What the application answers: HTTP 500 on error, or, for gRPC, HTTP 200 with the
            // call's status (UNAVAILABLE on error).
            let answers = if grpc {
                [
                    (200u16, Some(GRPC_OK), 1.0 - error_ratio),
                    (200u16, Some(GRPC_UNAVAILABLE), error_ratio),
                ]
            } else {
                [
                    (200u16, None, 1.0 - error_ratio),
                    (500u16, None, error_ratio),
                ]
            };
            for (code, status, share) in answers {
                for reporter in ["source", "destination"] {
                    self.count(
                        key(reporter, code, status, "-", None),
                        served * share,
                        &dist,
                    );
                }
                // A mirrored copy reaches only the receiving proxy, which labels it with the
                // request's host plus Envoy's `-shadow` suffix, not the backend Service: only
                // `destination_workload` attributes it to the version.
                if mirrored > 0.0 {
                    let shadow = RequestKey {
                        service: shadow_host(svc),
                        ..key("destination", code, status, "-", None)
                    };
                    self.count(shadow, mirrored * share, &dist);
                }
            }
        }
    }

    /// Adds `n` requests with latency `dist` to the series of `key`.
    fn count(&mut self, key: RequestKey, n: f64, dist: &LogNormal) {
        let h = self.durations.entry(key.clone()).or_default();
        for (i, le) in ISTIO_BUCKETS_MS.iter().enumerate() {
            h.buckets[i] += n * dist.cdf(*le);
        }
        h.sum += n * dist.mean();
        h.count += n;
        *self.requests.entry(key).or_default() += n;
    }

    /// Adds `dt_seconds` of a cluster's xDS pushes and rejections.
    pub fn add_xds(
        &mut self,
        cluster: &str,
        pushes_per_second: f64,
        rejects_per_second: f64,
        dt_seconds: f64,
    ) {
        *self.xds_pushes.entry(cluster.to_string()).or_default() += pushes_per_second * dt_seconds;
        *self.xds_rejects.entry(cluster.to_string()).or_default() +=
            rejects_per_second * dt_seconds;
    }

    /// The cumulative request count of one series (tests and diagnostics).
    pub fn requests(&self, key: &RequestKey) -> f64 {
        self.requests.get(key).copied().unwrap_or(0.0)
    }

    /// Every series at `timestamp_ms`, in wire form: the counters plus the given per-cluster
    /// gauges.
    pub fn series(
        &self,
        timestamp_ms: i64,
        gauges: &BTreeMap<String, ClusterGauges>,
    ) -> Vec<TimeSeries> {
        let mut out = Vec::with_capacity(self.requests.len() * (ISTIO_BUCKETS_MS.len() + 4));
        for (key, v) in &self.requests {
            out.push(one_sample(key.labels(REQUESTS_TOTAL), timestamp_ms, *v));
        }
        let bucket = format!("{REQUEST_DURATION}_bucket");
        let sum = format!("{REQUEST_DURATION}_sum");
        let count = format!("{REQUEST_DURATION}_count");
        for (key, h) in &self.durations {
            let base = key.labels(&bucket);
            let at = le_index(&base);
            for (i, le) in ISTIO_BUCKETS_MS.iter().enumerate() {
                let mut labels = base.clone();
                labels.insert(at, label("le", &le.to_string()));
                out.push(one_sample(labels, timestamp_ms, h.buckets[i]));
            }
            let mut labels = base;
            labels.insert(at, label("le", "+Inf"));
            out.push(one_sample(labels, timestamp_ms, h.count));
            out.push(one_sample(key.labels(&sum), timestamp_ms, h.sum));
            out.push(one_sample(key.labels(&count), timestamp_ms, h.count));
        }
        for (cluster, v) in &self.xds_pushes {
            out.push(simple_series(
                XDS_PUSHES,
                &[("cluster", cluster)],
                timestamp_ms,
                *v,
            ));
        }
        for (cluster, v) in &self.xds_rejects {
            out.push(simple_series(
                XDS_REJECTS,
                &[("cluster", cluster)],
                timestamp_ms,
                *v,
            ));
        }
        for (cluster, g) in gauges {
            for (rev, n) in &g.proxies_by_revision {
                out.push(simple_series(
                    PROXIES_PER_REVISION,
                    &[("cluster", cluster), ("revision", rev)],
                    timestamp_ms,
                    *n as f64,
                ));
            }
            if let Some((commit, proxies, behind)) = &g.drift {
                for (name, v) in [(DRIFT_PROXIES, *proxies), (DRIFT_BEHIND, *behind)] {
                    out.push(simple_series(
                        name,
                        &[("cluster", cluster), ("commit", commit)],
                        timestamp_ms,
                        v as f64,
                    ));
                }
            }
            for ((revision, pod), n) in g.svids.iter().flatten() {
                for name in [SVID_ISSUED, CSR_COUNT] {
                    out.push(simple_series(
                        name,
                        &[("cluster", cluster), ("revision", revision), ("pod", pod)],
                        timestamp_ms,
                        *n as f64,
                    ));
                }
            }
        }
        out
    }
}

/// Proxies still behind a commit applied `since` ago: all but the converged ones, never fewer
/// than `stuck`. Linear convergence over `convergence`.
pub fn drift_behind(
    total: u64,
    stuck: u64,
    since: std::time::Duration,
    convergence: std::time::Duration,
) -> u64 {
    let stuck = stuck.min(total);
    let remaining = if convergence.is_zero() {
        0.0
    } else {
        (1.0 - since.as_secs_f64() / convergence.as_secs_f64()).clamp(0.0, 1.0)
    };
    stuck + ((total - stuck) as f64 * remaining).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::scenario::Scenario;
    use std::time::Duration;

    fn svc() -> ServiceScenario {
        Scenario::from_yaml(
            r#"
name: t
services:
  - name: checkout
    namespace: shop
    requests_per_second: 100
    versions:
      - {name: v1, backend: c-v1, error_ratio: 0.1}
      - {name: v2, backend: c-v2, error_ratio: 0.5}
"#,
        )
        .unwrap()
        .services[0]
            .clone()
    }

    fn key(reporter: &'static str, service: &str, version: &str, code: u16) -> RequestKey {
        RequestKey {
            reporter,
            cluster: "east".into(),
            source_workload: "istio-ingressgateway".into(),
            source_namespace: "istio-system".into(),
            service: service.into(),
            namespace: "shop".into(),
            version: version.into(),
            workload: service.into(),
            code,
            flags: "-",
            failure_origin: None,
            grpc_status: None,
        }
    }

    fn shadow(k: RequestKey) -> RequestKey {
        RequestKey {
            service: shadow_host(&svc()),
            ..k
        }
    }

    #[test]
    fn counts_split_reporters_and_errors() {
        let mut c = MeshCounters::default();
        let split = Split {
            served: BTreeMap::from([("c-v1".into(), 0.9), ("c-v2".into(), 0.1)]),
            mirrored: BTreeMap::from([("c-v2".into(), 0.5), ("c-other".into(), 0.2)]),
            unrouted: 0.0,
        };
        c.add_service(&svc(), "east", &split, 2.0);
        // (key, want) — 200 requests in 2 s.
        let cases = [
            (key("source", "c-v1", "v1", 200), 162.0),
            (key("source", "c-v1", "v1", 500), 18.0),
            (key("source", "c-v2", "v2", 200), 10.0),
            (key("source", "c-v2", "v2", 500), 10.0),
            (key("destination", "c-v2", "v2", 200), 10.0),
            (key("destination", "c-v2", "v2", 500), 10.0),
            // Mirrored copies only at the destination, under the shadow host: attributed to the
            // version by its workload, never to its Service.
            (shadow(key("destination", "c-v2", "v2", 200)), 50.0),
            (shadow(key("destination", "c-v2", "v2", 500)), 50.0),
            (shadow(key("source", "c-v2", "v2", 200)), 0.0),
            (key("source", "c-other", UNKNOWN_VERSION, 200), 0.0),
            (key("destination", "c-other", UNKNOWN_VERSION, 200), 0.0),
            (
                shadow(key("destination", "c-other", UNKNOWN_VERSION, 200)),
                40.0,
            ),
        ];
        for (k, want) in cases {
            assert!(
                (c.requests(&k) - want).abs() < 1e-9,
                "{k:?}: {}",
                c.requests(&k)
            );
        }
    }

    #[test]
    fn a_grpc_service_reports_its_errors_as_unavailable_on_http_200() {
        use crate::mesh::scenario::{Protocol, ResponseFlag};
        let mut grpc = svc();
        grpc.protocol = Protocol::Grpc;
        let split = Split {
            served: BTreeMap::from([("c-v1".into(), 0.9), ("c-v2".into(), 0.1)]),
            ..Default::default()
        };
        let failure = MeshFailure {
            ratio: 0.5,
            flag: ResponseFlag::UF,
            origin: true,
        };
        let mut c = MeshCounters::default();
        c.add_service_in(&grpc, "east", &split, 2.0, Some(failure));
        let with = |k: RequestKey, status: u8| RequestKey {
            grpc_status: Some(status),
            ..k
        };
        // 200 requests in 2 s, half failed by the mesh before the destination.
        let cases = [
            (with(key("source", "c-v1", "v1", 200), 0), 81.0),
            (with(key("source", "c-v1", "v1", 200), 14), 9.0),
            (with(key("destination", "c-v2", "v2", 200), 0), 5.0),
            (with(key("destination", "c-v2", "v2", 200), 14), 5.0),
            (
                RequestKey {
                    flags: "UF",
                    failure_origin: Some(FAILURE_ORIGIN_MESH),
                    ..with(key("source", "c-v2", "v2", 503), 14)
                },
                10.0,
            ),
            // Never a 500, never a series without its gRPC status.
            (key("source", "c-v1", "v1", 500), 0.0),
            (key("source", "c-v1", "v1", 200), 0.0),
        ];
        for (k, want) in cases {
            assert!(
                (c.requests(&k) - want).abs() < 1e-9,
                "{k:?}: {}",
                c.requests(&k)
            );
        }
        let series = c.series(1_000, &BTreeMap::new());
        let unavailable = series
            .iter()
            .find(|s| {
                name_of(s) == REQUESTS_TOTAL
                    && s.labels
                        .iter()
                        .any(|l| l.name == "grpc_response_status" && l.value == "14")
                    && s.labels
                        .iter()
                        .any(|l| l.name == "response_code" && l.value == "200")
            })
            .expect("an UNAVAILABLE series on HTTP 200");
        let labels: Vec<(&str, &str)> = unavailable
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        let mut sorted = labels.clone();
        sorted.sort();
        assert_eq!(labels, sorted, "labels must be sorted for remote write");
        assert!(labels.contains(&("request_protocol", "grpc")), "{labels:?}");
        // Buckets keep `le` in order with the two labels added.
        for s in &series {
            let names: Vec<&str> = s.labels.iter().map(|l| l.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted);
        }
    }

    #[test]
    fn series_have_the_fixed_label_set() {
        let mut c = MeshCounters::default();
        let split = Split {
            served: BTreeMap::from([("c-v1".into(), 1.0)]),
            ..Default::default()
        };
        c.add_service(&svc(), "east", &split, 1.0);
        c.add_xds("east", 1.0, 0.5, 1.0);
        let gauges = BTreeMap::from([(
            "east".to_string(),
            ClusterGauges {
                proxies_by_revision: BTreeMap::from([("1-27".into(), 3)]),
                drift: Some(("abc".into(), 3, 1)),
                svids: Some(BTreeMap::from([(
                    ("1-27".into(), "istiod-1-27-0".into()),
                    7,
                )])),
            },
        )]);
        let series = c.series(1_000, &gauges);
        // 2 versions x 2 reporters x 2 codes = 8 keys; each: 1 counter + 20 buckets + sum + count.
        let per_key = 1 + ISTIO_BUCKETS_MS.len() + 1 + 2;
        let extra = 2 + 1 + 2 + 2;
        assert_eq!(series.len(), 8 * per_key + extra);
        for s in &series {
            let names: Vec<&str> = s.labels.iter().map(|l| l.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "labels must be sorted for remote write");
        }
        let bucket = series
            .iter()
            .find(|s| name_of(s) == "istio_request_duration_milliseconds_bucket")
            .unwrap();
        let label_names: Vec<&str> = bucket.labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            label_names,
            [
                "__name__",
                "cluster",
                "destination_service_name",
                "destination_service_namespace",
                "destination_version",
                "destination_workload",
                "destination_workload_namespace",
                "le",
                "reporter",
                "response_code",
                "response_flags",
                "source_workload",
                "source_workload_namespace"
            ]
        );
        let names: std::collections::BTreeSet<&str> = series.iter().map(name_of).collect();
        for want in [
            REQUESTS_TOTAL,
            "istio_request_duration_milliseconds_bucket",
            "istio_request_duration_milliseconds_sum",
            "istio_request_duration_milliseconds_count",
            XDS_PUSHES,
            XDS_REJECTS,
            PROXIES_PER_REVISION,
            DRIFT_BEHIND,
            DRIFT_PROXIES,
            SVID_ISSUED,
            CSR_COUNT,
        ] {
            assert!(names.contains(want), "missing {want}");
        }
    }

    #[test]
    fn mesh_failures_table() {
        use crate::mesh::scenario::ResponseFlag;
        let split = Split {
            served: BTreeMap::from([("c-v1".into(), 0.9), ("c-v2".into(), 0.1)]),
            mirrored: BTreeMap::from([("c-v2".into(), 0.5)]),
            unrouted: 0.0,
        };
        let failing =
            |k: RequestKey, flag: ResponseFlag, origin: Option<&'static str>| RequestKey {
                code: flag.response_code(),
                flags: flag.as_str(),
                failure_origin: origin,
                ..k
            };
        // (failure, key, want) — 200 requests in 2 s; v1 fails 10% of its responses, v2 50%.
        let uf = MeshFailure {
            ratio: 0.25,
            flag: ResponseFlag::UF,
            origin: true,
        };
        let nr_unlabelled = MeshFailure {
            ratio: 0.5,
            flag: ResponseFlag::NR,
            origin: false,
        };
        let zero = MeshFailure { ratio: 0.0, ..uf };
        let cases = [
            // The mesh fails a quarter of what the sources send, flagged, at the source only.
            (
                Some(uf),
                failing(
                    key("source", "c-v1", "v1", 0),
                    ResponseFlag::UF,
                    Some("mesh"),
                ),
                45.0,
            ),
            (
                Some(uf),
                failing(
                    key("source", "c-v2", "v2", 0),
                    ResponseFlag::UF,
                    Some("mesh"),
                ),
                5.0,
            ),
            (Some(uf), key("source", "c-v1", "v1", 200), 121.5),
            (Some(uf), key("source", "c-v1", "v1", 500), 13.5),
            (Some(uf), key("destination", "c-v1", "v1", 200), 121.5),
            (
                Some(uf),
                failing(
                    key("destination", "c-v1", "v1", 0),
                    ResponseFlag::UF,
                    Some("mesh"),
                ),
                0.0,
            ),
            // Mirrored copies are not failed by the source's mesh: 15 served (half 200), and 50
            // mirrored under the shadow host.
            (Some(uf), key("destination", "c-v2", "v2", 200), 7.5),
            (
                Some(uf),
                shadow(key("destination", "c-v2", "v2", 200)),
                50.0,
            ),
            // Without the origin label only the flag tells them apart.
            (
                Some(nr_unlabelled),
                failing(key("source", "c-v1", "v1", 0), ResponseFlag::NR, None),
                90.0,
            ),
            (
                Some(nr_unlabelled),
                failing(
                    key("source", "c-v1", "v1", 0),
                    ResponseFlag::NR,
                    Some("mesh"),
                ),
                0.0,
            ),
            (Some(nr_unlabelled), key("source", "c-v1", "v1", 200), 81.0),
            // At ratio 0 the failure series exist at zero and nothing else changes.
            (
                Some(zero),
                failing(
                    key("source", "c-v1", "v1", 0),
                    ResponseFlag::UF,
                    Some("mesh"),
                ),
                0.0,
            ),
            (Some(zero), key("source", "c-v1", "v1", 200), 162.0),
            (None, key("source", "c-v1", "v1", 200), 162.0),
        ];
        for (failure, k, want) in cases {
            let mut c = MeshCounters::default();
            c.add_service_in(&svc(), "east", &split, 2.0, failure);
            assert!(
                (c.requests(&k) - want).abs() < 1e-9,
                "{failure:?} {k:?}: {}",
                c.requests(&k)
            );
        }
        // Series written: 2 backends × 2 reporters × 2 codes, the mirrored copies' 2 shadow keys,
        // and the failure series only with a failure configured.
        let per_key = 1 + ISTIO_BUCKETS_MS.len() + 1 + 2;
        for (failure, keys) in [(None, 10), (Some(zero), 12), (Some(uf), 12)] {
            let mut c = MeshCounters::default();
            c.add_service_in(&svc(), "east", &split, 2.0, failure);
            assert_eq!(
                c.series(1, &BTreeMap::new()).len(),
                keys * per_key,
                "{failure:?}"
            );
        }
        let mut c = MeshCounters::default();
        c.add_service_in(&svc(), "east", &split, 2.0, Some(uf));
        let series = c.series(1_000, &BTreeMap::new());
        let with_origin: Vec<&TimeSeries> = series
            .iter()
            .filter(|s| s.labels.iter().any(|l| l.name == "failure_origin"))
            .collect();
        assert_eq!(with_origin.len(), 2 * per_key);
        for s in &series {
            let names: Vec<&str> = s.labels.iter().map(|l| l.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "labels must be sorted for remote write");
        }
        let flagged = with_origin
            .iter()
            .find(|s| name_of(s) == REQUESTS_TOTAL && s.labels.iter().any(|l| l.value == "c-v1"))
            .unwrap();
        let get = |n: &str| {
            flagged
                .labels
                .iter()
                .find(|l| l.name == n)
                .map(|l| l.value.as_str())
        };
        assert_eq!(
            (
                get("failure_origin"),
                get("response_flags"),
                get("response_code"),
                get("reporter")
            ),
            (Some("mesh"), Some("UF"), Some("503"), Some("source"))
        );
        assert!((flagged.samples[0].value - 45.0).abs() < 1e-9);
    }

    #[test]
    fn drift_table() {
        let s = Duration::from_secs;
        // (total, stuck, since, convergence, want)
        let cases = [
            (100, 0, s(0), s(10), 100),
            (100, 0, s(5), s(10), 50),
            (100, 0, s(10), s(10), 0),
            (100, 3, s(20), s(10), 3),
            (100, 3, s(5), s(10), 3 + 49),
            (2, 5, s(0), s(10), 2),
            (10, 0, s(0), s(0), 0),
        ];
        for (total, stuck, since, conv, want) in cases {
            assert_eq!(
                drift_behind(total, stuck, since, conv),
                want,
                "{total} {stuck} {since:?} {conv:?}"
            );
        }
    }
}
