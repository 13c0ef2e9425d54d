//! The git revert a pin asks for: its branch name, the back-off between attempts, and how an
//! attempt's outcome is recorded in the status (one that may pass is asked again; one that cannot
//! waits for a change of the spec).

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    BundlePinSpec, BundlePinStatus,
    bundle_pin::{GitRevertStatus, conditions, reasons},
};
use sluice_runtime::conditions::{self as cond, Status};

use super::model::{
    Action, BRANCH_PREFIX, Decision, GIT_RETRY_MAX, GIT_RETRY_MIN, Observations, PIN, Requeue,
    condition,
};
use super::plan::bundle_to_verify;

/// The revert branch of a pin: `sluice/revert/<namespace>/<name>-<uid8>`. The first 8 hex
/// digits of the pin's UID make a name reused later (`pin-<app>-<digest12>` months on) a
/// different branch, so an old branch or pull request is never reported as this pin's.
pub fn branch_name(namespace: &str, name: &str, uid: &str) -> String {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase();
    if short.is_empty() {
        format!("{BRANCH_PREFIX}/{namespace}/{name}")
    } else {
        format!("{BRANCH_PREFIX}/{namespace}/{name}-{short}")
    }
}

/// How long to wait after `failed_attempts` failures in a row that may pass: [`GIT_RETRY_MIN`]
/// doubling per attempt, at most [`GIT_RETRY_MAX`].
pub fn git_retry_after(failed_attempts: u32) -> Duration {
    let doublings = failed_attempts.saturating_sub(1).min(16);
    GIT_RETRY_MIN
        .saturating_mul(1 << doublings)
        .min(GIT_RETRY_MAX)
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

/// Records an attempt at the git revert in the status: the branch once pushed; otherwise the
/// failure, whether it is retried (and when) or waits for a change of the spec, with the
/// `GitRevert` condition saying so. [`git_revert`] reads it back to decide the next attempt.
pub fn record_git_outcome(
    status: &mut BundlePinStatus,
    outcome: GitOutcome,
    generation: Option<i64>,
    now: Timestamp,
) {
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
    );
}

/// Asks for the git revert until the status records its branch: at once for a spec not tried
/// yet, after [`git_retry_after`] for a failure that may pass, never again for one that cannot
/// until the spec changes (a new generation).
pub(super) fn git_revert(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    let Some(git) = &spec.git_revert else { return };
    if let Some(done) = &d.status.git_revert
        && done.failure.is_some()
        && done.attempted_generation == gen_
    {
        if !done.retryable {
            return;
        }
        let due = done
            .last_attempt_at
            .as_ref()
            .map(|t| t.0.as_second() + git_retry_after(done.failed_attempts).as_secs() as i64);
        if let Some(due) = due
            && now.as_second() < due
        {
            let wait = Duration::from_secs((due - now.as_second()) as u64);
            if let Requeue::After(current) = d.requeue
                && wait < current
            {
                d.requeue = Requeue::After(wait);
            }
            return;
        }
    } else if d
        .status
        .git_revert
        .as_ref()
        .is_some_and(|g| g.failure.is_none() || g.branch.is_some())
    {
        // Pushed (a status written before failures were recorded counts as pushed too).
        return;
    }
    if !obs.git_configured {
        condition(
            d,
            conditions::GIT_REVERT,
            Status::False,
            reasons::GIT_NOT_CONFIGURED,
            "spec.gitRevert is set but the operator has no intent repository configured (--git-url); revert the change in Git by hand".into(),
            gen_,
            now,
            PIN,
        );
        return;
    }
    let (ns, name) = &obs.pin;
    // The effect runs before the status write; its result is recorded by the reconcile.
    d.actions.push(Action::PushRevert {
        commit: git.commit.clone(),
        base: git.base_branch.clone(),
        branch: branch_name(ns, name, &obs.uid),
        message: format!(
            "Revert {} (BundlePin {ns}/{name})\n\n{}\n\nPinned to {}.",
            &git.commit,
            spec.reason,
            bundle_to_verify(spec, Some(&d.status)).reference()
        ),
        pull_request: git.pull_request,
        owner: obs.uid.clone(),
    });
}
