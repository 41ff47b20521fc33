//! Chaos: the end-to-end group restarts of `tests/it/system/e2e.rs` (the real agent binary in every
//! simulated pod, the real reconciler in-process) while the test API server injects faults at
//! random into every request of the agents and the reconciler: 500s, 409s on writes, 429s with
//! `Retry-After`, writes whose answer is lost, latency spikes, and every watch cut after a random
//! lifetime ([`jobset_inplace_testkit::apiserver::chaos`]). The simulated kubelet and
//! controllers are exempt: they are the environment, not the system under test.
//!
//! Each test prints its seed first; `JOBSET_INPLACE_CHAOS_SEED=<n>` replays it (else the seed
//! comes from the clock). The invariant checker runs all along (every few milliseconds and at
//! every worker start) and no violation may appear; every group restart must complete within
//! [`RESTART_BOUND`]; each test ends with a summary line of the faults injected by kind.
//!
//! The soak (`#[ignore]`) runs many seeds in a row:
//!
//! ```text
//! JOBSET_INPLACE_CHAOS_ROUNDS=100 cargo test --test it system::chaos::soak -- --ignored --nocapture
//! ```
//!
//! (`JOBSET_INPLACE_CHAOS_SECS=<s>` bounds it by time instead.) Round `r` uses the soak's seed
//! plus `r`, and draws its scenario from it: `JOBSET_INPLACE_CHAOS_SEED=<round seed>
//! JOBSET_INPLACE_CHAOS_ROUNDS=1` replays one round. `JOBSET_INPLACE_CHAOS_LOGS=1` prints the
//! simulation's log (agents' output) after every group restart, and the reconciler's log.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobset_inplace::protocol::Dialect;
use jobset_inplace_testkit::apiserver::{Chaos, ChaosStats, TestApiServer};
use jobset_inplace_testkit::kubelet::{SimConfig, Simulation, Snapshot};

const BIN: &str = env!("CARGO_BIN_EXE_jobset-inplace");
/// Every group restart (and the first start) completes within this, under chaos, on a loaded
/// 2-core machine.
const RESTART_BOUND: Duration = Duration::from_secs(45);
/// One whole test.
const TEST: Duration = Duration::from_secs(170);

/// The seed of a test: `JOBSET_INPLACE_CHAOS_SEED`, else from the clock; printed.
fn seed(test: &str) -> u64 {
    let seed = match std::env::var("JOBSET_INPLACE_CHAOS_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("JOBSET_INPLACE_CHAOS_SEED={s:?} is not a number")),
        Err(_) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            // Low digits vary between runs and between tests started together.
            (now.as_nanos() % 1_000_000_000) as u64
        }
    };
    let ignored = if test == "soak" {
        " -- --ignored --nocapture"
    } else {
        ""
    };
    println!(
        "chaos seed {seed} ({test}); replay: JOBSET_INPLACE_CHAOS_SEED={seed} cargo test --test it system::chaos::{test}{ignored}"
    );
    seed
}

async fn bounded<F: Future<Output = ()>>(test: F) {
    if tokio::time::timeout(TEST, test).await.is_err() {
        panic!("the test did not finish within {TEST:?}");
    }
}

/// What happens to the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A worker exits non-zero: its pod restarts in place, then every pod.
    WorkerCrash,
    /// A node is lost: its pod fails and is replaced; the others restart in place.
    NodeLoss,
    /// An agent is killed: its pod restarts in place, then every pod.
    AgentCrash,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::WorkerCrash, Fault::NodeLoss, Fault::AgentCrash];
}

/// What one simulation under chaos did.
#[derive(Debug, Default)]
struct Outcome {
    stats: ChaosStats,
    restarts: u32,
    slowest: Duration,
    total: Duration,
}

impl Outcome {
    fn add(&mut self, o: &Outcome) {
        self.stats.add(&o.stats);
        self.restarts += o.restarts;
        self.slowest = self.slowest.max(o.slowest);
        self.total += o.total;
    }
}

fn config(dialect: Dialect, pods: i64) -> SimConfig {
    let mut c = SimConfig::new(dialect, pods).with_binary(BIN);
    if pods > 8 {
        c.probe_period = Duration::from_millis(25);
        c.check_interval = Some(Duration::from_millis(10));
    }
    // Each restart raises the epoch by one; several rounds stay well within the limit.
    c.max_restarts = 100;
    c
}

