//! End to end: the built `kubectl-sluice` binary against a real registry (testkit fixture), the
//! way CI uses it: generate keys, render and push, sign, verify, inspect, and the refusals with
//! their exit codes. Skips with a printed reason when `docker-registry` is not installed.

use std::path::Path;
use std::process::{Command, Output};

use sluice_testkit::registry::Registry;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-sluice");
const PASSWORD_ENV: &str = "SLUICE_TEST_KEY_PASSWORD";

const ROUTE: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: checkout
  namespace: shop
spec:
  rules:
  - backendRefs:
    - name: checkout-v1
      weight: 100
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: payments
  namespace: shop
spec:
  hosts: [payments]
";

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env(PASSWORD_ENV, "correct horse")
        .env_remove("SOURCE_DATE_EPOCH")
        .output()
        .expect("kubectl-sluice runs")
}

fn ok(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        output.status.success(),
        "kubectl-sluice {args:?} failed with {}:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let stdout = ok(args);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

fn refused(args: &[&str], category: &str) {
    let output = run(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{args:?}: {stderr}");
    assert!(
        stderr.contains(&format!("error [{category}]")),
        "{args:?}: {stderr}"
    );
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test]
async fn ci_flow_render_push_sign_verify_inspect() {
    let Some(registry) = Registry::start_or_skip().await else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let manifests = work.path().join("mesh");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("mesh.yaml"), ROUTE).unwrap();
    std::fs::write(manifests.join("README.md"), "not a manifest").unwrap();
    let repo = registry.repository("mesh/config");

    // Keys, as `cosign generate-key-pair` would write them.
    let release = work.path().join("release");
    let stranger = work.path().join("stranger");
    for prefix in [&release, &stranger] {
        ok(&[
            "bundle",
            "generate-key-pair",
            "--output-prefix",
            p(prefix),
            "--password-env",
            PASSWORD_ENV,
        ]);
    }
    let private = std::fs::read_to_string(release.with_extension("key")).unwrap();
    assert!(
        private.contains("ENCRYPTED SIGSTORE PRIVATE KEY"),
        "{private}"
    );
    let generate_again = run(&[
        "bundle",
        "generate-key-pair",
        "--output-prefix",
        p(&release),
    ]);
    assert_eq!(
        generate_again.status.code(),
        Some(1),
        "existing keys are not overwritten"
    );

    // Render straight to the registry, and to a layout pushed separately: same digest.
    let rendered = json(&[
        "bundle",
        "render",
        p(&manifests),
        "--push",
        &format!("{repo}:abc1234"),
        "--source-commit",
        "abc1234",
        "--json",
    ]);
    let reference = rendered["reference"].as_str().unwrap().to_string();
    let digest = rendered["manifest_digest"].as_str().unwrap().to_string();
    assert_eq!(reference, format!("{repo}@{digest}"));
    assert_eq!(rendered["objects"], 2);
    assert_eq!(rendered["skipped"], serde_json::json!(["README.md"]));

    let layout = work.path().join("layout");
    let from_layout = json(&[
        "bundle",
        "render",
        p(&manifests),
        "--output-layout",
        p(&layout),
        "--source-commit",
        "abc1234",
        "--json",
    ]);
    assert_eq!(from_layout["manifest_digest"], rendered["manifest_digest"]);
    assert!(from_layout["reference"].is_null());
    let pushed = json(&[
        "bundle",
        "push",
        p(&layout),
        &format!("{repo}:again"),
        "--json",
    ]);
    assert_eq!(pushed["reference"].as_str(), Some(reference.as_str()));

    // A different creation time changes the manifest digest, never the content digest.
    let later = json(&[
        "bundle",
        "render",
        p(&manifests),
        "--output-layout",
        p(&work.path().join("later")),
        "--source-commit",
        "abc1234",
        "--created",
        "2026-06-01T00:00:00Z",
        "--json",
    ]);
    assert_ne!(later["manifest_digest"], rendered["manifest_digest"]);
    assert_eq!(later["content_digest"], rendered["content_digest"]);

    // Unsigned, then signed.
    let public = release.with_extension("pub");
    refused(
        &["bundle", "verify", &reference, "--key", p(&public)],
        "Unsigned",
    );
    let signed = json(&[
        "bundle",
        "sign",
        &reference,
        "--key",
        p(&release.with_extension("key")),
        "--password-env",
        PASSWORD_ENV,
        "--json",
    ]);
    assert_eq!(signed["added"], true);
    let verified = json(&[
        "bundle",
        "verify",
        &reference,
        "--key",
        p(&stranger.with_extension("pub")),
        "--key",
        p(&public),
        "--json",
    ]);
    assert_eq!(verified["digest"].as_str(), Some(digest.as_str()));
    assert_eq!(verified["key_index"], 1);

    // Refusals: wrong key, a tag instead of a digest.
    refused(
        &[
            "bundle",
            "verify",
            &reference,
            "--key",
            p(&stranger.with_extension("pub")),
        ],
        "WrongKey",
    );
    refused(
        &[
            "bundle",
            "verify",
            &format!("{repo}:abc1234"),
            "--key",
            p(&public),
        ],
        "DigestRequired",
    );

    // A wrong password is a key error, not a refusal.
    let wrong_password = Command::new(BIN)
        .args([
            "bundle",
            "sign",
            &reference,
            "--key",
            p(&release.with_extension("key")),
        ])
        .env("COSIGN_PASSWORD", "wrong")
        .output()
        .unwrap();
    assert_eq!(wrong_password.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong_password.stderr).contains("error [Key]"),
        "{}",
        String::from_utf8_lossy(&wrong_password.stderr)
    );

    // Inspect by tag, as JSON and as text, and a local layout.
    let inspection = json(&[
        "bundle",
        "inspect",
        &format!("{repo}:abc1234"),
        "-o",
        "json",
    ]);
    assert_eq!(
        inspection["manifest_digest"].as_str(),
        Some(digest.as_str())
    );
    assert_eq!(inspection["content_digest"], rendered["content_digest"]);
    assert_eq!(inspection["source_commit"], "abc1234");
    assert_eq!(inspection["objects"], 2);
    assert_eq!(inspection["signatures"], 1);
    assert_eq!(
        inspection["kinds"],
        serde_json::json!({"HTTPRoute.gateway.networking.k8s.io": 1, "VirtualService.networking.istio.io": 1})
    );
    let text = ok(&["bundle", "inspect", &reference]);
    assert!(
        text.contains(&format!("manifest digest: {digest}")),
        "{text}"
    );
    assert!(text.contains("source commit: abc1234"), "{text}");
    let local = json(&["bundle", "inspect", p(&layout), "-o", "json"]);
    assert_eq!(local["manifest_digest"].as_str(), Some(digest.as_str()));
    assert!(local["signatures"].is_null());

    // Invalid manifests fail with their location, before anything is pushed.
    std::fs::write(manifests.join("broken.yaml"), "kind: ConfigMap\n").unwrap();
    let broken = run(&["bundle", "render", p(&manifests), "--push", &repo]);
    assert_eq!(broken.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        stderr.contains("error [InvalidManifests]") && stderr.contains("broken.yaml#0"),
        "{stderr}"
    );
}
