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
//!
//! Answers (issue 21): the bytes of an answer that the connection has not yet written to its
//! socket are owed, counted per connection and against an [`AnswerBudget`] every connection of
//! the process shares. An answer that does not fit the budget is replaced by a 429 (small ones
//! always fit: each connection owes at most one answer, below); owed bytes must drain at
//! [`MIN_ANSWER_BYTES_PER_SEC`] after a grace of [`DRAIN_GRACE`], else the connection is cut
//! ([`Cut::SlowReader`]); and a pipelined request is not handed to the routes while the answer
//! before it is owed. The start of an answer wakes the connection's task, so that its drain
//! deadline is looked at.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
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

/// A connection that owes answer bytes must write them at this rate on average, from
/// [`DRAIN_GRACE`] after it began owing, or it is closed: the API server reads an answer at
/// once; a client that does not holds the answer's memory (issue 21).
pub const MIN_ANSWER_BYTES_PER_SEC: u64 = 64 * 1024;

/// How long a connection may owe answer bytes before it is held to [`MIN_ANSWER_BYTES_PER_SEC`].
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Answers of at most this many bytes always fit the [`AnswerBudget`]: statuses, denials, small
/// patches, health answers. Each connection owes at most one answer at a time, so these are at
/// most this much per connection.
pub const SMALL_ANSWER_BYTES: usize = 64 * 1024;

/// The default of the answer budget ([`AnswerBudget`]): about 35 of the largest answers (a
/// `/mutate` answer for a JobSet of hundreds of replicatedJobs is about 1 MB).
pub const DEFAULT_ANSWER_BYTES_IN_FLIGHT: usize = 32 * 1024 * 1024;

/// The socket send buffer of an accepted connection (the kernel doubles it): what a peer that
/// does not read can leave queued in the kernel, beyond the owed bytes. Ample for a cluster
/// network's round trips.
pub const SEND_BUFFER_BYTES: usize = 64 * 1024;

/// The answer bytes not yet written by every connection of the process, and their limit.
#[derive(Debug)]
pub struct AnswerBudget {
    limit: usize,
    owed: AtomicUsize,
}

impl AnswerBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(AnswerBudget {
            limit,
            owed: AtomicUsize::new(0),
        })
    }

    /// The answer bytes owed now.
    pub fn owed(&self) -> usize {
        self.owed.load(Ordering::Acquire)
    }

    /// Counts an answer of `bytes`, if it fits: it is small ([`SMALL_ANSWER_BYTES`]), or the
    /// bytes owed with it stay within the limit.
    fn take(&self, bytes: usize) -> bool {
        self.owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                let total = owed.checked_add(bytes)?;
                (bytes <= SMALL_ANSWER_BYTES || total <= self.limit).then_some(total)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                Some(owed.saturating_sub(bytes))
            });
    }
}

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
    /// An answer not taken by the peer at [`MIN_ANSWER_BYTES_PER_SEC`].
    SlowReader,
}

impl Cut {
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::HeaderTimeout => "header_timeout",
            Cut::IdleTimeout => "idle_timeout",
            Cut::Evicted => "evicted",
            Cut::SlowReader => "slow_reader",
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

/// What a connection is doing (see [`Activity`]).
#[derive(Clone, Copy, Debug)]
struct State {
    phase: Phase,
    /// When the phase began.
    since: Instant,
    /// Bytes read since.
    read: u64,
    /// Answer bytes not yet written.
    owed: u64,
    /// When the connection began owing (the last time `owed` left 0).
    owing_since: Instant,
    /// Bytes of answers written since.
    written: u64,
}

/// The phase of one connection and when it began, and the answer bytes it owes.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<State>,
    budget: Arc<AnswerBudget>,
    /// Wakes the connection's task when it begins owing (its drain deadline), and a pipelined
    /// request waiting for the answer before it ([`Activity::drained`]).
    owing: Notify,
    drained: Notify,
}

impl Drop for Activity {
    fn drop(&mut self) {
        let owed = self.lock().owed;
        self.budget
            .give_back(usize::try_from(owed).unwrap_or(usize::MAX));
    }
}

