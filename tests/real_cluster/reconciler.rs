//! The reconciler with its deployed RBAC: watches, status patches, leader election, provisioning

use super::*;

const LEASE: &str = "jobset-inplace-reconciler";

async fn lease_holder(cluster: &Cluster) -> Result<String, String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client.clone(), SYSTEM_NAMESPACE);
    leases
        .get(LEASE)
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| s.holder_identity)
        .ok_or_else(|| "no holder".to_owned())
}

/// The names of the `count` pods of the JobSet `jobset` that the Job controller made (each
/// controlled by a Job), sorted; waits for them.
async fn jobset_pods(pods: &Api<Pod>, jobset: &str, count: usize) -> Vec<String> {
    eventually(
        &format!("{count} pods of {jobset} made by the Job controller"),
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(
                    &ListParams::default()
                        .labels(&format!("jobset.sigs.k8s.io/jobset-name={jobset}")),
                )
                .await
                .map_err(|e| e.to_string())?;
            let mut names: Vec<String> = list
                .items
                .iter()
                .filter(|p| {
                    p.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.kind == "Job" && o.controller == Some(true))
                })
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            names.sort();
            (names.len() == count)
                .then_some(names)
                .ok_or_else(|| format!("{} so far", list.items.len()))
        },
    )
    .await
}

/// A JobSet of `pods` pods of one replicatedJob, as the webhook (not running) would leave it
/// for JobSet's own webhook: the story1 fixture without the injection.
fn plain_in_place_jobset(name: &str, namespace: &str, pods: usize) -> DynamicObject {
    let mut js = fixture_object("story1-plain");
    js["metadata"] = json!({"name": name, "namespace": namespace});
    let job = &mut js["spec"]["replicatedJobs"][0];
    job["replicas"] = json!(1);
    job["template"]["spec"]["parallelism"] = json!(pods);
    job["template"]["spec"]["completions"] = json!(pods);
    job["template"]["spec"]["backoffLimit"] = json!(2147483647);
    job["template"]["spec"]["podReplacementPolicy"] = json!("Failed");
    serde_json::from_value(js).expect("JobSet")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_moves_epochs_and_hands_over_its_lease() {
    with_cluster(
        "the_reconciler_moves_epochs_and_hands_over_its_lease",
        |cluster| async move {
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-reconciler").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            let pp = PatchParams::default();

            // One replicated job of 2 pods.
            let mut js = fixture_object("story1-plain");
            js["metadata"] = json!({"name": "sync", "namespace": ns.name});
            js["spec"]["replicatedJobs"][0]["replicas"] = json!(1);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = json!(2);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = json!(2);
            // What the webhook (not running here) would inject and JobSet's webhook requires.
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = json!(2147483647);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["podReplacementPolicy"] =
                json!("Failed");
            jobsets
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(js).expect("JobSet"),
                )
                .await
                .expect("create the JobSet");

            let first = Reconciler::start(&cluster, "real-cluster-a").await;
            eventually("a holds the lease", Duration::from_secs(60), || async {
                let holder = lease_holder(&cluster).await?;
                (holder == "real-cluster-a").then_some(()).ok_or(holder)
            })
            .await;
            // Provisioning: the agent's ServiceAccount and RoleBinding in the JobSet's namespace.
            let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), &ns.name);
            eventually(
                "the agent's ServiceAccount provisioned",
                Duration::from_secs(30),
                || async {
                    accounts
                        .get(AGENT_SERVICE_ACCOUNT)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            )
            .await;
            let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            eventually(
                "the agent's RoleBinding provisioned",
                Duration::from_secs(30),
                || async {
                    bindings
                        .get("jobset-inplace-agent")
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            )
            .await;

            // The two pods JobSet's controller and the Job controller made (only those count, issue
            // 34: a pod created by hand with the label does not) register epoch 1: synced 1.
            let made = jobset_pods(&pods, "sync", 2).await;
            let (w0, w1) = (made[0].as_str(), made[1].as_str());
            for name in [w0, w1] {
                pods.patch(name, &pp, &epoch_patch("1"))
                    .await
                    .unwrap_or_else(|e| panic!("{name} at 1: {e}"));
            }
            let want = |d: Option<i64>, s: Option<i64>| {
                let jobsets = jobsets.clone();
                move || {
                    let jobsets = jobsets.clone();
                    async move {
                        let got = epochs(&jobsets, "sync").await?;
                        (got == (d, s)).then_some(()).ok_or(format!("{got:?}"))
                    }
                }
            };
            eventually("synced 1", Duration::from_secs(30), want(None, Some(1))).await;
            // One pod restarts and registers 2: deprecated 1 (everyone at 1 must restart).
            pods.patch(w0, &pp, &epoch_patch("2"))
                .await
                .expect("w-0 at 2");
            eventually(
                "deprecated 1",
                Duration::from_secs(30),
                want(Some(1), Some(1)),
            )
            .await;

            // The leader dies without releasing; the other takes over when the lease expires.
            let second = Reconciler::start(&cluster, "real-cluster-b").await;
            first.kill().await;
            eventually(
                "b takes the lease over",
                Duration::from_secs(60),
                || async {
                    let holder = lease_holder(&cluster).await?;
                    (holder == "real-cluster-b").then_some(()).ok_or(holder)
                },
            )
            .await;
            pods.patch(w1, &pp, &epoch_patch("2"))
                .await
                .expect("w-1 at 2");
            eventually(
                "synced 2 by the new leader",
                Duration::from_secs(30),
                want(Some(1), Some(2)),
            )
            .await;
            second.kill().await;
            drop(ns);
        },
    )
    .await;
}

