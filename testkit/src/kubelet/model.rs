//! What the simulated kubelet reports of one pod, as kubelet v1.35.4 reports it (read from its
//! source in `k8s.io/kubernetes@v1.35.4/pkg/kubelet/`, and checked against a real kubelet:
//! docs/testing.md "Real node", [`crate::kubelet::transitions::REAL_KUBELET_GROUP_RESTART`]):
//!
//! - a group restart (`RestartAllContainers`) first shows `AllContainersRestarting=True` with the
//!   exited container terminated and the others as they were; then every container is removed
//!   and shows `waiting` `RestartingAllContainers`, `lastState.terminated` overwritten with reason
//!   `RestartingAllContainers` and exit code 137, `restartCount` one up
//!   (`kubelet_pods.go` `convertToAPIContainerStatuses`); the phase stays `Running` meanwhile;
//! - once containers start again the phase is `Pending` until the regular containers run again
//!   (`kubelet_pods.go` `getPhase`: a regular container waiting, `PodInitializing`), while user
//!   init containers re-run and while the agent waits at its barrier; a container running again
//!   has an empty `lastState` (the removed container's status is gone with it);
//! - `Initialized` stays True once it was (`status/generate.go`
//!   `GeneratePodInitializedCondition`: "once a pod is initialized, it cannot be uninitialized");
//! - a container restarted alone (its own `Restart` rule or `restartPolicy: Always`, or a
//!   startup probe that gave up: `prober/worker.go`, `kuberuntime_manager.go`
//!   `computePodActions`) keeps what ended as `lastState`, its own `restartCount` one up, the
//!   other containers untouched.

use serde_json::{Value, json};

/// The reason and the exit code the kubelet writes for a container removed by a group restart
/// (`kubelet_pods.go`: `RestartingAllContainers`, 137).
pub const RESTARTING_ALL_CONTAINERS: &str = "RestartingAllContainers";
pub const RESTARTING_EXIT_CODE: i32 = 137;

/// The grace period every container gets when a `RestartAllContainers` rule fires:
/// `kuberuntime_manager.go` `SyncPod` kills each container with a grace override of 0, which
/// `kuberuntime_container.go` `killContainer` raises to `minimumGracePeriodInSeconds` (2 s);
/// the preStop hook only runs with a grace above 0, so it does not run. The pod's
/// `terminationGracePeriodSeconds` is not read.
pub fn in_place_kill_grace(_pod_termination_grace: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(2)
}

/// Whether the preStop hook runs when a container is killed with this grace override
/// (`killContainer`: only with a grace above 0).
pub fn pre_stop_runs(grace_override_seconds: i64) -> bool {
    grace_override_seconds > 0
}

/// The startup probe gave up: `failureThreshold` failures in a row (`prober/worker.go`
/// `doProbe`), after which the kubelet kills the container and restarts it alone, by its
/// `restartPolicy` (`computePodActions`).
pub fn probe_gives_up(failures_in_a_row: u32, failure_threshold: u32) -> bool {
    failures_in_a_row >= failure_threshold.max(1)
}

/// The time now as the API shows a container's `startedAt`: RFC 3339, whole seconds.
fn now_in_seconds() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// One container's status.
#[derive(Clone, Debug)]
pub struct ContainerModel {
    pub name: String,
    pub restarts: i64,
    pub state: Value,
    pub last: Value,
    pub started: bool,
    pub ready: bool,
}

impl ContainerModel {
    pub fn new(name: &str) -> Self {
        ContainerModel {
            name: name.to_owned(),
            restarts: 0,
            state: json!({"waiting": {"reason": "PodInitializing"}}),
            last: json!({}),
            started: false,
            ready: false,
        }
    }

    pub fn running(&self) -> bool {
        self.state.get("running").is_some()
    }

