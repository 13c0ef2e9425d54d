//! A weight step: the applied share the mesh reports must match the written weight (within the
//! tolerance, before the deadline) before the step's analysis clock starts; then the gates
//! evaluated since decide (Pass, Fail, an Inconclusive policy). Never judges a step on the written
//! weight alone, and never aborts on missing share data.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::{
    RolloutPhase, Verdict,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{EventAction, Machine, dur, expected_share, since};

impl Machine<'_> {
    pub(super) fn run_weight(&mut self, index: usize, duration: Duration) -> bool {
        let target = expected_share(self.spec, &self.decision.status, index);
        let tol = f64::from(self.spec.applied_share_tolerance_percent) / 100.0;
        let interval = self.interval();
        // Verdicts, a share or an error: the analysis ran this tick. Between analyses the
        // reconcile only checks deadlines and leaves the judgement as it was.
        let analysed = !self.obs.gates.is_empty()
            || self.obs.applied_share.is_some()
            || self.obs.analysis_error.is_some();
        if analysed {
            self.decision.status.phase = RolloutPhase::Progressing;
        }
        if let Some(s) = self.obs.applied_share {
            self.decision.status.applied_share = Some(s);
            self.decision.status.applied_share_observed_at = Some(Time(self.now));
        }
        let confirmed = self
            .decision
            .status
            .history
            .last()
            .and_then(|r| r.share_confirmed_at.clone());
        let Some(confirmed) = confirmed else {
            // The gates judge the canary from the first second of the step: only the share
            // gate waits for the confirmation (the plan does not judge it before).
            if self.judge_live(index, "share not yet confirmed") {
                return false;
            }
            let within = self
                .obs
                .applied_share
                .is_some_and(|s| (s - target).abs() <= tol * target.max(f64::EPSILON));
            if within {
                if let Some(rec) = self.decision.status.history.last_mut() {
                    rec.share_confirmed_at = Some(Time(self.now));
                }
                let note = format!(
                    "applied share {:.2}% within ±{:.0}% of {target}%; analysis starts",
                    self.obs.applied_share.unwrap_or_default(),
                    tol * 100.0
                );
                self.decision.condition(
                    self.stamp(),
                    conditions::APPLIED_SHARE_CONFIRMED,
                    Status::True,
                    reasons::SHARE_WITHIN_TOLERANCE,
                    note.clone(),
                );
                self.decision.event(Notice::normal(
                    reasons::SHARE_WITHIN_TOLERANCE,
                    EventAction::Share,
                    note,
                ));
                self.wake(interval);
                return false;
            }
            let deadline = dur(&self.spec.applied_share_deadline, Duration::from_secs(600));
            let elapsed = since(
                self.decision.status.current_step_started_at.as_ref(),
                self.now,
            );
            let seen = match (self.obs.applied_share, &self.obs.analysis_error) {
                (Some(s), _) => format!("{s:.2}%"),
                (None, Some(e)) => format!("no data (metrics unavailable: {e})"),
                (None, None) => "no data".to_owned(),
            };
            let note = format!(
                "canary weight {target}% written; the mesh reports {seen} (needs ±{:.0}%); the step is not judged on the written weight",
                tol * 100.0
            );
            // Aborting needs the mesh to report a wrong share: with no reading in the last two
            // intervals (a metrics outage), the step is held instead, never aborted on missing
            // data (the canary's gates then have no data either: a Fail still aborts).
            let recent = self
                .decision
                .status
                .applied_share_observed_at
                .as_ref()
                .is_some_and(|t| since(Some(t), self.now) <= interval * 2);
            if elapsed >= deadline && !recent {
                self.decision.status.phase = RolloutPhase::Paused;
                self.decision.condition(
                    self.stamp(),
                    conditions::PROGRESSING,
                    Status::True,
                    reasons::METRICS_UNAVAILABLE,
                    format!(
                        "{note}; deadline {}s passed without share data: held until the mesh reports the share, never aborted on missing data",
                        deadline.as_secs()
                    ),
                );
                self.wake(interval);
                return false;
            }
            if elapsed >= deadline {
                self.abort(
                    AbortReason::AppliedShareNotConfirmed,
                    format!("{note}; deadline {}s passed", deadline.as_secs()),
                    None,
                );
                return false;
            }
            if !analysed {
                self.wake(interval.min(deadline - elapsed));
                return false;
            }
            let was = cond::find(
                &self.decision.status.conditions,
                conditions::APPLIED_SHARE_CONFIRMED,
            )
            .map(|c| c.reason.clone());
            self.decision.condition(
                self.stamp(),
                conditions::APPLIED_SHARE_CONFIRMED,
                Status::False,
                reasons::SHARE_NOT_YET_APPLIED,
                note.clone(),
            );
            if was.as_deref() != Some(reasons::SHARE_NOT_YET_APPLIED) && elapsed >= interval * 2 {
                self.decision.event(Notice::warning(
                    reasons::SHARE_NOT_YET_APPLIED,
                    EventAction::Share,
                    note,
                ));
            }
            self.wake(interval);
            return false;
        };
        // The share is confirmed: judge the gates evaluated since.
        if let Some(e) = &self.obs.analysis_error {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::STEP_IN_PROGRESS,
                format!("step {index} held: metrics unavailable ({e}); no promotion without data"),
            );
        } else if cond::find(&self.decision.status.conditions, conditions::PROGRESSING).is_some_and(
            |c| {
                c.message
                    .starts_with(&format!("step {index} held: metrics"))
            },
        ) {
            self.decision.condition(
                self.stamp(),
                conditions::PROGRESSING,
                Status::True,
                reasons::STEP_IN_PROGRESS,
                format!("step {index} analysing: metrics available again"),
            );
        }
        for (v, act) in &self.obs.gates {
            if v.evaluated_at.0 < confirmed.0 {
                continue;
            }
            self.decision.status.gates.retain(|g| g.gate != v.gate);
            self.decision.status.gates.push(v.clone());
            match act {
                GateAction::Abort => {
                    let (reason, why) = if v.verdict == Verdict::Fail {
                        (AbortReason::GateFailed, "failed")
                    } else {
                        (
                            AbortReason::InconclusiveTimeout,
                            "stayed inconclusive (policy Abort)",
                        )
                    };
                    let msg = format!(
                        "gate {} {why} at step {index}: value {:?} vs threshold {:?} ({})",
                        v.gate,
                        v.value,
                        v.threshold,
                        v.message.clone().unwrap_or_default()
                    );
                    self.abort(reason, msg, Some(v.clone()));
                    return false;
                }
                GateAction::Pause => {
                    self.decision.status.phase = RolloutPhase::Paused;
                    self.decision.condition(self.stamp(), conditions::PROGRESSING, Status::True, reasons::INCONCLUSIVE, format!("gate {} inconclusive for too long ({}: {}); held (policy Pause) until it passes or a person acts", v.gate, v.reason.as_str(), v.message.clone().unwrap_or_default()));
                }
                GateAction::Proceed | GateAction::Wait => {}
            }
        }
        self.decision
            .status
            .gates
            .sort_by(|a, b| a.gate.cmp(&b.gate));
        let names: Vec<String> = self
            .spec
            .effective_gates()
            .into_iter()
            .map(|g| g.name)
            .collect();
        // A gate passes the step on Pass, or on a sustained Inconclusive whose policy is
        // Continue ("treat the gate as passed"), judged on this tick's verdicts.
        let continued = |n: &String| {
            self.obs.gates.iter().any(|(v, act)| {
                &v.gate == n && v.verdict == Verdict::Inconclusive && *act == GateAction::Proceed
            })
        };
        let all_pass = names.iter().all(|n| {
            self.decision
                .status
                .gates
                .iter()
                .any(|g| &g.gate == n && g.verdict == Verdict::Pass)
                || continued(n)
        });
        let analysed = since(Some(&confirmed), self.now);
        if all_pass && analysed >= duration {
            return true;
        }
        self.wake(
            interval.min(
                duration
                    .saturating_sub(analysed)
                    .max(Duration::from_millis(200)),
            ),
        );
        false
    }
}
