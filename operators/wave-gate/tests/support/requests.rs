//! Counting the API requests wave-gate's reconcile sends: a client whose every request passes a
//! counting layer (method, resource, and whether it is a watch), over the API emulator with a
//! site of `clusters × apps` Argo CD Applications owned by one ApplicationSet and a WaveGate
//! governing them. Shared by the cache test and the `reconcile_requests` example.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use kube::{Api, Client, api::PostParams, client::ClientBuilder};
use sluice_api::{
    external::argocd::{Application, ApplicationSet},
    v1alpha1::WaveGate,
};

/// Requests seen, by `METHOD resource` (`WATCH` for a watch, `LIST` for a collection GET).
#[derive(Clone, Debug, Default)]
pub struct Counts(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counts {
    /// A copy of the counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap().clone()
    }

    /// Forgets every count.
    pub fn reset(&self) {
        self.0.lock().unwrap().clear();
    }

    fn add(&self, key: String) {
        *self.0.lock().unwrap().entry(key).or_default() += 1;
    }
}

/// The kind of request: `GET`, `LIST`, `WATCH`, `POST`, `PATCH`, … with the resource (and
/// subresource) it names.
fn classify<B>(req: &http::Request<B>) -> String {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or_default();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/namespaces/{ns}/{resource}[/{name}[/{sub}]] or /apis/{g}/{v}/namespaces/…
    let rest: &[&str] = match parts.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        other => other,
    };
    let rest = match rest {
        ["namespaces", _, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (resource, named, sub) = match rest {
        [r] => (*r, false, None),
        [r, _] => (*r, true, None),
        [r, _, s, ..] => (*r, true, Some(*s)),
        _ => ("?", false, None),
    };
    let method = req.method().as_str();
    let verb = match (method, named) {
        ("GET", false) if query.contains("watch=true") || query.contains("watch=1") => "WATCH",
        ("GET", false) => "LIST",
        (m, _) => m,
    };
    match sub {
        Some(s) => format!("{verb} {resource}/{s}"),
        None => format!("{verb} {resource}"),
    }
}

/// The counting layer.
#[derive(Clone)]
pub struct CountLayer(pub Counts);

impl<S> tower::Layer<S> for CountLayer {
    type Service = CountService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CountService {
            inner,
            counts: self.0.clone(),
        }
    }
}

/// A service counting each request before passing it on.
#[derive(Clone)]
pub struct CountService<S> {
    inner: S,
    counts: Counts,
}

impl<S, B> tower::Service<http::Request<B>> for CountService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.counts.add(classify(&req));
        self.inner.call(req)
    }
}

/// A client of `emu` whose requests are counted in `counts`.
pub fn counting_client(emu: &kube_emulator::Emulator, counts: &Counts) -> Client {
    ClientBuilder::try_from(emu.client_config())
        .expect("a client for the emulator")
        .with_layer(&CountLayer(counts.clone()))
        .build()
}

/// The Argo CD namespace of the site.
pub const NS: &str = "argocd";

/// Cluster `i`'s name.
pub fn cluster(i: usize) -> String {
    format!("c{i:02}")
}

/// Installs the CRDs (WaveGate, BundlePin, Argo CD's Application and ApplicationSet from
/// `argocd`), then a site: an ApplicationSet `mesh-site` reading WaveGate `site`, and `apps`
/// Applications per cluster for `clusters` clusters, Synced and Healthy at `at`. Returns the
/// WaveGate, created with two waves (the first cluster, then the rest).
pub async fn site(
    emu: &kube_emulator::Emulator,
    argocd: &Path,
    clusters: usize,
    apps: usize,
    at: &str,
) -> WaveGate {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for f in [
        root.join("crds/wavegates.sluice.dev.yaml"),
        root.join("crds/bundlepins.sluice.dev.yaml"),
        argocd.join("application-crd.yaml"),
        argocd.join("applicationset-crd.yaml"),
    ] {
        emu.load_manifest_file(&f)
            .unwrap_or_else(|e| panic!("loading {}: {e}", f.display()));
    }
    let client = emu.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap(),
        )
        .await
        .expect("namespace created");
    let sets: Api<ApplicationSet> = Api::namespaced(client.clone(), NS);
    let set: ApplicationSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": "mesh-site", "namespace": NS},
        "spec": {
            "goTemplate": true,
            "generators": [{"clusterDecisionResource": {"configMapRef": "sluice-wavegates", "name": "site", "requeueAfterSeconds": 30}}],
            "template": {
                "metadata": {"name": "mesh-{{.clusterName}}"},
                "spec": {"project": "mesh", "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": "{{.revision}}", "path": "."}, "destination": {"name": "{{.clusterName}}", "namespace": "istio-config"}}
            },
            "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
            "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}],
        }
    }))
    .unwrap();
    let uid = sets
        .create(&PostParams::default(), &set)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let api: Api<Application> = Api::namespaced(client.clone(), NS);
    for c in 0..clusters {
        for a in 0..apps {
            let app: Application = serde_json::from_value(serde_json::json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application",
                "metadata": {"name": format!("mesh-{}-{a:03}", cluster(c)), "namespace": NS, "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "mesh-site", "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"project": "mesh", "source": {"repoURL": "oci://registry.local:5000/mesh/config", "targetRevision": at, "path": "."}, "destination": {"name": cluster(c), "namespace": "istio-config"}},
                "status": {"sync": {"status": "Synced", "revision": at}, "health": {"status": "Healthy"}},
            }))
            .unwrap();
            api.create(&PostParams::default(), &app).await.unwrap();
        }
    }
    let rest: Vec<String> = (1..clusters).map(cluster).collect();
    let wg: WaveGate = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "WaveGate",
        "metadata": {"name": "site", "namespace": NS},
        "spec": {
            "site": "site",
            "applicationSetRef": {"name": "mesh-site"},
            "repository": "oci://registry.local:5000/mesh/config",
            "revision": at,
            "sourceCommit": &at[7..19],
            "waves": [{"name": "canary", "clusters": [cluster(0)]}, {"name": "rest", "clusters": rest}],
            "analysisInterval": "1s",
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "cosign-keys"}},
        },
    }))
    .unwrap();
    Api::<WaveGate>::namespaced(client, NS)
        .create(&PostParams::default(), &wg)
        .await
        .expect("the API server accepts the WaveGate")
}
