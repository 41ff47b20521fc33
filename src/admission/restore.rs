//! The UPDATE of an injected JobSet (docs/operations.md, "Upgrading"): what the stored object
//! carries of the injection is copied, as stored, into the places where the object sent lacks it,
//! whatever version of jobset-inplace injected it and whatever this one would inject now. JobSet
//! holds a replicatedJob's pod template immutable (suspended or not, but for its labels,
//! annotations, node selector, tolerations and scheduling gates), so a client that writes the
//! JobSet again as it built it (Kubeflow Trainer's server-side apply on every reconcile) must get
//! back exactly what is stored: injecting this version's agent instead would be refused after
//! every upgrade.
//!
//! The places are those any injection writes to: the Job's `backoffLimit`,
//! `podReplacementPolicy`, `completions` and `parallelism`; the pod template's `jobset-inplace.dev/injected` annotation; the pod's
//! `serviceAccountName`, `automountServiceAccountToken`, the agent init container, the agent's
//! token volume and `imagePullSecrets`; in every container (matched by name) `restartPolicy`,
//! `restartPolicyRules`, the agent's env entries and the token volume's mount. Only additions:
//! what the object sent has is never written over (but for another value of the annotation).

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::INJECTED_ANNOTATION;
use super::patch::{Op, Ptr, add, to_json};
use super::sidecar::TOKEN_VOLUME;
use super::view::is_env_name_read;
use crate::wire::agent_env;

/// The operations that copy the stored injection of `old` (`spec.replicatedJobs[i]` of the stored
/// JobSet) into `new` (the same replicatedJob as sent), at `job_ptr` (the Job spec's pointer).
/// Nothing for two replicatedJobs of different names.
pub(crate) fn restore(job_ptr: &Ptr, new: &Value, old: &Value, ops: &mut Vec<Op>) {
    if new.get("name") != old.get("name") {
        return;
    }
    let spec = |rj: &Value| rj.get("template")?.get("spec")?.as_object().cloned();
    let (Some(new_job), Some(old_job)) = (spec(new), spec(old)) else {
        return;
    };
    copy_keys(
        job_ptr,
        &new_job,
        &old_job,
        &[
            "backoffLimit",
            "podReplacementPolicy",
            "completions",
            "parallelism",
        ],
        ops,
    );
    let object = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_object).cloned();
    let (Some(new_t), Some(old_t)) = (object(&new_job, "template"), object(&old_job, "template"))
    else {
        return;
    };
    let template_ptr = job_ptr.key("template");
    restore_annotation(&template_ptr, &new_t, &old_t, ops);
    let (Some(new_pod), Some(old_pod)) = (object(&new_t, "spec"), object(&old_t, "spec")) else {
        return;
    };
    let pod_ptr = template_ptr.key("spec");
    copy_keys(
        &pod_ptr,
        &new_pod,
        &old_pod,
        &["serviceAccountName", "automountServiceAccountToken"],
        ops,
    );
    for list in ["initContainers", "containers"] {
        restore_containers(&pod_ptr.key(list), &new_pod, &old_pod, list, ops);
    }
    copy_named(
        &pod_ptr.key("initContainers"),
        new_pod.get("initContainers"),
        old_pod.get("initContainers"),
        |name| name == agent_env::CONTAINER_NAME,
        ops,
    );
    copy_named(
        &pod_ptr.key("volumes"),
        new_pod.get("volumes"),
        old_pod.get("volumes"),
        |name| name == TOKEN_VOLUME,
        ops,
    );
    copy_named(
        &pod_ptr.key("imagePullSecrets"),
        new_pod.get("imagePullSecrets"),
        old_pod.get("imagePullSecrets"),
        |_| true,
        ops,
    );
}

/// Each of `keys` that `old` has and `new` lacks, as stored.
fn copy_keys(
    at: &Ptr,
    new: &Map<String, Value>,
    old: &Map<String, Value>,
    keys: &[&str],
    ops: &mut Vec<Op>,
) {
    for key in keys {
        if let Some(value) = old.get(*key)
            && !new.contains_key(*key)
        {
            ops.push(add(at.key(key), to_json(value)));
        }
    }
}

