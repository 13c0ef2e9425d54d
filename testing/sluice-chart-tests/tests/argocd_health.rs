//! The chart's Argo CD health checks (charts/sluice/argocd/health/<Kind>.lua), run with Lua the
//! way Argo CD runs them, against objects whose status is built from sluice-api types: every
//! phase of every kind maps to the Argo CD health status and message a person needs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use sluice_api::v1alpha1::bundle_pin::{ApplicationPinState, PinnedApplication};
use sluice_api::v1alpha1::revision_upgrade::ProxyCounts;
use sluice_api::v1alpha1::rollout::{AbortReason, AbortStatus};
use sluice_api::v1alpha1::wave_gate::{HaltReason, HaltStatus};
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinStatus, GateTemplateSpec, RevisionUpgradePhase, RevisionUpgradeStatus,
    RolloutPhase, RolloutStatus, WaveGatePhase, WaveGateStatus,
};
use sluice_chart_tests::{Health, SLUICE_KINDS, health_script, run_health};

fn time() -> Time {
    Time("2026-11-30T04:00:00Z".parse::<Timestamp>().unwrap())
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: time(),
        observed_generation: Some(1),
    }
}

/// An object of `kind` at generation 1 with the given status (JSON of a sluice-api status).
fn object(kind: &str, status: Option<serde_json::Value>) -> serde_json::Value {
    let mut obj = serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "ns", "generation": 1},
        "spec": {},
    });
    if let Some(status) = status {
        obj["status"] = status;
    }
    obj
}

fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap()
}

fn check(kind: &str, case: &str, obj: &serde_json::Value, status: &str, message: &str) {
    let script = health_script(kind).unwrap();
    let Health {
        status: got_status,
        message: got_message,
    } = run_health(&format!("{kind}.lua"), &script, obj)
        .unwrap_or_else(|err| panic!("{kind} {case}: {err}"));
    assert_eq!(got_status, status, "{kind} {case}: status ({got_message})");
    assert!(
        got_message.contains(message),
        "{kind} {case}: message {got_message:?} lacks {message:?}"
    );
}

#[test]
fn every_kind_has_a_script_that_waits_for_its_operator() {
    for kind in SLUICE_KINDS.iter().filter(|k| **k != "GateTemplate") {
        check(
            kind,
            "no status",
            &object(kind, None),
            "Progressing",
            "waiting for",
        );
        let stale = serde_json::json!({"phase": "Pending", "observedGeneration": 0});
        let mut obj = object(kind, Some(stale));
        obj["metadata"]["generation"] = 2.into();
        check(
            kind,
            "stale status",
            &obj,
            "Progressing",
            "not yet observed generation 2",
        );
    }
}

#[test]
fn rollout_health() {
    let base = RolloutStatus {
        observed_generation: Some(1),
        current_step_index: Some(3),
        desired_weight: Some(25),
        applied_share: Some(0.243),
        ..RolloutStatus::default()
    };
    let with = |phase: RolloutPhase, f: &dyn Fn(&mut RolloutStatus)| {
        let mut s = base.clone();
        s.phase = phase;
        f(&mut s);
        object("Rollout", Some(json(&s)))
    };
    let cases: Vec<(&str, serde_json::Value, &str, &str)> = vec![
        (
            "pending",
            with(RolloutPhase::Pending, &|_| {}),
            "Progressing",
            "Pending",
        ),
        (
            "progressing",
            with(RolloutPhase::Progressing, &|_| {}),
            "Progressing",
            "step 3, desired weight 25%, applied share 24.3%",
        ),
        (
            "waiting for canary",
            with(RolloutPhase::WaitingForCanary, &|_| {}),
            "Progressing",
            "WaitingForCanary",
        ),
        (
            "paused",
            with(RolloutPhase::Paused, &|_| {}),
            "Suspended",
            "paused at step 3",
        ),
        (
            "promoted",
            with(RolloutPhase::Promoted, &|_| {}),
            "Healthy",
            "waiting for hand-back",
        ),
        (
            "promoted, hand-back overdue",
            with(RolloutPhase::Promoted, &|s| {
                s.conditions = vec![condition("HandBackOverdue", "True", "HandBackOverdue", "")]
            }),
            "Healthy",
            "hand-back overdue",
        ),
        (
            "aborted",
            with(RolloutPhase::Aborted, &|s| {
                s.abort = Some(AbortStatus {
                    reason: AbortReason::GateFailed,
                    message: Some("error-ratio 0.12 > 0.03".into()),
                    gate: None,
                    step_index: Some(3),
                    first_failed_at: None,
                    decided_at: time(),
                    route_reverted_at: None,
                    revert_verified_at: None,
                })
            }),
            "Degraded",
            "aborted (GateFailed): error-ratio 0.12 > 0.03",
        ),
        (
            "invalid",
            with(RolloutPhase::Invalid, &|s| {
                s.conditions = vec![condition(
                    "Ready",
                    "False",
                    "InvalidSpec",
                    "spec.steps[2]: weight 120 > 100",
                )]
            }),
            "Degraded",
            "invalid spec: spec.steps[2]: weight 120 > 100",
        ),
    ];
    for (case, obj, status, message) in &cases {
        check("Rollout", case, obj, status, message);
    }
}

