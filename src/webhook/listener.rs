//! The webhook's listeners: TLS and plain-HTTP connection loops around the routes of
//! [`super::routes`], until a shutdown future resolves.
//!
//! Against slow, idle, many and large: HTTP/1.1 only (ALPN `http/1.1`, so no HTTP/2 stream
//! limits or reset floods to manage; the API server falls back to HTTP/1.1); TLS 1.2 and 1.3
//! only; a deadline for the TLS handshake and for each request head (64 KiB at most, else 431),
//! another for each body (408, in the routes), an idle timeout between requests; at most
//! `max_connections` connections per listener, new ones waiting for a slot while idle and stuck
//! ones are closed to make room ([`super::conn`]); the answer bytes a connection has not taken
//! counted against a budget, a small socket send buffer, a connection that does not take its
//! answer cut, and a pipelined request held until the answer before it is written (issue 21);
//! on shutdown, an optional drain that closes each connection after its next answer.
//!
//! [`serve_plain`] serves a plain-HTTP router with the same connection handling: the health
//! listener of the other components (`crate::telemetry::serve_health`).
//!
//! See docs/architecture.md ("Webhook").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::Error;
use super::conn::{
    Activity, AnswerBudget, Cut, DEFAULT_ANSWER_BYTES_IN_FLIGHT, Phase, SEND_BUFFER_BYTES,
    Timeouts, Tracked, Watched,
};
use super::metrics::Metrics;
use super::routes::{BodyLimits, Handlers, Webhook, admission_routes, health_router};
use super::tls::{ReloadingCert, server_config};

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
    /// [`super::conn::EVICTABLE_AFTER`]) are closed to make room.
    pub max_connections: usize,
    /// Limits on request bodies (HTTPS listener).
    pub body: BodyLimits,
    /// Most answer bytes not yet written, across the connections of both listeners: a larger
    /// answer that finds no room is replaced by a 429 ([`super::conn::AnswerBudget`]).
    pub answer_bytes_in_flight: usize,
    /// At shutdown, how long to go on serving first, not ready, each connection closed after
    /// its next answer (`Connection: close`), while whatever routes traffic here (Service
    /// endpoints) stops doing so: a client then never has a request on a connection the server
    /// closes, nor a connection refused.
    pub shutdown_delay: Duration,
    /// Longest wait for in-flight requests at shutdown (after the delay).
    pub shutdown_grace: Duration,
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
        }
    }
}

/// The default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Largest request head (request line and headers) read: 431 beyond it.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Serves the admission routes ([`admission_routes`]) over TLS on `https` and [`health_router`]
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
        metrics: Some(webhook.metrics().clone()),
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
        health_router(webhook.clone()),
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

async fn wait_stop(mut stop: watch::Receiver<bool>) {
    // An error means the sender is gone: stop as well.
    let _ = stop.wait_for(|stop| *stop).await;
}

#[derive(Clone, Copy, Debug)]
struct Limits {
    timeouts: Timeouts,
    max_connections: usize,
    max_header_bytes: usize,
}

/// Limits of a plain-HTTP listener served by [`serve_plain`].
#[derive(Clone, Copy, Debug)]
pub struct PlainLimits {
    /// Most connections served at once; when every slot is taken, new ones wait in the listen
    /// backlog while idle and stuck connections are closed to make room.
    pub max_connections: usize,
    /// Largest request head (431 beyond it).
    pub max_header_bytes: usize,
    /// Longest wait for a request head: from the connection, or from its first byte after an
    /// answer.
    pub header_read_timeout: Duration,
    /// Longest a keep-alive connection may sit between requests.
    pub idle_timeout: Duration,
    /// Most answer bytes not yet written, across connections.
    pub answer_bytes_in_flight: usize,
}

