//! sluice.dev/v1alpha1: every kind of the sluice API and the value types they share.
//!
//! Owns declarations only; never performs I/O.

pub mod common;
pub mod gate;
pub mod gate_template;

pub use common::{DurationString, LocalObjectRef, NamespacedObjectRef, SecretKeysRef};
pub use gate::{
    AbsoluteComparison, BaselineSource, BuiltinGate, CapturedBaseline, Comparison, ComparisonOp,
    Gate, GateDefinition, GateQuery, GateResolveError, GateVerdict, InconclusiveAction,
    InconclusivePolicy, RelativeComparison, ResolvedGate, ShareComparison, Verdict, VerdictReason,
};
pub use gate_template::{GateTemplate, GateTemplateSpec};

/// The API group of every sluice kind.
pub const GROUP: &str = "sluice.dev";
/// The API version of this module's kinds.
pub const VERSION: &str = "v1alpha1";
