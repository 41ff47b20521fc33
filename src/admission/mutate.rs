//! Mutation of InPlaceRestart JobSets (design.md §3): the agent sidecar, its env, the service
//! account, the Job fields the protocol needs, as targeted JSON Patch operations. Fields this code
//! does not model are never touched; mutating an already-mutated JobSet yields no operation.

use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use jsonptr::PointerBuf;
use serde_json::{Map, Value, json};

use super::config::InjectionConfig;
use super::pod::{self, Agent, AgentMode, Container};
use super::validate::{BACKOFF_LIMIT, POD_REPLACEMENT_POLICY};
use super::{INJECT_ANNOTATION, INJECTED_ANNOTATION, Mutation, jobset_view};
use crate::agent::contract;
use crate::protocol::JOBSET_NAME_LABEL;

/// The value of the `jobset-inplace.dev/injected` annotation: the version that injected.
pub const INJECTED_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Computes the injection patch for a JobSet (CREATE).
pub fn mutate(jobset: &Value, config: &InjectionConfig) -> Mutation {
    let mut out = Mutation::default();
    let view = jobset_view(jobset);
    if !view.in_place_restart || view.annotation(INJECT_ANNOTATION) == Some("false") {
        return out;
    }
    for (i, rj) in view.replicated_jobs.iter().enumerate() {
        let Some(job_spec) = rj.pointer("/template/spec").and_then(Value::as_object) else {
            continue;
        };
        let job_ptr = ptr(&["spec", "replicatedJobs"])
            .idx(i)
            .keys(&["template", "spec"]);
        let mut ops = Vec::new();
        if !job_spec.contains_key("backoffLimit") {
            ops.push(add(job_ptr.key("backoffLimit"), json!(BACKOFF_LIMIT)));
        }
        if !job_spec.contains_key("podReplacementPolicy") {
            ops.push(add(
                job_ptr.key("podReplacementPolicy"),
                json!(POD_REPLACEMENT_POLICY),
            ));
        }
        if let Some(template) = job_spec.get("template").and_then(Value::as_object)
            && let Some(pod_spec) = template.get("spec").filter(|s| s.is_object())
        {
            let template_ptr = job_ptr.key("template");
            let pod_ptr = template_ptr.key("spec");
            rewrite_restart_pod(&pod_ptr, pod_spec, &mut ops, &mut out.warnings, i);
            match pod::agent(pod_spec) {
                None => inject_agent(&pod_ptr, pod_spec, config, &mut ops),
                Some(agent) => complete_agent(&pod_ptr, &agent, config, &mut ops),
            }
            let names_account = ["serviceAccountName", "serviceAccount"].iter().any(|k| {
                pod_spec
                    .get(*k)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            });
            if !names_account {
                ops.push(add(
                    pod_ptr.key("serviceAccountName"),
                    json!(config.service_account),
                ));
            }
            if !ops.is_empty() {
                annotate_injected(&template_ptr, template, &mut ops);
            }
        }
        out.patch.0.extend(ops);
    }
    out
}

/// Rewrites KEP-467's `RestartPod` to Kubernetes 1.35's `RestartAllContainers`.
fn rewrite_restart_pod(
    pod_ptr: &Ptr,
    pod_spec: &Value,
    ops: &mut Vec<PatchOperation>,
    warnings: &mut Vec<String>,
    replicated_job: usize,
) {
    for c in pod::all_containers(pod_spec) {
        for rule in c.restart_rules() {
            if rule.action == pod::RESTART_POD {
                ops.push(PatchOperation::Replace(ReplaceOperation {
                    path: container_ptr(pod_ptr, &c)
                        .key("restartPolicyRules")
                        .idx(rule.index)
                        .key("action")
                        .0,
                    value: json!(pod::RESTART_ALL_CONTAINERS),
                }));
                warnings.push(format!(
                    "spec.replicatedJobs[{replicated_job}]: container {} restart rule {}: {} \
                     rewritten to {}, its name since Kubernetes 1.35",
                    c.name(),
                    rule.index,
                    pod::RESTART_POD,
                    pod::RESTART_ALL_CONTAINERS
                ));
            }
        }
    }
}

/// Appends the agent sidecar to `initContainers`.
fn inject_agent(
    pod_ptr: &Ptr,
    pod_spec: &Value,
    config: &InjectionConfig,
    ops: &mut Vec<PatchOperation>,
) {
    let container = agent_container(config);
    match pod_spec.get("initContainers") {
        Some(Value::Array(_)) => ops.push(add(pod_ptr.key("initContainers").key("-"), container)),
        _ => ops.push(add(pod_ptr.key("initContainers"), json!([container]))),
    }
}

