//! What the agent and the reconciler share about API calls: the one timeout wrapper
//! ([`bounded`]), the one backoff (`backon`'s, kube-runtime's own: [`Backoff`], [`nth_delay`],
//! [`WatchBackoff`]) and the server's `Retry-After`.
//!
//! kube's client has a retry layer of its own, on by default: it retries a `429
//! TooManyRequests`, `503` or `504` inside one call, up to 15 times, sleeping exactly the
//! server's `Retry-After`. The agent and the reconciler turn it off ([`client_without_retries`]): thousands of
//! agents refused together by API Priority and Fairness would sleep the same `Retry-After` and
//! come back together, and the agent's per-call timeout ([`bounded`]) would count those sleeps
//! and abandon calls that were mostly sleeping (each abandoned HTTP/1.1 call closes its
//! connection, and the next one pays a new TLS handshake). Without it, a refusal reaches the
//! agent's code at once (its connection kept: the refusal's body is read to its end), a timeout
//! bounds one HTTP exchange, and the agent waits before retrying: its own jittered backoff, or
//! the server's `Retry-After` scaled by a random factor in `1 ..= 1.5` ([`jittered_delay`]) when
//! that is longer.
//!
//! What reaches our code is an API error like any other, which both retry forever with their
//! own backoff; [`retry_after`] makes that backoff honour the server's `Retry-After`, read from
//! the error's `Status` (`details.retryAfterSeconds`). The API server sets it along with the
//! header on its own `Status` answers, but API Priority and Fairness refuses with a plain-text
//! body and the header alone; [`client_without_retries`] adds a layer that copies the header
//! into the `Status` ([`status_with_retry_after`]).

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The longest server-requested delay honoured; a larger `Retry-After` is cut to this.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// An API call that failed, or did not answer within its limit ([`bounded`]).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl CallError {
    /// The delay the API server asked for ([`retry_after`]).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Api(e) => retry_after(e),
            CallError::Timeout(_) => None,
        }
    }
}

/// One API call bounded by `limit`: the one timeout wrapper of the agent, the reconciler and the
/// certificate manager.
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result.map_err(CallError::Api),
        Err(_) => Err(CallError::Timeout(limit)),
    }
}

/// The delay the API server asked for with this error (`429`, `503` or `504` with
/// `details.retryAfterSeconds`), at most [`RETRY_AFTER_MAX`].
pub fn retry_after(e: &kube::Error) -> Option<Duration> {
    match e {
        kube::Error::Api(status) => status_retry_after(status),
        _ => None,
    }
}

/// As [`retry_after`], for a `Status` (a watch's ERROR event carries one).
pub fn status_retry_after(status: &kube::core::Status) -> Option<Duration> {
    if !matches!(status.code, 429 | 503 | 504) {
        return None;
    }
    let secs = status.details.as_ref()?.retry_after_seconds;
    (secs > 0).then(|| Duration::from_secs(u64::from(secs)).min(RETRY_AFTER_MAX))
}

/// The longest error body [`client_without_retries`] reads to carry a `Retry-After` into it (an
/// API server's `Status` is a few hundred bytes).
const ERROR_BODY_MAX: usize = 64 * 1024;

/// A client built from `config` with kube's retry layer off, and the `Retry-After` header of a
/// `429`, `503` or `504` carried into the error's `Status` ([`status_with_retry_after`]), where
/// [`retry_after`] reads it: the caller owns its retries (see the module's documentation).
pub fn client_without_retries(config: kube::Config) -> Result<kube::Client, kube::Error> {
    client_without_retries_with(config, &tower::layer::util::Identity::new())
}

/// [`client_without_retries`] with `layer` on kube's stack below the `Retry-After` rewrite (the
/// reconciler's API-client metrics).
pub fn client_without_retries_with<L>(
    mut config: kube::Config,
    layer: &L,
) -> Result<kube::Client, kube::Error>
where
    L: tower::Layer<KubeStack>,
    L::Service: tower::Service<
            hyper::http::Request<kube::client::Body>,
            Response = ApiResponse,
            Error = tower::BoxError,
        > + Send
        + 'static,
    <L::Service as tower::Service<hyper::http::Request<kube::client::Body>>>::Future:
        Send + 'static,
{
    config.default_retry = false;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(layer)
        .with_layer(&tower::util::AndThenLayer::new(carry_retry_after))
        .build())
}

type ApiResponse = hyper::http::Response<Box<kube::client::DynBody>>;

