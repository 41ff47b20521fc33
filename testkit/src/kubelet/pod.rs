//! The kubelet of one simulated pod: starts the agent container (and, once its startup probe
//! answers, the worker), applies `restartPolicyRules` to every container exit, restarts all
//! containers in place when a rule says so, and reports the pod's end to the controllers.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::agents::AgentRun;
use super::manifest::{self, WORKER_CONTAINER, WORKER_CONTROL_ENV};
use super::recognise::{self, RESTART_CONTAINER, restarts_pod, rule_action};
use super::status::StatusWriter;
use super::{AgentMode, AgentRunner, Ctx};
use jobset_inplace::wire::agent_env;

/// What a test (or the node) does to a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PodCmd {
    /// The worker exits with this code.
    WorkerExit(i32),
    /// SIGKILL to the agent container alone.
    KillAgent,
    /// The node is lost: everything dies, the pod fails.
    FailNode,
    /// The kubelet dies: nothing runs on the node any more and nothing updates the pod, which
    /// stays as it is in the API until it is deleted.
    KubeletDies,
    /// The pod was deleted (or marked failed) through the API: the kubelet stops its containers.
    Deleted,
}

/// How a pod ended, for the Job controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PodEnd {
    Failed {
        container: Option<String>,
        code: Option<i32>,
        reason: String,
    },
    Succeeded,
    /// Deleted through the API; its containers are stopped.
    Deleted,
    /// Stopped by the simulation (the JobSet finished, or the simulation ends).
    Stopped,
}

/// A pod as created.
#[derive(Clone, Debug)]
pub(crate) struct PodInfo {
    pub slot: usize,
    pub name: String,
    pub spec: Value,
    /// The barrier port its agent listens on (agents run as processes, sidecar mode).
    pub port: Option<u16>,
}

enum Exit {
    Agent(i32),
    Worker(i32),
    NodeLost,
    KubeletDead,
    Deleted,
    Stopped,
}

pub(crate) async fn run(ctx: Arc<Ctx>, pod: PodInfo, mut cmds: mpsc::UnboundedReceiver<PodCmd>) {
    let mut status = StatusWriter::start(&ctx, &pod.name);
    let end = kubelet(&ctx, &pod, &mut cmds, &mut status).await;
    ctx.pod_ended(&pod, end);
}

struct Containers {
    agent: Value,
    worker: Option<Value>,
    probe_path: String,
}

fn containers(ctx: &Ctx, spec: &Value) -> Option<Containers> {
    let agent = recognise::agent(spec)?;
    let probe_path = recognise::startup_probe_path(agent)
        .unwrap_or(agent_env::DEFAULT_BARRIER_PATH)
        .to_owned();
    let worker = match ctx.config.mode {
        AgentMode::Sidecar => recognise::regular_container(spec, WORKER_CONTAINER).cloned(),
        AgentMode::MainContainer => None,
    };
    Some(Containers {
        agent: agent.clone(),
        worker,
        probe_path,
    })
}

