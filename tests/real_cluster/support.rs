//! What several areas of the real-cluster tests share: the webhook and reconciler they run,
//! the JobSets and fixtures they write, the API server's metrics, the doctor's report.

use super::*;

/// A token of the agent's ServiceAccount, bound to `pod` when given.
pub(crate) async fn agent_token(cluster: &Cluster, namespace: &str, pod: Option<&Pod>) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: p.metadata.name.clone(),
                uid: p.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    accounts
        .create_token_request(AGENT_SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("token")
        .token
}

pub(crate) fn merge(patch: Value) -> Patch<Value> {
    Patch::Merge(patch)
}

pub(crate) fn epoch_patch(value: &str) -> Patch<Value> {
    merge(json!({"metadata": {"annotations": {EPOCH_ANNOTATION: value}}}))
}

/// `jobset-inplace webhook` on loopback with a certificate it generates; killed when dropped.
pub(crate) struct Webhook {
    pub(crate) child: tokio::process::Child,
    pub(crate) port: u16,
    /// `/healthz`, `/readyz`, `/metrics`.
    pub(crate) health: u16,
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) _dir: tempfile::TempDir,
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// GET `path` on loopback HTTP; whether the answer was 200.
pub(crate) async fn http_ok(port: u16, path: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer);
    if answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(answer.lines().next().unwrap_or("").to_owned())
    }
}

impl Webhook {
    pub(crate) async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With more `webhook` arguments (an injection setting, an injection config's flags).
    pub(crate) async fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let port = free_port();
        let health = free_port();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .env_clear()
            .args([
                "webhook",
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--health-addr",
                &format!("127.0.0.1:{health}"),
                // /metrics on the health port: this webhook has no kubeconfig to review tokens.
                "--metrics-secure=false",
                "--cert-dir",
                &dir.path().display().to_string(),
            ])
            .args(extra)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the webhook");
        eventually("the webhook is ready", Duration::from_secs(30), || {
            http_ok(health, "/readyz")
        })
        .await;
        let ca_pem = std::fs::read(dir.path().join("ca.crt")).expect("the webhook's ca.crt");
        Webhook {
            child,
            port,
            health,
            ca_pem,
            _dir: dir,
        }
    }

    pub(crate) async fn stop(mut self) {
        self.child.kill().await.expect("stop the webhook");
    }
}

/// Installs the `epoch` overlay and serves the webhook binary on loopback behind the overlay's
/// own webhook configurations (only their client config pointed at it).
pub(crate) async fn serve_webhook(cluster: &Cluster) -> Webhook {
    serve_webhook_with(cluster, &[]).await
}

/// The same with more arguments to the webhook binary.
pub(crate) async fn serve_webhook_with(cluster: &Cluster, extra: &[&str]) -> Webhook {
    let configurations: Vec<Value> = install(cluster, "epoch")
        .await
        .into_iter()
        .filter(|o| {
            o["kind"] == "MutatingWebhookConfiguration"
                || o["kind"] == "ValidatingWebhookConfiguration"
        })
        .collect();
    let webhook = Webhook::start_with(extra).await;
    apply(cluster, &pointed_at(&configurations, &webhook))
        .await
        .expect("webhook configurations");
    webhook
}

/// A plain InPlaceRestart JobSet `train` (the `story1-plain` fixture) of one Job of `pods` pods.
pub(crate) fn train_jobset(namespace: &str, pods: usize) -> DynamicObject {
    let mut js = fixture_object("story1-plain");
    js["metadata"] = json!({"name": "train", "namespace": namespace});
    js["spec"]["replicatedJobs"][0]["replicas"] = json!(1);
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = json!(pods);
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = json!(pods);
    serde_json::from_value(js).expect("JobSet")
}

