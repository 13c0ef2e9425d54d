//! End to end on a GRPCRoute, against the released Gateway API v1.6.1 GRPCRoute CRD served by
//! the API emulator and the controller in-process (no metrics source: the steps are passed with
//! `promoteThroughStep`, the manual promotion): a Rollout whose `routeRef.kind` is GRPCRoute goes
//! 0 → 5% → 50% → 100% promoted, an abort sets the canary weight to 0 and the deletion then
//! hands the route back, an orphaned ownership annotation is removed, and a missing GRPCRoute
//! CRD is a condition naming it. Every field the operator does not own (parentRefs, hostnames,
//! matches, filters, the other backendRefs and their fields, the other rule) is compared with
//! the route as first stored, as serialized JSON text.

mod common;

use std::{sync::Arc, time::Duration};

use common::{NS, delete_rollout, deployment, eventually, rollout_until, rollouts};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use kube_emulator::Emulator;
use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    Rollout, RolloutPhase,
    rollout::{ROUTE_OWNER_ANNOTATION, conditions, reasons},
};
use sluice_rollout_weights::{
    FIELD_MANAGER, OPERATOR, orphans, reconcile,
    route::{RouteKind, grpc::Grpc},
    triggers,
};
use sluice_runtime::{
    conditions::find,
    events::EventRecorder,
    leader::Leadership,
    operator::{Hooks, drive_with},
};
use sluice_testkit::{
    crds::{emulator_with, sluice_crd},
    prereq::{Upstream, httproute_crd, or_skip, upstream_file},
};
use tokio_util::sync::CancellationToken;

const GRPCROUTE_FILE: &str = "gateway.networking.k8s.io_grpcroutes.yaml";
const STABLE: &str = "payments-v1";
const CANARY: &str = "payments-v2";
const ROUTE: &str = "payments";
const BUDGET: Duration = Duration::from_secs(30);

/// A GRPCRoute with every part of the v1.6.1 schema the operator must carry over: parentRefs,
/// hostnames, method and header matches, filters (a RequestMirror among them), a second backend
/// at weight 0 with filters of its own, and a second rule.
fn payments() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {
            "name": ROUTE, "namespace": NS,
            "labels": {"app": "payments"},
            "annotations": {"team": "payments"}
        },
        "spec": {
            "parentRefs": [{"name": "mesh-gw", "namespace": "gateways", "sectionName": "grpc"}],
            "hostnames": ["payments.example.com"],
            "rules": [
                {
                    "name": "charge",
                    "matches": [{
                        "method": {"type": "Exact", "service": "pay.v1.Payments", "method": "Charge"},
                        "headers": [{"type": "Exact", "name": "x-tenant", "value": "a"}]
                    }],
                    "filters": [
                        {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-route", "value": "grpc"}]}},
                        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 9000}, "percent": 5}}
                    ],
                    "backendRefs": [
                        {"name": STABLE, "port": 80, "weight": 100},
                        {"name": "audit", "port": 9000, "weight": 0, "filters": [
                            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-audit", "value": "1"}]}}
                        ]}
                    ]
                },
                {
                    "name": "health",
                    "matches": [{"method": {"service": "grpc.health.v1.Health"}}],
                    "backendRefs": [{"name": "health", "port": 9000}]
                }
            ]
        }
    })
}

fn grpc_routes(client: &Client) -> Api<DynamicObject> {
    Grpc::api(client.clone(), Some(NS))
}

/// The Rollout `shop/checkout` of the payments GRPCRoute; `patch` overrides spec fields.
fn rollout(patch: Value) -> Rollout {
    let mut spec = json!({
        "routeRef": {"kind": "GRPCRoute", "name": ROUTE, "ruleName": "charge"},
        "stableService": {"name": STABLE},
        "canaryService": {"name": CANARY},
        "canaryWorkload": {"name": CANARY},
        "analysisInterval": "1s",
        "stepDuration": "600s",
        "appliedShareDeadline": "600s",
        "canaryReadyDeadline": "60s",
        "steps": [
            {"setWeight": {"weight": 5}},
            {"setWeight": {"weight": 50}},
            {"promote": {}}
        ],
    });
    for (k, v) in patch.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "checkout", "namespace": NS},
        "spec": spec,
    }))
    .unwrap()
}

