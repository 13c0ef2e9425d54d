//! A token service for the registry fixture: Docker's token flow, as cloud registries use it.
//!
//! Owns one HTTPS listener on 127.0.0.1 (serving certificate from the fixture's CA) answering
//! `GET /token?service=..&scope=..` with HTTP basic credentials, and `POST /token` with an
//! OAuth2 `refresh_token` (or `password`) grant, by issuing a JWT the way distribution's token
//! authentication (`registry/auth/token`, v2.8) verifies it: header `alg` ES256 with an `x5c`
//! chain whose leaf verifies against the registry's `rootcertbundle`; claims `iss`, `sub`,
//! `aud` (a single string, the service), `exp`, `nbf`, `iat`, `jti` and `access` (one entry per
//! requested scope). Wrong credentials get HTTP 401. Every request is recorded (path, whether
//! it carried credentials) so tests can check where credentials went. The listener task is
//! aborted when the server is dropped and never serves anything but 127.0.0.1.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::control_plane::{CertificateAuthority, CertifiedKey};

/// The `service` the registry names in its challenge and the token's audience.
pub const SERVICE: &str = "sluice-test-registry";
/// The token's issuer, as the registry's config trusts it.
pub const ISSUER: &str = "sluice-test-token-issuer";

/// One request the token service received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    /// `GET` or `POST`.
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Whether an `Authorization` header came with it.
    pub had_authorization: bool,
    /// The grant type of a `POST` (`refresh_token`, `password`).
    pub grant_type: Option<String>,
    /// HTTP status answered.
    pub status: u16,
}

/// What the token service accepts.
#[derive(Clone)]
pub(crate) struct Accepts {
    pub username: String,
    pub password: String,
    pub refresh_token: String,
}

/// A running token service; stopped when dropped.
pub struct TokenServer {
    port: u16,
    requests: Arc<Mutex<Vec<TokenRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TokenServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenServer")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Signer {
    key: EcdsaKeyPair,
    x5c: String,
}

fn der_of(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .concat();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap_or_default()
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl Signer {
    fn new(signing: &CertifiedKey) -> Result<Self, String> {
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der_of(&signing.key_pem))
                .map_err(|e| format!("token signing key: {e}"))?;
        Ok(Self {
            key,
            x5c: base64::engine::general_purpose::STANDARD.encode(der_of(&signing.cert_pem)),
        })
    }

    /// A distribution token granting `scopes` (`type:name:action,action`).
    fn token(&self, subject: &str, scopes: &[String]) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let access: Vec<serde_json::Value> = scopes
            .iter()
            .filter_map(|scope| {
                let (kind, rest) = scope.split_once(':')?;
                let (name, actions) = rest.rsplit_once(':')?;
                Some(serde_json::json!({
                    "type": kind,
                    "name": name,
                    "actions": actions.split(',').collect::<Vec<_>>(),
                }))
            })
            .collect();
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [self.x5c]});
        let claims = serde_json::json!({
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now.saturating_sub(10),
            "iat": now,
            "jti": format!("sluice-{now}-{}", scopes.len()),
            "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = self
            .key
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map(|s| s.as_ref().to_vec())
            .unwrap_or_default();
        format!("{signing_input}.{}", b64url(&signature))
    }
}

