//! Binary entry point of sluice-wave-gate.
#![forbid(unsafe_code)]
fn main() {}
