//! The traffic split: which backend Services a service's requests reach, given the route rules
//! in force, the request mix (cohort header, idempotent methods, path) and the weight
//! distortion. Follows Gateway API match precedence (exact path, longest prefix, method, most
//! header matches, most query matches, then rule order), so cohort and mirror rules capture
//! each other's traffic exactly as a real data plane would. Also owns the propagation buffer
//! (what is in force after the delay). Pure; never reads the clock.

use super::route::{MatchModel, PathMatch, RouteModel, RuleModel};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One kind of request and its share of the service's requests.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestClass {
    /// Share of all requests (0..1).
    pub share: f64,
    /// Request path.
    pub path: String,
    /// Request method (`GET` or `POST`).
    pub method: &'static str,
    /// Headers: `(lower-case name, value)`.
    pub headers: Vec<(String, String)>,
}

/// The request mix of a service: GET vs POST, with and without the cohort header.
pub fn request_classes(
    path: &str,
    idempotent_share: f64,
    cohort: Option<(&str, &str, f64)>,
) -> Vec<RequestClass> {
    let (cohort_header, cohort_share) = match cohort {
        Some((name, value, share)) => (Some((name.to_ascii_lowercase(), value.to_string())), share),
        None => (None, 0.0),
    };
    let mut out = Vec::new();
    for (method, m_share) in [("GET", idempotent_share), ("POST", 1.0 - idempotent_share)] {
        for with_cohort in [true, false] {
            let c_share = if with_cohort {
                cohort_share
            } else {
                1.0 - cohort_share
            };
            let share = m_share * c_share;
            if share <= 0.0 {
                continue;
            }
            out.push(RequestClass {
                share,
                path: path.to_string(),
                method,
                headers: if with_cohort {
                    cohort_header.clone().into_iter().collect()
                } else {
                    Vec::new()
                },
            });
        }
    }
    out
}

/// The request mix of a service whose requests go to several paths (`(path, share)`, shares
/// adding up to 1): [`request_classes`] of each path, scaled by its share.
pub fn request_classes_by_path(
    paths: &[(&str, f64)],
    idempotent_share: f64,
    cohort: Option<(&str, &str, f64)>,
) -> Vec<RequestClass> {
    paths
        .iter()
        .filter(|(_, share)| *share > 0.0)
        .flat_map(|(path, share)| {
            request_classes(path, idempotent_share, cohort)
                .into_iter()
                .map(move |mut c| {
                    c.share *= share;
                    c
                })
        })
        .collect()
}

/// Where a service's requests go, as shares of all its requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    /// Backend Service → share of requests served (seen by source and destination reporters).
    pub served: BTreeMap<String, f64>,
    /// Backend Service → share of requests mirrored to it (seen by the destination reporter only).
    pub mirrored: BTreeMap<String, f64>,
    /// Share of requests no rule matched or whose rule has no weight (the gateway answers itself).
    pub unrouted: f64,
}

fn path_matches(m: &PathMatch, path: &str) -> bool {
    match m {
        PathMatch::Exact(v) => v == path,
        PathMatch::Prefix(v) => {
            let v = v.trim_end_matches('/');
            v.is_empty() || path == v || path.starts_with(&format!("{v}/"))
        }
        PathMatch::Regex(_) => false,
    }
}

fn matches(m: &MatchModel, req: &RequestClass) -> bool {
    path_matches(&m.path, &req.path)
        && m.method.as_deref().is_none_or(|x| x == req.method)
        && m.headers.iter().all(|(name, value, exact)| {
            *exact && req.headers.iter().any(|(n, v)| n == name && v == value)
        })
        && m.query_params == 0
}

/// Gateway API precedence key (larger wins): exact path, prefix length, method, headers, queries.
type Precedence = (u8, usize, bool, usize, usize);

fn precedence(m: &MatchModel) -> Precedence {
    let (kind, len) = match &m.path {
        PathMatch::Exact(v) => (2, v.len()),
        PathMatch::Prefix(v) => (1, v.len()),
        PathMatch::Regex(v) => (0, v.len()),
    };
    (
        kind,
        len,
        m.method.is_some(),
        m.headers.len(),
        m.query_params,
    )
}

/// The rule a request lands on: the most specific matching match, earliest rule on ties.
pub fn select_rule<'a>(route: &'a RouteModel, req: &RequestClass) -> Option<&'a RuleModel> {
    let mut best: Option<(&RuleModel, Precedence)> = None;
    for rule in &route.rules {
        for m in rule.matches.iter().filter(|m| matches(m, req)) {
            let key = precedence(m);
            if best.as_ref().is_none_or(|(_, k)| key > *k) {
                best = Some((rule, key));
            }
        }
    }
    best.map(|(r, _)| r)
}

