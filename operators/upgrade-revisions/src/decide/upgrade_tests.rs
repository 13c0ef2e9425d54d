//! The upgrade's transitions, driven against a small model of the cluster: relabels change
//! namespace labels, an eviction replaces the pod with one injected by the revision its
//! namespace's tag points to.

use super::*;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    RevisionUpgradePhase, RevisionUpgradeSpec, RevisionUpgradeStatus,
    revision_upgrade::{
        IssuanceBudgetStatus, NamespaceProgress, NamespaceState, ProxyCounts, UpgradeWaveState,
        conditions, reasons,
    },
};
use sluice_runtime::conditions as cond;

use crate::{
    fleet::{NamespaceView, PodView, Workload, WorkloadView},
    pacing::IssuanceReading,
};
use std::collections::BTreeSet;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
}

fn spec() -> RevisionUpgradeSpec {
    serde_json::from_value(serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28",
            "waves": [
                {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "3s"},
                {"name": "tier-2", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-2"}}, "soak": "3s"},
                {"name": "tier-1", "namespaceSelector": {}, "soak": "3s"},
            ],
            "issuanceBudget": {"rate": 10, "depth": 20, "peakPerSecond": 20},
        }))
        .unwrap()
}

/// A small cluster: namespaces with labels, pods, and the injector.
#[derive(Clone)]
struct Model {
    namespaces: Vec<NamespaceView>,
    pods: Vec<PodView>,
    evicted: Vec<String>,
    serial: u32,
}

fn ns(name: &str, tier: Option<&str>, rev: &str) -> NamespaceView {
    let mut labels = BTreeMap::from([("istio.io/rev".to_owned(), rev.to_owned())]);
    if let Some(t) = tier {
        labels.insert("sluice.dev/risk-tier".into(), t.into());
    }
    NamespaceView {
        name: name.into(),
        labels,
        argo_cd_managed: false,
    }
}

fn pod(namespace: &str, name: &str, revision: &str, bare: bool) -> PodView {
    PodView {
        namespace: namespace.into(),
        name: name.into(),
        revision: revision.into(),
        workload: (!bare).then(|| Workload {
            kind: "Deployment".into(),
            name: "app".into(),
        }),
        terminating: false,
        ready: true,
        ready_since_ms: Some(0),
        created_ms: Some(0),
        rev_label: None,
    }
}

/// The model's workloads: one Deployment `app` per namespace, covered by a
/// PodDisruptionBudget (the Eviction API keeps its floor; the model grants every eviction).
fn covered_apps(namespaces: &[NamespaceView]) -> BTreeMap<(String, Workload), WorkloadView> {
    namespaces
        .iter()
        .map(|n| {
            (
                (
                    n.name.clone(),
                    Workload {
                        kind: "Deployment".into(),
                        name: "app".into(),
                    },
                ),
                WorkloadView {
                    replicas: 30,
                    pdb: true,
                    ..WorkloadView::default()
                },
            )
        })
        .collect()
}

impl Model {
    /// Namespaces `a` (low, 2 pods), `b` (tier-2, 12 pods), `c` (no tier, 30 pods).
    fn new() -> Self {
        let mut pods = Vec::new();
        for (n, count) in [("a", 2), ("b", 12), ("c", 30)] {
            for i in 0..count {
                pods.push(pod(n, &format!("{n}-{i}"), "1-27", false));
            }
        }
        Self {
            namespaces: vec![
                ns("a", Some("low"), "stable"),
                ns("b", Some("tier-2"), "stable"),
                ns("c", None, "stable"),
                ns("kube-system", None, ""),
            ],
            pods,
            evicted: Vec::new(),
            serial: 0,
        }
    }

    fn fleet(&self) -> Fleet {
        Fleet {
            namespaces: self.namespaces.clone(),
            pods: self.pods.iter().cloned().map(Arc::new).collect(),
            tags: BTreeMap::from([
                ("stable".to_owned(), "1-27".to_owned()),
                ("canary".to_owned(), "1-28".to_owned()),
            ]),
            restarted_at: BTreeMap::new(),
            workloads: covered_apps(&self.namespaces),
        }
    }

    fn label(&mut self, namespace: &str, value: &str) {
        let n = self
            .namespaces
            .iter_mut()
            .find(|n| n.name == namespace)
            .unwrap();
        n.labels.insert("istio.io/rev".into(), value.into());
    }

    fn apply(&mut self, actions: &[Action]) {
        for a in actions {
            match a {
                Action::Relabel {
                    namespace,
                    from,
                    to,
                } => {
                    let n = self
                        .namespaces
                        .iter_mut()
                        .find(|n| &n.name == namespace)
                        .unwrap();
                    if n.rev() == Some(from.as_str()) {
                        n.labels.insert("istio.io/rev".into(), to.clone());
                    }
                }
                Action::Evict {
                    namespace,
                    pod: name,
                    ..
                } => {
                    let key = format!("{namespace}/{name}");
                    assert!(!self.evicted.contains(&key), "{key} evicted twice");
                    self.evicted.push(key);
                    let tag = self
                        .namespaces
                        .iter()
                        .find(|n| &n.name == namespace)
                        .and_then(|n| n.rev().map(str::to_owned))
                        .unwrap();
                    let rev = if tag == "canary" { "1-28" } else { "1-27" };
                    self.pods
                        .retain(|p| !(&p.namespace == namespace && &p.name == name));
                    self.serial += 1;
                    self.pods.push(pod(
                        namespace,
                        &format!("{namespace}-n{}", self.serial),
                        rev,
                        false,
                    ));
                }
                _ => {}
            }
        }
    }
}

fn gates(wave: Option<&str>, action: GateAction) -> Option<GateReport> {
    Some(GateReport {
        wave: wave.unwrap_or_default().to_owned(),
        verdicts: Vec::new(),
        action: Some(action),
        ..GateReport::default()
    })
}

fn observe(
    model: &Model,
    status: Option<&RevisionUpgradeStatus>,
    action: GateAction,
) -> Observations {
    Observations {
        generation: Some(1),
        fleet: Some(model.fleet()),
        issuance: Some(IssuanceReading {
            window_seconds: 10.0,
            issued: 0.0,
            own: 0.0,
        }),
        gates: gates(status.and_then(|s| s.current_wave.as_deref()), action),
        ..Observations::default()
    }
}

fn evictions(d: &Decision) -> usize {
    d.actions
        .iter()
        .filter(|a| matches!(a, Action::Evict { .. }))
        .count()
}

/// How long after the tick the next grant may start (zero when nothing was granted).
fn busy_for(d: &Decision) -> Duration {
    d.actions
        .iter()
        .rev()
        .find_map(|a| match a {
            Action::ScheduleBusy(b) => Some(*b),
            _ => None,
        })
        .unwrap_or_default()
}

