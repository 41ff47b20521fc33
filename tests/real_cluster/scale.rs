//! Issue 32's figures beside the group restart in place (`measure_group_restart`): JobSet's own
//! recreation of the same JobSet at the same size ([`measure_recreation`]), and what each
//! restart's window cost ([`Window`]): the API server's requests by verb, resource and response
//! code, API Priority and Fairness rejections by priority level, and each process's CPU
//! (kube-apiserver, etcd, kube-controller-manager, JobSet's controller, the reconciler, this
//! test process with the node and its in-process agents). [`result`] is the `SCALE_RESULT` line
//! `scripts/scale.sh` prints per size (docs/benchmarks.md says what each field is).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use jobset_inplace_testkit::cluster::{TestNamespace, try_eventually};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use super::{
    ApiMetrics, Cluster, NodeCleanup, api_metrics, fixture_object, jobset_api, manifest_dir,
    metrics_delta,
};

/// The control plane's processes, by their PID files in the directory of
/// `scripts/control-plane.sh up DIR` (DIR/NAME.pid; DIR holds the kubeconfig).
const CONTROL_PLANE: [&str; 4] = [
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "jobset",
];
/// The agents' priority levels in API Priority and Fairness: their own (deploy/base/flowcontrol.yaml,
/// once the reconciler applied their FlowSchema's rules) and, before that or without it, the
/// built-in `workload-low` of the `service-accounts` flow schema.
const AGENTS_PRIORITY_LEVELS: [&str; 2] = ["jobset-inplace-agents", "workload-low"];
/// The agents' requests, by `VERB resource`: the registration's read and write of its pod, its
/// first read and watch of the published epochs (a streaming list: a WATCH; a LIST where the
/// API server refuses one). Nothing else in the in-place window GETs or PATCHes pods (the node
/// writes `pods/status`, the controllers read through their informers).
const AGENT_REQUESTS: [&str; 4] = [
    "GET pods",
    "PATCH pods",
    "WATCH jobsetepochs.jobset-inplace.dev",
    "LIST jobsetepochs.jobset-inplace.dev",
];
/// kube-controller-manager's client rate of a large cluster (its default: 20 QPS, burst 30).
const TUNED_ARGS: &str = "--kube-api-qps 200 --kube-api-burst 300";

/// Each process's CPU time so far: name to (PID, seconds).
pub(super) type Cpu = BTreeMap<String, (u32, f64)>;

