//! In-cluster certificates on the test API server ([`cluster::Renewer`]): the first replica
//! creates the Secret, the others read it, nobody overwrites another's CA, a serving certificate
//! that no longer fits is replaced under a resourceVersion precondition, the caBundle is set by
//! a targeted JSON Patch before the files are installed, a lost race is decided again, and
//! every request is bounded by the request timeout. Renewal and rotation over time, with a
//! webhook serving TLS: tests/it/certs/rotation.rs.

use std::time::Duration;

use base64::Engine;
use jobset_inplace::certs::cluster::{self, Renewer, Target};
use jobset_inplace::certs::rotation::{Policy, Step};
use jobset_inplace::certs::{self, Error};
use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
use serde_json::{Value, json};

const NS: &str = "jobset-inplace-system";
const LIMIT: Duration = Duration::from_secs(60);

fn webhook_configuration(kind: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": "jobset-inplace"},
        "webhooks": [
            {"name": "a.jobset-inplace.dev", "clientConfig": {"service": {"name": "jobset-inplace-webhook", "namespace": NS, "path": "/x"}},
             "admissionReviewVersions": ["v1"], "sideEffects": "None", "timeoutSeconds": 5},
            {"name": "b.jobset-inplace.dev", "clientConfig": {"service": {"name": "jobset-inplace-webhook", "namespace": NS, "path": "/y"}, "caBundle": "c3RhbGU="},
             "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail"}
        ]
    })
}

const CONFIGURATIONS: [(&str, &str); 2] = [
    (
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
    ),
    (
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
    ),
];

async fn server_with_configurations() -> TestApiServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = TestApiServer::start().await;
    for (kind, resource) in CONFIGURATIONS {
        server
            .create(resource, webhook_configuration(kind))
            .expect("configuration");
    }
    server
}

fn target(dir: &std::path::Path, names: Vec<String>) -> Target {
    Target {
        namespace: NS.to_owned(),
        secret: "tls".to_owned(),
        webhook_config: Some("jobset-inplace".to_owned()),
        names,
        dir: dir.to_owned(),
        install_ca_key: false,
    }
}

fn renewer(server: &TestApiServer, dir: &std::path::Path, names: Vec<String>) -> Renewer {
    Renewer::new(
        server.client(),
        target(dir, names),
        Policy::DEFAULT,
        Duration::from_secs(5),
    )
}

fn names() -> Vec<String> {
    certs::service_names("jobset-inplace-webhook", NS)
}

fn secret_field(server: &TestApiServer, key: &str) -> Vec<u8> {
    let secret = server.get("secrets", NS, "tls").expect("secret");
    let b64 = secret["data"][key].as_str().expect("field");
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64")
}

