//! Logging setup (tracing, text or JSON), and the plain-HTTP health server shared by the
//! long-running components (with `/metrics` only under `--metrics-secure=false`: by default
//! `crate::metrics_auth` serves it over HTTPS).

pub mod api_client;
pub mod process;

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
    /// None: no `/metrics` here (served over HTTPS by the `metrics_auth` module).
    metrics: Option<std::sync::Arc<dyn Fn() -> String + Send + Sync>>,
}

impl Health {
    pub fn new(
        ready: impl Fn() -> bool + Send + Sync + 'static,
        metrics: impl Fn() -> String + Send + Sync + 'static,
    ) -> Self {
        Health {
            ready: std::sync::Arc::new(ready),
            metrics: Some(std::sync::Arc::new(metrics)),
        }
    }

    /// `/healthz` and `/readyz` only: `/metrics` is served elsewhere (404 here).
    pub fn without_metrics(ready: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Health {
            ready: std::sync::Arc::new(ready),
            metrics: None,
        }
    }
}

/// Content type of the OpenMetrics text that [`encode`] writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What every component's `/metrics` also holds: the `process_*` series ([`process`]) and the
/// API client's ([`api_client`]).
static SHARED: std::sync::LazyLock<prometheus_client::registry::Registry> =
    std::sync::LazyLock::new(|| {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(process::ProcessCollector));
        api_client::register(&mut registry);
        registry
    });

/// The registry, then the process's and the API client's series, in OpenMetrics text.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    use prometheus_client::encoding::text;
    let mut out = String::new();
    let written = text::encode_registry(&mut out, registry)
        .and_then(|()| text::encode_registry(&mut out, &SHARED))
        .and_then(|()| text::encode_eof(&mut out));
    if let Err(e) = written {
        tracing::warn!(error = %e, "cannot encode metrics");
    }
    out
}

/// `/healthz` (always 200 while the process serves), `/readyz` (200 once ready, else 503) and,
/// unless [`Health::without_metrics`], `/metrics`.
pub fn health_router(health: Health) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let router = axum::Router::new()
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
        );
    let router = match health.metrics.clone() {
        None => router,
        Some(metrics) => router.route(
            "/metrics",
            get(move || async move { ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], metrics()) }),
        ),
    };
    router.with_state(health)
}

/// Limits of the plain-HTTP health listener: it answers probes and scrapes, so a connection
/// that is slow to ask, or too many at once, cannot hold it (issues 11 and 21). It is the
/// webhook's connection loop ([`crate::serving::serve_plain`]): when every slot is taken,
/// connections idle or stuck in a head are closed to make room, so hundreds of partial heads do
/// not keep the kubelet's probe waiting.
#[derive(Clone, Copy, Debug)]
pub struct HealthLimits {
    /// Most connections served at once; more wait in the listen backlog while idle and stuck
    /// ones are closed to make room.
    pub max_connections: usize,
    /// Largest request head (431 beyond it).
    pub max_header_bytes: usize,
    /// Longest wait for a request head (from the connection, or from its first byte after an
    /// answer).
    pub header_read_timeout: std::time::Duration,
    /// Longest a keep-alive connection may sit between requests (a scraper reconnects).
    pub idle_timeout: std::time::Duration,
}

impl Default for HealthLimits {
    fn default() -> Self {
        HealthLimits {
            max_connections: crate::serving::DEFAULT_MAX_CONNECTIONS,
            max_header_bytes: 16 * 1024,
            header_read_timeout: std::time::Duration::from_secs(5),
            idle_timeout: std::time::Duration::from_secs(60),
        }
    }
}

/// Serves [`health_router`] on `listener` until `shutdown` resolves, within [`HealthLimits`]'s
/// defaults.
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    serve_health_with(listener, health, HealthLimits::default(), shutdown).await;
}

/// [`serve_health`] within `limits`. At `shutdown`, requests in flight get a second to finish.
pub async fn serve_health_with(
    listener: tokio::net::TcpListener,
    health: Health,
    limits: HealthLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    crate::serving::serve_plain(
        listener,
        health_router(health),
        crate::serving::PlainLimits {
            max_connections: limits.max_connections,
            max_header_bytes: limits.max_header_bytes,
            header_read_timeout: limits.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            answer_bytes_in_flight: crate::serving::conn::DEFAULT_ANSWER_BYTES_IN_FLIGHT,
        },
        std::time::Duration::from_secs(1),
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn get(addr: std::net::SocketAddr, head: &[u8]) -> String {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(head).await.expect("write");
        let mut out = Vec::new();
        let _ = tcp.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Issue 11: the health listener has the webhook's kind of limits: slow and idle
    /// connections are cut, a full house makes newcomers wait only until then, and an oversized
    /// head gets 431.
    #[tokio::test]
    async fn the_health_listener_bounds_its_connections() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let limits = HealthLimits {
                max_connections: 4,
                max_header_bytes: 4096,
                header_read_timeout: Duration::from_millis(500),
                idle_timeout: Duration::from_secs(5),
            };
            let health = Health::new(|| true, String::new);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(serve_health_with(listener, health, limits, async {
                let _ = stopped.await;
            }));
            let ok = get(
                addr,
                b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            )
            .await;
            assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
            // Every slot taken by a slow loris: a probe waits for the header timeout, no more.
            let mut lorises = Vec::new();
            for _ in 0..8 {
                let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
                tcp.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
                    .await
                    .expect("write");
                lorises.push(tcp);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let started = Instant::now();
            let ok = get(
                addr,
                b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            )
            .await;
            assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
            for mut tcp in lorises {
                let mut rest = Vec::new();
                let _ = tcp.read_to_end(&mut rest).await;
            }
            // An oversized head.
            let mut head = b"GET /metrics HTTP/1.1\r\nx-big: ".to_vec();
            head.extend(std::iter::repeat_n(b'a', 8192));
            head.extend_from_slice(b"\r\n\r\n");
            let big = get(addr, &head).await;
            assert!(big.starts_with("HTTP/1.1 431"), "{big}");
            let _ = stop.send(());
            server.await.expect("server");
        })
        .await
        .expect("finished in time");
    }
}