#[test]
fn wave_gate_health() {
    let with = |phase: WaveGatePhase, f: &dyn Fn(&mut WaveGateStatus)| {
        let mut s = WaveGateStatus {
            observed_generation: Some(1),
            phase,
            current_revision: Some("sha256:aa".into()),
            current_wave: Some("canary".into()),
            ..WaveGateStatus::default()
        };
        f(&mut s);
        object("WaveGate", Some(json(&s)))
    };
    let cases: Vec<(&str, serde_json::Value, &str, &str)> = vec![
        (
            "soaking",
            with(WaveGatePhase::Soaking, &|_| {}),
            "Progressing",
            "Soaking: sha256:aa, wave canary",
        ),
        (
            "waiting for a site",
            with(WaveGatePhase::WaitingForSite, &|_| {}),
            "Progressing",
            "WaitingForSite",
        ),
        (
            "complete",
            with(WaveGatePhase::Complete, &|_| {}),
            "Healthy",
            "every wave passed at sha256:aa",
        ),
        (
            "halted",
            with(WaveGatePhase::Halted, &|s| {
                s.halt = Some(HaltStatus {
                    reason: HaltReason::GateFailed,
                    message: Some("xds-nacks rose by 40".into()),
                    wave: "site-1".into(),
                    gate: None,
                    halted_at: time(),
                    pins: vec![],
                    reverted_clusters: vec![],
                    pinned_at: None,
                })
            }),
            "Degraded",
            "halted in wave site-1 (GateFailed): xds-nacks rose by 40",
        ),
        (
            "refused",
            with(WaveGatePhase::Refused, &|s| {
                s.conditions = vec![condition(
                    "ApplicationSetSafe",
                    "False",
                    "ResourcesNotPreserved",
                    "set preserveResourcesOnDeletion: true",
                )]
            }),
            "Degraded",
            "refused: set preserveResourcesOnDeletion: true",
        ),
        (
            "invalid",
            with(WaveGatePhase::Pending, &|s| {
                s.conditions = vec![condition(
                    "Ready",
                    "False",
                    "InvalidSpec",
                    "spec.waves[0].clusters is empty",
                )]
            }),
            "Degraded",
            "invalid spec: spec.waves[0].clusters is empty",
        ),
    ];
    for (case, obj, status, message) in &cases {
        check("WaveGate", case, obj, status, message);
    }
}

