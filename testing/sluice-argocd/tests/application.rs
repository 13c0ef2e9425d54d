//! End to end: Applications with a git source, synced by the simulated Argo CD from a
//! management emulator into a workload emulator. One scenario per behaviour a user relies on:
//! automation off, selfHeal, prune, ApplyOutOfSyncOnly, termination, ignoreDifferences with
//! managedFieldsManagers and RespectIgnoreDifferences, and an unfetchable source.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use sluice_testkit::git::GitRepo;

const BUDGET: Duration = Duration::from_secs(60);

async fn cm(site: &Site, name: &str) -> Option<ConfigMap> {
    site.config_maps("east-1")
        .get_opt(name)
        .await
        .expect("reading ConfigMap")
}

async fn cm_data(site: &Site, name: &str, key: &str) -> Option<String> {
    cm(site, name)
        .await
        .and_then(|c| c.data)
        .and_then(|d| d.get(key).cloned())
}

async fn wait_app(site: &Site, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    eventually(what, BUDGET, async || {
        let app = site.app(name).await;
        pred(&app).then_some(app)
    })
    .await
}

fn repo_with(files: &[(&str, &str)]) -> (GitRepo, String) {
    let repo = GitRepo::new().expect("git repository");
    let sha = repo.commit_files(files, "manifests").expect("commit");
    (repo, sha)
}

fn app_at_path(name: &str, repo: &GitRepo, sync_policy: Value) -> Value {
    let mut app = application(name, &repo.url(), "main", "east-1", sync_policy);
    app["spec"]["source"]["path"] = json!("mesh");
    app
}

/// Drift: another writer changes a field Argo CD applied.
async fn drift(site: &Site, name: &str, key: &str, value: &str) {
    site.config_maps("east-1")
        .patch(
            name,
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {key: value}})),
        )
        .await
        .expect("drift written");
}

#[tokio::test]
async fn automation_off_compares_and_reports_without_applying() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, sha1) = repo_with(&[("mesh/a.yaml", &config_map("a", &[("k", "1")], None))]);
    site.create_app(app_at_path(
        "manual",
        &repo,
        json!({"syncOptions": ["ServerSideApply=true"]}),
    ))
    .await;

    // Given no automation: the source is compared and reported, nothing is applied.
    let app = wait_app(&site, "manual", "OutOfSync at the first commit", |a| {
        str_at(a, "/status/sync/status") == "OutOfSync"
            && str_at(a, "/status/sync/revision") == sha1
    })
    .await;
    assert_eq!(str_at(&app, "/status/health/status"), "Missing");
    assert_eq!(str_at(&app, "/status/resources/0/status"), "OutOfSync");
    assert!(app.pointer("/status/reconciledAt").is_some());
    always(
        "nothing is applied without automation",
        Duration::from_secs(2),
        async || cm(&site, "a").await.is_none(),
    )
    .await;

    // When a manual sync is requested through the operation field.
    site.patch_app("manual", json!({"operation": {"sync": {"revision": "main"}, "initiatedBy": {"username": "release-engineer"}}})).await;
    let app = wait_app(&site, "manual", "Synced after the manual sync", |a| {
        str_at(a, "/status/sync/status") == "Synced"
            && str_at(a, "/status/operationState/phase") == "Succeeded"
    })
    .await;
    // Then the operation is consumed, the object applied with tracking and field manager.
    assert!(
        app.get("operation").is_none_or(Value::is_null),
        "operation field consumed: {app}"
    );
    assert_eq!(
        str_at(&app, "/status/operationState/syncResult/revision"),
        sha1
    );
    assert_eq!(str_at(&app, "/status/health/status"), "Healthy");
    assert_eq!(
        app.pointer("/status/history")
            .and_then(Value::as_array)
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        str_at(&app, "/status/history/0/initiatedBy/username"),
        "release-engineer"
    );
    let live = cm(&site, "a").await.expect("applied");
    assert_eq!(
        live.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("argocd.argoproj.io/tracking-id"))
            .map(String::as_str),
        Some("manual:/ConfigMap:mesh/a")
    );
    // And the Application's Events tell the story in Argo CD's words.
    let events: Vec<(String, String)> =
        kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(site.mgmt.client(), NS)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("manual"))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect();
    assert!(
        events.contains(&(
            "OperationStarted".into(),
            "release-engineer initiated sync to main".into()
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "OperationCompleted".into(),
            format!("Sync operation to {sha1} succeeded")
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "ResourceUpdated".into(),
            "Updated sync status: OutOfSync -> Synced".into()
        )),
        "{events:?}"
    );
    let managers: Vec<String> = live
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"argocd-controller".to_string()),
        "{managers:?}"
    );

    // When Git moves on and automation is explicitly disabled, the new revision is reported, not applied.
    site.patch_app("manual", json!({"spec": {"syncPolicy": {"automated": {"enabled": false, "selfHeal": true, "prune": true}}}})).await;
    let sha2 = repo
        .commit_files(
            &[("mesh/a.yaml", &config_map("a", &[("k", "2")], None))],
            "k=2",
        )
        .unwrap();
    wait_app(&site, "manual", "OutOfSync at the second commit", |a| {
        str_at(a, "/status/sync/status") == "OutOfSync"
            && str_at(a, "/status/sync/revision") == sha2
    })
    .await;
    always(
        "the live object keeps the first revision",
        Duration::from_secs(2),
        async || cm_data(&site, "a", "k").await.as_deref() == Some("1"),
    )
    .await;
    site.stop().await;
}

