use super::*;
use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde_json::Value;
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec, BundlePinStatus,
    bundle_pin::{ApplicationPinState, GitRevertStatus, GroupKind, reasons},
};
use sluice_runtime::{
    conditions as cond,
    events::{Notice, Severity},
};

use crate::binding;
use crate::record::{GitOutcome, record_git_outcome};
use serde_json::json;
use sluice_api::v1alpha1::bundle_pin::conditions;

const BAD: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const GOOD: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const FIX: &str = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
const GOOD_CONTENT: &str = "sha256:1111";
const BAD_CONTENT: &str = "sha256:2222";
const FIX_CONTENT: &str = "sha256:3333";

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec(patch: Value) -> BundlePinSpec {
    let mut base = json!({
        "targets": [{"name": "mesh-c1", "namespace": "argocd"}],
        "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": GOOD},
        "publicKeysSecretRef": {"name": "cosign"},
        "reason": "5xx after change 42",
        "gitRevert": {"commit": "abcdef1"},
    });
    for (k, v) in patch.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(base).unwrap()
}

fn key(kind: &str, name: &str) -> ObjectKey {
    ObjectKey {
        group: "gateway.networking.k8s.io".into(),
        kind: kind.into(),
        namespace: "shop".into(),
        name: name.into(),
        version: "v1".into(),
    }
}

fn summary() -> BundleSummary {
    BundleSummary {
        digest: GOOD.into(),
        content_digest: GOOD_CONTENT.into(),
        key_fingerprint: "SHA256:k".into(),
        objects: vec![key("HTTPRoute", "checkout")],
    }
}

fn original_policy() -> Value {
    json!({"automated": {"prune": true, "selfHeal": true, "future": 1}, "syncOptions": ["ServerSideApply=true"], "retry": {"limit": 2}})
}

/// A tiny Argo CD: one Application the effects act on.
#[derive(Clone, Debug)]
struct World {
    app: AppView,
    applied: u32,
    pruned: Vec<ObjectKey>,
    pushes: u32,
    dropped: u32,
    preflights: u32,
}

impl World {
    fn new() -> Self {
        World {
            app: AppView {
                oci_sourced: true,
                application_set: None,
                sync_policy: Some(original_policy()),
                automated: true,
                operation_phase: Some("Running".into()),
                operation_requested: true,
                sync_status: Some("Synced".into()),
                revision: Some(BAD.into()),
                revision_content: Some(BAD_CONTENT.into()),
                destination: Some("c1".into()),
                destination_namespace: Some("shop".into()),
                out_of_sync_only_by_pruning: false,
                tracked: vec![
                    key("HTTPRoute", "checkout"),
                    key("HTTPRoute", "added-by-bad-change"),
                    ObjectKey {
                        group: "apps".into(),
                        kind: "Deployment".into(),
                        ..key("Deployment", "checkout")
                    },
                ],
                repo_url: Some("oci://registry.local:5000/mesh/config".into()),
                multi_source: false,
                history: vec![GOOD.into(), BAD.into()],
                destination_name_server: ("c1".into(), String::new()),
                project_destinations: None,
            },
            applied: 0,
            pruned: vec![],
            pushes: 0,
            dropped: 0,
            preflights: 0,
        }
    }

    fn obs(&self, verification: Option<Verification>) -> Observations {
        Observations {
            generation: Some(1),
            pin: ("argocd".into(), "pin-1".into()),
            uid: PIN_UID.into(),
            verification,
            applications: vec![AppObservation {
                namespace: "argocd".into(),
                name: "mesh-c1".into(),
                view: Some(self.app.clone()),
            }],
            git_configured: true,
            other_pins: vec![],
            platform_kinds: None,
            created_at: None,
            created_by: Some("kubectl-client-side-apply".into()),
            signature_grace: SIGNATURE_GRACE,
            application_namespace: Some("argocd".into()),
        }
    }

    /// Carries out the effects; returns how many there were.
    fn act(&mut self, d: &Decision) -> usize {
        let mut n = 0;
        for a in &d.actions {
            match a {
                Action::TerminateSync { .. } => {
                    self.app.operation_phase = Some("Terminating".into())
                }
                Action::SetAutomation { enabled, .. } => {
                    if let Some(automated) = self
                        .app
                        .sync_policy
                        .as_mut()
                        .and_then(|p| p.get_mut("automated"))
                        .and_then(Value::as_object_mut)
                    {
                        match enabled {
                            Some(b) => {
                                automated.insert("enabled".into(), json!(b));
                            }
                            None => {
                                automated.remove("enabled");
                            }
                        }
                    }
                    self.app.automated = self
                        .app
                        .sync_policy
                        .as_ref()
                        .and_then(|p| p.get("automated"))
                        .is_some_and(|a| a.get("enabled") != Some(&json!(false)));
                }
                Action::ClearOperation { .. } => self.app.operation_requested = false,
                Action::Preflight { .. } => self.preflights += 1,
                Action::Apply { prune, .. } => {
                    self.applied += 1;
                    self.pruned.extend(prune.iter().cloned());
                    self.app.tracked.retain(|t| !prune.contains(t));
                }
                Action::DropOwnership { .. } => self.dropped += 1,
                Action::PushRevert { .. } => self.pushes += 1,
                Action::Event(_) | Action::Audit { .. } => continue,
            }
            n += 1;
        }
        n
    }

    /// Argo CD finishing the terminated sync.
    fn sync_ends(&mut self) {
        if self.app.operation_phase.as_deref() == Some("Terminating") {
            self.app.operation_phase = Some("Failed".into());
            self.app.operation_requested = false;
        }
    }
}

const PIN_UID: &str = "3F2A9C1E-77b0-4c1d-9e2f-0123456789ab";

/// The reconcile's bookkeeping of a pushed revert (what the I/O side records).
fn record_git(d: &mut Decision) {
    if d.actions
        .iter()
        .any(|a| matches!(a, Action::PushRevert { .. }))
    {
        record_git_outcome(
            &mut d.status,
            GitOutcome::Pushed(GitRevertStatus {
                branch: Some("sluice/revert/argocd/pin-1-3f2a9c1e".into()),
                commit: Some("f00".into()),
                ..Default::default()
            }),
            Some(1),
            t(0),
        );
    }
}

/// `Ready=False InvalidSpec`, its message containing `message`.
fn assert_invalid_spec(d: &Decision, message: &str) {
    let ready = cond::find(&d.status.conditions, conditions::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reasons::INVALID_SPEC)
    );
    assert!(ready.message.contains(message), "{}", ready.message);
}

fn verified() -> Option<Verification> {
    Some(Verification::Verified(summary()))
}

fn effects(d: &Decision) -> Vec<&Action> {
    d.actions.iter().filter(|a| a.is_effect()).collect()
}

fn reasons_of(d: &Decision) -> Vec<&'static str> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(Notice { reason, .. }) | Action::Audit { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

