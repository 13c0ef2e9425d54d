//! Leader election on a coordination.k8s.io/v1 Lease: only the leader reconciles; a standby
//! takes over when the leader's Lease expires.
//!
//! Owns the Lease loop and the [`Leadership`] channel that tells the controller when it became
//! leader and when it lost leadership. The algorithm is client-go's: the leader renews every
//! retry interval; a standby takes the Lease once it has seen the same record, unrenewed, for the
//! Lease's whole duration (measured on its own clock, so clock skew between replicas does not
//! matter); writes carry the resourceVersion they were decided from, so two replicas never both
//! win.
//!
//! **A deposed leader cannot act.** Leadership is lost *locally* when no renewal succeeded within
//! the renew deadline — `duration − renew` seconds, measured from when the last successful
//! renewal was *sent* — even while a request hangs on a frozen connection (every Lease request is
//! bounded by the retry interval, and the deadline fires on its own timer). A standby can only take
//! over `duration` seconds after it observed that renewal, which is after it was sent: the leader
//! has stepped down `renew` seconds before. Every side effect checks [`Leadership::ensure`] right
//! before it, and the controller cancels in-flight reconciles on loss (see `operator`). Must never
//! reconcile anything.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::LeaseSettings;

/// A view of whether this replica leads. Clone it for every task that needs to know.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    // Keeps a constant channel open for `always()`.
    _always: Option<std::sync::Arc<watch::Sender<bool>>>,
}

/// This replica does not lead (any more): the side effect it was about to take is not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this replica is not the leader (its Lease was not renewed within the renew deadline, or \
     another replica holds it); the write was not sent"
)]
pub struct NotLeader;

impl crate::error::Categorized for NotLeader {
    fn category(&self) -> crate::error::Category {
        // Another replica leads (or may): the same kind of lost race as a 409.
        crate::error::Category::Conflict
    }
}

impl Leadership {
    /// A leadership that always holds (leader election disabled, tests).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            rx,
            _always: Some(std::sync::Arc::new(tx)),
        }
    }

    /// A leadership driven by `rx` (`true` = leader).
    pub fn from_receiver(rx: watch::Receiver<bool>) -> Self {
        Self { rx, _always: None }
    }

    /// Whether this replica leads right now. A stopped election (its task ended, even by a
    /// panic or an abort) never leads.
    pub fn is_leader(&self) -> bool {
        self.rx.has_changed().is_ok() && *self.rx.borrow()
    }

    /// `Ok` while this replica leads: call it right before every side effect (an eviction, a
    /// remote apply, an Application patch, a route write, a git push).
    pub fn ensure(&self) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Resolves once this replica leads; returns `false` if the election stopped first.
    pub async fn acquired(&mut self) -> bool {
        self.rx.wait_for(|l| *l).await.is_ok()
    }

    /// Resolves once this replica no longer leads (also when the election stopped).
    pub async fn lost(&mut self) {
        let _ = self.rx.wait_for(|l| !*l).await;
    }

    /// Resolves on the next change; `None` when the election stopped.
    pub async fn changed(&mut self) -> Option<bool> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }
}

/// The parts of a Lease record the election compares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// `spec.holderIdentity` (empty: released).
    pub holder: String,
    /// `spec.renewTime`, as written (compared, never interpreted: clocks differ).
    pub renew_time: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<u64>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            renew_time: spec
                .renew_time
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_owned)),
            duration_seconds: spec
                .lease_duration_seconds
                .and_then(|d| u64::try_from(d).ok()),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What to do with the Lease as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecision {
    /// It is ours: renew it.
    Renew,
    /// It is free (released, or unrenewed for its whole duration): take it.
    TakeOver,
    /// Another replica holds it.
    Wait,
}

/// Pure decision of one election round. `seen` is the record this replica last observed and
/// when (its own clock); `default_duration` applies when the record names none.
pub fn decide(
    record: &Record,
    me: &str,
    seen: Option<&(Record, Instant)>,
    now: Instant,
    default_duration: Duration,
) -> LeaseDecision {
    if record.holder == me {
        return LeaseDecision::Renew;
    }
    if record.holder.is_empty() {
        return LeaseDecision::TakeOver;
    }
    let duration = record
        .duration_seconds
        .map_or(default_duration, Duration::from_secs);
    match seen {
        Some((last, at)) if last == record && now.saturating_duration_since(*at) >= duration => {
            LeaseDecision::TakeOver
        }
        _ => LeaseDecision::Wait,
    }
}

/// The renew deadline: how long after sending its last successful renewal a leader keeps
/// acting. `renew` seconds short of the duration, so it stops before any standby may start.
pub fn renew_deadline(settings: &LeaseSettings) -> Duration {
    Duration::from_secs(
        settings
            .duration_seconds
            .saturating_sub(settings.renew_seconds),
    )
}

/// Reports "not leader", notifying observers only if this replica was leading.
fn step_down(tx: &watch::Sender<bool>) {
    tx.send_if_modified(|leader| std::mem::replace(leader, false));
}

