//! A model of the epoch protocol (docs/protocol.md) for the stateright model checker.
//!
//! The model is a state machine over the whole system: the API server's JobSet status and pods,
//! one agent and one worker per pod, the kubelet that starts workers and restarts pods in place,
//! the Job controller that replaces failed pods, the reconciler with its watch-fed caches, and the
//! faults: worker and agent crashes, node loss, a competing status writer that wipes the epoch
//! fields, a reconciler that restarts with empty caches, and a killed agent's registration that
//! lands late. Every step is one action of one component; the checker explores every
//! interleaving.
//!
//! The decisions are the shipped ones: the agent's epoch is [`protocol::agent_epoch`], its
//! reaction to a JobSet state [`protocol::agent_decide`], the reconciler's writes
//! [`protocol::reconcile_decide`] on a [`ReconcileInput`] built from the reconciler's cache, as
//! `src/reconciler/index.rs` builds it. What the model adds is the I/O around them:
//!
//! - **The reconciler's caches lag.** Its view of each pod and of the JobSet is some earlier state
//!   of that object, and moves forward (to the object's current state) at any time, independently
//!   per object. That is what delayed watch events, a cut watch and its re-list, and the
//!   coalescing of bursts can produce (and a little more: watch order across objects is not kept),
//!   so a dropped watch needs no action of its own.
//! - **Status writes are guarded.** A write lands only on the status it was decided on (the
//!   `resourceVersion` precondition); otherwise it is refused (409), the reconciler re-reads the
//!   status and decides again later. The model compares the status itself plus a count of wipes,
//!   not a resourceVersion: a reconciler write always changes the status and the fields only grow
//!   between wipes, so equal values mean no write happened in between, or one that a re-read
//!   would have seen.
//! - **Agents read, register, then watch.** An agent reads its pod and its JobSet's epochs,
//!   computes its epoch, registers it (a merge patch on its pod) and then acts on the states its
//!   watch delivers: each delivery captures the current state, and the decision on it may come
//!   later (a delayed event), so an agent can act on a state that is already stale; a newer
//!   delivery may replace one not yet acted upon (a re-read after a cut watch).
//! - **Where agents read the epochs** ([`AgentsRead`]): the JobSet's JobSetEpoch object (the
//!   shipped path), which the reconciler publishes from its (lagging) view of the status at any
//!   time after it sees it, through the shipped [`jobset_inplace::wire::epochs::publish`]; it is
//!   never wiped. Or, the agents' fallback, the JobSet's status itself.
//! - **Restarts.** A worker or agent crash, and an agent's exit with the restart code, restart all
//!   of the pod's containers in place (the `RestartAllContainers` rule matches every non-zero
//!   exit): the worker stops, a new agent process starts, the annotation survives. A lost node
//!   fails the pod; the Job controller then creates a replacement without an annotation.
//! - **The kubelet's `AllContainersRestarting` condition** (early failure detection): `True` while
//!   the kubelet restarts the pod's containers, `False` otherwise, written by its own step at any
//!   time after it changed: so a `True` can be lost (the pod restarted before it was written), and
//!   a `False` can land after the new agent registered the next epoch (a stale `True` meanwhile).
//!   The reconciler reads it through its pod watch and remembers, per pod, the epoch at which it
//!   saw it `False` ([`protocol::restart_begun`], in memory like its other views).
//!
//! Safety properties are state predicates ([`Property::always`]); properties of transitions
//! ("never backwards") are recorded as violation flags by the step that breaks them. Liveness is
//! checked as "every quiescent state is converged" together with a progress order that every
//! non-fault step must strictly increase (see `tests/it/model_check.rs`).

use std::cmp::Ordering;
use std::fmt;

use jobset_inplace::protocol::{
    self, AgentAction, AgentView, Dialect, Epoch, EpochStatus, PodView, ReconcileInput,
};
use jobset_inplace::wire::epochs::{self, Epochs};

/// The JobSet's UID, as the owner of its JobSetEpoch object.
const JOBSET_UID: &str = "jobset";
use stateright::{Model, Property};

pub mod trace;
mod transitions;

