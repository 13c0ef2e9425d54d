//! The gate analysis engine: batched PromQL gates with Pass / Fail / Inconclusive verdicts.
//!
//! Owns turning resolved gates (`sluice_api::v1alpha1::ResolvedGate`) of many owner objects into
//! a constant number of grouped PromQL queries per tick, splitting the answers back per object,
//! and the pure verdict rules. It never writes to the cluster: operators record the verdicts it
//! returns in their own status.
//!
//! - [`template`]: `{{variable}}` templates, escaping, batched rendering.
//! - [`builtin`]: the built-in gates on Istio's standard metrics (PromQL in `GATES.md`).
//! - [`decide`](mod@decide): pure verdict and sustained-Inconclusive rules, and one action for
//!   several gates.
//! - [`gate_templates`]: an owner's gates against the GateTemplates they name, each read once,
//!   resolved with the owner's Inconclusive policy.
//! - [`source`]: the Prometheus / Thanos Query HTTP provider.
//! - [`args`]: the flags every operator takes to reach it (credentials, headers, CA, timeout).
//! - [`engine`]: planning, batching and the tick.
//! - [`mann_whitney`]: the optional canary-vs-stable U test over per-interval samples.
//!
//! An operator builds one [`Engine`] and, each analysis interval, hands it every active gate
//! instance as a [`GateCheck`] (the resolved gate, the owner's variables, the previous verdict
//! from status), records the returned verdicts in status, and acts on [`action`]:
//!
//! ```no_run
//! use sluice_analysis::{Engine, EngineOptions, GateAction, GateCheck, PrometheusConfig, PrometheusSource, action};
//! use sluice_api::v1alpha1::{BuiltinGate, Gate};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let source = PrometheusSource::new(PrometheusConfig::new("http://thanos-query.monitoring:9090"));
//! let engine = Engine::new(source, EngineOptions::default())?;
//! let gate = Gate::builtin("errors", BuiltinGate::ErrorRatioVsStable).resolve(None)?;
//! let vars = [
//!     ("cluster", "eu-1"),
//!     ("namespace", "shop"),
//!     ("canaryService", "checkout-v2"),
//!     ("stableService", "checkout-v1"),
//! ]
//! .into_iter()
//! .map(|(k, v)| (k.to_string(), v.to_string()))
//! .collect();
//! let check = GateCheck::new("Rollout shop/checkout", gate, vars);
//! let now = jiff::Timestamp::now();
//! let report = engine.tick(std::slice::from_ref(&check), now).await;
//! let verdict = report.outcomes[0].verdict.clone()?; // Err: the gate is misconfigured
//! if action(&check.gate, &verdict, now) == GateAction::Abort {
//!     // set the canary weight to 0
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod args;
pub mod builtin;
pub mod decide;
pub mod engine;
pub mod gate_templates;
pub mod mann_whitney;
pub mod sequential;
pub mod source;
pub mod template;

pub use args::{ClusterGateArgs, MetricsSourceArgs};
pub use builtin::{Reporter, ServiceScope, SourceWorkloads};
pub use decide::{
    BaselineReading, DistributionTest, GateAction, Observation, OwnerContext, action,
    combined_action, decide, policy_action, unevaluated,
};
pub use engine::{
    CheckError, CheckOutcome, Engine, EngineError, EngineOptions, GateCheck, MannWhitneyOptions,
    TickReport, Vars,
};
pub use gate_templates::{GateTemplates, read_templates, resolve_gate, template_names};
pub use source::{
    BasicAuth, MetricsSource, PrometheusConfig, PrometheusSource, RangeValues, SeriesValue,
    SourceError,
};
