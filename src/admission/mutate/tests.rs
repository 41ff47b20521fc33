use super::*;
use crate::admission::config::DEFAULT_IMAGE;
use crate::admission::sidecar::TOKEN_MOUNT_PATH;
use crate::protocol::Dialect;
use json_patch::{AddOperation, PatchOperation};
use jsonptr::PointerBuf;

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

/// Kubernetes' `SetDefaults_Job`: both unset become 1, an unset parallelism becomes 1,
/// completions is never defaulted. The injection writes exactly those defaults that meet
/// the rule (completions equal to parallelism); the rest stay as written and are denied.
#[test]
fn completions_and_parallelism_are_defaulted_as_kubernetes_does() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let kubernetes = |c: Option<i64>, p: Option<i64>| match (c, p) {
        (None, None) => (Some(1), Some(1)),
        (c, None) => (c, Some(1)),
        (c, p) => (c, p),
    };
    let values = [None, Some(0), Some(1), Some(2), Some(16)];
    for c in values {
        for p in values {
            let mut js = jobset(json!({"containers": [{"name": "w", "image": "x"}]}));
            let spec = &mut js["spec"]["replicatedJobs"][0]["template"]["spec"];
            for (key, v) in [("completions", c), ("parallelism", p)] {
                if let Some(v) = v {
                    spec[key] = json!(v);
                }
            }
            let out = apply(&js, &config);
            let job = &out["spec"]["replicatedJobs"][0]["template"]["spec"];
            let got = (job["completions"].as_i64(), job["parallelism"].as_i64());
            let defaulted = kubernetes(c, p);
            let meets = defaulted.0.is_some() && defaulted.0 == defaulted.1;
            let want = if meets { defaulted } else { (c, p) };
            assert_eq!(got, want, "{c:?} {p:?}");
            let v = crate::admission::validate(&out, &config);
            let denied: Vec<_> = v
                .violations
                .iter()
                .filter(|v| v.rule == Rule::Completions)
                .collect();
            assert_eq!(denied.is_empty(), meets, "{c:?} {p:?}: {denied:?}");
            assert!(mutate(&out, &config).patch.0.is_empty(), "idempotent");
        }
    }
    // Not an InPlaceRestart JobSet: nothing is written.
    let mut js = jobset(json!({"containers": [{"name": "w"}]}));
    js["spec"]["failurePolicy"] = json!({"maxRestarts": 1});
    assert!(mutate(&js, &config).patch.0.is_empty());
}

