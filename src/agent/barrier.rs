//! The barrier endpoint: the agent container's startup probe. It answers 503 until the barrier
//! lifts and 200 after, with a one-line body saying what it waits for; `/healthz` answers 200.
//!
//! It is served from the agent's first moment (before any API call), straight on hyper's HTTP/1
//! connection handling: one task per connection, no router. Connections are bounded
//! ([`Limits`]): at most 64 at once (past that the listener stops accepting until one ends, and
//! the kernel's backlog holds the rest), each closed after 10 s (a probe takes milliseconds),
//! so a flood of connections or clients that never finish cannot grow the agent.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::protocol::Epoch;

/// What the barrier shows: the agent's progress and the JobSet's last known epochs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BarrierState {
    /// The epoch this agent registers (or registered).
    pub epoch: Option<Epoch>,
    /// The annotation write succeeded.
    pub registered: bool,
    /// The JobSet's synced epoch, as last seen.
    pub synced: Option<Epoch>,
    /// The JobSet's deprecated epoch, as last seen.
    pub deprecated: Option<Epoch>,
    /// The barrier is lifted (never re-armed in one process).
    pub lifted: bool,
    /// Lifted because the JobSet does not use in-place restart (or disables it).
    pub bypassed: bool,
}

impl fmt::Display for BarrierState {
    /// The one-line body of the barrier endpoint.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |e: Option<Epoch>| e.map_or_else(|| "none".to_owned(), |e| e.to_string());
        match (self.lifted, self.epoch) {
            (true, _) if self.bypassed => {
                f.write_str("barrier lifted: the JobSet does not use in-place restart")
            }
            (true, Some(e)) => write!(f, "barrier lifted: epoch {e} is synced"),
            (true, None) => f.write_str("barrier lifted"),
            (false, None) => f.write_str("barrier up: reading the pod and its JobSet"),
            (false, Some(e)) if !self.registered => {
                write!(f, "barrier up: registering epoch {e} on the pod")
            }
            (false, Some(e)) => write!(
                f,
                "barrier up: epoch {e} waits to be synced (synced epoch: {}, deprecated: {})",
                show(self.synced),
                show(self.deprecated)
            ),
        }
    }
}

/// The reply to one request.
pub fn respond(path: &str, barrier_path: &str, state: &BarrierState) -> (StatusCode, String) {
    if path == barrier_path {
        let status = if state.lifted {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, format!("{state}\n"))
    } else if path == "/healthz" {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (StatusCode::NOT_FOUND, "not found\n".to_owned())
    }
}

/// Bounds on the barrier's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; the next is accepted when one ends.
    pub max_connections: usize,
    /// A connection is closed this long after it was accepted, finished or not.
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            connection_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves the barrier on `listener` until the future is dropped, with the default [`Limits`].
pub async fn serve(listener: TcpListener, path: String, state: watch::Receiver<BarrierState>) {
    serve_with(listener, path, state, Limits::default()).await;
}

/// Serves the barrier on `listener` until the future is dropped.
pub async fn serve_with(
    listener: TcpListener,
    path: String,
    state: watch::Receiver<BarrierState>,
    limits: Limits,
) {
    let path: Arc<str> = path.into();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        // A free slot first: past the limit, connections wait in the kernel's backlog.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "barrier: cannot accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let path = path.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (status, body) = respond(req.uri().path(), &path, &state.borrow());
                let mut resp = Response::new(Full::new(Bytes::from(body)));
                *resp.status_mut() = status;
                resp.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.connection_timeout, conn).await;
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_say_what_the_barrier_waits_for() {
        let mut s = BarrierState::default();
        let (code, body) = respond("/b", "/b", &s);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "barrier up: reading the pod and its JobSet\n");
        s.epoch = Some(3);
        assert_eq!(s.to_string(), "barrier up: registering epoch 3 on the pod");
        s.registered = true;
        s.synced = Some(2);
        assert_eq!(
            s.to_string(),
            "barrier up: epoch 3 waits to be synced (synced epoch: 2, deprecated: none)"
        );
        s.lifted = true;
        let (code, body) = respond("/b", "/b", &s);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(body, "barrier lifted: epoch 3 is synced\n");
        s.bypassed = true;
        assert!(s.to_string().contains("does not use in-place restart"));
    }

    #[tokio::test]
    async fn connections_are_bounded_in_number_and_time() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (_tx, rx) = watch::channel(BarrierState::default());
        let limits = Limits {
            max_connections: 2,
            connection_timeout: Duration::from_millis(300),
        };
        let server = tokio::spawn(serve_with(listener, "/b".into(), rx, limits));
        // Two clients that never send a request hold both slots.
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        let mut probe = tokio::net::TcpStream::connect(addr).await.expect("connect");
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut buf = Vec::new();
        let early =
            tokio::time::timeout(Duration::from_millis(100), probe.read_to_end(&mut buf)).await;
        assert!(early.is_err(), "served past the connection limit");
        // The idle connections are closed after their time, and the probe is served.
        tokio::time::timeout(Duration::from_secs(5), probe.read_to_end(&mut buf))
            .await
            .expect("served once a slot is free")
            .expect("read");
        assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
        for mut c in idle {
            let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut [0u8; 16]))
                .await
                .expect("closed")
                .unwrap_or(0);
            assert_eq!(n, 0, "an idle connection was closed");
        }
        server.abort();
    }

    #[test]
    fn health_and_unknown_paths() {
        let s = BarrierState::default();
        assert_eq!(respond("/healthz", "/b", &s).0, StatusCode::OK);
        assert_eq!(respond("/other", "/b", &s).0, StatusCode::NOT_FOUND);
    }
}
