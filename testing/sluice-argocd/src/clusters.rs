//! Cluster Secrets: reading Argo CD's declarative cluster Secrets (label
//! `argocd.argoproj.io/secret-type: cluster`, data `name`, `server`, `config`) into clusters
//! the generators see and clients the application controller uses; and writing one
//! ([`cluster_secret`]). It must never log or put in an error a bearer token.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client};
use serde_json::Value;

use crate::error::ArgoCdError;
use crate::generators::ClusterInfo;
use crate::types::SECRET_TYPE_LABEL;

/// A cluster Secret naming a workload cluster: data `name`, `server`, `config` =
/// `{"bearerToken": token, "tlsClientConfig": {"insecure": true}}`; `labels` (plus the
/// secret-type label) become cluster-generator parameters `metadata.labels.<k>`. The Secret is
/// named `cluster-<name>`; put it in the Argo CD namespace.
pub fn cluster_secret(
    name: &str,
    server: &str,
    bearer_token: &str,
    labels: &BTreeMap<String, String>,
) -> Secret {
    let mut all_labels = labels.clone();
    all_labels.insert(SECRET_TYPE_LABEL.to_string(), "cluster".to_string());
    let config = serde_json::json!({
        "bearerToken": bearer_token,
        "tlsClientConfig": {"insecure": true},
    });
    let data: BTreeMap<String, ByteString> = [
        ("name", name.to_string()),
        ("server", server.to_string()),
        ("config", config.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("cluster-{}", sanitize(name))),
            labels: Some(all_labels),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// A cluster with what is needed to reach it.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Generator view (name, server, labels, annotations).
    pub info: ClusterInfo,
    /// Bearer token (never logged).
    token: String,
    /// Skip TLS verification.
    insecure: bool,
}

/// Reads one cluster Secret (pure).
pub fn parse_secret(secret: &Secret) -> Result<Cluster, ArgoCdError> {
    let id = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let field = |key: &str| -> Option<String> {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .cloned()
            })
    };
    let server =
        field("server")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ArgoCdError::ClusterSecret {
                secret: id.clone(),
                reason: "data.server is missing".into(),
            })?;
    let name = field("name")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| server.clone());
    let (token, insecure) = match field("config") {
        None => (String::new(), false),
        Some(text) => {
            let config: Value =
                serde_json::from_str(&text).map_err(|e| ArgoCdError::ClusterSecret {
                    secret: id.clone(),
                    reason: format!("data.config is not JSON: {e}"),
                })?;
            (
                config
                    .get("bearerToken")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                config
                    .pointer("/tlsClientConfig/insecure")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            )
        }
    };
    let mut labels: BTreeMap<String, String> = secret.metadata.labels.clone().unwrap_or_default();
    labels.remove(SECRET_TYPE_LABEL);
    // Argo CD passes the secret-type label through too; keep it as the generator sees it.
    labels.insert(SECRET_TYPE_LABEL.to_string(), "cluster".to_string());
    Ok(Cluster {
        info: ClusterInfo {
            name,
            server,
            labels,
            annotations: secret.metadata.annotations.clone().unwrap_or_default(),
        },
        token,
        insecure,
    })
}

/// Reads cluster Secrets and keeps one client per (server, credentials).
pub struct Clusters {
    secrets: Api<Secret>,
    namespace: String,
    clients: Mutex<HashMap<(String, String, bool), Client>>,
}

