//! The webhook's listeners: the HTTPS listener of the routes of [`super::routes`] and the
//! plain-HTTP health listener, both on the connection loop of [`crate::serving`], until a
//! shutdown future resolves.
//!
//! Against slow, idle, many and large: HTTP/1.1 only (ALPN `http/1.1`, so no HTTP/2 stream
//! limits or reset floods to manage; the API server falls back to HTTP/1.1); TLS 1.2 and 1.3
//! only; a deadline for the TLS handshake and for each request head (64 KiB at most, else 431),
//! another for each body (408, in the routes), an idle timeout between requests, connection
//! caps with eviction and the answer budget ([`crate::serving`]); on shutdown, an optional drain
//! that closes each connection after its next answer.
//!
//! See docs/architecture.md ("Webhook").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::Error;
use super::routes::{BodyLimits, Handlers, Webhook, admission_routes, health_router_with};
use super::tls::{ReloadingCert, server_config};
use crate::serving::conn::{AnswerBudget, DEFAULT_ANSWER_BYTES_IN_FLIGHT, Timeouts};
use crate::serving::{Common, Limits, accept_loop, wait_stop};

/// How [`serve`] runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The serving certificate (PEM chain, leaf first).
    pub tls_cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub tls_key: std::path::PathBuf,
    /// How often the two files are polled for a new pair.
    pub reload_interval: Duration,
    /// Longest wait for a TLS handshake, and for a request's head: from the end of the handshake
    /// for the first request, from its first byte for the next ones.
    pub header_read_timeout: Duration,
    /// Longest a keep-alive connection may sit between requests.
    pub idle_timeout: Duration,
    /// Most connections open at once, per listener. When every slot is taken, new connections
    /// wait in the listen backlog while idle connections (and handshakes or heads stuck for
    /// [`crate::serving::conn::EVICTABLE_AFTER`]) are closed to make room.
    pub max_connections: usize,
    /// Limits on request bodies (HTTPS listener).
    pub body: BodyLimits,
    /// Most answer bytes not yet written, across the connections of both listeners: a larger
    /// answer that finds no room is replaced by a 429 ([`crate::serving::conn::AnswerBudget`]).
    pub answer_bytes_in_flight: usize,
    /// At shutdown, how long to go on serving first, not ready, each connection closed after
    /// its next answer (`Connection: close`), while whatever routes traffic here (Service
    /// endpoints) stops doing so: a client then never has a request on a connection the server
    /// closes, nor a connection refused.
    pub shutdown_delay: Duration,
    /// Longest wait for in-flight requests at shutdown (after the delay).
    pub shutdown_grace: Duration,
    /// `/metrics` on the plain-HTTP health listener (`--metrics-secure=false`); otherwise the
    /// caller serves it over HTTPS (`crate::metrics_auth`).
    pub metrics_on_health: bool,
}

impl ServeOptions {
    /// The defaults of the `webhook` subcommand for a certificate pair.
    pub fn new(
        tls_cert: impl Into<std::path::PathBuf>,
        tls_key: impl Into<std::path::PathBuf>,
    ) -> Self {
        ServeOptions {
            tls_cert: tls_cert.into(),
            tls_key: tls_key.into(),
            reload_interval: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body: BodyLimits::default(),
            answer_bytes_in_flight: DEFAULT_ANSWER_BYTES_IN_FLIGHT,
            shutdown_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(25),
            metrics_on_health: true,
        }
    }
}

/// The default of `--max-connections`.
pub use crate::serving::DEFAULT_MAX_CONNECTIONS;

/// Largest request head (request line and headers) read: 431 beyond it.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Serves the admission routes ([`admission_routes`]) over TLS on `https` and [`health_router_with`]
/// over plain HTTP on `health`
/// (both already bound: bind `127.0.0.1:0` to learn the ports first) until `shutdown`
/// resolves; then reports not ready, goes on serving for `options.shutdown_delay` with every
/// answer closing its connection, stops accepting, lets in-flight requests finish for up to
/// `options.shutdown_grace`, and returns.
///
/// The serving certificate is loaded from `options.tls_cert`/`tls_key` before anything is
/// accepted (an error names the file), and reloaded when the files change.
pub async fn serve(
    https: TcpListener,
    health: TcpListener,
    webhook: Arc<Webhook>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    serve_routes(
        https,
        health,
        webhook,
        admission_routes(),
        options,
        shutdown,
    )
    .await
}

