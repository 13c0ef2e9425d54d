//! End to end: a pin never strands Argo CD's automation. revert's identity must work in the
//! destination before anything is suspended; a pin that cannot apply within its deadline gives
//! automation back; deleting a Failed pin that holds a suspended Application gives it back; a
//! pin whose key was rotated out releases all the same; a second pin on a held Application is
//! refused, naming the first. On the emulators with the real registry and git and the stand-in
//! Argo CD of `support`.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{Patch, PatchParams},
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

const BUDGET: Duration = Duration::from_secs(60);

async fn policy(w: &World) -> Value {
    let app = w.apps().get(APP).await.unwrap();
    serde_json::to_value(app.spec.sync_policy.unwrap()).unwrap()
}

fn suspended() -> Value {
    let mut p = original_policy();
    p["automated"]["enabled"] = json!(false);
    p
}

/// Given the bad change (checkout at 90) synced by the stand-in Argo CD; returns the good digest.
async fn given_bad_change(w: &World) -> String {
    let (good, _) = w
        .bundle(&[route("checkout", 10)], "1111111", Some(&w.signer))
        .await;
    let (bad, _) = w
        .bundle(&[route("checkout", 90)], "2222222", Some(&w.signer))
        .await;
    w.application(APP, &good.digest, json!({})).await;
    w.argo(APP);
    let apps = w.apps();
    eventually_every("Argo CD synced the good revision", BUDGET, POLL, || {
        let apps = apps.clone();
        let good = good.digest.clone();
        async move { apps.get(APP).await.ok()?.is_synced_at(&good).then_some(()) }
    })
    .await;
    apps.patch(
        APP,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"source": {"targetRevision": bad.digest}}})),
    )
    .await
    .unwrap();
    eventually_every("Argo CD synced the bad change", BUDGET, POLL, || {
        let apps = apps.clone();
        let bad = bad.digest.clone();
        async move { apps.get(APP).await.ok()?.is_synced_at(&bad).then_some(()) }
    })
    .await;
    good.digest
}

async fn until<F: Fn(&BundlePin) -> bool>(w: &World, name: &str, what: &str, f: F) -> BundlePin {
    let pins = w.pins();
    let f = &f;
    eventually_every(what, BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get(name).await.ok()?;
            f(&p).then_some(p)
        }
    })
    .await
}

fn phase(p: &BundlePin) -> BundlePinPhase {
    p.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn reason(p: &BundlePin, type_: &str) -> Option<String> {
    find(&p.status.as_ref()?.conditions, type_).map(|c| c.reason.clone())
}

fn holds_finalizer(p: &BundlePin) -> bool {
    p.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == sluice_revert::FINALIZER))
}

async fn identity(w: &World) -> Api<Secret> {
    Api::namespaced(w.mgmt_client.clone(), SYSTEM)
}

#[tokio::test]
async fn no_identity_in_the_destination_suspends_nothing_and_the_deadline_ends_the_pin() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let good = given_bad_change(&w).await;
    // revert's identity for the workload cluster is gone.
    let secrets = identity(&w).await;
    let saved = secrets.get("revert-c1").await.unwrap();
    secrets
        .delete("revert-c1", &Default::default())
        .await
        .unwrap();
    w.start_revert();
    w.create_pin("pin-a", &good, json!({"pinDeadlineSeconds": 10}))
        .await;

    // The preflight fails: nothing is suspended, the pin says why.
    let p = until(&w, "pin-a", "Pinned=False PreflightFailed", |p| {
        reason(p, conditions::PINNED).as_deref() == Some(reasons::PREFLIGHT_FAILED)
    })
    .await;
    assert_eq!(phase(&p), BundlePinPhase::Pinning);
    assert_eq!(policy(&w).await, original_policy(), "automation untouched");
    assert_eq!(w.canary_weight("checkout").await, Some(90));

    // Past the deadline the pin ends, holding nothing, and can go: a pin holding nothing keeps
    // no finalizer (removed right after the Failed status is written, so waited for too).
    let p = until(
        &w,
        "pin-a",
        "Failed DeadlineExceeded, without finalizer",
        |p| phase(p) == BundlePinPhase::Failed && !holds_finalizer(p),
    )
    .await;
    assert_eq!(
        reason(&p, conditions::PINNED).as_deref(),
        Some(reasons::DEADLINE_EXCEEDED)
    );
    assert_eq!(policy(&w).await, original_policy());

    // With the identity back, a new pin goes through.
    let mut restored = saved.clone();
    restored.metadata.resource_version = None;
    restored.metadata.uid = None;
    restored.metadata.creation_timestamp = None;
    restored.metadata.managed_fields = None;
    secrets
        .create(&Default::default(), &restored)
        .await
        .unwrap();
    w.create_pin("pin-b", &good, json!({})).await;
    until(&w, "pin-b", "Pinned", |p| {
        phase(p) == BundlePinPhase::Pinned
    })
    .await;
    assert_eq!(w.canary_weight("checkout").await, Some(10));
}

