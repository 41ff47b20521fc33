//! What the simulated kubelet reads of a pod spec, written from the Kubernetes API as a kubelet
//! reads it (container lists, names, env, `restartPolicyRules`, the startup probe) and not from
//! the product's admission code: the simulator must not trust the code it tests. It finds the
//! agent as the injection leaves it: a native sidecar whose exit restarts the whole pod (or that
//! carries the agent's container name).

use jobset_inplace::wire::agent_env;
use serde_json::Value;

/// The restart rule action that restarts every container of the pod in place (Kubernetes 1.35).
pub const RESTART_ALL_CONTAINERS: &str = "RestartAllContainers";
/// KEP-467's spelling of [`RESTART_ALL_CONTAINERS`].
pub const RESTART_POD: &str = "RestartPod";
/// The restart rule action that restarts only the exiting container.
pub const RESTART_CONTAINER: &str = "Restart";

/// The containers of one list of a pod spec (`initContainers` or `containers`).
fn list<'a>(spec: &'a Value, key: &str) -> &'a [Value] {
    spec.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A container's `restartPolicyRules`.
fn rules(container: &Value) -> &[Value] {
    list(container, "restartPolicyRules")
}

/// The rule's exit codes cover `code` (`In` or `NotIn`; any other operator covers nothing).
fn covers(rule: &Value, code: i64) -> bool {
    let codes = &rule["exitCodes"];
    let listed = codes["values"]
        .as_array()
        .is_some_and(|v| v.iter().any(|c| c.as_i64() == Some(code)));
    match codes["operator"].as_str() {
        Some("In") => listed,
        Some("NotIn") => !listed,
        _ => false,
    }
}

/// The action restarts the whole pod in place (either spelling).
pub fn restarts_pod(action: &str) -> bool {
    action == RESTART_ALL_CONTAINERS || action == RESTART_POD
}

/// The action of the first of a container's `restartPolicyRules` that covers an exit code.
pub fn rule_action(container: &Value, code: i32) -> Option<String> {
    rules(container)
        .iter()
        .find(|r| covers(r, i64::from(code)))
        .map(|r| r["action"].as_str().unwrap_or_default().to_owned())
}

/// The container's env has a variable `name` (a literal or `valueFrom`).
#[cfg(test)]
pub fn has_env(container: &Value, name: &str) -> bool {
    list(container, "env")
        .iter()
        .any(|e| e["name"].as_str() == Some(name))
}

/// An init container whose exit restarts the whole pod, or that carries the agent's name.
fn is_sidecar_agent(container: &Value) -> bool {
    rules(container)
        .iter()
        .any(|r| r["action"].as_str().is_some_and(restarts_pod))
        || container["name"].as_str() == Some(agent_env::CONTAINER_NAME)
}

/// The agent container of a pod spec: a sidecar agent among the init containers.
pub fn agent(spec: &Value) -> Option<&Value> {
    list(spec, "initContainers")
        .iter()
        .find(|c| is_sidecar_agent(c))
}

/// The regular container named `name`.
pub fn regular_container<'a>(spec: &'a Value, name: &str) -> Option<&'a Value> {
    list(spec, "containers")
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
}

/// The path of a container's HTTP startup probe.
pub fn startup_probe_path(container: &Value) -> Option<&str> {
    container
        .pointer("/startupProbe/httpGet/path")
        .and_then(Value::as_str)
}

/// The init containers that start before the agent (every one of them when the agent is a
/// regular container), by name, each with whether it is a sidecar (`restartPolicy: Always`).
pub fn before_agent(spec: &Value) -> Vec<(String, bool)> {
    list(spec, "initContainers")
        .iter()
        .take_while(|c| !is_sidecar_agent(c))
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["restartPolicy"].as_str() == Some("Always"),
            )
        })
        .collect()
}

/// A container's startup probe `timeoutSeconds` (the API's default: 1 s).
pub fn startup_probe_timeout(container: &Value) -> std::time::Duration {
    let seconds = container
        .pointer("/startupProbe/timeoutSeconds")
        .and_then(Value::as_u64)
        .filter(|s| *s > 0)
        .unwrap_or(1);
    std::time::Duration::from_secs(seconds)
}

/// A container's startup probe `failureThreshold` (the API's default: 3).
pub fn startup_probe_failure_threshold(container: &Value) -> u32 {
    container
        .pointer("/startupProbe/failureThreshold")
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .unwrap_or(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_covering_rule_decides() {
        let c = json!({"restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}},
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}},
        ]});
        assert_eq!(rule_action(&c, 3).as_deref(), Some(RESTART_CONTAINER));
        assert_eq!(rule_action(&c, 42).as_deref(), Some(RESTART_ALL_CONTAINERS));
        assert_eq!(rule_action(&c, 0), None);
    }

    #[test]
    fn agents_are_found_by_shape() {
        let sidecar = json!({"initContainers": [
            {"name": "setup"},
            {"name": "a", "restartPolicy": "Always", "restartPolicyRules": [
                {"action": "RestartPod", "exitCodes": {"operator": "NotIn", "values": [0]}}]},
        ], "containers": [{"name": "w"}]});
        assert_eq!(agent(&sidecar).map(|c| &c["name"]), Some(&json!("a")));
        // Main-container mode is not offered: a regular container is never the agent.
        let main = json!({"containers": [
            {"name": "w", "env": [{"name": "WORKER_COMMAND", "value": "run"}]}]});
        assert!(agent(&main).is_none());
        assert!(agent(&json!({"containers": [{"name": "w"}]})).is_none());
    }

    #[test]
    fn the_containers_before_the_agent_and_the_probe_threshold() {
        let spec = json!({"initContainers": [
            {"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"},
            {"name": "jobset-inplace-agent", "restartPolicy": "Always",
             "startupProbe": {"failureThreshold": 86400}},
            {"name": "after"}]});
        assert_eq!(
            before_agent(&spec),
            [("setup".to_owned(), false), ("proxy".to_owned(), true)]
        );
        assert_eq!(
            startup_probe_failure_threshold(&spec["initContainers"][2]),
            86400
        );
        assert_eq!(
            startup_probe_failure_threshold(&spec["initContainers"][0]),
            3
        );
    }
}
