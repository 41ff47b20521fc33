//! A node lost as a cluster runs it, measured (`#[ignore]`: minutes each). Each case wants a
//! fresh `scripts/control-plane.sh up DIR --nodes 3 --node-grace default --install epoch` (the node
//! lifecycle controller's own 50 s, the kubelets' own lease, taint eviction on) and kills a node;
//! `scripts/node-loss.sh` runs them and prints their `NODE_LOSS {json}` lines
//! (docs/benchmarks.md, "A node lost, as a cluster runs it"). Beside them,
//! `measure_recreation_beside_the_matrix` times JobSet's own recreation for the matrix's worker
//! exit and eviction rows (no node is killed; it runs first on the first cluster).
//!
//! Every case follows the same clock: the kill (the test's wall clock, the same machine's as the
//! workers' records), then, polled every second, when the node turned `Ready=Unknown`, when it got
//! the `unreachable` NoExecute taint, when the lost pod got its deletion timestamp, when it left
//! the API, and when every worker ran again (the last new worker's start in the records).

use super::*;
use k8s_openapi::api::core::v1::Node as NodeObject;

/// Kills `victim` (`node-kill`: links cut, kubelet, containerd and containers SIGKILLed) and
/// notes it in node.env for later tests of the same cluster. Returns the kill's wall-clock ms.
pub(super) async fn kill_node(node: &Node, victim: &str) -> u64 {
    let killed_ms = now_ms();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/control-plane.sh");
    run(
        script.to_str().expect("utf-8 path"),
        &["node-kill", node.dir.to_str().expect("utf-8 path"), victim],
    )
    .await
    .unwrap_or_else(|e| panic!("node-kill {victim}: {e}"));
    let _ = std::fs::OpenOptions::new()
        .append(true)
        .open(node.dir.join("node.env"))
        .and_then(|mut f| {
            use std::io::Write;
            writeln!(f, "NODE_KILLED={victim}")
        });
    killed_ms
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The nodes, or SKIPPED unless there are 3, none killed yet, and the node lifecycle
/// controller runs with its defaults (`--node-grace default`: node.env `NODE_GRACE=default`).
fn fresh_default_nodes(node: &Node, test: &str) -> Option<Vec<String>> {
    let names = super::matrix::three_nodes(node, test)?;
    let why = if node.env.contains_key("NODE_KILLED") {
        Some("a node of this cluster was killed already")
    } else if node.env.get("NODE_GRACE").map(String::as_str) != Some("default") {
        Some("the cluster was not started with --node-grace default")
    } else {
        None
    };
    match why {
        Some(why) => {
            eprintln!("\n!! SKIPPED {test}: {why}\n");
            None
        }
        None => Some(names),
    }
}

/// What was seen after a kill, in ms after it (`None`: not seen).
#[derive(Debug, Default)]
pub(super) struct Phases {
    pub(super) unknown: Option<u64>,
    pub(super) tainted: Option<u64>,
    pub(super) deleting: Option<u64>,
    pub(super) gone: Option<u64>,
    pub(super) recovered: Option<u64>,
    /// The last state of the lost pod and of the group, for the report.
    pub(super) last: String,
}

impl Phases {
    pub(super) fn json(&self, case: &str, pods: usize, watched: Duration) -> serde_json::Value {
        let s = |ms: Option<u64>| ms.map(|ms| (ms as f64 / 100.0).round() / 10.0);
        json!({
            "case": case,
            "pods": pods,
            "recovered_s": s(self.recovered),
            "node_unknown_s": s(self.unknown),
            "node_tainted_s": s(self.tainted),
            "lost_pod_deleting_s": s(self.deleting),
            "lost_pod_gone_s": s(self.gone),
            "watched_s": watched.as_secs(),
            "last": self.last,
        })
    }
}

/// Polls every second until every one of `size` live pods (`selector`) runs a worker started
/// since the records' mark `since`, or `limit`: when `victim_node` turned Unknown and was tainted
/// `unreachable`, when `victim` got its deletion timestamp and left the API.
#[allow(clippy::too_many_arguments)]
pub(super) async fn observe(
    node: &Node,
    pods: &Api<Pod>,
    records: &Path,
    selector: &str,
    size: usize,
    since: usize,
    victim: &str,
    victim_node: &str,
    killed_ms: u64,
    limit: Duration,
) -> Phases {
    let nodes: Api<NodeObject> = Api::all(node.client.clone());
    let mut phases = Phases::default();
    let started = Instant::now();
    let at = |ms: u64| Some(ms.saturating_sub(killed_ms));
    while started.elapsed() < limit {
        let now = now_ms();
        if let Ok(n) = nodes.get(victim_node).await {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone());
            if phases.unknown.is_none() && ready.as_deref() == Some("Unknown") {
                phases.unknown = at(now);
            }
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter().any(|t| {
                        t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute"
                    })
                });
            if phases.tainted.is_none() && tainted {
                phases.tainted = at(now);
            }
        }
        match pods.get_opt(victim).await {
            Ok(Some(p)) => {
                if phases.deleting.is_none() && p.metadata.deletion_timestamp.is_some() {
                    phases.deleting = at(now);
                }
                phases.last = format!("{victim}: {}", pod_line(&p));
            }
            Ok(None) => {
                if phases.gone.is_none() {
                    phases.gone = at(now);
                }
            }
            Err(_) => {}
        }
        if let Ok(list) = pods.list(&ListParams::default().labels(selector)).await {
            let live = live_of(list.items);
            let recs = read_records(records);
            let started_since = |name: &String| {
                recs.iter()
                    .rfind(|r| r.event == "start" && r.container == "worker" && &r.pod == name)
                    .filter(|r| r.seq >= since)
                    .map(|r| r.ms)
            };
            let starts: Vec<Option<u64>> = live
                .iter()
                .map(|(name, p)| started_since(name).filter(|_| all_running(p)))
                .collect();
            if live.len() == size && starts.iter().all(Option::is_some) {
                let last = starts.into_iter().flatten().max().unwrap_or(now);
                phases.recovered = at(last);
                phases.last = format!("{size} workers running on {:?}", {
                    live.values()
                        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                        .collect::<Vec<_>>()
                });
                return phases;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    phases
}

/// The node to kill: one that does not run the reconciler's leader.
pub(super) async fn victim_node(node: &Node, names: &[String]) -> String {
    let leader_node = super::matrix::leader_node(node).await;
    names
        .iter()
        .find(|n| **n != leader_node)
        .cloned()
        .expect("3 nodes")
}

/// One worker per node (as the matrix), one of them preferably on `victim`.
pub(super) fn spread_onto(js: &mut serde_json::Value, victim: &str) {
    super::matrix::spread(js);
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"] = json!({"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "preference": {"matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": [victim]
        }]}
    }]});
}