/// Runs ticks one second apart until `stop` holds or 200 ticks passed; `lose` names ticks
/// whose actions are lost (the operator died after writing status) and `again` ticks that
/// are decided twice (a restarted operator deciding from the status just written).
fn run(
    model: &mut Model,
    mut status: Option<RevisionUpgradeStatus>,
    start: i64,
    lose: &BTreeSet<i64>,
    again: &BTreeSet<i64>,
    gate: impl Fn(&RevisionUpgradeStatus, i64) -> GateAction,
    stop: impl Fn(&RevisionUpgradeStatus) -> bool,
) -> (RevisionUpgradeStatus, i64) {
    let s = spec();
    for tick in start..start + 200 {
        let now = tick * 1000;
        let action = status
            .as_ref()
            .map_or(GateAction::Proceed, |st| gate(st, tick));
        let d = decide(
            &s,
            status.as_ref(),
            &observe(model, status.as_ref(), action),
            t(now),
        );
        if !lose.contains(&tick) {
            model.apply(&d.actions);
        }
        let granted = evictions(&d) > 0;
        status = Some(d.status);
        if again.contains(&tick) {
            let d2 = decide(
                &s,
                status.as_ref(),
                &observe(model, status.as_ref(), action),
                t(now + 300),
            );
            if granted {
                assert_eq!(
                    evictions(&d2),
                    0,
                    "tick {tick}: a second decision within a tick of a grant restarts nothing"
                );
            }
            model.apply(&d2.actions);
            status = Some(d2.status);
        }
        if stop(status.as_ref().unwrap()) {
            return (status.unwrap(), tick);
        }
    }
    panic!("no stop after 200 ticks: {status:#?}");
}

fn complete(s: &RevisionUpgradeStatus) -> bool {
    s.phase == RevisionUpgradePhase::Complete
}

#[test]
fn first_tick_starts_the_first_wave_and_relabels_its_namespaces() {
    let model = Model::new();
    let d = decide(
        &spec(),
        None,
        &observe(&model, None, GateAction::Proceed),
        t(0),
    );
    assert_eq!(d.status.phase, RevisionUpgradePhase::Progressing);
    assert_eq!(d.status.current_wave.as_deref(), Some("low-risk"));
    assert_eq!(
        d.actions
            .iter()
            .filter(|a| matches!(a, Action::Relabel { .. }))
            .collect::<Vec<_>>(),
        vec![&Action::Relabel {
            namespace: "a".into(),
            from: "stable".into(),
            to: "canary".into()
        }]
    );
    assert_eq!(evictions(&d), 0, "no restart before the new label is seen");
    assert!(d.event_reasons().contains(&event_reasons::WAVE_STARTED));
    assert_eq!(d.status.namespaces.len(), 1);
    assert_eq!(d.status.namespaces[0].state, NamespaceState::Restarting);
    assert_eq!(
        d.requeue,
        Requeue::After(RELABEL_RECHECK),
        "the new labels are looked for sooner than a tick"
    );
    let p = d.status.proxies.unwrap();
    assert_eq!((p.old, p.new), (44, 0));
}

#[test]
fn full_upgrade_moves_every_wave_within_the_budget_and_retires_the_old_revision() {
    let mut model = Model::new();
    let mut per_tick: Vec<(i64, usize)> = Vec::new();
    // When each eviction starts, ms: the tick plus its place in the budget's schedule.
    let mut starts: Vec<i64> = Vec::new();
    let s = spec();
    let mut status: Option<RevisionUpgradeStatus> = None;
    let mut tick = 0;
    while !status.as_ref().is_some_and(complete) {
        assert!(tick < 200, "not complete: {status:#?}");
        let d = decide(
            &s,
            status.as_ref(),
            &observe(&model, status.as_ref(), GateAction::Proceed),
            t(tick * 1000),
        );
        per_tick.push((tick, evictions(&d)));
        for a in &d.actions {
            if let Action::Evict { after, .. } = a {
                starts.push(tick * 1000 + after.as_millis() as i64);
            }
        }
        model.apply(&d.actions);
        status = Some(d.status);
        tick += 1;
    }
    let st = status.unwrap();
    assert_eq!(
        model.evicted.len(),
        44,
        "every old pod evicted exactly once"
    );
    assert!(st.completed_at.is_some());
    let c = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", reasons::NO_OLD_PROXIES)
    );
    assert!(st.waves.iter().all(|w| w.state == UpgradeWaveState::Passed));
    assert_eq!(st.proxies.as_ref().map(|p| (p.old, p.new)), Some((0, 44)));
    // Budget: depth 20 (planned at 19), rate 10 (planned at 9.5), peak 20 (spaced at
    // 18/s), checked on every window between two scheduled starts.
    starts.sort();
    for (i, &start) in starts.iter().enumerate() {
        for (k, &end) in starts[i..].iter().enumerate() {
            let (sum, w) = ((k + 1) as f64, (end - start) as f64 / 1000.0);
            assert!(sum <= 20.0 + 10.0 * w, "{sum} restarts in {w}s");
            if w < 1.0 {
                assert!(sum <= 20.0, "{sum} restarts in {w}s over the peak");
            }
        }
    }
    assert_eq!(
        per_tick[1].1, 2,
        "wave 1 restarts its 2 pods once relabelled"
    );
    assert!(
        per_tick.iter().any(|&(_, n)| n == 12),
        "wave 2 (12 pods) fits the bucket"
    );
    assert!(
        per_tick.iter().all(|&(_, n)| n <= 19 + 19),
        "never more than the bucket and its refill over the 2 s horizon"
    );
    let completes = decide(
        &s,
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t(tick * 1000 + 5000),
    )
    .event_reasons();
    assert!(
        !completes.contains(&reasons::NO_OLD_PROXIES),
        "completion is announced once"
    );
}

#[test]
fn restart_at_any_tick_never_repeats_an_eviction_and_still_completes() {
    let (_, ticks) = run(
        &mut Model::new(),
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        |_, _| GateAction::Proceed,
        complete,
    );
    for point in 0..=ticks {
        let mut model = Model::new();
        let lose = BTreeSet::from([point]);
        let again = BTreeSet::from([point + 1]);
        let (st, _) = run(
            &mut model,
            None,
            0,
            &lose,
            &again,
            |_, _| GateAction::Proceed,
            complete,
        );
        assert_eq!(
            st.proxies.as_ref().unwrap().old,
            0,
            "restart at tick {point}"
        );
        assert_eq!(
            model.evicted.len(),
            44,
            "restart at tick {point}: each old pod evicted once"
        );
    }
}

