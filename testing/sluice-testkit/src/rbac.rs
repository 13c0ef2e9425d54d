//! RBAC that tests install in emulated clusters, derived from the same sources as the chart.

use std::collections::BTreeMap;

use sluice_api::v1alpha1::bundle_pin::DEFAULT_ALLOWED_KINDS;

/// Namespace of revert's identity in a workload cluster (the chart's release namespace).
pub const REVERT_TARGET_NAMESPACE: &str = "sluice-system";
/// Name of revert's ServiceAccount, ClusterRole and ClusterRoleBinding in a workload cluster.
pub const REVERT_TARGET_NAME: &str = "sluice-revert-target";

/// The resource (plural) of one of the allowlisted mesh kinds.
fn plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    }
}

/// revert's role in a workload cluster as the chart's
/// `templates/workload/revert-target-identity.yaml` renders it by default: the kinds a bundle
/// may hold (`DEFAULT_ALLOWED_KINDS`, which `scripts/chart-check.sh` checks the chart against)
/// except EnvoyFilter, which the chart grants only with `revertTarget.envoyFilters`, with get,
/// list, create, patch and delete, bound to [`REVERT_TARGET_NAME`] in
/// [`REVERT_TARGET_NAMESPACE`]. Multi-document YAML.
pub fn revert_target() -> String {
    revert_target_with(false)
}

/// [`revert_target`] as the chart renders it with `revertTarget.envoyFilters` set to
/// `envoy_filters`.
pub fn revert_target_with(envoy_filters: bool) -> String {
    let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (group, kind) in DEFAULT_ALLOWED_KINDS {
        if *kind == "EnvoyFilter" && !envoy_filters {
            continue;
        }
        by_group.entry(group).or_default().push(plural(kind));
    }
    let rules: String = by_group
        .iter()
        .map(|(group, resources)| {
            format!(
                "  - apiGroups: [\"{group}\"]\n    resources: {}\n    verbs: [\"get\", \"list\", \"create\", \"patch\", \"delete\"]\n",
                serde_json::to_string(resources).expect("strings encode")
            )
        })
        .collect();
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {REVERT_TARGET_NAME}\nrules:\n{rules}---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {REVERT_TARGET_NAME}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {REVERT_TARGET_NAME}\nsubjects:\n  - kind: ServiceAccount\n    name: {REVERT_TARGET_NAME}\n    namespace: {REVERT_TARGET_NAMESPACE}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_role_leaves_envoy_filters_out_as_the_chart_does() {
        assert!(!revert_target().contains("envoyfilters"));
        assert!(
            revert_target().replace(", ", ",").contains(
                "\"virtualservices\",\"destinationrules\",\"serviceentries\",\"sidecars\"]"
            )
        );
        assert!(revert_target_with(true).contains("envoyfilters"));
    }

    #[test]
    fn the_role_names_every_allowed_kind_by_its_resource_and_nothing_else() {
        let yaml = revert_target_with(true);
        for resource in [
            "\"httproutes\", \"grpcroutes\"",
            "\"virtualservices\",\"destinationrules\",\"serviceentries\",\"sidecars\",\"envoyfilters\"",
            "\"authorizationpolicies\",\"peerauthentications\",\"requestauthentications\"",
            "[\"telemetries\"]",
        ] {
            assert!(
                yaml.replace(", ", ",")
                    .contains(&resource.replace(", ", ",")),
                "{resource} missing from\n{yaml}"
            );
        }
        assert!(!yaml.contains("secrets") && !yaml.contains("deployments"));
        // One role, one binding; the binding's roleRef names the role.
        assert_eq!(yaml.matches("\nkind: ClusterRole\n").count(), 1);
        assert_eq!(yaml.matches("\nkind: ClusterRoleBinding\n").count(), 1);
        assert!(yaml.contains("  kind: ClusterRole\n  name: sluice-revert-target\n"));
    }
}
