//! The group-restart deadline, carried out (docs/protocol.md, "Deadline"). The decision is
//! [`crate::deadline::decide`]; this module keeps each JobSet's [`Clock`] (every replica, from
//! the JobSet watch, so that a standby taking over knows when a group restart began), runs the
//! decision after each evaluation of a JobSet on the leader, wakes the JobSet up when a window
//! ends, and does what the decision says:
//!
//! - step 1: each pod that has not registered is marked `Failed` and deleted, both with its UID as
//!   a precondition, the delete with a grace period of 0 (`podReplacementPolicy: Failed` replaces
//!   a pod only once it has failed, which a pod whose kubelet is gone never does on its own);
//! - step 2: `status.restarts` and `status.restartsCountTowardsMax` are raised by one (a merge
//!   patch on `status` guarded by the `resourceVersion` decided on), then the JobSet's Jobs of
//!   earlier restarts are deleted with foreground propagation and their UID as a precondition, as
//!   JobSet's controller does for its `Recreate` restarts; it then creates them again;
//! - step 2 at `maxRestarts`: the JobSet is failed as the epoch algorithm fails it.
//!
//! Every API call is bounded by the request timeout; each step is a Warning event on the JobSet
//! and a count in `group_restart_deadline_steps_total{step}`. The state kept per JobSet (the
//! clock, one timer, the step in flight, the Jobs still to delete after a recreation, the
//! malformed annotation reported) goes with the JobSet ([`Deadlines::forget`]).
//!
//! The steps run off the reconcile workers (issue 21, item 6): a worker only decides, and hands
//! a step to a task of its own, at most one per JobSet, so that one JobSet's deletes (two
//! requests per pod, each up to the request timeout, on a slow or hostile API path) never hold
//! the workers that move every other JobSet's epochs. Their pod and Job requests take a permit
//! of their namespace and then one of the whole process (first come first served,
//! [`super::deadline_entry::Steps`]): one namespace's deletes wait behind each other,
//! never hold more than their share, and the requests in flight are bounded. A pass that finds a
//! step of its JobSet in flight leaves the deadline alone; the step queues the JobSet again when
//! it ends.
//!
//! Our own: kube-runtime has no per-object deadline; its `Controller`'s requeue would run the
//! steps inside a reconcile, on the workers this module keeps them off.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::Instrument;

use super::api::{ReconcileError, retry_delay};
use super::report::{CONTROLLER_NAME, emit};
use super::state::{Shared, lock};
use super::status::{patch_status, reread_status, status_patch, write_failed};
use crate::deadline::{
    self, Action, Clock, Decision, JobView, PodRef, Step, display_duration, name_list,
};
use crate::jobset::JobSet;
use crate::protocol::{Epoch, JOBSET_NAME_LABEL};
use crate::reconciler::index::JobSetState;
use crate::reconciler::key::Key;
use crate::reconciler::queue::Reason;
use crate::wire::WatchedPod;

/// Names an event lists before it counts the rest.
const NAMES_IN_EVENTS: usize = 8;

/// Deletes in flight at once for one JobSet.
const PARALLEL_DELETES: usize = 8;

/// Queues `key` again after `after`, unless an earlier wake-up is pending. The task holds the
/// controller weakly, and is aborted with the JobSet or the controller.
fn wake_after(shared: &Arc<Shared>, key: &Key, after: Duration) {
    let now = shared.steps.now();
    let due = now.saturating_add(after);
    let weak = Arc::downgrade(shared);
    let woken = key.clone();
    shared.with_deadline(key, |entry| {
        entry.wake_at(now, due, || {
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if let Some(shared) = weak.upgrade() {
                    shared.queue.add(woken, Reason::Deadline);
                }
            })
            .abort_handle()
        });
    });
}

/// What one evaluation read, under the index lock.
struct Seen {
    state: JobSetState,
    clock: Clock,
    timeout: Duration,
    decision: Decision,
    /// The `resourceVersion` of each pod to delete, as the decision saw it: its `Failed` mark's
    /// precondition, so that a pod that changed since (registered) is left alone whatever the
    /// timing (a write sent late by a deposed leader included).
    versions: HashMap<String, String>,
}

