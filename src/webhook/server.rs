//! The routers and the connection loops of the webhook.
//!
//! - [`router`]: the HTTPS routes, `POST /mutate`, `POST /validate`, and `GET|POST /ping`
//!   (a trivial route: reads the body, answers `{}`; a TLS liveness check and the benchmark's
//!   ceiling);
//! - [`health_router`]: the plain-HTTP routes, `/healthz`, `/readyz`, `/metrics`;
//! - [`serve`]: both, on listeners the caller bound, until a shutdown future resolves.
//!
//! Against slow, idle, many and large: HTTP/1.1 only (ALPN `http/1.1`, so no HTTP/2 stream
//! limits or reset floods to manage; the API server falls back to HTTP/1.1); TLS 1.2 and 1.3
//! only; a deadline for the TLS handshake and for each request head (64 KiB at most, else 431),
//! another for each body (408), an idle timeout between requests; at most `max_connections`
//! connections per listener, new ones waiting for a slot while idle and stuck ones are closed to
//! make room ([`super::conn`]); request bodies held in memory bounded across requests (429
//! beyond); on shutdown, an optional drain that closes each connection after its next answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::Error;
use super::conn::{Activity, Cut, Phase, Timeouts, Tracked, Watched};
use super::metrics::Metrics;
use super::tls::{ReloadingCert, server_config};
use crate::admission::{self, Endpoint, InjectionConfig, Outcome, Reply};

/// Bodies larger than this are reviewed on the blocking pool rather than on an async worker.
/// Measured on 2 CPUs: a 30 KB JobSet reviewed inline gives more `/mutate` throughput (~4,400 vs
/// ~3,600 req/s) and a lower p99 at 1,000 req/s (~1.5 vs ~3-8 ms) than on the blocking pool; a
/// 4 MB body reviewed inline stalls a worker for tens of milliseconds (p99.9 of the small requests
/// beside it ~40 ms, vs ~7-8 ms when the big one goes to the blocking pool).
pub const INLINE_REVIEW_MAX_BYTES: usize = 256 * 1024;

/// What the handlers share: the injection config, the metrics, readiness.
#[derive(Debug)]
pub struct Webhook {
    config: InjectionConfig,
    metrics: Arc<Metrics>,
    ready: AtomicBool,
}

impl Webhook {
    pub fn new(config: InjectionConfig) -> Arc<Self> {
        Arc::new(Webhook {
            config,
            metrics: Arc::new(Metrics::new()),
            ready: AtomicBool::new(false),
        })
    }

    pub fn config(&self) -> &InjectionConfig {
        &self.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether `/readyz` answers 200: set by [`serve`] once TLS is loaded and it accepts
    /// connections, cleared when it starts shutting down.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
}

/// Limits on reading request bodies, shared by every connection of a server.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Longest time to read a request's body once its head is in: 408 after it.
    pub read_timeout: Duration,
    /// Most request-body bytes held at once, across requests: each chunk is reserved as it
    /// arrives and held until the request is answered; a chunk that finds no room waits up to
    /// [`BODY_BUDGET_WAIT`], then the request gets 429 with `Retry-After` (the API server retries
    /// those). At least [`admission::MAX_BODY_BYTES`].
    pub bytes_in_flight: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            read_timeout: Duration::from_secs(10),
            bytes_in_flight: DEFAULT_BODY_BYTES_IN_FLIGHT,
        }
    }
}

/// The default of `--max-body-bytes-in-flight`: nine bodies at the 7 MiB limit, thousands of
/// ordinary JobSets.
pub const DEFAULT_BODY_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;

/// What the HTTPS handlers share.
#[derive(Clone, Debug)]
struct AppState {
    webhook: Arc<Webhook>,
    body_read_timeout: Duration,
    /// One permit per byte of request body held.
    body_budget: Arc<Semaphore>,
}