/// Serves `router` over plain HTTP/1.1 on `listener` with the webhook's connection handling
/// (slots, eviction of idle and stuck connections under pressure, head and idle timeouts, the
/// answer budget and slow-reader cut) until `shutdown` resolves; then stops accepting and lets
/// each open connection finish its request in flight, for up to `grace`.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    limits: PlainLimits,
    grace: Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let serving = accept_loop(
        listener,
        None,
        router,
        Common {
            metrics: None,
            answers: AnswerBudget::new(limits.answer_bytes_in_flight),
            draining: Arc::new(AtomicBool::new(false)),
        },
        Limits {
            timeouts: Timeouts {
                handshake: limits.header_read_timeout,
                header_read: limits.header_read_timeout,
                idle: limits.idle_timeout,
            },
            max_connections: limits.max_connections.max(1),
            max_header_bytes: limits.max_header_bytes,
        },
        stop_rx,
    );
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => return,
        () = shutdown => {}
    }
    let _ = stop_tx.send(true);
    // Dropping the loop aborts the connections still open.
    let _ = tokio::time::timeout(grace, serving).await;
}

/// What the listeners of one server share.
#[derive(Clone)]
struct Common {
    /// The webhook's metrics (none for another component's health listener).
    metrics: Option<Arc<Metrics>>,
    answers: Arc<AnswerBudget>,
    /// Set during the shutdown delay: every answer closes its connection.
    draining: Arc<AtomicBool>,
}

/// What every connection of a listener shares.
struct Listener {
    name: &'static str,
    tls: Option<TlsAcceptor>,
    router: Router,
    /// The webhook's metrics (none for another component's health listener).
    metrics: Option<Arc<Metrics>>,
    answers: Arc<AnswerBudget>,
    timeouts: Timeouts,
    max_header_bytes: usize,
    /// Set during the shutdown delay: every answer closes its connection.
    draining: Arc<AtomicBool>,
}

impl Listener {
    fn cut(&self, cut: Cut) {
        if let Some(metrics) = &self.metrics {
            metrics.connection_cut(self.name, cut);
        }
    }

    fn handshake_failed(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.handshake_failed();
        }
    }
}

