//! The agent's ValidatingAdmissionPolicy

use super::*;
use jobset_inplace_testkit::build;

/// Evaluates a ValidatingAdmissionPolicy on one request as the API server would: the match
/// constraints, then every match condition, the variables in order, and every validation.
/// An expression that errors fails the test (these must be total on any pod).
fn evaluate_policy(policy: &Value, request: &Value, object: &Value, old: &Value) -> PolicyResult {
    let spec = &policy["spec"];
    let resource = match request["subResource"].as_str() {
        Some(sub) if !sub.is_empty() => format!("pods/{sub}"),
        _ => "pods".to_owned(),
    };
    let matched = spec["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            strings(&rule["apiGroups"]).contains(&String::new())
                && strings(&rule["apiVersions"]).contains(&"v1".to_owned())
                && strings(&rule["operations"])
                    .iter()
                    .any(|o| request["operation"] == o.as_str())
                && strings(&rule["resources"])
                    .iter()
                    .any(|r| *r == resource || (r == "pods/*" && resource.starts_with("pods/")))
        });
    if !matched {
        return PolicyResult::NotMatched;
    }
    evaluate_matched(policy, request, object, old)
}

const AGENT: &str = "system:serviceaccount:team-a:jobset-inplace-agent";

fn update_request(user: &str, token_pod: Option<&str>, sub_resource: &str) -> Value {
    let mut user_info =
        json!({"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]});
    if let Some(pod) = token_pod {
        user_info["extra"] = json!({"authentication.kubernetes.io/pod-name": [pod],
                                    "authentication.kubernetes.io/pod-uid": ["u-1"]});
    }
    json!({"operation": "UPDATE", "namespace": "team-a", "name": "js-0",
           "resource": {"group": "", "version": "v1", "resource": "pods"},
           "subResource": sub_resource, "userInfo": user_info})
}

/// The agent policy's verdicts on the requests agents and others send.
fn check_agent_policy(what: &str, policy: &Value, dialect: Dialect) {
    let key = dialect.pod_annotation();
    let other_key = Dialect::ALL
        .into_iter()
        .find(|d| *d != dialect)
        .map(Dialect::pod_annotation)
        .expect("two dialects");
    let own = update_request(AGENT, Some("js-0"), "");
    let verdict =
        |request: &Value, old: &Value, new: &Value| evaluate_policy(policy, request, new, old);
    let edit = |old: &Value, f: &dyn Fn(&mut Value)| {
        let mut new = old.clone();
        f(&mut new);
        new
    };
    let at = |e: Option<&str>| {
        let pod = build::Pod::new("js-0")
            .namespace("team-a")
            .uid("u-1")
            .resource_version("7")
            .of_jobset("js")
            .label(build::JOB_NAME_LABEL, "js-w-0")
            .annotation("jobset-inplace.dev/injected", "0.1.0")
            .owned_by_job("js-w-0", "j-1")
            .service_account("jobset-inplace-agent")
            .container("w", "trainer:1")
            .phase("Running");
        match e {
            Some(e) => pod.epoch(key, e).build(),
            None => pod.build(),
        }
    };

    // Allowed: the agent writes its own pod's epoch annotation.
    let mut bare = at(None);
    bare["metadata"]
        .as_object_mut()
        .map(|m| m.remove("annotations"));
    let cases_allowed = [
        (
            "first registration, pod without annotations",
            bare.clone(),
            edit(&bare, &|p| p["metadata"]["annotations"] = json!({key: "1"})),
        ),
        ("first registration", at(None), at(Some("1"))),
        ("next epoch", at(Some("1")), at(Some("2"))),
        (
            "the same epoch again (a retried patch)",
            at(Some("2")),
            at(Some("2")),
        ),
        ("a malformed epoch replaced", at(Some("x")), at(Some("3"))),
        (
            "the largest int32 epoch",
            at(Some("2147483646")),
            at(Some("2147483647")),
        ),
        (
            "an out-of-range epoch replaced",
            at(Some("9999999999")),
            at(Some("1")),
        ),
        (
            "resourceVersion and managedFields move with any update",
            at(Some("1")),
            edit(&at(Some("2")), &|p| {
                p["metadata"]["resourceVersion"] = json!("8");
                p["metadata"]["managedFields"] = json!([{"manager": "agent"}]);
            }),
        ),
    ];
    for (case, old, new) in &cases_allowed {
        assert_eq!(
            verdict(&own, old, new),
            PolicyResult::Allowed,
            "{what}: {case}"
        );
    }

    // Denied: anything else the agent's account might try.
    // Each denial comes from the validation meant for it (its message says which).
    let denied = |case: &str, because: &str, request: &Value, old: &Value, new: &Value| {
        let v = verdict(request, old, new);
        assert!(
            matches!(&v, PolicyResult::Denied(m) if m.contains(because)),
            "{what}: {case}: {v:?}, expected a denial for {because:?}"
        );
    };
    denied(
        "another pod's epoch",
        "only update the pod its token",
        &update_request(AGENT, Some("js-1"), ""),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "a token bound to no pod",
        "only update the pod its token",
        &update_request(AGENT, None, ""),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "the agent of another namespace",
        "only update the pod its token",
        &update_request(
            "system:serviceaccount:team-b:jobset-inplace-agent",
            Some("js-0"),
            "",
        ),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "pods/status",
        "subresources",
        &update_request(AGENT, Some("js-0"), "status"),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "pods/status, status only",
        "subresources",
        &update_request(AGENT, Some("js-0"), "status"),
        &at(Some("1")),
        &edit(&at(Some("1")), &|p| p["status"]["phase"] = json!("Failed")),
    );
    denied(
        "pods/ephemeralcontainers",
        "subresources",
        &update_request(AGENT, Some("js-0"), "ephemeralcontainers"),
        &at(Some("1")),
        &edit(&at(Some("1")), &|p| {
            p["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox"}])
        }),
    );
    denied(
        "another annotation added",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["annotations"]["x"] = json!("y")
        }),
    );
    denied(
        "another annotation changed",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["annotations"][JOBSET_NAME_LABEL] = json!("other")
        }),
    );
    denied(
        "another annotation removed",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["annotations"]
                .as_object_mut()
                .map(|a| a.remove(JOBSET_NAME_LABEL));
        }),
    );
    denied(
        "the other dialect's annotation",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("1")), &|p| {
            p["metadata"]["annotations"][other_key] = json!("5")
        }),
    );
    denied(
        "a label changed",
        "labels",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["labels"]["team"] = json!("x")
        }),
    );
    denied(
        "labels removed",
        "labels",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }),
    );
    denied(
        "the spec changed",
        "spec",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["spec"]["containers"][0]["image"] = json!("evil:1")
        }),
    );
    denied(
        "a finalizer added",
        "finalizers or owner",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["finalizers"] = json!(["x/y"])
        }),
    );
    denied(
        "owner references dropped",
        "finalizers or owner",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]
                .as_object_mut()
                .map(|m| m.remove("ownerReferences"));
        }),
    );
    denied(
        "the epoch removed",
        "never decreases",
        &own,
        &at(Some("1")),
        &at(None),
    );
    denied(
        "the epoch decreased",
        "never decreases",
        &own,
        &at(Some("3")),
        &at(Some("2")),
    );
    // The agent and reconciler read int32; a larger value would be retried forever.
    for bad in [
        "",
        "-1",
        "+1",
        "1.0",
        "one",
        " 1",
        "12345678901",
        "2147483648",
        "9999999999",
    ] {
        denied(
            &format!("epoch {bad:?}"),
            "never decreases",
            &own,
            &at(Some("1")),
            &at(Some(bad)),
        );
    }

    // Not the policy's business: other users, other operations.
    for user in [
        "system:serviceaccount:team-a:default",
        "system:serviceaccount:team-a:jobset-inplace-agent-2",
        "system:serviceaccount:team-a:my-jobset-inplace-agent",
        "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler",
        "alice",
        "jobset-inplace-agent",
    ] {
        let request = update_request(user, Some("js-0"), "");
        let anything = edit(&at(Some("1")), &|p| {
            p["spec"]["containers"][0]["image"] = json!("x")
        });
        assert_eq!(
            verdict(&request, &at(Some("1")), &anything),
            PolicyResult::NotMatched,
            "{what}: {user}"
        );
    }
    for operation in ["CREATE", "DELETE", "CONNECT"] {
        let mut request = own.clone();
        request["operation"] = json!(operation);
        assert_eq!(
            verdict(&request, &at(Some("1")), &at(Some("1"))),
            PolicyResult::NotMatched,
            "{what}: {operation}"
        );
    }
}

