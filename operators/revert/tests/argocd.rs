//! End to end with the simulated Argo CD (`sluice-argocd`): a sync of the bad revision is
//! running when the pin arrives and is terminated; Argo CD does not re-apply the bad revision
//! while pinned; the pin releases once Argo CD reports Synced at a revision with the pinned
//! content, and automation is restored exactly. Skips with a printed reason when the upstream
//! CRDs, `docker-registry` or `git` are absent.

mod support;

use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    BundlePinPhase,
    bundle_pin::{conditions, reasons},
};
use sluice_runtime::conditions::find;
use sluice_testkit::eventually::eventually_every;
use support::*;

const BUDGET: Duration = Duration::from_secs(30);

fn in_wave(text: String, wave: u32) -> String {
    text.replacen(
        "metadata:\n",
        &format!("metadata:\n  annotations:\n    argocd.argoproj.io/sync-wave: \"{wave}\"\n"),
        1,
    )
}

async fn policy(w: &World) -> Value {
    let app = w.apps().get(APP).await.unwrap();
    serde_json::to_value(app.spec.sync_policy.unwrap()).unwrap()
}

#[tokio::test]
async fn a_pin_terminates_argo_cds_running_sync_holds_and_releases_when_argo_cd_agrees() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let argocd = sluice_argocd::ArgoCd::start(
        w.mgmt_client.clone(),
        sluice_argocd::ArgoCdOptions {
            insecure_registries: vec![w.registry.host()],
            sync_wave_delay: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .await
    .expect("simulated Argo CD starts");

    // Given the good revision synced by Argo CD.
    let (good, _) = w
        .bundle(&[route("checkout", 10)], "1111111", Some(&w.signer))
        .await;
    w.application(APP, &good.digest, json!({})).await;
    let apps = w.apps();
    let synced_at = |digest: String| {
        let apps = apps.clone();
        async move {
            let a = apps.get(APP).await.ok()?;
            a.is_synced_at(&digest).then_some(())
        }
    };
    eventually_every("Argo CD synced the good revision", BUDGET, POLL, || {
        synced_at(good.digest.clone())
    })
    .await;
    assert_eq!(w.canary_weight("checkout").await, Some(10));

    // When the bad revision arrives: its sync applies wave 0 (checkout at 90), then waits
    // before wave 1 (a new route).
    let (bad, _) = w
        .bundle(
            &[
                in_wave(route("checkout", 90), 0),
                in_wave(route("added-by-bad-change", 50), 1),
            ],
            "2222222",
            Some(&w.signer),
        )
        .await;
    w.apps()
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"targetRevision": bad.digest}}})),
        )
        .await
        .unwrap();
    eventually_every("the bad sync half-way", BUDGET, POLL, || async {
        let a = w.apps().get(APP).await.ok()?;
        let running = a.status?.operation_state?.phase.as_deref() == Some("Running");
        (running && w.canary_weight("checkout").await == Some(90)).then_some(())
    })
    .await;

    // And a human pins the good bundle while that sync runs.
    w.start_revert();
    let started = Instant::now();
    w.create_pin("pin-argo", &good.digest, json!({})).await;
    let pins = w.pins();
    let pinned = eventually_every("Pinned", BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get("pin-argo").await.ok()?;
            (p.status.as_ref()?.phase == BundlePinPhase::Pinned).then_some(p)
        }
    })
    .await;
    println!(
        "pin_ms={} with the simulated Argo CD",
        started.elapsed().as_millis()
    );

    // Then Argo CD's sync was terminated, the good content is live, automation is off.
    let status = pinned.status.unwrap();
    assert!(status.applications[0].sync_terminated);
    let app = w.apps().get(APP).await.unwrap();
    let op = app.status.unwrap().operation_state.unwrap();
    assert_eq!(op.phase.as_deref(), Some("Failed"), "{:?}", op.message);
    assert_eq!(w.canary_weight("checkout").await, Some(10));
    let mut suspended = original_policy();
    suspended["automated"]["enabled"] = json!(false);
    assert_eq!(policy(&w).await, suspended);

    // While pinned, several resyncs later, Argo CD has not re-applied the bad revision: it only
    // reports it OutOfSync.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(w.canary_weight("checkout").await, Some(10));
    assert_eq!(w.canary_weight("added-by-bad-change").await, None);
    let app = w.apps().get(APP).await.unwrap();
    assert!(!app.is_synced_at(&bad.digest));
    assert_eq!(
        w.pins()
            .get("pin-argo")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase,
        BundlePinPhase::Pinned,
        "no release before Argo CD reports the pinned content"
    );

    // When the revert reaches Git, CI renders the same content under a new digest.
    let (same, _) = w
        .bundle(&[route("checkout", 10)], "3333333", Some(&w.signer))
        .await;
    w.apps()
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"targetRevision": same.digest}}})),
        )
        .await
        .unwrap();
    let released = eventually_every("Released", BUDGET, POLL, || {
        let pins = pins.clone();
        async move {
            let p = pins.get("pin-argo").await.ok()?;
            (p.status.as_ref()?.phase == BundlePinPhase::Released).then_some(p)
        }
    })
    .await;
    let rc = find(&released.status.unwrap().conditions, conditions::RELEASED)
        .unwrap()
        .clone();
    assert_eq!(rc.reason, reasons::CONTENT_MATCHED);
    assert_eq!(policy(&w).await, original_policy(), "restored exactly");
    assert!(
        !w.managers("checkout")
            .await
            .contains(&"sluice-revert".to_owned())
    );
    eventually_every("Argo CD Synced at the new revision", BUDGET, POLL, || {
        synced_at(same.digest.clone())
    })
    .await;
    assert_eq!(w.canary_weight("checkout").await, Some(10));
    drop(argocd);
}
