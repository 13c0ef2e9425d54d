use super::*;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    GateVerdict, RolloutPhase, RolloutSpec, RolloutStatus, Verdict,
    bundle_pin::FIELD_MANAGER as REVERT_FIELD_MANAGER,
    rollout::{
        AbortReason, AbortStatus, OwnedRouteStatus, RouteKindName, StepRecord, conditions, reasons,
    },
};
use sluice_runtime::{conditions as cond, events::Announces};

use crate::route_edit::Desired;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec() -> RolloutSpec {
    serde_json::from_value(serde_json::json!({
        "routeRef": {"name": "checkout"},
        "stableService": {"name": "v1"},
        "canaryService": {"name": "v2"},
        "canaryWorkload": {"name": "v2"},
        "analysisInterval": "1s",
        "steps": [{"mirror": {"duration": "2s"}}, {"setWeight": {"weight": 5, "duration": "2s"}}, {"promote": {}}]
    }))
    .unwrap()
}

fn route(w: u32, mirror: bool) -> RouteObs {
    RouteObs::Present(RouteState {
        resource_version: Some("1".into()),
        owner: Some("shop/checkout".into()),
        me: "shop/checkout".into(),
        canary_weight: w,
        mirror,
        ..RouteState::default()
    })
}

fn writes(d: &Decision) -> Vec<u32> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::WriteRoute(d) => Some(d.weight),
            _ => None,
        })
        .collect()
}

#[test]
fn no_weight_before_ready_then_mirror_then_share_then_abort_on_fail() {
    let s = spec();
    let mut obs = Observations {
        route: route(0, false),
        canary_ready: Some(false),
        ..Default::default()
    };
    let d = step(&s, RolloutStatus::default(), &obs, t(0));
    assert_eq!(d.status.phase, RolloutPhase::WaitingForCanary);
    assert_eq!(writes(&d), vec![0], "ownership taken at weight 0");
    obs.canary_ready = Some(true);
    let d = step(&s, d.status, &obs, t(1));
    assert_eq!(d.status.current_step_index, Some(0));
    assert!(d.status.mirror_active);
    obs.route = route(0, true);
    let d = step(&s, d.status, &obs, t(4));
    assert_eq!(d.status.current_step_index, Some(1), "mirror step elapsed");
    assert_eq!(d.status.desired_weight, Some(5));
    assert!(
        !d.status.mirror_active,
        "mirror ends at the first weight step"
    );
    // Share not yet applied.
    obs.route = route(5, false);
    let fail = GateVerdict {
        gate: "error-ratio".into(),
        verdict: Verdict::Fail,
        reason: sluice_api::v1alpha1::VerdictReason::ThresholdBreached,
        message: None,
        value: Some(0.023),
        baseline: Some(0.01),
        threshold: Some(0.015),
        samples: Some(1000),
        min_samples: Some(100),
        consecutive_failures: 1,
        inconclusive_since: None,
        evaluated_at: Time(t(5)),
    };
    obs.gates = vec![(fail.clone(), GateAction::Abort)];
    obs.applied_share = Some(1.0);
    // A Fail needs no confirmed share: failing is the safe direction.
    let early = step(&s, d.status.clone(), &obs, t(5));
    assert_eq!(
        early.status.phase,
        RolloutPhase::Aborted,
        "judged from the first second"
    );
    // Without a Fail, the step is never judged on the written weight.
    obs.gates.clear();
    let d = step(&s, d.status, &obs, t(5));
    assert_eq!(
        d.status.phase,
        RolloutPhase::Progressing,
        "never judged on the written weight"
    );
    assert!(
        d.status
            .history
            .last()
            .unwrap()
            .share_confirmed_at
            .is_none()
    );
    obs.applied_share = Some(5.3);
    obs.gates.clear();
    let d = step(&s, d.status, &obs, t(6));
    assert!(
        d.status
            .history
            .last()
            .unwrap()
            .share_confirmed_at
            .is_some()
    );
    let mut f = fail;
    f.evaluated_at = Time(t(7));
    obs.gates = vec![(f, GateAction::Abort)];
    let d = step(&s, d.status, &obs, t(7));
    assert_eq!(d.status.phase, RolloutPhase::Aborted);
    assert_eq!(writes(&d), vec![0], "abort writes weight 0 once");
    let a = d.status.abort.clone().unwrap();
    assert_eq!(a.reason, AbortReason::GateFailed);
    obs.route = route(0, false);
    obs.gates.clear();
    obs.applied_share = Some(0.1);
    let d2 = step(&s, d.status.clone(), &obs, t(8));
    assert!(
        d2.status
            .abort
            .as_ref()
            .unwrap()
            .route_reverted_at
            .is_some()
    );
    let d3 = step(&s, d2.status, &obs, t(9));
    assert!(
        d3.status.abort.unwrap().revert_verified_at.is_some(),
        "share ~0 verified"
    );
    // A restarted operator with the same status decides the same.
    assert_eq!(
        step(&s, d.status.clone(), &obs, t(8)).status.phase,
        RolloutPhase::Aborted
    );
}

#[test]
fn kept_cohort_counts_in_the_expected_share() {
    let with = |keep: bool| -> RolloutSpec {
        serde_json::from_value(serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "keepCohort": keep,
            "steps": [
                {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "2s"}},
                {"setWeight": {"weight": 10}}
            ]
        }))
        .unwrap()
    };
    // The cohort step records the share it measured.
    let obs = Observations {
        route: route(0, false),
        canary_ready: Some(true),
        applied_share: Some(2.0),
        ..Default::default()
    };
    let st = RolloutStatus {
        phase: RolloutPhase::Progressing,
        current_step_index: Some(0),
        current_step_started_at: Some(Time(t(0))),
        ..Default::default()
    };
    let d = step(&with(true), st, &obs, t(1));
    assert_eq!(d.status.cohort_share, Some(2.0));
    let table = [
        ("kept cohort measured", true, Some(2.0), 2.0 + 98.0 * 0.1),
        ("kept cohort not measured", true, None, 10.0),
        ("cohort ends at the weight step", false, Some(2.0), 10.0),
    ];
    for (name, keep, share, want) in table {
        let st = RolloutStatus {
            cohort_share: share,
            ..Default::default()
        };
        let got = expected_share(&with(keep), &st, 1);
        assert!((got - want).abs() < 1e-9, "{name}: {got} != {want}");
    }
}

#[test]
fn a_bundle_pin_that_leaves_the_weights_equal_still_stops_the_rollout() {
    let s = spec();
    let st = RolloutStatus {
        phase: RolloutPhase::Progressing,
        current_step_index: Some(1),
        desired_weight: Some(5),
        owned_route: Some(OwnedRouteStatus {
            last_written_resource_version: Some("1".into()),
            written_weight: Some(5),
            ..Default::default()
        }),
        ..Default::default()
    };
    let RouteObs::Present(mut r) = route(5, false) else {
        unreachable!()
    };
    r.resource_version = Some("2".into());
    r.last_writer = Some(REVERT_FIELD_MANAGER.into());
    let obs = Observations {
        route: RouteObs::Present(r),
        ..Default::default()
    };
    let d = step(&s, st, &obs, t(0));
    assert_eq!(
        d.status.abort.as_ref().map(|a| a.reason),
        Some(AbortReason::PinnedByBundlePin)
    );
    assert!(writes(&d).is_empty(), "never writes over the pin");
}

