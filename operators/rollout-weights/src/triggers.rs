//! The Rollout controller's second triggers: a change of a Rollout's canary workload (a new
//! version, readiness), of its canary Service (gone or back), or of its route (an HTTPRoute, or a
//! GRPCRoute once that CRD is installed, at start or later; a foreign edit, a BundlePin's
//! rewrite) reconciles that Rollout at once, instead of at its next analysis or
//! deadline — during a `pause: {untilPromoted: true}` step or after promotion there may be none
//! for a long time.
//!
//! An edit of a GateTemplate reconciles the Rollouts whose gates reference it.
//!
//! Owns only the mapping from those objects to the Rollouts that reference them, read from the
//! controller's own store. Never decides and never writes.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, StatefulSet},
        core::v1::Service,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Resource, ResourceExt,
    api::DynamicObject,
    runtime::{Controller, WatchStreamExt, reflector::ObjectRef, reflector::Store, watcher},
};
use sluice_api::v1alpha1::{GateTemplate, Rollout};

use crate::{
    reconcile::RolloutStore,
    route::{self, Route, RouteKind, Wired, grpc::Grpc},
};

/// The Rollouts whose gates reference the GateTemplate `name`.
pub fn template_refs(rollouts: &Store<Rollout>, name: &str) -> Vec<ObjectRef<Rollout>> {
    rollouts
        .state()
        .iter()
        .filter(|r| {
            r.spec
                .gates
                .iter()
                .any(|g| g.template_ref.as_deref() == Some(name))
        })
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// `extend`, after publishing the controller's store into `slot` (the reconciles read manual
/// controls there while they wait on analysis): each new controller's, one per term of
/// leadership, in place of the last.
pub fn sharing_store(
    slot: RolloutStore,
    extend: impl Fn(Controller<Rollout>) -> Controller<Rollout>,
) -> impl Fn(Controller<Rollout>) -> Controller<Rollout> {
    move |controller| {
        slot.publish(controller.store());
        extend(controller)
    }
}

/// The Rollouts in `rollouts` that `pick` selects, as references to reconcile.
fn refs(
    rollouts: &Store<Rollout>,
    namespace: Option<String>,
    pick: impl Fn(&Rollout) -> bool,
) -> Vec<ObjectRef<Rollout>> {
    rollouts
        .state()
        .iter()
        .filter(|r| r.namespace() == namespace && pick(r))
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// The Rollouts whose canary workload is `obj` (matched on kind, namespace and name).
fn workload_refs<K: Resource<DynamicType = ()>>(
    rollouts: &Store<Rollout>,
    obj: &K,
) -> Vec<ObjectRef<Rollout>> {
    let kind = K::kind(&());
    let name = obj.meta().name.clone().unwrap_or_default();
    refs(rollouts, obj.meta().namespace.clone(), |r| {
        r.spec.canary_workload.kind == kind && r.spec.canary_workload.name == name
    })
}

/// The Rollouts a route change concerns: its owner (the annotation) and any Rollout naming it.
pub fn route_refs<R: Resource>(rollouts: &Store<Rollout>, route: &R) -> Vec<ObjectRef<Rollout>> {
    let ns = route.meta().namespace.clone();
    let name = route.meta().name.clone().unwrap_or_default();
    let owner = route::owner(route).cloned();
    refs(rollouts, ns.clone(), |r| {
        r.spec.route_ref.name == name
            || r.spec.additional_routes.iter().any(|a| a.name == name)
            || owner.as_deref()
                == Some(&format!(
                    "{}/{}",
                    ns.clone().unwrap_or_default(),
                    r.name_any()
                ))
    })
}

/// The APIs the triggers watch (scoped like the Rollouts' own).
#[derive(Clone)]
pub struct Watched {
    /// Deployments (canary workloads).
    pub deployments: Api<Deployment>,
    /// StatefulSets (canary workloads).
    pub statefulsets: Api<StatefulSet>,
    /// Services (canary Services).
    pub services: Api<Service>,
    /// HTTPRoutes.
    pub routes: Api<Route>,
    /// GRPCRoutes, watched once their CRD is installed ([`GrpcRoutes`]); `None`: not watched.
    pub grpc_routes: Option<GrpcRoutes>,
    /// GateTemplates (cluster-scoped).
    pub gate_templates: Api<GateTemplate>,
}

/// How often a missing GRPCRoute CRD is looked for again.
pub const GRPC_ROUTE_CRD_POLL: Duration = Duration::from_secs(30);

/// The GRPCRoutes to watch, once their CRD is installed: the CRD may come after the operator
/// (Gateway API's experimental or later standard bundle applied to a running cluster), so it is
/// looked for every `poll` until it is there, and only then watched. Until then the Rollouts on
/// a GRPCRoute say why in their condition and are reconciled on their own schedule.
#[derive(Clone)]
pub struct GrpcRoutes {
    /// The GRPCRoutes (cluster-wide or in the operator's namespace), on the watch client.
    pub api: Api<DynamicObject>,
    /// Reads the GRPCRoute CRD.
    pub client: kube::Client,
    /// How often a missing CRD is looked for again.
    pub poll: Duration,
}

impl GrpcRoutes {
    /// The GRPCRoutes of `namespace` (all: `None`) on `watch_client`, their CRD read with
    /// `client` every [`GRPC_ROUTE_CRD_POLL`] until it is installed.
    pub fn new(
        client: &kube::Client,
        watch_client: &kube::Client,
        namespace: Option<&str>,
    ) -> Self {
        Self {
            api: Grpc::api(watch_client.clone(), namespace),
            client: client.clone(),
            poll: GRPC_ROUTE_CRD_POLL,
        }
    }

    /// Resolves once the GRPCRoute CRD is installed; says once why it waits.
    pub async fn installed(&self) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut waited = false;
        loop {
            match crds.get_opt(Grpc::CRD).await {
                Ok(Some(_)) => {
                    if waited {
                        tracing::info!(
                            crd = Grpc::CRD,
                            "GRPCRoute CRD installed; watching GRPCRoutes"
                        );
                    }
                    return;
                }
                Ok(None) if !waited => tracing::info!(
                    crd = Grpc::CRD,
                    every = ?self.poll,
                    "GRPCRoute CRD not installed; GRPCRoutes are watched once it is"
                ),
                Err(e) if !waited => tracing::warn!(
                    error = %e,
                    crd = Grpc::CRD,
                    every = ?self.poll,
                    "cannot read the GRPCRoute CRD (check the operator's RBAC); GRPCRoutes are watched, and orphaned GRPCRoute ownership swept, once it can be read"
                ),
                _ => {}
            }
            waited = true;
            tokio::time::sleep(self.poll).await;
        }
    }

    /// The changes of GRPCRoutes, from the moment their CRD is installed.
    pub fn changes(
        &self,
        config: watcher::Config,
    ) -> impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static {
        let this = self.clone();
        futures::stream::once(async move {
            this.installed().await;
            watcher(this.api, config)
                .default_backoff()
                .touched_objects()
        })
        .flatten()
    }
}

impl Watched {
    /// Every watched API on `client`, cluster-wide or in `namespace`; GRPCRoutes not watched
    /// (set [`Watched::grpc_routes`] to watch them).
    pub fn new(client: &kube::Client, namespace: Option<&str>) -> Self {
        fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
        where
            K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
        {
            match namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            }
        }
        Self {
            deployments: api(client, namespace),
            statefulsets: api(client, namespace),
            services: api(client, namespace),
            routes: Wired::api(client.clone(), namespace),
            grpc_routes: None,
            gate_templates: Api::all(client.clone()),
        }
    }
}

