//! The reconcile loop shared by both controllers: one worker per object (name and uid, so a
//! recreated object gets a fresh worker and an old one never acts on it), woken by a watch
//! event that changes what matters (a predicate hash, so the controller's own status writes do
//! not wake it) and otherwise every requeue period. Reconciles of one object never overlap;
//! different objects run concurrently. Every worker lives in one `JoinSet`, so dropping (or
//! aborting) the driver ends them all. It owns scheduling only, never what a reconcile does.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;

use crate::error::ArgoCdError;

/// What a reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Reconcile again after this long (or sooner on a relevant change).
    Requeue(Duration),
    /// The object is gone; end its worker.
    Gone,
}

/// Runs `reconcile(name, uid)` for every object of `api` until dropped. A reconcile that finds
/// the object gone, or under that name with another uid, answers [`Next::Gone`].
pub async fn drive<F, Fut>(
    api: Api<DynamicObject>,
    predicate: fn(&DynamicObject) -> Option<u64>,
    reconcile: F,
) where
    F: Fn(String, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Next> + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, String)>();
    let mut workers: HashMap<(String, String), Arc<Notify>> = HashMap::new();
    let mut set = JoinSet::new();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .predicate_filter(predicate, Default::default())
        .boxed();
    loop {
        tokio::select! {
            event = events.next() => {
                let key = match event {
                    Some(Ok(obj)) => (obj.name_any(), obj.uid().unwrap_or_default()),
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "watch error; the watcher retries with backoff");
                        continue;
                    }
                    None => return,
                };
                if let Some(notify) = workers.get(&key) {
                    notify.notify_one();
                    continue;
                }
                let notify = Arc::new(Notify::new());
                workers.insert(key.clone(), notify.clone());
                let reconcile = reconcile.clone();
                let done = done_tx.clone();
                set.spawn(async move {
                    loop {
                        match reconcile(key.0.clone(), key.1.clone()).await {
                            Next::Gone => {
                                let _ = done.send(key);
                                return;
                            }
                            Next::Requeue(after) => {
                                tokio::select! {
                                    _ = notify.notified() => {}
                                    _ = tokio::time::sleep(after) => {}
                                }
                            }
                        }
                    }
                });
            }
            Some(key) = done_rx.recv() => {
                workers.remove(&key);
            }
            Some(_) = set.join_next(), if !set.is_empty() => {}
        }
    }
}

/// [`drive`] for a reconcile that can fail: a failure is logged with the object's `kind`, name
/// and error category, and retried after `retry` (or sooner on a relevant change).
pub async fn drive_fallible<F, Fut>(
    api: Api<DynamicObject>,
    predicate: fn(&DynamicObject) -> Option<u64>,
    kind: &'static str,
    retry: Duration,
    reconcile: F,
) where
    F: Fn(String, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Next, ArgoCdError>> + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    drive(api, predicate, move |name: String, uid: String| {
        let reconcile = reconcile.clone();
        async move {
            match reconcile(name.clone(), uid).await {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(kind, name = %name, category = e.category(), error = %e, "reconcile failed");
                    Next::Requeue(retry)
                }
            }
        }
    })
    .await;
}

/// A predicate value: the hash of `key`, the JSON of what of an object warrants a reconcile.
pub fn predicate_hash(key: &serde_json::Value) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.to_string().hash(&mut h);
    Some(h.finish())
}
