//! The objects of a simulated JobSet: the plain JobSet a user writes, the injection applied to it
//! (the real [`jobset_inplace::admission::mutate`]), the pods the Job controller creates from it, and the
//! downward-API env the kubelet resolves for a container.

use serde_json::{Map, Value, json};

use super::{SimConfig, SimError};
use jobset_inplace::admission::{self, InjectionConfig};
use jobset_inplace::protocol::JOBSET_NAME_LABEL;

/// Label and annotation of the replicated job a pod belongs to.
pub const REPLICATED_JOB_LABEL: &str = "jobset.sigs.k8s.io/replicatedjob-name";
/// Label and annotation of the job index within the replicated job.
pub const JOB_INDEX_LABEL: &str = "jobset.sigs.k8s.io/job-index";
/// Label and annotation of the pod's completion index within its Job.
pub const COMPLETION_INDEX_LABEL: &str = "batch.kubernetes.io/job-completion-index";
/// Label and annotation of the JobSet's UID on its Jobs and pods.
pub const JOBSET_UID_LABEL: &str = "jobset.sigs.k8s.io/jobset-uid";
/// Label the Job controller sets on a Job's pods: the Job's name (and its legacy spelling).
pub const JOB_NAME_LABELS: [&str; 2] = ["batch.kubernetes.io/job-name", "job-name"];
/// Label the Job controller sets on a Job's pods: the Job's UID (and its legacy spelling).
pub const CONTROLLER_UID_LABELS: [&str; 2] =
    ["batch.kubernetes.io/controller-uid", "controller-uid"];
/// The finalizer the Job controller puts on every pod of a Job, and removes once it has counted
/// the pod's end (its phase `Failed` or `Succeeded`, or the Job being deleted).
pub const JOB_TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Name of the worker container.
pub const WORKER_CONTAINER: &str = "worker";

fn exit_codes(operator: &str, values: &[i32]) -> Value {
    json!({"operator": operator, "values": values})
}

/// The JobSet a user writes: a worker container with restart rules, no agent (the injection adds
/// the agent sidecar).
pub fn plain_jobset(c: &SimConfig) -> Value {
    let fail_code = c.fail_job_exit_code;
    let rules = match fail_code {
        None => {
            json!([{"action": "RestartAllContainers", "exitCodes": exit_codes("NotIn", &[0])}])
        }
        // No rule covers `y`: the worker's `restartPolicy: Never` ends it. (A `Terminate`
        // action does not exist: kube-apiserver 1.35 accepts `Restart` and
        // `RestartAllContainers` only, and so does the test API server.)
        Some(y) => json!([
            {"action": "RestartAllContainers", "exitCodes": exit_codes("NotIn", &[0, y])}
        ]),
    };
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "containers": [{
            "name": WORKER_CONTAINER, "image": "worker:sim",
            "restartPolicy": "Never", "restartPolicyRules": rules
        }]
    });
    if !c.user_init_containers.is_empty() {
        pod_spec["initContainers"] = c
            .user_init_containers
            .iter()
            .map(|(name, sidecar)| {
                let mut init = json!({"name": name, "image": "init:sim"});
                if *sidecar {
                    init["restartPolicy"] = json!("Always");
                }
                init
            })
            .collect();
    }
    let replicated: Vec<Value> = c
        .replicated_jobs
        .iter()
        .map(|rj| {
            let mut job = json!({
                "parallelism": rj.parallelism, "completions": rj.parallelism,
                "template": {"metadata": {"labels": {"app": "sim"}}, "spec": pod_spec.clone()}
            });
            if let Some(y) = fail_code {
                job["podFailurePolicy"] = json!({"rules": [{
                    "action": "FailJob",
                    "onExitCodes": {"containerName": WORKER_CONTAINER, "operator": "In", "values": [y]}
                }]});
            }
            json!({"name": rj.name, "replicas": rj.replicas, "template": {"spec": job}})
        })
        .collect();
    let mut policy = json!({"maxRestarts": c.max_restarts, "restartStrategy": "InPlaceRestart"});
    if fail_code.is_some() {
        policy["rules"] = json!([{"name": "unrecoverable", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]);
    }
    json!({
        "apiVersion": jobset_inplace::jobset::API_VERSION, "kind": jobset_inplace::jobset::KIND,
        "metadata": {"name": c.jobset_name, "namespace": c.namespace},
        "spec": {"failurePolicy": policy, "replicatedJobs": replicated}
    })
}