#[test]
fn derived_exit_code_avoids_excluded_codes() {
    let side = json!({"name": "a", "image": DEFAULT_IMAGE, "restartPolicy": "Always",
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
    let side = json!({"name": "a", "image": DEFAULT_IMAGE, "restartPolicy": "Always",
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

/// Issue 11: the agent's token is mounted in the agent only, when the webhook chose the
/// account; a template naming its own account keeps its own behaviour.
#[test]
fn the_chosen_account_s_token_goes_to_the_agent_only() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let out = apply(
        &jobset(
            json!({"containers": [{"name": "w"}], "volumes": [{"name": "data", "emptyDir": {}}]}),
        ),
        &config,
    );
    let pod = &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], config.service_account.as_str());
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["volumes"][0]["name"], "data");
    assert_eq!(pod["volumes"][1], token_volume());
    let sources = &pod["volumes"][1]["projected"]["sources"];
    assert_eq!(sources[0]["serviceAccountToken"]["expirationSeconds"], 3607);
    assert_eq!(sources[0]["serviceAccountToken"]["path"], "token");
    assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
    assert_eq!(sources[2]["downwardAPI"]["items"][0]["path"], "namespace");
    let agent = &pod["initContainers"][0];
    assert_eq!(agent["volumeMounts"], json!([token_mount()]));
    assert_eq!(agent["volumeMounts"][0]["mountPath"], TOKEN_MOUNT_PATH);
    assert_eq!(agent["volumeMounts"][0]["readOnly"], true);
    assert!(pod["containers"][0].get("volumeMounts").is_none());
    // Idempotent.
    assert!(mutate(&out, &config).patch.0.is_empty());

    // An existing agent without an account gets the mount appended.
    let side = json!({"name": "a", "image": DEFAULT_IMAGE, "restartPolicy": "Always",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "volumeMounts": [{"name": "x", "mountPath": "/x"}]});
    let out = apply(
        &jobset(json!({"initContainers": [side], "containers": [{"name": "w"}]})),
        &config,
    );
    let pod = &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"][0]["volumeMounts"][1], token_mount());
    assert_eq!(pod["volumes"], json!([token_volume()]));

    // Its own account: nothing about tokens is touched.
    let out = apply(
        &jobset(json!({"serviceAccountName": "mine", "containers": [{"name": "w"}]})),
        &config,
    );
    let pod = &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    assert!(pod.get("automountServiceAccountToken").is_none());
    assert!(pod.get("volumes").is_none());
    assert!(pod["initContainers"][0].get("volumeMounts").is_none());
}

/// The mutating review of `js` through the body's bytes, and its violations' paths; the
/// decision the reply carries and the response it encodes agree.
fn refused_paths(js: &Value, config: &InjectionConfig) -> Vec<String> {
    let body = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE",
            "kind": {"group": crate::jobset::GROUP, "kind": crate::jobset::KIND},
            "object": js}}))
    .expect("json");
    let reply = crate::admission::review(crate::admission::Endpoint::Mutate, &body, config);
    let answer: Value = serde_json::from_slice(&reply.body).expect("json");
    let verdict = reply.decision;
    assert_eq!(
        answer["response"]["allowed"], verdict.allowed,
        "the decision and its response agree"
    );
    let paths: Vec<String> = verdict.violations.into_iter().map(|v| v.path).collect();
    let from_bytes: Vec<String> = answer["response"]["status"]["details"]["causes"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["field"].as_str())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(paths, from_bytes, "the decision and its response agree");
    assert_eq!(mutate(js, config).violations.len(), paths.len());
    paths
}

/// Issue 21 item 4: `automountServiceAccountToken: true` on a template whose account the
/// webhook chooses would mount the agent's token into every container, and a volume of the
/// template's own under the token volume's name would be mounted into the agent as its
/// token. Both are refused, naming the field; nothing is injected.
#[test]
fn the_agent_s_token_goes_to_no_worker_and_comes_from_no_other_volume() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let sa = config.service_account.clone();
    let w = json!([{"name": "w"}]);
    let spec = "spec.replicatedJobs[0].template.spec.template.spec";
    let mut near_misses = Vec::new();
    for pointer in [
        "/projected/defaultMode",
        "/projected/sources/0/serviceAccountToken/expirationSeconds",
        "/projected/sources/0/serviceAccountToken/path",
        "/projected/sources/1/configMap/name",
        "/projected/sources/2/downwardAPI/items/0/fieldRef/fieldPath",
    ] {
        let mut v = token_volume();
        if let Some(x) = v.pointer_mut(pointer) {
            *x = match x {
                Value::String(_) => json!("other"),
                _ => json!(420.0),
            };
        }
        near_misses.push(v);
    }
    let mut extra = token_volume();
    extra["hostPath"] = json!({"path": "/var/run/secrets"});
    near_misses.push(extra);
    let mut extra_source = token_volume();
    if let Some(sources) = extra_source
        .pointer_mut("/projected/sources")
        .and_then(Value::as_array_mut)
    {
        sources.push(json!({"secret": {"name": "other-token"}}));
    }
    near_misses.push(extra_source);
    let mut cases = vec![
        (
            json!({"automountServiceAccountToken": true, "containers": w}),
            "automountServiceAccountToken",
        ),
        (
            json!({"automountServiceAccountToken": "true", "containers": w}),
            "automountServiceAccountToken",
        ),
        (
            json!({"serviceAccountName": sa, "automountServiceAccountToken": true,
                       "volumes": [token_volume()], "containers": w}),
            "automountServiceAccountToken",
        ),
        (
            json!({"volumes": [{"name": TOKEN_VOLUME, "emptyDir": {}}], "containers": w}),
            "volumes[0]",
        ),
        (
            json!({"serviceAccountName": "mine", "containers": w,
                       "volumes": [{"name": "data"}, {"name": TOKEN_VOLUME, "secret": {"secretName": "s"}}]}),
            "volumes[1]",
        ),
    ];
    for v in near_misses {
        cases.push((json!({"volumes": [v], "containers": w}), "volumes[0]"));
    }
    for (pod, field) in cases {
        let js = jobset(pod.clone());
        assert!(mutate(&js, &config).patch.0.is_empty(), "{pod}");
        assert_eq!(
            refused_paths(&js, &config),
            [format!("{spec}.{field}")],
            "{pod}"
        );
    }

    // Unset or false: injected, the token in the agent only; its own account with `true`
    // keeps its own behaviour.
    for pod in [
        json!({"containers": w}),
        json!({"automountServiceAccountToken": false, "containers": w}),
        json!({"serviceAccountName": sa, "automountServiceAccountToken": false, "containers": w}),
    ] {
        let out = apply(&jobset(pod.clone()), &config);
        let pod_out = pod_of(&out, 0);
        assert_eq!(pod_out["automountServiceAccountToken"], false, "{pod}");
        assert_eq!(pod_out["volumes"], json!([token_volume()]), "{pod}");
        assert!(refused_paths(&out, &config).is_empty(), "{pod}");
        assert!(
            mutate(&out, &config).patch.0.is_empty(),
            "idempotent: {pod}"
        );
    }
    let out = apply(
        &jobset(
            json!({"serviceAccountName": "mine", "automountServiceAccountToken": true, "containers": w}),
        ),
        &config,
    );
    assert_eq!(pod_of(&out, 0)["automountServiceAccountToken"], true);
    assert!(pod_of(&out, 0).get("volumes").is_none());
}

