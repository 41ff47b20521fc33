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
/// `workload-high`; once the reconciler's token applied the agents' FlowSchema's rules for the
/// namespace (and no other FlowSchema), the agent's requests, with a token bound to its pod, are
/// handled in the agents' own level `jobset-inplace-agents` (fair per user, i.e. per namespace).
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
            let agents_level = uid("jobset-inplace-agents").await;
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
            // The agents' FlowSchema comes without rules (the chart's); the reconciler keeps its
            // subjects to the provisioned namespaces, with its own token: allowed on that one
            // schema (RBAC resourceNames), refused on any other.
            let namespaces = std::collections::BTreeSet::from([ns.name.clone()]);
            jobset_inplace::reconciler::flow_schema::apply(
                &reconciler,
                "jobset-inplace-agents",
                &namespaces,
                AGENT_SERVICE_ACCOUNT,
            )
            .await
            .expect("the reconciler applies the agents' FlowSchema's rules");
            let other = jobset_inplace::reconciler::flow_schema::apply(
                &reconciler,
                "service-accounts",
                &namespaces,
                AGENT_SERVICE_ACCOUNT,
            )
            .await;
            assert!(
                matches!(&other, Err(kube::Error::Api(s)) if s.code == 403),
                "the reconciler may patch no other FlowSchema: {other:?}"
            );
            // The API server's flow-control configuration follows new FlowSchemas within moments.
            let cases = [
                (
                    &agent,
                    format!("/api/v1/namespaces/{}/pods/mine", ns.name),
                    &agents_level,
                    "the agent reading its pod (the agents' own level)",
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

/// A TCP relay on 127.0.0.1 to `upstream` that counts the connections it accepted (the relay's
/// tasks end with it).
struct CountingRelay {
    addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingRelay {
    async fn start(upstream: String) -> CountingRelay {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let upstream = upstream.clone();
                conns.spawn(async move {
                    let connect = tokio::net::TcpStream::connect(upstream);
                    if let Ok(Ok(mut outbound)) =
                        tokio::time::timeout(Duration::from_secs(10), connect).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        CountingRelay {
            addr,
            accepted,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingRelay {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every relayed connection.
        self.task.abort();
    }
}

/// An agent's start as the agent makes it (src/agent/run.rs): its pod's GET and the streaming
/// list of its JobSetEpoch at once, the initial events read, then the registration's patch of
/// the pod's epoch annotation to `epoch`.
async fn agent_start(client: Client, namespace: &str, epoch: u32) -> Result<(), String> {
    use futures::{StreamExt, TryStreamExt};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let epochs: Api<JobSetEpoch> = Api::namespaced(client, namespace);
    let params = WatchParams::default()
        .fields("metadata.name=train")
        .timeout(30)
        .initial_events();
    let (pod, stream) = futures::join!(pods.get("mine"), epochs.watch(&params, ""));
    pod.map_err(|e| format!("GET pod: {e}"))?;
    let stream = stream.map_err(|e| format!("WATCH jobsetepochs: {e}"))?;
    let events: Vec<_> =
        tokio::time::timeout(Duration::from_secs(20), stream.take(2).try_collect())
            .await
            .map_err(|_| "the initial events within 20 s".to_owned())?
            .map_err(|e| format!("watch events: {e}"))?;
    if events.len() != 2 {
        return Err(format!("the initial events: {} of 2", events.len()));
    }
    let patch = json!({"metadata": {"annotations": {EPOCH_ANNOTATION: epoch.to_string()}}});
    pods.patch("mine", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("PATCH pod: {e}"))
}

/// Issue 44: an agent's start (its pod's GET and its watch at once, then the registration) takes
/// one TCP connection to the real API server, one TLS handshake (`agent::client::agent_client`:
/// HTTP/2, every request a stream of the one connection), where kube's own HTTP/1.1 client takes
/// two. Counted at a relay between the agent's client, with its pod-bound token, and
/// kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_start_takes_one_connection_to_the_api_server() {
    with_cluster(
        "an_agents_start_takes_one_connection_to_the_api_server",
        |cluster| async move {
            use jobset_inplace::wire::epochs::{self, Epochs};
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let (ns, admin_pods) = agent_namespace(&cluster, "rc-one-conn").await;
            let mut body = epochs::apply_body(
                &ns.name,
                "train",
                "none",
                &Epochs {
                    deprecated: None,
                    synced: Some(1),
                    bypass: false,
                    watch_job_set: false,
                },
            );
            body["metadata"]
                .as_object_mut()
                .map(|m| m.remove("ownerReferences"));
            apply(&cluster, &[body])
                .await
                .expect("create the JobSetEpoch");
            let mine = admin_pods.get("mine").await.expect("mine");
            let token = agent_token(&cluster, &ns.name, Some(&mine)).await;
            // RBAC may lag the binding by a moment: the token works before anything is counted.
            let direct = token_client(&cluster, &token).await;
            let pods: Api<Pod> = Api::namespaced(direct, &ns.name);
            try_eventually(Duration::from_secs(30), || async {
                pods.get("mine").await.map(|_| ()).map_err(|e| e.to_string())
            })
            .await
            .expect("the agent's token reads its pod");
            let upstream = cluster
                .server
                .trim_start_matches("https://")
                .trim_end_matches('/')
                .to_owned();
            let ca_data = cluster.ca_data.clone();
            let config = |addr: std::net::SocketAddr| {
                let yaml = format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
                     https://{addr}\n    certificate-authority-data: {ca_data}\nusers:\n- name: u\n  \
                     user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    \
                     user: u\ncurrent-context: c\n"
                );
                let kc = Kubeconfig::from_yaml(&yaml).expect("relay kubeconfig");
                async move { Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await }
            };

            let relay = CountingRelay::start(upstream.clone()).await;
            let kube_own = Client::try_from(config(relay.addr).await.expect("relay config")).expect("kube's client");
            agent_start(kube_own, &ns.name, 2)
                .await
                .expect("a start on kube's HTTP/1.1 client");
            let http1 = relay.accepted();
            drop(relay);

            let relay = CountingRelay::start(upstream).await;
            let agents = jobset_inplace::agent::client::agent_client(config(relay.addr).await.expect("relay config"))
                .expect("the agent's client");
            agent_start(agents, &ns.name, 3)
                .await
                .expect("a start on the agent's client");
            let http2 = relay.accepted();
            drop(relay);

            assert_eq!(http2, 1, "the agent's start: one connection");
            assert!(
                http1 >= 2,
                "kube's HTTP/1.1 client took {http1} connection(s) for the same start"
            );
            eprintln!("an agent's start: {http2} connection (kube's HTTP/1.1 client: {http1})");
            drop(ns);
        },
    )
    .await;
}
