//! The reconciler's provisioning and pod-status writes, held by policies (issue 21)

use super::*;

/// A policy variable's value, evaluated alone (one that needs no request).
fn policy_variable(policy: &Value, name: &str) -> cel::Value {
    let expression = policy["spec"]["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == name)
        .and_then(|v| v["expression"].as_str())
        .unwrap_or_else(|| panic!("no variable {name}"));
    cel_eval(expression, &[], &HashMap::new()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn cel_strings(value: &cel::Value) -> BTreeSet<String> {
    match value {
        cel::Value::List(items) => items
            .iter()
            .map(|v| match v {
                cel::Value::String(s) => s.to_string(),
                other => panic!("not a string: {other:?}"),
            })
            .collect(),
        other => panic!("not a list: {other:?}"),
    }
}

/// RFC 7386 JSON merge patch (what a `Patch::Merge` does to the stored object).
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("an object");
    for (key, value) in fields {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Issue 21, item 1: RBAC lets the reconciler create any RoleBinding and bind the agent role, so
/// its token could bind that role to any subject in any namespace (`patch pods` with no policy
/// holding the subject), delete any RoleBinding and patch any ServiceAccount. The two
/// provisioning policies, evaluated with CEL on what provisioning writes (allowed) and on the
/// attack's objects (refused), in every overlay; the protected namespaces are the code's.
#[test]
fn the_reconcilers_provisioning_is_held_to_the_agents_binding_and_account() {
    use jobset_inplace::reconciler::provision::{self, ProvisionSettings};
    let settings = ProvisionSettings::default();
    let agent = settings.service_account.clone();
    assert_eq!(agent, settings.cluster_role);
    assert_eq!(agent, provision::ROLE_BINDING);
    let mut protected: BTreeSet<String> = provision::SYSTEM_NAMESPACES
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    protected.insert(settings.own_namespace.clone());
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let binds = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-binds-agent",
        );
        let accounts = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-agent-accounts",
        );
        for policy in [binds, accounts] {
            let policy_name = policy["metadata"]["name"].as_str().expect("name");
            assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
            assert_eq!(policy["spec"]["failurePolicy"], "Fail");
            let binding = r.get("ValidatingAdmissionPolicyBinding", policy_name);
            assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
            assert_eq!(binding["spec"]["policyName"], policy_name);
            // One list of protected namespaces: the code's.
            assert_eq!(
                cel_strings(&policy_variable(policy, "protectedNamespaces")),
                protected,
                "{name}: {policy_name}"
            );
            assert_eq!(
                policy_variable(policy, "agent"),
                cel::Value::String(agent.clone().into())
            );
        }
        for op in ["CREATE", "UPDATE", "DELETE"] {
            assert!(policy_matches(
                binds,
                "rbac.authorization.k8s.io",
                "rolebindings",
                op
            ));
        }
        for op in ["CREATE", "UPDATE"] {
            assert!(policy_matches(accounts, "", "serviceaccounts", op));
        }

        // RoleBindings.
        let verdict = |op: &str, ns: &str, object: &Value, old: &Value| {
            let target = if op == "DELETE" { old } else { object };
            let name = target["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            evaluate_matched(
                binds,
                &object_request(RECONCILER_USER, op, ns, &name),
                object,
                old,
            )
        };
        let provisioned =
            |ns: &str| provision::role_binding(ns, &BTreeSet::from([agent.clone()]), &settings);
        let mut defaulted = provisioned("team-a");
        defaulted["subjects"][0]["apiGroup"] = json!("");
        for (what, object) in [
            ("as provisioning applies it", provisioned("team-a")),
            ("as the API server stores it", defaulted.clone()),
        ] {
            assert_eq!(
                verdict("CREATE", "team-a", &object, &Value::Null),
                PolicyResult::Allowed,
                "{name}: {what}"
            );
            assert_eq!(
                verdict("UPDATE", "team-a", &object, &defaulted),
                PolicyResult::Allowed,
                "{name}: {what}, again"
            );
        }
        assert_eq!(
            verdict("DELETE", "team-a", &Value::Null, &defaulted),
            PolicyResult::Allowed,
            "{name}: a binding no JobSet needs removed"
        );
        let with = |ns: &str, f: &dyn Fn(&mut Value)| {
            let mut b = provisioned(ns);
            f(&mut b);
            b
        };
        let subject = |kind: &str, name: &str, ns: &str| json!([{"kind": kind, "name": name, "namespace": ns}]);
        let refused: Vec<(&str, &str, Value)> = vec![
            (
                "the reconciler's own account bound in kube-system",
                "kube-system",
                with("kube-system", &|b| {
                    b["subjects"] =
                        subject("ServiceAccount", "jobset-inplace-reconciler", NAMESPACE)
                }),
            ),
            (
                "the reconciler's own account bound in a workload namespace",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] =
                        subject("ServiceAccount", "jobset-inplace-reconciler", NAMESPACE)
                }),
            ),
            (
                "the namespace's default account",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = subject("ServiceAccount", "default", "team-a")
                }),
            ),
            (
                "another namespace's agent account",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = subject("ServiceAccount", &agent, "team-b")
                }),
            ),
            (
                "a subject without a namespace",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = json!([{"kind": "ServiceAccount", "name": agent}])
                }),
            ),
            (
                "a user named as the agent",
                "team-a",
                with(
                    "team-a",
                    &|b| b["subjects"] = json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("system:serviceaccount:team-a:{agent}")}]),
                ),
            ),
            (
                "a group",
                "team-a",
                with(
                    "team-a",
                    &|b| b["subjects"] = json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts"}]),
                ),
            ),
            (
                "a second subject",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = json!([{"kind": "ServiceAccount", "name": agent, "namespace": "team-a"},
                                           {"kind": "ServiceAccount", "name": "default", "namespace": "team-a"}])
                }),
            ),
            (
                "no subject",
                "team-a",
                with("team-a", &|b| {
                    b.as_object_mut().map(|o| o.remove("subjects"));
                }),
            ),
            (
                "another name",
                "team-a",
                with("team-a", &|b| b["metadata"]["name"] = json!("other")),
            ),
            (
                "another ClusterRole",
                "team-a",
                with("team-a", &|b| b["roleRef"]["name"] = json!("admin")),
            ),
            (
                "a Role of the agent's name",
                "team-a",
                with("team-a", &|b| b["roleRef"]["kind"] = json!("Role")),
            ),
        ];
        let mut refused = refused;
        for ns in &protected {
            refused.push((
                "the provisioning shape in a protected namespace",
                ns.as_str(),
                provisioned(ns),
            ));
        }
        for (what, ns, object) in &refused {
            for (op, old) in [("CREATE", Value::Null), ("UPDATE", object.clone())] {
                assert!(
                    matches!(verdict(op, ns, object, &old), PolicyResult::Denied(_)),
                    "{name}: {op} {what} ({ns})"
                );
            }
        }
        let mut other = defaulted.clone();
        other["metadata"]["name"] = json!("team-a-admins");
        assert!(
            matches!(
                verdict("DELETE", "team-a", &Value::Null, &other),
                PolicyResult::Denied(_)
            ),
            "{name}: deleting an unrelated RoleBinding"
        );

        // ServiceAccounts.
        let sa_verdict = |op: &str, ns: &str, object: &Value, old: &Value| {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            evaluate_matched(
                accounts,
                &object_request(RECONCILER_USER, op, ns, &name),
                object,
                old,
            )
        };
        let sa = provision::service_account("team-a", &settings);
        assert_eq!(
            sa_verdict("CREATE", "team-a", &sa, &Value::Null),
            PolicyResult::Allowed,
            "{name}"
        );
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &sa, &sa),
            PolicyResult::Allowed,
            "{name}"
        );
        // Issue 34: the provisioned account does not automount its token, and an account
        // provisioned before (without the field) is turned off by the next apply.
        assert_eq!(sa["automountServiceAccountToken"], false, "{name}");
        let mut before = sa.clone();
        before
            .as_object_mut()
            .expect("object")
            .remove("automountServiceAccountToken");
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &sa, &before),
            PolicyResult::Allowed,
            "{name}: turning automounting off"
        );
        // What others set on the account stays, and does not stop the reconciler's apply.
        let mut kept = sa.clone();
        kept["imagePullSecrets"] = json!([{"name": "registry"}]);
        kept["automountServiceAccountToken"] = json!(false);
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &kept, &kept),
            PolicyResult::Allowed,
            "{name}"
        );
        let mut others_true = sa.clone();
        others_true["automountServiceAccountToken"] = json!(true);
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &sa, &others_true),
            PolicyResult::Allowed,
            "{name}: turning another's true off"
        );
        let sa_with = |ns: &str, f: &dyn Fn(&mut Value)| {
            let mut s = provision::service_account(ns, &settings);
            f(&mut s);
            s
        };
        let mut refused_accounts: Vec<(&str, &str, Value, Value)> = vec![
            (
                "another account",
                "team-a",
                sa_with("team-a", &|s| s["metadata"]["name"] = json!("default")),
                Value::Null,
            ),
            (
                "pull secrets added",
                "team-a",
                sa_with("team-a", &|s| {
                    s["imagePullSecrets"] = json!([{"name": "x"}])
                }),
                sa.clone(),
            ),
            (
                "secrets added",
                "team-a",
                sa_with("team-a", &|s| s["secrets"] = json!([{"name": "x"}])),
                sa.clone(),
            ),
            (
                "token automount set",
                "team-a",
                sa_with("team-a", &|s| {
                    s["automountServiceAccountToken"] = json!(true)
                }),
                kept.clone(),
            ),
            (
                "created with token automounting",
                "team-a",
                sa_with("team-a", &|s| {
                    s["automountServiceAccountToken"] = json!(true)
                }),
                Value::Null,
            ),
            (
                "token automount turned on",
                "team-a",
                sa_with("team-a", &|s| {
                    s["automountServiceAccountToken"] = json!(true)
                }),
                before.clone(),
            ),
            (
                "created with pull secrets",
                "team-a",
                sa_with("team-a", &|s| {
                    s["imagePullSecrets"] = json!([{"name": "x"}])
                }),
                Value::Null,
            ),
        ];
        for ns in &protected {
            refused_accounts.push((
                "in a protected namespace",
                ns.as_str(),
                provision::service_account(ns, &settings),
                Value::Null,
            ));
        }
        for (what, ns, object, old) in &refused_accounts {
            let op = if old.is_null() { "CREATE" } else { "UPDATE" };
            assert!(
                matches!(sa_verdict(op, ns, object, old), PolicyResult::Denied(_)),
                "{name}: {op} {what} ({ns})"
            );
        }

        // Only the reconciler's account is held.
        for user in [
            "system:serviceaccount:team-a:jobset-inplace-reconciler",
            "system:serviceaccount:kube-system:clusterrole-aggregation-controller",
            "alice",
        ] {
            let object = &refused[0].2;
            assert_eq!(
                evaluate_matched(
                    binds,
                    &object_request(user, "CREATE", "kube-system", &agent),
                    object,
                    &Value::Null
                ),
                PolicyResult::NotMatched,
                "{name}: {user}"
            );
        }
    }
}

