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
use jobset_inplace::protocol::{Dialect, JOBSET_NAME_LABEL};
use jobset_inplace::reconciler::{self, LeaderElection, Options};
use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
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

/// (a) The kubelet of one node dies: its pod stays `Running` at epoch 1, its agent never sees
/// the deprecation. The other pods restart in place and wait; one window after the deprecation
/// the dead pod is deleted, its Job replaces it, and the group restart completes at epoch 2, in
/// place for every other pod, without a recreation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_kubelet_s_pod_is_replaced_within_the_first_window() {
    bounded(async {
        let timeout = Duration::from_secs(2);
        let (sim, r) = start_sim(sim_config(3, 10, timeout)).await;
        let before = sim.snapshot();
        let jobs = sim.jobs();
        assert!(sim.kill_kubelet(1));
        let started = Instant::now();
        assert!(sim.fail_worker(0, 1));
        sim_until(&sim, "the deprecation", WAIT, |s| s.deprecated == Some(1)).await;
        // Within the first window the dead pod is still there: nothing happens early.
        tokio::time::sleep(timeout / 2).await;
        let s = sim.snapshot();
        assert_eq!(s.slots[1].state.pod, before.slots[1].state.pod, "{s}");
        assert_eq!(s.synced, Some(1), "{s}");
        let s = sim_until(&sim, "every worker at epoch 2", timeout * 2 + SLACK, |s| {
            s.all_running_after(Some(1))
        })
        .await;
        let took = started.elapsed();
        assert!(
            took >= timeout,
            "completed after {took:?}, before the timeout\n{s}"
        );
        assert_clean(&sim, &s);
        // The dead pod was replaced; the others restarted in place (same UIDs); no recreation.
        assert_ne!(s.slots[1].state.uid, before.slots[1].state.uid);
        assert_eq!(s.slots[1].state.replacements, 1);
        for i in [0, 2] {
            assert_eq!(s.slots[i].state.uid, before.slots[i].state.uid, "{s}");
        }
        assert_eq!((s.restarts, s.restarts_count_towards_max), (0, 0));
        assert_eq!(sim.jobs(), jobs, "the Jobs are the same");
        assert_eq!(
            deletes_by_reconciler(sim.server(), "pods"),
            [before.slots[1].state.pod.clone()]
        );
        assert!(deletes_by_reconciler(sim.server(), "jobs").is_empty());
        // Visible: events and metrics.
        let ns = sim.config().namespace.clone();
        let timed_out = note(sim.server(), &ns, "GroupRestartTimedOut").await;
        assert!(
            timed_out.contains("epoch 2") && timed_out.contains(&before.slots[1].state.pod),
            "{timed_out}"
        );
        let deleted = note(sim.server(), &ns, "UnregisteredPodsDeleted").await;
        assert!(deleted.contains(&before.slots[1].state.pod), "{deleted}");
        assert!(events(sim.server(), &ns, "FallingBackToRecreate").is_empty());
        for e in events(sim.server(), &ns, "GroupRestartTimedOut") {
            assert_eq!(e["type"], "Warning");
        }
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        assert_eq!(r.sample(&step("recreated")).await, 0.0);
        assert_eq!(r.sample(&step("failed")).await, 0.0);
        assert_eq!(r.sample(PODS_DELETED).await, 1.0);
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}

/// (b) One pod's agent cannot reach the API after its in-place restart, nor can its
/// replacement's: one window after the deprecation it is deleted, its replacement never
/// registers either, and one window later the JobSet falls back to recreating its pods as
/// JobSet's `Recreate` does. Its Jobs are deleted and created again at restart-attempt 1, the
/// pods of the new Jobs register, and the group restart completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_registers_falls_back_to_recreation() {
    bounded(async {
        let timeout = Duration::from_secs(2);
        let (sim, r) = start_sim(sim_config(3, 10, timeout)).await;
        let before = sim.snapshot();
        let jobs = sim.jobs();
        assert_eq!(jobs.len(), 3);
        assert!(jobs.iter().all(|(_, _, attempt)| attempt == "0"));
        sim.cut_agent_api(1, 2);
        let started = Instant::now();
        assert!(sim.fail_worker(0, 1));
        sim_until(&sim, "the deprecation", WAIT, |s| s.deprecated == Some(1)).await;
        let s = sim_until(
            &sim,
            "the unregistered pod replaced",
            timeout + SLACK,
            |s| s.slots[1].state.replacements == 1,
        )
        .await;
        assert_eq!(s.restarts, 0, "no recreation within the second window\n{s}");
        let s = sim_until(&sim, "a recreation", timeout + SLACK, |s| s.restarts == 1).await;
        let took = started.elapsed();
        assert!(
            took >= timeout * 2,
            "recreated after {took:?}, before two windows\n{s}"
        );
        assert_eq!(s.restarts_count_towards_max, 1);
        let s = sim_until(
            &sim,
            "every worker at epoch 2 after the recreation",
            WAIT,
            |s| s.all_running_after(Some(1)),
        )
        .await;
        assert_clean(&sim, &s);
        // Every pod is new, and every Job: same names, new UIDs, restart-attempt 1.
        for (i, slot) in s.slots.iter().enumerate() {
            assert_ne!(slot.state.uid, before.slots[i].state.uid, "{s}");
        }
        let now = sim.jobs();
        assert_eq!(now.len(), 3);
        for ((name, uid, attempt), (old_name, old_uid, _)) in now.iter().zip(&jobs) {
            assert_eq!(name, old_name);
            assert_ne!(uid, old_uid);
            assert_eq!(attempt, "1");
        }
        assert_eq!(deletes_by_reconciler(sim.server(), "pods").len(), 1);
        // Visible: the fallback's event and metrics (the Jobs may have gone by the reconciler's
        // deletes or by JobSet's controller's, whichever came first).
        let ns = sim.config().namespace.clone();
        let fallback = note(sim.server(), &ns, "FallingBackToRecreate").await;
        assert!(
            fallback.contains("status.restarts 1") && fallback.contains("1 of maxRestarts 10"),
            "{fallback}"
        );
        assert_eq!(
            events(sim.server(), &ns, "FallingBackToRecreate")[0]["type"],
            "Warning"
        );
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        assert_eq!(r.sample_reaching(&step("recreated"), 1.0).await, 1.0);
        assert_eq!(r.sample(&step("failed")).await, 0.0);
        assert!(r.sample(JOBS_DELETED).await <= 3.0);
        assert!(r.metrics().await.contains(
            "jobset_inplace_reconciler_status_writes_total{field=\"restarts\",result=\"ok\"} 1"
        ));
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}

/// (d) maxRestarts 1 and a pod that never registers, however often it is replaced: the first
/// fallback recreates (1 restart counted), the second would pass maxRestarts and fails the JobSet
/// as the epoch algorithm does (`ReachedMaxRestarts`); nothing more is recreated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_at_max_restarts_fails_the_jobset() {
    bounded(async {
        let timeout = Duration::from_millis(1500);
        let (sim, r) = start_sim(sim_config(2, 1, timeout)).await;
        sim.cut_agent_api(1, 1_000);
        assert!(sim.fail_worker(0, 1));
        let s = sim_until(&sim, "a first recreation", timeout * 2 + SLACK * 2, |s| {
            s.restarts == 1
        })
        .await;
        assert_eq!(s.failed, None, "{s}");
        let s = sim_until(&sim, "the JobSet failed", timeout * 4 + SLACK * 2, |s| {
            s.failed.is_some()
        })
        .await;
        assert_eq!(s.failed.as_deref(), Some("ReachedMaxRestarts"), "{s}");
        assert_eq!((s.restarts, s.restarts_count_towards_max), (1, 1), "{s}");
        assert_clean(&sim, &s);
        let ns = sim.config().namespace.clone();
        let failed = note(sim.server(), &ns, "MaxRestartsExceeded").await;
        assert!(
            failed.contains("would pass maxRestarts 1") && failed.contains("1 restarts counted"),
            "{failed}"
        );
        let js = sim.server().get("jobsets", &ns, "js").expect("the JobSet");
        assert_eq!(js["status"]["terminalState"], "Failed");
        assert_eq!(r.sample_reaching(&step("recreated"), 1.0).await, 1.0);
        assert_eq!(r.sample_reaching(&step("failed"), 1.0).await, 1.0);
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 2.0)
                .await,
            2.0
        );
        assert_eq!(
            r.sample("jobset_inplace_reconciler_failed_jobsets_total")
                .await,
            1.0
        );
        // A failed JobSet is left alone.
        let writes = sim.server().counters().get(Verb::Patch, "jobsets/status");
        tokio::time::sleep(timeout * 2).await;
        assert_eq!(
            sim.server().counters().get(Verb::Patch, "jobsets/status"),
            writes
        );
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Pods and Jobs written by the test
// ---------------------------------------------------------------------------------------------

const NS: &str = "team-a";

fn jobset(annotation: Option<&str>, max_restarts: i64) -> Value {
    let mut js = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js", "namespace": NS, "annotations": {}},
        "spec": {"failurePolicy": {"restartStrategy": "InPlaceRestart", "maxRestarts": max_restarts},
                 "replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {
                     "parallelism": 1, "completions": 1,
                     "template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}}}]},
        "status": {}
    });
    if let Some(a) = annotation {
        js["metadata"]["annotations"][TIMEOUT_ANNOTATION] = json!(a);
    }
    js
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {JOBSET_NAME_LABEL: "js"}, "annotations": {JOBSET_NAME_LABEL: "js"}},
        "spec": {"containers": [{"name": "w", "image": "w"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "w", "restartCount": 0}]}
    })
}

