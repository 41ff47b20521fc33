//! JobSets through the installed product (`up DIR --node --install VARIANT`): the group restart,
//! three in a row, a deleted pod, a fatal exit, an exit 0, init containers and sidecars, the
//! deadline, doctor.

use super::*;

/// The product was installed as node.env's `INSTALL_METHOD` says (`up --install VARIANT`:
/// `manifest`; `--install helm:VARIANT`: `helm`): the webhook and reconciler Deployments carry
/// Helm's `managed-by` label exactly when Helm installed them.
async fn assert_install_method(node: &Node) {
    let method = node
        .env
        .get("INSTALL_METHOD")
        .map(String::as_str)
        .unwrap_or("manifest");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(node.client.clone(), "jobset-inplace-system");
    for name in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
        let d = deployments
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("the installed {name}: {e}"));
        let managed_by = d
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .cloned();
        assert_eq!(
            managed_by.as_deref() == Some("Helm"),
            method == "helm",
            "{name} installed with {method}: managed-by {managed_by:?}"
        );
    }
    println!("the product installed with {method}");
}

// ---------------------------------------------------------------------------------------------
// JobSets through the installed product, continued
// ---------------------------------------------------------------------------------------------

/// 3 pods; a worker exits with the restart code (42), then with another non-zero code (3): each
/// time every pod restarts in place, behind the barrier, one epoch up. (The worker carries the
/// user's `RestartAllContainers` rule, as in story 1.) The product came in as node.env's
/// `INSTALL_METHOD` says (.ci/run: the release manifest for epoch, the Helm chart for
/// jobset-native).
#[tokio::test]
async fn a_worker_failure_restarts_the_jobset_in_place_through_the_installed_product() {
    const TEST: &str =
        "a_worker_failure_restarts_the_jobset_in_place_through_the_installed_product";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        assert_install_method(&node).await;
        let (run, first) = Run::start(&node, "rn-jobset", 3, dialect, |_| {}).await;
        println!("running at epoch {}: {:?}", first.epoch, first.pods.keys());
        let failing = first.pods.keys().next().expect("a pod").clone();
        let (second, took_42) = group_restart(&run, &first, 42).await;
        println!(
            "restart code 42: every worker running again after {} ms",
            took_42.as_millis()
        );
        // Started by the failing pod's kubelet, not by its new agent's registration.
        run.assert_started_by(Some(&failing)).await;
        println!(
            "each agent, from its process start to its registration (ms): {:?}",
            run.registration_ms(&second).await
        );
        let (_, took_3) = group_restart(&run, &second, 3).await;
        println!(
            "exit code 3: every worker running again after {} ms",
            took_3.as_millis()
        );
    })
    .await;
}

/// Three group restarts in a row through the installed product: none slower than the first
/// (sidecar mode is not backed off; CrashLoopBackOff would add 10 s, then 20 s).
#[tokio::test]
async fn three_jobset_group_restarts_in_a_row_are_not_backed_off() {
    const TEST: &str = "three_jobset_group_restarts_in_a_row_are_not_backed_off";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, mut group) = Run::start(&node, "rn-thrice", 3, dialect, |_| {}).await;
        let mut took = Vec::new();
        for round in 1..=3 {
            let (after, t) = group_restart(&run, &group, 42).await;
            println!(
                "group restart {round}: every worker running again after {} ms",
                t.as_millis()
            );
            took.push(t);
            group = after;
        }
        let limit = took[0] + Duration::from_secs(5);
        assert!(
            took.iter().all(|t| *t <= limit),
            "no group restart slower than the first by 5 s or more (back-off): {took:?}"
        );
    })
    .await;
}

/// A pod deleted (the seeds' second failure source): the Job replaces it, the replacement
/// joins one epoch up, the other pods restart in place behind the barrier.
#[tokio::test]
async fn a_deleted_pod_is_replaced_and_the_others_restart_in_place() {
    const TEST: &str = "a_deleted_pod_is_replaced_and_the_others_restart_in_place";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-deleted", 3, dialect, |_| {}).await;
        let victim = first.pods.keys().next().expect("a pod").clone();
        let since = run.mark();
        run.pods
            .delete(&victim, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete {victim}: {e}"));
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(150))
            .await;
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        assert!(!after.pods.contains_key(&victim), "{victim} replaced");
        let new: Vec<_> = after
            .pods
            .keys()
            .filter(|n| !first.pods.contains_key(*n))
            .collect();
        assert_eq!(new.len(), 1, "one replacement: {new:?}");
        assert_in_place(&first, &after, &[victim.as_str()]);
        // A deletion is no exit under a rule: the replacement's registration started it.
        run.assert_started_by(None).await;
        let took = assert_barrier(&run.records(), since, run.size);
        println!(
            "pod deleted: every worker running again {} ms after the deleted pod's worker stopped",
            took.as_millis()
        );
    })
    .await;
}

