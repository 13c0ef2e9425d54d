//! Validity of a BundlePin beyond what the API server's schema and CEL rules enforce:
//! `sluice_api::validation` (which also re-checks the CEL rules), plus revert's own rule that
//! the kinds a pin may apply are mesh configuration, never identity, RBAC or secrets (revert's
//! per-cluster identity is allowed only mesh kinds; a pin must not ask for more), and that the
//! git revert's base branch is a name git accepts (`git check-ref-format --branch`). Each problem
//! names its field (`spec.allowedKinds[2]: ...`).
//!
//! Pure; never reads the cluster or the registry (signatures are verified by the reconcile).

use sluice_api::v1alpha1::BundlePinSpec;

/// Kinds a bundle may never carry, by (group, kind).
pub const FORBIDDEN_KINDS: &[(&str, &str)] = &[
    ("", "Secret"),
    ("", "ServiceAccount"),
    ("rbac.authorization.k8s.io", "Role"),
    ("rbac.authorization.k8s.io", "RoleBinding"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
    ),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
];

/// The spec's problems, empty when it is valid.
pub fn problems(spec: &BundlePinSpec) -> Vec<String> {
    let mut out: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
    for (i, gk) in spec.allowed_kinds.iter().enumerate() {
        if FORBIDDEN_KINDS
            .iter()
            .any(|(g, k)| *g == gk.group && *k == gk.kind)
        {
            let shown = if gk.group.is_empty() {
                gk.kind.clone()
            } else {
                format!("{}.{}", gk.kind, gk.group)
            };
            out.push(format!(
                "spec.allowedKinds[{i}]: {shown} is not mesh configuration and may never be pinned; remove it"
            ));
        }
    }
    if let Some(git) = &spec.git_revert {
        const FIELD: &str = "spec.gitRevert.baseBranch";
        // The API's own check (characters, a leading '-') speaks first; one problem per field.
        if !out.iter().any(|p| p.starts_with(FIELD))
            && let Some(problem) = sluice_gitops::branch_name_problem(&git.base_branch)
        {
            out.push(format!(
                "{FIELD}: {:?} is not a git branch name: it {problem}; name the branch the revert is based on, as `git check-ref-format --branch` accepts it",
                git.base_branch
            ));
        }
    }
    out
}

/// The targets revert cannot reach, each `spec.targets[i].namespace: ...`: an Application
/// outside `application_namespace` (revert's `--namespace`, the only namespace the chart grants
/// its Role in), a target without a namespace being in `pin_namespace`. Refused up front rather
/// than retried against a forbidden answer forever. `None`: every namespace is reachable.
pub fn unreachable_targets(
    spec: &BundlePinSpec,
    pin_namespace: &str,
    application_namespace: Option<&str>,
) -> Vec<String> {
    let Some(allowed) = application_namespace else {
        return Vec::new();
    };
    spec.targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let ns = t.namespace.as_deref().unwrap_or(pin_namespace);
            (ns != allowed).then(|| {
                format!(
                    "spec.targets[{i}].namespace: revert may patch Applications only in namespace {allowed} (where its Role is granted); {ns}/{} is out of its reach. Pin Applications of {allowed} only",
                    t.name
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_runtime::validity::checks;

    fn spec(patch: serde_json::Value) -> BundlePinSpec {
        let base = serde_json::json!({
            "targets": [{"name": "mesh-config-c1", "namespace": "argocd"}],
            "bundle": {"repository": "oci://registry.example/mesh", "digest": format!("sha256:{}", "b".repeat(64))},
            "publicKeysSecretRef": {"name": "cosign", "keys": ["cosign.pub"]},
            "reason": "bad route",
        });
        checks::patched(base, &patch)
    }

    #[test]
    fn a_base_branch_git_would_refuse_is_named_with_the_rule_it_breaks() {
        let table = [
            ("main", None),
            ("release/2026.12", None),
            (
                "release..1",
                Some(
                    "spec.gitRevert.baseBranch: \"release..1\" is not a git branch name: it contains '..'",
                ),
            ),
            (
                "main.lock",
                Some("it has a component ending with '.lock' (main.lock)"),
            ),
            ("release/", Some("it starts or ends with '/'")),
            ("a//b", Some("it contains '//'")),
            ("main.", Some("it ends with '.'")),
            ("team/.x", Some("it has a component starting with '.' (.x)")),
        ];
        for (branch, want) in table {
            let got = problems(&spec(
                serde_json::json!({"gitRevert": {"commit": "abcdef1", "baseBranch": branch}}),
            ));
            match want {
                None => assert!(got.is_empty(), "{branch}: {got:?}"),
                Some(w) => {
                    assert_eq!(got.len(), 1, "{branch}: one problem per field: {got:?}");
                    assert!(
                        got[0].starts_with("spec.gitRevert.baseBranch: "),
                        "{branch}: {}",
                        got[0]
                    );
                    assert!(got[0].contains(w), "{branch}: {} lacks {w}", got[0]);
                }
            }
        }
        // What the API already refuses (a leading '-', a space) is said once, by the API's check.
        for branch in ["-main", "release 1", "main~1"] {
            let got = problems(&spec(
                serde_json::json!({"gitRevert": {"commit": "abcdef1", "baseBranch": branch}}),
            ));
            assert_eq!(got.len(), 1, "{branch}: {got:?}");
            assert!(got[0].starts_with("spec.gitRevert.baseBranch"), "{got:?}");
        }
    }

    #[test]
    fn problems_name_their_field() {
        checks::problems_name_their_fields(
            |patch| problems(&spec(patch.clone())),
            [
                (
                    serde_json::json!({"allowedKinds": [{"group": "networking.istio.io", "kind": "VirtualService"}]}),
                    vec![],
                ),
                (
                    serde_json::json!({"allowedKinds": [{"group": "networking.istio.io", "kind": "VirtualService"}, {"kind": "Secret"}]}),
                    vec!["spec.allowedKinds[1]"],
                ),
                (
                    serde_json::json!({"allowedKinds": [{"group": "rbac.authorization.k8s.io", "kind": "ClusterRoleBinding"}]}),
                    vec!["spec.allowedKinds[0]"],
                ),
            ],
        );
    }
}
