//! Builders of the objects tests write: a [`JobSet`] (with its [`ReplicatedJob`]s), a [`Pod`]
//! of a JobSet and a [`Job`] a JobSet owns. Every test, bench and helper that needs one of these
//! objects builds it here (the architecture test forbids private makers elsewhere), so that a
//! change of shape is made once.
//!
//! Each builder starts from the shape most tests write and changes it with one setter per fact;
//! [`JobSet::build`] (and the others) hand the object over as a `serde_json::Value`,
//! [`JobSet::typed`] as any type that deserializes from it (`DynamicObject`, k8s-openapi's `Pod`,
//! the product's `JobSet`). What no setter says, [`JobSet::set`] and [`JobSet::remove`] write at a
//! JSON pointer.
//!
//! ```
//! use jobset_inplace_testkit::build::{JobSet, Pod};
//! let js = JobSet::new("train").namespace("team-a").replicas(2).max_restarts(5).build();
//! assert_eq!(js["spec"]["replicatedJobs"][0]["replicas"], 2);
//! let pod = Pod::new("train-w-0-0").namespace("team-a").of_jobset("train").running().build();
//! assert_eq!(pod["status"]["phase"], "Running");
//! ```

use jobset_inplace::protocol::{IN_PLACE_RESTART, JOBSET_NAME_LABEL};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// What JobSet's own webhook requires as an in-place JobSet's Jobs' `backoffLimit` (MaxInt32).
pub const IN_PLACE_BACKOFF_LIMIT: i64 = 2_147_483_647;

/// The label the Job controller puts on its pods: the name of their Job.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// `value` at the JSON `pointer` of `target`, creating the objects on the way (array elements
/// must exist). `~1` and `~0` stand for `/` and `~` in a token, as RFC 6901 says.
fn put(target: &mut Value, pointer: &str, value: Value) {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, path)) = tokens.split_last() else {
        *target = value;
        return;
    };
    let mut at = target;
    for token in path {
        at = step(at, token);
    }
    match at {
        Value::Array(items) => {
            let i: usize = last.parse().expect("an array index in the pointer");
            items[i] = value;
        }
        other => {
            if !other.is_object() {
                *other = json!({});
            }
            if let Value::Object(map) = other {
                map.insert(last.clone(), value);
            }
        }
    }
}

fn step<'a>(at: &'a mut Value, token: &str) -> &'a mut Value {
    if at.is_array() {
        let i: usize = token.parse().expect("an array index in the pointer");
        return &mut at[i];
    }
    if !at.is_object() {
        *at = json!({});
    }
    &mut at[token]
}

/// `target` without what the JSON `pointer` names (nothing if it names nothing).
fn take(target: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.shift_remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// The map at `metadata.<field>` of `object`, created if absent.
fn meta_map<'a>(object: &'a mut Value, field: &str) -> &'a mut Map<String, Value> {
    let slot = &mut object["metadata"][field];
    if !slot.is_object() {
        *slot = json!({});
    }
    match slot {
        Value::Object(map) => map,
        _ => unreachable!("made an object above"),
    }
}

fn deserialize<T: DeserializeOwned>(value: Value, what: &str) -> T {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("the built {what} as a type: {e}"))
}

/// What every builder has: a start from a value, the pointer escape hatches, the output.
macro_rules! value {
    ($what:literal) => {
        /// `object` (a fixture, say) to change further with the setters.
        pub fn from_value(object: Value) -> Self {
            Self(object)
        }

        /// `value` at the JSON `pointer` (RFC 6901), for what no setter says; the objects on
        /// the way are created.
        pub fn set(mut self, pointer: &str, value: Value) -> Self {
            put(&mut self.0, pointer, value);
            self
        }

        /// Without what the JSON `pointer` names (nothing happens if it names nothing).
        pub fn remove(mut self, pointer: &str) -> Self {
            take(&mut self.0, pointer);
            self
        }

        /// The object.
        pub fn build(self) -> Value {
            self.0
        }

        /// The object as `T` (`DynamicObject`, a k8s-openapi type, the product's types).
        ///
        /// # Panics
        /// If the object does not deserialize as `T`: the test built a wrong object.
        pub fn typed<T: DeserializeOwned>(self) -> T {
            deserialize(self.0, $what)
        }
    };
}

