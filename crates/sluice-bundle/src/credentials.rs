//! Registry credentials from a Docker config (`~/.docker/config.json`, or a Kubernetes
//! `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`) and the CA bundle registries
//! are trusted with.
//!
//! Owns parsing and choosing: which entry of `auths` answers a `registry/repository` (the
//! longest matching key, so a signature repository or a single repository can have its own
//! entry), and which PEM certificates are added to the trusted roots. Entries carry `auth`
//! (base64 of `username:password`), `username` and `password`, or `identitytoken` (an OAuth2
//! refresh token, as `docker login` stores for registries that issue one). Credential helpers
//! (`credsStore`, `credHelpers`) are never run: the config must hold the credentials themselves.
//! It must never put a password, token or `auth` value into an error message or a `Debug`
//! output.

use std::collections::BTreeMap;

use base64::Engine;

use crate::error::{BundleError, Result};

/// Largest Docker config read (1 MiB): a config with hundreds of registries is a few tens of
/// kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// What a registry is told to prove who is asking.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// HTTP basic credentials: sent to the registry itself on a `Basic` challenge, and to a
    /// token realm on the registry's own host on a `Bearer` challenge.
    Basic {
        /// User name.
        username: String,
        /// Password (or an access token used as one, as cloud registries issue).
        password: String,
    },
    /// An OAuth2 refresh token (`identitytoken`): exchanged at the token realm for an access
    /// token (`grant_type=refresh_token`).
    IdentityToken {
        /// The refresh token.
        token: String,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .finish_non_exhaustive(),
            Credential::IdentityToken { .. } => f.write_str("IdentityToken"),
        }
    }
}

/// Credentials per registry (or per repository prefix), as a Docker config lists them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryCredentials {
    /// Normalized key (`host[:port][/path]`, host lower-cased) → credential.
    entries: BTreeMap<String, Credential>,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("registries", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `https://Host:5000/v2/path/` → `host:5000/path`; the `/v1/` and `/v2/` API suffixes Docker
/// writes for its own hub are dropped.
fn normalize(key: &str) -> String {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let key = key.trim_end_matches('/');
    let (host, path) = key.split_once('/').unwrap_or((key, ""));
    let path = path
        .strip_prefix("v2")
        .or_else(|| path.strip_prefix("v1"))
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        .unwrap_or(path)
        .trim_matches('/');
    if path.is_empty() {
        host.to_ascii_lowercase()
    } else {
        format!("{}/{path}", host.to_ascii_lowercase())
    }
}

impl RegistryCredentials {
    /// No credentials: every registry is asked anonymously.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether no registry has credentials.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The registries (and repository prefixes) that have credentials, for messages.
    pub fn registries(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// Adds (or replaces) the credential for `registry` (`host[:port][/repository prefix]`).
    pub fn insert(&mut self, registry: &str, credential: Credential) {
        self.entries.insert(normalize(registry), credential);
    }

    /// Parses a Docker config: `{"auths": {"<registry>": {"auth": ..., "username": ...,
    /// "password": ..., "identitytoken": ...}}}` (the legacy `.dockercfg` form without `auths`
    /// is read too). `source` names where it came from in errors (a path, `Secret ns/name`).
    pub fn from_docker_config(json: &[u8], source: &str) -> Result<Self> {
        let invalid = |reason: String| BundleError::Credentials {
            source_name: source.to_owned(),
            reason,
        };
        if json.len() as u64 > MAX_CONFIG_BYTES {
            return Err(invalid(format!(
                "{} bytes, more than the {MAX_CONFIG_BYTES} a registry config may have",
                json.len()
            )));
        }
        let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| {
            invalid(format!(
                "not JSON ({} at line {} column {}); expected a Docker config with \"auths\"",
                classify(&e),
                e.line(),
                e.column()
            ))
        })?;
        let object = value
            .as_object()
            .ok_or_else(|| invalid("not a JSON object; expected {\"auths\": {...}}".into()))?;
        let auths = match object.get("auths") {
            Some(serde_json::Value::Object(auths)) => auths,
            Some(_) => return Err(invalid("\"auths\" is not an object".into())),
            // Legacy `.dockercfg`: the registries are the top-level keys. A config with only
            // credential helpers (or nothing) has no credentials.
            None if !object.contains_key("credsStore") && !object.contains_key("credHelpers") => {
                object
            }
            None => return Ok(Self::default()),
        };
        let mut out = Self::default();
        for (registry, entry) in auths {
            let field = |name: &str| {
                entry
                    .get(name)
                    .and_then(serde_json::Value::as_str)
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
            };
            let at = |reason: &str| invalid(format!("auths[{registry:?}]: {reason}"));
            if !entry.is_object() {
                return Err(at("not an object"));
            }
            let credential = if let Some(token) = field("identitytoken") {
                Credential::IdentityToken {
                    token: token.to_owned(),
                }
            } else if let Some(auth) = field("auth") {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth)
                    .map_err(|_| at("\"auth\" is not base64 (of username:password)"))?;
                let decoded = String::from_utf8(decoded)
                    .map_err(|_| at("\"auth\" does not decode to UTF-8 username:password"))?;
                let (username, password) = decoded
                    .split_once(':')
                    .ok_or_else(|| at("\"auth\" does not decode to username:password"))?;
                Credential::Basic {
                    username: username.to_owned(),
                    password: password.to_owned(),
                }
            } else if let (Some(username), Some(password)) = (field("username"), field("password"))
            {
                Credential::Basic {
                    username: username.to_owned(),
                    password: password.to_owned(),
                }
            } else {
                // `docker login` with a credential store leaves an empty entry: nothing to use.
                continue;
            };
            out.insert(registry, credential);
        }
        Ok(out)
    }

    /// Reads a Docker config file.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let bytes = read_capped_file(path, MAX_CONFIG_BYTES)?;
        Self::from_docker_config(&bytes, &path.display().to_string())
    }

    /// The credential for `repository` on `registry`: the entry with the longest key that is
    /// the registry itself or a path prefix of `registry/repository`.
    pub fn for_repository(&self, registry: &str, repository: &str) -> Option<&Credential> {
        let registry = registry.to_ascii_lowercase();
        let full = format!("{registry}/{}", repository.trim_matches('/'));
        self.entries
            .iter()
            .filter(|(key, _)| {
                **key == registry
                    || (full.starts_with(key.as_str())
                        && key.len() > registry.len()
                        && full.as_bytes().get(key.len()).is_none_or(|b| *b == b'/'))
            })
            .max_by_key(|(key, _)| key.len())
            .map(|(_, c)| c)
    }
}

