//! The Rollout controller's second triggers: a change of a Rollout's canary workload (a new
//! version, readiness), of its canary Service (gone or back), or of its route (an HTTPRoute, or a
//! GRPCRoute when that CRD was installed at start; a foreign edit, a BundlePin's rewrite)
//! reconciles that Rollout at once, instead of at its next analysis or
//! deadline — during a `pause: {untilPromoted: true}` step or after promotion there may be none
//! for a long time.
//!
//! An edit of a GateTemplate reconciles the Rollouts whose gates reference it.
//!
//! Owns only the mapping from those objects to the Rollouts that reference them, read from the
//! controller's own store. Never decides and never writes.

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
    runtime::{Controller, reflector::ObjectRef, reflector::Store, watcher},
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
/// controls there while they wait on analysis).
pub fn sharing_store(
    slot: RolloutStore,
    extend: impl Fn(Controller<Rollout>) -> Controller<Rollout>,
) -> impl Fn(Controller<Rollout>) -> Controller<Rollout> {
    move |controller| {
        let _ = slot.set(controller.store());
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
    /// GRPCRoutes, when their CRD is installed (see [`grpc_routes`]); `None`: not watched.
    pub grpc_routes: Option<Api<DynamicObject>>,
    /// GateTemplates (cluster-scoped).
    pub gate_templates: Api<GateTemplate>,
}

/// The GRPCRoutes to watch with `watch_client` (cluster-wide or in `namespace`) when the
/// GRPCRoute CRD is installed, as `client` reads it now; `None` when it is not, or cannot be
/// read (a watch would fail until it is: the Rollouts on a GRPCRoute say so in their condition,
/// they are still reconciled on their own schedule, and a restart picks the CRD up).
pub async fn grpc_routes(
    client: &kube::Client,
    watch_client: &kube::Client,
    namespace: Option<&str>,
) -> Option<Api<DynamicObject>> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.get_opt(Grpc::CRD).await {
        Ok(Some(_)) => Some(Grpc::api(watch_client.clone(), namespace)),
        Ok(None) => {
            tracing::info!(
                crd = Grpc::CRD,
                "GRPCRoute CRD not installed; GRPCRoutes are not watched"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, crd = Grpc::CRD, "cannot read the GRPCRoute CRD (check the operator's RBAC); GRPCRoutes are not watched, and orphaned GRPCRoute ownership is not swept");
            None
        }
    }
}

impl Watched {
    /// Every watched API on `client`, cluster-wide or in `namespace`; GRPCRoutes not watched
    /// (set [`Watched::grpc_routes`] from [`grpc_routes`]).
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
        let controller = match watched.grpc_routes.clone() {
            Some(api) => controller.watches_with(
                api,
                Grpc::api_resource(),
                config.clone(),
                move |route: DynamicObject| route_refs(&s6, &route),
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
