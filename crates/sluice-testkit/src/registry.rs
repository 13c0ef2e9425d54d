//! Real OCI registry on loopback for tests.
//!
//! Owns one `docker-registry` process per fixture (Debian's package of the CNCF distribution
//! registry, which has no referrers API, so cosign's tag layout is what it can hold): started on
//! 127.0.0.1 and a free port, with a temporary directory holding its generated configuration,
//! its filesystem storage (deletes enabled) and its log.
//! It must never leave a process behind: the process is killed and reaped on `Drop`, which also
//! runs while a panicking test unwinds. It never listens on anything but 127.0.0.1, and it never
//! touches the system service the package may have installed (it uses its own port and storage).

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the Debian package installs the binary.
const DEBIAN_BINARY: &str = "/usr/bin/docker-registry";
/// Environment variable overriding the binary path.
pub const BINARY_ENV: &str = "SLUICE_DOCKER_REGISTRY_BIN";
/// How long the registry may take to answer `/v2/`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many free-port attempts before giving up (a port may be taken between probe and bind).
const START_ATTEMPTS: usize = 3;

/// Errors of the registry fixture.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The binary is not installed.
    #[error(
        "docker-registry binary not found (looked at ${BINARY_ENV}, {DEBIAN_BINARY} and PATH); install the \
         Debian package `docker-registry` (apt-get install -y docker-registry) or point ${BINARY_ENV} at a \
         registry binary"
    )]
    BinaryMissing,
    /// Creating the temporary directory, config file or log file failed.
    #[error("preparing the registry fixture directory failed: {0}")]
    Io(#[from] std::io::Error),
    /// The process exited or never answered `/v2/`.
    #[error("docker-registry at {url} did not become ready: {reason}; last log lines:\n{log_tail}")]
    NotReady {
        /// Base URL it was started on.
        url: String,
        /// Why it is considered not ready.
        reason: String,
        /// The last lines of its log.
        log_tail: String,
    },
}

impl RegistryError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        match self {
            RegistryError::BinaryMissing => "binary_missing",
            RegistryError::Io(_) => "io",
            RegistryError::NotReady { .. } => "not_ready",
        }
    }
}

/// A running `docker-registry`; stopped (killed and reaped) when dropped.
pub struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("host", &self.host())
            .field("pid", &self.child.id())
            .finish()
    }
}

/// Finds the binary: `$SLUICE_DOCKER_REGISTRY_BIN`, the Debian path, then `PATH`.
pub fn binary() -> Result<PathBuf, RegistryError> {
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
) -> Result<PathBuf, RegistryError> {
    if let Some(path) = override_path {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(RegistryError::BinaryMissing)
        };
    }
    if debian.is_file() {
        return Ok(debian.to_path_buf());
    }
    path_var
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("docker-registry"))
        .find(|candidate| candidate.is_file())
        .ok_or(RegistryError::BinaryMissing)
}

