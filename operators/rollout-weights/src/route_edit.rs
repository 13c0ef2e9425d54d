//! Pure editing of a Gateway API HTTPRoute for a Rollout: find the managed rule, set the canary
//! weight, add or remove the header-cohort and mirror rules, take and hand back ownership. What
//! every route kind shares (the resource, the ownership annotation, locating the managed rule,
//! reading a backend's weight) is the route seam's (`crate::route`); this module is the
//! HTTPRoute-specific editor behind it.
//!
//! Owns the shape of the rules this operator adds and the guarantee that everything else on the
//! route stays exactly as it was (other rules, matches, filters, extra backends, parentRefs,
//! hostnames, unknown fields). Must never do I/O and never touch a rule it did not add, except the
//! two weights of the managed rule.
//!
//! # The rules we generate, under Gateway API match precedence
//!
//! Gateway API picks the matching rule by specificity, not by order: exact path, then longest
//! prefix, then a method match, then the most header matches, then the most query-param
//! matches; only ties fall back to rule order. For every match `m` of the managed rule (a rule
//! without matches counts as the match `PathPrefix /`):
//!
//! - **Cohort rule** `sluice-cohort`: `m` plus the cohort header. Same path and method as `m`,
//!   one header more, so it outranks `m`. While the mirror rule is present it also holds
//!   `m` + method + cohort header for every mirrored method, because a method match outranks
//!   header matches: without these, a cohort `GET` would land on the mirror rule (stable).
//!   Backends: the canary Service only.
//! - **Mirror rule** `sluice-mirror`: `m` plus `method: X` for each mirrored method (idempotent
//!   only); a match that already names a method is kept as it is when that method is mirrored
//!   and skipped otherwise. It is a copy of the managed rule (same filters, backends, weights,
//!   timeouts) with a `RequestMirror` filter to the canary appended, so requests it captures are
//!   served exactly as before and a copy goes to the canary.
//!
//! Both rules are inserted right before the managed rule so that any tie is also won by them.
//! A more specific rule elsewhere on the route still wins over both; that traffic is simply
//! not part of the cohort or mirror.

use kube::Resource;
use serde_json::Value;
use sluice_api::{
    external::http_route::{
        BackendObjectReference, FILTER_REQUEST_MIRROR, HttpBackendRef, HttpHeaderMatch, HttpRoute,
        HttpRouteFilter, HttpRouteMatch, HttpRouteRule, MAX_MATCHES, MAX_RULES, ParentReference,
        RequestMirror,
    },
    v1alpha1::rollout::{GrpcMethod, HeaderMatch, HeaderMatchType, HttpMethod},
};

use crate::route::{self, Located, RouteKind, http::Http};

/// Name of the header-cohort rule this operator adds.
pub const COHORT_RULE: &str = "sluice-cohort";
/// Header matches one match of an HTTPRoute or GRPCRoute may hold (the released CRDs'
/// `maxItems`); the cohort rule adds one to each match of the managed rule.
pub const MAX_MATCH_HEADERS: usize = 16;
/// Name of the mirror rule this operator adds.
pub const MIRROR_RULE: &str = "sluice-mirror";

/// Which route the Rollout governs and with which Services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `<namespace>/<name>` of the Rollout: the ownership annotation's value.
    pub owner: String,
    /// Stable Service name.
    pub stable: String,
    /// Canary Service name.
    pub canary: String,
    /// Canary Service port (absent: the stable backend's port).
    pub canary_port: Option<u16>,
    /// Name of the managed rule (absent: the single rule with the stable backend).
    pub rule_name: Option<String>,
    /// Set other backends of the managed rule to weight 0 (`spec.zeroOtherBackends`).
    pub zero_other_backends: bool,
}

/// The mirror the route should carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// Percent of matching requests copied, 1..100.
    pub percent: u32,
    /// Methods mirrored (idempotent only) on an HTTPRoute.
    pub methods: Vec<HttpMethod>,
    /// gRPC methods mirrored on a GRPCRoute (the ones the Rollout declares safe).
    pub grpc_methods: Vec<GrpcMethod>,
}

/// What the operator's parts of the route should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Canary weight of the managed rule, percent 0..100 (stable gets the rest).
    pub weight: u32,
    /// The header-cohort rule, when it should be present.
    pub cohort: Option<HeaderMatch>,
    /// The mirror rule, when it should be present.
    pub mirror: Option<Mirror>,
}

impl Desired {
    /// Abort: canary weight 0, cohort and mirror rules removed (one write).
    pub fn abort() -> Self {
        Self {
            weight: 0,
            cohort: None,
            mirror: None,
        }
    }
}

/// Which optional HTTPRoute fields the installed CRD keeps (older CRDs prune them silently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrdSupport {
    /// `spec.rules[].name`.
    pub rule_name: bool,
    /// `requestMirror.percent`.
    pub mirror_percent: bool,
}

impl CrdSupport {
    /// Every field supported (Gateway API ≥ v1.2).
    pub const ALL: CrdSupport = CrdSupport {
        rule_name: true,
        mirror_percent: true,
    };

    /// Reads the support from an installed HTTPRoute CustomResourceDefinition (its JSON): the
    /// schema of the served version `v1`. A CRD without that version supports nothing optional.
    pub fn from_crd(crd: &Value) -> Self {
        let versions = crd["spec"]["versions"].as_array();
        let schema = versions
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "v1")
            .map(|v| &v["schema"]["openAPIV3Schema"]);
        let Some(schema) = schema else {
            return CrdSupport {
                rule_name: false,
                mirror_percent: false,
            };
        };
        let rule = &schema["properties"]["spec"]["properties"]["rules"]["items"]["properties"];
        let filter = &rule["filters"]["items"]["properties"];
        CrdSupport {
            rule_name: rule.get("name").is_some(),
            mirror_percent: filter["requestMirror"]["properties"]
                .get("percent")
                .is_some(),
        }
    }
}

