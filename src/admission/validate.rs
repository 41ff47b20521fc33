//! Validation of InPlaceRestart JobSets (docs/architecture.md, "Admission"): every rule, every violation with its
//! field path, all at once; warnings for what will work, but badly.
//!
//! The rules, per `spec.replicatedJobs[i]`:
//! - `template.spec.backoffLimit` is 2147483647 ([`check_backoff_limit`]);
//! - `template.spec.podReplacementPolicy` is `Failed` ([`check_pod_replacement_policy`]);
//! - `template.spec.completions` and `parallelism` are set and equal ([`check_completions`]);
//! - the pod template runs exactly one agent, a sidecar (a main-container agent, `WORKER_COMMAND`,
//!   is denied: not offered), whose restart rule covers its restart exit code, with the env it
//!   needs and a startup probe on its barrier, whose port no other container of the pod declares
//!   ([`check_agent`]); in a pod that runs as the agent's account, it runs the configured agent
//!   image (any tag or digest): a container of the agent's shape that runs another image there
//!   is a look-alike, denied;
//! - who may hold the agent's token and carry its name, and no shared process namespace in a
//!   pod that runs as the agent's account (`account.rs`, [`check_service_account`]);
//! - no restart rule uses KEP-467's `RestartPod` spelling, and every container with restart
//!   rules sets `restartPolicy` ([`check_restart_rules`]).

use serde_json::Value;

use super::config::InjectionConfig;
use super::lenient::{BadElements, WrongType};
use super::pod::{self, Agent, AgentMode, Container, ExitCodeSetting};
use super::rule::Rule;
use super::view::{JobSetView, JobSpec, PodSpec};
pub(crate) use super::warnings::clip;
pub use super::warnings::{MAX_MESSAGE_BYTES, MAX_WARNINGS};
use super::warnings::{finish_groups, ungrouped_warning, warning};
use super::{Validation, Violation};
use crate::protocol::Dialect;
use crate::wire::agent_env;

/// Below this many seconds of startup probing, a pod may be killed while waiting at the barrier.
const SHORT_BARRIER_SECONDS: i64 = 600;

/// At most this many violations are reported (the first ones, in the order of the rules); the
/// rest are counted. Bounds the answer to any request (docs/security.md).
pub const MAX_VIOLATIONS: usize = 20;

#[cfg(any(test, feature = "test-api"))]
/// Validates a JobSet (CREATE, or UPDATE without the old object).
pub fn validate(jobset: &Value, config: &InjectionConfig) -> Validation {
    validate_view(&JobSetView::from_value(jobset), config)
}

/// [`validate`] over the view of a JobSet.
pub(crate) fn validate_view(jobset: &JobSetView<'_>, config: &InjectionConfig) -> Validation {
    validate_ratcheted(jobset, config, |_| false)
}

