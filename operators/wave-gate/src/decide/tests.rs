use super::*;
use crate::{
    decisions,
    pins::{self, PinPlan},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sluice_analysis::GateAction;
use sluice_api::external::argocd::UnsafeApplicationSet;
use sluice_api::v1alpha1::wave_gate::{ChangeOutcome, HaltReason, WaveState, conditions as types};
use sluice_api::v1alpha1::{
    BundlePinPhase, GateVerdict, Verdict, VerdictReason, WaveGatePhase, WaveGateSpec,
    WaveGateStatus,
};
use sluice_runtime::conditions::{self as cond};
use std::collections::BTreeMap;
use std::time::Duration;

use sluice_api::v1alpha1::wave_gate::{conditions, reasons};

fn rev(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec_with(patch: serde_json::Value) -> WaveGateSpec {
    let mut base = serde_json::json!({
        "site": "eu",
        "applicationSetRef": {"name": "mesh"},
        "repository": "oci://registry.local/mesh",
        "revision": rev('b'),
        "sourceCommit": "abc1234",
        "waves": [
            {"name": "canary", "clusters": ["c1"], "soak": "10s"},
            {"name": "rest", "clusters": ["c2", "c3"], "soak": "10s"}
        ],
        "convergenceTimeout": "60s",
        "analysisInterval": "5s",
        "driftGate": {"exporter": "Platform", "metric": "sluice_drift_proxies_behind"},
        "pin": {"publicKeysSecretRef": {"name": "keys"}},
    });
    for (k, v) in patch.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(base).unwrap()
}

fn spec() -> WaveGateSpec {
    spec_with(serde_json::json!({}))
}

fn app(cluster: &str, at: &str, healthy: bool) -> AppView {
    AppView {
        name: format!("mesh-{cluster}"),
        namespace: "argocd".into(),
        cluster: cluster.into(),
        sync_status: Some("Synced".into()),
        synced_revision: Some(at.into()),
        healthy,
    }
}

/// Observations where clusters in `on_b` run revision b (the rest a), all healthy, drift 0.
fn obs(on_b: &[&str]) -> Observations {
    let apps = ["c1", "c2", "c3"]
        .iter()
        .map(|c| {
            let r = if on_b.contains(c) { rev('b') } else { rev('a') };
            app(c, &r, true)
        })
        .collect();
    Observations {
        namespace: "argocd".into(),
        name: "eu".into(),
        generation: Some(1),
        applications: apps,
        drift: ["c1", "c2", "c3"]
            .iter()
            .map(|c| ((*c).to_owned(), Some(0.0)))
            .collect(),
        ..Observations::default()
    }
}

fn verdict(gate: &str, v: Verdict, at: i64) -> EvaluatedGate {
    EvaluatedGate {
        verdict: GateVerdict {
            gate: gate.into(),
            verdict: v,
            reason: match v {
                Verdict::Pass => VerdictReason::ThresholdMet,
                Verdict::Fail => VerdictReason::ThresholdBreached,
                Verdict::Inconclusive => VerdictReason::NoData,
            },
            message: None,
            value: Some(if v == Verdict::Fail { 0.2 } else { 0.0 }),
            baseline: None,
            threshold: Some(0.01),
            samples: Some(1000),
            min_samples: Some(100),
            consecutive_failures: u32::from(v == Verdict::Fail),
            inconclusive_since: None,
            evaluated_at: Time(t(at)),
        },
        action: match v {
            Verdict::Pass => GateAction::Proceed,
            Verdict::Fail => GateAction::Abort,
            Verdict::Inconclusive => GateAction::Wait,
        },
    }
}

fn all_gates(v: Verdict, at: i64) -> Option<Vec<EvaluatedGate>> {
    Some(
        ["mesh-error-ratio", "xds-nack-increase", "proxies-behind"]
            .iter()
            .map(|g| verdict(g, v, at))
            .collect(),
    )
}

fn pins_of(d: &Decision) -> Vec<&PinPlan> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreatePin(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn revisions(d: &Decision) -> Vec<(String, String)> {
    d.status
        .decisions
        .iter()
        .map(|x| (x.cluster_name.clone(), x.revision[7..8].to_owned()))
        .collect()
}

fn on(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).into(), (*b).into()))
        .collect()
}

/// Runs decide and checks the invariants every decision must keep.
fn run(s: &WaveGateSpec, status: Option<&WaveGateStatus>, o: &Observations, now: i64) -> Decision {
    let d = decide(s, status, o, t(now));
    let required = status.is_some_and(|st| !st.decisions.is_empty());
    assert_eq!(
        decisions::publishable(s, &d.status.decisions, required),
        Ok(()),
        "decision list complete: {:?}",
        d.status.decisions
    );
    let again = decide(s, Some(&d.status), o, t(now));
    assert_eq!(
        again.status.decisions, d.status.decisions,
        "re-deciding from the written status changes no decision"
    );
    d
}

