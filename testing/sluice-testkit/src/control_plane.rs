//! A real Kubernetes control plane on loopback for tests: etcd, kube-apiserver and, when asked,
//! kube-controller-manager, built by `scripts/install-control-plane.sh` (DESIGN.md, "Test
//! strategy", tier 3).
//!
//! Owns the processes it starts, their temporary directory (certificates, keys, etcd's data,
//! kubeconfigs, logs) and the free loopback ports they listen on. Every process is killed and
//! its directory removed when the [`ControlPlane`] (or [`Etcd`]) is dropped, which also runs while
//! a panicking test unwinds. A control plane held in a `static` ([`shared`]) is never dropped, and a
//! test process may die without unwinding (abort, SIGKILL, `process::exit`): for those, every
//! fixture starts a watchdog process (`sh`) reading a pipe from the test process. The test process
//! tells it each child's pid; when the pipe closes without the fixture having said it cleaned
//! up, the test process is gone and the watchdog kills the children and removes the directory.
//! It never listens on anything but 127.0.0.1 and never needs `unsafe`.
//!
//! Identities: the administrator is a client certificate in `system:masters`; service accounts
//! get tokens from the TokenRequest API ([`ControlPlane::service_account_token`]), signed with a
//! key generated per run. One control plane may serve the tests of one test binary with a
//! namespace per test ([`ControlPlane::namespace`]); several API servers may share one etcd, each
//! under its own `--etcd-prefix` ([`Options::etcd`]).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope;
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde::Deserialize as _;

use crate::prereq::{self, Missing};

/// The command that builds the control plane's binaries.
pub const INSTALL: &str = "bash scripts/install-control-plane.sh";
/// The Kubernetes version the install script builds (what `/version` reports).
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// How long etcd and kube-apiserver may take to become ready (two shared cores, cold start).
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How many times a process is started on fresh ports when it dies before it is ready (a port
/// may be taken between the probe and the bind).
const START_ATTEMPTS: usize = 3;
/// The service-account issuer written into every token.
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The controllers kube-controller-manager runs: the workload controllers, the garbage collector,
/// namespace deletion, PodDisruptionBudget status, service accounts and their tokens, and
/// EndpointSlices. Node lifecycle is off: no kubelet keeps Nodes Ready here.
pub const CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "disruption-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "endpointslice-controller",
];

