//! Kubeflow Trainer and Kueue on the real node (`up DIR --node --install epoch --with
//! kueue,trainer`): their controller managers beside the control plane, the pods on the node

use super::*;

/// The addons a run requires (as tests/real_cluster/: CI sets `kueue,trainer`): a test of one
/// that was not started then fails instead of skipping.
const ADDONS_ENV: &str = "JOBSET_INPLACE_REAL_CLUSTER_ADDONS";

/// Whether `addon` was started with the node (`DIR/addons`, written by `up --with`, names it).
/// When not: SKIPPED loudly, or a panic where `JOBSET_INPLACE_REAL_CLUSTER_ADDONS` names it.
fn addon_started(node: &Node, test: &str, addon: &str) -> bool {
    let file = node.dir.join("addons");
    let started = std::fs::read_to_string(&file)
        .map(|text| text.lines().any(|l| l.trim() == addon))
        .unwrap_or(false);
    if started {
        return true;
    }
    let required = std::env::var(ADDONS_ENV).unwrap_or_default();
    if required.split(',').any(|a| a.trim() == addon) {
        panic!(
            "{test}: {ADDONS_ENV}={required} but {} does not name {addon} \
             (scripts/control-plane.sh up DIR --node --install epoch --with {addon})",
            file.display()
        );
    }
    eprintln!(
        "\n!! SKIPPED {test}: {addon} was not started with the node \
         (up DIR --node --install epoch --with {addon}; {} does not name it)\n",
        file.display()
    );
    false
}

/// A TrainJob from a ClusterTrainingRuntime whose JobSet template uses InPlaceRestart, as a user
/// writes it (the shape of the Trainer test of tests/real_cluster/addons.rs: one replicated job `node`,
/// Trainer's `trainer` step, `restartPolicy: Never`, nothing injected; here of the test image on
/// the real node): Trainer makes the JobSet, which comes out injected by the installed webhook;
/// its pods run on the node; a worker fails and every pod restarts in place (same UIDs and IPs,
/// every container's `restartCount` one up, behind the barrier, the epoch one up and synced).
#[tokio::test]
async fn a_trainjob_from_an_in_place_restart_runtime_restarts_in_place_on_the_real_node() {
    const TEST: &str =
        "a_trainjob_from_an_in_place_restart_runtime_restarts_in_place_on_the_real_node";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        if !addon_started(&node, TEST, "trainer") {
            return;
        }
        let mut run = Run::prepare(&node, "rn-trainer", 2, dialect).await;
        // Trainer's `trainer` step must have a container named `node` (its runtime webhook).
        run.set_worker("node");
        let runtime = format!("{}-inplace", run.namespace());
        let _objects = ClusterObjects {
            kubeconfig: node.kubeconfig.clone(),
            objects: vec![(
                "clustertrainingruntime.trainer.kubeflow.org",
                runtime.clone(),
            )],
        };
        // The JobSet `train_jobset` makes, as a runtime's template: the worker without a rule of
        // its own (the webhook gives it one), in Trainer's `trainer` step.
        let mut template =
            serde_json::to_value(train_jobset(run.size, run.records.path(), dialect, |_| {}))
                .expect("json")["spec"]
                .clone();
        let job = &mut template["replicatedJobs"][0];
        job["name"] = json!("node");
        job["template"]["metadata"] =
            json!({"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}});
        let pod = &mut job["template"]["spec"]["template"]["spec"];
        pod["containers"] = json!([recording_container("node", dialect)]);
        for field in ["backoffLimit", "podReplacementPolicy"] {
            if let Some(o) = job["template"]["spec"].as_object_mut() {
                o.remove(field);
            }
        }
        create_eventually(
            &api_of(&node.client, TRAINING_RUNTIME, None),
            json!({"apiVersion": "trainer.kubeflow.org/v1alpha1",
                   "kind": "ClusterTrainingRuntime",
                   "metadata": {"name": runtime},
                   "spec": {"template": {"spec": template}}}),
        )
        .await;
        create_eventually(
            &api_of(&node.client, TRAIN_JOB, Some(run.namespace())),
            json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                   "metadata": {"name": "train"},
                   "spec": {"runtimeRef": {"name": runtime,
                       "kind": "ClusterTrainingRuntime",
                       "apiGroup": "trainer.kubeflow.org"}}}),
        )
        .await;
        let js = eventually("Trainer's JobSet", Duration::from_secs(60), || async {
            run.jobsets.get("train").await.map_err(|e| e.to_string())
        })
        .await;
        assert_injected(&js);
        assert!(
            js.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.kind == "TrainJob")),
            "the JobSet is Trainer's: {:?}",
            js.metadata
        );
        let first = run.running(None, 0, Duration::from_secs(150)).await;
        println!("TrainJob's pods running at epoch {}", first.epoch);
        let (_, took) = group_restart(&run, &first, 3).await;
        println!(
            "TrainJob: every worker running again after {} ms",
            took.as_millis()
        );
    })
    .await;
}

/// Kueue's Workload of JobSet `name`: its conditions by type as (status, reason), and the
/// One sample of what Kueue and JobSet say while a group restart runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KueueView {
    /// The Workload's conditions by type: (status, reason).
    conditions: BTreeMap<String, (String, String)>,
    /// The Workload's `status.requeueState`, as JSON (null when never requeued).
    requeue: String,
    /// The JobSet's `spec.suspend`.
    suspended: bool,
}

