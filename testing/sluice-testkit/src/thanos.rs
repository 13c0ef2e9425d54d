//! Real Thanos on loopback for tests: a sidecar beside a [`Prometheus`] (its Store API over gRPC)
//! and Thanos Query over sidecars, each a strict endpoint of `--endpoint.sd-config`, as production
//! runs it: a strict endpoint that goes down stays in the query set, so a query that asks for no
//! partial response fails instead of answering from the stores left (without it, Query drops an
//! unreachable store within seconds and answers from the rest).
//!
//! The binary is built by `bash scripts/install-control-plane.sh` (Thanos from its Go module).
//! Every process is killed and reaped on `Drop`; nothing listens beyond 127.0.0.1.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::prereq::{self, Missing};
use crate::prometheus::Prometheus;

/// The command that builds the binary.
pub const INSTALL: &str = "bash scripts/install-control-plane.sh";
/// The Thanos release the install script builds.
pub const VERSION: &str = "v0.42.5";
/// How long a component may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the Thanos fixture.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ThanosError {
    /// The binary is not installed.
    #[error(transparent)]
    Missing(#[from] Missing),
    /// Preparing the directory or starting the process failed.
    #[error("starting thanos {component} failed: {source}")]
    Io {
        /// sidecar or query.
        component: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// The process exited or never answered `/-/ready`.
    #[error("thanos {component} did not become ready: {reason}; last log lines:\n{log_tail}")]
    NotReady {
        /// sidecar or query.
        component: &'static str,
        /// Why.
        reason: String,
        /// The end of its log.
        log_tail: String,
    },
}

impl ThanosError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// Finds `thanos` in `.tools/bin` or on `PATH`.
pub fn binary() -> Result<PathBuf, Missing> {
    prereq::binary_with("thanos", INSTALL)
}

/// One Thanos process; killed and reaped when dropped.
#[derive(Debug)]
pub struct ThanosProcess {
    child: Child,
    dir: tempfile::TempDir,
    http: String,
    grpc: String,
}

impl Drop for ThanosProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ThanosProcess {
    /// Base URL of its HTTP server (Query serves the Prometheus query API there).
    pub fn url(&self) -> &str {
        &self.http
    }

    /// `127.0.0.1:PORT` of its gRPC server (the Store API of a sidecar).
    pub fn grpc_address(&self) -> &str {
        &self.grpc
    }

    /// Its working directory (logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops it now (a store going down).
    pub fn stop(self) {
        drop(self);
    }

    /// The stores Thanos Query reports (`GET /api/v1/stores`): each store's name (its gRPC
    /// address) and its last error, `None` while it answers.
    pub async fn stores(&self) -> Result<Vec<(String, Option<String>)>, String> {
        #[derive(serde::Deserialize)]
        struct Status {
            name: String,
            #[serde(rename = "lastError")]
            last_error: Option<serde_json::Value>,
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            data: std::collections::BTreeMap<String, Vec<Status>>,
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| e.to_string())?;
        let answer: Answer = http
            .get(format!("{}/api/v1/stores", self.http))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer
            .data
            .into_values()
            .flatten()
            .map(|s| {
                let error = s.last_error.filter(|e| !e.is_null()).map(|e| match e {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                });
                (s.name, error)
            })
            .collect())
    }

    /// Waits until Thanos Query reports every one of `stores` (gRPC addresses) answering.
    pub async fn wait_for_stores(
        &self,
        stores: &[&str],
        within: Duration,
    ) -> Result<(), ThanosError> {
        let deadline = Instant::now() + within;
        loop {
            let seen = self.stores().await;
            let missing: Vec<String> = match &seen {
                Ok(list) => stores
                    .iter()
                    .filter(|want| {
                        !list
                            .iter()
                            .any(|(name, error)| name == *want && error.is_none())
                    })
                    .map(|s| s.to_string())
                    .collect(),
                Err(e) => vec![format!("(stores not readable: {e})")],
            };
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ThanosError::NotReady {
                    component: "query",
                    reason: format!(
                        "stores {} not answering within {within:?} (seen: {seen:?})",
                        missing.join(", ")
                    ),
                    log_tail: tail(&self.dir.path().join("query.log"), 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn start(component: &'static str, args: Vec<String>) -> Result<Self, ThanosError> {
        let binary = binary()?;
        let io = |source| ThanosError::Io { component, source };
        let dir = tempfile::Builder::new()
            .prefix(&format!("sluice-thanos-{component}-"))
            .tempdir()
            .map_err(io)?;
        let log_path = dir.path().join(format!("{component}.log"));
        let log = File::create(&log_path).map_err(io)?;
        let http_port = free_port().map_err(io)?;
        let grpc_port = free_port().map_err(io)?;
        let child = Command::new(&binary)
            .arg(component)
            .arg(format!("--http-address=127.0.0.1:{http_port}"))
            .arg(format!("--grpc-address=127.0.0.1:{grpc_port}"))
            .args(&args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io)?)
            .stderr(log)
            .spawn()
            .map_err(io)?;
        let mut process = Self {
            child,
            dir,
            http: format!("http://127.0.0.1:{http_port}"),
            grpc: format!("127.0.0.1:{grpc_port}"),
        };
        process.wait_ready(component, &log_path).await?;
        Ok(process)
    }

    async fn wait_ready(
        &mut self,
        component: &'static str,
        log_path: &Path,
    ) -> Result<(), ThanosError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("building a plain HTTP client cannot fail");
        let deadline = Instant::now() + READY_TIMEOUT;
        let not_ready = |reason: String| ThanosError::NotReady {
            component,
            reason,
            log_tail: tail(log_path, 20),
        };
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(not_ready(format!("exited with {status}")));
            }
            if let Ok(r) = http.get(format!("{}/-/ready", self.http)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(not_ready(format!(
                    "/-/ready not 200 within {READY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A Thanos sidecar beside `prometheus` (which must have external labels), serving its data over
/// the Store API.
pub async fn sidecar(prometheus: &Prometheus) -> Result<ThanosProcess, ThanosError> {
    ThanosProcess::start(
        "sidecar",
        vec![
            format!("--prometheus.url={}", prometheus.url()),
            format!("--tsdb.path={}", prometheus.dir().join("data").display()),
        ],
    )
    .await
}

/// Thanos Query over `stores` (gRPC addresses), each a strict endpoint of an
/// `--endpoint.sd-config` (the form that replaces the deprecated `--endpoint-strict`); ready
/// once it serves (a strict endpoint that is down keeps failing queries that want no partial
/// response).
pub async fn query(stores: &[&str]) -> Result<ThanosProcess, ThanosError> {
    ThanosProcess::start("query", vec![endpoint_sd_config(stores)]).await
}

/// The `--endpoint.sd-config` argument naming every store as a strict endpoint.
fn endpoint_sd_config(stores: &[&str]) -> String {
    let endpoints: Vec<serde_json::Value> = stores
        .iter()
        .map(|s| serde_json::json!({"address": s, "strict": true}))
        .collect();
    // JSON is YAML: Thanos reads the value with its YAML parser.
    format!(
        "--endpoint.sd-config={}",
        serde_json::json!({ "endpoints": endpoints })
    )
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
