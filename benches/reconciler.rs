//! `cargo bench --bench reconciler`: the real `jobset-inplace reconciler` binary (a child
//! process, pointed at the in-repo test API server on loopback through a kubeconfig) keeps one
//! JobSet of `JOBSET_INPLACE_BENCH_PODS` pods (default 10,000) in sync through
//! `JOBSET_INPLACE_BENCH_ROUNDS` group restarts (default 3).
//!
//! Per round: the first pod moves to a new epoch → time until the deprecated field is visible;
//! every other pod follows → time from the last pod's write until the synced field is visible.
//! Baseline, measured in the same run: the time for a plain `kube` watch on pods to see one pod
//! write (what any watcher pays before it can react). Also: status writes and LISTs per group
//! restart (from the server's request counters), the reconciler's peak RSS (VmHWM), its CPU
//! time per group restart, and the in-memory evaluation of the pods (`reconcile_decide`, timed
//! in this process, beside a baseline of one pass over the same pods).

use std::time::{Duration, Instant};

use futures::StreamExt;
use jobset_inplace::protocol::{Dialect, EpochStatus, PodView, ReconcileInput, reconcile_decide};
use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
use jobset_inplace_testkit::build;
use jobset_inplace_testkit::process::{ReconcilerProcess, cpu_ticks, proc_status_kib};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::json;

