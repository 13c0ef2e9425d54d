//! The forward path: starting waves in order and moving each through relabel, restart and soak.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::revision_upgrade::{
    NamespaceProgress, NamespaceState, UpgradeWaveState, UpgradeWaveStatus, conditions, reasons,
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{EventAction, Machine, event_reasons};
use crate::fleet::{self};

impl Machine<'_> {
    pub(super) fn forward(&mut self) {
        if !self.tags_ok() {
            return;
        }
        if let Some(other) = &self.obs.earlier_upgrade {
            // One issuance budget per cluster: two upgrades would each spend all of it, and
            // could move the same namespaces.
            let msg = format!(
                "RevisionUpgrade {other} was created earlier and is still in progress; this one starts no relabel, restart or wave until it is Complete, Aborted or deleted"
            );
            let known = cond::find(&self.decision.status.conditions, conditions::PROGRESSING)
                .is_some_and(|c| c.reason == reasons::WAITING_FOR_UPGRADE && c.message == msg);
            if !known {
                self.decision.event(Notice::normal(
                    reasons::WAITING_FOR_UPGRADE,
                    EventAction::Wave,
                    msg.clone(),
                ));
            }
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::False,
                reasons::WAITING_FOR_UPGRADE,
                msg,
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        if self.spec.paused {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::False,
                reasons::PAUSED,
                "held by spec.paused: no relabel, restart or wave starts",
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        // A wave that started (its namespaces relabelled or moving) may not leave the spec:
        // nothing would finish or roll back its namespaces. The upgrade holds until it is back
        // or the upgrade is aborted (which retags them).
        let removed: Vec<String> = self
            .decision
            .status
            .waves
            .iter()
            .filter(|w| w.state != UpgradeWaveState::Pending)
            .filter(|w| !self.spec.waves.iter().any(|s| s.name == w.name))
            .filter(|w| {
                self.decision.status.namespaces.iter().any(|n| {
                    n.wave == w.name
                        && matches!(n.state, NamespaceState::Restarting | NamespaceState::Moved)
                })
            })
            .map(|w| w.name.clone())
            .collect();
        if !removed.is_empty() {
            let msg = format!(
                "wave(s) {} started but were removed from spec.waves: their namespaces would be left half-moved; put them back, or set spec.abort to retag them",
                removed.join(", ")
            );
            let known = cond::find(&self.decision.status.conditions, conditions::PROGRESSING)
                .is_some_and(|c| c.reason == reasons::STARTED_WAVE_REMOVED && c.message == msg);
            if !known {
                self.decision.event(Notice::warning(
                    reasons::STARTED_WAVE_REMOVED,
                    EventAction::Wave,
                    msg.clone(),
                ));
            }
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::False,
                reasons::STARTED_WAVE_REMOVED,
                msg,
            );
            self.update_counts(&self.spec.to_revision.clone());
            return;
        }
        if self.decision.status.waves.len() != self.spec.waves.len()
            || self
                .decision
                .status
                .waves
                .iter()
                .zip(&self.spec.waves)
                .any(|(s, w)| s.name != w.name)
        {
            // Keep the readings of waves that still exist, in spec order.
            let old = std::mem::take(&mut self.decision.status.waves);
            self.decision.status.waves =
                self.spec
                    .waves
                    .iter()
                    .map(|w| {
                        old.iter().find(|s| s.name == w.name).cloned().unwrap_or(
                            UpgradeWaveStatus {
                                name: w.name.clone(),
                                ..UpgradeWaveStatus::default()
                            },
                        )
                    })
                    .collect();
        }
        // The current wave: the first that has not passed.
        let Some(index) = self
            .decision
            .status
            .waves
            .iter()
            .position(|w| w.state != UpgradeWaveState::Passed)
        else {
            self.decision.status.current_wave = None;
            self.decision.status.current_wave_index = None;
            self.update_counts(&self.spec.to_revision.clone());
            return;
        };
        self.decision.status.current_wave = Some(self.decision.status.waves[index].name.clone());
        self.decision.status.current_wave_index = Some(index as u32);
        if self.decision.status.waves[index].state == UpgradeWaveState::Pending {
            self.start_wave(index);
        }
        let target = self.spec.to_revision.clone();
        self.relabel(
            index,
            &self.spec.from_tag.clone(),
            &self.spec.to_tag.clone(),
        );
        self.update_counts(&target);
        let wave_name = self.decision.status.waves[index].name.clone();
        // Gates judge the wave from its start; a Fail aborts at any point.
        if let Some(report) = self.gates.filter(|g| g.wave == wave_name) {
            self.decision.status.waves[index].gates = report.verdicts.clone();
            self.decision.status.captured_baselines = report.baselines.clone();
            if report.action == Some(GateAction::Abort) {
                let failed: Vec<String> = report
                    .verdicts
                    .iter()
                    .filter(|v| v.verdict != sluice_api::v1alpha1::Verdict::Pass)
                    .map(|v| {
                        format!(
                            "{} {:?} ({})",
                            v.gate,
                            v.verdict,
                            v.message.as_deref().unwrap_or(v.reason.as_str())
                        )
                    })
                    .collect();
                self.start_rollback(
                    reasons::GATE_FAILED,
                    format!("wave {wave_name}: gate(s) failed: {}", failed.join("; ")),
                    UpgradeWaveState::Failed,
                );
                self.roll_back();
                return;
            }
        }
        match self.decision.status.waves[index].state {
            UpgradeWaveState::Restarting => self.restart_wave(index),
            UpgradeWaveState::Soaking => self.soak(index),
            _ => {}
        }
    }

    pub(super) fn start_wave(&mut self, index: usize) {
        let taken: BTreeSet<String> = self
            .decision
            .status
            .namespaces
            .iter()
            .map(|n| n.name.clone())
            .collect();
        let members = match fleet::wave_members(self.spec, index, &self.fleet.namespaces, &taken) {
            Ok(m) => m,
            Err(e) => {
                self.decision.condition(
                    self.stamp(),
                    conditions::PROGRESSING,
                    Status::False,
                    reasons::INVALID_SPEC,
                    e.to_string(),
                );
                return;
            }
        };
        let wave = &mut self.decision.status.waves[index];
        wave.state = UpgradeWaveState::Restarting;
        wave.started_at = Some(Time(self.now));
        wave.namespaces = members.len() as u32;
        let name = wave.name.clone();
        for m in &members {
            self.decision.status.namespaces.push(NamespaceProgress {
                name: m.clone(),
                wave: name.clone(),
                ..NamespaceProgress::default()
            });
        }
        let proxies: u32 = members.iter().map(|m| self.count(m, "").pods).sum();
        self.decision.event(Notice::normal(event_reasons::WAVE_STARTED,
            EventAction::Wave,
            format!(
                "wave {name} started: {} namespace(s), {proxies} proxies, moving from tag {} ({}) to {} ({})",
                members.len(),
                self.spec.from_tag,
                self.spec.from_revision,
                self.spec.to_tag,
                self.spec.to_revision
            )));
    }
}