#[test]
fn a_gate_failure_in_the_second_wave_retags_it_back_and_keeps_the_first() {
    let mut model = Model::new();
    let fail_in_tier2 = |st: &RevisionUpgradeStatus, _| {
        let restarted = st
            .namespaces
            .iter()
            .any(|n| n.name == "b" && n.pods_done >= 6);
        if st.current_wave.as_deref() == Some("tier-2") && restarted {
            GateAction::Abort
        } else {
            GateAction::Proceed
        }
    };
    let (st, _) = run(
        &mut model,
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        fail_in_tier2,
        |s| s.phase == RevisionUpgradePhase::Aborted,
    );
    let state = |n: &str| st.namespaces.iter().find(|x| x.name == n).map(|x| x.state);
    assert_eq!(
        state("a"),
        Some(NamespaceState::Moved),
        "the passed wave stays moved"
    );
    assert_eq!(state("b"), Some(NamespaceState::RolledBack));
    assert_eq!(state("c"), None, "the third wave never started");
    assert_eq!(model.namespaces[1].rev(), Some("stable"), "b retagged back");
    assert_eq!(st.waves[0].state, UpgradeWaveState::Passed);
    assert_eq!(st.waves[1].state, UpgradeWaveState::RolledBack);
    let p = st.proxies.clone().unwrap();
    assert_eq!(
        (p.old, p.new),
        (42, 2),
        "a mixed fleet: wave 1 on the new revision"
    );
    let c = cond::find(&st.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(c.reason, reasons::ROLLED_BACK);
    assert!(c.message.contains("mixed fleet"), "{}", c.message);
    assert!(
        model
            .pods
            .iter()
            .filter(|p| p.namespace == "b")
            .all(|p| p.revision == "1-27")
    );

    // Resume is explicit: nothing moves while aborted; spec.resume restarts the failed wave.
    let s = spec();
    let d = decide(
        &s,
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t(400_000),
    );
    assert_eq!(
        d.actions
            .iter()
            .filter(|a| !matches!(a, Action::Event(_)))
            .count(),
        0
    );
    assert_eq!(d.status.phase, RevisionUpgradePhase::Aborted);
    let mut resumed = s.clone();
    resumed.resume = 1;
    let d = decide(
        &resumed,
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t(401_000),
    );
    assert_eq!(d.status.resumes_handled, 1);
    assert!(d.event_reasons().contains(&event_reasons::RESUMED));
    assert_eq!(d.status.current_wave.as_deref(), Some("tier-2"));
    assert!(d.actions.contains(&Action::Relabel {
        namespace: "b".into(),
        from: "stable".into(),
        to: "canary".into()
    }));
    let again = decide(
        &resumed,
        Some(&d.status),
        &observe(&model, Some(&d.status), GateAction::Proceed),
        t(402_000),
    );
    assert!(
        !again.event_reasons().contains(&event_reasons::RESUMED),
        "a resume is acted on once"
    );
}

#[test]
fn a_resume_during_the_rollback_waits_for_it_to_finish() {
    let mut model = Model::new();
    let (st, tick) = run(
        &mut model,
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        |_, _| GateAction::Proceed,
        |s| {
            s.namespaces
                .iter()
                .any(|n| n.name == "b" && n.pods_done >= 6)
        },
    );
    let mut s = spec();
    s.abort = true;
    let d = decide(
        &s,
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t((tick + 1) * 1000),
    );
    model.apply(&d.actions);
    assert_eq!(d.status.phase, RevisionUpgradePhase::RollingBack);
    s.abort = false;
    s.resume = 1;
    let d = decide(
        &s,
        Some(&d.status),
        &observe(&model, Some(&d.status), GateAction::Proceed),
        t((tick + 2) * 1000),
    );
    assert_eq!(
        d.status.resumes_handled, 0,
        "not acknowledged while rolling back"
    );
    model.apply(&d.actions);
    let mut status = d.status;
    let mut now = tick + 3;
    while status.resumes_handled == 0 {
        assert!(now < tick + 100, "resume never acted on: {status:#?}");
        let d = decide(
            &s,
            Some(&status),
            &observe(&model, Some(&status), GateAction::Proceed),
            t(now * 1000),
        );
        model.apply(&d.actions);
        status = d.status;
        now += 1;
    }
    assert_eq!(status.current_wave.as_deref(), Some("tier-2"));
    assert!(
        status
            .namespaces
            .iter()
            .any(|n| n.name == "b" && n.state == NamespaceState::Restarting),
        "the failed wave takes its namespace again: {:?}",
        status.namespaces
    );
}

#[test]
fn a_namespace_is_not_moved_before_its_evicted_pods_are_replaced() {
    let mut model = Model::new();
    let s = spec();
    let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
    model.apply(&first.actions);
    let second = decide(
        &s,
        Some(&first.status),
        &observe(&model, Some(&first.status), GateAction::Proceed),
        t(1000),
    );
    assert_eq!(evictions(&second), 2);
    // The evictions happened but the controller has not created the replacements yet.
    model.pods.retain(|p| p.namespace != "a");
    let third = decide(
        &s,
        Some(&second.status),
        &observe(&model, Some(&second.status), GateAction::Proceed),
        t(2000),
    );
    let a = third
        .status
        .namespaces
        .iter()
        .find(|n| n.name == "a")
        .unwrap();
    assert_eq!(
        (a.state, a.pods, a.pods_done),
        (NamespaceState::Restarting, 2, 0)
    );
    model.pods.push(pod("a", "a-x", "1-28", false));
    model.pods.push(pod("a", "a-y", "1-28", false));
    let fourth = decide(
        &s,
        Some(&third.status),
        &observe(&model, Some(&third.status), GateAction::Proceed),
        t(3000),
    );
    let a = fourth
        .status
        .namespaces
        .iter()
        .find(|n| n.name == "a")
        .unwrap();
    assert_eq!(a.state, NamespaceState::Moved);
}

#[test]
fn replacements_not_ready_hold_the_soak_not_the_move() {
    let mut model = Model::new();
    let s = spec();
    let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
    model.apply(&first.actions);
    let second = decide(
        &s,
        Some(&first.status),
        &observe(&model, Some(&first.status), GateAction::Proceed),
        t(1000),
    );
    model.apply(&second.actions);
    for p in model.pods.iter_mut().filter(|p| p.namespace == "a") {
        p.ready = false;
    }
    let mut status = second.status;
    for at in [2000, 6000] {
        let d = decide(
            &s,
            Some(&status),
            &observe(&model, Some(&status), GateAction::Proceed),
            t(at),
        );
        status = d.status;
    }
    let a = status.namespaces.iter().find(|n| n.name == "a").unwrap();
    assert_eq!(a.state, NamespaceState::Moved, "moved once replaced");
    assert_eq!(status.waves[0].state, UpgradeWaveState::Soaking);
    let c = cond::find(&status.conditions, conditions::PROGRESSING).unwrap();
    assert!(
        c.message.contains("2 pod(s) on 1-28 to become Ready"),
        "{}",
        c.message
    );
    for p in model.pods.iter_mut() {
        p.ready = true;
    }
    let d = decide(
        &s,
        Some(&status),
        &observe(&model, Some(&status), GateAction::Proceed),
        t(7000),
    );
    assert_eq!(d.status.waves[0].state, UpgradeWaveState::Passed);
}

#[test]
fn manual_abort_rolls_back_the_current_wave() {
    let mut model = Model::new();
    let (st, tick) = run(
        &mut model,
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        |_, _| GateAction::Proceed,
        |s| {
            s.namespaces
                .iter()
                .any(|n| n.name == "b" && n.relabelled_at.is_some())
        },
    );
    let mut s = spec();
    s.abort = true;
    let d = decide(
        &s,
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t((tick + 1) * 1000),
    );
    assert_eq!(d.status.phase, RevisionUpgradePhase::RollingBack);
    assert!(d.event_reasons().contains(&reasons::ABORTED_MANUALLY));
    assert!(d.actions.contains(&Action::Relabel {
        namespace: "b".into(),
        from: "canary".into(),
        to: "stable".into()
    }));
    assert!(d.status.aborted_at.is_some());
}

#[test]
fn relabel_back_by_someone_else_is_reported_and_not_fought() {
    let mut model = Model::new();
    let (st, tick) = run(
        &mut model,
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        |_, _| GateAction::Proceed,
        |s| s.current_wave.as_deref() == Some("tier-2"),
    );
    model.label("a", "stable");
    let s = spec();
    let d = decide(
        &s,
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t((tick + 1) * 1000),
    );
    assert_eq!(d.status.relabelled_back.len(), 1);
    assert_eq!(d.status.relabelled_back[0].namespace, "a");
    assert_eq!(d.status.relabelled_back[0].found, "stable");
    assert!(cond::is_true(
        &d.status.conditions,
        conditions::RELABELLED_BACK
    ));
    assert!(
        d.event_reasons()
            .contains(&reasons::NAMESPACE_RELABELLED_BACK)
    );
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Relabel { namespace, .. } if namespace == "a")),
        "never fights the other writer"
    );
    let d2 = decide(
        &s,
        Some(&d.status),
        &observe(&model, Some(&d.status), GateAction::Proceed),
        t((tick + 2) * 1000),
    );
    assert!(
        !d2.event_reasons()
            .contains(&reasons::NAMESPACE_RELABELLED_BACK),
        "reported once"
    );
    assert_eq!(
        d2.status.relabelled_back, d.status.relabelled_back,
        "detection time kept"
    );
    model.label("a", "canary");
    let d3 = decide(
        &s,
        Some(&d2.status),
        &observe(&model, Some(&d2.status), GateAction::Proceed),
        t((tick + 3) * 1000),
    );
    assert!(d3.status.relabelled_back.is_empty());
    assert!(!cond::is_true(
        &d3.status.conditions,
        conditions::RELABELLED_BACK
    ));
}

