//! What a WaveGate's CRD schema and CEL rules cannot check: durations that must parse and be
//! positive. Each problem names its field (`spec.waves[1].soak: ...`).
//!
//! Pure; never reads the cluster (the ApplicationSet's safety is checked by the reconcile
//! against what it observes).

use sluice_api::v1alpha1::{DurationString, WaveGateSpec};

fn duration(problems: &mut Vec<String>, path: &str, value: &DurationString) {
    match value.parse() {
        Ok(d) if d.is_zero() => problems.push(format!(
            "{path}: {value:?} is zero; give a positive duration such as 10m"
        )),
        Ok(_) => {}
        Err(err) => problems.push(format!("{path}: {err}")),
    }
}

/// The spec's problems, empty when it is valid.
pub fn problems(spec: &WaveGateSpec) -> Vec<String> {
    let mut out = Vec::new();
    duration(&mut out, "spec.defaultSoak", &spec.default_soak);
    duration(
        &mut out,
        "spec.convergenceTimeout",
        &spec.convergence_timeout,
    );
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

    fn spec(patch: serde_json::Value) -> WaveGateSpec {
        let digest = format!("sha256:{}", "a".repeat(64));
        let mut base = serde_json::json!({
            "site": "site-a",
            "applicationSetRef": {"name": "mesh-config", "namespace": "argocd"},
            "repository": "oci://registry.example/mesh",
            "revision": digest,
            "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2", "c3"]}],
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]}},
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
                serde_json::json!({"defaultSoak": "0s"}),
                vec!["spec.defaultSoak"],
            ),
            (
                serde_json::json!({"convergenceTimeout": "0m", "analysisInterval": "0s"}),
                vec!["spec.convergenceTimeout", "spec.analysisInterval"],
            ),
            (
                serde_json::json!({"waves": [{"name": "a", "clusters": ["c1"]}, {"name": "b", "clusters": ["c2"], "soak": "0s"}]}),
                vec!["spec.waves[1].soak"],
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
