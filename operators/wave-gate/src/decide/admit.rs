//! Admission: a wave waits for the sites it names (or their audited release), then its clusters'
//! decisions move to the revision.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::wave_gate::{WaveState, conditions as types, reasons};
use sluice_runtime::{conditions::Status, events::Notice};

use crate::decisions;

use super::model::{Action, EventAction, Machine, Requeue, convergence_timeout, interval};

pub(super) fn admit(cx: &mut Machine<'_>, i: usize) -> Requeue {
    let spec = cx.spec;
    let wave = &spec.waves[i];
    let rev = spec.revision.clone();
    let mut waiting = Vec::new();
    let mut released = Vec::new();
    for wait in &wave.wait_for {
        if cx
            .obs
            .passed_elsewhere
            .contains(&(wait.site.clone(), wait.wave.clone()))
        {
            continue;
        }
        match spec
            .wait_releases
            .iter()
            .find(|r| r.site == wait.site && r.revision == rev)
        {
            Some(r) => released.push(format!("site {} released: {}", r.site, r.reason)),
            None => waiting.push(format!("site {} past wave {}", wait.site, wait.wave)),
        }
    }
    if !waiting.is_empty() {
        let what = waiting.join(", ");
        let ws = &mut cx.decision.status.waves[i];
        ws.state = WaveState::Waiting;
        ws.waiting_for = Some(what.clone());
        let note = format!("wave {} waits for {what} at {rev}", wave.name);
        if cx.decision.condition(
            cx.stamp(),
            types::PROGRESSING,
            Status::True,
            reasons::WAITING_FOR_SITE,
            note.clone(),
        ) {
            cx.decision.event(Notice::normal(
                reasons::WAITING_FOR_SITE,
                EventAction::Admit,
                note,
            ));
        }
        return Requeue::After(interval(spec));
    }
    for r in &released {
        let note = format!("wave {}: cross-site wait {r}", wave.name);
        cx.history_note(&note);
        cx.decision.event(Notice::warning(
            reasons::WAIT_RELEASED,
            EventAction::Admit,
            note,
        ));
    }
    let ws = &mut cx.decision.status.waves[i];
    ws.state = WaveState::Converging;
    ws.revision = Some(rev.clone());
    ws.admitted_at = Some(Time(cx.now));
    ws.waiting_for = None;
    decisions::set_revision(&mut cx.decision.status.decisions, &wave.clusters, &rev);
    let note = format!(
        "wave {} ({}) admitted at {rev}",
        wave.name,
        wave.clusters.join(", ")
    );
    cx.decision.condition(
        cx.stamp(),
        types::PROGRESSING,
        Status::True,
        reasons::WAVE_ADMITTED,
        note.clone(),
    );
    cx.decision.event(Notice::normal(
        reasons::WAVE_ADMITTED,
        EventAction::Admit,
        note,
    ));
    cx.decision.actions.push(Action::NudgeApplicationSet);
    Requeue::After(interval(spec).min(convergence_timeout(spec)))
}
