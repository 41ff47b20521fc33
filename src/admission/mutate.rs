//! Mutation of InPlaceRestart JobSets (docs/architecture.md, "Admission"): the agent sidecar, its env, the service
//! account, the Job fields the protocol needs (with `completions`/`parallelism` where Kubernetes
//! would default them to 1), as targeted JSON Patch operations. Fields this code
//! does not model are never touched; mutating an already-mutated JobSet yields no operation.
//!
//! The operations are built with their values already JSON text ([`Op`]): the review writes them
//! into its response as they are, and the agent container is serialized once per JobSet (once per
//! barrier port it takes there), not once per replicatedJob. [`mutate`] turns them into a [`json_patch::Patch`] for the offline commands.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::{Value, json};

#[cfg(any(test, feature = "test-api"))]
use super::Mutation;
use super::config::InjectionConfig;
use super::lenient::Present;
use super::patch::{Op, Ptr, add, ptr, to_json};
use super::pod::{self, Agent, AgentMode, Container, ContainerList};
use super::rule::{self, Rule};
use super::sidecar::{
    TOKEN_VOLUME, agent_container, barrier_hold_env, field_env, literal_env, token_mount,
    token_volume,
};
use super::validate::job_defaults;
use super::view::{JobSetView, PodSpec, PodTemplate};
use super::{INJECTED_ANNOTATION, Violation};
use crate::protocol::JOBSET_NAME_LABEL;
use crate::wire::agent_env;

/// The value of the `jobset-inplace.dev/injected` annotation: the version that injected.
pub const INJECTED_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The largest JSON Patch the webhook answers with: base64 makes it 4/3 larger, and the whole
/// AdmissionReview response stays under 1 MiB (with [`super::validate::MAX_WARNINGS`] warnings).
pub const MAX_PATCH_BYTES: usize = 720 * 1024;
/// The largest JobSet, as written plus what the injection adds, the webhook lets through to be
/// stored: etcd's default request limit (`--max-request-bytes`, 1.5 MiB), less 64 KiB for what
/// the API server adds to a stored object (`managedFields`, `status`, the request framing).
pub const MAX_INJECTED_BYTES: usize = 1536 * 1024 - 64 * 1024;

#[cfg(any(test, feature = "test-api"))]
/// Computes the injection patch for a JobSet (CREATE). A JobSet whose injected form would be
/// too large (see [`MAX_PATCH_BYTES`], [`MAX_INJECTED_BYTES`]) gets no patch and `too_large`;
/// one with a pod template the agent cannot go into gets no patch and `violations`.
pub fn mutate(jobset: &Value, config: &InjectionConfig) -> Mutation {
    mutate_in(jobset, config, Scope::Create)
}

#[cfg(any(test, feature = "test-api"))]
/// The injection patch for an UPDATE of the stored JobSet `old` to `jobset`: into the
/// replicatedJobs whose pod template `old` shows injected (the `jobset-inplace.dev/injected`
/// annotation of an InPlaceRestart JobSet), what `old` carries of the injection, as stored
/// (`restore.rs`): whatever version injected it, a client that writes the JobSet without what
/// the webhook added (an apply or an update of the JobSet as the client built it) changes
/// nothing. Other replicatedJobs are left as they are: JobSet holds them immutable, and one
/// admitted uninjected (before the webhook was installed, or opted out) must stay editable.
pub fn mutate_update(jobset: &Value, old: &Value, config: &InjectionConfig) -> Mutation {
    let old_view = JobSetView::from_value(old);
    let new_jobs = super::validate::replicated_jobs(jobset);
    let old_jobs = super::validate::replicated_jobs(old);
    let jobs = |i: usize| Some((new_jobs.get(i)?.clone(), old_jobs.get(i)?.clone()));
    mutate_in(jobset, config, Scope::Update(&old_view, &jobs))
}

#[cfg(any(test, feature = "test-api"))]
fn mutate_in(jobset: &Value, config: &InjectionConfig, scope: Scope<'_, '_>) -> Mutation {
    let size = serde_json::to_vec(jobset).map_or(0, |v| v.len());
    match mutate_view(&JobSetView::from_value(jobset), config, size, scope) {
        Ok((ops, warnings)) => Mutation {
            patch: json_patch::Patch(ops.iter().map(Op::to_patch_operation).collect()),
            warnings,
            ..Mutation::default()
        },
        Err(Refusal::TooLarge(message)) => Mutation {
            too_large: Some(message),
            ..Mutation::default()
        },
        Err(Refusal::Invalid(violations, _, _)) => Mutation {
            violations,
            ..Mutation::default()
        },
    }
}

