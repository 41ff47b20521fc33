//! Reporting: events on the JobSet (a bounded queue, [`EVENT_QUEUE`], published by one task),
//! what follows a move of the epoch fields ([`record_progress`]: metrics, events, log lines),
//! observe mode ([`observe`]), and the JobSets that are malformed or cannot be served, each said
//! once.
//!
//! kube-runtime's event [`Recorder`] does the publishing; the queue is ours so that a slow
//! events API never holds a worker.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use super::state::Shared;
use crate::jobset;
use crate::protocol::{Epoch, ReconcileDecision, StatusChange};
use crate::reconciler::index::JobSetState;
use crate::reconciler::key::Key;

/// Event reporter name.
pub const CONTROLLER_NAME: &str = "jobset-inplace-reconciler";

/// Events waiting to be published; past this, new events are dropped (and logged).
pub(super) const EVENT_QUEUE: usize = 1024;

/// Says once per reason, as a Warning event, that a JobSet cannot be served (and so gets no
/// status write).
pub(super) fn report_unservable(shared: &Shared, key: &Key, state: &JobSetState, reason: &str) {
    let first = shared.with_entry(key, |e| {
        e.unservable.replace(reason.to_owned()).as_deref() != Some(reason)
    });
    if first {
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, reason, "the epoch protocol cannot serve this JobSet; writing nothing for it");
        emit(
            shared,
            key,
            state,
            EventType::Warning,
            "InPlaceRestartNotServable",
            format!("{reason}; no epoch is written for this JobSet"),
        );
    }
}

/// Reports each malformed annotation once, as a Warning event. Only those still there are
/// remembered: a pod whose annotation is fixed (or that is gone) is forgotten, and reported
/// again should it break again.
pub(super) fn report_malformed(
    shared: &Shared,
    key: &Key,
    state: &JobSetState,
    decision: &ReconcileDecision,
) {
    if decision.malformed.is_empty() && !shared.with_entry(key, |e| !e.reported.is_empty()) {
        return;
    }
    let current: HashSet<(String, String)> = decision
        .malformed
        .iter()
        .map(|m| (m.pod.clone(), m.error.value.clone()))
        .collect();
    let seen = shared.with_entry(key, |e| std::mem::replace(&mut e.reported, current));
    for m in &decision.malformed {
        let first = !seen.contains(&(m.pod.clone(), m.error.value.clone()));
        if first {
            tracing::warn!(namespace = %key.namespace, jobset = %key.name, pod = %m.pod, error = %m.error, "malformed epoch annotation ignored");
            emit(
                shared,
                key,
                state,
                EventType::Warning,
                "MalformedEpoch",
                format!(
                    "pod {}: {}; the pod is not counted until its agent registers again",
                    m.pod, m.error
                ),
            );
        }
    }
}

/// Reports once, as a Warning event, each pod labelled with the JobSet's name that is not one of
/// its pods ([`crate::reconciler::membership`]): it is not counted. As for malformed
/// annotations, only those still there are remembered.
pub(super) fn report_strangers(shared: &Shared, key: &Key, state: &JobSetState) {
    let strangers = shared.index_strangers(key);
    if strangers.is_empty() && !shared.with_entry(key, |e| !e.strangers.is_empty()) {
        return;
    }
    let current: HashSet<(String, String)> = strangers
        .iter()
        .map(|(pod, _, why)| (pod.clone(), why.to_string()))
        .collect();
    let seen = shared.with_entry(key, |e| std::mem::replace(&mut e.strangers, current));
    for (pod, uid, why) in &strangers {
        let why = why.to_string();
        if seen.contains(&(pod.clone(), why.clone())) {
            continue;
        }
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, pod = %pod, reason = %why, "a pod labelled with this JobSet's name is not one of its pods; not counted");
        // One series per pod: the recorder's key leaves the note out.
        let related = pod_reference(&key.namespace, pod, uid);
        emit_related(
            shared,
            key,
            state,
            EventType::Warning,
            "PodNotOfJobSet",
            format!("pod {pod} is labelled with this JobSet's name but {why}; it is not counted"),
            Some(related),
        );
    }
}

/// Observe mode: the epoch fields JobSet's own controller moved since last seen are recorded as
/// if written here (metrics, events); nothing is written.
pub(super) fn observe(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    decision: &ReconcileDecision,
) {
    let now = state.status;
    let before = shared.with_entry(key, |e| e.observed.replace(now));
    let Some(before) = before else {
        // First sight: the current values are where things stand, not a move.
        return;
    };
    let moved = |new: Option<Epoch>, old: Option<Epoch>| match (new, old) {
        (Some(n), Some(o)) if n > o => Some(n),
        (Some(n), None) => Some(n),
        _ => None,
    };
    let change = StatusChange {
        deprecated: moved(now.deprecated, before.deprecated),
        synced: moved(now.synced, before.synced),
    };
    if !change.is_empty() {
        record_progress(shared, key, state, decision, change);
    }
}