/// A change to b whose wave 0 converged at 10 s and soaks until 20 s.
fn soaking() -> WaveGateStatus {
    let s = spec();
    let d0 = run(&s, None, &obs(&[]), 0);
    assert_eq!(d0.status.waves[0].state, WaveState::Converging);
    let d1 = run(&s, Some(&d0.status), &obs(&["c1"]), 10);
    assert_eq!(d1.status.waves[0].state, WaveState::Soaking);
    d1.status
}

#[test]
fn adoption_then_wave_zero_admitted() {
    let s = spec();
    let d = run(&s, None, &obs(&[]), 0);
    assert_eq!(
        revisions(&d),
        on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
        "adopted at a for all, then wave 0 admitted at b"
    );
    assert_eq!(d.status.previous_revision, Some(rev('a')));
    assert_eq!(d.status.current_revision, Some(rev('b')));
    assert_eq!(d.status.phase, WaveGatePhase::Progressing);
    assert_eq!(d.status.current_wave.as_deref(), Some("canary"));
    assert_eq!(
        d.event_reasons(),
        vec![
            reasons::VALID,
            reasons::APPLICATION_SET_OK,
            reasons::ADOPTED,
            reasons::WAVE_ADMITTED
        ]
    );
    assert!(d.actions.contains(&Action::NudgeApplicationSet));
    assert_eq!(d.status.waves[0].admitted_at, Some(Time(t(0))));
    assert_eq!(d.status.history.len(), 2);
}

/// (name, spec patch, observations, want published revisions, want phase)
type AdoptionRow = (
    &'static str,
    serde_json::Value,
    Observations,
    Vec<(String, String)>,
    WaveGatePhase,
);

#[test]
fn adoption_table() {
    let mixed = {
        let mut o = obs(&["c2"]);
        o.applications[0].sync_status = Some("OutOfSync".into());
        o
    };
    let none = Observations {
        applications: vec![],
        ..obs(&[])
    };
    // (name, spec patch, observations, want published revisions, want phase)
    let cases: Vec<AdoptionRow> = vec![
        (
            "apps agree on a",
            serde_json::json!({}),
            obs(&[]),
            on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
            WaveGatePhase::Progressing,
        ),
        (
            "apps already at b",
            serde_json::json!({}),
            obs(&["c1", "c2", "c3"]),
            on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]),
            WaveGatePhase::Complete,
        ),
        (
            "apps disagree",
            serde_json::json!({}),
            mixed.clone(),
            vec![],
            WaveGatePhase::Pending,
        ),
        (
            "apps disagree, previousRevision set",
            serde_json::json!({"previousRevision": rev('c')}),
            mixed,
            on(&[("c1", "b"), ("c2", "c"), ("c3", "c")]),
            WaveGatePhase::Progressing,
        ),
        (
            "no apps yet",
            serde_json::json!({}),
            none.clone(),
            on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]),
            WaveGatePhase::Complete,
        ),
        (
            "apps exist but none observed for the site's clusters",
            serde_json::json!({}),
            Observations {
                unmatched_applications: vec!["argocd/mesh-by-server".into()],
                ..none
            },
            vec![],
            WaveGatePhase::Pending,
        ),
    ];
    for (name, patch, o, want, phase) in cases {
        let d = run(&spec_with(patch), None, &o, 0);
        assert_eq!(revisions(&d), want, "{name}");
        assert_eq!(d.status.phase, phase, "{name}");
        if phase == WaveGatePhase::Pending {
            let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
            assert_eq!(c.reason, reasons::ADOPTION_PENDING, "{name}");
            assert!(
                c.message.contains("previousRevision"),
                "{name}: {}",
                c.message
            );
            assert!(matches!(d.requeue, Requeue::After(_)), "{name}");
        }
    }
}

#[test]
fn unsafe_application_set_is_refused_table() {
    let published = run(&spec(), None, &obs(&[]), 0).status;
    let cases = [
        (
            ApplicationSetView::Missing,
            reasons::APPLICATION_SET_NOT_FOUND,
        ),
        (
            ApplicationSetView::Found(vec![UnsafeApplicationSet::ApplicationsSync(Some(
                "sync".into(),
            ))]),
            reasons::APPLICATIONS_SYNC_UNSAFE,
        ),
        (
            ApplicationSetView::Found(vec![UnsafeApplicationSet::ResourcesNotPreserved]),
            reasons::RESOURCES_NOT_PRESERVED,
        ),
        (
            ApplicationSetView::Found(vec![UnsafeApplicationSet::SyncPolicyNotIgnored]),
            reasons::SYNC_POLICY_NOT_IGNORED,
        ),
        (
            ApplicationSetView::Found(vec![UnsafeApplicationSet::TemplateNotFromDecisions(
                "spec.strategy is RollingSync".into(),
            )]),
            reasons::TEMPLATE_NOT_FROM_DECISIONS,
        ),
    ];
    for (view, reason) in cases {
        for status in [None, Some(&published)] {
            let o = Observations {
                application_set: view.clone(),
                ..obs(&[])
            };
            let d = run(&spec(), status, &o, 5);
            assert_eq!(d.status.phase, WaveGatePhase::Refused, "{reason}");
            let c = cond::find(&d.status.conditions, conditions::APPLICATION_SET_SAFE).unwrap();
            assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
            assert!(
                d.event_reasons().contains(&reason),
                "{reason}: a Warning Event"
            );
            assert_eq!(
                d.status.decisions,
                status.map(|s| s.decisions.clone()).unwrap_or_default(),
                "{reason}: nothing published or changed"
            );
            assert!(!d.actions.contains(&Action::NudgeApplicationSet));
        }
    }
}