/// Validates, reporting the violations of a replicatedJob for which `ratchet(i)` holds as
/// warnings (asked only about replicatedJobs with violations).
fn validate_ratcheted(
    jobset: &JobSetView<'_>,
    config: &InjectionConfig,
    mut ratchet: impl FnMut(usize) -> bool,
) -> Validation {
    let mut out = Validation::default();
    if !jobset.in_place_restart() {
        return out;
    }
    if jobset.truncated {
        violation(
            &mut out,
            Rule::TooLarge,
            "spec".to_owned(),
            format!(
                "has more than {} list elements (replicatedJobs, containers, rules, ports, env \
                 entries the agent reads, exit codes) in all: too large to be judged",
                super::lenient::MAX_LIST_ELEMENTS
            ),
        );
        return out;
    }
    if jobset.max_restarts().unwrap_or(0) == 0 {
        warning(
            &mut out,
            "spec.failurePolicy.maxRestarts is 0: the first failure fails the JobSet and no pod \
             is ever restarted in place"
                .to_owned(),
        );
    }
    // Only `inject: "false"` stops the injection: what the agent-missing hint names.
    let opted_out = jobset.inject_annotation() == Some("false");
    let spec = jobset.spec.as_ref();
    if let Some(spec) = spec {
        unreadable_fields("spec", &spec.wrong, &mut out);
    }
    if let Some(list) = spec.and_then(|s| s.replicated_jobs.as_ref()) {
        unreadable_elements("spec.replicatedJobs", &list.1, &mut out);
    }
    let mut ratcheted = Validation::default();
    let no_job_spec = JobSpec::default();
    let no_pod_spec = PodSpec::default();
    let bad_jobs = spec.and_then(|s| s.replicated_jobs.as_ref()).map(|l| &l.1);
    for (i, rj) in jobset.replicated_jobs().iter().enumerate() {
        if bad_jobs.is_some_and(|b| b.contains(i)) {
            // Reported above: nothing of it can be read.
            continue;
        }
        let before = (out.violations.len(), out.more_violations);
        let job_prefix = format!("spec.replicatedJobs[{i}]");
        unreadable_fields(&job_prefix, &rj.wrong, &mut out);
        let prefix = format!("{job_prefix}.template.spec");
        let job_spec = rj.job_spec.as_ref().unwrap_or(&no_job_spec);
        unreadable_fields(&prefix, &job_spec.wrong, &mut out);
        check_backoff_limit(&prefix, job_spec, &mut out);
        check_pod_replacement_policy(&prefix, job_spec, &mut out);
        check_completions(&prefix, job_spec, &mut out);
        let pod_prefix = format!("{prefix}.template.spec");
        if let Some(t) = &job_spec.template {
            unreadable_fields(&format!("{prefix}.template"), &t.wrong, &mut out);
            if let Some(m) = &t.metadata {
                unreadable_fields(&format!("{prefix}.template.metadata"), &m.wrong, &mut out);
            }
        }
        let pod_spec = job_spec
            .template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .unwrap_or(&no_pod_spec);
        check_readable_pod(&pod_prefix, pod_spec, &mut out);
        check_restart_rules(&pod_prefix, pod_spec, &mut out);
        check_agent(&pod_prefix, pod_spec, config, opted_out, &mut out);
        for w in super::account::foreign_agent_warnings(&pod_prefix, pod_spec, config.protocol) {
            warning(&mut out, w);
        }
        check_service_account(&pod_prefix, pod_spec, config, &mut out);
        let found = (out.violations.len(), out.more_violations) != before;
        if found && ratchet(i) {
            for v in out.violations.drain(before.0..) {
                ungrouped_warning(
                    &mut ratcheted,
                    // The ratchet's note first: a long message is clipped at its end.
                    format!(
                        "{}: left as it was (this part of the JobSet is unchanged by the \
                         update): {}",
                        v.path, v.message
                    ),
                );
            }
            ratcheted.more_warnings += out.more_violations - before.1;
            out.more_violations = before.1;
        }
    }
    finish_groups(&mut out);
    for w in ratcheted.warnings {
        ungrouped_warning(&mut out, w);
    }
    out.more_warnings += ratcheted.more_warnings;
    out
}

#[cfg(any(test, feature = "test-api"))]
/// Validates an UPDATE. A replicatedJob that is unchanged from the old object and was already
/// InPlaceRestart has its violations reported as warnings: a JobSet admitted before the webhook
/// was installed must stay editable (to suspend or relabel it), and nothing got worse.
pub fn validate_update(jobset: &Value, old: &Value, config: &InjectionConfig) -> Validation {
    let (new_jobs, old_jobs) = (replicated_jobs(jobset), replicated_jobs(old));
    validate_update_view(
        &JobSetView::from_value(jobset),
        &JobSetView::from_value(old),
        config,
        |i| new_jobs.get(i).is_some() && new_jobs.get(i) == old_jobs.get(i),
    )
}

