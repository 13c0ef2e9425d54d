//! The operator binaries, run where the chart would put them: rollout-weights and
//! upgrade-revisions in every workload cluster, wave-gate and revert beside Argo CD in every
//! management cluster. Owns finding the binaries (next to the sandbox's own executable), building
//! them when missing, starting them as child processes and stopping them (SIGTERM, then kill).
//! Never leaves a process behind: every child is also killed when its handle is dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::topology::{ClusterSpec, Role};

/// Namespace of the operators' leader-election Leases (the chart's release namespace).
pub const LEASE_NAMESPACE: &str = "sluice-system";
/// Namespace of Argo CD, where WaveGates and BundlePins live.
pub const ARGOCD_NAMESPACE: &str = "argocd";

/// One of the four operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// Canary weights on HTTPRoutes (kind Rollout).
    RolloutWeights,
    /// Istio revision-tag upgrades (kind RevisionUpgrade).
    UpgradeRevisions,
    /// Configuration waves (kind WaveGate).
    WaveGate,
    /// One-step revert (kind BundlePin).
    Revert,
}

/// Every operator, in start order.
pub const ALL: [Operator; 4] = [
    Operator::WaveGate,
    Operator::Revert,
    Operator::RolloutWeights,
    Operator::UpgradeRevisions,
];

impl Operator {
    /// Short name (`rollout-weights`).
    pub fn name(self) -> &'static str {
        match self {
            Operator::RolloutWeights => "rollout-weights",
            Operator::UpgradeRevisions => "upgrade-revisions",
            Operator::WaveGate => "wave-gate",
            Operator::Revert => "revert",
        }
    }

    /// Binary and cargo package name (`sluice-rollout-weights`).
    pub fn binary(self) -> String {
        format!("sluice-{}", self.name())
    }

    /// The kind of cluster the chart installs it in.
    pub fn role(self) -> Role {
        match self {
            Operator::RolloutWeights | Operator::UpgradeRevisions => Role::Workload,
            Operator::WaveGate | Operator::Revert => Role::Management,
        }
    }

    /// Flags beyond the shared runtime ones (the chart's `--namespace` for operators that live
    /// beside Argo CD).
    pub fn extra_args(self) -> Vec<String> {
        match self.role() {
            Role::Management => vec![format!("--namespace={ARGOCD_NAMESPACE}")],
            Role::Workload => Vec::new(),
        }
    }
}

/// The window upgrade-revisions measures background SVID issuance over in the sandbox (its
/// `SLUICE_ISSUANCE_WINDOW_SECONDS`). The chart's default is 60 s, sized for a 15–30 s scrape
/// interval; the sandbox's mesh writes telemetry every second, so ten samples fill a window and
/// an upgrade need not wait a minute for Prometheus to hold one.
pub const ISSUANCE_WINDOW_SECONDS: u64 = 10;

/// Namespace of revert's per-cluster identity Secrets in a management cluster.
pub const REVERT_IDENTITY_NAMESPACE: &str = LEASE_NAMESPACE;

/// Where the shared services of the sandbox are, for the operators' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Services {
    /// Prometheus base URL (the metrics source; Thanos Query in production).
    pub prometheus_url: String,
    /// Registry `host:port` (plain HTTP).
    pub registry_host: String,
    /// Clone URL of the git intent repository.
    pub git_url: String,
}

/// The settings of one operator process, as the environment variables its flags read (the
/// chart's values): every operator gets the Prometheus URL and its cluster's name (the
/// `cluster` label of its telemetry); revert also the plain-HTTP registry, the intent
/// repository and the namespace of its per-cluster identities; upgrade-revisions the sandbox's
/// short issuance window ([`ISSUANCE_WINDOW_SECONDS`]).
pub fn environment(placement: &Placement, services: &Services) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "SLUICE_PROMETHEUS_URL".to_string(),
            services.prometheus_url.clone(),
        ),
        ("SLUICE_CLUSTER".to_string(), placement.cluster.clone()),
    ];
    if placement.operator == Operator::UpgradeRevisions {
        env.push((
            "SLUICE_ISSUANCE_WINDOW_SECONDS".to_string(),
            ISSUANCE_WINDOW_SECONDS.to_string(),
        ));
    }
    if placement.operator == Operator::Revert {
        env.extend([
            (
                "SLUICE_REVERT_INSECURE_REGISTRIES".to_string(),
                services.registry_host.clone(),
            ),
            (
                "SLUICE_REVERT_GIT_URL".to_string(),
                services.git_url.clone(),
            ),
            (
                "SLUICE_REVERT_CLUSTER_NAMESPACE".to_string(),
                REVERT_IDENTITY_NAMESPACE.to_string(),
            ),
        ]);
    }
    env
}

