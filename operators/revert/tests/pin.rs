//! End to end on the emulator with the real registry and git: a BundlePin pins an Argo CD
//! Application to a signed bundle, prunes what the bad change added, keeps Argo CD from
//! re-applying the bad revision while pinned, pushes one revert branch, and releases only when
//! Argo CD reports the pinned content (or explicitly, for a forward fix). Refused bundles touch
//! nothing; a restart mid-apply finishes the pin; revert's identity in the workload cluster
//! cannot write a Deployment. Skips with a printed reason when the upstream CRDs,
//! `docker-registry` or `git` are absent. Each scenario has a time budget.

mod scenario;
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret, events::v1::Event};
use kube::{
    Api,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    BundlePin, BundlePinPhase,
    bundle_pin::{conditions, reasons},
};
use sluice_bundle::SigningKey;
use sluice_runtime::conditions::find;
use sluice_testkit::eventually::eventually_every;
use support::*;

/// Per-step budget: generous for a loaded 2-core machine (a 301-object apply into the debug
/// emulator), short enough that a stuck step fails well within the file's run.
const BUDGET: Duration = Duration::from_secs(60);
/// An Application change wakes its pins at once; a pin released only by its safety-net poll
/// (30 s) misses this.
const RELEASE_WITHIN: Duration = Duration::from_secs(3);

/// Waits until the pin records its pushed git revert (a failure is recorded too, and retried).
async fn git_recorded(w: &World, pin: &str) -> BundlePin {
    let pins = w.pins();
    eventually_every(
        &format!("{pin} records its git revert"),
        BUDGET,
        POLL,
        || {
            let pins = pins.clone();
            async move {
                let p = pins.get(pin).await.ok()?;
                p.status
                    .as_ref()?
                    .git_revert
                    .as_ref()?
                    .branch
                    .is_some()
                    .then_some(p)
            }
        },
    )
    .await
}

/// The revert branch of this pin instance (its name and UID).
fn revert_branch(pin: &BundlePin) -> String {
    sluice_revert::decide::branch_name(
        pin.metadata.namespace.as_deref().unwrap(),
        pin.metadata.name.as_deref().unwrap(),
        pin.metadata.uid.as_deref().unwrap(),
    )
}

async fn events(w: &World, reason: &str) -> Vec<Event> {
    sluice_testkit::events::with_reason(&w.mgmt_client, ARGOCD, reason).await
}

/// Given the bad change synced by Argo CD: the good bundle, the bad one (weight 90 and an extra
/// route), the bad commit in git.
async fn given_bad_change(w: &World) -> (Pushed, Pushed, String) {
    w.git
        .commit_files(&[("mesh/checkout.yaml", &route("checkout", 10))], "good")
        .unwrap();
    let (good, _) = w
        .bundle(&[route("checkout", 10)], "1111111", Some(&w.signer))
        .await;
    let bad_commit = w
        .git
        .commit_files(
            &[
                ("mesh/checkout.yaml", &route("checkout", 90)),
                ("mesh/extra.yaml", &route("added-by-bad-change", 50)),
            ],
            "bad",
        )
        .unwrap();
    let (bad, _) = w
        .bundle(
            &[route("checkout", 90), route("added-by-bad-change", 50)],
            &bad_commit,
            Some(&w.signer),
        )
        .await;
    // Argo CD ran the good revision before the bad one (a pin goes back to a revision the
    // Application ran).
    w.application(APP, &good.digest, json!({})).await;
    w.argo(APP);
    let apps = w.apps();
    let good_digest = good.digest.clone();
    eventually_every("Argo CD synced the good revision", BUDGET, POLL, || {
        let apps = apps.clone();
        let good_digest = good_digest.clone();
        async move {
            let a = apps.get(APP).await.ok()?;
            a.is_synced_at(&good_digest).then_some(())
        }
    })
    .await;
    apps.patch(
        APP,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"source": {"targetRevision": bad.digest}}})),
    )
    .await
    .unwrap();
    let bad_digest = bad.digest.clone();
    eventually_every("Argo CD synced the bad change", BUDGET, POLL, || {
        let apps = apps.clone();
        let bad_digest = bad_digest.clone();
        async move {
            let a = apps.get(APP).await.ok()?;
            a.is_synced_at(&bad_digest).then_some(())
        }
    })
    .await;
    assert_eq!(w.canary_weight("checkout").await, Some(90));
    assert_eq!(w.canary_weight("added-by-bad-change").await, Some(50));
    (good, bad, bad_commit)
}