/// Accepts connections until `stop`, then waits for the open ones to finish (each told to close
/// after its in-flight request). The caller bounds that wait: dropping this future drops the
/// `JoinSet`, which aborts the connections left.
///
/// At most `limits.max_connections` connections are served at once. A connection accepted with
/// every slot taken waits for one (and the connections behind it wait in the kernel's listen
/// backlog) rather than being refused: the API server would count a refusal as a failed call.
/// While it waits, the open connections are asked every 250 ms to close if they are idle or
/// stuck in a handshake or a head ([`Activity::evictable`]).
async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    common: Common,
    limits: Limits,
    stop: watch::Receiver<bool>,
) {
    let shared = Arc::new(Listener {
        name: if tls.is_some() { "https" } else { "health" },
        tls,
        router,
        metrics: common.metrics,
        answers: common.answers,
        timeouts: limits.timeouts,
        max_header_bytes: limits.max_header_bytes,
        draining: common.draining,
    });
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (pressure, _) = watch::channel(0u64);
    let mut connections = JoinSet::new();
    let stopped = wait_stop(stop.clone());
    tokio::pin!(stopped);
    'accept: loop {
        let (tcp, peer) = tokio::select! {
            () = &mut stopped => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: do not spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // This connection waits (and the ones behind it in the backlog); the open ones
                // are asked to make room.
                if let Some(metrics) = &shared.metrics {
                    metrics.connection_limit_reached(shared.name);
                }
                tracing::debug!(
                    listener = shared.name,
                    %peer,
                    max_connections = limits.max_connections,
                    "connection limit reached: the new connection waits, idle ones are closed"
                );
                let mut nudge = tokio::time::interval(Duration::from_millis(250));
                loop {
                    tokio::select! {
                        () = &mut stopped => break 'accept,
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                        slot = slots.clone().acquire_owned() => match slot {
                            Ok(slot) => break slot,
                            // The semaphore is never closed.
                            Err(_) => break 'accept,
                        },
                        _ = nudge.tick() => pressure.send_modify(|round| *round += 1),
                    }
                }
            }
        };
        let _ = tcp.set_nodelay(true);
        // What a peer that does not read leaves queued in the kernel (autotuned, it grows to
        // megabytes per connection).
        let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(SEND_BUFFER_BYTES);
        connections.spawn(connection(
            tcp,
            peer,
            shared.clone(),
            slot,
            stop.clone(),
            pressure.subscribe(),
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Resolves once the accept loop asks for room and `activity` may give it.
async fn evictable(activity: &Activity, pressure: &mut watch::Receiver<u64>) {
    loop {
        if pressure.changed().await.is_err() {
            // The accept loop is gone: nobody will ask any more.
            std::future::pending::<()>().await;
        }
        if activity.evictable() {
            return;
        }
    }
}

async fn connection(
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    shared: Arc<Listener>,
    _slot: OwnedSemaphorePermit,
    stop: watch::Receiver<bool>,
    mut pressure: watch::Receiver<u64>,
) {
    let _open = shared
        .metrics
        .as_ref()
        .map(|metrics| metrics.connection(shared.tls.is_some()));
    match &shared.tls {
        None => {
            let activity = Activity::new(Phase::Head, shared.answers.clone());
            drive(tcp, peer, &shared, activity, stop, pressure).await;
        }
        Some(acceptor) => {
            let activity = Activity::new(Phase::Handshake, shared.answers.clone());
            let handshake = tokio::time::timeout(shared.timeouts.handshake, acceptor.accept(tcp));
            let stream = tokio::select! {
                () = wait_stop(stop.clone()) => return,
                () = evictable(&activity, &mut pressure) => {
                    shared.cut(Cut::Evicted);
                    tracing::debug!(%peer, "closed a connection stuck in its TLS handshake to make room");
                    return;
                }
                result = handshake => match result {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        shared.handshake_failed();
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        shared.handshake_failed();
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
            };
            activity.set(Phase::Head);
            drive(stream, peer, &shared, activity, stop, pressure).await;
        }
    }
}

/// Serves HTTP/1.1 (keep-alive on) on one connection until the client closes it, it times out
/// in a head or between requests, it is evicted, or `stop`: then it finishes the request in
/// flight and closes.
async fn drive<I>(
    io: I,
    peer: std::net::SocketAddr,
    shared: &Listener,
    activity: Arc<Activity>,
    stop: watch::Receiver<bool>,
    mut pressure: watch::Receiver<u64>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // The head's deadline is kept below (hyper's would also cut idle connections).
        .header_read_timeout(None)
        .max_header_size(shared.max_header_bytes)
        .keep_alive(true)
        .serve_connection(
            TokioIo::new(Watched::new(io, activity.clone())),
            Tracked::new(
                shared.router.clone(),
                activity.clone(),
                shared.draining.clone(),
            ),
        );
    tokio::pin!(conn);
    let cut = loop {
        let now = tokio::time::Instant::now();
        if let Some(cut) = activity.expired(&shared.timeouts, now) {
            break cut;
        }
        let wake = activity.next_check(&shared.timeouts, now);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(wake) => {}
            // An answer began: its drain deadline may be earlier than the wake-up.
            () = activity.began_owing() => {}
            () = evictable(&activity, &mut pressure) => break Cut::Evicted,
            () = wait_stop(stop.clone()) => {
                conn.as_mut().graceful_shutdown();
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
        }
    };
    shared.cut(cut);
    tracing::debug!(%peer, listener = shared.name, reason = cut.as_str(), "closing a connection");
    if cut != Cut::SlowReader && activity.get().0 == Phase::Idle {
        // Between requests: close cleanly (TLS close_notify), briefly.
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
    }
}