#[test]
fn bundle_pin_rewrite_aborts_and_stops() {
    let s = spec();
    let st = RolloutStatus {
        phase: RolloutPhase::Progressing,
        current_step_index: Some(1),
        owned_route: Some(OwnedRouteStatus {
            last_written_resource_version: Some("1".into()),
            written_weight: Some(5),
            ..Default::default()
        }),
        ..Default::default()
    };
    let RouteObs::Present(mut r) = route(0, false) else {
        unreachable!()
    };
    r.resource_version = Some("2".into());
    r.last_writer = Some(REVERT_FIELD_MANAGER.into());
    let obs = Observations {
        route: RouteObs::Present(r),
        canary_ready: Some(true),
        ..Default::default()
    };
    let d = step(&s, st, &obs, t(0));
    assert_eq!(
        d.status.abort.as_ref().unwrap().reason,
        AbortReason::PinnedByBundlePin
    );
    assert!(writes(&d).is_empty(), "never fights the pin");
}

#[test]
fn controls_table() {
    let progressing = |idx: u32| RolloutStatus {
        phase: RolloutPhase::Progressing,
        current_step_index: Some(idx),
        current_step_started_at: Some(Time(t(0))),
        ..Default::default()
    };
    let aborted = RolloutStatus {
        phase: RolloutPhase::Aborted,
        abort: Some(AbortStatus {
            reason: AbortReason::Manual,
            message: None,
            gate: None,
            step_index: Some(1),
            first_failed_at: None,
            decided_at: Time(t(0)),
            route_reverted_at: Some(Time(t(0))),
            revert_verified_at: None,
        }),
        abort_detect_to_revert_ms: Some(812),
        ..Default::default()
    };
    let with = |patch: serde_json::Value| {
        let mut v = serde_json::to_value(spec()).unwrap();
        for (k, x) in patch.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value::<RolloutSpec>(v).unwrap()
    };
    type Row = (
        &'static str,
        RolloutSpec,
        RolloutStatus,
        i64,
        RolloutPhase,
        Option<u32>,
    );
    let table: Vec<Row> = vec![
        (
            "manual abort",
            with(serde_json::json!({"abort": true})),
            progressing(1),
            1,
            RolloutPhase::Aborted,
            Some(0),
        ),
        (
            "paused holds the weight",
            with(serde_json::json!({"paused": true})),
            progressing(1),
            1,
            RolloutPhase::Paused,
            Some(5),
        ),
        (
            "promoteFull",
            with(serde_json::json!({"promoteFull": true})),
            progressing(1),
            1,
            RolloutPhase::Promoted,
            Some(100),
        ),
        (
            "promoteThroughStep skips analysis",
            with(serde_json::json!({"promoteThroughStep": 1})),
            progressing(1),
            1,
            RolloutPhase::Promoted,
            Some(100),
        ),
        (
            "share reported wrong past the deadline: abort",
            with(serde_json::json!({"appliedShareDeadline": "3s"})),
            RolloutStatus {
                applied_share: Some(2.0),
                applied_share_observed_at: Some(Time(t(4))),
                ..progressing(1)
            },
            4,
            RolloutPhase::Aborted,
            Some(0),
        ),
        (
            "no share data past the deadline (metrics outage): held, never aborted",
            with(serde_json::json!({"appliedShareDeadline": "3s"})),
            progressing(1),
            4,
            RolloutPhase::Paused,
            Some(5),
        ),
        (
            "share not yet applied: hold",
            spec(),
            progressing(1),
            2,
            RolloutPhase::Progressing,
            Some(5),
        ),
        (
            "retry restarts",
            with(serde_json::json!({"retry": 1})),
            aborted.clone(),
            1,
            RolloutPhase::Progressing,
            Some(0),
        ),
        (
            "aborted stays aborted",
            spec(),
            aborted,
            1,
            RolloutPhase::Aborted,
            Some(0),
        ),
    ];
    for (name, s, st, now, phase, weight) in table {
        let obs = Observations {
            route: route(5, false),
            canary_ready: Some(true),
            ..Default::default()
        };
        let d = step(&s, st, &obs, t(now));
        assert_eq!(d.status.phase, phase, "{name}");
        assert_eq!(d.status.desired_weight, weight, "{name}");
        // The millisecond figure lives exactly as long as the revert it measures.
        let reverted = d
            .status
            .abort
            .as_ref()
            .is_some_and(|a| a.route_reverted_at.is_some());
        assert_eq!(
            d.status.abort_detect_to_revert_ms.is_some(),
            reverted,
            "{name}: abortDetectToRevertMs {:?} with abort {:?}",
            d.status.abort_detect_to_revert_ms,
            d.status.abort
        );
    }
}

fn verdict(gate: &str, verdict: Verdict, at: i64) -> GateVerdict {
    GateVerdict {
        gate: gate.into(),
        verdict,
        reason: if verdict == Verdict::Fail {
            sluice_api::v1alpha1::VerdictReason::ThresholdBreached
        } else {
            sluice_api::v1alpha1::VerdictReason::TooFewSamples
        },
        message: None,
        value: Some(0.046),
        baseline: Some(0.02),
        threshold: Some(0.03),
        samples: Some(1000),
        min_samples: Some(100),
        consecutive_failures: u32::from(verdict == Verdict::Fail) * 2,
        inconclusive_since: (verdict == Verdict::Inconclusive).then(|| Time(t(0))),
        evaluated_at: Time(t(at)),
    }
}

/// A Rollout in step `index` since t(0), with what the route carries in that step.
fn live(s: &RolloutSpec, index: u32, phase: RolloutPhase, confirmed: bool) -> RolloutStatus {
    let d = desired_at(s, index as usize);
    let kind = s.steps[index as usize].kind().unwrap();
    RolloutStatus {
        phase,
        current_step_index: Some(index),
        current_step_started_at: Some(Time(t(0))),
        desired_weight: Some(d.weight),
        cohort_active: d.cohort.is_some(),
        mirror_active: d.mirror.is_some(),
        owned_route: Some(OwnedRouteStatus {
            written_weight: Some(d.weight),
            owned_since: Some(Time(t(0))),
            ..Default::default()
        }),
        history: vec![StepRecord {
            index,
            kind,
            weight: Some(d.weight),
            started_at: Time(t(0)),
            share_confirmed_at: confirmed.then(|| Time(t(0))),
            finished_at: None,
            outcome: None,
        }],
        ..Default::default()
    }
}

fn live_route(s: &RolloutSpec, st: &RolloutStatus) -> RouteObs {
    let d = desired_at(s, st.current_step_index.unwrap_or(0) as usize);
    RouteObs::Present(RouteState {
        resource_version: Some("1".into()),
        owner: Some("shop/checkout".into()),
        me: "shop/checkout".into(),
        canary_weight: d.weight,
        cohort: d.cohort.is_some(),
        mirror: d.mirror.is_some(),
        ..RouteState::default()
    })
}

