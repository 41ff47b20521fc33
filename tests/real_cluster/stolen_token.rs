//! A stolen reconciler token (issue 21): the provisioning policies, its pod status policy

use super::*;

fn agent_binding(namespace: &str, name: &str, role: (&str, &str), subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": name, "namespace": namespace},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role.0, "name": role.1},
           "subjects": subjects})
}

/// The refusal of one attack: an admission policy (`Some(policy)`, with its message) or RBAC.
fn refused_by<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, kube::Error>,
    by: Option<(&str, &str)>,
) {
    let (code, _, message, _) = api_error(result).unwrap_or_else(|e| panic!("{what}: {e}"));
    match by {
        Some((policy, said)) => {
            assert!(code == 403 || code == 422, "{what}: {code} {message}");
            assert!(
                message.contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                    && message.contains(said),
                "{what}: refused by {policy} with `{said}`: {message}"
            );
        }
        None => {
            assert_eq!(code, 403, "{what}: {message}");
            assert!(
                message.contains("is forbidden: User \"system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler\""),
                "{what}: refused by RBAC: {message}"
            );
        }
    }
}

/// Issue 21, item 1, the attack as it was run, with the reconciler's own token (a TokenRequest
/// of its ServiceAccount) on the real API server with the epoch overlay's RBAC and policies:
/// binding the agent role (`patch pods`) to its own account in kube-system, to the `default`
/// account, to another namespace's agent account, under another name, or binding another role is
/// refused; so are deleting an unrelated RoleBinding and patching an unrelated ServiceAccount.
/// Provisioning itself (src/reconciler/provision.rs, server-side apply of the agent's
/// ServiceAccount and RoleBinding, again, and the binding's removal) goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_reconciler_token_cannot_bind_the_agent_role_elsewhere() {
    use jobset_inplace::reconciler::provision::{self, ProvisionSettings};
    use k8s_openapi::api::rbac::v1::RoleBinding;
    with_cluster(
        "a_stolen_reconciler_token_cannot_bind_the_agent_role_elsewhere",
        |cluster| async move {
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-stolen").await;
            let other = TestNamespace::create(&cluster, "rc-stolen-other").await;
            let mut leftovers = Leftovers {
                kubeconfig: cluster.kubeconfig.clone(),
                objects: Vec::new(),
            };
            // What the namespace's owner has: a RoleBinding, a ServiceAccount, a Role that happens
            // to have the agent's name (with no rules: binding it escalates nothing).
            apply(
                &cluster,
                &[
                    agent_binding(&ns.name, "team-admins", ("ClusterRole", "admin"),
                        json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}])),
                    json!({"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "builder", "namespace": ns.name}}),
                    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                           "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name}, "rules": []}),
                ],
            )
            .await
            .expect("the namespace's own objects");
            let client =
                token_client(&cluster, &account_token(&cluster, SYSTEM_NAMESPACE, RECONCILER_ACCOUNT).await)
                    .await;
            let bindings = |namespace: &str| -> Api<DynamicObject> {
                let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "RoleBinding");
                Api::namespaced_with(
                    client.clone(),
                    namespace,
                    &ApiResource::from_gvk_with_plural(&gvk, "rolebindings"),
                )
            };
            let own = json!([{"kind": "ServiceAccount", "name": RECONCILER_ACCOUNT, "namespace": SYSTEM_NAMESPACE}]);
            let agent_role = ("ClusterRole", AGENT_SERVICE_ACCOUNT);
            let policy = "jobset-inplace-reconciler-binds-agent";
            let create = |namespace: &str, object: Value, dry_run: bool| {
                let api = bindings(namespace);
                async move {
                    let object: DynamicObject = serde_json::from_value(object).expect("object");
                    api.create(&PostParams { dry_run, ..PostParams::default() }, &object).await
                }
            };
            let escalation = agent_binding("kube-system", AGENT_SERVICE_ACCOUNT, agent_role, own.clone());
            until_enforced(policy, || create("kube-system", escalation.clone(), true)).await;

            // The attacks, each refused by the policy (RBAC allows every one of them).
            let mut attacks: Vec<(&str, String, Value, &str)> = vec![
                ("the agent role bound to the reconciler in kube-system", "kube-system".into(),
                 escalation.clone(), "may not bind in kube-system"),
                ("the agent role bound to the namespace's default account", ns.name.clone(),
                 agent_binding(&ns.name, AGENT_SERVICE_ACCOUNT, agent_role,
                     json!([{"kind": "ServiceAccount", "name": "default", "namespace": ns.name}])),
                 "may bind only the ServiceAccount jobset-inplace-agent of the binding's own namespace"),
                ("the agent role bound to another namespace's agent account", ns.name.clone(),
                 agent_binding(&ns.name, AGENT_SERVICE_ACCOUNT, agent_role,
                     json!([{"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": other.name}])),
                 "may bind only the ServiceAccount jobset-inplace-agent of the binding's own namespace"),
                ("the agent role bound under another name", ns.name.clone(),
                 agent_binding(&ns.name, "escalate", agent_role,
                     json!([{"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name}])),
                 "may write only the RoleBinding jobset-inplace-agent"),
                ("a Role of the agent's name bound", ns.name.clone(),
                 agent_binding(&ns.name, AGENT_SERVICE_ACCOUNT, ("Role", AGENT_SERVICE_ACCOUNT),
                     json!([{"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name}])),
                 "may bind only the ClusterRole jobset-inplace-agent"),
                ("the reconciler's own account bound in a workload namespace", ns.name.clone(),
                 agent_binding(&ns.name, AGENT_SERVICE_ACCOUNT, agent_role, own.clone()),
                 "may bind only the ServiceAccount jobset-inplace-agent of the binding's own namespace"),
            ];
            for (_, namespace, object, _) in &attacks {
                leftovers.objects.push((namespace.clone(), "rolebinding",
                    object["metadata"]["name"].as_str().unwrap_or_default().to_owned()));
            }
            for (what, namespace, object, said) in attacks.drain(..) {
                refused_by(&format!("create: {what}"), create(&namespace, object.clone(), false).await, Some((policy, said)));
                // The same by server-side apply, as the reconciler writes: RBAC's resourceNames
                // refuse a patch of another name first.
                let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                refused_by(
                    &format!("apply: {what}"),
                    bindings(&namespace)
                        .patch(&name, &PatchParams::apply("attacker").force(), &Patch::Apply(&object))
                        .await,
                    (name == AGENT_SERVICE_ACCOUNT).then_some((policy, said)),
                );
            }
            // Rights it never had stay refused by RBAC: another ClusterRole, an unrelated
            // RoleBinding deleted, an unrelated ServiceAccount patched.
            let (code, _, message, _) = api_error(
                create(&ns.name, agent_binding(&ns.name, AGENT_SERVICE_ACCOUNT, ("ClusterRole", "admin"),
                    json!([{"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name}])), false).await,
            )
            .expect("binding admin refused");
            assert_eq!(code, 403, "{message}");
            refused_by(
                "delete an unrelated RoleBinding",
                bindings(&ns.name).delete("team-admins", &DeleteParams::default()).await,
                None,
            );
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
            refused_by(
                "patch an unrelated ServiceAccount",
                accounts
                    .patch("builder", &PatchParams::default(),
                        &merge(json!({"imagePullSecrets": [{"name": "stolen"}]})))
                    .await,
                None,
            );
            refused_by(
                "patch the default ServiceAccount",
                accounts
                    .patch("default", &PatchParams::apply("attacker").force(),
                        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": ns.name},
                            "automountServiceAccountToken": true})))
                    .await,
                None,
            );
            // The agent's ServiceAccount given more than provisioning gives it.
            refused_by(
                "the agent account created with pull secrets",
                accounts
                    .patch(AGENT_SERVICE_ACCOUNT, &PatchParams::apply("attacker").force(),
                        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name},
                            "imagePullSecrets": [{"name": "stolen"}]})))
                    .await,
                Some(("jobset-inplace-reconciler-agent-accounts", "may not set a ServiceAccount's secrets")),
            );
            let settings = ProvisionSettings::default();
            let subjects = std::collections::BTreeSet::from([settings.service_account.clone()]);
            refused_by(
                "provisioning kube-system",
                provision::apply(&client, "kube-system", &subjects, &settings).await,
                Some(("jobset-inplace-reconciler-agent-accounts", "may not write in kube-system")),
            );
            leftovers.objects.push(("kube-system".into(), "serviceaccount", AGENT_SERVICE_ACCOUNT.into()));
            let admin_bindings: Api<RoleBinding> = Api::namespaced(cluster.client.clone(), &ns.name);
            let admin_kube_system: Api<RoleBinding> = Api::namespaced(cluster.client.clone(), "kube-system");
            assert!(admin_kube_system.get_opt(AGENT_SERVICE_ACCOUNT).await.expect("get").is_none());
            assert!(admin_bindings.get_opt("team-admins").await.expect("get").is_some());

            // Provisioning as the reconciler does it: created, applied again, removed.
            for round in ["created", "applied again"] {
                eventually(&format!("provisioning {round}"), Duration::from_secs(30), || async {
                    provision::apply(&client, &ns.name, &subjects, &settings)
                        .await
                        .map_err(|e| e.to_string())
                })
                .await;
            }
            let stored = admin_bindings.get(AGENT_SERVICE_ACCOUNT).await.expect("the agent's binding");
            assert_eq!(stored.role_ref.name, AGENT_SERVICE_ACCOUNT);
            // Issue 34: the agent's account does not automount its token (the policy lets the
            // reconciler set that field to false, and to nothing else).
            let account = Api::<ServiceAccount>::namespaced(cluster.client.clone(), &ns.name)
                .get(AGENT_SERVICE_ACCOUNT)
                .await
                .expect("the agent's account");
            assert_eq!(account.automount_service_account_token, Some(false));
            refused_by(
                "the agent account's token automounting turned on",
                accounts
                    .patch(AGENT_SERVICE_ACCOUNT, &PatchParams::apply("jobset-inplace").force(),
                        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name},
                            "automountServiceAccountToken": true})))
                    .await,
                Some(("jobset-inplace-reconciler-agent-accounts", "may set automountServiceAccountToken only to false")),
            );
            let listed = provision::list_provisioned(&client).await.expect("list");
            assert!(listed.contains(&ns.name), "{listed:?}");
            provision::remove(&client, &ns.name).await.expect("the binding removed");
            assert!(admin_bindings.get_opt(AGENT_SERVICE_ACCOUNT).await.expect("get").is_none());
            drop(leftovers);
            drop(other);
            drop(ns);
        },
    )
    .await;
}

