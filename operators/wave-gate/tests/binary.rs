//! The `sluice-wave-gate` binary against the Kubernetes API emulator: it starts, takes its Lease,
//! serves `/metrics`, `/healthz` and `/readyz`, and on SIGTERM stops reconciling, releases the
//! Lease and exits 0.

use std::path::Path;

#[tokio::test]
async fn binary_leads_serves_health_and_releases_on_sigterm() {
    sluice_testkit::operator_binary::check_operator_binary(
        env!("CARGO_BIN_EXE_sluice-wave-gate"),
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds/wavegates.sluice.dev.yaml"),
        "sluice-wave-gate",
    )
    .await;
}
