//! A simulated kubelet, Job controller and JobSet controller for the pods of one JobSet, on the
//! [`TestApiServer`], with the real reconciler running in-process and the real agent binary (or
//! the agent's code in-process, for large simulations).
//!
//! [`Simulation::start`] takes a plain JobSet ([`manifest::plain_jobset`]), applies the webhook's
//! injection ([`jobset_inplace::admission::mutate`]), creates it and one pod per position, each with the
//! labels and annotations the JobSet and Job controllers set. Each pod has its own kubelet task
//! ([`pod`]) that:
//! - runs the agent container with the env its template gives (downward-API `fieldRef`s
//!   resolved), pointed at the test API server (`AGENT_API_URL`) with a barrier port of its own
//!   (`BARRIER_PORT`: all pods share 127.0.0.1);
//! - polls the startup probe like the kubelet (every [`SimConfig::probe_period`]) and starts a
//!   simulated worker only once it answers 200;
//! - writes the pod status through the API: phase, container statuses with `restartCount`, the
//!   `AllContainersRestarting` condition during a restart;
//! - applies `restartPolicyRules` to every container exit: `RestartAllContainers` restarts every
//!   container in place (same pod and UID, restart counts up, a new agent process); a pod that
//!   fails ends, and the Job controller creates a replacement (new name and UID), as with
//!   `podReplacementPolicy: Failed`; a worker exit matching a `podFailurePolicy` `FailJob` rule
//!   fails the JobSet (KEP-467 story 2).
//!
//! The JobSet controller creates one Job per replicated job and index (JobSet's names, labels,
//! annotations and controller reference, the `restart-attempt` label at `status.restarts`), and
//! the Job controller the Job's pods (with a controller reference to the Job). As JobSet's and
//! Kubernetes' controllers do, the simulated ones:
//! - keep the Job controller's `batch.kubernetes.io/job-tracking` finalizer on every pod until
//!   the pod has ended (`Failed` or `Succeeded`) or its Job goes, and replace a pod of a Job that
//!   lives once it has failed (`podReplacementPolicy: Failed`): a pod deleted through the API is
//!   stopped by its kubelet, which reports it `Failed`; a pod on a node whose kubelet died
//!   ([`Simulation::kill_kubelet`]) stays `Running` in the API, and `Terminating` if deleted, until
//!   someone marks it `Failed`;
//! - delete (foreground) every Job whose `restart-attempt` is below `status.restarts`, and
//!   create every missing Job again at the current `status.restarts`;
//! - collect garbage: the pods of a Job deleted in the foreground are deleted, and once their
//!   kubelets have stopped them, the Job's `foregroundDeletion` finalizer is removed.
//!
//! An invariant checker runs all along ([`SimConfig::check_interval`], and at every worker
//! start): a worker never runs while any registered pod of the JobSet (not failed, not
//! terminating, with an epoch annotation) is at an epoch older than the one its own pod had when
//! the worker started. Violations are collected ([`Simulation::violations`]).
//!
//! The kubelet's and controllers' own API requests (pod creation, pod status, the JobSet's
//! `Failed` condition) carry the test API server's chaos exemption header
//! ([`crate::apiserver::EXEMPT_HEADER`]): under chaos mode, faults hit the agents and the
//! reconciler only. The real kubelet and controllers retry their writes until they succeed; the
//! simulation's writes, if faulted, would only be lost or delayed and test the simulator.
//!
//! Every child process is killed when the simulation is dropped.

pub(crate) mod agents;
pub mod manifest;
pub mod model;
mod pod;
pub(crate) mod recognise;
mod status;
pub mod transitions;
mod writers;

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};

pub use agents::{barrier_port, http_get};
use pod::{PodCmd, PodEnd, PodInfo};

use super::apiserver::TestApiServer;
use jobset_inplace::jobset::{JobSet, JobSetSummary};
use jobset_inplace::protocol::{Dialect, Epoch, JOBSET_NAME_LABEL};
use jobset_inplace::reconciler;

/// How agents run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentRunner {
    /// The real binary as a child process per pod (`env!("CARGO_BIN_EXE_jobset-inplace")`).
    Binary(PathBuf),
    /// [`jobset_inplace::agent::run_agent`] as a task of this process on one shared client, the barrier
    /// read from its state instead of HTTP (sidecar mode only; for hundreds of pods).
    InProcess,
}

/// One replicated job: `replicas` Jobs of `parallelism` pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedJobSpec {
    pub name: String,
    pub replicas: i64,
    pub parallelism: i64,
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub dialect: Dialect,
    pub namespace: String,
    pub jobset_name: String,
    pub replicated_jobs: Vec<ReplicatedJobSpec>,
    /// `spec.failurePolicy.maxRestarts`.
    pub max_restarts: i32,
    pub agents: AgentRunner,
    /// Startup probe period (the kubelet's is at least 1 s; simulations go faster).
    pub probe_period: Duration,
    /// Simulated time to restart a pod's containers in place.
    pub restart_delay: Duration,
    /// SIGTERM to SIGKILL when the kubelet stops an agent container (a deleted pod, a startup
    /// probe that gave up); a group restart kills with 2 s whatever this is
    /// ([`model::in_place_kill_grace`]).
    pub termination_grace: Duration,
    /// User init containers (`false`) and sidecars (`true`) placed before the agent, by name:
    /// they run (again) at every start of the pod's containers, before the agent.
    pub user_init_containers: Vec<(String, bool)>,
    /// How long each user init container runs (and each user sidecar takes to start).
    pub user_container_time: Duration,
    /// The injected startup probe's `failureThreshold` (`None`: the webhook's default, a day
    /// of probes): the kubelet restarts the agent alone when it is reached.
    pub probe_failure_threshold: Option<i32>,
    /// The kubelet runs with the `RestartAllContainersOnContainerExits` feature gate (the
    /// default). Without it the kubelet ignores `RestartAllContainers` rules and each container
    /// follows its own `restartPolicy`, as kubelet v1.35 does: an agent sidecar that exits
    /// restarts alone while its worker runs on, a worker that exits ends its pod
    /// (`restartPolicy: Never`), which its Job replaces.
    pub restart_all_gate: bool,
    /// KEP-467 story 2: the worker exit code that a `podFailurePolicy` `FailJob` rule and a
    /// JobSet `FailJobSet` rule on `PodFailurePolicy` turn into a failed JobSet.
    pub fail_job_exit_code: Option<i32>,
    /// Check the invariant at every worker start and every [`SimConfig::check_interval`]
    /// (each check lists the JobSet's pods: turn it off for benchmarks of hundreds of pods).
    pub check_invariant: bool,
    /// Period of the invariant checker (`None`: only at worker starts).
    pub check_interval: Option<Duration>,
    /// Write pod statuses through the API (phase, container statuses, conditions), as the
    /// kubelet does; off, only the agents' and controllers' writes remain.
    pub pod_status: bool,
    /// The Job controller's and JobSet's controller's status writes (Job counts, the JobSet's
    /// `replicatedJobsStatus`: [`writers`]); off for tests that need quiet.
    pub status_writers: bool,
    /// Run the reconciler in-process.
    pub run_reconciler: bool,
    pub reconciler_debounce: Duration,
    /// `JOBSET_INPLACE_LOG_LEVEL` of agent processes.
    pub agent_log_level: String,
    /// Agent and kubelet log lines kept for [`Simulation::logs`].
    pub log_capacity: usize,
    /// The reconciler's `--group-restart-timeout` (`None`: off).
    pub group_restart_timeout: Option<Duration>,
    /// The kubelets', controllers' and in-process agents' requests served in memory
    /// ([`TestApiServer::in_memory_client`]) instead of over loopback TCP: for simulations of
    /// thousands of pods, which would otherwise need two open files per agent in this process.
    pub in_memory: bool,
}

