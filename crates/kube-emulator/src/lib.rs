//! A Kubernetes API emulator on loopback for sluice's tests, benchmarks and sandbox. Never part of an
//! operator binary.
#![forbid(unsafe_code)]

pub mod admission;
pub mod rbac;
pub mod validation;