/// `spec.replicatedJobs` of a JobSet as written (empty when it is not an array).
pub(crate) fn replicated_jobs(jobset: &Value) -> &[Value] {
    jobset
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// [`validate_update`] over the views; `unchanged(i)`: `spec.replicatedJobs[i]` exists and is
/// equal (as JSON values) in the new and the old object. Only asked about replicatedJobs with
/// violations.
pub(crate) fn validate_update_view(
    jobset: &JobSetView<'_>,
    old: &JobSetView<'_>,
    config: &InjectionConfig,
    unchanged: impl FnMut(usize) -> bool,
) -> Validation {
    if !old.in_place_restart() {
        return validate_view(jobset, config);
    }
    validate_ratcheted(jobset, config, unchanged)
}

fn violation(out: &mut Validation, rule: Rule, path: String, message: impl Into<String>) {
    super::rule::note(&mut out.rules, rule);
    if out.violations.len() >= MAX_VIOLATIONS {
        out.more_violations += 1;
        return;
    }
    out.violations.push(Violation {
        rule,
        path: clip(path),
        message: clip(message.into()),
    });
}

/// A field the rules need that is present with another JSON type: the webhook cannot read it,
/// so it cannot say the JobSet is safe.
fn unreadable_fields(prefix: &str, wrong: &[WrongType], out: &mut Validation) {
    for w in wrong {
        violation(
            out,
            Rule::Unreadable,
            format!("{prefix}.{}", w.key),
            format!(
                "must be {}, is {}: the webhook cannot read it, so it cannot judge the JobSet",
                w.expected,
                w.found.as_str()
            ),
        );
    }
}

/// Elements of a list the rules need that are not of the list's type.
fn unreadable_elements(path: &str, bad: &BadElements, out: &mut Validation) {
    for (index, kind) in &bad.first {
        violation(
            out,
            Rule::Unreadable,
            format!("{path}[{index}]"),
            format!(
                "must be an object, is {}: the webhook cannot read it, so it cannot judge the \
                 JobSet",
                kind.as_str()
            ),
        );
    }
    // Counted, not described: the elements past the first few.
    out.more_violations += bad.count - bad.first.len();
}

/// Every part of a pod spec the rules read, readable.
fn check_readable_pod(pod_prefix: &str, pod_spec: &PodSpec<'_>, out: &mut Validation) {
    unreadable_fields(pod_prefix, &pod_spec.wrong, out);
    for (key, list) in [
        ("initContainers", &pod_spec.init_containers),
        ("containers", &pod_spec.containers),
    ] {
        if let Some(list) = list {
            unreadable_elements(&format!("{pod_prefix}.{key}"), &list.1, out);
        }
    }
    for c in pod::all_containers(pod_spec) {
        let path = container_path(pod_prefix, &c);
        let v = c.view;
        unreadable_fields(&path, &v.wrong, out);
        if let Some(rules) = &v.restart_policy_rules {
            unreadable_elements(&format!("{path}.restartPolicyRules"), &rules.1, out);
            for (i, rule) in rules.0.iter().enumerate() {
                let rule_path = format!("{path}.restartPolicyRules[{i}]");
                unreadable_fields(&rule_path, &rule.wrong, out);
                if let Some(codes) = &rule.exit_codes {
                    unreadable_fields(&format!("{rule_path}.exitCodes"), &codes.wrong, out);
                    if let Some(values) = &codes.values {
                        for (index, kind) in &values.1.first {
                            violation(
                                out,
                                Rule::Unreadable,
                                format!("{rule_path}.exitCodes.values[{index}]"),
                                format!("must be an integer, is {}", kind.as_str()),
                            );
                        }
                    }
                }
            }
        }
        if let Some(env) = &v.env {
            for (index, kind) in &env.bad.first {
                violation(
                    out,
                    Rule::Unreadable,
                    format!("{path}.env[{index}]"),
                    format!(
                        "must be an object with a string name and value, has {}: the webhook \
                         cannot read it",
                        kind.as_str()
                    ),
                );
            }
        }
        if let Some(probe) = &v.startup_probe {
            unreadable_fields(&format!("{path}.startupProbe"), &probe.wrong, out);
            if let Some(get) = &probe.http_get {
                unreadable_fields(&format!("{path}.startupProbe.httpGet"), &get.wrong, out);
            }
        }
        if let Some(ports) = &v.ports {
            unreadable_elements(&format!("{path}.ports"), &ports.1, out);
            for (i, port) in ports.0.iter().enumerate() {
                unreadable_fields(&format!("{path}.ports[{i}]"), &port.wrong, out);
            }
        }
    }
}

fn check_backoff_limit(prefix: &str, job_spec: &JobSpec<'_>, out: &mut Validation) {
    let value = job_spec.backoff_limit.as_ref();
    if value.and_then(Value::as_i64) != Some(Rule::BACKOFF_LIMIT) {
        violation(
            out,
            Rule::BackoffLimit,
            format!("{prefix}.backoffLimit"),
            format!(
                "must be {} (is {}): with InPlaceRestart the JobSet's maxRestarts \
                 bounds restarts, and a Job that fails on its own recreates every pod",
                Rule::BACKOFF_LIMIT,
                shown(value)
            ),
        );
    }
}

fn check_pod_replacement_policy(prefix: &str, job_spec: &JobSpec<'_>, out: &mut Validation) {
    let value = job_spec.pod_replacement_policy.as_ref();
    if value.and_then(Value::as_str) != Some(Rule::POD_REPLACEMENT_POLICY) {
        violation(
            out,
            Rule::PodReplacementPolicy,
            format!("{prefix}.podReplacementPolicy"),
            format!(
                "must be {} (is {}): a replacement pod must not start \
                 beside a terminating one, or two pods hold one worker's place in the group",
                Rule::POD_REPLACEMENT_POLICY,
                shown(value)
            ),
        );
    }
}

/// The Job-spec fields the injection sets to 1 where a replicatedJob's template leaves them unset,
/// as Kubernetes' Job defaulting would (`SetDefaults_Job` in `pkg/apis/batch/v1/defaults.go`):
/// both unset become 1 and 1; an unset `parallelism` becomes 1, which meets the rule only beside
/// `completions: 1`. Kubernetes never defaults `completions` when `parallelism` is set (a
/// work-queue Job), nor would its `parallelism: 1` equal another `completions`: those stay
/// unset and [`check_completions`] denies them, saying what Kubernetes would make of them.
pub(crate) fn job_defaults(
    completions: Option<i64>,
    parallelism: Option<i64>,
) -> &'static [&'static str] {
    match (completions, parallelism) {
        (None, None) => &["completions", "parallelism"],
        (Some(1), None) => &["parallelism"],
        _ => &[],
    }
}

