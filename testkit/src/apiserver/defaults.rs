//! The defaults the real API server gives a pod on every write (its defaulting functions and the
//! priority admission plugin), as read back from kube-apiserver 1.35 (`tests/real_cluster/`,
//! `the_test_api_server_answers_as_the_real_one`).
//!
//! Not filled: what other admission plugins add (the service account token volume and its
//! mounts, the `not-ready`/`unreachable` tolerations), `status.qosClass`, and the defaults of pod
//! templates inside other objects (a Job's template).

use serde_json::{Map, Value, json};

/// Fills what the real server's pod defaulting fills, leaving what is set.
pub(crate) fn default_pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let unset = |spec: &Map<String, Value>, f: &str| {
        spec.get(f)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
    };
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
    ] {
        if unset(spec, field) {
            spec.insert(field.into(), value);
        }
    }
    if unset(spec, "serviceAccountName") {
        let account = spec
            .get("serviceAccount")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_owned();
        spec.insert("serviceAccountName".into(), json!(account));
    }
    let account = spec["serviceAccountName"].clone();
    spec.insert("serviceAccount".into(), account);
    if unset(spec, "priorityClassName") {
        for (field, value) in [
            ("priority", json!(0)),
            ("preemptionPolicy", json!("PreemptLowerPriority")),
        ] {
            if unset(spec, field) {
                spec.insert(field.into(), value);
            }
        }
    }
    for list in ["initContainers", "containers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            containers
                .iter_mut()
                .filter_map(Value::as_object_mut)
                .for_each(default_container);
        }
    }
}

fn default_container(c: &mut Map<String, Value>) {
    let policy = pull_policy(c.get("image").and_then(Value::as_str).unwrap_or_default());
    for (field, value) in [
        ("terminationMessagePath", json!("/dev/termination-log")),
        ("terminationMessagePolicy", json!("File")),
        ("imagePullPolicy", json!(policy)),
        ("resources", json!({})),
    ] {
        if c.get(field)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
        {
            c.insert(field.into(), value);
        }
    }
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            if port
                .get("protocol")
                .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
            {
                port.insert("protocol".into(), json!("TCP"));
            }
        }
    }
}

/// `Always` for `:latest` or no tag, `IfNotPresent` for another tag or a digest.
fn pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains('@') {
        return "IfNotPresent";
    }
    match last.rsplit_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

/// The container restart rule actions the real server accepts with the
/// `RestartAllContainersOnContainerExits` gate (`pkg/apis/core/validation/validation.go`
/// `validateContainerRestartPolicy`). KEP-467's `RestartPod` is not one of them.
const RESTART_RULE_ACTIONS: [&str; 2] = ["Restart", "RestartAllContainers"];

/// The causes of a pod's 422 for restart rule actions the real server refuses, worded as
/// upstream's `field.NotSupported`, which lists the values supported without the gate
/// (`supportedContainerRestartRuleActions`: only `Restart`), as kube-apiserver 1.35.4 answers:
/// `spec.containers[0].restartPolicyRules[0].action: Unsupported value: "RestartPod":
/// supported values: "Restart"`.
pub(crate) fn pod_restart_rule_causes(pod: &Value) -> Vec<super::schema::Cause> {
    let mut causes = Vec::new();
    for list in ["initContainers", "containers"] {
        let containers = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for (i, c) in containers.iter().enumerate() {
            let rules = c["restartPolicyRules"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            for (j, rule) in rules.iter().enumerate() {
                let action = rule["action"].as_str().unwrap_or_default();
                if !RESTART_RULE_ACTIONS.contains(&action) {
                    causes.push(super::schema::Cause {
                        reason: "FieldValueNotSupported",
                        message: format!(
                            "Unsupported value: \"{action}\": supported values: \"Restart\""
                        ),
                        field: format!("spec.{list}[{i}].restartPolicyRules[{j}].action"),
                    });
                }
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_pod_is_refused_as_the_real_server_refuses_it() {
        let pod = json!({"spec": {
            "initContainers": [{"name": "a", "restartPolicy": "Always", "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]}],
            "containers": [{"name": "w", "restartPolicy": "Never", "restartPolicyRules": [
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [1]}},
                {"action": "RestartPod", "exitCodes": {"operator": "NotIn", "values": [0]}}]}]}});
        let causes = pod_restart_rule_causes(&pod);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(
            causes[0].field,
            "spec.containers[0].restartPolicyRules[1].action"
        );
        assert_eq!(
            causes[0].message,
            "Unsupported value: \"RestartPod\": supported values: \"Restart\""
        );
        assert_eq!(causes[0].reason, "FieldValueNotSupported");
    }

    #[test]
    fn a_bare_pod_gets_the_real_servers_defaults() {
        let mut pod = json!({"spec": {
            "initContainers": [{"name": "i", "image": "busybox:1.36"}],
            "containers": [
                {"name": "a", "image": "busybox", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "busybox:latest"},
                {"name": "c", "image": "reg:5000/x@sha256:00"},
                {"name": "d", "image": "reg:5000/x:1", "imagePullPolicy": "Never"},
            ],
        }});
        default_pod(&mut pod);
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["serviceAccountName"], "default");
        assert_eq!(spec["serviceAccount"], "default");
        assert_eq!(spec["securityContext"], json!({}));
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["enableServiceLinks"], true);
        assert_eq!(spec["priority"], 0);
        assert_eq!(spec["preemptionPolicy"], "PreemptLowerPriority");
        let policies: Vec<&Value> = spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| &c["imagePullPolicy"])
            .collect();
        assert_eq!(policies, ["Always", "Always", "IfNotPresent", "Never"]);
        assert_eq!(spec["initContainers"][0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            spec["initContainers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        assert_eq!(spec["containers"][0]["terminationMessagePolicy"], "File");
        assert_eq!(spec["containers"][0]["resources"], json!({}));
        assert_eq!(spec["containers"][0]["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn what_is_set_stays() {
        let mut pod = json!({"spec": {
            "restartPolicy": "Never", "serviceAccount": "old", "priorityClassName": "high",
            "containers": [{"name": "a", "image": "i:1", "ports": [{"containerPort": 53, "protocol": "UDP"}]}],
        }});
        default_pod(&mut pod);
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        assert_eq!(pod["spec"]["serviceAccountName"], "old");
        assert_eq!(pod["spec"]["serviceAccount"], "old");
        assert!(pod["spec"].get("priority").is_none());
        assert_eq!(pod["spec"]["containers"][0]["ports"][0]["protocol"], "UDP");
        let mut named = json!({"spec": {"serviceAccountName": "sa", "serviceAccount": "other"}});
        default_pod(&mut named);
        assert_eq!(named["spec"]["serviceAccount"], "sa");
        let mut no_spec = json!({"metadata": {}});
        default_pod(&mut no_spec);
        assert_eq!(no_spec, json!({"metadata": {}}));
    }
}
