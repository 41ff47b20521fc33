//! The agent's rights: real RBAC, real admission policy, a token bound to a pod

use super::*;

/// The agent's ServiceAccount and RoleBinding in a namespace, as the reconciler provisions them
/// (src/reconciler/provision.rs), and two pods.
async fn agent_namespace(cluster: &Cluster, prefix: &str) -> (TestNamespace, Api<Pod>) {
    let ns = TestNamespace::create(cluster, prefix).await;
    let labels = json!({"app.kubernetes.io/managed-by": "jobset-inplace", "app.kubernetes.io/name": "jobset-inplace-agent"});
    let objects = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name, "labels": labels}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "jobset-inplace-agent", "namespace": ns.name, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "jobset-inplace-agent"},
               "subjects": [{"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name}]}),
    ];
    apply(cluster, &objects).await.expect("agent objects");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
    for name in ["mine", "other"] {
        // The ServiceAccount admission plugin may not see the new account for a moment.
        eventually(
            &format!("create pod {name}"),
            Duration::from_secs(30),
            || async {
                pods.create(
                    &PostParams::default(),
                    &build::Pod::new(name)
                        .label("app", "worker")
                        .epoch(EPOCH_ANNOTATION, "1")
                        .annotation("team", "a")
                        .service_account(AGENT_SERVICE_ACCOUNT)
                        .container("worker", "registry.example/worker:1")
                        .typed::<Pod>(),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            },
        )
        .await;
    }
    (ns, pods)
}

/// The UID of the priority level the API server handled a `GET path` in (API Priority and
/// Fairness answers it in `X-Kubernetes-PF-PriorityLevel-UID`, whatever the status).
async fn priority_level_of(client: &Client, path: &str) -> Result<String, String> {
    let request = hyper::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    response
        .headers()
        .get("x-kubernetes-pf-prioritylevel-uid")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("no priority level on GET {path}: {}", response.status()))
}

