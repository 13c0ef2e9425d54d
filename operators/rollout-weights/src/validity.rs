//! What a Rollout's CRD schema and CEL rules cannot check: durations that must parse and be
//! positive. Each problem names its field (`spec.steps[2].setWeight.duration: ...`).
//!
//! Pure; never reads the cluster (references to routes and workloads are checked by the
//! reconcile against what it observes).

use sluice_api::v1alpha1::{DurationString, RolloutSpec};

fn duration(problems: &mut Vec<String>, path: &str, value: &DurationString) {
    match value.parse() {
        Ok(d) if d.is_zero() => problems.push(format!(
            "{path}: {value:?} is zero; give a positive duration such as 30s"
        )),
        Ok(_) => {}
        Err(err) => problems.push(format!("{path}: {err}")),
    }
}

/// The spec's problems, empty when it is valid.
pub fn problems(spec: &RolloutSpec) -> Vec<String> {
    let mut out = Vec::new();
    duration(&mut out, "spec.analysisInterval", &spec.analysis_interval);
    duration(
        &mut out,
        "spec.appliedShareDeadline",
        &spec.applied_share_deadline,
    );
    duration(&mut out, "spec.stepDuration", &spec.step_duration);
    duration(
        &mut out,
        "spec.canaryReadyDeadline",
        &spec.canary_ready_deadline,
    );
    duration(&mut out, "spec.handBackDeadline", &spec.hand_back_deadline);
    for (i, step) in spec.steps.iter().enumerate() {
        let own = [
            (
                "mirror",
                step.mirror.as_ref().and_then(|s| s.duration.as_ref()),
            ),
            (
                "headerCohort",
                step.header_cohort
                    .as_ref()
                    .and_then(|s| s.duration.as_ref()),
            ),
            (
                "setWeight",
                step.set_weight.as_ref().and_then(|s| s.duration.as_ref()),
            ),
            (
                "pause",
                step.pause.as_ref().and_then(|s| s.duration.as_ref()),
            ),
        ];
        for (kind, d) in own {
            if let Some(d) = d {
                duration(&mut out, &format!("spec.steps[{i}].{kind}.duration"), d);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(patch: serde_json::Value) -> RolloutSpec {
        let mut base = serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "checkout-v1"},
            "canaryService": {"name": "checkout-v2"},
            "canaryWorkload": {"name": "checkout-v2"},
            "steps": [{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 50}}],
        });
        for (k, v) in patch.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).expect("fixture deserializes")
    }

    #[test]
    fn problems_name_their_field() {
        let table = [
            (serde_json::json!({}), vec![]),
            (
                serde_json::json!({"analysisInterval": "0s"}),
                vec!["spec.analysisInterval"],
            ),
            (
                serde_json::json!({"stepDuration": "0m", "handBackDeadline": "0h"}),
                vec!["spec.stepDuration", "spec.handBackDeadline"],
            ),
            (
                serde_json::json!({"steps": [{"setWeight": {"weight": 5, "duration": "0s"}}]}),
                vec!["spec.steps[0].setWeight.duration"],
            ),
            (
                serde_json::json!({"steps": [{"pause": {"duration": "0ms"}}]}),
                vec!["spec.steps[0].pause.duration"],
            ),
        ];
        for (patch, want) in table {
            let got = problems(&spec(patch.clone()));
            assert_eq!(got.len(), want.len(), "{patch}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.starts_with(&format!("{w}: ")), "{patch}: {g}");
            }
        }
    }
}
