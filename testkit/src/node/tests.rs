//! The node's own tests (its pods' loops against the test API server).

use super::*;

#[test]
fn after_a_group_restart_the_pod_is_pending_at_the_barrier_and_stays_initialized() {
    let mut st = state();
    st.agent.run("uid-1");
    st.agent.started = true;
    st.worker.run("uid-1");
    st.phase = "Running";
    assert_eq!(condition(&st.json(), "Initialized"), "True");
    st.worker.terminate(3, "Error");
    st.agent.remove();
    st.worker.remove();
    let s = st.json();
    assert_eq!(
        s["containerStatuses"][0]["state"]["waiting"]["reason"],
        RESTARTING_ALL_CONTAINERS
    );
    assert_eq!(
        s["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
        137
    );
    // The agent runs again, the barrier not lifted yet (what the kubelet loop does).
    st.agent.run("uid-1");
    st.phase = "Pending";
    let s = st.json();
    assert_eq!(s["phase"], "Pending");
    assert_eq!(condition(&s, "Initialized"), "True", "kept once True");
    assert_eq!(s["initContainerStatuses"][0]["lastState"], json!({}));
}

/// A node's `Shared` on the test API server, for the status writer alone.
fn shared_on(server: &crate::apiserver::TestApiServer, in_flight: usize) -> Arc<Shared> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = NodeConfig::new("n", "default", "/bin/false", "", "", dir.path());
    config.api_timeout = Duration::from_secs(2);
    config.calls_in_flight = in_flight;
    Arc::new(Shared {
        client: server.client(),
        started: Instant::now(),
        log: Mutex::new(VecDeque::new()),
        views: Mutex::new(BTreeMap::new()),
        call_slots: Arc::new(tokio::sync::Semaphore::new(in_flight)),
        probe_events: Mutex::new(events::ProbeEvents::default()),
        config,
        dir,
    })
}

/// Pods of one worker container each, in `default`.
async fn create_pods(server: &crate::apiserver::TestApiServer, names: &[&str]) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    for name in names {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "worker", "image": "w:1"}]}});
        let pod = serde_json::from_value(pod).expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create");
    }
    pods
}