/// `pod` with the `job-name` label and the controller reference of the Job `job`, as the Job
/// controller creates it.
fn of_job(server: &TestApiServer, mut pod: Value, job: &str) -> Value {
    pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = json!(job);
    member_of(server, pod)
}

fn job(name: &str, owner: &str, attempt: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {JOBSET_NAME_LABEL: "js", RESTART_ATTEMPT_LABEL: attempt},
                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                          "name": "js", "uid": owner, "controller": true}]},
        "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}
    })
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

/// (c) and observe mode: JobSet's own controller writes the epochs (`--write-epoch-status=false`,
/// the attempt dialect), the JobSet's annotation sets a 1 s timeout (the reconciler's is 2 m).
/// One pod never registers: it is deleted with its UID as the precondition after 1 s; nothing
/// replaces it here, so 1 s later the reconciler raises `status.restarts` (a first write meets a
/// conflict and is decided again: the count goes up by one, not two) and deletes, in the
/// foreground, exactly the JobSet's Jobs of earlier restarts. It writes nothing else of the
/// status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_recreation_writes_and_deletes_with_jobsets_controller_writing_the_epochs() {
    bounded(async {
        let dialect = Dialect::Attempt;
        let server = Arc::new(TestApiServer::start().await);
        let js = server.create("jobsets", jobset(Some("1s"), 5)).expect("jobset");
        let uid = js["metadata"]["uid"].as_str().expect("uid").to_owned();
        for (name, owner, attempt) in [
            ("js-w-0", uid.as_str(), "0"),
            ("js-w-1", uid.as_str(), "0"),
            ("other", "another-jobset", "0"),
        ] {
            server.create("jobs", job(name, owner, attempt)).expect("job");
        }
        server.create("pods", of_job(&server, pod("js-0"), "js-w-0")).expect("pod");
        server.create("pods", of_job(&server, pod("js-1"), "js-w-1")).expect("pod");
        let mut opts = options(dialect, Some(Duration::from_secs(120)), "r1");
        opts.settings.write_epoch_status = false;
        let r = Running::start(server.client_named("reconciler"), opts).await;
        // JobSet's controller syncs 0; pod 0 restarts; it deprecates 0.
        set_epoch(&server, dialect, "js-0", 0);
        set_epoch(&server, dialect, "js-1", 0);
        let write = |status: Value| {
            server
                .patch("jobsets", NS, "js", &json!({"status": status}))
                .expect("status");
        };
        write(json!({"currentInPlaceRestartAttempt": 0}));
        set_epoch(&server, dialect, "js-0", 1);
        write(json!({"previousInPlaceRestartAttempt": 0}));
        let started = Instant::now();
        until("the unregistered pod deleted", Duration::from_secs(1) + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert_eq!(deletes_by_reconciler(&server, "pods"), ["js-1"]);
        assert!(server.get("pods", NS, "js-0").is_some());
        // Marked Failed first, so that its Job (podReplacementPolicy: Failed) replaces it.
        let marked: Vec<_> = server
            .writes()
            .into_iter()
            .filter(|w| w.client.as_deref() == Some("reconciler") && w.resource == "pods/status")
            .filter_map(|w| w.name)
            .collect();
        assert_eq!(marked, ["js-1"]);
        // The recreation's status write meets a conflict first.
        server.fail_next(1, Verb::Patch, "jobsets/status", 409);
        until("the restart counted", Duration::from_secs(1) + SLACK, || {
            server.get("jobsets", NS, "js").is_some_and(|j| j["status"]["restarts"] == 1)
        })
        .await;
        until("the Jobs deleted", WAIT, || deletes_by_reconciler(&server, "jobs").len() == 2).await;
        let writes: Vec<_> = server
            .writes()
            .into_iter()
            .filter(|w| w.client.as_deref() == Some("reconciler") && w.resource == "jobsets/status")
            .collect();
        assert_eq!(writes.len(), 1, "one status write (the conflict is not applied): {writes:?}");
        // The recreated pods register and JobSet's controller syncs: the deadline is over.
        server.create("jobs", job("js-w-0-1", &uid, "1")).expect("job");
        let mut replacement = of_job(&server, pod("js-2"), "js-w-0-1");
        replacement["metadata"]["annotations"][dialect.pod_annotation()] = json!("1");
        server.create("pods", replacement).expect("pod");
        write(json!({"currentInPlaceRestartAttempt": 1}));
        let js = server.get("jobsets", NS, "js").expect("jobset");
        assert_eq!(js["status"]["restartsCountTowardsMax"], 1);
        assert_eq!(js["status"]["previousInPlaceRestartAttempt"], 0);
        assert!(js["status"]["conditions"].is_null(), "{}", js["status"]);
        let mut deleted = deletes_by_reconciler(&server, "jobs");
        deleted.sort();
        assert_eq!(deleted, ["js-w-0", "js-w-1"]);
        for name in ["js-w-0", "js-w-1"] {
            let j = server.get("jobs", NS, name).expect("being deleted");
            assert!(j["metadata"]["deletionTimestamp"].is_string());
            assert_eq!(j["metadata"]["finalizers"], json!(["foregroundDeletion"]));
        }
        let other = server.get("jobs", NS, "other").expect("another JobSet's Job");
        assert!(other["metadata"]["deletionTimestamp"].is_null());
        for reason in ["GroupRestartTimedOut", "UnregisteredPodsDeleted", "FallingBackToRecreate"] {
            until(reason, WAIT, || !events(&server, NS, reason).is_empty()).await;
        }
        assert!(note(&server, NS, "GroupRestartTimedOut").await.contains("within 1s"));
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        assert_eq!(r.sample_reaching(&step("recreated"), 1.0).await, 1.0);
        assert_eq!(r.sample(PODS_DELETED).await, 1.0);
        assert_eq!(r.sample(JOBS_DELETED).await, 2.0);
        let metrics = r.metrics().await;
        assert!(metrics.contains("jobset_inplace_reconciler_status_writes_total{field=\"restarts\",result=\"conflict\"} 1"), "{metrics}");
        r.stop().await;
    })
    .await;
}

