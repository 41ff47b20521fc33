//! Load with change (issue 6, item 6): two replicas of the real binary behind a client that
//! spreads sustained `/mutate` and `/validate` load over them and retries a request that failed
//! to connect or whose connection closed before a response. While the load runs, the serving
//! certificate files are replaced (both replicas must serve the new certificate to new
//! connections), then each replica in turn gets SIGTERM and is replaced by a new process (a
//! rolling restart): it leaves the endpoints 200 ms after the signal, as a terminating pod
//! leaves its Service's. Every request must end in a 200 with the in-process review's answer:
//! zero failed admissions.
//!
//! The replicas run with `--shutdown-delay` (as deployed): then not a single request needs the
//! retry, which matters because the API server's client does not retry a webhook call (a POST)
//! after a connection error. `JOBSET_INPLACE_LOAD_SHUTDOWN_DELAY=0s` shows the difference (a few
//! retried requests, still no failure for this retrying client).
//!
//! About 8 s by default; `JOBSET_INPLACE_LOAD_SECS=60 cargo test --test it webhook::load_change --
//! --nocapture` runs longer, repeating the certificate change and the rolling restart for as long
//! as it runs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jobset_inplace::admission::{self, Endpoint};
use jobset_inplace::certs;
use jobset_inplace_testkit::generators::jobset_review;
use jobset_inplace_testkit::webhook_harness;
use jobset_inplace_testkit::webhook_harness::{Conn, Replica};
use rustls::pki_types::CertificateDer;
use tokio_rustls::TlsConnector;

/// Concurrent clients.
const WORKERS: usize = 8;
/// Each client opens a new connection after this many requests (new connections are what a
/// certificate change and a restart affect).
const REQUESTS_PER_CONNECTION: usize = 25;
/// A request still failing after this long counts as a failed admission (the API server's
/// timeout for this webhook is 5 s).
const GIVE_UP: Duration = Duration::from_secs(5);

/// The replicas' addresses, as a Service's endpoints: the client picks them in turn.
#[derive(Default)]
struct Endpoints {
    addrs: RwLock<Vec<SocketAddr>>,
    next: AtomicUsize,
}

impl Endpoints {
    fn pick(&self) -> Option<SocketAddr> {
        let addrs = self.addrs.read().expect("endpoints");
        if addrs.is_empty() {
            return None;
        }
        Some(addrs[self.next.fetch_add(1, Ordering::Relaxed) % addrs.len()])
    }

    fn add(&self, addr: SocketAddr) {
        self.addrs.write().expect("endpoints").push(addr);
    }

    fn remove(&self, addr: SocketAddr) {
        self.addrs
            .write()
            .expect("endpoints")
            .retain(|a| *a != addr);
    }
}

#[derive(Default)]
struct Tally {
    served: AtomicU64,
    /// Connection attempts and requests retried after a connection error.
    retries: AtomicU64,
    connections: AtomicU64,
    failures: Mutex<Vec<String>>,
    /// Connections by the leaf certificate they were served (DER).
    certificates: Mutex<BTreeMap<Vec<u8>, u64>>,
    /// Retries by what went wrong.
    retry_reasons: Mutex<BTreeMap<String, u64>>,
}

/// An error the API server retries: the connection could not be made, or closed before a whole
/// response came back. A TLS error (a certificate the client does not trust) is not one.
fn retryable(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe
    )
}

struct Request {
    path: String,
    body: Vec<u8>,
    expected: Vec<u8>,
}

