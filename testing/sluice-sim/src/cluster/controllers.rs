//! The I/O side of the cluster behaviour: kube-runtime controllers for the kubelet model (pod
//! phase and readiness), Deployments, StatefulSets, DaemonSets and PodDisruptionBudgets, fed by
//! one shared pod watch. Each reconcile reads its pods from that watch's index (workloads) or
//! fresh from the API (namespace labels and webhooks for injection), asks the pure planners in
//! [`super::rolling`],
//! [`super::pdb`] and [`super::injection`] what to do, does it, and writes status only when it
//! changed. Never touches an object it does not own except pod and workload status.

use super::injection::{self, Decision, Webhooks};
use super::pdb::{pdb_numbers, pending_disruptions};
use super::pods::{
    self, CONTROLLER_REVISION_HASH, Owner, POD_INDEX, POD_TEMPLATE_GENERATION, POD_TEMPLATE_HASH,
    STS_POD_NAME, controlled_by, is_ready, is_terminating, label, pod_from_template, template_hash,
};
use super::rolling::{
    self, DeploymentStrategy, NodePod, OrdinalPod, PodView, StatefulSetPolicy, scaled,
};
use super::{ClusterConfig, ClusterError, SvidCounter};
use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use sluice_runtime::projection::Projection;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How long a failed reconcile waits before retrying.
const RETRY: Duration = Duration::from_secs(1);

/// Reconciles in flight per controller.
const WORKERS: u16 = 16;

/// The running cluster-behaviour tasks of one cluster. Dropping it aborts them.
#[derive(Debug)]
pub struct ClusterTasks {
    handles: Vec<JoinHandle<()>>,
    svid: SvidCounter,
}

impl ClusterTasks {
    /// Starts the controllers `config` enables against `client`. Newly injected pods are counted
    /// on `svid`.
    pub fn start(client: Client, config: ClusterConfig, svid: SvidCounter) -> Self {
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            config: config.clone(),
            svid: svid.clone(),
            first_seen: Mutex::new(HashMap::new()),
            next_node: AtomicUsize::new(0),
            owned: Arc::default(),
        });
        let wc = watcher::Config::default;
        // Bounded like kube-controller-manager's workers (`--concurrent-*-syncs`), so a fleet
        // of tens of thousands of pods cannot open a connection per pending reconcile.
        let workers = || ControllerConfig::default().concurrency(WORKERS);
        let mut feed = PodFeed::new(client.clone(), ctx.owned.clone());
        let mut handles = Vec::new();
        if config.kubelet {
            let c = ctx.clone();
            handles.push(tokio::spawn(
                Controller::for_shared_stream(feed.subscribe(), feed.store())
                    .with_config(workers())
                    .run(reconcile_kubelet, error_policy, c)
                    .for_each(|_| async {}),
            ));
        }
        if config.node_objects {
            handles.push(tokio::spawn(super::nodes::run(
                client.clone(),
                config.clone(),
            )));
        }
        if config.workloads {
            handles.push(tokio::spawn(
                Controller::new(Api::<Deployment>::all(client.clone()), wc())
                    .owns_shared_stream(feed.subscribe())
                    .with_config(workers())
                    .run(reconcile_deployment, error_policy, ctx.clone())
                    .for_each(|_| async {}),
            ));
            handles.push(tokio::spawn(
                Controller::new(Api::<StatefulSet>::all(client.clone()), wc())
                    .owns_shared_stream(feed.subscribe())
                    .with_config(workers())
                    .run(reconcile_statefulset, error_policy, ctx.clone())
                    .for_each(|_| async {}),
            ));
            handles.push(tokio::spawn(
                Controller::new(Api::<DaemonSet>::all(client.clone()), wc())
                    .owns_shared_stream(feed.subscribe())
                    .with_config(workers())
                    .run(reconcile_daemonset, error_policy, ctx.clone())
                    .for_each(|_| async {}),
            ));
        }
        if config.workloads {
            handles.push(tokio::spawn(collect_garbage::<Deployment>(ctx.clone())));
            handles.push(tokio::spawn(collect_garbage::<StatefulSet>(ctx.clone())));
            handles.push(tokio::spawn(collect_garbage::<DaemonSet>(ctx.clone())));
        }
        if config.disruption {
            let controller = Controller::new(Api::<PodDisruptionBudget>::all(client.clone()), wc());
            let store = controller.store();
            handles.push(tokio::spawn(
                controller
                    .watches_shared_stream(feed.subscribe(), move |pod: Arc<Pod>| {
                        let labels = pod.labels().clone();
                        let ns = pod.namespace();
                        store
                            .state()
                            .into_iter()
                            .filter(|pdb| pdb.namespace() == ns && pdb_selects(pdb, &labels))
                            .map(|pdb| ObjectRef::from_obj(&*pdb))
                            .collect::<Vec<_>>()
                    })
                    .with_config(workers())
                    .run(reconcile_pdb, error_policy, ctx.clone())
                    .for_each(|_| async {}),
            ));
        }
        handles.push(feed.run());
        Self { handles, svid }
    }

    /// The cluster's SVID issuance counter.
    pub fn svid(&self) -> &SvidCounter {
        &self.svid
    }

    /// Stops every task.
    pub fn abort(&self) {
        for h in &self.handles {
            h.abort();
        }
    }
}

