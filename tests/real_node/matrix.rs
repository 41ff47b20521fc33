//! The failure matrix on several real nodes (`scripts/control-plane.sh up DIR --nodes 3 --install
//! epoch --node-grace 8s`, docs/testing.md "Several real nodes"): JobSets of one worker per node
//! (a required pod anti-affinity on the node's hostname), the product installed. Each row checks
//! from the workers' records that no worker of a new epoch started before every worker of the old
//! one ended (or, on a lost node, was killed with it), that the JobSet recovers, and prints the
//! time from the failure to every worker running again as one machine-readable line:
//! `MATRIX row=<row> nodes=<n> pods=<n> ms=<ms>` (docs/benchmarks.md).
//!
//! On a node.env with fewer than 3 nodes every row says SKIPPED. `the_matrix_with_a_node_lost`
//! kills a node (`node-kill`): it runs last in a `cargo test` (its name sorts last;
//! `--test-threads 1`), and the cluster keeps 2 nodes after it; `the_matrix_a_node_drained`
//! cordons a node for its time. .ci/run runs the rows that leave the nodes alone concurrently
//! (separate processes, separate namespaces), then the others one after the other.

use super::*;

/// The nodes of node.env (`NODES`), or `None` (and SKIPPED) with fewer than 3.
pub(super) fn three_nodes(node: &Node, test: &str) -> Option<Vec<String>> {
    let names: Vec<String> = node
        .env
        .get("NODES")
        .map(|n| n.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    if names.len() < 3 {
        eprintln!(
            "\n!! SKIPPED {test}: {} node(s); the matrix needs 3 (up DIR --nodes 3)\n",
            names.len()
        );
        return None;
    }
    Some(names)
}

/// One worker per node: a required anti-affinity on the hostname among the JobSet's pods.
pub(super) fn spread(js: &mut serde_json::Value) {
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["affinity"] = json!({
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "train"}},
            "topologyKey": "kubernetes.io/hostname"
        }]}
    });
}

/// Each pod's node.
pub(super) fn nodes_of(group: &Group) -> BTreeMap<String, String> {
    group
        .pods
        .iter()
        .map(|(name, p)| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            (name.clone(), node)
        })
        .collect()
}

/// The pods of `group` run on as many distinct nodes as there are pods.
fn assert_one_per_node(group: &Group) {
    let nodes = nodes_of(group);
    let distinct: std::collections::BTreeSet<&String> = nodes.values().collect();
    assert_eq!(
        distinct.len(),
        nodes.len(),
        "one worker per node: {nodes:?}"
    );
}

/// The machine-readable line of a row.
pub(super) fn matrix_line(row: &str, nodes: usize, pods: usize, took: Duration) {
    println!(
        "MATRIX row={row} nodes={nodes} pods={pods} ms={}",
        took.as_millis()
    );
}

/// Row 1: a worker exits non-zero (the restart code) on one node; every pod on every node
/// restarts in place behind the barrier.
#[tokio::test]
async fn the_matrix_a_worker_exits_non_zero_across_nodes() {
    const TEST: &str = "the_matrix_a_worker_exits_non_zero_across_nodes";
    with_node(TEST, |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "mx-exit", 3, dialect, spread).await;
        assert_one_per_node(&first);
        let (after, took) = group_restart(&run, &first, 42).await;
        assert_one_per_node(&after);
        matrix_line("worker-exit", names.len(), 3, took);
    })
    .await;
}

/// Row 3: a pod evicted through the Eviction API (as `kubectl drain` evicts each pod of the
/// node): its worker gets SIGTERM, the Job replaces the pod, the replacement joins one epoch up,
/// the others restart in place behind the barrier.
#[tokio::test]
async fn the_matrix_a_pod_evicted() {
    const TEST: &str = "the_matrix_a_pod_evicted";
    with_node(TEST, |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "mx-evict", 3, dialect, spread).await;
        let victim = first.pods.keys().next().expect("a pod").clone();
        let since = run.mark();
        let evicted_ms = super::node_loss::now_ms();
        run.pods
            .evict(&victim, &kube::api::EvictParams::default())
            .await
            .unwrap_or_else(|e| panic!("evict {victim}: {e}"));
        // Where the time goes: when the evicted pod left the API (its Job replaces it then:
        // podReplacementPolicy Failed), polled beside the wait for the group.
        let gone = async {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(150) {
                if let Ok(None) = run.pods.get_opt(&victim).await {
                    return Some(super::node_loss::now_ms().saturating_sub(evicted_ms));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            None
        };
        let (after, gone) = tokio::join!(
            run.running(Some(first.epoch), since, Duration::from_secs(150)),
            gone
        );
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        assert!(!after.pods.contains_key(&victim), "{victim} replaced");
        assert_in_place(&first, &after, &[victim.as_str()]);
        assert_one_per_node(&after);
        let records = run.records();
        let took = assert_barrier(&records, since, run.size);
        matrix_line("evicted", names.len(), 3, took);
        let at = |r: &Record| r.ms.saturating_sub(evicted_ms);
        let timeline: Vec<String> = records
            .iter()
            .filter(|r| r.seq >= since && r.container == run.worker)
            .map(|r| format!("{}ms {} {}", at(r), r.event, r.pod))
            .collect();
        println!(
            "MATRIX_TIMELINE row=evicted from=eviction pod_gone_ms={gone:?} workers={timeline:?}"
        );
    })
    .await;
}

