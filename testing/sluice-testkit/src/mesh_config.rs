//! The mesh configuration end-to-end tests put in a bundle and apply: the checkout HTTPRoute
//! split between its stable and canary backends. Builds manifests only; never applies them.

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