/// Runs the deadline of one JobSet after its evaluation, on the leader: decides, and hands a step
/// that needs the API to a task off the workers ([`spawn_step`]); a wait is a timer.
pub(super) async fn reconcile(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    if shared.with_deadline(key, |e| e.step_in_flight()) {
        // It queues the JobSet again when it ends.
        return Ok(());
    }
    let now = shared.steps.now();
    let seen = {
        let index = lock(&shared.index);
        // As for the epochs: no decision on a pod cache being re-listed.
        if index.pods_relisting_in_progress() {
            return Ok(());
        }
        let Some((state, pods)) = index.get(key) else {
            return Ok(());
        };
        let clock = shared.observe_deadline(key, state);
        let (timeout, malformed) = deadline::effective_timeout(
            state.group_restart_timeout.as_deref(),
            shared.settings.group_restart_timeout,
        );
        if state.in_place_restart {
            report_annotation(shared, key, state, malformed.map(|e| e.to_string()));
        }
        let decision = deadline::decide(&deadline::Input {
            status: state.status,
            expected_pods: state.expected_pods,
            pods,
            restarts: state.restarts,
            restarts_count_towards_max: state.restarts_count_towards_max,
            max_restarts: state.max_restarts,
            timeout,
            clock,
            now,
        });
        let versions = match &decision.action {
            Action::DeleteUnregistered(pods) => pods
                .iter()
                .filter_map(|p| {
                    let rv = index.pod_resource_version(key, &p.name)?;
                    Some((p.name.clone(), rv.to_owned()))
                })
                .collect(),
            _ => HashMap::new(),
        };
        match (clock, timeout) {
            (Some(clock), Some(timeout)) => Some(Seen {
                state: state.clone(),
                clock,
                timeout,
                decision,
                versions,
            }),
            _ => None,
        }
    };
    let cleanup = shared.with_deadline(key, |e| e.cleanup);
    let action = seen.as_ref().map(|s| &s.decision.action);
    match (action, cleanup) {
        (None | Some(Action::None), None) => Ok(()),
        (Some(Action::WaitFor(after)), None) => {
            wake_after(shared, key, *after);
            Ok(())
        }
        _ => {
            spawn_step(shared, key, seen, cleanup);
            Ok(())
        }
    }
}

/// Runs a step of one JobSet in a task of its own (unless one is in flight): its requests wait
/// for their permits there, not in a worker. When it ends, the JobSet is queued again (after a
/// backoff when it failed). The step runs in the span of the worker's pass that started it.
fn spawn_step(shared: &Arc<Shared>, key: &Key, seen: Option<Seen>, cleanup: Option<i32>) {
    let (task_shared, task_key) = (shared.clone(), key.clone());
    shared.with_deadline(key, move |entry| {
        if entry.step_in_flight() {
            return;
        }
        let task = tokio::spawn(async move {
            let (shared, key) = (task_shared, task_key);
            let result = run_step(&shared, &key, seen, cleanup).await;
            let failures = shared.with_deadline(&key, |e| {
                e.step = None;
                e.step_failures = match result {
                    Ok(()) => 0,
                    Err(_) => e.step_failures.saturating_add(1),
                };
                e.step_failures
            });
            match result {
                Ok(()) => shared.queue.add(key, Reason::Deadline),
                Err(e) => {
                    let delay = retry_delay(failures, e.retry_after(), fastrand::f64());
                    tracing::warn!(namespace = %key.namespace, jobset = %key.name, error = %e, retry_in = ?delay, "group-restart deadline step failed; retrying");
                    wake_after(&shared, &key, delay);
                }
            }
        }
        // Its lines name the reasons of the pass that started it (the worker's span).
        .in_current_span());
        entry.step = Some(task.abort_handle());
    });
}

/// One step: the Jobs of earlier restarts still to delete, then what the decision says.
async fn run_step(
    shared: &Arc<Shared>,
    key: &Key,
    seen: Option<Seen>,
    cleanup: Option<i32>,
) -> Result<(), ReconcileError> {
    if let Some(restarts) = cleanup {
        let uid = lock(&shared.index)
            .jobset(key)
            .map(|s| s.uid.clone())
            .unwrap_or_default();
        delete_previous_jobs(shared, key, &uid, restarts).await?;
        shared.with_deadline(key, |e| e.cleanup = None);
    }
    let Some(seen) = seen else {
        return Ok(());
    };
    match &seen.decision.action {
        Action::None => Ok(()),
        Action::WaitFor(after) => {
            wake_after(shared, key, *after);
            Ok(())
        }
        Action::DeleteUnregistered(pods) => delete_unregistered(shared, key, &seen, pods).await,
        Action::Recreate {
            restarts,
            restarts_count_towards_max,
        } => recreate(shared, key, &seen, *restarts, *restarts_count_towards_max).await,
        Action::Fail {
            restarts_count_towards_max,
            max_restarts,
        } => {
            let message = format!(
                "the group restart to epoch {} did not complete in place, nor {} after its \
                 unregistered pods were deleted, and recreating its pods would pass maxRestarts \
                 {max_restarts} ({restarts_count_towards_max} restarts counted)",
                target(&seen.clock),
                display_duration(seen.timeout)
            );
            if write_failed(shared, key, &seen.state, &message).await? {
                shared.metrics.deadline_step("failed");
                shared.with_deadline(key, |e| e.set_clock(None));
                Ok(())
            } else {
                reread(shared, key).await
            }
        }
    }
}

