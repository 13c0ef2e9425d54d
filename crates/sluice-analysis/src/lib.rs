//! The gate analysis engine: batched PromQL gates with Pass / Fail / Inconclusive verdicts.
//!
//! Owns turning resolved gates (`sluice_api::v1alpha1::ResolvedGate`) of many owner objects into
//! a constant number of grouped PromQL queries per tick, splitting the answers back per object,
//! and the pure verdict rules. It never writes to the cluster: operators record the verdicts it
//! returns in their own status.
//!
//! - [`template`]: `{{variable}}` templates, escaping, batched rendering.
//! - [`builtin`]: the built-in gates on Istio's standard metrics (PromQL in `GATES.md`).
//! - [`decide`](mod@decide): pure verdict and sustained-Inconclusive rules.
//! - [`source`]: the Prometheus / Thanos Query HTTP provider.
//! - [`engine`]: planning, batching and the tick.
//! - [`mann_whitney`]: the optional canary-vs-stable U test over per-interval samples.
#![forbid(unsafe_code)]

pub mod builtin;
pub mod decide;
pub mod engine;
pub mod mann_whitney;
pub mod source;
pub mod template;

pub use decide::{
    BaselineReading, DistributionTest, GateAction, Observation, OwnerContext, action, decide,
};
pub use engine::{
    CheckError, CheckOutcome, Engine, EngineError, EngineOptions, GateCheck, MannWhitneyOptions,
    TickReport, Vars,
};
pub use source::{
    MetricsSource, PrometheusConfig, PrometheusSource, RangeValues, SeriesValue, SourceError,
};
