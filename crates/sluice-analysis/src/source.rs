//! The metrics provider: instant queries against the Prometheus HTTP API (`/api/v1/query`; range
//! queries on `/api/v1/query_range` only for the optional Mann–Whitney comparison), compatible
//! with Thanos Query.
//!
//! Owns transport concerns only: a per-attempt timeout covering the whole answer, body included
//! (also sent as the `timeout` parameter so the server gives up too), a deadline for the whole
//! query, retries included, an answer size cap (bytes counted as they arrive), retries with
//! jittered exponential backoff on transient failures (transport errors, timeouts, HTTP 429 and
//! 5xx), a limit on concurrent requests (a slot is held only while a request is in flight, never
//! across a retry's sleep), and Thanos' optional `partial_response` and `dedup` parameters. It never interprets a result (no verdicts here) and
//! never retries a query the server rejected as invalid (HTTP 400/422).
//!
//! Also owns reaching an authenticated provider (Thanos behind a proxy, Mimir, Grafana Cloud): a
//! bearer token file or basic auth (username and password file), both files read again for
//! every request so a rotated projected token or Secret is used without a restart; extra
//! headers (`X-Scope-OrgID`); a CA file trusted in addition to the system roots. The flags every
//! operator takes for them are [`crate::args::MetricsSourceArgs`]. An answer that carries
//! warnings is an error ([`SourceError::Warned`]): a gate never judges on data its provider
//! flags as possibly incomplete or wrong, and the warnings reach the verdict's message.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use serde::Deserialize;
use tokio::sync::Semaphore;

/// One series of an instant-vector answer.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesValue {
    /// The series labels.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// One series of a range (matrix) answer.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeValues {
    /// The series labels.
    pub labels: BTreeMap<String, String>,
    /// `(timestamp in milliseconds, value)` points, oldest first.
    pub points: Vec<(i64, f64)>,
}

/// Why a query failed.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum SourceError {
    /// No answer within the timeout.
    #[error(
        "query to {url} timed out after {timeout:?} ({attempts} attempts); the provider is slow or overloaded"
    )]
    Timeout {
        /// The query endpoint.
        url: String,
        /// The per-attempt timeout.
        timeout: Duration,
        /// Attempts made.
        attempts: u32,
    },
    /// The connection failed (provider down, DNS, TLS).
    #[error(
        "query to {url} failed after {attempts} attempts: {message}; check that the provider is reachable"
    )]
    Transport {
        /// The query endpoint.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The transport error.
        message: String,
    },
    /// The provider answered with an error (bad query, execution error, overload).
    #[error("query to {url} was rejected with HTTP {status} ({error_type}): {message}")]
    Rejected {
        /// The query endpoint.
        url: String,
        /// HTTP status.
        status: u16,
        /// Prometheus' `errorType` (bad_data, execution, timeout, ...), or `http`.
        error_type: String,
        /// Prometheus' `error`, or the body.
        message: String,
    },
    /// The answer could not be read.
    #[error("answer from {url} could not be read: {message}")]
    Decode {
        /// The query endpoint.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// The provider answered, but flagged the answer with warnings (a store or a replica did not
    /// answer, a limit was hit): the data may be incomplete, so no gate judges on it.
    #[error(
        "query to {url} answered with warnings, so the answer may be incomplete and is not used: {}",
        warnings.join("; ")
    )]
    #[strum(serialize = "warnings")]
    Warned {
        /// The query endpoint.
        url: String,
        /// The provider's `warnings`.
        warnings: Vec<String>,
    },
    /// The source's own settings are unusable (a credentials or CA file cannot be read, a header
    /// is malformed); nothing was sent.
    #[error("the metrics source {url} cannot be used: {message}")]
    Config {
        /// The provider's base URL.
        url: String,
        /// What is wrong, naming the setting.
        message: String,
    },
}

impl SourceError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        self.into()
    }

    /// Whether this is a timeout (the verdict reason is then `Timeout`, otherwise `QueryError`).
    pub fn is_timeout(&self) -> bool {
        match self {
            SourceError::Timeout { .. } => true,
            SourceError::Rejected { error_type, .. } => error_type == "timeout",
            _ => false,
        }
    }
}

/// Something that answers instant PromQL queries. The engine is generic over it so tests and
/// benchmarks can count or fake queries.
pub trait MetricsSource: Send + Sync {
    /// Evaluates `promql` at `at`.
    fn query(
        &self,
        promql: &str,
        at: Timestamp,
    ) -> impl Future<Output = Result<Vec<SeriesValue>, SourceError>> + Send;

