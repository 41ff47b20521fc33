//! The real kubelet on its own (no product installed): a worker's exit restarts the whole pod in
//! place, three in a row are not backed off, the simulated kubelet serves the same restart; the
//! workers' records and node.env parsed.

use super::*;

/// A pod with a sidecar (the agent's place) and a worker, both under `RestartAllContainers` on a
/// non-zero exit, as the webhook injects it: the worker exits 3 and the real kubelet restarts the
/// whole pod in place.
#[tokio::test]
async fn a_worker_exit_restarts_the_whole_pod_in_place_on_a_real_kubelet() {
    with_node(
        "a_worker_exit_restarts_the_whole_pod_in_place_on_a_real_kubelet",
        |node| async move {
            load_test_image(&node).await;
            let ns = TestNamespace::create(&node, "real-node").await;
            let records = records_dir();
            let pods: Api<Pod> = Api::namespaced(node.client.clone(), &ns.name);
            let pod = sidecar_pod("group-0", records.path());
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create pod");

            // Running: both containers started, both recorded.
            let before = eventually("the pod running", Duration::from_secs(120), || async {
                let p = pods.get("group-0").await.map_err(|e| e.to_string())?;
                let recs = read_records(records.path());
                if all_running(&p) && starts(&recs, "worker").len() == 1 {
                    Ok(p)
                } else {
                    Err(pod_line(&p))
                }
            })
            .await;
            let uid = before.metadata.uid.clone().expect("uid");
            let ip = before
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .expect("pod IP");
            assert!(
                node.env
                    .get("NODE_POD_CIDR")
                    .is_some_and(|cidr| ip.starts_with(cidr.trim_end_matches("0/24"))),
                "the pod's IP {ip} is on the node's pod network {:?}",
                node.env.get("NODE_POD_CIDR")
            );
            let counts_before = restart_counts(&before);
            assert_eq!(counts_before.len(), 2, "{counts_before:?}");
            println!("before: {}", pod_line(&before));

            // Watch what the API server serves from here on.
            let version = before
                .metadata
                .resource_version
                .clone()
                .expect("resource version");
            let watch_pods = pods.clone();
            let seen_log: std::sync::Arc<std::sync::Mutex<Vec<(Instant, Pod)>>> =
                Default::default();
            let log = seen_log.clone();
            let watcher = tokio::spawn(async move {
                let params = WatchParams::default()
                    .fields("metadata.name=group-0")
                    .timeout(120);
                let Ok(stream) = watch_pods.watch(&params, &version).await else {
                    return;
                };
                let mut stream = stream.boxed();
                while let Ok(Some(event)) = stream.try_next().await {
                    if let WatchEvent::Modified(p) = event
                        && let Ok(mut log) = log.lock()
                    {
                        log.push((Instant::now(), p));
                    }
                }
            });

            // The worker exits 3.
            let exited_at = Instant::now();
            std::fs::write(records.path().join("exit-group-0-worker"), "3").expect("exit file");
            let after = eventually(
                "the pod restarted in place",
                Duration::from_secs(120),
                || async {
                    let p = pods.get("group-0").await.map_err(|e| e.to_string())?;
                    let recs = read_records(records.path());
                    let counts = restart_counts(&p);
                    let bumped = counts_before
                        .iter()
                        .all(|(name, before)| counts.get(name) == Some(&(before + 1)));
                    if bumped && all_running(&p) && starts(&recs, "worker").len() == 2 {
                        Ok(p)
                    } else {
                        Err(pod_line(&p))
                    }
                },
            )
            .await;
            let recovered = exited_at.elapsed();
            // Let the watch collect the last updates, then stop it.
            tokio::time::sleep(Duration::from_secs(2)).await;
            watcher.abort();
            let seen = seen_log.lock().map(|l| l.clone()).unwrap_or_default();

            println!("after:  {}", pod_line(&after));
            println!(
                "what the API server served after the worker's exit (ms since the exit file):"
            );
            for (at, p) in &seen {
                println!(
                    "  +{:>5} {}",
                    at.saturating_duration_since(exited_at).as_millis(),
                    pod_line(p)
                );
            }
            let recs = read_records(records.path());
            println!("the containers' records ({}):", records.path().display());
            for r in &recs {
                println!(
                    "  {} {} {} {} {:?}",
                    r.ms, r.event, r.pod, r.container, r.fields
                );
            }
            println!(
                "exit file to every container running again: {} ms",
                recovered.as_millis()
            );

            // In place: the same pod, the same sandbox address, every container restarted once.
            assert_eq!(
                after.metadata.uid.as_deref(),
                Some(uid.as_str()),
                "same pod UID"
            );
            assert_eq!(
                after.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
                Some(ip.as_str()),
                "same pod IP"
            );
            assert!(
                seen.iter().any(
                    |(_, p)| condition(p, "AllContainersRestarting").as_deref() == Some("True")
                ),
                "AllContainersRestarting=True served during the restart"
            );
            // The sidecar was stopped (not left running beside the new worker) and started again.
            let agent_starts = starts(&recs, "agent");
            assert_eq!(agent_starts.len(), 2, "the agent started twice: {recs:?}");
            let worker_starts = starts(&recs, "worker");
            let exit = recs
                .iter()
                .find(|r| r.event == "exit" && r.container == "worker")
                .expect("the worker recorded its exit");
            assert_eq!(exit.fields.get("code").map(String::as_str), Some("3"));
            let agent_stop = recs
                .iter()
                .find(|r| r.event == "stop" && r.container == "agent")
                .expect("the old agent recorded its stop (SIGTERM)");
            assert!(
                agent_stop.ms <= worker_starts[1].ms && exit.ms <= worker_starts[1].ms,
                "the new worker started after the old containers stopped: {recs:?}"
            );
            // The emptyDir survived: the new worker counted the first run's two starts (at least).
            let seen_at_restart: u32 = worker_starts[1]
                .fields
                .get("seen")
                .and_then(|s| s.parse().ok())
                .unwrap_or_default();
            assert!(seen_at_restart >= 2, "emptyDir kept: {recs:?}");
        },
    )
    .await;
}

