//! The sluice.dev API: every CRD type, the pure validation of what CEL cannot express, and typed
//! views of the external objects sluice reads and writes.
//!
//! Declares types and pure helpers only; never talks to a cluster.
#![forbid(unsafe_code)]

pub mod crds;
pub mod external;
pub mod v1alpha1;
pub mod validation;
