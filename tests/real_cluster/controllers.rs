//! The whole path with JobSet's and the Job controller: webhook, reconciler, agents' writes

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_runs_through_the_real_controllers_with_the_agent_injected() {
    with_cluster(
        "a_jobset_runs_through_the_real_controllers_with_the_agent_injected",
        |cluster| async move {
            if !jobset_controller_runs(&cluster).await {
                panic!("JobSet's controller is not running (scripts/control-plane.sh starts it)");
            }
            let webhook = serve_webhook(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-jobset").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);

            // A plain InPlaceRestart JobSet of 2 pods (no exclusive placement: nothing schedules).
            create_injected(&jobsets, &train_jobset(&ns.name, 2))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            // The reconciler starts after the JobSet exists, so that its initial list has it.
            // Started before (right after install() changed the CRD's schema, on a fresh
            // cluster), it was ready and the leader but never saw the JobSet created next, 2
            // minutes long, in 3 runs of 3; not explained yet (kubectl's watch saw such a
            // JobSet): see docs/testing.md.
            let reconciler = Reconciler::start(&cluster, "real-cluster-e").await;
            reconciler.ready().await;

            // JobSet's controller makes the Job, the Job controller the pods (once the reconciler
            // has provisioned the agent's ServiceAccount they name). The API server keeps the
            // injected agent and both restart rules: the 1.35 feature gates are on.
            let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), &ns.name);
            let made = try_eventually(Duration::from_secs(120), || async {
                let list = pods
                    .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=train"))
                    .await
                    .map_err(|e| e.to_string())?;
                let provisioned = accounts
                    .get_opt(AGENT_SERVICE_ACCOUNT)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some();
                (list.items.len() == 2)
                    .then_some(list.items)
                    .ok_or_else(|| {
                        format!("not yet; agent ServiceAccount provisioned: {provisioned}")
                    })
            })
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "2 pods of the JobSet: {e}\nreconciler:\n{}",
                    reconciler.log_tail()
                )
            });
            for p in &made {
                let name = p.metadata.name.clone().unwrap_or_default();
                let spec = serde_json::to_value(p.spec.as_ref().expect("spec")).expect("json");
                assert_eq!(spec["serviceAccountName"], AGENT_SERVICE_ACCOUNT, "{name}");
                let agent = &spec["initContainers"][0];
                assert_eq!(agent["name"], "jobset-inplace-agent", "{name}: {spec}");
                assert_eq!(agent["restartPolicy"], "Always", "{name}");
                assert_eq!(
                    agent["restartPolicyRules"][0]["action"], "RestartAllContainers",
                    "{name}: the agent's rule survives the API server: {agent}"
                );
                assert_eq!(
                    spec["containers"][0]["restartPolicyRules"][0]["action"],
                    "RestartAllContainers",
                    "{name}: the worker's rule survives the API server"
                );
            }

            // Each pod's agent registers epoch 1 with a token bound to its pod, as the agent does;
            // the reconciler syncs 1 (and keeps it against JobSet's own status writes).
            for p in &made {
                let name = p.metadata.name.clone().unwrap_or_default();
                let token = agent_token(&cluster, &ns.name, Some(p)).await;
                let agent = token_client(&cluster, &token).await;
                let own: Api<Pod> = Api::namespaced(agent, &ns.name);
                eventually(
                    &format!("{name} registers"),
                    Duration::from_secs(30),
                    || async {
                        own.patch(&name, &PatchParams::default(), &epoch_patch("1"))
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    },
                )
                .await;
            }
            try_eventually(Duration::from_secs(60), || async {
                let got = epochs(&jobsets, "train").await?;
                (got.1 == Some(1)).then_some(()).ok_or(format!("{got:?}"))
            })
            .await
            .unwrap_or_else(|e| panic!("synced 1: {e}\nreconciler:\n{}", reconciler.log_tail()));
            tokio::time::sleep(Duration::from_secs(3)).await;
            let got = epochs(&jobsets, "train").await.expect("epochs");
            assert_eq!(got.1, Some(1), "synced stays 1 beside JobSet's controller");

            reconciler.kill().await;
            webhook.stop().await;
            delete_webhook_configurations(&cluster).await;
            drop(ns);
        },
    )
    .await;
}
