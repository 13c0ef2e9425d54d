//! End to end: ApplicationSets on the simulated Argo CD. The clusterDecisionResource generator
//! renders one Application per decision with its revision; an empty decision list deletes them
//! (Argo CD's real behaviour) unless `applicationsSync` forbids deletion;
//! `preserveResourcesOnDeletion` keeps their objects; `ignoreApplicationDifferences` keeps a
//! hand-edited syncPolicy; a non-string decision value is reported; the cluster generator
//! passes labels as parameters.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use sluice_testkit::git::GitRepo;

const BUDGET: Duration = Duration::from_secs(60);

const DECISION_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: decisions.test.sluice.dev
spec:
  group: test.sluice.dev
  names: {kind: Decision, plural: decisions, singular: decision, listKind: DecisionList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: duck
  namespace: argocd
data:
  apiVersion: test.sluice.dev/v1
  kind: decisions
  statusListKey: decisions
  matchKey: clusterName
"#;

fn decisions(site: &Site) -> Api<DynamicObject> {
    Api::namespaced_with(site.mgmt.client(), NS, &decision_resource())
}

async fn publish(site: &Site, list: Value) {
    let api = decisions(site);
    if api.get_opt("site").await.unwrap().is_none() {
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "test.sluice.dev/v1", "kind": "Decision", "metadata": {"name": "site"}})).unwrap();
        api.create(&PostParams::default(), &obj)
            .await
            .expect("decision resource");
    }
    api.patch_status(
        "site",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"decisions": list}})),
    )
    .await
    .expect("decisions published");
}

fn appset(name: &str, repo: &str, applications_sync: &str, preserve: bool) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "generators": [{"clusterDecisionResource": {"configMapRef": "duck", "name": "site"}}],
            "template": {
                "metadata": {"name": format!("{name}-{{{{name}}}}"), "labels": {"wave": "{{wave}}"}},
                "spec": {
                    "project": "default",
                    "source": {"repoURL": repo, "path": "mesh", "targetRevision": "{{revision}}"},
                    "destination": {"server": "{{server}}", "namespace": DEST_NS},
                    "syncPolicy": {"automated": {"selfHeal": true}}
                }
            },
            "syncPolicy": {"applicationsSync": applications_sync, "preserveResourcesOnDeletion": preserve},
            "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}]
        }
    })
}

async fn create_appset(site: &Site, value: Value) {
    let obj: DynamicObject = serde_json::from_value(value).unwrap();
    site.appsets()
        .create(&PostParams::default(), &obj)
        .await
        .expect("ApplicationSet created");
}

async fn app_names(site: &Site, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = site
        .apps()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|a| a.name_any())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

async fn setup(clusters: &[&str]) -> Option<(Site, GitRepo, String, String)> {
    if !have_git() {
        return None;
    }
    let site = Site::start(clusters, fast_options()).await?;
    site.mgmt
        .load_yaml(DECISION_CRD)
        .expect("decision CRD and duck ConfigMap");
    let repo = GitRepo::new().unwrap();
    let sha1 = repo
        .commit_files(
            &[("mesh/a.yaml", &config_map("a", &[("k", "1")], None))],
            "k=1",
        )
        .unwrap();
    let sha2 = repo
        .commit_files(
            &[("mesh/a.yaml", &config_map("a", &[("k", "2")], None))],
            "k=2",
        )
        .unwrap();
    Some((site, repo, sha1, sha2))
}

async fn cm_value(site: &Site, cluster: &str) -> Option<String> {
    site.config_maps(cluster)
        .get_opt("a")
        .await
        .unwrap()
        .and_then(|c| c.data)
        .and_then(|d| d.get("k").cloned())
}

async fn condition(site: &Site, appset: &str, kind: &str) -> (String, String) {
    let a = serde_json::to_value(site.appsets().get(appset).await.unwrap()).unwrap();
    let c = a
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or(json!({}));
    (
        str_at(&c, "/status").to_string(),
        str_at(&c, "/message").to_string(),
    )
}

