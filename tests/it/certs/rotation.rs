//! `webhook --self-signed` over time, on the test API server with real webhooks serving TLS:
//! two replicas started from the command line's own flags (lifetimes of seconds), and clients
//! that do what the API server does: read the `caBundle` from the webhook configuration as it is
//! stored now, open a connection to the Service's DNS name, verify the served certificate
//! against that bundle, and send an AdmissionReview.
//!
//! - serving certificates are renewed before they expire, every replica loads each renewal, and
//!   an expired wrong-name pair written into the Secret is never served;
//! - a whole CA rotation (next CA trusted, switch, old CA dropped) under a steady load of
//!   admissions loses none of them;
//! - the expiry gauges say what is served and what the Secret holds;
//! - a replica whose first check fails backs off and serves once one succeeds.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use clap::Parser as _;
use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::certs::{self, rotation};
use jobset_inplace::cli::{Cli, Command};
use jobset_inplace::webhook::{self, Webhook};
use jobset_inplace_testkit::apiserver::TestApiServer;
use jobset_inplace_testkit::generators::jobset_review;
use jobset_inplace_testkit::webhook_harness::{self as harness, Conn};
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "jobset-inplace-system";
const SERVICE: &str = "jobset-inplace-webhook";
const SECRET: &str = "jobset-inplace-webhook-tls";
const CONFIG: &str = "jobset-inplace";
const LIMIT: Duration = Duration::from_secs(90);

/// What the API server dials: the Service's DNS name.
fn service_name() -> String {
    format!("{SERVICE}.{NS}.svc")
}

fn manifest_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test API server with the deployed webhook configurations (no caBundle yet).
async fn api_server() -> TestApiServer {
    harness::install_provider();
    let server = TestApiServer::start().await;
    let text =
        std::fs::read_to_string(manifest_dir().join("deploy/base/webhook-configurations.yaml"))
            .expect("webhook configurations");
    for object in serde_saphyr::from_multiple::<Value>(&text).expect("yaml") {
        let resource = match object["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => "mutatingwebhookconfigurations",
            Some("ValidatingWebhookConfiguration") => "validatingwebhookconfigurations",
            other => panic!("unexpected {other:?}"),
        };
        server.create(resource, object).expect("configuration");
    }
    server
}

/// One `webhook --self-signed` replica, in-process, on ephemeral loopback ports.
struct Replica {
    https: SocketAddr,
    health: SocketAddr,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), webhook::Error>>>,
}