/// Three group restarts in a row on the real kubelet, each one as quick as the first: sidecar
/// mode is not backed off (the kubelet removes every container; CrashLoopBackOff would add
/// 10 s, then 20 s).
#[tokio::test]
async fn three_group_restarts_in_a_row_are_not_backed_off() {
    with_node(
        "three_group_restarts_in_a_row_are_not_backed_off",
        |node| async move {
            load_test_image(&node).await;
            let ns = TestNamespace::create(&node, "real-node-thrice").await;
            let records = records_dir();
            let pods: Api<Pod> = Api::namespaced(node.client.clone(), &ns.name);
            pods.create(
                &PostParams::default(),
                &sidecar_pod("group-0", records.path()),
            )
            .await
            .expect("create pod");
            let first = eventually("the pod running", Duration::from_secs(120), || async {
                let p = pods.get("group-0").await.map_err(|e| e.to_string())?;
                let recs = read_records(records.path());
                if all_running(&p) && starts(&recs, "worker").len() == 1 {
                    Ok(p)
                } else {
                    Err(pod_line(&p))
                }
            })
            .await;
            let uid = first.metadata.uid.clone().expect("uid");
            let mut took = Vec::new();
            for round in 1..=3 {
                let exited_at = Instant::now();
                std::fs::write(records.path().join("exit-group-0-worker"), "3").expect("exit file");
                let p = eventually("the pod restarted", Duration::from_secs(120), || async {
                    let p = pods.get("group-0").await.map_err(|e| e.to_string())?;
                    let recs = read_records(records.path());
                    let counts = restart_counts(&p);
                    if counts.values().all(|c| *c == round)
                        && all_running(&p)
                        && starts(&recs, "worker").len() == round as usize + 1
                    {
                        Ok(p)
                    } else {
                        Err(pod_line(&p))
                    }
                })
                .await;
                took.push(exited_at.elapsed());
                assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()), "same pod");
                println!(
                    "restart {round}: {} ms, {}",
                    took[round as usize - 1].as_millis(),
                    pod_line(&p)
                );
            }
            let limit = took[0] + Duration::from_secs(5);
            assert!(
                took.iter().all(|t| *t <= limit),
                "no restart slower than the first by 5 s or more (back-off): {took:?}"
            );
        },
    )
    .await;
}

