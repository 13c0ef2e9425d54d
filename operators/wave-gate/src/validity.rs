//! Validity of a WaveGate beyond what the API server's schema and CEL rules enforce: delegates to
//! `sluice_api::validation` (which also re-checks the CEL rules, in case the API server did not
//! run them) and turns its field errors into condition-message lines, each naming its field
//! (`spec.analysisInterval: ...`).
//!
//! Pure; never reads the cluster.

use sluice_api::v1alpha1::{WaveGateSpec, wave_gate::DriftExporter};

/// The spec's problems, each `path: what is wrong`; empty when it is valid.
/// `allow_free_form_promql` is the platform's policy for free-form PromQL gates.
pub fn problems(spec: &WaveGateSpec, allow_free_form_promql: bool) -> Vec<String> {
    let mut out: Vec<String> = spec
        .validate(allow_free_form_promql)
        .iter()
        .map(ToString::to_string)
        .collect();
    if spec.drift_gate.exporter == DriftExporter::Platform && spec.source_commit.is_none() {
        out.push(
            "spec.sourceCommit: required with driftGate.exporter Platform: the drift exporter labels proxies behind by the bundle's source commit; set it to the bundle's org.opencontainers.image.revision"
                .into(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_runtime::validity::checks;

    fn spec(patch: serde_json::Value) -> WaveGateSpec {
        let digest = format!("sha256:{}", "a".repeat(64));
        let base = serde_json::json!({
            "site": "site-a",
            "applicationSetRef": {"name": "mesh-config", "namespace": "argocd"},
            "repository": "oci://registry.example/mesh",
            "revision": digest,
            "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2", "c3"]}],
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]}},
        });
        checks::patched(base, &patch)
    }

    #[test]
    fn problems_name_their_field() {
        checks::problems_name_their_fields(
            |patch| problems(&spec(patch.clone()), false),
            [
                (
                    serde_json::json!({"driftGate": {"exporter": "Platform"}}),
                    vec!["spec.driftGate.metric", "spec.sourceCommit"],
                ),
                (
                    serde_json::json!({"driftGate": {"exporter": "Platform", "metric": "m"}, "sourceCommit": "abc1234"}),
                    vec![],
                ),
                (
                    serde_json::json!({"convergenceTimeout": "0m", "analysisInterval": "0s"}),
                    vec!["spec.convergenceTimeout", "spec.analysisInterval"],
                ),
                (
                    serde_json::json!({"waves": [{"name": "a", "clusters": ["c1"]}, {"name": "a", "clusters": ["c2"]}]}),
                    vec!["spec.waves[1].name"],
                ),
            ],
        );
    }
}