/// The plain JobSet with the webhook's injection applied.
pub fn mutated_jobset(c: &SimConfig) -> Result<Value, SimError> {
    let mut jobset = plain_jobset(c);
    let mut injection = InjectionConfig::defaults(c.dialect);
    if let Some(threshold) = c.probe_failure_threshold {
        injection.probe_failure_threshold = threshold;
    }
    if let Some(timeout) = c.probe_timeout_seconds {
        injection.probe_timeout_seconds = timeout;
    }
    let mutation = admission::mutate(&jobset, &injection);
    json_patch::patch(&mut jobset, &mutation.patch)
        .map_err(|e| SimError::Setup(format!("the injection patch does not apply: {e}")))?;
    Ok(jobset)
}

/// One pod position of the JobSet: (replicated job, job index, completion index). Replacement
/// pods take the position of the pod they replace.
#[derive(Clone, Debug)]
pub struct Slot {
    pub index: usize,
    pub replicated_job: String,
    pub job_index: i64,
    pub completion_index: i64,
    /// The pod template (`metadata`, `spec`) of the replicated job.
    pub template: Value,
}

/// One Job of the JobSet: its replicated job and index, its spec (the replicated job's
/// template), and the pod positions it runs ([`slots`]).
#[derive(Clone, Debug)]
pub struct JobPosition {
    pub replicated_job: String,
    pub job_index: i64,
    pub spec: Value,
    pub slots: Vec<usize>,
}

impl JobPosition {
    /// JobSet's name for it: `<jobset>-<replicated job>-<index>`.
    pub fn name(&self, jobset: &str) -> String {
        format!("{jobset}-{}-{}", self.replicated_job, self.job_index)
    }
}

/// Every Job of a (mutated) JobSet, in the order of [`slots`].
pub fn jobs(jobset: &Value) -> Vec<JobPosition> {
    let mut out: Vec<JobPosition> = Vec::new();
    let rjs = jobset
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let slots = slots(jobset);
    for rj in rjs {
        let name = rj.get("name").and_then(Value::as_str).unwrap_or("rj");
        let replicas = rj.get("replicas").and_then(Value::as_i64).unwrap_or(1);
        let spec = rj.pointer("/template/spec").cloned().unwrap_or(Value::Null);
        for job_index in 0..replicas {
            out.push(JobPosition {
                replicated_job: name.to_owned(),
                job_index,
                spec: spec.clone(),
                slots: slots
                    .iter()
                    .filter(|s| s.replicated_job == name && s.job_index == job_index)
                    .map(|s| s.index)
                    .collect(),
            });
        }
    }
    out
}

/// The Job JobSet's controller creates for `job` at `restarts` (`status.restarts`): JobSet's
/// labels and annotations, and a controller reference to the JobSet.
pub fn job_object(c: &SimConfig, job: &JobPosition, jobset_uid: &str, restarts: i64) -> Value {
    let mut meta = Map::new();
    for (k, v) in [
        (JOBSET_NAME_LABEL, c.jobset_name.clone()),
        (JOBSET_UID_LABEL, jobset_uid.to_owned()),
        (REPLICATED_JOB_LABEL, job.replicated_job.clone()),
        (JOB_INDEX_LABEL, job.job_index.to_string()),
        (
            jobset_inplace::deadline::RESTART_ATTEMPT_LABEL,
            restarts.to_string(),
        ),
    ] {
        meta.insert(k.to_owned(), json!(v));
    }
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": job.name(&c.jobset_name), "namespace": c.namespace,
            "labels": meta.clone(), "annotations": meta,
            "ownerReferences": [{
                "apiVersion": jobset_inplace::jobset::API_VERSION, "kind": jobset_inplace::jobset::KIND,
                "name": c.jobset_name, "uid": jobset_uid, "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": job.spec,
    })
}

/// The Job that owns a pod: its name and UID, and the restart it was created for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobOwner {
    pub name: String,
    pub uid: String,
    pub restarts: i64,
}

/// Every pod position of a (mutated) JobSet, in order.
pub fn slots(jobset: &Value) -> Vec<Slot> {
    let mut out = Vec::new();
    let rjs = jobset
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for rj in rjs {
        let name = rj.get("name").and_then(Value::as_str).unwrap_or("rj");
        let replicas = rj.get("replicas").and_then(Value::as_i64).unwrap_or(1);
        let job = rj.pointer("/template/spec").cloned().unwrap_or(Value::Null);
        let parallelism = job.get("parallelism").and_then(Value::as_i64).unwrap_or(1);
        let template = job.get("template").cloned().unwrap_or(Value::Null);
        for job_index in 0..replicas {
            for completion_index in 0..parallelism {
                out.push(Slot {
                    index: out.len(),
                    replicated_job: name.to_owned(),
                    job_index,
                    completion_index,
                    template: template.clone(),
                });
            }
        }
    }
    out
}

