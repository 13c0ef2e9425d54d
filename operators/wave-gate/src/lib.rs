//! The wave-gate operator: which revision each cluster of a site is admitted to (a `WaveGate`'s
//! `status.decisions`), wave by wave, judged on mesh signals.
//!
//! `decide` holds the pure state machine, `decisions` the complete-list invariant, `pins` the
//! BundlePins of a halt, `gates` the gate checks of a wave, `metrics` the operator's metrics,
//! `cache` the watch caches of Applications and pins, `reconcile` the I/O, `validity` the checks CEL cannot express. Never publishes a status
//! without the complete decisions list once published, and never writes an Argo CD object beyond
//! a refresh nudge.
#![forbid(unsafe_code)]

pub mod cache;
pub mod decide;
pub mod decisions;
pub mod gates;
pub mod metrics;
pub mod notice;
pub mod pins;
pub mod reconcile;
pub mod validity;

use sluice_runtime::FieldManager;

/// The operator's name: Lease name, Event reporter, binary name.
pub const OPERATOR: &str = "sluice-wave-gate";

/// The one field manager this operator writes under: the WaveGate status subresource (every
/// field of `status`), the BundlePins it creates, and the ApplicationSet refresh annotation
/// ([`reconcile::REFRESH_ANNOTATION`]). Nothing else.
pub const FIELD_MANAGER: FieldManager = FieldManager::new("sluice-wave-gate");
