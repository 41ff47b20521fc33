//! The webhook's certificates on the test API server: in-cluster renewal and rotation over time.

mod cluster;
mod rotation;