#[tokio::test]
async fn self_heal_reverts_drift_only_when_enabled() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, _) = repo_with(&[("mesh/a.yaml", &config_map("a", &[("k", "1")], None))]);
    site.create_app(app_at_path("heal", &repo, json!({"automated": {}})))
        .await;
    wait_app(&site, "heal", "first automated sync", |a| {
        str_at(a, "/status/sync/status") == "Synced"
    })
    .await;

    // Without selfHeal, drift is reported and left alone.
    drift(&site, "a", "k", "drifted").await;
    wait_app(&site, "heal", "drift reported", |a| {
        str_at(a, "/status/sync/status") == "OutOfSync"
    })
    .await;
    always(
        "drift is not reverted without selfHeal",
        Duration::from_secs(3),
        async || cm_data(&site, "a", "k").await.as_deref() == Some("drifted"),
    )
    .await;
    let app = site.app("heal").await;
    assert_eq!(
        app.pointer("/status/history")
            .and_then(Value::as_array)
            .map(Vec::len),
        Some(1),
        "one sync per revision"
    );

    // With selfHeal, the drift is reverted.
    site.patch_app(
        "heal",
        json!({"spec": {"syncPolicy": {"automated": {"selfHeal": true}}}}),
    )
    .await;
    eventually("drift reverted by selfHeal", BUDGET, async || {
        (cm_data(&site, "a", "k").await.as_deref() == Some("1")).then_some(())
    })
    .await;
    wait_app(&site, "heal", "Synced again", |a| {
        str_at(a, "/status/sync/status") == "Synced"
    })
    .await;
    site.stop().await;
}

#[tokio::test]
async fn prune_deletes_removed_objects_only_when_enabled() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, _) = repo_with(&[
        ("mesh/a.yaml", &config_map("a", &[("k", "1")], None)),
        ("mesh/b.yaml", &config_map("b", &[("k", "1")], None)),
    ]);
    site.create_app(app_at_path(
        "prune",
        &repo,
        json!({"automated": {"prune": false}}),
    ))
    .await;
    eventually("both objects applied", BUDGET, async || {
        (cm(&site, "b").await.is_some() && cm(&site, "a").await.is_some()).then_some(())
    })
    .await;

    repo.remove("mesh/b.yaml").unwrap();
    let sha = repo.commit("remove b").unwrap();
    repo.push().unwrap();
    let app = wait_app(&site, "prune", "b requires pruning", |a| {
        str_at(a, "/status/sync/revision") == sha
            && a.pointer("/status/resources")
                .and_then(Value::as_array)
                .is_some_and(|rs| {
                    rs.iter()
                        .any(|r| r["name"] == "b" && r["requiresPruning"] == true)
                })
    })
    .await;
    assert_eq!(str_at(&app, "/status/sync/status"), "OutOfSync");
    always(
        "b is kept without prune",
        Duration::from_secs(3),
        async || cm(&site, "b").await.is_some(),
    )
    .await;

    site.patch_app(
        "prune",
        json!({"spec": {"syncPolicy": {"automated": {"prune": true}}}}),
    )
    .await;
    eventually("b pruned", BUDGET, async || {
        cm(&site, "b").await.is_none().then_some(())
    })
    .await;
    let app = wait_app(&site, "prune", "Synced after pruning", |a| {
        str_at(a, "/status/sync/status") == "Synced"
    })
    .await;
    let results = app
        .pointer("/status/operationState/syncResult/resources")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(
        results
            .iter()
            .any(|r| r["name"] == "b" && r["status"] == "Pruned"),
        "{results:?}"
    );
    assert!(cm(&site, "a").await.is_some(), "a stays");
    site.stop().await;
}

