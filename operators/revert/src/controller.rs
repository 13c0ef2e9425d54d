//! The BundlePin controller with its second trigger: a change to an Argo CD Application that
//! matters to a pin (sync status or revision, sync policy, a requested or running sync, the
//! resources Argo CD tracks, destination, sources) reconciles the live pins targeting it at
//! once, so a release follows Argo CD's report without waiting for a poll. The pin's own slow
//! requeue ([`crate::decide::POLL`]) stays as a safety net for a missed event.
//!
//! Owns the mapping Application → BundlePins and the Application watch it adds to the shared
//! runtime's controller loop (same leadership, metrics and back-off). Must never decide anything
//! about a pin and never write: it only asks for reconciles.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
};

use kube::{
    Api, ResourceExt,
    runtime::{
        Controller,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use sluice_api::{
    external::argocd::Application,
    v1alpha1::{BundlePin, BundlePinPhase},
};
use sluice_runtime::{
    leader::Leadership,
    operator::{Hooks, drive_with},
};
use tokio_util::sync::CancellationToken;

use crate::{
    decide,
    reconcile::{self, Context},
};

/// What of an Application a pin's decision reads; a change elsewhere (health, history,
/// `reconciledAt`) wakes no pin.
pub fn fingerprint(app: &Application) -> u64 {
    let status = app.status.as_ref();
    let relevant = json!({
        "spec": &app.spec,
        "operation": app.operation.is_some(),
        "owners": app.owner_references(),
        "sync": status.and_then(|s| s.sync.as_ref()),
        "operationPhase": status
            .and_then(|s| s.operation_state.as_ref())
            .and_then(|o| o.phase.as_ref()),
        "resources": status.and_then(|s| s.resources.as_ref()),
    });
    let mut h = DefaultHasher::new();
    relevant.to_string().hash(&mut h);
    h.finish()
}

/// The live pins (not Released, Refused or Failed) that act on Application `namespace/name`.
pub fn pins_for(namespace: &str, name: &str, pins: &[Arc<BundlePin>]) -> Vec<ObjectRef<BundlePin>> {
    pins.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().map(|s| s.phase),
                Some(BundlePinPhase::Released | BundlePinPhase::Refused | BundlePinPhase::Failed)
            )
        })
        .filter(|p| {
            let pin_ns = p.namespace().unwrap_or_default();
            decide::targets_to_observe(&p.spec, p.status.as_ref(), &pin_ns)
                .iter()
                .any(|t| t.namespace == namespace && t.name == name)
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Maps Application changes to the pins they wake, dropping changes that do not matter to a
/// pin (same [`fingerprint`] as last seen).
#[derive(Debug, Default)]
pub struct ApplicationTrigger {
    seen: Mutex<HashMap<(String, String), u64>>,
}

impl ApplicationTrigger {
    /// The pins `app`'s change wakes, given the pins known now.
    pub fn map(&self, app: &Application, pins: &[Arc<BundlePin>]) -> Vec<ObjectRef<BundlePin>> {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        let print = fingerprint(app);
        let gone = app.metadata.deletion_timestamp.is_some();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if gone {
                seen.remove(&key);
            } else if seen.insert(key.clone(), print) == Some(print) {
                return Vec::new();
            }
        }
        pins_for(&key.0, &key.1, pins)
    }
}

/// Adds the Application watch to a new BundlePin controller: a change that matters to a pin
/// (same [`fingerprint`] as last seen: no) reconciles the live pins targeting the Application.
pub fn with_application_trigger(
    applications: Api<Application>,
    watcher_config: watcher::Config,
) -> impl Fn(Controller<BundlePin>) -> Controller<BundlePin> {
    move |controller| {
        let pins: Store<BundlePin> = controller.store();
        let trigger = ApplicationTrigger::default();
        controller.watches(
            applications.clone(),
            watcher_config.clone(),
            move |app: Application| trigger.map(&app, &pins.state()),
        )
    }
}

/// Runs the BundlePin controller (pins from `pins`, Applications from `applications`) whenever
/// `leadership` holds, until `shutdown` is cancelled: the runtime's
/// [`drive_with`](sluice_runtime::operator::drive_with) with [`with_application_trigger`].
pub async fn drive(
    pins: Api<BundlePin>,
    applications: Api<Application>,
    watcher_config: watcher::Config,
    ctx: Arc<Context>,
    leadership: Leadership,
    shutdown: CancellationToken,
    hooks: Hooks,
) {
    let extend = with_application_trigger(applications, watcher_config.clone());
    drive_with(
        pins,
        watcher_config,
        ctx,
        reconcile::reconcile,
        leadership,
        shutdown,
        hooks,
        extend,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn pin(name: &str, targets: Value, status: Value) -> Arc<BundlePin> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "sluice.dev/v1alpha1",
                "kind": "BundlePin",
                "metadata": {"name": name, "namespace": "argocd"},
                "spec": {
                    "targets": targets,
                    "bundle": {"repository": "oci://r/mesh", "digest": format!("sha256:{}", "a".repeat(64))},
                    "publicKeysSecretRef": {"name": "cosign"},
                    "reason": "r",
                },
                "status": status,
            }))
            .unwrap(),
        )
    }

    fn app(namespace: &str, name: &str, patch: Value) -> Application {
        let mut body = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"project": "default", "destination": {"name": "c1"},
                     "source": {"repoURL": "oci://r/mesh", "targetRevision": "sha256:1"}},
            "status": {"sync": {"status": "OutOfSync", "revision": "sha256:1"},
                       "health": {"status": "Healthy"}, "reconciledAt": "2026-01-01T00:00:00Z"},
        });
        for (k, v) in patch.as_object().unwrap() {
            for (k2, v2) in v.as_object().unwrap() {
                body[k][k2] = v2.clone();
            }
        }
        serde_json::from_value(body).unwrap()
    }

    fn names(refs: Vec<ObjectRef<BundlePin>>) -> Vec<String> {
        let mut n: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        n.sort();
        n
    }

    #[test]
    fn an_application_wakes_the_live_pins_that_act_on_it() {
        let held = json!({"phase": "Pinned", "toDigest": "sha256:x", "applications": [
            {"name": "mesh-c1", "namespace": "argocd", "state": "Pinned"}]});
        let pins = vec![
            pin("default-ns", json!([{"name": "mesh-c1"}]), json!(null)),
            pin(
                "explicit-ns",
                json!([{"name": "mesh-c1", "namespace": "argocd"}]),
                json!({"phase": "Pinning"}),
            ),
            pin("other-app", json!([{"name": "mesh-c2"}]), json!(null)),
            pin(
                "other-ns",
                json!([{"name": "mesh-c1", "namespace": "team"}]),
                json!(null),
            ),
            pin(
                "released",
                json!([{"name": "mesh-c1"}]),
                json!({"phase": "Released"}),
            ),
            pin(
                "refused",
                json!([{"name": "mesh-c1"}]),
                json!({"phase": "Refused"}),
            ),
            // The status holds mesh-c1 although the spec (changed) lists mesh-c2.
            pin("recorded", json!([{"name": "mesh-c2"}]), held),
        ];
        let table = [
            (
                "argocd",
                "mesh-c1",
                vec!["default-ns", "explicit-ns", "recorded"],
            ),
            ("argocd", "mesh-c2", vec!["other-app"]),
            ("team", "mesh-c1", vec!["other-ns"]),
            ("argocd", "unrelated", vec![]),
        ];
        for (ns, name, want) in table {
            assert_eq!(names(pins_for(ns, name, &pins)), want, "{ns}/{name}");
        }
    }

    #[test]
    fn only_changes_a_pin_reads_wake_it() {
        let pins = vec![pin("p", json!([{"name": "mesh-c1"}]), json!(null))];
        let trigger = ApplicationTrigger::default();
        let base = app("argocd", "mesh-c1", json!({}));
        assert_eq!(names(trigger.map(&base, &pins)), vec!["p"], "first sight");
        let table = [
            ("same object again", json!({}), false),
            (
                "health and reconciledAt",
                json!({"status": {"health": {"status": "Progressing"}, "reconciledAt": "2026-01-01T00:01:00Z"}}),
                false,
            ),
            (
                "synced",
                json!({"status": {"sync": {"status": "Synced", "revision": "sha256:1"}}}),
                true,
            ),
            (
                "new revision",
                json!({"status": {"sync": {"status": "Synced", "revision": "sha256:2"}}}),
                true,
            ),
            (
                "sync policy",
                json!({"spec": {"syncPolicy": {"automated": {"enabled": false}}}}),
                true,
            ),
            (
                "sync running",
                json!({"status": {"operationState": {"phase": "Running"}}}),
                true,
            ),
            (
                "tracked resources",
                json!({"status": {"resources": [{"kind": "HTTPRoute", "name": "r"}]}}),
                true,
            ),
        ];
        for (name, patch, wakes) in table {
            // Each row starts from the base as last seen.
            trigger.map(&base, &pins);
            let changed = app("argocd", "mesh-c1", patch);
            let got = trigger.map(&changed, &pins);
            assert_eq!(!got.is_empty(), wakes, "{name}");
        }
    }
}
