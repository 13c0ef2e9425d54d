//! Bundles against a real registry (Debian's `docker-registry`, started by the testkit fixture):
//! determinism across pushes, sign and verify by digest, and every refusal a pin relies on.
//! Skips with a printed reason when the registry binary is not installed.

use std::path::Path;

use sluice_bundle::{
    BundleClient, Manifests, Metadata, PublicKey, ReadOptions, RegistryOptions, SigningKey, render,
};
use sluice_testkit::registry::Registry;

const ROUTE: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: checkout
  namespace: shop
spec:
  parentRefs:
  - name: mesh-gateway
  rules:
  - backendRefs:
    - name: checkout-v1
      port: 8080
      weight: 90
    - name: checkout-v2
      port: 8080
      weight: 10
";

const POLICIES: &str = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: checkout-allow
  namespace: shop
spec:
  action: ALLOW
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: checkout
  namespace: shop
spec:
  host: checkout.shop.svc.cluster.local
";

async fn registry() -> Option<Registry> {
    Registry::start_or_skip().await
}

fn write_dir(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

fn manifests(files: &[(&str, &str)]) -> Manifests {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path(), files);
    Manifests::read_dir(dir.path(), &ReadOptions::default())
        .unwrap()
        .0
}

fn meta(commit: &str, created: &str) -> Metadata {
    Metadata {
        source_commit: Some(commit.into()),
        source_url: Some("https://git.example/mesh".into()),
        created: Some(created.parse().unwrap()),
        ..Metadata::default()
    }
}

fn client() -> BundleClient {
    BundleClient::new(RegistryOptions::default())
}

