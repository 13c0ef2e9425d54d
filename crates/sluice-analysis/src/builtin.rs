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

/// The label that tells the parts of one answer apart.
pub const PART_LABEL: &str = "sluice_part";
/// Part name of a series without [`PART_LABEL`] (custom templates).
pub const VALUE_PART: &str = "value";
/// Part name custom templates use for their sample count.
pub const SAMPLES_PART: &str = "samples";
/// The cluster label name inside the built-in templates, replaced by the engine's setting.
pub const TEMPLATE_CLUSTER_LABEL: &str = "cluster";

/// The drift exporter contract: proxies behind a commit.
pub const DRIFT_BEHIND_METRIC: &str = "sluice_drift_proxies_behind";
/// The drift exporter contract: proxies evaluated for a commit.
pub const DRIFT_PROXIES_METRIC: &str = "sluice_drift_proxies";

const APPLIED_SHARE: &str = r#"label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}[{{window}}])), "sluice_part", "requests", "", "")"#;

const ERROR_RATIO: &str = r#"label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}[{{window}}])), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}", response_code=~"5.."}[{{window}}])), "sluice_part", "errors", "", "")"#;

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

/// The request and 5xx counters of the canary or stable Service, read at aligned instants by the
/// sequential tests of ErrorRatioVsStable and AppliedShare: the counts of an interval are the
/// difference of two consecutive readings, so every request falls in exactly one interval.
const REQUEST_COUNTERS: &str = r#"label_replace(sum by ({{by}}) (istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}), "sluice_part", "requests", "", "")
or
label_replace(sum by ({{by}}) (istio_requests_total{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}", response_code=~"5.."}), "sluice_part", "errors", "", "")"#;

/// The duration histogram's cumulative bucket counters, one part per bound (`le_<bound>`): what
/// the sequential test of LatencyP99VsStable counts slow requests from.
const BUCKET_COUNTERS: &str = r#"label_replace(sum by (le, {{by}}) (istio_request_duration_milliseconds_bucket{reporter="source", cluster="{{cluster}}", destination_service_namespace="{{namespace}}", destination_service_name="{{service}}"}), "sluice_part", "le_$1", "le", "(.+)")"#;

/// The counter query of a sequential test (`buckets`: the latency histogram; otherwise requests
/// and 5xx), with the cluster label renamed.
pub fn counters_for(buckets: bool, cluster_label: &str) -> String {
    let from = format!("{TEMPLATE_CLUSTER_LABEL}=\"{{{{cluster}}}}\"");
    let template = if buckets {
        BUCKET_COUNTERS
    } else {
        REQUEST_COUNTERS
    };
    template.replace(&from, &format!("{cluster_label}=\"{{{{cluster}}}}\""))
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
    let from = format!("{TEMPLATE_CLUSTER_LABEL}=\"{{{{cluster}}}}\"");
    template(gate).replace(&from, &format!("{cluster_label}=\"{{{{cluster}}}}\""))
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
