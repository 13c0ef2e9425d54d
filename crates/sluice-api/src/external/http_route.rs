//! Typed view of a Gateway API `HTTPRoute` (gateway.networking.k8s.io/v1, v1.6.1 standard
//! channel): rules, matches, filters (incl. RequestMirror percent/fraction), backendRefs with
//! weights, rule names.
//!
//! Owns lossless parsing and a few pure lookups. Never decides weights; rollout-weights does.
//! `spec.rules` is an atomic list (at most 16 rules): a write replaces it whole, so keeping every
//! unmodelled field in `extra` is what keeps foreign configuration intact.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Extra, external_resource};

/// The API group of HTTPRoute.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// Most rules an HTTPRoute may hold (Gateway API v1.6.1).
pub const MAX_RULES: usize = 16;
/// Most matches over all rules of an HTTPRoute (Gateway API v1.6.1).
pub const MAX_MATCHES: usize = 128;
/// Most backendRefs in one rule (Gateway API v1.6.1).
pub const MAX_BACKEND_REFS: usize = 16;

/// A Gateway API HTTPRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    /// `gateway.networking.k8s.io/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `HTTPRoute`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The route's spec.
    #[serde(default)]
    pub spec: HttpRouteSpec,
    /// Status, kept verbatim (sluice never writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unmodelled top-level fields.
    #[serde(flatten)]
    pub extra: Extra,
}

external_resource!(
    HttpRoute,
    "gateway.networking.k8s.io",
    "v1",
    "HTTPRoute",
    "httproutes",
    k8s_openapi::NamespaceResourceScope
);

/// `spec` of an HTTPRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// Gateways (or other parents) the route attaches to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_refs: Option<Vec<ParentReference>>,
    /// Hostnames matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostnames: Option<Vec<String>>,
    /// Rules (atomic list, at most 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<HttpRouteRule>>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A parent reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// API group of the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind of the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the parent.
    pub name: String,
    /// Namespace of the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Listener name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// Listener port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One rule of an HTTPRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// Rule name (needs Gateway API ≥ v1.2 CRDs; older CRDs prune it silently).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Matches (any one selects the rule). Absent: matches every request (path prefix `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<HttpRouteMatch>>,
    /// Filters applied to matched requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Vec<HttpRouteFilter>>,
    /// Weighted backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_refs: Option<Vec<HttpBackendRef>>,
    /// Unmodelled fields (timeouts, retry, sessionPersistence, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A request match.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// Path match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathMatch>,
    /// Header matches (all must hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<HttpHeaderMatch>>,
    /// HTTP method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Unmodelled fields (queryParams, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A path match.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathMatch {
    /// Exact, PathPrefix or RegularExpression.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub match_type: Option<String>,
    /// The path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A header match.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderMatch {
    /// Exact or RegularExpression.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub match_type: Option<String>,
    /// Header name.
    pub name: String,
    /// Header value.
    pub value: String,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A filter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    /// Filter type: RequestMirror, RequestHeaderModifier, URLRewrite, ...
    #[serde(rename = "type")]
    pub filter_type: String,
    /// The RequestMirror configuration, for type RequestMirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<RequestMirror>,
    /// Unmodelled fields (other filter configurations).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Filter type of a request mirror.
pub const FILTER_REQUEST_MIRROR: &str = "RequestMirror";

/// Mirror requests to a backend (responses discarded).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestMirror {
    /// The backend receiving copies.
    pub backend_ref: BackendObjectReference,
    /// Percentage of requests mirrored, 0..100 (one of percent or fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// Fraction of requests mirrored (one of percent or fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl RequestMirror {
    /// The mirrored share in percent: `percent`, or the fraction's value; 100 when neither is
    /// set (Gateway API's default).
    pub fn share_percent(&self) -> f64 {
        match (&self.percent, &self.fraction) {
            (Some(p), _) => f64::from(*p),
            (None, Some(f)) => {
                let den = f.denominator.unwrap_or(100);
                if den == 0 {
                    0.0
                } else {
                    100.0 * f64::from(f.numerator) / f64::from(den)
                }
            }
            (None, None) => 100.0,
        }
    }
}

/// A fraction (denominator defaults to 100).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    /// Numerator.
    pub numerator: i32,
    /// Denominator; absent means 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denominator: Option<i32>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A reference to a backend object (a Service by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendObjectReference {
    /// API group; absent or empty: core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; absent: Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace; absent: the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A weighted backend of a rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBackendRef {
    /// API group; absent or empty: core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; absent: Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace; absent: the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Weight; absent means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Per-backend filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Vec<HttpRouteFilter>>,
    /// Unmodelled fields.
    #[serde(flatten)]
    pub extra: Extra,
}

