//! Scenario `canary-grpc`: canary-abort on a gRPC service. The scenario applies the gRPC service
//! `payments` in east-1 (v1 stable, v2 canary, the GRPCRoute `shop/payments` all on v1); a Rollout
//! whose `routeRef.kind` is GRPCRoute takes it to v2 and holds 1%; once the mesh confirms the 1%,
//! v2 answers UNAVAILABLE (gRPC status 14) at 2.3× the stable ratio, on HTTP 200 as a gRPC server
//! does: no 5xx anywhere. The rollout-weights operator must abort on the error-ratio gate (whose
//! built-in query counts gRPC server errors), set the canary weight to 0 on the GRPCRoute and
//! confirm from telemetry that the canary share fell to ~0.
//! Figures: `abort_latency_ms` (fault injected → GRPCRoute reverted), `detect_to_revert_ms`,
//! `revert_verified_ms` (as canary-abort), `canary_unavailable` and `canary_5xx` (the canary's
//! requests with `grpc_response_status="14"` and with a 5xx `response_code` since the fault, read
//! once the revert is confirmed, as the source reporter counts them: the abort must stand on the
//! first, with the second at 0). Never writes the route itself: only the operator does; the scenario reads it.

use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_api::v1alpha1::Rollout;
use sluice_sim::mesh::scenario::Event;

use super::canary_abort::{
    CLUSTER, ERROR_FACTOR, Fault, REQUESTS_PER_SECOND, WINDOW_S, fault_until_reverted, gates,
    judge, rollout_named_until,
};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{self, GRPC_CANARY, GRPC_ROUTE, GRPC_RULE, GRPC_STABLE, SHOP};
use crate::sandbox::Sandbox;
use crate::share;

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "canary-grpc",
    description: "east-1's gRPC service payments v2 at 1% on its GRPCRoute starts answering \
                  UNAVAILABLE on HTTP 200 at 2.3x stable; pass when rollout-weights aborts on \
                  error-ratio, the GRPCRoute is back at 100/0 and telemetry confirms ~0 \
                  (abort_latency_ms, detect_to_revert_ms, revert_verified_ms, canary_unavailable)",
    budget: Duration::from_secs(120),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

pub(super) fn client(sandbox: &Sandbox) -> Result<Client, ScenarioError> {
    sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))
}

pub(super) fn api_error(action: String) -> impl FnOnce(kube::Error) -> ScenarioError {
    move |source| ScenarioError::Api {
        action,
        cluster: CLUSTER.into(),
        source,
    }
}

