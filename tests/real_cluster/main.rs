//! Against a real control plane: etcd, kube-apiserver 1.35 and kube-controller-manager built from
//! their upstream Go modules and started on loopback by `scripts/control-plane.sh up DIR`. Point
//! `JOBSET_INPLACE_KUBECONFIG` at `DIR/kubeconfig` (an admin, `system:masters`). Without it every
//! test here says SKIPPED loudly and passes, unless `JOBSET_INPLACE_REAL_CLUSTER=required` (CI sets
//! it once the control plane is up), which makes them fail instead.
//!
//! - every deploy overlay, with the released JobSet CRD the way deploy/README.md combines them,
//!   is accepted by server-side apply, and the API server type-checks the admission policies
//!   without a warning;
//! - the agent's rights through the real RBAC and the real ValidatingAdmissionPolicy, with a
//!   TokenRequest token bound to a pod;
//! - the webhook binary on loopback behind the overlay's own webhook configurations (only the
//!   client config pointed at it): injection stored, a broken JobSet denied with every field path,
//!   and with the webhook gone mutation ignored and validation failing closed;
//! - a JobSet applied (or updated) again without what the webhook injected, as Kubeflow Trainer
//!   writes its JobSets, is stored unchanged through our webhooks and JobSet's; with the webhook
//!   gone, a label change and a finalizer removal from a JobSet being deleted go through;
//! - a group restart end to end: the test kit's node (`testkit/src/node/`) binds the pods the
//!   real Job controller made and runs the real agent binary in each, and a worker's exit
//!   restarts every pod in place.
//!
//! The tests share one cluster and take turns (a lock); each works in namespaces of its own and
//! deletes them. Everything here drives the API server as a client would: kubectl for manifests,
//! kube for objects, the `jobset-inplace` binary for the webhook. Cluster-scoped objects of the
//! overlays stay installed (applying them again is idempotent).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use jobset_inplace::wire::epochs::JobSetEpoch;
use jobset_inplace_testkit::build;
use jobset_inplace_testkit::cluster::{
    ClusterObjects, ControlPlane, KueueQueue, PRIORITY_CLASS, TRAIN_JOB, TRAINING_RUNTIME,
    TestNamespace, api_of, create_eventually, delete_now, eventually, try_eventually, workload_of,
};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::{Value, json};

mod addons;
mod agent_rights;
mod agent_token;
mod agreement;
mod controllers;
mod deadline;
mod dialect;
mod doctor;
mod enforced;
mod jobset_status;
mod measure;
mod metrics;
mod node;
mod off_switch;
mod overlays;
mod reconciler;
mod scale;
mod stolen_token;
mod support;
mod webhook;
mod webhook_rights;

use support::*;

const KUBECONFIG_ENV: &str = "JOBSET_INPLACE_KUBECONFIG";
const REQUIRED_ENV: &str = "JOBSET_INPLACE_REAL_CLUSTER";
/// Each test's whole budget (a cold API server answers its first requests slowly).
const LIMIT: Duration = Duration::from_secs(300);
/// One kubectl run.
const KUBECTL_LIMIT: Duration = Duration::from_secs(120);
const FIELD_MANAGER: &str = "jobset-inplace-real-cluster-test";
const EPOCH_ANNOTATION: &str = "jobset.sigs.k8s.io/epoch";
const INJECTED_ANNOTATION: &str = "jobset-inplace.dev/injected";
const AGENT_SERVICE_ACCOUNT: &str = "jobset-inplace-agent";
const WEBHOOK_CONFIGURATION: &str = "jobset-inplace";

/// The tests take turns on the one cluster: they install overlays and webhook configurations
/// that are cluster-wide.
static CLUSTER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Cluster {
    kubeconfig: PathBuf,
    client: Client,
    server: String,
    /// The API server's CA, base64 as in a kubeconfig.
    ca_data: String,
}

impl ControlPlane for Cluster {
    fn client(&self) -> &Client {
        &self.client
    }
    fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

/// The cluster of `JOBSET_INPLACE_KUBECONFIG`, or `None` (and a loud SKIPPED) without one.
async fn cluster(test: &str) -> Option<Cluster> {
    let Some(path) = std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) else {
        if std::env::var(REQUIRED_ENV).as_deref() == Ok("required") {
            panic!("{test}: {REQUIRED_ENV}=required but {KUBECONFIG_ENV} is not set");
        }
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !! SKIPPED {test}: no real control plane (run scripts/control-plane.sh up DIR\n\
             !! and set {KUBECONFIG_ENV}=DIR/kubeconfig)\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        return None;
    };
    let kubeconfig = PathBuf::from(path);
    let kc = Kubeconfig::read_from(&kubeconfig)
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    let named = kc.clusters.first().expect("a cluster in the kubeconfig");
    let inner = named.cluster.as_ref().expect("cluster");
    let server = inner.server.clone().expect("server");
    let ca_data = inner
        .certificate_authority_data
        .clone()
        .expect("certificate-authority-data");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    Some(Cluster {
        kubeconfig,
        client,
        server,
        ca_data,
    })
}

