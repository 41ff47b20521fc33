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

pub type Result<T, E = Error> = std::result::Result<T, E>;