/// The control plane's directory (`scripts/control-plane.sh up DIR`).
fn control_plane_dir(cluster: &Cluster) -> PathBuf {
    cluster
        .kubeconfig
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// The CPU time (user and system, `/proc/PID/stat`) of the control plane's processes, of the
/// reconciler (`reconciler`: its PID) and of this process.
pub(super) fn cpu(cluster: &Cluster, reconciler: Option<u32>) -> Cpu {
    let dir = control_plane_dir(cluster);
    let mut pids: Vec<(String, u32)> = CONTROL_PLANE
        .iter()
        .filter_map(|name| {
            let text = std::fs::read_to_string(dir.join(format!("{name}.pid"))).ok()?;
            Some(((*name).to_owned(), text.trim().parse().ok()?))
        })
        .collect();
    if let Some(pid) = reconciler.filter(|p| *p > 0) {
        pids.push(("reconciler".to_owned(), pid));
    }
    pids.push(("test".to_owned(), std::process::id()));
    let tick = clock_tick();
    pids.into_iter()
        .filter_map(|(name, pid)| Some((name, (pid, cpu_ticks(pid)? as f64 / tick))))
        .collect()
}

/// `utime + stime` of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command (in parentheses, may hold blanks): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn clock_tick() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// What one restart's window cost, from just before the failure to 5 s after the last worker
/// runs again.
#[derive(Clone, Debug, Default)]
pub(super) struct Window {
    pub seconds: f64,
    /// `VERB resource CODE` to the count.
    pub responses: BTreeMap<String, f64>,
    /// `priority_level reason` to the count.
    pub rejected: BTreeMap<String, f64>,
    /// Process to CPU seconds.
    pub cpu: BTreeMap<String, f64>,
}

impl Window {
    pub fn between(
        before: &ApiMetrics,
        after: &ApiMetrics,
        cpu_before: &Cpu,
        cpu_after: &Cpu,
        wall: Duration,
    ) -> Self {
        let cpu = cpu_after
            .iter()
            .map(|(name, (pid, secs))| {
                // A process started again in the window (the reconciler): its whole time.
                let base = cpu_before
                    .get(name)
                    .filter(|(p, _)| p == pid)
                    .map_or(0.0, |(_, s)| *s);
                (name.clone(), secs - base)
            })
            .collect();
        Window {
            seconds: wall.as_secs_f64(),
            responses: metrics_delta(&before.responses, &after.responses),
            rejected: metrics_delta(&before.rejected, &after.rejected),
            cpu,
        }
    }

    /// Requests of `verb_resource` (`GET pods`), whatever their code.
    fn requests(&self, verb_resource: &str) -> f64 {
        let prefix = format!("{verb_resource} ");
        self.responses
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            // (`sum` of no f64 is -0.)
            .fold(0.0, |total, (_, n)| total + n)
    }

    /// Requests of `verb_resource` refused 429 (API Priority and Fairness, or a client's limit).
    fn refused(&self, verb_resource: &str) -> f64 {
        self.responses
            .get(&format!("{verb_resource} 429"))
            .copied()
            .unwrap_or(0.0)
    }

    fn responses_429(&self) -> f64 {
        self.responses
            .iter()
            .filter(|(k, _)| k.ends_with(" 429"))
            // (`sum` of no f64 is -0.)
            .fold(0.0, |total, (_, n)| total + n)
    }

    fn agents_rejected(&self) -> f64 {
        self.rejected
            .iter()
            .filter(|(k, _)| {
                AGENTS_PRIORITY_LEVELS
                    .iter()
                    .any(|level| k.starts_with(&format!("{level} ")))
            })
            // (`sum` of no f64 is -0.)
            .fold(0.0, |total, (_, n)| total + n)
    }

    /// kube-apiserver's CPU over the window's wall time on all cores (1 is every core busy).
    fn apiserver_cpu_share(&self) -> Option<f64> {
        let busy = self.cpu.get("kube-apiserver")?;
        (self.seconds > 0.0).then(|| busy / (self.seconds * cores()))
    }

    fn json(&self) -> Value {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "window_s": round(self.seconds),
            "cores": cores(),
            "cpu_s": self.cpu.iter().map(|(k, v)| (k.clone(), json!(round(*v)))).collect::<serde_json::Map<_, _>>(),
            "apiserver_cpu_share": self.apiserver_cpu_share().map(round),
            "responses_429": self.responses_429(),
            "apf_rejected": self.rejected,
            "requests": self.responses,
        })
    }
}

/// One restart: how long it took (the failing worker's exit to the last worker running again)
/// and its window.
#[derive(Clone, Debug, Default)]
pub(super) struct Measured {
    /// The failure (or the floor's exits) to the last worker running again, on the node.
    pub seconds: f64,
    /// The same to when the API server had the last pod's status showing its worker running
    /// again (the node's write acknowledged): the restart as a client of the API sees it.
    pub written_seconds: Option<f64>,
    pub window: Window,
}

/// The latest acknowledgement of the status that shows run `run` (0: the first) of each pod's
/// worker running, since `from` on the node's clock; None if a pod has none.
pub(super) fn last_written(
    views: &[jobset_inplace_testkit::node::PodView],
    run: usize,
    from: Duration,
) -> Option<f64> {
    let mut last = Duration::ZERO;
    for v in views {
        last = last.max(*v.running_written.get(run)?);
    }
    Some(last.saturating_sub(from).as_secs_f64())
}