fn assert_clean(sim: &Simulation, s: &Snapshot, seed: u64) {
    assert!(
        sim.violations().is_empty(),
        "seed {seed}: invariant violated: {:?}\n{s}",
        sim.violations()
    );
    for slot in &s.slots {
        assert_eq!(
            slot.state.lone_worker_restarts, 0,
            "seed {seed}: a worker restarted alone\n{s}"
        );
    }
}

/// Starts `pods` pods under chaos with `seed`, waits for them to run, then applies each fault
/// in turn and waits for its group restart, checking the invariant and the bound all along.
async fn run(seed: u64, dialect: Dialect, pods: i64, faults: &[Fault]) -> Outcome {
    run_with(Chaos::new(seed), dialect, pods, faults).await
}

/// [`Chaos::new`] with every probability multiplied by `factor` (at most 1).
fn intense(seed: u64, factor: f64) -> Chaos {
    let mut c = Chaos::new(seed);
    for p in [
        &mut c.error_500,
        &mut c.conflict_409,
        &mut c.throttle_429,
        &mut c.lost_response,
        &mut c.latency_spike,
    ] {
        *p = (*p * factor).min(1.0);
    }
    c
}

async fn run_with(chaos: Chaos, dialect: Dialect, pods: i64, faults: &[Fault]) -> Outcome {
    let seed = chaos.seed;
    if std::env::var_os("JOBSET_INPLACE_CHAOS_LOGS").is_some() {
        crate::logs::captured();
    }
    let server = TestApiServer::start().await;
    server.set_chaos(Some(chaos));
    let sim = Simulation::start_on(Arc::new(server), config(dialect, pods))
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let started = Instant::now();
    let mut last = sim
        .wait_all_running(RESTART_BOUND)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: the first start: {e}"));
    assert_clean(&sim, &last, seed);
    let mut outcome = Outcome::default();
    for (round, fault) in faults.iter().enumerate() {
        // A position chosen by the seed.
        let slot = ((seed >> 8).wrapping_add(round as u64 * 7) % pods as u64) as usize;
        let before = last.clone();
        let at = Instant::now();
        let sent = match fault {
            Fault::WorkerCrash => sim.fail_worker(slot, 3),
            Fault::NodeLoss => sim.fail_node(slot),
            Fault::AgentCrash => sim.kill_agent(slot),
        };
        assert!(sent, "seed {seed}: cannot reach position {slot}");
        let what = format!("the group restart after {fault:?} of position {slot}");
        last = sim
            .wait_for(&what, RESTART_BOUND, |s| s.all_running_after(before.synced))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "seed {seed} ({dialect:?}, {pods} pods): {e}\nchaos: {}",
                    sim.server().chaos_stats()
                )
            });
        let took = at.elapsed();
        if std::env::var_os("JOBSET_INPLACE_CHAOS_LOGS").is_some() {
            println!(
                "--- seed {seed}: {what} took {:.2} s; the simulation's log:",
                took.as_secs_f64()
            );
            for line in sim
                .logs(usize::MAX)
                .iter()
                .filter(|l| !l.contains("\"level\":\"DEBUG\""))
            {
                println!("{line}");
            }
        }
        outcome.restarts += 1;
        outcome.slowest = outcome.slowest.max(took);
        assert_eq!(
            last.synced,
            before.synced.map(|e| e + 1),
            "seed {seed}: one restart, one epoch\n{last}"
        );
        assert_eq!(last.deprecated, before.synced, "seed {seed}\n{last}");
        for (i, (now, then)) in last.slots.iter().zip(&before.slots).enumerate() {
            let replaced = *fault == Fault::NodeLoss && i == slot;
            if replaced {
                assert_ne!(now.state.uid, then.state.uid, "seed {seed}\n{last}");
                assert_eq!(
                    now.state.replacements,
                    then.state.replacements + 1,
                    "seed {seed}\n{last}"
                );
            } else {
                assert_eq!(
                    now.state.uid, then.state.uid,
                    "seed {seed}: restarted in place\n{last}"
                );
                assert_eq!(
                    now.state.restarts,
                    then.state.restarts + 1,
                    "seed {seed}: one in-place restart per group restart\n{last}"
                );
            }
            assert_eq!(now.epoch, last.synced, "seed {seed}\n{last}");
        }
        assert_clean(&sim, &last, seed);
    }
    outcome.total = started.elapsed();
    outcome.stats = sim.server().chaos_stats();
    // Calm before the shutdown, so that it is quick.
    sim.server().set_chaos(None);
    let end = sim.snapshot();
    assert_clean(&sim, &end, seed);
    sim.shutdown().await;
    outcome
}