/// A malformed annotation is said once, as a Warning, and the reconciler's timeout applies; a
/// `0` turns the deadline off for that JobSet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_annotation_is_a_warning_and_the_default_applies() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let server = TestApiServer::start().await;
        server
            .create("jobsets", jobset(Some("soon"), 5))
            .expect("jobset");
        server
            .create("pods", member_of(&server, pod("js-0")))
            .expect("pod");
        server
            .create("pods", member_of(&server, pod("js-1")))
            .expect("pod");
        let r = Running::start(
            server.client_named("reconciler"),
            options(dialect, Some(Duration::from_secs(1)), "r1"),
        )
        .await;
        until("the warning", WAIT, || {
            !events(&server, NS, "InvalidGroupRestartTimeout").is_empty()
        })
        .await;
        let warning = &events(&server, NS, "InvalidGroupRestartTimeout")[0];
        assert_eq!(warning["type"], "Warning");
        let text = warning["note"].as_str().unwrap_or_default();
        assert!(
            text.contains("\"soon\"") && text.contains("default (1s)"),
            "{text}"
        );
        // The default (1 s) applies: the unregistered pod goes.
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced", WAIT, || {
            server
                .get("jobsets", NS, "js")
                .is_some_and(|j| j["status"]["syncedEpoch"] == 1)
        })
        .await;
        set_epoch(&server, dialect, "js-0", 2);
        until("js-1 deleted", Duration::from_secs(1) + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        // 0: off. A new pod that never registers stays.
        server
            .patch(
                "jobsets",
                NS,
                "js",
                &json!({"metadata": {"annotations": {TIMEOUT_ANNOTATION: "0"}}}),
            )
            .expect("annotation");
        server
            .create("pods", member_of(&server, pod("js-2")))
            .expect("pod");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(server.get("pods", NS, "js-2").is_some());
        assert_eq!(events(&server, NS, "InvalidGroupRestartTimeout").len(), 1);
        assert_eq!(r.sample(&step("recreated")).await, 0.0);
        r.stop().await;
    })
    .await;
}