fn check_completions(prefix: &str, job_spec: &JobSpec<'_>, out: &mut Validation) {
    let completions = job_spec.completions;
    let parallelism = job_spec.parallelism;
    match (completions, parallelism) {
        (Some(c), Some(p)) if c == p => {}
        (Some(c), Some(p)) => violation(
            out,
            Rule::Completions,
            format!("{prefix}.completions"),
            format!(
                "must equal parallelism ({p}), is {c}: every pod of the Job runs at once and \
                 restarts as one group"
            ),
        ),
        (Some(c), None) if c != 1 => violation(
            out,
            Rule::Completions,
            format!("{prefix}.parallelism"),
            format!(
                "must be set, to completions ({c}): unset, Kubernetes defaults it to 1 and the \
                 Job's pods would run one at a time, not as one group"
            ),
        ),
        (None, Some(p)) => violation(
            out,
            Rule::Completions,
            format!("{prefix}.completions"),
            format!(
                "must be set, to parallelism ({p}): Kubernetes does not default it beside \
                 parallelism (a work-queue Job), so the reconciler would not know how many pods \
                 to wait for"
            ),
        ),
        _ => {
            for (name, value) in [("completions", completions), ("parallelism", parallelism)] {
                if value.is_none() {
                    violation(
                        out,
                        Rule::Completions,
                        format!("{prefix}.{name}"),
                        "must be set, to the number of pods of each Job (completions and \
                         parallelism equal), so the reconciler knows how many pods to wait for \
                         (the injection sets it to 1 where Kubernetes would default it to 1)",
                    );
                }
            }
        }
    }
}