impl SimConfig {
    /// `pods` pods (one replicated job `workers` of `pods` Jobs with one pod each), sidecar
    /// mode, agents in-process; set [`SimConfig::agents`] to the binary for end-to-end runs.
    pub fn new(dialect: Dialect, pods: i64) -> Self {
        SimConfig {
            dialect,
            namespace: "sim".to_owned(),
            jobset_name: "js".to_owned(),
            replicated_jobs: vec![ReplicatedJobSpec {
                name: "workers".to_owned(),
                replicas: pods,
                parallelism: 1,
            }],
            max_restarts: 10,
            agents: AgentRunner::InProcess,
            probe_period: Duration::from_millis(10),
            restart_delay: Duration::from_millis(20),
            termination_grace: Duration::from_secs(2),
            user_init_containers: Vec::new(),
            user_container_time: Duration::from_millis(20),
            probe_failure_threshold: None,
            restart_all_gate: true,
            fail_job_exit_code: None,
            check_invariant: true,
            check_interval: Some(Duration::from_millis(5)),
            pod_status: true,
            status_writers: true,
            run_reconciler: true,
            reconciler_debounce: Duration::from_millis(5),
            agent_log_level: "info".to_owned(),
            log_capacity: 4_000,
            group_restart_timeout: Some(reconciler::DEFAULT_GROUP_RESTART_TIMEOUT),
            in_memory: false,
        }
    }

    /// Agents run as the given binary.
    pub fn with_binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.agents = AgentRunner::Binary(binary.into());
        self
    }

    pub fn pods(&self) -> i64 {
        self.replicated_jobs
            .iter()
            .map(|r| r.replicas * r.parallelism)
            .sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulation setup failed: {0}")]
    Setup(String),
    #[error("timed out after {after:?} waiting for {what}\n{state}")]
    Timeout {
        what: String,
        after: Duration,
        state: String,
    },
}

/// What the simulation knows of one pod position.
#[derive(Clone, Debug, Default)]
pub struct SlotState {
    /// The current pod.
    pub pod: String,
    pub uid: String,
    /// Pods created for this position after the first (replacements).
    pub replacements: u32,
    /// In-place restarts of all containers, over every pod of the position.
    pub restarts: u32,
    /// Agent container runs, over every pod of the position.
    pub agent_runs: u32,
    /// Worker starts, over every pod of the position.
    pub worker_runs: u32,
    /// Worker starts without a new agent run before them: a worker restarted alone.
    pub lone_worker_restarts: u32,
    /// The running worker, if any.
    pub worker: Option<WorkerRun>,
    /// How the last pod of this position ended, if it did.
    pub ended: Option<String>,
    workers_this_agent_run: u32,
}

/// A running worker.
#[derive(Clone, Copy, Debug)]
pub struct WorkerRun {
    /// Its pod's epoch annotation when it started.
    pub epoch: Option<Epoch>,
    pub started: Instant,
}

/// A consistent view for assertions.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub slots: Vec<SlotView>,
    pub deprecated: Option<Epoch>,
    pub synced: Option<Epoch>,
    /// Reason of the JobSet's `Failed` condition, when it has one.
    pub failed: Option<String>,
    /// `status.restarts` (absent is 0).
    pub restarts: i64,
    /// `status.restartsCountTowardsMax` (absent is 0).
    pub restarts_count_towards_max: i64,
    pub violations: Vec<String>,
}

/// One pod position in a [`Snapshot`].
#[derive(Clone, Debug)]
pub struct SlotView {
    pub state: SlotState,
    /// The current pod's epoch annotation.
    pub epoch: Option<Epoch>,
    pub phase: String,
    /// The largest `restartCount` of the current pod's container statuses.
    pub restart_count: i64,
}

impl Snapshot {
    /// Every position has a running worker, started at the synced epoch.
    pub fn all_running(&self) -> bool {
        self.synced.is_some()
            && !self.slots.is_empty()
            && self
                .slots
                .iter()
                .all(|s| s.state.worker.is_some_and(|w| w.epoch == self.synced))
    }

    /// [`Snapshot::all_running`] at an epoch above `epoch`.
    pub fn all_running_after(&self, epoch: Option<Epoch>) -> bool {
        self.all_running() && self.synced > epoch
    }