/// Why one election round did not complete.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("the Lease request did not answer within {0:?}")]
    Timeout(Duration),
}

fn now_micro() -> serde_json::Value {
    serde_json::to_value(MicroTime(jiff::Timestamp::now())).unwrap_or(serde_json::Value::Null)
}

/// One round: read the Lease, decide, write if needed. `Ok(true)` when this replica holds it
/// after the round.
async fn round(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    seen: &mut Option<(Record, Instant)>,
) -> Result<bool, kube::Error> {
    let Some(lease) = api.get_opt(&settings.name).await? else {
        let now = now_micro();
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": settings.name, "namespace": settings.namespace},
            "spec": {
                "holderIdentity": settings.identity,
                "leaseDurationSeconds": settings.duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            }
        }))
        .map_err(kube::Error::SerdeError)?;
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let record = Record::of(&lease);
    let now = Instant::now();
    let decision = decide(
        &record,
        &settings.identity,
        seen.as_ref(),
        now,
        Duration::from_secs(settings.duration_seconds),
    );
    if seen.as_ref().is_none_or(|(last, _)| *last != record) {
        *seen = Some((record.clone(), now));
    }
    let stamp = now_micro();
    let spec = match decision {
        LeaseDecision::Wait => return Ok(false),
        LeaseDecision::Renew => json!({
            "renewTime": stamp,
            "leaseDurationSeconds": settings.duration_seconds,
        }),
        LeaseDecision::TakeOver => json!({
            "holderIdentity": settings.identity,
            "leaseDurationSeconds": settings.duration_seconds,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": record.transitions.saturating_add(1),
        }),
    };
    // The resourceVersion makes the write conditional on the record the decision was made from.
    let patch = json!({
        "metadata": {"resourceVersion": lease.metadata.resource_version},
        "spec": spec,
    });
    match api
        .patch(
            &settings.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up if this replica holds it, so a standby takes it at once.
async fn release(api: &Api<Lease>, settings: &LeaseSettings) -> Result<(), kube::Error> {
    let Some(lease) = api.get_opt(&settings.name).await? else {
        return Ok(());
    };
    if Record::of(&lease).holder != settings.identity {
        return Ok(());
    }
    let patch = json!({
        "metadata": {"resourceVersion": lease.metadata.resource_version},
        "spec": {"holderIdentity": null, "leaseDurationSeconds": 1, "renewTime": now_micro()},
    });
    api.patch(
        &settings.name,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

/// Starts leader election. The task runs until `stop` is cancelled, then releases the Lease if
/// held. Cancel `stop` only after the controller stopped reconciling.
pub fn spawn(
    client: Client,
    settings: LeaseSettings,
    stop: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let span =
        tracing::info_span!("leader", lease = %settings.name, namespace = %settings.namespace);
    let task = tokio::spawn(
        async move {
            let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
            let deadline = renew_deadline(&settings);
            // The request bound: a round never outlives the retry interval.
            let bound = settings.retry;
            let mut seen: Option<(Record, Instant)> = None;
            // While leading: when the renew deadline of the last successful renewal passes.
            let mut valid_until: Option<Instant> = None;
            let mut reachable = false;
            loop {
                let sent = Instant::now();
                let fence = valid_until.unwrap_or_else(|| sent + Duration::from_secs(86_400));
                let outcome = tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep_until(fence), if valid_until.is_some() => None,
                    r = tokio::time::timeout(bound, round(&api, &settings, &mut seen)) => Some(
                        r.map_err(|_| RoundError::Timeout(bound)).and_then(|r| r.map_err(RoundError::from))
                    ),
                };
                match outcome {
                    None => {
                        tracing::warn!(lease = %settings.name, identity = %settings.identity, ?deadline,
                            "no Lease renewal succeeded within the renew deadline: stepping down");
                        valid_until = None;
                        step_down(&tx);
                    }
                    Some(Ok(true)) => {
                        valid_until = Some(sent + deadline);
                        if tx.send_if_modified(|l| !std::mem::replace(l, true)) {
                            tracing::info!(lease = %settings.name, identity = %settings.identity, "leading");
                        }
                        reachable = true;
                    }
                    Some(Ok(false)) => {
                        valid_until = None;
                        if !reachable {
                            // The Lease answers: a standby, not a replica that cannot reach the API.
                            tx.send_replace(false);
                            reachable = true;
                        } else if tx.send_if_modified(|l| std::mem::replace(l, false)) {
                            tracing::warn!(lease = %settings.name, identity = %settings.identity,
                                "another replica holds the Lease: stepped down");
                        }
                    }
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, lease = %settings.name, retry_in = ?settings.retry,
                            "Lease read or renewal failed; check RBAC for coordination.k8s.io/leases and the API server");
                        if valid_until.is_none() {
                            step_down(&tx);
                        }
                    }
                }
                let next = Instant::now() + settings.retry;
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep_until(next) => {}
                    _ = tokio::time::sleep_until(valid_until.unwrap_or(next)), if valid_until.is_some_and(|v| v < next) => {
                        tracing::warn!(lease = %settings.name, identity = %settings.identity, ?deadline,
                            "no Lease renewal succeeded within the renew deadline: stepping down");
                        valid_until = None;
                        step_down(&tx);
                    }
                }
            }
            let was_leader = *tx.borrow();
            tx.send_replace(false);
            if was_leader {
                match tokio::time::timeout(bound, release(&api, &settings)).await {
                    Ok(Ok(())) => tracing::info!(lease = %settings.name, "released the Lease"),
                    Ok(Err(err)) => tracing::warn!(error = %err, lease = %settings.name,
                        "could not release the Lease; a standby takes over after it expires"),
                    Err(_) => tracing::warn!(lease = %settings.name,
                        "releasing the Lease did not answer; a standby takes over after it expires"),
                }
            }
        }
        .instrument(span),
    );
    (Leadership::from_receiver(rx), task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rec(holder: &str, renew: &str) -> Record {
        Record {
            holder: holder.into(),
            renew_time: Some(renew.into()),
            duration_seconds: Some(15),
            transitions: 0,
        }
    }

    #[test]
    fn decision_table() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        let other = rec("b", "t1");
        // (name, record, seen, now, want)
        type Row = (
            &'static str,
            Record,
            Option<(Record, Instant)>,
            Instant,
            LeaseDecision,
        );
        let table: Vec<Row> = vec![
            (
                "ours: renew",
                rec("a", "t1"),
                None,
                t0,
                LeaseDecision::Renew,
            ),
            (
                "released: take",
                rec("", "t1"),
                None,
                t0,
                LeaseDecision::TakeOver,
            ),
            (
                "held, first seen: wait",
                other.clone(),
                None,
                t0,
                LeaseDecision::Wait,
            ),
            (
                "held, unchanged for less than the duration: wait",
                other.clone(),
                Some((other.clone(), t0)),
                t0 + Duration::from_secs(14),
                LeaseDecision::Wait,
            ),
            (
                "held, unchanged for the duration: take",
                other.clone(),
                Some((other.clone(), t0)),
                t0 + d,
                LeaseDecision::TakeOver,
            ),
            (
                "held and renewed since we looked: wait (our clock restarts)",
                rec("b", "t2"),
                Some((other.clone(), t0)),
                t0 + Duration::from_secs(60),
                LeaseDecision::Wait,
            ),
            (
                "the record's own duration counts",
                Record {
                    duration_seconds: Some(5),
                    ..other.clone()
                },
                Some((
                    Record {
                        duration_seconds: Some(5),
                        ..other.clone()
                    },
                    t0,
                )),
                t0 + Duration::from_secs(5),
                LeaseDecision::TakeOver,
            ),
        ];
        for (name, record, seen, now, want) in table {
            assert_eq!(decide(&record, "a", seen.as_ref(), now, d), want, "{name}");
        }
    }

    #[test]
    fn the_renew_deadline_ends_the_renew_margin_before_the_duration() {
        let s = LeaseSettings {
            name: "l".into(),
            namespace: "n".into(),
            identity: "a".into(),
            duration_seconds: 15,
            renew_seconds: 5,
            retry: Duration::from_secs(2),
        };
        assert_eq!(renew_deadline(&s), Duration::from_secs(10));
    }

    #[test]
    fn ensure_refuses_when_not_leading() {
        let (tx, rx) = watch::channel(true);
        let l = Leadership::from_receiver(rx);
        assert_eq!(l.ensure(), Ok(()));
        tx.send_replace(false);
        assert_eq!(l.ensure(), Err(NotLeader));
    }

    #[test]
    fn a_dead_election_never_leads() {
        let (tx, rx) = watch::channel(true);
        let l = Leadership::from_receiver(rx);
        assert!(l.is_leader());
        // The Lease task panicked or was aborted while leading: its last word was "leader".
        drop(tx);
        assert!(!l.is_leader());
        assert_eq!(l.ensure(), Err(NotLeader));
    }

    #[tokio::test]
    async fn always_leads() {
        let mut l = Leadership::always();
        assert!(l.is_leader());
        assert!(
            tokio::time::timeout(Duration::from_secs(1), l.acquired())
                .await
                .unwrap()
        );
    }

    #[tokio::test]
    async fn receiver_reports_gain_and_loss() {
        let (tx, rx) = watch::channel(false);
        let mut l = Leadership::from_receiver(rx);
        assert!(!l.is_leader());
        let waiter = tokio::spawn({
            let mut l = l.clone();
            async move { l.acquired().await }
        });
        tx.send_replace(true);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), waiter)
                .await
                .unwrap()
                .unwrap()
        );
        tx.send_replace(false);
        tokio::time::timeout(Duration::from_secs(1), l.lost())
            .await
            .unwrap();
        drop(tx);
        assert_eq!(l.changed().await, None);
        assert!(
            !l.acquired().await,
            "a stopped election never grants leadership"
        );
    }
}