/// The `SCALE_RESULT` JSON of one size: the in-place restart's figures at the top level, each
/// measurement's whole window under `in_place`, `recreate_default`, `recreate_tuned` (null where
/// it did not run or failed).
pub(super) fn result(
    pods: usize,
    floor: Option<&Measured>,
    in_place: Option<&Measured>,
    default: Option<&Measured>,
    tuned: Option<&Measured>,
) -> Value {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let seconds = |m: Option<&Measured>| m.map(|m| round(m.seconds));
    let window = |m: Option<&Measured>| m.map(|m| m.window.json());
    let agent_requests = |answered: bool| {
        in_place.map(|m| {
            let n: f64 = AGENT_REQUESTS
                .iter()
                .map(|r| m.window.requests(r) - if answered { m.window.refused(r) } else { 0.0 })
                .sum();
            round(n / pods.max(1) as f64)
        })
    };
    let written = |m: Option<&Measured>| m.and_then(|m| m.written_seconds).map(round);
    let over_floor = match (written(in_place), written(floor)) {
        (Some(i), Some(f)) if f > 0.0 => Some(round(i / f)),
        _ => None,
    };
    json!({
        "pods": pods,
        "floor_s": written(floor),
        "in_place_s": seconds(in_place),
        "in_place_written_s": written(in_place),
        "in_place_over_floor": over_floor,
        "recreate_default_s": seconds(default),
        "recreate_default_written_s": written(default),
        "recreate_tuned_s": seconds(tuned),
        "recreate_tuned_written_s": written(tuned),
        "agent_requests_per_pod": agent_requests(false),
        "agent_requests_answered_per_pod": agent_requests(true),
        "responses_429": in_place.map(|m| m.window.responses_429()),
        "apf_rejected_agents": in_place.map(|m| m.window.agents_rejected()),
        "apiserver_cpu_share": in_place.and_then(|m| m.window.apiserver_cpu_share()).map(round),
        "floor": window(floor),
        "in_place": window(in_place),
        "recreate_default": window(default),
        "recreate_tuned": window(tuned),
    })
}

/// JobSet's recreation at each size, at kube-controller-manager's default rate and then at
/// [`TUNED_ARGS`] (or `JOBSET_INPLACE_REAL_SCALE_TUNED_ARGS`): size to (default, tuned). None
/// with `JOBSET_INPLACE_REAL_SCALE_SKIP_RECREATE=1`, or on a control plane that
/// `scripts/control-plane.sh` did not start (it cannot start kube-controller-manager again).
pub(super) async fn recreations(
    cluster: &Cluster,
    sizes: &[usize],
    failed: &mut Vec<String>,
) -> BTreeMap<usize, (Option<Measured>, Option<Measured>)> {
    let mut out: BTreeMap<usize, (Option<Measured>, Option<Measured>)> = BTreeMap::new();
    if std::env::var("JOBSET_INPLACE_REAL_SCALE_SKIP_RECREATE").as_deref() == Ok("1") {
        eprintln!("recreation skipped (JOBSET_INPLACE_REAL_SCALE_SKIP_RECREATE=1)");
        return out;
    }
    if !control_plane_dir(cluster)
        .join("kube-controller-manager.cmd")
        .exists()
    {
        eprintln!("recreation skipped: not a control plane of scripts/control-plane.sh up");
        return out;
    }
    let tuned_args = std::env::var("JOBSET_INPLACE_REAL_SCALE_TUNED_ARGS")
        .unwrap_or_else(|_| TUNED_ARGS.to_owned());
    for (rate, args) in [("default", None), ("tuned", Some(tuned_args.as_str()))] {
        if let Some(args) = args
            && let Err(e) = restart_controller_manager(cluster, args).await
        {
            failed.push(e);
            return out;
        }
        for &pods in sizes {
            let limit = Duration::from_secs(600 + pods as u64);
            match tokio::time::timeout(limit, measure_recreation(cluster, pods, rate)).await {
                Ok(Ok((text, measured))) => {
                    eprint!("{text}");
                    let entry = out.entry(pods).or_default();
                    match rate {
                        "default" => entry.0 = Some(measured),
                        _ => entry.1 = Some(measured),
                    }
                }
                Ok(Err(e)) => failed.push(format!("{pods} pods, recreation ({rate}): {e}")),
                Err(_) => failed.push(format!(
                    "{pods} pods, recreation ({rate}): not within {limit:?}"
                )),
            }
        }
    }
    // As `up` started it, for whatever runs next on this control plane.
    if let Err(e) = restart_controller_manager(cluster, "").await {
        failed.push(e);
    }
    out
}

