//! The reconciler's runtime: two watches feed the [`Index`], a work queue ([`super::queue`])
//! coalesces the JobSets whose input changed, workers run the pure decision ([`crate::protocol::reconcile_decide`]) and
//! write what changed as JSON merge patches on the `status` subresource.
//!
//! A watch that fails is paused with [`WatchBackoff`] (at most 5 s), not kube's default, whose
//! pauses grow to 30 s over isolated failures.
//!
//! Every status write carries the `resourceVersion` it was decided on (an optimistic lock): a
//! write decided on a stale view is refused with 409, the JobSet is re-read and decided again,
//! so a field can never be moved backwards by this process or by a leader that lost its lease.
//!
//! Nothing grows without bound ([`Controller::state_sizes`]): the work queue holds each key at
//! most once and never drops one, so its size is bounded by the number of keys that exist; the
//! index, the retry state (one pending retry per key), the group restarts in progress and the
//! malformed annotations already reported are per JobSet and forgotten when it is deleted
//! (seen by the watch, or missing from a relist after the watch was down); the event queue is a
//! bounded channel ([`EVENT_QUEUE`]) that drops new events when full (kube's event recorder
//! keeps what it published for 6 minutes, to aggregate repeats into series).
//!
//! After each evaluation the group-restart deadline ([`crate::deadline`]) runs on the same JobSet
//! (`deadline.rs`, a child of this module): it keeps each JobSet's clock, wakes the JobSet up when
//! a window ends, and deletes pods, recreates Jobs or fails the JobSet as the decision says.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;

use super::index::{Index, JobSetState, Key, reconcile_input};
use super::metrics::Metrics;
use super::provision::{self, ProvisionSettings};
use super::publish::{self, Published};
use super::queue::Queue;
use crate::jobset::{self, JobSet};
use crate::protocol::{
    Dialect, Epoch, EpochStatus, JOBSET_NAME_LABEL, ReconcileDecision, StatusChange,
    reconcile_decide,
};
use crate::retry::WatchBackoff;
use crate::wire::WatchedPod;
use crate::wire::epochs::{self, JobSetEpoch};

mod deadline;
mod provisioning;

/// Condition reason of a JobSet failed by the reconciler.
pub const REACHED_MAX_RESTARTS: &str = "ReachedMaxRestarts";
/// Event reporter name.
pub const CONTROLLER_NAME: &str = "jobset-inplace-reconciler";
/// Events waiting to be published; past this, new events are dropped (and logged).
const EVENT_QUEUE: usize = 1024;
/// Status writes retried at once after a 409 before the key goes back to the queue.
const CONFLICT_RETRIES: usize = 3;

/// What the controller needs to know.
#[derive(Clone, Debug)]
pub struct Settings {
    pub dialect: Dialect,
    /// Watch one namespace; all when `None`.
    pub namespace: Option<String>,
    pub workers: usize,
    /// How long a JobSet waits in the queue before it is evaluated, so that a burst of pod
    /// updates coalesces into one evaluation.
    pub debounce: Duration,
    /// This replica's name, as the reporting instance of its events.
    pub identity: String,
    /// Provision the agent's service account and RoleBinding per namespace; off when `None`.
    pub provision: Option<ProvisionSettings>,
    /// Longest wait for one API request (a status write, a read, an apply, an event): a
    /// connection that goes silent costs a worker this long, then the JobSet is retried.
    pub request_timeout: Duration,
    /// How long the API server keeps each watch open; a watch that delivers nothing (no event,
    /// no bookmark) for this long plus a few seconds is abandoned and resumed.
    pub watch_timeout: Duration,
    /// Write the two epoch fields and the `Failed` condition (`true`), or leave them to JobSet's
    /// own controller (`false`, for JobSet >= v0.11 in the `attempt` dialect, which writes the
    /// same fields: two writers must never disagree) and only observe them: events, metrics,
    /// provisioning and the group-restart deadline go on (the deadline still writes
    /// `status.restarts` for a recreation, and `Failed` when one would pass `maxRestarts`).
    pub write_epoch_status: bool,
    /// Publish each InPlaceRestart JobSet's epochs in its `JobSetEpoch` object, which its agents
    /// watch ([`crate::wire::epochs`]); off where the kind is not served (agents then watch the
    /// JobSet).
    pub publish_epochs: bool,
    /// The group-restart deadline's timeout ([`crate::deadline`]), unless a JobSet's annotation
    /// says otherwise; `None`: off. It applies in both modes of `write_epoch_status`.
    pub group_restart_timeout: Option<Duration>,
}

/// [`Settings::request_timeout`] unless configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// [`Settings::watch_timeout`] unless configured: the API server sends a bookmark about once a
/// minute, so a healthy watch is never idle this long.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// A watcher's configuration with the server-side timeout of `settings` (at least 1 s): kube's
/// watcher abandons a watch idle for that long plus a margin, and resumes it.
fn watch_config(settings: &Settings) -> watcher::Config {
    let secs = u32::try_from(settings.watch_timeout.as_secs()).unwrap_or(u32::MAX);
    watcher::Config::default()
        .timeout(secs.max(1))
        .any_semantic()
}

