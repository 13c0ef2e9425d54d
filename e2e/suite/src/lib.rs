//! The end-to-end suite under real RBAC: renders the chart with helm, loads exactly the RBAC it
//! grants each operator into a Kubernetes API emulator with RBAC enforced (or uses a real
//! cluster where the chart is installed), runs each operator binary authenticated as its
//! ServiceAccount and reads its log for denials. Owns the plumbing of the scenarios in `tests/`;
//! never grants an operator anything the chart does not render.

pub mod binaries;
pub mod chart;
pub mod process;
pub mod target;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The released upstream CRDs the install script fetched (`.tools/crds`), or `None` when they
/// are missing (the test then fails under CI and is skipped and counted otherwise).
pub fn upstream() -> Option<PathBuf> {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
}

/// Polls `check` until it returns `Ok`, or panics after `budget` naming `what` and the last
/// state `check` described.
pub async fn eventually<T>(
    what: &str,
    budget: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + budget;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("timed out after {budget:?} waiting for {what}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
