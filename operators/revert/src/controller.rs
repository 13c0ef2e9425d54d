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
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
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

/// An Application by namespace and name.
type Key = (String, String);

fn key(app: &Application) -> Key {
    (app.namespace().unwrap_or_default(), app.name_any())
}

/// Maps the Application watch's events to the pins they wake, dropping changes that do not
/// matter to a pin (same [`fingerprint`] as last seen).
///
/// Keeps one fingerprint per Application it has seen and forgets it when the watch reports the
/// Application deleted (a `Delete` event, with or without a finalizer), when it carries a
/// `deletionTimestamp`, or when a relist of the watch no longer lists it (deleted while the
/// watch was down). So it holds at most one entry per Application that exists.
#[derive(Debug, Default)]
pub struct ApplicationTrigger {
    state: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The fingerprint last seen per Application.
    prints: HashMap<Key, u64>,
    /// During a relist (between `Init` and `InitDone`): the Applications listed so far.
    relisted: Option<HashSet<Key>>,
}

impl ApplicationTrigger {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `namespace/name` is remembered (its fingerprint kept).
    pub fn remembers(&self, namespace: &str, name: &str) -> bool {
        self.seen()
            .prints
            .contains_key(&(namespace.to_owned(), name.to_owned()))
    }

    /// How many Applications are remembered.
    pub fn remembered(&self) -> usize {
        self.seen().prints.len()
    }

    /// Forgets everything (a new watch starts: its first list wakes what a pin reads).
    pub fn clear(&self) {
        *self.seen() = Seen::default();
    }

    /// The pins one event of the Application watch wakes, given the pins known now: a change
    /// that matters to them, a deletion, or an Application a relist no longer lists.
    pub fn on_event(
        &self,
        event: &watcher::Event<Application>,
        pins: &[Arc<BundlePin>],
    ) -> Vec<ObjectRef<BundlePin>> {
        match event {
            watcher::Event::Init => {
                self.seen().relisted = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(app) => {
                self.seen()
                    .relisted
                    .get_or_insert_with(HashSet::new)
                    .insert(key(app));
                self.map(app, pins)
            }
            watcher::Event::InitDone => {
                let gone: Vec<Key> = {
                    let mut seen = self.seen();
                    let listed = seen.relisted.take().unwrap_or_default();
                    let gone: Vec<Key> = seen
                        .prints
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    for k in &gone {
                        seen.prints.remove(k);
                    }
                    gone
                };
                gone.iter()
                    .flat_map(|(ns, name)| pins_for(ns, name, pins))
                    .collect()
            }
            watcher::Event::Apply(app) => self.map(app, pins),
            watcher::Event::Delete(app) => {
                let (ns, name) = key(app);
                self.seen().prints.remove(&(ns.clone(), name.clone()));
                pins_for(&ns, &name, pins)
            }
        }
    }

    /// The pins `app`'s change wakes, given the pins known now (one being deleted is
    /// forgotten and wakes its pins).
    pub fn map(&self, app: &Application, pins: &[Arc<BundlePin>]) -> Vec<ObjectRef<BundlePin>> {
        let key = key(app);
        {
            let mut seen = self.seen();
            if app.metadata.deletion_timestamp.is_some() {
                seen.prints.remove(&key);
            } else if seen.prints.insert(key.clone(), fingerprint(app)) == Some(fingerprint(app)) {
                return Vec::new();
            }
        }
        pins_for(&key.0, &key.1, pins)
    }
}

/// Adds the Application watch to each new BundlePin controller through `trigger`: a change that
/// matters to a pin (same [`fingerprint`] as last seen: no) and a deletion reconcile the live
/// pins targeting the Application. Each controller gets its own watch; `trigger` is cleared when
/// one starts.
pub fn application_trigger(
    applications: Api<Application>,
    watcher_config: watcher::Config,
    trigger: Arc<ApplicationTrigger>,
) -> impl Fn(Controller<BundlePin>) -> Controller<BundlePin> {
    move |controller| {
        trigger.clear();
        let pins: Store<BundlePin> = controller.store();
        let trigger = trigger.clone();
        let wakes = watcher::watcher(applications.clone(), watcher_config.clone())
            .default_backoff()
            .flat_map(move |event| {
                let refs = match event {
                    Ok(event) => trigger.on_event(&event, &pins.state()),
                    Err(e) => {
                        tracing::warn!(error = %e, "Application watch failed; retrying with back-off");
                        Vec::new()
                    }
                };
                futures::stream::iter(refs)
            });
        controller.reconcile_on(wakes)
    }
}

/// [`application_trigger`] with a trigger of its own.
pub fn with_application_trigger(
    applications: Api<Application>,
    watcher_config: watcher::Config,
) -> impl Fn(Controller<BundlePin>) -> Controller<BundlePin> {
    application_trigger(applications, watcher_config, Arc::default())
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

    #[test]
    fn an_application_deleted_without_a_finalizer_is_forgotten() {
        let pins = vec![pin("p", json!([{"name": "mesh-c1"}]), json!(null))];
        let trigger = ApplicationTrigger::default();
        let (c1, c2) = (
            app("argocd", "mesh-c1", json!({})),
            app("argocd", "mesh-c2", json!({})),
        );
        trigger.on_event(&watcher::Event::Apply(c1.clone()), &pins);
        trigger.on_event(&watcher::Event::Apply(c2.clone()), &pins);
        assert_eq!(trigger.remembered(), 2);

        // Deleted without a finalizer: the watch's Delete event carries the object as it was,
        // without a deletionTimestamp.
        assert_eq!(
            names(trigger.on_event(&watcher::Event::Delete(c1.clone()), &pins)),
            vec!["p"],
            "its pins wake"
        );
        assert!(!trigger.remembers("argocd", "mesh-c1"), "forgotten");
        assert!(
            trigger.remembers("argocd", "mesh-c2"),
            "the other one stays"
        );

        // Deleted with a finalizer: the update that sets deletionTimestamp forgets it already.
        let mut deleting = c2.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        trigger.on_event(&watcher::Event::Apply(deleting), &pins);
        assert_eq!(trigger.remembered(), 0);
    }

    #[test]
    fn a_relist_forgets_applications_deleted_while_the_watch_was_down() {
        let pins = vec![pin("p", json!([{"name": "mesh-c1"}]), json!(null))];
        let trigger = ApplicationTrigger::default();
        let (c1, c2) = (
            app("argocd", "mesh-c1", json!({})),
            app("argocd", "mesh-c2", json!({})),
        );
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(c1.clone()),
            watcher::Event::InitApply(c2.clone()),
            watcher::Event::InitDone,
        ] {
            trigger.on_event(&e, &pins);
        }
        assert_eq!(trigger.remembered(), 2);

        // The watch restarts; mesh-c1 was deleted meanwhile, mesh-c2 is unchanged.
        let woken: Vec<Vec<String>> = [
            watcher::Event::Init,
            watcher::Event::InitApply(c2.clone()),
            watcher::Event::InitDone,
        ]
        .iter()
        .map(|e| names(trigger.on_event(e, &pins)))
        .collect();
        assert_eq!(
            woken,
            vec![vec![], vec![], vec!["p".to_owned()]],
            "an unchanged Application wakes nothing; the pin of the one gone wakes at InitDone"
        );
        assert!(!trigger.remembers("argocd", "mesh-c1"));
        assert!(trigger.remembers("argocd", "mesh-c2"));
    }
}
