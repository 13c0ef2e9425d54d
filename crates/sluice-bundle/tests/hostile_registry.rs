//! A registry that misbehaves (a small HTTP server in the test, on 127.0.0.1): more bytes than
//! declared, an endless manifest, a body that drips, a signature tag listing hundreds of
//! signatures, a redirect to another host, a registry off the allowlist. Each is stopped with a
//! clear error and bounded memory, and credentials never leave the registry's own host.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_bundle::{BundleClient, Manifests, Metadata, ReadOptions, RegistryOptions, render};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ROUTE: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: checkout
  namespace: shop
spec:
  parentRefs:
  - name: mesh-gateway
";

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    authorization: Option<String>,
}

/// What the server answers.
enum Reply {
    /// Status, extra headers, body.
    Full(u16, Vec<(String, String)>, Vec<u8>),
    /// 200, then `chunk` every `every`, `times` times (no Content-Length).
    Drip {
        chunk: Vec<u8>,
        every: Duration,
        times: usize,
    },
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Body bytes written to clients.
    sent: Arc<Mutex<u64>>,
}

impl Server {
    async fn start(handler: Handler) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sent: Arc<Mutex<u64>> = Arc::default();
        let (s, b) = (seen.clone(), sent.clone());
        tokio::spawn(async move {
            // Bounded: the test ends long before.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while let Ok(Ok((conn, _))) = tokio::time::timeout_at(deadline, listener.accept()).await
            {
                tokio::spawn(serve(conn, handler.clone(), s.clone(), b.clone()));
            }
        });
        Self { addr, seen, sent }
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    mut conn: TcpStream,
    handler: Handler,
    seen: Arc<Mutex<Vec<Seen>>>,
    sent: Arc<Mutex<u64>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let mut lines = text.lines();
    let path = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let request = Seen {
        path,
        authorization: headers.get("authorization").cloned(),
    };
    seen.lock().unwrap().push(request.clone());
    match handler(&request) {
        Reply::Full(status, extra, body) => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in extra {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = conn.write_all(head.as_bytes()).await;
            if conn.write_all(&body).await.is_ok() {
                *sent.lock().unwrap() += body.len() as u64;
            }
        }
        Reply::Drip {
            chunk,
            every,
            times,
        } => {
            let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for _ in 0..times {
                let frame = [
                    format!("{:x}\r\n", chunk.len()).into_bytes(),
                    chunk.clone(),
                    b"\r\n".to_vec(),
                ]
                .concat();
                if conn.write_all(&frame).await.is_err() {
                    return;
                }
                *sent.lock().unwrap() += chunk.len() as u64;
                tokio::time::sleep(every).await;
            }
            let _ = conn.write_all(b"0\r\n\r\n").await;
        }
    }
    let _ = conn.shutdown().await;
}

fn bundle() -> sluice_bundle::Artifact {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("route.yaml"), ROUTE).unwrap();
    let (manifests, _) = Manifests::read_dir(dir.path(), &ReadOptions::default()).unwrap();
    render(&manifests, &Metadata::default()).unwrap()
}

fn ok(body: Vec<u8>) -> Reply {
    Reply::Full(200, vec![], body)
}

