//! What the registry tests share: a one-route bundle, a client of the test kit's HTTPS registry,
//! and the whole path a bundle takes (push, sign, verify and pull).

#![allow(dead_code)]

use sluice_bundle::{
    BundleClient, CaBundle, Manifests, Metadata, ReadOptions, RegistryCredentials, RegistryOptions,
    SigningKey, render,
};
use sluice_testkit::registry::Registry;

/// The bundle's one object.
pub const ROUTE: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: checkout
  namespace: shop
spec:
  parentRefs:
  - name: mesh-gateway
";

/// A bundle of [`ROUTE`].
pub fn bundle() -> sluice_bundle::Artifact {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("route.yaml"), ROUTE).unwrap();
    let (manifests, _) = Manifests::read_dir(dir.path(), &ReadOptions::default()).unwrap();
    render(&manifests, &Metadata::default()).unwrap()
}

/// A client of `registry` over TLS with `credentials`, trusting the registry's CA when `trust`.
pub fn client(registry: &Registry, credentials: RegistryCredentials, trust: bool) -> BundleClient {
    BundleClient::new(RegistryOptions {
        tls_hosts: vec![registry.host()],
        credentials,
        ca_bundle: trust
            .then(|| CaBundle::from_pem(registry.ca_pem().unwrap().as_bytes(), "test CA").unwrap()),
        ..RegistryOptions::default()
    })
}

/// Push, sign, verify and pull with `credentials`: the whole path a bundle takes. Returns the
/// client and the pushed reference.
pub async fn round_trip(
    registry: &Registry,
    credentials: RegistryCredentials,
) -> (BundleClient, String) {
    let client = client(registry, credentials, true);
    let artifact = bundle();
    let pushed = client
        .push(
            &artifact,
            &format!("{}:v1", registry.repository("mesh/config")),
        )
        .await
        .unwrap_or_else(|e| panic!("push: {e}\n{}", registry.log()));
    let key = SigningKey::generate().unwrap();
    client.sign(&pushed.reference, &key).await.unwrap();
    let verified = client
        .verify_and_pull(&pushed.reference, std::slice::from_ref(key.public_key()))
        .await
        .unwrap();
    assert_eq!(
        verified.artifact.content_digest(),
        artifact.content_digest()
    );
    (client, pushed.reference)
}
