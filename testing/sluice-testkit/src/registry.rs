//! Real OCI registry on loopback for tests.
//!
//! Owns one `docker-registry` process per fixture (Debian's package of the CNCF distribution
//! registry, which has no referrers API, so cosign's tag layout is what it can hold): started on
//! 127.0.0.1 and a free port, with a temporary directory holding its generated configuration,
//! its filesystem storage (deletes enabled) and its log.
//! A secure fixture ([`Registry::start_secure`]) serves HTTPS with a certificate from a CA made
//! for the run and authenticates clients with htpasswd basic auth or Docker's token flow (a
//! token service from [`crate::registry_token`] on 127.0.0.1, its signing certificate in the
//! registry's `rootcertbundle`).
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
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    /// Generating the fixture's certificates or starting its token service failed.
    #[error("preparing the registry fixture's TLS or token service failed: {0}")]
    Tls(String),
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
        self.into()
    }
}

/// The user name the secure fixture accepts.
pub const USERNAME: &str = "sluice";
/// The password the secure fixture accepts.
pub const PASSWORD: &str = "sluice-registry-password";
/// The OAuth2 refresh token (a Docker config's `identitytoken`) the token service accepts.
pub const IDENTITY_TOKEN: &str = "sluice-registry-refresh-token";
/// bcrypt (cost 5) of [`PASSWORD`], the only hash distribution's htpasswd accepts; made once with
/// `perl -e 'print crypt("sluice-registry-password", "$2b$05$c2x1aWNlZml4dHVyZXNhbHQ")'` (glibc's
/// crypt). The secure fixture's tests prove it: the password is accepted, another is refused.
const PASSWORD_BCRYPT: &str = "$2b$05$c2x1aWNlZml4dHVyZXNhb.UdtsmdKw/YYBik3tLYfND56TiU8kadW";

/// How the secure fixture authenticates clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// HTTP basic auth against an htpasswd file ([`USERNAME`], [`PASSWORD`]).
    Htpasswd,
    /// Docker's token flow: the registry answers `401` with a `Bearer` challenge naming a token
    /// service on 127.0.0.1 that issues tokens for [`USERNAME`]/[`PASSWORD`] (or
    /// [`IDENTITY_TOKEN`] as a refresh token).
    Token,
}

/// A running `docker-registry`; stopped (killed and reaped) when dropped.
pub struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    ca_pem: Option<String>,
    token: Option<crate::registry_token::TokenServer>,
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
/// deletes enabled (tests remove tags and manifests), no upload purging (it would race with slow
/// tests), and quiet logs; `http_extra` (indented under `http:`) and `auth` sections are added
/// for a secure fixture.
#[cfg(test)]
fn config_yaml(storage: &Path, port: u16) -> String {
    config_yaml_with(storage, port, "", "")
}

