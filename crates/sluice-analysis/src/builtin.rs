//! Built-in gates on Istio's standard metrics: their PromQL, the variables that key them, and
//! how the parts of a batched answer become one value and one sample count per object.
//!
//! Owns the PromQL of every [`BuiltinGate`]; `GATES.md` documents the same text (a test keeps the
//! two equal). Never performs I/O and never judges a value (that is `decide`).
//!
//! Every built-in query is one instant query whose parts are told apart by a `sluice_part` label
//! (`label_replace(<part>, "sluice_part", "<name>", "", "")` joined with `or`), grouped
//! `by ({{by}})` so a batch of objects is split back by the key labels. `cluster` stands for the
//! engine's cluster label (default `cluster`), the label Thanos Query uses to scope a series to
//! one cluster.
//!
//! | gate | key variables | parts | value | samples |
//! |---|---|---|---|---|
//! | AppliedShare | cluster, namespace, service | `requests` | canary ÷ (canary + stable) | canary + stable requests |
//! | ErrorRatioVsStable | cluster, namespace, service | `requests`, `errors` | errors ÷ requests | requests |
//! | LatencyP99VsStable | cluster, namespace, service | `p99`, `requests` | p99 in ms (worst binding) | requests |
//! | MeshErrorRatio | cluster | `requests`, `origin`, `flagged` | (origin + flagged) ÷ requests | requests |
//! | XdsNackIncrease | cluster | `rejects`, `pushes` | rejected pushes in the window | pushes |
//! | ProxiesBehind | cluster, commit | `behind`, `proxies` | proxies behind the commit | proxies reported |
//! | ProxiesPerRevision | cluster, revision | `proxies` | connected proxies | same |
//! | SvidIssuanceRate | cluster | `issued`, `csrs` | certificates issued per second | CSRs in the window |
//!
//! AppliedShare, ErrorRatioVsStable and LatencyP99VsStable count requests as the **source**
//! reporter sees them: a gateway reports as source too, and a mirrored copy is sent outside the
//! client's request path, so only the destination side would count it. The canary binding uses
//! `service = canaryService`, the stable one `service = stableService` (one Service per version).
//! An owner may scope them ([`ServiceScope`]): a **destination** view, for the canary of a mirror
//! step, reads ErrorRatioVsStable and LatencyP99VsStable as the receiving workloads' proxies
//! report them (`reporter="destination"`, keyed on `destination_workload` and
//! `destination_workload_namespace`; the canary binding `workload = canaryWorkload`, the stable
//! one `workload = stableWorkload`), since Istio's source reporter never sees a mirrored copy and
//! the destination side labels it with the request's `Host` plus Envoy's `-shadow` suffix rather
//! than the canary Service. AppliedShare stays on the source reporter in every view (the live
//! share never counts mirrored copies). A **source-workload filter** (`source_workload` one of a
//! list, optionally `source_workload_namespace`) restricts all three to requests from given
//! clients, e.g. the gateway of a north-south route.
//! ErrorRatioVsStable's `errors` are the requests answered with an HTTP 5xx **or**, on another
//! HTTP status, with a gRPC status that is a server error ([`GRPC_SERVER_ERRORS`]): gRPC carries
//! its errors as `grpc-status` on HTTP 200, which Istio reports as `response_code="200"` beside
//! `grpc_response_status` (istio/proxy `source/extensions/filters/http/istio_stats/istio_stats.cc`,
//! `IstioStatsFilter::log`: the trailer's code for a gRPC request, `""` for any other). The gRPC
//! part is grouped by `grpc_response_status` as well, so its series stay apart from the 5xx ones in
//! the `or` and the engine sums both into `errors`; a 5xx that also carries a gRPC status (Envoy's
//! own UNAVAILABLE on 503) is counted once, by the 5xx part. No flag says a gate judges gRPC:
//! HTTP requests never match the gRPC part.
//! MeshErrorRatio counts `failure_origin="mesh"` where the platform adds that label (seed ADR-30)
//! and, on series without it, any Envoy response flag except `-` and `DC` (the client went away).
//! ProxiesBehind reads the drift exporter contract (seed ADR-31), which sluice defines and does not
//! build: `sluice_drift_proxies_behind{cluster, commit}` (proxies whose acknowledged config is not
//! `commit`) and `sluice_drift_proxies{cluster, commit}` (proxies the exporter evaluated).
//! ProxiesPerRevision reads `pilot_xds` (connected proxies per istiod) with the istiod pod's
//! `istio.io/rev` label kept as `revision` at scrape time.
//!
//! The full PromQL of every gate follows (this module's documentation includes `GATES.md`).
//!
#![doc = include_str!("../GATES.md")]

use std::collections::BTreeMap;

use sluice_api::v1alpha1::BuiltinGate;

