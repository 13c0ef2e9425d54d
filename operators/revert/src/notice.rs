//! Which BundlePin transitions are worth a webhook notification, and the figures they carry: a
//! bundle pinned (its digest, repository, Applications and object counts) and a pin released.
//!
//! Pure: a function of the status before and after a status write. Never sends anything itself;
//! reconcile hands the notice to the runtime's notifier after the write succeeded.

use sluice_api::v1alpha1::{BundlePinPhase, BundlePinStatus};
use sluice_runtime::notify::{Notice, NoticeEvent};

use crate::metrics::object_signal;

/// The notice for the transition from `before` to `after`, if the pin took hold or was
/// released. A status read back with the same phase (a restart, a requeue) is no transition.
pub fn notice(before: Option<&BundlePinStatus>, after: &BundlePinStatus) -> Option<Notice> {
    let event = |phase| match phase {
        BundlePinPhase::Pinned => Some(NoticeEvent::Pin),
        BundlePinPhase::Released => Some(NoticeEvent::Release),
        _ => None,
    };
    let from = before.map(|s| s.phase);
    let mut n = Notice::of_transition(from, after.phase, event, object_signal(after).reason)?;
    n.message_from(&after.conditions);
    let applications: Vec<String> = after
        .applications
        .iter()
        .map(|a| format!("{}/{}", a.namespace, a.name))
        .collect();
    n.figure("digest", &after.to_digest)
        .figure("repository", &after.to_repository)
        .figure("fromDigest", &after.from_digest)
        .figure("applications", applications)
        .figure("appliedObjects", after.applied_objects)
        .figure("prunedObjects", after.pruned_objects);
    match n.event {
        NoticeEvent::Pin => n.figure("pinnedAt", &after.pinned_at),
        _ => n.figure("releasedAt", &after.released_at),
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use sluice_runtime::notify::checks;

    fn status(v: serde_json::Value) -> BundlePinStatus {
        serde_json::from_value(v).expect("status fixture")
    }

    #[test]
    fn pin_and_release_are_notified_with_the_digest_and_applications() {
        let base = json!({"toDigest": "sha256:ab12", "toRepository": "registry.test/mesh/bundle",
            "appliedObjects": 12, "prunedObjects": 1,
            "applications": [{"name": "mesh-east-1", "namespace": "argocd", "state": "Pinned"}],
            "pinnedAt": "2026-12-02T05:00:00Z"});
        let with = |phase: &str, extra: serde_json::Value| {
            let mut v = base.clone();
            v["phase"] = json!(phase);
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            status(v)
        };
        let pinning = with("Pinning", json!({}));
        let pinned = with(
            "Pinned",
            json!({"conditions": [{"type": "Pinned", "status": "True",
            "reason": "Pinned", "message": "1 Application pinned to sha256:ab12",
            "lastTransitionTime": "2026-12-02T05:00:00Z"}]}),
        );
        let released = with("Released", json!({"releasedAt": "2026-12-02T06:00:00Z"}));

        let n = notice(Some(&pinning), &pinned).expect("a pin");
        assert_eq!(n.event, NoticeEvent::Pin);
        assert_eq!((n.from.as_str(), n.to.as_str()), ("Pinning", "Pinned"));
        assert_eq!(n.figures["digest"], "sha256:ab12");
        assert_eq!(n.figures["applications"], json!(["argocd/mesh-east-1"]));
        assert_eq!(n.figures["appliedObjects"], 12);
        assert_eq!(n.figures["pinnedAt"], "2026-12-02T05:00:00Z");

        let n = notice(Some(&pinned), &released).expect("a release");
        assert_eq!(n.event, NoticeEvent::Release);
        assert_eq!(n.figures["releasedAt"], "2026-12-02T06:00:00Z");

        let releasing = with("Releasing", json!({}));
        let writes = [
            (Some(&pinned), &pinned),
            (None, &pinning),
            (Some(&pinned), &releasing),
        ];
        checks::no_notice(&writes, notice, |s| s.phase);
    }
}
