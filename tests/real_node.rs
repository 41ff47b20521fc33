//! On a real node: kubelet v1.35 (built from the pinned `k8s.io/kubernetes` module), containerd,
//! runc and a CNI pod network, started with the control plane by
//! `scripts/control-plane.sh up DIR --node` (docs/testing.md "Real node"). Point
//! `JOBSET_INPLACE_KUBECONFIG` at `DIR/kubeconfig`; `DIR/node.env` is read beside it (or from
//! `JOBSET_INPLACE_NODE_ENV`). Without them every test here says SKIPPED loudly and passes, unless
//! `JOBSET_INPLACE_REAL_NODE=required` (or `1`), which makes them fail instead.
//!
//! The workers are the test image of `scripts/test-image.sh` (busybox and a script that records
//! each start into a volume and exits with a code when told): each test builds it and loads it
//! into the node with `scripts/control-plane.sh load-image`.
//!
//! - a pod whose worker exits non-zero under a `RestartAllContainers` rule restarts in place on
//!   the real kubelet: same UID, same IP, every container's `restartCount` one up,
//!   `AllContainersRestarting` seen, the emptyDir kept, the worker started again. What the API
//!   server saw meanwhile (phase, conditions, container states) is printed: the ground truth the
//!   test kit's kubelet is to be compared with;
//! - one group restart of the same pod shape on the real kubelet and on the test kit's
//!   simulated kubelet: the normalised sequences of what the API server served are equal
//!   (`testkit::kubelet::transitions`); without a node, the simulated side is compared with the
//!   sequence the real kubelet served in a recorded run
//!   (`transitions::REAL_KUBELET_GROUP_RESTART`), so that agreement is checked everywhere.
//!
//! With the product installed (`up DIR --node --install epoch`: node.env `INSTALL_VARIANT`), JobSets
//! of 3 pods through the installed webhook: a worker's failure restarts every pod in place behind
//! the barrier (three times in a row, none slower), a deleted pod is replaced and joins, a fatal
//! exit code fails the JobSet (story 2), user init containers and sidecars re-run, a pod that never
//! comes back is replaced after the group-restart deadline; `doctor` sees the node's feature.
//! With `--install helm:VARIANT` the same tests run on the product Helm installed from the chart
//! (node.env `INSTALL_METHOD=helm`, checked).
//!
//! With Kueue and Kubeflow Trainer started beside it (`up ... --with kueue,trainer`: DIR/addons
//! names them; `JOBSET_INPLACE_REAL_CLUSTER_ADDONS` makes their tests required, as in
//! tests/real_cluster/): a TrainJob of an InPlaceRestart ClusterTrainingRuntime runs on the
//! node and group-restarts in place; a JobSet admitted by a Kueue ClusterQueue (`waitForPodsReady`
//! on) group-restarts in place without being evicted or requeued.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use jobset_inplace::protocol::Dialect as ProductDialect;
use jobset_inplace_testkit::cluster::{
    ClusterObjects, ControlPlane, KueueQueue, TRAIN_JOB, TRAINING_RUNTIME, TestNamespace, api_of,
    create_eventually, eventually, try_eventually, workload_of,
};
use jobset_inplace_testkit::kubelet::transitions;
use jobset_inplace_testkit::kubelet::{SimConfig, Simulation};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::json;

const KUBECONFIG_ENV: &str = "JOBSET_INPLACE_KUBECONFIG";
const NODE_ENV_ENV: &str = "JOBSET_INPLACE_NODE_ENV";
const REQUIRED_ENV: &str = "JOBSET_INPLACE_REAL_NODE";
/// Each test's whole budget.
const LIMIT: Duration = Duration::from_secs(300);
/// One external command (kubectl, the image script, an image import).
const COMMAND_LIMIT: Duration = Duration::from_secs(120);
/// The image of scripts/test-image.sh (its default tag).
const TEST_IMAGE: &str = "localhost/jobset-inplace/test-worker:1";

/// With `up --taint` the real nodes are tainted (NoSchedule, `NODE_TAINT` of node.env) so that
/// only pods meant for them run there; the tests' pods tolerate it, and run on untainted nodes
/// alike.
fn real_node_toleration() -> serde_json::Value {
    json!({"key": "jobset-inplace.dev/real-node", "operator": "Equal", "value": "true",
           "effect": "NoSchedule"})
}

/// The tests take turns on the one node.
static NODE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------------
// The node
// ---------------------------------------------------------------------------------------------

struct Node {
    /// The directory of `control-plane.sh up DIR --node`.
    dir: PathBuf,
    kubeconfig: PathBuf,
    client: Client,
    /// DIR/node.env, parsed.
    env: BTreeMap<String, String>,
}

impl ControlPlane for Node {
    fn client(&self) -> &Client {
        &self.client
    }
    fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

fn required() -> bool {
    matches!(
        std::env::var(REQUIRED_ENV).as_deref(),
        Ok("required") | Ok("1")
    )
}

/// `KEY=VALUE` lines (values optionally in double quotes), as DIR/node.env has them.
fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.trim().to_owned(), v.to_owned())
        })
        .collect()
}

/// The node of `JOBSET_INPLACE_KUBECONFIG`, or `None` (and a loud SKIPPED) without one.
async fn node(test: &str) -> Option<Node> {
    let kubeconfig = std::env::var_os(KUBECONFIG_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let env_path = std::env::var_os(NODE_ENV_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            kubeconfig
                .as_ref()
                .and_then(|k| k.parent().map(|d| d.join("node.env")))
        });
    let (Some(kubeconfig), Some(env_path)) = (kubeconfig, env_path.filter(|p| p.is_file())) else {
        if required() {
            panic!(
                "{test}: {REQUIRED_ENV} is set but there is no node ({KUBECONFIG_ENV} unset, \
                 or no node.env beside it: scripts/control-plane.sh up DIR --node)"
            );
        }
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !! SKIPPED {test}: no real node (run scripts/control-plane.sh up DIR --node\n\
             !! and set {KUBECONFIG_ENV}=DIR/kubeconfig)\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        return None;
    };
    let env = parse_env_file(
        &std::fs::read_to_string(&env_path)
            .unwrap_or_else(|e| panic!("{}: {e}", env_path.display())),
    );
    let dir = env_path
        .parent()
        .expect("node.env is in the control plane's directory")
        .to_path_buf();
    let kc = Kubeconfig::read_from(&kubeconfig)
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    Some(Node {
        dir,
        kubeconfig,
        client,
        env,
    })
}

/// node.env `NODE_RESTART_GATE=off`: the kubelet runs without
/// `RestartAllContainersOnContainerExits` (`JOBSET_INPLACE_NODE_RESTART_GATE=off` at `up`).
fn gate_off(node: &Node) -> bool {
    node.env.get("NODE_RESTART_GATE").map(String::as_str) == Some("off")
}

/// Runs a test body on the node, alone and under a time limit. On a node whose kubelet runs
/// without the gate, only [`with_gateless_node`]'s test runs: every other one says SKIPPED.
async fn with_node<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    with_node_for(test, LIMIT, body).await
}

/// [`with_node`] under another time limit.
async fn with_node_for<F, Fut>(test: &str, limit: Duration, body: F)
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(node) = node(test).await else {
        return;
    };
    if gate_off(&node) {
        eprintln!(
            "\n!! SKIPPED {test}: the node's kubelet runs without RestartAllContainersOnContainerExits (NODE_RESTART_GATE=off)\n"
        );
        return;
    }
    run_on(test, node, limit, body).await;
}

/// Runs a test body on a node whose kubelet runs without the gate; SKIPPED on any other node.
async fn with_gateless_node<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(node) = node(test).await else {
        return;
    };
    if !gate_off(&node) {
        eprintln!(
            "\n!! SKIPPED {test}: the node's kubelet runs with the gate (up with JOBSET_INPLACE_NODE_RESTART_GATE=off to run it)\n"
        );
        return;
    }
    run_on(test, node, LIMIT, body).await;
}

async fn run_on<F, Fut>(test: &str, node: Node, limit: Duration, body: F)
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let _turn = NODE_LOCK.lock().await;
    tokio::time::timeout(limit, body(node))
        .await
        .unwrap_or_else(|_| panic!("{test} did not finish within {limit:?}"));
}

/// Runs a command to its end (bounded); stdout, or why it failed.
async fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(COMMAND_LIMIT, cmd.output())
        .await
        .map_err(|_| format!("{program} {args:?} did not finish within {COMMAND_LIMIT:?}"))?
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Builds the test image (scripts/test-image.sh) and imports it into the node.
async fn load_test_image(node: &Node) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let archive = tempfile::Builder::new()
        .prefix("jobset-inplace-test-image")
        .suffix(".tar")
        .tempfile()
        .expect("temp file");
    let archive = archive.path().to_str().expect("utf-8 temp path");
    let script = repo.join("scripts/test-image.sh");
    run(script.to_str().expect("utf-8 path"), &[archive, TEST_IMAGE])
        .await
        .unwrap_or_else(|e| panic!("build the test image: {e}"));
    let control_plane = repo.join("scripts/control-plane.sh");
    run(
        control_plane.to_str().expect("utf-8 path"),
        &[
            "load-image",
            node.dir.to_str().expect("utf-8 path"),
            archive,
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("load the test image: {e}"));
}

// ---------------------------------------------------------------------------------------------
// The workers' records
// ---------------------------------------------------------------------------------------------

/// One line of a worker's records (scripts/test-image/worker.sh).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    /// The line's index in the records file: the order of writing, the test's clock (see
    /// [`records_mark`]).
    seq: usize,
    event: String,
    ms: u64,
    pod: String,
    container: String,
    fields: BTreeMap<String, String>,
}

/// Parses the records file: `EVENT ms=.. pod=.. container=.. epoch=.. [key=value ...]`; lines
/// that do not parse are left out.
fn parse_records(text: &str) -> Vec<Record> {
    text.lines()
        .enumerate()
        .filter_map(|(seq, line)| {
            let mut words = line.split_whitespace();
            let event = words.next()?.to_owned();
            let mut fields: BTreeMap<String, String> = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            let ms = fields.remove("ms")?.parse().ok()?;
            let pod = fields.remove("pod")?;
            let container = fields.remove("container")?;
            Some(Record {
                seq,
                event,
                ms,
                pod,
                container,
                fields,
            })
        })
        .collect()
}