fn query_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%'
                && i + 2 < bytes.len()
                && let Ok(hex) = std::str::from_utf8(&bytes[i + 1..i + 3])
                && let Ok(b) = u8::from_str_radix(hex, 16)
            {
                out.push(b);
                i += 3;
                continue;
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

impl TokenServer {
    /// Starts the service on 127.0.0.1 and a free port with a serving certificate from `ca`;
    /// tokens are signed with `signing` (a certificate from a CA in the registry's
    /// `rootcertbundle`).
    pub(crate) async fn start(
        ca: &CertificateAuthority,
        signing: &CertifiedKey,
        accepts: Accepts,
    ) -> Result<Self, String> {
        let serving = ca
            .server(&["127.0.0.1", "localhost"])
            .map_err(|e| format!("token service certificate: {e}"))?;
        let chain = vec![
            CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())
                .map_err(|e| format!("token service certificate: {e}"))?,
        ];
        let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
            .map_err(|e| format!("token service key: {e}"))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("token service TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("token service TLS: {e}"))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("token service listener: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("token service listener: {e}"))?
            .port();
        let signer = Arc::new(Signer::new(signing)?);
        let requests: Arc<Mutex<Vec<TokenRequest>>> = Arc::default();
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let signer = signer.clone();
                let seen = seen.clone();
                let accepts = accepts.clone();
                tokio::spawn(async move {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(conn)).await
                    else {
                        return;
                    };
                    let _ = tokio::time::timeout(
                        Duration::from_secs(10),
                        serve(stream, &signer, &accepts, &seen),
                    )
                    .await;
                });
            }
        });
        Ok(Self {
            port,
            requests,
            task,
        })
    }

    /// The realm URL the registry's challenge names.
    pub fn realm(&self) -> String {
        format!("https://127.0.0.1:{}/token", self.port)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<TokenRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    signer: &Signer,
    accepts: &Accepts,
    seen: &Mutex<Vec<TokenRequest>>,
) {
    let Some(head) = crate::http_head::read(&mut stream).await else {
        return;
    };
    let authorization = head.header("authorization").map(str::to_owned);
    let length: usize = head
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (method, target) = (head.method, head.target);
    let mut body = head.body_start;
    let mut chunk = [0u8; 4096];
    while body.len() < length.min(64 * 1024) {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let mut params = query_pairs(query);
    if method == "POST" {
        params.extend(query_pairs(&String::from_utf8_lossy(&body)));
    }
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let scopes: Vec<String> = params
        .iter()
        .filter(|(k, _)| k == "scope")
        .flat_map(|(_, v)| v.split(' ').map(str::to_owned).collect::<Vec<_>>())
        .filter(|s| !s.is_empty())
        .collect();
    let basic = authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let grant_type = param("grant_type");
    let subject = match (method.as_str(), grant_type.as_deref()) {
        ("GET", _) => basic
            .as_deref()
            .and_then(|b| b.split_once(':'))
            .filter(|(u, p)| *u == accepts.username && *p == accepts.password)
            .map(|(u, _)| u.to_owned()),
        ("POST", Some("refresh_token")) => param("refresh_token")
            .filter(|t| *t == accepts.refresh_token)
            .map(|_| accepts.username.clone()),
        ("POST", Some("password")) => (param("username").as_deref()
            == Some(accepts.username.as_str())
            && param("password").as_deref() == Some(accepts.password.as_str()))
        .then(|| accepts.username.clone()),
        _ => None,
    };
    let (status, body) = match subject {
        Some(subject) if param("service").as_deref() == Some(SERVICE) => {
            let token = signer.token(&subject, &scopes);
            let body = if method == "POST" {
                serde_json::json!({"access_token": token, "expires_in": 300})
            } else {
                serde_json::json!({"token": token, "expires_in": 300})
            };
            (200u16, body.to_string())
        }
        Some(_) => (
            400,
            r#"{"errors":[{"code":"UNSUPPORTED","message":"unknown service"}]}"#.to_owned(),
        ),
        None => (
            401,
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                .to_owned(),
        ),
    };
    seen.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(TokenRequest {
            method,
            target,
            had_authorization: authorization.is_some(),
            grant_type,
            status,
        });
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        _ => "Bad Request",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_form_values_decode() {
        let pairs = query_pairs("scope=repository%3Amesh%2Fconfig%3Apull%2Cpush&service=s+1&x");
        assert_eq!(pairs[0].1, "repository:mesh/config:pull,push");
        assert_eq!(pairs[1].1, "s 1");
        assert_eq!(pairs[2], ("x".to_owned(), String::new()));
    }
}
