//! Test support shared by unit tests, integration tests, the simulator and benchmarks:
//! the in-repo Kubernetes test API server (design.md §5) and the simulated kubelet and
//! Job/JobSet controllers that drive the real agent and reconciler against it.

pub mod apiserver;
pub mod kubelet;
