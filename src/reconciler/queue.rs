//! The reconciler's work queue: the keys of the JobSets to evaluate, each at most once, fed by
//! the watch loops and drained by the workers ([`super::controller`]), and why each was queued
//! ([`Reason`], [`Reasons`]). Like kube-runtime's scheduler, a small module with one job. See
//! docs/architecture.md ("Reconciler").
//!
//! kube-runtime's `Controller` carries one `ReconcileReason` per request and its scheduler keeps
//! the first one when requests for an object merge. Ours keeps them all: the reasons of the
//! triggers a key absorbed while waiting (or debouncing), or while being evaluated, are the
//! reasons of its next pass. A closed list, so the metric's `reason` label stays bounded.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

use super::key::Key;

/// Why a JobSet was queued. A closed list: the `reason` label of
/// `jobset_inplace_reconciler_reconcile_reasons_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// A watch event of the JobSet itself.
    JobSet,
    /// A watch event of one of its pods.
    Pod,
    /// A watch event of one of its Jobs (which pods count toward it).
    Job,
    /// A watch event of its published `JobSetEpoch` object.
    JobSetEpoch,
    /// A node was lost (every active JobSet is queued).
    Node,
    /// A watch listed again (its changes, then every active JobSet it concerns).
    Resync,
    /// This replica became the leader (every active JobSet is queued).
    Leadership,
    /// Again after an error (the workers' backoff, or a conflict's fresh read).
    Retry,
    /// The group-restart deadline: its timer (a failed step's retry included), or one of its
    /// steps done.
    Deadline,
}

impl Reason {
    /// Every reason, in the order of their bits and of a log line's list.
    pub(crate) const ALL: [Reason; 9] = [
        Reason::JobSet,
        Reason::Pod,
        Reason::Job,
        Reason::JobSetEpoch,
        Reason::Node,
        Reason::Resync,
        Reason::Leadership,
        Reason::Retry,
        Reason::Deadline,
    ];

    /// The metric's `reason` label and the log line's word.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Reason::JobSet => "jobset",
            Reason::Pod => "pod",
            Reason::Job => "job",
            Reason::JobSetEpoch => "jobsetepoch",
            Reason::Node => "node",
            Reason::Resync => "resync",
            Reason::Leadership => "leadership",
            Reason::Retry => "retry",
            Reason::Deadline => "deadline",
        }
    }

    const fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The reasons one pass of a key has: a set, so coalescing is a union (order-free, idempotent).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reasons(u16);

impl Reasons {
    /// `self` and `reason`.
    #[must_use]
    pub(crate) const fn with(self, reason: Reason) -> Reasons {
        Reasons(self.0 | reason.bit())
    }

    /// Both sets.
    #[must_use]
    pub(crate) const fn union(self, other: Reasons) -> Reasons {
        Reasons(self.0 | other.0)
    }

    pub(crate) const fn contains(self, reason: Reason) -> bool {
        self.0 & reason.bit() != 0
    }

    pub(crate) const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The reasons, in [`Reason::ALL`]'s order.
    pub(crate) fn iter(self) -> impl Iterator<Item = Reason> {
        Reason::ALL.into_iter().filter(move |r| self.contains(*r))
    }
}

impl From<Reason> for Reasons {
    fn from(reason: Reason) -> Reasons {
        Reasons::default().with(reason)
    }
}

