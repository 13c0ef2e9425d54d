//! The running sandbox: two sites, each a management cluster (our CRDs, Argo CD's and Gateway
//! API's, the `argocd` namespace and the duck ConfigMap) running the site's simulated Argo CD
//! with a cluster Secret per workload cluster, and two workload clusters (Gateway API and our
//! CRDs, the checkout service and its route), all API emulators on fixed loopback ports (or, with
//! [`ControlPlaneKind::Real`], each a real kube-apiserver of its own on one shared etcd); the
//! metrics backend ([`crate::metrics`]: one real Prometheus, or a Prometheus and Thanos sidecar
//! per cluster under Thanos Query) fed by a mesh simulator per workload cluster; the OCI
//! registry; a git intent
//! repository; the operator binaries where the chart would put them; one kubeconfig with a
//! context per cluster; narration of what happens. Owns start order and stop order: [`stop`]
//! ends every child process and task and removes every temporary directory, and dropping a
//! half-started sandbox does the same (each part kills what it started on drop).
//!
//! [`stop`]: Sandbox::stop

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client};
use kube_emulator::{Emulator, EmulatorError};
use sluice_argocd::{ArgoCd, ArgoCdOptions};
use sluice_sim::mesh::scenario::{PathShare, Protocol, ServiceScenario, VersionScenario};
use sluice_sim::{ClusterConfig, Scenario, World};
use sluice_testkit::control_plane::{self, ControlPlane, Etcd};
use sluice_testkit::git::{GitError, GitRepo};
use sluice_testkit::registry::{Registry, RegistryError};

use crate::baseline;
use crate::kubeconfig::{self, Entry};
use crate::metrics::{Metrics, MetricsError, MetricsKind};
use crate::narrate::{self, Narrator};
use crate::operators::{self, OperatorError, OperatorProcess, Placement};
use crate::prerequisites::{self, PrerequisiteError};
use crate::share;
use crate::topology::{self, ClusterSpec, Role};

/// Gateway API CRD files read from the upstream directory.
pub const GATEWAY_API_CRDS: [&str; 2] = [
    "gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml",
    "gateway-api-v1.6.1/gateway.networking.k8s.io_grpcroutes.yaml",
];
/// Argo CD CRD files read from the upstream directory.
pub const ARGOCD_CRDS: [&str; 2] = [
    "argo-cd-v3.5.1/application-crd.yaml",
    "argo-cd-v3.5.1/applicationset-crd.yaml",
];
/// How long an operator gets to exit after SIGTERM before it is killed.
pub const OPERATOR_GRACE: Duration = Duration::from_secs(10);
/// The identity Argo CD uses in workload clusters (namespace, ServiceAccount).
pub const ARGOCD_IDENTITY: (&str, &str) = ("argocd", "argocd-application-controller");
/// The identity revert uses in workload clusters (namespace, ServiceAccount), as the chart's
/// workload mode installs it.
pub const REVERT_IDENTITY: (&str, &str) = ("sluice-system", "sluice-revert-target");
/// The Secret beside Argo CD holding the cosign public keys revert trusts (the chart's default
/// `revert.publicKeySecrets`).
pub const PUBLIC_KEYS_SECRET: &str = "sluice-cosign-public-keys";
/// Password of the sandbox's cosign key file (`<work dir>/cosign.key`); only for the sandbox.
pub const COSIGN_PASSWORD: &str = "sandbox";
/// How often the mesh share is read back for narration.
const SHARE_POLL: Duration = Duration::from_secs(3);
/// The window the narrated share is measured over.
const SHARE_WINDOW_S: u64 = 5;

/// How to start the sandbox.
#[derive(Debug, Clone)]
pub struct Options {
    /// The repository root (holds `crds/` and `scenarios/`).
    pub repo: PathBuf,
    /// The released upstream CRDs (`.tools/crds` in the repository root, fetched by
    /// `scripts/install-tools.sh`).
    pub upstream: PathBuf,
    /// First fixed port (see [`topology`]); 0 picks free ports everywhere.
    pub base_port: u16,
    /// Run the operator binaries.
    pub operators: bool,
    /// Mesh telemetry interval.
    pub telemetry_interval: Duration,
    /// What serves each cluster's Kubernetes API.
    pub control_plane: ControlPlaneKind,
    /// Where the telemetry goes and the operators read it.
    pub metrics: MetricsKind,
}

/// What serves each cluster's Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlPlaneKind {
    /// The embedded API emulator (fast; the simulator plays the workload controllers).
    #[default]
    Emulator,
    /// A real kube-apiserver v1.37 per cluster (`bash scripts/install-control-plane.sh`), all on
    /// one etcd under prefixes of their own; workload clusters also run kube-controller-manager
    /// (the real Deployment, ReplicaSet and disruption controllers), the simulator plays the
    /// kubelet and Istio's injector as a real mutating webhook.
    Real,
}

impl Options {
    /// Defaults: the repository this crate was built from, its `.tools/crds`, ports from
    /// [`topology::DEFAULT_BASE_PORT`], operators on, telemetry every second.
    pub fn defaults() -> Self {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let repo = repo.canonicalize().unwrap_or(repo);
        Self {
            upstream: repo.join(".tools/crds"),
            repo,
            base_port: topology::DEFAULT_BASE_PORT,
            operators: true,
            telemetry_interval: Duration::from_secs(1),
            control_plane: ControlPlaneKind::Emulator,
            metrics: MetricsKind::Prometheus,
        }
    }
}

