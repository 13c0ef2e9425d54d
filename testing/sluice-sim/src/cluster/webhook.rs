//! Istio's sidecar injector as a real mutating admission webhook, for a real API server where the
//! real workload controllers create pods: served over TLS on 127.0.0.1 and registered by
//! `url: https://127.0.0.1:PORT/inject` (a Service reference would dial a cluster IP that does not
//! exist here), it decides and applies injection with [`super::injection`] as the simulator's own
//! workload controllers do, answers with a JSON patch, and counts one SVID per injected pod.
//! Never fails a pod's creation: an error is answered "allowed, unchanged" and the configuration
//! says `failurePolicy: Ignore`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use sluice_testkit::control_plane::CertificateAuthority;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::SvidCounter;
use super::injection::{self, Decision, Webhooks};

/// Name of the MutatingWebhookConfiguration the injector registers.
pub const CONFIGURATION: &str = "sluice-sim-sidecar-injector";

/// Errors starting the webhook.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Binding, certificates or TLS setup failed.
    #[error("starting the injector webhook failed: {0}")]
    Setup(String),
    /// Registering the configuration failed.
    #[error(
        "registering the injector webhook failed: {0}; the identity must be allowed to write MutatingWebhookConfigurations"
    )]
    Register(#[from] kube::Error),
}

/// A running injector webhook; stops serving when dropped (its configuration stays registered,
/// with `failurePolicy: Ignore`, so pods are still created).
#[derive(Debug)]
pub struct InjectorWebhook {
    url: String,
    handle: JoinHandle<()>,
}

impl Drop for InjectorWebhook {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

struct Ctx {
    client: Client,
    svid: SvidCounter,
}

/// Accepts TCP connections and completes the TLS handshake before handing them to axum.
struct TlsListener {
    tcp: TcpListener,
    tls: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.tls.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

impl InjectorWebhook {
    /// Serves the injector on a free loopback port with a certificate from `ca`, and registers
    /// it for pod creation in every namespace (the injection decision is the injector's own, from
    /// namespace and pod labels and the revision-tag webhooks). Injected pods are counted on
    /// `svid`.
    pub async fn start(
        client: Client,
        ca: &CertificateAuthority,
        svid: SvidCounter,
    ) -> Result<Self, WebhookError> {
        let setup = |e: &dyn std::fmt::Display| WebhookError::Setup(e.to_string());
        let cert = ca
            .server(&["127.0.0.1", "localhost"])
            .map_err(|e| setup(&e))?;
        let chain =
            vec![CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).map_err(|e| setup(&e))?];
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).map_err(|e| setup(&e))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| setup(&e))?;
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| setup(&e))?;
        let port = tcp.local_addr().map_err(|e| setup(&e))?.port();
        let listener = TlsListener {
            tcp,
            tls: TlsAcceptor::from(Arc::new(config)),
        };
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            svid,
        });
        let app = axum::Router::new()
            .route("/inject", post(review))
            .with_state(ctx);
        let handle = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let url = format!("https://127.0.0.1:{port}/inject");
        let b64 = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
        let configuration = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [{
                "name": "sidecar-injector.sluice-sim.invalid",
                "clientConfig": {"url": url, "caBundle": b64},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                "failurePolicy": "Ignore",
                "sideEffects": "NoneOnDryRun",
                "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 10
            }]
        });
        Api::<MutatingWebhookConfiguration>::all(client)
            .patch(
                CONFIGURATION,
                &PatchParams::apply("sluice-sim").force(),
                &Patch::Apply(&configuration),
            )
            .await?;
        Ok(Self { url, handle })
    }

    /// The URL the API server calls.
    pub fn url(&self) -> &str {
        &self.url
    }
}

async fn review(State(ctx): State<Arc<Ctx>>, Json(review): Json<Value>) -> Json<Value> {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let response = match mutation(&ctx, request).await {
        Some(patch) => {
            let patch = serde_json::to_vec(&patch).unwrap_or_default();
            json!({
                "uid": uid, "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch),
            })
        }
        None => json!({"uid": uid, "allowed": true}),
    };
    Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// The JSON patch injecting the pod of `request`, or `None` when it is not injected.
async fn mutation(ctx: &Ctx, request: &Value) -> Option<Value> {
    let original = request["object"].clone();
    let mut pod: Pod = serde_json::from_value(original.clone()).ok()?;
    let ns = request["namespace"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| pod.namespace())?;
    let ns_labels = Api::<Namespace>::all(ctx.client.clone())
        .get_opt(&ns)
        .await
        .ok()
        .flatten()
        .map(|n| n.labels().clone())
        .unwrap_or_default();
    let mwcs = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .ok()?;
    let webhooks = Webhooks::from_configurations(&mwcs.items);
    let empty = BTreeMap::new();
    let decision = injection::decide(
        &ns_labels,
        pod.metadata.labels.as_ref().unwrap_or(&empty),
        pod.metadata.annotations.as_ref().unwrap_or(&empty),
        &webhooks,
    );
    let Decision::Inject(revision) = decision else {
        return None;
    };
    injection::inject(&mut pod, &revision);
    let injected = serde_json::to_value(&pod).ok()?;
    let patch = json_patch::diff(&original, &injected);
    if request["dryRun"] != json!(true) {
        ctx.svid.issue_by(&revision);
    }
    serde_json::to_value(patch).ok()
}