/// The service stack `kube::client::ClientBuilder::try_from` builds (kube's `GenericService`,
/// which it does not export).
pub type KubeStack =
    tower::util::BoxService<hyper::http::Request<kube::client::Body>, ApiResponse, tower::BoxError>;

/// A `429`, `503` or `504` answer with a `Retry-After` header, its body rewritten as a `Status`
/// that carries it; any other answer as it is.
pub(crate) fn carry_retry_after(
    response: ApiResponse,
) -> futures::future::BoxFuture<'static, Result<ApiResponse, tower::BoxError>> {
    Box::pin(rewrite_retry_after(response))
}

async fn rewrite_retry_after(response: ApiResponse) -> Result<ApiResponse, tower::BoxError> {
    use http_body_util::BodyExt;
    use hyper::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};

    let code = response.status().as_u16();
    let header = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok());
    let Some(secs) = header_retry_after(code, header) else {
        return Ok(response);
    };
    let (mut parts, mut incoming) = response.into_parts();
    // Read to its end, so that the connection goes back to the pool.
    let mut body = Vec::new();
    while let Some(frame) = incoming.frame().await {
        if let Ok(data) = frame?.into_data() {
            if body.len() + data.len() > ERROR_BODY_MAX {
                return Err(format!("an error body over {ERROR_BODY_MAX} bytes").into());
            }
            body.extend_from_slice(&data);
        }
    }
    let json = serde_json::to_vec(&status_with_retry_after(code, &body, secs))?;
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body =
        http_body_util::Full::new(hyper::body::Bytes::from(json)).map_err(|never| match never {});
    Ok(ApiResponse::from_parts(parts, Box::new(body)))
}

/// The `Retry-After` header of a `429`, `503` or `504` answer, in seconds. The API server sends
/// whole seconds; zero, an HTTP date or anything else counts as none.
pub fn header_retry_after(code: u16, value: Option<&str>) -> Option<u32> {
    if !matches!(code, 429 | 503 | 504) {
        return None;
    }
    value?.trim().parse::<u32>().ok().filter(|secs| *secs > 0)
}

/// The `Status` of an error answer (`code`, `body`) with `retry_after_secs` as its
/// `details.retryAfterSeconds`, unless it names one already: the body as the API server wrote it
/// when it is a `Status`, else a `Status` with the body's text as its message (API Priority and
/// Fairness answers `Too many requests, please try again later.` in plain text).
pub fn status_with_retry_after(
    code: u16,
    body: &[u8],
    retry_after_secs: u32,
) -> kube::core::Status {
    let mut status = serde_json::from_slice::<kube::core::Status>(body).unwrap_or_else(|_| {
        let reason = match code {
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            _ => "Timeout",
        };
        kube::core::Status::failure(String::from_utf8_lossy(body).trim(), reason)
    });
    if status.code == 0 {
        status.code = code;
    }
    match &mut status.details {
        Some(details) if details.retry_after_seconds > 0 => {}
        Some(details) => details.retry_after_seconds = retry_after_secs,
        None => {
            status.details = Some(kube::core::response::StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: retry_after_secs,
            });
        }
    }
    status
}

/// The delay before a retry: the backoff's, or the server's when it asks for longer.
pub fn delay(backoff: Duration, server: Option<Duration>) -> Duration {
    server.map_or(backoff, |s| s.max(backoff))
}

/// How far [`jittered_delay`] stretches the server's `Retry-After` at most, in thousandths: it
/// waits between 1 and 1.5 times what the server asked for.
pub const RETRY_AFTER_SPREAD_PERMILLE: u32 = 500;

/// The delay before a retry when many clients may have been refused together: the backoff's, or
/// the server's `Retry-After` stretched by a random factor `1 + unit / 2` when that is longer.
/// `unit` is the random draw, uniform in `0..1` (injected, so that this stays a pure function;
/// clamped to `0..=1`, NaN counts as 0).
///
/// API Priority and Fairness refuses every agent of a namespace together (they are one flow)
/// with the same `Retry-After`; waiting exactly that brings them all back in the same instant,
/// to be refused together again. Stretched at random, they come back over half the interval.
pub fn jittered_delay(backoff: Duration, server: Option<Duration>, unit: f64) -> Duration {
    let unit = if unit.is_nan() {
        0.0
    } else {
        unit.clamp(0.0, 1.0)
    };
    // In 0..=500: the cast neither truncates nor wraps.
    let permille = (unit * f64::from(RETRY_AFTER_SPREAD_PERMILLE)).round() as u32;
    let server = server.map(|s| s.saturating_add(s.saturating_mul(permille) / 1000));
    delay(backoff, server)
}

