//! Moving a change on: an emergency admits every wave at once; otherwise the active wave takes
//! its next step (admission, convergence, soak), several in one reconcile when they follow.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::WaveGateSpec;
use sluice_api::v1alpha1::wave_gate::{ChangeOutcome, WaveState, conditions as types, reasons};
use sluice_runtime::{conditions::Status, events::Notice};

use crate::decisions;

use super::admit::admit;
use super::converge::converge;
use super::model::{Action, EventAction, Machine, Requeue, active_wave, done, interval};
use super::soak::soak_step;

pub(super) fn emergency_applies(spec: &WaveGateSpec) -> Option<&str> {
    spec.emergency
        .as_ref()
        .filter(|e| e.revision == spec.revision)
        .map(|e| e.reason.as_str())
}

pub(super) fn progress(cx: &mut Machine<'_>) -> Requeue {
    let spec = cx.spec;
    let every = interval(spec);
    if let Some(reason) = emergency_applies(spec)
        && active_wave(&cx.decision.status).is_some()
    {
        let reason = reason.to_owned();
        let rev = spec.revision.clone();
        for (i, w) in spec.waves.iter().enumerate() {
            let ws = &mut cx.decision.status.waves[i];
            if done(ws.state) {
                continue;
            }
            ws.state = WaveState::Skipped;
            ws.revision = Some(rev.clone());
            ws.admitted_at.get_or_insert(Time(cx.now));
            ws.finished_at = Some(Time(cx.now));
            ws.waiting_for = None;
            decisions::set_revision(&mut cx.decision.status.decisions, &w.clusters, &rev);
        }
        cx.history_note(&format!("emergency: {reason}"));
        cx.history_finish(ChangeOutcome::Emergency);
        let note = format!(
            "emergency change: every wave admitted at {rev} without soak or gates; reason: {reason}"
        );
        cx.decision.condition(
            cx.stamp(),
            types::PROGRESSING,
            Status::False,
            reasons::EMERGENCY,
            note.clone(),
        );
        cx.decision.event(Notice::warning(
            reasons::EMERGENCY,
            EventAction::Admit,
            note,
        ));
        cx.decision.actions.push(Action::NudgeApplicationSet);
        return Requeue::AwaitChange;
    }

    // Several steps may happen in one reconcile (a wave passes, the next is admitted).
    for _ in 0..=spec.waves.len() {
        let Some(i) = active_wave(&cx.decision.status) else {
            if !cx.decision.status.waves.is_empty() {
                let note = format!("every wave runs {}", spec.revision);
                if cx.decision.condition(
                    cx.stamp(),
                    types::PROGRESSING,
                    Status::False,
                    reasons::COMPLETE,
                    note.clone(),
                ) {
                    cx.history_finish(ChangeOutcome::Complete);
                    cx.decision
                        .event(Notice::normal(reasons::COMPLETE, EventAction::Admit, note));
                }
            }
            return Requeue::AwaitChange;
        };
        match cx.decision.status.waves[i].state {
            WaveState::Pending | WaveState::Waiting => return admit(cx, i),
            WaveState::Converging => {
                if let Some(r) = converge(cx, i) {
                    return r;
                }
            }
            WaveState::Soaking => {
                if let Some(r) = soak_step(cx, i) {
                    return r;
                }
            }
            // A failed or reverted wave without a halt record cannot arise; hold.
            _ => return Requeue::After(every),
        }
    }
    Requeue::After(every)
}
