//! The sandbox's metrics backend: where the simulated telemetry is written and where the
//! operators and scenarios read it.
//!
//! - [`MetricsKind::Prometheus`] (the default): one Prometheus for the whole sandbox; every
//!   cluster's telemetry is remote-written into it and everything reads it directly.
//! - [`MetricsKind::Thanos`], as production reads metrics: one Prometheus per cluster with
//!   external labels `cluster` and `site`, a Thanos sidecar beside each, and one Thanos Query over
//!   the sidecars, each a strict endpoint of `--endpoint.sd-config` (a strict endpoint that goes down
//!   stays in the query set, so a query asking for no partial response fails rather than answering from
//!   the stores left). Each cluster's telemetry is remote-written into its own Prometheus; the
//!   operators and the scenarios read through Thanos Query, asking for no partial response.
//!
//! A cluster's store can be taken down ([`Metrics::stop_store`]) to show that no gate passes on
//! the clusters left.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_testkit::prometheus::{
    Prometheus, PrometheusError, QueryApi, RangeSeries, VectorSample,
};
use sluice_testkit::remote_write::Series;
use sluice_testkit::thanos::{self, ThanosError, ThanosProcess};

use crate::topology::ClusterSpec;

/// How long Thanos Query may take to see every sidecar at start.
const STORES_READY: Duration = Duration::from_secs(60);

/// Which metrics backend the sandbox runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsKind {
    /// One Prometheus, read directly.
    #[default]
    Prometheus,
    /// A Prometheus and a Thanos sidecar per cluster under one Thanos Query (strict endpoints).
    Thanos,
}

impl MetricsKind {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            MetricsKind::Prometheus => "prometheus",
            MetricsKind::Thanos => "thanos",
        }
    }
}

/// Why the metrics backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A Prometheus did not start.
    #[error("starting Prometheus{} failed: {source}", for_cluster(cluster))]
    Prometheus {
        /// The cluster it serves (None: the sandbox's single Prometheus).
        cluster: Option<String>,
        /// Cause.
        source: PrometheusError,
    },
    /// A Thanos component did not start or never saw its stores.
    #[error("starting Thanos{} failed: {source}", for_cluster(cluster))]
    Thanos {
        /// The cluster whose sidecar it is (None: Thanos Query).
        cluster: Option<String>,
        /// Cause.
        source: ThanosError,
    },
}

fn for_cluster(cluster: &Option<String>) -> String {
    cluster
        .as_ref()
        .map(|c| format!(" for {c}"))
        .unwrap_or_default()
}

/// One cluster's store under Thanos: its Prometheus and the sidecar serving it.
#[derive(Debug)]
struct Store {
    cluster: String,
    prometheus: Prometheus,
    sidecar: Mutex<Option<ThanosProcess>>,
    grpc: String,
}

/// The running metrics backend; every process stops when it is dropped.
#[derive(Debug)]
pub struct Metrics {
    kind: MetricsKind,
    single: Option<Prometheus>,
    stores: Vec<Store>,
    thanos_query: Option<ThanosProcess>,
    api: QueryApi,
}

impl Metrics {
    /// Starts the backend for `clusters` (Thanos: a Prometheus and sidecar for each, started in
    /// parallel, then Thanos Query once it sees every sidecar).
    pub async fn start(kind: MetricsKind, clusters: &[ClusterSpec]) -> Result<Self, MetricsError> {
        match kind {
            MetricsKind::Prometheus => {
                let p = Prometheus::start()
                    .await
                    .map_err(|source| MetricsError::Prometheus {
                        cluster: None,
                        source,
                    })?;
                let api = p.query_api();
                Ok(Self {
                    kind,
                    single: Some(p),
                    stores: Vec::new(),
                    thanos_query: None,
                    api,
                })
            }
            MetricsKind::Thanos => {
                thanos::binary().map_err(|m| MetricsError::Thanos {
                    cluster: None,
                    source: m.into(),
                })?;
                let started = futures::future::join_all(clusters.iter().map(start_store)).await;
                let mut stores = Vec::new();
                for s in started {
                    stores.push(s?);
                }
                let addresses: Vec<&str> = stores.iter().map(|s| s.grpc.as_str()).collect();
                let fail = |source| MetricsError::Thanos {
                    cluster: None,
                    source,
                };
                let query = thanos::query(&addresses).await.map_err(fail)?;
                query
                    .wait_for_stores(&addresses, STORES_READY)
                    .await
                    .map_err(fail)?;
                let api = QueryApi::thanos(query.url());
                Ok(Self {
                    kind,
                    single: None,
                    stores,
                    thanos_query: Some(query),
                    api,
                })
            }
        }
    }

    /// Which backend this is.
    pub fn kind(&self) -> MetricsKind {
        self.kind
    }

    /// Where the operators and scenarios read: the Prometheus, or Thanos Query.
    pub fn url(&self) -> &str {
        self.api.url()
    }

