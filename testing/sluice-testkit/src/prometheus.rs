//! Real Prometheus on loopback for tests.
//!
//! Owns one `prometheus` process per fixture: started from the Debian package's binary on
//! 127.0.0.1 and a free port, with a temporary directory holding its configuration and TSDB, the
//! remote-write receiver enabled and an out-of-order window so tests may write samples in the
//! past. It offers a remote-write client and query helpers (instant, range, and the server's own
//! request counters, so tests can count the queries a component sent).
//! It must never leave a process behind: the process is killed and reaped on `Drop`, which also
//! runs while a panicking test unwinds. It never listens on anything but 127.0.0.1.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use crate::remote_write::{RemoteWriteClient, RemoteWriteError, Series};

/// Where the Debian package installs the binary.
const DEBIAN_BINARY: &str = "/usr/bin/prometheus";
/// Environment variable overriding the binary path.
pub const BINARY_ENV: &str = "SLUICE_PROMETHEUS_BIN";
/// How long Prometheus may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How many free-port attempts before giving up (a port may be taken between probe and bind).
const START_ATTEMPTS: usize = 3;
/// Out-of-order window: how far in the past tests may write samples.
const OUT_OF_ORDER_WINDOW: &str = "30d";

/// Errors of the Prometheus fixture.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PrometheusError {
    /// The binary is not installed.
    #[error(
        "prometheus binary not found (looked at ${BINARY_ENV}, {DEBIAN_BINARY} and PATH); install the Debian \
         package `prometheus` (apt-get install -y prometheus) or point ${BINARY_ENV} at a prometheus binary"
    )]
    BinaryMissing,
    /// Creating the temporary directory, config file or log file failed.
    #[error("preparing the Prometheus fixture directory failed: {0}")]
    Io(#[from] std::io::Error),
    /// The process exited or never became ready.
    #[error("prometheus at {url} did not become ready: {reason}; last log lines:\n{log_tail}")]
    NotReady {
        /// Base URL it was started on.
        url: String,
        /// Why it is considered not ready.
        reason: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A query could not be sent or its answer could not be read.
    #[error("query {query:?} to the Prometheus fixture failed: {reason}")]
    Query {
        /// The PromQL sent.
        query: String,
        /// What went wrong (transport, status, or parse).
        reason: String,
    },
    /// Remote write failed.
    #[error(transparent)]
    RemoteWrite(#[from] RemoteWriteError),
}

impl PrometheusError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One element of an instant-vector answer.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorSample {
    /// The series labels (`__name__` included when the query keeps it).
    pub labels: BTreeMap<String, String>,
    /// Evaluation timestamp in seconds since the Unix epoch.
    pub timestamp: f64,
    /// The value.
    pub value: f64,
}

/// One series of a range (matrix) answer.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeSeries {
    /// The series labels.
    pub labels: BTreeMap<String, String>,
    /// `(timestamp seconds, value)` points, oldest first.
    pub points: Vec<(f64, f64)>,
}

/// A running Prometheus; stopped (killed and reaped) when dropped.
pub struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
    url: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("url", &self.url)
            .field("pid", &self.child.id())
            .finish()
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Finds the binary: `$SLUICE_PROMETHEUS_BIN`, the Debian path, then `PATH`.
pub fn binary() -> Result<PathBuf, PrometheusError> {
    find_binary(
        std::env::var_os(BINARY_ENV),
        Path::new(DEBIAN_BINARY),
        std::env::var_os("PATH"),
    )
}

fn find_binary(
    override_path: Option<std::ffi::OsString>,
    debian: &Path,
    path_var: Option<std::ffi::OsString>,
) -> Result<PathBuf, PrometheusError> {
    if let Some(path) = override_path {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(PrometheusError::BinaryMissing)
        };
    }
    if debian.is_file() {
        return Ok(debian.to_path_buf());
    }
    path_var
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file())
        .ok_or(PrometheusError::BinaryMissing)
}