/// deploy/base/flowcontrol.yaml on a real API server: with the reconciler's token, its Lease
/// requests are handled in the `leader-election` priority level and its lists in
/// `workload-high`; with a token bound to its pod, the agent's requests stay in the built-in
/// `workload-low` (the `service-accounts` schema, fair per user, i.e. per namespace).
#[tokio::test]
async fn the_agents_and_the_reconciler_get_their_priority_levels() {
    with_cluster(
        "the_agents_and_the_reconciler_get_their_priority_levels",
        |cluster| async move {
            use k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration;
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let levels: Api<PriorityLevelConfiguration> = Api::all(cluster.client.clone());
            let uid = |name: &'static str| {
                let levels = levels.clone();
                async move {
                    levels
                        .get(name)
                        .await
                        .unwrap_or_else(|e| panic!("priority level {name}: {e}"))
                        .metadata
                        .uid
                        .expect("a uid")
                }
            };
            let agents_level = uid("workload-low").await;
            let leader_election = uid("leader-election").await;
            let workload_high = uid("workload-high").await;

            let (ns, admin_pods) = agent_namespace(&cluster, "rc-apf").await;
            let mine = admin_pods.get("mine").await.expect("mine");
            let agent = token_client(&cluster, &agent_token(&cluster, &ns.name, Some(&mine)).await)
                .await;
            let reconciler = token_client(
                &cluster,
                &account_token(&cluster, SYSTEM_NAMESPACE, "jobset-inplace-reconciler").await,
            )
            .await;
            // The API server's flow-control configuration follows new FlowSchemas within moments.
            let cases = [
                (
                    &agent,
                    format!("/api/v1/namespaces/{}/pods/mine", ns.name),
                    &agents_level,
                    "the agent reading its pod",
                ),
                (
                    &reconciler,
                    format!(
                        "/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/jobset-inplace-reconciler"
                    ),
                    &leader_election,
                    "the reconciler's Lease",
                ),
                (
                    &reconciler,
                    "/apis/jobset.x-k8s.io/v1alpha2/jobsets?limit=1".to_owned(),
                    &workload_high,
                    "the reconciler listing JobSets",
                ),
            ];
            for (client, path, want, what) in cases {
                try_eventually(Duration::from_secs(30), || async {
                    let got = priority_level_of(client, &path).await?;
                    (&got == want)
                        .then_some(())
                        .ok_or_else(|| format!("{what}: level {got}, not {want}"))
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            }
            drop(ns);
        },
    )
    .await;
}

const POLICY: &str = "ValidatingAdmissionPolicy 'jobset-inplace-agent'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_may_move_only_its_own_pods_epoch_forward() {
    with_cluster(
        "the_agent_may_move_only_its_own_pods_epoch_forward",
        |cluster| async move {
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let (ns, admin_pods) = agent_namespace(&cluster, "rc-agent").await;
            let mine = admin_pods.get("mine").await.expect("mine");
            let token = agent_token(&cluster, &ns.name, Some(&mine)).await;
            let agent = token_client(&cluster, &token).await;
            let pods: Api<Pod> = Api::namespaced(agent.clone(), &ns.name);
            let pp = PatchParams::default();

            // Allowed: read its pod, raise its epoch (the policy and RBAC caches may lag the binding
            // by a moment, so the first write is retried).
            pods.get("mine").await.expect("the agent reads its pod");
            eventually(
                "the agent raises its epoch",
                Duration::from_secs(30),
                || async {
                    pods.patch("mine", &pp, &epoch_patch("2"))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            )
            .await;
            let now = admin_pods.get("mine").await.expect("mine");
            assert_eq!(
                now.metadata.annotations.expect("annotations")[EPOCH_ANNOTATION],
                "2"
            );
            pods.patch("mine", &pp, &epoch_patch("2"))
                .await
                .expect("the same epoch again");
            pods.patch("mine", &pp, &epoch_patch("10"))
                .await
                .expect("a jump forward");

            // Denied by the admission policy (the agent's RBAC allows `patch pods`).
            let by_policy: Vec<(&str, &str, Patch<Value>, u16, &str)> = vec![
                (
                    "backwards",
                    "mine",
                    epoch_patch("9"),
                    422,
                    "never decreases",
                ),
                (
                    "not a number",
                    "mine",
                    epoch_patch("eleven"),
                    422,
                    "never decreases",
                ),
                (
                    "removed",
                    "mine",
                    merge(json!({"metadata": {"annotations": {EPOCH_ANNOTATION: null}}})),
                    422,
                    "never decreases",
                ),
                (
                    "another annotation",
                    "mine",
                    merge(json!({"metadata": {"annotations": {"team": "b"}}})),
                    403,
                    "no pod annotation but its epoch",
                ),
                (
                    "a new annotation",
                    "mine",
                    merge(json!({"metadata": {"annotations": {"x": "y"}}})),
                    403,
                    "no pod annotation but its epoch",
                ),
                (
                    "a label",
                    "mine",
                    merge(json!({"metadata": {"labels": {"app": "other"}}})),
                    403,
                    "labels",
                ),
                (
                    "a finalizer",
                    "mine",
                    merge(json!({"metadata": {"finalizers": ["example.com/x"]}})),
                    403,
                    "finalizers",
                ),
                (
                    "the spec",
                    "mine",
                    merge(json!({"spec": {"activeDeadlineSeconds": 100}})),
                    403,
                    "spec",
                ),
                (
                    "another pod",
                    "other",
                    epoch_patch("11"),
                    403,
                    "only update the pod its token is bound to",
                ),
            ];
            for (what, name, patch, code, message) in by_policy {
                let (got_code, _, got_message, _) = api_error(pods.patch(name, &pp, &patch).await)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got_code, code, "{what}: {got_message}");
                assert!(
                    got_message.contains(POLICY) && got_message.contains(message),
                    "{what}: denied by the policy with `{message}`: {got_message}"
                );
            }

            // Denied by RBAC: other verbs, subresources, other namespaces.
            let forbidden =
                |what: &str, result: Result<(u16, String, String, Vec<String>), String>| {
                    let (code, _, message, _) = result.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(code, 403, "{what}: {message}");
                    assert!(
                        message.contains("is forbidden: User \"system:serviceaccount:"),
                        "{what}: RBAC: {message}"
                    );
                };
            forbidden(
                "list pods",
                api_error(pods.list(&ListParams::default()).await),
            );
            forbidden(
                "delete its pod",
                api_error(pods.delete("mine", &DeleteParams::default()).await),
            );
            forbidden(
                "patch pods/status",
                api_error(
                    pods.patch_status("mine", &pp, &merge(json!({"status": {"message": "x"}})))
                        .await,
                ),
            );
            // The JobSet's epochs: watched, never written, not even read one by one.
            let epochs: Api<JobSetEpoch> = Api::namespaced(agent.clone(), &ns.name);
            let params = WatchParams::default().fields("metadata.name=js");
            let watching = epochs
                .watch(&params, "")
                .await
                .expect("the agent watches its JobSet's epochs");
            drop(watching);
            let forged = jobset_inplace::wire::epochs::apply_body(
                &ns.name,
                "js",
                "uid",
                &jobset_inplace::wire::epochs::Epochs {
                    deprecated: None,
                    synced: Some(3),
                    bypass: false,
                    watch_job_set: false,
                },
            );
            forbidden(
                "write a JobSetEpoch",
                api_error(
                    epochs
                        .patch(
                            "js",
                            &PatchParams::apply("forger").force(),
                            &Patch::Apply(&forged),
                        )
                        .await,
                ),
            );
            forbidden("get a JobSetEpoch", api_error(epochs.get("js").await));
            forbidden(
                "list JobSetEpochs",
                api_error(epochs.list(&ListParams::default()).await),
            );
            let (elsewhere, _) = agent_namespace(&cluster, "rc-agent-elsewhere").await;
            let there: Api<Pod> = Api::namespaced(agent.clone(), &elsewhere.name);
            forbidden(
                "a pod of another namespace",
                api_error(there.patch("mine", &pp, &epoch_patch("12")).await),
            );
            drop(elsewhere);

            // A token of the same account bound to no pod: not its pod.
            let unbound =
                token_client(&cluster, &agent_token(&cluster, &ns.name, None).await).await;
            let unbound: Api<Pod> = Api::namespaced(unbound, &ns.name);
            let (code, _, message, _) =
                api_error(unbound.patch("mine", &pp, &epoch_patch("13")).await)
                    .expect("an unbound token");
            assert_eq!(code, 403, "{message}");
            assert!(
                message.contains("only update the pod its token is bound to"),
                "{message}"
            );

            // The policy is about the agent only: the admin changes labels freely.
            admin_pods
                .patch(
                    "mine",
                    &pp,
                    &merge(json!({"metadata": {"labels": {"app": "other"}}})),
                )
                .await
                .expect("the admin is not the agent");
            let after = admin_pods.get("mine").await.expect("mine");
            assert_eq!(
                after.metadata.annotations.expect("annotations")[EPOCH_ANNOTATION],
                "10"
            );
        },
    )
    .await;
}

