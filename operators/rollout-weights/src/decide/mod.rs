//! The pure heart of sluice-rollout-weights: (spec, current status, observations, now) → (actions,
//! next status, requeue).
//!
//! Owns the order of judgement: validity first (what CEL cannot express; sets
//! `status.observedGeneration` and the `Ready` condition), then the state machine in
//! [`machine`]: the whole of it for a valid spec, its invalid-spec part otherwise. Phase
//! `Invalid` is only for a Rollout that never started: one that did keeps its phase, so an
//! invalid edit never resets it and a live canary keeps being judged (or is aborted). Must never
//! do I/O or read the clock.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    RolloutPhase, RolloutSpec, RolloutStatus,
    rollout::{conditions, reasons},
};
use sluice_runtime::{conditions as cond, events::Notice, validity::Step};

pub mod machine;

pub use machine::*;

use crate::validity;

/// Decides the next status of a Rollout: validity, then the state machine when the spec is
/// valid. `allow_free_form_promql` is the platform's policy for free-form PromQL gates.
pub fn decide(
    spec: &RolloutSpec,
    status: Option<&RolloutStatus>,
    obs: &Observations,
    allow_free_form_promql: bool,
    now: Timestamp,
) -> Decision {
    let problems = validity::problems(spec, allow_free_form_promql);
    // A Ready=False for a misconfigured gate is this module's, not the validity check's: seen
    // as "valid" by it, so fixing or keeping it never reads as the spec being accepted again.
    let masked = status.cloned().map(|mut s| {
        if let Some(c) = s
            .conditions
            .iter_mut()
            .find(|c| c.type_ == conditions::READY && c.reason == reasons::GATE_MISCONFIGURED)
        {
            c.status = "True".into();
            c.reason = reasons::VALID.into();
            c.message = "spec is valid".into();
        }
        s
    });
    let mut checked = decide_validity(&problems, masked.as_ref(), obs.generation, now);
    if problems.is_empty() {
        gate_configuration(&mut checked, status, obs, now);
    }
    if checked.status.phase == RolloutPhase::Invalid && !obs.deleting {
        // Never started: an invalid spec is waited on.
        return checked;
    }
    let mut next = if problems.is_empty() || obs.deleting {
        // A Rollout being deleted hands its route back whatever its spec.
        machine::step(spec, checked.status, obs, now)
    } else {
        machine::invalid(spec, checked.status, obs, now, &problems)
    };
    let mut actions = checked.actions;
    actions.append(&mut next.actions);
    next.actions = actions;
    if let Some(b) = &obs.baselines {
        next.status.captured_baselines = b.clone();
    }
    next
}

/// A valid spec whose gates cannot be evaluated as configured (a missing GateTemplate, a
/// variable the Rollout cannot supply, refused inline PromQL) is not Ready: `Ready=False`,
/// reason `GateMisconfigured`, naming the gate and field. Learned only when an analysis runs;
/// between analyses the last finding stands, except once the rollout is over (Promoted or
/// Aborted): no gate is evaluated any more, so Ready says whether the spec is valid (a retry
/// analyses again and finds it again if it still holds). The gates themselves are Inconclusive,
/// so their policy applies after its deadline.
fn gate_configuration(
    checked: &mut Decision,
    status: Option<&RolloutStatus>,
    obs: &Observations,
    now: Timestamp,
) {
    let before = status
        .and_then(|s| cond::find(&s.conditions, conditions::READY))
        .filter(|c| c.reason == reasons::GATE_MISCONFIGURED)
        .cloned();
    let over =
        status.is_some_and(|s| matches!(s.phase, RolloutPhase::Promoted | RolloutPhase::Aborted));
    match (&obs.config_problems, before) {
        (Some(found), before) if !found.is_empty() => {
            let message = found.join("; ");
            let c = cond::new(
                conditions::READY,
                cond::Status::False,
                reasons::GATE_MISCONFIGURED,
                message.clone(),
                obs.generation,
                now,
            );
            cond::set(&mut checked.status.conditions, c);
            if before.is_none() {
                checked.event(Notice::warning(
                    reasons::GATE_MISCONFIGURED,
                    sluice_runtime::validity::VALIDATE,
                    message,
                ));
            }
        }
        // Not analysed this time: the last finding stands while gates are still evaluated.
        (None, Some(before)) if !over => {
            cond::set(&mut checked.status.conditions, before);
        }
        // Found fixed, or no longer evaluated: Ready again, from now.
        (_, Some(_)) => {
            if let Some(c) = checked
                .status
                .conditions
                .iter_mut()
                .find(|c| c.type_ == conditions::READY && c.status == "True")
            {
                c.last_transition_time = Time(now);
            }
        }
        _ => {}
    }
}

