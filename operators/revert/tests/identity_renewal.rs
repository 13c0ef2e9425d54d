//! revert's identity on a workload cluster can be a bound, expiring token (TokenRequest) that
//! the platform renews in revert's cluster Secret: revert reads the Secret on every use and
//! rebuilds that cluster's client when the Secret changes, so a renewed token is used at once,
//! with no restart, and an expired one is never kept.

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_emulator::Emulator;
use serde_json::json;
use sluice_revert::clusters::{CLUSTER_LABEL, Clusters};

const IDENTITIES: &str = "sluice-revert-clusters";

fn identity(server: &str, token: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": "east-1", "namespace": IDENTITIES, "labels": {CLUSTER_LABEL: "true"}},
        "stringData": {"name": "east-1", "server": server, "token": token}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_renewed_token_is_used_without_a_restart() {
    let management = Emulator::start().await;
    let workload = Emulator::start().await;
    let admin = management.client();
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": IDENTITIES}})).unwrap(),
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), IDENTITIES);
    // A token the workload cluster no longer accepts (expired).
    secrets
        .create(
            &PostParams::default(),
            &identity(&workload.base_url(), "expired-token"),
        )
        .await
        .unwrap();
    let clusters = Clusters::new(admin.clone(), IDENTITIES);
    let list = async |c: kube::Client| {
        Api::<Namespace>::all(c)
            .list(&ListParams::default())
            .await
            .map(|_| ())
    };
    let stale = clusters.client("east-1").await.unwrap();
    match list(stale).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 401, "{s:?}"),
        other => panic!("the expired token was accepted: {other:?}"),
    }

    // The platform renews it (a fresh TokenRequest token) in the same Secret.
    let renewed = workload.service_account_token("sluice-system", "sluice-revert-target");
    secrets
        .patch(
            "east-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": renewed}})),
        )
        .await
        .unwrap();
    let fresh = clusters.client("east-1").await.unwrap();
    list(fresh).await.unwrap();

    management.shutdown().await;
    workload.shutdown().await;
}