    /// Evaluates `promql` at every `step` from `start` to `end` (used only by the optional
    /// Mann–Whitney comparison).
    fn query_range(
        &self,
        promql: &str,
        start: Timestamp,
        end: Timestamp,
        step: Duration,
    ) -> impl Future<Output = Result<Vec<RangeValues>, SourceError>> + Send;
}

/// Settings of a [`PrometheusSource`].
#[derive(Clone, Debug, PartialEq)]
pub struct PrometheusConfig {
    /// Base URL of Prometheus or Thanos Query, e.g. `http://thanos-query.monitoring:9090`.
    pub url: String,
    /// Timeout of one attempt. Default 10 s.
    pub timeout: Duration,
    /// Retries after the first attempt on transient failures. Default 2.
    pub retries: u32,
    /// Delay before the first retry; doubles on each further retry. Default 200 ms.
    pub backoff: Duration,
    /// Most queries in flight at once. Default 8.
    pub max_concurrency: usize,
    /// Thanos `partial_response` (answer even when a store is down). Default: `false`, sent on
    /// every query: Thanos Query's own default answers from the stores left when one is down
    /// (HTTP 200 with a warning), and a gate judging a fleet on the clusters that still answer
    /// could pass; with `false` such a query fails and the gate gets no value. Prometheus
    /// ignores the parameter. `None` sends nothing.
    pub partial_response: Option<bool>,
    /// Thanos `dedup` (merge replicas). Default: not sent.
    pub dedup: Option<bool>,
    /// Deadline of one query, all attempts and back-off included. Default 30 s.
    pub deadline: Duration,
    /// Largest answer read, in bytes; a larger one is an error (never retried). Default 16 MiB.
    pub max_response_bytes: u64,
    /// File holding a bearer token sent as `Authorization: Bearer`, read again for every request
    /// (a projected service account token or a Secret rotates in place). Default: none.
    pub bearer_token_file: Option<PathBuf>,
    /// HTTP basic auth (Grafana Cloud, an authenticating proxy). Default: none.
    pub basic_auth: Option<BasicAuth>,
    /// Extra headers sent with every request, e.g. `("X-Scope-OrgID", "tenant-a")` for Mimir or
    /// Cortex. Default: none.
    pub headers: Vec<(String, String)>,
    /// PEM file of CA certificates trusted in addition to the system roots, for a provider
    /// served with a private CA. Read when the source is built. Default: none.
    pub ca_file: Option<PathBuf>,
}

/// HTTP basic auth of a [`PrometheusConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct BasicAuth {
    /// The username.
    pub username: String,
    /// File holding the password, read again for every request.
    pub password_file: PathBuf,
}

impl From<&str> for PrometheusConfig {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for PrometheusConfig {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl PrometheusConfig {
    /// Defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: Duration::from_secs(10),
            retries: 2,
            backoff: Duration::from_millis(200),
            max_concurrency: 8,
            partial_response: Some(false),
            dedup: None,
            deadline: Duration::from_secs(30),
            max_response_bytes: 16 << 20,
            bearer_token_file: None,
            basic_auth: None,
            headers: Vec::new(),
            ca_file: None,
        }
    }

    /// Checks everything the source will need before the first query: the HTTP client builds
    /// (the CA file parses, the headers are valid) and the credentials files can be read. An
    /// operator calls this at start so a wrong setting stops it with the reason.
    pub fn check(&self) -> Result<(), SourceError> {
        build_client(self).map_err(|message| self.config_error(message))?;
        if let Some(path) = &self.bearer_token_file {
            read_secret_blocking(path, "bearer token file").map_err(|m| self.config_error(m))?;
        }
        if let Some(auth) = &self.basic_auth {
            read_secret_blocking(&auth.password_file, "password file")
                .map_err(|m| self.config_error(m))?;
        }
        Ok(())
    }

    fn config_error(&self, message: String) -> SourceError {
        SourceError::Config {
            url: self.url.clone(),
            message,
        }
    }
}

