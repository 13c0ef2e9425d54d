//! HTTPRoute (gateway.networking.k8s.io/v1), the first [`RouteKind`]: read and written through
//! the api crate's field-preserving view, which keeps every field it does not name. The shape
//! of the rules this operator adds to an HTTPRoute (cohort and mirror rules under HTTP match
//! precedence) is `route_edit`'s; this module only names the resource and weights backendRefs.
//! Never does I/O.

use kube::{Api, Client};
use sluice_api::{external::http_route::HttpRoute, v1alpha1::RolloutSpec};

use super::{Driven, RouteKind};
use crate::{
    decide::RouteObs,
    observe,
    route_edit::{self, CrdSupport, Desired, EditError, Target},
};

/// The HTTPRoute kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Http;

impl RouteKind for Http {
    type Route = HttpRoute;

    const KIND: &'static str = "HTTPRoute";
    const PLURAL: &'static str = "httproutes";
    const CRD: &'static str = "httproutes.gateway.networking.k8s.io";

    fn api(client: Client, namespace: Option<&str>) -> Api<HttpRoute> {
        match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        }
    }

    fn rule_count(route: &HttpRoute) -> usize {
        route.rules().len()
    }

    fn rule_name(route: &HttpRoute, rule: usize) -> Option<&str> {
        route.rules().get(rule)?.name.as_deref()
    }

    fn has_backend(route: &HttpRoute, rule: usize, service: &str) -> bool {
        route
            .rules()
            .get(rule)
            .is_some_and(|r| r.backend(service).is_some())
    }

    fn weight_share_percent(route: &HttpRoute, rule: usize, service: &str) -> f64 {
        route
            .rules()
            .get(rule)
            .map_or(0.0, |r| r.weight_share_percent(service))
    }

    fn weight(route: &HttpRoute, rule: usize, service: &str) -> Option<Option<i32>> {
        Some(route.rules().get(rule)?.backend(service)?.weight)
    }

    fn set_weight(route: &mut HttpRoute, rule: usize, service: &str, weight: i32) -> bool {
        let backend = route
            .spec
            .rules
            .as_mut()
            .and_then(|rules| rules.get_mut(rule))
            .and_then(|r| r.backend_mut(service));
        match backend {
            Some(b) => {
                b.weight = Some(weight);
                true
            }
            None => false,
        }
    }
}

impl Driven for Http {
    fn dynamic_type() {}

    fn observe(
        route: &HttpRoute,
        others: &[HttpRoute],
        target: &Target,
        spec: &RolloutSpec,
        crd: CrdSupport,
    ) -> RouteObs {
        observe::route(route, others, target, spec, crd)
    }

    fn apply(
        route: &HttpRoute,
        target: &Target,
        desired: &Desired,
        crd: CrdSupport,
    ) -> Result<HttpRoute, EditError> {
        route_edit::apply(route, target, desired, crd)
    }

    fn missing(_: &str) -> RouteObs {
        RouteObs::Missing
    }

    fn not_installed(_: &str) -> Option<RouteObs> {
        // As before GRPCRoute: an HTTPRoute CRD that cannot be read is assumed to be there.
        None
    }
}

#[cfg(test)]
mod tests {
    use kube::Resource;
    use serde_json::json;

    use super::*;

    fn route() -> HttpRoute {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "checkout", "namespace": "shop"},
            "spec": {
                "rules": [
                    {"name": "api", "backendRefs": [
                        {"name": "stable", "port": 80, "weight": 90},
                        {"name": "canary", "port": 80, "weight": 10}
                    ]},
                    {"backendRefs": [{"name": "static", "port": 80}]}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_resource_is_the_one_the_api_crate_declares() {
        assert_eq!(Http::KIND, HttpRoute::kind(&()));
        assert_eq!(Http::PLURAL, HttpRoute::plural(&()));
        assert_eq!(Http::GROUP, HttpRoute::group(&()));
        assert_eq!(Http::VERSION, HttpRoute::version(&()));
        assert_eq!(Http::CRD, format!("{}.{}", Http::PLURAL, Http::GROUP));
    }

    #[test]
    fn rules_and_weights_are_read_and_written() {
        let mut r = route();
        assert_eq!(Http::rule_count(&r), 2);
        assert_eq!(Http::rule_by_name(&r, "api"), Some(0));
        assert_eq!(Http::rules_with_backend(&r, "stable"), vec![0]);
        assert_eq!(Http::weight(&r, 0, "canary"), Some(Some(10)));
        assert_eq!(Http::weight(&r, 1, "static"), Some(None));
        assert_eq!(Http::weight(&r, 1, "canary"), None);
        assert!(Http::set_weight(&mut r, 0, "canary", 25));
        assert!(!Http::set_weight(&mut r, 1, "canary", 25));
        assert_eq!(
            Http::weight_share_percent(&r, 0, "canary"),
            25.0 / 115.0 * 100.0
        );
    }
}