/// Errors of one reconcile; the JobSet is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cannot write the status of JobSet {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("cannot publish the epochs of JobSet {namespace}/{name}: {source}")]
    Publish {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("JobSet {namespace}/{name} kept changing under {CONFLICT_RETRIES} status writes")]
    Conflicts { namespace: String, name: String },
    #[error("the API server did not answer a {call} of JobSet {namespace}/{name} within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        call: &'static str,
        after: Duration,
    },
    #[error("cannot {action} of JobSet {namespace}/{name} (group-restart deadline): {source}")]
    Deadline {
        namespace: String,
        name: String,
        action: String,
        source: kube::Error,
    },
}

impl ReconcileError {
    /// The delay the API server asked for, if it throttled the write.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ReconcileError::Write { source, .. }
            | ReconcileError::Publish { source, .. }
            | ReconcileError::Deadline { source, .. } => crate::retry::retry_after(source),
            ReconcileError::Conflicts { .. } | ReconcileError::Timeout { .. } => None,
        }
    }
}

/// State shared by the watch loops and the workers.
struct Shared {
    settings: Settings,
    client: kube::Client,
    index: Mutex<Index>,
    queue: Queue,
    metrics: Metrics,
    leader: watch::Receiver<bool>,
    /// Until when this replica may have a write in flight (the leader's fence, [`super::fence`]);
    /// `None`: no leader election.
    write_until: watch::Receiver<Option<Instant>>,
    jobsets_synced: AtomicBool,
    pods_synced: AtomicBool,
    /// When each JobSet's current group restart began: (deprecated epoch, when written).
    restarts: Mutex<HashMap<Key, (Epoch, Instant)>>,
    /// Per JobSet, the malformed annotations already reported and still there: (pod, value).
    reported: Mutex<HashMap<Key, HashSet<(String, String)>>>,
    /// Per JobSet the protocol cannot serve, the reason last reported (once per reason).
    unservable: Mutex<HashMap<Key, String>>,
    /// Observe mode: the epoch fields as last seen, per JobSet.
    observed: Mutex<HashMap<Key, EpochStatus>>,
    /// The group-restart deadline's clocks and timers, per JobSet.
    deadlines: deadline::Deadlines,
    /// Keys whose last evaluation failed: consecutive failures, and whether a retry is pending.
    retries: Mutex<HashMap<Key, Retry>>,
    events: mpsc::Sender<(ObjectReference, KubeEvent)>,
    /// Namespaces labelled for provisioning ahead of any JobSet.
    enabled_namespaces: Mutex<std::collections::BTreeSet<String>>,
    /// Wakes the provisioner when JobSets or labelled namespaces change.
    provision_wake: Notify,
    /// The JobSetEpoch objects as published.
    published: Published,
}

/// The retry state of a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Retry {
    failures: u32,
    /// A requeue is scheduled: further failures do not schedule another.
    pending: bool,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forgets the per-JobSet state of a deleted JobSet (the index has already forgotten it).
fn forget(shared: &Shared, key: &Key) {
    lock(&shared.restarts).remove(key);
    lock(&shared.reported).remove(key);
    lock(&shared.unservable).remove(key);
    lock(&shared.observed).remove(key);
    lock(&shared.retries).remove(key);
    shared.published.forget(key);
    shared.deadlines.forget(key);
    shared.metrics.forget(key);
}

