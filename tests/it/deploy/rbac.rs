//! RBAC: every request the components make is granted, and nothing they never ask for

use super::*;
use jobset_inplace_testkit::build::{JobSet, ReplicatedJob};

/// Polls `f` every 10 ms for up to 30 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_reconcilers_rbac_grants_every_request_it_makes_and_no_more() {
    use jobset_inplace::reconciler::provision::{self, ProvisionSettings};
    use jobset_inplace::reconciler::{self, LeaderElection, Options, Settings, crd};
    use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
    // The attempt dialect runs on the released CRD, so the start-up CRD check runs too.
    let Some(r) = overlay("jobset-native") else {
        return;
    };
    let Sub::Reconciler(args) =
        parse_args(r.container("jobset-inplace-reconciler", "reconciler")).command
    else {
        panic!("reconciler")
    };
    let dialect = Dialect::Attempt;
    let server = TestApiServer::start().await;
    let seen = tokio::time::timeout(Duration::from_secs(60), async {
        let crd_object = fixtures::read_yaml(&fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
        server.create("customresourcedefinitions", crd_object).expect("crd");
        let epochs_crd = fixtures::read_yaml(&deploy_dir().join("base/jobsetepoch-crd.yaml"));
        server.create("customresourcedefinitions", epochs_crd).expect("crd");
        server
            .create("namespaces", json!({"metadata": {"name": "team-b", "labels": {"jobset-inplace.dev/enabled": "true"}}}))
            .expect("namespace");
        // The agents' FlowSchema as the chart creates it (no rules: the reconciler applies them).
        server
            .create("flowschemas", r.get("FlowSchema", "jobset-inplace-agents").clone())
            .expect("the agents' FlowSchema");
        // The deadline's steps run within seconds: the JobSet's annotation sets a 1 s timeout.
        let js = JobSet::new("js")
            .namespace("team-a")
            .max_restarts(2)
            .replicated_jobs([
                ReplicatedJob::new("w"),
                ReplicatedJob::new("t").pod_spec("serviceAccountName", json!("trainer")),
            ])
            .annotation(jobset_inplace::deadline::TIMEOUT_ANNOTATION, "1s")
            .build();
        let js = server.create("jobsets", js).expect("jobset");
        // A Job of the JobSet, for a recreation to delete.
        server
            .create("jobs", json!({"metadata": {"name": "js-w-0", "namespace": "team-a",
                "labels": {JOBSET_NAME_LABEL: "js", jobset_inplace::deadline::RESTART_ATTEMPT_LABEL: "0"},
                "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js",
                                     "uid": js["metadata"]["uid"], "controller": true}]},
                "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}}))
            .expect("job");
        for i in 0..2 {
            server
                .create("pods", jobset_inplace_testkit::reconciler::member_of(&server, json!({"metadata": {"name": format!("js-{i}"), "namespace": "team-a",
                    "labels": {JOBSET_NAME_LABEL: "js", "batch.kubernetes.io/job-name": "js-w-0"}, "annotations": {JOBSET_NAME_LABEL: "js"}},
                    "spec": {"containers": [{"name": "w", "image": "w"}]},
                    "status": {"phase": "Running", "containerStatuses": [{"name": "w", "restartCount": 0}]}})))
                .expect("pod");
        }
        let options = Options {
            settings: Settings {
                dialect,
                namespace: args.namespace.clone(),
                workers: 2,
                debounce: Duration::from_millis(5),
                identity: "jobset-inplace-reconciler-0".to_owned(),
                provision: args.provision_service_accounts.then(|| ProvisionSettings {
                    service_account: args.agent_service_account.clone(),
                    cluster_role: args.agent_cluster_role.clone(),
                    own_namespace: NAMESPACE.to_owned(),
                    flow_schema: (!args.agent_flow_schema.is_empty())
                        .then(|| args.agent_flow_schema.clone()),
                }),
                request_timeout: args.request_timeout,
                watch_timeout: args.watch_timeout,
                write_epoch_status: args.write_epoch_status,
                publish_epochs: true,
                group_restart_timeout: (!args.group_restart_timeout.is_zero())
                    .then_some(args.group_restart_timeout),
                node_lost: jobset_inplace::reconciler::nodes::resolve_node_lost(
                    args.node_lost,
                    args.node_lost_grace,
                )
                .expect("the flags resolve"),
            },
            leader_election: args.leader_elect.then(|| LeaderElection {
                lease_name: args.lease_name.clone(),
                lease_namespace: NAMESPACE.to_owned(),
                duration: Duration::from_secs(args.lease_duration_seconds),
                grace: Duration::from_secs(args.lease_grace_seconds),
            }),
            check_crd: !args.skip_crd_check,
        };
        assert!(options.check_crd && options.leader_election.is_some());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(reconciler::run(server.client(), options, None, async {
            let _ = stopped.await;
        }));
        let status = |field: &str| server.get("jobsets", "team-a", "js").map(|j| j["status"][field].clone());
        let set_epoch = |pod: &str, epoch: &str| {
            server
                .patch("pods", "team-a", pod, &json!({"metadata": {"annotations": {dialect.pod_annotation(): epoch}}}))
                .expect("pod");
        };
        // The agents' FlowSchema names the agent's account in both provisioned namespaces.
        until("the agents' FlowSchema's subjects", || {
            server
                .get("flowschemas", "", "jobset-inplace-agents")
                .map(|fs| fs["spec"]["rules"][0]["subjects"].clone())
                == Some(json!([
                    {"kind": "ServiceAccount", "serviceAccount": {"name": "jobset-inplace-agent", "namespace": "team-a"}},
                    {"kind": "ServiceAccount", "serviceAccount": {"name": "jobset-inplace-agent", "namespace": "team-b"}}
                ]))
        })
        .await;
        // Every pod registers: synced.
        set_epoch("js-0", "0");
        set_epoch("js-1", "0");
        until("synced 0", || status(dialect.synced_field()) == Some(json!(0))).await;
        // A group restart; its first status write meets a conflict and is re-read.
        server.fail_next(1, Verb::Patch, "jobsets/status", 409);
        set_epoch("js-0", "1");
        until("deprecated 0", || status(dialect.deprecated_field()) == Some(json!(0))).await;
        set_epoch("js-1", "1");
        until("synced 1", || status(dialect.synced_field()) == Some(json!(1))).await;
        // A second restart that js-1 never joins: the group-restart deadline deletes it after
        // 1 s, then recreates the JobSet (status.restarts, its Job deleted) 1 s later.
        set_epoch("js-0", "2");
        until("js-1 deleted", || server.get("pods", "team-a", "js-1").is_none()).await;
        until("recreated", || status("restarts") == Some(json!(1))).await;
        until("the Job deleted", || {
            server.get("jobs", "team-a", "js-w-0").is_some_and(|j| j["metadata"]["deletionTimestamp"].is_string())
        })
        .await;
        // One restart too many: the JobSet fails.
        set_epoch("js-0", "3");
        until("failed", || {
            status("conditions").is_some_and(|c| c.as_array().into_iter().flatten().any(|c| c["type"] == "Failed"))
        })
        .await;
        // The agent's accounts, in the JobSet's namespace and the labelled one.
        until("provisioned", || {
            ["team-a", "team-b"].iter().all(|ns| {
                server.get("serviceaccounts", ns, "jobset-inplace-agent").is_some()
                    && server.get("rolebindings", ns, "jobset-inplace-agent").is_some()
            })
        })
        .await;
        until("events", || !server.list("events.events.k8s.io", Some("team-a")).is_empty()).await;
        // Every event it wrote passes its events policy (issue 46).
        let events_policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-reconciler-events");
        for event in server.list("events.events.k8s.io", Some("team-a")) {
            let request = object_request(RECONCILER_USER, "CREATE", "team-a", "e");
            assert_eq!(
                evaluate_matched(events_policy, &request, &event, &Value::Null),
                PolicyResult::Allowed,
                "{event}"
            );
        }
        // What provisioning stored passes the provisioning policies, as created and as applied
        // again.
        for ns in ["team-a", "team-b"] {
            for (resource, policy) in [
                ("serviceaccounts", "jobset-inplace-reconciler-agent-accounts"),
                ("rolebindings", "jobset-inplace-reconciler-binds-agent"),
            ] {
                let stored = server.get(resource, ns, "jobset-inplace-agent").expect("provisioned");
                let policy = r.get("ValidatingAdmissionPolicy", policy);
                for (op, old) in [("CREATE", Value::Null), ("UPDATE", stored.clone())] {
                    let request = object_request(RECONCILER_USER, op, ns, "jobset-inplace-agent");
                    assert_eq!(
                        evaluate_matched(policy, &request, &stored, &old),
                        PolicyResult::Allowed,
                        "{op} {resource} in {ns}: {stored}"
                    );
                }
            }
        }
        // team-b no longer asks for the agent's account: its binding goes.
        server
            .patch("namespaces", "", "team-b", &json!({"metadata": {"labels": {"jobset-inplace.dev/enabled": null}}}))
            .expect("unlabel");
        until("binding removed", || server.get("rolebindings", "team-b", "jobset-inplace-agent").is_none()).await;
        let _ = stop.send(());
        match tokio::time::timeout(Duration::from_secs(20), task).await {
            Ok(Ok(result)) => result.expect("the reconciler ran"),
            other => panic!("the reconciler did not stop: {other:?}"),
        }
        observed(&server)
    })
    .await
    .expect("the scenario finished in time");
    // The CRD check passed on the released CRD in this dialect, as in the cluster.
    let released =
        fixtures::read_yaml(&fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
    assert_eq!(crd::missing_status_fields(&released, dialect), Ok(()));

    let named = BTreeMap::from([
        ("customresourcedefinitions", crd::CRD_NAME),
        ("leases", args.lease_name.as_str()),
        ("serviceaccounts", provision::ROLE_BINDING),
        ("rolebindings", provision::ROLE_BINDING),
        ("flowschemas", args.agent_flow_schema.as_str()),
    ]);
    let grants = grants_for(&r, "jobset-inplace-reconciler");
    // Issue 21: its patches and deletes of RoleBindings and ServiceAccounts name the agent's
    // objects (RBAC cannot name the object of a create or a list).
    for (group, resource, verb) in [
        ("rbac.authorization.k8s.io", "rolebindings", "patch"),
        ("rbac.authorization.k8s.io", "rolebindings", "delete"),
        ("", "serviceaccounts", "patch"),
    ] {
        let rules: Vec<&Value> = grants
            .cluster
            .iter()
            .chain(grants.namespaced.iter())
            .collect();
        assert!(
            rules.iter().any(|rule| rule_allows(
                rule,
                group,
                resource,
                verb,
                Some(provision::ROLE_BINDING)
            )),
            "`{verb} {resource}` of the agent's object"
        );
        for other in [None, Some("default"), Some("kube-proxy")] {
            assert!(
                !rules
                    .iter()
                    .any(|rule| rule_allows(rule, group, resource, verb, other)),
                "`{verb} {resource}` of {other:?} is granted"
            );
        }
    }
    // Leases only in its own namespace; never cluster-wide.
    assert!(
        grants
            .cluster
            .iter()
            .all(|rule| !strings(&rule["resources"]).contains(&"leases".to_owned()))
    );
    let unused = check_grants("reconciler", &grants, &seen, &named, &["leases"]);
    let reasons: BTreeMap<(&str, &str, &str), &str> = BTreeMap::from([
        (
            ("events.k8s.io", "events", "patch"),
            "a repeated event is patched into a series",
        ),
        (
            ("", "serviceaccounts", "create"),
            "server-side apply of a new object is authorized as create",
        ),
        (
            ("rbac.authorization.k8s.io", "rolebindings", "create"),
            "server-side apply of a new object is authorized as create",
        ),
        (
            ("jobset-inplace.dev", "jobsetepochs", "create"),
            "server-side apply of a new object is authorized as create",
        ),
        (
            ("rbac.authorization.k8s.io", "clusterroles", "bind"),
            "binding the agent role without holding it; no request",
        ),
        (
            ("authentication.k8s.io", "tokenreviews", "create"),
            "secure metrics (run here with plain ones): tests/real_cluster/metrics.rs",
        ),
        (
            ("authorization.k8s.io", "subjectaccessreviews", "create"),
            "secure metrics (run here with plain ones): tests/real_cluster/metrics.rs",
        ),
    ]);
    let unexplained: Vec<_> = unused
        .iter()
        .filter(|(g, res, v)| !reasons.contains_key(&(g.as_str(), res.as_str(), v.as_str())))
        .collect();
    assert!(
        unexplained.is_empty(),
        "granted to the reconciler but never requested: {unexplained:?}\nrequested: {seen:?}"
    );
}

/// A kustomization of one's own without a certificate component (deploy/README.md, "Your own
/// CA"): the webhook serves the Secret `jobset-inplace certs --secret` fills, mounted, with no
/// API access, and the CA key stays out of the pod.
#[test]
fn without_a_certificate_component_the_webhook_serves_the_mounted_secret() {
    if !have_kubectl() {
        return;
    }
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources:\n- {deploy}/base\n\
        components:\n- {deploy}/components/epoch-status-fields\n";
    let r = Rendered {
        name: "own certificates".to_owned(),
        objects: render_kustomization(kustomization, &[]),
    };
    let c = r.container("jobset-inplace-webhook", "webhook");
    let Sub::Webhook(args) = parse_args(c).command else {
        panic!("the webhook container runs `webhook`")
    };
    assert!(!args.self_signed);
    let pod = &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"];
    for (file, key) in [(&args.tls_cert, "tls.crt"), (&args.tls_key, "tls.key")] {
        let file = file.as_deref().expect("--tls-cert and --tls-key");
        let (_, volume) = mount_for(pod, c, file);
        assert_eq!(volume["secret"]["secretName"], "jobset-inplace-webhook-tls");
        let items = volume["secret"]["items"].as_array().expect("items");
        assert!(items.iter().any(|i| i["key"] == key), "{key}");
        assert!(items.iter().all(|i| i["key"] != "ca.key"));
    }
    // Mounted for the reviews of scrapers' tokens (secure metrics), its only grants.
    assert_eq!(pod["automountServiceAccountToken"], true);
    let grants = grants_besides_metrics(&r, "jobset-inplace-webhook");
    assert!(grants.cluster.is_empty() && grants.namespaced.is_empty());
    assert!(r.of_kind("ValidatingAdmissionPolicy").iter().all(|p| {
        p["metadata"]["name"] != "jobset-inplace-webhook-ca-bundle"
            && p["metadata"]["name"] != "jobset-inplace-webhook-secret"
    }));
}

/// RBAC grants the reconciler `delete` on every pod and Job and `patch` on every pod's status;
/// its policy holds those deletes to the pods and Jobs of JobSets (the jobset-name label), and its
/// status writes to marking such a pod Failed, in every overlay. Other accounts are not matched.
#[test]
fn the_reconcilers_deletes_are_held_to_the_pods_and_jobs_of_jobsets() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let policy = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-deletes",
        );
        assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-reconciler-deletes",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let fails = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-fails-pods",
        );
        assert_eq!(check_object(fails), Vec::<String>::new(), "{name}");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-reconciler-fails-pods",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(fails["spec"]["failurePolicy"], "Fail");
        let rules = |p: &Value| -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
            p["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .expect("rules")
                .iter()
                .map(|r| {
                    (
                        strings(&r["apiGroups"]),
                        strings(&r["resources"]),
                        strings(&r["operations"]),
                    )
                })
                .collect()
        };
        let delete = vec!["DELETE".to_owned()];
        assert_eq!(
            rules(policy),
            [
                (vec![String::new()], vec!["pods".to_owned()], delete.clone()),
                (vec!["batch".to_owned()], vec!["jobs".to_owned()], delete)
            ],
            "{name}"
        );
        assert_eq!(
            rules(fails),
            [(
                vec![String::new()],
                vec!["pods/status".to_owned()],
                vec!["UPDATE".to_owned()]
            )],
            "{name}"
        );
        // Marking a pod of a JobSet Failed, and nothing else of a pod's status.
        let update = json!({"operation": "UPDATE", "subResource": "status",
                            "userInfo": {"username": "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler"}});
        let pod = |labels: Value, phase: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "namespace": "team-a", "labels": labels},
                   "status": {"phase": phase}})
        };
        let of_js = json!({JOBSET_NAME_LABEL: "js"});
        assert_eq!(
            evaluate_matched(
                fails,
                &update,
                &pod(of_js.clone(), "Failed"),
                &pod(of_js.clone(), "Running")
            ),
            PolicyResult::Allowed,
            "{name}: a JobSet's pod marked Failed"
        );
        for (labels, phase) in [
            (of_js.clone(), "Running"),
            (of_js.clone(), "Succeeded"),
            (json!({"app": "x"}), "Failed"),
        ] {
            assert!(
                matches!(
                    evaluate_matched(
                        fails,
                        &update,
                        &pod(labels.clone(), phase),
                        &pod(labels.clone(), "Running")
                    ),
                    PolicyResult::Denied(_)
                ),
                "{name}: {labels} to {phase}"
            );
        }
        // The account it binds is the reconciler's, as deployed.
        let reconciler = "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler";
        assert!(
            !grants_for(&r, "jobset-inplace-reconciler")
                .cluster
                .is_empty(),
            "{name}: the reconciler's account"
        );
        let request = |user: &str| json!({"operation": "DELETE", "userInfo": {"username": user}});
        let object = |kind: &str, labels: Value| {
            json!({"apiVersion": if kind == "Job" { "batch/v1" } else { "v1" }, "kind": kind,
                   "metadata": {"name": "x", "namespace": "team-a", "labels": labels}})
        };
        let of_jobset = json!({JOBSET_NAME_LABEL: "js", "app": "x"});
        for kind in ["Pod", "Job"] {
            let verdict = |user: &str, old: &Value| {
                evaluate_matched(policy, &request(user), &Value::Null, old)
            };
            assert_eq!(
                verdict(reconciler, &object(kind, of_jobset.clone())),
                PolicyResult::Allowed,
                "{name}: a {kind} of a JobSet"
            );
            for other in [json!({"app": "x"}), json!({})] {
                assert!(
                    matches!(
                        verdict(reconciler, &object(kind, other.clone())),
                        PolicyResult::Denied(_)
                    ),
                    "{name}: a {kind} of no JobSet ({other})"
                );
            }
            // No labels at all (an empty map is not stored).
            let mut unlabelled = object(kind, json!({}));
            unlabelled["metadata"]
                .as_object_mut()
                .map(|m| m.remove("labels"));
            assert!(matches!(
                verdict(reconciler, &unlabelled),
                PolicyResult::Denied(_)
            ));
            for user in [
                "system:serviceaccount:kube-system:generic-garbage-collector",
                "system:serviceaccount:team-a:jobset-inplace-reconciler",
                "alice",
            ] {
                assert_eq!(
                    verdict(user, &object(kind, json!({"app": "x"}))),
                    PolicyResult::NotMatched,
                    "{name}: {user}"
                );
            }
        }
    }
}

