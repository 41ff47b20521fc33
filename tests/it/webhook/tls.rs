//! The HTTPS admission server end to end: real TLS on loopback, certificates generated into a
//! temporary directory, answers compared byte for byte with `admission::review` in-process.

use std::future::Future;
use std::time::Duration;

use jobset_inplace::admission::{self, Endpoint, MAX_BODY_BYTES};
use jobset_inplace_testkit::generators::jobset_review;
use jobset_inplace_testkit::webhook_harness::{Conn, TestServer};
use jobset_inplace_testkit::{fixtures, webhook_harness};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);

/// Runs a test body under a time limit.
async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(LIMIT, body)
        .await
        .expect("the test finished in time");
}

fn reqwest_client(server: &TestServer) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(webhook_harness::client_config(&server.ca_cert()))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// The requests every case runs on: the fixtures, and inline ones that exist whatever the
/// fixtures hold.
fn cases() -> Vec<fixtures::Fixture> {
    let mut cases = fixtures::fixture_requests();
    cases.push(fixtures::Fixture {
        name: "inline-jobset".into(),
        body: jobset_review("inline-1", 2, 5),
        config: None,
    });
    let mut delete: Value = serde_json::from_slice(&jobset_review("inline-2", 1, 1)).expect("json");
    delete["request"]["operation"] = "DELETE".into();
    delete["request"]["oldObject"] = delete["request"]["object"].take();
    cases.push(fixtures::Fixture {
        name: "inline-delete".into(),
        body: serde_json::to_vec(&delete).expect("json"),
        config: None,
    });
    cases
}

