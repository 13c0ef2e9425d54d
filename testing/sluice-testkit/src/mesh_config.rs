//! The mesh configuration end-to-end tests put in a bundle and apply: the checkout HTTPRoute
//! split between its stable and canary backends; and the Istio revision webhooks a meshed cluster
//! starts with. Builds manifests only; never applies them.

use kube::api::{ApiResource, GroupVersionKind};

/// The checkout HTTPRoute `namespace/name` behind `mesh-gateway`, `canary` percent on
/// `checkout-canary` and the rest on `checkout-stable` (port 8080 both), as YAML.
pub fn checkout_route(namespace: &str, name: &str, canary: impl Into<u64>) -> String {
    let canary: u64 = canary.into();
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
  namespace: {namespace}
spec:
  parentRefs:
    - name: mesh-gateway
  rules:
    - backendRefs:
        - name: checkout-stable
          port: 8080
          weight: {}
        - name: checkout-canary
          port: 8080
          weight: {canary}
"#,
        100 - canary
    )
}

/// The Gateway API `HTTPRoute` resource, for a dynamic client.
pub fn http_route_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
    )
}

/// The MutatingWebhookConfigurations of a meshed cluster on two Istio revisions: revision tag
/// `stable` on 1-27 and `canary` on 1-28 (`istio.io/tag` and `istio.io/rev` labels, as `istioctl
/// tag set` writes them) and each revision's sidecar injector, as JSON objects.
pub fn revision_tag_webhooks() -> Vec<serde_json::Value> {
    [
        (
            "istio-revision-tag-stable",
            serde_json::json!({"istio.io/tag": "stable", "istio.io/rev": "1-27"}),
        ),
        (
            "istio-revision-tag-canary",
            serde_json::json!({"istio.io/tag": "canary", "istio.io/rev": "1-28"}),
        ),
        (
            "istio-sidecar-injector-1-27",
            serde_json::json!({"istio.io/rev": "1-27"}),
        ),
        (
            "istio-sidecar-injector-1-28",
            serde_json::json!({"istio.io/rev": "1-28"}),
        ),
    ]
    .into_iter()
    .map(|(name, labels)| {
        serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                           "metadata": {"name": name, "labels": labels}})
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weights_add_up_to_100() {
        let yaml = checkout_route("shop", "checkout", 10u32);
        assert!(yaml.contains("weight: 90\n"), "{yaml}");
        assert!(yaml.contains("weight: 10\n"), "{yaml}");
        assert!(yaml.contains("namespace: shop\n"), "{yaml}");
    }
}