fn read_records(dir: &Path) -> Vec<Record> {
    parse_records(&std::fs::read_to_string(dir.join("records")).unwrap_or_default())
}

/// The records' mark now: the number of lines written so far (a line being written counts: it
/// is an event from before the mark). A record is "since the mark" when its `seq` is at least
/// the mark. The workers' `ms` cannot order events against the test's clock: worker.sh reads
/// the time from /proc/uptime and a file's mtime (10 ms and the kernel's coarse clock), so a
/// worker that saw its exit file at once once recorded its exit a few ms before the test's
/// `SystemTime::now()` taken before writing that file (CI, stop 28).
fn records_mark(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("records"))
        .unwrap_or_default()
        .lines()
        .count()
}

fn starts<'a>(records: &'a [Record], container: &str) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|r| r.event == "start" && r.container == container)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// What the API server saw
// ---------------------------------------------------------------------------------------------

/// One pod state as the API server served it: the phase, the conditions and each container's
/// state, one line (what the simulator is to be compared with).
fn pod_line(pod: &Pod) -> String {
    let Some(status) = pod.status.as_ref() else {
        return "no status".to_owned();
    };
    let mut line = format!("phase={}", status.phase.as_deref().unwrap_or("-"));
    for c in status.conditions.iter().flatten() {
        line.push_str(&format!(" {}={}", c.type_, c.status));
    }
    let all = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in all {
        let state = c.state.as_ref().map_or("-".to_owned(), container_state);
        let last = c
            .last_state
            .as_ref()
            .map_or("-".to_owned(), container_state);
        line.push_str(&format!(
            " | {} restarts={} ready={} started={} state={state} last={last}",
            c.name,
            c.restart_count,
            c.ready,
            c.started.unwrap_or_default()
        ));
    }
    line
}

fn container_state(s: &k8s_openapi::api::core::v1::ContainerState) -> String {
    if s.running.is_some() {
        "running".to_owned()
    } else if let Some(t) = &s.terminated {
        format!(
            "terminated({},{})",
            t.reason.as_deref().unwrap_or("-"),
            t.exit_code
        )
    } else if let Some(w) = &s.waiting {
        format!("waiting({})", w.reason.as_deref().unwrap_or("-"))
    } else {
        "-".to_owned()
    }
}

fn restart_counts(pod: &Pod) -> BTreeMap<String, i32> {
    let Some(status) = pod.status.as_ref() else {
        return BTreeMap::new();
    };
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .map(|c| (c.name.clone(), c.restart_count))
        .collect()
}

/// The containers (init containers too) running in `pod`.
fn running_containers(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .map(|c| c.name.clone())
        .collect()
}

fn all_running(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let containers: Vec<_> = status.container_statuses.iter().flatten().collect();
    // Init containers: sidecars running, the others completed.
    let inits_done = status.init_container_statuses.iter().flatten().all(|c| {
        c.state.as_ref().is_some_and(|s| {
            s.running.is_some() || s.terminated.as_ref().is_some_and(|t| t.exit_code == 0)
        })
    });
    !containers.is_empty()
        && inits_done
        && containers
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        && status.phase.as_deref() == Some("Running")
}

/// The pods that are neither terminating nor ended, by name.
fn live_of(pods: Vec<Pod>) -> BTreeMap<String, Pod> {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Failed" | "Succeeded")
            )
        })
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
        .collect()
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

// ---------------------------------------------------------------------------------------------
// Pods
// ---------------------------------------------------------------------------------------------

/// A container of the test image recording into the `records` (hostPath) and `scratch`
/// (emptyDir) volumes, restarting the whole pod on a non-zero exit.
fn worker_container(name: &str, restart_policy: &str) -> serde_json::Value {
    json!({
        "name": name,
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "restartPolicy": restart_policy,
        "restartPolicyRules": [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "CONTAINER_NAME", "value": name},
            {"name": "RECORDS", "value": "/records"},
            {"name": "SCRATCH", "value": "/scratch"}
        ],
        "volumeMounts": [
            {"name": "records", "mountPath": "/records"},
            {"name": "scratch", "mountPath": "/scratch"}
        ]
    })
}

/// A pod with a sidecar (the agent's place, `restartPolicy: Always`) and a worker, both under
/// `RestartAllContainers` on a non-zero exit as the webhook injects it, on the real node.
fn sidecar_pod(name: &str, records: &Path) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "automountServiceAccountToken": false,
            "tolerations": [real_node_toleration()],
            "initContainers": [worker_container("agent", "Always")],
            "containers": [worker_container("worker", "Never")],
            "volumes": [
                {"name": "records", "hostPath": {"path": records, "type": "Directory"}},
                {"name": "scratch", "emptyDir": {}}
            ]
        }
    }))
    .expect("pod")
}

/// The records directory: on the host, where the node's kubelet (same file system) mounts it
/// into the pods as a hostPath volume.
fn records_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("jobset-inplace-real-node")
        .tempdir()
        .expect("records directory");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod records directory");
    }
    dir
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// JobSets through the installed product (`up DIR --node --install VARIANT`)
// ---------------------------------------------------------------------------------------------

/// The names the installed variant's protocol uses (node.env `INSTALL_VARIANT`).
#[derive(Debug, Clone, Copy)]
struct Dialect {
    /// The pod annotation the agent writes its epoch into.
    epoch_annotation: &'static str,
    /// The JobSet status field of the synced epoch.
    synced: &'static str,
    /// The reconciler writes the epochs (not JobSet's own controller, as in `jobset-native`):
    /// its `GroupRestartStarted` events say what started each group restart.
    reconciler_writes: bool,
}

/// The installed product's dialect, or `None` (SKIPPED, or a panic when required) when `up` ran
/// without `--install`.
fn installed(node: &Node, test: &str) -> Option<Dialect> {
    match node.env.get("INSTALL_VARIANT").map(String::as_str) {
        Some("jobset-native") => Some(Dialect {
            epoch_annotation: "jobset.sigs.k8s.io/in-place-restart-attempt",
            synced: "currentInPlaceRestartAttempt",
            reconciler_writes: false,
        }),
        Some(_) => Some(Dialect {
            epoch_annotation: "jobset.sigs.k8s.io/epoch",
            synced: "syncedEpoch",
            reconciler_writes: true,
        }),
        None if required() => {
            panic!(
                "{test}: {REQUIRED_ENV} is set but the product is not installed (up DIR --node --install epoch)"
            )
        }
        None => {
            eprintln!(
                "\n!! SKIPPED {test}: the product is not installed (up DIR --node --install epoch)\n"
            );
            None
        }
    }
}

/// The product was installed as node.env's `INSTALL_METHOD` says (`up --install VARIANT`:
/// `manifest`; `--install helm:VARIANT`: `helm`): the webhook and reconciler Deployments carry
/// Helm's `managed-by` label exactly when Helm installed them.
async fn assert_install_method(node: &Node) {
    let method = node
        .env
        .get("INSTALL_METHOD")
        .map(String::as_str)
        .unwrap_or("manifest");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(node.client.clone(), "jobset-inplace-system");
    for name in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
        let d = deployments
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("the installed {name}: {e}"));
        let managed_by = d
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .cloned();
        assert_eq!(
            managed_by.as_deref() == Some("Helm"),
            method == "helm",
            "{name} installed with {method}: managed-by {managed_by:?}"
        );
    }
    println!("the product installed with {method}");
}

/// What is wrong with one installed pod's containers for an image pulled from a registry
/// (`up --registry --install`): every container (init ones too) must run `image` (the
/// registry's `REPOSITORY:VERSION`) and report `image_id`, `REPOSITORY@<the index digest
/// dist/ recorded>` (containerd's CRI gives the image's repo digest: the digest of what the tag
/// resolved to, here the multi-arch index, not the platform's manifest). Empty: all is well.
fn registry_image_problems(pod: &Pod, image: &str, image_id: &str) -> Vec<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let statuses: Vec<_> = status
        .init_container_statuses
        .unwrap_or_default()
        .into_iter()
        .chain(status.container_statuses.unwrap_or_default())
        .collect();
    if statuses.is_empty() {
        return vec![format!("{name}: no container statuses")];
    }
    let mut problems = Vec::new();
    for c in statuses {
        if c.image != image {
            problems.push(format!(
                "{name}/{}: image {}, want {image}",
                c.name, c.image
            ));
        }
        if c.image_id != image_id {
            problems.push(format!(
                "{name}/{}: imageID {}, want {image_id}",
                c.name, c.image_id
            ));
        }
    }
    problems
}

