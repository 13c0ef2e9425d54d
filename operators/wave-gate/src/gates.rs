//! The gate checks of one wave, as `sluice-analysis` takes them: every gate of the WaveGate
//! (or the built-ins) over all clusters of the wave as one check per gate (the wave's clusters
//! are its subject bindings, so a gate reads the whole wave in one batched query), plus one drift
//! reading per cluster for convergence (a cluster without a drift series must not hide behind
//! the others' sum).
//!
//! Owns the variables a wave supplies (`cluster`, `site`, `wave`, `revision`, `commit`) and the
//! drift query of the platform's exporter contract. Pure; never queries anything itself.

use std::collections::BTreeMap;

use sluice_analysis::{GateCheck, Vars, resolve_gate};
use sluice_api::v1alpha1::{
    BuiltinGate, Comparison, ComparisonOp, GateQuery, GateTemplateSpec, GateVerdict, ResolvedGate,
    WaveGateSpec, WaveGateStatus,
    gate::find_verdict,
    wave_gate::{DEFAULT_DRIFT_COMMIT_LABEL, DriftExporter},
};

/// The drift exporter contract's gauge of proxies behind (GATES.md, ProxiesBehind).
pub const DEFAULT_DRIFT_METRIC: &str = "sluice_drift_proxies_behind";

