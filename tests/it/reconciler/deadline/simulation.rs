//! On the simulation: a dead kubelet, a pod that never registers, a fallback at maxRestarts

use super::*;

/// (a) The kubelet of one node dies: its pod stays `Running` at epoch 1, its agent never sees
/// the deprecation. The other pods restart in place and wait; one window after the deprecation
/// the dead pod is deleted, its Job replaces it, and the group restart completes at epoch 2, in
/// place for every other pod, without a recreation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_kubelet_s_pod_is_replaced_within_the_first_window() {
    bounded(async {
        let timeout = Duration::from_secs(2);
        let (sim, r) = start_sim(sim_config(3, 10, timeout)).await;
        let before = sim.snapshot();
        let jobs = sim.jobs();
        assert!(sim.kill_kubelet(1));
        let started = Instant::now();
        assert!(sim.fail_worker(0, 1));
        sim_until(&sim, "the deprecation", WAIT, |s| s.deprecated == Some(1)).await;
        // Within the first window the dead pod is still there: nothing happens early.
        tokio::time::sleep(timeout / 2).await;
        let s = sim.snapshot();
        assert_eq!(s.slots[1].state.pod, before.slots[1].state.pod, "{s}");
        assert_eq!(s.synced, Some(1), "{s}");
        let s = sim_until(&sim, "every worker at epoch 2", timeout * 2 + SLACK, |s| {
            s.all_running_after(Some(1))
        })
        .await;
        let took = started.elapsed();
        assert!(
            took >= timeout,
            "completed after {took:?}, before the timeout\n{s}"
        );
        assert_clean(&sim, &s);
        // The dead pod was replaced; the others restarted in place (same UIDs); no recreation.
        assert_ne!(s.slots[1].state.uid, before.slots[1].state.uid);
        assert_eq!(s.slots[1].state.replacements, 1);
        for i in [0, 2] {
            assert_eq!(s.slots[i].state.uid, before.slots[i].state.uid, "{s}");
        }
        assert_eq!((s.restarts, s.restarts_count_towards_max), (0, 0));
        assert_eq!(sim.jobs(), jobs, "the Jobs are the same");
        assert_eq!(
            deletes_by_reconciler(sim.server(), "pods"),
            [before.slots[1].state.pod.clone()]
        );
        assert!(deletes_by_reconciler(sim.server(), "jobs").is_empty());
        // Visible: events and metrics.
        let ns = sim.config().namespace.clone();
        let timed_out = note(sim.server(), &ns, "GroupRestartTimedOut").await;
        assert!(
            timed_out.contains("epoch 2") && timed_out.contains(&before.slots[1].state.pod),
            "{timed_out}"
        );
        let deleted = note(sim.server(), &ns, "UnregisteredPodsDeleted").await;
        assert!(deleted.contains(&before.slots[1].state.pod), "{deleted}");
        assert!(events(sim.server(), &ns, "FallingBackToRecreate").is_empty());
        for e in events(sim.server(), &ns, "GroupRestartTimedOut") {
            assert_eq!(e["type"], "Warning");
        }
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        assert_eq!(r.sample(&step("recreated")).await, 0.0);
        assert_eq!(r.sample(&step("failed")).await, 0.0);
        assert_eq!(r.sample(PODS_DELETED).await, 1.0);
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}

/// (b) One pod's agent cannot reach the API after its in-place restart, nor can its
/// replacement's: one window after the deprecation it is deleted, its replacement never
/// registers either, and one window later the JobSet falls back to recreating its pods as
/// JobSet's `Recreate` does. Its Jobs are deleted and created again at restart-attempt 1, the
/// pods of the new Jobs register, and the group restart completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_registers_falls_back_to_recreation() {
    bounded(async {
        let timeout = Duration::from_secs(2);
        let (sim, r) = start_sim(sim_config(3, 10, timeout)).await;
        let before = sim.snapshot();
        let jobs = sim.jobs();
        assert_eq!(jobs.len(), 3);
        assert!(jobs.iter().all(|(_, _, attempt)| attempt == "0"));
        sim.cut_agent_api(1, 2);
        let started = Instant::now();
        assert!(sim.fail_worker(0, 1));
        sim_until(&sim, "the deprecation", WAIT, |s| s.deprecated == Some(1)).await;
        let s = sim_until(
            &sim,
            "the unregistered pod replaced",
            timeout + SLACK,
            |s| s.slots[1].state.replacements == 1,
        )
        .await;
        assert_eq!(s.restarts, 0, "no recreation within the second window\n{s}");
        let s = sim_until(&sim, "a recreation", timeout + SLACK, |s| s.restarts == 1).await;
        let took = started.elapsed();
        assert!(
            took >= timeout * 2,
            "recreated after {took:?}, before two windows\n{s}"
        );
        assert_eq!(s.restarts_count_towards_max, 1);
        let s = sim_until(
            &sim,
            "every worker at epoch 2 after the recreation",
            WAIT,
            |s| s.all_running_after(Some(1)),
        )
        .await;
        assert_clean(&sim, &s);
        // Every pod is new, and every Job: same names, new UIDs, restart-attempt 1.
        for (i, slot) in s.slots.iter().enumerate() {
            assert_ne!(slot.state.uid, before.slots[i].state.uid, "{s}");
        }
        let now = sim.jobs();
        assert_eq!(now.len(), 3);
        for ((name, uid, attempt), (old_name, old_uid, _)) in now.iter().zip(&jobs) {
            assert_eq!(name, old_name);
            assert_ne!(uid, old_uid);
            assert_eq!(attempt, "1");
        }
        assert_eq!(deletes_by_reconciler(sim.server(), "pods").len(), 1);
        // Visible: the fallback's event and metrics (the Jobs may have gone by the reconciler's
        // deletes or by JobSet's controller's, whichever came first).
        let ns = sim.config().namespace.clone();
        let fallback = note(sim.server(), &ns, "FallingBackToRecreate").await;
        assert!(
            fallback.contains("status.restarts 1") && fallback.contains("1 of maxRestarts 10"),
            "{fallback}"
        );
        assert_eq!(
            events(sim.server(), &ns, "FallingBackToRecreate")[0]["type"],
            "Warning"
        );
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        assert_eq!(r.sample_reaching(&step("recreated"), 1.0).await, 1.0);
        assert_eq!(r.sample(&step("failed")).await, 0.0);
        assert!(r.sample(JOBS_DELETED).await <= 3.0);
        assert!(r.metrics().await.contains(
            "jobset_inplace_reconciler_status_writes_total{field=\"restarts\",result=\"ok\"} 1"
        ));
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}

/// (d) maxRestarts 1 and a pod that never registers, however often it is replaced: the first
/// fallback recreates (1 restart counted), the second would pass maxRestarts and fails the JobSet
/// as the epoch algorithm does (`ReachedMaxRestarts`); nothing more is recreated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_at_max_restarts_fails_the_jobset() {
    bounded(async {
        let timeout = Duration::from_millis(1500);
        let (sim, r) = start_sim(sim_config(2, 1, timeout)).await;
        sim.cut_agent_api(1, 1_000);
        assert!(sim.fail_worker(0, 1));
        let s = sim_until(&sim, "a first recreation", timeout * 2 + SLACK * 2, |s| {
            s.restarts == 1
        })
        .await;
        assert_eq!(s.failed, None, "{s}");
        let s = sim_until(&sim, "the JobSet failed", timeout * 4 + SLACK * 2, |s| {
            s.failed.is_some()
        })
        .await;
        assert_eq!(s.failed.as_deref(), Some("ReachedMaxRestarts"), "{s}");
        assert_eq!((s.restarts, s.restarts_count_towards_max), (1, 1), "{s}");
        assert_clean(&sim, &s);
        let ns = sim.config().namespace.clone();
        let failed = note(sim.server(), &ns, "MaxRestartsExceeded").await;
        assert!(
            failed.contains("would pass maxRestarts 1") && failed.contains("1 restarts counted"),
            "{failed}"
        );
        let js = sim.server().get("jobsets", &ns, "js").expect("the JobSet");
        assert_eq!(js["status"]["terminalState"], "Failed");
        assert_eq!(r.sample_reaching(&step("recreated"), 1.0).await, 1.0);
        assert_eq!(r.sample_reaching(&step("failed"), 1.0).await, 1.0);
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 2.0)
                .await,
            2.0
        );
        assert_eq!(
            r.sample("jobset_inplace_reconciler_failed_jobsets_total")
                .await,
            1.0
        );
        // A failed JobSet is left alone.
        let writes = sim.server().counters().get(Verb::Patch, "jobsets/status");
        tokio::time::sleep(timeout * 2).await;
        assert_eq!(
            sim.server().counters().get(Verb::Patch, "jobsets/status"),
            writes
        );
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}
