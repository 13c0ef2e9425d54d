//! Bundles against a private registry: Debian's `docker-registry` over HTTPS with a certificate
//! from a CA made for the run, requiring htpasswd basic auth or Docker's token flow (a token
//! service on 127.0.0.1, as cloud registries run one). Credentials come from a Docker config
//! (`auths`, in the `auth` and the username/password forms, or an `identitytoken`), the CA from a
//! PEM bundle. Push, sign, verify and pull work; a wrong password is refused naming the registry
//! and "unauthorized"; an untrusted CA is a TLS error that says what to configure; and
//! credentials go to the registry and its token service only.

mod common;

use base64::Engine;
use common::{bundle, client};
use sluice_bundle::RegistryCredentials;
use sluice_testkit::registry::{Auth, IDENTITY_TOKEN, PASSWORD, Registry, USERNAME};

/// A Docker config with `entry` for the fixture's registry.
fn docker_config(registry: &Registry, entry: serde_json::Value) -> RegistryCredentials {
    let json = serde_json::json!({"auths": {registry.host(): entry}});
    RegistryCredentials::from_docker_config(json.to_string().as_bytes(), "test config").unwrap()
}

fn auth_entry(username: &str, password: &str) -> serde_json::Value {
    serde_json::json!({
        "auth": base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
    })
}

/// Push, sign, verify and pull with `credentials` (the whole path a pin takes), then inspect.
async fn round_trip(registry: &Registry, credentials: RegistryCredentials) {
    let (client, reference) = common::round_trip(registry, credentials).await;
    let inspected = client.inspect(&reference).await.unwrap();
    assert_eq!(inspected.signatures, Some(1));
}

fn assert_unauthorized(err: &sluice_bundle::BundleError, registry: &Registry, user: &str) {
    let text = err.to_string();
    assert_eq!(err.category(), "Unauthorized", "{text}");
    assert!(
        text.contains(&format!(
            "registry {} answered unauthorized",
            registry.host()
        )),
        "{text}"
    );
    assert!(text.contains(&format!("user {user:?}")), "{text}");
    assert!(!text.contains("wrong-password"), "{text}");
}

#[tokio::test]
async fn basic_auth_over_tls_with_a_docker_config() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    round_trip(
        &registry,
        docker_config(&registry, auth_entry(USERNAME, PASSWORD)),
    )
    .await;

    // A wrong password: pulls (sluice's own fetcher) and pushes are refused, naming the registry.
    let wrong = client(
        &registry,
        docker_config(&registry, auth_entry(USERNAME, "wrong-password")),
        true,
    );
    let reference = format!("{}:v1", registry.repository("mesh/config"));
    let err = wrong.pull(&reference).await.expect_err("wrong password");
    assert_unauthorized(&err, &registry, USERNAME);
    let err = wrong
        .push(&bundle(), &reference)
        .await
        .expect_err("wrong password");
    assert_unauthorized(&err, &registry, USERNAME);

    // No credentials at all.
    let err = client(&registry, RegistryCredentials::none(), true)
        .pull(&reference)
        .await
        .expect_err("anonymous");
    assert_eq!(err.category(), "Unauthorized", "{err}");
    assert!(
        err.to_string()
            .contains("the registry wants credentials and none are configured for it"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unknown_ca_is_a_tls_error_naming_what_to_configure() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    let untrusting = client(
        &registry,
        docker_config(&registry, auth_entry(USERNAME, PASSWORD)),
        false,
    );
    let reference = format!("{}:v1", registry.repository("mesh/config"));
    for err in [
        untrusting.pull(&reference).await.expect_err("untrusted"),
        untrusting
            .push(&bundle(), &reference)
            .await
            .expect_err("untrusted"),
    ] {
        let text = err.to_string();
        assert_eq!(err.category(), "RegistryUnavailable", "{text}");
        assert!(
            text.contains(&format!("registry {} unavailable", registry.host()))
                && text.contains("TLS: the registry's certificate is not trusted")
                && text.contains("revert.registry.caConfigMap")
                && text.contains("--registry-ca"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn the_docker_token_flow_with_basic_credentials_and_an_identity_token() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Token).await else {
        return;
    };
    // username/password form of the config entry.
    round_trip(
        &registry,
        docker_config(
            &registry,
            serde_json::json!({"username": USERNAME, "password": PASSWORD}),
        ),
    )
    .await;
    let requests = registry.token_requests();
    assert!(!requests.is_empty());
    assert!(
        requests
            .iter()
            .all(|r| r.had_authorization && r.status == 200),
        "{requests:?}"
    );

    // An identitytoken (OAuth2 refresh token) reads through the same flow.
    let reference = format!("{}:v1", registry.repository("mesh/config"));
    let with_refresh_token = client(
        &registry,
        docker_config(
            &registry,
            serde_json::json!({"identitytoken": IDENTITY_TOKEN}),
        ),
        true,
    );
    with_refresh_token.pull(&reference).await.unwrap();
    assert!(
        registry
            .token_requests()
            .iter()
            .any(|r| r.grant_type.as_deref() == Some("refresh_token") && r.status == 200),
        "{:?}",
        registry.token_requests()
    );

    // A wrong password: the token service refuses it, for pulls and pushes.
    let wrong = client(
        &registry,
        docker_config(&registry, auth_entry(USERNAME, "wrong-password")),
        true,
    );
    let err = wrong.pull(&reference).await.expect_err("wrong password");
    assert_unauthorized(&err, &registry, USERNAME);
    assert!(
        err.to_string()
            .contains("its token service answered HTTP 401"),
        "{err}"
    );
    let err = wrong
        .push(&bundle(), &reference)
        .await
        .expect_err("wrong password");
    assert_unauthorized(&err, &registry, USERNAME);
}

#[tokio::test]
async fn a_repository_entry_outranks_the_registry_entry() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    // The registry-wide entry is wrong; the repository's own entry is right.
    let json = serde_json::json!({"auths": {
        registry.host(): auth_entry(USERNAME, "wrong-password"),
        registry.repository("mesh"): auth_entry(USERNAME, PASSWORD),
    }});
    let credentials =
        RegistryCredentials::from_docker_config(json.to_string().as_bytes(), "t").unwrap();
    round_trip(&registry, credentials).await;
}