/// A container that is not an object (the API server's schema refuses it after the mutating
/// webhooks): the worker rule goes only to the containers that are, and the patch applies
/// (the offline fuzz target found a `restartPolicy` added into a string).
#[test]
fn a_container_that_is_not_an_object_gets_nothing_patched_into_it() {
    let js = jobset(json!({"restartPolicy": "Never",
            "containers": ["not a container", {"name": "w", "image": "i"}]}));
    let out = apply(&js, &InjectionConfig::defaults(Dialect::Epoch));
    let containers =
        &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[0], "not a container");
    assert!(
        containers[1]["restartPolicyRules"].is_array(),
        "{containers}"
    );
}

#[test]
fn injected_agent_uses_the_config() {
    let mut config = InjectionConfig::defaults(Dialect::Attempt);
    config.barrier_port = 9000;
    let agent = serde_json::to_value(agent_container(&config, config.barrier_port, false)).unwrap();
    assert_eq!(env_value(&agent, "BARRIER_PORT").as_deref(), Some("9000"));
    assert_eq!(env_value(&agent, "BARRIER_PATH"), None);
    assert_eq!(
        env_value(&agent, "JOBSET_INPLACE_PROTOCOL").as_deref(),
        Some("attempt")
    );
    assert_eq!(agent["startupProbe"]["httpGet"]["port"], 9000);
}

const POD: &str = "/spec/replicatedJobs/0/template/spec/template/spec";

fn pod_of(js: &Value, job: usize) -> &Value {
    &js["spec"]["replicatedJobs"][job]["template"]["spec"]["template"]["spec"]
}

/// The injected agent of a mutated pod template, and the port it serves its barrier on as
/// its env says (the agent's default when unset) and as its probe asks.
fn barrier_of(js: &Value, job: usize) -> (Option<i64>, Value) {
    let agent = pod_of(js, job)["initContainers"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == agent_env::CONTAINER_NAME))
        .expect("an injected agent");
    let env = env_value(agent, agent_env::BARRIER_PORT)
        .map_or(Some(i64::from(agent_env::DEFAULT_BARRIER_PORT)), |v| {
            v.parse().ok()
        });
    (env, agent["startupProbe"]["httpGet"]["port"].clone())
}

fn ports(list: &[u16]) -> Value {
    Value::Array(list.iter().map(|p| json!({"containerPort": p})).collect())
}