/// Serves `artifact`'s manifest and config; the layer comes from `layer`.
fn bundle_handler(
    artifact: &sluice_bundle::Artifact,
    layer: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> Handler {
    let manifest = artifact.manifest_bytes.clone();
    let manifest_digest = artifact.manifest_digest.clone();
    let config = artifact.config.clone();
    let config_digest = artifact.manifest.config.digest.clone();
    Arc::new(move |req: &Seen| {
        if req.path.ends_with(&format!("/manifests/{manifest_digest}")) {
            ok(manifest.clone())
        } else if req.path.ends_with(&format!("/blobs/{config_digest}")) {
            ok(config.clone())
        } else if req.path.contains("/blobs/") {
            layer(req)
        } else {
            Reply::Full(
                404,
                vec![],
                br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#.to_vec(),
            )
        }
    })
}

fn client(options: RegistryOptions) -> BundleClient {
    BundleClient::new(options)
}

#[tokio::test]
async fn a_blob_longer_than_declared_is_cut_off_at_its_declared_size() {
    let artifact = bundle();
    let declared = artifact.layer.len() as u64;
    let mut flood = artifact.layer.clone();
    flood.extend(std::iter::repeat_n(0u8, 8 << 20));
    let server = Server::start(bundle_handler(&artifact, move |_| Reply::Drip {
        chunk: flood[..64 * 1024].to_vec(),
        every: Duration::from_millis(1),
        times: 128,
    }))
    .await;
    let reference = format!("{}/mesh/config@{}", server.host(), artifact.manifest_digest);
    let err = client(RegistryOptions::default())
        .pull(&reference)
        .await
        .expect_err("a layer longer than declared is refused");
    assert_eq!(err.category(), "TooLarge", "{err}");
    assert!(
        err.to_string()
            .contains(&format!("the registry sent more than {declared} bytes")),
        "{err}"
    );
    let sent = *server.sent.lock().unwrap();
    println!("declared {declared} bytes; the registry managed to send {sent} before the cut");
    assert!(
        sent < 4 << 20,
        "the client kept reading: {sent} bytes sent for a {declared}-byte layer"
    );
}

#[tokio::test]
async fn an_endless_manifest_is_cut_off_at_the_manifest_cap() {
    let server = Server::start(Arc::new(|_: &Seen| Reply::Drip {
        chunk: vec![b' '; 256 * 1024],
        every: Duration::from_millis(1),
        times: 4096,
    }))
    .await;
    let err = client(RegistryOptions::default())
        .resolve(&format!("{}/mesh/config:v1", server.host()))
        .await
        .expect_err("an endless manifest is refused");
    assert_eq!(err.category(), "TooLarge", "{err}");
    assert!(
        err.to_string().contains(&format!(
            "more than {} bytes",
            sluice_bundle::fetch::MAX_MANIFEST_BYTES
        )),
        "{err}"
    );
}

#[tokio::test]
async fn a_body_that_never_finishes_hits_the_request_deadline() {
    let server = Server::start(Arc::new(|_: &Seen| Reply::Drip {
        chunk: b" ".to_vec(),
        every: Duration::from_millis(50),
        times: 10_000,
    }))
    .await;
    let started = tokio::time::Instant::now();
    let err = client(RegistryOptions {
        timeout: Some(Duration::from_millis(300)),
        ..RegistryOptions::default()
    })
    .resolve(&format!("{}/mesh/config:v1", server.host()))
    .await
    .expect_err("a drip never completes");
    let took = started.elapsed();
    assert_eq!(err.category(), "RegistryUnavailable", "{err}");
    assert!(
        err.to_string().contains("no complete answer within 600ms"),
        "{err}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[tokio::test]
async fn a_signature_tag_listing_too_many_signatures_is_refused_before_any_is_read() {
    let artifact = bundle();
    let digest = artifact.manifest_digest.clone();
    let sig_tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    let layers: Vec<serde_json::Value> = (0..500)
        .map(|i| {
            serde_json::json!({
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "digest": format!("sha256:{:064x}", i),
                "size": 1000,
                "annotations": {"dev.cosignproject.cosign/signature": "AAAA"},
            })
        })
        .collect();
    let sig_manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{:064x}", 9999), "size": 2},
        "layers": layers,
    }))
    .unwrap();
    let inner = bundle_handler(&artifact, |_| Reply::Full(404, vec![], vec![]));
    let server = Server::start(Arc::new(move |req: &Seen| {
        if req.path.ends_with(&format!("/manifests/{sig_tag}")) {
            ok(sig_manifest.clone())
        } else {
            inner(req)
        }
    }))
    .await;
    let reference = format!("{}/mesh/config@{digest}", server.host());
    let public = sluice_bundle::SigningKey::generate()
        .unwrap()
        .public_key()
        .clone();
    let err = client(RegistryOptions::default())
        .verify(&reference, &[public])
        .await
        .expect_err("too many signatures");
    assert!(
        err.to_string().contains(&format!(
            "lists 500 signatures, more than the {} read",
            sluice_bundle::client::MAX_SIGNATURE_LAYERS
        )),
        "{err}"
    );
    assert!(
        !server.seen().iter().any(|s| s.path.contains("/blobs/")),
        "no signature blob was downloaded"
    );
}

#[tokio::test]
async fn a_registry_off_the_allowlist_is_never_contacted() {
    let artifact = bundle();
    let server = Server::start(bundle_handler(&artifact, |_| ok(vec![]))).await;
    let reference = format!("{}/mesh/config@{}", server.host(), artifact.manifest_digest);
    let err = client(RegistryOptions {
        allowed_registries: vec!["registry.example".into()],
        ..RegistryOptions::default()
    })
    .pull(&reference)
    .await
    .expect_err("not allowed");
    assert_eq!(err.category(), "RegistryNotAllowed");
    assert!(
        err.to_string().contains(&format!(
            "registry {} is not allowed: bundles may come only from registry.example",
            server.host()
        )),
        "{err}"
    );
    assert!(server.seen().is_empty(), "nothing was sent to it");
}

