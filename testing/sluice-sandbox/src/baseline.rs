//! What every sandbox cluster holds at start, as YAML: the operators' namespace everywhere;
//! beside Argo CD the `argocd` namespace and the chart's duck ConfigMap; in workload clusters
//! the Istio revision tags (`stable` → 1-27, `canary` → 1-28), the `shop` namespace with
//! checkout v2.13 (stable) and v2.14 (canary) as Deployments and one Service per version, and
//! the HTTPRoute `shop/checkout` sending everything to stable. Also the gRPC service `payments`
//! (v1 stable, v2 canary, the GRPCRoute `shop/payments` sending everything to v1), which the
//! `canary-grpc` and `canary-grpc-mirror` scenarios apply (the mesh simulator knows it in every workload cluster from the
//! start; it carries traffic once its GRPCRoute exists). Pure text; never applies it.

use sluice_api::v1alpha1::wave_gate::{DUCK_MATCH_KEY, DUCK_RESOURCE, DUCK_STATUS_LIST_KEY};

use crate::operators::{ARGOCD_NAMESPACE, LEASE_NAMESPACE};

/// Namespace of the sandbox's service.
pub const SHOP: &str = "shop";
/// The HTTPRoute splitting checkout traffic.
pub const ROUTE: &str = "checkout";
/// Stable backend Service (one Service per version).
pub const STABLE: &str = "checkout-v2-13";
/// Canary backend Service.
pub const CANARY: &str = "checkout-v2-14";
/// The GRPCRoute splitting the gRPC service's calls.
pub const GRPC_ROUTE: &str = "payments";
/// The GRPCRoute's rule the Rollout manages (`spec.rules[].name`).
pub const GRPC_RULE: &str = "charge";
/// The gRPC service's stable backend Service (and Deployment), version `v1`.
pub const GRPC_STABLE: &str = "payments-v1";
/// The gRPC service's canary backend Service (and Deployment), version `v2`.
pub const GRPC_CANARY: &str = "payments-v2";
/// The gRPC service whose every method the GRPCRoute's rule matches.
pub const GRPC_SERVICE: &str = "shop.Payments";
/// The gRPC service's write method, most of its calls (`/<service>/<method>` is the call's path).
pub const GRPC_METHOD: (&str, &str) = (GRPC_SERVICE, "Charge");
/// The gRPC service's read method, safe to receive twice: what a mirror step may copy.
pub const GRPC_READ_METHOD: (&str, &str) = (GRPC_SERVICE, "GetReceipt");

/// The chart's default name of the duck ConfigMap (`waveGate.decisionConfigMap.name`).
pub const DUCK_CONFIGMAP: &str = "sluice-wavegate-decisions";

/// Objects every cluster gets.
pub fn common() -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {LEASE_NAMESPACE}\n")
}

/// Objects of a management cluster: Argo CD's namespace and the duck ConfigMap the chart
/// creates there (the values follow sluice-api's duck-type constants, as the chart does).
pub fn management() -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ARGOCD_NAMESPACE}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {DUCK_CONFIGMAP}\n  namespace: {ARGOCD_NAMESPACE}\n\
         data:\n  apiVersion: sluice.dev/v1alpha1\n  kind: {DUCK_RESOURCE}\n  statusListKey: {DUCK_STATUS_LIST_KEY}\n  matchKey: {DUCK_MATCH_KEY}\n"
    )
}

fn revision_tag(tag: &str, revision: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata:\n  \
         name: istio-revision-tag-{tag}\n  labels:\n    istio.io/tag: {tag}\n    istio.io/rev: {revision}\n\
         webhooks: []\n---\n\
         apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata:\n  \
         name: istio-sidecar-injector-{revision}\n  labels:\n    istio.io/rev: {revision}\nwebhooks: []\n"
    )
}

fn version(backend: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {backend}\n  namespace: {SHOP}\nspec:\n  \
         selector:\n    app: checkout\n    version: {version}\n  ports:\n  - name: http\n    port: 80\n    targetPort: 8080\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {backend}\n  namespace: {SHOP}\nspec:\n  \
         replicas: 2\n  selector:\n    matchLabels:\n      app: checkout\n      version: {version}\n  \
         template:\n    metadata:\n      labels:\n        app: checkout\n        version: {version}\n    \
         spec:\n      containers:\n      - name: checkout\n        image: registry.invalid/checkout:{version}\n        \
         ports:\n        - containerPort: 8080\n"
    )
}

fn grpc_version(backend: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {backend}\n  namespace: {SHOP}\nspec:\n  \
         selector:\n    app: payments\n    version: {version}\n  ports:\n  - name: grpc\n    port: 9000\n    targetPort: 9000\n    appProtocol: grpc\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {backend}\n  namespace: {SHOP}\nspec:\n  \
         replicas: 2\n  selector:\n    matchLabels:\n      app: payments\n      version: {version}\n  \
         template:\n    metadata:\n      labels:\n        app: payments\n        version: {version}\n    \
         spec:\n      containers:\n      - name: payments\n        image: registry.invalid/payments:{version}\n        \
         ports:\n        - containerPort: 9000\n"
    )
}

