//! The programs the sandbox needs on the machine (Prometheus, the registry, git) and what to do
//! when one is missing: install it with apt when running as root with apt available, otherwise
//! say exactly what to install. The decision is pure ([`decide`]); only [`ensure`] runs apt.
//! Never installs anything but the listed Debian packages.

use std::path::Path;
use std::process::Command;

/// A program the sandbox runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// What it is for, in words.
    pub purpose: &'static str,
    /// Debian package that provides it.
    pub package: &'static str,
}

/// Prometheus: the metrics the mesh simulator writes and the gates read.
pub const PROMETHEUS: Tool = Tool {
    purpose: "Prometheus (mesh telemetry)",
    package: "prometheus",
};
/// The OCI registry holding signed bundles.
pub const REGISTRY: Tool = Tool {
    purpose: "the OCI registry (signed bundles)",
    package: "docker-registry",
};
/// git, for the intent repository.
pub const GIT: Tool = Tool {
    purpose: "git (the intent repository)",
    package: "git",
};

/// What to do about missing tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Everything is installed.
    Ready,
    /// Install these packages with apt, then go on.
    Install(Vec<&'static str>),
    /// Stop and tell the user this (what is missing and the exact command).
    Tell(String),
}

/// The apt command line that installs `packages`.
pub fn apt_command(packages: &[&str]) -> String {
    format!("apt-get install -y {}", packages.join(" "))
}

/// Decides from what is missing, whether we run as root and whether apt is available.
pub fn decide(missing: &[Tool], root: bool, apt: bool) -> Plan {
    if missing.is_empty() {
        return Plan::Ready;
    }
    let packages: Vec<&'static str> = missing.iter().map(|t| t.package).collect();
    if root && apt {
        return Plan::Install(packages);
    }
    let what: Vec<&str> = missing.iter().map(|t| t.purpose).collect();
    let why = match (root, apt) {
        (false, true) => "the sandbox is not running as root, so it does not install them itself",
        _ => "apt-get is not available here, so the sandbox cannot install them",
    };
    Plan::Tell(format!(
        "missing: {}; {why}. Install the Debian packages with `sudo {}` (or put the binaries on \
         PATH, or point SLUICE_PROMETHEUS_BIN / SLUICE_DOCKER_REGISTRY_BIN at them), then start the \
         sandbox again",
        what.join(", "),
        apt_command(&packages),
    ))
}

/// Which of the sandbox's tools are missing on this machine.
pub fn missing() -> Vec<Tool> {
    let mut out = Vec::new();
    if sluice_testkit::prometheus::binary().is_err() {
        out.push(PROMETHEUS);
    }
    if sluice_testkit::registry::binary().is_err() {
        out.push(REGISTRY);
    }
    if !on_path("git") {
        out.push(GIT);
    }
    out
}

/// Whether `name` is an executable file in a `PATH` directory.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
        .unwrap_or(false)
}

/// Whether this process runs as root (effective uid 0, from `/proc/self/status`).
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// A tool could not be made available.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PrerequisiteError {
    /// Something is missing and the sandbox may not install it.
    #[error("{0}")]
    Missing(String),
    /// apt ran and failed.
    #[error(
        "`{command}` failed ({status}); run it yourself to see why (network, a held lock), then start the sandbox again"
    )]
    Install {
        /// The command run.
        command: String,
        /// Its exit status or spawn error.
        status: String,
    },
    /// apt succeeded but a tool is still missing.
    #[error(
        "{0} is still missing after installing its package; check the package provides it on PATH"
    )]
    StillMissing(&'static str),
}

impl PrerequisiteError {
    /// Bounded category for logs and the scenario JSON.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

fn apt(args: &[&str]) -> Result<(), String> {
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(status.to_string())
    }
}

/// Makes sure every tool is there: installs with apt when allowed (saying so on stderr), else
/// returns the message saying exactly what to install.
pub fn ensure() -> Result<(), PrerequisiteError> {
    let absent = missing();
    let apt_present = Path::new("/usr/bin/apt-get").is_file();
    match decide(&absent, running_as_root(), apt_present) {
        Plan::Ready => Ok(()),
        Plan::Tell(message) => Err(PrerequisiteError::Missing(message)),
        Plan::Install(packages) => {
            let command = apt_command(&packages);
            eprintln!("sluice sandbox: installing missing packages: {command}");
            let mut args = vec!["install", "-y"];
            args.extend(packages.iter().copied());
            if apt(&args).is_err() {
                // Fresh machines often have no package lists yet.
                eprintln!(
                    "sluice sandbox: install failed; refreshing package lists (apt-get update) and retrying"
                );
                apt(&["update"]).map_err(|status| PrerequisiteError::Install {
                    command: "apt-get update".into(),
                    status,
                })?;
                apt(&args).map_err(|status| PrerequisiteError::Install {
                    command: command.clone(),
                    status,
                })?;
            }
            match missing().first() {
                Some(tool) => Err(PrerequisiteError::StillMissing(tool.purpose)),
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_follows_root_and_apt() {
        let cases: [(&[Tool], bool, bool, &str); 6] = [
            (&[], false, false, "ready"),
            (&[], true, true, "ready"),
            (
                &[PROMETHEUS, REGISTRY],
                true,
                true,
                "install prometheus docker-registry",
            ),
            (&[REGISTRY], true, true, "install docker-registry"),
            (&[PROMETHEUS, REGISTRY], false, true, "tell"),
            (&[GIT], true, false, "tell"),
        ];
        for (missing, root, apt, want) in cases {
            let got = match decide(missing, root, apt) {
                Plan::Ready => "ready".to_string(),
                Plan::Install(p) => format!("install {}", p.join(" ")),
                Plan::Tell(_) => "tell".to_string(),
            };
            assert_eq!(got, want, "missing {missing:?} root {root} apt {apt}");
        }
    }

    #[test]
    fn the_message_names_what_is_missing_and_the_exact_command() {
        let Plan::Tell(msg) = decide(&[PROMETHEUS, REGISTRY], false, true) else {
            panic!("expected a message")
        };
        assert!(
            msg.contains("apt-get install -y prometheus docker-registry"),
            "{msg}"
        );
        assert!(msg.contains("Prometheus"), "{msg}");
        assert!(msg.contains("not running as root"), "{msg}");
        let Plan::Tell(msg) = decide(&[GIT], true, false) else {
            panic!("expected a message")
        };
        assert!(msg.contains("apt-get install -y git"), "{msg}");
        assert!(msg.contains("apt-get is not available"), "{msg}");
    }

    #[test]
    fn root_is_read_from_proc() {
        // The answer must agree with the owner of a file this process creates.
        use std::os::unix::fs::MetadataExt;
        let f = tempfile::NamedTempFile::new().unwrap();
        let uid = f.as_file().metadata().unwrap().uid();
        assert_eq!(running_as_root(), uid == 0);
    }
}