/// Why a route cannot be edited as asked. The variant's category ([`EditError::category`]) is
/// its name, or the condition reason it shares (`reasons` in sluice-api).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum EditError {
    /// No rule has the stable Service as a backend (or the named rule is absent).
    #[strum(serialize = "RouteNotFound")]
    #[error("{kind} {route}: {detail}; fix spec.routeRef or spec.stableService of the Rollout")]
    RuleNotFound {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// What was looked for.
        detail: String,
    },
    /// Several rules have the stable backend and no rule name was given.
    #[strum(serialize = "RouteNotFound")]
    #[error(
        "{kind} {route}: rules {indices:?} all send to Service {stable}; name the managed rule in spec.routeRef.ruleName"
    )]
    Ambiguous {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// Stable Service.
        stable: String,
        /// Indices of the candidate rules.
        indices: Vec<usize>,
    },
    /// The route has no room for the extra rules.
    #[error(
        "{kind} {route}: adding the {what} rule needs {rules} rules and {matches} matches, over the limit of {max_rules} rules and {max_matches} matches; remove the {what} step or split the route"
    )]
    RouteFull {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// cohort or mirror.
        what: &'static str,
        /// Rules after the edit.
        rules: usize,
        /// Matches after the edit.
        matches: usize,
        /// Limit on rules.
        max_rules: usize,
        /// Limit on matches.
        max_matches: usize,
    },
    /// The installed CRD would prune a field a step needs.
    #[strum(serialize = "RouteFieldPruned")]
    #[error(
        "the installed {kind} CRD prunes {field}, which the {what} step needs; install Gateway API CRDs v1.2 or later, or remove the step"
    )]
    FieldPruned {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// The pruned field.
        field: &'static str,
        /// cohort or mirror.
        what: &'static str,
    },
    /// A match of the managed rule already holds the most header matches the CRD allows, so
    /// the cohort header cannot be added to it (the API server would refuse the write).
    #[strum(serialize = "RouteFull")]
    #[error(
        "{kind} {route}: a match of the managed rule already has {max} header matches, the most a match may hold, so the cohort header cannot be added to it; remove the headerCohort step or match on fewer headers"
    )]
    CohortHeaderNoRoom {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// The CRD's limit on header matches in one match.
        max: usize,
    },
    /// A match of the managed rule already matches on the cohort header.
    #[strum(serialize = "InvalidSpec")]
    #[error(
        "{kind} {route}: the managed rule already matches on header {header}; choose another cohort header"
    )]
    CohortHeaderTaken {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// Header name.
        header: String,
    },
    /// Another rule of the route matches the same path without a method match: the mirror
    /// rule (the managed rule's path plus a method) would outrank it under Gateway API
    /// precedence and take its requests.
    #[error(
        "HTTPRoute {route}: rule {rule} matches path {path} without a method, so the mirror rule (that path plus method {method}) would take its requests under Gateway API precedence (a method match outranks header and query matches); remove the mirror step or give that rule a distinct path or its own method match"
    )]
    MirrorWouldCapture {
        /// Route name.
        route: String,
        /// The other rule's name, or its index.
        rule: String,
        /// The shared path.
        path: String,
        /// A mirrored method.
        method: String,
    },
    /// A rule of another HTTPRoute on the same parent and hostname matches the same path
    /// without a method: Gateway API precedence spans every rule of the routes attached to a
    /// parent for a hostname, so the mirror rule would take that route's requests too.
    #[strum(serialize = "MirrorWouldCapture")]
    #[error(
        "HTTPRoute {route}: HTTPRoute {other} on the same parent and hostname has rule {rule} matching path {path} without a method, so the mirror rule (that path plus method {method}) would take its requests under Gateway API precedence (precedence spans every route on a parent and hostname); remove the mirror step or give that rule a distinct path or its own method match"
    )]
    MirrorWouldCaptureOtherRoute {
        /// Route name.
        route: String,
        /// The other route's name.
        other: String,
        /// The other route's rule name, or its index.
        rule: String,
        /// The shared path.
        path: String,
        /// A mirrored method.
        method: String,
    },
    /// A rule of the GRPCRoute (or of another GRPCRoute on the same parent and hostname) matches
    /// the mirrored service without naming a method: the mirror rule (its matches plus a method)
    /// would outrank it under Gateway API precedence and take its requests.
    #[strum(serialize = "MirrorWouldCapture")]
    #[error(
        "GRPCRoute {route}: rule {rule} of {whose} matches service {service} without naming method {method}, so the mirror rule (method {service}/{method}) would take its requests under Gateway API precedence (a longer method match outranks header matches, across every route on a parent and hostname); remove the mirror step or give that rule its own method match"
    )]
    GrpcMirrorWouldCapture {
        /// Route name.
        route: String,
        /// Whose rule: `this route`, or `GRPCRoute <name> on the same parent and hostname`.
        whose: String,
        /// The other rule's name, or its index.
        rule: String,
        /// The mirrored service, or `any` when the rule matches every service.
        service: String,
        /// The mirrored method.
        method: String,
    },
    /// No match of the managed rule covers a mirrored gRPC method, so the mirror rule would
    /// match nothing.
    #[strum(serialize = "InvalidSpec")]
    #[error(
        "GRPCRoute {route}: no match of the managed rule covers the mirrored methods {methods}; name methods the rule serves in spec.steps[].mirror.grpcMethods"
    )]
    MirrorMatchesNothing {
        /// Route name.
        route: String,
        /// The mirrored methods, `service/method`, comma-separated.
        methods: String,
    },
    /// Another backend of the managed rule carries weight: a canary weight would not be the
    /// canary's share, and an abort would leave that backend live.
    #[error(
        "{kind} {route}: the managed rule also sends to Service {backend} with weight {weight}; the canary weight would not be its share. Remove that backend in Git, or set spec.zeroOtherBackends: true to have it set to 0"
    )]
    OtherBackendWeighted {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// The other backend.
        backend: String,
        /// Its weight.
        weight: i32,
    },
    /// The route has too many backends to add the canary.
    #[strum(serialize = "RouteFull")]
    #[error(
        "{kind} {route}: the managed rule has 16 backendRefs, no room for canary Service {canary}"
    )]
    NoBackendRoom {
        /// Route kind (`HTTPRoute`, `GRPCRoute`).
        kind: &'static str,
        /// Route name.
        route: String,
        /// Canary Service.
        canary: String,
    },
}

impl EditError {
    /// Bounded category for metrics and condition reasons.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// What this operator's parts of a route are right now.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// Index of the managed rule.
    pub rule_index: usize,
    /// Canary weight share of the managed rule, percent (0 when the canary is absent).
    pub weight: f64,
    /// Whether the cohort rule is present.
    pub cohort: bool,
    /// Whether the mirror rule is present.
    pub mirror: bool,
    /// The ownership annotation's value.
    pub owner: Option<String>,
}

fn route_name(route: &HttpRoute) -> String {
    route.metadata.name.clone().unwrap_or_default()
}

/// Whether a rule of that name is one this operator adds.
pub fn ours(name: Option<&str>) -> bool {
    matches!(name, Some(COHORT_RULE | MIRROR_RULE))
}

fn is_ours(rule: &HttpRouteRule) -> bool {
    ours(rule.name.as_deref())
}

/// Finds the managed rule: the named one, else the single rule (not added by us) whose
/// backends include the stable Service.
pub fn locate(route: &HttpRoute, target: &Target) -> Result<usize, EditError> {
    locate_in::<Http>(route, target)
}