/// One operator process to run: which operator in which cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Cluster name.
    pub cluster: String,
    /// Operator.
    pub operator: Operator,
}

/// Where the chart would put each operator, in start order (cluster by cluster).
pub fn placements(clusters: &[ClusterSpec]) -> Vec<Placement> {
    clusters
        .iter()
        .flat_map(|c| {
            ALL.iter()
                .filter(move |op| op.role() == c.role)
                .map(move |op| Placement {
                    cluster: c.name.clone(),
                    operator: *op,
                })
        })
        .collect()
}

/// The command line of one operator process.
pub fn command_line(placement: &Placement, kubeconfig: &Path, metrics_port: u16) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--metrics-addr=127.0.0.1:{metrics_port}"),
        format!("--lease-namespace={LEASE_NAMESPACE}"),
        format!("--identity=sandbox-{}", placement.cluster),
        "--log-format=text".to_string(),
        "--log-level=info".to_string(),
    ];
    args.extend(placement.operator.extra_args());
    args
}

/// Where the sandbox's executable lives and how it was built: the directory holding the
/// operator binaries, the cargo target directory and the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildDir {
    /// Directory of the executables (`<target>/debug`).
    pub bin_dir: PathBuf,
    /// Cargo target directory, when the executable sits in one (`<target>/<profile>/`).
    pub target_dir: Option<PathBuf>,
    /// `release` when built in release mode.
    pub release: bool,
}

/// Reads the build layout from the sandbox's executable path.
pub fn build_dir(exe: &Path) -> BuildDir {
    let bin_dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let profile = bin_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let in_target = matches!(profile, "debug" | "release");
    BuildDir {
        target_dir: in_target
            .then(|| bin_dir.parent().map(Path::to_path_buf))
            .flatten(),
        release: profile == "release",
        bin_dir,
    }
}

/// Operators whose binary is not in `bin_dir`.
pub fn missing_binaries(bin_dir: &Path, operators: &[Operator]) -> Vec<Operator> {
    operators
        .iter()
        .copied()
        .filter(|op| !bin_dir.join(op.binary()).is_file())
        .collect()
}

/// The cargo arguments that build `operators` into the same target directory and profile.
pub fn build_args(dir: &BuildDir, manifest: &Path, operators: &[Operator]) -> Vec<String> {
    let mut args = vec![
        "build".to_string(),
        "--bins".to_string(),
        format!("--manifest-path={}", manifest.display()),
    ];
    if let Some(target) = &dir.target_dir {
        args.push(format!("--target-dir={}", target.display()));
    }
    if dir.release {
        args.push("--release".to_string());
    }
    for op in operators {
        args.push("-p".to_string());
        args.push(op.binary());
    }
    args
}

/// Operator binaries could not be found, built or started.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum OperatorError {
    /// Binaries are missing and cargo is not known.
    #[error(
        "operator binaries {missing} are not in {dir} and $CARGO is not set, so the sandbox cannot \
         build them; run `cargo build --bins {packages}` (same profile as the sandbox), or start the \
         sandbox with `cargo run -p sluice-sandbox`, or pass --operators off"
    )]
    Missing {
        /// Binary names.
        missing: String,
        /// Directory looked in.
        dir: String,
        /// `-p ...` arguments.
        packages: String,
    },
    /// cargo build failed.
    #[error(
        "building the operator binaries failed: `{command}` exited with {status}; fix the build (its output is above) or pass --operators off"
    )]
    Build {
        /// The command run.
        command: String,
        /// Exit status or spawn error.
        status: String,
    },
    /// A binary could not be started.
    #[error("starting {binary} for {cluster} failed: {source}")]
    Spawn {
        /// Binary path.
        binary: String,
        /// Cluster.
        cluster: String,
        /// Cause.
        source: std::io::Error,
    },
}

