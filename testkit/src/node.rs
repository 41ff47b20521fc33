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
}

impl PodView {
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

fn now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap_or(Value::Null)
}

/// The node's watch of its namespace's pods: binds the unscheduled ones, starts the ones bound
/// to it, tells a pod's task when the pod is deleted.
async fn run(
    shared: Arc<Shared>,
    pods: Arc<Mutex<HashMap<String, PodHandle>>>,
    mut stop: watch::Receiver<bool>,
) {
    let api = shared.pods();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut bound: HashSet<String> = HashSet::new();
    // The ended pods being deleted that this node deleted for good ([`NodeConfig::plain_pods`]).
    let mut finished: HashSet<String> = HashSet::new();
    loop {
        let event = tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
            event = events.next() => event,
        };
        let pod = match event {
            None => {
                shared.log("the pod watch ended".into());
                break;
            }
            Some(Err(e)) => {
                shared.log(format!("the pod watch: {e} (it backs off and resumes)"));
                continue;
            }
            Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => (p, false),
            Some(Ok(watcher::Event::Delete(p))) => (p, true),
            Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => continue,
        };
        let (pod, gone) = pod;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let deleting = gone || pod.metadata.deletion_timestamp.is_some();
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let terminal = matches!(phase.as_deref(), Some("Failed" | "Succeeded"));
        {
            let mut running = lock(&pods);
            // A pod of the same name with another UID is another pod: the old one is gone.
            if let Some(h) = running.get(&name) {
                if h.uid != uid || deleting {
                    let _ = h.cmds.send(Cmd::Deleted);
                }
                if h.uid != uid {
                    running.remove(&name);
                }
            }
        }
        let here = node.as_deref() == Some(shared.config.name.as_str());
        if shared.config.plain_pods && here && terminal && deleting && !gone {
            // Its containers ended with it; the kubelet's status manager deletes it for good.
            if finished.insert(uid.clone()) {
                let shared = shared.clone();
                tokio::spawn(async move { delete_for_good(&shared, &name, &uid).await });
            }
            continue;
        }
        if deleting || terminal {
            continue;
        }
        match node.as_deref() {
            None | Some("") => {
                if bound.insert(uid.clone()) {
                    let shared = shared.clone();
                    tokio::spawn(async move { bind(&shared, &name, &uid).await });
                }
            }
            Some(n) if n == shared.config.name => {
                let mut running = lock(&pods);
                if !running.contains_key(&name) {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let value = serde_json::to_value(&pod).unwrap_or(Value::Null);
                    let task = tokio::spawn(run_pod(shared.clone(), value, rx, stop.clone()));
                    running.insert(
                        name.clone(),
                        PodHandle {
                            uid: uid.clone(),
                            cmds: tx,
                            task,
                        },
                    );
                }
            }
            Some(_) => {}
        }
    }
}

/// Binds a pod to the node, as the scheduler does.
async fn bind(shared: &Shared, name: &str, uid: &str) {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": shared.config.namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": shared.config.name},
    });
    let api = shared.pods();
    let result: Result<Value, String> = shared
        .call(api.create_subresource("binding", name, &PostParams::default(), &binding))
        .await;
    match result {
        Ok(_) => shared.log(format!("{name}: bound to {}", shared.config.name)),
        Err(e) => shared.log(format!("{name}: cannot bind: {e}")),
    }
}

/// One container's status, as the kubelet reports it.
#[derive(Clone, Debug)]
struct Container {
    name: String,
    image: String,
    restarts: i64,
    state: Value,
    last: Value,
    started: bool,
    ready: bool,
    /// The ID of the container that runs (or ran last).
    id: String,
}

impl Container {
    fn new(spec: &Value) -> Self {
        let s = |k: &str| spec[k].as_str().unwrap_or_default().to_owned();
        Container {
            name: s("name"),
            image: s("image"),
            restarts: 0,
            state: json!({"waiting": {"reason": "PodInitializing"}}),
            last: json!({}),
            started: false,
            ready: false,
            id: String::new(),
        }
    }

    fn run(&mut self, uid: &str) {
        self.id = format!("sim://{uid}/{}/{}", self.name, self.restarts);
        // After a group restart the removed container's status is gone with it
        // (`kubelet_pods.go` `convertToAPIContainerStatuses`): `lastState` empty again.
        if self
            .last
            .pointer("/terminated/reason")
            .and_then(Value::as_str)
            == Some(RESTARTING_ALL_CONTAINERS)
        {
            self.last = json!({});
        }
        self.state = json!({"running": {"startedAt": now()}});
    }

