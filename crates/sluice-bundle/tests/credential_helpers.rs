//! Docker credential helpers against a private registry (the test kit's `docker-registry` over
//! HTTPS with htpasswd basic auth): helpers are shell scripts `docker-credential-<name>` in a
//! directory made per test, found through `HelperOptions::dirs`. A `credsStore` helper's
//! credentials push, sign, verify and pull; a `credHelpers` entry wins over `credsStore` and
//! over the host's `auths` entry; a helper with nothing for the registry leaves it anonymous and
//! the registry's 401 says so; a helper that hangs is stopped at the timeout, naming it; a name
//! with a `/` is never run; a helper named but not run (revert's case) is said in the 401; and
//! no error or `Debug` output carries the secret a helper answered.

use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use base64::Engine;
use common::bundle;
use sluice_bundle::{BundleClient, HelperOptions, RegistryCredentials};
use sluice_testkit::registry::{Auth, PASSWORD, Registry, USERNAME};

/// A password no registry accepts, and that must never show in a message.
const WRONG_SECRET: &str = "helper-secret-never-shown";

/// Writes the executable helper `docker-credential-<name>` running `body` (sh) into `dir`.
fn helper(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("docker-credential-{name}"));
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A helper that answers `username`/`secret` for `host` only (and checks it was asked `get`
/// with the host on stdin), and "not found" for anything else.
fn answering(dir: &Path, name: &str, host: &str, username: &str, secret: &str) {
    helper(
        dir,
        name,
        &format!(
            r#"[ "$1" = get ] || {{ echo "unexpected action $1"; exit 2; }}
url=$(cat)
if [ "$url" = "{host}" ]; then
  printf '{{"ServerURL":"%s","Username":"{username}","Secret":"{secret}"}}' "$url"
else
  echo "credentials not found in native keychain"; exit 1
fi"#
        ),
    );
}

fn options(dir: &Path) -> HelperOptions {
    HelperOptions {
        dirs: Some(vec![dir.to_owned()]),
        ..HelperOptions::default()
    }
}

fn config(json: serde_json::Value) -> RegistryCredentials {
    RegistryCredentials::from_docker_config(json.to_string().as_bytes(), "test config").unwrap()
}

/// A client of `registry` trusting its CA.
fn client(registry: &Registry, credentials: RegistryCredentials) -> BundleClient {
    common::client(registry, credentials, true)
}

/// Push, sign, verify and pull: the whole path a bundle takes.
async fn round_trip(registry: &Registry, credentials: RegistryCredentials) {
    common::round_trip(registry, credentials).await;
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(WRONG_SECRET), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

#[tokio::test]
async fn a_creds_store_helper_logs_in() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    let host = registry.host();
    let helpers = tempfile::tempdir().unwrap();
    answering(helpers.path(), "teststore", &host, USERNAME, PASSWORD);
    // `docker login` with a credential store leaves an empty `auths` entry.
    let mut credentials = config(serde_json::json!({
        "auths": {&host: {}},
        "credsStore": "teststore",
    }));
    assert_eq!(credentials.helper_for(&host), Some("teststore"));
    credentials
        .run_helpers([host.as_str()], &options(helpers.path()))
        .await
        .unwrap();
    assert_no_secret(&format!("{credentials:?}"));
    round_trip(&registry, credentials).await;
}

#[tokio::test]
async fn a_cred_helpers_entry_wins_over_creds_store_and_auths() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    let host = registry.host();
    let helpers = tempfile::tempdir().unwrap();
    answering(helpers.path(), "store", &host, USERNAME, WRONG_SECRET);
    answering(helpers.path(), "registry-helper", &host, USERNAME, PASSWORD);
    let wrong_auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{WRONG_SECRET}"));
    let mut credentials = config(serde_json::json!({
        "auths": {&host: {"auth": wrong_auth}},
        "credsStore": "store",
        "credHelpers": {&host: "registry-helper"},
    }));
    credentials
        .run_helpers([host.as_str()], &options(helpers.path()))
        .await
        .unwrap();
    round_trip(&registry, credentials).await;

    // The store's wrong secret, once it is the helper chosen: refused, and never shown.
    let mut store_only = config(serde_json::json!({"credsStore": "store"}));
    store_only
        .run_helpers([host.as_str()], &options(helpers.path()))
        .await
        .unwrap();
    let err = client(&registry, store_only.clone())
        .push(
            &bundle(),
            &format!("{}:v1", registry.repository("mesh/config")),
        )
        .await
        .expect_err("wrong secret");
    let text = err.to_string();
    assert_eq!(err.category(), "Unauthorized", "{text}");
    assert!(
        text.contains(&format!("credentials of user {USERNAME:?}")),
        "{text}"
    );
    assert_no_secret(&format!("{text} {err:?} {store_only:?}"));
}

