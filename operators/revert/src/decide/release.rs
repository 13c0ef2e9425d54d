//! Releasing: gives every held Application its automated sync back exactly as recorded, on an
//! explicit release, on matching content, when the deadline passes, or when another pin takes over.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde_json::Value;
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec, BundlePinStatus,
    bundle_pin::{ApplicationPinState, PinnedApplication, conditions, reasons},
};
use sluice_runtime::conditions::{self as cond, Status};

use super::model::{
    Action, Decision, EventAction, Observations, OtherPin, Requeue, app_key, condition,
    holds_application, view,
};

/// What release sets `automated.enabled` back to: `None` when the original policy had no
/// `automated` (nothing was suspended there), else its original `enabled` (`None`: absent).
pub(super) fn original_enabled(app: &PinnedApplication) -> Option<Option<bool>> {
    let automated = app.original_sync_policy.as_ref()?.get("automated")?;
    Some(automated.get("enabled").and_then(Value::as_bool))
}

/// The live pin (other than this one) that took this pin's Applications over with
/// `spec.supersedes`, once it verified.
pub(super) fn superseded_by<'a>(
    obs: &'a Observations,
    status: &BundlePinStatus,
) -> Option<&'a OtherPin> {
    obs.other_pins.iter().find(|o| {
        o.verified
            && o.supersedes.as_deref() == Some(obs.pin.1.as_str())
            && o.applications.iter().any(|a| {
                a.inherited_from.as_deref() == Some(obs.pin.1.as_str())
                    && status
                        .applications
                        .iter()
                        .any(|m| m.namespace == a.namespace && m.name == a.name)
            })
    })
}

pub(super) fn release(
    _spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    reason: &'static str,
    note: String,
) {
    let gen_ = obs.generation;
    // Sync policies first, from what verification recorded: never waits on the registry or the
    // key. Then revert's field ownership of the recorded objects.
    d.status.released_at = Some(Time(now));
    let mut effects = give_back_effects(obs, d);
    effects.sort_by_key(|a| matches!(a, Action::DropOwnership { .. }));
    d.actions.splice(0..0, effects);
    d.status.phase = BundlePinPhase::Released;
    cond::set(
        &mut d.status.conditions,
        cond::new(
            conditions::RELEASED,
            Status::True,
            reason,
            note.clone(),
            gen_,
            now,
        ),
    );
    d.actions.push(Action::Audit {
        reason,
        from_digest: d.status.to_digest.clone(),
        to_digest: None,
        note,
    });
    d.requeue = Requeue::AwaitChange;
}

/// The effects that give every held Application its automation back (`automated.enabled` as
/// recorded, nothing else of the policy) and drop revert's field ownership of the objects it
/// applied; marks those Applications Released.
pub(super) fn give_back_effects(obs: &Observations, d: &mut Decision) -> Vec<Action> {
    let now_released = d.status.released_at.clone();
    let mut effects = Vec::new();
    for app in &mut d.status.applications {
        // A Failed Application is given back only while it still exists.
        let touched = holds_application(app)
            && (app.state != ApplicationPinState::Failed || view(obs, app).is_some());
        if touched
            && app.original_sync_policy_saved
            && let Some(enabled) = original_enabled(app)
            && view(obs, app).is_some()
        {
            effects.push(Action::SetAutomation {
                app: app_key(app),
                enabled,
            });
        }
        if app.state == ApplicationPinState::Pinned
            && let Some(destination) = &app.destination
        {
            effects.push(Action::DropOwnership {
                app: app_key(app),
                destination: destination.clone(),
                default_namespace: app
                    .destination_namespace
                    .clone()
                    .or_else(|| view(obs, app).and_then(|v| v.destination_namespace.clone())),
            });
        }
        if touched || app.state == ApplicationPinState::Pending {
            app.state = ApplicationPinState::Released;
            app.released_at = now_released.clone();
        }
    }
    effects
}

/// The pin's deadline passed before every object was restored: every Application it suspended
/// gets its automation back and the pin ends Failed, holding nothing.
pub(super) fn give_back(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
) {
    d.status.released_at = Some(Time(now));
    let mut effects = give_back_effects(obs, d);
    effects.sort_by_key(|a| matches!(a, Action::DropOwnership { .. }));
    d.actions.splice(0..0, effects);
    d.status.phase = BundlePinPhase::Failed;
    let note = format!(
        "the pin did not restore every object within spec.pinDeadlineSeconds ({} s); every Application it suspended has its automation back. The last failure is in this pin's Events and revert's log",
        spec.pin_deadline_seconds
    );
    condition(
        d,
        conditions::PINNED,
        Status::False,
        reasons::DEADLINE_EXCEEDED,
        note.clone(),
        obs.generation,
        now,
        EventAction::Pin,
    );
    d.actions.push(Action::Audit {
        reason: reasons::DEADLINE_EXCEEDED,
        from_digest: d.status.to_digest.clone(),
        to_digest: None,
        note,
    });
    d.requeue = Requeue::AwaitChange;
}

/// A pin that supersedes this one took its Applications over (with their original policies):
/// this one lets go without restoring anything or dropping ownership (the same field manager
/// now holds the successor's objects).
pub(super) fn handed_over(by: String, now: Timestamp, gen_: Option<i64>, d: &mut Decision) {
    for app in &mut d.status.applications {
        if holds_application(app) || app.state == ApplicationPinState::Pending {
            app.state = ApplicationPinState::Released;
            app.released_at = Some(Time(now));
        }
    }
    d.status.phase = BundlePinPhase::Released;
    d.status.released_at = Some(Time(now));
    let note = format!("BundlePin {by} superseded this pin and holds its Applications now");
    cond::set(
        &mut d.status.conditions,
        cond::new(
            conditions::RELEASED,
            Status::True,
            reasons::SUPERSEDED,
            note.clone(),
            gen_,
            now,
        ),
    );
    d.actions.push(Action::Audit {
        reason: reasons::SUPERSEDED,
        from_digest: d.status.to_digest.clone(),
        to_digest: None,
        note,
    });
    d.requeue = Requeue::AwaitChange;
}
