//! `cargo bench --bench webhook`: the HTTPS webhook in-process on loopback, driven over TLS by N
//! keep-alive connections, `/mutate` side by side with `POST /ping` (same body, same TLS, same
//! HTTP stack; the handler only reads the body: the ceiling of the server).
//!
//! Phases, each `JOBSET_INPLACE_BENCH_SECS` long (default 5): max throughput on `/ping`, then on
//! `/mutate`; a fixed rate of `JOBSET_INPLACE_BENCH_RATE` req/s (default 1000) on `/ping`, then
//! on `/mutate`. `JOBSET_INPLACE_BENCH_CONNECTIONS` (default 16) connections. Latency is
//! measured from writing each request; the fixed-rate phases also report it from each request's
//! due time (no coordinated omission, but tokio's 1 ms timer granularity included). Targets: `/mutate` >= 70 % of `/ping`'s throughput; p99 < 5 ms at 1,000 req/s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobset_inplace::admission::{self, Endpoint};
use jobset_inplace_testkit::webhook_harness::{Conn, TestServer};
use jobset_inplace_testkit::{fixtures, webhook_harness};

/// The request body: the largest fixture request when it is at least 20 KB of JSON, else a
/// synthetic JobSet of 20-50 KB.
fn body() -> (String, Vec<u8>) {
    fixtures::largest_request(20 * 1024)
}

struct Stats {
    requests: usize,
    errors: usize,
    elapsed: Duration,
    /// From the moment the request was written, sorted.
    latencies_us: Vec<u32>,
    /// Fixed rate only: from the moment the request was due (timer lateness and queueing behind
    /// a late response included), sorted.
    scheduled_us: Vec<u32>,
}

impl Stats {
    fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> f64 {
        percentile(&self.latencies_us, p)
    }
}

/// The `p`-th percentile of sorted microseconds, in milliseconds.
fn percentile(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted_us.len() - 1) as f64).round() as usize;
    f64::from(sorted_us[rank.min(sorted_us.len() - 1)]) / 1000.0
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

impl Stats {
    fn merge(parts: Vec<(Vec<u32>, Vec<u32>, usize)>, duration: Duration) -> Stats {
        let mut latencies_us = Vec::new();
        let mut scheduled_us = Vec::new();
        let mut errors = 0;
        for (l, s, e) in parts {
            latencies_us.extend(l);
            scheduled_us.extend(s);
            errors += e;
        }
        latencies_us.sort_unstable();
        scheduled_us.sort_unstable();
        Stats {
            requests: latencies_us.len(),
            errors,
            // Requests are only started before the deadline.
            elapsed: duration,
            latencies_us,
            scheduled_us,
        }
    }
}

/// `connections` keep-alive connections POST `body` to `path` for `duration`; with `rate`, at that
/// total rate (open loop, latency from the scheduled time), else as fast as they can.
async fn drive(
    server: &TestServer,
    path: &'static str,
    body: Arc<Vec<u8>>,
    connections: usize,
    duration: Duration,
    rate: Option<f64>,
) -> Stats {
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(server.connect().await.expect("connect"));
    }
    let request = Arc::new(Conn::encode(
        "POST",
        path,
        Some("application/json"),
        body.as_slice(),
    ));
    let start = Instant::now() + Duration::from_millis(20);
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(connections);
    for (i, mut conn) in conns.into_iter().enumerate() {
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 14);
            let mut scheduled = Vec::new();
            let mut errors = 0usize;
            // Each connection carries 1/connections of the rate, staggered.
            let interval = rate.map(|r| Duration::from_secs_f64(connections as f64 / r));
            let mut next = match interval {
                Some(iv) => start + iv.mul_f64(i as f64 / connections as f64),
                None => start,
            };
            tokio::time::sleep_until(start.into()).await;
            loop {
                if interval.is_some() {
                    if next >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(next.into()).await;
                } else if Instant::now() >= deadline {
                    break;
                }
                let sent = Instant::now();
                let result = async {
                    conn.send(&request).await?;
                    conn.read_response().await
                }
                .await;
                match result {
                    Ok(response) if response.status < 500 => {
                        latencies.push(micros(sent.elapsed()));
                        if interval.is_some() {
                            scheduled.push(micros(next.elapsed()));
                        }
                    }
                    Ok(_) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
                if let Some(iv) = interval {
                    next += iv;
                }
            }
            (latencies, scheduled, errors)
        }));
    }
    let mut parts = Vec::with_capacity(tasks.len());
    for task in tasks {
        parts.push(task.await.expect("client task"));
    }
    Stats::merge(parts, duration)
}

