//! An operator's controller run in-process, the way the operator's binary runs it
//! (`sluice_runtime::operator::drive`), against whatever API server the test started: started
//! leading, stopped by cancelling it. Owns the task and its hooks; never changes what the
//! controller does.

use std::{fmt::Debug, hash::Hash, sync::Arc, time::Duration};

use kube::{
    Api, Client, Resource,
    runtime::{controller::Action, watcher},
};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use sluice_runtime::{
    error::Categorized,
    leader::Leadership,
    operator::{Hooks, drive},
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a controller has to stop once cancelled before [`RunningController::stop`] fails.
pub const STOP_WITHIN: Duration = Duration::from_secs(10);

/// A controller for one kind, reconciling every object of it in the cluster, until
/// [`stop`](Self::stop).
pub struct RunningController {
    /// The hooks it records into (metrics, health: it is the leader from the start).
    pub hooks: Hooks,
    /// The registry its metrics are registered in.
    pub registry: Registry,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningController {
    /// Starts `reconcile` with `ctx` over every `K` that `client` sees, always the leader, with
    /// the default watcher and standalone hooks.
    pub fn start<K, Ctx, F, Fut, E>(client: &Client, ctx: Ctx, reconcile: F) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Categorized + Send + Sync + 'static,
    {
        let (hooks, registry) = Hooks::standalone();
        hooks.health.set_leader(true);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(drive(
            Api::<K>::all(client.clone()),
            watcher::Config::default(),
            Arc::new(ctx),
            reconcile,
            Leadership::always(),
            shutdown.clone(),
            hooks.clone(),
        ));
        Self {
            hooks,
            registry,
            shutdown,
            task,
        }
    }

    /// Cancels the controller and waits for it to end; panics if it does not stop within
    /// [`STOP_WITHIN`] or its task panicked.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(STOP_WITHIN, self.task)
            .await
            .expect("controller stops on shutdown")
            .expect("the controller task does not panic");
    }
}