fn held_spec(pause: serde_json::Value, patch: serde_json::Value) -> RolloutSpec {
    let mut v = serde_json::json!({
        "routeRef": {"name": "checkout"},
        "stableService": {"name": "v1"},
        "canaryService": {"name": "v2"},
        "canaryWorkload": {"name": "v2"},
        "analysisInterval": "30s",
        "steps": [
            {"mirror": {"duration": "10m"}},
            {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "10m"}},
            {"setWeight": {"weight": 1, "duration": "10m"}},
            {"pause": pause},
            {"setWeight": {"weight": 50}},
            {"promote": {}}
        ]
    });
    for (k, x) in patch.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::from_value(v).unwrap()
}

/// Every state in which the canary receives traffic, held or not: (name, spec, status).
fn live_states() -> Vec<(&'static str, RolloutSpec, RolloutStatus)> {
    use RolloutPhase::*;
    let until = serde_json::json!({"untilPromoted": true});
    let timed = serde_json::json!({"duration": "1h"});
    let plain = held_spec(until.clone(), serde_json::json!({}));
    let paused = held_spec(until.clone(), serde_json::json!({"paused": true}));
    let timed_spec = held_spec(timed, serde_json::json!({}));
    vec![
        (
            "mirror step",
            plain.clone(),
            live(&plain, 0, Progressing, false),
        ),
        (
            "cohort step",
            plain.clone(),
            live(&plain, 1, Progressing, false),
        ),
        (
            "weight step, first second, share not confirmed",
            plain.clone(),
            live(&plain, 2, Progressing, false),
        ),
        (
            "weight step, share confirmed",
            plain.clone(),
            live(&plain, 2, Progressing, true),
        ),
        (
            "pause untilPromoted at 1%",
            plain.clone(),
            live(&plain, 3, Paused, false),
        ),
        (
            "timed pause at 1%",
            timed_spec.clone(),
            live(&timed_spec, 3, Paused, false),
        ),
        (
            "spec.paused at 1%",
            paused.clone(),
            live(&paused, 2, Paused, true),
        ),
        (
            "spec.paused at 1%, share not confirmed",
            paused.clone(),
            live(&paused, 2, Progressing, false),
        ),
        (
            "spec.paused in the mirror step",
            paused.clone(),
            live(&paused, 0, Paused, false),
        ),
    ]
}

#[test]
fn a_fail_aborts_in_every_state_the_canary_receives_traffic() {
    for (name, s, st) in live_states() {
        let obs = Observations {
            route: live_route(&s, &st),
            gates: vec![(verdict("error-ratio", Verdict::Fail, 60), GateAction::Abort)],
            applied_share: Some(0.9),
            ..Default::default()
        };
        let d = step(&s, st, &obs, t(60));
        assert_eq!(d.status.phase, RolloutPhase::Aborted, "{name}");
        assert_eq!(writes(&d), vec![0], "{name}: one write, canary 0");
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::WriteRoute(w) if *w == Desired::abort())),
            "{name}: cohort and mirror removed in the same write"
        );
        let a = d.status.abort.as_ref().unwrap();
        assert_eq!(a.reason, AbortReason::GateFailed, "{name}");
        assert_eq!(a.gate.as_ref().unwrap().gate, "error-ratio", "{name}");
        assert_eq!(
            a.decided_at,
            Time(t(60)),
            "{name}: decided on the verdict's tick"
        );
    }
}

#[test]
fn without_a_fail_a_held_canary_stays_held_and_keeps_its_verdicts() {
    for (name, s, st) in live_states() {
        let before = (st.phase, st.current_step_index, st.desired_weight);
        let obs = Observations {
            route: live_route(&s, &st),
            gates: vec![
                (
                    verdict("error-ratio", Verdict::Pass, 60),
                    GateAction::Proceed,
                ),
                // An Inconclusive whose policy says Abort applies only to a confirmed weight
                // step; a hold never aborts on missing data.
                (
                    verdict("latency-p99", Verdict::Inconclusive, 60),
                    GateAction::Abort,
                ),
            ],
            applied_share: Some(0.9),
            ..Default::default()
        };
        let d = step(&s, st, &obs, t(60));
        if name == "weight step, share confirmed" {
            assert_eq!(
                d.status.phase,
                RolloutPhase::Aborted,
                "{name}: policy Abort"
            );
            continue;
        }
        assert_ne!(d.status.phase, RolloutPhase::Aborted, "{name}");
        assert_eq!(
            (d.status.current_step_index, d.status.desired_weight),
            (before.1, before.2),
            "{name}: no step advanced"
        );
        assert_eq!(d.status.gates.len(), 2, "{name}: verdicts recorded");
        assert_eq!(d.status.applied_share, Some(0.9), "{name}: share recorded");
    }
}

fn kinds(d: &Decision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::WriteRoute(w) => Some(format!("write {}", w.weight)),
            Action::HandBack => Some("hand back".into()),
            Action::Release {
                kind, route, abort, ..
            } => Some(format!(
                "release {} {route}{}",
                kind.as_str(),
                if *abort { "" } else { " as promoted" }
            )),
            Action::Event(_) => None,
        })
        .collect()
}

#[test]
fn a_retry_starts_clean_and_works_after_a_released_pin() {
    use RolloutPhase::*;
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({"retry": 1}),
    );
    let mut st = live(&s, 2, Aborted, true);
    st.abort = Some(AbortStatus {
        reason: AbortReason::PinnedByBundlePin,
        message: None,
        gate: None,
        step_index: Some(2),
        first_failed_at: None,
        decided_at: Time(t(0)),
        route_reverted_at: None,
        revert_verified_at: None,
    });
    st.cohort_share = Some(4.0);
    st.applied_share = Some(1.1);
    st.gates = vec![verdict("error-ratio", Verdict::Pass, 30)];
    if let Some(o) = st.owned_route.as_mut() {
        o.last_written_resource_version = Some("1".into());
    }
    let route = |writer: &str| {
        let RouteObs::Present(mut r) = live_route(&s, &st) else {
            unreachable!()
        };
        r.resource_version = Some("7".into());
        r.canary_weight = 0;
        r.last_writer = Some(writer.into());
        RouteObs::Present(r)
    };
    // While revert holds the route, the pin wins and the retry waits.
    let obs = Observations {
        route: route(REVERT_FIELD_MANAGER),
        ..Default::default()
    };
    let d = step(&s, st.clone(), &obs, t(600));
    assert_eq!(d.status.phase, Aborted);
    assert_eq!(d.status.retries_handled, 0);
    // Released (Argo CD wrote the rules last): the retry starts over, clean.
    let obs = Observations {
        route: route("argocd-controller"),
        canary_ready: Some(true),
        ..Default::default()
    };
    let d = step(&s, st, &obs, t(600));
    assert_ne!(d.status.phase, Aborted, "{:?}", d.status.abort);
    assert_eq!(d.status.retries_handled, 1);
    assert!(d.status.abort.is_none());
    assert_eq!(d.status.cohort_share, None);
    assert!(
        d.status.gates.iter().all(|g| g.evaluated_at.0 >= t(600)),
        "{:?}",
        d.status.gates
    );
    assert_eq!(
        d.status
            .owned_route
            .as_ref()
            .and_then(|o| o.last_written_resource_version.as_deref()),
        Some("7")
    );
}