/// Argo CD's `IgnoreExtraneous` (`controller/state.go`): an extraneous object carrying it is
/// still listed OutOfSync and requiring pruning, but does not make the Application OutOfSync;
/// one without it does.
#[tokio::test]
async fn ignore_extraneous_keeps_an_extra_object_from_making_the_application_out_of_sync() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, _) = repo_with(&[
        ("mesh/a.yaml", &config_map("a", &[("k", "1")], None)),
        ("mesh/b.yaml", &config_map("b", &[("k", "1")], None)),
    ]);
    site.create_app(app_at_path(
        "extraneous",
        &repo,
        json!({"automated": {"prune": false}}),
    ))
    .await;
    eventually("both objects applied", BUDGET, async || {
        (cm(&site, "b").await.is_some() && cm(&site, "a").await.is_some()).then_some(())
    })
    .await;
    repo.remove("mesh/b.yaml").unwrap();
    let sha = repo.commit("remove b").unwrap();
    repo.push().unwrap();
    let requires_pruning = |a: &Value| {
        a.pointer("/status/resources")
            .and_then(Value::as_array)
            .is_some_and(|rs| {
                rs.iter().any(|r| {
                    r["name"] == "b" && r["requiresPruning"] == true && r["status"] == "OutOfSync"
                })
            })
    };
    wait_app(&site, "extraneous", "OutOfSync by b", |a| {
        str_at(a, "/status/sync/revision") == sha
            && requires_pruning(a)
            && str_at(a, "/status/sync/status") == "OutOfSync"
    })
    .await;
    site.config_maps("east-1")
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {
                "argocd.argoproj.io/compare-options": "IgnoreExtraneous"
            }}})),
        )
        .await
        .unwrap();
    let app = wait_app(&site, "extraneous", "Synced with b extraneous", |a| {
        str_at(a, "/status/sync/status") == "Synced"
    })
    .await;
    assert!(requires_pruning(&app), "b still listed: {app}");
    assert!(cm(&site, "b").await.is_some(), "b is not deleted");
    site.stop().await;
}

async fn applied_names(site: &Site, app: &str, revision: &str) -> Vec<String> {
    let app = wait_app(site, app, "a sync of the new revision", |a| {
        str_at(a, "/status/operationState/syncResult/revision") == revision
            && str_at(a, "/status/operationState/phase") == "Succeeded"
    })
    .await;
    let mut names: Vec<String> = app
        .pointer("/status/operationState/syncResult/resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["status"] == "Synced")
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn apply_out_of_sync_only_applies_only_what_differs() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, sha1) = repo_with(&[
        ("mesh/a.yaml", &config_map("a", &[("k", "1")], None)),
        ("mesh/b.yaml", &config_map("b", &[("k", "1")], None)),
    ]);
    site.create_app(app_at_path("all", &repo, json!({"automated": {}})))
        .await;
    let mut only = app_at_path(
        "only",
        &repo,
        json!({"automated": {}, "syncOptions": ["ApplyOutOfSyncOnly=true"]}),
    );
    only["spec"]["source"]["path"] = json!("other");
    repo.commit_files(
        &[
            ("other/c.yaml", &config_map("c", &[("k", "1")], None)),
            ("other/d.yaml", &config_map("d", &[("k", "1")], None)),
        ],
        "other",
    )
    .unwrap();
    site.create_app(only).await;
    let sha_other = repo.head().unwrap();
    assert_eq!(applied_names(&site, "all", &sha_other).await.len(), 2);
    assert_eq!(
        applied_names(&site, "only", &sha_other).await,
        vec!["c", "d"]
    );
    let _ = sha1;

    // One object changes in each: without the option both are applied, with it only the changed one.
    let sha = repo
        .commit_files(
            &[
                ("mesh/a.yaml", &config_map("a", &[("k", "2")], None)),
                ("other/c.yaml", &config_map("c", &[("k", "2")], None)),
            ],
            "change a and c",
        )
        .unwrap();
    assert_eq!(applied_names(&site, "all", &sha).await, vec!["a", "b"]);
    assert_eq!(applied_names(&site, "only", &sha).await, vec!["c"]);
    site.stop().await;
}

