//! The chart on a real kube-apiserver v1.37.2 (`sluice_testkit::control_plane`): `helm install`
//! of both modes is accepted object by object (CRDs under the real CEL cost estimator, RBAC,
//! Deployments, PodDisruptionBudgets, the admission policy) and passes the chart's `kubeVersion`
//! check against the server's own `/version`; the owned-route ValidatingAdmissionPolicy is
//! enforced by the real server as the emulator enforces it, with the same message.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use sluice_e2e::{chart, eventually, repo_root};
use sluice_testkit::control_plane::{self, ControlPlane, Options};
use sluice_testkit::prereq;

/// Creates the namespaces the chart's objects live in but does not create itself (`argocd`
/// in management mode: Argo CD is installed first), as an installation would find them.
async fn chart_namespaces(cp: &ControlPlane, mode: chart::Mode) {
    let rendered = chart::render(&repo_root(), mode).unwrap();
    let client = cp.client().await.unwrap();
    for ns in chart::namespaces(&rendered) {
        if ns != chart::NAMESPACE {
            create_namespace(&client, &ns).await;
        }
    }
}

/// `helm install` of the chart into the control plane, `values` added for the workload mode.
fn helm_install(cp: &ControlPlane, values: Option<&str>) -> Result<String, String> {
    let repo = repo_root();
    let helm = chart::helm(&repo).map_err(|e| e.to_string())?;
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    cp.write_kubeconfig(&kubeconfig).unwrap();
    let mut cmd = Command::new(helm);
    cmd.current_dir(&repo)
        .args(["install", chart::RELEASE, "charts/sluice"])
        .args(["--namespace", chart::NAMESPACE, "--create-namespace"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        // helm keeps its cache and configuration here, not in the user's home.
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"));
    if let Some(values) = values {
        cmd.args(["-f", values]);
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn httproute_crd() -> Option<PathBuf> {
    prereq::or_skip(prereq::httproute_crd())
}

static MANAGEMENT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// The binary's control plane with the released HTTPRoute CRD and the chart installed in
/// management mode (the default values), once.
async fn management() -> Option<&'static ControlPlane> {
    prereq::or_skip(
        chart::helm(&repo_root())
            .map_err(|e| prereq::Missing::new(e.to_string(), prereq::INSTALL_TOOLS)),
    )?;
    let crd = httproute_crd()?;
    let cp = control_plane::shared().await?;
    MANAGEMENT
        .get_or_init(|| async {
            cp.install_crds(&std::fs::read_to_string(&crd).unwrap())
                .await
                .unwrap();
            chart_namespaces(cp, chart::Mode::Management).await;
            let out = helm_install(cp, None)
                .unwrap_or_else(|e| panic!("helm install (management) failed:\n{e}"));
            assert!(out.contains("STATUS: deployed"), "{out}");
        })
        .await;
    Some(cp)
}

#[tokio::test]
async fn the_chart_installs_in_management_mode() {
    let Some(cp) = management().await else {
        return;
    };
    let client = cp.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [
        "rollouts.sluice.dev",
        "wavegates.sluice.dev",
        "bundlepins.sluice.dev",
        "revisionupgrades.sluice.dev",
        "gatetemplates.sluice.dev",
    ] {
        let crd = crds.get(name).await.unwrap();
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name}: {conditions:?}"
        );
    }
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), chart::NAMESPACE);
    let names: Vec<String> = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
}

#[tokio::test]
async fn the_chart_installs_in_workload_mode() {
    let Some(shared) = management().await else {
        return;
    };
    // A second API server on the same etcd: the modes' cluster-scoped objects share names.
    let cp = ControlPlane::start_with(Options {
        etcd: Some(shared.etcd().clone()),
        ..Options::default()
    })
    .await
    .unwrap();
    cp.install_crds(&std::fs::read_to_string(httproute_crd().unwrap()).unwrap())
        .await
        .unwrap();
    chart_namespaces(&cp, chart::Mode::Workload).await;
    let out = helm_install(&cp, Some("charts/sluice/ci/workload-values.yaml"))
        .unwrap_or_else(|e| panic!("helm install (workload) failed:\n{e}"));
    assert!(out.contains("STATUS: deployed"), "{out}");
}

const OWNER: &str = "sluice.dev/owned-by-rollout";

fn route_resource() -> ApiResource {
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: "HTTPRoute".into(),
        plural: "httproutes".into(),
    }
}

fn owned_route(ns: &str, canary: u32) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "checkout", "namespace": ns, "annotations": {OWNER: "checkout"}},
        "spec": {
            "parentRefs": [{"name": "gw", "namespace": "istio-system"}],
            "rules": [{"backendRefs": [
                {"name": "checkout-v1", "port": 80, "weight": 100 - canary},
                {"name": "checkout-v2", "port": 80, "weight": canary}
            ]}]
        }
    })
}

