//! The epoch protocol (docs/protocol.md): the two wire dialects and the pure decisions of the agent
//! and the reconciler.
//!
//! This is the only module that spells the dialect-dependent names (the pod annotation and the two
//! status fields). Everything else asks a [`Dialect`] for them.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value, json};

/// Label (and annotation) the JobSet controller sets on every pod of a JobSet.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// Annotation on a JobSet that turns the barrier off: agents lift at once, the reconciler idles.
pub const DISABLE_ANNOTATION: &str = "jobset.sigs.k8s.io/disable-in-place-restart";
/// `spec.failurePolicy.restartStrategy` value that enables the protocol.
pub const IN_PLACE_RESTART: &str = "InPlaceRestart";

/// An epoch value. The status fields are int32 in the CRD, so epochs are too.
pub type Epoch = i32;

/// The wire names of the protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Dialect {
    /// KEP-467 as written: `jobset.sigs.k8s.io/epoch`, `status.deprecatedEpoch`,
    /// `status.syncedEpoch`; the first epoch is 1.
    #[default]
    Epoch,
    /// JobSet >= v0.11 as released: `jobset.sigs.k8s.io/in-place-restart-attempt`,
    /// `status.previousInPlaceRestartAttempt`, `status.currentInPlaceRestartAttempt`; the first
    /// epoch is 0.
    Attempt,
}

impl Dialect {
    pub const ALL: [Dialect; 2] = [Dialect::Epoch, Dialect::Attempt];

    /// The value used on the command line and in `JOBSET_INPLACE_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Epoch => "epoch",
            Dialect::Attempt => "attempt",
        }
    }

    /// The pod annotation that carries a pod's epoch.
    pub fn pod_annotation(self) -> &'static str {
        match self {
            Dialect::Epoch => "jobset.sigs.k8s.io/epoch",
            Dialect::Attempt => "jobset.sigs.k8s.io/in-place-restart-attempt",
        }
    }

    /// The JobSet status field (under `status`) holding the deprecated epoch.
    pub fn deprecated_field(self) -> &'static str {
        match self {
            Dialect::Epoch => "deprecatedEpoch",
            Dialect::Attempt => "previousInPlaceRestartAttempt",
        }
    }

    /// The JobSet status field (under `status`) holding the synced epoch.
    pub fn synced_field(self) -> &'static str {
        match self {
            Dialect::Epoch => "syncedEpoch",
            Dialect::Attempt => "currentInPlaceRestartAttempt",
        }
    }

    /// The epoch a pod registers when neither its own annotation nor the synced field exists.
    pub fn first_epoch(self) -> Epoch {
        match self {
            Dialect::Epoch => 1,
            Dialect::Attempt => 0,
        }
    }

    /// Reads the two epoch fields from a JobSet `status` object (absent or malformed values read
    /// as absent: a status we cannot read is one we must rewrite).
    pub fn read_status(self, status: Option<&Map<String, Value>>) -> EpochStatus {
        let field = |name: &str| {
            status
                .and_then(|s| s.get(name))
                .and_then(Value::as_i64)
                .and_then(|v| Epoch::try_from(v).ok())
                .filter(|v| *v >= 0)
        };
        EpochStatus {
            deprecated: field(self.deprecated_field()),
            synced: field(self.synced_field()),
        }
    }

    /// The JSON merge patch (for the `status` subresource) that writes the changed fields.
    /// Returns `None` when nothing changes.
    pub fn status_merge_patch(self, change: &StatusChange) -> Option<Value> {
        let mut status = Map::new();
        if let Some(d) = change.deprecated {
            status.insert(self.deprecated_field().to_owned(), json!(d));
        }
        if let Some(s) = change.synced {
            status.insert(self.synced_field().to_owned(), json!(s));
        }
        if status.is_empty() {
            None
        } else {
            Some(json!({ "status": status }))
        }
    }

    /// The JSON merge patch an agent sends to register its pod at `epoch`.
    pub fn pod_epoch_merge_patch(self, epoch: Epoch) -> Value {
        json!({ "metadata": { "annotations": { self.pod_annotation(): epoch.to_string() } } })
    }

    /// Reads a pod's epoch annotation from its annotations map: `Ok(None)` when absent.
    pub fn read_pod_epoch<'a, I>(self, annotations: I) -> Result<Option<Epoch>, EpochParseError>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        let key = self.pod_annotation();
        match annotations.into_iter().find(|(k, _)| k.as_str() == key) {
            None => Ok(None),
            Some((_, v)) => parse_epoch(v).map(Some),
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown dialect name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?}: expected \"epoch\" or \"attempt\"")]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "epoch" => Ok(Dialect::Epoch),
            "attempt" => Ok(Dialect::Attempt),
            other => Err(UnknownDialect(other.to_owned())),
        }
    }
}

