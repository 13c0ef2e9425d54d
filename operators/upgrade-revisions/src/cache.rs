//! The watch caches the operator reads every tick: namespaces, workloads, PodDisruptionBudgets,
//! the injector webhooks' revision tags, and every meshed pod kept only as the operator's view of
//! it (never whole Pod objects: a cluster holds tens of thousands), with when each was first
//! seen. Owns reading a [`Fleet`] from them; never writes anything.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        admissionregistration::v1::MutatingWebhookConfiguration,
        apps::v1::{DaemonSet, Deployment, StatefulSet},
        core::v1::{Namespace, Pod, PodTemplateSpec},
        policy::v1::PodDisruptionBudget,
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use sluice_runtime::projection::Projection;
use tokio::task::JoinHandle;

use crate::{
    decide::Fleet,
    fleet::{self, NamespaceView, PodView, RESTARTED_AT_ANNOTATION, Workload, WorkloadView},
};

/// Watch caches of the objects the operator reads every tick. Pods are kept only as the
/// operator's views of them (never whole Pod objects: a cluster holds tens of thousands).
#[derive(Clone)]
pub struct FleetCache {
    pub(crate) namespaces: Store<Namespace>,
    pub(crate) views: PodViews,
    pub(crate) webhooks: Store<MutatingWebhookConfiguration>,
    pub(crate) deployments: Store<Deployment>,
    pub(crate) statefulsets: Store<StatefulSet>,
    pub(crate) daemonsets: Store<DaemonSet>,
    pub(crate) pdbs: Store<PodDisruptionBudget>,
    pub(crate) births: Births,
}

/// Every meshed pod as the operator reads it, kept up to date from the pod watch: each pod's
/// annotation is parsed once per change instead of once per tick (a tick reads every pod of the
/// cluster; at 40,000 pods the parsing would cost more than the rest of the tick).
#[derive(Clone, Default)]
pub(crate) struct PodViews(Arc<Mutex<Projection<PodKey, Arc<PodView>>>>);

/// A pod's (namespace, name).
pub(crate) type PodKey = (String, String);

impl PodViews {
    pub(crate) fn follow(&self, event: &watcher::Event<Pod>) {
        self.0.lock().expect("pod views lock").follow(
            event,
            |p| Some((p.namespace().unwrap_or_default(), p.name_any())),
            |p| PodView::from_pod(p).map(Arc::new),
        );
    }

    /// Whether every pod was listed once (until then the fleet is unknown, not empty).
    pub(crate) fn synced(&self) -> bool {
        self.0.lock().expect("pod views lock").synced()
    }

    /// Whether the pod `namespace/name` is known and not being deleted.
    pub(crate) fn alive(&self, key: &str) -> bool {
        let Some((ns, name)) = key.split_once('/') else {
            return false;
        };
        let ix = self.0.lock().expect("pod views lock");
        ix.entries()
            .get(&(ns.to_owned(), name.to_owned()))
            .is_some_and(|v| !v.terminating)
    }

    /// Every view, shared: a tick hands tens of thousands to `decide`.
    pub(crate) fn all(&self) -> Vec<Arc<PodView>> {
        self.0
            .lock()
            .expect("pod views lock")
            .entries()
            .values()
            .cloned()
            .collect()
    }
}

/// When each meshed pod created since the watch started was first seen: (time in ms,
/// namespace), oldest first, the last [`BIRTHS_KEPT`]. A new meshed pod is a new certificate,
/// so the births in the namespaces sluice is moving are its own issuance, timed within the
/// watch's delay of the certificate instead of the (much longer, load-dependent) delay between
/// an eviction and its replacement.
#[derive(Clone, Default)]
pub(crate) struct Births(Arc<Mutex<VecDeque<(i64, String)>>>);

/// How long births are kept.
pub(crate) const BIRTHS_KEPT: Duration = Duration::from_secs(600);

impl Births {
    pub(crate) fn record(&self, at: i64, namespace: String) {
        let mut b = self.0.lock().expect("births lock");
        b.push_back((at, namespace));
        let horizon = at - BIRTHS_KEPT.as_millis() as i64;
        while b.front().is_some_and(|(t, _)| *t < horizon) {
            b.pop_front();
        }
    }