/// The metadata and status setters of the objects (not of a replicated job).
macro_rules! common {
    () => {
        /// The name (`metadata.name`).
        pub fn name(self, name: &str) -> Self {
            self.set("/metadata/name", json!(name))
        }

        /// The namespace (`metadata.namespace`).
        pub fn namespace(self, namespace: &str) -> Self {
            self.set("/metadata/namespace", json!(namespace))
        }

        /// One label more (`metadata.labels`), replacing one of that key.
        pub fn label(mut self, key: &str, value: &str) -> Self {
            meta_map(&mut self.0, "labels").insert(key.to_owned(), json!(value));
            self
        }

        /// All the labels: `labels` (an object) replaces them.
        pub fn labels(self, labels: Value) -> Self {
            self.set("/metadata/labels", labels)
        }

        /// One annotation more (`metadata.annotations`), replacing one of that key.
        pub fn annotation(mut self, key: &str, value: &str) -> Self {
            meta_map(&mut self.0, "annotations").insert(key.to_owned(), json!(value));
            self
        }

        /// `metadata.uid`, as the API server would have set it.
        pub fn uid(self, uid: &str) -> Self {
            self.set("/metadata/uid", json!(uid))
        }

        /// `metadata.resourceVersion`, as the API server would have set it.
        pub fn resource_version(self, version: &str) -> Self {
            self.set("/metadata/resourceVersion", json!(version))
        }

        /// The status: `status` (an object) replaces it.
        pub fn status(self, status: Value) -> Self {
            self.set("/status", status)
        }
    };
}

/// A JobSet (`jobset.x-k8s.io/v1alpha2`). [`JobSet::new`] is an InPlaceRestart JobSet with
/// `maxRestarts: 3`, one [`ReplicatedJob::new("w")`](ReplicatedJob::new) and an empty status.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSet(Value);

impl JobSet {
    /// The JobSet `name` (no namespace: see [`JobSet::namespace`]).
    pub fn new(name: &str) -> Self {
        Self(json!({
            "apiVersion": jobset_inplace::jobset::API_VERSION,
            "kind": jobset_inplace::jobset::KIND,
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": {"restartStrategy": IN_PLACE_RESTART, "maxRestarts": 3},
                "replicatedJobs": [ReplicatedJob::new("w").build()]
            },
            "status": {}
        }))
    }

    value!("JobSet");
    common!();

    /// `spec.failurePolicy.restartStrategy` (`InPlaceRestart` by default; `Recreate`, ...).
    pub fn strategy(self, strategy: &str) -> Self {
        self.set("/spec/failurePolicy/restartStrategy", json!(strategy))
    }

    /// `spec.failurePolicy.maxRestarts` (3 by default).
    pub fn max_restarts(self, max_restarts: i64) -> Self {
        self.set("/spec/failurePolicy/maxRestarts", json!(max_restarts))
    }

    /// Without `spec.failurePolicy`: a JobSet JobSet's controller recreates on failure.
    pub fn no_failure_policy(self) -> Self {
        self.remove("/spec/failurePolicy")
    }

    /// The replicated jobs: `jobs` replace them all.
    pub fn replicated_jobs(mut self, jobs: impl IntoIterator<Item = ReplicatedJob>) -> Self {
        let jobs: Vec<Value> = jobs.into_iter().map(ReplicatedJob::build).collect();
        self.0["spec"]["replicatedJobs"] = Value::Array(jobs);
        self
    }

    /// `replicas` (Jobs) of every replicated job.
    pub fn replicas(self, replicas: i64) -> Self {
        self.each_job(|j| j.replicas(replicas))
    }

    /// `pods` pods in each Job of every replicated job (`parallelism` = `completions`).
    pub fn pods(self, pods: i64) -> Self {
        self.each_job(|j| j.pods(pods))
    }

    /// The one container of every replicated job's pods.
    pub fn container(self, name: &str, image: &str) -> Self {
        self.each_job(|j| j.container(name, image))
    }

    /// What JobSet's own webhook (v0.12, InPlaceRestart gate on) requires of an InPlaceRestart
    /// JobSet, in every replicated job: `backoffLimit` MaxInt32, `podReplacementPolicy: Failed`
    /// and `completions` equal to `parallelism`. Ours requires the same.
    pub fn as_jobset_requires(self) -> Self {
        self.each_job(ReplicatedJob::as_jobset_requires)
    }

    /// Every replicated job changed by `f`.
    pub fn each_job(mut self, f: impl Fn(ReplicatedJob) -> ReplicatedJob) -> Self {
        if let Some(jobs) = self.0["spec"]["replicatedJobs"].as_array_mut() {
            for job in jobs {
                *job = f(ReplicatedJob(job.take())).build();
            }
        }
        self
    }

    /// One field of the status (`status.<field>`), the others kept.
    pub fn status_field(mut self, field: &str, value: Value) -> Self {
        self.0["status"][field] = value;
        self
    }

    /// Without a status, as a user writes a JobSet.
    pub fn no_status(self) -> Self {
        self.remove("/status")
    }
}