/// Which decisions the model runs: the shipped ones, or a deliberately broken wrapper around
/// them (to show that the checker catches a broken protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `src/protocol.rs` as shipped.
    Real,
    /// An agent that lifts its barrier whenever a synced epoch is present, at any value.
    AgentLiftsAtAnySynced,
    /// A reconciler that writes the synced epoch before every expected pod registered (it is
    /// told to expect one pod).
    ReconcilerSyncsEarly,
    /// A reconciler that deprecates nothing.
    ReconcilerNeverDeprecates,
    /// The reconciler before the model check: it does not remember its last synced write, so it
    /// cannot tell a pod that registered while the epoch fields were wiped.
    ReconcilerWithoutMemory,
    /// The agent before the model check: it retries a refused registration with the same epoch.
    AgentRetriesRefusedEpoch,
    /// The reconciler before the model check: it decides while its pod watch re-lists, on a cache
    /// where some pods are listed anew and others still as they were (per pod, any lag).
    ReconcilerDecidesMidRelist,
    /// Early failure detection without the arming: any `AllContainersRestarting=True` seen at the
    /// synced epoch counts as a new failure, a stale one too.
    ReconcilerTrustsAnyRestarting,
}

/// What agents read their JobSet's epochs from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentsRead {
    /// The JobSet's JobSetEpoch object, which the reconciler publishes from its view of the
    /// status ([`jobset_inplace::wire::epochs::publish`]): the shipped path.
    Published,
    /// The JobSet's status itself: the agents' fallback where the JobSetEpoch kind is not served.
    JobSet,
}

/// How an agent's first read of its epochs' source is served (docs/protocol.md, "The agent's
/// first read").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstRead {
    /// At least as new as every write acknowledged before it: the shipped streaming list
    /// (`sendInitialEvents`, no resourceVersion) or its list-then-watch fallback.
    Consistent,
    /// From a watch cache that may lag: the source's current state, or the one before its last
    /// change (a watch opened without a resourceVersion, as the agent did before; one step
    /// behind stands for any lag, as the cache then replays each change in order).
    Stale,
}

/// What to explore.
#[derive(Clone, Debug)]
pub struct Config {
    pub agents_read: AgentsRead,
    pub dialect: Dialect,
    /// Pods of the JobSet (`replicas * parallelism`).
    pub pods: u8,
    /// Worker crashes, agent crashes and lost nodes, together.
    pub failures: u8,
    /// Lost nodes may be among the failures (the pod fails and is replaced).
    pub node_loss: bool,
    /// Wipes of both epoch fields by another status writer.
    pub wipes: u8,
    /// Reconciler restarts (a new leader with empty caches).
    pub reconciler_restarts: u8,
    /// A killed agent's registration may land after the pod restarted.
    pub late_registrations: bool,
    /// The API server runs the agent's ValidatingAdmissionPolicy
    /// (deploy/base/agent-policy.yaml), which refuses an epoch annotation below the current one.
    pub admission_policy: bool,
    /// The kubelet writes the pod's `AllContainersRestarting` condition (early failure
    /// detection). Off: every such write is lost, which the reconciler must survive too (the
    /// protocol without the early path), in a state space about ten times smaller.
    pub kubelet_condition: bool,
    pub first_read: FirstRead,
    pub variant: Variant,
}

impl Config {
    pub fn new(dialect: Dialect, pods: u8, failures: u8) -> Self {
        Config {
            agents_read: AgentsRead::Published,
            dialect,
            pods,
            failures,
            node_loss: true,
            wipes: 1,
            reconciler_restarts: 0,
            late_registrations: true,
            admission_policy: true,
            kubelet_condition: true,
            first_read: FirstRead::Consistent,
            variant: Variant::Real,
        }
    }

    fn first(&self) -> Epoch {
        self.dialect.first_epoch()
    }

