//! The built `kubectl-sluice` binary against a private registry (testkit's secure fixture:
//! HTTPS from a CA made for the run, Docker's token flow): credentials from the Docker config
//! (`$DOCKER_CONFIG/config.json` by default, or `--registry-config`), the CA from
//! `--registry-ca`. Push, inspect and verify work; a wrong password and an untrusted CA fail
//! with messages that name the registry and what to fix.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{ROUTE, p};
use sluice_testkit::registry::{Auth, PASSWORD, Registry, USERNAME};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-sluice");

/// Runs the plugin with `docker_config_dir` as `$DOCKER_CONFIG`.
fn run(docker_config_dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("DOCKER_CONFIG", docker_config_dir)
        .env("SLUICE_TEST_KEY_PASSWORD", "correct horse")
        .output()
        .expect("kubectl-sluice runs")
}

fn config(registry: &Registry, password: &str) -> String {
    serde_json::json!({"auths": {registry.host(): {"username": USERNAME, "password": password}}})
        .to_string()
}

// Multi-threaded: the token service runs on this test's runtime while a worker waits for the
// plugin's process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_inspect_and_verify_with_a_docker_config_and_a_ca() {
    let Some(registry) = Registry::start_secure_or_skip(Auth::Token).await else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let manifests = work.path().join("mesh");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("mesh.yaml"), ROUTE).unwrap();
    let ca = work.path().join("ca.pem");
    std::fs::write(&ca, registry.ca_pem().unwrap()).unwrap();
    // The default config location: $DOCKER_CONFIG/config.json.
    let docker = work.path().join("docker");
    std::fs::create_dir(&docker).unwrap();
    std::fs::write(docker.join("config.json"), config(&registry, PASSWORD)).unwrap();
    let host = registry.host();
    let tls = ["--tls-registry", host.as_str(), "--registry-ca", p(&ca)];
    let repo = registry.repository("mesh/config");
    let tag = format!("{repo}:v1");

    let ok = |args: &[&str]| -> serde_json::Value {
        let output = run(&docker, args);
        assert!(
            output.status.success(),
            "{args:?}: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            registry.log()
        );
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let key = work.path().join("release");
    let generated = run(
        &docker,
        &[
            "bundle",
            "generate-key-pair",
            "--output-prefix",
            p(&key),
            "--password-env",
            "SLUICE_TEST_KEY_PASSWORD",
        ],
    );
    assert!(generated.status.success());
    let mut render = vec!["bundle", "render", p(&manifests), "--push", &tag, "--json"];
    render.extend(tls);
    let rendered = ok(&render);
    let reference = rendered["reference"].as_str().unwrap().to_owned();
    let public_key = key.with_extension("pub");
    let private_key = key.with_extension("key");
    let mut sign = vec![
        "bundle",
        "sign",
        &reference,
        "--key",
        p(&private_key),
        "--password-env",
        "SLUICE_TEST_KEY_PASSWORD",
        "--json",
    ];
    sign.extend(tls);
    ok(&sign);
    let mut verify = vec![
        "bundle",
        "verify",
        &reference,
        "--key",
        p(&public_key),
        "--json",
    ];
    verify.extend(tls);
    ok(&verify);
    let mut inspect = vec!["bundle", "inspect", &tag, "-o", "json"];
    inspect.extend(tls);
    let inspected = ok(&inspect);
    assert_eq!(inspected["manifest_digest"], rendered["manifest_digest"]);

    // A wrong password in an explicit --registry-config.
    let wrong = work.path().join("wrong.json");
    std::fs::write(&wrong, config(&registry, "wrong-password")).unwrap();
    let mut args = inspect.clone();
    args.extend(["--registry-config", p(&wrong)]);
    let output = run(&docker, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error [Unauthorized]")
            && stderr.contains(&format!("registry {host} answered unauthorized"))
            && !stderr.contains("wrong-password"),
        "{stderr}"
    );

    // No --registry-ca: the registry's certificate is not trusted.
    let output = run(
        &docker,
        &[
            "bundle",
            "inspect",
            &tag,
            "--tls-registry",
            &host,
            "-o",
            "json",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("TLS: the registry's certificate is not trusted")
            && stderr.contains("--registry-ca"),
        "{stderr}"
    );

    // A broken config file is named, and nothing is sent.
    std::fs::write(&wrong, "{not json").unwrap();
    let output = run(&docker, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("registry config {}: not JSON", p(&wrong))),
        "{stderr}"
    );
}