async fn worker(
    id: usize,
    endpoints: Arc<Endpoints>,
    connector: TlsConnector,
    requests: Arc<Vec<Request>>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) {
    let mut conn: Option<(Conn, usize)> = None;
    let mut n = id;
    while !stop.load(Ordering::Relaxed) {
        let request = &requests[n % requests.len()];
        n += 1;
        let started = Instant::now();
        let mut last_error = String::new();
        loop {
            if started.elapsed() > GIVE_UP {
                tally.failures.lock().expect("failures").push(format!(
                    "{} not answered within {GIVE_UP:?}: {last_error}",
                    request.path
                ));
                break;
            }
            let (mut c, used) = match conn.take() {
                Some(open) => open,
                None => {
                    let Some(addr) = endpoints.pick() else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    match Conn::connect(addr, &connector).await {
                        Ok(c) => {
                            tally.connections.fetch_add(1, Ordering::Relaxed);
                            if let Some(cert) = c.peer_certificate() {
                                *tally
                                    .certificates
                                    .lock()
                                    .expect("certificates")
                                    .entry(cert.to_vec())
                                    .or_default() += 1;
                            }
                            (c, 0)
                        }
                        Err(e) if retryable(&e) => {
                            last_error = format!("connect {addr}: {e}");
                            count_retry(&tally, "connect", &e);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        Err(e) => {
                            tally
                                .failures
                                .lock()
                                .expect("failures")
                                .push(format!("connect {addr}: {e} (not retried)"));
                            break;
                        }
                    }
                }
            };
            match c.post_json(&request.path, &request.body).await {
                Ok(response) => {
                    if response.status == 200 && response.body == request.expected {
                        tally.served.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tally.failures.lock().expect("failures").push(format!(
                            "{}: HTTP {} {}",
                            request.path,
                            response.status,
                            String::from_utf8_lossy(&response.body)
                        ));
                    }
                    let closing = response.header("connection") == Some("close");
                    if !closing && used + 1 < REQUESTS_PER_CONNECTION {
                        conn = Some((c, used + 1));
                    }
                    break;
                }
                Err(e) if retryable(&e) => {
                    last_error = format!("{}: {e}", request.path);
                    count_retry(&tally, "request", &e);
                }
                Err(e) => {
                    tally
                        .failures
                        .lock()
                        .expect("failures")
                        .push(format!("{}: {e} (not retried)", request.path));
                    break;
                }
            }
        }
    }
}

fn count_retry(tally: &Tally, stage: &str, error: &std::io::Error) {
    tally.retries.fetch_add(1, Ordering::Relaxed);
    *tally
        .retry_reasons
        .lock()
        .expect("reasons")
        .entry(format!("{stage}: {:?}", error.kind()))
        .or_default() += 1;
}

/// Replaces the serving pair with a new one from the same CA, as cert-manager would: key and
/// certificate each written atomically. Returns the new leaf.
fn replace_certificate(dir: &Path) -> CertificateDer<'static> {
    let (ca_cert, ca_key, cert, key) = certs::paths(dir);
    let ca = certs::PemPair {
        cert: std::fs::read_to_string(ca_cert).expect("ca.crt"),
        key: std::fs::read_to_string(ca_key).expect("ca.key"),
    };
    let new =
        certs::issue_serving(&ca, &certs::local_names(), Duration::from_secs(3600)).expect("issue");
    certs::write_atomic(&key, new.key.as_bytes(), 0o600).expect("write key");
    certs::write_atomic(&cert, new.cert.as_bytes(), 0o644).expect("write cert");
    certs::parse_certs(new.cert.as_bytes(), &cert)
        .expect("parse")
        .remove(0)
}

