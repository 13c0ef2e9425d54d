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
    run.aborted_on("error-ratio", Duration::from_secs(60));
    let (result, last) = (&run.result, &run.last);
    // The abort stood on gRPC statuses alone: UNAVAILABLE on HTTP 200, never a 5xx.
    let unavailable = result["canary_unavailable"]
        .as_f64()
        .expect("canary_unavailable is a number");
    assert!(unavailable > 0.0, "no UNAVAILABLE answer counted: {last}");
    assert_eq!(result["canary_5xx"].as_f64(), Some(0.0), "{last}");
}