/// Story 2: a worker exits with a code the Job's pod failure policy fails the Job for
/// (FailJob, then the JobSet's FailJobSet rule): the webhook leaves that code out of the restart
/// rule, the JobSet fails, nothing restarts in place.
#[tokio::test]
async fn a_fatal_exit_fails_the_jobset_and_nothing_restarts_in_place() {
    const TEST: &str = "a_fatal_exit_fails_the_jobset_and_nothing_restarts_in_place";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-fatal", 3, dialect, |js| {
            js["spec"]["failurePolicy"]["rules"] = json!([{
                "name": "failOnUnrecoverable",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"]
            }]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"] =
                json!([restarting_worker(dialect, &[0, 13])]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] = json!({
                "rules": [{"action": "FailJob", "onExitCodes": {
                    "containerName": "worker", "operator": "In", "values": [13]}}]
            });
        })
        .await;
        let failing = first.pods.keys().next().expect("a pod").clone();
        run.exit(&failing, 13);
        eventually("the JobSet failed", Duration::from_secs(90), || async {
            let js = run.jobsets.get("train").await.map_err(|e| e.to_string())?;
            let failed = js.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Failed" && c["status"] == "True");
            failed
                .then_some(())
                .ok_or_else(|| format!("{}", js.data["status"]))
        })
        .await;
        // Nothing restarted in place: no worker started again, no restart counted on any pod
        // left, the JobSet's epoch where it was.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let recs = run.records();
        assert_eq!(
            starts(&recs, "worker").len(),
            3,
            "no worker started again: {recs:#?}"
        );
        let left = run
            .pods
            .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=train"))
            .await
            .expect("pods");
        for p in &left.items {
            let counts = restart_counts(p);
            assert!(
                counts.values().all(|c| *c == 0),
                "{:?} restarted: {}",
                p.metadata.name,
                pod_line(p)
            );
        }
        // A fatal code is left out of the rule: the kubelet never began a restart, and no
        // group restart started, early or not.
        let notes = run.restarts_started().await;
        assert!(notes.is_empty(), "no group restart: {notes:?}");
        // (JobSet's controller's status write on failure may wipe the field; never above.)
        let synced = run.synced().await;
        assert!(
            synced.is_none_or(|s| s == first.epoch),
            "the epoch did not move: {synced:?}"
        );
    })
    .await;
}

/// A worker that exits 0 matches no restart rule (`NotIn [0, ...]`): its pod completes, the
/// kubelet begins no restart (`AllContainersRestarting` never `True`), no group restart starts,
/// early or not, and the other pods run on.
#[tokio::test]
async fn a_worker_exiting_zero_starts_no_group_restart() {
    const TEST: &str = "a_worker_exiting_zero_starts_no_group_restart";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-zero", 2, dialect, |_| {}).await;
        let mut names = first.pods.keys();
        let done = names.next().expect("a pod").clone();
        let other = names.next().expect("another pod").clone();
        run.exit(&done, 0);
        eventually("the pod completed", Duration::from_secs(60), || async {
            let p = run.pods.get(&done).await.map_err(|e| e.to_string())?;
            match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Succeeded") => Ok(p),
                _ => Err(pod_line(&p)),
            }
        })
        .await;
        // Long enough for a relist, a reconcile and an event.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let p = run.pods.get(&done).await.expect("the completed pod");
        assert_ne!(
            condition(&p, "AllContainersRestarting").as_deref(),
            Some("True"),
            "{}",
            pod_line(&p)
        );
        let notes = run.restarts_started().await;
        assert!(notes.is_empty(), "no group restart: {notes:?}");
        let q = run.pods.get(&other).await.expect("the other pod");
        assert!(all_running(&q), "{other} runs on: {}", pod_line(&q));
        assert!(
            restart_counts(&q).values().all(|c| *c == 0),
            "{other} did not restart: {}",
            pod_line(&q)
        );
    })
    .await;
}

