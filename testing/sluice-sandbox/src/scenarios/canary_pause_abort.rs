//! Scenario `canary-pause-abort`: pausing holds progress, never safety. On east-1 a Rollout takes
//! checkout from v2.13 to v2.14 with `setWeight 1` then `pause: {untilPromoted: true}`, the
//! everyday way to stop and look at a 1% canary. Once the Rollout is Paused at 1%, v2.14 starts
//! returning 5xx at 2.3× the stable ratio. The rollout-weights operator must still judge the
//! held canary and abort on the first Fail: canary weight 0 in one route write, then confirm
//! from telemetry that the canary share fell to ~0.
//! Figures: `abort_latency_ms` (fault injected → route reverted, seen on the route),
//! `detect_to_revert_ms` (the abort decision on the first Fail → route reverted: the status'
//! millisecond figure), `revert_verified_ms` (route reverted → the operator's telemetry check
//! confirmed ~0), `paused_ms` (how long the Rollout had been Paused when the fault started).
//! Never writes the route itself: only the operator does; the scenario reads it.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use sluice_api::v1alpha1::RolloutPhase;
use sluice_sim::mesh::scenario::Event;

use super::canary_abort::{
    CLUSTER, ERROR_FACTOR, REQUESTS_PER_SECOND, WINDOW_S, create, detect_to_revert_ms, judge,
    measured_share, ms, raise_traffic, rollout, rollout_until, route_until, weights,
};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::sandbox::Sandbox;

/// How long the Rollout stays Paused at 1% before the fault: several analysis intervals, to
/// show the pause itself holds.
pub const HELD_BEFORE_FAULT: Duration = Duration::from_secs(5);

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "canary-pause-abort",
    description: "east-1's checkout v2.14 held at 1% by a pause untilPromoted step starts \
                  returning 5xx at 2.3x stable; pass when rollout-weights still aborts, the route \
                  is back at 100/0 and telemetry confirms ~0 (abort_latency_ms, \
                  detect_to_revert_ms, revert_verified_ms)",
    // The share confirmation, the 5 s hold, then the error gate's sequential test, which needs
    // about 30 s of evidence after the fault (canary-abort's abort_latency_ms was 37 s), the
    // revert's verification and a final window: 100 s ran out on a real control plane on a
    // loaded 2-core machine with the Rollout still Paused before the abort.
    budget: Duration::from_secs(150),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    raise_traffic(sandbox)?;
    sandbox.say(format!(
        "canary-pause-abort: checkout in {CLUSTER} at {REQUESTS_PER_SECOND} requests/s; a Rollout takes it from v2.13 to v2.14: 1%, then a pause until promoted"
    ));
    let steps = json!([
        {"setWeight": {"weight": 1}},
        {"pause": {"untilPromoted": true}},
        {"setWeight": {"weight": 50}},
        {"promote": {}}
    ]);
    create(sandbox, &rollout(steps, json!({}))?).await?;
    rollout_until(sandbox, |r| {
        r.status.as_ref().and_then(|s| {
            (s.phase == RolloutPhase::Paused && s.current_step_index == Some(1)).then_some(())
        })
    })
    .await?;
    let paused = Instant::now();
    let at_one = route_until(sandbox, Duration::from_millis(50), |r| Some(weights(r))).await?;
    sandbox.say(format!(
        "canary-pause-abort: the Rollout is Paused at step 1 (route at {}/{}), waiting for a person",
        at_one.0, at_one.1
    ));
    tokio::time::sleep(HELD_BEFORE_FAULT).await;
    let held = rollout_until(sandbox, |r| r.status.clone()).await?;
    if held.phase != RolloutPhase::Paused || held.current_step_index != Some(1) {
        return Ok(Outcome {
            pass: false,
            figures: Map::new(),
            summary: format!(
                "the pause step did not hold: phase {:?} at step {:?}",
                held.phase, held.current_step_index
            ),
        });
    }
    sandbox.say(format!(
        "canary-pause-abort: still Paused at 1% after {} ms; v2.14 now returns 5xx at {ERROR_FACTOR}x stable",
        ms(paused.elapsed())
    ));

    // The fault, from a known instant.
    let mesh = sandbox
        .world(CLUSTER)
        .and_then(|w| w.mesh())
        .ok_or_else(|| ScenarioError::Missing(format!("mesh simulator of {CLUSTER}")))?;
    mesh.apply_now(Event {
        service: Some("checkout".into()),
        version: Some("v2.14".into()),
        error_ratio_factor: Some(ERROR_FACTOR),
        ..Event::default()
    });
    let fault = Instant::now();
    let paused_ms = ms(fault.duration_since(paused));

    // The route reverted, seen by a fast poller.
    let route = route_until(sandbox, Duration::from_millis(15), |r| {
        (weights(r).1 == 0).then(|| weights(r))
    })
    .await?;
    let reverted = Instant::now();
    let abort_latency = reverted.duration_since(fault);
    sandbox.say(format!(
        "canary-pause-abort: route reverted to {}/{} {} ms after the fault started, while paused",
        route.0,
        route.1,
        ms(abort_latency)
    ));

    // The operator confirms the revert from telemetry.
    let status = rollout_until(sandbox, |r| {
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
        "canary-pause-abort: rollout-weights aborted the paused canary at step {:?} on gate {} (value {:?}, stable {:?}, threshold {:?}) and confirmed the revert {} ms after it",
        abort.step_index,
        gate.as_deref().unwrap_or("none"),
        abort.gate.as_ref().and_then(|g| g.value),
        abort.gate.as_ref().and_then(|g| g.baseline),
        abort.gate.as_ref().and_then(|g| g.threshold),
        ms(revert_verified)
    ));

    // The scenario's own reading: a full window after the revert took effect in the mesh.
    tokio::time::sleep(Duration::from_secs(2 + WINDOW_S + 1).saturating_sub(reverted.elapsed()))
        .await;
    let share_after = measured_share(sandbox).await?;
    let (mut pass, mut summary) = judge(gate.as_deref(), route, true, share_after);
    if pass && abort.step_index != Some(1) {
        pass = false;
        summary = format!(
            "aborted at step {:?}, not in the pause step",
            abort.step_index
        );
    }
    sandbox.say(format!("canary-pause-abort: {summary}"));

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
    figures.insert("paused_ms".into(), Value::from(paused_ms));
    figures.insert(
        "failed_gate".into(),
        gate.clone().map_or(Value::Null, Value::from),
    );
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