/// Issue 44 (docs/protocol.md, "The agent's first read"): kube-apiserver 1.35 serves the agent's
/// first read, a streaming list of its JobSetEpoch (`sendInitialEvents=true`,
/// `resourceVersionMatch=NotOlderThan`, no resourceVersion, a field selector on the name), to the
/// agent's pod-bound token: no 422 (the `WatchList` gate is on), the object as ADDED with the
/// epochs written just before, then the bookmark that ends the initial events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reads_its_first_state_with_a_streaming_list() {
    with_cluster(
        "agent_reads_its_first_state_with_a_streaming_list",
        |cluster| async move {
            use futures::{StreamExt, TryStreamExt};
            use jobset_inplace::wire::epochs::{self, Epochs};
            use kube::api::WatchEvent;
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let (ns, admin_pods) = agent_namespace(&cluster, "rc-first-read").await;
            let admin: Api<JobSetEpoch> = Api::namespaced(cluster.client.clone(), &ns.name);
            let content = |synced| Epochs {
                deprecated: None,
                synced: Some(synced),
                bypass: false,
                watch_job_set: false,
            };
            // No owner: the garbage collector would delete an object whose owner does not exist.
            let mut body = epochs::apply_body(&ns.name, "train", "none", &content(1));
            body["metadata"]
                .as_object_mut()
                .map(|m| m.remove("ownerReferences"));
            apply(&cluster, &[body])
                .await
                .expect("create the JobSetEpoch");
            // The write the agent's first read must not miss.
            admin
                .patch(
                    "train",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"epochs": {"synced": 2}})),
                )
                .await
                .expect("synced 2");

            let mine = admin_pods.get("mine").await.expect("mine");
            let agent = token_client(
                &cluster,
                &agent_token(&cluster, &ns.name, Some(&mine)).await,
            )
            .await;
            let api: Api<JobSetEpoch> = Api::namespaced(agent, &ns.name);
            let params = WatchParams::default()
                .fields("metadata.name=train")
                .timeout(30)
                .initial_events();
            // RBAC may lag the binding by a moment.
            let stream = try_eventually(Duration::from_secs(30), || async {
                api.watch(&params, "").await.map_err(|e| e.to_string())
            })
            .await
            .expect("the API server serves the agent's streaming list");
            let events: Vec<WatchEvent<JobSetEpoch>> =
                tokio::time::timeout(Duration::from_secs(20), stream.take(2).try_collect())
                    .await
                    .expect("the initial events within 20 s")
                    .expect("watch events");
            match &events[..] {
                [WatchEvent::Added(o), WatchEvent::Bookmark(b)] => {
                    assert_eq!(o.epochs.and_then(|e| e.synced), Some(2), "{o:?}");
                    assert_eq!(
                        b.metadata
                            .annotations
                            .get("k8s.io/initial-events-end")
                            .map(String::as_str),
                        Some("true"),
                        "{:?}",
                        b.metadata.annotations
                    );
                }
                other => panic!("expected ADDED then the initial-events-end bookmark: {other:?}"),
            }
            drop(ns);
        },
    )
    .await;
}
