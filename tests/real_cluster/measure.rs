//! What one group restart costs the real API server (#[ignore]: run with --ignored)

use super::*;

/// One group restart of `pods` pods on the real control plane, measured from the API server's
/// `/metrics`; the pods run on the test kit's node with the agents in-process on the admin's
/// client (one process, no token per pod: a measurement of load, not of rights).
async fn measure_group_restart(
    cluster: &Cluster,
    pods: usize,
) -> Result<(String, scale::Measured), String> {
    use jobset_inplace_testkit::node::{Node, NodeAgents, NodeConfig};
    let ns = TestNamespace::create(cluster, &format!("rc-scale{pods}")).await;
    let jobsets = jobset_api(&cluster.client, &ns.name);
    let published: Api<JobSetEpoch> = Api::namespaced(cluster.client.clone(), &ns.name);
    let mut jobset = train_jobset(&ns.name, pods);
    // The group-restart deadline (2 min by default) through the JobSet's own annotation, as a
    // user of a large JobSet on a small control plane sets it.
    if let Ok(t) = std::env::var("JOBSET_INPLACE_REAL_SCALE_GROUP_RESTART_TIMEOUT") {
        kube::ResourceExt::annotations_mut(&mut jobset)
            .insert("jobset-inplace.dev/group-restart-timeout".into(), t);
    }
    create_injected(&jobsets, &jobset).await?;
    // A long Lease (60 s, renewed 20 s before): with the 2 cores loaded by the pods' start, a
    // 6 s Lease went unrenewed at 500 pods and the default one (15 s, 5 s) at 1,000, and the
    // reconciler exited as it must (nothing restarts it here, so the restart stalled). See
    // docs/benchmarks.md.
    let reconciler =
        SupervisedReconciler::start(cluster, &format!("real-cluster-scale-{pods}"), 60, 20).await;
    reconciler.ready().await;
    let node_name = format!("node-{}", ns.name);
    let _node_cleanup = NodeCleanup {
        kubeconfig: cluster.kubeconfig.clone(),
        name: node_name.clone(),
    };
    let mut config = NodeConfig::new(
        &node_name,
        &ns.name,
        env!("CARGO_BIN_EXE_jobset-inplace"),
        &cluster.server,
        &cluster.ca_data,
        env!("CARGO_TARGET_TMPDIR"),
    );
    // Each agent on a client of its own with its pod-bound token, as in a pod: the API server
    // rate-limits agents as service accounts (API Priority and Fairness); on the admin's client
    // they were exempt, and at 5,000 pods their abandoned and retried requests kept the API
    // server past every timeout.
    config.agents = NodeAgents::InProcessBound;
    config.calls_in_flight = 8;
    config.log_file = std::env::var_os("JOBSET_INPLACE_REAL_SCALE_NODE_LOG").map(PathBuf::from);
    // On 2 cores shared by everything, 5,000 agents' first requests wait longer than the
    // agents' 10 s; each one abandoned is done again. `JOBSET_INPLACE_REAL_SCALE_AGENT_TIMEOUT`
    // gives them longer (the figures say which).
    if let Ok(t) = std::env::var("JOBSET_INPLACE_REAL_SCALE_AGENT_TIMEOUT") {
        config
            .agent_env
            .push((jobset_inplace::wire::agent_env::API_TIMEOUT.to_owned(), t));
    }
    config.probe_period = Duration::from_millis(200);
    config.api_timeout = Duration::from_secs(30);
    config
        .capacity
        .insert("pods".into(), (pods + 10).to_string());
    config
        .capacity
        .insert("google.com/tpu".into(), (4 * pods).to_string());
    let node = Node::start(cluster.client.clone(), config)
        .await
        .map_err(|e| e.to_string())?;
    let limit = Duration::from_secs(120 + pods as u64 / 5);
    let synced = || async {
        published
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .and_then(|o| o.epochs)
            .ok_or_else(|| "no JobSetEpoch yet".to_owned())
            .map(|e| e.synced)
    };
    let all_running = |starts: u32| {
        let views = node.pods();
        views.len() == pods
            && views
                .iter()
                .all(|v| v.worker_running && v.worker_starts == starts)
    };
    let started = Instant::now();
    let diagnose = |node: &Node| {
        format!(
            "\nreconciler:\n{}\nnode:\n{}",
            reconciler.log_tail(),
            node.log_tail(60)
        )
    };
    try_eventually(limit, || async {
        let s = synced().await?;
        (all_running(1) && s == Some(1))
            .then_some(())
            .ok_or_else(|| {
                let running = node.pods().iter().filter(|v| v.worker_running).count();
                format!("{running} of {pods} running, synced {s:?}")
            })
    })
    .await
    .map_err(|e| format!("first start: {e}{}", diagnose(&node)))?;
    let first_start = started.elapsed();
    // Quiet: the controllers' writes after the start end.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = api_metrics(cluster).await?;
    let cpu_before = scale::cpu(cluster, Some(reconciler.pid()));
    let failing = node
        .pods()
        .first()
        .map(|v| v.name.clone())
        .ok_or("no pod")?;
    let failed_at = node.clock();
    let failed_at_wall = Instant::now();
    let failed_utc = k8s_openapi::jiff::Timestamp::now();
    node.exit_worker(&failing, 42)?;
    try_eventually(limit, || async {
        let s = synced().await?;
        (all_running(2) && s == Some(2))
            .then_some(())
            .ok_or_else(|| {
                let again = node.pods().iter().filter(|v| v.worker_starts == 2).count();
                format!("{again} of {pods} restarted, synced {s:?}")
            })
    })
    .await
    .map_err(|e| format!("group restart: {e}{}", diagnose(&node)))?;
    let views = node.pods();
    let last_lift = views
        .iter()
        .filter_map(|v| v.worker_runs.get(1).map(|r| r.0))
        .max()
        .unwrap_or_default();
    let took = last_lift.saturating_sub(failed_at);
    let last_stop = views.iter().filter_map(|v| v.worker_runs[0].1).max();
    let first_restart = views
        .iter()
        .filter_map(|v| v.worker_runs.get(1).map(|r| r.0))
        .min();
    if !matches!((last_stop, first_restart), (Some(a), Some(b)) if a < b) {
        return Err(format!(
            "two generations ran together: {last_stop:?} {first_restart:?}"
        ));
    }
    let written = scale::wait_written(&node, 1, failed_at, limit, &Default::default()).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = api_metrics(cluster).await?;
    let cpu_after = scale::cpu(cluster, Some(reconciler.pid()));
    // The same time again with nothing happening: what runs anyway (bookmarks, leases, the
    // controllers' resyncs), to read the restart's figures against.
    let window = failed_at_wall.elapsed();
    let measured = scale::Measured {
        seconds: took.as_secs_f64(),
        written_seconds: Some(written),
        window: scale::Window::between(&before, &after, &cpu_before, &cpu_after, window),
    };
    tokio::time::sleep(window).await;
    let idle = api_metrics(cluster).await?;

    let per_pod = |n: f64| n / pods as f64;
    let mut out = format!(
        "{pods:>6} pods: first start {:.1} s; last barrier lifted {:.0} ms after the failure, \
         its status written {:.0} ms after; window {:.1} s (then as long idle)\n",
        first_start.as_secs_f64(),
        took.as_secs_f64() * 1000.0,
        written * 1000.0,
        window.as_secs_f64()
    );
    let rows = |what: &str,
                restart: std::collections::BTreeMap<String, f64>,
                quiet: std::collections::BTreeMap<String, f64>,
                bytes: Option<(
        std::collections::BTreeMap<String, f64>,
        std::collections::BTreeMap<String, f64>,
    )>| {
        let mut keys: Vec<&String> = restart.keys().chain(quiet.keys()).collect();
        keys.sort();
        keys.dedup();
        let mut text = String::new();
        for k in keys {
            let (r, q) = (
                restart.get(k).copied().unwrap_or(0.0),
                quiet.get(k).copied().unwrap_or(0.0),
            );
            text.push_str(&format!(
                "{pods:>6} pods:   {what} {k:<44} restart {:8.2} idle {:8.2} per pod ({r:.0} in all)",
                per_pod(r),
                per_pod(q)
            ));
            if let Some((rb, qb)) = &bytes {
                text.push_str(&format!(
                    "; bytes restart {:9.0} idle {:9.0} per pod",
                    per_pod(rb.get(k).copied().unwrap_or(0.0)),
                    per_pod(qb.get(k).copied().unwrap_or(0.0))
                ));
            }
            text.push('\n');
        }
        text
    };
    out.push_str(&rows(
        "requests ",
        metrics_delta(&before.requests, &after.requests),
        metrics_delta(&after.requests, &idle.requests),
        None,
    ));
    out.push_str(&rows(
        "delivered",
        metrics_delta(&before.watch_events, &after.watch_events),
        metrics_delta(&after.watch_events, &idle.watch_events),
        Some((
            metrics_delta(&before.watch_bytes, &after.watch_bytes),
            metrics_delta(&after.watch_bytes, &idle.watch_bytes),
        )),
    ));
    out.push_str(&format!(
        "{pods:>6} pods: reconciler restarts (stepped down, started again) {}; agents' API \
         timeout {}\n",
        reconciler.restarts(),
        std::env::var("JOBSET_INPLACE_REAL_SCALE_AGENT_TIMEOUT").unwrap_or_else(|_| "10s".into())
    ));

    if std::env::var_os("JOBSET_INPLACE_REAL_SCALE_LOGS").is_some() {
        out.push_str(&format!(
            "failed at {failed_at:?} on the node's clock, {failed_utc} UTC{}\n",
            diagnose(&node)
        ));
    }
    reconciler.kill().await;
    if let Err(e) = scale::clear(cluster, ns, node, pods).await {
        out.push_str(&format!("{pods:>6} pods: cleanup: {e}\n"));
    }
    Ok((out, measured))
}

