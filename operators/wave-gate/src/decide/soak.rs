//! The Soaking phase: when a converged wave's soak ends, when its gates are due, and the soak
//! itself: gates judged every interval, the wave passed once every gate is green after the end,
//! or halted on a gate that aborts or on convergence lost for good.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::wave_gate::{
    DriftExporter, HaltReason, WaveState, conditions as types, reasons,
};
use sluice_api::v1alpha1::{GateVerdict, Verdict, VerdictReason, WaveGateSpec, WaveGateStatus};
use sluice_runtime::{conditions::Status, events::Notice};

use super::converge::convergence;
use super::halt::{finish_halt, halt};
use super::model::{
    EventAction, Machine, Requeue, active_wave, add, convergence_timeout, interval, soak, ts, until,
};

/// When the soak of wave `i` ends (`None` while it has not converged).
pub fn soak_end(spec: &WaveGateSpec, status: &WaveGateStatus, i: usize) -> Option<Timestamp> {
    let w = status.waves.get(i)?;
    Some(add(ts(w.converged_at.as_ref()?), soak(spec, i)))
}

/// The soaking wave whose gates are due at `now`: never evaluated in this soak, last evaluated
/// an interval ago, or not yet evaluated since the soak ended. The reconcile evaluates gates
/// only then, so the analysis interval holds across restarts.
pub fn gates_due(spec: &WaveGateSpec, status: &WaveGateStatus, now: Timestamp) -> Option<usize> {
    if status.halt.is_some() {
        return None;
    }
    let i = active_wave(status)?;
    let w = &status.waves[i];
    if w.state != WaveState::Soaking {
        return None;
    }
    let end = soak_end(spec, status, i)?;
    let evaluated: Vec<Timestamp> = w
        .gates
        .iter()
        .filter(|g| g.reason != VerdictReason::Skipped)
        .map(|g| ts(&g.evaluated_at))
        .collect();
    let Some(oldest) = evaluated.iter().min().copied() else {
        return Some(i);
    };
    let stale_for_end = now >= end && oldest < end;
    (add(oldest, interval(spec)) <= now || stale_for_end).then_some(i)
}

/// The verdict recorded for a gate the platform declared it cannot evaluate (no drift
/// exporter): Inconclusive, reason Skipped. Reported, and never counted as a pass of that gate.
pub fn skipped_verdict(gate: &str, now: Timestamp) -> GateVerdict {
    GateVerdict {
        message: Some(
            "skipped: driftGate.exporter is None (the platform has no drift exporter); proxies' acknowledgement is not checked"
                .into(),
        ),
        ..GateVerdict::new(gate, Verdict::Inconclusive, VerdictReason::Skipped, Time(now))
    }
}

pub(super) fn soak_step(cx: &mut Machine<'_>, i: usize) -> Option<Requeue> {
    let spec = cx.spec;
    let every = interval(spec);
    let c = convergence(spec, i, &spec.revision, cx.obs);
    {
        let ws = &mut cx.decision.status.waves[i];
        ws.applications = Some(c.counts.clone());
        ws.proxies_behind = c.proxies_behind;
    }
    if let Some(evaluated) = &cx.obs.gates {
        let mut verdicts: Vec<GateVerdict> = evaluated.iter().map(|g| g.verdict.clone()).collect();
        if spec.drift_gate.exporter == DriftExporter::None {
            for g in spec.effective_gates() {
                if g.definition.builtin == Some(sluice_api::v1alpha1::BuiltinGate::ProxiesBehind)
                    && !verdicts.iter().any(|v| v.gate == g.name)
                {
                    verdicts.push(skipped_verdict(&g.name, cx.now));
                }
            }
        }
        cx.decision.status.waves[i].gates = verdicts;
        if let (GateAction::Abort, Some(first)) =
            sluice_analysis::combined_action(evaluated.iter().map(|g| g.action))
        {
            let bad = &evaluated[first];
            let reason = if bad.verdict.verdict == Verdict::Fail {
                HaltReason::GateFailed
            } else {
                HaltReason::InconclusiveTimeout
            };
            let v = &bad.verdict;
            let message = format!(
                "wave {}: gate {} {:?} ({}): value {}, threshold {}, samples {}{}",
                spec.waves[i].name,
                v.gate,
                v.verdict,
                v.reason.as_str(),
                v.value.map_or("none".into(), |x| x.to_string()),
                v.threshold.map_or("none".into(), |x| x.to_string()),
                v.samples.map_or("unknown".into(), |x| x.to_string()),
                v.message
                    .as_deref()
                    .map(|m| format!("; {m}"))
                    .unwrap_or_default()
            );
            halt(cx, i, reason, message, Some(v.clone()));
            return Some(finish_halt(cx));
        }
    }
    let end = soak_end(spec, &cx.decision.status, i).unwrap_or(cx.now);
    if cx.now < end {
        let next_eval = cx.decision.status.waves[i]
            .gates
            .iter()
            .filter(|g| g.reason != VerdictReason::Skipped)
            .map(|g| add(ts(&g.evaluated_at), every))
            .min()
            .unwrap_or(cx.now);
        return Some(Requeue::After(until(cx.now, next_eval.min(end))));
    }
    // The soak has ended: every gate green, evaluated after the end, and still converged.
    let ws = &cx.decision.status.waves[i];
    let fresh = !ws.gates.is_empty()
        && ws
            .gates
            .iter()
            .filter(|g| g.reason != VerdictReason::Skipped)
            .all(|g| ts(&g.evaluated_at) >= end);
    let green = cx.obs.gates.as_ref().is_some_and(|gs| {
        sluice_analysis::combined_action(gs.iter().map(|g| g.action)).0 == GateAction::Proceed
    });
    if fresh && green && c.ok {
        let ws = &mut cx.decision.status.waves[i];
        ws.state = WaveState::Passed;
        ws.finished_at = Some(Time(cx.now));
        let note = format!(
            "wave {} passed at {}: soak ended with every gate green",
            spec.waves[i].name, spec.revision
        );
        cx.decision.condition(
            cx.stamp(),
            types::PROGRESSING,
            Status::True,
            reasons::WAVE_PASSED,
            note.clone(),
        );
        cx.decision.event(Notice::normal(
            reasons::WAVE_PASSED,
            EventAction::Soak,
            note,
        ));
        return None;
    }
    // Say what holds the wave past its soak (readable in `kubectl describe`).
    if let Some(gs) = &cx.obs.gates {
        let mut holding: Vec<String> = gs
            .iter()
            .filter(|g| g.action != GateAction::Proceed)
            .map(|g| {
                let paused = if g.action == GateAction::Pause {
                    ", paused by policy"
                } else {
                    ""
                };
                format!(
                    "{} {:?} ({}{paused})",
                    g.verdict.gate,
                    g.verdict.verdict,
                    g.verdict.reason.as_str()
                )
            })
            .collect();
        if !c.ok {
            holding.push(c.detail.clone());
        }
        if !holding.is_empty() {
            let note = format!(
                "wave {} soaked but is held: {}",
                spec.waves[i].name,
                holding.join("; ")
            );
            cx.decision.condition(
                cx.stamp(),
                types::PROGRESSING,
                Status::True,
                reasons::SOAKING,
                note,
            );
        }
    }
    if !c.ok && cx.now >= add(end, convergence_timeout(spec)) {
        let message = format!(
            "wave {} lost convergence during its soak and did not regain it within {}: {}",
            spec.waves[i].name, spec.convergence_timeout, c.detail
        );
        halt(cx, i, HaltReason::ConvergenceTimeout, message, None);
        return Some(finish_halt(cx));
    }
    Some(Requeue::After(every))
}
