//! The rollout-weights operator: canary weights on a Gateway API HTTPRoute for the life of a `Rollout`.
//!
//! `decide` holds the pure logic, `reconcile` the I/O, `validity` the checks CEL cannot
//! express. Never writes a route it does not own, and never writes outside its field manager.
#![forbid(unsafe_code)]

pub mod decide;
pub mod reconcile;
pub mod route_edit;
pub mod step;
pub mod validity;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-rollout-weights";

/// The one field manager this operator writes under.
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-rollout-weights");