/// POSTs `body` to both endpoints of `server` and checks status, content type and body against
/// `admission::review` with the server's config.
async fn assert_served_as_reviewed(
    server: &TestServer,
    client: &reqwest::Client,
    name: &str,
    body: &[u8],
) {
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let expected = admission::review(endpoint, body, &server.config);
        let url = format!(
            "https://localhost:{}/{}",
            server.https.port(),
            endpoint.as_str()
        );
        let response = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{name} {url}: {e}"));
        assert_eq!(
            response.status().as_u16(),
            expected.http_status,
            "{name} /{}",
            endpoint.as_str()
        );
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{name}"
        );
        let got = response.bytes().await.expect("body");
        assert!(
            got.as_ref() == expected.body.as_slice(),
            "{name} /{}: server body differs from review():\n{}\n---\n{}",
            endpoint.as_str(),
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected.body)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_is_answered_exactly_as_review_answers() {
    bounded(async {
        let cases = cases();
        let fixtures = fixtures::fixture_requests().len();
        assert!(cases.len() > fixtures, "inline cases always run");

        // Cases without a config.yaml: one server with the webhook's default config.
        let server = TestServer::start(Duration::from_secs(5)).await;
        let client = reqwest_client(&server);
        let mut served = 0;
        for case in cases.iter().filter(|c| c.config.is_none()) {
            assert_served_as_reviewed(&server, &client, &case.name, &case.body).await;
            served += 1;
        }
        server.stop().await;

        // A case with a config.yaml: a server started with `--config` that file.
        for case in cases.iter().filter(|c| c.config.is_some()) {
            let path = case
                .config
                .as_ref()
                .expect("config")
                .to_string_lossy()
                .into_owned();
            let config = webhook_harness::config_from_flags(&["--config", &path]);
            let server = TestServer::start_with(Duration::from_secs(5), config).await;
            let client = reqwest_client(&server);
            assert_served_as_reviewed(&server, &client, &case.name, &case.body).await;
            served += 1;
            server.stop().await;
        }
        assert_eq!(served, cases.len());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_the_right_status_and_a_json_body() {
    bounded(async {
        let server = TestServer::start(Duration::from_secs(5)).await;
        let mut conn = server.connect().await.expect("connect");

        let mut no_request: Value =
            serde_json::from_slice(&jobset_review("u-1", 1, 1)).expect("json");
        no_request
            .as_object_mut()
            .expect("object")
            .remove("request");
        let mut no_object: Value =
            serde_json::from_slice(&jobset_review("u-2", 1, 1)).expect("json");
        no_object["request"]
            .as_object_mut()
            .expect("object")
            .remove("object");
        let mut wrong_version: Value =
            serde_json::from_slice(&jobset_review("u-3", 1, 1)).expect("json");
        wrong_version["apiVersion"] = "admission.k8s.io/v1beta1".into();

        let reviewed: Vec<(&str, Vec<u8>)> = vec![
            ("empty body", Vec::new()),
            ("invalid json", b"{\"apiVersion\": ".to_vec()),
            ("not an object", b"[1, 2, 3]".to_vec()),
            (
                "wrong apiVersion",
                serde_json::to_vec(&wrong_version).expect("json"),
            ),
            (
                "missing request",
                serde_json::to_vec(&no_request).expect("json"),
            ),
            (
                "missing object",
                serde_json::to_vec(&no_object).expect("json"),
            ),
        ];
        for (what, body) in &reviewed {
            for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
                let expected = admission::review(endpoint, body, &server.config);
                let path = format!("/{}", endpoint.as_str());
                // With parameters on the content type: still JSON.
                let response = conn
                    .request("POST", &path, Some("application/json; charset=utf-8"), body)
                    .await
                    .expect("response");
                assert_eq!(response.status, expected.http_status, "{what} {path}");
                assert_eq!(response.body, expected.body, "{what} {path}");
                serde_json::from_slice::<Value>(&response.body)
                    .unwrap_or_else(|e| panic!("{what} {path}: body is not JSON: {e}"));
            }
        }

        // Wrong or missing content type: 415 with a Status.
        let body = jobset_review("u-4", 1, 1);
        for content_type in [Some("text/plain"), Some("application/yaml"), None] {
            let response = conn
                .request("POST", "/validate", content_type, &body)
                .await
                .expect("response");
            assert_status(&response, 415);
        }

        // Over MAX_BODY_BYTES: 413 with a Status, as soon as the length is known.
        let mut huge = TestServer::connect(&server).await.expect("connect");
        let head = format!(
            "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        huge.send(head.as_bytes()).await.expect("send head");
        let response = huge.read_response().await.expect("413 before the body");
        assert_status(&response, 413);

        // Exactly MAX_BODY_BYTES is read (and reviewed: not a 413).
        let mut big = vec![b' '; MAX_BODY_BYTES];
        big[0] = b'{';
        big[MAX_BODY_BYTES - 1] = b'}';
        let mut at_limit = server.connect().await.expect("connect");
        let response = at_limit.post_json("/mutate", &big).await.expect("response");
        let expected = admission::review(Endpoint::Mutate, &big, &server.config);
        assert_eq!(response.status, expected.http_status);
        assert_eq!(response.body, expected.body);

        // The keep-alive connection still works after all that.
        let response = conn.post_json("/ping", b"{}").await.expect("ping");
        assert_eq!(response.status, 200);
        server.stop().await;
    })
    .await;
}

fn assert_status(response: &webhook_harness::Response, code: u16) {
    assert_eq!(response.status, code);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let status: Value = serde_json::from_slice(&response.body).expect("a JSON Status");
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["code"], code, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_certificate_is_served_to_new_connections_without_a_restart() {
    bounded(async {
        let server = TestServer::start(Duration::from_millis(100)).await;
        let dir = server.dir.path();
        let ca = jobset_inplace::certs::PemPair {
            cert: std::fs::read_to_string(dir.join("ca.crt")).expect("ca"),
            key: std::fs::read_to_string(dir.join("ca.key")).expect("ca key"),
        };

        let mut old = server.connect().await.expect("connect");
        let old_cert = old.peer_certificate().expect("peer cert");
        let body = jobset_review("reload-1", 1, 2);
        let first = old.post_json("/validate", &body).await.expect("response");

        // A new pair from the same CA (new key, new serial), written as Kubernetes would not:
        // file by file. The poller must never serve a half-updated pair.
        let new = jobset_inplace::certs::issue_serving(
            &ca,
            &jobset_inplace::certs::local_names(),
            Duration::from_secs(3600),
        )
        .expect("new pair");
        let new_der = jobset_inplace::certs::parse_certs(new.cert.as_bytes(), dir)
            .expect("parse")
            .remove(0);
        assert_ne!(new_der, old_cert);
        jobset_inplace::certs::write_atomic(&dir.join("tls.crt"), new.cert.as_bytes(), 0o644)
            .expect("write cert");
        // Two polls or more: the same mismatched pair read twice is reported (once read, it may
        // be a pair caught between its writes).
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Certificate changed, key not yet: rejected, the old pair is still served.
        let during = server.connect().await.expect("connect during the update");
        assert_eq!(during.peer_certificate().expect("peer cert"), old_cert);
        jobset_inplace::certs::write_atomic(&dir.join("tls.key"), new.key.as_bytes(), 0o600)
            .expect("write key");

        let mut served = None;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let conn = server.connect().await.expect("connect");
            let cert = conn.peer_certificate().expect("peer cert");
            if cert == new_der {
                served = Some(conn);
                break;
            }
            assert_eq!(cert, old_cert, "either the old or the new certificate");
        }
        let mut fresh = served.expect("the new certificate is served within 5 s");
        let response = fresh.post_json("/validate", &body).await.expect("response");
        assert_eq!(
            (response.status, &response.body),
            (first.status, &first.body)
        );

        // The old keep-alive connection keeps working, on its old certificate.
        let again = old
            .post_json("/validate", &body)
            .await
            .expect("old connection");
        assert_eq!((again.status, &again.body), (first.status, &first.body));
        assert_eq!(old.peer_certificate().expect("peer cert"), old_cert);

        let (_, metrics) = server.health_get("/metrics").await.expect("metrics");
        assert!(
            metrics.contains(r#"jobset_inplace_tls_certificate_reloads_total{result="success"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"jobset_inplace_tls_certificate_reloads_total{result="failure"} 1"#),
            "{metrics}"
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_not_yet_valid_and_wrong_name_pairs_are_refused_and_the_old_one_served() {
    bounded(async {
        let server = TestServer::start(Duration::from_millis(50)).await;
        let dir = server.dir.path();
        let ca = jobset_inplace::certs::PemPair {
            cert: std::fs::read_to_string(dir.join("ca.crt")).expect("ca"),
            key: std::fs::read_to_string(dir.join("ca.key")).expect("ca key"),
        };
        let served = server
            .connect()
            .await
            .expect("connect")
            .peer_certificate()
            .expect("peer cert");
        let day = Duration::from_secs(86_400);
        let now = std::time::SystemTime::now();
        let local = jobset_inplace::certs::local_names();
        let cases = [
            ("expired", local.clone(), now - day * 3),
            ("not yet valid", local.clone(), now + day * 3),
            ("for other names", vec!["elsewhere.example".to_owned()], now),
        ];
        for (n, (what, names, issued)) in cases.into_iter().enumerate() {
            let bad = jobset_inplace::certs::issue_serving_at(&ca, &names, day, issued)
                .expect("bad pair");
            jobset_inplace::certs::write_atomic(&dir.join("tls.key"), bad.key.as_bytes(), 0o600)
                .expect("key");
            jobset_inplace::certs::write_atomic(&dir.join("tls.crt"), bad.cert.as_bytes(), 0o644)
                .expect("cert");
            // Refused once it has been read twice; the old pair is served all along.
            let line = format!(
                "jobset_inplace_tls_certificate_reloads_total{{result=\"failure\"}} {}",
                n + 1
            );
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let conn = server.connect().await.expect("connect");
                assert_eq!(
                    conn.peer_certificate().expect("peer cert"),
                    served,
                    "{what}"
                );
                let (_, metrics) = server.health_get("/metrics").await.expect("metrics");
                if metrics.contains(&line) {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{what}: {line} in\n{metrics}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    bounded(async {
        let server = TestServer::start(Duration::from_secs(5)).await;
        assert_eq!(server.health_get("/healthz").await.expect("healthz").0, 200);
        assert_eq!(server.health_get("/readyz").await.expect("readyz").0, 200);

        let mut conn = server.connect().await.expect("connect");
        let body = jobset_review("metrics-1", 1, 1);
        for _ in 0..3 {
            conn.post_json("/mutate", &body).await.expect("mutate");
        }
        conn.post_json("/validate", &body).await.expect("validate");
        conn.request("POST", "/validate", Some("text/plain"), &body)
            .await
            .expect("415");
        let (status, metrics) = server.health_get("/metrics").await.expect("metrics");
        assert_eq!(status, 200);
        let count = |endpoint: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| {
                    l.starts_with(&format!(
                        "jobset_inplace_admission_requests_total{{endpoint=\"{endpoint}\""
                    ))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        assert_eq!(count("mutate"), 3.0, "{metrics}");
        assert_eq!(count("validate"), 2.0, "{metrics}");
        assert!(
            metrics.contains(
                r#"jobset_inplace_admission_responses_total{endpoint="validate",code="415"} 1"#
            ),
            "{metrics}"
        );
        assert!(
            metrics.contains(
                r#"jobset_inplace_admission_duration_seconds_count{endpoint="mutate"} 3"#
            ),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"jobset_inplace_connections_open{listener="https"} 1"#),
            "{metrics}"
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_request_in_flight_finish() {
    bounded(async {
        let mut server = TestServer::start(Duration::from_secs(5)).await;
        let body = jobset_review("shutdown-1", 1, 1);
        let expected = admission::review(Endpoint::Validate, &body, &server.config);

        // An idle keep-alive connection: closed at shutdown.
        let mut idle = server.connect().await.expect("connect");
        idle.post_json("/ping", b"{}").await.expect("ping");

        // A request in flight: headers and half the body sent.
        let mut busy = server.connect().await.expect("connect");
        let request = Conn::encode("POST", "/validate", Some("application/json"), &body);
        let split = request.len() - body.len() / 2;
        busy.send(&request[..split]).await.expect("first half");
        tokio::time::sleep(Duration::from_millis(100)).await;

        server.trigger_shutdown();
        // Not ready any more, and no new connections are served.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let refused = match server.connect().await {
            Err(_) => true,
            Ok(mut conn) => conn.post_json("/ping", b"{}").await.is_err(),
        };
        assert!(refused, "a new connection after shutdown is not served");

        busy.send(&request[split..]).await.expect("second half");
        let response = busy
            .read_response()
            .await
            .expect("the in-flight request completes");
        assert_eq!(response.status, expected.http_status);
        assert_eq!(response.body, expected.body);
        assert_eq!(response.header("connection"), Some("close"));

        server
            .join(Duration::from_secs(10))
            .await
            .expect("serve returns Ok");
        assert!(
            idle.read_response().await.is_err(),
            "the idle connection was closed"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off() {
    bounded(async {
        let timeout = Duration::from_millis(300);
        let server = TestServer::start_custom(webhook_harness::default_config(), |options| {
            options.header_read_timeout = timeout;
        })
        .await;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        // No TLS handshake at all.
        let mut silent = tokio::net::TcpStream::connect(server.https)
            .await
            .expect("connect");
        let started = std::time::Instant::now();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("closed by the server")
            .unwrap_or(0);
        assert_eq!(n, 0, "nothing but a close");
        assert!(started.elapsed() >= timeout);

        // Headers that never end.
        let mut slow = server.connect().await.expect("connect");
        slow.send(b"POST /validate HTTP/1.1\r\nhost: localhost\r\n")
            .await
            .expect("partial head");
        let started = std::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_response())
            .await
            .expect("closed by the server");
        assert!(closed.is_err() || closed.is_ok_and(|r| r.status == 408));
        assert!(started.elapsed() >= timeout - Duration::from_millis(50));

        // A plain TCP client that writes one header line and stops, on the health port too.
        let mut plain = tokio::net::TcpStream::connect(server.health)
            .await
            .expect("connect");
        plain
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("write");
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut rest))
            .await
            .expect("closed by the server")
            .ok();

        // A well-behaved client is unaffected.
        let mut conn = server.connect().await.expect("connect");
        assert_eq!(
            conn.post_json("/ping", b"{}").await.expect("ping").status,
            200
        );
        server.stop().await;
    })
    .await;
}
