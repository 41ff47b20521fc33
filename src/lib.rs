//! jobset-inplace: fast in-place group restarts for JobSets.
//!
//! One crate, one binary (`jobset-inplace`) with these components:
//! - [`admission`]: the pure validation and mutation of InPlaceRestart JobSets, and the
//!   AdmissionReview handling shared by the HTTPS server and the offline commands;
//! - [`webhook`]: the HTTPS admission server;
//! - [`reconciler`]: the epoch reconciler;
//! - [`agent`]: the sidecar in every worker pod;
//! - [`certs`]: CA and serving certificates;
//! - [`offline`]: `inject`, `check`, `review` without a cluster;
//! - [`protocol`]: the epoch protocol's dialects and pure decisions;
//! - [`jobset`]: the JobSet model;
//! - [`retry`]: retry timing shared by the agent and the reconciler (`Retry-After`);
#![forbid(unsafe_code)]

pub mod admission;
pub mod agent;
pub mod certs;
pub mod cli;
pub mod error;
pub mod jobset;
pub mod offline;
pub mod protocol;
pub mod reconciler;
pub mod retry;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod webhook;
pub mod wire;

pub use error::{Error, Result};
