//! Where the scenarios run: a Kubernetes API emulator with RBAC enforced, holding our CRDs, the
//! upstream Gateway API and Argo CD CRDs and exactly the RBAC the chart renders (the default);
//! with `SLUICE_E2E_CONTROL_PLANE=real`, the same on a real kube-apiserver v1.37.2
//! (`sluice_testkit::control_plane`), which enforces RBAC and the chart's admission policy
//! itself; or, with `KUBECONFIG` set and `SLUICE_E2E_CLUSTER=1`, a real cluster where the chart
//! is installed and its operators already run. Never grants a ServiceAccount anything beyond the
//! rendered documents it is given.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::Client;
use kube_emulator::{Emulator, Options};
use serde_json::Value;
use sluice_testkit::control_plane::{self, ControlPlane, Etcd};

use crate::chart;

/// Whether the scenarios run against the real cluster of `KUBECONFIG`.
pub fn cluster_mode() -> bool {
    std::env::var_os("KUBECONFIG").is_some()
        && std::env::var("SLUICE_E2E_CLUSTER").is_ok_and(|v| v == "1")
}

/// Whether the scenarios run on a real kube-apiserver (`SLUICE_E2E_CONTROL_PLANE=real`).
pub fn real_mode() -> bool {
    !cluster_mode() && std::env::var("SLUICE_E2E_CONTROL_PLANE").is_ok_and(|v| v == "real")
}

/// The etcd every real-mode target of this test binary stores in, each API server under a
/// prefix of its own (never dropped: its watchdog stops it when the binary exits).
static ETCD: tokio::sync::OnceCell<Arc<Etcd>> = tokio::sync::OnceCell::const_new();

/// Setting up the target failed.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum TargetError {
    /// The emulator did not start.
    #[error("the Kubernetes API emulator did not start: {0}")]
    Emulator(String),
    /// A manifest was refused.
    #[error("loading {what} into the emulator failed: {message}; check the file or the chart")]
    Load {
        /// What was loaded.
        what: String,
        /// The emulator's answer.
        message: String,
    },
    /// The real cluster is unreachable.
    #[error("the cluster of KUBECONFIG is unreachable: {0}; check KUBECONFIG and the context")]
    Cluster(String),
    /// The real control plane did not start or refused a manifest.
    #[error("the real control plane: {0}")]
    ControlPlane(String),
}

impl TargetError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One cluster of a scenario.
pub enum Target {
    /// An emulator with RBAC enforced.
    Emulated {
        /// The emulator.
        emu: Emulator,
        /// Holds the operators' kubeconfigs.
        dir: tempfile::TempDir,
    },
    /// A real kube-apiserver started for the scenario.
    Real {
        /// The control plane.
        cp: Box<ControlPlane>,
        /// Its administrator client.
        admin: Client,
        /// TokenRequest tokens of the chart's ServiceAccounts, by (namespace, name).
        tokens: BTreeMap<(String, String), String>,
        /// Holds the operators' kubeconfigs.
        dir: tempfile::TempDir,
    },
    /// A real cluster (`KUBECONFIG`).
    Cluster {
        /// Its administrator client.
        client: Client,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Emulated { emu, .. } => write!(f, "Emulated({})", emu.base_url()),
            Target::Real { cp, .. } => write!(f, "Real({})", cp.url()),
            Target::Cluster { .. } => write!(f, "Cluster"),
        }
    }
}