#[test]
fn convergence_table() {
    let s = spec();
    let admitted = run(&s, None, &obs(&[]), 0).status;
    let mut unhealthy = obs(&["c1"]);
    unhealthy.applications[0].healthy = false;
    let mut behind = obs(&["c1"]);
    behind.drift.insert("c1".into(), Some(4.0));
    let mut no_signal = obs(&["c1"]);
    no_signal.drift.insert("c1".into(), None);
    let mut no_app = obs(&["c1"]);
    no_app.applications.remove(0);
    // (name, observations, now, want state, want detail in the halt)
    let cases = [
        ("converged", obs(&["c1"]), 10, WaveState::Soaking, None),
        ("not synced yet", obs(&[]), 10, WaveState::Converging, None),
        (
            "unhealthy",
            unhealthy.clone(),
            10,
            WaveState::Converging,
            None,
        ),
        (
            "proxies behind",
            behind.clone(),
            10,
            WaveState::Converging,
            None,
        ),
        (
            "no drift signal",
            no_signal.clone(),
            10,
            WaveState::Converging,
            None,
        ),
        (
            "not synced at timeout",
            obs(&[]),
            60,
            WaveState::Failed,
            Some("0/1 Applications Synced"),
        ),
        (
            "proxies never acknowledge",
            behind,
            61,
            WaveState::Failed,
            Some("c1=4"),
        ),
        (
            "drift signal missing at timeout",
            no_signal,
            61,
            WaveState::Failed,
            Some("no drift signal for cluster(s) c1"),
        ),
        (
            "no Application at timeout",
            no_app,
            61,
            WaveState::Failed,
            Some("no Application for cluster(s) c1"),
        ),
    ];
    for (name, o, now, want, detail) in cases {
        let d = run(&s, Some(&admitted), &o, now);
        assert_eq!(d.status.waves[0].state, want, "{name}");
        match detail {
            None => assert!(d.status.halt.is_none(), "{name}"),
            Some(text) => {
                let h = d.status.halt.as_ref().unwrap();
                assert_eq!(h.reason, HaltReason::ConvergenceTimeout, "{name}");
                assert!(
                    h.message.as_deref().unwrap().contains(text),
                    "{name}: {:?}",
                    h.message
                );
                assert_eq!(d.status.phase, WaveGatePhase::Halted, "{name}");
            }
        }
    }
}

#[test]
fn soak_and_gates_table() {
    let s = spec();
    let base = soaking();
    let mut unhealthy = obs(&["c1"]);
    unhealthy.applications[0].healthy = false;
    // (name, observations, gates, now, want wave 0 state, want wave 1 state)
    let cases = [
        (
            "green before the soak ends",
            obs(&["c1"]),
            all_gates(Verdict::Pass, 15),
            15,
            WaveState::Soaking,
            WaveState::Pending,
        ),
        (
            "green after the soak ends",
            obs(&["c1"]),
            all_gates(Verdict::Pass, 20),
            20,
            WaveState::Passed,
            WaveState::Converging,
        ),
        (
            "soak ended, gates not re-read",
            obs(&["c1"]),
            None,
            20,
            WaveState::Soaking,
            WaveState::Pending,
        ),
        (
            "inconclusive at the end holds",
            obs(&["c1"]),
            all_gates(Verdict::Inconclusive, 20),
            20,
            WaveState::Soaking,
            WaveState::Pending,
        ),
        (
            "unhealthy at the end holds",
            unhealthy,
            all_gates(Verdict::Pass, 20),
            20,
            WaveState::Soaking,
            WaveState::Pending,
        ),
        (
            "a gate fails",
            obs(&["c1"]),
            Some(vec![
                verdict("mesh-error-ratio", Verdict::Fail, 15),
                verdict("xds-nack-increase", Verdict::Pass, 15),
            ]),
            15,
            WaveState::Failed,
            WaveState::Pending,
        ),
    ];
    for (name, mut o, gates, now, w0, w1) in cases {
        o.gates = gates;
        let d = run(&s, Some(&base), &o, now);
        assert_eq!(d.status.waves[0].state, w0, "{name}");
        assert_eq!(d.status.waves[1].state, w1, "{name}");
        assert_eq!(
            d.status.waves[0].converged_at,
            Some(Time(t(10))),
            "{name}: the soak clock never resets"
        );
        if w1 == WaveState::Converging {
            assert_eq!(
                revisions(&d),
                on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]),
                "{name}"
            );
            assert!(d.event_reasons().contains(&reasons::WAVE_PASSED));
            assert!(d.event_reasons().contains(&reasons::WAVE_ADMITTED));
        }
    }
}