#[test]
fn the_barrier_takes_the_first_port_no_container_declares() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    for (declared, init, want) in [
        (vec![], vec![], 8080),
        (vec![6000], vec![], 8080),
        (vec![8080], vec![], 18080),
        (vec![8080, 18080], vec![], 18081),
        // A sidecar (or any init container) of the template counts as much as a worker.
        (vec![6000], vec![8080], 18080),
        (vec![8080], vec![18080, 18081], 18082),
    ] {
        let mut pod = json!({"containers": [{"name": "w", "ports": ports(&declared)}]});
        if !init.is_empty() {
            pod["initContainers"] =
                json!([{"name": "log", "restartPolicy": "Always", "ports": ports(&init)}]);
        }
        let out = apply(&jobset(pod), &config);
        let (env, probe) = barrier_of(&out, 0);
        assert_eq!(env, Some(i64::from(want)), "{declared:?} {init:?}");
        assert_eq!(
            probe, want,
            "{declared:?} {init:?}: the probe asks the env's port"
        );
        let v = crate::admission::validate(&out, &config);
        let barrier: Vec<_> = v
            .violations
            .iter()
            .filter(|v| !v.path.ends_with("completions") && !v.path.ends_with("parallelism"))
            .collect();
        assert!(barrier.is_empty(), "{barrier:?}");
        assert!(mutate(&out, &config).patch.0.is_empty(), "idempotent");
    }
}

/// Templates differ: each replicatedJob's agent gets the port that is free in its own.
#[test]
fn each_pod_template_gets_its_own_barrier_port() {
    let mut config = InjectionConfig::defaults(Dialect::Epoch);
    config.barrier_port = 9000;
    let mut js = jobset(json!({"containers": [{"name": "w", "ports": ports(&[9000])}]}));
    let job = js["spec"]["replicatedJobs"][0].clone();
    let mut other = job.clone();
    other["name"] = json!("x");
    other["template"]["spec"]["template"]["spec"]["containers"][0]["ports"] = ports(&[6000]);
    js["spec"]["replicatedJobs"] = json!([job.clone(), other, job]);
    let out = apply(&js, &config);
    assert_eq!(barrier_of(&out, 0), (Some(18080), json!(18080)));
    assert_eq!(barrier_of(&out, 1), (Some(9000), json!(9000)));
    assert_eq!(barrier_of(&out, 2), (Some(18080), json!(18080)));
}

#[test]
fn no_free_barrier_port_is_a_denial_naming_the_template() {
    let mut config = InjectionConfig::defaults(Dialect::Epoch);
    config.barrier_fallback_ports = crate::admission::config::PortRange {
        first: 18080,
        last: 18081,
    };
    let mut js = jobset(
        json!({"containers": [{"name": "w", "ports": ports(&[8080, 18080])},
                                                   {"name": "v", "ports": ports(&[18081])}]}),
    );
    let taken = js["spec"]["replicatedJobs"][0].clone();
    let mut free = taken.clone();
    free["template"]["spec"]["template"]["spec"]["containers"] = json!([{"name": "w"}]);
    js["spec"]["replicatedJobs"] = json!([free, taken]);
    let m = mutate(&js, &config);
    assert!(m.patch.0.is_empty(), "nothing is injected");
    assert_eq!(m.too_large, None);
    assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
    assert_eq!(
        m.violations[0].path,
        "spec.replicatedJobs[1].template.spec.template.spec.initContainers"
    );
    assert!(
        m.violations[0].message.contains("8080, then 18080-18081"),
        "{}",
        m.violations[0].message
    );
    // The webhook's answer: denied, 422, with the field path.
    let body = crate::admission::review::create_body(&serde_json::to_vec(&js).expect("json"));
    let verdict =
        crate::admission::review(crate::admission::Endpoint::Mutate, &body, &config).decision;
    assert!(!verdict.allowed);
    assert_eq!(
        verdict.status.as_ref().map(|s| s["code"].clone()),
        Some(json!(422))
    );
    assert_eq!(verdict.violations, m.violations);
    // Many such templates: the first ones reported, the rest counted.
    let mut many = js.clone();
    let taken = many["spec"]["replicatedJobs"][1].clone();
    many["spec"]["replicatedJobs"] = Value::Array(vec![taken; 500]);
    let body = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE",
            "kind": {"group": crate::jobset::GROUP, "kind": crate::jobset::KIND},
            "object": many}}))
    .expect("json");
    let reply = crate::admission::review(crate::admission::Endpoint::Mutate, &body, &config);
    assert!(reply.body.len() < 32 * 1024, "{}", reply.body.len());
    let answer: Value = serde_json::from_slice(&reply.body).expect("json");
    let status = &answer["response"]["status"];
    assert_eq!(
        status["details"]["causes"].as_array().map(Vec::len),
        Some(crate::admission::validate::MAX_VIOLATIONS)
    );
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("and 480 more violations")),
        "{status}"
    );
    // No fallbacks at all: only the barrier port.
    config.barrier_fallback_ports = crate::admission::config::PortRange::NONE;
    let js = jobset(json!({"containers": [{"name": "w", "ports": ports(&[8080])}]}));
    let m = mutate(&js, &config);
    assert!(
        m.violations[0].message.contains("(8080)"),
        "{:?}",
        m.violations
    );
}

