//! GRPCRoute (gateway.networking.k8s.io/v1, Gateway API v1.6.1 standard channel), the second
//! [`RouteKind`], at the seam only: named, read and weighted, not yet accepted by a Rollout's
//! `routeRef`. A GRPCRoute is handled as a dynamic object: only `spec.rules[].name` and
//! `spec.rules[].backendRefs[]` (name, group, kind, namespace, weight) are read, only a
//! backendRef's `weight` is written, and everything else (parentRefs, hostnames, matches by
//! `method`/`headers`, filters including `RequestMirror`, unknown fields) stays as read.
//! Never does I/O.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::Value;

use super::RouteKind;

/// The GRPCRoute kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grpc;

impl Grpc {
    /// The API resource, for dynamic reads and writes.
    pub fn api_resource() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(Self::GROUP, Self::VERSION, Self::KIND),
            Self::PLURAL,
        )
    }
}

/// The rules (empty when absent or not a list).
fn rules(route: &DynamicObject) -> &[Value] {
    route.data["spec"]["rules"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// Whether `b` is the Service `name` in the route's namespace.
fn is_service(b: &Value, name: &str) -> bool {
    b["name"] == name
        && b["group"].as_str().unwrap_or("").is_empty()
        && b["kind"].as_str().unwrap_or("Service") == "Service"
        && b.get("namespace").is_none_or(Value::is_null)
}

/// The weight as written (absent means 1 to the data plane).
fn written_weight(b: &Value) -> Option<i32> {
    b["weight"].as_i64().and_then(|w| i32::try_from(w).ok())
}

fn backend<'a>(route: &'a DynamicObject, rule: usize, service: &str) -> Option<&'a Value> {
    rules(route).get(rule)?["backendRefs"]
        .as_array()?
        .iter()
        .find(|b| is_service(b, service))
}

impl RouteKind for Grpc {
    type Route = DynamicObject;

    const KIND: &'static str = "GRPCRoute";
    const PLURAL: &'static str = "grpcroutes";
    const CRD: &'static str = "grpcroutes.gateway.networking.k8s.io";

    fn api(client: Client, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = Self::api_resource();
        match namespace {
            Some(ns) => Api::namespaced_with(client, ns, &ar),
            None => Api::all_with(client, &ar),
        }
    }

    fn rule_count(route: &DynamicObject) -> usize {
        rules(route).len()
    }

    fn rule_name(route: &DynamicObject, rule: usize) -> Option<&str> {
        rules(route).get(rule)?["name"].as_str()
    }

    fn has_backend(route: &DynamicObject, rule: usize, service: &str) -> bool {
        backend(route, rule, service).is_some()
    }

    fn weight_share_percent(route: &DynamicObject, rule: usize, service: &str) -> f64 {
        let effective = |b: &Value| i64::from(written_weight(b).unwrap_or(1));
        let total: i64 = rules(route)
            .get(rule)
            .and_then(|r| r["backendRefs"].as_array())
            .into_iter()
            .flatten()
            .map(effective)
            .sum();
        match backend(route, rule, service) {
            Some(b) if total > 0 => 100.0 * effective(b) as f64 / total as f64,
            _ => 0.0,
        }
    }

    fn weight(route: &DynamicObject, rule: usize, service: &str) -> Option<Option<i32>> {
        backend(route, rule, service).map(written_weight)
    }

