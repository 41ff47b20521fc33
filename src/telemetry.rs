//! Logging setup (tracing, text or JSON).

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for clusters.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid --log-level {level:?}: {reason}")]
    LogLevel { level: String, reason: String },
}

/// Installs the global tracing subscriber, writing to stderr. `level` is an `EnvFilter`
/// directive (`info`, `debug`, `jobset_inplace=debug,kube=info`, ...).
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), Error> {
    let filter = EnvFilter::try_new(level).map_err(|e| Error::LogLevel {
        level: level.to_owned(),
        reason: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests) is not an error worth failing on.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}
