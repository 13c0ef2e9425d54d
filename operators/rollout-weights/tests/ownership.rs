//! End to end, one writer: a foreign edit of owned weights is detected, reported (condition +
//! Event) and restored; a rewrite by revert's field manager (a BundlePin) aborts the rollout,
//! which then never writes the route again; and the chart's owned-route admission policy,
//! loaded into the emulator, denies a foreign change to an owned route's rules while letting a
//! no-op write through.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use sluice_api::{
    external::http_route::HttpRoute,
    v1alpha1::{
        RolloutPhase,
        rollout::{AbortReason, ROUTE_OWNER_ANNOTATION, conditions, reasons},
    },
};
use sluice_runtime::conditions::find;

async fn at_five_percent(g: &Given) {
    let steps = json!([{"setWeight": {"weight": 5, "duration": "120s"}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    eventually("route at 5%", Duration::from_secs(40), async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        (weights(&r) == (95, 5))
            .then_some(())
            .ok_or(format!("{:?}", weights(&r)))
    })
    .await;
    // The reconcile that wrote 5% records the route's resourceVersion right after.
    rollout_until(
        &g.client,
        "route resourceVersion recorded",
        Duration::from_secs(10),
        |r| {
            r.status
                .as_ref()
                .and_then(|s| s.owned_route.as_ref())
                .is_some_and(|o| {
                    o.last_written_resource_version.is_some() && o.written_weight == Some(5)
                })
        },
    )
    .await;
}

fn set_canary(route: &mut HttpRoute, weight: i32) {
    let rules = route.spec.rules.as_mut().unwrap();
    let main = rules
        .iter_mut()
        .find(|r| r.name.as_deref() == Some("main"))
        .unwrap();
    main.backend_mut(CANARY).unwrap().weight = Some(weight);
    main.backend_mut(STABLE).unwrap().weight = Some(100 - weight);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_edit_of_owned_weights_is_restored_and_reported() {
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    at_five_percent(&g).await;

    // When someone edits the owned weights by hand.
    let api = routes(&g.client);
    let mut r = api.get("checkout").await.unwrap();
    set_canary(&mut r, 50);
    let pp = PostParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    api.replace("checkout", &pp, &r).await.unwrap();

    // Then the weights are restored, the condition and an Event say so.
    eventually("weights restored", Duration::from_secs(10), async || {
        let r = api.get("checkout").await.map_err(|e| e.to_string())?;
        (weights(&r) == (95, 5))
            .then_some(())
            .ok_or(format!("{:?}", weights(&r)))
    })
    .await;
    let r = rollout_until(
        &g.client,
        "RouteOwned says a foreign edit was restored",
        Duration::from_secs(10),
        |r| {
            r.status.as_ref().is_some_and(|s| {
                find(&s.conditions, conditions::ROUTE_OWNED)
                    .is_some_and(|c| c.reason == reasons::FOREIGN_EDIT_RESTORED)
            })
        },
    )
    .await;
    assert_eq!(r.status.unwrap().phase, RolloutPhase::Progressing);
    let ev = events(&g.client, reasons::FOREIGN_EDIT_RESTORED).await;
    assert!(
        ev.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains("kubectl-edit"))),
        "the Event names the writer: {ev:?}"
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_pin_rewrite_aborts_the_rollout_which_never_fights_it() {
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    at_five_percent(&g).await;

    // When revert applies the pinned bundle's route (Git's: all traffic to stable).
    let api = routes(&g.client);
    let pinned = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "checkout", "namespace": NS},
        "spec": rich_route()["spec"].clone(),
    });
    api.patch(
        "checkout",
        &PatchParams::apply("sluice-revert").force(),
        &Patch::Apply(&pinned),
    )
    .await
    .unwrap();
    let after_pin = api.get("checkout").await.unwrap();
    println!(
        "managedFields after the pin: {}",
        serde_json::to_string(&after_pin.metadata.managed_fields).unwrap()
    );
    assert_eq!(weights(&after_pin), (100, 0));

    // Then the rollout aborts for the pin, and the route is left exactly as revert wrote it.
    let r = rollout_until(
        &g.client,
        "aborted by the pin",
        Duration::from_secs(10),
        |r| {
            r.status
                .as_ref()
                .and_then(|s| s.abort.as_ref())
                .is_some_and(|a| a.reason == AbortReason::PinnedByBundlePin)
        },
    )
    .await;
    let s = r.status.unwrap();
    assert_eq!(s.phase, RolloutPhase::Aborted);
    let owned = find(&s.conditions, conditions::ROUTE_OWNED).unwrap();
    assert_eq!(owned.reason, reasons::PINNED_BY_BUNDLE_PIN);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = api.get("checkout").await.unwrap();
    assert_eq!(
        later.metadata.resource_version, after_pin.metadata.resource_version,
        "no write after the pin"
    );
    ctl.stop().await;
}

/// The chart's owned-route and field-manager policies, as `helm template` renders them for a
/// release `sluice` in `sluice-system` (the operator's ServiceAccount is then
/// `sluice-system:sluice-rollout-weights`). None when helm is missing (a failure under CI).
fn owned_route_policies() -> Option<String> {
    let helm = sluice_testkit::prereq::require_binary("helm")?;
    let out = std::process::Command::new(helm)
        .current_dir(repo())
        .args([
            "template",
            "sluice",
            "charts/sluice",
            "--namespace",
            "sluice-system",
            "--show-only",
            "templates/admission/owned-routes.yaml",
        ])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    assert!(
        text.contains("kind: ValidatingAdmissionPolicy\n"),
        "the chart renders the owned-route policy by default:\n{text}"
    );
    Some(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owned_route_policy_denies_a_foreign_change_and_passes_a_no_op() {
    let Some(policies) = owned_route_policies() else {
        return;
    };
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    // The operator writes as its ServiceAccount, which the policies let through.
    g.emu.load_yaml(&policies).unwrap();
    let operator = g.emu.client_with_token(
        &g.emu
            .service_account_token("sluice-system", "sluice-rollout-weights"),
    );
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&operator, &prom);
    at_five_percent(&g).await;

    // A person (Argo CD, kubectl) with another identity.
    let someone = g.emu.client_with_token(
        &g.emu
            .service_account_token("argocd", "argocd-application-controller"),
    );
    let api = routes(&someone);
    let current = api.get("checkout").await.unwrap();

    // When they change the owned rules: denied, naming why.
    let mut changed = current.clone();
    set_canary(&mut changed, 50);
    let err = api
        .replace("checkout", &PostParams::default(), &changed)
        .await
        .expect_err("a foreign change of owned rules is denied");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "spec.rules of HTTPRoute {NS}/checkout belong to Rollout"
        )),
        "{msg}"
    );

    // When they remove the ownership annotation: denied.
    let mut unowned = current.clone();
    unowned
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(ROUTE_OWNER_ANNOTATION);
    assert!(
        api.replace("checkout", &PostParams::default(), &unowned)
            .await
            .is_err()
    );

    // When they write the route as it is (an Argo CD sync ignoring the owned fields): it passes.
    let mut no_op = current.clone();
    no_op
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("synced".into(), "yes".into());
    api.replace("checkout", &PostParams::default(), &no_op)
        .await
        .expect("a write that leaves rules and annotation alone passes");
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (95, 5)
    );
    ctl.stop().await;
}
