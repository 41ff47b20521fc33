//! Property tests of admission (issue 6) over generated JobSets and AdmissionReviews:
//!
//! - every review gets an answer, never a panic: a well-formed AdmissionReview response carrying
//!   the request's uid (HTTP 200), or a `Status` (HTTP 400) when there is no uid to answer;
//! - the mutation patches only by adding (or by rewriting `RestartPod`), so every field of the
//!   input, unknown ones included (keys with `/` and `~` too), is in the output unchanged; the
//!   patched object is valid against the released JobSet CRD schema; mutating it again patches
//!   nothing;
//! - validation of the mutated object denies exactly where the user's explicit values conflict
//!   with the admission rules (docs/architecture.md, "Admission"): the generator draws each value from good and bad choices, and [`Model`]
//!   says which violation (field path) each bad choice makes; an UPDATE ratchets unchanged
//!   replicatedJobs; DELETE, CONNECT and other kinds are allowed; dry-run changes nothing;
//! - reviews with missing or odd fields, arbitrary JSON and arbitrary bytes: the decoder answers as
//!   reading a `Value` of the body does (`oracle::review_through_value`).
//!
//! The whole file runs in well under a minute in a debug build; `PROPTEST_CASES=N` runs N cases
//! of each property instead (e.g. `PROPTEST_CASES=5000 cargo test --release --test
//! admission_properties`).
// Strategies are spelled as the tuples they generate.
#![allow(clippy::type_complexity)]

use std::sync::OnceLock;

use base64::Engine as _;
use jobset_inplace::admission::{self, Endpoint, InjectionConfig};
use jobset_inplace::protocol::Dialect;
use jobset_inplace_testkit::fixtures::{violation_fields, warnings};
use jobset_inplace_testkit::generators::{INJECTION_CONFIGS, injection_config};
use jobset_inplace_testkit::{fixtures, oracle};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};

const MAX_BACKOFF: i64 = 2_147_483_647;
const AGENT_NAME: &str = "jobset-inplace-agent";
const INJECTED: &str = "jobset-inplace.dev/injected";
const RAC: &str = "RestartAllContainers";
const RESTART_POD: &str = "RestartPod";
const RESTART: &str = "Restart";
const DEFAULT_PORT: i64 = 8080;
const DEFAULT_PATH: &str = "/barrier-is-lifted";
const DEFAULT_EXIT_CODE: u8 = 42;
const EXIT: &str = "RESTART_POD_IN_PLACE_EXIT_CODE";
const EXIT_ALIAS: &str = "IN_PLACE_RESTART_EXIT_CODE";
const PORT: &str = "BARRIER_PORT";
const PORT_ALIAS: &str = "STARTUP_PROBE_PORT";
const PATH: &str = "BARRIER_PATH";
const PATH_ALIAS: &str = "STARTUP_PROBE_PATH";
const PROTOCOL: &str = "JOBSET_INPLACE_PROTOCOL";
const WORKER_COMMAND: &str = "WORKER_COMMAND";

/// `cases` per property, unless `PROPTEST_CASES` says otherwise.
fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        // A failure prints its minimal input; it becomes a fixture or a unit test.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn schema() -> &'static jsonschema::Validator {
    static SCHEMA: OnceLock<jsonschema::Validator> = OnceLock::new();
    SCHEMA.get_or_init(fixtures::jobset_schema)
}

// ---------------------------------------------------------------------------------------------
// The model: a JobSet as the generator chose it.

