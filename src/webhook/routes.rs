//! The webhook's routes and handlers, without the listener ([`super::listener`]):
//!
//! - [`admission_routes`] / [`router`]: the HTTPS routes, `POST /mutate` and `POST /validate`:
//!   the content type checked, the body read under a deadline and a budget shared across
//!   requests (413, 408, 429), the review ([`crate::admission::review`]) inline or, for large
//!   bodies, on the blocking pool, and the metrics observed;
//! - [`health_router`]: the plain-HTTP routes, `/healthz`, `/readyz`, `/metrics`.
//!
//! The body read is ours, not tower-http's: `RequestBodyLimitLayer` caps one request's body but
//! answers 413 in plain text, not the Kubernetes `Status` the API server reports, and shares no
//! budget between requests (ours reserves a body's bytes across every request before reading
//! them); `TimeoutLayer` bounds the whole request, review included, with an empty 408, where the
//! deadline here is the body's alone and a slow body is also evictable
//! ([`crate::serving::conn::BodyProgress`]).
//!
//! See docs/architecture.md ("Webhook").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::metrics::Metrics;
use crate::admission::{self, Endpoint, InjectionConfig, Reply, ReviewOutcome};

/// Bodies larger than this are reviewed on the blocking pool rather than on an async worker.
/// Measured on 2 CPUs: a 30 KB JobSet reviewed inline gives more `/mutate` throughput (~4,400 vs
/// ~3,600 req/s) and a lower p99 at 1,000 req/s (~1.5 vs ~3-8 ms) than on the blocking pool; a
/// 4 MB body reviewed inline stalls a worker for tens of milliseconds (p99.9 of the small requests
/// beside it ~40 ms, vs ~7-8 ms when the big one goes to the blocking pool).
pub const INLINE_REVIEW_MAX_BYTES: usize = 256 * 1024;

/// Bodies larger than this are "large reviews": at most [`Handlers`]'s large-review slots of them
/// are reviewed at once (one fewer than the runtime's workers, at least one), so that however many
/// costly reviews peers send together (issue 21: 260 connections each sending a 27 KB JobSet of 310
/// replicatedJobs, answered with 0.9 MB, each ~33 ms of CPU), a worker is always left for ordinary
/// reviews, health checks and TLS. An ordinary JobSet's review (a few replicatedJobs, an UPDATE with
/// its old object) is well below it.
pub const LARGE_REVIEW_BYTES: usize = 16 * 1024;

/// How long a large review waits for a slot before it is answered 429 with `Retry-After` (the API
/// server retries those): a burst of large reviews is shed instead of queued without bound.
pub const LARGE_REVIEW_WAIT: Duration = Duration::from_secs(2);

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

    /// Whether `/readyz` answers 200: set by [`super::serve`] once TLS is loaded and it accepts
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

/// What the HTTPS handlers share: the webhook, and the request-body budget and read timeout
/// every route reads bodies under. A harness may mount a route of its own beside the admission
/// routes ([`admission_routes`]) that reads bodies with [`Handlers::read_body`], on the same
/// budget.
#[derive(Clone, Debug)]
pub struct Handlers {
    webhook: Arc<Webhook>,
    body_read_timeout: Duration,
    /// One permit per byte of request body held.
    body_budget: Arc<Semaphore>,
    /// One permit per large review ([`LARGE_REVIEW_BYTES`]) being reviewed.
    large_reviews: Arc<Semaphore>,
}

impl Handlers {
    pub fn new(webhook: Arc<Webhook>, limits: BodyLimits) -> Self {
        let budget = limits
            .bytes_in_flight
            .clamp(admission::MAX_BODY_BYTES, Semaphore::MAX_PERMITS);
        Handlers {
            webhook,
            body_read_timeout: limits.read_timeout,
            body_budget: Arc::new(Semaphore::new(budget)),
            large_reviews: Arc::new(Semaphore::new(large_review_slots())),
        }
    }

    /// Reads a request's body as the admission routes do: at most
    /// [`admission::MAX_BODY_BYTES`], within the read timeout and the shared budget (held until
    /// the returned body is dropped). `Err` is the answer to send (413, 408, 429 or 400).
    pub async fn read_body(&self, request: Request) -> Result<ReadBody, Response> {
        let (parts, body) = request.into_parts();
        let read = read_body(
            &parts.headers,
            body,
            admission::MAX_BODY_BYTES,
            &self.body_budget,
            self.body_read_timeout,
        )
        .await
        .map_err(|reply| json_response(reply.http_status, reply.body));
        body_done(&parts);
        read
    }
}

