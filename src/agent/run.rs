//! The agent's I/O (docs/protocol.md): read the pod, watch its JobSet's epochs (the JobSet's
//! `JobSetEpoch` object, or the JobSet itself where that kind is not served), register the epoch,
//! and act on each state with [`protocol::agent_decide`].
//!
//! Every API error is retried with a jittered exponential backoff (50 ms to 5 s, or longer when
//! a 429's `Retry-After` asks for it, [`crate::retry`]); nothing the API server does makes the
//! agent exit. A watch that ends or breaks after it served (an event or a bookmark, or one
//! second open) is resumed at once: only watches that fail straight away back off. A watch that
//! delivers nothing (not even a bookmark) for `watch_idle_timeout` is abandoned and resumed. The
//! agent ends only with an [`AgentExit`]: its pod's epoch was deprecated, or a signal arrived.
//!
//! The watch is kube's `Api::watch` with its resume kept here, not `kube::runtime::watcher`,
//! because the watcher re-opens a watch that ended inside its own step, without yielding an item
//! that a backoff could see, so a server that closes every watch at once would get requests in a
//! hot loop (its default list-then-watch would also make a start four requests, not three).
//!
//! **The first state is a consistent read** (docs/protocol.md, "The agent's first read"). A watch
//! opened without a resourceVersion is served from kube-apiserver's watch cache at whatever
//! resourceVersion the cache holds (`getWatchCacheResourceVersion`'s "legacy case" in
//! k8s.io/apiserver `pkg/storage/cacher/cacher.go`), so its first event may be older than a write
//! the API server acknowledged before the agent started: a stale synced epoch, which lets a
//! replacement pod register at or below the synced epoch and lift its barrier beside workers that
//! never restarted (the model check's `a_stale_first_read_is_caught`). So a watch from the
//! current state is a *streaming list*: `sendInitialEvents=true`,
//! `resourceVersionMatch=NotOlderThan`, no resourceVersion, which the API server serves only
//! after its cache has caught up with etcd's current revision (`GetCurrentResourceVersion`, then
//! `waitUntilFreshAndBlock`): one request, as before. Where the API server refuses it (the
//! `WatchList` feature gate off: 422), the agent falls back for good to a list (a consistent read
//! at an unset resourceVersion: `ConsistentListFromCache`, GA in 1.34) and a watch from the
//! list's resourceVersion: two requests.

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tracing::Instrument;

use super::barrier::BarrierState;
use super::config::AgentConfig;
use crate::jobset::JobSetSummary;
use crate::protocol::{self, AgentAction, AgentView, Dialect, Epoch, Restart};
use crate::retry::{CallError, bounded};
use crate::wire::WatchedPod;
use crate::wire::epochs::JobSetEpoch;

/// Seconds a watch request stays open before the server ends it and the agent resumes it.
const WATCH_TIMEOUT_SECS: u32 = 240;
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// A watch open this long served, even without an event ([`Protocol::watch_served`]).
const WATCH_SERVED: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A signal the agent reacts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Int,
}

impl Signal {
    pub fn number(self) -> i32 {
        match self {
            Signal::Term => 15,
            Signal::Int => 2,
        }
    }
}

/// Why the agent ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentExit {
    /// The pod's epoch is deprecated: exit with the restart code so the pod restarts in place
    /// (what [`protocol::agent_decide`] ordered).
    Restart(Restart),
    /// SIGTERM or SIGINT.
    Signalled(Signal),
}

impl AgentExit {
    /// The process exit code: the restart code only for a deprecated epoch, `128 + N` for
    /// signal N. Never 0.
    pub fn exit_code(&self, restart_exit_code: u8) -> u8 {
        match *self {
            AgentExit::Restart(_) => restart_exit_code,
            AgentExit::Signalled(s) => u8::try_from(128 + s.number().clamp(1, 127)).unwrap_or(255),
        }
    }
}

