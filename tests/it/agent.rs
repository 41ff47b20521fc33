//! The agent against the test API server: the binary's exit codes, one-line config errors and
//! barrier endpoint, and (in-process, through `run_agent`) the protocol steps and the faults it
//! must ride through: a missing JobSet, failing and conflicting writes, cut watches, 410s.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobset_inplace::agent::{self, AgentConfig, AgentExit, BarrierState};
use jobset_inplace::protocol::Restart;
use jobset_inplace::protocol::{DISABLE_ANNOTATION, Dialect};
use jobset_inplace::wire::epochs::{self, Epochs};
use jobset_inplace_testkit::apiserver::{Options, TestApiServer, Verb, default_resources};
use jobset_inplace_testkit::build::{JobSet, Pod};
use jobset_inplace_testkit::kubelet::{barrier_port, http_get};
use serde_json::{Value, json};
use tokio::sync::watch;

const BIN: &str = env!("CARGO_BIN_EXE_jobset-inplace");
const NS: &str = "team-a";
const LIMIT: Duration = Duration::from_secs(20);

fn annotation(server: &TestApiServer, dialect: Dialect, pod: &str) -> Option<String> {
    server.get("pods", NS, pod)?["metadata"]["annotations"][dialect.pod_annotation()]
        .as_str()
        .map(str::to_owned)
}

/// Moves the JobSet's status, and publishes its epochs as the reconciler would.
fn set_status(server: &TestApiServer, status: Value) {
    server
        .patch("jobsets", NS, "js", &json!({ "status": status }))
        .expect("jobset status");
    publish(server);
}

/// Creates the JobSet and, as the reconciler does once it sees it, its JobSetEpoch object.
fn create_jobset(server: &TestApiServer, js: Value) {
    server.create("jobsets", js).expect("jobset");
    publish(server);
}

