//! What every sluice operator binary shares: configuration, the Kubernetes client, tracing,
//! leader election, the metrics and health server, Events, condition helpers, fenced writes,
//! projections of watches, bounded error categories, webhook notifications and the bootstrap
//! that wires them together.
//!
//! This crate only wires I/O; it never decides anything about a sluice kind.
#![forbid(unsafe_code)]

pub mod changes;
pub mod client;
pub mod conditions;
pub mod config;
pub mod decision;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod notify;
pub mod operator;
pub mod projection;
pub mod server;
pub mod telemetry;
pub mod validity;
pub mod write;

#[cfg(test)]
mod testing;

pub use config::{OperatorCli, RuntimeArgs};
pub use error::{Categorized, Category};
pub use operator::Runtime;
pub use write::FieldManager;

/// Re-exported so operators name the same kube-runtime types the runtime uses.
pub use kube::runtime::controller::Action;

/// Implements `Debug` for a type by its name alone: an operator's context, caches and verifiers
/// hold clients, closures and key material with nothing worth printing.
///
/// ```
/// struct Context {
///     _clock: fn() -> u64,
/// }
/// sluice_runtime::opaque_debug!(Context);
/// assert_eq!(format!("{:?}", Context { _clock: || 0 }), "Context { .. }");
/// ```
#[macro_export]
macro_rules! opaque_debug {
    ($type:ident) => {
        impl std::fmt::Debug for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($type)).finish_non_exhaustive()
            }
        }
    };
}
