//! The part of a stored Gateway API HTTPRoute or GRPCRoute that decides where requests go: rules,
//! their matches, weighted backendRefs and RequestMirror filters. A GRPCRoute's method match
//! becomes the path match of its HTTP/2 request (`/<service>/<method>`). Parsed from the object's JSON as the
//! API returns it, so it works with whatever Gateway API version is installed. Pure; never
//! writes a route.

use serde_json::Value;

/// A route's traffic-relevant rules, in stored order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteModel {
    /// Rules in `spec.rules` order.
    pub rules: Vec<RuleModel>,
}

/// One rule.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleModel {
    /// `matches` (an absent or empty list means one match on path prefix `/`).
    pub matches: Vec<MatchModel>,
    /// `(Service name, weight)` of each backendRef; weight defaults to 1.
    pub backends: Vec<(String, u32)>,
    /// `(Service name, fraction 0..1)` of each RequestMirror filter.
    pub mirrors: Vec<(String, f64)>,
}

/// How a path is matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// `Exact`.
    Exact(String),
    /// `PathPrefix` (segment-wise).
    Prefix(String),
    /// `RegularExpression` (never matched by the simulator's requests).
    Regex(String),
}

/// One HTTPRouteMatch.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchModel {
    /// Path match; default prefix `/`.
    pub path: PathMatch,
    /// Method, if matched.
    pub method: Option<String>,
    /// Header matches: `(lower-case name, value, exact?)`.
    pub headers: Vec<(String, String, bool)>,
    /// Number of query parameter matches (the simulator's requests carry none).
    pub query_params: usize,
}