/// What the reconciler's publication writes: the JobSet's epochs (whichever dialect its status
/// uses) in its JobSetEpoch object.
fn publish(server: &TestApiServer) {
    let js = server.get("jobsets", NS, "js").expect("the jobset");
    let status = js["status"].as_object();
    let attempt = Dialect::Attempt.read_status(status);
    let at = if attempt == Default::default() {
        Dialect::Epoch.read_status(status)
    } else {
        attempt
    };
    let bypass = js["spec"]["failurePolicy"]["restartStrategy"] != "InPlaceRestart"
        || js["metadata"]["annotations"][DISABLE_ANNOTATION].is_string();
    let uid = js["metadata"]["uid"].as_str().unwrap_or_default();
    let content = Epochs {
        deprecated: at.deprecated,
        synced: at.synced,
        bypass,
        watch_job_set: false,
    };
    let body = epochs::apply_body(NS, "js", uid, &content);
    if server.get("jobsetepochs", NS, "js").is_some() {
        server
            .patch("jobsetepochs", NS, "js", &json!({"epochs": body["epochs"]}))
            .expect("jobsetepoch");
    } else {
        server.create("jobsetepochs", body).expect("jobsetepoch");
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An agent run in-process.
struct InProcess {
    barrier: watch::Receiver<BarrierState>,
    task: tokio::task::JoinHandle<AgentExit>,
}

impl InProcess {
    fn start(server: &TestApiServer, dialect: Dialect, pod: &str) -> InProcess {
        let mut config = AgentConfig::sidecar(NS, pod, "js", dialect);
        config.api_timeout = Duration::from_secs(2);
        Self::start_with(server, config)
    }

    fn start_with(server: &TestApiServer, config: AgentConfig) -> InProcess {
        let (tx, barrier) = watch::channel(BarrierState::default());
        let task = tokio::spawn(agent::run_agent(
            server.client(),
            config,
            tx,
            futures::stream::pending(),
        ));
        InProcess { barrier, task }
    }

    fn lifted(&self) -> bool {
        self.barrier.borrow().lifted
    }

    async fn outcome(mut self) -> AgentExit {
        match tokio::time::timeout(LIMIT, &mut self.task).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => panic!("agent task failed: {e}"),
            Err(_) => panic!("the agent did not end"),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------------------------

fn agent_command(env: &[(&str, String)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("agent")
        .env_clear()
        .env("NO_COLOR", "1")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run_to_end(env: &[(&str, String)]) -> (i32, String) {
    let out = tokio::time::timeout(LIMIT, agent_command(env).output())
        .await
        .expect("ends")
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn config_errors_exit_2_with_one_line_naming_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("JOBSET_NAME", "js"), ("NAMESPACE", "ns")],
            "POD_NAME is not set",
        ),
        (
            &[("POD_NAME", "p"), ("NAMESPACE", "ns")],
            "JOBSET_NAME is not set",
        ),
        (
            &[
                ("POD_NAME", "p"),
                ("JOBSET_NAME", "js"),
                ("NAMESPACE", "ns"),
                ("RESTART_POD_IN_PLACE_EXIT_CODE", "0"),
            ],
            "RESTART_POD_IN_PLACE_EXIT_CODE=\"0\"",
        ),
        (
            &[
                ("POD_NAME", "p"),
                ("JOBSET_NAME", "js"),
                ("NAMESPACE", "ns"),
                ("WORKER_COMMAND", "exec train"),
            ],
            // An old pod spec of main-container mode fails loudly, saying why.
            "WORKER_COMMAND is set: main-container mode (the agent running the worker) is not \
             offered",
        ),
        (
            &[("POD_NAME", "p"), ("JOBSET_NAME", "js")],
            "NAMESPACE is not set",
        ),
        (
            &[
                ("POD_NAME", "p"),
                ("JOBSET_NAME", "js"),
                ("NAMESPACE", "ns"),
                ("JOBSET_INPLACE_PROTOCOL", "v2"),
            ],
            "JOBSET_INPLACE_PROTOCOL",
        ),
    ];
    for (env, expected) in cases {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let (code, stderr) = run_to_end(&env).await;
        assert_eq!(code, 2, "{env:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{env:?}: {stderr}");
        assert!(stderr.contains(expected), "{env:?}: {stderr}");
    }
}

/// The binary end to end: the barrier answers 503 from the start and says what it waits for,
/// the epoch is registered, a synced epoch lifts the barrier (200), a deprecated one makes the
/// process exit with the restart code; SIGTERM exits 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_registers_lifts_restarts_and_exits_on_signals() {
    let server = TestApiServer::start().await;
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let port = barrier_port().expect("a free port");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let env = vec![
        ("NAMESPACE", NS.to_owned()),
        ("POD_NAME", "p0".to_owned()),
        ("JOBSET_NAME", "js".to_owned()),
        ("RESTART_POD_IN_PLACE_EXIT_CODE", "9".to_owned()),
        ("BARRIER_PORT", port.to_string()),
        ("AGENT_API_URL", server.url()),
    ];
    let mut child = agent_command(&env).spawn().expect("spawns");
    until("the epoch annotation", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("1")
    })
    .await;
    // The agent sees its write succeed a moment after the server applied it.
    let deadline = Instant::now() + LIMIT;
    loop {
        let (code, body) = http_get(addr, "/barrier-is-lifted", LIMIT)
            .await
            .expect("answers");
        assert_eq!(code, 503, "{body}");
        if body.contains("epoch 1 waits to be synced") {
            break;
        }
        assert!(body.contains("registering epoch 1"), "{body}");
        assert!(Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        http_get(addr, "/healthz", LIMIT).await.map(|r| r.0),
        Some(200)
    );
    set_status(&server, json!({"syncedEpoch": 1}));
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some((200, body)) = http_get(addr, "/barrier-is-lifted", LIMIT).await {
            assert!(body.contains("lifted"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "the barrier did not lift");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    set_status(&server, json!({"deprecatedEpoch": 1}));
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(9));

    // The restarted agent registers the next epoch and waits; SIGTERM ends it with 143.
    let mut child = agent_command(&env).spawn().expect("spawns");
    until("epoch 2", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("2")
    })
    .await;
    let pid =
        nix::unistd::Pid::from_raw(child.id().and_then(|p| i32::try_from(p).ok()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(143));
}

// ---------------------------------------------------------------------------------------------
// In-process
// ---------------------------------------------------------------------------------------------

/// A JobSet without in-place restart, or with it disabled, lifts the barrier at once.
#[tokio::test]
async fn bypass_lifts_at_once() {
    for (strategy, disabled) in [("Recreate", false), ("InPlaceRestart", true)] {
        let server = TestApiServer::start().await;
        let mut js = JobSet::new("js")
            .namespace(NS)
            .strategy(strategy)
            .replicas(2)
            .build();
        if disabled {
            js["metadata"]["annotations"] = json!({DISABLE_ANNOTATION: "true"});
        }
        create_jobset(&server, js);
        server
            .create("pods", Pod::worker(NS, "js", "p0").build())
            .expect("pod");
        let a = InProcess::start(&server, Dialect::Epoch, "p0");
        until("the barrier to lift", || a.lifted()).await;
        assert!(a.barrier.borrow().bypassed);
        // Even a deprecation does not re-arm it; the agent stays.
        until("the registration", || a.barrier.borrow().registered).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(a.lifted() && !a.task.is_finished());
    }
}

/// Nothing is published yet (the JobSet is not created, or the reconciler has not seen it): the
/// agent waits on its open watch, registers nothing, and registers as soon as the epochs appear.
#[tokio::test]
async fn unpublished_epochs_are_waited_for() {
    let server = TestApiServer::start().await;
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the watch", || server.watch_count() > 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(annotation(&server, Dialect::Epoch, "p0"), None);
    assert_eq!(
        server.counters().get(Verb::Watch, "jobsetepochs"),
        1,
        "one open watch, no polling"
    );
    let mut js = JobSet::new("js").namespace(NS).replicas(2).build();
    js["status"] = json!({"syncedEpoch": 4});
    create_jobset(&server, js);
    until("the registration", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("5")
    })
    .await;
    assert!(!a.lifted());
}

/// Issue 44: an agent's first state is at least as new as every write acknowledged before it
/// started. The watch cache lags at synced epoch 1 while the JobSetEpoch says 2: a watch from no
/// resourceVersion (the agent before) would start from epoch 1, register the fresh pod at 2 =
/// the synced epoch and lift its barrier beside workers that never restarted. The streaming list
/// reads 2 and registers 3, barrier up. With the `WatchList` gate off, the list-then-watch
/// fallback reads as fresh: three requests (the refused streaming list, the list, the watch).
#[rstest::rstest]
#[case::streaming_list(true, 1)]
#[case::list_then_watch(false, 3)]
#[tokio::test]
async fn the_first_state_is_a_consistent_read_whatever_the_watch_cache_lags(
    #[case] watch_list: bool,
    #[case] reads: u64,
) {
    let server = TestApiServer::start().await;
    server.set_watch_list(watch_list);
    let mut js = JobSet::new("js").namespace(NS).replicas(2).build();
    js["status"] = json!({"syncedEpoch": 1});
    create_jobset(&server, js);
    let stale = server.resource_version();
    set_status(&server, json!({"syncedEpoch": 2}));
    server.lag_watch_cache(Some(stale));
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    server.reset_counters();
    let a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || a.barrier.borrow().registered).await;
    assert_eq!(
        annotation(&server, Dialect::Epoch, "p0").as_deref(),
        Some("3")
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !a.lifted(),
        "a fresh pod lifted at a synced epoch it did not register for"
    );
    let counters = server.counters();
    let epochs_reads =
        counters.get(Verb::Watch, "jobsetepochs") + counters.get(Verb::List, "jobsetepochs");
    assert_eq!(epochs_reads, reads, "{counters:?}");
    // The watch goes on from the read: the synced epoch reaches the agent.
    set_status(&server, json!({"syncedEpoch": 3}));
    until("the barrier to lift", || a.lifted()).await;
}

/// The faults that do not end: the JobSet watch opens and then says nothing (no event, no
/// bookmark), and the next watch request is never answered at all. The agent abandons each
/// after its window and resumes, and still sees its epoch synced: the barrier lifts.
#[tokio::test]
async fn silent_watches_are_abandoned_and_resumed() {
    let server = TestApiServer::start().await;
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    // The first watch stays open and silent; the next one is accepted and never answered.
    server.silence_next(2, Verb::Watch, "jobsetepochs");
    let mut config = AgentConfig::sidecar(NS, "p0", "js", Dialect::Epoch);
    config.watch_idle_timeout = Duration::from_millis(500);
    config.api_timeout = Duration::from_millis(500);
    let a = InProcess::start_with(&server, config);
    until("the registration", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("1")
    })
    .await;
    set_status(&server, json!({"syncedEpoch": 1}));
    until("the barrier to lift", || a.lifted()).await;
    assert!(server.counters().get(Verb::Watch, "jobsetepochs") >= 3);
}

