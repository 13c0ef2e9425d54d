//! Rolling-update planning for Deployments, StatefulSets and DaemonSets: pure functions from the
//! desired shape and the owned pods seen now to the pods to create and delete next. Owns the
//! arithmetic of maxSurge/maxUnavailable/partition; never talks to the API (the controllers in
//! [`super::controllers`] carry the plans out and call again on the next change).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Resolves an int-or-percent field against `total` the way Kubernetes does: percentages of
/// `total`, rounded up when `round_up` (maxSurge, PDB minAvailable) and down otherwise
/// (maxUnavailable). An unparsable percentage counts as 0.
pub fn scaled(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    match value {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let pct: f64 = s.trim_end_matches('%').trim().parse().unwrap_or(0.0);
            let raw = pct * f64::from(total) / 100.0;
            if round_up {
                raw.ceil() as i32
            } else {
                raw.floor() as i32
            }
        }
    }
}

/// One owned, non-terminating pod as the planners see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Pod name.
    pub name: String,
    /// Whether the pod runs the current template (hash label matches).
    pub updated: bool,
    /// Whether the pod is Ready.
    pub ready: bool,
}

/// A Deployment's update strategy with maxSurge/maxUnavailable already resolved to pod counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentStrategy {
    /// Replace pods gradually within the surge and unavailability budgets.
    RollingUpdate {
        /// Pods allowed above `replicas`.
        max_surge: i32,
        /// Pods allowed below `replicas` that are not ready.
        max_unavailable: i32,
    },
    /// Delete every old pod before creating new ones.
    Recreate,
}

/// Pods to create and delete next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Number of pods of the current template to create.
    pub create: u32,
    /// Names of pods to delete.
    pub delete: Vec<String>,
}

/// Picks `n` pods to delete from `pods`, unready ones first (they cost no availability).
fn pick(pods: &[&PodView], n: usize) -> Vec<String> {
    let mut ordered: Vec<&&PodView> = pods.iter().collect();
    ordered.sort_by_key(|p| (p.ready, std::cmp::Reverse(p.name.clone())));
    ordered
        .into_iter()
        .take(n)
        .map(|p| p.name.clone())
        .collect()
}

/// Plans one step of a Deployment, like the deployment controller does for its old and new
/// ReplicaSets: scale the new template up within `replicas + maxSurge`, and scale old pods down
/// while at least `replicas - maxUnavailable` pods stay ready (unready old pods go first). If both
/// budgets resolve to 0 (which the API server rejects), maxUnavailable is taken as 1.
pub fn plan_deployment(replicas: i32, strategy: DeploymentStrategy, pods: &[PodView]) -> Plan {
    let replicas = replicas.max(0);
    let new: Vec<&PodView> = pods.iter().filter(|p| p.updated).collect();
    let old: Vec<&PodView> = pods.iter().filter(|p| !p.updated).collect();
    let new_n = new.len() as i32;
    let old_n = old.len() as i32;
    let mut plan = Plan::default();
    if new_n > replicas {
        plan.delete.extend(pick(&new, (new_n - replicas) as usize));
    }
    match strategy {
        DeploymentStrategy::Recreate => {
            if old_n > 0 {
                plan.delete.extend(pick(&old, old.len()));
            } else {
                plan.create = (replicas - new_n).max(0) as u32;
            }
        }
        DeploymentStrategy::RollingUpdate {
            max_surge,
            max_unavailable,
        } => {
            let (max_surge, max_unavailable) = if max_surge <= 0 && max_unavailable <= 0 {
                (0, 1)
            } else {
                (max_surge.max(0), max_unavailable.max(0))
            };
            let room = replicas + max_surge - (new_n + old_n);
            plan.create = (replicas - new_n).min(room).max(0) as u32;
            if old_n > 0 {
                let min_available = replicas - max_unavailable;
                let new_unready = new.iter().filter(|p| !p.ready).count() as i32;
                let mut budget = new_n + old_n - min_available - new_unready;
                let unready_old: Vec<&PodView> = old.iter().copied().filter(|p| !p.ready).collect();
                let take = budget.clamp(0, unready_old.len() as i32);
                plan.delete.extend(pick(&unready_old, take as usize));
                budget -= take;
                let ready_old: Vec<&PodView> = old.iter().copied().filter(|p| p.ready).collect();
                let available = pods.iter().filter(|p| p.ready).count() as i32;
                let healthy_budget = budget.min(available - min_available);
                let take = healthy_budget.clamp(0, ready_old.len() as i32);
                plan.delete.extend(pick(&ready_old, take as usize));
            }
        }
    }
    plan
}

