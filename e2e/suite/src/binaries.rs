//! The four operator binaries: finds them next to the test executable (`<target>/<profile>/`)
//! and builds them once per test process with the same cargo, target directory and profile, so
//! the suite always runs the current code. Never builds anything but the operator packages.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One of the four operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// Canary weights on HTTPRoutes (kind Rollout).
    RolloutWeights,
    /// Configuration waves (kind WaveGate).
    WaveGate,
    /// One-step revert (kind BundlePin).
    Revert,
    /// Istio revision-tag upgrades (kind RevisionUpgrade).
    UpgradeRevisions,
}

/// Every operator.
pub const ALL: [Operator; 4] = [
    Operator::RolloutWeights,
    Operator::WaveGate,
    Operator::Revert,
    Operator::UpgradeRevisions,
];

impl Operator {
    /// The chart's component name (`rollout-weights`).
    pub fn component(self) -> &'static str {
        match self {
            Operator::RolloutWeights => "rollout-weights",
            Operator::WaveGate => "wave-gate",
            Operator::Revert => "revert",
            Operator::UpgradeRevisions => "upgrade-revisions",
        }
    }

    /// Binary and package name (`sluice-rollout-weights`).
    pub fn binary(self) -> String {
        format!("sluice-{}", self.component())
    }
}

/// The operator binaries are not available.
#[derive(Debug, Clone, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum BinaryError {
    /// Building them failed.
    #[error("`{command}` failed ({status}); fix the build (its output is above)")]
    Build {
        /// The command.
        command: String,
        /// Exit status or spawn error.
        status: String,
    },
    /// They are absent and cannot be built here.
    #[error(
        "{binary} is not in {dir} and $CARGO is not set; run `cargo build --bins -p \
         sluice-rollout-weights -p sluice-wave-gate -p sluice-revert -p sluice-upgrade-revisions` \
         with the suite's target directory and profile"
    )]
    Missing {
        /// Missing binary.
        binary: String,
        /// Directory looked in.
        dir: String,
    },
}

impl BinaryError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// The directory of the executables: the test executable lives in `<target>/<profile>/deps`.
pub fn bin_dir(exe: &Path) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("."));
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The cargo arguments that build every operator binary into `bin_dir`'s target and profile.
pub fn build_args(bin_dir: &Path, manifest: &Path) -> Vec<String> {
    let mut args = vec![
        "build".to_owned(),
        "--bins".to_owned(),
        format!("--manifest-path={}", manifest.display()),
    ];
    let profile = bin_dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if matches!(profile, "debug" | "release")
        && let Some(target) = bin_dir.parent()
    {
        args.push(format!("--target-dir={}", target.display()));
        if profile == "release" {
            args.push("--release".to_owned());
        }
    }
    for op in ALL {
        args.push("-p".to_owned());
        args.push(op.binary());
    }
    args
}

static BUILT: OnceLock<Result<PathBuf, BinaryError>> = OnceLock::new();

/// The path of `op`'s binary, building all four once per process when `$CARGO` is set (so they
/// are current) unless `SLUICE_E2E_NO_BUILD=1`.
pub fn path(op: Operator) -> Result<PathBuf, BinaryError> {
    let dir = BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap_or_default();
            let dir = bin_dir(&exe);
            let skip = std::env::var("SLUICE_E2E_NO_BUILD").is_ok_and(|v| v == "1");
            if let (Some(cargo), false) = (std::env::var_os("CARGO"), skip) {
                let manifest = crate::repo_root().join("Cargo.toml");
                let args = build_args(&dir, &manifest);
                let command = format!("cargo {}", args.join(" "));
                println!("building the operator binaries: {command}");
                let status = Command::new(cargo).args(&args).status();
                match status {
                    Ok(s) if s.success() => {}
                    Ok(s) => {
                        return Err(BinaryError::Build {
                            command,
                            status: s.to_string(),
                        });
                    }
                    Err(e) => {
                        return Err(BinaryError::Build {
                            command,
                            status: e.to_string(),
                        });
                    }
                }
            }
            Ok(dir)
        })
        .clone()?;
    let path = dir.join(op.binary());
    if path.is_file() {
        Ok(path)
    } else {
        Err(BinaryError::Missing {
            binary: op.binary(),
            dir: dir.display().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_dir_is_the_profile_directory() {
        let cases = [
            ("/t/debug/deps/sluice_e2e-abc", "/t/debug"),
            ("/t/release/deps/rbac-1", "/t/release"),
            ("/opt/bin/suite", "/opt/bin"),
        ];
        for (exe, want) in cases {
            assert_eq!(bin_dir(Path::new(exe)), PathBuf::from(want), "{exe}");
        }
    }

    #[test]
    fn build_args_keep_target_dir_and_profile() {
        let m = Path::new("/r/Cargo.toml");
        let debug = build_args(Path::new("/t/debug"), m);
        assert!(debug.contains(&"--target-dir=/t".to_owned()));
        assert!(!debug.contains(&"--release".to_owned()));
        assert_eq!(debug.iter().filter(|a| *a == "-p").count(), 4);
        let release = build_args(Path::new("/t/release"), m);
        assert!(release.contains(&"--release".to_owned()));
        let elsewhere = build_args(Path::new("/opt/bin"), m);
        assert!(!elsewhere.iter().any(|a| a.starts_with("--target-dir")));
    }
}
