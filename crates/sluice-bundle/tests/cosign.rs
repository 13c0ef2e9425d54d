//! Interop with the real `cosign` CLI (built from its Go module by
//! `scripts/install-control-plane.sh`) against the local registry: bundles signed by cosign in its
//! current default format (a sigstore bundle attached as an OCI referrer; Debian's
//! `docker-registry` has no referrers API, so cosign writes the referrers tag `sha256-<hex>`) and
//! in the legacy `.sig` tag verify, also through a registry that serves the OCI referrers API
//! (`sluice_testkit::referrers_api`, in front of the local registry); a tampered, copied or foreign-key signature is refused with
//! a message that says so. Keyless bundles are judged against a trust root made per test
//! (`sluice_testkit::sigstore`: a CA in Fulcio's role, a key in Rekor's), since nothing can reach
//! a public sigstore instance.

use std::path::Path;
use std::process::Command;

use base64::Engine;
use sluice_bundle::signature::{Policy, verdict};
use sluice_bundle::sigstore_bundle::StoredBundle;
use sluice_bundle::{
    BundleClient, Identity, Keyless, Manifests, Matcher, Metadata, PublicKey, ReadOptions,
    RegistryOptions, TrustedRoot, render,
};
use sluice_testkit::prereq;
use sluice_testkit::referrers_api::ReferrersApi;
use sluice_testkit::registry::Registry;
use sluice_testkit::sigstore::Sigstore;

const PASSWORD: &str = "interop-password";

fn route(weight: u32) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: checkout\n  namespace: shop\nspec:\n  rules:\n  - backendRefs:\n    - name: checkout-v2\n      port: 8080\n      weight: {weight}\n"
    )
}

async fn push(client: &BundleClient, host: &str, weight: u32) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("route.yaml"), route(weight)).unwrap();
    let (manifests, _) = Manifests::read_dir(dir.path(), &ReadOptions::default()).unwrap();
    let artifact = render(&manifests, &Metadata::default()).unwrap();
    client
        .push(&artifact, &format!("{host}/mesh/cosign:w{weight}"))
        .await
        .unwrap()
        .reference
}