/// The normalised pod status lines of what a watch from `version` serves, collected until
/// `stop` is dropped or the watch ends (bounded by its own timeout).
fn watch_lines(
    pods: Api<Pod>,
    name: &str,
    version: String,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let log = lines.clone();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(120);
    let watcher = tokio::spawn(async move {
        let Ok(stream) = pods.watch(&params, &version).await else {
            return;
        };
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            if let WatchEvent::Modified(p) = event
                && let Ok(v) = serde_json::to_value(&p)
                && let Ok(mut log) = log.lock()
            {
                log.push(transitions::normalise(&v));
            }
        }
    });
    (watcher, lines)
}

/// Waits until the lines seen since the exit end with every container running and Ready again,
/// then stops the watch: the group restart's normalised transitions.
async fn transitions_until_running(
    before: &str,
    watcher: tokio::task::JoinHandle<()>,
    lines: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> Vec<String> {
    let seq = eventually(
        "the group restart served to the end",
        Duration::from_secs(60),
        || async {
            let seen = lines.lock().map(|l| l.clone()).unwrap_or_default();
            let seq = transitions::group_restart(before, &seen);
            let done = seq.len() > 1
                && seq.last().is_some_and(|l| {
                    l.starts_with("phase=Running")
                        && l.contains(" Ready=True")
                        && !l.contains("state=waiting")
                        && !l.contains("state=terminated")
                });
            if done { Ok(seq) } else { Err(seq.join("\n")) }
        },
    )
    .await;
    watcher.abort();
    seq
}

/// The same group restart on the test kit's simulated kubelet, on the test API server in this
/// process: one pod with the injected agent sidecar and a worker, both under
/// `RestartAllContainers` on a non-zero exit; the worker exits 3. The normalised transitions.
async fn simulated_group_restart() -> Vec<String> {
    let mut config = SimConfig::new(ProductDialect::Epoch, 1);
    config.status_writers = false;
    // Slow enough that each state is written before the next (the status writer keeps only
    // the latest state not written yet, as the kubelet's status manager does).
    config.probe_period = Duration::from_millis(50);
    config.restart_delay = Duration::from_millis(200);
    let sim = Simulation::start(config)
        .await
        .expect("the simulation starts");
    let first = sim
        .wait_all_running(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let name = first.slots[0].state.pod.clone();
    let pods: Api<Pod> = Api::namespaced(sim.server().client(), &sim.config().namespace);
    let before = eventually(
        "the simulated pod served Running and Ready",
        Duration::from_secs(30),
        || async {
            let p = pods.get(&name).await.map_err(|e| e.to_string())?;
            let line = serde_json::to_value(&p)
                .map(|v| transitions::normalise(&v))
                .map_err(|e| e.to_string())?;
            if line.starts_with("phase=Running") && line.contains(" Ready=True") {
                Ok(p)
            } else {
                Err(line)
            }
        },
    )
    .await;
    let before_line = transitions::normalise(&serde_json::to_value(&before).expect("pod JSON"));
    let version = before
        .metadata
        .resource_version
        .clone()
        .expect("resource version");
    let (watcher, lines) = watch_lines(pods.clone(), &name, version);
    assert!(sim.fail_worker(0, 3), "the worker exits 3");
    let seq = transitions_until_running(&before_line, watcher, &lines).await;
    sim.shutdown().await;
    seq
}

/// Runs everywhere: the simulated kubelet serves the group restart the real kubelet served in
/// a recorded run (docs/testing.md "Real node").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_kubelet_serves_the_real_kubelets_group_restart() {
    let seen = tokio::time::timeout(LIMIT, simulated_group_restart())
        .await
        .unwrap_or_else(|_| panic!("not within {LIMIT:?}"));
    transitions::compare(transitions::REAL_KUBELET_GROUP_RESTART, &seen)
        .unwrap_or_else(|e| panic!("the simulated kubelet differs from the real one:\n{e}"));
}

/// One scenario on both kubelets: a pod with a sidecar and a worker under
/// `RestartAllContainers`, the worker exits 3; on the real node (the test image) and on the
/// simulated kubelet (the injected agent, in-process), what the API server served is the same
/// normalised sequence, and the recorded one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_restart_is_served_alike_by_the_real_and_the_simulated_kubelet() {
    with_node(
        "one_group_restart_is_served_alike_by_the_real_and_the_simulated_kubelet",
        |node| async move {
            load_test_image(&node).await;
            let ns = TestNamespace::create(&node, "real-node-sim").await;
            let records = records_dir();
            let pods: Api<Pod> = Api::namespaced(node.client.clone(), &ns.name);
            pods.create(
                &PostParams::default(),
                &sidecar_pod("group-0", records.path()),
            )
            .await
            .expect("create pod");
            let before = eventually("the pod running", Duration::from_secs(120), || async {
                let p = pods.get("group-0").await.map_err(|e| e.to_string())?;
                let recs = read_records(records.path());
                if all_running(&p)
                    && condition(&p, "Ready").as_deref() == Some("True")
                    && starts(&recs, "worker").len() == 1
                {
                    Ok(p)
                } else {
                    Err(pod_line(&p))
                }
            })
            .await;
            let before_line =
                transitions::normalise(&serde_json::to_value(&before).expect("pod JSON"));
            let version = before
                .metadata
                .resource_version
                .clone()
                .expect("resource version");
            let (watcher, lines) = watch_lines(pods.clone(), "group-0", version);
            std::fs::write(records.path().join("exit-group-0-worker"), "3").expect("exit file");
            let real = transitions_until_running(&before_line, watcher, &lines).await;
            let simulated = simulated_group_restart().await;
            println!("real kubelet:");
            for l in &real {
                println!("  {l}");
            }
            println!("simulated kubelet:");
            for l in &simulated {
                println!("  {l}");
            }
            let real_refs: Vec<&str> = real.iter().map(String::as_str).collect();
            transitions::compare(&real_refs, &simulated).unwrap_or_else(|e| {
                panic!("the simulated kubelet differs from the real one:\n{e}")
            });
            transitions::compare(transitions::REAL_KUBELET_GROUP_RESTART, &real).unwrap_or_else(
                |e| panic!("the real kubelet differs from its recorded run (update the fixture and the simulator):\n{e}"),
            );
        },
    )
    .await;
}