/// A running controller.
pub struct Controller {
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl Controller {
    /// Starts the watches, the workers and the event publisher. Workers write only while
    /// `leader` is true; no write has a deadline (see [`Controller::start_fenced`]).
    pub fn start(
        client: kube::Client,
        settings: Settings,
        metrics: Metrics,
        leader: watch::Receiver<bool>,
    ) -> Controller {
        let (_, write_until) = watch::channel(None);
        Controller::start_fenced(client, settings, metrics, leader, write_until)
    }

    /// As [`Controller::start`]; every write is sent only with a timeout that ends before
    /// `write_until` ([`super::fence::write_budget`]).
    pub fn start_fenced(
        client: kube::Client,
        settings: Settings,
        metrics: Metrics,
        leader: watch::Receiver<bool>,
        write_until: watch::Receiver<Option<Instant>>,
    ) -> Controller {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let shared = Arc::new(Shared {
            index: Mutex::new(Index::new(settings.dialect)),
            queue: Queue::default(),
            metrics,
            leader,
            write_until,
            jobsets_synced: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
            restarts: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
            unservable: Mutex::new(HashMap::new()),
            observed: Mutex::new(HashMap::new()),
            deadlines: deadline::Deadlines::new(),
            retries: Mutex::new(HashMap::new()),
            events: events_tx,
            enabled_namespaces: Mutex::new(std::collections::BTreeSet::new()),
            provision_wake: Notify::new(),
            published: Published::default(),
            client,
            settings,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(watch_jobsets(shared.clone()));
        tasks.spawn(watch_pods(shared.clone()));
        if shared.settings.publish_epochs {
            tasks.spawn(watch_published(shared.clone()));
        }
        tasks.spawn(publish_events(shared.clone(), events_rx));
        tasks.spawn(follow_leadership(shared.clone()));
        if shared.settings.provision.is_some() {
            tasks.spawn(watch_namespaces(shared.clone()));
            tasks.spawn(provisioning::provision_loop(shared.clone()));
        }
        for _ in 0..shared.settings.workers.max(1) {
            tasks.spawn(work(shared.clone()));
        }
        Controller { shared, tasks }
    }

    /// Both caches have synced once.
    pub fn is_ready(&self) -> bool {
        self.shared.jobsets_synced.load(Ordering::Acquire)
            && self.shared.pods_synced.load(Ordering::Acquire)
    }

    /// A probe for /readyz: both caches have synced once.
    pub fn readiness(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || {
            shared.jobsets_synced.load(Ordering::Acquire)
                && shared.pods_synced.load(Ordering::Acquire)
        }
    }

    /// JobSets waiting in the queue.
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }

    /// How much state is held now.
    pub fn state_sizes(&self) -> StateSizes {
        let (jobsets, pods) = {
            let index = lock(&self.shared.index);
            (index.jobset_count(), index.pod_count())
        };
        StateSizes {
            jobsets,
            pods,
            queued: self.shared.queue.len(),
            retries: lock(&self.shared.retries).len(),
            restarts: lock(&self.shared.restarts).len(),
            reported: lock(&self.shared.reported).len(),
            published: self.shared.published.len(),
            deadlines: self.shared.deadlines.len(),
        }
    }

    /// Stops every task.
    pub async fn shutdown(mut self) {
        self.shared.deadlines.abort_timers();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

fn jobset_api(shared: &Shared) -> Api<JobSet> {
    match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.client.clone(), ns),
        None => Api::all(shared.client.clone()),
    }
}

async fn watch_jobsets(shared: Arc<Shared>) {
    let stream =
        watcher(jobset_api(&shared), watch_config(&shared.settings)).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        {
            let mut index = lock(&shared.index);
            match event {
                Ok(Event::Init) => index.jobsets_relisting(),
                Ok(Event::InitApply(js) | Event::Apply(js)) => {
                    if let Some(key) = index.apply_jobset(&js) {
                        // Every replica keeps the deadline's clock, so that a standby taking
                        // over knows when the group restart began.
                        if let Some(state) = index.jobset(&key) {
                            shared.deadlines.observe(&key, state);
                        }
                        changed.push(key);
                    }
                }
                Ok(Event::Delete(js)) => {
                    if let (Some(ns), Some(name)) = (&js.metadata.namespace, &js.metadata.name) {
                        index.delete_jobset(ns, name);
                        gone.push(Key::new(ns, name));
                    }
                }
                Ok(Event::InitDone) => {
                    gone = index.jobsets_relisted();
                    shared.jobsets_synced.store(true, Ordering::Release);
                    changed.extend(index.active_keys());
                }
                Err(e) => tracing::warn!(error = %e, "jobset watch failed; retrying"),
            }
            shared
                .metrics
                .jobsets_tracked
                .set(index.jobset_count() as i64);
        }
        if !changed.is_empty() || !gone.is_empty() {
            // A new namespace may need the agent's account, or an old one no longer.
            shared.provision_wake.notify_one();
        }
        for key in &gone {
            forget(&shared, key);
        }
        for key in changed {
            shared.queue.add(key);
        }
    }
}

async fn watch_pods(shared: Arc<Shared>) {
    let api: Api<WatchedPod> = match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.client.clone(), ns),
        None => Api::all(shared.client.clone()),
    };
    let config = watch_config(&shared.settings).labels(JOBSET_NAME_LABEL);
    let stream = watcher(api, config).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let mut changed = Vec::new();
        {
            let mut index = lock(&shared.index);
            match event {
                Ok(Event::Init) => index.pods_relisting(),
                Ok(Event::InitApply(pod) | Event::Apply(pod)) => {
                    changed.extend(index.apply_pod(&pod));
                }
                Ok(Event::Delete(pod)) => {
                    if let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) {
                        changed.extend(index.delete_pod(ns, name));
                    }
                    // The last pod of a namespace may free its role binding.
                    shared.provision_wake.notify_one();
                }
                Ok(Event::InitDone) => {
                    changed.extend(index.pods_relisted());
                    // Nothing was decided during the list (see `decide`): decide now.
                    changed.extend(index.active_keys());
                    shared.pods_synced.store(true, Ordering::Release);
                }
                Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
            }
            shared.metrics.pods_tracked.set(index.pod_count() as i64);
        }
        for key in changed {
            shared.queue.add(key);
        }
    }
}