    fn set_weight(route: &mut DynamicObject, rule: usize, service: &str, weight: i32) -> bool {
        let backend = route.data["spec"]["rules"]
            .as_array_mut()
            .and_then(|rules| rules.get_mut(rule))
            .and_then(|r| r["backendRefs"].as_array_mut())
            .and_then(|refs| refs.iter_mut().find(|b| is_service(b, service)))
            .and_then(Value::as_object_mut);
        match backend {
            Some(b) => {
                b.insert("weight".into(), Value::from(weight));
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::route;

    /// A GRPCRoute as Gateway API v1.6.1 allows it, with a field no release defines.
    fn doc() -> Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GRPCRoute",
            "metadata": {
                "name": "payments",
                "namespace": "shop",
                "annotations": {"team": "payments"},
                "resourceVersion": "41"
            },
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
                            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "grpc"}]}},
                            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 9000}, "percent": 5}}
                        ],
                        "backendRefs": [
                            {"name": "payments-stable", "port": 9000, "weight": 100, "filters": []},
                            {"name": "payments-canary", "port": 9000, "weight": 0},
                            {"name": "payments-canary", "namespace": "other", "port": 9000, "weight": 7},
                            {"name": "audit", "port": 9000}
                        ],
                        "futureField": {"kept": true}
                    },
                    {"matches": [{"method": {"service": "pay.v1.Health"}}], "backendRefs": [{"name": "health", "port": 9000}]}
                ],
                "futureSpecField": 3
            },
            "status": {"parents": []}
        })
    }

    fn grpc_route() -> DynamicObject {
        serde_json::from_value(doc()).expect("a GRPCRoute parses as a dynamic object")
    }

    #[test]
    fn the_resource_matches_the_released_crd() {
        let ar = Grpc::api_resource();
        assert_eq!(ar.api_version, "gateway.networking.k8s.io/v1");
        assert_eq!(ar.kind, "GRPCRoute");
        assert_eq!(ar.plural, "grpcroutes");
        assert_eq!(Grpc::CRD, format!("{}.{}", Grpc::PLURAL, Grpc::GROUP));
        assert_eq!(Grpc::describe("payments"), "GRPCRoute payments");
    }

    #[test]
    fn reading_weights_finds_the_services_of_the_route_namespace() {
        let r = grpc_route();
        assert_eq!(Grpc::rule_count(&r), 2);
        assert_eq!(Grpc::rule_name(&r, 0), Some("charge"));
        assert_eq!(Grpc::rule_name(&r, 1), None);
        assert_eq!(Grpc::rule_by_name(&r, "charge"), Some(0));
        assert_eq!(Grpc::rules_with_backend(&r, "payments-stable"), vec![0]);
        assert_eq!(Grpc::weight(&r, 0, "payments-stable"), Some(Some(100)));
        assert_eq!(Grpc::weight(&r, 0, "payments-canary"), Some(Some(0)));
        assert_eq!(Grpc::weight(&r, 0, "audit"), Some(None));
        assert_eq!(Grpc::weight(&r, 1, "payments-canary"), None);
        // 100 + 0 + 7 (other namespace, still weighted) + 1 (absent weight).
        assert_eq!(
            Grpc::weight_share_percent(&r, 0, "payments-stable"),
            100.0 * 100.0 / 108.0
        );
        assert_eq!(Grpc::weight_share_percent(&r, 0, "payments-canary"), 0.0);
        assert_eq!(Grpc::weight_share_percent(&r, 1, "payments-canary"), 0.0);
    }

    #[test]
    fn writing_weights_changes_nothing_else() {
        let mut r = grpc_route();
        assert!(Grpc::set_weight(&mut r, 0, "payments-stable", 90));
        assert!(Grpc::set_weight(&mut r, 0, "payments-canary", 10));
        assert!(Grpc::set_weight(&mut r, 0, "audit", 0));
        assert!(!Grpc::set_weight(&mut r, 1, "payments-canary", 10));
        assert!(!Grpc::set_weight(&mut r, 7, "payments-stable", 10));
        let mut expect = doc();
        let refs = &mut expect["spec"]["rules"][0]["backendRefs"];
        refs[0]["weight"] = json!(90);
        refs[1]["weight"] = json!(10);
        refs[3]["weight"] = json!(0);
        assert_eq!(serde_json::to_value(&r).unwrap(), expect);
        assert_eq!(
            Grpc::weight_share_percent(&r, 0, "payments-canary"),
            10.0 / 107.0 * 100.0
        );
    }

    #[test]
    fn ownership_is_taken_and_handed_back_like_any_route() {
        let mut r = grpc_route();
        route::set_owner(&mut r, "shop/payments");
        assert_eq!(
            route::owner_of(&r),
            Some(("shop".into(), "payments".into()))
        );
        let back = route::without_owner(&r);
        assert_eq!(serde_json::to_value(&back).unwrap(), doc());
    }

    #[test]
    fn the_managed_rule_is_located_by_name_or_stable_backend() {
        let r = grpc_route();
        let none = |_: Option<&str>| false;
        assert_eq!(route::locate::<Grpc>(&r, Some("charge"), "x", none), Ok(0));
        assert_eq!(
            route::locate::<Grpc>(&r, None, "payments-stable", none),
            Ok(0)
        );
        assert_eq!(
            route::locate::<Grpc>(&r, None, "missing", none),
            Err(route::Located::NoStableBackend)
        );
        assert_eq!(
            route::locate::<Grpc>(&r, Some("absent"), "payments-stable", none),
            Err(route::Located::NoRuleNamed)
        );
    }
}
