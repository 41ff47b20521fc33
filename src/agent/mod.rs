//! The `agent` subcommand. STUB: being built.

pub mod contract;

use std::process::ExitCode;

use crate::cli::Global;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("agent: {0}")]
    Other(String),
}

/// Flags of `jobset-inplace agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {}

impl Args {
    pub async fn run(self, _global: Global) -> crate::Result<ExitCode> {
        Err(crate::Error::NotBuilt("agent"))
    }
}
