//! Validity of a RevisionUpgrade beyond what the API server's schema and CEL rules enforce: delegates to
//! `sluice_api::validation` (which also re-checks the CEL rules, in case the API server did not
//! run them) and turns its field errors into condition-message lines, each naming its field
//! (`spec.analysisInterval: ...`).
//!
//! Pure; never reads the cluster.

use sluice_api::v1alpha1::RevisionUpgradeSpec;

/// The spec's problems, each `path: what is wrong`; empty when it is valid.
/// `allow_free_form_promql` is the platform's policy for free-form PromQL gates.
pub fn problems(spec: &RevisionUpgradeSpec, allow_free_form_promql: bool) -> Vec<String> {
    spec.validate(allow_free_form_promql)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_runtime::validity::checks;

    fn spec(patch: serde_json::Value) -> RevisionUpgradeSpec {
        let base = serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27",
            "toTag": "canary", "toRevision": "1-28",
        });
        checks::patched(base, &patch)
    }

    #[test]
    fn problems_name_their_field() {
        checks::problems_name_their_fields(
            |patch| problems(&spec(patch.clone()), false),
            [
                (
                    serde_json::json!({"waves": [
                        {"name": "all", "namespaceSelector": {}},
                        {"name": "tier-1", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-1"}}},
                    ]}),
                    vec!["spec.waves[0].namespaceSelector"],
                ),
                (
                    serde_json::json!({"analysisInterval": "0s"}),
                    vec!["spec.analysisInterval"],
                ),
            ],
        );
    }
}