impl Drop for ClusterTasks {
    fn drop(&mut self) {
        self.abort();
    }
}

struct Ctx {
    client: Client,
    config: ClusterConfig,
    svid: SvidCounter,
    /// Pod uid → when the kubelet model first saw it (readiness is counted from there).
    first_seen: Mutex<HashMap<String, Instant>>,
    next_node: AtomicUsize,
    /// The workload controllers' view of their pods.
    owned: Arc<Mutex<OwnedPods>>,
}

/// Pods by their controller's uid, kept from the shared pod watch: what the workload
/// controllers read instead of listing the API on every reconcile, as kube-controller-manager
/// reads its informer cache (a list per pod event costs the API server the workload's size each
/// time). A controller records each pod it creates at once, so a reconcile that runs before the
/// watch shows the new pod does not create it again (kube-controller-manager's expectations).
/// A pod it deletes stays until the watch says so: a reconcile in between sees one pod too
/// many, never one too few, and the deletion's event reconciles again.
#[derive(Debug, Default)]
struct OwnedPods(Projection<(String, String), Arc<Pod>>);

impl OwnedPods {
    /// (controller uid, pod name); `None` for a pod without a controller.
    fn key(pod: &Pod) -> Option<(String, String)> {
        let uid = pod
            .metadata
            .owner_references
            .as_ref()?
            .iter()
            .find(|r| r.controller == Some(true))?
            .uid
            .clone();
        Some((uid, pod.name_any()))
    }

    /// Whether `new` is at least as recent as `held` (a recorded creation is not replaced by
    /// the watch's older copy).
    fn replaces(held: &Arc<Pod>, new: &Arc<Pod>) -> bool {
        let rv = |p: &Pod| p.metadata.resource_version.as_ref()?.parse::<u64>().ok();
        match (rv(held), rv(new)) {
            (Some(held), Some(new)) => new >= held,
            _ => true,
        }
    }

    /// Records a pod the controller just created.
    fn record(&mut self, pod: Arc<Pod>) {
        if let Some(key) = Self::key(&pod) {
            self.0.insert_by(key, pod, Self::replaces);
        }
    }

    /// Follows one event of the shared pod watch.
    fn follow(&mut self, event: &watcher::Event<Pod>) {
        self.0.follow_by(
            event,
            Self::key,
            |p| Some(Arc::new(p.clone())),
            Self::replaces,
        );
    }

    /// Non-terminating pods controlled by `uid`; `None` until the first list is complete.
    fn of(&self, uid: &str) -> Option<Vec<Arc<Pod>>> {
        if !self.0.synced() {
            return None;
        }
        Some(
            self.0
                .entries()
                .range((uid.to_owned(), String::new())..)
                .take_while(|((owner, _), _)| owner == uid)
                .map(|(_, p)| p)
                .filter(|p| !is_terminating(p))
                .cloned()
                .collect(),
        )
    }
}

impl Ctx {
    fn next_node(&self) -> Option<String> {
        if self.config.nodes.is_empty() {
            return None;
        }
        let i = self.next_node.fetch_add(1, Ordering::Relaxed) % self.config.nodes.len();
        Some(self.config.nodes[i].clone())
    }
}

/// One watch of every pod, shared by the simulator's controllers as kube-controller-manager's
/// informers are: one cache and one decode per event, however many controllers look at pods.
/// Every changed pod, deleted ones included (a Deployment replaces what was deleted), goes to
/// each subscriber.
struct PodFeed {
    client: Client,
    owned: Arc<Mutex<OwnedPods>>,
    reader: Store<Pod>,
    writer: Option<Writer<Pod>>,
    subscribers: Vec<mpsc::UnboundedSender<Arc<Pod>>>,
}

