//! What the tests against a real control plane share (`tests/real_cluster/`,
//! `tests/real_node/`: two test binaries, so the shared part lives here): polling with a
//! deadline, a namespace and cluster-scoped objects deleted when dropped (also during a panic),
//! an API of any kind, and the addons' objects (Kueue's queues, Workloads; the kinds of Kueue and
//! Kubeflow Trainer).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// How often [`eventually`] asks again.
const POLL: Duration = Duration::from_millis(200);

/// Polls `check` until it returns `Ok`, or panics with `what` and the last error after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    try_eventually(limit, check)
        .await
        .unwrap_or_else(|e| panic!("{what}: not within {limit:?}: {e}"))
}

/// Polls `check` until it returns `Ok`; its last error after `limit`.
pub async fn try_eventually<T, F, Fut>(limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// A control plane a test runs against: its client, and the kubeconfig `kubectl` (in `Drop`)
/// uses.
pub trait ControlPlane {
    fn client(&self) -> &Client;
    fn kubeconfig(&self) -> &Path;
}

/// `kubectl delete KIND NAME --wait=false --ignore-not-found`, synchronously: for `Drop`, which
/// runs during a panic too (no runtime to await on then). Its outcome is not looked at: the
/// namespace controller (or the garbage collector) finishes the deletion.
pub fn delete_now(kubeconfig: &Path, kind: &str, name: &str) {
    let _ = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["delete", kind, name, "--wait=false", "--ignore-not-found"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A namespace of the test's own (`PREFIX-PID-NANOS`), deleted when dropped.
pub struct TestNamespace {
    pub kubeconfig: PathBuf,
    pub name: String,
}

impl TestNamespace {
    pub async fn create(cp: &impl ControlPlane, prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("{prefix}-{}-{nanos}", std::process::id());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
        Api::<Namespace>::all(cp.client().clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        TestNamespace {
            kubeconfig: cp.kubeconfig().to_path_buf(),
            name,
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        delete_now(&self.kubeconfig, "namespace", &self.name);
    }
}

/// Cluster-scoped objects (`KIND.GROUP`, NAME), deleted in reverse order when dropped.
pub struct ClusterObjects {
    pub kubeconfig: PathBuf,
    pub objects: Vec<(&'static str, String)>,
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        for (kind, name) in self.objects.iter().rev() {
            delete_now(&self.kubeconfig, kind, name);
        }
    }
}

/// (group, version, kind) of the addons' kinds the tests use.
pub type Gvk = (&'static str, &'static str, &'static str);
pub const TRAINING_RUNTIME: Gvk = ("trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime");
pub const TRAIN_JOB: Gvk = ("trainer.kubeflow.org", "v1alpha1", "TrainJob");
pub const RESOURCE_FLAVOR: Gvk = ("kueue.x-k8s.io", "v1beta2", "ResourceFlavor");
pub const CLUSTER_QUEUE: Gvk = ("kueue.x-k8s.io", "v1beta2", "ClusterQueue");
pub const LOCAL_QUEUE: Gvk = ("kueue.x-k8s.io", "v1beta2", "LocalQueue");
pub const WORKLOAD: Gvk = ("kueue.x-k8s.io", "v1beta2", "Workload");
pub const PRIORITY_CLASS: Gvk = ("kueue.x-k8s.io", "v1beta2", "WorkloadPriorityClass");

/// An API of any kind, namespaced or cluster-wide.
pub fn api_of(
    client: &Client,
    (group, version, kind): Gvk,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Creates `object`, retrying for up to 60 s while an addon's webhooks or CRDs are not
/// answering yet.
pub async fn create_eventually(api: &Api<DynamicObject>, object: Value) -> DynamicObject {
    let object: DynamicObject = serde_json::from_value(object).expect("object");
    let what = format!(
        "create {} {}",
        object.types.as_ref().map(|t| t.kind.as_str()).unwrap_or(""),
        object.metadata.name.as_deref().unwrap_or("")
    );
    eventually(&what, Duration::from_secs(60), || async {
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| e.to_string())
    })
    .await
}

/// A Kueue queue for one test namespace: ResourceFlavor `NS-flavor`, ClusterQueue `NS-cq` (for
/// that namespace alone, with `resource_group` as its one resource group and `cluster_queue`'s
/// fields merged into its spec), LocalQueue `lq` in the namespace. Its cluster-scoped objects are
/// deleted when it is dropped.
pub struct KueueQueue {
    pub flavor: String,
    pub cluster_queue: String,
    /// The LocalQueue's name, for a JobSet's `kueue.x-k8s.io/queue-name` label.
    pub local_queue: &'static str,
    _objects: ClusterObjects,
}

impl KueueQueue {
    /// A resource group of `cpu` and `memory` quota in `flavor`.
    pub fn quota(flavor: &str, cpu: &str, memory: &str) -> Value {
        json!({"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor,
            "resources": [{"name": "cpu", "nominalQuota": cpu},
                          {"name": "memory", "nominalQuota": memory}]}]})
    }

    /// Creates the three objects; `resource_group` is given the flavor's name.
    pub async fn create(
        cp: &impl ControlPlane,
        namespace: &str,
        resource_group: impl FnOnce(&str) -> Value,
        cluster_queue: Value,
    ) -> Self {
        let (flavor, queue) = (format!("{namespace}-flavor"), format!("{namespace}-cq"));
        let objects = ClusterObjects {
            kubeconfig: cp.kubeconfig().to_path_buf(),
            objects: vec![
                ("resourceflavor.kueue.x-k8s.io", flavor.clone()),
                ("clusterqueue.kueue.x-k8s.io", queue.clone()),
            ],
        };
        let client = cp.client();
        create_eventually(
            &api_of(client, RESOURCE_FLAVOR, None),
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                   "metadata": {"name": flavor}}),
        )
        .await;
        let mut spec = json!({
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [resource_group(&flavor)],
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), cluster_queue.as_object()) {
            spec.extend(extra.clone());
        }
        create_eventually(
            &api_of(client, CLUSTER_QUEUE, None),
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                   "metadata": {"name": queue}, "spec": spec}),
        )
        .await;
        create_eventually(
            &api_of(client, LOCAL_QUEUE, Some(namespace)),
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                   "metadata": {"name": "lq", "namespace": namespace},
                   "spec": {"clusterQueue": queue}}),
        )
        .await;
        KueueQueue {
            flavor,
            cluster_queue: queue,
            local_queue: "lq",
            _objects: objects,
        }
    }
}

