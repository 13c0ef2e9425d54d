//! `sluice-sandbox --scenario canary-grpc-mirror`: rollout-weights in east-1 mirrors half of the
//! gRPC service payments' read method GetReceipt to v2 before any live weight, v2 starts answering
//! UNAVAILABLE on HTTP 200 at 2.3× stable, and the operator aborts in the mirror step on the
//! error-ratio gate read from the mirrored copies, removing the mirror rule; the binary exits 0
//! with the JSON result as its last line carrying the figures, no live call ever reached v2, and
//! nothing it started is left running.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop). On an idle machine it takes well under a minute.
const BUDGET: Duration = Duration::from_secs(150);

#[test]
fn canary_grpc_mirror_scenario_aborts_in_the_mirror_step_with_no_live_canary_call() {
    let Some(run) = common::run_scenario("canary-grpc-mirror", BUDGET) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    assert_eq!(result["failed_gate"], "error-ratio", "{last}");
    assert_eq!(result["abort_step_index"], 0, "{last}");
    let abort_latency = run.ms("abort_latency_ms");
    let detect_to_revert = run.ms("detect_to_revert_ms");
    assert!(
        abort_latency > 0 && abort_latency < 60_000,
        "abort_latency_ms {abort_latency}"
    );
    assert!(
        detect_to_revert <= abort_latency + 1000,
        "detect_to_revert_ms {detect_to_revert} exceeds abort_latency_ms {abort_latency} (+1 s timestamp precision)"
    );
    // Found on mirrored copies alone: the canary's proxy reported copies, UNAVAILABLE among
    // them, and the canary never had a live weight nor a live call.
    let number = |k: &str| {
        result[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} is a number: {last}"))
    };
    assert!(number("mirrored_copies") > 0.0, "{last}");
    assert!(number("mirrored_unavailable") > 0.0, "{last}");
    assert_eq!(number("live_canary_requests"), 0.0, "{last}");
    assert_eq!(number("max_canary_weight"), 0.0, "{last}");
    // Only the read method was copied: half of its quarter of the calls, never a Charge.
    assert_eq!(number("mirrored_share"), 0.125, "{last}");
    let share = number("canary_share_after");
    assert!(
        share <= 0.001,
        "canary share after the abort {share}: {last}"
    );
}