fn classify(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "unexpected value",
        serde_json::error::Category::Eof => "truncated",
    }
}

/// Reads at most `max` bytes of `path`; a larger file is an error.
pub(crate) fn read_capped_file(path: &std::path::Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|source| BundleError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| BundleError::Io {
            action: "reading",
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > max {
        return Err(BundleError::Credentials {
            source_name: path.display().to_string(),
            reason: format!("larger than {max} bytes"),
        });
    }
    Ok(bytes)
}

/// CA certificates a registry's TLS certificate may chain to, besides the system roots.
#[derive(Clone)]
pub struct CaBundle {
    /// One PEM block per certificate.
    blocks: Vec<String>,
    certificates: Vec<reqwest::Certificate>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle")
            .field("certificates", &self.blocks.len())
            .finish()
    }
}

impl PartialEq for CaBundle {
    fn eq(&self, other: &Self) -> bool {
        self.blocks == other.blocks
    }
}

impl CaBundle {
    /// Parses a PEM bundle: at least one `CERTIFICATE` block, every block parseable. `source`
    /// names it in errors (a path, `ConfigMap ns/name`).
    pub fn from_pem(pem: &[u8], source: &str) -> Result<Self> {
        let invalid = |reason: String| BundleError::Credentials {
            source_name: source.to_owned(),
            reason,
        };
        let text = std::str::from_utf8(pem).map_err(|_| invalid("not PEM text".into()))?;
        let mut blocks = Vec::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = line.trim();
            if line == "-----BEGIN CERTIFICATE-----" {
                current = Some(format!("{line}\n"));
            } else if let Some(block) = current.as_mut() {
                block.push_str(line);
                block.push('\n');
                if line == "-----END CERTIFICATE-----" {
                    blocks.extend(current.take());
                }
            }
        }
        if blocks.is_empty() {
            return Err(invalid(
                "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        let mut certificates = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            let certificate = reqwest::Certificate::from_pem(block.as_bytes())
                .map_err(|_| invalid(format!("certificate {} is not a certificate", i + 1)))?;
            certificates.push(certificate);
        }
        Ok(Self {
            blocks,
            certificates,
        })
    }

    /// Reads a PEM CA bundle file (at most 1 MiB).
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let bytes = read_capped_file(path, MAX_CONFIG_BYTES)?;
        Self::from_pem(&bytes, &path.display().to_string())
    }

