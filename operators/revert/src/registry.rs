//! revert's registry client and the credentials it uses.
//!
//! Registry credentials live in one Docker config Secret (type `kubernetes.io/dockerconfigjson`,
//! key `.dockerconfigjson`) in the operator's namespace, named by `--registry-credentials-secret`
//! (chart `revert.registry.credentialsSecret`): per-registry entries, also for a signature
//! repository with its own entry. Owns reading that Secret on every use (one GET by name, which
//! the chart's RBAC allows for that Secret alone) and rebuilding the bundle client when its
//! `resourceVersion` changes, so rotated credentials (a refresher job renewing a cloud registry
//! token) are used at once, without a restart — as [`crate::clusters`] does for cluster
//! identities. A CA bundle for registries' TLS comes the same way from a ConfigMap (key
//! `ca.crt`, `--registry-ca-configmap`, chart `revert.registry.caConfigMap`), so a renewed CA
//! is trusted at once too. A missing or unreadable Secret or ConfigMap is an error naming it;
//! the previous client is never used with credentials the Secret no longer holds. Never logs a
//! credential.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use sluice_bundle::{BundleClient, RegistryCredentials, RegistryOptions};

/// The Secret key holding the Docker config (`kubernetes.io/dockerconfigjson`).
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// The ConfigMap key holding the PEM CA bundle.
pub const CA_KEY: &str = "ca.crt";

/// Why no registry client could be made.
#[derive(Debug, thiserror::Error)]
pub enum RegistryConfigError {
    /// The credentials Secret does not exist.
    #[error(
        "registry credentials Secret {namespace}/{name} not found; create it (type \
         kubernetes.io/dockerconfigjson) or unset revert.registry.credentialsSecret"
    )]
    Missing {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
    },
    /// The Secret has no `.dockerconfigjson` key, or it is not a usable Docker config.
    #[error("registry credentials Secret {namespace}/{name}: {reason}")]
    Invalid {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// What is wrong (never a credential).
        reason: String,
    },
    /// Reading the Secret failed.
    #[error("reading registry credentials Secret {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Parses the credentials of a Docker config Secret (pure).
pub fn credentials_of(secret: &Secret) -> Result<RegistryCredentials, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(DOCKER_CONFIG_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(DOCKER_CONFIG_KEY))
                .map(|s| s.as_bytes().to_vec())
        })
        .ok_or_else(|| {
            format!(
                "has no {DOCKER_CONFIG_KEY:?} key; create it with `kubectl create secret \
                 docker-registry` or from a Docker config file"
            )
        })?;
    RegistryCredentials::from_docker_config(&bytes, DOCKER_CONFIG_KEY).map_err(|e| e.to_string())
}

/// The bundle client, rebuilt when the credentials Secret changes.
pub struct Registries {
    client: Client,
    base: RegistryOptions,
    secret: Option<(String, String)>,
    ca_config_map: Option<(String, String)>,
    anonymous: Arc<BundleClient>,
    cached: Mutex<Option<(String, Arc<BundleClient>)>>,
}

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

impl Registries {
    /// Registries reached with `base` (plain-HTTP hosts, CA, allowlist, timeouts) and, when
    /// `secret` (`namespace`, `name`) is given, the credentials of that Secret.
    pub fn new(client: Client, base: RegistryOptions, secret: Option<(String, String)>) -> Self {
        Self {
            client,
            anonymous: Arc::new(BundleClient::new(base.clone())),
            base,
            secret,
            ca_config_map: None,
            cached: Mutex::new(None),
        }
    }

    /// Also trusts the PEM CA bundle under `ca.crt` of ConfigMap (`namespace`, `name`), read on
    /// every registry use like the credentials Secret.
    pub fn with_ca_config_map(mut self, config_map: Option<(String, String)>) -> Self {
        self.ca_config_map = config_map;
        self
    }