/// SplitMix64's finaliser: consecutive seeds give unrelated scenarios.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn summary(test: &str, seed: u64, o: &Outcome) {
    println!(
        "chaos summary ({test}, seed {seed}): {} group restarts completed, slowest {:.2} s, 0 violations; {}",
        o.restarts,
        o.slowest.as_secs_f64(),
        o.stats
    );
}

/// One scenario in both dialects, with 3 pods and with 16.
async fn scenario(test: &str, faults: &[Fault]) {
    let seed = seed(test);
    let mut total = Outcome::default();
    for (i, (dialect, pods)) in [
        (Dialect::Epoch, 3),
        (Dialect::Attempt, 16),
        (Dialect::Attempt, 3),
        (Dialect::Epoch, 16),
    ]
    .into_iter()
    .enumerate()
    {
        let o = run(seed.wrapping_add(i as u64), dialect, pods, faults).await;
        println!(
            "  {dialect:?}, {pods} pods: {} restarts in {:.1} s (slowest {:.2} s); {}",
            o.restarts,
            o.total.as_secs_f64(),
            o.slowest.as_secs_f64(),
            o.stats
        );
        total.add(&o);
    }
    summary(test, seed, &total);
    assert!(
        total.stats.faults() > 0,
        "seed {seed}: chaos injected nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_crash_under_chaos() {
    bounded(scenario(
        "worker_crash_under_chaos",
        &[Fault::WorkerCrash, Fault::WorkerCrash],
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_loss_under_chaos() {
    bounded(scenario("node_loss_under_chaos", &[Fault::NodeLoss])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_under_chaos() {
    bounded(scenario("agent_crash_under_chaos", &[Fault::AgentCrash])).await;
}

/// Many seeds in a row, each a random scenario (dialect, 2 to 16 pods, three faults in a row,
/// the default fault rates times 1, 2 or 3): `JOBSET_INPLACE_CHAOS_ROUNDS` rounds (default 20)
/// or `JOBSET_INPLACE_CHAOS_SECS` seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: JOBSET_INPLACE_CHAOS_ROUNDS=100 cargo test --test it system::chaos::soak -- --ignored --nocapture"]
async fn soak() {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let secs = env("JOBSET_INPLACE_CHAOS_SECS");
    let rounds =
        env("JOBSET_INPLACE_CHAOS_ROUNDS").unwrap_or(if secs.is_some() { u64::MAX } else { 20 });
    let deadline = secs.map(|s| Instant::now() + Duration::from_secs(s));
    let base = seed("soak");
    let mut total = Outcome::default();
    let mut round = 0;
    while round < rounds && deadline.is_none_or(|d| Instant::now() < d) {
        let seed = base.wrapping_add(round);
        let mut pick = mix(seed);
        let mut draw = |n: u64| {
            let x = pick % n;
            pick /= n;
            x
        };
        let dialect = Dialect::ALL[draw(2) as usize];
        let pods = [2, 3, 5, 16][draw(4) as usize];
        let faults: Vec<Fault> = (0..3).map(|_| Fault::ALL[draw(3) as usize]).collect();
        let factor = [1.0, 2.0, 3.0][draw(3) as usize];
        let started = Instant::now();
        let chaos = intense(seed, factor);
        let o = tokio::time::timeout(TEST, run_with(chaos, dialect, pods, &faults))
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: round did not finish within {TEST:?}"));
        println!(
            "round {round} seed {seed}: {dialect:?}, {pods} pods, {faults:?}, rates x{factor}: {:.1} s, slowest restart {:.2} s; {}",
            started.elapsed().as_secs_f64(),
            o.slowest.as_secs_f64(),
            o.stats
        );
        total.add(&o);
        round += 1;
    }
    println!("soak: {round} rounds from seed {base}");
    summary("soak", base, &total);
}