    /// A new container of this name runs. After a group restart the removed container's
    /// status is gone: `lastState` is empty again.
    pub fn run(&mut self) {
        if self
            .last
            .pointer("/terminated/reason")
            .and_then(Value::as_str)
            == Some(RESTARTING_ALL_CONTAINERS)
        {
            self.last = json!({});
        }
        self.state = json!({"running": {"startedAt": now_in_seconds()}});
    }

    pub fn terminate(&mut self, code: i32, reason: &str) {
        self.state = json!({"terminated": {"exitCode": code, "reason": reason}});
        self.started = false;
        self.ready = false;
    }

    /// Removed by a group restart (`convertToAPIContainerStatuses`).
    pub fn remove(&mut self) {
        self.state = json!({"waiting": {"reason": RESTARTING_ALL_CONTAINERS}});
        self.last = json!({"terminated": {"exitCode": RESTARTING_EXIT_CODE,
                                          "reason": RESTARTING_ALL_CONTAINERS}});
        self.restarts += 1;
        self.started = false;
        self.ready = false;
    }

    /// Restarted alone after it ended (`code`, `reason`): what ended is `lastState`.
    pub fn restart_alone(&mut self, code: i32, reason: &str) {
        self.terminate(code, reason);
        self.last = self.state.clone();
        self.restarts += 1;
        self.state = json!({"waiting": {"reason": "PodInitializing"}});
    }

    fn json(&self) -> Value {
        json!({"name": self.name, "restartCount": self.restarts, "ready": self.ready,
               "started": self.started, "state": self.state, "lastState": self.last})
    }
}

/// One user init container or sidecar placed before the agent.
#[derive(Clone, Debug)]
pub struct UserContainer {
    pub container: ContainerModel,
    /// `restartPolicy: Always` (a sidecar): keeps running; else it runs to completion.
    pub sidecar: bool,
}

/// The status of one pod as its kubelet knows it.
#[derive(Clone, Debug)]
pub struct PodModel {
    pub phase: &'static str,
    pub users: Vec<UserContainer>,
    pub agent: ContainerModel,
    /// The worker container.
    pub worker: Option<ContainerModel>,
    /// The worker runs.
    pub worker_running: bool,
    /// `AllContainersRestarting`.
    pub restarting: bool,
    initialized: bool,
}

impl PodModel {
    pub fn new(users: &[(String, bool)], agent: &str, worker: Option<&str>) -> Self {
        PodModel {
            phase: "Pending",
            users: users
                .iter()
                .map(|(name, sidecar)| UserContainer {
                    container: ContainerModel::new(name),
                    sidecar: *sidecar,
                })
                .collect(),
            agent: ContainerModel::new(agent),
            worker: worker.map(ContainerModel::new),
            worker_running: false,
            restarting: false,
            initialized: false,
        }
    }

    /// The agent container runs; the pod is `Pending` until the worker runs (`getPhase`).
    pub fn agent_runs(&mut self) {
        self.agent.run();
        self.note_initialized();
    }

    /// A container starts again after a group restart, or for the first time: `Pending` while
    /// the regular containers do not run.
    pub fn starting(&mut self) {
        // The removed containers are new ones not started yet (`PodInitializing`); their
        // `lastState` stays until they run.
        let removed = json!({"waiting": {"reason": RESTARTING_ALL_CONTAINERS}});
        for c in self
            .users
            .iter_mut()
            .map(|u| &mut u.container)
            .chain(std::iter::once(&mut self.agent))
            .chain(self.worker.as_mut())
        {
            if c.state == removed {
                c.state = json!({"waiting": {"reason": "PodInitializing"}});
            }
        }
        if !self.worker.as_ref().is_some_and(ContainerModel::running) {
            self.phase = "Pending";
        }
    }

    /// The startup probe answered: the agent is started and the worker runs.
    pub fn worker_runs(&mut self) {
        self.worker_running = true;
        self.agent.started = true;
        self.agent.ready = true;
        if let Some(w) = self.worker.as_mut() {
            w.run();
            w.started = true;
            w.ready = true;
        }
        self.phase = "Running";
        self.note_initialized();
    }