/// The HTTPS routes: `POST /mutate`, `POST /validate`, `GET|POST /ping`, with the default
/// [`BodyLimits`].
pub fn router(webhook: Arc<Webhook>) -> Router {
    router_with(webhook, BodyLimits::default())
}

/// [`router`] with body limits.
pub fn router_with(webhook: Arc<Webhook>, limits: BodyLimits) -> Router {
    let budget = limits
        .bytes_in_flight
        .clamp(admission::MAX_BODY_BYTES, Semaphore::MAX_PERMITS);
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/ping", get(ping).post(ping))
        .with_state(AppState {
            webhook,
            body_read_timeout: limits.read_timeout,
            body_budget: Arc::new(Semaphore::new(budget)),
        })
}

/// The plain-HTTP routes: `/healthz`, `/readyz`, `/metrics`.
pub fn health_router(webhook: Arc<Webhook>) -> Router {
    let ready = webhook.clone();
    crate::telemetry::health_router(crate::telemetry::Health::new(
        move || ready.is_ready(),
        move || webhook.metrics.encode(),
    ))
}

async fn mutate(State(state): State<AppState>, request: Request) -> Response {
    admit(&state, Endpoint::Mutate, request).await
}

async fn validate(State(state): State<AppState>, request: Request) -> Response {
    admit(&state, Endpoint::Validate, request).await
}