/// Row 3 (drain): `kubectl drain` as the API does it: the node of one worker of a JobSet of 2
/// on 3 nodes cordoned (`spec.unschedulable`), then its pod evicted through the Eviction API; the
/// replacement lands on the spare node and joins one epoch up, the other restarts in place
/// behind the barrier. The node is uncordoned after.
#[tokio::test]
async fn the_matrix_a_node_drained() {
    const TEST: &str = "the_matrix_a_node_drained";
    with_node(TEST, |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "mx-drain", 2, dialect, spread).await;
        let placed = nodes_of(&first);
        let (victim, drained) = placed
            .iter()
            .next()
            .map(|(p, n)| (p.clone(), n.clone()))
            .expect("a pod");
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(node.client.clone());
        let cordon = |on: bool| {
            let nodes = nodes.clone();
            let drained = drained.clone();
            async move {
                nodes
                    .patch(
                        &drained,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(json!({"spec": {"unschedulable": on}})),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("cordon {drained} ({on}): {e}"));
            }
        };
        let since = run.mark();
        cordon(true).await;
        let evicted = run
            .pods
            .evict(&victim, &kube::api::EvictParams::default())
            .await;
        let after = match evicted {
            Ok(_) => Some(
                run.running(Some(first.epoch), since, Duration::from_secs(150))
                    .await,
            ),
            Err(e) => {
                cordon(false).await;
                panic!("evict {victim}: {e}");
            }
        };
        cordon(false).await;
        let after = after.expect("the group after");
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        assert!(!after.pods.contains_key(&victim), "{victim} replaced");
        assert_in_place(&first, &after, &[victim.as_str()]);
        assert!(
            !nodes_of(&after).values().any(|n| *n == drained),
            "nothing runs on the drained node: {:?}",
            nodes_of(&after)
        );
        let took = assert_barrier(&run.records(), since, run.size);
        matrix_line("drained", names.len(), 2, took);
    })
    .await;
}

/// One group restart as [`group_restart`], with `during` run right after the worker's exit
/// file is written (the failure under way): every pod restarts once in place (restart counts one
/// up, never two), behind the barrier, one epoch up.
async fn group_restart_during<F, Fut>(
    run: &Run,
    before: &Group,
    code: i32,
    during: F,
) -> (Group, Duration)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let failing = before.pods.keys().next().expect("a pod").clone();
    let since = run.mark();
    run.exit(&failing, code);
    during().await;
    let after = run
        .running(Some(before.epoch), since, Duration::from_secs(180))
        .await;
    assert_eq!(after.epoch, before.epoch + 1, "the epoch moves by one");
    // Same UIDs, every container's restartCount exactly one up: no pod restarted twice.
    assert_in_place(before, &after, &[]);
    let took = assert_barrier_of(&run.records(), since, run.size, run.worker);
    (after, took)
}

/// The node of the installed reconciler's leader (empty if unknown).
pub(super) async fn leader_node(node: &Node) -> String {
    let (leader, _) = reconciler_leader(node).await;
    let system: Api<Pod> = Api::namespaced(node.client.clone(), "jobset-inplace-system");
    system
        .get(&leader)
        .await
        .ok()
        .and_then(|p| p.spec?.node_name)
        .unwrap_or_default()
}

/// The installed reconciler's pods, and the name of the one holding the leader lease.
pub(super) async fn reconciler_leader(node: &Node) -> (String, Vec<String>) {
    let pods: Api<Pod> = Api::namespaced(node.client.clone(), "jobset-inplace-system");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(node.client.clone(), "jobset-inplace-system");
    eventually(
        "the reconciler's leader",
        Duration::from_secs(60),
        || async {
            let list = leases
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let replicas: Vec<String> = pods
                .list(
                    &ListParams::default()
                        .labels("app.kubernetes.io/name=jobset-inplace-reconciler"),
                )
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.metadata.name)
                .collect();
            let holder = list
                .items
                .iter()
                .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
                .find(|h| replicas.contains(h))
                .ok_or(format!("no lease held by a replica of {replicas:?}"))?;
            Ok((holder, replicas))
        },
    )
    .await
}