    fn note_initialized(&mut self) {
        let users_done = self
            .users
            .iter()
            .all(|u| u.container.started || u.container.state.get("terminated").is_some());
        if users_done && self.agent.started {
            self.initialized = true;
        }
    }

    /// A group restart begins: `AllContainersRestarting`, the exited container as it ended.
    pub fn restart_begins(&mut self) {
        self.restarting = true;
        self.worker_running = false;
    }

    /// Every container removed (the grace period over): each `waiting`
    /// `RestartingAllContainers`, `lastState` 137, one restart more; the condition False again.
    pub fn all_removed(&mut self) {
        for u in &mut self.users {
            u.container.remove();
        }
        self.agent.remove();
        if let Some(w) = self.worker.as_mut() {
            w.remove();
        }
        self.restarting = false;
        self.worker_running = false;
    }

    /// The pod ended: `phase`, the exited container's `code` (`None`: stopped, 137).
    pub fn end(&mut self, phase: &'static str, code: Option<i32>) {
        self.phase = phase;
        self.restarting = false;
        self.worker_running = false;
        let code = code.unwrap_or(RESTARTING_EXIT_CODE);
        let reason = if code == 0 { "Completed" } else { "Error" };
        if let Some(c) = self.worker.as_mut() {
            c.terminate(code, reason);
        }
        for c in self
            .users
            .iter_mut()
            .map(|u| &mut u.container)
            .chain(std::iter::once(&mut self.agent))
        {
            if c.running() {
                c.terminate(0, "Completed");
            }
        }
    }

