//! End to end on the emulator with the real registry: a BundlePin pins an Argo CD Application to
//! a bundle signed keylessly in cosign's current default format (a sigstore bundle attached as an
//! OCI referrer, a short-lived certificate from a Fulcio-like CA, logged with a Rekor SET),
//! judged against the trusted root revert is given (`--trusted-root`, the file the chart mounts
//! from `revert.trustedRoot`) and the pin's `spec.keyless` identity and issuer. A signature by
//! another identity, or under another root, is refused as `UntrustedSigner` and touches nothing;
//! the trusted root is read again at each verification, so once it no longer names the signer's
//! authority and log, the next pin of the same bundle is refused (not served from the
//! verified-bundle cache). The sigstore instances are made per test
//! (`sluice_testkit::sigstore`): nothing can reach a public one. Each step has a time budget.

mod support;

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use sluice_api::v1alpha1::{
    BundlePinPhase,
    bundle_pin::{conditions, reasons},
};
use sluice_runtime::conditions::find;
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::sigstore::{Sigstore, attach};
use support::*;

/// Per-step budget: an ordinary pin on a loaded 2-core machine.
const BUDGET: Duration = Duration::from_secs(60);

const ISSUER: &str = "https://token.actions.githubusercontent.com";
/// The identity the pins name.
const SUBJECT: &str = "https://github.com/acme/mesh/.github/workflows/release.yml@refs/heads/main";
/// Another workflow of the same organisation, same issuer, same CA.
const OTHER_SUBJECT: &str =
    "https://github.com/acme/mesh/.github/workflows/experiment.yml@refs/heads/main";

/// The pin's `spec.keyless`: [`SUBJECT`] from [`ISSUER`], exactly.
fn keyless() -> Value {
    json!({"keyless": {"identities": [{"subject": SUBJECT, "issuer": ISSUER}]}})
}

/// A directory for the trusted root file, removed with the test.
struct RootDir(std::path::PathBuf);

impl RootDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sluice-revert-keyless-{}-{}",
            std::process::id(),
            jiff::Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for RootDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Installs `root` as the trusted root file: written beside it, then renamed over it, as the
/// kubelet swaps the files of a mounted ConfigMap.
fn install_root(path: &Path, root: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, root).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Signs `digest` keylessly as `subject` under `sigstore`, logged now, and attaches the bundle
/// to the image as cosign does.
async fn sign_keyless(w: &World, digest: &str, sigstore: &Sigstore, subject: &str) {
    let signer = sigstore.certificate(subject, ISSUER).unwrap();
    let bundle = sigstore
        .bundle(digest, &signer, jiff::Timestamp::now().as_second())
        .unwrap();
    attach(&format!("{}@{digest}", w.repo), &bundle)
        .await
        .unwrap();
}

/// Argo CD synced `digest` (its target revision set to it first).
async fn argo_runs(w: &World, digest: &str) {
    w.point_at(digest).await;
    eventually_every(
        &format!("Argo CD synced {digest}"),
        BUDGET,
        POLL,
        async || {
            w.apps()
                .get(APP)
                .await
                .ok()?
                .is_synced_at(digest)
                .then_some(())
        },
    )
    .await;
}

/// The pin is Refused as [`reasons::UNTRUSTED_SIGNER`]: Verified False with a message naming
/// `why` and the signer the pin trusts, a Warning Event; returns the Verified message.
async fn refused_as_untrusted(w: &World, pin: &str, why: &str) -> String {
    let p = w.phase_is(pin, BundlePinPhase::Refused, BUDGET).await;
    let status = p.status.unwrap();
    let verified = find(&status.conditions, conditions::VERIFIED)
        .unwrap_or_else(|| panic!("{pin}: no Verified condition"))
        .clone();
    assert_eq!(verified.status, "False", "{pin}: {}", verified.message);
    assert_eq!(
        verified.reason,
        reasons::UNTRUSTED_SIGNER,
        "{pin}: {}",
        verified.message
    );
    for part in [
        "refused, nothing applied: ",
        "no signature by a signer the pin trusts",
        &format!("keyless {SUBJECT:?} from issuer {ISSUER:?}"),
        why,
        "sign with a trusted key or identity, or add this signer to the pin's policy",
    ] {
        assert!(
            verified.message.contains(part),
            "{pin}: {part:?} not in {}",
            verified.message
        );
    }
    // The spec itself is valid: the refusal is the signer's, reported in Verified.
    let ready = find(&status.conditions, conditions::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", reasons::VALID),
        "{pin}: {}",
        ready.message
    );
    assert!(status.to_digest.is_none(), "{pin}: nothing recorded");
    assert_eq!(status.applied_objects, 0, "{pin}");
    eventually_every(
        &format!("{pin}: a Warning Event names the cause"),
        BUDGET,
        POLL,
        async || {
            sluice_testkit::events::with_reason(&w.mgmt_client, ARGOCD, reasons::UNTRUSTED_SIGNER)
                .await
                .iter()
                .any(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.regarding
                            .as_ref()
                            .is_some_and(|r| r.name.as_deref() == Some(pin))
                })
                .then_some(())
        },
    )
    .await;
    verified.message
}