impl Clusters {
    /// Cluster Secrets of `namespace` on the management cluster.
    pub fn new(mgmt: Client, namespace: &str) -> Self {
        Clusters {
            secrets: Api::namespaced(mgmt, namespace),
            namespace: namespace.to_string(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// Every valid cluster, sorted by name, and the errors of the invalid Secrets.
    pub async fn list(&self) -> Result<(Vec<Cluster>, Vec<ArgoCdError>), ArgoCdError> {
        let list = self
            .secrets
            .list(&ListParams::default().labels(&format!("{SECRET_TYPE_LABEL}=cluster")))
            .await
            .map_err(|e| {
                ArgoCdError::kube(format!("listing cluster Secrets in {}", self.namespace), e)
            })?;
        let mut clusters = Vec::new();
        let mut errors = Vec::new();
        for secret in &list.items {
            match parse_secret(secret) {
                Ok(c) => clusters.push(c),
                Err(e) => errors.push(e),
            }
        }
        clusters.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        Ok((clusters, errors))
    }

    /// The cluster an Application's destination names (by `name`, else by `server`).
    pub async fn resolve(
        &self,
        name: Option<&str>,
        server: Option<&str>,
    ) -> Result<Cluster, ArgoCdError> {
        let (clusters, _) = self.list().await?;
        let (field, wanted) = match (
            name.filter(|s| !s.is_empty()),
            server.filter(|s| !s.is_empty()),
        ) {
            (Some(n), _) => ("name", n),
            (None, Some(s)) => ("server", s),
            (None, None) => {
                return Err(ArgoCdError::UnknownCluster {
                    destination: "(empty)".into(),
                    field: "name",
                    namespace: self.namespace.clone(),
                });
            }
        };
        let trim = |s: &str| s.trim_end_matches('/').to_string();
        clusters
            .into_iter()
            .find(|c| {
                if field == "name" {
                    c.info.name == wanted
                } else {
                    trim(&c.info.server) == trim(wanted)
                }
            })
            .ok_or_else(|| ArgoCdError::UnknownCluster {
                destination: wanted.to_string(),
                field,
                namespace: self.namespace.clone(),
            })
    }

    /// A client for the cluster (cached).
    pub fn client(&self, cluster: &Cluster) -> Result<Client, ArgoCdError> {
        let key = (
            cluster.info.server.clone(),
            cluster.token.clone(),
            cluster.insecure,
        );
        let mut clients = self
            .clients
            .lock()
            .expect("cluster client cache lock poisoned");
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let url = cluster
            .info
            .server
            .parse()
            .map_err(|e| ArgoCdError::ClusterSecret {
                secret: format!("cluster {}", cluster.info.name),
                reason: format!("server {:?} is not a URL: {e}", cluster.info.server),
            })?;
        let mut config = kube::Config::new(url);
        config.accept_invalid_certs = cluster.insecure;
        if !cluster.token.is_empty() {
            config.auth_info.token = Some(cluster.token.clone().into());
        }
        // Requests only (never a watch): connect and read timeouts, the read timeout counted
        // from when the request was sent.
        config.connect_timeout = Some(std::time::Duration::from_secs(5));
        config.read_timeout = Some(std::time::Duration::from_secs(15));
        config.reset_reader_on_write = true;
        let client = Client::try_from(config).map_err(|e| {
            ArgoCdError::kube(
                format!("building a client for cluster {}", cluster.info.name),
                e,
            )
        })?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_round_trip() {
        let labels: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())]
            .into_iter()
            .collect();
        let mut s = cluster_secret("East 1", "http://127.0.0.1:8080", "t0ken", &labels);
        s.metadata.namespace = Some("argocd".into());
        assert_eq!(s.metadata.name.as_deref(), Some("cluster-east-1"));
        let c = parse_secret(&s).unwrap();
        assert_eq!(c.info.name, "East 1");
        assert_eq!(c.info.server, "http://127.0.0.1:8080");
        assert_eq!(c.info.labels["env"], "prod");
        assert_eq!(c.token, "t0ken");
        assert!(c.insecure);
    }

    #[test]
    fn a_secret_without_server_is_refused_without_quoting_the_token() {
        let mut s = cluster_secret("a", "x", "secret-token", &BTreeMap::new());
        s.data.as_mut().unwrap().remove("server");
        let e = parse_secret(&s).unwrap_err();
        assert_eq!(e.category(), "cluster_secret");
        assert!(!e.to_string().contains("secret-token"));
    }
}
