//! What the group-restart deadline keeps: per JobSet ([`DeadlineEntry`], a part of the
//! controller's one entry per JobSet), and for the whole process (the clock's origin and the
//! request permits of its steps, [`Steps`]).
//!
//! Our own: kube-runtime has no per-object timers or request caps; tokio's `Semaphore` gives the
//! permits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;

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

    /// Arms the wake-up for `due` (on the deadline's clock; `now` is the present) with the task
    /// `spawn` starts, unless a wake-up at or before `due` is still pending: an earlier one wakes
    /// the JobSet soon enough (it is evaluated again then, and arms the next). A later, a past
    /// or a finished one is replaced (aborted). Returns whether `spawn` ran.
    pub(super) fn wake_at(
        &mut self,
        now: Duration,
        due: Duration,
        spawn: impl FnOnce() -> AbortHandle,
    ) -> bool {
        if let Some((at, handle)) = &self.timer
            && *at <= due
            && *at > now
            && !handle.is_finished()
        {
            return false;
        }
        if let Some((_, handle)) = self.timer.take() {
            handle.abort();
        }
        self.timer = Some((due, spawn()));
        true
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
    /// Times are kept as durations since this moment (the pure decision's clock), on tokio's
    /// clock: the timers that wake the JobSets sleep on it, and a test can pause it.
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A wake-up task as the controller's: sleeps `after`, then says `name`.
    fn waker(
        tx: &mpsc::UnboundedSender<&'static str>,
        after: Duration,
        name: &'static str,
    ) -> impl FnOnce() -> AbortHandle {
        let tx = tx.clone();
        move || {
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = tx.send(name);
            })
            .abort_handle()
        }
    }

    /// On a paused clock: an earlier wake-up pending is kept, a later one replaced; each fires at
    /// its time exactly, a replaced one never.
    #[tokio::test(start_paused = true)]
    async fn the_earliest_wake_up_wins_and_a_replaced_one_never_fires() {
        let ms = Duration::from_millis;
        let steps = Steps::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut entry = DeadlineEntry::default();
        assert!(entry.wake_at(steps.now(), ms(2_000), waker(&tx, ms(2_000), "a")));
        tokio::time::advance(ms(1_000)).await;
        assert_eq!(steps.now(), ms(1_000), "the deadline's clock is tokio's");
        // Later than the pending one: kept.
        assert!(!entry.wake_at(steps.now(), ms(6_000), waker(&tx, ms(5_000), "later")));
        // Earlier: replaces it.
        assert!(entry.wake_at(steps.now(), ms(1_500), waker(&tx, ms(500), "b")));
        drop(tx);
        assert_eq!(rx.recv().await, Some("b"));
        assert_eq!(steps.now(), ms(1_500));
        // "a" was aborted, "later" never spawned: nothing else, and no waiting for them.
        assert_eq!(rx.recv().await, None);
        assert_eq!(steps.now(), ms(1_500));
        assert!(entry.is_empty(), "a fired timer holds nothing: {entry:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fired_or_past_wake_up_is_replaced_even_by_a_later_one() {
        let ms = Duration::from_millis;
        let steps = Steps::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut entry = DeadlineEntry::default();
        assert!(entry.wake_at(steps.now(), ms(100), waker(&tx, ms(100), "first")));
        assert_eq!(rx.recv().await, Some("first"));
        tokio::task::yield_now().await;
        // It fired (finished, and its time is not after now): a later one is armed.
        assert!(entry.wake_at(steps.now(), ms(400), waker(&tx, ms(300), "second")));
        // Due now or before is not pending either.
        let mut past = DeadlineEntry {
            timer: Some((
                ms(100),
                tokio::spawn(std::future::pending::<()>()).abort_handle(),
            )),
            ..Default::default()
        };
        assert!(past.wake_at(ms(100), ms(900), waker(&tx, ms(800), "third")));
        drop(tx);
        assert_eq!(rx.recv().await, Some("second"));
        assert_eq!(steps.now(), ms(400));
        assert_eq!(rx.recv().await, Some("third"));
        assert_eq!(steps.now(), ms(900));
        assert_eq!(rx.recv().await, None);
    }

    /// Clearing the clock stops the pending wake-up; `abort` stops the step in flight too.
    #[tokio::test(start_paused = true)]
    async fn no_clock_no_wake_up() {
        let ms = Duration::from_millis;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut entry = DeadlineEntry::default();
        entry.wake_at(Duration::ZERO, ms(100), waker(&tx, ms(100), "timer"));
        entry.set_clock(None);
        entry.step = Some(tokio::spawn(std::future::pending::<()>()).abort_handle());
        entry.abort();
        drop(tx);
        assert_eq!(rx.recv().await, None, "the timer never fires");
        tokio::task::yield_now().await;
        assert!(entry.is_empty() && !entry.step_in_flight());
    }
}
