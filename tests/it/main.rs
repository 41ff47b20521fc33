//! The integration tests, one binary (`cargo test --test it [filter]`), one module per area; a
//! test's name is its path: `cargo test --test it reconciler::deadline::`. `tests/real_cluster/`,
//! `tests/real_node/` and `tests/helm/` stay binaries of their own: CI runs them by name
//! against a real control plane or node.
//!
//! One process runs every test here (two at a time, as `cargo test` sets the threads), so a test
//! sets no process-wide state of its own: no environment variables, one tracing subscriber for
//! all ([`logs`]), and a child process re-runs a test by its full name (`admission::bounds`).

mod admission;
mod agent;
mod apiserver;
mod architecture;
mod certs;
mod cli;
mod deploy;
mod docs;
mod fuzz_corpus;
mod logs;
mod model_check;
mod observability;
mod reconciler;
mod system;
mod webhook;
