//! The `kube-emulator` binary: prints its port and kubeconfig path when ready, serves kube-rs
//! through the kubeconfig it wrote, loads `--manifest` files, and stops on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

#[tokio::test]
async fn the_binary_serves_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let manifest = dir.path().join("cm.yaml");
    std::fs::write(&manifest, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: preloaded, namespace: default}\ndata: {a: b}\n")
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--manifest")
        .arg(&manifest)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("binary starts");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut l = String::new();
        BufReader::new(stdout).read_line(&mut l).map(|_| l)
    });
    let line = tokio::time::timeout(Duration::from_secs(20), line)
        .await
        .expect("ready within 20s")
        .unwrap()
        .unwrap();
    assert!(
        line.contains("listening on http://127.0.0.1:")
            && line.contains(kubeconfig.to_str().unwrap()),
        "{line}"
    );

    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let cm = Api::<ConfigMap>::namespaced(client, "default")
        .get("preloaded")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["a"], "b");

    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .arg("-TERM")
            .arg(&pid)
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still running 10s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
