//! Reading manifests and blobs from a registry with every byte counted.
//!
//! Owns the pull side of the registry protocol that revert relies on: the registry allowlist, the
//! bearer-token dance, redirects and byte caps. A download stops as soon as the registry has sent
//! more bytes than the object may have (its declared size, or the cap for its kind), whatever
//! `Content-Length` said; every request has a deadline for the whole exchange, not only between
//! reads. Redirects are followed by hand (at most [`MAX_REDIRECTS`]): to another host (cloud
//! registries serve blobs from a storage host that way) without any credential, never from HTTPS
//! down to plain HTTP. A token realm on another host than the registry receives no credential
//! either. Error text from the registry never reaches a message (it would reach a pin's status):
//! only the HTTP status and the registry's error codes do. Must never log credentials.
//!
//! Credentials come per registry (or repository prefix) from [`RegistryCredentials`]: basic
//! credentials answer a `Basic` challenge, or are sent to a `Bearer` challenge's token realm
//! (Docker's token flow: `GET realm?service=..&scope=repository:<name>:pull` with basic
//! credentials, then the request again with the bearer token); an `identitytoken` is exchanged
//! at the realm with an OAuth2 `refresh_token` grant. A CA bundle, when given, is trusted besides
//! the system roots.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, LOCATION, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};

use crate::credentials::{Credential, RegistryCredentials};
use crate::error::{BundleError, Result};

/// Largest manifest read (4 MiB): a bundle's manifest is about a kilobyte.
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// Largest token response read.
const MAX_TOKEN_BYTES: u64 = 1024 * 1024;

/// Largest error body read (only its error codes are kept).
const MAX_ERROR_BYTES: u64 = 64 * 1024;

/// Most redirects followed for one request.
pub const MAX_REDIRECTS: usize = 5;

/// What one request may receive and how long it may take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Most body bytes.
    pub max_bytes: u64,
    /// Deadline for the whole request, redirects and body included.
    pub deadline: Duration,
}

/// The pull client: one HTTP client (no automatic redirects) and the tokens it was given.
pub(crate) struct Fetcher {
    http: reqwest::Client,
    plain_http_hosts: Vec<String>,
    tls_hosts: Vec<String>,
    credentials: RegistryCredentials,
    /// Used for a registry without an entry in `credentials`.
    basic_auth: Option<(String, String)>,
    /// `registry|repository` → `Authorization` header value.
    tokens: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher").finish_non_exhaustive()
    }
}

/// Whether `registry` (`host[:port]`) is on `allowed` (entries `host` or `host:port`; an entry
/// without a port allows every port of that host). An empty allowlist allows every registry.
pub fn registry_allowed(registry: &str, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let host = host_of(registry);
    allowed.iter().map(|a| a.trim()).any(|a| {
        a.eq_ignore_ascii_case(registry) || (!a.contains(':') && a.eq_ignore_ascii_case(host))
    })
}

fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return registry
            .split(']')
            .next()
            .map_or(registry, |h| &registry[..h.len() + 1]);
    }
    registry.rsplit_once(':').map_or(registry, |(h, _)| h)
}

fn authority(url: &Url) -> String {
    match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_owned(),
    }
}