    fn terminate(&mut self, code: i32, reason: &str) {
        let finished = now();
        let started = self.state.pointer("/running/startedAt").cloned();
        self.state = json!({"terminated": {"exitCode": code, "reason": reason,
            "startedAt": started, "finishedAt": finished, "containerID": self.id}});
        self.started = false;
        self.ready = false;
    }

    /// Removed by a group restart (`convertToAPIContainerStatuses`): `waiting`
    /// `RestartingAllContainers`, `lastState` overwritten with the same reason and 137, restart
    /// count up.
    fn remove(&mut self) {
        self.last = json!({"terminated": {"exitCode": 137, "reason": RESTARTING_ALL_CONTAINERS,
            "message": "The container is removed because RestartAllContainers in place"}});
        self.restarts += 1;
        self.state = json!({"waiting": {"reason": RESTARTING_ALL_CONTAINERS,
            "message": "The container is removed because RestartAllContainers in place"}});
        self.started = false;
        self.ready = false;
    }

    /// Restarted alone: what ended is `lastState`, restart count up.
    fn restart(&mut self) {
        if self.state.get("terminated").is_some() {
            self.last = self.state.clone();
        }
        self.restarts += 1;
        self.state = json!({"waiting": {"reason": "PodInitializing"}});
    }

    fn json(&self) -> Value {
        let mut v = json!({
            "name": self.name, "image": self.image, "imageID": "",
            "restartCount": self.restarts, "started": self.started, "ready": self.ready,
            "state": self.state, "lastState": self.last,
        });
        if self.state.get("waiting").is_none() {
            v["containerID"] = json!(self.id);
        }
        v
    }
}

/// The status of one pod as its kubelet knows it.
struct PodState {
    uid: String,
    start_time: Value,
    phase: &'static str,
    agent: Container,
    worker: Container,
    /// A `RestartAllContainers` rule matched and the containers are being stopped.
    restarting: bool,
    /// `Initialized` was True once: it stays True (`status/generate.go`
    /// `GeneratePodInitializedCondition`, with the RestartAllContainers gate).
    initialized: bool,
    /// Condition type to (status, lastTransitionTime).
    conditions: BTreeMap<&'static str, (bool, Value)>,
    /// The pod has the agent sidecar (an init container); without it, only the worker.
    has_agent: bool,
}

impl PodState {
    fn new(uid: &str, agent: &Value, worker: &Value) -> Self {
        PodState {
            uid: uid.to_owned(),
            start_time: now(),
            phase: "Pending",
            agent: Container::new(agent),
            worker: Container::new(worker),
            restarting: false,
            initialized: false,
            conditions: BTreeMap::new(),
            has_agent: true,
        }
    }

    fn condition(&mut self, kind: &'static str, status: bool) -> Value {
        let entry = self.conditions.entry(kind).or_insert((status, now()));
        if entry.0 != status {
            *entry = (status, now());
        }
        let mut c = json!({"type": kind, "status": if status { "True" } else { "False" },
                           "lastProbeTime": null, "lastTransitionTime": entry.1});
        if kind == "AllContainersRestarting" && status {
            c["reason"] = json!("RestartAllContainersStarted");
            c["message"] = json!("container exited with restart policy rule");
        }
        c
    }

    /// The whole `status`, as the kubelet's status manager writes it.
    fn json(&mut self) -> Value {
        let terminal = matches!(self.phase, "Failed" | "Succeeded");
        let worker_started = self.worker.state.get("waiting").is_none();
        self.initialized |= self.agent.started || worker_started || !self.has_agent;
        let initialized = self.initialized;
        let ready = (self.agent.ready || !self.has_agent) && self.worker.ready && !self.restarting;
        let conditions = vec![
            self.condition("PodReadyToStartContainers", !terminal),
            self.condition("Initialized", initialized),
            self.condition("Ready", ready),
            self.condition("ContainersReady", ready),
            self.condition("PodScheduled", true),
            self.condition("AllContainersRestarting", self.restarting && !terminal),
        ];
        json!({
            "phase": self.phase,
            "conditions": conditions,
            "hostIP": LOOPBACK, "hostIPs": [{"ip": LOOPBACK}],
            "podIP": LOOPBACK, "podIPs": [{"ip": LOOPBACK}],
            "startTime": self.start_time,
            "initContainerStatuses": if self.has_agent { vec![self.agent.json()] } else { Vec::new() },
            "containerStatuses": [self.worker.json()],
        })
    }
}

