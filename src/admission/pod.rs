//! Reading a pod template (raw JSON): its containers, their restart rules, env and startup probe,
//! and where the jobset-inplace agent is. Validation and mutation share these readers, so what
//! one calls an agent the other does too.

use serde_json::Value;

use crate::agent::contract;

/// `RestartAllContainers`: the container restart rule action that restarts the whole pod in place
/// (Kubernetes 1.35).
pub const RESTART_ALL_CONTAINERS: &str = "RestartAllContainers";
/// KEP-467's name for [`RESTART_ALL_CONTAINERS`], rewritten by the mutation.
pub const RESTART_POD: &str = "RestartPod";
/// The container restart rule action that restarts only that container.
pub const RESTART_CONTAINER: &str = "Restart";

/// Which list of the pod spec a container is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerList {
    Init,
    Regular,
}

impl ContainerList {
    /// The pod spec key of the list.
    pub fn key(self) -> &'static str {
        match self {
            ContainerList::Init => "initContainers",
            ContainerList::Regular => "containers",
        }
    }
}

/// One container of a pod template.
#[derive(Clone, Copy, Debug)]
pub struct Container<'a> {
    pub list: ContainerList,
    pub index: usize,
    pub value: &'a Value,
}

/// One `restartPolicyRules` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartRule<'a> {
    pub index: usize,
    pub action: &'a str,
    /// `exitCodes.operator` (`In` or `NotIn`); `None` when absent or unknown.
    pub operator: Option<&'a str>,
    pub values: Vec<i64>,
}

impl RestartRule<'_> {
    /// The rule applies to a container exit with `code`.
    pub fn covers(&self, code: i64) -> bool {
        match self.operator {
            Some("In") => self.values.contains(&code),
            Some("NotIn") => !self.values.contains(&code),
            _ => false,
        }
    }

    /// The rule restarts the whole pod (either spelling).
    pub fn restarts_pod(&self) -> bool {
        self.action == RESTART_ALL_CONTAINERS || self.action == RESTART_POD
    }
}

/// An env entry of a container: its literal value (`None` when it comes from `valueFrom`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvEntry<'a> {
    pub index: usize,
    pub value: Option<&'a str>,
}

impl<'a> Container<'a> {
    pub fn name(&self) -> &'a str {
        self.value.get("name").and_then(Value::as_str).unwrap_or("")
    }

    pub fn restart_policy(&self) -> Option<&'a str> {
        self.value.get("restartPolicy").and_then(Value::as_str)
    }

    /// The container's `restartPolicyRules`.
    pub fn restart_rules(&self) -> Vec<RestartRule<'a>> {
        let Some(rules) = self
            .value
            .get("restartPolicyRules")
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        rules
            .iter()
            .enumerate()
            .map(|(index, rule)| {
                let exit_codes = rule.get("exitCodes");
                RestartRule {
                    index,
                    action: rule.get("action").and_then(Value::as_str).unwrap_or(""),
                    operator: exit_codes
                        .and_then(|e| e.get("operator"))
                        .and_then(Value::as_str),
                    values: exit_codes
                        .and_then(|e| e.get("values"))
                        .and_then(Value::as_array)
                        .map(|v| v.iter().filter_map(Value::as_i64).collect())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }

    /// The env entry named `name` (the last of duplicates, as the kubelet uses the last).
    pub fn env(&self, name: &str) -> Option<EnvEntry<'a>> {
        self.env_list()
            .iter()
            .enumerate()
            .rev()
            .find(|(_, e)| e.get("name").and_then(Value::as_str) == Some(name))
            .map(|(index, e)| EnvEntry {
                index,
                value: if e.get("valueFrom").is_some() {
                    None
                } else {
                    Some(e.get("value").and_then(Value::as_str).unwrap_or(""))
                },
            })
    }

    /// The first of `names` that is set, with its name.
    pub fn env_any(&self, names: &[&'static str]) -> Option<(&'static str, EnvEntry<'a>)> {
        names.iter().find_map(|n| self.env(n).map(|e| (*n, e)))
    }

    pub fn env_list(&self) -> &'a [Value] {
        self.value
            .get("env")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The startup probe's `httpGet` (port as written: a number or a port name; path).
    pub fn startup_http_get(&self) -> Option<&'a Value> {
        self.value.get("startupProbe")?.get("httpGet")
    }

    /// Resolves a probe port (number or container port name) to a number.
    pub fn resolve_port(&self, port: &Value) -> Option<i64> {
        match port {
            Value::Number(n) => n.as_i64(),
            Value::String(name) => self
                .value
                .get("ports")
                .and_then(Value::as_array)?
                .iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(name))?
                .get("containerPort")?
                .as_i64(),
            _ => None,
        }
    }

    /// The restart exit code the agent in this container will use, from its env (ours, then the
    /// released agent's name), else `default`. `Err` carries an unparsable literal.
    pub fn agent_exit_code(&self, default: u8) -> Result<ExitCodeSetting, String> {
        match self.env_any(&[
            contract::RESTART_EXIT_CODE,
            contract::RESTART_EXIT_CODE_ALIAS,
        ]) {
            None => Ok(ExitCodeSetting::Default(default)),
            Some((name, EnvEntry { value: None, .. })) => Ok(ExitCodeSetting::Unknown(name)),
            Some((name, EnvEntry { value: Some(v), .. })) => match v.trim().parse::<u8>() {
                Ok(code) if code > 0 => Ok(ExitCodeSetting::Env(name, code)),
                _ => Err(format!("{name}={v:?} is not an exit code in 1-255")),
            },
        }
    }
}