#[test]
fn deleting_before_promotion_aborts_then_hands_back() {
    use RolloutPhase::*;
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    let mut pinned = live(&s, 2, Aborted, true);
    pinned.abort = Some(AbortStatus {
        reason: AbortReason::PinnedByBundlePin,
        message: None,
        gate: None,
        step_index: Some(2),
        first_failed_at: None,
        decided_at: Time(t(0)),
        route_reverted_at: None,
        revert_verified_at: None,
    });
    let mut promoted = live(&s, 5, Promoted, true);
    promoted.desired_weight = Some(100);
    let table = [
        (
            "mirror step",
            live(&s, 0, Progressing, false),
            vec!["write 0", "hand back"],
        ),
        (
            "cohort step",
            live(&s, 1, Progressing, false),
            vec!["write 0", "hand back"],
        ),
        (
            "1%",
            live(&s, 2, Progressing, true),
            vec!["write 0", "hand back"],
        ),
        (
            "paused at 1%",
            live(&s, 3, Paused, true),
            vec!["write 0", "hand back"],
        ),
        (
            "promoted: the canary is the new stable",
            promoted,
            vec!["hand back"],
        ),
        ("pinned: the route is the pin's", pinned, vec!["hand back"]),
    ];
    for (name, st, want) in table {
        let mut obs = Observations {
            route: live_route(&s, &st),
            deleting: true,
            ..Default::default()
        };
        if name.starts_with("promoted")
            && let RouteObs::Present(r) = &mut obs.route
        {
            r.canary_weight = 100;
        }
        let d = step(&s, st, &obs, t(60));
        assert_eq!(kinds(&d), want, "{name}");
    }
    // Already at 0 with no extra rules: nothing to abort.
    let st = live(&s, 2, Aborted, true);
    let obs = Observations {
        route: route(0, false),
        deleting: true,
        ..Default::default()
    };
    assert_eq!(kinds(&step(&s, st, &obs, t(60))), vec!["hand back"]);
}

#[test]
fn a_route_the_steps_do_not_fit_never_blocks_abort_or_hand_back() {
    use RolloutPhase::*;
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    let st = live(&s, 3, Paused, true);
    let RouteObs::Present(state) = live_route(&s, &st) else {
        unreachable!()
    };
    let unusable = |state: Option<RouteState>| RouteObs::Unusable {
        reason: reasons::ROUTE_FULL,
        message: "step 0: no room for the mirror rule".into(),
        state,
    };
    let fail = vec![(verdict("error-ratio", Verdict::Fail, 60), GateAction::Abort)];
    let pass = vec![(
        verdict("error-ratio", Verdict::Pass, 60),
        GateAction::Proceed,
    )];
    let with_abort = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({"abort": true}),
    );
    type Row = (
        &'static str,
        RolloutSpec,
        RouteObs,
        bool,
        Vec<(GateVerdict, GateAction)>,
        Vec<&'static str>,
        RolloutPhase,
    );
    let table: Vec<Row> = vec![
        (
            "held, judged, no Fail: nothing written",
            s.clone(),
            unusable(Some(state.clone())),
            false,
            pass,
            vec![],
            Paused,
        ),
        (
            "a Fail aborts",
            s.clone(),
            unusable(Some(state.clone())),
            false,
            fail.clone(),
            vec!["write 0"],
            Aborted,
        ),
        (
            "spec.abort aborts",
            with_abort,
            unusable(Some(state.clone())),
            false,
            vec![],
            vec!["write 0"],
            Aborted,
        ),
        (
            "deleted: abort, then hand back",
            s.clone(),
            unusable(Some(state)),
            true,
            vec![],
            vec!["write 0", "hand back"],
            Paused,
        ),
        (
            "deleted, parts unreadable: hand back",
            s.clone(),
            unusable(None),
            true,
            vec![],
            vec!["hand back"],
            Paused,
        ),
    ];
    for (name, spec, route, deleting, gates, want, phase) in table {
        let obs = Observations {
            route,
            deleting,
            gates,
            ..Default::default()
        };
        let d = step(&spec, st.clone(), &obs, t(60));
        assert_eq!(kinds(&d), want, "{name}");
        assert_eq!(d.status.phase, phase, "{name}");
        let owned = cond::find(&d.status.conditions, conditions::ROUTE_OWNED).unwrap();
        assert_eq!(
            (owned.status.as_str(), owned.reason.as_str()),
            ("False", reasons::ROUTE_FULL),
            "{name}: the refusal stays reported"
        );
    }
}