#[test]
fn legacy_injection_and_bare_pods_are_reported_and_bare_pods_never_evicted() {
    let mut model = Model::new();
    model.namespaces.push(NamespaceView {
        name: "legacy".into(),
        labels: BTreeMap::from([("istio-injection".to_owned(), "enabled".to_owned())]),
        argo_cd_managed: false,
    });
    model.pods.push(pod("a", "debug", "1-27", true));
    let (st, _) = run(
        &mut model,
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        |_, _| GateAction::Proceed,
        |s| s.waves.iter().all(|w| w.state == UpgradeWaveState::Passed),
    );
    assert!(!model.evicted.contains(&"a/debug".to_owned()));
    assert_eq!(st.injection_enabled_namespaces, vec!["legacy"]);
    assert!(cond::is_true(
        &st.conditions,
        conditions::INJECTION_LABEL_FOUND
    ));
    assert_eq!(
        st.namespaces
            .iter()
            .find(|n| n.name == "a")
            .unwrap()
            .bare_pods,
        1
    );
    assert_ne!(
        st.phase,
        RevisionUpgradePhase::Complete,
        "a bare pod still runs the old revision"
    );
    let c = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert_eq!(c.status, "False");
    assert!(c.message.contains("bare pod"), "{}", c.message);
}

#[test]
fn holds_nothing_moves_without_tags_reading_or_while_paused() {
    let model = Model::new();
    let s = spec();
    // Tag mismatch.
    let mut o = observe(&model, None, GateAction::Proceed);
    o.fleet
        .as_mut()
        .unwrap()
        .tags
        .insert("canary".into(), "1-26".into());
    let d = decide(&s, None, &o, t(0));
    assert!(d.actions.iter().all(|a| matches!(a, Action::Event(_))));
    assert!(d.event_reasons().contains(&reasons::TAG_MISMATCH));
    assert_eq!(d.status.phase, RevisionUpgradePhase::Pending);
    // Paused.
    let mut paused = s.clone();
    paused.paused = true;
    let d = decide(
        &paused,
        None,
        &observe(&model, None, GateAction::Proceed),
        t(0),
    );
    assert!(d.actions.iter().all(|a| matches!(a, Action::Event(_))));
    assert_eq!(d.status.phase, RevisionUpgradePhase::Paused);
    // No issuance reading: relabels happen, restarts do not.
    let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
    let mut m2 = model.clone();
    m2.apply(&first.actions);
    let mut o = observe(&m2, Some(&first.status), GateAction::Proceed);
    o.issuance = None;
    o.issuance_problem = Some("no series".into());
    let d = decide(&s, Some(&first.status), &o, t(1000));
    assert_eq!(evictions(&d), 0);
    let c = cond::find(&d.status.conditions, conditions::BUDGET_THROTTLED).unwrap();
    assert!(c.message.contains("no series"), "{}", c.message);
    // Over budget: background at the full rate holds restarts and says so.
    let mut o = observe(&m2, Some(&first.status), GateAction::Proceed);
    o.issuance = Some(IssuanceReading {
        window_seconds: 10.0,
        issued: 150.0,
        own: 0.0,
    });
    let d = decide(&s, Some(&first.status), &o, t(1000));
    assert_eq!(evictions(&d), 0);
    assert!(cond::is_true(
        &d.status.conditions,
        conditions::BUDGET_THROTTLED
    ));
    assert_eq!(d.status.phase, RevisionUpgradePhase::Paused);
    assert!(d.status.issuance_budget.as_ref().unwrap().throttled);
}

#[test]
fn a_refused_eviction_is_retried_last_and_reported() {
    let mut model = Model::new();
    let s = spec();
    let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
    model.apply(&first.actions);
    let mut o = observe(&model, Some(&first.status), GateAction::Proceed);
    o.blocked = vec!["a/a-0".into()];
    o.unused_grants = 1;
    let d = decide(&s, Some(&first.status), &o, t(1000));
    let order: Vec<&str> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { pod, .. } => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec!["a-1", "a-0"], "the refused pod goes last");
    let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(c.reason, reasons::DISRUPTION_BUDGET_BLOCKED);
    assert!(c.message.contains("a/a-0"), "{}", c.message);
}