/// The epoch the group restart is to.
fn target(clock: &Clock) -> Epoch {
    clock.deprecated.saturating_add(1)
}

/// Says once per value, as a Warning event, that the timeout annotation is malformed; forgets
/// it once fixed.
fn report_annotation(shared: &Shared, key: &Key, state: &JobSetState, malformed: Option<String>) {
    let first = shared.with_deadline(key, |e| {
        let first = malformed.is_some() && e.bad_annotation != malformed;
        e.bad_annotation.clone_from(&malformed);
        first
    });
    if let (true, Some(error)) = (first, malformed) {
        let default = shared
            .settings
            .group_restart_timeout
            .map_or_else(|| "off".to_owned(), display_duration);
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, %error, "malformed group-restart timeout annotation; using the default");
        emit(
            shared,
            key,
            state,
            EventType::Warning,
            "InvalidGroupRestartTimeout",
            format!(
                "annotation {}: {error}; using the reconciler's default ({default})",
                deadline::TIMEOUT_ANNOTATION
            ),
        );
    }
}

/// Step 1: the pods that did not register in time are deleted, so that their Jobs replace them.
async fn delete_unregistered(
    shared: &Arc<Shared>,
    key: &Key,
    seen: &Seen,
    pods: &[PodRef],
) -> Result<(), ReconcileError> {
    let (timeout, target) = (display_duration(seen.timeout), target(&seen.clock));
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    let say = shared.with_deadline(key, |e| {
        let say = !e.timed_out_reported;
        e.timed_out_reported = true;
        say
    });
    if say {
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, epoch = target, pods = ?names, missing = seen.decision.missing, "group restart timed out; deleting the pods that did not register");
        let missing = match seen.decision.missing {
            0 => String::new(),
            n => format!(", {n} expected pod(s) missing"),
        };
        emit(
            shared,
            key,
            &seen.state,
            EventType::Warning,
            "GroupRestartTimedOut",
            format!(
                "the group restart to epoch {target} did not complete within {timeout}: {} pod(s) \
                 have not registered it ({}){missing}; deleting them so that their Jobs replace \
                 them, and recreating every pod if it does not complete within {timeout} more",
                pods.len(),
                name_list(&names, NAMES_IN_EVENTS)
            ),
        );
    }
    let api: Api<WatchedPod> = Api::namespaced(shared.api.client.clone(), &key.namespace);
    let reason = format!(
        "did not register epoch {target} within {timeout}: failed and deleted by {} so that its \
         Job replaces it",
        CONTROLLER_NAME
    );
    let results: Vec<(String, Result<bool, Option<kube::Error>>)> =
        futures::stream::iter(pods.iter().cloned())
            .map(|pod| {
                let (api, reason) = (api.clone(), reason.clone());
                let version = seen.versions.get(&pod.name).cloned();
                async move {
                    let _permit = shared.steps.permit(&key.namespace).await;
                    let result = fail_and_delete(
                        shared,
                        &api,
                        &pod,
                        version,
                        ("GroupRestartTimedOut", &reason),
                    )
                    .await;
                    (pod.name, result)
                }
            })
            .buffer_unordered(PARALLEL_DELETES)
            .collect()
            .await;
    let mut deleted: Vec<String> = Vec::new();
    let mut failure = None;
    for (name, result) in results {
        match result {
            Ok(true) => deleted.push(name),
            Ok(false) => {}
            Err(e) => failure = Some((name, e)),
        }
    }
    deleted.sort();
    shared
        .metrics
        .deadline_pods_deleted
        .inc_by(deleted.len() as u64);
    if !deleted.is_empty() {
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, pods = ?deleted, "unregistered pods deleted");
        emit(
            shared,
            key,
            &seen.state,
            EventType::Warning,
            "UnregisteredPodsDeleted",
            format!(
                "deleted {} pod(s) that did not register epoch {target} within {timeout}: {}",
                deleted.len(),
                name_list(&deleted, NAMES_IN_EVENTS)
            ),
        );
    }
    if let Some((pod, e)) = failure {
        return Err(match e {
            Some(source) => ReconcileError::Deadline {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                action: format!("delete pod {pod}"),
                source,
            },
            None => shared.api.timeout(key, "pod_delete"),
        });
    }
    let at = shared.steps.now();
    shared.with_deadline(key, |e| {
        if let Some(clock) = e.clock.as_mut()
            && clock.started == seen.clock.started
        {
            clock.step = Step::UnregisteredDeleted { at };
        }
    });
    shared.metrics.deadline_step("unregistered_pods_deleted");
    wake_after(shared, key, seen.timeout);
    Ok(())
}