/// Runs the agent until it has a reason to end.
///
/// `barrier` receives every change of the barrier state (the HTTP endpoint of sidecar mode
/// serves it); `signals` delivers SIGTERM/SIGINT (a test may pass `futures::stream::pending()`).
/// API errors never end it.
pub async fn run_agent<S>(
    client: kube::Client,
    config: AgentConfig,
    barrier: watch::Sender<BarrierState>,
    signals: S,
) -> AgentExit
where
    S: Stream<Item = Signal> + Unpin,
{
    let span = tracing::info_span!(
        "agent",
        namespace = %config.namespace,
        pod = %config.pod_name,
        jobset = %config.jobset_name,
    );
    supervise(client, config, barrier, signals)
        .instrument(span)
        .await
}

async fn supervise<S>(
    client: kube::Client,
    config: AgentConfig,
    barrier: watch::Sender<BarrierState>,
    mut signals: S,
) -> AgentExit
where
    S: Stream<Item = Signal> + Unpin,
{
    let mut proto = Protocol::new(client, &config, barrier);
    let mut signals_open = true;
    loop {
        tokio::select! {
            event = proto.next() => match event {
                AgentAction::Restart(restart) => {
                    let Restart { epoch, deprecated } = restart;
                    tracing::info!(epoch, deprecated, "restarting: epoch {epoch} <= deprecated {deprecated}");
                    return AgentExit::Restart(restart);
                }
                // `next` returns the barrier's lifting once (the barrier endpoint serves it),
                // and never `Wait`.
                AgentAction::Wait | AgentAction::LiftBarrier => {}
            },
            signal = signals.next(), if signals_open => match signal {
                Some(s) => {
                    tracing::info!(signal = s.number(), "signal received; exiting");
                    return AgentExit::Signalled(s);
                }
                None => signals_open = false,
            },
        }
    }
}

/// Where the agent reads its JobSet's epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The JobSet's `JobSetEpoch` object ([`crate::wire::epochs`]): written only when an epoch
    /// moves, a few hundred bytes.
    Epochs,
    /// The JobSet itself, where the JobSetEpoch kind is not served (an install without its
    /// CRD): every write of the JobSet reaches the agent.
    JobSet,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Epochs => "JobSetEpoch",
            Source::JobSet => "JobSet",
        }
    }
}

/// One thing a watch delivered, whichever [`Source`] it watches.
enum Seen {
    /// The object as it is now (added or modified), and its resourceVersion.
    State(AgentView, Option<String>),
    Deleted(Option<String>),
    Bookmark(String),
    Failed(Box<kube::core::Status>),
    /// The JobSet's epochs are decided by another controller: watch the JobSet instead.
    Delegated,
}

fn seen<K: kube::Resource>(event: WatchEvent<K>, view: impl Fn(&K) -> AgentView) -> Seen {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => {
            Seen::State(view(&o), o.meta().resource_version.clone())
        }
        WatchEvent::Deleted(o) => Seen::Deleted(o.meta().resource_version.clone()),
        WatchEvent::Bookmark(b) => Seen::Bookmark(b.metadata.resource_version),
        WatchEvent::Error(status) => Seen::Failed(status),
    }
}

type WatchStream = BoxStream<'static, kube::Result<Seen>>;

/// The protocol as a resumable state machine: [`Protocol::next`] may be dropped at any await
/// (the supervisor races it against signals and the worker) and called again.
///
/// Its requests per agent start: one GET of the pod (its epoch annotation), one streaming list of
/// the JobSet's epochs (a watch whose first events are the current state, from a consistent read,
/// [`FirstRead`]), and one PATCH of the pod (the registration). The watch then delivers only epoch
/// changes; it is resumed from its last resourceVersion when the server ends it, and from the
/// current state (a consistent read again) after a `410 Gone`.
struct Protocol {
    pods: Api<WatchedPod>,
    jobsets: Api<JobSetSummary>,
    epochs: Api<JobSetEpoch>,
    source: Source,
    dialect: Dialect,
    pod_name: String,
    jobset_name: String,
    api_timeout: Duration,
    watch_idle_timeout: Duration,
    started: Instant,
    barrier: watch::Sender<BarrierState>,
    /// The pod's own epoch annotation, once read (`Some(None)`: it has none).
    own: Option<Option<Epoch>>,
    /// The epoch to register, once the pod and the epochs were read.
    epoch: Option<Epoch>,
    registered: bool,
    lifted: bool,
    /// The latest state the watch delivered.
    latest: Option<AgentView>,
    /// A state not decided on yet.
    pending: bool,
    /// Where the watch resumes; `None`: from the current state, read as [`Self::first_read`] says.
    resource_version: Option<String>,
    first_read: FirstRead,
    stream: Option<WatchStream>,
    watch_opened: Instant,
    watch_events: u64,
    backoff: Backoff,
}

