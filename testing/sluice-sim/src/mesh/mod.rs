//! Mesh telemetry: what Istio's proxies and control plane would report for the simulated
//! services, written to a real Prometheus by remote write. Traffic follows the HTTPRoute (for a
//! gRPC service, GRPCRoute) rules stored in the API (read every tick), after a propagation delay, optionally distorted; faults
//! and control-plane signals come from scenario data files. Metric names, labels and the write
//! interval are a contract, documented in `testing/sluice-sim/CONTRACT.md`. Never writes to the
//! Kubernetes API.

pub mod latency;
pub mod route;
pub mod scenario;
pub mod series;
pub mod split;
pub mod telemetry;

pub use scenario::{Event, MeshFailure, Protocol, ResponseFlag, Scenario};
pub use telemetry::{DEFAULT_INTERVAL, MeshCluster, MeshStats, MeshTelemetry};
