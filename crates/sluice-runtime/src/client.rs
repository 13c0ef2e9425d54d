//! Builds the Kubernetes client from the runtime flags.
//!
//! Owns the choice between an explicit kubeconfig, the in-cluster service account and the
//! user's `KUBECONFIG`, and between the two clients an operator holds: one for requests (reads
//! and writes, each bounded by connect and read timeouts, so a hung API server or a black-holed
//! connection fails the request instead of stalling the reconcile that holds leadership) and one
//! for watches (no read timeout: a quiet watch is not a dead one, and kube-runtime's watcher has its
//! own idle timeout; a short read timeout there would only relist over and over). TLS is rustls
//! with the aws-lc-rs provider (selected by the workspace's kube features). Must never log
//! credentials or tokens, only where the config came from.

use std::{path::PathBuf, time::Duration};

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

/// Longest wait for a TCP (and TLS) connection to an API server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest silence while a request is answered (counted from when the request was written), on
/// request clients. Below the default Lease duration (15 s), so a request sent by a leader that is
/// about to be deposed fails rather than hangs past the renew deadline.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// Longest time to write a request body.
pub const REQUEST_WRITE_TIMEOUT: Duration = Duration::from_secs(15);

/// `config` made for requests (gets, lists, writes, evictions, remote applies): connect, read
/// and write timeouts, the read timeout counted from when the request was sent rather than from
/// when a pooled connection went idle. Use it for every client that is not a watch, remote
/// workload-cluster clients included.
pub fn for_requests(mut config: Config) -> Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(REQUEST_READ_TIMEOUT);
    config.write_timeout = Some(REQUEST_WRITE_TIMEOUT);
    config.reset_reader_on_write = true;
    config
}

/// `config` made for watches: a connect timeout but no read timeout (a watch on a quiet kind sends
/// nothing for minutes; kube-runtime's watcher bounds an idle stream itself and resumes it).
pub fn for_watches(mut config: Config) -> Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = None;
    config
}

/// The two clients of an operator (see the module documentation).
#[derive(Clone)]
pub struct Clients {
    /// Reads and writes: bounded by [`for_requests`]' timeouts.
    pub requests: Client,
    /// Watches and reflectors only: no read timeout.
    pub watches: Client,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients").finish_non_exhaustive()
    }
}

/// Builds the request client from the runtime flags (see [`config`], [`for_requests`]).
pub async fn client(args: &RuntimeArgs) -> Result<Client, ClientError> {
    Ok(clients(args).await?.requests)
}

/// Builds both clients from the runtime flags (see [`config`]).
pub async fn clients(args: &RuntimeArgs) -> Result<Clients, ClientError> {
    let (config, source) = config(args).await?;
    tracing::info!(?source, cluster_url = %config.cluster_url,
        request_read_timeout = ?REQUEST_READ_TIMEOUT, "kubernetes clients configured");
    Ok(Clients {
        requests: Client::try_from(for_requests(config.clone())).map_err(ClientError::Build)?,
        watches: Client::try_from(for_watches(config)).map_err(ClientError::Build)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_time_out_and_watches_do_not() {
        let base = Config::new("https://127.0.0.1:6443".parse().unwrap());
        let r = for_requests(base.clone());
        assert_eq!(r.read_timeout, Some(REQUEST_READ_TIMEOUT));
        assert_eq!(r.connect_timeout, Some(CONNECT_TIMEOUT));
        assert!(r.reset_reader_on_write);
        let w = for_watches(base);
        assert_eq!(w.read_timeout, None);
        assert_eq!(w.connect_timeout, Some(CONNECT_TIMEOUT));
    }
}
