//! A kubelet without the gate (the reconciler fails the pods whose agents restarted alone);
//! doctor's pull check.

use super::*;

/// A kubelet without `RestartAllContainersOnContainerExits` (`up` with
/// `JOBSET_INPLACE_NODE_RESTART_GATE=off`; docs/protocol.md "A node without the feature"): the
/// kubelet ignores the rules, so the failing worker's pod fails and is replaced, and the other
/// pods' agents restart alone while their workers run on. The reconciler fails and deletes those
/// pods (a `RestartedWithoutWorkers` event naming each and the node), writes no synced epoch
/// while an old worker runs (from the workers' own records: no worker of the new epoch starts
/// before every old one ended), and the JobSet runs again on replacements; `doctor` names the
/// node. The pods are bound to the node by `nodeName`: the scheduler, with `NodeDeclaredFeatures`,
/// keeps them off a node that does not declare the feature.
#[tokio::test]
async fn a_kubelet_without_the_gate_gets_its_pods_failed_not_synced_over() {
    const TEST: &str = "a_kubelet_without_the_gate_gets_its_pods_failed_not_synced_over";
    with_gateless_node(TEST, |node| async move {
        let dialect = installed(&node, TEST)
            .unwrap_or_else(|| panic!("{TEST}: the product must be installed (--install epoch)"));
        let node_name = node
            .env
            .get("NODE_NAME")
            .cloned()
            .expect("node.env NODE_NAME");
        let pinned = node_name.clone();
        let (run, first) = Run::start(&node, "rn-nogate", 3, dialect, move |js| {
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeName"] =
                json!(pinned);
        })
        .await;
        // `startedAt` has whole seconds: the agents restart a second or more after their workers
        // started.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let failing = first.pods.keys().next().expect("a pod").clone();
        let since = run.mark();
        run.exit(&failing, 3);
        // Every pod replaced (none restarts in place here), every worker running one epoch up.
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(150))
            .await;
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        for name in first.pods.keys() {
            assert!(
                !after.pods.contains_key(name),
                "{name} was failed and replaced: {:?}",
                after.pods.keys()
            );
        }
        // From the workers' own records: every old worker ended before any new one started.
        let took = assert_barrier(&run.records(), since, run.size);
        println!(
            "kubelet without the gate: every worker running again on replacements after {} ms",
            took.as_millis()
        );
        // The synced epoch was written for the replacements only.
        eventually("the synced epoch", Duration::from_secs(30), || async {
            match run.synced().await {
                Some(s) if s == after.epoch => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        // The reconciler said why, for each pod whose agent restarted alone (every pod but the
        // failing one, which failed on its own).
        let events: Api<DynamicObject> = Api::namespaced_with(
            node.client.clone(),
            &run._ns.name,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event")),
        );
        let alone: Vec<&String> = first.pods.keys().filter(|n| **n != failing).collect();
        let notes = eventually(
            "a RestartedWithoutWorkers event per pod",
            Duration::from_secs(30),
            || async {
                let list = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let notes: Vec<String> = list
                    .items
                    .iter()
                    .filter(|e| e.data["reason"] == "RestartedWithoutWorkers")
                    .filter_map(|e| e.data["note"].as_str().map(str::to_owned))
                    .collect();
                if alone
                    .iter()
                    .all(|p| notes.iter().any(|n| n.contains(p.as_str())))
                {
                    Ok(notes)
                } else {
                    Err(format!("{notes:?}"))
                }
            },
        )
        .await;
        assert!(
            notes
                .iter()
                .all(|n| n.contains(&node_name)
                    && n.contains("RestartAllContainersOnContainerExits")),
            "{notes:?}"
        );
        // doctor names the node.
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
            text.lines().any(|l| l.contains("node-features")
                && !l.starts_with("ok")
                && l.contains(&node_name)),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await;
}

/// `doctor --pull-check` on a real kubelet: an agent image the node cannot pull (a registry on the
/// node's own loopback, where nothing listens) is a failure naming `ErrImagePull` with the
/// kubelet's message; the pull-check pod lands on the node (tainted or not: it tolerates every
/// taint) and is deleted afterwards.
#[tokio::test]
async fn doctor_pull_check_reports_an_image_the_node_cannot_pull() {
    const TEST: &str = "doctor_pull_check_reports_an_image_the_node_cannot_pull";
    with_node(TEST, |node| async move {
        if installed(&node, TEST).is_none() {
            return;
        }
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .args(["doctor", "--pull-check", "--pull-timeout", "90s"])
            .args(["--agent-image", "127.0.0.1:1/jobset-inplace/nope:1"])
            .args(["--nodes", "jobset-inplace.dev/real-node=true"])
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
            text.lines().any(|l| l.starts_with("FAIL agent-image-pull")
                && l.contains("127.0.0.1:1/jobset-inplace/nope:1")
                && (l.contains("ErrImagePull") || l.contains("ImagePullBackOff"))),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "a failed check exits 1");
        let left = Api::<Pod>::namespaced(node.client.clone(), "default")
            .list(&ListParams::default().labels("app.kubernetes.io/name"))
            .await
            .expect("list pods");
        assert!(
            !left.items.iter().any(|p| p
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("-pull-"))
                && p.metadata.deletion_timestamp.is_none()),
            "the pull-check pod is deleted"
        );
    })
    .await;
}