impl Protocol {
    fn new(
        client: kube::Client,
        config: &AgentConfig,
        barrier: watch::Sender<BarrierState>,
    ) -> Self {
        Protocol {
            pods: Api::namespaced(client.clone(), &config.namespace),
            jobsets: Api::namespaced(client.clone(), &config.namespace),
            epochs: Api::namespaced(client, &config.namespace),
            source: Source::Epochs,
            dialect: config.dialect,
            pod_name: config.pod_name.clone(),
            jobset_name: config.jobset_name.clone(),
            api_timeout: config.api_timeout,
            watch_idle_timeout: config.watch_idle_timeout,
            started: config.started,
            barrier,
            own: None,
            epoch: None,
            registered: false,
            lifted: false,
            latest: None,
            pending: false,
            resource_version: None,
            first_read: FirstRead::StreamingList,
            stream: None,
            watch_opened: Instant::now(),
            watch_events: 0,
            backoff: Backoff::new(),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The next action that changes something: the barrier lifting (once), or a restart. Never
    /// [`AgentAction::Wait`]: waiting is what this does.
    async fn next(&mut self) -> AgentAction {
        loop {
            let Some(own) = self.own else {
                if self.stream.is_none() && self.latest.is_none() {
                    // A start's first two requests go out together: the pod's GET and the
                    // watch of the epochs (whose first event is the current state).
                    let open = self.open();
                    let get = bounded(self.api_timeout, self.pods.get(&self.pod_name));
                    let (pod, opened) = futures::join!(get, open);
                    self.opened(opened).await;
                    self.pod_read(pod).await;
                } else {
                    self.read_pod().await;
                }
                continue;
            };
            let Some(epoch) = self.epoch else {
                // The first state comes from the watch (opened without a resourceVersion).
                let Some(view) = self.latest else {
                    self.watch_step().await;
                    continue;
                };
                let epoch = protocol::agent_epoch(self.dialect, own, view.status.synced);
                self.epoch = Some(epoch);
                self.barrier.send_modify(|s| s.epoch = Some(epoch));
                tracing::debug!(
                    epoch,
                    own,
                    synced = view.status.synced,
                    source = self.source.name(),
                    ms = self.elapsed_ms(),
                    "read the pod and its JobSet's epochs"
                );
                // A JobSet without in-place restart lifts at once, before the registration.
                if (!view.in_place_restart || view.disabled)
                    && let Some(event) = self.decide(&view)
                {
                    return event;
                }
                continue;
            };
            if !self.registered {
                // Registration comes before any restart decision: a pod that restarted without
                // registering would compute the same epoch again and loop.
                self.register(epoch).await;
                continue;
            }
            if self.pending
                && let Some(view) = self.latest
            {
                self.pending = false;
                if let Some(event) = self.decide(&view) {
                    return event;
                }
                continue;
            }
            self.watch_step().await;
        }
    }

    fn decide(&mut self, view: &AgentView) -> Option<AgentAction> {
        let epoch = self.epoch?;
        self.barrier.send_modify(|s| {
            s.synced = view.status.synced;
            s.deprecated = view.status.deprecated;
        });
        match protocol::agent_decide(epoch, view) {
            restart @ AgentAction::Restart(_) => Some(restart),
            AgentAction::LiftBarrier if !self.lifted => {
                self.lifted = true;
                let bypassed = !view.in_place_restart || view.disabled;
                self.barrier.send_modify(|s| {
                    s.lifted = true;
                    s.bypassed = bypassed;
                });
                let ms = self.elapsed_ms();
                if bypassed {
                    tracing::info!(
                        epoch,
                        ms,
                        "barrier lifted after {ms} ms: the JobSet does not use in-place restart"
                    );
                } else {
                    tracing::info!(epoch, ms, "barrier lifted after {ms} ms");
                }
                Some(AgentAction::LiftBarrier)
            }
            AgentAction::LiftBarrier | AgentAction::Wait => None,
        }
    }

    /// Reads the pod's own epoch annotation (the first of a start's three requests).
    async fn read_pod(&mut self) {
        let read = bounded(self.api_timeout, self.pods.get(&self.pod_name)).await;
        self.pod_read(read).await;
    }

    /// What a GET of the pod answered: its own epoch annotation, or a backoff before the retry.
    async fn pod_read(&mut self, read: Result<WatchedPod, CallError>) {
        match read {
            Ok(pod) => {
                let annotations = pod.metadata.annotations.iter().flatten();
                let own = match self.dialect.read_pod_epoch(annotations) {
                    Ok(own) => own,
                    Err(e) => {
                        tracing::warn!(error = %e, "the pod's epoch annotation is malformed; ignoring it");
                        None
                    }
                };
                self.backoff.reset();
                self.own = Some(own);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pod; retrying");
                self.backoff.wait(e.retry_after()).await;
            }
        }
    }

    /// Registers `epoch`: the pod's annotation, as a JSON merge patch (the third request).
    async fn register(&mut self, epoch: Epoch) {
        let patch = Patch::Merge(self.dialect.pod_epoch_merge_patch(epoch));
        let params = PatchParams::default();
        loop {
            let sent = self.pods.patch(&self.pod_name, &params, &patch);
            match bounded(self.api_timeout, sent).await {
                Ok(_) => {
                    self.registered = true;
                    self.backoff.reset();
                    self.barrier.send_modify(|s| s.registered = true);
                    let ms = self.elapsed_ms();
                    tracing::info!(epoch, ms, "registered epoch {epoch} after {ms} ms");
                    return;
                }
                Err(CallError::Api(e)) if api_code(&e) == Some(422) => {
                    // The admission policy refuses an epoch below the pod's annotation: a
                    // registration of this pod's previous agent, still in flight when it was
                    // killed, landed after this agent read the pod. Read again and register above
                    // it (found by the model check, tests/it/model_check.rs).
                    tracing::warn!(epoch, error = %e, "the epoch was refused; reading the pod again");
                    self.own = None;
                    self.epoch = None;
                    self.backoff.wait(None).await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(epoch, error = %e, "cannot register the epoch on the pod; retrying");
                    self.backoff.wait(e.retry_after()).await;
                }
            }
        }
    }

    /// The watch that just ended served: it delivered an event or a bookmark, or stayed open
    /// for a second. Its end (a server timeout, a cut connection) calls for resuming at once,
    /// not for backing off as after a failure; a watch that fails straight away backs off, so
    /// that a server that refuses watches does not make the agent spin.
    fn watch_served(&self) -> bool {
        self.watch_events > 0 || self.watch_opened.elapsed() >= WATCH_SERVED
    }

    /// Opens the watch of the epochs' source, from `resource_version` or, without one, from the
    /// current state read consistently ([`FirstRead`]). The future owns what it needs (it is
    /// awaited while `self` is borrowed mutably elsewhere, and must not hold `&self`).
    fn open(&self) -> futures::future::BoxFuture<'static, Result<WatchStream, CallError>> {
        let name = format!("metadata.name={}", self.jobset_name);
        let params = WatchParams::default()
            .fields(&name)
            .timeout(WATCH_TIMEOUT_SECS);
        let from = self.resource_version.clone();
        let first_read = self.first_read;
        let limit = self.api_timeout;
        match self.source {
            Source::Epochs => {
                let api = self.epochs.clone();
                let view = |e: WatchEvent<JobSetEpoch>| match e {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) if o.delegates() => {
                        Seen::Delegated
                    }
                    e => seen(e, JobSetEpoch::agent_view),
                };
                open_from(api, params, name, from, first_read, limit, view)
            }
            Source::JobSet => {
                let api = self.jobsets.clone();
                let dialect = self.dialect;
                let view = move |e: WatchEvent<JobSetSummary>| seen(e, |js| js.agent_view(dialect));
                open_from(api, params, name, from, first_read, limit, view)
            }
        }
    }

