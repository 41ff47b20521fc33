//! What the agent and the reconciler share about API calls: the one timeout wrapper
//! ([`bounded`]), the one backoff (`backon`'s, kube-runtime's own: [`Backoff`], [`nth_delay`],
//! [`WatchBackoff`]) and the server's `Retry-After`.
//!
//! Both use kube's client with its default retry layer: a `429 TooManyRequests`, `503` or `504`
//! is retried inside the client (up to 15 times, waiting the `Retry-After` header when it asks
//! for longer than the client's own backoff). What reaches our code after that is an API error
//! like any other, which both retry forever with their own backoff; [`retry_after`] makes that
//! backoff honour the server's `Retry-After` too, read from the error's `Status`
//! (`details.retryAfterSeconds`, which the API server sets along with the header).

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

/// The delay the API server asked for with this error (`429` or `503` with
/// `details.retryAfterSeconds`), at most [`RETRY_AFTER_MAX`].
pub fn retry_after(e: &kube::Error) -> Option<Duration> {
    match e {
        kube::Error::Api(status) => status_retry_after(status),
        _ => None,
    }
}

/// As [`retry_after`], for a `Status` (a watch's ERROR event carries one).
pub fn status_retry_after(status: &kube::core::Status) -> Option<Duration> {
    if !matches!(status.code, 429 | 503) {
        return None;
    }
    let secs = status.details.as_ref()?.retry_after_seconds;
    (secs > 0).then(|| Duration::from_secs(u64::from(secs)).min(RETRY_AFTER_MAX))
}

/// The delay before a retry: the backoff's, or the server's when it asks for longer.
pub fn delay(backoff: Duration, server: Option<Duration>) -> Duration {
    server.map_or(backoff, |s| s.max(backoff))
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
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        let builder = ExponentialBuilder::new()
            .with_min_delay(min / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            builder,
            steps: builder.build(),
            max,
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
    fn reads_retry_after_of_429_and_503_only() {
        assert_eq!(
            retry_after(&status(429, Some(3))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&status(503, Some(1))),
            Some(Duration::from_secs(1))
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

    #[tokio::test]
    async fn bounded_calls_answer_or_time_out() {
        let limit = Duration::from_millis(50);
        let answered = bounded(limit, async { Ok::<_, kube::Error>(7) }).await;
        assert!(matches!(answered, Ok(7)), "{answered:?}");
        let refused = bounded(limit, async { Err::<(), _>(status(429, Some(3))) }).await;
        assert_eq!(
            refused.as_ref().err().and_then(CallError::retry_after),
            Some(Duration::from_secs(3))
        );
        let start = Instant::now();
        let silent = bounded(limit, std::future::pending::<Result<(), kube::Error>>()).await;
        assert!(
            matches!(silent, Err(CallError::Timeout(d)) if d == limit),
            "{silent:?}"
        );
        assert!(start.elapsed() >= limit, "{:?}", start.elapsed());
    }

    #[test]
    fn the_longer_delay_wins() {
        let ms = Duration::from_millis;
        assert_eq!(delay(ms(50), None), ms(50));
        assert_eq!(delay(ms(50), Some(ms(1000))), ms(1000));
        assert_eq!(delay(ms(5000), Some(ms(1000))), ms(5000));
    }
}
