//! Command-line and environment configuration every operator binary flattens into its own
//! `clap` parser.
//!
//! Owns flag names, `SLUICE_*` environment variables, defaults and their validation. Must never
//! touch the network or the cluster: turning this into a client or a lease is `client`'s and
//! `leader`'s job.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (in the cluster).
    Json,
    /// Human-readable text (local runs).
    Text,
}

/// An operator binary's command line: the flags every operator shares, then the operator's
/// own (`F`; `clap::Args`). `--help` names the binary and says what it does; `--version` prints
/// the workspace's version.
#[derive(Debug, Parser)]
#[command(version)]
pub struct OperatorCli<F: Args> {
    /// The shared flags (Kubernetes client, Lease, server, logging).
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// The operator's own flags.
    #[command(flatten)]
    pub flags: F,
}

impl<F: Args> OperatorCli<F> {
    /// Parses this process's arguments as the binary `name`, which `about` describes; on a bad
    /// flag, `--help` or `--version` prints clap's message and exits, as a derived parser does.
    pub fn parse_as(name: &'static str, about: &'static str) -> Self {
        Self::try_parse_as(name, about, std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// [`Self::parse_as`] over `argv` (its first item is the binary's path), returning clap's
    /// error instead of exiting.
    pub fn try_parse_as<I, T>(
        name: &'static str,
        about: &'static str,
        argv: I,
    ) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut command = Self::command().name(name).bin_name(name).about(about);
        let matches = command.try_get_matches_from_mut(argv)?;
        Self::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
    }
}

/// Flags shared by every sluice operator. Flatten it with `#[command(flatten)]`.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Path to a kubeconfig file; when absent the in-cluster service account is tried first,
    /// then `KUBECONFIG` / `~/.kube/config`.
    #[arg(long, env = "SLUICE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use (defaults to the current context).
    #[arg(long, env = "SLUICE_CONTEXT")]
    pub context: Option<String>,

    /// Watch only this namespace; empty means all namespaces. Ignored for cluster-scoped kinds.
    #[arg(long, env = "SLUICE_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Disable leader election (single replica, local runs and tests only).
    #[arg(long, env = "SLUICE_LEADER_ELECTION_DISABLED", default_value_t = false)]
    pub leader_election_disabled: bool,

    /// Name of the coordination.k8s.io/v1 Lease used for leader election
    /// (defaults to the operator's name).
    #[arg(long, env = "SLUICE_LEASE_NAME")]
    pub lease_name: Option<String>,

    /// Namespace of the leader-election Lease (defaults to the pod's namespace from
    /// `POD_NAMESPACE`, else `default`).
    #[arg(long, env = "SLUICE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// Seconds a Lease stays valid without renewal; a standby takes over after it expires.
    #[arg(long, env = "SLUICE_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,

    /// Seconds before expiry at which the leader renews its Lease; must be below the duration.
    #[arg(long, env = "SLUICE_LEASE_RENEW_SECONDS", default_value_t = 5)]
    pub lease_renew_seconds: u64,

    /// Seconds to wait before retrying after the Lease could not be read or written.
    #[arg(long, env = "SLUICE_LEASE_RETRY_SECONDS", default_value_t = 2)]
    pub lease_retry_seconds: u64,

    /// Identity written into the Lease (defaults to `POD_NAME`, else the host name plus a
    /// random suffix).
    #[arg(long, env = "SLUICE_IDENTITY")]
    pub identity: Option<String>,

    /// Address of the HTTP server serving `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "SLUICE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Log line format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,

    /// Log filter in `tracing` EnvFilter syntax, e.g. `info` or `info,kube=warn`.
    #[arg(long, env = "SLUICE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Most reconciles running at once (at least 1); further objects wait in the controller's
    /// queue. Each running reconcile holds its object, what it read and an API server
    /// connection, so this bounds the operator's memory and its load on the API server.
    #[arg(
        long,
        env = "SLUICE_MAX_CONCURRENT_RECONCILES",
        default_value_t = DEFAULT_MAX_CONCURRENT_RECONCILES,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub max_concurrent_reconciles: u16,

    /// Webhook notifications (`--notifications-secret`, `--notifications-cluster`).
    #[command(flatten)]
    pub notify: crate::notify::NotifyArgs,
}