/// Creates `js` once our webhook's configurations are in force (they may take a moment): a dry
/// run must come back injected first.
pub(crate) async fn create_injected(
    jobsets: &Api<DynamicObject>,
    js: &DynamicObject,
) -> Result<(), String> {
    try_eventually(Duration::from_secs(30), || async {
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let created = jobsets
            .create(&dry_run, js)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::to_string(&created.data)
            .unwrap_or_default()
            .contains(INJECTED_ANNOTATION)
            .then_some(())
            .ok_or_else(|| "not injected yet".to_owned())
    })
    .await
    .map_err(|e| format!("the JobSet created injected: {e}"))?;
    jobsets
        .create(&PostParams::default(), js)
        .await
        .map(|_| ())
        .map_err(|e| format!("create the JobSet: {e}"))
}

/// The overlay's webhook configurations with only `clientConfig` pointed at `webhook`.
pub(crate) fn pointed_at(configurations: &[Value], webhook: &Webhook) -> Vec<Value> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&webhook.ca_pem);
    configurations
        .iter()
        .map(|c| {
            let mut c = c.clone();
            for hook in c["webhooks"].as_array_mut().expect("webhooks") {
                let path = hook["clientConfig"]["service"]["path"]
                    .as_str()
                    .expect("path")
                    .to_owned();
                hook["clientConfig"] = json!({
                    "url": format!("https://127.0.0.1:{}{path}", webhook.port),
                    "caBundle": ca
                });
            }
            c
        })
        .collect()
}

/// The object of a fixture's AdmissionReview (`request.json` or `request.yaml`).
pub(crate) fn fixture_object(case: &str) -> Value {
    let dir = manifest_dir().join("fixtures/admission").join(case);
    let review: Value = match std::fs::read(dir.join("request.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes).expect("json"),
        Err(_) => fixture_yaml(case, "request.yaml"),
    };
    review["request"]["object"].clone()
}

pub(crate) fn fixture_yaml(case: &str, file: &str) -> Value {
    let path = manifest_dir()
        .join("fixtures/admission")
        .join(case)
        .join(file);
    serde_saphyr::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("yaml")
}

/// The injected agent's image in a JobSet (its first replicatedJob).
pub(crate) fn agent_image(js: &DynamicObject) -> Option<String> {
    js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "jobset-inplace-agent")?["image"]
        .as_str()
        .map(str::to_owned)
}

pub(crate) const SYSTEM_NAMESPACE: &str = "jobset-inplace-system";

pub(crate) const RECONCILER_ACCOUNT: &str = "jobset-inplace-reconciler";

/// `jobset-inplace reconciler` as the overlay's ServiceAccount (a token, no pod), killed when
/// dropped.
pub(crate) struct Reconciler {
    pub(crate) child: tokio::process::Child,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) health: u16,
}

impl Reconciler {
    /// With a short Lease (6 s, renewed 2 s before): the hand-over test needs it.
    pub(crate) async fn start(cluster: &Cluster, identity: &str) -> Self {
        Self::start_with_lease(cluster, identity, 6, 2).await
    }

