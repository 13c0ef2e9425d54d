//! The control commands as pure decisions: from an object as read (JSON; its `status.phase`
//! read as the kind's phase type in sluice-api, so a renamed phase does not compile) to the
//! JSON merge patch of its spec control fields that asks the operator for the action, or the
//! reason the action does not apply. The patch carries the resourceVersion it was decided from, so a
//! concurrent change makes the write fail (409) and the command decides again.
//!
//! Owns which spec fields each command writes (sluice-api's control fields: Rollout `abort`,
//! `paused`, `promoteThroughStep`, `promoteFull`, `retry`; RevisionUpgrade `abort`, `paused`,
//! `resume`; BundlePin `release`, `releaseReason`); never writes status and never any other
//! field. No I/O.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sluice_api::v1alpha1::{BundlePinPhase, RevisionUpgradePhase, RolloutPhase};

use crate::kinds::Kind;
use crate::tree::api_name;

/// A control command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Rollout: complete the current step (`promoteThroughStep`), or everything (`promoteFull`).
    Promote {
        /// Promote to 100% now.
        full: bool,
    },
    /// Rollout or RevisionUpgrade: abort.
    Abort,
    /// Rollout or RevisionUpgrade: hold.
    Pause,
    /// Rollout: stop holding. RevisionUpgrade: stop holding and, after an abort, resume.
    Resume,
    /// Rollout: start an aborted rollout again from the first step.
    Retry,
    /// BundlePin: release the pin now.
    Unpin {
        /// Why (audited).
        reason: String,
    },
}

impl Control {
    /// The command's name on the command line.
    pub fn command(&self) -> &'static str {
        match self {
            Control::Promote { .. } => "promote",
            Control::Abort => "abort",
            Control::Pause => "pause",
            Control::Resume => "resume",
            Control::Retry => "retry",
            Control::Unpin { .. } => "unpin",
        }
    }

    /// The kinds the command acts on; the first is the default of a bare NAME.
    pub fn kinds(&self) -> &'static [Kind] {
        match self {
            Control::Promote { .. } | Control::Retry => &[Kind::Rollout],
            Control::Abort | Control::Pause | Control::Resume => {
                &[Kind::Rollout, Kind::RevisionUpgrade]
            }
            Control::Unpin { .. } => &[Kind::BundlePin],
        }
    }
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

fn u64_at(obj: &Value, pointer: &str) -> Option<u64> {
    obj.pointer(pointer).and_then(Value::as_u64)
}

