//! The local world sluice's end-to-end tests and sandbox stand on: a deliberately small model of the
//! cluster behaviour that kube-controller-manager, the kubelet and Istio's sidecar injector provide
//! ([`cluster`]), and mesh telemetry written to a real Prometheus by remote write ([`mesh`]), both
//! started and stopped together by a [`world::World`].
//!
//! Everything here talks to Kubernetes only through `kube::Client`, so it runs against the API
//! emulator and against a real cluster alike. It is test and sandbox infrastructure: never a
//! dependency of an operator binary.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod duration;
pub mod mesh;
pub mod world;

pub use cluster::{ClusterConfig, SvidCounter};
pub use mesh::scenario::Scenario;
pub use world::{World, WorldBuilder};
