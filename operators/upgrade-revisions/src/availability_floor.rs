//! The availability floor of a workload no PodDisruptionBudget covers. The Eviction API honours
//! PodDisruptionBudgets only: without one it evicts every replica of a workload at once. So
//! for such a workload sluice keeps its own floor — `replicas − maxUnavailable` pods Available,
//! with the workload's own `rollingUpdate.maxUnavailable` when it declares one, else
//! `spec.disruption.defaultMaxUnavailable` (1) — counting the pods already unavailable (not
//! Ready, Ready for less than `minReadySeconds`, missing, terminating, or whose eviction is
//! scheduled or sent), and evicts its next pod only when the floor still holds after it.
//! A workload whose floor allows no eviction at all (one replica, or its own maxUnavailable
//! resolving to 0) is restarted by rollout restart, so its controller surges within its own
//! strategy.
//!
//! Pure. Never reads the cluster; never grants an eviction that takes a workload without a
//! PodDisruptionBudget below its floor.

use sluice_api::v1alpha1::revision_upgrade::{NoEvictionAllowed, WorkloadDisruption};

use crate::fleet::{PodView, WorkloadView};

/// Controller kinds a rollout restart can restart (their pod template has the annotation).
pub const ROLLOUT_RESTARTABLE: [&str; 3] = ["Deployment", "StatefulSet", "DaemonSet"];

/// How one workload's pods may be restarted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// A PodDisruptionBudget covers it: every candidate is offered, the Eviction API keeps
    /// the budget's floor (a refusal is retried).
    Budget,
    /// Evict at most `allowed` of its pods now.
    Evict {
        /// Pods that may be evicted now without going below the floor.
        allowed: u32,
        /// The floor: pods that must stay Available.
        floor: u32,
        /// Pods Available now (and not being evicted).
        available: u32,
    },
    /// No eviction keeps the floor: restart it by rollout restart (the controller surges).
    RolloutRestart,
    /// No eviction keeps the floor and its controller cannot be rollout-restarted: its pods
    /// are left on their revision (reported).
    Hold,
}

/// Whether the pod counts as Available at `now_ms`: Ready for at least `min_ready_seconds`
/// (a Ready pod without a transition time counts only when no minimum applies).
pub fn available(pod: &PodView, min_ready_seconds: u32, now_ms: i64) -> bool {
    if pod.terminating || !pod.ready {
        return false;
    }
    if min_ready_seconds == 0 {
        return true;
    }
    pod.ready_since_ms
        .is_some_and(|since| now_ms - since >= i64::from(min_ready_seconds) * 1000)
}

/// The replicas and maxUnavailable the floor is computed from, and whether an eviction is
/// possible at all: `(replicas, max_unavailable, no_eviction)`. `observed` is the number of
/// the workload's pods seen (used when its controller is not one sluice reads).
pub fn shape(
    settings: &WorkloadDisruption,
    view: Option<&WorkloadView>,
    observed: u32,
) -> (u32, u32, bool) {
    let replicas = view.map_or(observed, |v| v.replicas);
    let max_unavailable = view
        .and_then(|v| v.max_unavailable.as_ref())
        .map_or(settings.default_max_unavailable.max(1), |m| {
            WorkloadView::scaled(m, replicas)
        });
    let no_eviction = replicas <= 1 || max_unavailable == 0;
    (replicas, max_unavailable, no_eviction)
}

/// Whether the workload is restarted by rollout restart because no eviction keeps its floor
/// (and it has no PodDisruptionBudget).
pub fn surges(
    settings: &WorkloadDisruption,
    kind: &str,
    view: Option<&WorkloadView>,
    observed: u32,
) -> bool {
    if view.is_some_and(|v| v.pdb) {
        return false;
    }
    let (_, _, no_eviction) = shape(settings, view, observed);
    no_eviction
        && settings.no_eviction_allowed == NoEvictionAllowed::RolloutRestart
        && ROLLOUT_RESTARTABLE.contains(&kind)
}