#[tokio::test]
async fn pin_holds_against_argo_cd_then_releases_on_matching_content() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (good, _bad, bad_commit) = given_bad_change(&w).await;
    // A sync is running when the pin arrives.
    w.apps()
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"operation": {"sync": {"revision": "x"}}, "status": {"operationState": {"phase": "Running", "startedAt": "2026-01-01T00:00:00Z", "operation": {"sync": {"revision": "x"}}}}})),
        )
        .await
        .unwrap();
    w.start_revert();

    // When a human pins the good bundle.
    let started = Instant::now();
    w.create_pin(
        "pin-1",
        &good.digest,
        json!({"gitRevert": {"commit": bad_commit, "pullRequest": false}}),
    )
    .await;
    let pinned = w.phase_is("pin-1", BundlePinPhase::Pinned, BUDGET).await;
    let pin_ms = started.elapsed().as_millis();
    println!("pin_ms={pin_ms} (BundlePin created → every object applied, signature verified)");

    // Then the good content is live, the bad change's extra route is pruned.
    assert_eq!(w.canary_weight("checkout").await, Some(10));
    assert_eq!(w.canary_weight("added-by-bad-change").await, None);
    assert!(
        w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned())
    );
    let status = pinned.status.unwrap();
    let app_state = &status.applications[0];
    assert!(app_state.sync_terminated, "the running sync was terminated");
    assert_eq!(app_state.original_sync_policy, Some(original_policy()));
    assert_eq!(status.to_digest.as_deref(), Some(good.digest.as_str()));
    assert!(status.from_digest.is_some());
    assert_eq!(status.applied_objects, 1);
    assert_eq!(status.pruned_objects, 1);
    let app = w.apps().get(APP).await.unwrap();
    let mut suspended = original_policy();
    suspended["automated"]["enabled"] = json!(false);
    assert_eq!(app_policy(&app), suspended, "automation off, settings kept");
    assert_eq!(
        app.status
            .unwrap()
            .operation_state
            .unwrap()
            .phase
            .as_deref(),
        Some("Failed"),
        "terminated"
    );
    // The revert reached Git: one branch, the bad change reverted.
    let recorded = git_recorded(&w, "pin-1").await;
    let branch = &revert_branch(&recorded);
    assert!(
        branch.starts_with("sluice/revert/argocd/pin-1-"),
        "the pin's UID tells it from a later pin of the same name: {branch}"
    );
    let git = recorded.status.unwrap().git_revert.unwrap();
    assert_eq!(git.branch.as_deref(), Some(branch.as_str()));
    assert_eq!(
        w.git.read_file(branch, "mesh/checkout.yaml").unwrap(),
        Some(route("checkout", 10).trim_end().to_owned())
    );
    assert_eq!(w.git.read_file(branch, "mesh/extra.yaml").unwrap(), None);
    assert_eq!(
        w.git.branches().unwrap(),
        vec!["main".to_owned(), branch.to_owned()]
    );
    assert!(
        !events(&w, reasons::ALL_PINNED).await.is_empty(),
        "audit Event"
    );

    // While pinned, Argo CD (still targeting the bad revision) does not re-apply it and the pin
    // does not release.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(w.canary_weight("checkout").await, Some(10));
    assert_eq!(w.canary_weight("added-by-bad-change").await, None);
    let p = w.pins().get("pin-1").await.unwrap();
    assert_eq!(
        p.status.unwrap().phase,
        BundlePinPhase::Pinned,
        "no release before Argo CD agrees"
    );

    // When the revert merges, CI renders the same content under a new digest; Argo CD reports
    // Synced there (it compares while automation is suspended).
    let (same, _) = w
        .bundle(&[route("checkout", 10)], "3333333", Some(&w.signer))
        .await;
    assert_ne!(same.digest, good.digest);
    assert_eq!(same.content, good.content);
    w.apps()
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"targetRevision": same.digest}}})),
        )
        .await
        .unwrap();
    let apps = w.apps();
    let same_digest = same.digest.clone();
    let agreed = eventually_every(
        "Argo CD reports Synced at the pinned content",
        BUDGET,
        POLL,
        || {
            let apps = apps.clone();
            let same_digest = same_digest.clone();
            async move {
                let a = apps.get(APP).await.ok()?;
                a.is_synced_at(&same_digest).then(Instant::now)
            }
        },
    )
    .await;
    let pins = w.pins();
    let released = eventually_every("pin-1 Released", BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get("pin-1").await.ok()?;
            (p.status.as_ref()?.phase == BundlePinPhase::Released).then_some(p)
        }
    })
    .await;
    let release_ms = agreed.elapsed().as_millis();
    println!("release_latency_ms={release_ms} (Argo CD Synced at equal content → Released)");
    assert!(
        release_ms < RELEASE_WITHIN.as_millis(),
        "released {release_ms} ms after Argo CD agreed; the Application watch should wake the pin within {RELEASE_WITHIN:?}"
    );
    let rc = find(
        &released.status.as_ref().unwrap().conditions,
        conditions::RELEASED,
    )
    .unwrap();
    assert_eq!(rc.reason, reasons::CONTENT_MATCHED);
    let app = w.apps().get(APP).await.unwrap();
    assert_eq!(
        app_policy(&app),
        original_policy(),
        "sync policy restored exactly"
    );
    assert!(
        !w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned()),
        "revert's managedFields entry dropped: {:?}",
        w.managers("checkout").await
    );
    assert_eq!(
        w.git.branches().unwrap().len(),
        2,
        "still one revert branch"
    );
}

