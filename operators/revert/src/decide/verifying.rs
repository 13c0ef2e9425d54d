//! The Verifying phase: reads the verification outcome (signature, kinds, content) and every
//! target's suitability, and either records what the pin will hold and moves to Pinning or refuses.
//! Never emits an effect on an Application.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec,
    bundle_pin::{ApplicationPinState, PinnedApplication, PinnedObject, conditions, reasons},
};
use sluice_runtime::{conditions::Status, events::Notice};

use super::model::{
    AppView, BundleSummary, Decision, EventAction, MAX_OBJECTS, Observations, OtherPin, RETRY,
    Requeue, SHORT, Verification, allowed_kinds, condition, holds_application, policy_prunes,
};
use super::pinning::to_prune;
use crate::binding;

pub(super) fn verifying(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    let summary = match &obs.verification {
        None => {
            d.requeue = Requeue::After(SHORT);
            return;
        }
        Some(Verification::Refused { reason, message })
            if *reason == reasons::UNSIGNED
                && obs.created_at.is_some_and(|c| {
                    now.as_second() - c.as_second() < obs.signature_grace.as_secs() as i64
                }) =>
        {
            condition(
                d,
                conditions::VERIFIED,
                Status::Unknown,
                reasons::SIGNATURE_PENDING,
                format!(
                    "no signature found yet, retried for {} s after the pin's creation before it is refused: {message}",
                    obs.signature_grace.as_secs()
                ),
                gen_,
                now,
                EventAction::Verify,
            );
            d.requeue = Requeue::After(RETRY);
            return;
        }
        Some(Verification::Refused { reason, message }) => {
            d.status.phase = BundlePinPhase::Refused;
            condition(
                d,
                conditions::VERIFIED,
                Status::False,
                reason,
                format!("refused, nothing applied: {message}"),
                gen_,
                now,
                EventAction::Verify,
            );
            d.requeue = Requeue::AwaitChange;
            return;
        }
        Some(Verification::Unavailable { reason, message }) => {
            condition(
                d,
                conditions::VERIFIED,
                Status::Unknown,
                reason,
                format!("cannot verify yet, nothing applied: {message}"),
                gen_,
                now,
                EventAction::Verify,
            );
            d.requeue = Requeue::After(RETRY);
            return;
        }
        Some(Verification::Verified(s)) => s,
    };
    if summary.digest != spec.bundle.digest {
        d.status.phase = BundlePinPhase::Refused;
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reasons::TAMPERED,
            format!(
                "refused, nothing applied: verified digest {} is not spec.bundle.digest {}",
                summary.digest, spec.bundle.digest
            ),
            gen_,
            now,
            EventAction::Verify,
        );
        return;
    }
    if summary.objects.len() > MAX_OBJECTS {
        d.status.phase = BundlePinPhase::Refused;
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reasons::TOO_MANY_OBJECTS,
            format!(
                "refused, nothing applied: the bundle holds {} objects, more than the {MAX_OBJECTS} a pin records; split the Application's configuration",
                summary.objects.len()
            ),
            gen_,
            now,
            EventAction::Verify,
        );
        d.requeue = Requeue::AwaitChange;
        return;
    }
    // Every target must be pinnable before any is touched.
    let mut refusals: Vec<(&'static str, String)> = Vec::new();
    let mut apps = Vec::new();
    for o in &obs.applications {
        let mut app = PinnedApplication {
            name: o.name.clone(),
            namespace: o.namespace.clone(),
            ..PinnedApplication::default()
        };
        let who = format!("Application {}/{}", o.namespace, o.name);
        match &o.view {
            None => {
                let m = format!("{who} not found; create it or fix spec.targets");
                refusals.push((reasons::APPLICATION_NOT_FOUND, m.clone()));
                app.state = ApplicationPinState::Refused;
                app.message = Some(m);
            }
            Some(v) if !v.oci_sourced => {
                let m = format!(
                    "{who} is not OCI-sourced (repoURL must start with oci://); pins apply to OCI-sourced Applications only — revert Git-sourced ones in Git"
                );
                refusals.push((reasons::NOT_OCI_SOURCED, m.clone()));
                app.state = ApplicationPinState::Refused;
                app.message = Some(m);
            }
            Some(AppView {
                application_set: Some(set),
                ..
            }) if !set.covers_sync_policy => {
                let m = format!(
                    "{who} is generated by ApplicationSet {} whose spec.ignoreApplicationDifferences does not cover /spec/syncPolicy, so it would undo the suspension; add {{jsonPointers: [/spec/syncPolicy]}} there",
                    set.name
                );
                refusals.push((reasons::APPLICATION_SET_WOULD_REVERT, m.clone()));
                app.state = ApplicationPinState::Refused;
                app.message = Some(m);
            }
            Some(v) => {
                app.state = ApplicationPinState::Pending;
                app.original_sync_policy = v.sync_policy.clone();
                app.original_sync_policy_saved = true;
                app.from_digest = v.revision.clone();
                app.destination = v.destination.clone();
                app.destination_namespace = v.destination_namespace.clone();
                let holders: Vec<&OtherPin> = obs
                    .other_pins
                    .iter()
                    .filter(|p| {
                        p.targets
                            .iter()
                            .any(|k| k.namespace == o.namespace && k.name == o.name)
                    })
                    .collect();
                for holder in holders {
                    if spec.supersedes.as_deref() == Some(holder.name.as_str()) {
                        // An explicit hand-over: the policy before the first pin, not its
                        // suspension.
                        if let Some(held) = holder.applications.iter().find(|a| {
                            a.namespace == o.namespace && a.name == o.name && holds_application(a)
                        }) {
                            app.original_sync_policy = held.original_sync_policy.clone();
                            app.inherited_from = Some(holder.name.clone());
                        }
                        continue;
                    }
                    let m = format!(
                        "{who} is held by BundlePin {}/{}; release that pin first, or hand over from it with spec.supersedes: {}",
                        obs.pin.0, holder.name, holder.name
                    );
                    refusals.push((reasons::TARGET_ALREADY_PINNED, m.clone()));
                    app.state = ApplicationPinState::Refused;
                    app.message = Some(m);
                }
                for (reason, m) in binding_problems(spec, obs, summary, v, &who) {
                    refusals.push((reason, m.clone()));
                    app.state = ApplicationPinState::Refused;
                    app.message = Some(m);
                }
                if spec.allow_any_revision && !v.history.contains(&summary.digest) {
                    d.event(Notice::warning(reasons::ANY_REVISION_ALLOWED,
                        EventAction::Verify,
                        format!(
                            "{who}: pinning {}, a digest Argo CD never deployed for it (spec.allowAnyRevision)",
                            summary.digest
                        )));
                }
            }
        }
        apps.push(app);
    }
    d.status.applications = apps;
    if let Some((reason, _)) = refusals.first() {
        d.status.phase = BundlePinPhase::Refused;
        let message = refusals
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reason,
            format!("refused, nothing applied: {message}"),
            gen_,
            now,
            EventAction::Verify,
        );
        d.requeue = Requeue::AwaitChange;
        return;
    }
    let froms: Vec<&str> = d
        .status
        .applications
        .iter()
        .filter_map(|a| a.from_digest.as_deref())
        .collect();
    d.status.from_digest = match froms.first() {
        Some(f) if froms.len() == d.status.applications.len() && froms.iter().all(|x| x == f) => {
            Some((*f).to_owned())
        }
        _ => None,
    };
    d.status.objects = summary
        .objects
        .iter()
        .map(|o| PinnedObject {
            group: o.group.clone(),
            version: o.version.clone(),
            kind: o.kind.clone(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
        })
        .collect();
    d.status.to_digest = Some(summary.digest.clone());
    d.status.to_repository = Some(spec.bundle.repository.clone());
    d.status.content_digest = Some(summary.content_digest.clone());
    d.status.verified_at = Some(Time(now));
    d.status.phase = BundlePinPhase::Pinning;
    condition(
        d,
        conditions::VERIFIED,
        Status::True,
        reasons::SIGNATURE_VERIFIED,
        format!(
            "signature on {} verified with key {}; {} objects, all of allowed kinds",
            summary.digest,
            summary.key_fingerprint,
            summary.objects.len()
        ),
        gen_,
        now,
        EventAction::Verify,
    );
    // The original policies are now recorded; the next reconcile (from this status) touches
    // the Applications.
    d.requeue = Requeue::After(Duration::ZERO);
}