/// How long a case watches after the kill: `JOBSET_INPLACE_NODE_LOSS_WATCH` (humantime), else 9
/// minutes (past the node controller's 50 s and the 300 s taint eviction).
fn watch_limit() -> Duration {
    std::env::var("JOBSET_INPLACE_NODE_LOSS_WATCH")
        .ok()
        .and_then(|v| humantime::parse_duration(&v).ok())
        .unwrap_or(Duration::from_secs(540))
}

/// The installed reconciler's `--node-lost-grace` set (through its env) and rolled out.
pub(super) async fn set_node_lost_grace(node: &Node, grace: &str) {
    let kubeconfig = node.kubeconfig.to_str().expect("utf-8 path").to_owned();
    let env = format!("JOBSET_INPLACE_NODE_LOST_GRACE={grace}");
    for args in [
        vec![
            "--kubeconfig",
            &kubeconfig,
            "-n",
            "jobset-inplace-system",
            "set",
            "env",
            "deploy/jobset-inplace-reconciler",
            &env,
        ],
        vec![
            "--kubeconfig",
            &kubeconfig,
            "-n",
            "jobset-inplace-system",
            "rollout",
            "status",
            "deploy/jobset-inplace-reconciler",
            "--timeout",
            "110s",
        ],
    ] {
        run("kubectl", &args)
            .await
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    }
}

/// One JobSet of a node-loss measurement: in place (with a group-restart deadline, or the
/// default) or JobSet's own recreation.
struct Case {
    label: String,
    run: Run,
    first: Option<Group>,
}