#[test]
fn restarts_scheduled_or_sent_are_never_candidates_again() {
    let mut model = Model::new();
    let s = spec();
    let first = decide(&s, None, &observe(&model, None, GateAction::Proceed), t(0));
    model.apply(&first.actions);
    let o = observe(&model, Some(&first.status), GateAction::Proceed);
    let d = decide(&s, Some(&first.status), &o, t(1000));
    let scheduled: Vec<(&str, Duration)> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { pod, after, .. } => Some((pod.as_str(), *after)),
            _ => None,
        })
        .collect();
    // Peak 20 planned at 19/s, less one: consecutive starts 1/18 s apart.
    let spacing = Duration::from_secs_f64(1.0 / 18.0);
    assert_eq!(scheduled, vec![("a-0", Duration::ZERO), ("a-1", spacing)]);
    assert!(
        (busy_for(&d).as_secs_f64() - 2.0 / 18.0).abs() < 1e-6,
        "the next grant starts one spacing after the last slot: {:?}",
        busy_for(&d)
    );

    let mut o = observe(&model, Some(&first.status), GateAction::Proceed);
    o.in_progress = BTreeSet::from(["a/a-0".to_owned()]);
    let d = decide(&s, Some(&first.status), &o, t(1000));
    let pods: Vec<&str> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { pod, .. } => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(pods, vec!["a-1"], "a-0's eviction is already on its way");
}

#[test]
fn not_due_within_a_tick_of_the_last_unless_the_generation_changed() {
    let st = RevisionUpgradeStatus {
        observed_generation: Some(1),
        proxies: Some(ProxyCounts {
            observed_at: Some(Time(t(0))),
            ..ProxyCounts::default()
        }),
        issuance_budget: Some(IssuanceBudgetStatus::default()),
        ..RevisionUpgradeStatus::default()
    };
    assert_eq!(
        not_due_for(Some(&st), Some(1), t(400)),
        Some(Duration::from_millis(600))
    );
    assert_eq!(not_due_for(Some(&st), Some(1), t(1000)), None);
    assert_eq!(not_due_for(Some(&st), Some(2), t(400)), None);
    assert_eq!(not_due_for(None, Some(1), t(400)), None);
    // While a relabel is awaited, the next look comes a quarter of a tick after the last.
    let mut awaiting = st.clone();
    awaiting.namespaces.push(NamespaceProgress {
        name: "a".into(),
        wave: "low-risk".into(),
        state: NamespaceState::Restarting,
        ..NamespaceProgress::default()
    });
    assert_eq!(
        not_due_for(Some(&awaiting), Some(1), t(100)),
        Some(Duration::from_millis(150))
    );
    assert_eq!(not_due_for(Some(&awaiting), Some(1), t(250)), None);
    awaiting.namespaces[0].relabelled_at = Some(Time(t(0)));
    assert_eq!(
        not_due_for(Some(&awaiting), Some(1), t(250)),
        Some(Duration::from_millis(750)),
        "the label was seen: back to one tick"
    );
}

/// A namespace `a` (first wave) with workloads without a PodDisruptionBudget, whose
/// replacements become Ready two ticks after they are created, as a kubelet would.
struct FloorModel {
    namespaces: Vec<NamespaceView>,
    pods: Vec<PodView>,
    workloads: BTreeMap<(String, Workload), WorkloadView>,
    restarted_at: BTreeMap<(String, Workload), String>,
    /// Pods created after the relabel on the old revision (a re-injection).
    reinject: Option<&'static str>,
    evicted: Vec<String>,
    rollout_restarts: Vec<String>,
    serial: u32,
}

fn workload(kind: &str, name: &str) -> Workload {
    Workload {
        kind: kind.into(),
        name: name.into(),
    }
}

impl FloorModel {
    /// `web` (4 replicas, no maxUnavailable of its own), `solo` (1 replica), `batch` (a
    /// Job pod), `pinned` (2 replicas whose pods carry `istio.io/rev: stable`).
    fn new() -> Self {
        let mut pods = Vec::new();
        let mut add = |w: &str, kind: &str, n: usize, label: Option<&str>| {
            for i in 0..n {
                let mut p = pod("a", &format!("{w}-{i}"), "1-27", false);
                p.workload = Some(workload(kind, w));
                p.rev_label = label.map(str::to_owned);
                pods.push(p);
            }
        };
        add("web", "Deployment", 4, None);
        add("solo", "Deployment", 1, None);
        add("batch", "Job", 1, None);
        add("pinned", "Deployment", 2, Some("stable"));
        let view = |replicas| WorkloadView {
            replicas,
            ..WorkloadView::default()
        };
        Self {
            namespaces: vec![ns("a", Some("low"), "stable")],
            pods,
            workloads: BTreeMap::from([
                (("a".into(), workload("Deployment", "web")), view(4)),
                (("a".into(), workload("Deployment", "solo")), view(1)),
                (("a".into(), workload("Deployment", "pinned")), view(2)),
            ]),
            restarted_at: BTreeMap::new(),
            reinject: None,
            evicted: Vec::new(),
            rollout_restarts: Vec::new(),
            serial: 0,
        }
    }

    fn fleet(&self) -> Fleet {
        Fleet {
            namespaces: self.namespaces.clone(),
            pods: self.pods.iter().cloned().map(Arc::new).collect(),
            tags: BTreeMap::from([
                ("stable".to_owned(), "1-27".to_owned()),
                ("canary".to_owned(), "1-28".to_owned()),
            ]),
            restarted_at: self.restarted_at.clone(),
            workloads: self.workloads.clone(),
        }
    }

    fn replacement(&mut self, w: &Workload, now: i64) -> PodView {
        self.serial += 1;
        let label = self.namespaces[0].rev().unwrap_or("").to_owned();
        let mut rev = if label == "canary" { "1-28" } else { "1-27" };
        if self.reinject == Some(w.name.as_str()) {
            rev = "1-27";
        }
        let mut p = pod("a", &format!("{}-n{}", w.name, self.serial), rev, false);
        p.workload = Some(w.clone());
        p.ready = false;
        p.ready_since_ms = None;
        p.created_ms = Some(t(now).as_millisecond());
        p
    }

