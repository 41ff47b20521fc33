//! `cargo bench --bench scale`: what one group restart costs the API server, as a function of
//! the number of pods, with JobSet's and the Job controller's status writes going on.
//!
//! Per size (`JOBSET_INPLACE_SCALE_SIZES`, default `1000,4000,10000`): one JobSet of that many
//! pods on the in-repo test API server, the simulated kubelet, Job and JobSet controllers (pod,
//! Job and JobSet status written as the real ones write them), the agents in-process (one task
//! per pod, on one shared client), and the real reconciler binary in its own process. Once every
//! worker runs, one worker fails; measured until every worker runs again at the next epoch:
//!
//! - API requests per pod, by verb and resource (the test API server's counters);
//! - watch events and bytes delivered per pod, by resource (what the server's watches sent);
//! - the reconciler's CPU time for the group restart and its peak memory (`/proc`);
//! - the time from the failure to the last barrier lifted, and the baseline measured right after
//!   on the same pods: every pod's containers restarted in place at once with nothing to
//!   coordinate (in-place restart disabled on the JobSet, agents lift as soon as they read their
//!   epochs): what the simulated kubelets, the API server and the agents' starts cost at this
//!   size on this machine. The protocol's overhead is the difference.
//!
//! The agents, the kubelets and the API server share this process, and the agents' and
//! kubelets' requests reach the server in memory (`SimConfig::in_memory`: the server's router
//! called directly, no socket): over loopback TCP each agent's watch held a socket at both ends
//! in this one process, and 8,000 pods passed this machine's hard limit of 20,000 open files. The
//! server's work per request and per watch event (and what it counts) is the same; only the
//! loopback connections are left out. The reconciler reaches it over TCP, as in a cluster.
//!
//! `JOBSET_INPLACE_SCALE_WATCH_JOBSET=1` runs the same with the agents watching their JobSet
//! (the test API server does not serve the JobSetEpoch kind): the cost the per-JobSet object
//! removes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobset_inplace::protocol::{DISABLE_ANNOTATION, Dialect};
use jobset_inplace_testkit::apiserver::{Options, TestApiServer, default_resources};
use jobset_inplace_testkit::kubelet::{SimConfig, Simulation};
use jobset_inplace_testkit::process::ReconcilerProcess;
use jobset_inplace_testkit::webhook_harness::env_or;

const BIN: &str = env!("CARGO_BIN_EXE_jobset-inplace");

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Waits until the server has been quiet (no request) for 200 ms, at most `limit`.
async fn settle(server: &TestApiServer, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut seen = server.counters().total();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = server.counters().total();
        if now == seen {
            return;
        }
        seen = now;
    }
}

struct Row {
    pods: usize,
    requests: BTreeMap<String, f64>,
    /// Per resource: events, their bytes, and the bytes of bookmarks, per pod.
    delivered: BTreeMap<String, (f64, f64, f64)>,
    cpu_ms: u64,
    peak_mib: f64,
    took: Duration,
    restart: Duration,
    baseline: Duration,
    phases: Option<Phases>,
}

/// Where the time between the failure and the last barrier lifted went, from the times of the
/// writes that mark each step (the test API server's write log).
struct Phases {
    /// The failure to the reconciler's publication of the new deprecated epoch.
    reaction: Duration,
    /// That publication to the last pod's registration at the new epoch: every agent told,
    /// every pod's containers restarted, every agent's PATCH (the simulation's share, mostly).
    restarts: Duration,
    /// The last registration to the publication of the synced epoch: the reconciler's decision.
    decision: Duration,
    /// That publication to the last barrier lifted: every agent told.
    release: Duration,
}

impl Phases {
    fn from_writes(
        writes: &[jobset_inplace_testkit::apiserver::WriteRecord],
        failed_at: Instant,
        last_lift: Instant,
    ) -> Option<Phases> {
        let published: Vec<Instant> = writes
            .iter()
            .filter(|w| w.resource == "jobsetepochs" && w.at >= failed_at && w.at <= last_lift)
            .map(|w| w.at)
            .collect();
        let (deprecated, synced) = (*published.first()?, *published.last()?);
        let registered = writes
            .iter()
            .filter(|w| w.resource == "pods" && w.at > deprecated && w.at <= synced)
            .map(|w| w.at)
            .max()?;
        Some(Phases {
            reaction: deprecated.saturating_duration_since(failed_at),
            restarts: registered.saturating_duration_since(deprecated),
            decision: synced.saturating_duration_since(registered),
            release: last_lift.saturating_duration_since(synced),
        })
    }
}

