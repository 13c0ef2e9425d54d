//! The pure record: what carrying out a decision left behind, folded into a status. The
//! reconcile's act step reports each effect that leaves something to record as an [`Outcome`];
//! only this module writes those into the status, so the I/O side never edits a status by hand.
//!
//! Owns: the git revert's result (the branch once pushed, or the failure, whether and when it is
//! tried again, with the `GitRevert` condition saying so) folded into the decided status, and a
//! failed effect's `Pinned=False` condition folded into the status the pin already had (the
//! decision is then dropped, and retried). Never performs I/O and never decides anything:
//! [`crate::decide`] reads back what is recorded here to decide the next attempt.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    BundlePinStatus,
    bundle_pin::{GitRevertStatus, conditions, reasons},
};
use sluice_runtime::conditions::{self as cond, Status};

use crate::decide::git_retry_after;

/// One effect of a decision, carried out, with what the status must keep of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An attempt at the git revert (the `PushRevert` effect).
    GitRevert {
        /// What the attempt came to.
        result: GitOutcome,
        /// The pin's generation the attempt was made for.
        generation: Option<i64>,
        /// When it was made (the decision's time).
        at: Timestamp,
    },
    /// An effect failed: the reconcile stops there and is retried with back-off.
    EffectFailed {
        /// Bounded CamelCase reason of `Pinned=False` (`ApplyFailed`, `NotRestored`,
        /// `PreflightFailed`).
        reason: &'static str,
        /// What failed, where, and what to do.
        message: String,
        /// The pin's generation the decision was made from.
        generation: Option<i64>,
        /// When it failed (the decision's time).
        at: Timestamp,
    },
}

/// What an attempt at the git revert came to (the reconcile's I/O result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitOutcome {
    /// The branch is in the repository (and the pull request open, when asked).
    Pushed(GitRevertStatus),
    /// It failed.
    Failed {
        /// Bounded CamelCase kind of the failure (`RevertConflict`, `ForgeUnavailable`, ...).
        reason: &'static str,
        /// What failed, where, and what to do.
        message: String,
        /// Whether it may pass without a change of the spec (the forge or the repository was
        /// unreachable); otherwise it waits for the spec to change.
        retryable: bool,
    },
}

/// Folds `outcome` into `status`. Returns whether the condition it sets changed (added, or its
/// status, reason, message or generation differs), so a failure already recorded is neither
/// written nor announced again.
pub fn record(status: &mut BundlePinStatus, outcome: &Outcome) -> bool {
    match outcome {
        Outcome::GitRevert {
            result,
            generation,
            at,
        } => record_git_outcome(status, result.clone(), *generation, *at),
        Outcome::EffectFailed {
            reason,
            message,
            generation,
            at,
        } => cond::set(
            &mut status.conditions,
            cond::new(
                conditions::PINNED,
                Status::False,
                reason,
                message.clone(),
                *generation,
                *at,
            ),
        ),
    }
}