/// A pod's status writes, beside its lifecycle as the kubelet's status manager does them: a
/// status not written yet is replaced by a newer one, and a write that fails is tried again
/// (backing off up to the status manager's 10 s sync period) until the API server has it, the
/// pod is gone, or a newer status replaces it. The kubelet never gives a status up: it writes
/// until the API server's copy matches (`status_manager.go`, `syncBatch`/`needsUpdate`).
struct StatusWriter {
    pending: watch::Sender<(u64, Option<Value>)>,
    written: watch::Receiver<u64>,
    seq: u64,
}

/// The status manager's sync period: the longest wait between two tries of one write.
const STATUS_RETRY_MAX: Duration = Duration::from_secs(10);

impl StatusWriter {
    fn start(shared: &Arc<Shared>, name: &str) -> StatusWriter {
        let (pending, mut next) = watch::channel((0u64, None::<Value>));
        let (done, written) = watch::channel(0u64);
        let (shared, name) = (shared.clone(), name.to_owned());
        tokio::spawn(async move {
            let api = shared.pods();
            while next.changed().await.is_ok() {
                let (mut seq, mut status) = next.borrow_and_update().clone();
                let mut wait = Duration::from_millis(100);
                let mut attempt = 0u32;
                while let Some(body) = status.take() {
                    attempt += 1;
                    let patch = json!({"status": body});
                    let params = PatchParams::default();
                    let outcome = shared
                        .call(api.patch_status(&name, &params, &Patch::Merge(&patch)))
                        .await;
                    let Err(e) = outcome else { break };
                    shared.log(format!("{name}: status write, try {attempt}: {e}"));
                    if e.contains("NotFound") || e.contains("not found") {
                        break;
                    }
                    // Again after the back-off, or at once with a newer status.
                    status = Some(patch["status"].clone());
                    match tokio::time::timeout(wait, next.changed()).await {
                        Ok(Ok(())) => {
                            (seq, status) = next.borrow_and_update().clone();
                            attempt = 0;
                        }
                        // The pod's kubelet loop ended (the node stopped): nobody writes for it.
                        Ok(Err(_)) => return,
                        Err(_) => {}
                    }
                    wait = (wait * 2).min(STATUS_RETRY_MAX);
                }
                done.send_replace(seq);
            }
        });
        StatusWriter {
            pending,
            written,
            seq: 0,
        }
    }

    fn set(&mut self, state: &mut PodState) -> u64 {
        self.seq += 1;
        self.pending.send_replace((self.seq, Some(state.json())));
        self.seq
    }

    /// Writes and waits until written (or given up on).
    async fn write(&mut self, state: &mut PodState, limit: Duration) {
        let seq = self.set(state);
        let _ = tokio::time::timeout(limit, self.written.wait_for(|w| *w >= seq)).await;
    }
}

enum Exit {
    Agent(i32),
    Worker(i32),
    Deleted,
    Stopped,
}

/// A kubeconfig for the pod's agent: the API server and its CA, and a token of the pod's
/// service account bound to the pod, as the kubelet's projected token volume holds.
async fn pod_kubeconfig(shared: &Shared, pod: &Value) -> Result<PathBuf, String> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let account = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let accounts: Api<ServiceAccount> =
        Api::namespaced(shared.client.clone(), &shared.config.namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3607),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
            }),
        },
        ..Default::default()
    };
    let answer = shared
        .call(accounts.create_token_request(account, &PostParams::default(), &request))
        .await
        .map_err(|e| format!("TokenRequest for {account}: {e}"))?;
    let token = answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("TokenRequest for {account}: no token in the answer"))?;
    let path = shared.dir.path().join(format!("{name}-{uid}.kubeconfig"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
         certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: {}\n\
         current-context: c\n",
        shared.config.server, shared.config.ca_data, shared.config.namespace
    );
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// A client from a pod's kubeconfig (its bound token), as the agent's `agent::client` builds one
/// from `KUBECONFIG`.
async fn client_of(kubeconfig: &Path) -> Result<kube::Client, String> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    // As the agent builds its own (`agent::client`): kube's retry layer off, the agent retries.
    jobset_inplace::retry::client_without_retries(config).map_err(|e| e.to_string())
}