    async fn ca(&self) -> Result<Option<(String, sluice_bundle::CaBundle)>, RegistryConfigError> {
        let Some((namespace, name)) = &self.ca_config_map else {
            return Ok(None);
        };
        let invalid = |reason: String| RegistryConfigError::Invalid {
            namespace: namespace.clone(),
            name: name.clone(),
            reason,
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let map = api
            .get_opt(name)
            .await
            .map_err(|source| RegistryConfigError::Api {
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?
            .ok_or_else(|| {
                invalid(
                    "registry CA ConfigMap not found; create it or unset \
                     revert.registry.caConfigMap"
                        .into(),
                )
            })?;
        let pem = map
            .data
            .as_ref()
            .and_then(|d| d.get(CA_KEY))
            .ok_or_else(|| invalid(format!("registry CA ConfigMap has no {CA_KEY:?} key")))?;
        let ca = sluice_bundle::CaBundle::from_pem(pem.as_bytes(), CA_KEY)
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Some((
            map.metadata.resource_version.clone().unwrap_or_default(),
            ca,
        )))
    }

    /// The bundle client with the Secret's current credentials (read now).
    pub async fn bundles(&self) -> Result<Arc<BundleClient>, RegistryConfigError> {
        if self.secret.is_none() && self.ca_config_map.is_none() {
            return Ok(self.anonymous.clone());
        }
        let ca = self.ca().await?;
        let secret = match &self.secret {
            None => None,
            Some((namespace, name)) => {
                let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
                let secret = api
                    .get_opt(name)
                    .await
                    .map_err(|source| RegistryConfigError::Api {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        source,
                    })?
                    .ok_or_else(|| RegistryConfigError::Missing {
                        namespace: namespace.clone(),
                        name: name.clone(),
                    })?;
                Some((namespace.clone(), name.clone(), secret))
            }
        };
        let version = format!(
            "{}|{}",
            secret
                .as_ref()
                .and_then(|(_, _, s)| s.metadata.resource_version.clone())
                .unwrap_or_default(),
            ca.as_ref().map(|(v, _)| v.as_str()).unwrap_or_default()
        );
        if let Some((seen, client)) = self
            .cached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            && *seen == version
        {
            return Ok(client.clone());
        }
        let credentials = match &secret {
            None => self.base.credentials.clone(),
            Some((namespace, name, secret)) => {
                credentials_of(secret).map_err(|reason| RegistryConfigError::Invalid {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    reason,
                })?
            }
        };
        tracing::info!(
            resource_versions = %version,
            registries = ?credentials.registries(),
            "registry credentials and CA (re)loaded"
        );
        let client = Arc::new(BundleClient::new(RegistryOptions {
            credentials,
            ca_bundle: ca.map(|(_, ca)| ca).or_else(|| self.base.ca_bundle.clone()),
            ..self.base.clone()
        }));
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some((version, client.clone()));
        Ok(client)
    }
}

/// The bundle client's reads, with the credentials the Secret holds now: a Secret that is
/// missing or unusable fails the read (category `Credentials`, retried) naming the Secret.
impl Registries {
    async fn current(&self) -> sluice_bundle::Result<Arc<BundleClient>> {
        self.bundles()
            .await
            .map_err(|e| sluice_bundle::BundleError::Credentials {
                source_name: "(revert.registry.credentialsSecret)".into(),
                reason: e.to_string(),
            })
    }

    /// [`BundleClient::verify_and_pull`] with the current credentials.
    pub async fn verify_and_pull(
        &self,
        reference: &str,
        keys: &[sluice_bundle::PublicKey],
    ) -> sluice_bundle::Result<sluice_bundle::VerifiedBundle> {
        self.current().await?.verify_and_pull(reference, keys).await
    }

    /// [`BundleClient::verify_and_pull_with`] with the current credentials.
    pub async fn verify_and_pull_with(
        &self,
        reference: &str,
        policy: &sluice_bundle::Policy,
    ) -> sluice_bundle::Result<sluice_bundle::VerifiedBundle> {
        self.current()
            .await?
            .verify_and_pull_with(reference, policy)
            .await
    }

    /// [`BundleClient::pull`] with the current credentials.
    pub async fn pull(&self, reference: &str) -> sluice_bundle::Result<sluice_bundle::Artifact> {
        self.current().await?.pull(reference).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(data: Option<&str>) -> Secret {
        Secret {
            data: data.map(|d| {
                [(
                    DOCKER_CONFIG_KEY.to_owned(),
                    ByteString(d.as_bytes().to_vec()),
                )]
                .into_iter()
                .collect()
            }),
            ..Secret::default()
        }
    }

    #[test]
    fn docker_config_secrets_parse_or_say_what_is_wrong() {
        let c = credentials_of(&secret(Some(
            r#"{"auths":{"registry.example":{"username":"u","password":"p"}}}"#,
        )))
        .unwrap();
        assert_eq!(c.registries(), vec!["registry.example".to_owned()]);
        let missing = credentials_of(&secret(None)).unwrap_err();
        assert!(
            missing.contains("has no \".dockerconfigjson\" key"),
            "{missing}"
        );
        let broken = credentials_of(&secret(Some("{oops"))).unwrap_err();
        assert!(broken.contains("not JSON"), "{broken}");
    }
}
