//! The local world for revert's end-to-end tests: a management emulator (BundlePin and Argo CD
//! CRDs), a workload-cluster emulator with RBAC on (HTTPRoute CRD, revert's least-privilege
//! role), the real registry, a git intent repository, and a small stand-in for Argo CD's
//! application controller (until the simulated Argo CD lands) that syncs one OCI-sourced
//! Application the way Argo CD does: compare target against live on every resync, sync only
//! when automated sync is on, terminate a running sync on request.
//!
//! A local HTTP stand-in for the Forgejo/Gitea pulls API records the pull requests revert opens
//! (no forge server is available to the tests).
//!
//! Without the released CRDs (`.tools/crds`), `docker-registry` or `git` a test fails under CI
//! and is skipped and counted otherwise (`sluice_testkit::prereq`).
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde_json::{Value, json};
use sluice_api::{
    external::argocd::Application,
    v1alpha1::{BundlePin, BundlePinPhase},
};
use sluice_bundle::{
    Artifact, BundleClient, ManifestFile, Manifests, Metadata, RegistryOptions, SigningKey, render,
};
use sluice_gitops::{ForgeConfig, GitConfig};
use sluice_revert::{
    OPERATOR, controller, metrics,
    reconcile::{self, Settings},
};
use sluice_runtime::{events::EventRecorder, leader::Leadership, operator::Hooks};
use sluice_testkit::mesh_config::checkout_route;
use sluice_testkit::{git::GitRepo, registry::Registry};
use tokio_util::sync::CancellationToken;

pub const ARGOCD: &str = "argocd";
pub const SYSTEM: &str = "sluice-system";
pub const SHOP: &str = "shop";
pub const APP: &str = "mesh-c1";
pub const CLUSTER: &str = "c1";

/// A route with the canary weight `canary`.
pub fn route(name: &str, canary: u32) -> String {
    checkout_route(SHOP, name, canary)
}

pub use sluice_testkit::mesh_config::http_route_resource as route_resource;

/// The released Gateway API and Argo CD CRDs (`.tools/crds`); skips (or, under CI, fails)
/// naming what is missing.
pub fn upstream() -> Option<std::path::PathBuf> {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
}

/// A pushed bundle.
#[derive(Clone, Debug)]
pub struct Pushed {
    pub digest: String,
    pub content: String,
}

pub struct World {
    pub registry: Registry,
    pub git: GitRepo,
    pub mgmt: kube_emulator::Emulator,
    pub workload: kube_emulator::Emulator,
    pub mgmt_client: Client,
    pub workload_admin: Client,
    pub revert_token: String,
    pub signer: SigningKey,
    pub bundles: Arc<BundleClient>,
    pub repo: String,
    pub argo_stop: CancellationToken,
    pub controller: Option<tokio::task::JoinHandle<()>>,
    pub controller_stop: CancellationToken,
    pub forge: Forge,
    /// revert's `--allowed-kinds` (`None`: the default mesh kinds).
    pub platform_kinds: Option<Vec<sluice_api::v1alpha1::bundle_pin::GroupKind>>,
    /// revert's `--namespace` as the one namespace it patches Applications in (`None`: every
    /// namespace).
    pub application_namespace: Option<String>,
    /// revert's registry options (a private registry's TLS host and CA).
    pub registry_options: RegistryOptions,
    /// revert's `--registry-credentials-secret` (in [`SYSTEM`]), for a private registry.
    pub registry_credentials: Option<String>,
    /// revert's `--registry-ca-configmap` (in [`SYSTEM`]), for a private registry: its `ca.crt`
    /// is the fixture's CA.
    pub registry_ca_config_map: Option<String>,
    /// revert's `--trusted-root`: the sigstore `trusted_root.json` keyless signatures are judged
    /// against, as the chart mounts `revert.trustedRoot` (`None`: keyless signatures refused).
    pub trusted_root: Option<std::path::PathBuf>,
}

/// The Docker config Secret a private-registry world gives revert.
pub const REGISTRY_SECRET: &str = "registry-credentials";
/// The CA ConfigMap a private-registry world gives revert.
pub const REGISTRY_CA: &str = "registry-ca";

/// A Docker config with `password` for `registry`'s fixture user.
pub fn docker_config(registry: &Registry, password: &str) -> String {
    json!({"auths": {registry.host(): {
        "username": sluice_testkit::registry::USERNAME,
        "password": password,
    }}})
    .to_string()
}

/// Token the forge stand-in accepts.
pub const FORGE_TOKEN: &str = "forge-token";

