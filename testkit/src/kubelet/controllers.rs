//! The simulated controllers: pods, Jobs, the JobSet, their status writes

use super::*;

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
    pub(super) async fn write_status(&self, pod: &str, status: Value) {
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

    pub(super) fn with_slot(&self, slot: usize, f: impl FnOnce(&mut SlotState)) {
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

    pub(super) fn epoch_of(&self, pod: &Value) -> Option<Epoch> {
        let raw = pod
            .pointer("/metadata/annotations")?
            .get(self.config.dialect.pod_annotation())?
            .as_str()?;
        jobset_inplace::protocol::parse_epoch(raw).ok()
    }

    /// The pods of the JobSet that count: not failed, not terminating.
    pub(super) fn counted_pods(&self) -> Vec<Value> {
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

    pub(super) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(fut);
        lock(&self.tasks).push(handle.abort_handle());
    }

    /// The Job controller creates the pod of a position (a first pod or a replacement) and the
    /// kubelet starts it.
    pub(super) async fn create_pod(self: &Arc<Self>, slot: usize) -> Result<(), SimError> {
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
    pub(super) fn live_job_of(&self, slot: usize) -> Option<manifest::JobOwner> {
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
    pub(super) async fn create_job(self: &Arc<Self>, j: usize) -> Result<(), SimError> {
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
    pub(super) async fn release_counted_pods(&self) {
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
    pub(super) async fn sync_jobs(self: &Arc<Self>) {
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
    pub(super) async fn fail_jobset(&self, reason: &str, message: &str) {
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

    pub(super) fn jobset_failed(&self) -> Option<String> {
        let js: JobSet = self
            .server
            .get_as(&self.config.namespace, &self.config.jobset_name)?;
        js.conditions()
            .iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .map(|c| c.reason.clone().unwrap_or_default())
    }

    pub(super) fn stop_all(&self, why: &str) {
        if !*self.stop_tx.borrow() {
            self.log(format!("stopping every pod: {why}"));
            let _ = self.stop_tx.send(true);
        }
    }
}

/// The Job and JobSet controllers: replacement pods, pod failure policies, and the end of the
/// JobSet.
pub(super) async fn controllers(
    ctx: Arc<Ctx>,
    mut ended: mpsc::UnboundedReceiver<(PodInfo, PodEnd)>,
) {
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
pub(super) async fn jobset_status_writer(ctx: Arc<Ctx>) {
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
pub(super) type RunningReconciler = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), reconciler::Error>>,
);
