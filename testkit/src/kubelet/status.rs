//! The kubelet's status manager for one pod: status writes go beside the pod's lifecycle, not in
//! its way, as a real kubelet's do (its status manager syncs on its own goroutine). A status not
//! written yet is replaced by a newer one (the API server sees the latest state, not every
//! step), and a terminal status is awaited: the Job controller only acts on a pod once its
//! failure is visible, so the pod's end is reported after that write.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::Ctx;

/// One pod's status writer; dropping it lets the task write what is pending and end.
pub(crate) struct StatusWriter {
    /// Off when the simulation writes no pod statuses ([`super::SimConfig::pod_status`]).
    enabled: bool,
    pending: watch::Sender<(u64, Option<Value>)>,
    written: watch::Receiver<u64>,
    seq: u64,
}

impl StatusWriter {
    /// Spawns the writer task of pod `name`.
    pub(crate) fn start(ctx: &Arc<Ctx>, name: &str) -> StatusWriter {
        let (pending, mut next) = watch::channel((0u64, None::<Value>));
        let (done, written) = watch::channel(0u64);
        let enabled = ctx.config.pod_status;
        let (task_ctx, name) = (ctx.clone(), name.to_owned());
        if enabled {
            ctx.spawn(async move {
                // Ends when the writer is dropped and its last status is written.
                while next.changed().await.is_ok() {
                    let (seq, status) = next.borrow_and_update().clone();
                    if let Some(status) = status {
                        task_ctx.write_status(&name, status).await;
                    }
                    done.send_replace(seq);
                }
            });
        }
        StatusWriter {
            enabled,
            pending,
            written,
            seq: 0,
        }
    }

    /// Writes `status` soon, replacing a status not written yet.
    pub(crate) fn set(&mut self, status: Value) -> u64 {
        if !self.enabled {
            return self.seq;
        }
        self.seq += 1;
        self.pending.send_replace((self.seq, Some(status)));
        self.seq
    }

    /// Writes nothing more, not even a status set but not written yet (a kubelet that died, or
    /// a pod deleted).
    pub(crate) fn abandon(&mut self) {
        if self.enabled {
            self.seq += 1;
            self.pending.send_replace((self.seq, None));
            self.enabled = false;
        }
    }

    /// Writes `status` and waits until it is written (or failed to be, after retries).
    pub(crate) async fn write(&mut self, status: Value) {
        if !self.enabled {
            return;
        }
        let seq = self.set(status);
        // An error means the task is gone (the runtime is shutting down): nothing to wait for.
        let _ = self.written.wait_for(|w| *w >= seq).await;
    }
}
