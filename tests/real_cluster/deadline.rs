//! The group-restart deadline through JobSet's and the Job controller

use super::*;

/// A group restart one pod never joins (nothing registers for it here: no kubelet), with the
/// JobSet's annotation asking for a 20 s deadline: the reconciler, with its deployed RBAC and its
/// policy, marks the pod Failed and deletes it, and the Job controller replaces it (after its
/// pod-failure backoff, 10 s for a first failure: a shorter window would recreate the JobSet
/// first); the replacement does not register either, and the reconciler recreates the JobSet:
/// `status.restarts` 1, its Job deleted, and JobSet's controller creates it again at
/// `restart-attempt` 1, with new pods. JobSet's controller wipes the `epoch` dialect's fields with
/// each status it writes meanwhile; the reconciler writes them again and keeps its clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_restart_that_does_not_complete_is_recreated_through_the_real_controllers() {
    with_cluster(
        "a_group_restart_that_does_not_complete_is_recreated_through_the_real_controllers",
        |cluster| async move {
            if !jobset_controller_runs(&cluster).await {
                panic!("JobSet's controller is not running (scripts/control-plane.sh starts it)");
            }
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-deadline").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            let jobs: Api<k8s_openapi::api::batch::v1::Job> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            let pp = PatchParams::default();

            let mut js = fixture_object("story1-plain");
            js["metadata"] = json!({"name": "late", "namespace": ns.name,
                "annotations": {"jobset-inplace.dev/group-restart-timeout": "20s"}});
            js["spec"]["failurePolicy"]["maxRestarts"] = json!(3);
            let job = &mut js["spec"]["replicatedJobs"][0];
            job["replicas"] = json!(1);
            job["template"]["spec"]["parallelism"] = json!(2);
            job["template"]["spec"]["completions"] = json!(2);
            job["template"]["spec"]["backoffLimit"] = json!(2147483647);
            job["template"]["spec"]["podReplacementPolicy"] = json!("Failed");
            jobsets
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(js).expect("JobSet"),
                )
                .await
                .expect("create the JobSet");
            let reconciler = Reconciler::start(&cluster, "real-cluster-f").await;
            reconciler.ready().await;

            let selector = "jobset.sigs.k8s.io/jobset-name=late";
            let list = || {
                let pods = pods.clone();
                async move {
                    pods.list(&ListParams::default().labels(selector))
                        .await
                        .map(|l| l.items)
                        .map_err(|e| e.to_string())
                }
            };
            let made = eventually("2 pods of the JobSet", Duration::from_secs(120), || async {
                let items = list().await?;
                (items.len() == 2)
                    .then_some(items)
                    .ok_or("not yet".to_owned())
            })
            .await;
            let names: Vec<String> = made
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
            let first_jobs: Vec<(String, String)> = jobs
                .list(&ListParams::default().labels(selector))
                .await
                .expect("jobs")
                .items
                .into_iter()
                .map(|j| {
                    (
                        j.metadata.name.unwrap_or_default(),
                        j.metadata.uid.unwrap_or_default(),
                    )
                })
                .collect();
            assert_eq!(first_jobs.len(), 1, "{first_jobs:?}");
            // Both register 1 (as their agents would); then the first restarts and registers 2.
            for name in &names {
                pods.patch(name, &pp, &epoch_patch("1"))
                    .await
                    .expect("register 1");
            }
            eventually("synced 1", Duration::from_secs(30), || async {
                let got = epochs(&jobsets, "late").await?;
                (got.1 == Some(1)).then_some(()).ok_or(format!("{got:?}"))
            })
            .await;
            pods.patch(&names[0], &pp, &epoch_patch("2"))
                .await
                .expect("register 2");
            eventually("deprecated 1", Duration::from_secs(30), || async {
                let got = epochs(&jobsets, "late").await?;
                (got.0 == Some(1)).then_some(()).ok_or(format!("{got:?}"))
            })
            .await;
            // Step 1: the second pod goes, and the Job controller replaces it.
            let replaced = try_eventually(Duration::from_secs(40), || async {
                let items = list().await?;
                let now: Vec<String> = items
                    .iter()
                    .map(|p| p.metadata.name.clone().unwrap_or_default())
                    .collect();
                if !now.contains(&names[1]) && now.len() == 2 && now.contains(&names[0]) {
                    Ok(now)
                } else {
                    Err(format!("{now:?}"))
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\nreconciler:\n{}", reconciler.log_tail()));
            // Step 2: the JobSet is recreated as JobSet's Recreate does.
            let status = try_eventually(Duration::from_secs(40), || async {
                let js = jobsets.get("late").await.map_err(|e| e.to_string())?;
                let status = js.data["status"].clone();
                (status["restarts"] == 1)
                    .then_some(status.clone())
                    .ok_or(status.to_string())
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\nreconciler:\n{}", reconciler.log_tail()));
            assert_eq!(status["restartsCountTowardsMax"], 1, "{status}");
            let again = try_eventually(Duration::from_secs(90), || async {
                let items = jobs
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let fresh: Vec<(String, String, String)> = items
                    .into_iter()
                    .filter(|j| j.metadata.deletion_timestamp.is_none())
                    .map(|j| {
                        let attempt = j
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("jobset.sigs.k8s.io/restart-attempt"))
                            .cloned()
                            .unwrap_or_default();
                        (
                            j.metadata.name.unwrap_or_default(),
                            j.metadata.uid.unwrap_or_default(),
                            attempt,
                        )
                    })
                    .collect();
                (fresh.len() == 1 && fresh[0].1 != first_jobs[0].1 && fresh[0].2 == "1")
                    .then_some(fresh.clone())
                    .ok_or(format!("{fresh:?}"))
            })
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the Job recreated: {e}\nreconciler:\n{}",
                    reconciler.log_tail()
                )
            });
            assert_eq!(again[0].0, first_jobs[0].0, "the same name");
            let new_pods = eventually("the new Job's pods", Duration::from_secs(60), || async {
                let items = list().await?;
                let now: Vec<String> = items
                    .iter()
                    .map(|p| p.metadata.name.clone().unwrap_or_default())
                    .collect();
                (now.len() == 2
                    && now
                        .iter()
                        .all(|n| !names.contains(n) && !replaced.contains(n)))
                .then_some(now)
                .ok_or("not yet".to_owned())
            })
            .await;
            assert_eq!(new_pods.len(), 2);
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            for reason in [
                "GroupRestartTimedOut",
                "UnregisteredPodsDeleted",
                "FallingBackToRecreate",
            ] {
                eventually(reason, Duration::from_secs(30), || async {
                    let list = events
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    list.items
                        .iter()
                        .any(|e| {
                            e.reason.as_deref() == Some(reason)
                                && e.type_.as_deref() == Some("Warning")
                        })
                        .then_some(())
                        .ok_or("not yet".to_owned())
                })
                .await;
            }
            reconciler.kill().await;
            drop(ns);
        },
    )
    .await;
}
