//! The crate error: one variant per component, each wrapping that component's own error enum.

/// Any error a subcommand can end with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Admission(#[from] crate::admission::Error),
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
    #[error("the {0} subcommand is not built yet")]
    NotBuilt(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
