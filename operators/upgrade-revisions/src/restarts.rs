//! Carrying out a decision's actions after its status was written: Events, relabels (applied
//! only while the label still has the expected value), and restarts paced at their granted
//! times by a scheduler in the background — evictions (a PodDisruptionBudget's 429 comes back at
//! once) or rollout restarts. Never restarts what the decision did not grant; stops when
//! leadership is lost.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment, StatefulSet},
        core::v1::{Namespace, Pod},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{EvictParams, Patch, PatchParams},
};
use serde_json::json;
use sluice_api::v1alpha1::RevisionUpgrade;
use sluice_runtime::leader::Leadership;

use crate::{
    FIELD_MANAGER,
    context::{Context, Memories},
    decide::{self, Action},
    fleet::{RESTARTED_AT_ANNOTATION, Workload},
    metrics::UpgradeMetrics,
    reconcile::ReconcileError,
};

/// Evictions sent at once.
const EVICTION_CONCURRENCY: usize = 32;

/// Carries out the decision's actions: Events and relabels at once, then the restarts in the
/// background at the times the budget scheduled them, counted from now (after the status
/// write), so the next tick's decision and writes overlap them and restarts flow as tokens
/// accrue. `hold` cancels the restarts of earlier schedules not yet started (their tokens are
/// refunded). Restart outcomes go to memory for the next tick (refunds, refusals, own
/// issuance); the first relabel error is returned after every action was tried.
pub(crate) async fn act(
    ctx: &Arc<Context>,
    obj: &RevisionUpgrade,
    decision: &decide::Decision,
    hold: bool,
) -> Result<(), ReconcileError> {
    let name = obj.name_any();
    let mut first_error = None;
    let mut restarts = Vec::new();
    let mut busy_for = Duration::ZERO;
    for action in &decision.actions {
        match action {
            Action::Event(notice) => ctx.recorder.announce(obj, notice).await,
            Action::Relabel {
                namespace,
                from,
                to,
            } => {
                if let Err(e) = relabel(&ctx.client, &ctx.leadership, namespace, from, to).await {
                    tracing::warn!(namespace, error = %e, "relabel failed; retried next tick");
                    first_error.get_or_insert(e);
                }
            }
            Action::Evict { .. } | Action::RolloutRestart { .. } => restarts.push(action.clone()),
            Action::ScheduleBusy(d) => busy_for = *d,
        }
    }
    let base = tokio::time::Instant::now();
    let epoch = {
        let mut memory = ctx.memory.lock().expect("memory lock");
        let m = memory.entry(name.clone()).or_default();
        m.pacers.retain(|p| !p.is_finished());
        if hold {
            m.epoch += 1;
            m.next_free = None;
        }
        if !restarts.is_empty() {
            m.next_free = Some(base + busy_for);
            let at = (ctx.clock)().as_millisecond();
            for r in &restarts {
                match r {
                    Action::Evict { namespace, pod, .. } => {
                        m.in_progress.insert(format!("{namespace}/{pod}"), at);
                    }
                    Action::RolloutRestart {
                        namespace,
                        workload,
                        ..
                    } => {
                        m.in_progress
                            .insert(decide::workload_key(namespace, workload), at);
                    }
                    _ => {}
                }
            }
        }
        m.epoch
    };
    if !restarts.is_empty() {
        let pacer = Pacer {
            name: name.clone(),
            client: ctx.client.clone(),
            evict_client: ctx.evict_client.clone(),
            clock: ctx.clock,
            metrics: ctx.metrics.clone(),
            memory: ctx.memory.clone(),
            leadership: ctx.leadership.clone(),
            epoch,
        };
        let handle = tokio::spawn(pacer.run(base, restarts));
        let mut memory = ctx.memory.lock().expect("memory lock");
        memory.entry(name).or_default().pacers.push(handle);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One grant's restarts, started in the background at their scheduled times.
pub(crate) struct Pacer {
    pub(crate) name: String,
    pub(crate) client: Client,
    pub(crate) evict_client: Client,
    pub(crate) clock: fn() -> Timestamp,
    pub(crate) metrics: UpgradeMetrics,
    pub(crate) memory: Memories,
    pub(crate) leadership: Leadership,
    pub(crate) epoch: u64,
}

impl Pacer {
    /// Cancelled by a later tick (pause, over budget), or because this replica no longer leads.
    pub(crate) fn cancelled(&self) -> bool {
        !self.leadership.is_leader()
            || self
                .memory
                .lock()
                .expect("memory lock")
                .get(&self.name)
                .is_none_or(|m| m.epoch != self.epoch)
    }

    /// Starts every restart at `base` plus its offset (at bounded concurrency, in order), and
    /// records each outcome as it comes.
    pub(crate) async fn run(self, base: tokio::time::Instant, restarts: Vec<Action>) {
        let this = &self;
        stream::iter(restarts)
            .map(|action| async move {
                let after = match &action {
                    Action::Evict { after, .. } | Action::RolloutRestart { after, .. } => *after,
                    _ => Duration::ZERO,
                };
                // Leadership lost while waiting: the restart is recorded as cancelled at once.
                let mut leadership = this.leadership.clone();
                tokio::select! {
                    _ = tokio::time::sleep_until(base + after) => {}
                    _ = leadership.lost() => {}
                }
                this.start(action).await;
            })
            .buffer_unordered(EVICTION_CONCURRENCY)
            .for_each(|()| async {})
            .await;
    }

    pub(crate) async fn start(&self, action: Action) {
        let (key, mode, cost) = match &action {
            Action::Evict { namespace, pod, .. } => (format!("{namespace}/{pod}"), "evict", 1),
            Action::RolloutRestart {
                namespace,
                workload,
                pods,
                ..
            } => (
                decide::workload_key(namespace, workload),
                "rollout_restart",
                *pods,
            ),
            _ => return,
        };
        let outcome = if self.cancelled() {
            EvictOutcome::Cancelled
        } else {
            match &action {
                Action::Evict { .. } | Action::RolloutRestart { .. }
                    if self.leadership.ensure().is_err() =>
                {
                    EvictOutcome::Cancelled
                }
                Action::Evict { namespace, pod, .. } => {
                    let api: Api<Pod> = Api::namespaced(self.evict_client.clone(), namespace);
                    match api.evict(pod, &EvictParams::default()).await {
                        Ok(_) => EvictOutcome::Started(1),
                        Err(kube::Error::Api(s)) if s.code == 429 => EvictOutcome::Blocked,
                        Err(kube::Error::Api(s)) if s.code == 404 => EvictOutcome::Gone,
                        Err(e) => {
                            tracing::warn!(namespace, pod, error = %e, "eviction failed; retried next tick");
                            EvictOutcome::Error
                        }
                    }
                }
                Action::RolloutRestart {
                    namespace,
                    workload,
                    restarted_at,
                    ..
                } => match rollout_restart(&self.client, namespace, workload, restarted_at).await {
                    Ok(pods) => EvictOutcome::Started(pods),
                    Err(e) => {
                        tracing::warn!(error = %e, "rollout restart failed; retried next tick");
                        EvictOutcome::Error
                    }
                },
                _ => return,
            }
        };
        let at = (self.clock)().as_millisecond();
        let result = match outcome {
            EvictOutcome::Started(_) => "started",
            EvictOutcome::Blocked => "blocked",
            EvictOutcome::Gone => "gone",
            EvictOutcome::Error => "error",
            EvictOutcome::Cancelled => "cancelled",
        };
        if !matches!(outcome, EvictOutcome::Cancelled) {
            self.metrics.restart(&self.name, mode, result);
        }
        let mut memory = self.memory.lock().expect("memory lock");
        let Some(m) = memory.get_mut(&self.name) else {
            return;
        };
        match outcome {
            EvictOutcome::Started(pods) => {
                // Rollout restarts: their pods are replaced over time; counted when requested.
                let pos = m.own.partition_point(|(t, _)| *t <= at);
                m.own.insert(pos, (at, pods));
            }
            EvictOutcome::Blocked => {
                m.unused += cost;
                m.in_progress.remove(&key);
                if !m.blocked.contains(&key) {
                    m.blocked.push(key);
                    m.blocked.sort();
                }
            }
            EvictOutcome::Gone | EvictOutcome::Error | EvictOutcome::Cancelled => {
                m.unused += cost;
                m.in_progress.remove(&key);
            }
        }
    }
}

pub(crate) enum EvictOutcome {
    /// Started; this many pods will be replaced.
    Started(u32),
    Blocked,
    Gone,
    Error,
    Cancelled,
}

/// Patch parameters under the operator's field manager, so its writes are attributed to it in
/// `managedFields` (Argo CD's `ignoreDifferences.managedFieldsManagers` keys on that name).
pub(crate) fn owned_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.as_str().to_owned()),
        ..PatchParams::default()
    }
}