#[tokio::test]
async fn deleting_a_failed_pin_that_holds_an_application_gives_automation_back() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let good = given_bad_change(&w).await;
    // Argo CD's controller is busy with a sync that does not end while the pin arrives.
    w.argo_stop.cancel();
    w.apps()
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"operationState": {"phase": "Running", "startedAt": "2026-01-01T00:00:00Z", "operation": {"sync": {"revision": "x"}}}}})),
        )
        .await
        .unwrap();
    w.start_revert();
    w.create_pin("pin-f", &good, json!({})).await;
    let pins = w.pins();
    eventually_every("automation suspended", BUDGET, POLL, || async {
        (policy(&w).await == suspended()).then_some(())
    })
    .await;
    // The signing key is rotated out while the pin waits: verification fails, the pin Fails
    // holding the suspended Application.
    let other = SigningKey::generate().unwrap();
    let keys: Api<Secret> = Api::namespaced(w.mgmt_client.clone(), ARGOCD);
    keys.patch(
        "cosign",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::to_value(secret(
                "cosign",
                &[],
                &[("cosign.pub", other.public_key().pem())],
            ))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    let failed = until(&w, "pin-f", "Failed", |p| {
        phase(p) == BundlePinPhase::Failed
    })
    .await;
    assert!(
        holds_finalizer(&failed),
        "a Failed pin holding an Application keeps its finalizer"
    );
    assert_eq!(policy(&w).await, suspended());

    // Deleting it (the documented remedy) gives automation back before it goes.
    pins.delete("pin-f", &Default::default()).await.unwrap();
    eventually_every("the deleted pin to go", BUDGET, POLL, || {
        let pins = pins.clone();
        async move { pins.get_opt("pin-f").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert_eq!(policy(&w).await, original_policy(), "restored exactly");
}

#[tokio::test]
async fn a_pinned_pin_whose_key_was_rotated_out_releases_and_a_second_pin_is_refused() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let good = given_bad_change(&w).await;
    w.start_revert();
    w.create_pin("pin-1", &good, json!({"releasePolicy": "Explicit"}))
        .await;
    until(&w, "pin-1", "Pinned", |p| {
        phase(p) == BundlePinPhase::Pinned
    })
    .await;
    assert!(
        w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned())
    );

    // The on-call pins the same Application again: refused, naming the first pin.
    w.create_pin("pin-2", &good, json!({})).await;
    let second = until(&w, "pin-2", "Refused", |p| {
        phase(p) == BundlePinPhase::Refused
    })
    .await;
    let c = find(&second.status.unwrap().conditions, conditions::VERIFIED)
        .unwrap()
        .clone();
    assert_eq!(c.reason, reasons::TARGET_ALREADY_PINNED);
    assert!(c.message.contains("pin-1"), "{}", c.message);
    assert_eq!(
        policy(&w).await,
        suspended(),
        "the first pin still holds it"
    );

    // The key is rotated out; the pin still releases (and drops its ownership) without it.
    let other = SigningKey::generate().unwrap();
    let keys: Api<Secret> = Api::namespaced(w.mgmt_client.clone(), ARGOCD);
    keys.patch(
        "cosign",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::to_value(secret(
                "cosign",
                &[],
                &[("cosign.pub", other.public_key().pem())],
            ))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    w.pins()
        .patch(
            "pin-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": true, "releaseReason": "incident over"}})),
        )
        .await
        .unwrap();
    until(&w, "pin-1", "Released", |p| {
        phase(p) == BundlePinPhase::Released
    })
    .await;
    assert_eq!(policy(&w).await, original_policy(), "restored exactly");
    assert!(
        !w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned()),
        "ownership dropped without the bundle"
    );
}

