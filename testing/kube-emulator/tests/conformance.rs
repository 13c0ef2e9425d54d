//! Conformance suite: one test per API behaviour the operators rely on, driven through kube-rs
//! against a fresh emulator each. Expected wording follows kube-apiserver's.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_emulator::{Emulator, Options};
use serde_json::{Value, json};

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.sluice.dev
spec:
  group: test.sluice.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "!has(self.replicas) || !has(self.hosts) || self.replicas <= size(self.hosts) * 2"
              message: replicas may not exceed twice the number of hosts
            properties:
              owner:
                type: string
                x-kubernetes-validations:
                - {rule: "self == oldSelf", message: owner is immutable}
              replicas: {type: integer, minimum: 0, maximum: 10}
              hosts: {type: array, items: {type: string}}
              tags: {type: array, x-kubernetes-list-type: set, items: {type: string}}
              backends:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    weight: {type: integer}
          status:
            type: object
            properties:
              phase: {type: string}
"#;

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.sluice.dev", "v1", "Widget"),
        "widgets",
    )
}

async fn with_widgets() -> (Emulator, Api<DynamicObject>) {
    let emu = Emulator::start().await;
    emu.load_yaml(WIDGET_CRD).expect("widget CRD loads");
    let api = Api::namespaced_with(emu.client(), "default", &widget_resource());
    (emu, api)
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "test.sluice.dev/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

fn api_error(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cm(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn controller_reconciles_an_object_created_after_start_within_a_second() {
    use kube::runtime::controller::{Action, Controller};
    use kube::runtime::watcher;
    use std::sync::Arc;

    let emu = Emulator::start().await;
    let client = emu.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let ctrl = Controller::new(api.clone(), watcher::Config::default()).run(
        |obj: Arc<ConfigMap>, tx: Arc<tokio::sync::mpsc::UnboundedSender<String>>| async move {
            let _ = tx.send(obj.metadata.name.clone().unwrap_or_default());
            Ok::<_, kube::Error>(Action::await_change())
        },
        |_, _, _| Action::requeue(Duration::from_secs(1)),
        Arc::new(tx),
    );
    let handle = tokio::spawn(ctrl.for_each(|_| async {}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    api.create(&PostParams::default(), &cm("late", json!({})))
        .await
        .unwrap();
    let name = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            let n = rx.recv().await.unwrap();
            if n == "late" {
                return n;
            }
        }
    })
    .await
    .expect("reconciled within a second");
    assert_eq!(name, "late");
    println!("reconciled {:?} after creation", started.elapsed());
    handle.abort();
}

#[tokio::test]
async fn a_list_by_label_follows_relabels_deletes_and_namespaces() {
    let emu = Emulator::start().await;
    let client = emu.client();
    for ns in ["shop", "bank"] {
        let n: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::all(client.clone())
            .create(&PostParams::default(), &n)
            .await
            .unwrap();
    }
    let shop: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    let bank: Api<ConfigMap> = Api::namespaced(client.clone(), "bank");
    let all: Api<ConfigMap> = Api::all(client.clone());
    for (api, n) in [(&shop, "a"), (&shop, "b"), (&bank, "c")] {
        api.create(
            &PostParams::default(),
            &cm(n, json!({"app": "web", "tier": "1"})),
        )
        .await
        .unwrap();
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    let list = |api: &Api<ConfigMap>, sel: &'static str| {
        let api = api.clone();
        async move { names(api.list(&ListParams::default().labels(sel)).await.unwrap()) }
    };
    assert_eq!(list(&shop, "app=web").await, vec!["a", "b"]);
    assert_eq!(list(&all, "app=web,tier in (1)").await, vec!["c", "a", "b"]);
    // A relabel moves the object out of one selection and into another.
    shop.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "api"}}})),
    )
    .await
    .unwrap();
    assert_eq!(list(&shop, "app=web").await, vec!["b"]);
    assert_eq!(list(&shop, "app=api,tier=1").await, vec!["a"]);
    // A label removed is gone from the selection; a deleted object is gone from every one.
    shop.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": null}}})),
    )
    .await
    .unwrap();
    assert_eq!(list(&all, "tier=1").await, vec!["c", "a"]);
    // Pagination walks the narrowed selection in order.
    let page1 = all
        .list(&ListParams::default().labels("tier=1").limit(1))
        .await
        .unwrap();
    let token = page1.metadata.continue_.clone().expect("continue token");
    assert_eq!(names(page1), vec!["c"]);
    let page2 = all
        .list(
            &ListParams::default()
                .labels("tier=1")
                .limit(1)
                .continue_token(&token),
        )
        .await
        .unwrap();
    assert!(page2.metadata.continue_.is_none(), "the last page");
    assert_eq!(names(page2), vec!["a"]);
    bank.delete("c", &DeleteParams::default()).await.unwrap();
    assert_eq!(list(&all, "app=web").await, vec!["b"]);
    assert_eq!(list(&all, "app=nothing").await, Vec::<String>::new());
}