/// A JobSet in a Kueue LocalQueue (ClusterQueue quota for it, `waitForPodsReady` on as
/// `up --with kueue` configures it: DIR/kueue/config.yaml) on the real node: created suspended by
/// Kueue's webhook and injected by ours, admitted and resumed, its pods run; a worker fails and
/// the JobSet group-restarts in place while Kueue neither evicts nor requeues it (the Workload
/// stays Admitted, never Evicted, no requeueState, the JobSet never suspended). The Workload's
/// conditions through the restart are printed (how `PodsReady` moves; docs/operations.md).
#[tokio::test]
async fn a_jobset_admitted_by_kueue_group_restarts_in_place_without_eviction() {
    const TEST: &str = "a_jobset_admitted_by_kueue_group_restarts_in_place_without_eviction";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        if !addon_started(&node, TEST, "kueue") {
            return;
        }
        let kueue_config = std::fs::read_to_string(node.dir.join("kueue/config.yaml"))
            .unwrap_or_else(|e| panic!("DIR/kueue/config.yaml: {e}"));
        let wait_for_pods_ready: Vec<&str> = kueue_config
            .lines()
            .skip_while(|l| !l.starts_with("waitForPodsReady:"))
            .take_while(|l| l.starts_with("waitForPodsReady:") || l.starts_with(' '))
            .collect();
        assert!(
            !wait_for_pods_ready.is_empty(),
            "Kueue runs with waitForPodsReady: {kueue_config}"
        );
        println!("Kueue's {}", wait_for_pods_ready.join("\n"));
        let run = Run::prepare(&node, "rn-kueue", 3, dialect).await;
        let ns = run.namespace().to_owned();
        let queue = KueueQueue::create(
            &node,
            &ns,
            |flavor| KueueQueue::quota(flavor, "8", "16Gi"),
            json!({}),
        )
        .await;
        let js = train_jobset(run.size, run.records.path(), dialect, |js| {
            js["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": queue.local_queue});
        });
        let created = run
            .jobsets
            .create(&PostParams::default(), &js)
            .await
            .unwrap_or_else(|e| panic!("create the JobSet: {e}"));
        assert_injected(&created);
        assert_eq!(
            created.data["spec"]["suspend"], true,
            "Kueue's webhook suspended the JobSet until admission"
        );
        let first = run.running(None, 0, Duration::from_secs(150)).await;
        let view = || async {
            let (conditions, w) = workload_of(&node.client, &ns, "train").await?;
            let suspended = run
                .jobsets
                .get("train")
                .await
                .map_err(|e| e.to_string())?
                .data["spec"]["suspend"]
                .as_bool()
                .unwrap_or(false);
            Ok::<_, String>(KueueView {
                conditions,
                requeue: w["status"]["requeueState"].to_string(),
                suspended,
            })
        };
        let ready = eventually(
            "the Workload admitted, PodsReady",
            Duration::from_secs(60),
            || async {
                let v = view().await?;
                let is = |t: &str| v.conditions.get(t).is_some_and(|c| c.0 == "True");
                (is("Admitted") && is("PodsReady"))
                    .then_some(v.clone())
                    .ok_or(format!("{v:?}"))
            },
        )
        .await;
        println!("admitted: {ready:?}");

        // The group restart, with Kueue's view sampled every 100 ms until PodsReady is back.
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let samples = {
            let sampling = sampling.clone();
            async move {
                let start = Instant::now();
                let mut seen: Vec<(Duration, KueueView)> = Vec::new();
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(v) = view().await
                        && seen.last().is_none_or(|(_, last)| *last != v)
                    {
                        seen.push((start.elapsed(), v));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                seen
            }
        };
        let restart = async {
            let (after, took) = group_restart(&run, &first, 3).await;
            // Until Kueue has seen the pods ready again (or 60 s: then the loop below says).
            let _ = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    if let Ok(v) = view().await
                        && v.conditions.get("PodsReady").is_some_and(|c| c.0 == "True")
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await;
            // A few seconds more: an eviction decided late would show.
            tokio::time::sleep(Duration::from_secs(5)).await;
            sampling.store(false, std::sync::atomic::Ordering::Relaxed);
            (after, took)
        };
        let (seen, (after, took)) = tokio::join!(samples, restart);
        println!(
            "group restart under Kueue: every worker running again after {} ms, epoch {}",
            took.as_millis(),
            after.epoch
        );
        for (at, v) in &seen {
            println!("  +{:>5} ms {v:?}", at.as_millis());
        }
        assert!(!seen.is_empty(), "Kueue's view sampled");
        for (at, v) in &seen {
            let status = |t: &str| v.conditions.get(t).map(|c| c.0.as_str());
            assert_ne!(status("Evicted"), Some("True"), "+{at:?}: evicted: {v:?}");
            assert_eq!(status("Admitted"), Some("True"), "+{at:?}: {v:?}");
            assert_eq!(
                status("Requeued"),
                ready.conditions.get("Requeued").map(|c| c.0.as_str()),
                "+{at:?}: requeued: {v:?}"
            );
            assert_eq!(v.requeue, "null", "+{at:?}: requeueState: {v:?}");
            assert!(!v.suspended, "+{at:?}: the JobSet suspended: {v:?}");
        }
        let last = &seen[seen.len() - 1].1;
        assert_eq!(
            last.conditions.get("PodsReady").map(|c| c.0.as_str()),
            Some("True"),
            "PodsReady again after the group restart: {last:?}"
        );
    })
    .await;
}
