//! Binary entry point of sluice-revert.
#![forbid(unsafe_code)]
fn main() {}