#[tokio::test]
async fn a_running_sync_can_be_terminated() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    // Wave 0 is a Deployment nothing rolls out in the emulator (never healthy); wave 1 waits for it.
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: web\n        image: web:1\n";
    let (repo, sha) = repo_with(&[
        ("mesh/web.yaml", deployment),
        (
            "mesh/late.yaml",
            &config_map("late", &[("k", "1")], Some(1)),
        ),
    ]);
    site.create_app(app_at_path(
        "slow",
        &repo,
        json!({"automated": {"selfHeal": true}}),
    ))
    .await;
    let app = wait_app(
        &site,
        "slow",
        "sync running, waiting for the Deployment",
        |a| {
            str_at(a, "/status/operationState/phase") == "Running"
                && str_at(a, "/status/operationState/message").contains("waiting for healthy state")
        },
    )
    .await;
    assert_eq!(
        str_at(&app, "/status/operationState/message"),
        "waiting for healthy state of apps/Deployment/web"
    );
    assert!(cm(&site, "late").await.is_none(), "wave 1 waits for wave 0");

    // When a client terminates the operation.
    site.patch_app(
        "slow",
        json!({"status": {"operationState": {"phase": "Terminating"}}}),
    )
    .await;
    let app = wait_app(&site, "slow", "operation terminated", |a| {
        str_at(a, "/status/operationState/phase") == "Failed"
    })
    .await;
    assert_eq!(
        str_at(&app, "/status/operationState/message"),
        "Operation terminated"
    );
    assert!(app.pointer("/status/operationState/finishedAt").is_some());
    // Then the later wave never runs, and automation does not retry the same revision.
    always(
        "no new sync of the terminated revision",
        Duration::from_secs(3),
        async || {
            let a = site.app("slow").await;
            cm(&site, "late").await.is_none()
                && str_at(&a, "/status/operationState/phase") == "Failed"
        },
    )
    .await;
    assert_eq!(
        str_at(&site.app("slow").await, "/status/sync/revision"),
        sha
    );
    site.stop().await;
}

async fn take_weight(site: &Site, value: &str) {
    site.config_maps("east-1")
        .patch(
            "route",
            &PatchParams {
                field_manager: Some("rollout-weights".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"weight": value}})),
        )
        .await
        .expect("rollout-weights writes the weight");
}