/// The generated configuration: loopback only, filesystem storage in the fixture directory,
/// deletes enabled (tests remove tags and manifests), no auth, no upload purging (it would race
/// with slow tests), and quiet logs.
fn config_yaml(storage: &Path, port: u16) -> String {
    format!(
        "version: 0.1\n\
         log:\n  level: warn\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
         maintenance:\n    uploadpurging:\n      enabled: false\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: sluice-test-fixture\n",
        storage.display()
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

impl Registry {
    /// Starts the fixture, or skips the calling test when the binary is missing (under CI a
    /// missing binary fails the test: see [`crate::prereq`]). Any other failure panics.
    #[track_caller]
    pub fn start_or_skip() -> impl std::future::Future<Output = Option<Self>> {
        let caller = std::panic::Location::caller();
        async move {
            match Self::start().await {
                Ok(fixture) => Some(fixture),
                Err(RegistryError::BinaryMissing) => {
                    crate::prereq::Missing::new(
                        "the `docker-registry` binary",
                        crate::prereq::INSTALL_TOOLS,
                    )
                    .skip();
                    None
                }
                Err(e) => panic!("the docker-registry fixture failed to start (at {caller}): {e}"),
            }
        }
    }

    /// Starts `docker-registry` on 127.0.0.1 and a free port and waits until `/v2/` answers 200.
    pub async fn start() -> Result<Self, RegistryError> {
        let binary = binary()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&binary).await {
                Ok(registry) => return Ok(registry),
                Err(err @ RegistryError::NotReady { .. }) => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or(RegistryError::BinaryMissing))
    }

    async fn start_once(binary: &Path) -> Result<Self, RegistryError> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-registry-")
            .tempdir()?;
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage)?;
        let port = free_port()?;
        let config = dir.path().join("config.yml");
        std::fs::write(&config, config_yaml(&storage, port))?;
        let log_path = dir.path().join("registry.log");
        let log = File::create(&log_path)?;
        // The registry reads REGISTRY_* variables over its config file: start it with a clean
        // environment so a developer's shell cannot change what the tests run against.
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        // From here on, Drop owns the process: an early return kills it.
        let mut registry = Self { child, dir, port };
        registry.wait_ready(&log_path).await?;
        Ok(registry)
    }

    async fn wait_ready(&mut self, log_path: &Path) -> Result<(), RegistryError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .no_proxy()
            .build()
            .expect("building a plain HTTP client cannot fail");
        let ready_url = format!("{}/v2/", self.url());
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(RegistryError::NotReady {
                    url: self.url(),
                    reason: format!("process exited with {status}"),
                    log_tail: tail(log_path, 20),
                });
            }
            if let Ok(response) = http.get(&ready_url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(RegistryError::NotReady {
                    url: self.url(),
                    reason: format!("/v2/ not 200 within {READY_TIMEOUT:?}"),
                    log_tail: tail(log_path, 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `host:port` as it appears in image references, e.g. `127.0.0.1:41234`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.host())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A repository reference without tag or digest, e.g. `127.0.0.1:41234/mesh/config`.
    pub fn repository(&self, name: &str) -> String {
        format!("{}/{}", self.host(), name.trim_matches('/'))
    }

    /// The process id (tests use it to prove the process is gone after drop).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The fixture's temporary directory (`config.yml`, `storage/`, `registry.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The registry's log so far (useful in assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Kill and reap so no zombie or orphan outlives the test, even while unwinding.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_binary_prefers_override_then_debian_then_path() {
        let dir = tempfile::tempdir().unwrap();
        let debian = dir.path().join("debian-registry");
        let on_path_dir = dir.path().join("bin");
        std::fs::create_dir_all(&on_path_dir).unwrap();
        let on_path = on_path_dir.join("docker-registry");
        let custom = dir.path().join("custom");
        std::fs::write(&on_path, "").unwrap();
        std::fs::write(&custom, "").unwrap();
        let path_var = Some(on_path_dir.clone().into_os_string());

        struct Case {
            name: &'static str,
            override_path: Option<PathBuf>,
            debian_exists: bool,
            path_var: Option<std::ffi::OsString>,
            want: Option<PathBuf>,
        }
        let cases = [
            Case {
                name: "override wins",
                override_path: Some(custom.clone()),
                debian_exists: true,
                path_var: path_var.clone(),
                want: Some(custom.clone()),
            },
            Case {
                name: "override pointing nowhere is an error, not a fallback",
                override_path: Some(dir.path().join("missing")),
                debian_exists: true,
                path_var: path_var.clone(),
                want: None,
            },
            Case {
                name: "debian path before PATH",
                override_path: None,
                debian_exists: true,
                path_var: path_var.clone(),
                want: Some(debian.clone()),
            },
            Case {
                name: "PATH as last resort",
                override_path: None,
                debian_exists: false,
                path_var: path_var.clone(),
                want: Some(on_path.clone()),
            },
            Case {
                name: "nothing anywhere",
                override_path: None,
                debian_exists: false,
                path_var: None,
                want: None,
            },
        ];
        for case in cases {
            if case.debian_exists {
                std::fs::write(&debian, "").unwrap();
            } else {
                let _ = std::fs::remove_file(&debian);
            }
            let got = find_binary(
                case.override_path.map(PathBuf::into_os_string),
                &debian,
                case.path_var,
            );
            match (got, case.want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{}", case.name),
                (Err(err), None) => {
                    assert_eq!(err.category(), "binary_missing", "{}", case.name);
                    assert!(
                        err.to_string()
                            .contains("apt-get install -y docker-registry"),
                        "{}: message must name the apt package: {err}",
                        case.name
                    );
                }
                (got, want) => panic!("{}: got {got:?}, want {want:?}", case.name),
            }
        }
    }

    #[test]
    fn config_listens_on_loopback_only_with_deletes_enabled() {
        let yaml = config_yaml(Path::new("/tmp/x/storage"), 4321);
        assert!(yaml.contains("addr: 127.0.0.1:4321"), "{yaml}");
        assert!(yaml.contains("rootdirectory: /tmp/x/storage"), "{yaml}");
        assert!(
            yaml.contains("delete:\n    enabled: true"),
            "deletes must be enabled: {yaml}"
        );
    }

    /// Whether the binary is here; otherwise the test fails under CI and is skipped and counted.
    fn binary_or_skip() -> bool {
        let found = binary()
            .map_err(|e| crate::prereq::Missing::new(e.to_string(), crate::prereq::INSTALL_TOOLS));
        crate::prereq::or_skip(found).is_some()
    }

    fn process_alive(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[tokio::test]
    async fn registry_starts_serves_and_stops_cleanly() {
        if !binary_or_skip() {
            return;
        }
        let registry = Registry::start().await.expect("registry starts");
        let pid = registry.pid();
        assert!(process_alive(pid));
        let http = reqwest::Client::builder().no_proxy().build().unwrap();

        // It serves the distribution API: /v2/ answers with the API version header.
        let v2 = http
            .get(format!("{}/v2/", registry.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(v2.status(), 200);
        assert_eq!(
            v2.headers()
                .get("docker-distribution-api-version")
                .map(|v| v.to_str().unwrap_or_default().to_string()),
            Some("registry/2.0".to_string())
        );

        // It stores what it is given: a monolithic blob upload, then read it back.
        let blob = b"sluice registry fixture";
        // sha256 of `blob`, computed once with `sha256sum`.
        let digest = "sha256:feacf42a6abf6412e00edf310c521aca67e2e95e0f279a6b2b601d0e3354bea2";
        let start = http
            .post(format!(
                "{}/v2/fixture/check/blobs/uploads/",
                registry.url()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(start.status(), 202, "{}", registry.log());
        let location = start.headers()["location"].to_str().unwrap().to_string();
        let location = if location.starts_with("http") {
            location
        } else {
            format!("{}{location}", registry.url())
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = http
            .put(format!("{location}{sep}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .body(blob.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201, "{}", registry.log());
        let got = http
            .get(format!(
                "{}/v2/fixture/check/blobs/{digest}",
                registry.url()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), 200);
        assert_eq!(got.bytes().await.unwrap().as_ref(), blob);
        assert!(registry.dir().join("storage/docker").exists());

        let dir = registry.dir().to_path_buf();
        drop(registry);
        assert!(!process_alive(pid), "registry process {pid} outlived Drop");
        assert!(!dir.exists(), "fixture directory {dir:?} outlived Drop");
    }

    #[tokio::test]
    async fn registry_is_stopped_when_a_test_panics() {
        if !binary_or_skip() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let outcome = tokio::spawn(async move {
            let registry = Registry::start().await.expect("registry starts");
            tx.send(registry.pid()).unwrap();
            panic!("deliberate panic while the registry runs");
        })
        .await;
        assert!(outcome.is_err(), "the task must have panicked");
        let pid = rx.recv().unwrap();
        assert!(
            !process_alive(pid),
            "registry process {pid} outlived a panic"
        );
    }
}