/// The admission routes, `POST /mutate` and `POST /validate`, before their [`Handlers`] are
/// given (`.with_state(handlers)`).
pub fn admission_routes() -> Router<Handlers> {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
}

/// The HTTPS routes ([`admission_routes`]) with the default [`BodyLimits`].
pub fn router(webhook: Arc<Webhook>) -> Router {
    router_with(webhook, BodyLimits::default())
}

/// [`router`] with body limits.
pub fn router_with(webhook: Arc<Webhook>, limits: BodyLimits) -> Router {
    admission_routes().with_state(Handlers::new(webhook, limits))
}

/// The plain-HTTP routes: `/healthz`, `/readyz`, `/metrics`.
pub fn health_router(webhook: Arc<Webhook>) -> Router {
    health_router_with(webhook, true)
}

/// The plain-HTTP routes: `/healthz`, `/readyz`, and `/metrics` if `metrics` (else it is served
/// over HTTPS, `crate::metrics_auth`).
pub fn health_router_with(webhook: Arc<Webhook>, metrics: bool) -> Router {
    let ready = webhook.clone();
    let health = if metrics {
        crate::telemetry::Health::new(move || ready.is_ready(), move || webhook.metrics.encode())
    } else {
        crate::telemetry::Health::without_metrics(move || ready.is_ready())
    };
    crate::telemetry::health_router(health)
}

async fn mutate(State(state): State<Handlers>, request: Request) -> Response {
    admit(&state, Endpoint::Mutate, request).await
}

async fn validate(State(state): State<Handlers>, request: Request) -> Response {
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
        // The API server retries a webhook call answered 429 or with Retry-After. The connection
        // is closed too: a peer that overloads the server reconnects (a TLS handshake) before it
        // is served again, and pipelined requests behind this one are not reviewed.
        let headers = response.headers_mut();
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn error_reply(code: u16, reason: &str, message: &str) -> Reply {
    Reply::error(code, reason, message)
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
#[derive(Debug)]
pub struct ReadBody {
    bytes: Vec<u8>,
    _reserved: Option<OwnedSemaphorePermit>,
}

impl ReadBody {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
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

/// One fewer than the runtime's worker threads, at least one (outside a runtime: one).
fn large_review_slots() -> usize {
    tokio::runtime::Handle::try_current()
        .map(|h| h.metrics().num_workers())
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1)
}

/// Waits up to [`LARGE_REVIEW_WAIT`] for a large-review slot; `Err` is the 429 to answer.
async fn large_review_slot(slots: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, Reply> {
    match tokio::time::timeout(LARGE_REVIEW_WAIT, slots.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        // Timed out, or the semaphore closed (never: it is not closed).
        _ => Err(error_reply(
            429,
            "TooManyRequests",
            "too many large AdmissionReviews at once; retry shortly",
        )),
    }
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

/// The body of the request is read (or given up on): the connection is answering now, no longer
/// judged by the rate it sends at.
fn body_done(parts: &axum::http::request::Parts) {
    if let Some(progress) = parts.extensions.get::<crate::serving::conn::BodyProgress>() {
        progress.done();
    }
}

async fn answer(state: &Handlers, endpoint: Endpoint, request: Request) -> Reply {
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
    let read = read_body(
        &parts.headers,
        body,
        admission::MAX_BODY_BYTES,
        &state.body_budget,
        state.body_read_timeout,
    )
    .await;
    body_done(&parts);
    let body = match read {
        Ok(body) => body,
        Err(reply) => return reply,
    };
    let _slot = if body.bytes.len() > LARGE_REVIEW_BYTES {
        match large_review_slot(&state.large_reviews).await {
            Ok(permit) => Some(permit),
            Err(reply) => return reply,
        }
    } else {
        None
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

async fn admit(state: &Handlers, endpoint: Endpoint, request: Request) -> Response {
    let webhook = &state.webhook;
    let started = Instant::now();
    let _in_flight = webhook.metrics.in_flight();
    let reply = answer(state, endpoint, request).await;
    webhook.metrics.observe(
        endpoint,
        reply.decision.outcome,
        reply.http_status,
        started.elapsed(),
    );
    if reply.decision.outcome == ReviewOutcome::Denied {
        webhook.metrics.denied(endpoint, &reply.decision.rules);
    }
    tracing::debug!(
        endpoint = endpoint.as_str(),
        outcome = reply.decision.outcome.as_str(),
        status = reply.http_status,
        elapsed_us = started.elapsed().as_micros() as u64,
        "admission request"
    );
    json_response(reply.http_status, reply.body)
}

#[cfg(test)]
mod tests;
