use super::*;
use serde_json::json;

fn jobset(pod_spec: Value) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {
            "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"},
            "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                "completions": 2, "parallelism": 2, "backoffLimit": Rule::BACKOFF_LIMIT,
                "podReplacementPolicy": "Failed", "template": {"spec": pod_spec}
            }}}]
        }
    })
}

fn agent(extra: Value) -> Value {
    let mut a = json!({
        "name": "a", "image": crate::admission::config::DEFAULT_IMAGE, "restartPolicy": "Always",
        "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}],
        "startupProbe": {"httpGet": {"path": "/barrier-is-lifted", "port": 8080}, "periodSeconds": 1, "failureThreshold": 86400},
        "env": [{"name": "POD_NAME", "value": "p"}, {"name": "JOBSET_NAME", "value": "js"}]
    });
    if let (Some(a), Some(extra)) = (a.as_object_mut(), extra.as_object()) {
        a.extend(extra.clone());
    }
    a
}

fn push_env(container: &mut Value, entry: Value) {
    if let Some(env) = container["env"].as_array_mut() {
        env.push(entry);
    }
}

fn worker() -> Value {
    json!({"name": "w", "restartPolicy": "Never",
               "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]})
}

fn paths(v: &Validation) -> Vec<&str> {
    v.violations.iter().map(|v| v.path.as_str()).collect()
}

fn config() -> InjectionConfig {
    InjectionConfig::defaults(Dialect::Epoch)
}

const C: &str = "spec.replicatedJobs[0].template.spec.template.spec";

#[test]
fn a_complete_pod_passes_quietly() {
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [agent(json!({}))], "containers": [worker()]}),
        ),
        &config(),
    );
    assert_eq!(v, Validation::default());
}

/// Issue 21 item 4: a pod running as the agent's account with the token automounted hands
/// it to every container; a volume named as the agent's token volume must be that volume.
#[test]
fn the_agent_s_token_is_for_the_agent_only() {
    let sa = config().service_account;
    let token = crate::admission::sidecar::token_volume();
    let base = |extra: Value| {
        let mut pod = json!({"initContainers": [agent(json!({}))], "containers": [worker()]});
        if let (Some(p), Some(extra)) = (pod.as_object_mut(), extra.as_object()) {
            p.extend(extra.clone());
        }
        jobset(pod)
    };
    for (extra, want) in [
        (
            json!({"serviceAccountName": sa, "automountServiceAccountToken": true}),
            vec![format!("{C}.automountServiceAccountToken")],
        ),
        (
            json!({"serviceAccount": sa, "automountServiceAccountToken": true}),
            vec![format!("{C}.automountServiceAccountToken")],
        ),
        (
            json!({"serviceAccountName": "sa", "volumes": [{"name": "data"},
                    {"name": crate::admission::sidecar::TOKEN_VOLUME, "emptyDir": {}}]}),
            vec![format!("{C}.volumes[1]")],
        ),
        // Allowed: its own account, the token kept from the workers, or the token volume
        // as injected.
        (
            json!({"serviceAccountName": "sa", "automountServiceAccountToken": true}),
            vec![],
        ),
        (
            json!({"serviceAccountName": sa, "automountServiceAccountToken": false,
                       "volumes": [token]}),
            vec![],
        ),
    ] {
        let v = validate(&base(extra.clone()), &config());
        assert_eq!(paths(&v), want, "{extra}");
    }
}

#[test]
fn not_in_place_restart_is_not_judged() {
    let mut js = jobset(json!({}));
    js["spec"]["failurePolicy"]["restartStrategy"] = json!("Recreate");
    assert_eq!(validate(&js, &config()), Validation::default());
}

#[test]
fn a_shadowing_rule_is_caught() {
    // The first rule matching 42 restarts only the container: the pod never restarts.
    let a = agent(json!({"restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}},
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
    ]}));
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [a], "containers": [worker()]}),
        ),
        &config(),
    );
    assert_eq!(
        paths(&v),
        vec![format!("{C}.initContainers[0].restartPolicyRules")]
    );
    assert!(v.violations[0].message.contains("42"), "{:?}", v.violations);
}

#[test]
fn exit_code_from_value_from_is_not_guessed() {
    let mut a = agent(json!({}));
    push_env(
        &mut a,
        json!({"name": "RESTART_POD_IN_PLACE_EXIT_CODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
    );
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [a], "containers": [worker()]}),
        ),
        &config(),
    );
    assert!(v.violations.is_empty(), "{:?}", v.violations);
}