/// Restart rules the API server would reject when it creates the pods, long after admission:
/// KEP-467's `RestartPod` spelling, and rules on a container without an explicit
/// `restartPolicy`.
fn check_restart_rules(pod_prefix: &str, pod_spec: &PodSpec<'_>, out: &mut Validation) {
    for c in pod::all_containers(pod_spec) {
        let rules = c.restart_rules();
        if !rules.is_empty() && c.restart_policy().is_none() {
            violation(
                out,
                Rule::RestartPolicy,
                format!("{}.restartPolicy", container_path(pod_prefix, &c)),
                "must be set when the container has restartPolicyRules (Kubernetes requires it)",
            );
        }
        for (index, rule) in rules.iter().enumerate() {
            if rule.action() == pod::RESTART_POD {
                violation(
                    out,
                    Rule::RestartRules,
                    format!(
                        "{}.restartPolicyRules[{index}].action",
                        container_path(pod_prefix, &c),
                    ),
                    format!(
                        "{} is KEP-467's name for this action; Kubernetes 1.35 calls it {}",
                        pod::RESTART_POD,
                        pod::RESTART_ALL_CONTAINERS
                    ),
                );
            }
        }
    }
}

/// The pod's service account, and who holds its token and the agent's name
/// ([`super::account`]): the same rules the injection refuses a template by.
fn check_service_account(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    config: &InjectionConfig,
    out: &mut Validation,
) {
    let account = agent_account(pod_spec, config);
    for v in super::account::token_violations(pod_prefix, pod_spec, account)
        .into_iter()
        .chain(super::account::name_violations(pod_prefix, pod_spec))
    {
        violation(out, v.rule, v.path, v.message);
    }
    if !pod_spec.names_service_account() {
        warning(
            out,
            format!(
                "{pod_prefix}.serviceAccountName is not set: the agent runs as the namespace's \
             default service account, which needs get/list/watch on jobsets and patch on pods"
            ),
        );
    }
}

/// How validation sees the pod's account: it runs as the agent's when it names it (the
/// injection named it, or the template did).
fn agent_account<'a>(
    pod_spec: &PodSpec<'_>,
    config: &'a InjectionConfig,
) -> super::account::Account<'a> {
    super::account::Account {
        runs_as_agent: super::account::names_account(pod_spec, &config.service_account),
        unset_is_fixed: false,
        name: &config.service_account,
        image: &config.image,
    }
}

/// `spec...template.spec.initContainers[1]`
pub(super) fn container_path(pod_prefix: &str, c: &Container<'_>) -> String {
    format!("{pod_prefix}.{}[{}]", c.list.key(), c.index)
}

/// How to get the agent a pod lacks: the JobSet's opt-out annotation when it has one (issue 47:
/// named only then), else the mutating webhook, which injects every other InPlaceRestart JobSet.
pub(crate) fn agent_missing_hint(opted_out: bool) -> String {
    if opted_out {
        format!(
            "remove the {}: \"false\" annotation to have it injected",
            super::INJECT_ANNOTATION
        )
    } else {
        "the mutating webhook injects it: check that the MutatingWebhookConfiguration \
         jobset-inplace is installed, selects this JobSet's namespace and reaches the webhook \
         (jobset-inplace doctor)"
            .to_owned()
    }
}

