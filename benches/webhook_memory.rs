//! `cargo bench --bench webhook_memory`: does the webhook's memory stay flat under sustained
//! load? Runs the release binary (`jobset-inplace webhook`, as deployed: its own process, its own
//! allocator) and drives it as hard as it goes with the largest fixture request, then samples
//! its resident set (`VmRSS` in `/proc/<pid>/status`) every second.
//!
//! Load: `JOBSET_INPLACE_BENCH_CONNECTIONS` (default 16) keep-alive TLS connections alternating
//! `/mutate` and `/validate`, plus 2 clients that open a new TLS connection for every request
//! (connection set-up and tear-down are where per-connection state would leak), for
//! `JOBSET_INPLACE_BENCH_SECS` (default 60) seconds, the first `JOBSET_INPLACE_BENCH_WARMUP_SECS`
//! (default 10) of them warm-up.
//!
//! `JOBSET_INPLACE_BENCH_BODY_BYTES=7340032` pads the request with spaces to that size (7 MiB,
//! the limit): then the clients hold more bodies than `--max-body-bytes-in-flight` (64 MiB)
//! admits, the server sheds the excess with 429 and closes those connections without reading the
//! rest of the body (this client writes a whole request before reading, so it mostly sees the
//! close: counted as "cut" apart from wrong answers), and RSS shows the budget at work. With
//! glibc, the resident set then also holds what the allocator keeps of freed 7 MiB buffers
//! (`MALLOC_MMAP_THRESHOLD_=1048576` in the environment shows the difference).
//!
//! Reported: the mean RSS of the 10 s after warm-up and of the last 10 s (one sample swings by a
//! few hundred KiB), the growth between them, the highest sample, and the slope of a
//! least-squares line through the samples after warm-up. Flat means the growth is within 2 MiB
//! or 5 %, whichever is larger. `JOBSET_INPLACE_WEBHOOK_BIN` runs another build of the binary
//! (the image's static musl one: `cargo build --release --target x86_64-unknown-linux-musl`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jobset_inplace::admission::{self, Endpoint};
use jobset_inplace::certs;
use jobset_inplace_testkit::webhook_harness::{Conn, Replica};
use jobset_inplace_testkit::{fixtures, webhook_harness};

/// The largest fixture request without a config of its own (the server runs the default one),
/// else a synthetic JobSet; padded with spaces to `JOBSET_INPLACE_BENCH_BODY_BYTES` if set.
fn body() -> (String, Vec<u8>) {
    let (what, mut body) = fixtures::largest_request(0);
    let size: usize = webhook_harness::env_or("JOBSET_INPLACE_BENCH_BODY_BYTES", 0);
    if size > body.len() {
        // Whitespace before the closing brace: the same review, a bigger body.
        let close = body
            .iter()
            .rposition(|b| *b == b'}')
            .expect("a JSON object");
        let padding = size - body.len();
        body.splice(close..close, std::iter::repeat_n(b' ', padding));
        return (format!("{what} padded to {size} bytes"), body);
    }
    (what, body)
}

struct Load {
    served: AtomicU64,
    /// 429: no room in the server's body budget (with big bodies).
    shed: AtomicU64,
    /// Connections that failed or closed before an answer.
    cut: AtomicU64,
    /// Answers other than the review's (or a 429).
    errors: AtomicU64,
    stop: AtomicBool,
}

struct Expected {
    mutate: Vec<u8>,
    validate: Vec<u8>,
}