/// The injected agent sidecar.
pub fn agent_container(config: &InjectionConfig) -> Value {
    let mut env = vec![
        field_env(contract::NAMESPACE, "metadata.namespace"),
        field_env(contract::POD_NAME, "metadata.name"),
        field_env(
            contract::JOBSET_NAME,
            &format!("metadata.annotations['{JOBSET_NAME_LABEL}']"),
        ),
        literal_env(
            contract::RESTART_EXIT_CODE,
            &config.restart_exit_code.to_string(),
        ),
        literal_env(contract::PROTOCOL, config.protocol.as_str()),
    ];
    if config.barrier_port != contract::DEFAULT_BARRIER_PORT {
        env.push(literal_env(
            contract::BARRIER_PORT,
            &config.barrier_port.to_string(),
        ));
    }
    if config.barrier_path != contract::DEFAULT_BARRIER_PATH {
        env.push(literal_env(contract::BARRIER_PATH, &config.barrier_path));
    }
    let mut container = json!({
        "name": contract::CONTAINER_NAME,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "args": ["agent"],
        "restartPolicy": "Always",
        "restartPolicyRules": [{
            "action": pod::RESTART_ALL_CONTAINERS,
            "exitCodes": {"operator": "NotIn", "values": [0]}
        }],
        "env": env,
        "startupProbe": {
            "httpGet": {"path": config.barrier_path, "port": config.barrier_port},
            "periodSeconds": config.probe_period_seconds,
            "failureThreshold": config.probe_failure_threshold
        },
        "securityContext": {
            "runAsNonRoot": true,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "terminationMessagePolicy": "FallbackToLogsOnError"
    });
    let mut resources = Map::new();
    for (key, map) in [
        ("requests", &config.resources.requests),
        ("limits", &config.resources.limits),
    ] {
        if !map.is_empty() {
            resources.insert(key.to_owned(), json!(map));
        }
    }
    if !resources.is_empty()
        && let Some(obj) = container.as_object_mut()
    {
        obj.insert("resources".to_owned(), Value::Object(resources));
    }
    container
}

/// Adds the env an existing agent lacks, deriving values from what the agent declares (its
/// restart rule, its startup probe) so that nothing added contradicts it.
fn complete_agent(
    pod_ptr: &Ptr,
    agent: &Agent<'_>,
    config: &InjectionConfig,
    ops: &mut Vec<PatchOperation>,
) {
    let c = &agent.container;
    let mut missing = Vec::new();
    for (name, field) in [
        (contract::NAMESPACE, "metadata.namespace".to_owned()),
        (contract::POD_NAME, "metadata.name".to_owned()),
        (
            contract::JOBSET_NAME,
            format!("metadata.annotations['{JOBSET_NAME_LABEL}']"),
        ),
    ] {
        if c.env(name).is_none() {
            missing.push(field_env(name, &field));
        }
    }
    if c.env_any(&[
        contract::RESTART_EXIT_CODE,
        contract::RESTART_EXIT_CODE_ALIAS,
    ])
    .is_none()
    {
        let code = agent
            .mode
            .restart_code(&c.restart_rules(), config.restart_exit_code)
            .unwrap_or(config.restart_exit_code);
        missing.push(literal_env(contract::RESTART_EXIT_CODE, &code.to_string()));
    }
    if c.env(contract::PROTOCOL).is_none() {
        missing.push(literal_env(contract::PROTOCOL, config.protocol.as_str()));
    }
    if agent.mode == AgentMode::Sidecar {
        let probe = c.startup_http_get();
        if c.env_any(&[contract::BARRIER_PORT, contract::BARRIER_PORT_ALIAS])
            .is_none()
        {
            let port = match probe.and_then(|g| g.get("port")) {
                Some(p) => c.resolve_port(p),
                None => Some(i64::from(config.barrier_port)),
            };
            if let Some(port) = port
                && port != i64::from(contract::DEFAULT_BARRIER_PORT)
            {
                missing.push(literal_env(contract::BARRIER_PORT, &port.to_string()));
            }
        }
        if c.env_any(&[contract::BARRIER_PATH, contract::BARRIER_PATH_ALIAS])
            .is_none()
        {
            let path = match probe {
                Some(g) => g.get("path").and_then(Value::as_str).unwrap_or("/"),
                None => config.barrier_path.as_str(),
            };
            if path != contract::DEFAULT_BARRIER_PATH {
                missing.push(literal_env(contract::BARRIER_PATH, path));
            }
        }
    }
    if missing.is_empty() {
        return;
    }
    let env_ptr = container_ptr(pod_ptr, c).key("env");
    match c.value.get("env") {
        Some(Value::Array(_)) => {
            for entry in missing {
                ops.push(add(env_ptr.key("-"), entry));
            }
        }
        _ => ops.push(add(env_ptr, Value::Array(missing))),
    }
}

/// Marks the pod template as injected (creating `metadata` and `annotations` as needed).
fn annotate_injected(
    template_ptr: &Ptr,
    template: &Map<String, Value>,
    ops: &mut Vec<PatchOperation>,
) {
    let metadata = template.get("metadata").and_then(Value::as_object);
    let annotations = metadata
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object);
    let op = match (metadata, annotations) {
        (None, _) => add(
            template_ptr.key("metadata"),
            json!({"annotations": {INJECTED_ANNOTATION: INJECTED_VERSION}}),
        ),
        (Some(_), None) => add(
            template_ptr.keys(&["metadata", "annotations"]),
            json!({INJECTED_ANNOTATION: INJECTED_VERSION}),
        ),
        (Some(_), Some(a))
            if a.get(INJECTED_ANNOTATION).and_then(Value::as_str) == Some(INJECTED_VERSION) =>
        {
            return;
        }
        (Some(_), Some(_)) => add(
            template_ptr.keys(&["metadata", "annotations", INJECTED_ANNOTATION]),
            json!(INJECTED_VERSION),
        ),
    };
    ops.push(op);
}

