use super::*;

fn status(code: u16, retry_after: Option<u32>) -> kube::Error {
    let mut s = kube::core::Status::failure("x", "TooManyRequests").with_code(code);
    if let Some(secs) = retry_after {
        let details = serde_json::from_value(serde_json::json!({"retryAfterSeconds": secs}))
            .expect("details");
        s = s.with_details(details);
    }
    kube::Error::Api(s.boxed())
}

#[test]
fn reads_retry_after_of_429_503_and_504_only() {
    assert_eq!(
        retry_after(&status(429, Some(3))),
        Some(Duration::from_secs(3))
    );
    assert_eq!(
        retry_after(&status(503, Some(1))),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        retry_after(&status(504, Some(2))),
        Some(Duration::from_secs(2))
    );
    assert_eq!(retry_after(&status(429, None)), None);
    assert_eq!(retry_after(&status(429, Some(0))), None);
    assert_eq!(retry_after(&status(500, Some(3))), None);
    assert_eq!(retry_after(&status(429, Some(3600))), Some(RETRY_AFTER_MAX));
}

#[test]
fn backoff_grows_within_its_bounds_and_resets() {
    let (min, max) = (Duration::from_millis(50), Duration::from_secs(5));
    let mut b = Backoff::new(min, max);
    let first = b.advance();
    assert!(first >= min / 2 && first <= min, "{first:?}");
    let second = b.advance();
    assert!(second >= min && second <= min * 2, "{second:?}");
    let later: Vec<Duration> = (0..30).map(|_| b.advance()).skip(10).collect();
    assert!(
        later.iter().all(|d| *d >= max / 2 && *d <= max),
        "{later:?}"
    );
    b.reset();
    let again = b.advance();
    assert!(again >= min / 2 && again <= min, "{again:?}");
}

#[test]
fn the_nth_delay_doubles_to_its_cap_and_honours_retry_after() {
    let ms = Duration::from_millis;
    let nth = |failures, server| nth_delay(ms(400), ms(10_000), failures, server);
    assert_eq!(nth(0, None), ms(400));
    assert_eq!(nth(1, None), ms(400));
    assert_eq!(nth(2, None), ms(800));
    assert_eq!(nth(5, None), ms(6_400));
    assert_eq!(nth(6, None), ms(10_000));
    assert_eq!(nth(u32::MAX, None), ms(10_000));
    assert_eq!(nth(1, Some(ms(3_000))), ms(3_000));
    assert_eq!(nth(40, Some(ms(3_000))), ms(10_000));
}

#[test]
fn watch_backoff_is_capped_and_starts_over_after_a_quiet_spell() {
    let mut b = WatchBackoff::new();
    let t0 = Instant::now();
    // A burst: errors a second apart grow the delay up to the cap.
    let burst: Vec<Duration> = (0..12)
        .map(|i| b.next_at(t0 + Duration::from_secs(i)))
        .collect();
    assert!(burst[0] <= WatchBackoff::MIN, "{burst:?}");
    assert!(burst.iter().all(|d| *d <= WatchBackoff::MAX), "{burst:?}");
    assert!(burst[11] >= WatchBackoff::MAX / 2, "{burst:?}");
    // An error long after the last one is not part of the burst.
    let later = b.next_at(t0 + Duration::from_secs(11) + WatchBackoff::QUIET * 2);
    assert!(later <= WatchBackoff::MIN, "{later:?}");
}

#[tokio::test(start_paused = true)]
async fn bounded_calls_answer_or_time_out() {
    let limit = Duration::from_millis(50);
    let answered = bounded(limit, async { Ok::<_, kube::Error>(7) }).await;
    assert!(matches!(answered, Ok(7)), "{answered:?}");
    let refused = bounded(limit, async { Err::<(), _>(status(429, Some(3))) }).await;
    assert_eq!(
        refused.as_ref().err().and_then(CallError::retry_after),
        Some(Duration::from_secs(3))
    );
    let start = tokio::time::Instant::now();
    let silent = bounded(limit, std::future::pending::<Result<(), kube::Error>>()).await;
    assert!(
        matches!(silent, Err(CallError::Timeout(d)) if d == limit),
        "{silent:?}"
    );
    // On the paused clock: at the limit exactly.
    assert_eq!(start.elapsed(), limit);
}

#[test]
fn reads_the_retry_after_header_of_429_503_and_504_in_whole_seconds() {
    let read = header_retry_after;
    assert_eq!(read(429, Some("1")), Some(1));
    assert_eq!(read(503, Some(" 7 ")), Some(7));
    assert_eq!(read(504, Some("32")), Some(32));
    assert_eq!(read(429, Some(&u32::MAX.to_string())), Some(u32::MAX));
    for code in [200, 400, 409, 410, 422, 500, 502] {
        assert_eq!(read(code, Some("1")), None, "{code}");
    }
    for value in [
        None,
        Some(""),
        Some("0"),
        Some("-1"),
        Some("1.5"),
        Some("4294967296"),
        Some("soon"),
        Some("Wed, 21 Oct 2015 07:28:00 GMT"),
    ] {
        assert_eq!(read(429, value), None, "{value:?}");
    }
}