/// Splits requests over backends. `weight_factor(backend)` distorts stored weights (1 =
/// faithful). With `route` absent every request goes to `default_backend`.
pub fn split(
    route: Option<&RouteModel>,
    classes: &[RequestClass],
    default_backend: &str,
    weight_factor: impl Fn(&str) -> f64,
) -> Split {
    let mut out = Split::default();
    let Some(route) = route else {
        out.served.insert(
            default_backend.to_string(),
            classes.iter().map(|c| c.share).sum(),
        );
        return out;
    };
    for class in classes {
        let Some(rule) = select_rule(route, class) else {
            out.unrouted += class.share;
            continue;
        };
        let weights: Vec<(&str, f64)> = rule
            .backends
            .iter()
            .map(|(b, w)| (b.as_str(), f64::from(*w) * weight_factor(b).max(0.0)))
            .collect();
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        if total <= 0.0 {
            out.unrouted += class.share;
            continue;
        }
        for (backend, w) in weights {
            *out.served.entry(backend.to_string()).or_default() += class.share * w / total;
        }
        for (backend, fraction) in &rule.mirrors {
            *out.mirrored.entry(backend.clone()).or_default() += class.share * fraction;
        }
    }
    out
}

/// What the proxies have: each observed change of a value becomes effective `delay` after it
/// was first observed. The first observation counts as already propagated (the world starts in
/// a steady state).
#[derive(Debug, Clone)]
pub struct Propagation<T> {
    /// `(first observed at, value)`, oldest first; the front is in force.
    history: Vec<(Instant, T)>,
}

impl<T: PartialEq + Clone> Default for Propagation<T> {
    fn default() -> Self {
        Self {
            history: Vec::new(),
        }
    }
}

impl<T: PartialEq + Clone> Propagation<T> {
    /// Records the value stored at `now` (a no-op unless it differs from the newest).
    pub fn observe(&mut self, now: Instant, value: T) {
        match self.history.last() {
            Some((_, last)) if *last == value => {}
            None => self.history.push((now - Duration::from_secs(3600), value)),
            Some(_) => self.history.push((now, value)),
        }
    }

