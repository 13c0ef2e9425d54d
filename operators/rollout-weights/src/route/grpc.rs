//! GRPCRoute (gateway.networking.k8s.io/v1, Gateway API v1.6.1 standard channel), the second
//! [`RouteKind`], driven by weight steps, header-cohort steps and mirror steps that name their
//! gRPC methods (validation refuses a mirror step without `grpcMethods`: gRPC has no idempotent
//! verb, so only the methods the Rollout declares safe to receive twice are mirrored). A
//! GRPCRoute is handled as a dynamic object: only `spec.rules[].name`,
//! `spec.rules[].backendRefs[]` (name, group, kind, namespace, weight), the managed rule's
//! `matches[]` (method and headers) and, to rule out a clash, the other rules' matches and the
//! routes' parentRefs and hostnames are read. Only a backendRef's `weight` is written (and the
//! canary's backendRef added when a live weight needs it), plus this operator's rules, placed
//! just before the managed rule:
//!
//! - the cohort rule `sluice-cohort` while a header-cohort step runs (or is kept): a copy of the
//!   managed rule whose every match also requires the cohort header (a `GRPCHeaderMatch`), sending
//!   to the canary Service only. GRPCRoute precedence ranks the service, then the method, then
//!   the number of header matches, so one header more outranks the managed rule's match; while
//!   the mirror rule is there it also holds each mirrored method with the header, since an
//!   exact method outranks any header count (a cohort call of a mirrored method would otherwise
//!   land on the mirror rule, on stable);
//! - the mirror rule `sluice-mirror` while a mirror step runs: a copy of the managed rule whose
//!   matches are narrowed to the mirrored methods (`method: {type: Exact, service, method}`),
//!   with a `RequestMirror` filter to the canary Service.
//!
//! Everything else (parentRefs, hostnames, other matches, filters, other backendRefs' fields,
//! unknown fields) stays as read. Never does I/O.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::{Map, Value, json};
use sluice_api::{
    external::http_route::{FILTER_REQUEST_MIRROR, MAX_BACKEND_REFS, ParentReference},
    v1alpha1::{
        RolloutSpec,
        rollout::{GrpcMethod, HeaderMatch, HeaderMatchType, reasons},
    },
};

use super::{Driven, RouteKind};
use crate::{
    decide::{RouteObs, RouteState, desired_at},
    observe, route,
    route_edit::{
        self, Attachment, COHORT_RULE, CrdSupport, Desired, EditError, MIRROR_RULE, Target,
    },
};