/// Runs the pin to Pinned; `crash_at` skips the status write after that many reconciles
/// (the operator died after its effects), so the next reconcile starts from the old status.
fn pin(spec: &BundlePinSpec, world: &mut World, crash_at: Option<usize>) -> BundlePinStatus {
    let mut status: Option<BundlePinStatus> = None;
    for i in 0..12 {
        let mut d = decide(spec, status.as_ref(), &world.obs(verified()), t(i as i64));
        world.act(&d);
        world.sync_ends();
        if crash_at == Some(i) {
            continue;
        }
        record_git(&mut d);
        status = Some(d.status.clone());
        if d.status.phase == BundlePinPhase::Pinned && d.status.git_revert.is_some() {
            return d.status;
        }
    }
    panic!("never pinned: {status:#?}");
}

#[test]
fn verification_outcomes_before_anything_is_touched() {
    struct Row {
        name: &'static str,
        verification: Option<Verification>,
        app: Option<AppView>,
        want_phase: BundlePinPhase,
        want_reason: &'static str,
        want_requeue: Requeue,
    }
    let ok = World::new().app;
    let refused = |reason| {
        Some(Verification::Refused {
            reason,
            message: "because".into(),
        })
    };
    let table = vec![
        Row {
            name: "unsigned",
            verification: refused(reasons::UNSIGNED),
            app: Some(ok.clone()),
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::UNSIGNED,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "wrong key",
            verification: refused(reasons::WRONG_KEY),
            app: Some(ok.clone()),
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::WRONG_KEY,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "tampered",
            verification: refused(reasons::TAMPERED),
            app: Some(ok.clone()),
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::TAMPERED,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "disallowed kind",
            verification: refused(reasons::DISALLOWED_KIND),
            app: Some(ok.clone()),
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::DISALLOWED_KIND,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "registry down",
            verification: Some(Verification::Unavailable {
                reason: reasons::BUNDLE_UNAVAILABLE,
                message: "down".into(),
            }),
            app: Some(ok.clone()),
            want_phase: BundlePinPhase::Verifying,
            want_reason: reasons::BUNDLE_UNAVAILABLE,
            want_requeue: Requeue::After(RETRY),
        },
        Row {
            name: "git-sourced",
            verification: verified(),
            app: Some(AppView {
                oci_sourced: false,
                ..ok.clone()
            }),
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::NOT_OCI_SOURCED,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "not found",
            verification: verified(),
            app: None,
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::APPLICATION_NOT_FOUND,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "ApplicationSet would revert",
            verification: verified(),
            app: Some(AppView {
                application_set: Some(OwningApplicationSet {
                    name: "mesh".into(),
                    covers_sync_policy: false,
                }),
                ..ok.clone()
            }),
            want_phase: BundlePinPhase::Refused,
            want_reason: reasons::APPLICATION_SET_WOULD_REVERT,
            want_requeue: Requeue::AwaitChange,
        },
        Row {
            name: "ApplicationSet ignores syncPolicy",
            verification: verified(),
            app: Some(AppView {
                application_set: Some(OwningApplicationSet {
                    name: "mesh".into(),
                    covers_sync_policy: true,
                }),
                ..ok.clone()
            }),
            want_phase: BundlePinPhase::Pinning,
            want_reason: reasons::SIGNATURE_VERIFIED,
            want_requeue: Requeue::After(Duration::ZERO),
        },
        Row {
            name: "verified",
            verification: verified(),
            app: Some(ok.clone()),
            want_phase: BundlePinPhase::Pinning,
            want_reason: reasons::SIGNATURE_VERIFIED,
            want_requeue: Requeue::After(Duration::ZERO),
        },
    ];
    for row in table {
        let mut obs = World::new().obs(row.verification);
        obs.applications[0].view = row.app;
        let d = decide(&spec(json!({})), None, &obs, t(0));
        assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
        assert!(
            effects(&d).is_empty(),
            "{}: nothing touched while verifying",
            row.name
        );
        let verified_cond = cond::find(&d.status.conditions, conditions::VERIFIED)
            .unwrap_or_else(|| panic!("{}: no Verified condition", row.name));
        assert_eq!(verified_cond.reason, row.want_reason, "{}", row.name);
        assert!(
            reasons_of(&d).contains(&row.want_reason),
            "{}: an Event names the cause",
            row.name
        );
        assert_eq!(d.requeue, row.want_requeue, "{}", row.name);
        if row.want_phase == BundlePinPhase::Pinning {
            let app = &d.status.applications[0];
            assert!(app.original_sync_policy_saved, "{}", row.name);
            assert_eq!(
                app.original_sync_policy,
                Some(original_policy()),
                "{}",
                row.name
            );
            assert_eq!(app.from_digest.as_deref(), Some(BAD), "{}", row.name);
            assert_eq!(d.status.to_digest.as_deref(), Some(GOOD), "{}", row.name);
            assert_eq!(
                d.status.content_digest.as_deref(),
                Some(GOOD_CONTENT),
                "{}",
                row.name
            );
        }
    }
}

#[test]
fn a_pin_terminates_suspends_applies_prunes_and_pushes_git_once() {
    let spec = spec(json!({}));
    let mut world = World::new();
    let status = pin(&spec, &mut world, None);
    // Terminated the running sync, suspended automation keeping every other setting.
    assert!(status.applications[0].sync_terminated);
    assert!(!world.app.automated);
    let mut want = original_policy();
    want["automated"]["enabled"] = json!(false);
    assert_eq!(world.app.sync_policy, Some(want));
    assert!(
        !world.app.operation_requested,
        "the terminated sync is gone"
    );
    // Applied once, pruned the allowed object the bundle lacks, never the Deployment.
    assert_eq!(world.applied, 1);
    assert_eq!(world.pruned, vec![key("HTTPRoute", "added-by-bad-change")]);
    assert_eq!(status.applied_objects, 1);
    assert_eq!(status.pruned_objects, 1);
    assert_eq!(world.pushes, 1);
    assert_eq!(status.from_digest.as_deref(), Some(BAD));
    assert_eq!(status.to_digest.as_deref(), Some(GOOD));
    assert!(status.pinned_at.is_some());
    // While pinned and Argo CD still at the bad revision: nothing more happens.
    let d = decide(&spec, Some(&status), &world.obs(verified()), t(100));
    assert!(effects(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.phase, BundlePinPhase::Pinned);
    assert_eq!(d.requeue, Requeue::After(POLL));
}

#[test]
fn restart_at_every_point_finishes_the_same_pin_without_a_second_push() {
    let spec = spec(json!({}));
    let mut clean_world = World::new();
    let clean = pin(&spec, &mut clean_world, None);
    for crash_at in 0..6 {
        let mut world = World::new();
        let status = pin(&spec, &mut world, Some(crash_at));
        let a = &status.applications[0];
        assert_eq!(
            a.original_sync_policy,
            Some(original_policy()),
            "crash after reconcile {crash_at}: the original policy survives"
        );
        assert_eq!(status.phase, BundlePinPhase::Pinned, "crash {crash_at}");
        assert_eq!(world.pruned, clean_world.pruned, "crash {crash_at}");
        assert_eq!(
            world.app.sync_policy, clean_world.app.sync_policy,
            "crash {crash_at}"
        );
        assert_eq!(
            status.applied_objects, clean.applied_objects,
            "crash {crash_at}"
        );
        // The git client is asked again only if the status never recorded the push; it
        // then reports the existing branch (see sluice-gitops), so the branch exists once.
        assert!(world.pushes <= 2, "crash {crash_at}: {}", world.pushes);
        // From the recorded status nothing is ever asked twice.
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(200));
        assert!(effects(&d).is_empty(), "crash {crash_at}: {:?}", d.actions);
    }
}

