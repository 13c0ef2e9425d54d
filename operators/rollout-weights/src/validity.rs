//! Validity of a Rollout beyond what the API server's schema and CEL rules enforce: delegates to
//! `sluice_api::validation` (which also re-checks the CEL rules, in case the API server did not
//! run them) and turns its field errors into condition-message lines, each naming its field
//! (`spec.analysisInterval: ...`).
//!
//! An inline PromQL gate is also parsed: its `{{variables}}` are given placeholders and the
//! query is checked by a PromQL parser (`sluice_analysis::template::check_syntax`), so a query
//! Prometheus would refuse is a spec problem naming `spec.gates[i].promql`, not a metrics outage.
//!
//! The fields that scope the gates' telemetry (`spec.stableWorkload`, `spec.trafficSource`) are
//! checked too (`RolloutSpec::telemetry_problems`): an empty or malformed workload name would
//! match no request, and the share would never confirm.
//!
//! Weight steps that could never complete are refused too (`weight_plan_problems`): a
//! `setWeight` of 100 (no stable traffic is left to judge the canary against), of 0 (no canary
//! traffic: the share cannot be confirmed), and a plan without any `setWeight` (it would go from
//! 0% to 100% with no live weight ever judged).
//!
//! The steps must fit the route kind (`route_kind_problems`), each problem naming its field: a
//! GRPCRoute (`spec.routeRef.kind: GRPCRoute`) refuses mirror steps that name no `grpcMethods`
//! (gRPC has no idempotent verb: only the methods the Rollout declares safe to receive twice are
//! mirrored); an HTTPRoute refuses `grpcMethods`.
//!
//! With `spec.additionalRoutes` (`additional_route_problems`), every route takes every step of
//! the one plan; only a mirror step with routes of two kinds is refused (its methods are named
//! for one kind).
//!
//! Pure; never reads the cluster.

use sluice_api::v1alpha1::{RolloutSpec, gate::template_variables, rollout::RouteKindName};

/// The spec's problems, each `path: what is wrong`; empty when it is valid.
/// `allow_free_form_promql` is the platform's policy for free-form PromQL gates.
pub fn problems(spec: &RolloutSpec, allow_free_form_promql: bool) -> Vec<String> {
    let errors = spec.validate(allow_free_form_promql);
    let mut out: Vec<String> = errors
        .iter()
        .chain(&spec.telemetry_problems())
        .map(ToString::to_string)
        .chain(weight_plan_problems(spec))
        .chain(route_kind_problems(spec))
        .chain(additional_route_problems(spec))
        .collect();
    for (i, gate) in spec.gates.iter().enumerate() {
        let path = format!("spec.gates[{i}].promql");
        if let Some(q) = &gate.definition.promql
            && !errors.iter().any(|e| e.path == path)
            && let Some(problem) = promql_problem(q)
        {
            out.push(format!("{path}: {problem}"));
        }
    }
    out
}

/// The weight steps that could never complete, each naming its field.
pub fn weight_plan_problems(spec: &RolloutSpec) -> Vec<String> {
    let mut out = Vec::new();
    let weights: Vec<(usize, u32)> = spec
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.set_weight.as_ref().map(|w| (i, w.weight)))
        .collect();
    for &(i, weight) in &weights {
        match weight {
            0 => out.push(format!(
                "spec.steps[{i}].setWeight.weight: 0 sends the canary no traffic, so its share \
                 can never be confirmed; use 1 to 99, or remove the step"
            )),
            100 => out.push(format!(
                "spec.steps[{i}].setWeight.weight: 100 leaves no stable traffic to judge the \
                 canary against; use a promote step (or let the last step complete) for 100%"
            )),
            _ => {}
        }
    }
    if weights.is_empty() && !spec.steps.is_empty() {
        out.push(
            "spec.steps: no setWeight step: the canary would go from 0% to 100% without a live \
             weight ever being judged; add a setWeight step (e.g. 1 or 5) before promotion"
                .to_owned(),
        );
    }
    out
}

/// What the route kind cannot carry, each naming its field: on a GRPCRoute, mirror steps without
/// `grpcMethods` (gRPC has no idempotent verb to mirror by); on an HTTPRoute, `grpcMethods`.
pub fn route_kind_problems(spec: &RolloutSpec) -> Vec<String> {
    let mut out = Vec::new();
    if spec.route_ref.kind != RouteKindName::GrpcRoute {
        for (i, step) in spec.steps.iter().enumerate() {
            if step
                .mirror
                .as_ref()
                .is_some_and(|m| !m.grpc_methods.is_empty())
            {
                out.push(format!(
                    "spec.steps[{i}].mirror.grpcMethods: only for a GRPCRoute (spec.routeRef.kind); \
                     an HTTPRoute mirrors by spec.steps[{i}].mirror.methods"
                ));
            }
        }
        return out;
    }
    for (i, step) in spec.steps.iter().enumerate() {
        if step
            .mirror
            .as_ref()
            .is_some_and(|m| m.grpc_methods.is_empty())
        {
            out.push(format!(
                "spec.steps[{i}].mirror.grpcMethods: required for a GRPCRoute \
                 (spec.routeRef.kind): gRPC has no idempotent method to mirror by, so name each \
                 method that is safe to receive twice (service and method), or remove the step"
            ));
        }
    }
    out
}

