//! A node for any API server: a kubelet that registers a `Node`, binds the unscheduled pods of
//! one namespace to itself (as a scheduler would, through `pods/{name}/binding`) and runs the
//! pods bound to it, talking to the API server only through a [`kube::Client`], as a kubelet
//! does. It is what `tests/real_cluster/` runs a group restart with against kube-apiserver and
//! the real Job and JobSet controllers; the simulated kubelet of [`crate::kubelet`] stays the one
//! for the test API server (it reads that server's state directly, checks the protocol's
//! invariant and stands in for the controllers too).
//!
//! A pod runs as a kubelet runs it, for what jobset-inplace needs:
//! - its service account's token bound to the pod (a TokenRequest with `boundObjectRef` of kind
//!   Pod, name and UID, the API server's default audience, as the kubelet's projected volume asks
//!   for it), written with the API server's URL and CA into a kubeconfig of its own
//!   (`KUBECONFIG`: the agent's `kube::Client::try_default` reads it where a pod has the
//!   in-cluster files);
//! - the sidecar agent: the real `jobset-inplace agent` binary as a child process, its env
//!   resolved from the container spec (literal values and downward-API `fieldRef`s, with
//!   `status.podIP` 127.0.0.1). Every pod shares 127.0.0.1, so each agent gets a barrier port of
//!   its own through `BARRIER_PORT` (the only variable set beside the spec's, with `KUBECONFIG`
//!   and the log settings), and the startup probe is polled on that port (for measurements of
//!   many pods, [`NodeAgents::InProcessBound`] runs the agent's code as a task instead, on a
//!   client of its own with the pod-bound token, and [`NodeAgents::InProcess`] on one shared
//!   client without a token of its own);
//! - the worker container is simulated: it starts once the agent's startup probe answers 200
//!   (the barrier) and runs until the test makes it exit ([`Node::exit_worker`]);
//! - every container exit goes through the container's `restartPolicyRules`: a
//!   `RestartAllContainers` rule stops every container (the agent with SIGTERM, then SIGKILL
//!   after 2 s whatever the pod's grace period, as the kubelet's `SyncPod`), shows each
//!   `waiting` `RestartingAllContainers` with `lastState` 137, and starts them all again in the
//!   same pod, restart counts up, the phase `Pending` until the worker runs again and
//!   `Initialized` kept True; a
//!   sidecar exit without a rule restarts the sidecar alone (`restartPolicy: Always`); a worker
//!   exit without a rule ends the pod (`restartPolicy: Never`);
//! - the pod status is written through `pods/{name}/status` as the kubelet writes it (tried
//!   again until written, a few calls in flight for the node: [`NodeConfig::calls_in_flight`]):
//!   phase,
//!   the conditions (`PodReadyToStartContainers`, `Initialized`, `ContainersReady`, `Ready`,
//!   `PodScheduled`, and `AllContainersRestarting`, which a 1.35 kubelet with the feature gate
//!   always reports), `initContainerStatuses` for the sidecar and `containerStatuses` with their
//!   state, `lastState`, `started`, `ready` and `restartCount`, `podIP`/`hostIP` 127.0.0.1;
//! - a pod deleted through the API has its containers stopped, its terminal status written, and
//!   is then deleted for good (grace period 0, its UID as a precondition), as a kubelet does.
//!
//! No heartbeat: the `Node`'s `Ready` condition is written once. That is enough where no
//! node-lifecycle controller runs (`scripts/control-plane.sh` runs none); under one, the node
//! would be tainted unreachable after its grace period.
//!
//! Every API call has a timeout; the loops log failures and go on (or end the pod with a
//! message) instead of panicking. [`Node::stop`] kills every agent and deletes the `Node`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::kubelet::agents::{AgentRun, LogSink, barrier_port};
use crate::kubelet::manifest::resolve_env;
use crate::kubelet::recognise::{self, rule_action};
use jobset_inplace::wire::agent_env;

mod events;
mod pod_state;
mod run;

use pod_state::*;
use run::*;

