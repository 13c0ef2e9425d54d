//! `sluice-sandbox --scenario canary-promote --until-done`: rollout-weights in east-1 takes a
//! healthy checkout v2.14 through mirror, cohort and 1 → 5 → 25 → 50 → 100, then hands the route
//! back when the Rollout is deleted and Argo CD applies Git's route; the binary exits 0 with the
//! JSON result as its last line, and nothing it started is left running.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop). On an idle machine it takes about a minute.
const BUDGET: Duration = Duration::from_secs(118);

#[test]
fn canary_promote_scenario_promotes_step_by_step_and_hands_back() {
    if let Some(reason) = common::skip_reason() {
        println!("skipping: {reason}");
        return;
    }
    if common::operators_flag() != "--operators=on" {
        println!("skipping: the scenario needs the rollout-weights binary (cargo build --bins)");
        return;
    }
    let mut run = common::start(&[
        "--scenario",
        "canary-promote",
        "--until-done",
        "--base-port",
        "0",
    ]);
    let status = run.wait_exit(BUDGET);
    let last = run.seen.last().cloned().unwrap_or_default();
    assert!(status.success(), "exit {status:?}; last line: {last}");
    let result: serde_json::Value = serde_json::from_str(&last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    assert_eq!(result["scenario"], "canary-promote");
    assert_eq!(result["outcome"], "pass", "{last}");
    assert_eq!(
        result["steps_passed"],
        serde_json::json!([1, 5, 25, 50]),
        "{last}"
    );
    let share = result["canary_share_promoted"]
        .as_f64()
        .expect("canary_share_promoted is a number");
    assert!(share >= 0.98, "canary share once promoted {share}");
    for name in ["promote_ms", "handback_ms", "argocd_sync_ms"] {
        assert!(result[name].as_u64().is_some(), "{name} missing: {last}");
    }
    let left = run.leftovers();
    assert!(left.is_empty(), "processes left behind: {left:?}");
}
