//! Registry credentials from a Docker config (`~/.docker/config.json`, or a Kubernetes
//! `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`) and the CA bundle registries
//! are trusted with.
//!
//! Owns parsing and choosing: which entry of `auths` answers a `registry/repository` (the
//! longest matching key, so a signature repository or a single repository can have its own
//! entry), which credential helper a registry is named to (`credHelpers[host]`, else
//! `credsStore`, as Docker's CLI chooses), and which PEM certificates are added to the trusted
//! roots. Entries carry `auth` (base64 of `username:password`), `username` and `password`, or
//! `identitytoken` (an OAuth2 refresh token, as `docker login` stores for registries that issue
//! one). Credential helpers run only when a caller asks ([`RegistryCredentials::run_helpers`],
//! which `kubectl sluice bundle` does on a workstation; revert never does): for a registry with
//! a helper, the helper's answer replaces the `auths` entries of that host, as in Docker's CLI,
//! and a helper with nothing for it means anonymous. A helper named but not run is said in the
//! unauthorized message instead of being silently skipped. It must never put a password, token
//! or `auth` value into an error message or a `Debug` output.

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
    /// The credential helpers the config names.
    helpers: Helpers,
}

/// `credsStore` and `credHelpers`, and what the helpers that ran answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Helpers {
    /// `credsStore`: the helper of every registry without its own in `credHelpers`.
    store: Option<String>,
    /// `credHelpers`: normalized host → helper name (empty: the `auths` entries, no helper).
    per_registry: BTreeMap<String, String>,
    /// Normalized host → (helper, whether it answered with a credential), for the helpers run.
    ran: BTreeMap<String, (String, bool)>,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("registries", &self.entries.keys().collect::<Vec<_>>())
            .field("creds_store", &self.helpers.store)
            .field("cred_helpers", &self.helpers.per_registry)
            .finish()
    }
}

/// The key Docker files a registry's credentials and helper under: `docker.io` is its index.
fn host_key(registry: &str) -> String {
    match normalize(registry).as_str() {
        "docker.io" => "index.docker.io".to_owned(),
        other => other.to_owned(),
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
        let mut helpers = Helpers::default();
        match object.get("credsStore") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::String(store)) => {
                helpers.store = Some(store.trim().to_owned()).filter(|s| !s.is_empty());
            }
            Some(_) => return Err(invalid("\"credsStore\" is not a string".into())),
        }
        match object.get("credHelpers") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(map)) => {
                for (registry, helper) in map {
                    let helper = helper.as_str().ok_or_else(|| {
                        invalid(format!("credHelpers[{registry:?}] is not a string"))
                    })?;
                    helpers
                        .per_registry
                        .insert(host_key(registry), helper.trim().to_owned());
                }
            }
            Some(_) => return Err(invalid("\"credHelpers\" is not an object".into())),
        }
        let auths = match object.get("auths") {
            Some(serde_json::Value::Object(auths)) => auths,
            Some(_) => return Err(invalid("\"auths\" is not an object".into())),
            // Legacy `.dockercfg`: the registries are the top-level keys. A config with only
            // credential helpers (or nothing) has no credentials.
            None if !object.contains_key("credsStore") && !object.contains_key("credHelpers") => {
                object
            }
            None => {
                return Ok(Self {
                    helpers,
                    ..Self::default()
                });
            }
        };
        let mut out = Self {
            helpers,
            ..Self::default()
        };
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

    /// The credential helper the config names for `registry` (`host[:port]`), as Docker's CLI
    /// chooses it: its `credHelpers` entry, else `credsStore`; `None` when neither names one
    /// (an empty `credHelpers` entry means the `auths` entries, even with a `credsStore`).
    pub fn helper_for(&self, registry: &str) -> Option<&str> {
        let key = host_key(registry);
        match self.helpers.per_registry.get(&key) {
            Some(helper) => Some(helper.as_str()).filter(|h| !h.is_empty()),
            None => self.helpers.store.as_deref(),
        }
    }

    /// Runs the credential helper of each of `registries` (`host[:port]`) that has one, once,
    /// and uses its answer for that host in place of the host's `auths` entries (Docker's CLI
    /// does not read `auths` for a host with a helper either). A helper with no credentials for
    /// the host leaves it anonymous; a helper that is refused (a name with anything but letters,
    /// digits, `.`, `_`, `-`), missing, failing, silent past the timeout or answering more than
    /// [`crate::credential_helpers::MAX_HELPER_OUTPUT`] is an error naming it and the registry.
    pub async fn run_helpers<'a>(
        &mut self,
        registries: impl IntoIterator<Item = &'a str>,
        options: &crate::credential_helpers::HelperOptions,
    ) -> Result<()> {
        for registry in registries {
            let key = host_key(registry);
            if self.helpers.ran.contains_key(&key) {
                continue;
            }
            let Some(helper) = self.helper_for(registry).map(str::to_owned) else {
                continue;
            };
            let answer = crate::credential_helpers::get(&helper, &key, options).await?;
            // Filed under the host as references name it (`docker.io`), not Docker's key.
            let host = normalize(registry);
            let own = |entry: &str| {
                [&host, &key].into_iter().any(|h| {
                    entry == h
                        || entry
                            .strip_prefix(h.as_str())
                            .is_some_and(|r| r.starts_with('/'))
                })
            };
            self.entries.retain(|entry, _| !own(entry));
            self.helpers.ran.insert(key, (helper, answer.is_some()));
            if let Some(credential) = answer {
                self.entries.insert(host, credential);
            }
        }
        Ok(())
    }

    /// Why a request to `registry` carries no credentials, for an unauthorized message: none
    /// are configured, and — when the config names a helper for it — whether the helper had
    /// none or was not run here.
    pub(crate) fn missing_reason(&self, registry: &str) -> String {
        let mut reason = "the registry wants credentials and none are configured for it".to_owned();
        if let Some(note) = self.helper_note(registry) {
            reason.push_str("; ");
            reason.push_str(&note);
        }
        reason
    }

    /// What the config's credential helper did for `registry`, when it names one.
    pub(crate) fn helper_note(&self, registry: &str) -> Option<String> {
        use crate::credential_helpers::program;
        let key = host_key(registry);
        if let Some((helper, found)) = self.helpers.ran.get(&key) {
            return (!found).then(|| {
                format!(
                    "its credential helper {} has none for it (log in to {key} with it, e.g. \
                     `docker login {key}`)",
                    program(helper)
                )
            });
        }
        self.helper_for(registry).map(|helper| {
            format!(
                "the registry config names credential helper {} for it, which is not run here \
                 (revert never runs credential helpers); put the credentials themselves under \
                 \"auths\"",
                program(helper)
            )
        })
    }
}