/// Why the sandbox could not start.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum SandboxError {
    /// A program is missing.
    #[error(transparent)]
    Prerequisite(#[from] PrerequisiteError),
    /// A CRD file is not where it should be.
    #[error("{what} not found at {path}; {hint}")]
    FileMissing {
        /// What it is.
        what: &'static str,
        /// Where it was looked for.
        path: String,
        /// What to do.
        hint: &'static str,
    },
    /// A cluster emulator could not start or refused its baseline.
    #[error("cluster {cluster}: {source}")]
    Emulator {
        /// Cluster name.
        cluster: String,
        /// Cause.
        source: EmulatorError,
    },
    /// A cluster's real control plane could not start or refused its baseline.
    #[error("cluster {cluster}: the real control plane: {reason}")]
    ControlPlane {
        /// Cluster name.
        cluster: String,
        /// Cause.
        reason: String,
    },
    /// The metrics backend (Prometheus, or Prometheus and Thanos per cluster) did not start.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The registry did not start.
    #[error("starting the OCI registry failed: {0}")]
    Registry(#[from] RegistryError),
    /// The intent repository could not be created.
    #[error("creating the git intent repository failed: {0}")]
    Git(#[from] GitError),
    /// The mesh scenario or world could not start.
    #[error("starting the mesh simulator for {cluster} failed: {reason}")]
    World {
        /// Cluster name.
        cluster: String,
        /// Cause.
        reason: String,
    },
    /// The simulated Argo CD of a site could not start.
    #[error("starting Argo CD in {cluster} failed: {reason}")]
    #[strum(serialize = "argocd")]
    ArgoCd {
        /// Management cluster.
        cluster: String,
        /// Cause.
        reason: String,
    },
    /// Operator binaries.
    #[error(transparent)]
    Operator(#[from] OperatorError),
    /// Local files (work directory, kubeconfig).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The sandbox's cosign key could not be made.
    #[error("generating the sandbox's cosign signing key failed: {0}")]
    Key(String),
    /// A task panicked while starting a cluster.
    #[error("starting cluster {0} panicked; this is a bug in the sandbox")]
    Panicked(String),
}

impl SandboxError {
    /// Bounded category for logs and the scenario JSON.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Name, site, role.
    pub spec: ClusterSpec,
    /// What serves its API.
    pub api: ClusterApi,
    /// An administrator kubeconfig for this cluster alone (what the operators use).
    pub kubeconfig: PathBuf,
}

/// What serves one cluster's Kubernetes API.
pub enum ClusterApi {
    /// The API emulator.
    Emulator(Emulator),
    /// A real kube-apiserver (with kube-controller-manager in workload clusters).
    Real {
        /// The control plane.
        cp: Box<ControlPlane>,
        /// Its administrator client.
        admin: Client,
    },
}

/// The ServiceAccount whose token the combined kubeconfig carries on a real control plane
/// (namespace, name); bound to cluster-admin, as the emulator's administrator token is.
pub const REAL_ADMIN_IDENTITY: (&str, &str) = ("kube-system", "sluice-sandbox-admin");

impl std::fmt::Debug for ClusterApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterApi::Emulator(emu) => write!(f, "Emulator({})", emu.base_url()),
            ClusterApi::Real { cp, .. } => write!(f, "Real({})", cp.url()),
        }
    }
}

impl ClusterApi {
    /// An administrator client.
    pub fn client(&self) -> Client {
        match self {
            ClusterApi::Emulator(emu) => emu.client(),
            ClusterApi::Real { admin, .. } => admin.clone(),
        }
    }

    /// The API server's URL.
    pub fn base_url(&self) -> String {
        match self {
            ClusterApi::Emulator(emu) => emu.base_url(),
            ClusterApi::Real { cp, .. } => cp.url(),
        }
    }

    /// The CA certificate (PEM) clients must trust; `None` for the emulator's plain HTTP.
    pub fn ca_pem(&self) -> Option<String> {
        match self {
            ClusterApi::Emulator(_) => None,
            ClusterApi::Real { cp, .. } => Some(cp.ca().cert_pem().to_owned()),
        }
    }

    /// A bearer token of the ServiceAccount `namespace/name`. On a real control plane the
    /// ServiceAccount (and its namespace) is created when missing and bound to cluster-admin:
    /// the sandbox's identities act as the emulator's do, which enforces no RBAC (the e2e suite
    /// checks the chart's RBAC on the real server).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, String> {
        match self {
            ClusterApi::Emulator(emu) => Ok(emu.service_account_token(namespace, name)),
            ClusterApi::Real { cp, .. } => {
                cp.apply_yaml(&format!(
                    "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n---\n\
                     apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
                     metadata:\n  name: sluice-sandbox:{namespace}:{name}\n\
                     roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\n\
                     subjects:\n- kind: ServiceAccount\n  namespace: {namespace}\n  name: {name}\n"
                ))
                .await
                .map_err(|e| e.to_string())?;
                cp.service_account_token(namespace, name)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Creates or updates the objects of `yaml` as the administrator; CRDs among them are
    /// Established before this returns.
    pub async fn load_yaml(&self, yaml: &str) -> Result<(), String> {
        match self {
            ClusterApi::Emulator(emu) => emu.load_yaml(yaml).map(|_| ()).map_err(|e| e.to_string()),
            ClusterApi::Real { cp, .. } => if yaml.contains("kind: CustomResourceDefinition") {
                cp.install_crds(yaml).await.map(|_| ())
            } else {
                cp.apply_yaml(yaml).await.map(|_| ())
            }
            .map_err(|e| e.to_string()),
        }
    }

    /// Writes an administrator kubeconfig for this cluster alone.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), String> {
        match self {
            ClusterApi::Emulator(emu) => emu.write_kubeconfig(path).map_err(|e| e.to_string()),
            ClusterApi::Real { cp, .. } => cp.write_kubeconfig(path).map_err(|e| e.to_string()),
        }
    }

    /// Stops it (a real control plane's processes end and its directory goes).
    pub async fn shutdown(self) {
        match self {
            ClusterApi::Emulator(emu) => emu.shutdown().await,
            ClusterApi::Real { cp, admin } => {
                drop(admin);
                drop(cp);
            }
        }
    }
}

/// The running sandbox.
#[derive(Debug)]
pub struct Sandbox {
    clusters: Vec<Cluster>,
    metrics: Arc<Metrics>,
    registry: Registry,
    git: GitRepo,
    worlds: Vec<(String, World)>,
    argocds: Vec<(String, ArgoCd)>,
    operators: Vec<OperatorProcess>,
    narrator: Narrator,
    kubeconfig: PathBuf,
    signing_key: sluice_bundle::SigningKey,
    dir: tempfile::TempDir,
    started: Instant,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
    let what = what.into();
    move |source| SandboxError::Io { what, source }
}

fn require(path: PathBuf, what: &'static str, hint: &'static str) -> Result<PathBuf, SandboxError> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(SandboxError::FileMissing {
            what,
            path: path.display().to_string(),
            hint,
        })
    }
}