/// Why a verified bundle may not be pinned to this Application: not its repository, a
/// digest it never ran, several sources, namespaces it may not write, too large a prune.
pub(super) fn binding_problems(
    spec: &BundlePinSpec,
    obs: &Observations,
    summary: &BundleSummary,
    v: &AppView,
    who: &str,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if v.multi_source {
        out.push((
            reasons::NOT_SINGLE_SOURCE,
            format!("{who} has several sources; a pin replaces one bundle and would prune the others' objects — pin it per source or revert in Git"),
        ));
        return out;
    }
    let repo = v.repo_url.as_deref().unwrap_or_default();
    if binding::normalise_repository(repo) != binding::normalise_repository(&spec.bundle.repository)
    {
        out.push((
            reasons::REPOSITORY_MISMATCH,
            format!(
                "{who} syncs {repo}, not {}: a pin applies a bundle of the Application's own repository only",
                spec.bundle.repository
            ),
        ));
    }
    if !spec.allow_any_revision && !v.history.contains(&summary.digest) {
        out.push((
            reasons::REVISION_NOT_DEPLOYED,
            format!(
                "Argo CD never deployed {} for {who} (not in status.history); pin a revision it ran, or set spec.allowAnyRevision (audited)",
                summary.digest
            ),
        ));
    }
    let dest_ns = v.destination_namespace.clone().unwrap_or_default();
    let mut namespaces: Vec<String> = summary
        .objects
        .iter()
        .map(|o| {
            if o.namespace.is_empty() {
                dest_ns.clone()
            } else {
                o.namespace.clone()
            }
        })
        .collect();
    namespaces.sort();
    namespaces.dedup();
    for ns in namespaces {
        let known = ns == dest_ns || v.tracked.iter().any(|t| t.namespace == ns);
        let (name, server) = &v.destination_name_server;
        let permitted = v
            .project_destinations
            .as_ref()
            .is_none_or(|d| binding::destination_matched(d, name, server, &ns));
        if !known || !permitted {
            out.push((
                reasons::NAMESPACE_NOT_ALLOWED,
                format!(
                    "the bundle writes namespace {ns:?}, which {}",
                    if known {
                        format!("{who}'s AppProject does not permit")
                    } else {
                        format!("is neither {who}'s destination namespace nor one Argo CD tracks objects in for it")
                    }
                ),
            ));
        }
    }
    let allowed = allowed_kinds(spec, obs.platform_kinds.as_deref());
    let tracked = v
        .tracked
        .iter()
        .filter(|t| {
            allowed
                .iter()
                .any(|a| a.group == t.group && a.kind == t.kind)
        })
        .count();
    let prune = if policy_prunes(v.sync_policy.as_ref()) {
        to_prune(&allowed, summary, v, &dest_ns).len()
    } else {
        0
    };
    if spec.max_prune_percent < 100 && prune * 100 > spec.max_prune_percent as usize * tracked {
        out.push((
            reasons::PRUNE_TOO_LARGE,
            format!(
                "the pin would delete {prune} of the {tracked} objects Argo CD tracks for {who}, more than spec.maxPrunePercent ({}%): likely the wrong bundle; raise it if this is meant",
                spec.max_prune_percent
            ),
        ));
    }
    out
}
