//! Kubeflow Trainer's objects as `check` judges them: the JobSet a (Cluster)TrainingRuntime's
//! template describes, and the one Trainer makes of a TrainJob and its runtime.

use serde_json::Value;

/// Kubeflow Trainer's API group: TrainJob, TrainingRuntime, ClusterTrainingRuntime.
pub(super) const TRAINER_GROUP: &str = "trainer.kubeflow.org";

pub(super) fn kind_of(value: &Value) -> Option<&str> {
    value.get("kind").and_then(Value::as_str)
}

pub(super) fn in_group(value: &Value, group: &str) -> bool {
    value
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| {
            v.strip_prefix(group)
                .is_some_and(|rest| rest.starts_with('/'))
        })
}

pub(super) fn is_runtime(value: &Value) -> bool {
    in_group(value, TRAINER_GROUP)
        && matches!(
            kind_of(value),
            Some("ClusterTrainingRuntime" | "TrainingRuntime")
        )
}

/// The label Trainer reads on a replicatedJob's Job template (`template.metadata.labels`): the
/// step of the TrainJob it runs.
const ANCESTOR_LABEL: &str = "trainer.kubeflow.org/trainjob-ancestor-step";
/// The trainer step, the initializer steps (Trainer's `constants.AncestorTrainer`, ...).
const TRAINER_STEP: &str = "trainer";
const INITIALIZER_STEPS: [&str; 2] = ["dataset-initializer", "model-initializer"];
/// The name of the trainer's container, and of MPI's worker job (`constants.Node`).
const NODE: &str = "node";

/// The JobSet a (Cluster)TrainingRuntime makes, named after it: the one Trainer builds from it
/// for a TrainJob that sets nothing of its own ([`trainjob_jobset`]).
pub(super) fn runtime_jobset(runtime: &Value) -> Value {
    build(runtime, &Value::Null)
}

fn runtime_template(runtime: &Value) -> Value {
    let template = runtime
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_default();
    let mut metadata = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if let (Some(meta), Some(own)) = (metadata.as_object_mut(), runtime.get("metadata")) {
        for key in ["name", "namespace"] {
            if let Some(v) = own.get(key) {
                meta.insert(key.to_owned(), v.clone());
            }
        }
    }
    serde_json::json!({
        "apiVersion": format!("{}/v1alpha2", crate::jobset::GROUP),
        "kind": crate::jobset::KIND,
        "metadata": metadata,
        "spec": template.get("spec").cloned().unwrap_or_default(),
    })
}