fn json_response(status: u16, body: Vec<u8>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (
        code,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        Body::from(body),
    )
        .into_response();
    if code == StatusCode::TOO_MANY_REQUESTS {
        // The API server retries a webhook call answered 429 or with Retry-After.
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn error_reply(code: u16, reason: &str, message: &str) -> Reply {
    Reply {
        http_status: code,
        body: admission::status_body(code, reason, message),
        outcome: Outcome::Error,
    }
}

/// `application/json`, with or without parameters (`; charset=utf-8`), in any letter case.
pub fn is_json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn too_large() -> Reply {
    error_reply(
        413,
        "RequestEntityTooLarge",
        &format!(
            "the request body is larger than {} bytes",
            admission::MAX_BODY_BYTES
        ),
    )
}

/// A request body read into memory, with its share of the body budget (returned when dropped).
struct ReadBody {
    bytes: Vec<u8>,
    _reserved: Option<OwnedSemaphorePermit>,
}

fn body_timeout(timeout: Duration) -> Reply {
    error_reply(
        408,
        "Timeout",
        &format!(
            "the request body was not received within {:.1} s",
            timeout.as_secs_f64()
        ),
    )
}

fn busy() -> Reply {
    error_reply(
        429,
        "TooManyRequests",
        "too many request bodies in memory at once; retry shortly",
    )
}

/// Longest wait for room in the body budget before a request gets 429.
pub const BODY_BUDGET_WAIT: Duration = Duration::from_secs(1);

/// Reserves `bytes` of the body budget: at once if there is room, else retrying for up to
/// [`BODY_BUDGET_WAIT`] (and no later than `deadline`), then 429.
///
/// Retrying, not queueing on the semaphore: its queue is first come first served, so a request
/// half-way through its body would wait behind a newer one that needs more room than is left,
/// while holding the room that one waits for. Retrying lets whichever fits go on.
async fn reserve(
    budget: &Arc<Semaphore>,
    bytes: usize,
    deadline: tokio::time::Instant,
) -> Result<OwnedSemaphorePermit, Reply> {
    // Bodies are at most MAX_BODY_BYTES (7 MiB), far below u32::MAX.
    let permits = u32::try_from(bytes).map_err(|_| too_large())?;
    let until = deadline.min(tokio::time::Instant::now() + BODY_BUDGET_WAIT);
    loop {
        if let Ok(permit) = budget.clone().try_acquire_many_owned(permits) {
            return Ok(permit);
        }
        if tokio::time::Instant::now() >= until {
            return Err(busy());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads a body of at most `limit` bytes by `deadline`; a larger one is refused as soon as it is
/// known to be (from `Content-Length`, or while reading), without buffering it. Each chunk is
/// reserved from `budget` as it arrives (not the declared length up front: a client holds only
/// what it has sent), and held until the body is dropped.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    budget: &Arc<Semaphore>,
    timeout: Duration,
) -> Result<ReadBody, Reply> {
    let deadline = tokio::time::Instant::now() + timeout;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    // At most `limit` (checked above).
    let declared = declared.map(|len| len as usize);
    let mut reserved: Option<OwnedSemaphorePermit> = None;
    let mut bytes = Vec::new();
    let mut body = body;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(body_timeout(timeout)),
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => {
                return Err(error_reply(
                    400,
                    "BadRequest",
                    &format!("cannot read the request body: {e}"),
                ));
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if data.is_empty() {
            continue;
        }
        if bytes.len() + data.len() > limit {
            return Err(too_large());
        }
        let more = reserve(budget, data.len(), deadline).await?;
        match reserved.as_mut() {
            Some(permit) => permit.merge(more),
            None => reserved = Some(more),
        }
        if bytes.is_empty() {
            // Once the client is sending, room for all it declared (pages are only touched as
            // they are written).
            bytes.reserve_exact(declared.unwrap_or(0).max(data.len()));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(ReadBody {
        bytes,
        _reserved: reserved,
    })
}

async fn answer(state: &AppState, endpoint: Endpoint, request: Request) -> Reply {
    let (parts, body) = request.into_parts();
    if !is_json_content_type(&parts.headers) {
        let got = parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "none".into());
        return error_reply(
            415,
            "UnsupportedMediaType",
            &format!("the content type must be application/json, not {got}"),
        );
    }
    let body = match read_body(
        &parts.headers,
        body,
        admission::MAX_BODY_BYTES,
        &state.body_budget,
        state.body_read_timeout,
    )
    .await
    {
        Ok(body) => body,
        Err(reply) => return reply,
    };
    if body.bytes.len() <= INLINE_REVIEW_MAX_BYTES {
        return admission::review(endpoint, &body.bytes, &state.webhook.config);
    }
    let shared = state.webhook.clone();
    tokio::task::spawn_blocking(move || admission::review(endpoint, &body.bytes, &shared.config))
        .await
        .unwrap_or_else(|e| {
            error_reply(
                500,
                "InternalError",
                &format!("the review did not finish: {e}"),
            )
        })
}

async fn admit(state: &AppState, endpoint: Endpoint, request: Request) -> Response {
    let webhook = &state.webhook;
    let started = Instant::now();
    let _in_flight = webhook.metrics.in_flight();
    let reply = answer(state, endpoint, request).await;
    webhook.metrics.observe(
        endpoint,
        reply.outcome,
        reply.http_status,
        started.elapsed(),
    );
    if reply.outcome == Outcome::Denied {
        webhook.metrics.denied(endpoint, &reply.body);
    }
    tracing::debug!(
        endpoint = endpoint.as_str(),
        outcome = reply.outcome.as_str(),
        status = reply.http_status,
        elapsed_us = started.elapsed().as_micros() as u64,
        "admission request"
    );
    json_response(reply.http_status, reply.body)
}

async fn ping(State(state): State<AppState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match read_body(
        &parts.headers,
        body,
        admission::MAX_BODY_BYTES,
        &state.body_budget,
        state.body_read_timeout,
    )
    .await
    {
        Ok(_) => json_response(200, b"{}".to_vec()),
        Err(reply) => json_response(reply.http_status, reply.body),
    }
}

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
            shutdown_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(25),
        }
    }
}

/// The default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Largest request head (request line and headers) read: 431 beyond it.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Serves [`router`] over TLS on `https` and [`health_router`] over plain HTTP on `health`
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
    let resolver = Arc::new(ReloadingCert::load(&options.tls_cert, &options.tls_key)?);
    webhook
        .metrics
        .certificate_loaded(true, &resolver.current().cert);
    let acceptor = TlsAcceptor::from(Arc::new(server_config(resolver.clone())?));

    let (stop_tx, stop_rx) = watch::channel(false);
    let watcher = tokio::spawn(resolver.clone().watch(
        options.reload_interval,
        webhook.metrics.clone(),
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
    };
    let draining = Arc::new(AtomicBool::new(false));
    let https_loop = tokio::spawn(accept_loop(
        https,
        Some(acceptor),
        router_with(webhook.clone(), options.body),
        webhook.metrics.clone(),
        limits,
        draining.clone(),
        stop_rx.clone(),
    ));
    let health_loop = tokio::spawn(accept_loop(
        health,
        None,
        health_router(webhook.clone()),
        webhook.metrics.clone(),
        limits,
        draining.clone(),
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
}

/// What every connection of a listener shares.
struct Listener {
    name: &'static str,
    tls: Option<TlsAcceptor>,
    router: Router,
    metrics: Arc<Metrics>,
    timeouts: Timeouts,
    /// Set during the shutdown delay: every answer closes its connection.
    draining: Arc<AtomicBool>,
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
    metrics: Arc<Metrics>,
    limits: Limits,
    draining: Arc<AtomicBool>,
    stop: watch::Receiver<bool>,
) {
    let shared = Arc::new(Listener {
        name: if tls.is_some() { "https" } else { "health" },
        tls,
        router,
        metrics,
        timeouts: limits.timeouts,
        draining,
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
                shared.metrics.connection_limit_reached(shared.name);
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
    let metrics = &shared.metrics;
    let _open = metrics.connection(shared.tls.is_some());
    match &shared.tls {
        None => {
            let activity = Activity::new(Phase::Head);
            drive(tcp, peer, &shared, activity, stop, pressure).await;
        }
        Some(acceptor) => {
            let activity = Activity::new(Phase::Handshake);
            let handshake = tokio::time::timeout(shared.timeouts.handshake, acceptor.accept(tcp));
            let stream = tokio::select! {
                () = wait_stop(stop.clone()) => return,
                () = evictable(&activity, &mut pressure) => {
                    metrics.connection_cut(shared.name, Cut::Evicted);
                    tracing::debug!(%peer, "closed a connection stuck in its TLS handshake to make room");
                    return;
                }
                result = handshake => match result {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        metrics.handshake_failed();
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics.handshake_failed();
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
        .max_header_size(MAX_HEADER_BYTES)
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
    shared.metrics.connection_cut(shared.name, cut);
    tracing::debug!(%peer, listener = shared.name, reason = cut.as_str(), "closing a connection");
    if activity.get().0 == Phase::Idle {
        // Between requests: close cleanly (TLS close_notify), briefly.
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request as HttpRequest;
    use tower::ServiceExt as _;

    fn webhook() -> Arc<Webhook> {
        Webhook::new(InjectionConfig::defaults(crate::protocol::Dialect::Epoch))
    }

    async fn call(router: Router, request: HttpRequest<Body>) -> (u16, Option<String>, Vec<u8>) {
        let response = router.oneshot(request).await.expect("infallible");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec();
        (status, content_type, body)
    }

    fn post(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> HttpRequest<Body> {
        let mut builder = HttpRequest::post(path);
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        builder.body(body.into()).expect("request")
    }

    fn assert_status_body(body: &[u8], code: u16) {
        let status: serde_json::Value = serde_json::from_slice(body).expect("json");
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], code);
    }

    #[tokio::test]
    async fn json_content_types_reach_review_others_get_415() {
        let hook = webhook();
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
            let expected = admission::review(endpoint, body, hook.config());
            let path = format!("/{}", endpoint.as_str());
            for ct in [
                "application/json",
                "application/json; charset=utf-8",
                "Application/JSON ;charset=UTF-8",
            ] {
                let (status, content_type, got) =
                    call(router(hook.clone()), post(&path, Some(ct), &body[..])).await;
                assert_eq!(status, expected.http_status, "{ct}");
                assert_eq!(content_type.as_deref(), Some("application/json"));
                assert_eq!(got, expected.body, "{ct}");
            }
            for ct in [Some("text/json"), Some("application/jsonx"), Some(""), None] {
                let (status, content_type, got) =
                    call(router(hook.clone()), post(&path, ct, &body[..])).await;
                assert_eq!(status, 415, "{ct:?}");
                assert_eq!(content_type.as_deref(), Some("application/json"));
                assert_status_body(&got, 415);
            }
        }
        let text = hook.metrics().encode();
        assert!(
            text.contains(
                r#"jobset_inplace_admission_requests_total{endpoint="mutate",outcome="error"} 7"#
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn bodies_over_the_limit_get_413_while_streaming() {
        let hook = webhook();
        // Declared too large: refused before reading.
        let request = HttpRequest::post("/mutate")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, admission::MAX_BODY_BYTES + 1)
            .body(Body::empty())
            .expect("request");
        let (status, _, body) = call(router(hook.clone()), request).await;
        assert_eq!(status, 413);
        assert_status_body(&body, 413);

        // Streamed without a length: stops once past the limit.
        let chunk = bytes_chunk(1024 * 1024);
        let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = pulled.clone();
        let stream = futures::stream::iter(0..100).map(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok::<_, std::io::Error>(chunk.clone())
        });
        let (status, _, body) = call(
            router(hook.clone()),
            post(
                "/validate",
                Some("application/json"),
                Body::from_stream(stream),
            ),
        )
        .await;
        assert_eq!(status, 413);
        assert_status_body(&body, 413);
        let pulled = pulled.load(Ordering::Relaxed);
        assert!(pulled <= 8, "read {pulled} MiB of a 100 MiB body");
    }

    #[tokio::test]
    async fn a_body_that_stalls_gets_408() {
        let limits = BodyLimits {
            read_timeout: Duration::from_millis(200),
            ..BodyLimits::default()
        };
        let stream = futures::stream::iter([Ok::<_, std::io::Error>(bytes_chunk(10))])
            .chain(futures::stream::pending());
        let started = Instant::now();
        let (status, _, body) = call(
            router_with(webhook(), limits),
            post(
                "/validate",
                Some("application/json"),
                Body::from_stream(stream),
            ),
        )
        .await;
        assert_eq!(status, 408);
        assert_status_body(&body, 408);
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    /// A request holding all but one byte of the budget (body sent but for its last byte), and
    /// the router.
    async fn budget_held(
        read_timeout: Duration,
    ) -> (
        Router,
        tokio::sync::mpsc::Sender<axum::body::Bytes>,
        tokio::task::JoinHandle<(u16, Option<String>, Vec<u8>)>,
    ) {
        let limits = BodyLimits {
            read_timeout,
            bytes_in_flight: admission::MAX_BODY_BYTES,
        };
        let router = router_with(webhook(), limits);
        let (tx, rx) = tokio::sync::mpsc::channel::<axum::body::Bytes>(2);
        tx.send(bytes_chunk(admission::MAX_BODY_BYTES - 1))
            .await
            .expect("send");
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
        });
        let holder = HttpRequest::post("/ping")
            .header(header::CONTENT_LENGTH, admission::MAX_BODY_BYTES)
            .body(Body::from_stream(stream))
            .expect("request");
        let holder = tokio::spawn(call(router.clone(), holder));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!holder.is_finished());
        (router, tx, holder)
    }

    #[tokio::test]
    async fn bodies_wait_briefly_for_room_in_the_budget() {
        let (router, tx, holder) = budget_held(Duration::from_secs(10)).await;
        // Two bytes do not fit: the request waits.
        let waiter = tokio::spawn(call(router.clone(), post("/ping", None, "{}")));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "waits while the budget is taken");

        tx.send(bytes_chunk(1)).await.expect("send");
        drop(tx);
        let (status, _, _) = holder.await.expect("holder");
        assert_eq!(status, 200);
        let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("answered once there is room")
            .expect("waiter");
        assert_eq!((status, body.as_slice()), (200, &b"{}"[..]));
    }

    #[tokio::test]
    async fn no_room_within_a_second_is_429_with_retry_after() {
        let (router, tx, holder) = budget_held(Duration::from_secs(10)).await;
        let started = Instant::now();
        let response = router
            .clone()
            .oneshot(post("/validate", Some("application/json"), "{}"))
            .await
            .expect("infallible");
        assert!(started.elapsed() >= BODY_BUDGET_WAIT);
        assert_eq!(response.status(), 429);
        assert_eq!(
            response.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from_static("1"))
        );
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_status_body(&body, 429);
        drop(tx);
        // The holder's body ends short of its declared length: an error, its bytes returned.
        let _ = holder.await.expect("holder");
        let (status, _, _) = call(router, post("/ping", None, "{}")).await;
        assert_eq!(status, 200);
    }

    #[tokio::test]
    async fn the_budget_is_returned_after_each_request() {
        let limits = BodyLimits {
            read_timeout: Duration::from_secs(5),
            bytes_in_flight: admission::MAX_BODY_BYTES,
        };
        let router = router_with(webhook(), limits);
        let big = vec![b' '; admission::MAX_BODY_BYTES];
        // Each request takes the whole budget: they only pass one after the other if each gives
        // it back, whatever its answer (a chunked body, an over-limit one, a review).
        for _ in 0..3 {
            let (status, _, _) = call(
                router.clone(),
                post("/mutate", Some("application/json"), big.clone()),
            )
            .await;
            assert_eq!(status, 400);
            let stream = futures::stream::iter(0..8)
                .map(|_| Ok::<_, std::io::Error>(bytes_chunk(1024 * 1024)));
            let (status, _, _) = call(
                router.clone(),
                post(
                    "/validate",
                    Some("application/json"),
                    Body::from_stream(stream),
                ),
            )
            .await;
            assert_eq!(status, 413);
        }
    }

    fn bytes_chunk(len: usize) -> axum::body::Bytes {
        axum::body::Bytes::from(vec![b' '; len])
    }

    use futures::StreamExt as _;

    #[tokio::test]
    async fn ping_and_unknown_routes() {
        let hook = webhook();
        let (status, _, body) = call(router(hook.clone()), post("/ping", None, "x")).await;
        assert_eq!((status, body.as_slice()), (200, &b"{}"[..]));
        let get = HttpRequest::get("/mutate")
            .body(Body::empty())
            .expect("request");
        let (status, _, _) = call(router(hook.clone()), get).await;
        assert_eq!(status, 405);
        let (status, _, _) = call(router(hook), post("/other", None, "x")).await;
        assert_eq!(status, 404);
    }

    #[tokio::test]
    async fn readiness_follows_the_flag() {
        let hook = webhook();
        let get = |path: &str| HttpRequest::get(path).body(Body::empty()).expect("request");
        assert_eq!(
            call(health_router(hook.clone()), get("/readyz")).await.0,
            503
        );
        assert_eq!(
            call(health_router(hook.clone()), get("/healthz")).await.0,
            200
        );
        hook.set_ready(true);
        assert_eq!(
            call(health_router(hook.clone()), get("/readyz")).await.0,
            200
        );
        let (status, content_type, body) = call(health_router(hook), get("/metrics")).await;
        assert_eq!(status, 200);
        assert_eq!(
            content_type.as_deref(),
            Some(super::super::metrics::CONTENT_TYPE)
        );
        assert!(String::from_utf8_lossy(&body).contains("jobset_inplace_build_info"));
    }
}
