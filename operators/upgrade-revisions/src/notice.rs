//! Which RevisionUpgrade transitions are worth a webhook notification, and the figures they
//! carry: an upgrade completed, aborted (rolling back) or held, with the wave, the proxy counts
//! by revision and the namespaces moved.
//!
//! Pure: a function of the status before and after a status write. Never sends anything itself;
//! reconcile hands the notice to the runtime's notifier after the write succeeded.

use sluice_api::v1alpha1::{
    RevisionUpgradePhase as Phase, RevisionUpgradeStatus, revision_upgrade::NamespaceState,
};
use sluice_runtime::notify::{Notice, NoticeEvent};

use crate::metrics::object_signal;

fn event(phase: Phase) -> Option<NoticeEvent> {
    match phase {
        Phase::Complete => Some(NoticeEvent::Complete),
        // Rolling back is the abort; Aborted is where it ends.
        Phase::RollingBack | Phase::Aborted => Some(NoticeEvent::Abort),
        Phase::Paused => Some(NoticeEvent::Hold),
        _ => None,
    }
}

/// The notice for the transition from `before` to `after`, if the upgrade completed, began to
/// roll back or was held. A status read back with the same phase (a restart, a requeue) is no
/// transition, nor is the end of a rollback already notified when it began.
pub fn notice(
    before: Option<&RevisionUpgradeStatus>,
    after: &RevisionUpgradeStatus,
) -> Option<Notice> {
    let from = before.map(|s| s.phase);
    let mut n = Notice::of_transition(from, after.phase, event, object_signal(after).reason)?;
    if from.and_then(event) == Some(n.event) {
        return None;
    }
    n.message_from(&after.conditions);
    let moved = after
        .namespaces
        .iter()
        .filter(|ns| ns.state == NamespaceState::Moved)
        .count();
    n.figure("wave", &after.current_wave)
        .figure("namespaces", after.namespaces.len())
        .figure("namespacesMoved", moved);
    if let Some(p) = &after.proxies {
        n.figure("proxiesOld", p.old)
            .figure("proxiesNew", p.new)
            .figure("proxiesOther", p.other);
    }
    if n.event == NoticeEvent::Hold
        && let Some(b) = &after.issuance_budget
    {
        n.figure("issuanceThrottled", b.throttled)
            .figure("issuanceObservedRate", b.observed_rate);
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status(phase: &str) -> RevisionUpgradeStatus {
        serde_json::from_value(json!({
            "phase": phase, "currentWave": "second",
            "proxies": {"old": 120, "new": 880, "other": 0},
            "namespaces": [
                {"name": "shop", "wave": "first", "state": "Moved", "pods": 40},
                {"name": "pay", "wave": "second", "state": "Restarting", "pods": 12},
            ],
        }))
        .expect("status fixture")
    }

    #[test]
    fn completion_abort_and_hold_are_notified_once_with_the_counts() {
        let table = [
            ("Soaking", "Complete", Some(NoticeEvent::Complete)),
            ("Soaking", "RollingBack", Some(NoticeEvent::Abort)),
            ("Progressing", "Paused", Some(NoticeEvent::Hold)),
            // The end of a rollback was notified when it began.
            ("RollingBack", "Aborted", None),
            ("Paused", "Paused", None),
            ("Pending", "Progressing", None),
            ("Paused", "Progressing", None),
        ];
        for (from, to, want) in table {
            let got = notice(Some(&status(from)), &status(to));
            assert_eq!(got.as_ref().map(|n| n.event), want, "{from} -> {to}");
        }
        let n = notice(Some(&status("Soaking")), &status("Complete")).unwrap();
        let want = json!({"wave": "second", "namespaces": 2, "namespacesMoved": 1,
            "proxiesOld": 120, "proxiesNew": 880, "proxiesOther": 0});
        assert_eq!(serde_json::Value::Object(n.figures), want);
    }
}