/// Errors of the control-plane fixture.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ControlPlaneError {
    /// A binary is not installed.
    #[error(transparent)]
    Missing(#[from] Missing),
    /// Creating the directory, a file or a process failed.
    #[error("preparing the control plane failed: {0}")]
    Io(#[from] std::io::Error),
    /// Generating a certificate or key failed.
    #[error("generating the control plane's certificates failed: {0}")]
    Certificates(#[from] rcgen::Error),
    /// A process exited or never became ready.
    #[error("{component} did not become ready: {reason}; last log lines ({log}):\n{log_tail}")]
    NotReady {
        /// etcd, kube-apiserver or kube-controller-manager.
        component: &'static str,
        /// Why it is considered not ready.
        reason: String,
        /// Its log file.
        log: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The client configuration built for the control plane was refused.
    #[error("building a client for the control plane failed: {0}")]
    Client(String),
    /// A request to the API server failed.
    #[error("request to the control plane failed: {0}")]
    Kube(#[from] kube::Error),
    /// A manifest given to the fixture is not what it should be.
    #[error("manifest for the control plane: {0}")]
    Manifest(String),
}

impl ControlPlaneError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// The control plane's binaries, found by [`binaries`].
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kubectl` of the same build.
    pub kubectl: PathBuf,
}

/// Environment variable naming another kube-apiserver binary to test against (e.g. the chart's
/// `kubeVersion` floor); the other binaries stay those of [`INSTALL`].
pub const KUBE_APISERVER_ENV: &str = "SLUICE_KUBE_APISERVER";

/// Finds the binaries in `.tools/bin` or on `PATH` (kube-apiserver: `$SLUICE_KUBE_APISERVER`
/// first); the error names the first one missing and the install script.
pub fn binaries() -> Result<Binaries, Missing> {
    let kube_apiserver = match std::env::var_os(KUBE_APISERVER_ENV) {
        Some(path) if Path::new(&path).is_file() => PathBuf::from(path),
        Some(path) => {
            return Err(Missing::new(
                format!(
                    "the kube-apiserver ${KUBE_APISERVER_ENV} names ({})",
                    Path::new(&path).display()
                ),
                INSTALL,
            ));
        }
        None => prereq::binary_with("kube-apiserver", INSTALL)?,
    };
    Ok(Binaries {
        etcd: prereq::binary_with("etcd", INSTALL)?,
        kube_apiserver,
        kube_controller_manager: prereq::binary_with("kube-controller-manager", INSTALL)?,
        kubectl: prereq::binary_with("kubectl", INSTALL)?,
    })
}

/// [`binaries`], skipping the calling test (failing it under CI) when one is missing.
#[track_caller]
pub fn require() -> Option<Binaries> {
    prereq::or_skip(binaries())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

// --- watchdog -------------------------------------------------------------------------------

/// The watchdog's program. It reads lines from the test process: `pid N` adds a process to kill,
/// `done` means the fixture cleaned up itself. End of input without `done` means the test process
/// is gone: the processes get SIGTERM, then SIGKILL after five seconds, and the directory is
/// removed. Signals sent to the whole process group (Ctrl-C) are ignored so that the watchdog
/// outlives the test process it guards.
const WATCHDOG_SCRIPT: &str = r#"
trap '' INT TERM HUP PIPE
dir=$1
pids=
while IFS= read -r line; do
  case $line in
    "pid "*) pids="$pids ${line#pid }" ;;
    done) exit 0 ;;
  esac
done
if [ -n "$pids" ]; then
  kill -TERM $pids 2>/dev/null
  i=0
  while [ $i -lt 50 ]; do
    alive=
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
    i=$((i + 1))
  done
  kill -KILL $pids 2>/dev/null
fi
rm -rf "$dir"
"#;

/// A watchdog process guarding the children and the directory of one fixture.
struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    fn start(dir: &Path) -> std::io::Result<Self> {
        // Rust opens the pipe close-on-exec, so processes started later do not hold its write end
        // open: it closes exactly when this process exits.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("sluice-control-plane-watchdog")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    fn guard(&mut self, pid: u32) -> std::io::Result<()> {
        match self.stdin.as_mut() {
            Some(stdin) => {
                stdin.write_all(format!("pid {pid}\n").as_bytes())?;
                stdin.flush()
            }
            None => Ok(()),
        }
    }

    /// The fixture cleaned up: the watchdog exits without touching anything.
    fn dismiss(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"done\n");
        }
        let _ = self.child.wait();
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// One fixture's processes, directory and watchdog; everything goes on drop.
struct Supervised {
    dir: Option<tempfile::TempDir>,
    children: Vec<(&'static str, Child)>,
    watchdog: Watchdog,
}

impl Supervised {
    fn new(prefix: &str) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let watchdog = Watchdog::start(dir.path())?;
        Ok(Self {
            dir: Some(dir),
            children: Vec::new(),
            watchdog,
        })
    }

    fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("/"))
    }

    /// Starts `command` with its output in `<dir>/<name>.log`, guarded by the watchdog.
    fn spawn(&mut self, name: &'static str, mut command: Command) -> std::io::Result<PathBuf> {
        let log = self.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()?;
        self.watchdog.guard(child.id())?;
        self.children.push((name, child));
        Ok(log)
    }

    /// Whether the named child has exited (and how).
    fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let (_, child) = self.children.iter_mut().find(|(n, _)| *n == name)?;
        child.try_wait().ok().flatten()
    }

    fn kill(&mut self, name: &str) {
        if let Some(i) = self.children.iter().position(|(n, _)| *n == name) {
            let (_, mut child) = self.children.remove(i);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.children.iter().map(|(_, c)| c.id()).collect();
        pids.push(self.watchdog.pid());
        pids
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // The last started depends on the earlier ones: stop in reverse.
        while let Some((_, mut child)) = self.children.pop() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
        self.watchdog.dismiss();
    }
}

// --- certificates ---------------------------------------------------------------------------

/// A certificate authority generated per run; issues the API server's serving certificate, the
/// administrator's client certificate and, for webhooks a test serves, more serving certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: Vec<u8>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertifiedKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key (PKCS#8), PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertifiedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a private key.
        f.debug_struct("CertifiedKey").finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new CA with a fresh key.
    pub fn generate(name: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM: what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// A serving certificate for the given DNS names and IP addresses (`"127.0.0.1"` becomes an
    /// IP SAN).
    pub fn server(&self, names: &[&str]) -> Result<CertifiedKey, rcgen::Error> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("server"),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params)
    }

    /// A client certificate for user `name` in `groups` (kube-apiserver reads the common name as
    /// the user and the organizations as groups).
    pub fn client(&self, name: &str, groups: &[&str]) -> Result<CertifiedKey, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<CertifiedKey, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

// --- etcd -----------------------------------------------------------------------------------

/// A running etcd on loopback; stopped and its data removed when dropped (or, if this process
/// dies, by its watchdog).
pub struct Etcd {
    procs: Supervised,
    client_port: u16,
    peer_port: u16,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("url", &self.url())
            .field("dir", &self.procs.path())
            .finish()
    }
}

impl Etcd {
    /// Starts etcd on free loopback ports and waits until it reports healthy.
    pub async fn start() -> Result<Self, ControlPlaneError> {
        let bin = prereq::binary_with("etcd", INSTALL)?;
        let mut procs = Supervised::new("sluice-etcd-")?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let client_port = free_port()?;
            let peer_port = free_port()?;
            let data = procs.path().join("data");
            let _ = std::fs::remove_dir_all(&data);
            let client = format!("http://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let mut cmd = Command::new(&bin);
            cmd.arg("--name=sluice")
                .arg(format!("--data-dir={}", data.display()))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!("--listen-peer-urls={peer}"))
                .arg(format!("--initial-advertise-peer-urls={peer}"))
                .arg(format!("--initial-cluster=sluice={peer}"))
                // Test data need not survive a power loss; fsync would dominate every write.
                .arg("--unsafe-no-fsync=true")
                .arg("--log-level=warn");
            let log = procs.spawn("etcd", cmd)?;
            match wait_etcd(&mut procs, client_port, &log).await {
                Ok(()) => {
                    return Ok(Self {
                        procs,
                        client_port,
                        peer_port,
                    });
                }
                Err(e @ ControlPlaneError::NotReady { .. }) if procs.exited("etcd").is_some() => {
                    procs.kill("etcd");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ControlPlaneError::Client("etcd never started".into())))
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Process ids of etcd and its watchdog.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.pids()
    }

    /// The ports etcd listens on (client, peer).
    pub fn ports(&self) -> Vec<u16> {
        vec![self.client_port, self.peer_port]
    }

    /// Its temporary directory.
    pub fn dir(&self) -> &Path {
        self.procs.path()
    }
}

async fn wait_etcd(procs: &mut Supervised, port: u16, log: &Path) -> Result<(), ControlPlaneError> {
    let url = format!("http://127.0.0.1:{port}/health");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
    let start = Instant::now();
    let not_ready = |reason: String| ControlPlaneError::NotReady {
        component: "etcd",
        reason,
        log: log.display().to_string(),
        log_tail: tail(log, 30),
    };
    loop {
        if let Some(status) = procs.exited("etcd") {
            return Err(not_ready(format!("etcd exited ({status})")));
        }
        if let Ok(resp) = http.get(&url).send().await
            && let Ok(body) = resp.text().await
            && body.contains("\"health\":\"true\"")
        {
            return Ok(());
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(not_ready(format!(
                "{url} not healthy after {READY_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// --- control plane --------------------------------------------------------------------------

/// The documents of a multi-document YAML text, parsed before any request is sent (the YAML
/// parser is not `Send`, so holding it across an await would keep the futures of
/// [`ControlPlane::apply_yaml`] and [`ControlPlane::install_crds`] off spawned tasks).
fn yaml_documents(yaml: &str) -> Result<Vec<serde_json::Value>, ControlPlaneError> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            serde_json::Value::deserialize(doc)
                .map_err(|e| ControlPlaneError::Manifest(e.to_string()))
        })
        .collect()
}

/// How to start a [`ControlPlane`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Also run kube-controller-manager with [`CONTROLLERS`].
    pub controller_manager: bool,
    /// With `controller_manager`, run these controllers instead of [`CONTROLLERS`] (e.g. only
    /// the service-account and namespace controllers while a simulator plays the workload
    /// controllers). Empty: [`CONTROLLERS`].
    pub controllers: Vec<&'static str>,
    /// Share this etcd (under a prefix of its own) instead of starting one.
    pub etcd: Option<Arc<Etcd>>,
}

/// A running kube-apiserver (with its etcd, unless shared, and optionally
/// kube-controller-manager) on loopback; everything stops and is removed when dropped.
pub struct ControlPlane {
    // Dropped first: the API server and controller manager go before the etcd they use.
    procs: Supervised,
    etcd: Arc<Etcd>,
    ca: CertificateAuthority,
    admin: CertifiedKey,
    port: u16,
    controller_manager_port: Option<u16>,
    namespaces: AtomicUsize,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url())
            .field("dir", &self.procs.path())
            .field("etcd", &self.etcd)
            .finish()
    }
}

static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
static SHARED_WITH_CONTROLLERS: tokio::sync::OnceCell<ControlPlane> =
    tokio::sync::OnceCell::const_new();

/// One control plane (etcd and kube-apiserver) for all tests of this test binary, started by the
/// first caller. It is never dropped: its watchdog stops it when the test binary exits. Give each
/// test its own namespace ([`ControlPlane::namespace`]). `None` when the binaries are missing
/// (the test is then skipped, or fails under CI); panics if it cannot start.
#[track_caller]
pub fn shared() -> impl Future<Output = Option<&'static ControlPlane>> {
    shared_in(&SHARED, false)
}

/// [`shared`] with kube-controller-manager running [`CONTROLLERS`].
#[track_caller]
pub fn shared_with_controllers() -> impl Future<Output = Option<&'static ControlPlane>> {
    shared_in(&SHARED_WITH_CONTROLLERS, true)
}

#[track_caller]
fn shared_in(
    cell: &'static tokio::sync::OnceCell<ControlPlane>,
    controller_manager: bool,
) -> impl Future<Output = Option<&'static ControlPlane>> {
    // Checked here, on the test's thread, so the skip is recorded under the test's name.
    let found = require().is_some();
    async move {
        if !found {
            return None;
        }
        let cp = cell
            .get_or_init(|| async move {
                ControlPlane::start_with(Options {
                    controller_manager,
                    ..Options::default()
                })
                .await
                .unwrap_or_else(|e| panic!("the shared control plane did not start: {e}"))
            })
            .await;
        Some(cp)
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits for `/readyz`.
    pub async fn start() -> Result<Self, ControlPlaneError> {
        Self::start_with(Options::default()).await
    }

    /// Starts a control plane as `options` say.
    pub async fn start_with(options: Options) -> Result<Self, ControlPlaneError> {
        let bins = binaries()?;
        let etcd = match options.etcd {
            Some(etcd) => etcd,
            None => Arc::new(Etcd::start().await?),
        };
        let mut procs = Supervised::new("sluice-control-plane-")?;
        let dir = procs.path().to_path_buf();

        let ca = CertificateAuthority::generate("sluice-test-ca")?;
        let serving = ca.server(&["localhost", "127.0.0.1"])?;
        let admin = ca.client("sluice-admin", &["system:masters"])?;
        let service_accounts = KeyPair::generate()?;
        write_private(&dir.join("ca.crt"), ca.cert_pem())?;
        write_private(&dir.join("serving.crt"), &serving.cert_pem)?;
        write_private(&dir.join("serving.key"), &serving.key_pem)?;
        write_private(
            &dir.join("service-accounts.key"),
            &service_accounts.serialize_pem(),
        )?;
        write_private(
            &dir.join("service-accounts.pub"),
            &service_accounts.public_key_pem(),
        )?;
        // Each API server keeps its objects under its own prefix, so several share one etcd.
        let prefix = format!(
            "/sluice-{}",
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );

        let admin_kubeconfig = |port: u16| {
            let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
            kubeconfig_yaml(
                port,
                ca.cert_pem(),
                &format!(
                    "    client-certificate-data: {}\n    client-key-data: {}\n",
                    b64(&admin.cert_pem),
                    b64(&admin.key_pem)
                ),
            )
        };
        let mut ready_port = None;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let mut cmd = Command::new(&bins.kube_apiserver);
            cmd.args(apiserver_args(&dir, &etcd.url(), &prefix, port));
            let log = procs.spawn("kube-apiserver", cmd)?;
            match wait_apiserver(&mut procs, &admin_kubeconfig(port), &log).await {
                Ok(()) => {
                    ready_port = Some(port);
                    break;
                }
                Err(e) => {
                    let died = procs.exited("kube-apiserver").is_some();
                    procs.kill("kube-apiserver");
                    if !died {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        let Some(port) = ready_port else {
            return Err(last.unwrap_or_else(|| {
                ControlPlaneError::Client("kube-apiserver never started".into())
            }));
        };
        let mut cp = Self {
            procs,
            etcd,
            ca,
            admin,
            port,
            controller_manager_port: None,
            namespaces: AtomicUsize::new(0),
        };
        if options.controller_manager {
            let controllers = if options.controllers.is_empty() {
                CONTROLLERS.to_vec()
            } else {
                options.controllers.clone()
            };
            cp.start_controller_manager(&bins.kube_controller_manager, &controllers)
                .await?;
        }
        Ok(cp)
    }

    fn not_ready(&self, component: &'static str, reason: String, log: &Path) -> ControlPlaneError {
        ControlPlaneError::NotReady {
            component,
            reason,
            log: log.display().to_string(),
            log_tail: tail(log, 40),
        }
    }

    async fn start_controller_manager(
        &mut self,
        bin: &Path,
        controllers: &[&str],
    ) -> Result<(), ControlPlaneError> {
        let dir = self.procs.path().to_path_buf();
        let kubeconfig = dir.join("kube-controller-manager.kubeconfig");
        self.write_kubeconfig(&kubeconfig)?;
        // A port probed free may be taken before it binds: it starts again on fresh ports, as
        // kube-apiserver does.
        let mut attempts = 0;
        'start: loop {
            attempts += 1;
            let port = free_port()?;
            let mut cmd = Command::new(bin);
            cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--controllers={}", controllers.join(",")))
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", dir.join("kcm-certs").display()))
                .arg(format!(
                    "--service-account-private-key-file={}",
                    dir.join("service-accounts.key").display()
                ))
                .arg(format!("--root-ca-file={}", dir.join("ca.crt").display()))
                .arg("--use-service-account-credentials=false")
                // Controllers react in tests' time, not a production cluster's.
                .arg("--concurrent-gc-syncs=5")
                .arg("--v=1");
            let log = self.procs.spawn("kube-controller-manager", cmd)?;
            self.controller_manager_port = Some(port);
            if let Some(outcome) = self.wait_controller_manager(&log, attempts).await {
                return outcome;
            }
            self.procs.kill("kube-controller-manager");
            continue 'start;
        }
    }

    /// Waits until kube-controller-manager is ready; `None` when it exited early and may start
    /// again on fresh ports (attempt `attempts` of [`START_ATTEMPTS`]).
    async fn wait_controller_manager(
        &mut self,
        log: &Path,
        attempts: usize,
    ) -> Option<Result<(), ControlPlaneError>> {
        // Ready when the serviceaccount controller has created `default` in `default`.
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        let sas: Api<ServiceAccount> = Api::namespaced(client, "default");
        let start = Instant::now();
        loop {
            if let Some(status) = self.procs.exited("kube-controller-manager") {
                if attempts < START_ATTEMPTS {
                    return None;
                }
                return Some(Err(self.not_ready(
                    "kube-controller-manager",
                    format!("kube-controller-manager exited ({status})"),
                    log,
                )));
            }
            if let Ok(Some(_)) = sas.get_opt("default").await {
                return Some(Ok(()));
            }
            if start.elapsed() > READY_TIMEOUT {
                return Some(Err(self.not_ready(
                    "kube-controller-manager",
                    format!("the default ServiceAccount did not appear within {READY_TIMEOUT:?}"),
                    log,
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA that signed the API server's serving certificate (and client certificates).
    pub fn ca(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// The etcd this API server stores in.
    pub fn etcd(&self) -> &Arc<Etcd> {
        &self.etcd
    }

    /// The temporary directory: certificates, keys, kubeconfigs and the processes' logs
    /// (`kube-apiserver.log`, `kube-controller-manager.log`).
    pub fn dir(&self) -> &Path {
        self.procs.path()
    }

    /// Process ids of the API server, the controller manager and their watchdog (not etcd's).
    pub fn pids(&self) -> Vec<u32> {
        self.procs.pids()
    }

    /// The ports this control plane listens on (not etcd's).
    pub fn ports(&self) -> Vec<u16> {
        let mut ports = vec![self.port];
        ports.extend(self.controller_manager_port);
        ports
    }

    /// Whether the API server still accepts connections.
    pub fn is_listening(&self) -> bool {
        listening(self.port)
    }

    fn kubeconfig_yaml(&self, user: &str) -> String {
        kubeconfig_yaml(self.port, self.ca.cert_pem(), user)
    }

    /// The administrator's kubeconfig (client certificate in `system:masters`).
    pub fn admin_kubeconfig(&self) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        self.kubeconfig_yaml(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&self.admin.cert_pem),
            b64(&self.admin.key_pem)
        ))
    }

    /// A kubeconfig authenticating with a bearer token.
    pub fn token_kubeconfig(&self, token: &str) -> String {
        self.kubeconfig_yaml(&format!("    token: {token}\n"))
    }

    /// Writes the administrator's kubeconfig (for kubectl and operator binaries), mode 0600.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        write_private(path, &self.admin_kubeconfig())
    }

    /// Writes a kubeconfig authenticating with `token`, mode 0600.
    pub fn write_token_kubeconfig(&self, path: &Path, token: &str) -> std::io::Result<()> {
        write_private(path, &self.token_kubeconfig(token))
    }

    fn base_config(&self) -> Config {
        let url = self
            .url()
            .parse()
            .expect("https://127.0.0.1:PORT is a valid URI");
        let mut config = Config::new(url);
        config.root_cert = Some(vec![self.ca.cert_der().to_vec()]);
        config
    }

    /// The administrator's client configuration (client certificate in `system:masters`).
    pub fn config(&self) -> Config {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut config = self.base_config();
        config.auth_info.client_certificate_data = Some(b64(&self.admin.cert_pem));
        config.auth_info.client_key_data = Some(b64(&self.admin.key_pem).into());
        config
    }

    /// A client configuration authenticating with a bearer token.
    pub fn config_with_token(&self, token: &str) -> Config {
        let mut config = self.base_config();
        config.auth_info.token = Some(token.to_string().into());
        config
    }

    /// A client acting as the administrator. Each call builds a new client, so a control plane
    /// shared by tests (each with its own runtime) hands every test a client of its own runtime.
    pub async fn client(&self) -> Result<Client, ControlPlaneError> {
        Client::try_from(self.config()).map_err(|e| ControlPlaneError::Client(e.to_string()))
    }

    /// A client authenticating with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<Client, ControlPlaneError> {
        Client::try_from(self.config_with_token(token))
            .map_err(|e| ControlPlaneError::Client(e.to_string()))
    }

    /// Server-side applies every document of `yaml` (any kind the server serves; CRDs must be
    /// Established first, see [`ControlPlane::install_crds`]) as the administrator, field manager
    /// `test-fixtures` (not a `sluice-*` manager: those are the operators'), taking conflicting
    /// fields over. A namespaced object without a namespace goes to `default`. Returns the
    /// objects as stored.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<Vec<DynamicObject>, ControlPlaneError> {
        let docs = yaml_documents(yaml)?;
        let client = self.client().await?;
        let mut applied = Vec::new();
        for value in docs {
            if !value.is_object() {
                continue;
            }
            let obj: DynamicObject = serde_json::from_value(value)
                .map_err(|e| ControlPlaneError::Manifest(e.to_string()))?;
            let types = obj.types.clone().ok_or_else(|| {
                ControlPlaneError::Manifest("a document without apiVersion and kind".into())
            })?;
            let gvk = GroupVersionKind::try_from(&types)
                .map_err(|e| ControlPlaneError::Manifest(e.to_string()))?;
            let (resource, caps) = kube::discovery::pinned_kind(&client, &gvk).await?;
            let name = obj.metadata.name.clone().ok_or_else(|| {
                ControlPlaneError::Manifest(format!("a {} without metadata.name", gvk.kind))
            })?;
            let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
                let ns = obj.metadata.namespace.as_deref().unwrap_or("default");
                Api::namespaced_with(client.clone(), ns, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let stored = api
                .patch(
                    &name,
                    &PatchParams::apply("test-fixtures").force(),
                    &Patch::Apply(&obj),
                )
                .await?;
            applied.push(stored);
        }
        Ok(applied)
    }

    /// Creates a namespace named `<prefix>-<n>`, unique on this control plane, and returns its
    /// name: one per test when tests share a control plane.
    pub async fn namespace(&self, prefix: &str) -> Result<String, ControlPlaneError> {
        let n = self.namespaces.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        let api: Api<Namespace> = Api::all(self.client().await?);
        api.create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await?;
        Ok(name)
    }

    /// Server-side applies every CustomResourceDefinition in `yaml` (one or more documents;
    /// other kinds are an error) and waits until each is Established. Returns their names. The
    /// real API server refuses a CRD whose rules do not compile or exceed its CEL cost estimate:
    /// that is the error returned, with the server's message.
    pub async fn install_crds(&self, yaml: &str) -> Result<Vec<String>, ControlPlaneError> {
        let docs = yaml_documents(yaml)?;
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await?);
        let mut names = Vec::new();
        for value in docs {
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(value)
                .map_err(|e| ControlPlaneError::Manifest(format!("not a CRD: {e}")))?;
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(
                &name,
                &PatchParams::apply("test-fixtures").force(),
                &Patch::Apply(&crd),
            )
            .await?;
            names.push(name);
        }
        for name in &names {
            let start = Instant::now();
            loop {
                let crd = api.get(name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                if start.elapsed() > READY_TIMEOUT {
                    return Err(ControlPlaneError::Manifest(format!(
                        "CRD {name} not Established within {READY_TIMEOUT:?}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(names)
    }

    /// A token for ServiceAccount `namespace/name` from the TokenRequest API (valid one hour);
    /// creates the ServiceAccount if it does not exist.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, ControlPlaneError> {
        let sas: Api<ServiceAccount> = Api::namespaced(self.client().await?, namespace);
        if sas.get_opt(name).await?.is_none() {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            };
            match sas.create(&PostParams::default(), &sa).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let answer = sas
            .create_token_request(name, &PostParams::default(), &request)
            .await?;
        answer.status.and_then(|s| s.token).ok_or_else(|| {
            ControlPlaneError::Client(format!(
                "the TokenRequest for {namespace}/{name} came back without a token"
            ))
        })
    }

    /// A client acting as ServiceAccount `namespace/name` (created if missing).
    pub async fn service_account_client(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Client, ControlPlaneError> {
        let token = self.service_account_token(namespace, name).await?;
        self.client_with_token(&token).await
    }
}

fn kubeconfig_yaml(port: u16, ca_pem: &str, user: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sluice\n  cluster:\n    server: \
         https://127.0.0.1:{port}\n    certificate-authority-data: {}\nusers:\n- name: user\n  \
         user:\n{user}contexts:\n- name: sluice\n  context:\n    cluster: sluice\n    user: \
         user\ncurrent-context: sluice\n",
        b64(ca_pem),
    )
}

fn apiserver_args(dir: &Path, etcd: &str, prefix: &str, port: u16) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        format!("--etcd-servers={etcd}"),
        format!("--etcd-prefix={prefix}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", file("certs")),
        format!("--tls-cert-file={}", file("serving.crt")),
        format!("--tls-private-key-file={}", file("serving.key")),
        format!("--client-ca-file={}", file("ca.crt")),
        format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
        format!(
            "--service-account-key-file={}",
            file("service-accounts.pub")
        ),
        format!(
            "--service-account-signing-key-file={}",
            file("service-accounts.key")
        ),
        "--authorization-mode=RBAC".into(),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        // The `kubernetes` Service's endpoints would be 127.0.0.1, which validation refuses for
        // Endpoints; nothing here dials it.
        "--endpoint-reconciler-type=none".into(),
        // Two shared cores: no request queuing, no profiling handlers.
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ]
}

/// Waits until kube-apiserver's `/readyz` answers `ok` (every post-start hook done: RBAC
/// bootstrap policy, priority classes, CRD informers).
async fn wait_apiserver(
    procs: &mut Supervised,
    kubeconfig: &str,
    log: &Path,
) -> Result<(), ControlPlaneError> {
    let client = client_from(kubeconfig).await?;
    let start = Instant::now();
    let not_ready = |reason: String| ControlPlaneError::NotReady {
        component: "kube-apiserver",
        reason,
        log: log.display().to_string(),
        log_tail: tail(log, 40),
    };
    loop {
        if let Some(status) = procs.exited("kube-apiserver") {
            return Err(not_ready(format!("kube-apiserver exited ({status})")));
        }
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
        let reason = match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => body,
            Err(e) => e.to_string(),
        };
        if start.elapsed() > READY_TIMEOUT {
            return Err(not_ready(format!(
                "/readyz not ok after {READY_TIMEOUT:?}: {reason}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn client_from(kubeconfig: &str) -> Result<Client, ControlPlaneError> {
    let kc =
        Kubeconfig::from_yaml(kubeconfig).map_err(|e| ControlPlaneError::Client(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
    Client::try_from(config).map_err(|e| ControlPlaneError::Client(e.to_string()))
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())
}