/// Follows the published JobSetEpoch objects ([`publish::watch`]).
async fn watch_published(shared: Arc<Shared>) {
    let api: Api<JobSetEpoch> = match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.client.clone(), ns),
        None => Api::all(shared.client.clone()),
    };
    let config = watch_config(&shared.settings);
    let synced = || {
        // JobSets evaluated before the list could not publish: evaluate them again.
        let keys = lock(&shared.index).in_place_restart_keys();
        for key in keys {
            shared.queue.add(key);
        }
    };
    publish::watch(
        api,
        config,
        &shared.published,
        |key| shared.queue.add(key),
        synced,
    )
    .await;
}

/// Follows the namespaces labelled `jobset-inplace.dev/enabled=true`.
async fn watch_namespaces(shared: Arc<Shared>) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(shared.client.clone());
    let config =
        watch_config(&shared.settings).labels(&format!("{}=true", provision::ENABLED_LABEL));
    let stream = watcher(api, config).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    let mut relist: Option<std::collections::BTreeSet<String>> = None;
    while let Some(event) = stream.next().await {
        let mut enabled = lock(&shared.enabled_namespaces);
        match event {
            Ok(Event::Init) => relist = Some(std::collections::BTreeSet::new()),
            Ok(Event::InitApply(ns)) => {
                if let (Some(seen), Some(name)) = (relist.as_mut(), ns.metadata.name) {
                    seen.insert(name);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = relist.take() {
                    *enabled = seen;
                }
            }
            Ok(Event::Apply(ns)) => {
                enabled.extend(ns.metadata.name);
            }
            Ok(Event::Delete(ns)) => {
                if let Some(name) = ns.metadata.name {
                    enabled.remove(&name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "namespace watch failed; retrying"),
        }
        drop(enabled);
        shared.provision_wake.notify_one();
    }
}

/// On gaining the lease, every active JobSet is evaluated: the previous leader may have left
/// work undone.
async fn follow_leadership(shared: Arc<Shared>) {
    let mut leader = shared.leader.clone();
    loop {
        let is_leader = *leader.borrow_and_update();
        shared.metrics.is_leader.set(i64::from(is_leader));
        if is_leader {
            let keys = lock(&shared.index).active_keys();
            for key in keys {
                shared.queue.add(key);
            }
        }
        if leader.changed().await.is_err() {
            return;
        }
    }
}

async fn work(shared: Arc<Shared>) {
    loop {
        let mut leader = shared.leader.clone();
        if leader.wait_for(|l| *l).await.is_err() {
            return;
        }
        let key = shared.queue.next().await;
        if !shared.settings.debounce.is_zero() {
            tokio::time::sleep(shared.settings.debounce).await;
        }
        shared.queue.start(&key);
        let result = reconcile(&shared, &key).await;
        shared.queue.done(&key);
        match result {
            Ok(()) => {
                lock(&shared.retries).remove(&key);
            }
            Err(e) => {
                tracing::warn!(namespace = %key.namespace, jobset = %key.name, error = %e, "reconcile failed; retrying");
                retry_later(&shared, key, e.retry_after());
            }
        }
    }
}

/// The delay before the retry after `failures` consecutive failures: 400 ms doubling to 10 s,
/// or what the API server asked for (`Retry-After`) when longer.
fn retry_delay(failures: u32, server: Option<Duration>) -> Duration {
    let backoff = Duration::from_millis(200u64.saturating_mul(1 << failures.min(6)))
        .min(Duration::from_secs(10));
    crate::retry::delay(backoff, server)
}

/// Requeues a key after a backoff ([`retry_delay`]). At most one retry is pending per key: a
/// key that fails again meanwhile (evaluated for a watch event) only counts the failure.
fn retry_later(shared: &Arc<Shared>, key: Key, server: Option<Duration>) {
    let delay = {
        let mut retries = lock(&shared.retries);
        let retry = retries.entry(key.clone()).or_default();
        retry.failures = retry.failures.saturating_add(1);
        if retry.pending {
            return;
        }
        retry.pending = true;
        retry_delay(retry.failures, server)
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        if let Some(retry) = lock(&shared.retries).get_mut(&key) {
            retry.pending = false;
        }
        shared.queue.add(key);
    });
}

/// Evaluates one JobSet, writes what changed, publishes its epochs for its agents, then runs its
/// group-restart deadline.
async fn reconcile(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    reconcile_epochs(shared, key).await?;
    publish_epochs(shared, key).await?;
    deadline::reconcile(shared, key).await
}

/// Writes a JobSet's `JobSetEpoch` object when its status's epochs moved past it (or it has
/// none): for every InPlaceRestart JobSet, and for a JobSet that no longer is one but has an
/// object (its agents must then stop waiting). Only once the watch of the objects has listed
/// them all, so that nothing is moved backwards. The epochs this replica decides are published
/// before they are written to the status ([`write_epochs`]); this catches up with everything
/// else (a new JobSet, a status written before, or by JobSet's own controller in observe mode,
/// where the object tells agents to watch the JobSet instead).
async fn publish_epochs(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    if !publishing(shared) {
        return Ok(());
    }
    let (uid, status, bypass, in_place_restart) = {
        let index = lock(&shared.index);
        let Some(state) = index.jobset(key) else {
            return Ok(());
        };
        (
            state.uid.clone(),
            state.status,
            state.bypass,
            state.in_place_restart,
        )
    };
    if uid.is_empty() || (!in_place_restart && !shared.published.contains(key)) {
        return Ok(());
    }
    publish_status(shared, key, &uid, status, bypass).await
}

/// Epochs can be published now: on, the objects listed, the kind served.
fn publishing(shared: &Shared) -> bool {
    shared.settings.publish_epochs
        && shared.published.is_synced()
        && !shared.published.is_unavailable()
}

/// Publishes `status` in a JobSet's `JobSetEpoch` ([`epochs::publish`]: monotone), if that
/// changes it.
async fn publish_status(
    shared: &Arc<Shared>,
    key: &Key,
    uid: &str,
    status: EpochStatus,
    bypass: bool,
) -> Result<(), ReconcileError> {
    let source = epochs::Source {
        uid,
        status,
        bypass,
        delegate: !shared.settings.write_epoch_status,
    };
    let Some(content) = shared.published.next(key, &source) else {
        return Ok(());
    };
    let api: Api<JobSetEpoch> = Api::namespaced(shared.client.clone(), &key.namespace);
    let applied = publish::apply(&api, &shared.published, key, uid, &content);
    match fenced(shared, "epochs_write", applied).await {
        Ok(()) => {
            shared.metrics.publication("ok");
            Ok(())
        }
        Err(Some(kube::Error::Api(status))) if status.code == 404 => {
            // The kind is not served (any more): publish nothing, write the status alone.
            shared.metrics.publication("error");
            shared.published.mark_unavailable();
            Ok(())
        }
        Err(Some(source)) => {
            shared.metrics.publication("error");
            Err(ReconcileError::Publish {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                source,
            })
        }
        Err(None) => {
            shared.metrics.publication("timeout");
            Err(timeout_error(shared, key, "epochs_write"))
        }
    }
}

/// Evaluates one JobSet's epochs and writes what changed (or, leaving them to JobSet's own
/// controller, observes them).
async fn reconcile_epochs(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    if shared.settings.publish_epochs
        && shared.settings.write_epoch_status
        && !shared.published.is_unavailable()
        && !shared.published.is_synced()
    {
        // Decisions are published before they are written, and nothing can be published before
        // the objects are listed: wait (the list's end queues every InPlaceRestart JobSet).
        return Ok(());
    }
    for _ in 0..CONFLICT_RETRIES {
        let Some((state, decision)) = decide(shared, key) else {
            return Ok(());
        };
        if let Some(reason) = &state.unservable {
            report_unservable(shared, key, &state, reason);
            return Ok(());
        }
        lock(&shared.unservable).remove(key);
        report_malformed(shared, key, &state, &decision);
        if !shared.settings.write_epoch_status {
            observe(shared, key, &state, &decision);
            return Ok(());
        }
        let written = if let Some(fail) = &decision.fail {
            write_failed(shared, key, &state, &fail.to_string()).await?
        } else if !decision.change.is_empty() {
            write_epochs(shared, key, &state, &decision).await?
        } else {
            return Ok(());
        };
        if written {
            return Ok(());
        }
        // 409: re-read the JobSet and decide again on what is there now.
        reread_status(shared, key).await?;
    }
    Err(ReconcileError::Conflicts {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
    })
}

/// After a conflict: reads the JobSet's status again into the index.
async fn reread_status(shared: &Shared, key: &Key) -> Result<(), ReconcileError> {
    let fresh = bounded(
        shared,
        "status_read",
        jobset_api_in(shared, &key.namespace).get_status(&key.name),
    )
    .await
    .map_err(|e| match e {
        Some(source) => write_error(key, source),
        None => timeout_error(shared, key, "status_read"),
    })?;
    lock(&shared.index).record_write(key, &fresh);
    Ok(())
}

fn jobset_api_in(shared: &Shared, namespace: &str) -> Api<JobSet> {
    Api::namespaced(shared.client.clone(), namespace)
}

fn write_error(key: &Key, source: kube::Error) -> ReconcileError {
    ReconcileError::Write {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        source,
    }
}

/// One API call bounded by the request timeout; `Err(None)` when it timed out (counted in
/// `api_timeouts_total{call}`).
async fn bounded<T>(
    shared: &Shared,
    call: &'static str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Option<kube::Error>> {
    match tokio::time::timeout(shared.settings.request_timeout, request).await {
        Ok(result) => result.map_err(Some),
        Err(_) => {
            shared.metrics.api_timeout(call);
            tracing::warn!(call, after = ?shared.settings.request_timeout, "an API request timed out");
            Err(None)
        }
    }
}

/// One write, sent only with a timeout that ends before this replica's write deadline
/// ([`super::fence::write_budget`]: a write sent by a leader about to lose its lease cannot land
/// after another replica took the lease over); not sent when too little is left. `Err(None)`
/// when it timed out or was not sent (counted in `api_timeouts_total{call}` or
/// `writes_fenced_total{call}`).
async fn fenced<T>(
    shared: &Shared,
    call: &'static str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Option<kube::Error>> {
    let until = *shared.write_until.borrow();
    let Some(budget) =
        super::fence::write_budget(Instant::now(), until, shared.settings.request_timeout)
    else {
        shared.metrics.write_fenced(call);
        tracing::warn!(
            call,
            "a write not sent: the leader lease may pass to another replica before it could complete"
        );
        return Err(None);
    };
    match tokio::time::timeout(budget, request).await {
        Ok(result) => result.map_err(Some),
        Err(_) => {
            shared.metrics.api_timeout(call);
            tracing::warn!(call, after = ?budget, "an API write timed out (or was cut at the leader's write deadline)");
            Err(None)
        }
    }
}

fn timeout_error(shared: &Shared, key: &Key, call: &'static str) -> ReconcileError {
    ReconcileError::Timeout {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        call,
        after: shared.settings.request_timeout,
    }
}

/// Runs the pure decision on the index, in place.
fn decide(shared: &Shared, key: &Key) -> Option<(JobSetState, ReconcileDecision)> {
    let index = lock(&shared.index);
    // While the pod watch re-lists, some pods are listed anew and others are as they were: a
    // pod created since the last event seen may be missing while a pod that failed since still
    // counts, so the synced epoch could be written with a registered pod left out (found by the
    // model check, tests/model_check.rs). The keys are queued again when the list is complete.
    if index.pods_relisting_in_progress() {
        return None;
    }
    let (state, pods) = index.get(key)?;
    if !state.active {
        return None;
    }
    let started = Instant::now();
    let decision = reconcile_decide(&reconcile_input(
        index.dialect(),
        state,
        pods,
        index.last_synced(key),
        index.last_deprecated(key),
    ));
    shared
        .metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    shared.metrics.reconciles.inc();
    Some((state.clone(), decision))
}

/// Says once per reason, as a Warning event, that a JobSet cannot be served (and so gets no
/// status write).
fn report_unservable(shared: &Shared, key: &Key, state: &JobSetState, reason: &str) {
    let first = lock(&shared.unservable)
        .insert(key.clone(), reason.to_owned())
        .as_deref()
        != Some(reason);
    if first {
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, reason, "the epoch protocol cannot serve this JobSet; writing nothing for it");
        emit(
            shared,
            key,
            state,
            EventType::Warning,
            "InPlaceRestartNotServable",
            format!("{reason}; no epoch is written for this JobSet"),
        );
    }
}