#[test]
fn release_on_matching_content_restores_the_policy_exactly() {
    let spec = spec(json!({}));
    let mut world = World::new();
    let status = pin(&spec, &mut world, None);
    struct Row {
        name: &'static str,
        sync_status: &'static str,
        revision: &'static str,
        content: &'static str,
        want_phase: BundlePinPhase,
        want_reason: Option<&'static str>,
    }
    let table = [
        Row {
            name: "still the bad revision, OutOfSync",
            sync_status: "OutOfSync",
            revision: BAD,
            content: BAD_CONTENT,
            want_phase: BundlePinPhase::Pinned,
            want_reason: None,
        },
        Row {
            name: "forward fix, OutOfSync",
            sync_status: "OutOfSync",
            revision: FIX,
            content: FIX_CONTENT,
            want_phase: BundlePinPhase::Pinned,
            want_reason: Some(reasons::FORWARD_FIX_WAITING),
        },
        Row {
            name: "pinned content, but OutOfSync",
            sync_status: "OutOfSync",
            revision: FIX,
            content: GOOD_CONTENT,
            want_phase: BundlePinPhase::Pinned,
            want_reason: None,
        },
        Row {
            name: "Synced at equal content (new digest)",
            sync_status: "Synced",
            revision: FIX,
            content: GOOD_CONTENT,
            want_phase: BundlePinPhase::Released,
            want_reason: Some(reasons::CONTENT_MATCHED),
        },
    ];
    for row in table {
        let mut w = world.clone();
        w.app.sync_status = Some(row.sync_status.into());
        w.app.revision = Some(row.revision.into());
        w.app.revision_content = Some(row.content.into());
        let d = decide(&spec, Some(&status), &w.obs(verified()), t(300));
        assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
        if let Some(reason) = row.want_reason {
            assert!(
                reasons_of(&d).contains(&reason),
                "{}: {:?}",
                row.name,
                d.actions
            );
        }
        if row.want_phase == BundlePinPhase::Released {
            w.act(&d);
            assert_eq!(
                w.app.sync_policy,
                Some(original_policy()),
                "{}: restored exactly",
                row.name
            );
            assert!(w.app.automated, "{}", row.name);
            assert_eq!(
                w.dropped, 1,
                "{}: revert's field ownership dropped",
                row.name
            );
            assert_eq!(
                d.status.applications[0].state,
                ApplicationPinState::Released
            );
            assert_eq!(d.requeue, Requeue::AwaitChange);
        } else {
            assert!(effects(&d).is_empty(), "{}: {:?}", row.name, d.actions);
        }
    }
}

#[test]
fn an_application_whose_policy_does_not_prune_keeps_what_the_bundle_lacks_and_releases() {
    let spec = spec(json!({}));
    for (name, prunes) in [("prune: true", true), ("prune: false", false)] {
        let mut world = World::new();
        world.app.sync_policy = Some(json!({"automated": {"prune": prunes, "selfHeal": true}}));
        let status = pin(&spec, &mut world, None);
        if prunes {
            assert_eq!(
                world.pruned,
                vec![key("HTTPRoute", "added-by-bad-change")],
                "{name}"
            );
            assert_eq!(status.pruned_objects, 1, "{name}");
            continue;
        }
        // As Argo CD's sync under that policy: nothing deleted, and said so.
        assert!(world.pruned.is_empty(), "{name}: {:?}", world.pruned);
        assert_eq!(status.pruned_objects, 0, "{name}");
        assert_eq!(
            status.applications[0].message.as_deref(),
            Some(
                "kept 1 object(s) the bundle lacks: the Application's sync policy does not prune (automated.prune is not true), as Argo CD's sync would keep them"
            ),
            "{name}"
        );
        // Git reverted: Argo CD targets the pinned content and reports OutOfSync only by
        // the object that needs pruning, which its own auto-sync would skip too.
        let mut w = world.clone();
        w.app.revision = Some(FIX.into());
        w.app.revision_content = Some(GOOD_CONTENT.into());
        w.app.sync_status = Some("OutOfSync".into());
        w.app.out_of_sync_only_by_pruning = true;
        let d = decide(&spec, Some(&status), &w.obs(verified()), t(300));
        assert_eq!(d.status.phase, BundlePinPhase::Released, "{name}");
        // Something else OutOfSync: still pinned.
        w.app.out_of_sync_only_by_pruning = false;
        let d = decide(&spec, Some(&status), &w.obs(verified()), t(300));
        assert_eq!(d.status.phase, BundlePinPhase::Pinned, "{name}");
    }
    // A policy that prunes releases only on Synced (Argo CD would prune, then report it).
    let mut world = World::new();
    let status = pin(&spec, &mut world, None);
    world.app.revision = Some(FIX.into());
    world.app.revision_content = Some(GOOD_CONTENT.into());
    world.app.sync_status = Some("OutOfSync".into());
    world.app.out_of_sync_only_by_pruning = true;
    let d = decide(&spec, Some(&status), &world.obs(verified()), t(300));
    assert_eq!(d.status.phase, BundlePinPhase::Pinned);
}

