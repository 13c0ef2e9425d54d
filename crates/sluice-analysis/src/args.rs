//! The flags every operator takes to reach its metrics source (Prometheus, Thanos Query, Mimir,
//! Grafana Cloud): timeout, bearer token file, basic auth, extra headers, CA file. One
//! definition, flattened into each operator's command line. The operators that gate one
//! cluster's change (rollout-weights, upgrade-revisions) flatten [`ClusterGateArgs`], which adds
//! the URL, the cluster and free-form PromQL; wave-gate reads the global view, where the URL is
//! optional and the cluster is a label, so it keeps those flags its own.

use std::path::PathBuf;
use std::time::Duration;

use crate::source::{BasicAuth, PrometheusConfig, SourceError};

/// The gate flags of an operator that judges one cluster's change: where its metrics are, which
/// `cluster` label value scopes them, whether namespaced gates may carry free-form PromQL, and
/// how to reach the source. Flatten into the operator's `clap` command line.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct ClusterGateArgs {
    /// Allow free-form PromQL in gates of namespaced objects (it runs with the operator's view
    /// of all metrics).
    #[arg(long, env = "SLUICE_ALLOW_FREE_FORM_PROMQL", default_value_t = false)]
    pub allow_free_form_promql: bool,
    /// Base URL of the Prometheus HTTP API (Thanos Query in production) the gates query.
    #[arg(
        long,
        env = "SLUICE_PROMETHEUS_URL",
        default_value = "http://thanos-query.monitoring:9090"
    )]
    pub prometheus_url: String,
    /// Value of the `cluster` label that scopes this cluster's series.
    #[arg(long, env = "SLUICE_CLUSTER", default_value = "cluster-1")]
    pub cluster: String,
    /// Credentials, headers, CA and timeout for the Prometheus URL.
    #[command(flatten)]
    pub source: MetricsSourceArgs,
}

impl ClusterGateArgs {
    /// The source settings for `--prometheus-url`, checked as [`MetricsSourceArgs::config`]
    /// does.
    pub fn config(&self, default_timeout: Duration) -> Result<PrometheusConfig, SourceError> {
        self.source.config(&self.prometheus_url, default_timeout)
    }
}

/// How to reach the metrics source. Flatten into an operator's `clap` command line.
#[derive(Clone, Debug, Default, PartialEq, clap::Args)]
pub struct MetricsSourceArgs {
    /// Timeout of one query attempt, seconds (also sent as the query's `timeout`). Default: the
    /// operator's own (5 s for rollout-weights, 10 s for the others).
    #[arg(long, env = "SLUICE_PROMETHEUS_TIMEOUT_SECONDS")]
    pub prometheus_timeout_seconds: Option<u64>,
    /// File holding a bearer token for the metrics source (`Authorization: Bearer`), read again
    /// for every query, so a rotated projected service account token or Secret is picked up.
    #[arg(long, env = "SLUICE_PROMETHEUS_BEARER_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// Username of HTTP basic auth to the metrics source (with --prometheus-password-file).
    #[arg(long, env = "SLUICE_PROMETHEUS_USERNAME")]
    pub prometheus_username: Option<String>,
    /// File holding the basic auth password, read again for every query.
    #[arg(long, env = "SLUICE_PROMETHEUS_PASSWORD_FILE")]
    pub prometheus_password_file: Option<PathBuf>,
    /// Extra header sent with every query, `NAME=VALUE` (e.g. `X-Scope-OrgID=tenant-a` for
    /// Mimir or Cortex). Repeatable.
    #[arg(long = "prometheus-header", value_name = "NAME=VALUE")]
    pub prometheus_headers: Vec<String>,
    /// PEM file of CA certificates trusted for the metrics source in addition to the system
    /// roots (a provider served with a private CA).
    #[arg(long, env = "SLUICE_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
}