fn field_env(name: &str, field_path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
}

fn literal_env(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

fn add(path: Ptr, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: path.0,
        value,
    })
}

fn container_ptr(pod_ptr: &Ptr, c: &Container<'_>) -> Ptr {
    pod_ptr.key(c.list.key()).idx(c.index)
}

/// A JSON Pointer under construction; every token is escaped by `jsonptr` (`/` in annotation
/// keys becomes `~1`).
#[derive(Clone, Debug)]
struct Ptr(PointerBuf);

fn ptr(keys: &[&str]) -> Ptr {
    Ptr(PointerBuf::new()).keys(keys)
}

impl Ptr {
    fn key(&self, key: &str) -> Ptr {
        let mut p = self.0.clone();
        p.push_back(key);
        Ptr(p)
    }
    fn keys(&self, keys: &[&str]) -> Ptr {
        let mut p = self.0.clone();
        for k in keys {
            p.push_back(*k);
        }
        Ptr(p)
    }
    fn idx(&self, index: usize) -> Ptr {
        let mut p = self.0.clone();
        p.push_back(index);
        Ptr(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Dialect;

    fn jobset(pod_spec: Value) -> Value {
        json!({
            "metadata": {"name": "js", "annotations": {}},
            "spec": {
                "failurePolicy": {"restartStrategy": "InPlaceRestart"},
                "replicatedJobs": [{"name": "w", "template": {"spec": {"template": {"spec": pod_spec}}}}]
            }
        })
    }

    fn apply(js: &Value, config: &InjectionConfig) -> Value {
        let mut out = js.clone();
        json_patch::patch(&mut out, &mutate(js, config).patch).expect("applies");
        out
    }

    fn env_value(container: &Value, name: &str) -> Option<String> {
        container["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str().map(str::to_owned))
    }

    #[test]
    fn derived_exit_code_avoids_excluded_codes() {
        let side = json!({"name": "a", "restartPolicy": "Always",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0, 42]}}]});
        let out = apply(
            &jobset(json!({"initContainers": [side]})),
            &InjectionConfig::defaults(Dialect::Epoch),
        );
        let agent = &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"]
            [0];
        assert_eq!(
            env_value(agent, "RESTART_POD_IN_PLACE_EXIT_CODE").as_deref(),
            Some("1")
        );
    }

    #[test]
    fn existing_exit_code_alias_is_kept() {
        let side = json!({"name": "a", "restartPolicy": "Always",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [5]}}],
            "env": [{"name": "IN_PLACE_RESTART_EXIT_CODE", "value": "5"}]});
        let out = apply(
            &jobset(json!({"initContainers": [side]})),
            &InjectionConfig::defaults(Dialect::Epoch),
        );
        let agent = &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"]
            [0];
        assert_eq!(env_value(agent, "RESTART_POD_IN_PLACE_EXIT_CODE"), None);
    }

    #[test]
    fn opt_out_and_other_strategies_are_left_alone() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let mut js = jobset(json!({"containers": [{"name": "w"}]}));
        js["metadata"]["annotations"][crate::admission::INJECT_ANNOTATION] = json!("false");
        assert!(mutate(&js, &config).patch.0.is_empty());
        js["metadata"]["annotations"][crate::admission::INJECT_ANNOTATION] = json!("true");
        assert!(!mutate(&js, &config).patch.0.is_empty());
        js["spec"]["failurePolicy"]["restartStrategy"] = json!("Recreate");
        assert!(mutate(&js, &config).patch.0.is_empty());
    }

    #[test]
    fn an_older_injection_is_restamped_only_when_something_changes() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let mut injected = apply(&jobset(json!({"containers": [{"name": "w"}]})), &config);
        let template = "/spec/replicatedJobs/0/template/spec/template/metadata/annotations";
        injected
            .pointer_mut(template)
            .and_then(Value::as_object_mut)
            .map(|a| a.insert(crate::admission::INJECTED_ANNOTATION.into(), json!("0.0.1")));
        assert!(
            mutate(&injected, &config).patch.0.is_empty(),
            "nothing to inject"
        );
    }

    #[test]
    fn injected_agent_uses_the_config() {
        let mut config = InjectionConfig::defaults(Dialect::Attempt);
        config.barrier_port = 9000;
        let agent = agent_container(&config);
        assert_eq!(env_value(&agent, "BARRIER_PORT").as_deref(), Some("9000"));
        assert_eq!(env_value(&agent, "BARRIER_PATH"), None);
        assert_eq!(
            env_value(&agent, "JOBSET_INPLACE_PROTOCOL").as_deref(),
            Some("attempt")
        );
        assert_eq!(agent["startupProbe"]["httpGet"]["port"], 9000);
    }
}