#[test]
fn a_spec_changed_after_verification_applies_nothing_new_and_is_reported() {
    struct Row {
        name: &'static str,
        /// Reconciles run from a fresh status before the change (1: Pinning, None: Pinned).
        reconciles: Option<usize>,
        change: Value,
        want_reason: &'static str,
    }
    let two_targets = json!({"targets": [
        {"name": "mesh-c1", "namespace": "argocd"},
        {"name": "mesh-c2", "namespace": "argocd"}
    ]});
    let table = [
        Row {
            name: "digest changed while pinning",
            reconciles: Some(1),
            change: json!({"bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": FIX}}),
            want_reason: reasons::BUNDLE_CHANGED,
        },
        Row {
            name: "repository changed while pinning",
            reconciles: Some(1),
            change: json!({"bundle": {"repository": "oci://registry.local:5000/mesh/other", "digest": GOOD}}),
            want_reason: reasons::BUNDLE_CHANGED,
        },
        Row {
            name: "target added while pinning",
            reconciles: Some(1),
            change: two_targets.clone(),
            want_reason: reasons::TARGETS_CHANGED,
        },
        Row {
            name: "digest changed while pinned",
            reconciles: None,
            change: json!({"bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": FIX}}),
            want_reason: reasons::BUNDLE_CHANGED,
        },
        Row {
            name: "target replaced while pinned",
            reconciles: None,
            change: json!({"targets": [{"name": "mesh-c2", "namespace": "argocd"}]}),
            want_reason: reasons::TARGETS_CHANGED,
        },
        Row {
            name: "target added while pinned",
            reconciles: None,
            change: two_targets.clone(),
            want_reason: reasons::TARGETS_CHANGED,
        },
    ];
    let original = spec(json!({}));
    for row in table {
        let mut world = World::new();
        let status = match row.reconciles {
            Some(n) => {
                let mut status = None;
                for i in 0..n {
                    let d = decide(
                        &original,
                        status.as_ref(),
                        &world.obs(verified()),
                        t(i as i64),
                    );
                    world.act(&d);
                    status = Some(d.status);
                }
                status.unwrap()
            }
            None => pin(&original, &mut world, None),
        };
        let phase = status.phase;
        let changed = spec(row.change.clone());
        // The reconcile verifies and observes what the status recorded, not the new spec.
        assert_eq!(
            bundle_to_verify(&changed, Some(&status)),
            original.bundle,
            "{}",
            row.name
        );
        assert_eq!(
            targets_to_observe(&changed, Some(&status), "argocd"),
            vec![AppKey {
                namespace: "argocd".into(),
                name: "mesh-c1".into()
            }],
            "{}",
            row.name
        );
        let d = decide(&changed, Some(&status), &world.obs(verified()), t(50));
        assert!(effects(&d).is_empty(), "{}: {:?}", row.name, d.actions);
        assert_eq!(d.status.phase, phase, "{}", row.name);
        assert_eq!(d.status.to_digest.as_deref(), Some(GOOD), "{}", row.name);
        let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", row.want_reason),
            "{}",
            row.name
        );
        assert!(
            c.message.contains("create a new BundlePin"),
            "{}: {}",
            row.name,
            c.message
        );
        assert!(
                d.actions.iter().any(|a| matches!(a, Action::Event(Notice { severity: Severity::Warning, reason, .. }) if *reason == row.want_reason)),
                "{}: a Warning Event names it",
                row.name
            );
        // Asked again: the same status, no second Event.
        let again = decide(&changed, Some(&d.status), &world.obs(verified()), t(51));
        assert_eq!(again.status, d.status, "{}", row.name);
        assert!(reasons_of(&again).is_empty(), "{}", row.name);

        // Restored: the pin goes on from where it was, Verified again.
        let back = decide(&original, Some(&d.status), &world.obs(verified()), t(52));
        let c = cond::find(&back.status.conditions, conditions::VERIFIED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::SIGNATURE_VERIFIED),
            "{}",
            row.name
        );
        if phase == BundlePinPhase::Pinning {
            assert!(!effects(&back).is_empty(), "{}: pinning resumes", row.name);
        }

        // Released while changed: the verified pin is undone exactly.
        let mut release = row.change.clone();
        release["release"] = json!(true);
        release["releaseReason"] = json!("pinned the wrong bundle");
        let r = decide(
            &spec(release),
            Some(&d.status),
            &world.obs(verified()),
            t(53),
        );
        assert_eq!(r.status.phase, BundlePinPhase::Released, "{}", row.name);
        world.act(&r);
        assert_eq!(
            world.app.sync_policy,
            Some(original_policy()),
            "{}",
            row.name
        );
    }
}

#[test]
fn explicit_policy_and_explicit_release() {
    let spec_explicit = spec(json!({"releasePolicy": "Explicit"}));
    let mut world = World::new();
    let status = pin(&spec_explicit, &mut world, None);
    world.app.revision = Some(FIX.into());
    world.app.revision_content = Some(GOOD_CONTENT.into());
    let d = decide(
        &spec_explicit,
        Some(&status),
        &world.obs(verified()),
        t(300),
    );
    assert_eq!(
        d.status.phase,
        BundlePinPhase::Pinned,
        "matching content does not release an Explicit pin"
    );
    let released = spec(
        json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "forward fix 43 verified"}),
    );
    let d = decide(&released, Some(&status), &world.obs(verified()), t(301));
    assert_eq!(d.status.phase, BundlePinPhase::Released);
    assert!(reasons_of(&d).contains(&reasons::RELEASED_EXPLICITLY));
    world.act(&d);
    assert_eq!(world.app.sync_policy, Some(original_policy()));
    // A release asked for before anything was touched releases with no effect.
    let d = decide(&released, None, &world.obs(None), t(0));
    assert_eq!(d.status.phase, BundlePinPhase::Released);
    assert!(effects(&d).is_empty());
}

#[test]
fn a_failed_pin_gives_suspended_applications_back_on_release() {
    let pin_spec = spec(json!({}));
    let mut world = World::new();
    // Pin until the Application's automation is suspended, not yet applied.
    let mut status: Option<BundlePinStatus> = None;
    for i in 0..6 {
        let d = decide(&pin_spec, status.as_ref(), &world.obs(verified()), t(i));
        world.act(&d);
        status = Some(d.status);
        if !world.app.automated {
            break;
        }
    }
    assert!(!world.app.automated, "suspended before the failure");
    // The registry now serves something else under the signed digest: the pin fails.
    let refused = Some(Verification::Refused {
        reason: reasons::TAMPERED,
        message: "no signature verifies with the configured keys".into(),
    });
    let failed = decide(
        &pin_spec,
        status.as_ref(),
        &world.obs(refused.clone()),
        t(10),
    );
    assert_eq!(failed.status.phase, BundlePinPhase::Failed);
    assert!(
        !is_over(Some(&failed.status)),
        "a failed pin holding a suspended Application is not over"
    );
    let idle = decide(
        &pin_spec,
        Some(&failed.status),
        &world.obs(refused.clone()),
        t(11),
    );
    assert!(effects(&idle).is_empty(), "nothing happens until a release");
    // A release (explicit, or by deletion) restores the policy even though the bundle no
    // longer verifies; ownership is kept (no object list to drop it from).
    let released = spec(json!({"release": true, "releaseReason": "registry repaired"}));
    let d = decide(&released, Some(&failed.status), &world.obs(refused), t(12));
    assert_eq!(d.status.phase, BundlePinPhase::Released);
    assert!(reasons_of(&d).contains(&reasons::RELEASED_EXPLICITLY));
    world.act(&d);
    assert_eq!(world.app.sync_policy, Some(original_policy()));
    assert!(world.app.automated);
    assert_eq!(world.dropped, 0);
    assert!(is_over(Some(&d.status)));
    // A Failed pin that never touched an Application is over.
    let mut untouched = failed.status.clone();
    untouched.applications.iter_mut().for_each(|a| {
        a.state = ApplicationPinState::Failed;
        a.original_sync_policy_saved = false;
    });
    assert!(is_over(Some(&untouched)));
}

