//! The Progressing and Paused phases: the steps in order (`promoteThroughStep`, `promoteFull`,
//! `spec.paused`), each step's start and end in the history, pause, mirror and cohort steps, and
//! the hold at weight 0 while the canary Service is gone. A weight step is run by `weight`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{StepKind, StepOutcome, StepRecord, conditions, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use crate::route_edit::Desired;

use super::model::{EventAction, MAX_HISTORY, Machine, desired_at, dur, since};

impl Machine<'_> {
    pub(super) fn progressing(&mut self) {
        let spec = self.spec;
        if spec.promote_full {
            self.finish_step(StepOutcome::Promoted);
            self.promote("spec.promoteFull".into());
            return;
        }
        let mut index = self.decision.status.current_step_index.unwrap_or(0) as usize;
        if self.obs.canary_service == Some(false) {
            self.hold_without_service(index);
            return;
        }
        if spec.paused {
            if self.judge_live(index, "spec.paused") {
                return;
            }
            self.decision.status.phase = RolloutPhase::Paused;
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::PAUSED,
                "spec.paused is true",
            );
            // A weight step whose share is not yet confirmed starts its deadline over when
            // resumed: a pause never turns into an AppliedShareNotConfirmed abort on resume.
            let unconfirmed = spec.steps.get(index).and_then(|s| s.kind())
                == Some(StepKind::SetWeight)
                && self
                    .decision
                    .status
                    .history
                    .last()
                    .is_some_and(|h| h.share_confirmed_at.is_none());
            if unconfirmed {
                self.decision.status.current_step_started_at = Some(Time(self.now));
            }
            self.write(desired_at(spec, index));
            return;
        }
        // Bounded: each pass completes a step or stops.
        for _ in 0..=spec.steps.len() {
            let Some(_) = spec.steps.get(index) else {
                self.promote("all steps passed".into());
                return;
            };
            if !self.run_step(index) {
                if self.decision.status.phase != RolloutPhase::Aborted {
                    self.write(desired_at(spec, index));
                }
                return;
            }
            let outcome = if spec
                .promote_through_step
                .is_some_and(|p| p as usize >= index)
            {
                StepOutcome::Promoted
            } else {
                StepOutcome::Passed
            };
            self.finish_step(outcome);
            index += 1;
            self.start_step(index);
            if self.decision.status.phase == RolloutPhase::Promoted {
                return;
            }
        }
    }

    /// Runs the current step; returns true when it completed.
    fn run_step(&mut self, index: usize) -> bool {
        let spec = self.spec;
        let Some(step) = spec.steps.get(index) else {
            return true;
        };
        if spec
            .promote_through_step
            .is_some_and(|p| p as usize >= index)
        {
            return true;
        }
        let started = self.decision.status.current_step_started_at.clone();
        let elapsed = since(started.as_ref(), self.now);
        let duration = spec
            .step_duration_of(index)
            .map(|d| dur(&d, Duration::from_secs(300)));
        match step.kind() {
            Some(StepKind::Mirror | StepKind::HeaderCohort) => {
                let held = if step.kind() == Some(StepKind::Mirror) {
                    "mirror step"
                } else {
                    "cohort step, cohort traffic against stable"
                };
                if self.judge_live(index, held) {
                    return false;
                }
                if step.kind() == Some(StepKind::HeaderCohort)
                    && let Some(share) = self.obs.applied_share
                {
                    // The cohort's share, for the expected share of later steps that keep it:
                    // the highest reading, since the windowed share climbs from 0 to it.
                    self.decision.status.cohort_share = Some(
                        self.decision
                            .status
                            .cohort_share
                            .map_or(share, |c| c.max(share)),
                    );
                }
                let d = duration.unwrap_or_default();
                if elapsed >= d {
                    return true;
                }
                self.wake(d - elapsed);
                false
            }
            Some(StepKind::Pause) if self.judge_live(index, "pause step") => false,
            Some(StepKind::Pause) => match duration {
                Some(d) if elapsed >= d => true,
                Some(d) => {
                    self.decision.status.phase = RolloutPhase::Paused;
                    self.decision.condition(
                        self.stamp(),
                        conditions::PROGRESSING,
                        Status::True,
                        reasons::PAUSED,
                        format!("pause step {index} for {}s", d.as_secs()),
                    );
                    self.wake(d - elapsed);
                    false
                }
                None => {
                    self.decision.status.phase = RolloutPhase::Paused;
                    self.decision.condition(self.stamp(), conditions::PROGRESSING, Status::True, reasons::PAUSED, format!("pause step {index} waits for spec.promoteThroughStep >= {index} or spec.promoteFull"));
                    false
                }
            },
            Some(StepKind::SetWeight) => self.run_weight(index, duration.unwrap_or_default()),
            Some(StepKind::Promote) | None => true,
        }
    }

    pub(super) fn start_step(&mut self, index: usize) {
        self.decision.status.gates.clear();
        self.decision.status.applied_share = None;
        self.decision.status.applied_share_observed_at = None;
        cond::remove(
            &mut self.decision.status.conditions,
            conditions::APPLIED_SHARE_CONFIRMED,
        );
        let Some(step) = self.spec.steps.get(index) else {
            self.promote("all steps passed".into());
            return;
        };
        let kind = step.kind().unwrap_or(StepKind::Pause);
        if kind == StepKind::Promote {
            self.decision.status.current_step_index = Some(index as u32);
            self.promote(format!("step {index} promotes"));
            return;
        }
        self.decision.status.phase = RolloutPhase::Progressing;
        self.decision.status.current_step_index = Some(index as u32);
        self.decision.status.current_step_started_at = Some(Time(self.now));
        sluice_runtime::decision::record_bounded(
            &mut self.decision.status.history,
            StepRecord {
                index: index as u32,
                kind,
                weight: step.set_weight.as_ref().map(|w| w.weight),
                started_at: Time(self.now),
                share_confirmed_at: None,
                finished_at: None,
                outcome: None,
            },
            MAX_HISTORY,
        );
        let d = desired_at(self.spec, index);
        let note = format!(
            "step {index} ({kind:?}) started, canary weight {}",
            d.weight
        );
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::True,
            reasons::STEP_IN_PROGRESS,
            note.clone(),
        );
        self.decision.event(Notice::normal(
            reasons::STEP_IN_PROGRESS,
            EventAction::Step,
            note,
        ));
        self.write(d);
    }

    pub(super) fn finish_step(&mut self, outcome: StepOutcome) {
        let idx = self.decision.status.current_step_index;
        if let Some(rec) = self
            .decision
            .status
            .history
            .iter_mut()
            .rev()
            .find(|r| Some(r.index) == idx && r.finished_at.is_none())
        {
            rec.finished_at = Some(Time(self.now));
            rec.outcome = Some(outcome);
        }
    }

    /// The canary Service is gone mid-rollout: its share of requests would get 500s that no
    /// gate attributes to the canary. Holds the canary at weight 0 (no cohort, no mirror) and
    /// keeps the step's clock and share confirmation at their start, so the step starts over
    /// once the Service is back; never aborts for it and never advances.
    fn hold_without_service(&mut self, index: usize) {
        let msg = format!(
            "canary Service {} does not exist: canary weight 0 until it does, then step {index} starts over",
            self.spec.canary_service.name
        );
        let before = cond::find(&self.decision.status.conditions, conditions::CANARY_READY)
            .map(|c| c.reason.clone());
        self.decision.condition(
            self.stamp(),
            conditions::CANARY_READY,
            Status::False,
            reasons::CANARY_SERVICE_MISSING,
            msg.clone(),
        );
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::True,
            reasons::CANARY_SERVICE_MISSING,
            msg.clone(),
        );
        if before.as_deref() != Some(reasons::CANARY_SERVICE_MISSING) {
            self.decision.event(Notice::warning(
                reasons::CANARY_SERVICE_MISSING,
                EventAction::Step,
                msg,
            ));
        }
        self.decision.status.phase = RolloutPhase::Paused;
        self.decision.status.current_step_started_at = Some(Time(self.now));
        self.decision.status.gates.clear();
        if let Some(rec) = self.decision.status.history.last_mut() {
            rec.share_confirmed_at = None;
        }
        cond::remove(
            &mut self.decision.status.conditions,
            conditions::APPLIED_SHARE_CONFIRMED,
        );
        self.write(Desired::abort());
        self.wake(self.interval());
    }
}