/// Error for an epoch annotation that is not a non-negative int32 in plain decimal, or one
/// beyond what the protocol can reach ([`reachable_epoch`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed epoch {value:?}: {expected}")]
pub struct EpochParseError {
    pub value: String,
    pub expected: String,
}

/// How far above the restarts `maxRestarts` allows (from the synced epoch) a pod's epoch may be
/// and still be taken as one an agent registered: an agent that restarts alone several times
/// between two reconciles moves its epoch by one each time.
pub const EPOCH_MARGIN: i64 = 10;

/// The highest epoch an agent can register for a JobSet (issue 34): above the highest epoch
/// field known (synced or deprecated, as read or as last written; the first epoch without one),
/// the restarts `maxRestarts` allows and those that do not count, plus [`EPOCH_MARGIN`]. A pod
/// above it is malformed (reported, skipped): any pod creator's annotation (2147483647) would
/// otherwise fail the JobSet.
pub fn reachable_epoch(input: &ReconcileInput<'_>) -> i64 {
    let first = input.dialect.first_epoch();
    let base = [
        input.status.synced,
        input.status.deprecated,
        input.last_synced,
        input.last_deprecated,
    ]
    .into_iter()
    .flatten()
    .fold(first, Epoch::max);
    let not_counted =
        (i64::from(input.restarts) - i64::from(input.restarts_count_towards_max)).max(0);
    i64::from(base) + i64::from(input.max_restarts.max(0)) + not_counted + EPOCH_MARGIN
}

/// `epoch` as [`reachable_epoch`] judges it: an error when above `reach`.
fn within_reach(epoch: Epoch, reach: i64) -> Result<Epoch, EpochParseError> {
    if i64::from(epoch) <= reach {
        return Ok(epoch);
    }
    Err(EpochParseError {
        value: epoch.to_string(),
        expected: format!(
            "above {reach}, the highest epoch the protocol can reach for this JobSet (its epoch \
             fields, maxRestarts and a margin of {EPOCH_MARGIN})"
        ),
    })
}

/// Parses an epoch annotation value: plain ASCII decimal digits, no sign, no spaces, at most
/// `i32::MAX`. Anything else is malformed (and reported, never guessed at).
pub fn parse_epoch(value: &str) -> Result<Epoch, EpochParseError> {
    let err = || EpochParseError {
        value: value.chars().take(64).collect(),
        expected: "expected a non-negative integer below 2^31".to_owned(),
    };
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    value.parse::<Epoch>().map_err(|_| err())
}

/// The two epoch fields of a JobSet status, as read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochStatus {
    pub deprecated: Option<Epoch>,
    pub synced: Option<Epoch>,
}

/// The fields to write; `None` means "leave as is".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusChange {
    pub deprecated: Option<Epoch>,
    pub synced: Option<Epoch>,
}

impl StatusChange {
    pub fn is_empty(&self) -> bool {
        self.deprecated.is_none() && self.synced.is_none()
    }
}