const NS: &str = "bench";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    start.elapsed()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pods: usize = env_or("JOBSET_INPLACE_BENCH_PODS", 10_000);
    let rounds: usize = env_or("JOBSET_INPLACE_BENCH_ROUNDS", 3).max(1);
    let dialect = Dialect::Epoch;
    let per_job = 100.min(pods);
    let replicas = pods / per_job;
    let pods = replicas * per_job;
    println!(
        "reconciler benchmark: one JobSet of {pods} pods ({replicas} Jobs x {per_job}), {rounds} group restarts"
    );

    // In-memory evaluation, against one pass over the same pods.
    let views: Vec<PodView> = (0..pods)
        .map(|i| PodView {
            name: format!("js-{i}"),
            epoch_annotation: Some(if i == 0 { "3" } else { "2" }.to_owned()),
            ..PodView::default()
        })
        .collect();
    let input = ReconcileInput {
        dialect,
        expected_pods: pods as i64,
        max_restarts: 1000,
        status: EpochStatus {
            deprecated: Some(1),
            synced: Some(2),
        },
        restarts: 0,
        restarts_count_towards_max: 0,
        last_synced: None,
        last_deprecated: None,
        pods: &views,
    };
    let reps = 200;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(
            views
                .iter()
                .filter(|p| std::hint::black_box(p.epoch_annotation.is_some()))
                .count(),
        );
    }
    let pass = t.elapsed() / reps;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(reconcile_decide(std::hint::black_box(&input)));
    }
    let eval = t.elapsed() / reps;
    println!(
        "in-memory evaluation of {pods} pods: {:.3} ms (one pass over them: {:.3} ms; {:.1}x)",
        ms(eval),
        ms(pass),
        eval.as_secs_f64() / pass.as_secs_f64().max(1e-9)
    );

    // The API server, one JobSet, its pods registered at the first epoch.
    let server = TestApiServer::start().await;
    server
        .create(
            "jobsets",
            build::JobSet::new("js")
                .namespace(NS)
                .max_restarts(1000)
                .replicas(replicas as i64)
                .pods(per_job as i64)
                .build(),
        )
        .expect("jobset");
    let pod = |i: usize, epoch: i64| {
        build::Pod::worker(NS, "js", &format!("js-{i}"))
            .label(
                "batch.kubernetes.io/job-completion-index",
                &(i % per_job).to_string(),
            )
            .epoch(dialect.pod_annotation(), &epoch.to_string())
            .node(&format!("node-{i}"))
            .container("w", "trainer:1")
            .status(json!({"phase": "Running",
                           "containerStatuses": [{"name": "w", "restartCount": 0, "ready": true}]}))
            .build()
    };
    // As the Job controller creates them: controlled by a Job of the JobSet (the reconciler
    // counts no other pod).
    server
        .seed(
            "pods",
            (0..pods).map(|i| jobset_inplace_testkit::reconciler::member_of(&server, pod(i, 1))),
        )
        .expect("pods");

    // The reconciler, as deployed: the real binary, a kubeconfig, its own process.
    let reconciler = ReconcilerProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_jobset-inplace")),
        &server,
        dialect,
        &[],
    )
    .expect("starts the reconciler");
    let pid = reconciler.pid();
    let health_addr = reconciler.health;
    let status = |field: &str| {
        server
            .get("jobsets", NS, "js")
            .and_then(|js| js["status"][field].as_i64())
    };
    let limit = Duration::from_secs(120);
    let started = Instant::now();
    wait_for("the first sync", limit, || {
        status(dialect.synced_field()) == Some(1)
    })
    .await;
    println!(
        "initial sync of {pods} pods (start, LIST, evaluate, write): {:.0} ms",
        ms(started.elapsed())
    );

    // Baseline: how long a plain kube watch on pods takes to see one pod write.
    let client = server.client();
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let watch_task = tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default().labels("probe=yes"));
        futures::pin_mut!(stream);
        while let Some(Ok(ev)) = stream.next().await {
            if let watcher::Event::Apply(p) = ev {
                let _ = seen_tx.send(p.metadata.resource_version);
            }
        }
    });
    server
        .create("pods", json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": NS, "labels": {"probe": "yes"}}}))
        .expect("probe");
    tokio::time::sleep(Duration::from_millis(300)).await;
    while seen_rx.try_recv().is_ok() {}
    let mut baseline = Vec::new();
    for i in 0..20 {
        let t = Instant::now();
        server
            .patch(
                "pods",
                NS,
                "probe",
                &json!({"metadata": {"annotations": {"n": i.to_string()}}}),
            )
            .expect("probe");
        let _ = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv()).await;
        baseline.push(ms(t.elapsed()));
    }
    watch_task.abort();
    let baseline = median(baseline);
    println!("baseline: a kube watch sees a pod write after {baseline:.2} ms (median of 20)");

    let before_rss = proc_status_kib(pid, "VmHWM").unwrap_or(0);
    let mut deprecate = Vec::new();
    let mut sync = Vec::new();
    let mut cpu = Vec::new();
    let mut writes = Vec::new();
    let mut lists = Vec::new();
    for round in 0..rounds {
        let epoch = 2 + round as i64;
        let counters = server.counters();
        let ticks = cpu_ticks(pid).unwrap_or(0);
        let annotate = |i: usize| {
            server
                .patch("pods", NS, &format!("js-{i}"), &json!({"metadata": {"annotations": {dialect.pod_annotation(): epoch.to_string()}}}))
                .expect("pod");
        };
        let t = Instant::now();
        annotate(0);
        wait_for("deprecated", limit, || {
            status(dialect.deprecated_field()) == Some(epoch - 1)
        })
        .await;
        deprecate.push(ms(t.elapsed()));
        for i in 1..pods {
            annotate(i);
        }
        let t = Instant::now();
        wait_for("synced", limit, || {
            status(dialect.synced_field()) == Some(epoch)
        })
        .await;
        sync.push(ms(t.elapsed()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let used = server.counters().since(&counters);
        writes.push(used.get(Verb::Patch, "jobsets/status"));
        lists.push(used.verb(Verb::List));
        cpu.push((cpu_ticks(pid).unwrap_or(0).saturating_sub(ticks)) as f64 * 10.0);
    }
    let rss = proc_status_kib(pid, "VmHWM").unwrap_or(0);
    let metrics = reqwest::get(format!("http://{health_addr}/metrics"))
        .await
        .ok();
    let metrics = match metrics {
        Some(r) => r.text().await.unwrap_or_default(),
        None => String::new(),
    };
    let metric = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let reconciles = metric("jobset_inplace_reconciler_reconciles_total").unwrap_or(0.0);
    let eval_sum =
        metric("jobset_inplace_reconciler_reconcile_duration_seconds_sum").unwrap_or(0.0);

    println!();
    println!(
        "| figure ({pods} pods, median of {rounds} group restarts) | value | vs baseline ({baseline:.2} ms watch delivery) | target |"
    );
    println!("|---|---|---|---|");
    let d = median(deprecate);
    let s = median(sync);
    println!(
        "| first pod's new epoch → deprecated visible | {d:.1} ms | {:.1}x | < 200 ms |",
        d / baseline
    );
    println!(
        "| last pod's write → synced visible | {s:.1} ms | {:.1}x | < 200 ms |",
        s / baseline
    );
    println!(
        "| in-memory evaluation of {pods} pods | {:.2} ms | {:.1}x one pass | < 10 ms |",
        ms(eval),
        eval.as_secs_f64() / pass.as_secs_f64().max(1e-9)
    );
    println!(
        "| evaluations in the child (all rounds) | {reconciles:.0}, mean {:.2} ms | | |",
        if reconciles > 0.0 {
            eval_sum / reconciles * 1000.0
        } else {
            0.0
        }
    );
    println!(
        "| status writes per group restart | {:?} | | <= 2 |",
        writes
    );
    println!(
        "| LISTs per group restart (after the initial sync) | {:?} | | 0 |",
        lists
    );
    println!(
        "| reconciler CPU per group restart | {:.0} ms | | |",
        median(cpu)
    );
    println!(
        "| reconciler peak RSS | {:.1} MiB (after initial sync {:.1} MiB) | | |",
        rss as f64 / 1024.0,
        before_rss as f64 / 1024.0
    );
    drop(reconciler);
    server.shutdown().await;
}
