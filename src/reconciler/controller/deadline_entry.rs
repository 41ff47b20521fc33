//! What the group-restart deadline keeps: per JobSet ([`DeadlineEntry`], a part of the
//! controller's one entry per JobSet), and for the whole process (the clock's origin and the
//! request permits of its steps, [`Steps`]).
//!
//! Our own: kube-runtime has no per-object timers or request caps; tokio's `Semaphore` gives the
//! permits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use crate::deadline::{self, Clock};
use crate::reconciler::index::JobSetState;

/// The deadline's pod and Job requests in flight at once for one namespace.
const NAMESPACE_REQUESTS: usize = 8;

/// The deadline's pod and Job requests in flight at once in the whole process.
const TOTAL_REQUESTS: usize = 32;

/// What the deadline keeps for one JobSet.
#[derive(Debug, Default)]
pub(super) struct DeadlineEntry {
    pub(super) clock: Option<Clock>,
    /// `GroupRestartTimedOut` was said for this clock.
    pub(super) timed_out_reported: bool,
    /// After a recreation to this `status.restarts`: the Jobs of earlier restarts are still to
    /// be deleted.
    pub(super) cleanup: Option<i32>,
    /// The pending wake-up: when (since the origin), and its task.
    pub(super) timer: Option<(Duration, AbortHandle)>,
    /// The step in flight, off the workers.
    pub(super) step: Option<AbortHandle>,
    /// Consecutive failed steps (their retries back off as the workers' do).
    pub(super) step_failures: u32,
    /// The malformed timeout annotation last reported.
    pub(super) bad_annotation: Option<String>,
}

impl DeadlineEntry {
    pub(super) fn is_empty(&self) -> bool {
        self.clock.is_none()
            && self.cleanup.is_none()
            && self.bad_annotation.is_none()
            && self
                .timer
                .as_ref()
                .is_none_or(|(_, handle)| handle.is_finished())
            && !self.step_in_flight()
    }

    pub(super) fn step_in_flight(&self) -> bool {
        self.step.as_ref().is_some_and(|h| !h.is_finished())
    }

    pub(super) fn set_clock(&mut self, clock: Option<Clock>) {
        if clock.map(|c| (c.started, c.restarts)) != self.clock.map(|c| (c.started, c.restarts)) {
            self.timed_out_reported = false;
        }
        if clock.is_none()
            && let Some((_, handle)) = self.timer.take()
        {
            // Nothing left to wake up for.
            handle.abort();
        }
        self.clock = clock;
    }

    /// The clock follows the JobSet as watched (on every replica): started when a group restart
    /// is first seen in progress, again after a recreation, gone once it completed or the JobSet
    /// is no longer active. Returns the clock.
    pub(super) fn observe(&mut self, state: &JobSetState, now: Duration) -> Option<Clock> {
        let clock = if state.active && state.unservable.is_none() {
            deadline::track(self.clock, state.status, state.restarts, now)
        } else {
            None
        };
        self.set_clock(clock);
        clock
    }

    /// Stops the pending wake-up and the step in flight (the JobSet is gone, or the controller
    /// is shutting down).
    pub(super) fn abort(&mut self) {
        for handle in self
            .timer
            .take()
            .map(|(_, h)| h)
            .into_iter()
            .chain(self.step.take())
        {
            handle.abort();
        }
    }
}

/// The deadline's clock and the permits of its steps' requests, for the whole process.
pub(super) struct Steps {
    /// Times are kept as durations since this moment (the pure decision's clock).
    origin: Instant,
    /// Permits of the steps' requests: the whole process's, and per namespace (an entry only
    /// while a request of the namespace holds or waits for one).
    total: Arc<Semaphore>,
    namespaces: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Steps {
    pub(super) fn new() -> Self {
        Steps {
            origin: Instant::now(),
            total: Arc::new(Semaphore::new(TOTAL_REQUESTS)),
            namespaces: Mutex::new(HashMap::new()),
        }
    }

    /// Now, on the deadline's clock.
    pub(super) fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Waits for a request permit of `namespace`, then for one of the process. Both are
    /// released when the pair is dropped.
    pub(super) async fn permit(
        &self,
        namespace: &str,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let own = {
            let mut namespaces = self
                .namespaces
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Forget the namespaces no request holds or waits for (each holds a clone).
            namespaces.retain(|_, s| Arc::strong_count(s) > 1);
            namespaces
                .entry(namespace.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(NAMESPACE_REQUESTS)))
                .clone()
        };
        let own = own.acquire_owned().await.ok()?;
        let total = self.total.clone().acquire_owned().await.ok()?;
        Some((own, total))
    }
}