/// Reports each malformed annotation once, as a Warning event. Only those still there are
/// remembered: a pod whose annotation is fixed (or that is gone) is forgotten, and reported
/// again should it break again.
fn report_malformed(shared: &Shared, key: &Key, state: &JobSetState, decision: &ReconcileDecision) {
    if decision.malformed.is_empty() && !lock(&shared.reported).contains_key(key) {
        return;
    }
    let current: HashSet<(String, String)> = decision
        .malformed
        .iter()
        .map(|m| (m.pod.clone(), m.error.value.clone()))
        .collect();
    let seen = {
        let mut reported = lock(&shared.reported);
        let seen = if current.is_empty() {
            reported.remove(key)
        } else {
            reported.insert(key.clone(), current)
        };
        seen.unwrap_or_default()
    };
    for m in &decision.malformed {
        let first = !seen.contains(&(m.pod.clone(), m.error.value.clone()));
        if first {
            tracing::warn!(namespace = %key.namespace, jobset = %key.name, pod = %m.pod, error = %m.error, "malformed epoch annotation ignored");
            emit(
                shared,
                key,
                state,
                EventType::Warning,
                "MalformedEpoch",
                format!(
                    "pod {}: {}; the pod is not counted until its agent registers again",
                    m.pod, m.error
                ),
            );
        }
    }
}