/// One replicated job of a JobSet. [`ReplicatedJob::new`] has one Job (`replicas: 1`) of one pod
/// (`parallelism` and `completions` 1) of one container `w` (image `w`).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicatedJob(Value);

impl ReplicatedJob {
    value!("replicated job");

    /// The replicated job `name`.
    pub fn new(name: &str) -> Self {
        Self(json!({
            "name": name,
            "replicas": 1,
            "template": {"spec": {
                "parallelism": 1,
                "completions": 1,
                "template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}
            }}
        }))
    }

    /// `replicas`: how many Jobs.
    pub fn replicas(self, replicas: i64) -> Self {
        self.set("/replicas", json!(replicas))
    }

    /// `pods` pods in each Job: `parallelism` and `completions` both.
    pub fn pods(self, pods: i64) -> Self {
        self.parallelism(pods).completions(pods)
    }

    /// The Job's `parallelism`.
    pub fn parallelism(mut self, parallelism: i64) -> Self {
        self.job()["parallelism"] = json!(parallelism);
        self
    }

    /// The Job's `completions`.
    pub fn completions(mut self, completions: i64) -> Self {
        self.job()["completions"] = json!(completions);
        self
    }

    /// Without `completions` (the Job then counts none).
    pub fn no_completions(mut self) -> Self {
        if let Some(job) = self.job().as_object_mut() {
            job.shift_remove("completions");
        }
        self
    }

    /// The Job's `backoffLimit`.
    pub fn backoff_limit(mut self, limit: i64) -> Self {
        self.job()["backoffLimit"] = json!(limit);
        self
    }

    /// The Job's `podReplacementPolicy` (`Failed`, `TerminatingOrFailed`).
    pub fn pod_replacement_policy(mut self, policy: &str) -> Self {
        self.job()["podReplacementPolicy"] = json!(policy);
        self
    }

    /// What JobSet's own webhook requires of an InPlaceRestart JobSet's Job: `backoffLimit`
    /// MaxInt32, `podReplacementPolicy: Failed`, `completions` equal to `parallelism`.
    pub fn as_jobset_requires(mut self) -> Self {
        let parallelism = self.job()["parallelism"].clone();
        let job = self.job();
        job["backoffLimit"] = json!(IN_PLACE_BACKOFF_LIMIT);
        job["podReplacementPolicy"] = json!("Failed");
        job["completions"] = parallelism;
        self
    }

    /// The one container of the pods: `name` of `image`.
    pub fn container(self, name: &str, image: &str) -> Self {
        self.containers(json!([{"name": name, "image": image}]))
    }

    /// The pods' containers: `containers` (an array) replaces them.
    pub fn containers(self, containers: Value) -> Self {
        self.pod_spec("containers", containers)
    }

    /// One field of the pod template's spec (`serviceAccountName`, `restartPolicy`, ...).
    pub fn pod_spec(mut self, field: &str, value: Value) -> Self {
        self.job()["template"]["spec"][field] = value;
        self
    }

    fn job(&mut self) -> &mut Value {
        &mut self.0["template"]["spec"]
    }
}

/// A pod. [`Pod::new`] has one container `w` (image `w`) and no status; [`Pod::of_jobset`]
/// makes it a JobSet's, [`Pod::running`] a running one.
#[derive(Clone, Debug, PartialEq)]
pub struct Pod(Value);