/// With `up DIR --node --registry --install [helm:]VARIANT` (node.env `INSTALL_SOURCE=registry`):
/// the release went through the test kit's registry as a user's does. `scripts/dist.sh --push`
/// pushed dist/'s image index and chart; the install named the registry's image (Helm: the chart
/// by `oci://`); `up` found the image on no node before. Here: every container of the webhook and
/// reconciler pods runs `REGISTRY/jobset-inplace/jobset-inplace:VERSION` with the imageID
/// `...@<dist/jobset-inplace-VERSION-oci.digest>`, and the kubelet says it pulled it
/// (`Pulled`: "Successfully pulled image"), not that it was present. Runs on a gateless node too.
/// SKIPPED when the product came from an archive import.
#[tokio::test]
async fn the_installed_product_runs_the_image_pulled_from_the_registry_dist_pushed_it_to() {
    const TEST: &str =
        "the_installed_product_runs_the_image_pulled_from_the_registry_dist_pushed_it_to";
    let Some(node) = node(TEST).await else {
        return;
    };
    if node.env.get("INSTALL_SOURCE").map(String::as_str) != Some("registry") {
        eprintln!(
            "\n!! SKIPPED {TEST}: the product was not installed from the registry (up DIR --node --registry --install VARIANT)\n"
        );
        return;
    }
    run_on(TEST, node, LIMIT, |node| async move {
        let registry = node
            .env
            .get("REGISTRY")
            .filter(|r| !r.is_empty())
            .cloned()
            .expect("node.env REGISTRY (up --registry)");
        let version = env!("CARGO_PKG_VERSION");
        let digest_file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("dist")
            .join(format!("jobset-inplace-{version}-oci.digest"));
        let digest = std::fs::read_to_string(&digest_file)
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/dist.sh writes it)", digest_file.display()))
            .trim()
            .to_owned();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{}: {digest:?} is no sha256 digest",
            digest_file.display()
        );
        let repository = format!("{registry}/jobset-inplace/jobset-inplace");
        let image = format!("{repository}:{version}");
        assert_eq!(
            node.env.get("PRODUCT_IMAGE"),
            Some(&image),
            "node.env PRODUCT_IMAGE"
        );
        let image_id = format!("{repository}@{digest}");
        let pods: Api<Pod> = Api::namespaced(node.client.clone(), "jobset-inplace-system");
        let mut seen = 0;
        for component in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
            let list = pods
                .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={component}")))
                .await
                .unwrap_or_else(|e| panic!("the {component} pods: {e}"));
            assert!(!list.items.is_empty(), "no {component} pod");
            for pod in &list.items {
                let problems = registry_image_problems(pod, &image, &image_id);
                assert!(problems.is_empty(), "{}", problems.join("\n"));
                seen += 1;
            }
        }
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(node.client.clone(), "jobset-inplace-system");
        let pulled: Vec<String> = events
            .list(&ListParams::default().fields("reason=Pulled"))
            .await
            .expect("the namespace's Pulled events")
            .items
            .into_iter()
            .filter_map(|e| e.message)
            .filter(|m| m.contains(&format!("\"{image}\"")))
            .collect();
        assert!(
            pulled
                .iter()
                .any(|m| m.starts_with("Successfully pulled image")),
            "no kubelet event says it pulled {image}: {pulled:?}"
        );
        println!(
            "{seen} pods run {image} as {image_id} (dist/'s digest), pulled from the registry: {:?}",
            pulled.first()
        );
    })
    .await;
}

fn jobset_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet");
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

/// A container of the test image in a JobSet: records with the epoch its pod had when it started
/// (the downward API resolves the annotation at each container start).
fn jobset_worker(name: &str, dialect: Dialect) -> serde_json::Value {
    json!({
        "name": name,
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "CONTAINER_NAME", "value": name},
            {"name": "EPOCH", "valueFrom": {"fieldRef": {
                "fieldPath": format!("metadata.annotations['{}']", dialect.epoch_annotation)}}},
            {"name": "RECORDS", "value": "/records"},
            {"name": "SCRATCH", "value": "/scratch"}
        ],
        "volumeMounts": [
            {"name": "records", "mountPath": "/records"},
            {"name": "scratch", "mountPath": "/scratch"}
        ]
    })
}

/// The JobSet's worker as a user writes it (README, story 1): `restartPolicy: Never` and a
/// `RestartAllContainers` rule on every exit code but `not` (the webhook injects the agent only).
fn restarting_worker(dialect: Dialect, not: &[i32]) -> serde_json::Value {
    let mut worker = jobset_worker("worker", dialect);
    worker["restartPolicy"] = json!("Never");
    worker["restartPolicyRules"] = json!([
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": not}}
    ]);
    worker
}

/// A plain InPlaceRestart JobSet `train` of one Job of `pods` pods on the real node, as JobSet's
/// own webhook requires it (backoffLimit MaxInt32, podReplacementPolicy Failed, completions =
/// parallelism); `edit` changes it before it is sent.
fn train_jobset(
    pods: usize,
    records: &Path,
    dialect: Dialect,
    edit: impl FnOnce(&mut serde_json::Value),
) -> DynamicObject {
    let mut js = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train"},
        "spec": {
            "failurePolicy": {"maxRestarts": 20, "restartStrategy": "InPlaceRestart"},
            "replicatedJobs": [{
                "name": "workers",
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": pods,
                    "completions": pods,
                    "backoffLimit": 2147483647,
                    "podReplacementPolicy": "Failed",
                    "template": {"spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 30,
                        "tolerations": [real_node_toleration()],
                        "containers": [restarting_worker(dialect, &[0])],
                        "volumes": [
                            {"name": "records", "hostPath": {"path": records, "type": "Directory"}},
                            {"name": "scratch", "emptyDir": {}}
                        ]
                    }}
                }}
            }]
        }
    });
    edit(&mut js);
    serde_json::from_value(js).expect("JobSet")
}

/// [`train_jobset`]'s JobSet as JobSet's own recreation runs it: no InPlaceRestart (`Recreate`,
/// maxRestarts 20), the Job failing at its first pod failure (`backoffLimit: 0`, its default
/// `podReplacementPolicy`), a plain worker (no restart rules); the webhook leaves it alone.
fn recreating(js: &mut serde_json::Value, dialect: Dialect) {
    js["spec"]["failurePolicy"] = json!({"maxRestarts": 20});
    let job = &mut js["spec"]["replicatedJobs"][0]["template"]["spec"];
    job["backoffLimit"] = json!(0);
    job.as_object_mut()
        .map(|o| o.remove("podReplacementPolicy"));
    job["template"]["spec"]["containers"] = json!([jobset_worker("worker", dialect)]);
}

/// Creates `js`, which the webhook must leave alone (a JobSet without InPlaceRestart).
async fn create_not_injected(jobsets: &Api<DynamicObject>, js: &DynamicObject) {
    let created = jobsets
        .create(&PostParams::default(), js)
        .await
        .unwrap_or_else(|e| panic!("create the JobSet: {e}"));
    let spec = serde_json::to_string(&created.data["spec"]).unwrap_or_default();
    assert!(
        !spec.contains("jobset-inplace-agent"),
        "not injected: {spec}"
    );
}

/// One JobSet of the test on the node: its namespace, records and APIs.
struct Run {
    _ns: TestNamespace,
    records: tempfile::TempDir,
    pods: Api<Pod>,
    jobsets: Api<DynamicObject>,
    dialect: Dialect,
    size: usize,
    /// The name of the worker container (its records' `container`, its exit file).
    worker: &'static str,
}

impl Run {
    /// Loads the test image, creates the namespace and the JobSet (through the installed
    /// webhook: it must come back injected), and waits for every worker running.
    async fn start(
        node: &Node,
        prefix: &str,
        size: usize,
        dialect: Dialect,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> (Self, Group) {
        let run = Run::prepare(node, prefix, size, dialect).await;
        let js = train_jobset(size, run.records.path(), dialect, edit);
        let created = run
            .jobsets
            .create(&PostParams::default(), &js)
            .await
            .unwrap_or_else(|e| panic!("create the JobSet: {e}"));
        assert_injected(&created);
        let group = run.running(None, 0, Duration::from_secs(150)).await;
        (run, group)
    }

    /// The test image loaded, the namespace and the records made; no JobSet yet (the test
    /// creates `train`, or has it created).
    async fn prepare(node: &Node, prefix: &str, size: usize, dialect: Dialect) -> Self {
        load_test_image(node).await;
        let ns = TestNamespace::create(node, prefix).await;
        let records = records_dir();
        let pods: Api<Pod> = Api::namespaced(node.client.clone(), &ns.name);
        let jobsets = jobset_api(&node.client, &ns.name);
        Run {
            _ns: ns,
            records,
            pods,
            jobsets,
            dialect,
            size,
            worker: "worker",
        }
    }

    /// The worker container is `name` (not `worker`).
    fn set_worker(&mut self, name: &'static str) {
        self.worker = name;
    }

    fn namespace(&self) -> &str {
        &self._ns.name
    }

    fn records(&self) -> Vec<Record> {
        read_records(self.records.path())
    }

    /// The records' mark now ([`records_mark`]).
    fn mark(&self) -> usize {
        records_mark(self.records.path())
    }

    /// The JobSet's pods that are not terminating, by name.
    async fn live_pods(&self) -> Result<BTreeMap<String, Pod>, String> {
        let list = self
            .pods
            .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=train"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(live_of(list.items))
    }

    /// Waits until `size` pods run every container, all at one epoch (above `above` when
    /// given), each with its worker started since the records' mark `since` ([`records_mark`]).
    ///
    /// The workers' own `EPOCH` (the downward API, resolved from the kubelet's copy of the pod)
    /// is not relied on: twice a worker's last start was not recorded at its pod's epoch within
    /// 150 s (cause not pinned down; the kubelet's copy may lag the agent's patch). Starts are
    /// told apart by the records' order instead, and a mismatch is printed.
    async fn running(&self, above: Option<u64>, since: usize, limit: Duration) -> Group {
        let waited = try_eventually(limit, || async {
            let pods = self.live_pods().await?;
            if pods.len() != self.size {
                return Err(format!("{} pods: {:?}", pods.len(), pods.keys()));
            }
            let mut epoch = None;
            for (name, p) in &pods {
                if !all_running(p) {
                    return Err(format!("{name}: {}", pod_line(p)));
                }
                let e = pod_epoch(p, self.dialect).ok_or(format!("{name}: no epoch"))?;
                if epoch.is_some_and(|x| x != e) || above.is_some_and(|a| e <= a) {
                    return Err(format!("{name}: epoch {e}"));
                }
                epoch = Some(e);
            }
            let epoch = epoch.ok_or("no pods")?;
            let recs = self.records();
            for name in pods.keys() {
                let last = recs
                    .iter()
                    .rfind(|r| r.event == "start" && r.container == self.worker && &r.pod == name)
                    .filter(|r| r.seq >= since)
                    .ok_or(format!("{name}: worker not started since {since}"))?;
                let seen = last.fields.get("epoch").map(String::as_str).unwrap_or("");
                if seen != epoch.to_string() {
                    println!(
                        "note: {name}'s worker started with EPOCH={seen:?}, the pod at {epoch}"
                    );
                }
            }
            Ok(Group { pods, epoch })
        })
        .await;
        match waited {
            Ok(group) => group,
            Err(e) => panic!(
                "every worker running: not within {limit:?}: {e}\n{}",
                self.diagnosis().await
            ),
        }
    }

    /// What a failed wait prints besides its last error: the reconciler's replicas (restarts,
    /// the tail of each one's log, the previous container's too) and the tail of the agent's log
    /// in each pod of the JobSet that is not running every container.
    async fn diagnosis(&self) -> String {
        const TAIL: i64 = 40;
        let client = self.pods.clone().into_client();
        let system: Api<Pod> = Api::namespaced(client, "jobset-inplace-system");
        let mut out = String::new();
        let reconcilers = system
            .list(&ListParams::default().labels("app.kubernetes.io/name=jobset-inplace-reconciler"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for pod in &reconcilers {
            let name = pod.metadata.name.clone().unwrap_or_default();
            out.push_str(&format!("--- reconciler {name}: {}\n", pod_line(pod)));
            for previous in [true, false] {
                let params = kube::api::LogParams {
                    previous,
                    tail_lines: Some(TAIL),
                    ..Default::default()
                };
                if let Ok(log) = system.logs(&name, &params).await {
                    let which = if previous { "previous" } else { "current" };
                    out.push_str(&format!("--- its {which} container's log:\n{log}\n"));
                }
            }
        }
        let pods = self.live_pods().await.unwrap_or_default();
        for (name, pod) in pods.iter().filter(|(_, p)| !all_running(p)) {
            let params = kube::api::LogParams {
                container: Some("jobset-inplace-agent".to_owned()),
                tail_lines: Some(TAIL),
                ..Default::default()
            };
            let log = self
                .pods
                .logs(name, &params)
                .await
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!("--- {name}'s agent: {}\n{log}\n", pod_line(pod)));
        }
        out
    }

    /// The notes of the reconciler's `GroupRestartStarted` events on the JobSet. kube's event
    /// recorder keeps one series per JobSet and reason, with its first note: the first group
    /// restart's.
    async fn restarts_started(&self) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.pods.clone().into_client(), self.namespace());
        let list = events
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("list events: {e}"));
        list.items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("GroupRestartStarted"))
            .filter_map(|e| e.note)
            .collect()
    }

    /// The first group restart was started early (the failing pod's `AllContainersRestarting`
    /// condition, docs/protocol.md "Early failure detection") when `early` names that pod, or
    /// by a registration (`None`). Nothing to check where JobSet's own controller writes the
    /// epochs.
    async fn assert_started_by(&self, early: Option<&str>) {
        if !self.dialect.reconciler_writes {
            return;
        }
        eventually(
            "the GroupRestartStarted event",
            Duration::from_secs(20),
            || async {
                let notes = self.restarts_started().await;
                let note = notes.first().ok_or("no event yet")?;
                let by_early = note.contains("is restarting)");
                match early {
                    Some(pod) if note.contains(&format!("(pod {pod} is restarting)")) => Ok(()),
                    None if !by_early => Ok(()),
                    _ => Err(format!("expected early={early:?}: {note:?}")),
                }
            },
        )
        .await;
    }

    /// Each pod's agent's own figure: from its process start to its registration (its log line
    /// `registered epoch N after M ms`), the last one it logged.
    async fn registration_ms(&self, pods: &Group) -> BTreeMap<String, u64> {
        let params = kube::api::LogParams {
            container: Some("jobset-inplace-agent".to_owned()),
            ..Default::default()
        };
        let mut out = BTreeMap::new();
        for name in pods.pods.keys() {
            let Ok(log) = self.pods.logs(name, &params).await else {
                continue;
            };
            let ms = log
                .lines()
                .filter(|l| l.contains("registered epoch"))
                .filter_map(|l| l.split_once(" after ").map(|(_, rest)| rest))
                .filter_map(|rest| rest.split(" ms").next()?.trim().parse::<u64>().ok())
                .next_back();
            if let Some(ms) = ms {
                out.insert(name.clone(), ms);
            }
        }
        out
    }

    /// The JobSet's synced epoch (status), if written.
    async fn synced(&self) -> Option<u64> {
        let js = self.jobsets.get("train").await.ok()?;
        js.data["status"][self.dialect.synced].as_u64()
    }

    /// Tells the worker of `pod` to exit with `code`.
    fn exit(&self, pod: &str, code: i32) {
        std::fs::write(
            self.records
                .path()
                .join(format!("exit-{pod}-{}", self.worker)),
            code.to_string(),
        )
        .expect("exit file");
    }
}