/// A merge patch on `status` that only applies to `resource_version`.
fn status_patch(resource_version: &str, status: Value) -> Value {
    json!({"metadata": {"resourceVersion": resource_version}, "status": status})
}

/// Patches the status; `Ok(None)` on a 409 (the view was stale).
///
/// A write whose outcome is unknown (a 5xx, a timeout, a dropped connection: the API server
/// may have applied it and lost the answer) is checked with a fresh read: when `applied` holds
/// for it, the write counts as done, so that what follows a write (the group restart's start
/// time, metrics, events) is not lost with the answer. Otherwise the error is returned and the
/// key retried; its next decision starts from whatever the watch shows.
async fn patch_status(
    shared: &Shared,
    key: &Key,
    patch: &Value,
    field: &'static str,
    applied: impl Fn(&JobSet) -> bool,
) -> Result<Option<JobSet>, ReconcileError> {
    let api = jobset_api_in(shared, &key.namespace);
    let params = PatchParams::default();
    match fenced(
        shared,
        "status_write",
        api.patch_status(&key.name, &params, &Patch::Merge(patch)),
    )
    .await
    {
        Ok(js) => {
            shared.metrics.write(field, "ok");
            Ok(Some(js))
        }
        Err(Some(kube::Error::Api(status))) if status.code == 409 => {
            shared.metrics.write(field, "conflict");
            Ok(None)
        }
        Err(failure) => {
            let unknown = !matches!(&failure, Some(kube::Error::Api(s)) if s.code < 500);
            if unknown
                && let Ok(fresh) = bounded(shared, "status_read", api.get_status(&key.name)).await
                && applied(&fresh)
            {
                tracing::info!(namespace = %key.namespace, jobset = %key.name, field, error = ?failure, "the status write failed, but a fresh read shows it applied");
                shared.metrics.write(field, "ok");
                return Ok(Some(fresh));
            }
            match failure {
                Some(source) => {
                    shared.metrics.write(field, "error");
                    Err(write_error(key, source))
                }
                None => {
                    shared.metrics.write(field, "timeout");
                    Err(timeout_error(shared, key, "status_write"))
                }
            }
        }
    }
}

