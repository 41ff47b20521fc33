//! `doctor` and `status`, run as an operator runs them: the real binary, a kubeconfig that
//! points at the in-repo test API server, objects as an installation leaves them.

use std::future::Future;
use std::process::Output;
use std::time::{Duration, SystemTime};

use jobset_inplace::certs;
use jobset_inplace::protocol::JOBSET_NAME_LABEL;
use jobset_inplace_testkit::apiserver::TestApiServer;
use jobset_inplace_testkit::build::{JobSet, Pod};
use jobset_inplace_testkit::fixtures;
use serde_json::{Value, json};

/// The epoch dialect's pod annotation.
const EPOCH: &str = "jobset.sigs.k8s.io/epoch";

async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long");
}

/// Runs the binary with a kubeconfig for `server` (plain HTTP, no credentials).
async fn run(server: &TestApiServer, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: {}}}\n\
             users:\n- name: t\n  user: {{}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: t}}\n\
             current-context: t\n",
            server.url()
        ),
    )
    .expect("kubeconfig");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("the command returns")
        .expect("runs")
}

/// stdout read as one YAML document.
fn as_yaml(out: &Output) -> Value {
    jobset_inplace::settings::from_yaml(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("yaml: {e}: {out:?}"))
}

/// Every string of `value` with its digits removed.
fn without_digits(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(s.chars().filter(|c| !c.is_ascii_digit()).collect()),
        Value::Array(items) => Value::Array(items.into_iter().map(without_digits).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, without_digits(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Issue 47: an API server that cannot be reached is one line naming it and the kubeconfig
/// context, for `doctor` and `status` alike (it was every check's client error, 33 lines).
#[tokio::test]
async fn an_unreachable_server_is_one_line_naming_it_and_the_context() {
    bounded(async {
        // A loopback port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: \
                 http://127.0.0.1:{port}}}\nusers:\n- name: t\n  user: {{}}\ncontexts:\n- name: \
                 far-away\n  context: {{cluster: t, user: t}}\ncurrent-context: far-away\n"
            ),
        )
        .expect("kubeconfig");
        for args in [&["doctor"][..], &["status", "-n", "team"]] {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
                .args(args)
                .env("KUBECONFIG", &kubeconfig)
                .env_remove("KUBERNETES_SERVICE_HOST")
                .kill_on_drop(true)
                .output();
            let out = tokio::time::timeout(Duration::from_secs(30), out)
                .await
                .expect("the command returns")
                .expect("runs");
            assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
            assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            let prefix = format!(
                "jobset-inplace: cannot reach the Kubernetes API server http://127.0.0.1:{port}/ \
                 (kubeconfig context far-away of {}): ",
                kubeconfig.display()
            );
            assert!(err.starts_with(&prefix), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.to_lowercase().contains("refused"), "{args:?}: {err}");
        }
    })
    .await;
}

#[tokio::test]
async fn status_lists_the_pods_the_group_waits_for_first() {
    bounded(async {
        let server = TestApiServer::start().await;
        // Without --protocol the CRD decides: its epoch fields mean the epoch dialect.
        server
            .create("customresourcedefinitions", fixtures::jobset_crd(true))
            .expect("crd");
        server
            .create(
                "jobsets",
                JobSet::new("train")
                    .namespace("team")
                    .pods(3)
                    .container("c", "i")
                    .status(json!({"deprecatedEpoch": 1, "syncedEpoch": 2}))
                    .build(),
            )
            .expect("jobset");
        server
            .create(
                "pods",
                Pod::new("p-a")
                    .namespace("team")
                    .label(JOBSET_NAME_LABEL, "train")
                    .epoch(EPOCH, "3")
                    .node("node-p-a")
                    .container("worker", "w")
                    .agent_sidecar("a")
                    .reported(false, 1)
                    .build(),
            )
            .expect("pod");
        server
            .create(
                "pods",
                Pod::new("p-b")
                    .namespace("team")
                    .label(JOBSET_NAME_LABEL, "train")
                    .epoch(EPOCH, "2")
                    .node("node-p-b")
                    .container("worker", "w")
                    .agent_sidecar("a")
                    .reported(true, 1)
                    .build(),
            )
            .expect("pod");
        server
            .create(
                "pods",
                Pod::new("p-c")
                    .namespace("team")
                    .label(JOBSET_NAME_LABEL, "train")
                    .epoch(EPOCH, "3")
                    .node("node-p-c")
                    .container("worker", "w")
                    .agent_sidecar("a")
                    .reported(false, 1)
                    .build(),
            )
            .expect("pod");
        // Another JobSet's pod is not listed.
        server
            .create(
                "pods",
                Pod::new("other")
                    .namespace("team")
                    .label(JOBSET_NAME_LABEL, "else")
                    .epoch(EPOCH, "9")
                    .node("node-other")
                    .container("worker", "w")
                    .agent_sidecar("a")
                    .reported(true, 1)
                    .build(),
            )
            .expect("pod");

        let out = run(&server, &["status", "-n", "team", "train"]).await;
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("deprecatedEpoch=1 syncedEpoch=2, 3 pods expected"),
            "{text}"
        );
        assert!(
            lines[1].contains("group restart to epoch 3: waiting for 3 pod(s)"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("group-restart deadline: the reconciler's"),
            "{text}"
        );
        assert!(lines[3].starts_with("POD"), "{text}");
        assert!(
            lines[4].starts_with("p-a") && lines[4].contains("not yet synced"),
            "{text}"
        );
        assert!(
            lines[5].starts_with("p-b") && lines[5].contains("must restart"),
            "{text}"
        );
        assert!(!text.contains("other"), "{text}");

        let out = run(&server, &["status", "-n", "team", "train", "-o", "json"]).await;
        let report: Value = serde_json::from_slice(&out.stdout).expect("json");
        // Issue 47: `-o yaml` prints the same.
        let out = run(&server, &["status", "-n", "team", "train", "-o", "yaml"]).await;
        assert_eq!(as_yaml(&out), report);
        assert_eq!(report["state"]["state"], "Restarting");
        assert_eq!(report["pods"].as_array().map(Vec::len), Some(3));
        assert_eq!(report["pods"][1]["barrierLifted"], true);

        // The group syncs: every pod at 3, barriers lifted.
        server
            .create(
                "jobsets",
                JobSet::new("done")
                    .namespace("team")
                    .pods(3)
                    .container("c", "i")
                    .status(json!({"deprecatedEpoch": 2, "syncedEpoch": 3}))
                    .build(),
            )
            .expect("jobset");
        for name in ["d-0", "d-1", "d-2"] {
            server
                .create(
                    "pods",
                    Pod::new(name)
                        .namespace("team")
                        .label(JOBSET_NAME_LABEL, "done")
                        .epoch(EPOCH, "3")
                        .node(&format!("node-{name}"))
                        .container("worker", "w")
                        .agent_sidecar("a")
                        .reported(true, 1)
                        .build(),
                )
                .expect("pod");
        }
        let out = run(&server, &["status", "-n", "team", "done"]).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("synced: every pod runs at epoch 3"), "{text}");

        // Without a name: the namespace's InPlaceRestart JobSets, one line each; -A: every
        // namespace's; JSON the same rows.
        let elsewhere = JobSet::new("other-team")
            .namespace("lab")
            .pods(3)
            .container("c", "i")
            .status(json!({"deprecatedEpoch": 0, "syncedEpoch": 1}))
            .build();
        server.create("jobsets", elsewhere).expect("jobset");
        let out = run(&server, &["status", "-n", "team"]).await;
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("NAMESPACE") && lines[0].contains("SYNCEDEPOCH"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("team")
                && lines[1].contains("done")
                && lines[1].contains("synced at 3"),
            "{text}"
        );
        assert!(
            lines[2].contains("train") && lines[2].contains("restarting to 3: waiting for 3"),
            "{text}"
        );
        let out = run(&server, &["status", "-A", "-o", "json"]).await;
        let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
        let out = run(&server, &["status", "-A", "-o", "yaml"]).await;
        assert_eq!(as_yaml(&out), rows);
        let names: Vec<&str> = rows
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(names, ["other-team", "done", "train"], "{rows}");
        assert_eq!(rows[0]["state"]["state"], "Restarting", "{rows}");

        // A JobSet that does not exist: a one-line error saying so plainly, exit 1.
        let out = run(&server, &["status", "-n", "team", "missing"]).await;
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err,
            "jobset-inplace: no JobSet missing in namespace team (`status -n team` lists its \
             InPlaceRestart JobSets, `status -A` every namespace's)\n"
        );
        server.shutdown().await;
    })
    .await;
}