fn check_agent(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    config: &InjectionConfig,
    opted_out: bool,
    out: &mut Validation,
) {
    let dialect = config.protocol;
    let mut agents = pod::agents(pod_spec);
    let Some(agent) = agents.next() else {
        violation(
            out,
            Rule::AgentMissing,
            format!("{pod_prefix}.initContainers"),
            format!(
                "no jobset-inplace agent: the pod needs the agent sidecar (an init container \
                 with restartPolicy: Always, a {} restart rule for its exit code, {} and {} env \
                 and a startup probe on its barrier); {}",
                pod::RESTART_ALL_CONTAINERS,
                agent_env::POD_NAME,
                agent_env::JOBSET_NAME,
                agent_missing_hint(opted_out),
            ),
        );
        return;
    };
    for extra in agents {
        violation(
            out,
            Rule::AgentDuplicate,
            container_path(pod_prefix, &extra.container),
            format!(
                "a second agent (besides {}): a pod runs exactly one jobset-inplace agent",
                container_path(pod_prefix, &agent.container)
            ),
        );
    }
    let path = container_path(pod_prefix, &agent.container);
    if agent.mode == AgentMode::MainContainer {
        // Denied whole: what else it lacks does not matter, the mode is not offered.
        let at = agent.container.env(agent_env::WORKER_COMMAND).map_or_else(
            || format!("{path}.env"),
            |e| format!("{path}.env[{}]", e.index),
        );
        violation(out, Rule::MainContainerAgent, at, main_container_message());
        return;
    }
    if super::account::is_look_alike(pod_spec, &agent.container, agent_account(pod_spec, config)) {
        // A look-alike in a pod that runs as the agent's account (`check_service_account`
        // denies it, naming its image): it is not the agent, so what an agent lacks does not
        // apply to it.
        check_worker_rules(pod_prefix, pod_spec, out);
        return;
    }
    let exit_code = match agent
        .container
        .agent_exit_code(agent_env::DEFAULT_RESTART_EXIT_CODE)
    {
        Ok(setting) => Some(setting),
        Err(reason) => {
            violation(out, Rule::AgentEnv, format!("{path}.env"), reason);
            None
        }
    };
    check_agent_env(&path, &agent, dialect, out);
    if agent.container.restart_policy() != Some("Always") {
        violation(
            out,
            Rule::RestartPolicy,
            format!("{path}.restartPolicy"),
            "must be Always: the agent runs as a native sidecar beside the workers",
        );
    }
    check_agent_rule(&path, &agent, exit_code, out);
    check_barrier_probe(pod_prefix, pod_spec, &agent.container, out);
    check_worker_rules(pod_prefix, pod_spec, out);
}

fn check_agent_env(path: &str, agent: &Agent<'_>, dialect: Dialect, out: &mut Validation) {
    let c = &agent.container;
    for (name, source) in [
        (agent_env::POD_NAME, "fieldRef metadata.name"),
        (
            agent_env::JOBSET_NAME,
            "fieldRef metadata.annotations['jobset.sigs.k8s.io/jobset-name']",
        ),
    ] {
        if c.env(name).is_none() {
            violation(
                out,
                Rule::AgentEnv,
                format!("{path}.env"),
                format!("the agent needs {name}: set it from the downward API ({source})"),
            );
        }
    }
    if let Some(entry) = c.env(agent_env::PROTOCOL)
        && let Some(value) = entry.value
    {
        match value.parse::<Dialect>() {
            Ok(d) if d == dialect => {}
            Ok(d) => violation(
                out,
                Rule::AgentEnv,
                format!("{path}.env[{}].value", entry.index),
                format!(
                    "{}={d} but this cluster runs the {dialect} protocol: the agent would \
                     never see its epoch synced",
                    agent_env::PROTOCOL
                ),
            ),
            Err(e) => violation(
                out,
                Rule::AgentEnv,
                format!("{path}.env[{}].value", entry.index),
                e.to_string(),
            ),
        }
    }
}