fn bool_at(obj: &Value, pointer: &str) -> bool {
    obj.pointer(pointer)
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `status.phase` as the kind's phase type in sluice-api; the type's default (`Pending`,
/// a BundlePin's `Verifying`) before the operator reports one.
fn status_phase<P: DeserializeOwned + Default>(obj: &Value) -> P {
    obj.pointer("/status/phase")
        .and_then(|p| P::deserialize(p).ok())
        .unwrap_or_default()
}

/// The merge patch asking for `control` on `obj` (of `kind`), or why it does not apply.
pub fn decide(control: &Control, kind: Kind, obj: &Value) -> Result<Value, String> {
    let spec = match (control, kind) {
        (Control::Promote { full }, Kind::Rollout) => {
            match status_phase(obj) {
                RolloutPhase::Promoted => {
                    return Err("is already promoted: nothing to promote".into());
                }
                RolloutPhase::Aborted => {
                    return Err(
                        "is aborted: retry it ('kubectl sluice retry') before promoting".into(),
                    );
                }
                RolloutPhase::Invalid => {
                    return Err("has an invalid spec: fix it before promoting".into());
                }
                _ => {}
            }
            if *full {
                if bool_at(obj, "/spec/promoteFull") {
                    return Err("already asks for full promotion (spec.promoteFull)".into());
                }
                json!({"promoteFull": true})
            } else {
                let Some(step) = u64_at(obj, "/status/currentStepIndex") else {
                    return Err("has not started a step yet: wait for it, or use --full".into());
                };
                let through = u64_at(obj, "/spec/promoteThroughStep");
                if through.is_some_and(|t| t >= step) {
                    return Err(format!(
                        "already promoted through step {} (spec.promoteThroughStep): wait for the operator, or use --full",
                        through.unwrap_or(step)
                    ));
                }
                json!({"promoteThroughStep": step})
            }
        }
        (Control::Abort, Kind::Rollout) => {
            if status_phase::<RolloutPhase>(obj) == RolloutPhase::Aborted
                || bool_at(obj, "/spec/abort")
            {
                return Err("is already aborted (spec.abort)".into());
            }
            json!({"abort": true})
        }
        (Control::Abort, Kind::RevisionUpgrade) => {
            if status_phase::<RevisionUpgradePhase>(obj) == RevisionUpgradePhase::Complete {
                return Err(
                    "is complete: nothing to abort (retag namespaces with a new RevisionUpgrade)"
                        .into(),
                );
            }
            if bool_at(obj, "/spec/abort") {
                return Err("is already aborted (spec.abort)".into());
            }
            json!({"abort": true})
        }
        (Control::Pause, Kind::Rollout | Kind::RevisionUpgrade) => {
            if bool_at(obj, "/spec/paused") {
                return Err("is already paused (spec.paused)".into());
            }
            let finished = if kind == Kind::Rollout {
                let phase: RolloutPhase = status_phase(obj);
                matches!(phase, RolloutPhase::Promoted | RolloutPhase::Aborted)
                    .then(|| api_name(&phase))
            } else {
                let phase: RevisionUpgradePhase = status_phase(obj);
                matches!(
                    phase,
                    RevisionUpgradePhase::Aborted | RevisionUpgradePhase::Complete
                )
                .then(|| api_name(&phase))
            };
            if let Some(phase) = finished {
                return Err(format!("is {phase}: there is nothing left to pause"));
            }
            json!({"paused": true})
        }
        (Control::Resume, Kind::Rollout) => {
            let phase: RolloutPhase = status_phase(obj);
            if phase == RolloutPhase::Aborted {
                return Err("is aborted: use 'kubectl sluice retry' to start it again".into());
            }
            if !bool_at(obj, "/spec/paused") {
                if phase != RolloutPhase::Paused {
                    return Err("is not paused".into());
                }
                // Paused without spec.paused: a pause step or an Inconclusive hold, which
                // clearing spec.paused would not release.
                let held_by = obj
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|c| str_at(c, "/type") == Some("Progressing"))
                    .and_then(|c| str_at(c, "/reason"));
                return Err(match held_by {
                    Some("Inconclusive") => "is held by a gate that stayed Inconclusive (its policy is Pause), not by spec.paused: 'kubectl sluice promote' releases the hold once you have checked the gate's metrics".into(),
                    _ => "is at a pause step, not paused by spec.paused: 'kubectl sluice promote' moves on to the next step".into(),
                });
            }
            json!({"paused": false})
        }
        (Control::Resume, Kind::RevisionUpgrade) => {
            let phase: RevisionUpgradePhase = status_phase(obj);
            let aborted = bool_at(obj, "/spec/abort")
                || matches!(
                    phase,
                    RevisionUpgradePhase::Aborted | RevisionUpgradePhase::RollingBack
                );
            if !aborted && !bool_at(obj, "/spec/paused") && phase != RevisionUpgradePhase::Paused {
                return Err("is neither paused nor aborted".into());
            }
            if aborted {
                let resume = u64_at(obj, "/spec/resume")
                    .unwrap_or(0)
                    .max(u64_at(obj, "/status/resumesHandled").unwrap_or(0))
                    + 1;
                json!({"paused": false, "abort": false, "resume": resume})
            } else {
                json!({"paused": false})
            }
        }
        (Control::Retry, Kind::Rollout) => {
            let phase: RolloutPhase = status_phase(obj);
            if phase != RolloutPhase::Aborted && !bool_at(obj, "/spec/abort") {
                return Err(format!(
                    "is {}, not aborted: there is nothing to retry",
                    api_name(&phase)
                ));
            }
            let retry = u64_at(obj, "/spec/retry")
                .unwrap_or(0)
                .max(u64_at(obj, "/status/retriesHandled").unwrap_or(0))
                + 1;
            // A manual promotion of the aborted attempt must not skip steps of the new one.
            json!({"abort": false, "retry": retry, "promoteFull": false, "promoteThroughStep": null})
        }
        (Control::Unpin { reason }, Kind::BundlePin) => {
            if status_phase::<BundlePinPhase>(obj) == BundlePinPhase::Released {
                return Err("is already released".into());
            }
            if bool_at(obj, "/spec/release") {
                return Err("already asks for release (spec.release): wait for revert".into());
            }
            if reason.trim().is_empty() {
                return Err("needs --reason: an explicit release is audited".into());
            }
            json!({"release": true, "releaseReason": reason})
        }
        (control, kind) => {
            return Err(format!("'{}' does not act on {kind}s", control.command()));
        }
    };
    let mut patch = json!({"spec": spec});
    if let Some(rv) = str_at(obj, "/metadata/resourceVersion") {
        patch["metadata"] = json!({"resourceVersion": rv});
    }
    Ok(patch)
}

/// A new BundlePin pinning Applications to a signed bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinRequest {
    /// The Applications (in the pin's namespace unless `namespace/name`).
    pub applications: Vec<String>,
    /// `oci://host/repo@sha256:<hex>` (a tag is refused).
    pub bundle: String,
    /// Secret holding the cosign public keys.
    pub keys_secret: String,
    /// Why (audited).
    pub reason: String,
    /// The pin's name; default `pin-<first application>-<12 hex of the digest>`.
    pub name: Option<String>,
    /// The commit of the bad change in the intent repository: revert pushes its revert branch
    /// (and opens the pull request when a forge is configured) when set.
    pub revert_commit: Option<String>,
    /// Base branch of the revert (default: the operator's, `main`).
    pub base_branch: Option<String>,
    /// Open a pull request for the revert (when a forge is configured).
    pub pull_request: bool,
    /// The live pin this one takes over from (`spec.supersedes`).
    pub supersedes: Option<String>,
    /// Pin a digest Argo CD never deployed for the Application (audited).
    pub allow_any_revision: bool,
}

