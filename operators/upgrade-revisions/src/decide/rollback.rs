//! Rolling back: retagging the unfinished waves' namespaces back to the old tag and restarting
//! them.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::revision_upgrade::{
    NamespaceState, UpgradeWaveState, conditions, reasons,
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{EventAction, Machine};
use crate::fleet::PodView;

impl Machine<'_> {
    /// Retags the namespaces of waves that have not passed back to the old tag.
    pub(super) fn start_rollback(
        &mut self,
        reason: &'static str,
        why: String,
        wave_state: UpgradeWaveState,
    ) {
        let passed: BTreeSet<String> = self
            .decision
            .status
            .waves
            .iter()
            .filter(|w| w.state == UpgradeWaveState::Passed)
            .map(|w| w.name.clone())
            .collect();
        let mut back = Vec::new();
        for n in &mut self.decision.status.namespaces {
            if passed.contains(&n.wave) {
                continue;
            }
            match n.state {
                NamespaceState::Pending => n.state = NamespaceState::RolledBack,
                NamespaceState::Restarting | NamespaceState::Moved => {
                    n.state = NamespaceState::RollingBack;
                    n.relabelled_at = None;
                    n.done_at = None;
                    n.pods = 0;
                    back.push(n.name.clone());
                }
                NamespaceState::RollingBack | NamespaceState::RolledBack => {}
            }
        }
        for w in &mut self.decision.status.waves {
            if !matches!(
                w.state,
                UpgradeWaveState::Passed | UpgradeWaveState::Pending
            ) {
                w.state = wave_state;
                w.finished_at = Some(Time(self.now));
            }
        }
        self.decision.status.aborted_at = Some(Time(self.now));
        let msg = format!(
            "{why}; retagging {} namespace(s) back to {} and restarting them within the issuance budget; waves that passed stay on {}",
            back.len(),
            self.spec.from_tag,
            self.spec.to_revision
        );
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::True,
            reason,
            msg.clone(),
        );
        self.decision
            .event(Notice::warning(reason, EventAction::Abort, msg));
    }

    pub(super) fn roll_back(&mut self) {
        if self.spec.paused {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::False,
                reasons::PAUSED,
                "held by spec.paused: the rollback starts no relabel or restart",
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        let (from_tag, to_tag) = (self.spec.from_tag.clone(), self.spec.to_tag.clone());
        self.relabel(usize::MAX, &to_tag, &from_tag);
        self.update_counts(&self.spec.to_revision.clone());
        let target = self.spec.from_revision.clone();
        self.detect_reinjection(NamespaceState::RollingBack, &target, &from_tag);
        let pods: Vec<Arc<PodView>> = self
            .candidates(NamespaceState::RollingBack, &target, &from_tag)
            .into_iter()
            .cloned()
            .collect();
        self.restart(pods);
        let mut pending = 0;
        for i in 0..self.decision.status.namespaces.len() {
            if self.decision.status.namespaces[i].state != NamespaceState::RollingBack {
                continue;
            }
            let name = self.decision.status.namespaces[i].name.clone();
            let c = self.count(&name, &target);
            let labelled = self.decision.status.namespaces[i].relabelled_at.is_some();
            let n = &mut self.decision.status.namespaces[i];
            let expected = n.pods;
            let settled =
                c.done + c.bare_not_done + c.held_not_done == c.pods && c.pods >= expected;
            if labelled && settled && c.not_ready == 0 {
                n.state = NamespaceState::RolledBack;
                n.done_at = Some(Time(self.now));
            } else {
                pending += 1;
            }
        }
        if pending > 0 {
            return;
        }
        for w in &mut self.decision.status.waves {
            if w.state == UpgradeWaveState::Failed {
                w.state = UpgradeWaveState::RolledBack;
            }
        }
        let p = self.decision.status.proxies.clone().unwrap_or_default();
        let was = cond::find(&self.decision.status.conditions, conditions::PROGRESSING)
            .is_some_and(|c| c.reason == reasons::ROLLED_BACK);
        let msg = format!(
            "rolled back: {} prox(ies) on {}, {} on {}; a mixed fleet is a valid stopping point; set spec.abort=false and increase spec.resume to try again",
            p.old, self.spec.from_revision, p.new, self.spec.to_revision
        );
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::False,
            reasons::ROLLED_BACK,
            msg.clone(),
        );
        if !was {
            self.decision.event(Notice::warning(
                reasons::ROLLED_BACK,
                EventAction::Abort,
                msg,
            ));
        }
    }
}
