//! The I/O side of sluice-upgrade-revisions: reads what `decide` needs (the fleet from watch
//! caches, the issuance counter and gate verdicts from the metrics source), writes the status it
//! returns (server-side apply fenced by resourceVersion), then carries out its actions: relabels
//! (a JSON patch that only applies while the label still has the expected value), evictions
//! (a client without automatic retries, so a PodDisruptionBudget's 429 comes back at once) and
//! rollout restarts.
//!
//! Owns the order of effects: status first (including the issuance tokens the restarts spend),
//! actions only after the status write succeeded, so a deposed leader whose write is refused
//! restarts nothing, and a crash between the two loses tokens rather than overspending them.
//! Must never decide anything.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use kube::{Api, ResourceExt, api::ListParams, runtime::controller::Action as ControllerAction};
use sluice_api::v1alpha1::{
    RevisionUpgrade, RevisionUpgradeStatus, revision_upgrade::NamespaceState,
};
use sluice_runtime::{Categorized, Category, error::ReconcileFailure, write};

use crate::{
    FIELD_MANAGER,
    decide::{self, Observations},
    fleet::{self, PodView},
    pacing,
    restarts::act,
    signals::read_metrics,
};

pub use crate::{
    cache::{FleetCache, revision_tags},
    context::{Context, Metrics, metrics_source},
    signals::DEFAULT_ISSUANCE_WINDOW,
};

/// A reconcile that did not complete; retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Leadership lost before a write, or the RevisionUpgrade's status write failed.
    #[error(transparent)]
    Failure(ReconcileFailure),
    /// Relabelling a namespace failed.
    #[error(
        "relabelling namespace {namespace} istio.io/rev: {source}; check the operator may patch namespaces"
    )]
    Relabel {
        /// Namespace.
        namespace: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Restarting a workload failed.
    #[error(
        "restarting {kind} {namespace}/{name}: {source}; check the operator may patch workloads"
    )]
    RolloutRestart {
        /// Workload kind.
        kind: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Listing workloads failed.
    #[error("listing workloads in {namespace}: {source}; check the operator may list workloads")]
    Workloads {
        /// Namespace.
        namespace: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
}

sluice_runtime::reconcile_failures!(ReconcileError::Failure, status of RevisionUpgrade);

impl Categorized for ReconcileError {
    fn category(&self) -> Category {
        match self {
            ReconcileError::Failure(e) => e.category(),
            ReconcileError::Relabel { source, .. }
            | ReconcileError::RolloutRestart { source, .. }
            | ReconcileError::Workloads { source, .. } => Category::of_kube(source),
        }
    }
}

/// Reconciles one RevisionUpgrade.
#[tracing::instrument(skip_all, fields(kind = "RevisionUpgrade", name = obj.name_any()))]
pub async fn reconcile(
    obj: Arc<RevisionUpgrade>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    let api: Api<RevisionUpgrade> = Api::all(ctx.client.clone());
    let name = obj.name_any();
    let now = (ctx.clock)();
    let mut obs = Observations {
        generation: obj.metadata.generation,
        allow_free_form_promql: ctx.allow_free_form_promql,
        ..Observations::default()
    };
    let valid = crate::validity::problems(&obj.spec, ctx.allow_free_form_promql).is_empty();
    if valid && let Some(cache) = &ctx.fleet {
        if let Some(wait) = decide::not_due_for(obj.status.as_ref(), obs.generation, now) {
            return Ok(ControllerAction::requeue(wait));
        }
        if !cache.ready().await {
            return Ok(ControllerAction::requeue(Duration::from_secs(1)));
        }
        obs.fleet = Some(cache.read());
        obs.earlier_upgrade = earlier_upgrade(&api, &obj).await;
        let complete = obj
            .status
            .as_ref()
            .is_some_and(|s| s.completed_at.is_some());
        if !complete {
            read_metrics(&ctx, &name, &obj.spec, obj.status.as_ref(), &mut obs, now).await;
        }
        let mut memory = ctx.memory.lock().expect("memory lock");
        let m = memory.entry(name.clone()).or_default();
        obs.unused_grants = m.unused;
        obs.blocked = m.blocked.clone();
        // A pod whose restart was sent stays out of the candidates while the watch cache still
        // shows it alive (the watch may lag the eviction), at most a minute.
        // A workload's rollout restart is kept 30 s: by then its new template is read.
        let (pods_kept, workloads_kept) =
            (now.as_millisecond() - 60_000, now.as_millisecond() - 30_000);
        m.in_progress.retain(|key, at| {
            let workload = key.matches('/').count() == 2;
            if workload {
                *at > workloads_kept
            } else {
                *at > pods_kept && cache.views.alive(key)
            }
        });
        obs.in_progress = m.in_progress.keys().cloned().collect();
        let tick = tokio::time::Instant::now();
        let between = m
            .last_tick
            .replace(tick)
            .map_or(pacing::TICK, |t| tick.saturating_duration_since(t));
        // Without memory (a new leader), the previous leader's last schedule may still be
        // running for up to the longest horizon after its grant.
        let inherited = obj
            .status
            .as_ref()
            .and_then(|s| s.issuance_budget.as_ref())
            .filter(|b| b.own_restarts_last_second > 0)
            .and_then(|b| b.updated_at.as_ref())
            .map_or(Duration::ZERO, |at| {
                let since = now.duration_since(at.0).unsigned_abs();
                pacing::MAX_HORIZON.saturating_sub(since)
            });
        obs.pacing = pacing::Window {
            busy_for: m
                .next_free
                .map_or(inherited, |f| f.saturating_duration_since(tick)),
            horizon: between
                .mul_f64(1.5)
                .clamp(pacing::DEFAULT_HORIZON, pacing::MAX_HORIZON),
        };
    }
    let started = tokio::time::Instant::now();
    let decision = decide::decide(&obj.spec, obj.status.as_ref(), &obs, now);
    if obj.status.as_ref() != Some(&decision.status) {
        write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &decision.status).await?;
        tracing::debug!(phase = ?decision.status.phase, "status written");
        if let Some(n) = crate::notice::notice(obj.status.as_ref(), &decision.status) {
            ctx.notifier.notify(obj.as_ref(), n);
        }
    }
    let granted = decision
        .status
        .issuance_budget
        .as_ref()
        .and_then(|b| b.updated_at.clone())
        != obj
            .status
            .as_ref()
            .and_then(|s| s.issuance_budget.as_ref())
            .and_then(|b| b.updated_at.clone());
    if granted {
        // The refunds and refusals read for this grant were consumed by it (more may have
        // arrived meanwhile from a running schedule: they stay for the next grant).
        let mut memory = ctx.memory.lock().expect("memory lock");
        let m = memory.entry(name.clone()).or_default();
        m.unused = m.unused.saturating_sub(obs.unused_grants);
        m.blocked.retain(|p| !obs.blocked.contains(p));
    }
    let hold = obj.spec.paused
        || decision
            .status
            .issuance_budget
            .as_ref()
            .is_some_and(|b| b.throttled);
    let outcome = act(&ctx, &obj, &decision, hold).await;
    if let Some(fleet) = &obs.fleet {
        let in_flight = in_flight(&decision.status, &fleet.pods);
        ctx.metrics.observe(
            &name,
            &obj.spec,
            &decision.status,
            &fleet::proxies_by_revision(&fleet.pods),
            in_flight,
        );
    }
    outcome?;
    // The next tick is due a tick after this one started (restarts run in the background).
    Ok(decision
        .requeue
        .action(started.elapsed(), Duration::from_millis(50)))
}