impl OperatorError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// Makes sure the binaries of `operators` are in `dir.bin_dir` and current: when started through
/// cargo (`$CARGO` set) it runs `cargo build` for them (a no-op when they are up to date; saying
/// so on stderr). A failed build is fatal only when a binary is missing; otherwise the existing
/// binaries are used with a warning. Without cargo, missing binaries are an error that says what
/// to run.
pub async fn ensure_binaries(
    dir: &BuildDir,
    manifest: &Path,
    operators: &[Operator],
) -> Result<(), OperatorError> {
    let missing = missing_binaries(&dir.bin_dir, operators);
    let packages = operators
        .iter()
        .map(|op| format!("-p {}", op.binary()))
        .collect::<Vec<_>>()
        .join(" ");
    let Some(cargo) = std::env::var_os("CARGO") else {
        if missing.is_empty() {
            return Ok(());
        }
        return Err(OperatorError::Missing {
            missing: missing
                .iter()
                .map(|op| op.binary())
                .collect::<Vec<_>>()
                .join(", "),
            dir: dir.bin_dir.display().to_string(),
            packages,
        });
    };
    let args = build_args(dir, manifest, operators);
    let command = format!("{} {}", PathBuf::from(&cargo).display(), args.join(" "));
    eprintln!("sluice sandbox: building the operator binaries: {command}");
    let result = tokio::process::Command::new(&cargo)
        .args(&args)
        .stdin(Stdio::null())
        // cargo reports on stderr; stdout stays for narration.
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .status()
        .await;
    let failure = match result {
        Ok(status) if status.success() => return Ok(()),
        Ok(status) => status.to_string(),
        Err(e) => e.to_string(),
    };
    if missing.is_empty() {
        eprintln!(
            "sluice sandbox: warning: building the operator binaries failed ({failure}); using the \
             binaries already in {}",
            dir.bin_dir.display()
        );
        Ok(())
    } else {
        Err(OperatorError::Build {
            command,
            status: failure,
        })
    }
}

/// A running operator process; killed when dropped, stopped gracefully by [`Self::stop`].
#[derive(Debug)]
pub struct OperatorProcess {
    /// Where it runs.
    pub placement: Placement,
    /// Its `/metrics` port.
    pub metrics_port: u16,
    /// Its log file.
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl OperatorProcess {
    /// Starts the operator binary from `bin_dir` with its output in `log`.
    pub fn start(
        bin_dir: &Path,
        placement: Placement,
        kubeconfig: &Path,
        metrics_port: u16,
        log: PathBuf,
        env: &[(String, String)],
    ) -> Result<Self, OperatorError> {
        let binary = bin_dir.join(placement.operator.binary());
        let spawn_err = |source| OperatorError::Spawn {
            binary: binary.display().to_string(),
            cluster: placement.cluster.clone(),
            source,
        };
        let file = std::fs::File::create(&log).map_err(spawn_err)?;
        let file2 = file.try_clone().map_err(spawn_err)?;
        let child = tokio::process::Command::new(&binary)
            .args(command_line(&placement, kubeconfig, metrics_port))
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_err)?;
        Ok(Self {
            placement,
            metrics_port,
            log,
            child,
        })
    }

