//! The released Gateway API and Argo CD CRDs (`.tools/crds/`) on a real kube-apiserver v1.37.2:
//! every one is accepted and Established, and bad HTTPRoutes and GRPCRoutes are rejected by the
//! emulator with the real server's 422 message, word for word. Where they differ, the emulator is
//! wrong (EMULATED.md, "Checked against a real kube-apiserver").

use std::path::Path;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use sluice_testkit::control_plane::{self, ControlPlane, Options};
use sluice_testkit::prereq::{self, Upstream};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every YAML file of an upstream set, concatenated as one multi-document stream.
fn set_yaml(set: Upstream) -> Option<String> {
    let dir = prereq::or_skip(prereq::upstream_dir(set))?;
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no CRDs in {}", dir.display());
    Some(
        files
            .iter()
            .map(|f| read(f))
            .collect::<Vec<_>>()
            .join("\n---\n"),
    )
}

static INSTALLED: tokio::sync::OnceCell<Vec<String>> = tokio::sync::OnceCell::const_new();

/// The binary's control plane with Gateway API v1.6.1 and Argo CD v3.5.1 installed (once).
async fn real() -> Option<(&'static ControlPlane, &'static [String])> {
    let gateway = set_yaml(Upstream::GatewayApi)?;
    let argo = set_yaml(Upstream::ArgoCd)?;
    let cp = control_plane::shared().await?;
    let names = INSTALLED
        .get_or_init(|| async {
            let mut names = cp
                .install_crds(&gateway)
                .await
                .unwrap_or_else(|e| panic!("Gateway API v1.6.1 CRDs refused: {e}"));
            names.extend(
                cp.install_crds(&argo)
                    .await
                    .unwrap_or_else(|e| panic!("Argo CD v3.5.1 CRDs refused: {e}")),
            );
            let client = cp.client().await.unwrap();
            Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
                )
                .await
                .unwrap();
            names
        })
        .await;
    Some((cp, names))
}

#[tokio::test]
async fn released_gateway_api_and_argo_cd_crds_are_accepted() {
    let Some((_, names)) = real().await else {
        return;
    };
    for want in [
        "httproutes.gateway.networking.k8s.io",
        "grpcroutes.gateway.networking.k8s.io",
        "applications.argoproj.io",
        "applicationsets.argoproj.io",
        "appprojects.argoproj.io",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
}

#[tokio::test]
async fn the_older_gateway_api_release_is_accepted_too() {
    let Some(old) = set_yaml(Upstream::GatewayApiOld) else {
        return;
    };
    let Some((shared, _)) = real().await else {
        return;
    };
    // Same CRD names as v1.6.1: a second API server on the same etcd, under its own prefix.
    let cp = ControlPlane::start_with(Options {
        etcd: Some(shared.etcd().clone()),
        ..Options::default()
    })
    .await
    .unwrap();
    let names = cp
        .install_crds(&old)
        .await
        .unwrap_or_else(|e| panic!("Gateway API v1.2.1 CRDs refused: {e}"));
    assert!(
        names
            .iter()
            .any(|n| n == "httproutes.gateway.networking.k8s.io")
    );
}

fn route(rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "checkout", "namespace": "shop"},
        "spec": {
            "parentRefs": [{"name": "gw", "namespace": "istio-system"}],
            "rules": rules
        }
    })
}

fn grpc_route(rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {
            "parentRefs": [{"name": "gw", "namespace": "istio-system"}],
            "rules": rules
        }
    })
}

/// (case, object) pairs every server must reject.
fn bad_routes() -> Vec<(&'static str, Value)> {
    vec![
        (
            "redirect together with backendRefs",
            route(json!([{
                "filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 301}}],
                "backendRefs": [{"name": "svc", "port": 80}]
            }])),
        ),
        (
            "relative path",
            route(json!([{"matches": [{"path": {"type": "PathPrefix", "value": "api"}}]}])),
        ),
        (
            "backend timeout longer than request timeout",
            route(json!([{"timeouts": {"request": "1s", "backendRequest": "5s"}}])),
        ),
        (
            "same parent twice without sectionName",
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "checkout", "namespace": "shop"},
                "spec": {"parentRefs": [
                    {"name": "gw", "namespace": "istio-system", "sectionName": "http"},
                    {"name": "gw", "namespace": "istio-system"}
                ]}
            }),
        ),
        (
            "weight above maximum",
            route(json!([{"backendRefs": [{"name": "svc", "port": 80, "weight": 1000001}]}])),
        ),
        (
            "too many rules",
            route(Value::Array(
                (0..17)
                    .map(|_| json!({"backendRefs": [{"name": "svc", "port": 80}]}))
                    .collect(),
            )),
        ),
        (
            "Service backend without port",
            route(json!([{"backendRefs": [{"name": "svc"}]}])),
        ),
        (
            "filter type without its config",
            route(json!([{"filters": [{"type": "RequestHeaderModifier"}]}])),
        ),
        (
            "path type not in enum",
            route(json!([{"matches": [{"path": {"type": "Glob", "value": "/"}}]}])),
        ),
        (
            "weight of the wrong type",
            route(json!([{"backendRefs": [{"name": "svc", "port": 80, "weight": "five"}]}])),
        ),
        (
            "backendRef name missing",
            route(json!([{"backendRefs": [{"port": 80}]}])),
        ),
        (
            "header match name not a header name",
            route(json!([{"matches": [{"headers": [{"name": "x cohort", "value": "a"}]}]}])),
        ),
        (
            "gRPC method with an invalid service",
            grpc_route(
                json!([{"matches": [{"method": {"service": "not a service", "method": "Get"}}]}]),
            ),
        ),
    ]
}

fn resource(obj: &Value) -> ApiResource {
    let kind = obj["kind"].as_str().unwrap();
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

/// The message of the 422 the server answers a dry-run create of `obj` with.
async fn rejection(client: &Client, case: &str, obj: &Value) -> String {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "shop", &resource(obj));
    let pp = PostParams {
        dry_run: true,
        field_manager: None,
    };
    match api
        .create(&pp, &serde_json::from_value(obj.clone()).unwrap())
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 422 => status.message,
        Err(e) => panic!("{case}: expected 422 Invalid, got {e}"),
        Ok(o) => panic!("{case}: accepted: {o:?}"),
    }
}

#[tokio::test]
async fn bad_routes_are_rejected_by_the_emulator_with_the_real_messages() {
    let Some((cp, _)) = real().await else {
        return;
    };
    let real = cp.client().await.unwrap();
    let emulator = kube_emulator::Emulator::start().await;
    for file in [
        "gateway.networking.k8s.io_httproutes.yaml",
        "gateway.networking.k8s.io_grpcroutes.yaml",
    ] {
        emulator
            .load_manifest_file(prereq::upstream_file(Upstream::GatewayApi, file).unwrap())
            .unwrap();
    }
    emulator
        .load_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n")
        .unwrap();
    let emulated = emulator.client();
    let mut differences = Vec::new();
    for (case, obj) in bad_routes() {
        let want = rejection(&real, case, &obj).await;
        let got = rejection(&emulated, case, &obj).await;
        if want != got {
            differences.push(format!("{case}:\n  real:     {want}\n  emulator: {got}"));
        }
    }
    emulator.shutdown().await;
    assert!(
        differences.is_empty(),
        "the emulator's messages differ from kube-apiserver's:\n{}",
        differences.join("\n")
    );
}
