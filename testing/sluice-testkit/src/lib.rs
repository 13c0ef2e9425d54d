//! Test-only fixtures for sluice: real services on loopback (Prometheus, the OCI registry, git), the
//! one way a test waits on them (`eventually`) and, later, the simulated world.
//! Never a dependency of an operator binary.
#![forbid(unsafe_code)]

pub mod control_plane;
pub mod controller;
pub mod crds;
pub mod events;
pub mod eventually;
pub mod git;
mod http_head;
pub mod invalid_spec;
pub mod mesh_config;
pub mod operator_binary;
pub mod prereq;
pub mod prometheus;
pub mod rbac;
pub mod referrers_api;
pub mod registry;
pub mod registry_token;
pub mod remote_write;
pub mod secrets;
pub mod sigstore;
pub mod thanos;