/// The installed webhook injected the agent and a `RestartAllContainers` rule into `js`.
fn assert_injected(js: &DynamicObject) {
    let spec = serde_json::to_string(&js.data["spec"]).unwrap_or_default();
    assert!(
        spec.contains("jobset-inplace-agent") && spec.contains("RestartAllContainers"),
        "the installed webhook injected the agent: {spec}"
    );
}

/// The group at one moment: every pod running at `epoch`.
#[derive(Debug, Clone)]
struct Group {
    pods: BTreeMap<String, Pod>,
    epoch: u64,
}

fn pod_epoch(pod: &Pod, dialect: Dialect) -> Option<u64> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(dialect.epoch_annotation)?
        .parse()
        .ok()
}

/// Every pod of `before` is in `after` in place: same UID, same IP, every container's
/// `restartCount` one up.
fn assert_in_place(before: &Group, after: &Group, except: &[&str]) {
    for (name, b) in &before.pods {
        if except.contains(&name.as_str()) {
            continue;
        }
        let a = after
            .pods
            .get(name)
            .unwrap_or_else(|| panic!("{name} was recreated: after {:?}", after.pods.keys()));
        assert_eq!(a.metadata.uid, b.metadata.uid, "{name}: same UID");
        let ip = |p: &Pod| p.status.as_ref().and_then(|s| s.pod_ip.clone());
        assert_eq!(ip(a), ip(b), "{name}: same IP");
        // Every container that ran (a completed init container re-runs, its count aside).
        let (cb, ca) = (restart_counts(b), restart_counts(a));
        let running = running_containers(b);
        assert!(
            running.len() >= 2,
            "{name}: agent and worker running: {cb:?}"
        );
        for c in &running {
            assert_eq!(
                ca.get(c),
                cb.get(c).map(|n| n + 1).as_ref(),
                "{name}: {c} restarted once: {cb:?} -> {ca:?}"
            );
        }
    }
}

/// The barrier from the workers' own records: every old worker recorded its end (exit or
/// SIGTERM) since the records' mark `since` before any new one started. Returns the time from the first end of an old
/// worker (the failure) to the last start of a new one (every worker running again).
fn assert_barrier(records: &[Record], since: usize, pods: usize) -> Duration {
    assert_barrier_of(records, since, pods, "worker")
}

/// [`assert_barrier`] of the workers named `container`.
fn assert_barrier_of(records: &[Record], since: usize, pods: usize, container: &str) -> Duration {
    let worker = |r: &&Record| r.container == container && r.seq >= since;
    // Since the failure, only old workers end and only new ones start.
    let ends: Vec<&Record> = records
        .iter()
        .filter(|r| worker(r) && (r.event == "exit" || r.event == "stop"))
        .collect();
    let starts: Vec<&Record> = records
        .iter()
        .filter(|r| worker(r) && r.event == "start")
        .collect();
    assert_eq!(starts.len(), pods, "one new start per pod: {records:#?}");
    assert_eq!(ends.len(), pods, "every old worker ended: {records:#?}");
    let last_end = ends.iter().map(|r| r.ms).max().expect("old workers' ends");
    let first_end = ends.iter().map(|r| r.ms).min().expect("old workers' ends");
    let first_start = starts.iter().map(|r| r.ms).min().expect("new starts");
    let last_start = starts.iter().map(|r| r.ms).max().expect("new starts");
    assert!(
        last_end <= first_start,
        "no new worker started ({first_start}) before every old one ended ({last_end}): \
         {records:#?}"
    );
    Duration::from_millis(last_start.saturating_sub(first_end))
}

/// One group restart: the worker of the first pod exits with `code`; waits for every worker
/// running again one epoch up, checks it happened in place and behind the barrier, and returns
/// the group after it and the time from the failure to every worker running.
async fn group_restart(run: &Run, before: &Group, code: i32) -> (Group, Duration) {
    let failing = before.pods.keys().next().expect("a pod").clone();
    let old_ends = run
        .records()
        .iter()
        .filter(|r| r.container == run.worker && r.event != "start")
        .count();
    let since = run.mark();
    run.exit(&failing, code);
    let after = run
        .running(Some(before.epoch), since, Duration::from_secs(120))
        .await;
    assert_eq!(after.epoch, before.epoch + 1, "the epoch moves by one");
    assert_in_place(before, &after, &[]);
    let recs = run.records();
    let exit = recs
        .iter()
        .filter(|r| r.container == run.worker && r.event != "start")
        .nth(old_ends);
    assert!(exit.is_some(), "the failing worker recorded its end");
    // By the records' order, not by the worker's `EPOCH`: the downward API resolves the annotation from the
    // kubelet's copy of the pod, which can lag the agent's patch (a first start once saw "").
    assert!(
        recs.iter().any(|r| r.event == "exit"
            && r.pod == failing
            && r.seq >= since
            && r.fields.get("code") == Some(&code.to_string())),
        "{failing}'s worker exited {code} since the failure: {recs:#?}"
    );
    let took = assert_barrier_of(&recs, since, run.size, run.worker);
    // The synced epoch follows (the reconciler writes the status after the JobSetEpoch).
    eventually("the synced epoch", Duration::from_secs(30), || async {
        match run.synced().await {
            Some(s) if s == after.epoch => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    (after, took)
}

/// 3 pods; a worker exits with the restart code (42), then with another non-zero code (3): each
/// time every pod restarts in place, behind the barrier, one epoch up. (The worker carries the
/// user's `RestartAllContainers` rule, as in story 1.) The product came in as node.env's
/// `INSTALL_METHOD` says (.ci/run: the release manifest for epoch, the Helm chart for
/// jobset-native).
#[tokio::test]
async fn a_worker_failure_restarts_the_jobset_in_place_through_the_installed_product() {
    const TEST: &str =
        "a_worker_failure_restarts_the_jobset_in_place_through_the_installed_product";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        assert_install_method(&node).await;
        let (run, first) = Run::start(&node, "rn-jobset", 3, dialect, |_| {}).await;
        println!("running at epoch {}: {:?}", first.epoch, first.pods.keys());
        let failing = first.pods.keys().next().expect("a pod").clone();
        let (second, took_42) = group_restart(&run, &first, 42).await;
        println!(
            "restart code 42: every worker running again after {} ms",
            took_42.as_millis()
        );
        // Started by the failing pod's kubelet, not by its new agent's registration.
        run.assert_started_by(Some(&failing)).await;
        println!(
            "each agent, from its process start to its registration (ms): {:?}",
            run.registration_ms(&second).await
        );
        let (_, took_3) = group_restart(&run, &second, 3).await;
        println!(
            "exit code 3: every worker running again after {} ms",
            took_3.as_millis()
        );
    })
    .await;
}

/// Three group restarts in a row through the installed product: none slower than the first
/// (sidecar mode is not backed off; CrashLoopBackOff would add 10 s, then 20 s).
#[tokio::test]
async fn three_jobset_group_restarts_in_a_row_are_not_backed_off() {
    const TEST: &str = "three_jobset_group_restarts_in_a_row_are_not_backed_off";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, mut group) = Run::start(&node, "rn-thrice", 3, dialect, |_| {}).await;
        let mut took = Vec::new();
        for round in 1..=3 {
            let (after, t) = group_restart(&run, &group, 42).await;
            println!(
                "group restart {round}: every worker running again after {} ms",
                t.as_millis()
            );
            took.push(t);
            group = after;
        }
        let limit = took[0] + Duration::from_secs(5);
        assert!(
            took.iter().all(|t| *t <= limit),
            "no group restart slower than the first by 5 s or more (back-off): {took:?}"
        );
    })
    .await;
}