#[test]
fn records_parse() {
    let recs = parse_records(
        "start ms=1795833979708 pod=p container=c epoch=3 seen=0\n\
         garbage\n\
         exit ms=1795833980228 pod=p container=c epoch= code=7\n",
    );
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].event, "start");
    assert_eq!(recs[0].ms, 1_795_833_979_708);
    assert_eq!(recs[0].fields.get("seen").map(String::as_str), Some("0"));
    assert_eq!(recs[1].fields.get("code").map(String::as_str), Some("7"));
    assert_eq!(recs[1].fields.get("epoch").map(String::as_str), Some(""));
    // The order of writing: the garbage line keeps its place.
    assert_eq!((recs[0].seq, recs[1].seq), (0, 2));
}

#[test]
fn the_records_mark_orders_by_writing_not_by_the_workers_clock() {
    let dir = tempfile::tempdir().expect("temp dir");
    assert_eq!(records_mark(dir.path()), 0, "no records yet");
    // The exit was written after the mark though its clock reads earlier.
    std::fs::write(
        dir.path().join("records"),
        "start ms=1000 pod=p container=worker epoch=1 seen=0\n",
    )
    .expect("records");
    let mark = records_mark(dir.path());
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("records"))
        .expect("open");
    std::io::Write::write_all(
        &mut f,
        b"exit ms=999 pod=p container=worker epoch=1 code=3\nstart ms=20",
    )
    .expect("append");
    let recs = read_records(dir.path());
    let since: Vec<&str> = recs
        .iter()
        .filter(|r| r.seq >= mark)
        .map(|r| r.event.as_str())
        .collect();
    assert_eq!(since, ["exit"], "the line being written does not parse yet");
    // A line being written counts as written.
    assert_eq!(records_mark(dir.path()), 3);
}