/// Default of `--max-concurrent-reconciles`. Reconciles that are due together still share one
/// analysis batch up to this many; beyond it they run in further batches.
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 256;

/// A configuration value that cannot work, with the flag to fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Lease timings are inconsistent.
    #[error(
        "--lease-renew-seconds ({renew}) must be greater than 0 and less than \
         --lease-duration-seconds ({duration}); lower the renew margin or raise the duration"
    )]
    LeaseTimings {
        /// Configured duration.
        duration: u64,
        /// Configured renew margin.
        renew: u64,
    },
    /// The retry interval is zero, or not shorter than the renew deadline.
    #[error(
        "--lease-retry-seconds must be at least 1 (so a failing API server is not hammered) and \
         less than --lease-duration-seconds minus --lease-renew-seconds (the renew deadline: the \
         leader renews every retry interval and steps down when no renewal succeeded within the \
         deadline)"
    )]
    LeaseRetry,
}

impl crate::error::Categorized for ConfigError {
    fn category(&self) -> crate::error::Category {
        crate::error::Category::Config
    }
}

/// Validated leader-election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Lease object name.
    pub name: String,
    /// Lease object namespace.
    pub namespace: String,
    /// Holder identity.
    pub identity: String,
    /// Validity of the Lease without renewal, in seconds.
    pub duration_seconds: u64,
    /// Renew this many seconds before expiry.
    pub renew_seconds: u64,
    /// Back-off after a failed Lease read or write.
    pub retry: Duration,
}

impl RuntimeArgs {
    /// The namespace scope, `None` for all namespaces.
    pub fn namespace_scope(&self) -> Option<&str> {
        let ns = self.namespace.trim();
        (!ns.is_empty()).then_some(ns)
    }

    /// Validates and resolves the leader-election settings for the operator `default_name`.
    pub fn lease_settings(&self, default_name: &str) -> Result<LeaseSettings, ConfigError> {
        if self.lease_renew_seconds == 0 || self.lease_renew_seconds >= self.lease_duration_seconds
        {
            return Err(ConfigError::LeaseTimings {
                duration: self.lease_duration_seconds,
                renew: self.lease_renew_seconds,
            });
        }
        if self.lease_retry_seconds == 0
            || self.lease_retry_seconds >= self.lease_duration_seconds - self.lease_renew_seconds
        {
            return Err(ConfigError::LeaseRetry);
        }
        let namespace = self
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let identity = self
            .identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(default_identity);
        Ok(LeaseSettings {
            name: self
                .lease_name
                .clone()
                .unwrap_or_else(|| default_name.to_owned()),
            namespace,
            identity,
            duration_seconds: self.lease_duration_seconds,
            renew_seconds: self.lease_renew_seconds,
            retry: Duration::from_secs(self.lease_retry_seconds),
        })
    }
}