#[test]
fn bad_env_literals_are_named() {
    let mut a = agent(json!({}));
    push_env(
        &mut a,
        json!({"name": "IN_PLACE_RESTART_EXIT_CODE", "value": "300"}),
    );
    push_env(
        &mut a,
        json!({"name": "STARTUP_PROBE_PORT", "value": "http"}),
    );
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [a], "containers": [worker()]}),
        ),
        &config(),
    );
    assert_eq!(
        paths(&v),
        vec![
            format!("{C}.initContainers[0].env"),
            format!("{C}.initContainers[0].env[3].value")
        ]
    );
    assert!(
        v.violations[0]
            .message
            .contains("IN_PLACE_RESTART_EXIT_CODE")
    );
    assert!(v.violations[1].message.contains("STARTUP_PROBE_PORT"));
}

#[test]
fn a_named_probe_port_is_resolved() {
    let a = agent(json!({"ports": [{"name": "gate", "containerPort": 8080}],
                             "startupProbe": {"httpGet": {"path": "/barrier-is-lifted", "port": "gate"}, "periodSeconds": 1, "failureThreshold": 86400}}));
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [a.clone()], "containers": [worker()]}),
        ),
        &config(),
    );
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    let mut unknown = a;
    unknown["startupProbe"]["httpGet"]["port"] = json!("nope");
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [unknown], "containers": [worker()]}),
        ),
        &config(),
    );
    assert_eq!(
        paths(&v),
        vec![format!("{C}.initContainers[0].startupProbe.httpGet.port")]
    );
}

#[test]
fn a_container_declaring_the_barrier_port_is_denied_at_that_port() {
    let mut w = worker();
    w["ports"] = json!([{"containerPort": 6000}, {"name": "http", "containerPort": 8080}]);
    let log = json!({"name": "log", "restartPolicy": "Always", "ports": [{"containerPort": 8080, "protocol": "UDP"}]});
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [log, agent(json!({}))],
                           "containers": [w.clone()]}),
        ),
        &config(),
    );
    assert_eq!(
        paths(&v),
        vec![
            format!("{C}.initContainers[0].ports[0].containerPort"),
            format!("{C}.containers[0].ports[1].containerPort"),
        ]
    );
    assert!(
        v.violations[1].message.contains("port 8080")
            && v.violations[1].message.contains("initContainers[1]"),
        "{}",
        v.violations[1].message
    );
    // The agent moved to a free port (env and probe): accepted. The agent may declare its
    // own barrier port.
    let mut moved = agent(
        json!({"ports": [{"name": "barrier", "containerPort": 9000}],
            "startupProbe": {"httpGet": {"path": "/barrier-is-lifted", "port": "barrier"}, "periodSeconds": 1, "failureThreshold": 86400}}),
    );
    push_env(&mut moved, json!({"name": "BARRIER_PORT", "value": "9000"}));
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [moved.clone()],
                           "containers": [w.clone()]}),
        ),
        &config(),
    );
    assert_eq!(v, Validation::default());
    // ... unless another container declares that one.
    w["ports"][0]["containerPort"] = json!(9000);
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [moved],
                           "containers": [w]}),
        ),
        &config(),
    );
    assert_eq!(
        paths(&v),
        vec![format!("{C}.containers[0].ports[0].containerPort")]
    );
    assert!(v.violations[0].message.contains("BARRIER_PORT"));
}

#[test]
fn two_agents_are_one_too_many() {
    let spec = json!({"serviceAccountName": "sa", "initContainers": [agent(json!({})), agent(json!({"name": "b"}))], "containers": [worker()]});
    let v = validate(&jobset(spec), &config());
    assert_eq!(paths(&v), vec![format!("{C}.initContainers[1]")]);
}

/// The agent as the main container (`WORKER_COMMAND`), complete as it was admitted before.
fn main_container_agent() -> Value {
    json!({"name": "m", "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "env": [{"name": "POD_NAME", "value": "p"}, {"name": "JOBSET_NAME", "value": "js"},
                    {"name": "WORKER_COMMAND", "value": "train"}]})
}

#[test]
fn a_main_container_agent_is_denied_with_why_and_what_to_use() {
    let v = validate(
        &jobset(json!({"serviceAccountName": "sa", "containers": [main_container_agent()]})),
        &config(),
    );
    // One violation, at its WORKER_COMMAND: the rest of the agent is not judged.
    assert_eq!(paths(&v), vec![format!("{C}.containers[0].env[2]")]);
    assert_eq!(v.rules, vec![Rule::MainContainerAgent]);
    let m = &v.violations[0].message;
    for part in [
        "WORKER_COMMAND",
        "CrashLoopBackOff",
        "deadline",
        "agent sidecar",
    ] {
        assert!(m.contains(part), "{m}");
    }
    assert!(m.len() <= MAX_MESSAGE_BYTES, "{}", m.len());
    // Beside a sidecar agent, it is still a second agent and still denied.
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [agent(json!({}))],
                           "containers": [main_container_agent(), worker()]}),
        ),
        &config(),
    );
    assert_eq!(paths(&v), vec![format!("{C}.containers[0]")]);
    assert_eq!(v.rules, vec![Rule::AgentDuplicate]);
}