/// Row 4: the reconciler's leader killed (its pod deleted at once, grace 0) in the middle of a
/// group restart, two replicas: the other takes the lease and the restart completes, no pod
/// restarts twice.
#[tokio::test]
async fn the_matrix_the_reconcilers_leader_killed_mid_restart() {
    const TEST: &str = "the_matrix_the_reconcilers_leader_killed_mid_restart";
    with_node(TEST, |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "mx-leader", 3, dialect, spread).await;
        let (leader, replicas) = reconciler_leader(&node).await;
        assert!(replicas.len() >= 2, "two reconciler replicas: {replicas:?}");
        let pods: Api<Pod> = Api::namespaced(node.client.clone(), "jobset-inplace-system");
        let (after, took) = group_restart_during(&run, &first, 42, || async {
            let params = kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            pods.delete(&leader, &params)
                .await
                .unwrap_or_else(|e| panic!("delete the leader {leader}: {e}"));
        })
        .await;
        let (new_leader, _) = reconciler_leader(&node).await;
        assert_ne!(new_leader, leader, "another replica leads");
        assert_one_per_node(&after);
        matrix_line("leader-killed", names.len(), 3, took);
    })
    .await;
}

/// Row 5: the API server restarted (SIGKILL, then started again on its etcd) in the middle of a
/// group restart: it completes, no pod restarts twice, the agents' watches resume (a second group
/// restart after it completes as well).
#[tokio::test]
async fn the_matrix_the_api_server_restarted_mid_restart() {
    const TEST: &str = "the_matrix_the_api_server_restarted_mid_restart";
    with_node(TEST, |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "mx-apiserver", 3, dialect, spread).await;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/control-plane.sh");
        let dir = node.dir.to_str().expect("utf-8 path").to_owned();
        let (second, took) = group_restart_during(&run, &first, 42, || async {
            run_command(
                script.to_str().expect("utf-8 path"),
                &["restart-apiserver", &dir],
            )
            .await
            .unwrap_or_else(|e| panic!("restart the API server: {e}"));
        })
        .await;
        matrix_line("apiserver-restarted", names.len(), 3, took);
        // The agents' watches resumed: the next failure is served as usual.
        let (_, again) = group_restart(&run, &second, 42).await;
        println!(
            "after the API server's restart, the next group restart took {} ms",
            again.as_millis()
        );
    })
    .await;
}

/// Row 6: a worker that keeps failing: every failure restarts the group in place until the
/// restarts pass `maxRestarts` (2 here), then the JobSet fails (`Failed`, reason
/// `ReachedMaxRestarts`) as JobSet's own rule says, and nothing restarts any more.
#[tokio::test]
async fn the_matrix_a_worker_that_keeps_failing_ends_by_max_restarts() {
    const TEST: &str = "the_matrix_a_worker_that_keeps_failing_ends_by_max_restarts";
    with_node(TEST, |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "mx-maxrestarts", 3, dialect, |js| {
            spread(js);
            js["spec"]["failurePolicy"]["maxRestarts"] = json!(2);
        })
        .await;
        let failing = first.pods.keys().next().expect("a pod").clone();
        let started = Instant::now();
        // Tell the same worker to fail again whenever it runs, until the JobSet fails.
        let failed = eventually("the JobSet Failed", Duration::from_secs(240), || async {
            let js = run.jobsets.get("train").await.map_err(|e| e.to_string())?;
            let conditions = js.data["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if let Some(c) = conditions
                .iter()
                .find(|c| c["type"] == "Failed" && c["status"] == "True")
            {
                return Ok(c.clone());
            }
            let exit_file = run
                .records
                .path()
                .join(format!("exit-{failing}-{}", run.worker));
            if !exit_file.exists() {
                run.exit(&failing, 42);
            }
            Err(format!("not failed yet: {conditions:?}"))
        })
        .await;
        println!("the JobSet failed: {failed}");
        let recs = run.records();
        let exits = recs
            .iter()
            .filter(|r| r.event == "exit" && r.pod == failing && r.container == run.worker)
            .count();
        // maxRestarts 2: two group restarts, and the third failure ends the JobSet.
        assert!(
            (3..=4).contains(&exits),
            "the worker failed maxRestarts + 1 times before the JobSet failed: {exits} exits"
        );
        assert!(
            failed["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("MaxRestarts"),
            "failed by maxRestarts: {failed}"
        );
        matrix_line("max-restarts", names.len(), 3, started.elapsed());
    })
    .await;
}