#[tokio::test]
async fn decisions_render_applications_and_an_empty_list_deletes_them() {
    let Some((site, repo, sha1, sha2)) = setup(&["east-1", "east-2"]).await else {
        return;
    };
    publish(
        &site,
        json!([
            {"clusterName": "east-1", "revision": sha1, "wave": "1"},
            {"clusterName": "east-2", "revision": sha2, "wave": "2"},
        ]),
    )
    .await;
    create_appset(&site, appset("mesh", &repo.url(), "sync", true)).await;

    // One Application per decision, with its revision, synced into its cluster.
    eventually("two Applications", BUDGET, async || {
        (app_names(&site, "mesh-").await == ["mesh-east-1", "mesh-east-2"]).then_some(())
    })
    .await;
    for (cluster, sha, value) in [("east-1", &sha1, "1"), ("east-2", &sha2, "2")] {
        let app = site.app(&format!("mesh-{cluster}")).await;
        assert_eq!(str_at(&app, "/spec/source/targetRevision"), sha);
        assert_eq!(
            str_at(&app, "/spec/destination/server"),
            site.server(cluster)
        );
        assert!(app["metadata"]["labels"]["wave"].is_string());
        assert_eq!(
            app["metadata"]["ownerReferences"][0]["kind"],
            "ApplicationSet"
        );
        eventually("Synced at the decision's revision", BUDGET, async || {
            let a = site.app(&format!("mesh-{cluster}")).await;
            (str_at(&a, "/status/sync/status") == "Synced"
                && str_at(&a, "/status/sync/revision") == sha.as_str())
            .then_some(())
        })
        .await;
        assert_eq!(cm_value(&site, cluster).await.as_deref(), Some(value));
    }
    assert_eq!(condition(&site, "mesh", "ErrorOccurred").await.0, "False");

    // A non-string value is an error in the ApplicationSet's conditions; nothing changes.
    publish(
        &site,
        json!([{"clusterName": "east-1", "revision": sha1, "wave": 1}]),
    )
    .await;
    let (_, message) = eventually("ErrorOccurred", BUDGET, async || {
        let c = condition(&site, "mesh", "ErrorOccurred").await;
        (c.0 == "True").then_some(c)
    })
    .await;
    assert!(message.contains("non-string"), "{message}");
    assert_eq!(app_names(&site, "mesh-").await.len(), 2);

    // A hand-edited syncPolicy survives regeneration (ignoreApplicationDifferences); the refresh
    // annotation is honoured and removed.
    site.patch_app(
        "mesh-east-1",
        json!({"spec": {"syncPolicy": {"automated": {"enabled": false}}}}),
    )
    .await;
    publish(
        &site,
        json!([
            {"clusterName": "east-1", "revision": sha2, "wave": "1"},
            {"clusterName": "east-2", "revision": sha2, "wave": "2"},
        ]),
    )
    .await;
    site.appsets()
        .patch("mesh", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"argocd.argoproj.io/application-set-refresh": "true"}}})))
        .await
        .unwrap();
    eventually("east-1 moved to the new revision", BUDGET, async || {
        let a = site.app("mesh-east-1").await;
        (str_at(&a, "/spec/source/targetRevision") == sha2).then_some(())
    })
    .await;
    let app = site.app("mesh-east-1").await;
    assert_eq!(
        app.pointer("/spec/syncPolicy/automated/enabled"),
        Some(&json!(false)),
        "{app}"
    );
    eventually("refresh annotation removed", BUDGET, async || {
        let a = site.appsets().get("mesh").await.unwrap();
        (!a.annotations()
            .contains_key("argocd.argoproj.io/application-set-refresh"))
        .then_some(())
    })
    .await;
    eventually(
        "east-1 reported OutOfSync, automation being off",
        BUDGET,
        async || {
            (str_at(&site.app("mesh-east-1").await, "/status/sync/status") == "OutOfSync")
                .then_some(())
        },
    )
    .await;
    assert_eq!(cm_value(&site, "east-1").await.as_deref(), Some("1"));

    // An empty decision list deletes every generated Application; preserveResourcesOnDeletion
    // keeps the objects they applied.
    publish(&site, json!([])).await;
    eventually("Applications deleted", BUDGET, async || {
        app_names(&site, "mesh-").await.is_empty().then_some(())
    })
    .await;
    always(
        "workload objects preserved",
        Duration::from_secs(2),
        async || {
            cm_value(&site, "east-1").await.is_some() && cm_value(&site, "east-2").await.is_some()
        },
    )
    .await;
    site.stop().await;
}

