//! One tenant's deadline and another tenant's group restarts (issue 21, item 6)

use super::*;

/// Issue 21, item 6: one tenant's group-restart deadline (a 1 s timeout on three JobSets of 24
/// pods whose pods never register) deletes pods while the API server takes 3 s for each pod's
/// `Failed` mark. Before the fix those deletes ran in the reconcile workers (two here, four by
/// default), about 9 s per JobSet, and another tenant's group restart waited for a free worker;
/// now they run off the workers, and the other tenant's restart completes in its normal time.
/// The first tenant's deadline requests in flight never pass the namespace's share
/// (`NAMESPACE_REQUESTS`, 8; without it three JobSets would have 24 in flight), and its steps
/// still complete once the API server is fast again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_s_slow_deadline_deletes_do_not_delay_another_tenant_s_group_restart() {
    bounded(async {
        const A: &str = "tenant-a";
        const B: &str = "tenant-b";
        const PODS: usize = 24;
        let server = TestApiServer::start().await;
        let a_jobsets = ["a0", "a1", "a2"];
        for js in a_jobsets {
            server
                .create("jobsets", JobSet::new(js).namespace(A).replicas(PODS as i64).max_restarts(5).annotation(TIMEOUT_ANNOTATION, "1s").build())
                .expect("jobset");
            for i in 0..PODS {
                server
                    .create("pods", member_of(&server, Pod::worker(A, js, &format!("{js}-{i}")).running().build()))
                    .expect("pod");
            }
        }
        server
            .create("jobsets", JobSet::new("b").namespace(B).replicas(2).max_restarts(5).build())
            .expect("jobset");
        for i in 0..2 {
            server
                .create("pods", member_of(&server, Pod::worker(B, "b", &format!("b-{i}")).running().build()))
                .expect("pod");
        }
        let r = Running::start(
            server.client_named("reconciler"),
            options(Dialect::Epoch, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        // Everyone synced at epoch 1.
        for js in a_jobsets {
            for i in 0..PODS {
                set_epoch_in(&server, A, &format!("{js}-{i}"), 1);
            }
        }
        for i in 0..2 {
            set_epoch_in(&server, B, &format!("b-{i}"), 1);
        }
        until("everyone synced", WAIT, || {
            a_jobsets
                .iter()
                .all(|js| status_field(&server, A, js, "syncedEpoch") == Some(1))
                && status_field(&server, B, "b", "syncedEpoch") == Some(1)
        })
        .await;
        // Tenant A: one pod of each JobSet restarts, the others never register; each Failed
        // mark takes the API server 3 s.
        server.set_latency_for(Verb::Patch, "pods/status", Duration::from_secs(3));
        for js in a_jobsets {
            set_epoch_in(&server, A, &format!("{js}-0"), 2);
        }
        until("tenant A's deadline deleting", WAIT, || {
            server.counters().get(Verb::Patch, "pods/status") >= 8
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // In flight: received by the server and not yet applied.
        let in_flight = || {
            let received = server.counters().get(Verb::Patch, "pods/status");
            let applied = server
                .writes()
                .iter()
                .filter(|w| w.resource == "pods/status")
                .count() as u64;
            received - applied
        };
        let most = std::cell::Cell::new(in_flight());
        // Tenant B: a whole group restart, timed.
        let started = Instant::now();
        set_epoch_in(&server, B, "b-0", 2);
        until("B deprecated", WAIT, || {
            most.set(most.get().max(in_flight()));
            status_field(&server, B, "b", "deprecatedEpoch") == Some(1)
        })
        .await;
        set_epoch_in(&server, B, "b-1", 2);
        until("B synced", WAIT, || {
            most.set(most.get().max(in_flight()));
            status_field(&server, B, "b", "syncedEpoch") == Some(2)
        })
        .await;
        let took = started.elapsed();
        for _ in 0..20 {
            most.set(most.get().max(in_flight()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let most = most.get();
        eprintln!("tenant B's group restart took {took:?}; tenant A's deadline requests in flight at most {most}");
        assert!(
            took < Duration::from_secs(2),
            "tenant B's group restart took {took:?} behind tenant A's deadline deletes"
        );
        assert!(most >= 1, "tenant A's deletes were in flight meanwhile");
        assert!(most <= 8, "{most} deadline requests of one namespace in flight");
        // Tenant A's steps complete once the API server is fast again.
        server.clear_faults();
        until("tenant A's unregistered pods deleted", WAIT, || {
            server.list("pods", Some(A)).len() == a_jobsets.len()
        })
        .await;
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), a_jobsets.len() as f64)
                .await,
            a_jobsets.len() as f64
        );
        r.stop().await;
    })
    .await;
}

/// Issue 21, item 7: the `Failed` mark of an unregistered pod carries the `resourceVersion` the
/// decision saw. A pod that registers while the mark is on its way (here: the API server takes
/// 1.5 s for it; a deposed leader's write sent late is the same case) is not failed nor deleted,
/// and the group restart completes in place. Before, the mark (UID precondition only) failed the
/// pod that had just registered, and the delete followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_registers_while_its_failed_mark_is_on_its_way_is_left_alone() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let server = TestApiServer::start().await;
        store_with_running_pods(
            &server,
            NS,
            JobSet::new("js")
                .namespace(NS)
                .replicas(2)
                .max_restarts(5)
                .annotation(TIMEOUT_ANNOTATION, "1s")
                .build(),
            &["js-0", "js-1"],
        );
        let r = Running::start(
            server.client_named("reconciler"),
            options(dialect, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        let field = |f: &str| {
            server
                .get("jobsets", NS, "js")
                .and_then(|j| j["status"][f].as_i64())
        };
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced", WAIT, || field("syncedEpoch") == Some(1)).await;
        let uid = server.get("pods", NS, "js-1").expect("pod")["metadata"]["uid"].clone();
        server.set_latency_for(Verb::Patch, "pods/status", Duration::from_millis(1_500));
        set_epoch(&server, dialect, "js-0", 2);
        until(
            "the Failed mark sent",
            Duration::from_secs(1) + SLACK,
            || server.counters().get(Verb::Patch, "pods/status") >= 1,
        )
        .await;
        // js-1 registers while the mark waits in the API server.
        set_epoch(&server, dialect, "js-1", 2);
        until("synced at 2", WAIT, || field("syncedEpoch") == Some(2)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let p = server.get("pods", NS, "js-1").expect("js-1 is still there");
        assert_eq!(p["metadata"]["uid"], uid, "the same pod");
        assert_eq!(
            p["status"]["phase"], "Running",
            "not failed: {}",
            p["status"]
        );
        assert!(deletes_by_reconciler(&server, "pods").is_empty());
        assert!(
            server.writes().iter().all(|w| w.resource != "pods/status"),
            "the mark was refused"
        );
        assert_eq!(r.sample(PODS_DELETED).await, 0.0);
        r.stop().await;
    })
    .await;
}

/// A kubelet without `RestartAllContainersOnContainerExits` (docs/protocol.md, "A node without
/// the feature"): the failing worker's pod ends (its rule ignored) and its Job replaces it; the
/// other pods' agents see the deprecation and restart alone while their workers run on from
/// epoch 1. The reconciler fails and deletes those pods (an event naming each, the metric), far
/// within the deadline, and writes no synced epoch while a worker of an older epoch runs: the
/// group restart completes over replacements only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_restarted_without_their_workers_are_failed_and_never_synced_over() {
    bounded(async {
        let mut c = sim_config(3, 10, Duration::from_secs(60));
        c.restart_all_gate = false;
        let (sim, r) = start_sim(c).await;
        let before = sim.snapshot();
        // `startedAt` has whole seconds: the agents restart a second or more after their
        // workers started.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(sim.fail_worker(0, 3));
        // A synced epoch above a running worker's, seen twice for the same worker (a snapshot
        // reads the workers before the JobSet).
        let over = |s: &Snapshot| -> Vec<(String, Instant)> {
            s.slots
                .iter()
                .filter_map(|slot| {
                    let w = slot.state.worker?;
                    (s.synced > w.epoch).then(|| (slot.state.pod.clone(), w.started))
                })
                .collect()
        };
        let limit = Instant::now() + WAIT;
        let s = loop {
            let s = sim.snapshot();
            let first = over(&s);
            if !first.is_empty() {
                let again = sim.snapshot();
                let still: Vec<_> = over(&again)
                    .into_iter()
                    .filter(|w| first.contains(w))
                    .collect();
                assert!(
                    still.is_empty(),
                    "synced epoch {:?} written while workers of an older epoch run: {still:?}\n{again}",
                    again.synced
                );
            }
            if s.all_running_after(Some(1)) {
                break s;
            }
            assert!(Instant::now() < limit, "the group restart did not complete\n{s}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(s.synced, Some(2), "{s}");
        for (slot, old) in s.slots.iter().zip(&before.slots) {
            assert_eq!(slot.state.replacements, 1, "every pod replaced\n{s}");
            assert_ne!(slot.state.uid, old.state.uid, "{s}");
        }
        // The reconciler failed and deleted the two pods whose agents restarted alone (the first
        // pod failed on its own), and said why.
        let mut alone = vec![
            before.slots[1].state.pod.clone(),
            before.slots[2].state.pod.clone(),
        ];
        alone.sort();
        let mut deleted = deletes_by_reconciler(sim.server(), "pods");
        deleted.sort();
        assert_eq!(deleted, alone);
        let ns = sim.config().namespace.clone();
        note(sim.server(), &ns, "RestartedWithoutWorkers").await;
        let wait = Instant::now() + WAIT;
        while events(sim.server(), &ns, "RestartedWithoutWorkers").len() < 2 {
            assert!(Instant::now() < wait, "one event per pod");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let events = events(sim.server(), &ns, "RestartedWithoutWorkers");
        for pod in &alone {
            let e = events
                .iter()
                .find(|e| e["note"].as_str().is_some_and(|n| n.contains(pod.as_str())))
                .unwrap_or_else(|| panic!("no event names {pod}: {events:?}"));
            assert_eq!(e["type"], "Warning");
            let note = e["note"].as_str().unwrap_or_default();
            assert!(
                note.contains("RestartAllContainersOnContainerExits") && note.contains("node"),
                "{note}"
            );
        }
        assert_eq!(
            r.sample("jobset_inplace_reconciler_agents_restarted_alone_total")
                .await,
            2.0
        );
        // Not the deadline's doing.
        assert_eq!(r.sample(PODS_DELETED).await, 0.0);
        assert_eq!(r.sample(&step("unregistered_pods_deleted")).await, 0.0);
        assert_clean(&sim, &s);
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}