/// The address of every pod and of the node.
const LOOPBACK: &str = "127.0.0.1";
/// The `reason` of a container the kubelet stopped for a `RestartAllContainers` rule.
const RESTARTING_ALL_CONTAINERS: &str = "RestartingAllContainers";

/// How the node runs agent containers.
#[derive(Clone)]
pub enum NodeAgents {
    /// The `jobset-inplace` binary, one child process per pod, with a token bound to its pod.
    Binary(PathBuf),
    /// [`jobset_inplace::agent::run_agent`] as a task of this process per pod, on the one client
    /// given (no token of its own: for measurements of many pods, not for rights), configured
    /// from the container's env by the agent's own parser; the barrier read from its state.
    InProcess(kube::Client),
    /// [`jobset_inplace::agent::run_agent`] as a task of this process per pod, each on a client
    /// of its own with the token bound to its pod (as [`NodeAgents::Binary`] gets): the API
    /// server authenticates, authorizes, admits and rate-limits each agent as the agent of its
    /// pod (API Priority and Fairness classifies it as a service account, not as the exempt
    /// `system:masters` of the admin's client). For measurements of many pods as they are.
    InProcessBound,
}

impl std::fmt::Debug for NodeAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeAgents::Binary(path) => f.debug_tuple("Binary").field(path).finish(),
            NodeAgents::InProcess(_) => f.write_str("InProcess"),
            NodeAgents::InProcessBound => f.write_str("InProcessBound"),
        }
    }
}

/// What the node is and how it runs pods.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The `Node`'s name (cluster-scoped: unique per test).
    pub name: String,
    /// The namespace whose pods it binds and runs.
    pub namespace: String,
    /// What the agent containers run.
    pub agents: NodeAgents,
    /// The API server's URL and CA (base64 PEM, as in a kubeconfig), written into each pod's
    /// kubeconfig.
    pub server: String,
    pub ca_data: String,
    /// Where each pod's kubeconfig goes (a temporary directory under it).
    pub work_dir: PathBuf,
    /// `JOBSET_INPLACE_LOG_LEVEL` of the agents.
    pub agent_log_level: String,
    /// Startup probe period (the kubelet's minimum is 1 s; tests go faster).
    pub probe_period: Duration,
    /// SIGTERM to SIGKILL when a container is stopped.
    pub termination_grace: Duration,
    /// Timeout of each API call.
    pub api_timeout: Duration,
    /// `status.capacity` (and `allocatable`) of the `Node`.
    pub capacity: BTreeMap<String, String>,
    /// The kubelet runs with `RestartAllContainersOnContainerExits` (the default). Without it a
    /// `RestartAllContainers` rule is ignored and each container follows its own
    /// `restartPolicy`: the agent sidecar restarts alone beside its running worker, a worker
    /// that exits ends its pod (kubelet v1.35).
    pub restart_all_gate: bool,
    /// API calls in flight at once, for the whole node (bindings, token requests, status
    /// writes, deletions; not its watch). A kubelet's status manager writes one pod at a time
    /// (`syncBatch`) and its client holds to 50 QPS; the scheduler binds with a parallelism of
    /// 16. This node stands in for many nodes in measurements, so it allows a few calls at
    /// once, but never one per pod: 5,000 status writes at once kept a 2-core API server past
    /// every client's timeout, and each abandoned write was done again.
    pub calls_in_flight: usize,
    /// Set in every agent's env beside the container's own (after them: they win), as an
    /// operator's patch of the injected container would.
    pub agent_env: Vec<(String, String)>,
    /// Every line of the node's log also appended here (the log in memory keeps the last
    /// 20,000): for measurements whose failures need the whole story.
    pub log_file: Option<PathBuf>,
    /// Also run pods without an agent ([`run_plain_pod`]: a JobSet that is not injected, as
    /// JobSet's own `Recreate` runs it), and delete for good the ended pods being deleted, as a
    /// kubelet does. Off: such pods are left unrun (logged).
    pub plain_pods: bool,
}