    /// One tick of the cluster: replacements older than two seconds become Ready, then
    /// the actions are carried out.
    fn apply(&mut self, actions: &[Action], now: i64) {
        for p in &mut self.pods {
            if !p.ready
                && p.created_ms
                    .is_some_and(|c| t(now).as_millisecond() - c >= 2000)
            {
                p.ready = true;
                p.ready_since_ms = Some(t(now).as_millisecond());
            }
        }
        for a in actions {
            match a {
                Action::Relabel { namespace, to, .. } => {
                    let n = self.namespaces.iter_mut().find(|n| &n.name == namespace);
                    n.unwrap().labels.insert("istio.io/rev".into(), to.clone());
                }
                Action::Evict { pod: name, .. } => {
                    let key = format!("a/{name}");
                    assert!(!self.evicted.contains(&key), "{key} evicted twice");
                    self.evicted.push(key);
                    let gone = self.pods.iter().position(|p| &p.name == name).unwrap();
                    let w = self.pods.remove(gone).workload.unwrap();
                    let r = self.replacement(&w, now);
                    self.pods.push(r);
                }
                Action::RolloutRestart {
                    workload: w,
                    restarted_at,
                    ..
                } => {
                    self.rollout_restarts.push(w.name.clone());
                    self.restarted_at
                        .insert(("a".into(), w.clone()), restarted_at.clone());
                    // The controller surges: the new pod first, the old one once it is Ready
                    // (modelled as at once with the new one Ready: the floor is kept).
                    let mut r = self.replacement(w, now);
                    r.ready = true;
                    r.ready_since_ms = Some(now);
                    self.pods.retain(|p| p.workload.as_ref() != Some(w));
                    self.pods.push(r);
                }
                Action::Event(_) | Action::ScheduleBusy(_) => {}
            }
        }
    }

    fn available(&self, name: &str) -> usize {
        self.pods
            .iter()
            .filter(|p| {
                p.workload.as_ref().is_some_and(|w| w.name == name) && p.ready && !p.terminating
            })
            .count()
    }
}

fn observe_floor(model: &FloorModel, status: Option<&RevisionUpgradeStatus>) -> Observations {
    Observations {
        generation: Some(1),
        fleet: Some(model.fleet()),
        issuance: Some(IssuanceReading {
            window_seconds: 10.0,
            issued: 0.0,
            own: 0.0,
        }),
        gates: gates(
            status.and_then(|s| s.current_wave.as_deref()),
            GateAction::Proceed,
        ),
        ..Observations::default()
    }
}

/// Runs ticks one second apart until complete (or 120 ticks), checking `web` never has
/// fewer than 3 Available pods and `solo` never none.
fn run_floor(model: &mut FloorModel) -> (RevisionUpgradeStatus, Vec<Decision>) {
    let s = spec();
    let mut status: Option<RevisionUpgradeStatus> = None;
    let mut decisions = Vec::new();
    for tick in 0..120 {
        let now = tick * 1000;
        let d = decide(
            &s,
            status.as_ref(),
            &observe_floor(model, status.as_ref()),
            t(now),
        );
        model.apply(&d.actions, now);
        assert!(
            model.available("web") >= 3,
            "tick {tick}: web below its floor of 3: {:?}",
            model.pods
        );
        assert!(
            model.available("solo") >= 1,
            "tick {tick}: solo has no Available pod"
        );
        status = Some(d.status.clone());
        decisions.push(d);
        if status.as_ref().is_some_and(complete) {
            break;
        }
    }
    (status.unwrap(), decisions)
}

#[test]
fn a_workload_without_a_pdb_keeps_its_floor_and_a_single_replica_surges() {
    let mut model = FloorModel::new();
    let (st, decisions) = run_floor(&mut model);
    let web_evicted = model
        .evicted
        .iter()
        .filter(|k| k.starts_with("a/web"))
        .count();
    assert_eq!(
        web_evicted, 4,
        "each web pod evicted once: {:?}",
        model.evicted
    );
    assert!(
        decisions.iter().all(|d| d
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Evict { pod, .. } if pod.starts_with("web")))
            .count()
            <= 1),
        "never two web pods in one grant"
    );
    assert_eq!(
        model.rollout_restarts,
        vec!["solo".to_owned()],
        "solo surged once"
    );
    assert!(
        !model
            .evicted
            .iter()
            .any(|k| k.contains("solo") || k.contains("batch") || k.contains("pinned")),
        "the single replica, the Job pod and the pinned pods are never evicted: {:?}",
        model.evicted
    );
    // The wave still moves: the Job and the pinned pods are held, not awaited for ever.
    assert_eq!(st.waves[0].state, UpgradeWaveState::Passed, "{st:#?}");
    let c = cond::find(&st.conditions, conditions::POD_REVISION_OVERRIDE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", reasons::POD_REVISION_OVERRIDE)
    );
    assert!(c.message.contains("Deployment a/pinned"), "{}", c.message);
    assert_eq!(st.pod_revision_overrides.len(), 1);
    let r = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert_eq!(r.status, "False", "{}", r.message);
    assert!(r.message.contains("Job pod"), "{}", r.message);
    let overrides_reported = decisions
        .iter()
        .flat_map(|d| d.event_reasons())
        .filter(|r| *r == reasons::POD_REVISION_OVERRIDE)
        .count();
    assert_eq!(overrides_reported, 1, "the override is announced once");
}

#[test]
fn without_the_floor_the_same_grant_would_take_web_down() {
    // The scenario's premise: the budget alone grants every web pod in one tick.
    let mut model = FloorModel::new();
    for w in model.workloads.values_mut() {
        w.pdb = true;
    }
    let s = spec();
    let d0 = decide(&s, None, &observe_floor(&model, None), t(0));
    model.apply(&d0.actions, 0);
    let d1 = decide(
        &s,
        Some(&d0.status),
        &observe_floor(&model, Some(&d0.status)),
        t(1000),
    );
    let web = d1
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Evict { pod, .. } if pod.starts_with("web")))
        .count();
    assert_eq!(web, 4, "a PodDisruptionBudget is left to the Eviction API");
}

#[test]
fn a_replacement_back_on_the_old_revision_stops_its_workload() {
    let mut model = FloorModel::new();
    model.reinject = Some("web");
    let (st, decisions) = run_floor(&mut model);
    let web_evicted = model
        .evicted
        .iter()
        .filter(|k| k.starts_with("a/web"))
        .count();
    // The first replacement is created in the same second the new label was seen, within
    // REINJECTION_GRACE, so it gets the benefit of the doubt once; the next one stops web.
    assert!(
        web_evicted <= 2,
        "web is not evicted in a loop: {:?}",
        model.evicted
    );
    assert_eq!(model.available("web"), 4, "web keeps its pods");
    assert_eq!(st.reinjected_by_old_revision.len(), 1, "{st:#?}");
    let r = &st.reinjected_by_old_revision[0];
    assert_eq!(
        (r.kind.as_str(), r.name.as_str(), r.found.as_str()),
        ("Deployment", "web", "1-27")
    );
    let c = cond::find(&st.conditions, conditions::REINJECTED_BY_OLD_REVISION).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", reasons::REINJECTED_BY_OLD_REVISION)
    );
    let warned = decisions
        .iter()
        .flat_map(|d| d.event_reasons())
        .filter(|r| *r == reasons::REINJECTED_BY_OLD_REVISION)
        .count();
    assert_eq!(warned, 1, "reported once");
    assert_eq!(
        st.waves[0].state,
        UpgradeWaveState::Passed,
        "the rest of the wave moves on"
    );
    let retirable = cond::find(&st.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert!(
        retirable.message.contains("re-injected"),
        "{}",
        retirable.message
    );
}

