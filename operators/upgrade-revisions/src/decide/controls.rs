//! The operator's controls: `spec.abort` and an explicit resume of a paused upgrade.

use sluice_api::v1alpha1::revision_upgrade::{
    NamespaceState, UpgradeWaveState, UpgradeWaveStatus, reasons,
};
use sluice_runtime::events::Notice;

use super::model::{EventAction, Machine, event_reasons};

impl Machine<'_> {
    /// Abort and resume.
    pub(super) fn controls(&mut self) {
        let rolling_back = self
            .decision
            .status
            .namespaces
            .iter()
            .any(|n| n.state == NamespaceState::RollingBack);
        // A resume is acted on once the rollback has finished (it is not acknowledged before).
        if self.spec.resume > self.decision.status.resumes_handled
            && !self.spec.abort
            && !rolling_back
        {
            self.decision.status.resumes_handled = self.spec.resume;
            if self.decision.status.aborted_at.is_some() {
                self.resume();
            }
        }
        let active = self.decision.status.aborted_at.is_none()
            && self.decision.status.current_wave_index.is_some()
            && self.decision.status.completed_at.is_none();
        if self.spec.abort && active {
            self.start_rollback(
                reasons::ABORTED_MANUALLY,
                "aborted by spec.abort".to_owned(),
                UpgradeWaveState::RolledBack,
            );
        }
    }

    pub(super) fn resume(&mut self) {
        // Namespaces that were rolled back become candidates again; the failed wave restarts.
        self.decision
            .status
            .namespaces
            .retain(|n| !matches!(n.state, NamespaceState::RolledBack));
        let mut restarted = None;
        for w in &mut self.decision.status.waves {
            if matches!(
                w.state,
                UpgradeWaveState::Failed | UpgradeWaveState::RolledBack
            ) {
                restarted.get_or_insert(w.name.clone());
                *w = UpgradeWaveStatus {
                    name: w.name.clone(),
                    ..UpgradeWaveStatus::default()
                };
            }
        }
        self.decision.status.aborted_at = None;
        let note = format!(
            "resumed by spec.resume={}; wave {} starts again",
            self.spec.resume,
            restarted.as_deref().unwrap_or("(none)")
        );
        self.decision.event(Notice::normal(
            event_reasons::RESUMED,
            EventAction::Resume,
            note,
        ));
    }
}
