//! What several areas of the real-node tests share: the installed product's JobSets, the workers'
//! records' reading (the barrier, in place, a failure's gaps), the registry's image checks.

use super::*;
use jobset_inplace_testkit::build::{JobSet, ReplicatedJob};

/// The names the installed variant's protocol uses (node.env `INSTALL_VARIANT`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect {
    /// The pod annotation the agent writes its epoch into.
    pub(crate) epoch_annotation: &'static str,
    /// The JobSet status field of the synced epoch.
    pub(crate) synced: &'static str,
    /// The reconciler writes the epochs (not JobSet's own controller, as in `jobset-native`):
    /// its `GroupRestartStarted` events say what started each group restart.
    pub(crate) reconciler_writes: bool,
}

/// The installed product's dialect, or `None` (SKIPPED, or a panic when required) when `up` ran
/// without `--install`.
pub(crate) fn installed(node: &Node, test: &str) -> Option<Dialect> {
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

/// What is wrong with one installed pod's containers for an image pulled from a registry
/// (`up --registry --install`): every container (init ones too) must run `image` (the
/// registry's `REPOSITORY:VERSION`) and report `image_id`, `REPOSITORY@<the index digest
/// dist/ recorded>` (containerd's CRI gives the image's repo digest: the digest of what the tag
/// resolved to, here the multi-arch index, not the platform's manifest). Empty: all is well.
pub(crate) fn registry_image_problems(pod: &Pod, image: &str, image_id: &str) -> Vec<String> {
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

pub(crate) fn jobset_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet");
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

/// A container of the test image in a JobSet: records with the epoch its pod had when it started
/// (the downward API resolves the annotation at each container start).
pub(crate) fn recording_container(name: &str, dialect: Dialect) -> serde_json::Value {
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
pub(crate) fn restarting_worker(dialect: Dialect, not: &[i32]) -> serde_json::Value {
    let mut worker = recording_container("worker", dialect);
    worker["restartPolicy"] = json!("Never");
    worker["restartPolicyRules"] = json!([
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": not}}
    ]);
    worker
}

/// A plain InPlaceRestart JobSet `train` of one Job of `pods` pods on the real node, as JobSet's
/// own webhook requires it (backoffLimit MaxInt32, podReplacementPolicy Failed, completions =
/// parallelism); `edit` changes it before it is sent.
pub(crate) fn train_jobset(
    pods: usize,
    records: &Path,
    dialect: Dialect,
    edit: impl FnOnce(&mut serde_json::Value),
) -> DynamicObject {
    let mut js = JobSet::new("train")
        .no_status()
        .max_restarts(20)
        .replicated_jobs([ReplicatedJob::new("workers")
            .pods(pods as i64)
            .pod_spec("restartPolicy", json!("Never"))
            .pod_spec("terminationGracePeriodSeconds", json!(30))
            .pod_spec("tolerations", json!([real_node_toleration()]))
            .containers(json!([restarting_worker(dialect, &[0])]))
            .pod_spec(
                "volumes",
                json!([
                    {"name": "records", "hostPath": {"path": records, "type": "Directory"}},
                    {"name": "scratch", "emptyDir": {}}
                ]),
            )])
        .as_jobset_requires()
        .build();
    edit(&mut js);
    serde_json::from_value(js).expect("JobSet")
}

/// [`train_jobset`]'s JobSet as JobSet's own recreation runs it: no InPlaceRestart (`Recreate`,
/// maxRestarts 20), the Job failing at its first pod failure (`backoffLimit: 0`, its default
/// `podReplacementPolicy`), a plain worker (no restart rules); the webhook leaves it alone.
pub(crate) fn recreating(js: &mut serde_json::Value, dialect: Dialect) {
    js["spec"]["failurePolicy"] = json!({"maxRestarts": 20});
    let job = &mut js["spec"]["replicatedJobs"][0]["template"]["spec"];
    job["backoffLimit"] = json!(0);
    job.as_object_mut()
        .map(|o| o.remove("podReplacementPolicy"));
    job["template"]["spec"]["containers"] = json!([recording_container("worker", dialect)]);
}

/// Creates `js`, which the webhook must leave alone (a JobSet without InPlaceRestart).
pub(crate) async fn create_not_injected(jobsets: &Api<DynamicObject>, js: &DynamicObject) {
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
pub(crate) struct Run {
    pub(crate) _ns: TestNamespace,
    pub(crate) records: tempfile::TempDir,
    pub(crate) pods: Api<Pod>,
    pub(crate) jobsets: Api<DynamicObject>,
    pub(crate) dialect: Dialect,
    pub(crate) size: usize,
    /// The name of the worker container (its records' `container`, its exit file).
    pub(crate) worker: &'static str,
}

impl Run {
    /// Loads the test image, creates the namespace and the JobSet (through the installed
    /// webhook: it must come back injected), and waits for every worker running.
    pub(crate) async fn start(
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
    pub(crate) async fn prepare(node: &Node, prefix: &str, size: usize, dialect: Dialect) -> Self {
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
    pub(crate) fn set_worker(&mut self, name: &'static str) {
        self.worker = name;
    }

    pub(crate) fn namespace(&self) -> &str {
        &self._ns.name
    }

    pub(crate) fn records(&self) -> Vec<Record> {
        read_records(self.records.path())
    }

    /// The records' mark now ([`records_mark`]).
    pub(crate) fn mark(&self) -> usize {
        records_mark(self.records.path())
    }

    /// The JobSet's pods that are not terminating, by name.
    pub(crate) async fn live_pods(&self) -> Result<BTreeMap<String, Pod>, String> {
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
    pub(crate) async fn running(&self, above: Option<u64>, since: usize, limit: Duration) -> Group {
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
    pub(crate) async fn diagnosis(&self) -> String {
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
    pub(crate) async fn restarts_started(&self) -> Vec<String> {
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
    pub(crate) async fn assert_started_by(&self, early: Option<&str>) {
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
    pub(crate) async fn registration_ms(&self, pods: &Group) -> BTreeMap<String, u64> {
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
    pub(crate) async fn synced(&self) -> Option<u64> {
        let js = self.jobsets.get("train").await.ok()?;
        js.data["status"][self.dialect.synced].as_u64()
    }

    /// Tells the worker of `pod` to exit with `code`.
    pub(crate) fn exit(&self, pod: &str, code: i32) {
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
pub(crate) fn assert_injected(js: &DynamicObject) {
    let spec = serde_json::to_string(&js.data["spec"]).unwrap_or_default();
    assert!(
        spec.contains("jobset-inplace-agent") && spec.contains("RestartAllContainers"),
        "the installed webhook injected the agent: {spec}"
    );
}

/// The group at one moment: every pod running at `epoch`.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) pods: BTreeMap<String, Pod>,
    pub(crate) epoch: u64,
}

pub(crate) fn pod_epoch(pod: &Pod, dialect: Dialect) -> Option<u64> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(dialect.epoch_annotation)?
        .parse()
        .ok()
}

/// Every pod of `before` is in `after` in place: same UID, same IP, every container's
/// `restartCount` one up.
pub(crate) fn assert_in_place(before: &Group, after: &Group, except: &[&str]) {
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
pub(crate) fn assert_barrier(records: &[Record], since: usize, pods: usize) -> Duration {
    assert_barrier_of(records, since, pods, "worker")
}

/// [`assert_barrier`] of the workers named `container`.
pub(crate) fn assert_barrier_of(
    records: &[Record],
    since: usize,
    pods: usize,
    container: &str,
) -> Duration {
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
pub(crate) async fn group_restart(run: &Run, before: &Group, code: i32) -> (Group, Duration) {
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

/// The exit code of the headline's failures (non-zero: under `RestartAllContainers`).
pub(crate) const HEADLINE_CODE: i32 = 42;

/// Waits until `size` live pods of `selector` in `pods` each run their worker, started since the
/// records' mark `since` ([`records_mark`]); returns the pods by name.
pub(crate) async fn workers_running_since(
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
pub(crate) async fn fail_and_recover(
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
pub(crate) fn pod_slot(pod: &str) -> &str {
    pod.rsplit_once('-').map_or(pod, |(slot, _)| slot)
}

/// One worker's way through a failure, in ms after the failing worker's end: its own end (`exit`
/// or `stop`, the SIGTERM) and its next start.
#[derive(Debug, Clone)]
pub(crate) struct Gap {
    pub(crate) slot: String,
    pub(crate) end_event: String,
    pub(crate) end: u64,
    pub(crate) start: Option<u64>,
}

/// One failure of a headline case, from the workers' records since its mark: the failing
/// worker's end to the last worker's start, and every worker's end-to-start gap.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) took: Duration,
    pub(crate) gaps: Vec<Gap>,
}

pub(crate) fn failure_since(records: &[Record], since: usize) -> Failure {
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
pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) failures: Vec<Failure>,
}

impl Case {
    pub(crate) fn new(name: &'static str) -> Self {
        Case {
            name,
            failures: Vec::new(),
        }
    }

    /// Records the failure since the mark `since` and prints it: the total, then each worker's
    /// end and next start (ms after the failing worker's end) and the gap between them.
    pub(crate) fn add(&mut self, records: &[Record], since: usize) {
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

    pub(crate) fn took(&self) -> Vec<u128> {
        self.failures.iter().map(|f| f.took.as_millis()).collect()
    }

    /// The end-to-start gaps of each failure, ms.
    pub(crate) fn gaps(&self) -> Vec<Vec<Option<u64>>> {
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

    pub(crate) fn median_ms(&self) -> f64 {
        let mut v = self.took();
        v.sort_unstable();
        v[v.len() / 2] as f64
    }
}