const UPSTREAM_HINT: &str = "the released Gateway API and Argo CD CRDs are fetched from their Go \
    modules at pinned versions by `bash scripts/install-tools.sh` into .tools/crds; run it, or pass \
    --upstream DIR (the directory holding gateway-api-v1.6.1/ and argo-cd-v3.5.1/)";
const REPO_HINT: &str = "pass --repo DIR (the sluice repository root); `cargo run --bin crdgen -p \
    sluice-api` regenerates crds/";

/// The manifest files a cluster of `role` is started with: CRDs only.
pub fn manifests(options: &Options, role: Role) -> Result<Vec<PathBuf>, SandboxError> {
    let mut out = Vec::new();
    let crds = options.repo.join("crds");
    let mut ours: Vec<PathBuf> = std::fs::read_dir(&crds)
        .map_err(|_| SandboxError::FileMissing {
            what: "the sluice CRD directory",
            path: crds.display().to_string(),
            hint: REPO_HINT,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    ours.sort();
    out.extend(ours);
    for file in GATEWAY_API_CRDS {
        out.push(require(
            options.upstream.join(file),
            "a Gateway API CRD",
            UPSTREAM_HINT,
        )?);
    }
    if role == Role::Management {
        for file in ARGOCD_CRDS {
            out.push(require(
                options.upstream.join(file),
                "an Argo CD CRD",
                UPSTREAM_HINT,
            )?);
        }
    }
    Ok(out)
}

/// revert's identity Secret for one workload cluster (label `sluice.dev/revert-cluster: "true"`,
/// keys `name`, `server`, `token`, and `ca.crt` when the server speaks TLS).
pub fn revert_identity(cluster: &str, server: &str, token: &str, ca: Option<&str>) -> Secret {
    let data = [("name", cluster), ("server", server), ("token", token)]
        .into_iter()
        .chain(ca.map(|ca| ("ca.crt", ca)))
        .map(|(k, v)| {
            (
                k.to_string(),
                k8s_openapi::ByteString(v.as_bytes().to_vec()),
            )
        })
        .collect();
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("revert-cluster-{cluster}")),
            labels: Some(
                [("sluice.dev/revert-cluster".to_string(), "true".to_string())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

/// The public keys Secret beside Argo CD, holding the sandbox's cosign public key.
pub fn public_keys_secret(pem: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(PUBLIC_KEYS_SECRET.to_string()),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(
            [(
                "cosign.pub".to_string(),
                k8s_openapi::ByteString(pem.as_bytes().to_vec()),
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    }
}

/// The mesh scenario of one workload cluster: the repository's `world` scenario (checkout
/// stable and canary, 200 requests/s) played in that cluster, plus the gRPC service `payments`
/// ([`grpc_service`]).
pub fn mesh_scenario(options: &Options, cluster: &str) -> Result<Scenario, String> {
    let mut s = Scenario::from_file(options.repo.join("scenarios/world.yaml"))
        .map_err(|e| e.to_string())?;
    for c in &mut s.clusters {
        c.name = cluster.to_string();
    }
    for svc in &mut s.services {
        svc.cluster = Some(cluster.to_string());
        svc.namespace = baseline::SHOP.to_string();
        svc.route = Some(baseline::ROUTE.to_string());
    }
    s.services.push(grpc_service(cluster));
    Ok(s)
}

/// The share of the gRPC service's calls that are its read method ([`baseline::GRPC_READ_METHOD`]).
pub const GRPC_READ_SHARE: f64 = 0.25;

/// The gRPC service `payments` of a workload cluster's mesh: 200 calls/s, three in four of
/// `/shop.Payments/Charge` and one in four of `/shop.Payments/GetReceipt`
/// ([`GRPC_READ_SHARE`]), through the GRPCRoute `shop/payments`, v1 stable and v2 canary, both
/// healthy (1% UNAVAILABLE). Until the GRPCRoute exists (`canary-grpc` and `canary-grpc-mirror`
/// apply it) the calls go nowhere and its series stay at 0.
pub fn grpc_service(cluster: &str) -> ServiceScenario {
    let (service, method) = baseline::GRPC_METHOD;
    let (_, read) = baseline::GRPC_READ_METHOD;
    let version = |name: &str, backend: &str| VersionScenario {
        name: name.to_string(),
        backend: backend.to_string(),
        workload: None,
        error_ratio: 0.01,
        p50_ms: 10.0,
        p99_ms: 40.0,
        weight_factor: 1.0,
    };
    ServiceScenario {
        name: baseline::GRPC_ROUTE.to_string(),
        namespace: baseline::SHOP.to_string(),
        cluster: Some(cluster.to_string()),
        protocol: Protocol::Grpc,
        route: Some(baseline::GRPC_ROUTE.to_string()),
        source_workload: "istio-ingressgateway".to_string(),
        source_namespace: "istio-system".to_string(),
        requests_per_second: 200.0,
        path: format!("/{service}/{method}"),
        other_paths: vec![PathShare {
            path: format!("/{service}/{read}"),
            share: GRPC_READ_SHARE,
        }],
        // gRPC calls are POSTs; no rule here matches a method.
        idempotent_share: 0.0,
        cohort: None,
        versions: vec![
            version("v1", baseline::GRPC_STABLE),
            version("v2", baseline::GRPC_CANARY),
        ],
    }
}

async fn start_cluster(
    spec: ClusterSpec,
    port: u16,
    files: Vec<PathBuf>,
) -> Result<Emulator, SandboxError> {
    let emu_err = |cluster: &str| {
        let cluster = cluster.to_string();
        move |source| SandboxError::Emulator { cluster, source }
    };
    let emulator = Emulator::start_with(kube_emulator::Options {
        port,
        manifests: files,
        ..kube_emulator::Options::default()
    })
    .await
    .map_err(emu_err(&spec.name))?;
    emulator
        .load_yaml(&baseline::common())
        .map_err(emu_err(&spec.name))?;
    let role_objects = match spec.role {
        Role::Management => baseline::management(),
        Role::Workload => baseline::workload(),
    };
    emulator
        .load_yaml(&role_objects)
        .map_err(emu_err(&spec.name))?;
    Ok(emulator)
}

/// Starts one cluster on a real kube-apiserver (sharing `etcd`): the CRDs of `files`, the common
/// objects and, in management clusters, the role's objects. A workload cluster also runs
/// kube-controller-manager; its objects come once its injector serves ([`Sandbox::start_worlds`]),
/// since a pod created before the webhook is registered stays uninjected.
async fn start_real_cluster(
    spec: ClusterSpec,
    etcd: Arc<Etcd>,
    files: Vec<PathBuf>,
) -> Result<ClusterApi, SandboxError> {
    let fail = |reason: String| SandboxError::ControlPlane {
        cluster: spec.name.clone(),
        reason,
    };
    let cp = ControlPlane::start_with(control_plane::Options {
        etcd: Some(etcd),
        controller_manager: spec.role == Role::Workload,
        controllers: control_plane::CONTROLLERS.to_vec(),
    })
    .await
    .map_err(|e| fail(e.to_string()))?;
    for f in &files {
        let yaml = std::fs::read_to_string(f).map_err(|e| fail(format!("{}: {e}", f.display())))?;
        cp.install_crds(&yaml)
            .await
            .map_err(|e| fail(format!("{}: {e}", f.display())))?;
    }
    cp.apply_yaml(&baseline::common())
        .await
        .map_err(|e| fail(e.to_string()))?;
    if spec.role == Role::Management {
        cp.apply_yaml(&baseline::management())
            .await
            .map_err(|e| fail(e.to_string()))?;
    }
    let admin = cp.client().await.map_err(|e| fail(e.to_string()))?;
    Ok(ClusterApi::Real {
        cp: Box::new(cp),
        admin,
    })
}

impl Sandbox {
    /// Starts everything and narrates progress on stdout; returns once the sandbox is ready.
    pub async fn start(options: Options) -> Result<Self, SandboxError> {
        let narrator = Narrator::start();
        prerequisites::ensure()?;
        if options.control_plane == ControlPlaneKind::Real {
            control_plane::binaries().map_err(|missing| SandboxError::ControlPlane {
                cluster: "every cluster".into(),
                reason: missing.to_string(),
            })?;
        }
        // Build (or find) the operator binaries before anything runs: a build takes minutes.
        let build = if options.operators {
            let exe = std::env::current_exe().map_err(io("finding the sandbox executable"))?;
            let build = operators::build_dir(&exe);
            operators::ensure_binaries(&build, &options.repo.join("Cargo.toml"), &operators::ALL)
                .await?;
            Some(build)
        } else {
            None
        };
        // Readiness is timed from here: building is not starting.
        let started = Instant::now();
        let specs = topology::clusters(&topology::SITES, topology::WORKLOADS_PER_SITE);
        let dir = tempfile::Builder::new()
            .prefix("sluice-sandbox-")
            .tempdir()
            .map_err(io("creating the sandbox work directory"))?;
        narrator.say(format!(
            "sluice sandbox: starting {} sites ({}), {} clusters, work directory {}",
            topology::SITES.len(),
            topology::SITES.join(", "),
            specs.len(),
            dir.path().display()
        ));

        // Clusters start in parallel (loading CRDs is the slow part); Prometheus and the
        // registry start meanwhile. Real API servers share one etcd, each under its own prefix.
        let etcd = match options.control_plane {
            ControlPlaneKind::Emulator => None,
            ControlPlaneKind::Real => {
                let etcd = Etcd::start()
                    .await
                    .map_err(|e| SandboxError::ControlPlane {
                        cluster: "etcd".into(),
                        reason: e.to_string(),
                    })?;
                narrator.say(format!(
                    "control plane: real kube-apiserver {} per cluster, etcd {}",
                    control_plane::KUBERNETES_VERSION,
                    etcd.url()
                ));
                Some(Arc::new(etcd))
            }
        };
        let mut tasks = Vec::new();
        for spec in &specs {
            let files = manifests(&options, spec.role)?;
            let mut port = topology::api_port(options.base_port, spec);
            if port != 0 && !topology::port_is_free(port) {
                narrator.say(format!(
                    "{}: port {port} is taken, using a free port instead",
                    spec.name
                ));
                port = 0;
            }
            let spec = spec.clone();
            let etcd = etcd.clone();
            tasks.push(tokio::spawn(async move {
                let begun = Instant::now();
                let result = match etcd {
                    None => start_cluster(spec, port, files)
                        .await
                        .map(ClusterApi::Emulator),
                    Some(etcd) => start_real_cluster(spec, etcd, files).await,
                };
                (begun.elapsed(), result)
            }));
        }
        let (metrics, registry) =
            tokio::join!(Metrics::start(options.metrics, &specs), Registry::start());
        let metrics = Arc::new(metrics?);
        let registry = registry?;
        let git = GitRepo::new()?;
        for line in metrics.describe() {
            narrator.say(line);
        }
        narrator.say(format!("registry: {} (plain HTTP)", registry.host()));
        narrator.say(format!("git intent repository: {}", git.url()));

        let mut emulators = Vec::new();
        for (task, spec) in tasks.into_iter().zip(&specs) {
            let (took, result) = task
                .await
                .map_err(|_| SandboxError::Panicked(spec.name.clone()))?;
            emulators.push((result?, took));
        }
        let mut clusters = Vec::new();
        let mut entries = Vec::new();
        for (spec, (api, took)) in specs.into_iter().zip(emulators) {
            let path = dir.path().join(format!("{}.kubeconfig", spec.name));
            let fail = |reason: String| SandboxError::ControlPlane {
                cluster: spec.name.clone(),
                reason,
            };
            api.write_kubeconfig(&path)
                .map_err(|e| fail(format!("writing {}: {e}", path.display())))?;
            let token = match &api {
                ClusterApi::Emulator(_) => kube_emulator::ADMIN_TOKEN.to_string(),
                ClusterApi::Real { .. } => api
                    .service_account_token(REAL_ADMIN_IDENTITY.0, REAL_ADMIN_IDENTITY.1)
                    .await
                    .map_err(fail)?,
            };
            let certificate_authority = match api.ca_pem() {
                None => None,
                Some(pem) => {
                    let ca = dir.path().join(format!("{}.ca.crt", spec.name));
                    std::fs::write(&ca, pem).map_err(io(format!("writing {}", ca.display())))?;
                    Some(ca.display().to_string())
                }
            };
            entries.push(Entry {
                name: spec.name.clone(),
                server: api.base_url(),
                token,
                certificate_authority,
            });
            let runs = operators::ALL
                .iter()
                .filter(|op| op.role() == spec.role)
                .map(|op| op.name())
                .collect::<Vec<_>>()
                .join(", ");
            narrator.say(format!(
                "{}: {} cluster at {} ({}; CRDs loaded in {:.1} s)",
                spec.name,
                spec.role,
                api.base_url(),
                if options.operators {
                    runs
                } else {
                    "operators off".to_string()
                },
                took.as_secs_f64()
            ));
            clusters.push(Cluster {
                spec,
                api,
                kubeconfig: path,
            });
        }
        let kubeconfig = dir.path().join("kubeconfig");
        let current = clusters
            .iter()
            .find(|c| c.spec.role == Role::Workload)
            .map(|c| c.spec.name.clone())
            .unwrap_or_default();
        std::fs::write(&kubeconfig, kubeconfig::render(&entries, &current))
            .map_err(io(format!("writing {}", kubeconfig.display())))?;

        let mut sandbox = Sandbox {
            clusters,
            metrics,
            registry,
            git,
            worlds: Vec::new(),
            argocds: Vec::new(),
            operators: Vec::new(),
            narrator,
            kubeconfig,
            signing_key: sluice_bundle::SigningKey::generate()
                .map_err(|e| SandboxError::Key(e.to_string()))?,
            dir,
            started,
        };
        sandbox.commit_intent()?;
        sandbox.write_key_files()?;
        sandbox.start_argocd().await?;
        sandbox.install_revert_trust().await?;
        sandbox.start_worlds(&options).await?;
        if let Some(build) = build {
            sandbox.start_operators(&options, &build)?;
        }
        sandbox.start_narration();
        Ok(sandbox)
    }

    /// Records the baseline routes in the intent repository (one directory per cluster), the
    /// way a platform keeps mesh configuration in git.
    fn commit_intent(&mut self) -> Result<(), SandboxError> {
        let files: Vec<(String, String)> = self
            .clusters
            .iter()
            .filter(|c| c.spec.role == Role::Workload)
            .map(|c| {
                (
                    format!("clusters/{}/mesh/route-checkout.yaml", c.spec.name),
                    baseline::route(100, 0),
                )
            })
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        let sha = self
            .git
            .commit_files(&refs, "mesh: checkout routes, all traffic to v2.13")?;
        self.git.push()?;
        self.narrator.say(format!(
            "git: intent committed ({} routes) at {}",
            files.len(),
            &sha[..sha.len().min(12)]
        ));
        Ok(())
    }

    /// Writes the sandbox's cosign key pair into the work directory, so bundles can be signed
    /// with `kubectl sluice bundle sign --key` and pinned with revert.
    fn write_key_files(&self) -> Result<(), SandboxError> {
        let private = self
            .signing_key
            .to_encrypted_pem(COSIGN_PASSWORD.as_bytes())
            .map_err(|e| SandboxError::Key(e.to_string()))?;
        let key = self.dir.path().join("cosign.key");
        std::fs::write(&key, private).map_err(io(format!("writing {}", key.display())))?;
        let public = self.dir.path().join("cosign.pub");
        std::fs::write(&public, self.signing_key.public_key().pem())
            .map_err(io(format!("writing {}", public.display())))?;
        self.narrator.say(format!(
            "cosign key: {} (COSIGN_PASSWORD={COSIGN_PASSWORD}); revert trusts {} (Secret {PUBLIC_KEYS_SECRET} beside each Argo CD)",
            key.display(),
            public.display()
        ));
        Ok(())
    }

    /// Starts each site's simulated Argo CD on its management cluster, with a cluster Secret per
    /// workload cluster of the site (Argo CD's own identity there, never the operators').
    async fn start_argocd(&mut self) -> Result<(), SandboxError> {
        for mgmt in self
            .clusters
            .iter()
            .filter(|c| c.spec.role == Role::Management)
        {
            let name = mgmt.spec.name.clone();
            let fail = |reason: String| SandboxError::ArgoCd {
                cluster: name.clone(),
                reason,
            };
            let secrets: Api<Secret> =
                Api::namespaced(mgmt.api.client(), operators::ARGOCD_NAMESPACE);
            let mut targets = Vec::new();
            for w in self
                .clusters
                .iter()
                .filter(|c| c.spec.role == Role::Workload && c.spec.site == mgmt.spec.site)
            {
                let token = w
                    .api
                    .service_account_token(ARGOCD_IDENTITY.0, ARGOCD_IDENTITY.1)
                    .await
                    .map_err(&fail)?;
                let labels = [
                    ("sluice.dev/site".to_string(), w.spec.site.clone()),
                    ("sluice.dev/cluster".to_string(), w.spec.name.clone()),
                ]
                .into_iter()
                .collect();
                let secret =
                    sluice_argocd::cluster_secret(&w.spec.name, &w.api.base_url(), &token, &labels);
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(|e| {
                        fail(format!(
                            "creating the cluster Secret of {}: {e}",
                            w.spec.name
                        ))
                    })?;
                targets.push(w.spec.name.clone());
            }
            let argocd = ArgoCd::start(
                mgmt.api.client(),
                ArgoCdOptions {
                    namespace: operators::ARGOCD_NAMESPACE.to_string(),
                    resync: Duration::from_secs(1),
                    insecure_registries: vec![self.registry.host()],
                    ..ArgoCdOptions::default()
                },
            )
            .await
            .map_err(|e| fail(e.to_string()))?;
            self.narrator.say(format!(
                "{name}: Argo CD running in namespace {}, with cluster Secrets for {}",
                operators::ARGOCD_NAMESPACE,
                targets.join(", ")
            ));
            self.argocds.push((name, argocd));
        }
        Ok(())
    }

    /// Gives each site's revert what the chart gives it beside Argo CD: the Secret holding the
    /// sandbox's cosign public key ([`PUBLIC_KEYS_SECRET`]) and, per workload cluster of the
    /// site, an identity Secret with revert's own token there ([`REVERT_IDENTITY`]), never
    /// Argo CD's.
    async fn install_revert_trust(&self) -> Result<(), SandboxError> {
        for mgmt in self
            .clusters
            .iter()
            .filter(|c| c.spec.role == Role::Management)
        {
            let name = mgmt.spec.name.clone();
            let fail = |what: String| {
                let cluster = name.clone();
                move |e: kube::Error| SandboxError::ArgoCd {
                    cluster,
                    reason: format!("{what} for revert: {e}"),
                }
            };
            let keys: Api<Secret> = Api::namespaced(mgmt.api.client(), operators::ARGOCD_NAMESPACE);
            keys.create(
                &PostParams::default(),
                &public_keys_secret(self.signing_key.public_key().pem()),
            )
            .await
            .map_err(fail(format!("creating Secret {PUBLIC_KEYS_SECRET}")))?;
            let identities: Api<Secret> =
                Api::namespaced(mgmt.api.client(), operators::REVERT_IDENTITY_NAMESPACE);
            let mut targets = Vec::new();
            for w in self
                .clusters
                .iter()
                .filter(|c| c.spec.role == Role::Workload && c.spec.site == mgmt.spec.site)
            {
                let token = w
                    .api
                    .service_account_token(REVERT_IDENTITY.0, REVERT_IDENTITY.1)
                    .await
                    .map_err(|reason| SandboxError::ArgoCd {
                        cluster: name.clone(),
                        reason: format!("revert's identity in {}: {reason}", w.spec.name),
                    })?;
                let ca = w.api.ca_pem();
                identities
                    .create(
                        &PostParams::default(),
                        &revert_identity(&w.spec.name, &w.api.base_url(), &token, ca.as_deref()),
                    )
                    .await
                    .map_err(fail(format!("creating the identity of {}", w.spec.name)))?;
                targets.push(w.spec.name.clone());
            }
            self.narrator.say(format!(
                "{name}: revert trusts the sandbox's cosign key and reaches {} as {}/{}",
                targets.join(", "),
                REVERT_IDENTITY.0,
                REVERT_IDENTITY.1
            ));
        }
        Ok(())
    }

    /// Starts the mesh simulator of each workload cluster. On a real control plane it plays
    /// only the kubelet and serves Istio's injector as a real webhook, and the cluster's
    /// workload objects (namespaces, revision tags, checkout's Deployments) are applied once the
    /// injector serves, so the real ReplicaSet controller's pods are injected.
    async fn start_worlds(&mut self, options: &Options) -> Result<(), SandboxError> {
        for c in self
            .clusters
            .iter()
            .filter(|c| c.spec.role == Role::Workload)
        {
            let name = c.spec.name.clone();
            let fail = |reason: String| SandboxError::World {
                cluster: name.clone(),
                reason,
            };
            let scenario = mesh_scenario(options, &name).map_err(fail)?;
            let config = match &c.api {
                ClusterApi::Emulator(_) => ClusterConfig::new(name.clone()),
                ClusterApi::Real { .. } => ClusterConfig::on_real_control_plane(name.clone()),
            };
            let write_url = self
                .metrics
                .write_url(&name)
                .ok_or_else(|| fail("the metrics backend has no Prometheus for it".into()))?;
            let mut world = World::builder()
                .cluster_with(config, c.api.client())
                .prometheus(write_url)
                .scenario(scenario)
                .interval(options.telemetry_interval)
                .start()
                .map_err(|e| fail(e.to_string()))?;
            if let ClusterApi::Real { cp, admin } = &c.api {
                world
                    .serve_injector(&name, admin.clone(), cp.ca())
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                c.api
                    .load_yaml(&baseline::workload())
                    .await
                    .map_err(|e| fail(format!("loading the workload baseline: {e}")))?;
            }
            self.worlds.push((name, world));
        }
        self.narrator.say(format!(
            "mesh: simulating checkout traffic (200 requests/s) in {} workload clusters, telemetry every {:?}",
            self.worlds.len(),
            options.telemetry_interval
        ));
        Ok(())
    }

    fn start_operators(
        &mut self,
        options: &Options,
        build: &operators::BuildDir,
    ) -> Result<(), SandboxError> {
        let specs: Vec<ClusterSpec> = self.clusters.iter().map(|c| c.spec.clone()).collect();
        let services = operators::Services {
            prometheus_url: self.metrics.url().to_string(),
            registry_host: self.registry.host(),
            git_url: self.git.url(),
        };
        let logs = self.dir.path().join("logs");
        std::fs::create_dir_all(&logs).map_err(io("creating the log directory"))?;
        self.narrator
            .say(format!("operator logs: {}", logs.display()));
        // A port the kernel picked is released before the operator binds it, so the kernel may
        // hand the same one out again: never give two operators one port.
        let mut taken = std::collections::BTreeSet::new();
        for (n, placement) in operators::placements(&specs).into_iter().enumerate() {
            let mut port = topology::operator_port(options.base_port, n);
            while port == 0 || taken.contains(&port) || !topology::port_is_free(port) {
                port = topology::free_port().map_err(io("finding a free metrics port"))?;
            }
            taken.insert(port);
            let kubeconfig = self
                .cluster(&placement.cluster)
                .map(|c| c.kubeconfig.clone());
            let Some(kubeconfig) = kubeconfig else {
                continue;
            };
            let log = logs.join(format!(
                "{}-{}.log",
                placement.cluster,
                placement.operator.name()
            ));
            let Placement { cluster, operator } = placement.clone();
            let env = operators::environment(&placement, &services);
            let process =
                OperatorProcess::start(&build.bin_dir, placement, &kubeconfig, port, log, &env)?;
            self.narrator.say(format!(
                "{cluster}: {} started (pid {}, metrics http://127.0.0.1:{port}/metrics)",
                operator.binary(),
                process.pid().unwrap_or_default(),
            ));
            self.operators.push(process);
        }
        Ok(())
    }

    fn start_narration(&self) {
        for c in &self.clusters {
            let kinds = match c.spec.role {
                Role::Management => narrate::MANAGEMENT_KINDS,
                Role::Workload => narrate::WORKLOAD_KINDS,
            };
            for kind in kinds {
                self.narrator.watch(&c.spec.name, c.api.client(), *kind);
            }
            if c.spec.role == Role::Workload {
                let metrics = self.metrics.clone();
                let tx = self.narrator.sender();
                let cluster = c.spec.name.clone();
                self.narrator.adopt(tokio::spawn(async move {
                    let mut last = None;
                    loop {
                        tokio::time::sleep(SHARE_POLL).await;
                        let Ok(m) = share::measure(
                            &metrics,
                            &cluster,
                            baseline::SHOP,
                            SHARE_WINDOW_S,
                        )
                        .await
                        else {
                            continue;
                        };
                        let Some(s) = share::canary_share(&m, baseline::STABLE, baseline::CANARY)
                        else {
                            continue;
                        };
                        if narrate::share_changed(last, s) {
                            last = Some(s);
                            let _ = tx.send(format!(
                                "{cluster}: mesh reports checkout canary share {:.1}% ({:.0} requests in {SHARE_WINDOW_S} s)",
                                s * 100.0,
                                m.total()
                            ));
                        }
                    }
                }));
            }
        }
    }

    /// Says one narration line.
    pub fn say(&self, line: impl Into<String>) {
        self.narrator.say(line);
    }

    /// Every narration line said so far.
    pub fn transcript(&self) -> Vec<String> {
        self.narrator.transcript()
    }

    /// The clusters, in start order.
    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    /// A cluster by name.
    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.spec.name == name)
    }

    /// An administrator client of a cluster.
    pub fn client(&self, name: &str) -> Option<Client> {
        self.cluster(name).map(|c| c.api.client())
    }

    /// The metrics backend: where telemetry is written and read (one Prometheus, or Thanos
    /// Query over a Prometheus per cluster). Same as [`Sandbox::metrics`].
    pub fn prometheus(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics backend (see [`crate::metrics`]).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The OCI registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The cosign key whose public half revert trusts (Secret `sluice-cosign-public-keys` beside
    /// each Argo CD): scenarios sign bundles with it.
    pub fn signing_key(&self) -> &sluice_bundle::SigningKey {
        &self.signing_key
    }

    /// The git intent repository.
    pub fn git(&self) -> &GitRepo {
        &self.git
    }

    /// The mesh simulator of a workload cluster.
    pub fn world(&self, cluster: &str) -> Option<&World> {
        self.worlds
            .iter()
            .find(|(name, _)| name == cluster)
            .map(|(_, w)| w)
    }

    /// The combined kubeconfig (a context per cluster).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The work directory (removed on stop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Operator processes that have exited although nobody stopped them.
    pub fn exited_operators(&mut self) -> Vec<String> {
        self.operators
            .iter_mut()
            .filter_map(|p| {
                p.exited().map(|status| {
                    format!(
                        "{}: {} exited ({status}); its log was {}",
                        p.placement.cluster,
                        p.placement.operator.binary(),
                        p.log.display()
                    )
                })
            })
            .collect()
    }

    /// The `/metrics` port of `operator` in `cluster`, when the sandbox runs it there.
    pub fn metrics_port(&self, cluster: &str, operator: operators::Operator) -> Option<u16> {
        self.operators
            .iter()
            .find(|p| p.placement.cluster == cluster && p.placement.operator == operator)
            .map(|p| p.metrics_port)
    }

    /// Time since start began.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops everything in reverse order: narration, operators (SIGTERM, then kill), the mesh
    /// simulators, the clusters, Prometheus and the registry, git; then removes the work
    /// directory. Prints what it did on stderr.
    pub async fn stop(self) {
        let Sandbox {
            clusters,
            metrics,
            registry,
            git,
            worlds,
            argocds,
            operators,
            narrator,
            kubeconfig: _,
            signing_key: _,
            dir,
            started: _,
        } = self;
        narrator.stop().await;
        let stopped = futures::future::join_all(operators.into_iter().map(|p| async move {
            let what = format!("{}/{}", p.placement.cluster, p.placement.operator.name());
            let how = p.stop(OPERATOR_GRACE).await;
            format!("{what} {how}")
        }))
        .await;
        for line in &stopped {
            eprintln!("sluice sandbox: operator {line}");
        }
        for (_, argocd) in argocds {
            argocd.stop().await;
        }
        for (_, world) in worlds {
            world.stop();
        }
        for c in clusters {
            c.api.shutdown().await;
        }
        drop(metrics);
        drop(registry);
        drop(git);
        let path = dir.path().display().to_string();
        match dir.close() {
            Ok(()) => eprintln!("sluice sandbox: stopped; removed {path}"),
            Err(e) => eprintln!("sluice sandbox: stopped; could not remove {path}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(secret: &Secret, key: &str) -> String {
        String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
    }

    #[test]
    fn revert_identities_are_labelled_for_revert_and_never_as_argo_cd_clusters() {
        let s = revert_identity("east-1", "http://127.0.0.1:17401", "tok", None);
        let labels = s.metadata.labels.clone().unwrap();
        assert_eq!(labels["sluice.dev/revert-cluster"], "true");
        assert!(!labels.contains_key("argocd.argoproj.io/secret-type"));
        assert_eq!(text(&s, "name"), "east-1");
        assert_eq!(text(&s, "server"), "http://127.0.0.1:17401");
        assert_eq!(text(&s, "token"), "tok");
        assert!(!s.data.as_ref().unwrap().contains_key("ca.crt"));
        let tls = revert_identity("east-1", "https://127.0.0.1:6443", "tok", Some("PEM"));
        assert_eq!(text(&tls, "ca.crt"), "PEM");
    }

    #[test]
    fn the_public_keys_secret_holds_a_key_revert_can_parse() {
        let key = sluice_bundle::SigningKey::generate().unwrap();
        let s = public_keys_secret(key.public_key().pem());
        assert_eq!(s.metadata.name.as_deref(), Some(PUBLIC_KEYS_SECRET));
        let parsed =
            sluice_bundle::PublicKey::from_pem(text(&s, "cosign.pub").as_bytes(), "test").unwrap();
        assert_eq!(parsed.fingerprint(), key.public_key().fingerprint());
    }

    #[test]
    fn management_clusters_load_argo_cd_crds_and_workload_clusters_do_not() {
        let options = Options::defaults();
        if sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds()).is_none() {
            return;
        }
        let names = |role| -> Vec<String> {
            manifests(&options, role)
                .unwrap()
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        let mgmt = names(Role::Management);
        let work = names(Role::Workload);
        assert!(
            mgmt.contains(&"application-crd.yaml".to_string()),
            "{mgmt:?}"
        );
        assert!(
            !work.contains(&"application-crd.yaml".to_string()),
            "{work:?}"
        );
        for list in [&mgmt, &work] {
            assert!(list.contains(&"gateway.networking.k8s.io_httproutes.yaml".to_string()));
            assert!(list.contains(&"rollouts.sluice.dev.yaml".to_string()));
        }
    }
}