/// `pod,deadline` (`none` when empty).
impl fmt::Display for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(r.label())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A set of keys to work on: each key is queued at most once, and a key that changes while a
/// worker holds it is queued again when the worker is done. Bounded without dropping anything:
/// a trigger for a key already waiting is absorbed (its reason joins the key's), so the queue
/// holds at most one entry per key (and one more pass per key being evaluated); a key whose
/// JobSet is gone leaves at its next evaluation, which finds nothing to do.
#[derive(Default)]
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    ready: VecDeque<Key>,
    /// Waiting in `ready`, or popped and debouncing: a new trigger is absorbed, its reason kept.
    queued: HashMap<Key, Reasons>,
    /// Being evaluated: a new trigger means one more pass, for the reasons gathered meanwhile.
    busy: HashMap<Key, Reasons>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Triggers `key` for `reason`.
    pub(crate) fn add(&self, key: Key, reason: Reason) {
        self.add_all(key, reason.into());
    }

    fn add_all(&self, key: Key, reasons: Reasons) {
        let mut s = self.lock();
        if let Some(again) = s.busy.get_mut(&key) {
            *again = again.union(reasons);
        } else if let Some(queued) = s.queued.get_mut(&key) {
            *queued = queued.union(reasons);
        } else {
            s.queued.insert(key.clone(), reasons);
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

    /// The debounce is over: triggers from now on need another pass. Returns why this pass runs
    /// (every trigger absorbed since the key was queued).
    pub(crate) fn start(&self, key: &Key) -> Reasons {
        let mut s = self.lock();
        let reasons = s.queued.remove(key).unwrap_or_default();
        s.busy.insert(key.clone(), Reasons::default());
        reasons
    }

    /// The evaluation is over: a key triggered meanwhile is queued again, for those triggers.
    pub(crate) fn done(&self, key: &Key) {
        let again = self.lock().busy.remove(key).unwrap_or_default();
        if !again.is_empty() {
            self.add_all(key.clone(), again);
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

    /// Every subset of [`Reason::ALL`].
    fn every_set() -> impl Iterator<Item = Reasons> {
        (0..1u32 << Reason::ALL.len()).map(|mask| {
            Reason::ALL
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .fold(Reasons::default(), |s, (_, r)| s.with(*r))
        })
    }

    #[test]
    fn every_reason_has_its_own_bit_and_label_in_order() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of order in ALL");
            for other in &Reason::ALL[i + 1..] {
                assert_ne!(r.bit(), other.bit());
                assert_ne!(r.label(), other.label());
            }
            let label = r.label();
            assert!(
                !label.is_empty() && label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{label}"
            );
        }
    }

    /// docs/reference.md lists the metric's `reason` labels: exactly [`Reason::ALL`]'s, in order.
    #[test]
    fn the_reference_lists_every_reason() {
        let doc = include_str!("../../docs/reference.md");
        let (_, after) = doc
            .split_once("`reconcile_reasons_total{reason}` (reason")
            .expect("reconcile_reasons_total in docs/reference.md");
        let (list, _) = after.split_once(')').expect("a closed list");
        let listed: Vec<&str> = list.split('`').skip(1).step_by(2).collect();
        let labels: Vec<&str> = Reason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(listed, labels);
    }

    /// Coalescing is a set union, exhaustively over every set and reason: order-free and
    /// idempotent, and it loses no reason nor invents one.
    #[test]
    fn coalescing_keeps_every_reason_once_whatever_the_order() {
        let sets: Vec<Reasons> = every_set().collect();
        assert_eq!(sets.len(), 512);
        for &a in &sets {
            for r in Reason::ALL {
                let b = a.with(r);
                assert!(b.contains(r));
                assert_eq!(b.with(r), b, "idempotent");
                for other in Reason::ALL {
                    assert_eq!(b.contains(other), a.contains(other) || other == r);
                    assert_eq!(a.with(r).with(other), a.with(other).with(r), "order-free");
                }
            }
            for &b in sets.iter().step_by(7) {
                assert_eq!(a.union(b), b.union(a));
                assert_eq!(
                    a.union(b).iter().collect::<Vec<_>>(),
                    Reason::ALL
                        .into_iter()
                        .filter(|r| a.contains(*r) || b.contains(*r))
                        .collect::<Vec<_>>()
                );
            }
            assert_eq!(a.is_empty(), a.iter().next().is_none());
        }
    }

    #[test]
    fn reasons_show_as_their_labels_in_order() {
        assert_eq!(Reasons::default().to_string(), "none");
        let r = Reasons::from(Reason::Deadline).with(Reason::Pod);
        assert_eq!(r.to_string(), "pod,deadline");
        assert_eq!(format!("{r:?}"), "pod,deadline");
    }

    #[tokio::test]
    async fn queue_coalesces_and_requeues_busy_keys() {
        let q = Queue::default();
        q.add(key("a"), Reason::Pod);
        q.add(key("a"), Reason::Pod);
        q.add(key("b"), Reason::JobSet);
        assert_eq!(q.len(), 2);
        let a = q.next().await;
        assert_eq!(a, key("a"));
        q.add(key("a"), Reason::Deadline); // absorbed: still debouncing; its reason joins
        assert_eq!(
            q.start(&a),
            Reasons::from(Reason::Pod).with(Reason::Deadline)
        );
        q.add(key("a"), Reason::Retry); // busy: one more pass
        q.add(key("a"), Reason::Job);
        assert_eq!(q.next().await, key("b"));
        assert_eq!(q.start(&key("b")), Reasons::from(Reason::JobSet));
        q.done(&key("b"));
        q.done(&a);
        assert_eq!(q.next().await, key("a"));
        assert_eq!(q.start(&a), Reasons::from(Reason::Job).with(Reason::Retry));
        q.done(&a);
        // Nothing came meanwhile: no further pass.
        assert_eq!(q.len(), 0);
        assert!(q.lock().ready.is_empty() && q.lock().busy.is_empty());
    }

    #[tokio::test]
    async fn a_trigger_while_queued_again_joins_the_pass_already_queued() {
        let q = Queue::default();
        q.add(key("a"), Reason::Leadership);
        let a = q.next().await;
        q.start(&a);
        q.add(key("a"), Reason::Pod); // busy
        q.done(&a); // queued again for `pod`
        q.add(key("a"), Reason::Node); // absorbed into that pass
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, a);
        assert_eq!(q.start(&a), Reasons::from(Reason::Pod).with(Reason::Node));
    }

    #[tokio::test]
    async fn queue_is_bounded_by_the_keys_however_many_triggers() {
        let q = Queue::default();
        for i in 0..10_000 {
            q.add(
                key(&format!("k{}", i % 3)),
                Reason::ALL[(i / 3) % Reason::ALL.len()],
            );
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.lock().ready.len(), 3);
        // A key being evaluated takes one more pass, however many triggers come meanwhile.
        let k = q.next().await;
        assert_eq!(q.start(&k).iter().count(), Reason::ALL.len());
        for _ in 0..1_000 {
            q.add(k.clone(), Reason::Pod);
        }
        assert_eq!(q.lock().busy.len(), 1);
        q.done(&k);
        assert_eq!(q.len(), 3);
        for _ in 0..3 {
            let k = q.next().await;
            q.start(&k);
            q.done(&k);
        }
        let s = q.lock();
        assert!(s.ready.is_empty() && s.queued.is_empty() && s.busy.is_empty());
    }
}