#[tokio::test]
async fn a_helper_without_credentials_means_anonymous() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    let host = registry.host();
    let helpers = tempfile::tempdir().unwrap();
    // Answers "not found" for every host but another one.
    answering(
        helpers.path(),
        "empty",
        "other.example",
        USERNAME,
        WRONG_SECRET,
    );
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
    // Docker's rule: with a helper for the host, its `auths` entry is not used.
    let mut credentials = config(serde_json::json!({
        "auths": {&host: {"auth": auth}},
        "credsStore": "empty",
    }));
    credentials
        .run_helpers([host.as_str()], &options(helpers.path()))
        .await
        .expect("not found is no error");
    let reference = format!("{}:v1", registry.repository("mesh/config"));
    let err = client(&registry, credentials)
        .pull(&reference)
        .await
        .expect_err("anonymous");
    let text = err.to_string();
    assert_eq!(err.category(), "Unauthorized", "{text}");
    assert!(
        text.contains("the registry wants credentials and none are configured for it"),
        "{text}"
    );
    assert!(
        text.contains("its credential helper docker-credential-empty has none for it"),
        "{text}"
    );
}

#[tokio::test]
async fn a_helper_named_but_not_run_is_said_in_the_refusal() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    let host = registry.host();
    // revert's case: a Secret that names only a helper for the registry; nothing runs it.
    let credentials = config(serde_json::json!({
        "auths": {&host: {}},
        "credHelpers": {&host: "ecr-login"},
    }));
    let reference = format!("{}:v1", registry.repository("mesh/config"));
    let client = client(&registry, credentials);
    for err in [
        client.pull(&reference).await.expect_err("anonymous read"),
        client
            .push(&bundle(), &reference)
            .await
            .expect_err("anonymous push"),
    ] {
        let text = err.to_string();
        assert_eq!(err.category(), "Unauthorized", "{text}");
        assert!(
            text.contains(
                "names credential helper docker-credential-ecr-login for it, which is not run here"
            ),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_hanging_helper_is_stopped_at_the_timeout() {
    let helpers = tempfile::tempdir().unwrap();
    helper(helpers.path(), "hang", "exec sleep 30");
    let mut credentials = config(serde_json::json!({"credsStore": "hang"}));
    let started = Instant::now();
    let err = credentials
        .run_helpers(
            ["registry.example:5000"],
            &HelperOptions {
                timeout: Duration::from_millis(500),
                dirs: Some(vec![helpers.path().to_owned()]),
            },
        )
        .await
        .expect_err("timeout");
    let elapsed = started.elapsed();
    let text = err.to_string();
    assert_eq!(err.category(), "CredentialHelper", "{text}");
    assert!(
        text.contains(
            "credential helper docker-credential-hang for registry registry.example:5000: \
             did not answer within 0.5 s"
        ),
        "{text}"
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[tokio::test]
async fn helper_names_with_a_path_are_never_run() {
    let helpers = tempfile::tempdir().unwrap();
    let marker = helpers.path().join("ran");
    // What `credsStore: "sub/x"` would run if names were paths.
    std::fs::create_dir(helpers.path().join("docker-credential-sub")).unwrap();
    helper(
        &helpers.path().join("docker-credential-sub"),
        "x",
        &format!("touch {}", marker.display()),
    );
    std::fs::rename(
        helpers
            .path()
            .join("docker-credential-sub/docker-credential-x"),
        helpers.path().join("docker-credential-sub/x"),
    )
    .unwrap();
    for name in ["sub/x", "../docker-credential-sub/x", "/bin/sh"] {
        let mut credentials = config(serde_json::json!({
            "credHelpers": {"registry.example": name},
        }));
        let err = credentials
            .run_helpers(["registry.example"], &options(helpers.path()))
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert_eq!(err.category(), "CredentialHelper", "{text}");
        assert!(
            text.contains(&format!(
                "credential helper {name:?} for registry registry.example: refused"
            )),
            "{text}"
        );
        assert!(!marker.exists(), "{name} was run");
    }
}

#[tokio::test]
async fn failing_missing_and_garbled_helpers_are_errors_without_the_secret() {
    let helpers = tempfile::tempdir().unwrap();
    helper(
        helpers.path(),
        "fails",
        "echo 'token expired: run the login again'; exit 1",
    );
    helper(
        helpers.path(),
        "garbled",
        &format!(r#"printf '{{"Username":"u","Secret":"{WRONG_SECRET}"'"#),
    );
    helper(
        helpers.path(),
        "typed",
        &format!(r#"printf '{{"Username":1,"Secret":"{WRONG_SECRET}"}}'"#),
    );
    helper(
        helpers.path(),
        "flood",
        &format!("yes {WRONG_SECRET} | head -c 1000000"),
    );
    for (name, want) in [
        (
            "fails",
            "failed (exit status: 1): \"token expired: run the login again\"",
        ),
        (
            "garbled",
            "answered with something other than the credential-helper protocol's JSON",
        ),
        (
            "typed",
            "answered with something other than the credential-helper protocol's JSON",
        ),
        ("flood", "answered more than 65536 bytes"),
        ("absent", "not found in the helper directories"),
    ] {
        let mut credentials = config(serde_json::json!({"credsStore": name}));
        let err = credentials
            .run_helpers(["registry.example"], &options(helpers.path()))
            .await
            .expect_err(name);
        let text = err.to_string();
        assert_eq!(err.category(), "CredentialHelper", "{text}");
        assert!(
            text.contains(&format!(
                "credential helper docker-credential-{name} for registry registry.example: {want}"
            )),
            "{text}"
        );
        assert_no_secret(&format!("{text} {err:?}"));
    }
}
