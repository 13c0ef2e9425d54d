//! The wave-gate operator: which revision each cluster of a site is admitted to (a `WaveGate`'s `status.decisions`).
//!
//! `decide` holds the pure logic, `reconcile` the I/O, `validity` the checks CEL cannot
//! express. Never publishes a status without the complete decisions list, and never writes an Argo CD object beyond a refresh nudge.
#![forbid(unsafe_code)]

pub mod decide;
pub mod reconcile;
pub mod validity;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-wave-gate";

/// The one field manager this operator writes under.
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-wave-gate");
