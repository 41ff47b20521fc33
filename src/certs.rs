//! CA and serving certificates (rcgen). STUB: being built.

use std::process::ExitCode;

use crate::cli::Global;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("certs: {0}")]
    Other(String),
}

/// Flags of `jobset-inplace certs`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {}

impl Args {
    pub async fn run(self, _global: Global) -> crate::Result<ExitCode> {
        Err(crate::Error::NotBuilt("certs"))
    }
}
