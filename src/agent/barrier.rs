//! The barrier endpoint: the agent container's startup probe. It answers 503 until the barrier
//! lifts and 200 after, with a one-line body saying what it waits for; `/healthz` answers 200.
//!
//! It is served from the agent's first moment (before any API call), straight on hyper's HTTP/1
//! connection handling: one task per connection, no router.

use std::convert::Infallible;
use std::fmt;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

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

/// Serves the barrier on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, path: String, state: watch::Receiver<BarrierState>) {
    let path: std::sync::Arc<str> = path.into();
    loop {
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
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
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

    #[test]
    fn health_and_unknown_paths() {
        let s = BarrierState::default();
        assert_eq!(respond("/healthz", "/b", &s).0, StatusCode::OK);
        assert_eq!(respond("/other", "/b", &s).0, StatusCode::NOT_FOUND);
    }
}
