//! Bounded work per request over TLS (docs/security.md): the webhook binary, as deployed (its own
//! process), answers four hostile 3 MiB reviews at once, again and again, with answers of at most
//! 1 MiB each, and its peak resident set (`VmHWM`) stays under 200 MiB (before: four 1.9 MB
//! requests took it to 271 MiB, over the deployed 256Mi limit). `tests/admission_bounds.rs`
//! holds one review to 64 MiB and 1 s offline.

use std::time::Duration;

use jobset_inplace::certs;
use jobset_inplace_testkit::fixtures;
use jobset_inplace_testkit::webhook_harness::{self, Conn, Replica};
use serde_json::{Value, json};

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
                    let mut conn = Conn::connect(addr, &connector).await.expect("connect");
                    let response = conn.post_json(path, &body).await.expect("answered");
                    (name, path, body.len(), response)
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