/// Server errors and conflicts on the annotation write are retried.
#[tokio::test]
async fn failed_and_conflicting_writes_are_retried() {
    let server = TestApiServer::start().await;
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    server.fail_next(2, Verb::Patch, "pods", 500);
    server.fail_next(1, Verb::Patch, "pods", 409);
    let _a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("1")
    })
    .await;
    assert!(server.counters().get(Verb::Patch, "pods") >= 4);
}

/// A 429 that reaches the agent (on the agent's own client: kube's retries off) is retried after
/// the `Retry-After` the server asked for (stretched at random up to 1.5 times), not after the
/// agent's shorter backoff.
#[tokio::test]
async fn throttled_requests_wait_for_retry_after() {
    let server = TestApiServer::start().await;
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    server.throttle_next(1, Verb::Patch, "pods", 1);
    let client = jobset_inplace::retry::client_without_retries(server.config()).expect("client");
    let (tx, barrier) = watch::channel(BarrierState::default());
    let task = tokio::spawn(agent::run_agent(
        client,
        AgentConfig::sidecar(NS, "p0", "js", Dialect::Epoch),
        tx,
        futures::stream::pending(),
    ));
    let _a = InProcess { barrier, task };
    until("the throttled write", || {
        server.counters().get(Verb::Patch, "pods") >= 1
    })
    .await;
    let throttled = Instant::now();
    until("the registration", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("1")
    })
    .await;
    let waited = throttled.elapsed();
    assert_eq!(server.counters().get(Verb::Patch, "pods"), 2);
    assert!(
        waited >= Duration::from_millis(900),
        "retried after {waited:?}, before the Retry-After of 1 s"
    );
}