/// [`locate`] on a route of any kind.
pub fn locate_in<K: RouteKind>(route: &K::Route, target: &Target) -> Result<usize, EditError> {
    route::locate::<K>(route, target.rule_name.as_deref(), &target.stable, ours).map_err(
        |located| {
            let route = route.meta().name.clone().unwrap_or_default();
            let kind = K::KIND;
            match located {
                Located::NoRuleNamed => EditError::RuleNotFound {
                    kind,
                    route,
                    detail: format!(
                        "no rule named {}",
                        target.rule_name.as_deref().unwrap_or_default()
                    ),
                },
                Located::NoStableBackend => EditError::RuleNotFound {
                    kind,
                    route,
                    detail: format!("no rule has Service {} as a backendRef", target.stable),
                },
                Located::Ambiguous(indices) => EditError::Ambiguous {
                    kind,
                    route,
                    stable: target.stable.clone(),
                    indices,
                },
            }
        },
    )
}

/// Reads this operator's parts of the route.
pub fn observe(route: &HttpRoute, target: &Target) -> Result<Observed, EditError> {
    let rule_index = locate(route, target)?;
    Ok(Observed {
        rule_index,
        weight: Http::weight_share_percent(route, rule_index, &target.canary),
        cohort: Http::rule_by_name(route, COHORT_RULE).is_some(),
        mirror: Http::rule_by_name(route, MIRROR_RULE).is_some(),
        owner: route::owner(route).cloned(),
    })
}