    /// Epochs above this are flagged: with `failures` restarts and `wipes` wipes, the protocol
    /// needs far fewer; a protocol that climbs forever would otherwise make the space infinite.
    fn epoch_limit(&self) -> Epoch {
        self.first() + 2 * Epoch::from(self.failures) + 2 * Epoch::from(self.wipes) + 2
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{} dialect, {} pods, {} failures{}, {} wipes, {} reconciler restarts{}{}{}{}{}",
            match self.agents_read {
                AgentsRead::Published => "",
                AgentsRead::JobSet => "agents watch the JobSet, ",
            },
            self.dialect,
            self.pods,
            self.failures,
            if self.node_loss {
                " (crashes or lost nodes)"
            } else {
                " (crashes)"
            },
            self.wipes,
            self.reconciler_restarts,
            if self.late_registrations {
                ", late registrations"
            } else {
                ""
            },
            if self.admission_policy {
                ""
            } else {
                ", no admission policy"
            },
            if self.kubelet_condition {
                ", AllContainersRestarting"
            } else {
                ""
            },
            match self.first_read {
                FirstRead::Consistent => "",
                FirstRead::Stale => ", stale first reads",
            },
            match self.variant {
                Variant::Real => String::new(),
                v => format!(", variant {v:?}"),
            }
        )
    }
}

/// The JobSet's epoch fields, with the number of wipes so far (which stands in for the
/// resourceVersion across a wipe: a view from before a wipe is stale even if the values match).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Status {
    pub wipes: u8,
    pub deprecated: Option<Epoch>,
    pub synced: Option<Epoch>,
}

impl Status {
    fn epochs(self) -> EpochStatus {
        EpochStatus {
            deprecated: self.deprecated,
            synced: self.synced,
        }
    }

    /// Progress order: later wipes are later; between wipes both fields only grow.
    fn progress(self, other: Status) -> Option<Ordering> {
        match self.wipes.cmp(&other.wipes) {
            Ordering::Equal => product([
                Some(self.deprecated.cmp(&other.deprecated)),
                Some(self.synced.cmp(&other.synced)),
            ]),
            o => Some(o),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "D={} S={}", show(self.deprecated), show(self.synced))?;
        if self.wipes > 0 {
            write!(f, " (wiped {}x)", self.wipes)?;
        }
        Ok(())
    }
}

fn show(e: Option<Epoch>) -> String {
    e.map_or_else(|| "-".to_owned(), |e| e.to_string())
}

/// One agent process (or none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Agent {
    /// Started; reads its pod and JobSet next.
    Starting,
    /// Has its epoch; registers it next. `read` is the JobSet status it read, its first state.
    Registering { epoch: Epoch, read: Status },
    /// Registered; acts on the JobSet states its watch delivers. `view` is the last one
    /// delivered, `decided` whether it acted on it.
    Watching {
        epoch: Epoch,
        view: Status,
        decided: bool,
        lifted: bool,
    },
    /// Exited (restart code) or died: the kubelet restarts every container of the pod.
    Exited,
    /// The pod failed.
    Gone,
}

/// One pod object on the API server, and what runs in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pod {
    /// Its epoch annotation.
    pub annotation: Option<Epoch>,
    /// Phase `Failed` (lost node).
    pub failed: bool,
    /// Failed and replaced by the Job controller.
    pub replaced: bool,
    pub agent: Agent,
    /// The epoch at which its worker runs, if it runs.
    pub worker: Option<Epoch>,
    /// Failures that had happened when the current agent started (see [`State::generations`]).
    pub born: u8,
    /// A registration patch sent by an agent that has since been killed, still in flight.
    pub late: Option<Epoch>,
    /// Its `AllContainersRestarting` condition as written on the API server (the kubelet writes
    /// what it knows, [`Pod::kubelet_restarting`], in a step of its own).
    pub restarting: bool,
}

impl Pod {
    fn new() -> Self {
        Pod {
            annotation: None,
            failed: false,
            replaced: false,
            agent: Agent::Starting,
            worker: None,
            born: 0,
            late: None,
            restarting: false,
        }
    }

    /// What the kubelet knows of the condition: the pod's containers are being restarted
    /// (from the exit that matched a rule until the new agent starts).
    fn kubelet_restarting(&self) -> bool {
        !self.failed && self.agent == Agent::Exited
    }

    fn agent_alive(&self) -> bool {
        matches!(
            self.agent,
            Agent::Starting | Agent::Registering { .. } | Agent::Watching { .. }
        )
    }

