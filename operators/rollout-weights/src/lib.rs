//! The rollout-weights operator: canary weights on a Gateway API HTTPRoute for the life of a `Rollout`.
//!
//! Pure logic: `decide` (validity, then the state machine in `decide::machine`),
//! `route` (the route seam: each route kind's resource, ownership and weights), `route_edit`
//! (HTTPRoute editing), `observe` (route and workload readings), `analysis` (gate
//! checks and the analysis schedule; its batcher shares one engine), `record` (the outcomes of
//! the reconcile's writes folded into the decided status). I/O: `reconcile`.
//! `metrics` registers every metric. `template_status` writes every GateTemplate's `Ready`. Never writes a route it does not own, and never writes
//! outside its field manager.
#![forbid(unsafe_code)]

pub mod analysis;
pub mod baseline;
pub mod decide;
pub mod metrics;
pub mod notice;
pub mod observe;
pub mod orphans;
pub mod reconcile;
pub mod record;
pub mod route;
pub mod route_edit;
pub mod template_status;
pub mod triggers;
pub mod validity;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-rollout-weights";

/// Which changes of a Rollout start a reconcile: every one, including the echo of the operator's
/// own status writes. Measured at 1,000 Rollouts and 30 s (`examples/scale.rs`, `--status-echoes`):
/// the echoes are about half of all reconciles, but they make no request (the status read back is
/// the one written, so nothing is written again) and leaving them out changed neither the CPU
/// used nor the abort's delay, so the operator keeps kube-runtime's default.
pub const PRIMARY_CHANGES: sluice_runtime::changes::PrimaryChanges =
    sluice_runtime::changes::PrimaryChanges::Every;

/// The one field manager this operator writes under.
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-rollout-weights");
