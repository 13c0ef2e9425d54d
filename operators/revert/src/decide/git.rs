//! The git revert a pin asks for: its branch name, the back-off between attempts, and when an
//! attempt is asked for again, from what [`crate::record`] recorded of the last one (one that may
//! pass is asked again; one that cannot waits for a change of the spec).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::{
    BundlePinSpec,
    bundle_pin::{conditions, reasons},
};
use sluice_runtime::conditions::Status;

use super::model::{
    Action, BRANCH_PREFIX, Decision, EventAction, GIT_RETRY_MAX, GIT_RETRY_MIN, Observations,
    Requeue, condition,
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
            EventAction::Pin,
        );
        return;
    }
    let (ns, name) = &obs.pin;
    // The effect runs before the status write; its result is folded in by `crate::record`.
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