#[test]
fn namespaces_argo_cd_manages_are_reported_with_the_setting() {
    let mut model = FloorModel::new();
    model.namespaces[0].argo_cd_managed = true;
    model.namespaces.push(ns("elsewhere", None, "other"));
    model.namespaces[1].argo_cd_managed = true;
    let d = decide(&spec(), None, &observe_floor(&model, None), t(0));
    assert_eq!(d.status.argo_cd_managed_namespaces, vec!["a".to_owned()]);
    let c = cond::find(&d.status.conditions, conditions::ARGO_CD_MANAGED_NAMESPACES).unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("RespectIgnoreDifferences=true"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("sluice-upgrade-revisions"),
        "{}",
        c.message
    );
    assert!(
        d.event_reasons()
            .contains(&reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS)
    );
    let again = decide(
        &spec(),
        Some(&d.status),
        &observe_floor(&model, Some(&d.status)),
        t(1000),
    );
    assert!(
        !again
            .event_reasons()
            .contains(&reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS)
    );
}

#[test]
fn removing_a_started_wave_holds_the_upgrade() {
    let mut model = Model::new();
    // Wave low-risk started and its namespace is moving.
    let d0 = decide(
        &spec(),
        None,
        &observe(&model, None, GateAction::Proceed),
        t(0),
    );
    model.apply(&d0.actions);
    let d1 = decide(
        &spec(),
        Some(&d0.status),
        &observe(&model, Some(&d0.status), GateAction::Proceed),
        t(1000),
    );
    model.apply(&d1.actions);
    let mut edited = spec();
    edited.waves.remove(0);
    let d = decide(
        &edited,
        Some(&d1.status),
        &observe(&model, Some(&d1.status), GateAction::Proceed),
        t(2000),
    );
    let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reasons::STARTED_WAVE_REMOVED),
        "{}",
        c.message
    );
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Relabel { .. } | Action::Evict { .. })),
        "nothing moves: {:?}",
        d.actions
    );
    assert!(
        d.status.waves.iter().any(|w| w.name == "low-risk"),
        "its state is kept"
    );
    // Aborting retags it back.
    let mut aborted = edited.clone();
    aborted.abort = true;
    let d = decide(
        &aborted,
        Some(&d.status),
        &observe(&model, Some(&d.status), GateAction::Proceed),
        t(3000),
    );
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::Relabel { to, .. } if to == "stable")),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_second_upgrade_waits_for_the_first() {
    let model = Model::new();
    let mut o = observe(&model, None, GateAction::Proceed);
    o.earlier_upgrade = Some("istio-1-27".into());
    let d = decide(&spec(), None, &o, t(0));
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Relabel { .. } | Action::Evict { .. })),
        "nothing moves while an earlier upgrade runs: {:?}",
        d.actions
    );
    assert_eq!(d.status.phase, RevisionUpgradePhase::Pending);
    let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reasons::WAITING_FOR_UPGRADE)
    );
    assert!(c.message.contains("istio-1-27"), "{}", c.message);
    // Once the first is done, this one starts.
    let d2 = decide(
        &spec(),
        Some(&d.status),
        &observe(&model, Some(&d.status), GateAction::Proceed),
        t(1000),
    );
    assert!(
        d2.actions
            .iter()
            .any(|a| matches!(a, Action::Relabel { .. }))
    );
}

#[test]
fn the_old_revision_is_not_retirable_while_a_namespace_still_selects_it() {
    let mut model = Model::new();
    // Labelled with the old revision's name (no wave selects it) and without pods now.
    model.namespaces.push(ns("cron", None, "1-27"));
    let (st, _) = run(
        &mut model,
        None,
        0,
        &BTreeSet::new(),
        &BTreeSet::new(),
        |_, _| GateAction::Proceed,
        |s| s.waves.iter().all(|w| w.state == UpgradeWaveState::Passed),
    );
    assert_eq!(st.proxies.as_ref().unwrap().old, 0);
    let d = decide(
        &spec(),
        Some(&st),
        &observe(&model, Some(&st), GateAction::Proceed),
        t(400_000),
    );
    assert!(
        d.status.completed_at.is_none(),
        "not complete while cron selects 1-27"
    );
    let c = cond::find(&d.status.conditions, conditions::OLD_REVISION_RETIRABLE).unwrap();
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains("cron (istio.io/rev=1-27)"),
        "{}",
        c.message
    );
    // Relabelled to the new tag, the old revision is retirable.
    model.label("cron", "canary");
    let d = decide(
        &spec(),
        Some(&d.status),
        &observe(&model, Some(&d.status), GateAction::Proceed),
        t(401_000),
    );
    assert!(
        d.status.completed_at.is_some(),
        "{:#?}",
        d.status.conditions
    );
}

/// The current wave's report with one gate, `errors`, whose GateTemplate does not exist (or,
/// `fixed`, with every gate resolved and passing).
fn unresolvable(status: Option<&RevisionUpgradeStatus>, fixed: bool) -> Option<GateReport> {
    let why = "spec.gates errors: gate \"errors\" references GateTemplate \"absent\", which does \
               not exist; create it or fix templateRef";
    Some(GateReport {
        wave: status
            .and_then(|s| s.current_wave.clone())
            .unwrap_or_default(),
        action: Some(GateAction::Proceed),
        unresolved: (!fixed)
            .then(|| UnresolvedGate {
                gate: "errors".into(),
                message: why.into(),
            })
            .into_iter()
            .collect(),
        misconfigured: (!fixed).then(|| why.to_owned()).into_iter().collect(),
        ..GateReport::default()
    })
}

