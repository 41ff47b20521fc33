//! The group-restart deadline ("never stuck", docs/protocol.md "Deadline"), end to end: the real
//! reconciler against the test API server, with the simulated kubelet and Job/JobSet controllers
//! (a kubelet that dies, agents cut from the API) or with pods and Jobs written by the test. Each
//! test runs with a timeout of a second or a few, is bounded as a whole, and stops what it
//! started.
//!
//! - a dead kubelet's pod is marked Failed and deleted after the first window and replaced; the
//!   group restart completes without a recreation;
//! - a pod that never registers (nor does its replacement) makes the JobSet fall back to
//!   recreating its pods after the second window: `status.restarts` up by one, its Jobs deleted
//!   and created again by JobSet's (simulated) controller, the group restart completes;
//! - a fallback at `maxRestarts` fails the JobSet instead;
//! - what the reconciler writes for a recreation (a `resourceVersion`-guarded count, foreground
//!   deletes of exactly the JobSet's Jobs of earlier restarts), with JobSet's controller writing
//!   the epochs (`--write-epoch-status=false`) and the annotation's timeout;
//! - a malformed annotation is a Warning and the default;
//! - a standby that takes over keeps the clock;
//! - on a kubelet without `RestartAllContainersOnContainerExits`, the pods whose agents restarted
//!   without their workers are failed and replaced long before any deadline, and no synced epoch
//!   is written while their old workers run.
//!
//! Events and metrics are checked for every step.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobset_inplace::deadline::{RESTART_ATTEMPT_LABEL, TIMEOUT_ANNOTATION};
use jobset_inplace::protocol::Dialect;
use jobset_inplace::reconciler::{self, LeaderElection, Options};
use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
use jobset_inplace_testkit::build::{Job, JobSet, Pod};
use jobset_inplace_testkit::kubelet::{SimConfig, Simulation, Snapshot, http_get};
use jobset_inplace_testkit::reconciler::member_of;
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// One whole test.
const TEST: Duration = Duration::from_secs(90);
/// One wait for something that needs no deadline.
const WAIT: Duration = Duration::from_secs(30);
/// Slack for a loaded 2-core machine on top of a window.
const SLACK: Duration = Duration::from_secs(4);

async fn bounded<F: Future<Output = ()>>(test: F) {
    if tokio::time::timeout(TEST, test).await.is_err() {
        panic!("the test did not finish within {TEST:?}");
    }
}

fn options(dialect: Dialect, timeout: Option<Duration>, identity: &str) -> Options {
    let mut options = jobset_inplace_testkit::reconciler::options(dialect, identity);
    options.settings.group_restart_timeout = timeout;
    options
}

/// A reconciler in this process with its health port, stopped when dropped.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), reconciler::Error>>,
    health: SocketAddr,
}