    pub fn uids(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.state.uid.clone()).collect()
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "jobset: deprecated {:?}, synced {:?}, failed {:?}, restarts {} ({} counted); {} violation(s)",
            self.deprecated,
            self.synced,
            self.failed,
            self.restarts,
            self.restarts_count_towards_max,
            self.violations.len()
        )?;
        for (i, s) in self.slots.iter().enumerate() {
            writeln!(
                f,
                "  [{i}] {} {} epoch {:?} restartCount {} | restarts {} replacements {} agent runs {} worker runs {} worker {:?} ended {:?}",
                s.state.pod,
                s.phase,
                s.epoch,
                s.restart_count,
                s.state.restarts,
                s.state.replacements,
                s.state.agent_runs,
                s.state.worker_runs,
                s.state.worker.map(|w| w.epoch),
                s.state.ended
            )?;
        }
        for v in self.violations.iter().take(5) {
            writeln!(f, "  violation: {v}")?;
        }
        Ok(())
    }
}

struct State {
    slots: Vec<SlotState>,
    cmds: Vec<Option<mpsc::UnboundedSender<PodCmd>>>,
    violations: Vec<String>,
    /// Per Job ([`Ctx::jobs`]), the Job object its pods are created under.
    job_owners: Vec<Option<manifest::JobOwner>>,
    /// Pods whose kubelet task runs, with the UID of their Job.
    live_pods: std::collections::HashMap<String, String>,
    /// Live pods whose kubelet was told that the API deleted them.
    deletion_seen: HashSet<String>,
    /// Pods whose agents cannot reach the API ([`Simulation::cut_agent_api`]).
    api_cut: HashSet<String>,
    /// Per position, how many of its next pods are cut from the API.
    api_cut_next: Vec<u32>,
}

/// Shared by the simulation's tasks.
pub(crate) struct Ctx {
    config: SimConfig,
    server: Arc<TestApiServer>,
    /// The kubelet's and controllers' client: exempt from the test API server's chaos mode
    /// ([`crate::apiserver::chaos`]), as they play the environment, not the system
    /// under test.
    client: kube::Client,
    /// The shared client of in-process agents.
    agent_client: kube::Client,
    slots: Vec<manifest::Slot>,
    /// The JobSet's Jobs, each with its pod positions.
    jobs: Vec<manifest::JobPosition>,
    /// Where agents cut from the API are pointed: a listener that closes every connection.
    black_hole: (String, kube::Client),
    state: Mutex<State>,
    log: Mutex<VecDeque<String>>,
    stop_tx: watch::Sender<bool>,
    ended_tx: mpsc::UnboundedSender<(PodInfo, PodEnd)>,
    tasks: Mutex<Vec<AbortHandle>>,
    generation: AtomicU32,
    started: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pod_resource() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&())
}

fn jobset_resource() -> ApiResource {
    ApiResource::erase::<JobSet>(&())
}

fn job_resource() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&())
}

/// The finalizer of a foreground deletion, as a JSON value.
fn jobset_inplace_foreground() -> Value {
    Value::String(crate::apiserver::store::FOREGROUND_FINALIZER.to_owned())
}

impl Ctx {
    pub(crate) fn log(&self, line: String) {
        let mut log = lock(&self.log);
        if log.len() >= self.config.log_capacity.max(1) {
            log.pop_front();
        }
        let ms = self.started.elapsed().as_millis();
        log.push_back(format!("{ms:>6}ms {line}"));
    }

    pub(crate) fn log_sink(self: &Arc<Self>) -> agents::LogSink {
        let weak = Arc::downgrade(self);
        Arc::new(move |line| {
            if let Some(ctx) = weak.upgrade() {
                ctx.log(line);
            }
        })
    }

    pub(crate) fn stop_rx(&self) -> watch::Receiver<bool> {
        self.stop_tx.subscribe()
    }