#[tokio::test]
async fn a_forward_fix_waits_for_an_explicit_release() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (good, _bad, _) = given_bad_change(&w).await;
    w.start_revert();
    w.create_pin("pin-2", &good.digest, json!({})).await;
    w.phase_is("pin-2", BundlePinPhase::Pinned, BUDGET).await;

    // A forward fix (different content) becomes Argo CD's target.
    let (fix, _) = w
        .bundle(&[route("checkout", 30)], "4444444", Some(&w.signer))
        .await;
    w.apps()
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"targetRevision": fix.digest}}})),
        )
        .await
        .unwrap();
    let pins = w.pins();
    eventually_every("ForwardFixWaiting", BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get("pin-2").await.ok()?;
            let c = find(&p.status?.conditions, conditions::RELEASED)?.clone();
            (c.reason == reasons::FORWARD_FIX_WAITING).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let p = w.pins().get("pin-2").await.unwrap();
    assert_eq!(p.status.unwrap().phase, BundlePinPhase::Pinned, "waits");
    assert_eq!(
        w.canary_weight("checkout").await,
        Some(10),
        "the fix is not applied while pinned"
    );

    // Released through the object: sync restored, Argo CD applies the fix.
    w.pins()
        .patch(
            "pin-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": true, "releaseReason": "forward fix 43 verified in staging"}})),
        )
        .await
        .unwrap();
    let released = w.phase_is("pin-2", BundlePinPhase::Released, BUDGET).await;
    let rc = find(&released.status.unwrap().conditions, conditions::RELEASED)
        .unwrap()
        .clone();
    assert_eq!(rc.reason, reasons::RELEASED_EXPLICITLY);
    assert_eq!(
        app_policy(&w.apps().get(APP).await.unwrap()),
        original_policy()
    );
    let weight = eventually_every("Argo CD applies the fix", BUDGET, POLL, || async {
        (w.canary_weight("checkout").await == Some(30)).then_some(30)
    })
    .await;
    assert_eq!(weight, 30);
}