    /// What opening the watch answered: the stream kept, or what its error calls for (a 410:
    /// from the current state; a 404 of the JobSetEpoch kind: the JobSet instead; else a
    /// backoff before the retry).
    async fn opened(&mut self, opened: Result<WatchStream, CallError>) {
        let source = self.source.name();
        match opened {
            Ok(stream) => {
                self.watch_opened = Instant::now();
                self.watch_events = 0;
                self.stream = Some(stream);
            }
            Err(CallError::Api(e)) if api_code(&e) == Some(410) => {
                tracing::info!(
                    source,
                    "the watch's resourceVersion expired; watching from the current state"
                );
                self.resource_version = None;
            }
            Err(CallError::Api(e))
                if self.first_read == FirstRead::StreamingList && refuses_streaming_lists(&e) =>
            {
                tracing::warn!(
                    source,
                    error = %e,
                    "the API server does not serve streaming lists (the WatchList feature gate is \
                     off): reading the current state with a list, then watching"
                );
                self.first_read = FirstRead::ListThenWatch;
            }
            Err(CallError::Api(e))
                if api_code(&e) == Some(404) && self.source == Source::Epochs =>
            {
                tracing::warn!(
                    "the JobSetEpoch kind is not served (its CRD is not installed): \
                     watching the JobSet instead"
                );
                self.source = Source::JobSet;
                self.resource_version = None;
            }
            Err(e) => {
                tracing::warn!(source, error = %e, "cannot watch the JobSet's epochs; retrying");
                self.backoff.wait(e.retry_after()).await;
            }
        }
    }