/// Sets `istio.io/rev` from `from` to `to` only while it is still `from` (a JSON patch `test`).
pub(crate) async fn relabel(
    client: &Client,
    leadership: &Leadership,
    namespace: &str,
    from: &str,
    to: &str,
) -> Result<(), ReconcileError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/istio.io~1rev", "value": from},
        {"op": "replace", "path": "/metadata/labels/istio.io~1rev", "value": to},
    ]))
    .expect("a well-formed JSON patch");
    leadership.ensure()?;
    match api
        .patch(namespace, &owned_params(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        // The label is no longer `from`: someone else changed it; the next tick reads it.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => Ok(()),
        Err(source) => Err(ReconcileError::Relabel {
            namespace: namespace.to_owned(),
            source,
        }),
    }
}

/// Sets the workload's pod-template `restartedAt` annotation; returns its replica count (the
/// SVIDs the restart will cost).
pub(crate) async fn rollout_restart(
    client: &Client,
    namespace: &str,
    workload: &Workload,
    restarted_at: &str,
) -> Result<u32, ReconcileError> {
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: restarted_at}}}}});
    let params = owned_params();
    let err = |source| ReconcileError::RolloutRestart {
        kind: workload.kind.clone(),
        namespace: namespace.to_owned(),
        name: workload.name.clone(),
        source,
    };
    let replicas = match workload.kind.as_str() {
        "Deployment" => Api::<Deployment>::namespaced(client.clone(), namespace)
            .patch(&workload.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(err)?
            .spec
            .replicas
            .unwrap_or(1),
        "StatefulSet" => Api::<StatefulSet>::namespaced(client.clone(), namespace)
            .patch(&workload.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(err)?
            .spec
            .replicas
            .unwrap_or(1),
        _ => Api::<DaemonSet>::namespaced(client.clone(), namespace)
            .patch(&workload.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(err)?
            .status
            .map(|s| s.desired_number_scheduled)
            .unwrap_or(1),
    };
    Ok(replicas.max(0) as u32)
}