/// Most rules a GRPCRoute holds (the v1.6.1 CRD's `maxItems`).
const MAX_RULES: usize = 16;
/// Most matches one GRPCRoute rule holds (v1.6.1).
const MAX_RULE_MATCHES: usize = 64;
/// Most matches across a GRPCRoute's rules (the v1.6.1 CRD's rule on `spec.rules`).
const MAX_MATCHES: usize = 128;

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
/// (stable gets the rest), the cohort and mirror rules present exactly when `desired.cohort`
/// and `desired.mirror` ask for them, and ownership taken; every other field is carried over
/// unchanged. Like the HTTPRoute editor: another weighted backend of the managed rule is
/// refused (or set to 0 with `zeroOtherBackends`) unless the weight is 0, the canary's
/// backendRef is added only for a live weight, a cohort header the managed rule already
/// matches on is refused, and a mirror rule that would take requests another rule of the route
/// serves today is refused.
pub fn apply(
    route: &DynamicObject,
    target: &Target,
    desired: &Desired,
    crd: CrdSupport,
) -> Result<DynamicObject, EditError> {
    let name = route_name(route);
    if desired.cohort.is_some() && !crd.rule_name {
        return Err(EditError::FieldPruned {
            kind: Grpc::KIND,
            field: "spec.rules[].name",
            what: "headerCohort",
        });
    }
    if let Some(m) = &desired.mirror {
        let pruned = if !crd.rule_name {
            Some("spec.rules[].name")
        } else if m.percent < 100 && !crd.mirror_percent {
            Some("spec.rules[].filters[].requestMirror.percent")
        } else {
            None
        };
        if let Some(field) = pruned {
            return Err(EditError::FieldPruned {
                kind: Grpc::KIND,
                field,
                what: "mirror",
            });
        }
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
    if desired.cohort.is_some() || desired.mirror.is_some() {
        with_our_rules(&mut out, index, target, desired, &name)?;
    } else {
        without_our_rules(&mut out);
    }
    route::set_owner(&mut out, &target.owner);
    Ok(out)
}

/// Whether a rule is one this operator adds.
fn is_ours(rule: &Value) -> bool {
    route_edit::ours(rule["name"].as_str())
}

/// The route without the rules this operator adds.
fn without_our_rules(route: &mut DynamicObject) {
    if let Some(rules) = route.data["spec"]["rules"].as_array_mut() {
        rules.retain(|r| !is_ours(r));
    }
}

/// The matches of a rule; a rule without any matches every request (one empty match).
fn matches_of(rule: &Value) -> Vec<Value> {
    match rule["matches"].as_array() {
        Some(m) if !m.is_empty() => m.clone(),
        _ => vec![json!({})],
    }
}

/// A match's method part as (type, service, method), `None` when it matches every method.
fn method_of(m: &Value) -> Option<(&str, Option<&str>, Option<&str>)> {
    let method = m.get("method").filter(|v| v.is_object())?;
    let part = |k: &str| method[k].as_str().filter(|v| !v.is_empty());
    Some((
        method["type"].as_str().unwrap_or("Exact"),
        part("service"),
        part("method"),
    ))
}

/// The mirror rule's matches: each match of the managed rule narrowed to each mirrored method
/// it covers. A match without a method part covers every method, an Exact one the methods it
/// names (a service alone: every method of it); a RegularExpression one is not narrowed, so
/// nothing it matches is mirrored.
fn mirror_matches(base: &[Value], methods: &[GrpcMethod]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for b in base {
        for g in methods {
            let covers = match method_of(b) {
                None => true,
                Some(("Exact", service, method)) => {
                    service.is_none_or(|s| s == g.service) && method.is_none_or(|m| m == g.method)
                }
                Some(_) => false,
            };
            if !covers {
                continue;
            }
            let mut m = b.clone();
            m["method"] = json!({"type": "Exact", "service": g.service, "method": g.method});
            if !out.contains(&m) {
                out.push(m);
            }
        }
    }
    out
}

/// Whether the generated mirror match `mirror` (an exact service and method) would win a
/// request that `other`, a match of another rule, wins today. GRPCRoute precedence: the longest
/// matching service, then the longest matching method, then the most header matches, across
/// every route on a parent and hostname. A match naming another service or method never meets
/// the mirrored requests; one naming the same service and method loses them only with fewer
/// header matches; one that names less (no method part, a service or a method alone) loses
/// them; a regular expression may match them, so it counts as losing them.
fn mirror_captures(mirror: &Value, other: &Value) -> bool {
    let named = |k: &str| mirror["method"][k].as_str();
    let headers = |m: &Value| m["headers"].as_array().map_or(0, Vec::len);
    match method_of(other) {
        None => true,
        Some(("Exact", service, method)) => {
            if service.is_some_and(|s| Some(s) != named("service"))
                || method.is_some_and(|m| Some(m) != named("method"))
            {
                return false;
            }
            service.is_none() || method.is_none() || headers(other) <= headers(mirror)
        }
        Some(_) => true,
    }
}

/// The first match of `rules` (skipping `managed` and this operator's rules) that a generated
/// match would take requests from, as (rule name or index, the mirrored method).
fn captured<'a>(
    rules: &[Value],
    managed: Option<usize>,
    generated: &'a [Value],
) -> Option<(String, &'a Value)> {
    rules.iter().enumerate().find_map(|(i, rule)| {
        if Some(i) == managed || is_ours(rule) {
            return None;
        }
        let name = rule["name"]
            .as_str()
            .map_or_else(|| format!("#{i}"), str::to_owned);
        matches_of(rule).iter().find_map(|m| {
            generated
                .iter()
                .find(|g| mirror_captures(g, m))
                .map(|g| (name.clone(), g))
        })
    })
}