fn cosign(bin: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        .env("COSIGN_YES", "true")
        .env("HOME", dir)
        .env("TUF_ROOT", dir.join("tuf"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "cosign {args:?} failed:\n{text}");
    text
}

/// A key pair made by `cosign generate-key-pair` in `dir` (cosign.key, cosign.pub).
fn cosign_key(bin: &Path, dir: &Path) -> PublicKey {
    cosign(bin, dir, &["generate-key-pair"]);
    PublicKey::from_file(&dir.join("cosign.pub")).unwrap()
}

#[tokio::test]
async fn bundles_signed_by_real_cosign_verify_and_tampered_ones_do_not() {
    let Some(bin) = prereq::or_skip(prereq::cosign()) else {
        return;
    };
    let Some(registry) = Registry::start_or_skip().await else {
        return;
    };
    let host = registry.host();
    let client = BundleClient::new(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let key = cosign_key(&bin, work.path());
    let other_dir = tempfile::tempdir().unwrap();
    let other = cosign_key(&bin, other_dir.path());

    // cosign's default (v3): a sigstore bundle as a referrer; key-based, no transparency log.
    let signed = push(&client, &host, 10).await;
    cosign(
        &bin,
        work.path(),
        &[
            "sign",
            "--key",
            "cosign.key",
            "--tlog-upload=false",
            "--use-signing-config=false",
            "--new-bundle-format=true",
            "--allow-http-registry",
            "--bundle",
            "sig.json",
            &signed,
        ],
    );
    let verified = client
        .verify(&signed, std::slice::from_ref(&key))
        .await
        .unwrap();
    assert_eq!(verified.format, "sigstore-bundle");
    assert_eq!(verified.key_fingerprint, key.fingerprint());
    let pulled = client
        .verify_and_pull(&signed, &[other.clone(), key.clone()])
        .await
        .unwrap();
    assert_eq!(pulled.verified.key_index, 1);

    // Through a registry that serves the OCI referrers API (and hides the referrers tag), the
    // same signature is found by the API alone.
    let front = ReferrersApi::start(&registry.url()).await.unwrap();
    let through_front = signed.replacen(&host, &front.host(), 1);
    let verified = client
        .verify(&through_front, std::slice::from_ref(&key))
        .await
        .unwrap();
    assert_eq!(verified.format, "sigstore-bundle");
    assert!(
        front.referrers_calls() >= 1,
        "the referrers API was asked: {:?}",
        front.requests()
    );
    assert_eq!(
        front.referrers_tag_reads(),
        0,
        "a registry with the API is not asked for the referrers tag: {:?}",
        front.requests()
    );

    // The other key: refused, naming the key tried.
    let err = client
        .verify(&signed, std::slice::from_ref(&other))
        .await
        .unwrap_err();
    assert_eq!(err.category(), "WrongKey", "{err}");
    assert!(
        err.to_string().contains(&format!(
            "verifies with the given public key(s) [{}]",
            other.fingerprint()
        )),
        "{err}"
    );

    // An unsigned digest next to it reads as unsigned, naming both places looked at.
    let unsigned = push(&client, &host, 20).await;
    let err = client
        .verify(&unsigned, std::slice::from_ref(&key))
        .await
        .unwrap_err();
    assert_eq!(err.category(), "Unsigned", "{err}");
    assert!(
        err.to_string().contains("nor among its OCI referrers"),
        "{err}"
    );
    // And through the referrers API, whose empty index says the same.
    let err = client
        .verify(
            &unsigned.replacen(&host, &front.host(), 1),
            std::slice::from_ref(&key),
        )
        .await
        .unwrap_err();
    assert_eq!(err.category(), "Unsigned", "{err}");
    assert!(
        err.to_string().contains("nor among its OCI referrers"),
        "{err}"
    );

    // cosign's bundle bytes, judged for another digest (a copied signature): tampered.
    let bundle_bytes = std::fs::read(work.path().join("sig.json")).unwrap();
    let stored = |bytes: Vec<u8>| StoredBundle {
        bytes,
        referrer: "sha256:referrer".into(),
    };
    let unsigned_digest = unsigned.split('@').nth(1).unwrap();
    let signed_digest = signed.split('@').nth(1).unwrap();
    let err = verdict(
        unsigned_digest,
        &[],
        &[stored(bundle_bytes.clone())],
        &Policy::keys(std::slice::from_ref(&key)),
        &unsigned,
        "t",
    )
    .unwrap_err();
    assert_eq!(err.category(), "Tampered", "{err}");
    assert!(
        err.to_string().contains(&format!("signs {signed_digest}")),
        "{err}"
    );

    // cosign's bundle with its statement swapped for one naming the other digest: no key
    // verifies it any more.
    let mut altered: serde_json::Value = serde_json::from_slice(&bundle_bytes).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = b64
        .decode(altered["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let swapped = String::from_utf8(payload).unwrap().replace(
        signed_digest.trim_start_matches("sha256:"),
        unsigned_digest.trim_start_matches("sha256:"),
    );
    altered["dsseEnvelope"]["payload"] = b64.encode(swapped).into();
    let err = verdict(
        unsigned_digest,
        &[],
        &[stored(serde_json::to_vec(&altered).unwrap())],
        &Policy::keys(std::slice::from_ref(&key)),
        &unsigned,
        "t",
    )
    .unwrap_err();
    assert_eq!(err.category(), "WrongKey", "{err}");
    assert!(err.to_string().contains("payload was altered"), "{err}");

    // The legacy `.sig` tag, signed by the same cosign.
    let legacy = push(&client, &host, 30).await;
    cosign(
        &bin,
        work.path(),
        &[
            "sign",
            "--key",
            "cosign.key",
            "--tlog-upload=false",
            "--use-signing-config=false",
            "--new-bundle-format=false",
            "--allow-http-registry",
            &legacy,
        ],
    );
    let verified = client
        .verify(&legacy, std::slice::from_ref(&key))
        .await
        .unwrap();
    assert_eq!(verified.format, "legacy-tag");

    // L1: with the repository bound, a legacy signature made for another repository is refused.
    let repository = legacy.split('@').next().unwrap().to_string();
    let bound = Policy {
        repository: Some(repository.clone()),
        ..Policy::keys(std::slice::from_ref(&key))
    };
    client.verify_with(&legacy, &bound).await.unwrap();
    let elsewhere = Policy {
        repository: Some(format!("{host}/mesh/elsewhere")),
        ..Policy::keys(std::slice::from_ref(&key))
    };
    let err = client.verify_with(&legacy, &elsewhere).await.unwrap_err();
    assert_eq!(err.category(), "UntrustedSignature", "{err}");
    assert!(
        err.to_string()
            .contains(&format!("was made for repository {repository:?}")),
        "{err}"
    );
}

// --- keyless against a synthetic trust root ---------------------------------------------------

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const ISSUER: &str = "https://token.actions.githubusercontent.com";
const SUBJECT: &str = "https://github.com/acme/mesh/.github/workflows/sign.yml@refs/heads/main";

/// The trusted root of `sigstore`, as a file would give it.
fn root(sigstore: &Sigstore) -> TrustedRoot {
    TrustedRoot::from_json(&sigstore.trusted_root_json(), "test").unwrap()
}

fn keyless_policy(root: TrustedRoot, subject: Matcher, issuer: Matcher) -> Policy {
    Policy {
        keyless: Some(Keyless {
            trusted_root: root,
            identities: vec![Identity { subject, issuer }],
        }),
        ..Policy::default()
    }
}

fn judge(bytes: Vec<u8>, policy: &Policy) -> sluice_bundle::Result<sluice_bundle::Verified> {
    verdict(
        D1,
        &[],
        &[StoredBundle {
            bytes,
            referrer: "sha256:r".into(),
        }],
        policy,
        "registry.example/mesh@d1",
        "t",
    )
}

#[test]
fn keyless_bundles_verify_only_for_the_named_identity_under_the_trusted_root() {
    let sigstore = Sigstore::new().unwrap();
    let now = jiff::Timestamp::now().as_second();
    let signer = sigstore.certificate(SUBJECT, ISSUER).unwrap();
    let good = sigstore.bundle(D1, &signer, now).unwrap();
    let exact = keyless_policy(
        root(&sigstore),
        Matcher::Exact(SUBJECT.into()),
        Matcher::Exact(ISSUER.into()),
    );
    let verified = judge(good.clone(), &exact).unwrap();
    assert_eq!(
        verified.key_fingerprint,
        format!("keyless:{SUBJECT} ({ISSUER})")
    );
    assert_eq!(verified.format, "sigstore-bundle");
    let by_regex = keyless_policy(
        root(&sigstore),
        Matcher::regex(r"https://github\.com/acme/.+", "subjectRegExp").unwrap(),
        Matcher::Exact(ISSUER.into()),
    );
    judge(good.clone(), &by_regex).unwrap();

    // Another identity, another issuer, a regex that only matches a substring.
    for (policy, want) in [
        (
            keyless_policy(
                root(&sigstore),
                Matcher::Exact(
                    "https://github.com/acme/other/.github/workflows/x.yml@refs/heads/main".into(),
                ),
                Matcher::Exact(ISSUER.into()),
            ),
            "is not one the pin names",
        ),
        (
            keyless_policy(
                root(&sigstore),
                Matcher::Exact(SUBJECT.into()),
                Matcher::Exact("https://accounts.google.com".into()),
            ),
            &format!("from issuer {ISSUER:?} is not one the pin names") as &str,
        ),
        (
            keyless_policy(
                root(&sigstore),
                Matcher::regex("acme", "subjectRegExp").unwrap(),
                Matcher::Exact(ISSUER.into()),
            ),
            "is not one the pin names",
        ),
    ] {
        let err = judge(good.clone(), &policy).unwrap_err();
        assert_eq!(err.category(), "UntrustedSignature", "{err}");
        assert!(err.to_string().contains(want), "{err}");
    }

    // No keyless policy at all: a certificate signature is not trusted.
    let err = judge(good.clone(), &Policy::default()).unwrap_err();
    assert!(
        err.to_string().contains("no keyless identity is trusted"),
        "{err}"
    );

    // A certificate from a CA the root does not name.
    let stranger = Sigstore::new().unwrap();
    let foreign_signer = stranger.certificate(SUBJECT, ISSUER).unwrap();
    let mut foreign = stranger.bundle(D1, &foreign_signer, now).unwrap();
    // Logged by the trusted log (so only the chain is wrong).
    foreign = sigstore.resign_set(&foreign).unwrap();
    let err = judge(foreign, &exact).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not chain to a certificate authority"),
        "{err}"
    );

    // The log's promise altered (another integration time), or made by another log.
    let mut moved: serde_json::Value = serde_json::from_slice(&good).unwrap();
    moved["verificationMaterial"]["tlogEntries"][0]["integratedTime"] =
        (now + 1).to_string().into();
    let err = judge(serde_json::to_vec(&moved).unwrap(), &exact).unwrap_err();
    assert!(
        err.to_string()
            .contains("signed entry timestamp does not verify"),
        "{err}"
    );
    let err = judge(stranger.bundle(D1, &signer, now).unwrap(), &exact).unwrap_err();
    assert!(
        err.to_string().contains("not a log of the trusted root"),
        "{err}"
    );

    // Logged long after the short-lived certificate expired.
    let err = judge(sigstore.bundle(D1, &signer, now + 3600).unwrap(), &exact).unwrap_err();
    assert!(
        err.to_string()
            .contains("outside the certificate's validity"),
        "{err}"
    );

    // A valid keyless signature of another digest.
    let other_digest = format!("sha256:{}", "2".repeat(64));
    let err = judge(
        sigstore.bundle(&other_digest, &signer, now).unwrap(),
        &exact,
    )
    .unwrap_err();
    assert_eq!(err.category(), "Tampered", "{err}");
}
