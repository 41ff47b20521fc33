//! A group restart end to end: a node (testkit/src/node/) binds and runs the pods with the
//! real agent binary, beside the real Job and JobSet controllers

use super::*;

/// A pod as the API shows it: (name, uid, epoch annotation, sidecar restartCount, worker
/// restartCount, worker running, Ready).
type PodRow = (String, String, Option<String>, i64, i64, bool, bool);

fn pod_row(p: &Pod) -> PodRow {
    let v = serde_json::to_value(p).unwrap_or_default();
    let s = |ptr: &str| v.pointer(ptr).and_then(Value::as_str).map(str::to_owned);
    let n = |ptr: &str| v.pointer(ptr).and_then(Value::as_i64).unwrap_or(-1);
    let ready = v
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
    (
        s("/metadata/name").unwrap_or_default(),
        s("/metadata/uid").unwrap_or_default(),
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(EPOCH_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::to_owned),
        n("/status/initContainerStatuses/0/restartCount"),
        n("/status/containerStatuses/0/restartCount"),
        v.pointer("/status/containerStatuses/0/state/running")
            .is_some(),
        ready,
    )
}

/// The KEP-467 group restart against kube-apiserver 1.35, the Job controller and JobSet v0.12's
/// controller: a plain InPlaceRestart JobSet of 3 pods is injected by our webhook, made by the
/// real controllers, bound and run by a node of the test kit ([`jobset_inplace_testkit::node`])
/// with the real agent binary in each pod (a token bound to its pod); every worker runs at synced
/// epoch 1. One worker then exits with the restart code: its pod restarts all its containers in
/// place, its new agent registers epoch 2, the reconciler deprecates 1, the other agents exit and
/// their pods restart in place too; synced 2, every worker runs again behind a lifted barrier,
/// same pods (UIDs), restart counts 1, no pod failed or recreated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_restart_runs_in_place_on_a_node_through_the_real_controllers() {
    use jobset_inplace_testkit::node::{Node, NodeConfig};
    const PODS: usize = 3;
    const RESTART_CODE: i32 = 42;
    with_cluster(
        "a_group_restart_runs_in_place_on_a_node_through_the_real_controllers",
        |cluster| async move {
            if !jobset_controller_runs(&cluster).await {
                panic!("JobSet's controller is not running (scripts/control-plane.sh starts it)");
            }
            let webhook = serve_webhook(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-node").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            let published: Api<JobSetEpoch> = Api::namespaced(cluster.client.clone(), &ns.name);

            create_injected(&jobsets, &train_jobset(&ns.name, PODS))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            // After the JobSet exists (see a_jobset_runs_through_the_real_controllers_...).
            let reconciler = Reconciler::start(&cluster, "real-cluster-node").await;
            reconciler.ready().await;

            // The node: the worker asks for 4 google.com/tpu (the fixture's), so it has them.
            let node_name = format!("node-{}", ns.name);
            let mut config = NodeConfig::new(
                &node_name,
                &ns.name,
                env!("CARGO_BIN_EXE_jobset-inplace"),
                &cluster.server,
                &cluster.ca_data,
                env!("CARGO_TARGET_TMPDIR"),
            );
            config
                .capacity
                .insert("google.com/tpu".into(), (4 * PODS).to_string());
            let _node_cleanup = NodeCleanup {
                kubeconfig: cluster.kubeconfig.clone(),
                name: node_name.clone(),
            };
            let node = Node::start(cluster.client.clone(), config)
                .await
                .unwrap_or_else(|e| panic!("start the node: {e}"));
            let diagnose = |node: &Node| {
                format!(
                    "\nreconciler:\n{}\nnode {}:\n{}",
                    reconciler.log_tail(),
                    node.name(),
                    node.log_tail(150)
                )
            };
            let selector = ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=train");
            let rows = || async {
                let list = pods.list(&selector).await.map_err(|e| e.to_string())?;
                let mut rows: Vec<PodRow> = list.items.iter().map(pod_row).collect();
                rows.sort();
                Ok::<_, String>(rows)
            };
            let synced = || async {
                let e = published
                    .get_opt("train")
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|o| o.epochs)
                    .ok_or("no JobSetEpoch yet")?;
                Ok::<_, String>((e.deprecated, e.synced))
            };

            // Every pod bound to the node and running its worker at synced epoch 1.
            let started = Instant::now();
            let first = try_eventually(Duration::from_secs(120), || async {
                let rows = rows().await?;
                let epochs = synced().await?;
                let all = rows.len() == PODS
                    && rows
                        .iter()
                        .all(|r| r.2.as_deref() == Some("1") && r.3 == 0 && r.4 == 0 && r.5 && r.6);
                let views = node.pods();
                let running = views.iter().filter(|v| v.worker_running).count();
                (all && epochs.1 == Some(1) && running == PODS)
                    .then_some(rows.clone())
                    .ok_or_else(|| {
                        format!("pods {rows:?}, published {epochs:?}, {running} workers running")
                    })
            })
            .await
            .unwrap_or_else(|e| panic!("every worker running at epoch 1: {e}{}", diagnose(&node)));
            eprintln!(
                "{PODS} pods running at synced epoch 1 after {:?}",
                started.elapsed()
            );
            let uids: Vec<(String, String)> =
                first.iter().map(|r| (r.0.clone(), r.1.clone())).collect();
            for p in pods.list(&selector).await.expect("pods").items {
                let name = p.metadata.name.clone().unwrap_or_default();
                let spec = p.spec.as_ref().expect("spec");
                assert_eq!(
                    spec.node_name.as_deref(),
                    Some(node_name.as_str()),
                    "{name}"
                );
                assert_eq!(
                    spec.service_account_name.as_deref(),
                    Some(AGENT_SERVICE_ACCOUNT),
                    "{name}"
                );
            }
            let status = epochs(&jobsets, "train").await.expect("epochs");
            assert!(
                status.1.is_none() || status.1 == Some(1),
                "the JobSet's status: {status:?}"
            );

            // One worker exits with the restart code: a group restart.
            let failing = &uids[0].0;
            let restart = Instant::now();
            node.exit_worker(failing, RESTART_CODE)
                .unwrap_or_else(|e| panic!("{e}{}", diagnose(&node)));
            let after = try_eventually(Duration::from_secs(90), || async {
                let rows = rows().await?;
                let epochs = synced().await?;
                let views = node.pods();
                let running = views
                    .iter()
                    .filter(|v| v.worker_running && v.worker_starts == 2 && v.restarts == 1)
                    .count();
                let all = rows.len() == PODS
                    && rows
                        .iter()
                        .all(|r| r.2.as_deref() == Some("2") && r.3 == 1 && r.4 == 1 && r.5 && r.6);
                (all && epochs == (Some(1), Some(2)) && running == PODS)
                    .then_some(rows.clone())
                    .ok_or_else(|| {
                        format!(
                            "pods {rows:?}, published {epochs:?}, {running} workers restarted \
                             and running; node: {views:?}"
                        )
                    })
            })
            .await
            .unwrap_or_else(|e| panic!("the group restart: {e}{}", diagnose(&node)));
            let took = restart.elapsed();
            eprintln!("group restart of {PODS} pods in place: {took:?}");
            let same: Vec<(String, String)> =
                after.iter().map(|r| (r.0.clone(), r.1.clone())).collect();
            assert_eq!(same, uids, "the same pods (names and UIDs): none recreated");
            // The Job controller saw no pod fail, and the JobSet's status follows (synced 2
            // once the reconciler has written it, beside JobSet's own writes).
            let jobs: Api<k8s_openapi::api::batch::v1::Job> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            for job in jobs.list(&ListParams::default()).await.expect("jobs").items {
                let status = job.status.unwrap_or_default();
                assert_eq!(status.failed.unwrap_or(0), 0, "no pod of the Job failed");
            }
            // The Job controller counts the pods Ready again from the statuses the node wrote
            // (in its batches), and JobSet's controller its Job.
            let counted = try_eventually(Duration::from_secs(30), || async {
                let js = jobsets.get("train").await.map_err(|e| e.to_string())?;
                let rj = &js.data["status"]["replicatedJobsStatus"][0];
                let job = jobs
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = job.items.first().and_then(|j| j.status.as_ref()?.ready);
                (ready == Some(PODS as i32) && rj["ready"] == 1 && rj["failed"] == 0)
                    .then_some(())
                    .ok_or(format!("Job ready {ready:?}, JobSet {rj}"))
            })
            .await;
            assert!(
                counted.is_ok(),
                "counted ready: {counted:?}{}",
                diagnose(&node)
            );
            let status = try_eventually(Duration::from_secs(30), || async {
                let got = epochs(&jobsets, "train").await?;
                (got == (Some(1), Some(2)))
                    .then_some(got)
                    .ok_or(format!("{got:?}"))
            })
            .await;
            assert!(
                status.is_ok(),
                "the JobSet's status: {status:?}{}",
                diagnose(&node)
            );
            // The barrier holds: every pod's agent registered 2 before any worker ran again, so
            // no worker started twice in one epoch.
            let views = node.pods();
            for v in &views {
                assert_eq!(
                    (v.agent_starts, v.worker_starts, v.restarts),
                    (2, 2, 1),
                    "{v:?}"
                );
            }
            // No two generations ran together: every worker of the first run had stopped
            // before any worker of the second started (the node's own clock).
            let last_stop = views.iter().filter_map(|v| v.worker_runs[0].1).max();
            let first_start = views.iter().map(|v| v.worker_runs[1].0).min();
            assert!(
                matches!((last_stop, first_start), (Some(stop), Some(start)) if stop < start),
                "a worker of epoch 2 started before every worker of epoch 1 stopped: {views:?}"
            );

            // Clean up: the namespace goes while the node runs (it stops the deleted pods and
            // deletes them), then the node.
            reconciler.kill().await;
            webhook.stop().await;
            delete_webhook_configurations(&cluster).await;
            drop(ns);
            let gone = try_eventually(Duration::from_secs(60), || async {
                let left = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                left.items
                    .is_empty()
                    .then_some(())
                    .ok_or(format!("{} pods left", left.items.len()))
            })
            .await;
            let log = node.log_tail(40);
            node.stop()
                .await
                .unwrap_or_else(|e| panic!("stop the node: {e}"));
            gone.unwrap_or_else(|e| panic!("the namespace's pods deleted: {e}\nnode:\n{log}"));
        },
    )
    .await;
}