#[test]
fn a_missing_canary_service_holds_at_zero_and_the_step_starts_over() {
    let s = spec();
    // Before any live weight: the canary waits for its Service as for its readiness.
    let waiting = RolloutStatus {
        phase: RolloutPhase::WaitingForCanary,
        owned_route: Some(OwnedRouteStatus {
            owned_since: Some(Time(t(0))),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut obs = Observations {
        route: route(0, false),
        canary_ready: Some(true),
        canary_service: Some(false),
        ..Default::default()
    };
    let d = step(&s, waiting, &obs, t(1));
    assert_eq!(d.status.phase, RolloutPhase::WaitingForCanary);
    assert_eq!(writes(&d), vec![0]);
    // Mid-rollout at 5%, share confirmed: the Service goes away.
    let st = live(&s, 1, RolloutPhase::Progressing, true);
    obs.route = route(5, false);
    obs.canary_ready = None;
    let d = step(&s, st, &obs, t(120));
    assert_eq!(d.status.phase, RolloutPhase::Paused, "held, not aborted");
    assert_eq!(writes(&d), vec![0], "no request goes to a missing backend");
    assert!(d.status.abort.is_none());
    assert!(
        d.status
            .history
            .last()
            .unwrap()
            .share_confirmed_at
            .is_none()
    );
    let c = cond::find(&d.status.conditions, conditions::CANARY_READY).unwrap();
    assert_eq!(c.reason, reasons::CANARY_SERVICE_MISSING);
    // Long past every deadline, still held.
    obs.route = route(0, false);
    let d = step(&s, d.status, &obs, t(3_600));
    assert_eq!(
        (d.status.phase, writes(&d)),
        (RolloutPhase::Paused, vec![0])
    );
    // The Service is back: the step starts over at its weight, judged on the share again.
    obs.canary_service = Some(true);
    let d = step(&s, d.status, &obs, t(3_601));
    assert_eq!(writes(&d), vec![5]);
    assert_eq!(d.status.current_step_index, Some(1));
    assert_eq!(d.status.current_step_started_at, Some(Time(t(3_600))));
    assert!(d.status.abort.is_none());
}

#[test]
fn new_steps_restart_at_the_step_matching_the_weight_never_further() {
    use RolloutPhase::*;
    let old = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    let with_steps = |steps: serde_json::Value| {
        let mut v = serde_json::to_value(&old).unwrap();
        v["steps"] = steps;
        serde_json::from_value::<RolloutSpec>(v).unwrap()
    };
    let hashed = |mut st: RolloutStatus| {
        st.steps_hash = Some(crate::observe::steps_hash(&old));
        st
    };
    let mut at_fifty = live(&old, 4, Progressing, true);
    at_fifty.desired_weight = Some(50);
    type Row = (
        &'static str,
        RolloutSpec,
        RolloutStatus,
        Option<u32>,
        u32,
        RolloutPhase,
    );
    let table: Vec<Row> = vec![
        (
            "unchanged steps: nothing restarts",
            old.clone(),
            hashed(live(&old, 3, Paused, false)),
            Some(3),
            1,
            Paused,
        ),
        (
            "list shrunk below the index: restart at the 1% step, not promoted",
            with_steps(serde_json::json!([{"setWeight": {"weight": 1}}, {"promote": {}}])),
            hashed(live(&old, 3, Paused, false)),
            Some(0),
            1,
            Progressing,
        ),
        (
            "no step at 50%: the last weight step below it",
            with_steps(
                serde_json::json!([{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 25}}, {"promote": {}}]),
            ),
            hashed(at_fifty),
            Some(1),
            25,
            Progressing,
        ),
        (
            "nothing at or below the weight: from step 0",
            with_steps(
                serde_json::json!([{"mirror": {"duration": "1m"}}, {"setWeight": {"weight": 10}}, {"promote": {}}]),
            ),
            hashed(live(&old, 2, Progressing, true)),
            Some(0),
            0,
            Progressing,
        ),
        (
            "a status from before the hash: adopted, nothing restarts",
            with_steps(serde_json::json!([{"setWeight": {"weight": 1}}, {"promote": {}}])),
            live(&old, 0, Progressing, false),
            Some(0),
            1,
            Progressing,
        ),
    ];
    for (name, spec, st, index, weight, phase) in table {
        let obs = Observations {
            route: live_route(&old, &st),
            ..Default::default()
        };
        let d = step(&spec, st, &obs, t(60));
        assert_eq!(d.status.current_step_index, index, "{name}");
        assert_eq!(d.status.desired_weight, Some(weight), "{name}");
        assert_eq!(d.status.phase, phase, "{name}");
        assert!(!writes(&d).contains(&100), "{name}: never straight to 100%");
        assert_eq!(
            d.status.steps_hash,
            Some(crate::observe::steps_hash(&spec)),
            "{name}"
        );
    }
}

#[test]
fn a_new_canary_version_restarts_from_step_zero_at_weight_zero() {
    use RolloutPhase::*;
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    let versioned = |mut st: RolloutStatus| {
        st.canary_version = Some("aaaa".into());
        st.steps_hash = Some(crate::observe::steps_hash(&s));
        st
    };
    let mut promoted = live(&s, 5, Promoted, true);
    promoted.desired_weight = Some(100);
    promoted.promoted_at = Some(Time(t(0)));
    for (name, st) in [
        ("paused at 1%", versioned(live(&s, 3, Paused, false))),
        ("weight step", versioned(live(&s, 2, Progressing, true))),
        ("promoted", versioned(promoted)),
    ] {
        let mut obs = Observations {
            route: live_route(&s, &st),
            canary_ready: Some(false),
            canary_version: Some("aaaa".into()),
            ..Default::default()
        };
        let same = step(&s, st.clone(), &obs, t(3_600));
        assert_eq!(
            same.status.phase, st.phase,
            "{name}: same version, nothing restarts"
        );
        obs.canary_version = Some("bbbb".into());
        let d = step(&s, st, &obs, t(3_600));
        assert_eq!(d.status.phase, WaitingForCanary, "{name}");
        assert_eq!(writes(&d), vec![0], "{name}: canary weight 0 at once");
        assert_eq!(d.status.current_step_index, None, "{name}");
        assert!(d.status.promoted_at.is_none(), "{name}");
        assert!(d.status.abort.is_none(), "{name}");
        // Still rolling out, long after ownership was taken: the ready deadline counts from
        // the new version, so it waits rather than aborts.
        let d = step(&s, d.status, &obs, t(3_700));
        assert_eq!(d.status.phase, WaitingForCanary, "{name}");
        // Ready: the new version is judged from step 0.
        obs.canary_ready = Some(true);
        let d = step(&s, d.status, &obs, t(3_800));
        assert_eq!(d.status.current_step_index, Some(0), "{name}");
        assert_eq!(d.status.canary_version.as_deref(), Some("bbbb"), "{name}");
    }
}

#[test]
fn a_sustained_inconclusive_under_continue_lets_the_step_complete() {
    use RolloutPhase::*;
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    // The 1% step (10 minutes) is over; one gate has no data for long enough.
    let st = live(&s, 2, Progressing, true);
    let gates = |act| {
        vec![
            (
                verdict("error-ratio", Verdict::Pass, 900),
                GateAction::Proceed,
            ),
            (
                verdict("applied-share", Verdict::Pass, 900),
                GateAction::Proceed,
            ),
            (verdict("latency-p99", Verdict::Inconclusive, 900), act),
        ]
    };
    for (name, act, want_index) in [
        (
            "policy Continue: the gate counts as passed",
            GateAction::Proceed,
            Some(3),
        ),
        (
            "still within its wait: the step waits",
            GateAction::Wait,
            Some(2),
        ),
    ] {
        let obs = Observations {
            route: live_route(&s, &st),
            gates: gates(act),
            applied_share: Some(1.0),
            ..Default::default()
        };
        let d = step(&s, st.clone(), &obs, t(900));
        assert_eq!(d.status.current_step_index, want_index, "{name}");
        assert_ne!(d.status.phase, Aborted, "{name}");
    }
}

#[test]
fn a_new_route_or_service_releases_the_old_route_before_starting_over() {
    use RolloutPhase::*;
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    let with =
        |patch: serde_json::Value| held_spec(serde_json::json!({"untilPromoted": true}), patch);
    let mut st = live(&s, 2, Progressing, true);
    if let Some(o) = st.owned_route.as_mut() {
        o.name = "checkout".into();
        o.kind = Some(RouteKindName::HttpRoute);
        o.stable_service = Some("v1".into());
        o.canary_service = Some("v2".into());
    }
    let mut unrecorded = st.clone();
    if let Some(o) = unrecorded.owned_route.as_mut() {
        o.kind = None;
        o.stable_service = None;
        o.canary_service = None;
    }
    type Row = (
        &'static str,
        RolloutSpec,
        RolloutStatus,
        bool,
        Vec<&'static str>,
        RolloutPhase,
    );
    let table: Vec<Row> = vec![
        (
            "unchanged",
            s.clone(),
            st.clone(),
            false,
            vec![],
            Progressing,
        ),
        (
            "new canary Service",
            with(serde_json::json!({"canaryService": {"name": "v3"}})),
            st.clone(),
            false,
            vec!["release HTTPRoute checkout"],
            Pending,
        ),
        (
            "new stable Service",
            with(serde_json::json!({"stableService": {"name": "v0"}})),
            st.clone(),
            false,
            vec!["release HTTPRoute checkout"],
            Pending,
        ),
        (
            "new route",
            with(serde_json::json!({"routeRef": {"name": "checkout-b"}})),
            st.clone(),
            false,
            vec!["release HTTPRoute checkout"],
            Pending,
        ),
        (
            "deleted after the edit: only the old route is released",
            with(serde_json::json!({"routeRef": {"name": "checkout-b"}})),
            st.clone(),
            true,
            vec!["release HTTPRoute checkout"],
            Progressing,
        ),
        (
            "same name, new kind",
            with(serde_json::json!({"routeRef": {"name": "checkout", "kind": "GRPCRoute"}})),
            st.clone(),
            false,
            vec!["release HTTPRoute checkout"],
            Pending,
        ),
        (
            "status from before the Services were recorded",
            with(serde_json::json!({"canaryService": {"name": "v3"}})),
            unrecorded,
            false,
            vec![],
            Progressing,
        ),
    ];
    for (name, spec, st, deleting, want, phase) in table {
        let obs = Observations {
            route: live_route(&s, &st),
            deleting,
            ..Default::default()
        };
        let d = step(&spec, st, &obs, t(60));
        let got = kinds(&d);
        let got: Vec<&str> = got
            .iter()
            .map(String::as_str)
            .filter(|k| k.starts_with("release") || want.is_empty() && k.starts_with("hand"))
            .collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(d.status.phase, phase, "{name}");
        if phase == Pending {
            assert!(
                writes(&d).is_empty(),
                "{name}: nothing written to the new route yet"
            );
            assert!(d.status.abort.is_none(), "{name}");
        }
    }
}

#[test]
fn an_overdue_hand_back_emits_one_event() {
    let s = spec();
    let st = RolloutStatus {
        phase: RolloutPhase::Promoted,
        promoted_at: Some(Time(t(0))),
        ..Default::default()
    };
    let obs = Observations {
        route: route(100, false),
        ..Default::default()
    };
    let overdue = |d: &Decision| {
        d.actions
            .iter()
            .filter(|a| a.event_reason() == Some(reasons::HAND_BACK_OVERDUE))
            .count()
    };
    let d = step(&s, st.clone(), &obs, t(3_600));
    assert_eq!(overdue(&d), 0, "within the deadline");
    let d = step(&s, st, &obs, t(86_400));
    assert_eq!(overdue(&d), 1, "a Warning Event when it becomes overdue");
    let d = step(&s, d.status, &obs, t(90_000));
    assert_eq!(overdue(&d), 0, "once");
}

#[test]
fn resuming_an_unconfirmed_step_never_aborts_for_the_time_spent_paused() {
    let s = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({"paused": true}),
    );
    let resumed = held_spec(
        serde_json::json!({"untilPromoted": true}),
        serde_json::json!({}),
    );
    let st = live(&s, 2, RolloutPhase::Progressing, false);
    let obs = Observations {
        route: live_route(&s, &st),
        applied_share: Some(0.5),
        ..Default::default()
    };
    // Paused for an hour, past the 10-minute share deadline, the share still climbing.
    let d = step(&s, st, &obs, t(3_600));
    assert_eq!(d.status.phase, RolloutPhase::Paused);
    let d = step(&resumed, d.status, &obs, t(3_601));
    assert_ne!(
        d.status.phase,
        RolloutPhase::Aborted,
        "{:?}",
        d.status.abort
    );
}

fn two_route_spec() -> RolloutSpec {
    serde_json::from_value(serde_json::json!({
        "routeRef": {"name": "checkout"},
        "additionalRoutes": [{"name": "checkout-mesh"}, {"kind": "GRPCRoute", "name": "checkout-grpc"}],
        "stableService": {"name": "v1"},
        "canaryService": {"name": "v2"},
        "canaryWorkload": {"name": "v2"},
        "analysisInterval": "1s",
        "steps": [{"setWeight": {"weight": 5, "duration": "2s"}}, {"setWeight": {"weight": 50, "duration": "2s"}}, {"promote": {}}]
    }))
    .unwrap()
}

fn additional(mesh: RouteObs, grpc: RouteObs) -> Vec<AdditionalRouteObs> {
    vec![
        AdditionalRouteObs {
            kind: RouteKindName::HttpRoute,
            name: "checkout-mesh".into(),
            route: mesh,
        },
        AdditionalRouteObs {
            kind: RouteKindName::GrpcRoute,
            name: "checkout-grpc".into(),
            route: grpc,
        },
    ]
}

fn additional_weights(st: &RolloutStatus) -> Vec<(String, Option<u32>)> {
    st.additional_owned_routes
        .iter()
        .map(|o| (o.name.clone(), o.written_weight))
        .collect()
}

#[test]
fn several_routes_take_one_plan_and_each_is_recorded() {
    let s = two_route_spec();
    let mut obs = Observations {
        route: route(0, false),
        additional_routes: additional(route(0, false), route(0, false)),
        canary_ready: Some(false),
        canary_service: Some(true),
        ..Default::default()
    };
    let d = step(&s, RolloutStatus::default(), &obs, t(0));
    assert_eq!(
        writes(&d),
        vec![0],
        "one write action, carried out on every route"
    );
    obs.canary_ready = Some(true);
    assert_eq!(
        additional_weights(&d.status),
        vec![
            ("checkout-mesh".into(), Some(0)),
            ("checkout-grpc".into(), Some(0))
        ]
    );
    let d = step(&s, d.status, &obs, t(1));
    assert_eq!(d.status.phase, RolloutPhase::Progressing);
    assert_eq!(writes(&d).last(), Some(&5));
    assert_eq!(
        additional_weights(&d.status),
        vec![
            ("checkout-mesh".into(), Some(5)),
            ("checkout-grpc".into(), Some(5))
        ]
    );
    let grpc = &d.status.additional_owned_routes[1];
    assert_eq!(grpc.kind, Some(RouteKindName::GrpcRoute));
    assert_eq!(
        grpc.weight_written_at, None,
        "in force once its write is accepted"
    );

    // An abort is one write action (each route reverted on its own); a route read back at
    // weight 0 counts as reverted only once every route reads 0.
    obs.route = route(5, false);
    obs.additional_routes = additional(route(5, false), route(5, false));
    let mut aborting = s.clone();
    aborting.abort = true;
    let d = step(&aborting, d.status, &obs, t(2));
    assert_eq!(d.status.phase, RolloutPhase::Aborted);
    assert_eq!(writes(&d), vec![0]);
    assert_eq!(
        additional_weights(&d.status),
        vec![
            ("checkout-mesh".into(), Some(0)),
            ("checkout-grpc".into(), Some(0))
        ]
    );
    obs.route = route(0, false);
    obs.additional_routes = additional(route(0, false), route(5, false));
    let d = step(&aborting, d.status, &obs, t(3));
    assert!(
        d.status.abort.as_ref().unwrap().route_reverted_at.is_none(),
        "one route still carries the canary"
    );
    assert_eq!(writes(&d), vec![0], "the abort is written again");
    obs.additional_routes = additional(route(0, false), route(0, false));
    let d = step(&aborting, d.status, &obs, t(4));
    assert_eq!(
        d.status.abort.as_ref().unwrap().route_reverted_at,
        Some(Time(t(4)))
    );
}

#[test]
fn a_problem_on_an_additional_route_stops_the_rollout_naming_that_route() {
    let s = two_route_spec();
    let owned_by_other = RouteObs::Present(RouteState {
        owner: Some("shop/other".into()),
        me: "shop/checkout".into(),
        ..RouteState::default()
    });
    for (mesh, reason, names) in [
        (
            RouteObs::Missing,
            reasons::ROUTE_NOT_FOUND,
            "spec.additionalRoutes: HTTPRoute checkout-mesh not found",
        ),
        (
            owned_by_other,
            reasons::ROUTE_OWNED_BY_OTHER,
            "spec.additionalRoutes: HTTPRoute checkout-mesh is owned by Rollout shop/other",
        ),
        (
            RouteObs::Unusable {
                reason: reasons::ROUTE_NOT_FOUND,
                message: "no rule sends to Service v1".into(),
                state: None,
            },
            reasons::ROUTE_NOT_FOUND,
            "spec.additionalRoutes: HTTPRoute checkout-mesh: no rule sends to Service v1",
        ),
    ] {
        let obs = Observations {
            route: route(0, false),
            additional_routes: additional(mesh, route(0, false)),
            canary_ready: Some(true),
            canary_service: Some(true),
            ..Default::default()
        };
        let d = step(&s, RolloutStatus::default(), &obs, t(0));
        assert!(writes(&d).is_empty(), "{names}: nothing written");
        assert_eq!(d.status.phase, RolloutPhase::Pending, "{names}");
        let c = cond::find(&d.status.conditions, conditions::ROUTE_OWNED).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
        assert!(c.message.starts_with(names), "{}", c.message);
    }
    // Not read at all: no decision on part of the routes.
    let obs = Observations {
        route: route(0, false),
        canary_ready: Some(true),
        ..Default::default()
    };
    assert!(writes(&step(&s, RolloutStatus::default(), &obs, t(0))).is_empty());
}

#[test]
fn a_cohort_and_a_mirror_step_go_to_every_route_of_the_plan_each_recorded() {
    let mut s = two_route_spec();
    // One kind on every route (a mirror step names the methods of one kind).
    s.additional_routes.truncate(1);
    s.steps.insert(
        0,
        serde_json::from_value(
            serde_json::json!({"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}}),
        )
        .unwrap(),
    );
    s.steps.insert(
        0,
        serde_json::from_value(serde_json::json!({"mirror": {"percent": 50}})).unwrap(),
    );
    let obs = Observations {
        route: route(0, false),
        additional_routes: additional(route(0, false), route(0, false))
            .into_iter()
            .take(1)
            .collect(),
        canary_ready: Some(true),
        canary_service: Some(true),
        ..Default::default()
    };
    let d = step(&s, RolloutStatus::default(), &obs, t(0));
    let d = step(&s, d.status, &obs, t(1));
    let parts = |d: &Decision| -> Vec<(bool, bool)> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::WriteRoute(w) => Some((w.mirror.is_some(), w.cohort.is_some())),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        parts(&d),
        vec![(true, false)],
        "the mirror step, one write for every route"
    );
    let recorded = |st: &RolloutStatus| {
        st.additional_owned_routes
            .iter()
            .map(|o| {
                (
                    o.name.clone(),
                    o.mirror_rule_name.clone(),
                    o.cohort_rule_name.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        recorded(&d.status),
        vec![("checkout-mesh".into(), Some("sluice-mirror".into()), None)]
    );
    // Promoted through the mirror step by hand: the cohort step, on every route too.
    let mut next = s.clone();
    next.promote_through_step = Some(0);
    let d = step(&next, d.status, &obs, t(2));
    let d = step(&next, d.status, &obs, t(3));
    assert_eq!(
        d.status.current_step_index,
        Some(1),
        "{:?}",
        d.status.conditions
    );
    // The mirror rule stays until the first weight step, on every route too.
    assert_eq!(parts(&d), vec![(true, true)]);
    assert_eq!(
        recorded(&d.status),
        vec![(
            "checkout-mesh".into(),
            Some("sluice-mirror".into()),
            Some("sluice-cohort".into())
        )]
    );
}

#[test]
fn an_additional_route_removed_mid_rollout_is_released_and_the_rest_goes_on() {
    let s = two_route_spec();
    let obs = Observations {
        route: route(5, false),
        additional_routes: additional(route(5, false), route(5, false)),
        canary_ready: Some(true),
        canary_service: Some(true),
        ..Default::default()
    };
    let d = step(&s, RolloutStatus::default(), &obs, t(0));
    let d = step(&s, d.status, &obs, t(1));
    assert_eq!(writes(&d), vec![5]);
    let mut fewer = s.clone();
    fewer.additional_routes.truncate(1);
    let d = step(&fewer, d.status, &obs, t(2));
    assert_eq!(
        kinds(&d),
        vec![
            "release GRPCRoute checkout-grpc".to_string(),
            "write 5".into()
        ]
    );
    assert_eq!(
        d.status.phase,
        RolloutPhase::Progressing,
        "the plan goes on"
    );
    assert!(d.status.owned_route.is_some(), "routeRef stays owned");
    // Forgotten by the record once released, not by the decision.
    assert_eq!(d.status.additional_owned_routes.len(), 2);
    // A rule change on a kept route releases it too.
    let mut other_rule = s.clone();
    other_rule.additional_routes[0].rule_name = Some("api".into());
    let d = step(&other_rule, d.status, &obs, t(3));
    assert!(
        kinds(&d).contains(&"release HTTPRoute checkout-mesh".to_string()),
        "{:?}",
        kinds(&d)
    );
}

/// The two-route Rollout of [`two_routes_live_at_five`] Promoted (100% canary on every route),
/// and what it reads.
fn two_routes_promoted() -> (RolloutSpec, Observations, RolloutStatus) {
    let (s, mut obs, mut st) = two_routes_live_at_five();
    st.phase = RolloutPhase::Promoted;
    st.current_step_index = Some(2);
    st.desired_weight = Some(100);
    st.promoted_at = Some(Time(t(10)));
    for o in st
        .owned_route
        .iter_mut()
        .chain(&mut st.additional_owned_routes)
    {
        o.written_weight = Some(100);
    }
    obs.route = route(100, false);
    obs.additional_routes = additional(route(100, false), route(100, false));
    (s, obs, st)
}

#[test]
fn a_promoted_rollouts_routes_are_handed_back_as_they_stand_when_its_target_changes() {
    let (s, obs, promoted) = two_routes_promoted();
    // Only the releases (a Promoted rollout's route write of 100% is a no-op the reconcile
    // skips).
    let releases = |d: &Decision| -> Vec<String> {
        kinds(d)
            .into_iter()
            .filter(|k| k.starts_with("release"))
            .collect()
    };
    let d = step(&s, promoted.clone(), &obs, t(20));
    assert_eq!(d.status.phase, RolloutPhase::Promoted);
    assert!(releases(&d).is_empty(), "{:?}", kinds(&d));
    let notes = |d: &Decision| -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event(n) if n.reason == reasons::TARGET_CHANGED => Some(n.note.clone()),
                _ => None,
            })
            .collect()
    };

    // A route that leaves spec.additionalRoutes keeps the promoted canary's traffic: no abort
    // sends it back to the version the promotion replaced.
    let mut fewer = s.clone();
    fewer.additional_routes.truncate(1);
    let d = step(&fewer, promoted.clone(), &obs, t(20));
    assert_eq!(
        releases(&d),
        vec!["release GRPCRoute checkout-grpc as promoted".to_string()]
    );
    assert!(
        writes(&d).iter().all(|w| *w == 100),
        "no weight but 100: {:?}",
        kinds(&d)
    );
    assert_eq!(d.status.phase, RolloutPhase::Promoted);
    assert_eq!(
        notes(&d),
        vec![
            "GRPCRoute checkout-grpc left spec.additionalRoutes: the promoted canary keeps its weight on it and it is handed back"
                .to_string()
        ]
    );

    // The next release (a new canary Service): every route is handed back at 100% canary and
    // the rollout starts over.
    let mut next = s.clone();
    next.canary_service.name = "v3".into();
    let d = step(&next, promoted.clone(), &obs, t(20));
    assert_eq!(
        releases(&d),
        vec![
            "release HTTPRoute checkout-mesh as promoted".to_string(),
            "release GRPCRoute checkout-grpc as promoted".into(),
            "release HTTPRoute checkout as promoted".into(),
        ]
    );
    assert_eq!(d.status.phase, RolloutPhase::Pending);
    assert!(writes(&d).is_empty(), "{:?}", kinds(&d));
    assert!(
        notes(&d)[0].contains("the promoted canary keeps its weight on HTTPRoute checkout"),
        "{:?}",
        notes(&d)
    );

    // Before promotion the same edits abort first, as they always did.
    let (s, obs, live) = two_routes_live_at_five();
    let mut fewer = s.clone();
    fewer.additional_routes.truncate(1);
    let d = step(&fewer, live, &obs, t(20));
    assert_eq!(
        releases(&d),
        vec!["release GRPCRoute checkout-grpc".to_string()]
    );
    assert!(
        notes(&d)[0].contains("the canary is aborted on it"),
        "{:?}",
        notes(&d)
    );
}

/// A two-route Rollout live at 5% on every route (its second decision), and what it reads.
fn two_routes_live_at_five() -> (RolloutSpec, Observations, RolloutStatus) {
    let s = two_route_spec();
    let obs = Observations {
        route: route(5, false),
        additional_routes: additional(route(5, false), route(5, false)),
        canary_ready: Some(true),
        canary_service: Some(true),
        ..Default::default()
    };
    let d = step(&s, RolloutStatus::default(), &obs, t(0));
    let live = step(&s, d.status, &obs, t(1)).status;
    (s, obs, live)
}

#[test]
fn deleting_aborts_and_hands_back_every_route() {
    let (s, mut obs, live) = two_routes_live_at_five();
    obs.deleting = true;
    // The primary already at 0, an additional route still live: aborted all the same.
    obs.route = route(0, false);
    let d = step(&s, live, &obs, t(2));
    assert_eq!(kinds(&d), vec!["write 0".to_string(), "hand back".into()]);
}

#[test]
fn deleting_with_route_ref_gone_still_aborts_and_hands_back_the_additional_routes() {
    let (s, mut obs, live) = two_routes_live_at_five();
    obs.deleting = true;
    obs.route = RouteObs::Missing;
    let notes = |d: &Decision, reason: &str| -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event(n) if n.reason == reason => Some(n.note.clone()),
                _ => None,
            })
            .collect()
    };

    // Before promotion: the live canary on the additional routes is aborted, then they are
    // handed back, though routeRef is gone.
    let d = step(&s, live.clone(), &obs, t(2));
    assert_eq!(kinds(&d), vec!["write 0".to_string(), "hand back".into()]);
    assert_eq!(
        notes(&d, reasons::ABORTED_ON_DELETE),
        vec![
            "deleted before promotion: canary weight 0 on HTTPRoute checkout-mesh, GRPCRoute \
             checkout-grpc (spec.additionalRoutes) before hand-back; HTTPRoute checkout \
             (spec.routeRef) could not be read"
                .to_string()
        ]
    );
    assert_eq!(
        notes(&d, "HandedBack"),
        vec![
            "HTTPRoute checkout-mesh, GRPCRoute checkout-grpc (spec.additionalRoutes) handed \
             back; HTTPRoute checkout (spec.routeRef) could not be read, and is handed back too \
             if it is there and owned"
                .to_string()
        ]
    );

    // Promoted: the canary is the new stable; the routes are only handed back.
    let mut promoted = live.clone();
    promoted.phase = RolloutPhase::Promoted;
    let d = step(&s, promoted, &obs, t(2));
    assert_eq!(kinds(&d), vec!["hand back".to_string()]);
    assert!(notes(&d, reasons::ABORTED_ON_DELETE).is_empty());

    // No route of this Rollout's left to read: nothing is written or handed back.
    obs.additional_routes = additional(RouteObs::Missing, RouteObs::Missing);
    let d = step(&s, live, &obs, t(2));
    assert!(kinds(&d).is_empty(), "{:?}", kinds(&d));
}