    /// Births in `(from, to]` (ms) in namespaces `namespaces` holds.
    pub(crate) fn count(&self, from: i64, to: i64, namespaces: &BTreeSet<String>) -> u32 {
        let b = self.0.lock().expect("births lock");
        b.iter()
            .filter(|(t, ns)| *t > from && *t <= to && namespaces.contains(ns))
            .count() as u32
    }
}

/// Watches pods into their views, recording the first sighting of every meshed pod created
/// after the initial listing.
pub(crate) fn spawn_pod_watch(api: Api<Pod>, births: Births, views: PodViews) -> JoinHandle<()> {
    let mut known: std::collections::HashSet<String> = std::collections::HashSet::new();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .for_each(move |event| {
            if let Ok(e) = &event {
                views.follow(e);
            }
            match event {
                Ok(watcher::Event::InitApply(pod)) => {
                    known.insert(pod.uid().unwrap_or_default());
                }
                Ok(watcher::Event::Apply(pod)) => {
                    let meshed = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(fleet::injected_revision)
                        .is_some();
                    if known.insert(pod.uid().unwrap_or_default()) && meshed {
                        births.record(
                            Timestamp::now().as_millisecond(),
                            pod.namespace().unwrap_or_default(),
                        );
                    }
                }
                Ok(watcher::Event::Delete(pod)) => {
                    known.remove(&pod.uid().unwrap_or_default());
                }
                _ => {}
            }
            futures::future::ready(())
        });
    tokio::spawn(stream)
}

sluice_runtime::opaque_debug!(FleetCache);

pub(crate) fn spawn_reflector<K>(api: Api<K>) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    // Managed fields are never read: not kept.
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .modify(|o| o.meta_mut().managed_fields = None)
        .touched_objects()
        .for_each(|_| async {});
    (reader, tokio::spawn(stream))
}

impl FleetCache {
    /// Starts watching namespaces, pods and mutating webhook configurations; the returned tasks
    /// run until aborted.
    pub fn start(client: &Client) -> (Self, Vec<JoinHandle<()>>) {
        let births = Births::default();
        let (namespaces, a) = spawn_namespace_reflector(Api::<Namespace>::all(client.clone()));
        let views = PodViews::default();
        let b = spawn_pod_watch(
            Api::<Pod>::all(client.clone()),
            births.clone(),
            views.clone(),
        );
        let (webhooks, c) =
            spawn_reflector(Api::<MutatingWebhookConfiguration>::all(client.clone()));
        let (deployments, d) = spawn_reflector(Api::<Deployment>::all(client.clone()));
        let (statefulsets, e) = spawn_reflector(Api::<StatefulSet>::all(client.clone()));
        let (daemonsets, f) = spawn_reflector(Api::<DaemonSet>::all(client.clone()));
        let (pdbs, g) = spawn_reflector(Api::<PodDisruptionBudget>::all(client.clone()));
        (
            Self {
                namespaces,
                views,
                webhooks,
                deployments,
                statefulsets,
                daemonsets,
                pdbs,
                births,
            },
            vec![a, b, c, d, e, f, g],
        )
    }