use crate::template::{escape_regex, escape_string};

/// The label that tells the parts of one answer apart.
pub const PART_LABEL: &str = "sluice_part";
/// Part name of a series without [`PART_LABEL`] (custom templates).
pub const VALUE_PART: &str = "value";
/// Part name custom templates use for their sample count.
pub const SAMPLES_PART: &str = "samples";
/// The cluster label name inside the built-in templates, replaced by the engine's setting.
pub const TEMPLATE_CLUSTER_LABEL: &str = "cluster";

/// The gRPC status codes ErrorRatioVsStable counts as errors (the `grpc_response_status` regex of
/// its gRPC part): exactly those Envoy translates to an HTTP 5xx (`Grpc::Utility::grpcToHttpStatus`)
/// — UNKNOWN 2, DEADLINE_EXCEEDED 4, UNIMPLEMENTED 12, INTERNAL 13, UNAVAILABLE 14, DATA_LOSS 15 —
/// so a gRPC service is judged by the rule an HTTP one is. The codes that map to a 4xx (the
/// client's request was wrong or not allowed) and CANCELLED (the client went away) are not.
pub const GRPC_SERVER_ERRORS: &str = "2|4|12|13|14|15";

/// The drift exporter contract: proxies behind a commit.
pub const DRIFT_BEHIND_METRIC: &str = "sluice_drift_proxies_behind";
/// The drift exporter contract: proxies evaluated for a commit.
pub const DRIFT_PROXIES_METRIC: &str = "sluice_drift_proxies";

const APPLIED_SHARE: &str = r#"label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}[{{window}}])), "sluice_part", "requests", "", "")"#;

const ERROR_RATIO: &str = r#"label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}[{{window}}])), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}", response_code=~"5.."}[{{window}}])), "sluice_part", "errors", "", "")
or
label_replace(sum by ({{by}}, grpc_response_status) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}", response_code!~"5..", grpc_response_status=~"2|4|12|13|14|15"}[{{window}}])), "sluice_part", "errors", "", "")"#;

const LATENCY_P99: &str = r#"label_replace(histogram_quantile(0.99, sum by (le, {{by}}) (rate(istio_request_duration_milliseconds_bucket{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}[{{window}}]))), "sluice_part", "p99", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_request_duration_milliseconds_count{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}[{{window}}])), "sluice_part", "requests", "", "")"#;

const MESH_ERROR_RATIO: &str = r#"label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}"}[{{window}}])), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", failure_origin="mesh"}[{{window}}])), "sluice_part", "origin", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", failure_origin="", response_flags!~"-|DC"}[{{window}}])), "sluice_part", "flagged", "", "")"#;

const XDS_NACK_INCREASE: &str = r#"label_replace(sum by ({{by}}) (increase(pilot_total_xds_rejects{cluster="{{cluster}}"}[{{window}}])), "sluice_part", "rejects", "", "")
or
label_replace(sum by ({{by}}) (increase(pilot_xds_pushes{cluster="{{cluster}}"}[{{window}}])), "sluice_part", "pushes", "", "")"#;

const PROXIES_BEHIND: &str = r#"label_replace(sum by ({{by}}) (last_over_time(sluice_drift_proxies_behind{cluster="{{cluster}}", commit="{{commit}}"}[{{window}}])), "sluice_part", "behind", "", "")
or
label_replace(sum by ({{by}}) (last_over_time(sluice_drift_proxies{cluster="{{cluster}}", commit="{{commit}}"}[{{window}}])), "sluice_part", "proxies", "", "")"#;

const PROXIES_PER_REVISION: &str = r#"label_replace(sum by ({{by}}) (last_over_time(pilot_xds{cluster="{{cluster}}", revision="{{revision}}"}[{{window}}])), "sluice_part", "proxies", "", "")"#;

const SVID_ISSUANCE_RATE: &str = r#"label_replace(sum by ({{by}}) (rate(citadel_server_success_cert_issuance_count{cluster="{{cluster}}"}[{{window}}])), "sluice_part", "issued", "", "")
or
label_replace(sum by ({{by}}) (increase(citadel_server_csr_count{cluster="{{cluster}}"}[{{window}}])), "sluice_part", "csrs", "", "")"#;