fn rfc3339(at: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .expect("representable")
        .to_string()
}

/// An installation as `webhook --self-signed` leaves it: a healthy one passes every check; each
/// fault is named on its own line with exit code 1.
#[tokio::test]
async fn doctor_checks_an_installation() {
    bounded(async {
        let server = TestApiServer::start().await;
        let sys = "jobset-inplace-system";
        let ca = certs::generate_ca(Duration::from_secs(3650 * 86_400)).expect("ca");
        let names = certs::service_names("jobset-inplace-webhook", sys);
        let serving =
            certs::issue_serving(&ca, &names, Duration::from_secs(365 * 86_400)).expect("serving");
        let b64 = |s: &str| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(s)
        };
        let hook = |kind: &str, name: &str| {
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": "jobset-inplace"},
                "webhooks": [{"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "clientConfig": {"caBundle": b64(&ca.cert),
                        "service": {"name": "jobset-inplace-webhook", "namespace": sys,
                                    "path": "/mutate", "port": 443}}}]
            })
        };
        server
            .create(
                "mutatingwebhookconfigurations",
                hook("MutatingWebhookConfiguration", "mutate.jobset-inplace.dev"),
            )
            .expect("mutating");
        server
            .create(
                "validatingwebhookconfigurations",
                hook("ValidatingWebhookConfiguration", "validate.jobset-inplace.dev"),
            )
            .expect("validating");
        server
            .create(
                "secrets",
                json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                       "metadata": {"name": "jobset-inplace-webhook-tls", "namespace": sys},
                       "data": {"tls.crt": b64(&serving.cert), "tls.key": b64(&serving.key),
                                "ca.crt": b64(&ca.cert)}}),
            )
            .expect("secret");
        server
            .create("customresourcedefinitions", fixtures::jobset_crd(false))
            .expect("crd");
        let lease = |renewed: SystemTime| {
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": "jobset-inplace-reconciler", "namespace": sys},
                   "spec": {"holderIdentity": "reconciler-0", "leaseDurationSeconds": 15,
                            "renewTime": rfc3339(renewed)}})
        };
        server.create("leases", lease(SystemTime::now())).expect("lease");
        server
            .create(
                "serviceaccounts",
                json!({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "jobset-inplace-agent", "namespace": "team"}}),
            )
            .expect("sa");
        server
            .create(
                "rolebindings",
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "jobset-inplace-agent", "namespace": "team"},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                   "name": "jobset-inplace-agent"},
                       "subjects": [{"kind": "ServiceAccount", "name": "jobset-inplace-agent",
                                     "namespace": "team"}]}),
            )
            .expect("rb");

        // The released CRD has the attempt dialect's fields only.
        // (--read-only: the test API server has no admission chain for the dry runs.)
        let out = run(&server, &["--protocol", "attempt", "doctor", "-n", "team", "--read-only"]).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
        for check in [
            "webhook-configurations",
            "ca-bundle",
            "serving-certificate",
            "ca-certificate",
            "jobset-crd",
            "reconciler-leader",
            "agent-account",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with("ok") && l.contains(&format!("{check}:"))),
                "{check}: {text}"
            );
        }
        assert!(text.contains("has 364 day(s) left") || text.contains("has 365 day(s) left"), "{text}");
        // Without the JobSetEpoch CRD it works, at a cost it names: a warning, not a failure.
        assert!(
            text.lines().any(|l| l.starts_with("warn jobsetepoch-crd") && l.contains("whole JobSet")),
            "{text}"
        );

        // Without --protocol, the CRD names the dialect (`auto`).
        let out = run(&server, &["doctor", "--read-only"]).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines().any(|l| l.starts_with("ok   jobset-crd: the attempt protocol (what --protocol auto picks)")),
            "{text}"
        );

        // Faults: the epoch dialect's fields are missing, the lease is stale, no account in
        // another namespace; JSON says the same.
        server
            .put("leases", lease(SystemTime::now() - Duration::from_secs(120)))
            .expect("stale lease");
        let out = run(&server, &["--protocol", "epoch", "doctor", "-n", "elsewhere", "-o", "json", "--read-only"]).await;
        assert_eq!(out.status.code(), Some(1));
        let report: Value = serde_json::from_slice(&out.stdout).expect("json");
        let out = run(&server, &["--protocol", "epoch", "doctor", "-n", "elsewhere", "-o", "yaml", "--read-only"]).await;
        assert_eq!(out.status.code(), Some(1));
        // The same, but for the clock between the two runs (`renewed 120s ago`).
        assert_eq!(without_digits(as_yaml(&out)), without_digits(report.clone()));
        assert_eq!(report["ok"], false);
        let verdict = |check: &str| {
            report["checks"]
                .as_array()
                .and_then(|c| c.iter().find(|f| f["check"] == check))
                .map(|f| f["verdict"].clone())
        };
        assert_eq!(verdict("ca-bundle"), Some(json!("ok")));
        assert_eq!(verdict("jobset-crd"), Some(json!("fail")));
        assert_eq!(verdict("reconciler-leader"), Some(json!("fail")));
        assert_eq!(verdict("agent-account"), Some(json!("fail")));

        // A caBundle from another CA no longer verifies what the webhook serves.
        let other = certs::generate_ca(Duration::from_secs(86_400)).expect("ca");
        let mut m = server
            .get("mutatingwebhookconfigurations", "", "jobset-inplace")
            .expect("mutating");
        m["webhooks"][0]["clientConfig"]["caBundle"] = json!(b64(&other.cert));
        server.put("mutatingwebhookconfigurations", m).expect("put");
        let out = run(&server, &["--protocol", "attempt", "doctor", "--read-only"]).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("FAIL ca-bundle") && l.contains("mutating/mutate.jobset-inplace.dev")),
            "{text}"
        );
        server.shutdown().await;
    })
    .await;
}
