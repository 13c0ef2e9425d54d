//! Leader election and write fencing against the Kubernetes API emulator: a standby takes over
//! after the leader's Lease expires, a released Lease is taken over, and a deposed
//! leader's stale status write fails on its resourceVersion precondition.

use std::{borrow::Cow, time::Duration};

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{Api, Resource, api::PostParams};
use serde::{Deserialize, Serialize};
use sluice_runtime::{FieldManager, config::LeaseSettings, leader, write, write::WriteError};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.test.sluice.dev}
spec:
  group: test.sluice.dev
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// A minimal custom resource with a status subresource.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct Widget {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<serde_json::Value>,
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "test.sluice.dev".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        name: "sluice-test".into(),
        namespace: "default".into(),
        identity: identity.into(),
        // Renew deadline 2 s, renewed every second (the validated flags require retry < deadline).
        duration_seconds: 3,
        renew_seconds: 1,
        retry: Duration::from_secs(1),
    }
}

async fn wait_leader(l: &mut leader::Leadership, within: Duration) -> Duration {
    let start = Instant::now();
    assert!(
        timeout(within, l.acquired())
            .await
            .expect("leadership in time"),
        "election stopped"
    );
    start.elapsed()
}

async fn start() -> (kube_emulator::Emulator, kube::Client, Api<Widget>) {
    let emu = kube_emulator::Emulator::start().await;
    emu.load_yaml(CRD).expect("CRD loads");
    let client = emu.client();
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    api.create(
        &PostParams::default(),
        &Widget {
            metadata: ObjectMeta {
                name: Some("w".into()),
                ..ObjectMeta::default()
            },
            ..Widget::default()
        },
    )
    .await
    .expect("widget created");
    (emu, client, api)
}