/// Issue 34 item 4, on the real API server with JobSet's and the Job controller: pods labelled
/// with a JobSet's name that no Job of it controls — one with an epoch annotation of 2147483647
/// and no owner, one at the next epoch and no owner, one whose controller reference names a Job
/// of another JobSet — neither fail the JobSet nor start a group restart (before, the second
/// deprecated the synced epoch at once); each is said once as a Warning. The pods the real
/// controllers made keep counting: a group restart of theirs goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_no_job_of_the_jobset_controls_do_not_count() {
    with_cluster(
        "pods_no_job_of_the_jobset_controls_do_not_count",
        |cluster| async move {
            if !jobset_controller_runs(&cluster).await {
                panic!("JobSet's controller is not running (scripts/control-plane.sh starts it)");
            }
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-members").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            let pp = PatchParams::default();
            for (name, count) in [("own", 2), ("other", 1)] {
                jobsets
                    .create(&PostParams::default(), &plain_in_place_jobset(name, &ns.name, count))
                    .await
                    .unwrap_or_else(|e| panic!("create the JobSet {name}: {e}"));
            }
            let reconciler = Reconciler::start(&cluster, "real-cluster-members").await;
            reconciler.ready().await;
            let made = jobset_pods(&pods, "own", 2).await;
            let other = jobset_pods(&pods, "other", 1).await;
            for name in &made {
                pods.patch(name, &pp, &epoch_patch("1"))
                    .await
                    .unwrap_or_else(|e| panic!("{name} at 1: {e}"));
            }
            let want = |d: Option<i64>, s: Option<i64>| {
                let jobsets = jobsets.clone();
                move || {
                    let jobsets = jobsets.clone();
                    async move {
                        let got = epochs(&jobsets, "own").await?;
                        (got == (d, s)).then_some(()).ok_or(format!("{got:?}"))
                    }
                }
            };
            try_eventually(Duration::from_secs(60), want(None, Some(1)))
                .await
                .unwrap_or_else(|e| panic!("synced 1: {e}\nreconciler:\n{}", reconciler.log_tail()));

            // The strangers, created as any pod creator of the namespace can.
            let other_job = pods
                .get(&other[0])
                .await
                .expect("other's pod")
                .metadata
                .owner_references
                .unwrap_or_default();
            let stranger = |name: &str, epoch: &str, owners: Option<&Value>| {
                let mut p = json!({
                    "metadata": {"name": name,
                                 "labels": {"jobset.sigs.k8s.io/jobset-name": "own"},
                                 "annotations": {EPOCH_ANNOTATION: epoch}},
                    "spec": {"containers": [{"name": "worker", "image": "registry.example/worker:1"}]}
                });
                if let Some(o) = owners {
                    p["metadata"]["ownerReferences"] = o.clone();
                }
                serde_json::from_value::<Pod>(p).expect("pod")
            };
            let borrowed = serde_json::to_value(&other_job).expect("owners");
            for p in [
                stranger("forged-max", "2147483647", None),
                stranger("forged-next", "2", None),
                stranger("borrowed", "2", Some(&borrowed)),
            ] {
                pods.create(&PostParams::default(), &p)
                    .await
                    .unwrap_or_else(|e| panic!("create a stranger: {e}"));
            }
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            for name in ["forged-max", "forged-next", "borrowed"] {
                try_eventually(Duration::from_secs(30), || async {
                    let list = events
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let said = list
                        .items
                        .iter()
                        .filter(|e| {
                            e.reason.as_deref() == Some("PodNotOfJobSet")
                                && e.type_.as_deref() == Some("Warning")
                                && e.note
                                    .as_deref()
                                    .is_some_and(|n| n.starts_with(&format!("pod {name} ")))
                        })
                        .count();
                    (said == 1).then_some(()).ok_or(format!("{said} events"))
                })
                .await
                .unwrap_or_else(|e| {
                    panic!("{name} said once: {e}\nreconciler:\n{}", reconciler.log_tail())
                });
            }
            // Time for a wrong decision to land: none does.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let js = jobsets.get("own").await.expect("own");
            assert_eq!(
                epochs(&jobsets, "own").await.expect("epochs"),
                (None, Some(1)),
                "no group restart"
            );
            assert_ne!(js.data["status"]["terminalState"], "Failed", "{}", js.data["status"]);
            let failed = js.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Failed" && c["status"] == "True");
            assert!(!failed, "{}", js.data["status"]);

            // The real pods restart as ever.
            pods.patch(&made[0], &pp, &epoch_patch("2"))
                .await
                .expect("at 2");
            eventually("deprecated 1", Duration::from_secs(30), want(Some(1), Some(1))).await;
            pods.patch(&made[1], &pp, &epoch_patch("2"))
                .await
                .expect("at 2");
            eventually("synced 2", Duration::from_secs(30), want(Some(1), Some(2))).await;
            reconciler.kill().await;
            drop(ns);
        },
    )
    .await;
}