/// The emulator with the released Gateway API CRDs (`grpc`: the GRPCRoute one too) and
/// sluice's, the namespace, both versions' Deployments (ready) and Services, and the payments
/// GRPCRoute when `grpc`. `None` when a prerequisite is missing.
async fn world(grpc: bool) -> Option<(Emulator, Client)> {
    let http = or_skip(httproute_crd())?;
    let mut files = vec![
        http,
        sluice_crd("rollouts.sluice.dev.yaml"),
        sluice_crd("gatetemplates.sluice.dev.yaml"),
    ];
    if grpc {
        files.push(or_skip(upstream_file(
            Upstream::GatewayApi,
            GRPCROUTE_FILE,
        ))?);
    }
    let emu = emulator_with(files).await;
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    let client = emu.client();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    for name in [STABLE, CANARY] {
        emu.load_yaml(&deployment(name)).unwrap();
        let d = deployments.get(name).await.unwrap();
        let status = json!({"status": {
            "observedGeneration": d.metadata.generation.unwrap_or(1),
            "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1
        }});
        deployments
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    if grpc {
        let route: DynamicObject = serde_json::from_value(payments()).unwrap();
        grpc_routes(&client)
            .create(&PostParams::default(), &route)
            .await
            .expect("the released schema accepts the route");
    }
    Some((emu, client))
}

/// The Rollout controller (with its triggers, GRPCRoutes watched when their CRD is installed)
/// and the GRPCRoute orphan controller, in-process, without a metrics source.
struct Running {
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    async fn start(client: &Client) -> Running {
        let ctx =
            reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
        let (hooks, _) = Hooks::standalone();
        hooks.health.set_leader(true);
        let shutdown = CancellationToken::new();
        let mut watched = triggers::Watched::new(client, None);
        watched.grpc_routes = triggers::grpc_routes(client, client, None).await;
        let mut tasks = Vec::new();
        if let Some(api) = watched.grpc_routes.clone() {
            tasks.push(tokio::spawn(orphans::run_kind::<Grpc>(
                api,
                client.clone(),
                Leadership::always(),
                EventRecorder::new(client.clone(), OPERATOR),
            )));
        }
        let extend = triggers::sharing_store(
            ctx.rollouts.clone(),
            triggers::with_triggers(watched, watcher::Config::default()),
        );
        tasks.push(tokio::spawn(drive_with(
            Api::<Rollout>::all(client.clone()),
            watcher::Config::default(),
            Arc::new(ctx),
            reconcile::reconcile,
            Leadership::always(),
            shutdown.clone(),
            hooks,
            extend,
        )));
        Running { shutdown, tasks }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            t.abort();
        }
    }
}

/// The charge rule's backendRefs as `(name, weight)`.
fn backends(route: &DynamicObject) -> Vec<(String, i64)> {
    route.data["spec"]["rules"][0]["backendRefs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_owned(),
                b["weight"].as_i64().unwrap_or(1),
            )
        })
        .collect()
}

/// Waits until the charge rule's backends are `want`.
async fn route_at(client: &Client, what: &str, want: &[(&str, i64)]) -> DynamicObject {
    let want: Vec<(String, i64)> = want.iter().map(|(n, w)| ((*n).to_owned(), *w)).collect();
    let api = grpc_routes(client);
    eventually(what, BUDGET, async || {
        let r = api.get(ROUTE).await.map_err(|e| e.to_string())?;
        if backends(&r) == want {
            Ok(r)
        } else {
            Err(format!("{:?}", backends(&r)))
        }
    })
    .await
}

/// The route as first stored with only what the operator owns changed: the stable weight, the
/// canary backendRef (after stable, as the CRD defaults it) at `canary`.
fn expected_spec(original: &DynamicObject, stable: i64, canary: i64) -> String {
    let mut spec = original.data["spec"].clone();
    let refs = spec["rules"][0]["backendRefs"].as_array_mut().unwrap();
    refs[0]["weight"] = json!(stable);
    refs.insert(
        1,
        json!({"group": "", "kind": "Service", "name": CANARY, "port": 80, "weight": canary}),
    );
    serde_json::to_string(&spec).unwrap()
}

