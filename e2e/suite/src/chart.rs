//! The chart as rendered by helm: which documents a mode installs, the RBAC among them, the
//! operators' Deployment arguments, and a copy with one rule taken out (for the negative check).
//! Owns reading the rendered chart; never edits the chart or invents a grant it does not render.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Release name the suite renders the chart with (objects are named `sluice-<component>`).
pub const RELEASE: &str = "sluice";
/// Release namespace (the operators' ServiceAccounts and Leases live here).
pub const NAMESPACE: &str = "sluice-system";

/// Kinds that make up the chart's RBAC.
pub const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
];

/// Kinds of the chart's admission policies (the owned-route policy).
pub const ADMISSION_KINDS: [&str; 2] = [
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// How the chart is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Default values: a management cluster beside Argo CD (every operator).
    Management,
    /// `charts/sluice/ci/workload-values.yaml`: rollout-weights, upgrade-revisions and revert's
    /// target identity.
    Workload,
}

/// Rendering the chart failed.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ChartError {
    /// No helm binary was found.
    #[error(
        "helm is not installed: looked for $SLUICE_HELM, {tools} and `helm` on PATH; run \
         scripts/install-tools.sh or put helm on PATH"
    )]
    HelmMissing {
        /// The repository's tools path looked at.
        tools: String,
    },
    /// helm ran and failed.
    #[error("`{command}` failed ({status}): {stderr}; fix the chart or its values")]
    Render {
        /// The command.
        command: String,
        /// Exit status.
        status: String,
        /// helm's error output.
        stderr: String,
    },
    /// helm could not be started.
    #[error("starting {helm} failed: {source}")]
    Spawn {
        /// helm path.
        helm: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The rendered output is not YAML.
    #[error("the rendered chart is not valid YAML: {0}; run `helm template` by hand to see it")]
    Yaml(#[from] serde_yaml::Error),
}

impl ChartError {
    /// Bounded category (metric label, skip reason).
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// The helm binary: `$SLUICE_HELM`, the repository's `.tools/bin/helm`, or `helm` on PATH.
pub fn helm(repo: &Path) -> Result<PathBuf, ChartError> {
    if let Some(p) = std::env::var_os("SLUICE_HELM").map(PathBuf::from)
        && p.is_file()
    {
        return Ok(p);
    }
    let tools = repo.join(".tools/bin/helm");
    if tools.is_file() {
        return Ok(tools);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("helm"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| ChartError::HelmMissing {
        tools: tools.display().to_string(),
    })
}

/// Renders `charts/sluice` in `mode` and returns every document.
pub fn render(repo: &Path, mode: Mode) -> Result<Vec<Value>, ChartError> {
    let helm = helm(repo)?;
    let mut cmd = Command::new(&helm);
    cmd.current_dir(repo).args([
        "template",
        RELEASE,
        "charts/sluice",
        "--namespace",
        NAMESPACE,
    ]);
    if mode == Mode::Workload {
        cmd.args(["-f", "charts/sluice/ci/workload-values.yaml"]);
    }
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| ChartError::Spawn {
        helm: helm.display().to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(ChartError::Render {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Parses multi-document YAML, dropping empty documents.
pub fn parse(text: &str) -> Result<Vec<Value>, ChartError> {
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(de)?;
        if v.is_object() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// The documents of the given kinds.
pub fn of_kinds(docs: &[Value], kinds: &[&str]) -> Vec<Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| kinds.contains(&k)))
        .cloned()
        .collect()
}

/// Every namespace the documents live in or bind subjects in (they must exist before loading).
pub fn namespaces(docs: &[Value]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for d in docs {
        if let Some(ns) = d["metadata"]["namespace"].as_str() {
            out.insert(ns.to_owned());
        }
        for s in d["subjects"].as_array().into_iter().flatten() {
            if let Some(ns) = s["namespace"].as_str() {
                out.insert(ns.to_owned());
            }
        }
    }
    out
}

/// The documents as one multi-document YAML text.
pub fn to_yaml(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).expect("JSON values serialize as YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The chart's ServiceAccount name of `component` (`sluice-rollout-weights`).
pub fn service_account(component: &str) -> String {
    format!("{RELEASE}-{component}")
}

/// The container arguments of the Deployment `sluice-<component>`, with the metrics address
/// and log format replaced for a local process (`--metrics-addr=127.0.0.1:<port>`, text logs).
pub fn deployment_args(docs: &[Value], component: &str, metrics_port: u16) -> Option<Vec<String>> {
    let name = service_account(component);
    let d = docs.iter().find(|d| {
        d["kind"] == "Deployment" && d["metadata"]["name"].as_str() == Some(name.as_str())
    })?;
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].as_array()?;
    Some(
        args.iter()
            .filter_map(Value::as_str)
            .map(|a| {
                if a.starts_with("--metrics-addr=") {
                    format!("--metrics-addr=127.0.0.1:{metrics_port}")
                } else if a.starts_with("--log-format=") {
                    "--log-format=text".to_owned()
                } else {
                    a.to_owned()
                }
            })
            .collect(),
    )
}

/// A copy of `docs` with the first rule of the `kind` (Role or ClusterRole) named `name` for
/// which `matches` holds removed; also returns the removed rule, or `None` when nothing matched.
pub fn without_rule(
    docs: &[Value],
    kind: &str,
    name: &str,
    matches: impl Fn(&Value) -> bool,
) -> (Vec<Value>, Option<Value>) {
    let mut out = docs.to_vec();
    let mut removed = None;
    for d in &mut out {
        if removed.is_some() || d["kind"] != kind || d["metadata"]["name"].as_str() != Some(name) {
            continue;
        }
        if let Some(rules) = d["rules"].as_array_mut()
            && let Some(i) = rules.iter().position(&matches)
        {
            removed = Some(rules.remove(i));
        }
    }
    (out, removed)
}

/// Whether an RBAC rule grants `resource` in `group`.
pub fn rule_grants(rule: &Value, group: &str, resource: &str) -> bool {
    let has = |key: &str, want: &str| {
        rule[key]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == want || v == "*"))
    };
    has("apiGroups", group) && has("resources", resource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role() -> Value {
        json!({"kind": "ClusterRole", "metadata": {"name": "sluice-x"}, "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        ]})
    }

    #[test]
    fn rule_grants_matches_group_and_resource() {
        let rules = role()["rules"].clone();
        let cases = [
            (0, "apps", "deployments", true),
            (0, "", "deployments", false),
            (1, "", "pods/eviction", true),
            (1, "", "pods", false),
        ];
        for (i, g, r, want) in cases {
            assert_eq!(rule_grants(&rules[i], g, r), want, "{g}/{r}");
        }
    }

    #[test]
    fn without_rule_removes_only_the_matching_rule_of_the_named_role() {
        let other =
            json!({"kind": "ClusterRole", "metadata": {"name": "other"}, "rules": role()["rules"]});
        let docs = vec![role(), other.clone()];
        let (out, removed) = without_rule(&docs, "ClusterRole", "sluice-x", |r| {
            rule_grants(r, "", "pods/eviction")
        });
        assert_eq!(removed.unwrap()["resources"][0], "pods/eviction");
        assert_eq!(out[0]["rules"].as_array().unwrap().len(), 1);
        assert_eq!(out[1], other, "another role is left alone");
        let (_, none) = without_rule(&docs, "Role", "sluice-x", |_| true);
        assert!(none.is_none(), "kind must match too");
    }

    #[test]
    fn deployment_args_keep_the_chart_flags_and_localise_the_rest() {
        let docs = vec![
            json!({"kind": "Deployment", "metadata": {"name": "sluice-wave-gate"},
            "spec": {"template": {"spec": {"containers": [{"args": [
                "--lease-name=sluice-wave-gate", "--metrics-addr=0.0.0.0:8080",
                "--log-format=json", "--namespace=argocd"]}]}}}}),
        ];
        let args = deployment_args(&docs, "wave-gate", 9000).unwrap();
        assert_eq!(
            args,
            [
                "--lease-name=sluice-wave-gate",
                "--metrics-addr=127.0.0.1:9000",
                "--log-format=text",
                "--namespace=argocd"
            ]
        );
        assert!(deployment_args(&docs, "revert", 1).is_none());
    }

    #[test]
    fn namespaces_include_binding_subjects() {
        let docs = vec![
            json!({"kind": "RoleBinding", "metadata": {"name": "b", "namespace": "argocd"},
            "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": "sluice-system"}]}),
        ];
        let ns: Vec<_> = namespaces(&docs).into_iter().collect();
        assert_eq!(ns, ["argocd", "sluice-system"]);
    }

    #[test]
    fn parse_drops_empty_documents() {
        let docs = parse("---\n# only a comment\n---\nkind: A\n---\n").unwrap();
        assert_eq!(docs.len(), 1);
    }
}