/// The request and error (5xx or a gRPC server error) counters of the canary or stable Service,
/// read at aligned instants by the sequential tests of ErrorRatioVsStable and AppliedShare: the
/// counts of an interval are the difference of two consecutive readings, so every request falls
/// in exactly one interval.
const REQUEST_COUNTERS: &str = r#"label_replace(sum by ({{by}}) (istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}", response_code=~"5.."}), "sluice_part", "errors", "", "")
or
label_replace(sum by ({{by}}, grpc_response_status) (istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}", response_code!~"5..", grpc_response_status=~"2|4|12|13|14|15"}), "sluice_part", "errors", "", "")"#;

/// The duration histogram's cumulative bucket counters, one part per bound (`le_<bound>`): what
/// the sequential test of LatencyP99VsStable counts slow requests from.
const BUCKET_COUNTERS: &str = r#"label_replace(sum by (le, {{by}}) (istio_request_duration_milliseconds_bucket{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}), "sluice_part", "le_$1", "le", "(.+)")"#;

const DESTINATION_ERROR_RATIO: &str = r#"label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}"}[{{window}}])), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}", response_code=~"5.."}[{{window}}])), "sluice_part", "errors", "", "")
or
label_replace(sum by ({{by}}, grpc_response_status) (increase(istio_requests_total{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}", response_code!~"5..", grpc_response_status=~"2|4|12|13|14|15"}[{{window}}])), "sluice_part", "errors", "", "")"#;

const DESTINATION_LATENCY_P99: &str = r#"label_replace(histogram_quantile(0.99, sum by (le, {{by}}) (rate(istio_request_duration_milliseconds_bucket{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}"}[{{window}}]))), "sluice_part", "p99", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_request_duration_milliseconds_count{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}"}[{{window}}])), "sluice_part", "requests", "", "")"#;

const DESTINATION_REQUEST_COUNTERS: &str = r#"label_replace(sum by ({{by}}) (istio_requests_total{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}"}), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (istio_requests_total{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}", response_code=~"5.."}), "sluice_part", "errors", "", "")
or
label_replace(sum by ({{by}}, grpc_response_status) (istio_requests_total{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}", response_code!~"5..", grpc_response_status=~"2|4|12|13|14|15"}), "sluice_part", "errors", "", "")"#;

const DESTINATION_BUCKET_COUNTERS: &str = r#"label_replace(sum by (le, {{by}}) (istio_request_duration_milliseconds_bucket{reporter="destination", cluster="{{cluster}}", destination_workload_namespace="{{namespace}}", destination_workload="{{workload}}"}), "sluice_part", "le_$1", "le", "(.+)")"#;

/// The variable the destination view keys a binding on (`destination_workload`): engine-internal,
/// supplied by the role overrides from `canaryWorkload` and `stableWorkload`.
pub const WORKLOAD_VARIABLE: &str = "workload";

/// Which proxy's reports a built-in service gate reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reporter {
    /// The client's proxy or the gateway (`reporter="source"`), keyed on the destination
    /// Service: what the route sends to each backend. The default.
    #[default]
    Source,
    /// The receiving workload's proxy (`reporter="destination"`), keyed on the destination
    /// workload: the only report of a mirrored copy.
    Destination,
}

/// Requests from these clients only: `source_workload` one of `workloads` and, when set,
/// `source_workload_namespace = namespace`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceWorkloads {
    /// `source_workload` values (workload names, e.g. a gateway's Deployment); at least one.
    pub workloads: Vec<String>,
    /// `source_workload_namespace`; `None`: any namespace.
    pub namespace: Option<String>,
}

/// How the built-in service gates (AppliedShare, ErrorRatioVsStable, LatencyP99VsStable) of a
/// check read Istio's request metrics. The default reads the source reporter over every client
/// in the mesh, as the module documentation describes; other gates ignore it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceScope {
    /// Whose report ErrorRatioVsStable and LatencyP99VsStable read (AppliedShare: always the
    /// source's).
    pub reporter: Reporter,
    /// Only requests from these clients; `None`: every client.
    pub sources: Option<SourceWorkloads>,
}

impl ServiceScope {
    /// The same clients, read on the source reporter (what the applied share counts).
    pub fn live(&self) -> ServiceScope {
        ServiceScope {
            reporter: Reporter::Source,
            sources: self.sources.clone(),
        }
    }

    /// Whether bindings are keyed on `{{workload}}` (the destination view).
    pub fn keys_workloads(&self) -> bool {
        self.reporter == Reporter::Destination
    }
}

/// The matchers of a source-workload filter, each value escaped (the workload names as regex
/// literals joined by `|`), to follow a `reporter` matcher.
fn source_matchers(sources: &SourceWorkloads) -> String {
    let alternatives: Vec<String> = sources.workloads.iter().map(|w| escape_regex(w)).collect();
    let mut out = String::new();
    if let Some(ns) = &sources.namespace {
        out.push_str(&format!(
            "source_workload_namespace=\"{}\", ",
            escape_string(ns)
        ));
    }
    out.push_str(&format!(
        "source_workload=~\"{}\", ",
        escape_string(&alternatives.join("|"))
    ));
    out
}

/// `template` with the cluster label renamed and the source-workload filter of `scope` after
/// every `reporter` matcher.
fn scoped(template: &str, cluster_label: &str, scope: &ServiceScope) -> String {
    let from = format!("{TEMPLATE_CLUSTER_LABEL}=\"{{{{cluster}}}}\"");
    let mut out = template.replace(&from, &format!("{cluster_label}=\"{{{{cluster}}}}\""));
    if let Some(sources) = scope.sources.as_ref().filter(|s| !s.workloads.is_empty()) {
        let matchers = source_matchers(sources);
        for reporter in ["reporter=\"source\", ", "reporter=\"destination\", "] {
            out = out.replace(reporter, &format!("{reporter}{matchers}"));
        }
    }
    out
}

/// The counter query of a sequential test (`buckets`: the latency histogram; otherwise requests
/// and errors), with the cluster label renamed.
pub fn counters_for(buckets: bool, cluster_label: &str) -> String {
    counters_in(buckets, cluster_label, &ServiceScope::default())
}

/// [`counters_for`] read as `scope` says (the share's counters: pass [`ServiceScope::live`]).
pub fn counters_in(buckets: bool, cluster_label: &str, scope: &ServiceScope) -> String {
    let template = match (buckets, scope.reporter) {
        (true, Reporter::Source) => BUCKET_COUNTERS,
        (false, Reporter::Source) => REQUEST_COUNTERS,
        (true, Reporter::Destination) => DESTINATION_BUCKET_COUNTERS,
        (false, Reporter::Destination) => DESTINATION_REQUEST_COUNTERS,
    };
    scoped(template, cluster_label, scope)
}

/// Prefix of the bucket parts of [`counters_for`].
pub const BUCKET_PART_PREFIX: &str = "le_";

/// The cumulative buckets `(upper bound, count)` of one role, summed over its bindings, by
/// increasing bound.
pub fn buckets(parts: &[Parts]) -> Vec<(f64, f64)> {
    let mut by_bound: BTreeMap<String, f64> = BTreeMap::new();
    for p in parts {
        for (name, v) in p {
            if let Some(le) = name.strip_prefix(BUCKET_PART_PREFIX) {
                *by_bound.entry(le.to_owned()).or_insert(0.0) += v;
            }
        }
    }
    let mut out: Vec<(f64, f64)> = by_bound
        .into_iter()
        .filter_map(|(le, n)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse::<f64>().ok()?
            };
            Some((bound, n))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The PromQL template of a built-in gate, with `cluster` as the cluster label.
pub fn template(gate: BuiltinGate) -> &'static str {
    match gate {
        BuiltinGate::AppliedShare => APPLIED_SHARE,
        BuiltinGate::ErrorRatioVsStable => ERROR_RATIO,
        BuiltinGate::LatencyP99VsStable => LATENCY_P99,
        BuiltinGate::MeshErrorRatio => MESH_ERROR_RATIO,
        BuiltinGate::XdsNackIncrease => XDS_NACK_INCREASE,
        BuiltinGate::ProxiesBehind => PROXIES_BEHIND,
        BuiltinGate::ProxiesPerRevision => PROXIES_PER_REVISION,
        BuiltinGate::SvidIssuanceRate => SVID_ISSUANCE_RATE,
    }
}

/// The template with the cluster label renamed to `cluster_label` (already validated as a label name).
pub fn template_for(gate: BuiltinGate, cluster_label: &str) -> String {
    template_in(gate, cluster_label, &ServiceScope::default())
}

/// [`template_for`] read as `scope` says: the service gates in its view and restricted to its
/// clients (AppliedShare always on the source reporter); the other gates unchanged.
pub fn template_in(gate: BuiltinGate, cluster_label: &str, scope: &ServiceScope) -> String {
    if !is_service_gate(gate) {
        return scoped(template(gate), cluster_label, &ServiceScope::default());
    }
    let text = match (gate, scope.reporter) {
        (BuiltinGate::ErrorRatioVsStable, Reporter::Destination) => DESTINATION_ERROR_RATIO,
        (BuiltinGate::LatencyP99VsStable, Reporter::Destination) => DESTINATION_LATENCY_P99,
        _ => template(gate),
    };
    scoped(text, cluster_label, scope)
}

/// Whether the template of `gate` in `scope` keys its bindings on `{{workload}}`.
pub fn keys_workloads(gate: BuiltinGate, scope: &ServiceScope) -> bool {
    scope.keys_workloads()
        && matches!(
            gate,
            BuiltinGate::ErrorRatioVsStable | BuiltinGate::LatencyP99VsStable
        )
}

/// Whether the gate compares a canary binding with a stable binding (service-keyed gates).
pub fn is_service_gate(gate: BuiltinGate) -> bool {
    matches!(
        gate,
        BuiltinGate::AppliedShare
            | BuiltinGate::ErrorRatioVsStable
            | BuiltinGate::LatencyP99VsStable
    )
}

/// The parts of one object binding: part name → value (summed when several series match).
pub type Parts = BTreeMap<String, f64>;

/// One role's reading: the value (absent = no data) and the samples behind it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// The value in the gate's unit; `None` when the query returned nothing for the role.
    pub value: Option<f64>,
    /// Samples (requests, pushes, proxies) behind the value; `None` when unknown.
    pub samples: Option<f64>,
}

impl Reading {
    /// No data at all.
    pub const NONE: Reading = Reading {
        value: None,
        samples: None,
    };
}

fn sum(parts: &[Parts], name: &str) -> Option<f64> {
    let found: Vec<f64> = parts.iter().filter_map(|p| p.get(name).copied()).collect();
    (!found.is_empty()).then(|| found.iter().sum())
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        f64::NAN
    }
}

/// Reduces the parts of one role (its bindings) to a reading. `AppliedShare` is reduced by
/// [`applied_share`] instead, as it needs both roles.
pub fn reduce(gate: BuiltinGate, parts: &[Parts]) -> Reading {
    match gate {
        BuiltinGate::AppliedShare => {
            let requests = sum(parts, "requests");
            Reading {
                value: requests,
                samples: requests,
            }
        }
        BuiltinGate::ErrorRatioVsStable => match sum(parts, "requests") {
            None => Reading::NONE,
            Some(requests) => {
                let errors = sum(parts, "errors").unwrap_or(0.0);
                Reading {
                    value: Some(ratio(errors, requests)),
                    samples: Some(requests),
                }
            }
        },
        BuiltinGate::LatencyP99VsStable => {
            let p99 = parts
                .iter()
                .filter_map(|p| p.get("p99").copied())
                .filter(|v| !v.is_nan())
                .reduce(f64::max);
            let requests = sum(parts, "requests");
            match (p99, requests) {
                (None, None) => Reading::NONE,
                (p99, requests) => Reading {
                    value: Some(p99.unwrap_or(f64::NAN)),
                    samples: requests,
                },
            }
        }
        BuiltinGate::MeshErrorRatio => match sum(parts, "requests") {
            None => Reading::NONE,
            Some(requests) => {
                let errors =
                    sum(parts, "origin").unwrap_or(0.0) + sum(parts, "flagged").unwrap_or(0.0);
                Reading {
                    value: Some(ratio(errors, requests)),
                    samples: Some(requests),
                }
            }
        },
        BuiltinGate::XdsNackIncrease => match sum(parts, "pushes") {
            None => Reading::NONE,
            Some(pushes) => Reading {
                value: Some(sum(parts, "rejects").unwrap_or(0.0)),
                samples: Some(pushes),
            },
        },
        BuiltinGate::ProxiesBehind => match (sum(parts, "behind"), sum(parts, "proxies")) {
            (Some(behind), proxies) => Reading {
                value: Some(behind),
                samples: proxies,
            },
            (None, _) => Reading::NONE,
        },
        BuiltinGate::ProxiesPerRevision => {
            let proxies = sum(parts, "proxies");
            Reading {
                value: proxies,
                samples: proxies,
            }
        }
        BuiltinGate::SvidIssuanceRate => match (sum(parts, "issued"), sum(parts, "csrs")) {
            (None, None) => Reading::NONE,
            (issued, csrs) => Reading {
                value: Some(issued.unwrap_or(0.0)),
                samples: csrs,
            },
        },
    }
}

/// The applied share: canary requests ÷ (canary + stable requests). A missing canary series with
/// stable traffic present is a share of 0 (the mesh routed nothing to the canary), not "no data".
pub fn applied_share(canary: &[Parts], stable: &[Parts]) -> Reading {
    let c = sum(canary, "requests");
    let s = sum(stable, "requests");
    if c.is_none() && s.is_none() {
        return Reading::NONE;
    }
    let total = c.unwrap_or(0.0) + s.unwrap_or(0.0);
    Reading {
        value: Some(ratio(c.unwrap_or(0.0), total)),
        samples: Some(total),
    }
}

/// The reading of a custom template: the `value` part (summed over bindings) and the `samples`
/// part when the template reports one.
pub fn reduce_custom(parts: &[Parts]) -> Reading {
    Reading {
        value: sum(parts, VALUE_PART),
        samples: sum(parts, SAMPLES_PART),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::template::Template;

    fn parts(pairs: &[(&str, f64)]) -> Parts {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn every_builtin_parses_and_is_keyed_as_documented() {
        let allowed: BTreeSet<String> = sluice_api::v1alpha1::gate::KNOWN_VARIABLES
            .iter()
            .map(|s| s.to_string())
            .collect();
        let cases: &[(BuiltinGate, &[&str])] = &[
            (
                BuiltinGate::AppliedShare,
                &[
                    "cluster",
                    "destination_service_name",
                    "destination_service_namespace",
                ],
            ),
            (
                BuiltinGate::ErrorRatioVsStable,
                &[
                    "cluster",
                    "destination_service_name",
                    "destination_service_namespace",
                ],
            ),
            (
                BuiltinGate::LatencyP99VsStable,
                &[
                    "cluster",
                    "destination_service_name",
                    "destination_service_namespace",
                ],
            ),
            (BuiltinGate::MeshErrorRatio, &["cluster"]),
            (BuiltinGate::XdsNackIncrease, &["cluster"]),
            (BuiltinGate::ProxiesBehind, &["cluster", "commit"]),
            (BuiltinGate::ProxiesPerRevision, &["cluster", "revision"]),
            (BuiltinGate::SvidIssuanceRate, &["cluster"]),
        ];
        assert_eq!(cases.len(), BuiltinGate::ALL.len());
        for (gate, keys) in cases {
            let t = Template::parse(template(*gate), &allowed)
                .unwrap_or_else(|e| panic!("{gate}: {e}"));
            assert_eq!(t.key_labels(), *keys, "{gate}");
            assert!(
                t.constant_variables().is_empty(),
                "{gate} must batch on keys only"
            );
        }
    }

    #[test]
    fn the_counter_queries_parse_and_batch_on_the_service_keys() {
        let allowed: BTreeSet<String> = sluice_api::v1alpha1::gate::KNOWN_VARIABLES
            .iter()
            .map(|s| s.to_string())
            .collect();
        for buckets in [false, true] {
            let t = Template::parse(&counters_for(buckets, "k8s_cluster"), &allowed).unwrap();
            assert_eq!(
                t.key_labels(),
                [
                    "destination_service_name",
                    "destination_service_namespace",
                    "k8s_cluster"
                ]
            );
            assert!(t.constant_variables().is_empty());
        }
        let parts = vec![
            parts(&[("le_100", 8.0), ("le_+Inf", 10.0), ("le_25.5", 3.0)]),
            parts(&[("le_100", 2.0), ("le_+Inf", 2.0)]),
        ];
        assert_eq!(
            buckets(&parts),
            vec![(25.5, 3.0), (100.0, 10.0), (f64::INFINITY, 12.0)]
        );
    }

    #[test]
    fn the_destination_view_keys_the_health_gates_on_workloads_and_the_share_stays_live() {
        let mut allowed: BTreeSet<String> = sluice_api::v1alpha1::gate::KNOWN_VARIABLES
            .iter()
            .map(|s| s.to_string())
            .collect();
        allowed.insert(WORKLOAD_VARIABLE.into());
        let destination = ServiceScope {
            reporter: Reporter::Destination,
            sources: None,
        };
        let workload_keys = [
            "cluster",
            "destination_workload",
            "destination_workload_namespace",
        ];
        for gate in [
            BuiltinGate::ErrorRatioVsStable,
            BuiltinGate::LatencyP99VsStable,
        ] {
            let text = template_in(gate, "cluster", &destination);
            assert!(keys_workloads(gate, &destination), "{gate}");
            assert!(!text.contains("reporter=\"source\""), "{gate}: {text}");
            assert!(!text.contains("destination_service_name"), "{gate}: {text}");
            let t = Template::parse(&text, &allowed).unwrap_or_else(|e| panic!("{gate}: {e}"));
            assert_eq!(t.key_labels(), workload_keys, "{gate}");
            assert!(t.constant_variables().is_empty(), "{gate}");
        }
        for buckets in [false, true] {
            let text = counters_in(buckets, "cluster", &destination);
            assert!(text.contains("reporter=\"destination\""), "{text}");
            let t = Template::parse(&text, &allowed).unwrap();
            assert_eq!(t.key_labels(), workload_keys);
        }
        // Mirrored copies never enter the share: AppliedShare reads the source in every view.
        assert_eq!(
            template_in(BuiltinGate::AppliedShare, "cluster", &destination),
            template(BuiltinGate::AppliedShare)
        );
        assert!(!keys_workloads(BuiltinGate::AppliedShare, &destination));
        assert_eq!(
            counters_in(false, "cluster", &destination.live()),
            counters_for(false, "cluster")
        );
        // Gates that are not canary-vs-stable ignore the view.
        assert_eq!(
            template_in(BuiltinGate::MeshErrorRatio, "cluster", &destination),
            template(BuiltinGate::MeshErrorRatio)
        );
    }

    #[test]
    fn a_source_filter_restricts_every_service_query_to_the_named_clients_escaped() {
        let allowed: BTreeSet<String> = sluice_api::v1alpha1::gate::KNOWN_VARIABLES
            .iter()
            .chain(&[WORKLOAD_VARIABLE])
            .map(|s| s.to_string())
            .collect();
        let sources = SourceWorkloads {
            workloads: vec!["istio-ingressgateway".into(), "edge.gw".into()],
            namespace: Some("istio-system".into()),
        };
        let matchers = r#"source_workload_namespace="istio-system", source_workload=~"istio-ingressgateway|edge\\.gw", "#;
        for reporter in [Reporter::Source, Reporter::Destination] {
            let scope = ServiceScope {
                reporter,
                sources: Some(sources.clone()),
            };
            let texts = [
                template_in(BuiltinGate::AppliedShare, "cluster", &scope),
                template_in(BuiltinGate::ErrorRatioVsStable, "cluster", &scope),
                template_in(BuiltinGate::LatencyP99VsStable, "cluster", &scope),
                counters_in(false, "cluster", &scope),
                counters_in(true, "cluster", &scope),
            ];
            for text in texts {
                // Every selector of every part carries the filter, right after the reporter.
                let selectors = text.matches("reporter=").count();
                assert!(selectors > 0);
                assert_eq!(text.matches(matchers).count(), selectors, "{text}");
                // The filter is a constant: Rollouts with the same clients batch together.
                let t = Template::parse(&text, &allowed).unwrap_or_else(|e| panic!("{e}: {text}"));
                assert!(t.constant_variables().is_empty(), "{text}");
                assert!(!t.key_labels().contains(&"source_workload".to_owned()));
            }
        }
        // Without a namespace: any namespace; the mesh-wide gates never take the filter.
        let scope = ServiceScope {
            reporter: Reporter::Source,
            sources: Some(SourceWorkloads {
                workloads: vec!["gw".into()],
                namespace: None,
            }),
        };
        let text = template_in(BuiltinGate::ErrorRatioVsStable, "cluster", &scope);
        assert!(text.contains(r#"reporter="source", source_workload=~"gw", cluster="#));
        assert!(!text.contains("source_workload_namespace"));
        assert_eq!(
            template_in(BuiltinGate::MeshErrorRatio, "cluster", &scope),
            template(BuiltinGate::MeshErrorRatio)
        );
        // A value cannot leave its string or open a variable.
        let hostile = ServiceScope {
            reporter: Reporter::Source,
            sources: Some(SourceWorkloads {
                workloads: vec![r#"x"} or vector(1) {{cluster}}"#.into()],
                namespace: None,
            }),
        };
        let text = template_in(BuiltinGate::ErrorRatioVsStable, "cluster", &hostile);
        let t = Template::parse(&text, &allowed).unwrap();
        assert!(t.constant_variables().is_empty(), "{text}");
        assert!(
            text.contains(r#"source_workload=~"x\"\\} or vector\\(1\\) \\{\\{cluster\\}\\}""#),
            "{text}"
        );
    }

    #[test]
    fn gates_md_documents_the_destination_view() {
        let doc = include_str!("../GATES.md");
        let destination = ServiceScope {
            reporter: Reporter::Destination,
            sources: None,
        };
        for gate in [
            BuiltinGate::ErrorRatioVsStable,
            BuiltinGate::LatencyP99VsStable,
        ] {
            assert!(
                doc.contains(&template_in(gate, "cluster", &destination)),
                "{gate}"
            );
        }
        for buckets in [false, true] {
            assert!(doc.contains(&counters_in(buckets, "cluster", &destination)));
        }
    }

    #[test]
    fn every_error_query_counts_5xx_and_grpc_server_errors_once() {
        let destination = ServiceScope {
            reporter: Reporter::Destination,
            sources: None,
        };
        let grpc =
            format!("response_code!~\"5..\", grpc_response_status=~\"{GRPC_SERVER_ERRORS}\"");
        for text in [
            template_for(BuiltinGate::ErrorRatioVsStable, "cluster"),
            template_in(BuiltinGate::ErrorRatioVsStable, "cluster", &destination),
            counters_for(false, "cluster"),
            counters_in(false, "cluster", &destination),
        ] {
            // Two error parts, apart in the `or` by the gRPC part's extra grouping label.
            assert_eq!(
                text.matches("\"sluice_part\", \"errors\"").count(),
                2,
                "{text}"
            );
            assert_eq!(text.matches("response_code=~\"5..\"").count(), 1, "{text}");
            assert_eq!(text.matches(&grpc).count(), 1, "{text}");
            assert_eq!(
                text.matches("sum by ({{by}}, grpc_response_status)")
                    .count(),
                1,
                "{text}"
            );
        }
        // The codes Envoy maps to a 5xx, and no other.
        let codes: BTreeSet<u8> = GRPC_SERVER_ERRORS
            .split('|')
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(codes, BTreeSet::from([2, 4, 12, 13, 14, 15]));
    }

    #[test]
    fn cluster_label_is_renamed() {
        let t = template_for(BuiltinGate::XdsNackIncrease, "k8s_cluster");
        assert!(t.contains("k8s_cluster=\"{{cluster}}\""));
        assert!(!t.contains(" cluster=\"") && !t.contains("{cluster=\""));
    }

    #[test]
    fn gates_md_documents_every_builtin_query() {
        let doc = include_str!("../GATES.md");
        for gate in BuiltinGate::ALL {
            assert!(
                doc.contains(template(gate)),
                "GATES.md lacks the PromQL of {gate}"
            );
        }
    }

    #[test]
    fn gates_md_documents_the_counter_queries() {
        let doc = include_str!("../GATES.md");
        for buckets in [false, true] {
            assert!(doc.contains(&counters_for(buckets, "cluster")));
        }
    }

    #[test]
    fn reduce_table() {
        let nan = f64::NAN;
        let cases: Vec<(BuiltinGate, Vec<Parts>, Reading)> = vec![
            (BuiltinGate::ErrorRatioVsStable, vec![], Reading::NONE),
            (
                BuiltinGate::ErrorRatioVsStable,
                vec![parts(&[("requests", 200.0)])],
                Reading {
                    value: Some(0.0),
                    samples: Some(200.0),
                },
            ),
            (
                BuiltinGate::ErrorRatioVsStable,
                vec![parts(&[("requests", 200.0), ("errors", 10.0)])],
                Reading {
                    value: Some(0.05),
                    samples: Some(200.0),
                },
            ),
            (
                BuiltinGate::ErrorRatioVsStable,
                vec![parts(&[("errors", 10.0)])],
                Reading::NONE,
            ),
            (
                BuiltinGate::ErrorRatioVsStable,
                vec![parts(&[("requests", 0.0)])],
                Reading {
                    value: Some(nan),
                    samples: Some(0.0),
                },
            ),
            (
                BuiltinGate::LatencyP99VsStable,
                vec![
                    parts(&[("p99", 120.0), ("requests", 50.0)]),
                    parts(&[("p99", 300.0), ("requests", 50.0)]),
                ],
                Reading {
                    value: Some(300.0),
                    samples: Some(100.0),
                },
            ),
            (
                BuiltinGate::MeshErrorRatio,
                vec![parts(&[
                    ("requests", 1000.0),
                    ("origin", 5.0),
                    ("flagged", 5.0),
                ])],
                Reading {
                    value: Some(0.01),
                    samples: Some(1000.0),
                },
            ),
            (
                BuiltinGate::XdsNackIncrease,
                vec![parts(&[("pushes", 40.0)])],
                Reading {
                    value: Some(0.0),
                    samples: Some(40.0),
                },
            ),
            (
                BuiltinGate::XdsNackIncrease,
                vec![parts(&[("rejects", 3.0)])],
                Reading::NONE,
            ),
            (
                BuiltinGate::ProxiesBehind,
                vec![parts(&[("behind", 3.0), ("proxies", 400.0)])],
                Reading {
                    value: Some(3.0),
                    samples: Some(400.0),
                },
            ),
            (
                BuiltinGate::ProxiesBehind,
                vec![parts(&[("proxies", 400.0)])],
                Reading::NONE,
            ),
            (
                BuiltinGate::ProxiesPerRevision,
                vec![parts(&[("proxies", 7.0)]), parts(&[("proxies", 3.0)])],
                Reading {
                    value: Some(10.0),
                    samples: Some(10.0),
                },
            ),
            (
                BuiltinGate::SvidIssuanceRate,
                vec![parts(&[("csrs", 60.0)])],
                Reading {
                    value: Some(0.0),
                    samples: Some(60.0),
                },
            ),
        ];
        for (gate, input, want) in cases {
            let got = reduce(gate, &input);
            let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(x), Some(y)) => (x.is_nan() && y.is_nan()) || (x - y).abs() < 1e-12,
                (a, b) => a == b,
            };
            assert!(
                same(got.value, want.value) && same(got.samples, want.samples),
                "{gate} {input:?}: {got:?}"
            );
        }
    }

    #[test]
    fn applied_share_table() {
        let cases: Vec<(Vec<Parts>, Vec<Parts>, Reading)> = vec![
            (vec![], vec![], Reading::NONE),
            (
                vec![],
                vec![parts(&[("requests", 100.0)])],
                Reading {
                    value: Some(0.0),
                    samples: Some(100.0),
                },
            ),
            (
                vec![parts(&[("requests", 25.0)])],
                vec![parts(&[("requests", 75.0)])],
                Reading {
                    value: Some(0.25),
                    samples: Some(100.0),
                },
            ),
            (
                vec![parts(&[("requests", 10.0)])],
                vec![],
                Reading {
                    value: Some(1.0),
                    samples: Some(10.0),
                },
            ),
        ];
        for (canary, stable, want) in cases {
            assert_eq!(applied_share(&canary, &stable), want);
        }
    }
}
