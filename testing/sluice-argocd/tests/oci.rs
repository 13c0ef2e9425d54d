//! End to end: an Application whose source is a signed OCI bundle (rendered and pushed by
//! sluice-bundle to a real docker-registry) syncs into its destination cluster and reports the
//! bundle's manifest digest as its revision.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use sluice_argocd::ArgoCdOptions;
use sluice_bundle::{BundleClient, ManifestFile, Manifests, Metadata, RegistryOptions, SigningKey};
use sluice_testkit::registry::Registry;

async fn push(client: &BundleClient, repo: &str, tag: &str, value: &str) -> String {
    let manifests = Manifests::from_files(vec![ManifestFile {
        path: "mesh-config.yaml".into(),
        contents: config_map("mesh-config", &[("version", value)], None).into_bytes(),
    }])
    .expect("valid manifests");
    let artifact = sluice_bundle::render(
        &manifests,
        &Metadata {
            source_commit: Some(format!("commit-{value}")),
            ..Default::default()
        },
    )
    .expect("render");
    client
        .push(&artifact, &format!("{repo}:{tag}"))
        .await
        .expect("push")
        .manifest_digest
}

#[tokio::test]
async fn an_application_syncs_a_signed_bundle_and_reports_its_digest() {
    if upstream().is_none() {
        return;
    }
    let registry = match Registry::start().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipping: {e}");
            return;
        }
    };
    let repo = registry.repository("mesh/config");
    let bundles = BundleClient::new(RegistryOptions::default());
    let digest1 = push(&bundles, &repo, "v1", "1").await;
    let key = SigningKey::generate().expect("key");
    bundles
        .sign(&format!("{repo}@{digest1}"), &key)
        .await
        .expect("signed");

    let options = ArgoCdOptions {
        insecure_registries: vec![registry.host()],
        ..fast_options()
    };
    let Some(site) = Site::start(&["east-1"], options).await else {
        return;
    };
    site.create_app(application(
        "bundle",
        &format!("oci://{repo}"),
        &digest1,
        "east-1",
        json!({"automated": {}}),
    ))
    .await;

    // Then the bundle's objects are applied, and the Application is Synced at the manifest digest.
    let app = eventually(
        "Synced at the bundle digest",
        Duration::from_secs(60),
        async || {
            let a = site.app("bundle").await;
            (str_at(&a, "/status/sync/status") == "Synced"
                && str_at(&a, "/status/sync/revision") == digest1)
                .then_some(a)
        },
    )
    .await;
    assert_eq!(str_at(&app, "/status/health/status"), "Healthy");
    assert_eq!(str_at(&app, "/status/operationState/phase"), "Succeeded");
    assert_eq!(
        str_at(&app, "/status/operationState/syncResult/revision"),
        digest1
    );
    assert_eq!(str_at(&app, "/status/history/0/revision"), digest1);
    assert_eq!(str_at(&app, "/status/resources/0/kind"), "ConfigMap");
    let cm = site
        .config_maps("east-1")
        .get("mesh-config")
        .await
        .expect("applied");
    assert_eq!(cm.data.unwrap()["version"], "1");
    assert_eq!(
        cm.metadata.annotations.unwrap()["argocd.argoproj.io/tracking-id"],
        "bundle:/ConfigMap:mesh/mesh-config"
    );

    // When the Application moves to a tag, the tag is resolved and its digest reported.
    let digest2 = push(&bundles, &repo, "v2", "2").await;
    assert_ne!(digest1, digest2);
    site.patch_app(
        "bundle",
        json!({"spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await;
    eventually(
        "Synced at the second digest",
        Duration::from_secs(60),
        async || {
            let a = site.app("bundle").await;
            (str_at(&a, "/status/sync/status") == "Synced"
                && str_at(&a, "/status/sync/revision") == digest2)
                .then_some(())
        },
    )
    .await;
    let cm = site
        .config_maps("east-1")
        .get("mesh-config")
        .await
        .expect("applied");
    assert_eq!(cm.data.unwrap()["version"], "2");
    let history = site
        .app("bundle")
        .await
        .pointer("/status/history")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(history.len(), 2, "one sync per revision: {history:?}");
    site.stop().await;
}
