//! The pure heart of sluice-upgrade-revisions: (spec, current status, observations, now) →
//! (actions, next status). The status is the state machine: a restarted operator reaches the
//! same decision from the status it wrote and what it observes.
//!
//! Owns the upgrade's transitions: waves started in order, namespaces relabelled from the old
//! tag to the new one, meshed pods restarted within the issuance budget ([`crate::pacing`]),
//! progress counted from the revision the injector recorded in each pod, soaks judged by gates,
//! abort (a gate's Fail or `spec.abort`) retagging the unfinished waves' namespaces back and
//! restarting them, explicit resume, completion when no proxy runs the old revision. Must never
//! do I/O or read the clock, never restart a pod already on the target revision (so evictions
//! already done are never repeated), never evict a bare pod (nothing would replace it), never
//! touch a namespace relabelled by someone else, and never remove the old control plane.
//!
//! One file per phase of a tick, the shared model below them: `model` (observations, actions,
//! the decision, constants, the `Machine` and its counting helpers), `validate`, `reports`,
//! `controls` (abort, resume), `relabel`, `forward` (waves in order), `gates` (the wave's
//! gates as judged: unresolved ones under `spec.inconclusive`, `Ready` from their
//! configuration), `restart` (issuance budget, availability floor), `soak`, `rollback` and
//! `complete`; this module holds
//! [`decide`] and the order a tick runs them in. Unit tests sit beside them in `tests.rs` and
//! `upgrade_tests.rs`.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    RevisionUpgradePhase, RevisionUpgradeSpec, RevisionUpgradeStatus,
    revision_upgrade::{NamespaceState, ProxyCounts},
};

use crate::{
    fleet::{self, PodView, Workload},
    validity,
};

mod complete;
mod controls;
mod forward;
mod gates;
mod model;
mod relabel;
mod reports;
mod restart;
mod rollback;
mod soak;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upgrade_tests;
mod validate;

pub use model::*;
pub use validate::*;

/// Decides the next status of a RevisionUpgrade.
pub fn decide(
    spec: &RevisionUpgradeSpec,
    status: Option<&RevisionUpgradeStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let problems = validity::problems(spec, obs.allow_free_form_promql);
    let mut d = decide_validity(&problems, gates::masked(status).as_ref(), obs, now);
    if d.status.phase == RevisionUpgradePhase::Invalid {
        return d;
    }
    if problems.is_empty() {
        gates::set_ready(&mut d, status, obs, now);
    }
    let judged = obs
        .gates
        .as_ref()
        .map(|r| gates::judge(spec, &d.status, r, now));
    if let Some(fleet) = &obs.fleet {
        let mut by_ns: BTreeMap<&str, Vec<&Arc<PodView>>> = BTreeMap::new();
        let mut by_workload: BTreeMap<(&str, &Workload), u32> = BTreeMap::new();
        for p in &fleet.pods {
            by_ns.entry(p.namespace.as_str()).or_default().push(p);
            if let Some(w) = p.workload.as_ref().filter(|_| !p.terminating) {
                *by_workload.entry((p.namespace.as_str(), w)).or_default() += 1;
            }
        }
        Machine {
            spec,
            obs,
            fleet,
            by_ns,
            by_workload,
            now,
            gates: judged.as_ref(),
            decision: &mut d,
            held_by_floor: 0,
        }
        .run();
        d.requeue = Requeue::After(match d.status.phase {
            RevisionUpgradePhase::Complete | RevisionUpgradePhase::Aborted => IDLE,
            _ if awaiting_relabel(&d.status) => RELABEL_RECHECK,
            _ => TICK,
        });
    }
    gates::settle_when_finished(&mut d, obs.generation, now);
    d
}

impl Machine<'_> {
    fn run(mut self) {
        let counts = fleet::proxy_counts(self.spec, &self.fleet.pods);
        self.decision.status.proxies = Some(ProxyCounts {
            observed_at: Some(Time(self.now)),
            ..counts
        });
        self.report_injection_label();
        if self.decision.status.completed_at.is_some() {
            self.decision.status.phase = RevisionUpgradePhase::Complete;
            return;
        }
        self.report_overrides();
        self.controls();
        self.watch_relabels();
        let rolling_back = self
            .decision
            .status
            .namespaces
            .iter()
            .any(|n| n.state == NamespaceState::RollingBack);
        if rolling_back || self.decision.status.aborted_at.is_some() {
            self.roll_back();
        } else {
            self.forward();
        }
        self.set_phase();
        self.retirable();
    }
}
