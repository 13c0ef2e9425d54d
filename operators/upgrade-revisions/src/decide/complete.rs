//! The phase a tick ends in, and when the old revision may be retired (no proxy runs it; the
//! old control plane is never removed here).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    RevisionUpgradePhase,
    revision_upgrade::{NamespaceState, UpgradeWaveState, conditions, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{EventAction, Machine, REPORT_LIMIT};

impl Machine<'_> {
    pub(super) fn set_phase(&mut self) {
        let n = &self.decision.status;
        let rolling_back = n
            .namespaces
            .iter()
            .any(|x| x.state == NamespaceState::RollingBack);
        let throttled = n.issuance_budget.as_ref().is_some_and(|b| b.throttled);
        let gate_pause = self.gates.and_then(|g| g.action) == Some(GateAction::Pause);
        let current = n
            .current_wave_index
            .and_then(|i| n.waves.get(i as usize))
            .map(|w| w.state);
        let tag_problem = cond::find(&n.conditions, conditions::PROGRESSING)
            .is_some_and(|c| c.reason == reasons::TAG_MISMATCH);
        let all_passed =
            !n.waves.is_empty() && n.waves.iter().all(|w| w.state == UpgradeWaveState::Passed);
        self.decision.status.phase = if rolling_back {
            if self.spec.paused {
                RevisionUpgradePhase::Paused
            } else {
                RevisionUpgradePhase::RollingBack
            }
        } else if n.aborted_at.is_some() {
            RevisionUpgradePhase::Aborted
        } else if all_passed {
            RevisionUpgradePhase::Progressing
        } else if n.waves.iter().all(|w| w.state == UpgradeWaveState::Pending) {
            if self.spec.paused {
                RevisionUpgradePhase::Paused
            } else {
                RevisionUpgradePhase::Pending
            }
        } else if tag_problem || self.spec.paused || gate_pause {
            RevisionUpgradePhase::Paused
        } else {
            match current {
                Some(UpgradeWaveState::Soaking) => RevisionUpgradePhase::Soaking,
                Some(UpgradeWaveState::Restarting) if throttled => RevisionUpgradePhase::Paused,
                _ => RevisionUpgradePhase::Progressing,
            }
        };
    }

    pub(super) fn retirable(&mut self) {
        let p = self.decision.status.proxies.clone().unwrap_or_default();
        let all_passed = !self.decision.status.waves.is_empty()
            && self
                .decision
                .status
                .waves
                .iter()
                .all(|w| w.state == UpgradeWaveState::Passed);
        // Namespaces whose next pods the old revision would inject: labelled with its revision
        // name, or still on the old tag (created after their wave, or with no pods now).
        let mut referencing: Vec<String> = self
            .fleet
            .namespaces
            .iter()
            .filter(|n| {
                !n.injection_enabled()
                    && (n.rev() == Some(self.spec.from_revision.as_str())
                        || n.rev() == Some(self.spec.from_tag.as_str()))
            })
            .map(|n| format!("{} (istio.io/rev={})", n.name, n.rev().unwrap_or_default()))
            .collect();
        referencing.sort();
        if all_passed
            && p.old == 0
            && referencing.is_empty()
            && self.decision.status.aborted_at.is_none()
        {
            self.decision.status.completed_at = Some(Time(self.now));
            self.decision.status.phase = RevisionUpgradePhase::Complete;
            let msg = format!(
                "zero proxies run revision {}; its control plane may be removed (sluice never removes it)",
                self.spec.from_revision
            );
            self.decision.condition(
                self.stamp(),
                conditions::OLD_REVISION_RETIRABLE,
                Status::True,
                reasons::NO_OLD_PROXIES,
                msg.clone(),
            );
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::False,
                reasons::NO_OLD_PROXIES,
                format!("complete: {} proxies on {}", p.new, self.spec.to_revision),
            );
            self.decision.event(Notice::normal(
                reasons::NO_OLD_PROXIES,
                EventAction::Complete,
                msg,
            ));
            return;
        }
        let mut where_ = Vec::new();
        let bare: u32 = self
            .decision
            .status
            .namespaces
            .iter()
            .map(|n| n.bare_pods)
            .sum();
        if bare > 0 {
            where_.push(format!(
                "{bare} bare pod(s) with no controller (restart them yourself)"
            ));
        }
        if !self.decision.status.injection_enabled_namespaces.is_empty() {
            where_.push("namespaces with istio-injection=enabled".to_owned());
        }
        if !self.decision.status.reinjected_by_old_revision.is_empty() {
            where_.push(format!(
                "{} workload(s) re-injected by the old revision",
                self.decision.status.reinjected_by_old_revision.len()
            ));
        }
        if !self.decision.status.pod_revision_overrides.is_empty() {
            where_.push(format!(
                "{} workload(s) pinning a revision with a pod label",
                self.decision.status.pod_revision_overrides.len()
            ));
        }
        let jobs = self
            .fleet
            .pods
            .iter()
            .filter(|p| {
                !p.terminating
                    && p.revision == self.spec.from_revision
                    && p.workload.as_ref().is_some_and(|w| w.kind == "Job")
            })
            .count();
        if jobs > 0 {
            where_.push(format!(
                "{jobs} Job pod(s), never evicted: their next pods get the new revision"
            ));
        }
        if all_passed {
            where_.push("namespaces no wave selected".to_owned());
        }
        if all_passed && !referencing.is_empty() {
            let n = referencing.len();
            referencing.truncate(REPORT_LIMIT);
            where_.push(format!(
                "{n} namespace(s) whose next pods {} would inject: {}; relabel them istio.io/rev={} before removing it",
                self.spec.from_revision,
                referencing.join(", "),
                self.spec.to_tag
            ));
        }
        let msg = if where_.is_empty() {
            format!(
                "{} prox(ies) still run revision {}",
                p.old, self.spec.from_revision
            )
        } else {
            format!(
                "{} prox(ies) still run revision {} (including {})",
                p.old,
                self.spec.from_revision,
                where_.join(", ")
            )
        };
        self.decision.condition(
            self.stamp(),
            conditions::OLD_REVISION_RETIRABLE,
            Status::False,
            reasons::OLD_PROXIES_REMAIN,
            msg,
        );
    }
}