#[tokio::test]
async fn keyless_pins_verify_only_the_named_identity_under_the_installed_root() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let sigstore = Sigstore::new().unwrap();
    let stranger = Sigstore::new().unwrap();
    let root_dir = RootDir::new();
    let root_path = root_dir.0.join("trusted_root.json");
    install_root(&root_path, &sigstore.trusted_root_json());
    w.trusted_root = Some(root_path.clone());

    // Given: the good content signed keylessly by the release workflow; the same content under
    // other digests signed by another workflow, and by the release workflow under another
    // sigstore; a bad change Argo CD synced after the good one.
    let (good, _) = w.bundle(&[route("checkout", 10)], "1111111", None).await;
    sign_keyless(&w, &good.digest, &sigstore, SUBJECT).await;
    let (by_other, _) = w.bundle(&[route("checkout", 10)], "1111112", None).await;
    sign_keyless(&w, &by_other.digest, &sigstore, OTHER_SUBJECT).await;
    let (under_other_root, _) = w.bundle(&[route("checkout", 10)], "1111113", None).await;
    sign_keyless(&w, &under_other_root.digest, &stranger, SUBJECT).await;
    let (bad, _) = w.bundle(&[route("checkout", 90)], "2222222", None).await;
    w.application(APP, &good.digest, json!({})).await;
    w.argo(APP);
    for digest in [
        &by_other.digest,
        &under_other_root.digest,
        &good.digest,
        &bad.digest,
    ] {
        argo_runs(&w, digest).await;
    }
    assert_eq!(w.canary_weight("checkout").await, Some(90));
    w.start_revert();

    // When a pin names the release workflow but the bundle was signed by another workflow, or
    // under a root revert does not trust: refused, nothing applied, the Application untouched.
    for (pin, digest, why) in [
        (
            "other-identity",
            &by_other.digest,
            format!(
                "certificate identity {OTHER_SUBJECT:?} from issuer {ISSUER:?} is not one the pin names"
            ),
        ),
        (
            "other-root",
            &under_other_root.digest,
            "not a log of the trusted root".to_owned(),
        ),
    ] {
        w.create_pin(pin, digest, keyless()).await;
        let message = refused_as_untrusted(&w, pin, &why).await;
        println!(
            "{pin}: Refused, Verified=False {}: {message}",
            reasons::UNTRUSTED_SIGNER
        );
        assert_eq!(
            app_policy(&w.apps().get(APP).await.unwrap()),
            original_policy(),
            "{pin}: the Application untouched"
        );
        assert_eq!(w.canary_weight("checkout").await, Some(90), "{pin}");
        assert!(
            !w.managers("checkout")
                .await
                .contains(&"sluice-revert".to_owned()),
            "{pin}: nothing applied"
        );
    }

    // When a pin names the release workflow and the bundle it signed: pinned.
    w.create_pin("keyless", &good.digest, keyless()).await;
    let pinned = w.phase_is("keyless", BundlePinPhase::Pinned, BUDGET).await;
    let status = pinned.status.unwrap();
    let verified = find(&status.conditions, conditions::VERIFIED).unwrap();
    assert_eq!(verified.status, "True", "{}", verified.message);
    assert_eq!(verified.reason, reasons::SIGNATURE_VERIFIED);
    assert!(
        verified.message.contains(&format!(
            "signature on {} verified with key keyless:{SUBJECT} ({ISSUER})",
            good.digest
        )),
        "{}",
        verified.message
    );
    let ready = find(&status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.status, "True", "{}", ready.message);
    assert_eq!(status.to_digest.as_deref(), Some(good.digest.as_str()));
    assert_eq!(w.canary_weight("checkout").await, Some(10));
    let mut suspended = original_policy();
    suspended["automated"]["enabled"] = json!(false);
    let app = w.apps().get(APP).await.unwrap();
    assert_eq!(app_policy(&app), suspended, "automation off, settings kept");

    // When the installed root changes to one that names neither the CA nor the log that signed
    // it, the next verification of the same bundle reads the new root: refused, and the
    // Application stays as the first pin left it.
    install_root(&root_path, &stranger.trusted_root_json());
    w.create_pin("after-rotation", &good.digest, keyless())
        .await;
    let message = refused_as_untrusted(&w, "after-rotation", "not a log of the trusted root").await;
    println!(
        "after-rotation: Refused, Verified=False {}: {message}",
        reasons::UNTRUSTED_SIGNER
    );
    assert_eq!(app_policy(&w.apps().get(APP).await.unwrap()), suspended);
    assert_eq!(w.canary_weight("checkout").await, Some(10));
}
