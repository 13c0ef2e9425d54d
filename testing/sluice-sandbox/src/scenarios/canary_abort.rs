//! Scenario `canary-abort`: the seed's incident on east-1. A Rollout takes checkout from v2.13
//! to v2.14 and holds 1%; once the mesh confirms the 1%, v2.14 starts returning 5xx at 2.3× the
//! stable ratio (a known time: the scenario injects the fault into the mesh simulator). The
//! rollout-weights operator running in east-1 must abort: canary weight 0 in one route write,
//! then confirm from telemetry that the canary share fell to ~0.
//! Figures: `abort_latency_ms` (fault injected → route reverted, seen on the route),
//! `detect_to_revert_ms` (the abort decision on the first Fail verdict → route reverted: the
//! status' millisecond figure `abortDetectToRevertMs`, measured by the operator; the status
//! times have one-second precision), `revert_verified_ms` (route reverted → the operator's
//! telemetry check confirmed ~0), `inconclusive_hold_ms` (1% confirmed → the Rollout seen Paused
//! by its starved gate's Inconclusive verdicts).
//! The Rollout also carries a gate the scenario's traffic can never give enough samples
//! ([`STARVED_GATE`], as a gate on a low-traffic path would be), whose policy holds the Rollout
//! after 2 s Inconclusive: before the fault, the scenario waits until the Rollout is Paused with
//! reason Inconclusive (what `SluiceRolloutAnalysisInconclusive` reports); the hold holds
//! progress, never safety, so the abort on error-ratio's Fail is the same.
//! Also holds the helpers the canary scenarios share, among them the abort scenarios' common step
//! ([`fault_until_reverted`]: fault → route reverted → revert verified). Never writes the route
//! itself: only the operator does; the scenario reads it.

use std::fmt::Display;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Map, Value, json};
use sluice_api::external::http_route::HttpRoute;
use sluice_api::v1alpha1::Rollout;
use sluice_api::v1alpha1::rollout::AbortStatus;
use sluice_api::v1alpha1::{RolloutPhase, RolloutStatus};
use sluice_sim::mesh::scenario::Event;

use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{CANARY, ROUTE, SHOP, STABLE};
use crate::sandbox::Sandbox;
use crate::share;

/// The workload cluster the canary scenarios use.
pub const CLUSTER: &str = "east-1";
/// Checkout's request rate during the canary scenarios: enough that a 1% step sees hundreds of
/// canary requests in a 5 s window (the simulator's counters are expected counts).
pub const REQUESTS_PER_SECOND: f64 = 4000.0;
/// The canary's 5xx ratio as a multiple of stable's once the fault starts.
pub const ERROR_FACTOR: f64 = 2.3;
/// The canary share below which the revert counts as confirmed by the scenario's own reading.
pub const REVERTED_SHARE: f64 = 0.001;
/// The window the scenario's own share reading spans (≥ 4 telemetry intervals of 1 s).
pub const WINDOW_S: u64 = 5;

/// The gate that stays Inconclusive: latency over a minimum of samples no step here reaches.
pub const STARVED_GATE: &str = "latency-p99-starved";
/// How long [`STARVED_GATE`] is Inconclusive before its policy (Pause) holds the Rollout.
pub const STARVED_AFTER: &str = "2s";

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "canary-abort",
    description: "east-1's checkout v2.14 at 1% starts returning 5xx at 2.3x stable; pass when \
                  rollout-weights aborts, the route is back at 100/0 and telemetry confirms ~0 \
                  (abort_latency_ms, detect_to_revert_ms, revert_verified_ms)",
    budget: Duration::from_secs(100),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The HTTPRoute API of the canary cluster's shop namespace.
pub(super) fn routes(sandbox: &Sandbox) -> Result<Api<HttpRoute>, ScenarioError> {
    let client = sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;
    Ok(Api::namespaced(client, SHOP))
}

/// The Rollout API of the canary cluster's shop namespace.
pub(super) fn rollouts(sandbox: &Sandbox) -> Result<Api<Rollout>, ScenarioError> {
    let client = sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;
    Ok(Api::namespaced(client, SHOP))
}

/// (stable, canary) weights of the route's rule that carries the stable backend.
pub fn weights(route: &HttpRoute) -> (i32, i32) {
    let Some(rule) = route
        .rules_with_backend(STABLE)
        .first()
        .and_then(|i| route.rules().get(*i))
    else {
        return (0, 0);
    };
    let w = |n: &str| rule.backend(n).map_or(0, |b| b.effective_weight());
    (w(STABLE), w(CANARY))
}