#[tokio::test]
async fn create_update_never_deletes() {
    let Some((site, repo, sha1, _)) = setup(&["east-1"]).await else {
        return;
    };
    publish(
        &site,
        json!([{"clusterName": "east-1", "revision": sha1, "wave": "1"}]),
    )
    .await;
    create_appset(&site, appset("keep", &repo.url(), "create-update", true)).await;
    eventually("Application generated", BUDGET, async || {
        (app_names(&site, "keep-").await == ["keep-east-1"]).then_some(())
    })
    .await;

    publish(&site, json!([])).await;
    always(
        "create-update keeps the Application",
        Duration::from_secs(3),
        async || app_names(&site, "keep-").await.len() == 1,
    )
    .await;

    // No decision resource at all is a generator error, not an empty list.
    decisions(&site)
        .delete("site", &DeleteParams::default())
        .await
        .unwrap();
    let (_, message) = eventually("ErrorOccurred", BUDGET, async || {
        let c = condition(&site, "keep", "ErrorOccurred").await;
        (c.0 == "True").then_some(c)
    })
    .await;
    assert!(
        message.contains("no clusterDecisionResources found"),
        "{message}"
    );
    assert_eq!(app_names(&site, "keep-").await.len(), 1);
    site.stop().await;
}

#[tokio::test]
async fn without_preserve_deleting_an_application_deletes_its_objects() {
    let Some((site, repo, sha1, _)) = setup(&["east-1"]).await else {
        return;
    };
    publish(
        &site,
        json!([{"clusterName": "east-1", "revision": sha1, "wave": "1"}]),
    )
    .await;
    create_appset(&site, appset("gone", &repo.url(), "sync", false)).await;
    eventually("object applied", BUDGET, async || {
        cm_value(&site, "east-1").await.map(|_| ())
    })
    .await;
    let app = site.app("gone-east-1").await;
    assert_eq!(
        app["metadata"]["finalizers"],
        json!(["resources-finalizer.argocd.argoproj.io"])
    );

    publish(&site, json!([])).await;
    eventually("Application deleted", BUDGET, async || {
        app_names(&site, "gone-").await.is_empty().then_some(())
    })
    .await;
    eventually("its objects deleted", BUDGET, async || {
        cm_value(&site, "east-1").await.is_none().then_some(())
    })
    .await;

    // When the decision comes back, the recreated Application (same name, new uid) syncs again.
    publish(
        &site,
        json!([{"clusterName": "east-1", "revision": sha1, "wave": "1"}]),
    )
    .await;
    eventually("object applied again", BUDGET, async || {
        cm_value(&site, "east-1").await.map(|_| ())
    })
    .await;
    site.stop().await;
}

#[tokio::test]
async fn the_cluster_generator_passes_names_servers_and_labels() {
    let Some((site, repo, sha1, _)) = setup(&["east-1", "east-2"]).await else {
        return;
    };
    let value = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": "clusters", "namespace": NS},
        "spec": {
            "generators": [{"clusters": {"selector": {"matchLabels": {"site": "east"}}}}],
            "template": {
                "metadata": {"name": "{{metadata.labels.site}}-{{name}}"},
                "spec": {
                    "project": "default",
                    "source": {"repoURL": repo.url(), "path": "mesh", "targetRevision": sha1},
                    "destination": {"server": "{{server}}", "namespace": DEST_NS}
                }
            }
        }
    });
    create_appset(&site, value).await;
    eventually("one Application per cluster", BUDGET, async || {
        (app_names(&site, "east-").await == ["east-east-1", "east-east-2"]).then_some(())
    })
    .await;
    let app = site.app("east-east-2").await;
    assert_eq!(
        str_at(&app, "/spec/destination/server"),
        site.server("east-2")
    );
    site.stop().await;
}
