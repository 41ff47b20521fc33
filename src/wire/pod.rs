//! A pod as the reconciler and the agent read it from the API server: the few fields of the wire
//! format the epoch protocol needs (docs/protocol.md, "Pods").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::agent_env;
use crate::protocol::{
    ALL_CONTAINERS_RESTARTING, ContainerRun, Dialect, JOBSET_NAME_LABEL, OldWorkers, PodView,
    old_workers,
};

/// The `restartPolicyRules` action that restarts every container of the pod.
const RESTART_ALL_CONTAINERS: &str = "RestartAllContainers";

/// A pod as the reconciler and the agent watch it: metadata, its node and which init container
/// restarts the whole pod, phase and container restart counts and start times, nothing else
/// (10,000 full pods would cost far more memory and parse time).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<WatchedPodSpec>,
    #[serde(default)]
    pub status: Option<WatchedPodStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPodSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub init_containers: Option<Vec<WatchedInitContainer>>,
}

/// An init container: its name, and whether one of its rules restarts the whole pod.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedInitContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub restart_policy_rules: Option<Vec<WatchedRule>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedRule {
    #[serde(default)]
    pub action: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub container_statuses: Option<Vec<RestartCount>>,
    #[serde(default)]
    pub init_container_statuses: Option<Vec<RestartCount>>,
    #[serde(default)]
    pub conditions: Option<Vec<WatchedCondition>>,
}