impl Pod {
    /// The pod `name` (no namespace: see [`Pod::namespace`]).
    pub fn new(name: &str) -> Self {
        Self(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "w", "image": "w"}]}
        }))
    }

    value!("Pod");
    common!();

    /// The worker pod `name` of the JobSet `jobset` in `namespace`: [`Pod::new`] in the
    /// namespace, [`Pod::of_jobset`].
    pub fn worker(namespace: &str, jobset: &str, name: &str) -> Self {
        Self::new(name).namespace(namespace).of_jobset(jobset)
    }

    /// A pod of the JobSet `jobset`: JobSet's name label and annotation, as JobSet's controller
    /// sets both (the reconciler selects pods by the label, the agent reads the annotation).
    pub fn of_jobset(self, jobset: &str) -> Self {
        self.label(JOBSET_NAME_LABEL, jobset)
            .annotation(JOBSET_NAME_LABEL, jobset)
    }

    /// The epoch annotation `annotation` (a dialect's `pod_annotation()`) at `epoch`.
    pub fn epoch(self, annotation: &str, epoch: &str) -> Self {
        self.annotation(annotation, epoch)
    }

    /// A controller reference to the Job `job` (UID `uid`), as the Job controller sets it.
    pub fn owned_by_job(mut self, job: &str, uid: &str) -> Self {
        self.0["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "controller": true
        }]);
        self
    }

    /// The one container: `name` of `image`.
    pub fn container(self, name: &str, image: &str) -> Self {
        self.containers(json!([{"name": name, "image": image}]))
    }

    /// The containers: `containers` (an array) replaces them.
    pub fn containers(self, containers: Value) -> Self {
        self.set("/spec/containers", containers)
    }

    /// The agent as the webhook injects it: a sidecar (an init container that restarts
    /// `Always`) `jobset-inplace-agent` of `image`, before any other init container.
    pub fn agent_sidecar(mut self, image: &str) -> Self {
        let agent =
            json!({"name": "jobset-inplace-agent", "image": image, "restartPolicy": "Always"});
        match self.0["spec"]["initContainers"].as_array_mut() {
            Some(init) => init.insert(0, agent),
            None => self.0["spec"]["initContainers"] = json!([agent]),
        }
        self
    }

    /// `spec.serviceAccountName`.
    pub fn service_account(self, account: &str) -> Self {
        self.set("/spec/serviceAccountName", json!(account))
    }

    /// `spec.nodeName`: the pod is bound to `node`.
    pub fn node(self, node: &str) -> Self {
        self.set("/spec/nodeName", json!(node))
    }

    /// `status.phase` only.
    pub fn phase(self, phase: &str) -> Self {
        self.set("/status/phase", json!(phase))
    }

    /// Running, no container restarted yet: phase `Running` and a status of restart count 0 for
    /// each container (the containers set before this call).
    pub fn running(self) -> Self {
        let statuses: Vec<Value> = self
            .names("containers")
            .into_iter()
            .map(|name| json!({"name": name, "restartCount": 0}))
            .collect();
        self.status(json!({"phase": "Running", "containerStatuses": statuses}))
    }

    /// Running as the kubelet reports it: phase `Running`, every container (init containers too,
    /// those set before this call) restarted `restarts` times, `ready`, and each init container
    /// `started`, as `started` says (the agent sidecar started: the barrier lifted, or not).
    pub fn reported(self, started: bool, restarts: i64) -> Self {
        let spec = &self.0["spec"];
        let status = |c: &Value| {
            json!({"name": c["name"], "ready": started, "restartCount": restarts,
                   "image": c["image"], "imageID": ""})
        };
        let list = |field: &str| spec[field].as_array().cloned().unwrap_or_default();
        let init: Vec<Value> = list("initContainers")
            .iter()
            .map(|c| {
                let mut s = status(c);
                s["started"] = json!(started);
                s
            })
            .collect();
        let containers: Vec<Value> = list("containers").iter().map(status).collect();
        self.status(json!({"phase": "Running", "initContainerStatuses": init,
                           "containerStatuses": containers}))
    }

    fn names(&self, field: &str) -> Vec<Value> {
        self.0["spec"][field]
            .as_array()
            .map(|cs| cs.iter().map(|c| c["name"].clone()).collect())
            .unwrap_or_default()
    }
}

/// A Job (`batch/v1`). [`Job::new`] has a pod template of one container `w` (image `w`);
/// [`Job::of_jobset`] makes it a JobSet's.
#[derive(Clone, Debug, PartialEq)]
pub struct Job(Value);

impl Job {
    /// The Job `name` (no namespace: see [`Job::namespace`]).
    pub fn new(name: &str) -> Self {
        Self(json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}
        }))
    }

    value!("Job");
    common!();

    /// A Job of the JobSet `jobset` (UID `uid`), as JobSet's controller creates it: JobSet's
    /// name label and a controller reference to the JobSet.
    pub fn of_jobset(self, jobset: &str, uid: &str) -> Self {
        self.owned_by_jobset(jobset, uid)
            .label(JOBSET_NAME_LABEL, jobset)
    }

    /// A controller reference to the JobSet `jobset` (UID `uid`) only, without JobSet's label.
    pub fn owned_by_jobset(mut self, jobset: &str, uid: &str) -> Self {
        self.0["metadata"]["ownerReferences"] = json!([{
            "apiVersion": jobset_inplace::jobset::API_VERSION,
            "kind": jobset_inplace::jobset::KIND,
            "name": jobset, "uid": uid, "controller": true
        }]);
        self
    }

    /// The pods' containers: `containers` (an array) replaces them.
    pub fn containers(self, containers: Value) -> Self {
        self.set("/spec/template/spec/containers", containers)
    }
}

#[cfg(test)]
mod tests;