/// Another writer wipes the epoch fields during the group restart (JobSet's own controller does,
/// in the `epoch` dialect, with every status it writes): the reconciler writes them again, and the
/// deadline keeps its clock: the unregistered pod goes one window after the deprecation, however
/// often the fields are wiped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wipes_of_the_epoch_fields_do_not_postpone_the_deadline() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let timeout = Duration::from_secs(3);
        let server = TestApiServer::start().await;
        server
            .create("jobsets", jobset(Some("3s"), 5))
            .expect("jobset");
        server
            .create("pods", member_of(&server, pod("js-0")))
            .expect("pod");
        server
            .create("pods", member_of(&server, pod("js-1")))
            .expect("pod");
        let r = Running::start(
            server.client_named("reconciler"),
            options(dialect, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        let field = |f: &str| {
            server
                .get("jobsets", NS, "js")
                .and_then(|j| j["status"][f].as_i64())
        };
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced", WAIT, || field("syncedEpoch") == Some(1)).await;
        set_epoch(&server, dialect, "js-0", 2);
        until("deprecated", WAIT, || field("deprecatedEpoch") == Some(1)).await;
        let started = Instant::now();
        let wipe = || {
            let mut js = server.get("jobsets", NS, "js").expect("jobset");
            if let Some(status) = js["status"].as_object_mut() {
                status.remove("deprecatedEpoch");
                status.remove("syncedEpoch");
            }
            if let Some(meta) = js["metadata"].as_object_mut() {
                meta.remove("resourceVersion");
            }
            server.put("jobsets", js).expect("wipe");
        };
        for at in [Duration::from_secs(1), Duration::from_millis(2_500)] {
            tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
            wipe();
            until("rewritten", WAIT, || field("deprecatedEpoch") == Some(1)).await;
        }
        until("js-1 deleted", timeout + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        let took = started.elapsed();
        // Had a wipe restarted the clock, js-1 would have gone 3 s after the last wipe, at 5.5 s.
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(1_500),
            "deleted {took:?} after the deprecation"
        );
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        r.stop().await;
    })
    .await;
}

