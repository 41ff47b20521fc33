//! Reading a pod template (its [sparse view](super::view)): its containers, their restart rules, env and
//! startup probe, and where the jobset-inplace agent is. Validation and mutation share these
//! readers, so what one calls an agent the other does too.

use serde_json::Value;

use super::view::{ContainerView, HttpGet, PodSpec, RuleView, is_env_name_read};
use crate::wire::agent_env;

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
pub(crate) struct Container<'a> {
    pub list: ContainerList,
    pub index: usize,
    pub view: &'a ContainerView<'a>,
    /// The list's element is not an object (it reads as all absent): nothing may be patched
    /// into it.
    pub malformed: bool,
}

/// One `restartPolicyRules` entry.
pub(crate) type RestartRule<'a> = RuleView<'a>;

impl RuleView<'_> {
    /// `action`, "" when absent.
    pub fn action(&self) -> &str {
        self.action.as_deref().unwrap_or("")
    }

    /// `exitCodes.operator` (`In` or `NotIn`); `None` when absent or unknown.
    pub fn operator(&self) -> Option<&str> {
        self.exit_codes.as_ref()?.operator.as_deref()
    }

    /// The integers of `exitCodes.values`.
    pub fn values(&self) -> &[i64] {
        self.exit_codes
            .as_ref()
            .and_then(|e| e.values.as_ref())
            .map_or(&[], |v| v.0.as_slice())
    }

    /// The rule applies to a container exit with `code`.
    pub fn covers(&self, code: i64) -> bool {
        match self.operator() {
            Some("In") => self.values().contains(&code),
            Some("NotIn") => !self.values().contains(&code),
            _ => false,
        }
    }

    /// The rule restarts the whole pod (either spelling).
    pub fn restarts_pod(&self) -> bool {
        let action = self.action();
        action == RESTART_ALL_CONTAINERS || action == RESTART_POD
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
        self.view.name.as_deref().unwrap_or("")
    }

    pub fn restart_policy(&self) -> Option<&'a str> {
        self.view.restart_policy.as_deref()
    }

    /// The container's `restartPolicyRules` (an entry's index is its position).
    pub fn restart_rules(&self) -> &'a [RestartRule<'a>] {
        self.view
            .restart_policy_rules
            .as_ref()
            .map_or(&[], |l| l.0.as_slice())
    }

    /// The env entry named `name` (the last of duplicates, as the kubelet uses the last). `name`
    /// is one the view keeps ([`is_env_name_read`]).
    pub fn env(&self, name: &str) -> Option<EnvEntry<'a>> {
        debug_assert!(
            is_env_name_read(name),
            "env {name:?} is not read by the view"
        );
        self.view
            .env
            .as_ref()?
            .read
            .iter()
            .rev()
            .find(|(_, e)| e.name.as_deref() == Some(name))
            .map(|(index, e)| EnvEntry {
                index: *index,
                value: if e.value_from {
                    None
                } else {
                    Some(e.value.as_deref().unwrap_or(""))
                },
            })
    }

    /// The first of `names` that is set, with its name.
    pub fn env_any(&self, names: &[&'static str]) -> Option<(&'static str, EnvEntry<'a>)> {
        names.iter().find_map(|n| self.env(n).map(|e| (*n, e)))
    }

    /// The first of `names` (a variable and its alias) that the agent reads: as in
    /// `agent::config`, one set to blank text counts as unset. (An entry from `valueFrom` is
    /// returned, its value unknown here.) [`Self::env_any`] is what is written, blank or not.
    pub fn env_read_by_agent(
        &self,
        names: &[&'static str],
    ) -> Option<(&'static str, EnvEntry<'a>)> {
        names.iter().find_map(|name| {
            self.env(name)
                .filter(|e| e.value.is_none_or(|v| !v.trim().is_empty()))
                .map(|e| (*name, e))
        })
    }

    /// `env` is an array (entries can be appended to it).
    pub fn has_env_list(&self) -> bool {
        self.view.env.is_some()
    }

    /// The startup probe's `httpGet` (present whatever its type; port as written: a number or a
    /// port name; path).
    pub fn startup_http_get(&self) -> Option<&'a HttpGet<'a>> {
        self.view.startup_probe.as_ref()?.http_get.as_ref()
    }

    /// Its startup probe's `timeoutSeconds` (the API's default: 1), if it has a startup probe.
    pub fn startup_timeout_seconds(&self) -> Option<i64> {
        let probe = self.view.startup_probe.as_ref()?;
        Some(probe.timeout_seconds.unwrap_or(1))
    }

    /// Resolves a probe port (number or container port name) to a number.
    pub fn resolve_port(&self, port: &Value) -> Option<i64> {
        match port {
            Value::Number(n) => n.as_i64(),
            Value::String(name) => {
                self.view
                    .ports
                    .as_ref()?
                    .0
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))?
                    .container_port
            }
            _ => None,
        }
    }

    /// The container mounts the volume named `volume`.
    pub fn mounts(&self, volume: &str) -> bool {
        self.view
            .volume_mounts
            .as_ref()
            .is_some_and(|m| m.has_name(volume))
    }

    /// The `containerPort`s the container declares (whatever their protocol), with their index in
    /// `ports`.
    pub fn declared_ports(self) -> impl Iterator<Item = (usize, i64)> + 'a {
        self.view
            .ports
            .as_ref()
            .map_or(&[][..], |l| l.0.as_slice())
            .iter()
            .enumerate()
            .filter_map(|(k, p)| Some((k, p.container_port?)))
    }

    /// The restart exit code the agent in this container will use, from its env (ours, then the
    /// released agent's name; blank counts as unset, as for the agent), else `default`. `Err`
    /// carries an unparsable literal.
    pub fn agent_exit_code(&self, default: u8) -> Result<ExitCodeSetting, String> {
        match self.env_read_by_agent(&[
            agent_env::RESTART_EXIT_CODE,
            agent_env::RESTART_EXIT_CODE_ALIAS,
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
pub(crate) fn containers<'a>(
    pod_spec: &'a PodSpec<'a>,
    list: ContainerList,
) -> impl Iterator<Item = Container<'a>> + 'a {
    let items = match list {
        ContainerList::Init => &pod_spec.init_containers,
        ContainerList::Regular => &pod_spec.containers,
    };
    let bad = items.as_ref().map(|l| &l.1);
    items
        .as_ref()
        .map_or(&[][..], |l| l.0.as_slice())
        .iter()
        .enumerate()
        .map(move |(index, view)| Container {
            list,
            index,
            view,
            malformed: bad.is_some_and(|b| b.contains(index)),
        })
}

/// Every container of a pod spec, init containers first.
pub(crate) fn all_containers<'a>(pod_spec: &'a PodSpec<'a>) -> impl Iterator<Item = Container<'a>> {
    containers(pod_spec, ContainerList::Init).chain(containers(pod_spec, ContainerList::Regular))
}

/// How an agent runs in its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentMode {
    /// A native sidecar (init container with `restartPolicy: Always`) whose exit restarts the
    /// whole pod; its startup probe is the barrier.
    Sidecar,
    /// A regular container whose env sets `WORKER_COMMAND` (main-container mode, admitted by
    /// older versions): recognised so that validation denies it (`Rule::MainContainerAgent`).
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
    pub(crate) fn rule_fits(self, rule: &RestartRule<'_>) -> bool {
        match self {
            AgentMode::Sidecar => rule.restarts_pod(),
            AgentMode::MainContainer => rule.action() == RESTART_CONTAINER || rule.restarts_pod(),
        }
    }

    /// An exit with `code` restarts what the agent guards: the rules are evaluated in order and
    /// the first that covers the code decides, as the kubelet does.
    pub(crate) fn code_restarts(self, rules: &[RestartRule<'_>], code: u8) -> bool {
        rules
            .iter()
            .find(|r| r.covers(i64::from(code)))
            .is_some_and(|r| self.rule_fits(r))
    }

    /// The exit code to give an agent that sets none: `preferred` if its rules restart on it,
    /// else the first code in 1-255 they restart on.
    pub(crate) fn restart_code(self, rules: &[RestartRule<'_>], preferred: u8) -> Option<u8> {
        std::iter::once(preferred)
            .chain(1..=255)
            .find(|c| self.code_restarts(rules, *c))
    }
}

/// Where the agent of a pod template is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Agent<'a> {
    pub mode: AgentMode,
    pub container: Container<'a>,
}

/// An init container whose exit restarts the whole pod, or that carries our agent's name: the
/// agent sidecar (a well-formed one also has `restartPolicy: Always`, which validation checks).
pub(crate) fn is_sidecar_agent(c: &Container<'_>) -> bool {
    c.list == ContainerList::Init
        && (c.restart_rules().iter().any(RestartRule::restarts_pod)
            || c.name() == agent_env::CONTAINER_NAME)
}

/// The repository of an image reference, as written: without its digest (from `@`) and its tag
/// (from the last `:` after the last `/`): `ghcr.io/a/b:1@sha256:0f` and `ghcr.io/a/b` are both
/// `ghcr.io/a/b`, `localhost:5000/b:1` is `localhost:5000/b`. Nothing is added or normalized: no
/// default registry, no `library/`, no change of case.
pub fn image_repository(image: &str) -> &str {
    let name = image.split_once('@').map_or(image, |(name, _)| name);
    match name.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => name,
    }
}

/// The container runs the repository of `image` (the configured agent image), whatever its tag
/// or digest ([`image_repository`]).
pub(crate) fn runs_image(c: &Container<'_>, image: &str) -> bool {
    c.view
        .image
        .as_deref()
        .is_some_and(|i| image_repository(i) == image_repository(image))
}

/// A regular container running the worker under the agent (`WORKER_COMMAND` in its env).
pub(crate) fn is_main_container_agent(c: &Container<'_>) -> bool {
    c.list == ContainerList::Regular && c.env(agent_env::WORKER_COMMAND).is_some()
}

/// Every agent of a pod spec: sidecar agents (see [`is_sidecar_agent`]; one lacking the sidecar
/// shape is still the agent, broken, and validation says how) and main-container agents (denied).
pub(crate) fn agents<'a>(pod_spec: &'a PodSpec<'a>) -> impl Iterator<Item = Agent<'a>> {
    all_containers(pod_spec).filter_map(|container| {
        let mode = if is_sidecar_agent(&container) {
            AgentMode::Sidecar
        } else if is_main_container_agent(&container) {
            AgentMode::MainContainer
        } else {
            return None;
        };
        Some(Agent { mode, container })
    })
}

/// The first agent of a pod spec, if any.
pub(crate) fn agent<'a>(pod_spec: &'a PodSpec<'a>) -> Option<Agent<'a>> {
    agents(pod_spec).next()
}

/// The first agent of a pod spec if it runs the configured `image` ([`runs_image`]): the one
/// container the agent's token may go to. A look-alike (the agent's shape, another image) is
/// none.
pub(crate) fn real_agent<'a>(pod_spec: &'a PodSpec<'a>, image: &str) -> Option<Agent<'a>> {
    agent(pod_spec).filter(|a| runs_image(&a.container, image))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::lenient::Lenient;

    /// The view of an in-memory pod spec (all absent for a non-object).
    fn pod_spec_view(value: &Value) -> PodSpec<'_> {
        Lenient::<PodSpec<'_>>::from_value(value).unwrap_or_default()
    }

    /// The view of an in-memory container (all absent for a non-object).
    fn container_view(value: &Value) -> ContainerView<'_> {
        Lenient::<ContainerView<'_>>::from_value(value).unwrap_or_default()
    }
    use serde_json::json;

    fn pod_spec(value: &Value) -> PodSpec<'_> {
        pod_spec_view(value)
    }

    #[test]
    fn rules_cover_codes() {
        let c = json!({"name": "a", "restartPolicyRules": [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}},
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [3, 4]}},
            {"action": "Restart"}
        ]});
        let view = container_view(&c);
        let c = Container {
            list: ContainerList::Init,
            index: 0,
            view: &view,
            malformed: false,
        };
        let rules = c.restart_rules();
        assert_eq!(rules.len(), 3);
        assert!(rules[0].covers(42) && !rules[0].covers(0));
        assert!(rules[0].restarts_pod() && !rules[1].restarts_pod());
        assert!(rules[1].covers(3) && !rules[1].covers(42));
        assert_eq!(AgentMode::Sidecar.restart_code(rules, 42), Some(42));
        assert_eq!(AgentMode::MainContainer.restart_code(rules, 42), Some(42));
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
        let spec = pod_spec(&spec);
        let found: Vec<_> = agents(&spec).collect();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].mode, AgentMode::Sidecar);
        assert_eq!(found[0].container.index, 1);
        assert_eq!(found[1].mode, AgentMode::MainContainer);

        let named = json!({"initContainers": [{"name": "jobset-inplace-agent"}]});
        let named = pod_spec(&named);
        assert_eq!(agent(&named).map(|a| a.mode), Some(AgentMode::Sidecar));
        let plain = json!({"containers": [{"name": "w"}]});
        assert!(agent(&pod_spec(&plain)).is_none());
    }

    #[test]
    fn an_image_s_repository_is_without_its_tag_and_digest() {
        for (image, repository) in [
            (
                "ghcr.io/jobset-inplace/jobset-inplace:0.1.0",
                "ghcr.io/jobset-inplace/jobset-inplace",
            ),
            (
                "ghcr.io/jobset-inplace/jobset-inplace",
                "ghcr.io/jobset-inplace/jobset-inplace",
            ),
            (
                "ghcr.io/jobset-inplace/jobset-inplace@sha256:0f",
                "ghcr.io/jobset-inplace/jobset-inplace",
            ),
            (
                "ghcr.io/jobset-inplace/jobset-inplace:0.1.0@sha256:0f",
                "ghcr.io/jobset-inplace/jobset-inplace",
            ),
            ("localhost:5000/agent:1", "localhost:5000/agent"),
            ("localhost:5000/agent", "localhost:5000/agent"),
            ("busybox", "busybox"),
            (
                "example.com/team-a/watchdog:1",
                "example.com/team-a/watchdog",
            ),
            ("", ""),
        ] {
            assert_eq!(image_repository(image), repository, "{image}");
        }
        let spec = json!({"initContainers": [
            {"name": "a", "image": "ghcr.io/jobset-inplace/jobset-inplace@sha256:0f"},
            {"name": "b", "image": "ghcr.io/jobset-inplace/jobset-inplace-evil:1"},
            {"name": "c", "image": "evil.example/ghcr.io/jobset-inplace/jobset-inplace:1"},
            {"name": "d"}
        ]});
        let spec = pod_spec(&spec);
        let runs: Vec<bool> = containers(&spec, ContainerList::Init)
            .map(|c| runs_image(&c, "ghcr.io/jobset-inplace/jobset-inplace:0.1.0"))
            .collect();
        assert_eq!(runs, [true, false, false, false]);
    }

    #[test]
    fn env_and_ports() {
        let c = json!({"name": "a",
            "env": [{"name": "IN_PLACE_RESTART_EXIT_CODE", "value": "7"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [{"name": "barrier", "containerPort": 9000}]});
        let view = container_view(&c);
        let c = Container {
            list: ContainerList::Init,
            index: 0,
            view: &view,
            malformed: false,
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
