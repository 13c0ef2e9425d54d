//! The `World`: one call that starts the cluster behaviour in every given cluster and the mesh
//! telemetry for a scenario, and stops all of it when dropped. Used by end-to-end tests, the
//! sandbox and benchmarks. Owns task lifetimes only; never creates Kubernetes objects itself
//! (tests and scenarios create workloads and routes).

use crate::cluster::webhook::{InjectorWebhook, WebhookError};
use crate::cluster::{ClusterConfig, ClusterTasks, SvidCounter};
use crate::mesh::{MeshCluster, MeshTelemetry, Scenario};
use std::collections::BTreeMap;
use std::time::Duration;

/// A world that cannot start.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum WorldError {
    /// No cluster was given.
    #[error("a world needs at least one cluster: call WorldBuilder::cluster before start")]
    NoCluster,
    /// A scenario was given without a Prometheus to write to, or the reverse.
    #[error(
        "mesh telemetry needs both a scenario and a Prometheus URL (got scenario: {scenario}, prometheus: {prometheus})"
    )]
    IncompleteTelemetry {
        /// Whether a scenario was given.
        scenario: bool,
        /// Whether a Prometheus URL was given.
        prometheus: bool,
    },
    /// Two clusters share a name.
    #[error("cluster name {0:?} is given twice; names are the `cluster` label and must be unique")]
    DuplicateCluster(String),
}

impl WorldError {
    /// Bounded error category for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// Builds a [`World`].
#[derive(Default)]
pub struct WorldBuilder {
    clusters: Vec<(ClusterConfig, kube::Client, bool)>,
    prometheus: Option<String>,
    scenario: Option<Scenario>,
    interval: Option<Duration>,
}

impl std::fmt::Debug for WorldBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorldBuilder")
            .field(
                "clusters",
                &self.clusters.iter().map(|c| &c.0.name).collect::<Vec<_>>(),
            )
            .field("prometheus", &self.prometheus)
            .finish()
    }
}

impl WorldBuilder {
    /// Adds a cluster with default cluster behaviour (see [`ClusterConfig::new`]).
    pub fn cluster(self, name: impl Into<String>, client: kube::Client) -> Self {
        self.cluster_with(ClusterConfig::new(name), client)
    }

    /// Adds a cluster with the given cluster-behaviour settings.
    pub fn cluster_with(mut self, config: ClusterConfig, client: kube::Client) -> Self {
        self.clusters.push((config, client, true));
        self
    }

    /// Adds a cluster that only gets telemetry (a real cluster has its own controllers,
    /// kubelets and injector).
    pub fn telemetry_only(mut self, name: impl Into<String>, client: kube::Client) -> Self {
        self.clusters
            .push((ClusterConfig::new(name), client, false));
        self
    }

    /// The Prometheus base URL remote write goes to (`<url>/api/v1/write`).
    pub fn prometheus(mut self, url: impl Into<String>) -> Self {
        self.prometheus = Some(url.into());
        self
    }

    /// The scenario the mesh telemetry plays.
    pub fn scenario(mut self, scenario: Scenario) -> Self {
        self.scenario = Some(scenario);
        self
    }

    /// The telemetry write interval (default [`crate::mesh::DEFAULT_INTERVAL`], 5 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// The mesh telemetry in one call: the scenario it plays, written to the Prometheus at
    /// `url` every `interval` ([`Self::prometheus`], [`Self::scenario`], [`Self::interval`]).
    pub fn telemetry(self, url: impl Into<String>, scenario: Scenario, interval: Duration) -> Self {
        self.prometheus(url).scenario(scenario).interval(interval)
    }

    /// Starts everything. Must be called inside a tokio runtime.
    pub fn start(self) -> Result<World, WorldError> {
        if self.clusters.is_empty() {
            return Err(WorldError::NoCluster);
        }
        let mut names = std::collections::BTreeSet::new();
        for (c, _, _) in &self.clusters {
            if !names.insert(c.name.clone()) {
                return Err(WorldError::DuplicateCluster(c.name.clone()));
            }
        }
        if self.scenario.is_some() != self.prometheus.is_some() {
            return Err(WorldError::IncompleteTelemetry {
                scenario: self.scenario.is_some(),
                prometheus: self.prometheus.is_some(),
            });
        }
        let mut clusters = BTreeMap::new();
        let mut mesh_clusters = Vec::new();
        for (config, client, behave) in self.clusters {
            let svid = behave.then(SvidCounter::new);
            if let Some(svid) = &svid {
                clusters.insert(
                    config.name.clone(),
                    ClusterTasks::start(client.clone(), config.clone(), svid.clone()),
                );
            }
            mesh_clusters.push(MeshCluster {
                name: config.name.clone(),
                client,
                svid,
            });
        }
        let mesh = match (self.scenario, self.prometheus) {
            (Some(scenario), Some(url)) => Some(MeshTelemetry::start(
                scenario,
                mesh_clusters,
                &url,
                self.interval.unwrap_or(crate::mesh::DEFAULT_INTERVAL),
            )),
            _ => None,
        };
        Ok(World {
            clusters,
            mesh,
            injectors: Vec::new(),
        })
    }
}

/// A running world. Dropping it aborts every task; [`World::stop`] does the same explicitly.
#[derive(Debug)]
pub struct World {
    clusters: BTreeMap<String, ClusterTasks>,
    mesh: Option<MeshTelemetry>,
    /// Injector webhooks serving real API servers, stopped with the world.
    injectors: Vec<InjectorWebhook>,
}

impl World {
    /// A new builder.
    pub fn builder() -> WorldBuilder {
        WorldBuilder::default()
    }

    /// The SVID issuance counter of a cluster with cluster behaviour.
    pub fn svid(&self, cluster: &str) -> Option<&SvidCounter> {
        self.clusters.get(cluster).map(ClusterTasks::svid)
    }

    /// Serves Istio's sidecar injector for `cluster` as a real mutating admission webhook
    /// ([`InjectorWebhook`]), registered on the API server of `client` with a serving certificate
    /// from `ca` (the CA that API server trusts), counting injected pods on the cluster's SVID
    /// counter. For a cluster on a real API server ([`ClusterConfig::on_real_control_plane`]),
    /// where the real ReplicaSet controller creates pods and the simulator does not inject. The
    /// webhook stops with the world.
    pub async fn serve_injector(
        &mut self,
        cluster: &str,
        client: kube::Client,
        ca: &sluice_testkit::control_plane::CertificateAuthority,
    ) -> Result<(), WebhookError> {
        let svid = self
            .clusters
            .get(cluster)
            .map(|c| c.svid().clone())
            .ok_or_else(|| {
                WebhookError::Setup(format!(
                    "no cluster {cluster:?} with cluster behaviour in this world"
                ))
            })?;
        self.injectors
            .push(InjectorWebhook::start(client, ca, svid).await?);
        Ok(())
    }

    /// The mesh telemetry, when a scenario runs.
    pub fn mesh(&self) -> Option<&MeshTelemetry> {
        self.mesh.as_ref()
    }

    /// Stops every task now.
    pub fn stop(self) {
        drop(self);
    }
}