#[tokio::test]
async fn a_revert_that_conflicts_in_git_is_reported_once_and_not_tried_again() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let good = given_bad_change(&w).await;
    // In Git: the bad change, then a later change of the same lines, so its revert conflicts.
    w.git
        .commit_files(&[("mesh/checkout.yaml", &route("checkout", 10))], "good")
        .unwrap();
    let bad_commit = w
        .git
        .commit_files(&[("mesh/checkout.yaml", &route("checkout", 90))], "bad")
        .unwrap();
    w.git
        .commit_files(&[("mesh/checkout.yaml", &route("checkout", 70))], "later")
        .unwrap();
    w.start_revert();
    w.create_pin(
        "pin-g",
        &good,
        json!({"gitRevert": {"commit": bad_commit, "pullRequest": false}}),
    )
    .await;
    let p = until(&w, "pin-g", "the git revert recorded", |p| {
        p.status.as_ref().is_some_and(|s| s.git_revert.is_some())
    })
    .await;
    let git = p.status.as_ref().unwrap().git_revert.clone().unwrap();
    assert!(git.branch.is_none(), "{git:?}");
    assert!(git.failure.is_some(), "{git:?}");
    assert_eq!(
        (
            git.failure_reason.as_deref(),
            git.retryable,
            git.failed_attempts
        ),
        (Some("RevertConflict"), false, 1),
        "{git:?}"
    );
    let c = find(&p.status.unwrap().conditions, conditions::GIT_REVERT)
        .unwrap()
        .clone();
    assert_eq!(c.reason, reasons::GIT_REVERT_NOT_POSSIBLE);
    assert!(
        c.message.contains("mesh/checkout.yaml")
            && c.message.contains("not tried again until the spec changes")
            && c.message.contains("by hand"),
        "{}",
        c.message
    );
    assert_eq!(
        phase(&w.pins().get("pin-g").await.unwrap()),
        BundlePinPhase::Pinned
    );
    assert_eq!(w.git.branches().unwrap(), vec!["main".to_owned()]);
}

#[tokio::test]
async fn a_bundle_holding_a_cluster_scoped_object_is_refused_naming_it_and_suspends_nothing() {
    let Some(mut w) = World::start().await else {
        return;
    };
    given_bad_change(&w).await;
    // The platform lets pins hold Namespaces, but a Namespace is cluster-scoped: shared by every
    // Application, outside any destination namespace.
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop-extra\n".to_owned();
    let (with_namespace, _) = w
        .bundle(
            &[route("checkout", 10), namespace],
            "3333333",
            Some(&w.signer),
        )
        .await;
    let mut platform = sluice_api::v1alpha1::BundlePinSpec::default_allowed_kinds();
    platform.push(sluice_api::v1alpha1::bundle_pin::GroupKind {
        group: String::new(),
        kind: "Namespace".into(),
    });
    w.platform_kinds = Some(platform);
    w.start_revert();
    w.create_pin(
        "pin-a",
        &with_namespace.digest,
        json!({
            "allowAnyRevision": true,
            "pinDeadlineSeconds": 10,
            "allowedKinds": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
                {"group": "", "kind": "Namespace"},
            ],
        }),
    )
    .await;
    let p = until(&w, "pin-a", "Pinned=False PreflightFailed", |p| {
        reason(p, conditions::PINNED).as_deref() == Some(reasons::PREFLIGHT_FAILED)
    })
    .await;
    let message = find(&p.status.as_ref().unwrap().conditions, conditions::PINNED)
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains(
            "Namespace shop-extra: kind /v1/Namespace is cluster-scoped in destination c1; a pin applies and prunes namespaced objects only"
        ),
        "{message}"
    );
    assert_eq!(policy(&w).await, original_policy(), "automation untouched");
    assert_eq!(
        w.canary_weight("checkout").await,
        Some(90),
        "nothing applied"
    );
    let p = until(&w, "pin-a", "Failed at its deadline", |p| {
        phase(p) == BundlePinPhase::Failed
    })
    .await;
    assert_eq!(
        reason(&p, conditions::PINNED).as_deref(),
        Some(reasons::DEADLINE_EXCEEDED)
    );
    assert_eq!(policy(&w).await, original_policy());
}