/// What the forge stand-in saw.
#[derive(Debug, Default)]
pub struct ForgeState {
    /// Pull requests opened, as the forge returns them.
    pub pulls: Vec<Value>,
    /// POSTs to the pulls endpoint (a duplicate is answered 409, as Forgejo does).
    pub creates: usize,
    /// How long the answer to a POST is held after the pull request is recorded.
    pub answer_delay: Duration,
}

/// The forge stand-in: its base URL and what it saw.
#[derive(Clone)]
pub struct Forge {
    pub url: String,
    pub state: Arc<Mutex<ForgeState>>,
}

impl Forge {
    async fn start() -> Forge {
        use axum::{
            Json, Router,
            extract::{Path, State},
            http::{HeaderMap, StatusCode},
            routing::get,
        };
        type Shared = Arc<Mutex<ForgeState>>;
        fn authorized(headers: &HeaderMap) -> bool {
            headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some(&format!("token {FORGE_TOKEN}"))
        }
        async fn list(
            State(s): State<Shared>,
            headers: HeaderMap,
        ) -> Result<Json<Value>, StatusCode> {
            if !authorized(&headers) {
                return Err(StatusCode::UNAUTHORIZED);
            }
            Ok(Json(Value::Array(s.lock().unwrap().pulls.clone())))
        }
        async fn create(
            State(s): State<Shared>,
            Path((owner, repo)): Path<(String, String)>,
            headers: HeaderMap,
            Json(body): Json<Value>,
        ) -> (StatusCode, Json<Value>) {
            if !authorized(&headers) {
                return (StatusCode::UNAUTHORIZED, Json(json!({"message": "token"})));
            }
            let recorded = {
                let mut f = s.lock().unwrap();
                f.creates += 1;
                if f.pulls
                    .iter()
                    .any(|p| p["head"]["ref"] == body["head"] && p["base"]["ref"] == body["base"])
                {
                    None
                } else {
                    let number = f.pulls.len() as u64 + 1;
                    let pull = json!({
                        "number": number,
                        "html_url": format!("http://forge.invalid/{owner}/{repo}/pulls/{number}"),
                        "title": body["title"],
                        "body": body["body"],
                        "state": "open",
                        "head": {"ref": body["head"]},
                        "base": {"ref": body["base"]},
                    });
                    f.pulls.push(pull.clone());
                    Some((pull, f.answer_delay))
                }
            };
            let Some((pull, delay)) = recorded else {
                return (
                    StatusCode::CONFLICT,
                    Json(json!({"message": "pull request already exists for these targets"})),
                );
            };
            tokio::time::sleep(delay).await;
            (StatusCode::CREATED, Json(pull))
        }
        let state: Shared = Arc::default();
        let app = Router::new()
            .route("/api/v1/repos/{owner}/{repo}/pulls", get(list).post(create))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Forge {
            url: format!("http://{addr}"),
            state,
        }
    }

    /// Pull requests opened so far.
    pub fn pulls(&self) -> Vec<Value> {
        self.state.lock().unwrap().pulls.clone()
    }

    /// POSTs seen so far.
    pub fn creates(&self) -> usize {
        self.state.lock().unwrap().creates
    }

    /// Holds the answer to each POST this long (the pull request exists meanwhile).
    pub fn delay_answers(&self, delay: Duration) {
        self.state.lock().unwrap().answer_delay = delay;
    }
}

fn files(objects: &[String]) -> Manifests {
    Manifests::from_files(
        objects
            .iter()
            .enumerate()
            .map(|(i, text)| ManifestFile {
                path: format!("{i:04}.yaml"),
                contents: text.as_bytes().to_vec(),
            })
            .collect(),
    )
    .expect("valid manifests")
}

/// A Secret with `data` (what the API server stores).
pub use sluice_testkit::secrets::secret;

async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    let _ = api.create(&PostParams::default(), &ns).await;
}

impl World {
    pub async fn start() -> Option<World> {
        Self::start_with(None).await
    }

    /// A world whose registry is private: HTTPS from the fixture's CA and `auth`; revert reads
    /// its credentials from the Docker config Secret [`REGISTRY_SECRET`] (created with the right
    /// password) and the CA from the ConfigMap [`REGISTRY_CA`], as the chart configures it.
    pub async fn start_private(auth: sluice_testkit::registry::Auth) -> Option<World> {
        Self::start_with(Some(auth)).await
    }