/// A node lost while JobSets of 2 run on 3 nodes, each with a worker on the killed node: the
/// cases of `JOBSET_INPLACE_NODE_LOSS_CASES` (default `in-place,in-place:20s,recreation`:
/// in place with the default group-restart deadline, in place with the JobSet's
/// `group-restart-timeout` at 20 s, JobSet's own `Recreate` with the Job's `backoffLimit: 0`),
/// one kill for all. `JOBSET_INPLACE_NODE_LOST_GRACE` sets the reconciler's grace first (its
/// default, 30 s, otherwise; `0`: the reconciler's part off, the node controller alone). Prints
/// one `NODE_LOSS {json}` per case; asserts nothing of the time (a measurement), only that an
/// in-place recovery, if any, kept the barrier, replaced the lost pod and restarted the other
/// in place.
#[tokio::test]
#[ignore = "a measurement on a fresh 3-node cluster: minutes (scripts/node-loss.sh)"]
async fn measure_a_node_lost() {
    const TEST: &str = "measure_a_node_lost";
    with_node_for(
        TEST,
        watch_limit() + Duration::from_secs(400),
        |node| async move {
            let Some(names) = fresh_default_nodes(&node, TEST) else {
                return;
            };
            let Some(dialect) = installed(&node, TEST) else {
                return;
            };
            let grace = std::env::var("JOBSET_INPLACE_NODE_LOST_GRACE").ok();
            if let Some(grace) = &grace {
                set_node_lost_grace(&node, grace).await;
            }
            let grace_label = match grace.as_deref() {
                Some("0") => "--node-lost-grace 0 (the node controller alone)".to_owned(),
                Some(g) => format!("--node-lost-grace {g}"),
                None => "--node-lost fenced (default): no one fences the node here".to_owned(),
            };
            let victim_node = victim_node(&node, &names).await;
            let specs = std::env::var("JOBSET_INPLACE_NODE_LOSS_CASES")
                .unwrap_or_else(|_| "in-place,in-place:20s,recreation".to_owned());
            let mut cases = Vec::new();
            for (i, spec) in specs.split(',').map(str::trim).enumerate() {
                let prefix = format!("nl-{i}");
                let v = victim_node.clone();
                let case = match spec.split_once(':') {
                    _ if spec == "recreation" => {
                        let run = Run::prepare(&node, &prefix, 2, dialect).await;
                        create_recreating(&run, 2, dialect, |js| spread_onto(js, &v)).await;
                        Case {
                            label: "recreation: JobSet's Recreate, the Job's backoffLimit 0"
                                .to_owned(),
                            run,
                            first: None,
                        }
                    }
                    Some(("in-place", deadline)) => {
                        let d = deadline.to_owned();
                        let (run, first) = Run::start(&node, &prefix, 2, dialect, move |js| {
                            spread_onto(js, &v);
                            js["metadata"]["annotations"] =
                                json!({"jobset-inplace.dev/group-restart-timeout": d});
                        })
                        .await;
                        Case {
                            label: format!(
                                "in place, {grace_label}, group-restart-timeout {deadline}"
                            ),
                            run,
                            first: Some(first),
                        }
                    }
                    None if spec == "in-place" => {
                        let (run, first) =
                            Run::start(&node, &prefix, 2, dialect, move |js| spread_onto(js, &v))
                                .await;
                        Case {
                            label: format!(
                                "in place, {grace_label}, group-restart-timeout 2m (default)"
                            ),
                            run,
                            first: Some(first),
                        }
                    }
                    _ => panic!("JOBSET_INPLACE_NODE_LOSS_CASES: unknown case {spec:?}"),
                };
                cases.push(case);
            }
            // Each case's worker on the node to kill, and the records' marks.
            let selector = "jobset.sigs.k8s.io/jobset-name=train";
            let mut victims = Vec::new();
            for case in &cases {
                let live = case.run.live_pods().await.unwrap_or_default();
                let victim = live
                    .iter()
                    .find(|(_, p)| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&victim_node)
                    })
                    .map(|(n, _)| n.clone())
                    .unwrap_or_else(|| panic!("{}: no worker on {victim_node}", case.label));
                victims.push((victim, case.run.mark()));
            }
            println!("killing {victim_node}: workers {victims:?}");
            let killed_ms = kill_node(&node, &victim_node).await;
            let limit = watch_limit();
            let observed = futures::future::join_all(cases.iter().zip(&victims).map(
                |(case, (victim, since))| {
                    observe(
                        &node,
                        &case.run.pods,
                        case.run.records.path(),
                        selector,
                        2,
                        *since,
                        victim,
                        &victim_node,
                        killed_ms,
                        limit,
                    )
                },
            ))
            .await;
            for ((case, phases), (victim, since)) in cases.iter().zip(&observed).zip(&victims) {
                println!("NODE_LOSS {}", phases.json(&case.label, 2, limit));
                let (Some(first), Some(_)) = (&case.first, phases.recovered) else {
                    continue;
                };
                let after = case
                    .run
                    .running(Some(first.epoch), *since, Duration::from_secs(30))
                    .await;
                assert!(!after.pods.contains_key(victim), "{victim} replaced");
                assert_in_place(first, &after, &[victim.as_str()]);
                let recs = case.run.records();
                let mine = |r: &&Record| r.container == "worker" && r.seq >= *since;
                let last_end = recs
                    .iter()
                    .filter(|r| mine(r) && (r.event == "exit" || r.event == "stop"))
                    .map(|r| r.ms)
                    .max()
                    .unwrap_or(0);
                let first_start = recs
                    .iter()
                    .filter(|r| mine(r) && r.event == "start")
                    .map(|r| r.ms)
                    .min()
                    .unwrap_or(0);
                assert!(
                    last_end <= first_start,
                    "{}: the barrier held: {recs:#?}",
                    case.label
                );
            }
        },
    )
    .await;
}

