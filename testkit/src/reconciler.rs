//! The reconciler's options as tests start it in-process: two workers, a 5 ms debounce, the
//! product's timeouts, every namespace, no leader election, no CRD check. A test changes the
//! fields its scenario is about.

use std::time::Duration;

use jobset_inplace::protocol::Dialect;
use jobset_inplace::reconciler::{self, Options, Settings};

/// The settings a test's reconciler starts from.
pub fn settings(dialect: Dialect, identity: &str) -> Settings {
    Settings {
        dialect,
        namespace: None,
        workers: 2,
        debounce: Duration::from_millis(5),
        identity: identity.to_owned(),
        provision: None,
        request_timeout: reconciler::DEFAULT_REQUEST_TIMEOUT,
        watch_timeout: reconciler::DEFAULT_WATCH_TIMEOUT,
        write_epoch_status: true,
        publish_epochs: true,
        group_restart_timeout: Some(reconciler::DEFAULT_GROUP_RESTART_TIMEOUT),
        // The test kit's nodes send no heartbeat (tests/it/system/ watch no Nodes, but for the
        // tests of node loss, which set it).
        node_lost: reconciler::nodes::NodeLost::Off,
    }
}

/// [`settings`], without leader election or the start-up CRD check.
pub fn options(dialect: Dialect, identity: &str) -> Options {
    Options {
        settings: settings(dialect, identity),
        leader_election: None,
        check_crd: false,
    }
}

/// `pod` (labelled with its JobSet's name) as the Job controller creates it: with a controller
/// reference to a Job of that JobSet — the one its `batch.kubernetes.io/job-name` label names,
/// else `<jobset>-job` — created first, if missing, as JobSet's controller creates it (labelled
/// with the JobSet's name, controlled by the JobSet's UID). The reconciler counts a pod toward a
/// JobSet only so (`jobset_inplace::reconciler::membership`). The JobSet must exist on `server`.
pub fn member_of(
    server: &crate::apiserver::TestApiServer,
    mut pod: serde_json::Value,
) -> serde_json::Value {
    use jobset_inplace::protocol::JOBSET_NAME_LABEL;
    use serde_json::json;
    let text = |v: &serde_json::Value, p: &str| {
        v.pointer(p)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let ns = text(&pod, "/metadata/namespace").unwrap_or_else(|| "default".to_owned());
    let labels = pod.pointer("/metadata/labels").cloned().unwrap_or_default();
    let jobset = labels
        .get(JOBSET_NAME_LABEL)
        .and_then(serde_json::Value::as_str)
        .expect("member_of: a pod labelled with its JobSet's name")
        .to_owned();
    let job_name = labels
        .get("batch.kubernetes.io/job-name")
        .and_then(serde_json::Value::as_str)
        .map_or_else(|| format!("{jobset}-job"), str::to_owned);
    let job = match server.get("jobs", &ns, &job_name) {
        Some(job) => job,
        None => {
            let owner = server
                .get("jobsets", &ns, &jobset)
                .expect("member_of: the JobSet exists");
            server
                .create(
                    "jobs",
                    json!({
                        "apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": job_name, "namespace": ns,
                                     "labels": {JOBSET_NAME_LABEL: jobset},
                                     "ownerReferences": [{
                                         "apiVersion": jobset_inplace::jobset::API_VERSION,
                                         "kind": jobset_inplace::jobset::KIND,
                                         "name": jobset, "uid": owner["metadata"]["uid"],
                                         "controller": true, "blockOwnerDeletion": true}]},
                        "spec": {"template": {"spec": {"containers": []}}}
                    }),
                )
                .expect("member_of: the Job")
        }
    };
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": job_name,
        "uid": job["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    }]);
    pod
}