pub(crate) fn classify(e: &serde_json::Error) -> &'static str {
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
    fn helpers_are_chosen_as_dockers_cli_chooses_them() {
        let c = RegistryCredentials::from_docker_config(
            br#"{"auths": {"plain.example": {"username": "u", "password": "p"}},
                 "credsStore": "desktop",
                 "credHelpers": {"https://ECR.example/": "ecr-login", "plain.example": "",
                                 "https://index.docker.io/v1/": "hub"}}"#,
            "t",
        )
        .unwrap();
        for (registry, want) in [
            ("ecr.example", Some("ecr-login")),
            ("other.example:5000", Some("desktop")),
            ("plain.example", None),
            ("docker.io", Some("hub")),
            ("index.docker.io", Some("hub")),
        ] {
            assert_eq!(c.helper_for(registry), want, "{registry}");
        }
        let none = RegistryCredentials::from_docker_config(
            br#"{"auths": {}, "credHelpers": {"a.example": "x"}}"#,
            "t",
        )
        .unwrap();
        assert_eq!(none.helper_for("b.example"), None);
        assert!(
            none.missing_reason("a.example")
                .contains("names credential helper docker-credential-x for it, which is not run")
        );
        assert_eq!(
            none.missing_reason("b.example"),
            "the registry wants credentials and none are configured for it"
        );
        for (json, want) in [
            (
                &br#"{"credsStore": 1}"#[..],
                "\"credsStore\" is not a string",
            ),
            (
                br#"{"credHelpers": []}"#,
                "\"credHelpers\" is not an object",
            ),
            (
                br#"{"credHelpers": {"a.example": 1}}"#,
                "credHelpers[\"a.example\"] is not a string",
            ),
        ] {
            let err = RegistryCredentials::from_docker_config(json, "t")
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[tokio::test]
    async fn a_helpers_answer_replaces_the_hosts_auths_entries() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("docker-credential-t");
        std::fs::write(
            &script,
            r#"#!/bin/sh
case "$(cat)" in
  r.example) echo '{"ServerURL":"r.example","Username":"robot","Secret":"s1"}' ;;
  https://index.docker.io/v1/) echo '{"Username":"<token>","Secret":"refresh-2"}' ;;
  *) echo "credentials not found in native keychain"; exit 1 ;;
esac
"#,
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = RegistryCredentials::from_docker_config(
            br#"{"auths": {"r.example": {"username": "old", "password": "p"},
                           "r.example/signatures": {"username": "old-sig", "password": "p"},
                           "empty.example": {"username": "u", "password": "p"},
                           "other.example": {"username": "u", "password": "p"}},
                 "credHelpers": {"r.example": "t", "docker.io": "t", "empty.example": "t"}}"#,
            "t",
        )
        .unwrap();
        let options = crate::HelperOptions {
            dirs: Some(vec![dir.path().to_owned()]),
            ..crate::HelperOptions::default()
        };
        c.run_helpers(["r.example", "docker.io", "empty.example"], &options)
            .await
            .unwrap();
        assert_eq!(
            c.for_repository("r.example", "signatures/mesh"),
            Some(&basic("robot", "s1")),
            "the helper's answer replaces every auths entry of its host"
        );
        assert_eq!(
            c.for_repository("docker.io", "library/mesh"),
            Some(&Credential::IdentityToken {
                token: "refresh-2".into()
            }),
            "<token> means an identity token; Docker Hub is asked by its index URL"
        );
        assert_eq!(c.for_repository("empty.example", "x"), None);
        let reason = c.missing_reason("empty.example");
        assert!(
            reason.ends_with(
                "; its credential helper docker-credential-t has none for it (log in to \
                 empty.example with it, e.g. `docker login empty.example`)"
            ),
            "{reason}"
        );
        assert_eq!(
            c.for_repository("other.example", "x"),
            Some(&basic("u", "p")),
            "a host without a helper keeps its entry"
        );
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s1") && !shown.contains("refresh-2"),
            "{shown}"
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