/// What follows a move of the epoch fields (written by this replica, or, when it leaves them to
/// JobSet's own controller, observed): the group restart metrics, events and log lines.
pub(super) fn record_progress(
    shared: &Arc<Shared>,
    key: &Key,
    state: &JobSetState,
    decision: &ReconcileDecision,
    change: StatusChange,
) {
    if let Some(deprecated) = change.deprecated {
        shared.metrics.group_restarts.inc();
        shared.metrics.deprecated(key, i64::from(deprecated));
        shared.with_entry(key, |e| {
            e.restart_began = Some((deprecated, Instant::now()))
        });
        // What started it: a pod's kubelet seen restarting it (early failure detection), or a
        // pod registered above the deprecated epoch.
        let trigger = match &decision.early {
            Some(pod) => {
                shared.metrics.early_group_restarts.inc();
                format!(" (pod {pod} is restarting)")
            }
            None => String::new(),
        };
        tracing::info!(namespace = %key.namespace, jobset = %key.name, epoch = deprecated, pods = decision.pods_to_restart, early = decision.early.as_deref(), "group restart started");
        emit(
            shared,
            key,
            state,
            EventType::Normal,
            "GroupRestartStarted",
            format!(
                "epoch {deprecated} deprecated{trigger}: {} of {} registered pods restart in place",
                decision.pods_to_restart, decision.registered
            ),
        );
    }
    if let Some(synced) = change.synced {
        let began = shared.with_entry(key, |e| e.restart_began.take());
        match began {
            Some((deprecated, at)) if deprecated < synced => {
                let took = at.elapsed();
                shared
                    .metrics
                    .group_restart_duration
                    .observe(took.as_secs_f64());
                tracing::info!(namespace = %key.namespace, jobset = %key.name, epoch = synced, seconds = took.as_secs_f64(), "group restart completed");
                emit(
                    shared,
                    key,
                    state,
                    EventType::Normal,
                    "GroupRestartCompleted",
                    format!(
                        "epoch {synced} synced: all {} pods restarted in place in {:.1} s",
                        decision.registered,
                        took.as_secs_f64()
                    ),
                );
            }
            _ => {
                tracing::info!(namespace = %key.namespace, jobset = %key.name, epoch = synced, "epoch synced");
                emit(
                    shared,
                    key,
                    state,
                    EventType::Normal,
                    "EpochSynced",
                    format!(
                        "epoch {synced} synced: all {} pods registered",
                        decision.registered
                    ),
                );
            }
        }
    }
}

/// Queues an event on the JobSet; dropped (and logged) when the queue is full.
pub(super) fn emit(
    shared: &Shared,
    key: &Key,
    state: &JobSetState,
    type_: EventType,
    reason: &str,
    note: String,
) {
    emit_related(shared, key, state, type_, reason, note, None);
}

/// A pod as the related object of an event ([`emit_related`]); an empty UID is left out.
pub(super) fn pod_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: Some(uid.to_owned()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    }
}

/// [`emit`] with a related object (`related`): the events of one reason on one JobSet are one
/// series per related object (the recorder's key), so that each pod's event is kept.
pub(super) fn emit_related(
    shared: &Shared,
    key: &Key,
    state: &JobSetState,
    type_: EventType,
    reason: &str,
    note: String,
    related: Option<ObjectReference>,
) {
    let reference = ObjectReference {
        api_version: Some(jobset::API_VERSION.to_owned()),
        kind: Some(jobset::KIND.to_owned()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid: Some(state.uid.clone()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    };
    let event = KubeEvent {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: related,
    };
    if shared.events.try_send((reference, event)).is_err() {
        tracing::warn!(namespace = %key.namespace, jobset = %key.name, reason, "event queue full; event dropped");
    }
}

pub(super) async fn publish_events(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<(ObjectReference, KubeEvent)>,
) {
    let recorder = Recorder::new(
        shared.api.client.clone(),
        Reporter {
            controller: CONTROLLER_NAME.to_owned(),
            instance: Some(shared.settings.identity.clone()),
        },
    );
    while let Some((reference, event)) = rx.recv().await {
        if let Err(e) = shared
            .api
            .fenced("event", recorder.publish(&event, &reference))
            .await
        {
            tracing::warn!(error = ?e, reason = %event.reason, "cannot publish event");
        }
    }
}