/// A two-route Rollout whose routes all read canary weight 5, after its first decision, with
/// every additional route recorded as last written at resourceVersion 1.
fn every_route_written_at_five() -> (RolloutSpec, Observations, RolloutStatus) {
    let s = two_route_spec();
    let obs = Observations {
        route: route(5, false),
        additional_routes: additional(route(5, false), route(5, false)),
        canary_ready: Some(true),
        canary_service: Some(true),
        ..Default::default()
    };
    let mut st = step(&s, RolloutStatus::default(), &obs, t(0)).status;
    for o in &mut st.additional_owned_routes {
        o.last_written_resource_version = Some("1".into());
    }
    (s, obs, st)
}

#[test]
fn a_bundle_pin_on_an_additional_route_stops_the_rollout_without_writing() {
    let (s, obs, st) = every_route_written_at_five();
    let pinned = RouteObs::Present(RouteState {
        resource_version: Some("9".into()),
        owner: Some("shop/checkout".into()),
        me: "shop/checkout".into(),
        canary_weight: 0,
        last_writer: Some(REVERT_FIELD_MANAGER.into()),
        ..RouteState::default()
    });
    let obs = Observations {
        additional_routes: additional(pinned, route(5, false)),
        ..obs
    };
    let d = step(&s, st, &obs, t(1));
    assert_eq!(d.status.phase, RolloutPhase::Aborted);
    assert_eq!(
        d.status.abort.as_ref().unwrap().reason,
        AbortReason::PinnedByBundlePin
    );
    assert!(writes(&d).is_empty(), "the pin's routes are not written");
    let c = cond::find(&d.status.conditions, conditions::ROUTE_OWNED).unwrap();
    assert!(
        c.message.contains("HTTPRoute checkout-mesh"),
        "{}",
        c.message
    );
}

