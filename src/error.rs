//! The crate error: what a subcommand can end with, one variant per component, each wrapping that
//! component's own error enum. Only the command line ([`crate::cli`]) and `main` read it: every
//! component returns its own error, so no component imports this module.

/// Any error a subcommand can end with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Webhook(#[from] crate::webhook::Error),
    #[error(transparent)]
    Certs(#[from] crate::certs::Error),
    #[error(transparent)]
    Reconciler(#[from] crate::reconciler::Error),
    #[error(transparent)]
    Agent(#[from] crate::agent::Error),
    #[error(transparent)]
    Offline(#[from] crate::offline::Error),
    #[error(transparent)]
    Inspect(#[from] crate::inspect::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::Error),
}

impl Error {
    /// The process's exit code for this error: 2 for what `inject`, `check` and `review` could
    /// not read or write (docs/reference.md, "Exit codes"), 1 for a denial of `inject` and for
    /// every other component's error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Offline(e) => e.exit_code(),
            _ => 1,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