/// Rollout's validity step: phase `Invalid` only for a Rollout that never started (one that did
/// keeps its phase); a fixed one starts again from Pending.
pub(crate) const VALIDITY_STEP: Step<RolloutStatus> = Step {
    fields: |s| (&mut s.observed_generation, &mut s.conditions),
    phase: |next, validity| {
        let started = !matches!(next.phase, RolloutPhase::Pending | RolloutPhase::Invalid);
        if !validity.valid && !started {
            next.phase = RolloutPhase::Invalid;
        } else if validity.was_invalid && next.phase == RolloutPhase::Invalid {
            next.phase = RolloutPhase::Pending;
        }
    },
};

/// The validity part of [`decide`], given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&RolloutStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> Decision {
    VALIDITY_STEP.decide(problems, status, generation, now, Action::Event)
}

#[cfg(test)]
mod validity_tests {
    use super::*;
    use sluice_runtime::{
        events::Announces,
        validity::checks::{self, Seen},
    };

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn obs(generation: i64) -> Option<i64> {
        Some(generation)
    }

    fn problem() -> Vec<String> {
        vec!["spec.steps[2].setWeight.weight: example problem".to_owned()]
    }

    fn run(p: &[String], s: Option<&RolloutStatus>, g: i64, now: Timestamp) -> Seen<RolloutStatus> {
        let d = decide_validity(p, s, obs(g), now);
        Seen::new(d.status, &d.actions, d.requeue, Announces::event_reason)
    }

    #[test]
    fn validity_transitions() {
        use RolloutPhase::{Invalid, Pending};
        // Each shared transition's phase, in order: only a Rollout that never started is Invalid.
        let phases = [Pending, Invalid, Invalid, Pending, Pending, Invalid];
        let (problem, field) = (problem(), "spec.steps[2].setWeight.weight");
        checks::transitions((&problem, field), run, VALIDITY_STEP.fields, phases, |s| {
            s.phase
        });
    }

    #[test]
    fn identical_reconcile_produces_an_identical_status() {
        checks::identical_reconcile(&problem(), run);
    }