/// The plan for one workload of kind `kind`: `pods` are its non-terminating pods seen now,
/// `being_evicted` tells which of them have an eviction scheduled or sent.
pub fn plan(
    settings: &WorkloadDisruption,
    kind: &str,
    view: Option<&WorkloadView>,
    pods: &[&PodView],
    being_evicted: impl Fn(&PodView) -> bool,
    now_ms: i64,
) -> Plan {
    if view.is_some_and(|v| v.pdb) {
        return Plan::Budget;
    }
    let live: Vec<&&PodView> = pods.iter().filter(|p| !p.terminating).collect();
    let (replicas, max_unavailable, no_eviction) = shape(settings, view, live.len() as u32);
    let max_unavailable = if no_eviction {
        match settings.no_eviction_allowed {
            NoEvictionAllowed::RolloutRestart if ROLLOUT_RESTARTABLE.contains(&kind) => {
                return Plan::RolloutRestart;
            }
            NoEvictionAllowed::RolloutRestart => return Plan::Hold,
            NoEvictionAllowed::Evict => 1,
        }
    } else {
        // Never the last Available pod of a workload of several replicas.
        max_unavailable.min(replicas - 1)
    };
    let min_ready = view.map_or(0, |v| v.min_ready_seconds);
    let available = live
        .iter()
        .filter(|p| !being_evicted(p) && self::available(p, min_ready, now_ms))
        .count() as u32;
    let floor = replicas.saturating_sub(max_unavailable);
    Plan::Evict {
        allowed: available.saturating_sub(floor),
        floor,
        available,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn pod(name: &str, ready: bool, ready_since_ms: i64, terminating: bool) -> PodView {
        PodView {
            namespace: "a".into(),
            name: name.into(),
            revision: "1-27".into(),
            workload: None,
            terminating,
            ready,
            ready_since_ms: Some(ready_since_ms),
            created_ms: Some(0),
            rev_label: None,
        }
    }

    fn view(replicas: u32, max_unavailable: Option<IntOrString>, pdb: bool) -> WorkloadView {
        WorkloadView {
            replicas,
            max_unavailable,
            min_ready_seconds: 0,
            pdb,
            restarted_at: None,
        }
    }

    #[test]
    fn the_floor_counts_pods_already_unavailable_and_those_being_evicted() {
        let d = WorkloadDisruption::default();
        let ready = |n: usize| (0..n).map(|i| pod(&format!("p{i}"), true, 0, false));
        struct Row {
            name: &'static str,
            kind: &'static str,
            view: Option<WorkloadView>,
            pods: Vec<PodView>,
            evicting: &'static [&'static str],
            settings: WorkloadDisruption,
            want: Plan,
        }
        let evict = |allowed, floor, available| Plan::Evict {
            allowed,
            floor,
            available,
        };
        let table = vec![
            Row {
                name: "no PDB, no maxUnavailable of its own: one at a time",
                kind: "Deployment",
                view: Some(view(4, None, false)),
                pods: ready(4).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(1, 3, 4),
            },
            Row {
                name: "its own maxUnavailable (int)",
                kind: "Deployment",
                view: Some(view(4, Some(IntOrString::Int(2)), false)),
                pods: ready(4).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(2, 2, 4),
            },
            Row {
                name: "its own maxUnavailable (percent, rounded down)",
                kind: "Deployment",
                view: Some(view(10, Some(IntOrString::String("25%".into())), false)),
                pods: ready(10).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(2, 8, 10),
            },
            Row {
                name: "a pod already not Ready uses the allowance",
                kind: "Deployment",
                view: Some(view(4, None, false)),
                pods: ready(3).chain([pod("p3", false, 0, false)]).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(0, 3, 3),
            },
            Row {
                name: "a missing pod (replacement not created yet) uses the allowance",
                kind: "Deployment",
                view: Some(view(4, None, false)),
                pods: ready(3).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(0, 3, 3),
            },
            Row {
                name: "a terminating pod uses the allowance",
                kind: "Deployment",
                view: Some(view(4, None, false)),
                pods: ready(4)
                    .chain([pod("old", true, 0, true)])
                    .skip(1)
                    .collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(0, 3, 3),
            },
            Row {
                name: "a pod whose eviction is scheduled uses the allowance",
                kind: "Deployment",
                view: Some(view(4, None, false)),
                pods: ready(4).collect(),
                evicting: &["p0"],
                settings: d.clone(),
                want: evict(0, 3, 3),
            },
            Row {
                name: "one replica: rollout restart (surge)",
                kind: "Deployment",
                view: Some(view(1, None, false)),
                pods: ready(1).collect(),
                evicting: &[],
                settings: d.clone(),
                want: Plan::RolloutRestart,
            },
            Row {
                name: "its own maxUnavailable 0: rollout restart (surge)",
                kind: "StatefulSet",
                view: Some(view(3, Some(IntOrString::Int(0)), false)),
                pods: ready(3).collect(),
                evicting: &[],
                settings: d.clone(),
                want: Plan::RolloutRestart,
            },
            Row {
                name: "25% of 3 is 0: rollout restart (surge)",
                kind: "Deployment",
                view: Some(view(3, Some(IntOrString::String("25%".into())), false)),
                pods: ready(3).collect(),
                evicting: &[],
                settings: d.clone(),
                want: Plan::RolloutRestart,
            },
            Row {
                name: "one replica of a controller sluice cannot restart: held",
                kind: "ReplicaSet",
                view: None,
                pods: ready(1).collect(),
                evicting: &[],
                settings: d.clone(),
                want: Plan::Hold,
            },
            Row {
                name: "one replica, evicting allowed by the spec",
                kind: "Deployment",
                view: Some(view(1, None, false)),
                pods: ready(1).collect(),
                evicting: &[],
                settings: WorkloadDisruption {
                    no_eviction_allowed: NoEvictionAllowed::Evict,
                    ..d.clone()
                },
                want: evict(1, 0, 1),
            },
            Row {
                name: "maxUnavailable of all replicas still keeps one Available",
                kind: "Deployment",
                view: Some(view(3, Some(IntOrString::String("100%".into())), false)),
                pods: ready(3).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(2, 1, 3),
            },
            Row {
                name: "a configured default",
                kind: "Deployment",
                view: Some(view(6, None, false)),
                pods: ready(6).collect(),
                evicting: &[],
                settings: WorkloadDisruption {
                    default_max_unavailable: 2,
                    ..d.clone()
                },
                want: evict(2, 4, 6),
            },
            Row {
                name: "a controller sluice does not read: its pods seen are its replicas",
                kind: "ReplicaSet",
                view: None,
                pods: ready(3).collect(),
                evicting: &[],
                settings: d.clone(),
                want: evict(1, 2, 3),
            },
            Row {
                name: "a PodDisruptionBudget: the Eviction API keeps the floor",
                kind: "Deployment",
                view: Some(view(1, None, true)),
                pods: ready(1).collect(),
                evicting: &[],
                settings: d.clone(),
                want: Plan::Budget,
            },
        ];
        for row in table {
            let pods: Vec<&PodView> = row.pods.iter().collect();
            let got = plan(
                &row.settings,
                row.kind,
                row.view.as_ref(),
                &pods,
                |p| row.evicting.contains(&p.name.as_str()),
                10_000,
            );
            assert_eq!(got, row.want, "{}", row.name);
        }
    }

    #[test]
    fn available_needs_min_ready_seconds_of_readiness() {
        let d = WorkloadDisruption::default();
        let mut v = view(2, None, false);
        v.min_ready_seconds = 5;
        // Both Ready, one only for 2 s: one Available, so none may go (floor 1).
        let pods = [pod("old", true, 0, false), pod("new", true, 8_000, false)];
        let refs: Vec<&PodView> = pods.iter().collect();
        assert_eq!(
            plan(&d, "Deployment", Some(&v), &refs, |_| false, 10_000),
            Plan::Evict {
                allowed: 0,
                floor: 1,
                available: 1
            }
        );
        assert_eq!(
            plan(&d, "Deployment", Some(&v), &refs, |_| false, 13_000),
            Plan::Evict {
                allowed: 1,
                floor: 1,
                available: 2
            }
        );
    }
}