#[tokio::test]
async fn refused_bundles_and_targets_touch_nothing() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (_good, _bad, _) = given_bad_change(&w).await;
    let other_key = SigningKey::generate().unwrap();
    let (unsigned, _) = w.bundle(&[route("checkout", 1)], "aaaaaa1", None).await;
    let (wrong_key, _) = w
        .bundle(&[route("checkout", 2)], "aaaaaa2", Some(&other_key))
        .await;
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: evil\n  namespace: shop\nspec:\n  selector:\n    matchLabels: {app: evil}\n  template:\n    metadata:\n      labels: {app: evil}\n    spec:\n      containers: [{name: c, image: evil}]\n".to_owned();
    let (disallowed, _) = w
        .bundle(
            &[route("checkout", 3), deployment],
            "aaaaaa3",
            Some(&w.signer),
        )
        .await;
    // Tampered: a signed bundle whose layer is swapped on the registry's disk.
    let (tampered, artifact) = w
        .bundle(&[route("checkout", 4)], "aaaaaa4", Some(&w.signer))
        .await;
    let (_, evil) = w.bundle(&[route("checkout", 100)], "aaaaaa5", None).await;
    let layer = &artifact.manifest.layers[0].digest["sha256:".len()..];
    std::fs::write(
        w.registry
            .dir()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&layer[..2])
            .join(layer)
            .join("data"),
        &evil.layer,
    )
    .unwrap();
    // A Git-sourced Application and one generated by an ApplicationSet that would revert the
    // suspension.
    let mut git_app = w
        .application("git-sourced", &unsigned.digest, json!({}))
        .await;
    git_app.metadata.resource_version = None;
    w.apps()
        .patch(
            "git-sourced",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"repoURL": w.git.url(), "targetRevision": "main", "path": "mesh"}}})),
        )
        .await
        .unwrap();
    let sets: Api<DynamicObject> = Api::namespaced_with(
        w.mgmt_client.clone(),
        ARGOCD,
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "ApplicationSet"),
            "applicationsets",
        ),
    );
    let set: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": {"name": "mesh", "namespace": ARGOCD},
        "spec": {"generators": [{"list": {"elements": [{"cluster": "c1"}]}}], "template": {"metadata": {"name": "generated"}, "spec": {"project": "default", "destination": {"name": "c1"}, "source": {"repoURL": "oci://x/y", "path": "."}}}}
    }))
    .unwrap();
    let set = sets.create(&PostParams::default(), &set).await.unwrap();
    w.application(
        "generated",
        &unsigned.digest,
        json!({"metadata": {"name": "generated", "namespace": ARGOCD, "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "mesh", "uid": set.metadata.uid, "controller": true}]}}),
    )
    .await;
    w.start_revert();
    let before = w
        .routes()
        .get("checkout")
        .await
        .unwrap()
        .metadata
        .resource_version;

    let table: Vec<(&str, String, Value, &str)> = vec![
        (
            "unsigned",
            unsigned.digest.clone(),
            json!({}),
            reasons::UNSIGNED,
        ),
        (
            "wrong-key",
            wrong_key.digest.clone(),
            json!({}),
            reasons::WRONG_KEY,
        ),
        (
            "tampered",
            tampered.digest.clone(),
            json!({}),
            reasons::TAMPERED,
        ),
        (
            "disallowed",
            disallowed.digest.clone(),
            json!({}),
            reasons::DISALLOWED_KIND,
        ),
        (
            "git-sourced",
            _good_digest(&w).await,
            json!({"targets": [{"name": "git-sourced"}]}),
            reasons::NOT_OCI_SOURCED,
        ),
        (
            "appset",
            _good_digest(&w).await,
            json!({"targets": [{"name": "generated"}]}),
            reasons::APPLICATION_SET_WOULD_REVERT,
        ),
    ];
    for (name, digest, extra, want) in &table {
        w.create_pin(name, digest, extra.clone()).await;
        let p = w.phase_is(name, BundlePinPhase::Refused, BUDGET).await;
        let c = find(&p.status.as_ref().unwrap().conditions, conditions::VERIFIED)
            .unwrap_or_else(|| panic!("{name}: no Verified condition"))
            .clone();
        assert_eq!(c.reason, *want, "{name}: {}", c.message);
        assert!(
            c.message.contains("nothing applied"),
            "{name}: {}",
            c.message
        );
        // The Event follows the status write.
        let w = &w;
        eventually_every(
            &format!("{name}: a Warning Event names the cause"),
            BUDGET,
            POLL,
            || async move {
                events(w, want)
                    .await
                    .iter()
                    .any(|e| e.type_.as_deref() == Some("Warning"))
                    .then_some(())
            },
        )
        .await;
    }
    // Zero objects applied, no Application touched.
    assert_eq!(
        w.routes()
            .get("checkout")
            .await
            .unwrap()
            .metadata
            .resource_version,
        before
    );
    assert!(
        !w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned())
    );
    for app in [APP, "git-sourced", "generated"] {
        assert_eq!(
            app_policy(&w.apps().get(app).await.unwrap()),
            original_policy(),
            "{app} untouched"
        );
    }
    let deployments: Api<Deployment> = Api::namespaced(w.workload_admin.clone(), SHOP);
    assert!(deployments.get_opt("evil").await.unwrap().is_none());
}

async fn _good_digest(w: &World) -> String {
    w.bundle(&[route("checkout", 10)], "1111111", Some(&w.signer))
        .await
        .0
        .digest
}

#[tokio::test]
async fn a_restart_mid_apply_finishes_the_pin_with_one_revert_branch_and_one_pull_request() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (_good, _bad, bad_commit) = given_bad_change(&w).await;
    // A large bundle, so the apply takes long enough to be interrupted.
    let many: Vec<String> = std::iter::once(route("checkout", 10))
        .chain((0..300).map(|i| route(&format!("route-{i:03}"), 10)))
        .collect();
    let (big, _) = w.bundle(&many, "5555555", Some(&w.signer)).await;
    w.start_revert();
    // Argo CD never ran this bundle: allowed explicitly (audited).
    w.create_pin(
        "pin-3",
        &big.digest,
        json!({"gitRevert": {"commit": bad_commit}, "allowAnyRevision": true}),
    )
    .await;
    // Kill revert once some, not all, objects are applied.
    let routes = w.routes();
    let partial = eventually_every("the apply to start", BUDGET, POLL, || {
        let routes = routes.clone();
        async move {
            let n = routes.list(&ListParams::default()).await.ok()?.items.len();
            (n > 5).then_some(n)
        }
    })
    .await;
    w.kill_revert();
    let p = w.pins().get("pin-3").await.unwrap();
    let phase = p.status.as_ref().map(|s| s.phase).unwrap_or_default();
    println!("killed at {partial} routes, phase {phase:?}");
    assert_ne!(phase, BundlePinPhase::Pinned, "killed mid-apply");
    assert_eq!(w.git.branches().unwrap(), vec!["main".to_owned()]);
    assert!(w.forge.pulls().is_empty(), "no pull request before Pinned");

    // A new process finishes the pin.
    w.start_revert();
    let pinned = w.phase_is("pin-3", BundlePinPhase::Pinned, BUDGET).await;
    assert_eq!(pinned.status.as_ref().unwrap().applied_objects, 301);
    assert_eq!(
        w.routes()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        301
    );
    assert_eq!(
        pinned.status.as_ref().unwrap().applications[0].original_sync_policy,
        Some(original_policy())
    );
    let pinned = git_recorded(&w, "pin-3").await;
    let branch = revert_branch(&pinned);
    let pulls = w.forge.pulls();
    assert_eq!(pulls.len(), 1, "exactly one pull request: {pulls:#?}");
    assert_eq!(pulls[0]["head"]["ref"], branch);
    assert_eq!(pulls[0]["base"]["ref"], "main");
    assert!(
        pulls[0]["title"]
            .as_str()
            .is_some_and(|t| t.starts_with(&format!("Revert {bad_commit}"))),
        "{pulls:#?}"
    );
    let git = pinned.status.as_ref().unwrap().git_revert.clone().unwrap();
    assert_eq!(git.branch.as_deref(), Some(branch.as_str()));
    assert_eq!(
        git.pull_request_url.as_deref(),
        pulls[0]["html_url"].as_str(),
        "the status records the pull request"
    );
    // Applying again changes nothing: a second reconcile after a restart leaves one branch.
    w.kill_revert();
    w.start_revert();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        w.git.branches().unwrap().len(),
        2,
        "exactly one revert branch"
    );
    assert_eq!(w.forge.pulls().len(), 1, "still one pull request");
    assert_eq!(w.forge.creates(), 1, "opened once, never asked again");
    let again = w.pins().get("pin-3").await.unwrap();
    assert_eq!(
        again.status,
        pinned.status.clone().map(|mut s| {
            s.conditions = again.status.as_ref().unwrap().conditions.clone();
            s
        })
    );
}