    /// Where `cluster`'s telemetry is remote-written (its Prometheus' base URL); `None` for a
    /// cluster the Thanos backend has no store for.
    pub fn write_url(&self, cluster: &str) -> Option<&str> {
        match &self.single {
            Some(p) => Some(p.url()),
            None => self
                .stores
                .iter()
                .find(|s| s.cluster == cluster)
                .map(|s| s.prometheus.url()),
        }
    }

    /// Remote-writes `series` as `cluster`'s telemetry (into its own Prometheus under Thanos).
    pub async fn write_to(&self, cluster: &str, series: &[Series]) -> Result<(), PrometheusError> {
        let prometheus = match &self.single {
            Some(p) => p,
            None => match self.stores.iter().find(|s| s.cluster == cluster) {
                Some(s) => &s.prometheus,
                None => {
                    return Err(PrometheusError::Query {
                        query: "remote write".into(),
                        reason: format!("the sandbox runs no Prometheus for cluster {cluster}"),
                    });
                }
            },
        };
        prometheus.write(series).await
    }

    /// Instant query through the backend (Thanos: no partial response).
    pub async fn query(
        &self,
        promql: &str,
        at_ms: Option<i64>,
    ) -> Result<Vec<VectorSample>, PrometheusError> {
        self.api.query(promql, at_ms).await
    }

    /// Range query through the backend (Thanos: no partial response).
    pub async fn query_range(
        &self,
        promql: &str,
        start_ms: i64,
        end_ms: i64,
        step: Duration,
    ) -> Result<Vec<RangeSeries>, PrometheusError> {
        self.api.query_range(promql, start_ms, end_ms, step).await
    }

    /// What the narration says about the backend, one line each.
    pub fn describe(&self) -> Vec<String> {
        match self.kind {
            MetricsKind::Prometheus => vec![format!("prometheus: {}", self.url())],
            MetricsKind::Thanos => {
                let mut lines: Vec<String> = self
                    .stores
                    .iter()
                    .map(|s| {
                        format!(
                            "metrics: {} writes to Prometheus {}, served by its Thanos sidecar at {}",
                            s.cluster,
                            s.prometheus.url(),
                            s.grpc
                        )
                    })
                    .collect();
                lines.push(format!(
                    "metrics: the operators read through Thanos Query {} ({} strict stores, no partial response)",
                    self.url(),
                    self.stores.len()
                ));
                lines
            }
        }
    }

    /// Takes `cluster`'s store down (its Thanos sidecar stops; its Prometheus keeps receiving
    /// telemetry). Returns the store's gRPC address, or an error naming why it could not.
    pub fn stop_store(&self, cluster: &str) -> Result<String, String> {
        if self.kind != MetricsKind::Thanos {
            return Err(format!(
                "the {} backend has no per-cluster store to stop",
                self.kind.name()
            ));
        }
        let store = self
            .stores
            .iter()
            .find(|s| s.cluster == cluster)
            .ok_or_else(|| format!("no store for cluster {cluster}"))?;
        let sidecar = store
            .sidecar
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| format!("the store of {cluster} is already down"))?;
        sidecar.stop();
        Ok(store.grpc.clone())
    }

    /// Thanos Query's view of its stores (address, last error); empty for plain Prometheus.
    pub async fn stores(&self) -> Result<Vec<(String, Option<String>)>, String> {
        match &self.thanos_query {
            Some(q) => q.stores().await,
            None => Ok(Vec::new()),
        }
    }

    /// Waits up to `within` for Thanos Query to report `cluster`'s store failing; returns the
    /// error it reports.
    pub async fn store_error(&self, cluster: &str, within: Duration) -> Option<String> {
        let grpc = self
            .stores
            .iter()
            .find(|s| s.cluster == cluster)?
            .grpc
            .clone();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(list) = self.stores().await
                && let Some((_, Some(error))) = list.into_iter().find(|(name, _)| *name == grpc)
            {
                return Some(error);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }
}

async fn start_store(spec: &ClusterSpec) -> Result<Store, MetricsError> {
    let cluster = spec.name.clone();
    let prometheus = Prometheus::start_with_external_labels(&[
        ("cluster", spec.name.as_str()),
        ("site", spec.site.as_str()),
    ])
    .await
    .map_err(|source| MetricsError::Prometheus {
        cluster: Some(cluster.clone()),
        source,
    })?;
    let sidecar = thanos::sidecar(&prometheus)
        .await
        .map_err(|source| MetricsError::Thanos {
            cluster: Some(cluster.clone()),
            source,
        })?;
    let grpc = sidecar.grpc_address().to_string();
    Ok(Store {
        cluster,
        prometheus,
        sidecar: Mutex::new(Some(sidecar)),
        grpc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_cluster_whose_part_failed() {
        let e = MetricsError::Prometheus {
            cluster: Some("east-1".into()),
            source: PrometheusError::BinaryMissing,
        };
        assert!(
            e.to_string()
                .starts_with("starting Prometheus for east-1 failed: prometheus binary not found"),
            "{e}"
        );
        let e = MetricsError::Prometheus {
            cluster: None,
            source: PrometheusError::BinaryMissing,
        };
        assert!(
            e.to_string().starts_with("starting Prometheus failed:"),
            "{e}"
        );
    }
}
