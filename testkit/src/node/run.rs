//! Running the node: registration, binding, each pod's loop

use super::*;

pub(super) fn now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap_or(Value::Null)
}

/// The node's watch of its namespace's pods: binds the unscheduled ones, starts the ones bound
/// to it, tells a pod's task when the pod is deleted.
pub(super) async fn run(
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
pub(super) async fn bind(shared: &Shared, name: &str, uid: &str) {
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

// ---------------------------------------------------------------------------------------------
// Running a pod: its token, its agent, its worker, its end
// ---------------------------------------------------------------------------------------------

pub(super) enum Exit {
    Agent(i32),
    Worker(i32),
    Deleted,
    Stopped,
}

/// A kubeconfig for the pod's agent: the API server and its CA, and a token of the pod's
/// service account bound to the pod, as the kubelet's projected token volume holds.
pub(super) async fn pod_kubeconfig(shared: &Shared, pod: &Value) -> Result<PathBuf, String> {
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
pub(super) async fn client_of(kubeconfig: &Path) -> Result<kube::Client, String> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    // As the agent builds its own (`agent::client`): one HTTP/2 connection to an https API
    // server, kube's retry layer off (the agent retries).
    jobset_inplace::agent::client::agent_client(config).map_err(|e| e.to_string())
}

pub(super) fn spawn_agent(
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
pub(super) async fn run_pod(
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
    let probe_timeout = recognise::startup_probe_timeout(&agent_spec);
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
        let mut probing: Option<futures::future::BoxFuture<'static, bool>> = None;
        // The status write that shows the worker running again, until the API server has it.
        let mut running_seq: Option<u64> = None;
        let exit = loop {
            tokio::select! {
                _ = status.wait_written(running_seq.unwrap_or_default()), if running_seq.is_some() => {
                    running_seq = None;
                    shared.running_written(&name);
                }
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
                _ = probe.tick(), if !st.agent.started && probing.is_none() => {
                    probing = Some(agent.probe(&probe_path, probe_timeout));
                }
                passed = crate::kubelet::agents::in_flight(&mut probing), if probing.is_some() => {
                    probing = None;
                    if !passed && !st.agent.started {
                        shared.probe_failed(&name, &uid, &probe_path);
                    }
                    if passed && !st.agent.started {
                        st.agent.started = true;
                        st.agent.ready = true;
                        if !worker_running {
                            worker_running = true;
                            st.worker.run(&st.uid.clone());
                            st.worker.started = true;
                            st.worker.ready = true;
                            st.phase = "Running";
                            let at = shared.started.elapsed();
                            shared.view(&name, |v| v.worker_started(at));
                            shared.log(format!("{name}: barrier lifted; worker started"));
                            running_seq = Some(status.set(&mut st));
                        } else {
                            status.set(&mut st);
                        }
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
                shared.forget_probe_events(&uid);
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
                shared.forget_probe_events(&uid);
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
                shared.forget_probe_events(&uid);
                status.write(&mut st, write_limit).await;
                return;
            }
        }
    }
}

/// The final delete of a pod whose containers are stopped (grace period 0, its UID as a
/// precondition), as the kubelet's status manager does it.
pub(super) async fn delete_for_good(shared: &Shared, name: &str, uid: &str) {
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
/// once and runs until the test makes it exit ([`Node::exit_worker`]). An exit that the worker's
/// `RestartAllContainers` rule covers restarts the pod in place as the kubelet does (the pod shows
/// `AllContainersRestarting`, the worker is removed and started again at once: no barrier holds
/// it; the floor of `scripts/scale.sh`); any other exit ends the pod (`restartPolicy: Never`:
/// what comes next is the Job's and the JobSet's, e.g. JobSet's own `Recreate` with the Job's
/// `backoffLimit: 0`). Deleted through the API, it is stopped, its terminal status written, and
/// it is deleted for good.
pub(super) async fn run_plain_pod(
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
    shared.view(&name, |v| {
        *v = PodView {
            name: name.clone(),
            uid: uid.clone(),
            ..PodView::default()
        };
    });
    loop {
        st.worker.run(&uid);
        st.worker.started = true;
        st.worker.ready = true;
        st.phase = "Running";
        let at = shared.started.elapsed();
        shared.view(&name, |v| v.worker_started(at));
        let mut running_seq = Some(status.set(&mut st));
        shared.log(format!("{name}: no agent; worker started"));
        let exit = loop {
            tokio::select! {
                _ = status.wait_written(running_seq.unwrap_or_default()), if running_seq.is_some() => {
                    running_seq = None;
                    shared.running_written(&name);
                }
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
        shared.view(&name, |v| v.worker_stopped(at));
        match exit {
            Exit::Deleted => {
                st.worker.terminate(143, "Error");
                st.phase = "Failed";
                shared.view(&name, |v| v.ended = true);
                status.write(&mut st, write_limit).await;
                delete_for_good(&shared, &name, &uid).await;
                return;
            }
            Exit::Worker(code) => {
                let reason = if code == 0 { "Completed" } else { "Error" };
                st.worker.terminate(code, reason);
                let action = applied_rule(&shared.config, &worker_spec, code);
                if action.as_deref().is_some_and(recognise::restarts_pod) {
                    shared.log(format!(
                        "{name}: worker exited {code} (rule: RestartAllContainers)"
                    ));
                    restart_all(&shared, &name, &mut st, &mut status, None).await;
                    continue;
                }
                st.phase = if code == 0 { "Succeeded" } else { "Failed" };
                shared.view(&name, |v| v.ended = true);
                shared.log(format!("{name}: worker exited {code}; the pod ends"));
                status.write(&mut st, write_limit).await;
                return;
            }
            Exit::Stopped | Exit::Agent(_) => {
                shared.view(&name, |v| v.ended = true);
                return;
            }
        }
    }
}

/// The action of the rule that covers `code`, as this kubelet applies it: without the gate
/// ([`NodeConfig::restart_all_gate`]) a `RestartAllContainers` rule is ignored.
pub(super) fn applied_rule(config: &NodeConfig, container: &Value, code: i32) -> Option<String> {
    rule_action(container, code).filter(|a| config.restart_all_gate || !recognise::restarts_pod(a))
}

/// `RestartAllContainers`: every container still running is stopped (the agent with its grace
/// period), the pod shows `AllContainersRestarting`, then every container starts again in the
/// same pod, restart counts up.
pub(super) async fn restart_all(
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
