//! In-cluster certificates on the test API server: the first replica creates the Secret, the
//! others read it, nobody overwrites another's CA, a serving certificate due for renewal is
//! replaced under a resourceVersion precondition, and the caBundle is patched before use.

use std::time::Duration;

use base64::Engine;
use jobset_inplace::certs::{self, cluster};
use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
use serde_json::{Value, json};

const NS: &str = "jobset-inplace-system";

fn webhook_configuration(kind: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": "jobset-inplace"},
        "webhooks": [
            {"name": "a.jobset-inplace.dev", "clientConfig": {"service": {"name": "jobset-inplace-webhook", "namespace": NS, "path": "/x"}},
             "admissionReviewVersions": ["v1"], "sideEffects": "None"},
            {"name": "b.jobset-inplace.dev", "clientConfig": {"service": {"name": "jobset-inplace-webhook", "namespace": NS, "path": "/y"}, "caBundle": "c3RhbGU="},
             "admissionReviewVersions": ["v1"], "sideEffects": "None"}
        ]
    })
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
    tokio::time::timeout(Duration::from_secs(60), async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let server = TestApiServer::start().await;
        server
            .create(
                "mutatingwebhookconfigurations",
                webhook_configuration("MutatingWebhookConfiguration"),
            )
            .expect("mutating");
        server
            .create(
                "validatingwebhookconfigurations",
                webhook_configuration("ValidatingWebhookConfiguration"),
            )
            .expect("validating");
        let names = certs::service_names("jobset-inplace-webhook", NS);
        let client = server.client();
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");

        // Two replicas start at once: one Secret, one CA, both serve it.
        let (ra, rb) = tokio::join!(
            cluster::bootstrap(&client, NS, "tls", &names, Some("jobset-inplace"), a.path()),
            cluster::bootstrap(&client, NS, "tls", &names, Some("jobset-inplace"), b.path()),
        );
        ra.expect("replica a");
        rb.expect("replica b");
        let ca = secret_field(&server, "ca.crt");
        for dir in [a.path(), b.path()] {
            assert_eq!(std::fs::read(dir.join("ca.crt")).expect("ca"), ca);
            assert_eq!(
                std::fs::read(dir.join("tls.crt")).expect("cert"),
                secret_field(&server, "tls.crt")
            );
        }
        let secret = server.get("secrets", NS, "tls").expect("secret");
        assert_eq!(secret["type"], "kubernetes.io/tls");
        let encoded = base64::engine::general_purpose::STANDARD.encode(&ca);
        for res in [
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
        ] {
            let config = server.get(res, "", "jobset-inplace").expect("config");
            for hook in config["webhooks"].as_array().expect("webhooks") {
                assert_eq!(hook["clientConfig"]["caBundle"], encoded, "{res}");
                assert_eq!(
                    hook["admissionReviewVersions"][0], "v1",
                    "{res}: the rest is kept"
                );
            }
        }

        // A restart changes nothing: no write to the Secret or the configurations.
        let before = server.counters();
        cluster::bootstrap(&client, NS, "tls", &names, Some("jobset-inplace"), a.path())
            .await
            .expect("again");
        let used = server.counters().since(&before);
        assert_eq!(
            used.writes(),
            0,
            "an up-to-date bootstrap writes nothing: {used:?}"
        );

        // A serving certificate that no longer covers the names is renewed, with the same CA.
        let old_cert = secret_field(&server, "tls.crt");
        let mut more = names.clone();
        more.push("webhook.example".to_owned());
        cluster::bootstrap(&client, NS, "tls", &more, Some("jobset-inplace"), b.path())
            .await
            .expect("renews");
        assert_ne!(secret_field(&server, "tls.crt"), old_cert);
        assert_eq!(
            secret_field(&server, "ca.crt"),
            ca,
            "the CA is never replaced"
        );
        assert_eq!(
            server
                .counters()
                .since(&before)
                .get(Verb::Update, "secrets"),
            1
        );
    })
    .await
    .expect("bounded");
}