#[test]
fn another_writers_edit_of_an_additional_route_is_said_and_restored() {
    let (s, obs, st) = every_route_written_at_five();
    let notes = |d: &Decision| -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event(n) if n.reason == reasons::FOREIGN_EDIT_RESTORED => {
                    Some(n.note.clone())
                }
                _ => None,
            })
            .collect()
    };

    // Read back as written: nothing to say.
    let d = step(&s, st.clone(), &obs, t(1));
    assert!(notes(&d).is_empty(), "{:?}", notes(&d));

    // Someone set the mesh route's canary weight to 50 by hand.
    let edited = RouteObs::Present(RouteState {
        resource_version: Some("9".into()),
        owner: Some("shop/checkout".into()),
        me: "shop/checkout".into(),
        canary_weight: 50,
        last_writer: Some("kubectl-edit".into()),
        ..RouteState::default()
    });
    let obs = Observations {
        additional_routes: additional(edited, route(5, false)),
        ..obs
    };
    let d = step(&s, st, &obs, t(2));
    assert_eq!(
        notes(&d),
        [
            "HTTPRoute checkout-mesh (spec.additionalRoutes) was edited by kubectl-edit: canary weight 50 (wrote Some(5)); restoring"
        ]
    );
    assert_ne!(
        d.status.phase,
        RolloutPhase::Aborted,
        "an edit is restored, not aborted on"
    );
    let c = cond::find(&d.status.conditions, conditions::ROUTE_OWNED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", reasons::FOREIGN_EDIT_RESTORED)
    );
}