/// One pod of step 1: marked `Failed` (a merge patch on `status` carrying its UID and the
/// `resourceVersion` the decision saw, preconditions: a pod that registered since is left
/// alone), then deleted with a grace period of 0 and its UID as a precondition (a pod marked
/// `Failed` never runs again, so nothing it does since can make its delete wrong). A pod is
/// replaced under `podReplacementPolicy: Failed` only once it has failed (the Job controller
/// keeps its `batch.kubernetes.io/job-tracking` finalizer until then), and a pod whose kubelet is
/// gone never fails on its own: Kubernetes' pod garbage collector does the same for the pods it
/// removes. `Ok(false)`: the pod was already gone or replaced. `(reason, message)`: the pod
/// status's. Also step 0 of an agent that restarted alone (`alone.rs`).
pub(super) async fn fail_and_delete(
    shared: &Shared,
    api: &Api<WatchedPod>,
    pod: &PodRef,
    version: Option<String>,
    (reason, message): (&str, &str),
) -> Result<bool, Option<kube::Error>> {
    let uid = Some(pod.uid.clone()).filter(|u| !u.is_empty());
    let mut failed = json!({
        "status": {"phase": "Failed", "reason": reason, "message": message}
    });
    if let Some(uid) = &uid {
        failed["metadata"]["uid"] = json!(uid);
    }
    if let Some(version) = version.filter(|v| !v.is_empty()) {
        failed["metadata"]["resourceVersion"] = json!(version);
    }
    match shared
        .api
        .fenced(
            "pod_status_write",
            api.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&failed)),
        )
        .await
    {
        Ok(_) => {}
        // Gone, another pod of that name now, or changed since the decision (registered, say):
        // left to the next decision.
        Err(Some(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => return Ok(false),
        // Refused (say, a pod that succeeded meanwhile): deleting it is still what is due.
        Err(Some(kube::Error::Api(s))) if s.code == 422 => {}
        Err(other) => return Err(other),
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    shared
        .api
        .fenced("pod_delete", api.delete(&pod.name, &params))
        .await
        .map(|_| true)
        .or_else(gone)
}

/// A delete that found the object gone (404) or replaced by another of the same name (409, the
/// UID precondition) did nothing, and needs nothing more.
fn gone(e: Option<kube::Error>) -> Result<bool, Option<kube::Error>> {
    match e {
        Some(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        other => Err(other),
    }
}

/// Step 2: a JobSet restart, as JobSet's `Recreate` makes one: `status.restarts` and
/// `status.restartsCountTowardsMax` up by one, then the Jobs of earlier restarts deleted.
async fn recreate(
    shared: &Arc<Shared>,
    key: &Key,
    seen: &Seen,
    restarts: i32,
    counted: i32,
) -> Result<(), ReconcileError> {
    let patch = status_patch(
        &seen.state.resource_version,
        json!({"restarts": restarts, "restartsCountTowardsMax": counted}),
    );
    let applied = |js: &JobSet| js.status.as_ref().and_then(|s| s.restarts) == Some(restarts);
    let Some(js) = patch_status(shared, key, &patch, "restarts", applied).await? else {
        return reread(shared, key).await;
    };
    lock(&shared.index).record_write(key, &js);
    shared.metrics.deadline_step("recreated");
    let unregistered: Vec<&str> = seen
        .decision
        .unregistered_pods
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let timeout = display_duration(seen.timeout);
    tracing::warn!(namespace = %key.namespace, jobset = %key.name, epoch = target(&seen.clock), restarts, pods = ?unregistered, "group restart still incomplete after its unregistered pods were deleted; recreating every pod");
    emit(
        shared,
        key,
        &seen.state,
        EventType::Warning,
        "FallingBackToRecreate",
        format!(
            "the group restart to epoch {} did not complete within {timeout} after its \
             unregistered pods were deleted ({} pod(s) still not registered: {}; {} missing): \
             recreating every pod as JobSet's Recreate does (status.restarts {restarts}, \
             {counted} of maxRestarts {} counted)",
            target(&seen.clock),
            unregistered.len(),
            name_list(&unregistered, NAMES_IN_EVENTS),
            seen.decision.missing,
            seen.state.max_restarts
        ),
    );
    // The new restart count starts a new clock; the Jobs of earlier restarts go, until done.
    shared.with_deadline(key, |e| e.cleanup = Some(restarts));
    if let Some(state) = lock(&shared.index).jobset(key) {
        shared.observe_deadline(key, state);
    }
    let uid = js.metadata.uid.clone().unwrap_or_default();
    delete_previous_jobs(shared, key, &uid, restarts).await?;
    shared.with_deadline(key, |e| e.cleanup = None);
    wake_after(shared, key, seen.timeout);
    Ok(())
}

/// Deletes the JobSet's Jobs of restarts below `restarts` ([`deadline::jobs_to_delete`]), with
/// foreground propagation (their pods go first) and each Job's UID as a precondition.
async fn delete_previous_jobs(
    shared: &Arc<Shared>,
    key: &Key,
    jobset_uid: &str,
    restarts: i32,
) -> Result<(), ReconcileError> {
    let api: Api<Job> = Api::namespaced(shared.api.client.clone(), &key.namespace);
    let params = ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}={}", key.name));
    let permit = shared.steps.permit(&key.namespace).await;
    let list = shared
        .api
        .bounded("job_list", api.list_metadata(&params))
        .await;
    drop(permit);
    let list = list.map_err(|e| match e {
        Some(source) => ReconcileError::Deadline {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            action: "list the Jobs".to_owned(),
            source,
        },
        None => shared.api.timeout(key, "job_list"),
    })?;
    let views: Vec<JobView<'_>> = list
        .items
        .iter()
        .map(|job| {
            let meta = &job.metadata;
            JobView {
                name: meta.name.as_deref().unwrap_or_default(),
                uid: meta.uid.as_deref().unwrap_or_default(),
                controller_uid: meta
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.controller == Some(true))
                    .map(|o| o.uid.as_str()),
                restart_attempt: meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(deadline::RESTART_ATTEMPT_LABEL))
                    .map(String::as_str),
                deleting: meta.deletion_timestamp.is_some(),
            }
        })
        .collect();
    let doomed = deadline::jobs_to_delete(&views, jobset_uid, restarts);
    if doomed.is_empty() {
        return Ok(());
    }
    let results: Vec<(String, Result<bool, Option<kube::Error>>)> = futures::stream::iter(doomed)
        .map(|job| {
            let api = api.clone();
            async move {
                let _permit = shared.steps.permit(&key.namespace).await;
                let params = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Foreground),
                    preconditions: Some(Preconditions {
                        uid: Some(job.uid.clone()).filter(|u| !u.is_empty()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                let result = shared
                    .api
                    .fenced("job_delete", api.delete(&job.name, &params))
                    .await
                    .map(|_| true)
                    .or_else(gone);
                (job.name, result)
            }
        })
        .buffer_unordered(PARALLEL_DELETES)
        .collect()
        .await;
    let mut deleted = 0u64;
    let mut failure = None;
    for (name, result) in results {
        match result {
            Ok(true) => deleted += 1,
            Ok(false) => {}
            Err(e) => failure = Some((name, e)),
        }
    }
    shared.metrics.deadline_jobs_deleted.inc_by(deleted);
    tracing::info!(namespace = %key.namespace, jobset = %key.name, restarts, jobs = deleted, "Jobs of earlier restarts deleted; JobSet's controller creates them again");
    match failure {
        None => Ok(()),
        Some((job, Some(source))) => Err(ReconcileError::Deadline {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            action: format!("delete Job {job}"),
            source,
        }),
        Some((_, None)) => Err(shared.api.timeout(key, "job_delete")),
    }
}

/// After a 409: the JobSet is read again and evaluated again.
async fn reread(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    reread_status(shared, key).await?;
    shared.queue.add(key.clone(), Reason::Retry);
    Ok(())
}
