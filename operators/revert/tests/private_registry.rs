//! A pin from a private registry (docker-registry over HTTPS from the fixture's CA, htpasswd
//! basic auth): revert reads its credentials from the Docker config Secret named by
//! `--registry-credentials-secret` and trusts the CA in the ConfigMap named by
//! `--registry-ca-configmap`. With a wrong password in the
//! Secret the pin waits (`Verified=False BundleUnavailable`, the message naming the registry and
//! "unauthorized", nothing applied); once the Secret holds the right password (a new
//! resourceVersion) the pin reaches Pinned with no restart. Each step has a time budget.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use sluice_api::v1alpha1::{
    BundlePinPhase,
    bundle_pin::{conditions, reasons},
};
use sluice_runtime::conditions::find;
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::registry::{Auth, PASSWORD};
use support::*;

/// Per-step budget: a retry of an unavailable bundle comes within 10 s; the rest is the
/// ordinary pin on a loaded 2-core machine.
const BUDGET: Duration = Duration::from_secs(60);

async fn set_password(w: &World, password: &str) {
    let secrets: Api<Secret> = Api::namespaced(w.mgmt_client.clone(), SYSTEM);
    // `data` is base64, as ByteString serializes it.
    let encoded = serde_json::to_value(k8s_openapi::ByteString(
        docker_config(&w.registry, password).into_bytes(),
    ))
    .unwrap();
    secrets
        .patch(
            REGISTRY_SECRET,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {".dockerconfigjson": encoded}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pin_from_a_private_registry_follows_its_credentials_secret() {
    let Some(mut w) = World::start_private(Auth::Htpasswd).await else {
        return;
    };
    // Argo CD runs the good bundle, then a bad one.
    let (good, _) = w
        .bundle(&[route("checkout", 10)], "1111111", Some(&w.signer))
        .await;
    let (bad, _) = w
        .bundle(&[route("checkout", 90)], "2222222", Some(&w.signer))
        .await;
    w.application(APP, &good.digest, json!({})).await;
    w.argo(APP);
    let apps = w.apps();
    for digest in [&good.digest, &bad.digest] {
        if *digest == bad.digest {
            apps.patch(
                APP,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"source": {"targetRevision": digest}}})),
            )
            .await
            .unwrap();
        }
        let digest = digest.clone();
        eventually_every("Argo CD synced the revision", BUDGET, POLL, || {
            let apps = apps.clone();
            let digest = digest.clone();
            async move {
                apps.get(APP)
                    .await
                    .ok()?
                    .is_synced_at(&digest)
                    .then_some(())
            }
        })
        .await;
    }
    assert_eq!(w.canary_weight("checkout").await, Some(90));

    // The Secret holds a wrong password when the pin arrives.
    set_password(&w, "wrong-password").await;
    w.start_revert();
    w.create_pin("pin-private", &good.digest, json!({})).await;
    let pins = w.pins();
    let host = w.registry.host();
    let refused = eventually_every(
        "the pin reports the refused credentials",
        BUDGET,
        POLL,
        || {
            let pins = pins.clone();
            let host = host.clone();
            async move {
                let pin = pins.get("pin-private").await.ok()?;
                let status = pin.status?;
                let verified = find(&status.conditions, conditions::VERIFIED)?.clone();
                (verified.reason == reasons::BUNDLE_UNAVAILABLE
                    && verified
                        .message
                        .contains(&format!("registry {host} answered unauthorized")))
                .then_some((status.phase, verified.message))
            }
        },
    )
    .await;
    assert_eq!(refused.0, BundlePinPhase::Verifying, "{}", refused.1);
    assert!(!refused.1.contains("wrong-password"), "{}", refused.1);
    assert_eq!(
        w.canary_weight("checkout").await,
        Some(90),
        "nothing applied"
    );

    // The platform fixes the Secret: the next attempt uses it, no restart.
    set_password(&w, PASSWORD).await;
    eventually_every(
        "the pin is Pinned with the new credentials",
        BUDGET,
        POLL,
        || {
            let pins = pins.clone();
            async move {
                let pin = pins.get("pin-private").await.ok()?;
                (pin.status?.phase == BundlePinPhase::Pinned).then_some(())
            }
        },
    )
    .await;
    assert_eq!(w.canary_weight("checkout").await, Some(10));
}