impl Running {
    async fn start(client: kube::Client, options: Options) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let health = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(reconciler::run(client, options, Some(listener), async {
            let _ = stopped.await;
        }));
        Running {
            stop: Some(stop),
            task,
            health,
        }
    }

    async fn metrics(&self) -> String {
        match http_get(self.health, "/metrics", Duration::from_secs(5)).await {
            Some((200, body)) => body,
            other => panic!("/metrics: {other:?}"),
        }
    }

    /// The value of one sample of /metrics (0 when absent).
    async fn sample(&self, name: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// One sample of /metrics once it has reached `want` (the reconciler counts a deadline step
    /// after the step's API calls and its event, so after the pods are seen gone): `want` within
    /// [`WAIT`], or the last value seen.
    async fn sample_reaching(&self, name: &str, want: f64) -> f64 {
        let until = Instant::now() + WAIT;
        loop {
            let got = self.sample(name).await;
            if got >= want || Instant::now() > until {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(WAIT, &mut self.task).await {
            Ok(Ok(result)) => result.expect("a clean stop"),
            Ok(Err(e)) => panic!("the reconciler panicked: {e}"),
            Err(_) => panic!("the reconciler did not stop"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn step(name: &str) -> String {
    format!("jobset_inplace_reconciler_group_restart_deadline_steps_total{{step=\"{name}\"}}")
}

const PODS_DELETED: &str = "jobset_inplace_reconciler_deadline_pods_deleted_total";
const JOBS_DELETED: &str = "jobset_inplace_reconciler_deadline_jobs_deleted_total";

/// The events of a namespace with this reason.
fn events(server: &TestApiServer, ns: &str, reason: &str) -> Vec<Value> {
    server
        .list("events.events.k8s.io", Some(ns))
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// The note of the first event with this reason, waiting for it (events are published apart
/// from the step that records them).
async fn note(server: &TestApiServer, ns: &str, reason: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(note) = events(server, ns, reason)
            .first()
            .and_then(|e| e["note"].as_str())
        {
            return note.to_owned();
        }
        assert!(Instant::now() < deadline, "no {reason} event");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Deletes of `resource` sent by the reconciler's client.
fn deletes_by_reconciler(server: &TestApiServer, resource: &str) -> Vec<String> {
    server
        .writes()
        .into_iter()
        .filter(|w| {
            w.client.as_deref() == Some("reconciler")
                && w.verb == Verb::Delete
                && w.resource == resource
        })
        .filter_map(|w| w.name)
        .collect()
}

async fn sim_until(
    sim: &Simulation,
    what: &str,
    limit: Duration,
    done: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    sim.wait_for(what, limit, done)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn sim_config(pods: i64, max_restarts: i32, timeout: Duration) -> SimConfig {
    let mut c = SimConfig::new(Dialect::Epoch, pods);
    c.max_restarts = max_restarts;
    c.run_reconciler = false;
    c.group_restart_timeout = Some(timeout);
    // The assertions read the epoch fields at given moments: without JobSet's controller's
    // status writes, which drop them in the epoch dialect until the reconciler writes them again
    // (`wipes_of_the_epoch_fields_do_not_postpone_the_deadline` has them).
    c.status_writers = false;
    c
}

/// A simulation with its own reconciler (for its health port), all workers running at epoch 1.
async fn start_sim(config: SimConfig) -> (Simulation, Running) {
    let timeout = config.group_restart_timeout;
    let sim = Simulation::start(config).await.expect("starts");
    let mut opts = options(Dialect::Epoch, timeout, "r1");
    opts.settings.namespace = Some(sim.config().namespace.clone());
    let r = Running::start(sim.server().client_named("reconciler"), opts).await;
    let s = sim
        .wait_all_running(WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.synced, Some(1));
    (sim, r)
}

fn assert_clean(sim: &Simulation, s: &Snapshot) {
    assert!(
        sim.violations().is_empty(),
        "invariant violated: {:?}\n{s}",
        sim.violations()
    );
}
mod node_lost;
mod reasons;
mod simulation;
mod tenants;
mod written;

// ---------------------------------------------------------------------------------------------
// Shared by the areas
// ---------------------------------------------------------------------------------------------

const NS: &str = "team-a";

/// Stores `jobset` (of namespace `ns`) and, for each of `pods`, a running member pod of it.
fn store_with_running_pods(server: &TestApiServer, ns: &str, jobset: Value, pods: &[&str]) {
    let name = jobset["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    server.create("jobsets", jobset).expect("jobset");
    for pod in pods {
        server
            .create(
                "pods",
                member_of(server, Pod::worker(ns, &name, pod).running().build()),
            )
            .expect("pod");
    }
}

fn set_epoch(server: &TestApiServer, dialect: Dialect, pod: &str, epoch: i64) {
    server
        .patch(
            "pods",
            NS,
            pod,
            &json!({"metadata": {"annotations": {dialect.pod_annotation(): epoch.to_string()}}}),
        )
        .expect("pod annotation");
}

async fn until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn set_epoch_in(server: &TestApiServer, ns: &str, pod: &str, epoch: i64) {
    let annotation = Dialect::Epoch.pod_annotation();
    server
        .patch(
            "pods",
            ns,
            pod,
            &json!({"metadata": {"annotations": {annotation: epoch.to_string()}}}),
        )
        .expect("pod annotation");
}

fn status_field(server: &TestApiServer, ns: &str, name: &str, field: &str) -> Option<i64> {
    server
        .get("jobsets", ns, name)
        .and_then(|j| j["status"][field].as_i64())
}

fn reason(label: &str) -> String {
    format!("jobset_inplace_reconciler_reconcile_reasons_total{{reason=\"{label}\"}}")
}
