//! Kueue with the product: a JobSet admitted, preempted and admitted again keeps its injection;
//! Kueue's eviction of pods that stay unready; doctor's warning where Kueue would evict a group
//! restart.

use super::*;

/// The InPlaceRestart JobSet `name` of 2 pods asking 1 CPU each, in Kueue's LocalQueue `queue`
/// (at `priority` when given).
fn queued_jobset(
    namespace: &str,
    name: &str,
    queue: &str,
    priority: Option<&str>,
) -> DynamicObject {
    let mut js = serde_json::to_value(train_jobset(namespace, 2)).expect("json");
    js["metadata"]["name"] = json!(name);
    js["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": queue});
    if let Some(p) = priority {
        js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = json!(p);
    }
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "1"}, "limits": {"cpu": "1"}});
    serde_json::from_value(js).expect("JobSet")
}

/// A ClusterQueue's resource group: room for one `queued_jobset` (2 pods of 1 CPU each, plus
/// what the injected agent requests: it counts against the quota like any container), not two.
fn kueue_quota(flavor: &str) -> Value {
    KueueQueue::quota(flavor, "3", "64Gi")
}

async fn suspended(jobsets: &Api<DynamicObject>, name: &str) -> Result<bool, String> {
    let js = jobsets.get(name).await.map_err(|e| e.to_string())?;
    Ok(js.data["spec"]["suspend"].as_bool().unwrap_or(false))
}

