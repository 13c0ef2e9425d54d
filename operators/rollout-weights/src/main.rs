//! Binary entry point of sluice-rollout-weights.
#![forbid(unsafe_code)]
fn main() {}
