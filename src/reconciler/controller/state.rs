//! What the watches, the workers and the tasks of the controller share ([`Shared`]), and all
//! that the runtime keeps for one JobSet in ONE [`Entry`]: the group restart in progress, the
//! malformed annotations and the unservable reason already reported, the epochs last observed,
//! the retry, and the group-restart deadline's part. Forgetting a deleted JobSet is one removal
//! of its entry ([`Shared::forget`]; the index, the published objects and the metrics' series
//! are caches of other things and forget it on their side).
//!
//! Nothing grows without bound ([`StateSizes`]): an entry is dropped as soon as it holds
//! nothing ([`Shared::with_entry`]), and with its JobSet (seen by the watch, or missing from a
//! relist after the watch was down).
//!
//! Lock order: the index before the entries, never the other way round.
//!
//! Our own state rather than kube-runtime's: its `Controller` keeps per-object state only in its
//! scheduler, and we need the deadline's clock on every replica, standbys included.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Event as KubeEvent;
use tokio::sync::{Notify, mpsc, watch};

use super::api::Calls;
use super::deadline_entry::{DeadlineEntry, Steps};
use super::settings::Settings;
use crate::deadline::Clock;
use crate::protocol::{Epoch, EpochStatus};
use crate::reconciler::index::{Index, JobSetState};
use crate::reconciler::key::Key;
use crate::reconciler::metrics::Metrics;
use crate::reconciler::nodes::NodeHealth;
use crate::reconciler::publish::Published;
use crate::reconciler::queue::Queue;

/// State shared by the watch loops, the workers and the tasks.
pub(super) struct Shared {
    pub(super) settings: Settings,
    /// Every API call goes through here.
    pub(super) api: Calls,
    pub(super) index: Mutex<Index>,
    pub(super) queue: Queue,
    pub(super) metrics: Metrics,
    pub(super) leader: watch::Receiver<bool>,
    pub(super) jobsets_synced: AtomicBool,
    pub(super) pods_synced: AtomicBool,
    pub(super) jobs_synced: AtomicBool,
    /// The runtime's state of each JobSet that has any.
    entries: Mutex<HashMap<Key, Entry>>,
    /// The group-restart deadline's clock and request permits.
    pub(super) steps: Steps,
    pub(super) events: mpsc::Sender<(ObjectReference, KubeEvent)>,
    /// Namespaces labelled for provisioning ahead of any JobSet.
    pub(super) enabled_namespaces: Mutex<BTreeSet<String>>,
    /// Wakes the provisioner when JobSets or labelled namespaces change.
    pub(super) provision_wake: Notify,
    /// The JobSetEpoch objects as published.
    pub(super) published: Published,
    /// Each silent node's silence (`lost.rs`).
    pub(super) node_health: Mutex<NodeHealth>,
}

/// What the runtime keeps for one JobSet.
#[derive(Debug, Default)]
pub(super) struct Entry {
    /// The current group restart: its deprecated epoch, and when it was written.
    pub(super) restart_began: Option<(Epoch, Instant)>,
    /// The malformed annotations already reported and still there: (pod, value).
    pub(super) reported: HashSet<(String, String)>,
    /// The pods labelled with its name that are not its own, already reported and still there:
    /// (pod, reason).
    pub(super) strangers: HashSet<(String, String)>,
    /// The reason the protocol cannot serve it, as last reported (once per reason).
    pub(super) unservable: Option<String>,
    /// Observe mode: the epoch fields as last seen.
    pub(super) observed: Option<EpochStatus>,
    /// Consecutive failures of its evaluation, and whether a retry is pending.
    pub(super) retry: Retry,
    /// The group-restart deadline's clock, timer, step in flight and reports.
    pub(super) deadline: DeadlineEntry,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.restart_began.is_none()
            && self.reported.is_empty()
            && self.strangers.is_empty()
            && self.unservable.is_none()
            && self.observed.is_none()
            && self.retry == Retry::default()
            && self.deadline.is_empty()
    }
}

/// The retry state of a JobSet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Retry {
    pub(super) failures: u32,
    /// A requeue is scheduled: further failures do not schedule another.
    pub(super) pending: bool,
}