#[tokio::test]
async fn create_get_list_with_selectors_and_pagination() {
    let emu = Emulator::start().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    for (n, tier) in [("a", "front"), ("b", "back"), ("c", "front"), ("d", "db")] {
        api.create(
            &PostParams::default(),
            &cm(n, json!({"tier": tier, "app": "shop"})),
        )
        .await
        .unwrap();
    }
    let got = api.get("b").await.unwrap();
    assert!(got.metadata.uid.is_some() && got.metadata.creation_timestamp.is_some());
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    let cases = [
        ("tier=front", vec!["a", "c"]),
        ("tier!=front", vec!["b", "d"]),
        ("tier in (back,db)", vec!["b", "d"]),
        ("tier notin (back,db)", vec!["a", "c"]),
        ("app", vec!["a", "b", "c", "d"]),
        ("!app", vec![]),
    ];
    for (sel, want) in cases {
        assert_eq!(
            names(api.list(&ListParams::default().labels(sel)).await.unwrap()),
            want,
            "{sel}"
        );
    }
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=c"))
                .await
                .unwrap()
        ),
        vec!["c"]
    );
    let page1 = api.list(&ListParams::default().limit(3)).await.unwrap();
    let token = page1.metadata.continue_.clone().expect("continue token");
    assert_eq!(names(page1), vec!["a", "b", "c"]);
    let page2 = api
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert!(page2.metadata.continue_.is_none());
    assert_eq!(names(page2), vec!["d"]);
    // Other namespaces do not exist until created.
    let other: Api<ConfigMap> = Api::namespaced(emu.client(), "nowhere");
    let err = api_error(
        other
            .create(&PostParams::default(), &cm("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.message.as_str()),
        (404, "namespaces \"nowhere\" not found")
    );
    // generateName.
    let mut g = cm("", json!({}));
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let made = api.create(&PostParams::default(), &g).await.unwrap();
    assert!(made.metadata.name.unwrap().starts_with("gen-"));
}

#[tokio::test]
async fn not_found_and_already_exists_are_worded_like_the_apiserver() {
    let (_emu, api) = with_widgets().await;
    let err = api_error(api.get("x").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "widgets.test.sluice.dev \"x\" not found");
    api.create(&PostParams::default(), &widget("x", json!({})))
        .await
        .unwrap();
    let err = api_error(
        api.create(&PostParams::default(), &widget("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.message.as_str()),
        (409, "widgets.test.sluice.dev \"x\" already exists")
    );
}

#[tokio::test]
async fn update_with_a_stale_resource_version_is_a_409() {
    let (_emu, api) = with_widgets().await;
    let first = api
        .create(&PostParams::default(), &widget("w", json!({"replicas": 1})))
        .await
        .unwrap();
    let mut a = first.clone();
    a.data["spec"]["replicas"] = json!(2);
    let second = api.replace("w", &PostParams::default(), &a).await.unwrap();
    assert!(
        second
            .metadata
            .resource_version
            .as_ref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > first
                .metadata
                .resource_version
                .as_ref()
                .unwrap()
                .parse::<u64>()
                .unwrap()
    );
    let mut stale = first.clone();
    stale.data["spec"]["replicas"] = json!(3);
    let err = api_error(
        api.replace("w", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(
        err.message,
        "Operation cannot be fulfilled on widgets.test.sluice.dev \"w\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

#[tokio::test]
async fn generation_changes_on_spec_only_and_status_is_a_separate_subresource() {
    let (_emu, api) = with_widgets().await;
    let w = api
        .create(&PostParams::default(), &widget("w", json!({"replicas": 1})))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    // A status write keeps the generation and the spec.
    let st = api
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}, "spec": {"replicas": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(st.metadata.generation, Some(1));
    assert_eq!(st.data["status"]["phase"], "Ready");
    assert_eq!(st.data["spec"]["replicas"], 1);
    // A main-resource write ignores status.
    let m = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Lost"}, "metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(m.data["status"]["phase"], "Ready");
    assert_eq!(
        m.metadata.generation,
        Some(1),
        "a metadata change does not bump generation"
    );
    let s = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(s.metadata.generation, Some(2));
    // A write that changes nothing does not change the resourceVersion.
    let again = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(again.metadata.resource_version, s.metadata.resource_version);
}

#[tokio::test]
async fn a_finalizer_holds_a_delete_until_it_is_removed() {
    let (_emu, api) = with_widgets().await;
    let mut w = widget("w", json!({}));
    w.metadata.finalizers = Some(vec!["test.sluice.dev/hold".into()]);
    api.create(&PostParams::default(), &w).await.unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let held = api.get("w").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let err = api_error(api.get("w").await.unwrap_err());
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn server_side_apply_conflicts_between_two_managers_and_force_takes_over() {
    let (_emu, api) = with_widgets().await;
    let cfg = |replicas: i64| json!({"apiVersion": "test.sluice.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"replicas": replicas}});
    api.patch("w", &PatchParams::apply("alpha"), &Patch::Apply(cfg(1)))
        .await
        .unwrap();
    let err = api_error(
        api.patch("w", &PatchParams::apply("beta"), &Patch::Apply(cfg(2)))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"alpha\": .spec.replicas"
    );
    let forced = api
        .patch(
            "w",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(cfg(2)),
        )
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["replicas"], 2);
    let mf = forced.metadata.managed_fields.unwrap();
    let beta = mf
        .iter()
        .find(|m| m.manager.as_deref() == Some("beta"))
        .expect("beta entry");
    assert_eq!(beta.operation.as_deref(), Some("Apply"));
    assert!(
        mf.iter().all(|m| m.manager.as_deref() != Some("alpha")),
        "alpha lost its only field: {mf:?}"
    );
    // Now alpha conflicts with beta.
    let err = api_error(
        api.patch("w", &PatchParams::apply("alpha"), &Patch::Apply(cfg(3)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"beta\": .spec.replicas"
    );
}

#[tokio::test]
async fn an_atomic_list_is_owned_as_a_whole_and_map_lists_per_item() {
    let (_emu, api) = with_widgets().await;
    let apply = |m: &'static str, spec: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "w",
                &PatchParams::apply(m),
                &Patch::Apply(json!({"apiVersion": "test.sluice.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec})),
            )
            .await
        }
    };
    apply(
        "alpha",
        json!({"hosts": ["a.example", "b.example"], "backends": [{"name": "blue", "weight": 100}]}),
    )
    .await
    .unwrap();
    // Adding one host to the atomic list replaces it: a conflict with its owner.
    let err = api_error(
        apply("beta", json!({"hosts": ["c.example"]}))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"alpha\": .spec.hosts"
    );
    // A new item of a map list is beta's own: no conflict, both items kept.
    let both = apply(
        "beta",
        json!({"backends": [{"name": "green", "weight": 0}]}),
    )
    .await
    .unwrap();
    let names: Vec<&str> = both.data["spec"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["blue", "green"]);
    // Changing alpha's item is a conflict on that item's field only.
    let err = api_error(
        apply(
            "beta",
            json!({"backends": [{"name": "blue", "weight": 50}]}),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"alpha\": .spec.backends[name=\"blue\"].weight"
    );
    // When alpha stops applying blue, the item goes (beta's green stays).
    let after = apply("alpha", json!({"hosts": ["a.example", "b.example"]}))
        .await
        .unwrap();
    let names: Vec<&str> = after.data["spec"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["green"]);
}

#[tokio::test]
async fn update_operations_are_recorded_and_client_supplied_managed_fields_honoured() {
    let (_emu, api) = with_widgets().await;
    api.create(
        &PostParams {
            field_manager: Some("creator".into()),
            ..Default::default()
        },
        &widget("w", json!({"replicas": 1})),
    )
    .await
    .unwrap();
    let w = api.get("w").await.unwrap();
    let mf = w.metadata.managed_fields.clone().unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("creator"), Some("Update"))
    );
    let fields = serde_json::to_value(&mf[0].fields_v1).unwrap();
    assert_eq!(fields["f:spec"]["f:replicas"], json!({}));
    // An empty list is ignored.
    let same = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": []}})),
        )
        .await
        .unwrap();
    assert_eq!(same.metadata.managed_fields.unwrap().len(), 1);
    // [{}] clears the list.
    let cleared = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": [{}]}})),
        )
        .await
        .unwrap();
    assert!(
        cleared
            .metadata
            .managed_fields
            .unwrap_or_default()
            .is_empty()
    );
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_after_a_dropped_connection() {
    let emu = Emulator::start().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    let first = api
        .create(&PostParams::default(), &cm("one", json!({})))
        .await
        .unwrap();
    let rv0 = first.metadata.resource_version.unwrap();
    {
        let stream = api
            .watch(&WatchParams::default().timeout(10), &rv0)
            .await
            .unwrap();
        futures::pin_mut!(stream);
        api.create(&PostParams::default(), &cm("two", json!({})))
            .await
            .unwrap();
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("two")),
            other => panic!("unexpected {other:?}"),
        }
        // Connection dropped here.
    }
    let seen = api
        .get("two")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("three", json!({})))
        .await
        .unwrap();
    api.delete("one", &DeleteParams::default()).await.unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(10), &seen)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let mut got = Vec::new();
    for _ in 0..2 {
        match tokio::time::timeout(Duration::from_secs(2), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(c) => got.push(format!("added {}", c.metadata.name.unwrap())),
            WatchEvent::Deleted(c) => got.push(format!("deleted {}", c.metadata.name.unwrap())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, vec!["added three", "deleted one"]);
}

#[tokio::test]
async fn a_compacted_resource_version_is_410_and_the_watcher_relists() {
    let emu = Emulator::start_with(Options {
        watch_history: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    let first = api
        .create(&PostParams::default(), &cm("c0", json!({})))
        .await
        .unwrap();
    for i in 1..10 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), json!({})))
            .await
            .unwrap();
    }
    let stream = api
        .watch(
            &WatchParams::default().timeout(5),
            first.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap();
    futures::pin_mut!(stream);
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(s) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            assert!(
                s.message.starts_with("too old resource version"),
                "{}",
                s.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // kube-runtime's watcher relists and sees everything.
    let names: Vec<String> =
        kube::runtime::watcher(api.clone(), kube::runtime::watcher::Config::default())
            .take_while(|e| {
                futures::future::ready(!matches!(e, Ok(kube::runtime::watcher::Event::InitDone)))
            })
            .filter_map(|e| async move {
                match e {
                    Ok(kube::runtime::watcher::Event::InitApply(c)) => c.metadata.name,
                    _ => None,
                }
            })
            .collect()
            .await;
    assert_eq!(names.len(), 10);
}

#[tokio::test]
async fn watch_bookmarks_and_streaming_initial_events() {
    let emu = Emulator::start_with(Options {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(5), "0")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let mut saw_added = false;
    let mut saw_bookmark = false;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(2), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        match ev {
            WatchEvent::Added(_) => saw_added = true,
            WatchEvent::Bookmark(b) => {
                assert!(!b.metadata.resource_version.is_empty());
                saw_bookmark = true;
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_added && saw_bookmark);
    // The streaming-list strategy ends its initial events with an annotated bookmark.
    let items: Vec<ConfigMap> = kube::runtime::watcher(
        api.clone(),
        kube::runtime::watcher::Config::default().streaming_lists(),
    )
    .take_while(|e| {
        futures::future::ready(!matches!(e, Ok(kube::runtime::watcher::Event::InitDone)))
    })
    .filter_map(|e| async move {
        match e {
            Ok(kube::runtime::watcher::Event::InitApply(c)) => Some(c),
            _ => None,
        }
    })
    .collect()
    .await;
    assert_eq!(items.len(), 1);
}

#[tokio::test]
async fn eviction_is_refused_while_a_disruption_budget_allows_none() {
    let emu = Emulator::start().await;
    // kube-rs retries 429 with backoff by default; the refusal itself is what is under test.
    let mut config = emu.client_config();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pdbs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("policy", "v1", "PodDisruptionBudget"),
            "poddisruptionbudgets",
        ),
    );
    let pdb: DynamicObject = serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    pdbs.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 1, "currentHealthy": 1, "expectedPods": 1}})),
    )
    .await
    .unwrap();
    let err = api_error(pods.evict("p", &Default::default()).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(
        err.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = &err.details.as_ref().unwrap().causes[0];
    assert_eq!(
        cause.message,
        "The disruption budget web needs 1 healthy pods and has 1 currently"
    );
    pods.get("p").await.unwrap();
    // Once the budget allows one disruption the eviction goes through and uses it up.
    pdbs.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"disruptionsAllowed": 1}})),
    )
    .await
    .unwrap();
    pods.evict("p", &Default::default()).await.unwrap();
    assert_eq!(api_error(pods.get("p").await.unwrap_err()).code, 404);
    assert_eq!(
        pdbs.get("web").await.unwrap().data["status"]["disruptionsAllowed"],
        0
    );
}

