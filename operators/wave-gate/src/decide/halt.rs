//! The halt: the failed wave, a BundlePin per admitted cluster, and the decisions set back to the
//! previous revision once revert holds the pins (or the pin wait has passed).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::wave_gate::{
    ChangeOutcome, HaltReason, HaltStatus, WaveState, conditions as types, reasons,
};
use sluice_api::v1alpha1::{BundlePinPhase, GateVerdict, WaveGateSpec, WaveGateStatus};
use sluice_runtime::{conditions::Status, events::Notice};

use crate::{
    decisions,
    pins::{self, AppRef, PinPlan},
};

use super::model::{Action, EventAction, Machine, Observations, Requeue, admitted, until};

pub(super) fn admitted_clusters(spec: &WaveGateSpec, s: &WaveGateStatus) -> Vec<String> {
    spec.waves
        .iter()
        .zip(&s.waves)
        .filter(|(_, ws)| admitted(ws.state))
        .flat_map(|(w, _)| w.clusters.iter().cloned())
        .collect()
}

/// The pins of a halt: one per admitted cluster that has Applications.
pub fn pin_plans(spec: &WaveGateSpec, status: &WaveGateStatus, obs: &Observations) -> Vec<PinPlan> {
    let (Some(h), Some(previous)) = (&status.halt, &status.previous_revision) else {
        return Vec::new();
    };
    let revision = status.current_revision.as_deref().unwrap_or(&spec.revision);
    h.reverted_clusters
        .iter()
        .flat_map(|c| {
            let mut applications: Vec<AppRef> = obs
                .applications
                .iter()
                .filter(|a| &a.cluster == c)
                .map(|a| AppRef {
                    name: a.name.clone(),
                    namespace: a.namespace.clone(),
                })
                .collect();
            applications.sort();
            // A pin targets at most MAX_TARGETS Applications: a cluster with more gets several
            // pins (none is left out); the first keeps the cluster's plain name.
            applications
                .chunks(pins::MAX_TARGETS)
                .enumerate()
                .map(|(i, chunk)| {
                    let key = if i == 0 {
                        c.clone()
                    } else {
                        format!("{c}/{i}")
                    };
                    PinPlan {
                        name: pins::pin_name(
                            &obs.namespace,
                            &obs.name,
                            pins::HaltKey {
                                revision,
                                previous,
                                halted_at: h.halted_at.0.as_second(),
                            },
                            &key,
                        ),
                        cluster: c.clone(),
                        applications: chunk.to_vec(),
                        digest: previous.clone(),
                        // The CRD's bounds: 10..3600 s.
                        deadline_seconds: obs.pin_wait.as_secs().clamp(10, 3600) as u32,
                        reason: format!(
                            "WaveGate {}/{} halted {revision} in wave {}: {}",
                            obs.namespace,
                            obs.name,
                            h.wave,
                            h.message.as_deref().unwrap_or_default()
                        ),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

pub(super) fn halt(
    cx: &mut Machine<'_>,
    i: usize,
    reason: HaltReason,
    message: String,
    gate: Option<GateVerdict>,
) {
    let spec = cx.spec;
    cx.decision.status.waves[i].state = WaveState::Failed;
    cx.decision.status.waves[i].finished_at = Some(Time(cx.now));
    let reverted = admitted_clusters(spec, &cx.decision.status);
    cx.decision.status.halt = Some(HaltStatus {
        reason,
        message: Some(message.chars().take(4096).collect()),
        wave: spec.waves[i].name.clone(),
        gate,
        halted_at: Time(cx.now),
        pins: Vec::new(),
        reverted_clusters: reverted,
        pinned_at: None,
    });
    let names: Vec<String> = pin_plans(spec, &cx.decision.status, cx.obs)
        .into_iter()
        .map(|p| p.name)
        .collect();
    if let Some(h) = cx.decision.status.halt.as_mut() {
        h.pins = names;
    }
    let r = match reason {
        HaltReason::ConvergenceTimeout => reasons::CONVERGENCE_TIMEOUT,
        HaltReason::GateFailed | HaltReason::InconclusiveTimeout => reasons::GATE_FAILED,
    };
    let note = format!("halted: {message}");
    cx.decision
        .condition(cx.stamp(), types::HALTED, Status::True, r, note.clone());
    cx.decision.condition(
        cx.stamp(),
        types::PROGRESSING,
        Status::False,
        r,
        note.clone(),
    );
    cx.history_finish(ChangeOutcome::Halted);
    cx.decision
        .event(Notice::warning(r, EventAction::Halt, note));
}

/// Pins first; once every pin exists, the admitted clusters' decisions go back to the previous
/// revision so Argo CD converges on what the pins applied.
pub(super) fn finish_halt(cx: &mut Machine<'_>) -> Requeue {
    let spec = cx.spec;
    let Some(h) = cx.decision.status.halt.clone() else {
        return Requeue::AwaitChange;
    };
    if h.pinned_at.is_some() {
        return Requeue::AwaitChange;
    }
    let Some(previous) = cx.decision.status.previous_revision.clone() else {
        let note = "halted, but no previous revision is known (set spec.previousRevision); nothing pinned and decisions unchanged".to_owned();
        if cx.decision.condition(
            cx.stamp(),
            types::HALTED,
            Status::True,
            reasons::GATE_FAILED,
            note.clone(),
        ) {
            cx.decision.event(Notice::warning(
                reasons::GATE_FAILED,
                EventAction::Pin,
                note,
            ));
        }
        return Requeue::AwaitChange;
    };
    let plans = pin_plans(spec, &cx.decision.status, cx.obs);
    let missing: Vec<PinPlan> = plans
        .into_iter()
        .filter(|p| !cx.obs.existing_pins.contains(&p.name))
        .collect();
    if !missing.is_empty() {
        cx.decision
            .actions
            .extend(missing.into_iter().map(Action::CreatePin));
        // The pins' creation is observed on the next reconcile.
        return Requeue::After(Duration::from_millis(200));
    }
    // The decisions go back only once revert holds every pin (automation suspended, bundle
    // applied): set back earlier, Argo CD would sync the previous revision itself, racing revert
    // and leaving its audit without the halted revision. A pin revert refused or failed, or one
    // not in force within `pin_wait`, does not hold the set-back: Argo CD then reverts.
    let plans = pin_plans(spec, &cx.decision.status, cx.obs);
    let phase = |name: &str| cx.obs.pin_phases.get(name).copied();
    let pending: Vec<&str> = plans
        .iter()
        .map(|p| p.name.as_str())
        .filter(|n| {
            !matches!(
                phase(n),
                Some(
                    BundlePinPhase::Pinned
                        | BundlePinPhase::Released
                        | BundlePinPhase::Refused
                        | BundlePinPhase::Failed
                )
            )
        })
        .collect();
    let waited = until(h.halted_at.0, cx.now);
    if !pending.is_empty() && waited < cx.obs.pin_wait {
        return Requeue::After(Duration::from_millis(250));
    }
    // A pin not in force by the pin wait reaches its own deadline (`pinDeadlineSeconds`, set to
    // the pin wait) at the same moment: revert then gives each Application its recorded sync
    // policy back, so Argo CD itself syncs the decision set back. (Assuming Argo CD acts while
    // revert keeps automation suspended would leave the cluster on the halted revision.)
    let mut caveats: Vec<String> = plans
        .iter()
        .filter_map(|p| match phase(&p.name) {
            Some(ph @ (BundlePinPhase::Refused | BundlePinPhase::Failed)) => Some(format!(
                "revert reports {} {ph:?} (automation given back): Argo CD reverts {} from the decision",
                p.name, p.cluster
            )),
            _ => None,
        })
        .collect();
    if !pending.is_empty() {
        caveats.push(format!(
            "{} not in force after {}s: at their deadline revert gives automation back, and the decisions are set back without waiting longer",
            pending.join(", "),
            cx.obs.pin_wait.as_secs()
        ));
    }
    decisions::set_revision(
        &mut cx.decision.status.decisions,
        &h.reverted_clusters,
        &previous,
    );
    for ws in cx.decision.status.waves.iter_mut() {
        if admitted(ws.state) && ws.state != WaveState::Failed {
            ws.state = WaveState::Reverted;
        }
    }
    let mut note = format!(
        "pinned back to {previous}: {} BundlePin(s) ({}) for cluster(s) {}; their decisions set back",
        h.pins.len(),
        h.pins.join(", "),
        h.reverted_clusters.join(", ")
    );
    if !caveats.is_empty() {
        note.push_str(&format!(" ({})", caveats.join("; ")));
    }
    if let Some(hh) = cx.decision.status.halt.as_mut() {
        hh.pinned_at = Some(Time(cx.now));
    }
    cx.decision.condition(
        cx.stamp(),
        types::HALTED,
        Status::True,
        reasons::PINNED_BACK,
        note.clone(),
    );
    cx.decision.event(Notice::warning(
        reasons::PINNED_BACK,
        EventAction::Pin,
        note,
    ));
    cx.decision.actions.push(Action::NudgeApplicationSet);
    Requeue::AwaitChange
}