/// How much state the controller holds, for tests and debugging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateSizes {
    /// JobSets in the index.
    pub jobsets: usize,
    /// Pods in the index.
    pub pods: usize,
    /// Keys waiting in the work queue.
    pub queued: usize,
    /// Keys with failures (and possibly a pending retry).
    pub retries: usize,
    /// Group restarts in progress (their start time, for the duration metric).
    pub restarts: usize,
    /// JobSets with malformed annotations reported.
    pub reported: usize,
    /// JobSetEpoch objects known.
    pub published: usize,
    /// JobSets the group-restart deadline keeps something for (a clock, a timer, Jobs still to
    /// delete after a recreation, a malformed annotation reported).
    pub deadlines: usize,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn new(
        client: kube::Client,
        settings: Settings,
        metrics: Metrics,
        leader: watch::Receiver<bool>,
        write_until: watch::Receiver<Option<Instant>>,
        events: mpsc::Sender<(ObjectReference, KubeEvent)>,
    ) -> Shared {
        Shared {
            api: Calls::new(
                client,
                settings.request_timeout,
                write_until,
                metrics.clone(),
            ),
            index: Mutex::new(Index::new(settings.dialect)),
            queue: Queue::default(),
            metrics,
            leader,
            jobsets_synced: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
            jobs_synced: AtomicBool::new(false),
            entries: Mutex::new(HashMap::new()),
            steps: Steps::new(),
            events,
            enabled_namespaces: Mutex::new(BTreeSet::new()),
            provision_wake: Notify::new(),
            published: Published::default(),
            node_health: Mutex::new(NodeHealth::default()),
            settings,
        }
    }

    /// The pods labelled with a JobSet's name that are not its own: name, UID and why.
    pub(super) fn index_strangers(
        &self,
        key: &Key,
    ) -> Vec<(String, String, crate::reconciler::membership::Stranger)> {
        lock(&self.index).strangers(key)
    }

    /// The three caches (JobSets, pods, Jobs) have synced once.
    pub(super) fn synced(&self) -> bool {
        self.jobsets_synced
            .load(std::sync::atomic::Ordering::Acquire)
            && self.pods_synced.load(std::sync::atomic::Ordering::Acquire)
            && self.jobs_synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Runs `f` on the entry of `key` (an empty one if it has none); the entry is kept only if
    /// it then holds something.
    pub(super) fn with_entry<T>(&self, key: &Key, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut entries = lock(&self.entries);
        if let Some(entry) = entries.get_mut(key) {
            let out = f(entry);
            if entry.is_empty() {
                entries.remove(key);
            }
            return out;
        }
        let mut entry = Entry::default();
        let out = f(&mut entry);
        if !entry.is_empty() {
            entries.insert(key.clone(), entry);
        }
        out
    }

    /// [`Shared::with_entry`] on the deadline's part; a part left holding nothing starts afresh
    /// (its reports and failure count too), as if the JobSet had no entry.
    pub(super) fn with_deadline<T>(&self, key: &Key, f: impl FnOnce(&mut DeadlineEntry) -> T) -> T {
        self.with_entry(key, |e| {
            let out = f(&mut e.deadline);
            if e.deadline.is_empty() {
                e.deadline = DeadlineEntry::default();
            }
            out
        })
    }

    /// The deadline's clock follows the JobSet as watched ([`DeadlineEntry::observe`]).
    pub(super) fn observe_deadline(&self, key: &Key, state: &JobSetState) -> Option<Clock> {
        let now = self.steps.now();
        self.with_deadline(key, |d| d.observe(state, now))
    }

    /// Forgets a deleted JobSet (the index has already forgotten it): its entry goes (its
    /// deadline's timer and step in flight stopped: its pods and Jobs go with it), and so do its
    /// published object and its metrics' series.
    pub(super) fn forget(&self, key: &Key) {
        let entry = lock(&self.entries).remove(key);
        if let Some(mut entry) = entry {
            entry.deadline.abort();
        }
        self.published.forget(key);
        self.metrics.forget(key);
    }

    /// Stops every pending wake-up and every step in flight (the controller is shutting down).
    pub(super) fn abort_tasks(&self) {
        for entry in lock(&self.entries).values_mut() {
            entry.deadline.abort();
        }
    }

    /// How much state is held now.
    pub(super) fn sizes(&self) -> StateSizes {
        let (jobsets, pods) = {
            let index = lock(&self.index);
            (index.jobset_count(), index.pod_count())
        };
        let entries = lock(&self.entries);
        let count = |f: fn(&Entry) -> bool| entries.values().filter(|e| f(e)).count();
        StateSizes {
            jobsets,
            pods,
            queued: self.queue.len(),
            retries: count(|e| e.retry != Retry::default()),
            restarts: count(|e| e.restart_began.is_some()),
            reported: count(|e| !e.reported.is_empty()),
            published: self.published.len(),
            deadlines: count(|e| !e.deadline.is_empty()),
        }
    }
}
