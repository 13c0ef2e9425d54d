//! The Pinned phase: holds every Application on the pinned content, re-suspends automation turned
//! back on (with back-off, up to `Fighting`), and asks for the git revert.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    BundlePinSpec,
    bundle_pin::{ApplicationPinState, ReleasePolicy, conditions, reasons},
};
use sluice_runtime::{conditions::Status, events::Notice};

use super::git::git_revert;
use super::model::{
    Action, Decision, EventAction, FIGHT_WINDOW, MAX_RESUSPEND_BACKOFF, MAX_RESUSPENSIONS,
    Observations, POLL, Requeue, app_key, condition, policy_prunes, view,
};
use super::release::release;

/// Back-off before the next re-suspension after `n` of them: 1 s, doubling, at most
/// [`MAX_RESUSPEND_BACKOFF`].
pub fn resuspend_backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.min(6)).min(MAX_RESUSPEND_BACKOFF)
}

pub(super) fn pinned(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    d.requeue = Requeue::After(POLL);
    git_revert(spec, obs, now, d, gen_);
    // Something turned automation back on (a person, a controller): suspend again, each time
    // after a longer wait, and after MAX_RESUSPENSIONS within FIGHT_WINDOW stop and say so
    // instead of fighting at API speed.
    let mut resuspend = Vec::new();
    let mut fighting = Vec::new();
    for app in &mut d.status.applications {
        let Some(v) = view(obs, app) else { continue };
        if !v.automated || app.state != ApplicationPinState::Pinned {
            continue;
        }
        let last = app.last_resuspended_at.as_ref().map(|t| t.0.as_second());
        if last.is_some_and(|l| now.as_second() - l > FIGHT_WINDOW.as_secs() as i64) {
            app.resuspensions = 0;
        }
        let who = format!("{}/{}", app.namespace, app.name);
        if app.resuspensions >= MAX_RESUSPENSIONS {
            fighting.push(who);
            continue;
        }
        let due = last.map_or(0, |l| {
            l + resuspend_backoff(app.resuspensions).as_secs() as i64
        });
        if now.as_second() < due {
            d.requeue = Requeue::After(Duration::from_secs((due - now.as_second()) as u64));
            continue;
        }
        app.resuspensions += 1;
        app.last_resuspended_at = Some(Time(now));
        resuspend.push((
            Action::SetAutomation {
                app: app_key(app),
                enabled: Some(false),
            },
            who,
        ));
    }
    if !resuspend.is_empty() {
        let names: Vec<String> = resuspend.iter().map(|(_, w)| w.clone()).collect();
        d.event(Notice::warning(
            reasons::RESUSPENDED,
            EventAction::Pin,
            format!(
                "automated sync was turned back on for {} while pinned; suspended again",
                names.join(", ")
            ),
        ));
        d.actions
            .splice(0..0, resuspend.into_iter().map(|(a, _)| a));
    }
    if !fighting.is_empty() {
        condition(
            d,
            conditions::SUSPENDED,
            Status::False,
            reasons::FIGHTING,
            format!(
                "automated sync of {} was turned back on {MAX_RESUSPENSIONS} times within {} min while pinned; revert stopped suspending it again. Fix what turns it on (an ApplicationSet without ignoreApplicationDifferences on /spec/syncPolicy, a person, a tool), then suspend it by hand or release this pin",
                fighting.join(", "),
                FIGHT_WINDOW.as_secs() / 60
            ),
            gen_,
            now,
            EventAction::Pin,
        );
    }
    if spec.release_policy == ReleasePolicy::Explicit {
        return;
    }
    let Some(content) = d.status.content_digest.clone() else {
        return;
    };
    let mut matched = true;
    let mut forward = Vec::new();
    for app in &d.status.applications {
        let Some(v) = view(obs, app) else {
            matched = false;
            continue;
        };
        // Argo CD reports Synced; or OutOfSync only by objects that need pruning while the
        // recorded policy does not prune — Argo CD's auto-sync skips exactly that case ("need
        // to prune extra resources only but automated prune is disabled"), so giving automation
        // back changes nothing. Extraneous objects annotated
        // `argocd.argoproj.io/compare-options: IgnoreExtraneous` never make Argo CD report
        // OutOfSync (`controller/state.go`), so they already read Synced here.
        let synced = v.sync_status.as_deref() == Some("Synced")
            || (v.out_of_sync_only_by_pruning && !policy_prunes(app.original_sync_policy.as_ref()));
        let same = v.revision_content.as_deref() == Some(content.as_str());
        if !(synced && same) {
            matched = false;
        }
        if let (Some(rev), Some(c)) = (&v.revision, &v.revision_content)
            && *c != content
            && Some(rev) != app.from_digest.as_ref()
        {
            forward.push(format!(
                "{}/{} at {rev} (content {c})",
                app.namespace, app.name
            ));
        }
    }
    if matched {
        release(
            spec,
            obs,
            now,
            d,
            reasons::CONTENT_MATCHED,
            format!("Argo CD reports every Application Synced at the pinned content {content}"),
        );
        return;
    }
    if !forward.is_empty() {
        condition(
            d,
            conditions::RELEASED,
            Status::False,
            reasons::FORWARD_FIX_WAITING,
            format!(
                "Argo CD now targets different content than the pin ({}); if this forward fix is wanted, set spec.release: true with spec.releaseReason",
                forward.join(", ")
            ),
            gen_,
            now,
            EventAction::Release,
        );
    }
}
