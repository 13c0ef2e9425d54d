//! `sluice-sandbox --scenario pin-release`: a bad checkout change synced by Argo CD
//! into east-1 is pinned back to the previous signed bundle with a BundlePin; Argo CD does not
//! re-apply it while pinned; revert's branch, merged in Git, reaches Argo CD with equal content
//! and the pin releases. The binary exits 0 with the JSON result as its last line, and nothing it
//! started is left running.
//! The run is checked by [`common::dashboards`] too: every dashboard and alert query runs
//! against the sandbox's Prometheus during it; the BundlePins dashboard's queries return data,
//! and SluiceBundlePinTooOld names the pin.
//! `pin-exact`: a bad change that adds fields outside atomic lists (a DestinationRule
//! connectionPool, a route annotation) leaves none of them live once pinned, nor while pinned.

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

/// `pin-exact`'s own budget (90 s) and the start and stop around it.
const EXACT_BUDGET: Duration = Duration::from_secs(130);

#[test]
fn a_pin_leaves_no_field_of_the_bad_change_live_and_releases() {
    let Some(run) = common::run_scenario("pin-exact", EXACT_BUDGET) else {
        return;
    };
    let (result, last) = (&run.result, &run.last);
    // `pass` already says no bad field was live while pinned and the policy came back.
    assert_eq!(result["bad_fields_at_pinned"].as_u64(), Some(0), "{last}");
    let pin_ms = run.ms("pin_ms");
    assert!(pin_ms < 30_000, "pin_ms {pin_ms}: {last}");
    assert!(
        result["release_ms"].as_u64().is_some(),
        "release_ms missing: {last}"
    );
}