    /// One event of the watch of the epochs (the second request, held open), opening or resuming
    /// it as needed.
    async fn watch_step(&mut self) {
        let source = self.source.name();
        if self.stream.is_none() {
            let opened = self.open().await;
            self.opened(opened).await;
        }
        let Some(stream) = &mut self.stream else {
            return;
        };
        let Ok(next) = tokio::time::timeout(self.watch_idle_timeout, stream.next()).await else {
            // Neither an event nor a bookmark for the whole window: the connection is dead
            // without having said so (no FIN, no RST). Resume from the last resourceVersion.
            tracing::warn!(source, idle = ?self.watch_idle_timeout, "the watch went silent; resuming");
            self.stream = None;
            self.backoff.reset();
            return;
        };
        match next {
            Some(Ok(Seen::State(view, rv))) => {
                self.watch_events += 1;
                self.backoff.reset();
                if rv.is_some() {
                    self.resource_version = rv;
                }
                self.latest = Some(view);
                self.pending = true;
            }
            Some(Ok(Seen::Delegated)) => {
                tracing::info!(
                    "the JobSet's epochs are decided by another controller: watching the JobSet"
                );
                self.source = Source::JobSet;
                self.stream = None;
                self.resource_version = None;
                self.latest = None;
                self.pending = false;
            }
            Some(Ok(Seen::Deleted(rv))) => {
                self.watch_events += 1;
                if rv.is_some() {
                    self.resource_version = rv;
                }
                tracing::warn!(source, "the watched object was deleted; waiting");
            }
            Some(Ok(Seen::Bookmark(rv))) => {
                self.watch_events += 1;
                self.resource_version = Some(rv);
            }
            Some(Ok(Seen::Failed(status))) => {
                self.stream = None;
                if status.code == 410 {
                    tracing::info!(
                        source,
                        "the watch's resourceVersion expired; watching from the current state"
                    );
                    self.resource_version = None;
                } else {
                    tracing::warn!(source, code = status.code, message = %status.message, "the watch failed; resuming");
                    let server = crate::retry::status_retry_after(&status);
                    self.backoff.wait(server).await;
                }
            }
            Some(Err(e)) => {
                self.stream = None;
                if self.watch_served() {
                    tracing::info!(source, error = %e, "the watch broke; resuming");
                    self.backoff.reset();
                } else {
                    tracing::warn!(source, error = %e, "the watch broke at once; resuming");
                    self.backoff.wait(crate::retry::retry_after(&e)).await;
                }
            }
            None => {
                self.stream = None;
                tracing::debug!(source, resource_version = ?self.resource_version, "the watch ended; resuming");
                // A server that closes watches at once must not make the agent spin.
                if self.watch_served() {
                    self.backoff.reset();
                } else {
                    self.backoff.wait(None).await;
                }
            }
        }
    }
}

