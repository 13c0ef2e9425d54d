//! End to end: the wave-gate controller over the Kubernetes API emulator, a real Prometheus
//! carrying the mesh's signals, and Argo CD played by the test world (it syncs each Application
//! to the revision its cluster's decision names). One scenario per behaviour a site relies on:
//! a clean change across waves and sites, a breach in wave 0 pinned back, the NACK gate, the
//! drift gate's timeout, a restart during a soak, supersession, emergency, a partitioned site
//! released, and an unsafe ApplicationSet refused (no create-update; sync policy not ignored for
//! every generated Application).

mod common;

use std::time::Duration;

use common::*;
use sluice_api::v1alpha1::{
    WaveGate, WaveGatePhase,
    wave_gate::{HaltReason, WaveState, conditions, reasons},
};
use sluice_runtime::conditions::find;
use sluice_testkit::eventually::object_until;

/// Per step: a step takes seconds alone, but under a loaded 2-core CI machine a step of the
/// clean change was seen past 40 s.
const BUDGET: Duration = Duration::from_secs(90);

fn phase(w: &WaveGate) -> Option<WaveGatePhase> {
    w.status.as_ref().map(|s| s.phase)
}

fn wave_state(w: &WaveGate, i: usize) -> Option<WaveState> {
    w.status.as_ref()?.waves.get(i).map(|w| w.state)
}