/// Kueue in front of InPlaceRestart JobSets: a JobSet in a LocalQueue is created suspended
/// (Kueue's webhook) and injected (ours); admitted by its ClusterQueue it is resumed and its
/// Jobs' pod templates carry the agent. Preempted by a JobSet of a higher WorkloadPriorityClass
/// that needs the whole quota, it is evicted (suspended: its Jobs go) and requeued; once the
/// quota is free again it is admitted and resumed with the agent still injected. Through all of
/// it the reconciler counts no group restart and the JobSet's epochs stay level (a suspension is
/// not a restart) and JobSet counts no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_admitted_preempted_and_readmitted_by_kueue_keeps_its_injection_and_counts_no_restart()
 {
    const TEST: &str = "a_jobset_admitted_preempted_and_readmitted_by_kueue_keeps_its_injection_and_counts_no_restart";
    with_cluster(TEST, |cluster| async move {
        if !addon_started(&cluster, TEST, "kueue") {
            return;
        }
        let webhook = serve_webhook(&cluster).await;
        let ns = TestNamespace::create(&cluster, "rc-kueue").await;
        let high = format!("{}-high", ns.name);
        let _leftovers = ClusterObjects {
            kubeconfig: cluster.kubeconfig.clone(),
            objects: vec![("workloadpriorityclass.kueue.x-k8s.io", high.clone())],
        };
        create_eventually(
            &api_of(&cluster.client, PRIORITY_CLASS, None),
            json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": high}, "value": 1000}),
        )
        .await;
        // Quota for one JobSet, not two.
        let _queue = KueueQueue::create(
            &cluster,
            &ns.name,
            kueue_quota,
            json!({"preemption": {"withinClusterQueue": "LowerPriority"}}),
        )
        .await;

        let jobsets = jobset_api(&cluster.client, &ns.name);
        create_injected(&jobsets, &queued_jobset(&ns.name, "low", "lq", None))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let reconciler = Reconciler::start(&cluster, "real-cluster-kueue").await;
        reconciler.ready().await;

        // Admitted: resumed, and the Jobs' pod templates carry the agent.
        eventually("low admitted", Duration::from_secs(90), || async {
            let (conditions, _) = workload_of(&cluster.client, &ns.name, "low").await?;
            let admitted = conditions.get("Admitted").is_some_and(|c| c.0 == "True");
            (admitted && !suspended(&jobsets, "low").await?)
                .then_some(())
                .ok_or(format!("{conditions:?}"))
        })
        .await;
        let agents = eventually("the Jobs of low", Duration::from_secs(60), || {
            jobs_agents(&cluster.client, &ns.name, "low", 1)
        })
        .await;
        assert!(
            agents.iter().all(|a| a == "jobset-inplace-agent"),
            "{agents:?}"
        );

        // Preempted by a JobSet that needs the whole quota: low is evicted, suspended (its Jobs
        // go), and requeued; high runs.
        create_injected(
            &jobsets,
            &queued_jobset(&ns.name, "high", "lq", Some(&high)),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        eventually(
            "low evicted, suspended and requeued",
            Duration::from_secs(90),
            || async {
                let (conditions, _) = workload_of(&cluster.client, &ns.name, "low").await?;
                let preempted = conditions.get("Preempted").is_some_and(|c| c.0 == "True")
                    || conditions
                        .get("Evicted")
                        .is_some_and(|c| c.1 == "Preempted");
                let reserved = conditions
                    .get("QuotaReserved")
                    .is_some_and(|c| c.0 == "True");
                (preempted && !reserved && suspended(&jobsets, "low").await?)
                    .then_some(())
                    .ok_or(format!("{conditions:?}"))
            },
        )
        .await;
        eventually("high admitted", Duration::from_secs(90), || async {
            (!suspended(&jobsets, "high").await?)
                .then_some(())
                .ok_or("suspended".to_owned())
        })
        .await;
        eventually("low's Jobs suspended", Duration::from_secs(60), || async {
            let jobs: Api<k8s_openapi::api::batch::v1::Job> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            let list = jobs
                .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=low"))
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .all(|j| j.spec.as_ref().and_then(|s| s.suspend) == Some(true))
                .then_some(())
                .ok_or(format!("{} Jobs, not all suspended", list.items.len()))
        })
        .await;

        // The quota free again: low is admitted again and resumed, injected as before.
        jobsets
            .delete("high", &DeleteParams::background())
            .await
            .expect("delete high");
        eventually("low readmitted", Duration::from_secs(120), || async {
            let (conditions, _) = workload_of(&cluster.client, &ns.name, "low").await?;
            let admitted = conditions.get("Admitted").is_some_and(|c| c.0 == "True");
            (admitted && !suspended(&jobsets, "low").await?)
                .then_some(())
                .ok_or(format!("{conditions:?}"))
        })
        .await;
        let agents = eventually("the Jobs of low again", Duration::from_secs(60), || {
            jobs_agents(&cluster.client, &ns.name, "low", 1)
        })
        .await;
        assert!(
            agents.iter().all(|a| a == "jobset-inplace-agent"),
            "{agents:?}"
        );
        let low = settled(&jobsets, "low").await;
        assert_eq!(agent_of_template(&low), "jobset-inplace-agent");
        assert_eq!(
            low.data["spec"]["failurePolicy"]["restartStrategy"],
            "InPlaceRestart"
        );

        // No group restart: none counted by the reconciler, none by JobSet, epochs level.
        let restarts = metric_sum(
            reconciler.health,
            "jobset_inplace_reconciler_group_restarts_total",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("the reconciler's metrics: {e}"));
        assert_eq!(
            restarts,
            0.0,
            "a suspension counted as a group restart\n{}",
            reconciler.log_tail()
        );
        assert_eq!(
            low.data["status"]["restarts"].as_i64().unwrap_or(0),
            0,
            "{:?}",
            low.data["status"]
        );
        let (deprecated, synced) = epochs(&jobsets, "low").await.expect("epochs");
        assert!(
            deprecated.unwrap_or(0) <= synced.unwrap_or(0),
            "a restart in progress after a resume: deprecated {deprecated:?}, synced {synced:?}"
        );

        reconciler.kill().await;
        webhook.stop().await;
        delete_webhook_configurations(&cluster).await;
        drop(ns);
    })
    .await;
}

/// The `waitForPodsReady.recoveryTimeout` Kueue runs with here (`DIR/kueue/config.yaml`).
fn kueue_recovery_timeout(cluster: &Cluster) -> Duration {
    let path = cluster
        .kubeconfig
        .parent()
        .map(|d| d.join("kueue/config.yaml"))
        .unwrap_or_default();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("recoveryTimeout:"))
        .map(str::trim)
        .and_then(|v| v.strip_suffix('s'))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{}: no recoveryTimeout in whole seconds", path.display()));
    Duration::from_secs(value)
}

/// Writes `pod`'s status as a kubelet would for a running pod, ready or not (the containers of
/// a group restart are not).
async fn set_ready(pods: &Api<Pod>, pod: &str, ready: bool) -> Result<(), String> {
    let status = if ready { "True" } else { "False" };
    pods.patch_status(
        pod,
        &PatchParams::default(),
        &merge(json!({"status": {"phase": "Running", "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": status},
            {"type": "Ready", "status": status}]}})),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{pod}: {e}"))
}