/// The configuration file: no scrape targets (tests remote-write everything) and the
/// out-of-order window that lets tests write older samples.
fn config_yaml(external_labels: &[(&str, &str)]) -> String {
    let mut labels = String::new();
    if !external_labels.is_empty() {
        labels.push_str("  external_labels:\n");
        for (k, v) in external_labels {
            labels.push_str(&format!("    {k}: {}\n", serde_json::Value::from(*v)));
        }
    }
    format!(
        "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n{labels}storage:\n  tsdb:\n    \
         out_of_order_time_window: {OUT_OF_ORDER_WINDOW}\nscrape_configs: []\n"
    )
}

fn free_port() -> Result<u16, std::io::Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[derive(Deserialize)]
struct ApiAnswer {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum ApiData {
    Vector(Vec<ApiVector>),
    Matrix(Vec<ApiMatrix>),
    Scalar((f64, String)),
    String(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct ApiVector {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct ApiMatrix {
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

fn parse_value(raw: &str) -> f64 {
    // Prometheus renders special values as "NaN", "+Inf", "-Inf"; Rust parses "inf" and "NaN".
    match raw {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().unwrap_or(f64::NAN),
    }
}

impl Prometheus {
    /// Starts the fixture, or skips the calling test when the binary is missing (under CI a
    /// missing binary fails the test: see [`crate::prereq`]). Any other failure panics.
    #[track_caller]
    pub fn start_or_skip() -> impl std::future::Future<Output = Option<Self>> {
        let caller = std::panic::Location::caller();
        async move {
            match Self::start().await {
                Ok(fixture) => Some(fixture),
                Err(PrometheusError::BinaryMissing) => {
                    crate::prereq::Missing::new(
                        "the `prometheus` binary",
                        crate::prereq::INSTALL_TOOLS,
                    )
                    .skip();
                    None
                }
                Err(e) => panic!("the prometheus fixture failed to start (at {caller}): {e}"),
            }
        }
    }

    /// Starts Prometheus on 127.0.0.1 and a free port and waits until `/-/ready` answers 200.
    pub async fn start() -> Result<Self, PrometheusError> {
        Self::start_with_external_labels(&[]).await
    }

    /// [`Prometheus::start`] with `global.external_labels` (e.g. `cluster` and `site`), which a
    /// Thanos sidecar requires and Thanos Query adds to every series of this Prometheus.
    pub async fn start_with_external_labels(
        labels: &[(&str, &str)],
    ) -> Result<Self, PrometheusError> {
        let binary = binary()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&binary, labels).await {
                Ok(prometheus) => return Ok(prometheus),
                Err(err @ PrometheusError::NotReady { .. }) => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or(PrometheusError::BinaryMissing))
    }

    async fn start_once(binary: &Path, labels: &[(&str, &str)]) -> Result<Self, PrometheusError> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-prometheus-")
            .tempdir()?;
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_yaml(labels))?;
        let log_path = dir.path().join("prometheus.log");
        let log = File::create(&log_path)?;
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg("--storage.tsdb.retention.time=90d")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .expect("building a plain HTTP client cannot fail");
        // From here on, Drop owns the process: an early return kills it.
        let mut prometheus = Self {
            child,
            dir,
            url,
            http,
        };
        prometheus.wait_ready(&log_path).await?;
        Ok(prometheus)
    }

    async fn wait_ready(&mut self, log_path: &Path) -> Result<(), PrometheusError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let ready_url = format!("{}/-/ready", self.url);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(PrometheusError::NotReady {
                    url: self.url.clone(),
                    reason: format!("process exited with {status}"),
                    log_tail: tail(log_path, 20),
                });
            }
            if let Ok(response) = self
                .http
                .get(&ready_url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                && response.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(PrometheusError::NotReady {
                    url: self.url.clone(),
                    reason: format!("/-/ready not 200 within {READY_TIMEOUT:?}"),
                    log_tail: tail(log_path, 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The process id (tests use it to prove the process is gone after drop).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The fixture's temporary directory (config, data, `prometheus.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A remote-write client for this Prometheus.
    pub fn remote_write(&self) -> RemoteWriteClient {
        RemoteWriteClient::new(&self.url)
    }

    /// Writes synthetic series (shortcut for `remote_write().write(..)`).
    pub async fn write(&self, series: &[Series]) -> Result<(), PrometheusError> {
        Ok(self.remote_write().write(series).await?)
    }

    /// The query API of this Prometheus (what [`Prometheus::query`] and
    /// [`Prometheus::query_range`] use).
    pub fn query_api(&self) -> QueryApi {
        QueryApi {
            url: self.url.clone(),
            http: self.http.clone(),
            partial_response: None,
        }
    }

    /// Instant query at `at_ms` (milliseconds since the epoch; now when `None`).
    /// A scalar answer is returned as one sample without labels.
    pub async fn query(
        &self,
        promql: &str,
        at_ms: Option<i64>,
    ) -> Result<Vec<VectorSample>, PrometheusError> {
        self.query_api().query(promql, at_ms).await
    }

    /// Range query from `start_ms` to `end_ms` with resolution `step`.
    pub async fn query_range(
        &self,
        promql: &str,
        start_ms: i64,
        end_ms: i64,
        step: Duration,
    ) -> Result<Vec<RangeSeries>, PrometheusError> {
        self.query_api()
            .query_range(promql, start_ms, end_ms, step)
            .await
    }

    /// How many HTTP requests this Prometheus has served on `handler` (e.g. `/api/v1/query`),
    /// read from its own `/metrics` (`prometheus_http_requests_total`, summed over status codes).
    /// Lets a test count the queries a component sent without a proxy in between.
    pub async fn http_requests(&self, handler: &str) -> Result<u64, PrometheusError> {
        let fail = |reason: String| PrometheusError::Query {
            query: format!("/metrics handler={handler}"),
            reason,
        };
        let body = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .map_err(|e| fail(format!("transport: {e}")))?
            .text()
            .await
            .map_err(|e| fail(format!("reading body: {e}")))?;
        Ok(count_requests(&body, handler))
    }
}

/// The Prometheus HTTP query API at a URL: a Prometheus, or Thanos Query (which serves the same
/// API over its stores and takes `partial_response`).
#[derive(Clone, Debug)]
pub struct QueryApi {
    url: String,
    http: reqwest::Client,
    partial_response: Option<bool>,
}

impl QueryApi {
    /// The query API at `url` (e.g. `http://127.0.0.1:9090`).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .no_proxy()
                .build()
                .expect("building a plain HTTP client cannot fail"),
            partial_response: None,
        }
    }

    /// Thanos Query at `url`, asked for no partial response: a query fails while a store it
    /// needs is down instead of answering from the stores left (Thanos Query's default is a
    /// partial response).
    pub fn thanos(url: impl Into<String>) -> Self {
        Self {
            partial_response: Some(false),
            ..Self::new(url)
        }
    }

    /// Base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn api(
        &self,
        path: &str,
        query: &str,
        params: &[(&str, String)],
    ) -> Result<ApiData, PrometheusError> {
        let fail = |reason: String| PrometheusError::Query {
            query: query.to_string(),
            reason,
        };
        let mut form: Vec<(&str, String)> = vec![("query", query.to_string())];
        form.extend(params.iter().cloned());
        if let Some(p) = self.partial_response {
            form.push(("partial_response", p.to_string()));
        }
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .form(&form)
            .send()
            .await
            .map_err(|e| fail(format!("transport: {e}")))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| fail(format!("reading body: {e}")))?;
        let answer: ApiAnswer = serde_json::from_str(&body)
            .map_err(|e| fail(format!("HTTP {status}, unparsable body ({e}): {body}")))?;
        if answer.status != "success" {
            return Err(fail(format!(
                "HTTP {status}: {}",
                answer.error.unwrap_or(body)
            )));
        }
        answer
            .data
            .ok_or_else(|| fail("answer without data".into()))
    }