/// A recreation's records: the failing worker exits, the others are stopped (SIGTERM), new pods
/// of the same Jobs start under new names; each end pairs with the next start of its slot, and
/// the records before the mark are left out.
#[test]
fn a_failures_gaps_pair_each_end_with_the_next_start_of_its_slot() {
    let recs = parse_records(
        "start ms=900 pod=js-0-aaaaa container=worker epoch=\n\
         exit ms=1000 pod=js-0-aaaaa container=worker epoch= code=42\n\
         stop ms=1300 pod=js-1-bbbbb container=agent epoch= signal=TERM\n\
         stop ms=1400 pod=js-1-bbbbb container=worker epoch= signal=TERM\n\
         start ms=4000 pod=js-0-ccccc container=worker epoch=\n\
         start ms=4500 pod=js-1-ddddd container=worker epoch=\n",
    );
    let f = failure_since(&recs, 1);
    assert_eq!(f.took, Duration::from_millis(3500));
    let gaps: Vec<_> = f
        .gaps
        .iter()
        .map(|g| (g.slot.as_str(), g.end_event.as_str(), g.end, g.start))
        .collect();
    assert_eq!(
        gaps,
        [
            ("js-0", "exit", 0, Some(3000)),
            ("js-1", "stop", 400, Some(3500))
        ]
    );
    assert_eq!(pod_slot("floor-0"), "floor");
}

#[test]
fn a_pod_of_the_registrys_image_passes_any_other_is_named() {
    let pod = |image: &str, id: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "webhook-1"},
            "status": {"containerStatuses": [{
                "name": "webhook", "image": image, "imageID": id, "ready": true,
                "restartCount": 0,
            }]},
        }))
        .expect("a pod")
    };
    let image = "172.31.1.1:5000/jobset-inplace/jobset-inplace:0.1.0";
    let id = "172.31.1.1:5000/jobset-inplace/jobset-inplace@sha256:aa";
    assert!(registry_image_problems(&pod(image, id), image, id).is_empty());
    // Imported: the archive's name, and an imageID without the registry.
    let imported = pod("ghcr.io/jobset-inplace/jobset-inplace:0.1.0", "sha256:aa");
    assert_eq!(registry_image_problems(&imported, image, id).len(), 2);
    // Another digest (a platform manifest's, or another build's).
    let other = pod(
        image,
        "172.31.1.1:5000/jobset-inplace/jobset-inplace@sha256:bb",
    );
    assert_eq!(
        registry_image_problems(&other, image, id),
        vec![format!(
            "webhook-1/webhook: imageID 172.31.1.1:5000/jobset-inplace/jobset-inplace@sha256:bb, want {id}"
        )]
    );
    // No statuses yet.
    let empty: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("a pod");
    assert_eq!(
        registry_image_problems(&empty, image, id),
        vec!["p: no container statuses".to_owned()]
    );
}

#[test]
fn node_env_parses() {
    let env = parse_env_file("NODE_NAME=n\nCTR=\"ctr --address /x -n k8s.io\"\n\n");
    assert_eq!(env.get("NODE_NAME").map(String::as_str), Some("n"));
    assert_eq!(
        env.get("CTR").map(String::as_str),
        Some("ctr --address /x -n k8s.io")
    );
}
