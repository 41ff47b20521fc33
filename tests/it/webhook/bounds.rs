//! Bounded work per request over TLS (docs/security.md): the webhook binary, as deployed (its own
//! process), answers four hostile 3 MiB reviews at once, again and again, with answers of at most
//! 1 MiB each, and its peak resident set (`VmHWM`) stays under 200 MiB (before: four 1.9 MB
//! requests took it to 271 MiB, over the deployed 256Mi limit). `tests/it/admission/bounds.rs`
//! holds one review to 64 MiB and 1 s offline. Slow readers (issue 21): hundreds of connections
//! that pipeline reviews with large answers and never read them stay under the same bound, and
//! well-behaved reviews are answered within a second meanwhile.

use std::time::Duration;

use std::time::Instant;

use jobset_inplace::certs;
use jobset_inplace_testkit::fixtures;
use jobset_inplace_testkit::generators::jobset_review;
use jobset_inplace_testkit::webhook_harness::{self, Conn, Replica};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

const MAX_BODY: usize = 3 * 1024 * 1024;
const MAX_ANSWER: usize = 1024 * 1024;
const MAX_PEAK_KIB: u64 = 200 * 1024;

fn story1() -> Value {
    fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .map(|c| c.request)
        .expect("story1-plain fixture")
}

/// story1 with `replicatedJobs` (or, with `containers`, its pod's containers) filled with
/// copies of `item` up to 3 MiB, built as text.
fn filled(item: &Value, containers: bool) -> Vec<u8> {
    let mut review = story1();
    let object = &mut review["request"]["object"];
    if containers {
        object["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"] =
            json!(["__items__"]);
    } else {
        object["spec"]["replicatedJobs"] = json!(["__items__"]);
    }
    let frame = serde_json::to_string(&review).expect("json");
    let item = serde_json::to_string(item).expect("json");
    let n = (MAX_BODY - frame.len()) / (item.len() + 1);
    let items = vec![item.as_str(); n].join(",");
    frame.replace("\"__items__\"", &items).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hostile_reviews_at_once_stay_bounded_over_tls() {
    tokio::time::timeout(Duration::from_secs(120), async {
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
        let job = story1()["request"]["object"]["spec"]["replicatedJobs"][0].clone();
        let small = json!({"name": "w", "template": {"spec": {"template": {"spec": {"containers": [{"name": "w"}]}}}}});
        let bodies = [
            ("zeros", filled(&json!(0), false)),
            ("story1 replicatedJobs", filled(&job, false)),
            ("small replicatedJobs", filled(&small, false)),
            ("containers", filled(&json!({"name": "w"}), true)),
        ];
        let start_kib = replica.rss_kib().unwrap_or(0);
        for round in 0..3 {
            let mut tasks = tokio::task::JoinSet::new();
            for (i, (name, body)) in bodies.iter().enumerate() {
                let path = if (i + round) % 2 == 0 { "/mutate" } else { "/validate" };
                let (name, body, addr, connector) =
                    (name.to_string(), body.clone(), replica.https, connector.clone());
                tasks.spawn(async move {
                    // As the API server does, a 429 (large reviews shed past their wait) is
                    // retried after its Retry-After, on a new connection.
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        let mut conn = Conn::connect(addr, &connector).await.expect("connect");
                        let response = conn.post_json(path, &body).await.expect("answered");
                        if response.status != 429 || tries == 10 {
                            break (name, path, body.len(), response);
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                let (name, path, sent, response) = done.expect("task");
                assert_eq!(response.status, 200, "{name} {path}");
                assert!(sent <= MAX_BODY);
                assert!(
                    response.body.len() <= MAX_ANSWER,
                    "{name} {path}: answer of {} bytes",
                    response.body.len()
                );
                let answer: Value = serde_json::from_slice(&response.body).expect("JSON");
                assert_eq!(answer["response"]["allowed"], false, "{name} {path}: {answer}");
            }
        }
        let peak = replica.peak_rss_kib().unwrap_or(0);
        eprintln!(
            "webhook under four hostile 3 MiB reviews at once, 3 rounds: RSS at start {:.1} MiB, peak {:.1} MiB",
            start_kib as f64 / 1024.0,
            peak as f64 / 1024.0
        );
        assert!(peak > 0, "VmHWM read");
        assert!(peak < MAX_PEAK_KIB, "peak RSS {peak} KiB");
        replica.terminate();
        replica.wait(Duration::from_secs(15)).await;
    })
    .await
    .expect("finished in time");
}

/// The slow readers of issue 21.
const SLOW_READERS: usize = 260;
/// Reviews each slow reader pipelines.
const PIPELINED: usize = 3;
/// The minimal replicatedJobs of each review (about 25 KB; the `/mutate` answer about 0.94 MB:
/// each replicatedJob's injection, agent, env, volume and worker rule, is about 2.9 KB of patch
/// since the probe's timeout and hold, so 245 keep the answer between 800 KiB and the 1 MiB limit,
/// and 257 are past the patch limit; 260 did before the hold, 310 before the worker rule).
const SLOW_READER_JOBS: usize = 245;

/// story1 with `n` minimal replicatedJobs: a small request with a large `/mutate` answer.
fn many_small_jobs(n: usize) -> Vec<u8> {
    let mut review = story1();
    let jobs: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("w{i}"), "template": {"spec": {"template": {"spec": {"containers": [{"name": "w"}]}}}}}))
        .collect();
    review["request"]["object"]["spec"]["replicatedJobs"] = Value::Array(jobs);
    serde_json::to_vec(&review).expect("json")
}

/// Issue 21, item 2: 260 TLS connections, each with a 4 KiB receive buffer, each pipelining
/// three `/mutate` reviews of 25 KB whose answers are about 0.9 MB, and never reading. Before:
/// the answers were not counted anywhere, the connections counted as idle (kept 120 s), and the
/// peak resident set went past 256 MiB within seconds. Now the answer bytes not yet taken count
/// against a budget, a connection whose answer drains slower than a floor is closed, and a
/// pipelined request waits until the answer before it is written: the peak stays under 200 MiB
/// and well-behaved reviews on other connections are answered within a second throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_of_large_answers_stay_bounded_and_others_are_answered() {
    tokio::time::timeout(Duration::from_secs(120), async {
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
        let body = many_small_jobs(SLOW_READER_JOBS);
        // The attack as run: a small request, a large answer.
        let one_review;
        {
            let mut conn = Conn::connect(replica.https, &connector)
                .await
                .expect("connect");
            let asked = Instant::now();
            let answer = conn.post_json("/mutate", &body).await.expect("answered");
            one_review = asked.elapsed();
            assert_eq!(answer.status, 200);
            assert!(
                body.len() < 32 * 1024 && answer.body.len() > 800 * 1024,
                "request {} bytes, answer {} bytes",
                body.len(),
                answer.body.len()
            );
        }
        let start_kib = replica.rss_kib().unwrap_or(0);
        let request = Conn::encode("POST", "/mutate", Some("application/json"), &body);
        let pipelined: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(request.repeat(PIPELINED));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut readers = tokio::task::JoinSet::new();
        // Each reader says when its handshake is over (or failed): the well-behaved reviews are
        // measured under the attack once it is set up (a flood of handshakes is another attack,
        // `slow_handshakes_heads_and_bodies_are_cut_while_others_are_answered`).
        let (handshaken, mut handshakes) = tokio::sync::mpsc::unbounded_channel::<()>();
        for _ in 0..SLOW_READERS {
            let (addr, connector, pipelined, mut released, handshaken) = (
                replica.https,
                connector.clone(),
                pipelined.clone(),
                released.clone(),
                handshaken.clone(),
            );
            readers.spawn(async move {
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
                let Ok(tcp) = socket.connect(addr).await else {
                    let _ = handshaken.send(());
                    return false;
                };
                let name = ServerName::try_from("localhost").expect("name");
                let tls =
                    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
                        .await;
                let _ = handshaken.send(());
                let Ok(Ok(mut tls)) = tls else {
                    return false;
                };
                // Written (the server may stop reading a pipelined request), then never read.
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    let _ = tls.write_all(&pipelined).await;
                    let _ = tls.flush().await;
                })
                .await;
                let _ = released.wait_for(|r| *r).await;
                drop(tls);
                true
            });
        }
        // Well-behaved reviews on their own connections meanwhile, and the resident set. Large
        // reviews (the attack's) are reviewed one fewer at a time than there are workers and
        // shed with 429 past a wait, so ordinary reviews are answered within a second in any
        // build (a debug build reviews the attack's request in about 200 ms, an optimized one in
        // a few).
        let (window, good_timeout) = (Duration::from_secs(30), Duration::from_secs(5));
        let open_https = || async {
            let (_, metrics) = replica.health_get("/metrics").await.expect("metrics");
            metrics
                .lines()
                .filter(|l| l.starts_with("jobset_inplace_connections_open") && l.contains("https"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        drop(handshaken);
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            for _ in 0..SLOW_READERS {
                if handshakes.recv().await.is_none() {
                    break;
                }
            }
        })
        .await;
        let started = Instant::now();
        let mut good = tokio::task::JoinSet::new();
        let mut during_kib = 0;
        let mut open = f64::MAX;
        let mut i = 0;
        // Until the slow readers are cut (they still hold their sockets: the server closed its
        // ends), for 3 s at least.
        while started.elapsed() < window
            && (started.elapsed() < Duration::from_secs(3) || open >= 10.0)
        {
            i += 1;
            let (review, addr, connector) = (
                jobset_review(&format!("good-{i}"), 1, 2),
                replica.https,
                connector.clone(),
            );
            let sent_at = started.elapsed();
            good.spawn(async move {
                let asked = Instant::now();
                let answered = tokio::time::timeout(good_timeout, async {
                    let mut conn = Conn::connect(addr, &connector).await?;
                    conn.post_json("/mutate", &review).await
                })
                .await;
                let status = match answered {
                    Ok(Ok(response)) => response.status,
                    Ok(Err(_)) | Err(_) => 0,
                };
                (sent_at, asked.elapsed(), status)
            });
            during_kib = during_kib.max(replica.rss_kib().unwrap_or(0));
            open = open_https().await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let attack = started.elapsed();
        let peak = replica.peak_rss_kib().unwrap_or(0);
        let mut latencies = Vec::new();
        while let Some(done) = good.join_next().await {
            latencies.push(done.expect("good review"));
        }
        let _ = release.send(true);
        let mut connected = 0;
        while let Some(done) = readers.join_next().await {
            connected += usize::from(done.expect("reader"));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after_kib = replica.rss_kib().unwrap_or(0);
        let slowest = latencies
            .iter()
            .map(|(_, t, _)| *t)
            .max()
            .unwrap_or_default();
        eprintln!(
            "good reviews (sent at, took): {:?}",
            latencies
                .iter()
                .map(|(at, t, _)| (*at, *t))
                .collect::<Vec<_>>()
        );
        let failed: Vec<_> = latencies.iter().filter(|(_, _, s)| *s != 200).collect();
        eprintln!(
            "webhook under {SLOW_READERS} slow readers ({connected} connected) of {PIPELINED} \
             pipelined {} B reviews: RSS at start {:.1} MiB, highest sampled {:.1} MiB, peak \
             {:.1} MiB, after they closed {:.1} MiB; {} good reviews, slowest {slowest:?}, not \
             answered 200: {failed:?}; HTTPS connections still open after {attack:?}: {open} \
             (one review of the attack alone: {one_review:?})",
            body.len(),
            start_kib as f64 / 1024.0,
            during_kib as f64 / 1024.0,
            peak as f64 / 1024.0,
            after_kib as f64 / 1024.0,
            latencies.len()
        );
        assert!(open < 10.0, "{open} connections not cut");
        assert!(peak > 0, "VmHWM read");
        assert!(peak < MAX_PEAK_KIB, "peak RSS {peak} KiB");
        assert!(failed.is_empty(), "good reviews not answered: {failed:?}");
        assert!(
            slowest < Duration::from_secs(1),
            "a good review took {slowest:?}"
        );
        replica.terminate();
        replica.wait(Duration::from_secs(15)).await;
    })
    .await
    .expect("finished in time");
}
