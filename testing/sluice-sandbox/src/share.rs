//! The applied share as the mesh reports it: requests to the canary backend ÷ requests to the
//! route's backends, counted by the source reporter (mirrored copies never count), over a window
//! ending now. [`canary_share`] is the pure arithmetic; [`measure`] asks Prometheus. Never reads
//! the route: what was written is not what happened.

use std::collections::BTreeMap;

use sluice_testkit::prometheus::PrometheusError;

use crate::metrics::Metrics;

/// Requests per backend Service over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// Requests per `destination_service_name`.
    pub by_backend: BTreeMap<String, f64>,
    /// The window, in seconds.
    pub window_s: u64,
}

impl Measured {
    /// All requests counted.
    pub fn total(&self) -> f64 {
        self.by_backend.values().sum()
    }

    /// Requests to one backend (0 when absent).
    pub fn requests(&self, backend: &str) -> f64 {
        self.by_backend.get(backend).copied().unwrap_or(0.0)
    }
}

/// The canary's share of the requests to `stable` and `canary`; `None` without any request
/// (no data is never a share of 0).
pub fn canary_share(measured: &Measured, stable: &str, canary: &str) -> Option<f64> {
    let c = measured.requests(canary);
    let s = measured.requests(stable);
    (c + s > 0.0).then(|| c / (c + s))
}

/// The PromQL that counts a namespace's requests per backend in one cluster.
pub fn query(cluster: &str, namespace: &str, window_s: u64) -> String {
    format!(
        r#"sum by (destination_service_name) (increase(istio_requests_total{{reporter="source", cluster="{cluster}", destination_service_namespace="{namespace}"}}[{window_s}s]))"#
    )
}

/// Asks Prometheus how many requests each backend of `namespace` in `cluster` got over the
/// last `window_s` seconds.
pub async fn measure(
    prometheus: &Metrics,
    cluster: &str,
    namespace: &str,
    window_s: u64,
) -> Result<Measured, PrometheusError> {
    let samples = prometheus
        .query(&query(cluster, namespace, window_s), None)
        .await?;
    Ok(Measured {
        by_backend: samples
            .into_iter()
            .filter_map(|s| {
                let name = s.labels.get("destination_service_name")?.clone();
                Some((name, s.value))
            })
            .collect(),
        window_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> Measured {
        Measured {
            by_backend: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            window_s: 5,
        }
    }

    #[test]
    fn share_is_canary_over_stable_plus_canary_and_none_without_requests() {
        let cases = [
            (m(&[("s", 900.0), ("c", 100.0)]), Some(0.1)),
            (m(&[("s", 1000.0)]), Some(0.0)),
            (m(&[("c", 10.0)]), Some(1.0)),
            (m(&[("other", 10.0)]), None),
            (m(&[]), None),
            // Requests to a backend that is neither stable nor canary do not dilute the share.
            (m(&[("s", 450.0), ("c", 50.0), ("other", 500.0)]), Some(0.1)),
        ];
        for (measured, want) in cases {
            let got = canary_share(&measured, "s", "c");
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{measured:?}: {g} != {w}"),
                (g, w) => assert_eq!(g, w, "{measured:?}"),
            }
        }
    }

    #[test]
    fn the_query_counts_the_source_reporter_of_one_cluster_and_namespace() {
        let q = query("east-1", "shop", 5);
        assert!(q.contains(r#"reporter="source""#), "{q}");
        assert!(q.contains(r#"cluster="east-1""#), "{q}");
        assert!(q.contains(r#"destination_service_namespace="shop""#), "{q}");
        assert!(q.contains("[5s]"), "{q}");
    }
}