/// The agent's exit must restart what it guards (see [`AgentMode::rule_fits`]).
fn check_agent_rule(
    path: &str,
    agent: &Agent<'_>,
    exit_code: Option<ExitCodeSetting>,
    out: &mut Validation,
) {
    let rules = agent.container.restart_rules();
    let wanted = agent.mode.wanted_action();
    let code = exit_code.and_then(ExitCodeSetting::code);
    if !rules.iter().any(|r| agent.mode.rule_fits(r)) {
        violation(
            out,
            Rule::RestartRules,
            format!("{path}.restartPolicyRules"),
            format!(
                "the agent needs a restart rule {{action: {wanted}, exitCodes: {{operator: In, \
                 values: [{}]}}}} so that its exit restarts the pod in place",
                code.unwrap_or(agent_env::DEFAULT_RESTART_EXIT_CODE),
            ),
        );
    } else if let Some(code) = code
        && !agent.mode.code_restarts(rules, code)
    {
        let source = match exit_code {
            Some(ExitCodeSetting::Env(name, _)) => format!("set by {name}"),
            _ => "the agent's default".to_owned(),
        };
        violation(
            out,
            Rule::RestartRules,
            format!("{path}.restartPolicyRules"),
            format!(
                "the first rule matching the agent's restart exit code {code} ({source}) must \
                 be {wanted}: otherwise the pod does not restart when its epoch is deprecated"
            ),
        );
    }
}

/// The startup probe of a sidecar agent is its barrier: it must ask the agent's barrier endpoint,
/// which no other container of the pod may declare as its port.
fn check_barrier_probe(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    c: &Container<'_>,
    out: &mut Validation,
) {
    let path = &container_path(pod_prefix, c);
    let (port_source, port) =
        match c.env_read_by_agent(&[agent_env::BARRIER_PORT, agent_env::BARRIER_PORT_ALIAS]) {
            None => (
                "the agent's default".to_owned(),
                Some(i64::from(agent_env::DEFAULT_BARRIER_PORT)),
            ),
            Some((name, entry)) => match entry.value {
                None => (format!("{name} (valueFrom)"), None),
                Some(v) => match v.trim().parse::<u16>() {
                    Ok(p) if p > 0 => (name.to_owned(), Some(i64::from(p))),
                    _ => {
                        violation(
                            out,
                            Rule::AgentEnv,
                            format!("{path}.env[{}].value", entry.index),
                            format!("{name}={v:?} is not a port in 1-65535"),
                        );
                        return;
                    }
                },
            },
        };
    let (path_source, barrier_path) =
        match c.env_read_by_agent(&[agent_env::BARRIER_PATH, agent_env::BARRIER_PATH_ALIAS]) {
            None => (
                "the agent's default".to_owned(),
                Some(agent_env::DEFAULT_BARRIER_PATH),
            ),
            Some((name, entry)) => match entry.value.map(str::trim) {
                None => (format!("{name} (valueFrom)"), None),
                // As the agent reads it (agent::config): trimmed, a path from the root.
                Some(v) if !v.starts_with('/') || v.contains(char::is_whitespace) => {
                    violation(
                        out,
                        Rule::AgentEnv,
                        format!("{path}.env[{}].value", entry.index),
                        format!(
                            "{name}={v:?} is not a URL path starting with /: the agent would \
                             not start"
                        ),
                    );
                    return;
                }
                Some(v) => (name.to_owned(), Some(v)),
            },
        };
    if let Some(port) = port {
        check_barrier_port_free(pod_prefix, pod_spec, c, port, &port_source, out);
    }
    let Some(http_get) = c.startup_http_get() else {
        violation(
            out,
            Rule::BarrierProbe,
            format!("{path}.startupProbe"),
            format!(
                "the agent needs a startup probe httpGet on its barrier (port {}, path {}): it \
                 holds the workers until every pod of the JobSet is at the same epoch",
                port.map_or("?".to_owned(), |p| p.to_string()),
                barrier_path.unwrap_or("?")
            ),
        );
        return;
    };
    let probe_port = http_get.port.as_ref();
    let resolved = probe_port.and_then(|p| c.resolve_port(p));
    if let Some(port) = port
        && resolved != Some(port)
    {
        violation(
            out,
            Rule::BarrierProbe,
            format!("{path}.startupProbe.httpGet.port"),
            format!(
                "probes port {} but the agent serves its barrier on {port} ({port_source})",
                shown(probe_port)
            ),
        );
    }
    let probe_path = http_get.path.as_deref().unwrap_or("/");
    if let Some(barrier_path) = barrier_path
        && probe_path != barrier_path
    {
        violation(
            out,
            Rule::BarrierProbe,
            format!("{path}.startupProbe.httpGet.path"),
            format!(
                "probes {probe_path} but the agent serves its barrier at {barrier_path} \
                 ({path_source})"
            ),
        );
    }
    let probe = c.view.startup_probe.as_ref();
    let period = probe.and_then(|p| p.period_seconds).unwrap_or(10);
    let threshold = probe.and_then(|p| p.failure_threshold).unwrap_or(3);
    let seconds = period.saturating_mul(threshold);
    if seconds < SHORT_BARRIER_SECONDS {
        warning(
            out,
            format!(
                "{path}.startupProbe: the kubelet gives up on the barrier after {seconds} s and \
             restarts the pod; a group restart that waits for a rescheduled pod takes longer"
            ),
        );
    }
}

