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

mod addons;
mod gate;
mod headline;
mod kubelet;
mod matrix;
mod node_loss;
mod node_modes;
mod product;
mod registry;
mod support;

use support::*;

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
// The failure matrix on several real nodes
// ---------------------------------------------------------------------------------------------