#[tokio::test]
async fn a_restart_while_the_pull_request_is_being_opened_leaves_one() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (good, _bad, bad_commit) = given_bad_change(&w).await;
    // The forge records the pull request but answers late: revert dies before it records it.
    w.forge.delay_answers(Duration::from_secs(30));
    w.start_revert();
    w.create_pin(
        "pin-4",
        &good.digest,
        json!({"gitRevert": {"commit": bad_commit}}),
    )
    .await;
    let forge = w.forge.clone();
    eventually_every("the pull request to be opened", BUDGET, POLL, || {
        let forge = forge.clone();
        async move { (forge.creates() == 1).then_some(()) }
    })
    .await;
    w.kill_revert();
    w.forge.delay_answers(Duration::ZERO);
    let p = w.pins().get("pin-4").await.unwrap();
    assert!(
        p.status.as_ref().unwrap().git_revert.is_none(),
        "killed before the status recorded the revert"
    );

    // A new process finds the branch and the open pull request instead of making new ones.
    w.start_revert();
    let recorded = git_recorded(&w, "pin-4").await;
    let branch = revert_branch(&recorded);
    assert_eq!(w.git.branches().unwrap(), vec!["main".to_owned(), branch]);
    let pulls = w.forge.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(
        w.forge.creates(),
        1,
        "the open pull request was found, not opened again"
    );
    assert_eq!(
        recorded
            .status
            .unwrap()
            .git_revert
            .unwrap()
            .pull_request_url
            .as_deref(),
        pulls[0]["html_url"].as_str()
    );
}