impl NodeConfig {
    pub fn new(
        name: &str,
        namespace: &str,
        agent_binary: impl Into<PathBuf>,
        server: &str,
        ca_data: &str,
        work_dir: impl Into<PathBuf>,
    ) -> Self {
        let capacity = [("cpu", "8"), ("memory", "32Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        NodeConfig {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            agents: NodeAgents::Binary(agent_binary.into()),
            server: server.to_owned(),
            ca_data: ca_data.to_owned(),
            work_dir: work_dir.into(),
            agent_log_level: "info,jobset_inplace=debug".to_owned(),
            probe_period: Duration::from_millis(100),
            termination_grace: Duration::from_secs(5),
            api_timeout: Duration::from_secs(10),
            capacity,
            restart_all_gate: true,
            calls_in_flight: 4,
            agent_env: Vec::new(),
            log_file: None,
            plain_pods: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("the node {node}: {what}: {reason}")]
    Api {
        node: String,
        what: String,
        reason: String,
    },
    #[error("the node's work directory: {0}")]
    Io(#[from] std::io::Error),
}

/// One pod as the node runs it, for tests to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    /// Restarts of all containers in place (`RestartAllContainers`).
    pub restarts: i64,
    /// The worker runs now (its barrier lifted).
    pub worker_running: bool,
    /// How many times the worker started.
    pub worker_starts: u32,
    /// How many agent processes started.
    pub agent_starts: u32,
    /// The pod ended (a terminal status written, or deleted): nothing runs any more.
    pub ended: bool,
    /// Each run of the worker: when it started and stopped (since the node started).
    pub worker_runs: Vec<(Duration, Option<Duration>)>,
    /// Each run of the worker: when the API server acknowledged the status that shows it
    /// running (what a client of the API sees of the restart, after the node's write).
    pub running_written: Vec<Duration>,
    /// Startup probes of its agent that failed (each a Warning `Unhealthy` event, within the
    /// kubelet's spam filter: [`events`]).
    pub unhealthy: u32,
}

impl PodView {
    /// Its worker started at `at` (the node's clock).
    fn worker_started(&mut self, at: Duration) {
        self.worker_running = true;
        self.worker_starts += 1;
        self.worker_runs.push((at, None));
    }

    fn worker_stopped(&mut self, at: Duration) {
        self.worker_running = false;
        if let Some(run) = self.worker_runs.last_mut() {
            run.1.get_or_insert(at);
        }
    }
}

enum Cmd {
    /// The worker exits with this code.
    ExitWorker(i32),
    /// The pod is being deleted through the API.
    Deleted,
}

struct PodHandle {
    uid: String,
    cmds: mpsc::UnboundedSender<Cmd>,
    task: JoinHandle<()>,
}

struct Shared {
    config: NodeConfig,
    client: kube::Client,
    started: Instant,
    log: Mutex<VecDeque<String>>,
    views: Mutex<BTreeMap<String, PodView>>,
    dir: tempfile::TempDir,
    /// See [`NodeConfig::calls_in_flight`].
    call_slots: Arc<tokio::sync::Semaphore>,
    /// The kubelet's event recorder for failed startup probes.
    probe_events: Mutex<events::ProbeEvents>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn log(&self, line: String) {
        let mut log = lock(&self.log);
        if log.len() >= 20_000 {
            log.pop_front();
        }
        let ms = self.started.elapsed().as_millis();
        let line = format!("{ms:>7}ms {line}");
        if let Some(path) = &self.config.log_file {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(path)
            {
                let _ = writeln!(f, "{line}");
            }
        }
        log.push_back(line);
    }

    /// A startup probe of the agent of pod `name` (`uid`) failed: the kubelet's Warning event,
    /// created or counted up in the background as its recorder does ([`events`]).
    fn probe_failed(self: &Arc<Self>, name: &str, uid: &str, barrier: &str) {
        self.view(name, |v| v.unhealthy += 1);
        let write = lock(&self.probe_events).failed(uid, Instant::now());
        let api: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), &self.config.namespace);
        let limit = self.config.api_timeout;
        let (name, uid) = (name.to_owned(), uid.to_owned());
        let message = format!(
            "Startup probe failed: Get \"http://127.0.0.1{barrier}\": context deadline exceeded"
        );
        let body = events::event(
            &self.config.namespace,
            &name,
            &uid,
            jobset_inplace::wire::agent_env::CONTAINER_NAME,
            &self.config.name,
            &message,
        );
        tokio::spawn(async move {
            let sent = match write {
                events::Write::Dropped => return,
                events::Write::Create => match serde_json::from_value(body) {
                    Ok(event) => {
                        tokio::time::timeout(limit, api.create(&PostParams::default(), &event))
                            .await
                            .map(|r| r.map(|_| ()))
                    }
                    Err(_) => return,
                },
                events::Write::Patch(count) => {
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let patch = serde_json::json!({"count": count, "lastTimestamp": now});
                    tokio::time::timeout(
                        limit,
                        api.patch(
                            &events::event_name(&name, &uid),
                            &PatchParams::default(),
                            &Patch::Merge(patch),
                        ),
                    )
                    .await
                    .map(|r| r.map(|_| ()))
                }
            };
            // An event lost is an event lost, as with the kubelet's recorder.
            let _ = sent;
        });
    }

