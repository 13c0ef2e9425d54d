//! Restarting a wave's meshed pods within the issuance budget and the availability floor:
//! counting progress, choosing candidates, granting restarts. Never restarts a pod already on the
//! target revision, never evicts a bare pod.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::revision_upgrade::{
    IssuanceBudgetStatus, NamespaceState, RestartMode, UpgradeWaveState, conditions, reasons,
};
use sluice_runtime::{conditions::Status, events::Notice};

use super::model::{Action, EventAction, Machine, elapsed, workload_key};
use crate::{
    availability_floor::{self, Plan},
    fleet::{NamespaceView, PodView, Workload},
    pacing::{self, Hold},
};

impl Machine<'_> {
    /// Recounts the pods of every namespace in the upgrade against its direction's target.
    pub(super) fn update_counts(&mut self, forward_target: &str) {
        for i in 0..self.decision.status.namespaces.len() {
            let n = &self.decision.status.namespaces[i];
            let target = match n.state {
                NamespaceState::RollingBack | NamespaceState::RolledBack => {
                    self.spec.from_revision.clone()
                }
                _ => forward_target.to_owned(),
            };
            let name = n.name.clone();
            let c = self.count(&name, &target);
            let surging =
                self.decision.status.namespaces[i].relabelled_at.is_some() && self.surging(&name);
            let n = &mut self.decision.status.namespaces[i];
            // While its pods are being replaced, a namespace keeps the most pods it was seen
            // with, so an evicted pod whose replacement does not exist yet is still awaited.
            // Rollout restarts surge above the workloads' replicas: there the count stays the
            // one seen before the restarts were asked for (the new label's first sighting).
            n.pods = match n.state {
                NamespaceState::Restarting | NamespaceState::RollingBack if surging => n.pods,
                NamespaceState::Restarting | NamespaceState::RollingBack => n.pods.max(c.pods),
                _ => c.pods,
            };
            n.pods_done = c.done;
            n.bare_pods = c.bare_not_done;
        }
    }

    /// The pods to restart in namespaces that carry their target label, in a stable order
    /// (namespace, name), pods a PodDisruptionBudget refused last tick at the end.
    pub(super) fn candidates(
        &self,
        state: NamespaceState,
        target: &str,
        label: &str,
    ) -> Vec<&Arc<PodView>> {
        let namespaces: BTreeSet<&str> = self
            .decision
            .status
            .namespaces
            .iter()
            .filter(|n| n.state == state && n.relabelled_at.is_some())
            .filter(|n| self.ns_view(&n.name).and_then(NamespaceView::rev) == Some(label))
            .map(|n| n.name.as_str())
            .collect();
        // `namespace/name` keys split once, so the pods are matched without formatting each.
        fn split<'k>(keys: impl IntoIterator<Item = &'k String>) -> BTreeSet<(&'k str, &'k str)> {
            keys.into_iter().filter_map(|k| k.split_once('/')).collect()
        }
        let blocked = split(&self.obs.blocked);
        let in_progress = split(&self.obs.in_progress);
        let mut pods: Vec<(bool, &Arc<PodView>)> = namespaces
            .iter()
            .flat_map(|ns| self.by_ns.get(ns).into_iter().flatten())
            .copied()
            .filter(|p| !p.terminating && p.revision != target && p.workload.is_some())
            .filter(|p| !in_progress.contains(&(p.namespace.as_str(), p.name.as_str())))
            .filter(|p| !self.held(p, target))
            .map(|p| {
                (
                    blocked.contains(&(p.namespace.as_str(), p.name.as_str())),
                    p,
                )
            })
            .collect();
        pods.sort_by(|(a_blocked, a), (b_blocked, b)| {
            (a_blocked, &a.namespace, &a.name).cmp(&(b_blocked, &b.namespace, &b.name))
        });
        pods.into_iter().map(|(_, p)| p).collect()
    }

    /// Grants restarts from the issuance budget and turns them into actions.
    pub(super) fn restart(&mut self, pods: Vec<Arc<PodView>>) -> u32 {
        // One unit of work: a pod to evict, or a workload to restart (costing its pods). An
        // eviction's action is built only once it is granted: a wave offers thousands.
        enum Unit {
            Evict(Arc<PodView>),
            RolloutRestart {
                namespace: String,
                workload: Workload,
                restarted_at: String,
                pods: u32,
            },
        }
        let mut units: Vec<(u32, Unit)> = Vec::new();
        let mut by_workload: BTreeMap<(String, Workload), u32> = BTreeMap::new();
        // Evictions left per workload without a PodDisruptionBudget: its availability floor.
        let mut allowance: BTreeMap<(String, Workload), Option<u32>> = BTreeMap::new();
        let in_progress: BTreeSet<&str> = self.obs.in_progress.iter().map(String::as_str).collect();
        let mut floored = 0u32;
        let mut plan_started: BTreeSet<(&str, &Workload)> = BTreeSet::new();
        for p in &pods {
            let Some(w) = p.workload.as_ref() else {
                continue;
            };
            let restartable = self.spec.restart == RestartMode::RolloutRestart
                && availability_floor::ROLLOUT_RESTARTABLE.contains(&w.kind.as_str());
            if restartable {
                *by_workload
                    .entry((p.namespace.clone(), w.clone()))
                    .or_default() += 1;
                continue;
            }
            let key = (p.namespace.clone(), w.clone());
            if !allowance.contains_key(&key) {
                let mine: Vec<&PodView> = self
                    .by_ns
                    .get(p.namespace.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|q| q.workload.as_ref() == Some(w))
                    .map(|q| q.as_ref())
                    .collect();
                let plan = self.plan_of(&p.namespace, w, &mine, |q| {
                    in_progress.contains(format!("{}/{}", q.namespace, q.name).as_str())
                });
                let left = match plan {
                    Plan::Budget => None,
                    Plan::Evict { allowed, .. } => Some(allowed),
                    Plan::RolloutRestart => {
                        *by_workload.entry(key.clone()).or_default() += 1;
                        plan_started.insert((p.namespace.as_str(), w));
                        Some(0)
                    }
                    Plan::Hold => Some(0),
                };
                allowance.insert(key.clone(), left);
                if plan == Plan::RolloutRestart {
                    continue;
                }
            }
            let left = allowance.get_mut(&key).expect("inserted above");
            match left {
                None => units.push((1, Unit::Evict(p.clone()))),
                Some(0) => match by_workload.get_mut(&(p.namespace.clone(), w.clone())) {
                    // A surging workload costs each of its pods not yet moved.
                    Some(n) if plan_started.contains(&(p.namespace.as_str(), w)) => *n += 1,
                    _ => floored += 1,
                },
                Some(n) => {
                    *n -= 1;
                    units.push((1, Unit::Evict(p.clone())));
                }
            }
        }
        self.held_by_floor = floored;
        for ((namespace, workload), n) in by_workload {
            let marker = self
                .decision
                .status
                .namespaces
                .iter()
                .find(|x| x.name == namespace)
                .and_then(|x| x.relabelled_at.as_ref())
                // Whole seconds, as the API stores the status time: the marker is the same
                // before and after the status round-trips, so a restart is never repeated.
                .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default();
            let key = (namespace.clone(), workload.clone());
            if self.fleet.restarted_at.get(&key) == Some(&marker) {
                continue; // already restarted for this move; its controller is replacing pods
            }
            if self
                .obs
                .in_progress
                .contains(&workload_key(&namespace, &workload))
            {
                continue; // its restart is scheduled or was just sent
            }
            units.push((
                n,
                Unit::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at: marker,
                    pods: n,
                },
            ));
        }
        let wanted: u32 = units.iter().map(|u| u.0).sum();
        let mut previous = self.decision.status.issuance_budget.clone();
        let due = previous
            .as_ref()
            .and_then(|p| p.updated_at.as_ref())
            .is_none_or(|t| elapsed(t, self.now) >= pacing::TICK);
        if due && let Some(p) = previous.as_mut() {
            pacing::refund(p, &self.spec.issuance_budget, self.obs.unused_grants);
        }
        let costs: Vec<u32> = units.iter().map(|u| u.0).collect();
        let g = pacing::grant(
            &self.spec.issuance_budget,
            previous.as_ref(),
            self.obs.issuance.as_ref(),
            &costs,
            self.obs.pacing,
            self.now,
        );
        for ((_, unit), start) in units.into_iter().zip(&g.starts) {
            let Some(start) = start else { continue };
            let action = match unit {
                Unit::Evict(p) => Action::Evict {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    after: *start,
                },
                Unit::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at,
                    pods,
                } => Action::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at,
                    pods,
                    after: *start,
                },
            };
            self.decision.actions.push(action);
        }
        if g.restarts > 0 {
            self.decision.actions.push(Action::ScheduleBusy(g.busy_for));
        }
        if wanted > 0 || g.held_by != Some(Hold::NoReading) {
            self.budget_conditions(g.held_by, &g.state);
        }
        self.decision.status.issuance_budget = Some(g.state);
        g.restarts
    }

    pub(super) fn budget_conditions(&mut self, held: Option<Hold>, state: &IssuanceBudgetStatus) {
        match held {
            Some(Hold::OverBudget) => {
                let b = &self.spec.issuance_budget;
                self.decision.condition(
                    self.stamp(),
                    conditions::BUDGET_THROTTLED,
                    Status::True,
                    reasons::OVER_BUDGET,
                    format!(
                        "observed issuance {:.1}/s (background {:.1}/s) is over the budget of {}/s with depth {}; restarts are held until it recovers",
                        state.observed_rate, state.background_rate, b.rate, b.depth
                    ),
                );
            }
            Some(Hold::NoReading) => {
                let why = self
                    .obs
                    .issuance_problem
                    .clone()
                    .unwrap_or_else(|| "no issuance reading yet".into());
                self.decision.condition(
                    self.stamp(),
                    conditions::BUDGET_THROTTLED,
                    Status::True,
                    reasons::OVER_BUDGET,
                    format!("{why}; restarts are held: background issuance is unknown, and no data is not zero"),
                );
            }
            Some(Hold::NotDue) => {}
            _ => {
                self.decision.condition(
                    self.stamp(),
                    conditions::BUDGET_THROTTLED,
                    Status::False,
                    reasons::WITHIN_BUDGET,
                    format!(
                        "background issuance {:.1}/s leaves {:.1} restarts/s",
                        state.background_rate,
                        pacing::headroom(&self.spec.issuance_budget, state.background_rate)
                    ),
                );
            }
        }
    }

    pub(super) fn restart_wave(&mut self, index: usize) {
        let target = self.spec.to_revision.clone();
        self.detect_reinjection(
            NamespaceState::Restarting,
            &target,
            &self.spec.to_tag.clone(),
        );
        let pods: Vec<Arc<PodView>> = self
            .candidates(
                NamespaceState::Restarting,
                &target,
                &self.spec.to_tag.clone(),
            )
            .into_iter()
            .cloned()
            .collect();
        let remaining = pods.len();
        let started = self.restart(pods);
        // Namespaces whose every restartable pod runs the target are moved; the replacements'
        // readiness is what PodDisruptionBudgets gate while restarting, and what the wave waits
        // for before it passes its soak.
        let wave = self.decision.status.waves[index].name.clone();
        let mut pending = 0;
        for i in 0..self.decision.status.namespaces.len() {
            let n = &self.decision.status.namespaces[i];
            if n.wave != wave || n.state != NamespaceState::Restarting {
                continue;
            }
            let c = self.count(&n.name.clone(), &target);
            let labelled = n.relabelled_at.is_some()
                && self.ns_view(&n.name).and_then(NamespaceView::rev)
                    == Some(self.spec.to_tag.as_str());
            let n = &mut self.decision.status.namespaces[i];
            let expected = n.pods;
            let settled =
                c.done + c.bare_not_done + c.held_not_done == c.pods && c.pods >= expected;
            if labelled && settled {
                n.state = NamespaceState::Moved;
                n.done_at = Some(Time(self.now));
            } else {
                pending += 1;
            }
        }
        let blocked = !self.obs.blocked.is_empty();
        if pending == 0 {
            let w = &mut self.decision.status.waves[index];
            w.state = UpgradeWaveState::Soaking;
            w.soak_started_at = Some(Time(self.now));
            let soak = self
                .spec
                .soak_of(index)
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            let msg =
                format!("wave {wave}: every namespace moved; soaking {soak} with gates evaluated");
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                msg.clone(),
            );
            self.decision
                .event(Notice::normal(reasons::SOAKING, EventAction::Wave, msg));
        } else if blocked {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::DISRUPTION_BUDGET_BLOCKED,
                format!(
                    "wave {wave}: a PodDisruptionBudget refused the eviction of {}; retried each tick (check the budget's minAvailable/maxUnavailable and that its pods are Ready)",
                    self.obs.blocked.join(", ")
                ),
            );
        } else if self.held_by_floor > 0 && started == 0 {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::AT_AVAILABILITY_FLOOR,
                format!(
                    "wave {wave}: {pending} namespace(s) moving; {} pod(s) wait until their workload (no PodDisruptionBudget) has more than replicas - maxUnavailable pods Available (default maxUnavailable {})",
                    self.held_by_floor, self.spec.disruption.default_max_unavailable
                ),
            );
        } else {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::WAVE_RESTARTING,
                format!(
                    "wave {wave}: {pending} namespace(s) moving, {remaining} pod(s) to restart, {started} restart(s) started this tick, {} waiting for their workload's availability floor",
                    self.held_by_floor
                ),
            );
        }
    }
}