/// The pod the Job controller creates for `slot` of the Job `owner`, with the labels and
/// annotations the JobSet and Job controllers set and a controller reference to the Job.
pub fn pod_object(c: &SimConfig, slot: &Slot, name: &str, owner: &JobOwner) -> Value {
    let mut labels: Map<String, Value> = slot
        .template
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut annotations: Map<String, Value> = slot
        .template
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (k, v) in [
        (JOBSET_NAME_LABEL, c.jobset_name.clone()),
        (REPLICATED_JOB_LABEL, slot.replicated_job.clone()),
        (JOB_INDEX_LABEL, slot.job_index.to_string()),
        (COMPLETION_INDEX_LABEL, slot.completion_index.to_string()),
    ] {
        labels.insert(k.to_owned(), json!(v));
        annotations.insert(k.to_owned(), json!(v));
    }
    labels.insert(
        jobset_inplace::deadline::RESTART_ATTEMPT_LABEL.to_owned(),
        json!(owner.restarts.to_string()),
    );
    for k in JOB_NAME_LABELS {
        labels.insert(k.to_owned(), json!(owner.name));
    }
    for k in CONTROLLER_UID_LABELS {
        labels.insert(k.to_owned(), json!(owner.uid));
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": c.namespace, "labels": labels, "annotations": annotations,
            "finalizers": [JOB_TRACKING_FINALIZER],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": owner.name,
                                 "uid": owner.uid, "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": slot.template.get("spec").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The container's env as the kubelet gives it: literal values, and `fieldRef`s resolved from
/// the pod (name, namespace, uid, labels, annotations, node name). Other sources are skipped.
pub fn resolve_env(container: &Value, pod: &Value) -> Vec<(String, String)> {
    let entries = container
        .get("env")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut out: Vec<(String, String)> = Vec::new();
    for e in entries {
        let Some(name) = e.get("name").and_then(Value::as_str) else {
            continue;
        };
        let value = match e.get("value") {
            Some(v) => v.as_str().map(str::to_owned),
            None => e
                .pointer("/valueFrom/fieldRef/fieldPath")
                .and_then(Value::as_str)
                .and_then(|path| field_ref(pod, path)),
        };
        if let Some(value) = value {
            // The last of duplicates wins, as in the kubelet.
            out.retain(|(n, _)| n != name);
            out.push((name.to_owned(), value));
        }
    }
    out
}

/// A downward-API `fieldPath` of a pod.
pub fn field_ref(pod: &Value, path: &str) -> Option<String> {
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_suffix("']")
            .map(str::to_owned)
    };
    if let Some(key) = map_key("metadata.annotations['") {
        return pod
            .pointer("/metadata/annotations")?
            .get(&key)?
            .as_str()
            .map(str::to_owned);
    }
    if let Some(key) = map_key("metadata.labels['") {
        return pod
            .pointer("/metadata/labels")?
            .get(&key)?
            .as_str()
            .map(str::to_owned);
    }
    let pointer = match path {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        "metadata.uid" => "/metadata/uid",
        "spec.nodeName" => "/spec/nodeName",
        "spec.serviceAccountName" => "/spec/serviceAccountName",
        "status.podIP" => "/status/podIP",
        _ => return None,
    };
    pod.pointer(pointer)?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jobset_inplace::protocol::Dialect;

    #[test]
    fn field_refs() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "annotations": {"jobset.sigs.k8s.io/jobset-name": "js"}, "labels": {"a": "b"}}});
        assert_eq!(field_ref(&pod, "metadata.name").as_deref(), Some("p"));
        assert_eq!(
            field_ref(
                &pod,
                "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
            )
            .as_deref(),
            Some("js")
        );
        assert_eq!(
            field_ref(&pod, "metadata.labels['a']").as_deref(),
            Some("b")
        );
        assert_eq!(field_ref(&pod, "metadata.labels['x']"), None);
        let c = json!({"env": [{"name": "A", "value": "1"},
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "A", "value": "2"}]});
        assert_eq!(
            resolve_env(&c, &pod),
            vec![("N".into(), "ns".into()), ("A".into(), "2".into())]
        );
    }

    #[test]
    fn the_injection_gives_each_pod_an_agent() {
        {
            let c = SimConfig::new(Dialect::Epoch, 2);
            let js = mutated_jobset(&c).expect("mutates");
            let slots = slots(&js);
            assert_eq!(slots.len(), 2);
            let jobs = jobs(&js);
            assert_eq!(jobs.len(), 2);
            assert_eq!(jobs[1].slots, [1]);
            assert_eq!(jobs[1].name("js"), "js-workers-1");
            let spec = &slots[0].template["spec"];
            let agent = super::super::recognise::agent(spec).expect("an agent");
            assert!(super::super::recognise::has_env(
                agent,
                jobset_inplace::wire::agent_env::JOBSET_NAME
            ));
            let config = InjectionConfig::defaults(Dialect::Epoch);
            let validation = admission::validate(&js, &config);
            assert!(validation.violations.is_empty(), "{validation:?}");
        }
    }
}
