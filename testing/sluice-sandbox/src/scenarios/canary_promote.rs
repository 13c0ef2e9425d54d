//! Scenario `canary-promote`: a good release on east-1. A Rollout takes checkout from v2.13 to
//! v2.14 through mirror, header cohort and 1 → 5 → 25 → 50 → 100 while both versions stay
//! equally healthy; rollout-weights must judge every weight step on the share the mesh reports
//! and reach Promoted with the route at 0/100. Then the Rollout is deleted (what the Git change
//! making v2.14 stable does) and the route must be handed back: the ownership annotation and the
//! operator's managedFields entry gone, the weights untouched. Git's route (v2.14 now stable,
//! 100%) is then rendered into a signed bundle and an Argo CD Application with self-heal applies
//! it to east-1: the route Argo CD applies must send 100% to v2.14.
//! Figures: `promote_ms` (Rollout created → Promoted), `steps_passed` (weights passed, in
//! order), `handback_ms` (delete → route handed back), `canary_share_promoted` (what the mesh
//! reports at 100%), `argocd_sync_ms` (Application created → Synced with Git's route in place),
//! `handback_overdue_ms` (Promoted → the HandBackOverdue condition True).
//! The Rollout's hand-back deadline is [`HAND_BACK_DEADLINE`]: the Git change comes later than
//! that, so the Rollout is seen overdue (condition HandBackOverdue, what
//! `SluiceRolloutHandBackOverdue` reports) before it is deleted.
//! Never writes the route itself; Argo CD writes it only after hand-back.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Map, Value, json};
use sluice_api::external::http_route::HttpRoute;
use sluice_api::v1alpha1::RolloutPhase;
use sluice_api::v1alpha1::rollout::{
    FIELD_MANAGER, ROUTE_OWNER_ANNOTATION, StepOutcome, conditions as rollout_conditions,
};

use super::canary_abort::{
    CLUSTER, create, measured_share, ms, raise_traffic, rollout, rollout_until, rollouts,
    route_until, weights,
};
use super::world::{MANAGEMENT, synced_at};
use super::{Outcome, ScenarioDef, ScenarioError, bundles};
use crate::baseline::{self, ROUTE, SHOP};
use crate::sandbox::Sandbox;

/// The weight steps, in order.
pub const WEIGHTS: [u32; 4] = [1, 5, 25, 50];
/// Lowest canary share the mesh must report once promoted.
pub const PROMOTED_SHARE: f64 = 0.98;

/// `spec.handBackDeadline`: shorter than the time the scenario reads the promoted mesh, so the
/// hand-back is overdue before the Rollout is deleted.
pub const HAND_BACK_DEADLINE: &str = "2s";

/// The Application that applies Git's checkout route to east-1 after hand-back.
pub const APPLICATION_NAME: &str = "east-1-checkout";
/// Where Git's checkout route lives in the intent repository once v2.14 is stable.
pub const ROUTE_DIR: &str = "clusters/east-1/checkout";

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "canary-promote",
    description: "east-1's checkout from v2.13 to v2.14 through mirror, cohort and 1/5/25/50/100; \
                  pass when every weight step passed, the rollout is Promoted, the mesh reports \
                  ~100% v2.14 and deleting the Rollout hands the route back (promote_ms, \
                  handback_ms)",
    // Each weight step lasts until the sequential gates have enough evidence that the canary is
    // healthy (about 15 s per step at the scenario's traffic), not a fixed 2 s.
    budget: Duration::from_secs(180),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// Whether the route is handed back: no ownership annotation, no managedFields entry of the
/// operator.
pub fn handed_back(route: &HttpRoute) -> bool {
    let annotated = route
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ROUTE_OWNER_ANNOTATION));
    let managed = route.metadata.managed_fields.as_ref().is_some_and(|m| {
        m.iter()
            .any(|e| e.manager.as_deref() == Some(FIELD_MANAGER))
    });
    !annotated && !managed
}