    fn spec(patch: serde_json::Value) -> RolloutSpec {
        let mut v = serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "analysisInterval": "30s",
            "steps": [
                {"setWeight": {"weight": 1, "duration": "10m"}},
                {"pause": {"untilPromoted": true}},
                {"setWeight": {"weight": 50}},
                {"promote": {}}
            ]
        });
        for (k, x) in patch.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn started(phase: RolloutPhase, index: u32, weight: u32) -> RolloutStatus {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut st = decide_validity(&[], None, obs(1), t(0)).status;
        st.phase = phase;
        st.current_step_index = Some(index);
        st.current_step_started_at = Some(Time(t(0)));
        st.desired_weight = Some(weight);
        st.owned_route = Some(sluice_api::v1alpha1::rollout::OwnedRouteStatus {
            written_weight: Some(weight),
            owned_since: Some(Time(t(0))),
            ..Default::default()
        });
        st
    }

    fn observed(weight: u32, fail: bool) -> Observations {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use sluice_api::v1alpha1::{GateVerdict, Verdict, VerdictReason};
        let v = GateVerdict {
            gate: "error-ratio".into(),
            verdict: if fail { Verdict::Fail } else { Verdict::Pass },
            reason: VerdictReason::ThresholdBreached,
            message: None,
            value: Some(0.046),
            baseline: Some(0.02),
            threshold: Some(0.03),
            samples: Some(1000),
            min_samples: Some(100),
            consecutive_failures: 2,
            inconclusive_since: None,
            evaluated_at: Time(t(60)),
        };
        let act = if fail {
            sluice_analysis::GateAction::Abort
        } else {
            sluice_analysis::GateAction::Proceed
        };
        Observations {
            generation: Some(2),
            route: crate::decide::RouteObs::Present(crate::decide::RouteState {
                resource_version: Some("1".into()),
                owner: Some("shop/checkout".into()),
                me: "shop/checkout".into(),
                canary_weight: weight,
                ..Default::default()
            }),
            gates: vec![(v, act)],
            ..Default::default()
        }
    }

    fn route_writes(d: &Decision) -> Vec<u32> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::WriteRoute(w) => Some(w.weight),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_invalid_spec_never_leaves_a_live_canary_unjudged() {
        use sluice_api::v1alpha1::rollout::AbortReason;
        // A step made invalid (a 0s duration): the canary is held where it is and judged.
        let bad_step = spec(serde_json::json!({"stepDuration": "0s"}));
        // The gates themselves invalid: the canary cannot be judged, so it is aborted.
        let bad_gate = spec(
            serde_json::json!({"gates": [{"name": "q", "promql": "up", "comparison": {"absolute": {"op": "LessOrEqual", "value": 1.0}}}]}),
        );
        type Row = (
            &'static str,
            RolloutSpec,
            RolloutStatus,
            bool,
            RolloutPhase,
            Option<AbortReason>,
            Vec<u32>,
        );
        let table: Vec<Row> = vec![
            (
                "pause untilPromoted at 1%, invalid step, gate fails",
                bad_step.clone(),
                started(RolloutPhase::Paused, 1, 1),
                true,
                RolloutPhase::Aborted,
                Some(AbortReason::GateFailed),
                vec![0],
            ),
            (
                "weight step at 1%, invalid step, gate fails",
                bad_step.clone(),
                started(RolloutPhase::Progressing, 0, 1),
                true,
                RolloutPhase::Aborted,
                Some(AbortReason::GateFailed),
                vec![0],
            ),
            (
                "pause untilPromoted at 1%, invalid step, gate passes: held",
                bad_step.clone(),
                started(RolloutPhase::Paused, 1, 1),
                false,
                RolloutPhase::Paused,
                None,
                vec![],
            ),
            (
                "weight step at 1%, gates invalid: aborted",
                bad_gate.clone(),
                started(RolloutPhase::Progressing, 0, 1),
                false,
                RolloutPhase::Aborted,
                Some(AbortReason::InvalidSpec),
                vec![0],
            ),
            (
                "spec.abort honoured while invalid",
                spec(serde_json::json!({"stepDuration": "0s", "abort": true})),
                started(RolloutPhase::Paused, 1, 1),
                false,
                RolloutPhase::Aborted,
                Some(AbortReason::Manual),
                vec![0],
            ),
            (
                "promoted keeps its phase and its route",
                bad_step.clone(),
                started(RolloutPhase::Promoted, 3, 100),
                false,
                RolloutPhase::Promoted,
                None,
                vec![],
            ),
        ];
        for (name, s, st, fail, phase, reason, want_writes) in table {
            let o = observed(st.desired_weight.unwrap_or(0), fail);
            let d = decide(&s, Some(&st), &o, false, t(60));
            assert_eq!(d.status.phase, phase, "{name}");
            assert_eq!(d.status.abort.as_ref().map(|a| a.reason), reason, "{name}");
            assert_eq!(route_writes(&d), want_writes, "{name}");
            let ready = cond::find(&d.status.conditions, conditions::READY).unwrap();
            assert_eq!(ready.status, "False", "{name}: Ready names the problem");
        }
    }

    #[test]
    fn invalid_then_valid_resumes_where_it_was() {
        let bad = spec(serde_json::json!({"stepDuration": "0s"}));
        let good = spec(serde_json::json!({}));
        for (name, st) in [
            ("promoted", started(RolloutPhase::Promoted, 3, 100)),
            ("paused at 1%", started(RolloutPhase::Paused, 1, 1)),
            (
                "waiting for the canary",
                started(RolloutPhase::WaitingForCanary, 0, 0),
            ),
        ] {
            let weight = st.desired_weight;
            let o = observed(weight.unwrap_or(0), false);
            let held = decide(&bad, Some(&st), &o, false, t(60));
            assert_eq!(
                held.status.phase, st.phase,
                "{name}: phase kept while invalid"
            );
            let back = decide(&good, Some(&held.status), &o, false, t(90));
            assert_eq!(back.status.phase, st.phase, "{name}: no reset to Pending");
            assert_eq!(back.status.desired_weight, weight, "{name}: weight kept");
            assert!(
                !route_writes(&back).contains(&0) || weight == Some(0),
                "{name}: never yanked to 0"
            );
        }
        // An abort stays an abort: only retry restarts it.
        let mut aborted = started(RolloutPhase::Aborted, 0, 0);
        aborted.abort = Some(sluice_api::v1alpha1::rollout::AbortStatus {
            reason: sluice_api::v1alpha1::rollout::AbortReason::GateFailed,
            message: None,
            gate: None,
            step_index: Some(0),
            first_failed_at: None,
            decided_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(0)),
            route_reverted_at: None,
            revert_verified_at: None,
        });
        let o = observed(0, false);
        let held = decide(&bad, Some(&aborted), &o, false, t(60));
        let back = decide(&good, Some(&held.status), &o, false, t(90));
        assert_eq!(back.status.phase, RolloutPhase::Aborted);
    }

    #[test]
    fn a_misconfigured_gate_makes_the_rollout_not_ready_until_an_analysis_finds_it_fixed() {
        let s = spec(serde_json::json!({}));
        let st = started(RolloutPhase::Progressing, 0, 1);
        let ready = |d: &Decision| {
            let c = cond::find(&d.status.conditions, conditions::READY).unwrap();
            (c.status.clone(), c.reason.clone())
        };
        let mut o = observed(1, false);
        o.config_problems = Some(vec![
            "spec.gates t: GateTemplate absent not found".to_owned(),
        ]);
        let d = decide(&s, Some(&st), &o, false, t(60));
        assert_eq!(
            ready(&d),
            ("False".to_owned(), reasons::GATE_MISCONFIGURED.to_owned())
        );
        assert_eq!(
            d.status.phase,
            RolloutPhase::Progressing,
            "not an invalid spec"
        );
        // Between analyses the finding stands.
        o.config_problems = None;
        let d = decide(&s, Some(&d.status), &o, false, t(61));
        assert_eq!(ready(&d).1, reasons::GATE_MISCONFIGURED);
        assert!(
            !d.actions.iter().any(|a| matches!(a, Action::Event(_))),
            "no Event while nothing changes"
        );
        // Once the rollout is over no gate is evaluated: the finding does not stay.
        for phase in [RolloutPhase::Aborted, RolloutPhase::Promoted] {
            let mut over = d.status.clone();
            over.phase = phase;
            let after = decide(&s, Some(&over), &o, false, t(75));
            assert_eq!(
                ready(&after),
                ("True".to_owned(), reasons::VALID.to_owned()),
                "{phase:?}"
            );
            let c = cond::find(&after.status.conditions, conditions::READY).unwrap();
            assert_eq!(c.last_transition_time, Time(t(75)), "{phase:?}");
            assert!(
                !after.actions.iter().any(|a| matches!(a, Action::Event(_))),
                "{phase:?}: no Event"
            );
        }
        // An analysis without problems: Ready again, from then.
        o.config_problems = Some(vec![]);
        let d = decide(&s, Some(&d.status), &o, false, t(90));
        assert_eq!(ready(&d), ("True".to_owned(), reasons::VALID.to_owned()));
        let c = cond::find(&d.status.conditions, conditions::READY).unwrap();
        assert_eq!(c.last_transition_time, Time(t(90)));
    }
}