/// The HTTP client for `config`: the per-attempt timeout, the extra headers, the CA file.
fn build_client(config: &PrometheusConfig) -> Result<reqwest::Client, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &config.headers {
        let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header name {name:?} is not a valid HTTP header name"))?;
        if header == reqwest::header::AUTHORIZATION {
            return Err(
                "the Authorization header is set by the bearer token file or basic auth, not as \
                 an extra header"
                    .into(),
            );
        }
        let mut value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name} is not a valid HTTP header value"))?;
        value.set_sensitive(true);
        headers.append(header, value);
    }
    let mut builder = reqwest::Client::builder()
        .timeout(config.timeout)
        .default_headers(headers);
    if let Some(path) = &config.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| format!("CA file {}: {e}; mount the CA there", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            format!(
                "CA file {}: not PEM certificates: {}",
                path.display(),
                error_chain(&e)
            )
        })?;
        if certs.is_empty() {
            return Err(format!(
                "CA file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ));
        }
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .map_err(|e| format!("the HTTP client cannot be built: {}", error_chain(&e)))
}

/// Reads a credentials file (trailing newline dropped); an empty file is an error.
fn read_secret_blocking(path: &Path, what: &str) -> Result<String, String> {
    secret_text(path, what, std::fs::read_to_string(path))
}

async fn read_secret(path: &Path, what: &str) -> Result<String, String> {
    secret_text(path, what, tokio::fs::read_to_string(path).await)
}

fn secret_text(path: &Path, what: &str, read: std::io::Result<String>) -> Result<String, String> {
    let text =
        read.map_err(|e| format!("{what} {}: {e}; mount the Secret there", path.display()))?;
    let text = text.trim_end_matches(['\r', '\n']).to_string();
    if text.is_empty() {
        return Err(format!("{what} {} is empty", path.display()));
    }
    Ok(text)
}

/// An error and its causes, outermost first (reqwest's own message omits the TLS reason).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// A random delay in `[d/2, d]`, so queries that failed together do not retry in lock-step.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = d / 2;
    half + half.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
}

