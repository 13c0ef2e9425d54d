//! The upgrade-revisions operator: moving namespaces between Istio revision tags in waves
//! (`RevisionUpgrade`).
//!
//! `decide` holds the pure state machine, `pacing` the issuance budget, `fleet` the pure readings
//! of namespaces and pods, `validity` the checks CEL cannot express, `metrics` the operator's
//! Prometheus metrics, and `reconcile` the I/O: `cache` the watch caches it reads the fleet from,
//! `context` what every reconcile shares, `signals` the issuance counter and gate verdicts it
//! reads, and `restarts` the actions it carries out, restarts paced in the background. Never upgrades a revision in place, never removes
//! the old control plane, and never restarts pods above the issuance budget.
#![forbid(unsafe_code)]

pub mod availability_floor;
pub mod cache;
pub mod context;
pub mod decide;
pub mod fleet;
pub mod issuance;
pub mod metrics;
pub mod notice;
pub mod pacing;
pub mod reconcile;
pub mod restarts;
pub mod signals;
pub mod validity;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-upgrade-revisions";

/// The one field manager this operator writes under (status, namespace relabels, rollout
/// restarts).
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-upgrade-revisions");
