//! The route seam: every place the operator meets a Gateway API route goes through a
//! [`RouteKind`]. A kind names its API resource (group, version, kind, plural and the CRD that
//! installs it), builds the API handle the reconcile reads and writes and the triggers watch,
//! and reads and writes the weights of a rule's backendRefs. What is the same for every kind
//! lives here once: the ownership annotation (read, named owner, removed on hand-back) and
//! finding the managed rule.
//!
//! Implementations: [`http::Http`] (HTTPRoute, the default of a Rollout's `routeRef.kind`) and
//! [`grpc::Grpc`] (GRPCRoute: weight, header-cohort and mirror steps). Each kind keeps every
//! field it does not name exactly as read, so a read-modify-write never drops foreign
//! configuration. [`Driven`] is
//! what the reconcile needs of a kind on top (its observations, its editor, what a missing route
//! or CRD looks like); the reconcile, the triggers and the orphan controller are generic over
//! it and dispatch on `spec.routeRef.kind`. Must never do I/O beyond building an API handle, and
//! never touch a rule other than the one it is asked to weight.

pub mod grpc;
pub mod http;

use std::collections::BTreeMap;

use k8s_openapi::serde::{Serialize, de::DeserializeOwned};
use kube::{Api, Client, Resource};
use sluice_api::v1alpha1::{RolloutSpec, rollout::ROUTE_OWNER_ANNOTATION};

use crate::{
    decide::RouteObs,
    route_edit::{CrdSupport, Desired, EditError, Target},
};

/// The API group of every Gateway API route kind.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// One kind of Gateway API route the operator can weight.
pub trait RouteKind {
    /// The view of a route of this kind; keeps every field it does not name.
    type Route: Resource<DynamicType: Clone + Eq + std::hash::Hash + std::fmt::Debug + Unpin + Send + Sync>
        + Clone
        + PartialEq
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;

    /// API group.
    const GROUP: &'static str = GATEWAY_GROUP;
    /// API version.
    const VERSION: &'static str = "v1";
    /// Kind, as in `kind:` and in messages (`HTTPRoute`).
    const KIND: &'static str;
    /// Plural resource name (`httproutes`).
    const PLURAL: &'static str;
    /// Name of the CustomResourceDefinition that installs the kind.
    const CRD: &'static str;

    /// The API of routes of this kind, in `namespace` or cluster-wide.
    fn api(client: Client, namespace: Option<&str>) -> Api<Self::Route>;

    /// Number of rules.
    fn rule_count(route: &Self::Route) -> usize;
    /// Name of rule `rule`, if it has one.
    fn rule_name(route: &Self::Route, rule: usize) -> Option<&str>;
    /// Whether rule `rule` has the Service `service` (in the route's namespace) as a backendRef.
    fn has_backend(route: &Self::Route, rule: usize, service: &str) -> bool;
    /// The share of rule `rule`'s traffic Service `service` receives from the weights, percent
    /// (0 when absent or when every weight is 0; an absent weight counts as 1).
    fn weight_share_percent(route: &Self::Route, rule: usize, service: &str) -> f64;
    /// The weight of Service `service`'s backendRef in rule `rule` as written (absent weight:
    /// `Some(None)`; no such backendRef: `None`).
    fn weight(route: &Self::Route, rule: usize, service: &str) -> Option<Option<i32>>;
    /// Sets the weight of Service `service`'s backendRef in rule `rule`; false when there is no
    /// such backendRef (nothing changes then).
    fn set_weight(route: &mut Self::Route, rule: usize, service: &str, weight: i32) -> bool;

    /// `"<Kind> <name>"`, the way messages name a route.
    fn describe(name: &str) -> String {
        format!("{} {name}", Self::KIND)
    }

    /// Indices of the rules with a backendRef to Service `service`.
    fn rules_with_backend(route: &Self::Route, service: &str) -> Vec<usize> {
        (0..Self::rule_count(route))
            .filter(|&i| Self::has_backend(route, i, service))
            .collect()
    }

    /// Index of the rule named `name`.
    fn rule_by_name(route: &Self::Route, name: &str) -> Option<usize> {
        (0..Self::rule_count(route)).find(|&i| Self::rule_name(route, i) == Some(name))
    }
}