/// Which request the injection answers.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'v, 'a> {
    /// A CREATE: every replicatedJob.
    Create,
    /// An UPDATE from this stored JobSet: the replicatedJobs it shows injected (see
    /// [`mutate_update`]), with `spec.replicatedJobs[i]` of the object sent and of the stored one
    /// (read when one is injected).
    Update(&'v JobSetView<'a>, &'v JobPair<'v>),
}

/// `spec.replicatedJobs[i]` of the object of an UPDATE and of the stored object, as values.
pub(crate) type JobPair<'v> = dyn Fn(usize) -> Option<(Value, Value)> + 'v;

impl Scope<'_, '_> {
    /// `spec.replicatedJobs[i]` is injected.
    fn covers(&self, i: usize) -> bool {
        match self {
            Scope::Create => true,
            Scope::Update(old, _) => {
                old.in_place_restart()
                    && old
                        .replicated_jobs()
                        .get(i)
                        .and_then(|rj| rj.job_spec.as_ref()?.template.as_ref()?.metadata.as_ref())
                        .and_then(|m| m.annotations.as_ref()?.injected.as_ref())
                        .is_some()
            }
        }
    }
}

/// Why the webhook refuses to inject a JobSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The injected JobSet would be too large (the webhook answers 413): why.
    TooLarge(String),
    /// Pod templates that cannot take the agent as configured (422), with where and why: the
    /// first [`super::validate::MAX_VIOLATIONS`], how many more, and the rules all of them break.
    Invalid(Vec<Violation>, usize, Vec<Rule>),
}

/// Bytes an operation adds to the JSON Patch document (with its framing).
fn op_bytes(op: &Op) -> usize {
    op.path.len() + op.value.len() + 32
}