/// One owned StatefulSet pod, by ordinal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrdinalPod {
    /// The pod's ordinal (`<set>-<ordinal>`).
    pub ordinal: u32,
    /// Pod name.
    pub name: String,
    /// Whether the pod runs the current revision.
    pub updated: bool,
    /// Whether the pod is Ready.
    pub ready: bool,
}

/// StatefulSet pod management and update policies, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatefulSetPolicy {
    /// `podManagementPolicy: Parallel` (otherwise OrderedReady).
    pub parallel: bool,
    /// `updateStrategy: OnDelete` (otherwise RollingUpdate).
    pub on_delete: bool,
    /// RollingUpdate partition: ordinals below it keep the old revision.
    pub partition: u32,
}

/// StatefulSet step: ordinals to create and pod names to delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrdinalPlan {
    /// Ordinals to create with the current revision.
    pub create: Vec<u32>,
    /// Pod names to delete.
    pub delete: Vec<String>,
}

/// Plans one step of a StatefulSet like the statefulset controller: create missing ordinals
/// (OrderedReady: the lowest one, once every lower pod is ready), remove ordinals at or above
/// `replicas` (highest first), and only when all pods exist and are ready roll the highest
/// ordinal at or above the partition that still runs the old revision (delete; it comes back
/// with the new revision).
pub fn plan_statefulset(
    replicas: u32,
    policy: StatefulSetPolicy,
    pods: &[OrdinalPod],
) -> OrdinalPlan {
    let mut plan = OrdinalPlan::default();
    let by_ordinal = |o: u32| pods.iter().find(|p| p.ordinal == o);
    let all_ready = pods.iter().all(|p| p.ready);
    // Scale down: highest condemned ordinal first.
    let mut condemned: Vec<&OrdinalPod> = pods.iter().filter(|p| p.ordinal >= replicas).collect();
    condemned.sort_by_key(|p| std::cmp::Reverse(p.ordinal));
    if policy.parallel {
        plan.delete.extend(condemned.iter().map(|p| p.name.clone()));
    } else if let Some(first) = condemned.first()
        && all_ready
    {
        plan.delete.push(first.name.clone());
    }
    // Scale up / replace missing ordinals.
    for ordinal in 0..replicas {
        if by_ordinal(ordinal).is_some() {
            continue;
        }
        if policy.parallel {
            plan.create.push(ordinal);
        } else {
            let lower_ready = (0..ordinal).all(|o| by_ordinal(o).is_some_and(|p| p.ready));
            if lower_ready {
                plan.create.push(ordinal);
            }
            break;
        }
    }
    if !plan.create.is_empty() || !plan.delete.is_empty() || policy.on_delete {
        return plan;
    }
    let complete = (0..replicas).all(|o| by_ordinal(o).is_some());
    if complete && all_ready {
        let stale = pods
            .iter()
            .filter(|p| p.ordinal < replicas && p.ordinal >= policy.partition && !p.updated)
            .max_by_key(|p| p.ordinal);
        if let Some(p) = stale {
            plan.delete.push(p.name.clone());
        }
    }
    plan
}

/// One owned DaemonSet pod and the node it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    /// `spec.nodeName`.
    pub node: String,
    /// Pod name.
    pub name: String,
    /// Whether the pod runs the current template.
    pub updated: bool,
    /// Whether the pod is Ready.
    pub ready: bool,
}