#[tokio::test]
async fn strategic_merge_patches_containers_by_name() {
    let emu = Emulator::start().await;
    let pods: Api<Pod> = Api::namespaced(emu.client(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "proxy", "image": "proxy:1"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "proxy", "image": "proxy:2"}]}}),
            ),
        )
        .await
        .unwrap();
    let images: Vec<String> = p
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.image.unwrap())
        .collect();
    assert_eq!(images, vec!["app:1", "proxy:2"]);
    // Strategic merge patch is refused for custom resources, as the real server does.
    emu.load_yaml(WIDGET_CRD).unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(emu.client(), "default", &widget_resource());
    api.create(&PostParams::default(), &widget("w", json!({})))
        .await
        .unwrap();
    let err = api_error(
        api.patch(
            "w",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 415);
}

#[tokio::test]
async fn json_patch_and_delete_collection() {
    let emu = Emulator::start().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    for n in ["a", "b", "c"] {
        api.create(
            &PostParams::default(),
            &cm(n, json!({"sweep": if n == "c" { "no" } else { "yes" }})),
        )
        .await
        .unwrap();
    }
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "replace", "path": "/data/k", "value": "w"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["k"], "w");
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("sweep=yes"),
    )
    .await
    .unwrap();
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left, vec!["c"]);
}

