//! The Pinning phase: suspends automated sync (recording the original policy first), applies the
//! verified bundle, prunes what it lacks, and waits for every target to report it, within the pin's
//! deadline.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec, BundlePinStatus,
    bundle_pin::{ApplicationPinState, GroupKind, conditions, reasons},
};
use sluice_runtime::conditions::{self as cond, Status};

use super::model::{
    Action, AppView, BundleSummary, Decision, EventAction, ObjectKey, Observations, POLL, RETRY,
    Requeue, SHORT, Verification, allowed_kinds, app_key, condition, policy_prunes, view,
};
use super::plan::bundle_to_verify;

/// When the pin's deadline passes (verification + `spec.pinDeadlineSeconds`).
pub fn deadline_left(
    spec: &BundlePinSpec,
    status: &BundlePinStatus,
    now: Timestamp,
) -> Option<Duration> {
    let verified = status.verified_at.as_ref()?.0;
    let end = verified.as_second() + i64::from(spec.pin_deadline_seconds);
    Some(Duration::from_secs(
        end.saturating_sub(now.as_second()).max(0) as u64,
    ))
}

/// The longest one apply-and-prune of an Application may take, whatever the pin's deadline.
pub const MAX_APPLY: Duration = Duration::from_secs(600);

/// How long one apply-and-prune may take: until the pin's deadline, at most [`MAX_APPLY`], at
/// least a second.
pub fn apply_budget(spec: &BundlePinSpec, status: &BundlePinStatus, now: Timestamp) -> Duration {
    deadline_left(spec, status, now)
        .unwrap_or(MAX_APPLY)
        .clamp(Duration::from_secs(1), MAX_APPLY)
}

