//! End to end on the API emulator with the cluster simulator and a real Prometheus: an upgrade
//! that names no gates is judged by the defaults (`RevisionUpgradeSpec::effective_gates`), with
//! only the variables the upgrade supplies. They pass a healthy wave, fail one whose moved
//! namespace's requests the mesh starts failing, scoped to the wave's namespaces, and fail one
//! whose moved namespace's p99 latency rises above its own p99 from before the wave started.

mod common;

use std::time::Duration;

use common::{CLUSTER, Harness, NsSpec, condition};
use serde_json::json;
use sluice_api::v1alpha1::{
    RevisionUpgradePhase, Verdict,
    revision_upgrade::{UpgradeWaveState, conditions, reasons},
};
use sluice_sim::mesh::scenario::Event;

/// `edge` (the first wave) serves 50 requests per second through the simulated mesh.
fn fleet() -> (Vec<NsSpec>, String) {
    let fleet = vec![NsSpec {
        name: "edge",
        tier: Some("low"),
        deployments: vec![("gw", 2)],
    }];
    let services = format!(
        "\n  - name: gw\n    namespace: edge\n    cluster: {CLUSTER}\n    requests_per_second: 50\n    versions:\n      - {{name: v1, backend: gw}}\n"
    );
    (fleet, services)
}