impl Row {
    /// The protocol's overhead beyond restarting the containers: the group restart minus the
    /// baseline (restarting every pod's containers, agents included, with nothing to
    /// coordinate), at least 0.
    fn overhead(&self) -> Duration {
        self.took.saturating_sub(self.baseline)
    }

    /// The protocol's own steps: the reconciler's two decisions and the release of every
    /// barrier (the restarts between them are the containers' and the simulation's).
    fn protocol_steps(&self) -> Option<Duration> {
        self.phases
            .as_ref()
            .map(|p| p.reaction + p.decision + p.release)
    }
}

async fn one(pods: usize, watch_jobset: bool) -> Result<Row, String> {
    let mut options = Options {
        // A group restart writes each pod about 5 times (its status 3 times, its epoch, its
        // Job's counts): keep that much history for watches that resume, and let each watcher
        // fall behind that far. (200,000 changes of 10,000 pods held 7 GiB in this process.)
        history_capacity: (6 * pods).max(10_000),
        watcher_buffer: (6 * pods).max(10_000),
        ..Options::default()
    };
    if watch_jobset {
        options.resources = default_resources()
            .into_iter()
            .filter(|r| r.plural != "jobsetepochs")
            .collect();
    }
    let server = Arc::new(TestApiServer::start_with(options).await);
    let dialect = Dialect::Epoch;
    let reconciler = ReconcilerProcess::spawn(
        std::path::Path::new(BIN),
        &server,
        dialect,
        &["--workers", "2"],
    )
    .map_err(|e| format!("cannot start the reconciler: {e}"))?;
    let mut config = SimConfig::new(dialect, pods as i64);
    config.run_reconciler = false;
    config.check_invariant = false;
    config.check_interval = None;
    config.probe_period = Duration::from_millis(100);
    config.restart_delay = Duration::from_millis(100);
    config.log_capacity = 100;
    config.in_memory = true;
    let restart = config.restart_delay;
    let limit = Duration::from_secs(60 + pods as u64 / 50);
    let sim = Simulation::start_on(server.clone(), config)
        .await
        .map_err(|e| format!("cannot start: {e}"))?;
    let first = sim
        .wait_all_running(limit)
        .await
        .map_err(|e| format!("no first start: {e}"))?;
    settle(&server, Duration::from_secs(30)).await;

    server.reset_counters();
    server.clear_writes();
    let ticks = reconciler.cpu_ticks().unwrap_or(0);
    let failed_at = Instant::now();
    sim.fail_worker(0, 1);
    let synced = first.synced;
    let done = sim
        .wait_for("the group restart", limit, |s| s.all_running_after(synced))
        .await
        .map_err(|e| format!("no group restart: {e}"))?;
    let last_lift = done
        .slots
        .iter()
        .filter_map(|p| p.state.worker.map(|w| w.started))
        .max()
        .unwrap_or_else(Instant::now);
    let took = last_lift.saturating_duration_since(failed_at);
    let phases = Phases::from_writes(&server.writes(), failed_at, last_lift);
    // What the restart set off (the last pod statuses, the controllers' status writes) ends.
    settle(&server, Duration::from_secs(10)).await;
    let (counters, deliveries) = (server.counters(), server.deliveries());
    let cpu_ms = reconciler
        .cpu_ticks()
        .unwrap_or(0)
        .saturating_sub(ticks)
        .saturating_mul(10);
    let peak_mib = reconciler.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    let per_pod = |n: u64| n as f64 / pods as f64;
    let requests = counters
        .by
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|((verb, resource), n)| (format!("{verb:?} {resource}"), per_pod(*n)))
        .collect();
    let delivered = deliveries
        .into_iter()
        .map(|(resource, d)| {
            let bookmarks = per_pod(d.bookmark_bytes);
            (resource, (per_pod(d.events), per_pod(d.bytes), bookmarks))
        })
        .collect();
    if !sim.violations().is_empty() {
        return Err(format!("INVARIANT VIOLATED: {:?}", sim.violations()));
    }

    // The baseline, same machine, same run, same pods: every pod restarts its containers in
    // place at once with nothing to coordinate (in-place restart disabled on the JobSet: the
    // agents lift their barrier as soon as they have read their JobSet's epochs). What the
    // simulated kubelets, the API server and the agents' starts cost at this size, without the
    // protocol's round trips.
    server
        .patch(
            "jobsets",
            &sim.config().namespace,
            &sim.config().jobset_name,
            &serde_json::json!({"metadata": {"annotations": {DISABLE_ANNOTATION: "true"}}}),
        )
        .map_err(|e| format!("cannot disable in-place restart: {e:?}"))?;
    let bypassed = || {
        let read =
            |plural: &str| server.get(plural, &sim.config().namespace, &sim.config().jobset_name);
        if watch_jobset {
            read("jobsets").is_some()
        } else {
            read("jobsetepochs").is_some_and(|o| o["epochs"]["bypass"] == true)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !bypassed() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    settle(&server, Duration::from_secs(10)).await;
    let restarted_at = Instant::now();
    for slot in 0..pods {
        sim.fail_worker(slot, 1);
    }
    let all = sim
        .wait_for("every pod restarted", limit, |s| {
            s.slots
                .iter()
                .all(|p| p.state.worker.is_some_and(|w| w.started > restarted_at))
        })
        .await
        .map_err(|e| format!("no baseline restart: {e}"))?;
    let baseline = all
        .slots
        .iter()
        .filter_map(|p| p.state.worker.map(|w| w.started))
        .max()
        .unwrap_or_else(Instant::now)
        .saturating_duration_since(restarted_at);
    sim.shutdown().await;
    drop(reconciler);
    Ok(Row {
        pods,
        requests,
        delivered,
        cpu_ms,
        peak_mib,
        took,
        restart,
        baseline,
        phases,
    })
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sizes: String = env_or("JOBSET_INPLACE_SCALE_SIZES", "1000,4000,10000".to_owned());
    let watch_jobset = env_or("JOBSET_INPLACE_SCALE_WATCH_JOBSET", 0u8) == 1;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return;
        }
    };
    println!(
        "one group restart, agents watching {}; per pod unless said otherwise",
        if watch_jobset {
            "their JobSet (JobSetEpoch not served)"
        } else {
            "their JobSetEpoch"
        }
    );
    let mut rows = Vec::new();
    for size in sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
    {
        match runtime.block_on(one(size, watch_jobset)) {
            Ok(row) => {
                println!(
                    "{:>6} pods: last barrier lifted {:8.1} ms after the failure ({:8.1} ms beyond the {:.0} ms container restart); baseline (every pod restarted at once, nothing to coordinate) {:8.1} ms; group restart minus baseline {:+8.1} ms; reconciler CPU {} ms for the group restart, peak {:.1} MiB",
                    row.pods,
                    ms(row.took),
                    ms(row.took.saturating_sub(row.restart)),
                    ms(row.restart),
                    ms(row.baseline),
                    (row.took.as_secs_f64() - row.baseline.as_secs_f64()) * 1000.0,
                    row.cpu_ms,
                    row.peak_mib
                );
                for (what, n) in &row.requests {
                    println!(
                        "{:>6} pods:   requests  {what:<28} {n:8.2} per pod ({:.0} in all)",
                        row.pods,
                        n * row.pods as f64
                    );
                }
                if let Some(p) = &row.phases {
                    println!(
                        "{:>6} pods:   phases: reaction {:.1} ms, restarts and registrations {:.1} ms, decision {:.1} ms, release {:.1} ms",
                        row.pods,
                        ms(p.reaction),
                        ms(p.restarts),
                        ms(p.decision),
                        ms(p.release)
                    );
                }
                for (resource, (events, bytes, bookmarks)) in &row.delivered {
                    println!(
                        "{:>6} pods:   delivered {resource:<28} {events:8.2} events {bytes:10.0} bytes (and {bookmarks:.0} bytes of bookmarks)",
                        row.pods
                    );
                }
                rows.push(row);
            }
            Err(e) => println!("{size:>6} pods: {e}"),
        }
    }
    if let (Some(small), Some(large)) = (rows.first(), rows.last())
        && large.pods > small.pods
    {
        let size = large.pods as f64 / small.pods as f64;
        let linear = |growth: f64| {
            if growth <= size {
                "at most linear"
            } else {
                "more than linear"
            }
        };
        println!(
            "overhead (group restart minus baseline) at {} pods: {:.1} ms (target: under 3 s)",
            large.pods,
            ms(large.overhead())
        );
        if let (Some(a), Some(b)) = (small.protocol_steps(), large.protocol_steps()) {
            let growth = b.as_secs_f64() / a.as_secs_f64().max(1e-9);
            println!(
                "protocol steps (reaction + decision + release): {:.1} ms at {} pods, {:.1} ms at {} pods: x{growth:.2} for x{size:.0} pods ({})",
                ms(a),
                small.pods,
                ms(b),
                large.pods,
                linear(growth)
            );
        }
    }
}
