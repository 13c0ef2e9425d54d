//! Where the scenarios run: a Kubernetes API emulator with RBAC enforced, holding our CRDs, the
//! upstream Gateway API and Argo CD CRDs and exactly the RBAC the chart renders (the default);
//! or, with `KUBECONFIG` set and `SLUICE_E2E_CLUSTER=1`, a real cluster where the chart is
//! installed and its operators already run. Never grants a ServiceAccount anything beyond the
//! rendered documents it is given.

use std::path::{Path, PathBuf};

use kube::Client;
use kube_emulator::{Emulator, Options};
use serde_json::Value;

use crate::chart;

/// Whether the scenarios run against the real cluster of `KUBECONFIG`.
pub fn cluster_mode() -> bool {
    std::env::var_os("KUBECONFIG").is_some()
        && std::env::var("SLUICE_E2E_CLUSTER").is_ok_and(|v| v == "1")
}

/// Setting up the target failed.
#[derive(Debug, thiserror::Error)]
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
}

impl TargetError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        match self {
            TargetError::Emulator(_) => "emulator",
            TargetError::Load { .. } => "load",
            TargetError::Cluster(_) => "cluster",
        }
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
            Target::Cluster { .. } => None,
        }
    }

    /// A kubeconfig authenticating as the ServiceAccount `namespace/name` (emulated only: on a
    /// real cluster the chart's Deployments run the operators with their own identity).
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Option<PathBuf> {
        let Target::Emulated { emu, dir } = self else {
            return None;
        };
        let token = emu.service_account_token(namespace, name);
        let path = dir.path().join(format!("{namespace}-{name}.kubeconfig"));
        emu.write_kubeconfig_with_token(&path, &token)
            .expect("kubeconfig written to a temporary directory");
        Some(path)
    }

    /// A client authenticating as the ServiceAccount `namespace/name` (emulated only).
    pub fn service_account_client(&self, namespace: &str, name: &str) -> Option<Client> {
        let emu = self.emulator()?;
        Some(emu.client_with_token(&emu.service_account_token(namespace, name)))
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