/// A watch that served (here: bookmarks) and is then cut is resumed at once, however often it
/// happens: cuts are not failures to back off from.
#[tokio::test]
async fn served_watches_that_are_cut_resume_at_once() {
    let server = TestApiServer::start().await;
    server.set_bookmark_interval(Duration::from_millis(10));
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || a.barrier.borrow().registered).await;
    let started = Instant::now();
    for _ in 0..10 {
        until("a watch", || server.watch_count() > 0).await;
        // Long enough for a bookmark or two.
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(server.cut_watches() > 0);
    }
    until("a watch", || server.watch_count() > 0).await;
    // With a backoff doubling from 50 ms at every cut, the ten re-watches would take > 5 s.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "ten cuts took {took:?}");
    set_status(&server, json!({"syncedEpoch": 1}));
    until("the barrier to lift", || a.lifted()).await;
}

/// A server that ends every watch as soon as it opens (before an event, a bookmark or a second)
/// is not flooded: such watches did not serve, and the agent backs off before the next one
/// (why its watch is not `kube::runtime::watcher`, which re-opens an ended watch at once).
#[tokio::test]
async fn watches_ended_at_once_are_reopened_after_a_backoff() {
    let server = TestApiServer::start().await;
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || a.barrier.borrow().registered).await;
    server.reset_counters();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        server.cut_watches();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let watches = server.counters().get(Verb::Watch, "jobsetepochs");
    // A backoff from 50 ms, doubling, allows about 7 in 3 s; re-opened at once, thousands.
    assert!((1..=20).contains(&watches), "{watches} watches in 3 s");
    set_status(&server, json!({"syncedEpoch": 1}));
    until("the barrier to lift", || a.lifted()).await;
}