/// `scripts/control-plane.sh restart-controller-manager DIR ARGS...`.
async fn restart_controller_manager(cluster: &Cluster, args: &str) -> Result<(), String> {
    let script = manifest_dir().join("scripts/control-plane.sh");
    let run = tokio::process::Command::new(&script)
        .arg("restart-controller-manager")
        .arg(control_plane_dir(cluster))
        .args(args.split_whitespace())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .map_err(|_| "kube-controller-manager not started again within 60 s".to_owned())?
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if output.status.success() {
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        Ok(())
    } else {
        Err(format!(
            "kube-controller-manager not started again ({args}): {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The in-place measurement's JobSet (`train_jobset`) as JobSet's own recreation runs it:
/// `Recreate`, each Job's `backoffLimit: 0`, no container restart rules (nothing to inject: the
/// webhook leaves a `Recreate` JobSet alone).
fn recreate_jobset(namespace: &str, pods: usize) -> DynamicObject {
    let mut js = fixture_object("story1-plain");
    js["metadata"] = json!({"name": "train", "namespace": namespace});
    js["spec"]["failurePolicy"] = json!({"maxRestarts": 10, "restartStrategy": "Recreate"});
    let job = &mut js["spec"]["replicatedJobs"][0];
    job["replicas"] = json!(1);
    job["template"]["spec"]["parallelism"] = json!(pods);
    job["template"]["spec"]["completions"] = json!(pods);
    job["template"]["spec"]["backoffLimit"] = json!(0);
    for container in job["template"]["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if let Some(c) = container.as_object_mut() {
            c.remove("restartPolicy");
            c.remove("restartPolicyRules");
        }
    }
    serde_json::from_value(js).expect("JobSet")
}

/// The floor at each size ([`measure_floor`]): size to its measurement. None with
/// `JOBSET_INPLACE_REAL_SCALE_SKIP_FLOOR=1`. Run with the product's webhook configurations gone
/// (the JobSet stays as the user wrote it) and kube-controller-manager as in the in-place run.
pub(super) async fn floors(
    cluster: &Cluster,
    sizes: &[usize],
    failed: &mut Vec<String>,
) -> BTreeMap<usize, Measured> {
    let mut out = BTreeMap::new();
    if std::env::var("JOBSET_INPLACE_REAL_SCALE_SKIP_FLOOR").as_deref() == Ok("1") {
        eprintln!("floor skipped (JOBSET_INPLACE_REAL_SCALE_SKIP_FLOOR=1)");
        return out;
    }
    for &pods in sizes {
        let limit = Duration::from_secs(600 + pods as u64);
        match tokio::time::timeout(limit, measure_floor(cluster, pods)).await {
            Ok(Ok((text, measured))) => {
                eprint!("{text}");
                out.insert(pods, measured);
            }
            Ok(Err(e)) => failed.push(format!("{pods} pods, floor: {e}")),
            Err(_) => failed.push(format!("{pods} pods, floor: not within {limit:?}")),
        }
    }
    out
}

/// The test kit's node for one measurement of `pods` pods in `namespace`: its pods without an
/// agent run their worker at once (`plain_pods`), a few calls in flight, 30 s per call, room for
/// `room` pods (a recreation holds the old and the new pods at once).
async fn plain_node(
    cluster: &Cluster,
    namespace: &str,
    room: usize,
) -> Result<(jobset_inplace_testkit::node::Node, NodeCleanup), String> {
    use jobset_inplace_testkit::node::{Node, NodeConfig};
    let node_name = format!("node-{namespace}");
    let cleanup = NodeCleanup {
        kubeconfig: cluster.kubeconfig.clone(),
        name: node_name.clone(),
    };
    let mut config = NodeConfig::new(
        &node_name,
        namespace,
        env!("CARGO_BIN_EXE_jobset-inplace"),
        &cluster.server,
        &cluster.ca_data,
        env!("CARGO_TARGET_TMPDIR"),
    );
    config.plain_pods = true;
    config.calls_in_flight = 8;
    config.api_timeout = Duration::from_secs(30);
    config
        .capacity
        .insert("pods".into(), (room + 10).to_string());
    config
        .capacity
        .insert("google.com/tpu".into(), (4 * room).to_string());
    let node = Node::start(cluster.client.clone(), config)
        .await
        .map_err(|e| e.to_string())?;
    Ok((node, cleanup))
}

/// The in-place measurement's JobSet (`train_jobset`) with what JobSet's own webhook requires of
/// an `InPlaceRestart` JobSet, which the product's webhook sets in the in-place run: each Job's
/// `backoffLimit` at MaxInt32 and `podReplacementPolicy: Failed`. No agent, no injection.
fn floor_jobset(namespace: &str, pods: usize) -> DynamicObject {
    let mut js = super::train_jobset(namespace, pods);
    let spec = &mut js.data["spec"]["replicatedJobs"][0]["template"]["spec"];
    spec["backoffLimit"] = json!(i32::MAX);
    spec["podReplacementPolicy"] = json!("Failed");
    js
}

/// The floor of a group restart of `pods` pods: the in-place measurement's JobSet
/// (`train_jobset`: `InPlaceRestart`, the worker's `RestartAllContainers` rule) as the user wrote
/// it, with nothing of the product in the loop (no agent, no reconciler, no webhook), on the
/// test kit's node; every worker made to exit at once under its rule, so that the node restarts
/// every pod's containers in place and writes their statuses as it does in a group restart, with
/// JobSet's and the Job controllers watching as in the in-place run. Timed from the exits to the
/// last worker running again; the window's figures as for the restart in place.
pub(super) async fn measure_floor(
    cluster: &Cluster,
    pods: usize,
) -> Result<(String, Measured), String> {
    let ns = TestNamespace::create(cluster, &format!("rc-floor{pods}")).await;
    let jobsets = jobset_api(&cluster.client, &ns.name);
    jobsets
        .create(&PostParams::default(), &floor_jobset(&ns.name, pods))
        .await
        .map_err(|e| format!("create the JobSet: {e}"))?;
    let (node, _node_cleanup) = plain_node(cluster, &ns.name, pods).await?;
    let limit = Duration::from_secs(120 + pods as u64 / 2);
    let running = |node: &jobset_inplace_testkit::node::Node, starts: u32| {
        node.pods()
            .iter()
            .filter(|v| v.worker_running && v.worker_starts == starts)
            .count()
    };
    let started = Instant::now();
    try_eventually(limit, || async {
        let n = running(&node, 1);
        (n == pods)
            .then_some(())
            .ok_or_else(|| format!("{n} of {pods} running"))
    })
    .await
    .map_err(|e| format!("first start: {e}\nnode:\n{}", node.log_tail(40)))?;
    let first_start = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = api_metrics(cluster).await?;
    let cpu_before = cpu(cluster, None);
    let names: Vec<String> = node.pods().into_iter().map(|v| v.name).collect();
    let failed_at = node.clock();
    let failed_at_wall = Instant::now();
    for name in &names {
        // 42: the exit code of the in-place run's failing worker; the rule covers every non-zero.
        node.exit_worker(name, 42)?;
    }
    try_eventually(limit, || async {
        let n = running(&node, 2);
        (n == pods)
            .then_some(())
            .ok_or_else(|| format!("{n} of {pods} restarted in place and running"))
    })
    .await
    .map_err(|e| format!("restart in place: {e}\nnode:\n{}", node.log_tail(40)))?;
    let views = node.pods();
    if views.len() != pods || views.iter().any(|v| v.ended) {
        return Err(format!(
            "{} pods seen, {} ended: not every pod restarted in place",
            views.len(),
            views.iter().filter(|v| v.ended).count()
        ));
    }
    let last_start = views
        .iter()
        .filter_map(|v| v.worker_runs.get(1).map(|r| r.0))
        .max()
        .unwrap_or_default();
    let took = last_start.saturating_sub(failed_at);
    // The floor is what the API server shows: every restarted status written.
    let written = wait_written(&node, 1, failed_at, limit, &HashSet::new()).await?;
    let window = close_window(cluster, &before, &cpu_before, failed_at_wall).await?;
    let text = format!(
        "{pods:>6} pods: the floor (every pod restarted in place by the node, nothing of the \
         product in the loop): first start {:.1} s; last worker running {:.1} s after the exits, \
         its status written {written:.1} s after; {} responses 429\n",
        first_start.as_secs_f64(),
        took.as_secs_f64(),
        window.responses_429(),
    );
    let text = cleared(text, cluster, ns, node, pods).await;
    Ok((
        text,
        Measured {
            seconds: took.as_secs_f64(),
            written_seconds: Some(written),
            window,
        },
    ))
}

/// Waits (within `limit`) until the status showing run `run` of its worker running is written
/// for every pod but those of UID in `except`; the seconds from `from` to the last one.
pub(super) async fn wait_written(
    node: &jobset_inplace_testkit::node::Node,
    run: usize,
    from: Duration,
    limit: Duration,
    except: &HashSet<String>,
) -> Result<f64, String> {
    try_eventually(limit, || async {
        let views: Vec<_> = node
            .pods()
            .into_iter()
            .filter(|v| !except.contains(&v.uid))
            .collect();
        last_written(&views, run, from).ok_or_else(|| {
            let n = views
                .iter()
                .filter(|v| v.running_written.len() > run)
                .count();
            format!("{n} of {} pods' running status written", views.len())
        })
    })
    .await
}

/// JobSet's own recreation of `pods` pods: the JobSet of [`recreate_jobset`] started on the test
/// kit's node (plain pods: the worker runs at once), one worker made to fail, timed from its exit
/// to the last worker of the recreated pods running; the API server's and the processes' figures
/// over that window as for the restart in place.
pub(super) async fn measure_recreation(
    cluster: &Cluster,
    pods: usize,
    rate: &str,
) -> Result<(String, Measured), String> {
    use jobset_inplace_testkit::node::Node;
    let ns = TestNamespace::create(cluster, &format!("rc-recreate{pods}-{rate}")).await;
    let jobsets = jobset_api(&cluster.client, &ns.name);
    jobsets
        .create(&PostParams::default(), &recreate_jobset(&ns.name, pods))
        .await
        .map_err(|e| format!("create the JobSet: {e}"))?;
    let (node, _node_cleanup) = plain_node(cluster, &ns.name, 2 * pods).await?;
    let limit = Duration::from_secs(120 + pods as u64 / 2);
    let running = |node: &Node, except: &HashSet<String>| {
        node.pods()
            .iter()
            .filter(|v| v.worker_running && !except.contains(&v.uid))
            .count()
    };
    let started = Instant::now();
    let none = HashSet::new();
    try_eventually(limit, || async {
        let n = running(&node, &none);
        (n == pods)
            .then_some(())
            .ok_or_else(|| format!("{n} of {pods} running"))
    })
    .await
    .map_err(|e| format!("first start: {e}\nnode:\n{}", node.log_tail(40)))?;
    let first_start = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let first: HashSet<String> = node.pods().into_iter().map(|v| v.uid).collect();
    let failing = node
        .pods()
        .into_iter()
        .find(|v| v.worker_running)
        .map(|v| v.name)
        .ok_or("no pod")?;
    let before = api_metrics(cluster).await?;
    let cpu_before = cpu(cluster, None);
    let failed_at = node.clock();
    let failed_at_wall = Instant::now();
    node.exit_worker(&failing, 1)?;
    try_eventually(limit, || async {
        let n = running(&node, &first);
        (n == pods)
            .then_some(())
            .ok_or_else(|| format!("{n} of {pods} recreated and running"))
    })
    .await
    .map_err(|e| format!("recreation: {e}\nnode:\n{}", node.log_tail(40)))?;
    let last_start = node
        .pods()
        .iter()
        .filter(|v| !first.contains(&v.uid))
        .filter_map(|v| v.worker_runs.first().map(|r| r.0))
        .max()
        .unwrap_or_default();
    let took = last_start.saturating_sub(failed_at);
    let written = wait_written(&node, 0, failed_at, limit, &first).await?;
    let window = close_window(cluster, &before, &cpu_before, failed_at_wall).await?;
    let text = format!(
        "{pods:>6} pods: JobSet's recreation ({rate} kube-controller-manager rate): first start \
         {:.1} s; last worker running {:.1} s after the failure; {} responses 429\n",
        first_start.as_secs_f64(),
        took.as_secs_f64(),
        window.responses_429(),
    );
    let text = cleared(text, cluster, ns, node, pods).await;
    Ok((
        text,
        Measured {
            seconds: took.as_secs_f64(),
            written_seconds: Some(written),
            window,
        },
    ))
}

/// A measurement's window of the node's measurements (no reconciler) closed 5 s after its last
/// worker ran: the API server's and the processes' figures since `before`.
async fn close_window(
    cluster: &Cluster,
    before: &ApiMetrics,
    cpu_before: &Cpu,
    started: Instant,
) -> Result<Window, String> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = api_metrics(cluster).await?;
    let cpu_after = cpu(cluster, None);
    Ok(Window::between(
        before,
        &after,
        cpu_before,
        &cpu_after,
        started.elapsed(),
    ))
}

/// [`clear`], its failure added to a measurement's `text`.
async fn cleared(
    text: String,
    cluster: &Cluster,
    ns: TestNamespace,
    node: jobset_inplace_testkit::node::Node,
    pods: usize,
) -> String {
    match clear(cluster, ns, node, pods).await {
        Ok(()) => text,
        Err(e) => format!("{text}{pods:>6} pods: cleanup: {e}\n"),
    }
}

/// A measurement's namespace and node gone before the next measurement starts: the namespace is
/// deleted while the node runs (it deletes its pods for good), then the node stops, then the
/// namespace itself must be gone (its Jobs, JobSet, events): the namespace controller's work on
/// 5,000 pods would otherwise run inside the next measurement's window (a recreation at 1,000
/// once started while the 5,000 pods before it were still being deleted). Bounded by the size.
pub(super) async fn clear(
    cluster: &Cluster,
    ns: TestNamespace,
    node: jobset_inplace_testkit::node::Node,
    pods: usize,
) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Namespace;
    let name = ns.name.clone();
    let node_name = node.name().to_owned();
    drop(ns);
    let all: Api<Pod> = Api::all(cluster.client.clone());
    let field = format!("spec.nodeName={node_name}");
    let limit = Duration::from_secs(120 + pods as u64 / 5);
    let pods_gone = try_eventually(limit, || async {
        let left = all
            .list(&ListParams::default().fields(&field))
            .await
            .map_err(|e| e.to_string())?;
        left.items
            .is_empty()
            .then_some(())
            .ok_or(format!("{} pods left", left.items.len()))
    })
    .await;
    node.stop().await.map_err(|e| e.to_string())?;
    pods_gone?;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    try_eventually(limit, || async {
        match namespaces.get_opt(&name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err(format!("namespace {name} still there")),
        }
    })
    .await
}

/// The `SCALE_RESULT` line's fields from two snapshots, without a cluster: requests and 429s
/// counted in the window only, the agents' three requests per pod, the API server's CPU share,
/// a process started again counted from its start; and this process's CPU is readable.
#[test]
fn a_scale_result_reads_its_window() {
    let metrics = |get: f64, patch: f64, refused: f64, rejected: f64| ApiMetrics {
        responses: BTreeMap::from([
            ("GET pods 200".to_owned(), get),
            ("GET pods 429".to_owned(), refused),
            ("PATCH pods 200".to_owned(), patch),
            (
                "WATCH jobsetepochs.jobset-inplace.dev 200".to_owned(),
                patch,
            ),
            ("PATCH pods/status 200".to_owned(), 50.0 * patch),
        ]),
        rejected: BTreeMap::from([
            ("workload-low queue-full".to_owned(), rejected),
            ("global-default queue-full".to_owned(), 7.0),
        ]),
        ..ApiMetrics::default()
    };
    let before = metrics(10.0, 10.0, 0.0, 0.0);
    let after = metrics(110.0, 110.0, 20.0, 20.0);
    let cpu_before = Cpu::from([
        ("kube-apiserver".to_owned(), (7, 100.0)),
        ("reconciler".to_owned(), (8, 50.0)),
    ]);
    let cpu_after = Cpu::from([
        ("kube-apiserver".to_owned(), (7, 100.0 + 10.0 * cores())),
        ("reconciler".to_owned(), (9, 2.0)),
    ]);
    let window = Window::between(
        &before,
        &after,
        &cpu_before,
        &cpu_after,
        Duration::from_secs(20),
    );
    assert_eq!(
        window.cpu["reconciler"], 2.0,
        "started again: from its start"
    );
    let in_place = Measured {
        seconds: 12.3456,
        written_seconds: Some(12.5),
        window,
    };
    let floor = Measured {
        seconds: 0.1,
        written_seconds: Some(4.0),
        window: Window::default(),
    };
    let line = result(100, Some(&floor), Some(&in_place), None, None);
    assert_eq!(line["pods"], 100);
    assert_eq!(line["in_place_s"], 12.346);
    assert_eq!(line["recreate_default_s"], Value::Null);
    assert_eq!(line["recreate_tuned_s"], Value::Null);
    // (100 + 20 GETs, 100 registrations, 100 watches) / 100 pods.
    assert_eq!(line["agent_requests_per_pod"], 3.2);
    // The 20 GETs refused 429 left out.
    assert_eq!(line["agent_requests_answered_per_pod"], 3.0);
    assert_eq!(line["floor_s"], 4.0);
    assert_eq!(line["in_place_written_s"], 12.5);
    // Both as the API server shows them: the statuses written.
    assert_eq!(line["in_place_over_floor"], 3.125);
    assert_eq!(line["responses_429"], 20.0);
    assert_eq!(line["apf_rejected_agents"], 20.0);
    assert_eq!(line["apiserver_cpu_share"], 0.5);
    assert_eq!(
        line["in_place"]["requests"]["PATCH pods/status 200"],
        5000.0
    );
    assert!(cpu_ticks(std::process::id()).is_some());
    assert!(clock_tick() > 0.0);
}