#[derive(Clone, Debug, PartialEq)]
enum EnvValue {
    Literal(String),
    FieldRef(&'static str),
    ConfigMap,
}

#[derive(Clone, Debug, PartialEq)]
struct EnvVar {
    name: String,
    value: EnvValue,
}

impl EnvVar {
    fn literal(name: &str, value: impl Into<String>) -> Self {
        EnvVar {
            name: name.to_owned(),
            value: EnvValue::Literal(value.into()),
        }
    }
    fn field(name: &str, path: &'static str) -> Self {
        EnvVar {
            name: name.to_owned(),
            value: EnvValue::FieldRef(path),
        }
    }
    fn json(&self) -> Value {
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
struct Rule {
    action: &'static str,
    operator: &'static str,
    values: Vec<i64>,
}

fn rule(action: &'static str, operator: &'static str, values: &[i64]) -> Rule {
    Rule {
        action,
        operator,
        values: values.to_vec(),
    }
}

impl Rule {
    fn covers(&self, code: i64) -> bool {
        match self.operator {
            "In" => self.values.contains(&code),
            "NotIn" => !self.values.contains(&code),
            _ => false,
        }
    }
    fn restarts_pod(&self) -> bool {
        self.action == RAC || self.action == RESTART_POD
    }
    fn json(&self) -> Value {
        json!({"action": self.action, "exitCodes": {"operator": self.operator, "values": self.values}})
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Probe {
    /// A number or a container port name.
    port: Value,
    path: Option<String>,
    period: Option<i64>,
    threshold: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
struct Container {
    name: String,
    restart_policy: Option<&'static str>,
    rules: Vec<Rule>,
    env: Vec<EnvVar>,
    /// Write `env: []` when there is no entry.
    empty_env_list: bool,
    probe: Option<Probe>,
    ports: Vec<(Option<&'static str>, i64)>,
    /// Fields the code does not model (real ones such as `command`, and unknown ones).
    extra: Map<String, Value>,
}

impl Container {
    /// The last entry named `name` (the kubelet uses the last of duplicates): its index and
    /// literal value (`None` for `valueFrom`).
    fn env(&self, name: &str) -> Option<(usize, Option<&str>)> {
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
    fn env_any(&self, names: &[&str]) -> Option<(usize, Option<&str>)> {
        names.iter().find_map(|n| self.env(n))
    }
    fn resolve(&self, port: &Value) -> Option<i64> {
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
    fn json(&self) -> Value {
        let mut c = Map::new();
        c.insert("name".into(), json!(self.name));
        c.insert("image".into(), json!("registry.example/img:1"));
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
enum List {
    Init,
    Regular,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::Init => "initContainers",
            List::Regular => "containers",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Pod {
    /// `None`: no `initContainers` key.
    init: Option<Vec<Container>>,
    containers: Vec<Container>,
    service_account: Option<&'static str>,
    /// `imagePullSecrets`: `None` absent.
    pull_secrets: Option<Vec<Value>>,
    /// `template.metadata`: `None` absent; else its annotations (`None`: absent) and other keys.
    metadata: Option<(Option<Map<String, Value>>, Map<String, Value>)>,
    extra: Map<String, Value>,
}

impl Pod {
    fn all(&self) -> impl Iterator<Item = (List, usize, &Container)> {
        let init = self.init.iter().flatten().enumerate();
        let regular = self.containers.iter().enumerate();
        init.map(|(i, c)| (List::Init, i, c))
            .chain(regular.map(|(i, c)| (List::Regular, i, c)))
    }

    /// The pod template carries the injected annotation (the webhook injected it before).
    fn injected(&self) -> bool {
        self.metadata
            .as_ref()
            .and_then(|(a, _)| a.as_ref())
            .is_some_and(|a| a.contains_key(INJECTED))
    }

    /// The agents, in the order validation finds them: sidecars (init containers whose rule
    /// restarts the pod, or named as ours) and main-container agents (`WORKER_COMMAND`).
    fn agents(&self) -> Vec<(List, usize, &Container, bool)> {
        self.all()
            .filter_map(|(list, i, c)| {
                let sidecar = list == List::Init
                    && (c.rules.iter().any(Rule::restarts_pod) || c.name == AGENT_NAME);
                let main = list == List::Regular && c.env(WORKER_COMMAND).is_some();
                (sidecar || main).then_some((list, i, c, sidecar))
            })
            .collect()
    }

    fn json(&self) -> Value {
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
struct Job {
    replicas: i64,
    backoff: Option<i64>,
    pod_replacement_policy: Option<&'static str>,
    completions: Option<i64>,
    parallelism: Option<i64>,
    pod_failure_policy: bool,
    pod: Pod,
    spec_extra: Map<String, Value>,
    extra: Map<String, Value>,
}

impl Job {
    fn json(&self, index: usize) -> Value {
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
struct Model {
    strategy: Option<&'static str>,
    max_restarts: Option<i64>,
    /// `jobset-inplace.dev/inject`.
    inject: Option<&'static str>,
    annotations: Map<String, Value>,
    jobs: Vec<Job>,
    meta_extra: Map<String, Value>,
    spec_extra: Map<String, Value>,
    extra: Map<String, Value>,
}

impl Model {
    fn json(&self) -> Value {
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

    fn in_place_restart(&self) -> bool {
        self.strategy == Some("InPlaceRestart")
    }

    /// The mutation applies (CREATE): InPlaceRestart and not opted out.
    fn mutates(&self) -> bool {
        self.in_place_restart() && self.inject != Some("false")
    }

    /// The RestartPod rules the mutation rewrites (one warning each).
    fn restart_pod_rules(&self) -> usize {
        self.jobs
            .iter()
            .flat_map(|j| j.pod.all())
            .map(|(_, _, c)| c.rules.iter().filter(|r| r.action == RESTART_POD).count())
            .sum()
    }

    /// The violations validation must report, as (replicatedJob index, field path), for the
    /// object as written (`mutated: false`) or after the mutation (`mutated: true`): a violation
    /// is a bad explicit choice of the generator, or (unmutated) something the mutation adds.
    fn violations(&self, mutated: bool, config: &InjectionConfig) -> Vec<(usize, String)> {
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
fn completed(agent: &Container, sidecar: bool, config: &InjectionConfig) -> Container {
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
fn fits(rule: &Rule, sidecar: bool) -> bool {
    rule.restarts_pod() || (!sidecar && rule.action == RESTART)
}

/// The first rule covering `code` restarts what the agent guards.
fn code_restarts(agent: &Container, sidecar: bool, code: u8) -> bool {
    agent
        .rules
        .iter()
        .find(|r| r.covers(i64::from(code)))
        .is_some_and(|r| fits(r, sidecar))
}

/// `others`: the containerPorts the pod's other containers declare, with their paths.
fn agent_violations(
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

// ---------------------------------------------------------------------------------------------
// Generators.

/// Keys no Kubernetes type has, several needing JSON Pointer escapes.
fn unknown_key() -> impl Strategy<Value = String> {
    select(vec![
        "futureField",
        "x-vendor.example/setting",
        "a/b",
        "~",
        "a~b",
        "~1",
        "~0/~1",
        "/",
        "ünïcödé",
        "$ref",
        "",
        "-",
    ])
    .prop_map(str::to_owned)
}

/// Any JSON value, small; keys drawn from names the decoder reads, and odd ones (serde_json's
/// raw-value token among them when `raw`).
fn json_value(depth: u32, raw: bool) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        json_key(raw).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(depth, 48, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((json_key(raw), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Object keys for arbitrary JSON: mostly ones admission reads.
fn json_key(raw: bool) -> impl Strategy<Value = String> {
    let mut read = vec![
        "apiVersion",
        "kind",
        "request",
        "uid",
        "operation",
        "group",
        "object",
        "oldObject",
        "metadata",
        "name",
        "annotations",
        "spec",
        "failurePolicy",
        "restartStrategy",
        "maxRestarts",
        "replicatedJobs",
        "template",
        "backoffLimit",
        "podReplacementPolicy",
        "completions",
        "parallelism",
        "initContainers",
        "containers",
        "restartPolicy",
        "restartPolicyRules",
        "action",
        "exitCodes",
        "operator",
        "values",
        "env",
        "value",
        "valueFrom",
        "startupProbe",
        "httpGet",
        "port",
        "path",
        "ports",
        "containerPort",
        "serviceAccountName",
        "serviceAccount",
        "automountServiceAccountToken",
        "volumes",
        "projected",
        "sources",
        "defaultMode",
        "jobset-inplace-agent-token",
        "InPlaceRestart",
        "JobSet",
        "jobset.x-k8s.io",
    ];
    if raw {
        read.push("$serde_json::private::RawValue");
    }
    prop_oneof![
        4 => select(read).prop_map(str::to_owned),
        1 => unknown_key(),
    ]
}

/// 0-2 unknown fields (most often none).
fn unknown_fields() -> impl Strategy<Value = Map<String, Value>> {
    prop_oneof![
        2 => Just(Map::new()),
        1 => prop::collection::vec((unknown_key(), json_value(2, false)), 1..3)
            .prop_map(|kv| kv.into_iter().collect()),
    ]
}

/// Annotations beside ours, with `/` and `~` in their keys.
fn annotations() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec(
        (
            select(vec![
                "example.com/team",
                "a~b/c",
                "x/y/z",
                "~",
                "alpha.jobset.sigs.k8s.io/exclusive-topology",
            ]),
            "[a-z0-9./~-]{0,10}",
        ),
        0..3,
    )
    .prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect()
    })
}

/// What an agent container carries beside the fields the rules read.
fn agent_args() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("args".into(), json!(["agent"]));
    m
}

/// What an agent's env says about one setting.
#[derive(Clone, Debug)]
enum Setting {
    Absent,
    /// The value the rest of the agent implies (its probe's port or path).
    Matching,
    Literal(&'static str),
    ConfigMap,
}

/// `Matching` only where the rest of the agent agrees with the default (`matching_ok`), and
/// `literals` (which may conflict) only when not `careful`.
fn setting(
    literals: Vec<&'static str>,
    careful: bool,
    matching_ok: bool,
) -> impl Strategy<Value = Setting> {
    let bad = u32::from(!careful);
    prop_oneof![
        6 => Just(Setting::Absent),
        2 * u32::from(matching_ok || !careful) => Just(Setting::Matching),
        bad => select(literals).prop_map(Setting::Literal),
        1 => Just(Setting::ConfigMap),
    ]
}

/// The env of an agent: each variable of the contract present or not, good or bad, in any order,
/// between entries the rules never read.
#[derive(Clone, Debug)]
struct AgentEnv {
    downward: [bool; 3],
    exit: Option<(bool, Setting)>,
    protocol: Option<&'static str>,
    port: Option<(bool, Setting)>,
    path: Option<(bool, Setting)>,
    others: Vec<EnvVar>,
}

fn other_env() -> impl Strategy<Value = EnvVar> {
    (
        select(vec!["LOG_LEVEL", "DATA_DIR", "a.b-c", "NAMESPACE_X"]),
        "[ -~]{0,8}",
    )
        .prop_map(|(n, v)| EnvVar::literal(n, v))
}

/// The env of an agent (`careful`: nothing that conflicts with the rest of the agent).
fn agent_env(sidecar: bool, careful: bool) -> BoxedStrategy<AgentEnv> {
    let downward = prop::array::uniform3(prop::bool::weighted(0.85));
    let exit = prop::option::weighted(
        0.4,
        (
            any::<bool>(),
            setting(vec!["42", "3", " 7 ", "1", "0", "256", "x"], careful, false),
        ),
    );
    let protocol = prop::option::weighted(
        if careful { 0.01 } else { 0.3 },
        select(vec!["epoch", "attempt", "Epoch"]),
    );
    let barrier = if sidecar { 0.35 } else { 0.05 };
    let port = prop::option::weighted(
        barrier,
        (
            any::<bool>(),
            setting(vec!["9999", "http", " 9000 ", "0"], careful, true),
        ),
    );
    let path = prop::option::weighted(
        barrier,
        (
            any::<bool>(),
            setting(vec!["/other", "/barrier-is-lifted"], careful, true),
        ),
    );
    (
        downward,
        exit,
        protocol,
        port,
        path,
        prop::collection::vec(other_env(), 0..3),
    )
        .prop_map(|(downward, exit, protocol, port, path, others)| AgentEnv {
            downward,
            exit,
            protocol,
            port,
            path,
            others,
        })
        .boxed()
}

impl AgentEnv {
    /// The entries, given what the agent's probe and rules imply for `Matching`.
    fn entries(&self, probe: Option<&Probe>, ports: &[(Option<&'static str>, i64)]) -> Vec<EnvVar> {
        let mut env = self.others.clone();
        for (on, name, path) in [
            (self.downward[0], "NAMESPACE", "metadata.namespace"),
            (self.downward[1], "POD_NAME", "metadata.name"),
            (
                self.downward[2],
                "JOBSET_NAME",
                "metadata.annotations['jobset.sigs.k8s.io/jobset-name']",
            ),
        ] {
            if on {
                env.push(EnvVar::field(name, path));
            }
        }
        let probe_port = probe.and_then(|p| match &p.port {
            Value::Number(n) => n.as_i64(),
            Value::String(name) => ports
                .iter()
                .find(|(n, _)| *n == Some(name.as_str()))
                .map(|(_, p)| *p),
            _ => None,
        });
        let probe_path = probe.map(|p| p.path.clone().unwrap_or_else(|| "/".to_owned()));
        for (choice, names, matching) in [
            (&self.exit, [EXIT, EXIT_ALIAS], Some("42".to_owned())),
            (
                &self.port,
                [PORT, PORT_ALIAS],
                probe_port.map(|p| p.to_string()),
            ),
            (&self.path, [PATH, PATH_ALIAS], probe_path),
        ] {
            let Some((alias, setting)) = choice else {
                continue;
            };
            let name = names[usize::from(*alias)];
            match setting {
                Setting::Absent => {}
                Setting::Matching => {
                    if let Some(v) = matching {
                        env.push(EnvVar::literal(name, v));
                    }
                }
                Setting::Literal(v) => env.push(EnvVar::literal(name, *v)),
                Setting::ConfigMap => env.push(EnvVar {
                    name: name.to_owned(),
                    value: EnvValue::ConfigMap,
                }),
            }
        }
        if let Some(p) = self.protocol {
            env.push(EnvVar::literal(PROTOCOL, p));
        }
        env
    }
}

fn probe(careful: bool) -> BoxedStrategy<Option<(Probe, Vec<(Option<&'static str>, i64)>)>> {
    let bad = u32::from(!careful);
    let port = prop_oneof![
        6 => Just((json!(8080), vec![])),
        2 => Just((json!(9000), vec![])),
        1 => select(vec![8080i64, 9000]).prop_map(|p| (json!("barrier"), vec![(Some("barrier"), p), (None, 9100)])),
        bad => Just((json!("unknown-port"), vec![(Some("barrier"), 8080)])),
    ];
    let path = prop_oneof![
        6 => Just(Some(DEFAULT_PATH.to_owned())),
        1 => Just(Some("/ready".to_owned())),
        1 => Just(None),
    ];
    prop::option::weighted(
        if careful { 0.99 } else { 0.9 },
        (
            port,
            path,
            prop::option::of(Just(1i64)),
            prop::option::of(select(vec![60i64, 86_400])),
        )
            .prop_map(|((port, ports), path, period, threshold)| {
                (
                    Probe {
                        port,
                        path,
                        period,
                        threshold,
                    },
                    ports,
                )
            }),
    )
    .boxed()
}

/// An agent sidecar, mostly well formed, sometimes not (each defect breaks one admission rule).
fn sidecar(careful: bool) -> BoxedStrategy<Container> {
    let bad = u32::from(!careful);
    let rules = prop_oneof![
        6 => Just(vec![rule(RAC, "NotIn", &[0])]),
        2 => Just(vec![rule(RESTART_POD, "NotIn", &[0])]),
        2 => select(vec![3i64, 42]).prop_map(|c| vec![rule(RAC, "In", &[c])]),
        1 => Just(vec![rule(RAC, "NotIn", &[0, 42])]),
        1 => Just(vec![rule(RESTART, "In", &[42]), rule(RAC, "NotIn", &[0])]),
        bad => Just(vec![]),
    ];
    (
        select(vec![AGENT_NAME, "agent", "in-place-restart-agent"]),
        prop_oneof![9 => Just(Some("Always")), bad => Just(None)],
        rules,
        probe(careful),
        agent_env(true, careful),
        any::<bool>(),
        unknown_fields(),
    )
        .prop_flat_map(|(name, restart_policy, rules, probe, env, empty, extra)| {
            let (probe, ports) = probe.map_or((None, vec![]), |(p, ports)| (Some(p), ports));
            let entries = env.entries(probe.as_ref(), &ports);
            let mut extra_fields = agent_args();
            extra_fields.extend(extra);
            (
                Just(entries).prop_shuffle(),
                Just((
                    name,
                    restart_policy,
                    rules,
                    probe,
                    ports,
                    empty,
                    extra_fields,
                )),
            )
                .prop_map(
                    |(env, (name, restart_policy, rules, probe, ports, empty, extra))| Container {
                        name: name.to_owned(),
                        restart_policy,
                        rules,
                        env,
                        empty_env_list: empty,
                        probe,
                        ports,
                        extra,
                    },
                )
        })
        .boxed()
}

/// A main-container agent (the worker runs under it: `WORKER_COMMAND`).
fn main_agent(careful: bool) -> BoxedStrategy<Container> {
    let bad = u32::from(!careful);
    let rules = prop_oneof![
        6 => Just(vec![rule(RESTART, "NotIn", &[0])]),
        2 => Just(vec![rule(RAC, "NotIn", &[0])]),
        1 => Just(vec![rule(RESTART, "In", &[42])]),
        bad => Just(vec![]),
    ];
    (
        prop_oneof![9 => Just(Some("Never")), bad => Just(None)],
        rules,
        agent_env(false, careful),
        unknown_fields(),
    )
        .prop_flat_map(|(restart_policy, rules, env, extra)| {
            let mut entries = env.entries(None, &[]);
            entries.push(EnvVar::literal(WORKER_COMMAND, "python -m train"));
            (
                Just(entries).prop_shuffle(),
                Just((restart_policy, rules, extra)),
            )
                .prop_map(|(env, (restart_policy, rules, extra))| Container {
                    name: "trainer".to_owned(),
                    restart_policy,
                    rules,
                    env,
                    empty_env_list: false,
                    probe: None,
                    ports: vec![],
                    extra,
                })
        })
        .boxed()
}

/// A worker container (no agent): with or without an in-place restart rule.
fn worker(careful: bool) -> BoxedStrategy<Container> {
    let rules = prop_oneof![
        3 => Just(vec![]),
        4 => Just(vec![rule(RAC, "NotIn", &[0])]),
        1 => Just(vec![rule(RESTART_POD, "NotIn", &[0])]),
        1 => Just(vec![rule(RESTART, "In", &[3]), rule(RAC, "NotIn", &[0])]),
    ];
    (
        rules,
        prop::bool::weighted(if careful { 0.999 } else { 0.9 }),
        prop::collection::vec(other_env(), 0..3),
        any::<bool>(),
        unknown_fields(),
        // Ports an injected agent's barrier must avoid (8080 is the default one, 9000 and 9001
        // the non-default config's), and one it cannot collide with.
        prop_oneof![
            6 => Just(vec![(None, 6000)]),
            1 => Just(vec![(None, 8080)]),
            1 => Just(vec![(Some("http"), 6000), (None, 9000)]),
            1 => Just(vec![(None, 9001), (Some("alt"), 18080)]),
        ],
    )
        .prop_map(|(rules, policy, env, empty, mut extra, ports)| {
            extra.insert("command".into(), json!(["python", "-m", "train"]));
            Container {
                name: String::new(),
                restart_policy: policy.then_some("Never"),
                rules,
                env,
                empty_env_list: empty,
                probe: None,
                ports,
                extra,
            }
        })
        .boxed()
}

/// An init container that is not an agent (a setup step, or a sidecar such as a log shipper).
fn plain_init() -> BoxedStrategy<Container> {
    (
        select(vec!["setup", "log-shipper"]),
        prop::option::of(Just("Always")),
        unknown_fields(),
        prop_oneof![6 => Just(vec![]), 1 => Just(vec![(Some("metrics"), 8080)])],
    )
        .prop_map(|(name, restart_policy, mut extra, ports)| {
            extra.insert("command".into(), json!(["true"]));
            Container {
                name: name.to_owned(),
                restart_policy,
                rules: vec![],
                env: vec![],
                empty_env_list: false,
                probe: None,
                ports,
                extra,
            }
        })
        .boxed()
}

#[derive(Clone, Copy, Debug)]
enum Agents {
    None,
    Sidecar,
    Main,
    TwoSidecars,
    SidecarAndMain,
}

/// A pod's own `imagePullSecrets`, entries with fields the code does not model among them (the
/// non-default config adds `agent-registry`).
fn pull_secrets() -> impl Strategy<Value = Option<Vec<Value>>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(vec![])),
        1 => Just(Some(vec![json!({"name": "team-registry"})])),
        1 => Just(Some(vec![
            json!({"name": "team-registry", "futureField": {"a/b": [1, "~"]}}),
            json!({"name": "agent-registry", "x-vendor.example/setting": true}),
        ])),
    ]
}

fn pod(careful: bool) -> BoxedStrategy<Pod> {
    let bad = u32::from(!careful);
    let layout = prop_oneof![
        4 => Just(Agents::None),
        5 => Just(Agents::Sidecar),
        2 => Just(Agents::Main),
        bad => Just(Agents::TwoSidecars),
        bad => Just(Agents::SidecarAndMain),
    ];
    let metadata = prop::option::weighted(
        0.5,
        (
            prop::option::of((
                annotations(),
                prop::option::of(select(vec![env!("CARGO_PKG_VERSION"), "0.0.1"])),
            )),
            unknown_fields(),
        ),
    );
    (
        layout,
        prop::collection::vec(plain_init(), 0..3),
        any::<bool>(),
        prop::collection::vec(worker(careful), 1..4),
        (sidecar(careful), sidecar(careful), main_agent(careful)),
        (any::<Index>(), any::<Index>(), any::<Index>()),
        (prop::option::weighted(0.3, Just("trainer")), pull_secrets()),
        metadata,
        unknown_fields(),
    )
        .prop_map(
            |(
                layout,
                mut init,
                init_key,
                mut containers,
                agents,
                at,
                (sa, pull_secrets),
                metadata,
                extra,
            )| {
                for (i, c) in containers.iter_mut().enumerate() {
                    c.name = format!("w{i}");
                }
                let (side, side2, main) = agents;
                let mut put_init = |c: Container, at: Index| {
                    let i = at.index(init.len() + 1);
                    init.insert(i, c);
                };
                match layout {
                    Agents::None => {}
                    Agents::Sidecar => put_init(side, at.0),
                    Agents::TwoSidecars => {
                        put_init(side, at.0);
                        put_init(side2, at.1);
                    }
                    Agents::Main | Agents::SidecarAndMain => {
                        if let Agents::SidecarAndMain = layout {
                            put_init(side, at.0);
                        }
                        let i = at.2.index(containers.len() + 1);
                        containers.insert(i, main);
                    }
                }
                let metadata = metadata.map(|(annotations, extra)| {
                    let annotations = annotations.map(|(mut a, injected)| {
                        if let Some(v) = injected {
                            a.insert(INJECTED.into(), json!(v));
                        }
                        a
                    });
                    (annotations, extra)
                });
                Pod {
                    init: (init_key || !init.is_empty()).then_some(init),
                    containers,
                    service_account: sa,
                    pull_secrets,
                    metadata,
                    extra,
                }
            },
        )
        .boxed()
}

fn job(careful: bool) -> BoxedStrategy<Job> {
    let bad = u32::from(!careful);
    let backoff = prop_oneof![
        3 => Just(None),
        6 => Just(Some(MAX_BACKOFF)),
        bad => select(vec![0i64, 6, MAX_BACKOFF - 1]).prop_map(Some),
    ];
    let policy = prop_oneof![
        3 => Just(None),
        6 => Just(Some("Failed")),
        bad => Just(Some("TerminatingOrFailed")),
    ];
    let sizes = (1i64..=16).prop_flat_map(move |n| {
        prop_oneof![
            8 => Just((Some(n), Some(n))),
            // Left to Kubernetes' defaults, which the mutation writes.
            1 => Just((None, None)),
            1 => Just((Some(1), None)),
            bad => Just((Some(n), Some(n + 1))),
            bad => Just((None, Some(n))),
            bad => Just((Some(n), None)),
        ]
    });
    (
        1i64..=4,
        backoff,
        policy,
        sizes,
        prop::bool::weighted(0.3),
        pod(careful),
        unknown_fields(),
        unknown_fields(),
    )
        .prop_map(
            |(
                replicas,
                backoff,
                policy,
                (completions, parallelism),
                pfp,
                pod,
                spec_extra,
                extra,
            )| {
                Job {
                    replicas,
                    backoff,
                    pod_replacement_policy: policy,
                    completions,
                    parallelism,
                    pod_failure_policy: pfp,
                    pod,
                    spec_extra,
                    extra,
                }
            },
        )
        .boxed()
}

/// A JobSet; half of them drawn `careful` (no explicit value conflicts with the admission rules), so
/// that both accepted and denied JobSets are common.
fn model() -> BoxedStrategy<Model> {
    any::<bool>().prop_flat_map(model_of).boxed()
}

fn model_of(careful: bool) -> BoxedStrategy<Model> {
    let strategy = prop_oneof![
        8 => Just(Some("InPlaceRestart")),
        1 => Just(Some("Recreate")),
        1 => Just(None),
    ];
    let inject = prop_oneof![
        6 => Just(None),
        1 => Just(Some("false")),
        1 => Just(Some("true")),
        1 => Just(Some("False")),
    ];
    (
        strategy,
        prop::option::of(0i64..=10),
        inject,
        annotations(),
        prop::collection::vec(job(careful), 1..=4),
        (unknown_fields(), unknown_fields(), unknown_fields()),
    )
        .prop_map(
            |(strategy, max_restarts, inject, annotations, jobs, (meta, spec, top))| Model {
                strategy,
                max_restarts,
                inject,
                annotations,
                jobs,
                meta_extra: meta,
                spec_extra: spec,
                extra: top,
            },
        )
        .boxed()
}

/// An AdmissionReview request around an object.
fn review(
    uid: &str,
    operation: &str,
    (group, kind): (&str, &str),
    object: Option<&Value>,
    old: Option<&Value>,
    dry_run: Option<bool>,
) -> Value {
    let mut request = Map::new();
    request.insert("uid".into(), json!(uid));
    request.insert(
        "kind".into(),
        json!({"group": group, "version": "v1alpha2", "kind": kind}),
    );
    request.insert(
        "resource".into(),
        json!({"group": group, "version": "v1alpha2", "resource": "jobsets"}),
    );
    request.insert("name".into(), json!("prop"));
    request.insert("namespace".into(), json!("team-a"));
    request.insert("operation".into(), json!(operation));
    request.insert(
        "userInfo".into(),
        json!({"username": "alice@example.com", "groups": ["system:authenticated"]}),
    );
    request.insert("object".into(), object.cloned().unwrap_or(Value::Null));
    request.insert("oldObject".into(), old.cloned().unwrap_or(Value::Null));
    if let Some(d) = dry_run {
        request.insert("dryRun".into(), json!(d));
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

fn uid() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        1 => "\\PC{1,16}",
    ]
}

// ---------------------------------------------------------------------------------------------
// Checks.

type Check = Result<(), TestCaseError>;

/// A response as the API server expects it: 200, the review framing, the uid echoed, `allowed`,
/// a base64 JSON Patch only with `patchType: JSONPatch`, a `Status` when denied, warnings as
/// strings, nothing else. Returns `response` and the decoded patch.
fn well_formed(
    reply: &admission::Reply,
    uid: &str,
) -> Result<(Value, Option<json_patch::Patch>), TestCaseError> {
    prop_assert_eq!(
        reply.http_status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let review: Value = serde_json::from_slice(&reply.body)
        .map_err(|e| TestCaseError::fail(format!("response is not JSON: {e}")))?;
    prop_assert_eq!(&review["apiVersion"], "admission.k8s.io/v1");
    prop_assert_eq!(&review["kind"], "AdmissionReview");
    let response = review["response"].clone();
    prop_assert_eq!(&response["uid"], uid, "uid echoed");
    let Some(allowed) = response["allowed"].as_bool() else {
        return Err(TestCaseError::fail(format!("no allowed: {response}")));
    };
    for key in response.as_object().into_iter().flat_map(|o| o.keys()) {
        prop_assert!(
            ["uid", "allowed", "status", "patchType", "patch", "warnings"].contains(&key.as_str()),
            "unexpected response key {}",
            key
        );
    }
    let patch = match response.get("patch") {
        None => {
            prop_assert!(response.get("patchType").is_none());
            None
        }
        Some(patch) => {
            prop_assert!(allowed, "a denial carries a patch");
            prop_assert_eq!(&response["patchType"], "JSONPatch");
            let bytes = patch
                .as_str()
                .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok())
                .ok_or_else(|| TestCaseError::fail("patch is not base64"))?;
            let patch: json_patch::Patch = serde_json::from_slice(&bytes)
                .map_err(|e| TestCaseError::fail(format!("not a JSON Patch: {e}")))?;
            prop_assert!(!patch.0.is_empty(), "an empty patch is sent");
            Some(patch)
        }
    };
    if allowed {
        prop_assert!(response.get("status").is_none(), "{}", response);
    } else {
        let code = response["status"]["code"].as_i64();
        prop_assert!(matches!(code, Some(400 | 422)), "{}", response);
        prop_assert_eq!(&response["status"]["status"], "Failure");
    }
    if let Some(w) = response.get("warnings") {
        let all_strings = w
            .as_array()
            .is_some_and(|w| !w.is_empty() && w.iter().all(Value::is_string));
        prop_assert!(all_strings, "warnings: {}", w);
    }
    Ok((response, patch))
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The JSON Pointer token of a key.
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Every operation adds at an absent key or appends to an array, or rewrites a `RestartPod`
/// action, or restamps the injected annotation, or names a service account where the template
/// names an empty one: nothing the user wrote is removed or overwritten.
fn only_adds(object: &Value, patch: &json_patch::Patch) -> Check {
    for op in &patch.0 {
        match op {
            json_patch::PatchOperation::Add(add) => {
                let path = add.path.as_str();
                let ok = path.ends_with("/-")
                    || match object.pointer(path) {
                        None => true,
                        Some(old) => {
                            (path.ends_with(&format!("/{}", token(INJECTED)))
                                && old != &json!(env!("CARGO_PKG_VERSION")))
                                || (path.ends_with("/serviceAccountName") && old == "")
                        }
                    };
                prop_assert!(ok, "add overwrites {}", path);
            }
            json_patch::PatchOperation::Replace(replace) => {
                let path = replace.path.as_str();
                prop_assert!(path.ends_with("/action"), "replaces {}", path);
                prop_assert_eq!(object.pointer(path), Some(&json!(RESTART_POD)));
                prop_assert_eq!(&replace.value, &json!(RAC));
            }
            other => return Err(TestCaseError::fail(format!("operation {other:?}"))),
        }
    }
    Ok(())
}

/// Every scalar of `before` is in `after` at the same place, unchanged (but for the exceptions
/// [`only_adds`] allows); every object and array is still one.
fn preserved(before: &Value, after: &Value, at: &str) -> Check {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (key, value) in b {
                let path = format!("{at}/{}", token(key));
                match a.get(key) {
                    Some(after) => preserved(value, after, &path)?,
                    None => return Err(TestCaseError::fail(format!("{path} is gone"))),
                }
            }
            Ok(())
        }
        (Value::Array(b), Value::Array(a)) => {
            prop_assert!(a.len() >= b.len(), "{} shrank", at);
            for (i, (value, after)) in b.iter().zip(a).enumerate() {
                preserved(value, after, &format!("{at}/{i}"))?;
            }
            Ok(())
        }
        (b, a) if b == a => Ok(()),
        (b, a) => {
            let allowed = (at.ends_with("/action") && b == RESTART_POD && a == RAC)
                || at.ends_with(&format!("/{}", token(INJECTED)))
                || (at.ends_with("/serviceAccountName") && b == "");
            prop_assert!(allowed, "{} changed from {} to {}", at, b, a);
            Ok(())
        }
    }
}

fn schema_valid(object: &Value, what: &str) -> Check {
    let errors = fixtures::schema_errors(schema(), object);
    prop_assert!(
        errors.is_empty(),
        "{}: the CRD schema rejects it: {:#?}",
        what,
        errors
    );
    Ok(())
}

/// CREATE through the mutating then the validating webhook, as the API server chains them.
fn create(model: &Model, uid: &str, which: usize, dry_run: Option<bool>) -> Check {
    let config = injection_config(which);
    let object = model.json();
    schema_valid(&object, "the generated JobSet")?;
    let request = review(
        uid,
        "CREATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&object),
        None,
        dry_run,
    );
    let body = serde_json::to_vec(&request).expect("JSON");

    // Mutation.
    let reply = admission::review(Endpoint::Mutate, &body, &config);
    let (response, patch) = well_formed(&reply, uid)?;
    prop_assert_eq!(&response["allowed"], &json!(true));
    // Dry-run or not, the same answer.
    let mut flipped = request.clone();
    flipped["request"]["dryRun"] = json!(!dry_run.unwrap_or(false));
    let flipped = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&flipped).expect("JSON"),
        &config,
    );
    prop_assert_eq!(&flipped, &reply, "dryRun changes the answer");

    let mut mutated = object.clone();
    match &patch {
        None => {
            // Only a JobSet that already has everything the mutation adds gets no patch.
            if model.mutates() {
                prop_assert_eq!(
                    model.violations(false, &config),
                    model.violations(true, &config)
                );
            }
        }
        Some(patch) => {
            prop_assert!(model.mutates(), "patches a JobSet it must leave alone");
            only_adds(&object, patch)?;
            json_patch::patch(&mut mutated, patch)
                .map_err(|e| TestCaseError::fail(format!("the patch does not apply: {e}")))?;
            preserved(&object, &mutated, "")?;
            schema_valid(&mutated, "the mutated JobSet")?;
            prop_assert_eq!(reply.outcome, admission::ReviewOutcome::Patched);
        }
    }
    if model.mutates() {
        let rewrites = warnings(&response)
            .iter()
            .filter(|w| w.contains("RestartPod rewritten"))
            .count();
        prop_assert_eq!(
            rewrites,
            model
                .restart_pod_rules()
                .min(admission::validate::MAX_WARNINGS)
        );
    }

    // Idempotence: the mutated object gets no patch.
    let request2 = review(
        uid,
        "CREATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&mutated),
        None,
        dry_run,
    );
    let body2 = serde_json::to_vec(&request2).expect("JSON");
    let again = admission::review(Endpoint::Mutate, &body2, &config);
    let (_, patch) = well_formed(&again, uid)?;
    prop_assert!(patch.is_none(), "second mutation patches: {:?}", patch);

    if model.mutates() {
        // Every pod template the webhook injected the agent into can pull its image.
        for (i, job) in model.jobs.iter().enumerate() {
            if !job.pod.agents().is_empty() {
                continue;
            }
            let pod = &mutated["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"];
            let names: Vec<&Value> = pod["imagePullSecrets"]
                .as_array()
                .map(|l| l.iter().map(|e| &e["name"]).collect())
                .unwrap_or_default();
            for secret in &config.image_pull_secrets {
                let count = names.iter().filter(|n| **n == secret).count();
                prop_assert_eq!(count, 1, "{}: {:?}", secret, names);
            }
        }
        // A client that writes the JobSet again as it built it (Kubeflow Trainer's apply), or
        // without the agents alone, changes nothing once the UPDATE is mutated.
        written_again(uid, &object, &mutated, &config)?;
        let mut stripped = mutated.clone();
        for (i, job) in model.jobs.iter().enumerate() {
            if !job.pod.agents().is_empty() {
                continue;
            }
            let pod =
                &mut stripped["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"];
            if job.pod.init.is_none() {
                if let Some(p) = pod.as_object_mut() {
                    p.remove("initContainers");
                }
            } else if let Some(init) = pod["initContainers"].as_array_mut() {
                init.retain(|c| c["name"] != AGENT_NAME);
            }
        }
        written_again(uid, &stripped, &mutated, &config)?;
    }

    // Validation of the mutated object: denied exactly for the explicit conflicts.
    let reply = admission::review(Endpoint::Validate, &body2, &config);
    let (response, patch) = well_formed(&reply, uid)?;
    prop_assert!(patch.is_none(), "validation patches");
    let expected = sorted(
        model
            .violations(model.mutates(), &config)
            .into_iter()
            .map(|(_, p)| p)
            .collect(),
    );
    let got = sorted(violation_fields(&response));
    capped_eq(&got, &expected, &response)?;
    prop_assert_eq!(&response["allowed"], &json!(expected.is_empty()));
    if !expected.is_empty() {
        prop_assert_eq!(&response["status"]["code"], &json!(422));
        prop_assert_eq!(reply.outcome, admission::ReviewOutcome::Denied);
    }
    // The value path (the offline commands') agrees.
    prop_assert_eq!(
        oracle::review_through_value(Endpoint::Validate, &body2, &config),
        Some(reply.body)
    );
    Ok(())
}

/// An UPDATE of the stored JobSet `stored` to `written` (which lacks some of what the webhook
/// injected) is patched back to `stored` exactly, and the patched object is not patched again.
fn written_again(uid: &str, written: &Value, stored: &Value, config: &InjectionConfig) -> Check {
    let request = review(
        uid,
        "UPDATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(written),
        Some(stored),
        None,
    );
    let reply = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&request).expect("JSON"),
        config,
    );
    let (_, patch) = well_formed(&reply, uid)?;
    let mut result = written.clone();
    if let Some(patch) = &patch {
        only_adds(written, patch)?;
        json_patch::patch(&mut result, patch)
            .map_err(|e| TestCaseError::fail(format!("the patch does not apply: {e}")))?;
    }
    prop_assert_eq!(
        &result,
        stored,
        "the UPDATE patch does not restore the stored JobSet"
    );
    let again = review(
        uid,
        "UPDATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&result),
        Some(stored),
        None,
    );
    let again = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&again).expect("JSON"),
        config,
    );
    let (_, patch) = well_formed(&again, uid)?;
    prop_assert!(
        patch.is_none(),
        "an UPDATE to the stored JobSet is patched: {:?}",
        patch
    );
    Ok(())
}

/// The replicatedJob index of a patch operation's path (`/spec/replicatedJobs/N/...`).
fn job_of(op: &json_patch::PatchOperation) -> Option<usize> {
    op.path()
        .as_str()
        .strip_prefix("/spec/replicatedJobs/")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// How an UPDATE's old object differs from the new one.
#[derive(Clone, Debug)]
enum Old {
    Absent,
    Same,
    /// One replicatedJob (index modulo their count) has another replica count.
    JobChanged(Index),
    /// The old JobSet was not InPlaceRestart.
    WasRecreate,
}

fn update(model: &Model, uid: &str, old: &Old, which: usize) -> Check {
    let config = injection_config(which);
    let object = model.json();
    let mut changed = None;
    let old_object = match old {
        Old::Absent => None,
        Old::Same => Some(object.clone()),
        Old::JobChanged(at) => {
            let i = at.index(model.jobs.len());
            changed = Some(i);
            let mut old = model.clone();
            old.jobs[i].replicas += 1;
            Some(old.json())
        }
        Old::WasRecreate => {
            let mut old = model.clone();
            old.strategy = Some("Recreate");
            Some(old.json())
        }
    };
    let body = serde_json::to_vec(&review(
        uid,
        "UPDATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&object),
        old_object.as_ref(),
        None,
    ))
    .expect("JSON");
    // The mutation of an UPDATE puts back into the replicatedJobs the stored JobSet shows
    // injected what the stored one carries (here all of it: nothing is missing), and rewrites
    // their `RestartPod` actions as CREATE does; it adds nothing of this version's injection, and
    // nothing to the others.
    let reinjected: Vec<usize> = match old {
        Old::Same | Old::JobChanged(_) if model.mutates() => (0..model.jobs.len())
            .filter(|i| model.jobs[*i].pod.injected())
            .collect(),
        _ => vec![],
    };
    let (response, patch) = well_formed(&admission::review(Endpoint::Mutate, &body, &config), uid)?;
    prop_assert_eq!(&response["allowed"], &json!(true));
    let create = admission::mutate(&object, &config);
    let expected: Vec<_> = create
        .patch
        .0
        .into_iter()
        .filter(|op| job_of(op).is_some_and(|i| reinjected.contains(&i)))
        .filter(|op| matches!(op, json_patch::PatchOperation::Replace(_)))
        .collect();
    prop_assert_eq!(patch.map(|p| p.0).unwrap_or_default(), expected);
    if create.warnings.len() <= admission::validate::MAX_WARNINGS {
        let expected: Vec<String> = create
            .warnings
            .into_iter()
            .filter(|w| {
                w.contains("RestartPod rewritten")
                    && reinjected
                        .iter()
                        .any(|i| w.starts_with(&format!("spec.replicatedJobs[{i}]:")))
            })
            .collect();
        prop_assert_eq!(warnings(&response), expected);
    }

    let all = model.violations(false, &config);
    let ratchets = matches!(old, Old::Same | Old::JobChanged(_));
    let (kept, ratcheted): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(i, _)| !ratchets || Some(*i) == changed);
    let reply = admission::review(Endpoint::Validate, &body, &config);
    let (response, _) = well_formed(&reply, uid)?;
    let expected = sorted(kept.into_iter().map(|(_, p)| p).collect());
    capped_eq(&sorted(violation_fields(&response)), &expected, &response)?;
    prop_assert_eq!(&response["allowed"], &json!(expected.is_empty()));
    let left = warnings(&response)
        .iter()
        .filter(|w| w.contains("left as it was"))
        .count();
    if warnings(&response).len() <= admission::validate::MAX_WARNINGS {
        prop_assert_eq!(left, ratcheted.len());
    } else {
        // Past the cap the rest is counted in a last warning.
        prop_assert!(left <= ratcheted.len());
        prop_assert!(
            warnings(&response)
                .last()
                .is_some_and(|w| w.contains("more warnings"))
        );
    }
    prop_assert_eq!(
        oracle::review_through_value(Endpoint::Validate, &body, &config),
        Some(reply.body)
    );
    Ok(())
}

/// DELETE and CONNECT are allowed as they are; other kinds too; an unknown operation is answered
/// with a denial naming it.
fn other_requests(model: &Model, uid: &str, operation: &str, kind: (&str, &str)) -> Check {
    let config = injection_config(0);
    let object = model.json();
    let body = serde_json::to_vec(&review(
        uid,
        operation,
        kind,
        Some(&object),
        Some(&object),
        Some(true),
    ))
    .expect("JSON");
    let is_jobset = kind == ("jobset.x-k8s.io", "JobSet");
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let reply = admission::review(endpoint, &body, &config);
        let (response, patch) = well_formed(&reply, uid)?;
        match operation {
            "DELETE" | "CONNECT" => {
                prop_assert_eq!(&response, &json!({"uid": uid, "allowed": true}));
            }
            "CREATE" | "UPDATE" if !is_jobset => {
                prop_assert_eq!(&response, &json!({"uid": uid, "allowed": true}));
            }
            "CREATE" | "UPDATE" => {
                prop_assert!(patch.is_none() || endpoint == Endpoint::Mutate);
            }
            _ => {
                prop_assert_eq!(&response["allowed"], &json!(false));
                prop_assert_eq!(&response["status"]["code"], &json!(400));
                let message = response["status"]["message"].as_str().unwrap_or("");
                prop_assert!(message.contains("request.operation"), "{}", message);
            }
        }
        prop_assert_eq!(
            oracle::review_through_value(endpoint, &body, &config),
            Some(reply.body)
        );
    }
    Ok(())
}

/// Any body: never a panic; 200 with the uid echoed exactly when a `Value` reading finds a
/// non-empty string uid, else 400 with a `Status`; the same bytes as the value path.
fn any_body(body: &[u8], which: usize) -> Check {
    let config = injection_config(which);
    let value = serde_json::from_slice::<Value>(body).ok();
    let uid = value
        .as_ref()
        .and_then(|v| v.pointer("/request/uid"))
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty());
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let reply = admission::review(endpoint, body, &config);
        match uid {
            Some(uid) => {
                well_formed(&reply, uid)?;
                if let Some(expected) = oracle::review_through_value(endpoint, body, &config) {
                    prop_assert_eq!(
                        String::from_utf8_lossy(&reply.body),
                        String::from_utf8_lossy(&expected)
                    );
                }
            }
            None => {
                prop_assert_eq!(reply.http_status, 400);
                let status: Value = serde_json::from_slice(&reply.body)
                    .map_err(|e| TestCaseError::fail(format!("status is not JSON: {e}")))?;
                prop_assert_eq!(&status["kind"], "Status");
                prop_assert_eq!(&status["code"], &json!(400));
                prop_assert_eq!(reply.outcome, admission::ReviewOutcome::Error);
            }
        }
    }
    Ok(())
}

/// Places in a review where an odd value goes.
const ODD_PLACES: &[&str] = &[
    "",
    "/apiVersion",
    "/kind",
    "/request",
    "/request/uid",
    "/request/operation",
    "/request/kind",
    "/request/kind/group",
    "/request/kind/kind",
    "/request/dryRun",
    "/request/object",
    "/request/oldObject",
    "/request/object/metadata",
    "/request/object/metadata/annotations",
    "/request/object/spec",
    "/request/object/spec/failurePolicy",
    "/request/object/spec/failurePolicy/restartStrategy",
    "/request/object/spec/replicatedJobs",
    "/request/object/spec/replicatedJobs/0",
    "/request/object/spec/replicatedJobs/0/template/spec",
    "/request/object/spec/replicatedJobs/0/template/spec/backoffLimit",
    "/request/object/spec/replicatedJobs/0/template/spec/completions",
    "/request/object/spec/replicatedJobs/0/template/spec/template",
    "/request/object/spec/replicatedJobs/0/template/spec/template/metadata",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0/restartPolicyRules",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0/startupProbe",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0/ports",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/automountServiceAccountToken",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/volumes",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/volumes/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/volumes/0/projected",
];

/// Sets (or removes, for `None`) the value at a pointer whose parent exists.
fn set(root: &mut Value, pointer: &str, value: Option<Value>) {
    let Some((parent, key)) = pointer.rsplit_once('/') else {
        if let Some(v) = value {
            *root = v;
        }
        return;
    };
    match root.pointer_mut(parent) {
        Some(Value::Object(map)) => match value {
            Some(v) => {
                map.insert(key.to_owned(), v);
            }
            None => {
                map.remove(key);
            }
        },
        Some(Value::Array(items)) => {
            if let Ok(i) = key.parse::<usize>()
                && i < items.len()
            {
                match value {
                    Some(v) => items[i] = v,
                    None => {
                        items.remove(i);
                    }
                }
            }
        }
        _ => {}
    }
}

/// An odd value: any JSON, one wrapped as serde_json's raw value, a broken raw value, or absence.
fn odd_value() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        1 => Just(None),
        4 => json_value(3, true).prop_map(Some),
        1 => json_value(2, true).prop_map(|v| Some(json!({"$serde_json::private::RawValue": v.to_string()}))),
        1 => token_volume_variant().prop_map(Some),
        1 => select(vec![json!({"$serde_json::private::RawValue": 5}),
                         json!({"$serde_json::private::RawValue": "{"}),
                         json!({"$serde_json::private::RawValue": "1", "b": 2})]).prop_map(Some),
    ]
}

/// The injected agent's token volume (issue 21 item 4: recognised only as written exactly), as a
/// volume, as the volumes list, or with one part replaced by an odd value or by a raw value of
/// itself.
fn token_volume_variant() -> impl Strategy<Value = Value> {
    let volume = admission::sidecar::token_volume();
    let parts = [
        "/name",
        "/projected",
        "/projected/defaultMode",
        "/projected/sources",
        "/projected/sources/0",
        "/projected/sources/0/serviceAccountToken/expirationSeconds",
        "/projected/sources/1/configMap/items",
        "/projected/sources/2/downwardAPI/items/0/fieldRef",
    ];
    (
        select(parts.to_vec()),
        prop_oneof![json_value(2, true).prop_map(Some), Just(None)],
        0..4u8,
    )
        .prop_map(move |(part, odd, how)| {
            let mut v = volume.clone();
            match how {
                0 => {}
                1 => {
                    if let Some(x) = v.pointer_mut(part) {
                        *x = json!({"$serde_json::private::RawValue": x.to_string()});
                    }
                }
                _ => set(&mut v, part, odd),
            }
            if how == 3 { json!([v]) } else { v }
        })
}

/// An edit of a body's bytes.
#[derive(Clone, Debug)]
enum ByteEdit {
    Flip(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Truncate(Index),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let interesting = prop_oneof![
        any::<u8>(),
        select(b"{}[]\",:\\0123456789-+.eEtrufalsn \xff\xc3".to_vec()),
    ];
    prop_oneof![
        (any::<Index>(), interesting.clone()).prop_map(|(i, b)| ByteEdit::Flip(i, b)),
        (any::<Index>(), interesting).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        any::<Index>().prop_map(ByteEdit::Delete),
        any::<Index>().prop_map(ByteEdit::Truncate),
    ]
}

fn apply_byte_edit(body: &mut Vec<u8>, edit: &ByteEdit) {
    if body.is_empty() {
        return;
    }
    match edit {
        ByteEdit::Flip(i, b) => {
            let i = i.index(body.len());
            body[i] = *b;
        }
        ByteEdit::Insert(i, b) => {
            let i = i.index(body.len() + 1);
            body.insert(i, *b);
        }
        ByteEdit::Delete(i) => {
            let i = i.index(body.len());
            body.remove(i);
        }
        ByteEdit::Truncate(i) => {
            let i = i.index(body.len());
            body.truncate(i);
        }
    }
}

/// The violations reported are the expected ones, or, past the cap, the first
/// [`admission::validate::MAX_VIOLATIONS`] of them with a count of the rest.
fn capped_eq(got: &[String], expected: &[String], response: &Value) -> Result<(), TestCaseError> {
    if expected.len() <= admission::validate::MAX_VIOLATIONS {
        prop_assert_eq!(got, expected, "violations of {:#}", response);
    } else {
        prop_assert_eq!(got.len(), admission::validate::MAX_VIOLATIONS);
        prop_assert!(got.iter().all(|g| expected.contains(g)), "{:#}", response);
        let message = response["status"]["message"].as_str().unwrap_or("");
        prop_assert!(message.contains("more violations"), "{}", message);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The properties.

proptest! {
    #![proptest_config(cases(96))]

    #[test]
    fn create_mutates_safely_and_validates_exactly_the_explicit_conflicts(
        model in model(),
        uid in uid(),
        which in 0..INJECTION_CONFIGS,
        dry_run in prop::option::of(any::<bool>()),
    ) {
        create(&model, &uid, which, dry_run)?;
    }

    #[test]
    fn update_ratchets_only_unchanged_replicated_jobs(
        model in model(),
        uid in uid(),
        old in prop_oneof![
            Just(Old::Absent),
            Just(Old::Same),
            any::<Index>().prop_map(Old::JobChanged),
            Just(Old::WasRecreate),
        ],
        which in 0..INJECTION_CONFIGS,
    ) {
        update(&model, &uid, &old, which)?;
    }
}

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn other_operations_and_kinds(
        model in model(),
        uid in uid(),
        operation in select(vec!["DELETE", "CONNECT", "CREATE", "UPDATE", "PATCH", "create"]),
        kind in select(vec![
            ("jobset.x-k8s.io", "JobSet"),
            ("batch", "Job"),
            ("", "Pod"),
            ("jobset.x-k8s.io", "JobSetList"),
            ("jobset.x-k8s.io.evil", "JobSet"),
        ]),
    ) {
        other_requests(&model, &uid, operation, kind)?;
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn reviews_with_missing_or_odd_fields(
        model in model(),
        uid in uid(),
        edits in prop::collection::vec((select(ODD_PLACES.to_vec()), odd_value()), 1..4),
        operation in select(vec!["CREATE", "UPDATE"]),
        which in 0..INJECTION_CONFIGS,
    ) {
        let object = model.json();
        let mut request = review(
            &uid, operation, ("jobset.x-k8s.io", "JobSet"), Some(&object), Some(&object), None,
        );
        for (place, value) in edits {
            set(&mut request, place, value);
        }
        any_body(&serde_json::to_vec(&request).expect("JSON"), which)?;
    }

    #[test]
    fn arbitrary_json_bodies(body in json_value(5, true), which in 0..INJECTION_CONFIGS) {
        any_body(&serde_json::to_vec(&body).expect("JSON"), which)?;
        // As an AdmissionReview's request, and as its object.
        let wrapped = review("u-1", "CREATE", ("jobset.x-k8s.io", "JobSet"), Some(&body), None, None);
        any_body(&serde_json::to_vec(&wrapped).expect("JSON"), which)?;
        let mut as_request = wrapped;
        as_request["request"] = body;
        any_body(&serde_json::to_vec(&as_request).expect("JSON"), which)?;
    }

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256), which in 0..INJECTION_CONFIGS) {
        any_body(&body, which)?;
    }

    #[test]
    fn edited_bytes_of_a_review(
        model in model(),
        edits in prop::collection::vec(byte_edit(), 1..6),
        which in 0..INJECTION_CONFIGS,
    ) {
        let object = model.json();
        let mut body = serde_json::to_vec(&review(
            "u-2", "CREATE", ("jobset.x-k8s.io", "JobSet"), Some(&object), None, None,
        ))
        .expect("JSON");
        for edit in &edits {
            apply_byte_edit(&mut body, edit);
        }
        any_body(&body, which)?;
    }
}

/// The generator is not vacuous: among JobSets it draws, some mutate and some do not, some are
/// accepted after the mutation and some denied, with every kind of violation the model knows.
#[test]
fn the_generator_covers_accepted_and_denied_jobsets() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let config = injection_config(0);
    let strategy = model();
    let (mut mutates, mut accepted, mut denied) = (0, 0, 0);
    let mut kinds = std::collections::BTreeSet::new();
    for _ in 0..300 {
        let model = strategy.new_tree(&mut runner).expect("a model").current();
        if model.mutates() {
            mutates += 1;
            let violations = model.violations(true, &config);
            if violations.is_empty() {
                accepted += 1;
            } else {
                denied += 1;
            }
            for (_, path) in violations {
                let tail = path.rsplit('.').next().unwrap_or("").to_owned();
                let tail = tail.split('[').next().unwrap_or("").to_owned();
                kinds.insert(tail);
            }
        }
    }
    eprintln!("{mutates} of 300 mutate: {accepted} accepted, {denied} denied; {kinds:?}");
    assert!(mutates > 150 && mutates < 300);
    assert!(accepted > 50 && denied > 50);
    for kind in [
        "backoffLimit",
        "podReplacementPolicy",
        "completions",
        "parallelism",
        "restartPolicy",
        "restartPolicyRules",
        "env",
        "value",
        "startupProbe",
        "port",
        "path",
        "initContainers",
        "containers",
        "containerPort",
    ] {
        assert!(kinds.contains(kind), "no {kind} violation drawn: {kinds:?}");
    }
}
