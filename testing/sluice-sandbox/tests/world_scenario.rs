//! `sluice-sandbox --scenario world --until-done`: the sandbox starts both sites, the scenario
//! measures the 90/10 route's canary share in Prometheus and has Argo CD sync a signed bundle
//! into east-1; the binary exits 0 with the JSON result as its last line, and nothing it started
//! is left: no process, no listening port, no work directory.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop) must fit in this. On an idle machine it takes well
/// under a minute; the margin is for a loaded one.
const BUDGET: Duration = Duration::from_secs(170);

#[test]
fn world_scenario_passes_and_leaves_nothing_behind() {
    let _one = common::one_sandbox();
    if !common::prerequisites() {
        return;
    }
    let Some((flags, budget)) = common::on_control_plane(&[], BUDGET) else {
        return;
    };
    let mut args = vec!["--scenario", "world", "--until-done", "--base-port", "0"];
    args.extend(flags);
    let mut run = common::start(&args);
    let pid = run.child.id();
    let status = run.wait_exit(budget);
    let last = run.seen.last().cloned().unwrap_or_default();
    assert!(status.success(), "exit {status:?}; last line: {last}");
    let result: serde_json::Value = serde_json::from_str(&last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    assert_eq!(result["scenario"], "world");
    assert_eq!(result["outcome"], "pass", "{last}");
    let share = result["canary_share"]
        .as_f64()
        .expect("canary_share is a number");
    assert!(
        (share - 0.10).abs() <= 0.02,
        "canary_share {share} not near 0.10"
    );

    assert!(
        run.descendants.len() >= 2,
        "expected to have seen at least Prometheus and the registry as children of {pid}, saw {:?}",
        run.descendants
    );
    let left = run.leftovers();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let ports = run.printed_ports();
    assert!(
        ports.len() >= 8,
        "expected the clusters', Prometheus' and the registry's ports, got {ports:?}"
    );
    let open = run.open_ports(&ports);
    assert!(
        open.is_empty(),
        "ports still listening after exit: {open:?}"
    );
    let dir = run
        .work_dir()
        .expect("the sandbox announces its work directory");
    assert!(
        !dir.exists(),
        "work directory {} was not removed",
        dir.display()
    );
}