fn spawn_agent(
    shared: &Arc<Shared>,
    pod: &Value,
    agent: &Value,
    kubeconfig: Option<&Path>,
    own_client: Option<&kube::Client>,
) -> Result<AgentRun, String> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut env = resolve_env(agent, pod);
    let mut set = |k: &str, v: String| {
        env.retain(|(n, _)| n != k);
        env.push((k.to_owned(), v));
    };
    for (k, v) in &shared.config.agent_env {
        set(k, v.clone());
    }
    match (&shared.config.agents, own_client) {
        (NodeAgents::InProcess(client), _) | (NodeAgents::InProcessBound, Some(client)) => {
            AgentRun::spawn_in_process(
                client.clone(),
                &env,
                jobset_inplace::protocol::Dialect::Epoch,
            )
            .map_err(|e| format!("cannot start the agent of {name}: {e}"))
        }
        (NodeAgents::InProcessBound, None) => Err(format!("no client for the agent of {name}")),
        (NodeAgents::Binary(binary), _) => {
            let port = barrier_port().ok_or("no free loopback port for the barrier")?;
            set(agent_env::BARRIER_PORT, port.to_string());
            if let Some(path) = kubeconfig {
                set("KUBECONFIG", path.display().to_string());
            }
            set(
                "JOBSET_INPLACE_LOG_LEVEL",
                shared.config.agent_log_level.clone(),
            );
            set("NO_COLOR", "1".to_owned());
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            AgentRun::spawn_process(
                binary,
                &env,
                Some(addr),
                shared.sink(),
                format!("{name} agent:"),
            )
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))
        }
    }
}