    /// Progress order within one pod object (see [`ProtocolModel::progressed`]).
    fn progress(&self, other: &Pod, first: Epoch) -> Option<Ordering> {
        let generation = |p: &Pod| -> (Epoch, i8) {
            let next = p.annotation.map_or(first, |a| a.saturating_add(1));
            match p.agent {
                Agent::Exited => (next, -1),
                Agent::Starting => (next, 0),
                Agent::Registering { epoch, .. } => (epoch, 1),
                Agent::Watching { epoch, .. } => (epoch, 2),
                Agent::Gone => (Epoch::MAX, 0),
            }
        };
        let watching = |p: &Pod| match p.agent {
            Agent::Watching {
                view,
                decided,
                lifted,
                ..
            } => Some((view, lifted, decided)),
            _ => None,
        };
        lex([
            &|| Some(self.failed.cmp(&other.failed)),
            &|| Some(self.replaced.cmp(&other.replaced)),
            &|| Some(self.late.is_none().cmp(&other.late.is_none())),
            &|| Some(generation(self).cmp(&generation(other))),
            &|| match (watching(self), watching(other)) {
                (Some((v1, l1, d1)), Some((v2, l2, d2))) => {
                    lex([&|| v1.progress(v2), &|| Some(l1.cmp(&l2)), &|| {
                        Some(d1.cmp(&d2))
                    }])
                }
                (None, None) => Some(Ordering::Equal),
                _ => None,
            },
            &|| Some(self.worker.is_some().cmp(&other.worker.is_some())),
            &|| Some(self.born.cmp(&other.born)),
            &|| Some(self.annotation.cmp(&other.annotation)),
            &|| {
                let written = |p: &Pod| p.restarting == p.kubelet_restarting();
                Some(written(self).cmp(&written(other)))
            },
        ])
    }
}

/// What the reconciler holds of one pod: its cached view, and whether the pod was counted when
/// the reconciler last wrote the synced epoch (in memory, like the view).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RecPod {
    pub seen: Option<Seen>,
    pub counted: bool,
    /// The epoch at which it last saw the pod's condition `False` ([`protocol::Armed`]).
    pub armed: Option<Epoch>,
    /// [`PodView::restart_begun`] on the last view.
    pub begun: bool,
}

impl RecPod {
    /// A view of pod object `i` arrives: what the index does with it (`apply_pod`).
    fn observe(&mut self, i: usize, seen: Seen, variant: Variant) {
        let name = pod_name(i);
        let armed = self.armed.map(|epoch| protocol::Armed {
            uid: name.clone(),
            epoch,
        });
        let epoch = seen.annotation.filter(|_| !seen.failed);
        let (armed, begun) =
            protocol::restart_begun(armed.as_ref(), &name, epoch, Some(seen.restarting));
        self.seen = Some(seen);
        self.armed = armed.map(|a| a.epoch);
        self.begun = match variant {
            Variant::ReconcilerTrustsAnyRestarting => seen.restarting,
            _ => begun,
        };
    }
}

/// What the reconciler's cache holds of one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Seen {
    pub annotation: Option<Epoch>,
    pub failed: bool,
    /// Its `AllContainersRestarting` condition.
    pub restarting: bool,
}

impl Seen {
    fn of(pod: &Pod) -> Seen {
        Seen {
            annotation: pod.annotation,
            failed: pod.failed,
            restarting: pod.restarting,
        }
    }

    /// The condition goes back and forth within one epoch: it is left out (a delivery of it
    /// alone makes progress by emptying the queue).
    fn progress(self, other: Seen) -> Option<Ordering> {
        lex([&|| Some(self.failed.cmp(&other.failed)), &|| {
            Some(self.annotation.cmp(&other.annotation))
        }])
    }
}

