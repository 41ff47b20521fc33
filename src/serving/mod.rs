//! The plain and TLS HTTP/1.1 connection loop every listener of the process runs: the
//! webhook's HTTPS and health listeners (`crate::webhook::listener`) and the other components'
//! health listener (`crate::telemetry::serve_health`, through [`serve_plain`]).
//!
//! Against slow, idle, many and large: HTTP/1.1 only; a deadline for the TLS handshake and for
//! each request head (431 beyond the head size limit), an idle timeout between requests; at most
//! `max_connections` connections per listener, new ones waiting for a slot while idle and stuck
//! ones are closed to make room ([`conn`]); the answer bytes a connection has not taken counted
//! against a budget, a small socket send buffer, a connection that does not take its answer cut,
//! and a pipelined request held until the answer before it is written (issue 21).
//!
//! Kept rather than taken from a library (see docs/architecture.md, "Webhook"):
//! - the head deadline: hyper's `http1::Builder::header_read_timeout` also runs while a
//!   keep-alive connection is idle between requests, so it cannot give an idle timeout longer
//!   than the head's (10 s and 120 s here), and it cannot tell an eviction which phase a
//!   connection is in;
//! - the connection cap with eviction: tower's `ConcurrencyLimit` and hyper-util's
//!   `GracefulShutdown` count requests or drain, neither closes an idle or stuck connection to
//!   make room for a new one, and refusing a connection is what the API server counts as a
//!   failed call;
//! - the answer budget and the slow-reader cut: no layer sees how many answer bytes are still
//!   unwritten on a socket, which is what a reader that does not read holds.
//! - the stop: each connection's own `graceful_shutdown` at its next answer, because the same
//!   connection future must also be cut at once on a deadline or an eviction, which hyper-util's
//!   `GracefulShutdown` (it takes the connection over) does not allow.
//!
//! Taken from hyper: HTTP/1.1 parsing, keep-alive, the head size limit (`max_header_size`: 431).
//!
//! It sits below the webhook and the telemetry, which both use it, and knows neither: what it
//! counts it reports through [`Events`].

pub mod conn;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use conn::{Activity, AnswerBudget, Cut, Phase, SEND_BUFFER_BYTES, Timeouts, Tracked, Watched};

/// The default of `--max-connections`, and of the health listener's cap.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// What a listener reports of its connections (the webhook's metrics; nothing for another
/// component's health listener).
pub trait Events: Send + Sync {
    /// A connection was accepted; the returned guard is dropped when it closes.
    fn connection(&self, tls: bool) -> Box<dyn Send>;
    /// The server closed a connection of `listener` for `cut`.
    fn connection_cut(&self, listener: &'static str, cut: Cut);
    /// A connection of `listener` found every slot taken.
    fn connection_limit_reached(&self, listener: &'static str);
    /// A TLS handshake failed or timed out.
    fn handshake_failed(&self);
}

pub use conn::status_body;

/// Resolves once `stop` says so (or its sender is gone).
pub async fn wait_stop(mut stop: watch::Receiver<bool>) {
    // An error means the sender is gone: stop as well.
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The limits of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub timeouts: Timeouts,
    pub max_connections: usize,
    pub max_header_bytes: usize,
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

/// Serves `router` over plain HTTP/1.1 on `listener` with the connection handling above
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
pub struct Common {
    /// Where connections are reported (none for another component's health listener).
    pub metrics: Option<Arc<dyn Events>>,
    pub answers: Arc<AnswerBudget>,
    /// Set during the shutdown delay: every answer closes its connection.
    pub draining: Arc<AtomicBool>,
}

/// What every connection of a listener shares.
struct Listener {
    name: &'static str,
    tls: Option<TlsAcceptor>,
    router: Router,
    /// Where connections are reported (none for another component's health listener).
    metrics: Option<Arc<dyn Events>>,
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
pub async fn accept_loop(
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