    pub(crate) async fn ready(&self) -> bool {
        let wait = async {
            let _ = self.namespaces.wait_until_ready().await;
            let _ = self.webhooks.wait_until_ready().await;
            let _ = self.deployments.wait_until_ready().await;
            let _ = self.statefulsets.wait_until_ready().await;
            let _ = self.daemonsets.wait_until_ready().await;
            let _ = self.pdbs.wait_until_ready().await;
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .is_ok()
            && self.views.synced()
    }

    pub(crate) fn read(&self) -> Fleet {
        let namespaces = self
            .namespaces
            .state()
            .iter()
            .map(|n| NamespaceView::from_namespace(n))
            .collect();
        let pods = self.views.all();
        let mwcs: Vec<MutatingWebhookConfiguration> = self
            .webhooks
            .state()
            .iter()
            .map(|m| (**m).clone())
            .collect();
        let workloads = self.workloads();
        let restarted_at = workloads
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.restarted_at.clone()?)))
            .collect();
        Fleet {
            namespaces,
            pods,
            tags: revision_tags(&mwcs),
            restarted_at,
            workloads,
        }
    }

    /// Every Deployment, StatefulSet and DaemonSet as the availability floor reads it.
    pub(crate) fn workloads(&self) -> BTreeMap<(String, Workload), WorkloadView> {
        let mut pdbs: HashMap<String, Vec<LabelSelector>> = HashMap::new();
        for p in self.pdbs.state() {
            if let Some(sel) = p.spec.as_ref().and_then(|s| s.selector.clone()) {
                pdbs.entry(p.namespace().unwrap_or_default())
                    .or_default()
                    .push(sel);
            }
        }
        let mut out = BTreeMap::new();
        let mut add = |ns: String,
                       kind: &str,
                       name: String,
                       template: &PodTemplateSpec,
                       replicas: u32,
                       max_unavailable: Option<IntOrString>,
                       min_ready_seconds: Option<i32>| {
            let meta = template.metadata.as_ref();
            let labels = meta.and_then(|m| m.labels.clone()).unwrap_or_default();
            let pdb = pdbs
                .get(&ns)
                .is_some_and(|sels| sels.iter().any(|s| fleet::selects(s, &labels)));
            let restarted_at = meta
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
                .cloned();
            out.insert(
                (
                    ns,
                    Workload {
                        kind: kind.to_owned(),
                        name,
                    },
                ),
                WorkloadView {
                    replicas,
                    max_unavailable,
                    min_ready_seconds: min_ready_seconds.unwrap_or(0).max(0) as u32,
                    pdb,
                    restarted_at,
                },
            );
        };
        for d in self.deployments.state() {
            let spec = &d.spec;
            let max_unavailable = spec
                .strategy
                .as_ref()
                .filter(|s| s.type_.as_deref() != Some("Recreate"))
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone());
            add(
                d.namespace().unwrap_or_default(),
                "Deployment",
                d.name_any(),
                &spec.template,
                spec.replicas.unwrap_or(1).max(0) as u32,
                max_unavailable,
                spec.min_ready_seconds,
            );
        }
        for s in self.statefulsets.state() {
            let spec = &s.spec;
            let max_unavailable = spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone());
            add(
                s.namespace().unwrap_or_default(),
                "StatefulSet",
                s.name_any(),
                &spec.template,
                spec.replicas.unwrap_or(1).max(0) as u32,
                max_unavailable,
                spec.min_ready_seconds,
            );
        }
        for ds in self.daemonsets.state() {
            let spec = &ds.spec;
            let max_unavailable = spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.clone());
            let replicas = ds
                .status
                .as_ref()
                .map_or(0, |s| s.desired_number_scheduled.max(0) as u32);
            add(
                ds.namespace().unwrap_or_default(),
                "DaemonSet",
                ds.name_any(),
                &spec.template,
                replicas,
                max_unavailable,
                spec.min_ready_seconds,
            );
        }
        out
    }
}

/// Watches namespaces into a store, keeping only the managed-field entries of Argo CD's
/// managers (what [`fleet::argo_cd_manages_labels`] reads).
pub(crate) fn spawn_namespace_reflector(api: Api<Namespace>) -> (Store<Namespace>, JoinHandle<()>) {
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .modify(|ns| {
            if let Some(fields) = ns.metadata.managed_fields.as_mut() {
                fields.retain(|f| {
                    f.manager
                        .as_deref()
                        .is_some_and(|m| m.starts_with("argocd"))
                });
            }
        })
        .touched_objects()
        .for_each(|_| async {});
    (reader, tokio::spawn(stream))
}

/// Revision tags from the injector webhooks: `istio-revision-tag-<tag>` labelled
/// `istio.io/tag=<tag>` and `istio.io/rev=<revision>`.
pub fn revision_tags(mwcs: &[MutatingWebhookConfiguration]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for m in mwcs {
        let name = m.name_any();
        let Some(tag) = name.strip_prefix("istio-revision-tag-") else {
            continue;
        };
        let labels = m.labels();
        if let Some(rev) = labels.get("istio.io/rev") {
            let tag = labels
                .get("istio.io/tag")
                .cloned()
                .unwrap_or_else(|| tag.to_owned());
            out.insert(tag, rev.clone());
        }
    }
    out
}