    /// How many certificates it holds.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Never true: a bundle holds at least one certificate.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub(crate) fn certificates(&self) -> Vec<reqwest::Certificate> {
        self.certificates.clone()
    }

    pub(crate) fn pem_blocks(&self) -> &[String] {
        &self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(u: &str, p: &str) -> Credential {
        Credential::Basic {
            username: u.into(),
            password: p.into(),
        }
    }

    #[test]
    fn docker_config_entries_in_every_form() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot$ci:s3cr:et");
        let json = serde_json::json!({"auths": {
            "https://Registry.Example:5000/v2/": {"auth": auth},
            "registry.example:5000/signatures": {"username": "sig", "password": "pw"},
            "idp.example": {"identitytoken": "refresh-1"},
            "helper-only.example": {},
        }, "credHelpers": {"other.example": "ecr-login"}});
        let c = RegistryCredentials::from_docker_config(json.to_string().as_bytes(), "t").unwrap();
        assert_eq!(
            c.for_repository("registry.example:5000", "mesh/config"),
            Some(&basic("robot$ci", "s3cr:et")),
            "auth splits at the first colon; scheme, /v2/ and case are normalized"
        );
        assert_eq!(
            c.for_repository("registry.example:5000", "signatures/mesh"),
            Some(&basic("sig", "pw")),
            "the longest key (a repository prefix) wins"
        );
        assert_eq!(
            c.for_repository("registry.example:5000", "signatures-other"),
            Some(&basic("robot$ci", "s3cr:et")),
            "a prefix matches whole path segments only"
        );
        assert_eq!(
            c.for_repository("idp.example", "x"),
            Some(&Credential::IdentityToken {
                token: "refresh-1".into()
            })
        );
        assert_eq!(
            c.for_repository("registry.example", "mesh"),
            None,
            "port matters"
        );
        assert_eq!(c.for_repository("helper-only.example", "x"), None);
        assert_eq!(c.registries().len(), 3);
        let shown = format!("{c:?} {:?}", c.for_repository("idp.example", "x"));
        assert!(
            !shown.contains("s3cr") && !shown.contains("refresh-1") && !shown.contains(&auth),
            "{shown}"
        );
    }

    #[test]
    fn legacy_dockercfg_and_helper_only_configs() {
        let legacy = br#"{"registry.example": {"username": "u", "password": "p"}}"#;
        let c = RegistryCredentials::from_docker_config(legacy, "t").unwrap();
        assert_eq!(
            c.for_repository("registry.example", "a"),
            Some(&basic("u", "p"))
        );
        let helpers = br#"{"credsStore": "desktop"}"#;
        assert!(
            RegistryCredentials::from_docker_config(helpers, "t")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn broken_configs_name_the_source_and_never_the_secret() {
        for (json, want) in [
            (&b"{not json"[..], "not JSON (syntax error"),
            (br#"[1]"#, "not a JSON object"),
            (br#"{"auths": []}"#, "\"auths\" is not an object"),
            (
                br#"{"auths": {"r.example": {"auth": "%%%secretvalue"}}}"#,
                "auths[\"r.example\"]: \"auth\" is not base64",
            ),
            (
                br#"{"auths": {"r.example": {"auth": "c2VjcmV0dmFsdWU="}}}"#,
                "does not decode to username:password",
            ),
        ] {
            let err = RegistryCredentials::from_docker_config(json, "Secret ns/regcred")
                .unwrap_err()
                .to_string();
            assert!(err.contains("Secret ns/regcred"), "{err}");
            assert!(err.contains(want), "{err} should contain {want}");
            assert!(!err.contains("secretvalue"), "{err}");
        }
    }

    #[test]
    fn ca_bundles_must_hold_a_certificate() {
        let err = CaBundle::from_pem(b"hello", "ca.pem")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ca.pem") && err.contains("no PEM certificate"),
            "{err}"
        );
    }
}
