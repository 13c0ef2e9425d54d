//! Which Rollout transitions are worth a webhook notification, and the figures they carry:
//! a canary aborted (the weight it had, the failing gate's observed value against its
//! threshold) and a canary promoted.
//!
//! Pure: a function of the status before and after a status write. Never sends anything itself;
//! reconcile hands the notice to the runtime's notifier after the write succeeded.

use sluice_api::v1alpha1::{RolloutPhase, RolloutStatus};
use sluice_runtime::notify::{Notice, NoticeEvent};

use crate::metrics::object_signal;

/// The notice for the transition from `before` to `after`, if it is an abort or a promotion.
/// A status read back with the same phase (a restart, a requeue) is no transition.
pub fn notice(before: Option<&RolloutStatus>, after: &RolloutStatus) -> Option<Notice> {
    let event = |phase| match phase {
        RolloutPhase::Aborted => Some(NoticeEvent::Abort),
        RolloutPhase::Promoted => Some(NoticeEvent::Promotion),
        _ => None,
    };
    let from = before.map(|s| s.phase);
    let mut n = Notice::of_transition(from, after.phase, event, object_signal(after).reason)?;
    n.figure("canaryVersion", &after.canary_version);
    match n.event {
        NoticeEvent::Abort => {
            let abort = after.abort.as_ref();
            n.message = abort.and_then(|a| a.message.clone()).unwrap_or_default();
            // The weight and share the canary had when it was aborted (after: 0).
            n.figure("step", abort.and_then(|a| a.step_index))
                .figure("canaryWeight", before.and_then(|s| s.desired_weight))
                .figure("appliedShare", before.and_then(|s| s.applied_share));
            if let Some(gate) = abort.and_then(|a| a.gate.as_ref()) {
                n.gate(gate);
            }
        }
        _ => {
            n.message_from(&after.conditions);
            n.figure("canaryWeight", after.desired_weight)
                .figure("steps", after.history.len())
                .figure("promotedAt", &after.promoted_at);
        }
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use sluice_runtime::notify::checks;

    fn status(v: serde_json::Value) -> RolloutStatus {
        serde_json::from_value(v).expect("status fixture")
    }

    #[test]
    fn aborts_and_promotions_are_notified_with_their_figures_and_nothing_else() {
        let progressing = status(json!({
            "phase": "Progressing", "currentStepIndex": 1, "desiredWeight": 10,
            "appliedShare": 0.098, "canaryVersion": "v2",
        }));
        let aborted = status(json!({
            "phase": "Aborted", "desiredWeight": 0, "canaryVersion": "v2",
            "abort": {
                "reason": "GateFailed", "message": "gate error-rate failed: 0.21 > 0.05",
                "stepIndex": 1, "decidedAt": "2026-12-02T05:00:00Z",
                "gate": {"gate": "error-rate", "verdict": "Fail", "reason": "ThresholdBreached",
                    "value": 0.21, "threshold": 0.05, "samples": 412,
                    "consecutiveFailures": 2, "evaluatedAt": "2026-12-02T05:00:00Z"},
            },
        }));
        let promoted = status(json!({
            "phase": "Promoted", "desiredWeight": 100, "canaryVersion": "v2",
            "promotedAt": "2026-12-02T05:30:00Z",
            "conditions": [{"type": "Progressing", "status": "True", "reason": "Promoted",
                "message": "every step passed", "lastTransitionTime": "2026-12-02T05:30:00Z"}],
        }));

        let n = notice(Some(&progressing), &aborted).expect("an abort");
        assert_eq!(n.event, NoticeEvent::Abort);
        assert_eq!((n.from.as_str(), n.to.as_str()), ("Progressing", "Aborted"));
        assert_eq!(n.reason, "GateFailed");
        assert_eq!(n.message, "gate error-rate failed: 0.21 > 0.05");
        let want = json!({"canaryVersion": "v2", "step": 1, "canaryWeight": 10,
            "appliedShare": 0.098, "gate": "error-rate", "verdict": "Fail", "observed": 0.21,
            "threshold": 0.05, "samples": 412});
        assert_eq!(serde_json::Value::Object(n.figures), want);

        let n = notice(Some(&progressing), &promoted).expect("a promotion");
        assert_eq!(n.event, NoticeEvent::Promotion);
        assert_eq!(n.reason, "Promoted");
        assert_eq!(n.message, "every step passed");
        assert_eq!(n.figures["canaryWeight"], 100);

        // No transition, or one nobody is told about.
        let table = [
            (Some(&aborted), &aborted),
            (Some(&promoted), &promoted),
            (None, &progressing),
            (Some(&aborted), &progressing),
        ];
        checks::no_notice(&table, notice, |s| s.phase);
    }
}