/// The default waves, with a soak of `soak` for the first.
fn defaults(soak: &str) -> serde_json::Value {
    json!({
        "gates": [],
        "waves": [
            {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": soak},
            {"name": "tier-2", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-2"}}, "soak": "1s"},
            {"name": "tier-1", "namespaceSelector": {}, "soak": "1s"},
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_gates_pass_a_healthy_wave() {
    let (fleet, services) = fleet();
    let Some(mut h) = Harness::given_shaped(
        &fleet,
        common::ISSUANCE_WINDOW,
        common::deployment,
        &services,
    )
    .await
    else {
        return;
    };
    h.start_operator().await;
    h.when_upgrade(defaults("5s")).await;
    let soaking = h
        .until(Duration::from_secs(40), "wave low-risk soaking", |o| {
            o.status.as_ref().is_some_and(|s| {
                s.waves
                    .first()
                    .is_some_and(|w| w.state == UpgradeWaveState::Soaking)
                    && !s.captured_baselines.is_empty()
            })
        })
        .await;
    let baseline = pre_wave_baseline(&soaking);
    assert_eq!(
        Some(&baseline.window_end),
        soaking.status.as_ref().unwrap().waves[0]
            .started_at
            .as_ref(),
        "the baseline window ends when the wave started"
    );
    let done = h
        .until(Duration::from_secs(60), "phase Complete", |o| {
            o.status.as_ref().map(|s| s.phase) == Some(RevisionUpgradePhase::Complete)
        })
        .await;
    let wave = &done.status.as_ref().unwrap().waves[0];
    assert_eq!(wave.state, UpgradeWaveState::Passed);
    let errors = wave
        .gates
        .iter()
        .find(|v| v.gate == "mesh-error-ratio")
        .expect("the default mesh-error-ratio gate judged the wave");
    assert_eq!(errors.verdict, Verdict::Pass, "{errors:?}");
    assert!(
        errors
            .message
            .as_deref()
            .is_some_and(|m| m.contains("namespace edge")),
        "scoped to the moved namespace: {errors:?}"
    );
    assert!(wave.gates.iter().any(|v| v.gate == "xds-nack-increase"));
    let latency = wave
        .gates
        .iter()
        .find(|v| v.gate == "latency-p99")
        .expect("the default latency-p99 gate judged the wave");
    assert_eq!(latency.verdict, Verdict::Pass, "{latency:?}");
    assert!(
        latency
            .message
            .as_deref()
            .is_some_and(|m| m.contains("namespace edge") && m.contains("pre-change baseline")),
        "judged against the namespace's pre-wave p99: {latency:?}"
    );
    assert_eq!(latency.baseline, Some(baseline.value), "{latency:?}");
    h.shutdown().await;
}

/// The default p99 gate's pre-wave baseline of namespace `edge`.
fn pre_wave_baseline(
    o: &sluice_api::v1alpha1::RevisionUpgrade,
) -> sluice_api::v1alpha1::CapturedBaseline {
    let status = o.status.as_ref().unwrap();
    let baseline = status
        .captured_baselines
        .iter()
        .find(|b| b.gate == "latency-p99" && b.scope.as_deref() == Some("edge"))
        .unwrap_or_else(|| {
            panic!(
                "no pre-wave baseline kept for latency-p99 in namespace edge: {:?}",
                status.captured_baselines
            )
        })
        .clone();
    // The simulated gw answers with a p99 of 100 ms before the upgrade.
    assert!(
        (50.0..=150.0).contains(&baseline.value),
        "pre-wave p99 of edge: {baseline:?}"
    );
    baseline
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_gates_fail_a_wave_whose_new_revision_raises_p99_latency() {
    let (fleet, services) = fleet();
    let Some(mut h) = Harness::given_shaped(
        &fleet,
        common::ISSUANCE_WINDOW,
        common::deployment,
        &services,
    )
    .await
    else {
        return;
    };
    h.start_operator().await;
    h.when_upgrade(defaults("90s")).await;
    let soaking = h
        .until(Duration::from_secs(40), "wave low-risk soaking", |o| {
            o.status.as_ref().is_some_and(|s| {
                s.waves
                    .first()
                    .is_some_and(|w| w.state == UpgradeWaveState::Soaking)
            })
        })
        .await;
    assert_eq!(
        h.namespace_revisions("edge").await,
        (0, 2),
        "edge's proxies all run the new revision"
    );
    let before = pre_wave_baseline(&soaking);
    // When the proxies of the new revision serve gw with a p99 of 1 s (p50 40 ms): the mesh's
    // error ratio stays 0, only the latency gate can see it.
    h.world.mesh().unwrap().apply_now(Event {
        service: Some("gw".into()),
        version: Some("v1".into()),
        p50_ms: Some(40.0),
        p99_ms: Some(1000.0),
        ..Event::default()
    });
    let aborted = h
        .until(Duration::from_secs(60), "phase Aborted", |o| {
            o.status.as_ref().map(|s| s.phase) == Some(RevisionUpgradePhase::Aborted)
        })
        .await;
    let (_, reason, message) = condition(&aborted, conditions::PROGRESSING).unwrap();
    assert!(
        reason == reasons::GATE_FAILED || reason == reasons::ROLLED_BACK,
        "{reason}: {message}"
    );
    let wave = &aborted.status.as_ref().unwrap().waves[0];
    let latency = wave.gates.iter().find(|v| v.gate == "latency-p99").unwrap();
    assert_eq!(latency.verdict, Verdict::Fail, "{latency:?}");
    assert!(
        latency
            .message
            .as_deref()
            .is_some_and(|m| m.contains("namespace edge")),
        "{latency:?}"
    );
    assert_eq!(
        latency.baseline,
        Some(before.value),
        "judged against the baseline captured before the wave, never re-read"
    );
    let errors = wave
        .gates
        .iter()
        .find(|v| v.gate == "mesh-error-ratio")
        .unwrap();
    assert_ne!(errors.verdict, Verdict::Fail, "{errors:?}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_gates_fail_a_wave_whose_namespace_the_mesh_breaks() {
    let (fleet, services) = fleet();
    let Some(mut h) = Harness::given_shaped(
        &fleet,
        common::ISSUANCE_WINDOW,
        common::deployment,
        &services,
    )
    .await
    else {
        return;
    };
    h.start_operator().await;
    h.when_upgrade(defaults("60s")).await;
    h.until(Duration::from_secs(40), "wave low-risk soaking", |o| {
        o.status.as_ref().is_some_and(|s| {
            s.waves
                .first()
                .is_some_and(|w| w.state == UpgradeWaveState::Soaking)
        })
    })
    .await;
    // When the mesh fails 20% of the requests.
    h.world.mesh().unwrap().apply_now(Event {
        cluster: Some(CLUSTER.into()),
        mesh_failure_ratio: Some(0.2),
        ..Event::default()
    });
    let aborted = h
        .until(Duration::from_secs(60), "phase Aborted", |o| {
            o.status.as_ref().map(|s| s.phase) == Some(RevisionUpgradePhase::Aborted)
        })
        .await;
    let (_, reason, message) = condition(&aborted, conditions::PROGRESSING).unwrap();
    assert!(
        reason == reasons::GATE_FAILED || reason == reasons::ROLLED_BACK,
        "{reason}: {message}"
    );
    let wave = &aborted.status.as_ref().unwrap().waves[0];
    let errors = wave
        .gates
        .iter()
        .find(|v| v.gate == "mesh-error-ratio")
        .unwrap();
    assert_eq!(errors.verdict, Verdict::Fail, "{errors:?}");
    h.shutdown().await;
}
