//! One operator binary as a child process: its output goes to a log file the scenario reads for
//! RBAC denials. Never outlives its handle: the child is killed when the handle is dropped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running operator binary.
pub struct OperatorProcess {
    child: Option<Child>,
    log: PathBuf,
    name: String,
}

impl std::fmt::Debug for OperatorProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorProcess")
            .field("name", &self.name)
            .field("log", &self.log)
            .finish()
    }
}

impl OperatorProcess {
    /// Starts `binary` with `args` plus `--kubeconfig`, logging to `log_dir/<name>.log`, with
    /// `env` set and the in-cluster variables removed.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        args: &[String],
        env: &[(String, String)],
        log_dir: &Path,
    ) -> std::io::Result<OperatorProcess> {
        let name = binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        let child = Command::new(binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()?;
        Ok(OperatorProcess {
            child: Some(child),
            log,
            name,
        })
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines that report an RBAC denial (`forbidden` or a 403).
    pub fn denials(&self) -> Vec<String> {
        denials(&self.log())
    }

    /// Whether the process has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Fails the test when the process has exited or its log reports a denial, printing the log.
    pub fn assert_healthy(&mut self) {
        if let Some(status) = self.exited() {
            panic!(
                "{} exited ({status}) during the scenario:\n{}",
                self.name,
                self.log()
            );
        }
        self.assert_no_denials();
    }

    /// Fails the test when the log reports a denial, printing the log.
    pub fn assert_no_denials(&self) {
        let d = self.denials();
        assert!(
            d.is_empty(),
            "{} was denied by RBAC (the chart grants too little):\n{}\n--- full log ---\n{}",
            self.name,
            d.join("\n"),
            self.log()
        );
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Lines of `log` that report an RBAC denial: `forbidden` (any case) or a 403 status.
pub fn denials(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            lower.contains("forbidden") || has_status_403(&lower)
        })
        .map(str::to_owned)
        .collect()
}

/// Whether `line` holds `403` as a word of its own (a status code, not `403ms`).
fn has_status_403(line: &str) -> bool {
    let bytes = line.as_bytes();
    line.match_indices("403").any(|(i, _)| {
        let before = i.checked_sub(1).map(|j| bytes[j]);
        let after = bytes.get(i + 3).copied();
        !before.is_some_and(|b| b.is_ascii_alphanumeric())
            && !after.is_some_and(|b| b.is_ascii_alphanumeric())
    })
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_find_forbidden_and_403_only() {
        let cases = [
            (
                "ERROR list failed: httproutes is Forbidden: User \"x\" cannot list",
                1,
            ),
            ("WARN ApiError: forbidden (ErrorResponse { code: 403 })", 1),
            ("status 403 Forbidden", 1),
            ("INFO reconciled checkout in 403ms", 0),
            ("INFO resourceVersion 14031", 0),
            ("INFO wrote weight 5", 0),
        ];
        for (line, want) in cases {
            assert_eq!(denials(line).len(), want, "{line}");
        }
    }
}