/// [`mutate`] over the view of a JobSet written in `size` bytes (an upper bound): the operations
/// and the warnings, or why the webhook refuses. Stops building operations as soon as the patch
/// passes a limit.
pub(crate) fn mutate_view(
    jobset: &JobSetView<'_>,
    config: &InjectionConfig,
    size: usize,
    scope: Scope<'_, '_>,
) -> Result<(Vec<Op>, Vec<String>), Refusal> {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    if !jobset.in_place_restart() || jobset.inject_annotation() == Some("false") {
        return Ok((out, warnings));
    }
    if let Scope::Update(old, _) = scope
        && !(0..old.replicated_jobs().len()).any(|i| scope.covers(i))
    {
        // Nothing was injected: nothing to put back.
        return Ok((out, warnings));
    }
    if jobset.truncated {
        return Err(Refusal::TooLarge(format!(
            "the JobSet has more than {} list elements in all: too large to be injected",
            super::lenient::MAX_LIST_ELEMENTS
        )));
    }
    let mut agents = AgentJson::new(config);
    let mut refused = Vec::new();
    let mut more_refused = 0;
    let mut refused_rules = Vec::new();
    let mut patch_bytes = 0;
    let mut counted = 0;
    for (i, rj) in jobset.replicated_jobs().iter().enumerate() {
        patch_bytes += out[counted..].iter().map(op_bytes).sum::<usize>();
        counted = out.len();
        if past_limits(size, patch_bytes) {
            return Err(Refusal::TooLarge(too_large(patch_bytes, i)));
        }
        let Some(job_spec) = &rj.job_spec else {
            continue;
        };
        if !scope.covers(i) {
            continue;
        }
        let job_ptr = ptr(&["spec", "replicatedJobs"])
            .idx(i)
            .keys(&["template", "spec"]);
        let unreadable = !rj.wrong.is_empty()
            || !job_spec.wrong.is_empty()
            || job_spec.template.as_ref().is_some_and(|t| {
                !t.wrong.is_empty()
                    || t.spec.as_ref().is_some_and(|p| !p.wrong.is_empty())
                    || t.metadata.as_ref().is_some_and(|m| !m.wrong.is_empty())
            });
        if unreadable {
            // Validation denies it, naming what it cannot read; nothing is added to it.
            continue;
        }
        if let Scope::Update(_, jobs) = scope {
            if let Some(template) = &job_spec.template
                && let Some(pod_spec) = &template.spec
            {
                rewrite_restart_pod(
                    &job_ptr.key("template").key("spec"),
                    pod_spec,
                    &mut out,
                    &mut warnings,
                    i,
                );
            }
            if let Some((new, old)) = jobs(i) {
                super::restore::restore(&job_ptr, &new, &old, &mut out);
            }
            continue;
        }
        let ops_before = out.len();
        if job_spec.backoff_limit.is_none() {
            out.push(add(
                job_ptr.key("backoffLimit"),
                Rule::BACKOFF_LIMIT.to_string(),
            ));
        }
        if job_spec.pod_replacement_policy.is_none() {
            out.push(add(
                job_ptr.key("podReplacementPolicy"),
                to_json(&Rule::POD_REPLACEMENT_POLICY),
            ));
        }
        // What Kubernetes' Job defaulting would make of them, where that meets the rule.
        for key in job_defaults(job_spec.completions, job_spec.parallelism) {
            out.push(add(job_ptr.key(key), "1".to_owned()));
        }
        if let Some(template) = &job_spec.template
            && let Some(pod_spec) = &template.spec
        {
            let template_ptr = job_ptr.key("template");
            let pod_ptr = template_ptr.key("spec");
            // The webhook chooses the service account: its token goes to the agent only.
            let chosen = account_chosen(pod_spec, config);
            let existing_agent = pod::agent(pod_spec);
            let pod_prefix = format!("spec.replicatedJobs[{i}].template.spec.template.spec");
            let account = super::account::Account {
                runs_as_agent: chosen,
                unset_is_fixed: true,
                name: &config.service_account,
                image: &config.image,
            };
            // A look-alike of the agent is refused here: it never gets the token.
            let mut token_refused =
                super::account::token_violations(&pod_prefix, pod_spec, account);
            token_refused.extend(super::account::name_violations(&pod_prefix, pod_spec));
            if !token_refused.is_empty() {
                for violation in token_refused {
                    rule::note(&mut refused_rules, violation.rule);
                    if refused.len() >= super::validate::MAX_VIOLATIONS {
                        more_refused += 1;
                    } else {
                        refused.push(violation);
                    }
                }
                continue;
            }
            rewrite_restart_pod(&pod_ptr, pod_spec, &mut out, &mut warnings, i);
            if jobset.worker_rules_annotation() != Some("false") {
                let main_agent = existing_agent
                    .as_ref()
                    .filter(|a| a.container.list == ContainerList::Regular)
                    .map(|a| a.container.index);
                super::worker::add_worker_rules(
                    super::worker::WorkerPod {
                        ptr: &pod_ptr,
                        spec: pod_spec,
                        policy: job_spec.pod_failure_policy.as_ref(),
                        agent: main_agent,
                        replicated_job: i,
                    },
                    MAX_PATCH_BYTES,
                    &mut out,
                    &mut warnings,
                );
            }
            let runs_ours = match existing_agent {
                None => {
                    let Some(port) = barrier_port(pod_spec, config) else {
                        rule::note(&mut refused_rules, Rule::BarrierPort);
                        if refused.len() >= super::validate::MAX_VIOLATIONS {
                            more_refused += 1;
                            continue;
                        }
                        refused.push(Violation {
                            rule: Rule::BarrierPort,
                            path: format!(
                                "spec.replicatedJobs[{i}].template.spec.template.spec.initContainers"
                            ),
                            message: format!(
                                "no port for the injected agent's barrier: the containers of \
                                 this pod template declare every port it may take ({}); free \
                                 one, configure other barrier ports (barrierPort, \
                                 barrierFallbackPorts) or bring your own agent",
                                config.barrier_ports_text()
                            ),
                        });
                        continue;
                    };
                    inject_agent(&pod_ptr, pod_spec, agents.get(port, chosen), &mut out);
                    true
                }
                Some(agent) => {
                    complete_agent(&pod_ptr, &agent, config, &mut out);
                    // The token only for an agent that runs the agent's image (a look-alike
                    // sidecar was refused above; a main-container agent runs the worker's).
                    if chosen
                        && !agent.container.mounts(TOKEN_VOLUME)
                        && pod::runs_image(&agent.container, &config.image)
                    {
                        let mounts = container_ptr(&pod_ptr, &agent.container).key("volumeMounts");
                        if agent.container.view.volume_mounts.is_some() {
                            out.push(add(mounts.key("-"), to_json(&token_mount())));
                        } else {
                            out.push(add(mounts, to_json(&[token_mount()])));
                        }
                    }
                    agent.container.list == ContainerList::Init
                        && agent.container.name() == agent_env::CONTAINER_NAME
                }
            };
            if chosen {
                if !pod_spec.names_service_account() {
                    out.push(add(
                        pod_ptr.key("serviceAccountName"),
                        to_json(&config.service_account),
                    ));
                }
                if pod_spec.automount_token.is_none() {
                    out.push(add(
                        pod_ptr.key("automountServiceAccountToken"),
                        "false".to_owned(),
                    ));
                }
                match &pod_spec.volumes {
                    Some(v) if v.has_token_volume() => {}
                    Some(_) => out.push(add(
                        pod_ptr.keys(&["volumes", "-"]),
                        to_json(&token_volume()),
                    )),
                    None => out.push(add(pod_ptr.key("volumes"), to_json(&[token_volume()]))),
                }
            }
            if runs_ours {
                add_pull_secrets(&pod_ptr, pod_spec, config, &mut out);
            }
            if out.len() > ops_before {
                annotate_injected(&template_ptr, template, &mut out);
            }
        }
    }
    patch_bytes += out[counted..].iter().map(op_bytes).sum::<usize>();
    if past_limits(size, patch_bytes) {
        return Err(Refusal::TooLarge(too_large(
            patch_bytes,
            jobset.replicated_jobs().len(),
        )));
    }
    if !refused.is_empty() {
        return Err(Refusal::Invalid(refused, more_refused, refused_rules));
    }
    if warnings.len() > super::validate::MAX_WARNINGS {
        let more = warnings.len() - super::validate::MAX_WARNINGS;
        warnings.truncate(super::validate::MAX_WARNINGS);
        warnings.push(format!("and {more} more warnings like these"));
    }
    Ok((out, warnings))
}