    /// The whole status, as the kubelet's status manager writes it.
    pub fn json(&self) -> Value {
        let flag = |b: bool| if b { "True" } else { "False" };
        let terminal = matches!(self.phase, "Failed" | "Succeeded");
        let ready = !terminal
            && !self.restarting
            && self.worker_running
            && self.agent.ready
            && self.worker.as_ref().is_none_or(|w| w.ready);
        let mut init: Vec<Value> = self.users.iter().map(|u| u.container.json()).collect();
        init.push(self.agent.json());
        let regular: Vec<Value> = self.worker.iter().map(ContainerModel::json).collect();
        let mut status = json!({
            "phase": self.phase,
            "conditions": [
                {"type": "Initialized", "status": flag(self.initialized)},
                {"type": "Ready", "status": flag(ready)},
                {"type": "ContainersReady", "status": flag(ready)},
                {"type": "AllContainersRestarting", "status": flag(self.restarting && !terminal)}
            ],
            "containerStatuses": regular,
        });
        if !init.is_empty() {
            status["initContainerStatuses"] = Value::Array(init);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn condition(s: &Value, kind: &str) -> String {
        s["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
            .and_then(|c| c["status"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    fn running_pod() -> PodModel {
        let mut m = PodModel::new(&[], "agent", Some("worker"));
        m.starting();
        m.agent_runs();
        m.worker_runs();
        m
    }

    #[test]
    fn an_in_place_restart_kills_with_two_seconds_and_no_pre_stop() {
        assert_eq!(
            in_place_kill_grace(Duration::from_secs(30)),
            Duration::from_secs(2)
        );
        assert!(!pre_stop_runs(0), "SyncPod's override is 0: no preStop");
    }

    #[test]
    fn the_startup_probe_gives_up_at_its_failure_threshold() {
        assert!(!probe_gives_up(2, 3));
        assert!(probe_gives_up(3, 3));
        assert!(
            probe_gives_up(1, 0),
            "a threshold of 0 is defaulted up to 1"
        );
    }

    #[test]
    fn a_first_start_is_pending_and_not_initialized_until_the_barrier_lifts() {
        let mut m = PodModel::new(&[], "agent", Some("worker"));
        m.starting();
        m.agent_runs();
        let s = m.json();
        assert_eq!(s["phase"], "Pending");
        assert_eq!(condition(&s, "Initialized"), "False");
        m.worker_runs();
        let s = m.json();
        assert_eq!(s["phase"], "Running");
        assert_eq!(condition(&s, "Initialized"), "True");
        assert_eq!(condition(&s, "Ready"), "True");
    }

    #[test]
    fn a_group_restart_shows_what_the_real_kubelet_shows() {
        let mut m = running_pod();
        // The worker exits 3: AllContainersRestarting, the worker terminated as it ended.
        if let Some(w) = m.worker.as_mut() {
            w.terminate(3, "Error");
        }
        m.restart_begins();
        let s = m.json();
        assert_eq!(
            (
                s["phase"].as_str(),
                condition(&s, "AllContainersRestarting")
            ),
            (Some("Running"), "True".to_owned())
        );
        assert_eq!(
            s["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            3
        );
        // Every container removed: waiting RestartingAllContainers, lastState 137, counts up.
        m.all_removed();
        let s = m.json();
        assert_eq!(s["phase"], "Running");
        assert_eq!(condition(&s, "AllContainersRestarting"), "False");
        for c in [&s["initContainerStatuses"][0], &s["containerStatuses"][0]] {
            assert_eq!(c["restartCount"], 1);
            assert_eq!(c["state"]["waiting"]["reason"], RESTARTING_ALL_CONTAINERS);
            assert_eq!(
                c["lastState"]["terminated"]["reason"],
                RESTARTING_ALL_CONTAINERS
            );
            assert_eq!(c["lastState"]["terminated"]["exitCode"], 137);
        }
        // The agent runs again, at its barrier: Pending, Initialized still True.
        m.starting();
        m.agent_runs();
        let s = m.json();
        assert_eq!(s["phase"], "Pending");
        assert_eq!(condition(&s, "Initialized"), "True");
        assert_eq!(s["initContainerStatuses"][0]["lastState"], json!({}));
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "PodInitializing"
        );
        assert_eq!(
            s["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
            137
        );
        m.worker_runs();
        let s = m.json();
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["containerStatuses"][0]["lastState"], json!({}));
    }

    #[test]
    fn user_init_containers_re_run_pending_and_count_restarts() {
        let users = [("setup".to_owned(), false), ("proxy".to_owned(), true)];
        let mut m = PodModel::new(&users, "agent", Some("worker"));
        m.starting();
        m.users[0].container.run();
        m.users[0].container.terminate(0, "Completed");
        m.users[1].container.run();
        m.users[1].container.started = true;
        m.agent_runs();
        m.worker_runs();
        m.restart_begins();
        m.all_removed();
        m.starting();
        m.users[0].container.run();
        let s = m.json();
        assert_eq!(s["phase"], "Pending");
        assert_eq!(condition(&s, "Initialized"), "True");
        let names: Vec<_> = s["initContainerStatuses"]
            .as_array()
            .map(|a| a.iter().map(|c| c["name"].clone()).collect())
            .unwrap_or_default();
        assert_eq!(names, [json!("setup"), json!("proxy"), json!("agent")]);
        assert!(
            s["initContainerStatuses"]
                .as_array()
                .is_some_and(|a| a.iter().all(|c| c["restartCount"] == 1))
        );
    }

    #[test]
    fn a_container_restarted_alone_keeps_what_ended_and_leaves_the_others() {
        let mut m = running_pod();
        m.agent.restart_alone(1, "Error");
        let s = m.json();
        let agent = &s["initContainerStatuses"][0];
        assert_eq!(agent["restartCount"], 1);
        assert_eq!(agent["lastState"]["terminated"]["exitCode"], 1);
        assert_eq!(s["containerStatuses"][0]["restartCount"], 0);
        assert!(s["containerStatuses"][0]["state"]["running"].is_object());
    }
}
