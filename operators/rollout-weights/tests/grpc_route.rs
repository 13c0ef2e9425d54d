//! End to end on a GRPCRoute, against the released Gateway API v1.6.1 GRPCRoute CRD served by
//! the API emulator and the controller in-process (no metrics source: the steps are passed with
//! `promoteThroughStep`, the manual promotion): a Rollout whose `routeRef.kind` is GRPCRoute goes
//! 0 → 5% → 50% → 100% promoted, an abort sets the canary weight to 0 and the deletion then
//! hands the route back, a mirror step copies only the methods it declares and goes with the
//! first weight, a header-cohort step sends the calls carrying its header to the canary, is kept
//! into the 5% step with `keepCohort` and goes with the abort, an orphaned ownership annotation is removed, and a missing GRPCRoute CRD is a
//! condition naming it until it is installed (then GRPCRoutes are watched without a restart). Every field the operator does not own (parentRefs, hostnames,
//! matches, filters, the other backendRefs and their fields, the other rule) is compared with
//! the route as first stored, as serialized JSON text.

mod common;

use std::time::Duration;

use common::{
    Controller, GRPC_CANARY as CANARY, GRPC_ROUTE as ROUTE, GRPC_STABLE as STABLE, RouteCrd,
    RouteKindName, create_rollout, delete_rollout, eventually, given_route, grpc_routes,
    install_grpc_route_crd, payments_route, rollout_on, rollout_until, rollouts,
};
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    Rollout, RolloutPhase,
    rollout::{ROUTE_OWNER_ANNOTATION, conditions, reasons},
};
use sluice_rollout_weights::{
    FIELD_MANAGER, orphans,
    route::{RouteKind, grpc::Grpc},
};
use sluice_runtime::conditions::find;

const GRPC: RouteKindName = RouteKindName::GrpcRoute;
const BUDGET: Duration = Duration::from_secs(30);