impl Activity {
    pub fn new(phase: Phase, budget: Arc<AnswerBudget>) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Activity {
            state: Mutex::new(State {
                phase,
                since: now,
                read: 0,
                owed: 0,
                owing_since: now,
                written: 0,
            }),
            budget,
            owing: Notify::new(),
            drained: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn get(&self) -> (Phase, Instant) {
        let state = self.lock();
        (state.phase, state.since)
    }

    pub fn set(&self, phase: Phase) {
        let mut state = self.lock();
        state.phase = phase;
        state.since = Instant::now();
        state.read = 0;
    }

    /// `n` bytes arrived: an idle connection starts a request head.
    fn bytes_read(&self, n: usize) {
        let mut state = self.lock();
        if state.phase == Phase::Idle {
            state.phase = Phase::Head;
            state.since = Instant::now();
            state.read = 0;
        }
        state.read = state.read.saturating_add(n as u64);
    }

    /// An answer of `bytes` is handed to the connection: counted as owed if it fits the budget
    /// ([`AnswerBudget::take`]); `false` if it does not (nothing counted).
    pub fn answer(&self, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        if !self.budget.take(bytes) {
            return false;
        }
        let mut state = self.lock();
        if state.owed == 0 {
            state.owing_since = Instant::now();
            state.written = 0;
            self.owing.notify_one();
        }
        state.owed = state.owed.saturating_add(bytes as u64);
        true
    }

    /// `n` bytes were written to the socket: they are no longer owed.
    fn bytes_written(&self, n: usize) {
        let mut state = self.lock();
        if state.owed == 0 {
            return;
        }
        let paid = state.owed.min(n as u64);
        state.owed -= paid;
        state.written = state.written.saturating_add(paid);
        let done = state.owed == 0;
        drop(state);
        self.budget
            .give_back(usize::try_from(paid).unwrap_or(usize::MAX));
        if done {
            self.drained.notify_waiters();
        }
    }

    /// The answer bytes owed.
    pub fn owed(&self) -> u64 {
        self.lock().owed
    }

    /// Resolves once nothing is owed: a pipelined request waits here for the answer before it.
    pub async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.owed() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Resolves when the connection begins owing (or did since the last call).
    pub async fn began_owing(&self) {
        self.owing.notified().await;
    }

    /// When to look at the connection next: its phase's or its answer's deadline, but no later
    /// than one header timeout from `now` (a head may begin meanwhile, unannounced; an answer
    /// that begins says so, [`Activity::began_owing`]).
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
    /// body has its own deadline). While answer bytes are owed, the earlier of that and
    /// [`drain_deadline`].
    pub fn deadline(&self, timeouts: &Timeouts) -> Option<(Instant, Cut)> {
        let state = *self.lock();
        let since = state.since;
        let phase = match state.phase {
            Phase::Handshake => Some((since + timeouts.handshake, Cut::HeaderTimeout)),
            Phase::Head => Some((since + timeouts.header_read, Cut::HeaderTimeout)),
            Phase::Idle => Some((since + timeouts.idle, Cut::IdleTimeout)),
            Phase::Body | Phase::Request => None,
        };
        let drain = (state.owed > 0).then(|| {
            (
                drain_deadline(state.owing_since, state.written),
                Cut::SlowReader,
            )
        });
        match (phase, drain) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Whether the connection may be closed to make room for a new one: idle, stuck in its
    /// handshake or a request head for [`EVICTABLE_AFTER`], or reading a body slower than
    /// [`MIN_BODY_BYTES_PER_SEC`] for as long.
    pub fn evictable(&self) -> bool {
        self.evictable_at(Instant::now())
    }

    fn evictable_at(&self, now: Instant) -> bool {
        let State {
            phase,
            since,
            read: bytes,
            ..
        } = *self.lock();
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

/// When a connection that began owing at `since` and has written `written` bytes of answers
/// since falls below [`MIN_ANSWER_BYTES_PER_SEC`] on average, and at the earliest
/// [`DRAIN_GRACE`] after `since`.
pub fn drain_deadline(since: Instant, written: u64) -> Instant {
    let paid_for = Duration::from_millis(written.saturating_mul(1000) / MIN_ANSWER_BYTES_PER_SEC);
    since + paid_for.max(DRAIN_GRACE)
}

/// A connection's I/O, reporting reads and writes to its [`Activity`].
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
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            self.activity.bytes_written(n);
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = result {
            self.activity.bytes_written(n);
        }
        result
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

/// A connection's service: the router, with the request phase recorded around each call, the
/// answer counted as owed (or replaced by a 429 when the answer budget has no room for it), a
/// pipelined request held until the answer before it is written, and `Connection: close` on
/// every answer while `draining`.
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
        let activity = self.activity.clone();
        let router = self.router.clone();
        let draining = self.draining.clone();
        Box::pin(async move {
            // A pipelined request: not before the answer ahead of it is written (the
            // connection is cut meanwhile if that drains too slowly).
            activity.drained().await;
            let Ok(response) = router.oneshot(request).await;
            let mut response = owe(&activity, response);
            if draining.load(Ordering::Acquire) {
                // hyper closes the connection after writing an answer that says so.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            drop(in_request);
            Ok(response)
        })
    }
}

/// Counts `response`'s body as owed by the connection, or, when the answer budget has no room
/// for it, answers 429 instead (the API server retries those), drops it, and closes the
/// connection after.
fn owe(activity: &Activity, response: Response) -> Response {
    use hyper::body::Body as _;
    let hint = response.body().size_hint();
    let bytes = hint.exact().unwrap_or(hint.lower());
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if activity.answer(bytes) {
        return response;
    }
    tracing::debug!(
        bytes,
        "answer budget full: answering 429 instead of an answer of this size"
    );
    let body = status_body(
        429,
        "TooManyRequests",
        "too many answers waiting to be read; retry shortly",
    );
    let mut busy = Response::new(axum::body::Body::from(body));
    *busy.status_mut() = axum::http::StatusCode::TOO_MANY_REQUESTS;
    let headers = busy.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    // And closed: requests pipelined behind it are not reviewed (the API server does not
    // pipeline; it retries on a new connection).
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    // Small: always fits.
    let _ = activity.answer(busy.body().size_hint().lower() as usize);
    busy
}

/// A Kubernetes `Status` object (`kind: Status`, `status: Failure`) as the body of an HTTP error
/// reply.
pub fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    let status = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    serde_json::to_vec(&status).unwrap_or_default()
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
        let activity = Activity::new(Phase::Handshake, AnswerBudget::new(1 << 20));
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
        let activity = Activity::new(Phase::Body, AnswerBudget::new(1 << 20));
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
        let activity = Activity::new(Phase::Idle, AnswerBudget::new(1 << 20));
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

    /// Issue 21: answer bytes are owed until written, within a budget; a connection that does
    /// not take them at the floor rate is cut; a pipelined request waits for them.
    #[tokio::test]
    async fn answers_are_owed_until_written_within_a_budget() {
        let budget = AnswerBudget::new(3 * SMALL_ANSWER_BYTES);
        let a = Activity::new(Phase::Request, budget.clone());
        let b = Activity::new(Phase::Request, budget.clone());
        assert_eq!(a.deadline(&timeouts()), None, "nothing owed, answering");
        assert!(a.answer(2 * SMALL_ANSWER_BYTES));
        assert_eq!(budget.owed(), 2 * SMALL_ANSWER_BYTES);
        // Another large answer does not fit; a small one always does.
        assert!(!b.answer(2 * SMALL_ANSWER_BYTES));
        assert_eq!(b.owed(), 0);
        assert!(b.answer(SMALL_ANSWER_BYTES));
        assert!(b.answer(SMALL_ANSWER_BYTES));
        assert_eq!(budget.owed(), 4 * SMALL_ANSWER_BYTES);
        // Owing: cut as a slow reader at the grace unless it writes.
        let (at, cut) = a.deadline(&timeouts()).expect("a drain deadline");
        assert_eq!(cut, Cut::SlowReader);
        let since = a.lock().owing_since;
        assert_eq!(at, since + DRAIN_GRACE);
        // Writing at twice the floor for three seconds' worth: the deadline moves on.
        a.bytes_written(3 * 2 * MIN_ANSWER_BYTES_PER_SEC as usize / 4);
        assert_eq!(
            drain_deadline(since, 3 * 2 * MIN_ANSWER_BYTES_PER_SEC / 4),
            since + Duration::from_millis(1500)
        );
        assert_eq!(
            a.deadline(&timeouts()).map(|d| d.0),
            Some(since + Duration::from_millis(1500))
        );
        // A pipelined request waits until all is written, and the budget gets it back.
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.drained().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        a.bytes_written(usize::MAX);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(a.owed(), 0);
        assert_eq!(a.deadline(&timeouts()), None);
        assert_eq!(budget.owed(), 2 * SMALL_ANSWER_BYTES);
        // A connection closed owing gives its bytes back.
        drop(b);
        assert_eq!(budget.owed(), 0);
        // The phase's own deadline when it is earlier than the drain's.
        assert!(a.answer(1));
        a.set(Phase::Idle);
        let idle = a.get().1;
        let short = Timeouts {
            idle: Duration::from_millis(10),
            ..timeouts()
        };
        assert_eq!(
            a.deadline(&short),
            Some((idle + Duration::from_millis(10), Cut::IdleTimeout))
        );
    }
}