    /// Instant query at `at_ms` (milliseconds since the epoch; now when `None`).
    /// A scalar answer is returned as one sample without labels.
    pub async fn query(
        &self,
        promql: &str,
        at_ms: Option<i64>,
    ) -> Result<Vec<VectorSample>, PrometheusError> {
        let mut params = Vec::new();
        if let Some(at) = at_ms {
            params.push(("time", format!("{:.3}", at as f64 / 1000.0)));
        }
        match self.api("/api/v1/query", promql, &params).await? {
            ApiData::Vector(v) => Ok(v
                .into_iter()
                .map(|s| VectorSample {
                    labels: s.metric,
                    timestamp: s.value.0,
                    value: parse_value(&s.value.1),
                })
                .collect()),
            ApiData::Scalar((t, v)) => Ok(vec![VectorSample {
                labels: BTreeMap::new(),
                timestamp: t,
                value: parse_value(&v),
            }]),
            ApiData::Matrix(_) | ApiData::String(_) => Err(PrometheusError::Query {
                query: promql.to_string(),
                reason: "expected an instant vector or scalar".into(),
            }),
        }
    }

    /// Range query from `start_ms` to `end_ms` with resolution `step`.
    pub async fn query_range(
        &self,
        promql: &str,
        start_ms: i64,
        end_ms: i64,
        step: Duration,
    ) -> Result<Vec<RangeSeries>, PrometheusError> {
        let params = [
            ("start", format!("{:.3}", start_ms as f64 / 1000.0)),
            ("end", format!("{:.3}", end_ms as f64 / 1000.0)),
            ("step", format!("{:.3}", step.as_secs_f64())),
        ];
        match self.api("/api/v1/query_range", promql, &params).await? {
            ApiData::Matrix(m) => Ok(m
                .into_iter()
                .map(|s| RangeSeries {
                    labels: s.metric,
                    points: s
                        .values
                        .into_iter()
                        .map(|(t, v)| (t, parse_value(&v)))
                        .collect(),
                })
                .collect()),
            _ => Err(PrometheusError::Query {
                query: promql.to_string(),
                reason: "expected a matrix".into(),
            }),
        }
    }
}

/// Sums `prometheus_http_requests_total` over status codes for one handler in exposition text.
fn count_requests(exposition: &str, handler: &str) -> u64 {
    let needle = format!("handler=\"{handler}\"");
    exposition
        .lines()
        .filter(|line| {
            line.starts_with("prometheus_http_requests_total{") && line.contains(&needle)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Prometheus spawns no children, so killing and reaping the one process leaves nothing behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_requests_sums_status_codes_of_one_handler() {
        let text = "# HELP prometheus_http_requests_total Counter\n\
            prometheus_http_requests_total{code=\"200\",handler=\"/api/v1/query\"} 7\n\
            prometheus_http_requests_total{code=\"400\",handler=\"/api/v1/query\"} 2\n\
            prometheus_http_requests_total{code=\"200\",handler=\"/api/v1/query_range\"} 5\n";
        let cases = [
            ("/api/v1/query", 9),
            ("/api/v1/query_range", 5),
            ("/api/v1/write", 0),
        ];
        for (handler, want) in cases {
            assert_eq!(count_requests(text, handler), want, "{handler}");
        }
    }

    #[test]
    fn config_sets_the_out_of_order_window() {
        assert!(config_yaml(&[]).contains("out_of_order_time_window: 30d"));
    }

    #[test]
    fn special_values_parse() {
        assert_eq!(parse_value("+Inf"), f64::INFINITY);
        assert_eq!(parse_value("-Inf"), f64::NEG_INFINITY);
        assert!(parse_value("NaN").is_nan());
        assert_eq!(parse_value("1.5"), 1.5);
    }

    fn process_alive(pid: u32) -> bool {
        // A reaped process has no /proc entry; a zombie would show state Z.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| stat.split(' ').nth(2).is_none_or(|state| state != "Z"))
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn ingests_remote_written_samples_and_answers_instant_and_range_queries() {
        let prom = Prometheus::start().await.expect("start prometheus");
        let now = now_ms();
        let start = now - 10 * 60_000;
        // A counter growing 2/s for ten minutes, an hour in the past (needs the out-of-order window
        // only for the older series below, written after the newer one).
        prom.write(&[Series::new("sluice_test_requests_total")
            .label("service", "checkout")
            .counter(start, now, Duration::from_secs(15), 0.0, 2.0)])
            .await
            .unwrap();
        let old = now - 3_600_000;
        prom.write(&[Series::new("sluice_test_requests_total")
            .label("service", "old")
            .gauge(old, old + 60_000, Duration::from_secs(15), 42.0)])
            .await
            .unwrap();

        let rate = prom
            .query(
                "rate(sluice_test_requests_total{service=\"checkout\"}[5m])",
                Some(now),
            )
            .await
            .unwrap();
        assert_eq!(rate.len(), 1);
        assert!((rate[0].value - 2.0).abs() < 1e-6, "rate {}", rate[0].value);
        assert_eq!(
            rate[0].labels.get("service").map(String::as_str),
            Some("checkout")
        );

        let older = prom
            .query(
                "sluice_test_requests_total{service=\"old\"}",
                Some(old + 30_000),
            )
            .await
            .unwrap();
        assert_eq!(
            older.len(),
            1,
            "sample written an hour in the past is queryable"
        );
        assert_eq!(older[0].value, 42.0);

        let range = prom
            .query_range(
                "sluice_test_requests_total{service=\"checkout\"}",
                start,
                start + 60_000,
                Duration::from_secs(15),
            )
            .await
            .unwrap();
        assert_eq!(range.len(), 1);
        let values: Vec<f64> = range[0].points.iter().map(|p| p.1).collect();
        assert_eq!(values, [0.0, 30.0, 60.0, 90.0, 120.0]);

        let empty = prom
            .query("sluice_test_requests_total{service=\"absent\"}", Some(now))
            .await
            .unwrap();
        assert!(empty.is_empty());

        let before = prom.http_requests("/api/v1/query").await.unwrap();
        prom.query("vector(1)", None).await.unwrap();
        prom.query("vector(2)", None).await.unwrap();
        assert_eq!(
            prom.http_requests("/api/v1/query").await.unwrap(),
            before + 2
        );

        let bad = prom.query("sum(", None).await.unwrap_err();
        assert_eq!(bad.category(), "query");
    }

    #[tokio::test]
    async fn drop_leaves_no_process_even_when_a_test_panics() {
        let prom = Prometheus::start().await.expect("start prometheus");
        let pid = prom.pid();
        assert!(process_alive(pid));
        let joined = tokio::spawn(async move {
            let _held = prom;
            panic!("test body fails while holding the fixture");
        })
        .await;
        assert!(joined.is_err(), "the task panicked");
        assert!(
            !process_alive(pid),
            "prometheus {pid} still running after the panicking test unwound"
        );
    }

    #[test]
    fn binary_lookup_and_missing_binary_message() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("prometheus");
        std::fs::write(&fake, "").unwrap();
        let nowhere = Path::new("/nonexistent/prometheus");
        let path_with_fake = Some(dir.path().as_os_str().to_owned());
        type Case<'a> = (
            Option<std::ffi::OsString>,
            &'a Path,
            Option<std::ffi::OsString>,
            Option<&'a Path>,
        );
        let cases: [Case; 4] = [
            (Some(fake.clone().into()), nowhere, None, Some(&fake)),
            (Some(nowhere.into()), &fake, path_with_fake.clone(), None),
            (None, nowhere, path_with_fake, Some(&fake)),
            (None, nowhere, Some("/nonexistent".into()), None),
        ];
        for (over, debian, path, want) in cases {
            match (find_binary(over, debian, path), want) {
                (Ok(found), Some(want)) => assert_eq!(found, want),
                (Err(err), None) => {
                    assert!(
                        err.to_string().contains("Debian package `prometheus`"),
                        "{err}"
                    );
                    assert!(
                        err.to_string().contains("apt-get install -y prometheus"),
                        "{err}"
                    );
                }
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
    }
}