    /// Pod `uid` ended: its events' budget goes with it.
    fn forget_probe_events(&self, uid: &str) {
        lock(&self.probe_events).forget(uid);
    }

    fn sink(self: &Arc<Self>) -> LogSink {
        let weak = Arc::downgrade(self);
        Arc::new(move |line| {
            if let Some(s) = weak.upgrade() {
                s.log(line);
            }
        })
    }

    fn view(&self, name: &str, f: impl FnOnce(&mut PodView)) {
        f(lock(&self.views).entry(name.to_owned()).or_default());
    }

    /// The API server acknowledged the status that shows `name`'s worker running (now).
    fn running_written(&self, name: &str) {
        let at = self.started.elapsed();
        self.view(name, |v| v.running_written.push(at));
    }

    /// `call` under the API timeout; its error (or the timeout) as text.
    async fn call<T, F>(&self, call: F) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        // Waiting for a slot is not the call's time: the timeout starts with the request.
        let Ok(_slot) = self.call_slots.acquire().await else {
            return Err("the node stopped".to_owned());
        };
        match tokio::time::timeout(self.config.api_timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.config.api_timeout)),
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }
}

/// A running node; [`Node::stop`] ends it (dropping it kills its agents too).
pub struct Node {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    main: Option<JoinHandle<()>>,
    pods: Arc<Mutex<HashMap<String, PodHandle>>>,
}