async fn write_epochs(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    decision: &ReconcileDecision,
) -> Result<bool, ReconcileError> {
    let dialect = shared.settings.dialect;
    let Some(Value::Object(mut body)) = dialect.status_merge_patch(&decision.change) else {
        return Ok(true);
    };
    let status = body.remove("status").unwrap_or(Value::Null);
    let field = if decision.change.synced.is_some() {
        "synced"
    } else {
        "deprecated"
    };
    let patch = status_patch(&state.resource_version, status);
    let change = decision.change;
    if publishing(shared) {
        // Agents read the published epochs, not the status: publish the decision first, so
        // that what they read never lags the status (a new pod reading a synced epoch older
        // than the status's could register an epoch synced without it: found by the model
        // check, tests/model_check.rs). A decision whose status write then conflicts is
        // published all the same; it was made on the pods, which the conflict is not about.
        let decided = EpochStatus {
            deprecated: change.deprecated.or(state.status.deprecated),
            synced: change.synced.or(state.status.synced),
        };
        publish_status(shared, key, &state.uid, decided, state.bypass).await?;
    }
    let applied = |js: &JobSet| {
        let now = js.epoch_status(dialect);
        change.deprecated.is_none_or(|d| now.deprecated == Some(d))
            && change.synced.is_none_or(|s| now.synced == Some(s))
    };
    let Some(js) = patch_status(shared, key, &patch, field, applied).await? else {
        return Ok(false);
    };
    // A value written again (JobSet's own controller dropped the field meanwhile) is no move:
    // only what goes past this replica's earlier writes counts as progress (metrics, events).
    let progress = {
        let mut index = lock(&shared.index);
        let progress = StatusChange {
            deprecated: decision
                .change
                .deprecated
                .filter(|d| index.last_deprecated(key) < Some(*d)),
            synced: decision
                .change
                .synced
                .filter(|s| index.last_synced(key) < Some(*s)),
        };
        index.record_write(key, &js);
        if let Some(synced) = decision.change.synced {
            index.record_sync(key, synced, &decision.synced_pods);
        }
        if let Some(deprecated) = decision.change.deprecated {
            index.record_deprecated(key, deprecated);
        }
        progress
    };
    if !decision.unsynced_joiners.is_empty() {
        tracing::warn!(
            namespace = %key.namespace,
            jobset = %key.name,
            pods = ?decision.unsynced_joiners,
            "pods registered without seeing the synced epoch (another writer wiped the epoch fields): every pod restarts"
        );
    }
    if !progress.is_empty() {
        record_progress(shared, key, state, decision, progress);
    }
    Ok(true)
}

/// Observe mode: the epoch fields JobSet's own controller moved since last seen are recorded as
/// if written here (metrics, events); nothing is written.
fn observe(shared: &Arc<Shared>, key: &Key, state: &JobSetState, decision: &ReconcileDecision) {
    let now = state.status;
    let before = lock(&shared.observed).insert(key.clone(), now);
    let Some(before) = before else {
        // First sight: the current values are where things stand, not a move.
        return;
    };
    let moved = |new: Option<Epoch>, old: Option<Epoch>| match (new, old) {
        (Some(n), Some(o)) if n > o => Some(n),
        (Some(n), None) => Some(n),
        _ => None,
    };
    let change = StatusChange {
        deprecated: moved(now.deprecated, before.deprecated),
        synced: moved(now.synced, before.synced),
    };
    if !change.is_empty() {
        record_progress(shared, key, state, decision, change);
    }
}

