//! Production metrics sources sit behind TLS and authentication: Prometheus with its own web
//! config (TLS, basic auth), Thanos Query or Mimir behind a proxy that wants a bearer token and a
//! tenant header. The source the gates use must reach them with the configured credentials,
//! CA and headers, pick up rotated credentials without a restart, and say plainly what is wrong
//! when a credential or the CA is. Runs on real Prometheus (its `--web.config.file`) and on a TLS
//! reverse proxy made here; everything listens on 127.0.0.1 and stops with the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use sluice_analysis::source::{BasicAuth, MetricsSource, PrometheusConfig, PrometheusSource};
use sluice_testkit::control_plane::CertificateAuthority;
use sluice_testkit::prereq;
use sluice_testkit::prometheus::Prometheus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every scenario here finishes well within this.
const BUDGET: Duration = Duration::from_secs(90);

/// A Prometheus started with `--web.config.file` (TLS and basic auth); killed when dropped.
struct SecuredPrometheus {
    child: Child,
    url: String,
    web_config: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for SecuredPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prometheus' web config: TLS with `cert`/`key`, basic auth for `user` with `password`.
fn web_config(dir: &Path, user: &str, password: &str) -> String {
    let hash = bcrypt::hash(password, 4).expect("bcrypt");
    format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  {user}: {hash}\n",
        dir.join("server.crt").display(),
        dir.join("server.key").display()
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl SecuredPrometheus {
    /// Starts Prometheus serving TLS with a certificate of `ca` and requiring `user`/`password`.
    async fn start(
        binary: &Path,
        ca: &CertificateAuthority,
        user: &str,
        password: &str,
    ) -> SecuredPrometheus {
        let dir = tempfile::tempdir().unwrap();
        let server = ca.server(&["127.0.0.1"]).unwrap();
        std::fs::write(dir.path().join("server.crt"), &server.cert_pem).unwrap();
        std::fs::write(dir.path().join("server.key"), &server.key_pem).unwrap();
        let web_config_path = dir.path().join("web.yml");
        std::fs::write(&web_config_path, web_config(dir.path(), user, password)).unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            "global:\n  scrape_interval: 15s\nscrape_configs: []\n",
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!("--web.config.file={}", web_config_path.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let mut prometheus = SecuredPrometheus {
            child,
            url: format!("https://127.0.0.1:{port}"),
            web_config: web_config_path,
            _dir: dir,
        };
        // Ready when /-/ready answers over TLS with the credentials.
        let http = reqwest::Client::builder()
            .tls_certs_only(
                reqwest::Certificate::from_pem_bundle(ca.cert_pem().as_bytes()).unwrap(),
            )
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = prometheus.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(prometheus._dir.path().join("prometheus.log"))
                    .unwrap_or_default();
                panic!("prometheus exited with {status}:\n{log}");
            }
            let ready = http
                .get(format!("{}/-/ready", prometheus.url))
                .basic_auth(user, Some(password))
                .send()
                .await;
            if matches!(&ready, Ok(r) if r.status().is_success()) {
                return prometheus;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "TLS Prometheus never ready: {ready:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn config(url: &str) -> PrometheusConfig {
    let mut config = PrometheusConfig::new(url);
    config.retries = 0;
    config.timeout = Duration::from_secs(5);
    config
}

async fn one(source: &PrometheusSource) -> Result<f64, String> {
    source
        .query("vector(1)", Timestamp::now())
        .await
        .map(|series| series.iter().map(|s| s.value).sum())
        .map_err(|e| e.to_string())
}

fn prometheus_binary() -> Option<PathBuf> {
    match sluice_testkit::prometheus::binary() {
        Ok(path) => Some(path),
        Err(_) => {
            prereq::Missing::new("the `prometheus` binary", prereq::INSTALL_TOOLS).skip();
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_with_tls_and_basic_auth_answers_only_with_the_credentials_and_the_ca() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    tokio::time::timeout(BUDGET, async {
        // Given Prometheus serving TLS with a certificate of a private CA, requiring basic auth.
        let ca = CertificateAuthority::generate("sluice-test-metrics-ca").unwrap();
        let prometheus = SecuredPrometheus::start(&binary, &ca, "sluice", "first-password").await;
        let files = tempfile::tempdir().unwrap();
        let ca_file = files.path().join("ca.pem");
        std::fs::write(&ca_file, ca.cert_pem()).unwrap();
        let password_file = files.path().join("password");
        std::fs::write(&password_file, "first-password\n").unwrap();

        // Without credentials: refused, and the error says which settings to check.
        let mut anonymous = config(&prometheus.url);
        anonymous.ca_file = Some(ca_file.clone());
        let err = one(&PrometheusSource::new(anonymous.clone()))
            .await
            .unwrap_err();
        println!("without credentials: {err}");
        assert_eq!(
            err,
            format!(
                "query to {}/api/v1/query was rejected with HTTP 401 (unauthorized): Unauthorized; \
                 the provider refused the credentials: check the bearer token file, the basic auth \
                 username and password file, and the tenant header",
                prometheus.url
            )
        );

        // With them: answered.
        let mut authenticated = anonymous.clone();
        authenticated.basic_auth = Some(BasicAuth {
            username: "sluice".into(),
            password_file: password_file.clone(),
        });
        authenticated.check().expect("the settings are usable");
        let source = PrometheusSource::new(authenticated.clone());
        assert_eq!(one(&source).await, Ok(1.0));

        // The password rotates (Prometheus re-reads its web config per request; the Secret is
        // rewritten in place): the same source, not rebuilt, uses the new one.
        std::fs::write(
            &prometheus.web_config,
            web_config(prometheus._dir.path(), "sluice", "second-password"),
        )
        .unwrap();
        let err = one(&source).await.unwrap_err();
        assert!(err.contains("HTTP 401"), "{err}");
        std::fs::write(&password_file, "second-password\n").unwrap();
        assert_eq!(one(&source).await, Ok(1.0));

        // A CA that did not sign the server's certificate (and no CA file: system roots only)
        // is refused, and the error names the CA file setting.
        let other_ca = CertificateAuthority::generate("some-other-ca").unwrap();
        let other_ca_file = files.path().join("other-ca.pem");
        std::fs::write(&other_ca_file, other_ca.cert_pem()).unwrap();
        for ca_file in [Some(other_ca_file), None] {
            let mut wrong_ca = authenticated.clone();
            wrong_ca.ca_file = ca_file.clone();
            let err = one(&PrometheusSource::new(wrong_ca)).await.unwrap_err();
            println!("CA file {ca_file:?}: {err}");
            assert!(
                err.starts_with(&format!(
                    "query to {}/api/v1/query failed after 1 attempts:",
                    prometheus.url
                )),
                "{ca_file:?}: {err}"
            );
            assert!(
                err.contains("invalid peer certificate: UnknownIssuer"),
                "{ca_file:?}: {err}"
            );
            assert!(
                err.contains(
                    "the provider's TLS certificate is not trusted: give the CA that signed it as \
                     the CA file, --prometheus-ca-file"
                ),
                "{ca_file:?}: {err}"
            );
        }
    })
    .await
    .expect("within the time budget");
}

/// What the proxy requires of a request.
#[derive(Clone)]
struct Required {
    token: Arc<Mutex<String>>,
    tenant: String,
}

/// A TLS reverse proxy on 127.0.0.1 in front of `upstream` (plain HTTP) that answers 401 unless
/// the request carries `Authorization: Bearer <required token>` and `X-Scope-OrgID: <tenant>`,
/// as an authenticating proxy in front of Thanos Query or Mimir does. Stops with the runtime.
async fn token_proxy(ca: &CertificateAuthority, upstream: String, required: Required) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let server = ca.server(&["127.0.0.1"]).unwrap();
    let certs = vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, http, upstream, required) = (
                acceptor.clone(),
                http.clone(),
                upstream.clone(),
                required.clone(),
            );
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let Some((head, body)) = read_request(&mut stream).await else {
                    return;
                };
                let mut lines = head.lines();
                let path = lines
                    .next()
                    .and_then(|l| l.split(' ').nth(1))
                    .unwrap_or("/")
                    .to_string();
                let headers: Vec<(String, String)> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .collect();
                let header = |name: &str| {
                    headers
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                };
                let expected = format!("Bearer {}", required.token.lock().unwrap());
                let (status, answer) = if header("authorization") != Some(expected) {
                    (401, b"missing or wrong bearer token\n".to_vec())
                } else if header("x-scope-orgid").as_deref() != Some(required.tenant.as_str()) {
                    (401, b"no tenant id\n".to_vec())
                } else {
                    let response = http
                        .post(format!("{upstream}{path}"))
                        .header("content-type", header("content-type").unwrap_or_default())
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    (
                        response.status().as_u16(),
                        response.bytes().await.unwrap().to_vec(),
                    )
                };
                let head = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    answer.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    url
}

/// Reads one HTTP/1.1 request: its head and its body (by Content-Length).
async fn read_request(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            })
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return Some((head, buf[end + 4..end + 4 + length].to_vec()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_and_tenant_header_reach_a_proxy_that_requires_them() {
    let Some(prometheus) = Prometheus::start_or_skip().await else {
        return;
    };
    tokio::time::timeout(BUDGET, async {
        // Given Prometheus behind a TLS proxy (private CA) requiring a token and a tenant.
        let ca = CertificateAuthority::generate("sluice-test-proxy-ca").unwrap();
        let required = Required {
            token: Arc::new(Mutex::new("token-1".into())),
            tenant: "tenant-a".into(),
        };
        let url = token_proxy(&ca, prometheus.url().to_string(), required.clone()).await;
        let files = tempfile::tempdir().unwrap();
        let ca_file = files.path().join("ca.pem");
        std::fs::write(&ca_file, ca.cert_pem()).unwrap();
        let token_file = files.path().join("token");
        std::fs::write(&token_file, "token-1\n").unwrap();

        let mut settings = config(&url);
        settings.ca_file = Some(ca_file);
        settings.bearer_token_file = Some(token_file.clone());
        settings.headers = vec![("X-Scope-OrgID".into(), "tenant-a".into())];
        let source = PrometheusSource::new(settings.clone());

        // With the token and the header: answered, through the proxy, from Prometheus.
        assert_eq!(one(&source).await, Ok(1.0));

        // Without the tenant header: refused.
        let mut no_tenant = settings.clone();
        no_tenant.headers.clear();
        let err = one(&PrometheusSource::new(no_tenant)).await.unwrap_err();
        assert!(
            err.contains("rejected with HTTP 401 (unauthorized): no tenant id; the provider refused the credentials"),
            "{err}"
        );

        // The token rotates: the proxy wants the new one before the file holds it (refused),
        // then the projected token file is rewritten and the same source uses it.
        *required.token.lock().unwrap() = "token-2".into();
        let err = one(&source).await.unwrap_err();
        assert!(
            err.contains("HTTP 401 (unauthorized): missing or wrong bearer token"),
            "{err}"
        );
        std::fs::write(&token_file, "token-2\n").unwrap();
        assert_eq!(one(&source).await, Ok(1.0));

        // The token file disappears: a clear error, nothing sent.
        std::fs::remove_file(&token_file).unwrap();
        let err = one(&source).await.unwrap_err();
        assert!(
            err.starts_with(&format!(
                "the metrics source {url} cannot be used: bearer token file {}: No such file",
                token_file.display()
            )),
            "{err}"
        );
    })
    .await
    .expect("within the time budget");
}
