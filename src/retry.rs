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
pub fn client_without_retries(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&tower::util::AndThenLayer::new(carry_retry_after))
        .build())
}

type ApiResponse = hyper::http::Response<Box<kube::client::DynBody>>;

/// A `429`, `503` or `504` answer with a `Retry-After` header, its body rewritten as a `Status`
/// that carries it; any other answer as it is.
fn carry_retry_after(
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
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<u32>) -> kube::Error {
        let mut s = kube::core::Status::failure("x", "TooManyRequests").with_code(code);
        if let Some(secs) = retry_after {
            let details = serde_json::from_value(serde_json::json!({"retryAfterSeconds": secs}))
                .expect("details");
            s = s.with_details(details);
        }
        kube::Error::Api(s.boxed())
    }

    #[test]
    fn reads_retry_after_of_429_503_and_504_only() {
        assert_eq!(
            retry_after(&status(429, Some(3))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&status(503, Some(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(&status(504, Some(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(retry_after(&status(429, None)), None);
        assert_eq!(retry_after(&status(429, Some(0))), None);
        assert_eq!(retry_after(&status(500, Some(3))), None);
        assert_eq!(retry_after(&status(429, Some(3600))), Some(RETRY_AFTER_MAX));
    }

    #[test]
    fn backoff_grows_within_its_bounds_and_resets() {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(5));
        let mut b = Backoff::new(min, max);
        let first = b.advance();
        assert!(first >= min / 2 && first <= min, "{first:?}");
        let second = b.advance();
        assert!(second >= min && second <= min * 2, "{second:?}");
        let later: Vec<Duration> = (0..30).map(|_| b.advance()).skip(10).collect();
        assert!(
            later.iter().all(|d| *d >= max / 2 && *d <= max),
            "{later:?}"
        );
        b.reset();
        let again = b.advance();
        assert!(again >= min / 2 && again <= min, "{again:?}");
    }

    #[test]
    fn the_nth_delay_doubles_to_its_cap_and_honours_retry_after() {
        let ms = Duration::from_millis;
        let nth = |failures, server| nth_delay(ms(400), ms(10_000), failures, server);
        assert_eq!(nth(0, None), ms(400));
        assert_eq!(nth(1, None), ms(400));
        assert_eq!(nth(2, None), ms(800));
        assert_eq!(nth(5, None), ms(6_400));
        assert_eq!(nth(6, None), ms(10_000));
        assert_eq!(nth(u32::MAX, None), ms(10_000));
        assert_eq!(nth(1, Some(ms(3_000))), ms(3_000));
        assert_eq!(nth(40, Some(ms(3_000))), ms(10_000));
    }

    #[test]
    fn watch_backoff_is_capped_and_starts_over_after_a_quiet_spell() {
        let mut b = WatchBackoff::new();
        let t0 = Instant::now();
        // A burst: errors a second apart grow the delay up to the cap.
        let burst: Vec<Duration> = (0..12)
            .map(|i| b.next_at(t0 + Duration::from_secs(i)))
            .collect();
        assert!(burst[0] <= WatchBackoff::MIN, "{burst:?}");
        assert!(burst.iter().all(|d| *d <= WatchBackoff::MAX), "{burst:?}");
        assert!(burst[11] >= WatchBackoff::MAX / 2, "{burst:?}");
        // An error long after the last one is not part of the burst.
        let later = b.next_at(t0 + Duration::from_secs(11) + WatchBackoff::QUIET * 2);
        assert!(later <= WatchBackoff::MIN, "{later:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_calls_answer_or_time_out() {
        let limit = Duration::from_millis(50);
        let answered = bounded(limit, async { Ok::<_, kube::Error>(7) }).await;
        assert!(matches!(answered, Ok(7)), "{answered:?}");
        let refused = bounded(limit, async { Err::<(), _>(status(429, Some(3))) }).await;
        assert_eq!(
            refused.as_ref().err().and_then(CallError::retry_after),
            Some(Duration::from_secs(3))
        );
        let start = tokio::time::Instant::now();
        let silent = bounded(limit, std::future::pending::<Result<(), kube::Error>>()).await;
        assert!(
            matches!(silent, Err(CallError::Timeout(d)) if d == limit),
            "{silent:?}"
        );
        // On the paused clock: at the limit exactly.
        assert_eq!(start.elapsed(), limit);
    }

    #[test]
    fn reads_the_retry_after_header_of_429_503_and_504_in_whole_seconds() {
        let read = header_retry_after;
        assert_eq!(read(429, Some("1")), Some(1));
        assert_eq!(read(503, Some(" 7 ")), Some(7));
        assert_eq!(read(504, Some("32")), Some(32));
        assert_eq!(read(429, Some(&u32::MAX.to_string())), Some(u32::MAX));
        for code in [200, 400, 409, 410, 422, 500, 502] {
            assert_eq!(read(code, Some("1")), None, "{code}");
        }
        for value in [
            None,
            Some(""),
            Some("0"),
            Some("-1"),
            Some("1.5"),
            Some("4294967296"),
            Some("soon"),
            Some("Wed, 21 Oct 2015 07:28:00 GMT"),
        ] {
            assert_eq!(read(429, value), None, "{value:?}");
        }
    }

    #[test]
    fn carries_the_header_into_the_status_unless_it_names_a_delay() {
        let after =
            |status: &kube::core::Status| status.details.as_ref().map(|d| d.retry_after_seconds);
        // API Priority and Fairness: plain text, the header alone.
        let plain =
            status_with_retry_after(429, b"Too many requests, please try again later.\n", 3);
        assert_eq!(plain.code, 429);
        assert_eq!(plain.reason, "TooManyRequests");
        assert_eq!(plain.message, "Too many requests, please try again later.");
        assert_eq!(after(&plain), Some(3));
        assert_eq!(
            retry_after(&kube::Error::Api(plain.boxed())),
            Some(Duration::from_secs(3))
        );
        // The API server's own Status: kept, its delay first.
        let own = br#"{"kind":"Status","code":429,"reason":"TooManyRequests","message":"m","details":{"name":"p","retryAfterSeconds":5}}"#;
        let kept = status_with_retry_after(429, own, 3);
        assert_eq!((kept.code, kept.message.as_str()), (429, "m"));
        assert_eq!(after(&kept), Some(5));
        assert_eq!(kept.details.map(|d| d.name), Some("p".to_owned()));
        let no_delay = br#"{"kind":"Status","code":503,"message":"m","details":{"name":"p"}}"#;
        assert_eq!(after(&status_with_retry_after(503, no_delay, 2)), Some(2));
        let no_details = br#"{"kind":"Status","code":504,"reason":"Timeout"}"#;
        let timeout = status_with_retry_after(504, no_details, 4);
        assert_eq!((timeout.code, after(&timeout)), (504, Some(4)));
        // Whatever else the body holds: a Status of the answer's code.
        for (code, body, reason) in [
            (503, &b""[..], "ServiceUnavailable"),
            (504, &b"\xff\xfe gateway"[..], "Timeout"),
            (429, &b"<html>busy</html>"[..], "TooManyRequests"),
        ] {
            let s = status_with_retry_after(code, body, 1);
            assert_eq!(
                (s.code, s.reason.as_str(), after(&s)),
                (code, reason, Some(1))
            );
        }
        assert_eq!(status_with_retry_after(429, b"{}", 6).code, 429);
    }

    #[test]
    fn jittered_delay_stretches_retry_after_by_one_to_one_and_a_half() {
        let ms = Duration::from_millis;
        let s = Some(ms(1000));
        assert_eq!(jittered_delay(ms(50), s, 0.0), ms(1000));
        assert_eq!(jittered_delay(ms(50), s, 0.5), ms(1250));
        assert_eq!(jittered_delay(ms(50), s, 1.0), ms(1500));
        // Out of range draws are clamped; NaN counts as no stretch.
        assert_eq!(jittered_delay(ms(50), s, -3.0), ms(1000));
        assert_eq!(jittered_delay(ms(50), s, 7.0), ms(1500));
        assert_eq!(jittered_delay(ms(50), s, f64::INFINITY), ms(1500));
        assert_eq!(jittered_delay(ms(50), s, f64::NEG_INFINITY), ms(1000));
        assert_eq!(jittered_delay(ms(50), s, f64::NAN), ms(1000));
        // Without a server's delay, or with a shorter one, the backoff.
        assert_eq!(jittered_delay(ms(70), None, 0.9), ms(70));
        assert_eq!(jittered_delay(ms(4000), s, 0.9), ms(4000));
        assert_eq!(jittered_delay(ms(1200), s, 0.5), ms(1250));
        // The longest is bounded: the longest server delay honoured, stretched.
        assert_eq!(
            jittered_delay(ms(0), Some(RETRY_AFTER_MAX), 1.0),
            RETRY_AFTER_MAX * 3 / 2
        );
        assert_eq!(
            jittered_delay(ms(0), Some(Duration::MAX), 1.0),
            Duration::MAX
        );
        // Monotone in the draw, within [s, 1.5 s], every thousandth.
        let mut last = Duration::ZERO;
        for i in 0..=1000 {
            let d = jittered_delay(ms(5), s, f64::from(i) / 1000.0);
            assert!(d >= ms(1000) && d <= ms(1500) && d >= last, "{i}: {d:?}");
            last = d;
        }
    }

    #[test]
    fn backoff_after_spreads_retry_after_over_half_of_it() {
        let one = Duration::from_secs(1);
        // 1,000 agents refused together, each with its own generator: how many wait in each
        // fifth of 1 s ..= 1.5 s.
        let mut fifths = [0u32; 5];
        for seed in 0..1000 {
            let mut b = Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, seed);
            let d = b.after(Some(one));
            assert!(d >= one && d <= one * 3 / 2, "{d:?}");
            let fifth = ((d - one).as_millis() / 100).min(4) as usize;
            fifths[fifth] += 1;
        }
        assert!(fifths.iter().all(|n| *n >= 120), "{fifths:?}");
        // No server delay: the backoff's own steps.
        let mut b = Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, 7);
        let d = b.after(None);
        assert!(d >= BACKOFF_MIN / 2 && d <= BACKOFF_MIN, "{d:?}");
        // The same seed draws the same delays (the tests' determinism).
        let draws = |seed| {
            let mut b = Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, seed);
            (0..5).map(|_| b.after(Some(one))).collect::<Vec<_>>()
        };
        assert_eq!(draws(3), draws(3));
    }

    /// What the loopback server of [`refusing_server`] saw.
    #[derive(Default)]
    struct Seen {
        connections: usize,
        requests: usize,
        /// When each pod's first GET was refused.
        refused: std::collections::HashMap<String, Instant>,
        /// How long after its refusal each pod's retry came.
        retried_after: std::collections::HashMap<String, Duration>,
    }

    type Answer = hyper::Response<http_body_util::Full<hyper::body::Bytes>>;

    /// Refuses each pod's first GET as API Priority and Fairness does (429, a plain-text body,
    /// `Retry-After: 1`), answers the next ones with the pod.
    fn answer(seen: &std::sync::Mutex<Seen>, path: &str) -> Answer {
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        let now = Instant::now();
        let mut seen = seen.lock().unwrap();
        seen.requests += 1;
        let (code, retry_after, body) = match seen.refused.get(&name) {
            None => {
                seen.refused.insert(name, now);
                (
                    429,
                    Some("1"),
                    "Too many requests, please try again later.\n".to_owned(),
                )
            }
            Some(at) => {
                let after = now - *at;
                seen.retried_after.entry(name.clone()).or_insert(after);
                let pod = serde_json::json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "ns"},
                });
                (200, None, pod.to_string())
            }
        };
        let mut response = hyper::Response::builder().status(code);
        if let Some(secs) = retry_after {
            response = response.header("Retry-After", secs);
        }
        response
            .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
            .unwrap()
    }

    async fn refusing_server() -> (
        std::net::SocketAddr,
        std::sync::Arc<std::sync::Mutex<Seen>>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
        let log = seen.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                log.lock().unwrap().connections += 1;
                let log = log.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let answer = answer(&log, req.uri().path());
                            async move { Ok::<_, std::convert::Infallible>(answer) }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, seen, server)
    }

    /// Many agents refused together by a loopback server (429, `Retry-After: 1`), each on a
    /// client of [`client_without_retries`] retrying as the agent does ([`Backoff::after`]) with
    /// a per-call timeout shorter than the `Retry-After`: every retry waits at least what the
    /// server asked; the retries spread over the following half second rather than arriving
    /// together; no call times out (the wait is not inside the call); and each agent keeps its
    /// one connection (the refusal is read to its end).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn agents_refused_together_come_back_apart_on_their_connections() {
        use k8s_openapi::api::core::v1::Pod;
        const AGENTS: usize = 50;
        let (addr, seen, server) = refusing_server().await;
        let call_timeout = Duration::from_millis(500);
        let agents = (0..AGENTS).map(|i| {
            tokio::spawn(async move {
                let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
                config.root_cert = Some(Vec::new());
                let client = client_without_retries(config).unwrap();
                let pods: kube::Api<Pod> = kube::Api::namespaced(client, "ns");
                let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
                let mut timeouts = 0;
                for _ in 0..5 {
                    match bounded(call_timeout, pods.get(&format!("p{i}"))).await {
                        Ok(_) => return Ok(timeouts),
                        Err(e) => {
                            timeouts += usize::from(matches!(e, CallError::Timeout(_)));
                            tokio::time::sleep(backoff.after(e.retry_after())).await;
                        }
                    }
                }
                Err(format!("p{i}: no answer in 5 tries"))
            })
        });
        let outcome =
            tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(agents)).await;
        server.abort();
        let timeouts: usize = outcome
            .expect("the agents within 60 s")
            .into_iter()
            .map(|r| r.expect("the agent's task").expect("the agent's pod"))
            .sum();
        let seen = seen.lock().unwrap();
        assert_eq!(timeouts, 0, "a wait was counted as a timeout");
        assert_eq!(seen.requests, 2 * AGENTS, "one refusal and one retry each");
        assert_eq!(seen.connections, AGENTS, "a connection each, kept");
        let waits: Vec<Duration> = seen.retried_after.values().copied().collect();
        assert_eq!(waits.len(), AGENTS);
        let (first, last) = (
            waits.iter().min().copied().unwrap_or_default(),
            waits.iter().max().copied().unwrap_or_default(),
        );
        assert!(first >= Duration::from_secs(1), "{first:?} < Retry-After");
        // Uniform over 1 s ..= 1.5 s, 50 draws: a spread under 200 ms (0.4 of the interval) has
        // a chance under 50 x 0.4^49 (1e-18), and a loaded machine only adds noise; retries in
        // lockstep (kube's retry layer) would spread over a few milliseconds.
        assert!(
            last - first >= Duration::from_millis(200),
            "retries in lockstep: {first:?} ..= {last:?}"
        );
    }

    const BACKOFF_MIN: Duration = Duration::from_millis(50);
    const BACKOFF_MAX: Duration = Duration::from_secs(5);

    #[test]
    fn the_longer_delay_wins() {
        let ms = Duration::from_millis;
        assert_eq!(delay(ms(50), None), ms(50));
        assert_eq!(delay(ms(50), Some(ms(1000))), ms(1000));
        assert_eq!(delay(ms(5000), Some(ms(1000))), ms(5000));
    }
}