async fn kubelet(
    ctx: &Arc<Ctx>,
    pod: &PodInfo,
    cmds: &mut mpsc::UnboundedReceiver<PodCmd>,
    status: &mut StatusWriter,
) -> PodEnd {
    let Some(spec) = containers(ctx, &pod.spec) else {
        ctx.log(format!("{}: the pod has no agent container", pod.name));
        return PodEnd::Failed {
            container: None,
            code: None,
            reason: "NoAgent".into(),
        };
    };
    let mode = ctx.config.mode;
    let mut stop = ctx.stop_rx();
    let mut restart_count: i64 = 0;
    // The simulated worker (sidecar mode) survives an agent-only restart.
    let mut worker_running = false;
    loop {
        if *stop.borrow() {
            status
                .write(terminal(ctx, "Failed", restart_count, None))
                .await;
            return PodEnd::Stopped;
        }
        status.set(running(ctx, &spec, restart_count, worker_running, false));
        let Some(object) = ctx
            .server
            .get_shared("pods", &ctx.config.namespace, &pod.name)
        else {
            return PodEnd::Deleted;
        };
        let mut agent = match start_agent(ctx, pod, &spec, &object.value) {
            Ok(a) => a,
            Err(e) => {
                ctx.log(format!("{}: cannot start the agent: {e}", pod.name));
                return PodEnd::Failed {
                    container: Some(container_name(&spec.agent)),
                    code: None,
                    reason: "CreateContainerError".into(),
                };
            }
        };
        ctx.agent_started(pod.slot);
        let mut probe = tokio::time::interval(ctx.config.probe_period);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The worker's process group in main-container mode.
        let mut group: Option<i32> = None;
        let mut stdout = agent.take_stdout();
        let exit = loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break Exit::Stopped;
                    }
                }
                code = agent.wait() => break Exit::Agent(code),
                cmd = cmds.recv() => match cmd {
                    None => break Exit::Stopped,
                    Some(PodCmd::FailNode) => break Exit::NodeLost,
                    Some(PodCmd::KubeletDies) => break Exit::KubeletDead,
                    Some(PodCmd::Deleted) => break Exit::Deleted,
                    Some(PodCmd::KillAgent) => {
                        ctx.log(format!("{}: killing the agent container", pod.name));
                        agent.kill();
                    }
                    Some(PodCmd::WorkerExit(code)) => match mode {
                        AgentMode::Sidecar if worker_running => {
                            let action = spec.worker.as_ref().and_then(|w| rule_action(w, code));
                            if action.as_deref() == Some(RESTART_CONTAINER) {
                                // The worker alone restarts: what the protocol must never need.
                                ctx.worker_stopped(pod.slot);
                                ctx.worker_started(pod.slot, &pod.name);
                                continue;
                            }
                            worker_running = false;
                            ctx.worker_stopped(pod.slot);
                            break Exit::Worker(code);
                        }
                        AgentMode::Sidecar => {
                            ctx.log(format!("{}: no worker runs; exit {code} ignored", pod.name));
                        }
                        AgentMode::MainContainer => {
                            let path = ctx.control_file(&pod.name);
                            if let Err(e) = std::fs::write(&path, code.to_string()) {
                                ctx.log(format!("{}: cannot write {}: {e}", pod.name, path.display()));
                            }
                        }
                    },
                },
                _ = probe.tick(), if mode == AgentMode::Sidecar && !worker_running => {
                    if agent.probe(&spec.probe_path).await {
                        worker_running = true;
                        ctx.worker_started(pod.slot, &pod.name);
                        status.set(running(ctx, &spec, restart_count, true, false));
                    }
                }
                line = next_line(&mut stdout), if stdout.is_some() => {
                    if line.is_none() {
                        stdout = None;
                    }
                    if let Some(pid) = line.as_deref().and_then(|l| l.strip_prefix("worker-started ")).and_then(|p| p.trim().parse::<i32>().ok()) {
                        group = Some(pid);
                        ctx.worker_group(pid, true);
                        ctx.worker_started(pod.slot, &pod.name);
                        status.set(running(ctx, &spec, restart_count, true, false));
                    }
                }
            }
        };
        match exit {
            Exit::Stopped => {
                ctx.worker_stopped(pod.slot);
                agent.stop(ctx.config.termination_grace).await;
                kill_group(ctx, &mut group);
                status
                    .write(terminal(ctx, "Failed", restart_count, None))
                    .await;
                return PodEnd::Stopped;
            }
            Exit::KubeletDead => {
                // The node's processes are gone and nobody reports on the pod any more.
                ctx.log(format!(
                    "{}: kubelet dead; the pod stays as the API shows it",
                    pod.name
                ));
                ctx.worker_stopped(pod.slot);
                agent.kill();
                agent.wait().await;
                kill_group(ctx, &mut group);
                status.abandon();
                // Only what others write changes the pod now. Its Job replaces it once it has
                // failed (podReplacementPolicy: Failed): deleted alone, it stays `Terminating`
                // (the Job controller's finalizer) as long as nobody marks it failed.
                let mut look = tokio::time::interval(std::time::Duration::from_millis(20));
                loop {
                    tokio::select! {
                        changed = stop.changed() => {
                            if changed.is_err() || *stop.borrow() {
                                return PodEnd::Stopped;
                            }
                        }
                        cmd = cmds.recv() => if cmd.is_none() {
                            return PodEnd::Stopped;
                        },
                        _ = look.tick() => {
                            let object = ctx.server.get_shared("pods", &ctx.config.namespace, &pod.name);
                            let failed = object.as_ref().is_none_or(|o| {
                                o.value.pointer("/status/phase").and_then(serde_json::Value::as_str) == Some("Failed")
                            });
                            if failed {
                                return PodEnd::Deleted;
                            }
                        }
                    }
                }
            }
            Exit::Deleted => {
                ctx.worker_stopped(pod.slot);
                agent.stop(ctx.config.termination_grace).await;
                kill_group(ctx, &mut group);
                // Its containers stopped, the pod is terminal: the kubelet says so, then deletes
                // it for good (the Job controller's finalizer keeps it until counted).
                status
                    .write(terminal(ctx, "Failed", restart_count, None))
                    .await;
                status.abandon();
                let api: kube::Api<jobset_inplace::wire::WatchedPod> =
                    kube::Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
                let now = kube::api::DeleteParams {
                    grace_period_seconds: Some(0),
                    ..kube::api::DeleteParams::default()
                };
                let _ = api.delete(&pod.name, &now).await;
                return PodEnd::Deleted;
            }
            Exit::NodeLost => {
                ctx.log(format!("{}: node lost", pod.name));
                ctx.worker_stopped(pod.slot);
                agent.kill();
                agent.wait().await;
                kill_group(ctx, &mut group);
                status
                    .write(terminal(ctx, "Failed", restart_count, None))
                    .await;
                return PodEnd::Failed {
                    container: None,
                    code: None,
                    reason: "NodeLost".into(),
                };
            }
            Exit::Agent(code) => {
                // The container is gone, and every process in it.
                kill_group(ctx, &mut group);
                let action = rule_action(&spec.agent, code);
                ctx.log(format!(
                    "{}: agent container exited {code} (rule: {})",
                    pod.name,
                    action.as_deref().unwrap_or("none")
                ));
                let restarts_all = action.as_deref().is_some_and(restarts_pod);
                let restarts_self = action.as_deref() == Some(RESTART_CONTAINER);
                match mode {
                    AgentMode::Sidecar if restarts_all => {
                        worker_running = false;
                        restart_in_place(ctx, pod, &spec, &mut agent, restart_count, status).await;
                        restart_count += 1;
                    }
                    AgentMode::Sidecar if action.is_none() => {
                        // restartPolicy Always: the sidecar alone restarts, the worker runs on.
                        ctx.log(format!("{}: the agent restarts alone", pod.name));
                    }
                    AgentMode::MainContainer if restarts_all || restarts_self => {
                        ctx.worker_stopped(pod.slot);
                        restart_in_place(ctx, pod, &spec, &mut agent, restart_count, status).await;
                        restart_count += 1;
                    }
                    AgentMode::MainContainer if code == 0 => {
                        ctx.worker_stopped(pod.slot);
                        status
                            .write(terminal(ctx, "Succeeded", restart_count, Some(0)))
                            .await;
                        return PodEnd::Succeeded;
                    }
                    _ => {
                        ctx.worker_stopped(pod.slot);
                        status
                            .write(terminal(ctx, "Failed", restart_count, Some(code)))
                            .await;
                        return PodEnd::Failed {
                            container: Some(container_name(&spec.agent)),
                            code: Some(code),
                            reason: "Error".into(),
                        };
                    }
                }
            }
            Exit::Worker(code) => {
                let action = spec.worker.as_ref().and_then(|w| rule_action(w, code));
                ctx.log(format!(
                    "{}: worker exited {code} (rule: {})",
                    pod.name,
                    action.as_deref().unwrap_or("none")
                ));
                if action.as_deref().is_some_and(restarts_pod) {
                    restart_in_place(ctx, pod, &spec, &mut agent, restart_count, status).await;
                    restart_count += 1;
                    continue;
                }
                // Terminate, or no rule with restartPolicy Never: the worker stays terminated,
                // the sidecar is stopped, and the pod ends.
                agent.stop(ctx.config.termination_grace).await;
                let phase = if code == 0 { "Succeeded" } else { "Failed" };
                status
                    .write(terminal(ctx, phase, restart_count, Some(code)))
                    .await;
                return if code == 0 {
                    PodEnd::Succeeded
                } else {
                    PodEnd::Failed {
                        container: Some(WORKER_CONTAINER.to_owned()),
                        code: Some(code),
                        reason: "Error".into(),
                    }
                };
            }
        }
    }
}

