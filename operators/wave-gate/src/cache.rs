//! Watch caches of what every reconcile reads: the Applications of an ApplicationSet's namespace
//! and wave-gate's own BundlePins of a WaveGate's namespace. A reconcile runs every analysis
//! interval, and every 250 ms while a halt waits for its pins; listing thousands of Applications
//! each time would load the API server for nothing. Each cache is a reflector (one list, then a
//! watch), started the first time a namespace is asked for and kept while the operator runs.
//!
//! Owns only reads. A cache may lag the API server by one watch event: every write the
//! reconcile makes from what it read tolerates that (a pin created twice is a 409, a pin deleted
//! twice a 404), and a reconcile that needs the newer state comes again within its requeue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::{
    Api, Client, Resource, ResourceExt as _,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use sluice_api::{external::argocd::Application, v1alpha1::BundlePin};
use tokio::task::JoinHandle;

/// How long a reconcile waits for a new cache's first list before it retries later.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A cache that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("the {what} watch cache of namespace {namespace} is not ready after {waited:?}{last}")]
pub struct NotReady {
    /// What the cache holds.
    pub what: &'static str,
    /// The namespace it watches.
    pub namespace: String,
    /// How long the reconcile waited.
    pub waited: Duration,
    /// The watch's last error, when there was one (`: <error>`).
    pub last: String,
}

/// One running reflector: its store, its task (stopped when the cache is dropped) and the last
/// error its watch reported.
struct Reflector<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    task: JoinHandle<()>,
    last_error: Arc<Mutex<Option<String>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Drop for Reflector<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reflectors of one kind, one per namespace.
struct PerNamespace<K: Resource<DynamicType = ()> + 'static> {
    what: &'static str,
    config: watcher::Config,
    running: Mutex<HashMap<String, Reflector<K>>>,
}

impl<K> PerNamespace<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    fn new(what: &'static str, config: watcher::Config) -> Self {
        Self {
            what,
            config,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// The store of `namespace`, its reflector started on `client` if it is not running yet;
    /// waits (at most [`READY_TIMEOUT`]) for its first list.
    async fn store(&self, client: &Client, namespace: &str) -> Result<Store<K>, NotReady> {
        let (store, last_error) = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            let r = running.entry(namespace.to_owned()).or_insert_with(|| {
                let (store, writer) = reflector::store();
                let last_error = Arc::new(Mutex::new(None));
                let errors = last_error.clone();
                let what = self.what;
                let ns = namespace.to_owned();
                let stream = watcher(Api::<K>::namespaced(client.clone(), namespace), self.config.clone())
                    .default_backoff()
                    // Never kept: managed fields are most of an object and nothing reads them.
                    .modify(|o| o.managed_fields_mut().clear())
                    .reflect(writer);
                let task = tokio::spawn(stream.for_each(move |event| {
                    if let Err(e) = event {
                        tracing::warn!(error = %e, namespace = %ns, "{what} watch failed; retrying with back-off");
                        *errors.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                    }
                    std::future::ready(())
                }));
                Reflector {
                    store,
                    task,
                    last_error,
                }
            });
            (r.store.clone(), r.last_error.clone())
        };
        match tokio::time::timeout(READY_TIMEOUT, store.wait_until_ready()).await {
            Ok(Ok(())) => Ok(store),
            _ => Err(NotReady {
                what: self.what,
                namespace: namespace.to_owned(),
                waited: READY_TIMEOUT,
                last: last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
            }),
        }
    }
}

/// The watch caches a reconcile reads from.
pub struct Caches {
    /// The client the watches run on (no read timeout: a quiet watch is not a dead one).
    client: Client,
    applications: PerNamespace<Application>,
    pins: PerNamespace<BundlePin>,
}

sluice_runtime::opaque_debug!(Caches);

impl Caches {
    /// Caches whose watches run on `watch_client`.
    pub fn new(watch_client: Client) -> Self {
        Self {
            client: watch_client,
            applications: PerNamespace::new("Application", watcher::Config::default()),
            // Only wave-gate's own pins, selected on the server.
            pins: PerNamespace::new(
                "BundlePin",
                watcher::Config::default().labels(&format!(
                    "{}={}",
                    crate::pins::MANAGED_BY_LABEL,
                    crate::OPERATOR
                )),
            ),
        }
    }

    /// Every Application of `namespace`, as last seen by the watch.
    pub async fn applications(&self, namespace: &str) -> Result<Vec<Arc<Application>>, NotReady> {
        Ok(self
            .applications
            .store(&self.client, namespace)
            .await?
            .state())
    }

    /// wave-gate's BundlePins of `namespace`, as last seen by the watch.
    pub async fn pins(&self, namespace: &str) -> Result<Vec<Arc<BundlePin>>, NotReady> {
        Ok(self.pins.store(&self.client, namespace).await?.state())
    }
}