/// The pod's own epoch keeps a restarted pod ahead of its old epoch even when the status was
/// wiped; a cut watch is resumed and an expired resourceVersion (410) is re-read, without
/// missing the state that matters.
#[tokio::test]
async fn watch_cuts_and_expiry_are_survived() {
    let server = TestApiServer::start().await;
    let mut js = JobSet::new("js").namespace(NS).replicas(2).build();
    js["status"] = json!({"previousInPlaceRestartAttempt": 0, "currentInPlaceRestartAttempt": 1});
    create_jobset(&server, js);
    let mut p = Pod::worker(NS, "js", "p0").build();
    p["metadata"]["annotations"]["jobset.sigs.k8s.io/in-place-restart-attempt"] = json!("3");
    server.create("pods", p).expect("pod");
    let a = InProcess::start(&server, Dialect::Attempt, "p0");
    until("attempt 4 (own + 1)", || {
        annotation(&server, Dialect::Attempt, "p0").as_deref() == Some("4")
    })
    .await;
    until("the watch", || server.watch_count() > 0).await;
    assert!(server.cut_watches() > 0);
    set_status(&server, json!({"currentInPlaceRestartAttempt": 2}));
    until("a resumed watch", || server.watch_count() > 0).await;
    // The next watches fail while the history is forgotten: the resume from the old version
    // then gets 410, and the agent watches again from the current state (no read).
    server.fail_next(3, Verb::Watch, "jobsetepochs", 500);
    server.cut_watches();
    set_status(&server, json!({"currentInPlaceRestartAttempt": 3}));
    server.compact_all();
    set_status(&server, json!({"currentInPlaceRestartAttempt": 4}));
    until("the barrier to lift", || a.lifted()).await;
    let counters = server.counters();
    assert_eq!(
        counters.get(Verb::Get, "jobsets"),
        0,
        "never reads the JobSet"
    );
    assert_eq!(
        counters.get(Verb::Get, "jobsetepochs"),
        0,
        "the watch gives the state"
    );
    set_status(&server, json!({"previousInPlaceRestartAttempt": 4}));
    assert_eq!(
        a.outcome().await,
        AgentExit::Restart(Restart {
            epoch: 4,
            deprecated: 4
        })
    );
}

/// Where the JobSetEpoch kind is not served (an install without its CRD), the agent watches its
/// JobSet instead, and the protocol works the same.
#[tokio::test]
async fn falls_back_to_the_jobset_where_the_kind_is_not_served() {
    let resources = default_resources()
        .into_iter()
        .filter(|r| r.plural != "jobsetepochs")
        .collect();
    let server = TestApiServer::start_with(Options {
        resources,
        ..Options::default()
    })
    .await;
    server
        .create(
            "jobsets",
            JobSet::new("js").namespace(NS).replicas(2).build(),
        )
        .expect("jobset");
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("1")
    })
    .await;
    let status = |s: Value| {
        server
            .patch("jobsets", NS, "js", &json!({ "status": s }))
            .expect("status");
    };
    status(json!({"syncedEpoch": 1}));
    until("the barrier to lift", || a.lifted()).await;
    status(json!({"deprecatedEpoch": 1}));
    assert_eq!(
        a.outcome().await,
        AgentExit::Restart(Restart {
            epoch: 1,
            deprecated: 1
        })
    );
    assert!(server.counters().get(Verb::Watch, "jobsets") >= 1);
}

/// Where JobSet's own controller decides the epochs (the reconciler only observes them), the
/// published object says so and the agent watches the JobSet instead.
#[tokio::test]
async fn delegated_epochs_are_read_from_the_jobset() {
    let server = TestApiServer::start().await;
    server
        .create(
            "jobsets",
            JobSet::new("js").namespace(NS).replicas(2).build(),
        )
        .expect("jobset");
    let uid = server.get("jobsets", NS, "js").expect("jobset")["metadata"]["uid"].clone();
    let delegated = Epochs {
        watch_job_set: true,
        ..Epochs::default()
    };
    server
        .create(
            "jobsetepochs",
            epochs::apply_body(NS, "js", uid.as_str().unwrap_or_default(), &delegated),
        )
        .expect("jobsetepoch");
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let a = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("1")
    })
    .await;
    // Only the JobSet's status moves; the object stays as it is.
    server
        .patch("jobsets", NS, "js", &json!({"status": {"syncedEpoch": 1}}))
        .expect("status");
    until("the barrier to lift", || a.lifted()).await;
    assert!(server.counters().get(Verb::Watch, "jobsets") >= 1);
}