/// The `jobset-inplace.dev/injected` annotation as stored (the version that injected), also over
/// another value the object sent carries.
fn restore_annotation(
    template_ptr: &Ptr,
    new: &Map<String, Value>,
    old: &Map<String, Value>,
    ops: &mut Vec<Op>,
) {
    let Some(stored) = old
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(INJECTED_ANNOTATION))
    else {
        return;
    };
    let metadata = new.get("metadata");
    let annotations = metadata.and_then(|m| m.get("annotations"));
    match (metadata, annotations) {
        (None, _) => ops.push(add(
            template_ptr.key("metadata"),
            to_json(&serde_json::json!({"annotations": {INJECTED_ANNOTATION: stored}})),
        )),
        (Some(m), None) if m.is_object() => ops.push(add(
            template_ptr.keys(&["metadata", "annotations"]),
            to_json(&serde_json::json!({INJECTED_ANNOTATION: stored})),
        )),
        // Another value (a client that copied an older injected template): the stored one, as
        // the stored template is what JobSet compares with.
        (Some(_), Some(Value::Object(a))) if a.get(INJECTED_ANNOTATION) != Some(stored) => {
            ops.push(add(
                template_ptr.keys(&["metadata", "annotations", INJECTED_ANNOTATION]),
                to_json(stored),
            ));
        }
        _ => {}
    }
}

/// The `name` of a list element, if it has one.
fn name(v: &Value) -> Option<&str> {
    v.get("name")?.as_str()
}

/// The elements of `old` (a list at `at`) that `wanted` names and `new` has none of by name,
/// appended in their stored order (or the list created with them).
fn copy_named(
    at: &Ptr,
    new: Option<&Value>,
    old: Option<&Value>,
    wanted: impl Fn(&str) -> bool,
    ops: &mut Vec<Op>,
) {
    let Some(old) = old.and_then(Value::as_array) else {
        return;
    };
    let new_list = match new {
        None => None,
        Some(Value::Array(l)) => Some(l),
        // Not a list: nothing can be added to it without writing over it.
        Some(_) => return,
    };
    let present: HashSet<&str> = new_list.into_iter().flatten().filter_map(name).collect();
    let missing: Vec<&Value> = old
        .iter()
        .filter(|e| name(e).is_some_and(|n| wanted(n) && !present.contains(n)))
        .collect();
    if missing.is_empty() {
        return;
    }
    if new_list.is_some() {
        for element in missing {
            ops.push(add(at.key("-"), to_json(element)));
        }
    } else {
        ops.push(add(at.clone(), to_json(&missing)));
    }
}