/// Creates `train` as JobSet's own recreation runs it (no InPlaceRestart, the Job failing at its
/// first pod failure, one worker per node, then `edit`), checks the webhook left it alone, and
/// waits for its `size` workers running.
pub(super) async fn create_recreating(
    run_: &Run,
    size: usize,
    dialect: Dialect,
    edit: impl FnOnce(&mut serde_json::Value),
) -> BTreeMap<String, Pod> {
    let js = train_jobset(size, run_.records.path(), dialect, |js| {
        recreating(js, dialect);
        super::matrix::spread(js);
        edit(js);
    });
    create_not_injected(&run_.jobsets, &js).await;
    workers_running_since(
        &run_.pods,
        run_.records.path(),
        "jobset.sigs.k8s.io/jobset-name=train",
        size,
        0,
    )
    .await
}

/// JobSet's own recreation beside the matrix's first rows, on 3 nodes, one worker per node: a
/// worker exits non-zero, then a pod is evicted; each from the failure to the last recreated
/// worker running. Prints `MATRIX row=recreation-... ms=...` lines.
#[tokio::test]
#[ignore = "a measurement: the recreation beside the matrix (scripts/node-loss.sh)"]
async fn measure_recreation_beside_the_matrix() {
    const TEST: &str = "measure_recreation_beside_the_matrix";
    with_node_for(TEST, Duration::from_secs(600), |node| async move {
        let Some(names) = super::matrix::three_nodes(&node, TEST) else {
            return;
        };
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let run_ = Run::prepare(&node, "mx-recreate", 3, dialect).await;
        let selector = "jobset.sigs.k8s.io/jobset-name=train";
        let live = create_recreating(&run_, 3, dialect, |_| {}).await;
        // A worker exits 42.
        let failing = live.keys().next().expect("a pod").clone();
        let (live, since) =
            fail_and_recover(&run_.pods, run_.records.path(), selector, 3, &failing).await;
        assert!(!live.contains_key(&failing), "recreated: {failing} is gone");
        wait_old_ends(&run_, since, 3).await;
        let recs = run_.records();
        let exit = recs
            .iter()
            .find(|r| r.seq >= since && r.pod == failing && r.event == "exit")
            .map(|r| r.ms)
            .expect("the failing worker's exit");
        let (last_start, overlap) = starts_and_overlap(&recs, since);
        super::matrix::matrix_line(
            "recreation-worker-exit",
            names.len(),
            3,
            Duration::from_millis(last_start.saturating_sub(exit)),
        );
        println!("RECREATION row=recreation-worker-exit overlap_ms={overlap}");
        // A pod evicted.
        let victim = live.keys().next().expect("a pod").clone();
        let since = run_.mark();
        let evicted_ms = now_ms();
        run_.pods
            .evict(&victim, &kube::api::EvictParams::default())
            .await
            .unwrap_or_else(|e| panic!("evict {victim}: {e}"));
        let live = workers_running_since(&run_.pods, run_.records.path(), selector, 3, since).await;
        assert!(!live.contains_key(&victim), "recreated: {victim} is gone");
        wait_old_ends(&run_, since, 3).await;
        let (last_start, overlap) = starts_and_overlap(&run_.records(), since);
        super::matrix::matrix_line(
            "recreation-evicted",
            names.len(),
            3,
            Duration::from_millis(last_start.saturating_sub(evicted_ms)),
        );
        println!("RECREATION row=recreation-evicted overlap_ms={overlap}");
    })
    .await;
}

/// Since the records' mark: the last new worker's start, and how long old and new workers ran
/// together (the last old worker's end after the first new start, in ms; 0: none). The barrier
/// of the in-place rows makes that 0; JobSet's recreation has no barrier.
fn starts_and_overlap(recs: &[Record], since: usize) -> (u64, u64) {
    let worker: Vec<&Record> = recs
        .iter()
        .filter(|r| r.seq >= since && r.container == "worker")
        .collect();
    let starts = worker.iter().filter(|r| r.event == "start").map(|r| r.ms);
    let first_start = starts.clone().min().unwrap_or(0);
    let last_start = starts.max().expect("new starts");
    let last_end = worker
        .iter()
        .filter(|r| r.event == "exit" || r.event == "stop")
        .map(|r| r.ms)
        .max()
        .unwrap_or(0);
    (last_start, last_end.saturating_sub(first_start))
}

/// Waits (bounded) until `pods` old workers recorded their end since the records' mark: the
/// kubelets end them after the recreated pods exist.
async fn wait_old_ends(run_: &Run, since: usize, pods: usize) {
    eventually("the old workers' ends", Duration::from_secs(60), || async {
        let ends = run_
            .records()
            .iter()
            .filter(|r| r.seq >= since && r.container == "worker")
            .filter(|r| r.event == "exit" || r.event == "stop")
            .count();
        if ends >= pods {
            Ok(())
        } else {
            Err(format!("{ends} ends"))
        }
    })
    .await;
}
