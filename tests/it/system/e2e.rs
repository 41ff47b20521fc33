//! End to end: the real `jobset-inplace agent` binary in every simulated pod, the real
//! reconciler in-process, the test API server between them, a simulated kubelet and Job/JobSet
//! controllers ([`jobset_inplace_testkit::kubelet`]). Every test is bounded by a timeout, every
//! child process is killed when its simulation is dropped, and the invariant checker (no worker
//! runs while a registered pod is at an older epoch) runs all along.

use std::future::Future;
use std::time::Duration;

use jobset_inplace::protocol::Dialect;
use jobset_inplace_testkit::kubelet::{SimConfig, Simulation, Snapshot};

const BIN: &str = env!("CARGO_BIN_EXE_jobset-inplace");
/// One wait; generous, for a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(30);
/// One whole test.
const TEST: Duration = Duration::from_secs(80);

/// Without the Job and JobSet controllers' status writes: these tests read the epoch fields at
/// given moments, and JobSet's controller drops them (epoch dialect) until the reconciler writes
/// them again, or for good once the JobSet has failed. `group_restarts_beside_the_controllers_
/// status_writes` runs with them; so does tests/it/system/chaos.rs.
fn config(dialect: Dialect, pods: i64) -> SimConfig {
    let mut c = SimConfig::new(dialect, pods).with_binary(BIN);
    c.status_writers = false;
    c
}

async fn bounded<F: Future<Output = ()>>(test: F) {
    if tokio::time::timeout(TEST, test).await.is_err() {
        panic!("the test did not finish within {TEST:?}");
    }
}