/// Tracked objects of allowed kinds the bundle lacks.
pub(super) fn to_prune(
    allowed: &[GroupKind],
    bundle: &BundleSummary,
    v: &AppView,
    default_ns: &str,
) -> Vec<ObjectKey> {
    let in_bundle: Vec<ObjectKey> = bundle
        .objects
        .iter()
        .map(|o| ObjectKey {
            namespace: if o.namespace.is_empty() {
                default_ns.to_owned()
            } else {
                o.namespace.clone()
            },
            ..o.clone()
        })
        .collect();
    let mut out: Vec<ObjectKey> = v
        .tracked
        .iter()
        .filter(|t| {
            allowed
                .iter()
                .any(|a| a.group == t.group && a.kind == t.kind)
        })
        .filter(|t| !in_bundle.iter().any(|b| b.same_object(t)))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

pub(super) fn pinning(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    let held = bundle_to_verify(spec, Some(&d.status)).digest;
    let bundle = match &obs.verification {
        Some(Verification::Verified(b)) if b.digest == held => b.clone(),
        Some(Verification::Refused { reason, message }) => {
            // The registry now serves something else under the signed digest: stop.
            d.status.phase = BundlePinPhase::Failed;
            condition(
                d,
                conditions::PINNED,
                Status::False,
                reason,
                format!("verification failed while pinning: {message}"),
                gen_,
                now,
                EventAction::Pin,
            );
            d.requeue = Requeue::AwaitChange;
            return;
        }
        _ => {
            d.requeue = Requeue::After(RETRY);
            return;
        }
    };
    let allowed = allowed_kinds(spec, obs.platform_kinds.as_deref());
    let mut waiting = false;
    let mut actions = Vec::new();
    let mut apps = d.status.applications.clone();
    for app in &mut apps {
        let key = app_key(app);
        let Some(v) = view(obs, app) else {
            app.state = ApplicationPinState::Failed;
            app.message = Some(format!(
                "Application {}/{} disappeared while pinning",
                app.namespace, app.name
            ));
            continue;
        };
        match app.state {
            ApplicationPinState::Pending => {
                // Record first, touch after: only a status that already holds the original
                // policy lets an Application be suspended.
                if !app.original_sync_policy_saved {
                    app.original_sync_policy = v.sync_policy.clone();
                    app.original_sync_policy_saved = true;
                    waiting = true;
                    continue;
                }
                // revert's identity, the destination's kinds and a dry-run of every write
                // succeed before automation is suspended; a failure is retried until the
                // deadline, with nothing suspended.
                if !app.preflight_passed {
                    let Some(destination) = app.destination.clone().or(v.destination.clone())
                    else {
                        app.state = ApplicationPinState::Failed;
                        app.message = Some("the Application names no destination cluster".into());
                        continue;
                    };
                    let default_ns = app
                        .destination_namespace
                        .clone()
                        .or(v.destination_namespace.clone());
                    actions.push(Action::Preflight {
                        app: key,
                        destination,
                        prune: if policy_prunes(app.original_sync_policy.as_ref()) {
                            to_prune(
                                &allowed,
                                &bundle,
                                v,
                                default_ns.as_deref().unwrap_or_default(),
                            )
                        } else {
                            Vec::new()
                        },
                        default_namespace: default_ns,
                    });
                    app.preflight_passed = true;
                    waiting = true;
                    continue;
                }
                if v.operation_phase.as_deref() == Some("Running") {
                    actions.push(Action::TerminateSync { app: key.clone() });
                    app.sync_terminated = true;
                }
                if v.automated {
                    actions.push(Action::SetAutomation {
                        app: key.clone(),
                        enabled: Some(false),
                    });
                }
                if v.operation_requested && !v.sync_running() {
                    actions.push(Action::ClearOperation { app: key });
                }
                app.state = ApplicationPinState::Suspended;
                waiting = true;
            }
            ApplicationPinState::Suspended => {
                if v.sync_running() || v.automated {
                    // Terminating, or something turned automation back on: suspend again.
                    if v.automated {
                        actions.push(Action::SetAutomation {
                            app: key,
                            enabled: Some(false),
                        });
                    }
                    waiting = true;
                    continue;
                }
                let default_ns = app
                    .destination_namespace
                    .clone()
                    .or(v.destination_namespace.clone());
                // Only what Argo CD's own sync under the recorded policy would delete.
                let lacking = to_prune(
                    &allowed,
                    &bundle,
                    v,
                    default_ns.as_deref().unwrap_or_default(),
                );
                let (prune, kept) = if policy_prunes(app.original_sync_policy.as_ref()) {
                    (lacking, None)
                } else {
                    let kept = (!lacking.is_empty()).then(|| format!(
                        "kept {} object(s) the bundle lacks: the Application's sync policy does not prune (automated.prune is not true), as Argo CD's sync would keep them",
                        lacking.len()
                    ));
                    (Vec::new(), kept)
                };
                let Some(destination) = app.destination.clone().or(v.destination.clone()) else {
                    app.state = ApplicationPinState::Failed;
                    app.message = Some("the Application names no destination cluster".into());
                    continue;
                };
                app.applied_objects = bundle.objects.len() as u32;
                app.pruned_objects = prune.len() as u32;
                app.pinned_at = Some(Time(now));
                app.state = ApplicationPinState::Pinned;
                app.message = kept;
                actions.push(Action::Apply {
                    app: key,
                    destination,
                    default_namespace: default_ns,
                    prune,
                });
            }
            _ => {}
        }
    }
    d.status.applications = apps;
    d.actions.splice(0..0, actions);
    let failed: Vec<String> = d
        .status
        .applications
        .iter()
        .filter(|a| a.state == ApplicationPinState::Failed)
        .filter_map(|a| a.message.clone())
        .collect();
    if !failed.is_empty() {
        condition(
            d,
            conditions::PINNED,
            Status::False,
            reasons::APPLY_FAILED,
            failed.join("; "),
            gen_,
            now,
            EventAction::Pin,
        );
    }
    let all_pinned = d
        .status
        .applications
        .iter()
        .all(|a| a.state == ApplicationPinState::Pinned);
    if !all_pinned {
        let wait = if waiting { SHORT } else { RETRY };
        d.requeue = Requeue::After(
            deadline_left(spec, &d.status, now).map_or(wait, |left| wait.min(left.max(SHORT))),
        );
        return;
    }
    d.status.phase = BundlePinPhase::Pinned;
    d.status.pinned_at = Some(Time(now));
    d.status.applied_objects = d
        .status
        .applications
        .iter()
        .map(|a| a.applied_objects)
        .sum();
    d.status.pruned_objects = d.status.applications.iter().map(|a| a.pruned_objects).sum();
    let note = format!(
        "pinned {} Application(s) from {} to {} (content {}): {} objects applied, {} pruned; reason: {}",
        d.status.applications.len(),
        d.status.from_digest.as_deref().unwrap_or("mixed revisions"),
        held,
        bundle.content_digest,
        d.status.applied_objects,
        d.status.pruned_objects,
        spec.reason
    );
    cond::set(
        &mut d.status.conditions,
        cond::new(
            conditions::PINNED,
            Status::True,
            reasons::ALL_PINNED,
            note.clone(),
            gen_,
            now,
        ),
    );
    d.actions.push(Action::Audit {
        reason: reasons::ALL_PINNED,
        from_digest: d.status.from_digest.clone(),
        to_digest: d.status.to_digest.clone(),
        note,
    });
    // The git revert follows in the next reconcile, so the pin is recorded as soon as every
    // object is applied.
    d.requeue = Requeue::After(if spec.git_revert.is_some() {
        Duration::ZERO
    } else {
        POLL
    });
}