/// A user init container and a user sidecar before the agent (the webhook appends the agent
/// to `initContainers`): on a group restart the real kubelet runs them again, before the agent,
/// and the barrier still holds.
#[tokio::test]
async fn user_init_containers_and_sidecars_re_run_and_the_barrier_holds() {
    const TEST: &str = "user_init_containers_and_sidecars_re_run_and_the_barrier_holds";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-inits", 3, dialect, |js| {
            let mut init = recording_container("init", dialect);
            init["env"]
                .as_array_mut()
                .expect("env")
                .push(json!({"name": "EXIT_AFTER", "value": "0"}));
            let mut sidecar = recording_container("sidecar", dialect);
            sidecar["restartPolicy"] = json!("Always");
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                ["initContainers"] = json!([init, sidecar]);
        })
        .await;
        let (after, took) = group_restart(&run, &first, 42).await;
        let recs = run.records();
        for name in after.pods.keys() {
            for c in ["init", "sidecar"] {
                let n = recs
                    .iter()
                    .filter(|r| r.event == "start" && r.container == c && &r.pod == name)
                    .count();
                assert_eq!(n, 2, "{name}: {c} ran again: {recs:#?}");
            }
            // The user's init containers run before the new worker.
            let worker_start = recs
                .iter()
                .rfind(|r| r.event == "start" && r.container == "worker" && &r.pod == name)
                .expect("worker start");
            let init_start = recs
                .iter()
                .rfind(|r| r.event == "start" && r.container == "init" && &r.pod == name)
                .expect("init start");
            assert!(
                init_start.ms <= worker_start.ms,
                "{name}: init before worker"
            );
        }
        println!(
            "with a user init container and sidecar: every worker running again after {} ms",
            took.as_millis()
        );
    })
    .await;
}

/// The group-restart deadline on a real node: one pod's restart hangs before its agent (a user
/// init container that hangs on that pod's second run), so it never registers. After the
/// JobSet's `jobset-inplace.dev/group-restart-timeout` the reconciler fails and deletes it
/// (docs/protocol.md "Deadline", step 1), the Job replaces it, the replacement registers and the
/// group completes: every worker running one epoch up or more, the other pods restarted in place.
#[tokio::test]
async fn a_pod_that_never_comes_back_is_replaced_after_the_deadline() {
    const TEST: &str = "a_pod_that_never_comes_back_is_replaced_after_the_deadline";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-deadline", 3, dialect, |js| {
            js["metadata"]["annotations"] =
                json!({"jobset-inplace.dev/group-restart-timeout": "15s"});
            // Hangs when RECORDS/hang-<pod> exists, then runs as the worker script to exit 0.
            let mut init = recording_container("init", dialect);
            init["command"] = json!([
                "/bin/sh", "-c",
                "if [ -f /records/hang-$POD_NAME ]; then echo hang ms=0 pod=$POD_NAME container=init >>/records/records; exec sleep 3600; fi; EXIT_AFTER=0 exec /bin/sh /worker"
            ]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                ["initContainers"] = json!([init]);
        })
        .await;
        let mut names = first.pods.keys();
        let failing = names.next().expect("a pod").clone();
        let hanging = names.next().expect("a second pod").clone();
        std::fs::write(run.records.path().join(format!("hang-{hanging}")), "").expect("hang file");
        let failed_at = Instant::now();
        let since = run.mark();
        run.exit(&failing, 42);
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(150))
            .await;
        let took = failed_at.elapsed();
        assert!(!after.pods.contains_key(&hanging), "{hanging} replaced: {:?}", after.pods.keys());
        assert_in_place(&first, &after, &[hanging.as_str()]);
        assert!(
            took >= Duration::from_secs(15),
            "the group waited for the deadline ({took:?})"
        );
        let recs = run.records();
        assert!(
            recs.iter().any(|r| r.event == "hang" && r.pod == hanging),
            "{hanging} hung before its agent: {recs:#?}"
        );
        println!(
            "a pod that never came back: replaced after the 15 s deadline, every worker running \
             again at epoch {} after {} ms",
            after.epoch,
            took.as_millis()
        );
    })
    .await;
}