/// The in-process agents' warnings logged since `seen` bytes of the log, counted by message.
fn agent_warnings(path: &Path, pods: usize, seen: &mut usize) -> String {
    let all = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(all.get(*seen..).unwrap_or_default()).into_owned();
    *seen = all.len();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for line in text.lines() {
        // `... WARN agent{...}: jobset_inplace::agent::run: MESSAGE key=value ... error=...`
        let message = line
            .split_once("jobset_inplace::agent::run: ")
            .map_or(line, |(_, m)| m);
        let key = match message.split_once(" error=") {
            Some((m, e)) => format!("{m} (error={})", e.chars().take(120).collect::<String>()),
            None => message.to_owned(),
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(m, n)| format!("{pods:>6} pods:   agent warnings {n:>5} x {m}\n"))
        .collect()
}

/// `JOBSET_INPLACE_REAL_SCALE_SIZES` (default `100,500`) pods, one group restart each, against
/// the real control plane: per pod, the API requests by verb and resource and the watch events
/// and bytes by resource that the API server counted (everyone's: agents, node, reconciler, Job
/// and JobSet controllers). `cargo test --test real_cluster -- --ignored --nocapture`, or
/// `scripts/scale.sh SIZES`, which also brings the control plane up and down.
///
/// Then, on a control plane of `scripts/control-plane.sh up` (its directory holds the
/// kubeconfig) and unless `JOBSET_INPLACE_REAL_SCALE_SKIP_RECREATE=1`, JobSet's own recreation
/// of the same JobSet at each size ([`scale::measure_recreation`]), with kube-controller-manager
/// as `up` starts it and again with `JOBSET_INPLACE_REAL_SCALE_TUNED_ARGS` (default
/// `--kube-api-qps 200 --kube-api-burst 300`; it is started again as it was afterwards). For
/// each size one line `SCALE_RESULT {json}` ([`scale::result`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: minutes, and many pods on the control plane"]
async fn measure_a_group_restart_on_the_real_api_server() {
    let Some(cluster) = cluster("measure_a_group_restart_on_the_real_api_server").await else {
        return;
    };
    let _turn = CLUSTER_LOCK.lock().await;
    // The in-process agents' warnings (retries and their errors) into a file, counted per size.
    let agent_log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("scale-agents.log");
    if let Ok(file) = std::fs::File::create(&agent_log) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "jobset_inplace::agent=warn",
            ))
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .try_init();
    }
    let sizes =
        std::env::var("JOBSET_INPLACE_REAL_SCALE_SIZES").unwrap_or_else(|_| "100,500".to_owned());
    let webhook = serve_webhook(&cluster).await;
    let mut report = String::from(
        "one group restart on kube-apiserver 1.35 with the Job and JobSet controllers; agents \
         in-process on the node (a client each, with its pod-bound token); per pod, everyone's \
         requests\n",
    );
    let mut failed = Vec::new();
    let mut seen = 0;
    let sizes: Vec<usize> = sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
        .collect();
    let mut in_place = std::collections::BTreeMap::new();
    for &pods in &sizes {
        let limit = Duration::from_secs(600 + pods as u64);
        match tokio::time::timeout(limit, measure_group_restart(&cluster, pods)).await {
            Ok(Ok((table, measured))) => {
                eprint!("{table}");
                report.push_str(&table);
                report.push_str(&agent_warnings(&agent_log, pods, &mut seen));
                in_place.insert(pods, measured);
            }
            Ok(Err(e)) => failed.push(format!("{pods} pods: {e}")),
            Err(_) => failed.push(format!("{pods} pods: not within {limit:?}")),
        }
    }
    webhook.stop().await;
    delete_webhook_configurations(&cluster).await;
    // The floor with the product's webhook gone (the JobSet as the user wrote it), then JobSet's
    // recreation (which restarts kube-controller-manager at two rates).
    let floors = scale::floors(&cluster, &sizes, &mut failed).await;
    let recreations = scale::recreations(&cluster, &sizes, &mut failed).await;
    println!("{report}");
    for &pods in &sizes {
        let (default, tuned) = recreations.get(&pods).cloned().unwrap_or_default();
        let line = scale::result(
            pods,
            floors.get(&pods),
            in_place.get(&pods),
            default.as_ref(),
            tuned.as_ref(),
        );
        println!("SCALE_RESULT {line}");
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