/// Runs a command to its end (bounded); stdout, or why it failed.
async fn run_command(program: &str, args: &[&str]) -> Result<String, String> {
    run(program, args).await
}

/// Row 2 (runs last: it kills a node): a JobSet of 2 on 3 nodes, the product's reconciler told
/// `--node-lost-grace 2s`; the node of one worker is killed (`node-kill`: links cut, kubelet,
/// containerd and containers SIGKILLed). The node controller turns its Ready condition Unknown
/// (`--node-grace 8s` at `up`), the reconciler fails and deletes the lost pod, the Job replaces it
/// on the spare node, the replacement joins one epoch up and the other worker restarts in place;
/// no new worker started before the surviving old one ended. The time is from the kill.
#[tokio::test]
async fn the_matrix_with_a_node_lost() {
    const TEST: &str = "the_matrix_with_a_node_lost";
    with_node_for(TEST, Duration::from_secs(420), |node| async move {
        let Some(names) = three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        if node.env.contains_key("NODE_KILLED") {
            eprintln!("\n!! SKIPPED {TEST}: a node of this cluster was killed already\n");
            return;
        }
        // A short grace for the test (the default is 30 s): the reconciler rolled out with it.
        super::node_loss::set_node_lost_grace(&node, "2s").await;
        let (run_, first) = Run::start(&node, "mx-lost", 2, dialect, spread).await;
        assert_one_per_node(&first);
        let placed = nodes_of(&first);
        // The victim: a worker's node that does not hold the reconciler's leader, if there is one.
        let leader_node = leader_node(&node).await;
        let (victim, victim_node) = placed
            .iter()
            .find(|(_, n)| **n != leader_node)
            .or_else(|| placed.iter().next())
            .map(|(p, n)| (p.clone(), n.clone()))
            .expect("a pod");
        let spare: Vec<&String> = names.iter().filter(|n| !placed.values().any(|p| p == *n)).collect();
        println!(
            "workers on {placed:?}; killing {victim_node} (worker {victim}); the reconciler's leader on {leader_node}; spare {spare:?}"
        );
        let since = run_.mark();
        let killed_ms = super::node_loss::kill_node(&node, &victim_node).await;
        let after = run_
            .running(Some(first.epoch), since, Duration::from_secs(300))
            .await;
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        assert!(!after.pods.contains_key(&victim), "{victim} replaced");
        assert_in_place(&first, &after, &[victim.as_str()]);
        let now_on = nodes_of(&after);
        assert!(
            !now_on.values().any(|n| *n == victim_node),
            "nothing runs on the lost node: {now_on:?}"
        );
        assert_one_per_node(&after);
        // The barrier: the surviving old worker ended before any new one started; the lost
        // one was killed with its node, before all of them.
        let recs = run_.records();
        let mine = |r: &&Record| r.container == run_.worker && r.seq >= since;
        let ends: Vec<&Record> = recs
            .iter()
            .filter(|r| mine(r) && (r.event == "exit" || r.event == "stop"))
            .collect();
        let starts: Vec<&Record> = recs.iter().filter(|r| mine(r) && r.event == "start").collect();
        assert_eq!(starts.len(), 2, "one new start per pod: {recs:#?}");
        assert!(
            ends.iter().all(|r| r.pod != victim),
            "the lost node's worker recorded nothing (killed): {recs:#?}"
        );
        assert_eq!(ends.len(), 1, "the surviving worker ended: {recs:#?}");
        let last_end = ends.iter().map(|r| r.ms).max().unwrap_or(0);
        let first_start = starts.iter().map(|r| r.ms).min().unwrap_or(0);
        let last_start = starts.iter().map(|r| r.ms).max().unwrap_or(0);
        assert!(
            last_end <= first_start && killed_ms <= first_start,
            "no new worker before the old ones ended: {recs:#?}"
        );
        let took = Duration::from_millis(last_start.saturating_sub(killed_ms));
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(node.client.clone(), run_.namespace());
        let lost_events = events
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some("NodeLost"))
                    .filter_map(|e| e.note)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        assert!(
            lost_events.iter().any(|n| n.contains(&victim) && n.contains(&victim_node)),
            "a NodeLost event names the pod and its node: {lost_events:?}"
        );
        matrix_line("node-lost", names.len(), 2, took);
    })
    .await;
}
