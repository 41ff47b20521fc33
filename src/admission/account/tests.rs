use serde_json::{Value, json};

use crate::admission::config::InjectionConfig;
use crate::admission::sidecar::{token_mount, token_volume};
use crate::admission::{Mutation, mutate, validate};
use crate::protocol::Dialect;
use crate::wire::agent_env;

const C: &str = "spec.replicatedJobs[0].template.spec.template.spec";

fn config() -> InjectionConfig {
    InjectionConfig::defaults(Dialect::Epoch)
}

fn jobset(pod_spec: Value) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {
            "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"},
            "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                "completions": 2, "parallelism": 2,
                "template": {"spec": pod_spec}
            }}}]
        }
    })
}

fn worker(extra: Value) -> Value {
    let mut w = json!({"name": "w", "image": "train"});
    if let (Some(w), Some(extra)) = (w.as_object_mut(), extra.as_object()) {
        w.extend(extra.clone());
    }
    w
}

/// The fields the injection refuses, or none when it patches.
fn refused(m: &Mutation) -> Vec<String> {
    m.violations.iter().map(|v| v.path.clone()).collect()
}

/// What the webhook does: mutate, then validate what it made. The paths refused (by either).
fn admit(js: &Value) -> (Vec<String>, Value) {
    let m = mutate(js, &config());
    if !m.violations.is_empty() {
        return (refused(&m), js.clone());
    }
    let mut out = js.clone();
    json_patch::patch(&mut out, &m.patch).expect("the patch applies");
    let v = validate(&out, &config());
    (v.violations.iter().map(|v| v.path.clone()).collect(), out)
}

fn pod(js: &Value) -> &Value {
    &js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
}

/// Issue 34 item 1: a template that names the agent's account (either field) with
/// `automountServiceAccountToken` unset handed the token to every container (the injection
/// left a named account alone). Now the webhook sets it to `false` and mounts the token into
/// the agent only; validation denies such a pod that did not get it; `true` is refused.
#[test]
fn a_template_naming_the_agent_account_gets_the_token_in_the_agent_only() {
    let sa = config().service_account;
    for field in ["serviceAccountName", "serviceAccount"] {
        let js = jobset(json!({field: sa, "containers": [worker(json!({}))]}));
        let (refused, out) = admit(&js);
        assert!(refused.is_empty(), "{field}: {refused:?}");
        let p = pod(&out);
        assert_eq!(p["automountServiceAccountToken"], false, "{field}");
        assert_eq!(p["volumes"], json!([token_volume()]), "{field}");
        assert_eq!(
            p["initContainers"][0]["volumeMounts"],
            json!([token_mount()])
        );
        assert!(p["containers"][0].get("volumeMounts").is_none(), "{field}");

        // Not injected (opted out, or the webhook not there): denied, naming the field.
        let v = validate(&js, &config());
        assert!(
            v.violations
                .iter()
                .any(|v| v.path == format!("{C}.automountServiceAccountToken")),
            "{field}: {v:?}"
        );
        let js = jobset(json!({field: sa, "automountServiceAccountToken": true,
                               "containers": [worker(json!({}))]}));
        assert_eq!(
            admit(&js).0,
            vec![format!("{C}.automountServiceAccountToken")],
            "{field}"
        );
    }
}