/// A [`MetricsSource`] over the Prometheus HTTP API.
#[derive(Clone, Debug)]
pub struct PrometheusSource {
    config: PrometheusConfig,
    endpoint: String,
    range_endpoint: String,
    /// The client, or why the settings could not make one (every query then fails with it).
    http: Result<reqwest::Client, String>,
    permits: Arc<Semaphore>,
    sent: Arc<AtomicU64>,
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Vector(Vec<VectorItem>),
    Scalar((f64, String)),
    Matrix(Vec<MatrixItem>),
    String(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct MatrixItem {
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

#[derive(Deserialize)]
struct VectorItem {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

fn parse_value(raw: &str) -> f64 {
    match raw {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().unwrap_or(f64::NAN),
    }
}

/// Parses a Prometheus API answer and checks its status.
fn parse_data(url: &str, status: u16, body: &str) -> Result<Option<Data>, SourceError> {
    if status == 401 || status == 403 {
        return Err(SourceError::Rejected {
            url: url.to_string(),
            status,
            error_type: "unauthorized".into(),
            message: format!(
                "{}; the provider refused the credentials: check the bearer token file, the basic \
                 auth username and password file, and the tenant header",
                truncate(body).trim()
            ),
        });
    }
    let answer: Answer = serde_json::from_str(body).map_err(|e| {
        if (200..300).contains(&status) {
            SourceError::Decode {
                url: url.to_string(),
                message: format!("{e}: {}", truncate(body)),
            }
        } else {
            SourceError::Rejected {
                url: url.to_string(),
                status,
                error_type: "http".into(),
                message: truncate(body),
            }
        }
    })?;
    if answer.status != "success" {
        return Err(SourceError::Rejected {
            url: url.to_string(),
            status,
            error_type: answer.error_type.unwrap_or_else(|| "unknown".into()),
            message: answer.error.unwrap_or_default(),
        });
    }
    if !answer.warnings.is_empty() {
        return Err(SourceError::Warned {
            url: url.to_string(),
            warnings: answer.warnings.iter().map(|w| truncate(w)).collect(),
        });
    }
    Ok(answer.data)
}

/// Parses an instant-query answer into series.
fn parse_answer(url: &str, status: u16, body: &str) -> Result<Vec<SeriesValue>, SourceError> {
    match parse_data(url, status, body)? {
        Some(Data::Vector(items)) => Ok(items
            .into_iter()
            .map(|i| SeriesValue {
                labels: i.metric,
                value: parse_value(&i.value.1),
            })
            .collect()),
        Some(Data::Scalar((_, v))) => Ok(vec![SeriesValue {
            labels: BTreeMap::new(),
            value: parse_value(&v),
        }]),
        Some(Data::Matrix(_)) | Some(Data::String(_)) | None => Err(SourceError::Decode {
            url: url.to_string(),
            message: "expected an instant vector; a gate query must not return a range or a string"
                .into(),
        }),
    }
}

/// Parses a range-query answer into series.
fn parse_range_answer(url: &str, status: u16, body: &str) -> Result<Vec<RangeValues>, SourceError> {
    match parse_data(url, status, body)? {
        Some(Data::Matrix(items)) => Ok(items
            .into_iter()
            .map(|i| RangeValues {
                labels: i.metric,
                points: i
                    .values
                    .into_iter()
                    .map(|(t, v)| ((t * 1000.0).round() as i64, parse_value(&v)))
                    .collect(),
            })
            .collect()),
        _ => Err(SourceError::Decode {
            url: url.to_string(),
            message: "expected a matrix from a range query".into(),
        }),
    }
}

fn truncate(body: &str) -> String {
    body.chars().take(512).collect()
}

impl PrometheusSource {
    /// A source for `config`.
    ///
    /// Never fails: settings that cannot make a client (an unreadable CA file, a malformed
    /// header) fail every query with [`SourceError::Config`]. Call
    /// [`PrometheusConfig::check`] first to stop on them at start.
    pub fn new(config: PrometheusConfig) -> Self {
        let http = build_client(&config);
        let base = config.url.trim_end_matches('/');
        let endpoint = format!("{base}/api/v1/query");
        let range_endpoint = format!("{base}/api/v1/query_range");
        let permits = Arc::new(Semaphore::new(config.max_concurrency.max(1)));
        Self {
            config,
            endpoint,
            range_endpoint,
            http,
            permits,
            sent: Arc::new(AtomicU64::new(0)),
        }
    }

    /// HTTP requests sent so far (attempts, retries included).
    pub fn requests_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn params(&self, promql: &str, at: Timestamp) -> Vec<(&'static str, String)> {
        let mut params = vec![("time", seconds(at))];
        params.extend(self.common_params(promql));
        params
    }

    fn range_params(
        &self,
        promql: &str,
        start: Timestamp,
        end: Timestamp,
        step: Duration,
    ) -> Vec<(&'static str, String)> {
        let mut params = vec![
            ("start", seconds(start)),
            ("end", seconds(end)),
            ("step", format!("{:.3}", step.as_secs_f64())),
        ];
        params.extend(self.common_params(promql));
        params
    }

    fn common_params(&self, promql: &str) -> Vec<(&'static str, String)> {
        let mut params = vec![
            ("query", promql.to_string()),
            ("timeout", format!("{}ms", self.config.timeout.as_millis())),
        ];
        if let Some(p) = self.config.partial_response {
            params.push(("partial_response", p.to_string()));
        }
        if let Some(d) = self.config.dedup {
            params.push(("dedup", d.to_string()));
        }
        params
    }

    /// One HTTP attempt, at most `timeout` long, answer included; the error says whether it may
    /// be retried.
    async fn attempt(
        &self,
        endpoint: &str,
        params: &[(&str, String)],
    ) -> Result<(u16, String), (bool, SourceError)> {
        let timed_out = || SourceError::Timeout {
            url: endpoint.to_string(),
            timeout: self.config.timeout,
            attempts: 1,
        };
        tokio::time::timeout(
            self.config.timeout,
            self.attempt_unbounded(endpoint, params),
        )
        .await
        .unwrap_or_else(|_| Err((true, timed_out())))
    }

    /// The request for `params`, with the credentials as the files hold them now.
    async fn request(
        &self,
        endpoint: &str,
        params: &[(&str, String)],
    ) -> Result<reqwest::RequestBuilder, SourceError> {
        let http = self
            .http
            .as_ref()
            .map_err(|message| self.config.config_error(message.clone()))?;
        let mut request = http.post(endpoint).form(params);
        if let Some(path) = &self.config.bearer_token_file {
            let token = read_secret(path, "bearer token file")
                .await
                .map_err(|m| self.config.config_error(m))?;
            request = request.bearer_auth(token);
        }
        if let Some(auth) = &self.config.basic_auth {
            let password = read_secret(&auth.password_file, "password file")
                .await
                .map_err(|m| self.config.config_error(m))?;
            request = request.basic_auth(&auth.username, Some(password));
        }
        Ok(request)
    }

    async fn attempt_unbounded(
        &self,
        endpoint: &str,
        params: &[(&str, String)],
    ) -> Result<(u16, String), (bool, SourceError)> {
        let request = self
            .request(endpoint, params)
            .await
            .map_err(|e| (false, e))?;
        self.sent.fetch_add(1, Ordering::Relaxed);
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                SourceError::Timeout {
                    url: endpoint.to_string(),
                    timeout: self.config.timeout,
                    attempts: 1,
                }
            } else {
                SourceError::Transport {
                    url: endpoint.to_string(),
                    attempts: 1,
                    message: transport_message(&e),
                }
            }
        };
        let response = request.send().await.map_err(|e| (true, transport(e)))?;
        let status = response.status().as_u16();
        let max = self.config.max_response_bytes;
        let mut response = response;
        let mut bytes: Vec<u8> = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| (true, transport(e)))? {
            if bytes.len() as u64 + chunk.len() as u64 > max {
                return Err((
                    false,
                    SourceError::Decode {
                        url: endpoint.to_string(),
                        message: format!(
                            "the answer is larger than {max} bytes; narrow the query (fewer \
                             series) or raise the answer cap"
                        ),
                    },
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Sends `params` to `endpoint` with the concurrency limit, retries and backoff, within the
    /// query deadline, and parses the answer with `parse`.
    async fn send<T>(
        &self,
        endpoint: &str,
        params: &[(&str, String)],
        parse: impl Fn(&str, u16, &str) -> Result<T, SourceError>,
    ) -> Result<T, SourceError> {
        let deadline = self.config.deadline;
        match tokio::time::timeout(deadline, self.send_unbounded(endpoint, params, parse)).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::Timeout {
                url: endpoint.to_string(),
                timeout: deadline,
                attempts: 0,
            }),
        }
    }

    async fn send_unbounded<T>(
        &self,
        endpoint: &str,
        params: &[(&str, String)],
        parse: impl Fn(&str, u16, &str) -> Result<T, SourceError>,
    ) -> Result<T, SourceError> {
        let mut delay = self.config.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // A slot only while the request is in flight: released before any retry's sleep.
            let permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| SourceError::Transport {
                    url: endpoint.to_string(),
                    attempts: 0,
                    message: "the source was shut down".into(),
                })?;
            let outcome = match self.attempt(endpoint, params).await {
                Ok((status, text)) => {
                    parse(endpoint, status, &text).map_err(|e| (status == 429 || status >= 500, e))
                }
                Err(e) => Err(e),
            };
            drop(permit);
            match outcome {
                Ok(value) => return Ok(value),
                Err((retryable, error)) => {
                    if !retryable || attempt > self.config.retries {
                        return Err(with_attempts(error, attempt));
                    }
                    tracing::debug!(attempt, error = %error, "metrics query failed, retrying");
                    tokio::time::sleep(jitter(delay)).await;
                    delay = delay.saturating_mul(2);
                }
            }
        }
    }
}

/// A transport error with its causes, and what to check when TLS verification refused the
/// provider's certificate.
fn transport_message(error: &reqwest::Error) -> String {
    let chain = error_chain(error);
    let lower = chain.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("unknownissuer") {
        format!(
            "{chain} (the provider's TLS certificate is not trusted: give the CA that signed it \
             as the CA file, --prometheus-ca-file)"
        )
    } else {
        chain
    }
}

fn seconds(at: Timestamp) -> String {
    format!("{:.3}", at.as_millisecond() as f64 / 1000.0)
}

fn with_attempts(error: SourceError, attempts: u32) -> SourceError {
    match error {
        SourceError::Timeout { url, timeout, .. } => SourceError::Timeout {
            url,
            timeout,
            attempts,
        },
        SourceError::Transport { url, message, .. } => SourceError::Transport {
            url,
            attempts,
            message,
        },
        other => other,
    }
}

impl MetricsSource for PrometheusSource {
    async fn query(&self, promql: &str, at: Timestamp) -> Result<Vec<SeriesValue>, SourceError> {
        self.send(&self.endpoint, &self.params(promql, at), parse_answer)
            .await
    }

    async fn query_range(
        &self,
        promql: &str,
        start: Timestamp,
        end: Timestamp,
        step: Duration,
    ) -> Result<Vec<RangeValues>, SourceError> {
        self.send(
            &self.range_endpoint,
            &self.range_params(promql, start, end, step),
            parse_range_answer,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_category() {
        let url = || "http://prometheus:9090/api/v1/query".to_owned();
        let message = String::new;
        let cases = [
            (
                SourceError::Timeout {
                    url: url(),
                    timeout: Duration::from_secs(1),
                    attempts: 1,
                },
                "timeout",
            ),
            (
                SourceError::Transport {
                    url: url(),
                    attempts: 1,
                    message: message(),
                },
                "transport",
            ),
            (
                SourceError::Rejected {
                    url: url(),
                    status: 400,
                    error_type: "bad_data".into(),
                    message: message(),
                },
                "rejected",
            ),
            (
                SourceError::Decode {
                    url: url(),
                    message: message(),
                },
                "decode",
            ),
            (
                SourceError::Warned {
                    url: url(),
                    warnings: Vec::new(),
                },
                "warnings",
            ),
            (
                SourceError::Config {
                    url: url(),
                    message: message(),
                },
                "config",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.category(), want, "{err:?}");
        }
    }

    #[test]
    fn parse_answer_table() {
        let url = "http://p/api/v1/query";
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"b"},"value":[1,"2.5"]},{"metric":{},"value":[1,"NaN"]}]}}"#;
        let got = parse_answer(url, 200, vector).unwrap();
        assert_eq!(got[0].labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(got[0].value, 2.5);
        assert!(got[1].value.is_nan());
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1,"+Inf"]}}"#;
        assert_eq!(
            parse_answer(url, 200, scalar).unwrap()[0].value,
            f64::INFINITY
        );

        let cases: &[(u16, &str, &str, bool)] = &[
            (
                400,
                r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
                "rejected",
                false,
            ),
            (
                503,
                r#"{"status":"error","errorType":"timeout","error":"query timed out"}"#,
                "rejected",
                true,
            ),
            (502, "<html>bad gateway</html>", "rejected", false),
            (200, "not json", "decode", false),
            (
                200,
                r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                "decode",
                false,
            ),
        ];
        for (status, body, category, timeout) in cases {
            let err = parse_answer(url, *status, body).unwrap_err();
            assert_eq!(err.category(), *category, "{body}");
            assert_eq!(err.is_timeout(), *timeout, "{body}");
        }
    }

    #[test]
    fn range_answers_parse_to_millisecond_points() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b"},"values":[[1.5,"1"],[2.5,"NaN"]]}]}}"#;
        let got = parse_range_answer("u", 200, body).unwrap();
        assert_eq!(got[0].points[0], (1_500, 1.0));
        assert!(got[0].points[1].1.is_nan());
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(
            parse_range_answer("u", 200, vector).unwrap_err().category(),
            "decode"
        );
    }

    #[test]
    fn partial_responses_are_refused_by_default_and_dedup_sent_only_when_set() {
        let mut config = PrometheusConfig::new("http://127.0.0.1:1");
        let at = Timestamp::from_millisecond(1_500).unwrap();
        let default = PrometheusSource::new(config.clone()).params("up", at);
        assert!(default.contains(&("partial_response", "false".into())));
        assert!(default.iter().all(|(k, _)| *k != "dedup"));
        assert!(default.contains(&("time", "1.500".into())));
        config.partial_response = None;
        config.dedup = Some(true);
        let other = PrometheusSource::new(config).params("up", at);
        assert!(other.iter().all(|(k, _)| *k != "partial_response"));
        assert!(other.contains(&("dedup", "true".into())));
    }

    /// A loopback HTTP server answering every request with an empty vector after `delay`,
    /// recording the most requests it ever had in flight at once.
    async fn counting_server(delay: Duration) -> (String, Arc<AtomicU64>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let in_flight = Arc::new(AtomicU64::new(0));
        let max = Arc::new(AtomicU64::new(0));
        let max_out = max.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (in_flight, max) = (in_flight.clone(), max.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let mut read = 0;
                    // Read headers and the form body (Content-Length).
                    loop {
                        let Ok(n) = socket.read(&mut buf[read..]).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        read += n;
                        let text = String::from_utf8_lossy(&buf[..read]).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if read >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let body = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        (url, max_out)
    }

    #[tokio::test]
    async fn concurrency_limit_bounds_queries_in_flight() {
        for limit in [1usize, 3] {
            let (url, max) = counting_server(Duration::from_millis(300)).await;
            let mut config = PrometheusConfig::new(url);
            config.max_concurrency = limit;
            let source = PrometheusSource::new(config);
            let at = Timestamp::from_second(1_800_000_000).unwrap();
            let queries: Vec<String> = (0..8).map(|i| format!("vector({i})")).collect();
            let results =
                futures::future::join_all(queries.iter().map(|q| source.query(q, at))).await;
            assert!(results.iter().all(Result::is_ok));
            assert_eq!(max.load(Ordering::SeqCst), limit as u64, "limit {limit}");
        }
    }

    /// What the stub answers a request whose form body is given.
    enum Stub {
        /// Status and the whole body.
        Answer(u16, Vec<u8>),
        /// Headers promising a body, a few bytes of it, then nothing (the connection stays open).
        NeverFinish,
    }

    /// A loopback Prometheus stub answering each request with `answer(form body)`.
    async fn stub(answer: impl Fn(&str) -> Stub + Send + Sync + 'static) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while let Ok(Ok((mut socket, _))) =
                tokio::time::timeout_at(deadline, listener.accept()).await
            {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let form = loop {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + length {
                                break text[end + 4..].to_string();
                            }
                        }
                    };
                    match answer(&form) {
                        Stub::Answer(status, body) => {
                            let head = format!(
                                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                body.len()
                            );
                            let _ = socket.write_all(head.as_bytes()).await;
                            let _ = socket.write_all(&body).await;
                        }
                        Stub::NeverFinish => {
                            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"status\":";
                            let _ = socket.write_all(head.as_bytes()).await;
                            tokio::time::sleep(Duration::from_secs(20)).await;
                        }
                    }
                });
            }
        });
        url
    }

    const EMPTY: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

    #[tokio::test]
    async fn a_body_that_never_finishes_ends_at_the_query_deadline() {
        let url = stub(|_| Stub::NeverFinish).await;
        let mut config = PrometheusConfig::new(url);
        config.timeout = Duration::from_millis(300);
        config.retries = 5;
        config.backoff = Duration::from_millis(50);
        config.deadline = Duration::from_millis(700);
        let source = PrometheusSource::new(config);
        let started = tokio::time::Instant::now();
        let err = source
            .query("up", Timestamp::from_second(1_800_000_000).unwrap())
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(err.is_timeout(), "{err}");
        assert!(
            took < Duration::from_millis(1000),
            "a query whose answer never finishes took {took:?}, past its 700ms deadline"
        );
        assert!(
            source.requests_sent() >= 2,
            "the first attempt was bounded too"
        );
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused_and_not_retried() {
        let url = stub(|_| {
            let series = r#"{"metric":{"pod":"forged"},"value":[1,"1"]},"#.repeat(40_000);
            Stub::Answer(
                200,
                format!(
                    r#"{{"status":"success","data":{{"resultType":"vector","result":[{series}{{"metric":{{}},"value":[1,"1"]}}]}}}}"#
                )
                .into_bytes(),
            )
        })
        .await;
        let mut config = PrometheusConfig::new(url);
        config.max_response_bytes = 1 << 20;
        let source = PrometheusSource::new(config);
        let err = source
            .query("up", Timestamp::from_second(1_800_000_000).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.category(), "decode", "{err}");
        assert!(
            err.to_string()
                .contains("the answer is larger than 1048576 bytes"),
            "{err}"
        );
        assert_eq!(source.requests_sent(), 1, "never retried");
    }

    #[tokio::test]
    async fn a_retrying_query_does_not_hold_its_slot_while_it_sleeps() {
        let url = stub(|form| {
            if form.contains("failing") {
                Stub::Answer(503, b"overloaded".to_vec())
            } else {
                Stub::Answer(200, EMPTY.as_bytes().to_vec())
            }
        })
        .await;
        let mut config = PrometheusConfig::new(url);
        config.max_concurrency = 1;
        config.retries = 1;
        config.backoff = Duration::from_millis(1600);
        let source = PrometheusSource::new(config);
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let failing = {
            let source = source.clone();
            tokio::spawn(async move { source.query("failing", at).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = tokio::time::Instant::now();
        source.query("up", at).await.expect("answered");
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_millis(600),
            "a query waited {waited:?} for the single slot while another query slept before its retry"
        );
        assert!(failing.await.unwrap().is_err());
    }

    #[test]
    fn retry_delays_are_jittered_within_half_to_full() {
        let d = Duration::from_millis(1000);
        let delays: std::collections::BTreeSet<Duration> = (0..50).map(|_| jitter(d)).collect();
        assert!(delays.len() > 40);
        assert!(
            delays
                .iter()
                .all(|j| *j >= Duration::from_millis(500) && *j <= d)
        );
    }

    #[tokio::test]
    async fn the_query_is_sent_form_encoded() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let url = {
            let seen = seen.clone();
            stub(move |form| {
                seen.lock().unwrap().push(form.to_string());
                Stub::Answer(200, EMPTY.as_bytes().to_vec())
            })
            .await
        };
        let source = PrometheusSource::new(PrometheusConfig::new(url));
        source
            .query(
                "a{b=\"c d\"} + 1",
                Timestamp::from_second(1_800_000_000).unwrap(),
            )
            .await
            .expect("answered");
        let forms = seen.lock().unwrap().clone();
        assert_eq!(forms.len(), 1);
        assert!(
            forms[0].starts_with(
                "time=1800000000.000&query=a%7Bb%3D%22c+d%22%7D+%2B+1&timeout=10000ms"
            ),
            "{}",
            forms[0]
        );
        assert!(
            forms[0].ends_with("&partial_response=false"),
            "{}",
            forms[0]
        );
    }

    #[test]
    fn an_answer_with_warnings_is_an_error_naming_them() {
        let url = "http://p/api/v1/query";
        let body = r#"{"status":"success","warnings":["store east-2 unavailable","no dedup"],"data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0"]}]}}"#;
        let err = parse_answer(url, 200, body).unwrap_err();
        assert_eq!(err.category(), "warnings");
        assert!(!err.is_timeout());
        assert_eq!(
            err.to_string(),
            "query to http://p/api/v1/query answered with warnings, so the answer may be \
             incomplete and is not used: store east-2 unavailable; no dedup"
        );
        let empty =
            r#"{"status":"success","warnings":[],"data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(parse_answer(url, 200, empty).unwrap(), vec![]);
    }

    #[tokio::test]
    async fn a_warning_reaches_the_gate_verdict_as_a_query_error() {
        use crate::engine::{Engine, EngineOptions, GateCheck};
        use sluice_api::v1alpha1::{BuiltinGate, Gate, Verdict, VerdictReason};
        let url = stub(|_| {
            Stub::Answer(
                200,
                br#"{"status":"success","warnings":["store east-2 unavailable"],"data":{"resultType":"vector","result":[]}}"#
                    .to_vec(),
            )
        })
        .await;
        let engine = Engine::new(
            PrometheusSource::new(PrometheusConfig::new(url)),
            EngineOptions::default(),
        )
        .unwrap();
        let gate = Gate::builtin("errors", BuiltinGate::ErrorRatioVsStable)
            .resolve(None)
            .unwrap();
        let vars = [
            ("cluster", "east-1"),
            ("namespace", "shop"),
            ("canaryService", "checkout-v2"),
            ("stableService", "checkout-v1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let check = GateCheck::new("Rollout shop/checkout", gate, vars);
        let report = engine
            .tick(
                std::slice::from_ref(&check),
                Timestamp::from_second(1_800_000_000).unwrap(),
            )
            .await;
        let verdict = report.outcomes[0].verdict.clone().expect("a verdict");
        assert_eq!(verdict.reason, VerdictReason::QueryError);
        assert_ne!(verdict.verdict, Verdict::Pass);
        let message = verdict.message.unwrap_or_default();
        assert!(
            message.contains("answered with warnings")
                && message.contains("store east-2 unavailable"),
            "{message}"
        );
    }

    #[test]
    fn refused_credentials_say_what_to_check() {
        for status in [401u16, 403] {
            let err = parse_answer("http://p/api/v1/query", status, "Unauthorized\n").unwrap_err();
            assert_eq!(err.category(), "rejected");
            assert!(
                err.to_string().starts_with(&format!(
                    "query to http://p/api/v1/query was rejected with HTTP {status} (unauthorized): \
                     Unauthorized; the provider refused the credentials"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn unusable_settings_are_named_before_anything_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = PrometheusConfig::new("https://thanos.example:9090");
        config.ca_file = Some(dir.path().join("missing-ca.pem"));
        let err = config.check().unwrap_err();
        assert_eq!(err.category(), "config");
        assert!(err.to_string().contains("missing-ca.pem"), "{err}");

        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        config.ca_file = Some(not_pem);
        let err = config.check().unwrap_err();
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );

        let mut config = PrometheusConfig::new("https://thanos.example:9090");
        config.headers = vec![("X-Scope-OrgID".into(), "bad\nvalue".into())];
        let err = config.check().unwrap_err();
        assert!(
            err.to_string()
                .contains("the value of header X-Scope-OrgID is not a valid HTTP header value"),
            "{err}"
        );
        config.headers = vec![("Authorization".into(), "Bearer x".into())];
        assert!(
            config
                .check()
                .unwrap_err()
                .to_string()
                .contains("not as an extra header")
        );

        let mut config = PrometheusConfig::new("https://thanos.example:9090");
        let token = dir.path().join("token");
        config.bearer_token_file = Some(token.clone());
        let err = config.check().unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "the metrics source https://thanos.example:9090 cannot be used: bearer token file {}:",
                token.display()
            )),
            "{err}"
        );
        std::fs::write(&token, "\n").unwrap();
        assert!(
            config
                .check()
                .unwrap_err()
                .to_string()
                .ends_with("is empty")
        );
        std::fs::write(&token, "abc\n").unwrap();
        config.check().expect("a readable token is fine");
    }

    #[tokio::test]
    async fn a_missing_token_file_fails_the_query_without_sending_it() {
        let url = stub(|_| Stub::Answer(200, EMPTY.as_bytes().to_vec())).await;
        let mut config = PrometheusConfig::new(url);
        config.bearer_token_file = Some("/nonexistent/sluice/token".into());
        let source = PrometheusSource::new(config);
        let err = source
            .query("up", Timestamp::from_second(1_800_000_000).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.category(), "config", "{err}");
        assert!(
            err.to_string()
                .contains("bearer token file /nonexistent/sluice/token: No such file"),
            "{err}"
        );
        assert_eq!(source.requests_sent(), 0, "nothing sent, nothing retried");
    }
}