/// The JobSet Trainer makes of a TrainJob and its runtime, as far as admission looks at it:
/// the runtime's template named after the TrainJob, with the TrainJob's `spec.labels` and
/// `spec.annotations`, and the Job fields Trainer writes (see [`build`]).
pub(super) fn trainjob_jobset(trainjob: &Value, runtime: &Value) -> Value {
    let mut js = build(runtime, trainjob);
    if let Some(meta) = js.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in ["name", "namespace"] {
            match trainjob.pointer(&format!("/metadata/{key}")) {
                Some(v) => meta.insert(key.to_owned(), v.clone()),
                None => meta.remove(key),
            };
        }
        for key in ["labels", "annotations"] {
            if let Some(extra) = trainjob
                .pointer(&format!("/spec/{key}"))
                .and_then(Value::as_object)
            {
                let entry = meta
                    .entry(key.to_owned())
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(map) = entry.as_object_mut() {
                    map.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
    }
    js
}

/// The number of pods of one replicatedJob's Job (its `PodSet.Count`), as Kubeflow Trainer
/// v2.3.0 counts it (`pkg/runtime/core/trainingruntime.go`, the plugins' `EnforceMLPolicy`):
/// the template's `parallelism` (default 1), the runtime's `mlPolicy.numNodes` (default 1) for
/// the trainer step when the runtime has an `mlPolicy`, at least 1; then the TrainJob's
/// `spec.trainer.numNodes` when set: under an MPI policy on the job named `node` (less the
/// launcher's one under `runLauncherAsNode`, at least 1), under any other on the first trainer
/// step.
pub(super) fn pod_counts(
    jobs: &[JobShape<'_>],
    ml_policy: Option<&Value>,
    trainjob_nodes: Option<i64>,
) -> Vec<i64> {
    let mut counts: Vec<i64> = jobs
        .iter()
        .map(|job| {
            let count = match (job.step, ml_policy) {
                (Some(TRAINER_STEP), Some(policy)) => {
                    policy.get("numNodes").and_then(Value::as_i64).unwrap_or(1)
                }
                _ => job.parallelism.unwrap_or(1),
            };
            count.max(1)
        })
        .collect();
    let Some(nodes) = trainjob_nodes else {
        return counts;
    };
    let mpi = ml_policy
        .and_then(|p| p.get("mpi"))
        .filter(|m| m.is_object());
    let index = match mpi {
        Some(_) => jobs.iter().position(|j| j.name == Some(NODE)),
        None => jobs.iter().position(|j| j.step == Some(TRAINER_STEP)),
    };
    if let Some(count) = index.and_then(|i| counts.get_mut(i)) {
        let launcher_as_node = mpi
            .and_then(|m| m.get("runLauncherAsNode"))
            .and_then(Value::as_bool)
            == Some(true);
        *count = if launcher_as_node {
            (nodes - 1).max(1)
        } else {
            nodes
        };
    }
    counts
}

/// What [`pod_counts`] reads of a replicatedJob.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct JobShape<'a> {
    pub name: Option<&'a str>,
    /// Its `trainer.kubeflow.org/trainjob-ancestor-step` label.
    pub step: Option<&'a str>,
    pub parallelism: Option<i64>,
}

impl<'a> JobShape<'a> {
    fn of(job: &'a Value) -> Self {
        JobShape {
            name: job.get("name").and_then(Value::as_str),
            step: job
                .pointer(&format!(
                    "/template/metadata/labels/{}",
                    ANCESTOR_LABEL.replace('/', "~1")
                ))
                .and_then(Value::as_str),
            parallelism: job
                .pointer("/template/spec/parallelism")
                .and_then(Value::as_i64),
        }
    }
}

/// The JobSet Trainer v2.3.0 builds from `runtime` for `trainjob` (`Null`: one that sets
/// nothing), as far as admission reads it: every replicatedJob's `parallelism` and
/// `completions` both set to its pod count ([`pod_counts`]; the jobset plugin's
/// `SyncParallelCount`), `replicas: 1` on the trainer and initializer steps, and the TrainJob's
/// `spec.trainer` `image`, `command` and `args` on the `node` container of every trainer step
/// (the jobset plugin's builder).
fn build(runtime: &Value, trainjob: &Value) -> Value {
    let mut js = runtime_template(runtime);
    let ml_policy = runtime.pointer("/spec/mlPolicy").filter(|p| p.is_object());
    let trainer = trainjob.pointer("/spec/trainer").filter(|t| t.is_object());
    let nodes = trainer
        .and_then(|t| t.get("numNodes"))
        .and_then(Value::as_i64);
    let Some(jobs) = js
        .pointer_mut("/spec/replicatedJobs")
        .and_then(Value::as_array_mut)
    else {
        return js;
    };
    let shapes: Vec<JobShape<'_>> = jobs.iter().map(JobShape::of).collect();
    let counts = pod_counts(&shapes, ml_policy, nodes);
    let steps: Vec<Option<String>> = shapes.iter().map(|s| s.step.map(str::to_owned)).collect();
    for ((job, count), step) in jobs.iter_mut().zip(counts).zip(steps) {
        let Some(job) = job.as_object_mut() else {
            continue;
        };
        let step = step.as_deref();
        if step.is_some_and(|s| s == TRAINER_STEP || INITIALIZER_STEPS.contains(&s)) {
            job.insert("replicas".to_owned(), Value::from(1));
        }
        if let Some(spec) = job
            .get_mut("template")
            .and_then(|t| t.get_mut("spec"))
            .and_then(Value::as_object_mut)
        {
            spec.insert("parallelism".to_owned(), Value::from(count));
            spec.insert("completions".to_owned(), Value::from(count));
        }
        if step != Some(TRAINER_STEP) {
            continue;
        }
        let Some(trainer) = trainer else {
            continue;
        };
        let containers = job
            .get_mut("template")
            .and_then(|t| t.pointer_mut("/spec/template/spec/containers"))
            .and_then(Value::as_array_mut);
        for node in containers.into_iter().flatten() {
            if node.get("name").and_then(Value::as_str) != Some(NODE) {
                continue;
            }
            if let Some(node) = node.as_object_mut() {
                for key in ["image", "command", "args"] {
                    if let Some(v) = trainer.get(key) {
                        node.insert(key.to_owned(), v.clone());
                    }
                }
            }
        }
    }
    js
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shape<'a>(name: &'a str, step: Option<&'a str>, parallelism: Option<i64>) -> JobShape<'a> {
        JobShape {
            name: Some(name),
            step,
            parallelism,
        }
    }

    /// Trainer v2.3.0's counts: initializers and other jobs from their parallelism (default 1),
    /// the trainer step from the runtime's numNodes under an mlPolicy, the TrainJob's numNodes
    /// on the trainer step (torch, jax, xgboost, none) or on MPI's `node` job.
    #[test]
    fn pod_counts_are_trainers() {
        let torch = json!({"numNodes": 3, "torch": {}});
        let jobs = [
            shape("dataset-initializer", Some("dataset-initializer"), None),
            shape("model-initializer", Some("model-initializer"), Some(2)),
            shape("node", Some(TRAINER_STEP), Some(7)),
        ];
        assert_eq!(pod_counts(&jobs, Some(&torch), None), [1, 2, 3]);
        assert_eq!(pod_counts(&jobs, Some(&torch), Some(5)), [1, 2, 5]);
        // No mlPolicy: the trainer step's own parallelism, the TrainJob's numNodes over it.
        assert_eq!(pod_counts(&jobs, None, None), [1, 2, 7]);
        assert_eq!(pod_counts(&jobs, None, Some(4)), [1, 2, 4]);
        // An mlPolicy without numNodes: 1. A parallelism of 0: at least 1.
        let jobs0 = [
            shape("node", Some(TRAINER_STEP), Some(0)),
            shape("x", None, Some(0)),
        ];
        assert_eq!(pod_counts(&jobs0, Some(&json!({"jax": {}})), None), [1, 1]);
        assert_eq!(pod_counts(&jobs0, None, None), [1, 1]);

        // MPI: the launcher is the trainer step (its count the runtime's numNodes), the
        // TrainJob's numNodes go to `node`, less the launcher's one under runLauncherAsNode.
        let mpi = |as_node: bool| json!({"numNodes": 1, "mpi": {"runLauncherAsNode": as_node}});
        let jobs = [
            shape("node", None, None),
            shape("launcher", Some(TRAINER_STEP), None),
        ];
        assert_eq!(pod_counts(&jobs, Some(&mpi(true)), None), [1, 1]);
        assert_eq!(pod_counts(&jobs, Some(&mpi(true)), Some(4)), [3, 1]);
        assert_eq!(pod_counts(&jobs, Some(&mpi(true)), Some(1)), [1, 1]);
        assert_eq!(pod_counts(&jobs, Some(&mpi(false)), Some(4)), [4, 1]);
        // The first trainer step only.
        let two = [
            shape("a", Some(TRAINER_STEP), None),
            shape("b", Some(TRAINER_STEP), None),
        ];
        assert_eq!(pod_counts(&two, None, Some(3)), [3, 1]);
    }

    #[test]
    fn every_job_gets_parallelism_and_completions_and_the_trainer_its_container() {
        let runtime = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "rt"},
            "spec": {"mlPolicy": {"numNodes": 2, "torch": {}}, "template": {"spec": {"replicatedJobs": [
                {"name": "dataset-initializer", "replicas": 3, "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: "dataset-initializer"}},
                    "spec": {"completions": 4, "template": {"spec": {"containers": [{"name": "dataset-initializer"}]}}}}},
                {"name": "node", "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: TRAINER_STEP}},
                    "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "a"}, {"name": "other", "image": "b"}]}}}}}
            ]}}}
        });
        let js = runtime_jobset(&runtime);
        let job =
            |i: usize, key: &str| js["spec"]["replicatedJobs"][i]["template"]["spec"][key].clone();
        assert_eq!(
            (job(0, "parallelism"), job(0, "completions")),
            (json!(1), json!(1))
        );
        assert_eq!(
            (job(1, "parallelism"), job(1, "completions")),
            (json!(2), json!(2))
        );
        assert_eq!(js["spec"]["replicatedJobs"][0]["replicas"], 1);
        assert_eq!(js["metadata"]["name"], "rt");

        let trainjob = json!({"metadata": {"name": "tj", "namespace": "ns"},
            "spec": {"trainer": {"numNodes": 5, "image": "mine", "args": ["x"]}}});
        let js = trainjob_jobset(&trainjob, &runtime);
        let job =
            |i: usize, key: &str| js["spec"]["replicatedJobs"][i]["template"]["spec"][key].clone();
        assert_eq!(
            (job(1, "parallelism"), job(1, "completions")),
            (json!(5), json!(5))
        );
        let containers =
            js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"]
                .clone();
        assert_eq!(containers[0]["image"], "mine");
        assert_eq!(containers[0]["args"], json!(["x"]));
        assert_eq!(containers[1]["image"], "b");
        assert_eq!(
            (
                js["metadata"]["name"].clone(),
                js["metadata"]["namespace"].clone()
            ),
            (json!("tj"), json!("ns"))
        );
    }
}