fn spec_text(route: &DynamicObject) -> String {
    serde_json::to_string(&route.data["spec"]).unwrap()
}

fn owner(route: &DynamicObject) -> Option<String> {
    route
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROUTE_OWNER_ANNOTATION))
        .cloned()
}

/// The labels and annotations other than the ownership annotation.
fn foreign_metadata(route: &DynamicObject) -> String {
    let mut annotations = route.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(ROUTE_OWNER_ANNOTATION);
    format!("{:?} {annotations:?}", route.metadata.labels)
}

fn managers(route: &DynamicObject) -> Vec<String> {
    route
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

async fn control(client: &Client, patch: Value) {
    rollouts(client)
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": patch })),
        )
        .await
        .expect("control accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_on_a_grpcroute_goes_through_its_weights_to_promotion_then_hands_back() {
    let Some((_emu, client)) = world(true).await else {
        return;
    };
    let original = grpc_routes(&client).get(ROUTE).await.unwrap();
    let ctl = Running::start(&client).await;
    rollouts(&client)
        .create(&PostParams::default(), &rollout(json!({})))
        .await
        .unwrap();

    // Step 0: 5% to the canary, its backendRef added after stable; the route owned.
    let at_five = route_at(
        &client,
        "5% on the GRPCRoute",
        &[(STABLE, 95), (CANARY, 5), ("audit", 0)],
    )
    .await;
    assert_eq!(spec_text(&at_five), expected_spec(&original, 95, 5));
    assert_eq!(owner(&at_five).as_deref(), Some("shop/checkout"));
    assert_eq!(foreign_metadata(&at_five), foreign_metadata(&original));
    assert!(managers(&at_five).contains(&FIELD_MANAGER.as_str().to_owned()));

    // Step 1: 50%, once step 0 is promoted by hand.
    control(&client, json!({"promoteThroughStep": 0})).await;
    let at_fifty = route_at(
        &client,
        "50% on the GRPCRoute",
        &[(STABLE, 50), (CANARY, 50), ("audit", 0)],
    )
    .await;
    assert_eq!(spec_text(&at_fifty), expected_spec(&original, 50, 50));

    // Then 100%: Promoted, the route still owned.
    control(&client, json!({"promoteThroughStep": 1})).await;
    let promoted = rollout_until(&client, "Promoted", BUDGET, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == RolloutPhase::Promoted)
    })
    .await;
    let at_full = route_at(
        &client,
        "100% on the GRPCRoute",
        &[(STABLE, 0), (CANARY, 100), ("audit", 0)],
    )
    .await;
    assert_eq!(spec_text(&at_full), expected_spec(&original, 0, 100));
    assert_eq!(owner(&at_full).as_deref(), Some("shop/checkout"));
    assert!(promoted.status.is_some_and(|s| s.owned_route.is_some()));
    // The status records the route's last write; the write and its record are two requests, so
    // the two are compared until they meet.
    eventually("the last route write is recorded", BUDGET, async || {
        let route = grpc_routes(&client)
            .get(ROUTE)
            .await
            .map_err(|e| e.to_string())?;
        let recorded = rollouts(&client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?
            .status
            .and_then(|s| s.owned_route)
            .and_then(|o| o.last_written_resource_version);
        if recorded.is_some() && recorded == route.metadata.resource_version {
            Ok(())
        } else {
            Err(format!(
                "recorded {recorded:?}, route at {:?}",
                route.metadata.resource_version
            ))
        }
    })
    .await;

    // Deleting the promoted Rollout hands the route back: ownership annotation and this
    // manager's entry removed, nothing else.
    delete_rollout(&client, BUDGET).await;
    let back = grpc_routes(&client).get(ROUTE).await.unwrap();
    assert_eq!(owner(&back), None);
    assert!(
        !managers(&back).contains(&FIELD_MANAGER.as_str().to_owned()),
        "{:?}",
        managers(&back)
    );
    assert_eq!(spec_text(&back), expected_spec(&original, 0, 100));
    assert_eq!(foreign_metadata(&back), foreign_metadata(&original));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_on_a_grpcroute_sets_the_canary_to_zero_and_the_route_is_handed_back() {
    let Some((_emu, client)) = world(true).await else {
        return;
    };
    let original = grpc_routes(&client).get(ROUTE).await.unwrap();
    let ctl = Running::start(&client).await;
    rollouts(&client)
        .create(&PostParams::default(), &rollout(json!({})))
        .await
        .unwrap();
    route_at(
        &client,
        "5% on the GRPCRoute",
        &[(STABLE, 95), (CANARY, 5), ("audit", 0)],
    )
    .await;

    // When the release engineer aborts.
    control(&client, json!({"abort": true})).await;

    // Then the canary weight is 0 in one write, and the abort records it.
    let aborted = route_at(
        &client,
        "canary weight 0 on the GRPCRoute",
        &[(STABLE, 100), (CANARY, 0), ("audit", 0)],
    )
    .await;
    assert_eq!(spec_text(&aborted), expected_spec(&original, 100, 0));
    let r = rollout_until(&client, "Aborted with the route reverted", BUDGET, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == RolloutPhase::Aborted
                && s.abort
                    .as_ref()
                    .is_some_and(|a| a.route_reverted_at.is_some())
        })
    })
    .await;
    assert!(
        find(&r.status.unwrap().conditions, conditions::ROUTE_OWNED)
            .is_none_or(|c| c.reason != reasons::ROUTE_NOT_FOUND)
    );

    // And deleting the aborted Rollout hands the route back as it is.
    delete_rollout(&client, BUDGET).await;
    let back = grpc_routes(&client).get(ROUTE).await.unwrap();
    assert_eq!(owner(&back), None);
    assert!(!managers(&back).contains(&FIELD_MANAGER.as_str().to_owned()));
    assert_eq!(spec_text(&back), expected_spec(&original, 100, 0));
    assert_eq!(foreign_metadata(&back), foreign_metadata(&original));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_grpcroute_ownership_is_removed_and_nothing_else() {
    let Some((_emu, client)) = world(true).await else {
        return;
    };
    let api = grpc_routes(&client);
    let mut orphan = api.get(ROUTE).await.unwrap();
    orphan
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ROUTE_OWNER_ANNOTATION.into(), "shop/gone".into());
    let orphan = api
        .replace(ROUTE, &PostParams::default(), &orphan)
        .await
        .unwrap();
    let ctl = Running::start(&client).await;
    let freed = eventually(
        "the orphan's ownership annotation removed",
        BUDGET,
        async || {
            let r = api.get(ROUTE).await.map_err(|e| e.to_string())?;
            match owner(&r) {
                None => Ok(r),
                Some(o) => Err(format!("still owned by {o}")),
            }
        },
    )
    .await;
    assert_eq!(spec_text(&freed), spec_text(&orphan));
    assert_eq!(foreign_metadata(&freed), foreign_metadata(&orphan));
    let e = eventually("an OrphanedOwnership Event", BUDGET, async || {
        common::events(&client, orphans::ORPHANED_OWNERSHIP)
            .await
            .into_iter()
            .next()
            .ok_or_else(|| "no OrphanedOwnership Event".to_owned())
    })
    .await;
    let regarding = e.regarding.unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("GRPCRoute"));
    assert_eq!(regarding.name.as_deref(), Some(ROUTE));
    assert!(
        e.note
            .as_deref()
            .unwrap_or_default()
            .starts_with("GRPCRoute shop/payments carried"),
        "{:?}",
        e.note
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_grpcroute_crd_the_rollout_says_so() {
    let Some((_emu, client)) = world(false).await else {
        return;
    };
    let ctl = Running::start(&client).await;
    rollouts(&client)
        .create(&PostParams::default(), &rollout(json!({})))
        .await
        .unwrap();
    let r = rollout_until(&client, "RouteOwned=False naming the CRD", BUDGET, |r| {
        r.status.as_ref().is_some_and(|s| {
            find(&s.conditions, conditions::ROUTE_OWNED).is_some_and(|c| {
                c.status == "False"
                    && c.reason == reasons::ROUTE_NOT_FOUND
                    && c.message.contains(Grpc::CRD)
            })
        })
    })
    .await;
    let status = r.status.unwrap();
    assert!(status.owned_route.is_none(), "{:?}", status.owned_route);
    ctl.stop().await;
}
