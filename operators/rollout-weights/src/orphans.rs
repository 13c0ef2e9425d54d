//! Orphaned route ownership: a route (HTTPRoute, and GRPCRoute where its CRD is installed) whose
//! `sluice.dev/owned-by-rollout` annotation names a Rollout that no longer exists (its finalizer was removed by hand, or it was deleted while this
//! operator was down and its hand-back never ran) would keep the owned-route admission policy
//! denying every Git change to it. This controller reports it (a Warning Event on the route,
//! reason `OrphanedOwnership`, and a log line) and removes the annotation under this operator's
//! field manager, as a hand-back would. It never touches the route's rules: Argo CD's self-heal
//! applies Git to them once the route is free again.
//!
//! Pure: [`owner_of`] (the route seam's). I/O: [`run`] (one controller per route kind), writing
//! only while this replica leads.

use std::{marker::PhantomData, sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use sluice_api::v1alpha1::{Rollout, rollout::ROUTE_OWNER_ANNOTATION};
use sluice_runtime::{
    events::{EventRecorder, Severity},
    leader::Leadership,
};

pub use crate::route::owner_of;
use crate::{
    reconcile::{ReconcileError, hand_back},
    route::{Driven, Route, http::Http},
};

/// Event reason of a removed orphaned ownership.
pub const ORPHANED_OWNERSHIP: &str = "OrphanedOwnership";

/// How often a standby replica looks again (it writes nothing until it leads).
const STANDBY_RECHECK: Duration = Duration::from_secs(30);

struct Ctx<K> {
    client: Client,
    leadership: Leadership,
    recorder: EventRecorder,
    kind: PhantomData<fn() -> K>,
}

async fn reconcile<K: Driven>(
    route: Arc<K::Route>,
    ctx: Arc<Ctx<K>>,
) -> Result<Action, ReconcileError> {
    let Some((ns, name)) = owner_of(route.as_ref()) else {
        return Ok(Action::await_change());
    };
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(STANDBY_RECHECK));
    }
    let rollouts: Api<Rollout> = Api::namespaced(ctx.client.clone(), &ns);
    let key = format!("{ns}/{name}");
    let exists = rollouts
        .get_opt(&name)
        .await
        .map_err(|source| ReconcileError::Read {
            what: "the Rollout its route's ownership annotation names".into(),
            rollout: key.clone(),
            source,
        })?
        .is_some();
    if exists {
        return Ok(Action::await_change());
    }
    let route_ns = route.namespace().unwrap_or_default();
    let routes = K::api(ctx.client.clone(), Some(&route_ns));
    hand_back::<K>(&ctx.leadership, &routes, &route.name_any(), &key).await?;
    let note = format!(
        "{} carried {ROUTE_OWNER_ANNOTATION}={key}, but Rollout {key} does not exist: the ownership annotation was removed so Git can change the route again",
        K::describe(&format!("{route_ns}/{}", route.name_any()))
    );
    tracing::warn!(route = %route.name_any(), namespace = %route_ns, rollout = %key, "{note}");
    ctx.recorder
        .publish_ref(
            &route.object_ref(&K::dynamic_type()),
            Severity::Warning,
            ORPHANED_OWNERSHIP,
            "HandBack",
            &note,
        )
        .await;
    Ok(Action::await_change())
}

fn error_policy<K: Driven>(_: Arc<K::Route>, err: &ReconcileError, _: Arc<Ctx<K>>) -> Action {
    tracing::warn!(error = %err, "orphaned route ownership not removed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the orphaned-ownership controller over the HTTPRoutes `routes` (watched with its
/// client) until the watch ends; reads Rollouts and writes routes with `client`, only while
/// `leadership` holds.
pub async fn run(
    routes: Api<Route>,
    client: Client,
    leadership: Leadership,
    recorder: EventRecorder,
) {
    run_kind::<Http>(routes, client, leadership, recorder).await;
}

/// [`run`] over the GRPCRoutes, from the moment their CRD is installed.
pub async fn run_when_installed(
    routes: crate::triggers::GrpcRoutes,
    client: Client,
    leadership: Leadership,
    recorder: EventRecorder,
) {
    routes.installed().await;
    run_kind::<crate::route::grpc::Grpc>(routes.api, client, leadership, recorder).await;
}

/// [`run`] over `routes` of kind `K`.
pub async fn run_kind<K: Driven>(
    routes: Api<K::Route>,
    client: Client,
    leadership: Leadership,
    recorder: EventRecorder,
) {
    let ctx = Arc::new(Ctx::<K> {
        client,
        leadership,
        recorder,
        kind: PhantomData,
    });
    Controller::new_with(routes, watcher::Config::default(), K::dynamic_type())
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_read_from_the_annotation() {
        let route = |v: Option<&str>| {
            let mut r: crate::route::Route = serde_json::from_value(serde_json::json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "HTTPRoute",
                "metadata": {"name": "checkout", "namespace": "shop"},
                "spec": {},
            }))
            .unwrap();
            if let Some(v) = v {
                r.annotations_mut()
                    .insert(ROUTE_OWNER_ANNOTATION.into(), v.into());
            }
            r
        };
        assert_eq!(
            owner_of(&route(Some("shop/checkout"))),
            Some(("shop".into(), "checkout".into()))
        );
        assert_eq!(owner_of(&route(None)), None);
        assert_eq!(owner_of(&route(Some("checkout"))), None);
        assert_eq!(owner_of(&route(Some("/checkout"))), None);
    }
}
