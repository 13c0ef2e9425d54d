//! Pre-change baselines: a gate compared with `baseline: PreChangeWindow` is judged against its
//! own reading over the window that ends when the change began (the start of the plan's step 0,
//! when the canary first got a share), captured once with the engine's `capture_baselines` and
//! kept in `status.capturedBaselines`, so it survives restarts and is never re-read from a window
//! the canary already affects.
//!
//! Pure: [`change_start`] and [`attach`]. The capture itself is one engine call in `reconcile`.

use jiff::Timestamp;
use sluice_analysis::GateCheck;
use sluice_api::v1alpha1::{BaselineSource, CapturedBaseline, RolloutStatus};

/// When the change began for this plan: the start of its latest step 0 (a retry or a new canary
/// version starts the plan again from step 0, and so a new change), else the current step's
/// start. `None` before the first step.
pub fn change_start(status: &RolloutStatus) -> Option<Timestamp> {
    status
        .history
        .iter()
        .filter(|r| r.index == 0)
        .map(|r| r.started_at.0)
        .max()
        .or(status.current_step_started_at.as_ref().map(|t| t.0))
}

fn pre_change(check: &GateCheck) -> bool {
    check
        .gate
        .comparison
        .relative
        .as_ref()
        .is_some_and(|r| r.baseline == BaselineSource::PreChangeWindow)
}

/// Gives each pre-change check the baseline kept for this change (same gate, window ending at
/// `start`). Returns the baselines still valid, to keep in status, and the indices of the checks
/// that have none yet and must be captured.
pub fn attach(
    checks: &mut [GateCheck],
    kept: &[CapturedBaseline],
    start: Timestamp,
) -> (Vec<CapturedBaseline>, Vec<usize>) {
    let mut valid = Vec::new();
    let mut missing = Vec::new();
    for (i, check) in checks.iter_mut().enumerate() {
        if !pre_change(check) {
            continue;
        }
        match kept
            .iter()
            .find(|b| b.gate == check.gate.name && b.window_end.0 == start)
        {
            Some(b) => {
                check.captured_baseline = Some(b.clone());
                valid.push(b.clone());
            }
            None => missing.push(i),
        }
    }
    (valid, missing)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use sluice_api::v1alpha1::{Comparison, ComparisonOp, Gate, GateDefinition};

    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn check(name: &str, baseline: Option<BaselineSource>) -> GateCheck {
        let comparison = match baseline {
            Some(b) => Comparison::relative(b, 1.5),
            None => Comparison::absolute(ComparisonOp::LessThan, 0.1),
        };
        let gate = Gate {
            name: name.into(),
            template_ref: None,
            variables: Default::default(),
            definition: GateDefinition {
                promql: Some(r#"sum(rate(x{s="{{canaryService}}"}[{{window}}]))"#.into()),
                comparison: Some(comparison),
                ..Default::default()
            },
        };
        GateCheck::new(
            "Rollout a/b",
            gate.resolve(None).unwrap(),
            Default::default(),
        )
    }

    fn kept(gate: &str, end: i64) -> CapturedBaseline {
        CapturedBaseline {
            gate: gate.into(),
            scope: None,
            value: 0.01,
            samples: Some(500),
            window_start: Time(t(end - 120)),
            window_end: Time(t(end)),
            captured_at: Time(t(end + 1)),
        }
    }

    #[test]
    fn the_change_starts_at_the_latest_step_zero() {
        let status: RolloutStatus = serde_json::from_value(serde_json::json!({
            "phase": "Progressing",
            "currentStepStartedAt": Time(t(900)),
            "history": [
                {"index": 0, "kind": "SetWeight", "startedAt": Time(t(0))},
                {"index": 1, "kind": "SetWeight", "startedAt": Time(t(300))},
                {"index": 0, "kind": "SetWeight", "startedAt": Time(t(600))},
                {"index": 1, "kind": "SetWeight", "startedAt": Time(t(900))},
            ],
        }))
        .unwrap();
        assert_eq!(change_start(&status), Some(t(600)));
        let fresh = RolloutStatus {
            current_step_started_at: Some(Time(t(50))),
            ..Default::default()
        };
        assert_eq!(change_start(&fresh), Some(t(50)));
        assert_eq!(change_start(&RolloutStatus::default()), None);
    }

    #[test]
    fn pre_change_checks_get_this_changes_baseline_or_are_captured() {
        let mut checks = vec![
            check("errors", Some(BaselineSource::PreChangeWindow)),
            check("latency", Some(BaselineSource::StableNow)),
            check("absolute", None),
            check("saturation", Some(BaselineSource::PreChangeWindow)),
        ];
        // "errors" was captured for this change; "saturation" for an earlier one (a retry).
        let (valid, missing) = attach(
            &mut checks,
            &[kept("errors", 600), kept("saturation", 0)],
            t(600),
        );
        assert_eq!(valid, vec![kept("errors", 600)]);
        assert_eq!(missing, vec![3]);
        assert_eq!(checks[0].captured_baseline, Some(kept("errors", 600)));
        assert!(checks[1].captured_baseline.is_none());
        assert!(checks[3].captured_baseline.is_none());
    }
}
