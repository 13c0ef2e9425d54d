//! GRPCRoute at the route seam, against the released Gateway API v1.6.1 CRD served by the API
//! emulator: the schema holds every field the seam reads and writes, and a weight written
//! through the seam's API handle keeps every other field of the route.

use k8s_openapi::{
    api::core::v1::Namespace,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DynamicObject, PostParams},
};
use serde_json::{Value, json};
use sluice_rollout_weights::{
    route::{self, RouteKind, grpc::Grpc},
    route_edit::CrdSupport,
};
use sluice_testkit::{
    crds::emulator_with,
    prereq::{Upstream, or_skip, upstream_file},
};

const GRPCROUTE_FILE: &str = "gateway.networking.k8s.io_grpcroutes.yaml";

/// A GRPCRoute using every part of the v1.6.1 schema the seam must carry over.
fn payments() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {"name": "payments", "namespace": "shop", "annotations": {"team": "payments"}},
        "spec": {
            "parentRefs": [{"name": "edge", "sectionName": "grpc"}],
            "hostnames": ["payments.example.com"],
            "rules": [
                {
                    "name": "charge",
                    "matches": [{
                        "method": {"type": "Exact", "service": "pay.v1.Payments", "method": "Charge"},
                        "headers": [{"type": "Exact", "name": "x-tenant", "value": "a"}]
                    }],
                    "filters": [
                        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 9000}, "percent": 5}}
                    ],
                    "backendRefs": [
                        {"name": "payments-stable", "port": 9000, "weight": 100},
                        {"name": "payments-canary", "port": 9000, "weight": 0}
                    ]
                },
                {"matches": [{"method": {"service": "pay.v1.Health"}}], "backendRefs": [{"name": "health", "port": 9000}]}
            ]
        }
    })
}

#[tokio::test]
async fn the_released_grpcroute_schema_holds_what_the_seam_reads_and_writes() {
    let Some(file) = or_skip(upstream_file(Upstream::GatewayApi, GRPCROUTE_FILE)) else {
        return;
    };
    let emu = emulator_with([file]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    let crd = serde_json::to_value(
        crds.get(Grpc::CRD)
            .await
            .expect("the GRPCRoute CRD is served"),
    )
    .unwrap();
    assert_eq!(crd["spec"]["group"], Grpc::GROUP);
    assert_eq!(crd["spec"]["names"]["kind"], Grpc::KIND);
    assert_eq!(crd["spec"]["names"]["plural"], Grpc::PLURAL);
    let version = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == Grpc::VERSION)
        .expect("the seam's version is served");
    let rule = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rules"]["items"]
        ["properties"];
    let backend = &rule["backendRefs"]["items"]["properties"];
    for field in ["name", "group", "kind", "namespace", "port", "weight"] {
        assert!(backend.get(field).is_some(), "backendRefs[].{field}");
    }
    let matches = &rule["matches"]["items"]["properties"];
    assert!(matches.get("method").is_some() && matches.get("headers").is_some());
    assert!(
        matches.get("path").is_none(),
        "a GRPCRoute match has no path"
    );
    // Rule names and the mirror percent, read the same way as for an HTTPRoute.
    assert_eq!(CrdSupport::from_crd(&crd), CrdSupport::ALL);
}

#[tokio::test]
async fn a_weight_written_through_the_seam_keeps_every_other_field() {
    let Some(file) = or_skip(upstream_file(Upstream::GatewayApi, GRPCROUTE_FILE)) else {
        return;
    };
    let emu = emulator_with([file]).await;
    let client = emu.client();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await
        .expect("namespace created");
    let routes = Grpc::api(client.clone(), Some("shop"));
    let doc: DynamicObject = serde_json::from_value(payments()).unwrap();
    routes
        .create(&PostParams::default(), &doc)
        .await
        .expect("the GRPCRoute is accepted by the released schema");

    // As served: the API server has filled the schema's defaults in (backendRef group and kind,
    // weight 1, match type Exact); those are fields as read too, and stay.
    let mut read = routes.get("payments").await.unwrap();
    let served = read.data.clone();
    let charge = &served["spec"]["rules"][0];
    assert_eq!(charge["filters"][0]["requestMirror"]["percent"], 5);
    assert_eq!(charge["matches"][0]["method"]["method"], "Charge");
    assert_eq!(charge["matches"][0]["headers"][0]["name"], "x-tenant");
    assert_eq!(Grpc::weight(&read, 0, "payments-canary"), Some(Some(0)));
    assert_eq!(
        route::locate::<Grpc>(&read, None, "payments-stable", |_| false),
        Ok(0)
    );
    assert!(Grpc::set_weight(&mut read, 0, "payments-stable", 90));
    assert!(Grpc::set_weight(&mut read, 0, "payments-canary", 10));
    route::set_owner(&mut read, "shop/payments");
    routes
        .replace("payments", &PostParams::default(), &read)
        .await
        .expect("the weighted GRPCRoute is accepted");

    let written = routes.get("payments").await.unwrap();
    let mut expect = served;
    expect["spec"]["rules"][0]["backendRefs"][0]["weight"] = json!(90);
    expect["spec"]["rules"][0]["backendRefs"][1]["weight"] = json!(10);
    assert_eq!(written.data["spec"], expect["spec"]);
    assert_eq!(
        route::owner_of(&written),
        Some(("shop".into(), "payments".into()))
    );
    assert_eq!(
        written.metadata.annotations.as_ref().unwrap()["team"],
        "payments"
    );
    assert_eq!(
        Grpc::weight_share_percent(&written, 0, "payments-canary"),
        10.0
    );
}