#[tokio::test]
async fn replicas_share_one_ca_and_the_ca_bundle_follows() {
    tokio::time::timeout(LIMIT, async {
        let server = server_with_configurations().await;
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        let (ra, rb) = (
            renewer(&server, a.path(), names()),
            renewer(&server, b.path(), names()),
        );

        // Two replicas start at once: one Secret, one CA, both install it.
        let (first_a, first_b) = tokio::join!(ra.step(), rb.step());
        let (first_a, first_b) = (first_a.expect("replica a"), first_b.expect("replica b"));
        let made: Vec<&Step> = first_a.steps.iter().chain(&first_b.steps).collect();
        assert!(
            matches!(made.as_slice(), [Step::NewCa(_)]),
            "one CA between them: {made:?}"
        );
        assert_eq!(first_a.ca_not_after, first_b.ca_not_after);
        let ca = secret_field(&server, "ca.crt");
        for dir in [a.path(), b.path()] {
            assert_eq!(std::fs::read(dir.join("ca.crt")).expect("ca"), ca);
            assert_eq!(
                std::fs::read(dir.join("tls.crt")).expect("cert"),
                secret_field(&server, "tls.crt")
            );
            assert!(
                !dir.join("ca.key").exists(),
                "the CA key is not installed for the server"
            );
        }
        let secret = server.get("secrets", NS, "tls").expect("secret");
        assert_eq!(secret["type"], "kubernetes.io/tls");
        assert_eq!(
            secret["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "jobset-inplace"
        );
        let encoded = base64::engine::general_purpose::STANDARD.encode(&ca);
        for (kind, resource) in CONFIGURATIONS {
            let config = server.get(resource, "", "jobset-inplace").expect("config");
            let mut want = webhook_configuration(kind);
            for hook in want["webhooks"].as_array_mut().expect("webhooks") {
                hook["clientConfig"]["caBundle"] = json!(encoded);
            }
            assert_eq!(
                config["webhooks"], want["webhooks"],
                "{resource}: the caBundles set, every other field as it was"
            );
        }

        // A later check changes nothing: no write to the Secret or the configurations.
        let before = server.counters();
        let again = ra.step().await.expect("again");
        assert!(again.steps.is_empty() && !again.installed && again.ca_bundles_set == 0);
        let used = server.counters().since(&before);
        assert_eq!(used.writes(), 0, "an up-to-date check writes nothing: {used:?}");

        // A serving certificate that no longer covers the names is renewed, with the same CA,
        // by one update.
        let old_cert = secret_field(&server, "tls.crt");
        let mut more = names();
        more.push("webhook.example".to_owned());
        let report = renewer(&server, b.path(), more).step().await.expect("renews");
        assert!(
            matches!(report.steps.as_slice(), [Step::IssueServing(why)] if why.contains("webhook.example")),
            "{report:?}"
        );
        assert_ne!(secret_field(&server, "tls.crt"), old_cert);
        assert_eq!(
            secret_field(&server, "ca.crt"),
            ca,
            "the CA is never replaced"
        );
        let used = server.counters().since(&before);
        assert_eq!(used.get(Verb::Update, "secrets"), 1);
        assert_eq!(used.get(Verb::Create, "secrets"), 0);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_lost_race_is_decided_again_and_a_silent_api_times_out() {
    tokio::time::timeout(LIMIT, async {
        let server = server_with_configurations().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let r = renewer(&server, dir.path(), names());
        // Another replica "wins" the create: the step reads again and decides on what it finds.
        server.fail_next(1, Verb::Create, "secrets", 409);
        let report = r.step().await.expect("created on the second try");
        assert!(
            matches!(report.steps.as_slice(), [Step::NewCa(_)]),
            "{report:?}"
        );

        // Someone changes the caBundle between our read and our patch, three times running:
        // each patch's test operation fails it (nothing is written; each is tried again on a
        // fresh read), the step fails, and the next check sets it.
        server.fail_next(3, Verb::Patch, "validatingwebhookconfigurations", 422);
        let mut config = server
            .get("validatingwebhookconfigurations", "", "jobset-inplace")
            .expect("config");
        config["webhooks"][0]["clientConfig"]["caBundle"] = json!("b3RoZXI=");
        server
            .put("validatingwebhookconfigurations", config)
            .expect("put");
        assert!(r.step().await.is_err(), "the patch was refused");
        let report = r.step().await.expect("set on the next check");
        assert_eq!(report.ca_bundles_set, 1);

        // An API that never answers: the step gives up after the request timeout.
        let quick = Renewer::new(
            server.client(),
            target(dir.path(), names()),
            Policy::DEFAULT,
            Duration::from_millis(300),
        );
        server.silence_next(1, Verb::Get, "secrets");
        let started = std::time::Instant::now();
        let err = quick.step().await.expect_err("timed out");
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(
            err.to_string().contains("secret jobset-inplace-system/tls"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        quick.step().await.expect("the next check works");
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn the_certs_command_form_installs_the_ca_key_and_keeps_other_secret_keys() {
    tokio::time::timeout(LIMIT, async {
        let server = server_with_configurations().await;
        server
            .create(
                "secrets",
                json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                       "metadata": {"name": "tls", "namespace": NS,
                                    "annotations": {"team": "platform"}},
                       "data": {"extra": "eA=="}}),
            )
            .expect("secret");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = target(dir.path(), names());
        t.install_ca_key = true;
        let report = Renewer::new(server.client(), t, Policy::DEFAULT, Duration::from_secs(5))
            .step()
            .await
            .expect("step");
        assert!(
            matches!(report.steps.as_slice(), [Step::NewCa(_)]),
            "{report:?}"
        );
        let secret = server.get("secrets", NS, "tls").expect("secret");
        assert_eq!(
            secret["data"]["extra"], "eA==",
            "a key that is not ours is kept"
        );
        assert_eq!(secret["metadata"]["annotations"]["team"], "platform");
        let ca = certs::PemPair {
            cert: std::fs::read_to_string(dir.path().join("ca.crt")).expect("ca.crt"),
            key: std::fs::read_to_string(dir.path().join("ca.key")).expect("ca.key"),
        };
        assert_eq!(ca.key.as_bytes(), secret_field(&server, "ca.key"));
        let mode = |f: &str| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(dir.path().join(f))
                .expect("meta")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(
            (mode("ca.key"), mode("tls.key"), mode("tls.crt")),
            (0o600, 0o600, 0o644)
        );
        let cert = std::fs::read_to_string(dir.path().join("tls.crt")).expect("tls.crt");
        let key = std::fs::read_to_string(dir.path().join("tls.key")).expect("tls.key");
        assert_eq!(
            certs::serving_cert_problem(
                &ca.cert,
                &cert,
                &key,
                &names(),
                std::time::SystemTime::now()
            ),
            None
        );
        // The caBundle alone, for a CA kept elsewhere (`certs --patch-webhooks` without --secret).
        let changed = cluster::patch_ca_bundle(
            &server.client(),
            "jobset-inplace",
            ca.cert.as_bytes(),
            Duration::from_secs(5),
        )
        .await
        .expect("patch");
        assert_eq!(changed, 0, "already this CA");
    })
    .await
    .expect("bounded");
}

/// Issue 21 item 5: the Secret deleted, then its CA key corrupted, while two replicas serve its
/// certificates. The replica that makes the new CA keeps what the caBundle trusted beside it, so
/// the other replica's certificate (it has not read the Secret again yet) still verifies against
/// every webhook's stored caBundle, as the API server checks it; once it reads, both serve the
/// new pair. Before, the new CA was trusted alone and that replica failed every review.
#[tokio::test]
async fn a_lost_or_corrupted_secret_keeps_the_served_certificates_trusted() {
    tokio::time::timeout(LIMIT, async {
        let server = server_with_configurations().await;
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        let (ra, rb) = (
            renewer(&server, a.path(), names()),
            renewer(&server, b.path(), names()),
        );
        ra.step().await.expect("replica a");
        rb.step().await.expect("replica b");
        for damage in ["deleted", "corrupted"] {
            if damage == "deleted" {
                server.delete("secrets", NS, "tls").expect("delete");
            } else {
                let mut secret = server.get("secrets", NS, "tls").expect("secret");
                secret["data"]["ca.key"] =
                    json!(base64::engine::general_purpose::STANDARD.encode("garbage"));
                server.put("secrets", secret).expect("put");
            }
            let report = ra.step().await.expect("replica a makes a new CA");
            assert!(
                matches!(report.steps.as_slice(), [Step::NewCa(_)]),
                "{damage}: {report:?}"
            );
            let now = std::time::SystemTime::now();
            let behind = std::fs::read(b.path().join("tls.crt")).expect("b's certificate");
            let fresh = std::fs::read(a.path().join("tls.crt")).expect("a's certificate");
            assert_ne!(behind, fresh, "{damage}");
            for (_, resource) in CONFIGURATIONS {
                let config = server.get(resource, "", "jobset-inplace").expect("config");
                for (i, roots) in cluster::ca_bundles_of(&config).iter().enumerate() {
                    for (who, pem) in [("the replica a read behind", &behind), ("the new", &fresh)]
                    {
                        let chain =
                            certs::parse_certs(pem, std::path::Path::new("tls.crt")).expect("pem");
                        if let Err(e) = certs::verify_chain(roots, &chain, &names(), now) {
                            panic!("{damage}: {resource} webhook {i}: {who} certificate: {e}");
                        }
                    }
                }
            }
            rb.step().await.expect("replica b reads the new pair");
            assert_eq!(
                std::fs::read(b.path().join("tls.crt")).expect("b's certificate"),
                fresh,
                "{damage}"
            );
        }
    })
    .await
    .expect("bounded");
}