/// Transition properties broken by a step, as flags.
pub mod flag {
    /// A pod's epoch annotation decreased.
    pub const EPOCH_DECREASED: u16 = 1 << 0;
    /// A reconciler write lowered a field present on the server.
    pub const WRITE_LOWERED: u16 = 1 << 1;
    /// A reconciler write went below a value the reconciler wrote before.
    pub const WRITE_BELOW_EARLIER: u16 = 1 << 2;
    /// An agent exited with the restart code at an epoch no deprecated value ever covered.
    pub const EXIT_NOT_DEPRECATED: u16 = 1 << 3;
    /// An epoch went past [`super::Config::epoch_limit`].
    pub const EPOCH_UNBOUNDED: u16 = 1 << 4;
    /// A step that is not a fault did not move the progress order strictly up.
    pub const NO_PROGRESS: u16 = 1 << 5;
    /// The published epochs moved backwards, or to a value the reconciler never wrote.
    pub const PUBLISHED_WRONG: u16 = 1 << 6;
    /// The reconciler decided to deprecate an epoch that no failure ended: with `f` failures
    /// so far, no pod can have registered past `first + f`, and a group restart needs one more
    /// failure than the epochs below the one it deprecates.
    pub const DEPRECATED_WITHOUT_FAILURE: u16 = 1 << 7;
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The JobSet's epoch fields on the API server.
    pub status: Status,
    /// The JobSet's JobSetEpoch object on the API server (`None`: not created yet); never
    /// wiped (`wipes` stays 0).
    pub published: Option<Status>,
    /// [`FirstRead::Stale`] only: what agents read before the last change of their source (a
    /// lagging watch cache's state); `None` otherwise.
    pub agents_before: Option<Status>,
    /// Every pod object, in creation order (failed ones stay, as with
    /// `podReplacementPolicy: Failed`).
    pub pods: Vec<Pod>,
    /// The reconciler's view of the JobSet (`None`: not listed yet).
    pub rec_status: Option<Status>,
    /// The reconciler's view of each pod object.
    pub rec_pods: Vec<RecPod>,
    /// The synced epoch the reconciler last wrote (in memory).
    pub rec_last_synced: Option<Epoch>,
    /// The highest deprecated epoch the reconciler wrote (in memory).
    pub rec_last_deprecated: Option<Epoch>,
    /// Pod watch events not yet delivered to the reconciler, oldest first: (pod object, state).
    pub rec_queue: Vec<(u8, Seen)>,
    /// For each failure so far, the generation it ended: the highest epoch at which a worker
    /// ran or could start then. A worker whose agent started before failure `k` and runs at an
    /// epoch at or below `generations[k]` owes a restart.
    pub generations: Vec<Option<Epoch>>,
    /// Highest deprecated and synced values the reconciler ever wrote.
    pub written_deprecated: Option<Epoch>,
    pub written_synced: Option<Epoch>,
    /// Highest deprecated and synced values agents could act on: written to the status, or
    /// published (which the reconciler does before the status write).
    pub released_deprecated: Option<Epoch>,
    pub released_synced: Option<Epoch>,
    /// Fault budgets left.
    pub failures_left: u8,
    pub wipes_left: u8,
    pub rec_restarts_left: u8,
    /// [`flag`]s raised so far; a state with a flag has no successor.
    pub violations: u16,
}