#[test]
fn bundle_pin_health() {
    let app = PinnedApplication {
        name: "mesh-config".into(),
        namespace: "argocd".into(),
        state: ApplicationPinState::Pinned,
        original_sync_policy_saved: true,
        applied_objects: 3,
        ..PinnedApplication::default()
    };
    let with = |phase: BundlePinPhase, f: &dyn Fn(&mut BundlePinStatus)| {
        let mut s = BundlePinStatus {
            observed_generation: Some(1),
            phase,
            to_digest: Some("sha256:bb".into()),
            applications: vec![app.clone(), app.clone()],
            ..BundlePinStatus::default()
        };
        f(&mut s);
        object("BundlePin", Some(json(&s)))
    };
    let cases: Vec<(&str, serde_json::Value, &str, &str)> = vec![
        (
            "verifying",
            with(BundlePinPhase::Verifying, &|_| {}),
            "Progressing",
            "Verifying",
        ),
        (
            "pinned",
            with(BundlePinPhase::Pinned, &|_| {}),
            "Healthy",
            "2 application(s) pinned to sha256:bb",
        ),
        (
            "released",
            with(BundlePinPhase::Released, &|_| {}),
            "Healthy",
            "released",
        ),
        (
            "refused: wrong key",
            with(BundlePinPhase::Refused, &|s| {
                s.conditions = vec![
                    condition("Ready", "True", "Valid", ""),
                    condition(
                        "Verified",
                        "False",
                        "WrongKey",
                        "no key of Secret argocd/keys verifies sha256:bb",
                    ),
                ]
            }),
            "Degraded",
            "refused: no key of Secret argocd/keys verifies sha256:bb",
        ),
        (
            "failed to apply",
            with(BundlePinPhase::Failed, &|s| {
                s.conditions = vec![
                    condition("Verified", "True", "SignatureVerified", ""),
                    condition("Pinned", "False", "ApplyFailed", "cluster-a unreachable"),
                ]
            }),
            "Degraded",
            "failed: cluster-a unreachable",
        ),
    ];
    for (case, obj, status, message) in &cases {
        check("BundlePin", case, obj, status, message);
    }
}

#[test]
fn revision_upgrade_health() {
    let with = |phase: RevisionUpgradePhase, f: &dyn Fn(&mut RevisionUpgradeStatus)| {
        let mut s = RevisionUpgradeStatus {
            observed_generation: Some(1),
            phase,
            current_wave: Some("tier-2".into()),
            proxies: Some(ProxyCounts {
                old: 700,
                new: 300,
                other: 0,
                observed_at: None,
            }),
            ..RevisionUpgradeStatus::default()
        };
        f(&mut s);
        object("RevisionUpgrade", Some(json(&s)))
    };
    let cases: Vec<(&str, serde_json::Value, &str, &str)> = vec![
        (
            "progressing",
            with(RevisionUpgradePhase::Progressing, &|_| {}),
            "Progressing",
            "Progressing wave tier-2: 300 proxies on the new revision, 700 on the old",
        ),
        (
            "rolling back",
            with(RevisionUpgradePhase::RollingBack, &|_| {}),
            "Progressing",
            "RollingBack",
        ),
        (
            "paused",
            with(RevisionUpgradePhase::Paused, &|_| {}),
            "Suspended",
            "paused: 300 proxies",
        ),
        (
            "complete",
            with(RevisionUpgradePhase::Complete, &|s| {
                s.proxies = Some(ProxyCounts {
                    old: 0,
                    new: 1000,
                    other: 0,
                    observed_at: None,
                })
            }),
            "Healthy",
            "complete: 1000 proxies on the new revision, 0 on the old",
        ),
        (
            "aborted",
            with(RevisionUpgradePhase::Aborted, &|_| {}),
            "Degraded",
            "aborted: 300 proxies",
        ),
        (
            "invalid",
            with(RevisionUpgradePhase::Invalid, &|s| {
                s.proxies = None;
                s.conditions = vec![condition(
                    "Ready",
                    "False",
                    "InvalidSpec",
                    "spec.toTag equals spec.fromTag",
                )]
            }),
            "Degraded",
            "invalid: spec.toTag equals spec.fromTag",
        ),
    ];
    for (case, obj, status, message) in &cases {
        check("RevisionUpgrade", case, obj, status, message);
    }
}

#[test]
fn gate_template_health() {
    let spec: GateTemplateSpec = serde_json::from_value(serde_json::json!({
        "description": "5xx ratio of the canary vs stable",
        "definition": {"promql": "vector(1)"},
    }))
    .expect("a GateTemplateSpec fixture");
    let mut obj = object("GateTemplate", None);
    obj["spec"] = json(&spec);
    check(
        "GateTemplate",
        "any",
        &obj,
        "Healthy",
        "5xx ratio of the canary vs stable",
    );
    check(
        "GateTemplate",
        "no description",
        &object("GateTemplate", None),
        "Healthy",
        "gate template",
    );
}