/// The BundlePin object for `request` in `namespace`, or what is wrong with the request.
pub fn bundle_pin(request: &PinRequest, namespace: &str) -> Result<Value, String> {
    let Some((repository, digest)) = request.bundle.rsplit_once('@') else {
        return Err(format!(
            "--bundle {:?} names no digest: give oci://host/repo@sha256:<64 hex> (a signature is checked on a digest, never a tag)",
            request.bundle
        ));
    };
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "--bundle digest {digest:?} is not sha256:<64 lowercase hex>"
        ));
    }
    let Some(first) = request.applications.first() else {
        return Err("name at least one Application to pin".into());
    };
    if request.reason.trim().is_empty() {
        return Err("--reason is required: a pin is audited".into());
    }
    let targets: Vec<Value> = request
        .applications
        .iter()
        .map(|app| match app.split_once('/') {
            Some((ns, name)) => json!({"name": name, "namespace": ns}),
            None => json!({"name": app}),
        })
        .collect();
    let base = first.rsplit('/').next().unwrap_or(first);
    let name = request.name.clone().unwrap_or_else(|| {
        let mut n = format!("pin-{base}");
        n.truncate(253 - 13);
        format!("{}-{}", n.trim_end_matches('-'), &hex[..12])
    });
    let repository = if repository.starts_with("oci://") {
        repository.to_string()
    } else {
        format!("oci://{repository}")
    };
    let mut pin = json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "BundlePin",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "targets": targets,
            "bundle": {"repository": repository, "digest": digest},
            "publicKeysSecretRef": {"name": request.keys_secret},
            "reason": request.reason,
        }
    });
    if let Some(commit) = &request.revert_commit {
        if commit.len() < 7
            || commit.len() > 64
            || !commit
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "--revert-commit {commit:?} is not a commit sha (7..64 lowercase hex)"
            ));
        }
        let mut git = json!({"commit": commit, "pullRequest": request.pull_request});
        if let Some(base) = &request.base_branch {
            git["baseBranch"] = json!(base);
        }
        pin["spec"]["gitRevert"] = git;
    }
    if let Some(previous) = &request.supersedes {
        pin["spec"]["supersedes"] = json!(previous);
    }
    if request.allow_any_revision {
        pin["spec"]["allowAnyRevision"] = json!(true);
    }
    Ok(pin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": "x", "resourceVersion": "42"}, "spec": spec, "status": status})
    }

    #[test]
    fn control_decisions() {
        use Control::*;
        let unpin = Unpin {
            reason: "forward fix merged".into(),
        };
        // (case, control, kind, spec, status, Ok(spec patch) | Err(message fragment))
        type Case = (
            &'static str,
            Control,
            Kind,
            Value,
            Value,
            Result<Value, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "promote current step",
                Promote { full: false },
                Kind::Rollout,
                json!({}),
                json!({"phase": "Paused", "currentStepIndex": 4}),
                Ok(json!({"promoteThroughStep": 4})),
            ),
            (
                "promote again",
                Promote { full: false },
                Kind::Rollout,
                json!({"promoteThroughStep": 4}),
                json!({"phase": "Paused", "currentStepIndex": 4}),
                Err("already promoted through step 4"),
            ),
            (
                "promote next step",
                Promote { full: false },
                Kind::Rollout,
                json!({"promoteThroughStep": 4}),
                json!({"phase": "Progressing", "currentStepIndex": 5}),
                Ok(json!({"promoteThroughStep": 5})),
            ),
            (
                "promote before any step",
                Promote { full: false },
                Kind::Rollout,
                json!({}),
                json!({"phase": "WaitingForCanary"}),
                Err("has not started a step"),
            ),
            (
                "promote full",
                Promote { full: true },
                Kind::Rollout,
                json!({}),
                json!({"phase": "Progressing", "currentStepIndex": 2}),
                Ok(json!({"promoteFull": true})),
            ),
            (
                "promote aborted",
                Promote { full: true },
                Kind::Rollout,
                json!({}),
                json!({"phase": "Aborted"}),
                Err("retry it"),
            ),
            (
                "promote promoted",
                Promote { full: false },
                Kind::Rollout,
                json!({}),
                json!({"phase": "Promoted"}),
                Err("already promoted"),
            ),
            (
                "abort rollout",
                Abort,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Progressing"}),
                Ok(json!({"abort": true})),
            ),
            (
                "abort aborted rollout",
                Abort,
                Kind::Rollout,
                json!({"abort": true}),
                json!({"phase": "Aborted"}),
                Err("already aborted"),
            ),
            (
                "abort upgrade",
                Abort,
                Kind::RevisionUpgrade,
                json!({}),
                json!({"phase": "Soaking"}),
                Ok(json!({"abort": true})),
            ),
            (
                "abort complete upgrade",
                Abort,
                Kind::RevisionUpgrade,
                json!({}),
                json!({"phase": "Complete"}),
                Err("is complete"),
            ),
            (
                "pause rollout",
                Pause,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Progressing"}),
                Ok(json!({"paused": true})),
            ),
            (
                "pause paused",
                Pause,
                Kind::Rollout,
                json!({"paused": true}),
                json!({"phase": "Paused"}),
                Err("already paused"),
            ),
            (
                "pause promoted",
                Pause,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Promoted"}),
                Err("nothing left to pause"),
            ),
            (
                "pause upgrade",
                Pause,
                Kind::RevisionUpgrade,
                json!({}),
                json!({"phase": "Progressing"}),
                Ok(json!({"paused": true})),
            ),
            (
                "resume rollout",
                Resume,
                Kind::Rollout,
                json!({"paused": true}),
                json!({"phase": "Paused"}),
                Ok(json!({"paused": false})),
            ),
            (
                "resume a rollout held by an Inconclusive gate",
                Resume,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Paused", "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Valid"},
                    {"type": "Progressing", "status": "True", "reason": "Inconclusive"}]}),
                Err(
                    "is held by a gate that stayed Inconclusive (its policy is Pause), not by spec.paused: 'kubectl sluice promote' releases the hold",
                ),
            ),
            (
                "resume a rollout at a pause step",
                Resume,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Paused", "conditions": [
                    {"type": "Progressing", "status": "True", "reason": "Paused"}]}),
                Err(
                    "is at a pause step, not paused by spec.paused: 'kubectl sluice promote' moves on",
                ),
            ),
            (
                "resume running rollout",
                Resume,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Progressing"}),
                Err("is not paused"),
            ),
            (
                "resume aborted rollout",
                Resume,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Aborted"}),
                Err("use 'kubectl sluice retry'"),
            ),
            (
                "resume paused upgrade",
                Resume,
                Kind::RevisionUpgrade,
                json!({"paused": true}),
                json!({"phase": "Paused"}),
                Ok(json!({"paused": false})),
            ),
            (
                "resume aborted upgrade",
                Resume,
                Kind::RevisionUpgrade,
                json!({"abort": true, "resume": 1}),
                json!({"phase": "Aborted", "resumesHandled": 2}),
                Ok(json!({"paused": false, "abort": false, "resume": 3})),
            ),
            (
                "resume running upgrade",
                Resume,
                Kind::RevisionUpgrade,
                json!({}),
                json!({"phase": "Progressing"}),
                Err("neither paused nor aborted"),
            ),
            (
                "retry aborted",
                Retry,
                Kind::Rollout,
                json!({"abort": true, "retry": 0, "promoteThroughStep": 3}),
                json!({"phase": "Aborted", "retriesHandled": 1}),
                Ok(
                    json!({"abort": false, "retry": 2, "promoteFull": false, "promoteThroughStep": null}),
                ),
            ),
            (
                "retry running",
                Retry,
                Kind::Rollout,
                json!({}),
                json!({"phase": "Progressing"}),
                Err("not aborted"),
            ),
            (
                "unpin",
                unpin.clone(),
                Kind::BundlePin,
                json!({}),
                json!({"phase": "Pinned"}),
                Ok(json!({"release": true, "releaseReason": "forward fix merged"})),
            ),
            (
                "unpin released",
                unpin.clone(),
                Kind::BundlePin,
                json!({}),
                json!({"phase": "Released"}),
                Err("already released"),
            ),
            (
                "unpin without reason",
                Unpin { reason: " ".into() },
                Kind::BundlePin,
                json!({}),
                json!({"phase": "Pinned"}),
                Err("needs --reason"),
            ),
            (
                "promote a wave gate",
                Promote { full: true },
                Kind::WaveGate,
                json!({}),
                json!({"phase": "Soaking"}),
                Err("does not act on WaveGates"),
            ),
        ];
        for (case, control, kind, spec, status, want) in cases {
            let got = decide(&control, kind, &obj(spec, status));
            match (got, want) {
                (Ok(patch), Ok(spec)) => {
                    assert_eq!(
                        patch,
                        json!({"spec": spec, "metadata": {"resourceVersion": "42"}}),
                        "{case}"
                    )
                }
                (Err(message), Err(fragment)) => {
                    assert!(
                        message.contains(fragment),
                        "{case}: {message:?} lacks {fragment:?}"
                    )
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn pin_requests() {
        let hex = "ab".repeat(32);
        let request = |bundle: &str, apps: &[&str], reason: &str| PinRequest {
            applications: apps.iter().map(|a| a.to_string()).collect(),
            bundle: bundle.into(),
            keys_secret: "cosign".into(),
            reason: reason.into(),
            name: None,
            revert_commit: None,
            base_branch: None,
            pull_request: true,
            supersedes: None,
            allow_any_revision: false,
        };
        let ok = bundle_pin(
            &request(
                &format!("registry.local:5000/mesh/config@sha256:{hex}"),
                &["mesh-eu-1", "other/mesh-eu-2"],
                "5xx after change 42",
            ),
            "argocd",
        )
        .unwrap();
        assert_eq!(
            ok["metadata"]["name"],
            format!("pin-mesh-eu-1-{}", &hex[..12])
        );
        assert_eq!(
            ok["spec"]["bundle"]["repository"],
            "oci://registry.local:5000/mesh/config"
        );
        assert_eq!(ok["spec"]["bundle"]["digest"], format!("sha256:{hex}"));
        assert_eq!(
            ok["spec"]["targets"],
            json!([{"name": "mesh-eu-1"}, {"name": "mesh-eu-2", "namespace": "other"}])
        );
        let bad = [
            (request("oci://r/mesh:v1", &["a"], "r"), "names no digest"),
            (
                request("oci://r/mesh@sha256:abc", &["a"], "r"),
                "not sha256:<64",
            ),
            (
                request(&format!("oci://r/m@sha256:{hex}"), &[], "r"),
                "at least one Application",
            ),
            (
                request(&format!("oci://r/m@sha256:{hex}"), &["a"], ""),
                "--reason is required",
            ),
        ];
        for (req, fragment) in bad {
            let err = bundle_pin(&req, "argocd").unwrap_err();
            assert!(err.contains(fragment), "{err:?} lacks {fragment:?}");
        }
        // The revert reaches Git, a hand-over, an audited revision Argo CD never ran.
        let mut full = request(
            &format!("oci://r/m@sha256:{hex}"),
            &["a"],
            "5xx after change 42",
        );
        full.revert_commit = Some("abcdef1".into());
        full.base_branch = Some("release".into());
        full.supersedes = Some("pin-a-1".into());
        full.allow_any_revision = true;
        let pin = bundle_pin(&full, "argocd").unwrap();
        assert_eq!(
            pin["spec"]["gitRevert"],
            json!({"commit": "abcdef1", "pullRequest": true, "baseBranch": "release"})
        );
        assert_eq!(pin["spec"]["supersedes"], "pin-a-1");
        assert_eq!(pin["spec"]["allowAnyRevision"], true);
        full.revert_commit = Some("main".into());
        assert!(
            bundle_pin(&full, "argocd")
                .unwrap_err()
                .contains("--revert-commit")
        );
    }
}