#[tokio::test]
async fn a_field_owned_by_another_manager_is_not_reverted() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, _) = repo_with(&[(
        "mesh/route.yaml",
        &config_map("route", &[("weight", "0"), ("host", "a")], None),
    )]);
    let policy = |respect: bool| {
        let mut options = vec!["ServerSideApply=true"];
        if respect {
            options.push("RespectIgnoreDifferences=true");
        }
        json!({"automated": {"selfHeal": true}, "syncOptions": options})
    };
    let mut app = app_at_path("route", &repo, policy(true));
    app["spec"]["ignoreDifferences"] =
        json!([{"group": "", "kind": "ConfigMap", "managedFieldsManagers": ["rollout-weights"]}]);
    site.create_app(app).await;
    wait_app(&site, "route", "first sync", |a| {
        str_at(a, "/status/sync/status") == "Synced"
    })
    .await;

    // Given another manager owns the weight, the Application stays Synced and selfHeal leaves it.
    take_weight(&site, "50").await;
    always(
        "the other manager's field is ignored",
        Duration::from_secs(3),
        async || {
            str_at(&site.app("route").await, "/status/sync/status") == "Synced"
                && cm_data(&site, "route", "weight").await.as_deref() == Some("50")
        },
    )
    .await;

    // When Git changes another field, the sync keeps the weight (RespectIgnoreDifferences).
    let sha = repo
        .commit_files(
            &[(
                "mesh/route.yaml",
                &config_map("route", &[("weight", "0"), ("host", "b")], None),
            )],
            "host b",
        )
        .unwrap();
    eventually("host b applied", BUDGET, async || {
        (cm_data(&site, "route", "host").await.as_deref() == Some("b")).then_some(())
    })
    .await;
    wait_app(&site, "route", "synced at the new revision", |a| {
        str_at(a, "/status/operationState/syncResult/revision") == sha
    })
    .await;
    assert_eq!(
        cm_data(&site, "route", "weight").await.as_deref(),
        Some("50")
    );

    // Control: without RespectIgnoreDifferences the same kind of sync reverts the weight.
    site.patch_app("route", json!({"spec": {"syncPolicy": policy(false)}}))
        .await;
    take_weight(&site, "75").await;
    repo.commit_files(
        &[(
            "mesh/route.yaml",
            &config_map("route", &[("weight", "0"), ("host", "c")], None),
        )],
        "host c",
    )
    .unwrap();
    eventually("host c applied", BUDGET, async || {
        (cm_data(&site, "route", "host").await.as_deref() == Some("c")).then_some(())
    })
    .await;
    assert_eq!(
        cm_data(&site, "route", "weight").await.as_deref(),
        Some("0")
    );
    site.stop().await;
}

#[tokio::test]
async fn an_unfetchable_source_is_a_comparison_error() {
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    site.create_app(application(
        "broken",
        "file:///nonexistent/repo.git",
        "main",
        "east-1",
        json!({"automated": {}}),
    ))
    .await;
    let app = wait_app(&site, "broken", "ComparisonError condition", |a| {
        str_at(a, "/status/conditions/0/type") == "ComparisonError"
    })
    .await;
    assert!(
        str_at(&app, "/status/conditions/0/message").contains("nonexistent"),
        "{app}"
    );
    assert_eq!(str_at(&app, "/status/sync/status"), "Unknown");
    site.create_app(application(
        "nowhere",
        "file:///nonexistent/repo.git",
        "main",
        "west-9",
        json!({}),
    ))
    .await;
    let app = wait_app(&site, "nowhere", "InvalidSpecError condition", |a| {
        str_at(a, "/status/conditions/0/type") == "InvalidSpecError"
    })
    .await;
    assert!(
        str_at(&app, "/status/conditions/0/message").contains("west-9"),
        "{app}"
    );
    site.stop().await;
}

#[tokio::test]
async fn starting_without_the_argo_cd_crds_fails_and_says_why() {
    let bare = kube_emulator::Emulator::start().await;
    let err = sluice_argocd::ArgoCd::start(bare.client(), fast_options())
        .await
        .expect_err("no Application CRD");
    assert_eq!(err.category(), "kube");
    assert!(
        err.to_string().contains("install the Argo CD CRDs"),
        "{err}"
    );
    bare.shutdown().await;
}

#[tokio::test]
async fn create_namespace_creates_the_destination_namespace() {
    if !have_git() {
        return;
    }
    let Some(site) = Site::start(&["east-1"], fast_options()).await else {
        return;
    };
    let (repo, _) = repo_with(&[("mesh/a.yaml", &config_map("a", &[("k", "1")], None))]);
    let mut app = app_at_path(
        "fresh",
        &repo,
        json!({"automated": {}, "syncOptions": ["CreateNamespace=true"]}),
    );
    app["spec"]["destination"]["namespace"] = json!("fresh-ns");
    site.create_app(app).await;
    wait_app(&site, "fresh", "Synced into a new namespace", |a| {
        str_at(a, "/status/sync/status") == "Synced"
    })
    .await;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(site.workload("east-1"), "fresh-ns");
    assert!(cms.get_opt("a").await.unwrap().is_some());
    site.stop().await;
}