// ---------------------------------------------------------------------------------------------
// Agent
// ---------------------------------------------------------------------------------------------

/// The epoch a starting agent registers (docs/protocol.md, "Guarantees" 1 and 3), `max(synced + 1, own + 1)`, an absent value
/// putting no constraint, and the dialect's first epoch when both are absent.
pub fn agent_epoch(dialect: Dialect, own: Option<Epoch>, synced: Option<Epoch>) -> Epoch {
    let next = |e: Epoch| e.saturating_add(1);
    match (own.map(next), synced.map(next)) {
        (None, None) => dialect.first_epoch(),
        (Some(a), None) | (None, Some(a)) => a,
        (Some(a), Some(b)) => a.max(b),
    }
}

/// What an agent knows about its JobSet at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentView {
    /// `spec.failurePolicy.restartStrategy == InPlaceRestart`.
    pub in_place_restart: bool,
    /// The JobSet carries [`DISABLE_ANNOTATION`].
    pub disabled: bool,
    pub status: EpochStatus,
}

/// An agent's pod must restart in place: its epoch is at or below the deprecated one. The one
/// fact that flows from the decision ([`agent_decide`]) through the agent's loop to its exit
/// (`agent::AgentExit::Restart`, whose exit code is the restart code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restart {
    /// The pod's epoch.
    pub epoch: Epoch,
    /// The JobSet's deprecated epoch, at or above it.
    pub deprecated: Epoch,
}

/// What an agent does on a JobSet state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentAction {
    /// The pod's epoch is deprecated: exit with the restart code.
    Restart(Restart),
    /// Let the worker start (idempotent).
    LiftBarrier,
    /// Keep the barrier; wait for the next state.
    Wait,
}

/// What a registered agent does on one observed state of its JobSet's epochs: lift its barrier,
/// exit to restart, or wait (docs/protocol.md, "State").
pub fn agent_decide(epoch: Epoch, view: &AgentView) -> AgentAction {
    if !view.in_place_restart || view.disabled {
        return AgentAction::LiftBarrier;
    }
    if let Some(deprecated) = view.status.deprecated
        && epoch <= deprecated
    {
        return AgentAction::Restart(Restart { epoch, deprecated });
    }
    if view.status.synced == Some(epoch) {
        AgentAction::LiftBarrier
    } else {
        AgentAction::Wait
    }
}

// ---------------------------------------------------------------------------------------------
// Agents that restarted without their workers (a kubelet without the gate)
// ---------------------------------------------------------------------------------------------

/// One container's status as [`old_workers`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ContainerRun {
    /// `restartCount`.
    pub restart_count: i32,
    /// `state.running.startedAt` in seconds since the epoch (the API's resolution); `None`
    /// when the container does not run (or its start time cannot be read).
    pub running_since: Option<i64>,
}

/// What a pod's container statuses say about its workers and its agent sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OldWorkers {
    /// Nothing wrong seen.
    #[default]
    No,
    /// A worker runs while the agent does not: on a kubelet with
    /// `RestartAllContainersOnContainerExits` only the moment between an agent's exit and the
    /// kill of its workers, or a status that lags the containers. No synced epoch is written
    /// while a pod shows it, and nothing else is done.
    AgentDown,
    /// The agent runs again, started after a worker that still runs and with more restarts than
    /// it: the agent restarted alone and the worker outlived it (a kubelet without the gate).
    /// The pod is failed, and no synced epoch is written while it is there.
    AgentRestartedAlone,
}