/// A route kind the reconcile drives end to end: weights per step, abort, hand-back.
pub trait Driven: RouteKind + 'static {
    /// The dynamic type of [`RouteKind::Route`] (`()` for a typed route, the `ApiResource` of a
    /// dynamic one), for writes and watches.
    fn dynamic_type() -> <Self::Route as Resource>::DynamicType;

    /// The state machine's view of `route` for the Rollout `spec` aims at `target`: this
    /// operator's parts, or why the route cannot be governed. `others`: the routes of the
    /// namespace that may compete with a mirror rule (empty unless a step mirrors).
    fn observe(
        route: &Self::Route,
        others: &[Self::Route],
        target: &Target,
        spec: &RolloutSpec,
        crd: CrdSupport,
    ) -> RouteObs;

    /// `route` with this operator's parts set to `desired` and ownership taken; every other
    /// field carried over unchanged.
    fn apply(
        route: &Self::Route,
        target: &Target,
        desired: &Desired,
        crd: CrdSupport,
    ) -> Result<Self::Route, EditError>;

    /// The observation when no route named `name` exists.
    fn missing(name: &str) -> RouteObs;

    /// The observation when the kind's CRD is not installed; `None` when that is not told
    /// apart from a missing route (the route read then finds nothing).
    fn not_installed(name: &str) -> Option<RouteObs>;
}

/// The kind of Rollouts that name none: HTTPRoute.
pub type Wired = http::Http;

/// An HTTPRoute, as the HTTPRoute-only parts (the cohort and mirror editor) see it.
pub type Route = <Wired as RouteKind>::Route;

/// The API of HTTPRoutes in `namespace`.
pub fn api(client: Client, namespace: &str) -> Api<Route> {
    Wired::api(client, Some(namespace))
}

/// The ownership annotation's value on `route`, if set.
pub fn owner<R: Resource>(route: &R) -> Option<&String> {
    route
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROUTE_OWNER_ANNOTATION))
}

/// The Rollout (`namespace`, `name`) a route's ownership annotation names, if it names one.
pub fn owner_of<R: Resource>(route: &R) -> Option<(String, String)> {
    let value = owner(route)?;
    let (ns, name) = value.split_once('/')?;
    (!ns.is_empty() && !name.is_empty()).then(|| (ns.to_owned(), name.to_owned()))
}

/// Sets the ownership annotation to `owner` (`<namespace>/<name>` of the Rollout).
pub fn set_owner<R: Resource>(route: &mut R, owner: &str) {
    route
        .meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ROUTE_OWNER_ANNOTATION.into(), owner.to_owned());
}

/// Hand-back: `route` with the ownership annotation removed (and the annotations map dropped
/// when it held nothing else); nothing else changes.
pub fn without_owner<R: Resource + Clone>(route: &R) -> R {
    let mut out = route.clone();
    let meta = out.meta_mut();
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(ROUTE_OWNER_ANNOTATION);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    out
}

/// Where the managed rule is not, or not alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Located {
    /// No rule of that name.
    NoRuleNamed,
    /// No rule (other than `skip`'s) has the stable Service as a backendRef.
    NoStableBackend,
    /// Several rules have the stable Service as a backendRef: their indices.
    Ambiguous(Vec<usize>),
}

/// Finds the managed rule: the one named `rule_name`, else the single rule whose backendRefs
/// include Service `stable`, leaving out the rules `skip` picks (the ones this operator adds).
pub fn locate<K: RouteKind>(
    route: &K::Route,
    rule_name: Option<&str>,
    stable: &str,
    skip: impl Fn(Option<&str>) -> bool,
) -> Result<usize, Located> {
    if let Some(name) = rule_name {
        return K::rule_by_name(route, name).ok_or(Located::NoRuleNamed);
    }
    let candidates: Vec<usize> = K::rules_with_backend(route, stable)
        .into_iter()
        .filter(|&i| !skip(K::rule_name(route, i)))
        .collect();
    match candidates.as_slice() {
        [] => Err(Located::NoStableBackend),
        [one] => Ok(*one),
        _ => Err(Located::Ambiguous(candidates)),
    }
}
