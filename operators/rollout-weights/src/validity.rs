//! Validity of a Rollout beyond what the API server's schema and CEL rules enforce: delegates to
//! `sluice_api::validation` (which also re-checks the CEL rules, in case the API server did not
//! run them) and turns its field errors into condition-message lines, each naming its field
//! (`spec.analysisInterval: ...`).
//!
//! Pure; never reads the cluster.

use sluice_api::v1alpha1::RolloutSpec;

/// The spec's problems, each `path: what is wrong`; empty when it is valid.
/// `allow_free_form_promql` is the platform's policy for free-form PromQL gates.
pub fn problems(spec: &RolloutSpec, allow_free_form_promql: bool) -> Vec<String> {
    spec.validate(allow_free_form_promql)
        .iter()
        .map(ToString::to_string)
        .collect()
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
            let got = problems(&spec(patch.clone()), false);
            assert_eq!(got.len(), want.len(), "{patch}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.starts_with(&format!("{w}: ")), "{patch}: {g}");
            }
        }
    }
}
