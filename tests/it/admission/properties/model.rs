//! The model: a JobSet as the generator chose it, and what admission must make of it.

use super::*;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum EnvValue {
    Literal(String),
    FieldRef(&'static str),
    ConfigMap,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct EnvVar {
    pub(super) name: String,
    pub(super) value: EnvValue,
}

impl EnvVar {
    pub(super) fn literal(name: &str, value: impl Into<String>) -> Self {
        EnvVar {
            name: name.to_owned(),
            value: EnvValue::Literal(value.into()),
        }
    }
    pub(super) fn field(name: &str, path: &'static str) -> Self {
        EnvVar {
            name: name.to_owned(),
            value: EnvValue::FieldRef(path),
        }
    }
    pub(super) fn json(&self) -> Value {
        match &self.value {
            EnvValue::Literal(v) => json!({"name": self.name, "value": v}),
            EnvValue::FieldRef(path) => {
                json!({"name": self.name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
            }
            EnvValue::ConfigMap => json!({"name": self.name, "valueFrom":
                {"configMapKeyRef": {"name": "agent-settings", "key": self.name.to_lowercase()}}}),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Rule {
    pub(super) action: &'static str,
    pub(super) operator: &'static str,
    pub(super) values: Vec<i64>,
}

pub(super) fn rule(action: &'static str, operator: &'static str, values: &[i64]) -> Rule {
    Rule {
        action,
        operator,
        values: values.to_vec(),
    }
}

impl Rule {
    pub(super) fn covers(&self, code: i64) -> bool {
        match self.operator {
            "In" => self.values.contains(&code),
            "NotIn" => !self.values.contains(&code),
            _ => false,
        }
    }
    pub(super) fn restarts_pod(&self) -> bool {
        self.action == RAC || self.action == RESTART_POD
    }
    pub(super) fn json(&self) -> Value {
        json!({"action": self.action, "exitCodes": {"operator": self.operator, "values": self.values}})
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Probe {
    /// A number or a container port name.
    pub(super) port: Value,
    pub(super) path: Option<String>,
    pub(super) period: Option<i64>,
    pub(super) threshold: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Container {
    pub(super) name: String,
    pub(super) restart_policy: Option<&'static str>,
    pub(super) rules: Vec<Rule>,
    pub(super) env: Vec<EnvVar>,
    /// Write `env: []` when there is no entry.
    pub(super) empty_env_list: bool,
    pub(super) probe: Option<Probe>,
    pub(super) ports: Vec<(Option<&'static str>, i64)>,
    /// Fields the code does not model (real ones such as `command`, and unknown ones).
    pub(super) extra: Map<String, Value>,
}

impl Container {
    /// The last entry named `name` (the kubelet uses the last of duplicates): its index and
    /// literal value (`None` for `valueFrom`).
    pub(super) fn env(&self, name: &str) -> Option<(usize, Option<&str>)> {
        self.env
            .iter()
            .enumerate()
            .rev()
            .find(|(_, e)| e.name == name)
            .map(|(i, e)| {
                let value = match &e.value {
                    EnvValue::Literal(v) => Some(v.as_str()),
                    _ => None,
                };
                (i, value)
            })
    }
    pub(super) fn env_any(&self, names: &[&str]) -> Option<(usize, Option<&str>)> {
        names.iter().find_map(|n| self.env(n))
    }
    pub(super) fn resolve(&self, port: &Value) -> Option<i64> {
        match port {
            Value::Number(n) => n.as_i64(),
            Value::String(name) => self
                .ports
                .iter()
                .find(|(n, _)| *n == Some(name.as_str()))
                .map(|(_, p)| *p),
            _ => None,
        }
    }
    pub(super) fn json(&self) -> Value {
        let mut c = Map::new();
        c.insert("name".into(), json!(self.name));
        // A container that may be taken for the agent runs the agent's image (the repository
        // of every generated config's), so that it is the agent: look-alikes are the unit
        // tests' and the fixtures' (`agent-look-alike`).
        let image = if self.rules.iter().any(Rule::restarts_pod) || self.name == AGENT_NAME {
            AGENT_IMAGE
        } else {
            "registry.example/img:1"
        };
        c.insert("image".into(), json!(image));
        if let Some(p) = self.restart_policy {
            c.insert("restartPolicy".into(), json!(p));
        }
        if !self.rules.is_empty() {
            c.insert(
                "restartPolicyRules".into(),
                Value::Array(self.rules.iter().map(Rule::json).collect()),
            );
        }
        if !self.env.is_empty() || self.empty_env_list {
            c.insert(
                "env".into(),
                Value::Array(self.env.iter().map(EnvVar::json).collect()),
            );
        }
        if let Some(p) = &self.probe {
            let mut http_get = Map::new();
            if let Some(path) = &p.path {
                http_get.insert("path".into(), json!(path));
            }
            http_get.insert("port".into(), p.port.clone());
            let mut probe = Map::new();
            probe.insert("httpGet".into(), Value::Object(http_get));
            if let Some(v) = p.period {
                probe.insert("periodSeconds".into(), json!(v));
            }
            if let Some(v) = p.threshold {
                probe.insert("failureThreshold".into(), json!(v));
            }
            c.insert("startupProbe".into(), Value::Object(probe));
        }
        if !self.ports.is_empty() {
            let ports = self
                .ports
                .iter()
                .map(|(name, port)| match name {
                    Some(n) => json!({"name": n, "containerPort": port}),
                    None => json!({"containerPort": port}),
                })
                .collect();
            c.insert("ports".into(), Value::Array(ports));
        }
        c.extend(self.extra.clone());
        Value::Object(c)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum List {
    Init,
    Regular,
}

impl List {
    pub(super) fn key(self) -> &'static str {
        match self {
            List::Init => "initContainers",
            List::Regular => "containers",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Pod {
    /// `None`: no `initContainers` key.
    pub(super) init: Option<Vec<Container>>,
    pub(super) containers: Vec<Container>,
    pub(super) service_account: Option<&'static str>,
    /// `imagePullSecrets`: `None` absent.
    pub(super) pull_secrets: Option<Vec<Value>>,
    /// `template.metadata`: `None` absent; else its annotations (`None`: absent) and other keys.
    pub(super) metadata: Option<(Option<Map<String, Value>>, Map<String, Value>)>,
    pub(super) extra: Map<String, Value>,
}

impl Pod {
    pub(super) fn all(&self) -> impl Iterator<Item = (List, usize, &Container)> {
        let init = self.init.iter().flatten().enumerate();
        let regular = self.containers.iter().enumerate();
        init.map(|(i, c)| (List::Init, i, c))
            .chain(regular.map(|(i, c)| (List::Regular, i, c)))
    }

    /// The pod template carries the injected annotation (the webhook injected it before).
    pub(super) fn injected(&self) -> bool {
        self.metadata
            .as_ref()
            .and_then(|(a, _)| a.as_ref())
            .is_some_and(|a| a.contains_key(INJECTED))
    }

    /// The agents, in the order validation finds them: sidecars (init containers whose rule
    /// restarts the pod, or named as ours) and main-container agents (`WORKER_COMMAND`).
    pub(super) fn agents(&self) -> Vec<(List, usize, &Container, bool)> {
        self.all()
            .filter_map(|(list, i, c)| {
                let sidecar = list == List::Init
                    && (c.rules.iter().any(Rule::restarts_pod) || c.name == AGENT_NAME);
                let main = list == List::Regular && c.env(WORKER_COMMAND).is_some();
                (sidecar || main).then_some((list, i, c, sidecar))
            })
            .collect()
    }

    pub(super) fn json(&self) -> Value {
        let mut spec = Map::new();
        spec.insert("restartPolicy".into(), json!("Never"));
        if let Some(sa) = self.service_account {
            spec.insert("serviceAccountName".into(), json!(sa));
        }
        if let Some(secrets) = &self.pull_secrets {
            spec.insert("imagePullSecrets".into(), Value::Array(secrets.clone()));
        }
        if let Some(init) = &self.init {
            spec.insert(
                "initContainers".into(),
                Value::Array(init.iter().map(Container::json).collect()),
            );
        }
        spec.insert(
            "containers".into(),
            Value::Array(self.containers.iter().map(Container::json).collect()),
        );
        spec.extend(self.extra.clone());
        let mut template = Map::new();
        if let Some((annotations, extra)) = &self.metadata {
            let mut meta = Map::new();
            meta.insert("labels".into(), json!({"app": "train"}));
            if let Some(a) = annotations {
                meta.insert("annotations".into(), Value::Object(a.clone()));
            }
            meta.extend(extra.clone());
            template.insert("metadata".into(), Value::Object(meta));
        }
        template.insert("spec".into(), Value::Object(spec));
        Value::Object(template)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Job {
    pub(super) replicas: i64,
    pub(super) backoff: Option<i64>,
    pub(super) pod_replacement_policy: Option<&'static str>,
    pub(super) completions: Option<i64>,
    pub(super) parallelism: Option<i64>,
    pub(super) pod_failure_policy: bool,
    pub(super) pod: Pod,
    pub(super) spec_extra: Map<String, Value>,
    pub(super) extra: Map<String, Value>,
}

impl Job {
    pub(super) fn json(&self, index: usize) -> Value {
        let mut spec = Map::new();
        for (key, value) in [
            ("completions", self.completions),
            ("parallelism", self.parallelism),
            ("backoffLimit", self.backoff),
        ] {
            if let Some(v) = value {
                spec.insert(key.into(), json!(v));
            }
        }
        if let Some(p) = self.pod_replacement_policy {
            spec.insert("podReplacementPolicy".into(), json!(p));
        }
        if self.pod_failure_policy {
            spec.insert(
                "podFailurePolicy".into(),
                json!({"rules": [
                    {"action": "FailJob", "onExitCodes": {"containerName": "w0", "operator": "In", "values": [3]}},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
                ]}),
            );
        }
        spec.insert("template".into(), self.pod.json());
        spec.extend(self.spec_extra.clone());
        let mut rj = Map::new();
        rj.insert("name".into(), json!(format!("rj-{index}")));
        rj.insert("replicas".into(), json!(self.replicas));
        rj.insert("template".into(), json!({"spec": Value::Object(spec)}));
        rj.extend(self.extra.clone());
        Value::Object(rj)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Model {
    pub(super) strategy: Option<&'static str>,
    pub(super) max_restarts: Option<i64>,
    /// `jobset-inplace.dev/inject`.
    pub(super) inject: Option<&'static str>,
    pub(super) annotations: Map<String, Value>,
    pub(super) jobs: Vec<Job>,
    pub(super) meta_extra: Map<String, Value>,
    pub(super) spec_extra: Map<String, Value>,
    pub(super) extra: Map<String, Value>,
}

impl Model {
    pub(super) fn json(&self) -> Value {
        let mut annotations = self.annotations.clone();
        if let Some(v) = self.inject {
            annotations.insert("jobset-inplace.dev/inject".into(), json!(v));
        }
        let mut meta = Map::new();
        meta.insert("name".into(), json!("prop"));
        meta.insert("namespace".into(), json!("team-a"));
        if !annotations.is_empty() {
            meta.insert("annotations".into(), Value::Object(annotations));
        }
        meta.extend(self.meta_extra.clone());
        let mut spec = Map::new();
        let mut policy = Map::new();
        if let Some(s) = self.strategy {
            policy.insert("restartStrategy".into(), json!(s));
        }
        if let Some(m) = self.max_restarts {
            policy.insert("maxRestarts".into(), json!(m));
        }
        if !policy.is_empty() {
            spec.insert("failurePolicy".into(), Value::Object(policy));
        }
        spec.insert(
            "replicatedJobs".into(),
            Value::Array(
                self.jobs
                    .iter()
                    .enumerate()
                    .map(|(i, j)| j.json(i))
                    .collect(),
            ),
        );
        spec.extend(self.spec_extra.clone());
        let mut js = Map::new();
        js.insert("apiVersion".into(), json!("jobset.x-k8s.io/v1alpha2"));
        js.insert("kind".into(), json!("JobSet"));
        js.insert("metadata".into(), Value::Object(meta));
        js.insert("spec".into(), Value::Object(spec));
        js.extend(self.extra.clone());
        Value::Object(js)
    }

    pub(super) fn in_place_restart(&self) -> bool {
        self.strategy == Some("InPlaceRestart")
    }

    /// The mutation applies (CREATE): InPlaceRestart and not opted out.
    pub(super) fn mutates(&self) -> bool {
        self.in_place_restart() && self.inject != Some("false")
    }

    /// The RestartPod rules the mutation rewrites (one warning each).
    pub(super) fn restart_pod_rules(&self) -> usize {
        self.jobs
            .iter()
            .flat_map(|j| j.pod.all())
            .map(|(_, _, c)| c.rules.iter().filter(|r| r.action == RESTART_POD).count())
            .sum()
    }

    /// The violations validation must report, as (replicatedJob index, field path), for the
    /// object as written (`mutated: false`) or after the mutation (`mutated: true`): a violation
    /// is a bad explicit choice of the generator, or (unmutated) something the mutation adds.
    pub(super) fn violations(
        &self,
        mutated: bool,
        config: &InjectionConfig,
    ) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        if !self.in_place_restart() {
            return out;
        }
        for (i, job) in self.jobs.iter().enumerate() {
            let prefix = format!("spec.replicatedJobs[{i}].template.spec");
            let mut v = |path: String| out.push((i, path));
            match job.backoff {
                None if !mutated => v(format!("{prefix}.backoffLimit")),
                Some(b) if b != MAX_BACKOFF => v(format!("{prefix}.backoffLimit")),
                _ => {}
            }
            match job.pod_replacement_policy {
                None if !mutated => v(format!("{prefix}.podReplacementPolicy")),
                Some(p) if p != "Failed" => v(format!("{prefix}.podReplacementPolicy")),
                _ => {}
            }
            match (job.completions, job.parallelism) {
                (Some(c), Some(p)) if c == p => {}
                (Some(_), Some(_)) => v(format!("{prefix}.completions")),
                // Kubernetes' Job defaulting, which the mutation writes where it meets the rule.
                (None, None) | (Some(1), None) if mutated => {}
                (Some(_), None) if mutated => v(format!("{prefix}.parallelism")),
                (None, Some(_)) if mutated => v(format!("{prefix}.completions")),
                (c, p) => {
                    if c.is_none() {
                        v(format!("{prefix}.completions"));
                    }
                    if p.is_none() {
                        v(format!("{prefix}.parallelism"));
                    }
                }
            }
            let pod = format!("{prefix}.template.spec");
            let path = |list: List, index: usize| format!("{pod}.{}[{index}]", list.key());
            for (list, index, c) in job.pod.all() {
                if !c.rules.is_empty() && c.restart_policy.is_none() {
                    v(format!("{}.restartPolicy", path(list, index)));
                }
                if !mutated {
                    for (j, r) in c.rules.iter().enumerate() {
                        if r.action == RESTART_POD {
                            v(format!(
                                "{}.restartPolicyRules[{j}].action",
                                path(list, index)
                            ));
                        }
                    }
                }
            }
            let agents = job.pod.agents();
            let Some(&(list, index, agent, sidecar)) = agents.first() else {
                if !mutated {
                    v(format!("{pod}.initContainers"));
                }
                continue;
            };
            for &(list, index, _, _) in &agents[1..] {
                v(path(list, index));
            }
            let agent = if mutated {
                completed(agent, sidecar, config)
            } else {
                agent.clone()
            };
            // Every containerPort the other containers declare, with its field path.
            let others: Vec<(String, i64)> = job
                .pod
                .all()
                .filter(|(l, i, _)| (*l, *i) != (list, index))
                .flat_map(|(l, i, c)| {
                    let at = path(l, i);
                    c.ports
                        .iter()
                        .enumerate()
                        .map(move |(k, (_, p))| (format!("{at}.ports[{k}].containerPort"), *p))
                })
                .collect();
            agent_violations(
                &agent,
                sidecar,
                &path(list, index),
                &others,
                config.protocol,
                &mut v,
            );
        }
        out
    }
}

/// The agent after the mutation completed its env (only what it lacks, derived
/// from what it declares).
pub(super) fn completed(agent: &Container, sidecar: bool, config: &InjectionConfig) -> Container {
    let mut c = agent.clone();
    for (name, path) in [
        ("NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
        (
            "JOBSET_NAME",
            "metadata.annotations['jobset.sigs.k8s.io/jobset-name']",
        ),
    ] {
        if agent.env(name).is_none() {
            c.env.push(EnvVar::field(name, path));
        }
    }
    if agent.env_any(&[EXIT, EXIT_ALIAS]).is_none() {
        let code = std::iter::once(config.restart_exit_code)
            .chain(1..=255)
            .find(|code| code_restarts(agent, sidecar, *code))
            .unwrap_or(config.restart_exit_code);
        c.env.push(EnvVar::literal(EXIT, code.to_string()));
    }
    if agent.env(PROTOCOL).is_none() {
        c.env
            .push(EnvVar::literal(PROTOCOL, config.protocol.as_str()));
    }
    if sidecar {
        if agent.env_any(&[PORT, PORT_ALIAS]).is_none() {
            let port = match &agent.probe {
                Some(p) => agent.resolve(&p.port),
                None => Some(i64::from(config.barrier_port)),
            };
            if let Some(port) = port.filter(|p| *p != DEFAULT_PORT) {
                c.env.push(EnvVar::literal(PORT, port.to_string()));
            }
        }
        if agent.env_any(&[PATH, PATH_ALIAS]).is_none() {
            let path = match &agent.probe {
                Some(p) => p.path.clone().unwrap_or_else(|| "/".to_owned()),
                None => config.barrier_path.clone(),
            };
            if path != DEFAULT_PATH {
                c.env.push(EnvVar::literal(PATH, path));
            }
        }
    }
    c
}

/// A rule restarts what the agent guards: the pod (sidecar), or its container (main).
pub(super) fn fits(rule: &Rule, sidecar: bool) -> bool {
    rule.restarts_pod() || (!sidecar && rule.action == RESTART)
}

/// The first rule covering `code` restarts what the agent guards.
pub(super) fn code_restarts(agent: &Container, sidecar: bool, code: u8) -> bool {
    agent
        .rules
        .iter()
        .find(|r| r.covers(i64::from(code)))
        .is_some_and(|r| fits(r, sidecar))
}

/// `others`: the containerPorts the pod's other containers declare, with their paths.
pub(super) fn agent_violations(
    agent: &Container,
    sidecar: bool,
    path: &str,
    others: &[(String, i64)],
    dialect: Dialect,
    v: &mut impl FnMut(String),
) {
    if !sidecar {
        // Main-container mode is not offered: denied at its WORKER_COMMAND, nothing else judged.
        let at = agent.env(WORKER_COMMAND).map_or_else(
            || format!("{path}.env"),
            |(i, _)| format!("{path}.env[{i}]"),
        );
        v(at);
        return;
    }
    let code = match agent.env_any(&[EXIT, EXIT_ALIAS]) {
        None => Some(DEFAULT_EXIT_CODE),
        Some((_, None)) => None,
        Some((_, Some(value))) => match value.trim().parse::<u8>() {
            Ok(c) if c > 0 => Some(c),
            _ => {
                v(format!("{path}.env"));
                None
            }
        },
    };
    for name in ["POD_NAME", "JOBSET_NAME"] {
        if agent.env(name).is_none() {
            v(format!("{path}.env"));
        }
    }
    if let Some((index, Some(value))) = agent.env(PROTOCOL)
        && value.parse::<Dialect>() != Ok(dialect)
    {
        v(format!("{path}.env[{index}].value"));
    }
    if agent.restart_policy != Some("Always") {
        v(format!("{path}.restartPolicy"));
    }
    if !agent.rules.iter().any(|r| fits(r, sidecar)) {
        v(format!("{path}.restartPolicyRules"));
    } else if let Some(code) = code
        && !code_restarts(agent, sidecar, code)
    {
        v(format!("{path}.restartPolicyRules"));
    }
    let port = match agent.env_any(&[PORT, PORT_ALIAS]) {
        None => Some(DEFAULT_PORT),
        Some((_, None)) => None,
        Some((index, Some(value))) => match value.trim().parse::<u16>() {
            Ok(p) if p > 0 => Some(i64::from(p)),
            _ => {
                v(format!("{path}.env[{index}].value"));
                return;
            }
        },
    };
    let barrier_path = match agent.env_any(&[PATH, PATH_ALIAS]) {
        None => Some(DEFAULT_PATH),
        Some((_, value)) => value,
    };
    if let Some(port) = port {
        for (at, declared) in others {
            if *declared == port {
                v(at.clone());
            }
        }
    }
    let Some(probe) = &agent.probe else {
        v(format!("{path}.startupProbe"));
        return;
    };
    if let Some(port) = port
        && agent.resolve(&probe.port) != Some(port)
    {
        v(format!("{path}.startupProbe.httpGet.port"));
    }
    let probe_path = probe.path.as_deref().unwrap_or("/");
    if let Some(barrier_path) = barrier_path
        && probe_path != barrier_path
    {
        v(format!("{path}.startupProbe.httpGet.path"));
    }
}