    /// One status write (merge patch of the status subresource), retried twice; see
    /// [`status::StatusWriter`] for how pods use it.
    async fn write_status(&self, pod: &str, status: Value) {
        // The answer is read as a `WatchedPod`, which skips the spec: a kubelet writes thousands
        // of statuses here and has no use for the pod it gets back.
        let api: Api<jobset_inplace::wire::WatchedPod> =
            Api::namespaced(self.client.clone(), &self.config.namespace);
        let patch = Patch::Merge(json!({ "status": status }));
        for attempt in 0..3 {
            match api.patch_status(pod, &PatchParams::default(), &patch).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) if attempt == 2 => {
                    self.log(format!("{pod}: cannot write the pod status: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn with_slot(&self, slot: usize, f: impl FnOnce(&mut SlotState)) {
        if let Some(s) = lock(&self.state).slots.get_mut(slot) {
            f(s);
        }
    }

    pub(crate) fn agent_started(&self, slot: usize) {
        self.with_slot(slot, |s| {
            s.agent_runs += 1;
            s.workers_this_agent_run = 0;
        });
    }

    pub(crate) fn restarted(&self, slot: usize) {
        self.with_slot(slot, |s| s.restarts += 1);
    }

    /// A worker starts: its pod's epoch now is what it must never run ahead of.
    pub(crate) fn worker_started(&self, slot: usize, pod: &str) {
        let epoch = self
            .server
            .get_shared("pods", &self.config.namespace, pod)
            .and_then(|p| self.epoch_of(&p.value));
        self.with_slot(slot, |s| {
            s.worker_runs += 1;
            s.workers_this_agent_run += 1;
            if s.workers_this_agent_run > 1 {
                s.lone_worker_restarts += 1;
            }
            s.worker = Some(WorkerRun {
                epoch,
                started: Instant::now(),
            });
        });
        self.log(format!("{pod}: worker started at epoch {epoch:?}"));
        if self.config.check_invariant {
            self.check_invariant();
        }
    }

    pub(crate) fn worker_stopped(&self, slot: usize) {
        self.with_slot(slot, |s| s.worker = None);
    }

    fn epoch_of(&self, pod: &Value) -> Option<Epoch> {
        let raw = pod
            .pointer("/metadata/annotations")?
            .get(self.config.dialect.pod_annotation())?
            .as_str()?;
        jobset_inplace::protocol::parse_epoch(raw).ok()
    }

    /// The pods of the JobSet that count: not failed, not terminating.
    fn counted_pods(&self) -> Vec<Value> {
        self.server
            .list("pods", Some(&self.config.namespace))
            .into_iter()
            .filter(|p| {
                p.pointer("/metadata/labels")
                    .and_then(|l| l.get(JOBSET_NAME_LABEL))
                    .and_then(Value::as_str)
                    == Some(self.config.jobset_name.as_str())
                    && p.pointer("/status/phase").and_then(Value::as_str) != Some("Failed")
                    && p.pointer("/metadata/deletionTimestamp").is_none()
            })
            .collect()
    }

    /// The invariant: no worker runs while a registered pod is at an older epoch than the one
    /// the worker's pod had when it started.
    pub(crate) fn check_invariant(&self) {
        // Workers first, pods second: epochs only grow, so a later read of the pods can only
        // make a violation disappear, never invent one.
        let running: Vec<(String, Option<Epoch>)> = lock(&self.state)
            .slots
            .iter()
            .filter_map(|s| s.worker.map(|w| (s.pod.clone(), w.epoch)))
            .collect();
        if running.is_empty() {
            return;
        }
        let pods = self.counted_pods();
        let oldest = pods
            .iter()
            .filter_map(|p| {
                let epoch = self.epoch_of(p)?;
                let name = p.pointer("/metadata/name")?.as_str()?.to_owned();
                Some((epoch, name))
            })
            .min();
        let mut found = Vec::new();
        for (pod, epoch) in running {
            match (epoch, &oldest) {
                (None, _) => found.push(format!("the worker of {pod} started on an unregistered pod")),
                (Some(e), Some((older, other))) if *older < e => found.push(format!(
                    "the worker of {pod} (started at epoch {e}) runs while {other} is at epoch {older}"
                )),
                _ => {}
            }
        }
        if !found.is_empty() {
            let mut state = lock(&self.state);
            for v in found {
                if state.violations.len() < 100 && !state.violations.contains(&v) {
                    state.violations.push(v);
                }
            }
        }
    }

    fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(fut);
        lock(&self.tasks).push(handle.abort_handle());
    }

    /// The Job controller creates the pod of a position (a first pod or a replacement) and the
    /// kubelet starts it.
    async fn create_pod(self: &Arc<Self>, slot: usize) -> Result<(), SimError> {
        let Some(position) = self.slots.get(slot) else {
            return Err(SimError::Setup(format!("no pod position {slot}")));
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "{}-{}-{}-{}-{generation:05}",
            self.config.jobset_name,
            position.replicated_job,
            position.job_index,
            position.completion_index
        );
        let j = self
            .jobs
            .iter()
            .position(|j| j.slots.contains(&slot))
            .ok_or_else(|| SimError::Setup(format!("no Job runs position {slot}")))?;
        let owner = lock(&self.state)
            .job_owners
            .get(j)
            .cloned()
            .flatten()
            .ok_or_else(|| SimError::Setup(format!("the Job of position {slot} is not created")))?;
        let object = manifest::pod_object(&self.config, position, &name, &owner);
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.config.namespace, &pod_resource());
        let obj: DynamicObject = serde_json::from_value(object)
            .map_err(|e| SimError::Setup(format!("pod {name}: {e}")))?;
        let created = api
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|e| SimError::Setup(format!("cannot create pod {name}: {e}")))?;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        let spec = created.data.get("spec").cloned().unwrap_or(Value::Null);
        let port = match &self.config.agents {
            AgentRunner::Binary(_) => Some(
                agents::barrier_port()
                    .ok_or_else(|| SimError::Setup("no free loopback port".into()))?,
            ),
            _ => None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut state = lock(&self.state);
            if let Some(s) = state.slots.get_mut(slot) {
                if !s.pod.is_empty() {
                    s.replacements += 1;
                }
                s.pod = name.clone();
                s.uid = uid;
                s.ended = None;
                s.worker = None;
            }
            if let Some(c) = state.cmds.get_mut(slot) {
                *c = Some(tx);
            }
            state.live_pods.insert(name.clone(), owner.uid.clone());
            if let Some(n) = state.api_cut_next.get_mut(slot)
                && *n > 0
            {
                *n -= 1;
                state.api_cut.insert(name.clone());
            }
        }
        self.log(format!("{name}: created for position {slot}"));
        let info = PodInfo {
            slot,
            name,
            spec,
            port,
        };
        self.spawn(pod::run(self.clone(), info, rx));
        Ok(())
    }

    pub(crate) fn pod_ended(&self, pod: &PodInfo, end: PodEnd) {
        self.log(format!("{}: ended: {end:?}", pod.name));
        self.with_slot(pod.slot, |s| {
            s.worker = None;
            s.ended = Some(format!("{end:?}"));
        });
        {
            let mut state = lock(&self.state);
            state.live_pods.remove(&pod.name);
            state.deletion_seen.remove(&pod.name);
            state.api_cut.remove(&pod.name);
        }
        let _ = self.ended_tx.send((pod.clone(), end));
    }

    /// The agent of this pod cannot reach the API.
    pub(crate) fn api_cut(&self, pod: &str) -> bool {
        lock(&self.state).api_cut.contains(pod)
    }

    /// The Job of a position, when it lives (exists, not being deleted): its owner record.
    fn live_job_of(&self, slot: usize) -> Option<manifest::JobOwner> {
        let j = self.jobs.iter().position(|j| j.slots.contains(&slot))?;
        let owner = lock(&self.state).job_owners.get(j).cloned().flatten()?;
        let job = self
            .server
            .get_shared("jobs", &self.config.namespace, &owner.name)?;
        let same = job.value.pointer("/metadata/uid").and_then(Value::as_str) == Some(&owner.uid);
        let deleting = job.value.pointer("/metadata/deletionTimestamp").is_some();
        (same && !deleting).then_some(owner)
    }