fn row(phase: &str, path: &str, stats: &Stats) {
    let scheduled = if stats.scheduled_us.is_empty() {
        "-".to_owned()
    } else {
        format!("{:.3}", percentile(&stats.scheduled_us, 99.0))
    };
    println!(
        "{phase:<18} {path:<8} {:>8} {:>8.0} {:>7.3} {:>7.3} {:>8.3} {:>7.3} {:>10} {:>6}",
        stats.requests,
        stats.throughput(),
        stats.percentile(50.0),
        stats.percentile(99.0),
        stats.percentile(99.9),
        stats
            .latencies_us
            .last()
            .map_or(f64::NAN, |m| f64::from(*m) / 1000.0),
        scheduled,
        stats.errors
    );
}

fn main() {
    let seconds: f64 = webhook_harness::env_or("JOBSET_INPLACE_BENCH_SECS", 5.0);
    let connections: usize = webhook_harness::env_or("JOBSET_INPLACE_BENCH_CONNECTIONS", 16);
    let rate: f64 = webhook_harness::env_or("JOBSET_INPLACE_BENCH_RATE", 1000.0);
    let duration = Duration::from_secs_f64(seconds);
    // Server and client on separate runtimes (two worker threads each), as two processes
    // sharing this machine would be: a review running on a server worker never holds up the
    // client's own tasks.
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let server_runtime = runtime("bench-server");
    let client_runtime = runtime("bench-client");
    let server = server_runtime.block_on(TestServer::start(Duration::from_secs(5)));
    client_runtime.block_on(async move {
        let (what, body) = body();
        let body = Arc::new(body);

        // The server answers exactly what the in-process review answers.
        let expected = admission::review(Endpoint::Mutate, &body, &server.config);
        let mut check = server.connect().await.expect("connect");
        let first = check.post_json("/mutate", &body).await.expect("mutate");
        assert_eq!(first.status, expected.http_status);
        assert_eq!(first.body, expected.body);
        drop(check);
        let started = Instant::now();
        let reviews = 200;
        for _ in 0..reviews {
            std::hint::black_box(admission::review(Endpoint::Mutate, &body, &server.config));
        }
        let review_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(reviews);

        println!(
            "webhook benchmark: {what}, {} bytes; /mutate answers HTTP {} ({:?}), {} bytes; \
             admission::review alone: {review_us:.0} us/request",
            body.len(),
            expected.http_status,
            expected.decision.outcome,
            expected.body.len(),
        );
        println!(
            "{connections} keep-alive TLS connections, {seconds} s per phase, {} CPUs, client and \
             server in one process on separate 2-thread runtimes",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );

        // Warm up both paths (allocator, caches).
        let warm = Duration::from_millis(500);
        drive(&server, "/ping", body.clone(), connections, warm, None).await;
        drive(&server, "/mutate", body.clone(), connections, warm, None).await;

        println!(
            "latency in ms from writing a request to reading its whole response; \"p99 sched\": \
             from the time the request was due (tokio's 1 ms timer lateness included)"
        );
        println!(
            "{:<18} {:<8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>7} {:>10} {:>6}",
            "phase",
            "endpoint",
            "requests",
            "req/s",
            "p50",
            "p99",
            "p99.9",
            "max",
            "p99 sched",
            "errors"
        );
        let ping_max = drive(&server, "/ping", body.clone(), connections, duration, None).await;
        row("max throughput", "/ping", &ping_max);
        let mutate_max = drive(
            &server,
            "/mutate",
            body.clone(),
            connections,
            duration,
            None,
        )
        .await;
        row("max throughput", "/mutate", &mutate_max);
        let label = format!("fixed {rate:.0} req/s");
        let ping_rate = drive(
            &server,
            "/ping",
            body.clone(),
            connections,
            duration,
            Some(rate),
        )
        .await;
        row(&label, "/ping", &ping_rate);
        let mutate_rate = drive(
            &server,
            "/mutate",
            body.clone(),
            connections,
            duration,
            Some(rate),
        )
        .await;
        row(&label, "/mutate", &mutate_rate);

        let ratio = mutate_max.throughput() / ping_max.throughput() * 100.0;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!(
            "CPU per request (client + server, {cpus} CPUs busy): /ping {:.0} us, /mutate {:.0} us; \
             admission::review alone {review_us:.0} us",
            cpus as f64 * 1e6 / ping_max.throughput(),
            cpus as f64 * 1e6 / mutate_max.throughput(),
        );
        let p99 = mutate_rate.percentile(99.0);
        let p99_scheduled = percentile(&mutate_rate.scheduled_us, 99.0);
        println!(
            "/mutate throughput = {ratio:.1} % of /ping's (target >= 70 %: {})",
            if ratio >= 70.0 { "met" } else { "NOT met" }
        );
        println!(
            "/mutate p99 at {rate:.0} req/s = {p99:.3} ms, {p99_scheduled:.3} ms from the due time \
             (target < 5 ms: {})",
            if p99.max(p99_scheduled) < 5.0 {
                "met"
            } else {
                "NOT met"
            }
        );
        server.stop().await;
    });
}