/// Containers of the pod share its network: one that declares the agent's barrier port as its
/// `containerPort` (whatever the protocol) means the agent or it cannot bind it, and the kubelet's
/// startup probe may ask the wrong one.
fn check_barrier_port_free(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    agent: &Container<'_>,
    port: i64,
    port_source: &str,
    out: &mut Validation,
) {
    for other in pod::all_containers(pod_spec) {
        if other.list == agent.list && other.index == agent.index {
            continue;
        }
        for (k, declared) in other.declared_ports() {
            if declared == port {
                violation(
                    out,
                    Rule::BarrierPort,
                    format!(
                        "{}.ports[{k}].containerPort",
                        container_path(pod_prefix, &other)
                    ),
                    format!(
                        "port {port} is the barrier port of the agent {} ({port_source}); containers \
                         of a pod share its network: declare another port here, or move the \
                         agent's barrier ({} and its startup probe)",
                        container_path(pod_prefix, agent),
                        agent_env::BARRIER_PORT,
                    ),
                );
            }
        }
    }
}

/// Why a main-container agent (`WORKER_COMMAND`) is denied, and what to run instead. Short
/// enough that the UPDATE ratchet's note still fits in a warning ([`MAX_MESSAGE_BYTES`]).
fn main_container_message() -> String {
    format!(
        "main-container mode ({}) is not offered: the kubelet backs off a container restarted \
         in place (CrashLoopBackOff, 10s doubling to 300s), so repeated group restarts overrun \
         the group-restart deadline; run the worker in its own container and let the webhook \
         inject the agent sidecar (docs/protocol.md)",
        agent_env::WORKER_COMMAND,
    )
}

/// Warns about workers whose crash fails the pod instead of restarting it in place.
fn check_worker_rules(pod_prefix: &str, pod_spec: &PodSpec<'_>, out: &mut Validation) {
    for c in pod::containers(pod_spec, pod::ContainerList::Regular) {
        if !c.restart_rules().iter().any(pod::RestartRule::restarts_pod) {
            warning(
                out,
                format!(
                    "{} ({}): a crash of this container fails its pod, which is replaced before the \
                 group restarts; add restartPolicyRules [{{action: {}, exitCodes: {{operator: \
                 NotIn, values: [0]}}}}] to restart the pod in place at once",
                    container_path(pod_prefix, &c),
                    c.name(),
                    pod::RESTART_ALL_CONTAINERS
                ),
            );
        }
    }
}

/// A value for a message: its JSON, or "not set".
fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "not set".to_owned(), Value::to_string)
}

#[cfg(test)]
mod tests;