async fn next_line(rx: &mut Option<mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn kill_group(ctx: &Ctx, group: &mut Option<i32>) {
    if let Some(pid) = group.take() {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        ctx.worker_group(pid, false);
    }
}

/// RestartAllContainers: every container is stopped (the agent with its grace period), the
/// pod shows `AllContainersRestarting`, and after the simulated restart time the caller starts
/// them again in the same pod.
async fn restart_in_place(
    ctx: &Ctx,
    pod: &PodInfo,
    spec: &Containers,
    agent: &mut AgentRun,
    restart_count: i64,
    status: &mut StatusWriter,
) {
    ctx.worker_stopped(pod.slot);
    status.set(running(ctx, spec, restart_count, false, true));
    agent.stop(ctx.config.termination_grace).await;
    tokio::time::sleep(ctx.config.restart_delay).await;
    ctx.restarted(pod.slot);
}

fn start_agent(
    ctx: &Arc<Ctx>,
    pod: &PodInfo,
    spec: &Containers,
    object: &Value,
) -> Result<AgentRun, String> {
    let mut env = manifest::resolve_env(&spec.agent, object);
    let mut set = |name: &str, value: String| {
        env.retain(|(n, _)| n != name);
        env.push((name.to_owned(), value));
    };
    if let Some(port) = pod.port {
        set(agent_env::BARRIER_PORT, port.to_string());
    }
    if ctx.config.mode == AgentMode::MainContainer {
        set(
            WORKER_CONTROL_ENV,
            ctx.control_file(&pod.name).display().to_string(),
        );
    }
    // An agent cut from the API talks to a listener that closes every connection.
    let cut = ctx.api_cut(&pod.name);
    if cut {
        ctx.log(format!("{}: its agent cannot reach the API", pod.name));
    }
    match &ctx.config.agents {
        AgentRunner::Binary(binary) => {
            let url = if cut {
                ctx.black_hole.0.clone()
            } else {
                ctx.server.url()
            };
            set(agent_env::API_URL, url);
            set(
                "JOBSET_INPLACE_LOG_LEVEL",
                ctx.config.agent_log_level.clone(),
            );
            set("NO_COLOR", "1".to_owned());
            let barrier = pod
                .port
                .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p)));
            AgentRun::spawn_process(binary, &env, barrier, ctx.log_sink(), pod.name.clone())
                .map_err(|e| e.to_string())
        }
        AgentRunner::InProcess => {
            let client = if cut {
                ctx.black_hole.1.clone()
            } else {
                ctx.agent_client.clone()
            };
            AgentRun::spawn_in_process(client, &env, ctx.config.dialect).map_err(|e| e.to_string())
        }
    }
}