/// Whether a pod's agent sidecar restarted without its workers (docs/protocol.md, "A node
/// without the feature"). `agent`: the agent sidecar's status (`None`: the pod has none, or not yet,
/// as in main-container mode); `workers`: every regular container's.
///
/// On a kubelet with the gate every container of the pod is killed before the agent starts
/// again, and a worker starts only once the agent's startup probe passed: a running worker
/// started at or after the running agent, and has restarted as often as it (or more: a worker
/// restarted alone by its own rule). An agent restarted alone by its startup probe giving up
/// has more restarts, but started before the worker it let start. So a running agent started
/// strictly later than a running worker, with more restarts than that worker, restarted alone
/// after the worker started. `startedAt` has a resolution of one second: an agent that
/// restarted alone within the same second as its worker started is not seen by this rule.
pub fn old_workers(agent: Option<ContainerRun>, workers: &[ContainerRun]) -> OldWorkers {
    let Some(agent) = agent else {
        return OldWorkers::No;
    };
    let running = || {
        workers
            .iter()
            .filter_map(|w| w.running_since.map(|s| (s, w)))
    };
    let Some(agent_since) = agent.running_since else {
        return if running().next().is_some() {
            OldWorkers::AgentDown
        } else {
            OldWorkers::No
        };
    };
    if running().any(|(since, w)| agent_since > since && agent.restart_count > w.restart_count) {
        OldWorkers::AgentRestartedAlone
    } else {
        OldWorkers::No
    }
}

// ---------------------------------------------------------------------------------------------
// Reconciler
// ---------------------------------------------------------------------------------------------

/// What the reconciler reads of one pod.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodView {
    pub name: String,
    /// `metadata.uid`: a deletion decided on this view is for this pod only (its precondition).
    pub uid: String,
    /// `status.phase == Failed`.
    pub failed: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// The raw epoch annotation, if any.
    pub epoch_annotation: Option<String>,
    /// The largest `restartCount` over all container statuses (init, sidecar and regular).
    pub max_restart_count: i32,
    /// The pod was counted when this reconciler last wrote the synced epoch
    /// ([`ReconcileInput::last_synced`]).
    pub counted_in_last_sync: bool,
    /// What its container statuses say of its agent and workers ([`old_workers`]).
    pub old_workers: OldWorkers,
    /// `spec.nodeName` (empty until bound): said when the pod is failed for
    /// [`OldWorkers::AgentRestartedAlone`].
    pub node: String,
    /// The kubelet has begun restarting every container of the pod at its registered epoch:
    /// its `AllContainersRestarting` condition is `True` now and was seen absent or `False` at
    /// that epoch, for this UID, by this reconciler ([`restart_begun`]).
    pub restart_begun: bool,
}

/// The pod condition the kubelet writes when a container's exit matched a
/// `RestartAllContainers` rule: `True` in the sync that kills the pod's containers, `False` once
/// they have all terminated (kubelet v1.35, `status.GenerateAllContainersRestartingCondition`;
/// absent on a pod without such a rule or on a kubelet without the feature). Never `True` for an
/// exit no rule matches (exit 0, the fatal codes), a deletion or an eviction.
pub const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";

/// What the reconciler remembers of one pod for early failure detection: it saw the pod, this
/// UID, registered at this epoch with its [`ALL_CONTAINERS_RESTARTING`] condition absent or
/// `False`. Kept in memory only: a new reconciler starts without it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Armed {
    pub uid: String,
    pub epoch: Epoch,
}

/// One observation of a pod for early failure detection: what to remember of it next, and
/// whether its restart has begun at its registered epoch ([`PodView::restart_begun`]).
///
/// A condition `True` counts only when the same pod (UID) was seen at the same epoch with the
/// condition absent or `False` before: a `True` left from an earlier restart (a status write
/// lost or late, or a reconciler that starts and finds it `True`) is never taken for a new
/// failure. `epoch` is the pod's registered epoch (`None`: unregistered or malformed);
/// `restarting` its condition's status (`None`: absent or neither `True` nor `False`).
pub fn restart_begun(
    armed: Option<&Armed>,
    uid: &str,
    epoch: Option<Epoch>,
    restarting: Option<bool>,
) -> (Option<Armed>, bool) {
    let Some(epoch) = epoch else {
        return (None, false);
    };
    if restarting == Some(true) {
        match armed {
            Some(a) if a.uid == uid && a.epoch == epoch => (Some(a.clone()), true),
            _ => (None, false),
        }
    } else {
        let armed = Armed {
            uid: uid.to_owned(),
            epoch,
        };
        (Some(armed), false)
    }
}

