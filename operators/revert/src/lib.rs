//! The revert operator: pinning Argo CD Applications to a signed bundle (`BundlePin`).
//!
//! `decide` holds the pure logic (the state machine), `reconcile` the I/O, `verify` the verification of the pinned bundle (signature, keys, kinds) and its cache, `binding` what ties a pin to its Application, `validity` the checks
//! CEL cannot express, `clusters` revert's own identity per destination cluster, `controller` the controller loop
//! with its Application watch, `apply` the
//! writes to a destination, `restore` what an exact restore removes and compares, `tracking` Argo CD's resource tracking on written objects, `record` the pure fold of what the effects report into the status, `metrics` the `sluice_revert_*` metrics.
//! Never applies anything before the signature and the bundle's kinds are verified.
#![forbid(unsafe_code)]

pub mod apply;
pub mod binding;
pub mod clusters;
pub mod controller;
pub mod decide;
pub mod metrics;
pub mod notice;
pub mod policy;
pub mod reconcile;
pub mod record;
pub mod registry;
pub mod restore;
pub mod tracking;
pub mod validity;
pub mod verify;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-revert";

/// Finalizer a BundlePin carries once it may have touched an Application: deleting the pin
/// then releases it (sync restored exactly, field ownership dropped) before it goes.
pub const FINALIZER: &str = "sluice.dev/bundlepin-release";

/// The one field manager this operator writes under.
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-revert");
