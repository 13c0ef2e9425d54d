//! revert's Application trigger over a real watch (the API emulator): Applications created and
//! deleted without a finalizer leave nothing remembered, and a deletion wakes the pins that
//! target the deleted Application.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
    runtime::{Controller, controller::Action, watcher},
};
use serde_json::json;
use sluice_api::{external::argocd::Application, v1alpha1::BundlePin};
use sluice_revert::controller::{self, ApplicationTrigger};

const NS: &str = "argocd";

fn application(name: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"project": "default", "destination": {"name": "c1"},
                 "source": {"repoURL": "oci://r/mesh", "targetRevision": "sha256:1"}},
    }))
    .unwrap()
}

async fn wait_for(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn applications_deleted_without_a_finalizer_leave_nothing_remembered() {
    let Some(upstream) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
    else {
        return;
    };
    let emu = sluice_testkit::crds::emulator_with([
        sluice_testkit::crds::sluice_crd("bundlepins.sluice.dev.yaml"),
        upstream.join("argo-cd-v3.5.1/application-crd.yaml"),
    ])
    .await;
    let client = emu.client();
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .expect("namespace");
    let pins: Api<BundlePin> = Api::namespaced(client.clone(), NS);
    let apps: Api<Application> = Api::namespaced(client.clone(), NS);
    pins.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "BundlePin",
            "metadata": {"name": "p", "namespace": NS},
            "spec": {
                "targets": [{"name": "app-0"}],
                "bundle": {"repository": "oci://r/mesh", "digest": format!("sha256:{}", "a".repeat(64))},
                "publicKeysSecretRef": {"name": "cosign"},
                "reason": "r",
            },
        }))
        .unwrap(),
    )
    .await
    .expect("pin created");

    let trigger = Arc::new(ApplicationTrigger::default());
    let reconciles = Arc::new(AtomicUsize::new(0));
    let extend =
        controller::application_trigger(apps.clone(), watcher::Config::default(), trigger.clone());
    let run = extend(Controller::new(pins.clone(), watcher::Config::default()))
        .run(
            |_pin: Arc<BundlePin>, n: Arc<AtomicUsize>| async move {
                n.fetch_add(1, Ordering::SeqCst);
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            reconciles.clone(),
        )
        .for_each(|_| std::future::ready(()));
    let running = tokio::spawn(run);

    const N: usize = 50;
    for i in 0..N {
        apps.create(&PostParams::default(), &application(&format!("app-{i}")))
            .await
            .expect("Application created");
    }
    // Each one is remembered once seen, so its next change that matters to no pin wakes none.
    wait_for("every Application remembered", || trigger.remembered() == N).await;
    wait_for("the pin reconciled", || {
        reconciles.load(Ordering::SeqCst) > 0
    })
    .await;
    let before = reconciles.load(Ordering::SeqCst);

    for i in 0..N {
        apps.delete(&format!("app-{i}"), &DeleteParams::default())
            .await
            .expect("Application deleted");
    }
    wait_for("app-0's deletion to wake its pin", || {
        reconciles.load(Ordering::SeqCst) > before
    })
    .await;
    let started = tokio::time::Instant::now();
    let mut remembered = trigger.remembered();
    while remembered > 0 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        remembered = trigger.remembered();
    }
    assert_eq!(
        remembered, 0,
        "{remembered} of {N} deleted Applications still remembered 5 s after their deletion"
    );
    running.abort();
}
