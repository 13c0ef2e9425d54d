//! Typed views of the external objects sluice reads and writes: Gateway API HTTPRoute, Argo CD
//! Application and ApplicationSet, Istio revision-tag webhooks and the injector's pod annotation.
//!
//! Every struct keeps the fields it does not name in `extra` (`#[serde(flatten)]`) and omits
//! absent fields when serialising, so a read-modify-write never drops or adds a field sluice does
//! not own. Never talks to a cluster.

pub mod argocd;
pub mod http_route;
pub mod istio;

pub use argocd::{Application, ApplicationSet};
pub use http_route::HttpRoute;

/// Fields of an external object that sluice does not model, kept verbatim.
pub type Extra = std::collections::BTreeMap<String, serde_json::Value>;

/// Implements `kube::Resource` for a typed external view with a static group/version/kind.
macro_rules! external_resource {
    ($ty:ty, $group:literal, $version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use external_resource;

#[cfg(test)]
pub(crate) mod roundtrip {
    //! Shared assertion: a JSON document survives deserialise → serialise unchanged.

    use serde::{Serialize, de::DeserializeOwned};
    use serde_json::Value;

    /// Parses `doc` as `T`, serialises it back and asserts the result equals `doc`.
    pub fn assert_roundtrip<T: Serialize + DeserializeOwned>(doc: &Value) -> T {
        let typed: T = serde_json::from_value(doc.clone()).expect("document parses");
        let back = serde_json::to_value(&typed).expect("view serialises");
        if back != *doc {
            panic!(
                "round trip changed the document:\nbefore: {}\nafter:  {}",
                serde_json::to_string_pretty(doc).unwrap(),
                serde_json::to_string_pretty(&back).unwrap()
            );
        }
        typed
    }
}