/// The oldest other RevisionUpgrade of the cluster still in progress, if it was created before
/// `obj` (creation time, then name): one issuance budget per cluster. A listing error is taken
/// as none (the next tick lists again).
async fn earlier_upgrade(api: &Api<RevisionUpgrade>, obj: &RevisionUpgrade) -> Option<String> {
    use sluice_api::v1alpha1::RevisionUpgradePhase as P;
    let list = api.list(&ListParams::default()).await.ok()?;
    let key = |u: &RevisionUpgrade| {
        (
            u.metadata.creation_timestamp.as_ref().map(|t| t.0),
            u.name_any(),
        )
    };
    let mine = key(obj);
    list.items
        .iter()
        .filter(|u| u.name_any() != mine.1 && u.metadata.deletion_timestamp.is_none())
        .filter(|u| {
            !matches!(
                u.status.as_ref().map(|s| s.phase),
                Some(P::Complete | P::Aborted | P::Invalid)
            )
        })
        .filter(|u| key(u) < mine)
        .min_by_key(|u| key(u))
        .map(|u| u.name_any())
}

/// Pods of moving namespaces not yet Ready on their target revision.
fn in_flight(status: &RevisionUpgradeStatus, pods: &[Arc<PodView>]) -> u64 {
    let moving: BTreeSet<&str> = status
        .namespaces
        .iter()
        .filter(|n| {
            matches!(
                n.state,
                NamespaceState::Restarting | NamespaceState::RollingBack
            )
        })
        .map(|n| n.name.as_str())
        .collect();
    pods.iter()
        .filter(|p| (p.terminating || !p.ready) && moving.contains(p.namespace.as_str()))
        .count() as u64
}
