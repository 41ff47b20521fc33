//! Status and epoch writes: a JobSet evaluated ([`reconcile_epochs`]: the pure decision on the
//! index), then its epoch fields written ([`write_epochs`]: this is where the deprecated and the
//! synced epochs are raised) or the JobSet failed ([`write_failed`]), each a merge patch on the
//! `status` subresource guarded by the `resourceVersion` decided on ([`patch_status`]).
//!
//! Every status write carries the `resourceVersion` it was decided on (an optimistic lock): a
//! write decided on a stale view is refused with 409, the JobSet is re-read and decided again,
//! so a field can never be moved backwards by this process or by a leader that lost its lease.
//! Our own merge patches rather than kube-runtime's server-side apply of the status: JobSet's own
//! controller owns the same fields, and an apply would take them over.

use std::sync::Arc;
use std::time::Instant;

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::api::{CONFLICT_RETRIES, ReconcileError, write_error};
use super::publication::{publish_status, publishing};
use super::report::{
    emit, observe, record_progress, report_malformed, report_strangers, report_unservable,
};
use super::state::{Shared, lock};
use crate::jobset::JobSet;
use crate::protocol::{AloneAgent, EpochStatus, ReconcileDecision, StatusChange, reconcile_decide};
use crate::reconciler::index::{JobSetState, reconcile_input};
use crate::reconciler::key::Key;
use kube::runtime::events::EventType;

/// Condition reason of a JobSet failed by the reconciler.
pub const REACHED_MAX_RESTARTS: &str = "ReachedMaxRestarts";

/// Evaluates one JobSet's epochs and writes what changed (or, leaving them to JobSet's own
/// controller, observes them). Returns the pods the last decision found with an agent that
/// restarted without their workers (`alone.rs` fails them).
pub(super) async fn reconcile_epochs(
    shared: &Arc<Shared>,
    key: &Key,
) -> Result<Vec<AloneAgent>, ReconcileError> {
    if shared.settings.publish_epochs
        && shared.settings.write_epoch_status
        && !shared.published.is_unavailable()
        && !shared.published.is_synced()
    {
        // Decisions are published before they are written, and nothing can be published before
        // the objects are listed: wait (the list's end queues every InPlaceRestart JobSet).
        return Ok(Vec::new());
    }
    for _ in 0..CONFLICT_RETRIES {
        let Some((state, decision)) = decide(shared, key) else {
            return Ok(Vec::new());
        };
        if let Some(reason) = &state.unservable {
            report_unservable(shared, key, &state, reason);
            return Ok(Vec::new());
        }
        shared.with_entry(key, |e| e.unservable = None);
        report_malformed(shared, key, &state, &decision);
        report_strangers(shared, key, &state);
        if !shared.settings.write_epoch_status {
            observe(shared, key, &state, &decision);
            return Ok(Vec::new());
        }
        let written = if let Some(fail) = &decision.fail {
            write_failed(shared, key, &state, &fail.to_string()).await?
        } else if !decision.change.is_empty() {
            write_epochs(shared, key, &state, &decision).await?
        } else {
            true
        };
        if written {
            return Ok(decision.restarted_alone);
        }
        // 409: re-read the JobSet and decide again on what is there now.
        reread_status(shared, key).await?;
    }
    Err(ReconcileError::Conflicts {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
    })
}

/// Runs the pure decision on the index, in place.
pub(super) fn decide(shared: &Shared, key: &Key) -> Option<(JobSetState, ReconcileDecision)> {
    let index = lock(&shared.index);
    // While the pod watch re-lists, some pods are listed anew and others are as they were: a
    // pod created since the last event seen may be missing while a pod that failed since still
    // counts, so the synced epoch could be written with a registered pod left out (found by the
    // model check, tests/it/model_check.rs). The keys are queued again when the list is complete.
    if index.pods_relisting_in_progress() {
        return None;
    }
    // The same for the Jobs, which decide which pods count: before the Job watch has listed,
    // no pod is known to be a JobSet's; during a relist, a deleted Job's pods would still count.
    if index.jobs_relisting_in_progress() {
        return None;
    }
    let (state, pods) = index.get(key)?;
    if !state.active {
        return None;
    }
    let started = Instant::now();
    let decision = reconcile_decide(&reconcile_input(
        index.dialect(),
        state,
        pods,
        index.last_synced(key),
        index.last_deprecated(key),
    ));
    shared
        .metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    shared.metrics.reconciles.inc();
    Some((state.clone(), decision))
}