#[tokio::test]
async fn several_emulators_are_independent() {
    let a = Emulator::start().await;
    let b = Emulator::start().await;
    assert_ne!(a.port(), b.port());
    Api::<ConfigMap>::namespaced(a.client(), "default")
        .create(&PostParams::default(), &cm("only-in-a", json!({})))
        .await
        .unwrap();
    let in_b = Api::<ConfigMap>::namespaced(b.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(in_b.items.is_empty());
    a.shutdown().await;
    // b still serves after a is gone.
    Api::<ConfigMap>::namespaced(b.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_project_crds_load() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let emu = Emulator::start().await;
    let mut loaded = 0;
    let mut refused = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            loaded += 1;
            if let Err(e) = emu.load_manifest_file(&path) {
                refused.push(e.to_string());
            }
        }
    }
    if loaded == 0 {
        println!("skipping: no CRDs in {} yet", dir.display());
    }
    // kube-apiserver refuses the same CRDs: a CEL rule must name reserved words such as
    // `namespace` by their escaped names (`__namespace__`).
    assert!(
        refused.is_empty(),
        "{} of {loaded} CRDs refused:\n{}",
        refused.len(),
        refused.join("\n")
    );
}

#[tokio::test]
async fn upstream_crds_load_and_serve() {
    let Some(dir) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds()) else {
        return;
    };
    let emu = Emulator::start().await;
    for f in [
        "gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml",
        "gateway-api-v1.6.1/gateway.networking.k8s.io_grpcroutes.yaml",
        "argo-cd-v3.5.1/application-crd.yaml",
        "argo-cd-v3.5.1/applicationset-crd.yaml",
        "argo-cd-v3.5.1/appproject-crd.yaml",
    ] {
        emu.load_manifest_file(dir.join(f))
            .unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    let routes: Api<DynamicObject> = Api::namespaced_with(
        emu.client(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
            "httproutes",
        ),
    );
    let route: DynamicObject = serde_json::from_value(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r"}, "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [
            {"name": "stable", "port": 80, "weight": 90}, {"name": "canary", "port": 80, "weight": 10}]}]}}))
    .unwrap();
    let made = routes.create(&PostParams::default(), &route).await.unwrap();
    assert_eq!(
        made.metadata.name.as_deref(),
        Some("r"),
        "metadata survives pruning"
    );
    assert_eq!(
        routes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        made.data["spec"]["rules"][0]["backendRefs"][1]["weight"],
        10
    );
    let apps: Api<DynamicObject> = Api::namespaced_with(
        emu.client(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        ),
    );
    let app: DynamicObject = serde_json::from_value(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "a"}, "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc", "namespace": "x"},
        "source": {"repoURL": "https://example.invalid/repo.git", "path": "p", "targetRevision": "HEAD"}}}))
    .unwrap();
    apps.create(&PostParams::default(), &app).await.unwrap();
}