impl HttpBackendRef {
    /// Whether this backend is the Service `name` in the route's namespace.
    pub fn is_service(&self, name: &str) -> bool {
        self.name == name
            && self.group.as_deref().unwrap_or("").is_empty()
            && self.kind.as_deref().unwrap_or("Service") == "Service"
            && self.namespace.is_none()
    }

    /// The effective weight (absent means 1).
    pub fn effective_weight(&self) -> i32 {
        self.weight.unwrap_or(1)
    }
}

impl HttpRouteRule {
    /// The backendRef for Service `name`, if present.
    pub fn backend(&self, name: &str) -> Option<&HttpBackendRef> {
        self.backend_refs
            .iter()
            .flatten()
            .find(|b| b.is_service(name))
    }

    /// Mutable backendRef for Service `name`, if present.
    pub fn backend_mut(&mut self, name: &str) -> Option<&mut HttpBackendRef> {
        self.backend_refs
            .iter_mut()
            .flatten()
            .find(|b| b.is_service(name))
    }

    /// The share of the rule's traffic Service `name` receives from its weights, percent
    /// (0 when absent or when every weight is 0).
    pub fn weight_share_percent(&self, name: &str) -> f64 {
        let total: i64 = self
            .backend_refs
            .iter()
            .flatten()
            .map(|b| i64::from(b.effective_weight()))
            .sum();
        match self.backend(name) {
            Some(b) if total > 0 => 100.0 * b.effective_weight() as f64 / total as f64,
            _ => 0.0,
        }
    }

    /// Number of matches of the rule (an absent list counts as one implicit match).
    pub fn match_count(&self) -> usize {
        self.matches.as_ref().map_or(1, Vec::len)
    }
}

impl HttpRoute {
    /// The rules (empty when absent).
    pub fn rules(&self) -> &[HttpRouteRule] {
        self.spec.rules.as_deref().unwrap_or_default()
    }

    /// The rule named `name`.
    pub fn rule_by_name(&self, name: &str) -> Option<&HttpRouteRule> {
        self.rules()
            .iter()
            .find(|r| r.name.as_deref() == Some(name))
    }