fn config_yaml_with(storage: &Path, port: u16, http_extra: &str, auth: &str) -> String {
    format!(
        "version: 0.1\n\
         log:\n  level: warn\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
         maintenance:\n    uploadpurging:\n      enabled: false\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: sluice-test-fixture\n{http_extra}{auth}",
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

    /// Starts the secure fixture (HTTPS from a CA made for this run, and `auth`), or skips the
    /// calling test when the binary is missing (under CI it fails: see [`crate::prereq`]).
    #[track_caller]
    pub fn start_secure_or_skip(auth: Auth) -> impl std::future::Future<Output = Option<Self>> {
        let caller = std::panic::Location::caller();
        async move {
            match Self::start_secure(auth).await {
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

    /// Starts `docker-registry` on 127.0.0.1 with TLS (a serving certificate for `127.0.0.1`
    /// and `localhost` from a CA made for this run, see [`Registry::ca_pem`]) and `auth`.
    pub async fn start_secure(auth: Auth) -> Result<Self, RegistryError> {
        let binary = binary()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_secure_once(&binary, auth).await {
                Ok(registry) => return Ok(registry),
                Err(err @ RegistryError::NotReady { .. }) => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or(RegistryError::BinaryMissing))
    }

    async fn start_secure_once(binary: &Path, auth: Auth) -> Result<Self, RegistryError> {
        let tls = |e: rcgen::Error| RegistryError::Tls(e.to_string());
        let dir = tempfile::Builder::new()
            .prefix("sluice-registry-")
            .tempdir()?;
        let ca = crate::control_plane::CertificateAuthority::generate("sluice registry test CA")
            .map_err(tls)?;
        let serving = ca.server(&["127.0.0.1", "localhost"]).map_err(tls)?;
        std::fs::write(dir.path().join("tls.crt"), &serving.cert_pem)?;
        std::fs::write(dir.path().join("tls.key"), &serving.key_pem)?;
        let http_extra = format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            dir.path().join("tls.crt").display(),
            dir.path().join("tls.key").display()
        );
        let (auth_yaml, token) = match auth {
            Auth::Htpasswd => {
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, format!("{USERNAME}:{PASSWORD_BCRYPT}\n"))?;
                (
                    format!(
                        "auth:\n  htpasswd:\n    realm: sluice-test\n    path: {}\n",
                        path.display()
                    ),
                    None,
                )
            }
            Auth::Token => {
                // Tokens are signed by a certificate of a second CA, the registry's
                // rootcertbundle; the token service itself serves TLS from the first.
                let token_ca =
                    crate::control_plane::CertificateAuthority::generate("sluice token issuer")
                        .map_err(tls)?;
                let signing = token_ca.server(&["sluice-token-signer"]).map_err(tls)?;
                let bundle = dir.path().join("token-roots.pem");
                std::fs::write(&bundle, token_ca.cert_pem())?;
                let server = crate::registry_token::TokenServer::start(
                    &ca,
                    &signing,
                    crate::registry_token::Accepts {
                        username: USERNAME.into(),
                        password: PASSWORD.into(),
                        refresh_token: IDENTITY_TOKEN.into(),
                    },
                )
                .await
                .map_err(RegistryError::Tls)?;
                (
                    format!(
                        "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    \
                         rootcertbundle: {}\n",
                        server.realm(),
                        crate::registry_token::SERVICE,
                        crate::registry_token::ISSUER,
                        bundle.display()
                    ),
                    Some(server),
                )
            }
        };
        Self::spawn(
            binary,
            dir,
            &http_extra,
            &auth_yaml,
            Some(ca.cert_pem().to_owned()),
            token,
        )
        .await
    }

    async fn start_once(binary: &Path) -> Result<Self, RegistryError> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-registry-")
            .tempdir()?;
        Self::spawn(binary, dir, "", "", None, None).await
    }

    async fn spawn(
        binary: &Path,
        dir: tempfile::TempDir,
        http_extra: &str,
        auth: &str,
        ca_pem: Option<String>,
        token: Option<crate::registry_token::TokenServer>,
    ) -> Result<Self, RegistryError> {
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage)?;
        let port = free_port()?;
        let config = dir.path().join("config.yml");
        std::fs::write(&config, config_yaml_with(&storage, port, http_extra, auth))?;
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
        let mut registry = Self {
            child,
            dir,
            port,
            ca_pem,
            token,
        };
        registry.wait_ready(&log_path).await?;
        Ok(registry)
    }

    async fn wait_ready(&mut self, log_path: &Path) -> Result<(), RegistryError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .no_proxy();
        if let Some(ca) = &self.ca_pem {
            let roots = reqwest::Certificate::from_pem_bundle(ca.as_bytes())
                .map_err(|e| RegistryError::Tls(e.to_string()))?;
            http = http.tls_certs_only(roots);
        }
        let http = http
            .build()
            .map_err(|e| RegistryError::Tls(e.to_string()))?;
        let ready_url = format!("{}/v2/", self.url());
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(RegistryError::NotReady {
                    url: self.url(),
                    reason: format!("process exited with {status}"),
                    log_tail: tail(log_path, 20),
                });
            }
            // A secure fixture answers `/v2/` with 401 until a client authenticates.
            if let Ok(response) = http.get(&ready_url).send().await
                && (response.status().is_success() || response.status().as_u16() == 401)
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

    /// Base URL, e.g. `http://127.0.0.1:41234` (`https://` for a secure fixture).
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.host())
    }

    /// The PEM certificate of the CA that signed a secure fixture's serving certificate (what a
    /// client must trust); `None` for a plain-HTTP fixture.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The requests the token service of an [`Auth::Token`] fixture received.
    pub fn token_requests(&self) -> Vec<crate::registry_token::TokenRequest> {
        self.token
            .as_ref()
            .map(|t| t.requests())
            .unwrap_or_default()
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

    fn trusting(ca: &str) -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only(reqwest::Certificate::from_pem_bundle(ca.as_bytes()).unwrap())
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn secure_registry_with_htpasswd_accepts_only_its_password() {
        if !binary_or_skip() {
            return;
        }
        let registry = Registry::start_secure(Auth::Htpasswd).await.unwrap();
        assert!(registry.url().starts_with("https://127.0.0.1:"));
        let http = trusting(registry.ca_pem().unwrap());
        let v2 = format!("{}/v2/", registry.url());
        let anonymous = http.get(&v2).send().await.unwrap();
        assert_eq!(anonymous.status(), 401);
        assert!(
            anonymous.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Basic "),
            "{:?}",
            anonymous.headers()
        );
        let wrong = http
            .get(&v2)
            .basic_auth(USERNAME, Some("wrong"))
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401);
        let right = http
            .get(&v2)
            .basic_auth(USERNAME, Some(PASSWORD))
            .send()
            .await
            .unwrap();
        assert_eq!(right.status(), 200, "{}", registry.log());
        // An untrusting client fails the TLS handshake.
        let plain = reqwest::Client::builder().no_proxy().build().unwrap();
        assert!(plain.get(&v2).send().await.is_err());
    }

    #[tokio::test]
    async fn secure_registry_with_token_auth_accepts_the_tokens_its_service_issues() {
        if !binary_or_skip() {
            return;
        }
        let registry = Registry::start_secure(Auth::Token).await.unwrap();
        let http = trusting(registry.ca_pem().unwrap());
        let manifest = format!("{}/v2/mesh/config/manifests/v1", registry.url());
        let anonymous = http.get(&manifest).send().await.unwrap();
        assert_eq!(anonymous.status(), 401);
        let challenge = anonymous.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            challenge.starts_with("Bearer realm=\"https://127.0.0.1:")
                && challenge.contains("service=\"sluice-test-registry\"")
                && challenge.contains("scope=\"repository:mesh/config:pull\""),
            "{challenge}"
        );
        let realm = challenge.split('"').nth(1).unwrap().to_owned();
        let token_for = async |password: &str| {
            http.get(format!(
                "{realm}?service=sluice-test-registry&scope=repository%3Amesh%2Fconfig%3Apull"
            ))
            .basic_auth(USERNAME, Some(password))
            .send()
            .await
            .unwrap()
        };
        assert_eq!(token_for("wrong").await.status(), 401);
        let answer: serde_json::Value = token_for(PASSWORD).await.json().await.unwrap();
        let token = answer["token"].as_str().unwrap();
        // The registry verifies the token (issuer, audience, x5c chain, ES256 signature) and
        // its access claim: the manifest does not exist, so 404 means it was let in.
        let authorized = http.get(&manifest).bearer_auth(token).send().await.unwrap();
        assert_eq!(authorized.status(), 404, "{}", registry.log());
        // The signature with one character (six bits, none of them padding) changed.
        let at = token.len() - 10;
        let swapped = if &token[at..=at] == "A" { "B" } else { "A" };
        let forged = format!("{}{swapped}{}", &token[..at], &token[at + 1..]);
        let refused = http
            .get(&manifest)
            .bearer_auth(forged)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401);
        assert_eq!(registry.token_requests().len(), 2);
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
