//! Scenario `canary-grpc-mirror`: a bad gRPC build found on mirrored copies before any live
//! weight. The scenario applies the gRPC service `payments` in east-1 as `canary-grpc` does (its
//! GRPCRoute's managed rule serves every method of `shop.Payments`; the mesh sends three calls in
//! four to `Charge`, a write, and one in four to `GetReceipt`, a read); a Rollout whose first step
//! mirrors half of the declared-safe read method `GetReceipt` to v2 (the rule `sluice-mirror`)
//! waits until v2's error gate passes on those copies, then v2 answers UNAVAILABLE (gRPC status
//! 14) on HTTP 200 at 2.3× the stable ratio, the fault of `canary-grpc`. The rollout-weights
//! operator must abort on the error-ratio gate, which reads the canary's destination-reported
//! requests during a mirror step (Istio reports a mirrored copy only at the receiving proxy), in
//! the mirror step (index 0), and remove the mirror rule; the canary's live weight must have
//! stayed 0 throughout and no live call may ever have reached it.
//! Figures: canary-abort's (`abort_latency_ms`: fault → mirror rule removed, `detect_to_revert_ms`,
//! `revert_verified_ms`, `failed_gate`, `canary_share_after`), `abort_step_index`,
//! `mirrored_copies` and `mirrored_unavailable` (the copies v2's proxy reported since the Rollout
//! started, and those answered UNAVAILABLE since the fault), `live_canary_requests` (calls to v2's
//! Service on either reporter since the Rollout started: must be 0) and `max_canary_weight` (the
//! highest canary weight seen on the GRPCRoute at any poll: must be 0) and `mirrored_share` (the
//! share of all payments calls the simulated mesh copied to v2 while the mirror rule was in
//! force: at most the read method's, so no `Charge` call was ever copied). Never writes the route
//! itself: only the operator does; the scenario reads it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::PostParams;
use serde_json::{Map, Value, json};
use sluice_api::v1alpha1::{Rollout, Verdict};
use sluice_sim::mesh::scenario::Event;

use super::canary_abort::{
    CLUSTER, ERROR_FACTOR, Fault, REQUESTS_PER_SECOND, WINDOW_S, fault_until_reverted, gates,
    judge, rollouts,
};
use super::canary_grpc::{api_error, apply_grpc_service, canary_requests, grpc_routes, weights};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{GRPC_CANARY, GRPC_READ_METHOD, GRPC_ROUTE, GRPC_RULE, GRPC_STABLE, SHOP};
use crate::sandbox::{GRPC_READ_SHARE, Sandbox};
use crate::share;

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "canary-grpc-mirror",
    description: "east-1's gRPC service payments mirrors half of its read method GetReceipt to v2 \
                  before any live weight; v2 starts answering UNAVAILABLE on HTTP 200 at 2.3x \
                  stable; pass when rollout-weights aborts in the mirror step on error-ratio read \
                  from the mirrored copies, the mirror rule is gone and no live call ever reached \
                  v2 (detect_to_revert_ms, abort_step_index, mirrored_copies, live_canary_requests)",
    budget: Duration::from_secs(120),
    run: start,
};

/// The name of the rule the operator writes for a mirror step.
pub const MIRROR_RULE: &str = "sluice-mirror";
/// The share of the read method's calls the mirror step copies, in percent.
pub const MIRROR_PERCENT: u32 = 50;

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The Rollout of `shop/payments` from v1 to v2 on its GRPCRoute, with canary-abort's
/// seconds-scale settings and gates: mirror [`MIRROR_PERCENT`]% of the read method for 120 s, then
/// 1%, 50%, promote.
pub fn rollout() -> Result<Rollout, ScenarioError> {
    let (service, method) = GRPC_READ_METHOD;
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": GRPC_ROUTE, "namespace": SHOP},
        "spec": {
            "routeRef": {"kind": "GRPCRoute", "name": GRPC_ROUTE, "ruleName": GRPC_RULE},
            "stableService": {"name": GRPC_STABLE},
            "canaryService": {"name": GRPC_CANARY},
            "canaryWorkload": {"name": GRPC_CANARY},
            "stableWorkload": {"name": GRPC_STABLE},
            "analysisInterval": "1s",
            "stepDuration": "2s",
            "appliedShareDeadline": "60s",
            "canaryReadyDeadline": "60s",
            "gates": gates(),
            "steps": [
                {"mirror": {
                    "percent": MIRROR_PERCENT,
                    "grpcMethods": [{"service": service, "method": method}],
                    "duration": "120s"
                }},
                {"setWeight": {"weight": 1}},
                {"setWeight": {"weight": 50}},
                {"promote": {}}
            ],
        },
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Rollout ({e})")))
}

/// The GRPCRoute's mirror rule, if it is there.
pub fn mirror_rule(route: &Value) -> Option<&Value> {
    route["spec"]["rules"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == MIRROR_RULE)
}

