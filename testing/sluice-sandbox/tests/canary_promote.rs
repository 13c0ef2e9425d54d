//! `sluice-sandbox --scenario canary-promote`: rollout-weights in east-1 takes a
//! healthy checkout v2.14 through mirror, cohort and 1 → 5 → 25 → 50 → 100, then hands the route
//! back when the Rollout is deleted and Argo CD applies Git's route; the binary exits 0 with the
//! JSON result as its last line, and nothing it started is left running. The Git change comes
//! after the Rollout's 2 s hand-back deadline, so it is HandBackOverdue first.
//! The run is checked by [`common::dashboards`] too: every dashboard and alert query runs
//! against the sandbox's Prometheus during it (none may error), and SluiceRolloutHandBackOverdue names the Rollout.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop). Promotion alone took 91 s on a loaded 2-core machine:
/// each step lasts until the sequential gates have enough evidence of a healthy canary.
const BUDGET: Duration = Duration::from_secs(200);

#[test]
fn canary_promote_scenario_promotes_step_by_step_and_hands_back() {
    let Some(run) = common::dashboards::run_scenario_checked(
        "canary-promote",
        BUDGET,
        None,
        ("rollouts.json", "east-1", "shop", "checkout"),
    ) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    assert_eq!(
        result["steps_passed"],
        serde_json::json!([1, 5, 25, 50]),
        "{last}"
    );
    let share = result["canary_share_promoted"]
        .as_f64()
        .expect("canary_share_promoted is a number");
    assert!(share >= 0.98, "canary share once promoted {share}");
    for name in [
        "promote_ms",
        "handback_ms",
        "argocd_sync_ms",
        "handback_overdue_ms",
    ] {
        assert!(result[name].as_u64().is_some(), "{name} missing: {last}");
    }
}
