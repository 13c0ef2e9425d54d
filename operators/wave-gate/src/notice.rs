//! Which WaveGate transitions are worth a webhook notification, and the figures they carry: a
//! change halted (the wave, the revision, the failing gate's observed value against its
//! threshold, the clusters pinned back).
//!
//! Pure: a function of the status before and after a status write. Never sends anything itself;
//! reconcile hands the notice to the runtime's notifier after the write succeeded.

use sluice_api::v1alpha1::{WaveGatePhase, WaveGateStatus};
use sluice_runtime::notify::{Notice, NoticeEvent};

use crate::metrics::object_signal;

/// The notice for the transition from `before` to `after`, if the change halted. A status read
/// back with the same phase (a restart, a requeue) is no transition.
pub fn notice(before: Option<&WaveGateStatus>, after: &WaveGateStatus) -> Option<Notice> {
    let event = |phase| (phase == WaveGatePhase::Halted).then_some(NoticeEvent::Halt);
    let from = before.map(|s| s.phase);
    let mut n = Notice::of_transition(from, after.phase, event, object_signal(after).reason)?;
    let halt = after.halt.as_ref();
    n.message = halt.and_then(|h| h.message.clone()).unwrap_or_default();
    n.figure("wave", halt.map(|h| &h.wave))
        .figure("revision", &after.current_revision)
        .figure("previousRevision", &after.previous_revision)
        .figure("sourceCommit", &after.source_commit)
        .figure("pins", halt.map(|h| h.pins.len()))
        .figure("revertedClusters", halt.map(|h| &h.reverted_clusters));
    if let Some(gate) = halt.and_then(|h| h.gate.as_ref()) {
        n.gate(gate);
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use sluice_runtime::notify::checks;

    fn status(v: serde_json::Value) -> WaveGateStatus {
        serde_json::from_value(v).expect("status fixture")
    }

    #[test]
    fn a_halt_is_notified_with_its_wave_gate_and_clusters_and_nothing_else() {
        let soaking = status(json!({"phase": "Soaking", "currentRevision": "r2",
            "previousRevision": "r1", "currentWave": "canary"}));
        let halted = status(json!({
            "phase": "Halted", "currentRevision": "r2", "previousRevision": "r1",
            "halt": {"reason": "GateFailed", "message": "gate mesh-errors failed in wave canary",
                "wave": "canary", "haltedAt": "2026-12-02T05:00:00Z",
                "pins": ["canary-east-1"], "revertedClusters": ["east-1"],
                "gate": {"gate": "mesh-errors", "verdict": "Fail", "reason": "ThresholdBreached",
                    "value": 0.04, "threshold": 0.01, "consecutiveFailures": 1,
                    "evaluatedAt": "2026-12-02T05:00:00Z"}},
        }));
        let n = notice(Some(&soaking), &halted).expect("a halt");
        assert_eq!(n.event, NoticeEvent::Halt);
        assert_eq!((n.from.as_str(), n.to.as_str()), ("Soaking", "Halted"));
        assert_eq!(n.reason, "GateFailed");
        assert_eq!(n.message, "gate mesh-errors failed in wave canary");
        let want = json!({"wave": "canary", "revision": "r2", "previousRevision": "r1",
            "pins": 1, "revertedClusters": ["east-1"], "gate": "mesh-errors", "verdict": "Fail",
            "observed": 0.04, "threshold": 0.01});
        assert_eq!(serde_json::Value::Object(n.figures), want);

        let complete = status(json!({"phase": "Complete"}));
        let writes = [
            (Some(&halted), &halted),
            (Some(&soaking), &complete),
            (None, &soaking),
        ];
        checks::no_notice(&writes, notice, |s| s.phase);
    }
}