/// Issue 34 item 2: a worker that mounts the agent's token volume (the one the webhook is
/// about to add, or, in a copied injected template, the one it added) is denied, naming the
/// mount, whatever account the pod runs as.
#[test]
fn only_the_agent_mounts_the_agent_s_token() {
    let sa = config().service_account;
    let mount = json!({"volumeMounts": [{"name": "data", "mountPath": "/d"}, token_mount()]});
    let mounted = format!("{C}.containers[0].volumeMounts[1]");
    // To be injected.
    let js = jobset(json!({"containers": [worker(mount.clone())]}));
    assert_eq!(admit(&js).0, vec![mounted.clone()]);
    // Injected, then copied with one more mount.
    let (refused, injected) = admit(&jobset(json!({"containers": [worker(json!({}))]})));
    assert!(refused.is_empty(), "{refused:?}");
    let mut copied = injected.clone();
    copied["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        ["volumeMounts"] = mount["volumeMounts"].clone();
    assert_eq!(admit(&copied).0, vec![mounted.clone()]);
    let v = validate(&copied, &config());
    assert_eq!(
        v.violations.iter().map(|v| &v.path).collect::<Vec<_>>(),
        vec![&mounted]
    );
    // An account of its own: the volume is still the agent's name; its mount is denied.
    let js = jobset(json!({"serviceAccountName": "mine", "containers": [worker(mount)]}));
    assert_eq!(admit(&js).0, vec![mounted]);
    // The agent's own mount is its token.
    let (refused, _) = admit(&jobset(json!({"serviceAccountName": sa,
        "automountServiceAccountToken": false, "containers": [worker(json!({}))]})));
    assert!(refused.is_empty(), "{refused:?}");
}

/// Issue 34 item 2: a projected service account token of the template's own, in a pod that
/// runs as the agent's account (chosen by the webhook, or named), would be the agent's token;
/// denied naming the volume. In a pod that runs as an account of its own it is its own token.
#[test]
fn no_other_token_is_projected_in_a_pod_running_as_the_agent() {
    let sa = config().service_account;
    let own = json!({"name": "my-token", "projected": {"sources": [
        {"configMap": {"name": "c"}},
        {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}});
    let config_only =
        json!({"name": "cfg", "projected": {"sources": [{"configMap": {"name": "c"}}]}});
    let w = worker(json!({"volumeMounts": [{"name": "my-token", "mountPath": "/t"}]}));
    for account in [
        json!({}),
        json!({"serviceAccountName": sa}),
        json!({"serviceAccount": sa}),
    ] {
        let mut spec = json!({"volumes": [config_only, own], "containers": [w]});
        if let (Some(s), Some(a)) = (spec.as_object_mut(), account.as_object()) {
            s.extend(a.clone());
        }
        assert_eq!(
            admit(&jobset(spec)).0,
            vec![format!("{C}.volumes[1]")],
            "{account}"
        );
    }
    let js = jobset(
        json!({"serviceAccountName": "mine", "volumes": [config_only, own],
                           "containers": [w]}),
    );
    assert!(admit(&js).0.is_empty());
    // The same read from the request's bytes: the webhook's own path.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "jobset.x-k8s.io", "version": "v1alpha2",
        "kind": "JobSet"}, "operation": "CREATE",
        "object": jobset(json!({"volumes": [config_only, own], "containers": [w]}))}});
    let body = serde_json::to_vec(&review).expect("json");
    let reply = crate::admission::review(crate::admission::Endpoint::Mutate, &body, &config());
    let answer: Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["status"]["details"]["causes"][0]["field"],
        format!("{C}.volumes[1]")
    );
}