/// One step of one component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The agent of pod object `i` reads its pod and JobSet and computes its epoch.
    AgentReads(usize),
    /// [`FirstRead::Stale`] only: the same, its epochs' source read from a lagging watch cache
    /// (the state before the last change).
    AgentReadsStale(usize),
    /// It patches its pod's annotation.
    AgentRegisters(usize),
    /// Its watch (of the JobSetEpoch object, or of the JobSet) delivers the current state.
    AgentWatchDelivers(usize),
    /// It acts on the last state delivered (`agent_decide`).
    AgentDecides(usize),
    /// The kubelet's startup probe sees the lifted barrier and starts the worker.
    KubeletStartsWorker(usize),
    /// The kubelet restarts every container of the pod in place.
    KubeletRestartsPod(usize),
    /// The kubelet's status write of the pod's `AllContainersRestarting` condition lands.
    KubeletWritesCondition(usize),
    /// A killed agent's registration patch lands.
    LateRegistrationLands(usize),
    /// The Job controller replaces failed pod object `i`.
    JobControllerReplaces(usize),
    /// The reconciler's JobSet watch (or a re-list) brings its view up to date.
    ReconcilerSeesJobSet,
    /// It publishes its view of the status in the JobSetEpoch object
    /// ([`jobset_inplace::wire::epochs::publish`]).
    ReconcilerPublishes,
    /// Its pod watch delivers the oldest pending event.
    ReconcilerPodWatchDelivers,
    /// Its pod watch is cut and re-lists: the cache becomes the current state of every pod
    /// (it decides only once the list is complete).
    ReconcilerRelistsPods,
    /// [`Variant::ReconcilerDecidesMidRelist`] only: a re-list in progress has brought pod
    /// object `i` up to date, others not yet.
    ReconcilerRelistsPod(usize),
    /// It decides (`reconcile_decide`) on its cache and writes, guarded by the resourceVersion
    /// of its view: a stale view gets a 409 and a re-read instead.
    ReconcilerDecides,
    /// Fault: the worker of pod object `i` crashes (the kubelet kills the agent too).
    WorkerCrashes(usize),
    /// Fault: the agent of pod object `i` crashes (its worker runs until the kubelet restarts
    /// the pod). `late`: its registration patch was in flight and lands later.
    AgentCrashes { pod: usize, late: bool },
    /// Fault: the node of pod object `i` is lost; the pod fails.
    NodeLost(usize),
    /// Fault: another status writer drops both epoch fields.
    StatusWiped,
    /// Fault: the reconciler restarts (or leadership moves): its caches start empty.
    ReconcilerRestarts,
}

impl Action {
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::WorkerCrashes(_)
                | Action::AgentCrashes { .. }
                | Action::NodeLost(_)
                | Action::StatusWiped
                | Action::ReconcilerRestarts
        )
    }
}

/// The model: a configuration.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    pub config: Config,
}

// ---------------------------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------------------------

/// Safety: all running workers run at one epoch.
fn one_epoch_runs(_: &ProtocolModel, s: &State) -> bool {
    let mut running = s.pods.iter().filter_map(|p| p.worker);
    match running.next() {
        None => true,
        Some(first) => running.all(|w| w == first),
    }
}