/// A pod condition: its type and status, nothing else (the reconciler reads one,
/// [`ALL_CONTAINERS_RESTARTING`]).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedCondition {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartCount {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default)]
    pub state: Option<WatchedState>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedState {
    #[serde(default)]
    pub running: Option<WatchedRunning>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedRunning {
    /// Kept as the text: a time that does not parse reads as no start time, not as a pod that
    /// cannot be read.
    #[serde(default)]
    pub started_at: Option<String>,
}

impl RestartCount {
    fn run(&self) -> ContainerRun {
        let running = self.state.as_ref().and_then(|s| s.running.as_ref());
        ContainerRun {
            restart_count: self.restart_count,
            running_since: running.and_then(|r| {
                let at = r.started_at.as_deref()?;
                Some(at.parse::<k8s_openapi::jiff::Timestamp>().ok()?.as_second())
            }),
        }
    }
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl WatchedPod {
    /// The JobSet this pod belongs to, from its label: `(namespace, JobSet name)`.
    pub fn jobset_key(&self) -> Option<(String, String)> {
        let ns = self.metadata.namespace.clone()?;
        let name = self
            .metadata
            .labels
            .as_ref()?
            .get(JOBSET_NAME_LABEL)?
            .clone();
        Some((ns, name))
    }

    /// What the algorithm reads of this pod.
    pub fn view(&self, dialect: Dialect) -> PodView {
        let status = self.status.as_ref();
        let max_restart_count = status
            .into_iter()
            .flat_map(|s| {
                s.container_statuses
                    .iter()
                    .chain(s.init_container_statuses.iter())
                    .flatten()
            })
            .map(|c| c.restart_count)
            .max()
            .unwrap_or(0);
        PodView {
            name: self.metadata.name.clone().unwrap_or_default(),
            uid: self.metadata.uid.clone().unwrap_or_default(),
            failed: status.and_then(|s| s.phase.as_deref()) == Some("Failed"),
            terminating: self.metadata.deletion_timestamp.is_some(),
            epoch_annotation: self
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(dialect.pod_annotation()))
                .cloned(),
            max_restart_count,
            counted_in_last_sync: false,
            old_workers: self.old_workers(),
            node: self
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            restart_begun: false,
        }
    }

    /// Its [`ALL_CONTAINERS_RESTARTING`] condition: `Some(true)` or `Some(false)` as the kubelet
    /// wrote it, `None` when absent (or neither `True` nor `False`).
    pub fn all_containers_restarting(&self) -> Option<bool> {
        let condition = self
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == ALL_CONTAINERS_RESTARTING)?;
        match condition.status.as_str() {
            "True" => Some(true),
            "False" => Some(false),
            _ => None,
        }
    }

    /// The name of the pod's agent sidecar: the init container named as the injected agent, or
    /// one whose rule restarts the whole pod (as admission finds it, `admission::pod`).
    fn agent_sidecar(&self) -> Option<&str> {
        let inits = self.spec.as_ref()?.init_containers.as_ref()?;
        let restarts_pod = |c: &&WatchedInitContainer| {
            c.restart_policy_rules
                .iter()
                .flatten()
                .any(|r| r.action.as_deref() == Some(RESTART_ALL_CONTAINERS))
        };
        inits
            .iter()
            .find(|c| c.name == agent_env::CONTAINER_NAME)
            .or_else(|| inits.iter().find(restarts_pod))
            .map(|c| c.name.as_str())
    }

    /// Whether the agent sidecar restarted without the workers ([`old_workers`]).
    fn old_workers(&self) -> OldWorkers {
        let (Some(name), Some(status)) = (self.agent_sidecar(), self.status.as_ref()) else {
            return OldWorkers::No;
        };
        let agent = status
            .init_container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .map(RestartCount::run);
        let workers: Vec<ContainerRun> = status
            .container_statuses
            .iter()
            .flatten()
            .map(RestartCount::run)
            .collect();
        old_workers(agent, &workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(agent: &str, rules: bool, statuses: serde_json::Value) -> WatchedPod {
        let mut init = json!({"name": agent, "restartPolicy": "Always"});
        if rules {
            init["restartPolicyRules"] = json!([{"action": "RestartAllContainers",
                "exitCodes": {"operator": "NotIn", "values": [0]}}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"nodeName": "node-1",
                     "initContainers": [{"name": "log", "restartPolicy": "Always"}, init],
                     "containers": [{"name": "worker"}]},
            "status": statuses,
        }))
        .expect("pod")
    }

    fn running(name: &str, restarts: i32, at: &str) -> serde_json::Value {
        json!({"name": name, "restartCount": restarts, "state": {"running": {"startedAt": at}}})
    }

    #[test]
    fn an_agent_that_restarted_after_its_running_worker_is_seen() {
        let alone = json!({
            "initContainerStatuses": [running("log", 0, "2026-01-01T00:00:00Z"),
                                      running(agent_env::CONTAINER_NAME, 1, "2026-01-01T00:00:09Z")],
            "containerStatuses": [running("worker", 0, "2026-01-01T00:00:02Z")]});
        let view = pod(agent_env::CONTAINER_NAME, false, alone.clone()).view(Dialect::Epoch);
        assert_eq!(view.old_workers, OldWorkers::AgentRestartedAlone);
        assert_eq!(view.node, "node-1");
        // A declared agent, found by its rule.
        let renamed = serde_json::to_string(&alone)
            .expect("json")
            .replace(agent_env::CONTAINER_NAME, "mine");
        let renamed: serde_json::Value = serde_json::from_str(&renamed).expect("json");
        assert_eq!(
            pod("mine", true, renamed.clone())
                .view(Dialect::Epoch)
                .old_workers,
            OldWorkers::AgentRestartedAlone
        );
        // Neither named nor restarting the pod: not the agent (a user sidecar may restart alone).
        assert_eq!(
            pod("mine", false, renamed).view(Dialect::Epoch).old_workers,
            OldWorkers::No
        );
        // The user sidecar restarting alone is not the agent's.
        let sidecar = json!({
            "initContainerStatuses": [running("log", 3, "2026-01-01T00:00:09Z"),
                                      running(agent_env::CONTAINER_NAME, 0, "2026-01-01T00:00:00Z")],
            "containerStatuses": [running("worker", 0, "2026-01-01T00:00:02Z")]});
        assert_eq!(
            pod(agent_env::CONTAINER_NAME, false, sidecar)
                .view(Dialect::Epoch)
                .old_workers,
            OldWorkers::No
        );
    }

    #[test]
    fn an_agent_down_beside_a_running_worker_holds_and_bad_times_read_as_not_running() {
        let down = json!({
            "initContainerStatuses": [{"name": agent_env::CONTAINER_NAME, "restartCount": 0,
                "state": {"terminated": {"exitCode": 42}}}],
            "containerStatuses": [running("worker", 0, "2026-01-01T00:00:02Z")]});
        assert_eq!(
            pod(agent_env::CONTAINER_NAME, false, down)
                .view(Dialect::Epoch)
                .old_workers,
            OldWorkers::AgentDown
        );
        let garbled = json!({
            "initContainerStatuses": [running(agent_env::CONTAINER_NAME, 1, "2026-01-01T00:00:09Z")],
            "containerStatuses": [running("worker", 0, "yesterday")]});
        let view = pod(agent_env::CONTAINER_NAME, false, garbled).view(Dialect::Epoch);
        assert_eq!(view.old_workers, OldWorkers::No);
        // A pod without spec or status reads as nothing wrong.
        let bare: WatchedPod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("pod");
        assert_eq!(bare.view(Dialect::Epoch).old_workers, OldWorkers::No);
    }
}