#[test]
fn gates_are_due_once_per_interval_and_after_the_soak_ends() {
    let s = spec();
    let base = soaking();
    assert_eq!(
        gates_due(&s, &base, t(10)),
        Some(0),
        "first evaluation at once"
    );
    let mut o = obs(&["c1"]);
    o.gates = all_gates(Verdict::Pass, 11);
    let d = run(&s, Some(&base), &o, 11);
    assert_eq!(gates_due(&s, &d.status, t(12)), None);
    assert_eq!(
        gates_due(&s, &d.status, t(16)),
        Some(0),
        "an interval later"
    );
    assert_eq!(gates_due(&s, &d.status, t(20)), Some(0), "the soak ended");
    assert_eq!(d.requeue, Requeue::After(Duration::from_secs(5)));
}

#[test]
fn restart_during_a_soak_continues_the_same_soak() {
    let s = spec();
    let base = soaking();
    // A restarted operator decides from the written status alone.
    let d = run(&s, Some(&base), &obs(&["c1"]), 14);
    assert_eq!(d.status.waves[0].converged_at, Some(Time(t(10))));
    assert_eq!(d.status.waves[0].admitted_at, Some(Time(t(0))));
    assert!(
        !d.event_reasons().contains(&reasons::WAVE_ADMITTED),
        "no re-admission"
    );
    assert!(
        !d.event_reasons().contains(&reasons::SOAKING),
        "no new soak"
    );
    assert!(!d.actions.contains(&Action::NudgeApplicationSet));
}

#[test]
fn released_pins_of_this_wave_gate_are_deleted_once_the_halt_no_longer_needs_them() {
    let s = spec();
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let halted = run(&s, Some(&soaking()), &o, 15);
    let name = pins_of(&halted)[0].name.clone();
    let deleted = |d: &Decision| -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePin(n) => Some(n.clone()),
                _ => None,
            })
            .collect()
    };
    // A pin released (spec.release by hand) before the halt pinned back is still counted
    // by the halt: kept.
    let mut o = obs(&["c1"]);
    o.existing_pins.insert(name.clone());
    o.pin_phases.insert(name.clone(), BundlePinPhase::Released);
    o.released_pins.insert(name.clone());
    let mut before = halted.status.clone();
    before.halt.as_mut().unwrap().pinned_at = None;
    let d = run(&s, Some(&before), &o, 16);
    assert!(
        d.status.halt.as_ref().unwrap().pinned_at.is_some(),
        "a Released pin lets the decisions go back"
    );
    // Pinned back: the released pin goes, now and on every later reconcile it still exists.
    assert_eq!(deleted(&d), vec![name.clone()]);
    let later = run(&s, Some(&d.status), &o, 100);
    assert_eq!(deleted(&later), vec![name.clone()]);
    assert_eq!(later.status, d.status);
    // Still in force (Pinned): kept.
    let mut held = o.clone();
    held.released_pins.clear();
    held.pin_phases.insert(name.clone(), BundlePinPhase::Pinned);
    assert!(deleted(&run(&s, Some(&d.status), &held, 100)).is_empty());
    // While the halt still creates and counts its pins: never deleted.
    let mut creating = obs(&["c1"]);
    creating.released_pins.insert(name.clone());
    let d = run(&s, Some(&halted.status), &creating, 16);
    assert!(deleted(&d).is_empty(), "{:?}", d.actions);
}