/// Issue 21, item 9: with the reconciler's token, its pod status write may mark a pod of a
/// JobSet Failed with a reason and a message (exactly the deadline's merge patch) and nothing
/// else in the same write: conditions, IPs, container statuses, labels, annotations and
/// finalizers are refused, and so is a write on a pod that has already failed. The list of
/// status fields the policy holds is the API server's own PodStatus schema but those three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_reconciler_token_may_only_mark_a_jobsets_pod_failed() {
    with_cluster(
        "a_stolen_reconciler_token_may_only_mark_a_jobsets_pod_failed",
        |cluster| async move {
            let installed = install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let policy_name = "jobset-inplace-reconciler-fails-pods";
            let ns = TestNamespace::create(&cluster, "rc-fails").await;
            let admin: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            let mut p = build::Pod::new("js-w-0-0").label("app", "worker").epoch(EPOCH_ANNOTATION, "1").annotation("team", "a").service_account(AGENT_SERVICE_ACCOUNT).container("worker", "registry.example/worker:1").typed::<Pod>();
            p.metadata.labels = Some([("jobset.sigs.k8s.io/jobset-name".to_owned(), "js".to_owned())].into());
            p.metadata.finalizers = Some(vec!["example.com/keep".to_owned()]);
            if let Some(spec) = p.spec.as_mut() {
                spec.service_account_name = None;
            }
            eventually("create the pod", Duration::from_secs(30), || async {
                admin.create(&PostParams::default(), &p).await.map(|_| ()).map_err(|e| e.to_string())
            })
            .await;
            // As a kubelet would report it (the admin is not held by the policy).
            let reported = json!({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
                "podIP": "10.1.0.1", "podIPs": [{"ip": "10.1.0.1"}],
                "startTime": "2026-01-01T00:00:00Z",
                "containerStatuses": [{"name": "worker", "image": "registry.example/worker:1", "imageID": "",
                                       "ready": true, "restartCount": 2,
                                       "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]}});
            let before = admin
                .patch_status("js-w-0-0", &PatchParams::default(), &merge(reported))
                .await
                .expect("the kubelet's status");
            let uid = before.metadata.uid.clone().expect("uid");
            let client =
                token_client(&cluster, &account_token(&cluster, SYSTEM_NAMESPACE, RECONCILER_ACCOUNT).await)
                    .await;
            let pods: Api<Pod> = Api::namespaced(client, &ns.name);
            // The deadline's write (src/reconciler/controller/deadline.rs, fail_and_delete).
            let deadline = json!({"metadata": {"uid": uid},
                "status": {"phase": "Failed", "reason": "GroupRestartTimedOut",
                           "message": "the group restart did not complete in time"}});
            let with = |more: Value| {
                let mut patch = deadline.clone();
                for (k, v) in more.as_object().expect("object") {
                    for (field, value) in v.as_object().expect("object") {
                        patch[k][field] = value.clone();
                    }
                }
                patch
            };
            let dry = PatchParams { dry_run: true, ..PatchParams::default() };
            let probe = merge(with(json!({"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}})));
            until_enforced(policy_name, || pods.patch_status("js-w-0-0", &dry, &probe)).await;
            let attacks = [
                ("a condition", json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}), "nothing of a pod's status but"),
                ("the pod IP", json!({"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}}), "nothing of a pod's status but"),
                ("the host IP", json!({"status": {"hostIP": "10.0.0.9", "hostIPs": [{"ip": "10.0.0.9"}]}}), "nothing of a pod's status but"),
                ("a container status", json!({"status": {"containerStatuses": [{"name": "worker", "image": "registry.example/worker:1",
                    "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "X"}}}]}}), "nothing of a pod's status but"),
                ("a label", json!({"metadata": {"labels": {"app": "elsewhere"}}}), "labels, annotations or finalizers"),
                ("an annotation", json!({"metadata": {"annotations": {EPOCH_ANNOTATION: "9"}}}), "labels, annotations or finalizers"),
                ("the finalizers", json!({"metadata": {"finalizers": null}}), "labels, annotations or finalizers"),
            ];
            for (what, more, said) in attacks {
                refused_by(
                    &format!("Failed and {what}"),
                    pods.patch_status("js-w-0-0", &PatchParams::default(), &merge(with(more))).await,
                    Some((policy_name, said)),
                );
            }
            // The deadline's own write goes through, and changes nothing else.
            let after = pods
                .patch_status("js-w-0-0", &PatchParams::default(), &merge(deadline.clone()))
                .await
                .expect("the deadline's write");
            let (mut was, mut now) = (
                serde_json::to_value(before.status).expect("json"),
                serde_json::to_value(after.status.clone()).expect("json"),
            );
            assert_eq!(now["phase"], "Failed");
            for v in [&mut was, &mut now] {
                for field in ["phase", "reason", "message"] {
                    v.as_object_mut().map(|o| o.remove(field));
                }
            }
            assert_eq!(now, was, "nothing else of the status moved");
            assert_eq!(after.metadata.labels, p.metadata.labels);
            // A pod that has already failed is not written again (422, as the deadline expects
            // of a pod that ended meanwhile: it deletes it all the same).
            let (code, _, message, _) = api_error(
                pods.patch_status("js-w-0-0", &PatchParams::default(), &merge(deadline.clone())).await,
            )
            .expect("refused");
            assert_eq!(code, 422, "{message}");
            assert!(message.contains("already ended"), "{message}");
            admin
                .patch("js-w-0-0", &PatchParams::default(), &merge(json!({"metadata": {"finalizers": null}})))
                .await
                .expect("finalizer removed");
            // The policy compares every PodStatus field of this API server's schema but those it
            // lets the reconciler write.
            let request = hyper::Request::get("/openapi/v3/api/v1")
                .body(Vec::new())
                .expect("request");
            let schema: Value = cluster.client.request(request).await.expect("OpenAPI v3 of api/v1");
            let fields: std::collections::BTreeSet<String> = schema["components"]["schemas"]
                ["io.k8s.api.core.v1.PodStatus"]["properties"]
                .as_object()
                .expect("PodStatus properties")
                .keys()
                .filter(|k| !["phase", "reason", "message"].contains(&k.as_str()))
                .cloned()
                .collect();
            let policy = installed
                .iter()
                .find(|o| o["kind"] == "ValidatingAdmissionPolicy" && o["metadata"]["name"] == policy_name)
                .expect("the policy");
            let text = policy["spec"]["validations"].to_string();
            for field in &fields {
                assert!(
                    text.contains(&format!("has(object.status.{field}) == has(oldObject.status.{field})")),
                    "PodStatus.{field} is not held by {policy_name}"
                );
            }

            drop(ns);
        },
    )
    .await;
}
