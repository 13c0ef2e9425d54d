//! The application controller: compares every Application's desired manifests with the live
//! objects of its destination cluster on every resync and on change, reports `status.sync`,
//! `status.health`, `status.resources`, `status.conditions` and `status.reconciledAt`, runs
//! sync operations (manual via the top-level `operation` field, or automated by the rules in
//! [`crate::plan`]) wave by wave under the `argocd-controller` field manager with annotation
//! tracking, honours termination (`status.operationState.phase: Terminating`), prunes, and
//! deletes an Application's resources when it is deleted with the resources finalizer.
//!
//! It writes to the management cluster only Applications (status, the consumed `operation`,
//! removed refresh annotations and finalizers), and to destination clusters only the objects of
//! an Application's source and the objects carrying its tracking id. It never writes to an
//! object another Application tracks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::ArgoCdOptions;
use crate::clusters::{Cluster, Clusters};
use crate::diff;
use crate::driver::Next;
use crate::error::ArgoCdError;
use crate::events;
use crate::health::{self, HealthStatus};
use crate::plan::{self, AutoSync, AutoSyncInput, LastOperation, ResourceKey};
use crate::source::{Desired, Sources};
use crate::types::*;

/// Condition types written in `status.conditions`.
pub mod conditions {
    /// The source could not be fetched or compared.
    pub const COMPARISON_ERROR: &str = "ComparisonError";
    /// The spec cannot be acted on (unknown destination, several sources).
    pub const INVALID_SPEC_ERROR: &str = "InvalidSpecError";
    /// The last sync failed.
    pub const SYNC_ERROR: &str = "SyncError";
}

/// The `ApiResource` of Applications.
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "Application"),
        "applications",
    )
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// (server, apiVersion, kind) of a discovered resource.
type DiscoveryKey = (String, String, String);

/// Shared state of the application controller.
pub(crate) struct AppCtx {
    client: Client,
    pub(crate) apps: Api<DynamicObject>,
    pub(crate) namespace: String,
    pub(crate) options: ArgoCdOptions,
    pub(crate) clusters: Arc<Clusters>,
    pub(crate) sources: Sources,
    discovery: Mutex<HashMap<DiscoveryKey, (ApiResource, bool)>>,
}

/// One desired resource, ready to compare and apply.
#[derive(Clone, Debug)]
struct DesiredResource {
    key: ResourceKey,
    version: String,
    resource: ApiResource,
    namespaced: bool,
    object: Value,
    wave: i64,
}

/// A tracked live resource not in the source.
#[derive(Clone, Debug)]
struct Extra {
    key: ResourceKey,
    version: String,
    resource: ApiResource,
    namespaced: bool,
    prune_disabled: bool,
    /// `argocd.argoproj.io/compare-options: IgnoreExtraneous`: Argo CD still lists it as
    /// OutOfSync and requiring pruning, but it does not make the Application OutOfSync
    /// (`controller/state.go`); a sync with prune still deletes it.
    ignore_extraneous: bool,
}

/// The outcome of one comparison.
#[derive(Debug)]
struct Comparison {
    revision: String,
    desired: Vec<DesiredResource>,
    live: HashMap<ResourceKey, Value>,
    synced: BTreeMap<ResourceKey, bool>,
    extras: Vec<Extra>,
    resources: Vec<Value>,
    health: HealthStatus,
    health_message: String,
}

impl Comparison {
    fn in_sync(&self) -> bool {
        self.synced.values().all(|s| *s) && self.extras.iter().all(|e| e.ignore_extraneous)
    }
}

fn split_api_version(api_version: &str) -> (String, String) {
    match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    }
}

fn dyn_api(
    client: &Client,
    ar: &ApiResource,
    namespaced: bool,
    namespace: &str,
) -> Api<DynamicObject> {
    if namespaced {
        Api::namespaced_with(client.clone(), namespace, ar)
    } else {
        Api::all_with(client.clone(), ar)
    }
}

fn to_dynamic(value: &Value) -> Result<DynamicObject, ArgoCdError> {
    serde_json::from_value(value.clone()).map_err(|e| ArgoCdError::InvalidSpec {
        application: String::new(),
        reason: format!("object is not a Kubernetes object: {e}"),
    })
}

