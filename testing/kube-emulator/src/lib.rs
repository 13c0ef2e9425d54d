//! A Kubernetes API emulator on loopback for sluice's tests, benchmarks and sandbox. Never part of an
//! operator binary.
//!
//! [`Emulator::start`] serves the Kubernetes REST API on `127.0.0.1` (a free port) from memory:
//! built-in kinds, CRDs created at run time (with their schemas), watches, server-side apply with
//! field ownership, status subresources, finalizers, evictions, RBAC and admission policies.
//! Several instances run side by side in one process, one per simulated cluster. What is and is
//! not emulated is listed in `EMULATED.md`.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod discovery;
pub mod error;
pub mod managed;
pub mod patch;
pub mod protobuf;
pub mod rbac;
pub mod resources;
pub mod selector;
pub mod server;
pub mod store;
pub mod validation;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

pub use api::UserInfo;
pub use error::ApiError;

/// The token every emulator kubeconfig carries for the administrator (`system:masters`).
pub const ADMIN_TOKEN: &str = "kube-emulator-admin";

/// How an emulator is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Enforce RBAC for users outside `system:masters` (the admin token is always allowed).
    pub rbac: bool,
    /// YAML files whose documents (CRDs first, then anything else) are created at start.
    pub manifests: Vec<PathBuf>,
    /// Events kept per resource for watch resume; older resourceVersions get 410 Gone.
    pub watch_history: usize,
    /// How often a watch that allows bookmarks gets one.
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 0,
            rbac: false,
            manifests: Vec::new(),
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(2),
        }
    }
}

/// Why an emulator could not start or load a manifest.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum EmulatorError {
    /// The listening socket could not be bound.
    #[error(
        "cannot listen on 127.0.0.1:{port}: {source}; pick another --port or use 0 for a free one"
    )]
    Bind {
        /// Requested port.
        port: u16,
        /// Cause.
        source: std::io::Error,
    },
    /// A manifest file could not be read.
    #[error("cannot read manifest {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A manifest document is not valid YAML.
    #[error("manifest {path}: document {index} is not valid YAML: {message}")]
    Yaml {
        /// File (or `<inline>`).
        path: PathBuf,
        /// 0-based document index.
        index: usize,
        /// Parser message.
        message: String,
    },
    /// The API refused a manifest object.
    #[error("manifest {path}: {kind} {name:?} was refused: {source}")]
    Refused {
        /// File (or `<inline>`).
        path: PathBuf,
        /// Kind of the object.
        kind: String,
        /// Name of the object.
        name: String,
        /// The API error.
        source: Box<ApiError>,
    },
    /// A manifest object's apiVersion/kind is not served.
    #[error(
        "manifest {path}: {api_version} {kind} is not served by the emulator; create its CRD first"
    )]
    UnknownKind {
        /// File (or `<inline>`).
        path: PathBuf,
        /// apiVersion.
        api_version: String,
        /// kind.
        kind: String,
    },
    /// Writing the kubeconfig failed.
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