fn decided(w: &WaveGate) -> Vec<(String, String)> {
    w.status
        .as_ref()
        .map(|s| {
            s.decisions
                .iter()
                .map(|d| (d.cluster_name.clone(), d.revision.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn one_site_waves() -> serde_json::Value {
    serde_json::json!([
        {"name": "canary", "clusters": ["eu-1"], "soak": "3s"},
        {"name": "rest", "clusters": ["eu-2", "eu-3"]}
    ])
}

/// Given site eu (canary eu-1, rest eu-2 and eu-3) on revision a, its mesh as `mesh` leaves
/// it and the controller running; when its WaveGate asks for b (spec fields overridden by
/// `patch`). `None` when the world cannot start (the reason is printed).
async fn eu_changing_to_b(
    patch: serde_json::Value,
    mesh: impl FnOnce(&World),
) -> Option<(World, Operator)> {
    let w = World::start(&["eu-1", "eu-2", "eu-3"]).await?;
    mesh(&w);
    let op = w.operator();
    w.application_set(
        "mesh-eu",
        safe_policy(),
        &["eu-1", "eu-2", "eu-3"],
        &rev('a'),
    )
    .await;
    let mut s = spec("eu", one_site_waves(), &rev('b'));
    for (k, v) in patch.as_object().unwrap() {
        s[k] = v.clone();
    }
    w.wave_gate(object("eu", s)).await;
    Some((w, op))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_change_crosses_every_wave_of_both_sites_in_order() {
    let Some(w) = World::start(&["eu-1", "eu-2", "eu-3", "us-1", "us-2"]).await else {
        return;
    };
    let op = w.operator();
    // Given two sites: eu's rest waits for us past its canary (the seed's fleet order).
    w.application_set(
        "mesh-eu",
        safe_policy(),
        &["eu-1", "eu-2", "eu-3"],
        &rev('a'),
    )
    .await;
    w.application_set("mesh-us", safe_policy(), &["us-1", "us-2"], &rev('a'))
        .await;
    let eu_waves = serde_json::json!([
        {"name": "canary", "clusters": ["eu-1"], "soak": "2s"},
        {"name": "rest", "clusters": ["eu-2", "eu-3"], "soak": "2s", "waitFor": [{"site": "us", "wave": "canary"}]}
    ]);
    let us_waves = serde_json::json!([
        {"name": "canary", "clusters": ["us-1"], "soak": "4s"},
        {"name": "rest", "clusters": ["us-2"], "soak": "2s"}
    ]);
    // When both WaveGates ask for b.
    w.wave_gate(object("eu", spec("eu", eu_waves, &rev('b'))))
        .await;
    w.wave_gate(object("us", spec("us", us_waves, &rev('b'))))
        .await;

    // Then eu waits for us once its canary passed.
    let eu = object_until(&w.wave_gates(), "eu", "eu waits for us", BUDGET, |g| {
        wave_state(g, 1) == Some(WaveState::Waiting)
            || wave_state(g, 1) == Some(WaveState::Converging)
    })
    .await;
    let eu_status = eu.status.as_ref().unwrap();
    assert_eq!(eu_status.waves[0].state, WaveState::Passed);

    // And both complete, every Application at b.
    let us = object_until(&w.wave_gates(), "us", "us Complete", BUDGET, |g| {
        phase(g) == Some(WaveGatePhase::Complete)
    })
    .await;
    let eu = object_until(&w.wave_gates(), "eu", "eu Complete", BUDGET, |g| {
        phase(g) == Some(WaveGatePhase::Complete)
    })
    .await;
    let (eu_s, us_s) = (eu.status.unwrap(), us.status.unwrap());
    for s in [&eu_s, &us_s] {
        assert!(s.decisions.iter().all(|d| d.revision == rev('b')));
        for (i, wave) in s.waves.iter().enumerate() {
            assert_eq!(wave.state, WaveState::Passed, "wave {i}");
            let (a, c, f) = (
                wave.admitted_at.as_ref().unwrap().0,
                wave.converged_at.as_ref().unwrap().0,
                wave.finished_at.as_ref().unwrap().0,
            );
            assert!(a <= c && c < f, "timestamps in order for wave {i}");
            assert!(
                wave.gates
                    .iter()
                    .all(|g| g.verdict == sluice_api::v1alpha1::Verdict::Pass)
            );
        }
        // Waves in order within a site.
        assert!(
            s.waves[1].admitted_at.as_ref().unwrap().0
                >= s.waves[0].finished_at.as_ref().unwrap().0
        );
    }
    // Across sites: eu's rest only after us passed its canary.
    assert!(
        eu_s.waves[1].admitted_at.as_ref().unwrap().0
            >= us_s.waves[0].finished_at.as_ref().unwrap().0,
        "eu rest admitted {:?} before us canary passed {:?}",
        eu_s.waves[1].admitted_at,
        us_s.waves[0].finished_at
    );
    assert!(w.synced().await.values().all(|r| *r == rev('b')));
    assert!(w.pins().await.is_empty());
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breach_in_wave_zero_halts_and_pins_back_only_wave_zero() {
    let Some((w, op)) = eu_changing_to_b(
        serde_json::json!({"waves": [
            {"name": "canary", "clusters": ["eu-1"], "soak": "30s"},
            {"name": "rest", "clusters": ["eu-2", "eu-3"]}
        ]}),
        |_| {},
    )
    .await
    else {
        return;
    };
    object_until(&w.wave_gates(), "eu", "wave 0 soaking", BUDGET, |g| {
        wave_state(g, 0) == Some(WaveState::Soaking)
    })
    .await;
    // When mesh-attributed errors rise in the canary cluster.
    w.mesh("eu-1", |m| m.mesh_errors_per_s = 30.0);
    let fault = std::time::Instant::now();
    let (mut halt_seen, mut pin_seen, mut reverted_seen) = (None, None, None);
    tokio::time::timeout(BUDGET, async {
        while reverted_seen.is_none() {
            let g = w.wave_gates().get("eu").await.unwrap();
            if halt_seen.is_none() && g.status.as_ref().is_some_and(|s| s.halt.is_some()) {
                halt_seen = Some(fault.elapsed());
            }
            if pin_seen.is_none() && !w.pins().await.is_empty() {
                pin_seen = Some(fault.elapsed());
            }
            if w.synced().await.get("eu-1") == Some(&rev('a')) {
                reverted_seen = Some(fault.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("halted, pinned and the canary back at the previous revision within the budget");
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    println!(
        "breach figures (10 ms polls): fault to halt {:.0} ms, halt_to_pin_ms {:.0}, breach_to_reverted_ms {:.0} (Argo CD syncing the set-back decision after {:?})",
        ms(halt_seen),
        ms(pin_seen) - ms(halt_seen),
        ms(reverted_seen),
        w.sync_delay
    );
    let halted = object_until(
        &w.wave_gates(),
        "eu",
        "halted and pinned back",
        BUDGET,
        |g| {
            g.status
                .as_ref()
                .and_then(|s| s.halt.as_ref())
                .is_some_and(|h| h.pinned_at.is_some())
        },
    )
    .await;
    let s = halted.status.clone().unwrap();
    let h = s.halt.as_ref().unwrap();
    assert_eq!(h.reason, HaltReason::GateFailed);
    assert_eq!(h.wave, "canary");
    let gate = h.gate.as_ref().unwrap();
    assert_eq!(gate.gate, "mesh-error-ratio");
    assert!(
        gate.value.unwrap() > 0.01,
        "the failing value is recorded: {gate:?}"
    );
    assert_eq!(h.reverted_clusters, vec!["eu-1".to_owned()]);
    assert_eq!(s.phase, WaveGatePhase::Halted);
    assert_eq!(
        s.waves[1].state,
        WaveState::Pending,
        "no later wave admitted"
    );
    // Only wave 0's cluster is pinned, to the previous revision.
    let pins = w.pins().await;
    assert_eq!(pins.len(), 1, "{pins:#?}");
    let pin = &pins[0];
    assert_eq!(pin.spec.bundle.digest, rev('a'));
    assert_eq!(pin.spec.targets.len(), 1);
    assert_eq!(pin.spec.targets[0].name, "mesh-eu-1");
    assert_eq!(h.pins, vec![pin.metadata.name.clone().unwrap()]);
    // And its decision is set back, so Argo CD converges on what the pin applied. No revert
    // runs here, so the set-back came after waiting PIN_WAIT for the pin to be held, and says so.
    assert!(decided(&halted).iter().all(|(_, r)| *r == rev('a')));
    let note = &find(&s.conditions, conditions::HALTED).unwrap().message;
    assert!(note.contains("not in force after 2s"), "{note}");
    assert_eq!(
        w.events_published("eu", reasons::PINNED_BACK, BUDGET)
            .await
            .len(),
        1
    );

    // A restart never creates a second pin.
    op.stop().await;
    let op = w.operator();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(w.pins().await.len(), 1);

    // A new revision waits while the halted change is not superseded...
    w.patch_spec(
        "eu",
        serde_json::json!({"revision": rev('c'), "sourceCommit": commit(&rev('c'))}),
    )
    .await;
    let blocked = object_until(&w.wave_gates(), "eu", "blocked by the halt", BUDGET, |g| {
        g.status.as_ref().is_some_and(|s| {
            find(&s.conditions, conditions::PROGRESSING)
                .is_some_and(|c| c.reason == reasons::BLOCKED_BY_HALT)
        })
    })
    .await;
    assert_eq!(phase(&blocked), Some(WaveGatePhase::Halted));
    // ...and starts from wave 0 once the WaveGate says so.
    w.patch_spec("eu", serde_json::json!({"supersedeHalted": true}))
        .await;
    let superseded = object_until(&w.wave_gates(), "eu", "c admitted in wave 0", BUDGET, |g| {
        g.status.as_ref().is_some_and(|s| {
            s.current_revision.as_deref() == Some(rev('c').as_str())
                && s.halt.is_none()
                && s.waves[0].state != WaveState::Pending
        })
    })
    .await;
    let d = decided(&superseded);
    let s = superseded.status.unwrap();
    assert_eq!(s.previous_revision, Some(rev('a')));
    assert_eq!(d[0], ("eu-1".to_owned(), rev('c')));
    assert!(d[1..].iter().all(|(_, r)| *r == rev('a')));
    assert!(
        !w.events_published("eu", reasons::SUPERSEDED, BUDGET)
            .await
            .is_empty()
    );
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_nacks_in_the_canary_halt_the_change() {
    let Some((w, op)) = eu_changing_to_b(
        serde_json::json!({"waves": [
            {"name": "canary", "clusters": ["eu-1"], "soak": "30s"},
            {"name": "rest", "clusters": ["eu-2", "eu-3"]}
        ]}),
        |_| {},
    )
    .await
    else {
        return;
    };
    object_until(&w.wave_gates(), "eu", "wave 0 soaking", BUDGET, |g| {
        wave_state(g, 0) == Some(WaveState::Soaking)
    })
    .await;
    w.mesh("eu-1", |m| m.nacks_per_s = 2.0);
    let halted = object_until(&w.wave_gates(), "eu", "halted on NACKs", BUDGET, |g| {
        g.status.as_ref().and_then(|s| s.halt.as_ref()).is_some()
    })
    .await;
    let h = halted.status.unwrap().halt.unwrap();
    assert_eq!(h.reason, HaltReason::GateFailed);
    assert_eq!(h.gate.unwrap().gate, "xds-nack-increase");
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_that_never_acknowledge_time_out_and_halt() {
    // Given proxies in the canary cluster that never pick up new config.
    let Some((w, op)) = eu_changing_to_b(serde_json::json!({"convergenceTimeout": "5s"}), |w| {
        w.mesh("eu-1", |m| m.stuck_behind = 7.0)
    })
    .await
    else {
        return;
    };
    let halted = object_until(&w.wave_gates(), "eu", "convergence timeout", BUDGET, |g| {
        g.status.as_ref().and_then(|s| s.halt.as_ref()).is_some()
    })
    .await;
    let s = halted.status.unwrap();
    let h = s.halt.as_ref().unwrap();
    assert_eq!(h.reason, HaltReason::ConvergenceTimeout);
    let msg = h.message.as_deref().unwrap();
    assert!(
        msg.contains("eu-1=7"),
        "the proxies behind are named: {msg}"
    );
    assert_eq!(s.waves[0].proxies_behind, Some(7.0));
    assert_eq!(
        s.waves[0].applications.as_ref().map(|a| a.synced),
        Some(1),
        "Argo CD synced; only the drift held the wave"
    );
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_during_a_soak_continues_the_same_soak() {
    let Some((w, op)) = eu_changing_to_b(
        serde_json::json!({"waves": [
            {"name": "canary", "clusters": ["eu-1"], "soak": "6s"},
            {"name": "rest", "clusters": ["eu-2", "eu-3"], "soak": "1s"}
        ]}),
        |_| {},
    )
    .await
    else {
        return;
    };
    let soaking = object_until(&w.wave_gates(), "eu", "wave 0 soaking", BUDGET, |g| {
        wave_state(g, 0) == Some(WaveState::Soaking)
    })
    .await;
    let before = soaking.status.unwrap().waves[0].clone();
    // When the operator restarts in the middle of the soak.
    op.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let op = w.operator();
    let passed = object_until(&w.wave_gates(), "eu", "wave 0 passed", BUDGET, |g| {
        wave_state(g, 0) == Some(WaveState::Passed)
    })
    .await;
    let after = passed.status.unwrap().waves[0].clone();
    // Then the same soak continued: no clock reset, no re-admission.
    assert_eq!(after.admitted_at, before.admitted_at);
    assert_eq!(after.converged_at, before.converged_at);
    let soak_end = before.converged_at.as_ref().unwrap().0 + jiff::SignedDuration::from_secs(6);
    let finished = after.finished_at.as_ref().unwrap().0;
    assert!(finished >= soak_end, "passed before the soak ended");
    assert!(
        finished.duration_since(soak_end) < jiff::SignedDuration::from_secs(4),
        "the soak ran from the original convergence: ended {soak_end}, passed {finished}"
    );
    let admitted = w.events("eu", reasons::WAVE_ADMITTED).await;
    let canary_admissions = admitted
        .iter()
        .filter(|e| e.note.as_deref().is_some_and(|n| n.contains("wave canary")))
        .count();
    assert_eq!(canary_admissions, 1, "wave 0 admitted once");
    assert_eq!(
        w.events("eu", reasons::SOAKING)
            .await
            .iter()
            .filter(|e| e.note.as_deref().is_some_and(|n| n.contains("wave canary")))
            .count(),
        1
    );
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emergency_admits_every_wave_at_once_audited() {
    let Some((w, op)) = eu_changing_to_b(
        serde_json::json!({"emergency": {"revision": rev('b'), "reason": "CVE-2026-0001 fix"}}),
        |_| {},
    )
    .await
    else {
        return;
    };
    let done = object_until(&w.wave_gates(), "eu", "emergency complete", BUDGET, |g| {
        phase(g) == Some(WaveGatePhase::Complete)
    })
    .await;
    let s = done.status.unwrap();
    assert!(s.decisions.iter().all(|d| d.revision == rev('b')));
    assert!(s.waves.iter().all(|w| w.state == WaveState::Skipped));
    assert!(s.waves.iter().all(|w| w.converged_at.is_none()), "no soak");
    let last = s.history.last().unwrap();
    assert!(last.reason.as_deref().unwrap().contains("CVE-2026-0001"));
    let events = w.events_published("eu", reasons::EMERGENCY, BUDGET).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_site_is_released_explicitly() {
    // Given eu's rest waits for site us, which is cut off (reports nothing).
    let Some((w, op)) = eu_changing_to_b(
        serde_json::json!({"waves": [
            {"name": "canary", "clusters": ["eu-1"], "soak": "2s"},
            {"name": "rest", "clusters": ["eu-2", "eu-3"], "soak": "1s", "waitFor": [{"site": "us", "wave": "canary"}]}
        ]}),
        |_| {},
    )
    .await
    else {
        return;
    };
    let waiting = object_until(&w.wave_gates(), "eu", "waiting for us", BUDGET, |g| {
        phase(g) == Some(WaveGatePhase::WaitingForSite)
    })
    .await;
    assert!(
        waiting.status.unwrap().waves[1]
            .waiting_for
            .as_deref()
            .unwrap()
            .contains("site us past wave canary")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        phase(&w.wave_gates().get("eu").await.unwrap()),
        Some(WaveGatePhase::WaitingForSite),
        "no site passes a wait by silence"
    );
    // When the wait is released explicitly for this revision.
    w.patch_spec(
        "eu",
        serde_json::json!({"waitReleases": [{"site": "us", "revision": rev('b'), "reason": "us partitioned; approved by on-call"}]}),
    )
    .await;
    let done = object_until(
        &w.wave_gates(),
        "eu",
        "complete after the release",
        BUDGET,
        |g| phase(g) == Some(WaveGatePhase::Complete),
    )
    .await;
    let s = done.status.unwrap();
    assert!(
        s.history
            .last()
            .unwrap()
            .reason
            .as_deref()
            .unwrap()
            .contains("us partitioned")
    );
    let events = w
        .events_published("eu", reasons::WAIT_RELEASED, BUDGET)
        .await;
    assert_eq!(events.len(), 1, "audited once");
    op.stop().await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_set_without_create_update_is_refused() {
    let Some(w) = World::start(&["eu-1", "eu-2", "eu-3"]).await else {
        return;
    };
    let op = w.operator();
    w.application_set(
        "mesh-eu",
        serde_json::json!({"preserveResourcesOnDeletion": true}),
        &["eu-1", "eu-2", "eu-3"],
        &rev('a'),
    )
    .await;
    w.wave_gate(object("eu", spec("eu", one_site_waves(), &rev('b'))))
        .await;
    let refused = object_until(&w.wave_gates(), "eu", "refused", BUDGET, |g| {
        phase(g) == Some(WaveGatePhase::Refused)
    })
    .await;
    let s = refused.status.unwrap();
    let c = find(&s.conditions, conditions::APPLICATION_SET_SAFE).unwrap();
    assert_eq!(c.reason, reasons::APPLICATIONS_SYNC_UNSAFE);
    assert!(c.message.contains("create-update"), "{}", c.message);
    assert!(s.decisions.is_empty(), "nothing published");
    let events = w
        .events_published("eu", reasons::APPLICATIONS_SYNC_UNSAFE, BUDGET)
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        w.synced().await.values().all(|r| *r == rev('a')),
        "no Application moved"
    );
    op.stop().await;
    w.stop().await;
}

/// An ApplicationSet whose `ignoreApplicationDifferences` covers the sync policy of one named
/// Application only: revert would refuse the pins of every other cluster, so the WaveGate
/// refuses the whole site and says what to add.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_set_not_ignoring_sync_policy_is_refused() {
    let Some(w) = World::start(&["eu-1", "eu-2", "eu-3"]).await else {
        return;
    };
    let op = w.operator();
    w.application_set_with(
        "mesh-eu",
        safe_policy(),
        serde_json::json!([{"name": "mesh-eu-1", "jsonPointers": ["/spec/syncPolicy"]}]),
        &["eu-1", "eu-2", "eu-3"],
        &rev('a'),
    )
    .await;
    w.wave_gate(object("eu", spec("eu", one_site_waves(), &rev('b'))))
        .await;
    let refused = object_until(&w.wave_gates(), "eu", "refused", BUDGET, |g| {
        phase(g) == Some(WaveGatePhase::Refused)
    })
    .await;
    let s = refused.status.unwrap();
    let c = find(&s.conditions, conditions::APPLICATION_SET_SAFE).unwrap();
    assert_eq!(c.status, "False");
    assert_eq!(c.reason, reasons::SYNC_POLICY_NOT_IGNORED);
    assert!(
        c.message
            .contains(r#"add {jsonPointers: ["/spec/syncPolicy"]} (no name)"#),
        "the message says what to add: {}",
        c.message
    );
    assert!(s.decisions.is_empty(), "nothing published");
    let events = w
        .events_published("eu", reasons::SYNC_POLICY_NOT_IGNORED, BUDGET)
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        w.synced().await.values().all(|r| *r == rev('a')),
        "no Application moved"
    );
    op.stop().await;
    w.stop().await;
}