fn matches_of(rule: &HttpRouteRule) -> Vec<HttpRouteMatch> {
    match &rule.matches {
        Some(m) if !m.is_empty() => m.clone(),
        _ => vec![HttpRouteMatch {
            path: Some(sluice_api::external::http_route::HttpPathMatch {
                match_type: Some("PathPrefix".into()),
                value: Some("/".into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

fn with_header(m: &HttpRouteMatch, header: &HeaderMatch) -> HttpRouteMatch {
    let mut m = m.clone();
    m.headers
        .get_or_insert_with(Vec::new)
        .push(HttpHeaderMatch {
            match_type: Some(
                match header.match_type {
                    HeaderMatchType::Exact => "Exact",
                    HeaderMatchType::RegularExpression => "RegularExpression",
                }
                .into(),
            ),
            name: header.name.clone(),
            value: header.value.clone(),
            ..Default::default()
        });
    m
}

/// The matches of the mirror rule: each base match with each mirrored method.
fn mirror_matches(base: &[HttpRouteMatch], mirror: &Mirror) -> Vec<HttpRouteMatch> {
    let mut out = Vec::new();
    for m in base {
        match &m.method {
            Some(method) => {
                if mirror.methods.iter().any(|x| x.as_str() == method) {
                    out.push(m.clone());
                }
            }
            None => {
                for x in &mirror.methods {
                    let mut with = m.clone();
                    with.method = Some(x.as_str().into());
                    out.push(with);
                }
            }
        }
    }
    out
}

/// A path match as Gateway API precedence sees it: (type, value), absent = `PathPrefix /`.
fn path_key(m: &HttpRouteMatch) -> (String, String) {
    let p = m.path.as_ref();
    (
        p.and_then(|p| p.match_type.clone())
            .unwrap_or_else(|| "PathPrefix".into()),
        p.and_then(|p| p.value.clone())
            .unwrap_or_else(|| "/".into()),
    )
}

/// Whether the generated mirror match `mirror` would win a request that `other` (a match of
/// another rule) wins today. Precedence: path (exact, then longest prefix), then method, then
/// the number of header matches, then query matches. Only an equal path can tie; then `other`
/// loses to the method unless it has the same method and at least as many header matches.
fn mirror_captures(mirror: &HttpRouteMatch, other: &HttpRouteMatch) -> bool {
    if path_key(mirror) != path_key(other) {
        return false;
    }
    let headers = |m: &HttpRouteMatch| m.headers.as_ref().map_or(0, Vec::len);
    match &other.method {
        None => true,
        Some(method) => mirror.method.as_ref() == Some(method) && headers(other) <= headers(mirror),
    }
}

fn canary_backend(rule: &HttpRouteRule, target: &Target, weight: i32) -> HttpBackendRef {
    let port = target
        .canary_port
        .map(i32::from)
        .or_else(|| rule.backend(&target.stable).and_then(|b| b.port));
    // `group` and `kind` spelled out as the CRD defaults them, so that the stored route equals
    // what we wrote and a rewrite of the same state is a no-op.
    HttpBackendRef {
        group: Some(String::new()),
        kind: Some("Service".into()),
        name: target.canary.clone(),
        port,
        weight: Some(weight),
        ..Default::default()
    }
}

/// Sets the two weights of the managed rule; adds the canary backend (after the stable one)
/// when it is absent and the weight is not 0.
fn set_weights(
    rule: &mut HttpRouteRule,
    target: &Target,
    weight: u32,
    route: &str,
) -> Result<(), EditError> {
    let canary = i32::try_from(weight.min(100)).unwrap_or(100);
    // Stable and canary must be the only weighted backends for the weight to be the canary's
    // share. Weight 0 (ownership, abort) never refuses: it only takes from the canary.
    for b in rule.backend_refs.iter_mut().flatten() {
        if b.is_service(&target.stable) || b.is_service(&target.canary) {
            continue;
        }
        if b.effective_weight() > 0 {
            if target.zero_other_backends {
                b.weight = Some(0);
            } else if canary > 0 {
                return Err(EditError::OtherBackendWeighted {
                    kind: Http::KIND,
                    route: route.into(),
                    backend: b.name.clone(),
                    weight: b.effective_weight(),
                });
            }
        }
    }
    if rule.backend(&target.canary).is_none() {
        if canary == 0 {
            // Nothing to send to the canary: leave the rule as it is (stable keeps its weight).
            return Ok(());
        }
        let backend = canary_backend(rule, target, canary);
        let refs = rule.backend_refs.get_or_insert_with(Vec::new);
        if refs.len() >= sluice_api::external::http_route::MAX_BACKEND_REFS {
            return Err(EditError::NoBackendRoom {
                kind: Http::KIND,
                route: route.into(),
                canary: target.canary.clone(),
            });
        }
        let at = refs
            .iter()
            .position(|b| b.is_service(&target.stable))
            .map_or(refs.len(), |i| i + 1);
        refs.insert(at, backend);
    } else if let Some(b) = rule.backend_mut(&target.canary) {
        b.weight = Some(canary);
    }
    if let Some(b) = rule.backend_mut(&target.stable) {
        b.weight = Some(100 - canary);
    }
    Ok(())
}

/// Where a route attaches: its namespace, parents and hostnames (the part of a route, of any
/// kind, that decides which requests it competes for).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attachment {
    /// The route's namespace (a parentRef without one is in it).
    pub namespace: String,
    /// `spec.parentRefs`.
    pub parents: Vec<ParentReference>,
    /// `spec.hostnames`.
    pub hostnames: Vec<String>,
}

impl Attachment {
    /// An HTTPRoute's attachment.
    pub fn of_http(r: &HttpRoute) -> Self {
        Self {
            namespace: r.metadata.namespace.clone().unwrap_or_default(),
            parents: r.spec.parent_refs.clone().unwrap_or_default(),
            hostnames: r.spec.hostnames.clone().unwrap_or_default(),
        }
    }

    /// Whether two routes compete for the same requests: they share a parent (same group,
    /// kind, namespace and name; a listener named or numbered on both must be the same) and a
    /// hostname (a route without hostnames takes every hostname of its listener;
    /// `*.example.com` takes every subdomain).
    pub fn shared_with(&self, other: &Attachment) -> bool {
        let key = |a: &Attachment, p: &ParentReference| {
            (
                p.group
                    .clone()
                    .unwrap_or_else(|| "gateway.networking.k8s.io".into()),
                p.kind.clone().unwrap_or_else(|| "Gateway".into()),
                p.namespace.clone().unwrap_or_else(|| a.namespace.clone()),
                p.name.clone(),
            )
        };
        let same_listener = |x: &ParentReference, y: &ParentReference| {
            let agree =
                |u: &Option<String>, v: &Option<String>| u.is_none() || v.is_none() || u == v;
            let port = |p: &ParentReference| p.port.map(|n| n.to_string());
            agree(&x.section_name, &y.section_name) && agree(&port(x), &port(y))
        };
        let shared_parent = self.parents.iter().any(|x| {
            other
                .parents
                .iter()
                .any(|y| key(self, x) == key(other, y) && same_listener(x, y))
        });
        if !shared_parent {
            return false;
        }
        let (ha, hb) = (&self.hostnames, &other.hostnames);
        if ha.is_empty() || hb.is_empty() {
            return true;
        }
        let covers = |pattern: &str, host: &str| match pattern.strip_prefix('*') {
            Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
            None => pattern == host,
        };
        ha.iter()
            .any(|x| hb.iter().any(|y| x == y || covers(x, y) || covers(y, x)))
    }
}

/// Refuses a mirror that would take requests from a rule of another route on the same parent
/// and hostname (`others`: the routes that may share them; the route itself is skipped). The
/// route's own rules are checked by [`apply`].
pub fn mirror_clash(
    route: &HttpRoute,
    others: &[HttpRoute],
    target: &Target,
    desired: &Desired,
) -> Result<(), EditError> {
    let Some(mirror) = &desired.mirror else {
        return Ok(());
    };
    let index = locate(route, target)?;
    let generated = mirror_matches(&matches_of(&route.rules()[index]), mirror);
    let name = route_name(route);
    for other in others {
        let same = other.metadata.name == route.metadata.name
            && other.metadata.namespace == route.metadata.namespace;
        if same || !Attachment::of_http(route).shared_with(&Attachment::of_http(other)) {
            continue;
        }
        for (i, rule) in other.rules().iter().enumerate() {
            for m in matches_of(rule) {
                if let Some(g) = generated.iter().find(|g| mirror_captures(g, &m)) {
                    return Err(EditError::MirrorWouldCaptureOtherRoute {
                        route: name,
                        other: route_name(other),
                        rule: rule.name.clone().unwrap_or_else(|| format!("#{i}")),
                        path: path_key(&m).1,
                        method: g.method.clone().unwrap_or_default(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Returns the route with this operator's parts set to `desired` and ownership taken; every
/// other field is carried over unchanged.
pub fn apply(
    route: &HttpRoute,
    target: &Target,
    desired: &Desired,
    crd: CrdSupport,
) -> Result<HttpRoute, EditError> {
    let name = route_name(route);
    if (desired.cohort.is_some() || desired.mirror.is_some()) && !crd.rule_name {
        return Err(EditError::FieldPruned {
            kind: Http::KIND,
            field: "spec.rules[].name",
            what: if desired.cohort.is_some() {
                "headerCohort"
            } else {
                "mirror"
            },
        });
    }
    if let Some(m) = &desired.mirror
        && m.percent < 100
        && !crd.mirror_percent
    {
        return Err(EditError::FieldPruned {
            kind: Http::KIND,
            field: "spec.rules[].filters[].requestMirror.percent",
            what: "mirror",
        });
    }
    let mut out = route.clone();
    let index = locate(route, target)?;
    let mut rules: Vec<HttpRouteRule> = out.spec.rules.take().unwrap_or_default();
    let mut managed = rules[index].clone();
    set_weights(&mut managed, target, desired.weight, &name)?;
    rules[index] = managed.clone();

    // Our rules are rebuilt from the managed rule each time, so a weight change or a change of
    // the managed rule's matches reaches them too.
    let mut kept: Vec<HttpRouteRule> = Vec::with_capacity(rules.len() + 2);
    let mut managed_at = 0;
    for (i, r) in rules.into_iter().enumerate() {
        if is_ours(&r) {
            continue;
        }
        if i == index {
            managed_at = kept.len();
        }
        kept.push(r);
    }
    let base = matches_of(&managed);
    let mut added = Vec::new();
    if let Some(header) = &desired.cohort {
        if base.iter().any(|m| {
            m.headers
                .iter()
                .flatten()
                .any(|h| h.name.eq_ignore_ascii_case(&header.name))
        }) {
            return Err(EditError::CohortHeaderTaken {
                kind: Http::KIND,
                route: name,
                header: header.name.clone(),
            });
        }
        if base
            .iter()
            .any(|m| m.headers.as_ref().map_or(0, Vec::len) >= MAX_MATCH_HEADERS)
        {
            return Err(EditError::CohortHeaderNoRoom {
                kind: Http::KIND,
                route: name,
                max: MAX_MATCH_HEADERS,
            });
        }
        let mut matches: Vec<HttpRouteMatch> =
            base.iter().map(|m| with_header(m, header)).collect();
        if let Some(mirror) = &desired.mirror {
            matches.extend(
                mirror_matches(&base, mirror)
                    .iter()
                    .filter(|m| !base.contains(m))
                    .map(|m| with_header(m, header)),
            );
        }
        let mut rule = managed.clone();
        rule.name = Some(COHORT_RULE.into());
        rule.matches = Some(matches);
        let canary = managed
            .backend(&target.canary)
            .cloned()
            .map(|mut b| {
                b.weight = Some(1);
                b
            })
            .unwrap_or_else(|| canary_backend(&managed, target, 1));
        rule.backend_refs = Some(vec![canary]);
        added.push(("headerCohort", rule));
    }
    if let Some(mirror) = &desired.mirror {
        // The mirror rule must never take requests from the route's other rules.
        let generated = mirror_matches(&base, mirror);
        for (i, other) in kept.iter().enumerate() {
            if i == managed_at {
                continue;
            }
            for m in matches_of(other) {
                if let Some(g) = generated.iter().find(|g| mirror_captures(g, &m)) {
                    return Err(EditError::MirrorWouldCapture {
                        route: name,
                        rule: other.name.clone().unwrap_or_else(|| format!("#{i}")),
                        path: path_key(&m).1,
                        method: g.method.clone().unwrap_or_default(),
                    });
                }
            }
        }
        let mut rule = managed.clone();
        rule.name = Some(MIRROR_RULE.into());
        rule.matches = Some(mirror_matches(&base, mirror));
        let port = canary_backend(&managed, target, 0).port;
        rule.filters
            .get_or_insert_with(Vec::new)
            .push(HttpRouteFilter {
                filter_type: FILTER_REQUEST_MIRROR.into(),
                request_mirror: Some(RequestMirror {
                    backend_ref: BackendObjectReference {
                        group: Some(String::new()),
                        kind: Some("Service".into()),
                        name: target.canary.clone(),
                        port,
                        ..Default::default()
                    },
                    percent: (mirror.percent < 100)
                        .then(|| i32::try_from(mirror.percent).unwrap_or(100)),
                    ..Default::default()
                }),
                ..Default::default()
            });
        added.push(("mirror", rule));
    }
    for (what, rule) in added {
        kept.insert(managed_at, rule);
        managed_at += 1;
        let matches: usize = kept.iter().map(HttpRouteRule::match_count).sum();
        if kept.len() > MAX_RULES || matches > MAX_MATCHES {
            return Err(EditError::RouteFull {
                kind: Http::KIND,
                route: name,
                what,
                rules: kept.len(),
                matches,
                max_rules: MAX_RULES,
                max_matches: MAX_MATCHES,
            });
        }
    }
    out.spec.rules = Some(kept);
    route::set_owner(&mut out, &target.owner);
    Ok(out)
}

/// Hand-back: the route with the ownership annotation removed (and the annotations map
/// dropped when it held nothing else); nothing else changes.
pub fn hand_back(route: &HttpRoute) -> HttpRoute {
    route::without_owner(route)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_api::v1alpha1::rollout::{ROUTE_OWNER_ANNOTATION, reasons};

    /// Every variant's category, the metric label and condition reason dashboards key on.
    #[test]
    fn each_error_has_its_category() {
        let route = || "checkout".to_owned();
        let table = [
            (
                EditError::RuleNotFound {
                    kind: "HTTPRoute",
                    route: route(),
                    detail: "no rule".into(),
                },
                "RouteNotFound",
            ),
            (
                EditError::Ambiguous {
                    kind: "HTTPRoute",
                    route: route(),
                    stable: "checkout-v1".into(),
                    indices: vec![0, 1],
                },
                "RouteNotFound",
            ),
            (
                EditError::RouteFull {
                    kind: "HTTPRoute",
                    route: route(),
                    what: "cohort",
                    rules: 17,
                    matches: 65,
                    max_rules: MAX_RULES,
                    max_matches: MAX_MATCHES,
                },
                "RouteFull",
            ),
            (
                EditError::FieldPruned {
                    kind: "HTTPRoute",
                    field: "spec.rules[].name",
                    what: "cohort",
                },
                "RouteFieldPruned",
            ),
            (
                EditError::CohortHeaderTaken {
                    kind: "HTTPRoute",
                    route: route(),
                    header: "x-canary".into(),
                },
                "InvalidSpec",
            ),
            (
                EditError::CohortHeaderNoRoom {
                    kind: "GRPCRoute",
                    route: route(),
                    max: MAX_MATCH_HEADERS,
                },
                "RouteFull",
            ),
            (
                EditError::MirrorWouldCapture {
                    route: route(),
                    rule: "admin".into(),
                    path: "/".into(),
                    method: "GET".into(),
                },
                "MirrorWouldCapture",
            ),
            (
                EditError::MirrorWouldCaptureOtherRoute {
                    route: route(),
                    other: "search".into(),
                    rule: "0".into(),
                    path: "/".into(),
                    method: "GET".into(),
                },
                "MirrorWouldCapture",
            ),
            (
                EditError::GrpcMirrorWouldCapture {
                    route: route(),
                    whose: "this route".into(),
                    rule: "admin".into(),
                    service: "payments.v1.Ledger".into(),
                    method: "GetBalance".into(),
                },
                "MirrorWouldCapture",
            ),
            (
                EditError::MirrorMatchesNothing {
                    route: route(),
                    methods: "payments.v1.Ledger/GetBalance".into(),
                },
                "InvalidSpec",
            ),
            (
                EditError::OtherBackendWeighted {
                    kind: "GRPCRoute",
                    route: route(),
                    backend: "audit".into(),
                    weight: 10,
                },
                "OtherBackendWeighted",
            ),
            (
                EditError::NoBackendRoom {
                    kind: "HTTPRoute",
                    route: route(),
                    canary: "checkout-v2".into(),
                },
                "RouteFull",
            ),
        ];
        for (e, category) in &table {
            // Every variant named: a new one fails to compile here until it has a row above.
            match e {
                EditError::RuleNotFound { .. }
                | EditError::Ambiguous { .. }
                | EditError::RouteFull { .. }
                | EditError::FieldPruned { .. }
                | EditError::CohortHeaderTaken { .. }
                | EditError::CohortHeaderNoRoom { .. }
                | EditError::MirrorWouldCapture { .. }
                | EditError::MirrorWouldCaptureOtherRoute { .. }
                | EditError::GrpcMirrorWouldCapture { .. }
                | EditError::MirrorMatchesNothing { .. }
                | EditError::OtherBackendWeighted { .. }
                | EditError::NoBackendRoom { .. } => {}
            }
            assert_eq!(e.category(), *category, "{e:?}");
        }
        // The categories that are condition reasons are the reasons' own constants.
        for reason in [
            reasons::ROUTE_NOT_FOUND,
            reasons::ROUTE_FULL,
            reasons::ROUTE_FIELD_PRUNED,
            reasons::INVALID_SPEC,
            reasons::MIRROR_WOULD_CAPTURE,
            reasons::OTHER_BACKEND_WEIGHTED,
        ] {
            assert!(table.iter().any(|(_, c)| *c == reason), "{reason}");
        }
    }

    fn rich() -> Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {
                "name": "checkout", "namespace": "shop", "resourceVersion": "7",
                "labels": {"app": "checkout"},
                "annotations": {"team": "payments"}
            },
            "spec": {
                "parentRefs": [{"name": "mesh-gw", "namespace": "gateways", "sectionName": "https", "futureParentField": true}],
                "hostnames": ["shop.example.com"],
                "rules": [
                    {"name": "admin", "matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}],
                     "backendRefs": [{"name": "admin", "port": 80}]},
                    {"name": "main",
                     "matches": [
                        {"path": {"type": "PathPrefix", "value": "/api"}, "queryParams": [{"type": "Exact", "name": "debug", "value": "1"}]},
                        {"path": {"type": "Exact", "value": "/checkout"}, "method": "POST"}
                     ],
                     "filters": [
                        {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "main"}]}},
                        {"type": "ExtensionRef", "extensionRef": {"group": "example.io", "kind": "Thing", "name": "t"}}
                     ],
                     "backendRefs": [
                        {"name": "checkout-v1", "port": 8080, "weight": 100, "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-v", "value": "1"}]}}]},
                        {"group": "", "kind": "Service", "name": "legacy", "namespace": "old", "port": 80, "weight": 0}
                     ],
                     "timeouts": {"request": "10s"},
                     "futureRuleField": {"a": 1}},
                    {"backendRefs": [{"name": "catch-all", "port": 80}]}
                ],
                "useDefaultGateways": "All"
            },
            "status": {"parents": []}
        })
    }

    fn target() -> Target {
        Target {
            zero_other_backends: false,
            owner: "shop/checkout".into(),
            stable: "checkout-v1".into(),
            canary: "checkout-v2".into(),
            canary_port: None,
            rule_name: None,
        }
    }

    fn cohort() -> HeaderMatch {
        HeaderMatch {
            name: "x-cohort".into(),
            value: "staff".into(),
            match_type: HeaderMatchType::Exact,
        }
    }

    fn mirror() -> Mirror {
        Mirror {
            percent: 10,
            methods: vec![HttpMethod::Get, HttpMethod::Head],
            grpc_methods: Vec::new(),
        }
    }

    fn route(v: Value) -> HttpRoute {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_mirror_never_takes_requests_from_another_route_on_the_same_parent_and_hostname() {
        let ours = route(rich());
        // Another team's route: `x-beta: true` on /api goes to their beta backend.
        let other = |parent: Value, hostnames: Value, path: &str| {
            route(json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "HTTPRoute",
                "metadata": {"name": "beta", "namespace": "shop"},
                "spec": {
                    "parentRefs": [parent],
                    "hostnames": hostnames,
                    "rules": [{"name": "beta-testers",
                               "matches": [{"path": {"type": "PathPrefix", "value": path},
                                            "headers": [{"name": "x-beta", "value": "true"}]}],
                               "backendRefs": [{"name": "beta", "port": 80}]}]
                }
            }))
        };
        let gw = json!({"name": "mesh-gw", "namespace": "gateways"});
        let table = [
            (
                "same parent and hostname",
                other(gw.clone(), json!(["shop.example.com"]), "/api"),
                true,
            ),
            (
                "same parent, every hostname",
                other(gw.clone(), json!(null), "/api"),
                true,
            ),
            (
                "same parent, wildcard hostname",
                other(gw.clone(), json!(["*.example.com"]), "/api"),
                true,
            ),
            (
                "same parent and listener",
                other(
                    json!({"name": "mesh-gw", "namespace": "gateways", "sectionName": "https"}),
                    json!(["shop.example.com"]),
                    "/api",
                ),
                true,
            ),
            (
                "another listener",
                other(
                    json!({"name": "mesh-gw", "namespace": "gateways", "sectionName": "http"}),
                    json!(["shop.example.com"]),
                    "/api",
                ),
                false,
            ),
            (
                "another hostname",
                other(gw.clone(), json!(["admin.example.com"]), "/api"),
                false,
            ),
            (
                "another parent",
                other(
                    json!({"name": "edge-gw", "namespace": "gateways"}),
                    json!(["shop.example.com"]),
                    "/api",
                ),
                false,
            ),
            (
                "another path",
                other(gw.clone(), json!(["shop.example.com"]), "/beta"),
                false,
            ),
        ];
        for (name, o, clash) in table {
            let got = mirror_clash(
                &ours,
                std::slice::from_ref(&o),
                &target(),
                &want(0, false, true),
            );
            match (got, clash) {
                (Err(e), true) => {
                    assert_eq!(e.category(), reasons::MIRROR_WOULD_CAPTURE, "{name}");
                    assert_eq!(
                        e.to_string(),
                        "HTTPRoute checkout: HTTPRoute beta on the same parent and hostname has rule beta-testers matching path /api without a method, so the mirror rule (that path plus method GET) would take its requests under Gateway API precedence (precedence spans every route on a parent and hostname); remove the mirror step or give that rule a distinct path or its own method match",
                        "{name}"
                    );
                }
                (Ok(()), false) => {}
                (got, _) => panic!("{name}: {got:?}"),
            }
            // Without a mirror, or against the route itself, nothing clashes.
            assert!(
                mirror_clash(
                    &ours,
                    std::slice::from_ref(&o),
                    &target(),
                    &want(5, true, false)
                )
                .is_ok(),
                "{name}"
            );
        }
        assert!(
            mirror_clash(
                &ours,
                std::slice::from_ref(&ours),
                &target(),
                &want(0, false, true)
            )
            .is_ok()
        );
    }

    fn want(weight: u32, cohort: bool, mirror: bool) -> Desired {
        Desired {
            weight,
            cohort: cohort.then(super::tests::cohort),
            mirror: mirror.then(super::tests::mirror),
        }
    }

    /// The managed rule's backendRefs with the canary at `w`.
    fn expected_backends(w: i64) -> Value {
        json!([
            {"name": "checkout-v1", "port": 8080, "weight": 100 - w, "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-v", "value": "1"}]}}]},
            {"group": "", "kind": "Service", "name": "checkout-v2", "port": 8080, "weight": w},
            {"group": "", "kind": "Service", "name": "legacy", "namespace": "old", "port": 80, "weight": 0}
        ])
    }

    /// Strips everything this operator owns, leaving what must equal the original.
    fn foreign_part(mut v: Value) -> Value {
        let rules = v["spec"]["rules"].as_array_mut().unwrap();
        rules.retain(|r| r["name"] != COHORT_RULE && r["name"] != MIRROR_RULE);
        for r in rules.iter_mut() {
            if let Some(refs) = r["backendRefs"].as_array_mut() {
                refs.retain(|b| b["name"] != "checkout-v2");
                for b in refs.iter_mut() {
                    if b["name"] == "checkout-v1" {
                        b["weight"] = json!(100);
                    }
                }
            }
        }
        v["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(ROUTE_OWNER_ANNOTATION);
        v
    }

    #[test]
    fn whole_rollout_promote_and_abort_keep_everything_else() {
        let original = rich();
        let t = target();
        let steps = [
            want(0, false, true),
            want(0, true, true),
            want(1, false, false),
            want(5, false, false),
            want(25, true, false),
            want(50, false, false),
            want(100, false, false),
        ];
        let mut current = route(original.clone());
        for d in &steps {
            current = apply(&current, &t, d, CrdSupport::ALL).unwrap();
            let v = serde_json::to_value(&current).unwrap();
            assert_eq!(foreign_part(v.clone()), original, "step {d:?}");
            let obs = observe(&current, &t).unwrap();
            assert_eq!(obs.weight, f64::from(d.weight), "{d:?}");
            assert_eq!(obs.cohort, d.cohort.is_some(), "{d:?}");
            assert_eq!(obs.mirror, d.mirror.is_some(), "{d:?}");
            assert_eq!(obs.owner.as_deref(), Some("shop/checkout"));
            // Re-applying the same desired state changes nothing (idempotent writes).
            assert_eq!(apply(&current, &t, d, CrdSupport::ALL).unwrap(), current);
        }
        // Promoted at 100: the managed rule has exactly the expected backends.
        let v = serde_json::to_value(&current).unwrap();
        assert_eq!(v["spec"]["rules"][1]["backendRefs"], expected_backends(100));
        // Hand-back removes only the annotation.
        let back = serde_json::to_value(hand_back(&current)).unwrap();
        let mut want_back = v.clone();
        want_back["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(ROUTE_OWNER_ANNOTATION);
        assert_eq!(back, want_back);
    }

    #[test]
    fn abort_is_one_edit_to_zero_with_extra_rules_gone() {
        let original = rich();
        let t = target();
        let at_25 = apply(
            &route(original.clone()),
            &t,
            &want(25, true, true),
            CrdSupport::ALL,
        )
        .unwrap();
        assert_eq!(at_25.rules().len(), 5);
        let aborted = apply(&at_25, &t, &Desired::abort(), CrdSupport::ALL).unwrap();
        let v = serde_json::to_value(&aborted).unwrap();
        assert_eq!(v["spec"]["rules"].as_array().unwrap().len(), 3);
        assert_eq!(v["spec"]["rules"][1]["backendRefs"], expected_backends(0));
        let mut expect = original;
        expect["spec"]["rules"][1]["backendRefs"] = expected_backends(0);
        expect["metadata"]["annotations"][ROUTE_OWNER_ANNOTATION] = json!("shop/checkout");
        assert_eq!(v, expect, "only the weights and the annotation differ");
    }

    #[test]
    fn generated_rules_land_under_match_precedence() {
        let t = target();
        let r = apply(&route(rich()), &t, &want(0, true, true), CrdSupport::ALL).unwrap();
        let v = serde_json::to_value(&r).unwrap();
        let rules = v["spec"]["rules"].as_array().unwrap();
        let names: Vec<_> = rules.iter().map(|r| r["name"].clone()).collect();
        assert_eq!(
            names,
            vec![
                json!("admin"),
                json!(COHORT_RULE),
                json!(MIRROR_RULE),
                json!("main"),
                Value::Null
            ],
            "our rules sit right before the managed rule"
        );
        let cohort = &rules[1];
        // Base matches + header, and GET/HEAD variants of the methodless match with the header
        // (a method match outranks header matches, so these keep cohort GETs off the mirror rule).
        let cm = cohort["matches"].as_array().unwrap();
        assert_eq!(cm.len(), 4, "{cm:?}");
        for m in cm {
            assert_eq!(
                m["headers"].as_array().unwrap().last().unwrap()["name"],
                "x-cohort"
            );
        }
        assert_eq!(cm[0]["queryParams"][0]["name"], "debug");
        assert_eq!(cm[1]["method"], "POST");
        assert_eq!(cm[2]["method"], "GET");
        assert_eq!(cm[3]["method"], "HEAD");
        assert_eq!(
            cohort["backendRefs"],
            json!([{"group": "", "kind": "Service", "name": "checkout-v2", "port": 8080, "weight": 1}])
        );
        let mirror = &rules[2];
        let mm = mirror["matches"].as_array().unwrap();
        // The POST match is not mirrored (not idempotent); the methodless one gets GET and HEAD.
        assert_eq!(mm.len(), 2);
        assert!(mm.iter().all(|m| m["path"]["value"] == "/api"));
        assert_eq!(mm[0]["method"], "GET");
        let last = mirror["filters"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(
            last,
            json!({"type": "RequestMirror", "requestMirror": {"backendRef": {"group": "", "kind": "Service", "name": "checkout-v2", "port": 8080}, "percent": 10}})
        );
        assert_eq!(mirror["timeouts"], json!({"request": "10s"}));
        assert_eq!(mirror["backendRefs"], rules[3]["backendRefs"]);
    }

    #[test]
    fn another_weighted_backend_is_refused_unless_zeroed() {
        let mut v = rich();
        v["spec"]["rules"][1]["backendRefs"][1]["weight"] = json!(10);
        let r = route(v);
        let legacy = |r: &HttpRoute| {
            r.rules()[1]
                .backend_refs
                .iter()
                .flatten()
                .find(|b| b.name == "legacy")
                .map(|b| b.effective_weight())
        };
        let err = apply(&r, &target(), &want(5, false, false), CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), "OtherBackendWeighted", "{err}");
        assert!(err.to_string().contains("legacy"), "{err}");
        // Ownership and abort (weight 0) never refuse, and leave the other backend alone.
        let at_zero = apply(&r, &target(), &Desired::abort(), CrdSupport::ALL).unwrap();
        assert_eq!(legacy(&at_zero), Some(10));
        // Told to, the other backend goes to 0 with the live weight.
        let mut zeroing = target();
        zeroing.zero_other_backends = true;
        let live = apply(&r, &zeroing, &want(5, false, false), CrdSupport::ALL).unwrap();
        assert_eq!(legacy(&live), Some(0));
        let aborted = apply(&r, &zeroing, &Desired::abort(), CrdSupport::ALL).unwrap();
        assert_eq!(legacy(&aborted), Some(0), "abort: stable gets everything");
    }

    #[test]
    fn refusals_table() {
        let full = {
            let mut v = rich();
            let rules = v["spec"]["rules"].as_array_mut().unwrap();
            for i in 0..13 {
                rules.push(
                    json!({"name": format!("r{i}"), "backendRefs": [{"name": "x", "port": 80}]}),
                );
            }
            v
        };
        let ambiguous = {
            let mut v = rich();
            v["spec"]["rules"][2]["backendRefs"] = json!([{"name": "checkout-v1", "port": 8080}]);
            v
        };
        let header_taken = {
            let mut v = rich();
            v["spec"]["rules"][1]["matches"][0]["headers"] =
                json!([{"name": "X-Cohort", "value": "a"}]);
            v
        };
        // A match already at the CRD's 16 header matches cannot take the cohort header; the
        // weights alone still can be written.
        let headers_full = {
            let mut v = rich();
            v["spec"]["rules"][1]["matches"][0]["headers"] = (0..16)
                .map(|i| json!({"name": format!("x-h{i}"), "value": "1"}))
                .collect();
            v
        };
        let old_crd = CrdSupport {
            rule_name: false,
            mirror_percent: false,
        };
        let beside = |m: Value| {
            let mut v = rich();
            v["spec"]["rules"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "beta", "matches": [m], "backendRefs": [{"name": "beta", "port": 80}]}));
            v
        };
        let beta_header = beside(
            json!({"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "x-beta", "value": "1"}]}),
        );
        let beta_get_header = beside(
            json!({"path": {"type": "PathPrefix", "value": "/api"}, "method": "GET", "headers": [{"name": "x-beta", "value": "1"}]}),
        );
        let beta_longer = beside(json!({"path": {"type": "PathPrefix", "value": "/api/beta"}}));
        let table: Vec<(&str, Value, Desired, CrdSupport, &str, &str)> = vec![
            (
                "16 rules, mirror",
                full.clone(),
                want(0, false, true),
                CrdSupport::ALL,
                "RouteFull",
                "17 rules",
            ),
            (
                "16 rules, weight only",
                full,
                want(5, false, false),
                CrdSupport::ALL,
                "",
                "",
            ),
            (
                "ambiguous",
                ambiguous,
                want(5, false, false),
                CrdSupport::ALL,
                "RouteNotFound",
                "ruleName",
            ),
            (
                "header taken",
                header_taken,
                want(0, true, false),
                CrdSupport::ALL,
                "InvalidSpec",
                "x-cohort",
            ),
            (
                "cohort on a match with 16 headers",
                headers_full.clone(),
                want(0, true, false),
                CrdSupport::ALL,
                "RouteFull",
                "HTTPRoute checkout: a match of the managed rule already has 16 header matches, the most a match may hold, so the cohort header cannot be added to it; remove the headerCohort step or match on fewer headers",
            ),
            (
                "weights on a match with 16 headers",
                headers_full,
                want(5, false, false),
                CrdSupport::ALL,
                "",
                "",
            ),
            (
                "mirror beside a rule on the same path with header matches only",
                beta_header.clone(),
                want(0, false, true),
                CrdSupport::ALL,
                "MirrorWouldCapture",
                "rule beta matches path /api",
            ),
            (
                "weights beside that rule: no mirror, no capture",
                beta_header,
                want(5, false, false),
                CrdSupport::ALL,
                "",
                "",
            ),
            (
                "mirror beside a rule with the same method and more headers",
                beta_get_header,
                want(0, false, true),
                CrdSupport::ALL,
                "",
                "",
            ),
            (
                "mirror beside a rule on a longer prefix",
                beta_longer,
                want(0, false, true),
                CrdSupport::ALL,
                "",
                "",
            ),
            (
                "old CRD, cohort",
                rich(),
                want(0, true, false),
                old_crd,
                "RouteFieldPruned",
                "spec.rules[].name",
            ),
            (
                "old CRD, weight",
                rich(),
                want(5, false, false),
                old_crd,
                "",
                "",
            ),
            (
                "no percent in CRD",
                rich(),
                want(0, false, true),
                CrdSupport {
                    rule_name: true,
                    mirror_percent: false,
                },
                "RouteFieldPruned",
                "requestMirror.percent",
            ),
        ];
        for (name, v, d, crd, category, needle) in table {
            match apply(&route(v), &target(), &d, crd) {
                Ok(_) => assert!(category.is_empty(), "{name}: expected {category}"),
                Err(e) => {
                    assert_eq!(e.category(), category, "{name}: {e}");
                    assert!(e.to_string().contains(needle), "{name}: {e}");
                }
            }
        }
        let mut named = target();
        named.rule_name = Some("nope".into());
        let err = locate(&route(rich()), &named).unwrap_err();
        assert!(err.to_string().contains("no rule named nope"), "{err}");
    }

    #[test]
    fn matches_limit_counts_generated_matches() {
        let mut v = rich();
        let many: Vec<Value> = (0..60)
            .map(|i| json!({"path": {"type": "Exact", "value": format!("/p{i}")}}))
            .collect();
        v["spec"]["rules"][1]["matches"] = json!(many);
        // 60 + 1 + 1 + 60 (cohort) = 122 ≤ 128; + 120 (mirror GET/HEAD) > 128.
        assert!(
            apply(
                &route(v.clone()),
                &target(),
                &want(0, true, false),
                CrdSupport::ALL
            )
            .is_ok()
        );
        let err = apply(&route(v), &target(), &want(0, false, true), CrdSupport::ALL).unwrap_err();
        assert_eq!(err.category(), "RouteFull", "{err}");
    }

    #[test]
    fn crd_support_from_schema() {
        let crd = |rule_props: Value| json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": {"properties": {"rules": {"items": {"properties": rule_props}}}}}}}}]}});
        let new = crd(
            json!({"name": {}, "filters": {"items": {"properties": {"requestMirror": {"properties": {"percent": {}, "fraction": {}}}}}}}),
        );
        assert_eq!(CrdSupport::from_crd(&new), CrdSupport::ALL);
        let old = crd(
            json!({"filters": {"items": {"properties": {"requestMirror": {"properties": {"backendRef": {}}}}}}}),
        );
        assert_eq!(
            CrdSupport::from_crd(&old),
            CrdSupport {
                rule_name: false,
                mirror_percent: false
            }
        );
        let Some(file) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::httproute_crd())
        else {
            return;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let doc: Value = serde_yaml::from_str(&text).expect("the upstream HTTPRoute CRD parses");
        assert_eq!(
            CrdSupport::from_crd(&doc),
            CrdSupport::ALL,
            "{}",
            file.display()
        );
        // The released v1.2.1 standard channel predates rule names and mirror fractions: a
        // cluster with it installed prunes both silently, and detection must say so.
        use sluice_testkit::prereq::{Upstream, or_skip, upstream_file};
        let Some(old_file) = or_skip(upstream_file(
            Upstream::GatewayApiOld,
            "gateway.networking.k8s.io_httproutes.yaml",
        )) else {
            return;
        };
        let text = std::fs::read_to_string(&old_file).unwrap();
        let doc: Value = serde_yaml::from_str(&text).expect("the v1.2.1 HTTPRoute CRD parses");
        assert_eq!(
            CrdSupport::from_crd(&doc),
            CrdSupport {
                rule_name: false,
                mirror_percent: false
            },
            "{}",
            old_file.display()
        );
    }
}
