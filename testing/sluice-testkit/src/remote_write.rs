//! Prometheus remote-write client for synthetic series with chosen timestamps.
//!
//! Owns the wire format of remote write 1.0 (protobuf `WriteRequest`, snappy *block* format, the
//! `Content-Encoding: snappy` and `X-Prometheus-Remote-Write-Version: 0.1.0` headers) and helpers
//! that build counter and gauge series the way an exporter would have produced them.
//! It must never talk to anything but the loopback Prometheus fixture it was given, and never
//! reorder or drop samples: what a test writes is exactly what Prometheus receives.

use std::time::Duration;

use prost::Message;

/// One label pair on the wire (`prometheus.Label`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One sample on the wire (`prometheus.Sample`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Sample value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Timestamp in milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// One series on the wire (`prometheus.TimeSeries`): sorted labels and samples in time order.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Labels, sorted by name, `__name__` included.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// The remote-write request body (`prometheus.WriteRequest`); metadata (tag 3) is not sent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    /// The series of this request.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// Errors of the remote-write client.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RemoteWriteError {
    /// A series has no samples, no metric name, or a duplicate label.
    #[error("invalid synthetic series {series}: {reason}; fix the test's series builder")]
    InvalidSeries {
        /// The series, rendered as `name{labels}`.
        series: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP request did not complete.
    #[error("remote write to {url} failed: {source}; is the Prometheus fixture still running?")]
    Transport {
        /// The remote-write endpoint.
        url: String,
        /// The underlying error.
        source: reqwest::Error,
    },
    /// Prometheus answered with a non-2xx status.
    #[error(
        "remote write to {url} rejected with HTTP {status}: {body}; samples outside the out-of-order window or \
         duplicate timestamps with different values are refused"
    )]
    Rejected {
        /// The remote-write endpoint.
        url: String,
        /// HTTP status code.
        status: u16,
        /// Response body (Prometheus puts the reason here).
        body: String,
    },
    /// Snappy compression failed.
    #[error("snappy compression of the write request failed: {0}")]
    Compress(#[from] snap::Error),
}

impl RemoteWriteError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// A synthetic series to write: a metric name, labels and samples at chosen timestamps.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    name: String,
    labels: Vec<(String, String)>,
    samples: Vec<(i64, f64)>,
}

impl Series {
    /// A series of metric `name` with no labels and no samples yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// Adds (or replaces) a label.
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        let value = value.into();
        if let Some(existing) = self.labels.iter_mut().find(|(n, _)| *n == name) {
            existing.1 = value;
        } else {
            self.labels.push((name, value));
        }
        self
    }

    /// Adds one sample at `timestamp_ms` (milliseconds since the Unix epoch).
    pub fn sample(mut self, timestamp_ms: i64, value: f64) -> Self {
        self.samples.push((timestamp_ms, value));
        self
    }

    /// Adds the samples of a counter that starts at `start_value` at `start_ms` and grows by
    /// `per_second` per second, one sample every `step`, up to and including `end_ms`.
    pub fn counter(
        mut self,
        start_ms: i64,
        end_ms: i64,
        step: Duration,
        start_value: f64,
        per_second: f64,
    ) -> Self {
        let step_ms = i64::try_from(step.as_millis()).unwrap_or(i64::MAX).max(1);
        let mut t = start_ms;
        while t <= end_ms {
            let elapsed = (t - start_ms) as f64 / 1000.0;
            self.samples.push((t, start_value + per_second * elapsed));
            t += step_ms;
        }
        self
    }

    /// Adds the samples of a gauge holding `value` from `start_ms` to `end_ms`, one every `step`.
    pub fn gauge(mut self, start_ms: i64, end_ms: i64, step: Duration, value: f64) -> Self {
        let step_ms = i64::try_from(step.as_millis()).unwrap_or(i64::MAX).max(1);
        let mut t = start_ms;
        while t <= end_ms {
            self.samples.push((t, value));
            t += step_ms;
        }
        self
    }

    /// The metric name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The samples written so far, as `(timestamp_ms, value)`.
    pub fn samples(&self) -> &[(i64, f64)] {
        &self.samples
    }

    fn display(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }

    /// The wire form: labels sorted by name with `__name__`, samples sorted by time.
    fn to_wire(&self) -> Result<TimeSeries, RemoteWriteError> {
        let invalid = |reason: &str| RemoteWriteError::InvalidSeries {
            series: self.display(),
            reason: reason.into(),
        };
        if self.name.is_empty() {
            return Err(invalid("empty metric name"));
        }
        if self.samples.is_empty() {
            return Err(invalid("no samples"));
        }
        let mut labels: Vec<Label> = std::iter::once(Label {
            name: "__name__".into(),
            value: self.name.clone(),
        })
        .chain(self.labels.iter().map(|(n, v)| Label {
            name: n.clone(),
            value: v.clone(),
        }))
        .collect();
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        if labels.windows(2).any(|w| w[0].name == w[1].name) {
            return Err(invalid(
                "duplicate label name (is `__name__` set as a label?)",
            ));
        }
        let mut samples: Vec<Sample> = self
            .samples
            .iter()
            .map(|&(timestamp, value)| Sample { value, timestamp })
            .collect();
        samples.sort_by_key(|s| s.timestamp);
        Ok(TimeSeries { labels, samples })
    }
}

