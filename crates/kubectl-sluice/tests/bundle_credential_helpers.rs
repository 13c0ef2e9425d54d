//! The built `kubectl-sluice` binary with a Docker config that names a credential helper, as
//! Docker Desktop writes one (`"credsStore": "desktop"`): the helper is a shell script
//! `docker-credential-desktop` first on the plugin's `PATH`, the registry the test kit's
//! `docker-registry` over HTTPS with htpasswd basic auth. A helper that holds the login pushes
//! and inspects; one that has none leaves the plugin anonymous, and the registry's refusal says
//! the helper had nothing; one that answers a wrong secret is refused without the secret shown.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{ROUTE, p};
use sluice_testkit::registry::{Auth, PASSWORD, Registry, USERNAME};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-sluice");

/// A secret no registry accepts, and that must never show in the plugin's output.
const WRONG_SECRET: &str = "helper-secret-never-shown";

/// Writes `docker-credential-desktop` into `bin`: answers `username`/`secret` for `host` only,
/// "not found" (Docker's wording, exit 1) for any other server URL.
fn desktop_helper(bin: &Path, host: &str, username: &str, secret: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = bin.join("docker-credential-desktop");
    std::fs::write(
        &path,
        format!(
            r#"#!/bin/sh
[ "$1" = get ] || exit 2
url=$(cat)
if [ "$url" = "{host}" ]; then
  printf '{{"ServerURL":"%s","Username":"{username}","Secret":"{secret}"}}' "$url"
else
  echo "credentials not found in native keychain"; exit 1
fi
"#
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs the plugin with `docker` as `$DOCKER_CONFIG` and `bin` first on `PATH`.
fn run(docker: &Path, bin: &Path, args: &[&str]) -> Output {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path =
        std::env::join_paths(std::iter::once(bin.to_owned()).chain(std::env::split_paths(&path)))
            .unwrap();
    Command::new(BIN)
        .args(args)
        .env("DOCKER_CONFIG", docker)
        .env("PATH", path)
        .output()
        .expect("kubectl-sluice runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_desktop_login_pushes_through_its_credential_helper() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Htpasswd).await else {
        return;
    };
    let host = registry.host();
    let work = tempfile::tempdir().unwrap();
    let manifests = work.path().join("mesh");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("mesh.yaml"), ROUTE).unwrap();
    let ca = work.path().join("ca.pem");
    std::fs::write(&ca, registry.ca_pem().unwrap()).unwrap();
    let docker = work.path().join("docker");
    std::fs::create_dir(&docker).unwrap();
    // What `docker login` leaves with Docker Desktop: an empty entry and the store's name.
    std::fs::write(
        docker.join("config.json"),
        serde_json::json!({"auths": {&host: {}}, "credsStore": "desktop"}).to_string(),
    )
    .unwrap();
    let tag = format!("{}:v1", registry.repository("mesh/config"));
    let push = [
        "bundle",
        "render",
        p(&manifests),
        "--push",
        &tag,
        "--json",
        "--tls-registry",
        &host,
        "--registry-ca",
        p(&ca),
    ];

    let logged_in = work.path().join("logged-in");
    std::fs::create_dir(&logged_in).unwrap();
    desktop_helper(&logged_in, &host, USERNAME, PASSWORD);
    let output = run(&docker, &logged_in, &push);
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        registry.log()
    );
    let rendered: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(rendered["tag"], "v1");
    let inspected = run(
        &docker,
        &logged_in,
        &[
            "bundle",
            "inspect",
            &tag,
            "-o",
            "json",
            "--tls-registry",
            &host,
            "--registry-ca",
            p(&ca),
        ],
    );
    assert!(
        inspected.status.success(),
        "{}",
        String::from_utf8_lossy(&inspected.stderr)
    );

    // Logged in elsewhere only: anonymous, and the refusal says the helper had nothing.
    let elsewhere = work.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    desktop_helper(&elsewhere, "other.example", USERNAME, PASSWORD);
    let output = run(&docker, &elsewhere, &push);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "error [Unauthorized]: registry {host} answered unauthorized"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("its credential helper docker-credential-desktop has none for it"),
        "{stderr}"
    );

    // A stale secret: refused naming the user, never showing the secret.
    let stale = work.path().join("stale");
    std::fs::create_dir(&stale).unwrap();
    desktop_helper(&stale, &host, USERNAME, WRONG_SECRET);
    let output = run(&docker, &stale, &push);
    assert_eq!(output.status.code(), Some(1));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        all.contains(&format!(
            "the registry refused the credentials of user {USERNAME:?}"
        )),
        "{all}"
    );
    assert!(!all.contains(WRONG_SECRET), "{all}");
}