/// An injection of `patch_bytes` into a JobSet of `size` bytes passes a limit. Nothing to add
/// passes none: the JobSet is then as the client wrote it (an UPDATE of a large JobSet already
/// injected is not refused).
fn past_limits(size: usize, patch_bytes: usize) -> bool {
    patch_bytes > 0 && (patch_bytes > MAX_PATCH_BYTES || size + patch_bytes > MAX_INJECTED_BYTES)
}

/// The webhook chose (or chooses now) the pod template's service account, and with it keeps the
/// token from every container but the agent: the template names none, or names the configured
/// one (the injection then sets `automountServiceAccountToken: false` when unset, and mounts the
/// token into the agent only; any other value is refused). A template that names an account of
/// its own keeps its own behaviour.
fn account_chosen(pod_spec: &PodSpec<'_>, config: &InjectionConfig) -> bool {
    !pod_spec.names_service_account()
        || super::account::names_account(pod_spec, &config.service_account)
}

/// The port the injected agent's barrier takes in a pod template: the first of the configured
/// ones ([`InjectionConfig::barrier_ports`]) that no container of the template declares as a
/// `containerPort` (whatever its protocol: a number two containers of a pod share is a mistake
/// waiting to happen); `None` when they all are. Tries at most one port more than the template
/// declares.
fn barrier_port(pod_spec: &PodSpec<'_>, config: &InjectionConfig) -> Option<u16> {
    let mut declared: Vec<i64> = pod::all_containers(pod_spec)
        .flat_map(|c| c.declared_ports().map(|(_, port)| port))
        .collect();
    if declared.is_empty() {
        return Some(config.barrier_port);
    }
    declared.sort_unstable();
    declared.dedup();
    config
        .barrier_ports()
        .find(|p| declared.binary_search(&i64::from(*p)).is_err())
}