/// The verdict: every weight step passed in order, the route at 0/100 and handed back, and the
/// mesh reports the canary share of a promotion.
pub fn judge(passed: &[u32], route: (i32, i32), back: bool, share: Option<f64>) -> (bool, String) {
    if passed != WEIGHTS {
        return (
            false,
            format!("weight steps passed {passed:?}, not {WEIGHTS:?}"),
        );
    }
    if route != (0, 100) {
        return (
            false,
            format!(
                "the route is at {}/{} after promotion, not 0/100",
                route.0, route.1
            ),
        );
    }
    if !back {
        return (
            false,
            "the route still carries the rollout's ownership after the Rollout was deleted".into(),
        );
    }
    match share {
        Some(s) if s >= PROMOTED_SHARE => (
            true,
            format!(
                "promoted through {WEIGHTS:?} to 100%; the mesh reports a canary share of {s:.4}; the route was handed back"
            ),
        ),
        Some(s) => (
            false,
            format!("promoted, but the mesh reports a canary share of only {s:.4}"),
        ),
        None => (
            false,
            "Prometheus reported no checkout requests after promotion; no data is never a pass"
                .into(),
        ),
    }
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    raise_traffic(sandbox)?;
    sandbox.say(format!(
        "canary-promote: a Rollout takes checkout in {CLUSTER} from v2.13 to v2.14 through mirror, cohort and {WEIGHTS:?}, then 100%"
    ));
    let mut steps = vec![
        json!({"mirror": {"percent": 50, "duration": "2s"}}),
        json!({"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}, "duration": "2s"}}),
    ];
    steps.extend(WEIGHTS.iter().map(|w| json!({"setWeight": {"weight": w}})));
    steps.push(json!({"promote": {}}));
    let created = Instant::now();
    create(
        sandbox,
        &rollout(
            Value::from(steps),
            json!({"handBackDeadline": HAND_BACK_DEADLINE}),
        )?,
    )
    .await?;

    let status = rollout_until(sandbox, |r| {
        r.status
            .as_ref()
            .filter(|s| matches!(s.phase, RolloutPhase::Promoted | RolloutPhase::Aborted))
            .cloned()
    })
    .await?;
    let promote_ms = ms(created.elapsed());
    let promoted = Instant::now();
    let passed: Vec<u32> = status
        .history
        .iter()
        .filter(|h| h.outcome == Some(StepOutcome::Passed))
        .filter_map(|h| h.weight)
        .collect();
    if status.phase == RolloutPhase::Aborted {
        let why = status
            .abort
            .as_ref()
            .and_then(|a| a.message.clone())
            .unwrap_or_default();
        let summary = format!("the good release aborted after passing {passed:?}: {why}");
        sandbox.say(format!("canary-promote: {summary}"));
        let mut figures = Map::new();
        figures.insert("steps_passed".into(), json!(passed));
        return Ok(Outcome {
            pass: false,
            figures,
            summary,
        });
    }
    // The status is written before the route, so the route may trail by one write.
    let route = tokio::time::timeout(
        Duration::from_secs(5),
        route_until(sandbox, Duration::from_millis(50), |r| {
            (weights(r) == (0, 100)).then(|| weights(r))
        }),
    )
    .await
    .unwrap_or(Ok((-1, -1)))?;
    sandbox.say(format!(
        "canary-promote: Promoted in {promote_ms} ms after passing {passed:?}; route at {}/{}",
        route.0, route.1
    ));

    // The mesh at 100%: a full window after the last write took effect.
    tokio::time::sleep(Duration::from_secs(2 + super::canary_abort::WINDOW_S + 1)).await;
    let share = measured_share(sandbox).await?;

    // The Git change is late: past spec.handBackDeadline the Rollout says it is overdue.
    rollout_until(sandbox, |r| {
        r.status
            .as_ref()
            .is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == rollout_conditions::HAND_BACK_OVERDUE && c.status == "True")
            })
            .then_some(())
    })
    .await?;
    let overdue_ms = ms(promoted.elapsed());
    sandbox.say(format!(
        "canary-promote: the Rollout is HandBackOverdue {overdue_ms} ms after promotion (deadline {HAND_BACK_DEADLINE})"
    ));

    // Hand-back: the Git change making v2.14 stable deletes the Rollout.
    sandbox.say("canary-promote: deleting the Rollout, as the Git change making v2.14 stable does");
    let deleted = Instant::now();
    rollouts(sandbox)?
        .delete(ROUTE, &DeleteParams::default())
        .await
        .map_err(|source| ScenarioError::Api {
            action: format!("deleting Rollout {SHOP}/{ROUTE}"),
            cluster: CLUSTER.into(),
            source,
        })?;
    let api = rollouts(sandbox)?;
    while api.get_opt(ROUTE).await.ok().flatten().is_some() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = route_until(sandbox, Duration::from_millis(50), |r| {
        handed_back(r).then(|| weights(r))
    })
    .await?;
    let handback_ms = ms(deleted.elapsed());
    sandbox.say(format!(
        "canary-promote: route handed back {handback_ms} ms after the delete, weights {}/{} as promoted",
        after.0, after.1
    ));

    let (synced_ms, applied) = argocd_applies_git_route(sandbox).await?;
    sandbox.say(format!(
        "canary-promote: Argo CD applied Git's route {synced_ms} ms after its Application was created: {}/{}",
        applied.0, applied.1
    ));

    let (pass, summary) = judge(&passed, after, true, share);
    let pass = pass && route == (0, 100) && applied == (0, 100);
    let summary = if applied == (0, 100) {
        format!("{summary}; Argo CD then applied Git's route, 100% to v2.14")
    } else {
        format!(
            "{summary}; but the route Argo CD applied is at {}/{}, not 0/100",
            applied.0, applied.1
        )
    };
    sandbox.say(format!("canary-promote: {summary}"));
    let mut figures = Map::new();
    figures.insert("promote_ms".into(), Value::from(promote_ms));
    figures.insert("steps_passed".into(), json!(passed));
    figures.insert("handback_ms".into(), Value::from(handback_ms));
    figures.insert("handback_overdue_ms".into(), Value::from(overdue_ms));
    figures.insert("argocd_sync_ms".into(), Value::from(synced_ms));
    figures.insert(
        "canary_share_promoted".into(),
        share
            .map(|s| (s * 10_000.0).round() / 10_000.0)
            .map_or(Value::Null, Value::from),
    );
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

