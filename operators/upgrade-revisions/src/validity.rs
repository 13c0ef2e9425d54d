//! What a RevisionUpgrade's CRD schema and CEL rules cannot check: durations that must parse
//! and be positive. Each problem names its field (`spec.waves[0].soak: ...`).
//!
//! Pure; never reads the cluster (revision tags are checked by the reconcile against the
//! webhook configurations it observes).

use sluice_api::v1alpha1::{DurationString, RevisionUpgradeSpec};

fn duration(problems: &mut Vec<String>, path: &str, value: &DurationString) {
    match value.parse() {
        Ok(d) if d.is_zero() => problems.push(format!(
            "{path}: {value:?} is zero; give a positive duration such as 15m"
        )),
        Ok(_) => {}
        Err(err) => problems.push(format!("{path}: {err}")),
    }
}

/// The spec's problems, empty when it is valid.
pub fn problems(spec: &RevisionUpgradeSpec) -> Vec<String> {
    let mut out = Vec::new();
    duration(&mut out, "spec.analysisInterval", &spec.analysis_interval);
    for (i, wave) in spec.waves.iter().enumerate() {
        if let Some(soak) = &wave.soak {
            duration(&mut out, &format!("spec.waves[{i}].soak"), soak);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(patch: serde_json::Value) -> RevisionUpgradeSpec {
        let mut base = serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27",
            "toTag": "canary", "toRevision": "1-28",
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
                serde_json::json!({"waves": [{"name": "low", "namespaceSelector": {}, "soak": "0m"}]}),
                vec!["spec.waves[0].soak"],
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