    async fn start_with(auth: Option<sluice_testkit::registry::Auth>) -> Option<World> {
        // RUST_LOG=sluice_revert=info shows the operator's log lines (pin_ms, audit).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let upstream = upstream()?;
        let registry = match auth {
            Some(auth) => Registry::start_secure_or_skip(auth).await?,
            None => Registry::start_or_skip().await?,
        };
        let test_registry_options = match registry.ca_pem() {
            Some(ca) => RegistryOptions {
                tls_hosts: vec![registry.host()],
                ca_bundle: Some(
                    sluice_bundle::CaBundle::from_pem(ca.as_bytes(), "fixture CA").unwrap(),
                ),
                ..RegistryOptions::default()
            },
            None => RegistryOptions::default(),
        };
        sluice_testkit::prereq::require_binary("git")?;
        let git = GitRepo::new().expect("a git repository for the intent");
        let mgmt = sluice_testkit::crds::emulator_with([
            sluice_testkit::crds::sluice_crd("bundlepins.sluice.dev.yaml"),
            upstream.join("argo-cd-v3.5.1/application-crd.yaml"),
            upstream.join("argo-cd-v3.5.1/applicationset-crd.yaml"),
        ])
        .await;
        let workload = kube_emulator::Emulator::start_with(kube_emulator::Options {
            rbac: true,
            ..Default::default()
        })
        .await
        .expect("workload emulator");
        workload
            .load_manifest_file(
                upstream.join("gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml"),
            )
            .expect("HTTPRoute CRD");
        workload
            .load_yaml(&sluice_testkit::rbac::revert_target())
            .expect("revert's role");
        let mgmt_client = mgmt.client();
        let workload_admin = workload.client_with_token(kube_emulator::ADMIN_TOKEN);
        for ns in [ARGOCD, SYSTEM] {
            ensure_namespace(&mgmt_client, ns).await;
        }
        ensure_namespace(&workload_admin, SHOP).await;
        let revert_token = workload.service_account_token(SYSTEM, "sluice-revert-target");

        // revert's own identity for the workload cluster, and an Argo CD cluster Secret for the
        // same cluster that revert must never use (it holds the administrator's token).
        let secrets: Api<Secret> = Api::namespaced(mgmt_client.clone(), SYSTEM);
        let identity = secret(
            "revert-c1",
            &[("sluice.dev/revert-cluster", "true")],
            &[
                ("name", CLUSTER),
                ("server", &workload.base_url()),
                ("token", &revert_token),
            ],
        );
        secrets
            .create(&PostParams::default(), &identity)
            .await
            .unwrap();
        let argo_secrets: Api<Secret> = Api::namespaced(mgmt_client.clone(), ARGOCD);
        let argo_cluster = secret(
            "cluster-c1",
            &[("argocd.argoproj.io/secret-type", "cluster")],
            &[
                ("name", CLUSTER),
                ("server", &workload.base_url()),
                (
                    "config",
                    &json!({"bearerToken": kube_emulator::ADMIN_TOKEN}).to_string(),
                ),
            ],
        );
        argo_secrets
            .create(&PostParams::default(), &argo_cluster)
            .await
            .unwrap();

        let signer = SigningKey::generate().unwrap();
        let keys = secret("cosign", &[], &[("cosign.pub", signer.public_key().pem())]);
        argo_secrets
            .create(&PostParams::default(), &keys)
            .await
            .unwrap();
        let repo = registry.repository("mesh/config");
        let forge = Forge::start().await;
        // The tests' own client (pushes, the Argo CD stand-in) holds the right credentials.
        let mut test_options = test_registry_options.clone();
        // revert gets the TLS host, and its CA from the ConfigMap below.
        let registry_options = RegistryOptions {
            ca_bundle: None,
            ..test_registry_options
        };
        let registry_credentials = if auth.is_some() {
            let config = docker_config(&registry, sluice_testkit::registry::PASSWORD);
            test_options.credentials =
                sluice_bundle::RegistryCredentials::from_docker_config(config.as_bytes(), "test")
                    .unwrap();
            let mut docker = secret(REGISTRY_SECRET, &[], &[(".dockerconfigjson", &config)]);
            docker.type_ = Some("kubernetes.io/dockerconfigjson".into());
            secrets
                .create(&PostParams::default(), &docker)
                .await
                .unwrap();
            Some(REGISTRY_SECRET.to_owned())
        } else {
            None
        };
        // revert trusts the CA through its ConfigMap, not through options.
        let registry_ca_config_map = match registry.ca_pem() {
            Some(ca) => {
                let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
                    Api::namespaced(mgmt_client.clone(), SYSTEM);
                let map = serde_json::from_value(
                    json!({"metadata": {"name": REGISTRY_CA}, "data": {"ca.crt": ca}}),
                )
                .unwrap();
                maps.create(&PostParams::default(), &map).await.unwrap();
                Some(REGISTRY_CA.to_owned())
            }
            None => None,
        };
        Some(World {
            registry,
            git,
            mgmt,
            workload,
            mgmt_client,
            workload_admin,
            revert_token,
            signer,
            bundles: Arc::new(BundleClient::new(test_options)),
            repo,
            argo_stop: CancellationToken::new(),
            controller: None,
            controller_stop: CancellationToken::new(),
            forge,
            platform_kinds: None,
            application_namespace: None,
            registry_options,
            registry_credentials,
            registry_ca_config_map,
            trusted_root: None,
        })
    }

