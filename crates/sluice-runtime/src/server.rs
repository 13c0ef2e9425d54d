//! The one HTTP server of an operator: `/metrics` (OpenMetrics text), `/healthz` (the process
//! runs) and `/readyz` (the replica does its job: a leader whose caches are synced, or a
//! standby waiting for the Lease).
//!
//! Owns the health state and its HTTP mapping. Must never expose anything but metrics and
//! health, and never block on the Kubernetes API.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router, extract::State, http::StatusCode, http::header, response::IntoResponse, routing::get,
};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// What `/readyz` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Leader election has not reported yet.
    Starting,
    /// Another replica leads; this one waits for the Lease. Ready, so that a rolling update
    /// of the Deployment is not blocked by the old leader still holding the Lease.
    Standby,
    /// Leader, caches still listing.
    Syncing,
    /// Leader with synced caches, reconciling.
    Ready,
    /// SIGTERM received.
    ShuttingDown,
}

impl Readiness {
    /// Whether `/readyz` answers 200.
    pub fn is_ready(self) -> bool {
        matches!(self, Readiness::Standby | Readiness::Ready)
    }

    /// The body text.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Starting => "starting",
            Readiness::Standby => "standby",
            Readiness::Syncing => "syncing",
            Readiness::Ready => "ready",
            Readiness::ShuttingDown => "shutting down",
        }
    }
}

/// Shared health flags, set by leader election and the controller; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Health {
    inner: Arc<Flags>,
}

#[derive(Debug, Default)]
struct Flags {
    elected: AtomicBool,
    leader: AtomicBool,
    synced: AtomicBool,
    shutting_down: AtomicBool,
}

/// Pure mapping of the flags to readiness.
pub fn readiness(elected: bool, leader: bool, synced: bool, shutting_down: bool) -> Readiness {
    match (shutting_down, elected, leader, synced) {
        (true, ..) => Readiness::ShuttingDown,
        (false, false, ..) => Readiness::Starting,
        (false, true, false, _) => Readiness::Standby,
        (false, true, true, false) => Readiness::Syncing,
        (false, true, true, true) => Readiness::Ready,
    }
}

impl Health {
    /// Records the outcome of leader election (called on every change).
    pub fn set_leader(&self, leader: bool) {
        self.inner.elected.store(true, Ordering::Release);
        self.inner.leader.store(leader, Ordering::Release);
    }

    /// Records whether the controller's caches are synced.
    pub fn set_synced(&self, synced: bool) {
        self.inner.synced.store(synced, Ordering::Release);
    }

    /// Records that shutdown began.
    pub fn set_shutting_down(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
    }

    /// Current readiness.
    pub fn readiness(&self) -> Readiness {
        let f = &self.inner;
        readiness(
            f.elected.load(Ordering::Acquire),
            f.leader.load(Ordering::Acquire),
            f.synced.load(Ordering::Acquire),
            f.shutting_down.load(Ordering::Acquire),
        )
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    health: Health,
}

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS)],
        crate::metrics::encode(&s.registry),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let r = s.health.readiness();
    let code = if r.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, r.as_str())
}

/// The router serving `/metrics`, `/healthz` and `/readyz`.
pub fn router(registry: Arc<Registry>, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, health })
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot listen on {addr} for metrics and health: {source}; change --metrics-addr / SLUICE_METRICS_ADDR"
)]
pub struct ServerError {
    /// The address tried.
    pub addr: SocketAddr,
    /// Bind error.
    #[source]
    pub source: std::io::Error,
}

impl crate::error::Categorized for ServerError {
    fn category(&self) -> crate::error::Category {
        crate::error::Category::Config
    }
}

/// A bound, not yet serving, metrics and health server.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port).
    pub async fn bind(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: Health,
    ) -> Result<Self, ServerError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError { addr, source })?;
        Ok(Self {
            listener,
            router: router(registry, health),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` is cancelled.
    pub fn spawn(self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let result = axum::serve(self.listener, self.router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            if let Err(err) = result {
                tracing::error!(error = %err, "metrics and health server failed");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn readiness_table() {
        use Readiness::*;
        let table = [
            ((false, false, false, false), Starting, false),
            ((true, false, false, false), Standby, true),
            ((true, true, false, false), Syncing, false),
            ((true, true, true, false), Ready, true),
            ((true, true, true, true), ShuttingDown, false),
            ((false, false, false, true), ShuttingDown, false),
        ];
        for ((elected, leader, synced, down), want, ok) in table {
            let got = readiness(elected, leader, synced, down);
            assert_eq!(got, want);
            assert_eq!(got.is_ready(), ok, "{want:?}");
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let mut registry = Registry::default();
        let m = crate::metrics::Metrics::register(&mut registry);
        m.set_leader(true);
        let health = Health::default();
        let server = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(registry),
            health.clone(),
        )
        .await
        .unwrap();
        let addr = server.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = server.spawn(stop.clone());
        let run = async {
            let metrics = get(addr, "/metrics").await;
            assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
            assert!(
                metrics.contains("application/openmetrics-text"),
                "{metrics}"
            );
            assert!(metrics.contains("sluice_leader 1"), "{metrics}");
            assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
            assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
            health.set_leader(true);
            let syncing = get(addr, "/readyz").await;
            assert!(
                syncing.starts_with("HTTP/1.1 503") && syncing.ends_with("syncing"),
                "{syncing}"
            );
            health.set_synced(true);
            let ready = get(addr, "/readyz").await;
            assert!(
                ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready"),
                "{ready}"
            );
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), run)
            .await
            .unwrap();
        stop.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
