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

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The released upstream CRDs the install script fetched (`.tools/crds`), or `None` when they
/// are missing (the test then fails under CI and is skipped and counted otherwise).
pub fn upstream() -> Option<PathBuf> {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
}

/// The one wait of the test kit: polls a check until it holds, or panics naming what was
/// awaited and the last state the check described.
pub use sluice_testkit::eventually::eventually;