/// The Rollout on the payments GRPCRoute: 5%, 50%, then promotion, each step passed by hand.
/// No gates (there is no metrics source), and a step duration and an applied-share deadline no
/// test reaches.
fn rollout() -> Rollout {
    rollout_on(
        GRPC,
        json!([
            {"setWeight": {"weight": 5}},
            {"setWeight": {"weight": 50}},
            {"promote": {}}
        ]),
        json!({"stepDuration": "600s", "appliedShareDeadline": "600s", "gates": []}),
    )
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

/// Waits until the GRPCRoute `name` carries no ownership annotation.
async fn unowned(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    eventually(
        "the orphan's ownership annotation removed",
        BUDGET,
        async || {
            let r = api.get(name).await.map_err(|e| e.to_string())?;
            match owner(&r) {
                None => Ok(r),
                Some(o) => Err(format!("still owned by {o}")),
            }
        },
    )
    .await
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

/// Waits until the route's first rule is `name` (a rule this operator adds, or the charge rule
/// once they are gone).
async fn first_rule(api: &Api<DynamicObject>, what: &str, name: &str) -> DynamicObject {
    eventually(what, BUDGET, async || {
        let r = api.get(ROUTE).await.map_err(|e| e.to_string())?;
        if r.data["spec"]["rules"][0]["name"] == name {
            Ok(r)
        } else {
            Err(spec_text(&r))
        }
    })
    .await
}

/// Waits until the route's first rule is `name`, then checks the route is `expected` (its spec
/// as serialized text), owned by the Rollout, with the rest of `original`'s metadata as it was.
async fn rule_written(
    api: &Api<DynamicObject>,
    what: &str,
    name: &str,
    expected: &str,
    original: &DynamicObject,
) -> DynamicObject {
    let route = first_rule(api, what, name).await;
    assert_eq!(spec_text(&route), expected);
    assert_eq!(owner(&route).as_deref(), Some("shop/checkout"));
    assert_eq!(foreign_metadata(&route), foreign_metadata(original));
    route
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
    let Some(g) = given_route(GRPC, RouteCrd::Installed).await else {
        return;
    };
    let client = g.client.clone();
    let original = grpc_routes(&client).get(ROUTE).await.unwrap();
    let ctl = Controller::start_on(&client, GRPC, None).await;
    create_rollout(&client, &rollout()).await;

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
    let Some(g) = given_route(GRPC, RouteCrd::Installed).await else {
        return;
    };
    let client = g.client.clone();
    let original = grpc_routes(&client).get(ROUTE).await.unwrap();
    let ctl = Controller::start_on(&client, GRPC, None).await;
    create_rollout(&client, &rollout()).await;
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
async fn a_mirror_step_on_a_grpcroute_copies_only_the_declared_methods_then_goes() {
    let Some(g) = given_route(GRPC, RouteCrd::Installed).await else {
        return;
    };
    let client = g.client.clone();
    // The charge rule serves the whole Payments service (reads and writes).
    let api = grpc_routes(&client);
    api.patch(
        ROUTE,
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([{
                "op": "replace",
                "path": "/spec/rules/0/matches/0/method",
                "value": {"type": "Exact", "service": "pay.v1.Payments"}
            }]))
            .unwrap(),
        ),
    )
    .await
    .expect("the charge rule serves the whole service");
    let original = api.get(ROUTE).await.unwrap();
    let ctl = Controller::start_on(&client, GRPC, None).await;
    create_rollout(
        &client,
        &rollout_on(
            GRPC,
            json!([
                {"mirror": {"percent": 50, "grpcMethods": [
                    {"service": "pay.v1.Payments", "method": "GetReceipt"},
                    {"service": "pay.v1.Payments", "method": "ListCharges"}
                ]}},
                {"setWeight": {"weight": 5}},
                {"promote": {}}
            ]),
            json!({"stepDuration": "600s", "appliedShareDeadline": "600s", "gates": []}),
        ),
    )
    .await;

    // The mirror rule: the charge rule (backends, filters) narrowed to the declared methods,
    // with a copy of each request to the canary, just before the charge rule; the rest as read.
    let mut mirror = original.data["spec"]["rules"][0].clone();
    mirror["name"] = json!("sluice-mirror");
    let base = mirror["matches"][0].clone();
    mirror["matches"] = json!(
        ["GetReceipt", "ListCharges"]
            .iter()
            .map(|m| {
                let mut narrowed = base.clone();
                narrowed["method"] =
                    json!({"type": "Exact", "service": "pay.v1.Payments", "method": m});
                narrowed
            })
            .collect::<Vec<_>>()
    );
    mirror["filters"].as_array_mut().unwrap().push(json!({
        "type": "RequestMirror",
        "requestMirror": {
            "backendRef": {"group": "", "kind": "Service", "name": CANARY, "port": 80},
            "percent": 50
        }
    }));
    let mut expected = original.data["spec"].clone();
    expected["rules"].as_array_mut().unwrap().insert(0, mirror);
    let expected = serde_json::to_string(&expected).unwrap();
    rule_written(
        &api,
        "the mirror rule on the GRPCRoute",
        "sluice-mirror",
        &expected,
        &original,
    )
    .await;
    rollout_until(&client, "the mirror recorded", BUDGET, |r| {
        r.status.as_ref().is_some_and(|s| s.mirror_active)
    })
    .await;

    // The first weight step removes the mirror rule in the same write that sets 5%.
    control(&client, json!({"promoteThroughStep": 0})).await;
    let at_five = route_at(
        &client,
        "5% on the GRPCRoute",
        &[(STABLE, 95), (CANARY, 5), ("audit", 0)],
    )
    .await;
    assert_eq!(spec_text(&at_five), expected_spec(&original, 95, 5));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cohort_step_on_a_grpcroute_sends_the_header_to_the_canary_is_kept_then_goes_with_the_abort()
 {
    let Some(g) = given_route(GRPC, RouteCrd::Installed).await else {
        return;
    };
    let client = g.client.clone();
    let api = grpc_routes(&client);
    let original = api.get(ROUTE).await.unwrap();
    let ctl = Controller::start_on(&client, GRPC, None).await;
    create_rollout(
        &client,
        &rollout_on(
            GRPC,
            json!([
                {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
                {"setWeight": {"weight": 5}},
                {"promote": {}}
            ]),
            json!({
                "stepDuration": "600s", "appliedShareDeadline": "600s", "gates": [],
                "keepCohort": true
            }),
        ),
    )
    .await;

    // The cohort rule: the charge rule (filters kept) whose match also requires x-cohort:
    // staff, sending to the canary only, just before the charge rule; the rest as read. The
    // released v1.6.1 schema accepts it.
    let mut cohort = original.data["spec"]["rules"][0].clone();
    cohort["name"] = json!("sluice-cohort");
    cohort["matches"][0]["headers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "Exact", "name": "x-cohort", "value": "staff"}));
    cohort["backendRefs"] =
        json!([{"group": "", "kind": "Service", "name": CANARY, "port": 80, "weight": 1}]);
    let with_cohort = |spec: &str| {
        let mut spec: Value = serde_json::from_str(spec).unwrap();
        spec["rules"]
            .as_array_mut()
            .unwrap()
            .insert(0, cohort.clone());
        serde_json::to_string(&spec).unwrap()
    };
    rule_written(
        &api,
        "the cohort rule on the GRPCRoute",
        "sluice-cohort",
        &with_cohort(&serde_json::to_string(&original.data["spec"]).unwrap()),
        &original,
    )
    .await;
    rollout_until(&client, "the cohort recorded", BUDGET, |r| {
        r.status.as_ref().is_some_and(|s| s.cohort_active)
    })
    .await;

    // Kept into the 5% step (keepCohort): one write sets 5% with the cohort rule still there.
    control(&client, json!({"promoteThroughStep": 0})).await;
    let at_five = eventually("5% with the cohort kept", BUDGET, async || {
        let r = api.get(ROUTE).await.map_err(|e| e.to_string())?;
        let managed = &r.data["spec"]["rules"][1]["backendRefs"];
        if managed[1]["weight"] == 5 {
            Ok(r)
        } else {
            Err(spec_text(&r))
        }
    })
    .await;
    assert_eq!(
        spec_text(&at_five),
        with_cohort(&expected_spec(&original, 95, 5))
    );

    // The abort removes the cohort rule in the same write that sets the canary to 0.
    control(&client, json!({"abort": true})).await;
    let aborted = first_rule(&api, "the abort on the GRPCRoute", "charge").await;
    assert_eq!(spec_text(&aborted), expected_spec(&original, 100, 0));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_grpcroute_ownership_is_removed_and_nothing_else() {
    let Some(g) = given_route(GRPC, RouteCrd::Installed).await else {
        return;
    };
    let client = g.client.clone();
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
    let ctl = Controller::start_on(&client, GRPC, None).await;
    let freed = unowned(&api, ROUTE).await;
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
    let Some(g) = given_route(GRPC, RouteCrd::Missing).await else {
        return;
    };
    let client = g.client.clone();
    let ctl = Controller::start_on(&client, GRPC, None).await;
    create_rollout(&client, &rollout()).await;
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

    // When the CRD is installed after the operator started, with a GRPCRoute carrying the
    // ownership of a Rollout that is gone: the GRPCRoutes are watched from then on, so the
    // orphan is freed (only a watch finds it) and the Rollout takes its route.
    install_grpc_route_crd(&g.emu);
    let api = grpc_routes(&client);
    let mut orphan = payments_route();
    orphan["metadata"]["name"] = json!("payments-legacy");
    orphan["metadata"]["annotations"][ROUTE_OWNER_ANNOTATION] = json!("shop/gone");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(orphan).unwrap(),
    )
    .await
    .expect("the released schema accepts the route");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(payments_route()).unwrap(),
    )
    .await
    .expect("the released schema accepts the route");
    unowned(&api, "payments-legacy").await;
    route_at(
        &client,
        "5% on the GRPCRoute installed later",
        &[(STABLE, 95), (CANARY, 5), ("audit", 0)],
    )
    .await;
    ctl.stop().await;
}