/// A Rollout of `shop/checkout` from v2.13 to v2.14 with seconds-scale settings and `steps`;
/// `patch` overrides top-level spec fields.
pub fn rollout(steps: Value, patch: Value) -> Result<Rollout, ScenarioError> {
    let mut spec = json!({
        "routeRef": {"name": ROUTE},
        "stableService": {"name": STABLE},
        "canaryService": {"name": CANARY},
        "canaryWorkload": {"name": CANARY},
        "analysisInterval": "1s",
        "stepDuration": "2s",
        "appliedShareDeadline": "60s",
        "canaryReadyDeadline": "60s",
        "gates": gates(),
        "steps": steps,
    });
    if let Some(fields) = patch.as_object() {
        for (k, v) in fields {
            spec[k] = v.clone();
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": ROUTE, "namespace": SHOP},
        "spec": spec,
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Rollout ({e})")))
}

/// The canary scenarios' gates. Seconds-scale: a 5 s window spans at least 4 of the mesh's 1 s
/// intervals; three consecutive share failures, since a short window moves between readings.
pub fn gates() -> Value {
    json!([
        {"name": "applied-share", "builtin": "AppliedShare", "window": "5s", "consecutiveFailures": 3},
        {"name": "error-ratio", "builtin": "ErrorRatioVsStable", "window": "5s"},
        {"name": "latency-p99", "builtin": "LatencyP99VsStable", "window": "5s"}
    ])
}

/// Whether the Rollout is held by a sustained Inconclusive verdict (phase Paused, Progressing
/// reason Inconclusive): what the per-object series report as `reason="Inconclusive"`.
pub fn held_inconclusive(status: &RolloutStatus) -> bool {
    use sluice_api::v1alpha1::rollout::{conditions, reasons};
    status.phase == RolloutPhase::Paused
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::PROGRESSING && c.reason == reasons::INCONCLUSIVE)
}

/// Raises checkout's traffic in the canary cluster's mesh from now on.
pub(super) fn raise_traffic(sandbox: &Sandbox) -> Result<(), ScenarioError> {
    let mesh = sandbox
        .world(CLUSTER)
        .and_then(|w| w.mesh())
        .ok_or_else(|| ScenarioError::Missing(format!("mesh simulator of {CLUSTER}")))?;
    mesh.apply_now(Event {
        service: Some("checkout".into()),
        requests_per_second: Some(REQUESTS_PER_SECOND),
        ..Event::default()
    });
    Ok(())
}

/// Creates the Rollout in the canary cluster.
pub(super) async fn create(sandbox: &Sandbox, rollout: &Rollout) -> Result<(), ScenarioError> {
    rollouts(sandbox)?
        .create(&PostParams::default(), rollout)
        .await
        .map_err(|source| ScenarioError::Api {
            action: format!("creating Rollout {SHOP}/{ROUTE}"),
            cluster: CLUSTER.into(),
            source,
        })?;
    Ok(())
}

/// Polls the Rollout until `check` gives a value.
pub(super) async fn rollout_until<T>(
    sandbox: &Sandbox,
    check: impl FnMut(&Rollout) -> Option<T>,
) -> Result<T, ScenarioError> {
    rollout_named_until(sandbox, ROUTE, check).await
}

/// Polls the Rollout `name` of the canary cluster's shop namespace until `check` gives a value.
pub(super) async fn rollout_named_until<T>(
    sandbox: &Sandbox,
    name: &str,
    mut check: impl FnMut(&Rollout) -> Option<T>,
) -> Result<T, ScenarioError> {
    let api = rollouts(sandbox)?;
    loop {
        if let Ok(r) = api.get(name).await
            && let Some(v) = check(&r)
        {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the route until `check` gives a value.
pub(super) async fn route_until<T>(
    sandbox: &Sandbox,
    poll: Duration,
    mut check: impl FnMut(&HttpRoute) -> Option<T>,
) -> Result<T, ScenarioError> {
    let api = routes(sandbox)?;
    loop {
        if let Ok(r) = api.get(ROUTE).await
            && let Some(v) = check(&r)
        {
            return Ok(v);
        }
        tokio::time::sleep(poll).await;
    }
}

/// The canary share the mesh reports over the last [`WINDOW_S`] seconds (None without data).
pub(super) async fn measured_share(sandbox: &Sandbox) -> Result<Option<f64>, ScenarioError> {
    let m = share::measure(sandbox.prometheus(), CLUSTER, SHOP, WINDOW_S).await?;
    Ok(share::canary_share(&m, STABLE, CANARY))
}

/// The canary's fault on checkout v2.14 as `scenario` narrates it: the route named `route`,
/// nothing said of the step.
pub(super) fn checkout_fault(scenario: &str) -> Fault<'_> {
    Fault {
        scenario,
        rollout: ROUTE,
        service: "checkout",
        version: "v2.14",
        route: "route",
        reverted_note: "",
        aborted: None,
    }
}

/// The route's (stable, canary) weights, None when it cannot be read this time.
pub(super) async fn route_weights(api: &Api<HttpRoute>) -> Option<(i32, i32)> {
    api.get(ROUTE).await.ok().map(|r| weights(&r))
}

/// What differs between the abort scenarios' shared step (fault → route reverted → revert
/// verified → the gate said), besides how the route's weights are read.
pub(super) struct Fault<'a> {
    /// The scenario's name, which starts each line the step says.
    pub scenario: &'a str,
    /// The Rollout's name in [`SHOP`].
    pub rollout: &'a str,
    /// The mesh service whose canary version fails.
    pub service: &'a str,
    /// The canary version that starts answering errors at [`ERROR_FACTOR`]× stable.
    pub version: &'a str,
    /// The route as the narration names it (`route`, `GRPCRoute`).
    pub route: &'a str,
    /// Said after the abort latency (`, while paused`), or empty.
    pub reverted_note: &'a str,
    /// How the narration names the aborted canary, said with its step (`the paused canary`).
    pub aborted: Option<&'a str>,
}

/// What the shared abort step saw.
pub(super) struct Reverted<T> {
    /// When the fault started.
    pub fault_at: Instant,
    /// When the route was seen reverted.
    pub reverted_at: Instant,
    /// The route's (stable, canary) weights once reverted.
    pub route: (T, T),
    /// Fault started → route seen reverted.
    pub abort_latency: Duration,
    /// Route seen reverted → the operator's telemetry check confirmed the revert.
    pub revert_verified: Duration,
    /// The Rollout's status once the revert is verified.
    pub status: RolloutStatus,
    /// The abort in that status.
    pub abort: AbortStatus,
    /// The gate the abort stood on.
    pub gate: Option<String>,
}

impl<T> Reverted<T> {
    /// Waits until a full share window has passed since the revert took effect in the mesh, so
    /// that the scenario's own reading sees only the reverted route.
    pub async fn full_window(&self) {
        tokio::time::sleep(
            Duration::from_secs(2 + WINDOW_S + 1).saturating_sub(self.reverted_at.elapsed()),
        )
        .await;
    }

    /// The figures every abort scenario reports: `abort_latency_ms`, `detect_to_revert_ms`,
    /// `revert_verified_ms`, `failed_gate` and `canary_share_after` (the scenario's own reading
    /// `share_after`, to four decimals).
    pub fn figures(&self, share_after: Option<f64>) -> Map<String, Value> {
        let mut figures = Map::new();
        figures.insert(
            "abort_latency_ms".into(),
            Value::from(ms(self.abort_latency)),
        );
        figures.insert(
            "detect_to_revert_ms".into(),
            detect_to_revert_ms(&self.status).map_or(Value::Null, Value::from),
        );
        figures.insert(
            "revert_verified_ms".into(),
            Value::from(ms(self.revert_verified)),
        );
        figures.insert(
            "failed_gate".into(),
            self.gate.clone().map_or(Value::Null, Value::from),
        );
        figures.insert(
            "canary_share_after".into(),
            share_after
                .map(|s| (s * 10_000.0).round() / 10_000.0)
                .map_or(Value::Null, Value::from),
        );
        figures
    }
}

/// The abort scenarios' shared step: injects `fault` into the canary cluster's mesh at a known
/// instant, polls the route's weights with `read` (None: not readable this time) every 15 ms
/// until the canary's is 0, waits for the operator to confirm the revert from telemetry and
/// says the gate it aborted on.
pub(super) async fn fault_until_reverted<T, F>(
    sandbox: &Sandbox,
    fault: &Fault<'_>,
    mut read: impl FnMut() -> F,
) -> Result<Reverted<T>, ScenarioError>
where
    T: Copy + Default + PartialEq + Display,
    F: Future<Output = Option<(T, T)>>,
{
    let scenario = fault.scenario;
    // The fault, from a known instant.
    let mesh = sandbox
        .world(CLUSTER)
        .and_then(|w| w.mesh())
        .ok_or_else(|| ScenarioError::Missing(format!("mesh simulator of {CLUSTER}")))?;
    mesh.apply_now(Event {
        service: Some(fault.service.into()),
        version: Some(fault.version.into()),
        error_ratio_factor: Some(ERROR_FACTOR),
        ..Event::default()
    });
    let started = Instant::now();

    // The route reverted, seen by a fast poller.
    let route = loop {
        if let Some(w) = read().await
            && w.1 == T::default()
        {
            break w;
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    };
    let reverted = Instant::now();
    let abort_latency = reverted.duration_since(started);
    sandbox.say(format!(
        "{scenario}: {} reverted to {}/{} {} ms after the fault started{}",
        fault.route,
        route.0,
        route.1,
        ms(abort_latency),
        fault.reverted_note
    ));

    // The operator confirms the revert from telemetry.
    let status = rollout_named_until(sandbox, fault.rollout, |r| {
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
    let aborted = fault.aborted.map_or_else(String::new, |what| {
        format!(" {what} at step {:?}", abort.step_index)
    });
    sandbox.say(format!(
        "{scenario}: rollout-weights aborted{aborted} on gate {} (value {:?}, stable {:?}, threshold {:?}) and confirmed the revert {} ms after it",
        gate.as_deref().unwrap_or("none"),
        abort.gate.as_ref().and_then(|g| g.value),
        abort.gate.as_ref().and_then(|g| g.baseline),
        abort.gate.as_ref().and_then(|g| g.threshold),
        ms(revert_verified)
    ));
    Ok(Reverted {
        fault_at: started,
        reverted_at: reverted,
        route,
        abort_latency,
        revert_verified,
        status,
        abort,
        gate,
    })
}

/// Milliseconds of a duration, saturating.
pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// First Fail verdict → route reverted, in milliseconds: the status' own figure
/// (`abortDetectToRevertMs`, the operator's measurement from the abort decision, taken on the
/// failing verdict's tick, to the write that reverted the route). Without it, from the status
/// timestamps, which have one-second precision. None when neither is there.
pub fn detect_to_revert_ms(status: &RolloutStatus) -> Option<u64> {
    if let Some(ms) = status.abort_detect_to_revert_ms {
        return Some(ms);
    }
    let abort = status.abort.as_ref()?;
    let first = abort.first_failed_at.as_ref()?.0;
    let reverted = abort.route_reverted_at.as_ref()?.0;
    u64::try_from(reverted.as_millisecond() - first.as_millisecond()).ok()
}

/// The verdict on an abort: the gate that failed must be the error ratio, the route back at
/// 100/0, the revert verified by the operator and the scenario's own reading ~0.
pub fn judge(
    gate: Option<&str>,
    route: (i32, i32),
    verified: bool,
    share_after: Option<f64>,
) -> (bool, String) {
    if gate != Some("error-ratio") {
        return (
            false,
            format!(
                "the rollout aborted on gate {}, not error-ratio",
                gate.unwrap_or("none")
            ),
        );
    }
    if route.1 != 0 || route.0 <= 0 {
        return (
            false,
            format!(
                "the route is at {}/{} after the abort, not back on stable",
                route.0, route.1
            ),
        );
    }
    if !verified {
        return (
            false,
            "the operator never confirmed the revert from telemetry".into(),
        );
    }
    match share_after {
        Some(s) if s <= REVERTED_SHARE => (
            true,
            format!(
                "aborted on error-ratio; the mesh reports a canary share of {s:.4} after the revert"
            ),
        ),
        Some(s) => (
            false,
            format!("the mesh still reports a canary share of {s:.4} after the revert"),
        ),
        None => (
            false,
            "Prometheus reported no checkout requests after the revert; no data is never a pass"
                .into(),
        ),
    }
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    raise_traffic(sandbox)?;
    sandbox.say(format!(
        "canary-abort: checkout in {CLUSTER} at {REQUESTS_PER_SECOND} requests/s; a Rollout takes it from v2.13 to v2.14 and holds 1%"
    ));
    let steps = json!([
        {"setWeight": {"weight": 1, "duration": "120s"}},
        {"setWeight": {"weight": 50}},
        {"promote": {}}
    ]);
    let mut gates = gates();
    if let Some(list) = gates.as_array_mut() {
        list.push(
            json!({"name": STARVED_GATE, "builtin": "LatencyP99VsStable", "window": "5s",
            "minSamples": 1_000_000_000u64,
            "inconclusive": {"action": "Pause", "after": STARVED_AFTER}}),
        );
    }
    create(sandbox, &rollout(steps, json!({"gates": gates}))?).await?;
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
    let confirmed = Instant::now();
    let at_one = route_until(sandbox, Duration::from_millis(50), |r| Some(weights(r))).await?;
    sandbox.say(format!(
        "canary-abort: gate {STARVED_GATE} can never have its samples here; its policy holds the Rollout once it has been Inconclusive for {STARVED_AFTER}"
    ));
    rollout_until(sandbox, |r| {
        r.status
            .as_ref()
            .is_some_and(held_inconclusive)
            .then_some(())
    })
    .await?;
    let inconclusive_hold = confirmed.elapsed();
    sandbox.say(format!(
        "canary-abort: the Rollout is Paused (Inconclusive) {} ms after the 1% was confirmed",
        ms(inconclusive_hold)
    ));
    sandbox.say(format!(
        "canary-abort: the mesh confirms the 1% (route at {}/{}); v2.14 now returns 5xx at {ERROR_FACTOR}x stable",
        at_one.0, at_one.1
    ));

    let api = routes(sandbox)?;
    let reverted = fault_until_reverted(sandbox, &checkout_fault("canary-abort"), || {
        route_weights(&api)
    })
    .await?;

    // The scenario's own reading: a full window after the revert took effect in the mesh.
    reverted.full_window().await;
    let share_after = measured_share(sandbox).await?;
    let (pass, summary) = judge(reverted.gate.as_deref(), reverted.route, true, share_after);
    sandbox.say(format!("canary-abort: {summary}"));

    let mut figures = reverted.figures(share_after);
    figures.insert(
        "inconclusive_hold_ms".into(),
        Value::from(ms(inconclusive_hold)),
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
    fn passes_only_on_an_error_ratio_abort_confirmed_by_telemetry() {
        let cases = [
            (Some("error-ratio"), (100, 0), true, Some(0.0), true),
            (Some("error-ratio"), (100, 0), true, Some(0.0005), true),
            (Some("latency-p99"), (100, 0), true, Some(0.0), false),
            (None, (100, 0), true, Some(0.0), false),
            (Some("error-ratio"), (99, 1), true, Some(0.0), false),
            (Some("error-ratio"), (100, 0), false, Some(0.0), false),
            (Some("error-ratio"), (100, 0), true, Some(0.01), false),
            (Some("error-ratio"), (100, 0), true, None, false),
        ];
        for (gate, route, verified, share, want) in cases {
            let (pass, why) = judge(gate, route, verified, share);
            assert_eq!(pass, want, "{gate:?} {route:?} {verified} {share:?}: {why}");
        }
    }

    #[test]
    fn detect_to_revert_is_the_status_millisecond_figure() {
        let status = |ms: Option<u64>, first: Option<&str>, reverted: Option<&str>| {
            serde_json::from_value::<RolloutStatus>(json!({
                "abortDetectToRevertMs": ms,
                "abort": {
                    "reason": "GateFailed",
                    "decidedAt": "2026-01-01T00:00:01Z",
                    "firstFailedAt": first,
                    "routeRevertedAt": reverted,
                }
            }))
            .unwrap()
        };
        let cases = [
            // The operator's millisecond figure wins over the one-second timestamps.
            (
                Some(31),
                Some("2026-01-01T00:00:01Z"),
                Some("2026-01-01T00:00:04Z"),
                Some(31),
            ),
            (
                None,
                Some("2026-01-01T00:00:01Z"),
                Some("2026-01-01T00:00:03Z"),
                Some(2000),
            ),
            (None, Some("2026-01-01T00:00:01Z"), None, None),
            (None, None, Some("2026-01-01T00:00:01Z"), None),
        ];
        for (ms, first, reverted, want) in cases {
            assert_eq!(
                detect_to_revert_ms(&status(ms, first, reverted)),
                want,
                "{ms:?} {first:?} {reverted:?}"
            );
        }
    }

    #[test]
    fn the_rollout_targets_the_sandbox_route_and_backends() {
        let r = rollout(
            json!([{"setWeight": {"weight": 1}}]),
            json!({"keepMirror": true}),
        )
        .unwrap();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["spec"]["routeRef"]["name"], ROUTE);
        assert_eq!(v["spec"]["stableService"]["name"], STABLE);
        assert_eq!(v["spec"]["canaryService"]["name"], CANARY);
        assert_eq!(v["spec"]["keepMirror"], true);
        assert_eq!(v["metadata"]["namespace"], SHOP);
    }
}