impl Expected {
    fn check(&self, path: &str, response: &webhook_harness::Response, load: &Load) {
        let expected = if path == "/mutate" {
            &self.mutate
        } else {
            &self.validate
        };
        if response.status == 200 && response.body == *expected {
            load.served.fetch_add(1, Ordering::Relaxed);
        } else if response.status == 429 {
            load.shed.fetch_add(1, Ordering::Relaxed);
        } else {
            load.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn keep_alive(
    addr: std::net::SocketAddr,
    connector: tokio_rustls::TlsConnector,
    body: Arc<Vec<u8>>,
    expected: Arc<Expected>,
    load: Arc<Load>,
    first: usize,
) {
    let mut conn = None;
    let mut n = first;
    while !load.stop.load(Ordering::Relaxed) {
        let path = if n.is_multiple_of(2) {
            "/mutate"
        } else {
            "/validate"
        };
        n += 1;
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(addr, &connector).await {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    load.cut.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        match c.post_json(path, &body).await {
            Ok(response) => {
                expected.check(path, &response, &load);
                if response.header("connection") == Some("close") {
                    conn = None;
                }
            }
            Err(_) => {
                load.cut.fetch_add(1, Ordering::Relaxed);
                conn = None;
            }
        }
    }
}

async fn one_per_connection(
    addr: std::net::SocketAddr,
    connector: tokio_rustls::TlsConnector,
    body: Arc<Vec<u8>>,
    expected: Arc<Expected>,
    load: Arc<Load>,
) {
    let mut n = 0usize;
    while !load.stop.load(Ordering::Relaxed) {
        let path = if n.is_multiple_of(2) {
            "/validate"
        } else {
            "/mutate"
        };
        n += 1;
        match Conn::connect(addr, &connector).await {
            Ok(mut c) => match c.post_json(path, &body).await {
                Ok(response) => expected.check(path, &response, &load),
                Err(_) => {
                    load.cut.fetch_add(1, Ordering::Relaxed);
                }
            },
            Err(_) => {
                load.cut.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Least-squares slope of `(seconds, KiB)` points, in KiB per minute.
fn slope_kib_per_min(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(num, den), (x, y)| {
        (num + (x - mx) * (y - my), den + (x - mx) * (x - mx))
    });
    if den == 0.0 { 0.0 } else { num / den * 60.0 }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let seconds: u64 = webhook_harness::env_or("JOBSET_INPLACE_BENCH_SECS", 60);
    let warmup: u64 = webhook_harness::env_or("JOBSET_INPLACE_BENCH_WARMUP_SECS", 10).min(seconds);
    let connections: usize = webhook_harness::env_or("JOBSET_INPLACE_BENCH_CONNECTIONS", 16);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        webhook_harness::install_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let ensured = certs::ensure(dir.path(), &certs::local_names()).expect("certs");
        let connector = webhook_harness::connector_for(&ensured.ca_cert);
        let mut replica = Replica::start(
            env!("CARGO_BIN_EXE_jobset-inplace"),
            &ensured.tls_cert,
            &ensured.tls_key,
            &[],
        )
        .await;
        let (what, body) = body();
        let padded = webhook_harness::env_or("JOBSET_INPLACE_BENCH_BODY_BYTES", 0usize) > 0;
        let config = webhook_harness::default_config();
        let expected = Arc::new(Expected {
            mutate: admission::review(Endpoint::Mutate, &body, &config).body,
            validate: admission::review(Endpoint::Validate, &body, &config).body,
        });
        let body = Arc::new(body);
        let start_rss = replica.rss_kib().expect("VmRSS");
        println!(
            "webhook memory: the release binary (pid {}) under {connections} keep-alive TLS \
             connections and 2 one-request connections, {what} ({} bytes) alternately on \
             /mutate and /validate, {seconds} s ({warmup} s warm-up), {} CPUs; RSS at start \
             {:.1} MiB",
            replica.pid(),
            body.len(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            mib(start_rss),
        );

        let load = Arc::new(Load {
            served: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let mut clients = Vec::new();
        for i in 0..connections {
            clients.push(tokio::spawn(keep_alive(
                replica.https,
                connector.clone(),
                body.clone(),
                expected.clone(),
                load.clone(),
                i,
            )));
        }
        for _ in 0..2 {
            clients.push(tokio::spawn(one_per_connection(
                replica.https,
                connector.clone(),
                body.clone(),
                expected.clone(),
                load.clone(),
            )));
        }

        println!(
            "{:>5} {:>9} {:>10} {:>7} {:>7} {:>7}",
            "s", "RSS MiB", "req/s", "429", "cut", "errors"
        );
        let started = Instant::now();
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.tick().await;
        let mut samples = Vec::new();
        let mut last_served = 0;
        for second in 1..=seconds {
            ticker.tick().await;
            let rss = replica.rss_kib().expect("VmRSS");
            let served = load.served.load(Ordering::Relaxed);
            let errors = load.errors.load(Ordering::Relaxed);
            let shed = load.shed.load(Ordering::Relaxed);
            let cut = load.cut.load(Ordering::Relaxed);
            samples.push((second, rss));
            println!(
                "{second:>5} {:>9.1} {:>10} {shed:>7} {cut:>7} {errors:>7}{}",
                mib(rss),
                served - last_served,
                if second == warmup {
                    "  <- end of warm-up"
                } else {
                    ""
                }
            );
            last_served = served;
        }
        load.stop.store(true, Ordering::Relaxed);
        for client in clients {
            let _ = client.await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let served = load.served.load(Ordering::Relaxed);
        let errors = load.errors.load(Ordering::Relaxed);
        let shed = load.shed.load(Ordering::Relaxed);
        let cut = load.cut.load(Ordering::Relaxed);

        // Ten-second means: one sample swings by a few hundred KiB either way.
        let window = 10.min(seconds.saturating_sub(warmup).max(1)) as usize;
        let mean = |part: &[(u64, u64)]| -> f64 {
            part.iter().map(|(_, rss)| *rss as f64).sum::<f64>() / part.len().max(1) as f64
        };
        let after_warmup: Vec<(u64, u64)> = samples
            .iter()
            .copied()
            .filter(|(s, _)| *s > warmup)
            .collect();
        let first = mean(&after_warmup[..window.min(after_warmup.len())]);
        let last = mean(&after_warmup[after_warmup.len().saturating_sub(window)..]);
        let points: Vec<(f64, f64)> = after_warmup
            .iter()
            .map(|(s, rss)| (*s as f64, *rss as f64))
            .collect();
        let peak = samples
            .iter()
            .map(|(_, rss)| *rss)
            .max()
            .unwrap_or(start_rss);
        let growth = last - first;
        let slope = slope_kib_per_min(&points);
        println!(
            "{served} requests answered as reviewed in {elapsed:.0} s ({:.0}/s), {shed} shed \
             with 429, {cut} connections cut before an answer, {errors} wrong answers",
            served as f64 / elapsed
        );
        println!(
            "RSS: start {:.1} MiB; mean of the {window} s after warm-up {:.2} MiB, of the last \
             {window} s {:.2} MiB, peak {:.1} MiB; growth after warm-up {:+.2} MiB (last / \
             after warm-up = {:.3}); least-squares trend after warm-up {:+.0} KiB/min",
            mib(start_rss),
            first / 1024.0,
            last / 1024.0,
            mib(peak),
            growth / 1024.0,
            last / first,
            slope,
        );
        let flat = growth <= 2048f64.max(first * 0.05);
        println!(
            "memory after warm-up: {}",
            if flat {
                "flat (growth within 2 MiB or 5 %, whichever is larger)"
            } else {
                "NOT flat"
            }
        );
        replica.terminate();
        let status = replica.wait(Duration::from_secs(30)).await;
        assert!(status.success(), "the webhook exits 0: {status}");
        assert_eq!(errors, 0, "every answer is the review's (or a 429)");
        if !padded {
            assert_eq!(
                (shed, cut),
                (0, 0),
                "nothing shed or cut under ordinary bodies"
            );
        }
    });
}