impl Default for MatchModel {
    fn default() -> Self {
        Self {
            path: PathMatch::Prefix("/".into()),
            method: None,
            headers: Vec::new(),
            query_params: 0,
        }
    }
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

impl RouteModel {
    /// Reads the rules of an HTTPRoute or GRPCRoute object (`{"spec": {"rules": [...]}}`).
    pub fn from_object(route: &Value) -> Self {
        let rules = route
            .pointer("/spec/rules")
            .and_then(Value::as_array)
            .map(|rules| rules.iter().map(RuleModel::from_value).collect())
            .unwrap_or_default();
        RouteModel { rules }
    }
}

impl RuleModel {
    fn from_value(rule: &Value) -> Self {
        let mut matches: Vec<MatchModel> = rule
            .get("matches")
            .and_then(Value::as_array)
            .map(|ms| ms.iter().map(MatchModel::from_value).collect())
            .unwrap_or_default();
        if matches.is_empty() {
            matches.push(MatchModel::default());
        }
        let backends = rule
            .get("backendRefs")
            .and_then(Value::as_array)
            .map(|refs| {
                refs.iter()
                    .filter_map(|b| {
                        let name = str_at(b, "name")?.to_string();
                        let weight = b.get("weight").and_then(Value::as_u64).unwrap_or(1);
                        Some((name, u32::try_from(weight).unwrap_or(u32::MAX)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mirrors = rule
            .get("filters")
            .and_then(Value::as_array)
            .map(|filters| {
                filters
                    .iter()
                    .filter(|f| str_at(f, "type") == Some("RequestMirror"))
                    .filter_map(|f| {
                        let m = f.get("requestMirror")?;
                        let name = m.pointer("/backendRef/name")?.as_str()?.to_string();
                        Some((name, mirror_fraction(m)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        RuleModel {
            matches,
            backends,
            mirrors,
        }
    }
}

/// `percent` (0..100) or `fraction` (`numerator`/`denominator`, default 100); neither = 100%.
fn mirror_fraction(m: &Value) -> f64 {
    if let Some(p) = m.get("percent").and_then(Value::as_f64) {
        return (p / 100.0).clamp(0.0, 1.0);
    }
    if let Some(f) = m.get("fraction") {
        let num = f.get("numerator").and_then(Value::as_f64).unwrap_or(0.0);
        let den = f
            .get("denominator")
            .and_then(Value::as_f64)
            .unwrap_or(100.0);
        if den > 0.0 {
            return (num / den).clamp(0.0, 1.0);
        }
    }
    1.0
}

impl MatchModel {
    fn from_value(m: &Value) -> Self {
        let grpc_method = m.get("method").filter(|v| v.is_object());
        let path = match (grpc_method, m.get("path")) {
            // GRPCRoute: the call's path is `/<service>/<method>`.
            (Some(g), _) => {
                let service = str_at(g, "service");
                let method = str_at(g, "method");
                match (str_at(g, "type").unwrap_or("Exact"), service, method) {
                    ("Exact", Some(s), Some(m)) => PathMatch::Exact(format!("/{s}/{m}")),
                    ("Exact", Some(s), None) => PathMatch::Prefix(format!("/{s}")),
                    // A method of any service, or a regular expression: never matched here.
                    (_, s, m) => PathMatch::Regex(format!(
                        "/{}/{}",
                        s.unwrap_or_default(),
                        m.unwrap_or_default()
                    )),
                }
            }
            (None, None) => PathMatch::Prefix("/".into()),
            (None, Some(p)) => {
                let value = str_at(p, "value").unwrap_or("/").to_string();
                match str_at(p, "type").unwrap_or("PathPrefix") {
                    "Exact" => PathMatch::Exact(value),
                    "RegularExpression" => PathMatch::Regex(value),
                    _ => PathMatch::Prefix(value),
                }
            }
        };
        let headers = m
            .get("headers")
            .and_then(Value::as_array)
            .map(|hs| {
                hs.iter()
                    .filter_map(|h| {
                        Some((
                            str_at(h, "name")?.to_ascii_lowercase(),
                            str_at(h, "value").unwrap_or_default().to_string(),
                            str_at(h, "type").unwrap_or("Exact") == "Exact",
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        MatchModel {
            path,
            method: str_at(m, "method").map(str::to_string),
            headers,
            query_params: m
                .get("queryParams")
                .and_then(Value::as_array)
                .map_or(0, Vec::len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_grpc_method_match_is_the_path_of_the_call() {
        let route = json!({"spec": {"rules": [
            {"matches": [{"method": {"service": "shop.Checkout", "method": "Pay"}}],
             "backendRefs": [{"name": "c-v1", "port": 9000}]},
            {"matches": [{"method": {"service": "shop.Checkout"}, "headers": [{"name": "X-Cohort", "value": "staff"}]}],
             "backendRefs": [{"name": "c-v2", "port": 9000}]},
            {"matches": [{"method": {"method": "Pay"}}]},
            {"backendRefs": [{"name": "c-v1", "weight": 99}, {"name": "c-v2", "weight": 1}]}
        ]}});
        let m = RouteModel::from_object(&route);
        let paths: Vec<&PathMatch> = m.rules.iter().map(|r| &r.matches[0].path).collect();
        assert_eq!(
            paths,
            [
                &PathMatch::Exact("/shop.Checkout/Pay".into()),
                &PathMatch::Prefix("/shop.Checkout".into()),
                &PathMatch::Regex("//Pay".into()),
                &PathMatch::Prefix("/".into()),
            ]
        );
        assert!(m.rules.iter().all(|r| r.matches[0].method.is_none()));
        assert_eq!(m.rules[1].matches[0].headers.len(), 1);
        assert_eq!(
            m.rules[3].backends,
            vec![("c-v1".to_string(), 99), ("c-v2".to_string(), 1)]
        );
    }

    #[test]
    fn parses_weights_matches_and_mirrors() {
        let route = json!({"spec": {"rules": [
            {"matches": [{"method": "GET"}],
             "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "c-v2", "port": 80}, "percent": 20}}],
             "backendRefs": [{"name": "c-v1", "port": 80}]},
            {"matches": [{"headers": [{"name": "X-Cohort", "value": "staff"}]}],
             "backendRefs": [{"name": "c-v2", "port": 80, "weight": 1}]},
            {"filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "c-v2"}, "fraction": {"numerator": 1, "denominator": 4}}}],
             "backendRefs": [{"name": "c-v1", "weight": 90}, {"name": "c-v2", "weight": 10}]},
            {"matches": [{"path": {"type": "Exact", "value": "/health"}, "queryParams": [{"name": "a", "value": "b"}]}]}
        ]}});
        let m = RouteModel::from_object(&route);
        assert_eq!(m.rules.len(), 4);
        assert_eq!(m.rules[0].matches[0].method.as_deref(), Some("GET"));
        assert_eq!(m.rules[0].mirrors, vec![("c-v2".to_string(), 0.2)]);
        assert_eq!(m.rules[0].backends, vec![("c-v1".to_string(), 1)]);
        assert_eq!(
            m.rules[1].matches[0].headers,
            vec![("x-cohort".to_string(), "staff".to_string(), true)]
        );
        assert_eq!(m.rules[2].matches, vec![MatchModel::default()]);
        assert_eq!(m.rules[2].mirrors, vec![("c-v2".to_string(), 0.25)]);
        assert_eq!(
            m.rules[2].backends,
            vec![("c-v1".to_string(), 90), ("c-v2".to_string(), 10)]
        );
        assert_eq!(
            m.rules[3].matches[0].path,
            PathMatch::Exact("/health".into())
        );
        assert_eq!(m.rules[3].matches[0].query_params, 1);
        assert!(m.rules[3].backends.is_empty());
        assert_eq!(RouteModel::from_object(&json!({})), RouteModel::default());
    }
}
