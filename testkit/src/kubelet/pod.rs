//! The kubelet of one simulated pod: starts the agent container (and, once its startup probe
//! answers, the worker), applies `restartPolicyRules` to every container exit, restarts all
//! containers in place when a rule says so, and reports the pod's end to the controllers.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::agents::AgentRun;
use super::manifest::{self, WORKER_CONTAINER};
use super::model::{self, PodModel};
use super::recognise::{self, RESTART_CONTAINER, restarts_pod, rule_action};
use super::status::StatusWriter;
use super::{AgentRunner, Ctx};
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
    /// The agent's startup probe reached its `failureThreshold`.
    ProbeGaveUp,
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
    probe_failure_threshold: u32,
    probe_timeout: Duration,
    /// User init containers and sidecars before the agent: (name, sidecar).
    users: Vec<(String, bool)>,
}

fn containers(spec: &Value) -> Option<Containers> {
    let agent = recognise::agent(spec)?;
    let probe_path = recognise::startup_probe_path(agent)
        .unwrap_or(agent_env::DEFAULT_BARRIER_PATH)
        .to_owned();
    let worker = recognise::regular_container(spec, WORKER_CONTAINER).cloned();
    Some(Containers {
        agent: agent.clone(),
        worker,
        probe_path,
        probe_failure_threshold: recognise::startup_probe_failure_threshold(agent),
        probe_timeout: recognise::startup_probe_timeout(agent),
        users: recognise::before_agent(spec),
    })
}

fn model_of(spec: &Containers) -> PodModel {
    PodModel::new(
        &spec.users,
        &container_name(&spec.agent),
        spec.worker.as_ref().map(|_| WORKER_CONTAINER),
    )
}

/// The user init containers and sidecars before the agent run, in order, as at every start of
/// the pod's containers (`computePodActions`: after a group restart every init container is
/// started again): each init container runs to completion, each sidecar starts. `false` when
/// the simulation stopped meanwhile.
async fn run_user_containers(
    ctx: &Ctx,
    model: &mut PodModel,
    status: &mut StatusWriter,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    for i in 0..model.users.len() {
        if let Some(u) = model.users.get_mut(i) {
            u.container.run();
        }
        status.set(model.json());
        tokio::select! {
            _ = tokio::time::sleep(ctx.config.user_container_time) => {}
            changed = stop.changed() => if changed.is_err() || *stop.borrow() {
                return false;
            },
        }
        if let Some(u) = model.users.get_mut(i) {
            if u.sidecar {
                u.container.started = true;
                u.container.ready = true;
            } else {
                u.container.terminate(0, "Completed");
            }
        }
    }
    true
}

