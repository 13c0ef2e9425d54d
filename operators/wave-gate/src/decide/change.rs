//! A new revision: starts the change from the first wave (superseding one in progress or a halted
//! one when allowed), or says why it waits.

use sluice_api::v1alpha1::wave_gate::{
    ChangeOutcome, DriftExporter, WaveStatus, conditions as types, reasons,
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use crate::decisions;

use super::model::{EventAction, Machine, Requeue, active_wave, admitted, done};

/// Starts the change to `spec.revision`, or returns why it waits.
pub(super) fn start_change(cx: &mut Machine<'_>) -> Option<Requeue> {
    let spec = cx.spec;
    let halted = cx.decision.status.halt.is_some();
    if halted && !spec.supersede_halted {
        let note = format!(
            "spec.revision {} waits: the change to {} halted; set spec.supersedeHalted to start the new revision from the first wave",
            spec.revision,
            cx.decision
                .status
                .current_revision
                .as_deref()
                .unwrap_or("?")
        );
        if cx.decision.condition(
            cx.stamp(),
            types::PROGRESSING,
            Status::False,
            reasons::BLOCKED_BY_HALT,
            note.clone(),
        ) {
            cx.decision.event(Notice::warning(
                reasons::BLOCKED_BY_HALT,
                EventAction::Change,
                note,
            ));
        }
        return Some(Requeue::AwaitChange);
    }
    // Drift is read by spec.sourceCommit: the same commit as the previous revision's reads
    // the old commit's drift (about 0) and would converge at once.
    if spec.drift_gate.exporter == DriftExporter::Platform
        && spec.source_commit.is_some()
        && spec.source_commit == cx.decision.status.source_commit
    {
        let note = format!(
            "spec.revision {} waits: spec.sourceCommit {} is the commit of the previous revision {}; set the new bundle's commit (its org.opencontainers.image.revision)",
            spec.revision,
            spec.source_commit.as_deref().unwrap_or_default(),
            cx.decision
                .status
                .current_revision
                .as_deref()
                .unwrap_or("?")
        );
        if cx.decision.condition(
            cx.stamp(),
            types::PROGRESSING,
            Status::False,
            reasons::SOURCE_COMMIT_UNCHANGED,
            note.clone(),
        ) {
            cx.decision.event(Notice::warning(
                reasons::SOURCE_COMMIT_UNCHANGED,
                EventAction::Change,
                note,
            ));
        }
        return Some(Requeue::AwaitChange);
    }
    let in_progress =
        !cx.decision.status.waves.is_empty() && active_wave(&cx.decision.status).is_some();
    let complete = !halted && !in_progress;
    if halted || in_progress {
        cx.history_finish(ChangeOutcome::Superseded);
        let note = format!(
            "the change to {} is superseded by {}; starting again from wave {}",
            cx.decision
                .status
                .current_revision
                .as_deref()
                .unwrap_or("?"),
            spec.revision,
            spec.waves[0].name
        );
        cx.decision.event(Notice::normal(
            reasons::SUPERSEDED,
            EventAction::Change,
            note,
        ));
    }
    // What a breach pins back to: the spec's word, else the last completed revision.
    let previous = spec.previous_revision.clone().or_else(|| {
        if complete {
            cx.decision.status.current_revision.clone()
        } else {
            cx.decision.status.previous_revision.clone()
        }
    });
    // Superseding a change mid-way: clusters of waves admitted but not yet passed would stay on
    // the superseded revision unjudged (the new change judges only its own active wave), so they
    // go back to the previous revision; waves that passed keep it (it was judged there).
    if in_progress
        && !halted
        && let Some(prev) = previous.as_deref()
    {
        let back: Vec<String> = spec
            .waves
            .iter()
            .zip(&cx.decision.status.waves)
            .filter(|(_, ws)| admitted(ws.state) && !done(ws.state))
            .flat_map(|(w, _)| w.clusters.iter().cloned())
            .collect();
        if !back.is_empty() {
            decisions::set_revision(&mut cx.decision.status.decisions, &back, prev);
            cx.history_note(&format!(
                "superseded mid-wave: {} set back to {prev} until the new change reaches them",
                back.join(", ")
            ));
        }
    }
    cx.decision.status.previous_revision = previous;
    cx.decision.status.current_revision = Some(spec.revision.clone());
    cx.decision.status.source_commit = spec.source_commit.clone();
    cx.decision.status.halt = None;
    cond::remove(&mut cx.decision.status.conditions, types::HALTED);
    cx.decision.status.waves = spec
        .waves
        .iter()
        .map(|w| WaveStatus {
            name: w.name.clone(),
            ..WaveStatus::default()
        })
        .collect();
    cx.history_start(None);
    None
}
