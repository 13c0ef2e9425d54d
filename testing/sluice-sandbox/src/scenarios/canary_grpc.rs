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

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sluice_api::v1alpha1::{Rollout, RolloutStatus};
use sluice_sim::mesh::scenario::Event;

use super::canary_abort::{
    CLUSTER, ERROR_FACTOR, REQUESTS_PER_SECOND, WINDOW_S, detect_to_revert_ms, gates, judge, ms,
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

fn client(sandbox: &Sandbox) -> Result<Client, ScenarioError> {
    sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))
}

fn api_error(action: String) -> impl FnOnce(kube::Error) -> ScenarioError {
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
async fn apply_grpc_service(sandbox: &Sandbox) -> Result<(), ScenarioError> {
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

/// Polls the GRPCRoute until `check` gives a value.
async fn route_until<T>(
    sandbox: &Sandbox,
    poll: Duration,
    mut check: impl FnMut(&Value) -> Option<T>,
) -> Result<T, ScenarioError> {
    let ar = resource("GRPCRoute").ok_or_else(|| ScenarioError::Missing("GRPCRoute".into()))?;
    let api = Api::<DynamicObject>::namespaced_with(client(sandbox)?, SHOP, &ar);
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
    mut check: impl FnMut(&Rollout) -> Option<T>,
) -> Result<T, ScenarioError> {
    let api: Api<Rollout> = Api::namespaced(client(sandbox)?, SHOP);
    loop {
        if let Ok(r) = api.get(GRPC_ROUTE).await
            && let Some(v) = check(&r)
        {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

async fn canary_requests(
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

    // The fault, from a known instant.
    mesh.apply_now(Event {
        service: Some(GRPC_ROUTE.into()),
        version: Some("v2".into()),
        error_ratio_factor: Some(ERROR_FACTOR),
        ..Event::default()
    });
    let fault = Instant::now();

    let route = route_until(sandbox, Duration::from_millis(15), |r| {
        (weights(r).1 == 0).then(|| weights(r))
    })
    .await?;
    let reverted = Instant::now();
    let abort_latency = reverted.duration_since(fault);
    sandbox.say(format!(
        "canary-grpc: GRPCRoute reverted to {}/{} {} ms after the fault started",
        route.0,
        route.1,
        ms(abort_latency)
    ));

    let status: RolloutStatus = rollout_until(sandbox, |r| {
        r.status.clone().filter(|s| {
            s.abort
                .as_ref()
                .is_some_and(|a| a.revert_verified_at.is_some())
        })
    })
    .await?;
    let revert_verified = reverted.elapsed();
    let Some(abort) = status.abort.clone() else {
        return Err(ScenarioError::Missing("the Rollout's abort status".into()));
    };
    let gate = abort.gate.as_ref().map(|g| g.gate.clone());
    sandbox.say(format!(
        "canary-grpc: rollout-weights aborted on gate {} (value {:?}, stable {:?}, threshold {:?}) and confirmed the revert {} ms after it",
        gate.as_deref().unwrap_or("none"),
        abort.gate.as_ref().and_then(|g| g.value),
        abort.gate.as_ref().and_then(|g| g.baseline),
        abort.gate.as_ref().and_then(|g| g.threshold),
        ms(revert_verified)
    ));

    // A full window after the revert took effect in the mesh: the share, and what the canary
    // answered since the fault.
    tokio::time::sleep(Duration::from_secs(2 + WINDOW_S + 1).saturating_sub(reverted.elapsed()))
        .await;
    let m = share::measure(sandbox.prometheus(), CLUSTER, SHOP, WINDOW_S).await?;
    let share_after = share::canary_share(&m, GRPC_STABLE, GRPC_CANARY);
    let since_fault = fault.elapsed().as_secs() + 2;
    let unavailable = canary_requests(
        sandbox,
        r#"response_code="200", grpc_response_status="14""#,
        since_fault,
    )
    .await?;
    let five_xx = canary_requests(sandbox, r#"response_code=~"5..""#, since_fault).await?;
    let (pass, summary) = judge_grpc(
        gate.as_deref(),
        route,
        true,
        share_after,
        unavailable,
        five_xx,
    );
    sandbox.say(format!("canary-grpc: {summary}"));

    let mut figures = Map::new();
    figures.insert("abort_latency_ms".into(), Value::from(ms(abort_latency)));
    figures.insert(
        "detect_to_revert_ms".into(),
        detect_to_revert_ms(&status).map_or(Value::Null, Value::from),
    );
    figures.insert(
        "revert_verified_ms".into(),
        Value::from(ms(revert_verified)),
    );
    figures.insert(
        "failed_gate".into(),
        gate.clone().map_or(Value::Null, Value::from),
    );
    figures.insert(
        "canary_unavailable".into(),
        Value::from(unavailable.round()),
    );
    figures.insert("canary_5xx".into(), Value::from(five_xx.round()));
    figures.insert(
        "canary_share_after".into(),
        share_after
            .map(|s| (s * 10_000.0).round() / 10_000.0)
            .map_or(Value::Null, Value::from),
    );
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