/// Issue 34 item 5: a container named like the agent (a regular one: an init container of
/// that name is the agent) beside the agent is denied naming its name; the webhook would have
/// added an init container of the same name, and the API server refused every pod.
#[test]
fn a_container_named_like_the_agent_is_denied() {
    let named = json!({"name": agent_env::CONTAINER_NAME, "image": "sidecar"});
    let js = jobset(json!({"containers": [worker(json!({})), named]}));
    assert_eq!(admit(&js).0, vec![format!("{C}.containers[1].name")]);
    // Injected before, then a container of that name added.
    let (refused, mut injected) = admit(&jobset(json!({"containers": [worker(json!({}))]})));
    assert!(refused.is_empty(), "{refused:?}");
    if let Some(c) = injected
        .pointer_mut("/spec/replicatedJobs/0/template/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
    {
        c.push(named);
    }
    let v = validate(&injected, &config());
    assert_eq!(
        v.violations
            .iter()
            .map(|v| v.path.as_str())
            .collect::<Vec<_>>(),
        vec![format!("{C}.containers[1].name")]
    );
    // The agent itself keeps its name.
    assert!(
        admit(&jobset(json!({"containers": [worker(json!({}))]})))
            .0
            .is_empty()
    );
}

/// Issue 46 item 2 (b): a container of the agent's shape (a restartable init container with
/// a `RestartAllContainers` rule and a startup probe, or one named as the agent) that runs
/// another image was taken for the agent: no agent was injected, and it got the agent's
/// token mount. Now, in a pod that runs as the agent's account, it is refused by the
/// injection and denied by validation, naming its image; an agent that runs the configured
/// image's repository, with any tag or digest, is the agent and gets what it lacks.
#[test]
fn a_look_alike_of_the_agent_is_refused_and_never_given_the_token() {
    let sidecar = |name: &str, image: Option<&str>| {
        let mut c = json!({"name": name, "restartPolicy": "Always",
            "restartPolicyRules": [{"action": "RestartAllContainers",
                "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "startupProbe": {"httpGet": {"path": "/barrier-is-lifted", "port": 8080}}});
        if let Some(image) = image {
            c["image"] = json!(image);
        }
        c
    };
    let at_image = format!("{C}.initContainers[0].image");
    for (name, image) in [
        ("watchdog", Some("example.com/team-a/watchdog:1")),
        (
            "watchdog",
            Some("evil.example/jobset-inplace/jobset-inplace:1"),
        ),
        (
            "watchdog",
            Some("ghcr.io/jobset-inplace/jobset-inplace-debug:1"),
        ),
        ("watchdog", None),
        (
            agent_env::CONTAINER_NAME,
            Some("example.com/team-a/watchdog:1"),
        ),
    ] {
        let js = jobset(json!({"initContainers": [sidecar(name, image)],
                               "containers": [worker(json!({}))]}));
        let m = mutate(&js, &config());
        assert!(m.patch.0.is_empty(), "{image:?}: nothing injected");
        assert_eq!(refused(&m), vec![at_image.clone()], "{image:?}");
        let message = &m.violations[0].message;
        assert!(message.contains(&config().image), "{message}");
        // Validation alone (the injection opted out or bypassed) of a pod that names the
        // agent's account denies it the same way.
        let named = jobset(json!({"serviceAccountName": config().service_account,
            "automountServiceAccountToken": false,
            "initContainers": [sidecar(name, image)], "containers": [worker(json!({}))]}));
        let v = validate(&named, &config());
        assert!(
            v.violations.iter().any(|v| v.path == at_image),
            "{image:?}: {v:?}"
        );
        // A pod that names an account of its own brings its own agent, whatever its image
        // (JobSet's released agent, say): no token of the agent's account is at stake.
        let own = jobset(json!({"serviceAccountName": "mine",
            "initContainers": [sidecar(name, image)], "containers": [worker(json!({}))]}));
        let (refused, out) = admit(&own);
        assert!(!refused.contains(&at_image), "{image:?}: {refused:?}");
        assert_eq!(
            pod(&out)["initContainers"].as_array().map(Vec::len),
            Some(1)
        );
    }
    // As the webhook at 4567270 injected it (the look-alike mounting the token, the pod
    // running as the agent's account): denied at its image and at its mount of the token.
    let mut old = jobset(json!({
        "serviceAccountName": config().service_account,
        "automountServiceAccountToken": false,
        "volumes": [token_volume()],
        "initContainers": [sidecar("watchdog", Some("example.com/team-a/watchdog:1"))],
        "containers": [worker(json!({}))]}));
    old["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"][0]
        ["volumeMounts"] = json!([token_mount()]);
    let v = validate(&old, &config());
    let paths: Vec<&str> = v.violations.iter().map(|v| v.path.as_str()).collect();
    assert!(paths.contains(&at_image.as_str()), "{paths:?}");
    assert!(
        paths.contains(&format!("{C}.initContainers[0].volumeMounts[0]").as_str()),
        "{paths:?}"
    );
    // The agent's image, with any tag or digest or none: the agent, completed, with the
    // token mounted into it only.
    for image in [
        "ghcr.io/jobset-inplace/jobset-inplace",
        "ghcr.io/jobset-inplace/jobset-inplace:0.0.1",
        "ghcr.io/jobset-inplace/jobset-inplace@sha256:0f",
    ] {
        let js = jobset(json!({"initContainers": [sidecar("agent", Some(image))],
                               "containers": [worker(json!({}))]}));
        let (refused, out) = admit(&js);
        assert!(refused.is_empty(), "{image}: {refused:?}");
        let p = pod(&out);
        assert_eq!(p["initContainers"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            p["initContainers"][0]["volumeMounts"],
            json!([token_mount()])
        );
        assert!(p["containers"][0].get("volumeMounts").is_none(), "{image}");
    }
    // The webhook's own path, from the request's bytes: the same refusal.
    let js = jobset(json!({"initContainers": [sidecar("watchdog",
        Some("example.com/team-a/watchdog:1"))], "containers": [worker(json!({}))]}));
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "jobset.x-k8s.io", "version": "v1alpha2",
        "kind": "JobSet"}, "operation": "CREATE", "object": js}});
    let body = serde_json::to_vec(&review).expect("json");
    let reply = crate::admission::review(crate::admission::Endpoint::Mutate, &body, &config());
    let answer: Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["status"]["details"]["causes"][0]["field"],
        at_image
    );
}

/// Issue 46 item 2 (a): with `shareProcessNamespace`, the agent ran as the workers' user (a
/// pod-level `runAsUser`) and a worker read the agent's token through `/proc/<pid>/root`. A
/// pod that runs as the agent's account (chosen by the webhook, or named) may not share its
/// process namespace: refused by the injection, denied by validation (a template injected
/// before), naming the field. `false`, or an account of the pod's own, is let through.
#[test]
fn a_pod_that_runs_as_the_agent_shares_no_process_namespace() {
    let sa = config().service_account;
    let shared = |account: &Value, value: Value| {
        let mut spec = json!({"shareProcessNamespace": value,
            "securityContext": {"runAsUser": 1000}, "containers": [worker(json!({}))]});
        if let (Some(s), Some(a)) = (spec.as_object_mut(), account.as_object()) {
            s.extend(a.clone());
        }
        jobset(spec)
    };
    let at = format!("{C}.shareProcessNamespace");
    for account in [
        json!({}),
        json!({"serviceAccountName": sa}),
        json!({"serviceAccount": sa}),
    ] {
        let m = mutate(&shared(&account, json!(true)), &config());
        assert!(m.patch.0.is_empty(), "{account}");
        assert_eq!(refused(&m), vec![at.clone()], "{account}");
        assert!(m.violations[0].message.contains("/proc/"), "{m:?}");
        assert!(
            admit(&shared(&account, json!(false))).0.is_empty(),
            "{account}"
        );
    }
    // Injected before this rule, then shared: validation denies it.
    let (refused, mut injected) = admit(&jobset(json!({
        "securityContext": {"runAsUser": 1000}, "containers": [worker(json!({}))]})));
    assert!(refused.is_empty(), "{refused:?}");
    injected["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["shareProcessNamespace"] =
        json!(true);
    let v = validate(&injected, &config());
    assert_eq!(
        v.violations
            .iter()
            .map(|v| v.path.as_str())
            .collect::<Vec<_>>(),
        vec![at.as_str()]
    );
    // An account of the pod's own: the agent holds that account's token, which the pod's
    // containers hold anyway.
    assert!(
        admit(&shared(&json!({"serviceAccountName": "mine"}), json!(true)))
            .0
            .is_empty()
    );
}