/// What the reconciler reads of one JobSet and its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileInput<'a> {
    pub dialect: Dialect,
    /// Sum over replicatedJobs of `replicas * parallelism`.
    pub expected_pods: i64,
    /// `spec.failurePolicy.maxRestarts` (absent is 0, as in the JobSet API).
    pub max_restarts: i32,
    pub status: EpochStatus,
    /// `status.restarts`.
    pub restarts: i32,
    /// `status.restartsCountTowardsMax`.
    pub restarts_count_towards_max: i32,
    /// The synced epoch this reconciler last wrote for the JobSet (kept in memory: a new leader
    /// starts without it); the pods it counted then carry [`PodView::counted_in_last_sync`].
    pub last_synced: Option<Epoch>,
    /// The highest deprecated epoch this reconciler wrote for the JobSet (in memory): a field
    /// that another writer wiped is never rewritten below it.
    pub last_deprecated: Option<Epoch>,
    pub pods: &'a [PodView],
}

/// Why a JobSet is failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MaxRestartsExceeded {
    /// In-place restarts so far (`max(epochs) - first epoch`, less the restarts that do not count)
    /// exceed `maxRestarts`.
    ByEpoch { restarts: i64, max_restarts: i32 },
    /// A container of a pod restarted more than `maxRestarts` times.
    ByRestartCount {
        pod: String,
        restart_count: i32,
        max_restarts: i32,
    },
}

impl fmt::Display for MaxRestartsExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxRestartsExceeded::ByEpoch {
                restarts,
                max_restarts,
            } => write!(
                f,
                "{restarts} in-place group restarts exceed maxRestarts {max_restarts}"
            ),
            MaxRestartsExceeded::ByRestartCount {
                pod,
                restart_count,
                max_restarts,
            } => write!(
                f,
                "a container of pod {pod} restarted {restart_count} times, more than maxRestarts {max_restarts}"
            ),
        }
    }
}

/// A pod whose epoch annotation could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedEpoch {
    pub pod: String,
    pub error: EpochParseError,
}

/// The reconciler's decision for one JobSet.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReconcileDecision {
    /// Fields to write (only those that change).
    pub change: StatusChange,
    /// Set when the JobSet must be failed; no epoch field is written then.
    pub fail: Option<MaxRestartsExceeded>,
    /// Pods whose annotation is malformed (ignored, to be reported).
    pub malformed: Vec<MalformedEpoch>,
    /// Pods counted (not failed, not terminating) with a valid epoch.
    pub registered: usize,
    /// Largest registered epoch.
    pub max_epoch: Option<Epoch>,
    /// When `change.deprecated` is set: how many counted pods are at or below it and must restart.
    pub pods_to_restart: usize,
    /// Pods registered at or below the last synced epoch that were not counted in it: they read
    /// the JobSet while another writer had wiped its epoch fields (see [`reconcile_decide`]).
    pub unsynced_joiners: Vec<String>,
    /// When `change.synced` is set: the pods counted at that epoch (for
    /// [`PodView::counted_in_last_sync`] once the write succeeded).
    pub synced_pods: Vec<String>,
    /// Counted pods whose agent restarted without their workers
    /// ([`OldWorkers::AgentRestartedAlone`]): to be failed. Nothing is synced while one is there.
    pub restarted_alone: Vec<AloneAgent>,
    /// Whether a counted pod shows old workers ([`OldWorkers`] other than `No`): the synced epoch
    /// is not written then.
    pub held: bool,
    /// A counted pod at the synced epoch whose restart has begun ([`PodView::restart_begun`]):
    /// the synced epoch is deprecated at once, without waiting for its new agent to register
    /// the next one (early failure detection). The first such pod, by name.
    pub early: Option<String>,
}