/// Waits until a new connection to `addr` is served `leaf`.
async fn until_served(addr: SocketAddr, connector: &TlsConnector, leaf: &CertificateDer<'_>) {
    let started = Instant::now();
    loop {
        if let Ok(conn) = Conn::connect(addr, connector).await
            && conn.peer_certificate().as_ref() == Some(leaf)
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{addr} did not serve the new certificate within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Cluster {
    cert: PathBuf,
    key: PathBuf,
    replicas: Vec<Replica>,
    endpoints: Arc<Endpoints>,
    shutdown_delay: String,
}

impl Cluster {
    fn flags(&self) -> Vec<&str> {
        vec![
            "--cert-reload-interval",
            "100ms",
            "--shutdown-timeout",
            "5s",
            "--shutdown-delay",
            &self.shutdown_delay,
        ]
    }

    async fn start(dir: &Path, endpoints: Arc<Endpoints>, shutdown_delay: String) -> Cluster {
        let (_, _, cert, key) = certs::paths(dir);
        let mut cluster = Cluster {
            cert,
            key,
            replicas: Vec::new(),
            endpoints,
            shutdown_delay,
        };
        for _ in 0..2 {
            let replica = Replica::start(
                env!("CARGO_BIN_EXE_jobset-inplace"),
                &cluster.cert,
                &cluster.key,
                &cluster.flags(),
            )
            .await;
            cluster.endpoints.add(replica.https);
            cluster.replicas.push(replica);
        }
        cluster
    }

    /// SIGTERM to replica `i`: it leaves the endpoints 200 ms later (a terminating pod may still
    /// get traffic for a while), and a new process takes its place once ready.
    async fn restart(&mut self, i: usize) -> Duration {
        let started = Instant::now();
        self.replicas[i].terminate();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.endpoints.remove(self.replicas[i].https);
        let status = self.replicas[i].wait(Duration::from_secs(15)).await;
        assert!(status.success(), "replica exits 0 on SIGTERM: {status}");
        let new = Replica::start(
            env!("CARGO_BIN_EXE_jobset-inplace"),
            &self.cert,
            &self.key,
            &self.flags(),
        )
        .await;
        self.endpoints.add(new.https);
        self.replicas[i] = new;
        started.elapsed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_failed_admissions_through_certificate_changes_and_rolling_restarts() {
    let seconds: f64 = std::env::var("JOBSET_INPLACE_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    let duration = Duration::from_secs_f64(seconds);
    let shutdown_delay =
        std::env::var("JOBSET_INPLACE_LOAD_SHUTDOWN_DELAY").unwrap_or_else(|_| "1s".into());
    let limit = duration + Duration::from_secs(90);
    tokio::time::timeout(limit, run(duration, shutdown_delay))
        .await
        .expect("the test finished in time");
}

async fn run(duration: Duration, shutdown_delay: String) {
    let drained = jobset_inplace::settings::parse_duration(&shutdown_delay)
        .expect("JOBSET_INPLACE_LOAD_SHUTDOWN_DELAY is a duration")
        > Duration::ZERO;
    webhook_harness::install_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let ensured = certs::ensure(dir.path(), &certs::local_names()).expect("certs");
    let connector = webhook_harness::connector_for(&ensured.ca_cert);
    let endpoints = Arc::new(Endpoints::default());
    let mut cluster = Cluster::start(dir.path(), endpoints.clone(), shutdown_delay.clone()).await;

    // The replicas run `webhook` without injection flags: the default config, as here.
    let config = webhook_harness::default_config();
    let mut requests = Vec::new();
    for i in 0..8 {
        let body = jobset_review(&format!("load-{i}"), 1 + i % 3, 4);
        for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
            let expected = admission::review(endpoint, &body, &config);
            assert_eq!(expected.http_status, 200);
            requests.push(Request {
                path: format!("/{}", endpoint.as_str()),
                body: body.clone(),
                expected: expected.body,
            });
        }
    }
    let requests = Arc::new(requests);

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let mut workers = Vec::new();
    for id in 0..WORKERS {
        workers.push(tokio::spawn(worker(
            id,
            endpoints.clone(),
            connector.clone(),
            requests.clone(),
            stop.clone(),
            tally.clone(),
        )));
    }

    let mut rounds = 0;
    let mut leaves = Vec::new();
    let mut restarts = Vec::new();
    loop {
        // (a) New certificate files: both replicas serve them to new connections.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let leaf = replace_certificate(dir.path());
        let switched = Instant::now();
        for replica in &cluster.replicas {
            until_served(replica.https, &connector, &leaf).await;
        }
        eprintln!(
            "round {rounds}: both replicas serve the new certificate after {:?}",
            switched.elapsed()
        );
        leaves.push(leaf);
        // (b) A rolling restart: SIGTERM, exit, a new process, one replica after the other.
        for i in 0..cluster.replicas.len() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let took = cluster.restart(i).await;
            eprintln!("round {rounds}: replica {i} replaced in {took:?}");
            restarts.push(took);
            // The new process serves the current certificate.
            let last = leaves.last().expect("a leaf");
            until_served(cluster.replicas[i].https, &connector, last).await;
        }
        rounds += 1;
        if started.elapsed() + Duration::from_secs(3) > duration {
            break;
        }
    }
    let remaining = duration.saturating_sub(started.elapsed());
    tokio::time::sleep(remaining.max(Duration::from_millis(500))).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("worker");
    }
    let elapsed = started.elapsed();

    let served = tally.served.load(Ordering::Relaxed);
    let failures = tally.failures.lock().expect("failures").clone();
    let certificates = tally.certificates.lock().expect("certificates").clone();
    eprintln!(
        "load with change: {served} admissions served in {elapsed:.1?} ({:.0}/s) by {WORKERS} \
         clients, {} connections, {} retried connection errors {:?}, {rounds} round(s) of a \
         certificate change and a rolling restart of 2 replicas (--shutdown-delay \
         {shutdown_delay}), {} distinct certificates served, failed admissions: {}",
        served as f64 / elapsed.as_secs_f64(),
        tally.connections.load(Ordering::Relaxed),
        tally.retries.load(Ordering::Relaxed),
        tally.retry_reasons.lock().expect("reasons"),
        certificates.len(),
        failures.len(),
    );
    assert!(failures.is_empty(), "failed admissions: {failures:#?}");
    if drained {
        // Drained replicas leave nothing to retry: a client that never retries a POST (the API
        // server's) would not have failed either.
        assert_eq!(
            tally.retries.load(Ordering::Relaxed),
            0,
            "retries with --shutdown-delay: {:?}",
            tally.retry_reasons.lock().expect("reasons")
        );
    }
    assert!(served >= 200, "only {served} admissions served");
    // The client saw the new certificates, and only certificates it trusts (a connection
    // with any other would have failed its handshake).
    for leaf in &leaves {
        assert!(
            certificates.contains_key(leaf.as_ref()),
            "no client connection was served a new certificate"
        );
    }
    for mut replica in cluster.replicas {
        replica.terminate();
        assert!(replica.wait(Duration::from_secs(15)).await.success());
    }
}

/// The drain in isolation, in-process: during `--shutdown-delay` the server is not ready but
/// serves old and new connections, each closed after its answer; then it stops accepting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_delay_serves_on_and_closes_each_connection_after_its_answer() {
    let test = async {
        let delay = Duration::from_millis(1000);
        let mut server =
            webhook_harness::TestServer::start_custom(webhook_harness::default_config(), |o| {
                o.shutdown_delay = delay;
            })
            .await;
        let mut kept = server.connect().await.expect("connect");
        let response = kept.post_json("/ping", b"{}").await.expect("ping");
        assert_eq!(response.header("connection"), None, "kept alive");

        let signalled = Instant::now();
        server.trigger_shutdown();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(server.health_get("/readyz").await.expect("readyz").0, 503);

        // The keep-alive connection: answered, then closed by the server.
        let body = jobset_review("drain-1", 1, 1);
        let expected = admission::review(Endpoint::Validate, &body, &server.config);
        let response = kept.post_json("/validate", &body).await.expect("answered");
        assert_eq!((response.status, &response.body), (200, &expected.body));
        assert_eq!(response.header("connection"), Some("close"));
        assert!(kept.read_response().await.is_err(), "closed after it");

        // A new connection is still accepted and served, the same way.
        let mut late = server.connect().await.expect("still accepting");
        let response = late.post_json("/validate", &body).await.expect("answered");
        assert_eq!((response.status, &response.body), (200, &expected.body));
        assert_eq!(response.header("connection"), Some("close"));
        assert!(signalled.elapsed() < delay, "all of that within the delay");

        // After the delay: no new connections, and `serve` returns.
        server
            .join(Duration::from_secs(10))
            .await
            .expect("serve returns Ok");
        assert!(signalled.elapsed() >= delay);
        let refused = match server.connect().await {
            Err(_) => true,
            Ok(mut conn) => conn.post_json("/ping", b"{}").await.is_err(),
        };
        assert!(refused, "not served after the delay");
    };
    tokio::time::timeout(Duration::from_secs(30), test)
        .await
        .expect("the test finished in time");
}