/// Safety: a worker that was running (or released) when another pod restarted never runs
/// beside a worker of the next generation.
fn no_generation_mix(_: &ProtocolModel, s: &State) -> bool {
    let running: Vec<(&Pod, Epoch)> = s
        .pods
        .iter()
        .filter_map(|p| p.worker.map(|w| (p, w)))
        .collect();
    running
        .iter()
        .all(|(p, w)| match ProtocolModel::doomed_by(s, p, *w) {
            None => true,
            Some(k) => running.iter().all(|(q, _)| usize::from(q.born) <= k),
        })
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = usize::from(self.config.pods);
        vec![State {
            status: Status::default(),
            published: None,
            agents_before: None,
            pods: vec![Pod::new(); n],
            rec_status: None,
            rec_pods: vec![RecPod::default(); n],
            rec_last_synced: None,
            rec_last_deprecated: None,
            rec_queue: Vec::new(),
            generations: Vec::new(),
            written_deprecated: None,
            written_synced: None,
            released_deprecated: None,
            released_synced: None,
            failures_left: self.config.failures,
            wipes_left: self.config.wipes,
            rec_restarts_left: self.config.reconciler_restarts,
            violations: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.violations != 0 {
            return;
        }
        // Candidates only: `next_state` returns `None` for those not enabled.
        self.candidates(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.step(state, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("safety 1: running workers share one epoch", one_epoch_runs),
            Property::always(
                "safety 2: no new worker runs beside one that owes a restart",
                no_generation_mix,
            ),
            Property::always(
                "safety 2: restart exit only when deprecated",
                |_, s: &State| s.violations & flag::EXIT_NOT_DEPRECATED == 0,
            ),
            Property::always("safety 3: a pod's epoch never decreases", |_, s: &State| {
                s.violations & flag::EPOCH_DECREASED == 0
            }),
            Property::always("safety 3: a write never lowers a field", |_, s: &State| {
                s.violations & flag::WRITE_LOWERED == 0
            }),
            Property::always(
                "safety 3: a write never goes below an earlier write",
                |_, s: &State| s.violations & flag::WRITE_BELOW_EARLIER == 0,
            ),
            Property::always(
                "safety 3: the published epochs only move forward, to written values",
                |_, s: &State| s.violations & flag::PUBLISHED_WRONG == 0,
            ),
            Property::always(
                "safety 4: every group restart has a failure behind it",
                |_, s: &State| s.violations & flag::DEPRECATED_WITHOUT_FAILURE == 0,
            ),
            Property::always("bound: epochs stay bounded", |_, s: &State| {
                s.violations & flag::EPOCH_UNBOUNDED == 0
            }),
            Property::always(
                "liveness: every step but a fault makes progress",
                |_, s: &State| s.violations & flag::NO_PROGRESS == 0,
            ),
            Property::always(
                "liveness: every quiescent state is converged",
                |m: &ProtocolModel, s: &State| {
                    s.violations != 0 || !m.quiescent(s) || m.converged(s)
                },
            ),
            Property::eventually(
                "liveness (stateright): converged",
                |m: &ProtocolModel, s: &State| s.violations != 0 || m.converged(s),
            ),
            Property::sometimes("reachable: converged after a restart", |m, s| {
                m.converged(s)
                    && s.failures_left < m.config.failures
                    && s.status.synced > Some(m.config.first())
            }),
        ]
    }
}

/// The name of pod object `i` in the reconciler's input.
pub fn pod_name(i: usize) -> String {
    format!("pod-{i}")
}

/// Symmetry: pods are interchangeable, so a state is represented by its pods (with what the
/// reconciler holds of each) in sorted order.
pub fn representative(state: &State) -> State {
    let mut order: Vec<usize> = (0..state.pods.len()).collect();
    order.sort_by_cached_key(|i| format_key(&(state.pods[*i], state.rec_pods[*i])));
    let mut new_index = vec![0u8; order.len()];
    for (new, old) in order.iter().enumerate() {
        new_index[*old] = u8::try_from(new).unwrap_or(u8::MAX);
    }
    let mut s = state.clone();
    s.pods = order.iter().map(|i| state.pods[*i]).collect();
    s.rec_pods = order.iter().map(|i| state.rec_pods[*i]).collect();
    for (i, _) in &mut s.rec_queue {
        *i = new_index[usize::from(*i)];
    }
    s
}

/// A total order on (pod, reconciler view) pairs, for [`representative`].
fn format_key(pair: &(Pod, RecPod)) -> impl Ord + use<> {
    let (p, r) = pair;
    let agent = match p.agent {
        Agent::Starting => (0, 0, None, false, false),
        Agent::Registering { epoch, read } => (1, epoch, Some(read), false, false),
        Agent::Watching {
            epoch,
            view,
            decided,
            lifted,
        } => (2, epoch, Some(view), decided, lifted),
        Agent::Exited => (3, 0, None, false, false),
        Agent::Gone => (4, 0, None, false, false),
    };
    let status_key = |s: Option<Status>| s.map(|s| (s.wipes, s.deprecated, s.synced));
    (
        (
            (p.failed, p.replaced, p.annotation, p.worker, p.born, p.late),
            p.restarting,
        ),
        (agent.0, agent.1, status_key(agent.2), agent.3, agent.4),
        (
            r.seen.map(|s| (s.failed, s.annotation, s.restarting)),
            r.counted,
            r.armed,
            r.begun,
        ),
    )
}

/// A product of orderings: `Less` when none is `Greater` and one is `Less`.
fn product(orders: impl IntoIterator<Item = Option<Ordering>>) -> Option<Ordering> {
    let mut result = Ordering::Equal;
    for o in orders {
        match (result, o?) {
            (_, Ordering::Equal) => {}
            (Ordering::Equal, o) => result = o,
            (r, o) if r == o => {}
            _ => return None,
        }
    }
    Some(result)
}

/// A lexicographic combination of (lazily computed) partial orderings.
fn lex<const N: usize>(orders: [&dyn Fn() -> Option<Ordering>; N]) -> Option<Ordering> {
    for o in orders {
        match o()? {
            Ordering::Equal => continue,
            other => return Some(other),
        }
    }
    Some(Ordering::Equal)
}