/// How the agent reads the current state when its watch starts without a resourceVersion: either
/// way a read at least as new as every write acknowledged before it (docs/protocol.md, "The
/// agent's first read").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstRead {
    /// One request: a watch with `sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`
    /// and no resourceVersion (kube-apiserver's `WatchList`, on by default since 1.34).
    StreamingList,
    /// Two: a list (unset resourceVersion: a consistent read), then a watch from its
    /// resourceVersion; where the API server refuses streaming lists.
    ListThenWatch,
}

/// Opens a watch of `api`'s object named by `name` (a field selector) from `from`, or, without
/// one, from the current state read as `first_read` says; `view` turns each event into [`Seen`].
fn open_from<K>(
    api: Api<K>,
    params: WatchParams,
    name: String,
    from: Option<String>,
    first_read: FirstRead,
    limit: Duration,
    view: impl Fn(WatchEvent<K>) -> Seen + Send + 'static,
) -> futures::future::BoxFuture<'static, Result<WatchStream, CallError>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    async move {
        match (from, first_read) {
            (Some(rv), _) => {
                let stream = bounded(limit, api.watch(&params, &rv)).await?;
                Ok(stream.map(move |r| r.map(&view)).boxed())
            }
            (None, FirstRead::StreamingList) => {
                let params = params.initial_events();
                let stream = bounded(limit, api.watch(&params, "")).await?;
                Ok(stream.map(move |r| r.map(&view)).boxed())
            }
            (None, FirstRead::ListThenWatch) => {
                let list = bounded(limit, api.list(&ListParams::default().fields(&name))).await?;
                let rv = list.metadata.resource_version.clone().unwrap_or_default();
                let stream = bounded(limit, api.watch(&params, &rv)).await?;
                // The list's items as the streaming list would send them: ADDED, then a bookmark
                // at the list's resourceVersion (where the watch resumes if it ends at once).
                let first: Vec<kube::Result<Seen>> = list
                    .items
                    .into_iter()
                    .map(|o| Ok(view(WatchEvent::Added(o))))
                    .chain(std::iter::once(Ok(Seen::Bookmark(rv))))
                    .collect();
                Ok(futures::stream::iter(first)
                    .chain(stream.map(move |r| r.map(&view)))
                    .boxed())
            }
        }
    }
    .boxed()
}

/// The API server refused a streaming list: `sendInitialEvents` is forbidden (422 Invalid)
/// where the `WatchList` feature gate is off (k8s.io/apimachinery
/// `pkg/apis/meta/internalversion/validation`, `validateWatchOptions`).
fn refuses_streaming_lists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("sendInitialEvents"))
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The agent's backoff: [`crate::retry::Backoff`] from [`BACKOFF_MIN`] to [`BACKOFF_MAX`]
/// (jittered, so that many agents spread out).
struct Backoff(crate::retry::Backoff);

impl Backoff {
    fn new() -> Self {
        Backoff(crate::retry::Backoff::new(BACKOFF_MIN, BACKOFF_MAX))
    }

    fn reset(&mut self) {
        self.0.reset();
    }

    /// Sleeps the next delay, or what the server asked for (`Retry-After`, stretched at random
    /// so that agents refused together come back apart) when longer.
    async fn wait(&mut self, server: Option<Duration>) {
        let delay = self.0.after(server);
        if server.is_some() {
            tracing::debug!(?delay, "the API server asked to retry later");
        }
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_contract() {
        let restart = AgentExit::Restart(Restart {
            epoch: 3,
            deprecated: 3,
        });
        assert_eq!(restart.exit_code(42), 42);
        assert_eq!(AgentExit::Signalled(Signal::Term).exit_code(42), 143);
        assert_eq!(AgentExit::Signalled(Signal::Int).exit_code(42), 130);
    }
}
