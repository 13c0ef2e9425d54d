//! A simulated Argo CD for sluice's tests and sandbox: the application-controller and the
//! applicationset-controller, against a management cluster reached through a `kube::Client`
//! (the kube-emulator in tests; a real cluster works too), with Argo CD's field names and
//! shapes (argoproj.io/v1alpha1 `Application` and `ApplicationSet`, declarative cluster
//! Secrets). README.md lists what is simulated and what is not.
//!
//! This crate owns only the simulation; it must never be a dependency of an operator binary,
//! and it never writes to objects outside the Applications it reconciles and their tracked
//! resources.
#![forbid(unsafe_code)]

pub mod app_controller;
pub mod appset_controller;
pub mod clusters;
pub mod diff;
pub mod driver;
pub mod error;
pub mod events;
pub mod generators;
pub mod health;
pub mod plan;
pub mod source;
pub mod types;

use std::sync::Arc;
use std::time::Duration;

pub use clusters::cluster_secret;
pub use error::ArgoCdError;

/// How the simulated Argo CD runs.
#[derive(Clone, Debug)]
pub struct ArgoCdOptions {
    /// Namespace holding Applications, ApplicationSets, cluster Secrets, and the duck ConfigMap (default "argocd").
    pub namespace: String,
    /// How often every Application is compared (default 1 s in tests/sandbox; Argo CD's default is 3 min).
    pub resync: Duration,
    /// Registry hosts reached over plain HTTP (the local docker-registry), e.g. "127.0.0.1:5000".
    pub insecure_registries: Vec<String>,
    /// Pause between two sync waves (Argo CD's `ARGOCD_SYNC_WAVE_DELAY`, default 2 s). A sync also
    /// waits for every resource of a wave to be healthy before the next wave, so a sync with
    /// several waves takes observable time and can be terminated.
    pub sync_wave_delay: Duration,
}

impl Default for ArgoCdOptions {
    fn default() -> Self {
        ArgoCdOptions {
            namespace: "argocd".to_string(),
            resync: Duration::from_secs(1),
            insecure_registries: Vec::new(),
            sync_wave_delay: Duration::from_secs(2),
        }
    }
}

/// The running controllers; dropping it or [`ArgoCd::stop`] ends every task.
pub struct ArgoCd {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for ArgoCd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgoCd")
            .field("tasks", &self.tasks.len())
            .finish()
    }
}

impl ArgoCd {
    /// Starts the application and ApplicationSet controllers against `mgmt`.
    ///
    /// Fails at once, saying so, when the management cluster does not serve Applications and
    /// ApplicationSets (the Argo CD CRDs are not installed) or the namespace cannot be read.
    pub async fn start(mgmt: kube::Client, options: ArgoCdOptions) -> Result<ArgoCd, ArgoCdError> {
        for resource in [
            app_controller::application_resource(),
            appset_controller::application_set_resource(),
        ] {
            let api: kube::Api<kube::api::DynamicObject> =
                kube::Api::namespaced_with(mgmt.clone(), &options.namespace, &resource);
            api.list(&kube::api::ListParams::default().limit(1)).await.map_err(|e| {
                ArgoCdError::kube(
                    format!(
                        "listing {} in namespace {} (install the Argo CD CRDs in the management cluster first)",
                        resource.plural, options.namespace
                    ),
                    e,
                )
            })?;
        }
        let clusters = Arc::new(clusters::Clusters::new(mgmt.clone(), &options.namespace));
        let app_ctx = Arc::new(app_controller::AppCtx::new(
            mgmt.clone(),
            options.clone(),
            clusters.clone(),
        )?);
        let appset_ctx = Arc::new(appset_controller::AppSetCtx::new(
            mgmt,
            &options.namespace,
            options.resync,
            clusters,
        ));
        let tasks = vec![
            tokio::spawn(app_controller::run(app_ctx)),
            tokio::spawn(appset_controller::run(appset_ctx)),
        ];
        Ok(ArgoCd { tasks })
    }

    /// Stops every controller task and waits for them to end.
    pub async fn stop(mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for ArgoCd {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