/// `doctor` against the real node: its kubelet runs with the gate, declares the feature
/// (`node.status.declaredFeatures`), and `doctor`'s node check says so (its unit tests name the
/// nodes that do not).
#[tokio::test]
async fn doctor_sees_the_real_node_declare_the_feature() {
    const TEST: &str = "doctor_sees_the_real_node_declare_the_feature";
    with_node(TEST, |node| async move {
        if installed(&node, TEST).is_none() {
            return;
        }
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .arg("doctor")
            .env("KUBECONFIG", &node.kubeconfig)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(COMMAND_LIMIT, out)
            .await
            .expect("doctor within its time")
            .expect("run doctor");
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}");
        assert!(
            text.lines().any(|l| l.starts_with("ok")
                && l.contains(
                    "node-features: all 1 node(s) declare RestartAllContainersOnContainerExits"
                )),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await;
}

/// Issue 44, the held probe on the real kubelet: 4 pods, one made 20 s late on the group
/// restart by a user init container before its agent (as a slow data load would); the other
/// three wait at their barriers meanwhile. The real kubelet writes a Warning `Unhealthy` event
/// for every startup probe that fails (`prober.go`); the agent holds the probe until its
/// barrier lifts, so each waiting pod gets at most one (before the hold: 12 each, measured at
/// 4567270). Every worker runs again, in place. The figure goes to docs/benchmarks.md.
#[tokio::test]
async fn a_late_pod_costs_the_waiting_pods_no_unhealthy_event() {
    const TEST: &str = "a_late_pod_costs_the_waiting_pods_no_unhealthy_event";
    const LATE: Duration = Duration::from_secs(20);
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-late", 4, dialect, |js| {
            // Sleeps 20 s when RECORDS/late-<pod> exists, then ends (exit 0).
            let mut init = recording_container("init", dialect);
            init["command"] = json!([
                "/bin/sh", "-c",
                "if [ -f /records/late-$POD_NAME ]; then sleep 20; fi; EXIT_AFTER=0 exec /bin/sh /worker"
            ]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                ["initContainers"] = json!([init]);
        })
        .await;
        let mut names = first.pods.keys();
        let failing = names.next().expect("a pod").clone();
        let late = names.next().expect("a second pod").clone();
        let waiting: Vec<String> = first.pods.keys().filter(|n| **n != late).cloned().collect();
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(node.client.clone(), &run._ns.name);
        let unhealthy = || async {
            let list = events
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("list events: {e}"));
            let mut per_pod: BTreeMap<String, i32> = BTreeMap::new();
            for e in list.items {
                if e.reason.as_deref() == Some("Unhealthy") {
                    let pod = e.involved_object.name.clone().unwrap_or_default();
                    *per_pod.entry(pod).or_default() += e.count.unwrap_or(1).max(1);
                }
            }
            per_pod
        };
        let before = unhealthy().await;
        std::fs::write(run.records.path().join(format!("late-{late}")), "").expect("late file");
        let failed_at = Instant::now();
        let since = run.mark();
        run.exit(&failing, 42);
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(120))
            .await;
        let took = failed_at.elapsed();
        assert_in_place(&first, &after, &[]);
        assert!(took >= LATE, "the group waited for the late pod ({took:?})");
        // Events are written asynchronously by the kubelet's recorder: give them a moment.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = unhealthy().await;
        let added = |pod: &String| now.get(pod).copied().unwrap_or(0) - before.get(pod).copied().unwrap_or(0);
        let per_waiting: Vec<(String, i32)> = waiting.iter().map(|p| (p.clone(), added(p))).collect();
        let total: i32 = per_waiting.iter().map(|(_, n)| n).sum();
        println!(
            "UNHEALTHY_RESULT {}",
            json!({
                "pods": 4,
                "late_s": LATE.as_secs(),
                "waiting_pods": waiting.len(),
                "unhealthy_events": total,
                "unhealthy_per_waiting_pod": f64::from(total) / waiting.len() as f64,
                "group_restart_ms": took.as_millis(),
            })
        );
        for (pod, n) in &per_waiting {
            assert!(*n <= 1, "{pod}: {n} Unhealthy events while it waited ({per_waiting:?})");
        }
    })
    .await;
}
