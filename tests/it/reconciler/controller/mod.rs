//! The real reconciler against the in-repo test API server: each scenario of KEP-467's
//! integration test plan as a sequence of pod annotation changes, the JobSet status and events
//! that result, the number of status writes, and the faults it must ride through.

use std::future::Future;
use std::time::Duration;

use jobset_inplace::protocol::{Dialect, JOBSET_NAME_LABEL};
use jobset_inplace::reconciler::controller::StateSizes;
use jobset_inplace::reconciler::metrics::Metrics;
use jobset_inplace::reconciler::{self, Controller, LeaderElection, Options};
use jobset_inplace_testkit as testkit;
use jobset_inplace_testkit::apiserver::{
    Chaos, Options as ServerOptions, TestApiServer, Verb, default_resources,
};
use jobset_inplace_testkit::reconciler::member_of;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::logs;
use jobset_inplace_testkit::build::{Job, JobSet, Pod, ReplicatedJob};

const NS: &str = "team-a";
const LIMIT: Duration = Duration::from_secs(20);

fn options(dialect: Dialect, identity: &str, leader: Option<LeaderElection>) -> Options {
    Options {
        leader_election: leader,
        ..testkit::reconciler::options(dialect, identity)
    }
}

/// A reconciler running in this process until dropped or stopped.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), reconciler::Error>>,
}

impl Running {
    fn start(server: &TestApiServer, options: Options) -> Running {
        Running::start_with(server.client(), options)
    }

    fn start_with(client: kube::Client, options: Options) -> Running {
        Running::spawn(client, options, None)
    }

    /// With its health and metrics listener on a free loopback port: the port's address.
    async fn serving(client: kube::Client, options: Options) -> (Running, std::net::SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        (Running::spawn(client, options, Some(listener)), addr)
    }

    fn spawn(
        client: kube::Client,
        options: Options,
        listener: Option<tokio::net::TcpListener>,
    ) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(reconciler::run(client, options, listener, async {
            let _ = stopped.await;
        }));
        Running {
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) -> Result<(), reconciler::Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(LIMIT, &mut self.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => panic!("reconciler task panicked: {e}"),
            Err(_) => panic!("reconciler did not stop"),
        }
    }
}

impl Running {
    /// Waits for the reconciler to end by itself.
    async fn task_result(mut self) -> Result<(), reconciler::Error> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => panic!("reconciler task panicked: {e}"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reconciler's lease, `jobset-inplace-system/jobset-inplace-reconciler`.
fn lease(duration: Duration, grace: Duration) -> LeaderElection {
    LeaderElection {
        lease_name: "jobset-inplace-reconciler".into(),
        lease_namespace: "jobset-inplace-system".into(),
        duration,
        grace,
    }
}

struct World {
    server: TestApiServer,
    dialect: Dialect,
    jobset: String,
}

impl World {
    /// Another writer (JobSet's own controller, epoch dialect) drops both epoch fields.
    fn wipe_epoch_fields(&self) {
        let mut js = self.stored();
        if let Some(status) = js["status"].as_object_mut() {
            status.remove("deprecatedEpoch");
            status.remove("syncedEpoch");
        }
        js["metadata"]
            .as_object_mut()
            .map(|m| m.remove("resourceVersion"));
        self.server.put("jobsets", js).expect("wipe");
    }

    async fn new(dialect: Dialect, replicated: &[(i64, i64)], max_restarts: i64) -> World {
        Self::on(
            TestApiServer::start().await,
            dialect,
            replicated,
            max_restarts,
        )
    }

    fn on(
        server: TestApiServer,
        dialect: Dialect,
        replicated: &[(i64, i64)],
        max_restarts: i64,
    ) -> World {
        let name = "js";
        server
            .create(
                "jobsets",
                JobSet::new(name)
                    .namespace(NS)
                    .max_restarts(max_restarts)
                    .replicated_jobs(replicated.iter().enumerate().map(|(i, (replicas, pods))| {
                        ReplicatedJob::new(&format!("rj{i}"))
                            .replicas(*replicas)
                            .pods(*pods)
                    }))
                    .build(),
            )
            .expect("jobset");
        let pods: i64 = replicated.iter().map(|(r, p)| r * p).sum();
        for i in 0..pods {
            server
                .create(
                    "pods",
                    member_of(
                        &server,
                        Pod::worker(NS, name, &format!("{name}-{i}"))
                            .running()
                            .build(),
                    ),
                )
                .expect("pod");
        }
        World {
            server,
            dialect,
            jobset: name.to_owned(),
        }
    }

    /// A reconciler of this world's dialect, without leader election.
    fn start(&self, identity: &str) -> Running {
        Running::start(&self.server, options(self.dialect, identity, None))
    }

    /// Pods `0..pods` move to `epoch`; waits until the status says it is synced.
    async fn sync_pods(&self, pods: usize, epoch: i64, what: &str) {
        for i in 0..pods {
            self.set_epoch(i, epoch);
        }
        self.until(what, |w| w.synced() == Some(epoch)).await;
    }

    fn first(&self) -> i64 {
        i64::from(self.dialect.first_epoch())
    }

    fn set_epoch(&self, pod: usize, epoch: i64) {
        let name = format!("{}-{pod}", self.jobset);
        let patch = json!({"metadata": {"annotations": {self.dialect.pod_annotation(): epoch.to_string()}}});
        self.server
            .patch("pods", NS, &name, &patch)
            .expect("pod annotation");
    }

    fn set_raw_epoch(&self, pod: usize, value: &str) {
        let name = format!("{}-{pod}", self.jobset);
        let patch = json!({"metadata": {"annotations": {self.dialect.pod_annotation(): value}}});
        self.server.patch("pods", NS, &name, &patch).expect("pod");
    }

    fn patch_pod(&self, pod: usize, patch: Value) {
        let name = format!("{}-{pod}", self.jobset);
        self.server.patch("pods", NS, &name, &patch).expect("pod");
    }

    fn stored(&self) -> Value {
        self.server
            .get("jobsets", NS, &self.jobset)
            .expect("jobset")
    }

    fn field(&self, field: &str) -> Option<i64> {
        self.stored()["status"][field].as_i64()
    }

    fn deprecated(&self) -> Option<i64> {
        self.field(self.dialect.deprecated_field())
    }

    fn synced(&self) -> Option<i64> {
        self.field(self.dialect.synced_field())
    }

    /// The synced epoch of the JobSet's published `JobSetEpoch` object.
    fn published_synced(&self) -> Option<i64> {
        self.server.get("jobsetepochs", NS, &self.jobset)?["epochs"]["synced"].as_i64()
    }

    fn status_writes(&self) -> u64 {
        self.server.counters().get(Verb::Patch, "jobsets/status")
    }

    fn events(&self) -> Vec<Value> {
        let mut events = self.server.list("events.events.k8s.io", Some(NS));
        events.extend(self.server.list("events", Some(NS)));
        events
    }

    fn has_event(&self, reason: &str) -> bool {
        self.events().iter().any(|e| e["reason"] == reason)
    }

    async fn until(&self, what: &str, f: impl Fn(&World) -> bool) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        while !f(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; status: {}",
                self.stored()["status"]
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets the reconciler react, then checks nothing was written.
    async fn quiet(&self, what: &str) {
        let before = self.status_writes();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            self.status_writes(),
            before,
            "{what}: unexpected status write"
        );
    }
}
mod bounded_state;
mod faults;
mod lifecycle;
mod protocol;
mod provisioning;

// ---------------------------------------------------------------------------------------------
// Running one
// ---------------------------------------------------------------------------------------------

async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long");
}
