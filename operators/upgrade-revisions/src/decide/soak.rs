//! The soak after a wave: waits its duration and reads the gates' verdicts (Fail aborts,
//! Inconclusive follows the gate's policy).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::revision_upgrade::{UpgradeWaveState, conditions, reasons};
use sluice_runtime::{conditions::Status, events::Notice};

use super::model::{EventAction, Machine, elapsed, event_reasons};

impl Machine<'_> {
    pub(super) fn soak(&mut self, index: usize) {
        let wave = self.decision.status.waves[index].name.clone();
        let soak = self
            .spec
            .soak_of(index)
            .and_then(|s| s.parse().ok())
            .unwrap_or(Duration::from_secs(900));
        let started = self.decision.status.waves[index]
            .soak_started_at
            .clone()
            .unwrap_or(Time(self.now));
        let gates = self.gates.filter(|g| g.wave == wave);
        let action = gates.and_then(|g| g.action);
        if action == Some(GateAction::Pause) {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::False,
                reasons::PAUSED,
                format!("wave {wave}: a gate stayed Inconclusive past its policy's limit (Pause); the soak holds until it passes or the upgrade is aborted"),
            );
            return;
        }
        if elapsed(&started, self.now) < soak {
            return;
        }
        let target = self.spec.to_revision.clone();
        let members: Vec<String> = self
            .decision
            .status
            .namespaces
            .iter()
            .filter(|n| n.wave == wave)
            .map(|n| n.name.clone())
            .collect();
        let unready: u32 = members
            .iter()
            .map(|n| self.count(n, &target).not_ready)
            .sum();
        if unready > 0 {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                format!("wave {wave}: soak elapsed; waiting for {unready} pod(s) on {target} to become Ready"),
            );
            return;
        }
        let passed = match gates {
            None => false,
            Some(g) => g.verdicts.is_empty() || action == Some(GateAction::Proceed),
        };
        if !passed {
            let why = if self.gates.is_none() {
                "no metrics source is configured (--prometheus-url), so gates cannot pass"
            } else if gates.is_none() {
                "gates are evaluated next"
            } else {
                "waiting for every gate to pass"
            };
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                format!("wave {wave}: soak elapsed; {why}"),
            );
            return;
        }
        let w = &mut self.decision.status.waves[index];
        w.state = UpgradeWaveState::Passed;
        w.finished_at = Some(Time(self.now));
        self.decision.event(Notice::normal(
            event_reasons::WAVE_PASSED,
            EventAction::Wave,
            format!("wave {wave} passed its soak with every gate green"),
        ));
        // Start the next wave in the same tick, so no tick is lost between waves.
        if index + 1 < self.decision.status.waves.len() {
            self.forward();
        } else {
            self.decision.status.current_wave = None;
            self.decision.status.current_wave_index = None;
        }
    }
}
