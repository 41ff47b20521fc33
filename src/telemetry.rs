//! Logging setup (tracing, text or JSON), and the plain-HTTP health and metrics server shared
//! by the long-running components.

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
    #[error("invalid --log-level {level:?}: {source}")]
    LogLevel {
        level: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Installs the global tracing subscriber, writing to stderr. `level` is an `EnvFilter`
/// directive (`info`, `debug`, `jobset_inplace=debug,kube=info`, ...).
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), Error> {
    let filter = EnvFilter::try_new(level).map_err(|source| Error::LogLevel {
        level: level.to_owned(),
        source,
    })?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second initialisation (tests) is not an error worth failing on.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}

/// Errors of the health/metrics server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {flag} {addr}: {source}")]
    Bind {
        flag: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds a listener, naming the flag in the error.
pub async fn bind(
    addr: std::net::SocketAddr,
    flag: &'static str,
) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve(ServeError::Bind { flag, addr, source }))
}

/// What the plain-HTTP health server answers: readiness, and the metrics text.
#[derive(Clone)]
pub struct Health {
    ready: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
    metrics: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
}

impl Health {
    pub fn new(
        ready: impl Fn() -> bool + Send + Sync + 'static,
        metrics: impl Fn() -> String + Send + Sync + 'static,
    ) -> Self {
        Health {
            ready: std::sync::Arc::new(ready),
            metrics: std::sync::Arc::new(metrics),
        }
    }
}

/// Content type of the OpenMetrics text that [`encode`] writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry in OpenMetrics text.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "cannot encode metrics");
    }
    out
}

/// `/healthz` (always 200 while the process serves), `/readyz` (200 once ready, else 503) and
/// `/metrics`.
pub fn health_router(health: Health) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(
                |axum::extract::State(h): axum::extract::State<Health>| async move {
                    if (h.ready)() {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                },
            ),
        )
        .route(
            "/metrics",
            get(
                |axum::extract::State(h): axum::extract::State<Health>| async move {
                    (
                        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
                        (h.metrics)(),
                    )
                },
            ),
        )
        .with_state(health)
}

/// Serves [`health_router`] on `listener` until `shutdown` resolves.
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    if let Err(e) = axum::serve(listener, health_router(health))
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::warn!(error = %e, "health server stopped");
    }
}