async fn running(sim: &Simulation) -> Snapshot {
    sim.wait_all_running(WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn until(sim: &Simulation, what: &str, done: impl Fn(&Snapshot) -> bool) -> Snapshot {
    sim.wait_for(what, WAIT, done)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn assert_clean(sim: &Simulation, s: &Snapshot) {
    assert!(
        sim.violations().is_empty(),
        "invariant violated: {:?}\n{s}",
        sim.violations()
    );
    for slot in &s.slots {
        assert_eq!(
            slot.state.lone_worker_restarts, 0,
            "a worker restarted alone\n{s}"
        );
    }
}

/// KEP-467's e2e test: once both workers run, one exits non-zero; both pods restart in place
/// (same UIDs), reach the next epoch, the synced field is written, both workers run again.
async fn group_restart(dialect: Dialect, pods: i64) {
    let sim = Simulation::start(config(dialect, pods))
        .await
        .expect("starts");
    let first = running(&sim).await;
    assert_eq!(first.synced, Some(dialect.first_epoch()), "{first}");
    assert!(sim.fail_worker(0, 3));
    let after = until(&sim, "the group restart", |s| {
        s.all_running_after(first.synced)
    })
    .await;
    assert_eq!(after.synced, first.synced.map(|e| e + 1), "{after}");
    assert_eq!(after.deprecated, first.synced, "{after}");
    assert_eq!(
        after.uids(),
        first.uids(),
        "pods restarted in place, not recreated"
    );
    for slot in &after.slots {
        assert_eq!(slot.state.restarts, 1, "{after}");
        assert_eq!(slot.restart_count, 1, "{after}");
        assert_eq!(slot.state.worker_runs, 2, "{after}");
        assert_eq!(slot.epoch, after.synced, "{after}");
    }
    assert_clean(&sim, &after);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kep_e2e_two_pods_epoch_dialect() {
    bounded(group_restart(Dialect::Epoch, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kep_e2e_two_pods_attempt_dialect() {
    bounded(group_restart(Dialect::Attempt, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pods_in_one_job_both_dialects() {
    bounded(async {
        for dialect in Dialect::ALL {
            let mut c = config(dialect, 3);
            c.replicated_jobs[0].replicas = 1;
            c.replicated_jobs[0].parallelism = 3;
            let sim = Simulation::start(c).await.expect("starts");
            let first = running(&sim).await;
            assert!(sim.fail_worker(2, 1));
            let after = until(&sim, "the group restart", |s| {
                s.all_running_after(first.synced)
            })
            .await;
            assert_eq!(after.uids(), first.uids());
            assert!(after.slots.iter().all(|s| s.state.restarts == 1), "{after}");
            assert_clean(&sim, &after);
            sim.shutdown().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_pods_both_dialects() {
    bounded(async {
        for dialect in Dialect::ALL {
            let mut c = config(dialect, 16);
            c.probe_period = Duration::from_millis(25);
            c.check_interval = Some(Duration::from_millis(10));
            let sim = Simulation::start(c).await.expect("starts");
            let first = running(&sim).await;
            assert!(sim.fail_worker(5, 2));
            let after = until(&sim, "the group restart", |s| {
                s.all_running_after(first.synced)
            })
            .await;
            assert_eq!(after.synced, first.synced.map(|e| e + 1), "{after}");
            assert_eq!(after.uids(), first.uids());
            assert!(after.slots.iter().all(|s| s.state.restarts == 1), "{after}");
            assert_clean(&sim, &after);
            sim.shutdown().await;
        }
    })
    .await;
}

/// A node is lost: its pod fails and the Job controller replaces it (new name and UID); the
/// replacement registers a newer epoch, which restarts the others in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_node_replacement_joins_the_next_epoch() {
    bounded(async {
        for dialect in Dialect::ALL {
            let sim = Simulation::start(config(dialect, 3)).await.expect("starts");
            let first = running(&sim).await;
            assert!(sim.fail_node(1));
            let after = until(&sim, "the replacement and the group restart", |s| {
                s.all_running_after(first.synced)
            })
            .await;
            assert_eq!(after.synced, first.synced.map(|e| e + 1), "{after}");
            let (lost, kept) = (&after.slots[1], [&after.slots[0], &after.slots[2]]);
            assert_eq!(lost.state.replacements, 1, "{after}");
            assert_ne!(lost.state.uid, first.slots[1].state.uid);
            assert_eq!(
                lost.state.restarts, 0,
                "the replacement started fresh\n{after}"
            );
            for (slot, before) in kept.iter().zip([&first.slots[0], &first.slots[2]]) {
                assert_eq!(
                    slot.state.uid, before.state.uid,
                    "restarted in place\n{after}"
                );
                assert_eq!(slot.state.restarts, 1, "{after}");
            }
            let failed = sim
                .server()
                .get("pods", &sim.config().namespace, &first.slots[1].state.pod)
                .expect("the failed pod stays");
            assert_eq!(failed["status"]["phase"], "Failed");
            assert_clean(&sim, &after);
            sim.shutdown().await;
        }
    })
    .await;
}

/// Group restarts complete, with no worker beside an older pod, while the Job controller writes
/// Job counts and JobSet's controller rewrites the JobSet's status (dropping the epoch dialect's
/// fields each time) as the real ones do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_restarts_beside_the_controllers_status_writes() {
    bounded(async {
        for dialect in Dialect::ALL {
            let mut c = SimConfig::new(dialect, 4).with_binary(BIN);
            c.status_writers = true;
            let sim = Simulation::start(c).await.expect("starts");
            let mut last = running(&sim).await;
            for round in 0..2 {
                assert!(sim.fail_worker(round % 4, 1));
                last = until(&sim, "a group restart", |s| {
                    s.all_running_after(last.synced)
                })
                .await;
                assert_clean(&sim, &last);
            }
            // The Job controller writes each Job's counts at most once a second: wait for them.
            let ns = sim.config().namespace.clone();
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            loop {
                let jobs = sim.server().list("jobs", Some(&ns));
                let counted = jobs
                    .iter()
                    .any(|j| j["status"]["ready"].as_i64() == Some(1));
                let js = sim
                    .server()
                    .get("jobsets", &ns, &sim.config().jobset_name)
                    .expect("jobset");
                let rows = js["status"]["replicatedJobsStatus"].is_array();
                if counted && rows {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the controllers wrote Job counts ({counted}) and replicatedJobsStatus ({rows}): {jobs:?}\n{js}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            sim.shutdown().await;
        }
    })
    .await;
}

/// Restarts past `maxRestarts` fail the JobSet; no worker starts at the epoch past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_past_max_restarts_fail_the_jobset() {
    bounded(async {
        for dialect in Dialect::ALL {
            let mut c = config(dialect, 2);
            c.max_restarts = 2;
            let sim = Simulation::start(c).await.expect("starts");
            let mut last = running(&sim).await;
            for round in 0..2 {
                assert!(sim.fail_worker(round % 2, 1));
                last = until(&sim, "a group restart within maxRestarts", |s| {
                    s.all_running_after(last.synced)
                })
                .await;
            }
            let allowed = last.synced;
            assert!(sim.fail_worker(0, 1));
            let end = until(&sim, "the JobSet to fail", |s| s.failed.is_some()).await;
            assert_eq!(end.failed.as_deref(), Some("ReachedMaxRestarts"), "{end}");
            assert_eq!(end.synced, allowed, "nothing synced past the limit\n{end}");
            let end = until(&sim, "every pod stopped", |s| {
                s.slots.iter().all(|p| p.state.ended.is_some())
            })
            .await;
            assert!(end.slots.iter().all(|s| s.state.worker_runs == 3), "{end}");
            assert_clean(&sim, &end);
            sim.shutdown().await;
        }
    })
    .await;
}

/// KEP-467 story 2: a worker exit code matched by the Job's `podFailurePolicy` `FailJob` rule,
/// with a JobSet `FailJobSet` rule on `PodFailurePolicy`, fails the JobSet at once: no in-place
/// restart is attempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecoverable_exit_code_fails_the_jobset_without_restart() {
    bounded(async {
        let mut c = config(Dialect::Epoch, 2);
        c.fail_job_exit_code = Some(7);
        let sim = Simulation::start(c).await.expect("starts");
        let first = running(&sim).await;
        assert!(sim.fail_worker(1, 7));
        let end = until(&sim, "the JobSet to fail and its pods to stop", |s| {
            s.failed.is_some() && s.slots.iter().all(|p| p.state.ended.is_some())
        })
        .await;
        assert_eq!(end.failed.as_deref(), Some("FailJobSetAction"), "{end}");
        assert_eq!(end.deprecated, None, "no group restart began\n{end}");
        assert_eq!(end.synced, first.synced, "{end}");
        for slot in &end.slots {
            assert_eq!(slot.state.restarts, 0, "{end}");
            assert_eq!(slot.state.agent_runs, 1, "{end}");
            assert_eq!(slot.state.replacements, 0, "{end}");
        }
        assert_clean(&sim, &end);
        sim.shutdown().await;
    })
    .await;
}

/// The agent alone crashes (SIGKILL): its exit restarts the whole pod in place, and the new
/// epoch restarts every pod; the worker never restarts alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_causes_a_full_group_restart() {
    bounded(async {
        let sim = Simulation::start(config(Dialect::Attempt, 3))
            .await
            .expect("starts");
        let first = running(&sim).await;
        assert!(sim.kill_agent(1));
        let after = until(&sim, "the group restart", |s| {
            s.all_running_after(first.synced)
        })
        .await;
        assert_eq!(after.uids(), first.uids());
        for slot in &after.slots {
            assert_eq!(slot.state.restarts, 1, "{after}");
            assert_eq!(slot.state.agent_runs, 2, "{after}");
            assert_eq!(slot.state.worker_runs, 2, "{after}");
        }
        assert_clean(&sim, &after);
        sim.shutdown().await;
    })
    .await;
}

/// The checker itself: a registered pod at an older epoch than a running worker is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invariant_checker_sees_an_older_pod() {
    bounded(async {
        let mut c = SimConfig::new(Dialect::Epoch, 2);
        c.status_writers = false;
        let sim = Simulation::start(c).await.expect("starts");
        let first = running(&sim).await;
        assert_eq!(first.synced, Some(1));
        let ns = sim.config().namespace.clone();
        let stray = jobset_inplace_testkit::build::Pod::new("stray")
            .namespace(&ns)
            .label("jobset.sigs.k8s.io/jobset-name", "js")
            .epoch("jobset.sigs.k8s.io/epoch", "0")
            .containers(serde_json::json!([]))
            .build();
        sim.server().create("pods", stray).expect("pod");
        let seen = sim
            .wait_for("a violation", WAIT, |s| !s.violations.is_empty())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(seen.violations[0].contains("stray is at epoch 0"), "{seen}");
    })
    .await;
}

/// The status the test API server holds for a position's current pod, once `ok` holds of it.
async fn pod_status_until(
    sim: &Simulation,
    slot: usize,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let name = sim.snapshot().slots[slot].state.pod.clone();
        let status = sim
            .server()
            .get_shared("pods", &sim.config().namespace, &name)
            .map(|p| p.value["status"].clone())
            .unwrap_or_default();
        if ok(&status) {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            panic!(
                "{what}: not within {WAIT:?}: {status:#}\n{}",
                sim.logs(40).join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn restart_counts(status: &serde_json::Value, list: &str) -> Vec<(String, i64)> {
    status[list]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["restartCount"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

/// A user init container and a user sidecar placed before the agent re-run at every group
/// restart, as the kubelet runs every init container again (`computePodActions`): their time
/// counts in the restart, the barrier still holds, each one's `restartCount` is one up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_init_containers_and_sidecars_re_run_at_every_group_restart() {
    bounded(async {
        let mut c = config(Dialect::Epoch, 2);
        c.user_init_containers = vec![("setup".to_owned(), false), ("proxy".to_owned(), true)];
        c.user_container_time = Duration::from_millis(300);
        let sim = Simulation::start(c).await.expect("starts");
        let first = running(&sim).await;
        let failed_at = std::time::Instant::now();
        assert!(sim.fail_worker(0, 3));
        let after = until(&sim, "the group restart", |s| {
            s.all_running_after(first.synced)
        })
        .await;
        let took = failed_at.elapsed();
        assert!(
            took >= Duration::from_millis(600),
            "the init container and the sidecar ran before the agent: {took:?}"
        );
        assert_clean(&sim, &after);
        for slot in 0..after.slots.len() {
            let status = pod_status_until(&sim, slot, "every container restarted once", |s| {
                let inits = restart_counts(s, "initContainerStatuses");
                inits.len() == 3 && inits.iter().all(|(_, n)| *n == 1)
            })
            .await;
            let names: Vec<String> = restart_counts(&status, "initContainerStatuses")
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            assert_eq!(names[..2], ["setup", "proxy"], "{status:#}");
            assert_eq!(restart_counts(&status, "containerStatuses")[0].1, 1);
        }
        sim.shutdown().await;
    })
    .await;
}

/// The agent's startup probe gives up (`failureThreshold` failures: here its agent cannot reach
/// the API after a group restart, so its barrier never lifts): the kubelet restarts the agent
/// container alone (`prober/worker.go`), not the pod; the worker stays behind the barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_probe_that_gives_up_restarts_the_agent_alone() {
    bounded(async {
        let mut c = config(Dialect::Epoch, 2);
        c.probe_failure_threshold = Some(20);
        // No hold: each probe fails at once (with the default, a probe fails once per 290 s).
        c.probe_timeout_seconds = Some(1);
        let sim = Simulation::start(c).await.expect("starts");
        let first = running(&sim).await;
        sim.cut_agent_api(0, 1);
        assert!(sim.fail_worker(0, 3));
        let status = pod_status_until(&sim, 0, "the agent restarted alone", |s| {
            restart_counts(s, "initContainerStatuses")
                .first()
                .is_some_and(|(_, n)| *n >= 2)
        })
        .await;
        assert_eq!(
            restart_counts(&status, "containerStatuses")[0].1,
            1,
            "the worker restarted with the group only: {status:#}"
        );
        assert!(
            status["containerStatuses"][0]["state"]["waiting"].is_object(),
            "the worker waits behind the barrier: {status:#}"
        );
        let s = sim.snapshot();
        assert_eq!(s.slots[0].state.uid, first.slots[0].state.uid, "same pod");
        assert_eq!(s.slots[0].state.restarts, 1, "one group restart: {s}");
        assert!(
            sim.logs(4_000)
                .iter()
                .any(|l| l.contains("startup probe gave up")),
            "the kubelet says why"
        );
        assert_clean(&sim, &s);
        sim.shutdown().await;
    })
    .await;
}
