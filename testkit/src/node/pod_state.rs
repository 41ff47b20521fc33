//! A pod's state as the kubelet keeps it, and its status writes

use super::*;

/// One container's status, as the kubelet reports it.
#[derive(Clone, Debug)]
pub(super) struct Container {
    pub(super) name: String,
    pub(super) image: String,
    pub(super) restarts: i64,
    pub(super) state: Value,
    pub(super) last: Value,
    pub(super) started: bool,
    pub(super) ready: bool,
    /// The ID of the container that runs (or ran last).
    pub(super) id: String,
}

impl Container {
    pub(super) fn new(spec: &Value) -> Self {
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

    pub(super) fn run(&mut self, uid: &str) {
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

    pub(super) fn terminate(&mut self, code: i32, reason: &str) {
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
    pub(super) fn remove(&mut self) {
        self.last = json!({"terminated": {"exitCode": 137, "reason": RESTARTING_ALL_CONTAINERS,
            "message": "The container is removed because RestartAllContainers in place"}});
        self.restarts += 1;
        self.state = json!({"waiting": {"reason": RESTARTING_ALL_CONTAINERS,
            "message": "The container is removed because RestartAllContainers in place"}});
        self.started = false;
        self.ready = false;
    }

    /// Restarted alone: what ended is `lastState`, restart count up.
    pub(super) fn restart(&mut self) {
        if self.state.get("terminated").is_some() {
            self.last = self.state.clone();
        }
        self.restarts += 1;
        self.state = json!({"waiting": {"reason": "PodInitializing"}});
    }

    pub(super) fn json(&self) -> Value {
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
pub(super) struct PodState {
    pub(super) uid: String,
    pub(super) start_time: Value,
    pub(super) phase: &'static str,
    pub(super) agent: Container,
    pub(super) worker: Container,
    /// A `RestartAllContainers` rule matched and the containers are being stopped.
    pub(super) restarting: bool,
    /// `Initialized` was True once: it stays True (`status/generate.go`
    /// `GeneratePodInitializedCondition`, with the RestartAllContainers gate).
    pub(super) initialized: bool,
    /// Condition type to (status, lastTransitionTime).
    pub(super) conditions: BTreeMap<&'static str, (bool, Value)>,
    /// The pod has the agent sidecar (an init container); without it, only the worker.
    pub(super) has_agent: bool,
}

impl PodState {
    pub(super) fn new(uid: &str, agent: &Value, worker: &Value) -> Self {
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

    pub(super) fn condition(&mut self, kind: &'static str, status: bool) -> Value {
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
    pub(super) fn json(&mut self) -> Value {
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
pub(super) struct StatusWriter {
    pub(super) pending: watch::Sender<(u64, Option<Value>)>,
    pub(super) written: watch::Receiver<u64>,
    pub(super) seq: u64,
}

/// The status manager's sync period: the longest wait between two tries of one write.
pub(super) const STATUS_RETRY_MAX: Duration = Duration::from_secs(10);

impl StatusWriter {
    pub(super) fn start(shared: &Arc<Shared>, name: &str) -> StatusWriter {
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

    pub(super) fn set(&mut self, state: &mut PodState) -> u64 {
        self.seq += 1;
        self.pending.send_replace((self.seq, Some(state.json())));
        self.seq
    }

    /// Waits until the write of `seq` (or a newer one) is done (written or given up on).
    pub(super) async fn wait_written(&mut self, seq: u64) {
        let _ = self.written.wait_for(|w| *w >= seq).await;
    }

    /// Writes and waits until written (or given up on).
    pub(super) async fn write(&mut self, state: &mut PodState, limit: Duration) {
        let seq = self.set(state);
        let _ = tokio::time::timeout(limit, self.written.wait_for(|w| *w >= seq)).await;
    }
}