#[test]
fn breach_halts_pins_admitted_clusters_then_sets_decisions_back() {
    let s = spec();
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let halted = run(&s, Some(&soaking()), &o, 15);
    let h = halted.status.halt.as_ref().unwrap();
    assert_eq!(h.reason, HaltReason::GateFailed);
    assert_eq!(h.gate.as_ref().unwrap().gate, "mesh-error-ratio");
    assert!(
        h.message
            .as_deref()
            .unwrap()
            .contains("value 0.2, threshold 0.01"),
        "{:?}",
        h.message
    );
    assert_eq!(
        h.reverted_clusters,
        vec!["c1".to_owned()],
        "only wave 0 was admitted"
    );
    let pins = pins_of(&halted);
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0].cluster, "c1");
    assert_eq!(pins[0].digest, rev('a'));
    assert_eq!(h.pins, vec![pins[0].name.clone()]);
    assert_eq!(
        revisions(&halted),
        on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
        "decisions go back only after the pins exist"
    );
    assert!(halted.event_reasons().contains(&reasons::GATE_FAILED));

    // A retried reconcile (pin creation failed) asks for the same pin again.
    let retry = run(&s, Some(&halted.status), &obs(&["c1"]), 16);
    assert_eq!(pins_of(&retry).len(), 1);
    assert_eq!(pins_of(&retry)[0].name, pins[0].name);

    // Once the pin exists but revert does not hold it yet: no second pin, decisions wait.
    let mut o = obs(&["c1"]);
    o.existing_pins.insert(pins[0].name.clone());
    for phase in [
        None,
        Some(BundlePinPhase::Verifying),
        Some(BundlePinPhase::Pinning),
    ] {
        if let Some(ph) = phase {
            o.pin_phases.insert(pins[0].name.clone(), ph);
        }
        let waiting = run(&s, Some(&halted.status), &o, 16);
        assert!(pins_of(&waiting).is_empty());
        assert_eq!(
            revisions(&waiting),
            on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
            "decisions wait for revert to hold the pin ({phase:?})"
        );
        assert_eq!(waiting.status.halt.as_ref().unwrap().pinned_at, None);
    }
    // Revert waited out: the decisions go back anyway, and the note says why.
    let late = run(&s, Some(&halted.status), &o, 15 + 31);
    assert_eq!(
        revisions(&late),
        on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
    );
    let note = &cond::find(&late.status.conditions, types::HALTED)
        .unwrap()
        .message;
    assert!(note.contains("not in force after 30s"), "{note}");
    // Revert refused the pin: no reason to wait, Argo CD reverts from the decision.
    o.pin_phases
        .insert(pins[0].name.clone(), BundlePinPhase::Refused);
    let refused = run(&s, Some(&halted.status), &o, 16);
    assert_eq!(
        revisions(&refused),
        on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
    );
    // Revert holds the pin: decisions back, waves reverted, no second pin.
    o.pin_phases
        .insert(pins[0].name.clone(), BundlePinPhase::Pinned);
    let pinned = run(&s, Some(&halted.status), &o, 16);
    assert!(pins_of(&pinned).is_empty());
    assert_eq!(
        revisions(&pinned),
        on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
    );
    assert_eq!(
        pinned.status.halt.as_ref().unwrap().pinned_at,
        Some(Time(t(16)))
    );
    assert_eq!(pinned.status.phase, WaveGatePhase::Halted);
    assert_eq!(pinned.status.waves[0].state, WaveState::Failed);
    assert_eq!(
        pinned.status.waves[1].state,
        WaveState::Pending,
        "no later wave admitted"
    );
    assert!(pinned.event_reasons().contains(&reasons::PINNED_BACK));
    let later = run(&s, Some(&pinned.status), &o, 100);
    assert_eq!(later.status, pinned.status, "a halt stays put");
    assert!(later.actions.is_empty());
}

#[test]
fn new_revision_after_a_halt_table() {
    let s = spec();
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let halted = run(&s, Some(&soaking()), &o, 15);
    let mut o = obs(&[]);
    o.existing_pins = halted
        .status
        .halt
        .as_ref()
        .unwrap()
        .pins
        .iter()
        .cloned()
        .collect();
    o.pin_phases = o
        .existing_pins
        .iter()
        .map(|p| (p.clone(), BundlePinPhase::Pinned))
        .collect();
    let pinned = run(&s, Some(&halted.status), &o, 16).status;
    for (supersede, want_admitted) in [(false, false), (true, true)] {
        let s2 = spec_with(
            serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678", "supersedeHalted": supersede}),
        );
        let d = run(&s2, Some(&pinned), &o, 30);
        if want_admitted {
            assert_eq!(d.status.halt, None);
            assert_eq!(d.status.current_revision, Some(rev('c')));
            assert_eq!(
                d.status.previous_revision,
                Some(rev('a')),
                "the halted revision is never a pin target"
            );
            assert_eq!(revisions(&d), on(&[("c1", "c"), ("c2", "a"), ("c3", "a")]));
            assert!(d.event_reasons().contains(&reasons::SUPERSEDED));
            let h = &d.status.history;
            assert_eq!(h[h.len() - 2].outcome, Some(ChangeOutcome::Halted));
        } else {
            assert_eq!(d.status.phase, WaveGatePhase::Halted);
            assert_eq!(revisions(&d), on(&[("c1", "a"), ("c2", "a"), ("c3", "a")]));
            let c = cond::find(&d.status.conditions, conditions::PROGRESSING).unwrap();
            assert_eq!(c.reason, reasons::BLOCKED_BY_HALT);
            assert!(d.event_reasons().contains(&reasons::BLOCKED_BY_HALT));
        }
    }
}

#[test]
fn a_new_revision_during_a_soak_starts_again_from_wave_zero() {
    let s2 = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
    let d = run(&s2, Some(&soaking()), &obs(&["c1"]), 15);
    assert_eq!(d.status.current_revision, Some(rev('c')));
    assert_eq!(
        d.status.previous_revision,
        Some(rev('a')),
        "pins go back to the last completed revision"
    );
    assert_eq!(d.status.waves[0].state, WaveState::Converging);
    assert_eq!(d.status.waves[0].admitted_at, Some(Time(t(15))));
    assert_eq!(
        d.status.waves[0].converged_at, None,
        "a fresh soak for the new revision"
    );
    assert_eq!(revisions(&d), on(&[("c1", "c"), ("c2", "a"), ("c3", "a")]));
    assert!(d.event_reasons().contains(&reasons::SUPERSEDED));
    let h = &d.status.history;
    assert_eq!(h[h.len() - 2].outcome, Some(ChangeOutcome::Superseded));
    assert_eq!(h[h.len() - 1].revision, rev('c'));
}

