//! The reconciler's node-loss modes on 3 real nodes (`up DIR --nodes 3 --node-grace 8s --install
//! epoch`; docs/operations.md "Node loss"). Each row kills a node (`node-kill`), so each wants a
//! fresh cluster of its own: it says SKIPPED on a cluster where a node was killed already.
//!
//! - `the_fenced_default_fails_a_lost_nodes_pods_once_an_operator_fences_it`: the reconciler in its
//!   default, `--node-lost fenced`; a JobSet of 2 in place and, beside it, the same JobSet as
//!   JobSet's own recreation (`Recreate`, the Job's `backoffLimit: 0`), each with a worker on the
//!   node killed. Silent (`Ready=Unknown`) for 15 s, nothing is deleted; then the test taints the
//!   node `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` as an operator would once the
//!   machine is down; the in-place JobSet recovers (the lost pod failed and deleted, `NodeLost`,
//!   replaced on the spare node, the other restarted in place behind the barrier), and the
//!   recreation recovers through Kubernetes' own path (taint eviction, the pod garbage collector).
//!   Prints `MATRIX row=node-lost-fenced` and `row=recreation-node-lost-fenced`, each from the
//!   taint.
//!
//! (`--node-lost force-after-grace`: `matrix::the_matrix_with_a_node_lost`, its grace 2 s.)

use super::*;
use k8s_openapi::api::core::v1::Node as NodeObject;

/// `kubectl set env` on the installed reconciler (`NAME=value`, or `NAME-` to remove), and its
/// rollout waited for.
async fn set_reconciler_env(node: &Node, env: &[&str]) {
    let kubeconfig = node.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let mut set = vec![
        "--kubeconfig",
        &kubeconfig,
        "-n",
        "jobset-inplace-system",
        "set",
        "env",
        "deploy/jobset-inplace-reconciler",
    ];
    set.extend_from_slice(env);
    let status = vec![
        "--kubeconfig",
        &kubeconfig,
        "-n",
        "jobset-inplace-system",
        "rollout",
        "status",
        "deploy/jobset-inplace-reconciler",
        "--timeout",
        "110s",
    ];
    for args in [set, status] {
        run("kubectl", &args)
            .await
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    }
}

/// The `NodeLost` events' notes of a namespace.
async fn node_lost_notes(node: &Node, namespace: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(node.client.clone(), namespace);
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("NodeLost"))
                .filter_map(|e| e.note)
                .collect()
        })
        .unwrap_or_default()
}

/// The live pod of `run_` on `on`.
async fn pod_on(run_: &Run, on: &str) -> String {
    let live = run_.live_pods().await.unwrap_or_default();
    live.iter()
        .find(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(on))
        .map(|(n, _)| n.clone())
        .unwrap_or_else(|| panic!("no worker of {} on {on}", run_.namespace()))
}