/// Runs a test body against the cluster, alone and under a time limit.
async fn with_cluster<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Cluster) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(cluster) = cluster(test).await else {
        return;
    };
    let _turn = CLUSTER_LOCK.lock().await;
    tokio::time::timeout(LIMIT, body(cluster))
        .await
        .unwrap_or_else(|_| panic!("{test} did not finish within {LIMIT:?}"));
}

/// A client authenticating with a bearer token (nothing else) to the same API server.
async fn token_client(cluster: &Cluster, token: &str) -> Client {
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
         certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        cluster.server, cluster.ca_data
    );
    let kc = Kubeconfig::from_yaml(&yaml).expect("token kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("token config");
    Client::try_from(config).expect("token client")
}

/// Runs kubectl (with the cluster's kubeconfig when given); stdout, or the reason it failed.
async fn kubectl(kubeconfig: Option<&Path>, args: &[&str]) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new("kubectl");
    if let Some(k) = kubeconfig {
        cmd.arg("--kubeconfig").arg(k);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(KUBECTL_LIMIT, cmd.output())
        .await
        .map_err(|_| format!("kubectl {args:?} did not finish within {KUBECTL_LIMIT:?}"))?
        .map_err(|e| format!("cannot run kubectl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The API error of a result: (HTTP code, reason, message, the causes' fields).
fn api_error<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
) -> Result<(u16, String, String, Vec<String>), String> {
    match result {
        Err(kube::Error::Api(status)) => {
            let fields = status
                .details
                .as_ref()
                .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
                .unwrap_or_default();
            Ok((
                status.code,
                status.reason.clone(),
                status.message.clone(),
                fields,
            ))
        }
        Err(e) => Err(format!("not an API error: {e}")),
        Ok(v) => Err(format!("allowed: {v:?}")),
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests
// ---------------------------------------------------------------------------------------------

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(manifest_dir().join("deploy/overlays"))
        .expect("deploy/overlays")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("kustomization.yaml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Whether an overlay is of the epoch dialect: it lists the CRD component, so the deploy/README.md
/// recipe combines it with the JobSet manifest and that component.
fn epoch_dialect(overlay: &str) -> bool {
    std::fs::read_to_string(
        manifest_dir()
            .join("deploy/overlays")
            .join(overlay)
            .join("kustomization.yaml"),
    )
    .expect("kustomization.yaml")
    .contains("components/epoch-status-fields")
}

/// What deploy/README.md installs for an overlay: the released JobSet CRD and the overlay (plus
/// the CRD component for the epoch dialect), rendered by `kubectl kustomize`.
async fn render_install(overlay: &str) -> Vec<Value> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let deploy = std::fs::canonicalize(manifest_dir().join("deploy")).expect("deploy/");
    let here = std::fs::canonicalize(dir.path()).expect("tempdir");
    let deploy = jobset_inplace_testkit::fixtures::relative_path(&here, &deploy)
        .display()
        .to_string();
    let crd = std::fs::read_to_string(
        manifest_dir().join("fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml"),
    )
    .expect("released CRD");
    std::fs::write(dir.path().join("jobset-manifests.yaml"), crd).expect("write");
    let mut kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n\
         - jobset-manifests.yaml\n- {deploy}/overlays/{overlay}\n"
    );
    if epoch_dialect(overlay) {
        kustomization.push_str(&format!(
            "components:\n- {deploy}/components/epoch-status-fields\n"
        ));
    }
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization).expect("write");
    let text = kubectl(None, &["kustomize", &dir.path().display().to_string()])
        .await
        .unwrap_or_else(|e| panic!("{overlay}: {e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .expect("yaml")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// cert-manager's own kinds: their CRDs are cert-manager's, not installed here.
fn is_cert_manager(object: &Value) -> bool {
    object["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("cert-manager.io/"))
}

/// Server-side applies objects with kubectl; the names kubectl reports.
async fn apply(cluster: &Cluster, objects: &[Value]) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let file = dir.path().join("objects.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&file, serde_json::to_vec(&list).expect("json")).expect("write");
    let out = kubectl(
        Some(&cluster.kubeconfig),
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            FIELD_MANAGER,
            "-o",
            "name",
            "-f",
            &file.display().to_string(),
        ],
    )
    .await?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// Installs an overlay as deploy/README.md says (cert-manager's own objects left out) and waits
/// for the JobSet CRD to be established. Returns what was applied.
async fn install(cluster: &Cluster, overlay: &str) -> Vec<Value> {
    let objects: Vec<Value> = render_install(overlay)
        .await
        .into_iter()
        .filter(|o| !is_cert_manager(o))
        .collect();
    let applied = apply(cluster, &objects)
        .await
        .unwrap_or_else(|e| panic!("{overlay}: {e}"));
    assert_eq!(
        applied.len(),
        objects.len(),
        "{overlay}: every object applied: {applied:?}"
    );
    kubectl(
        Some(&cluster.kubeconfig),
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/jobsets.jobset.x-k8s.io",
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{overlay}: {e}"));
    objects
}

async fn delete_webhook_configurations(cluster: &Cluster) {
    kubectl(
        Some(&cluster.kubeconfig),
        &[
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            WEBHOOK_CONFIGURATION,
            "--ignore-not-found",
        ],
    )
    .await
    .expect("delete webhook configurations");
}