#[test]
fn an_unresolvable_gate_is_not_ready_and_the_upgrades_inconclusive_policy_applies_after_its_deadline()
 {
    use sluice_api::v1alpha1::Verdict;
    // (spec.inconclusive.action, after its 60s: the phase, and the Progressing reason)
    let table = [
        (
            "Abort",
            RevisionUpgradePhase::RollingBack,
            reasons::GATE_FAILED,
        ),
        ("Pause", RevisionUpgradePhase::Paused, reasons::PAUSED),
        (
            "Continue",
            RevisionUpgradePhase::Progressing,
            reasons::WAVE_RESTARTING,
        ),
    ];
    for (policy, phase, reason) in table {
        let mut s = spec();
        s.inconclusive =
            serde_json::from_value(serde_json::json!({"action": policy, "after": "60s"})).unwrap();
        let mut model = Model::new();
        let mut status: Option<RevisionUpgradeStatus> = None;
        let mut warned = 0;
        // The wave starts at 0 s; its gates are first evaluated at 1 s, so the deadline is 61 s.
        for tick in 0..=61 {
            let mut o = observe(&model, status.as_ref(), GateAction::Proceed);
            o.gates = unresolvable(status.as_ref(), false);
            let d = decide(&s, status.as_ref(), &o, t(tick * 1000));
            model.apply(&d.actions);
            warned += d
                .event_reasons()
                .iter()
                .filter(|r| **r == GATE_MISCONFIGURED)
                .count();
            let st = d.status;
            if tick >= 1 {
                let ready = cond::find(&st.conditions, conditions::READY).unwrap();
                assert_eq!(
                    (ready.status.as_str(), ready.reason.as_str()),
                    ("False", GATE_MISCONFIGURED),
                    "{policy} at {tick}s: Ready names the misconfigured gate"
                );
                assert!(
                    ready.message.contains("spec.gates errors")
                        && ready.message.contains("templateRef"),
                    "{policy}: {}",
                    ready.message
                );
                let v = st.waves[0].gates.iter().find(|v| v.gate == "errors");
                let v = v.unwrap_or_else(|| {
                    panic!("{policy} at {tick}s: the gate's verdict is recorded")
                });
                assert_eq!(v.verdict, Verdict::Inconclusive, "{policy} at {tick}s");
                assert_eq!(
                    v.inconclusive_since.as_ref().map(|t| t.0),
                    Some(t(1000)),
                    "{policy} at {tick}s: the streak runs from the first evaluation"
                );
            }
            if tick < 61 {
                assert_ne!(
                    st.waves[0].state,
                    UpgradeWaveState::Passed,
                    "{policy} at {tick}s: the wave holds while the gate is Inconclusive"
                );
                assert!(
                    st.aborted_at.is_none() && st.phase != RevisionUpgradePhase::Paused,
                    "{policy} at {tick}s: nothing before the deadline ({:?})",
                    st.phase
                );
            } else {
                assert_eq!(st.phase, phase, "{policy}: after the deadline");
                let c = cond::find(&st.conditions, conditions::PROGRESSING).unwrap();
                assert_eq!(c.reason, reason, "{policy}: {}", c.message);
                if policy == "Abort" {
                    assert!(c.message.contains("errors"), "{}", c.message);
                }
                if policy == "Continue" {
                    assert_eq!(st.waves[0].state, UpgradeWaveState::Passed);
                }
            }
            status = Some(st);
        }
        assert_eq!(
            warned, 1,
            "{policy}: one Warning Event when the problem is found"
        );
    }
}

#[test]
fn a_fixed_gate_makes_the_upgrade_ready_again_at_its_next_evaluation() {
    let s = spec();
    let model = Model::new();
    let mut status: Option<RevisionUpgradeStatus> = None;
    for tick in 0..3 {
        let mut o = observe(&model, status.as_ref(), GateAction::Proceed);
        o.gates = unresolvable(status.as_ref(), false);
        status = Some(decide(&s, status.as_ref(), &o, t(tick * 1000)).status);
    }
    let ready = |st: &RevisionUpgradeStatus| {
        let c = cond::find(&st.conditions, conditions::READY).unwrap();
        (c.status.clone(), c.reason.clone())
    };
    assert_eq!(
        ready(status.as_ref().unwrap()),
        ("False".to_owned(), GATE_MISCONFIGURED.to_owned())
    );
    // Not evaluated this tick: the finding stands.
    let mut o = observe(&model, status.as_ref(), GateAction::Proceed);
    o.gates = None;
    let d = decide(&s, status.as_ref(), &o, t(3000));
    assert_eq!(ready(&d.status).1, GATE_MISCONFIGURED);
    assert!(d.event_reasons().is_empty(), "{:?}", d.event_reasons());
    // Evaluated with every gate resolved: Ready again, from now, and no "spec accepted" again.
    let mut o = observe(&model, Some(&d.status), GateAction::Proceed);
    o.gates = unresolvable(Some(&d.status), true);
    let d = decide(&s, Some(&d.status), &o, t(4000));
    assert_eq!(
        ready(&d.status),
        ("True".to_owned(), cond::VALID.to_owned())
    );
    let c = cond::find(&d.status.conditions, conditions::READY).unwrap();
    assert_eq!(c.last_transition_time.0, t(4000));
    assert!(
        !d.event_reasons().contains(&cond::VALID),
        "{:?}",
        d.event_reasons()
    );
}

#[test]
fn a_finished_upgrade_does_not_keep_a_gate_misconfigured_ready_false() {
    // (spec.inconclusive.action, the finished phase): the unresolvable gate lets the waves pass
    // (Continue) or aborts the upgrade (Abort); either way the run ends with no gate evaluated.
    let table = [
        ("Continue", RevisionUpgradePhase::Complete),
        ("Abort", RevisionUpgradePhase::Aborted),
    ];
    for (policy, finished) in table {
        let mut s = spec();
        s.inconclusive =
            serde_json::from_value(serde_json::json!({"action": policy, "after": "2s"})).unwrap();
        let mut model = Model::new();
        let mut status: Option<RevisionUpgradeStatus> = None;
        let mut misconfigured_seen = false;
        let mut tick = 0;
        let d = loop {
            assert!(tick < 300, "{policy}: not {finished:?} after 300 ticks");
            let mut o = observe(&model, status.as_ref(), GateAction::Proceed);
            // As the reconcile does: the current wave's gates, none once the run is over.
            let over = status
                .as_ref()
                .is_some_and(|s| s.completed_at.is_some() || s.aborted_at.is_some());
            o.gates = (!over)
                .then(|| unresolvable(status.as_ref(), false))
                .flatten();
            let d = decide(&s, status.as_ref(), &o, t(tick * 1000));
            model.apply(&d.actions);
            misconfigured_seen |= cond::find(&d.status.conditions, conditions::READY)
                .is_some_and(|c| c.reason == GATE_MISCONFIGURED);
            if d.status.phase == finished {
                break d;
            }
            status = Some(d.status);
            tick += 1;
        };
        assert!(misconfigured_seen, "{policy}: Ready=False during the run");
        let ready = cond::find(&d.status.conditions, conditions::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", cond::VALID),
            "{policy}: {finished:?} with Ready {}",
            ready.message
        );
        assert_eq!(
            ready.last_transition_time.0,
            t(tick * 1000),
            "{policy}: Ready again from the tick the run finished"
        );
        // The next ticks keep it (no flapping, no Event).
        let mut o = observe(&model, Some(&d.status), GateAction::Proceed);
        o.gates = None;
        let next = decide(&s, Some(&d.status), &o, t((tick + 30) * 1000));
        assert_eq!(next.status.phase, finished, "{policy}");
        assert_eq!(
            cond::find(&next.status.conditions, conditions::READY),
            Some(ready),
            "{policy}"
        );
        assert!(
            !next.event_reasons().contains(&GATE_MISCONFIGURED),
            "{policy}: {:?}",
            next.event_reasons()
        );
    }
}
