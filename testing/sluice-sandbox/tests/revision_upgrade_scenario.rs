//! `sluice-sandbox --scenario revision-upgrade`: the upgrade-revisions operator in
//! east-1 moves the fleet from 1-27 to 1-28 in three waves; the binary exits 0 with the JSON
//! result as its last line, the simulator's SVID counter within the budget. The RevisionUpgrade
//! is created paused and held Paused for 4 s before it is resumed.
//! The run is checked by [`common::dashboards`] too: every dashboard and alert query runs
//! against the sandbox's Prometheus during it; the upgrades dashboard's queries return data,
//! and SluiceUpgradePaused names the RevisionUpgrade.
//! `upgrade-no-pdb`: with no PodDisruptionBudget anywhere, no workload goes below replicas −
//! maxUnavailable while its proxies move.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop, the last evaluation round) must fit in this.
const BUDGET: Duration = Duration::from_secs(150);

#[test]
fn revision_upgrade_completes_within_the_issuance_budget() {
    let Some(run) = common::dashboards::run_scenario_checked(
        "revision-upgrade",
        BUDGET,
        Some("upgrades.json"),
        ("upgrades.json", "east-1", "", "istio-1-28"),
    ) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    let ratio = result["peak_issuance_ratio"]
        .as_f64()
        .expect("peak_issuance_ratio is a number");
    assert!(
        ratio > 0.0 && ratio <= 1.0,
        "peak_issuance_ratio {ratio}: {last}"
    );
    for figure in ["budget_utilisation", "time_ratio"] {
        let v = result[figure]
            .as_f64()
            .unwrap_or_else(|| panic!("{figure} is a number: {last}"));
        assert!(v > 0.0, "{figure} {v}: {last}");
    }
    let paused = run.ms("paused_ms");
    assert!(paused < 30_000, "paused_ms {paused}: {last}");
    let proxies = result["proxies"].as_u64().expect("proxies is a number");
    assert!(
        proxies >= 20,
        "the fleet of 20 added pods plus shop's: {last}"
    );
    assert_eq!(
        result["svids_issued"].as_u64(),
        Some(proxies),
        "one certificate per restarted proxy: {last}"
    );
}

/// `upgrade-no-pdb`'s own budget (150 s) and the start and stop around it.
const NO_PDB_BUDGET: Duration = Duration::from_secs(190);

#[test]
fn without_disruption_budgets_no_workload_goes_below_its_floor() {
    let Some(run) = common::run_scenario("upgrade-no-pdb", NO_PDB_BUDGET) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    let margin = result["min_available_margin"]
        .as_i64()
        .expect("min_available_margin is a number");
    assert!(margin >= 0, "a workload went below its floor: {last}");
    let proxies = result["proxies"].as_u64().expect("proxies is a number");
    assert!(
        proxies >= 10,
        "every workload's proxies moved ({proxies}): {last}"
    );
}
