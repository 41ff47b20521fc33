//! The status writes of the Job controller and of JobSet's controller, as the real ones make
//! them, so that benchmarks and tests see the traffic a group restart sets off
//! ([`super::SimConfig::status_writers`]).
//!
//! - **The Job controller** keeps each Job's `status.active`, `ready`, `failed` and `succeeded`
//!   counts of its pods, writing a Job's status at most once per second (its batch period:
//!   `syncJobBatchPeriod`), and only when a count changed.
//! - **JobSet's controller** rewrites `status.replicatedJobsStatus` (per replicatedJob: how many
//!   of its Jobs are ready, active, succeeded, failed, suspended) whenever a Job's status moves,
//!   one write at a time as its work queue gives them (here at most every 50 ms: 20 writes a
//!   second while Jobs change). It writes the whole status it knows (an update of the status
//!   subresource, with the resourceVersion it read: a conflict is retried at the next pass): in
//!   the `epoch` dialect the two epoch fields, which its types do not have, are dropped by each
//!   such write, as the real controller drops them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};

use super::{Ctx, job_resource, jobset_resource};
use jobset_inplace::protocol::{Dialect, JOBSET_NAME_LABEL};

/// The Job controller's batch period per Job.
const JOB_BATCH: Duration = Duration::from_secs(1);
/// kube-controller-manager's default `--concurrent-job-syncs`.
const JOB_WORKERS: usize = 5;
/// JobSet's controller's pace: one status write at a time.
pub(crate) const JOBSET_PACE: Duration = Duration::from_millis(50);

/// What the writers remember between passes.
#[derive(Default)]
pub(crate) struct Writers {
    /// Per Job name: when its status was last written.
    job_written: HashMap<String, Instant>,
    jobset_written: Option<Instant>,
    /// The Jobs' latest change (resourceVersion) the JobSet status was last computed from: JobSet's
    /// controller reconciles on Job events, not on a timer.
    jobs_seen: Option<u64>,
}

/// A pod's part in its Job's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    active: i64,
    ready: i64,
    failed: i64,
    succeeded: i64,
}

fn counts_of(pods: &[&Value]) -> Counts {
    let mut c = Counts::default();
    for p in pods {
        match p.pointer("/status/phase").and_then(Value::as_str) {
            Some("Failed") => c.failed += 1,
            Some("Succeeded") => c.succeeded += 1,
            _ if p.pointer("/metadata/deletionTimestamp").is_some() => {}
            _ => {
                c.active += 1;
                let ready = p
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                if ready {
                    c.ready += 1;
                }
            }
        }
    }
    c
}

fn job_counts(job: &Value) -> Counts {
    let n = |f: &str| {
        job.pointer(&format!("/status/{f}"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    Counts {
        active: n("active"),
        ready: n("ready"),
        failed: n("failed"),
        succeeded: n("succeeded"),
    }
}

/// `status.replicatedJobsStatus` from the Jobs, as JobSet's controller counts them: a Job is
/// ready when its ready and succeeded pods reach its parallelism.
pub(crate) fn replicated_jobs_status(jobset: &Value, jobs: &[&Value]) -> Value {
    let names: Vec<&str> = jobset
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    let rows: Vec<Value> = names
        .iter()
        .map(|name| {
            let mine = jobs.iter().filter(|j| {
                j.pointer("/metadata/labels/jobset.sigs.k8s.io~1replicatedjob-name")
                    .and_then(Value::as_str)
                    == Some(name)
            });
            let (mut ready, mut active, mut succeeded, mut failed, mut suspended) = (0, 0, 0, 0, 0);
            for j in mine {
                let c = job_counts(j);
                let parallelism = j
                    .pointer("/spec/parallelism")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                let finished = |t: &str| {
                    j.pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c["type"] == t && c["status"] == "True")
                        })
                };
                if finished("Complete") {
                    succeeded += 1;
                } else if finished("Failed") {
                    failed += 1;
                } else if j.pointer("/spec/suspend") == Some(&Value::Bool(true)) {
                    suspended += 1;
                } else {
                    if c.ready + c.succeeded >= parallelism {
                        ready += 1;
                    }
                    if c.active > 0 {
                        active += 1;
                    }
                }
            }
            json!({"name": name, "ready": ready, "succeeded": succeeded, "failed": failed,
                   "active": active, "suspended": suspended})
        })
        .collect();
    Value::Array(rows)
}