impl PodFeed {
    fn new(client: Client, owned: Arc<Mutex<OwnedPods>>) -> Self {
        let (reader, writer) = reflector::store();
        Self {
            client,
            owned,
            reader,
            writer: Some(writer),
            subscribers: Vec::new(),
        }
    }

    /// The shared cache of every pod.
    fn store(&self) -> Store<Pod> {
        self.reader.clone()
    }

    /// A stream of every pod that changes from now on.
    fn subscribe(&mut self) -> mpsc::UnboundedReceiver<Arc<Pod>> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.push(tx);
        rx
    }

    /// Starts the watch; subscribe first.
    fn run(&mut self) -> JoinHandle<()> {
        use kube::runtime::WatchStreamExt;
        let writer = self.writer.take().expect("a pod feed runs once");
        let subscribers = std::mem::take(&mut self.subscribers);
        let owned = self.owned.clone();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<Pod>::all(self.client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        tokio::spawn(stream.for_each(move |event| {
            // The index first: a controller woken by this event reads it.
            if let Ok(e) = &event {
                owned.lock().expect("owned pods lock").follow(e);
            }
            if let Ok(
                watcher::Event::Apply(pod)
                | watcher::Event::InitApply(pod)
                | watcher::Event::Delete(pod),
            ) = event
            {
                let pod = Arc::new(pod);
                for tx in &subscribers {
                    let _ = tx.unbounded_send(pod.clone());
                }
            }
            async {}
        }))
    }
}

fn error_policy<K>(_obj: Arc<K>, err: &ClusterError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(category = err.category(), error = %err, "cluster behaviour reconcile failed");
    match err {
        ClusterError::Invalid { .. } => Action::await_change(),
        ClusterError::Api { .. } => Action::requeue(RETRY),
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let action = action.into();
    move |source| ClusterError::Api { action, source }
}

fn is_status(err: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(err, kube::Error::Api(s) if check(s))
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn pdb_selects(pdb: &PodDisruptionBudget, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.clone()) else {
        return false;
    };
    Selector::try_from(sel).is_ok_and(|s| s.matches(labels))
}

// ---------------------------------------------------------------- garbage collection

/// Deletes the pods of a workload when the workload is deleted, as the garbage collector does
/// for dependents whose controller owner is gone (background propagation).
async fn collect_garbage<K>(ctx: Arc<Ctx>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::WatchStreamExt;
    let stream = watcher(
        Api::<K>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let Ok(watcher::Event::Delete(owner)) = event else {
            continue;
        };
        let (Some(ns), Some(uid)) = (owner.meta().namespace.clone(), owner.meta().uid.clone())
        else {
            continue;
        };
        let what = format!(
            "{} {ns}/{}",
            K::kind(&()),
            owner.meta().name.clone().unwrap_or_default()
        );
        let result = async {
            let names: Vec<String> = owned_pods(&ctx, &ns, &uid, None, &what)
                .await?
                .iter()
                .map(|p| p.name_any())
                .collect();
            delete_pods(&ctx, &ns, &names).await
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(category = e.category(), error = %e, "collecting the pods of a deleted workload failed");
        }
    }
}

// ---------------------------------------------------------------- kubelet

async fn reconcile_kubelet(pod: Arc<Pod>, ctx: Arc<Ctx>) -> Result<Action, ClusterError> {
    let uid = pod.uid().unwrap_or_default();
    if ctx.config.binds_and_finalizes
        && let Some(action) = bind_or_finalize(&pod, &ctx).await?
    {
        return Ok(action);
    }
    if is_terminating(&pod) || is_ready(&pod) {
        ctx.first_seen.lock().expect("first_seen lock").remove(&uid);
        return Ok(Action::await_change());
    }
    let first = *ctx
        .first_seen
        .lock()
        .expect("first_seen lock")
        .entry(uid.clone())
        .or_insert_with(Instant::now);
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let elapsed = first.elapsed();
    let now = now_rfc3339();
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
    if elapsed < ctx.config.readiness_delay {
        if phase.is_none() {
            let patch = json!({"status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            }});
            patch_pod_status(&api, &ns, &name, patch).await?;
        }
        return Ok(Action::requeue(ctx.config.readiness_delay - elapsed));
    }
    let containers: Vec<Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let ip = pod_ip(&uid);
    let host_ip = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .map_or_else(
            || super::nodes::node_ip(0),
            |n| super::nodes::ip_of(&ctx.config.nodes, n),
        );
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let patch = json!({"status": {
        "phase": "Running",
        "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "startTime": now,
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                       cond("ContainersReady"), cond("PodScheduled")],
        "containerStatuses": containers,
    }});
    patch_pod_status(&api, &ns, &name, patch).await?;
    ctx.first_seen.lock().expect("first_seen lock").remove(&uid);
    Ok(Action::await_change())
}

/// The kubelet's part on a real API server, where no scheduler runs and deletion is graceful: an
/// unscheduled pod is bound to the next node (the `binding` subresource, as kube-scheduler does);
/// a terminating pod bound to a node is removed once "its containers stopped" (deleted with grace
/// period 0, as the kubelet confirms). `None` when the pod needs neither.
async fn bind_or_finalize(pod: &Pod, ctx: &Ctx) -> Result<Option<Action>, ClusterError> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if is_terminating(pod) {
        if node.is_some() {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: pod.uid().map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                Err(e) if is_status(&e, |s| s.is_not_found() || s.code == 409) => {}
                Err(e) => return Err(api_err(format!("finalizing Pod {ns}/{name}"))(e)),
            }
        }
        return Ok(Some(Action::await_change()));
    }
    if node.is_none() {
        // A DaemonSet's pod names its node (required node affinity on `metadata.name`, as the
        // real DaemonSet controller writes it); any other pod goes to the next node.
        let Some(target) = required_node(pod).or_else(|| ctx.next_node()) else {
            return Ok(Some(Action::await_change()));
        };
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": target},
        });
        match api
            .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {}
            // Already bound (a second event of the same pod) or gone.
            Err(e) if is_status(&e, |s| s.is_not_found() || s.code == 409) => {}
            Err(e) => return Err(api_err(format!("binding Pod {ns}/{name} to {target}"))(e)),
        }
        // The bound pod comes back through the watch.
        return Ok(Some(Action::await_change()));
    }
    Ok(None)
}