/// Jittered exponential backoff, `backon`'s (kube-runtime's own): each delay is between half and
/// all of the current step, so that many clients failing together spread out; the step doubles
/// from `min` up to `max`. (backon's jitter adds up to one more step, so its steps here are half
/// of ours: the delays stay within `min / 2 ..= max`.)
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    steps: ExponentialBackoff,
    max: Duration,
    /// Draws the stretch of the server's `Retry-After` ([`Backoff::after`]).
    rng: fastrand::Rng,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self::build(min, max, None)
    }

    /// As [`Backoff::new`], with its random draws fixed by `seed` (tests).
    pub fn seeded(min: Duration, max: Duration, seed: u64) -> Self {
        Self::build(min, max, Some(seed))
    }

    fn build(min: Duration, max: Duration, seed: Option<u64>) -> Self {
        let max = max.max(min);
        let mut builder = ExponentialBuilder::new()
            .with_min_delay(min / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        if let Some(seed) = seed {
            builder = builder.with_jitter_seed(seed);
        }
        Backoff {
            builder,
            steps: builder.build(),
            max,
            rng: seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed),
        }
    }

    /// Back to the first step.
    pub fn reset(&mut self) {
        self.steps = self.builder.build();
    }

    /// The next delay.
    pub fn advance(&mut self) -> Duration {
        // Never `None`: the backoff is built without a limit on retries or their total.
        self.steps.next().unwrap_or(self.max).min(self.max)
    }

    /// The delay before the next retry after a failure: the next step, or the server's
    /// `Retry-After` (`server`) stretched at random when longer ([`jittered_delay`]).
    pub fn after(&mut self, server: Option<Duration>) -> Duration {
        let step = self.advance();
        jittered_delay(step, server, self.rng.f64())
    }
}

/// The delay before retry number `failures` (1 is the first) of a backoff without jitter that
/// doubles from `min` up to `max` (the reconciler's per-JobSet retries: one count per key is
/// all the state they keep), or what the API server asked for (`Retry-After`) when longer.
pub fn nth_delay(
    min: Duration,
    max: Duration,
    failures: u32,
    server: Option<Duration>,
) -> Duration {
    let backoff = ExponentialBuilder::new()
        .with_min_delay(min)
        .with_max_delay(max.max(min))
        .with_factor(2.0)
        .without_max_times()
        .build()
        // Past the 32nd step the delay is long at `max` for any `min`.
        .nth(failures.clamp(1, 32) as usize - 1)
        .unwrap_or(max);
    // backon multiplies in `f32`: 400 ms doubled is 800.000012 ms; whole milliseconds.
    let backoff = Duration::from_millis(
        u64::try_from(backoff.as_micros().saturating_add(500) / 1000).unwrap_or(u64::MAX),
    );
    delay(backoff, server)
}

/// The backoff of the reconciler's watches (kube's `StreamBackoff` pauses the watch for it after
/// every error): [`Backoff`] from 200 ms to 5 s, starting over when the previous error is more
/// than 10 s old.
///
/// kube's default (client-go's: 800 ms doubling to 30 s, reset only by an object event or after
/// 2 minutes without error) lets isolated watch failures add up: a quiet watch (no pod changed,
/// as while a job trains) that fails to restart a few times in a row, each time after it
/// worked again for a while, is then paused for up to 30 s, and a group restart that begins
/// meanwhile waits for it. Here a burst of failures backs off to at most 5 s, and failures
/// that are not part of one start from 200 ms again. One reconciler has three watches: retrying
/// them every 5 s during an outage costs the API server nothing.
#[derive(Debug)]
pub struct WatchBackoff {
    backoff: Backoff,
    /// An error this long after the previous one starts over.
    quiet: Duration,
    last: Option<Instant>,
}

impl WatchBackoff {
    pub const MIN: Duration = Duration::from_millis(200);
    pub const MAX: Duration = Duration::from_secs(5);
    pub const QUIET: Duration = Duration::from_secs(10);

    pub fn new() -> Self {
        WatchBackoff {
            backoff: Backoff::new(Self::MIN, Self::MAX),
            quiet: Self::QUIET,
            last: None,
        }
    }

    fn next_at(&mut self, now: Instant) -> Duration {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > self.quiet)
        {
            self.backoff.reset();
        }
        self.last = Some(now);
        self.backoff.advance()
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_at(Instant::now()))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.backoff.reset();
    }
}

#[cfg(test)]
mod tests;