impl Replica {
    /// Starts `jobset-inplace webhook --self-signed <flags>` against `server` and waits for it
    /// to be ready.
    async fn start(server: &TestApiServer, flags: &[&str]) -> Replica {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir_flag = dir.path().join("certs").to_string_lossy().into_owned();
        let mut argv = vec![
            "jobset-inplace",
            "webhook",
            "--self-signed",
            "--namespace",
            NS,
            "--cert-dir",
            &dir_flag,
            "--cert-reload-interval",
            "100ms",
            "--shutdown-timeout",
            "5s",
            // /metrics on the health listener, where these tests read it.
            "--metrics-secure=false",
        ];
        argv.extend_from_slice(flags);
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        let global = cli.global();
        let Command::Webhook(args) = cli.command else {
            unreachable!("parsed as webhook")
        };
        let config = InjectionConfig::load(&args.injection, global.protocol).expect("config");
        let renewer = args.renewer(server.client()).expect("lifetimes fit");
        let (cert, key) = renewer.tls_files();
        let options = args.serve_options(cert, key);
        let https = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let (https_addr, health_addr) = (
            https.local_addr().expect("addr"),
            health.local_addr().expect("addr"),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(webhook::serve_self_signed(
            https,
            health,
            Webhook::new(config),
            options,
            renewer,
            args.cert_renew_interval,
            async move {
                let _ = stopped.await;
            },
        ));
        let replica = Replica {
            https: https_addr,
            health: health_addr,
            _dir: dir,
            stop: Some(stop),
            task: Some(task),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(
            harness::health_get(health_addr, "/readyz").await,
            Ok((200, _))
        ) {
            assert!(Instant::now() < deadline, "the replica got ready in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        replica
    }

    async fn metrics(&self) -> String {
        let (status, text) = harness::health_get(self.health, "/metrics")
            .await
            .expect("metrics");
        assert_eq!(status, 200);
        text
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(15), task)
                .await
                .expect("stops in time")
                .expect("no panic")
                .expect("serve returned Ok");
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A gauge's value in a text exposition.
fn gauge(text: &str, series: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn not_after_series(certificate: &str) -> String {
    format!("jobset_inplace_tls_certificate_not_after_seconds{{certificate=\"{certificate}\"}}")
}

/// The trust anchors of the first webhook's `caBundle` in a configuration, as stored now.
fn stored_bundle(server: &TestApiServer, resource: &str) -> Vec<CertificateDer<'static>> {
    let Some(config) = server.get(resource, "", CONFIG) else {
        return Vec::new();
    };
    let Some(b64) = config["webhooks"][0]["clientConfig"]["caBundle"].as_str() else {
        return Vec::new();
    };
    let pem = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("caBundle is base64");
    certs::parse_certs(&pem, std::path::Path::new("caBundle")).unwrap_or_default()
}

fn secret_file(server: &TestApiServer, key: &str) -> Option<Vec<u8>> {
    let secret = server.get("secrets", NS, SECRET)?;
    let b64 = secret["data"][key].as_str()?;
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

fn leaf(pem: &[u8]) -> CertificateDer<'static> {
    certs::parse_certs(pem, std::path::Path::new("pem"))
        .expect("certificate")
        .swap_remove(0)
}

/// Whether `cert` names `ca` as its issuer (by subject: every CA made here has its own).
fn issued_by(cert: &CertificateDer<'_>, ca: &CertificateDer<'_>) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(cert),
        x509_parser::parse_x509_certificate(ca),
    ) else {
        return false;
    };
    cert.issuer().as_raw() == ca.subject().as_raw()
}

fn unix_now() -> i64 {
    rotation::unix(SystemTime::now())
}

/// One admission as the API server makes it: the `caBundle` read from the stored configuration
/// of `endpoint`, a new connection verified against it for the Service's name, a review; the
/// served certificate.
async fn admit(
    server: &TestApiServer,
    addr: SocketAddr,
    endpoint: &str,
    uid: &str,
) -> Result<CertificateDer<'static>, String> {
    let resource = if endpoint == "mutate" {
        "mutatingwebhookconfigurations"
    } else {
        "validatingwebhookconfigurations"
    };
    let roots = stored_bundle(server, resource);
    if roots.is_empty() {
        return Err(format!("{resource}: no caBundle"));
    }
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root).map_err(|e| format!("trust anchor: {e}"))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(store)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let body = jobset_review(uid, 1, 2);
    let exchange = async {
        let mut conn = Conn::connect_as(addr, &connector, &service_name())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let served = conn.peer_certificate().ok_or("no peer certificate")?;
        let response = conn
            .post_json(&format!("/{endpoint}"), &body)
            .await
            .map_err(|e| format!("request: {e}"))?;
        if response.status != 200 {
            return Err(format!("HTTP {}", response.status));
        }
        let review: Value =
            serde_json::from_slice(&response.body).map_err(|e| format!("answer: {e}"))?;
        if review["response"]["uid"] != uid || !review["response"]["allowed"].is_boolean() {
            return Err(format!("not an answer to {uid}: {review}"));
        }
        Ok(served)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
}

/// Clients sending admissions to every replica in turn until `stop`: what they saw.
#[derive(Default)]
struct Load {
    ok: AtomicUsize,
    failures: Mutex<Vec<String>>,
    /// Distinct certificates served, by replica.
    served: Mutex<Vec<Vec<CertificateDer<'static>>>>,
}

fn start_load(
    server: Arc<TestApiServer>,
    replicas: Vec<SocketAddr>,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> (Arc<Load>, Vec<JoinHandle<()>>) {
    let load = Arc::new(Load {
        served: Mutex::new(vec![Vec::new(); replicas.len()]),
        ..Load::default()
    });
    let started = Instant::now();
    let tasks = (0..clients)
        .map(|client| {
            let (server, replicas, stop, load) =
                (server.clone(), replicas.clone(), stop.clone(), load.clone());
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Acquire) {
                    let which = (n + client) % replicas.len();
                    let endpoint = if n.is_multiple_of(2) {
                        "validate"
                    } else {
                        "mutate"
                    };
                    let uid = format!("c{client}-{n}");
                    match admit(&server, replicas[which], endpoint, &uid).await {
                        Ok(served) => {
                            load.ok.fetch_add(1, Ordering::Relaxed);
                            let mut seen = load.served.lock().unwrap_or_else(|p| p.into_inner());
                            if !seen[which].contains(&served) {
                                seen[which].push(served);
                            }
                        }
                        Err(e) => load
                            .failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!(
                                "+{:.2}s replica {which} /{endpoint}: {e}",
                                started.elapsed().as_secs_f64()
                            )),
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    (load, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificates_are_renewed_before_they_expire_on_every_replica() {
    tokio::time::timeout(LIMIT, async {
        let server = Arc::new(api_server().await);
        // Serving certificates of 3 s (renewed after 2 s), a CA that outlives the test.
        let flags = [
            "--cert-renew-interval",
            "200ms",
            "--serving-cert-validity",
            "3s",
            "--ca-validity",
            "600s",
            "--ca-overlap",
            "2s",
        ];
        let replicas = [
            Replica::start(&server, &flags).await,
            Replica::start(&server, &flags).await,
        ];
        let ca = secret_file(&server, "ca.crt").expect("the Secret holds the CA");
        let stop = Arc::new(AtomicBool::new(false));
        let (load, clients) = start_load(
            server.clone(),
            replicas.iter().map(|r| r.https).collect(),
            2,
            stop.clone(),
        );

        // After a while, someone writes an expired pair for other names into the Secret: the
        // replicas replace it before installing anything, so it is never served.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let day = Duration::from_secs(86_400);
        let ca_pair = certs::PemPair {
            cert: String::from_utf8(ca.clone()).expect("pem"),
            key: String::from_utf8(secret_file(&server, "ca.key").expect("ca.key")).expect("pem"),
        };
        let bad = certs::issue_serving_at(
            &ca_pair,
            &["elsewhere.example".to_owned()],
            day,
            SystemTime::now() - day * 3,
        )
        .expect("bad pair");
        let mut secret = server.get("secrets", NS, SECRET).expect("secret");
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        secret["data"]["tls.crt"] = b64(&bad.cert).into();
        secret["data"]["tls.key"] = b64(&bad.key).into();
        server.put("secrets", secret).expect("put");
        let bad_leaf = leaf(bad.cert.as_bytes());
        let deadline = Instant::now() + Duration::from_secs(5);
        while secret_file(&server, "tls.crt").is_some_and(|c| leaf(&c) == bad_leaf) {
            assert!(
                Instant::now() < deadline,
                "the bad pair was replaced in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, Ordering::Release);
        for client in clients {
            client.await.expect("client");
        }

        let failures = load.failures.lock().expect("lock").clone();
        assert!(
            failures.is_empty(),
            "{} failed admissions:\n{}",
            failures.len(),
            failures.join("\n")
        );
        let ok = load.ok.load(Ordering::Relaxed);
        assert!(ok >= 50, "{ok} admissions");
        let served = load.served.lock().expect("lock").clone();
        let roots = certs::parse_certs(&ca, std::path::Path::new("ca.crt")).expect("ca");
        for (i, certs_served) in served.iter().enumerate() {
            // ~8 s of 3-second certificates renewed after 2: several each, all from the CA.
            assert!(
                certs_served.len() >= 3,
                "replica {i} served {} certificates",
                certs_served.len()
            );
            assert!(
                !certs_served.contains(&bad_leaf),
                "replica {i} served the bad pair"
            );
            for cert in certs_served {
                let (not_before, not_after) = certs::validity(cert).expect("validity");
                assert!(
                    not_after - not_before <= 4,
                    "a 3 s certificate (+ backdate)"
                );
                assert!(issued_by(cert, &roots[0]), "replica {i}: one CA throughout");
            }
        }
        // Settled: both replicas serve what the Secret holds, and say when it expires. A replica
        // may still be reloading a renewal (on a busy machine, a moment after the Secret moved):
        // read both again until they agree, within a bound.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ca_not_after = certs::not_after(&roots[0]).expect("ca not after");
        for replica in &replicas {
            let deadline = Instant::now() + Duration::from_secs(10);
            let (served, in_secret, text) = loop {
                let in_secret = leaf(&secret_file(&server, "tls.crt").expect("tls.crt"));
                let served = admit(&server, replica.https, "validate", "final")
                    .await
                    .expect("final");
                let text = replica.metrics().await;
                if served == in_secret || Instant::now() > deadline {
                    break (served, in_secret, text);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let serving = gauge(&text, &not_after_series("serving"));
            assert!(
                served == in_secret,
                "the replica serves what the Secret holds"
            );
            assert_eq!(serving, certs::not_after(&served), "{text}");
            assert!(serving.expect("serving gauge") > unix_now(), "{text}");
            assert_eq!(
                gauge(&text, &not_after_series("ca")),
                Some(ca_not_after),
                "{text}"
            );
            assert_eq!(gauge(&text, &not_after_series("ca_next")), None, "{text}");
            assert_eq!(
                gauge(
                    &text,
                    "jobset_inplace_tls_certificate_reloads_total{result=\"failure\"}"
                ),
                Some(0),
                "{text}"
            );
            assert!(
                gauge(
                    &text,
                    "jobset_inplace_tls_certificate_renewal_checks_total{result=\"success\"}"
                )
                .is_some_and(|n| n >= 10),
                "{text}"
            );
        }
        for replica in replicas {
            replica.stop().await;
        }
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_under_load_loses_no_admission() {
    tokio::time::timeout(LIMIT, async {
        let server = Arc::new(api_server().await);
        // A CA of 24 s: rotated after ~16 s, the next CA trusted 2 s before it signs, the old
        // one 2 s after; serving certificates of 6 s.
        let flags = [
            "--cert-renew-interval",
            "250ms",
            "--serving-cert-validity",
            "6s",
            "--ca-validity",
            "24s",
            "--ca-overlap",
            "2s",
        ];
        let replicas = [
            Replica::start(&server, &flags).await,
            Replica::start(&server, &flags).await,
        ];
        let first_ca = leaf(&secret_file(&server, "ca.crt").expect("ca.crt"));
        let stop = Arc::new(AtomicBool::new(false));
        let (load, clients) = start_load(
            server.clone(),
            replicas.iter().map(|r| r.https).collect(),
            3,
            stop.clone(),
        );

        // Watch the rotation go by: the Secret's phases, the stored caBundle's size, the gauges.
        let mut phases: Vec<&str> = Vec::new();
        let mut bundle_sizes = std::collections::BTreeSet::new();
        let mut next_gauges = 0;
        let mut last_metrics = Instant::now();
        loop {
            let signing = secret_file(&server, "ca.crt").map(|c| leaf(&c));
            let phase = match (
                secret_file(&server, rotation::NEXT_CA_CERT_FILE).is_some(),
                secret_file(&server, rotation::PREVIOUS_CA_CERT_FILE).is_some(),
                signing.as_ref() == Some(&first_ca),
            ) {
                (false, false, true) => "first CA",
                (true, false, true) => "next CA trusted",
                (false, true, false) => "switched",
                (false, false, false) => "old CA dropped",
                other => panic!("an unexpected Secret: {other:?}"),
            };
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
            bundle_sizes.insert(stored_bundle(&server, "validatingwebhookconfigurations").len());
            if last_metrics.elapsed() > Duration::from_millis(300) {
                for replica in &replicas {
                    if gauge(&replica.metrics().await, &not_after_series("ca_next")).is_some() {
                        next_gauges += 1;
                    }
                }
                last_metrics = Instant::now();
            }
            if phase == "old CA dropped" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The load goes on while every replica settles on the new CA alone.
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Release);
        for client in clients {
            client.await.expect("client");
        }

        let failures = load.failures.lock().expect("lock").clone();
        let ok = load.ok.load(Ordering::Relaxed);
        assert!(
            failures.is_empty(),
            "{} of {} admissions failed during the rotation:\n{}",
            failures.len(),
            failures.len() + ok,
            failures.join("\n")
        );
        assert!(ok >= 100, "{ok} admissions");
        assert_eq!(
            phases,
            ["first CA", "next CA trusted", "switched", "old CA dropped"],
            "the rotation's phases in order"
        );
        assert_eq!(
            bundle_sizes,
            [1, 2].into(),
            "one CA, two during the overlaps, one again"
        );
        assert!(next_gauges > 0, "ca_next was exported during the overlap");

        // Every replica now serves a certificate of the new CA, and says so.
        let new_ca = secret_file(&server, "ca.crt").expect("ca.crt");
        let new_roots = certs::parse_certs(&new_ca, std::path::Path::new("ca.crt")).expect("ca");
        assert_eq!(
            stored_bundle(&server, "mutatingwebhookconfigurations"),
            new_roots
        );
        assert_eq!(
            stored_bundle(&server, "validatingwebhookconfigurations"),
            new_roots
        );
        let served = load.served.lock().expect("lock").clone();
        for (i, replica) in replicas.iter().enumerate() {
            let last = admit(&server, replica.https, "mutate", "final")
                .await
                .expect("final");
            certs::verify_chain(&new_roots, &[last], &[service_name()], SystemTime::now())
                .unwrap_or_else(|e| panic!("replica {i}: {e}"));
            let from_old = served[i].iter().filter(|c| issued_by(c, &first_ca)).count();
            assert!(
                from_old > 0 && from_old < served[i].len(),
                "replica {i} served both CAs' certificates"
            );
            let text = replica.metrics().await;
            assert_eq!(
                gauge(&text, &not_after_series("ca")),
                certs::not_after(&new_roots[0]),
                "{text}"
            );
            assert_eq!(gauge(&text, &not_after_series("ca_next")), None, "{text}");
            assert_eq!(
                gauge(
                    &text,
                    "jobset_inplace_tls_certificate_reloads_total{result=\"failure\"}"
                ),
                Some(0),
                "{text}"
            );
        }
        for replica in replicas {
            replica.stop().await;
        }
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_retries_its_first_check_until_the_api_answers() {
    use jobset_inplace_testkit::apiserver::Verb;
    tokio::time::timeout(LIMIT, async {
        let server = api_server().await;
        // The first two reads of the Secret fail: the replica backs off and tries again, and
        // serves once a check succeeds.
        server.fail_next(2, Verb::Get, "secrets", 500);
        let replica = Replica::start(&server, &["--cert-renew-interval", "200ms"]).await;
        let text = replica.metrics().await;
        assert_eq!(
            gauge(
                &text,
                "jobset_inplace_tls_certificate_renewal_checks_total{result=\"failure\"}"
            ),
            Some(2),
            "{text}"
        );
        let served = admit(&server, replica.https, "validate", "after-retries")
            .await
            .expect("served once set up");
        assert_eq!(
            Some(leaf(&secret_file(&server, "tls.crt").expect("tls.crt"))),
            Some(served)
        );
        replica.stop().await;
    })
    .await
    .expect("bounded");
}