/// A pod whose agent restarted without its workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AloneAgent {
    pub pod: String,
    pub uid: String,
    pub node: String,
}

/// The reconciler's decision for one JobSet that has the InPlaceRestart strategy and is neither
/// finished nor suspended (the caller checks that): the `maxRestarts` bound, then the synced
/// epoch once every expected pod is registered at one epoch, else the deprecation of every epoch
/// below the newest (docs/protocol.md, "Guarantees").
pub fn reconcile_decide(input: &ReconcileInput<'_>) -> ReconcileDecision {
    let mut decision = decide_registered(input);
    if decision.fail.is_some() {
        return decision;
    }
    // Early failure detection: a pod at the synced epoch that the kubelet has begun restarting
    // (its worker, or its agent, exited and matched a RestartAllContainers rule) will register
    // the next epoch once its new agent runs; the synced epoch is deprecated now, which is the
    // same write its registration would cause (docs/protocol.md, "Early failure detection").
    // Only ever a raise: it never lowers a deprecation decided above, and never re-deprecates
    // what is deprecated already.
    // Nothing below the first epoch is ever deprecated (a synced epoch below it was written by
    // someone else: no agent registers it).
    let Some(synced) = input
        .status
        .synced
        .filter(|s| *s >= input.dialect.first_epoch())
    else {
        return decision;
    };
    let Some(pod) = input.pods.iter().find(|p| {
        !p.failed
            && !p.terminating
            && p.restart_begun
            && p.epoch_annotation.as_deref().map(parse_epoch) == Some(Ok(synced))
    }) else {
        return decision;
    };
    let current = decision.change.deprecated.or(input.status.deprecated);
    if current.is_none_or(|d| synced > d) {
        decision.change.deprecated = Some(synced);
        decision.early = Some(pod.name.clone());
        decision.pods_to_restart = input
            .pods
            .iter()
            .filter(|p| !p.failed && !p.terminating)
            .filter_map(|p| {
                p.epoch_annotation
                    .as_deref()
                    .and_then(|a| parse_epoch(a).ok())
            })
            .filter(|e| *e <= synced)
            .count();
    }
    decision
}