/// What several routes cannot carry, each naming its field: with `spec.additionalRoutes` of
/// another kind than `spec.routeRef`'s, mirror steps (a mirror step names the methods of one
/// route kind: `methods` for HTTPRoute, `grpcMethods` for GRPCRoute). Every route takes the
/// plan's every step otherwise, header-cohort and mirror steps included.
pub fn additional_route_problems(spec: &RolloutSpec) -> Vec<String> {
    let Some(other) = spec
        .additional_routes
        .iter()
        .find(|r| r.kind != spec.route_ref.kind)
    else {
        return Vec::new();
    };
    spec.steps
        .iter()
        .enumerate()
        .filter(|(_, step)| step.mirror.is_some())
        .map(|(i, _)| {
            format!(
                "spec.steps[{i}].mirror: not supported with spec.additionalRoutes of another kind \
                 ({} {}, beside {} {}): a mirror step names the methods of one route kind; \
                 remove the step or route every route of the plan with one kind",
                other.kind.as_str(),
                other.name,
                spec.route_ref.kind.as_str(),
                spec.route_ref.name
            )
        })
        .collect()
}

/// What is wrong with a gate's PromQL once its variables have values, if anything. Unknown
/// variables are the validation's finding (it names the allowed ones), so only placement and
/// syntax are reported here.
pub fn promql_problem(promql: &str) -> Option<String> {
    if promql.trim().is_empty() || template_variables(promql).iter().any(String::is_empty) {
        return None;
    }
    sluice_analysis::template::check_syntax(promql)
        .err()
        .map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_runtime::validity::checks;

    fn spec(patch: serde_json::Value) -> RolloutSpec {
        let base = serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "checkout-v1"},
            "canaryService": {"name": "checkout-v2"},
            "canaryWorkload": {"name": "checkout-v2"},
            "steps": [{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 50}}],
        });
        checks::patched(base, &patch)
    }

    #[test]
    fn an_unparseable_inline_query_names_its_gate_and_the_parsers_reason() {
        let gate = |q: &str| {
            serde_json::json!({"gates": [
                {"name": "ok", "builtin": "ErrorRatioVsStable"},
                {"name": "mine", "promql": q, "comparison": {"absolute": {"op": "LessThan", "value": 1.0}}},
            ]})
        };
        let good = r#"sum(rate(errors_total{service="{{canaryService}}"}[{{window}}]))"#;
        assert_eq!(problems(&spec(gate(good)), true), Vec::<String>::new());
        let bad = r#"sum(rate(errors_total{service="{{canaryService}}"}[{{window}}])"#;
        let got = problems(&spec(gate(bad)), true);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with(
                "spec.gates[1].promql: template is not valid PromQL once its variables have values: "
            ),
            "{got:?}"
        );
        assert!(got[0].contains("unclosed left parenthesis"), "{got:?}");
        // Refused for policy (free-form off): that one problem, not a second about syntax.
        let got = problems(&spec(gate(bad)), false);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("free-form PromQL is disabled"), "{got:?}");
    }

    #[test]
    fn an_empty_traffic_source_workload_is_refused_naming_the_field() {
        let got = problems(
            &spec(serde_json::json!({
                "trafficSource": {"workloads": ["istio-ingressgateway", ""], "namespace": "istio-system"}
            })),
            false,
        );
        assert_eq!(
            got,
            vec![
                "spec.trafficSource.workloads[1]: must not be empty: name the client workload as \
                 Istio reports it in source_workload (e.g. istio-ingressgateway)"
                    .to_owned()
            ]
        );
        let ok = problems(
            &spec(serde_json::json!({"trafficSource": {"workloads": ["istio-ingressgateway"]}})),
            false,
        );
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn weight_steps_that_could_never_complete_are_refused() {
        let steps = |s: serde_json::Value| spec(serde_json::json!({ "steps": s }));
        assert_eq!(
            problems(
                &steps(serde_json::json!([
                    {"setWeight": {"weight": 0}},
                    {"setWeight": {"weight": 100}}
                ])),
                false
            ),
            vec![
                "spec.steps[0].setWeight.weight: 0 sends the canary no traffic, so its share can \
                 never be confirmed; use 1 to 99, or remove the step"
                    .to_owned(),
                "spec.steps[1].setWeight.weight: 100 leaves no stable traffic to judge the canary \
                 against; use a promote step (or let the last step complete) for 100%"
                    .to_owned(),
            ]
        );
        assert_eq!(
            problems(
                &steps(serde_json::json!([
                    {"mirror": {"percent": 100, "duration": "1m"}},
                    {"promote": {}}
                ])),
                false
            ),
            vec![
                "spec.steps: no setWeight step: the canary would go from 0% to 100% without a \
                 live weight ever being judged; add a setWeight step (e.g. 1 or 5) before promotion"
                    .to_owned()
            ]
        );
        let usual = steps(serde_json::json!([
            {"mirror": {"percent": 100, "duration": "1m"}},
            {"setWeight": {"weight": 1}},
            {"pause": {"untilPromoted": true}},
            {"setWeight": {"weight": 99}},
            {"promote": {}}
        ]));
        assert_eq!(problems(&usual, false), Vec::<String>::new());
    }

    #[test]
    fn a_grpc_route_takes_weight_and_cohort_steps_and_mirrors_only_declared_methods() {
        let on = |kind: &str| {
            spec(serde_json::json!({
                "routeRef": {"kind": kind, "name": "payments"},
                "steps": [
                    {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "1m"}},
                    {"mirror": {"percent": 100, "duration": "1m"}},
                    {"setWeight": {"weight": 5}}
                ]
            }))
        };
        assert_eq!(problems(&on("HTTPRoute"), false), Vec::<String>::new());
        assert_eq!(
            problems(&on("GRPCRoute"), false),
            vec![
                "spec.steps[1].mirror.grpcMethods: required for a GRPCRoute \
                 (spec.routeRef.kind): gRPC has no idempotent method to mirror by, so name each \
                 method that is safe to receive twice (service and method), or remove the step"
                    .to_owned(),
            ]
        );
        let declared = |kind: &str| {
            spec(serde_json::json!({
                "routeRef": {"kind": kind, "name": "payments"},
                "steps": [
                    {"mirror": {"grpcMethods": [{"service": "pay.v1.Ledger", "method": "GetBalance"}], "duration": "1m"}},
                    {"setWeight": {"weight": 5}}
                ]
            }))
        };
        assert_eq!(
            problems(&declared("GRPCRoute"), false),
            Vec::<String>::new()
        );
        assert_eq!(
            problems(&declared("HTTPRoute"), false),
            vec![
                "spec.steps[0].mirror.grpcMethods: only for a GRPCRoute (spec.routeRef.kind); an \
                 HTTPRoute mirrors by spec.steps[0].mirror.methods"
                    .to_owned()
            ]
        );
        let weights =
            spec(serde_json::json!({"routeRef": {"kind": "GRPCRoute", "name": "payments"}}));
        assert_eq!(problems(&weights, false), Vec::<String>::new());
        // Absent kind: HTTPRoute, and it is not written back.
        let default = spec(serde_json::json!({}));
        assert_eq!(default.route_ref.kind, RouteKindName::HttpRoute);
        assert!(
            serde_json::to_value(&default.route_ref)
                .unwrap()
                .get("kind")
                .is_none()
        );
    }

    #[test]
    fn problems_name_their_field() {
        checks::problems_name_their_fields(
            |patch| problems(&spec(patch.clone()), false),
            [
                (
                    serde_json::json!({"analysisInterval": "0s"}),
                    vec!["spec.analysisInterval"],
                ),
                (
                    serde_json::json!({"stepDuration": "0m", "handBackDeadline": "0h"}),
                    vec!["spec.stepDuration", "spec.handBackDeadline"],
                ),
                (
                    serde_json::json!({"steps": [{"setWeight": {"weight": 5, "duration": "0s"}}]}),
                    vec!["spec.steps[0].setWeight.duration"],
                ),
                (
                    serde_json::json!({"steps": [{"setWeight": {"weight": 5}}, {"pause": {"duration": "0ms"}}]}),
                    vec!["spec.steps[1].pause.duration"],
                ),
            ],
        );
    }

    #[test]
    fn additional_routes_take_every_step_and_only_a_mirror_across_two_kinds_is_refused() {
        let steps = serde_json::json!({"steps": [
            {"mirror": {}},
            {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
            {"setWeight": {"weight": 5}},
        ]});
        let mut same_kind = steps.clone();
        same_kind["additionalRoutes"] = serde_json::json!([{"name": "checkout-mesh"}]);
        assert_eq!(problems(&spec(same_kind), false), Vec::<String>::new());
        let mut two_kinds = steps.clone();
        two_kinds["additionalRoutes"] = serde_json::json!([{"name": "checkout-mesh"}, {"kind": "GRPCRoute", "name": "checkout-grpc"}]);
        assert_eq!(
            additional_route_problems(&spec(two_kinds)),
            vec![
                "spec.steps[0].mirror: not supported with spec.additionalRoutes of another kind \
                 (GRPCRoute checkout-grpc, beside HTTPRoute checkout): a mirror step names the \
                 methods of one route kind; remove the step or route every route of the plan \
                 with one kind"
                    .to_owned()
            ]
        );
        let weights = spec(serde_json::json!({"additionalRoutes": [{"name": "checkout-mesh"}]}));
        assert!(problems(&weights, true).is_empty());
    }
}