/// The kubelet of one pod bound to the node.
async fn run_pod(
    shared: Arc<Shared>,
    mut pod: Value,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    mut stop: watch::Receiver<bool>,
) {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let spec = pod["spec"].clone();
    let Some(agent_spec) = recognise::agent(&spec).cloned() else {
        let worker_spec = spec["containers"].get(0).cloned().unwrap_or(Value::Null);
        if shared.config.plain_pods && !worker_spec.is_null() {
            run_plain_pod(shared, name, uid, worker_spec, cmds, stop).await;
        } else {
            shared.log(format!("{name}: no agent container; not run"));
        }
        return;
    };
    let is_sidecar = spec["initContainers"]
        .as_array()
        .is_some_and(|l| l.iter().any(|c| c == &agent_spec));
    let worker_spec = spec["containers"].get(0).cloned().unwrap_or(Value::Null);
    if !is_sidecar || worker_spec.is_null() {
        shared.log(format!(
            "{name}: runs only a sidecar agent beside a worker; not run"
        ));
        return;
    }
    let probe_path = recognise::startup_probe_path(&agent_spec)
        .unwrap_or(agent_env::DEFAULT_BARRIER_PATH)
        .to_owned();
    let grace = shared.config.termination_grace;
    let write_limit = shared.config.api_timeout * 5;
    shared.view(&name, |v| {
        *v = PodView {
            name: name.clone(),
            uid: uid.clone(),
            ..PodView::default()
        };
    });
    pod["status"]["podIP"] = json!(LOOPBACK);
    let mut st = PodState::new(&uid, &agent_spec, &worker_spec);
    let mut status = StatusWriter::start(&shared, &name);
    status.set(&mut st);

    // The projected token: asked for once per pod, as the kubelet mounts it for the pod's life
    // (in-process agents on the node's client need none; bound ones get a client on it).
    let in_process = matches!(shared.config.agents, NodeAgents::InProcess(_));
    let kubeconfig = loop {
        if in_process {
            break None;
        }
        match pod_kubeconfig(&shared, &pod).await {
            Ok(path) => break Some(path),
            Err(e) => {
                shared.log(format!("{name}: {e}; again in 1 s"));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return,
                    cmd = cmds.recv() => if matches!(cmd, None | Some(Cmd::Deleted)) { return },
                }
            }
        }
    };

    let own_client = match (&shared.config.agents, kubeconfig.as_deref()) {
        (NodeAgents::InProcessBound, Some(path)) => match client_of(path).await {
            Ok(client) => Some(client),
            Err(e) => {
                shared.log(format!("{name}: the agent's client: {e}"));
                return;
            }
        },
        _ => None,
    };
    let mut worker_running = false;
    loop {
        // A run of the agent container.
        let spawned = spawn_agent(
            &shared,
            &pod,
            &agent_spec,
            kubeconfig.as_deref(),
            own_client.as_ref(),
        );
        let mut agent = match spawned {
            Ok(a) => a,
            Err(e) => {
                shared.log(format!("{name}: {e}"));
                return;
            }
        };
        st.agent.run(&st.uid.clone());
        if !worker_running {
            // `getPhase`: the worker waits (PodInitializing) behind the agent's barrier.
            st.phase = "Pending";
        }
        shared.view(&name, |v| v.agent_starts += 1);
        status.set(&mut st);
        let mut probe = tokio::time::interval(shared.config.probe_period);
        let exit = loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break Exit::Stopped;
                    }
                }
                cmd = cmds.recv() => match cmd {
                    None => break Exit::Stopped,
                    Some(Cmd::Deleted) => break Exit::Deleted,
                    Some(Cmd::ExitWorker(code)) if worker_running => break Exit::Worker(code),
                    Some(Cmd::ExitWorker(code)) => {
                        shared.log(format!("{name}: no worker runs; exit {code} ignored"));
                    }
                },
                code = agent.wait() => break Exit::Agent(code),
                _ = probe.tick(), if !st.agent.started => {
                    if agent.probe(&probe_path).await {
                        st.agent.started = true;
                        st.agent.ready = true;
                        if !worker_running {
                            worker_running = true;
                            st.worker.run(&st.uid.clone());
                            st.worker.started = true;
                            st.worker.ready = true;
                            st.phase = "Running";
                            let at = shared.started.elapsed();
                            shared.view(&name, |v| {
                                v.worker_running = true;
                                v.worker_starts += 1;
                                v.worker_runs.push((at, None));
                            });
                            shared.log(format!("{name}: barrier lifted; worker started"));
                        }
                        status.set(&mut st);
                    }
                }
            }
        };
        match exit {
            Exit::Stopped => {
                let at = shared.started.elapsed();
                shared.view(&name, |v| v.worker_stopped(at));
                agent.stop(grace).await;
                shared.view(&name, |v| v.ended = true);
                return;
            }
            Exit::Deleted => {
                // Stopped as the kubelet stops a deleted pod: the worker (SIGTERM), the
                // sidecar, the terminal status, then the pod deleted for good.
                if worker_running {
                    st.worker.terminate(143, "Error");
                }
                let at = shared.started.elapsed();
                shared.view(&name, |v| v.worker_stopped(at));
                let code = agent.stop(grace).await;
                st.agent.terminate(code, "Error");
                st.phase = "Failed";
                shared.view(&name, |v| v.ended = true);
                status.write(&mut st, write_limit).await;
                delete_for_good(&shared, &name, &uid).await;
                return;
            }
            Exit::Agent(code) => {
                st.agent.terminate(code, "Error");
                let action = applied_rule(&shared.config, &agent_spec, code);
                shared.log(format!(
                    "{name}: agent exited {code} (rule: {})",
                    action.as_deref().unwrap_or("none")
                ));
                if action.as_deref().is_some_and(recognise::restarts_pod) {
                    worker_running = false;
                    restart_all(&shared, &name, &mut st, &mut status, None).await;
                } else {
                    // restartPolicy Always: the sidecar restarts alone, the worker runs on.
                    st.agent.restart();
                    status.set(&mut st);
                }
            }
            Exit::Worker(code) => {
                let reason = if code == 0 { "Completed" } else { "Error" };
                st.worker.terminate(code, reason);
                worker_running = false;
                let at = shared.started.elapsed();
                shared.view(&name, |v| v.worker_stopped(at));
                let action = applied_rule(&shared.config, &worker_spec, code);
                shared.log(format!(
                    "{name}: worker exited {code} (rule: {})",
                    action.as_deref().unwrap_or("none")
                ));
                if action.as_deref().is_some_and(recognise::restarts_pod) {
                    restart_all(&shared, &name, &mut st, &mut status, Some(&mut agent)).await;
                    continue;
                }
                // No rule, restartPolicy Never: the worker stays terminated, the sidecar is
                // stopped, and the pod ends.
                let agent_code = agent.stop(grace).await;
                st.agent.terminate(agent_code, "Error");
                st.phase = if code == 0 { "Succeeded" } else { "Failed" };
                shared.view(&name, |v| v.ended = true);
                status.write(&mut st, write_limit).await;
                return;
            }
        }
    }
}