#[test]
fn carries_the_header_into_the_status_unless_it_names_a_delay() {
    let after =
        |status: &kube::core::Status| status.details.as_ref().map(|d| d.retry_after_seconds);
    // API Priority and Fairness: plain text, the header alone.
    let plain = status_with_retry_after(429, b"Too many requests, please try again later.\n", 3);
    assert_eq!(plain.code, 429);
    assert_eq!(plain.reason, "TooManyRequests");
    assert_eq!(plain.message, "Too many requests, please try again later.");
    assert_eq!(after(&plain), Some(3));
    assert_eq!(
        retry_after(&kube::Error::Api(plain.boxed())),
        Some(Duration::from_secs(3))
    );
    // The API server's own Status: kept, its delay first.
    let own = br#"{"kind":"Status","code":429,"reason":"TooManyRequests","message":"m","details":{"name":"p","retryAfterSeconds":5}}"#;
    let kept = status_with_retry_after(429, own, 3);
    assert_eq!((kept.code, kept.message.as_str()), (429, "m"));
    assert_eq!(after(&kept), Some(5));
    assert_eq!(kept.details.map(|d| d.name), Some("p".to_owned()));
    let no_delay = br#"{"kind":"Status","code":503,"message":"m","details":{"name":"p"}}"#;
    assert_eq!(after(&status_with_retry_after(503, no_delay, 2)), Some(2));
    let no_details = br#"{"kind":"Status","code":504,"reason":"Timeout"}"#;
    let timeout = status_with_retry_after(504, no_details, 4);
    assert_eq!((timeout.code, after(&timeout)), (504, Some(4)));
    // Whatever else the body holds: a Status of the answer's code.
    for (code, body, reason) in [
        (503, &b""[..], "ServiceUnavailable"),
        (504, &b"\xff\xfe gateway"[..], "Timeout"),
        (429, &b"<html>busy</html>"[..], "TooManyRequests"),
    ] {
        let s = status_with_retry_after(code, body, 1);
        assert_eq!(
            (s.code, s.reason.as_str(), after(&s)),
            (code, reason, Some(1))
        );
    }
    assert_eq!(status_with_retry_after(429, b"{}", 6).code, 429);
}

#[test]
fn jittered_delay_stretches_retry_after_by_one_to_one_and_a_half() {
    let ms = Duration::from_millis;
    let s = Some(ms(1000));
    assert_eq!(jittered_delay(ms(50), s, 0.0), ms(1000));
    assert_eq!(jittered_delay(ms(50), s, 0.5), ms(1250));
    assert_eq!(jittered_delay(ms(50), s, 1.0), ms(1500));
    // Out of range draws are clamped; NaN counts as no stretch.
    assert_eq!(jittered_delay(ms(50), s, -3.0), ms(1000));
    assert_eq!(jittered_delay(ms(50), s, 7.0), ms(1500));
    assert_eq!(jittered_delay(ms(50), s, f64::INFINITY), ms(1500));
    assert_eq!(jittered_delay(ms(50), s, f64::NEG_INFINITY), ms(1000));
    assert_eq!(jittered_delay(ms(50), s, f64::NAN), ms(1000));
    // Without a server's delay, or with a shorter one, the backoff.
    assert_eq!(jittered_delay(ms(70), None, 0.9), ms(70));
    assert_eq!(jittered_delay(ms(4000), s, 0.9), ms(4000));
    assert_eq!(jittered_delay(ms(1200), s, 0.5), ms(1250));
    // The longest is bounded: the longest server delay honoured, stretched.
    assert_eq!(
        jittered_delay(ms(0), Some(RETRY_AFTER_MAX), 1.0),
        RETRY_AFTER_MAX * 3 / 2
    );
    assert_eq!(
        jittered_delay(ms(0), Some(Duration::MAX), 1.0),
        Duration::MAX
    );
    // Monotone in the draw, within [s, 1.5 s], every thousandth.
    let mut last = Duration::ZERO;
    for i in 0..=1000 {
        let d = jittered_delay(ms(5), s, f64::from(i) / 1000.0);
        assert!(d >= ms(1000) && d <= ms(1500) && d >= last, "{i}: {d:?}");
        last = d;
    }
}

#[test]
fn backoff_after_spreads_retry_after_over_half_of_it() {
    let one = Duration::from_secs(1);
    // 1,000 agents refused together, each with its own generator: how many wait in each
    // fifth of 1 s ..= 1.5 s.
    let mut fifths = [0u32; 5];
    for seed in 0..1000 {
        let mut b = Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, seed);
        let d = b.after(Some(one));
        assert!(d >= one && d <= one * 3 / 2, "{d:?}");
        let fifth = ((d - one).as_millis() / 100).min(4) as usize;
        fifths[fifth] += 1;
    }
    assert!(fifths.iter().all(|n| *n >= 120), "{fifths:?}");
    // No server delay: the backoff's own steps.
    let mut b = Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, 7);
    let d = b.after(None);
    assert!(d >= BACKOFF_MIN / 2 && d <= BACKOFF_MIN, "{d:?}");
    // The same seed draws the same delays (the tests' determinism).
    let draws = |seed| {
        let mut b = Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, seed);
        (0..5).map(|_| b.after(Some(one))).collect::<Vec<_>>()
    };
    assert_eq!(draws(3), draws(3));
}