    /// Renders, pushes and (when `signer` is given) signs a bundle of `objects`.
    pub async fn bundle(
        &self,
        objects: &[String],
        commit: &str,
        signer: Option<&SigningKey>,
    ) -> (Pushed, Artifact) {
        let artifact = render(
            &files(objects),
            &Metadata {
                source_commit: Some(commit.into()),
                ..Metadata::default()
            },
        )
        .unwrap();
        let pushed = self.bundles.push(&artifact, &self.repo).await.unwrap();
        if let Some(key) = signer {
            self.bundles.sign(&pushed.reference, key).await.unwrap();
        }
        (
            Pushed {
                digest: pushed.manifest_digest.clone(),
                content: pushed.content_digest.clone(),
            },
            artifact,
        )
    }

    /// Creates the Application at `revision`, automated (prune, selfHeal), and waits until the
    /// stand-in Argo CD synced it.
    pub async fn application(&self, name: &str, revision: &str, extra: Value) -> Application {
        let api: Api<Application> = Api::namespaced(self.mgmt_client.clone(), ARGOCD);
        let mut body = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": ARGOCD},
            "spec": {
                "project": "default",
                "source": {"repoURL": format!("oci://{}", self.repo), "targetRevision": revision, "path": "."},
                "destination": {"name": CLUSTER, "namespace": SHOP},
                "syncPolicy": original_policy(),
            }
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let app: Application = serde_json::from_value(body).unwrap();
        api.create(&PostParams::default(), &app).await.unwrap()
    }

