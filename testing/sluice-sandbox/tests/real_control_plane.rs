//! Every sandbox scenario on `--control-plane real`: each cluster a real kube-apiserver of its
//! own (one shared etcd), workload clusters with the real kube-controller-manager, the simulator
//! playing only the kubelet (Nodes, Leases, binding, readiness) and Istio's injector as a real
//! mutating webhook. Each run must exit 0 with the scenario's `pass` line and leave nothing
//! running; the figures each scenario promises are checked by its emulator test.
//!
//! One sandbox at a time: two at once on a small machine double each other's start.

mod common;

use std::sync::Mutex;
use std::time::Duration;

/// A watchdog on the whole run that only stops a hung run: the real control plane starts in
/// about 50 s on two cores (six API servers, four controller managers), the longest scenario
/// budget is 180 s (`canary-promote`), and stopping takes a few seconds. What fails a slow
/// scenario, with a message, is its own budget.
const BUDGET: Duration = Duration::from_secs(330);

static SERIAL: Mutex<()> = Mutex::new(());

fn run_real(name: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if sluice_testkit::control_plane::require().is_none() {
        return;
    }
    if let Some(run) = common::run_scenario_with(name, &["--control-plane", "real"], BUDGET) {
        println!("{name} on a real control plane: {}", run.last);
    }
}

#[test]
fn world_on_a_real_control_plane() {
    run_real("world");
}

#[test]
fn canary_abort_on_a_real_control_plane() {
    run_real("canary-abort");
}

#[test]
fn canary_grpc_on_a_real_control_plane() {
    run_real("canary-grpc");
}

#[test]
fn canary_grpc_mirror_on_a_real_control_plane() {
    run_real("canary-grpc-mirror");
}

#[test]
fn canary_pause_abort_on_a_real_control_plane() {
    run_real("canary-pause-abort");
}

#[test]
fn canary_promote_on_a_real_control_plane() {
    run_real("canary-promote");
}

#[test]
fn revision_upgrade_on_a_real_control_plane() {
    run_real("revision-upgrade");
}

#[test]
fn upgrade_no_pdb_on_a_real_control_plane() {
    run_real("upgrade-no-pdb");
}

#[test]
fn pin_release_on_a_real_control_plane() {
    run_real("pin-release");
}

#[test]
fn pin_exact_on_a_real_control_plane() {
    run_real("pin-exact");
}

#[test]
fn waves_clean_on_a_real_control_plane() {
    run_real("waves-clean");
}

// `waves-breach` runs on the real control plane with Thanos Query as its metrics source in
// `thanos_metrics.rs` (both real backends together; one run instead of two).