/// The payments GRPCRoute: its rule `charge` (every method of [`GRPC_SERVICE`]) with the given
/// weights for stable and canary.
pub fn grpc_route(stable_weight: u32, canary_weight: u32) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata:\n  name: {GRPC_ROUTE}\n  namespace: {SHOP}\n\
         spec:\n  parentRefs:\n  - name: gateway\n    namespace: istio-ingress\n  rules:\n  - name: {GRPC_RULE}\n    \
         matches:\n    - method:\n        service: {GRPC_SERVICE}\n    backendRefs:\n    \
         - name: {GRPC_STABLE}\n      port: 9000\n      weight: {stable_weight}\n    - name: {GRPC_CANARY}\n      port: 9000\n      weight: {canary_weight}\n"
    )
}

/// The gRPC service `payments` of a workload cluster: v1 and v2 (a Service and a Deployment
/// each) and the GRPCRoute sending every call to v1.
pub fn grpc_service() -> String {
    [
        grpc_version(GRPC_STABLE, "v1"),
        grpc_version(GRPC_CANARY, "v2"),
        grpc_route(100, 0),
    ]
    .join("---\n")
}

/// The checkout route with the given weights for stable and canary.
pub fn route(stable_weight: u32, canary_weight: u32) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {ROUTE}\n  namespace: {SHOP}\n\
         spec:\n  parentRefs:\n  - name: gateway\n    namespace: istio-ingress\n  rules:\n  - backendRefs:\n    \
         - name: {STABLE}\n      port: 80\n      weight: {stable_weight}\n    - name: {CANARY}\n      port: 80\n      weight: {canary_weight}\n"
    )
}

/// Objects of a workload cluster.
pub fn workload() -> String {
    [
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: istio-system\n".to_string(),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {SHOP}\n  labels:\n    istio.io/rev: stable\n"
        ),
        revision_tag("stable", "1-27"),
        revision_tag("canary", "1-28"),
        version(STABLE, "v2.13"),
        version(CANARY, "v2.14"),
        route(100, 0),
    ]
    .join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::Value;

    fn docs(text: &str) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).unwrap())
            .collect()
    }

    fn kinds(text: &str) -> Vec<String> {
        docs(text)
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn every_document_parses_and_names_its_kind() {
        assert_eq!(kinds(&common()), ["Namespace/sluice-system"]);
        assert_eq!(
            kinds(&management()),
            ["Namespace/argocd", "ConfigMap/sluice-wavegate-decisions"]
        );
        assert_eq!(
            kinds(&workload()),
            [
                "Namespace/istio-system",
                "Namespace/shop",
                "MutatingWebhookConfiguration/istio-revision-tag-stable",
                "MutatingWebhookConfiguration/istio-sidecar-injector-1-27",
                "MutatingWebhookConfiguration/istio-revision-tag-canary",
                "MutatingWebhookConfiguration/istio-sidecar-injector-1-28",
                "Service/checkout-v2-13",
                "Deployment/checkout-v2-13",
                "Service/checkout-v2-14",
                "Deployment/checkout-v2-14",
                "HTTPRoute/checkout",
            ]
        );
    }

    #[test]
    fn the_grpc_service_is_two_versions_and_a_grpcroute_on_its_method() {
        assert_eq!(
            kinds(&grpc_service()),
            [
                "Service/payments-v1",
                "Deployment/payments-v1",
                "Service/payments-v2",
                "Deployment/payments-v2",
                "GRPCRoute/payments",
            ]
        );
        let route = &docs(&grpc_route(99, 1))[0];
        let rule = &route["spec"]["rules"][0];
        assert_eq!(rule["name"], GRPC_RULE);
        assert_eq!(rule["matches"][0]["method"]["service"], "shop.Payments");
        // The whole service: a mirror step may narrow it to a read method.
        assert_eq!(
            rule["matches"][0]["method"].as_object().map(|m| m.len()),
            Some(1)
        );
        assert_eq!(rule["backendRefs"][0]["name"], GRPC_STABLE);
        assert_eq!(rule["backendRefs"][0]["weight"], 99);
        assert_eq!(rule["backendRefs"][1]["name"], GRPC_CANARY);
        assert_eq!(rule["backendRefs"][1]["weight"], 1);
        let svc = &docs(&grpc_service())[0];
        assert_eq!(svc["spec"]["ports"][0]["appProtocol"], "grpc");
    }

    #[test]
    fn the_duck_configmap_names_wavegate_decisions_by_cluster_name() {
        let cm = &docs(&management())[1];
        assert_eq!(cm["metadata"]["namespace"], "argocd");
        assert_eq!(cm["data"]["kind"], "wavegates");
        assert_eq!(cm["data"]["statusListKey"], "decisions");
        assert_eq!(cm["data"]["matchKey"], "clusterName");
        assert_eq!(cm["data"]["apiVersion"], "sluice.dev/v1alpha1");
    }

    #[test]
    fn the_route_carries_the_given_weights_in_one_rule() {
        let cases = [(100, 0), (90, 10)];
        for (s, c) in cases {
            let r = &docs(&route(s, c))[0];
            let refs = &r["spec"]["rules"][0]["backendRefs"];
            assert_eq!(refs[0]["name"], STABLE);
            assert_eq!(refs[0]["weight"], s);
            assert_eq!(refs[1]["name"], CANARY);
            assert_eq!(refs[1]["weight"], c);
            assert_eq!(r["spec"]["rules"].as_array().unwrap().len(), 1);
        }
    }

    #[test]
    fn tags_point_at_revisions_the_way_istioctl_labels_them() {
        let tag = &docs(&workload())[2];
        assert_eq!(tag["metadata"]["labels"]["istio.io/tag"], "stable");
        assert_eq!(tag["metadata"]["labels"]["istio.io/rev"], "1-27");
    }
}