    /// With the Lease's duration and grace given (seconds). A replica that sees no renewal of
    /// its own Lease in time exits: under load, a short Lease ends the reconciler.
    pub(crate) async fn start_with_lease(
        cluster: &Cluster,
        identity: &str,
        duration: u64,
        grace: u64,
    ) -> Self {
        let accounts: Api<ServiceAccount> =
            Api::namespaced(cluster.client.clone(), SYSTEM_NAMESPACE);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                expiration_seconds: Some(3600),
                bound_object_ref: None,
            },
            ..Default::default()
        };
        let token = accounts
            .create_token_request(RECONCILER_ACCOUNT, &PostParams::default(), &request)
            .await
            .expect("the reconciler's token")
            .status
            .expect("token")
            .token;
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
                 certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\n\
                 contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
                cluster.server, cluster.ca_data
            ),
        )
        .expect("write");
        let health = free_port();
        let log = std::fs::File::create(dir.path().join("log")).expect("log");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .env(
                "JOBSET_INPLACE_LOG_LEVEL",
                "info,jobset_inplace=debug,kube_lease_manager=debug",
            )
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .args([
                "reconciler",
                "--health-addr",
                &format!("127.0.0.1:{health}"),
                // Replicas side by side: no HTTPS metrics listener each.
                "--metrics-secure=false",
                "--lease-namespace",
                SYSTEM_NAMESPACE,
                "--identity",
                identity,
                "--lease-duration-seconds",
                &duration.to_string(),
                "--lease-grace-seconds",
                &grace.to_string(),
                // As the deployed reconciler: the agents' FlowSchema (deploy/base/flowcontrol.yaml).
                "--agent-flow-schema",
                "jobset-inplace-agents",
            ])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the reconciler");
        Reconciler { child, dir, health }
    }

    /// Waits for its /readyz (the three caches synced once).
    pub(crate) async fn ready(&self) {
        reconciler_ready(self.health, || self.log_tail()).await;
    }

    /// Its log without the lease renewals (for a failure message).
    pub(crate) fn log_tail(&self) -> String {
        let lines = reconciler_log(&self.dir.path().join("log"));
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    pub(crate) async fn kill(mut self) {
        self.child.kill().await.expect("kill the reconciler");
    }
}

/// Waits (60 s) for a reconciler's /readyz; panics with its log otherwise.
pub(crate) async fn reconciler_ready(health: u16, log: impl Fn() -> String) {
    try_eventually(Duration::from_secs(60), || http_ok(health, "/readyz"))
        .await
        .unwrap_or_else(|e| panic!("the reconciler is not ready: {e}\nreconciler:\n{}", log()));
}

/// A reconciler's log without the lease renewals.
pub(crate) fn reconciler_log(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains("DEBUG kube_lease_manager"))
        .map(str::to_owned)
        .collect()
}

/// The reconciler as its Deployment runs it: when the process exits (a replica that saw no
/// renewal of its Lease in time steps down and exits, as it must), it is started again after
/// the kubelet's first crash-loop back-off (10 s), with a fresh token. For the measurements,
/// where the API server under thousands of pods can miss a Lease; without it, a step-down
/// stalled every later group restart. Dropping it kills the running process.
pub(crate) struct SupervisedReconciler {
    pub(crate) task: tokio::task::JoinHandle<()>,
    /// The first run's /readyz port, and every run's log so far.
    pub(crate) health: u16,
    pub(crate) logs: std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>,
    pub(crate) restarts: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// The running reconciler's process (its CPU, for the scale measurement).
    pub(crate) pid: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl SupervisedReconciler {
    pub(crate) async fn start(
        cluster: &Cluster,
        identity: &str,
        duration: u64,
        grace: u64,
    ) -> Self {
        let first = Reconciler::start_with_lease(cluster, identity, duration, grace).await;
        let health = first.health;
        let logs = std::sync::Arc::new(std::sync::Mutex::new(vec![first.dir.path().join("log")]));
        let restarts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let pid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(
            first.child.id().unwrap_or_default(),
        ));
        let (cluster, identity) = (cluster.clone(), identity.to_owned());
        let (task_logs, task_restarts, task_pid) = (logs.clone(), restarts.clone(), pid.clone());
        let task = tokio::spawn(async move {
            // Every run's directory is kept (its log) until the supervisor ends.
            let mut dirs = Vec::new();
            let mut run = first;
            loop {
                let _ = run.child.wait().await;
                dirs.push(run.dir);
                tokio::time::sleep(Duration::from_secs(10)).await;
                run = Reconciler::start_with_lease(&cluster, &identity, duration, grace).await;
                task_restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                task_pid.store(
                    run.child.id().unwrap_or_default(),
                    std::sync::atomic::Ordering::Relaxed,
                );
                if let Ok(mut logs) = task_logs.lock() {
                    logs.push(run.dir.path().join("log"));
                }
            }
        });
        SupervisedReconciler {
            task,
            health,
            logs,
            restarts,
            pid,
        }
    }

