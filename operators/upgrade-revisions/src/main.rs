//! Binary entry point of sluice-upgrade-revisions.
#![forbid(unsafe_code)]
fn main() {}