impl Fetcher {
    pub(crate) fn new(options: &crate::client::RegistryOptions) -> Self {
        let read_timeout = options.timeout.unwrap_or(Duration::from_secs(30));
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5).min(read_timeout))
            .read_timeout(read_timeout)
            .user_agent("sluice-bundle");
        if let Some(ca) = &options.ca_bundle {
            builder = builder.tls_certs_merge(ca.certificates());
        }
        // Building fails only without a TLS backend, which this crate always compiles in.
        let http = builder.build().unwrap_or_default();
        Self {
            http,
            plain_http_hosts: options.plain_http_hosts.clone(),
            tls_hosts: options.tls_hosts.clone(),
            credentials: options.credentials.clone(),
            basic_auth: options.basic_auth.clone(),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// The credential for `repository` on `registry`: its entry in the registry config, else
    /// the client-wide basic credentials.
    fn credential(&self, registry: &str, repository: &str) -> Option<Credential> {
        self.credentials
            .for_repository(registry, repository)
            .cloned()
            .or_else(|| {
                self.basic_auth
                    .as_ref()
                    .map(|(username, password)| Credential::Basic {
                        username: username.clone(),
                        password: password.clone(),
                    })
            })
    }

    fn scheme(&self, registry: &str) -> &'static str {
        if crate::client::plain_http(registry, &self.plain_http_hosts, &self.tls_hosts) {
            "http"
        } else {
            "https"
        }
    }

    /// `GET /v2/<repository>/<kind>/<reference>` on `registry`, its body checked against
    /// `digest` when given, at most `limits.max_bytes` bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn get(
        &self,
        registry: &str,
        repository: &str,
        kind: &str,
        reference: &str,
        accept: Option<&str>,
        digest: Option<&str>,
        limits: Limits,
        action: &str,
    ) -> Result<Vec<u8>> {
        let subject = format!("{registry}/{repository}@{reference}");
        let subject = if kind == "manifests" && !reference.starts_with("sha256:") {
            format!("{registry}/{repository}:{reference}")
        } else {
            subject
        };
        let url = format!(
            "{}://{registry}/v2/{repository}/{kind}/{reference}",
            self.scheme(registry)
        );
        let body = tokio::time::timeout(
            limits.deadline,
            self.get_authorized(registry, repository, &url, accept, limits, &subject, action),
        )
        .await
        .map_err(|_| BundleError::RegistryUnavailable {
            registry: registry.to_owned(),
            action: action.to_owned(),
            reason: format!("no complete answer within {:?}", limits.deadline),
        })??;
        if let Some(expected) = digest {
            let actual = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
            if actual != expected {
                return Err(BundleError::DigestMismatch {
                    subject: format!("{subject} (content served by the registry)"),
                    expected: expected.to_owned(),
                    actual,
                });
            }
        }
        Ok(body)
    }

    #[allow(clippy::too_many_arguments)]
    async fn get_authorized(
        &self,
        registry: &str,
        repository: &str,
        url: &str,
        accept: Option<&str>,
        limits: Limits,
        subject: &str,
        action: &str,
    ) -> Result<Vec<u8>> {
        let key = format!("{registry}|{repository}");
        let cached = self
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let mut auth = cached.clone();
        for attempt in 0..2 {
            match self
                .follow(
                    registry,
                    url,
                    accept,
                    auth.as_deref(),
                    limits,
                    subject,
                    action,
                )
                .await?
            {
                Answer::Body(b) => return Ok(b),
                Answer::Challenge(challenge) if attempt == 0 => {
                    let header = self
                        .authorize(registry, repository, &challenge, action)
                        .await?;
                    self.tokens
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key.clone(), header.clone());
                    auth = Some(header);
                }
                Answer::Challenge(_) => break,
            }
        }
        Err(BundleError::Unauthorized {
            registry: registry.to_owned(),
            reference: subject.to_owned(),
            action: action.to_owned(),
            reason: match self.credential(registry, repository) {
                Some(c) => format!("the registry refused {}", describe(&c)),
                None => self.credentials.missing_reason(registry),
            },
        })
    }

    /// Sends the request, following redirects by hand: credentials go only to the registry
    /// itself.
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        registry: &str,
        url: &str,
        accept: Option<&str>,
        auth: Option<&str>,
        limits: Limits,
        subject: &str,
        action: &str,
    ) -> Result<Answer> {
        let unavailable = |reason: String| BundleError::RegistryUnavailable {
            registry: registry.to_owned(),
            action: action.to_owned(),
            reason,
        };
        let mut url = Url::parse(url).map_err(|e| BundleError::InvalidReference {
            what: "registry URL",
            value: url.to_owned(),
            reason: e.to_string(),
        })?;
        for _ in 0..=MAX_REDIRECTS {
            let same_host = authority(&url).eq_ignore_ascii_case(registry);
            let mut request = self.http.get(url.clone());
            if let Some(a) = accept {
                request = request.header(ACCEPT, a);
            }
            if same_host && let Some(a) = auth {
                request = request.header(AUTHORIZATION, a);
            }
            let response = request
                .send()
                .await
                .map_err(|e| unavailable(transport(&e)))?;
            let status = response.status();
            if status.is_redirection() {
                let next = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| url.join(l).ok())
                    .ok_or_else(|| BundleError::Registry {
                        reference: subject.to_owned(),
                        action: action.to_owned(),
                        reason: format!(
                            "HTTP {}: a redirect without a usable Location",
                            status.as_u16()
                        ),
                    })?;
                if url.scheme() == "https" && next.scheme() != "https" {
                    return Err(BundleError::Registry {
                        reference: subject.to_owned(),
                        action: action.to_owned(),
                        reason: "a redirect from HTTPS to plain HTTP was refused".into(),
                    });
                }
                url = next;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED && same_host {
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_owned)
                    .unwrap_or_default();
                return Ok(Answer::Challenge(challenge));
            }
            if !status.is_success() {
                let code = status.as_u16();
                let body = read_capped(response, MAX_ERROR_BYTES, subject)
                    .await
                    .unwrap_or_default();
                let codes = error_codes(&body);
                let reason = if codes.is_empty() {
                    format!("HTTP {code}")
                } else {
                    format!("HTTP {code} ({codes})")
                };
                return Err(match code {
                    404 => BundleError::NotFound {
                        reference: subject.to_owned(),
                        action: action.to_owned(),
                    },
                    429 | 500.. => unavailable(reason),
                    _ if codes.contains("MANIFEST_UNKNOWN")
                        || codes.contains("BLOB_UNKNOWN")
                        || codes.contains("NAME_UNKNOWN") =>
                    {
                        BundleError::NotFound {
                            reference: subject.to_owned(),
                            action: action.to_owned(),
                        }
                    }
                    _ => BundleError::Registry {
                        reference: subject.to_owned(),
                        action: action.to_owned(),
                        reason,
                    },
                });
            }
            return read_capped(response, limits.max_bytes, subject)
                .await
                .map(Answer::Body)
                .map_err(|e| match e {
                    Capped::TooLarge => BundleError::TooLarge {
                        subject: subject.to_owned(),
                        limit: limits.max_bytes,
                    },
                    Capped::Transport(reason) => unavailable(reason),
                });
        }
        Err(BundleError::Registry {
            reference: subject.to_owned(),
            action: action.to_owned(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// Answers a `WWW-Authenticate` challenge: the `Authorization` header to retry with.
    async fn authorize(
        &self,
        registry: &str,
        repository: &str,
        challenge: &str,
        action: &str,
    ) -> Result<String> {
        let reference = format!("{registry}/{repository}");
        let refused = |reason: String| BundleError::Registry {
            reference: reference.clone(),
            action: action.to_owned(),
            reason,
        };
        let unauthorized = |reason: String| BundleError::Unauthorized {
            registry: registry.to_owned(),
            reference: reference.clone(),
            action: action.to_owned(),
            reason,
        };
        let credential = self.credential(registry, repository);
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return match &credential {
                Some(Credential::Basic { username, password }) => {
                    use base64::Engine;
                    let pair = base64::engine::general_purpose::STANDARD
                        .encode(format!("{username}:{password}"));
                    Ok(format!("Basic {pair}"))
                }
                Some(Credential::IdentityToken { .. }) => Err(unauthorized(
                    "the registry asks for basic credentials and its config entry holds an \
                     identitytoken only"
                        .into(),
                )),
                None => Err(unauthorized(self.credentials.missing_reason(registry))),
            };
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(refused(format!(
                "HTTP 401 with an unsupported challenge {scheme:?}"
            )));
        }
        let params = challenge_params(params);
        let realm = params
            .get("realm")
            .and_then(|r| Url::parse(r).ok())
            .ok_or_else(|| refused("HTTP 401: a bearer challenge without a usable realm".into()))?;
        if realm.scheme() != "https" && self.scheme(registry) == "https" {
            return Err(refused(
                "the token realm is plain HTTP while the registry is HTTPS; refused".into(),
            ));
        }
        let scope = format!("repository:{repository}:pull");
        // Credentials go to a realm on the registry's own host only.
        let own_host = authority(&realm).eq_ignore_ascii_case(registry)
            || realm.host_str() == Some(host_of(registry));
        let request = match (&credential, own_host) {
            (Some(Credential::IdentityToken { token }), true) => {
                // OAuth2 refresh-token grant, as Docker's token specification describes it.
                let mut form = vec![
                    ("grant_type", "refresh_token".to_owned()),
                    ("refresh_token", token.clone()),
                    ("scope", scope.clone()),
                    ("client_id", "sluice".to_owned()),
                ];
                if let Some(service) = params.get("service") {
                    form.push(("service", service.clone()));
                }
                self.http.post(realm.clone()).form(&form)
            }
            (credential, own_host) => {
                let mut url = realm.clone();
                {
                    let mut q = url.query_pairs_mut();
                    q.append_pair("scope", &scope);
                    if let Some(service) = params.get("service") {
                        q.append_pair("service", service);
                    }
                }
                let mut request = self.http.get(url);
                if own_host && let Some(Credential::Basic { username, password }) = credential {
                    request = request.basic_auth(username, Some(password));
                }
                request
            }
        };
        let response = tokio::time::timeout(Duration::from_secs(30), request.send())
            .await
            .map_err(|_| refused("the token service did not answer within 30s".into()))?
            .map_err(|e| BundleError::RegistryUnavailable {
                registry: registry.to_owned(),
                action: action.to_owned(),
                reason: format!("token service: {}", transport(&e)),
            })?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            let tried = match (&credential, own_host) {
                (Some(c), true) => describe(c),
                (Some(_), false) => "no credentials (its token service is on another host, \
                                     which is never sent any)"
                    .to_owned(),
                (None, _) => match self.credentials.helper_note(registry) {
                    Some(note) => format!("no credentials (none are configured for it; {note})"),
                    None => "no credentials (none are configured for it)".to_owned(),
                },
            };
            return Err(unauthorized(format!(
                "its token service answered HTTP {} to {tried}",
                status.as_u16()
            )));
        }
        if !status.is_success() {
            return Err(refused(format!(
                "the token service answered HTTP {}",
                status.as_u16()
            )));
        }
        let body = read_capped(response, MAX_TOKEN_BYTES, "token")
            .await
            .map_err(|_| refused("the token answer is too large or broken".into()))?;
        let token: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|_| refused("the token answer is not JSON".into()))?;
        let token = token
            .get("token")
            .or_else(|| token.get("access_token"))
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| refused("the token answer holds no token".into()))?;
        Ok(format!("Bearer {token}"))
    }
}

