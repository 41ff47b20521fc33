//! What the API server saw of one pod during a group restart, normalised so that a real
//! kubelet's and the simulated kubelet's can be compared: the phase, the conditions that tell a
//! group restart (`AllContainersRestarting`, `Initialized`, `Ready`; an absent condition is
//! False), and each container's state, `restartCount` and `lastState` (reasons and exit codes),
//! the init containers as `init0, init1, ...` and the regular ones as `main0, ...` in their
//! order, so that names do not matter. Times, IDs, `ready`/`started` flags and the other
//! conditions are left out.

use serde_json::Value;

/// What kubelet v1.35.4 served on a real node (tests/real_node/
/// `a_worker_exit_restarts_the_whole_pod_in_place_on_a_real_kubelet`, docs/testing.md "Real
/// node"): a pod with a sidecar (`restartPolicy: Always`) and a worker, both under
/// `RestartAllContainers` on a non-zero exit; the worker exits 3. From the first status after
/// the exit to every container running again.
pub const REAL_KUBELET_GROUP_RESTART: &[&str] = &[
    "phase=Running AllContainersRestarting=True Initialized=True Ready=False \
     | init0 restarts=0 state=running last=- \
     | main0 restarts=0 state=terminated(Error,3) last=-",
    "phase=Running AllContainersRestarting=False Initialized=True Ready=False \
     | init0 restarts=1 state=waiting(RestartingAllContainers) last=terminated(RestartingAllContainers,137) \
     | main0 restarts=1 state=waiting(RestartingAllContainers) last=terminated(RestartingAllContainers,137)",
    "phase=Pending AllContainersRestarting=False Initialized=True Ready=False \
     | init0 restarts=1 state=running last=- \
     | main0 restarts=1 state=waiting(PodInitializing) last=terminated(RestartingAllContainers,137)",
    "phase=Running AllContainersRestarting=False Initialized=True Ready=True \
     | init0 restarts=1 state=running last=- \
     | main0 restarts=1 state=running last=-",
];

const CONDITIONS: [&str; 3] = ["AllContainersRestarting", "Initialized", "Ready"];

fn state(s: &Value) -> String {
    if s.get("running").is_some() {
        "running".to_owned()
    } else if let Some(t) = s.get("terminated") {
        format!(
            "terminated({},{})",
            t["reason"].as_str().unwrap_or("-"),
            t["exitCode"].as_i64().unwrap_or_default()
        )
    } else if let Some(w) = s.get("waiting") {
        format!("waiting({})", w["reason"].as_str().unwrap_or("-"))
    } else {
        "-".to_owned()
    }
}

/// One pod (its JSON) as one normalised line.
pub fn normalise(pod: &Value) -> String {
    let status = &pod["status"];
    let mut line = format!("phase={}", status["phase"].as_str().unwrap_or("-"));
    for kind in CONDITIONS {
        let value = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
            .and_then(|c| c["status"].as_str())
            .unwrap_or("False");
        line.push_str(&format!(" {kind}={value}"));
    }
    for (key, prefix) in [
        ("initContainerStatuses", "init"),
        ("containerStatuses", "main"),
    ] {
        for (i, c) in status[key].as_array().into_iter().flatten().enumerate() {
            line.push_str(&format!(
                " | {prefix}{i} restarts={} state={} last={}",
                c["restartCount"].as_i64().unwrap_or_default(),
                state(&c["state"]),
                state(&c["lastState"])
            ));
        }
    }
    line
}

/// The transitions of a group restart from what a watch served after the exit: consecutive
/// equal lines collapsed, the lines equal to `before` (the pod before the exit: writes that
/// are not the kubelet's) dropped from the front, and everything after the first line where
/// every container runs, Ready, again dropped.
pub fn group_restart(before: &str, seen: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in seen {
        if out.is_empty() && line == before {
            continue;
        }
        if out.last() != Some(line) {
            out.push(line.clone());
        }
        if line.starts_with("phase=Running")
            && line.contains(" Ready=True")
            && !line.contains("state=waiting")
            && !line.contains("state=terminated")
        {
            break;
        }
    }
    out
}

/// `Ok` when `seen` is `expected`; else both, line by line.
pub fn compare(expected: &[&str], seen: &[String]) -> Result<(), String> {
    if expected.len() == seen.len() && expected.iter().zip(seen).all(|(e, s)| e == s) {
        return Ok(());
    }
    let mut report = String::from("expected (real kubelet):\n");
    for e in expected {
        report.push_str(&format!("  {e}\n"));
    }
    report.push_str("seen:\n");
    for s in seen {
        report.push_str(&format!("  {s}\n"));
    }
    Err(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_normalises_without_names_times_or_ids() {
        let pod = json!({"status": {"phase": "Pending",
            "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": "t"},
                           {"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [{"name": "agent", "restartCount": 1, "containerID": "x",
                "state": {"running": {"startedAt": "t"}}, "lastState": {}}],
            "containerStatuses": [{"name": "worker", "restartCount": 1,
                "state": {"waiting": {"reason": "PodInitializing"}},
                "lastState": {"terminated": {"reason": "RestartingAllContainers", "exitCode": 137}}}]}});
        assert_eq!(normalise(&pod), REAL_KUBELET_GROUP_RESTART[2]);
    }

    #[test]
    fn the_sequence_starts_after_the_exit_and_ends_when_all_run() {
        let before = "phase=Running x".to_owned();
        let seen: Vec<String> = [
            before.as_str(),
            "a",
            "a",
            "b",
            REAL_KUBELET_GROUP_RESTART[3],
            "c",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(
            group_restart(&before, &seen),
            ["a", "b", REAL_KUBELET_GROUP_RESTART[3]]
        );
        assert!(compare(&["a"], &["a".to_owned()]).is_ok());
        assert!(compare(&["a"], &["b".to_owned()]).is_err());
    }
}