/// A pod deleted (the seeds' second failure source): the Job replaces it, the replacement
/// joins one epoch up, the other pods restart in place behind the barrier.
#[tokio::test]
async fn a_deleted_pod_is_replaced_and_the_others_restart_in_place() {
    const TEST: &str = "a_deleted_pod_is_replaced_and_the_others_restart_in_place";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-deleted", 3, dialect, |_| {}).await;
        let victim = first.pods.keys().next().expect("a pod").clone();
        let since = run.mark();
        run.pods
            .delete(&victim, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete {victim}: {e}"));
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(150))
            .await;
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        assert!(!after.pods.contains_key(&victim), "{victim} replaced");
        let new: Vec<_> = after
            .pods
            .keys()
            .filter(|n| !first.pods.contains_key(*n))
            .collect();
        assert_eq!(new.len(), 1, "one replacement: {new:?}");
        assert_in_place(&first, &after, &[victim.as_str()]);
        // A deletion is no exit under a rule: the replacement's registration started it.
        run.assert_started_by(None).await;
        let took = assert_barrier(&run.records(), since, run.size);
        println!(
            "pod deleted: every worker running again {} ms after the deleted pod's worker stopped",
            took.as_millis()
        );
    })
    .await;
}

/// Story 2: a worker exits with a code the Job's pod failure policy fails the Job for
/// (FailJob, then the JobSet's FailJobSet rule): the webhook leaves that code out of the restart
/// rule, the JobSet fails, nothing restarts in place.
#[tokio::test]
async fn a_fatal_exit_fails_the_jobset_and_nothing_restarts_in_place() {
    const TEST: &str = "a_fatal_exit_fails_the_jobset_and_nothing_restarts_in_place";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-fatal", 3, dialect, |js| {
            js["spec"]["failurePolicy"]["rules"] = json!([{
                "name": "failOnUnrecoverable",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"]
            }]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"] =
                json!([restarting_worker(dialect, &[0, 13])]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] = json!({
                "rules": [{"action": "FailJob", "onExitCodes": {
                    "containerName": "worker", "operator": "In", "values": [13]}}]
            });
        })
        .await;
        let failing = first.pods.keys().next().expect("a pod").clone();
        run.exit(&failing, 13);
        eventually("the JobSet failed", Duration::from_secs(90), || async {
            let js = run.jobsets.get("train").await.map_err(|e| e.to_string())?;
            let failed = js.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Failed" && c["status"] == "True");
            failed
                .then_some(())
                .ok_or_else(|| format!("{}", js.data["status"]))
        })
        .await;
        // Nothing restarted in place: no worker started again, no restart counted on any pod
        // left, the JobSet's epoch where it was.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let recs = run.records();
        assert_eq!(
            starts(&recs, "worker").len(),
            3,
            "no worker started again: {recs:#?}"
        );
        let left = run
            .pods
            .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=train"))
            .await
            .expect("pods");
        for p in &left.items {
            let counts = restart_counts(p);
            assert!(
                counts.values().all(|c| *c == 0),
                "{:?} restarted: {}",
                p.metadata.name,
                pod_line(p)
            );
        }
        // A fatal code is left out of the rule: the kubelet never began a restart, and no
        // group restart started, early or not.
        let notes = run.restarts_started().await;
        assert!(notes.is_empty(), "no group restart: {notes:?}");
        // (JobSet's controller's status write on failure may wipe the field; never above.)
        let synced = run.synced().await;
        assert!(
            synced.is_none_or(|s| s == first.epoch),
            "the epoch did not move: {synced:?}"
        );
    })
    .await;
}

/// A worker that exits 0 matches no restart rule (`NotIn [0, ...]`): its pod completes, the
/// kubelet begins no restart (`AllContainersRestarting` never `True`), no group restart starts,
/// early or not, and the other pods run on.
#[tokio::test]
async fn a_worker_exiting_zero_starts_no_group_restart() {
    const TEST: &str = "a_worker_exiting_zero_starts_no_group_restart";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-zero", 2, dialect, |_| {}).await;
        let mut names = first.pods.keys();
        let done = names.next().expect("a pod").clone();
        let other = names.next().expect("another pod").clone();
        run.exit(&done, 0);
        eventually("the pod completed", Duration::from_secs(60), || async {
            let p = run.pods.get(&done).await.map_err(|e| e.to_string())?;
            match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Succeeded") => Ok(p),
                _ => Err(pod_line(&p)),
            }
        })
        .await;
        // Long enough for a relist, a reconcile and an event.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let p = run.pods.get(&done).await.expect("the completed pod");
        assert_ne!(
            condition(&p, "AllContainersRestarting").as_deref(),
            Some("True"),
            "{}",
            pod_line(&p)
        );
        let notes = run.restarts_started().await;
        assert!(notes.is_empty(), "no group restart: {notes:?}");
        let q = run.pods.get(&other).await.expect("the other pod");
        assert!(all_running(&q), "{other} runs on: {}", pod_line(&q));
        assert!(
            restart_counts(&q).values().all(|c| *c == 0),
            "{other} did not restart: {}",
            pod_line(&q)
        );
    })
    .await;
}

/// A user init container and a user sidecar before the agent (the webhook appends the agent
/// to `initContainers`): on a group restart the real kubelet runs them again, before the agent,
/// and the barrier still holds.
#[tokio::test]
async fn user_init_containers_and_sidecars_re_run_and_the_barrier_holds() {
    const TEST: &str = "user_init_containers_and_sidecars_re_run_and_the_barrier_holds";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-inits", 3, dialect, |js| {
            let mut init = jobset_worker("init", dialect);
            init["env"]
                .as_array_mut()
                .expect("env")
                .push(json!({"name": "EXIT_AFTER", "value": "0"}));
            let mut sidecar = jobset_worker("sidecar", dialect);
            sidecar["restartPolicy"] = json!("Always");
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                ["initContainers"] = json!([init, sidecar]);
        })
        .await;
        let (after, took) = group_restart(&run, &first, 42).await;
        let recs = run.records();
        for name in after.pods.keys() {
            for c in ["init", "sidecar"] {
                let n = recs
                    .iter()
                    .filter(|r| r.event == "start" && r.container == c && &r.pod == name)
                    .count();
                assert_eq!(n, 2, "{name}: {c} ran again: {recs:#?}");
            }
            // The user's init containers run before the new worker.
            let worker_start = recs
                .iter()
                .rfind(|r| r.event == "start" && r.container == "worker" && &r.pod == name)
                .expect("worker start");
            let init_start = recs
                .iter()
                .rfind(|r| r.event == "start" && r.container == "init" && &r.pod == name)
                .expect("init start");
            assert!(
                init_start.ms <= worker_start.ms,
                "{name}: init before worker"
            );
        }
        println!(
            "with a user init container and sidecar: every worker running again after {} ms",
            took.as_millis()
        );
    })
    .await;
}

/// The group-restart deadline on a real node: one pod's restart hangs before its agent (a user
/// init container that hangs on that pod's second run), so it never registers. After the
/// JobSet's `jobset-inplace.dev/group-restart-timeout` the reconciler fails and deletes it
/// (docs/protocol.md "Deadline", step 1), the Job replaces it, the replacement registers and the
/// group completes: every worker running one epoch up or more, the other pods restarted in place.
#[tokio::test]
async fn a_pod_that_never_comes_back_is_replaced_after_the_deadline() {
    const TEST: &str = "a_pod_that_never_comes_back_is_replaced_after_the_deadline";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        let (run, first) = Run::start(&node, "rn-deadline", 3, dialect, |js| {
            js["metadata"]["annotations"] =
                json!({"jobset-inplace.dev/group-restart-timeout": "15s"});
            // Hangs when RECORDS/hang-<pod> exists, then runs as the worker script to exit 0.
            let mut init = jobset_worker("init", dialect);
            init["command"] = json!([
                "/bin/sh", "-c",
                "if [ -f /records/hang-$POD_NAME ]; then echo hang ms=0 pod=$POD_NAME container=init >>/records/records; exec sleep 3600; fi; EXIT_AFTER=0 exec /bin/sh /worker"
            ]);
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                ["initContainers"] = json!([init]);
        })
        .await;
        let mut names = first.pods.keys();
        let failing = names.next().expect("a pod").clone();
        let hanging = names.next().expect("a second pod").clone();
        std::fs::write(run.records.path().join(format!("hang-{hanging}")), "").expect("hang file");
        let failed_at = Instant::now();
        let since = run.mark();
        run.exit(&failing, 42);
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(150))
            .await;
        let took = failed_at.elapsed();
        assert!(!after.pods.contains_key(&hanging), "{hanging} replaced: {:?}", after.pods.keys());
        assert_in_place(&first, &after, &[hanging.as_str()]);
        assert!(
            took >= Duration::from_secs(15),
            "the group waited for the deadline ({took:?})"
        );
        let recs = run.records();
        assert!(
            recs.iter().any(|r| r.event == "hang" && r.pod == hanging),
            "{hanging} hung before its agent: {recs:#?}"
        );
        println!(
            "a pod that never came back: replaced after the 15 s deadline, every worker running \
             again at epoch {} after {} ms",
            after.epoch,
            took.as_millis()
        );
    })
    .await;
}

