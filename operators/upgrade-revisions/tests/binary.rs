//! The `sluice-upgrade-revisions` binary against the Kubernetes API emulator: it starts, takes its Lease,
//! serves `/metrics`, `/healthz` and `/readyz`, and on SIGTERM stops reconciling, releases the
//! Lease and exits 0.

use sluice_testkit::crds::sluice_crd;
use sluice_testkit::operator_binary::check_operator_binary;

#[tokio::test]
async fn binary_leads_serves_health_and_releases_on_sigterm() {
    check_operator_binary(
        env!("CARGO_BIN_EXE_sluice-upgrade-revisions"),
        &sluice_crd("revisionupgrades.sluice.dev.yaml"),
        "sluice-upgrade-revisions",
    )
    .await;
}

/// A metrics source setting that cannot work stops the binary at start with the reason, before
/// it talks to anything (the chart wires these flags from `metricsSource`).
#[test]
fn a_wrong_metrics_source_flag_stops_the_binary_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("token");
    let cases: [(Vec<String>, String); 2] = [
        (
            vec!["--prometheus-username=sluice".into()],
            "--prometheus-username needs --prometheus-password-file".into(),
        ),
        (
            vec![format!(
                "--prometheus-bearer-token-file={}",
                missing.display()
            )],
            format!("bearer token file {}: No such file", missing.display()),
        ),
    ];
    for (flags, expected) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-upgrade-revisions"))
            .args(&flags)
            .env_remove("KUBECONFIG")
            .output()
            .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: {stderr}");
        assert!(stderr.contains(&expected), "{flags:?}: {stderr}");
    }
}