/// DaemonSet step: nodes to create a current pod on, pod names to delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// Nodes that get a new pod of the current template.
    pub create_on: Vec<String>,
    /// Pod names to delete.
    pub delete: Vec<String>,
}

/// Plans one step of a DaemonSet's RollingUpdate over `nodes`: every node gets one current pod;
/// old pods are replaced either by surging (new pod first, old deleted once the new one is ready,
/// at most `max_surge` nodes at a time) or by deleting within `max_unavailable` nodes without a
/// ready pod. Both 0 means maxUnavailable 1. Pods on unknown nodes are deleted.
pub fn plan_daemonset(
    nodes: &[String],
    max_surge: i32,
    max_unavailable: i32,
    pods: &[NodePod],
) -> NodePlan {
    let (max_surge, max_unavailable) = if max_surge <= 0 && max_unavailable <= 0 {
        (0, 1)
    } else {
        (max_surge.max(0), max_unavailable.max(0))
    };
    let mut plan = NodePlan::default();
    plan.delete.extend(
        pods.iter()
            .filter(|p| !nodes.contains(&p.node))
            .map(|p| p.name.clone()),
    );
    let on = |node: &String| {
        let node = node.clone();
        pods.iter().filter(move |p| p.node == node)
    };
    let mut unavailable = nodes.iter().filter(|n| !on(n).any(|p| p.ready)).count() as i32;
    let mut surging = nodes
        .iter()
        .filter(|n| on(n).any(|p| p.updated && !p.ready) && on(n).any(|p| !p.updated))
        .count() as i32;
    for node in nodes {
        let new: Vec<&NodePod> = on(node).filter(|p| p.updated).collect();
        let old: Vec<&NodePod> = on(node).filter(|p| !p.updated).collect();
        if new.len() > 1 {
            plan.delete.extend(new[1..].iter().map(|p| p.name.clone()));
        }
        match (new.first(), old.is_empty()) {
            (None, true) => plan.create_on.push(node.clone()),
            (Some(n), false) if n.ready => plan.delete.extend(old.iter().map(|p| p.name.clone())),
            (Some(_), _) => {}
            (None, false) => {
                let old_ready = old.iter().any(|p| p.ready);
                if max_surge > 0 && old_ready {
                    if surging < max_surge {
                        surging += 1;
                        plan.create_on.push(node.clone());
                    }
                } else if !old_ready || unavailable < max_unavailable {
                    if old_ready {
                        unavailable += 1;
                    }
                    plan.delete.extend(old.iter().map(|p| p.name.clone()));
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(spec: &str) -> Vec<PodView> {
        // "o+ o- n+ n-": old/new, ready(+)/unready(-)
        spec.split_whitespace()
            .enumerate()
            .map(|(i, t)| PodView {
                name: format!("{}{i}", &t[..1]),
                updated: t.starts_with('n'),
                ready: t.ends_with('+'),
            })
            .collect()
    }

    fn rolling(s: i32, u: i32) -> DeploymentStrategy {
        DeploymentStrategy::RollingUpdate {
            max_surge: s,
            max_unavailable: u,
        }
    }

    #[test]
    fn scaled_table() {
        let cases = [
            (IntOrString::Int(2), 10, true, 2),
            (IntOrString::String("25%".into()), 10, true, 3),
            (IntOrString::String("25%".into()), 10, false, 2),
            (IntOrString::String("25%".into()), 1, false, 0),
            (IntOrString::String("100%".into()), 7, false, 7),
            (IntOrString::String("junk".into()), 7, true, 0),
        ];
        for (v, total, up, want) in cases {
            assert_eq!(scaled(&v, total, up), want, "{v:?} of {total} up={up}");
        }
    }

    #[test]
    fn deployment_table() {
        // (replicas, strategy, pods, want create, want deleted names)
        let cases: Vec<(i32, DeploymentStrategy, &str, u32, Vec<&str>)> = vec![
            (3, rolling(1, 1), "", 3, vec![]),
            (3, rolling(1, 1), "n+ n+ n+", 0, vec![]),
            // A deleted or evicted pod is replaced.
            (3, rolling(1, 1), "n+ n+", 1, vec![]),
            // Rolling restart start: surge one new, retire one old.
            (4, rolling(1, 1), "o+ o+ o+ o+", 1, vec!["o3"]),
            // maxSurge 0: retire first, create when room appears.
            (3, rolling(0, 1), "o+ o+ o+", 0, vec!["o2"]),
            (3, rolling(0, 1), "o+ o+", 1, vec![]),
            (3, rolling(0, 1), "o+ o+ n-", 0, vec![]),
            (3, rolling(0, 1), "o+ o+ n+", 0, vec!["o1"]),
            // maxUnavailable 0: never drop below replicas ready.
            (3, rolling(1, 0), "o+ o+ o+", 1, vec![]),
            (3, rolling(1, 0), "o+ o+ o+ n-", 0, vec![]),
            (3, rolling(1, 0), "o+ o+ o+ n+", 0, vec!["o2"]),
            (3, rolling(1, 0), "o+ o+ n+", 1, vec![]),
            // Unready old pods are removed first and cost no availability.
            (3, rolling(0, 1), "o- o+ o+", 0, vec!["o0"]),
            // Both budgets 0 is treated as maxUnavailable 1.
            (2, rolling(0, 0), "o+ o+", 0, vec!["o1"]),
            // Scale down prefers unready pods.
            (2, rolling(1, 1), "n+ n- n+ n+", 0, vec!["n1", "n3"]),
            (0, rolling(1, 1), "o+ o+", 0, vec!["o1", "o0"]),
            (
                2,
                DeploymentStrategy::Recreate,
                "o+ o-",
                0,
                vec!["o1", "o0"],
            ),
            (2, DeploymentStrategy::Recreate, "n-", 1, vec![]),
        ];
        for (replicas, strategy, spec, create, delete) in cases {
            let plan = plan_deployment(replicas, strategy, &pods(spec));
            assert_eq!(
                plan.create, create,
                "create for {replicas} {strategy:?} [{spec}]"
            );
            assert_eq!(
                plan.delete, delete,
                "delete for {replicas} {strategy:?} [{spec}]"
            );
        }
    }

    #[test]
    fn deployment_rolls_to_completion_within_budgets() {
        // Simulate a whole rollout: pods become ready one step after creation.
        for (surge, unavailable) in [(1, 1), (0, 1), (1, 0), (2, 2)] {
            let replicas = 5;
            let mut pods = pods("o+ o+ o+ o+ o+");
            let mut next = 0;
            for _ in 0..50 {
                for p in pods.iter_mut() {
                    p.ready = true;
                }
                let plan = plan_deployment(replicas, rolling(surge, unavailable), &pods);
                pods.retain(|p| !plan.delete.contains(&p.name));
                for _ in 0..plan.create {
                    next += 1;
                    pods.push(PodView {
                        name: format!("new{next}"),
                        updated: true,
                        ready: false,
                    });
                }
                assert!(
                    pods.len() as i32 <= replicas + surge,
                    "surge exceeded: {pods:?}"
                );
                let ready = pods.iter().filter(|p| p.ready).count() as i32;
                assert!(
                    ready >= replicas - unavailable.max(1),
                    "unavailable exceeded: {pods:?}"
                );
            }
            assert!(pods.iter().all(|p| p.updated), "not rolled: {pods:?}");
            assert_eq!(pods.len(), 5);
        }
    }

    fn sts(spec: &str) -> Vec<OrdinalPod> {
        spec.split_whitespace()
            .map(|t| {
                let ordinal: u32 = t[1..t.len() - 1].parse().unwrap();
                OrdinalPod {
                    ordinal,
                    name: format!("db-{ordinal}"),
                    updated: t.starts_with('n'),
                    ready: t.ends_with('+'),
                }
            })
            .collect()
    }

    #[test]
    fn statefulset_table() {
        let ordered = StatefulSetPolicy {
            parallel: false,
            on_delete: false,
            partition: 0,
        };
        let parallel = StatefulSetPolicy {
            parallel: true,
            ..ordered
        };
        let partitioned = StatefulSetPolicy {
            partition: 2,
            ..ordered
        };
        let on_delete = StatefulSetPolicy {
            on_delete: true,
            ..ordered
        };
        type Case<'a> = (u32, StatefulSetPolicy, &'a str, Vec<u32>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            (3, ordered, "", vec![0], vec![]),
            (3, ordered, "n0-", vec![], vec![]),
            (3, ordered, "n0+", vec![1], vec![]),
            (3, parallel, "", vec![0, 1, 2], vec![]),
            // A deleted pod comes back under the same name.
            (3, ordered, "n0+ n2+", vec![1], vec![]),
            // Roll from the highest ordinal down, one at a time, only when all are ready.
            (3, ordered, "o0+ o1+ o2+", vec![], vec!["db-2"]),
            (3, ordered, "o0+ o1+ n2-", vec![], vec![]),
            (3, ordered, "o0+ o1+ n2+", vec![], vec!["db-1"]),
            (3, partitioned, "o0+ o1+ n2+", vec![], vec![]),
            (3, on_delete, "o0+ o1+ o2+", vec![], vec![]),
            // Scale down highest first.
            (1, ordered, "n0+ n1+ n2+", vec![], vec!["db-2"]),
            (1, parallel, "n0+ n1+ n2+", vec![], vec!["db-2", "db-1"]),
        ];
        for (replicas, policy, spec, create, delete) in cases {
            let plan = plan_statefulset(replicas, policy, &sts(spec));
            assert_eq!(plan.create, create, "create {replicas} {policy:?} [{spec}]");
            assert_eq!(plan.delete, delete, "delete {replicas} {policy:?} [{spec}]");
        }
    }

    fn ds(spec: &str) -> Vec<NodePod> {
        // "a:o+" = pod on node a, old, ready
        spec.split_whitespace()
            .enumerate()
            .map(|(i, t)| {
                let (node, state) = t.split_once(':').unwrap();
                NodePod {
                    node: node.to_string(),
                    name: format!("p{i}"),
                    updated: state.starts_with('n'),
                    ready: state.ends_with('+'),
                }
            })
            .collect()
    }

    #[test]
    fn daemonset_table() {
        let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        type Case<'a> = (i32, i32, &'a str, Vec<&'a str>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            (0, 1, "", vec!["a", "b", "c"], vec![]),
            (0, 1, "a:n+ b:n+ c:n+", vec![], vec![]),
            // Replace a deleted pod.
            (0, 1, "a:n+ c:n+", vec!["b"], vec![]),
            // maxUnavailable 1: one node at a time.
            (0, 1, "a:o+ b:o+ c:o+", vec![], vec!["p0"]),
            (0, 1, "a:n- b:o+ c:o+", vec![], vec![]),
            (0, 2, "a:o+ b:o+ c:o+", vec![], vec!["p0", "p1"]),
            // maxSurge 1: new pod first, old pod goes once the new one is ready.
            (1, 0, "a:o+ b:o+ c:o+", vec!["a"], vec![]),
            (1, 0, "a:o+ a:n- b:o+ c:o+", vec![], vec![]),
            (1, 0, "a:o+ a:n+ b:o+ c:o+", vec!["b"], vec!["p0"]),
            // Pods on unknown nodes are removed.
            (0, 1, "a:n+ b:n+ c:n+ z:n+", vec![], vec!["p3"]),
        ];
        for (surge, unavailable, spec, create, delete) in cases {
            let plan = plan_daemonset(&nodes, surge, unavailable, &ds(spec));
            assert_eq!(
                plan.create_on, create,
                "create s={surge} u={unavailable} [{spec}]"
            );
            assert_eq!(
                plan.delete, delete,
                "delete s={surge} u={unavailable} [{spec}]"
            );
        }
    }
}
