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

use futures::{FutureExt, StreamExt};
use kube::{
    Api, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt,
        reflector::{self, ObjectRef, Store},
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

/// The Applications that exist, by name only: a reflector of their metadata.
pub type PresentApplications = Store<PartialObjectMeta<Application>>;

/// Maps Application changes to the pins they wake, dropping changes that do not matter to a
/// pin (same [`fingerprint`] as last seen).
///
/// The watch behind [`Controller::watches`] hands a deleted Application to the mapper like an
/// updated one; without a finalizer it carries no `deletionTimestamp`. So the fingerprints are
/// kept only for Applications `present` lists: one that is absent is forgotten when it is seen,
/// and the others it no longer lists are pruned as soon as more are remembered than exist.
#[derive(Debug, Default)]
pub struct ApplicationTrigger {
    seen: Mutex<HashMap<(String, String), u64>>,
    /// The Applications that exist (`None`: unknown, every Application is taken as present).
    present: Option<PresentApplications>,
}

impl ApplicationTrigger {
    /// A trigger that forgets Applications `present` no longer lists.
    pub fn new(present: PresentApplications) -> Self {
        Self {
            seen: Mutex::default(),
            present: Some(present),
        }
    }

    /// The store of present Applications, once it has listed them (before: `None`).
    fn present(&self) -> Option<&PresentApplications> {
        self.present
            .as_ref()
            .filter(|s| matches!(s.wait_until_ready().now_or_never(), Some(Ok(()))))
    }

    /// Whether `namespace/name` is remembered (its fingerprint kept).
    pub fn remembers(&self, namespace: &str, name: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(namespace.to_owned(), name.to_owned()))
    }

    /// How many Applications are remembered.
    pub fn remembered(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The pins `app`'s change wakes, given the pins known now.
    pub fn map(&self, app: &Application, pins: &[Arc<BundlePin>]) -> Vec<ObjectRef<BundlePin>> {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        let print = fingerprint(app);
        let present = self.present();
        let exists = |(ns, name): &(String, String)| {
            present.is_none_or(|s| s.get(&ObjectRef::new(name).within(ns)).is_some())
        };
        let gone = app.metadata.deletion_timestamp.is_some() || !exists(&key);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = present
                && seen.len() > s.len()
            {
                seen.retain(|k, _| exists(k));
            }
            if gone {
                seen.remove(&key);
            } else if seen.insert(key.clone(), print) == Some(print) {
                return Vec::new();
            }
        }
        pins_for(&key.0, &key.1, pins)
    }
}

/// Starts a reflector of the Applications' metadata (names only kept) from `applications`;
/// it runs as long as the process.
pub fn present_applications(
    applications: Api<Application>,
    watcher_config: watcher::Config,
) -> PresentApplications {
    let (store, writer) = reflector::store();
    // The same scope as `applications`, metadata only.
    let metadata: Api<PartialObjectMeta<Application>> = match applications.namespace() {
        Some(ns) => Api::namespaced(applications.clone().into_client(), ns),
        None => Api::all(applications.clone().into_client()),
    };
    let stream = watcher::watcher(metadata, watcher_config)
        .default_backoff()
        .modify(|m| {
            m.metadata.managed_fields = None;
            m.metadata.annotations = None;
            m.metadata.labels = None;
            m.metadata.owner_references = None;
        })
        .reflect(writer)
        .for_each(|event| {
            if let Err(e) = event {
                tracing::warn!(error = %e, "Application metadata watch failed; retrying with back-off");
            }
            std::future::ready(())
        });
    tokio::spawn(stream);
    store
}

/// Adds the Application watch to a new BundlePin controller: a change that matters to a pin
/// (same [`fingerprint`] as last seen: no) reconciles the live pins targeting the Application.
/// Starts the metadata reflector ([`present_applications`]) its triggers forget deleted
/// Applications by, once for every controller it extends.
pub fn with_application_trigger(
    applications: Api<Application>,
    watcher_config: watcher::Config,
) -> impl Fn(Controller<BundlePin>) -> Controller<BundlePin> {
    let present = present_applications(applications.clone(), watcher_config.clone());
    move |controller| {
        let pins: Store<BundlePin> = controller.store();
        let trigger = ApplicationTrigger::new(present.clone());
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

    fn present(name: &str) -> PartialObjectMeta<Application> {
        use kube::core::PartialObjectMetaExt;
        kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("argocd".into()),
            ..Default::default()
        }
        .into_request_partial()
    }

    #[test]
    fn an_application_deleted_without_a_finalizer_is_forgotten() {
        let pins = vec![pin("p", json!([{"name": "mesh-c1"}]), json!(null))];
        let (store, mut writer) = reflector::store();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(present("mesh-c1")),
            watcher::Event::InitApply(present("mesh-c2")),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&e);
        }
        let trigger = ApplicationTrigger::new(store);
        let (c1, c2) = (
            app("argocd", "mesh-c1", json!({})),
            app("argocd", "mesh-c2", json!({})),
        );
        trigger.map(&c1, &pins);
        trigger.map(&c2, &pins);
        assert_eq!(trigger.remembered(), 2);

        // mesh-c1 is deleted (no finalizer, so no deletionTimestamp): the metadata watch drops
        // it, and the controller's watch hands the deleted object to the mapper as it was.
        writer.apply_watcher_event(&watcher::Event::Delete(present("mesh-c1")));
        assert_eq!(
            names(trigger.map(&c1, &pins)),
            vec!["p"],
            "its pins still wake"
        );
        assert!(!trigger.remembers("argocd", "mesh-c1"), "forgotten");

        // The other order: the mapper sees the deletion first (remembered as an update), the
        // metadata watch drops it after; the next event of any Application prunes it.
        trigger.map(&c2, &pins);
        let c3 = app("argocd", "mesh-c3", json!({}));
        writer.apply_watcher_event(&watcher::Event::Apply(present("mesh-c3")));
        trigger.map(&c3, &pins);
        assert!(trigger.remembers("argocd", "mesh-c3"));
        writer.apply_watcher_event(&watcher::Event::Delete(present("mesh-c3")));
        trigger.map(&c2, &pins);
        assert!(!trigger.remembers("argocd", "mesh-c3"), "pruned");
        assert_eq!(trigger.remembered(), 1, "only mesh-c2 remains");

        // A deletion missed while the watch was down: the relist no longer lists mesh-c2.
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            writer.apply_watcher_event(&e);
        }
        trigger.map(&app("argocd", "mesh-c4", json!({})), &pins);
        assert_eq!(
            trigger.remembered(),
            0,
            "nothing that is gone stays remembered"
        );
    }

    #[test]
    fn before_the_metadata_list_every_application_counts_as_present() {
        let pins = vec![pin("p", json!([{"name": "mesh-c1"}]), json!(null))];
        let (store, _writer) = reflector::store();
        let trigger = ApplicationTrigger::new(store);
        let c1 = app("argocd", "mesh-c1", json!({}));
        assert_eq!(names(trigger.map(&c1, &pins)), vec!["p"]);
        assert!(
            trigger.map(&c1, &pins).is_empty(),
            "an unchanged one is deduplicated"
        );
    }
}