/// The PromQL counting, over the last `window_s` seconds, the mirrored copies of the canary's
/// workload that match `matcher`: destination-reported, attributed by `destination_workload`
/// only (their `destination_service_name` is the call's host with Envoy's `-shadow` suffix).
pub fn mirrored_query(matcher: &str, window_s: u64) -> String {
    format!(
        r#"sum(increase(istio_requests_total{{reporter="destination", cluster="{CLUSTER}", destination_workload_namespace="{SHOP}", destination_workload="{GRPC_CANARY}", destination_service_name!="{GRPC_CANARY}"{matcher}}}[{window_s}s]))"#
    )
}

/// The PromQL counting, over the last `window_s` seconds, the live calls the canary's proxy
/// received: destination-reported on the canary Service (mirrored copies carry another name).
pub fn live_at_destination_query(window_s: u64) -> String {
    format!(
        r#"sum(increase(istio_requests_total{{reporter="destination", cluster="{CLUSTER}", destination_service_namespace="{SHOP}", destination_service_name="{GRPC_CANARY}"}}[{window_s}s]))"#
    )
}

async fn query_sum(sandbox: &Sandbox, query: &str) -> Result<f64, ScenarioError> {
    let samples = sandbox.prometheus().query(query, None).await?;
    Ok(samples.first().map_or(0.0, |s| s.value))
}

/// What the verdict weighs besides canary-abort's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MirrorSeen {
    /// The step the Rollout aborted in.
    pub step_index: Option<u32>,
    /// Whether the mirror rule was still on the GRPCRoute after the abort.
    pub mirror_rule_left: bool,
    /// The highest canary weight seen on the GRPCRoute.
    pub max_canary_weight: i64,
    /// Live calls to the canary Service (source and destination reporters).
    pub live_canary_requests: f64,
    /// The share of all the service's calls the mesh copied to the canary during the mirror step:
    /// at most [`GRPC_READ_SHARE`] (the read method's calls), or a write was mirrored.
    pub mirrored_share: f64,
    /// Mirrored copies the canary's proxy reported.
    pub mirrored_copies: f64,
    /// Of those, UNAVAILABLE since the fault.
    pub mirrored_unavailable: f64,
}