#[tokio::test]
async fn schema_and_cel_rejections_are_422_with_the_field_and_the_rule_message() {
    let (_emu, api) = with_widgets().await;
    let err = api_error(
        api.create(
            &PostParams::default(),
            &widget("w", json!({"replicas": 3, "hosts": ["a"]})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        err.message,
        "Widget.test.sluice.dev \"w\" is invalid: spec: Invalid value: replicas may not exceed twice the number of hosts"
    );
    let err = api_error(
        api.create(
            &PostParams::default(),
            &widget("w", json!({"replicas": 11})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"),
        "{}",
        err.message
    );
    // Transition rule: oldSelf is the stored object.
    api.create(
        &PostParams::default(),
        &widget("w", json!({"owner": "team-a"})),
    )
    .await
    .unwrap();
    let err = api_error(
        api.patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"owner": "team-b"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        err.message,
        "Widget.test.sluice.dev \"w\" is invalid: spec.owner: Invalid value: \"team-b\": owner is immutable"
    );
    // Unknown fields are pruned, not stored.
    let pruned = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"surprise": true}})),
        )
        .await
        .unwrap();
    assert!(pruned.data["spec"].get("surprise").is_none());
}

#[tokio::test]
async fn rbac_denies_what_no_role_grants_with_the_apiserver_wording() {
    let emu = Emulator::start_with(Options {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    emu.load_yaml(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-reader, namespace: default}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: op-reads, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}
subjects:
- {kind: ServiceAccount, name: op, namespace: default}
"#,
    )
    .unwrap();
    let token = emu.service_account_token("default", "op");
    let as_op: Api<ConfigMap> = Api::namespaced(emu.client_with_token(&token), "default");
    as_op
        .list(&ListParams::default())
        .await
        .expect("granted by the role");
    let err = api_error(
        as_op
            .create(&PostParams::default(), &cm("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        err.message,
        "configmaps is forbidden: User \"system:serviceaccount:default:op\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );
    let other: Api<ConfigMap> = Api::namespaced(emu.client_with_token(&token), "kube-system");
    let err = api_error(other.get("y").await.unwrap_err());
    assert_eq!(
        err.message,
        "configmaps \"y\" is forbidden: User \"system:serviceaccount:default:op\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"kube-system\""
    );
    // The administrator is never denied; an unknown token is 401.
    Api::<ConfigMap>::namespaced(emu.client(), "default")
        .create(&PostParams::default(), &cm("x", json!({})))
        .await
        .unwrap();
    let err = api_error(
        Api::<ConfigMap>::namespaced(emu.client_with_token("nope"), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 401);
}

#[tokio::test]
async fn a_validating_admission_policy_denies_a_write() {
    let emu = Emulator::start().await;
    emu.load_yaml(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: cm-names}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [configmaps]
  validations:
  - expression: "object.metadata.name.startsWith('ok-') || request.userInfo.username == 'emulator-admin'"
    message: configmap names must start with ok-
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: cm-names-binding}
spec:
  policyName: cm-names
  validationActions: [Deny]
"#,
    )
    .unwrap();
    // The administrator passes by the policy's own expression; a service account does not.
    let token = emu.service_account_token("default", "writer");
    let api: Api<ConfigMap> = Api::namespaced(emu.client_with_token(&token), "default");
    api.create(&PostParams::default(), &cm("ok-1", json!({})))
        .await
        .unwrap();
    let err = api_error(
        api.create(&PostParams::default(), &cm("bad", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        err.message,
        "configmaps \"bad\" is forbidden: ValidatingAdmissionPolicy 'cm-names' with binding 'cm-names-binding' denied request: configmap names must start with ok-"
    );
    Api::<ConfigMap>::namespaced(emu.client(), "default")
        .create(&PostParams::default(), &cm("bad", json!({})))
        .await
        .unwrap();
}

/// kube-apiserver's admission attributes carry a Namespace's own name as `request.namespace`
/// (checked on the real server by e2e/suite/tests/admission.rs, whose first draft of a message
/// printed `<name>/<name>` there and `/<name>` on the emulator).
#[tokio::test]
async fn an_admission_policy_sees_a_namespace_as_its_own_namespace() {
    let emu = Emulator::start().await;
    emu.load_yaml(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: frozen-namespaces}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["*"]
      operations: [UPDATE]
      resources: [namespaces]
  validations:
  - expression: "false"
    messageExpression: "'namespace=' + request.namespace + ' name=' + request.name"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: frozen-namespaces}
spec:
  policyName: frozen-namespaces
  validationActions: [Deny]
"#,
    )
    .unwrap();
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(emu.client());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap(),
    )
    .await
    .unwrap();
    let err = api_error(
        api.patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert!(
        err.message.ends_with("namespace=team-a name=team-a"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_selected_watch_sees_objects_leave_and_enter_its_selection() {
    let emu = Emulator::start().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    api.create(&PostParams::default(), &cm("a", json!({"tier": "front"})))
        .await
        .unwrap();
    let rv = api
        .get("a")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stream = api
        .watch(&WatchParams::default().labels("tier=front").timeout(5), &rv)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        match tokio::time::timeout(Duration::from_secs(2), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Deleted(_) => got.push("deleted"),
            WatchEvent::Added(_) => got.push("added"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, vec!["deleted", "added"]);
}

#[tokio::test]
async fn a_resource_version_in_an_apply_fences_the_write() {
    let (_emu, api) = with_widgets().await;
    let w = api
        .create(&PostParams::default(), &widget("w", json!({"replicas": 1})))
        .await
        .unwrap();
    let seen = w.metadata.resource_version.clone().unwrap();
    let status = |phase: &str, rv: &str| {
        json!({"apiVersion": "test.sluice.dev/v1", "kind": "Widget",
            "metadata": {"name": "w", "resourceVersion": rv}, "status": {"phase": phase}})
    };
    let written = api
        .patch_status(
            "w",
            &PatchParams::apply("decider"),
            &Patch::Apply(status("Progressing", &seen)),
        )
        .await
        .unwrap();
    assert_eq!(written.data["status"]["phase"], "Progressing");
    // A decision made from the older version fails instead of overwriting.
    let err = api_error(
        api.patch_status(
            "w",
            &PatchParams::apply("decider"),
            &Patch::Apply(status("Aborted", &seen)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );
    let mf = written.metadata.managed_fields.unwrap();
    let entry = mf
        .iter()
        .find(|m| m.manager.as_deref() == Some("decider"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
}

#[tokio::test]
async fn deleting_an_owner_collects_its_dependents_unless_orphaned() {
    let emu = Emulator::start().await;
    let api: Api<ConfigMap> = Api::namespaced(emu.client(), "default");
    let owner = |name: &str, uid: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid});
    let a = api
        .create(&PostParams::default(), &cm("owner-a", json!({})))
        .await
        .unwrap();
    let b = api
        .create(&PostParams::default(), &cm("owner-b", json!({})))
        .await
        .unwrap();
    let (ua, ub) = (a.metadata.uid.unwrap(), b.metadata.uid.unwrap());
    let mut only_a = cm("only-a", json!({}));
    only_a.metadata.owner_references =
        Some(vec![serde_json::from_value(owner("owner-a", &ua)).unwrap()]);
    api.create(&PostParams::default(), &only_a).await.unwrap();
    let mut both = cm("both", json!({}));
    both.metadata.owner_references = Some(vec![
        serde_json::from_value(owner("owner-a", &ua)).unwrap(),
        serde_json::from_value(owner("owner-b", &ub)).unwrap(),
    ]);
    api.create(&PostParams::default(), &both).await.unwrap();
    let mut only_b = cm("only-b", json!({}));
    only_b.metadata.owner_references =
        Some(vec![serde_json::from_value(owner("owner-b", &ub)).unwrap()]);
    api.create(&PostParams::default(), &only_b).await.unwrap();

    api.delete("owner-a", &DeleteParams::background())
        .await
        .unwrap();
    assert_eq!(api_error(api.get("only-a").await.unwrap_err()).code, 404);
    let kept = api.get("both").await.unwrap();
    let refs: Vec<String> = kept
        .metadata
        .owner_references
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(refs, vec!["owner-b"], "the dangling reference is dropped");

    api.delete("owner-b", &DeleteParams::orphan())
        .await
        .unwrap();
    api.get("only-b").await.expect("orphaned dependents stay");
}