/// What one group restart costs one pod's agents, while another controller rewrites the JobSet's
/// status twenty times (as JobSet's own controller does while its Jobs' ready counts move) and
/// the JobSet is large: the old agent hears of the deprecation, the new one reads its pod, watches
/// the epochs, registers, and hears of the synced epoch. Three requests and at most three small
/// events, nothing about the JobSet itself.
#[tokio::test]
async fn a_group_restart_costs_an_agent_three_requests_and_three_small_events() {
    let server = TestApiServer::start().await;
    let mut js = JobSet::new("js").namespace(NS).replicas(2).build();
    // A large JobSet: 20 KB of environment in its pod template.
    let env: Vec<Value> = (0..200)
        .map(|i| json!({"name": format!("VAR_{i:03}"), "value": "x".repeat(80)}))
        .collect();
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"] =
        Value::Array(env);
    create_jobset(&server, js);
    server
        .create("pods", Pod::worker(NS, "js", "p0").build())
        .expect("pod");
    let first = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration", || first.barrier.borrow().registered).await;
    set_status(&server, json!({"syncedEpoch": 1}));
    until("the barrier to lift", || first.lifted()).await;

    server.reset_counters();
    let other_writer = |n: usize| {
        for i in 0..n {
            server
                .patch(
                    "jobsets",
                    NS,
                    "js",
                    &json!({"status": {"replicatedJobsStatus": [{"name": "w", "ready": i, "active": 2,
                        "failed": 0, "succeeded": 0, "suspended": 0}]}}),
                )
                .expect("status");
        }
    };
    other_writer(5);
    set_status(&server, json!({"deprecatedEpoch": 1}));
    assert!(matches!(first.outcome().await, AgentExit::Restart(_)));
    other_writer(5);
    let second = InProcess::start(&server, Dialect::Epoch, "p0");
    until("the registration of epoch 2", || {
        annotation(&server, Dialect::Epoch, "p0").as_deref() == Some("2")
    })
    .await;
    other_writer(10);
    set_status(&server, json!({"syncedEpoch": 2}));
    until("the barrier to lift", || second.lifted()).await;

    let counters = server.counters();
    assert_eq!(counters.get(Verb::Get, "pods"), 1, "{counters:?}");
    assert_eq!(counters.get(Verb::Watch, "jobsetepochs"), 1, "{counters:?}");
    assert_eq!(counters.get(Verb::Patch, "pods"), 1, "{counters:?}");
    assert_eq!(counters.total(), 3, "{counters:?}");
    let delivered = server.deliveries();
    let epochs = delivered.get("jobsetepochs").copied().unwrap_or_default();
    assert!(epochs.events <= 3, "{delivered:?}");
    assert!(
        epochs.bytes + epochs.bookmark_bytes <= 4096,
        "{delivered:?}"
    );
    assert_eq!(
        delivered.get("jobsets"),
        None,
        "nothing of the JobSet: {delivered:?}"
    );
}

/// Many in-process agents on one JobSet: every one registers once and lifts on the synced epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_agents_register_and_lift() {
    let server = Arc::new(TestApiServer::start().await);
    create_jobset(&server, JobSet::new("js").namespace(NS).replicas(2).build());
    let agents: Vec<InProcess> = (0..50)
        .map(|i| {
            let name = format!("p{i}");
            server
                .create("pods", Pod::worker(NS, "js", &name).build())
                .expect("pod");
            InProcess::start(&server, Dialect::Epoch, &name)
        })
        .collect();
    until("every registration", || {
        agents.iter().all(|a| a.barrier.borrow().registered)
    })
    .await;
    set_status(&server, json!({"syncedEpoch": 1}));
    until("every barrier", || agents.iter().all(InProcess::lifted)).await;
    assert_eq!(server.counters().get(Verb::Patch, "pods"), 50);
}