/// Every CRD a scenario cluster serves: ours from `crds/`, and the released HTTPRoute,
/// Application and ApplicationSet CRDs from `upstream`.
pub fn crd_files(repo: &Path, upstream: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo.join("crds"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.push(upstream.join("gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml"));
    files.push(upstream.join("argo-cd-v3.5.1/application-crd.yaml"));
    files.push(upstream.join("argo-cd-v3.5.1/applicationset-crd.yaml"));
    files
}

impl Target {
    /// An emulator with RBAC enforced holding the CRDs, the namespaces `extra_namespaces` and
    /// those the chart's documents use, and the chart's RBAC and admission policies from
    /// `rendered`.
    pub async fn emulated(
        crds: &[PathBuf],
        rendered: &[Value],
        extra_namespaces: &[&str],
    ) -> Result<Target, TargetError> {
        let emu = Emulator::start_with(Options {
            rbac: true,
            ..Options::default()
        })
        .await
        .map_err(|e| TargetError::Emulator(e.to_string()))?;
        for f in crds {
            emu.load_manifest_file(f).map_err(|e| TargetError::Load {
                what: f.display().to_string(),
                message: e.to_string(),
            })?;
        }
        let mut grants = chart::of_kinds(rendered, &chart::RBAC_KINDS);
        grants.extend(chart::of_kinds(rendered, &chart::ADMISSION_KINDS));
        let mut namespaces = chart::namespaces(&grants);
        namespaces.extend(extra_namespaces.iter().map(|s| (*s).to_owned()));
        for ns in namespaces {
            emu.load_yaml(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
            ))
            .map_err(|e| TargetError::Load {
                what: format!("namespace {ns}"),
                message: e.to_string(),
            })?;
        }
        emu.load_yaml(&chart::to_yaml(&grants))
            .map_err(|e| TargetError::Load {
                what: "the chart's RBAC and admission policies".into(),
                message: e.to_string(),
            })?;
        let dir = tempfile::tempdir().map_err(|e| TargetError::Emulator(e.to_string()))?;
        Ok(Target::Emulated { emu, dir })
    }

    /// A real kube-apiserver (its own, on the test binary's shared etcd) holding the CRDs, the
    /// namespaces `extra_namespaces` and those the chart's documents use, and the chart's RBAC
    /// and admission policies from `rendered`; every ServiceAccount among them gets a token from
    /// the TokenRequest API. `None` when the control plane's binaries are missing (the test is
    /// then skipped, or fails under CI).
    pub async fn real(
        crds: &[PathBuf],
        rendered: &[Value],
        extra_namespaces: &[&str],
    ) -> Result<Option<Target>, TargetError> {
        if control_plane::require().is_none() {
            return Ok(None);
        }
        let fail = |e: control_plane::ControlPlaneError| TargetError::ControlPlane(e.to_string());
        let etcd = ETCD
            .get_or_try_init(|| async { Etcd::start().await.map(Arc::new) })
            .await
            .map_err(fail)?
            .clone();
        // kube-controller-manager's workload, disruption, garbage-collector, namespace and
        // service-account controllers (`control_plane::CONTROLLERS`): the simulator plays only
        // the kubelet and Istio's injector here (`sluice_sim::ClusterConfig::on_real_control_plane`).
        let cp = ControlPlane::start_with(control_plane::Options {
            etcd: Some(etcd),
            controller_manager: true,
            controllers: control_plane::CONTROLLERS.to_vec(),
        })
        .await
        .map_err(fail)?;
        for f in crds {
            let yaml = std::fs::read_to_string(f).map_err(|e| TargetError::Load {
                what: f.display().to_string(),
                message: e.to_string(),
            })?;
            cp.install_crds(&yaml)
                .await
                .map_err(|e| TargetError::Load {
                    what: f.display().to_string(),
                    message: e.to_string(),
                })?;
        }
        let mut grants = chart::of_kinds(rendered, &chart::RBAC_KINDS);
        grants.extend(chart::of_kinds(rendered, &chart::ADMISSION_KINDS));
        let mut namespaces = chart::namespaces(&grants);
        namespaces.extend(extra_namespaces.iter().map(|s| (*s).to_owned()));
        let namespace_docs: Vec<String> = namespaces
            .iter()
            .map(|ns| format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"))
            .collect();
        cp.apply_yaml(&namespace_docs.join("---\n"))
            .await
            .map_err(|e| TargetError::Load {
                what: "namespaces".into(),
                message: e.to_string(),
            })?;
        cp.apply_yaml(&chart::to_yaml(&grants))
            .await
            .map_err(|e| TargetError::Load {
                what: "the chart's RBAC and admission policies".into(),
                message: e.to_string(),
            })?;
        let mut tokens = BTreeMap::new();
        for sa in chart::of_kinds(&grants, &["ServiceAccount"]) {
            let ns = sa["metadata"]["namespace"].as_str().unwrap_or("default");
            let name = sa["metadata"]["name"].as_str().unwrap_or_default();
            let token = cp.service_account_token(ns, name).await.map_err(fail)?;
            tokens.insert((ns.to_owned(), name.to_owned()), token);
        }
        let admin =
            Client::try_from(cp.config()).map_err(|e| TargetError::ControlPlane(e.to_string()))?;
        let dir = tempfile::tempdir().map_err(|e| TargetError::ControlPlane(e.to_string()))?;
        Ok(Some(Target::Real {
            cp: Box::new(cp),
            admin,
            tokens,
            dir,
        }))
    }

    /// Creates or updates the objects of `yaml` as the administrator (emulated or real; a real
    /// cluster's objects are its own).
    pub async fn load_yaml(&self, yaml: &str) -> Result<(), TargetError> {
        match self {
            Target::Emulated { emu, .. } => {
                emu.load_yaml(yaml).map_err(|e| TargetError::Load {
                    what: "a fixture".into(),
                    message: e.to_string(),
                })?;
            }
            Target::Real { cp, .. } => {
                cp.apply_yaml(yaml).await.map_err(|e| TargetError::Load {
                    what: "a fixture".into(),
                    message: e.to_string(),
                })?;
            }
            Target::Cluster { .. } => {
                return Err(TargetError::Cluster(
                    "fixtures are not loaded into a real cluster".into(),
                ));
            }
        }
        Ok(())
    }

    /// The API server's URL (emulated or real).
    pub fn base_url(&self) -> Option<String> {
        match self {
            Target::Emulated { emu, .. } => Some(emu.base_url()),
            Target::Real { cp, .. } => Some(cp.url()),
            Target::Cluster { .. } => None,
        }
    }

    /// The real control plane, when this target is one.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        match self {
            Target::Real { cp, .. } => Some(cp),
            _ => None,
        }
    }

    /// The CA certificate (PEM) a client of this target must trust; `None` for the emulator's
    /// plain HTTP.
    pub fn ca_pem(&self) -> Option<String> {
        match self {
            Target::Real { cp, .. } => Some(cp.ca().cert_pem().to_owned()),
            _ => None,
        }
    }

    /// A bearer token of the ServiceAccount `namespace/name` (emulated, or one of the chart's on
    /// a real control plane).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> Option<String> {
        match self {
            Target::Emulated { emu, .. } => Some(emu.service_account_token(namespace, name)),
            Target::Real { tokens, .. } => tokens
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned(),
            Target::Cluster { .. } => None,
        }
    }

    /// The real cluster of `KUBECONFIG`.
    pub async fn cluster() -> Result<Target, TargetError> {
        let client = Client::try_default()
            .await
            .map_err(|e| TargetError::Cluster(e.to_string()))?;
        client
            .apiserver_version()
            .await
            .map_err(|e| TargetError::Cluster(e.to_string()))?;
        Ok(Target::Cluster { client })
    }

    /// The administrator's client (fixtures and assertions).
    pub fn admin(&self) -> Client {
        match self {
            Target::Emulated { emu, .. } => emu.client(),
            Target::Real { admin, .. } => admin.clone(),
            Target::Cluster { client } => client.clone(),
        }
    }

    /// Whether this is a real cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster { .. })
    }

    /// The emulator, when emulated.
    pub fn emulator(&self) -> Option<&Emulator> {
        match self {
            Target::Emulated { emu, .. } => Some(emu),
            Target::Real { .. } | Target::Cluster { .. } => None,
        }
    }

    /// A kubeconfig authenticating as the ServiceAccount `namespace/name` (emulated, or one of
    /// the chart's on a real control plane; on a real cluster the chart's Deployments run the
    /// operators with their own identity).
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Option<PathBuf> {
        let token = self.service_account_token(namespace, name)?;
        let file = format!("{namespace}-{name}.kubeconfig");
        match self {
            Target::Emulated { emu, dir } => {
                let path = dir.path().join(file);
                emu.write_kubeconfig_with_token(&path, &token)
                    .expect("kubeconfig written to a temporary directory");
                Some(path)
            }
            Target::Real { cp, dir, .. } => {
                let path = dir.path().join(file);
                cp.write_token_kubeconfig(&path, &token)
                    .expect("kubeconfig written to a temporary directory");
                Some(path)
            }
            Target::Cluster { .. } => None,
        }
    }

    /// A client authenticating as the ServiceAccount `namespace/name` (emulated, or one of the
    /// chart's on a real control plane).
    pub fn service_account_client(&self, namespace: &str, name: &str) -> Option<Client> {
        let token = self.service_account_token(namespace, name)?;
        match self {
            Target::Emulated { emu, .. } => Some(emu.client_with_token(&token)),
            Target::Real { cp, .. } => Client::try_from(cp.config_with_token(&token)).ok(),
            Target::Cluster { .. } => None,
        }
    }

    /// On a real cluster, the logs of the chart's pods of `component` (label
    /// `app.kubernetes.io/component`) in `$SLUICE_NAMESPACE` (default `sluice-system`), so a
    /// scenario can look for denials there too; `None` when emulated.
    pub async fn operator_logs(&self, component: &str) -> Option<String> {
        let Target::Cluster { client } = self else {
            return None;
        };
        let ns = std::env::var("SLUICE_NAMESPACE").unwrap_or_else(|_| chart::NAMESPACE.into());
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), &ns);
        let selector = format!("app.kubernetes.io/component={component}");
        let list = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .ok()?;
        let mut out = String::new();
        for pod in list.items {
            let name = pod.metadata.name.unwrap_or_default();
            if let Ok(text) = pods.logs(&name, &Default::default()).await {
                out.push_str(&text);
            }
        }
        Some(out)
    }

    /// Fails the test when a real cluster's `component` pods logged an RBAC denial; does
    /// nothing when emulated (the scenario reads the binary's own log there).
    pub async fn assert_cluster_operator_not_denied(&self, component: &str) {
        if let Some(log) = self.operator_logs(component).await {
            let d = crate::process::denials(&log);
            assert!(
                d.is_empty(),
                "{component} was denied by RBAC in the cluster:\n{}",
                d.join("\n")
            );
        }
    }

    /// Stops the emulator.
    pub async fn stop(self) {
        if let Target::Emulated { emu, .. } = self {
            emu.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_category() {
        let message = String::new;
        let cases = [
            (TargetError::Emulator(message()), "emulator"),
            (
                TargetError::Load {
                    what: message(),
                    message: message(),
                },
                "load",
            ),
            (TargetError::Cluster(message()), "cluster"),
            (TargetError::ControlPlane(message()), "control_plane"),
        ];
        for (err, want) in cases {
            assert_eq!(err.category(), want, "{err:?}");
        }
    }
}