/// [`reconcile_decide`] on the pods' registered epochs alone.
fn decide_registered(input: &ReconcileInput<'_>) -> ReconcileDecision {
    let first = input.dialect.first_epoch();
    let mut decision = ReconcileDecision::default();
    let mut epochs: Vec<Epoch> = Vec::with_capacity(input.pods.len());
    let mut worst_restart: Option<(&str, i32)> = None;
    let reach = reachable_epoch(input);

    for pod in input.pods.iter().filter(|p| !p.failed && !p.terminating) {
        match pod.old_workers {
            OldWorkers::No => {}
            OldWorkers::AgentDown => decision.held = true,
            OldWorkers::AgentRestartedAlone => {
                decision.held = true;
                decision.restarted_alone.push(AloneAgent {
                    pod: pod.name.clone(),
                    uid: pod.uid.clone(),
                    node: pod.node.clone(),
                });
            }
        }
        if worst_restart.is_none_or(|(_, c)| pod.max_restart_count > c) {
            worst_restart = Some((&pod.name, pod.max_restart_count));
        }
        let parsed = |v: &str| parse_epoch(v).and_then(|e| within_reach(e, reach));
        match pod.epoch_annotation.as_deref().map(parsed) {
            None => {}
            Some(Ok(e)) => epochs.push(e),
            Some(Err(error)) => decision.malformed.push(MalformedEpoch {
                pod: pod.name.clone(),
                error,
            }),
        }
    }
    decision.registered = epochs.len();
    let max_epoch = epochs.iter().copied().max();
    decision.max_epoch = max_epoch;

    // The bound: max restarts, by epoch and by container restart count.
    let max_restarts = input.max_restarts.max(0);
    if let Some(max) = max_epoch {
        let not_counted = i64::from(input.restarts) - i64::from(input.restarts_count_towards_max);
        let restarts = i64::from(max) - i64::from(first) - not_counted.max(0);
        if restarts > i64::from(max_restarts) {
            decision.fail = Some(MaxRestartsExceeded::ByEpoch {
                restarts,
                max_restarts,
            });
            return decision;
        }
    }
    if let Some((pod, restart_count)) = worst_restart
        && restart_count > max_restarts
    {
        decision.fail = Some(MaxRestartsExceeded::ByRestartCount {
            pod: pod.to_owned(),
            restart_count,
            max_restarts,
        });
        return decision;
    }

    let Some(max) = max_epoch else {
        return decision;
    };

    // A pod registers above every epoch synced so far (`agent_epoch` takes `synced + 1`), unless
    // it read the JobSet while another writer had wiped the synced field: a fresh pod (a
    // replacement) then starts over at the first epoch, at or below the pods that run. It
    // restarted all the same, so every pod must: everything up to the last synced epoch is
    // deprecated, and nothing is synced while such a pod is there. (Found by the model check,
    // tests/it/model_check.rs: a lost node while the fields were wiped.)
    // A wiped deprecated field is rewritten, never below what this reconciler wrote before.
    let wiped_floor = input
        .status
        .deprecated
        .is_none()
        .then_some(input.last_deprecated)
        .flatten();
    let raise = |target: Option<Epoch>| {
        let target = target.max(wiped_floor)?;
        input
            .status
            .deprecated
            .is_none_or(|d| target > d)
            .then_some(target)
    };
    if let Some(last) = input.last_synced {
        decision.unsynced_joiners = input
            .pods
            .iter()
            .filter(|p| !p.failed && !p.terminating && !p.counted_in_last_sync)
            .filter(|p| {
                p.epoch_annotation
                    .as_deref()
                    .and_then(|a| parse_epoch(a).ok())
                    .is_some_and(|e| e <= last)
            })
            .map(|p| p.name.clone())
            .collect();
        if !decision.unsynced_joiners.is_empty() {
            decision.change.deprecated = raise(Some(last));
            if let Some(d) = decision.change.deprecated {
                decision.pods_to_restart = epochs.iter().filter(|e| **e <= d).count();
            }
            return decision;
        }
    }

    // Synced: everyone registered at one epoch.
    // A pod whose workers outlived its agent's restart runs workers of an older epoch than its
    // annotation says: nothing is synced while one is seen (docs/protocol.md, "A node without
    // the gate").
    let in_sync = input.expected_pods > 0
        && !decision.held
        && i64::try_from(epochs.len()).unwrap_or(i64::MAX) >= input.expected_pods
        && epochs.iter().all(|e| *e == max);
    if in_sync {
        let above_deprecated = input
            .status
            .deprecated
            .or(wiped_floor)
            .is_none_or(|d| max > d);
        if above_deprecated && input.status.synced.is_none_or(|s| max > s) {
            decision.change.synced = Some(max);
            decision.synced_pods = input
                .pods
                .iter()
                .filter(|p| !p.failed && !p.terminating && p.epoch_annotation.is_some())
                .map(|p| p.name.clone())
                .collect();
        }
        // Every epoch below the one all pods are at is deprecated: a deprecated field that was
        // wiped, or left below it (its write failed after the decision was published and the
        // agents acted on it: found by tests/it/system/chaos.rs), is raised to it even while in sync.
        decision.change.deprecated = raise((max > first).then(|| max - 1));
    } else {
        // Else: deprecate everything below the newest epoch.
        let candidate = max.saturating_sub(1);
        decision.change.deprecated = raise((candidate >= first).then_some(candidate));
    }
    if let Some(d) = decision.change.deprecated {
        decision.pods_to_restart = epochs.iter().filter(|e| **e <= d).count();
    }
    decision
}

#[cfg(test)]
mod tests;