fn unowned_route(ns: &str, canary: u32) -> Value {
    let mut route = owned_route(ns, canary);
    route["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    route
}

/// Adds the ownership annotation, as rollout-weights does when it takes a route.
async fn claim(client: &Client, ns: &str) {
    let api = routes(client, ns);
    let mut route = serde_json::to_value(api.get("checkout").await.unwrap()).unwrap();
    route["metadata"]["annotations"] = json!({OWNER: "checkout"});
    api.replace(
        "checkout",
        &PostParams::default(),
        &serde_json::from_value(route).unwrap(),
    )
    .await
    .unwrap();
}

fn routes(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &route_resource())
}

/// Replaces the route's rules with a canary weight of `canary`; the server's answer.
async fn change_rules(client: &Client, ns: &str, canary: u32) -> Result<(), kube::Error> {
    let api = routes(client, ns);
    let mut current = serde_json::to_value(api.get("checkout").await?).unwrap();
    current["spec"]["rules"] = owned_route(ns, canary)["spec"]["rules"].clone();
    api.replace(
        "checkout",
        &PostParams::default(),
        &serde_json::from_value(current).unwrap(),
    )
    .await
    .map(|_| ())
}

async fn create_namespace(client: &Client, ns: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn the_owned_route_policy_is_enforced_as_the_emulator_enforces_it() {
    let Some(cp) = management().await else {
        return;
    };
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace("owned-route").await.unwrap();
    // A route is created without the annotation (one created with it is denied) and
    // rollout-weights, as its ServiceAccount and under the chart's RBAC, takes ownership.
    routes(&admin, &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(unowned_route(&ns, 5)).unwrap(),
        )
        .await
        .unwrap();
    let operator = cp
        .service_account_client(chart::NAMESPACE, "sluice-rollout-weights")
        .await
        .unwrap();
    claim(&operator, &ns).await;

    // Someone else (here the administrator, which RBAC lets do anything) changes the owned
    // rules: denied by the policy. A new policy takes effect within a second or so.
    // Each attempt writes other weights, so an attempt let through before the policy was
    // active does not turn the next into a no-op.
    let mut canary = 10;
    let denial = eventually(
        "the policy denies a foreign change",
        Duration::from_secs(30),
        async || {
            canary += 1;
            match change_rules(&admin, &ns, canary).await {
                Err(kube::Error::Api(s)) => Ok(s),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(denial.code, 403, "{denial:?}");
    assert!(
        denial.message.contains(&format!(
            "spec.rules of HTTPRoute {ns}/checkout belong to Rollout checkout"
        )),
        "{}",
        denial.message
    );

    // Removing the ownership annotation is denied too.
    let api = routes(&admin, &ns);
    let mut unowned = serde_json::to_value(api.get("checkout").await.unwrap()).unwrap();
    unowned["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(OWNER);
    let err = api
        .replace(
            "checkout",
            &PostParams::default(),
            &serde_json::from_value(unowned.clone()).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains(OWNER), "{err}");

    // A write leaving rules and annotation alone passes.
    let mut no_op = serde_json::to_value(api.get("checkout").await.unwrap()).unwrap();
    no_op["metadata"]["labels"] = json!({"synced": "yes"});
    api.replace(
        "checkout",
        &PostParams::default(),
        &serde_json::from_value(no_op).unwrap(),
    )
    .await
    .unwrap();

    // rollout-weights may change them.
    change_rules(&operator, &ns, 50).await.unwrap();

    // The emulator, given the same policy, route and request, answers the same.
    let rendered = chart::render(&repo_root(), chart::Mode::Management).unwrap();
    let emulator = kube_emulator::Emulator::start().await;
    emulator
        .load_manifest_file(httproute_crd().unwrap())
        .unwrap();
    emulator
        .load_yaml(&chart::to_yaml(&chart::of_kinds(
            &rendered,
            &chart::ADMISSION_KINDS,
        )))
        .unwrap();
    let emulated = emulator.client();
    create_namespace(&emulated, &ns).await;
    routes(&emulated, &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(unowned_route(&ns, 5)).unwrap(),
        )
        .await
        .unwrap();
    let token = emulator.service_account_token(chart::NAMESPACE, "sluice-rollout-weights");
    claim(&emulator.client_with_token(&token), &ns).await;
    let Err(kube::Error::Api(emulated_denial)) = change_rules(&emulated, &ns, 50).await else {
        panic!("the emulator let a foreign change of owned rules through");
    };
    let emulated_unowned = {
        let api = routes(&emulated, &ns);
        let mut v = serde_json::to_value(api.get("checkout").await.unwrap()).unwrap();
        v["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(OWNER);
        api.replace(
            "checkout",
            &PostParams::default(),
            &serde_json::from_value(v).unwrap(),
        )
        .await
        .unwrap_err()
    };
    emulator.shutdown().await;
    assert_eq!(
        (
            emulated_denial.code,
            emulated_denial.reason.as_str(),
            emulated_denial.message.as_str()
        ),
        (denial.code, denial.reason.as_str(), denial.message.as_str())
    );
    assert_eq!(emulated_unowned.to_string(), err.to_string());
}
