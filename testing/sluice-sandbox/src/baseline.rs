//! What every sandbox cluster holds at start, as YAML: the operators' namespace everywhere;
//! beside Argo CD the `argocd` namespace and the chart's duck ConfigMap; in workload clusters
//! the Istio revision tags (`stable` → 1-27, `canary` → 1-28), the `shop` namespace with
//! checkout v2.13 (stable) and v2.14 (canary) as Deployments and one Service per version, and
//! the HTTPRoute `shop/checkout` sending everything to stable. Pure text; never applies it.

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
