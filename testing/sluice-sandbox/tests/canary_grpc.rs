//! `sluice-sandbox --scenario canary-grpc`: rollout-weights in east-1 holds the gRPC service
//! payments' v2 at 1% on its GRPCRoute, the canary starts answering UNAVAILABLE on HTTP 200 at
//! 2.3× stable, and the operator aborts on the error-ratio gate; the binary exits 0 with the JSON
//! result as its last line carrying the abort figures, and nothing it started is left running.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop). On an idle machine it takes well under a minute.
const BUDGET: Duration = Duration::from_secs(150);

#[test]
fn canary_grpc_scenario_aborts_on_unavailable_answered_on_http_200() {
    let Some(run) = common::run_scenario("canary-grpc", BUDGET) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    assert_eq!(result["failed_gate"], "error-ratio", "{last}");
    let abort_latency = run.ms("abort_latency_ms");
    let detect_to_revert = run.ms("detect_to_revert_ms");
    let revert_verified = run.ms("revert_verified_ms");
    assert!(
        abort_latency > 0 && abort_latency < 60_000,
        "abort_latency_ms {abort_latency}"
    );
    assert!(
        detect_to_revert <= abort_latency + 1000,
        "detect_to_revert_ms {detect_to_revert} exceeds abort_latency_ms {abort_latency} (+1 s timestamp precision)"
    );
    assert!(
        revert_verified < 60_000,
        "revert_verified_ms {revert_verified}"
    );
    // The abort stood on gRPC statuses alone: UNAVAILABLE on HTTP 200, never a 5xx.
    let unavailable = result["canary_unavailable"]
        .as_f64()
        .expect("canary_unavailable is a number");
    assert!(unavailable > 0.0, "no UNAVAILABLE answer counted: {last}");
    assert_eq!(result["canary_5xx"].as_f64(), Some(0.0), "{last}");
    let share = result["canary_share_after"]
        .as_f64()
        .expect("canary_share_after is a number");
    assert!(
        share <= 0.001,
        "canary share after the revert {share}: {last}"
    );
}
