//! GRPCRoute (gateway.networking.k8s.io/v1, Gateway API v1.6.1 standard channel), the second
//! [`RouteKind`], driven by weight steps only (validation refuses header-cohort and mirror steps
//! on it: gRPC has no idempotent method to mirror by). A GRPCRoute is handled as a dynamic
//! object: only `spec.rules[].name` and `spec.rules[].backendRefs[]` (name, group, kind,
//! namespace, weight) are read, only a backendRef's `weight` is written (and the canary's
//! backendRef added when a live weight needs it), and everything else (parentRefs, hostnames,
//! matches by `method`/`headers`, filters including `RequestMirror`, other backendRefs' fields,
//! unknown fields) stays as read. Never does I/O.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::{Map, Value};
use sluice_api::{
    external::http_route::MAX_BACKEND_REFS,
    v1alpha1::{RolloutSpec, rollout::reasons},
};

use super::{Driven, RouteKind};
use crate::{
    observe, route,
    route_edit::{self, CrdSupport, Desired, EditError, Target},
    step::{RouteObs, RouteState, desired_at},
};

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

fn route_name(route: &DynamicObject) -> String {
    route.metadata.name.clone().unwrap_or_default()
}

/// The canary's backendRef, after the stable one: `group` and `kind` spelled out as the CRD
/// defaults them, so the stored route equals what was written and a rewrite is a no-op.
fn canary_backend(stable: Option<&Value>, target: &Target, weight: i32) -> Value {
    let mut b = Map::new();
    b.insert("group".into(), Value::from(""));
    b.insert("kind".into(), Value::from("Service"));
    b.insert("name".into(), Value::from(target.canary.clone()));
    let port = target
        .canary_port
        .map(Value::from)
        .or_else(|| stable.and_then(|s| s.get("port")).cloned());
    if let Some(port) = port {
        b.insert("port".into(), port);
    }
    b.insert("weight".into(), Value::from(weight));
    Value::Object(b)
}

/// Returns the GRPCRoute with the managed rule's canary weight set to `desired.weight` percent
/// (stable gets the rest) and ownership taken; every other field is carried over unchanged.
/// Like the HTTPRoute editor: another weighted backend of the managed rule is refused (or set
/// to 0 with `zeroOtherBackends`) unless the weight is 0, and the canary's backendRef is added
/// only for a live weight.
pub fn apply(
    route: &DynamicObject,
    target: &Target,
    desired: &Desired,
) -> Result<DynamicObject, EditError> {
    let name = route_name(route);
    let unsupported = |what| EditError::Unsupported {
        kind: Grpc::KIND,
        route: name.clone(),
        what,
    };
    if desired.cohort.is_some() {
        return Err(unsupported("headerCohort"));
    }
    if desired.mirror.is_some() {
        return Err(unsupported("mirror"));
    }
    let index = route_edit::locate_in::<Grpc>(route, target)?;
    let canary = i32::try_from(desired.weight.min(100)).unwrap_or(100);
    let mut out = route.clone();
    let refs = out.data["spec"]["rules"][index]
        .get_mut("backendRefs")
        .and_then(Value::as_array_mut);
    if let Some(refs) = refs {
        for b in refs.iter_mut() {
            if is_service(b, &target.stable) || is_service(b, &target.canary) {
                continue;
            }
            let weight = written_weight(b).unwrap_or(1);
            if weight > 0 {
                if target.zero_other_backends {
                    b["weight"] = Value::from(0);
                } else if canary > 0 {
                    return Err(EditError::OtherBackendWeighted {
                        kind: Grpc::KIND,
                        route: name,
                        backend: b["name"].as_str().unwrap_or_default().to_owned(),
                        weight,
                    });
                }
            }
        }
        let has_canary = refs.iter().any(|b| is_service(b, &target.canary));
        if !has_canary && canary > 0 {
            if refs.len() >= MAX_BACKEND_REFS {
                return Err(EditError::NoBackendRoom {
                    kind: Grpc::KIND,
                    route: name,
                    canary: target.canary.clone(),
                });
            }
            let at = refs.iter().position(|b| is_service(b, &target.stable));
            let backend = canary_backend(at.map(|i| &refs[i]), target, canary);
            refs.insert(at.map_or(refs.len(), |i| i + 1), backend);
        }
        // With no canary backendRef and nothing to send it, the rule stays as it is.
        if has_canary || canary > 0 {
            Grpc::set_weight(&mut out, index, &target.canary, canary);
            Grpc::set_weight(&mut out, index, &target.stable, 100 - canary);
        }
    }
    route::set_owner(&mut out, &target.owner);
    Ok(out)
}

impl Driven for Grpc {
    fn dynamic_type() -> ApiResource {
        Self::api_resource()
    }