/// Commits Git's route (v2.14 stable, 100%), publishes it as a signed bundle and has an Argo CD
/// Application with self-heal apply it to east-1; returns (ms until Synced with the route
/// carrying Argo CD's tracking annotation, the route's weights then).
async fn argocd_applies_git_route(sandbox: &Sandbox) -> Result<(u64, (i32, i32)), ScenarioError> {
    let path = format!("{ROUTE_DIR}/route-{ROUTE}.yaml");
    let route = baseline::route(0, 100);
    let pushed = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[(path.as_str(), route.as_str())],
            message: "mesh: checkout v2.14 is stable",
            dir: ROUTE_DIR,
            repository: "mesh/east-1-checkout",
        },
    )
    .await?;
    let repository = pushed.repository.clone();
    let tag = &pushed.tag;
    let digest = pushed.manifest_digest.clone();
    sandbox.say(format!(
        "canary-promote: Git's route (commit {tag}, v2.14 stable) pushed as {} and signed; Application {MANAGEMENT}/{APPLICATION_NAME} applies it with self-heal",
        pushed.reference
    ));
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": APPLICATION_NAME, "namespace": crate::operators::ARGOCD_NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": format!("oci://{repository}"), "path": ".", "targetRevision": digest},
            "destination": {"name": CLUSTER, "namespace": SHOP},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Application ({e})")))?;
    let mgmt = sandbox
        .client(MANAGEMENT)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {MANAGEMENT}")))?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let apps: Api<DynamicObject> =
        Api::namespaced_with(mgmt, crate::operators::ARGOCD_NAMESPACE, &resource);
    let created = Instant::now();
    apps.create(&PostParams::default(), &app)
        .await
        .map_err(|source| ScenarioError::Api {
            action: format!("creating Application {APPLICATION_NAME}"),
            cluster: MANAGEMENT.into(),
            source,
        })?;
    loop {
        let synced = apps
            .get(APPLICATION_NAME)
            .await
            .ok()
            .and_then(|a| serde_json::to_value(a).ok())
            .is_some_and(|a| synced_at(&a, &digest));
        if synced
            && let Ok(route) = super::canary_abort::routes(sandbox)?.get(ROUTE).await
            && route
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("argocd.argoproj.io/tracking-id"))
        {
            return Ok((ms(created.elapsed()), weights(&route)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_only_when_promoted_step_by_step_and_handed_back() {
        let all = WEIGHTS.to_vec();
        let cases = [
            (all.clone(), (0, 100), true, Some(1.0), true),
            (all.clone(), (0, 100), true, Some(0.985), true),
            (vec![1, 5, 50], (0, 100), true, Some(1.0), false),
            (all.clone(), (50, 50), true, Some(1.0), false),
            (all.clone(), (0, 100), false, Some(1.0), false),
            (all.clone(), (0, 100), true, Some(0.9), false),
            (all, (0, 100), true, None, false),
        ];
        for (passed, route, back, share, want) in cases {
            let (pass, why) = judge(&passed, route, back, share);
            assert_eq!(pass, want, "{passed:?} {route:?} {back} {share:?}: {why}");
        }
    }

    #[test]
    fn handed_back_needs_both_the_annotation_and_the_managed_fields_entry_gone() {
        let route = |annotated: bool, manager: &str| -> HttpRoute {
            let mut meta = json!({"name": ROUTE, "namespace": SHOP,
                "managedFields": [{"manager": manager, "operation": "Update"}]});
            if annotated {
                meta["annotations"] = json!({ROUTE_OWNER_ANNOTATION: "shop/checkout"});
            }
            serde_json::from_value(json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": meta, "spec": {"rules": []}
            }))
            .unwrap()
        };
        let cases = [
            (false, "argocd-controller", true),
            (true, "argocd-controller", false),
            (false, FIELD_MANAGER, false),
            (true, FIELD_MANAGER, false),
        ];
        for (annotated, manager, want) in cases {
            assert_eq!(
                handed_back(&route(annotated, manager)),
                want,
                "{annotated} {manager}"
            );
        }
    }
}