impl Ctx {
    /// One pass of the Job controller's status writes.
    pub(crate) async fn write_job_statuses(&self, w: &mut Writers) {
        let ns = &self.config.namespace;
        let now = Instant::now();
        // The Job controller.
        let pods = self.server.list_shared("pods", Some(ns));
        let mut by_owner: HashMap<&str, Vec<&Value>> = HashMap::new();
        for p in &pods {
            if let Some(uid) = p
                .value
                .pointer("/metadata/ownerReferences/0/uid")
                .and_then(Value::as_str)
            {
                by_owner.entry(uid).or_default().push(&p.value);
            }
        }
        let jobs = self.server.list_shared("jobs", Some(ns));
        let jobs_api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &job_resource());
        let mut due: Vec<(String, Value)> = Vec::new();
        for job in &jobs {
            let v = &job.value;
            if v.pointer(&format!(
                "/metadata/labels/{}",
                JOBSET_NAME_LABEL.replace('/', "~1")
            ))
            .and_then(Value::as_str)
                != Some(self.config.jobset_name.as_str())
            {
                continue;
            }
            let (Some(name), Some(uid)) = (
                v.pointer("/metadata/name").and_then(Value::as_str),
                v.pointer("/metadata/uid").and_then(Value::as_str),
            ) else {
                continue;
            };
            let counts = counts_of(by_owner.get(uid).map(Vec::as_slice).unwrap_or(&[]));
            if counts == job_counts(v)
                || w.job_written
                    .get(name)
                    .is_some_and(|t| now.duration_since(*t) < JOB_BATCH)
            {
                continue;
            }
            let patch = json!({"status": {"active": counts.active, "ready": counts.ready,
                                          "failed": counts.failed, "succeeded": counts.succeeded}});
            due.push((name.to_owned(), patch));
        }
        // As many at once as kube-controller-manager's Job workers (`--concurrent-job-syncs`).
        let written: Vec<String> = futures::stream::iter(due)
            .map(|(name, patch)| {
                let api = jobs_api.clone();
                async move {
                    let result = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    (name, result)
                }
            })
            .buffer_unordered(JOB_WORKERS)
            .filter_map(|(name, result)| async move {
                match result {
                    Ok(_) => Some(name),
                    Err(e) => {
                        self.log(format!("job controller: cannot write {name}'s status: {e}"));
                        None
                    }
                }
            })
            .collect()
            .await;
        for name in written {
            w.job_written.insert(name, now);
        }
        let names: std::collections::HashSet<&str> = jobs
            .iter()
            .filter_map(|j| j.value.pointer("/metadata/name").and_then(Value::as_str))
            .collect();
        w.job_written
            .retain(|name, _| names.contains(name.as_str()));
    }

    /// JobSet's controller: one status write when the Jobs' counts moved (its own task, at its
    /// own pace, beside the Job controller's passes).
    pub(crate) async fn write_jobset_status(&self, w: &mut Writers) {
        let ns = &self.config.namespace;
        let now = Instant::now();
        if w.jobset_written
            .is_some_and(|t| now.duration_since(t) < JOBSET_PACE)
        {
            return;
        }
        let jobs_changed = self.server.last_change("jobs");
        if w.jobs_seen == Some(jobs_changed) {
            return;
        }
        let Some(js) = self.server.get("jobsets", ns, &self.config.jobset_name) else {
            return;
        };
        let jobs = self.server.list_shared("jobs", Some(ns));
        let mine: Vec<&Value> = jobs
            .iter()
            .map(|j| &j.value)
            .filter(|j| j.pointer("/metadata/ownerReferences/0/uid") == js.pointer("/metadata/uid"))
            .collect();
        let rows = replicated_jobs_status(&js, &mine);
        if js.pointer("/status/replicatedJobsStatus") == Some(&rows) {
            w.jobs_seen = Some(jobs_changed);
            return;
        }
        let mut status: Map<String, Value> = js
            .get("status")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        status.insert("replicatedJobsStatus".to_owned(), rows);
        if self.config.dialect == Dialect::Epoch {
            // Not in JobSet's types: an update of the status drops them.
            for field in [
                Dialect::Epoch.deprecated_field(),
                Dialect::Epoch.synced_field(),
            ] {
                status.remove(field);
            }
        }
        let mut object = js;
        object["status"] = Value::Object(status);
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &jobset_resource());
        let Ok(body) = serde_json::from_value::<DynamicObject>(object) else {
            return;
        };
        match api
            .replace_status(&self.config.jobset_name, &PostParams::default(), &body)
            .await
        {
            Ok(_) => {
                w.jobset_written = Some(now);
                w.jobs_seen = Some(jobs_changed);
            }
            // A conflict (another writer moved it since it was read) is retried next pass.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => self.log(format!("jobset controller: cannot write the status: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_phases_and_readiness() {
        let pod = |phase: &str, ready: bool| {
            json!({"status": {"phase": phase, "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
        };
        let pods = [
            pod("Running", true),
            pod("Running", false),
            pod("Failed", false),
            pod("Succeeded", false),
        ];
        let refs: Vec<&Value> = pods.iter().collect();
        assert_eq!(
            counts_of(&refs),
            Counts {
                active: 2,
                ready: 1,
                failed: 1,
                succeeded: 1
            }
        );
    }

    #[test]
    fn replicated_jobs_count_ready_jobs_by_parallelism() {
        let js = json!({"spec": {"replicatedJobs": [{"name": "w"}, {"name": "d"}]}});
        let job = |rj: &str, parallelism: i64, ready: i64| {
            json!({"metadata": {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": rj}},
                   "spec": {"parallelism": parallelism},
                   "status": {"active": parallelism, "ready": ready}})
        };
        let jobs = [job("w", 2, 2), job("w", 2, 1), job("d", 1, 0)];
        let refs: Vec<&Value> = jobs.iter().collect();
        assert_eq!(
            replicated_jobs_status(&js, &refs),
            json!([
                {"name": "w", "ready": 1, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0},
                {"name": "d", "ready": 0, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
            ])
        );
    }
}