    /// Starts the stand-in Argo CD application controller for Application `name`.
    pub fn argo(&self, name: &str) {
        let ctx = FakeArgo {
            mgmt: self.mgmt_client.clone(),
            workload: self.workload_admin.clone(),
            bundles: self.bundles.clone(),
            cache: Arc::default(),
            name: name.to_owned(),
        };
        let stop = self.argo_stop.clone();
        tokio::spawn(async move {
            loop {
                if stop.is_cancelled() {
                    return;
                }
                ctx.tick().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }

    /// Starts revert in-process (BundlePins woken by their Applications, as the binary runs).
    pub fn start_revert(&mut self) {
        let client = self.mgmt_client.clone();
        let ctx = Arc::new(
            reconcile::Context::new(
                client.clone(),
                EventRecorder::new(client.clone(), OPERATOR),
                Settings {
                    cluster_namespace: SYSTEM.into(),
                    registry: self.registry_options.clone(),
                    registry_credentials: self
                        .registry_credentials
                        .clone()
                        .map(|name| (SYSTEM.to_owned(), name)),
                    registry_ca_config_map: self
                        .registry_ca_config_map
                        .clone()
                        .map(|name| (SYSTEM.to_owned(), name)),
                    git: Some(GitConfig {
                        url: self.git.url(),
                        token: None,
                        author_name: "sluice-revert".into(),
                        author_email: "sluice-revert@example.invalid".into(),
                    }),
                    forge: Some(ForgeConfig {
                        base_url: self.forge.url.clone(),
                        owner: "platform".into(),
                        repo: "mesh".into(),
                        token: FORGE_TOKEN.into(),
                        timeout: Some(Duration::from_secs(5)),
                    }),
                    allowed_kinds: self.platform_kinds.clone(),
                    // Refusals of unsigned bundles within the tests' budgets.
                    signature_grace: Some(Duration::from_secs(1)),
                    verified_cache_bytes: None,
                    application_namespace: self.application_namespace.clone(),
                    trusted_root: self.trusted_root.clone(),
                },
                metrics::register(&mut Default::default()),
            )
            .unwrap(),
        );
        let (hooks, _registry) = Hooks::standalone();
        self.controller_stop = CancellationToken::new();
        self.controller = Some(tokio::spawn(controller::drive(
            Api::<BundlePin>::all(client.clone()),
            Api::<Application>::all(client),
            watcher::Config::default(),
            ctx,
            Leadership::always(),
            self.controller_stop.clone(),
            hooks,
        )));
    }

    /// Kills revert mid-flight (drops its futures, as a killed process would).
    pub fn kill_revert(&mut self) {
        if let Some(h) = self.controller.take() {
            h.abort();
        }
    }

    /// Waits up to `budget` for pin `pin` to reach phase `want`, and returns it; the timeout
    /// shows its last status.
    pub async fn phase_is(&self, pin: &str, want: BundlePinPhase, budget: Duration) -> BundlePin {
        sluice_testkit::eventually::eventually_every(
            &format!("{pin} {want:?}"),
            budget,
            POLL,
            async || {
                let p = self.pins().get(pin).await.unwrap();
                if p.status.as_ref().is_some_and(|s| s.phase == want) {
                    Ok(p)
                } else {
                    Err(format!("status: {:#?}", p.status))
                }
            },
        )
        .await
    }

    /// Points Application [`APP`] at `digest` (its target revision), as a Git change does.
    pub async fn point_at(&self, digest: &str) {
        self.apps()
            .patch(
                APP,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"source": {"targetRevision": digest}}})),
            )
            .await
            .unwrap();
    }

    pub fn pins(&self) -> Api<BundlePin> {
        Api::namespaced(self.mgmt_client.clone(), ARGOCD)
    }

    pub fn apps(&self) -> Api<Application> {
        Api::namespaced(self.mgmt_client.clone(), ARGOCD)
    }

    pub fn routes(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.workload_admin.clone(), SHOP, &route_resource())
    }

    /// The canary weight of route `name`, `None` when absent.
    pub async fn canary_weight(&self, name: &str) -> Option<u64> {
        let r = self.routes().get_opt(name).await.unwrap()?;
        r.data["spec"]["rules"][0]["backendRefs"][1]["weight"].as_u64()
    }

    /// Managers of route `name`'s managedFields.
    pub async fn managers(&self, name: &str) -> Vec<String> {
        let Some(r) = self.routes().get_opt(name).await.unwrap() else {
            return vec![];
        };
        r.metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect()
    }

    pub async fn create_pin(&self, name: &str, digest: &str, extra: Value) -> BundlePin {
        let mut body = json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "BundlePin",
            "metadata": {"name": name, "namespace": ARGOCD},
            "spec": {
                "targets": [{"name": APP}],
                "bundle": {"repository": format!("oci://{}", self.repo), "digest": digest},
                "publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]},
                "reason": "5xx after change 42",
            }
        });
        for (k, v) in extra.as_object().unwrap() {
            body["spec"][k] = v.clone();
        }
        let pin: BundlePin = serde_json::from_value(body).unwrap();
        self.pins()
            .create(&PostParams::default(), &pin)
            .await
            .unwrap()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.argo_stop.cancel();
        self.controller_stop.cancel();
        if let Some(h) = self.controller.take() {
            h.abort();
        }
    }
}

/// The Application's sync policy before any pin.
pub fn original_policy() -> Value {
    json!({
        "automated": {"prune": true, "selfHeal": true},
        "syncOptions": ["ServerSideApply=true", "RespectIgnoreDifferences=true"],
        "retry": {"limit": 3, "backoff": {"duration": "5s", "factor": 2}}
    })
}

/// An Application's sync policy as JSON.
pub fn app_policy(app: &Application) -> Value {
    serde_json::to_value(app.spec.sync_policy.as_ref().unwrap()).unwrap()
}

/// How often the scenarios poll the world: a pin's timing is seen to within this.
pub const POLL: Duration = Duration::from_millis(50);

/// [`eventually_every`] at [`POLL`], in the (budget, what, check) order `examples/pin_bench.rs`
/// calls it with.
pub async fn eventually<T>(
    budget: Duration,
    what: &str,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    sluice_testkit::eventually::eventually_every(what, budget, POLL, check).await
}

/// Argo CD's application controller, reduced to what a pin meets.
struct FakeArgo {
    mgmt: Client,
    workload: Client,
    bundles: Arc<BundleClient>,
    cache: Arc<Mutex<BTreeMap<String, Arc<Artifact>>>>,
    name: String,
}

