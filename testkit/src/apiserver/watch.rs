//! The body of a watch response: newline-delimited JSON events, bookmarks and the end of the
//! stream (timeout, or an abort when the watcher is closed by the server).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::Shared;
use super::error::ApiError;
use super::resources::ResId;
use super::store::{Delivery, Entry};

/// `{"type":"ADDED","object":...}\n`, reusing the object's stored bytes.
pub(crate) fn event_line(ty: &str, entry: &Entry) -> Bytes {
    let mut out = Vec::with_capacity(entry.json.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(&entry.json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// `{"type":"ERROR","object":<Status>}\n`.
pub(crate) fn error_line(e: &ApiError) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": "ERROR", "object": e.status()})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// An open watch.
pub(crate) struct Session {
    pub shared: Arc<Shared>,
    pub res: ResId,
    pub id: u64,
    pub initial: VecDeque<Delivery>,
    pub rx: mpsc::Receiver<Delivery>,
    /// `sendInitialEvents`: the resourceVersion of the bookmark that ends the initial events.
    pub initial_end: Option<u64>,
    pub deadline: Instant,
    /// Chaos mode: when the server cuts this watch (aborts its connection).
    pub cut_at: Option<Instant>,
    pub bookmarks: Option<Interval>,
    pub api_version: String,
    pub kind: String,
    pub finished: bool,
    /// The chunk just produced is a bookmark (for [`Shared::delivered`]).
    pub bookmark_sent: std::cell::Cell<bool>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shared.store().unwatch(self.res, self.id);
    }
}

/// A bookmark interval whose first tick is one period away.
pub(crate) fn bookmark_interval(period: Duration) -> Interval {
    let period = period.max(Duration::from_millis(10));
    let mut i = tokio::time::interval_at(Instant::now() + period, period);
    i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    i
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn tick(i: &mut Option<Interval>) {
    match i {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

impl Session {
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_end && let Some(m) = metadata.as_object_mut() {
            m.insert(
                "annotations".into(),
                json!({"k8s.io/initial-events-end": "true"}),
            );
        }
        let obj: Value =
            json!({"kind": self.kind, "apiVersion": self.api_version, "metadata": metadata});
        self.bookmark_sent.set(true);
        let mut line =
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn bookmark_now(&self) -> Option<Bytes> {
        let rv = self.shared.store().bookmark_rv(&self.rx)?;
        Some(self.bookmark(rv, false))
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.finished {
            return None;
        }
        if let Some(d) = self.initial.pop_front() {
            return Some(Ok(event_line(d.ty.as_str(), &d.entry)));
        }
        if let Some(rv) = self.initial_end.take() {
            return Some(Ok(self.bookmark(rv, true)));
        }
        loop {
            tokio::select! {
                biased;
                d = self.rx.recv() => {
                    return match d {
                        Some(d) => Some(Ok(event_line(d.ty.as_str(), &d.entry))),
                        None => {
                            // Closed by the server (cut, slow watcher, shutdown): abort the
                            // connection mid-stream, as a dropped connection would.
                            self.finished = true;
                            Some(Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionAborted,
                                "watch closed by the server",
                            )))
                        }
                    };
                }
                _ = sleep_until(self.cut_at) => {
                    self.finished = true;
                    if let Some(chaos) = self.shared.chaos().as_mut() {
                        chaos.watch_cut();
                    }
                    return Some(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "watch cut by the server (injected)",
                    )));
                }
                _ = tokio::time::sleep_until(self.deadline) => {
                    self.finished = true;
                    if self.bookmarks.is_some() {
                        return self.bookmark_now().map(Ok);
                    }
                    return None;
                }
                _ = tick(&mut self.bookmarks) => {
                    if let Some(b) = self.bookmark_now() {
                        return Some(Ok(b));
                    }
                }
            }
        }
    }

    pub(crate) fn into_body(self) -> Body {
        Body::from_stream(futures::stream::unfold(self, |mut s| async move {
            let chunk = s.next_chunk().await?;
            if let Ok(bytes) = &chunk {
                let bookmark = s.bookmark_sent.replace(false);
                s.shared.delivered(s.res, bytes.len(), bookmark);
            }
            Some((chunk, s))
        }))
    }
}
