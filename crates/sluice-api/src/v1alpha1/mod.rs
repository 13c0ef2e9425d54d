//! sluice.dev/v1alpha1: every kind of the sluice API and the value types they share.
//!
//! Owns declarations only; never performs I/O.

pub mod bundle_pin;
pub mod common;
pub mod gate;
pub mod gate_template;
pub mod revision_upgrade;
pub mod rollout;
pub mod wave_gate;

pub use bundle_pin::{
    BundlePin, BundlePinPhase, BundlePinSpec, BundlePinStatus, KeylessIdentity, KeylessPolicy,
};
pub use common::{
    DurationParseError, DurationString, LocalObjectRef, NamespacedObjectRef, SecretKeysRef,
};
pub use gate::{
    AbsoluteComparison, BaselineSource, BuiltinGate, CapturedBaseline, Comparison, ComparisonOp,
    Gate, GateDefinition, GateQuery, GateResolveError, GateVerdict, InconclusiveAction,
    InconclusivePolicy, RelativeComparison, ResolvedGate, ShareComparison, Verdict, VerdictReason,
};
pub use gate_template::{GateTemplate, GateTemplateSpec, GateTemplateStatus};
pub use revision_upgrade::{
    RevisionUpgrade, RevisionUpgradePhase, RevisionUpgradeSpec, RevisionUpgradeStatus,
};
pub use rollout::{Rollout, RolloutPhase, RolloutSpec, RolloutStatus, RolloutStep};
pub use wave_gate::{ClusterDecision, WaveGate, WaveGatePhase, WaveGateSpec, WaveGateStatus};

/// The API group of every sluice kind.
pub const GROUP: &str = "sluice.dev";
/// The API version of this module's kinds.
pub const VERSION: &str = "v1alpha1";