impl Node {
    /// Registers the `Node` and starts binding and running the namespace's pods.
    pub async fn start(client: kube::Client, config: NodeConfig) -> Result<Node, NodeError> {
        std::fs::create_dir_all(&config.work_dir)?;
        let dir = tempfile::tempdir_in(&config.work_dir)?;
        let call_slots = Arc::new(tokio::sync::Semaphore::new(config.calls_in_flight.max(1)));
        let shared = Arc::new(Shared {
            config,
            client,
            call_slots,
            started: Instant::now(),
            log: Mutex::new(VecDeque::new()),
            views: Mutex::new(BTreeMap::new()),
            probe_events: Mutex::new(events::ProbeEvents::default()),
            dir,
        });
        register(&shared).await?;
        let (stop, stop_rx) = watch::channel(false);
        let pods = Arc::new(Mutex::new(HashMap::new()));
        let main = tokio::spawn(run(shared.clone(), pods.clone(), stop_rx));
        Ok(Node {
            shared,
            stop,
            main: Some(main),
            pods,
        })
    }

    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// The node's clock (since it started): the one of [`PodView::worker_runs`].
    pub fn clock(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Makes the worker of pod `pod` exit with `code`; an error when the node runs no such pod.
    pub fn exit_worker(&self, pod: &str, code: i32) -> Result<(), String> {
        let pods = lock(&self.pods);
        let handle = pods
            .get(pod)
            .ok_or_else(|| format!("the node runs no pod {pod}"))?;
        handle
            .cmds
            .send(Cmd::ExitWorker(code))
            .map_err(|_| format!("the pod {pod} has ended"))
    }

    /// The pods the node runs or ran, by name.
    pub fn pods(&self) -> Vec<PodView> {
        lock(&self.shared.views).values().cloned().collect()
    }

    /// The node's log (its own lines and its agents' output), the last `lines` lines.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = lock(&self.shared.log);
        let skip = log.len().saturating_sub(lines);
        log.iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops every pod's containers (within the grace period), stops watching and deletes the
    /// `Node`. Pods stay in the API as they are (a kubelet that stops does not delete them).
    pub async fn stop(mut self) -> Result<(), NodeError> {
        self.stop.send_replace(true);
        let limit = self.shared.config.termination_grace + Duration::from_secs(5);
        if let Some(main) = self.main.take()
            && tokio::time::timeout(limit, main).await.is_err()
        {
            self.shared
                .log("the node's watch did not end in time".into());
        }
        let handles: Vec<PodHandle> = lock(&self.pods).drain().map(|(_, h)| h).collect();
        for h in handles {
            let abort = h.task.abort_handle();
            if tokio::time::timeout(limit, h.task).await.is_err() {
                abort.abort();
            }
        }
        let nodes: Api<NodeObject> = Api::all(self.shared.client.clone());
        let name = self.shared.config.name.clone();
        match self
            .shared
            .call(nodes.delete(&name, &DeleteParams::default()))
            .await
        {
            Ok(_) => Ok(()),
            Err(reason) if reason.contains("NotFound") || reason.contains("not found") => Ok(()),
            Err(reason) => Err(NodeError::Api {
                node: name,
                what: "delete the Node".into(),
                reason,
            }),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(main) = self.main.take() {
            main.abort();
        }
        // Aborted tasks drop their agents, which are killed on drop.
        for (_, h) in lock(&self.pods).drain() {
            h.task.abort();
        }
    }
}

/// Creates (or takes over) the `Node` and writes its status: `Ready`, capacity, addresses, the
/// features a 1.35 kubelet with the `RestartAllContainersOnContainerExits` gate declares.
async fn register(shared: &Shared) -> Result<(), NodeError> {
    let c = &shared.config;
    let err = |what: &str, reason: String| NodeError::Api {
        node: c.name.clone(),
        what: what.to_owned(),
        reason,
    };
    let nodes: Api<NodeObject> = Api::all(shared.client.clone());
    let object: NodeObject = serde_json::from_value(json!({
        "metadata": {"name": c.name, "labels": {
            "kubernetes.io/hostname": c.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": std::env::consts::ARCH,
        }},
    }))
    .map_err(|e| err("the Node object", e.to_string()))?;
    match shared
        .call(nodes.create(&PostParams::default(), &object))
        .await
    {
        Ok(_) => {}
        Err(reason) if reason.contains("AlreadyExists") || reason.contains("already exists") => {}
        Err(reason) => return Err(err("create the Node", reason)),
    }
    let now = now();
    let status = json!({"status": {
        "capacity": c.capacity,
        "allocatable": c.capacity,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
        ],
        "addresses": [
            {"type": "InternalIP", "address": LOOPBACK},
            {"type": "Hostname", "address": c.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
            "osImage": "jobset-inplace test node", "containerRuntimeVersion": "sim://0",
            "kubeletVersion": "v1.35.0-jobset-inplace-node", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
        },
        "declaredFeatures": ["RestartAllContainersOnContainerExits"],
    }});
    shared
        .call(nodes.patch_status(&c.name, &PatchParams::default(), &Patch::Merge(&status)))
        .await
        .map_err(|reason| err("write the Node's status", reason))?;
    shared.log(format!("node {} registered", c.name));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests;