/// Records an attempt at the git revert in the status: the branch once pushed; otherwise the
/// failure, whether it is retried (and when) or waits for a change of the spec, with the
/// `GitRevert` condition saying so. [`crate::decide`] reads it back to decide the next attempt.
/// Returns whether the `GitRevert` condition changed.
pub fn record_git_outcome(
    status: &mut BundlePinStatus,
    outcome: GitOutcome,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let (condition_status, reason, message) = match outcome {
        GitOutcome::Pushed(revert) => {
            let note = format!(
                "revert branch {} at {}{}",
                revert.branch.as_deref().unwrap_or_default(),
                revert.commit.as_deref().unwrap_or_default(),
                revert
                    .pull_request_url
                    .as_deref()
                    .map(|u| format!(", pull request {u}"))
                    .unwrap_or_default()
            );
            status.git_revert = Some(GitRevertStatus {
                pushed_at: Some(Time(now)),
                attempted_generation: generation,
                failure: None,
                failure_reason: None,
                retryable: false,
                failed_attempts: 0,
                last_attempt_at: None,
                ..revert
            });
            (Status::True, reasons::REVERT_PUSHED, note)
        }
        GitOutcome::Failed {
            reason,
            message,
            retryable,
        } => {
            let previous = status.git_revert.take().unwrap_or_default();
            let attempts = if previous.attempted_generation == generation {
                previous.failed_attempts.saturating_add(1)
            } else {
                1
            };
            let (condition_reason, message) = if retryable {
                (
                    reasons::GIT_REVERT_FAILED,
                    format!(
                        "{message}; attempt {attempts} failed, tried again in {} s",
                        git_retry_after(attempts).as_secs()
                    ),
                )
            } else {
                (
                    reasons::GIT_REVERT_NOT_POSSIBLE,
                    format!(
                        "{message}; not tried again until the spec changes: revert the change in Git by hand, or correct spec.gitRevert"
                    ),
                )
            };
            status.git_revert = Some(GitRevertStatus {
                failure: Some(message.chars().take(1024).collect()),
                failure_reason: Some(reason.to_owned()),
                retryable,
                failed_attempts: attempts,
                last_attempt_at: Some(Time(now)),
                attempted_generation: generation,
                ..GitRevertStatus::default()
            });
            (Status::False, condition_reason, message)
        }
    };
    cond::set(
        &mut status.conditions,
        cond::new(
            conditions::GIT_REVERT,
            condition_status,
            reason,
            message,
            generation,
            now,
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn git(result: GitOutcome, generation: i64, at: i64) -> Outcome {
        Outcome::GitRevert {
            result,
            generation: Some(generation),
            at: t(at),
        }
    }

    fn failed(reason: &'static str, retryable: bool) -> GitOutcome {
        GitOutcome::Failed {
            reason,
            message: format!("{reason} happened"),
            retryable,
        }
    }

    fn condition<'a>(status: &'a BundlePinStatus, type_: &str) -> &'a Condition {
        cond::find(&status.conditions, type_).expect("the condition is set")
    }

    #[test]
    fn a_pushed_revert_records_its_branch_and_clears_earlier_failures() {
        let mut st = BundlePinStatus::default();
        assert!(record(
            &mut st,
            &git(failed("ForgeUnavailable", true), 3, 0)
        ));
        let pushed = GitOutcome::Pushed(GitRevertStatus {
            branch: Some("sluice/revert/argocd/pin-1-3f2a9c1e".into()),
            commit: Some("f00".into()),
            pull_request_url: Some("https://forge.invalid/pr/7".into()),
            ..Default::default()
        });
        assert!(record(&mut st, &git(pushed, 3, 40)));
        assert_eq!(
            st.git_revert,
            Some(GitRevertStatus {
                branch: Some("sluice/revert/argocd/pin-1-3f2a9c1e".into()),
                commit: Some("f00".into()),
                pull_request_url: Some("https://forge.invalid/pr/7".into()),
                pushed_at: Some(Time(t(40))),
                attempted_generation: Some(3),
                failure: None,
                failure_reason: None,
                retryable: false,
                failed_attempts: 0,
                last_attempt_at: None,
            })
        );
        let c = condition(&st, conditions::GIT_REVERT);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "True",
                reasons::REVERT_PUSHED,
                "revert branch sluice/revert/argocd/pin-1-3f2a9c1e at f00, pull request https://forge.invalid/pr/7"
            )
        );
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(c.last_transition_time, Time(t(40)));
    }

    #[test]
    fn a_failure_that_may_pass_counts_its_attempts_per_generation() {
        let mut st = BundlePinStatus::default();
        record(&mut st, &git(failed("ForgeUnavailable", true), 2, 10));
        record(&mut st, &git(failed("ForgeUnavailable", true), 2, 50));
        let g = st.git_revert.clone().unwrap();
        assert_eq!(g.failed_attempts, 2);
        assert_eq!(g.last_attempt_at, Some(Time(t(50))));
        assert_eq!(g.attempted_generation, Some(2));
        assert!(g.retryable);
        assert_eq!(g.failure_reason.as_deref(), Some("ForgeUnavailable"));
        // 30 s doubled once.
        let expected = "ForgeUnavailable happened; attempt 2 failed, tried again in 60 s";
        assert_eq!(g.failure.as_deref(), Some(expected));
        let c = condition(&st, conditions::GIT_REVERT);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", reasons::GIT_REVERT_FAILED, expected)
        );
        // A new generation (the spec changed) counts from one again.
        record(&mut st, &git(failed("ForgeUnavailable", true), 3, 60));
        assert_eq!(st.git_revert.as_ref().unwrap().failed_attempts, 1);
        assert!(
            condition(&st, conditions::GIT_REVERT)
                .message
                .ends_with("attempt 1 failed, tried again in 30 s")
        );
    }

    #[test]
    fn a_failure_that_cannot_pass_waits_for_the_spec_and_its_message_is_bounded() {
        let mut st = BundlePinStatus::default();
        let long = GitOutcome::Failed {
            reason: "RevertConflict",
            message: "x".repeat(2_000),
            retryable: false,
        };
        record(&mut st, &git(long, 1, 5));
        let g = st.git_revert.as_ref().unwrap();
        assert!(!g.retryable);
        assert_eq!(g.failed_attempts, 1);
        assert_eq!(g.failure.as_ref().unwrap().chars().count(), 1024);
        let c = condition(&st, conditions::GIT_REVERT);
        assert_eq!(c.reason, reasons::GIT_REVERT_NOT_POSSIBLE);
        assert!(
            c.message.ends_with(
                "; not tried again until the spec changes: revert the change in Git by hand, or correct spec.gitRevert"
            ),
            "{}",
            c.message
        );
    }

    #[test]
    fn a_failed_effect_is_recorded_once_and_keeps_its_transition_time() {
        let mut st = BundlePinStatus {
            phase: sluice_api::v1alpha1::BundlePinPhase::Pinning,
            ..Default::default()
        };
        let before = st.clone();
        let failure = |at: i64| Outcome::EffectFailed {
            reason: reasons::NOT_RESTORED,
            message: "spec.hosts still differs".into(),
            generation: Some(4),
            at: t(at),
        };
        assert!(record(&mut st, &failure(10)));
        let c = condition(&st, conditions::PINNED);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", reasons::NOT_RESTORED, "spec.hosts still differs")
        );
        assert_eq!(c.observed_generation, Some(4));
        // The same failure again: no change, the first transition time kept.
        assert!(!record(&mut st, &failure(70)));
        let c = condition(&st, conditions::PINNED);
        assert_eq!(c.last_transition_time, Time(t(10)));
        // Nothing else of the status is touched.
        assert_eq!(st.phase, before.phase);
        assert_eq!(st.conditions.len(), 1);
        assert!(st.git_revert.is_none());
    }
}