/// The node a pod must run on by its required node affinity's `metadata.name` field (how the
/// DaemonSet controller places its pods), if it names exactly one.
fn required_node(pod: &Pod) -> Option<String> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.iter().flatten().find_map(|f| {
            (f.key == "metadata.name" && f.operator == "In")
                .then(|| f.values.as_ref().filter(|v| v.len() == 1)?.first().cloned())
                .flatten()
        })
    })
}

async fn patch_pod_status(
    api: &Api<Pod>,
    ns: &str,
    name: &str,
    patch: Value,
) -> Result<(), ClusterError> {
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, kube::core::Status::is_not_found) => Ok(()),
        Err(e) => Err(api_err(format!("writing status of Pod {ns}/{name}"))(e)),
    }
}

/// A stable fake pod IP in 10.0.0.0/8 derived from the uid.
fn pod_ip(uid: &str) -> String {
    let h = uid
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    format!(
        "10.{}.{}.{}",
        (h >> 16) & 0xff,
        (h >> 8) & 0xff,
        (h & 0xfe).max(2)
    )
}

// ---------------------------------------------------------------- shared workload plumbing

/// Non-terminating pods in `ns` controlled by `uid`: from the shared watch's index once it has
/// listed every pod ([`OwnedPods`]), until then read fresh from the API, listed by the
/// workload's `selector` when it has one, as kube-controller-manager does, so a reconcile reads
/// its own pods and not the whole namespace.
async fn owned_pods(
    ctx: &Ctx,
    ns: &str,
    uid: &str,
    selector: Option<&LabelSelector>,
    what: &str,
) -> Result<Vec<Arc<Pod>>, ClusterError> {
    if let Some(pods) = ctx.owned.lock().expect("owned pods lock").of(uid) {
        return Ok(pods);
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let params = match selector.map(|s| Selector::try_from(s.clone())) {
        Some(Ok(s)) => ListParams::default().labels_from(&s),
        // No selector, or one that selects nothing or cannot be expressed: list the namespace
        // and rely on the controller reference alone.
        _ => ListParams::default(),
    };
    let list = api
        .list(&params)
        .await
        .map_err(api_err(format!("listing pods of {what}")))?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| controlled_by(p, uid) && !is_terminating(p))
        .map(Arc::new)
        .collect())
}

/// Creates pods for one workload, injecting sidecars as the injector would. Namespace labels and
/// webhooks are read once per batch, fresh, so a relabel just before a restart is honoured.
struct PodCreator<'a> {
    ctx: &'a Ctx,
    ns: String,
    what: String,
    injection: Option<(BTreeMap<String, String>, Webhooks)>,
}

