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
mod controllers;
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

use controllers::*;

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
    /// The injected startup probe's `timeoutSeconds` (`None`: the webhook's default, 300, which
    /// the agent holds a probe for while its barrier is up; `Some(1)`: no hold, a failed probe a
    /// period).
    pub probe_timeout_seconds: Option<i32>,
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
            probe_timeout_seconds: None,
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

// ---------------------------------------------------------------------------------------------
// The simulation
// ---------------------------------------------------------------------------------------------

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