fn capture_error(route: &str, whose: String, rule: String, generated: &Value) -> EditError {
    let part = |k: &str| {
        generated["method"][k]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    EditError::GrpcMirrorWouldCapture {
        route: route.to_owned(),
        whose,
        rule,
        service: part("service"),
        method: part("method"),
    }
}

/// `m` also requiring the cohort header.
fn with_header(m: &Value, header: &HeaderMatch) -> Value {
    let mut m = m.clone();
    let h = json!({
        "type": match header.match_type {
            HeaderMatchType::Exact => "Exact",
            HeaderMatchType::RegularExpression => "RegularExpression",
        },
        "name": header.name,
        "value": header.value,
    });
    match m["headers"].as_array_mut() {
        Some(headers) => headers.push(h),
        None => m["headers"] = json!([h]),
    }
    m
}

/// The canary Service as a backendRef of a rule this operator adds (its port from the managed
/// rule's stable backendRef, as the weighted one).
fn canary_ref(managed: &Value, target: &Target) -> Map<String, Value> {
    let stable = managed["backendRefs"]
        .as_array()
        .and_then(|refs| refs.iter().find(|b| is_service(b, &target.stable)));
    let mut backend = Map::new();
    backend.insert("group".into(), Value::from(""));
    backend.insert("kind".into(), Value::from("Service"));
    backend.insert("name".into(), Value::from(target.canary.clone()));
    if let Some(port) = canary_backend(stable, target, 0).get("port") {
        backend.insert("port".into(), port.clone());
    }
    backend
}

/// Rebuilds this operator's rules from the managed rule (index `index`, already weighted), in
/// the order cohort, mirror, managed: the cohort rule when `desired.cohort` asks for it (the
/// managed rule's matches and, with a mirror, each mirrored method, every one with the cohort
/// header; the canary Service its only backendRef), the mirror rule when `desired.mirror` does
/// (its matches narrowed to the mirrored methods, a RequestMirror filter to the canary added).
fn with_our_rules(
    route: &mut DynamicObject,
    index: usize,
    target: &Target,
    desired: &Desired,
    name: &str,
) -> Result<(), EditError> {
    let mut kept: Vec<Value> = Vec::new();
    let mut managed_at = 0;
    for (i, r) in rules(route).iter().enumerate() {
        if is_ours(r) {
            continue;
        }
        if i == index {
            managed_at = kept.len();
        }
        kept.push(r.clone());
    }
    let managed = kept[managed_at].clone();
    let base = matches_of(&managed);
    let generated = match &desired.mirror {
        Some(mirror) => {
            let generated = mirror_matches(&base, &mirror.grpc_methods);
            if generated.is_empty() {
                return Err(EditError::MirrorMatchesNothing {
                    route: name.to_owned(),
                    methods: mirror
                        .grpc_methods
                        .iter()
                        .map(|g| format!("{}/{}", g.service, g.method))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            if let Some((rule, g)) = captured(&kept, Some(managed_at), &generated) {
                return Err(capture_error(name, "this route".into(), rule, g));
            }
            generated
        }
        None => Vec::new(),
    };
    let mut added: Vec<(&'static str, Value)> = Vec::new();
    if let Some(header) = &desired.cohort {
        let taken = base.iter().any(|m| {
            m["headers"].as_array().into_iter().flatten().any(|h| {
                h["name"]
                    .as_str()
                    .is_some_and(|n| n.eq_ignore_ascii_case(&header.name))
            })
        });
        if taken {
            return Err(EditError::CohortHeaderTaken {
                kind: Grpc::KIND,
                route: name.to_owned(),
                header: header.name.clone(),
            });
        }
        let full = base
            .iter()
            .any(|m| m["headers"].as_array().map_or(0, Vec::len) >= route_edit::MAX_MATCH_HEADERS);
        if full {
            return Err(EditError::CohortHeaderNoRoom {
                kind: Grpc::KIND,
                route: name.to_owned(),
                max: route_edit::MAX_MATCH_HEADERS,
            });
        }
        let mut matches: Vec<Value> = base.iter().map(|m| with_header(m, header)).collect();
        for g in generated.iter().filter(|g| !base.contains(g)) {
            matches.push(with_header(g, header));
        }
        let mut backend = canary_ref(&managed, target);
        backend.insert("weight".into(), Value::from(1));
        let mut rule = managed.clone();
        rule["name"] = Value::from(COHORT_RULE);
        rule["matches"] = Value::Array(matches);
        rule["backendRefs"] = json!([Value::Object(backend)]);
        added.push(("headerCohort", rule));
    }
    if let Some(mirror) = &desired.mirror {
        let mut request_mirror = Map::new();
        request_mirror.insert(
            "backendRef".into(),
            Value::Object(canary_ref(&managed, target)),
        );
        if mirror.percent < 100 {
            request_mirror.insert("percent".into(), Value::from(mirror.percent));
        }
        let mut rule = managed;
        rule["name"] = Value::from(MIRROR_RULE);
        rule["matches"] = Value::Array(generated);
        let filter = json!({"type": FILTER_REQUEST_MIRROR, "requestMirror": request_mirror});
        match rule["filters"].as_array_mut() {
            Some(filters) => filters.push(filter),
            None => rule["filters"] = json!([filter]),
        }
        added.push(("mirror", rule));
    }
    for (what, rule) in added {
        let count = matches_of(&rule).len();
        kept.insert(managed_at, rule);
        managed_at += 1;
        let matches: usize = kept.iter().map(|r| matches_of(r).len()).sum();
        if kept.len() > MAX_RULES || matches > MAX_MATCHES || count > MAX_RULE_MATCHES {
            return Err(EditError::RouteFull {
                kind: Grpc::KIND,
                route: name.to_owned(),
                what,
                rules: kept.len(),
                matches,
                max_rules: MAX_RULES,
                max_matches: MAX_MATCHES,
            });
        }
    }
    route.data["spec"]["rules"] = Value::Array(kept);
    Ok(())
}

/// Where a GRPCRoute attaches (parentRefs and hostnames read as Gateway API defines them;
/// entries that do not parse are left out).
fn attachment(route: &DynamicObject) -> Attachment {
    let spec = &route.data["spec"];
    Attachment {
        namespace: route.metadata.namespace.clone().unwrap_or_default(),
        parents: spec["parentRefs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| serde_json::from_value::<ParentReference>(p.clone()).ok())
            .collect(),
        hostnames: spec["hostnames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str().map(str::to_owned))
            .collect(),
    }
}

/// Refuses a mirror that would take requests from a rule of another GRPCRoute on the same
/// parent and hostname (`others`; the route itself is skipped). The route's own rules are
/// checked by [`apply`].
pub fn mirror_clash(
    route: &DynamicObject,
    others: &[DynamicObject],
    target: &Target,
    desired: &Desired,
) -> Result<(), EditError> {
    let Some(mirror) = &desired.mirror else {
        return Ok(());
    };
    let index = route_edit::locate_in::<Grpc>(route, target)?;
    let generated = mirror_matches(&matches_of(&rules(route)[index]), &mirror.grpc_methods);
    let name = route_name(route);
    let here = attachment(route);
    for other in others {
        let same = other.metadata.name == route.metadata.name
            && other.metadata.namespace == route.metadata.namespace;
        if same || !here.shared_with(&attachment(other)) {
            continue;
        }
        if let Some((rule, g)) = captured(rules(other), None, &generated) {
            let whose = format!(
                "GRPCRoute {} on the same parent and hostname",
                route_name(other)
            );
            return Err(capture_error(&name, whose, rule, g));
        }
    }
    Ok(())
}

impl Driven for Grpc {
    fn dynamic_type() -> ApiResource {
        Self::api_resource()
    }

    fn observe(
        route: &DynamicObject,
        others: &[DynamicObject],
        target: &Target,
        spec: &RolloutSpec,
        crd: CrdSupport,
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
            cohort: Self::rule_by_name(route, COHORT_RULE).is_some(),
            mirror: Self::rule_by_name(route, MIRROR_RULE).is_some(),
            last_writer: observe::rules_writer(&route.metadata),
        };
        for index in 0..spec.steps.len() {
            let desired = desired_at(spec, index);
            let fits = apply(route, target, &desired, crd)
                .and_then(|_| mirror_clash(route, others, target, &desired));
            if let Err(e) = fits {
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
        crd: CrdSupport,
    ) -> Result<DynamicObject, EditError> {
        apply(route, target, desired, crd)
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
    use crate::{route, route_edit::Mirror};

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
        let out = apply(&r, &target("payments-canary"), &weight(10), CrdSupport::ALL).unwrap();
        let mut expect = two_backends();
        expect["metadata"]["annotations"][sluice_api::v1alpha1::rollout::ROUTE_OWNER_ANNOTATION] =
            json!("shop/payments");
        let refs = &mut expect["spec"]["rules"][0]["backendRefs"];
        refs[0]["weight"] = json!(90);
        refs[1]["weight"] = json!(10);
        assert_eq!(serde_json::to_value(&out).unwrap(), expect);
        // The same state again is the same route: no write.
        assert_eq!(
            apply(
                &out,
                &target("payments-canary"),
                &weight(10),
                CrdSupport::ALL
            ),
            Ok(out.clone())
        );
        // Abort: canary 0, stable 100, still owned.
        let aborted = apply(
            &out,
            &target("payments-canary"),
            &Desired::abort(),
            CrdSupport::ALL,
        )
        .unwrap();
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
        let owned = apply(&r, &t, &weight(0), CrdSupport::ALL).unwrap();
        assert_eq!(owned.data["spec"], d["spec"]);
        let live = apply(&r, &t, &weight(5), CrdSupport::ALL).unwrap();
        let refs = &live.data["spec"]["rules"][0]["backendRefs"];
        assert_eq!(refs[0]["weight"], 95);
        assert_eq!(
            refs[1],
            json!({"group": "", "kind": "Service", "name": "payments-next", "port": 9000, "weight": 5})
        );
        assert_eq!(refs.as_array().unwrap().len(), 2);
    }

    #[test]
    fn another_weighted_backend_is_refused_or_zeroed_and_a_cohort_header_taken_is_refused() {
        let r = grpc_route();
        let t = target("payments-canary");
        let err = apply(&r, &t, &weight(5), CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), reasons::OTHER_BACKEND_WEIGHTED);
        assert!(err.to_string().starts_with("GRPCRoute payments: the managed rule also sends to Service payments-canary with weight 7"), "{err}");
        // Weight 0 only takes from the canary: never refused.
        assert!(apply(&r, &t, &Desired::abort(), CrdSupport::ALL).is_ok());
        let zeroing = Target {
            zero_other_backends: true,
            ..t.clone()
        };
        let out = apply(&r, &zeroing, &weight(5), CrdSupport::ALL).unwrap();
        let refs = &out.data["spec"]["rules"][0]["backendRefs"];
        assert_eq!(
            refs.as_array()
                .unwrap()
                .iter()
                .map(|b| b["weight"].clone())
                .collect::<Vec<_>>(),
            vec![json!(95), json!(5), json!(0), json!(0)]
        );
        // The managed rule already matches on x-tenant: a cohort on it cannot be told apart.
        let taken = Desired {
            cohort: Some(
                serde_json::from_value(json!({"name": "X-Tenant", "value": "staff"})).unwrap(),
            ),
            ..weight(0)
        };
        let err = apply(&r, &t, &taken, CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), "InvalidSpec");
        assert_eq!(
            err.to_string(),
            "GRPCRoute payments: the managed rule already matches on header X-Tenant; choose another cohort header"
        );
        // A match at the CRD's 16 header matches has no room for the cohort header.
        let mut full = r.clone();
        full.data["spec"]["rules"][0]["matches"][0]["headers"] = (0..16)
            .map(|i| json!({"name": format!("x-h{i}"), "value": "1"}))
            .collect();
        let cohort = Desired {
            cohort: Some(
                serde_json::from_value(json!({"name": "x-cohort", "value": "staff"})).unwrap(),
            ),
            ..weight(0)
        };
        let err = apply(&full, &t, &cohort, CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), "RouteFull");
        assert_eq!(
            err.to_string(),
            "GRPCRoute payments: a match of the managed rule already has 16 header matches, the most a match may hold, so the cohort header cannot be added to it; remove the headerCohort step or match on fewer headers"
        );
        let missing = Target {
            rule_name: Some("refund".into()),
            ..t
        };
        let err = apply(&r, &missing, &weight(5), CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), "RouteNotFound");
        assert!(
            err.to_string()
                .starts_with("GRPCRoute payments: no rule named refund"),
            "{err}"
        );
    }

    /// A GRPCRoute serving the Ledger service (read and write methods) and a health check.
    fn ledger() -> Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GRPCRoute",
            "metadata": {"name": "ledger", "namespace": "shop", "resourceVersion": "7"},
            "spec": {
                "parentRefs": [{"name": "mesh-edge"}],
                "hostnames": ["ledger.example.com"],
                "rules": [
                    {
                        "name": "ledger",
                        "matches": [
                            {"method": {"service": "pay.v1.Ledger"}},
                            {"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "Post"}, "headers": [{"name": "x-tenant", "value": "a"}]}
                        ],
                        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "grpc"}]}}],
                        "backendRefs": [
                            {"name": "payments-stable", "port": 9000, "weight": 100},
                            {"name": "payments-canary", "port": 9000, "weight": 0}
                        ]
                    },
                    {
                        "name": "health",
                        "matches": [{"method": {"service": "grpc.health.v1.Health", "method": "Check"}}],
                        "backendRefs": [{"name": "health", "port": 9000}]
                    }
                ]
            }
        })
    }

    fn grpc_method(service: &str, method: &str) -> GrpcMethod {
        GrpcMethod {
            service: service.into(),
            method: method.into(),
        }
    }

    fn mirroring(percent: u32, methods: &[(&str, &str)]) -> Desired {
        Desired {
            mirror: Some(Mirror {
                percent,
                methods: Vec::new(),
                grpc_methods: methods.iter().map(|(s, m)| grpc_method(s, m)).collect(),
            }),
            ..weight(0)
        }
    }

    fn ledger_target() -> Target {
        Target {
            rule_name: None,
            ..target("payments-canary")
        }
    }

    #[test]
    fn a_mirror_step_adds_one_rule_narrowed_to_the_declared_methods_and_abort_removes_it() {
        let r: DynamicObject = serde_json::from_value(ledger()).unwrap();
        let t = ledger_target();
        let d = mirroring(
            10,
            &[
                ("pay.v1.Ledger", "GetBalance"),
                ("pay.v1.Ledger", "ListEntries"),
                // Not served by the managed rule: nothing of it is mirrored.
                ("pay.v1.Payments", "Get"),
            ],
        );
        let out = apply(&r, &t, &d, CrdSupport::ALL).unwrap();
        let rules = out.data["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 3, "{rules:#?}");
        // The mirror rule: the managed rule (backends, filters) with the matches narrowed to
        // the declared methods and a RequestMirror filter to the canary, just before it.
        let mut expect = ledger()["spec"]["rules"][0].clone();
        expect["name"] = json!("sluice-mirror");
        expect["matches"] = json!([
            {"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "GetBalance"}},
            {"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "ListEntries"}}
        ]);
        expect["filters"].as_array_mut().unwrap().push(json!({
            "type": "RequestMirror",
            "requestMirror": {
                "backendRef": {"group": "", "kind": "Service", "name": "payments-canary", "port": 9000},
                "percent": 10
            }
        }));
        assert_eq!(rules[0], expect);
        assert_eq!(rules[1], ledger()["spec"]["rules"][0]);
        assert_eq!(rules[2], ledger()["spec"]["rules"][1]);
        // The same state again is the same route: no write.
        assert_eq!(apply(&out, &t, &d, CrdSupport::ALL), Ok(out.clone()));
        // At 100 percent the filter carries no percent (every matching request is copied).
        let all = apply(
            &r,
            &t,
            &mirroring(100, &[("pay.v1.Ledger", "GetBalance")]),
            CrdSupport::ALL,
        )
        .unwrap();
        assert_eq!(
            all.data["spec"]["rules"][0]["filters"][1]["requestMirror"],
            json!({"backendRef": {"group": "", "kind": "Service", "name": "payments-canary", "port": 9000}})
        );
        // Abort: the mirror rule goes in the same write; everything else is as read.
        let aborted = apply(&out, &t, &Desired::abort(), CrdSupport::ALL).unwrap();
        assert_eq!(aborted.data["spec"], ledger()["spec"]);
        let spec: RolloutSpec = serde_json::from_value(json!({
            "routeRef": {"kind": "GRPCRoute", "name": "ledger"},
            "stableService": {"name": "payments-stable"},
            "canaryService": {"name": "payments-canary"},
            "canaryWorkload": {"name": "payments-canary"},
            "steps": [
                {"mirror": {"percent": 10, "grpcMethods": [{"service": "pay.v1.Ledger", "method": "GetBalance"}]}},
                {"setWeight": {"weight": 5}}
            ]
        }))
        .unwrap();
        let RouteObs::Present(state) = Grpc::observe(&out, &[], &t, &spec, CrdSupport::ALL) else {
            panic!("governable")
        };
        assert!(state.mirror);
        let RouteObs::Present(state) = Grpc::observe(&aborted, &[], &t, &spec, CrdSupport::ALL)
        else {
            panic!("governable")
        };
        assert!(!state.mirror);
    }

    fn cohort(d: Desired) -> Desired {
        Desired {
            cohort: Some(
                serde_json::from_value(json!({"name": "x-cohort", "value": "staff"})).unwrap(),
            ),
            ..d
        }
    }

    /// The ledger's spec with `steps`.
    fn ledger_spec(steps: Value) -> RolloutSpec {
        serde_json::from_value(json!({
            "routeRef": {"kind": "GRPCRoute", "name": "ledger"},
            "stableService": {"name": "payments-stable"},
            "canaryService": {"name": "payments-canary"},
            "canaryWorkload": {"name": "payments-canary"},
            "steps": steps
        }))
        .unwrap()
    }

    #[test]
    fn a_cohort_step_adds_one_rule_with_the_header_on_every_match_and_abort_removes_it() {
        let r: DynamicObject = serde_json::from_value(ledger()).unwrap();
        let t = ledger_target();
        let d = cohort(weight(0));
        let out = apply(&r, &t, &d, CrdSupport::ALL).unwrap();
        let rules = out.data["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 3, "{rules:#?}");
        // The cohort rule: the managed rule (filters kept) whose every match also requires the
        // cohort header, sending to the canary only, just before it.
        let mut expect = ledger()["spec"]["rules"][0].clone();
        expect["name"] = json!("sluice-cohort");
        expect["matches"] = json!([
            {"method": {"service": "pay.v1.Ledger"},
             "headers": [{"type": "Exact", "name": "x-cohort", "value": "staff"}]},
            {"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "Post"},
             "headers": [{"name": "x-tenant", "value": "a"}, {"type": "Exact", "name": "x-cohort", "value": "staff"}]}
        ]);
        expect["backendRefs"] = json!([
            {"group": "", "kind": "Service", "name": "payments-canary", "port": 9000, "weight": 1}
        ]);
        assert_eq!(rules[0], expect);
        // The managed rule and the other rule as read (no live weight yet).
        assert_eq!(rules[1], ledger()["spec"]["rules"][0]);
        assert_eq!(rules[2], ledger()["spec"]["rules"][1]);
        // The same state again is the same route: no write.
        assert_eq!(apply(&out, &t, &d, CrdSupport::ALL), Ok(out.clone()));
        // Kept into a 5% step: the cohort rule stays, the managed rule is weighted.
        let kept = apply(&out, &t, &cohort(weight(5)), CrdSupport::ALL).unwrap();
        assert_eq!(kept.data["spec"]["rules"][0], expect);
        assert_eq!(
            kept.data["spec"]["rules"][1]["backendRefs"],
            json!([
                {"name": "payments-stable", "port": 9000, "weight": 95},
                {"name": "payments-canary", "port": 9000, "weight": 5}
            ])
        );
        // Abort and a weight step without the cohort: the rule goes in the same write.
        let aborted = apply(&kept, &t, &Desired::abort(), CrdSupport::ALL).unwrap();
        assert_eq!(aborted.data["spec"], ledger()["spec"]);
        let weighted = apply(&out, &t, &weight(5), CrdSupport::ALL).unwrap();
        assert_eq!(weighted.data["spec"]["rules"].as_array().unwrap().len(), 2);
        // Observed as the cohort rule; its step fits the route.
        let spec = ledger_spec(json!([
            {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
            {"setWeight": {"weight": 5}}
        ]));
        let RouteObs::Present(state) = Grpc::observe(&out, &[], &t, &spec, CrdSupport::ALL) else {
            panic!("governable")
        };
        assert!(state.cohort && !state.mirror);
        let RouteObs::Present(state) = Grpc::observe(&aborted, &[], &t, &spec, CrdSupport::ALL)
        else {
            panic!("governable")
        };
        assert!(!state.cohort);
        // A CRD that prunes rule names cannot keep the rule apart.
        let pruning = CrdSupport {
            rule_name: false,
            mirror_percent: false,
        };
        let err = apply(&r, &t, &d, pruning).unwrap_err();
        assert_eq!(err.category(), "RouteFieldPruned");
    }

    #[test]
    fn with_a_mirror_the_cohort_rule_also_holds_each_mirrored_method_so_cohort_calls_reach_the_canary()
     {
        let r: DynamicObject = serde_json::from_value(ledger()).unwrap();
        let t = ledger_target();
        let d = cohort(mirroring(10, &[("pay.v1.Ledger", "GetBalance")]));
        let out = apply(&r, &t, &d, CrdSupport::ALL).unwrap();
        let rules = out.data["spec"]["rules"].as_array().unwrap();
        let names: Vec<&str> = rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["sluice-cohort", "sluice-mirror", "ledger", "health"]
        );
        // The mirrored method's exact match outranks any header count, so the cohort rule holds
        // it with the header too (one header more than the mirror rule's match).
        assert_eq!(
            rules[0]["matches"],
            json!([
                {"method": {"service": "pay.v1.Ledger"},
                 "headers": [{"type": "Exact", "name": "x-cohort", "value": "staff"}]},
                {"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "Post"},
                 "headers": [{"name": "x-tenant", "value": "a"}, {"type": "Exact", "name": "x-cohort", "value": "staff"}]},
                {"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "GetBalance"},
                 "headers": [{"type": "Exact", "name": "x-cohort", "value": "staff"}]}
            ])
        );
        assert_eq!(
            rules[1]["matches"],
            json!([{"method": {"type": "Exact", "service": "pay.v1.Ledger", "method": "GetBalance"}}])
        );
        assert_eq!(apply(&out, &t, &d, CrdSupport::ALL), Ok(out.clone()));
        let aborted = apply(&out, &t, &Desired::abort(), CrdSupport::ALL).unwrap();
        assert_eq!(aborted.data["spec"], ledger()["spec"]);
    }

    #[test]
    fn a_mirror_that_would_take_requests_another_rule_serves_is_refused() {
        let t = ledger_target();
        let d = mirroring(10, &[("pay.v1.Ledger", "GetBalance")]);
        // A catch-all rule of the same route: the mirror rule would outrank it.
        let mut doc = ledger();
        doc["spec"]["rules"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "fallback", "backendRefs": [{"name": "legacy", "port": 9000}]}));
        let r: DynamicObject = serde_json::from_value(doc).unwrap();
        let err = apply(&r, &t, &d, CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), "MirrorWouldCapture");
        assert_eq!(
            err.to_string(),
            "GRPCRoute ledger: rule fallback of this route matches service pay.v1.Ledger without \
             naming method GetBalance, so the mirror rule (method pay.v1.Ledger/GetBalance) would \
             take its requests under Gateway API precedence (a longer method match outranks \
             header matches, across every route on a parent and hostname); remove the mirror \
             step or give that rule its own method match"
        );
        // A rule naming the same method with more headers keeps its requests.
        let mut doc = ledger();
        doc["spec"]["rules"].as_array_mut().unwrap().push(json!({
            "name": "vip",
            "matches": [{"method": {"service": "pay.v1.Ledger", "method": "GetBalance"}, "headers": [{"name": "x-vip", "value": "1"}]}],
            "backendRefs": [{"name": "vip", "port": 9000}]
        }));
        let r: DynamicObject = serde_json::from_value(doc).unwrap();
        assert!(apply(&r, &t, &d, CrdSupport::ALL).is_ok());
        // Another GRPCRoute on the same parent and hostname serving the service without a
        // method: refused with its name; on another hostname it does not compete.
        let r: DynamicObject = serde_json::from_value(ledger()).unwrap();
        let other = |hostname: &str| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GRPCRoute",
                "metadata": {"name": "ledger-admin", "namespace": "shop"},
                "spec": {
                    "parentRefs": [{"name": "mesh-edge"}],
                    "hostnames": [hostname],
                    "rules": [{"matches": [{"method": {"service": "pay.v1.Ledger"}, "headers": [{"name": "x-admin", "value": "1"}]}], "backendRefs": [{"name": "admin", "port": 9000}]}]
                }
            }))
            .unwrap()
        };
        let err = mirror_clash(&r, &[r.clone(), other("ledger.example.com")], &t, &d).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "GRPCRoute ledger: rule #0 of GRPCRoute ledger-admin on the same parent and \
                 hostname matches service pay.v1.Ledger without naming method GetBalance"
            ),
            "{err}"
        );
        assert_eq!(
            mirror_clash(&r, &[other("admin.example.com")], &t, &d),
            Ok(())
        );
        assert_eq!(
            mirror_clash(&r, &[other("ledger.example.com")], &t, &weight(5)),
            Ok(())
        );
    }

    #[test]
    fn a_mirror_the_route_cannot_carry_says_why() {
        let r: DynamicObject = serde_json::from_value(ledger()).unwrap();
        let t = ledger_target();
        let err = apply(
            &r,
            &t,
            &mirroring(10, &[("pay.v1.Payments", "Get")]),
            CrdSupport::ALL,
        )
        .unwrap_err();
        assert_eq!(err.category(), "InvalidSpec");
        assert_eq!(
            err.to_string(),
            "GRPCRoute ledger: no match of the managed rule covers the mirrored methods \
             pay.v1.Payments/Get; name methods the rule serves in spec.steps[].mirror.grpcMethods"
        );
        let old = CrdSupport {
            rule_name: false,
            mirror_percent: false,
        };
        let err = apply(
            &r,
            &t,
            &mirroring(10, &[("pay.v1.Ledger", "GetBalance")]),
            old,
        )
        .unwrap_err();
        assert_eq!(err.category(), "RouteFieldPruned");
        assert_eq!(
            err.to_string(),
            "the installed GRPCRoute CRD prunes spec.rules[].name, which the mirror step needs; \
             install Gateway API CRDs v1.2 or later, or remove the step"
        );
        let no_percent = CrdSupport {
            mirror_percent: false,
            ..CrdSupport::ALL
        };
        assert!(
            apply(
                &r,
                &t,
                &mirroring(10, &[("pay.v1.Ledger", "GetBalance")]),
                no_percent
            )
            .is_err()
        );
        assert!(
            apply(
                &r,
                &t,
                &mirroring(100, &[("pay.v1.Ledger", "GetBalance")]),
                no_percent
            )
            .is_ok()
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
