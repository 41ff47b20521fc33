//! End to end: the real `jobset-inplace agent` binary in every simulated pod, the real
//! reconciler in-process, the test API server between them, a simulated kubelet and Job/JobSet
//! controllers ([`jobset_inplace::testing::kubelet`]). Every test is bounded by a timeout, every
//! child process is killed when its simulation is dropped, and the invariant checker (no worker
//! runs while a registered pod is at an older epoch) runs all along.

use std::future::Future;
use std::time::Duration;

use jobset_inplace::protocol::Dialect;
use jobset_inplace::testing::kubelet::{AgentMode, SimConfig, Simulation, Snapshot};

const BIN: &str = env!("CARGO_BIN_EXE_jobset-inplace");
/// One wait; generous, for a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(30);
/// One whole test.
const TEST: Duration = Duration::from_secs(80);

fn config(dialect: Dialect, pods: i64) -> SimConfig {
    SimConfig::new(dialect, pods).with_binary(BIN)
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
