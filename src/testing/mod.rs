//! Test support shared by unit tests, integration tests, the simulator and benchmarks:
//! the in-repo Kubernetes test API server (design.md §5).

pub mod apiserver;