#[test]
fn pull_secrets_are_added_to_templates_running_the_injected_agent() {
    let mut config = InjectionConfig::defaults(Dialect::Epoch);
    config.image_pull_secrets = vec!["agent".into(), "mirror".into(), "agent".into()];
    // None yet: the list is created, each name once.
    let out = apply(&jobset(json!({"containers": [{"name": "w"}]})), &config);
    assert_eq!(
        pod_of(&out, 0)["imagePullSecrets"],
        json!([{"name": "agent"}, {"name": "mirror"}])
    );
    assert!(mutate(&out, &config).patch.0.is_empty(), "idempotent");

    // A list of the pod's own, with fields this code does not model: only appended to.
    let own = json!([{"name": "team", "futureField": {"a/b": [1, "~"]}},
                         {"name": "mirror", "x-vendor.example/setting": true},
                         "not-an-object"]);
    let js = jobset(json!({"containers": [{"name": "w"}], "imagePullSecrets": own}));
    let m = mutate(&js, &config);
    let secret_ops: Vec<_> = m
        .patch
        .0
        .iter()
        .filter(|op| op.path().as_str().contains("imagePullSecrets"))
        .collect();
    assert_eq!(secret_ops.len(), 1, "{secret_ops:?}");
    assert_eq!(
        secret_ops[0],
        &PatchOperation::Add(AddOperation {
            path: PointerBuf::parse(format!("{POD}/imagePullSecrets/-")).expect("pointer"),
            value: json!({"name": "agent"}),
        })
    );
    let out = apply(&js, &config);
    let list = &pod_of(&out, 0)["imagePullSecrets"];
    for (i, entry) in own.as_array().expect("array").iter().enumerate() {
        assert_eq!(
            serde_json::to_string(&list[i]).ok(),
            serde_json::to_string(entry).ok(),
            "entry {i} kept as written, in its place"
        );
    }
    assert_eq!(list[3], json!({"name": "agent"}));

    // Not a list: left alone. A template running its own agent: left alone.
    let js = jobset(json!({"containers": [{"name": "w"}], "imagePullSecrets": "team"}));
    let out = apply(&js, &config);
    assert_eq!(pod_of(&out, 0)["imagePullSecrets"], "team");
    let side = json!({"name": "mine", "image": DEFAULT_IMAGE, "restartPolicy": "Always",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]});
    let out = apply(
        &jobset(json!({"initContainers": [side.clone()], "containers": [{"name": "w"}]})),
        &config,
    );
    assert!(pod_of(&out, 0).get("imagePullSecrets").is_none());
    // A sidecar named as the injected agent is taken for it; a main-container agent of
    // that name is not (it runs the worker's image).
    let mut named = side;
    named["name"] = json!(agent_env::CONTAINER_NAME);
    let out = apply(
        &jobset(json!({"initContainers": [named], "containers": [{"name": "w"}]})),
        &config,
    );
    assert_eq!(
        pod_of(&out, 0)["imagePullSecrets"],
        json!([{"name": "agent"}, {"name": "mirror"}])
    );
    let main = json!({"name": agent_env::CONTAINER_NAME, "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "env": [{"name": "WORKER_COMMAND", "value": "train"}]});
    let out = apply(&jobset(json!({"containers": [main]})), &config);
    assert!(pod_of(&out, 0).get("imagePullSecrets").is_none());
}

/// A JobSet written again without part of what the webhook added (Kubeflow Trainer's
/// apply, an update of the JobSet as its client built it): the UPDATE's patch makes it the
/// stored JobSet again, whichever part is missing.
#[test]
fn an_update_gets_back_what_the_injection_added_and_no_more() {
    let mut config = InjectionConfig::defaults(Dialect::Epoch);
    config.image_pull_secrets = vec!["agent".into()];
    let plain = jobset(
        json!({"containers": [{"name": "w", "ports": ports(&[8080])}],
                                  "volumes": [{"name": "data", "emptyDir": {}}]}),
    );
    let stored = apply(&plain, &config);
    assert_eq!(barrier_of(&stored, 0).0, Some(18080));
    let strip = |keys: &[&str], agent: bool| {
        let mut js = stored.clone();
        let pod = js
            .pointer_mut(POD)
            .and_then(Value::as_object_mut)
            .expect("pod spec");
        for k in keys {
            pod.remove(*k);
        }
        if agent {
            pod.remove("initContainers");
        }
        js
    };
    for (what, written) in [
        ("everything", plain.clone()),
        ("the agent", strip(&[], true)),
        (
            "the account",
            strip(
                &["serviceAccountName", "automountServiceAccountToken"],
                false,
            ),
        ),
        (
            "the account and the agent",
            strip(&["serviceAccountName"], true),
        ),
        ("the token volume and the agent", {
            let mut js = strip(&[], true);
            if let Some(v) = js
                .pointer_mut(&format!("{POD}/volumes"))
                .and_then(Value::as_array_mut)
            {
                v.retain(|v| v["name"] != TOKEN_VOLUME);
            }
            js
        }),
        ("the pull secrets", strip(&["imagePullSecrets"], false)),
    ] {
        let m = mutate_update(&written, &stored, &config);
        let mut out = written.clone();
        json_patch::patch(&mut out, &m.patch).expect("applies");
        assert_eq!(out, stored, "{what} removed");
        assert!(
            mutate_update(&out, &stored, &config).patch.0.is_empty(),
            "{what}"
        );
    }
    // The stored JobSet itself: nothing.
    assert!(mutate_update(&stored, &stored, &config).patch.0.is_empty());
}

/// Only the replicatedJobs the stored JobSet shows injected are injected on UPDATE: one
/// admitted uninjected stays as it is (JobSet holds replicatedJobs immutable).
#[test]
fn an_update_injects_only_what_was_injected() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let plain = jobset(json!({"containers": [{"name": "w"}]}));
    assert!(mutate_update(&plain, &plain, &config).patch.0.is_empty());
    let mut two = plain.clone();
    let job = two["spec"]["replicatedJobs"][0].clone();
    two["spec"]["replicatedJobs"] = json!([job.clone(), job]);
    let mut stored = apply(&two, &config);
    // The second replicatedJob as if admitted before the webhook was installed.
    stored["spec"]["replicatedJobs"][1] = two["spec"]["replicatedJobs"][1].clone();
    let m = mutate_update(&two, &stored, &config);
    assert!(!m.patch.0.is_empty());
    assert!(
        m.patch
            .0
            .iter()
            .all(|op| op.path().as_str().starts_with("/spec/replicatedJobs/0/")),
        "{:?}",
        m.patch
    );
    // A stored JobSet that was not InPlaceRestart was never injected.
    let mut recreate = apply(&plain, &config);
    recreate["spec"]["failurePolicy"]["restartStrategy"] = json!("Recreate");
    assert!(mutate_update(&plain, &recreate, &config).patch.0.is_empty());
}