/// Where an agent's restart exit code comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCodeSetting {
    /// Not set in env: the agent's built-in default.
    Default(u8),
    /// Set literally by the named variable.
    Env(&'static str, u8),
    /// Set by the named variable through `valueFrom`: unknown before the pod runs.
    Unknown(&'static str),
}

impl ExitCodeSetting {
    pub fn code(self) -> Option<u8> {
        match self {
            ExitCodeSetting::Default(c) | ExitCodeSetting::Env(_, c) => Some(c),
            ExitCodeSetting::Unknown(_) => None,
        }
    }
}

/// The containers of one list of a pod spec.
pub fn containers(pod_spec: &Value, list: ContainerList) -> Vec<Container<'_>> {
    pod_spec
        .get(list.key())
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .enumerate()
                .map(|(index, value)| Container { list, index, value })
                .collect()
        })
        .unwrap_or_default()
}

/// Every container of a pod spec, init containers first.
pub fn all_containers(pod_spec: &Value) -> Vec<Container<'_>> {
    let mut all = containers(pod_spec, ContainerList::Init);
    all.extend(containers(pod_spec, ContainerList::Regular));
    all
}

/// How an agent runs in its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentMode {
    /// A native sidecar (init container with `restartPolicy: Always`) whose exit restarts the
    /// whole pod; its startup probe is the barrier.
    Sidecar,
    /// A regular container whose env sets `WORKER_COMMAND`: the agent runs the worker as its
    /// child and a `Restart` rule restarts the container in place.
    MainContainer,
}

impl AgentMode {
    /// The restart rule action an agent of this mode needs, as named in messages.
    pub fn wanted_action(self) -> &'static str {
        match self {
            AgentMode::Sidecar => RESTART_ALL_CONTAINERS,
            AgentMode::MainContainer => RESTART_CONTAINER,
        }
    }

    /// A rule of the agent's container restarts what the agent guards: the whole pod (sidecar),
    /// or its own container (main-container mode; restarting the whole pod works there too).
    pub fn rule_fits(self, rule: &RestartRule<'_>) -> bool {
        match self {
            AgentMode::Sidecar => rule.restarts_pod(),
            AgentMode::MainContainer => rule.action == RESTART_CONTAINER || rule.restarts_pod(),
        }
    }

    /// An exit with `code` restarts what the agent guards: the rules are evaluated in order and
    /// the first that covers the code decides, as the kubelet does.
    pub fn code_restarts(self, rules: &[RestartRule<'_>], code: u8) -> bool {
        rules
            .iter()
            .find(|r| r.covers(i64::from(code)))
            .is_some_and(|r| self.rule_fits(r))
    }

    /// The exit code to give an agent that sets none: `preferred` if its rules restart on it,
    /// else the first code in 1-255 they restart on.
    pub fn restart_code(self, rules: &[RestartRule<'_>], preferred: u8) -> Option<u8> {
        std::iter::once(preferred)
            .chain(1..=255)
            .find(|c| self.code_restarts(rules, *c))
    }
}

/// Where the agent of a pod template is.
#[derive(Clone, Copy, Debug)]
pub struct Agent<'a> {
    pub mode: AgentMode,
    pub container: Container<'a>,
}