/// What the loopback server of [`refusing_server`] saw.
#[derive(Default)]
struct Seen {
    connections: usize,
    requests: usize,
    /// When each pod's first GET was refused.
    refused: std::collections::HashMap<String, Instant>,
    /// How long after its refusal each pod's retry came.
    retried_after: std::collections::HashMap<String, Duration>,
}

type Answer = hyper::Response<http_body_util::Full<hyper::body::Bytes>>;

/// Refuses each pod's first GET as API Priority and Fairness does (429, a plain-text body,
/// `Retry-After: 1`), answers the next ones with the pod.
fn answer(seen: &std::sync::Mutex<Seen>, path: &str) -> Answer {
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    let now = Instant::now();
    let mut seen = seen.lock().unwrap();
    seen.requests += 1;
    let (code, retry_after, body) = match seen.refused.get(&name) {
        None => {
            seen.refused.insert(name, now);
            (
                429,
                Some("1"),
                "Too many requests, please try again later.\n".to_owned(),
            )
        }
        Some(at) => {
            let after = now - *at;
            seen.retried_after.entry(name.clone()).or_insert(after);
            let pod = serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns"},
            });
            (200, None, pod.to_string())
        }
    };
    let mut response = hyper::Response::builder().status(code);
    if let Some(secs) = retry_after {
        response = response.header("Retry-After", secs);
    }
    response
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
        .unwrap()
}

async fn refusing_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Seen>>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
    let log = seen.clone();
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            log.lock().unwrap().connections += 1;
            let log = log.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let answer = answer(&log, req.uri().path());
                        async move { Ok::<_, std::convert::Infallible>(answer) }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen, server)
}

/// Many agents refused together by a loopback server (429, `Retry-After: 1`), each on a
/// client of [`client_without_retries`] retrying as the agent does ([`Backoff::after`]) with
/// a per-call timeout shorter than the `Retry-After`: every retry waits at least what the
/// server asked; the retries spread over the following half second rather than arriving
/// together; no call times out (the wait is not inside the call); and each agent keeps its
/// one connection (the refusal is read to its end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_refused_together_come_back_apart_on_their_connections() {
    use k8s_openapi::api::core::v1::Pod;
    const AGENTS: usize = 50;
    let (addr, seen, server) = refusing_server().await;
    let call_timeout = Duration::from_millis(500);
    let agents = (0..AGENTS).map(|i| {
        tokio::spawn(async move {
            let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
            config.root_cert = Some(Vec::new());
            let client = client_without_retries(config).unwrap();
            let pods: kube::Api<Pod> = kube::Api::namespaced(client, "ns");
            let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
            let mut timeouts = 0;
            for _ in 0..5 {
                match bounded(call_timeout, pods.get(&format!("p{i}"))).await {
                    Ok(_) => return Ok(timeouts),
                    Err(e) => {
                        timeouts += usize::from(matches!(e, CallError::Timeout(_)));
                        tokio::time::sleep(backoff.after(e.retry_after())).await;
                    }
                }
            }
            Err(format!("p{i}: no answer in 5 tries"))
        })
    });
    let outcome =
        tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(agents)).await;
    server.abort();
    let timeouts: usize = outcome
        .expect("the agents within 60 s")
        .into_iter()
        .map(|r| r.expect("the agent's task").expect("the agent's pod"))
        .sum();
    let seen = seen.lock().unwrap();
    assert_eq!(timeouts, 0, "a wait was counted as a timeout");
    assert_eq!(seen.requests, 2 * AGENTS, "one refusal and one retry each");
    assert_eq!(seen.connections, AGENTS, "a connection each, kept");
    let waits: Vec<Duration> = seen.retried_after.values().copied().collect();
    assert_eq!(waits.len(), AGENTS);
    let (first, last) = (
        waits.iter().min().copied().unwrap_or_default(),
        waits.iter().max().copied().unwrap_or_default(),
    );
    assert!(first >= Duration::from_secs(1), "{first:?} < Retry-After");
    // Uniform over 1 s ..= 1.5 s, 50 draws: a spread under 200 ms (0.4 of the interval) has
    // a chance under 50 x 0.4^49 (1e-18), and a loaded machine only adds noise; retries in
    // lockstep (kube's retry layer) would spread over a few milliseconds.
    assert!(
        last - first >= Duration::from_millis(200),
        "retries in lockstep: {first:?} ..= {last:?}"
    );
}

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

#[test]
fn the_longer_delay_wins() {
    let ms = Duration::from_millis;
    assert_eq!(delay(ms(50), None), ms(50));
    assert_eq!(delay(ms(50), Some(ms(1000))), ms(1000));
    assert_eq!(delay(ms(5000), Some(ms(1000))), ms(5000));
}