/// The final delete of a pod whose containers are stopped (grace period 0, its UID as a
/// precondition), as the kubelet's status manager does it.
async fn delete_for_good(shared: &Shared, name: &str, uid: &str) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match shared.call(shared.pods().delete(name, &params)).await {
        Ok(_) => shared.log(format!("{name}: deleted")),
        Err(e) => shared.log(format!("{name}: final delete: {e}")),
    }
}

/// A pod without an agent ([`NodeConfig::plain_pods`]): its one container, the worker, starts at
/// once and runs until the test makes it exit ([`Node::exit_worker`]); any exit ends the pod
/// (`restartPolicy: Never`: what comes next is the Job's and the JobSet's, e.g. JobSet's own
/// `Recreate` with the Job's `backoffLimit: 0`). Deleted through the API, it is stopped, its
/// terminal status written, and it is deleted for good.
async fn run_plain_pod(
    shared: Arc<Shared>,
    name: String,
    uid: String,
    worker_spec: Value,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    mut stop: watch::Receiver<bool>,
) {
    let write_limit = shared.config.api_timeout * 5;
    let mut st = PodState::new(&uid, &Value::Null, &worker_spec);
    st.has_agent = false;
    let mut status = StatusWriter::start(&shared, &name);
    st.worker.run(&uid);
    st.worker.started = true;
    st.worker.ready = true;
    st.phase = "Running";
    let at = shared.started.elapsed();
    shared.view(&name, |v| {
        *v = PodView {
            name: name.clone(),
            uid: uid.clone(),
            worker_running: true,
            worker_starts: 1,
            worker_runs: vec![(at, None)],
            ..PodView::default()
        };
    });
    status.set(&mut st);
    shared.log(format!("{name}: no agent; worker started"));
    let exit = loop {
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break Exit::Stopped;
                }
            }
            cmd = cmds.recv() => match cmd {
                None => break Exit::Stopped,
                Some(Cmd::Deleted) => break Exit::Deleted,
                Some(Cmd::ExitWorker(code)) => break Exit::Worker(code),
            },
        }
    };
    let at = shared.started.elapsed();
    shared.view(&name, |v| {
        v.worker_stopped(at);
        v.ended = true;
    });
    match exit {
        Exit::Deleted => {
            st.worker.terminate(143, "Error");
            st.phase = "Failed";
            status.write(&mut st, write_limit).await;
            delete_for_good(&shared, &name, &uid).await;
        }
        Exit::Worker(code) => {
            let reason = if code == 0 { "Completed" } else { "Error" };
            st.worker.terminate(code, reason);
            st.phase = if code == 0 { "Succeeded" } else { "Failed" };
            shared.log(format!("{name}: worker exited {code}; the pod ends"));
            status.write(&mut st, write_limit).await;
        }
        Exit::Stopped | Exit::Agent(_) => {}
    }
}

/// The action of the rule that covers `code`, as this kubelet applies it: without the gate
/// ([`NodeConfig::restart_all_gate`]) a `RestartAllContainers` rule is ignored.
fn applied_rule(config: &NodeConfig, container: &Value, code: i32) -> Option<String> {
    rule_action(container, code).filter(|a| config.restart_all_gate || !recognise::restarts_pod(a))
}