async fn kubelet(
    ctx: &Arc<Ctx>,
    pod: &PodInfo,
    cmds: &mut mpsc::UnboundedReceiver<PodCmd>,
    status: &mut StatusWriter,
) -> PodEnd {
    let Some(spec) = containers(&pod.spec) else {
        ctx.log(format!("{}: the pod has no agent container", pod.name));
        return PodEnd::Failed {
            container: None,
            code: None,
            reason: "NoAgent".into(),
        };
    };
    let mut stop = ctx.stop_rx();
    let mut model = model_of(&spec);
    // The simulated worker survives an agent-only restart.
    let mut worker_running = false;
    // User init containers and sidecars run at the pod's start and after every group restart,
    // not when the agent restarts alone.
    let mut start_users = true;
    loop {
        if *stop.borrow() {
            model.end("Failed", None);
            status.write(model.json()).await;
            return PodEnd::Stopped;
        }
        if start_users {
            model.starting();
            if !run_user_containers(ctx, &mut model, status, &mut stop).await {
                continue;
            }
            start_users = false;
        }
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
        model.agent_runs();
        // Written before the probing starts: the pod at its barrier is served as such.
        status.write(model.json()).await;
        let mut probe = tokio::time::interval(ctx.config.probe_period);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probe_failures: u32 = 0;
        let mut probing: Option<futures::future::BoxFuture<'static, bool>> = None;
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
                    Some(PodCmd::WorkerExit(code)) => {
                        if worker_running {
                            let action = spec.worker.as_ref().and_then(|w| applied_rule(ctx, w, code));
                            if action.as_deref() == Some(RESTART_CONTAINER) {
                                // The worker alone restarts: what the protocol must never need.
                                ctx.worker_stopped(pod.slot);
                                if let Some(w) = model.worker.as_mut() {
                                    w.restart_alone(code, exit_reason(code));
                                    w.run();
                                    w.started = true;
                                    w.ready = true;
                                }
                                status.set(model.json());
                                ctx.worker_started(pod.slot, &pod.name);
                                continue;
                            }
                            worker_running = false;
                            ctx.worker_stopped(pod.slot);
                            break Exit::Worker(code);
                        }
                        ctx.log(format!("{}: no worker runs; exit {code} ignored", pod.name));
                    }
                },
                _ = probe.tick(), if !worker_running && probing.is_none() => {
                    probing = Some(agent.probe(&spec.probe_path, spec.probe_timeout));
                }
                passed = super::agents::in_flight(&mut probing), if probing.is_some() => {
                    probing = None;
                    if worker_running {
                        continue;
                    }
                    if passed {
                        worker_running = true;
                        ctx.worker_started(pod.slot, &pod.name);
                        model.worker_runs();
                        status.set(model.json());
                    } else {
                        probe_failures += 1;
                        if model::probe_gives_up(probe_failures, spec.probe_failure_threshold) {
                            break Exit::ProbeGaveUp;
                        }
                    }
                }
            }
        };
        match exit {
            Exit::Stopped => {
                ctx.worker_stopped(pod.slot);
                agent.stop(ctx.config.termination_grace).await;
                model.end("Failed", None);
                status.write(model.json()).await;
                return PodEnd::Stopped;
            }
            Exit::ProbeGaveUp => {
                // prober/worker.go: failureThreshold failures in a row; the kubelet kills the
                // agent container (the pod's grace) and restarts it alone, by its restartPolicy
                // (Always): the worker has not started, the other containers are left alone.
                ctx.log(format!(
                    "{}: the agent's startup probe gave up after {probe_failures} failures; the agent restarts alone",
                    pod.name
                ));
                let code = agent.stop(ctx.config.termination_grace).await;
                model.agent.restart_alone(code, exit_reason(code));
                status.set(model.json());
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
                // Its containers stopped, the pod is terminal: the kubelet says so, then deletes
                // it for good (the Job controller's finalizer keeps it until counted).
                model.end("Failed", None);
                status.write(model.json()).await;
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
                model.end("Failed", None);
                status.write(model.json()).await;
                return PodEnd::Failed {
                    container: None,
                    code: None,
                    reason: "NodeLost".into(),
                };
            }
            Exit::Agent(code) => {
                let action = applied_rule(ctx, &spec.agent, code);
                ctx.log(format!(
                    "{}: agent container exited {code} (rule: {})",
                    pod.name,
                    action.as_deref().unwrap_or("none")
                ));
                if action.as_deref().is_some_and(restarts_pod) {
                    worker_running = false;
                    model.agent.terminate(code, exit_reason(code));
                    restart_in_place(ctx, pod, &mut agent, &mut model, status).await;
                    start_users = true;
                } else if action.is_none() {
                    // restartPolicy Always: the sidecar alone restarts, the worker runs on.
                    ctx.log(format!("{}: the agent restarts alone", pod.name));
                    model.agent.restart_alone(code, exit_reason(code));
                    status.set(model.json());
                } else {
                    ctx.worker_stopped(pod.slot);
                    model.end("Failed", Some(code));
                    status.write(model.json()).await;
                    return PodEnd::Failed {
                        container: Some(container_name(&spec.agent)),
                        code: Some(code),
                        reason: "Error".into(),
                    };
                }
            }
            Exit::Worker(code) => {
                let action = spec
                    .worker
                    .as_ref()
                    .and_then(|w| applied_rule(ctx, w, code));
                ctx.log(format!(
                    "{}: worker exited {code} (rule: {})",
                    pod.name,
                    action.as_deref().unwrap_or("none")
                ));
                if let Some(w) = model.worker.as_mut() {
                    w.terminate(code, exit_reason(code));
                }
                if action.as_deref().is_some_and(restarts_pod) {
                    restart_in_place(ctx, pod, &mut agent, &mut model, status).await;
                    start_users = true;
                    continue;
                }
                // No rule with restartPolicy Never: the worker stays terminated,
                // the sidecar is stopped, and the pod ends.
                agent.stop(ctx.config.termination_grace).await;
                let phase = if code == 0 { "Succeeded" } else { "Failed" };
                model.end(phase, Some(code));
                status.write(model.json()).await;
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

/// RestartAllContainers (`kuberuntime_manager.go` `SyncPod`): the pod shows
/// `AllContainersRestarting` with the exited container as it ended; every container is killed
/// with the 2 s minimum grace and no preStop hook ([`model::in_place_kill_grace`]; the pod's
/// `terminationGracePeriodSeconds` is not honoured), and removed (with its logs: the
/// simulation's own log, [`super::Simulation::logs`], is the kubelet's, not the containers'):
/// each shows `waiting` `RestartingAllContainers` with `lastState` 137; after the simulated
/// restart time the caller starts them again in the same pod. Both statuses are awaited, as
/// the kubelet's status manager serves each of them.
async fn restart_in_place(
    ctx: &Ctx,
    pod: &PodInfo,
    agent: &mut AgentRun,
    model: &mut PodModel,
    status: &mut StatusWriter,
) {
    ctx.worker_stopped(pod.slot);
    model.restart_begins();
    status.write(model.json()).await;
    agent
        .stop(model::in_place_kill_grace(ctx.config.termination_grace))
        .await;
    model.all_removed();
    status.write(model.json()).await;
    tokio::time::sleep(ctx.config.restart_delay).await;
    ctx.restarted(pod.slot);
}

/// The action of the rule that covers `code`, as this kubelet applies it: without the gate
/// ([`super::SimConfig::restart_all_gate`]) a `RestartAllContainers` rule is ignored and the
/// container follows its own `restartPolicy` (the agent sidecar, `Always`, restarts alone; a
/// worker under the pod's `Never` stays terminated and the pod ends).
fn applied_rule(ctx: &Ctx, container: &Value, code: i32) -> Option<String> {
    rule_action(container, code).filter(|a| ctx.config.restart_all_gate || !restarts_pod(a))
}

/// The reason the kubelet gives a container that exited with `code`.
fn exit_reason(code: i32) -> &'static str {
    if code == 0 { "Completed" } else { "Error" }
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
