//! jobset-inplace: fast in-place group restarts for JobSets.
//!
//! One binary (`jobset-inplace`), one subcommand per component. Imports run one way, from the
//! top of this list to the bottom (docs/architecture.md, "Layers"):
//!
//! - [`cli`] composes the subcommands; [`error`] is the error any of them can end with;
//! - [`webhook`]: the HTTPS admission server; [`offline`]: `inject`, `check`, `review` without a
//!   cluster; [`inspect`]: `doctor` and `status` for operators (read-only);
//! - [`admission`]: the pure validation and mutation of InPlaceRestart JobSets, and the
//!   AdmissionReview handling shared by the webhook and the offline commands;
//! - [`reconciler`]: the epoch reconciler; [`agent`]: the sidecar in every worker pod;
//!   [`certs`]: CA and serving certificates;
//! - at the bottom, what they share: [`protocol`] (the epoch protocol's dialects and pure
//!   decisions), [`deadline`] (the pure decision of what to do about a group restart that does
//!   not complete), [`wire`] (what crosses between components through Kubernetes objects and env),
//!   [`jobset`] (the JobSet model), [`settings`] (global flags and parsers), [`shutdown`]
//!   (signals), [`telemetry`] (logging, health and metrics endpoint) and [`retry`] (backoff and
//!   `Retry-After`).
//!
//! The test API server, the simulated kubelet and the other test helpers are the
//! `jobset-inplace-testkit` crate (`testkit/`), never built into the binary.
#![forbid(unsafe_code)]
// No panic on input from the network, a file or the environment: shipped code returns errors.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod admission;
pub mod agent;
pub mod certs;
pub mod cli;
pub mod deadline;
pub mod error;
pub mod inspect;
pub mod jobset;
pub mod metrics_auth;
pub mod offline;
pub mod protocol;
pub mod reconciler;
pub mod retry;
pub mod serving;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod webhook;
pub mod wire;

pub use error::{Error, Result};