    fn observe(
        route: &DynamicObject,
        _others: &[DynamicObject],
        target: &Target,
        spec: &RolloutSpec,
        _crd: CrdSupport,
    ) -> RouteObs {
        let rule = match route_edit::locate_in::<Grpc>(route, target) {
            Ok(i) => i,
            Err(e) => {
                return RouteObs::Unusable {
                    reason: e.category(),
                    message: e.to_string(),
                    state: None,
                };
            }
        };
        // An absent weight is 1 to the data plane.
        let canary_weight = Self::weight(route, rule, &target.canary)
            .map_or(0, |w| u32::try_from(w.unwrap_or(1)).unwrap_or(0));
        let state = RouteState {
            resource_version: route.metadata.resource_version.clone(),
            owner: route::owner(route).cloned(),
            me: target.owner.clone(),
            canary_weight,
            cohort: false,
            mirror: false,
            last_writer: observe::rules_writer(&route.metadata),
        };
        for index in 0..spec.steps.len() {
            if let Err(e) = apply(route, target, &desired_at(spec, index)) {
                return RouteObs::Unusable {
                    reason: e.category(),
                    message: format!("step {index}: {e}"),
                    state: Some(state),
                };
            }
        }
        RouteObs::Present(state)
    }

    fn apply(
        route: &DynamicObject,
        target: &Target,
        desired: &Desired,
        _crd: CrdSupport,
    ) -> Result<DynamicObject, EditError> {
        apply(route, target, desired)
    }

    fn missing(name: &str) -> RouteObs {
        RouteObs::Unusable {
            reason: reasons::ROUTE_NOT_FOUND,
            message: format!(
                "{} not found in the Rollout's namespace",
                Self::describe(name)
            ),
            state: None,
        }
    }