    /// The JobSet controller creates Job `j` at the JobSet's `status.restarts`, and the Job
    /// controller its pods.
    async fn create_job(self: &Arc<Self>, j: usize) -> Result<(), SimError> {
        let Some(job) = self.jobs.get(j) else {
            return Err(SimError::Setup(format!("no Job {j}")));
        };
        let js = self
            .server
            .get("jobsets", &self.config.namespace, &self.config.jobset_name)
            .ok_or_else(|| SimError::Setup("the JobSet is gone".into()))?;
        let uid = js
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let restarts = js
            .pointer("/status/restarts")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let object = manifest::job_object(&self.config, job, &uid, restarts);
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.config.namespace, &job_resource());
        let obj: DynamicObject =
            serde_json::from_value(object).map_err(|e| SimError::Setup(format!("Job {j}: {e}")))?;
        let created = api
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|e| SimError::Setup(format!("cannot create Job {j}: {e}")))?;
        let owner = manifest::JobOwner {
            name: created.metadata.name.clone().unwrap_or_default(),
            uid: created.metadata.uid.clone().unwrap_or_default(),
            restarts,
        };
        self.log(format!("{}: Job created at restart {restarts}", owner.name));
        if let Some(o) = lock(&self.state).job_owners.get_mut(j) {
            *o = Some(owner);
        }
        for slot in job.slots.clone() {
            self.create_pod(slot).await?;
        }
        Ok(())
    }

    /// The Job controller's accounting: the job-tracking finalizer goes from every pod that has
    /// ended (phase `Failed` or `Succeeded`) or whose Job is being deleted or gone. A pod being
    /// deleted that has not ended keeps it (podReplacementPolicy: Failed).
    async fn release_counted_pods(&self) {
        let ns = &self.config.namespace;
        let pods_api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &pod_resource());
        for p in self.server.list_shared("pods", Some(ns)) {
            let p = &p.value;
            let finalizers: Vec<Value> = p
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !finalizers
                .iter()
                .any(|f| f == manifest::JOB_TRACKING_FINALIZER)
            {
                continue;
            }
            let ended = matches!(
                p.pointer("/status/phase").and_then(Value::as_str),
                Some("Failed" | "Succeeded")
            );
            let job_going = p
                .pointer("/metadata/ownerReferences/0/name")
                .and_then(Value::as_str)
                .is_none_or(|job| {
                    self.server
                        .get_shared("jobs", ns, job)
                        .is_none_or(|j| j.value.pointer("/metadata/deletionTimestamp").is_some())
                });
            if !(ended || job_going) {
                continue;
            }
            let Some(name) = p.pointer("/metadata/name").and_then(Value::as_str) else {
                continue;
            };
            let rest: Vec<Value> = finalizers
                .into_iter()
                .filter(|f| f != manifest::JOB_TRACKING_FINALIZER)
                .collect();
            let patch = Patch::Merge(json!({"metadata": {"finalizers": rest}}));
            match pods_api.patch(name, &PatchParams::default(), &patch).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => self.log(format!("job controller: cannot release {name}: {e}")),
            }
        }
    }

    /// One pass of the JobSet controller, the garbage collector and the kubelets' view of
    /// deletions (see the module header).
    async fn sync_jobs(self: &Arc<Self>) {
        let ns = self.config.namespace.clone();
        let restarts = self
            .server
            .get("jobsets", &ns, &self.config.jobset_name)
            .and_then(|js| js.pointer("/status/restarts").and_then(Value::as_i64))
            .unwrap_or(0);
        // The Job controller: a pod that ended (Failed or Succeeded), or whose Job is being
        // deleted or gone, is counted and loses its job-tracking finalizer.
        self.release_counted_pods().await;
        // Kubelets: a live pod deleted (gone, or being deleted) or marked Failed through the API
        // is stopped.
        let told: Vec<(usize, String)> = {
            let mut state = lock(&self.state);
            let deleted: Vec<String> = state
                .live_pods
                .keys()
                .filter(|p| !state.deletion_seen.contains(*p))
                .filter(|p| {
                    self.server.get_shared("pods", &ns, p).is_none_or(|e| {
                        e.value.pointer("/metadata/deletionTimestamp").is_some()
                            || e.value.pointer("/status/phase").and_then(Value::as_str)
                                == Some("Failed")
                    })
                })
                .cloned()
                .collect();
            let mut told = Vec::new();
            for pod in deleted {
                let slot = state.slots.iter().position(|s| s.pod == pod);
                if let Some(slot) = slot
                    && let Some(Some(tx)) = state.cmds.get(slot)
                    && tx.send(PodCmd::Deleted).is_ok()
                {
                    told.push((slot, pod.clone()));
                }
                state.deletion_seen.insert(pod);
            }
            told
        };
        for (slot, pod) in told {
            self.log(format!(
                "{pod}: deleted through the API; its kubelet stops it [{slot}]"
            ));
        }
        let jobs_api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &job_resource());
        let pods_api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &pod_resource());
        // The live pods by the UID of their Job, once per pass (thousands of Jobs).
        let live_by_job: std::collections::HashMap<String, Vec<String>> = {
            let mut m: std::collections::HashMap<String, Vec<String>> =
                std::collections::HashMap::new();
            for (pod, uid) in &lock(&self.state).live_pods {
                m.entry(uid.clone()).or_default().push(pod.clone());
            }
            m
        };
        for (j, job) in self.jobs.iter().enumerate() {
            let name = job.name(&self.config.jobset_name);
            let owner = lock(&self.state).job_owners.get(j).cloned().flatten();
            let object = self
                .server
                .get_shared("jobs", &ns, &name)
                .map(|e| e.value.clone());
            let uid = object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/uid").and_then(Value::as_str))
                .map(str::to_owned);
            // The pods of the Job this simulation last created under that name, still running.
            let live_of =
                |uid: &str| -> Vec<String> { live_by_job.get(uid).cloned().unwrap_or_default() };
            match object {
                Some(o) if o.pointer("/metadata/deletionTimestamp").is_some() => {
                    // The garbage collector: dependents first, then the finalizer.
                    let uid = uid.unwrap_or_default();
                    // Every dependent, until it is gone (blockOwnerDeletion).
                    let in_api: Vec<Value> = self
                        .server
                        .list("pods", Some(&ns))
                        .into_iter()
                        .filter(|p| {
                            p.pointer("/metadata/ownerReferences")
                                .and_then(Value::as_array)
                                .is_some_and(|r| r.iter().any(|r| r["uid"] == uid.as_str()))
                        })
                        .collect();
                    for p in &in_api {
                        if p.pointer("/metadata/deletionTimestamp").is_some() {
                            continue;
                        }
                        let Some(pod) = p.pointer("/metadata/name").and_then(Value::as_str) else {
                            continue;
                        };
                        match pods_api.delete(pod, &DeleteParams::default()).await {
                            Ok(_) | Err(kube::Error::Api(_)) => {}
                            Err(e) => self.log(format!("gc: cannot delete {pod}: {e}")),
                        }
                    }
                    if in_api.is_empty() && live_of(&uid).is_empty() {
                        let finalizers: Vec<Value> = o
                            .pointer("/metadata/finalizers")
                            .and_then(Value::as_array)
                            .map(|f| {
                                f.iter()
                                    .filter(|f| **f != jobset_inplace_foreground())
                                    .cloned()
                                    .collect()
                            })
                            .unwrap_or_default();
                        let patch = Patch::Merge(json!({"metadata": {"finalizers": finalizers}}));
                        if let Err(e) = jobs_api.patch(&name, &PatchParams::default(), &patch).await
                        {
                            self.log(format!("gc: cannot finalize {name}: {e}"));
                        } else {
                            self.log(format!("{name}: its pods gone; Job deleted"));
                        }
                    }
                }
                Some(o) => {
                    // The JobSet controller: a Job of an earlier restart goes (foreground).
                    let attempt = o
                        .pointer("/metadata/labels")
                        .and_then(|l| l.get(jobset_inplace::deadline::RESTART_ATTEMPT_LABEL))
                        .and_then(Value::as_str)
                        .and_then(|a| a.parse::<i64>().ok());
                    if attempt.is_none_or(|a| a < restarts) {
                        let params = DeleteParams {
                            propagation_policy: Some(kube::api::PropagationPolicy::Foreground),
                            ..DeleteParams::default()
                        };
                        match jobs_api.delete(&name, &params).await {
                            Ok(_) => self.log(format!(
                                "{name}: restart-attempt {attempt:?} below status.restarts {restarts}: deleted"
                            )),
                            Err(e) => self.log(format!("cannot delete {name}: {e}")),
                        }
                    }
                }
                None => {
                    // Gone: once the pods of the old one stopped (background deletion's garbage
                    // collection), the JobSet controller creates it again.
                    let old = owner.map(|o| o.uid).unwrap_or_default();
                    let running = live_of(&old);
                    for pod in &running {
                        let _ = pods_api.delete(pod, &DeleteParams::default()).await;
                    }
                    if running.is_empty()
                        && let Err(e) = self.create_job(j).await
                    {
                        self.log(format!("cannot create Job {name} again: {e}"));
                    }
                }
            }
        }
    }

    /// The JobSet controller's reaction to a Job failed by its pod failure policy: a
    /// `FailJobSet` rule on `PodFailurePolicy` fails the JobSet.
    async fn fail_jobset(&self, reason: &str, message: &str) {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.config.namespace,
            &jobset_resource(),
        );
        let patch = Patch::Merge(json!({"status": {
            "conditions": [{"type": "Failed", "status": "True", "reason": reason, "message": message,
                            "lastTransitionTime": "2025-01-01T00:00:00Z"}],
            "terminalState": "Failed"
        }}));
        if let Err(e) = api
            .patch_status(&self.config.jobset_name, &PatchParams::default(), &patch)
            .await
        {
            self.log(format!("cannot fail the JobSet: {e}"));
        }
    }

    fn jobset_failed(&self) -> Option<String> {
        let js: JobSet = self
            .server
            .get_as(&self.config.namespace, &self.config.jobset_name)?;
        js.conditions()
            .iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .map(|c| c.reason.clone().unwrap_or_default())
    }

    fn stop_all(&self, why: &str) {
        if !*self.stop_tx.borrow() {
            self.log(format!("stopping every pod: {why}"));
            let _ = self.stop_tx.send(true);
        }
    }
}