#[test]
fn superseding_in_a_later_wave_sets_its_unjudged_clusters_back() {
    let s = spec();
    // Wave 0 passes, wave 1 is admitted on b.
    let passed = run(
        &s,
        Some(&soaking()),
        &{
            let mut o = obs(&["c1"]);
            o.gates = all_gates(Verdict::Pass, 25);
            o
        },
        25,
    );
    assert!(
        passed.status.waves[1].state != WaveState::Pending,
        "wave 1 admitted: {:?}",
        passed.status.waves
    );
    assert_eq!(
        revisions(&passed),
        on(&[("c1", "b"), ("c2", "b"), ("c3", "b")])
    );
    // Superseded by c while wave 1 soaks unjudged by c.
    let s2 = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
    let d = run(&s2, Some(&passed.status), &obs(&["c1", "c2", "c3"]), 26);
    assert_eq!(
        revisions(&d),
        on(&[("c1", "c"), ("c2", "a"), ("c3", "a")]),
        "wave 1 never stays on the superseded revision ungated"
    );
}

#[test]
fn a_new_revision_with_the_previous_commit_is_refused() {
    // A completed change to b at commit abc1234.
    let s = spec();
    let done = run(
        &s,
        Some(&soaking()),
        &{
            let mut o = obs(&["c1"]);
            o.gates = all_gates(Verdict::Pass, 25);
            o
        },
        25,
    );
    assert_eq!(done.status.source_commit.as_deref(), Some("abc1234"));
    // Git bumps the revision but forgets sourceCommit: drift would read abc1234's (~0).
    let forgot = spec_with(serde_json::json!({"revision": rev('c')}));
    let d = run(&forgot, Some(&done.status), &obs(&["c1", "c2", "c3"]), 30);
    assert_eq!(d.status.current_revision, Some(rev('b')), "not started");
    let c = cond::find(&d.status.conditions, types::PROGRESSING).unwrap();
    assert_eq!(c.reason, reasons::SOURCE_COMMIT_UNCHANGED, "{}", c.message);
    assert!(
        d.event_reasons()
            .contains(&reasons::SOURCE_COMMIT_UNCHANGED)
    );
    // With the new commit it starts.
    let fixed = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
    let d = run(&fixed, Some(&d.status), &obs(&["c1", "c2", "c3"]), 31);
    assert_eq!(d.status.current_revision, Some(rev('c')));
    assert_eq!(d.status.source_commit.as_deref(), Some("cde5678"));
}

#[test]
fn the_controller_policy_and_the_generator_binding_are_checked() {
    let params = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let table = [
        (None, false),
        (Some(params(&[])), false),
        (Some(params(&[(CONTROLLER_POLICY_KEY, "sync")])), true),
        (
            Some(params(&[(CONTROLLER_POLICY_KEY, "create-delete")])),
            true,
        ),
        (
            Some(params(&[(CONTROLLER_POLICY_KEY, "create-update")])),
            false,
        ),
        (
            Some(params(&[(CONTROLLER_POLICY_KEY, "create-only")])),
            false,
        ),
        (
            Some(params(&[
                (CONTROLLER_POLICY_KEY, "sync"),
                (POLICY_OVERRIDE_KEY, "true"),
            ])),
            false,
        ),
        (
            Some(params(&[
                (CONTROLLER_POLICY_KEY, "sync"),
                (POLICY_OVERRIDE_KEY, "false"),
            ])),
            true,
        ),
    ];
    for (p, unsafe_) in table {
        assert_eq!(
            controller_policy_problem(p.as_ref()).is_some(),
            unsafe_,
            "{p:?}"
        );
    }
    assert!(
        binding_problem(&[], "eu").is_none(),
        "a label selector is not judged"
    );
    assert!(binding_problem(&["eu".into()], "eu").is_none());
    assert!(binding_problem(&["us".into()], "eu").is_some());

    // The WaveGate publishes nothing while the controller's policy would delete.
    let s = spec();
    let mut o = obs(&[]);
    o.controller_params = Some(params(&[(CONTROLLER_POLICY_KEY, "sync")]));
    let d = run(&s, None, &o, 0);
    assert!(d.status.decisions.is_empty(), "nothing published");
    let c = cond::find(&d.status.conditions, types::APPLICATION_SET_SAFE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reasons::APPLICATIONS_SYNC_UNSAFE)
    );
    let mut o = obs(&[]);
    o.decision_resources = vec!["other".into()];
    o.name = "eu".into();
    let d = run(&s, None, &o, 0);
    let c = cond::find(&d.status.conditions, types::APPLICATION_SET_SAFE).unwrap();
    assert_eq!(c.reason, reasons::NOT_THIS_WAVE_GATE, "{}", c.message);
}