/// [`serve`] with the HTTPS routes given: `routes` get the [`Handlers`] of `webhook` and
/// `options.body`. A test harness adds a route of its own beside [`admission_routes`] this way.
pub async fn serve_routes(
    https: TcpListener,
    health: TcpListener,
    webhook: Arc<Webhook>,
    routes: Router<Handlers>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let resolver = Arc::new(ReloadingCert::load(&options.tls_cert, &options.tls_key)?);
    webhook
        .metrics()
        .certificate_loaded(true, &resolver.current().cert);
    let acceptor = TlsAcceptor::from(Arc::new(server_config(resolver.clone())?));

    let (stop_tx, stop_rx) = watch::channel(false);
    let watcher = tokio::spawn(resolver.clone().watch(
        options.reload_interval,
        webhook.metrics().clone(),
        wait_stop(stop_rx.clone()),
    ));

    let addr_text = |listener: &TcpListener| {
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    };
    let https_addr = addr_text(&https);
    let health_addr = addr_text(&health);
    let limits = Limits {
        timeouts: Timeouts {
            handshake: options.header_read_timeout,
            header_read: options.header_read_timeout,
            idle: options.idle_timeout,
        },
        max_connections: options.max_connections.max(1),
        max_header_bytes: MAX_HEADER_BYTES,
    };
    let draining = Arc::new(AtomicBool::new(false));
    let common = Common {
        metrics: Some(webhook.metrics().clone() as Arc<dyn crate::serving::Events>),
        answers: AnswerBudget::new(options.answer_bytes_in_flight),
        draining: draining.clone(),
    };
    let https_loop = tokio::spawn(accept_loop(
        https,
        Some(acceptor),
        routes.with_state(Handlers::new(webhook.clone(), options.body)),
        common.clone(),
        limits,
        stop_rx.clone(),
    ));
    let health_loop = tokio::spawn(accept_loop(
        health,
        None,
        health_router_with(webhook.clone(), options.metrics_on_health),
        common,
        limits,
        stop_rx.clone(),
    ));
    webhook.set_ready(true);
    tracing::info!(
        https = %https_addr,
        health = %health_addr,
        cert = %options.tls_cert.display(),
        max_connections = limits.max_connections,
        header_read_timeout_s = options.header_read_timeout.as_secs_f64(),
        idle_timeout_s = options.idle_timeout.as_secs_f64(),
        body_read_timeout_s = options.body.read_timeout.as_secs_f64(),
        body_bytes_in_flight = options.body.bytes_in_flight,
        "webhook serving"
    );

    shutdown.await;
    webhook.set_ready(false);
    if !options.shutdown_delay.is_zero() {
        tracing::info!(
            delay_seconds = options.shutdown_delay.as_secs_f64(),
            "shutting down: not ready; still serving, each connection closed after its next answer"
        );
        draining.store(true, Ordering::Release);
        tokio::time::sleep(options.shutdown_delay).await;
    }
    tracing::info!(
        grace_seconds = options.shutdown_grace.as_secs_f64(),
        "shutting down: no new connections, finishing in-flight requests"
    );
    let _ = stop_tx.send(true);

    let deadline = tokio::time::Instant::now() + options.shutdown_grace;
    let mut clean = true;
    for (name, mut task) in [("https", https_loop), ("health", health_loop)] {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                clean = false;
                tracing::warn!(listener = name, error = %e, "connection loop failed");
            }
            Err(_) => {
                clean = false;
                // Dropping the loop's JoinSet aborts the connections still open.
                task.abort();
                tracing::warn!(
                    listener = name,
                    "closed connections still busy after the grace period"
                );
            }
        }
    }
    let _ = watcher.await;
    if clean {
        tracing::info!("webhook stopped");
    }
    Ok(())
}
