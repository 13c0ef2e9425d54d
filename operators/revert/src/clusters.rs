//! Revert's own identity in each destination cluster.
//!
//! Each workload cluster is described by a Secret in the operator's namespace labelled
//! `sluice.dev/revert-cluster: "true"`, holding `name` (the Argo CD cluster name an
//! Application's `destination.name` uses), `server` (the API server URL, matched against
//! `destination.server`), `token` (a token of the least-privilege ServiceAccount the chart
//! installs in that cluster) and optionally `ca.crt`. Owns choosing that Secret and building a
//! client from it. Must never read or use Argo CD's cluster Secrets (labelled
//! `argocd.argoproj.io/secret-type`), even when one would match, and never logs a token.

use std::{collections::BTreeMap, sync::Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, api::ListParams};

/// Label that marks a revert cluster identity Secret.
pub const CLUSTER_LABEL: &str = "sluice.dev/revert-cluster";
/// Label of Argo CD's own cluster Secrets, which revert never uses.
pub const ARGOCD_SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";

/// Errors choosing or using a destination identity.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum ClusterError {
    /// No identity Secret names the destination.
    #[strum(serialize = "NoClusterIdentity")]
    #[error(
        "no revert cluster identity for destination {destination:?}: create a Secret in namespace {namespace} labelled {CLUSTER_LABEL}=true with keys name, server and token (the chart's per-cluster ServiceAccount token)"
    )]
    NoIdentity {
        /// The Application's destination.
        destination: String,
        /// The operator's namespace.
        namespace: String,
    },
    /// The Secret lacks a key.
    #[strum(serialize = "InvalidClusterIdentity")]
    #[error("revert cluster Secret {namespace}/{secret} has no {key:?} key; add it")]
    MissingKey {
        /// Namespace.
        namespace: String,
        /// Secret name.
        secret: String,
        /// The key.
        key: &'static str,
    },
    /// The Secret is one of Argo CD's; revert never uses Argo CD's credentials.
    #[error(
        "Secret {namespace}/{secret} is an Argo CD cluster Secret ({ARGOCD_SECRET_TYPE_LABEL}); revert never uses Argo CD's credentials — remove the {CLUSTER_LABEL} label from it and give revert its own identity"
    )]
    ArgoCdCredentials {
        /// Namespace.
        namespace: String,
        /// Secret name.
        secret: String,
    },
    /// The server URL or CA is unusable.
    #[strum(serialize = "InvalidClusterIdentity")]
    #[error("revert cluster Secret {namespace}/{secret}: {reason}")]
    Invalid {
        /// Namespace.
        namespace: String,
        /// Secret name.
        secret: String,
        /// What is wrong.
        reason: String,
    },
    /// Listing the Secrets failed.
    #[error("listing revert cluster Secrets in {namespace}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// The API error.
        source: kube::Error,
    },
}

impl ClusterError {
    /// Bounded category (metric label, Event reason).
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One destination identity, read from its Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// Secret it came from.
    pub secret: String,
    /// `resourceVersion` of that Secret (cache key).
    pub resource_version: String,
    /// Argo CD cluster name.
    pub name: String,
    /// API server URL.
    pub server: String,
    /// Bearer token.
    pub token: String,
    /// PEM CA bundle, when given.
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("secret", &self.secret)
            .field("name", &self.name)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

fn key(secret: &Secret, k: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(k))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|s| s.trim().to_owned())
        })
        .filter(|s| !s.is_empty())
}

/// Chooses the identity Secret for `destination` (a cluster name or a server URL). Pure.
pub fn select(
    secrets: &[Secret],
    namespace: &str,
    destination: &str,
) -> Result<Identity, ClusterError> {
    let wanted = destination.trim_end_matches('/');
    for s in secrets {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        if labels.get(CLUSTER_LABEL).map(String::as_str) != Some("true") {
            continue;
        }
        let name = key(s, "name");
        let server = key(s, "server");
        let matches = name.as_deref() == Some(wanted)
            || server.as_deref().map(|x| x.trim_end_matches('/')) == Some(wanted);
        if !matches {
            continue;
        }
        let secret = s.metadata.name.clone().unwrap_or_default();
        if labels.contains_key(ARGOCD_SECRET_TYPE_LABEL) {
            return Err(ClusterError::ArgoCdCredentials {
                namespace: namespace.into(),
                secret,
            });
        }
        let missing = |key: &'static str| ClusterError::MissingKey {
            namespace: namespace.into(),
            secret: secret.clone(),
            key,
        };
        let server = server.ok_or_else(|| missing("server"))?;
        let token = key(s, "token").ok_or_else(|| missing("token"))?;
        return Ok(Identity {
            secret: secret.clone(),
            resource_version: s.metadata.resource_version.clone().unwrap_or_default(),
            name: name.unwrap_or_default(),
            server,
            token,
            ca: s
                .data
                .as_ref()
                .and_then(|d| d.get("ca.crt"))
                .map(|b| b.0.clone()),
        });
    }
    Err(ClusterError::NoIdentity {
        destination: destination.into(),
        namespace: namespace.into(),
    })
}