fn container_name(c: &Value) -> String {
    c.get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn container_status(name: &str, restart_count: i64, state: Value, ready: bool) -> Value {
    json!({"name": name, "restartCount": restart_count, "ready": ready, "started": ready, "state": state})
}

/// The status of a running pod (its containers running or starting).
fn running(
    ctx: &Ctx,
    spec: &Containers,
    restart_count: i64,
    worker_running: bool,
    restarting: bool,
) -> Value {
    let flag = |b: bool| if b { "True" } else { "False" };
    let agent_name = container_name(&spec.agent);
    let run = json!({"running": {}});
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            {"type": "AllContainersRestarting", "status": flag(restarting)},
            {"type": "Ready", "status": flag(worker_running && !restarting)}
        ],
    });
    match ctx.config.mode {
        AgentMode::Sidecar => {
            status["initContainerStatuses"] = json!([container_status(
                &agent_name,
                restart_count,
                run.clone(),
                worker_running
            )]);
            let worker_state = if worker_running {
                run
            } else {
                json!({"waiting": {"reason": "PodInitializing"}})
            };
            status["containerStatuses"] = json!([container_status(
                WORKER_CONTAINER,
                restart_count,
                worker_state,
                worker_running
            )]);
        }
        AgentMode::MainContainer => {
            status["containerStatuses"] = json!([container_status(
                &agent_name,
                restart_count,
                run,
                worker_running
            )]);
        }
    }
    status
}

/// The status of an ended pod.
fn terminal(ctx: &Ctx, phase: &str, restart_count: i64, code: Option<i32>) -> Value {
    let name = match ctx.config.mode {
        AgentMode::Sidecar => WORKER_CONTAINER,
        AgentMode::MainContainer => manifest::MAIN_AGENT_CONTAINER,
    };
    let state = json!({"terminated": {"exitCode": code.unwrap_or(137)}});
    json!({
        "phase": phase,
        "conditions": [{"type": "AllContainersRestarting", "status": "False"},
                       {"type": "Ready", "status": "False"}],
        "containerStatuses": [container_status(name, restart_count, state, false)],
    })
}