/// What follows a move of the epoch fields (written by this replica, or, when it leaves them to
/// JobSet's own controller, observed): the group restart metrics, events and log lines.
fn record_progress(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    decision: &ReconcileDecision,
    change: StatusChange,
) {
    if let Some(deprecated) = change.deprecated {
        shared.metrics.group_restarts.inc();
        shared.metrics.deprecated(key, i64::from(deprecated));
        lock(&shared.restarts).insert(key.clone(), (deprecated, Instant::now()));
        tracing::info!(namespace = %key.namespace, jobset = %key.name, epoch = deprecated, pods = decision.pods_to_restart, "group restart started");
        emit(
            shared,
            key,
            state,
            EventType::Normal,
            "GroupRestartStarted",
            format!(
                "epoch {deprecated} deprecated: {} of {} registered pods restart in place",
                decision.pods_to_restart, decision.registered
            ),
        );
    }
    if let Some(synced) = change.synced {
        let began = lock(&shared.restarts).remove(key);
        match began {
            Some((deprecated, at)) if deprecated < synced => {
                let took = at.elapsed();
                shared
                    .metrics
                    .group_restart_duration
                    .observe(took.as_secs_f64());
                tracing::info!(namespace = %key.namespace, jobset = %key.name, epoch = synced, seconds = took.as_secs_f64(), "group restart completed");
                emit(
                    shared,
                    key,
                    state,
                    EventType::Normal,
                    "GroupRestartCompleted",
                    format!(
                        "epoch {synced} synced: all {} pods restarted in place in {:.1} s",
                        decision.registered,
                        took.as_secs_f64()
                    ),
                );
            }
            _ => {
                tracing::info!(namespace = %key.namespace, jobset = %key.name, epoch = synced, "epoch synced");
                emit(
                    shared,
                    key,
                    state,
                    EventType::Normal,
                    "EpochSynced",
                    format!(
                        "epoch {synced} synced: all {} pods registered",
                        decision.registered
                    ),
                );
            }
        }
    }
}

async fn write_failed(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    reason: &str,
) -> Result<bool, ReconcileError> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    let message = format!("in-place restart gave up: {reason}");
    let mut conditions: Vec<Value> = state
        .conditions
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| c.get("type").and_then(Value::as_str) != Some("Failed"))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    conditions.push(json!({
        "type": "Failed",
        "status": "True",
        "reason": REACHED_MAX_RESTARTS,
        "message": message,
        "lastTransitionTime": now.to_string(),
    }));
    let patch = status_patch(
        &state.resource_version,
        json!({"conditions": conditions, "terminalState": "Failed"}),
    );
    let applied = |js: &JobSet| {
        js.conditions().iter().any(|c| {
            c.type_ == "Failed"
                && c.status == "True"
                && c.reason.as_deref() == Some(REACHED_MAX_RESTARTS)
        })
    };
    let Some(js) = patch_status(shared, key, &patch, "failed", applied).await? else {
        return Ok(false);
    };
    lock(&shared.index).record_write(key, &js);
    shared.metrics.failed_jobsets.inc();
    tracing::warn!(namespace = %key.namespace, jobset = %key.name, reason, "jobset failed: max restarts exceeded");
    emit(
        shared,
        key,
        state,
        EventType::Warning,
        "MaxRestartsExceeded",
        message,
    );
    Ok(true)
}

/// Queues an event on the JobSet; dropped (and logged) when the queue is full.
fn emit(
    shared: &Shared,
    key: &Key,
    state: &JobSetState,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let reference = ObjectReference {
        api_version: Some(jobset::API_VERSION.to_owned()),
        kind: Some(jobset::KIND.to_owned()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid: Some(state.uid.clone()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    };
    let event = KubeEvent {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if shared.events.try_send((reference, event)).is_err() {
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, reason, "event queue full; event dropped");
    }
}

async fn publish_events(shared: Arc<Shared>, mut rx: mpsc::Receiver<(ObjectReference, KubeEvent)>) {
    let recorder = Recorder::new(
        shared.client.clone(),
        Reporter {
            controller: CONTROLLER_NAME.to_owned(),
            instance: Some(shared.settings.identity.clone()),
        },
    );
    while let Some((reference, event)) = rx.recv().await {
        if let Err(e) = fenced(&shared, "event", recorder.publish(&event, &reference)).await {
            tracing::warn!(error = ?e, reason = %event.reason, "cannot publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_and_honour_retry_after() {
        let ms = Duration::from_millis;
        assert_eq!(retry_delay(1, None), ms(400));
        assert_eq!(retry_delay(2, None), ms(800));
        assert_eq!(retry_delay(40, None), ms(10_000));
        assert_eq!(retry_delay(1, Some(ms(3_000))), ms(3_000));
        assert_eq!(retry_delay(40, Some(ms(3_000))), ms(10_000));
    }
}