    fn not_installed(name: &str) -> Option<RouteObs> {
        Some(RouteObs::Unusable {
            reason: reasons::ROUTE_NOT_FOUND,
            message: format!(
                "spec.routeRef names {}, but the {} CustomResourceDefinition is not installed; \
                 install the Gateway API CRDs (v1.1 or later, standard channel) or route with an \
                 HTTPRoute",
                Self::describe(name),
                Self::CRD
            ),
            state: None,
        })
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

    fn target(canary: &str) -> Target {
        Target {
            owner: "shop/payments".into(),
            stable: "payments-stable".into(),
            canary: canary.into(),
            canary_port: None,
            rule_name: Some("charge".into()),
            zero_other_backends: false,
        }
    }

    fn weight(w: u32) -> Desired {
        Desired {
            weight: w,
            cohort: None,
            mirror: None,
        }
    }

    /// The route with stable and canary as the managed rule's only backends.
    fn two_backends() -> Value {
        let mut d = doc();
        d["spec"]["rules"][0]["backendRefs"]
            .as_array_mut()
            .unwrap()
            .truncate(2);
        d
    }

    #[test]
    fn a_weight_sets_stable_and_canary_takes_ownership_and_changes_nothing_else() {
        let r: DynamicObject = serde_json::from_value(two_backends()).unwrap();
        let out = apply(&r, &target("payments-canary"), &weight(10)).unwrap();
        let mut expect = two_backends();
        expect["metadata"]["annotations"][sluice_api::v1alpha1::rollout::ROUTE_OWNER_ANNOTATION] =
            json!("shop/payments");
        let refs = &mut expect["spec"]["rules"][0]["backendRefs"];
        refs[0]["weight"] = json!(90);
        refs[1]["weight"] = json!(10);
        assert_eq!(serde_json::to_value(&out).unwrap(), expect);
        // The same state again is the same route: no write.
        assert_eq!(
            apply(&out, &target("payments-canary"), &weight(10)),
            Ok(out.clone())
        );
        // Abort: canary 0, stable 100, still owned.
        let aborted = apply(&out, &target("payments-canary"), &Desired::abort()).unwrap();
        let refs = &aborted.data["spec"]["rules"][0]["backendRefs"];
        assert_eq!(
            (refs[0]["weight"].clone(), refs[1]["weight"].clone()),
            (json!(100), json!(0))
        );
        assert_eq!(
            route::owner(&aborted).map(String::as_str),
            Some("shop/payments")
        );
    }

    #[test]
    fn the_canary_backend_is_added_after_stable_only_for_a_live_weight() {
        let mut d = two_backends();
        d["spec"]["rules"][0]["backendRefs"]
            .as_array_mut()
            .unwrap()
            .remove(1);
        let r: DynamicObject = serde_json::from_value(d.clone()).unwrap();
        let t = target("payments-next");
        // Weight 0 (ownership): nothing to send it, the rule stays as it is.
        let owned = apply(&r, &t, &weight(0)).unwrap();
        assert_eq!(owned.data["spec"], d["spec"]);
        let live = apply(&r, &t, &weight(5)).unwrap();
        let refs = &live.data["spec"]["rules"][0]["backendRefs"];
        assert_eq!(refs[0]["weight"], 95);
        assert_eq!(
            refs[1],
            json!({"group": "", "kind": "Service", "name": "payments-next", "port": 9000, "weight": 5})
        );
        assert_eq!(refs.as_array().unwrap().len(), 2);
    }

    #[test]
    fn another_weighted_backend_is_refused_or_zeroed_and_cohort_and_mirror_are_unsupported() {
        let r = grpc_route();
        let t = target("payments-canary");
        let err = apply(&r, &t, &weight(5)).unwrap_err();
        assert_eq!(err.category(), reasons::OTHER_BACKEND_WEIGHTED);
        assert!(err.to_string().starts_with("GRPCRoute payments: the managed rule also sends to Service payments-canary with weight 7"), "{err}");
        // Weight 0 only takes from the canary: never refused.
        assert!(apply(&r, &t, &Desired::abort()).is_ok());
        let zeroing = Target {
            zero_other_backends: true,
            ..t.clone()
        };
        let out = apply(&r, &zeroing, &weight(5)).unwrap();
        let refs = &out.data["spec"]["rules"][0]["backendRefs"];
        assert_eq!(
            refs.as_array()
                .unwrap()
                .iter()
                .map(|b| b["weight"].clone())
                .collect::<Vec<_>>(),
            vec![json!(95), json!(5), json!(0), json!(0)]
        );
        let cohort = Desired {
            cohort: Some(
                serde_json::from_value(json!({"name": "x-cohort", "value": "staff"})).unwrap(),
            ),
            ..weight(5)
        };
        let err = apply(&r, &t, &cohort).unwrap_err();
        assert_eq!(err.category(), "InvalidSpec");
        assert_eq!(
            err.to_string(),
            "GRPCRoute payments: a headerCohort step is not supported for a GRPCRoute; use setWeight steps"
        );
        let missing = Target {
            rule_name: Some("refund".into()),
            ..t
        };
        let err = apply(&r, &missing, &weight(5)).unwrap_err();
        assert_eq!(err.category(), "RouteNotFound");
        assert!(
            err.to_string()
                .starts_with("GRPCRoute payments: no rule named refund"),
            "{err}"
        );
    }

    #[test]
    fn the_observation_is_the_routes_state_or_why_it_cannot_be_governed() {
        let spec: RolloutSpec = serde_json::from_value(json!({
            "routeRef": {"kind": "GRPCRoute", "name": "payments", "ruleName": "charge"},
            "stableService": {"name": "payments-stable"},
            "canaryService": {"name": "payments-canary"},
            "canaryWorkload": {"name": "payments-canary"},
            "steps": [{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 50}}]
        }))
        .unwrap();
        let t = target("payments-canary");
        let ok: DynamicObject = serde_json::from_value(two_backends()).unwrap();
        let RouteObs::Present(state) = Grpc::observe(&ok, &[], &t, &spec, CrdSupport::ALL) else {
            panic!("governable")
        };
        assert_eq!(state.canary_weight, 0);
        assert_eq!(state.resource_version.as_deref(), Some("41"));
        assert_eq!(
            (state.owner, state.cohort, state.mirror),
            (None, false, false)
        );
        // Another weighted backend: the steps are refused, abort and hand-back still apply.
        let RouteObs::Unusable {
            reason,
            message,
            state,
        } = Grpc::observe(&grpc_route(), &[], &t, &spec, CrdSupport::ALL)
        else {
            panic!("not governable")
        };
        assert_eq!(reason, reasons::OTHER_BACKEND_WEIGHTED);
        assert!(
            message.starts_with("step 0: GRPCRoute payments:"),
            "{message}"
        );
        assert!(state.is_some());
        let RouteObs::Unusable {
            reason,
            message,
            state: None,
        } = Grpc::missing("payments")
        else {
            panic!()
        };
        assert_eq!(reason, reasons::ROUTE_NOT_FOUND);
        assert_eq!(
            message,
            "GRPCRoute payments not found in the Rollout's namespace"
        );
        let Some(RouteObs::Unusable {
            reason,
            message,
            state: None,
        }) = Grpc::not_installed("payments")
        else {
            panic!()
        };
        assert_eq!(reason, reasons::ROUTE_NOT_FOUND);
        assert!(
            message.contains(
                "grpcroutes.gateway.networking.k8s.io CustomResourceDefinition is not installed"
            ),
            "{message}"
        );
    }
}
