//! The reconciler's work queue: the keys of the JobSets to evaluate, each at most once, fed by
//! the watch loops and drained by the workers ([`super::controller`]). Like kube-runtime's
//! scheduler, a small module with one job. See docs/architecture.md ("Reconciler").

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

use super::key::Key;

/// A set of keys to work on: each key is queued at most once, and a key that changes while a
/// worker holds it is queued again when the worker is done. Bounded without dropping anything:
/// a trigger for a key already waiting is absorbed, so the queue holds at most one entry per
/// key (and one more pass per key being evaluated); a key whose JobSet is gone leaves at its
/// next evaluation, which finds nothing to do.
#[derive(Default)]
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    ready: VecDeque<Key>,
    /// Waiting in `ready`, or popped and debouncing: a new trigger is absorbed.
    queued: HashSet<Key>,
    /// Being evaluated: a new trigger means one more pass.
    busy: HashSet<Key>,
    again: HashSet<Key>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Triggers `key`.
    pub(crate) fn add(&self, key: Key) {
        let mut s = self.lock();
        if s.busy.contains(&key) {
            s.again.insert(key);
        } else if s.queued.insert(key.clone()) {
            s.ready.push_back(key);
            self.notify.notify_one();
        }
    }

    /// The next key to work on, waiting for one.
    pub(crate) async fn next(&self) -> Key {
        loop {
            let notified = self.notify.notified();
            if let Some(key) = self.lock().ready.pop_front() {
                return key;
            }
            notified.await;
        }
    }

    /// The debounce is over: triggers from now on need another pass.
    pub(crate) fn start(&self, key: &Key) {
        let mut s = self.lock();
        s.queued.remove(key);
        s.busy.insert(key.clone());
    }

    /// The evaluation is over: a key triggered meanwhile is queued again.
    pub(crate) fn done(&self, key: &Key) {
        let again = {
            let mut s = self.lock();
            s.busy.remove(key);
            s.again.remove(key)
        };
        if again {
            self.add(key.clone());
        }
    }

    /// Keys waiting (or debouncing).
    pub(crate) fn len(&self) -> usize {
        self.lock().queued.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> Key {
        Key::new("ns", n)
    }

    #[tokio::test]
    async fn queue_coalesces_and_requeues_busy_keys() {
        let q = Queue::default();
        q.add(key("a"));
        q.add(key("a"));
        q.add(key("b"));
        assert_eq!(q.len(), 2);
        let a = q.next().await;
        assert_eq!(a, key("a"));
        q.add(key("a")); // absorbed: still debouncing
        q.start(&a);
        q.add(key("a")); // busy: one more pass
        assert_eq!(q.next().await, key("b"));
        q.done(&a);
        assert_eq!(q.next().await, key("a"));
    }

    #[tokio::test]
    async fn queue_is_bounded_by_the_keys_however_many_triggers() {
        let q = Queue::default();
        for i in 0..10_000 {
            q.add(key(&format!("k{}", i % 3)));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.lock().ready.len(), 3);
        // A key being evaluated takes one more pass, however many triggers come meanwhile.
        let k = q.next().await;
        q.start(&k);
        for _ in 0..1_000 {
            q.add(k.clone());
        }
        assert_eq!(q.lock().again.len(), 1);
        q.done(&k);
        assert_eq!(q.len(), 3);
        for _ in 0..3 {
            let k = q.next().await;
            q.start(&k);
            q.done(&k);
        }
        let s = q.lock();
        assert!(
            s.ready.is_empty() && s.queued.is_empty() && s.busy.is_empty() && s.again.is_empty()
        );
    }
}
