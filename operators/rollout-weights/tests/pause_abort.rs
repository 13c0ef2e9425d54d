//! End to end, `canary-pause-abort`: pausing holds progress, never safety. The two everyday
//! ways a release engineer stops to look at a 1% canary — a `pause: {untilPromoted: true}` step
//! after `setWeight 1`, and `spec.paused: true` set while at 1% — keep the canary judged: once it
//! returns 5xx at 2.3× stable, the first Fail verdict aborts it (canary weight 0 in one write)
//! within one analysis interval. Prints `fault_to_revert_ms` (fault injected → route reverted,
//! seen on the route) and `detect_to_revert_ms` (the abort decision on the failing verdict →
//! route reverted, the status' millisecond figure).

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::conditions::find;

/// The analysis interval of these tests (the Rollout fixture's `analysisInterval`).
const INTERVAL: Duration = Duration::from_secs(1);

/// How the canary is held at 1% before the fault.
enum Hold {
    /// Steps `setWeight 1` then `pause: {untilPromoted: true}`.
    PauseStep,
    /// `spec.paused: true` set once the 1% is confirmed.
    SpecPaused,
}

/// The traffic and gates of a run.
#[derive(Clone, Copy, PartialEq)]
enum Settings {
    /// The fixture's seconds-scale gates (4 s windows) at 4,000 requests/s.
    Seconds,
    /// The production defaults compressed 30:1 with their ratios kept: the default gates (no
    /// `spec.gates`), a 1 s interval standing for 30 s, and 6,000 requests/s so that each
    /// interval counts what 30 s of 200 requests/s count (the sequential tests see counts per
    /// interval, not rates).
    ProductionRatios,
}

async fn held_canary_is_aborted(hold: Hold, settings: Settings) {
    let budget = Duration::from_secs(100);
    let (rps, patch) = match settings {
        Settings::Seconds => (4000.0, json!({})),
        Settings::ProductionRatios => (6000.0, json!({"gates": [], "stepDuration": "10s"})),
    };
    // The fault comes from a known instant (below), not from the scenario's clock.
    let mut s = scenario("canary-abort", rps);
    s.events.clear();
    let Some(g) = given(s).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a canary held at 1%.
    let steps: Value = match hold {
        Hold::PauseStep => json!([
            {"setWeight": {"weight": 1}},
            {"pause": {"untilPromoted": true}},
            {"setWeight": {"weight": 50}},
            {"promote": {}}
        ]),
        Hold::SpecPaused => json!([
            {"setWeight": {"weight": 1, "duration": "600s"}},
            {"setWeight": {"weight": 50}},
            {"promote": {}}
        ]),
    };
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, patch))
        .await
        .unwrap();
    share_confirmed_at_step(&g.client, "1% confirmed by telemetry", 0, budget).await;
    let held_step = match hold {
        Hold::PauseStep => 1,
        Hold::SpecPaused => {
            rollouts(&g.client)
                .patch(
                    "checkout",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"paused": true}})),
                )
                .await
                .unwrap();
            0
        }
    };
    rollout_until(&g.client, "held at 1%", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == RolloutPhase::Paused && s.current_step_index == Some(held_step)
        })
    })
    .await;
    // Held: a few intervals later it is still paused at 1%.
    tokio::time::sleep(INTERVAL * 3).await;
    let still = rollout_until(&g.client, "still held", budget, |_| true).await;
    let st = still.status.unwrap();
    assert_eq!(
        (st.phase, st.current_step_index),
        (RolloutPhase::Paused, Some(held_step))
    );
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (99, 1)
    );
    assert!(
        !st.gates.is_empty(),
        "the held canary's gates are evaluated: {st:?}"
    );

    // When the canary starts returning 5xx at 2.3× stable.
    g.canary_errors_at(2.3);
    let fault = Instant::now();

    // Then the route is reverted and the status says why, with the millisecond figure.
    eventually("route reverted", budget, async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        (weights(&r) == (100, 0))
            .then_some(())
            .ok_or(format!("{:?}", weights(&r)))
    })
    .await;
    let fault_to_revert = fault.elapsed();
    let status = abort_recorded(&g.client, budget).await;
    let abort = status.abort.clone().unwrap();
    assert_eq!(abort.reason, AbortReason::GateFailed, "{abort:?}");
    assert_eq!(abort.step_index, Some(held_step));
    let gate = abort.gate.clone().expect("failing gate kept");
    assert_eq!(gate.gate, "error-ratio", "{gate:?}");
    let progressing = find(&status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(progressing.reason, reasons::GATE_FAILED);
    let detect_ms = status
        .abort_detect_to_revert_ms
        .expect("status.abortDetectToRevertMs set with routeRevertedAt");
    println!(
        "{}{}: fault_to_revert_ms={} detect_to_revert_ms={detect_ms}",
        match hold {
            Hold::PauseStep => "pause untilPromoted",
            Hold::SpecPaused => "spec.paused",
        },
        match settings {
            Settings::Seconds => "",
            Settings::ProductionRatios => ", production defaults at 30:1 (200 requests/s)",
        },
        fault_to_revert.as_millis()
    );
    assert!(
        u128::from(detect_ms) < INTERVAL.as_millis(),
        "reverted within one analysis interval of the first Fail: {detect_ms} ms"
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_held_by_a_pause_step_is_aborted_on_its_first_fail() {
    held_canary_is_aborted(Hold::PauseStep, Settings::Seconds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_held_by_spec_paused_is_aborted_on_its_first_fail() {
    held_canary_is_aborted(Hold::SpecPaused, Settings::Seconds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_production_ratios_a_canary_held_by_a_pause_step_is_aborted_on_its_first_fail() {
    held_canary_is_aborted(Hold::PauseStep, Settings::ProductionRatios).await;
}