/// A pod without an agent ([`NodeConfig::plain_pods`]): its worker runs at once; its exit
/// ends the pod (`Failed` written, no init container status); a pod deleted through the API
/// is stopped and deleted for good.
#[tokio::test]
async fn a_plain_pod_runs_its_worker_at_once_and_ends_with_it() {
    use crate::apiserver::TestApiServer;
    let server = TestApiServer::start().await;
    let pods = create_pods(&server, &["a", "b"]).await;
    let shared = shared_on(&server, 2);
    let (_stop, stop) = watch::channel(false);
    let worker = json!({"name": "worker", "image": "w:1"});
    let mut runs = Vec::new();
    let mut cmds = Vec::new();
    for name in ["a", "b"] {
        let uid = pods.get(name).await.expect("get").metadata.uid;
        let (tx, rx) = mpsc::unbounded_channel();
        runs.push(tokio::spawn(run_plain_pod(
            shared.clone(),
            name.to_owned(),
            uid.unwrap_or_default(),
            worker.clone(),
            rx,
            stop.clone(),
        )));
        cmds.push(tx);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock(&shared.views)
        .values()
        .filter(|v| v.worker_running)
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "both workers run within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = cmds[0].send(Cmd::ExitWorker(1));
    let _ = cmds[1].send(Cmd::Deleted);
    for run in runs {
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the pods end within 30 s")
            .expect("the pod's task");
    }
    let a = serde_json::to_value(pods.get("a").await.expect("get")).expect("json");
    assert_eq!(a["status"]["phase"], "Failed", "{a:#}");
    let worker = &a["status"]["containerStatuses"][0];
    assert_eq!(worker["state"]["terminated"]["exitCode"], 1, "{a:#}");
    assert!(
        a["status"]["initContainerStatuses"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{a:#}"
    );
    assert!(pods.get_opt("b").await.expect("get").is_none(), "b deleted");
    let views = lock(&shared.views).clone();
    assert!(views.values().all(|v| v.ended && !v.worker_running));
    assert!(views.values().all(|v| v.worker_starts == 1));
    server.shutdown().await;
}

/// A pod without an agent whose worker's `RestartAllContainers` rule covers its exit (the
/// floor of `scripts/scale.sh`: the pods restarted in place with nothing of the product in
/// the loop): the pod restarts in place, its worker runs again at once (restart count 1,
/// `Running`, `AllContainersRestarting` False again); an exit outside the rule ends it.
#[tokio::test]
async fn a_plain_pod_under_a_restart_all_rule_restarts_in_place() {
    use crate::apiserver::TestApiServer;
    let server = TestApiServer::start().await;
    let pods = create_pods(&server, &["a"]).await;
    let shared = shared_on(&server, 2);
    let (_stop, stop) = watch::channel(false);
    let worker = json!({"name": "worker", "image": "w:1", "restartPolicy": "Never",
        "restartPolicyRules": [{"action": "RestartAllContainers",
            "exitCodes": {"operator": "NotIn", "values": [0]}}]});
    let uid = pods.get("a").await.expect("get").metadata.uid;
    let (tx, rx) = mpsc::unbounded_channel();
    let run = tokio::spawn(run_plain_pod(
        shared.clone(),
        "a".to_owned(),
        uid.unwrap_or_default(),
        worker,
        rx,
        stop,
    ));
    let starts = |n: u32| {
        let shared = shared.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let view = lock(&shared.views).get("a").cloned();
                if view.is_some_and(|v| v.worker_running && v.worker_starts == n) {
                    return;
                }
                assert!(Instant::now() < deadline, "worker start {n} within 30 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    starts(1).await;
    let _ = tx.send(Cmd::ExitWorker(42));
    starts(2).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let a = loop {
        let a = serde_json::to_value(pods.get("a").await.expect("get")).expect("json");
        if a["status"]["containerStatuses"][0]["restartCount"] == 1
            && a["status"]["containerStatuses"][0]["state"]["running"].is_object()
        {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "restarted status within 30 s: {a:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(a["status"]["phase"], "Running", "{a:#}");
    let restarting = a["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "AllContainersRestarting")
        .cloned();
    assert_eq!(
        restarting.map(|c| c["status"].clone()),
        Some(json!("False")),
        "{a:#}"
    );
    assert!(!lock(&shared.views)["a"].ended);
    // Each run's running status acknowledged by the API server, after the run started.
    let view = lock(&shared.views)["a"].clone();
    assert_eq!(view.running_written.len(), 2, "{:?}", view.running_written);
    assert!(view.running_written[1] >= view.worker_runs[1].0);
    let _ = tx.send(Cmd::ExitWorker(0));
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the pod ends within 30 s")
        .expect("the pod's task");
    let a = serde_json::to_value(pods.get("a").await.expect("get")).expect("json");
    assert_eq!(a["status"]["phase"], "Succeeded", "{a:#}");
    server.shutdown().await;
}

/// The kubelet's status manager writes a status until the API server has it: more failed
/// tries than this node's writer once allowed (5) still end with the status written.
#[tokio::test]
async fn a_status_write_is_tried_until_the_api_server_has_it() {
    use crate::apiserver::{TestApiServer, Verb};
    let server = TestApiServer::start().await;
    let pods = create_pods(&server, &["p"]).await;
    let shared = shared_on(&server, 1);
    server.fail_next(6, Verb::Patch, "pods/status", 500);
    let mut writer = StatusWriter::start(&shared, "p");
    let mut st = state();
    st.agent.run("uid-1");
    writer.write(&mut st, Duration::from_secs(60)).await;
    let written = pods.get("p").await.expect("get");
    let phase = written.status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Pending"), "{:?}", lock(&shared.log));
    let tries = lock(&shared.log)
        .iter()
        .filter(|l| l.contains("status write"))
        .count();
    assert_eq!(tries, 6, "each failed try logged once");
    server.shutdown().await;
}

/// However many pods change at once, the node has at most `calls_in_flight` status
/// writes open (each held here by the API server's latency).
#[tokio::test]
async fn the_node_bounds_its_calls_in_flight() {
    use crate::apiserver::{TestApiServer, Verb};
    let server = TestApiServer::start().await;
    let names: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    create_pods(&server, &names).await;
    let shared = shared_on(&server, 3);
    server.set_latency_for(Verb::Patch, "pods/status", Duration::from_millis(150));
    let mut writers: Vec<StatusWriter> = (0..12)
        .map(|i| StatusWriter::start(&shared, &format!("p{i}")))
        .collect();
    let mut most = 0;
    let mut states: Vec<PodState> = (0..12).map(|_| state()).collect();
    for (w, st) in writers.iter_mut().zip(states.iter_mut()) {
        st.agent.run("uid-1");
        w.set(st);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        most = most.max(3 - shared.call_slots.available_permits());
        let done = writers.iter().all(|w| *w.written.borrow() >= w.seq);
        if done || Instant::now() > deadline {
            assert!(done, "every status written within 30 s");
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!((1..=3).contains(&most), "{most} writes in flight at once");
    server.shutdown().await;
}

fn state() -> PodState {
    PodState::new(
        "uid-1",
        &json!({"name": "jobset-inplace-agent", "image": "agent:1"}),
        &json!({"name": "worker", "image": "worker:1"}),
    )
}

fn condition(status: &Value, kind: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .map(|c| c["status"].clone())
        .unwrap_or(Value::Null)
}

/// A failed startup probe is the kubelet's Warning `Unhealthy` event: created once, then
/// counted up (events.rs has the spam filter's bound).
#[tokio::test]
async fn failed_probes_are_one_unhealthy_event_counted_up() {
    let server = crate::apiserver::TestApiServer::start().await;
    let shared = shared_on(&server, 1);
    for _ in 0..3 {
        shared.probe_failed("p0", "uid-0", "/barrier-is-lifted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let name = events::event_name("p0", "uid-0");
    let mut count = None;
    for _ in 0..50 {
        count = server
            .get("events", "default", &name)
            .and_then(|e| e["count"].as_i64());
        if count == Some(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count, Some(3));
    let event = server.get("events", "default", &name).expect("the event");
    assert_eq!(event["reason"], "Unhealthy");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["involvedObject"]["name"], "p0");
    assert_eq!(
        event["involvedObject"]["fieldPath"],
        "spec.initContainers{jobset-inplace-agent}"
    );
    assert_eq!(lock(&shared.views).get("p0").map(|v| v.unhealthy), Some(3));
}

#[test]
fn a_pod_waits_at_its_barrier_pending_and_runs_once_it_lifts() {
    let mut st = state();
    st.agent.run("uid-1");
    let s = st.json();
    assert_eq!(s["phase"], "Pending");
    assert_eq!(condition(&s, "Initialized"), "False");
    assert_eq!(condition(&s, "PodScheduled"), "True");
    assert!(s["initContainerStatuses"][0]["state"]["running"].is_object());
    assert_eq!(s["initContainerStatuses"][0]["started"], false);
    assert_eq!(
        s["containerStatuses"][0]["state"]["waiting"]["reason"],
        "PodInitializing"
    );
    st.agent.started = true;
    st.agent.ready = true;
    st.worker.run("uid-1");
    st.worker.started = true;
    st.worker.ready = true;
    st.phase = "Running";
    let s = st.json();
    assert_eq!(condition(&s, "Ready"), "True");
    assert_eq!(condition(&s, "AllContainersRestarting"), "False");
    assert_eq!(s["podIP"], LOOPBACK);
}

#[test]
fn a_restart_of_all_containers_keeps_what_ended_and_counts_up() {
    let mut st = state();
    st.agent.run("uid-1");
    st.worker.run("uid-1");
    st.phase = "Running";
    st.worker.terminate(42, "Error");
    st.agent.terminate(143, RESTARTING_ALL_CONTAINERS);
    st.restarting = true;
    let s = st.json();
    assert_eq!(condition(&s, "AllContainersRestarting"), "True");
    assert_eq!(condition(&s, "Ready"), "False");
    assert_eq!(
        s["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        42
    );
    st.agent.remove();
    st.worker.remove();
    st.restarting = false;
    let s = st.json();
    assert_eq!(s["phase"], "Running", "a pod that ran stays Running");
    for key in ["initContainerStatuses", "containerStatuses"] {
        assert_eq!(s[key][0]["restartCount"], 1, "{key}");
        assert!(s[key][0]["lastState"]["terminated"].is_object(), "{key}");
        assert!(s[key][0]["state"]["waiting"].is_object(), "{key}");
    }
    assert_eq!(
        s["initContainerStatuses"][0]["lastState"]["terminated"]["reason"],
        RESTARTING_ALL_CONTAINERS
    );
}
