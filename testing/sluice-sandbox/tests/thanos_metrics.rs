//! `sluice-sandbox --metrics thanos`: a Prometheus per cluster (external labels `cluster`,
//! `site`) with a Thanos sidecar each, Thanos Query over them with strict endpoints (`--endpoint.sd-config`), the
//! operators reading through Thanos Query.
//! - `canary-abort` and `waves-breach` pass as they do on one Prometheus (the gates and
//!   wave-gate's cross-site waits read through Thanos Query); `waves-breach` runs on the real
//!   control plane (`--control-plane real`) whatever `SLUICE_E2E_CONTROL_PLANE` says, so the two
//!   real backends are proven together.
//! - `canary-store-down`: with east-1's store down no gate passes, the Rollout holds, and its
//!   gates report Inconclusive with the query failure. It also runs on the real control plane, so
//!   a store outage is proven against a real API server's status writes and watches.
//!
//! Each leaves nothing running. They run one after the other; `canary-abort` runs on the
//! control plane `SLUICE_E2E_CONTROL_PLANE` names (see `common::on_control_plane`).

mod common;

use std::time::Duration;

/// A watchdog on the whole run (start, scenario, stop) that only stops a hung run; the
/// scenario's own budget fails a slow scenario with a message. The Thanos backend adds six
/// Prometheus, six sidecars and Thanos Query to the sandbox's start.
const BUDGET: Duration = Duration::from_secs(300);

fn run(name: &str) -> Option<common::ScenarioResult> {
    run_with(name, &[], BUDGET)
}

/// `run`, with more sandbox arguments.
fn run_with(name: &str, more: &[&str], budget: Duration) -> Option<common::ScenarioResult> {
    sluice_testkit::prereq::or_skip(sluice_testkit::thanos::binary())?;
    let args: Vec<&str> = ["--metrics", "thanos"]
        .iter()
        .chain(more)
        .copied()
        .collect();
    common::run_scenario_with(name, &args, budget)
}

#[test]
fn canary_abort_through_thanos_query_aborts_on_the_error_gate() {
    let Some(run) = run("canary-abort") else {
        return;
    };
    run.aborted_on("error-ratio", Duration::from_secs(60));
}

#[test]
fn waves_breach_through_thanos_query_on_a_real_control_plane_halts_in_wave_zero_and_pins_back() {
    if sluice_testkit::control_plane::require().is_none() {
        return;
    }
    let Some(run) = run_with(
        "waves-breach",
        &["--control-plane", "real"],
        BUDGET + common::REAL_START,
    ) else {
        return;
    };
    let result = &run.result;
    assert_eq!(result["failed_gate"], "mesh-error-ratio", "{result}");
    let reverted = run.ms("breach_to_reverted_ms");
    assert!(
        reverted < 60_000,
        "breach_to_reverted_ms {reverted}: {result}"
    );
    let pins: Vec<&str> = result["pins"].as_str().unwrap().split(',').collect();
    assert_eq!(pins.len(), 1, "one pin, for the canary cluster: {result}");
}

#[test]
fn with_a_store_down_on_a_real_control_plane_no_gate_passes_and_the_reason_names_the_failure() {
    if sluice_testkit::control_plane::require().is_none() {
        return;
    }
    let Some(run) = run_with(
        "canary-store-down",
        &["--control-plane", "real"],
        BUDGET + common::REAL_START,
    ) else {
        return;
    };
    let result = &run.result;
    assert!(result["held_s"].as_u64().unwrap() >= 25, "{result}");
    let message = result["gate_message"].as_str().expect("a gate message");
    let store_error = result["store_error"]
        .as_str()
        .expect("Thanos Query reports the store");
    println!("gate message: {message}\nstore error: {store_error}");
    // The gate's reason is the query failure Thanos Query returned for the store it could not
    // reach, not a judgement on the clusters left.
    assert!(
        message.contains("partial response")
            || message.contains("unavailable")
            || message.contains("Unavailable"),
        "the gate's message names the store failure: {message}"
    );
    assert!(
        result["own_reading"]
            .as_str()
            .unwrap()
            .starts_with("failed"),
        "the scenario's own reading through Thanos Query fails too: {result}"
    );
}