    /// Waits for the first run's /readyz.
    pub(crate) async fn ready(&self) {
        reconciler_ready(self.health, || self.log_tail()).await;
    }

    pub(crate) fn restarts(&self) -> u32 {
        self.restarts.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every run's log without the lease renewals, the last 80 lines.
    pub(crate) fn log_tail(&self) -> String {
        let paths = self.logs.lock().map(|l| l.clone()).unwrap_or_default();
        let mut lines = Vec::new();
        for (run, path) in paths.iter().enumerate() {
            lines.push(format!("-- run {}", run + 1));
            lines.extend(reconciler_log(path));
        }
        lines[lines.len().saturating_sub(80)..].join("\n")
    }

    pub(crate) async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The JobSet's epoch status fields: (deprecatedEpoch, syncedEpoch).
pub(crate) async fn epochs(
    jobsets: &Api<DynamicObject>,
    name: &str,
) -> Result<(Option<i64>, Option<i64>), String> {
    let js = jobsets.get(name).await.map_err(|e| e.to_string())?;
    let status = &js.data["status"];
    Ok((
        status["deprecatedEpoch"].as_i64(),
        status["syncedEpoch"].as_i64(),
    ))
}

/// Whether JobSet's controller runs in this cluster (scripts/control-plane.sh starts it and
/// registers its webhook configurations, named `jobset-...`).
pub(crate) async fn jobset_controller_runs(cluster: &Cluster) -> bool {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
        .get_opt("jobset-mutating-webhook-configuration")
        .await
        .expect("webhook configurations")
        .is_some()
}

/// A token of a ServiceAccount of `namespace` (not bound to any object).
pub(crate) async fn account_token(cluster: &Cluster, namespace: &str, account: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("token")
        .token
}

/// Deletes namespaced objects with kubectl when dropped (also when the test panics): what an
/// attack that was not refused left behind.
pub(crate) struct Leftovers {
    pub(crate) kubeconfig: PathBuf,
    pub(crate) objects: Vec<(String, &'static str, String)>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for (namespace, kind, name) in &self.objects {
            let _ = std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["delete", kind, name, "-n", namespace, "--wait=false"])
                .arg("--ignore-not-found")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Waits until the API server enforces `policy` (a policy takes a moment after it is created):
/// `probe`, a dry run, is refused by it.
pub(crate) async fn until_enforced<T, F, Fut>(policy: &str, probe: F)
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut probe = probe;
    eventually(
        &format!("the API server enforces {policy}"),
        Duration::from_secs(60),
        || {
            let attempt = probe();
            async move {
                match attempt.await {
                    Err(kube::Error::Api(s)) if s.message.contains(policy) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
}

/// Deletes the test's `Node` when dropped (also when the test panics), as [`TestNamespace`] does
/// its namespace.
pub(crate) struct NodeCleanup {
    pub(crate) kubeconfig: PathBuf,
    pub(crate) name: String,
}

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        delete_now(&self.kubeconfig, "node", &self.name);
    }
}

pub(crate) fn jobset_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet");
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

pub(crate) fn dynamic<K: kube::Resource<DynamicType = ()>>(
    client: &Client,
    namespace: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<K>(&()))
}

pub(crate) fn status_error<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("not an API error: {other:?}"),
    }
}

/// Adds the `epoch` dialect's status fields to the installed JobSet CRD unless it has them (as
/// the overlays of that dialect install it, and as the test API server knows it).
pub(crate) async fn ensure_epoch_status_fields(cluster: &Cluster) {
    let crds: Api<DynamicObject> = Api::all_with(
        cluster.client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
        )),
    );
    let crd = crds
        .get("jobsets.jobset.x-k8s.io")
        .await
        .expect("JobSet CRD");
    let has = crd.data["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        ["properties"]
        .get("syncedEpoch")
        .is_some();
    if has {
        return;
    }
    let text = std::fs::read_to_string(
        manifest_dir().join("deploy/components/epoch-status-fields/crd-status-fields.yaml"),
    )
    .expect("component patch");
    let patch: json_patch::Patch = serde_saphyr::from_str(&text).expect("JSON patch");
    crds.patch(
        "jobsets.jobset.x-k8s.io",
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await
    .expect("add the epoch status fields");
}

/// The counters of the API server's own `/metrics` this measurement reads: requests by verb and
/// resource (and by verb, resource and response code), watch events and their bytes by
/// resource, API Priority and Fairness rejections by priority level and reason.
#[derive(Clone, Debug, Default)]
pub(crate) struct ApiMetrics {
    pub(crate) requests: std::collections::BTreeMap<String, f64>,
    /// `VERB resource CODE`.
    pub(crate) responses: std::collections::BTreeMap<String, f64>,
    pub(crate) watch_events: std::collections::BTreeMap<String, f64>,
    pub(crate) watch_bytes: std::collections::BTreeMap<String, f64>,
    /// `priority_level reason` (`apiserver_flowcontrol_rejected_requests_total`).
    pub(crate) rejected: std::collections::BTreeMap<String, f64>,
}

/// The labels of one metric line (`name{a="x",b="y"} value`) and its value.
pub(crate) fn metric_line(
    line: &str,
) -> Option<(&str, std::collections::BTreeMap<String, String>, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse::<f64>().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}')?),
        None => (head, ""),
    };
    let mut out = std::collections::BTreeMap::new();
    let mut rest = labels;
    while let Some((key, after)) = rest.split_once("=\"") {
        let end = after.find('"')?;
        out.insert(
            key.trim_start_matches(',').to_owned(),
            after[..end].to_owned(),
        );
        rest = &after[end + 1..];
    }
    Some((name, out, value))
}

