//! What the agent and the reconciler share about retrying API calls.
//!
//! Both use kube's client with its default retry layer: a `429 TooManyRequests`, `503` or `504`
//! is retried inside the client (up to 15 times, waiting the `Retry-After` header when it asks
//! for longer than the client's own backoff). What reaches our code after that is an API error
//! like any other, which both retry forever with their own backoff; [`retry_after`] makes that
//! backoff honour the server's `Retry-After` too, read from the error's `Status`
//! (`details.retryAfterSeconds`, which the API server sets along with the header).

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

/// The longest server-requested delay honoured; a larger `Retry-After` is cut to this.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

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

/// Jittered exponential backoff: each delay is between half and all of the current step, so
/// that many clients failing together spread out; the step doubles from `min` up to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// Back to the first step.
    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The next delay.
    pub fn advance(&mut self) -> Duration {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let fraction = 0.5 + (random % 1024) as f64 / 2048.0;
        let delay = self.next.mul_f64(fraction);
        self.next = (self.next * 2).min(self.max);
        delay
    }
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
#[derive(Clone, Debug)]
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
    fn backoff_grows_and_resets() {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(5));
        let mut b = Backoff::new(min, max);
        let first = b.advance();
        assert!(first >= min / 2 && first <= min, "{first:?}");
        for _ in 0..10 {
            assert!(b.advance() <= max);
        }
        assert_eq!(b.next, max);
        b.reset();
        assert_eq!(b.next, min);
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

    #[test]
    fn the_longer_delay_wins() {
        let ms = Duration::from_millis;
        assert_eq!(delay(ms(50), None), ms(50));
        assert_eq!(delay(ms(50), Some(ms(1000))), ms(1000));
        assert_eq!(delay(ms(5000), Some(ms(1000))), ms(5000));
    }
}