    /// The value in force at `now`: the newest observed at least `delay` ago. Older entries
    /// are dropped.
    pub fn effective(&mut self, now: Instant, delay: Duration) -> Option<&T> {
        let in_force = self
            .history
            .iter()
            .rposition(|(at, _)| now.saturating_duration_since(*at) >= delay)?;
        self.history.drain(..in_force);
        self.history.first().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(rules: serde_json::Value) -> RouteModel {
        RouteModel::from_object(&json!({"spec": {"rules": rules}}))
    }

    fn weighted(stable: u32, canary: u32) -> serde_json::Value {
        json!({"backendRefs": [{"name": "stable", "weight": stable}, {"name": "canary", "weight": canary}]})
    }

    fn cohort_rule() -> serde_json::Value {
        json!({"matches": [{"headers": [{"name": "x-cohort", "value": "staff"}]}],
               "backendRefs": [{"name": "canary"}]})
    }

    fn mirror_rule(percent: u32) -> serde_json::Value {
        json!({"matches": [{"method": "GET"}],
               "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "canary"}, "percent": percent}}],
               "backendRefs": [{"name": "stable"}]})
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn split_table() {
        // (rules, idempotent share, cohort share, canary weight factor, want served canary,
        //  want served stable, want mirrored canary, want unrouted)
        let cases = vec![
            (
                json!([weighted(90, 10)]),
                0.8,
                0.0,
                1.0,
                0.10,
                0.90,
                0.0,
                0.0,
            ),
            (json!([weighted(100, 0)]), 0.8, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0),
            (json!([weighted(0, 100)]), 0.8, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0),
            (json!([weighted(0, 0)]), 0.8, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0),
            // Distortion: the canary gets half its weight.
            (
                json!([weighted(50, 50)]),
                0.8,
                0.0,
                0.5,
                1.0 / 3.0,
                2.0 / 3.0,
                0.0,
                0.0,
            ),
            // Cohort requests go to the canary; the rest split by weight.
            (
                json!([weighted(100, 0), cohort_rule()]),
                0.8,
                0.05,
                1.0,
                0.05,
                0.95,
                0.0,
                0.0,
            ),
            // Mirror: GETs (80%) served by stable, 50% of them copied to the canary.
            (
                json!([weighted(100, 0), mirror_rule(50)]),
                0.8,
                0.0,
                1.0,
                0.0,
                1.0,
                0.4,
                0.0,
            ),
            // Method outranks headers: cohort GETs land on the mirror rule (stable), only cohort
            // POSTs reach the canary — the pitfall the rollout operator designs around.
            (
                json!([weighted(100, 0), cohort_rule(), mirror_rule(100)]),
                0.8,
                0.1,
                1.0,
                0.1 * 0.2,
                1.0 - 0.1 * 0.2,
                0.8,
                0.0,
            ),
            // Exact path rule elsewhere does not capture "/".
            (
                json!([{"matches": [{"path": {"type": "Exact", "value": "/admin"}}], "backendRefs": [{"name": "canary"}]}, weighted(90, 10)]),
                0.8,
                0.0,
                1.0,
                0.10,
                0.90,
                0.0,
                0.0,
            ),
            // No rule matches: the gateway answers itself.
            (
                json!([{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": [{"name": "stable"}]}]),
                0.8,
                0.0,
                1.0,
                0.0,
                0.0,
                0.0,
                1.0,
            ),
        ];
        for (rules, idem, cohort, factor, canary, stable, mirrored, unrouted) in cases {
            let r = route(rules.clone());
            let classes = request_classes("/", idem, Some(("X-Cohort", "staff", cohort)));
            let s = split(Some(&r), &classes, "stable", |b| {
                if b == "canary" { factor } else { 1.0 }
            });
            let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
            assert!(
                close(get(&s.served, "canary"), canary),
                "canary {s:?} for {rules}"
            );
            assert!(
                close(get(&s.served, "stable"), stable),
                "stable {s:?} for {rules}"
            );
            assert!(
                close(get(&s.mirrored, "canary"), mirrored),
                "mirror {s:?} for {rules}"
            );
            assert!(close(s.unrouted, unrouted), "unrouted {s:?} for {rules}");
        }
    }

    #[test]
    fn a_method_mirror_copies_only_the_calls_of_that_method() {
        // A gRPC service's calls: 75% Charge, 25% GetReceipt; the managed rule serves the whole
        // service, the mirror rule copies half of GetReceipt's calls to the canary.
        let r = route(json!([
            {"name": "sluice-mirror",
             "matches": [{"method": {"type": "Exact", "service": "pay.Payments", "method": "GetReceipt"}}],
             "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "canary"}, "percent": 50}}],
             "backendRefs": [{"name": "stable", "weight": 100}, {"name": "canary", "weight": 0}]},
            {"matches": [{"method": {"service": "pay.Payments"}}],
             "backendRefs": [{"name": "stable", "weight": 100}, {"name": "canary", "weight": 0}]}
        ]));
        let classes = request_classes_by_path(
            &[
                ("/pay.Payments/Charge", 0.75),
                ("/pay.Payments/GetReceipt", 0.25),
            ],
            0.0,
            None,
        );
        assert!(close(classes.iter().map(|c| c.share).sum(), 1.0));
        let s = split(Some(&r), &classes, "stable", |_| 1.0);
        assert!(close(s.served["stable"], 1.0), "{s:?}");
        assert!(
            close(s.served.get("canary").copied().unwrap_or(0.0), 0.0),
            "{s:?}"
        );
        assert!(close(s.mirrored["canary"], 0.125), "{s:?}");
        assert!(close(s.unrouted, 0.0), "{s:?}");
    }

    #[test]
    fn no_route_sends_everything_to_the_default_backend() {
        let classes = request_classes("/", 0.8, None);
        let s = split(None, &classes, "stable", |_| 1.0);
        assert!(close(s.served["stable"], 1.0));
    }

    #[test]
    fn request_classes_sum_to_one() {
        for (idem, cohort) in [(0.8, 0.05), (1.0, 0.0), (0.0, 1.0), (0.5, 0.5)] {
            let total: f64 = request_classes("/", idem, Some(("h", "v", cohort)))
                .iter()
                .map(|c| c.share)
                .sum();
            assert!(close(total, 1.0), "idem={idem} cohort={cohort}: {total}");
        }
    }

    #[test]
    fn propagation_table() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let delay = Duration::from_secs(3);
        let mut p = Propagation::default();
        p.observe(s(0), 90);
        assert_eq!(
            p.effective(s(0), delay),
            Some(&90),
            "first observation is in force"
        );
        p.observe(s(1), 90);
        p.observe(s(2), 50);
        // (now, want)
        for (now, want) in [(2, 90), (4, 90), (5, 50), (6, 50)] {
            assert_eq!(p.effective(s(now), delay), Some(&want), "t={now}");
        }
        p.observe(s(10), 0);
        p.observe(s(11), 100);
        for (now, want) in [(12, 50), (13, 0), (14, 100)] {
            assert_eq!(p.effective(s(now), delay), Some(&want), "t={now}");
        }
        let mut empty: Propagation<u32> = Propagation::default();
        assert_eq!(empty.effective(s(0), delay), None);
    }
}
