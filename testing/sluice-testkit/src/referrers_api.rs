//! The OCI referrers API in front of the local registry. Debian's `docker-registry` (distribution
//! 2.8) has no `GET /v2/<name>/referrers/<digest>`, so cosign stores referrers under the
//! referrers tag schema (`sha256-<hex>`) there. Registries that implement the API (Harbor, zot,
//! distribution 3, the cloud registries) answer the endpoint instead and clients are expected to
//! use it. [`ReferrersApi`] is a plain-HTTP front on 127.0.0.1 that forwards every read to the
//! registry, answers the referrers endpoint with the image index the registry keeps under the
//! referrers tag (an empty index when there is none, as the distribution spec requires), and
//! hides that tag itself, so a client can find a referrer only through the API. It records every
//! request, so a test can say which path the client took. Reads only (GET and HEAD); the front
//! stops with the test (its task is aborted on drop).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// The media type of an OCI image index (the referrers response).
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// A running front; see the module docs.
#[derive(Debug)]
pub struct ReferrersApi {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ReferrersApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the front answers for one request path.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// `GET /v2/<name>/referrers/<digest>`: the index under the referrers tag of `digest`.
    Referrers { name: String, digest: String },
    /// A manifest read of a referrers tag (`sha256-<64 hex>`): hidden.
    ReferrersTag,
    /// Anything else: forwarded.
    Forward,
}

fn route(path: &str) -> Route {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let Some(rest) = path.strip_prefix("/v2/") else {
        return Route::Forward;
    };
    if let Some((name, digest)) = rest.rsplit_once("/referrers/") {
        return Route::Referrers {
            name: name.to_owned(),
            digest: digest.to_owned(),
        };
    }
    match rest.rsplit_once("/manifests/") {
        Some((_, reference))
            if reference.len() == 71
                && reference.starts_with("sha256-")
                && reference[7..].bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            Route::ReferrersTag
        }
        _ => Route::Forward,
    }
}

impl ReferrersApi {
    /// Starts the front for the registry at `upstream` (its base URL, e.g.
    /// [`crate::registry::Registry::url`] of a plain-HTTP fixture).
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = seen.clone();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(std::io::Error::other)?;
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (client, upstream, log) = (client.clone(), upstream.clone(), log.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(20),
                        serve(conn, &client, &upstream, &log),
                    )
                    .await;
                });
            }
        });
        Ok(Self { port, seen, task })
    }

    /// `host:port` for image references through the front.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every request so far, as `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many requests went to the referrers endpoint.
    pub fn referrers_calls(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.contains("/referrers/"))
            .count()
    }

    /// How many requests asked for a referrers tag (and were refused).
    pub fn referrers_tag_reads(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| route(r.split_once(' ').map_or("", |(_, p)| p)) == Route::ReferrersTag)
            .count()
    }
}

/// One reply: status, headers, body.
type Reply = (u16, Vec<(String, String)>, Vec<u8>);

async fn serve(
    mut conn: tokio::net::TcpStream,
    client: &reqwest::Client,
    upstream: &str,
    seen: &Mutex<Vec<String>>,
) {
    let Some(head) = crate::http_head::read(&mut conn).await else {
        return;
    };
    let (method, path) = (head.method, head.target);
    let headers: Vec<(String, String)> = head
        .headers
        .into_iter()
        .filter(|(k, _)| k == "accept" || k == "authorization")
        .collect();
    seen.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(format!("{method} {path}"));

    let (status, mut reply_headers, body) = match (method.as_str(), route(&path)) {
        ("GET" | "HEAD", Route::Referrers { name, digest }) => {
            referrers(client, upstream, &name, &digest, &headers).await
        }
        ("GET" | "HEAD", Route::ReferrersTag) => error(404, "MANIFEST_UNKNOWN"),
        ("GET" | "HEAD", Route::Forward) => forward(client, upstream, &method, &path, &headers)
            .await
            .unwrap_or_else(|_| error(502, "UNAVAILABLE")),
        _ => error(405, "UNSUPPORTED"),
    };
    let length = body.len();
    reply_headers.push(("Content-Length".into(), length.to_string()));
    reply_headers.push(("Connection".into(), "close".into()));
    let mut response = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in &reply_headers {
        response.push_str(&format!("{k}: {v}\r\n"));
    }
    response.push_str("\r\n");
    let _ = conn.write_all(response.as_bytes()).await;
    if method != "HEAD" {
        let _ = conn.write_all(&body).await;
    }
    let _ = conn.shutdown().await;
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        307 => "Temporary Redirect",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    }
}

fn error(status: u16, code: &str) -> Reply {
    (
        status,
        vec![("Content-Type".into(), "application/json".into())],
        format!(r#"{{"errors":[{{"code":"{code}","message":"{code}"}}]}}"#).into_bytes(),
    )
}

/// The referrers of `digest`: the registry's referrers-tag index, or an empty index.
async fn referrers(
    client: &reqwest::Client,
    upstream: &str,
    name: &str,
    digest: &str,
    headers: &[(String, String)],
) -> Reply {
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return error(400, "DIGEST_INVALID");
    };
    let mut with_accept: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| k == "authorization")
        .cloned()
        .collect();
    with_accept.push(("accept".into(), INDEX.into()));
    let tag_path = format!("/v2/{name}/manifests/sha256-{hex}");
    let body = match forward(client, upstream, "GET", &tag_path, &with_accept).await {
        Ok((200, _, body)) => body,
        Ok((404, _, _)) => {
            format!(r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[]}}"#).into_bytes()
        }
        Ok(other) => return other,
        Err(_) => return error(502, "UNAVAILABLE"),
    };
    (200, vec![("Content-Type".into(), INDEX.into())], body)
}

async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    method: &str,
    path: &str,
    headers: &[(String, String)],
) -> reqwest::Result<Reply> {
    let method = if method == "HEAD" {
        reqwest::Method::HEAD
    } else {
        reqwest::Method::GET
    };
    let mut request = client.request(method, format!("{upstream}{path}"));
    for (k, v) in headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let keep = [
        "content-type",
        "docker-content-digest",
        "www-authenticate",
        "location",
    ];
    let reply_headers = response
        .headers()
        .iter()
        .filter(|(k, _)| keep.contains(&k.as_str()))
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let body = response.bytes().await?.to_vec();
    Ok((status, reply_headers, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_the_referrers_endpoint_and_hides_only_referrers_tags() {
        let hex = "a".repeat(64);
        assert_eq!(
            route(&format!(
                "/v2/mesh/cosign/referrers/sha256:{hex}?artifactType=x"
            )),
            Route::Referrers {
                name: "mesh/cosign".into(),
                digest: format!("sha256:{hex}"),
            }
        );
        assert_eq!(
            route(&format!("/v2/mesh/cosign/manifests/sha256-{hex}")),
            Route::ReferrersTag
        );
        for forwarded in [
            format!("/v2/mesh/cosign/manifests/sha256:{hex}"),
            format!("/v2/mesh/cosign/manifests/sha256-{hex}.sig"),
            "/v2/mesh/cosign/manifests/w10".to_owned(),
            "/v2/".to_owned(),
        ] {
            assert_eq!(route(&forwarded), Route::Forward, "{forwarded}");
        }
    }
}
