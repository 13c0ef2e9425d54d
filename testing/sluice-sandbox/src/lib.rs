//! The sluice sandbox: `cargo run -p sluice-sandbox` starts two sites of emulated clusters with
//! Prometheus, the OCI registry, a git intent repository, the mesh simulator and the operator
//! binaries, prints `export KUBECONFIG=...`, narrates what happens and stops cleanly on
//! Ctrl-C/SIGTERM. Scenario mode (`--scenario NAME --until-done`) runs one scenario from the
//! [`scenarios`] registry and prints one JSON result line last.
//!
//! Test and demo infrastructure: never a dependency of an operator binary.
#![forbid(unsafe_code)]

pub mod baseline;
pub mod kubeconfig;
pub mod metrics;
pub mod narrate;
pub mod operators;
pub mod prerequisites;
pub mod sandbox;
pub mod scenarios;
pub mod share;
pub mod topology;

pub use sandbox::{Options, Sandbox, SandboxError};
