//! The upgrade-revisions operator: moving namespaces between Istio revision tags in waves (`RevisionUpgrade`).
//!
//! `decide` holds the pure logic, `reconcile` the I/O, `validity` the checks CEL cannot
//! express. Never upgrades a revision in place and never restarts pods above the issuance budget.
#![forbid(unsafe_code)]

pub mod decide;
pub mod fleet;
pub mod metrics;
pub mod pacing;
pub mod reconcile;
pub mod validity;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-upgrade-revisions";

/// The one field manager this operator writes under.
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-upgrade-revisions");