impl FakeArgo {
    async fn artifact(&self, reference: &str) -> Option<Arc<Artifact>> {
        if let Some(a) = self.cache.lock().unwrap().get(reference) {
            return Some(a.clone());
        }
        let a = Arc::new(self.bundles.pull(reference).await.ok()?);
        self.cache
            .lock()
            .unwrap()
            .insert(reference.to_owned(), a.clone());
        Some(a)
    }

    async fn tick(&self) {
        let apps: Api<Application> = Api::namespaced(self.mgmt.clone(), ARGOCD);
        let Ok(Some(app)) = apps.get_opt(&self.name).await else {
            return;
        };
        let pp = PatchParams {
            field_manager: Some("argocd-application-controller".into()),
            ..PatchParams::default()
        };
        let status = app.status.clone().unwrap_or_default();
        let op_phase = status
            .operation_state
            .as_ref()
            .and_then(|o| o.phase.clone());
        if op_phase.as_deref() == Some("Terminating") {
            let _ = apps
                .patch(
                    &self.name,
                    &pp,
                    &Patch::Merge(json!({
                        "operation": null,
                        "status": {"operationState": {"phase": "Failed", "message": "Operation terminated"}}
                    })),
                )
                .await;
            return;
        }
        let Some(source) = app.spec.source.clone() else {
            return;
        };
        let revision = source.target_revision.clone().unwrap_or_default();
        let reference = format!(
            "{}@{revision}",
            source.repo_url.trim_start_matches("oci://")
        );
        let Some(artifact) = self.artifact(&reference).await else {
            return;
        };
        let routes: Api<DynamicObject> =
            Api::namespaced_with(self.workload.clone(), SHOP, &route_resource());
        let mut synced = true;
        for o in artifact.manifests.objects() {
            let live = routes.get_opt(&o.name).await.ok().flatten();
            // Live objects carry server defaults: compare what the bundle sets.
            if !live.is_some_and(|l| contains(&l.data["spec"], &o.value["spec"])) {
                synced = false;
            }
        }
        let automated = app
            .spec
            .sync_policy
            .as_ref()
            .is_some_and(|p| p.is_automated());
        let running = op_phase.as_deref() == Some("Running");
        if !synced && automated && !running {
            let apply = PatchParams::apply("argocd-controller").force();
            for o in artifact.manifests.objects() {
                let mut body = o.value.clone();
                body["metadata"]["annotations"] = json!({"argocd.argoproj.io/tracking-id": format!("{}:gateway.networking.k8s.io/HTTPRoute:{SHOP}/{}", self.name, o.name)});
                // The world may be shutting down (emulator gone): end the tick.
                if routes
                    .patch(&o.name, &apply, &Patch::Apply(&body))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // prune: tracked routes the target lacks
            for r in status.resources.iter().flatten() {
                let name = r.name.clone().unwrap_or_default();
                if !artifact.manifests.objects().iter().any(|o| o.name == name) {
                    let _ = routes.delete(&name, &DeleteParams::default()).await;
                }
            }
            synced = true;
        }
        let resources: Vec<Value> = artifact
            .manifests
            .objects()
            .iter()
            .map(|o| json!({"group": "gateway.networking.k8s.io", "version": "v1", "kind": "HTTPRoute", "namespace": SHOP, "name": o.name, "status": if synced {"Synced"} else {"OutOfSync"}}))
            .collect();
        let mut patch = json!({"status": {
            "sync": {"status": if synced {"Synced"} else {"OutOfSync"}, "revision": revision},
            "health": {"status": "Healthy"},
            "resources": resources,
        }});
        // Argo CD records every revision it deployed in status.history.
        let mut history = status
            .extra
            .get("history")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let last = history
            .last()
            .and_then(|h| h.get("revision"))
            .and_then(Value::as_str);
        if synced && last != Some(revision.as_str()) {
            history.push(json!({"id": history.len(), "revision": revision, "deployedAt": "2026-01-01T00:00:00Z", "source": {"repoURL": source.repo_url, "targetRevision": revision, "path": "."}}));
            patch["status"]["history"] = Value::Array(history);
        }
        let _ = apps.patch(&self.name, &pp, &Patch::Merge(patch)).await;
    }
}

/// Whether `live` holds everything `desired` sets (maps by key, lists item by item).
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => d
            .iter()
            .all(|(k, v)| l.get(k).is_some_and(|lv| contains(lv, v))),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(a, b)| contains(a, b))
        }
        _ => live == desired,
    }
}