impl<'a> PodCreator<'a> {
    fn new(ctx: &'a Ctx, ns: &str, what: &str) -> Self {
        Self {
            ctx,
            ns: ns.to_string(),
            what: what.to_string(),
            injection: None,
        }
    }

    async fn create(&mut self, mut pod: Pod) -> Result<(), ClusterError> {
        if self.injection.is_none() {
            let ns_api: Api<Namespace> = Api::all(self.ctx.client.clone());
            let ns_labels = ns_api
                .get_opt(&self.ns)
                .await
                .map_err(api_err(format!("reading Namespace {}", self.ns)))?
                .map(|n| n.labels().clone())
                .unwrap_or_default();
            let mwcs: Api<MutatingWebhookConfiguration> = Api::all(self.ctx.client.clone());
            let list = mwcs
                .list(&ListParams::default())
                .await
                .map_err(api_err("listing MutatingWebhookConfigurations"))?;
            self.injection = Some((ns_labels, Webhooks::from_configurations(&list.items)));
        }
        let (ns_labels, webhooks) = self.injection.as_ref().expect("set above");
        let decision = injection::decide(
            ns_labels,
            pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            pod.metadata
                .annotations
                .as_ref()
                .unwrap_or(&BTreeMap::new()),
            webhooks,
        );
        let injected = match &decision {
            Decision::Inject(rev) => {
                injection::inject(&mut pod, rev);
                Some(rev.clone())
            }
            Decision::Skip(_) => None,
        };
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match api.create(&PostParams::default(), &pod).await {
            Ok(created) => {
                if let Some(rev) = &injected {
                    self.ctx.svid.issue_by(rev);
                }
                self.ctx
                    .owned
                    .lock()
                    .expect("owned pods lock")
                    .record(Arc::new(created));
                tracing::debug!(pod = %name, ns = %self.ns, owner = %self.what, ?decision, "created pod");
                Ok(())
            }
            // The previous pod of that name is still terminating; the next reconcile retries.
            Err(e) if is_status(&e, kube::core::Status::is_already_exists) => Ok(()),
            Err(e) => Err(api_err(format!(
                "creating Pod {}/{name} for {}",
                self.ns, self.what
            ))(e)),
        }
    }
}

async fn delete_pods(ctx: &Ctx, ns: &str, names: &[String]) -> Result<(), ClusterError> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for name in names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, kube::core::Status::is_not_found) => {}
            Err(e) => return Err(api_err(format!("deleting Pod {ns}/{name}"))(e)),
        }
    }
    Ok(())
}

/// Writes `status` (a JSON object) with a merge patch unless every key already has that value.
async fn write_status<K>(
    api: &Api<K>,
    obj: &K,
    status: Value,
    what: &str,
) -> Result<(), ClusterError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let current = serde_json::to_value(obj)
        .ok()
        .and_then(|v| v.get("status").cloned())
        .unwrap_or(Value::Null);
    let unchanged = status
        .as_object()
        .is_some_and(|m| m.iter().all(|(k, v)| current.get(k) == Some(v)));
    if unchanged {
        return Ok(());
    }
    match api
        .patch_status(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, kube::core::Status::is_not_found) => Ok(()),
        Err(e) => Err(api_err(format!("writing status of {what}"))(e)),
    }
}

struct Identity {
    ns: String,
    name: String,
    uid: String,
    generation: i64,
    what: String,
}

fn identity<K: Resource<DynamicType = ()>>(obj: &K) -> Result<Identity, ClusterError> {
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let name = obj.meta().name.clone().unwrap_or_default();
    let what = format!("{} {ns}/{name}", K::kind(&()));
    let uid = obj
        .meta()
        .uid
        .clone()
        .ok_or_else(|| ClusterError::Invalid {
            what: what.clone(),
            field: "metadata.uid",
        })?;
    Ok(Identity {
        ns,
        name,
        uid,
        generation: obj.meta().generation.unwrap_or(0),
        what,
    })
}

// ---------------------------------------------------------------- Deployment

