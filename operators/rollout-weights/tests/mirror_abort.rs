//! End to end: a mirror step judges the canary on what its destination reports. During a mirror
//! step the canary has no live weight and receives only mirrored copies, which Istio's source
//! reporter never counts (the simulator, like Istio, reports them only at the receiving proxy,
//! under the request's host with `-shadow`, attributed to the canary by `destination_workload`).
//! A canary that returns 5xx at 2.3× stable on those copies is aborted — the mirror rule removed
//! from the route — within one analysis interval of the first Fail verdict, with the fixture's
//! seconds-scale gates and with the default gates at production ratios (30:1). Prints
//! `fault_to_revert_ms` and `detect_to_revert_ms`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::PostParams;
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase, Verdict,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::conditions::find;

/// The analysis interval of this test (the Rollout fixture's `analysisInterval`).
const INTERVAL: Duration = Duration::from_secs(1);

/// The traffic and gates of a run.
#[derive(Clone, Copy, PartialEq)]
enum Settings {
    /// The fixture's seconds-scale gates (4 s windows) at 4,000 requests/s.
    Seconds,
    /// The production defaults compressed 30:1 with their ratios kept: the default gates (no
    /// `spec.gates`), a 1 s interval standing for 30 s, and 6,000 requests/s so that each
    /// interval counts what 30 s of 200 requests/s count.
    ProductionRatios,
}

async fn mirrored_canary_is_aborted(settings: Settings) {
    let budget = Duration::from_secs(90);
    let (rps, patch) = match settings {
        Settings::Seconds => (4000.0, json!({})),
        Settings::ProductionRatios => (6000.0, json!({"gates": []})),
    };
    // The fault comes from a known instant (below), not from the scenario's clock.
    let mut s = scenario("canary-abort", rps);
    s.events.clear();
    let Some(g) = given(s).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);

    // Given a long mirror step: the canary gets a copy of every GET and HEAD, and no live weight.
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(
                json!([
                    {"mirror": {"percent": 100, "duration": "600s"}},
                    {"setWeight": {"weight": 50}},
                    {"promote": {}}
                ]),
                patch,
            ),
        )
        .await
        .unwrap();
    // The healthy canary is judged on its mirrored copies: its error gate passes (on the source
    // reporter the canary served nothing, and the gate could only be Inconclusive).
    let judged = rollout_until(
        &g.client,
        "the mirrored canary's error gate passes",
        budget,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.current_step_index == Some(0)
                    && s.mirror_active
                    && s.gates
                        .iter()
                        .any(|v| v.gate == "error-ratio" && v.verdict == Verdict::Pass)
            })
        },
    )
    .await;
    let st = judged.status.unwrap();
    assert_eq!(st.phase, RolloutPhase::Progressing);
    let route = routes(&g.client).get("checkout").await.unwrap();
    assert_eq!(weights(&route), (100, 0), "no live weight in a mirror step");
    assert!(rule_names(&route).contains(&"sluice-mirror".to_owned()));

    // When the canary starts returning 5xx at 2.3× stable.
    g.canary_errors_at(2.3);
    let fault = Instant::now();

    // Then the mirror rule is removed and the status says why, with the millisecond figure.
    eventually("mirror rule removed", budget, async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        let names = rule_names(&r);
        (!names.contains(&"sluice-mirror".to_owned()))
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await;
    let fault_to_revert = fault.elapsed();
    let route = routes(&g.client).get("checkout").await.unwrap();
    assert_eq!(weights(&route), (100, 0));
    assert_eq!(rule_names(&route), ["admin", "main"]);
    let status = abort_recorded(&g.client, budget).await;
    assert!(!status.mirror_active);
    let abort = status.abort.clone().unwrap();
    assert_eq!(abort.reason, AbortReason::GateFailed, "{abort:?}");
    assert_eq!(abort.step_index, Some(0));
    let gate = abort.gate.clone().expect("failing gate kept");
    assert_eq!(gate.gate, "error-ratio", "{gate:?}");
    assert!(
        abort
            .message
            .as_deref()
            .is_some_and(|m| m.contains("mirror step")),
        "{abort:?}"
    );
    let progressing = find(&status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(progressing.reason, reasons::GATE_FAILED);
    let detect_ms = status
        .abort_detect_to_revert_ms
        .expect("status.abortDetectToRevertMs set with routeRevertedAt");
    println!(
        "mirror step{}: fault_to_revert_ms={} detect_to_revert_ms={detect_ms}",
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
async fn a_mirror_steps_failing_canary_is_aborted_on_its_first_fail() {
    mirrored_canary_is_aborted(Settings::Seconds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_production_ratios_a_mirror_steps_failing_canary_is_aborted_on_its_first_fail() {
    mirrored_canary_is_aborted(Settings::ProductionRatios).await;
}