#[test]
fn a_pin_is_tied_to_its_application() {
    type Edit = fn(&mut AppView, &mut Value);
    let rows: [(&str, Edit, Option<&str>); 9] = [
        ("its own repository, a revision it ran", |_, _| {}, None),
        (
            "another repository's signed bundle (a typo in --bundle)",
            |v, _| v.repo_url = Some("oci://registry.local:5000/security/policies".into()),
            Some(reasons::REPOSITORY_MISMATCH),
        ),
        (
            "a digest Argo CD never deployed for it",
            |v, _| v.history = vec![BAD.into()],
            Some(reasons::REVISION_NOT_DEPLOYED),
        ),
        (
            "allowAnyRevision, audited",
            |v, spec| {
                v.history = vec![BAD.into()];
                spec["allowAnyRevision"] = json!(true);
            },
            None,
        ),
        (
            "several sources",
            |v, _| v.multi_source = true,
            Some(reasons::NOT_SINGLE_SOURCE),
        ),
        (
            "a namespace the Application neither targets nor tracks",
            |v, _| {
                v.destination_namespace = Some("payments".into());
                v.tracked.retain(|t| t.kind == "Deployment");
                v.tracked
                    .iter_mut()
                    .for_each(|t| t.namespace = "payments".into());
            },
            Some(reasons::NAMESPACE_NOT_ALLOWED),
        ),
        (
            "a namespace its AppProject does not permit",
            |v, _| {
                v.project_destinations = Some(vec![binding::ProjectDestination {
                    server: String::new(),
                    name: "c1".into(),
                    namespace: "payments".into(),
                }])
            },
            Some(reasons::NAMESPACE_NOT_ALLOWED),
        ),
        (
            "a prune of most of what it tracks",
            |v, _| {
                v.tracked
                    .extend(["a", "b", "c"].map(|n| key("HTTPRoute", &format!("extra-{n}"))))
            },
            Some(reasons::PRUNE_TOO_LARGE),
        ),
        (
            "the same prune, allowed",
            |v, spec| {
                v.tracked
                    .extend(["a", "b", "c"].map(|n| key("HTTPRoute", &format!("extra-{n}"))));
                spec["maxPrunePercent"] = json!(100);
            },
            None,
        ),
    ];
    for (name, edit, refused) in rows {
        let mut world = World::new();
        let mut spec_json = json!({});
        edit(&mut world.app, &mut spec_json);
        let d = decide(&spec(spec_json.clone()), None, &world.obs(verified()), t(0));
        assert!(effects(&d).is_empty(), "{name}: nothing touched");
        match refused {
            Some(reason) => {
                assert_eq!(d.status.phase, BundlePinPhase::Refused, "{name}");
                let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
                assert_eq!(c.reason, reason, "{name}: {}", c.message);
            }
            None => assert_eq!(d.status.phase, BundlePinPhase::Pinning, "{name}"),
        }
        if spec_json.get("allowAnyRevision").is_some() {
            assert!(
                reasons_of(&d).contains(&reasons::ANY_REVISION_ALLOWED),
                "{name}"
            );
        }
    }
}

#[test]
fn the_platform_kinds_bound_what_a_pin_prunes() {
    let platform = vec![GroupKind {
        group: "networking.istio.io".into(),
        kind: "VirtualService".into(),
    }];
    let kinds = allowed_kinds(&spec(json!({})), Some(&platform));
    assert_eq!(
        kinds, platform,
        "the default list narrowed to the platform's"
    );
    let world = World::new();
    assert!(to_prune(&kinds, &summary(), &world.app, "shop").is_empty());
}

#[test]
fn the_status_keeps_who_pinned_what_from_where_to_where_and_how_it_ended() {
    let pin_spec = spec(json!({"releasePolicy": "Explicit"}));
    let mut world = World::new();
    let pinned = pin(&pin_spec, &mut world, None);
    let released = spec(
        json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "fixed forward"}),
    );
    let d = decide(&released, Some(&pinned), &world.obs(None), t(500));
    let h = &d.status.history;
    let phases: Vec<BundlePinPhase> = h.iter().map(|e| e.phase).collect();
    assert_eq!(
        phases,
        vec![
            BundlePinPhase::Pinning,
            BundlePinPhase::Pinned,
            BundlePinPhase::Released
        ]
    );
    let reasons: Vec<&str> = h.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        vec![
            reasons::SIGNATURE_VERIFIED,
            reasons::ALL_PINNED,
            reasons::RELEASED_EXPLICITLY
        ]
    );
    for e in h {
        assert_eq!(e.from_digest.as_deref(), Some(BAD));
        assert_eq!(e.to_digest.as_deref(), Some(GOOD));
        assert_eq!(e.created_by.as_deref(), Some("kubectl-client-side-apply"));
    }
    assert!(h[2].message.as_deref().unwrap().contains("fixed forward"));
    // Bounded: the oldest go first.
    let mut d = Decision {
        actions: vec![],
        status: d.status.clone(),
        requeue: Requeue::AwaitChange,
    };
    for i in 0..40 {
        record(&mut d, t(1000 + i));
    }
    assert_eq!(d.status.history.len(), MAX_HISTORY);
    assert_eq!(d.status.history.last().unwrap().at, Time(t(1039)));
}

#[test]
fn a_missing_signature_just_after_creation_is_retried_then_refused() {
    let unsigned = Some(Verification::Refused {
        reason: reasons::UNSIGNED,
        message: "no signature for the digest (404)".into(),
    });
    let world = World::new();
    let mut obs = world.obs(unsigned);
    obs.created_at = Some(t(0));
    let d = decide(&spec(json!({})), None, &obs, t(30));
    assert_eq!(d.status.phase, BundlePinPhase::Verifying);
    let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", reasons::SIGNATURE_PENDING)
    );
    assert_eq!(d.requeue, Requeue::After(RETRY));
    let d = decide(&spec(json!({})), Some(&d.status), &obs, t(121));
    assert_eq!(d.status.phase, BundlePinPhase::Refused);
    assert_eq!(
        cond::find(&d.status.conditions, conditions::VERIFIED)
            .unwrap()
            .reason,
        reasons::UNSIGNED
    );
}

/// Runs the pin until automation is suspended (not yet applied); returns the status.
fn until_suspended(spec: &BundlePinSpec, world: &mut World) -> BundlePinStatus {
    let mut status: Option<BundlePinStatus> = None;
    for i in 0..8 {
        let d = decide(spec, status.as_ref(), &world.obs(verified()), t(i));
        world.act(&d);
        world.sync_ends();
        status = Some(d.status);
        if !world.app.automated {
            return status.unwrap();
        }
    }
    panic!("never suspended: {status:#?}");
}

