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

use super::canary_abort::{
    CLUSTER, ERROR_FACTOR, Fault, REQUESTS_PER_SECOND, checkout_fault, create,
    fault_until_reverted, judge, measured_share, ms, raise_traffic, rollout, rollout_until,
    route_until, route_weights, routes, weights,
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

    let api = routes(sandbox)?;
    let fault = Fault {
        reverted_note: ", while paused",
        aborted: Some("the paused canary"),
        ..checkout_fault("canary-pause-abort")
    };
    let reverted = fault_until_reverted(sandbox, &fault, || route_weights(&api)).await?;
    let paused_ms = ms(reverted.fault_at.duration_since(paused));
    let step_index = reverted.abort.step_index;

    // The scenario's own reading: a full window after the revert took effect in the mesh.
    reverted.full_window().await;
    let share_after = measured_share(sandbox).await?;
    let (mut pass, mut summary) =
        judge(reverted.gate.as_deref(), reverted.route, true, share_after);
    if pass && step_index != Some(1) {
        pass = false;
        summary = format!("aborted at step {step_index:?}, not in the pause step");
    }
    sandbox.say(format!("canary-pause-abort: {summary}"));

    let mut figures = reverted.figures(share_after);
    figures.insert("paused_ms".into(), Value::from(paused_ms));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}
