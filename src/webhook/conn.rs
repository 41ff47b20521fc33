//! What each connection of the webhook is doing, for its timeouts and for eviction when the
//! connection limit is reached.
//!
//! A connection is in one [`Phase`] at a time: its TLS handshake, the head of a request (from the
//! end of the handshake, or from the first byte after a response), a request being answered, or
//! idle between requests. [`Activity`] records the phase and when it began; [`Watched`] (the
//! connection's I/O) moves it from idle to head on the first byte read, [`Tracked`] (the
//! connection's service) to request and back to idle. Nothing wakes the connection's task on a
//! phase change (that would cost a wake-up and a timer per request): it sleeps until the current
//! phase's deadline, never longer than the header timeout, and looks again. A head that begins
//! while it sleeps began after it last looked, so its deadline is no earlier than the wake-up.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tower::ServiceExt as _;

/// Under the connection limit, a connection still in its handshake or its first request head
/// after this long is closed to make room (an idle one at once). Clients on a cluster network
/// send a head within milliseconds of connecting; a slow-loris one is still at it.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// Under the connection limit, a connection reading a request body is closed to make room once it
/// has been at it for [`EVICTABLE_AFTER`] and has sent less than this many bytes per second on
/// average: the API server sends a body at once; a client that trickles one holds a slot and a
/// share of the body budget for nothing (issue 11).
pub const MIN_BODY_BYTES_PER_SEC: u64 = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The TLS handshake.
    Handshake,
    /// Reading a request head (or waiting for the first one).
    Head,
    /// Reading a request's body.
    Body,
    /// A request is being answered (its body read: reviewed, answered).
    Request,
    /// Between requests, on a keep-alive connection.
    Idle,
}

/// Why the server closed a connection on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// No complete request head within `--header-read-timeout`.
    HeaderTimeout,
    /// No new request within `--idle-timeout` of the last one.
    IdleTimeout,
    /// Closed to make room under `--max-connections`.
    Evicted,
}

impl Cut {
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::HeaderTimeout => "header_timeout",
            Cut::IdleTimeout => "idle_timeout",
            Cut::Evicted => "evicted",
        }
    }
}

/// The timeouts a connection's phases are held to.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub handshake: Duration,
    pub header_read: Duration,
    pub idle: Duration,
}

/// The phase of one connection and when it began.
#[derive(Debug)]
pub struct Activity {
    /// The phase, when it began, and the bytes read since.
    state: Mutex<(Phase, Instant, u64)>,
}