/// Encodes series as a snappy-compressed (block format) protobuf `WriteRequest`.
pub fn encode(series: &[Series]) -> Result<Vec<u8>, RemoteWriteError> {
    let request = WriteRequest {
        timeseries: series
            .iter()
            .map(Series::to_wire)
            .collect::<Result<_, _>>()?,
    };
    let raw = request.encode_to_vec();
    Ok(snap::raw::Encoder::new().compress_vec(&raw)?)
}

/// Most series sent in one request; larger writes are split so no request nears Prometheus' body limits.
const SERIES_PER_REQUEST: usize = 2_000;

/// Client for a Prometheus remote-write receiver (`/api/v1/write`).
#[derive(Clone, Debug)]
pub struct RemoteWriteClient {
    url: String,
    http: reqwest::Client,
}

impl RemoteWriteClient {
    /// A client for the Prometheus whose base URL (e.g. `http://127.0.0.1:9090`) is given.
    pub fn new(base_url: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .expect("building a plain HTTP client cannot fail");
        Self {
            url: format!("{}/api/v1/write", base_url.trim_end_matches('/')),
            http,
        }
    }

    /// The remote-write endpoint URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes the series; returns once Prometheus has accepted every request.
    pub async fn write(&self, series: &[Series]) -> Result<(), RemoteWriteError> {
        for chunk in series.chunks(SERIES_PER_REQUEST) {
            let body = encode(chunk)?;
            let response = self
                .http
                .post(&self.url)
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                .body(body)
                .send()
                .await
                .map_err(|source| RemoteWriteError::Transport {
                    url: self.url.clone(),
                    source,
                })?;
            let status = response.status();
            if !status.is_success() {
                let body = response.text().await.unwrap_or_default();
                return Err(RemoteWriteError::Rejected {
                    url: self.url.clone(),
                    status: status.as_u16(),
                    body,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> WriteRequest {
        let raw = snap::raw::Decoder::new()
            .decompress_vec(bytes)
            .expect("valid snappy block");
        WriteRequest::decode(raw.as_slice()).expect("valid protobuf")
    }

    #[test]
    fn encode_round_trips_with_sorted_labels_and_samples() {
        let series = Series::new("istio_requests_total")
            .label("reporter", "source")
            .label("destination_version", "v2")
            .sample(2_000, 2.0)
            .sample(1_000, 1.0);
        let request = decode(&encode(&[series]).unwrap());
        assert_eq!(request.timeseries.len(), 1);
        let names: Vec<&str> = request.timeseries[0]
            .labels
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(names, ["__name__", "destination_version", "reporter"]);
        let stamps: Vec<i64> = request.timeseries[0]
            .samples
            .iter()
            .map(|s| s.timestamp)
            .collect();
        assert_eq!(stamps, [1_000, 2_000]);
    }

    #[test]
    fn invalid_series_are_refused() {
        let cases = [
            (Series::new("m"), "no samples"),
            (Series::new("").sample(1, 1.0), "empty metric name"),
            (
                Series::new("m").label("__name__", "x").sample(1, 1.0),
                "duplicate label",
            ),
        ];
        for (series, want) in cases {
            let err = encode(&[series]).unwrap_err();
            assert_eq!(err.category(), "invalid_series");
            assert!(
                err.to_string().contains(want),
                "{err} should mention {want}"
            );
        }
    }

    #[test]
    fn counter_grows_at_the_given_rate() {
        let s = Series::new("c").counter(0, 60_000, Duration::from_secs(15), 10.0, 2.0);
        assert_eq!(
            s.samples(),
            &[
                (0, 10.0),
                (15_000, 40.0),
                (30_000, 70.0),
                (45_000, 100.0),
                (60_000, 130.0)
            ]
        );
    }

    #[test]
    fn label_replaces_an_existing_value() {
        let s = Series::new("g")
            .label("a", "1")
            .label("a", "2")
            .sample(0, 0.0);
        let request = decode(&encode(&[s]).unwrap());
        let a: Vec<&str> = request.timeseries[0]
            .labels
            .iter()
            .filter(|l| l.name == "a")
            .map(|l| l.value.as_str())
            .collect();
        assert_eq!(a, ["2"]);
    }
}