/// An Application outside the namespace revert may patch Applications in (its `--namespace`,
/// where the chart grants its Role) is refused before anything is read or touched, naming the
/// target, instead of retrying forbidden requests forever.
#[tokio::test]
async fn a_target_outside_reverts_namespace_is_refused_and_nothing_is_touched() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let good = given_bad_change(&w).await;
    w.application_namespace = Some(ARGOCD.into());
    w.start_revert();
    w.create_pin(
        "pin-elsewhere",
        &good,
        json!({"targets": [{"name": APP}, {"name": "mesh-team", "namespace": "team-a"}]}),
    )
    .await;
    let p = until(&w, "pin-elsewhere", "Ready=False InvalidSpec", |p| {
        reason(p, conditions::READY).as_deref() == Some(reasons::INVALID_SPEC)
    })
    .await;
    assert_eq!(phase(&p), BundlePinPhase::Refused);
    let message = &find(&p.status.as_ref().unwrap().conditions, conditions::READY)
        .unwrap()
        .message;
    assert!(
        message.contains(
            "spec.targets[1].namespace: revert may patch Applications only in namespace argocd (where its Role is granted); team-a/mesh-team is out of its reach"
        ),
        "{message}"
    );
    assert!(!message.contains("spec.targets[0]"), "{message}");
    assert_eq!(policy(&w).await, original_policy(), "automation untouched");
    assert_eq!(
        w.canary_weight("checkout").await,
        Some(90),
        "nothing applied"
    );
}

/// A plain-HTTP proxy to an API server that forwards reads and server-side dry-runs but holds
/// every other write unanswered (a destination that hangs on writes).
struct HoldingProxy {
    url: String,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl HoldingProxy {
    async fn start(upstream: String) -> Self {
        use std::sync::{Arc, atomic::AtomicUsize, atomic::Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = Arc::new(AtomicUsize::new(0));
        let counter = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, mut to_server) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        let line = chunk.split(|b| *b == b'\n').next().unwrap_or_default();
                        let line = String::from_utf8_lossy(line);
                        let write = ["PATCH ", "PUT ", "POST ", "DELETE "]
                            .iter()
                            .any(|m| line.starts_with(m));
                        if write && !line.contains("dryRun=") {
                            // Held: never forwarded, never answered, until the client gives up.
                            counter.fetch_add(1, Ordering::SeqCst);
                            let mut sink = vec![0u8; 64 * 1024];
                            while matches!(from_client.read(&mut sink).await, Ok(n) if n > 0) {}
                            return;
                        }
                        if to_server.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { url, held }
    }

    fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn an_apply_that_hangs_ends_by_the_pin_deadline_and_gives_automation_back() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let good = given_bad_change(&w).await;
    // revert reaches the workload cluster through a proxy that answers its dry-runs (so the
    // preflight passes and the Application is suspended) but never answers a real write.
    let proxy = HoldingProxy::start(w.workload.base_url()).await;
    let secrets = identity(&w).await;
    let mut own = secrets.get("revert-c1").await.unwrap();
    own.data.get_or_insert_default().insert(
        "server".into(),
        k8s_openapi::ByteString(proxy.url.clone().into_bytes()),
    );
    secrets
        .replace("revert-c1", &Default::default(), &own)
        .await
        .unwrap();
    w.start_revert();
    w.create_pin("pin-a", &good, json!({"pinDeadlineSeconds": 10}))
        .await;

    let p = until(&w, "pin-a", "Failed DeadlineExceeded", |p| {
        phase(p) == BundlePinPhase::Failed
    })
    .await;
    let ended = jiff::Timestamp::now();
    let verified = p.status.as_ref().unwrap().verified_at.as_ref().unwrap().0;
    assert_eq!(
        reason(&p, conditions::PINNED).as_deref(),
        Some(reasons::DEADLINE_EXCEEDED)
    );
    assert!(proxy.held() > 0, "the apply reached the destination");
    // One request alone may hang for the 15 s read timeout: the whole apply is bounded by the
    // 10 s left before the deadline instead, so automation is back on time.
    let took = ended.duration_since(verified).as_secs_f64();
    assert!(
        took < 14.0,
        "automation came back {took:.1} s after verification; the deadline is 10 s"
    );
    assert_eq!(policy(&w).await, original_policy());
}