#[tokio::test]
async fn standby_takes_over_after_expiry_then_after_release() {
    let (emu, client, _api) = start().await;

    // A leads.
    let stop_a = CancellationToken::new();
    let (mut lead_a, task_a) = leader::spawn(client.clone(), settings("a"), stop_a.clone());
    wait_leader(&mut lead_a, Duration::from_secs(10)).await;

    // B stands by while A renews.
    let stop_b = CancellationToken::new();
    let (mut lead_b, task_b) = leader::spawn(client.clone(), settings("b"), stop_b.clone());
    let first = timeout(Duration::from_secs(5), lead_b.changed()).await;
    assert_eq!(
        first,
        Ok(Some(false)),
        "a standby announces itself once the Lease is readable"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(lead_a.is_leader(), "A keeps renewing");
    assert!(!lead_b.is_leader(), "B waits while A's Lease is valid");

    // A hangs (no renewal, no release): B takes over once the Lease expires.
    task_a.abort();
    let took = wait_leader(&mut lead_b, Duration::from_secs(15)).await;
    println!(
        "takeover after the leader stopped renewing: {took:?} (lease 3 s, renew deadline 2 s)"
    );
    assert!(
        took >= Duration::from_millis(500),
        "B must wait for expiry, took {took:?}"
    );

    // A graceful stop releases the Lease (holder cleared): a new standby takes it over.
    let stop_c = CancellationToken::new();
    let (mut lead_c, task_c) = leader::spawn(client.clone(), settings("c"), stop_c.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!lead_c.is_leader());
    stop_b.cancel();
    timeout(Duration::from_secs(5), task_b)
        .await
        .unwrap()
        .unwrap();
    assert!(!lead_b.is_leader(), "a stopped replica no longer leads");
    let took = wait_leader(&mut lead_c, Duration::from_secs(10)).await;
    println!("takeover after release: {took:?}");
    stop_c.cancel();
    timeout(Duration::from_secs(5), task_c)
        .await
        .unwrap()
        .unwrap();
    emu.shutdown().await;
}

#[tokio::test]
async fn deposed_leaders_stale_status_write_fails_on_resource_version() {
    let (emu, client, api) = start().await;
    let old_manager = FieldManager::new("sluice-test-a");
    let new_manager = FieldManager::new("sluice-test-b");

    let stop_a = CancellationToken::new();
    let (mut lead_a, task_a) = leader::spawn(client.clone(), settings("a"), stop_a.clone());
    wait_leader(&mut lead_a, Duration::from_secs(10)).await;
    // A reads the object and decides from it, then stalls (no renewal, no release).
    let seen_by_a = api.get("w").await.unwrap();
    task_a.abort();

    let stop_b = CancellationToken::new();
    let (mut lead_b, task_b) = leader::spawn(client.clone(), settings("b"), stop_b.clone());
    wait_leader(&mut lead_b, Duration::from_secs(15)).await;
    let fresh = api.get("w").await.unwrap();
    write::apply_status(
        &api,
        new_manager,
        &fresh,
        &serde_json::json!({"decidedBy": "b"}),
    )
    .await
    .expect("new leader writes");

    // A wakes up and writes its old decision: it must fail, not overwrite B's.
    let err = write::apply_status(
        &api,
        old_manager,
        &seen_by_a,
        &serde_json::json!({"decidedBy": "a"}),
    )
    .await
    .expect_err("deposed leader's stale write must fail");
    assert!(matches!(err, WriteError::Stale { .. }), "{err:?}");
    let stored = api.get("w").await.unwrap();
    assert_eq!(stored.status.unwrap()["decidedBy"], "b");

    stop_b.cancel();
    timeout(Duration::from_secs(5), task_b)
        .await
        .unwrap()
        .unwrap();
    emu.shutdown().await;
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct TestError(#[from] WriteError);

impl sluice_runtime::Categorized for TestError {
    fn category(&self) -> sluice_runtime::Category {
        self.0.category()
    }
}

async fn mark_seen(
    obj: std::sync::Arc<Widget>,
    ctx: std::sync::Arc<kube::Client>,
) -> Result<sluice_runtime::Action, TestError> {
    if obj.status.is_none() {
        let api: Api<Widget> = Api::namespaced(ctx.as_ref().clone(), "default");
        write::apply_status(
            &api,
            FieldManager::new("sluice-test"),
            obj.as_ref(),
            &serde_json::json!({"seen": true}),
        )
        .await?;
    }
    Ok(sluice_runtime::Action::await_change())
}

async fn seen_within(api: &Api<Widget>, name: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if api.get(name).await.unwrap().status.is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn create(api: &Api<Widget>, name: &str) {
    let w = Widget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Widget::default()
    };
    api.create(&PostParams::default(), &w).await.unwrap();
}

#[tokio::test]
async fn controller_reconciles_only_while_leading() {
    use sluice_runtime::{operator, server::Readiness};

    let (emu, client, api) = start().await;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let (hooks, registry) = operator::Hooks::standalone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(operator::drive(
        Api::<Widget>::namespaced(client.clone(), "default"),
        kube::runtime::watcher::Config::default(),
        std::sync::Arc::new(client.clone()),
        mark_seen,
        leader::Leadership::from_receiver(rx),
        shutdown.clone(),
        hooks.clone(),
    ));

    // Standby: nothing is reconciled.
    assert!(
        !seen_within(&api, "w", Duration::from_millis(800)).await,
        "a standby must not reconcile"
    );

    // Leading: reconciled, caches synced, leader gauge 1.
    tx.send_replace(true);
    hooks.health.set_leader(true);
    assert!(
        seen_within(&api, "w", Duration::from_secs(10)).await,
        "the leader reconciles"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while hooks.health.readiness() != Readiness::Ready {
        assert!(Instant::now() < deadline, "caches never reported synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sluice_runtime::metrics::encode(&registry).contains("sluice_leader 1"));

    // Lost leadership: the controller stops; new objects wait.
    tx.send_replace(false);
    hooks.health.set_leader(false);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sluice_runtime::metrics::encode(&registry).contains("sluice_leader 0") {
        assert!(
            Instant::now() < deadline,
            "controller did not stop on lost leadership"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    create(&api, "w2").await;
    assert!(
        !seen_within(&api, "w2", Duration::from_millis(800)).await,
        "a deposed leader must not reconcile"
    );

    // Leading again: a fresh controller picks it up.
    tx.send_replace(true);
    assert!(
        seen_within(&api, "w2", Duration::from_secs(10)).await,
        "the re-elected leader reconciles"
    );

    shutdown.cancel();
    timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    emu.shutdown().await;
}
