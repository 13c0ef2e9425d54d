//! `sluice-sandbox --scenario waves-clean|waves-breach`: wave-gate and revert running
//! where the chart puts them, beside each site's simulated Argo CD.
//! - `waves-clean`: a signed bundle crosses east and west in the fleet order; the binary exits 0
//!   with a time per wave and the total.
//! - `waves-breach`: mesh-attributed errors in the canary cluster halt the change in wave 0, which
//!   is pinned back to the previous bundle by revert; the binary exits 0 with `halt_to_pin_ms` and
//!   `breach_to_reverted_ms`.
//!
//! Each leaves nothing running. They run one after the other, in one test: both runs are
//! checked by [`common::dashboards`] too (every dashboard and alert query runs against the
//! sandbox's Prometheus during them; the waves dashboard's queries return data in one of the two,
//! SluiceWaveAnalysisInconclusive names the WaveGate in waves-clean, whose starved gate stays
//! Inconclusive through every soak, and SluiceWaveHalted in waves-breach).

mod common;

use std::time::Duration;

use common::dashboards::Expect;

/// A watchdog on the whole run (start, scenario, stop) that only stops a hung run. What fails a
/// slow scenario, with a message, is the scenario's own budget (110 s once the sandbox is
/// ready). The sandbox's start is not this test's subject and grows with the machine's
/// load: 48–65 s measured at load average 17–20 on 2 cores, 107 s with two sandboxes at once.
/// The scenarios themselves take 25 s (`waves-breach`) and 50 s (`waves-clean`: three wave
/// stages, each Argo CD's sync, the proxies' 5 s convergence and a 2 s soak).
const BUDGET: Duration = Duration::from_secs(240);

#[test]
fn waves_clean_crosses_in_the_fleet_order_then_waves_breach_halts_and_pins_back() {
    let Some(runs) = common::dashboards::run_checked(
        &[
            Expect {
                scenario: "waves-clean",
                budget: BUDGET,
            },
            Expect {
                scenario: "waves-breach",
                budget: BUDGET,
            },
        ],
        &["waves.json"],
        &[("waves.json", "east-mgmt", "argocd", "east")],
    ) else {
        return;
    };
    waves_clean_crosses_both_sites_in_the_fleet_order(&runs[0]);
    waves_breach_halts_in_wave_zero_and_pins_back(&runs[1]);
}

fn waves_clean_crosses_both_sites_in_the_fleet_order(run: &common::ScenarioResult) {
    let result = &run.result;
    // A time per wave, each at least its soak (2 s) on top of Argo CD's sync and the proxies'
    // convergence; then the total.
    let waves = [
        "east_canary_ms",
        "west_one_per_site_ms",
        "east_rest_ms",
        "west_rest_ms",
    ];
    for w in waves {
        let ms = run.ms(w);
        assert!((2_000..60_000).contains(&ms), "{w} {ms}: {result}");
    }
    let total = run.ms("total_ms");
    let sequential = run.ms("east_canary_ms") + run.ms("west_one_per_site_ms");
    assert!(
        total >= sequential,
        "total_ms {total} is shorter than the canary and one-per-site waves in a row ({sequential}): {result}"
    );
    let order: Vec<&str> = result["wave_order"].as_str().unwrap().split(',').collect();
    assert_eq!(order[..2], ["east/canary", "west/one-per-site"], "{result}");
    assert_eq!(order.len(), 4, "{result}");
}

fn waves_breach_halts_in_wave_zero_and_pins_back(run: &common::ScenarioResult) {
    let result = &run.result;
    assert_eq!(result["failed_gate"], "mesh-error-ratio", "{result}");
    assert!(
        result["failed_value"].as_f64().unwrap() > 0.01,
        "the failing ratio is recorded: {result}"
    );
    let halt_to_pin = run.ms("halt_to_pin_ms");
    let to_fail = run.ms("fault_to_fail_ms");
    let reverted = run.ms("breach_to_reverted_ms");
    // The controller's own delay is a small part of what a user feels; the revert needs the Fail
    // verdict, the pin and revert's verification and apply, in that order.
    assert!(
        halt_to_pin < 10_000,
        "halt_to_pin_ms {halt_to_pin}: {result}"
    );
    assert!(
        to_fail + halt_to_pin <= reverted,
        "reverted ({reverted} ms) before the fail ({to_fail} ms) and pin ({halt_to_pin} ms): {result}"
    );
    assert!(
        reverted < 60_000,
        "breach_to_reverted_ms {reverted}: {result}"
    );
    let pinned = run.ms("breach_to_pinned_ms");
    assert!(
        to_fail + halt_to_pin <= pinned,
        "revert applied the pin ({pinned} ms) before wave-gate created it: {result}"
    );
    let pins: Vec<&str> = result["pins"].as_str().unwrap().split(',').collect();
    assert_eq!(pins.len(), 1, "one pin, for the canary cluster: {result}");
}