/// `doctor` against the real node: its kubelet runs with the gate, declares the feature
/// (`node.status.declaredFeatures`), and `doctor`'s node check says so (its unit tests name the
/// nodes that do not).
#[tokio::test]
async fn doctor_sees_the_real_node_declare_the_feature() {
    const TEST: &str = "doctor_sees_the_real_node_declare_the_feature";
    with_node(TEST, |node| async move {
        if installed(&node, TEST).is_none() {
            return;
        }
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .arg("doctor")
            .env("KUBECONFIG", &node.kubeconfig)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(COMMAND_LIMIT, out)
            .await
            .expect("doctor within its time")
            .expect("run doctor");
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}");
        assert!(
            text.lines().any(|l| l.starts_with("ok")
                && l.contains(
                    "node-features: all 1 node(s) declare RestartAllContainersOnContainerExits"
                )),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The headline: the kubelet's own floor, in place (1 and 8 pods) and JobSet's own recreation,
// same node, same run
// ---------------------------------------------------------------------------------------------

/// Pods of the headline's JobSets (the issue asks for 8).
const HEADLINE_PODS: usize = 8;
/// Failures measured per case.
const HEADLINE_ROUNDS: usize = 5;
/// The exit code of the headline's failures (non-zero: under `RestartAllContainers`).
const HEADLINE_CODE: i32 = 42;

/// Waits until `size` live pods of `selector` in `pods` each run their worker, started since the
/// records' mark `since` ([`records_mark`]); returns the pods by name.
async fn workers_running_since(
    pods: &Api<Pod>,
    records: &Path,
    selector: &str,
    size: usize,
    since: usize,
) -> BTreeMap<String, Pod> {
    eventually(
        "every worker running again",
        Duration::from_secs(240),
        || async {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| e.to_string())?;
            let live = live_of(list.items);
            if live.len() != size {
                return Err(format!("{} live pods", live.len()));
            }
            let recs = read_records(records);
            for (name, p) in &live {
                if !all_running(p) {
                    return Err(format!("{name}: {}", pod_line(p)));
                }
                recs.iter()
                    .rfind(|r| r.event == "start" && r.container == "worker" && &r.pod == name)
                    .filter(|r| r.seq >= since)
                    .ok_or(format!("{name}: worker not started since {since}"))?;
            }
            Ok(live)
        },
    )
    .await
}

/// The worker of `failing` exits with [`HEADLINE_CODE`]; waits for `size` pods of `selector`
/// running their workers again. Returns the pods and the records' mark taken before the exit.
async fn fail_and_recover(
    pods: &Api<Pod>,
    records: &Path,
    selector: &str,
    size: usize,
    failing: &str,
) -> (BTreeMap<String, Pod>, usize) {
    let since = records_mark(records);
    std::fs::write(
        records.join(format!("exit-{failing}-worker")),
        HEADLINE_CODE.to_string(),
    )
    .expect("exit file");
    let live = workers_running_since(pods, records, selector, size, since).await;
    (live, since)
}

/// A pod's place across a recreation: its name without the random suffix (a Job's pod
/// `JOB-INDEX-RANDOM` keeps `JOB-INDEX`; a pod restarted in place keeps its whole name anyway).
fn pod_slot(pod: &str) -> &str {
    pod.rsplit_once('-').map_or(pod, |(slot, _)| slot)
}

/// One worker's way through a failure, in ms after the failing worker's end: its own end (`exit`
/// or `stop`, the SIGTERM) and its next start.
#[derive(Debug, Clone)]
struct Gap {
    slot: String,
    end_event: String,
    end: u64,
    start: Option<u64>,
}

/// One failure of a headline case, from the workers' records since its mark: the failing
/// worker's end to the last worker's start, and every worker's end-to-start gap.
#[derive(Debug, Clone)]
struct Failure {
    took: Duration,
    gaps: Vec<Gap>,
}

fn failure_since(records: &[Record], since: usize) -> Failure {
    let worker: Vec<&Record> = records
        .iter()
        .filter(|r| r.container == "worker" && r.seq >= since)
        .collect();
    let first_end = worker
        .iter()
        .filter(|r| r.event != "start")
        .map(|r| r.ms)
        .min()
        .expect("the failing worker's end");
    let last_start = worker
        .iter()
        .filter(|r| r.event == "start")
        .map(|r| r.ms)
        .max()
        .expect("the new workers' starts");
    let mut gaps: Vec<Gap> = Vec::new();
    for end in worker.iter().filter(|r| r.event != "start") {
        let slot = pod_slot(&end.pod);
        if gaps.iter().any(|g| g.slot == slot) {
            continue;
        }
        let start = worker
            .iter()
            .find(|r| r.event == "start" && r.seq > end.seq && pod_slot(&r.pod) == slot);
        gaps.push(Gap {
            slot: slot.to_owned(),
            end_event: end.event.clone(),
            end: end.ms.saturating_sub(first_end),
            start: start.map(|s| s.ms.saturating_sub(first_end)),
        });
    }
    gaps.sort_by_key(|g| (g.end, g.slot.clone()));
    Failure {
        took: Duration::from_millis(last_start.saturating_sub(first_end)),
        gaps,
    }
}

/// One case of the headline: its failures, printed as they come.
struct Case {
    name: &'static str,
    failures: Vec<Failure>,
}

impl Case {
    fn new(name: &'static str) -> Self {
        Case {
            name,
            failures: Vec::new(),
        }
    }

    /// Records the failure since the mark `since` and prints it: the total, then each worker's
    /// end and next start (ms after the failing worker's end) and the gap between them.
    fn add(&mut self, records: &[Record], since: usize) {
        let f = failure_since(records, since);
        println!(
            "{}, failure {}: {} ms from the failing worker's end to the last worker's start",
            self.name,
            self.failures.len() + 1,
            f.took.as_millis()
        );
        for g in &f.gaps {
            let start = g.start.map_or("none".to_owned(), |s| format!("+{s}"));
            let gap = g
                .start
                .map_or("-".to_owned(), |s| s.saturating_sub(g.end).to_string());
            println!(
                "  {:<24} {:>4} +{:<5} start {:<6} gap {gap} ms",
                g.slot, g.end_event, g.end, start
            );
        }
        self.failures.push(f);
    }

    fn took(&self) -> Vec<u128> {
        self.failures.iter().map(|f| f.took.as_millis()).collect()
    }

    /// The end-to-start gaps of each failure, ms.
    fn gaps(&self) -> Vec<Vec<Option<u64>>> {
        self.failures
            .iter()
            .map(|f| {
                f.gaps
                    .iter()
                    .map(|g| g.start.map(|s| s.saturating_sub(g.end)))
                    .collect()
            })
            .collect()
    }

    fn median_ms(&self) -> f64 {
        let mut v = self.took();
        v.sort_unstable();
        v[v.len() / 2] as f64
    }
}

/// The headline in one run on the real node, a worker failing [`HEADLINE_ROUNDS`] times in each
/// case: the kubelet's own floor (one bare pod, a plain sidecar and a worker under
/// `RestartAllContainers`: no JobSet, no product), an `InPlaceRestart` JobSet of 1 and of
/// [`HEADLINE_PODS`] pods through the installed product, and JobSet's own recreation of the same
/// pods (`Recreate`, Job `backoffLimit: 0`). Per failure, the time from the failing worker's
/// exit to the last worker's start and each worker's end-to-start gap, from the workers' own
/// records (a worker exits at once on SIGTERM, as a trainer does); then the medians, their
/// ratios and one `HEADLINE_RESULT {json}` line. A measurement: only each case's recovery is
/// asserted, not the issue's targets (docs/benchmarks.md "The headline"):
/// `JOBSET_INPLACE_KUBECONFIG=DIR/kubeconfig cargo test --test real_node -- --ignored
/// --nocapture headline`.
#[tokio::test]
#[ignore = "a measurement: cargo test --test real_node -- --ignored --nocapture headline"]
async fn headline_floor_in_place_and_recreation() {
    const TEST: &str = "headline_floor_in_place_and_recreation";
    with_node_for(TEST, Duration::from_secs(1500), |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        load_test_image(&node).await;

        // The floor: the kubelet alone restarts one bare pod in place.
        let mut floor = Case::new("floor (bare pod, kubelet only)");
        {
            let ns = TestNamespace::create(&node, "rn-head-floor").await;
            let records = records_dir();
            let pods: Api<Pod> = Api::namespaced(node.client.clone(), &ns.name);
            let mut pod = sidecar_pod("floor-0", records.path());
            pod.metadata.labels = Some(BTreeMap::from([("headline".into(), "floor".into())]));
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create the floor's pod");
            let selector = "headline=floor";
            let live = workers_running_since(&pods, records.path(), selector, 1, 0).await;
            let uid = live["floor-0"].metadata.uid.clone();
            for round in 1..=HEADLINE_ROUNDS {
                let (live, since) =
                    fail_and_recover(&pods, records.path(), selector, 1, "floor-0").await;
                assert_eq!(live["floor-0"].metadata.uid, uid, "in place: same pod UID");
                assert_eq!(
                    restart_counts(&live["floor-0"]).get("worker"),
                    Some(&(round as i32)),
                    "in place: the worker restarted once per failure"
                );
                floor.add(&read_records(records.path()), since);
            }
        }

        // In place through the installed product: 1 pod, then HEADLINE_PODS.
        let mut in_place = Vec::new();
        for (size, name, prefix) in [
            (1, "in place, 1 pod", "rn-head-ip1"),
            (HEADLINE_PODS, "in place, 8 pods", "rn-head-ip8"),
        ] {
            let mut case = Case::new(name);
            let (run, mut group) = Run::start(&node, prefix, size, dialect, |_| {}).await;
            for _ in 1..=HEADLINE_ROUNDS {
                let since = run.mark();
                let (after, _) = group_restart(&run, &group, HEADLINE_CODE).await;
                case.add(&run.records(), since);
                group = after;
            }
            in_place.push(case);
        }
        let ip8 = in_place.pop().expect("8 pods");
        let ip1 = in_place.pop().expect("1 pod");

        // JobSet's own recreation: the same JobSet without InPlaceRestart (the webhook leaves
        // it alone), the Job failing at its first pod failure.
        let mut recreated = Case::new("recreation, 8 pods");
        {
            let ns = TestNamespace::create(&node, "rn-head-rc").await;
            let records = records_dir();
            let pods: Api<Pod> = Api::namespaced(node.client.clone(), &ns.name);
            let jobsets = jobset_api(&node.client, &ns.name);
            let js = train_jobset(HEADLINE_PODS, records.path(), dialect, |js| {
                recreating(js, dialect)
            });
            create_not_injected(&jobsets, &js).await;
            let selector = "jobset.sigs.k8s.io/jobset-name=train";
            let mut live =
                workers_running_since(&pods, records.path(), selector, HEADLINE_PODS, 0).await;
            for _ in 1..=HEADLINE_ROUNDS {
                let failing = live.keys().next().expect("a pod").clone();
                let since;
                (live, since) =
                    fail_and_recover(&pods, records.path(), selector, HEADLINE_PODS, &failing)
                        .await;
                assert!(
                    !live.contains_key(&failing),
                    "recreated: {failing} is gone, {:?}",
                    live.keys()
                );
                recreated.add(&read_records(records.path()), since);
            }
        }

        let (f, m1, m8, rc) = (
            floor.median_ms(),
            ip1.median_ms(),
            ip8.median_ms(),
            recreated.median_ms(),
        );
        let ratio = |a: f64, b: f64| (a / b.max(1.0) * 100.0).round() / 100.0;
        let ratios = json!({
            "in_place_8_over_in_place_1": ratio(m8, m1),
            "in_place_8_over_floor": ratio(m8, f),
            "recreation_over_in_place_8": ratio(rc, m8),
        });
        println!(
            "headline, {HEADLINE_ROUNDS} failures each, medians: floor {f} ms, in place 1 pod \
             {m1} ms, in place {HEADLINE_PODS} pods {m8} ms, recreation {HEADLINE_PODS} pods \
             {rc} ms; 8 in place / 1 in place {} (target <= 1.25), 8 in place / floor {} \
             (target <= 1.6), recreation / 8 in place {} (target >= 1.2)",
            ratios["in_place_8_over_in_place_1"],
            ratios["in_place_8_over_floor"],
            ratios["recreation_over_in_place_8"],
        );
        let cases = [
            ("floor", &floor),
            ("in_place_1", &ip1),
            ("in_place_8", &ip8),
            ("recreation_8", &recreated),
        ];
        let by_case = |figure: fn(&Case) -> serde_json::Value| {
            cases
                .iter()
                .map(|(key, case)| ((*key).to_owned(), figure(case)))
                .collect::<serde_json::Map<_, _>>()
        };
        let result = json!({
            "pods": HEADLINE_PODS,
            "rounds": HEADLINE_ROUNDS,
            "median_ms": by_case(|c| json!(c.median_ms())),
            "ratios": ratios,
            "failures_ms": by_case(|c| json!(c.took())),
            "gaps_ms": by_case(|c| json!(c.gaps())),
        });
        println!("HEADLINE_RESULT {result}");
        // A measurement: the targets are read, not asserted (docs/benchmarks.md "The headline").
    })
    .await;
}

/// A kubelet without `RestartAllContainersOnContainerExits` (`up` with
/// `JOBSET_INPLACE_NODE_RESTART_GATE=off`; docs/protocol.md "A node without the feature"): the
/// kubelet ignores the rules, so the failing worker's pod fails and is replaced, and the other
/// pods' agents restart alone while their workers run on. The reconciler fails and deletes those
/// pods (a `RestartedWithoutWorkers` event naming each and the node), writes no synced epoch
/// while an old worker runs (from the workers' own records: no worker of the new epoch starts
/// before every old one ended), and the JobSet runs again on replacements; `doctor` names the
/// node. The pods are bound to the node by `nodeName`: the scheduler, with `NodeDeclaredFeatures`,
/// keeps them off a node that does not declare the feature.
#[tokio::test]
async fn a_kubelet_without_the_gate_gets_its_pods_failed_not_synced_over() {
    const TEST: &str = "a_kubelet_without_the_gate_gets_its_pods_failed_not_synced_over";
    with_gateless_node(TEST, |node| async move {
        let dialect = installed(&node, TEST)
            .unwrap_or_else(|| panic!("{TEST}: the product must be installed (--install epoch)"));
        let node_name = node
            .env
            .get("NODE_NAME")
            .cloned()
            .expect("node.env NODE_NAME");
        let pinned = node_name.clone();
        let (run, first) = Run::start(&node, "rn-nogate", 3, dialect, move |js| {
            js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeName"] =
                json!(pinned);
        })
        .await;
        // `startedAt` has whole seconds: the agents restart a second or more after their workers
        // started.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let failing = first.pods.keys().next().expect("a pod").clone();
        let since = run.mark();
        run.exit(&failing, 3);
        // Every pod replaced (none restarts in place here), every worker running one epoch up.
        let after = run
            .running(Some(first.epoch), since, Duration::from_secs(150))
            .await;
        assert_eq!(after.epoch, first.epoch + 1, "the epoch moves by one");
        for name in first.pods.keys() {
            assert!(
                !after.pods.contains_key(name),
                "{name} was failed and replaced: {:?}",
                after.pods.keys()
            );
        }
        // From the workers' own records: every old worker ended before any new one started.
        let took = assert_barrier(&run.records(), since, run.size);
        println!(
            "kubelet without the gate: every worker running again on replacements after {} ms",
            took.as_millis()
        );
        // The synced epoch was written for the replacements only.
        eventually("the synced epoch", Duration::from_secs(30), || async {
            match run.synced().await {
                Some(s) if s == after.epoch => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        // The reconciler said why, for each pod whose agent restarted alone (every pod but the
        // failing one, which failed on its own).
        let events: Api<DynamicObject> = Api::namespaced_with(
            node.client.clone(),
            &run._ns.name,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event")),
        );
        let alone: Vec<&String> = first.pods.keys().filter(|n| **n != failing).collect();
        let notes = eventually(
            "a RestartedWithoutWorkers event per pod",
            Duration::from_secs(30),
            || async {
                let list = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let notes: Vec<String> = list
                    .items
                    .iter()
                    .filter(|e| e.data["reason"] == "RestartedWithoutWorkers")
                    .filter_map(|e| e.data["note"].as_str().map(str::to_owned))
                    .collect();
                if alone
                    .iter()
                    .all(|p| notes.iter().any(|n| n.contains(p.as_str())))
                {
                    Ok(notes)
                } else {
                    Err(format!("{notes:?}"))
                }
            },
        )
        .await;
        assert!(
            notes
                .iter()
                .all(|n| n.contains(&node_name)
                    && n.contains("RestartAllContainersOnContainerExits")),
            "{notes:?}"
        );
        // doctor names the node.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .arg("doctor")
            .env("KUBECONFIG", &node.kubeconfig)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(COMMAND_LIMIT, out)
            .await
            .expect("doctor within its time")
            .expect("run doctor");
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}");
        assert!(
            text.lines().any(|l| l.contains("node-features")
                && !l.starts_with("ok")
                && l.contains(&node_name)),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await;
}

/// `doctor --pull-check` on a real kubelet: an agent image the node cannot pull (a registry on the
/// node's own loopback, where nothing listens) is a failure naming `ErrImagePull` with the
/// kubelet's message; the pull-check pod lands on the node (tainted or not: it tolerates every
/// taint) and is deleted afterwards.
#[tokio::test]
async fn doctor_pull_check_reports_an_image_the_node_cannot_pull() {
    const TEST: &str = "doctor_pull_check_reports_an_image_the_node_cannot_pull";
    with_node(TEST, |node| async move {
        if installed(&node, TEST).is_none() {
            return;
        }
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .args(["doctor", "--pull-check", "--pull-timeout", "90s"])
            .args(["--agent-image", "127.0.0.1:1/jobset-inplace/nope:1"])
            .args(["--nodes", "jobset-inplace.dev/real-node=true"])
            .env("KUBECONFIG", &node.kubeconfig)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(COMMAND_LIMIT, out)
            .await
            .expect("doctor within its time")
            .expect("run doctor");
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}");
        assert!(
            text.lines().any(|l| l.starts_with("FAIL agent-image-pull")
                && l.contains("127.0.0.1:1/jobset-inplace/nope:1")
                && (l.contains("ErrImagePull") || l.contains("ImagePullBackOff"))),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "a failed check exits 1");
        let left = Api::<Pod>::namespaced(node.client.clone(), "default")
            .list(&ListParams::default().labels("app.kubernetes.io/name"))
            .await
            .expect("list pods");
        assert!(
            !left.items.iter().any(|p| p
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("-pull-"))
                && p.metadata.deletion_timestamp.is_none()),
            "the pull-check pod is deleted"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Kubeflow Trainer and Kueue on the real node (`up DIR --node --install epoch --with
// kueue,trainer`): their controller managers beside the control plane, the pods on the node
// ---------------------------------------------------------------------------------------------

/// The addons a run requires (as tests/real_cluster/: CI sets `kueue,trainer`): a test of one
/// that was not started then fails instead of skipping.
const ADDONS_ENV: &str = "JOBSET_INPLACE_REAL_CLUSTER_ADDONS";

/// Whether `addon` was started with the node (`DIR/addons`, written by `up --with`, names it).
/// When not: SKIPPED loudly, or a panic where `JOBSET_INPLACE_REAL_CLUSTER_ADDONS` names it.
fn addon_started(node: &Node, test: &str, addon: &str) -> bool {
    let file = node.dir.join("addons");
    let started = std::fs::read_to_string(&file)
        .map(|text| text.lines().any(|l| l.trim() == addon))
        .unwrap_or(false);
    if started {
        return true;
    }
    let required = std::env::var(ADDONS_ENV).unwrap_or_default();
    if required.split(',').any(|a| a.trim() == addon) {
        panic!(
            "{test}: {ADDONS_ENV}={required} but {} does not name {addon} \
             (scripts/control-plane.sh up DIR --node --install epoch --with {addon})",
            file.display()
        );
    }
    eprintln!(
        "\n!! SKIPPED {test}: {addon} was not started with the node \
         (up DIR --node --install epoch --with {addon}; {} does not name it)\n",
        file.display()
    );
    false
}

/// A TrainJob from a ClusterTrainingRuntime whose JobSet template uses InPlaceRestart, as a user
/// writes it (the shape of the Trainer test of tests/real_cluster/addons.rs: one replicated job `node`,
/// Trainer's `trainer` step, `restartPolicy: Never`, nothing injected; here of the test image on
/// the real node): Trainer makes the JobSet, which comes out injected by the installed webhook;
/// its pods run on the node; a worker fails and every pod restarts in place (same UIDs and IPs,
/// every container's `restartCount` one up, behind the barrier, the epoch one up and synced).
#[tokio::test]
async fn a_trainjob_from_an_in_place_restart_runtime_restarts_in_place_on_the_real_node() {
    const TEST: &str =
        "a_trainjob_from_an_in_place_restart_runtime_restarts_in_place_on_the_real_node";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        if !addon_started(&node, TEST, "trainer") {
            return;
        }
        let mut run = Run::prepare(&node, "rn-trainer", 2, dialect).await;
        // Trainer's `trainer` step must have a container named `node` (its runtime webhook).
        run.set_worker("node");
        let runtime = format!("{}-inplace", run.namespace());
        let _objects = ClusterObjects {
            kubeconfig: node.kubeconfig.clone(),
            objects: vec![(
                "clustertrainingruntime.trainer.kubeflow.org",
                runtime.clone(),
            )],
        };
        // The JobSet `train_jobset` makes, as a runtime's template: the worker without a rule of
        // its own (the webhook gives it one), in Trainer's `trainer` step.
        let mut template =
            serde_json::to_value(train_jobset(run.size, run.records.path(), dialect, |_| {}))
                .expect("json")["spec"]
                .clone();
        let job = &mut template["replicatedJobs"][0];
        job["name"] = json!("node");
        job["template"]["metadata"] =
            json!({"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}});
        let pod = &mut job["template"]["spec"]["template"]["spec"];
        pod["containers"] = json!([jobset_worker("node", dialect)]);
        for field in ["backoffLimit", "podReplacementPolicy"] {
            if let Some(o) = job["template"]["spec"].as_object_mut() {
                o.remove(field);
            }
        }
        create_eventually(
            &api_of(&node.client, TRAINING_RUNTIME, None),
            json!({"apiVersion": "trainer.kubeflow.org/v1alpha1",
                   "kind": "ClusterTrainingRuntime",
                   "metadata": {"name": runtime},
                   "spec": {"template": {"spec": template}}}),
        )
        .await;
        create_eventually(
            &api_of(&node.client, TRAIN_JOB, Some(run.namespace())),
            json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                   "metadata": {"name": "train"},
                   "spec": {"runtimeRef": {"name": runtime,
                       "kind": "ClusterTrainingRuntime",
                       "apiGroup": "trainer.kubeflow.org"}}}),
        )
        .await;
        let js = eventually("Trainer's JobSet", Duration::from_secs(60), || async {
            run.jobsets.get("train").await.map_err(|e| e.to_string())
        })
        .await;
        assert_injected(&js);
        assert!(
            js.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.kind == "TrainJob")),
            "the JobSet is Trainer's: {:?}",
            js.metadata
        );
        let first = run.running(None, 0, Duration::from_secs(150)).await;
        println!("TrainJob's pods running at epoch {}", first.epoch);
        let (_, took) = group_restart(&run, &first, 3).await;
        println!(
            "TrainJob: every worker running again after {} ms",
            took.as_millis()
        );
    })
    .await;
}

/// Kueue's Workload of JobSet `name`: its conditions by type as (status, reason), and the
/// One sample of what Kueue and JobSet say while a group restart runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KueueView {
    /// The Workload's conditions by type: (status, reason).
    conditions: BTreeMap<String, (String, String)>,
    /// The Workload's `status.requeueState`, as JSON (null when never requeued).
    requeue: String,
    /// The JobSet's `spec.suspend`.
    suspended: bool,
}

/// A JobSet in a Kueue LocalQueue (ClusterQueue quota for it, `waitForPodsReady` on as
/// `up --with kueue` configures it: DIR/kueue/config.yaml) on the real node: created suspended by
/// Kueue's webhook and injected by ours, admitted and resumed, its pods run; a worker fails and
/// the JobSet group-restarts in place while Kueue neither evicts nor requeues it (the Workload
/// stays Admitted, never Evicted, no requeueState, the JobSet never suspended). The Workload's
/// conditions through the restart are printed (how `PodsReady` moves; docs/operations.md).
#[tokio::test]
async fn a_jobset_admitted_by_kueue_group_restarts_in_place_without_eviction() {
    const TEST: &str = "a_jobset_admitted_by_kueue_group_restarts_in_place_without_eviction";
    with_node(TEST, |node| async move {
        let Some(dialect) = installed(&node, TEST) else {
            return;
        };
        if !addon_started(&node, TEST, "kueue") {
            return;
        }
        let kueue_config = std::fs::read_to_string(node.dir.join("kueue/config.yaml"))
            .unwrap_or_else(|e| panic!("DIR/kueue/config.yaml: {e}"));
        let wait_for_pods_ready: Vec<&str> = kueue_config
            .lines()
            .skip_while(|l| !l.starts_with("waitForPodsReady:"))
            .take_while(|l| l.starts_with("waitForPodsReady:") || l.starts_with(' '))
            .collect();
        assert!(
            !wait_for_pods_ready.is_empty(),
            "Kueue runs with waitForPodsReady: {kueue_config}"
        );
        println!("Kueue's {}", wait_for_pods_ready.join("\n"));
        let run = Run::prepare(&node, "rn-kueue", 3, dialect).await;
        let ns = run.namespace().to_owned();
        let queue = KueueQueue::create(
            &node,
            &ns,
            |flavor| KueueQueue::quota(flavor, "8", "16Gi"),
            json!({}),
        )
        .await;
        let js = train_jobset(run.size, run.records.path(), dialect, |js| {
            js["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": queue.local_queue});
        });
        let created = run
            .jobsets
            .create(&PostParams::default(), &js)
            .await
            .unwrap_or_else(|e| panic!("create the JobSet: {e}"));
        assert_injected(&created);
        assert_eq!(
            created.data["spec"]["suspend"], true,
            "Kueue's webhook suspended the JobSet until admission"
        );
        let first = run.running(None, 0, Duration::from_secs(150)).await;
        let view = || async {
            let (conditions, w) = workload_of(&node.client, &ns, "train").await?;
            let suspended = run
                .jobsets
                .get("train")
                .await
                .map_err(|e| e.to_string())?
                .data["spec"]["suspend"]
                .as_bool()
                .unwrap_or(false);
            Ok::<_, String>(KueueView {
                conditions,
                requeue: w["status"]["requeueState"].to_string(),
                suspended,
            })
        };
        let ready = eventually(
            "the Workload admitted, PodsReady",
            Duration::from_secs(60),
            || async {
                let v = view().await?;
                let is = |t: &str| v.conditions.get(t).is_some_and(|c| c.0 == "True");
                (is("Admitted") && is("PodsReady"))
                    .then_some(v.clone())
                    .ok_or(format!("{v:?}"))
            },
        )
        .await;
        println!("admitted: {ready:?}");

        // The group restart, with Kueue's view sampled every 100 ms until PodsReady is back.
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let samples = {
            let sampling = sampling.clone();
            async move {
                let start = Instant::now();
                let mut seen: Vec<(Duration, KueueView)> = Vec::new();
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(v) = view().await
                        && seen.last().is_none_or(|(_, last)| *last != v)
                    {
                        seen.push((start.elapsed(), v));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                seen
            }
        };
        let restart = async {
            let (after, took) = group_restart(&run, &first, 3).await;
            // Until Kueue has seen the pods ready again (or 60 s: then the loop below says).
            let _ = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    if let Ok(v) = view().await
                        && v.conditions.get("PodsReady").is_some_and(|c| c.0 == "True")
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await;
            // A few seconds more: an eviction decided late would show.
            tokio::time::sleep(Duration::from_secs(5)).await;
            sampling.store(false, std::sync::atomic::Ordering::Relaxed);
            (after, took)
        };
        let (seen, (after, took)) = tokio::join!(samples, restart);
        println!(
            "group restart under Kueue: every worker running again after {} ms, epoch {}",
            took.as_millis(),
            after.epoch
        );
        for (at, v) in &seen {
            println!("  +{:>5} ms {v:?}", at.as_millis());
        }
        assert!(!seen.is_empty(), "Kueue's view sampled");
        for (at, v) in &seen {
            let status = |t: &str| v.conditions.get(t).map(|c| c.0.as_str());
            assert_ne!(status("Evicted"), Some("True"), "+{at:?}: evicted: {v:?}");
            assert_eq!(status("Admitted"), Some("True"), "+{at:?}: {v:?}");
            assert_eq!(
                status("Requeued"),
                ready.conditions.get("Requeued").map(|c| c.0.as_str()),
                "+{at:?}: requeued: {v:?}"
            );
            assert_eq!(v.requeue, "null", "+{at:?}: requeueState: {v:?}");
            assert!(!v.suspended, "+{at:?}: the JobSet suspended: {v:?}");
        }
        let last = &seen[seen.len() - 1].1;
        assert_eq!(
            last.conditions.get("PodsReady").map(|c| c.0.as_str()),
            Some("True"),
            "PodsReady again after the group restart: {last:?}"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The failure matrix on several real nodes
// ---------------------------------------------------------------------------------------------

#[path = "real_node/matrix.rs"]
mod matrix;
#[path = "real_node/node_loss.rs"]
mod node_loss;
