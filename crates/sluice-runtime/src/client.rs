//! Builds the Kubernetes client from the runtime flags.
//!
//! Owns the choice between an explicit kubeconfig, the in-cluster service account and the
//! user's `KUBECONFIG`. TLS is rustls with the aws-lc-rs provider (selected by the workspace's
//! kube features). Must never log credentials or tokens, only where the config came from.

use std::path::PathBuf;

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{
    config::RuntimeArgs,
    error::{Categorized, Category},
};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file named by `--kubeconfig` could not be read or used.
    #[error(
        "cannot use kubeconfig {path}: {source}; check --kubeconfig / SLUICE_KUBECONFIG and --context"
    )]
    Kubeconfig {
        /// The file that was tried.
        path: PathBuf,
        /// What failed.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster configuration nor a user kubeconfig was found.
    #[error(
        "no Kubernetes configuration found: {0}; run in a pod with a service account or set \
         --kubeconfig / KUBECONFIG"
    )]
    Infer(String),
    /// The configuration was found but the client could not be built from it.
    #[error("cannot build a Kubernetes client: {0}; check the cluster URL and TLS settings")]
    Build(#[source] kube::Error),
}

impl Categorized for ClientError {
    fn category(&self) -> Category {
        Category::Config
    }
}

/// Where the client configuration came from, for the startup log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--kubeconfig` was given.
    ExplicitKubeconfig,
    /// The pod's service account.
    InCluster,
    /// `KUBECONFIG` or `~/.kube/config`.
    UserKubeconfig,
}

/// Resolves the client configuration: `--kubeconfig` if given, else in-cluster when running in a
/// pod, else the user's kubeconfig.
pub async fn config(args: &RuntimeArgs) -> Result<(Config, ConfigSource), ClientError> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    if let Some(path) = &args.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
            path: path.clone(),
            source,
        })?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
        return Ok((config, ConfigSource::ExplicitKubeconfig));
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        match Config::incluster() {
            Ok(config) => return Ok((config, ConfigSource::InCluster)),
            Err(err) => {
                tracing::warn!(error = %err, "in-cluster configuration unusable, trying kubeconfig")
            }
        }
    }
    Config::from_kubeconfig(&options)
        .await
        .map(|c| (c, ConfigSource::UserKubeconfig))
        .map_err(|e| ClientError::Infer(e.to_string()))
}

/// Builds a client from the runtime flags (see [`config`]).
pub async fn client(args: &RuntimeArgs) -> Result<Client, ClientError> {
    let (config, source) = config(args).await?;
    tracing::info!(?source, cluster_url = %config.cluster_url, "kubernetes client configured");
    Client::try_from(config).map_err(ClientError::Build)
}