#[test]
fn nothing_is_suspended_before_the_preflight_passed() {
    let spec = spec(json!({}));
    let mut world = World::new();
    let mut status: Option<BundlePinStatus> = None;
    for i in 0..8 {
        let d = decide(&spec, status.as_ref(), &world.obs(verified()), t(i));
        if d.actions.iter().any(|a| {
            matches!(
                a,
                Action::SetAutomation { .. } | Action::TerminateSync { .. } | Action::Apply { .. }
            )
        }) {
            assert_eq!(world.preflights, 1, "preflight first: {:?}", d.actions);
            return;
        }
        // The preflight fails (identity missing, 403, kind not served): its status is never
        // written, so the next reconcile asks for it again and suspends nothing.
        if d.actions
            .iter()
            .any(|a| matches!(a, Action::Preflight { .. }))
            && i < 4
        {
            continue;
        }
        world.act(&d);
        status = Some(d.status);
    }
    panic!("never got past the preflight");
}

#[test]
fn a_pin_that_cannot_apply_within_its_deadline_gives_automation_back() {
    let spec = spec(json!({"pinDeadlineSeconds": 60}));
    let mut world = World::new();
    let suspended = until_suspended(&spec, &mut world);
    // Every apply fails (403, CRD gone, conflict): the status stays where it was.
    let before = decide(&spec, Some(&suspended), &world.obs(verified()), t(30));
    assert!(
        before
            .actions
            .iter()
            .any(|a| matches!(a, Action::Apply { .. }))
    );
    assert!(
        matches!(before.requeue, Requeue::After(d) if d <= Duration::from_secs(60)),
        "looks again before the deadline: {:?}",
        before.requeue
    );
    let d = decide(&spec, Some(&suspended), &world.obs(verified()), t(61));
    assert_eq!(d.status.phase, BundlePinPhase::Failed);
    let c = cond::find(&d.status.conditions, conditions::PINNED).unwrap();
    assert_eq!(c.reason, reasons::DEADLINE_EXCEEDED);
    assert!(c.message.contains("60 s"), "{}", c.message);
    assert!(
        !d.actions.iter().any(|a| matches!(a, Action::Apply { .. })),
        "{:?}",
        d.actions
    );
    world.act(&d);
    assert_eq!(world.app.sync_policy, Some(original_policy()));
    assert!(world.app.automated);
    assert!(
        is_over(Some(&d.status)),
        "holds nothing: the finalizer goes"
    );
}

#[test]
fn one_apply_may_take_only_the_time_left_before_the_deadline() {
    let spec = spec(json!({"pinDeadlineSeconds": 60}));
    let mut world = World::new();
    let suspended = until_suspended(&spec, &mut world);
    let verified = suspended.verified_at.as_ref().unwrap().0.as_second();
    let at = |s: i64| Timestamp::from_second(verified + s).unwrap();
    assert_eq!(
        apply_budget(&spec, &suspended, at(20)),
        Duration::from_secs(40)
    );
    assert_eq!(
        apply_budget(&spec, &suspended, at(75)),
        Duration::from_secs(1),
        "past the deadline an apply still gets a second, never zero"
    );
    let long = spec_with_deadline(3600);
    assert_eq!(apply_budget(&long, &suspended, at(0)), MAX_APPLY);
    assert_eq!(
        apply_budget(&spec, &BundlePinStatus::default(), at(0)),
        MAX_APPLY,
        "not verified: bounded by MAX_APPLY alone"
    );
}

fn spec_with_deadline(seconds: u32) -> BundlePinSpec {
    spec(json!({ "pinDeadlineSeconds": seconds }))
}

#[test]
fn release_needs_neither_the_registry_nor_the_key() {
    let pin_spec = spec(json!({"releasePolicy": "Explicit"}));
    let mut world = World::new();
    let pinned = pin(&pin_spec, &mut world, None);
    assert_eq!(pinned.objects.len(), 1, "the objects are recorded");
    // The key was rotated out and the digest garbage-collected: nothing verifies.
    let released = spec(
        json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "incident over"}),
    );
    for verification in [
        None,
        Some(Verification::Refused {
            reason: reasons::WRONG_KEY,
            message: "rotated".into(),
        }),
        Some(Verification::Unavailable {
            reason: reasons::BUNDLE_UNAVAILABLE,
            message: "manifest unknown".into(),
        }),
    ] {
        let mut w = world.clone();
        let d = decide(&released, Some(&pinned), &w.obs(verification), t(200));
        assert_eq!(d.status.phase, BundlePinPhase::Released);
        w.act(&d);
        assert_eq!(w.app.sync_policy, Some(original_policy()));
        assert_eq!(w.dropped, 1, "ownership dropped from the recorded objects");
        let first = effects(&d)[0];
        assert!(
            matches!(first, Action::SetAutomation { .. }),
            "automation first: {first:?}"
        );
    }
}

#[test]
fn release_turns_automation_back_on_and_keeps_what_changed_meanwhile() {
    let pin_spec = spec(json!({"releasePolicy": "Explicit"}));
    for (name, original) in [
        ("enabled absent", original_policy()),
        (
            "enabled true",
            json!({"automated": {"enabled": true, "prune": false}}),
        ),
    ] {
        let mut world = World::new();
        world.app.sync_policy = Some(original.clone());
        let pinned = pin(&pin_spec, &mut world, None);
        // While pinned someone adds a sync option.
        world.app.sync_policy.as_mut().unwrap()["syncOptions"] = json!(["Validate=false"]);
        let released =
            spec(json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "done"}));
        let d = decide(&released, Some(&pinned), &world.obs(None), t(300));
        world.act(&d);
        let mut want = original.clone();
        want["syncOptions"] = json!(["Validate=false"]);
        assert_eq!(world.app.sync_policy, Some(want), "{name}");
    }
}

fn holder(name: &str, status: &BundlePinStatus, supersedes: Option<&str>) -> OtherPin {
    OtherPin {
        name: name.into(),
        supersedes: supersedes.map(str::to_owned),
        targets: vec![AppKey {
            namespace: "argocd".into(),
            name: "mesh-c1".into(),
        }],
        applications: status.applications.clone(),
        verified: status.to_digest.is_some(),
    }
}