/// A JobSet stored with a main-container agent (admitted by an older version) stays
/// updatable while its replicatedJob is unchanged; an edit of that replicatedJob is denied.
#[test]
fn a_stored_main_container_agent_is_ratcheted() {
    let old = jobset(json!({"serviceAccountName": "sa", "containers": [main_container_agent()]}));
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"a": "b"});
    let v = validate_update(&relabelled, &old, &config());
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("WORKER_COMMAND") && w.contains("unchanged by the update")),
        "{:?}",
        v.warnings
    );
    let mut edited = old.clone();
    edited["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        ["image"] = json!("train:2");
    let v = validate_update(&edited, &old, &config());
    assert_eq!(v.rules, vec![Rule::MainContainerAgent]);
}

#[test]
fn workers_without_in_place_rules_are_warned_about() {
    let v = validate(
        &jobset(
            json!({"serviceAccountName": "sa", "initContainers": [agent(json!({}))], "containers": [{"name": "w"}]}),
        ),
        &config(),
    );
    assert!(v.violations.is_empty());
    assert_eq!(v.warnings.len(), 1);
    assert!(
        v.warnings[0].contains("containers[0] (w)"),
        "{:?}",
        v.warnings
    );
}

/// Issue 11: a warning said of many replicatedJobs is said once, naming the first of them.
#[test]
fn identical_warnings_are_said_once_with_their_replicated_jobs() {
    let mut js = jobset(json!({"initContainers": [agent(json!({}))], "containers": [worker()]}));
    let job = js["spec"]["replicatedJobs"][0].clone();
    js["spec"]["replicatedJobs"] = Value::Array(vec![job; 12]);
    let v = validate(&js, &config());
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
    assert!(
            v.warnings[0].starts_with(
                "spec.replicatedJobs[0, 1, 2, 3, 4, 5, 6, 7 and 4 more].template.spec.template.spec.serviceAccountName is not set"
            ),
            "{:?}",
            v.warnings
        );
    // One replicatedJob: as it was.
    if let Some(jobs) = js["spec"]["replicatedJobs"].as_array_mut() {
        jobs.truncate(1);
    }
    let v = validate(&js, &config());
    assert!(
        v.warnings[0].starts_with("spec.replicatedJobs[0].template"),
        "{:?}",
        v.warnings
    );
}

#[test]
fn update_ratchets_only_unchanged_replicated_jobs() {
    let mut old = jobset(json!({"containers": [worker()]}));
    old["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = json!(6);
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"a": "b"});
    let v = validate_update(&relabelled, &old, &config());
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert!(v.warnings.iter().any(|w| w.contains("backoffLimit")));

    let mut worse = old.clone();
    worse["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = json!(5);
    let v = validate_update(&worse, &old, &config());
    assert!(paths(&v).contains(&"spec.replicatedJobs[0].template.spec.backoffLimit"));

    // An old object that was not InPlaceRestart ratchets nothing.
    let mut before = old.clone();
    before["spec"]["failurePolicy"]["restartStrategy"] = json!("Recreate");
    assert!(
        !validate_update(&relabelled, &before, &config())
            .violations
            .is_empty()
    );
}

/// Issue 47: the agent-missing denial names the opt-out annotation only when the JobSet has it;
/// otherwise it names the mutating webhook, which would have injected the agent.
#[test]
fn the_agent_missing_hint_names_the_annotation_only_when_it_is_there() {
    let missing = |js: &Value| {
        let v = validate(js, &config());
        let found: Vec<_> = v
            .violations
            .iter()
            .filter(|x| x.rule == Rule::AgentMissing)
            .map(|x| x.message.clone())
            .collect();
        assert_eq!(found.len(), 1, "{:?}", v.violations);
        found[0].clone()
    };
    let plain = jobset(json!({"containers": [worker()]}));
    let message = missing(&plain);
    assert!(
        message.ends_with(
            "; the mutating webhook injects it: check that the MutatingWebhookConfiguration \
             jobset-inplace is installed, selects this JobSet's namespace and reaches the \
             webhook (jobset-inplace doctor)"
        ),
        "{message}"
    );
    let key = crate::admission::INJECT_ANNOTATION;
    assert!(!message.contains(key), "{message}");
    let mut opted_out = plain.clone();
    opted_out["metadata"]["annotations"][key] = json!("false");
    let message = missing(&opted_out);
    assert!(
        message.ends_with(
            "; remove the jobset-inplace.dev/inject: \"false\" annotation to have it injected"
        ),
        "{message}"
    );
    assert!(!message.contains("mutating webhook"), "{message}");
    // Any other value does not stop the injection: the webhook is the cause.
    opted_out["metadata"]["annotations"][key] = json!("true");
    assert!(missing(&opted_out).contains("the mutating webhook injects it"));
}