/// Which credential was tried, for messages: never the secret itself.
fn describe(credential: &Credential) -> String {
    match credential {
        Credential::Basic { username, .. } => {
            format!("the credentials of user {username:?}")
        }
        Credential::IdentityToken { .. } => "the identity token".to_owned(),
    }
}

enum Answer {
    Body(Vec<u8>),
    Challenge(String),
}

enum Capped {
    TooLarge,
    Transport(String),
}

/// Reads the body, failing as soon as more than `max` bytes arrived.
async fn read_capped(
    mut response: reqwest::Response,
    max: u64,
    _subject: &str,
) -> std::result::Result<Vec<u8>, Capped> {
    let mut out = Vec::with_capacity(response.content_length().unwrap_or(0).min(max) as usize);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Capped::Transport(transport(&e)))?
    {
        if out.len() as u64 + chunk.len() as u64 > max {
            return Err(Capped::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The transport error, without any URL (it may carry a token query).
pub(crate) fn transport(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "the answer broke off"
    } else {
        "request failed"
    };
    let mut cause = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(c) = cause {
        detail = c.to_string();
        cause = c.source();
    }
    let tls = ["certificate", "UnknownIssuer", "tls", "TLS", "handshake"]
        .iter()
        .any(|w| detail.contains(w));
    if tls {
        format!(
            "TLS: the registry's certificate is not trusted ({detail}); give the CA that signed \
             it (revert.registry.caConfigMap, or the plugin's --registry-ca)"
        )
    } else if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {detail}")
    }
}

/// The OCI error codes in an error body (`{"errors":[{"code":...}]}`), comma-separated.
fn error_codes(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let mut codes: Vec<String> = v
        .get("errors")
        .and_then(serde_json::Value::as_array)
        .map(|errors| {
            errors
                .iter()
                .filter_map(|e| e.get("code")?.as_str())
                .filter(|c| {
                    c.len() <= 64 && c.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_')
                })
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    codes.sort();
    codes.dedup();
    codes.truncate(4);
    codes.join(",")
}

/// `key="value"` pairs of a challenge.
fn challenge_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.split_once('"') {
                Some((v, n)) => (v.to_owned(), n),
                None => (quoted.to_owned(), ""),
            }
        } else {
            match after.split_once(',') {
                Some((v, n)) => (v.trim().to_owned(), n),
                None => (after.trim().to_owned(), ""),
            }
        };
        out.insert(key, value);
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_matches_host_or_host_and_port() {
        let allowed = vec![
            "registry.example".to_owned(),
            "mirror.example:5000".to_owned(),
        ];
        assert!(registry_allowed("registry.example", &allowed));
        assert!(registry_allowed("registry.example:443", &allowed));
        assert!(registry_allowed("mirror.example:5000", &allowed));
        assert!(!registry_allowed("mirror.example:5001", &allowed));
        assert!(!registry_allowed("evil.example", &allowed));
        assert!(!registry_allowed("registry.example.evil", &allowed));
        assert!(registry_allowed("anything:1", &[]), "empty allows all");
    }

    #[test]
    fn challenge_parameters() {
        let p = challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a:pull""#,
        );
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry.example");
        assert_eq!(p["scope"], "repository:a:pull");
    }

    #[test]
    fn error_bodies_keep_only_their_codes() {
        let body =
            br#"{"errors":[{"code":"DENIED","message":"see http://attacker.example/<script>"}]}"#;
        assert_eq!(error_codes(body), "DENIED");
        assert_eq!(error_codes(b"<html>proxy error, secret=abc</html>"), "");
    }
}