/// Issue 21, item 9: the reconciler's pod status write marks a pod of a JobSet `Failed` with a
/// reason and a message (the deadline's merge patch), and changes nothing else of the pod in the
/// same write (conditions, IPs, container statuses, labels, ...), and not on a pod that has
/// already ended. Every PodStatus field of the Kubernetes version the manifests are checked
/// against is either one of those three or held unchanged by the policy.
#[test]
fn the_reconcilers_pod_status_write_only_marks_a_pod_failed() {
    use k8s_openapi::api::core::v1::PodStatus;
    // Every field of PodStatus, filled; the destructuring below has no `..`, so a new field in the
    // typed version fails to compile here.
    let every: Value = json!({
        "allocatedResources": {"cpu": "1"},
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "w", "image": "w", "imageID": "", "ready": true, "restartCount": 0}],
        "ephemeralContainerStatuses": [{"name": "e", "image": "e", "imageID": "", "ready": false, "restartCount": 0}],
        "extendedResourceClaimStatus": {"resourceClaimName": "c", "requestMappings": []},
        "hostIP": "10.0.0.1",
        "hostIPs": [{"ip": "10.0.0.1"}],
        "initContainerStatuses": [{"name": "i", "image": "i", "imageID": "", "ready": false, "restartCount": 0}],
        "message": "m",
        "nominatedNodeName": "n",
        "observedGeneration": 1,
        "phase": "Running",
        "podIP": "10.1.0.1",
        "podIPs": [{"ip": "10.1.0.1"}],
        "qosClass": "BestEffort",
        "reason": "r",
        "resize": "Proposed",
        "resourceClaimStatuses": [{"name": "c"}],
        "resources": {"limits": {"cpu": "1"}},
        "startTime": "2026-01-01T00:00:00Z"
    });
    let typed: PodStatus = serde_json::from_value(every.clone()).expect("a PodStatus");
    let PodStatus {
        allocated_resources,
        conditions,
        container_statuses,
        ephemeral_container_statuses,
        extended_resource_claim_status,
        host_ip,
        host_ips,
        init_container_statuses,
        message,
        nominated_node_name,
        observed_generation,
        phase,
        pod_ip,
        pod_ips,
        qos_class,
        reason,
        resize,
        resource_claim_statuses,
        resources,
        start_time,
    } = typed;
    assert!(
        allocated_resources.is_some()
            && conditions.is_some()
            && container_statuses.is_some()
            && ephemeral_container_statuses.is_some()
            && extended_resource_claim_status.is_some()
            && host_ip.is_some()
            && host_ips.is_some()
            && init_container_statuses.is_some()
            && message.is_some()
            && nominated_node_name.is_some()
            && observed_generation.is_some()
            && phase.is_some()
            && pod_ip.is_some()
            && pod_ips.is_some()
            && qos_class.is_some()
            && reason.is_some()
            && resize.is_some()
            && resource_claim_statuses.is_some()
            && resources.is_some()
            && start_time.is_some(),
        "every field named as the API names it"
    );
    let written = ["phase", "reason", "message"];
    let held: BTreeSet<String> = every
        .as_object()
        .expect("fields")
        .keys()
        .filter(|k| !written.contains(&k.as_str()))
        .cloned()
        .collect();

    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let policy = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-fails-pods",
        );
        // The fields the policy compares are exactly those it does not let the reconciler write.
        let compared: BTreeSet<String> = policy["spec"]["validations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["expression"].as_str())
            .flat_map(|e| {
                e.split("has(object.status.")
                    .skip(1)
                    .filter_map(|rest| rest.split(')').next())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|f| f != "phase")
            .collect();
        assert_eq!(compared, held, "{name}");

        // A pod of a JobSet, running on a node, as the kubelet reports it.
        let running = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "js-w-0-1", "namespace": "team-a", "uid": "u-1",
                         "labels": {JOBSET_NAME_LABEL: "js", "batch.kubernetes.io/job-name": "js-w-0"},
                         "annotations": {JOBSET_NAME_LABEL: "js", "jobset.sigs.k8s.io/epoch": "1"},
                         "finalizers": ["batch.kubernetes.io/job-tracking"]},
            "spec": {"nodeName": "n1", "containers": [{"name": "w", "image": "w"}]},
            "status": {"phase": "Running", "observedGeneration": 1, "qosClass": "BestEffort",
                       "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                       "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
                       "podIP": "10.1.0.1", "podIPs": [{"ip": "10.1.0.1"}],
                       "startTime": "2026-01-01T00:00:00Z",
                       "containerStatuses": [{"name": "w", "image": "w", "imageID": "", "ready": true, "restartCount": 2,
                                              "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]}
        });
        // What the deadline's first step sends (src/reconciler/controller/deadline.rs,
        // fail_and_delete): a merge patch of pods/status with the pod's UID as a precondition.
        let deadline = json!({"metadata": {"uid": "u-1"},
            "status": {"phase": "Failed", "reason": "GroupRestartTimedOut",
                       "message": "the group restart to epoch 2 did not complete within 20s"}});
        let request = json!({"operation": "UPDATE", "namespace": "team-a", "name": "js-w-0-1",
                             "subResource": "status", "userInfo": {"username": RECONCILER_USER}});
        let patched = |old: &Value, patch: &Value| {
            let mut new = old.clone();
            merge_patch(&mut new, patch);
            new
        };
        assert_eq!(
            evaluate_matched(policy, &request, &patched(&running, &deadline), &running),
            PolicyResult::Allowed,
            "{name}: the deadline's write"
        );
        let pending = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "js-w-0-1", "namespace": "team-a", "labels": {JOBSET_NAME_LABEL: "js"}},
            "status": {"phase": "Pending", "qosClass": "BestEffort"}});
        assert_eq!(
            evaluate_matched(policy, &request, &patched(&pending, &deadline), &pending),
            PolicyResult::Allowed,
            "{name}: the deadline's write on a pod never scheduled"
        );
        // The same write with one more change each.
        let mut extra: Vec<(String, Value)> = vec![
            (
                "a condition changed".into(),
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}}),
            ),
            (
                "a condition added".into(),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}, {"type": "DisruptionTarget", "status": "True"}]}}),
            ),
            (
                "the conditions removed".into(),
                json!({"status": {"conditions": null}}),
            ),
            (
                "the pod IP".into(),
                json!({"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}}),
            ),
            (
                "the pod IPs".into(),
                json!({"status": {"podIPs": [{"ip": "10.1.0.1"}, {"ip": "fd00::1"}]}}),
            ),
            (
                "the host IP".into(),
                json!({"status": {"hostIP": "10.0.0.9"}}),
            ),
            ("the host IPs".into(), json!({"status": {"hostIPs": null}})),
            (
                "a restart count".into(),
                json!({"status": {"containerStatuses": [{"name": "w", "image": "w", "imageID": "", "ready": true, "restartCount": 0}]}}),
            ),
            (
                "the start time".into(),
                json!({"status": {"startTime": null}}),
            ),
            (
                "the QoS class".into(),
                json!({"status": {"qosClass": "Guaranteed"}}),
            ),
            (
                "the observed generation".into(),
                json!({"status": {"observedGeneration": 7}}),
            ),
            (
                "a label".into(),
                json!({"metadata": {"labels": {"app": "x"}}}),
            ),
            (
                "the jobset-name label removed".into(),
                json!({"metadata": {"labels": {JOBSET_NAME_LABEL: null}}}),
            ),
            (
                "an annotation".into(),
                json!({"metadata": {"annotations": {"jobset.sigs.k8s.io/epoch": "9"}}}),
            ),
            (
                "the finalizer removed".into(),
                json!({"metadata": {"finalizers": null}}),
            ),
        ];
        // Each held field, set where the pod has none.
        for field in &held {
            if running["status"].get(field).is_none() {
                extra.push((
                    format!("{field} set"),
                    json!({"status": {field: every[field]}}),
                ));
            }
        }
        for (what, more) in &extra {
            // Both patches in one (a null, removing a field, is kept as such).
            let mut patch = deadline.clone();
            for (part, fields) in more.as_object().expect("parts") {
                for (field, value) in fields.as_object().expect("fields") {
                    patch[part][field] = value.clone();
                }
            }
            let new = patched(&running, &patch);
            assert!(
                matches!(
                    evaluate_matched(policy, &request, &new, &running),
                    PolicyResult::Denied(_)
                ),
                "{name}: Failed and {what}"
            );
        }
        // A pod that has already ended keeps the kubelet's account of it.
        for phase in ["Failed", "Succeeded"] {
            let mut ended = running.clone();
            ended["status"]["phase"] = json!(phase);
            ended["status"]["reason"] = json!("Error");
            match evaluate_matched(policy, &request, &patched(&ended, &deadline), &ended) {
                PolicyResult::Denied(m) => assert!(m.contains("already ended"), "{name}: {m}"),
                other => panic!("{name}: a {phase} pod marked again: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn the_self_signed_webhooks_rbac_grants_what_it_uses() {
    use jobset_inplace::certs::rotation::Policy;
    use jobset_inplace_testkit::apiserver::TestApiServer;
    let Some(r) = overlay("cert-manager") else {
        return;
    };
    let grants = grants_besides_metrics(&r, "jobset-inplace-webhook");
    assert!(
        grants.cluster.is_empty() && grants.namespaced.is_empty(),
        "cert-manager: no API access but the metrics reviews"
    );
    for name in SELF_SIGNED {
        let Some(r) = overlay(name) else { return };
        let Sub::Webhook(args) =
            parse_args(r.container("jobset-inplace-webhook", "webhook")).command
        else {
            panic!("webhook")
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let server = TestApiServer::start().await;
        let dirs = [
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        ];
        let seen = tokio::time::timeout(Duration::from_secs(60), async {
            for (kind, resource) in [
                (
                    "MutatingWebhookConfiguration",
                    "mutatingwebhookconfigurations",
                ),
                (
                    "ValidatingWebhookConfiguration",
                    "validatingwebhookconfigurations",
                ),
            ] {
                server
                    .create(resource, r.get(kind, &args.webhook_config).clone())
                    .expect("configuration");
            }
            // The overlay's flags, with lifetimes of seconds so that a renewal and a whole CA
            // rotation happen here (each an update of the Secret).
            let replicas = dirs.each_ref().map(|dir| {
                let mut replica = args.clone();
                replica.cert_dir = dir.path().to_owned();
                replica.cert_renew_interval = Duration::from_millis(100);
                replica.serving_cert_validity = Duration::from_secs(2);
                replica.ca_validity = Duration::from_secs(6);
                replica.ca_overlap = Duration::from_millis(500);
                replica.renewer(server.client()).expect("lifetimes fit")
            });
            assert_eq!(
                replicas[0].target().names,
                jobset_inplace::certs::service_names(&args.service, NAMESPACE)
            );
            let mut kinds = BTreeSet::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !kinds.contains("drop") {
                assert!(
                    Instant::now() < deadline,
                    "a whole rotation in time: {kinds:?}"
                );
                for replica in &replicas {
                    for step in replica.step().await.expect("step").steps {
                        kinds.insert(step.kind());
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                kinds,
                BTreeSet::from(["new", "renew", "start", "switch", "drop"]),
                "{name}"
            );
            assert_eq!(Policy::DEFAULT, args.policy().expect("deployed lifetimes"));
            for resource in [
                "mutatingwebhookconfigurations",
                "validatingwebhookconfigurations",
            ] {
                let config = server
                    .get(resource, "", &args.webhook_config)
                    .expect("configuration");
                assert!(
                    config["webhooks"][0]["clientConfig"]["caBundle"].is_string(),
                    "{resource}: caBundle"
                );
            }
            // The Secret it created passes the Secret policy, as created and as renewed.
            let stored = server
                .get("secrets", NAMESPACE, &args.secret)
                .expect("its Secret");
            let policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-webhook-secret");
            for (op, old) in [("CREATE", Value::Null), ("UPDATE", stored.clone())] {
                let request = object_request(WEBHOOK_USER, op, NAMESPACE, &args.secret);
                assert_eq!(
                    evaluate_matched(policy, &request, &stored, &old),
                    PolicyResult::Allowed,
                    "{name}: {op} of its Secret"
                );
            }
            observed(&server)
        })
        .await
        .expect("in time");
        let named = BTreeMap::from([
            ("secrets", args.secret.as_str()),
            (
                "mutatingwebhookconfigurations",
                args.webhook_config.as_str(),
            ),
            (
                "validatingwebhookconfigurations",
                args.webhook_config.as_str(),
            ),
        ]);
        // The metrics reviews aside (never requested here: tests/real_cluster/metrics.rs).
        let grants = grants_besides_metrics(&r, "jobset-inplace-webhook");
        assert!(
            grants
                .cluster
                .iter()
                .all(|rule| !strings(&rule["resources"]).contains(&"secrets".to_owned()))
        );
        let unused = check_grants(name, &grants, &seen, &named, &["secrets"]);
        assert_eq!(
            unused,
            BTreeSet::new(),
            "{name}: every grant of the self-signed webhook is used"
        );
        server.shutdown().await;
    }
}