impl EmulatorError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One running emulator (one simulated cluster).
#[derive(Debug)]
pub struct Emulator {
    state: Arc<api::State>,
    port: u16,
    shutdown: watch::Sender<bool>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Emulator {
    /// Starts an emulator with default options on a free port.
    ///
    /// # Panics
    /// When no loopback port can be bound (use [`Emulator::start_with`] to handle that).
    pub async fn start() -> Emulator {
        Self::start_with(Options::default())
            .await
            .unwrap_or_else(|e| panic!("kube-emulator failed to start: {e}"))
    }

    /// Starts an emulator with these options.
    pub async fn start_with(options: Options) -> Result<Emulator, EmulatorError> {
        let state = Arc::new(api::State::new(
            api::Semantics { rbac: options.rbac },
            options.watch_history,
        ));
        state.add_token(ADMIN_TOKEN.into(), UserInfo::admin());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", options.port))
            .await
            .map_err(|source| EmulatorError::Bind {
                port: options.port,
                source,
            })?;
        let port = listener
            .local_addr()
            .map_err(|source| EmulatorError::Bind {
                port: options.port,
                source,
            })?
            .port();
        let (tx, rx) = watch::channel(false);
        let ctx = server::Ctx {
            state: state.clone(),
            address: format!("127.0.0.1:{port}"),
            shutdown: rx.clone(),
            bookmark_interval: options.bookmark_interval,
        };
        let app = axum::Router::new().fallback(
            move |method: axum::http::Method,
                  uri: axum::http::Uri,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let ctx = ctx.clone();
                async move { server::handle(ctx, method, uri, headers, body).await }
            },
        );
        let mut stop = rx;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
        });
        let emu = Emulator {
            state,
            port,
            shutdown: tx,
            server: Some(server),
        };
        for path in &options.manifests {
            emu.load_manifest_file(path)?;
        }
        Ok(emu)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared state (direct store access for benchmarks and fixtures).
    pub fn state(&self) -> &Arc<api::State> {
        &self.state
    }

    /// A kubeconfig document for this emulator, authenticating with `token`.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-emulator\n  cluster:\n    server: {}\ncontexts:\n- name: kube-emulator\n  context:\n    cluster: kube-emulator\n    user: kube-emulator-user\n    namespace: default\ncurrent-context: kube-emulator\nusers:\n- name: kube-emulator-user\n  user:\n    token: {token}\n",
            self.base_url()
        )
    }

    /// Writes an administrator kubeconfig (usable by kube-rs, the operator binaries and kubectl).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), EmulatorError> {
        self.write_kubeconfig_with_token(path, ADMIN_TOKEN)
    }

    /// Writes a kubeconfig that authenticates with `token` (see [`Emulator::service_account_token`]).
    pub fn write_kubeconfig_with_token(
        &self,
        path: impl AsRef<Path>,
        token: &str,
    ) -> Result<(), EmulatorError> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig_yaml(token)).map_err(|source| {
            EmulatorError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// A kube-rs configuration for the administrator.
    pub fn client_config(&self) -> kube::Config {
        self.client_config_with_token(ADMIN_TOKEN)
    }

    /// A kube-rs configuration that authenticates with `token`.
    pub fn client_config_with_token(&self, token: &str) -> kube::Config {
        let mut c = kube::Config::new(
            self.base_url()
                .parse()
                .expect("loopback URL is a valid URI"),
        );
        c.default_namespace = "default".into();
        c.auth_info.token = Some(token.to_string().into());
        c.connect_timeout = Some(Duration::from_secs(5));
        c.read_timeout = Some(Duration::from_secs(330));
        c
    }

    /// A kube-rs client for the administrator.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.client_config()).expect("kube client for a loopback URL")
    }

    /// A kube-rs client that authenticates with `token`.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.client_config_with_token(token))
            .expect("kube client for a loopback URL")
    }

    /// Registers a bearer token for a user.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.state.add_token(token.to_string(), user);
    }

    /// Mints a token authenticating as `system:serviceaccount:<namespace>:<name>`.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let token = format!("sa.{namespace}.{name}.{}", uuid::Uuid::new_v4().simple());
        self.state
            .add_token(token.clone(), UserInfo::service_account(namespace, name));
        token
    }

    /// Creates every object of a multi-document YAML file as the administrator, CRDs first.
    pub fn load_manifest_file(
        &self,
        path: impl AsRef<Path>,
    ) -> Result<Vec<Arc<Value>>, EmulatorError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| EmulatorError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_manifest(&text, path)
    }

    /// Creates every object of a multi-document YAML text as the administrator, CRDs first.
    pub fn load_yaml(&self, text: &str) -> Result<Vec<Arc<Value>>, EmulatorError> {
        self.load_manifest(text, Path::new("<inline>"))
    }

    fn load_manifest(&self, text: &str, path: &Path) -> Result<Vec<Arc<Value>>, EmulatorError> {
        use serde::Deserialize;
        let mut docs = Vec::new();
        for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let v = Value::deserialize(doc).map_err(|e| EmulatorError::Yaml {
                path: path.to_path_buf(),
                index,
                message: e.to_string(),
            })?;
            if v.is_object() {
                docs.push(v);
            }
        }
        docs.sort_by_key(|d| {
            d.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition")
        });
        let mut out = Vec::new();
        for d in docs {
            let api_version = d
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let kind = d
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let name = d
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let (group, version) = api_version
                .rsplit_once('/')
                .unwrap_or(("", api_version.as_str()));
            let plural = self
                .state
                .registry
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .all()
                .find(|t| t.group == group && t.version == version && t.kind == kind)
                .map(|t| t.plural.clone());
            let Some(plural) = plural else {
                return Err(EmulatorError::UnknownKind {
                    path: path.to_path_buf(),
                    api_version,
                    kind,
                });
            };
            let obj = self
                .state
                .create_as_admin(group, version, &plural, d)
                .map_err(|e| EmulatorError::Refused {
                    path: path.to_path_buf(),
                    kind: kind.clone(),
                    name,
                    source: Box::new(e),
                })?;
            out.push(obj);
        }
        Ok(out)
    }

    /// Stops serving: open watches end, the port is released.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(s) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