/// An init container whose exit restarts the whole pod, or that carries our agent's name: the
/// agent sidecar (a well-formed one also has `restartPolicy: Always`, which validation checks).
pub fn is_sidecar_agent(c: &Container<'_>) -> bool {
    c.list == ContainerList::Init
        && (c.restart_rules().iter().any(RestartRule::restarts_pod)
            || c.name() == contract::CONTAINER_NAME)
}

/// A regular container running the worker under the agent (`WORKER_COMMAND` in its env).
pub fn is_main_container_agent(c: &Container<'_>) -> bool {
    c.list == ContainerList::Regular && c.env(contract::WORKER_COMMAND).is_some()
}

/// Every agent of a pod spec: sidecar agents (see [`is_sidecar_agent`]; one lacking the sidecar
/// shape is still the agent, broken, and validation says how) and main-container agents.
pub fn agents(pod_spec: &Value) -> Vec<Agent<'_>> {
    all_containers(pod_spec)
        .into_iter()
        .filter_map(|container| {
            let mode = if is_sidecar_agent(&container) {
                AgentMode::Sidecar
            } else if is_main_container_agent(&container) {
                AgentMode::MainContainer
            } else {
                return None;
            };
            Some(Agent { mode, container })
        })
        .collect()
}

/// The first agent of a pod spec, if any.
pub fn agent(pod_spec: &Value) -> Option<Agent<'_>> {
    agents(pod_spec).into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_cover_codes() {
        let c = json!({"name": "a", "restartPolicyRules": [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}},
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [3, 4]}},
            {"action": "Restart"}
        ]});
        let c = Container {
            list: ContainerList::Init,
            index: 0,
            value: &c,
        };
        let rules = c.restart_rules();
        assert_eq!(rules.len(), 3);
        assert!(rules[0].covers(42) && !rules[0].covers(0));
        assert!(rules[0].restarts_pod() && !rules[1].restarts_pod());
        assert!(rules[1].covers(3) && !rules[1].covers(42));
        assert_eq!(AgentMode::Sidecar.restart_code(&rules, 42), Some(42));
        assert_eq!(AgentMode::MainContainer.restart_code(&rules, 42), Some(42));
        // The first rule covering a code decides.
        let shadowed = [rules[1].clone(), rules[0].clone()];
        assert!(!AgentMode::Sidecar.code_restarts(&shadowed, 3));
        assert_eq!(AgentMode::Sidecar.restart_code(&shadowed, 3), Some(1));
        assert_eq!(
            AgentMode::MainContainer.restart_code(&shadowed, 42),
            Some(42)
        );
        assert!(!rules[2].covers(1));
    }

    #[test]
    fn finds_each_agent_form() {
        let spec = json!({
            "initContainers": [
                {"name": "setup"},
                {"name": "x", "restartPolicy": "Always",
                 "restartPolicyRules": [{"action": "RestartPod", "exitCodes": {"operator": "NotIn", "values": [0]}}]}
            ],
            "containers": [{"name": "w", "env": [{"name": "WORKER_COMMAND", "value": "train"}]}]
        });
        let found = agents(&spec);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].mode, AgentMode::Sidecar);
        assert_eq!(found[0].container.index, 1);
        assert_eq!(found[1].mode, AgentMode::MainContainer);

        let named = json!({"initContainers": [{"name": "jobset-inplace-agent"}]});
        assert_eq!(agent(&named).map(|a| a.mode), Some(AgentMode::Sidecar));
        assert!(agent(&json!({"containers": [{"name": "w"}]})).is_none());
    }

    #[test]
    fn env_and_ports() {
        let c = json!({"name": "a",
            "env": [{"name": "IN_PLACE_RESTART_EXIT_CODE", "value": "7"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [{"name": "barrier", "containerPort": 9000}]});
        let c = Container {
            list: ContainerList::Init,
            index: 0,
            value: &c,
        };
        assert_eq!(
            c.agent_exit_code(42),
            Ok(ExitCodeSetting::Env("IN_PLACE_RESTART_EXIT_CODE", 7))
        );
        assert_eq!(c.env("POD_NAME").map(|e| e.value), Some(None));
        assert_eq!(c.resolve_port(&json!("barrier")), Some(9000));
        assert_eq!(c.resolve_port(&json!(8080)), Some(8080));
        assert_eq!(c.resolve_port(&json!("nope")), None);
    }
}
