//! End to end on the API emulator with the cluster simulator and a real Prometheus: a full
//! upgrade across three waves; a gate breach in the second wave retagging it back to a working
//! mixed fleet; a PodDisruptionBudget blocking evictions and later releasing them; background
//! issuance shrinking the pace; the operator restarted mid-wave. In every scenario the
//! simulator's own SVID counter (not the operator's numbers) is checked against the budget.

mod common;

use std::time::{Duration, Instant};

use common::{CLUSTER, Harness, condition, pods_of, three_tiers};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use sluice_api::v1alpha1::{
    RevisionUpgradePhase,
    revision_upgrade::{UpgradeWaveState, conditions, reasons},
};
use sluice_sim::mesh::scenario::Event;
use sluice_testkit::eventually::eventually;

/// The budget every scenario uses: 8/s sustained, depth 8, at most 10 in any second.
const RATE: f64 = 8.0;
const DEPTH: f64 = 8.0;
const PEAK: f64 = 10.0;

fn phase(o: &sluice_api::v1alpha1::RevisionUpgrade) -> Option<RevisionUpgradePhase> {
    o.status.as_ref().map(|s| s.phase)
}

fn assert_within_budget(h: &Harness) {
    let (ratio, at) = h.peak_issuance_ratio(RATE, DEPTH, PEAK);
    println!("peak_issuance_ratio {ratio:.3} ({at})");
    assert!(
        ratio <= 1.0,
        "observed issuance exceeded the budget: ratio {ratio:.3}, {at}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_upgrade_moves_three_waves_within_the_budget_and_retires_the_old_revision() {
    let fleet = three_tiers();
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    let pods = pods_of(&fleet);
    h.start_operator().await;
    h.sample_issuance();
    let issued_before = h.svid.get();
    let started = Instant::now();

    h.when_upgrade(json!({})).await;

    let done = h
        .until(Duration::from_secs(60), "phase Complete", |o| {
            phase(o) == Some(RevisionUpgradePhase::Complete)
        })
        .await;
    println!("full upgrade of {pods} pods took {:?}", started.elapsed());
    let status = done.status.as_ref().unwrap();
    assert!(
        status
            .waves
            .iter()
            .all(|w| w.state == UpgradeWaveState::Passed)
    );
    let (s, r, m) = condition(&done, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert_eq!(
        (s.as_str(), r.as_str()),
        ("True", reasons::NO_OLD_PROXIES),
        "{m}"
    );
    assert_eq!(
        h.revisions().await,
        (0, pods, pods),
        "every pod Ready on 1-28"
    );
    for ns in ["edge", "shop", "payments"] {
        assert_eq!(h.namespace_tag(ns).await.as_deref(), Some("canary"));
    }
    // The relabel is attributed to the operator's field manager (what Argo CD's
    // ignoreDifferences.managedFieldsManagers keys on).
    let edge = Api::<k8s_openapi::api::core::v1::Namespace>::all(h.client.clone())
        .get("edge")
        .await
        .unwrap();
    let managers: Vec<String> = edge
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "sluice-upgrade-revisions"),
        "managers of namespace edge: {managers:?}"
    );
    assert_eq!(
        h.svid.get() - issued_before,
        pods,
        "one certificate per pod: no pod was restarted twice"
    );
    assert_eq!(h.metrics.restarts(common::NAME, "evict", "started"), pods);
    // Own restarts are not background: the operator never saw more than a trickle of it.
    let bg = status.issuance_budget.as_ref().unwrap().background_rate;
    assert!(bg < 2.0, "background issuance misread as {bg}/s");
    assert_within_budget(&h);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_breach_in_the_second_wave_retags_it_back_leaving_a_working_mixed_fleet() {
    let fleet = three_tiers();
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    h.start_operator().await;
    h.sample_issuance();
    h.when_upgrade(json!({})).await;

    // When proxies start rejecting config while the second wave restarts.
    h.until(Duration::from_secs(40), "wave tier-2 restarting", |o| {
        o.status.as_ref().is_some_and(|s| {
            s.current_wave.as_deref() == Some("tier-2")
                && s.namespaces
                    .iter()
                    .any(|n| n.name == "shop" && n.pods_done > 0)
        })
    })
    .await;
    h.world.mesh().unwrap().apply_now(Event {
        cluster: Some(CLUSTER.into()),
        xds_rejects_per_second: Some(5.0),
        ..Event::default()
    });

    // Then the wave is retagged back and restarted onto the old revision; wave 1 stays.
    let aborted = h
        .until(Duration::from_secs(40), "phase Aborted", |o| {
            phase(o) == Some(RevisionUpgradePhase::Aborted)
        })
        .await;
    let status = aborted.status.as_ref().unwrap();
    assert_eq!(status.waves[0].state, UpgradeWaveState::Passed);
    assert_eq!(status.waves[1].state, UpgradeWaveState::RolledBack);
    assert_eq!(status.waves[2].state, UpgradeWaveState::Pending);
    let (_, reason, message) = condition(&aborted, conditions::PROGRESSING).unwrap();
    assert_eq!(reason, reasons::ROLLED_BACK, "{message}");
    assert_eq!(h.namespace_tag("edge").await.as_deref(), Some("canary"));
    assert_eq!(h.namespace_tag("shop").await.as_deref(), Some("stable"));
    assert_eq!(h.namespace_tag("payments").await.as_deref(), Some("stable"));
    assert_eq!(h.namespace_revisions("edge").await, (0, 2));
    assert_eq!(h.namespace_revisions("shop").await, (6, 0));
    assert_eq!(h.namespace_revisions("payments").await, (8, 0));
    let pods = pods_of(&fleet);
    let (_, _, ready) = h.revisions().await;
    assert_eq!(ready, pods, "a working mixed fleet: every pod Ready");
    let p = status.proxies.as_ref().unwrap();
    assert_eq!((p.old, p.new), (14, 2));
    assert_within_budget(&h);

    // Nothing moves until an explicit resume.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.namespace_tag("shop").await.as_deref(), Some("stable"));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_disruption_budget_blocks_evictions_until_released() {
    let fleet = vec![common::NsSpec {
        name: "edge",
        tier: Some("low"),
        deployments: vec![("gw", 3)],
    }];
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    // Given a PDB that allows no disruption.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), "edge");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "gw", "namespace": "edge"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "gw"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("PDB status computed", Duration::from_secs(10), || async {
        let s = pdbs.get("gw").await.unwrap().status?;
        (s.expected_pods == Some(3) && s.disruptions_allowed == Some(0)).then_some(())
    })
    .await;
    h.start_operator().await;
    h.sample_issuance();
    h.when_upgrade(json!({"waves": [{"name": "all", "namespaceSelector": {}, "soak": "1s"}]}))
        .await;

    // Then the refusal is reported and nothing is restarted.
    let blocked = h
        .until(Duration::from_secs(30), "DisruptionBudgetBlocked", |o| {
            condition(o, conditions::PROGRESSING)
                .is_some_and(|c| c.1 == reasons::DISRUPTION_BUDGET_BLOCKED)
        })
        .await;
    let (_, _, message) = condition(&blocked, conditions::PROGRESSING).unwrap();
    assert!(message.contains("edge/gw-"), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        h.namespace_revisions("edge").await,
        (3, 0),
        "no pod evicted"
    );
    assert!(h.metrics.restarts(common::NAME, "evict", "blocked") > 0);
    assert_eq!(h.metrics.restarts(common::NAME, "evict", "started"), 0);

    // When the budget is released, the evictions go through.
    pdbs.patch(
        "gw",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 2}})),
    )
    .await
    .unwrap();
    h.until(Duration::from_secs(40), "phase Complete", |o| {
        phase(o) == Some(RevisionUpgradePhase::Complete)
    })
    .await;
    assert_eq!(h.namespace_revisions("edge").await, (0, 3));
    assert_within_budget(&h);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_issuance_shrinks_the_pace_and_over_budget_holds_restarts() {
    let fleet = vec![common::NsSpec {
        name: "payments",
        tier: None,
        deployments: vec![("ledger", 12), ("api", 12)],
    }];
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    let pods = pods_of(&fleet);
    // Given certificates issued elsewhere above the whole budget.
    let storm = h.background_issuance(RATE * 1.25);
    tokio::time::sleep(common::ISSUANCE_WINDOW + Duration::from_secs(1)).await;
    h.start_operator().await;
    h.when_upgrade(json!({"waves": [{"name": "all", "namespaceSelector": {}, "soak": "1s"}]}))
        .await;

    // Then restarts are held while issuance is over budget.
    let held = h
        .until(Duration::from_secs(20), "BudgetThrottled OverBudget", |o| {
            condition(o, conditions::BUDGET_THROTTLED).is_some_and(|c| {
                c.0 == "True" && c.1 == reasons::OVER_BUDGET && c.2.contains("background")
            })
        })
        .await;
    assert_eq!(phase(&held), Some(RevisionUpgradePhase::Paused));
    assert_eq!(h.metrics.restarts(common::NAME, "evict", "started"), 0);
    storm.abort();

    // When the background drops to half the rate, restarts resume at what it leaves (the
    // budget is checked from here: the storm alone was over it).
    let background = h.background_issuance(RATE / 2.0);
    h.sample_issuance();
    let first = h
        .until(Duration::from_secs(30), "restarts resumed", |o| {
            o.status
                .as_ref()
                .is_some_and(|s| s.namespaces.iter().any(|n| n.pods_done > 0))
        })
        .await;
    let t0 = Instant::now();
    let own_before = h.metrics.restarts(common::NAME, "evict", "started");
    let status = h
        .until(Duration::from_secs(60), "phase Complete", |o| {
            phase(o) == Some(RevisionUpgradePhase::Complete)
        })
        .await;
    let took = t0.elapsed().as_secs_f64();
    let own = (h.metrics.restarts(common::NAME, "evict", "started") - own_before) as f64;
    let pace = own / took;
    println!(
        "restarted {own} pods in {took:.1}s: {pace:.2}/s with background {}/s",
        RATE / 2.0
    );
    let bg_seen = status
        .status
        .as_ref()
        .unwrap()
        .issuance_budget
        .as_ref()
        .unwrap()
        .background_rate;
    let _ = first;
    assert!(
        (RATE / 2.0 * 0.6..=RATE / 2.0 * 1.6).contains(&bg_seen),
        "background read as {bg_seen}/s"
    );
    assert!(
        pace <= RATE / 2.0 * 1.2,
        "pace {pace:.2}/s exceeds the headroom of {}/s the background leaves",
        RATE / 2.0
    );
    assert_eq!(h.namespace_revisions("payments").await, (0, pods));
    background.abort();
    assert_within_budget(&h);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_restarted_mid_wave_finishes_without_repeating_evictions() {
    let fleet = vec![common::NsSpec {
        name: "payments",
        tier: None,
        deployments: vec![("ledger", 10), ("api", 10)],
    }];
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    let pods = pods_of(&fleet);
    // The evictions are counted from the pods the API reports deleted, not from the operators'
    // counters: an eviction in flight when the first operator stops is carried out (the pod is
    // deleted before the reply) but never reported back to it.
    let deletions = h.watch_pod_deletions("payments").await;
    let initial = deletions.log().initial;
    assert_eq!(initial.len() as u64, pods);
    assert!(
        initial
            .iter()
            .all(|p| p.revision.as_deref() == Some("1-27")),
        "{initial:?}"
    );
    h.start_operator().await;
    h.sample_issuance();
    let issued_before = h.svid.get();
    h.when_upgrade(json!({"waves": [{"name": "all", "namespaceSelector": {}, "soak": "1s"}]}))
        .await;
    h.until(Duration::from_secs(30), "a third of the pods moved", |o| {
        o.status
            .as_ref()
            .is_some_and(|s| s.namespaces.iter().any(|n| n.pods_done >= 7))
    })
    .await;
    // When the operator stops mid-wave and a new one (no memory) takes over.
    h.stop_operator().await;
    let first = h.metrics.restarts(common::NAME, "evict", "started");
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.start_operator().await;

    // Then it finishes from the status alone, restarting only the pods still old.
    h.until(Duration::from_secs(60), "phase Complete", |o| {
        phase(o) == Some(RevisionUpgradePhase::Complete)
    })
    .await;
    let second = h.metrics.restarts(common::NAME, "evict", "started");
    let log = eventually(
        "the watch saw every pod of 1-27 deleted",
        Duration::from_secs(10),
        || async {
            let log = deletions.log();
            let gone: std::collections::BTreeSet<&str> =
                log.deleted.iter().map(|p| p.uid.as_str()).collect();
            let left = initial
                .iter()
                .filter(|p| !gone.contains(p.uid.as_str()))
                .count();
            if left == 0 {
                Ok(log)
            } else {
                Err(format!("{left} pods of 1-27 not yet deleted"))
            }
        },
    )
    .await;
    let twice: Vec<_> = log
        .deletions_by_uid()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(twice.is_empty(), "pods evicted more than once: {twice:?}");
    let again: Vec<&str> = log
        .deleted
        .iter()
        .filter(|d| !initial.iter().any(|p| p.uid == d.uid))
        .map(|d| d.name.as_str())
        .collect();
    assert!(
        again.is_empty(),
        "pods the upgrade had already restarted were evicted again: {again:?}"
    );
    assert_eq!(
        log.deleted.len() as u64,
        pods,
        "each pod evicted once across both operators"
    );
    // The operators' own counters never count an eviction that did not happen (one in flight
    // when the first operator stopped may be missing from them).
    println!("evictions counted by the operators: {first} + {second} of {pods}");
    assert!(
        first + second <= pods,
        "the operators counted {first} + {second} evictions of {pods} pods"
    );
    assert_eq!(
        h.svid.get() - issued_before,
        pods,
        "one certificate per pod"
    );
    assert_eq!(h.namespace_revisions("payments").await, (0, pods));
    assert_within_budget(&h);
    drop(deletions);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issuance_sums_every_istiod_replica_through_their_restarts() {
    let fleet = vec![common::NsSpec {
        name: "payments",
        tier: None,
        deployments: vec![("ledger", 4)],
    }];
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    // Given certificates issued elsewhere above the whole budget, spread over three istiod
    // replicas whose counters restart from 0 in turn (as replicas are rescheduled).
    let storm = h.background_issuance(RATE * 1.5);
    let svid = h.svid.clone();
    let restarts = tokio::spawn(async move {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            svid.restart_replica(sluice_sim::cluster::svid::DEFAULT_REVISION, i % 3);
        }
    });
    tokio::time::sleep(common::ISSUANCE_WINDOW + Duration::from_secs(1)).await;
    h.start_operator().await;
    h.when_upgrade(json!({"waves": [{"name": "all", "namespaceSelector": {}, "soak": "1s"}]}))
        .await;

    // Then the reading is the whole issuance, not one replica's, nor clamped by a reset.
    let held = h
        .until(Duration::from_secs(20), "BudgetThrottled OverBudget", |o| {
            o.status
                .as_ref()
                .and_then(|s| s.issuance_budget.as_ref())
                .is_some_and(|b| b.throttled)
        })
        .await;
    let b = held.status.unwrap().issuance_budget.unwrap();
    assert!(
        b.background_rate >= RATE,
        "background read as {}/s of {}/s issued",
        b.background_rate,
        RATE * 1.5
    );
    assert_eq!(h.metrics.restarts(common::NAME, "evict", "started"), 0);
    storm.abort();
    restarts.abort();
    h.shutdown().await;
}

/// A leader deposed mid-wave (its Lease lost) starts no eviction afterwards: the restarts it had
/// scheduled in the background are cancelled, not carried out over the next seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_starts_no_scheduled_eviction() {
    let fleet = vec![common::NsSpec {
        name: "payments",
        tier: None,
        // Ten workloads that each tolerate one unavailable pod: a grant schedules ten
        // evictions, spread by the peak rate over the next seconds.
        deployments: vec![
            ("a", 2),
            ("b", 2),
            ("c", 2),
            ("d", 2),
            ("e", 2),
            ("f", 2),
            ("g", 2),
            ("h", 2),
            ("i", 2),
            ("j", 2),
        ],
    }];
    let Some(mut h) = Harness::given(&fleet).await else {
        return;
    };
    let pods = pods_of(&fleet);
    let lease = h.start_operator_leading().await;
    h.when_upgrade(json!({
        "waves": [{"name": "all", "namespaceSelector": {}, "soak": "1s"}],
        "issuanceBudget": {"rate": 3, "depth": 8, "peakPerSecond": 3},
    }))
    .await;
    // The first eviction of a grant started: the rest of the grant is scheduled behind it.
    let first = Instant::now();
    while h.metrics.restarts(common::NAME, "evict", "started") == 0 {
        assert!(
            first.elapsed() < Duration::from_secs(30),
            "no eviction started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // When the replica loses its Lease mid-wave.
    lease.send_replace(false);
    let deposed = Instant::now();
    // An eviction already sent when the Lease went may still be answered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_loss = h.metrics.restarts(common::NAME, "evict", "started");

    // Then, for longer than the longest schedule (5 s), it starts no further eviction.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let later = h.metrics.restarts(common::NAME, "evict", "started");
    println!(
        "deposed after {at_loss} of {pods} evictions; {} started in the {:?} after",
        later - at_loss,
        deposed.elapsed()
    );
    assert_eq!(
        later,
        at_loss,
        "the deposed leader kept evicting: {} evictions after it lost the Lease",
        later - at_loss
    );
    assert!(at_loss < pods, "work was left for the next leader");
    h.shutdown().await;
}