/// The Job and JobSet controllers: replacement pods, pod failure policies, and the end of the
/// JobSet.
async fn controllers(ctx: Arc<Ctx>, mut ended: mpsc::UnboundedReceiver<(PodInfo, PodEnd)>) {
    // Each pass reads every pod: past a thousand, a slower pace keeps the simulation's own cost
    // below the protocol's.
    let period = if ctx.slots.len() > 1024 { 100 } else { 20 };
    let mut poll = tokio::time::interval(Duration::from_millis(period));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writers = writers::Writers::default();
    loop {
        tokio::select! {
            msg = ended.recv() => {
                let Some((pod, end)) = msg else { return };
                if *ctx.stop_tx.borrow() {
                    continue;
                }
                // The Job controller replaces a pod of a Job that lives, once (the position has
                // no newer pod).
                let current = lock(&ctx.state).slots.get(pod.slot).is_some_and(|s| s.pod == pod.name);
                if end == PodEnd::Deleted {
                    if current && ctx.live_job_of(pod.slot).is_some()
                        && let Err(e) = ctx.create_pod(pod.slot).await
                    {
                        ctx.log(format!("cannot replace {}: {e}", pod.name));
                    }
                    continue;
                }
                let PodEnd::Failed { container, code, .. } = end else { continue };
                let fail_job = ctx.config.fail_job_exit_code.is_some()
                    && code == ctx.config.fail_job_exit_code
                    && container.as_deref() == Some(manifest::WORKER_CONTAINER);
                if fail_job {
                    let message = format!(
                        "job of pod {} failed by its podFailurePolicy (container {} exited {:?}); FailJobSet rule",
                        pod.name, manifest::WORKER_CONTAINER, code
                    );
                    ctx.log(message.clone());
                    ctx.fail_jobset("FailJobSetAction", &message).await;
                    ctx.stop_all("the JobSet failed");
                    continue;
                }
                // podReplacementPolicy: Failed: the replacement comes once the pod has failed.
                if current && ctx.live_job_of(pod.slot).is_some()
                    && let Err(e) = ctx.create_pod(pod.slot).await
                {
                    ctx.log(format!("cannot replace {}: {e}", pod.name));
                }
            }
            _ = poll.tick() => {
                if *ctx.stop_tx.borrow() {
                    continue;
                }
                if let Some(reason) = ctx.jobset_failed() {
                    ctx.stop_all(&format!("the JobSet failed ({reason})"));
                    continue;
                }
                ctx.sync_jobs().await;
                if ctx.config.status_writers {
                    ctx.write_job_statuses(&mut writers).await;
                }
            }
        }
    }
}