/// Issue 46, item 4: the policy on the reconciler's JobSet status writes, evaluated here in every
/// overlay on the shapes of its three writes (the epoch fields as `status_merge_patch` writes them
/// in the overlay's dialect, the JobSet failed, the deadline's restart) and on writes it never
/// makes. tests/real_cluster/jobset_status.rs has the API server apply it to the real token.
#[test]
fn the_reconcilers_jobset_status_writes_are_held_to_its_fields() {
    use jobset_inplace::protocol::StatusChange;
    let reconciler = "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler";
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let dialect = overlay_dialect(name);
        let policy = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-jobset-status",
        );
        assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-reconciler-jobset-status",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(
            policy["spec"]["matchConstraints"]["resourceRules"],
            json!([{"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": ["jobsets/status"]}]),
            "{name}"
        );
        let update = |user: &str| json!({"operation": "UPDATE", "subResource": "status", "userInfo": {"username": user}});
        let running = json!({"type": "StartupPolicyCompleted", "status": "True", "reason": "x",
                             "message": "x", "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let old = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "team-a"},
            "status": {"restarts": 1, "restartsCountTowardsMax": 1,
                       dialect.synced_field(): 1, "conditions": [running.clone()],
                       "replicatedJobsStatus": [{"name": "w", "ready": 2}]}});
        let with = |status: Value| {
            let mut new = old.clone();
            for (k, v) in status.as_object().expect("object") {
                new["status"][k] = v.clone();
            }
            new
        };
        let raised = dialect
            .status_merge_patch(&StatusChange {
                deprecated: Some(1),
                synced: Some(2),
            })
            .expect("a change");
        let failed = json!({"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts",
                            "message": "in-place restart gave up", "lastTransitionTime": "2026-01-02T00:00:00Z"});
        let own = [
            ("the epochs raised", with(raised["status"].clone())),
            (
                "failed",
                with(
                    json!({"conditions": [running.clone(), failed.clone()], "terminalState": "Failed"}),
                ),
            ),
            (
                "recreated",
                with(json!({"restarts": 2, "restartsCountTowardsMax": 2})),
            ),
        ];
        for (what, new) in &own {
            assert_eq!(
                evaluate_matched(policy, &update(reconciler), new, &old),
                PolicyResult::Allowed,
                "{name}: {what}"
            );
            assert_eq!(
                evaluate_matched(
                    policy,
                    &update("system:serviceaccount:jobset-system:jobset-controller-manager"),
                    &with(json!({"restarts": 9})),
                    &old
                ),
                PolicyResult::NotMatched,
                "{name}: another account"
            );
        }
        let other = |kind: &str| {
            json!({"type": kind, "status": "True", "reason": "Other", "message": "x",
                                        "lastTransitionTime": "2026-01-02T00:00:00Z"})
        };
        let attacks = [
            (
                "replicatedJobsStatus",
                with(json!({"replicatedJobsStatus": []})),
            ),
            (
                "a condition it never writes",
                with(json!({"conditions": [running.clone(), other("Completed")]})),
            ),
            (
                "a Failed condition of another reason",
                with(json!({"conditions": [running.clone(), other("Failed")]})),
            ),
            ("a condition dropped", with(json!({"conditions": []}))),
            (
                "terminalState Completed",
                with(json!({"terminalState": "Completed"})),
            ),
            (
                "terminalState Failed alone",
                with(json!({"terminalState": "Failed"})),
            ),
            (
                "the synced epoch lowered",
                with(json!({dialect.synced_field(): 0})),
            ),
            ("restarts by two", with(json!({"restarts": 3}))),
            (
                "restarts lowered",
                with(json!({"restartsCountTowardsMax": 0})),
            ),
        ];
        for (what, new) in &attacks {
            assert!(
                matches!(
                    evaluate_matched(policy, &update(reconciler), new, &old),
                    PolicyResult::Denied(_)
                ),
                "{name}: {what}"
            );
        }
    }
}