/// Adds the triggers to a new Rollout controller.
pub fn with_triggers(
    watched: Watched,
    config: watcher::Config,
) -> impl Fn(Controller<Rollout>) -> Controller<Rollout> {
    move |controller| {
        let store = controller.store();
        let (s1, s2, s3, s4, s5, s6) = (
            store.clone(),
            store.clone(),
            store.clone(),
            store.clone(),
            store.clone(),
            store,
        );
        let controller = match &watched.grpc_routes {
            Some(grpc) => controller.watches_stream_with(
                grpc.changes(config.clone()),
                move |route: DynamicObject| route_refs(&s6, &route),
                Grpc::api_resource(),
            ),
            None => controller,
        };
        controller
            .watches(
                watched.deployments.clone(),
                config.clone(),
                move |d: Deployment| workload_refs(&s1, &d),
            )
            .watches(
                watched.statefulsets.clone(),
                config.clone(),
                move |s: StatefulSet| workload_refs(&s2, &s),
            )
            .watches(
                watched.services.clone(),
                config.clone(),
                move |svc: Service| {
                    let name = svc.name_any();
                    refs(&s3, svc.namespace(), |r| r.spec.canary_service.name == name)
                },
            )
            .watches(
                watched.routes.clone(),
                config.clone(),
                move |route: Route| route_refs(&s4, &route),
            )
            .watches(
                watched.gate_templates.clone(),
                config.clone(),
                move |t: GateTemplate| template_refs(&s5, &t.name_any()),
            )
    }
}
