//! The `sluice-rollout-weights` binary against the Kubernetes API emulator: it starts, takes its Lease,
//! serves `/metrics`, `/healthz` and `/readyz`, and on SIGTERM stops reconciling, releases the
//! Lease and exits 0.

use sluice_testkit::crds::sluice_crd;
use sluice_testkit::operator_binary::check_operator_binary;

#[tokio::test]
async fn binary_leads_serves_health_and_releases_on_sigterm() {
    check_operator_binary(
        env!("CARGO_BIN_EXE_sluice-rollout-weights"),
        &sluice_crd("rollouts.sluice.dev.yaml"),
        "sluice-rollout-weights",
    )
    .await;
}