/// Builds a client for an identity.
pub fn client_for(identity: &Identity, namespace: &str) -> Result<Client, ClusterError> {
    let invalid = |reason: String| ClusterError::Invalid {
        namespace: namespace.into(),
        secret: identity.secret.clone(),
        reason,
    };
    let url = identity
        .server
        .parse()
        .map_err(|e| invalid(format!("server {:?} is not a URL: {e}", identity.server)))?;
    let mut config = kube::Config::new(url);
    config.auth_info.token = Some(identity.token.clone().into());
    if let Some(ca) = &identity.ca {
        let pems = pem_blocks(ca);
        if pems.is_empty() {
            return Err(invalid("ca.crt holds no PEM certificate".into()));
        }
        config.root_cert = Some(pems);
    }
    // Remote applies are requests: connect and read timeouts, so a hung workload API server
    // fails the apply (retried) instead of stalling the pin and its reconcile slot.
    Client::try_from(sluice_runtime::client::for_requests(config))
        .map_err(|e| invalid(format!("cannot build a client: {e}")))
}

/// DER bodies of the PEM certificates in `pem`.
fn pem_blocks(pem: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(pem);
    let mut out = Vec::new();
    let mut body = String::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN CERTIFICATE") {
            inside = true;
            body.clear();
        } else if line.starts_with("-----END CERTIFICATE") {
            inside = false;
            if let Some(der) = base64_decode(&body) {
                out.push(der);
            }
        } else if inside {
            body.push_str(line);
        }
    }
    out
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let take = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        for i in 0..take {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// Destination clients, cached by identity Secret and its resourceVersion.
pub struct Clusters {
    client: Client,
    namespace: String,
    cache: Mutex<BTreeMap<String, (String, Client)>>,
}

impl std::fmt::Debug for Clusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clusters")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Clusters {
    /// Identities read from Secrets in `namespace` through `client` (the management cluster).
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// The namespace identities are read from.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A client acting as revert's own identity in `destination`.
    pub async fn client(&self, destination: &str) -> Result<Client, ClusterError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secrets = api
            .list(&ListParams::default().labels(&format!("{CLUSTER_LABEL}=true")))
            .await
            .map_err(|source| ClusterError::Api {
                namespace: self.namespace.clone(),
                source,
            })?;
        let identity = select(&secrets.items, &self.namespace, destination)?;
        let cache_key = format!("{}/{}", identity.secret, destination);
        if let Some((rv, client)) = self.cache.lock().expect("cache lock").get(&cache_key)
            && *rv == identity.resource_version
        {
            return Ok(client.clone());
        }
        let client = client_for(&identity, &self.namespace)?;
        self.cache.lock().expect("cache lock").insert(
            cache_key,
            (identity.resource_version.clone(), client.clone()),
        );
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).into(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn selection_by_name_or_server_and_never_argo_cds_secret() {
        let ours = [(CLUSTER_LABEL, "true")];
        let secrets = vec![
            // Argo CD's own cluster Secret for c1, without the revert label: ignored.
            secret(
                "cluster-c1",
                &[(ARGOCD_SECRET_TYPE_LABEL, "cluster")],
                &[
                    ("name", "c1"),
                    ("server", "https://c1:6443"),
                    ("config", "{}"),
                ],
            ),
            secret(
                "revert-c1",
                &ours,
                &[
                    ("name", "c1"),
                    ("server", "https://c1:6443/"),
                    ("token", "t1"),
                ],
            ),
            secret(
                "argocd-c2",
                &[
                    (CLUSTER_LABEL, "true"),
                    (ARGOCD_SECRET_TYPE_LABEL, "cluster"),
                ],
                &[("name", "c2"), ("server", "https://c2"), ("token", "t2")],
            ),
            secret(
                "revert-c3",
                &ours,
                &[("name", "c3"), ("server", "https://c3")],
            ),
        ];
        let table: Vec<(&str, Result<&str, &str>)> = vec![
            ("c1", Ok("revert-c1")),
            ("https://c1:6443", Ok("revert-c1")),
            ("c2", Err("ArgoCdCredentials")),
            ("c3", Err("InvalidClusterIdentity")),
            ("c9", Err("NoClusterIdentity")),
        ];
        for (destination, want) in table {
            let got = select(&secrets, "sluice-system", destination);
            match (got, want) {
                (Ok(identity), Ok(name)) => {
                    assert_eq!(identity.secret, name, "{destination}");
                    assert!(!format!("{identity:?}").contains("t1"), "no token in Debug");
                }
                (Err(e), Err(category)) => {
                    assert_eq!(e.category(), category, "{destination}: {e}");
                    assert!(e.to_string().contains("sluice-system"), "{e}");
                }
                (got, want) => panic!("{destination}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn pem_blocks_decode_certificates() {
        let pem = b"-----BEGIN CERTIFICATE-----\nAAEC\nAw==\n-----END CERTIFICATE-----\n";
        assert_eq!(pem_blocks(pem), vec![vec![0, 1, 2, 3]]);
        assert!(pem_blocks(b"not a pem").is_empty());
    }
}