#[test]
fn a_second_pin_on_an_application_is_refused_unless_it_supersedes_the_first() {
    // The first pin (a wave-gate halt) suspended the Application.
    let first_spec = spec(json!({}));
    let mut world = World::new();
    let first = pin(&first_spec, &mut world, None);
    assert!(!world.app.automated);

    // A second pin (the on-call's) on the same Application: refused, naming the first.
    let mut obs = world.obs(verified());
    obs.pin.1 = "pin-2".into();
    obs.other_pins = vec![holder("pin-1", &first, None)];
    let d = decide(&spec(json!({})), None, &obs, t(100));
    assert_eq!(d.status.phase, BundlePinPhase::Refused);
    let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
    assert_eq!(c.reason, reasons::TARGET_ALREADY_PINNED);
    assert!(
        c.message.contains("pin-1") && c.message.contains("supersedes"),
        "{}",
        c.message
    );
    assert!(effects(&d).is_empty());

    // Saying it supersedes the first: it inherits the policy before the first pin.
    let second_spec = spec(json!({"supersedes": "pin-1"}));
    let d = decide(&second_spec, None, &obs, t(101));
    assert_eq!(d.status.phase, BundlePinPhase::Pinning);
    let app = &d.status.applications[0];
    assert_eq!(app.original_sync_policy, Some(original_policy()));
    assert_eq!(app.inherited_from.as_deref(), Some("pin-1"));

    // The first pin then lets go without restoring anything.
    let mut first_obs = world.obs(None);
    first_obs.other_pins = vec![holder("pin-2", &d.status, Some("pin-1"))];
    let handed = decide(&first_spec, Some(&first), &first_obs, t(102));
    assert_eq!(handed.status.phase, BundlePinPhase::Released);
    assert!(effects(&handed).is_empty(), "{:?}", handed.actions);
    assert_eq!(
        cond::find(&handed.status.conditions, conditions::RELEASED)
            .unwrap()
            .reason,
        reasons::SUPERSEDED
    );
    assert!(
        !world.app.automated,
        "still suspended: the second pin holds it"
    );

    // The second pin, released, gives back the original automation.
    let mut second = d.status.clone();
    for a in &mut second.applications {
        a.state = ApplicationPinState::Pinned;
    }
    second.phase = BundlePinPhase::Pinned;
    let released = spec(json!({"supersedes": "pin-1", "release": true, "releaseReason": "done"}));
    let mut obs2 = world.obs(None);
    obs2.pin.1 = "pin-2".into();
    let d = decide(&released, Some(&second), &obs2, t(200));
    world.act(&d);
    assert!(world.app.automated, "automation back after both pins");
    assert_eq!(world.app.sync_policy, Some(original_policy()));
}

#[test]
fn a_write_war_over_the_suspension_backs_off_then_stops_and_says_so() {
    let spec = spec(json!({"releasePolicy": "Explicit"}));
    let mut world = World::new();
    let mut status = pin(&spec, &mut world, None);
    let mut resuspended_at = Vec::new();
    // Something turns automation back on at once, every time, for 3 minutes.
    for now in 100..280 {
        world.app.automated = true;
        world.app.sync_policy.as_mut().unwrap()["automated"]["enabled"] = json!(true);
        let d = decide(&spec, Some(&status), &world.obs(None), t(now));
        if d.actions
            .iter()
            .any(|a| matches!(a, Action::SetAutomation { .. }))
        {
            resuspended_at.push(now);
        }
        world.act(&d);
        status = d.status;
    }
    assert_eq!(
        resuspended_at.len() as u32,
        MAX_RESUSPENSIONS,
        "{resuspended_at:?}"
    );
    let gaps: Vec<i64> = resuspended_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.windows(2).all(|g| g[1] >= g[0]) && gaps.iter().all(|g| *g >= 1),
        "backs off: {gaps:?}"
    );
    let c = cond::find(&status.conditions, conditions::SUSPENDED).unwrap();
    assert_eq!(c.reason, reasons::FIGHTING);
    assert!(c.message.contains("argocd/mesh-c1"), "{}", c.message);
    assert_eq!(status.phase, BundlePinPhase::Pinned);
}

#[test]
fn automation_turned_back_on_while_pinned_is_suspended_again() {
    let spec = spec(json!({}));
    let mut world = World::new();
    let status = pin(&spec, &mut world, None);
    world.app.automated = true;
    world.app.sync_policy = Some(original_policy());
    let d = decide(&spec, Some(&status), &world.obs(verified()), t(400));
    assert!(reasons_of(&d).contains(&reasons::RESUSPENDED));
    world.act(&d);
    assert!(!world.app.automated);
    // And the original policy in status is still the one from before the pin.
    assert_eq!(
        d.status.applications[0].original_sync_policy,
        Some(original_policy())
    );
}

fn pushes(d: &Decision) -> Vec<&Action> {
    d.actions
        .iter()
        .filter(|a| matches!(a, Action::PushRevert { .. }))
        .collect()
}

/// A pinned pin whose git revert was never recorded (the first push pending).
fn pinned_without_git(spec: &BundlePinSpec, world: &mut World) -> BundlePinStatus {
    let mut status = pin(spec, world, None);
    status.git_revert = None;
    status
}

fn fail(
    status: &mut BundlePinStatus,
    reason: &'static str,
    retryable: bool,
    generation: i64,
    at: i64,
) {
    record_git_outcome(
        status,
        GitOutcome::Failed {
            reason,
            message: format!("{reason} happened"),
            retryable,
        },
        Some(generation),
        t(at),
    );
}

#[test]
fn the_revert_branch_is_unique_to_the_pin_instance_and_owned_by_it() {
    let spec = spec(json!({}));
    let mut world = World::new();
    let status = pinned_without_git(&spec, &mut world);
    let d = decide(&spec, Some(&status), &world.obs(verified()), t(100));
    let [Action::PushRevert { branch, owner, .. }] = pushes(&d)[..] else {
        panic!("one push: {:?}", d.actions);
    };
    assert_eq!(branch, "sluice/revert/argocd/pin-1-3f2a9c1e");
    assert_eq!(owner, PIN_UID);
    // The same name reused months later by another pin (another UID): another branch.
    let mut later = world.obs(verified());
    later.uid = "0b7d55e2-1111-2222-3333-444455556666".into();
    let d = decide(&spec, Some(&status), &later, t(100));
    let [Action::PushRevert { branch, owner, .. }] = pushes(&d)[..] else {
        panic!("one push: {:?}", d.actions);
    };
    assert_eq!(branch, "sluice/revert/argocd/pin-1-0b7d55e2");
    assert_eq!(owner, &later.uid);
    assert_eq!(
        branch_name("argocd", "pin-1", ""),
        "sluice/revert/argocd/pin-1",
        "no UID known: the plain name"
    );
}