/// Host name plus process id and start time, unique enough to tell replicas apart.
fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "sluice".to_owned());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{host}-{}-{nanos:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operator with one flag of its own.
    #[derive(Debug, Args)]
    struct Own {
        /// How many widgets.
        #[arg(long, env = "SLUICE_TEST_WIDGETS", default_value_t = 3)]
        widgets: u32,
    }

    type Cli = OperatorCli<Own>;

    fn parse(args: &[&str]) -> RuntimeArgs {
        let mut argv = vec!["op"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("flags parse").runtime
    }

    #[test]
    fn lease_timings_are_validated() {
        type Row = (&'static [&'static str], Result<(u64, u64), ConfigError>);
        let table: [Row; 4] = [
            (&[], Ok((15, 5))),
            (
                &[
                    "--lease-duration-seconds",
                    "4",
                    "--lease-renew-seconds",
                    "1",
                ],
                Ok((4, 1)),
            ),
            (
                &[
                    "--lease-duration-seconds",
                    "5",
                    "--lease-renew-seconds",
                    "5",
                ],
                Err(ConfigError::LeaseTimings {
                    duration: 5,
                    renew: 5,
                }),
            ),
            (
                &["--lease-renew-seconds", "0"],
                Err(ConfigError::LeaseTimings {
                    duration: 15,
                    renew: 0,
                }),
            ),
        ];
        for (args, want) in table {
            let got = parse(args)
                .lease_settings("op")
                .map(|s| (s.duration_seconds, s.renew_seconds));
            assert_eq!(got, want, "{args:?}");
        }
    }

    #[test]
    fn zero_retry_is_refused() {
        let err = parse(&["--lease-retry-seconds", "0"])
            .lease_settings("op")
            .unwrap_err();
        assert_eq!(err, ConfigError::LeaseRetry);
    }

    #[test]
    fn a_retry_not_shorter_than_the_renew_deadline_is_refused() {
        // Duration 15, renew 5: the leader must renew more often than every 10 s.
        let err = parse(&["--lease-retry-seconds", "10"])
            .lease_settings("op")
            .unwrap_err();
        assert_eq!(err, ConfigError::LeaseRetry);
        assert!(err.to_string().contains("renew deadline"), "{err}");
        assert!(
            parse(&["--lease-retry-seconds", "9"])
                .lease_settings("op")
                .is_ok()
        );
    }

    #[test]
    fn lease_name_defaults_to_operator_and_identity_can_be_set() {
        let s = parse(&["--identity", "pod-a", "--lease-namespace", "sluice-system"])
            .lease_settings("sluice-revert")
            .unwrap();
        assert_eq!(s.name, "sluice-revert");
        assert_eq!(s.namespace, "sluice-system");
        assert_eq!(s.identity, "pod-a");
    }

    #[test]
    fn namespace_scope_empty_means_all() {
        assert_eq!(parse(&[]).namespace_scope(), None);
        assert_eq!(
            parse(&["--namespace", "team-a"]).namespace_scope(),
            Some("team-a")
        );
    }

    #[test]
    fn max_concurrent_reconciles_defaults_and_refuses_zero() {
        let table: [(&[&str], Option<u16>); 4] = [
            (&[], Some(DEFAULT_MAX_CONCURRENT_RECONCILES)),
            (&["--max-concurrent-reconciles", "8"], Some(8)),
            (&["--max-concurrent-reconciles", "0"], None),
            (&["--max-concurrent-reconciles", "70000"], None),
        ];
        for (args, want) in table {
            let mut argv = vec!["op"];
            argv.extend_from_slice(args);
            let got = Cli::try_parse_from(argv)
                .ok()
                .map(|c| c.runtime.max_concurrent_reconciles);
            assert_eq!(got, want, "{args:?}");
        }
    }

    #[test]
    fn log_format_parses_both_values() {
        assert_eq!(parse(&["--log-format", "text"]).log_format, LogFormat::Text);
        assert_eq!(parse(&[]).log_format, LogFormat::Json);
        let bad = Cli::try_parse_from(["op", "--log-format", "xml"]);
        assert!(bad.is_err());
    }

    #[test]
    fn an_operators_command_line_holds_its_flags_beside_the_shared_ones_under_its_name() {
        let cli = Cli::try_parse_as(
            "sluice-widgets",
            "Counts widgets.",
            ["/bin/op", "--widgets", "7", "--namespace", "team-a"],
        )
        .expect("flags parse");
        assert_eq!(cli.flags.widgets, 7);
        assert_eq!(cli.runtime.namespace_scope(), Some("team-a"));

        let help = Cli::try_parse_as("sluice-widgets", "Counts widgets.", ["op", "--help"])
            .expect_err("--help stops")
            .to_string();
        assert!(help.starts_with("Counts widgets.\n"), "{help}");
        assert!(help.contains("Usage: sluice-widgets [OPTIONS]"), "{help}");
        assert!(help.contains("--widgets <WIDGETS>"), "{help}");
        assert!(help.contains("--lease-duration-seconds"), "{help}");

        let version = Cli::try_parse_as("sluice-widgets", "Counts widgets.", ["op", "--version"])
            .expect_err("--version stops")
            .to_string();
        assert_eq!(
            version,
            format!("sluice-widgets {}\n", env!("CARGO_PKG_VERSION"))
        );

        let bad = Cli::try_parse_as(
            "sluice-widgets",
            "Counts widgets.",
            ["op", "--widgets", "x"],
        )
        .expect_err("a bad value is refused")
        .to_string();
        assert!(
            bad.contains("invalid value 'x' for '--widgets <WIDGETS>'"),
            "{bad}"
        );
        assert!(bad.contains("try '--help'"), "{bad}");
    }
}