#[tokio::test]
async fn same_manifests_give_the_same_content_digest_whatever_the_annotations() {
    let Some(registry) = registry().await else {
        return;
    };
    let repo = registry.repository("mesh/config");
    let client = client();

    // Same objects, written differently (file split, order, comments), different annotations.
    let one = render(
        &manifests(&[("route.yaml", ROUTE), ("policies.yaml", POLICIES)]),
        &meta("1111111", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    let reshaped = format!("# all in one file\n{POLICIES}---\n{ROUTE}");
    let two = render(
        &manifests(&[("all.yaml", &reshaped)]),
        &meta("2222222", "2026-03-01T12:00:00Z"),
    )
    .unwrap();
    let pushed_one = client.push(&one, &format!("{repo}:one")).await.unwrap();
    let pushed_two = client.push(&two, &format!("{repo}:two")).await.unwrap();
    assert_ne!(pushed_one.manifest_digest, pushed_two.manifest_digest);

    let pulled_one = client.pull(&pushed_one.reference).await.unwrap();
    let pulled_two = client.pull(&pushed_two.reference).await.unwrap();
    assert_eq!(pulled_one.content_digest(), pulled_two.content_digest());
    assert_eq!(pulled_one.content_digest(), one.content_digest());
    assert_eq!(pulled_one.source_commit(), Some("1111111"));
    assert_eq!(pulled_two.source_commit(), Some("2222222"));

    // Equal manifests and equal annotations: the same manifest digest, pushed or not.
    let again = render(
        &manifests(&[("route.yaml", ROUTE), ("policies.yaml", POLICIES)]),
        &meta("1111111", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    assert_eq!(again.manifest_bytes, one.manifest_bytes);
    let pushed_again = client.push(&again, &format!("{repo}:again")).await.unwrap();
    assert_eq!(pushed_again.reference, pushed_one.reference);

    // Tags resolve to the digests pushed.
    assert_eq!(
        client.resolve(&format!("{repo}:two")).await.unwrap(),
        pushed_two.manifest_digest
    );

    // A change of content changes the content digest.
    let changed = render(
        &manifests(&[("route.yaml", &ROUTE.replace("weight: 10", "weight: 11"))]),
        &meta("1111111", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    assert_ne!(changed.content_digest(), one.content_digest());
}

#[tokio::test]
async fn push_sign_verify_and_every_refusal() {
    let Some(registry) = registry().await else {
        return;
    };
    let repo = registry.repository("mesh/config");
    let client = client();
    let signer = SigningKey::generate().unwrap();
    let other = SigningKey::generate().unwrap();
    let trusted = [signer.public_key().clone()];

    let good = render(
        &manifests(&[("route.yaml", ROUTE), ("policies.yaml", POLICIES)]),
        &meta("aaaaaaa", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    let good = client.push(&good, &format!("{repo}:good")).await.unwrap();
    let unsigned = render(
        &manifests(&[("route.yaml", ROUTE)]),
        &meta("bbbbbbb", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    let unsigned = client.push(&unsigned, &repo).await.unwrap();
    assert_eq!(unsigned.tag, None);

    // Sign and verify by digest.
    let signed = client.sign(&good.reference, &signer).await.unwrap();
    assert!(signed.added);
    assert_eq!(signed.signatures, 1);
    assert!(
        signed
            .signature_reference
            .ends_with(&format!(":sha256-{}.sig", &good.manifest_digest[7..])),
        "{}",
        signed.signature_reference
    );
    let verified = client.verify(&good.reference, &trusted).await.unwrap();
    assert_eq!(verified.digest, good.manifest_digest);
    assert_eq!(verified.key_fingerprint, signer.public_key().fingerprint());
    let bundle = client
        .verify_and_pull(&good.reference, &trusted)
        .await
        .unwrap();
    assert_eq!(bundle.objects().len(), 3);
    assert_eq!(bundle.artifact.content_digest(), good.content_digest);

    // Signing again with the same key adds nothing; another key appends a second signature,
    // and any one of several trusted keys suffices.
    let again = client.sign(&good.reference, &signer).await.unwrap();
    assert!(!again.added);
    assert_eq!(again.signatures, 1);
    let second = client.sign(&good.reference, &other).await.unwrap();
    assert!(second.added);
    assert_eq!(second.signatures, 2);
    let only_other = [
        SigningKey::generate().unwrap().public_key().clone(),
        other.public_key().clone(),
    ];
    let verified = client.verify(&good.reference, &only_other).await.unwrap();
    assert_eq!(verified.key_index, 1);
    assert_eq!(
        client
            .verify(&good.reference, &trusted)
            .await
            .unwrap()
            .key_index,
        0
    );

    // Wrong key.
    let stranger = [SigningKey::generate().unwrap().public_key().clone()];
    let err = client.verify(&good.reference, &stranger).await.unwrap_err();
    assert_eq!(err.category(), "WrongKey", "{err}");
    let err = client
        .verify_and_pull(&good.reference, &stranger)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "WrongKey", "{err}");

    // Unsigned.
    let err = client
        .verify(&unsigned.reference, &trusted)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "Unsigned", "{err}");
    assert!(err.to_string().contains(".sig"), "{err}");

    // Verify by tag is refused before any network call.
    let err = client
        .verify(&format!("{repo}:good"), &trusted)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "DigestRequired", "{err}");
    let err = client
        .sign(&format!("{repo}:good"), &signer)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "DigestRequired", "{err}");

    // Tampered: the (valid) signature image of `good` copied onto the unsigned digest's tag.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let sig_tag = |digest: &str| format!("sha256-{}.sig", &digest[7..]);
    let manifest_url = |tag: &str| format!("{}/v2/mesh/config/manifests/{tag}", registry.url());
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let good_sig = http
        .get(manifest_url(&sig_tag(&good.manifest_digest)))
        .header("accept", accept)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let put = http
        .put(manifest_url(&sig_tag(&unsigned.manifest_digest)))
        .header("content-type", accept)
        .body(good_sig.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201, "{}", registry.log());
    let err = client
        .verify(&unsigned.reference, &trusted)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "Tampered", "{err}");
    assert!(err.to_string().contains(&good.manifest_digest), "{err}");
    let err = client
        .verify_and_pull(&unsigned.reference, &trusted)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "Tampered", "{err}");

    // A digest that is not in the registry.
    let absent = format!("{repo}@sha256:{}", "0".repeat(64));
    let err = client.verify(&absent, &trusted).await.unwrap_err();
    assert_eq!(err.category(), "NotFound", "{err}");
    let err = client.sign(&absent, &signer).await.unwrap_err();
    assert_eq!(err.category(), "NotFound", "{err}");

    // Inspect: digests, source commit, kinds, signature count.
    let inspection = client.inspect(&format!("{repo}:good")).await.unwrap();
    assert_eq!(inspection.manifest_digest, good.manifest_digest);
    assert_eq!(inspection.content_digest, good.content_digest);
    assert_eq!(inspection.source_commit.as_deref(), Some("aaaaaaa"));
    assert_eq!(inspection.objects, 3);
    assert_eq!(inspection.signatures, Some(2));
    let kinds: Vec<(&str, usize)> = inspection
        .kinds
        .iter()
        .map(|(k, n)| (k.as_str(), *n))
        .collect();
    assert_eq!(
        kinds,
        [
            ("AuthorizationPolicy.security.istio.io", 1),
            ("DestinationRule.networking.istio.io", 1),
            ("HTTPRoute.gateway.networking.k8s.io", 1),
        ]
    );
    assert_eq!(inspection.files, ["policies.yaml", "route.yaml"]);
}

/// The registry's storage path of a blob (distribution's filesystem driver layout).
fn blob_data(registry: &Registry, digest: &str) -> std::path::PathBuf {
    let hex = &digest["sha256:".len()..];
    registry
        .dir()
        .join("storage/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data")
}

#[tokio::test]
async fn tampered_blobs_are_refused() {
    let Some(registry) = registry().await else {
        return;
    };
    let repo = registry.repository("mesh/config");
    let client = client();
    let signer = SigningKey::generate().unwrap();
    let trusted = [signer.public_key().clone()];

    // A signed bundle whose layer is then swapped on the registry's disk.
    let bundle = render(
        &manifests(&[("route.yaml", ROUTE)]),
        &meta("ccccccc", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    let layer_digest = bundle.manifest.layers[0].digest.clone();
    let pushed = client.push(&bundle, &repo).await.unwrap();
    client.sign(&pushed.reference, &signer).await.unwrap();
    client
        .verify_and_pull(&pushed.reference, &trusted)
        .await
        .unwrap();
    let evil = render(
        &manifests(&[("route.yaml", &ROUTE.replace("weight: 10", "weight: 100"))]),
        &Metadata::default(),
    )
    .unwrap();
    std::fs::write(blob_data(&registry, &layer_digest), &evil.layer).unwrap();
    // The signature on the manifest digest still verifies: the manifest is intact...
    client.verify(&pushed.reference, &trusted).await.unwrap();
    // ...but the content no longer matches the digest the signed manifest names.
    let err = client
        .verify_and_pull(&pushed.reference, &trusted)
        .await
        .unwrap_err();
    assert_eq!(err.category(), "DigestMismatch", "{err}");

    // A signature payload altered on the registry's disk.
    let other = render(
        &manifests(&[("policies.yaml", POLICIES)]),
        &Metadata::default(),
    )
    .unwrap();
    let other = client.push(&other, &repo).await.unwrap();
    client.sign(&other.reference, &signer).await.unwrap();
    client.verify(&other.reference, &trusted).await.unwrap();
    let payload_digest = sluice_bundle::artifact::sha256_digest(
        &sluice_bundle::signature::payload(&repo, &other.manifest_digest),
    );
    let altered =
        sluice_bundle::signature::payload("attacker.example/mesh", &other.manifest_digest);
    std::fs::write(blob_data(&registry, &payload_digest), altered).unwrap();
    // The blob no longer hashes to the digest its descriptor names: refused before any key is
    // tried (an altered payload with a consistent digest is refused as WrongKey, see the
    // signature module's unit tests).
    let err = client.verify(&other.reference, &trusted).await.unwrap_err();
    assert_eq!(err.category(), "DigestMismatch", "{err}");
    assert!(err.to_string().contains(&payload_digest), "{err}");
}

#[tokio::test]
async fn a_stopped_registry_is_reported_as_unavailable() {
    let Some(registry) = registry().await else {
        return;
    };
    let reference = format!(
        "{}@sha256:{}",
        registry.repository("mesh/config"),
        "1".repeat(64)
    );
    drop(registry);
    let key: PublicKey = SigningKey::generate().unwrap().public_key().clone();
    let err = client().verify(&reference, &[key]).await.unwrap_err();
    assert_eq!(err.category(), "RegistryUnavailable", "{err}");
    assert!(err.is_transient());
}

#[tokio::test]
async fn a_bundle_over_the_clients_unpacked_size_limit_is_refused_naming_the_limit() {
    let Some(registry) = registry().await else {
        return;
    };
    let repo = registry.repository("mesh/large");
    let signer = SigningKey::generate().unwrap();
    let trusted = [signer.public_key().clone()];
    // About 10 KB of files that compress to well under 4 KB.
    let padded = format!(
        "{}{ROUTE}",
        "# padding padding padding padding\n".repeat(300)
    );
    let artifact = render(
        &manifests(&[("route.yaml", &padded)]),
        &meta("ccccccc", "2026-01-01T00:00:00Z"),
    )
    .unwrap();
    assert!(
        artifact.layer.len() < 4096,
        "{} bytes",
        artifact.layer.len()
    );
    let pushed = client().push(&artifact, &repo).await.unwrap();
    client().sign(&pushed.reference, &signer).await.unwrap();

    let limited = |bytes| {
        BundleClient::new(RegistryOptions {
            max_unpacked_bytes: Some(bytes),
            ..RegistryOptions::default()
        })
    };
    // The default (64 MiB) and a limit above the files' size read it.
    for c in [client(), limited(16 * 1024)] {
        let bundle = c
            .verify_and_pull(&pushed.reference, &trusted)
            .await
            .unwrap();
        assert_eq!(bundle.objects().len(), 1);
    }
    // A limit below the files' size but above the compressed layer: refused while unpacking.
    let err = limited(4096)
        .verify_and_pull(&pushed.reference, &trusted)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer unpacks to more than 4096 bytes, the unpacked-size limit; split the bundle or raise the limit"),
        "{err}"
    );
    // A limit below even the compressed layer: refused before the layer is downloaded.
    let err = limited(100)
        .verify_and_pull(&pushed.reference, &trusted)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "larger than a bundle may be (layer at most 100 bytes, the unpacked-size limit"
        ),
        "{err}"
    );
}