#[test]
fn a_permanent_git_failure_is_not_tried_again_until_the_spec_changes() {
    for reason in [
        "RevertConflict",
        "CommitNotOnBase",
        "BranchTaken",
        "ForgeUnauthorized",
    ] {
        let spec = spec(json!({}));
        let mut world = World::new();
        let mut status = pinned_without_git(&spec, &mut world);
        assert_eq!(
            pushes(&decide(
                &spec,
                Some(&status),
                &world.obs(verified()),
                t(100)
            ))
            .len(),
            1
        );
        fail(&mut status, reason, false, 1, 100);
        let git = status.git_revert.clone().unwrap();
        assert_eq!(
            (
                git.failure_reason.as_deref(),
                git.retryable,
                git.failed_attempts
            ),
            (Some(reason), false, 1)
        );
        let c = cond::find(&status.conditions, conditions::GIT_REVERT).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::GIT_REVERT_NOT_POSSIBLE),
            "{reason}"
        );
        assert!(
            c.message.contains(&format!("{reason} happened"))
                && c.message.contains(
                    "not tried again until the spec changes: revert the change in Git by hand"
                ),
            "{}",
            c.message
        );
        // A day of polls (the pin stays Pinned and keeps its 30 s safety net): no push.
        for at in (130..86_400).step_by(30) {
            let d = decide(&spec, Some(&status), &world.obs(verified()), t(at));
            assert!(pushes(&d).is_empty(), "{reason} at {at}: {:?}", d.actions);
            assert_eq!(d.status.git_revert, status.git_revert, "recorded once");
            assert_eq!(d.status.phase, BundlePinPhase::Pinned);
        }
        // The spec changes (a corrected commit or base branch): tried once more, at once.
        let mut edited = world.obs(verified());
        edited.generation = Some(2);
        let d = decide(&spec, Some(&status), &edited, t(86_400));
        assert_eq!(pushes(&d).len(), 1, "{reason}: {:?}", d.actions);
        let mut again = d.status.clone();
        fail(&mut again, reason, false, 2, 86_400);
        assert_eq!(
            again.git_revert.as_ref().unwrap().failed_attempts,
            1,
            "counted afresh for the new spec"
        );
    }
}

#[test]
fn a_git_failure_that_may_pass_is_retried_with_a_growing_back_off_to_a_cap() {
    let table = [
        (1, 30),
        (2, 60),
        (3, 120),
        (4, 240),
        (6, 960),
        (7, 1800),
        (8, 1800),
        (40, 1800),
    ];
    for (attempts, secs) in table {
        assert_eq!(git_retry_after(attempts).as_secs(), secs, "{attempts}");
    }

    let spec = spec(json!({}));
    let mut world = World::new();
    let mut status = pinned_without_git(&spec, &mut world);
    let mut at = 100;
    let mut tries = Vec::new();
    // Two hours of an unreachable forge, reconciled every 10 s.
    while at < 100 + 7200 {
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(at));
        if !pushes(&d).is_empty() {
            tries.push(at - 100);
            status = d.status;
            fail(&mut status, "ForgeUnavailable", true, 1, at);
            let c = cond::find(&status.conditions, conditions::GIT_REVERT).unwrap();
            assert_eq!(c.reason, reasons::GIT_REVERT_FAILED);
            let n = status.git_revert.as_ref().unwrap().failed_attempts;
            assert!(
                c.message.contains(&format!(
                    "attempt {n} failed, tried again in {} s",
                    git_retry_after(n).as_secs()
                )),
                "{}",
                c.message
            );
        } else if let Requeue::After(wait) = d.requeue {
            assert!(wait <= POLL, "{wait:?}");
        }
        at += 10;
    }
    assert_eq!(
        tries,
        vec![0, 30, 90, 210, 450, 930, 1890, 3690, 5490],
        "30 s doubling to 30 min"
    );
    // Once it passes, the branch is recorded and never asked for again.
    let d = decide(&spec, Some(&status), &world.obs(verified()), t(100 + 7290));
    let mut d = d;
    assert_eq!(pushes(&d).len(), 1);
    record_git(&mut d);
    let git = d.status.git_revert.clone().unwrap();
    assert_eq!(
        (git.failure, git.failed_attempts, git.branch.is_some()),
        (None, 0, true)
    );
    let c = cond::find(&d.status.conditions, conditions::GIT_REVERT).unwrap();
    assert_eq!(c.reason, reasons::REVERT_PUSHED);
    let next = decide(
        &spec,
        Some(&d.status),
        &world.obs(verified()),
        t(100 + 9000),
    );
    assert!(pushes(&next).is_empty());
}

#[test]
fn a_base_branch_git_would_refuse_is_an_invalid_spec_naming_the_field() {
    let spec = spec(json!({"gitRevert": {"commit": "abcdef1", "baseBranch": "release..1"}}));
    let world = World::new();
    let d = decide(&spec, None, &world.obs(verified()), t(0));
    assert_eq!(d.status.phase, BundlePinPhase::Refused);
    assert_invalid_spec(
        &d,
        "spec.gitRevert.baseBranch: \"release..1\" is not a git branch name: it contains '..'",
    );
    assert!(d.actions.iter().all(|a| !a.is_effect()), "{:?}", d.actions);
}

#[test]
fn git_not_configured_is_reported_and_nothing_is_pushed() {
    let spec = spec(json!({}));
    let mut world = World::new();
    let mut status: Option<BundlePinStatus> = None;
    for i in 0..6 {
        let mut obs = world.obs(verified());
        obs.git_configured = false;
        let d = decide(&spec, status.as_ref(), &obs, t(i));
        world.act(&d);
        world.sync_ends();
        status = Some(d.status);
    }
    let status = status.unwrap();
    assert_eq!(status.phase, BundlePinPhase::Pinned);
    assert_eq!(world.pushes, 0);
    let c = cond::find(&status.conditions, conditions::GIT_REVERT).unwrap();
    assert_eq!(c.reason, reasons::GIT_NOT_CONFIGURED);
}

#[test]
fn a_requested_sync_not_yet_started_is_dropped_with_the_suspension() {
    let spec = spec(json!({}));
    let mut world = World::new();
    world.app.operation_phase = Some("Succeeded".into());
    world.app.operation_requested = true;
    let verifying = decide(&spec, None, &world.obs(verified()), t(0));
    let preflight = decide(&spec, Some(&verifying.status), &world.obs(verified()), t(1));
    assert!(
        preflight
            .actions
            .iter()
            .all(|a| !a.is_effect() || matches!(a, Action::Preflight { .. })),
        "nothing is touched before the preflight: {:?}",
        preflight.actions
    );
    let d = decide(&spec, Some(&preflight.status), &world.obs(verified()), t(2));
    let clear = d
        .actions
        .iter()
        .any(|a| matches!(a, Action::ClearOperation { .. }));
    assert!(clear, "{:?}", d.actions);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::TerminateSync { .. })),
        "nothing runs, nothing to terminate"
    );
    world.act(&d);
    assert!(!world.app.operation_requested);
    assert!(!d.status.applications[0].sync_terminated);
}

#[test]
fn suspended_policy_keeps_every_other_setting() {
    let table = [
        (None, None),
        (
            Some(json!({"syncOptions": ["A"]})),
            Some(json!({"syncOptions": ["A"]})),
        ),
        (
            Some(json!({"automated": {"prune": true}, "x": 1})),
            Some(json!({"automated": {"prune": true, "enabled": false}, "x": 1})),
        ),
        (
            Some(json!({"automated": {"enabled": true, "selfHeal": true}})),
            Some(json!({"automated": {"enabled": false, "selfHeal": true}})),
        ),
    ];
    for (input, want) in table {
        assert_eq!(suspended_policy(input.as_ref()), want, "{input:?}");
    }
}