#[test]
fn a_cluster_with_more_applications_than_a_pin_holds_gets_several_pins() {
    let s = spec();
    let mut o = obs(&["c1"]);
    let template = o
        .applications
        .iter()
        .find(|a| a.cluster == "c1")
        .unwrap()
        .clone();
    o.applications.retain(|a| a.cluster != "c1");
    for i in 0..(pins::MAX_TARGETS + 6) {
        let mut a = template.clone();
        a.name = format!("mesh-c1-{i:03}");
        o.applications.push(a);
    }
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let halted = run(&s, Some(&soaking()), &o, 15);
    let plans = pins_of(&halted);
    assert_eq!(plans.len(), 2, "no Application left out");
    assert_eq!(plans[0].applications.len(), pins::MAX_TARGETS);
    assert_eq!(plans[1].applications.len(), 6);
    assert_ne!(plans[0].name, plans[1].name);
    assert!(plans.iter().all(|p| p.cluster == "c1"));
}

#[test]
fn emergency_admits_every_wave_audited() {
    let s =
        spec_with(serde_json::json!({"emergency": {"revision": rev('b'), "reason": "CVE fix"}}));
    let d = run(&s, None, &obs(&[]), 0);
    assert_eq!(revisions(&d), on(&[("c1", "b"), ("c2", "b"), ("c3", "b")]));
    assert!(d.status.waves.iter().all(|w| w.state == WaveState::Skipped));
    assert_eq!(d.status.phase, WaveGatePhase::Complete);
    assert!(d.event_reasons().contains(&reasons::EMERGENCY));
    let last = d.status.history.last().unwrap();
    assert_eq!(last.outcome, Some(ChangeOutcome::Emergency));
    assert!(last.reason.as_deref().unwrap().contains("CVE fix"));
}

#[test]
fn an_emergency_for_another_revision_is_ignored() {
    // Argo CD keeps an action-written emergency across a Git sync that moves spec.revision:
    // the stale emergency must not skip the waves of the new revision.
    let s =
        spec_with(serde_json::json!({"emergency": {"revision": rev('a'), "reason": "CVE fix"}}));
    assert_eq!(s.revision, rev('b'));
    let d = run(&s, None, &obs(&[]), 0);
    assert_eq!(
        revisions(&d),
        on(&[("c1", "b"), ("c2", "a"), ("c3", "a")]),
        "only the first wave moves; the spec is not refused"
    );
    assert_ne!(d.status.phase, WaveGatePhase::Complete);
    assert!(!d.event_reasons().contains(&reasons::EMERGENCY));
    assert!(crate::validity::problems(&s, false).is_empty());
}

#[test]
fn cross_site_waits_table() {
    let s = spec_with(serde_json::json!({"waves": [
        {"name": "canary", "clusters": ["c1"], "soak": "10s"},
        {"name": "rest", "clusters": ["c2", "c3"], "soak": "10s", "waitFor": [{"site": "us", "wave": "canary"}]}
    ]}));
    let mut st = run(&s, None, &obs(&[]), 0).status;
    let mut o = obs(&["c1"]);
    st = run(&s, Some(&st), &o, 1).status;
    o.gates = all_gates(Verdict::Pass, 11);
    let d = run(&s, Some(&st), &o, 11);
    assert_eq!(d.status.waves[0].state, WaveState::Passed);
    assert_eq!(d.status.waves[1].state, WaveState::Waiting);
    assert_eq!(d.status.phase, WaveGatePhase::WaitingForSite);
    assert!(
        d.status.waves[1]
            .waiting_for
            .as_deref()
            .unwrap()
            .contains("site us past wave canary")
    );
    let waiting = d.status;
    // (name, spec, passed elsewhere, want state, want event)
    let released = {
        let mut r = s.clone();
        r.wait_releases = vec![sluice_api::v1alpha1::wave_gate::WaitRelease {
            site: "us".into(),
            revision: rev('b'),
            reason: "us partitioned; change approved".into(),
        }];
        r
    };
    let other_rev = {
        let mut r = released.clone();
        r.wait_releases[0].revision = rev('c');
        r
    };
    let cases = [
        ("still waiting", s.clone(), false, WaveState::Waiting, None),
        (
            "the other site passed",
            s.clone(),
            true,
            WaveState::Converging,
            None,
        ),
        (
            "released explicitly",
            released,
            false,
            WaveState::Converging,
            Some(reasons::WAIT_RELEASED),
        ),
        (
            "a release for another revision",
            other_rev,
            false,
            WaveState::Waiting,
            None,
        ),
    ];
    for (name, sp, passed, want, event) in cases {
        let mut o = obs(&["c1"]);
        if passed {
            o.passed_elsewhere.insert(("us".into(), "canary".into()));
        }
        let d = run(&sp, Some(&waiting), &o, 20);
        assert_eq!(d.status.waves[1].state, want, "{name}");
        if let Some(e) = event {
            assert!(d.event_reasons().contains(&e), "{name}");
            assert!(
                d.status
                    .history
                    .last()
                    .unwrap()
                    .reason
                    .as_deref()
                    .unwrap()
                    .contains("partitioned"),
                "{name}"
            );
        }
    }
}