/// Adds the configured `imagePullSecrets` a pod template lacks (creating the list when it has
/// none; entries it has, whatever they hold, are left as they are and where they are).
fn add_pull_secrets(
    pod_ptr: &Ptr,
    pod_spec: &PodSpec<'_>,
    config: &InjectionConfig,
    ops: &mut Vec<Op>,
) {
    let existing = match &pod_spec.image_pull_secrets {
        // Not a list: nothing can be added to it without writing over it.
        Some(Present::Other) => return,
        Some(Present::Read(list)) => Some(list),
        None => None,
    };
    let mut missing: Vec<&str> = Vec::new();
    for name in &config.image_pull_secrets {
        if !missing.contains(&name.as_str()) && !existing.is_some_and(|l| l.has_name(name)) {
            missing.push(name);
        }
    }
    if missing.is_empty() {
        return;
    }
    let entry = |name: &str| to_json(&json!({"name": name}));
    if existing.is_some() {
        for name in missing {
            ops.push(add(pod_ptr.keys(&["imagePullSecrets", "-"]), entry(name)));
        }
    } else {
        let list: Vec<Value> = missing.iter().map(|n| json!({"name": n})).collect();
        ops.push(add(pod_ptr.key("imagePullSecrets"), to_json(&list)));
    }
}

/// The injected agent's JSON text for each barrier port and token choice met in one JobSet,
/// serialized once each (most JobSets need one).
struct AgentJson<'c> {
    config: &'c InjectionConfig,
    texts: BTreeMap<(u16, bool), String>,
}

impl<'c> AgentJson<'c> {
    fn new(config: &'c InjectionConfig) -> Self {
        AgentJson {
            config,
            texts: BTreeMap::new(),
        }
    }

    fn get(&mut self, port: u16, token: bool) -> &str {
        let config = self.config;
        self.texts
            .entry((port, token))
            .or_insert_with(|| to_json(&agent_container(config, port, token)))
    }
}

/// Why an injection is refused: the limits, and how far it got. (The JobSet's own size is not
/// quoted: the webhook knows it only as an upper bound, the request's size.)
fn too_large(patch_bytes: usize, jobs: usize) -> String {
    let which = if patch_bytes > MAX_PATCH_BYTES {
        "the patch limit"
    } else {
        "the injected JobSet's limit"
    };
    format!(
        "the injected JobSet would be too large to answer or store: the injection into its \
         first {jobs} replicatedJobs already adds {patch_bytes} bytes, past {which} (a patch of \
         at most {MAX_PATCH_BYTES} bytes, so that the answer stays under 1 MiB; an injected \
         JobSet of at most {MAX_INJECTED_BYTES} bytes, under etcd's default 1.5 MiB request \
         limit); use fewer replicatedJobs (each gets its own agent container) or inject the \
         agent yourself"
    )
}

/// Rewrites KEP-467's `RestartPod` to Kubernetes 1.35's `RestartAllContainers`.
fn rewrite_restart_pod(
    pod_ptr: &Ptr,
    pod_spec: &PodSpec<'_>,
    ops: &mut Vec<Op>,
    warnings: &mut Vec<String>,
    replicated_job: usize,
) {
    for c in pod::all_containers(pod_spec) {
        for (index, rule) in c.restart_rules().iter().enumerate() {
            if rule.action() == pod::RESTART_POD {
                ops.push(Op {
                    replace: true,
                    path: container_ptr(pod_ptr, &c)
                        .key("restartPolicyRules")
                        .idx(index)
                        .key("action")
                        .0,
                    value: to_json(&pod::RESTART_ALL_CONTAINERS),
                });
                if warnings.len() > super::validate::MAX_WARNINGS {
                    warnings.push(String::new());
                    continue;
                }
                warnings.push(format!(
                    "spec.replicatedJobs[{replicated_job}]: container {} restart rule {}: {} \
                     rewritten to {}, its name since Kubernetes 1.35",
                    super::validate::clip(c.name().to_owned()),
                    index,
                    pod::RESTART_POD,
                    pod::RESTART_ALL_CONTAINERS
                ));
            }
        }
    }
}

/// Appends the agent sidecar (`agent`: its JSON) to `initContainers`.
fn inject_agent(pod_ptr: &Ptr, pod_spec: &PodSpec<'_>, agent: &str, ops: &mut Vec<Op>) {
    match pod_spec.init_containers {
        Some(_) => ops.push(add(
            pod_ptr.key("initContainers").key("-"),
            agent.to_owned(),
        )),
        None => ops.push(add(pod_ptr.key("initContainers"), format!("[{agent}]"))),
    }
}