#[test]
fn the_agent_policy_allows_only_the_agents_own_epoch_annotation() {
    use jobset_inplace::admission::config::DEFAULT_SERVICE_ACCOUNT;
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-agent");
        let binding = r.get("ValidatingAdmissionPolicyBinding", "jobset-inplace-agent");
        assert_eq!(binding["spec"]["policyName"], "jobset-inplace-agent");
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let dialect = overlay_dialect(name);
        assert_eq!(
            policy["spec"]["variables"][0],
            json!({"name": "epochAnnotation", "expression": format!("'{}'", dialect.pod_annotation())}),
            "{name}"
        );
        // The account it restricts is the one the webhook injects.
        let condition = policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap_or_default();
        assert!(
            condition.contains(&format!(":{DEFAULT_SERVICE_ACCOUNT}$")),
            "{condition}"
        );
        check_agent_policy(name, policy, dialect);
    }
}

/// The policy file as written, for both dialects, without kubectl.
#[test]
fn the_agent_policy_file_evaluates_for_both_dialects() {
    let text = std::fs::read_to_string(deploy_dir().join("base/agent-policy.yaml")).expect("read");
    let policy = serde_saphyr::from_multiple::<Value>(&text)
        .expect("yaml")
        .into_iter()
        .find(|v| v["kind"] == "ValidatingAdmissionPolicy")
        .expect("policy");
    for dialect in Dialect::ALL {
        let mut policy = policy.clone();
        policy["spec"]["variables"][0]["expression"] =
            json!(format!("'{}'", dialect.pod_annotation()));
        check_agent_policy(dialect.as_str(), &policy, dialect);
    }
}

#[test]
fn the_agent_role_is_what_the_agent_needs() {
    use jobset_inplace::reconciler::provision::ProvisionSettings;
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let settings = ProvisionSettings::default();
        let role = r.get("ClusterRole", &settings.cluster_role);
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": ["jobset-inplace.dev"], "resources": ["jobsetepochs"], "verbs": ["watch"]},
                {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
            ]),
            "{name}"
        );
        // The reconciler may bind it without holding it.
        let reconciler = r.get("ClusterRole", "jobset-inplace-reconciler");
        assert!(
            reconciler["rules"].as_array().into_iter().flatten().any(|rule| rule
                == &json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                           "resourceNames": [settings.cluster_role], "verbs": ["bind"]})),
            "{name}: bind on the agent role"
        );
    }
}