#[test]
fn no_drift_exporter_converges_without_it_and_reports_the_gate_skipped() {
    let s = spec_with(serde_json::json!({"driftGate": {"exporter": "None"}}));
    let mut o = obs(&[]);
    o.drift.clear();
    let st = run(&s, None, &o, 0).status;
    let mut o = obs(&["c1"]);
    o.drift.clear();
    let d = run(&s, Some(&st), &o, 5);
    assert_eq!(d.status.waves[0].state, WaveState::Soaking);
    let c = cond::find(&d.status.conditions, conditions::DRIFT_SIGNAL).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reasons::DRIFT_EXPORTER_ABSENT)
    );
    o.gates = Some(vec![
        verdict("mesh-error-ratio", Verdict::Pass, 6),
        verdict("xds-nack-increase", Verdict::Pass, 6),
    ]);
    let d = run(&s, Some(&d.status), &o, 6);
    let skipped = d.status.waves[0]
        .gates
        .iter()
        .find(|g| g.gate == "proxies-behind")
        .unwrap();
    assert_eq!(skipped.reason, VerdictReason::Skipped);
    assert_eq!(
        skipped.verdict,
        Verdict::Inconclusive,
        "a missing signal is never a pass"
    );
}

#[test]
fn a_wave_added_to_the_spec_keeps_the_list_complete() {
    let s = spec();
    let st = run(&s, None, &obs(&[]), 0).status;
    let grown = spec_with(serde_json::json!({"waves": [
        {"name": "canary", "clusters": ["c1"], "soak": "10s"},
        {"name": "rest", "clusters": ["c2", "c3", "c4"], "soak": "10s"}
    ]}));
    let d = run(&grown, Some(&st), &obs(&[]), 1);
    assert_eq!(
        revisions(&d),
        on(&[("c1", "b"), ("c2", "a"), ("c3", "a"), ("c4", "a")]),
        "a new cluster runs the previous revision until its wave"
    );
}

#[test]
fn invalid_spec_publishes_nothing_new() {
    let s = spec_with(serde_json::json!({"convergenceTimeout": "0s"}));
    let d = run(&s, None, &obs(&[]), 0);
    assert_eq!(d.status.phase, WaveGatePhase::Refused);
    assert!(d.status.decisions.is_empty());
    assert_eq!(d.event_reasons(), vec![reasons::INVALID_SPEC]);
    assert_eq!(d.requeue, Requeue::AwaitChange);
}

#[test]
fn a_halts_pins_give_automation_back_when_the_decisions_go_back() {
    let s = spec();
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let halted = run(&s, Some(&soaking()), &o, 15);
    // The pin's deadline is the halt's pin wait: a pin still pinning when the decisions go
    // back has revert restore its Applications' sync policy at that moment.
    assert_eq!(pins_of(&halted)[0].deadline_seconds, 30);
    let name = pins_of(&halted)[0].name.clone();
    let mut o = obs(&["c1"]);
    o.existing_pins.insert(name.clone());
    o.pin_phases.insert(name, BundlePinPhase::Pinning);
    let late = run(&s, Some(&halted.status), &o, 15 + 31);
    assert_eq!(
        revisions(&late),
        on(&[("c1", "a"), ("c2", "a"), ("c3", "a")])
    );
    let note = &cond::find(&late.status.conditions, types::HALTED)
        .unwrap()
        .message;
    assert!(note.contains("revert gives automation back"), "{note}");
}

#[test]
fn a_new_revision_during_a_pending_halt_keeps_the_halts_timer() {
    let s = spec();
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let halted = run(&s, Some(&soaking()), &o, 15);
    let name = pins_of(&halted)[0].name.clone();
    let mut o = obs(&["c1"]);
    o.existing_pins.insert(name.clone());
    o.pin_phases.insert(name, BundlePinPhase::Pinning);
    // A forward fix is pushed while revert is still pinning (no supersedeHalted).
    let s2 = spec_with(serde_json::json!({"revision": rev('c'), "sourceCommit": "cde5678"}));
    let d = run(&s2, Some(&halted.status), &o, 16);
    assert!(
        matches!(d.requeue, Requeue::After(_)),
        "the pin wait must still fire: {:?}",
        d.requeue
    );
    let later = run(&s2, Some(&d.status), &o, 15 + 31);
    assert_eq!(
        revisions(&later),
        on(&[("c1", "a"), ("c2", "a"), ("c3", "a")]),
        "the fallback sets the decisions back"
    );
}

#[test]
fn the_same_revision_halting_again_gets_new_pins() {
    let s = spec();
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 15)]);
    let first = run(&s, Some(&soaking()), &o, 15);
    // The same change, halting again later (rolled out again after a supersede).
    let d0 = run(&s, None, &obs(&[]), 3600);
    let again = run(&s, Some(&d0.status), &obs(&["c1"]), 3610).status;
    let mut o = obs(&["c1"]);
    o.gates = Some(vec![verdict("mesh-error-ratio", Verdict::Fail, 3615)]);
    let second = run(&s, Some(&again), &o, 3615);
    assert_ne!(
        pins_of(&first)[0].name,
        pins_of(&second)[0].name,
        "an old (maybe Released) pin is never taken for this halt's"
    );
}
