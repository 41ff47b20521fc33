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

/// The JobSet a (Cluster)TrainingRuntime's `spec.template` (a JobSet template: metadata and
/// spec) describes, named after the runtime, with `spec.mlPolicy.numNodes` (when set) as its
/// trainer job's parallelism and completions, as Trainer sets them.
pub(super) fn runtime_jobset(runtime: &Value) -> Value {
    let mut js = runtime_template(runtime);
    if let Some(nodes) = runtime.pointer("/spec/mlPolicy/numNodes") {
        apply_trainer(&mut js, &serde_json::json!({"numNodes": nodes}));
    }
    js
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
/// `spec.annotations`, and its `spec.trainer` (`numNodes` as the trainer job's parallelism and
/// completions; `image`, `command`, `args` on its `node` container). The trainer job is the
/// replicatedJob labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, else the one
/// named `node`.
pub(super) fn trainjob_jobset(trainjob: &Value, runtime: &Value) -> Value {
    let mut js = runtime_jobset(runtime);
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
    if let Some(trainer) = trainjob.pointer("/spec/trainer") {
        apply_trainer(&mut js, trainer);
    }
    js
}

/// A TrainJob's `spec.trainer` (or a runtime's numNodes) on the trainer job of a JobSet.
fn apply_trainer(js: &mut Value, trainer: &Value) {
    let Some(jobs) = js
        .pointer_mut("/spec/replicatedJobs")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let labelled = |job: &Value| {
        job.pointer("/template/metadata/labels/trainer.kubeflow.org~1trainjob-ancestor-step")
            .and_then(Value::as_str)
            == Some("trainer")
    };
    let index = jobs.iter().position(labelled).or_else(|| {
        jobs.iter()
            .position(|j| j.get("name").and_then(Value::as_str) == Some("node"))
    });
    let Some(job) = index.and_then(|i| jobs.get_mut(i)) else {
        return;
    };
    if let Some(nodes) = trainer.get("numNodes").filter(|n| n.is_u64())
        && let Some(spec) = job
            .pointer_mut("/template/spec")
            .and_then(Value::as_object_mut)
    {
        spec.insert("parallelism".to_owned(), nodes.clone());
        spec.insert("completions".to_owned(), nodes.clone());
    }
    if let Some(containers) = job
        .pointer_mut("/template/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        && let Some(node) = containers
            .iter_mut()
            .find(|c| c.get("name").and_then(Value::as_str) == Some("node"))
            .and_then(Value::as_object_mut)
    {
        for key in ["image", "command", "args"] {
            if let Some(v) = trainer.get(key) {
                node.insert(key.to_owned(), v.clone());
            }
        }
    }
}