#[tokio::test]
async fn a_redirect_to_another_host_is_followed_without_credentials() {
    let artifact = bundle();
    let layer = artifact.layer.clone();
    // The storage host that the registry redirects blobs to.
    let storage = Server::start(Arc::new(move |_: &Seen| ok(layer.clone()))).await;
    let storage_host = storage.host();
    let registry = Server::start({
        let inner = bundle_handler(&artifact, move |req| {
            Reply::Full(
                307,
                vec![(
                    "Location".into(),
                    format!("http://{storage_host}/storage{}?sig=abc", req.path),
                )],
                vec![],
            )
        });
        Arc::new(move |req: &Seen| {
            if req.authorization.as_deref() != Some("Basic dXNlcjpzZWNyZXQ=") {
                Reply::Full(
                    401,
                    vec![("WWW-Authenticate".into(), "Basic realm=\"registry\"".into())],
                    vec![],
                )
            } else {
                inner(req)
            }
        })
    })
    .await;
    let reference = format!(
        "{}/mesh/config@{}",
        registry.host(),
        artifact.manifest_digest
    );
    let pulled = client(RegistryOptions {
        basic_auth: Some(("user".into(), "secret".into())),
        allowed_registries: vec!["127.0.0.1".into()],
        ..RegistryOptions::default()
    })
    .pull(&reference)
    .await
    .expect("pulled through the redirect");
    assert_eq!(pulled.content_digest(), artifact.content_digest());
    let at_storage = storage.seen();
    assert!(
        !at_storage.is_empty(),
        "the layer came from the storage host"
    );
    assert!(
        at_storage.iter().all(|s| s.authorization.is_none()),
        "credentials leaked to the storage host: {at_storage:?}"
    );
    assert!(
        registry
            .seen()
            .iter()
            .any(|s| s.authorization.as_deref() == Some("Basic dXNlcjpzZWNyZXQ=")),
        "the registry itself got the credentials"
    );
}

#[tokio::test]
async fn a_redirect_loop_ends_with_an_error() {
    let server = Server::start(Arc::new(|req: &Seen| {
        Reply::Full(302, vec![("Location".into(), req.path.clone())], vec![])
    }))
    .await;
    let err = client(RegistryOptions::default())
        .resolve(&format!("{}/mesh/config:v1", server.host()))
        .await
        .expect_err("a loop");
    assert!(
        err.to_string().contains(&format!(
            "more than {} redirects",
            sluice_bundle::fetch::MAX_REDIRECTS
        )),
        "{err}"
    );
    assert_eq!(server.seen().len(), sluice_bundle::fetch::MAX_REDIRECTS + 1);
}

#[tokio::test]
async fn a_token_realm_on_another_host_gets_no_credentials() {
    let artifact = bundle();
    // The token service answers anyone; it must never see the registry's credentials.
    let tokens = Server::start(Arc::new(|_: &Seen| {
        ok(br#"{"token":"issued-token"}"#.to_vec())
    }))
    .await;
    let realm = format!("http://localhost:{}/token", tokens.addr.port());
    let registry = Server::start({
        let layer = artifact.layer.clone();
        let inner = bundle_handler(&artifact, move |_| ok(layer.clone()));
        Arc::new(move |req: &Seen| {
            if req.authorization.as_deref() == Some("Bearer issued-token") {
                inner(req)
            } else {
                Reply::Full(
                    401,
                    vec![(
                        "WWW-Authenticate".into(),
                        format!("Bearer realm=\"{realm}\",service=\"registry\""),
                    )],
                    vec![],
                )
            }
        })
    })
    .await;
    let mut credentials = sluice_bundle::RegistryCredentials::none();
    credentials.insert(
        &registry.host(),
        sluice_bundle::Credential::Basic {
            username: "user".into(),
            password: "secret".into(),
        },
    );
    let reference = format!(
        "{}/mesh/config@{}",
        registry.host(),
        artifact.manifest_digest
    );
    let pulled = client(RegistryOptions {
        credentials,
        ..RegistryOptions::default()
    })
    .pull(&reference)
    .await
    .expect("pulled with the token");
    assert_eq!(pulled.content_digest(), artifact.content_digest());
    let at_tokens = tokens.seen();
    assert!(!at_tokens.is_empty(), "the token service was asked");
    assert!(
        at_tokens.iter().all(|s| s.authorization.is_none()),
        "credentials leaked to a token realm on another host: {at_tokens:?}"
    );
    assert!(
        registry.seen().iter().all(|s| s.authorization.is_none()
            || s.authorization.as_deref() == Some("Bearer issued-token")),
        "{:?}",
        registry.seen()
    );
}