/// JobSet's controller's status writes ([`writers`]), at its own pace.
async fn jobset_status_writer(ctx: Arc<Ctx>) {
    let mut writers = writers::Writers::default();
    let mut pace = tokio::time::interval(writers::JOBSET_PACE);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        pace.tick().await;
        if *ctx.stop_tx.borrow() {
            return;
        }
        ctx.write_jobset_status(&mut writers).await;
    }
}

/// The in-process reconciler: its stop signal and task.
type RunningReconciler = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), reconciler::Error>>,
);

/// A running simulation. Dropping it stops every task and kills every child process.
pub struct Simulation {
    ctx: Arc<Ctx>,
    reconciler: Option<RunningReconciler>,
}

impl Simulation {
    /// Starts a test API server, the reconciler, the JobSet (injected) and its pods.
    pub async fn start(config: SimConfig) -> Result<Simulation, SimError> {
        let server = Arc::new(TestApiServer::start().await);
        Self::start_on(server, config).await
    }

    /// As [`Simulation::start`], on an existing server.
    pub async fn start_on(
        server: Arc<TestApiServer>,
        config: SimConfig,
    ) -> Result<Simulation, SimError> {
        let jobset = manifest::mutated_jobset(&config)?;
        let slots = manifest::slots(&jobset);
        let jobs = manifest::jobs(&jobset);
        let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SimError::Setup(format!("cannot bind a loopback port: {e}")))?;
        let black_hole_url = format!(
            "http://{}",
            black_hole
                .local_addr()
                .map_err(|e| SimError::Setup(e.to_string()))?
        );
        let black_hole_client = {
            let url = black_hole_url
                .parse()
                .map_err(|e| SimError::Setup(format!("{black_hole_url}: {e}")))?;
            kube::Client::try_from(kube::Config::new(url))
                .map_err(|e| SimError::Setup(format!("a client for {black_hole_url}: {e}")))?
        };
        let (stop_tx, _) = watch::channel(false);
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        let n = slots.len();
        let ctx = Arc::new(Ctx {
            client: if config.in_memory {
                server.in_memory_client(&[(crate::apiserver::EXEMPT_HEADER, "true")])
            } else {
                server.exempt_client()
            },
            agent_client: if config.in_memory {
                server.in_memory_client(&[])
            } else {
                server.client()
            },
            server: server.clone(),
            slots,
            state: Mutex::new(State {
                slots: vec![SlotState::default(); n],
                cmds: vec![None; n],
                violations: Vec::new(),
                job_owners: vec![None; jobs.len()],
                live_pods: std::collections::HashMap::new(),
                deletion_seen: HashSet::new(),
                api_cut: HashSet::new(),
                api_cut_next: vec![0; n],
            }),
            jobs,
            black_hole: (black_hole_url, black_hole_client),
            log: Mutex::new(VecDeque::new()),
            stop_tx,
            ended_tx,
            tasks: Mutex::new(Vec::new()),
            generation: AtomicU32::new(0),
            started: Instant::now(),
            config,
        });
        let mut sim = Simulation {
            ctx: ctx.clone(),
            reconciler: None,
        };
        if ctx.config.run_reconciler {
            let (stop, stopped) = oneshot::channel::<()>();
            let mut options = crate::reconciler::options(ctx.config.dialect, "sim");
            options.settings.namespace = Some(ctx.config.namespace.clone());
            options.settings.debounce = ctx.config.reconciler_debounce;
            options.settings.group_restart_timeout = ctx.config.group_restart_timeout;
            let task = tokio::spawn(reconciler::run(server.client(), options, None, async {
                let _ = stopped.await;
            }));
            sim.reconciler = Some((stop, task));
        }
        server
            .create("jobsets", jobset)
            .map_err(|e| SimError::Setup(format!("cannot create the JobSet: {e}")))?;
        // Agents cut from the API reach this: every connection is closed at once.
        ctx.spawn(async move {
            while let Ok((stream, _)) = black_hole.accept().await {
                drop(stream);
            }
        });
        if let (true, Some(period)) = (ctx.config.check_invariant, ctx.config.check_interval) {
            let checker = ctx.clone();
            ctx.spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    checker.check_invariant();
                }
            });
        }
        for j in 0..ctx.jobs.len() {
            ctx.create_job(j).await?;
        }
        ctx.spawn(controllers(ctx.clone(), ended_rx));
        if ctx.config.status_writers {
            ctx.spawn(jobset_status_writer(ctx.clone()));
        }
        Ok(sim)
    }

    pub fn server(&self) -> &TestApiServer {
        &self.ctx.server
    }

    /// The server, shared (for tasks that outlive a borrow of the simulation).
    pub fn server_arc(&self) -> Arc<TestApiServer> {
        self.ctx.server.clone()
    }

    pub fn config(&self) -> &SimConfig {
        &self.ctx.config
    }

    /// Number of pod positions.
    pub fn len(&self) -> usize {
        self.ctx.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ctx.slots.is_empty()
    }

    /// The state of every position and of the JobSet now.
    pub fn snapshot(&self) -> Snapshot {
        let ctx = &self.ctx;
        let (slots, violations) = {
            let state = lock(&ctx.state);
            (state.slots.clone(), state.violations.clone())
        };
        let pods = ctx.server.list_shared("pods", Some(&ctx.config.namespace));
        // By name, once: a linear search per position made a snapshot of 1,024 pods cost a
        // million lookups, more than the protocol it observes.
        let by_name: std::collections::HashMap<&str, &Value> = pods
            .iter()
            .filter_map(|e| Some((e.value.get("metadata")?.get("name")?.as_str()?, &e.value)))
            .collect();
        let find = |name: &str| by_name.get(name).copied();
        let views = slots
            .into_iter()
            .map(|state| {
                let pod = find(&state.pod);
                let restart_count = pod
                    .and_then(|p| p.pointer("/status"))
                    .map(|s| {
                        ["initContainerStatuses", "containerStatuses"]
                            .iter()
                            .filter_map(|k| s.get(*k).and_then(Value::as_array))
                            .flatten()
                            .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
                            .max()
                            .unwrap_or(0)
                    })
                    .unwrap_or(0);
                SlotView {
                    epoch: pod.and_then(|p| ctx.epoch_of(p)),
                    phase: pod
                        .and_then(|p| p.pointer("/status/phase"))
                        .and_then(Value::as_str)
                        .unwrap_or("Absent")
                        .to_owned(),
                    restart_count,
                    state,
                }
            })
            .collect();
        let js: Option<JobSetSummary> = ctx
            .server
            .get_as(&ctx.config.namespace, &ctx.config.jobset_name);
        let status = js
            .as_ref()
            .map(|j| j.epoch_status(ctx.config.dialect))
            .unwrap_or_default();
        let raw = ctx
            .server
            .get("jobsets", &ctx.config.namespace, &ctx.config.jobset_name);
        let count = |field: &str| {
            raw.as_ref()
                .and_then(|js| js["status"][field].as_i64())
                .unwrap_or(0)
        };
        Snapshot {
            slots: views,
            deprecated: status.deprecated,
            synced: status.synced,
            failed: ctx.jobset_failed(),
            restarts: count("restarts"),
            restarts_count_towards_max: count("restartsCountTowardsMax"),
            violations,
        }
    }

    /// Polls (every 5 ms; 50 ms past 64 pods, 250 ms past 1,024) until `done` holds.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Snapshot) -> bool,
    ) -> Result<Snapshot, SimError> {
        let deadline = Instant::now() + limit;
        loop {
            let snapshot = self.snapshot();
            if done(&snapshot) {
                return Ok(snapshot);
            }
            if Instant::now() >= deadline {
                return Err(SimError::Timeout {
                    what: what.to_owned(),
                    after: limit,
                    state: format!("{snapshot}last log lines:\n{}", self.logs(40).join("\n")),
                });
            }
            // A snapshot lists every pod: at thousands of pods, polling often would cost the
            // simulation more than the protocol it observes (timings come from the workers'
            // start times, not from when the poll saw them).
            let period = match self.len() {
                0..=64 => 5,
                65..=1024 => 50,
                1025..=4096 => 250,
                // At 10,000 pods a snapshot is a tenth of the simulation's CPU at 4 a second.
                _ => 1000,
            };
            tokio::time::sleep(Duration::from_millis(period)).await;
        }
    }

    /// Until every position runs its worker at the synced epoch.
    pub async fn wait_all_running(&self, limit: Duration) -> Result<Snapshot, SimError> {
        self.wait_for("every worker running at the synced epoch", limit, |s| {
            s.all_running()
        })
        .await
    }

    fn send(&self, slot: usize, cmd: PodCmd) -> bool {
        let state = lock(&self.ctx.state);
        match state.cmds.get(slot).and_then(Option::as_ref) {
            Some(tx) => tx.send(cmd).is_ok(),
            None => false,
        }
    }

    /// The worker of a position exits with `code`.
    pub fn fail_worker(&self, slot: usize, code: i32) -> bool {
        self.ctx.log(format!("test: worker [{slot}] exits {code}"));
        self.send(slot, PodCmd::WorkerExit(code))
    }

    /// SIGKILL to the agent of a position, nothing else.
    pub fn kill_agent(&self, slot: usize) -> bool {
        self.send(slot, PodCmd::KillAgent)
    }

    /// The node of a position is lost: its pod fails and is replaced.
    pub fn fail_node(&self, slot: usize) -> bool {
        self.ctx.log(format!("test: node of [{slot}] lost"));
        self.send(slot, PodCmd::FailNode)
    }

    /// The kubelet of a position's node dies: nothing runs there any more (agent and worker
    /// gone, nothing restarted) and nothing updates the pod, which stays `Running` in the API
    /// with its epoch, until it is deleted through the API; then its Job replaces it.
    pub fn kill_kubelet(&self, slot: usize) -> bool {
        self.ctx.log(format!("test: kubelet of [{slot}] dead"));
        self.send(slot, PodCmd::KubeletDies)
    }

    /// The agent of a position's current pod (from its next start) and those of the next
    /// `pods - 1` pods of the position cannot reach the API: they never register.
    pub fn cut_agent_api(&self, slot: usize, pods: u32) {
        self.ctx.log(format!(
            "test: agents of [{slot}] cut from the API ({pods} pods)"
        ));
        let mut state = lock(&self.ctx.state);
        let current = state.slots.get(slot).map(|s| s.pod.clone());
        if let (Some(pod), true) = (current, pods > 0) {
            state.api_cut.insert(pod);
        }
        if let Some(n) = state.api_cut_next.get_mut(slot) {
            *n = pods.saturating_sub(1);
        }
    }

    /// The JobSet's Jobs in the API now: (name, UID, `restart-attempt` label), by name.
    pub fn jobs(&self) -> Vec<(String, String, String)> {
        let mut jobs: Vec<(String, String, String)> = self
            .ctx
            .server
            .list("jobs", Some(&self.ctx.config.namespace))
            .into_iter()
            .map(|j| {
                let meta = &j["metadata"];
                let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (
                    s(&meta["name"]),
                    s(&meta["uid"]),
                    s(&meta["labels"][jobset_inplace::deadline::RESTART_ATTEMPT_LABEL]),
                )
            })
            .collect();
        jobs.sort();
        jobs
    }

    /// The invariant violations seen so far.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.ctx.state).violations.clone()
    }

    /// The last `n` log lines (agents' output and the simulation's own).
    pub fn logs(&self, n: usize) -> Vec<String> {
        let log = lock(&self.ctx.log);
        log.iter()
            .skip(log.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// Stops every pod (agents get SIGTERM), the reconciler and the controllers.
    pub async fn shutdown(mut self) {
        self.ctx.stop_all("shutdown");
        let deadline = Instant::now() + self.ctx.config.termination_grace + Duration::from_secs(2);
        while Instant::now() < deadline
            && lock(&self.ctx.state)
                .slots
                .iter()
                .any(|s| s.ended.is_none() && !s.pod.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some((stop, task)) = self.reconciler.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

impl Drop for Simulation {
    fn drop(&mut self) {
        for task in lock(&self.ctx.tasks).drain(..) {
            task.abort();
        }
        if let Some((_, task)) = self.reconciler.take() {
            task.abort();
        }
        // Agent processes die with their tasks (kill on drop).
    }
}