/// The clock is kept by every replica from its JobSet watch: a standby that takes over the
/// lease during a group restart acts when the first window ends, not a window after it took
/// over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_takes_over_keeps_the_clock() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let timeout = Duration::from_secs(4);
        let server = TestApiServer::start().await;
        server.create("jobsets", jobset(None, 5)).expect("jobset");
        server
            .create("pods", member_of(&server, pod("js-0")))
            .expect("pod");
        server
            .create("pods", member_of(&server, pod("js-1")))
            .expect("pod");
        let lease = |identity: &str| {
            let mut o = options(dialect, Some(timeout), identity);
            o.leader_election = Some(LeaderElection {
                lease_name: "deadline-test".to_owned(),
                lease_namespace: "default".to_owned(),
                duration: Duration::from_secs(2),
                grace: Duration::from_secs(1),
            });
            o
        };
        let a = Running::start(server.client_named("reconciler"), lease("a")).await;
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced by a", WAIT, || {
            server
                .get("jobsets", NS, "js")
                .is_some_and(|j| j["status"]["syncedEpoch"] == 1)
        })
        .await;
        let b = Running::start(server.client_named("reconciler"), lease("b")).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        set_epoch(&server, dialect, "js-0", 2);
        until("deprecated by a", WAIT, || {
            server
                .get("jobsets", NS, "js")
                .is_some_and(|j| j["status"]["deprecatedEpoch"] == 1)
        })
        .await;
        let started = Instant::now();
        // a leaves a second before the window ends; b takes over.
        tokio::time::sleep(timeout - Duration::from_secs(1)).await;
        assert!(server.get("pods", NS, "js-1").is_some());
        a.stop().await;
        let deadline = Instant::now() + WAIT;
        while b.sample("jobset_inplace_reconciler_is_leader").await < 1.0 {
            assert!(Instant::now() < deadline, "b never took over");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took_over = Instant::now();
        until("js-1 deleted by b", timeout + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        let took = started.elapsed();
        // Without the standby's clock, b would wait a whole window after taking over.
        assert!(took >= timeout, "deleted {took:?} after the deprecation");
        assert!(
            took_over.elapsed() < timeout / 2,
            "deleted {:?} after taking over, {took:?} after the deprecation",
            took_over.elapsed()
        );
        assert_eq!(
            b.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        b.stop().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// One tenant's deadline and another tenant's group restarts (issue 21, item 6)
// ---------------------------------------------------------------------------------------------

fn jobset_in(ns: &str, name: &str, replicas: i64, annotation: Option<&str>) -> Value {
    let mut js = jobset(annotation, 5);
    js["metadata"]["namespace"] = json!(ns);
    js["metadata"]["name"] = json!(name);
    js["spec"]["replicatedJobs"][0]["replicas"] = json!(replicas);
    js
}

fn pod_in(ns: &str, jobset: &str, name: &str) -> Value {
    let mut p = pod(name);
    p["metadata"]["namespace"] = json!(ns);
    p["metadata"]["labels"][JOBSET_NAME_LABEL] = json!(jobset);
    p["metadata"]["annotations"][JOBSET_NAME_LABEL] = json!(jobset);
    p
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

/// Issue 21, item 6: one tenant's group-restart deadline (a 1 s timeout on three JobSets of 24
/// pods whose pods never register) deletes pods while the API server takes 3 s for each pod's
/// `Failed` mark. Before the fix those deletes ran in the reconcile workers (two here, four by
/// default), about 9 s per JobSet, and another tenant's group restart waited for a free worker;
/// now they run off the workers, and the other tenant's restart completes in its normal time.
/// The first tenant's deadline requests in flight never pass the namespace's share
/// (`NAMESPACE_REQUESTS`, 8; without it three JobSets would have 24 in flight), and its steps
/// still complete once the API server is fast again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_s_slow_deadline_deletes_do_not_delay_another_tenant_s_group_restart() {
    bounded(async {
        const A: &str = "tenant-a";
        const B: &str = "tenant-b";
        const PODS: usize = 24;
        let server = TestApiServer::start().await;
        let a_jobsets = ["a0", "a1", "a2"];
        for js in a_jobsets {
            server
                .create("jobsets", jobset_in(A, js, PODS as i64, Some("1s")))
                .expect("jobset");
            for i in 0..PODS {
                server
                    .create("pods", member_of(&server, pod_in(A, js, &format!("{js}-{i}"))))
                    .expect("pod");
            }
        }
        server
            .create("jobsets", jobset_in(B, "b", 2, None))
            .expect("jobset");
        for i in 0..2 {
            server
                .create("pods", member_of(&server, pod_in(B, "b", &format!("b-{i}"))))
                .expect("pod");
        }
        let r = Running::start(
            server.client_named("reconciler"),
            options(Dialect::Epoch, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        // Everyone synced at epoch 1.
        for js in a_jobsets {
            for i in 0..PODS {
                set_epoch_in(&server, A, &format!("{js}-{i}"), 1);
            }
        }
        for i in 0..2 {
            set_epoch_in(&server, B, &format!("b-{i}"), 1);
        }
        until("everyone synced", WAIT, || {
            a_jobsets
                .iter()
                .all(|js| status_field(&server, A, js, "syncedEpoch") == Some(1))
                && status_field(&server, B, "b", "syncedEpoch") == Some(1)
        })
        .await;
        // Tenant A: one pod of each JobSet restarts, the others never register; each Failed
        // mark takes the API server 3 s.
        server.set_latency_for(Verb::Patch, "pods/status", Duration::from_secs(3));
        for js in a_jobsets {
            set_epoch_in(&server, A, &format!("{js}-0"), 2);
        }
        until("tenant A's deadline deleting", WAIT, || {
            server.counters().get(Verb::Patch, "pods/status") >= 8
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // In flight: received by the server and not yet applied.
        let in_flight = || {
            let received = server.counters().get(Verb::Patch, "pods/status");
            let applied = server
                .writes()
                .iter()
                .filter(|w| w.resource == "pods/status")
                .count() as u64;
            received - applied
        };
        let most = std::cell::Cell::new(in_flight());
        // Tenant B: a whole group restart, timed.
        let started = Instant::now();
        set_epoch_in(&server, B, "b-0", 2);
        until("B deprecated", WAIT, || {
            most.set(most.get().max(in_flight()));
            status_field(&server, B, "b", "deprecatedEpoch") == Some(1)
        })
        .await;
        set_epoch_in(&server, B, "b-1", 2);
        until("B synced", WAIT, || {
            most.set(most.get().max(in_flight()));
            status_field(&server, B, "b", "syncedEpoch") == Some(2)
        })
        .await;
        let took = started.elapsed();
        for _ in 0..20 {
            most.set(most.get().max(in_flight()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let most = most.get();
        eprintln!("tenant B's group restart took {took:?}; tenant A's deadline requests in flight at most {most}");
        assert!(
            took < Duration::from_secs(2),
            "tenant B's group restart took {took:?} behind tenant A's deadline deletes"
        );
        assert!(most >= 1, "tenant A's deletes were in flight meanwhile");
        assert!(most <= 8, "{most} deadline requests of one namespace in flight");
        // Tenant A's steps complete once the API server is fast again.
        server.clear_faults();
        until("tenant A's unregistered pods deleted", WAIT, || {
            server.list("pods", Some(A)).len() == a_jobsets.len()
        })
        .await;
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), a_jobsets.len() as f64)
                .await,
            a_jobsets.len() as f64
        );
        r.stop().await;
    })
    .await;
}

/// Issue 21, item 7: the `Failed` mark of an unregistered pod carries the `resourceVersion` the
/// decision saw. A pod that registers while the mark is on its way (here: the API server takes
/// 1.5 s for it; a deposed leader's write sent late is the same case) is not failed nor deleted,
/// and the group restart completes in place. Before, the mark (UID precondition only) failed the
/// pod that had just registered, and the delete followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_registers_while_its_failed_mark_is_on_its_way_is_left_alone() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let server = TestApiServer::start().await;
        server
            .create("jobsets", jobset(Some("1s"), 5))
            .expect("jobset");
        server
            .create("pods", member_of(&server, pod("js-0")))
            .expect("pod");
        server
            .create("pods", member_of(&server, pod("js-1")))
            .expect("pod");
        let r = Running::start(
            server.client_named("reconciler"),
            options(dialect, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        let field = |f: &str| {
            server
                .get("jobsets", NS, "js")
                .and_then(|j| j["status"][f].as_i64())
        };
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced", WAIT, || field("syncedEpoch") == Some(1)).await;
        let uid = server.get("pods", NS, "js-1").expect("pod")["metadata"]["uid"].clone();
        server.set_latency_for(Verb::Patch, "pods/status", Duration::from_millis(1_500));
        set_epoch(&server, dialect, "js-0", 2);
        until(
            "the Failed mark sent",
            Duration::from_secs(1) + SLACK,
            || server.counters().get(Verb::Patch, "pods/status") >= 1,
        )
        .await;
        // js-1 registers while the mark waits in the API server.
        set_epoch(&server, dialect, "js-1", 2);
        until("synced at 2", WAIT, || field("syncedEpoch") == Some(2)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let p = server.get("pods", NS, "js-1").expect("js-1 is still there");
        assert_eq!(p["metadata"]["uid"], uid, "the same pod");
        assert_eq!(
            p["status"]["phase"], "Running",
            "not failed: {}",
            p["status"]
        );
        assert!(deletes_by_reconciler(&server, "pods").is_empty());
        assert!(
            server.writes().iter().all(|w| w.resource != "pods/status"),
            "the mark was refused"
        );
        assert_eq!(r.sample(PODS_DELETED).await, 0.0);
        r.stop().await;
    })
    .await;
}

/// A kubelet without `RestartAllContainersOnContainerExits` (docs/protocol.md, "A node without
/// the feature"): the failing worker's pod ends (its rule ignored) and its Job replaces it; the
/// other pods' agents see the deprecation and restart alone while their workers run on from
/// epoch 1. The reconciler fails and deletes those pods (an event naming each, the metric), far
/// within the deadline, and writes no synced epoch while a worker of an older epoch runs: the
/// group restart completes over replacements only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_restarted_without_their_workers_are_failed_and_never_synced_over() {
    bounded(async {
        let mut c = sim_config(3, 10, Duration::from_secs(60));
        c.restart_all_gate = false;
        let (sim, r) = start_sim(c).await;
        let before = sim.snapshot();
        // `startedAt` has whole seconds: the agents restart a second or more after their
        // workers started.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(sim.fail_worker(0, 3));
        // A synced epoch above a running worker's, seen twice for the same worker (a snapshot
        // reads the workers before the JobSet).
        let over = |s: &Snapshot| -> Vec<(String, Instant)> {
            s.slots
                .iter()
                .filter_map(|slot| {
                    let w = slot.state.worker?;
                    (s.synced > w.epoch).then(|| (slot.state.pod.clone(), w.started))
                })
                .collect()
        };
        let limit = Instant::now() + WAIT;
        let s = loop {
            let s = sim.snapshot();
            let first = over(&s);
            if !first.is_empty() {
                let again = sim.snapshot();
                let still: Vec<_> = over(&again)
                    .into_iter()
                    .filter(|w| first.contains(w))
                    .collect();
                assert!(
                    still.is_empty(),
                    "synced epoch {:?} written while workers of an older epoch run: {still:?}\n{again}",
                    again.synced
                );
            }
            if s.all_running_after(Some(1)) {
                break s;
            }
            assert!(Instant::now() < limit, "the group restart did not complete\n{s}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(s.synced, Some(2), "{s}");
        for (slot, old) in s.slots.iter().zip(&before.slots) {
            assert_eq!(slot.state.replacements, 1, "every pod replaced\n{s}");
            assert_ne!(slot.state.uid, old.state.uid, "{s}");
        }
        // The reconciler failed and deleted the two pods whose agents restarted alone (the first
        // pod failed on its own), and said why.
        let mut alone = vec![
            before.slots[1].state.pod.clone(),
            before.slots[2].state.pod.clone(),
        ];
        alone.sort();
        let mut deleted = deletes_by_reconciler(sim.server(), "pods");
        deleted.sort();
        assert_eq!(deleted, alone);
        let ns = sim.config().namespace.clone();
        note(sim.server(), &ns, "RestartedWithoutWorkers").await;
        let wait = Instant::now() + WAIT;
        while events(sim.server(), &ns, "RestartedWithoutWorkers").len() < 2 {
            assert!(Instant::now() < wait, "one event per pod");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let events = events(sim.server(), &ns, "RestartedWithoutWorkers");
        for pod in &alone {
            let e = events
                .iter()
                .find(|e| e["note"].as_str().is_some_and(|n| n.contains(pod.as_str())))
                .unwrap_or_else(|| panic!("no event names {pod}: {events:?}"));
            assert_eq!(e["type"], "Warning");
            let note = e["note"].as_str().unwrap_or_default();
            assert!(
                note.contains("RestartAllContainersOnContainerExits") && note.contains("node"),
                "{note}"
            );
        }
        assert_eq!(
            r.sample("jobset_inplace_reconciler_agents_restarted_alone_total")
                .await,
            2.0
        );
        // Not the deadline's doing.
        assert_eq!(r.sample(PODS_DELETED).await, 0.0);
        assert_eq!(r.sample(&step("unregistered_pods_deleted")).await, 0.0);
        assert_clean(&sim, &s);
        r.stop().await;
        sim.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Why a JobSet was evaluated
// ---------------------------------------------------------------------------------------------

fn reason(label: &str) -> String {
    format!("jobset_inplace_reconciler_reconcile_reasons_total{{reason=\"{label}\"}}")
}

/// A pass of the workers counts why its JobSet was queued: a pod's event (`pod`), the
/// group-restart deadline's timer (`deadline`), and the deadline's WARN line names the reasons of
/// the pass that took the step. Every reason's series is there from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_event_and_the_deadline_are_counted_under_their_reasons() {
    bounded(async {
        const RNS: &str = "reasons";
        crate::logs::captured();
        let server = TestApiServer::start().await;
        server
            .create("jobsets", jobset_in(RNS, "js", 2, Some("2s")))
            .expect("jobset");
        for p in ["js-0", "js-1"] {
            server
                .create("pods", member_of(&server, pod_in(RNS, "js", p)))
                .expect("pod");
        }
        let r = Running::start(
            server.client_named("reconciler"),
            options(Dialect::Epoch, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        let text = r.metrics().await;
        for label in [
            "jobset",
            "pod",
            "job",
            "jobsetepoch",
            "node",
            "resync",
            "leadership",
            "retry",
            "deadline",
        ] {
            assert!(text.contains(&reason(label)), "{label}: {text}");
        }
        for p in ["js-0", "js-1"] {
            set_epoch_in(&server, RNS, p, 1);
        }
        until("synced", WAIT, || {
            status_field(&server, RNS, "js", "syncedEpoch") == Some(1)
        })
        .await;
        // js-0 restarts; js-1 never registers: the deadline's timer fires after 2 s. (The
        // registrations at epoch 1 may have been read by the reconciler's first list, a
        // `resync`; epoch 2 comes as a pod event, the pod watch being past its list once the
        // reconciler synced epoch 1.)
        set_epoch_in(&server, RNS, "js-0", 2);
        until("the deprecation", WAIT, || {
            status_field(&server, RNS, "js", "deprecatedEpoch") == Some(1)
        })
        .await;
        assert_eq!(
            r.sample(&reason("deadline")).await,
            0.0,
            "nothing queued by the deadline before its window"
        );
        // The pass counts its reasons as it ends: a scrape may run ahead of it.
        assert!(
            r.sample_reaching(&reason("pod"), 1.0).await >= 1.0,
            "{}",
            r.metrics().await
        );
        until("js-1 deleted", Duration::from_secs(2) + SLACK, || {
            server.get("pods", RNS, "js-1").is_none()
        })
        .await;
        assert!(r.sample_reaching(&reason("deadline"), 1.0).await >= 1.0);
        assert_eq!(r.sample(&reason("node")).await, 0.0, "no node was lost");
        let lines: Vec<String> = {
            let logs = crate::logs::captured()
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            String::from_utf8_lossy(&logs)
                .lines()
                .filter(|l| {
                    l.contains("group restart timed out")
                        && l.contains(&format!("namespace={RNS} "))
                })
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(lines.len(), 1, "{lines:#?}");
        let reasons = lines[0]
            .split_once("reconcile{reasons=")
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(reasons, _)| reasons.split(',').collect::<Vec<_>>());
        assert!(
            reasons.is_some_and(|r| r.contains(&"deadline")),
            "{}",
            lines[0]
        );
        r.stop().await;
    })
    .await;
}