pub(crate) async fn api_metrics(cluster: &Cluster) -> Result<ApiMetrics, String> {
    let request = hyper::http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = tokio::time::timeout(
        Duration::from_secs(30),
        cluster.client.request_text(request),
    )
    .await
    .map_err(|_| "no /metrics within 30 s".to_owned())?
    .map_err(|e| e.to_string())?;
    let mut m = ApiMetrics::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, labels, value)) = metric_line(line) else {
            continue;
        };
        let label = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
        if name == "apiserver_flowcontrol_rejected_requests_total" {
            *m.rejected
                .entry(format!("{} {}", label("priority_level"), label("reason")))
                .or_default() += value;
            continue;
        }
        let resource = match (label("group"), label("resource")) {
            (_, "") => continue,
            ("", r) => r.to_owned(),
            (g, r) => format!("{r}.{g}"),
        };
        match name {
            "apiserver_request_total" => {
                let sub = match label("subresource") {
                    "" => String::new(),
                    s => format!("/{s}"),
                };
                *m.requests
                    .entry(format!("{} {resource}{sub}", label("verb")))
                    .or_default() += value;
                *m.responses
                    .entry(format!(
                        "{} {resource}{sub} {}",
                        label("verb"),
                        label("code")
                    ))
                    .or_default() += value;
            }
            "apiserver_watch_events_total" => {
                *m.watch_events.entry(resource).or_default() += value;
            }
            "apiserver_watch_events_sizes_sum" => {
                *m.watch_bytes.entry(resource).or_default() += value;
            }
            _ => {}
        }
    }
    Ok(m)
}

pub(crate) fn metrics_delta(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// `jobset-inplace [global] doctor -o json --kubeconfig K [args]` against the cluster: its report
/// and exit code.
pub(crate) async fn doctor(
    cluster: &Cluster,
    global: &[&str],
    args: &[&str],
) -> (Value, Option<i32>) {
    let (report, code, _) = run_doctor(&cluster.kubeconfig, global, args).await;
    (report, code)
}

/// `jobset-inplace [global] doctor -o json --kubeconfig KUBECONFIG [args]`: its report, exit code
/// and stderr.
pub(crate) async fn run_doctor(
    kubeconfig: &Path,
    global: &[&str],
    args: &[&str],
) -> (Value, Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
        .env_clear()
        .args(global)
        .arg("doctor")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-o", "json"])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("doctor returns")
        .expect("doctor runs");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor's JSON: {e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (report, out.status.code(), stderr)
}

/// The finding of `check` in a doctor report.
pub(crate) fn finding(report: &Value, check: &str) -> Value {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|f| f["check"] == check))
        .cloned()
        .unwrap_or_else(|| panic!("no {check} in {report:#}"))
}

