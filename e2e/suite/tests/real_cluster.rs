//! The scenarios of `rbac.rs` against a real cluster (`e2e/kind/`): with `KUBECONFIG` and
//! `SLUICE_E2E_CLUSTER=1` the cluster must answer and hold the chart's operators; without them the
//! run is reported as not run by name (`prereq::UNAVAILABLE`: no container engine here), never
//! silently.

use sluice_e2e::target::{self, Target};

#[tokio::test]
async fn a_configured_real_cluster_answers_and_runs_the_chart() {
    if !target::cluster_mode() {
        sluice_testkit::prereq::unavailable("kind-cluster");
        return;
    }
    let cluster = Target::cluster()
        .await
        .unwrap_or_else(|e| panic!("SLUICE_E2E_CLUSTER=1 but {e}"));
    for component in [
        "rollout-weights",
        "wave-gate",
        "revert",
        "upgrade-revisions",
    ] {
        let log = cluster.operator_logs(component).await.unwrap_or_default();
        assert!(
            !log.is_empty(),
            "no log from the chart's {component} pods: is the chart installed (bash e2e/kind/up.sh)?"
        );
        cluster.assert_cluster_operator_not_denied(component).await;
    }
}