impl MetricsSourceArgs {
    /// The source settings for `url`, checked: a malformed flag, an unreadable credentials or CA
    /// file is an error naming it. `default_timeout` applies when no timeout flag is given; the
    /// query deadline (retries included) is at least three attempts long.
    pub fn config(
        &self,
        url: impl Into<String>,
        default_timeout: Duration,
    ) -> Result<PrometheusConfig, SourceError> {
        let mut config = PrometheusConfig::new(url);
        let bad = |message: String| SourceError::Config {
            url: config.url.clone(),
            message,
        };
        let timeout = match self.prometheus_timeout_seconds {
            Some(0) => return Err(bad("--prometheus-timeout-seconds must be at least 1".into())),
            Some(s) => Duration::from_secs(s),
            None => default_timeout,
        };
        let headers = self
            .prometheus_headers
            .iter()
            .map(|h| match h.split_once('=') {
                Some((name, value)) if !name.trim().is_empty() => {
                    Ok((name.trim().to_string(), value.to_string()))
                }
                _ => Err(bad(format!(
                    "--prometheus-header {h:?} is not NAME=VALUE (e.g. X-Scope-OrgID=tenant-a)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let basic_auth = match (&self.prometheus_username, &self.prometheus_password_file) {
            (None, None) => None,
            (Some(username), Some(password_file)) => Some(BasicAuth {
                username: username.clone(),
                password_file: password_file.clone(),
            }),
            (Some(_), None) => {
                return Err(bad(
                    "--prometheus-username needs --prometheus-password-file".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "--prometheus-password-file needs --prometheus-username".into(),
                ));
            }
        };
        if basic_auth.is_some() && self.prometheus_bearer_token_file.is_some() {
            return Err(bad(
                "give either --prometheus-bearer-token-file or basic auth \
                 (--prometheus-username), not both: both set the Authorization header"
                    .into(),
            ));
        }
        config.timeout = timeout;
        config.deadline = config.deadline.max(timeout * 3);
        config.headers = headers;
        config.basic_auth = basic_auth;
        config.bearer_token_file = self.prometheus_bearer_token_file.clone();
        config.ca_file = self.prometheus_ca_file.clone();
        config.check()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        source: MetricsSourceArgs,
    }

    fn parse(args: &[&str]) -> MetricsSourceArgs {
        Cli::try_parse_from(std::iter::once("op").chain(args.iter().copied()))
            .expect("flags parse")
            .source
    }

    #[derive(Debug, Parser)]
    struct GatingCli {
        #[command(flatten)]
        gates: ClusterGateArgs,
    }

    #[test]
    fn the_gate_flags_of_one_cluster_parse_with_their_defaults() {
        let parse = |args: &[&str]| {
            GatingCli::try_parse_from(std::iter::once("op").chain(args.iter().copied()))
                .map(|c| c.gates)
        };
        let defaults = parse(&[]).expect("no flag is required");
        assert_eq!(
            defaults.prometheus_url,
            "http://thanos-query.monitoring:9090"
        );
        assert_eq!(defaults.cluster, "cluster-1");
        assert!(!defaults.allow_free_form_promql);

        let given = parse(&[
            "--prometheus-url=https://metrics.example:9443",
            "--cluster=east-1",
            "--allow-free-form-promql",
            "--prometheus-timeout-seconds=7",
        ])
        .expect("flags parse");
        assert_eq!(given.cluster, "east-1");
        assert!(given.allow_free_form_promql);
        let config = given
            .config(Duration::from_secs(5))
            .expect("source settings");
        assert_eq!(config.url, "https://metrics.example:9443");
        assert_eq!(config.timeout, Duration::from_secs(7));

        // The source's own checks still apply, naming the flag.
        let err = parse(&["--prometheus-timeout-seconds=0"])
            .expect("flags parse")
            .config(Duration::from_secs(5))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("--prometheus-timeout-seconds must be at least 1"),
            "{err}"
        );
    }

    #[test]
    fn flags_make_the_source_settings() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t0\n").unwrap();
        let args = parse(&[
            "--prometheus-timeout-seconds=20",
            "--prometheus-bearer-token-file",
            token.to_str().unwrap(),
            "--prometheus-header",
            "X-Scope-OrgID=tenant-a|tenant-b",
            "--prometheus-header=X-Extra=a=b",
        ]);
        let config = args
            .config("https://thanos:9090", Duration::from_secs(5))
            .unwrap();
        assert_eq!(config.timeout, Duration::from_secs(20));
        assert_eq!(config.deadline, Duration::from_secs(60));
        assert_eq!(config.bearer_token_file.as_deref(), Some(token.as_path()));
        assert_eq!(
            config.headers,
            vec![
                ("X-Scope-OrgID".to_string(), "tenant-a|tenant-b".to_string()),
                ("X-Extra".to_string(), "a=b".to_string()),
            ]
        );
        assert_eq!(config.partial_response, Some(false));

        let config = parse(&[])
            .config("http://prometheus:9090", Duration::from_secs(5))
            .unwrap();
        assert_eq!(config.timeout, Duration::from_secs(5));
        assert_eq!(config.deadline, Duration::from_secs(30));
        assert_eq!(config.bearer_token_file, None);
        assert_eq!(config.basic_auth, None);
    }

    #[test]
    fn wrong_flags_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "p").unwrap();
        let password = password.to_str().unwrap();
        let cases: &[(&[&str], &str)] = &[
            (
                &["--prometheus-header", "X-Scope-OrgID"],
                "--prometheus-header \"X-Scope-OrgID\" is not NAME=VALUE",
            ),
            (
                &["--prometheus-username", "u"],
                "--prometheus-username needs --prometheus-password-file",
            ),
            (
                &["--prometheus-password-file", password],
                "--prometheus-password-file needs --prometheus-username",
            ),
            (
                &[
                    "--prometheus-username=u",
                    "--prometheus-password-file",
                    password,
                    "--prometheus-bearer-token-file",
                    password,
                ],
                "not both",
            ),
            (
                &["--prometheus-timeout-seconds=0"],
                "--prometheus-timeout-seconds must be at least 1",
            ),
        ];
        for (flags, expected) in cases {
            let err = parse(flags)
                .config("http://p:9090", Duration::from_secs(5))
                .unwrap_err();
            assert_eq!(err.category(), "config");
            assert!(err.to_string().contains(expected), "{flags:?}: {err}");
        }
        let ok = parse(&[
            "--prometheus-username=u",
            "--prometheus-password-file",
            password,
        ])
        .config("http://p:9090", Duration::from_secs(5))
        .unwrap();
        assert_eq!(ok.basic_auth.unwrap().username, "u");
    }
}