/// In each container of `list` that both pod specs have (matched by name): `restartPolicy`,
/// `restartPolicyRules`, the agent's env entries and the token volume's mount, as stored.
fn restore_containers(
    list_ptr: &Ptr,
    new_pod: &Map<String, Value>,
    old_pod: &Map<String, Value>,
    list: &str,
    ops: &mut Vec<Op>,
) {
    let (Some(new), Some(old)) = (
        new_pod.get(list).and_then(Value::as_array),
        old_pod.get(list).and_then(Value::as_array),
    ) else {
        return;
    };
    let mut stored: HashMap<&str, &Map<String, Value>> = HashMap::new();
    for c in old {
        if let (Some(n), Some(o)) = (name(c), c.as_object()) {
            stored.entry(n).or_insert(o);
        }
    }
    for (index, container) in new.iter().enumerate() {
        let Some(new_c) = container.as_object() else {
            continue;
        };
        // The stored container at the same place under the same name (a client writing its
        // lists again writes them in their order, duplicate or missing names included), else
        // the first stored one of that name.
        let old_c = old
            .get(index)
            .filter(|o| name(o) == name(container))
            .and_then(Value::as_object)
            .or_else(|| stored.get(name(container)?).copied());
        let Some(old_c) = old_c else {
            continue;
        };
        let at = list_ptr.idx(index);
        copy_keys(
            &at,
            new_c,
            old_c,
            &["restartPolicy", "restartPolicyRules"],
            ops,
        );
        copy_named(
            &at.key("env"),
            new_c.get("env"),
            old_c.get("env"),
            is_env_name_read,
            ops,
        );
        copy_named(
            &at.key("volumeMounts"),
            new_c.get("volumeMounts"),
            old_c.get("volumeMounts"),
            |n| n == TOKEN_VOLUME,
            ops,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::patch::ptr;
    use serde_json::json;

    fn restored(new: &Value, old: &Value) -> Value {
        let mut ops = Vec::new();
        let job_ptr = ptr(&["spec", "replicatedJobs"])
            .idx(0)
            .keys(&["template", "spec"]);
        restore(&job_ptr, new, old, &mut ops);
        let patch = json_patch::Patch(ops.iter().map(Op::to_patch_operation).collect());
        let mut out = json!({"spec": {"replicatedJobs": [new]}});
        json_patch::patch(&mut out, &patch).expect("applies");
        out["spec"]["replicatedJobs"][0].clone()
    }

    fn job(pod: Value, annotations: Value) -> Value {
        json!({"name": "w", "template": {"spec": {"template": {"metadata": {"annotations": annotations}, "spec": pod}}}})
    }

    #[test]
    fn the_stored_injection_comes_back_as_stored() {
        let agent = json!({"name": agent_env::CONTAINER_NAME, "image": "agent:0.0.9", "env": [{"name": "X", "value": "y"}]});
        let pod = json!({
            "containers": [{"name": "w", "image": "t", "restartPolicy": "Never",
                "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]}],
            "initContainers": [{"name": "init"}, agent],
            "serviceAccountName": "jobset-inplace-agent",
            "automountServiceAccountToken": false,
            "volumes": [{"name": "data"}, {"name": TOKEN_VOLUME, "projected": {}}],
            "imagePullSecrets": [{"name": "regcred"}],
        });
        let mut old = job(pod, json!({INJECTED_ANNOTATION: "0.0.9", "a": "b"}));
        old["template"]["spec"]["backoffLimit"] = json!(2147483647);
        old["template"]["spec"]["podReplacementPolicy"] = json!("Failed");
        let new = job(
            json!({"containers": [{"name": "w", "image": "t"}], "initContainers": [{"name": "init"}], "volumes": [{"name": "data"}]}),
            json!({"a": "b"}),
        );
        assert_eq!(restored(&new, &old), old);
        // Nothing to add to what already carries it.
        let mut ops = Vec::new();
        restore(&ptr(&["x"]), &old, &old, &mut ops);
        assert!(ops.is_empty());
    }

    #[test]
    fn what_the_client_writes_is_kept_and_other_jobs_are_left_alone() {
        let old = job(
            json!({"containers": [{"name": "w", "restartPolicy": "Never"}], "serviceAccountName": "a"}),
            json!({INJECTED_ANNOTATION: "0.0.9"}),
        );
        let new = job(
            json!({"containers": [{"name": "w", "restartPolicy": "OnFailure"}], "serviceAccountName": "b"}),
            json!({INJECTED_ANNOTATION: "0.0.9"}),
        );
        assert_eq!(restored(&new, &old), new);
        let mut other = new.clone();
        other["name"] = json!("v");
        let mut ops = Vec::new();
        restore(&ptr(&["x"]), &other, &old, &mut ops);
        assert!(ops.is_empty());
    }

    #[test]
    fn a_template_without_metadata_gets_the_annotation() {
        let old = job(json!({}), json!({INJECTED_ANNOTATION: "0.0.9"}));
        let mut new = json!({"name": "w", "template": {"spec": {"template": {"spec": {}}}}});
        assert_eq!(restored(&new, &old), old);
        new["template"]["spec"]["template"]["metadata"] = json!({});
        assert_eq!(restored(&new, &old), old);
    }
}