/// Sets the installed JobSet CRD's v1alpha2 status fields: the released CRD's (with the attempt
/// fields, or without them) and, with `epoch`, the epoch-status-fields patch's.
pub(crate) async fn set_jobset_crd_fields(cluster: &Cluster, attempt: bool, epoch: bool) {
    let crds: Api<DynamicObject> = Api::all_with(
        cluster.client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
        )),
    );
    let released: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(
            manifest_dir().join("fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml"),
        )
        .expect("released CRD"),
    )
    .expect("yaml");
    let mut spec = released["spec"].clone();
    let status =
        &mut spec["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    let props = status.as_object_mut().expect("status properties");
    if !attempt {
        props.remove("previousInPlaceRestartAttempt");
        props.remove("currentInPlaceRestartAttempt");
    }
    if epoch {
        props.insert(
            "deprecatedEpoch".into(),
            json!({"type": "integer", "format": "int32", "minimum": 0}),
        );
        props.insert(
            "syncedEpoch".into(),
            json!({"type": "integer", "format": "int32", "minimum": 0}),
        );
    }
    let mut live = crds
        .get("jobsets.jobset.x-k8s.io")
        .await
        .expect("JobSet CRD");
    live.data["spec"] = spec;
    crds.replace("jobsets.jobset.x-k8s.io", &PostParams::default(), &live)
        .await
        .expect("replace the JobSet CRD");
}

/// The addons a run requires (CI: `kueue,trainer`): a test of one that was not started then
/// fails instead of skipping.
pub(crate) const ADDONS_ENV: &str = "JOBSET_INPLACE_REAL_CLUSTER_ADDONS";

/// Whether `addon` was started beside the control plane: `DIR/addons` (written by `up --with`,
/// beside `DIR/kubeconfig`) names it. When it does not: SKIPPED loudly, or a failure where
/// `JOBSET_INPLACE_REAL_CLUSTER_ADDONS` names the addon.
pub(crate) fn addon_started(cluster: &Cluster, test: &str, addon: &str) -> bool {
    let file = cluster
        .kubeconfig
        .parent()
        .map(|d| d.join("addons"))
        .unwrap_or_default();
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
             (scripts/control-plane.sh up DIR --with {addon})",
            file.display()
        );
    }
    eprintln!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !! SKIPPED {test}: {addon} was not started with the control plane\n\
         !! (scripts/control-plane.sh up DIR --with {addon}; {} does not name it)\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
        file.display()
    );
    false
}

pub(crate) fn agent_of_template(js: &DynamicObject) -> String {
    js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"]
        [0]["name"]
        .as_str()
        .unwrap_or("none")
        .to_owned()
}

/// A TrainJob `name` of ClusterTrainingRuntime `runtime`.
pub(crate) fn train_job(name: &str, runtime: &str, suspend: bool) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"suspend": suspend, "runtimeRef": {"name": runtime,
            "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"}},
    }))
    .expect("TrainJob")
}

/// What Trainer reported of its TrainJobs' reconciles in `namespace`: its Warning events
/// `TrainJobResourcesCreationFailed` (a refused JobSet apply), as "TRAINJOB: NOTE".
pub(crate) async fn trainer_failures(
    client: &Client,
    namespace: &str,
) -> Result<Vec<String>, String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), namespace);
    Ok(events
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("TrainJobResourcesCreationFailed"))
        .map(|e| {
            format!(
                "{}: {}",
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            )
        })
        .collect())
}