/// `RestartAllContainers`: every container still running is stopped (the agent with its grace
/// period), the pod shows `AllContainersRestarting`, then every container starts again in the
/// same pod, restart counts up.
async fn restart_all(
    shared: &Shared,
    name: &str,
    st: &mut PodState,
    status: &mut StatusWriter,
    agent: Option<&mut AgentRun>,
) {
    st.restarting = true;
    let at = shared.started.elapsed();
    shared.view(name, |v| v.worker_stopped(at));
    status.set(st);
    if let Some(agent) = agent {
        // `SyncPod` kills with a grace override of 0, raised to 2 s, no preStop hook.
        let grace = crate::kubelet::model::in_place_kill_grace(shared.config.termination_grace);
        agent.stop(grace).await;
    }
    st.agent.remove();
    st.worker.remove();
    st.restarting = false;
    shared.view(name, |v| v.restarts += 1);
    shared.log(format!("{name}: all containers restarted in place"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_group_restart_the_pod_is_pending_at_the_barrier_and_stays_initialized() {
        let mut st = state();
        st.agent.run("uid-1");
        st.agent.started = true;
        st.worker.run("uid-1");
        st.phase = "Running";
        assert_eq!(condition(&st.json(), "Initialized"), "True");
        st.worker.terminate(3, "Error");
        st.agent.remove();
        st.worker.remove();
        let s = st.json();
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            RESTARTING_ALL_CONTAINERS
        );
        assert_eq!(
            s["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
            137
        );
        // The agent runs again, the barrier not lifted yet (what the kubelet loop does).
        st.agent.run("uid-1");
        st.phase = "Pending";
        let s = st.json();
        assert_eq!(s["phase"], "Pending");
        assert_eq!(condition(&s, "Initialized"), "True", "kept once True");
        assert_eq!(s["initContainerStatuses"][0]["lastState"], json!({}));
    }

    /// A node's `Shared` on the test API server, for the status writer alone.
    fn shared_on(server: &crate::apiserver::TestApiServer, in_flight: usize) -> Arc<Shared> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = NodeConfig::new("n", "default", "/bin/false", "", "", dir.path());
        config.api_timeout = Duration::from_secs(2);
        config.calls_in_flight = in_flight;
        Arc::new(Shared {
            client: server.client(),
            started: Instant::now(),
            log: Mutex::new(VecDeque::new()),
            views: Mutex::new(BTreeMap::new()),
            call_slots: Arc::new(tokio::sync::Semaphore::new(in_flight)),
            config,
            dir,
        })
    }

    /// Pods of one worker container each, in `default`.
    async fn create_pods(server: &crate::apiserver::TestApiServer, names: &[&str]) -> Api<Pod> {
        let pods: Api<Pod> = Api::namespaced(server.client(), "default");
        for name in names {
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "worker", "image": "w:1"}]}});
            let pod = serde_json::from_value(pod).expect("pod");
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create");
        }
        pods
    }

    /// A pod without an agent ([`NodeConfig::plain_pods`]): its worker runs at once; its exit
    /// ends the pod (`Failed` written, no init container status); a pod deleted through the API
    /// is stopped and deleted for good.
    #[tokio::test]
    async fn a_plain_pod_runs_its_worker_at_once_and_ends_with_it() {
        use crate::apiserver::TestApiServer;
        let server = TestApiServer::start().await;
        let pods = create_pods(&server, &["a", "b"]).await;
        let shared = shared_on(&server, 2);
        let (_stop, stop) = watch::channel(false);
        let worker = json!({"name": "worker", "image": "w:1"});
        let mut runs = Vec::new();
        let mut cmds = Vec::new();
        for name in ["a", "b"] {
            let uid = pods.get(name).await.expect("get").metadata.uid;
            let (tx, rx) = mpsc::unbounded_channel();
            runs.push(tokio::spawn(run_plain_pod(
                shared.clone(),
                name.to_owned(),
                uid.unwrap_or_default(),
                worker.clone(),
                rx,
                stop.clone(),
            )));
            cmds.push(tx);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while lock(&shared.views)
            .values()
            .filter(|v| v.worker_running)
            .count()
            < 2
        {
            assert!(Instant::now() < deadline, "both workers run within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = cmds[0].send(Cmd::ExitWorker(1));
        let _ = cmds[1].send(Cmd::Deleted);
        for run in runs {
            tokio::time::timeout(Duration::from_secs(30), run)
                .await
                .expect("the pods end within 30 s")
                .expect("the pod's task");
        }
        let a = serde_json::to_value(pods.get("a").await.expect("get")).expect("json");
        assert_eq!(a["status"]["phase"], "Failed", "{a:#}");
        let worker = &a["status"]["containerStatuses"][0];
        assert_eq!(worker["state"]["terminated"]["exitCode"], 1, "{a:#}");
        assert!(
            a["status"]["initContainerStatuses"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "{a:#}"
        );
        assert!(pods.get_opt("b").await.expect("get").is_none(), "b deleted");
        let views = lock(&shared.views).clone();
        assert!(views.values().all(|v| v.ended && !v.worker_running));
        assert!(views.values().all(|v| v.worker_starts == 1));
        server.shutdown().await;
    }

    /// The kubelet's status manager writes a status until the API server has it: more failed
    /// tries than this node's writer once allowed (5) still end with the status written.
    #[tokio::test]
    async fn a_status_write_is_tried_until_the_api_server_has_it() {
        use crate::apiserver::{TestApiServer, Verb};
        let server = TestApiServer::start().await;
        let pods = create_pods(&server, &["p"]).await;
        let shared = shared_on(&server, 1);
        server.fail_next(6, Verb::Patch, "pods/status", 500);
        let mut writer = StatusWriter::start(&shared, "p");
        let mut st = state();
        st.agent.run("uid-1");
        writer.write(&mut st, Duration::from_secs(60)).await;
        let written = pods.get("p").await.expect("get");
        let phase = written.status.and_then(|s| s.phase);
        assert_eq!(phase.as_deref(), Some("Pending"), "{:?}", lock(&shared.log));
        let tries = lock(&shared.log)
            .iter()
            .filter(|l| l.contains("status write"))
            .count();
        assert_eq!(tries, 6, "each failed try logged once");
        server.shutdown().await;
    }

    /// However many pods change at once, the node has at most `calls_in_flight` status
    /// writes open (each held here by the API server's latency).
    #[tokio::test]
    async fn the_node_bounds_its_calls_in_flight() {
        use crate::apiserver::{TestApiServer, Verb};
        let server = TestApiServer::start().await;
        let names: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        create_pods(&server, &names).await;
        let shared = shared_on(&server, 3);
        server.set_latency_for(Verb::Patch, "pods/status", Duration::from_millis(150));
        let mut writers: Vec<StatusWriter> = (0..12)
            .map(|i| StatusWriter::start(&shared, &format!("p{i}")))
            .collect();
        let mut most = 0;
        let mut states: Vec<PodState> = (0..12).map(|_| state()).collect();
        for (w, st) in writers.iter_mut().zip(states.iter_mut()) {
            st.agent.run("uid-1");
            w.set(st);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            most = most.max(3 - shared.call_slots.available_permits());
            let done = writers.iter().all(|w| *w.written.borrow() >= w.seq);
            if done || Instant::now() > deadline {
                assert!(done, "every status written within 30 s");
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!((1..=3).contains(&most), "{most} writes in flight at once");
        server.shutdown().await;
    }

    fn state() -> PodState {
        PodState::new(
            "uid-1",
            &json!({"name": "jobset-inplace-agent", "image": "agent:1"}),
            &json!({"name": "worker", "image": "worker:1"}),
        )
    }

    fn condition(status: &Value, kind: &str) -> Value {
        status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_pod_waits_at_its_barrier_pending_and_runs_once_it_lifts() {
        let mut st = state();
        st.agent.run("uid-1");
        let s = st.json();
        assert_eq!(s["phase"], "Pending");
        assert_eq!(condition(&s, "Initialized"), "False");
        assert_eq!(condition(&s, "PodScheduled"), "True");
        assert!(s["initContainerStatuses"][0]["state"]["running"].is_object());
        assert_eq!(s["initContainerStatuses"][0]["started"], false);
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "PodInitializing"
        );
        st.agent.started = true;
        st.agent.ready = true;
        st.worker.run("uid-1");
        st.worker.started = true;
        st.worker.ready = true;
        st.phase = "Running";
        let s = st.json();
        assert_eq!(condition(&s, "Ready"), "True");
        assert_eq!(condition(&s, "AllContainersRestarting"), "False");
        assert_eq!(s["podIP"], LOOPBACK);
    }

    #[test]
    fn a_restart_of_all_containers_keeps_what_ended_and_counts_up() {
        let mut st = state();
        st.agent.run("uid-1");
        st.worker.run("uid-1");
        st.phase = "Running";
        st.worker.terminate(42, "Error");
        st.agent.terminate(143, RESTARTING_ALL_CONTAINERS);
        st.restarting = true;
        let s = st.json();
        assert_eq!(condition(&s, "AllContainersRestarting"), "True");
        assert_eq!(condition(&s, "Ready"), "False");
        assert_eq!(
            s["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            42
        );
        st.agent.remove();
        st.worker.remove();
        st.restarting = false;
        let s = st.json();
        assert_eq!(s["phase"], "Running", "a pod that ran stays Running");
        for key in ["initContainerStatuses", "containerStatuses"] {
            assert_eq!(s[key][0]["restartCount"], 1, "{key}");
            assert!(s[key][0]["lastState"]["terminated"].is_object(), "{key}");
            assert!(s[key][0]["state"]["waiting"].is_object(), "{key}");
        }
        assert_eq!(
            s["initContainerStatuses"][0]["lastState"]["terminated"]["reason"],
            RESTARTING_ALL_CONTAINERS
        );
    }
}
