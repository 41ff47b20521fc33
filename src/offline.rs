//! Offline `inject`, `check` and `review`: the webhook's code path without a cluster.
//! STUB: being built.

use std::process::ExitCode;

use crate::cli::Global;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Other(String),
}

/// Flags of `jobset-inplace inject`.
#[derive(Clone, Debug, clap::Args)]
pub struct InjectArgs {}
/// Flags of `jobset-inplace check`.
#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {}
/// Flags of `jobset-inplace review`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReviewArgs {}

impl InjectArgs {
    pub async fn run(self, _global: Global) -> crate::Result<ExitCode> {
        Err(crate::Error::NotBuilt("inject"))
    }
}
impl CheckArgs {
    pub async fn run(self, _global: Global) -> crate::Result<ExitCode> {
        Err(crate::Error::NotBuilt("check"))
    }
}
impl ReviewArgs {
    pub async fn run(self, _global: Global) -> crate::Result<ExitCode> {
        Err(crate::Error::NotBuilt("review"))
    }
}