fn to_value(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// Merge patch from the last applied configuration to the desired one (client-side apply).
fn three_way(last: &Value, desired: &Value) -> Value {
    match (last, desired) {
        (Value::Object(l), Value::Object(d)) => {
            let mut out = serde_json::Map::new();
            for (k, v) in d {
                out.insert(
                    k.clone(),
                    match l.get(k) {
                        Some(lv) if lv.is_object() && v.is_object() => three_way(lv, v),
                        _ => v.clone(),
                    },
                );
            }
            for k in l.keys() {
                if !d.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        (_, d) => d.clone(),
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl AppCtx {
    pub(crate) fn new(
        mgmt: Client,
        options: ArgoCdOptions,
        clusters: Arc<Clusters>,
    ) -> Result<Self, ArgoCdError> {
        Ok(AppCtx {
            client: mgmt.clone(),
            apps: Api::namespaced_with(mgmt, &options.namespace, &application_resource()),
            namespace: options.namespace.clone(),
            sources: Sources::new(&options.insecure_registries)?,
            options,
            clusters,
            discovery: Mutex::new(HashMap::new()),
        })
    }

    async fn discover(
        &self,
        client: &Client,
        server: &str,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), ArgoCdError> {
        let key = (
            server.to_string(),
            api_version.to_string(),
            kind.to_string(),
        );
        if let Some(found) = self.discovery.lock().await.get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = split_api_version(api_version);
        let gvk = GroupVersionKind::gvk(&group, &version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| ArgoCdError::UnknownKind {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                cluster: server.to_string(),
                reason: e.to_string(),
            })?;
        let found = (ar, caps.scope == kube::discovery::Scope::Namespaced);
        self.discovery.lock().await.insert(key, found.clone());
        Ok(found)
    }

    fn instance(&self, app: &DynamicObject) -> String {
        plan::app_instance(
            app.namespace().as_deref().unwrap_or(&self.namespace),
            &app.name_any(),
            &self.namespace,
        )
    }

    /// Compares the source at `revision` (empty: targetRevision) with the destination.
    async fn compare(
        &self,
        app: &DynamicObject,
        spec: &ApplicationSpec,
        src: &ApplicationSource,
        cluster: &Cluster,
        client: &Client,
        revision: &str,
    ) -> Result<Comparison, ArgoCdError> {
        let Desired { revision, objects } = self.sources.fetch(src, revision).await?;
        let instance = self.instance(app);
        let server = cluster.info.server.clone();
        let default_ns = spec
            .destination
            .namespace
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let mut desired = Vec::new();
        for obj in objects.iter() {
            let api_version = obj
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
            let (ar, namespaced) = self.discover(client, &server, api_version, kind).await?;
            let mut object = obj.clone();
            let namespace = if namespaced {
                let ns = obj
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .unwrap_or_else(|| default_ns.clone());
                object["metadata"]["namespace"] = json!(ns);
                ns
            } else {
                if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("namespace");
                }
                String::new()
            };
            let key = ResourceKey {
                group: ar.group.clone(),
                kind: kind.to_string(),
                namespace,
                name: obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            };
            object["metadata"]["annotations"][TRACKING_ANNOTATION] =
                json!(plan::tracking_id(&instance, &key));
            let wave = plan::sync_wave(&object);
            desired.push(DesiredResource {
                key,
                version: ar.version.clone(),
                resource: ar,
                namespaced,
                object,
                wave,
            });
        }
        // One list per kind gives both the live state of desired resources and the tracked
        // resources no longer desired (every kind this Application had or has).
        let mut live = HashMap::new();
        // Tracked resources no longer desired: look through every kind this Application had or has.
        let desired_keys: BTreeSet<ResourceKey> = desired.iter().map(|d| d.key.clone()).collect();
        let mut kinds: BTreeMap<(String, String), String> = desired
            .iter()
            .map(|d| {
                (
                    (d.key.group.clone(), d.key.kind.clone()),
                    d.resource.api_version.clone(),
                )
            })
            .collect();
        for r in app
            .data
            .pointer("/status/resources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let group = r.get("group").and_then(Value::as_str).unwrap_or_default();
            let version = r.get("version").and_then(Value::as_str).unwrap_or_default();
            let kind = r.get("kind").and_then(Value::as_str).unwrap_or_default();
            let api_version = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            kinds
                .entry((group.to_string(), kind.to_string()))
                .or_insert(api_version);
        }
        let mut extras = Vec::new();
        for ((_, kind), api_version) in kinds {
            let Ok((ar, namespaced)) = self.discover(client, &server, &api_version, &kind).await
            else {
                continue;
            };
            let list = Api::<DynamicObject>::all_with(client.clone(), &ar)
                .list(&ListParams::default())
                .await
                .map_err(|e| ArgoCdError::kube(format!("listing {kind} on {server}"), e))?;
            for obj in list.items {
                let key = ResourceKey {
                    group: ar.group.clone(),
                    kind: kind.clone(),
                    namespace: obj.namespace().unwrap_or_default(),
                    name: obj.name_any(),
                };
                if desired_keys.contains(&key) {
                    live.insert(key, to_value(&obj));
                    continue;
                }
                let Some(id) = obj.annotations().get(TRACKING_ANNOTATION) else {
                    continue;
                };
                let Some((owner, _)) = plan::parse_tracking_id(id) else {
                    continue;
                };
                if owner != instance {
                    continue;
                }
                if obj.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let prune_disabled = obj
                    .annotations()
                    .get(SYNC_OPTIONS_ANNOTATION)
                    .is_some_and(|o| o.split(',').any(|x| x.trim() == "Prune=false"));
                let ignore_extraneous = obj
                    .annotations()
                    .get(COMPARE_OPTIONS_ANNOTATION)
                    .is_some_and(|o| o.split(',').any(|x| x.trim() == "IgnoreExtraneous"));
                extras.push(Extra {
                    key,
                    version: ar.version.clone(),
                    resource: ar.clone(),
                    namespaced,
                    prune_disabled,
                    ignore_extraneous,
                });
            }
        }
        // Per-resource verdicts.
        let mut synced = BTreeMap::new();
        let mut resources = Vec::new();
        let mut healths = Vec::new();
        let mut health_messages = Vec::new();
        for d in &desired {
            let rules: Vec<&IgnoreDifference> = spec
                .ignore_differences
                .iter()
                .filter(|r| {
                    diff::rule_applies(r, &d.key.group, &d.key.kind, &d.key.namespace, &d.key.name)
                })
                .collect();
            let (is_synced, h) = match live.get(&d.key) {
                None => (
                    false,
                    Some(health::Health {
                        status: HealthStatus::Missing,
                        message: String::new(),
                    }),
                ),
                Some(l) => (
                    diff::in_sync(&d.object, l, &rules),
                    health::assess(&d.key.group, &d.key.kind, l),
                ),
            };
            synced.insert(d.key.clone(), is_synced);
            let mut entry = json!({
                "group": d.key.group, "version": d.version, "kind": d.key.kind,
                "namespace": d.key.namespace, "name": d.key.name,
                "status": if is_synced { "Synced" } else { "OutOfSync" },
            });
            if d.wave != 0 {
                entry["syncWave"] = json!(d.wave);
            }
            if let Some(h) = h {
                entry["health"] = if h.message.is_empty() {
                    json!({"status": h.status.as_str()})
                } else {
                    json!({"status": h.status.as_str(), "message": h.message})
                };
                if h.status != HealthStatus::Healthy && !h.message.is_empty() {
                    health_messages.push(h.message.clone());
                }
                healths.push(h.status);
            }
            resources.push(entry);
        }
        for e in &extras {
            resources.push(json!({
                "group": e.key.group, "version": e.version, "kind": e.key.kind,
                "namespace": e.key.namespace, "name": e.key.name,
                "status": "OutOfSync", "requiresPruning": true,
            }));
        }
        resources.sort_by_key(|r| {
            (
                r["group"].as_str().unwrap_or_default().to_string(),
                r["kind"].as_str().unwrap_or_default().to_string(),
                r["namespace"].as_str().unwrap_or_default().to_string(),
                r["name"].as_str().unwrap_or_default().to_string(),
            )
        });
        Ok(Comparison {
            revision,
            desired,
            live,
            synced,
            extras,
            resources,
            health: health::aggregate(&healths),
            health_message: health_messages.first().cloned().unwrap_or_default(),
        })
    }

    /// Writes the comparison part of the status (never `operationState`).
    async fn write_comparison(
        &self,
        app: &DynamicObject,
        spec: &ApplicationSpec,
        comparison: Result<&Comparison, &ArgoCdError>,
    ) -> Result<(), ArgoCdError> {
        let status = app.data.get("status").cloned().unwrap_or(json!({}));
        let now = now();
        let mut conds: Vec<(&str, String)> = Vec::new();
        let mut patch = json!({
            "reconciledAt": now,
            "controllerNamespace": self.namespace,
            "sourceType": "Directory",
        });
        match comparison {
            Ok(c) => {
                let compared_to = json!({"source": spec.source, "destination": spec.destination});
                patch["sync"] = json!({
                    "status": if c.in_sync() { "Synced" } else { "OutOfSync" },
                    "revision": c.revision,
                    "comparedTo": compared_to,
                });
                let old_health = status.pointer("/health/status").and_then(Value::as_str);
                let transition = if old_health == Some(c.health.as_str()) {
                    status
                        .pointer("/health/lastTransitionTime")
                        .cloned()
                        .unwrap_or(json!(now))
                } else {
                    json!(now)
                };
                // An empty message is written as null so the merge patch removes a stale one.
                let message = (!c.health_message.is_empty()).then(|| c.health_message.clone());
                patch["health"] = json!({"status": c.health.as_str(), "message": message,
                                         "lastTransitionTime": transition});
                patch["resources"] = json!(c.resources);
            }
            Err(e) => {
                let kind = match e {
                    ArgoCdError::UnknownCluster { .. } | ArgoCdError::InvalidSpec { .. } => {
                        conditions::INVALID_SPEC_ERROR
                    }
                    _ => conditions::COMPARISON_ERROR,
                };
                conds.push((kind, e.to_string()));
                patch["sync"] = json!({"status": "Unknown", "comparedTo": {"source": spec.source, "destination": spec.destination}});
                if status.pointer("/health/status").is_none() {
                    patch["health"] = json!({"status": "Unknown", "lastTransitionTime": now});
                }
            }
        }
        if let Some(phase) = status
            .pointer("/operationState/phase")
            .and_then(Value::as_str)
            && (phase == "Failed" || phase == "Error")
        {
            let message = status
                .pointer("/operationState/message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if message != "Operation terminated" {
                conds.push((conditions::SYNC_ERROR, message.to_string()));
            }
        }
        let old = status
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let conditions: Vec<Value> = conds
            .into_iter()
            .map(|(t, m)| {
                let time = old
                    .iter()
                    .find(|c| c["type"] == t && c["message"] == m.as_str())
                    .and_then(|c| c.get("lastTransitionTime").cloned())
                    .unwrap_or(json!(now));
                json!({"type": t, "message": m, "lastTransitionTime": time})
            })
            .collect();
        patch["conditions"] = if conditions.is_empty() {
            Value::Null
        } else {
            json!(conditions)
        };
        if status_unchanged(&patch, &status, self.options.resync) {
            return Ok(());
        }
        for (field, label) in [("sync", "sync"), ("health", "health")] {
            let old = status
                .pointer(&format!("/{field}/status"))
                .and_then(Value::as_str);
            let new = patch
                .pointer(&format!("/{field}/status"))
                .and_then(Value::as_str);
            if let (Some(old), Some(new)) = (old, new)
                && old != new
            {
                let message = format!("Updated {label} status: {old} -> {new}");
                events::emit(
                    &self.client,
                    app,
                    events::reasons::RESOURCE_UPDATED,
                    &message,
                    false,
                )
                .await;
            }
        }
        self.apps
            .patch(
                &app.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": patch})),
            )
            .await
            .map_err(|e| {
                ArgoCdError::kube(
                    format!("writing status of Application {}", app.name_any()),
                    e,
                )
            })?;
        Ok(())
    }

    /// Applies one object.
    async fn apply(
        &self,
        client: &Client,
        d: &DesiredResource,
        object: &Value,
        server_side: bool,
    ) -> Result<String, ArgoCdError> {
        let api = dyn_api(client, &d.resource, d.namespaced, &d.key.namespace);
        let action = format!("applying {}", d.key);
        if server_side {
            let mut obj = object.clone();
            obj["apiVersion"] = json!(d.resource.api_version);
            obj["kind"] = json!(d.key.kind);
            api.patch(
                &d.key.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
            .map_err(|e| ArgoCdError::kube(action, e))?;
            return Ok(format!(
                "{}/{} serverside-applied",
                d.key.kind.to_lowercase(),
                d.key.name
            ));
        }
        let mut obj = object.clone();
        let mut last = object.clone();
        if let Some(a) = last
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            a.remove(LAST_APPLIED);
        }
        obj["metadata"]["annotations"][LAST_APPLIED] = json!(last.to_string());
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api
            .get_opt(&d.key.name)
            .await
            .map_err(|e| ArgoCdError::kube(action.clone(), e))?
        {
            None => {
                api.create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &to_dynamic(&obj)?,
                )
                .await
                .map_err(|e| ArgoCdError::kube(action, e))?;
                Ok(format!(
                    "{}/{} created",
                    d.key.kind.to_lowercase(),
                    d.key.name
                ))
            }
            Some(live) => {
                let previous: Value = live
                    .annotations()
                    .get(LAST_APPLIED)
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(json!({}));
                let patch = three_way(&previous, &obj);
                api.patch(&d.key.name, &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(|e| ArgoCdError::kube(action, e))?;
                Ok(format!(
                    "{}/{} configured",
                    d.key.kind.to_lowercase(),
                    d.key.name
                ))
            }
        }
    }

    /// Re-reads the Application; `true` when a client asked to terminate the running operation.
    async fn terminating(&self, name: &str) -> Result<(bool, DynamicObject), ArgoCdError> {
        let app = self
            .apps
            .get(name)
            .await
            .map_err(|e| ArgoCdError::kube(format!("reading Application {name}"), e))?;
        let t = app
            .data
            .pointer("/status/operationState/phase")
            .and_then(Value::as_str)
            == Some("Terminating");
        Ok((t, app))
    }

    /// Updates `status.operationState` (fields merged) with a resourceVersion precondition;
    /// `Ok(false)` when a client set Terminating meanwhile (nothing written).
    async fn write_operation(
        &self,
        name: &str,
        update: &Value,
        extra: Option<&Value>,
    ) -> Result<bool, ArgoCdError> {
        for _ in 0..20 {
            let (terminating, mut app) = self.terminating(name).await?;
            if terminating && update.get("phase").and_then(Value::as_str) != Some("Failed") {
                return Ok(false);
            }
            let mut state = app
                .data
                .pointer("/status/operationState")
                .cloned()
                .unwrap_or(json!({}));
            if let (Some(s), Some(u)) = (state.as_object_mut(), update.as_object()) {
                for (k, v) in u {
                    if v.is_null() {
                        s.remove(k);
                    } else {
                        s.insert(k.clone(), v.clone());
                    }
                }
            }
            if !app.data.get("status").is_some_and(Value::is_object) {
                app.data["status"] = json!({});
            }
            app.data["status"]["operationState"] = state;
            if let Some(Value::Object(extra)) = extra {
                for (k, v) in extra {
                    app.data["status"][k] = v.clone();
                }
            }
            match self.apps.replace(name, &PostParams::default(), &app).await {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    return Err(ArgoCdError::kube(
                        format!("writing operationState of Application {name}"),
                        e,
                    ));
                }
            }
        }
        Err(ArgoCdError::InvalidSpec {
            application: name.to_string(),
            reason:
                "operationState kept conflicting with other writers; retrying on the next resync"
                    .into(),
        })
    }

    /// Waits until every resource of a wave is healthy (or has no health check); `Ok(false)`
    /// when terminated meanwhile.
    async fn wait_healthy(
        &self,
        name: &str,
        client: &Client,
        wave: &[DesiredResource],
    ) -> Result<bool, ArgoCdError> {
        let mut announced = String::new();
        loop {
            if self.terminating(name).await?.0 {
                return Ok(false);
            }
            let mut waiting = None;
            for d in wave {
                let api = dyn_api(client, &d.resource, d.namespaced, &d.key.namespace);
                let live = api
                    .get_opt(&d.key.name)
                    .await
                    .map_err(|e| ArgoCdError::kube(format!("reading {}", d.key), e))?;
                let healthy = live.map(|l| to_value(&l)).is_some_and(|l| {
                    health::assess(&d.key.group, &d.key.kind, &l)
                        .is_none_or(|h| h.status == HealthStatus::Healthy)
                });
                if !healthy {
                    waiting = Some(d);
                    break;
                }
            }
            let Some(d) = waiting else { return Ok(true) };
            let message = format!(
                "waiting for healthy state of {}/{}/{}",
                d.key.group, d.key.kind, d.key.name
            );
            if message != announced {
                if !self
                    .write_operation(name, &json!({"message": message}), None)
                    .await?
                {
                    return Ok(false);
                }
                announced = message;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs one sync operation to its end. `operation` is the requested operation as written.
    async fn run_operation(
        &self,
        app: &DynamicObject,
        spec: &ApplicationSpec,
        src: &ApplicationSource,
        cluster: &Cluster,
        client: &Client,
        operation: Value,
    ) -> Result<(), ArgoCdError> {
        let name = app.name_any();
        let op: Operation = serde_json::from_value(operation.clone()).unwrap_or_default();
        let sync = op.sync.clone().unwrap_or_default();
        let started = now();
        // Consume `operation` and record the running operation in one write.
        let mut fresh = self
            .apps
            .get(&name)
            .await
            .map_err(|e| ArgoCdError::kube(format!("reading Application {name}"), e))?;
        if let Some(m) = fresh.data.as_object_mut() {
            m.remove("operation");
        }
        if !fresh.data.get("status").is_some_and(Value::is_object) {
            fresh.data["status"] = json!({});
        }
        fresh.data["status"]["operationState"] = json!({
            "operation": operation, "phase": "Running", "message": "", "startedAt": started,
        });
        match self
            .apps
            .replace(&name, &PostParams::default(), &fresh)
            .await
        {
            Ok(_) => {}
            // Someone changed it meanwhile: the next reconcile starts over.
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            Err(e) => {
                return Err(ArgoCdError::kube(
                    format!("starting an operation on Application {name}"),
                    e,
                ));
            }
        }
        let target = if sync.revision.is_empty() {
            src.target_revision.as_str()
        } else {
            sync.revision.as_str()
        };
        let automated = op
            .initiated_by
            .as_ref()
            .and_then(|i| i.get("automated"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let started_message = if automated {
            format!("Initiated automated sync to '{target}'")
        } else {
            let user = op
                .initiated_by
                .as_ref()
                .and_then(|i| i.get("username"))
                .and_then(Value::as_str)
                .unwrap_or("Unknown user");
            format!("{user} initiated sync to {target}")
        };
        events::emit(
            &self.client,
            &fresh,
            events::reasons::OPERATION_STARTED,
            &started_message,
            false,
        )
        .await;
        let mut options = spec
            .sync_policy
            .as_ref()
            .map(|p| p.sync_options.clone())
            .unwrap_or_default();
        options.extend(sync.sync_options.iter().cloned());
        let outcome = self
            .sync_waves(&fresh, spec, src, cluster, client, &sync, &options)
            .await;
        let finished = now();
        let (phase, message, result, revision) = match outcome {
            Ok(SyncOutcome::Done { revision, results }) => (
                "Succeeded",
                "successfully synced (all tasks run)".to_string(),
                results,
                revision,
            ),
            Ok(SyncOutcome::Terminated { revision, results }) => (
                "Failed",
                "Operation terminated".to_string(),
                results,
                revision,
            ),
            Err(e) => (
                "Failed",
                format!("one or more objects failed to apply, reason: {e}"),
                Vec::new(),
                sync.revision.clone(),
            ),
        };
        let sync_result = json!({"resources": result, "revision": revision, "source": src});
        loop {
            let (terminating, current) = self.terminating(&name).await?;
            let (phase, message) = if terminating {
                ("Failed", "Operation terminated".to_string())
            } else {
                (phase, message.clone())
            };
            let mut extra = json!({});
            if phase == "Succeeded" {
                let mut history = current
                    .data
                    .pointer("/status/history")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let id = history
                    .iter()
                    .filter_map(|h| h.get("id").and_then(Value::as_i64))
                    .max()
                    .map_or(0, |m| m + 1);
                history.push(json!({
                    "id": id, "revision": revision, "deployedAt": finished, "deployStartedAt": started,
                    "source": src, "initiatedBy": op.initiated_by.clone().unwrap_or(json!({})),
                }));
                let limit = spec.revision_history_limit.unwrap_or(10).max(1) as usize;
                if history.len() > limit {
                    history.drain(..history.len() - limit);
                }
                extra["history"] = json!(history);
            }
            let update = json!({"phase": phase, "message": message, "finishedAt": finished, "syncResult": sync_result});
            // write_operation refuses non-Failed updates once Terminating; loop to write Failed.
            if self.write_operation(&name, &update, Some(&extra)).await? {
                let (text, warning) = if phase == "Succeeded" {
                    (format!("Sync operation to {revision} succeeded"), false)
                } else {
                    (
                        format!("Sync operation to {revision} failed: {message}"),
                        true,
                    )
                };
                events::emit(
                    &self.client,
                    &current,
                    events::reasons::OPERATION_COMPLETED,
                    &text,
                    warning,
                )
                .await;
                break;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn sync_waves(
        &self,
        app: &DynamicObject,
        spec: &ApplicationSpec,
        src: &ApplicationSource,
        cluster: &Cluster,
        client: &Client,
        sync: &SyncOperation,
        options: &[String],
    ) -> Result<SyncOutcome, ArgoCdError> {
        let name = app.name_any();
        let comparison = self
            .compare(app, spec, src, cluster, client, &sync.revision)
            .await?;
        let revision = comparison.revision.clone();
        let selected = |key: &ResourceKey| {
            sync.resources.is_empty()
                || sync.resources.iter().any(|r| {
                    r.group == key.group
                        && r.kind == key.kind
                        && r.name == key.name
                        && (r.namespace.is_empty() || r.namespace == key.namespace)
                })
        };
        let out_of_sync_only = has_option(options, "ApplyOutOfSyncOnly");
        let server_side = has_option(options, "ServerSideApply");
        let respect = has_option(options, "RespectIgnoreDifferences");
        let tasks: Vec<(i64, ResourceKey, DesiredResource)> = comparison
            .desired
            .iter()
            .filter(|d| selected(&d.key))
            .filter(|d| {
                !out_of_sync_only || !comparison.synced.get(&d.key).copied().unwrap_or(false)
            })
            .map(|d| (d.wave, d.key.clone(), d.clone()))
            .collect();
        let waves = plan::waves(&tasks);
        if has_option(options, "CreateNamespace")
            && let Some(namespace) = spec
                .destination
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
        {
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
            let object =
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
            namespaces
                .patch(
                    namespace,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Apply(&object),
                )
                .await
                .map_err(|e| {
                    ArgoCdError::kube(
                        format!("creating namespace {namespace} (CreateNamespace=true)"),
                        e,
                    )
                })?;
        }
        let mut results = Vec::new();
        let entry = |key: &ResourceKey, version: &str, status: &str, message: &str| {
            json!({"group": key.group, "version": version, "kind": key.kind, "namespace": key.namespace, "name": key.name,
                   "status": status, "message": message, "hookPhase": "Running", "syncPhase": "Sync"})
        };
        for (i, wave) in waves.iter().enumerate() {
            if self.terminating(&name).await?.0 {
                return Ok(SyncOutcome::Terminated { revision, results });
            }
            let mut applied = Vec::new();
            for (key, d) in wave {
                let rules: Vec<&IgnoreDifference> = spec
                    .ignore_differences
                    .iter()
                    .filter(|r| {
                        diff::rule_applies(r, &key.group, &key.kind, &key.namespace, &key.name)
                    })
                    .collect();
                let object = match (respect, comparison.live.get(key)) {
                    (true, Some(live)) => diff::respect_ignored(&d.object, live, &rules),
                    _ => d.object.clone(),
                };
                let message = self.apply(client, d, &object, server_side).await?;
                results.push(entry(key, &d.version, "Synced", &message));
                applied.push(d.clone());
            }
            if i + 1 < waves.len() {
                if !self.wait_healthy(&name, client, &applied).await? {
                    return Ok(SyncOutcome::Terminated { revision, results });
                }
                let deadline = tokio::time::Instant::now() + self.options.sync_wave_delay;
                while tokio::time::Instant::now() < deadline {
                    if self.terminating(&name).await?.0 {
                        return Ok(SyncOutcome::Terminated { revision, results });
                    }
                    tokio::time::sleep(
                        Duration::from_millis(100).min(self.options.sync_wave_delay),
                    )
                    .await;
                }
            }
        }
        for e in comparison.extras.iter().filter(|e| selected(&e.key)) {
            if !sync.prune {
                results.push(entry(
                    &e.key,
                    &e.version,
                    "PruneSkipped",
                    "ignored (requires pruning)",
                ));
                continue;
            }
            if e.prune_disabled {
                results.push(entry(
                    &e.key,
                    &e.version,
                    "PruneSkipped",
                    "ignored (no prune)",
                ));
                continue;
            }
            if self.terminating(&name).await?.0 {
                return Ok(SyncOutcome::Terminated { revision, results });
            }
            let api = dyn_api(client, &e.resource, e.namespaced, &e.key.namespace);
            match api.delete(&e.key.name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(err) => return Err(ArgoCdError::kube(format!("pruning {}", e.key), err)),
            }
            results.push(entry(&e.key, &e.version, "Pruned", "pruned"));
        }
        for r in &mut results {
            r["hookPhase"] = json!("Succeeded");
        }
        Ok(SyncOutcome::Done { revision, results })
    }

    /// Deletes every resource the Application tracks, then drops the resources finalizer.
    async fn finalize(&self, app: &DynamicObject) -> Result<Next, ArgoCdError> {
        let finalizers = app.finalizers().to_vec();
        let ours = |f: &String| f == RESOURCES_FINALIZER || f == RESOURCES_FINALIZER_BACKGROUND;
        if !finalizers.iter().any(ours) {
            return Ok(Next::Gone);
        }
        let spec: ApplicationSpec = app
            .data
            .get("spec")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .ok()
            .flatten()
            .unwrap_or_default();
        if let Ok(cluster) = self
            .clusters
            .resolve(
                spec.destination.name.as_deref(),
                spec.destination.server.as_deref(),
            )
            .await
        {
            let client = self.clusters.client(&cluster)?;
            let instance = self.instance(app);
            let mut kinds = BTreeSet::new();
            for r in app
                .data
                .pointer("/status/resources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let group = r.get("group").and_then(Value::as_str).unwrap_or_default();
                let version = r.get("version").and_then(Value::as_str).unwrap_or_default();
                let api_version = if group.is_empty() {
                    version.to_string()
                } else {
                    format!("{group}/{version}")
                };
                kinds.insert((
                    api_version,
                    r.get("kind")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
            for (api_version, kind) in kinds {
                let Ok((ar, namespaced)) = self
                    .discover(&client, &cluster.info.server, &api_version, &kind)
                    .await
                else {
                    continue;
                };
                let list = Api::<DynamicObject>::all_with(client.clone(), &ar)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| ArgoCdError::kube(format!("listing {kind} for deletion"), e))?;
                for obj in list.items {
                    let owned = obj
                        .annotations()
                        .get(TRACKING_ANNOTATION)
                        .and_then(|id| plan::parse_tracking_id(id))
                        .is_some_and(|(o, _)| o == instance);
                    if !owned {
                        continue;
                    }
                    let api = dyn_api(
                        &client,
                        &ar,
                        namespaced,
                        &obj.namespace().unwrap_or_default(),
                    );
                    match api
                        .delete(&obj.name_any(), &DeleteParams::background())
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => {
                            return Err(ArgoCdError::kube(
                                format!(
                                    "deleting {kind} {} of a deleted Application",
                                    obj.name_any()
                                ),
                                e,
                            ));
                        }
                    }
                }
            }
        }
        let remaining: Vec<String> = finalizers.into_iter().filter(|f| !ours(f)).collect();
        self.apps
            .patch(
                &app.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": remaining}})),
            )
            .await
            .map_err(|e| {
                ArgoCdError::kube(
                    format!(
                        "removing the resources finalizer of Application {}",
                        app.name_any()
                    ),
                    e,
                )
            })?;
        Ok(Next::Gone)
    }

    /// One reconcile of one Application.
    async fn reconcile(&self, name: &str, uid: &str) -> Result<Next, ArgoCdError> {
        let requeue = Next::Requeue(self.options.resync);
        let Some(app) = self
            .apps
            .get_opt(name)
            .await
            .map_err(|e| ArgoCdError::kube(format!("reading Application {name}"), e))?
        else {
            return Ok(Next::Gone);
        };
        if app.uid().as_deref() != Some(uid) {
            // Recreated under the same name: the new object has its own worker.
            return Ok(Next::Gone);
        }
        if app.metadata.deletion_timestamp.is_some() {
            return self.finalize(&app).await;
        }
        if app.annotations().contains_key(APP_REFRESH_ANNOTATION) {
            self.apps
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {APP_REFRESH_ANNOTATION: null}}}),
                    ),
                )
                .await
                .map_err(|e| {
                    ArgoCdError::kube(
                        format!("removing the refresh annotation of Application {name}"),
                        e,
                    )
                })?;
        }
        let spec: ApplicationSpec = match app
            .data
            .get("spec")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
        {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                let err = ArgoCdError::InvalidSpec {
                    application: name.into(),
                    reason: format!("spec does not parse: {e}"),
                };
                self.write_comparison(&app, &ApplicationSpec::default(), Err(&err))
                    .await?;
                return Ok(requeue);
            }
        };
        let src = match (&spec.source, spec.sources.is_empty()) {
            (Some(s), true) => s.clone(),
            _ => {
                let err = ArgoCdError::InvalidSpec {
                    application: name.into(),
                    reason: "exactly one spec.source is simulated (spec.sources with several sources is not); use spec.source".into(),
                };
                self.write_comparison(&app, &spec, Err(&err)).await?;
                return Ok(requeue);
            }
        };
        let cluster = match self
            .clusters
            .resolve(
                spec.destination.name.as_deref(),
                spec.destination.server.as_deref(),
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.write_comparison(&app, &spec, Err(&e)).await?;
                return Ok(requeue);
            }
        };
        let client = self.clusters.client(&cluster)?;
        // A leftover operation (a previous controller stopped mid-sync) is ended or rerun.
        let phase = app
            .data
            .pointer("/status/operationState/phase")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if phase == "Terminating" {
            self.write_operation(
                name,
                &json!({"phase": "Failed", "message": "Operation terminated", "finishedAt": now()}),
                None,
            )
            .await?;
            return Ok(Next::Requeue(Duration::from_millis(10)));
        }
        let requested = app
            .data
            .get("operation")
            .filter(|o| !o.is_null())
            .cloned()
            .or_else(|| {
                (phase == "Running")
                    .then(|| {
                        app.data
                            .pointer("/status/operationState/operation")
                            .cloned()
                    })
                    .flatten()
            });
        if let Some(operation) = requested {
            self.run_operation(&app, &spec, &src, &cluster, &client, operation)
                .await?;
            let app = self
                .apps
                .get(name)
                .await
                .map_err(|e| ArgoCdError::kube(format!("reading Application {name}"), e))?;
            let c = self.compare(&app, &spec, &src, &cluster, &client, "").await;
            self.write_comparison(&app, &spec, c.as_ref()).await?;
            return Ok(requeue);
        }
        let comparison = self.compare(&app, &spec, &src, &cluster, &client, "").await;
        self.write_comparison(&app, &spec, comparison.as_ref())
            .await?;
        let Ok(c) = comparison else {
            return Ok(requeue);
        };
        let last = app
            .data
            .pointer("/status/operationState")
            .map(|s| LastOperation {
                phase: s
                    .get("phase")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                revision: s
                    .pointer("/syncResult/revision")
                    .or_else(|| s.pointer("/operation/sync/revision"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            });
        let needs_apply: Vec<ResourceKey> = c
            .synced
            .iter()
            .filter(|(_, s)| !**s)
            .map(|(k, _)| k.clone())
            .collect();
        let decision = plan::auto_sync(&AutoSyncInput {
            automated: spec.sync_policy.as_ref().and_then(|p| p.automated.as_ref()),
            out_of_sync: !c.in_sync(),
            revision: &c.revision,
            last,
            needs_apply,
            needs_prune: c.extras.iter().map(|e| e.key.clone()).collect(),
            desired_empty: c.desired.is_empty(),
            busy: false,
        });
        if let AutoSync::Sync {
            prune, resources, ..
        } = decision
        {
            let resources: Vec<Value> = resources
                .iter()
                .map(|k| json!({"group": k.group, "kind": k.kind, "namespace": k.namespace, "name": k.name}))
                .collect();
            let mut sync = json!({"revision": c.revision, "prune": prune});
            if !resources.is_empty() {
                sync["resources"] = json!(resources);
            }
            let operation = json!({"sync": sync, "initiatedBy": {"automated": true}, "retry": {}});
            tracing::info!(application = name, revision = %c.revision, "automated sync");
            self.run_operation(&app, &spec, &src, &cluster, &client, operation)
                .await?;
            let app = self
                .apps
                .get(name)
                .await
                .map_err(|e| ArgoCdError::kube(format!("reading Application {name}"), e))?;
            let c = self.compare(&app, &spec, &src, &cluster, &client, "").await;
            self.write_comparison(&app, &spec, c.as_ref()).await?;
        }
        Ok(requeue)
    }
}

/// How long an unchanged status goes without a write of `reconciledAt` (at least the resync).
const RECONCILED_AT_REFRESH: Duration = Duration::from_secs(10);

/// Whether writing `patch` (a merge patch of `status`) would change nothing but a recent
/// `reconciledAt`: then it is skipped, so watchers of Applications are not woken every resync.
fn status_unchanged(patch: &Value, status: &Value, resync: Duration) -> bool {
    let Some(fields) = patch.as_object() else {
        return false;
    };
    let same = fields
        .iter()
        .filter(|(k, _)| *k != "reconciledAt")
        .all(
            |(k, new)| match (new, status.get(k).filter(|v| !v.is_null())) {
                (Value::Null, old) => old.is_none(),
                (new, Some(old)) if new.is_array() => new == old,
                (new, Some(old)) => diff::contained_in(new, old) && diff::contained_in(old, new),
                (_, None) => false,
            },
        );
    let fresh = status
        .get("reconciledAt")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .is_some_and(|t| {
            let age = jiff::Timestamp::now().duration_since(t);
            age.unsigned_abs() < RECONCILED_AT_REFRESH.max(resync)
        });
    same && fresh
}

enum SyncOutcome {
    Done {
        revision: String,
        results: Vec<Value>,
    },
    Terminated {
        revision: String,
        results: Vec<Value>,
    },
}

/// What of an Application, when changed, warrants an immediate reconcile (status writes of the
/// controller itself do not, except a client's Terminating).
fn trigger_hash(app: &DynamicObject) -> Option<u64> {
    crate::driver::predicate_hash(&json!({
        "spec": app.data.get("spec"),
        "operation": app.data.get("operation"),
        "phase": app.data.pointer("/status/operationState/phase"),
        "deleting": app.metadata.deletion_timestamp.is_some(),
        "finalizers": app.metadata.finalizers,
        "refresh": app.annotations().get(APP_REFRESH_ANNOTATION),
    }))
}

/// Runs the controller until the future is dropped.
pub(crate) async fn run(ctx: Arc<AppCtx>) {
    let (api, retry) = (ctx.apps.clone(), ctx.options.resync);
    crate::driver::drive_fallible(api, trigger_hash, "Application", retry, move |name, uid| {
        let ctx = ctx.clone();
        async move { ctx.reconcile(&name, &uid).await }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_side_apply_removes_what_was_applied_before_and_is_gone() {
        let last = json!({"data": {"a": "1", "b": "2"}, "metadata": {"labels": {"x": "1"}}});
        let desired = json!({"data": {"a": "1"}, "metadata": {"name": "n"}});
        assert_eq!(
            three_way(&last, &desired),
            json!({"data": {"a": "1", "b": null}, "metadata": {"name": "n", "labels": null}})
        );
    }

    #[test]
    fn unchanged_status_is_not_rewritten_while_fresh() {
        let now = jiff::Timestamp::now().to_string();
        let status = json!({"reconciledAt": now, "sync": {"status": "Synced", "revision": "r"},
                            "resources": [{"name": "a", "status": "Synced"}]});
        let resync = Duration::from_secs(1);
        let same = json!({"reconciledAt": "later", "sync": {"status": "Synced", "revision": "r"},
                          "resources": [{"name": "a", "status": "Synced"}], "conditions": null});
        assert!(status_unchanged(&same, &status, resync));
        let drifted = json!({"sync": {"status": "OutOfSync", "revision": "r"}});
        assert!(!status_unchanged(&drifted, &status, resync));
        let fewer = json!({"resources": [{"name": "a"}]});
        assert!(!status_unchanged(&fewer, &status, resync));
        let condition = json!({"conditions": [{"type": "ComparisonError"}]});
        assert!(!status_unchanged(&condition, &status, resync));
        let mut stale = status.clone();
        stale["reconciledAt"] = json!("2020-01-01T00:00:00Z");
        assert!(!status_unchanged(&same, &stale, resync));
    }

    #[test]
    fn own_status_writes_do_not_trigger() {
        let mut app: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a"}, "spec": {"project": "default"},
            "status": {"reconciledAt": "t1", "operationState": {"phase": "Running"}}
        }))
        .unwrap();
        let before = trigger_hash(&app);
        app.data["status"]["reconciledAt"] = json!("t2");
        assert_eq!(trigger_hash(&app), before);
        app.data["status"]["operationState"]["phase"] = json!("Terminating");
        assert_ne!(trigger_hash(&app), before);
    }
}