/// The API resource of one of the gRPC service's objects.
fn resource(kind: &str) -> Option<ApiResource> {
    let (group, version, plural) = match kind {
        "Service" => ("", "v1", "services"),
        "Deployment" => ("apps", "v1", "deployments"),
        "GRPCRoute" => ("gateway.networking.k8s.io", "v1", "grpcroutes"),
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// Creates the gRPC service's objects ([`baseline::grpc_service`]) in the canary cluster.
pub(super) async fn apply_grpc_service(sandbox: &Sandbox) -> Result<(), ScenarioError> {
    let client = client(sandbox)?;
    // Parsed before the first request: the YAML parser is not `Send`.
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&baseline::grpc_service())
        .map(Value::deserialize)
        .collect::<Result<_, _>>()
        .map_err(|e| ScenarioError::Missing(format!("a parsable gRPC service ({e})")))?;
    for value in docs {
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        let ar = resource(&kind)
            .ok_or_else(|| ScenarioError::Missing(format!("the API resource of {kind}")))?;
        let obj: DynamicObject = serde_json::from_value(value)
            .map_err(|e| ScenarioError::Missing(format!("a valid {kind} ({e})")))?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        Api::<DynamicObject>::namespaced_with(client.clone(), SHOP, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .map_err(api_error(format!("creating {kind} {SHOP}/{name}")))?;
    }
    Ok(())
}

/// (stable, canary) weights of the GRPCRoute's rule [`GRPC_RULE`] (an absent weight is 1).
pub fn weights(route: &Value) -> (i64, i64) {
    let Some(rule) = route["spec"]["rules"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["name"] == GRPC_RULE))
    else {
        return (0, 0);
    };
    let w = |name: &str| {
        rule["backendRefs"]
            .as_array()
            .and_then(|refs| refs.iter().find(|b| b["name"] == name))
            .map_or(0, |b| b["weight"].as_i64().unwrap_or(1))
    };
    (w(GRPC_STABLE), w(GRPC_CANARY))
}

/// The GRPCRoute API of the canary cluster's shop namespace.
pub(super) fn grpc_routes(sandbox: &Sandbox) -> Result<Api<DynamicObject>, ScenarioError> {
    let ar = resource("GRPCRoute").ok_or_else(|| ScenarioError::Missing("GRPCRoute".into()))?;
    Ok(Api::<DynamicObject>::namespaced_with(
        client(sandbox)?,
        SHOP,
        &ar,
    ))
}

/// Polls the GRPCRoute until `check` gives a value.
async fn route_until<T>(
    sandbox: &Sandbox,
    poll: Duration,
    mut check: impl FnMut(&Value) -> Option<T>,
) -> Result<T, ScenarioError> {
    let api = grpc_routes(sandbox)?;
    loop {
        if let Ok(r) = api.get(GRPC_ROUTE).await
            && let Ok(v) = serde_json::to_value(&r)
            && let Some(out) = check(&v)
        {
            return Ok(out);
        }
        tokio::time::sleep(poll).await;
    }
}

/// Polls the payments Rollout until `check` gives a value.
async fn rollout_until<T>(
    sandbox: &Sandbox,
    check: impl FnMut(&Rollout) -> Option<T>,
) -> Result<T, ScenarioError> {
    rollout_named_until(sandbox, GRPC_ROUTE, check).await
}

/// The Rollout of `shop/payments` from v1 to v2 on its GRPCRoute, with canary-abort's
/// seconds-scale settings and gates: 1% for 120 s, 50%, promote.
pub fn rollout() -> Result<Rollout, ScenarioError> {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": GRPC_ROUTE, "namespace": SHOP},
        "spec": {
            "routeRef": {"kind": "GRPCRoute", "name": GRPC_ROUTE, "ruleName": GRPC_RULE},
            "stableService": {"name": GRPC_STABLE},
            "canaryService": {"name": GRPC_CANARY},
            "canaryWorkload": {"name": GRPC_CANARY},
            "analysisInterval": "1s",
            "stepDuration": "2s",
            "appliedShareDeadline": "60s",
            "canaryReadyDeadline": "60s",
            "gates": gates(),
            "steps": [
                {"setWeight": {"weight": 1, "duration": "120s"}},
                {"setWeight": {"weight": 50}},
                {"promote": {}}
            ],
        },
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Rollout ({e})")))
}

/// The PromQL counting the canary's requests over the last `window_s` seconds that match
/// `matcher`, as the source reporter saw them.
pub fn canary_requests_query(matcher: &str, window_s: u64) -> String {
    format!(
        r#"sum(increase(istio_requests_total{{reporter="source", cluster="{CLUSTER}", destination_service_namespace="{SHOP}", destination_service_name="{GRPC_CANARY}", {matcher}}}[{window_s}s]))"#
    )
}

pub(super) async fn canary_requests(
    sandbox: &Sandbox,
    matcher: &str,
    window_s: u64,
) -> Result<f64, ScenarioError> {
    let samples = sandbox
        .prometheus()
        .query(&canary_requests_query(matcher, window_s), None)
        .await?;
    Ok(samples.first().map_or(0.0, |s| s.value))
}

/// The verdict: canary-abort's (error-ratio, route back at 100/0, verified, ~0 after), and the
/// abort must have stood on gRPC statuses alone: UNAVAILABLE seen on the canary, no 5xx.
pub fn judge_grpc(
    gate: Option<&str>,
    route: (i64, i64),
    verified: bool,
    share_after: Option<f64>,
    unavailable: f64,
    five_xx: f64,
) -> (bool, String) {
    let route = (
        i32::try_from(route.0).unwrap_or(i32::MAX),
        i32::try_from(route.1).unwrap_or(i32::MAX),
    );
    let (pass, summary) = judge(gate, route, verified, share_after);
    if !pass {
        return (false, summary);
    }
    if unavailable <= 0.0 {
        return (
            false,
            "Prometheus shows no UNAVAILABLE answer from the canary: the fault never reached the telemetry".into(),
        );
    }
    if five_xx > 0.0 {
        return (
            false,
            format!(
                "the canary answered {five_xx:.0} 5xx: the abort did not stand on gRPC statuses alone"
            ),
        );
    }
    (
        true,
        format!(
            "{summary}; the canary answered {unavailable:.0} UNAVAILABLE on HTTP 200 and no 5xx"
        ),
    )
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    apply_grpc_service(sandbox).await?;
    let mesh = sandbox
        .world(CLUSTER)
        .and_then(|w| w.mesh())
        .ok_or_else(|| ScenarioError::Missing(format!("mesh simulator of {CLUSTER}")))?;
    mesh.apply_now(Event {
        service: Some(GRPC_ROUTE.into()),
        requests_per_second: Some(REQUESTS_PER_SECOND),
        ..Event::default()
    });
    sandbox.say(format!(
        "canary-grpc: the gRPC service payments in {CLUSTER} at {REQUESTS_PER_SECOND} calls/s through GRPCRoute {SHOP}/{GRPC_ROUTE}; a Rollout takes it from v1 to v2 and holds 1%"
    ));
    Api::<Rollout>::namespaced(client(sandbox)?, SHOP)
        .create(&PostParams::default(), &rollout()?)
        .await
        .map_err(api_error(format!("creating Rollout {SHOP}/{GRPC_ROUTE}")))?;
    rollout_until(sandbox, |r| {
        r.status.as_ref().and_then(|s| {
            (s.current_step_index == Some(0)
                && s.history
                    .last()
                    .is_some_and(|h| h.share_confirmed_at.is_some()))
            .then_some(())
        })
    })
    .await?;
    let at_one = route_until(sandbox, Duration::from_millis(50), |r| Some(weights(r))).await?;
    sandbox.say(format!(
        "canary-grpc: the mesh confirms the 1% (GRPCRoute at {}/{}); v2 now answers UNAVAILABLE on HTTP 200 at {ERROR_FACTOR}x stable",
        at_one.0, at_one.1
    ));

    let api = grpc_routes(sandbox)?;
    let fault = Fault {
        scenario: "canary-grpc",
        rollout: GRPC_ROUTE,
        service: GRPC_ROUTE,
        version: "v2",
        route: "GRPCRoute",
        reverted_note: "",
        aborted: None,
    };
    let api = &api;
    let reverted = fault_until_reverted(sandbox, &fault, || async move {
        let route = api.get(GRPC_ROUTE).await.ok()?;
        serde_json::to_value(&route).ok().map(|v| weights(&v))
    })
    .await?;

    // A full window after the revert took effect in the mesh: the share, and what the canary
    // answered since the fault.
    reverted.full_window().await;
    let m = share::measure(sandbox.prometheus(), CLUSTER, SHOP, WINDOW_S).await?;
    let share_after = share::canary_share(&m, GRPC_STABLE, GRPC_CANARY);
    let since_fault = reverted.fault_at.elapsed().as_secs() + 2;
    let unavailable = canary_requests(
        sandbox,
        r#"response_code="200", grpc_response_status="14""#,
        since_fault,
    )
    .await?;
    let five_xx = canary_requests(sandbox, r#"response_code=~"5..""#, since_fault).await?;
    let (pass, summary) = judge_grpc(
        reverted.gate.as_deref(),
        reverted.route,
        true,
        share_after,
        unavailable,
        five_xx,
    );
    sandbox.say(format!("canary-grpc: {summary}"));

    let mut figures = reverted.figures(share_after);
    figures.insert(
        "canary_unavailable".into(),
        Value::from(unavailable.round()),
    );
    figures.insert("canary_5xx".into(), Value::from(five_xx.round()));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_only_on_an_error_ratio_abort_standing_on_grpc_statuses() {
        let ok = (Some("error-ratio"), (100, 0), true, Some(0.0));
        let cases = [
            (ok, 120.0, 0.0, true),
            // The fault never showed as UNAVAILABLE, or showed as 5xx.
            (ok, 0.0, 0.0, false),
            (ok, 120.0, 3.0, false),
            // canary-abort's own conditions still hold.
            (
                (Some("latency-p99"), (100, 0), true, Some(0.0)),
                120.0,
                0.0,
                false,
            ),
            (
                (Some("error-ratio"), (99, 1), true, Some(0.0)),
                120.0,
                0.0,
                false,
            ),
            (
                (Some("error-ratio"), (100, 0), true, None),
                120.0,
                0.0,
                false,
            ),
        ];
        for ((gate, route, verified, share), unavailable, five_xx, want) in cases {
            let (pass, why) = judge_grpc(gate, route, verified, share, unavailable, five_xx);
            assert_eq!(
                pass, want,
                "{gate:?} {route:?} {unavailable} {five_xx}: {why}"
            );
        }
    }

    #[test]
    fn the_rollout_drives_the_grpcroute_rule_between_the_payments_versions() {
        let v = serde_json::to_value(rollout().unwrap()).unwrap();
        assert_eq!(v["spec"]["routeRef"]["kind"], "GRPCRoute");
        assert_eq!(v["spec"]["routeRef"]["name"], GRPC_ROUTE);
        assert_eq!(v["spec"]["routeRef"]["ruleName"], GRPC_RULE);
        assert_eq!(v["spec"]["stableService"]["name"], GRPC_STABLE);
        assert_eq!(v["spec"]["canaryService"]["name"], GRPC_CANARY);
        assert_eq!(v["metadata"]["namespace"], SHOP);
    }

    #[test]
    fn weights_are_read_from_the_managed_rule() {
        let route: Value = serde_yaml::from_str(&baseline::grpc_route(99, 1)).unwrap();
        assert_eq!(weights(&route), (99, 1));
        assert_eq!(weights(&json!({"spec": {"rules": []}})), (0, 0));
        let q = canary_requests_query(r#"grpc_response_status="14""#, 30);
        assert!(
            q.contains(r#"destination_service_name="payments-v2""#),
            "{q}"
        );
        assert!(q.contains("[30s]"), "{q}");
    }
}
