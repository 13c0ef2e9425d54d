//! Leader election on a coordination.k8s.io/v1 Lease (kube-lease-manager): only the leader
//! reconciles; a standby takes over when the leader's Lease expires.
//!
//! Owns the Lease loop and the [`Leadership`] channel that tells the controller when it became
//! leader and when it lost leadership. On any Lease error the replica conservatively reports
//! "not leader" (stop reconciling) and rebuilds its Lease manager after the retry interval.
//! A Lease alone cannot fence a deposed leader that still has a write in flight: that is what
//! the resourceVersion in every status write (`write`) is for. Must never reconcile anything.

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
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

    /// Whether this replica leads right now.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
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

async fn build(
    client: &Client,
    s: &LeaseSettings,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    LeaseManagerBuilder::new(client.clone(), &s.name)
        .with_namespace(&s.namespace)
        .with_identity(&s.identity)
        .with_duration(s.duration_seconds)
        .with_grace(s.renew_seconds)
        .build()
        .await
}

/// Reports "not leader", notifying observers only if this replica was leading.
fn step_down(tx: &watch::Sender<bool>) {
    tx.send_if_modified(|leader| std::mem::replace(leader, false));
}

/// Starts leader election. The task runs until `stop` is cancelled, then releases the Lease if
/// held: a standby, which sleeps until the Lease's expiry time, then finds it free and takes it
/// without first force-releasing an expired holder. Cancel `stop` only after the
/// controller stopped reconciling.
pub fn spawn(
    client: Client,
    settings: LeaseSettings,
    stop: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let span =
        tracing::info_span!("leader", lease = %settings.name, namespace = %settings.namespace);
    let task = tokio::spawn(async move {
        let mut manager: Option<LeaseManager> = None;
        loop {
            let m = match manager.take() {
                Some(m) => m,
                None => match build(&client, &settings).await {
                    Ok(m) => {
                        // The Lease is reachable: announce "not leader (yet)" so observers can
                        // tell a standby from a replica that cannot reach the API.
                        tx.send_replace(false);
                        m
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, lease = %settings.name, retry_in = ?settings.retry,
                            "cannot use the leader-election Lease; check RBAC for coordination.k8s.io/leases");
                        step_down(&tx);
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep(settings.retry) => continue,
                        }
                    }
                },
            };
            tokio::select! {
                _ = stop.cancelled() => {
                    tx.send_replace(false);
                    if let Err(err) = m.release().await {
                        tracing::warn!(error = %err, lease = %settings.name, "could not release the Lease; a standby takes over after it expires");
                    }
                    break;
                }
                changed = m.changed() => match changed {
                    Ok(leader) => {
                        tracing::info!(lease = %settings.name, identity = %settings.identity, leader, "leadership changed");
                        tx.send_replace(leader);
                        manager = Some(m);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, lease = %settings.name, retry_in = ?settings.retry,
                            "Lease read or renewal failed; stepping down until it works again");
                        step_down(&tx);
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep(settings.retry) => {}
                        }
                    }
                },
            }
        }
    }.instrument(span));
    (Leadership::from_receiver(rx), task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
