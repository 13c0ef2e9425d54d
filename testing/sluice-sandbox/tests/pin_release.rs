//! `sluice-sandbox --scenario pin-release`: a bad checkout change synced by Argo CD
//! into east-1 is pinned back to the previous signed bundle with a BundlePin; Argo CD does not
//! re-apply it while pinned; revert's branch, merged in Git, reaches Argo CD with equal content
//! and the pin releases. The binary exits 0 with the JSON result as its last line, and nothing it
//! started is left running.
//! The run is checked by [`common::dashboards`] too: every dashboard and alert query runs
//! against the sandbox's Prometheus during it; the BundlePins dashboard's queries return data,
//! and SluiceBundlePinTooOld names the pin.

mod common;

use std::time::Duration;

/// The whole run (start, scenario, stop, the last evaluation round). On an idle machine it
/// takes well under a minute.
const BUDGET: Duration = Duration::from_secs(130);

#[test]
fn pin_release_pins_holds_reverts_in_git_and_releases() {
    let Some(run) = common::dashboards::run_scenario_checked(
        "pin-release",
        BUDGET,
        Some("pins.json"),
        ("pins.json", "east-mgmt", "argocd", "checkout-bad-split"),
    ) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    let pin_ms = result["pin_ms"].as_u64().expect("pin_ms is a number");
    assert!(
        pin_ms > 0 && pin_ms < 30_000,
        "pin_ms {pin_ms} is not a few seconds: {last}"
    );
    assert!(
        result["release_ms"].as_u64().is_some(),
        "release_ms missing: {last}"
    );
    assert_eq!(
        result["pin_pruned_objects"].as_u64(),
        Some(1),
        "the route the bad change added is pruned: {last}"
    );
    assert!(
        result["pin_applied_objects"].as_u64() >= Some(1),
        "the checkout route is applied: {last}"
    );
    // The pin's name, then the start of its UID (a pin name reused later gets a new branch).
    let branch = result["revert_branch"].as_str().unwrap_or_default();
    let uid = branch.strip_prefix("sluice/revert/argocd/checkout-bad-split-");
    assert!(
        uid.is_some_and(|u| u.len() == 8 && u.chars().all(|c| c.is_ascii_hexdigit())),
        "revert branch {branch:?}: {last}"
    );
    assert_ne!(
        result["pinned_digest"], result["released_at_digest"],
        "release happens at the merged revert's own digest, not the pinned one: {last}"
    );
}
