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

/// The chart's owned-route policy. No helm here, so the policy is assembled from the chart
/// template: its two validation expressions are taken verbatim from the file, the match
/// conditions are the template's with the release's values filled in.
fn owned_route_policy(writers: &[&str]) -> String {
    let template =
        std::fs::read_to_string(repo().join("charts/sluice/templates/admission/owned-routes.yaml"))
            .expect("chart template readable");
    let validations: Vec<&str> = template
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- expression: "))
        .collect();
    assert_eq!(
        validations.len(),
        2,
        "the template's validations changed: {validations:?}"
    );
    let a = ROUTE_OWNER_ANNOTATION;
    let old =
        format!("has(oldObject.metadata.annotations) && '{a}' in oldObject.metadata.annotations");
    let new = format!("has(object.metadata.annotations) && '{a}' in object.metadata.annotations");
    let writers = writers
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(",");
    let q = |s: &str| serde_json::to_string(s).unwrap();
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: sluice-owned-routes
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["gateway.networking.k8s.io"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["httproutes"]
  matchConditions:
    - name: owned-by-a-rollout
      expression: {m1}
    - name: not-a-sluice-writer
      expression: {m2}
  variables:
    - name: oldOwner
      expression: {v1}
    - name: newOwner
      expression: {v2}
  validations:
    - expression: {e1}
      message: spec.rules of an owned route belong to its Rollout
      reason: Forbidden
    - expression: {e2}
      message: the ownership annotation is written only by sluice
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: sluice-owned-routes
spec:
  policyName: sluice-owned-routes
  validationActions: ["Deny"]
"#,
        m1 = q(&format!("({old}) || ({new})")),
        m2 = q(&format!("!(request.userInfo.username in [{writers}])")),
        v1 = q(&format!(
            "({old}) ? oldObject.metadata.annotations['{a}'] : ''"
        )),
        v2 = q(&format!(
            "({new}) ? object.metadata.annotations['{a}'] : ''"
        )),
        e1 = validations[0],
        e2 = validations[1],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owned_route_policy_denies_a_foreign_change_and_passes_a_no_op() {
    let Some(g) = given(scenario("canary-promote", 4000.0)).await else {
        return;
    };
    // The operator writes as its ServiceAccount, which the policy lets through.
    let sa = "system:serviceaccount:sluice-system:sluice-rollout-weights";
    g.emu
        .load_yaml(&owned_route_policy(&[
            sa,
            "system:serviceaccount:sluice-system:sluice-revert",
        ]))
        .unwrap();
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
    assert!(msg.contains("spec.rules of an owned route"), "{msg}");

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