/// The verdict: canary-abort's (error-ratio, route at 100/0, verified, share ~0 after), in the
/// mirror step, the mirror rule removed, the fault seen on mirrored copies only, and no live
/// weight or live call on the canary ever.
pub fn judge_mirror(
    gate: Option<&str>,
    route: (i64, i64),
    share_after: Option<f64>,
    seen: &MirrorSeen,
) -> (bool, String) {
    let route = (
        i32::try_from(route.0).unwrap_or(i32::MAX),
        i32::try_from(route.1).unwrap_or(i32::MAX),
    );
    let (pass, summary) = judge(gate, route, true, share_after);
    if !pass {
        return (false, summary);
    }
    let fail = |why: String| (false, why);
    if seen.step_index != Some(0) {
        return fail(format!(
            "the rollout aborted at step {:?}, not in the mirror step 0",
            seen.step_index
        ));
    }
    if seen.mirror_rule_left {
        return fail(format!(
            "the mirror rule {MIRROR_RULE} is still on the GRPCRoute after the abort"
        ));
    }
    if seen.max_canary_weight != 0 {
        return fail(format!(
            "the GRPCRoute gave the canary a live weight of {}",
            seen.max_canary_weight
        ));
    }
    if seen.live_canary_requests > 0.0 {
        return fail(format!(
            "{:.0} live calls reached the canary: the fault was not found on mirrored copies alone",
            seen.live_canary_requests
        ));
    }
    if seen.mirrored_share <= 0.0 || seen.mirrored_share > GRPC_READ_SHARE + 1e-9 {
        return fail(format!(
            "the mesh copied {:.4} of the calls to the canary, not a part of the read method's {GRPC_READ_SHARE}",
            seen.mirrored_share
        ));
    }
    if seen.mirrored_copies <= 0.0 {
        return fail("the canary's proxy reported no mirrored copy".into());
    }
    if seen.mirrored_unavailable <= 0.0 {
        return fail(
            "the canary's proxy reported no UNAVAILABLE answer on a mirrored copy: the fault never reached the telemetry"
                .into(),
        );
    }
    (
        true,
        format!(
            "{summary}; aborted in the mirror step on {:.0} mirrored copies ({:.0} UNAVAILABLE since the fault), mirror rule removed, no live call ever reached the canary",
            seen.mirrored_copies, seen.mirrored_unavailable
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
    let (service, method) = GRPC_READ_METHOD;
    sandbox.say(format!(
        "canary-grpc-mirror: the gRPC service payments in {CLUSTER} at {REQUESTS_PER_SECOND} calls/s through GRPCRoute {SHOP}/{GRPC_ROUTE}, {:.0}% of them {service}/{method}; a Rollout mirrors {MIRROR_PERCENT}% of that read method to v2 before any live weight",
        GRPC_READ_SHARE * 100.0
    ));
    let started = Instant::now();
    rollouts(sandbox)?
        .create(&PostParams::default(), &rollout()?)
        .await
        .map_err(api_error(format!("creating Rollout {SHOP}/{GRPC_ROUTE}")))?;

    // The mirror step in force and v2 judged healthy on its mirrored copies; every poll of the
    // GRPCRoute, here and until the abort, keeps the highest canary weight it saw.
    let api = grpc_routes(sandbox)?;
    let max_canary = AtomicI64::new(0);
    let rollouts = rollouts(sandbox)?;
    let mirrored_at = loop {
        let route = api
            .get(GRPC_ROUTE)
            .await
            .ok()
            .and_then(|r| serde_json::to_value(&r).ok());
        if let Some(v) = &route {
            max_canary.fetch_max(weights(v).1, Ordering::Relaxed);
        }
        let passing = rollouts.get(GRPC_ROUTE).await.ok().is_some_and(|r| {
            r.status.is_some_and(|s| {
                s.current_step_index == Some(0)
                    && s.mirror_active
                    && s.gates
                        .iter()
                        .any(|g| g.gate == "error-ratio" && g.verdict == Verdict::Pass)
            })
        });
        if passing
            && let Some(v) = route
            && let Some(rule) = mirror_rule(&v)
        {
            break (weights(&v), rule["matches"].clone());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // What the mesh copies to the canary while the mirror rule is in force.
    let mirrored_share = mesh
        .stats()
        .last_split
        .get(&format!("{SHOP}/{GRPC_ROUTE}"))
        .and_then(|s| s.mirrored.get(GRPC_CANARY).copied())
        .unwrap_or(0.0);
    sandbox.say(format!(
        "canary-grpc-mirror: GRPCRoute at {}/{} with rule {MIRROR_RULE} matching {}; error-ratio passes on v2's mirrored copies; v2 now answers UNAVAILABLE on HTTP 200 at {ERROR_FACTOR}x stable",
        mirrored_at.0.0, mirrored_at.0.1, mirrored_at.1
    ));

    let note = format!(", its rule {MIRROR_RULE} removed");
    let fault = Fault {
        scenario: "canary-grpc-mirror",
        rollout: GRPC_ROUTE,
        service: GRPC_ROUTE,
        version: "v2",
        route: "GRPCRoute",
        reverted_note: &note,
        aborted: Some("the mirroring canary"),
    };
    let (api, max) = (&api, &max_canary);
    // Reverted once the mirror rule is gone: until then the weights are not what is awaited.
    let reverted = fault_until_reverted(sandbox, &fault, || async move {
        let route = api.get(GRPC_ROUTE).await.ok()?;
        let v = serde_json::to_value(&route).ok()?;
        let w = weights(&v);
        max.fetch_max(w.1, Ordering::Relaxed);
        mirror_rule(&v).is_none().then_some(w)
    })
    .await?;

    reverted.full_window().await;
    let mirror_rule_left = match api.get(GRPC_ROUTE).await {
        Ok(r) => serde_json::to_value(&r)
            .ok()
            .is_none_or(|v| mirror_rule(&v).is_some()),
        Err(source) => {
            return Err(ScenarioError::Api {
                action: format!("reading GRPCRoute {SHOP}/{GRPC_ROUTE}"),
                cluster: CLUSTER.into(),
                source,
            });
        }
    };
    let m = share::measure(sandbox.prometheus(), CLUSTER, SHOP, WINDOW_S).await?;
    let share_after = share::canary_share(&m, GRPC_STABLE, GRPC_CANARY);
    let since_start = started.elapsed().as_secs() + 2;
    let since_fault = reverted.fault_at.elapsed().as_secs() + 2;
    let live_source = canary_requests(sandbox, r#"response_code=~".+""#, since_start).await?;
    let live_destination = query_sum(sandbox, &live_at_destination_query(since_start)).await?;
    let seen = MirrorSeen {
        step_index: reverted.abort.step_index,
        mirror_rule_left,
        max_canary_weight: max_canary.load(Ordering::Relaxed),
        mirrored_share,
        live_canary_requests: live_source + live_destination,
        mirrored_copies: query_sum(sandbox, &mirrored_query("", since_start)).await?,
        mirrored_unavailable: query_sum(
            sandbox,
            &mirrored_query(
                r#", response_code="200", grpc_response_status="14""#,
                since_fault,
            ),
        )
        .await?,
    };
    let (pass, summary) =
        judge_mirror(reverted.gate.as_deref(), reverted.route, share_after, &seen);
    sandbox.say(format!("canary-grpc-mirror: {summary}"));

    let mut figures: Map<String, Value> = reverted.figures(share_after);
    figures.insert(
        "abort_step_index".into(),
        seen.step_index.map_or(Value::Null, Value::from),
    );
    figures.insert(
        "mirrored_share".into(),
        Value::from((seen.mirrored_share * 10_000.0).round() / 10_000.0),
    );
    figures.insert(
        "mirrored_copies".into(),
        Value::from(seen.mirrored_copies.round()),
    );
    figures.insert(
        "mirrored_unavailable".into(),
        Value::from(seen.mirrored_unavailable.round()),
    );
    figures.insert(
        "live_canary_requests".into(),
        Value::from(seen.live_canary_requests.round()),
    );
    figures.insert(
        "max_canary_weight".into(),
        Value::from(seen.max_canary_weight),
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

    fn seen() -> MirrorSeen {
        MirrorSeen {
            step_index: Some(0),
            mirror_rule_left: false,
            max_canary_weight: 0,
            live_canary_requests: 0.0,
            mirrored_share: 0.125,
            mirrored_copies: 900.0,
            mirrored_unavailable: 40.0,
        }
    }

    #[test]
    fn passes_only_on_a_mirror_step_abort_with_no_live_canary_call() {
        let ok = (Some("error-ratio"), (100, 0), Some(0.0));
        let cases = [
            (ok, seen(), true),
            // Aborted later than the mirror step, or with the mirror rule left on the route.
            (
                ok,
                MirrorSeen {
                    step_index: Some(1),
                    ..seen()
                },
                false,
            ),
            (
                ok,
                MirrorSeen {
                    mirror_rule_left: true,
                    ..seen()
                },
                false,
            ),
            // The canary got live weight or live calls.
            (
                ok,
                MirrorSeen {
                    max_canary_weight: 1,
                    ..seen()
                },
                false,
            ),
            (
                ok,
                MirrorSeen {
                    live_canary_requests: 3.0,
                    ..seen()
                },
                false,
            ),
            // Calls of the write method were copied too, or nothing was.
            (
                ok,
                MirrorSeen {
                    mirrored_share: 0.5,
                    ..seen()
                },
                false,
            ),
            (
                ok,
                MirrorSeen {
                    mirrored_share: 0.0,
                    ..seen()
                },
                false,
            ),
            // The fault never showed on mirrored copies.
            (
                ok,
                MirrorSeen {
                    mirrored_copies: 0.0,
                    mirrored_unavailable: 0.0,
                    ..seen()
                },
                false,
            ),
            (
                ok,
                MirrorSeen {
                    mirrored_unavailable: 0.0,
                    ..seen()
                },
                false,
            ),
            // canary-abort's own conditions still hold.
            ((Some("latency-p99"), (100, 0), Some(0.0)), seen(), false),
            ((Some("error-ratio"), (100, 0), None), seen(), false),
        ];
        for ((gate, route, share), seen, want) in cases {
            let (pass, why) = judge_mirror(gate, route, share, &seen);
            assert_eq!(pass, want, "{gate:?} {route:?} {seen:?}: {why}");
        }
    }

    #[test]
    fn the_first_step_mirrors_the_declared_read_method_of_the_managed_rule() {
        let v = serde_json::to_value(rollout().unwrap()).unwrap();
        assert_eq!(v["spec"]["routeRef"]["kind"], "GRPCRoute");
        assert_eq!(v["spec"]["routeRef"]["ruleName"], GRPC_RULE);
        let mirror = &v["spec"]["steps"][0]["mirror"];
        assert_eq!(mirror["percent"], MIRROR_PERCENT);
        assert_eq!(
            mirror["grpcMethods"],
            json!([{"service": "shop.Payments", "method": "GetReceipt"}])
        );
        assert!(v["spec"]["steps"][1]["setWeight"].is_object());
    }

    #[test]
    fn mirrored_copies_are_read_by_workload_and_live_calls_by_service() {
        let q = mirrored_query(r#", grpc_response_status="14""#, 30);
        assert!(q.contains(r#"reporter="destination""#), "{q}");
        assert!(q.contains(r#"destination_workload="payments-v2""#), "{q}");
        assert!(
            q.contains(r#"destination_service_name!="payments-v2""#),
            "{q}"
        );
        assert!(q.contains(r#"grpc_response_status="14"}[30s]"#), "{q}");
        let q = live_at_destination_query(30);
        assert!(
            q.contains(r#"destination_service_name="payments-v2""#),
            "{q}"
        );
        let route = json!({"spec": {"rules": [{"name": "charge"}, {"name": MIRROR_RULE}]}});
        assert!(mirror_rule(&route).is_some());
        assert!(mirror_rule(&json!({"spec": {"rules": [{"name": "charge"}]}})).is_none());
    }
}