/// Adds the env an existing agent lacks, deriving values from what the agent declares (its
/// restart rule, its startup probe) so that nothing added contradicts it.
fn complete_agent(pod_ptr: &Ptr, agent: &Agent<'_>, config: &InjectionConfig, ops: &mut Vec<Op>) {
    let c = &agent.container;
    let mut missing = Vec::new();
    for (name, field) in [
        (agent_env::NAMESPACE, Cow::Borrowed("metadata.namespace")),
        (agent_env::POD_NAME, Cow::Borrowed("metadata.name")),
        (
            agent_env::JOBSET_NAME,
            Cow::Owned(format!("metadata.annotations['{JOBSET_NAME_LABEL}']")),
        ),
    ] {
        if c.env(name).is_none() {
            missing.push(field_env(name, field));
        }
    }
    if c.env_any(&[
        agent_env::RESTART_EXIT_CODE,
        agent_env::RESTART_EXIT_CODE_ALIAS,
    ])
    .is_none()
    {
        let code = agent
            .mode
            .restart_code(c.restart_rules(), config.restart_exit_code)
            .unwrap_or(config.restart_exit_code);
        missing.push(literal_env(agent_env::RESTART_EXIT_CODE, code.to_string()));
    }
    if c.env(agent_env::PROTOCOL).is_none() {
        missing.push(literal_env(agent_env::PROTOCOL, config.protocol.as_str()));
    }
    if agent.mode == AgentMode::Sidecar {
        let probe = c.startup_http_get();
        if c.env_any(&[agent_env::BARRIER_PORT, agent_env::BARRIER_PORT_ALIAS])
            .is_none()
        {
            let port = match probe.and_then(|g| g.port.as_ref()) {
                Some(p) => c.resolve_port(p),
                None => Some(i64::from(config.barrier_port)),
            };
            if let Some(port) = port
                && port != i64::from(agent_env::DEFAULT_BARRIER_PORT)
            {
                missing.push(literal_env(agent_env::BARRIER_PORT, port.to_string()));
            }
        }
        if c.env_any(&[agent_env::BARRIER_PATH, agent_env::BARRIER_PATH_ALIAS])
            .is_none()
        {
            let path = match probe {
                Some(g) => g.path.as_deref().unwrap_or("/"),
                None => config.barrier_path.as_str(),
            };
            if path != agent_env::DEFAULT_BARRIER_PATH {
                missing.push(literal_env(agent_env::BARRIER_PATH, path));
            }
        }
        // A hold that fits the agent's own probe: none for the API's default timeout of 1 s.
        if c.env(agent_env::BARRIER_HOLD).is_none()
            && let Some(hold) = c.startup_timeout_seconds().and_then(barrier_hold_env)
        {
            missing.push(hold);
        }
    }
    if missing.is_empty() {
        return;
    }
    let env_ptr = container_ptr(pod_ptr, c).key("env");
    if c.has_env_list() {
        for entry in missing {
            ops.push(add(env_ptr.key("-"), to_json(&entry)));
        }
    } else {
        ops.push(add(env_ptr, to_json(&missing)));
    }
}

/// Marks the pod template as injected (creating `metadata` and `annotations` as needed).
fn annotate_injected(template_ptr: &Ptr, template: &PodTemplate<'_>, ops: &mut Vec<Op>) {
    let metadata = template.metadata.as_ref();
    let annotations = metadata.and_then(|m| m.annotations.as_ref());
    let op = match (metadata, annotations) {
        (None, _) => add(
            template_ptr.key("metadata"),
            to_json(&json!({"annotations": {INJECTED_ANNOTATION: INJECTED_VERSION}})),
        ),
        (Some(_), None) => add(
            template_ptr.keys(&["metadata", "annotations"]),
            to_json(&json!({INJECTED_ANNOTATION: INJECTED_VERSION})),
        ),
        (Some(_), Some(a)) if a.injected.as_deref() == Some(INJECTED_VERSION) => {
            return;
        }
        (Some(_), Some(_)) => add(
            template_ptr.keys(&["metadata", "annotations", INJECTED_ANNOTATION]),
            to_json(&INJECTED_VERSION),
        ),
    };
    ops.push(op);
}

fn container_ptr(pod_ptr: &Ptr, c: &Container<'_>) -> Ptr {
    pod_ptr.key(c.list.key()).idx(c.index)
}

#[cfg(test)]
mod tests;
