//! `sluice-sandbox --scenario canary-abort`: rollout-weights in east-1 holds
//! checkout v2.14 at 1%, the canary starts returning 5xx at 2.3× stable, and the operator
//! aborts; the binary exits 0 with the JSON result as its last line carrying the three abort
//! figures, and nothing it started is left running.
//! The run is checked by [`common::dashboards`] too: every dashboard and alert query runs
//! against the sandbox's Prometheus during it; the Rollouts dashboard's queries return data,
//! and SluiceRolloutStuck, SluiceRolloutAborted and SluiceRolloutAnalysisInconclusive (the starved
//! gate's hold before the fault) name the Rollout.
//! `canary-pause-abort`: the same fault while a `pause: untilPromoted` step holds the 1%; the
//! pause does not stop the gates, and the abort comes in the pause step.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop, the last evaluation round). On an idle machine it takes
/// well under a minute.
const BUDGET: Duration = Duration::from_secs(130);

#[test]
fn canary_abort_scenario_aborts_and_reports_its_figures() {
    let Some(run) = common::dashboards::run_scenario_checked(
        "canary-abort",
        BUDGET,
        Some("rollouts.json"),
        ("rollouts.json", "east-1", "shop", "checkout"),
    ) else {
        return;
    };
    // The fault must first show in a 5 s window and fail its gate: the abort cannot precede it,
    // and the controller's own delay is a small part of what a user feels.
    run.aborted_on("error-ratio", Duration::from_secs(60));
    let hold = run.ms("inconclusive_hold_ms");
    assert!(
        hold < 30_000,
        "inconclusive_hold_ms {hold}: the starved gate's 2 s then one analysis: {}",
        run.last
    );
}

/// `canary-pause-abort`'s own budget (150 s) and the start and stop around it.
const PAUSE_BUDGET: Duration = Duration::from_secs(190);

#[test]
fn a_fault_during_a_pause_until_promoted_still_aborts_in_the_pause_step() {
    let Some(run) = common::run_scenario("canary-pause-abort", PAUSE_BUDGET) else {
        return;
    };
    // `pass` already says the abort came in step 1, the pause.
    run.aborted_on("error-ratio", Duration::from_secs(90));
    let paused = run.ms("paused_ms");
    assert!(
        paused >= 5_000,
        "paused_ms {paused}: the fault starts after the 5 s hold in the pause: {}",
        run.last
    );
}