    /// Process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops it: SIGTERM (the operator releases its Lease and exits), then SIGKILL after
    /// `grace`. Returns how it ended.
    pub async fn stop(mut self, grace: Duration) -> String {
        if let Some(status) = self.exited() {
            return format!("had already exited ({status})");
        }
        if let Some(pid) = self.child.id() {
            // `kill` keeps this crate free of unsafe signal calls.
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => format!("stopped ({status})"),
            _ => {
                let _ = self.child.kill().await;
                format!("killed after {grace:?} without exiting on SIGTERM")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{SITES, WORKLOADS_PER_SITE, clusters};

    #[test]
    fn the_chart_layout_puts_two_operators_in_every_cluster() {
        let got: Vec<String> = placements(&clusters(&SITES, WORKLOADS_PER_SITE))
            .iter()
            .map(|p| format!("{}:{}", p.cluster, p.operator.name()))
            .collect();
        let want = [
            "east-mgmt:wave-gate",
            "east-mgmt:revert",
            "east-1:rollout-weights",
            "east-1:upgrade-revisions",
            "east-2:rollout-weights",
            "east-2:upgrade-revisions",
            "west-mgmt:wave-gate",
            "west-mgmt:revert",
            "west-1:rollout-weights",
            "west-1:upgrade-revisions",
            "west-2:rollout-weights",
            "west-2:upgrade-revisions",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn build_layout_is_read_from_the_executable_path() {
        let cases = [
            ("/t/debug/sluice-sandbox", "/t/debug", Some("/t"), false),
            ("/t/release/sluice-sandbox", "/t/release", Some("/t"), true),
            (
                "/usr/local/bin/sluice-sandbox",
                "/usr/local/bin",
                None,
                false,
            ),
        ];
        for (exe, bin, target, release) in cases {
            let d = build_dir(Path::new(exe));
            assert_eq!(d.bin_dir, PathBuf::from(bin), "{exe}");
            assert_eq!(d.target_dir, target.map(PathBuf::from), "{exe}");
            assert_eq!(d.release, release, "{exe}");
        }
    }

    #[test]
    fn build_arguments_keep_target_dir_and_profile() {
        let dir = build_dir(Path::new("/t/release/sluice-sandbox"));
        let args = build_args(
            &dir,
            Path::new("/repo/Cargo.toml"),
            &[Operator::RolloutWeights, Operator::Revert],
        );
        assert_eq!(
            args.join(" "),
            "build --bins --manifest-path=/repo/Cargo.toml --target-dir=/t --release \
             -p sluice-rollout-weights -p sluice-revert"
        );
    }

    #[test]
    fn command_lines_follow_the_chart() {
        let wl = Placement {
            cluster: "east-1".into(),
            operator: Operator::RolloutWeights,
        };
        let mg = Placement {
            cluster: "east-mgmt".into(),
            operator: Operator::Revert,
        };
        let kc = Path::new("/w/east-1.kubeconfig");
        let a = command_line(&wl, kc, 17422).join(" ");
        assert!(a.contains("--metrics-addr=127.0.0.1:17422"), "{a}");
        assert!(a.contains("--lease-namespace=sluice-system"), "{a}");
        assert!(!a.contains("--namespace=argocd"), "{a}");
        let b = command_line(&mg, kc, 17421).join(" ");
        assert!(b.contains("--namespace=argocd"), "{b}");
    }

    #[test]
    fn every_operator_gets_prometheus_and_its_cluster_and_revert_its_sources() {
        let services = Services {
            prometheus_url: "http://127.0.0.1:9090".into(),
            registry_host: "127.0.0.1:5000".into(),
            git_url: "file:///tmp/intent.git".into(),
        };
        let cases = [
            (Operator::RolloutWeights, "east-1", 2),
            (Operator::UpgradeRevisions, "west-2", 3),
            (Operator::WaveGate, "east-mgmt", 2),
            (Operator::Revert, "west-mgmt", 5),
        ];
        for (operator, cluster, count) in cases {
            let env = environment(
                &Placement {
                    cluster: cluster.into(),
                    operator,
                },
                &services,
            );
            let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            assert_eq!(env.len(), count, "{operator:?}: {env:?}");
            assert_eq!(get("SLUICE_CLUSTER"), Some(cluster));
            assert_eq!(get("SLUICE_PROMETHEUS_URL"), Some("http://127.0.0.1:9090"));
            let window = (operator == Operator::UpgradeRevisions).then_some("10");
            assert_eq!(
                get("SLUICE_ISSUANCE_WINDOW_SECONDS"),
                window,
                "{operator:?}"
            );
            if operator == Operator::Revert {
                assert_eq!(
                    get("SLUICE_REVERT_INSECURE_REGISTRIES"),
                    Some("127.0.0.1:5000")
                );
                assert_eq!(get("SLUICE_REVERT_GIT_URL"), Some("file:///tmp/intent.git"));
                assert_eq!(
                    get("SLUICE_REVERT_CLUSTER_NAMESPACE"),
                    Some("sluice-system")
                );
            }
        }
    }

    #[test]
    fn missing_binaries_are_the_ones_not_in_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sluice-revert"), "").unwrap();
        let missing = missing_binaries(dir.path(), &ALL);
        assert_eq!(
            missing,
            [
                Operator::WaveGate,
                Operator::RolloutWeights,
                Operator::UpgradeRevisions
            ]
        );
    }
}