    /// Indices of the rules with a backendRef to Service `service`.
    pub fn rules_with_backend(&self, service: &str) -> Vec<usize> {
        self.rules()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.backend(service).is_some())
            .map(|(i, _)| i)
            .collect()
    }

    /// Matches over all rules (the Gateway API limit is [`MAX_MATCHES`]).
    pub fn match_count(&self) -> usize {
        self.rules().iter().map(HttpRouteRule::match_count).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::roundtrip::assert_roundtrip;
    use serde_json::json;

    fn rich_route() -> Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {
                "name": "checkout",
                "namespace": "shop",
                "resourceVersion": "4711",
                "generation": 3,
                "labels": {"app": "checkout"},
                "annotations": {"sluice.dev/owned-by-rollout": "shop/checkout", "team": "payments"},
                "managedFields": [{
                    "manager": "argocd-controller",
                    "operation": "Apply",
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:hostnames": {}}}
                }]
            },
            "spec": {
                "parentRefs": [{"name": "mesh-gw", "namespace": "gateways", "sectionName": "https", "futureParentField": true}],
                "hostnames": ["shop.example.com"],
                "rules": [
                    {
                        "name": "sluice-mirror",
                        "matches": [{"method": "GET", "path": {"type": "PathPrefix", "value": "/"}}],
                        "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "checkout-v2", "port": 8080}, "percent": 10}}],
                        "backendRefs": [{"name": "checkout-v1", "port": 8080}]
                    },
                    {
                        "name": "sluice-cohort",
                        "matches": [{"headers": [{"type": "Exact", "name": "x-cohort", "value": "staff"}]}],
                        "backendRefs": [{"name": "checkout-v2", "port": 8080, "weight": 1}]
                    },
                    {
                        "name": "main",
                        "matches": [{
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "queryParams": [{"type": "Exact", "name": "debug", "value": "1"}],
                            "headers": [{"name": "x-tenant", "value": "eu", "futureHeaderField": "x"}]
                        }],
                        "filters": [
                            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "main"}]}},
                            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}, "fraction": {"numerator": 1, "denominator": 1000}}},
                            {"type": "ExtensionRef", "extensionRef": {"group": "example.io", "kind": "Thing", "name": "t"}}
                        ],
                        "backendRefs": [
                            {"name": "checkout-v1", "port": 8080, "weight": 95, "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-v", "value": "1"}]}}]},
                            {"name": "checkout-v2", "port": 8080, "weight": 5},
                            {"group": "", "kind": "Service", "name": "legacy", "namespace": "old", "port": 80, "weight": 0}
                        ],
                        "timeouts": {"request": "10s", "backendRequest": "2s"},
                        "retry": {"attempts": 2, "codes": [503]},
                        "sessionPersistence": {"sessionName": "s", "type": "Cookie"}
                    },
                    {"backendRefs": [{"name": "catch-all", "port": 80}]}
                ],
                "useDefaultGateways": "All"
            },
            "status": {"parents": [{"parentRef": {"name": "mesh-gw"}, "controllerName": "istio.io/gateway-controller", "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}]}]}
        })
    }

    #[test]
    fn rich_route_round_trips_unchanged() {
        let route: HttpRoute = assert_roundtrip(&rich_route());
        assert_eq!(route.rules().len(), 4);
        let main = route.rule_by_name("main").unwrap();
        assert_eq!(main.backend("checkout-v2").unwrap().weight, Some(5));
        assert!(
            main.backend("legacy").is_none(),
            "another namespace's Service is not ours"
        );
        assert_eq!(route.rules_with_backend("checkout-v1"), vec![0, 2]);
        assert_eq!(route.match_count(), 4);
    }

    #[test]
    fn modifying_a_weight_changes_only_that_weight() {
        let doc = rich_route();
        let mut route: HttpRoute = serde_json::from_value(doc.clone()).unwrap();
        let rules = route.spec.rules.as_mut().unwrap();
        rules[2].backend_mut("checkout-v2").unwrap().weight = Some(25);
        rules[2].backend_mut("checkout-v1").unwrap().weight = Some(75);
        let mut want = doc;
        want["spec"]["rules"][2]["backendRefs"][0]["weight"] = json!(75);
        want["spec"]["rules"][2]["backendRefs"][1]["weight"] = json!(25);
        assert_eq!(serde_json::to_value(&route).unwrap(), want);
    }

    #[test]
    fn weight_share_and_mirror_share_table() {
        let route: HttpRoute = serde_json::from_value(rich_route()).unwrap();
        let main = route.rule_by_name("main").unwrap();
        assert!((main.weight_share_percent("checkout-v2") - 5.0).abs() < 1e-9);
        assert_eq!(main.weight_share_percent("nope"), 0.0);
        let catch_all = &route.rules()[3];
        assert_eq!(
            catch_all.weight_share_percent("catch-all"),
            100.0,
            "absent weight is 1"
        );
        let mirror = |rule: &HttpRouteRule, i: usize| {
            rule.filters.as_ref().unwrap()[i]
                .request_mirror
                .as_ref()
                .unwrap()
                .share_percent()
        };
        assert_eq!(mirror(&route.rules()[0], 0), 10.0);
        assert!((mirror(main, 1) - 0.1).abs() < 1e-9);
        let bare = RequestMirror::default();
        assert_eq!(bare.share_percent(), 100.0);
    }

    #[test]
    fn resource_metadata() {
        use kube::Resource;
        assert_eq!(HttpRoute::api_version(&()), "gateway.networking.k8s.io/v1");
        assert_eq!(HttpRoute::plural(&()), "httproutes");
        assert_eq!(
            HttpRoute::url_path(&(), Some("shop")),
            "/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes"
        );
    }

    /// Every field this view names exists in the released Gateway API CRD.
    #[test]
    fn field_names_exist_upstream() {
        let Some(path) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::httproute_crd())
        else {
            return;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let crd: Value = serde_yaml::from_str(&text).unwrap();
        let v1 = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "v1")
            .unwrap();
        let spec = &v1["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let rule = &spec["properties"]["rules"]["items"];
        let filter = &rule["properties"]["filters"]["items"];
        let mirror = &filter["properties"]["requestMirror"];
        let checks: &[(&Value, &[&str])] = &[
            (spec, &["parentRefs", "hostnames", "rules"]),
            (rule, &["name", "matches", "filters", "backendRefs"]),
            (
                &rule["properties"]["matches"]["items"],
                &["path", "headers", "method"],
            ),
            (filter, &["type", "requestMirror"]),
            (mirror, &["backendRef", "percent", "fraction"]),
            (
                &mirror["properties"]["fraction"],
                &["numerator", "denominator"],
            ),
            (
                &rule["properties"]["backendRefs"]["items"],
                &[
                    "group",
                    "kind",
                    "name",
                    "namespace",
                    "port",
                    "weight",
                    "filters",
                ],
            ),
        ];
        for (node, fields) in checks {
            for f in *fields {
                assert!(
                    node["properties"].get(f).is_some(),
                    "upstream HTTPRoute has no field {f}"
                );
            }
        }
        assert_eq!(spec["properties"]["rules"]["maxItems"], json!(MAX_RULES));
        assert_eq!(
            spec["properties"]["rules"]["x-kubernetes-list-type"],
            json!("atomic")
        );
    }
}