/// Kueue's `waitForPodsReady` against a group restart, with the pods' status written as a kubelet
/// writes it (no kubelet runs here): once the JobSet's pods were ready, a stretch of unready pods
/// (what a group restart is, until every worker runs again) shorter than `recoveryTimeout` leaves
/// the workload admitted (`PodsReady` back to True, reason `Recovered`); one longer gets it evicted
/// (`PodsReadyTimeout`) no earlier than `recoveryTimeout` after the pods went unready, the JobSet
/// suspended and requeued. docs/operations.md says which setting a group restart needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_evicts_a_jobset_whose_pods_stay_unready_past_recovery_timeout_only() {
    const TEST: &str = "kueue_evicts_a_jobset_whose_pods_stay_unready_past_recovery_timeout_only";
    with_cluster(TEST, |cluster| async move {
        if !addon_started(&cluster, TEST, "kueue") {
            return;
        }
        let recovery = kueue_recovery_timeout(&cluster);
        let webhook = serve_webhook(&cluster).await;
        let ns = TestNamespace::create(&cluster, "rc-podsready").await;
        // The agent's ServiceAccount, which the reconciler would provision: the pods name it.
        let account: ServiceAccount = serde_json::from_value(
            json!({"metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": ns.name}}),
        )
        .expect("ServiceAccount");
        Api::<ServiceAccount>::namespaced(cluster.client.clone(), &ns.name)
            .create(&PostParams::default(), &account)
            .await
            .expect("the agent's ServiceAccount");
        let _queue = KueueQueue::create(&cluster, &ns.name, kueue_quota, json!({})).await;
        let jobsets = jobset_api(&cluster.client, &ns.name);
        create_injected(&jobsets, &queued_jobset(&ns.name, "train", "lq", None))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
        let selector = ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=train");
        let running = || async {
            let list = pods.list(&selector).await.map_err(|e| e.to_string())?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            (names.len() == 2)
                .then_some(names)
                .ok_or(format!("{} pods", list.items.len()))
        };
        let names = eventually(
            "2 pods of the admitted JobSet",
            Duration::from_secs(90),
            running,
        )
        .await;
        let pods_ready = |want: &'static str| {
            let client = cluster.client.clone();
            let ns = ns.name.clone();
            move || {
                let (client, ns) = (client.clone(), ns.clone());
                async move {
                    let (conditions, _) = workload_of(&client, &ns, "train").await?;
                    let got = conditions.get("PodsReady").cloned().unwrap_or_default();
                    let evicted = conditions.get("Evicted").is_some_and(|c| c.0 == "True");
                    (got.0 == want && !evicted)
                        .then_some(got.1.clone())
                        .ok_or(format!("{conditions:?}"))
                }
            }
        };
        for p in &names {
            set_ready(&pods, p, true)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        eventually("PodsReady", Duration::from_secs(60), pods_ready("True")).await;

        // A group restart shorter than recoveryTimeout: unready, then ready again; not evicted.
        for p in &names {
            set_ready(&pods, p, false)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let reason = eventually(
            "PodsReady False",
            Duration::from_secs(30),
            pods_ready("False"),
        )
        .await;
        assert_eq!(reason, "WaitForRecovery");
        for p in &names {
            set_ready(&pods, p, true)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let reason = eventually(
            "PodsReady again",
            Duration::from_secs(30),
            pods_ready("True"),
        )
        .await;
        assert_eq!(reason, "Recovered");

        // One longer than recoveryTimeout: evicted, not before it, suspended and requeued.
        let unready = Instant::now();
        for p in &names {
            set_ready(&pods, p, false)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let reason = eventually(
            "evicted for PodsReadyTimeout",
            recovery + Duration::from_secs(60),
            || async {
                let (conditions, _) = workload_of(&cluster.client, &ns.name, "train").await?;
                match conditions.get("Evicted") {
                    Some((status, reason)) if status == "True" => Ok(reason.clone()),
                    _ => Err(format!("{conditions:?}")),
                }
            },
        )
        .await;
        let after = unready.elapsed();
        assert_eq!(reason, "PodsReadyTimeout");
        assert!(
            after + Duration::from_secs(1) >= recovery,
            "evicted {after:?} after the pods went unready, before recoveryTimeout {recovery:?}"
        );
        eprintln!("evicted {after:?} after the pods went unready (recoveryTimeout {recovery:?})");
        eventually(
            "requeued and admitted again",
            Duration::from_secs(120),
            || async {
                let (conditions, _) = workload_of(&cluster.client, &ns.name, "train").await?;
                let admitted = conditions.get("Admitted").is_some_and(|c| c.0 == "True");
                (admitted && !suspended(&jobsets, "train").await?)
                    .then_some(())
                    .ok_or(format!("{conditions:?}"))
            },
        )
        .await;

        webhook.stop().await;
        delete_webhook_configurations(&cluster).await;
        drop(ns);
    })
    .await;
}

/// Kueue's configuration where its release keeps it (`up --with kueue` writes it there too).
const KUEUE_CONFIG_MAP: &str = "kueue-manager-config";

const KUEUE_CONFIG_KEY: &str = "controller_manager_config.yaml";

/// `doctor`'s `kueue-wait-for-pods-ready` on the real control plane, from Kueue's ConfigMap
/// `kueue-system/kueue-manager-config` (no reconciler Deployment here: the group-restart timeout
/// is the default 2m, so recoveryTimeout must exceed 4m): the configuration Kueue runs with here
/// (recoveryTimeout 20s) warns with what to set; the ConfigMap changed to a recoveryTimeout of 5m
/// passes, to 4m warns, to `0s` passes; a namespace without the ConfigMap (no Kueue) passes and
/// says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_warns_where_kueue_would_evict_a_group_restart() {
    const TEST: &str = "doctor_warns_where_kueue_would_evict_a_group_restart";
    with_cluster(TEST, |cluster| async move {
        if !addon_started(&cluster, TEST, "kueue") {
            return;
        }
        let recovery = kueue_recovery_timeout(&cluster);
        assert!(recovery < Duration::from_secs(240), "{recovery:?}");
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(cluster.client.clone(), "kueue-system");
        let original = maps
            .get(KUEUE_CONFIG_MAP)
            .await
            .expect("kueue-system/kueue-manager-config, written by control-plane.sh");
        let text = original
            .data
            .as_ref()
            .and_then(|d| d.get(KUEUE_CONFIG_KEY))
            .cloned()
            .expect("controller_manager_config.yaml");
        let check = || async {
            let (report, _) = doctor(&cluster, &[], &["--read-only"]).await;
            finding(&report, "kueue-wait-for-pods-ready")
        };
        let with_recovery = |value: &str| {
            let lines: Vec<String> = text
                .lines()
                .map(|l| match l.split_once("recoveryTimeout:") {
                    Some((indent, _)) => format!("{indent}recoveryTimeout: {value}"),
                    None => l.to_owned(),
                })
                .collect();
            merge(json!({"data": {KUEUE_CONFIG_KEY: lines.join("\n")}}))
        };

        let f = check().await;
        assert_eq!(f["verdict"], "warn", "{f:#}");
        let detail = f["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!("recoveryTimeout {}s", recovery.as_secs()))
                && detail.contains("PodsReadyTimeout")
                && detail.contains("the reconciler's default 2m"),
            "{f:#}"
        );
        assert!(
            f["fix"]
                .as_str()
                .is_some_and(|x| x.contains("above 4m") && x.contains("kueue-manager-config")),
            "{f:#}"
        );

        for (value, verdict) in [("5m", "ok"), ("4m", "warn"), ("0s", "ok")] {
            maps.patch(
                KUEUE_CONFIG_MAP,
                &PatchParams::default(),
                &with_recovery(value),
            )
            .await
            .expect("change the ConfigMap");
            let f = check().await;
            assert_eq!(f["verdict"], verdict, "recoveryTimeout {value}: {f:#}");
        }
        maps.patch(
            KUEUE_CONFIG_MAP,
            &PatchParams::default(),
            &merge(json!({"data": {KUEUE_CONFIG_KEY: text}})),
        )
        .await
        .expect("restore the ConfigMap");

        let ns = TestNamespace::create(&cluster, "rc-nokueue").await;
        let (report, _) = doctor(
            &cluster,
            &[],
            &["--read-only", "--kueue-namespace", &ns.name],
        )
        .await;
        let f = finding(&report, "kueue-wait-for-pods-ready");
        assert_eq!(f["verdict"], "ok", "{f:#}");
        assert!(
            f["detail"]
                .as_str()
                .is_some_and(|d| d.contains("no ConfigMap") && d.contains("nothing to check")),
            "{f:#}"
        );
        drop(ns);
    })
    .await;
}