impl Activity {
    pub fn new(phase: Phase) -> Arc<Self> {
        Arc::new(Activity {
            state: Mutex::new((phase, Instant::now(), 0)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Instant, u64)> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn get(&self) -> (Phase, Instant) {
        let (phase, since, _) = *self.lock();
        (phase, since)
    }

    pub fn set(&self, phase: Phase) {
        *self.lock() = (phase, Instant::now(), 0);
    }

    /// `n` bytes arrived: an idle connection starts a request head.
    fn bytes_read(&self, n: usize) {
        let mut state = self.lock();
        if state.0 == Phase::Idle {
            *state = (Phase::Head, Instant::now(), 0);
        }
        state.2 = state.2.saturating_add(n as u64);
    }

    /// When to look at the connection next: its phase's deadline, but no later than one header
    /// timeout from `now` (a head may begin meanwhile, unannounced).
    pub fn next_check(&self, timeouts: &Timeouts, now: Instant) -> Instant {
        let latest = now + timeouts.header_read;
        self.deadline(timeouts)
            .map_or(latest, |(at, _)| at.min(latest))
    }

    /// The phase's cut, if its deadline has passed at `now`.
    pub fn expired(&self, timeouts: &Timeouts, now: Instant) -> Option<Cut> {
        self.deadline(timeouts)
            .and_then(|(at, cut)| (at <= now).then_some(cut))
    }

    /// When the current phase times out, and as what; `None` while a request is answered (its
    /// body has its own deadline).
    pub fn deadline(&self, timeouts: &Timeouts) -> Option<(Instant, Cut)> {
        let (phase, since) = self.get();
        match phase {
            Phase::Handshake => Some((since + timeouts.handshake, Cut::HeaderTimeout)),
            Phase::Head => Some((since + timeouts.header_read, Cut::HeaderTimeout)),
            Phase::Idle => Some((since + timeouts.idle, Cut::IdleTimeout)),
            Phase::Body | Phase::Request => None,
        }
    }

    /// Whether the connection may be closed to make room for a new one: idle, stuck in its
    /// handshake or a request head for [`EVICTABLE_AFTER`], or reading a body slower than
    /// [`MIN_BODY_BYTES_PER_SEC`] for as long.
    pub fn evictable(&self) -> bool {
        self.evictable_at(Instant::now())
    }

    fn evictable_at(&self, now: Instant) -> bool {
        let (phase, since, bytes) = *self.lock();
        let age = now.saturating_duration_since(since);
        match phase {
            Phase::Idle => true,
            Phase::Handshake | Phase::Head => age >= EVICTABLE_AFTER,
            Phase::Body => {
                age >= EVICTABLE_AFTER
                    && u128::from(bytes) * 1000
                        < u128::from(MIN_BODY_BYTES_PER_SEC) * age.as_millis()
            }
            Phase::Request => false,
        }
    }
}

/// A connection's I/O, reporting reads to its [`Activity`].
#[derive(Debug)]
pub struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I> Watched<I> {
    pub fn new(inner: I, activity: Arc<Activity>) -> Self {
        Watched { inner, activity }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if matches!(result, Poll::Ready(Ok(()))) && read > 0 {
            self.activity.bytes_read(read);
        }
        result
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection's service: the router, with the request phase recorded around each call, and
/// `Connection: close` on every answer while `draining`.
#[derive(Clone, Debug)]
pub struct Tracked {
    router: Router,
    activity: Arc<Activity>,
    draining: Arc<AtomicBool>,
}

impl Tracked {
    pub fn new(router: Router, activity: Arc<Activity>, draining: Arc<AtomicBool>) -> Self {
        Tracked {
            router,
            activity,
            draining,
        }
    }
}

/// In a request's extensions: the handler that reads the body says when it has all of it
/// ([`BodyProgress::done`]), and the connection is no longer judged by its body rate.
#[derive(Clone, Debug)]
pub struct BodyProgress(Arc<Activity>);

impl BodyProgress {
    /// The body is read: the request is being answered.
    pub fn done(&self) {
        self.0.set(Phase::Request);
    }
}

/// Marks the request phase; idle again when dropped (answered, or abandoned with the
/// connection).
struct InRequest(Arc<Activity>);

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.set(Phase::Idle);
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        self.activity.set(Phase::Body);
        request
            .extensions_mut()
            .insert(BodyProgress(self.activity.clone()));
        let in_request = InRequest(self.activity.clone());
        let router = self.router.clone();
        let draining = self.draining.clone();
        Box::pin(async move {
            let mut response = router.oneshot(request).await;
            if draining.load(Ordering::Acquire)
                && let Ok(response) = response.as_mut()
            {
                // hyper closes the connection after writing an answer that says so.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            drop(in_request);
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts() -> Timeouts {
        Timeouts {
            handshake: Duration::from_secs(1),
            header_read: Duration::from_secs(2),
            idle: Duration::from_secs(3),
        }
    }

    #[test]
    fn phases_have_their_own_deadlines_and_eviction_rules() {
        let activity = Activity::new(Phase::Handshake);
        let start = activity.get().1;
        assert_eq!(
            activity.deadline(&timeouts()),
            Some((start + Duration::from_secs(1), Cut::HeaderTimeout))
        );
        assert!(!activity.evictable_at(start));
        assert!(
            activity.evictable_at(start + EVICTABLE_AFTER),
            "a handshake this old"
        );

        activity.set(Phase::Head);
        let head = activity.get().1;
        assert!(!activity.evictable_at(head), "a fresh head");
        assert!(
            activity.evictable_at(head + EVICTABLE_AFTER),
            "a stuck head"
        );
        activity.set(Phase::Request);
        assert_eq!(activity.deadline(&timeouts()), None);
        assert!(
            !activity.evictable_at(head + Duration::from_secs(3600)),
            "never while answering"
        );
        activity.set(Phase::Request);
        let answering = activity.get().1;
        assert!(
            !activity.evictable_at(answering + Duration::from_secs(3600)),
            "never while answering"
        );

        activity.set(Phase::Idle);
        let idle_since = activity.get().1;
        assert!(activity.evictable_at(idle_since));
        assert_eq!(
            activity.deadline(&timeouts()),
            Some((idle_since + Duration::from_secs(3), Cut::IdleTimeout))
        );
        // A byte of a new request: a head, with the header timeout from then.
        activity.bytes_read(1);
        let (phase, since) = activity.get();
        assert_eq!(phase, Phase::Head);
        assert!(since >= idle_since);
        assert_eq!(
            activity.deadline(&timeouts()),
            Some((since + Duration::from_secs(2), Cut::HeaderTimeout))
        );
        // Further bytes of the same head do not move its deadline.
        std::thread::sleep(Duration::from_millis(5));
        activity.bytes_read(1);
        assert_eq!(activity.get(), (Phase::Head, since));
    }

    /// Issue 11: a body sent slowly holds its slot only until the limit is reached.
    #[test]
    fn a_slow_body_is_evictable_a_fast_one_and_an_answer_are_not() {
        let activity = Activity::new(Phase::Body);
        let start = activity.get().1;
        assert!(!activity.evictable_at(start), "a fresh body");
        activity.bytes_read(1);
        assert!(
            activity.evictable_at(start + EVICTABLE_AFTER),
            "a byte in a second"
        );
        activity.set(Phase::Body);
        let start = activity.get().1;
        activity.bytes_read(MIN_BODY_BYTES_PER_SEC as usize * 2);
        assert!(
            !activity.evictable_at(start + EVICTABLE_AFTER),
            "a body arriving at speed"
        );
        assert!(
            activity.evictable_at(start + 3 * EVICTABLE_AFTER),
            "then stalled"
        );
        assert_eq!(activity.deadline(&timeouts()), None, "its own read timeout");
        // Read whole: answered, never evicted however long the review takes.
        BodyProgress(activity.clone()).done();
        let (phase, since) = activity.get();
        assert_eq!(phase, Phase::Request);
        assert!(!activity.evictable_at(since + Duration::from_secs(3600)));
    }

    #[test]
    fn a_head_that_begins_unannounced_is_cut_on_time() {
        let t = timeouts();
        let activity = Activity::new(Phase::Idle);
        let looked = activity.get().1;
        // Idle: looked at again within one header timeout, not at the idle deadline.
        let wake = activity.next_check(&t, looked);
        assert_eq!(wake, looked + t.header_read);
        assert_eq!(activity.expired(&t, wake), None);
        // A head began after the last look: its deadline is no earlier than the wake-up.
        activity.bytes_read(1);
        let (_, head) = activity.get();
        assert!(head + t.header_read >= wake);
        assert_eq!(activity.next_check(&t, wake), head + t.header_read);
        assert_eq!(
            activity.expired(&t, head + t.header_read),
            Some(Cut::HeaderTimeout)
        );
        // A request: looked at every header timeout, never cut.
        activity.set(Phase::Request);
        let (_, since) = activity.get();
        assert_eq!(activity.next_check(&t, since), since + t.header_read);
        assert_eq!(
            activity.expired(&t, since + Duration::from_secs(3600)),
            None
        );
    }
}