async fn reconcile_deployment(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, ClusterError> {
    if d.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let id = identity(&*d)?;
    let spec = &d.spec;
    let replicas = spec.replicas.unwrap_or(1);
    let hash = template_hash(&spec.template);
    let owned = owned_pods(&ctx, &id.ns, &id.uid, Some(&spec.selector), &id.what).await?;
    let views: Vec<PodView> = owned
        .iter()
        .map(|p| PodView {
            name: p.name_any(),
            updated: label(p, POD_TEMPLATE_HASH) == Some(hash.as_str()),
            ready: is_ready(p),
        })
        .collect();
    let strategy = spec.strategy.clone().unwrap_or_default();
    let resolved = if strategy.type_.as_deref() == Some("Recreate") {
        DeploymentStrategy::Recreate
    } else {
        let ru = strategy.rolling_update.unwrap_or_default();
        let quarter = IntOrString::String("25%".into());
        DeploymentStrategy::RollingUpdate {
            max_surge: scaled(ru.max_surge.as_ref().unwrap_or(&quarter), replicas, true),
            max_unavailable: scaled(
                ru.max_unavailable.as_ref().unwrap_or(&quarter),
                replicas,
                false,
            ),
        }
    };
    let plan = rolling::plan_deployment(replicas, resolved, &views);
    delete_pods(&ctx, &id.ns, &plan.delete).await?;
    let owner = Owner {
        kind: "Deployment",
        name: id.name.clone(),
        uid: id.uid.clone(),
    };
    let mut creator = PodCreator::new(&ctx, &id.ns, &id.what);
    for _ in 0..plan.create {
        let name = format!("{}-{hash}-{}", id.name, pods::random_suffix());
        let extra = BTreeMap::from([(POD_TEMPLATE_HASH.to_string(), hash.clone())]);
        let pod = pod_from_template(&spec.template, &owner, &id.ns, name, extra, ctx.next_node());
        creator.create(pod).await?;
    }
    let total = views.len() as i32;
    let updated = views.iter().filter(|v| v.updated).count() as i32;
    let ready = views.iter().filter(|v| v.ready).count() as i32;
    let max_unavailable = match resolved {
        DeploymentStrategy::RollingUpdate {
            max_unavailable, ..
        } => max_unavailable,
        DeploymentStrategy::Recreate => 0,
    };
    let available = ready >= replicas - max_unavailable;
    let complete = updated == replicas && total == replicas && ready == replicas;
    let status = json!({
        "observedGeneration": id.generation,
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": (replicas - ready).max(0),
        "conditions": [
            {"type": "Available", "status": if available { "True" } else { "False" },
             "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }},
            {"type": "Progressing", "status": "True",
             "reason": if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" }},
        ],
    });
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &id.ns);
    write_status(&api, &*d, status, &id.what).await?;
    Ok(Action::await_change())
}

// ---------------------------------------------------------------- StatefulSet

async fn reconcile_statefulset(s: Arc<StatefulSet>, ctx: Arc<Ctx>) -> Result<Action, ClusterError> {
    if s.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let id = identity(&*s)?;
    let spec = &s.spec;
    let replicas = spec.replicas.unwrap_or(1).max(0) as u32;
    let revision = format!("{}-{}", id.name, template_hash(&spec.template));
    let owned = owned_pods(&ctx, &id.ns, &id.uid, Some(&spec.selector), &id.what).await?;
    let prefix = format!("{}-", id.name);
    let views: Vec<OrdinalPod> = owned
        .iter()
        .filter_map(|p| {
            let name = p.name_any();
            let ordinal = name.strip_prefix(&prefix)?.parse().ok()?;
            Some(OrdinalPod {
                ordinal,
                name,
                updated: label(p, CONTROLLER_REVISION_HASH) == Some(revision.as_str()),
                ready: is_ready(p),
            })
        })
        .collect();
    let update = spec.update_strategy.clone().unwrap_or_default();
    let policy = StatefulSetPolicy {
        parallel: spec.pod_management_policy.as_deref() == Some("Parallel"),
        on_delete: update.type_.as_deref() == Some("OnDelete"),
        partition: update
            .rolling_update
            .and_then(|r| r.partition)
            .unwrap_or(0)
            .max(0) as u32,
    };
    let plan = rolling::plan_statefulset(replicas, policy, &views);
    delete_pods(&ctx, &id.ns, &plan.delete).await?;
    let owner = Owner {
        kind: "StatefulSet",
        name: id.name.clone(),
        uid: id.uid.clone(),
    };
    let mut creator = PodCreator::new(&ctx, &id.ns, &id.what);
    for ordinal in &plan.create {
        let name = format!("{}-{ordinal}", id.name);
        let extra = BTreeMap::from([
            (CONTROLLER_REVISION_HASH.to_string(), revision.clone()),
            (STS_POD_NAME.to_string(), name.clone()),
            (POD_INDEX.to_string(), ordinal.to_string()),
        ]);
        let pod = pod_from_template(&spec.template, &owner, &id.ns, name, extra, ctx.next_node());
        creator.create(pod).await?;
    }
    let total = views.len() as i32;
    let updated = views.iter().filter(|v| v.updated).count() as i32;
    let ready = views.iter().filter(|v| v.ready).count() as i32;
    let current_revision = if updated == total {
        revision.clone()
    } else {
        s.status
            .as_ref()
            .and_then(|st| st.current_revision.clone())
            .unwrap_or_else(|| revision.clone())
    };
    let status = json!({
        "observedGeneration": id.generation,
        "replicas": total,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": if updated == total { total } else { total - updated },
        "updatedReplicas": updated,
        "currentRevision": current_revision,
        "updateRevision": revision,
    });
    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &id.ns);
    write_status(&api, &*s, status, &id.what).await?;
    Ok(Action::await_change())
}

// ---------------------------------------------------------------- DaemonSet

async fn reconcile_daemonset(ds: Arc<DaemonSet>, ctx: Arc<Ctx>) -> Result<Action, ClusterError> {
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let id = identity(&*ds)?;
    let spec = &ds.spec;
    let hash = template_hash(&spec.template);
    let owned = owned_pods(&ctx, &id.ns, &id.uid, Some(&spec.selector), &id.what).await?;
    let views: Vec<NodePod> = owned
        .iter()
        .map(|p| NodePod {
            node: p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            name: p.name_any(),
            updated: label(p, CONTROLLER_REVISION_HASH) == Some(hash.as_str()),
            ready: is_ready(p),
        })
        .collect();
    let nodes = &ctx.config.nodes;
    let n = nodes.len() as i32;
    let update = spec.update_strategy.clone().unwrap_or_default();
    let plan = if update.type_.as_deref() == Some("OnDelete") {
        // Only replace what is missing; never roll.
        let mut p = rolling::plan_daemonset(nodes, 0, 1, &views);
        let old: Vec<String> = views
            .iter()
            .filter(|v| !v.updated)
            .map(|v| v.name.clone())
            .collect();
        p.delete.retain(|d| !old.contains(d));
        p.create_on
            .retain(|node| !views.iter().any(|v| &v.node == node));
        p
    } else {
        let ru = update.rolling_update.unwrap_or_default();
        let surge = ru
            .max_surge
            .as_ref()
            .map(|v| scaled(v, n, true))
            .unwrap_or(0);
        let unavailable = ru
            .max_unavailable
            .as_ref()
            .map(|v| scaled(v, n, false))
            .unwrap_or(1);
        rolling::plan_daemonset(nodes, surge, unavailable, &views)
    };
    delete_pods(&ctx, &id.ns, &plan.delete).await?;
    let owner = Owner {
        kind: "DaemonSet",
        name: id.name.clone(),
        uid: id.uid.clone(),
    };
    let mut creator = PodCreator::new(&ctx, &id.ns, &id.what);
    for node in &plan.create_on {
        let name = format!("{}-{}", id.name, pods::random_suffix());
        let extra = BTreeMap::from([
            (CONTROLLER_REVISION_HASH.to_string(), hash.clone()),
            (
                POD_TEMPLATE_GENERATION.to_string(),
                id.generation.to_string(),
            ),
        ]);
        let pod = pod_from_template(
            &spec.template,
            &owner,
            &id.ns,
            name,
            extra,
            Some(node.clone()),
        );
        creator.create(pod).await?;
    }
    let on_node = |node: &String| {
        let node = node.clone();
        views.iter().filter(move |v| v.node == node)
    };
    let scheduled = nodes
        .iter()
        .filter(|nd| on_node(nd).next().is_some())
        .count() as i32;
    let ready = nodes
        .iter()
        .filter(|nd| on_node(nd).any(|v| v.ready))
        .count() as i32;
    let updated = nodes
        .iter()
        .filter(|nd| on_node(nd).any(|v| v.updated))
        .count() as i32;
    let status = json!({
        "observedGeneration": id.generation,
        "desiredNumberScheduled": n,
        "currentNumberScheduled": scheduled,
        "numberMisscheduled": 0,
        "numberReady": ready,
        "numberAvailable": ready,
        "numberUnavailable": (n - ready).max(0),
        "updatedNumberScheduled": updated,
    });
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &id.ns);
    write_status(&api, &*ds, status, &id.what).await?;
    Ok(Action::await_change())
}