pub(super) async fn write_epochs(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    decision: &ReconcileDecision,
) -> Result<bool, ReconcileError> {
    let dialect = shared.settings.dialect;
    let Some(Value::Object(mut body)) = dialect.status_merge_patch(&decision.change) else {
        return Ok(true);
    };
    let status = body.remove("status").unwrap_or(Value::Null);
    let field = if decision.change.synced.is_some() {
        "synced"
    } else {
        "deprecated"
    };
    let patch = status_patch(&state.resource_version, status);
    let change = decision.change;
    if publishing(shared) {
        // Agents read the published epochs, not the status: publish the decision first, so
        // that what they read never lags the status (a new pod reading a synced epoch older
        // than the status's could register an epoch synced without it: found by the model
        // check, tests/it/model_check.rs). A decision whose status write then conflicts is
        // published all the same; it was made on the pods, which the conflict is not about.
        let decided = EpochStatus {
            deprecated: change.deprecated.or(state.status.deprecated),
            synced: change.synced.or(state.status.synced),
        };
        publish_status(shared, key, &state.uid, decided, state.bypass).await?;
    }
    let applied = |js: &JobSet| {
        let now = js.epoch_status(dialect);
        change.deprecated.is_none_or(|d| now.deprecated == Some(d))
            && change.synced.is_none_or(|s| now.synced == Some(s))
    };
    let Some(js) = patch_status(shared, key, &patch, field, applied).await? else {
        return Ok(false);
    };
    // A value written again (JobSet's own controller dropped the field meanwhile) is no move:
    // only what goes past this replica's earlier writes counts as progress (metrics, events).
    let progress = {
        let mut index = lock(&shared.index);
        let progress = StatusChange {
            deprecated: decision
                .change
                .deprecated
                .filter(|d| index.last_deprecated(key) < Some(*d)),
            synced: decision
                .change
                .synced
                .filter(|s| index.last_synced(key) < Some(*s)),
        };
        index.record_write(key, &js);
        if let Some(synced) = decision.change.synced {
            index.record_sync(key, synced, &decision.synced_pods);
        }
        if let Some(deprecated) = decision.change.deprecated {
            index.record_deprecated(key, deprecated);
        }
        progress
    };
    if !decision.unsynced_joiners.is_empty() {
        tracing::warn!(
            namespace = %key.namespace,
            jobset = %key.name,
            pods = ?decision.unsynced_joiners,
            "pods registered without seeing the synced epoch (another writer wiped the epoch fields): every pod restarts"
        );
    }
    if !progress.is_empty() {
        record_progress(shared, key, state, decision, progress);
    }
    Ok(true)
}

pub(super) async fn write_failed(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    reason: &str,
) -> Result<bool, ReconcileError> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    let message = format!("in-place restart gave up: {reason}");
    let mut conditions: Vec<Value> = state
        .conditions
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| c.get("type").and_then(Value::as_str) != Some("Failed"))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    conditions.push(json!({
        "type": "Failed",
        "status": "True",
        "reason": REACHED_MAX_RESTARTS,
        "message": message,
        "lastTransitionTime": now.to_string(),
    }));
    let patch = status_patch(
        &state.resource_version,
        json!({"conditions": conditions, "terminalState": "Failed"}),
    );
    let applied = |js: &JobSet| {
        js.conditions().iter().any(|c| {
            c.type_ == "Failed"
                && c.status == "True"
                && c.reason.as_deref() == Some(REACHED_MAX_RESTARTS)
        })
    };
    let Some(js) = patch_status(shared, key, &patch, "failed", applied).await? else {
        return Ok(false);
    };
    lock(&shared.index).record_write(key, &js);
    shared.metrics.failed_jobsets.inc();
    tracing::warn!(namespace = %key.namespace, jobset = %key.name, reason, "jobset failed: max restarts exceeded");
    emit(
        shared,
        key,
        state,
        EventType::Warning,
        "MaxRestartsExceeded",
        message,
    );
    Ok(true)
}

/// A merge patch on `status` that only applies to `resource_version`.
pub(super) fn status_patch(resource_version: &str, status: Value) -> Value {
    json!({"metadata": {"resourceVersion": resource_version}, "status": status})
}

/// Patches the status; `Ok(None)` on a 409 (the view was stale).
///
/// A write whose outcome is unknown (a 5xx, a timeout, a dropped connection: the API server
/// may have applied it and lost the answer) is checked with a fresh read: when `applied` holds
/// for it, the write counts as done, so that what follows a write (the group restart's start
/// time, metrics, events) is not lost with the answer. Otherwise the error is returned and the
/// key retried; its next decision starts from whatever the watch shows.
pub(super) async fn patch_status(
    shared: &Shared,
    key: &Key,
    patch: &Value,
    field: &'static str,
    applied: impl Fn(&JobSet) -> bool,
) -> Result<Option<JobSet>, ReconcileError> {
    let api = shared.api.jobsets_in(&key.namespace);
    let params = PatchParams::default();
    match shared
        .api
        .fenced(
            "status_write",
            api.patch_status(&key.name, &params, &Patch::Merge(patch)),
        )
        .await
    {
        Ok(js) => {
            shared.metrics.write(field, "ok");
            Ok(Some(js))
        }
        Err(Some(kube::Error::Api(status))) if status.code == 409 => {
            shared.metrics.write(field, "conflict");
            Ok(None)
        }
        Err(failure) => {
            let unknown = !matches!(&failure, Some(kube::Error::Api(s)) if s.code < 500);
            if unknown
                && let Ok(fresh) = shared
                    .api
                    .bounded("status_read", api.get_status(&key.name))
                    .await
                && applied(&fresh)
            {
                tracing::info!(namespace = %key.namespace, jobset = %key.name, field, error = ?failure, "the status write failed, but a fresh read shows it applied");
                shared.metrics.write(field, "ok");
                return Ok(Some(fresh));
            }
            match failure {
                Some(source) => {
                    shared.metrics.write(field, "error");
                    Err(write_error(key, source))
                }
                None => {
                    shared.metrics.write(field, "timeout");
                    Err(shared.api.timeout(key, "status_write"))
                }
            }
        }
    }
}

/// After a conflict: reads the JobSet's status again into the index.
pub(super) async fn reread_status(shared: &Shared, key: &Key) -> Result<(), ReconcileError> {
    let fresh = shared
        .api
        .bounded(
            "status_read",
            shared.api.jobsets_in(&key.namespace).get_status(&key.name),
        )
        .await
        .map_err(|e| match e {
            Some(source) => write_error(key, source),
            None => shared.api.timeout(key, "status_read"),
        })?;
    lock(&shared.index).record_write(key, &fresh);
    Ok(())
}