/// Kueue's Workload of the JobSet `name`: its conditions by type as (status, reason), and the
/// whole object.
pub async fn workload_of(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(BTreeMap<String, (String, String)>, Value), String> {
    let list = api_of(client, WORKLOAD, Some(namespace))
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let w = list
        .items
        .into_iter()
        .find(|w| {
            w.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.kind == "JobSet" && r.name == name))
        })
        .ok_or_else(|| format!("no Workload of {name} yet"))?;
    let conditions = w.data["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let field = |k: &str| c[k].as_str().unwrap_or("").to_owned();
                    (field("type"), (field("status"), field("reason")))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok((conditions, w.data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_names_its_flavor_and_both_resources() {
        let q = KueueQueue::quota("f", "3", "64Gi");
        assert_eq!(q["flavors"][0]["name"], "f");
        assert_eq!(q["flavors"][0]["resources"][0]["nominalQuota"], "3");
        assert_eq!(q["flavors"][0]["resources"][1]["nominalQuota"], "64Gi");
    }

    #[tokio::test]
    async fn try_eventually_returns_the_last_error_after_its_limit() {
        let mut n = 0;
        let r: Result<(), String> = try_eventually(Duration::from_millis(300), || {
            n += 1;
            let e = format!("try {n}");
            async move { Err(e) }
        })
        .await;
        let e = r.expect_err("never Ok");
        assert!(e.starts_with("try "), "{e}");
        assert!(n >= 2, "asked again: {n}");
    }
}