// ---------------------------------------------------------------- PodDisruptionBudget

async fn reconcile_pdb(
    pdb: Arc<PodDisruptionBudget>,
    ctx: Arc<Ctx>,
) -> Result<Action, ClusterError> {
    let id = identity(&*pdb)?;
    let spec = pdb.spec.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &id.ns);
    let pods = api
        .list(&ListParams::default())
        .await
        .map_err(api_err(format!("listing pods for {}", id.what)))?;
    let matching: Vec<&Pod> = pods
        .items
        .iter()
        .filter(|p| !is_terminating(p) && pdb_selects(&pdb, p.labels()))
        .collect();
    let recorded = pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.clone())
        .unwrap_or_default();
    let recorded: BTreeMap<String, String> = recorded
        .into_iter()
        .map(|(k, v)| {
            (
                k,
                serde_json::to_value(v)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            )
        })
        .collect();
    let live: std::collections::BTreeSet<String> = matching.iter().map(|p| p.name_any()).collect();
    let pending = pending_disruptions(&recorded, &live, jiff::Timestamp::now());
    let healthy = matching
        .iter()
        .filter(|p| is_ready(p) && !pending.contains(&p.name_any()))
        .count() as i32;
    let mut owners: BTreeMap<(String, String), ()> = BTreeMap::new();
    let mut orphans = 0;
    for p in &matching {
        match p
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true))
        {
            Some(r) => {
                owners.insert((r.kind.clone(), r.name.clone()), ());
            }
            None => orphans += 1,
        }
    }
    let mut scale = orphans;
    for (kind, name) in owners.keys() {
        scale += owner_scale(&ctx, &id.ns, kind, name).await?;
    }
    let n = pdb_numbers(
        spec.min_available.as_ref(),
        spec.max_unavailable.as_ref(),
        matching.len() as i32,
        healthy,
        scale,
    );
    let allowed = n.disruptions_allowed > 0;
    let unchanged = pdb.status.as_ref().is_some_and(|s| {
        s.current_healthy == Some(n.current_healthy)
            && s.desired_healthy == Some(n.desired_healthy)
            && s.disruptions_allowed == Some(n.disruptions_allowed)
            && s.expected_pods == Some(n.expected_pods)
            && s.observed_generation == Some(id.generation)
    }) && pending.len() == recorded.len();
    if unchanged {
        return Ok(Action::await_change());
    }
    let status = json!({
        "observedGeneration": id.generation,
        "currentHealthy": n.current_healthy,
        "desiredHealthy": n.desired_healthy,
        "disruptionsAllowed": n.disruptions_allowed,
        "expectedPods": n.expected_pods,
        "disruptedPods": pending
            .iter()
            .map(|k| (k.clone(), json!(recorded[k])))
            .collect::<serde_json::Map<String, Value>>(),
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": if allowed { "True" } else { "False" },
            "reason": if allowed { "SufficientPods" } else { "InsufficientPods" },
            "message": "",
            "observedGeneration": id.generation,
            "lastTransitionTime": now_rfc3339(),
        }],
    });
    // Replace (not patch) with the resourceVersion the decision was made from: an eviction that
    // spent a disruption in the meantime makes this write fail with 409 instead of undoing it.
    let mut next = (*pdb).clone();
    let status_value = status;
    next.status =
        Some(
            serde_json::from_value(status_value).map_err(|_| ClusterError::Invalid {
                what: id.what.clone(),
                field: "status",
            })?,
        );
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &id.ns);
    match pdbs
        .replace_status(&id.name, &PostParams::default(), &next)
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(e) if is_status(&e, kube::core::Status::is_not_found) => Ok(Action::await_change()),
        Err(e) if is_status(&e, kube::core::Status::is_conflict) => {
            Ok(Action::requeue(Duration::from_millis(50)))
        }
        Err(e) => Err(api_err(format!("writing status of {}", id.what))(e)),
    }
}

/// The desired pod count of a pod's controller (1 for kinds the simulator does not know).
async fn owner_scale(ctx: &Ctx, ns: &str, kind: &str, name: &str) -> Result<i32, ClusterError> {
    let what = format!("reading {kind} {ns}/{name} for its scale");
    let scale = match kind {
        "Deployment" => Api::<Deployment>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(api_err(what))?
            .map(|d| d.spec.replicas.unwrap_or(1)),
        "StatefulSet" => Api::<StatefulSet>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(api_err(what))?
            .map(|d| d.spec.replicas.unwrap_or(1)),
        "DaemonSet" => Some(ctx.config.nodes.len() as i32),
        _ => Some(1),
    };
    Ok(scale.unwrap_or(0))
}