/// The window the drift reading looks back over (`last_over_time`).
pub const DRIFT_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The checks of wave `wave` and the gates that could not be resolved (with their resolved
/// policy, when known, for the Inconclusive action).
#[derive(Debug, Clone, Default)]
pub struct WaveChecks {
    /// One check per gate.
    pub checks: Vec<GateCheck>,
    /// Gates that could not be resolved: (name, why).
    pub unresolved: Vec<(String, String)>,
}

fn uses_custom_drift_query(spec: &WaveGateSpec, cluster_label: &str) -> bool {
    let d = &spec.drift_gate;
    d.metric.as_deref().unwrap_or(DEFAULT_DRIFT_METRIC) != DEFAULT_DRIFT_METRIC
        || d.cluster_label != cluster_label
        || d.commit_label != DEFAULT_DRIFT_COMMIT_LABEL
        || d.job.is_some()
}

/// The drift query of a platform whose exporter uses its own metric or label names: the value
/// only (no proxies-evaluated count), so its checks set no minimum of samples.
pub fn custom_drift_query(spec: &WaveGateSpec) -> String {
    let d = &spec.drift_gate;
    // The schema allows no quote or backslash in a job; escaped all the same.
    let job = d.job.as_deref().map_or_else(String::new, |j| {
        format!(", job=\"{}\"", j.replace('\\', "\\\\").replace('"', "\\\""))
    });
    format!(
        "label_replace(sum by ({{{{by}}}}) (last_over_time({}{{{}=\"{{{{cluster}}}}\", {}=\"{{{{commit}}}}\"{}}}[{{{{window}}}}])), \"sluice_part\", \"value\", \"\", \"\")",
        d.metric.as_deref().unwrap_or(DEFAULT_DRIFT_METRIC),
        d.cluster_label,
        d.commit_label,
        job
    )
}

fn base_vars(spec: &WaveGateSpec, wave: usize) -> Vars {
    let mut vars = Vars::new();
    vars.insert("site".into(), spec.site.clone());
    vars.insert("wave".into(), spec.waves[wave].name.clone());
    vars.insert("revision".into(), spec.revision.clone());
    if let Some(c) = &spec.source_commit {
        vars.insert("commit".into(), c.clone());
    }
    vars
}

fn adapt_drift(spec: &WaveGateSpec, gate: &mut ResolvedGate, cluster_label: &str) -> bool {
    if gate.query == GateQuery::Builtin(BuiltinGate::ProxiesBehind)
        && uses_custom_drift_query(spec, cluster_label)
    {
        gate.query = GateQuery::PromQl(custom_drift_query(spec));
        gate.min_samples = 0;
        return true;
    }
    false
}

/// The gate checks of wave `wave` (index into `spec.waves`). `templates` holds the GateTemplates
/// the gates reference; `cluster_label` is the engine's cluster label.
pub fn wave_checks(
    spec: &WaveGateSpec,
    status: &WaveGateStatus,
    wave: usize,
    owner: &str,
    templates: &BTreeMap<String, GateTemplateSpec>,
    cluster_label: &str,
) -> WaveChecks {
    let mut out = WaveChecks::default();
    let previous: &[GateVerdict] = status
        .waves
        .get(wave)
        .map(|w| w.gates.as_slice())
        .unwrap_or_default();
    let vars = base_vars(spec, wave);
    for gate in spec.effective_gates() {
        let template = gate.template_ref.as_ref().and_then(|t| templates.get(t));
        let is_drift = gate.definition.builtin == Some(BuiltinGate::ProxiesBehind)
            || template.is_some_and(|t| t.definition.builtin == Some(BuiltinGate::ProxiesBehind));
        if is_drift && spec.drift_gate.exporter == DriftExporter::None {
            continue;
        }
        let mut resolved = match resolve_gate(&gate, template, Some(&spec.inconclusive)) {
            Ok(r) => r,
            Err(e) => {
                out.unresolved.push((gate.name.clone(), e.to_string()));
                continue;
            }
        };
        // The operator builds the drift query from validated names; it is not free-form PromQL.
        let operator_built = adapt_drift(spec, &mut resolved, cluster_label);
        let mut check = GateCheck::new(owner, resolved, vars.clone());
        check.owner_namespaced = !operator_built;
        check.subject = spec.waves[wave]
            .clusters
            .iter()
            .map(|c| Vars::from([("cluster".to_owned(), c.clone())]))
            .collect();
        check.previous = find_verdict(previous, &gate.name).cloned();
        out.checks.push(check);
    }
    out
}

/// One drift reading per cluster of wave `wave` (value: proxies behind `spec.sourceCommit`).
/// Empty when the platform has no exporter or no commit is known.
pub fn drift_checks(
    spec: &WaveGateSpec,
    wave: usize,
    owner: &str,
    cluster_label: &str,
) -> Vec<(String, GateCheck)> {
    if spec.drift_gate.exporter == DriftExporter::None || spec.source_commit.is_none() {
        return Vec::new();
    }
    let mut gate = match sluice_api::v1alpha1::Gate::builtin("drift", BuiltinGate::ProxiesBehind)
        .resolve(None)
    {
        Ok(g) => g,
        Err(_) => return Vec::new(),
    };
    gate.window = DRIFT_WINDOW;
    gate.min_samples = 0;
    gate.consecutive_failures = 1;
    gate.comparison = Comparison::absolute(
        ComparisonOp::LessOrEqual,
        f64::from(spec.drift_gate.max_proxies_behind),
    );
    let operator_built = adapt_drift(spec, &mut gate, cluster_label);
    let vars = base_vars(spec, wave);
    spec.waves[wave]
        .clusters
        .iter()
        .map(|c| {
            let mut v = vars.clone();
            v.insert("cluster".into(), c.clone());
            let mut check = GateCheck::new(owner, gate.clone(), v);
            check.owner_namespaced = !operator_built;
            (c.clone(), check)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_analysis::{EngineOptions, engine::plan};

    fn spec(drift: serde_json::Value, gates: serde_json::Value) -> WaveGateSpec {
        serde_json::from_value(serde_json::json!({
            "site": "eu",
            "applicationSetRef": {"name": "mesh"},
            "repository": "oci://registry.local/mesh",
            "revision": format!("sha256:{}", "b".repeat(64)),
            "sourceCommit": "abc1234",
            "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2", "c3"]}],
            "driftGate": drift,
            "gates": gates,
            "pin": {"publicKeysSecretRef": {"name": "keys"}},
        }))
        .unwrap()
    }

    fn queries(checks: &[GateCheck]) -> Vec<String> {
        plan(checks, &EngineOptions::default(), false)
            .queries()
            .unwrap()
    }

    #[test]
    fn checks_per_exporter_and_metric_table() {
        let platform = serde_json::json!({"exporter": "Platform", "metric": DEFAULT_DRIFT_METRIC});
        let custom = serde_json::json!({"exporter": "Platform", "metric": "mesh_drift_behind", "clusterLabel": "k8s_cluster", "commitLabel": "sha"});
        let none = serde_json::json!({"exporter": "None"});
        let pinned = serde_json::json!({"exporter": "Platform", "job": "mesh/drift-exporter"});
        // (drift, wave, want gate names, want query fragment, want drift checks)
        let cases = [
            (
                pinned,
                0,
                vec!["mesh-error-ratio", "xds-nack-increase", "proxies-behind"],
                "sluice_drift_proxies_behind{cluster=\"c1\", commit=\"abc1234\", job=\"mesh/drift-exporter\"}",
                1,
            ),
            (
                platform.clone(),
                1,
                vec!["mesh-error-ratio", "xds-nack-increase", "proxies-behind"],
                "sluice_drift_proxies_behind{cluster=~\"c2|c3\", commit=\"abc1234\"}",
                2,
            ),
            (
                custom,
                0,
                vec!["mesh-error-ratio", "xds-nack-increase", "proxies-behind"],
                "mesh_drift_behind{k8s_cluster=\"c1\", sha=\"abc1234\"}",
                1,
            ),
            (
                none,
                1,
                vec!["mesh-error-ratio", "xds-nack-increase"],
                "pilot_total_xds_rejects{cluster=~\"c2|c3\"}",
                0,
            ),
        ];
        for (drift, wave, want, fragment, want_drift) in cases {
            let s = spec(drift.clone(), serde_json::json!([]));
            let w = wave_checks(
                &s,
                &WaveGateStatus::default(),
                wave,
                "WaveGate argocd/eu",
                &BTreeMap::new(),
                "cluster",
            );
            let names: Vec<&str> = w.checks.iter().map(|c| c.gate.name.as_str()).collect();
            assert_eq!(names, want, "{drift}");
            let qs = queries(&w.checks);
            assert!(
                qs.iter().any(|q| q.contains(fragment)),
                "{drift}: no query contains {fragment}: {qs:#?}"
            );
            let d = drift_checks(&s, wave, "WaveGate argocd/eu", "cluster");
            assert_eq!(d.len(), want_drift, "{drift}");
            let dq = queries(&d.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>());
            assert!(dq.len() <= 1, "one batched drift query per tick: {dq:#?}");
        }
    }

    #[test]
    fn missing_template_is_reported_and_policy_defaults_to_the_spec() {
        let s = spec(
            serde_json::json!({"exporter": "None"}),
            serde_json::json!([{"name": "custom", "templateRef": "absent"}, {"name": "nacks", "builtin": "XdsNackIncrease"}]),
        );
        let w = wave_checks(
            &s,
            &WaveGateStatus::default(),
            0,
            "WaveGate argocd/eu",
            &BTreeMap::new(),
            "cluster",
        );
        assert_eq!(w.unresolved.len(), 1);
        assert!(w.unresolved[0].1.contains("absent"), "{:?}", w.unresolved);
        assert_eq!(w.checks.len(), 1);
        assert_eq!(
            w.checks[0].gate.inconclusive_action, s.inconclusive.action,
            "a gate without its own policy takes spec.inconclusive"
        );
    }
}