#[tokio::test]
async fn the_fenced_default_fails_a_lost_nodes_pods_once_an_operator_fences_it() {
    const TEST: &str = "the_fenced_default_fails_a_lost_nodes_pods_once_an_operator_fences_it";
    with_node_for(TEST, Duration::from_secs(600), |node| async move {
        let Some(names) = super::matrix::three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        if node.env.contains_key("NODE_KILLED") {
            eprintln!("\n!! SKIPPED {TEST}: a node of this cluster was killed already\n");
            return;
        }
        // The default, said explicitly (an earlier row may have set a grace).
        set_reconciler_env(
            &node,
            &["JOBSET_INPLACE_NODE_LOST=fenced", "JOBSET_INPLACE_NODE_LOST_GRACE-"],
        )
        .await;
        let victim_node = super::node_loss::victim_node(&node, &names).await;
        let v = victim_node.clone();
        let (in_place, first) = Run::start(&node, "nm-fenced", 2, dialect, move |js| {
            super::node_loss::spread_onto(js, &v)
        })
        .await;
        let recreation = Run::prepare(&node, "nm-recreate", 2, dialect).await;
        let v = victim_node.clone();
        super::node_loss::create_recreating(&recreation, 2, dialect, move |js| {
            super::node_loss::spread_onto(js, &v)
        })
        .await;
        let victim = pod_on(&in_place, &victim_node).await;
        let victim_recreated = pod_on(&recreation, &victim_node).await;
        let (since, since_recreated) = (in_place.mark(), recreation.mark());
        println!("killing {victim_node}: workers {victim} (in place), {victim_recreated} (recreation)");
        let killed_ms = super::node_loss::kill_node(&node, &victim_node).await;
        // Silent: the node controller turns it Unknown after its 8 s grace.
        let nodes: Api<NodeObject> = Api::all(node.client.clone());
        eventually("the node Ready=Unknown", Duration::from_secs(90), || async {
            let n = nodes.get(&victim_node).await.map_err(|e| e.to_string())?;
            let ready = n
                .status
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status);
            if ready.as_deref() == Some("Unknown") {
                Ok(())
            } else {
                Err(format!("Ready {ready:?}"))
            }
        })
        .await;
        let unknown_ms = super::node_loss::now_ms();
        // Not fenced: nothing is failed, however long (15 s here, past any grace of the matrix).
        tokio::time::sleep(Duration::from_secs(15)).await;
        let still = in_place
            .pods
            .get_opt(&victim)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("{victim} was deleted before the node was fenced"));
        assert_ne!(
            still.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed"),
            "{victim} failed before the node was fenced"
        );
        assert!(
            node_lost_notes(&node, in_place.namespace()).await.is_empty(),
            "no NodeLost before the fence"
        );
        // The operator fences it.
        let kubeconfig = node.kubeconfig.to_str().expect("utf-8 path").to_owned();
        let taint = format!("{}=nodeshutdown:NoExecute", "node.kubernetes.io/out-of-service");
        let tainted_ms = super::node_loss::now_ms();
        run(
            "kubectl",
            &["--kubeconfig", &kubeconfig, "taint", "node", &victim_node, &taint],
        )
        .await
        .unwrap_or_else(|e| panic!("kubectl taint: {e}"));
        println!(
            "{victim_node} Unknown {} ms after the kill; tainted out-of-service {} ms after the kill",
            unknown_ms.saturating_sub(killed_ms),
            tainted_ms.saturating_sub(killed_ms)
        );
        let selector = "jobset.sigs.k8s.io/jobset-name=train";
        let limit = Duration::from_secs(240);
        let (fenced, recreated) = futures::future::join(
            super::node_loss::observe(
                &node,
                &in_place.pods,
                in_place.records.path(),
                selector,
                2,
                since,
                &victim,
                &victim_node,
                tainted_ms,
                limit,
            ),
            super::node_loss::observe(
                &node,
                &recreation.pods,
                recreation.records.path(),
                selector,
                2,
                since_recreated,
                &victim_recreated,
                &victim_node,
                tainted_ms,
                limit,
            ),
        )
        .await;
        println!("NODE_LOSS {}", fenced.json("in place, --node-lost fenced, from the taint", 2, limit));
        println!(
            "NODE_LOSS {}",
            recreated.json("recreation, from the taint", 2, limit)
        );
        let took = fenced
            .recovered
            .unwrap_or_else(|| panic!("the in-place JobSet did not recover within {limit:?}: {}", fenced.last));
        let after = in_place
            .running(Some(first.epoch), since, Duration::from_secs(30))
            .await;
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        assert!(!after.pods.contains_key(&victim), "{victim} replaced");
        assert_in_place(&first, &after, &[victim.as_str()]);
        let now_on = super::matrix::nodes_of(&after);
        assert!(
            !now_on.values().any(|n| *n == victim_node),
            "nothing runs on the lost node: {now_on:?}"
        );
        let recs = in_place.records();
        let mine = |r: &&Record| r.container == in_place.worker && r.seq >= since;
        let last_end = recs
            .iter()
            .filter(|r| mine(r) && (r.event == "exit" || r.event == "stop"))
            .map(|r| r.ms)
            .max()
            .unwrap_or(0);
        let first_start = recs
            .iter()
            .filter(|r| mine(r) && r.event == "start")
            .map(|r| r.ms)
            .min()
            .unwrap_or(0);
        assert!(
            last_end <= first_start && tainted_ms <= first_start,
            "no new worker before the old ones ended, nor before the fence: {recs:#?}"
        );
        let notes = node_lost_notes(&node, in_place.namespace()).await;
        assert!(
            notes
                .iter()
                .any(|n| n.contains(&victim) && n.contains(&victim_node) && n.contains("out-of-service")),
            "a NodeLost event names the pod, its node and the fence: {notes:?}"
        );
        super::matrix::matrix_line(
            "node-lost-fenced",
            names.len(),
            2,
            Duration::from_millis(took),
        );
        match recreated.recovered {
            Some(ms) => super::matrix::matrix_line(
                "recreation-node-lost-fenced",
                names.len(),
                2,
                Duration::from_millis(ms),
            ),
            None => println!(
                "MATRIX row=recreation-node-lost-fenced nodes={} pods=2 ms=none (not within {limit:?}: {})",
                names.len(),
                recreated.last
            ),
        }
    })
    .await;
}