#[tokio::test]
async fn reverts_workload_identity_cannot_write_a_deployment() {
    let Some(w) = World::start().await else {
        return;
    };
    let as_revert = w.workload.client_with_token(&w.revert_token);
    let deployments: Api<Deployment> = Api::namespaced(as_revert.clone(), SHOP);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "evil", "namespace": SHOP},
        "spec": {"selector": {"matchLabels": {"app": "evil"}}, "template": {"metadata": {"labels": {"app": "evil"}}, "spec": {"containers": [{"name": "c", "image": "evil"}]}}}
    }))
    .unwrap();
    match deployments.create(&PostParams::default(), &d).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("revert's identity created a Deployment: {other:?}"),
    }
    let secrets: Api<Secret> = Api::namespaced(as_revert.clone(), SHOP);
    assert!(
        matches!(secrets.list(&ListParams::default()).await, Err(kube::Error::Api(s)) if s.code == 403)
    );
    // It may write the allowlisted mesh kinds.
    let routes: Api<DynamicObject> = Api::namespaced_with(as_revert, SHOP, &route_resource());
    let r: Value = serde_yaml::from_str(&route("allowed", 5)).unwrap();
    routes
        .patch(
            "allowed",
            &PatchParams::apply("sluice-revert").force(),
            &Patch::Apply(&r),
        )
        .await
        .expect("HTTPRoute allowed");
}

#[tokio::test]
async fn deleting_a_pinned_pin_restores_sync_before_it_goes() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (good, _bad, _) = given_bad_change(&w).await;
    w.start_revert();
    // Driven by the sandbox helpers, as the `pin-release` scenario does.
    let pin = scenario::pin_object(&scenario::PinRequest {
        namespace: ARGOCD,
        name: "pin-4",
        targets: &[APP],
        repository: &w.repo,
        digest: &good.digest,
        keys_secret: "cosign",
        reason: "bad change",
        git_commit: None,
    });
    let (_, pin_ms) = scenario::pin_and_wait(w.mgmt_client.clone(), &pin, BUDGET)
        .await
        .unwrap();
    assert!(pin_ms > 0);
    let pinned = w.pins().get("pin-4").await.unwrap();
    assert!(
        pinned
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&sluice_revert::FINALIZER.to_owned()),
        "a pin that touched an Application carries the finalizer"
    );
    w.pins().delete("pin-4", &Default::default()).await.unwrap();
    let pins = w.pins();
    eventually_every("the deleted pin to go", BUDGET, POLL, || {
        let pins = pins.clone();
        async move { pins.get_opt("pin-4").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert_eq!(
        app_policy(&w.apps().get(APP).await.unwrap()),
        original_policy(),
        "sync restored exactly"
    );
    assert!(
        !w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned())
    );
}
