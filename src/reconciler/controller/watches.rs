//! The watches that feed the index, the work queue and the provisioner: JobSets, their pods,
//! their Jobs (metadata only: which pods count toward a JobSet), the published `JobSetEpoch`
//! objects, the labelled namespaces; and the leadership follower,
//! which queues every active JobSet when this replica gains the lease.
//!
//! kube-runtime's `watcher` streams with our own pause ([`WatchBackoff`], at most 5 s, where
//! kube's default grows to 30 s over isolated failures), and our own [`Index`] rather than a
//! `reflector` store: the decision needs JobSets and pods joined and relists seen as a whole.
//!
//! [`Index`]: crate::reconciler::index::Index

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{Event, watcher};

use super::settings::watch_config;
use super::state::{Shared, lock};
use crate::jobset::JobSet;
use crate::protocol::JOBSET_NAME_LABEL;
use crate::reconciler::key::Key;
use crate::reconciler::provision;
use crate::reconciler::publish;
use crate::reconciler::queue::Reason;
use crate::retry::WatchBackoff;
use crate::wire::WatchedPod;
use crate::wire::epochs::JobSetEpoch;

fn jobset_api(shared: &Shared) -> Api<JobSet> {
    match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.api.client.clone(), ns),
        None => Api::all(shared.api.client.clone()),
    }
}

pub(super) async fn watch_jobsets(shared: Arc<Shared>) {
    let stream =
        watcher(jobset_api(&shared), watch_config(&shared.settings)).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        let mut reason = Reason::JobSet;
        {
            let mut index = lock(&shared.index);
            match event {
                Ok(Event::Init) => index.jobsets_relisting(),
                Ok(Event::InitApply(js) | Event::Apply(js)) => {
                    if let Some(key) = index.apply_jobset(&js) {
                        // Every replica keeps the deadline's clock, so that a standby taking
                        // over knows when the group restart began.
                        if let Some(state) = index.jobset(&key) {
                            shared.observe_deadline(&key, state);
                        }
                        changed.push(key);
                    }
                }
                Ok(Event::Delete(js)) => {
                    if let (Some(ns), Some(name)) = (&js.metadata.namespace, &js.metadata.name) {
                        index.delete_jobset(ns, name);
                        gone.push(Key::new(ns, name));
                    }
                }
                Ok(Event::InitDone) => {
                    gone = index.jobsets_relisted();
                    shared.jobsets_synced.store(true, Ordering::Release);
                    changed.extend(index.active_keys());
                    reason = Reason::Resync;
                }
                Err(e) => tracing::warn!(error = %e, "jobset watch failed; retrying"),
            }
            shared
                .metrics
                .jobsets_tracked
                .set(index.jobset_count() as i64);
        }
        if !changed.is_empty() || !gone.is_empty() {
            // A new namespace may need the agent's account, or an old one no longer.
            shared.provision_wake.notify_one();
        }
        for key in &gone {
            shared.forget(key);
        }
        for key in changed {
            shared.queue.add(key, reason);
        }
    }
}

pub(super) async fn watch_pods(shared: Arc<Shared>) {
    let api: Api<WatchedPod> = match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.api.client.clone(), ns),
        None => Api::all(shared.api.client.clone()),
    };
    let config = watch_config(&shared.settings).labels(JOBSET_NAME_LABEL);
    let stream = watcher(api, config).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let mut changed = Vec::new();
        let mut reason = Reason::Pod;
        {
            let mut index = lock(&shared.index);
            match event {
                Ok(Event::Init) => index.pods_relisting(),
                Ok(Event::InitApply(pod) | Event::Apply(pod)) => {
                    changed.extend(index.apply_pod(&pod));
                }
                Ok(Event::Delete(pod)) => {
                    if let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) {
                        changed.extend(index.delete_pod(ns, name));
                    }
                    // The last pod of a namespace may free its role binding.
                    shared.provision_wake.notify_one();
                }
                Ok(Event::InitDone) => {
                    changed.extend(index.pods_relisted());
                    // Nothing was decided during the list (see `decide`): decide now.
                    changed.extend(index.active_keys());
                    shared.pods_synced.store(true, Ordering::Release);
                    reason = Reason::Resync;
                }
                Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
            }
            shared.metrics.pods_tracked.set(index.pod_count() as i64);
        }
        for key in changed {
            shared.queue.add(key, reason);
        }
    }
}

/// Follows the Jobs of JobSets (by their jobset-name label, metadata only: a pod counts toward a
/// JobSet only when one of its Jobs controls it, [`crate::reconciler::membership`]). A Job that
/// arrives after its pods makes them count: its JobSet is queued.
pub(super) async fn watch_jobs(shared: Arc<Shared>) {
    type JobMeta = kube::core::PartialObjectMeta<k8s_openapi::api::batch::v1::Job>;
    let api: Api<JobMeta> = match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.api.client.clone(), ns),
        None => Api::all(shared.api.client.clone()),
    };
    let config = watch_config(&shared.settings).labels(JOBSET_NAME_LABEL);
    let stream = watcher(api, config).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let mut changed = Vec::new();
        let mut reason = Reason::Job;
        {
            let mut index = lock(&shared.index);
            match event {
                Ok(Event::Init) => index.jobs_relisting(),
                Ok(Event::InitApply(job) | Event::Apply(job)) => {
                    changed.extend(index.apply_job(&job.metadata));
                }
                Ok(Event::Delete(job)) => {
                    if let (Some(ns), Some(name)) = (&job.metadata.namespace, &job.metadata.name) {
                        changed.extend(index.delete_job(ns, name));
                    }
                }
                Ok(Event::InitDone) => {
                    changed.extend(index.jobs_relisted());
                    // Nothing was decided during the list (see `decide`): decide now.
                    changed.extend(index.active_keys());
                    shared.jobs_synced.store(true, Ordering::Release);
                    reason = Reason::Resync;
                }
                Err(e) => tracing::warn!(error = %e, "job watch failed; retrying"),
            }
        }
        for key in changed {
            shared.queue.add(key, reason);
        }
    }
}

/// Follows the published JobSetEpoch objects ([`publish::watch`]).
pub(super) async fn watch_published(shared: Arc<Shared>) {
    let api: Api<JobSetEpoch> = match &shared.settings.namespace {
        Some(ns) => Api::namespaced(shared.api.client.clone(), ns),
        None => Api::all(shared.api.client.clone()),
    };
    let config = watch_config(&shared.settings);
    let synced = || {
        // JobSets evaluated before the list could not publish: evaluate them again.
        let keys = lock(&shared.index).in_place_restart_keys();
        for key in keys {
            shared.queue.add(key, Reason::Resync);
        }
    };
    publish::watch(
        api,
        config,
        &shared.published,
        |key| shared.queue.add(key, Reason::JobSetEpoch),
        synced,
    )
    .await;
}

/// Follows the namespaces labelled `jobset-inplace.dev/enabled=true`.
pub(super) async fn watch_namespaces(shared: Arc<Shared>) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(shared.api.client.clone());
    let config =
        watch_config(&shared.settings).labels(&format!("{}=true", provision::ENABLED_LABEL));
    let stream = watcher(api, config).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    let mut relist: Option<std::collections::BTreeSet<String>> = None;
    while let Some(event) = stream.next().await {
        let mut enabled = lock(&shared.enabled_namespaces);
        match event {
            Ok(Event::Init) => relist = Some(std::collections::BTreeSet::new()),
            Ok(Event::InitApply(ns)) => {
                if let (Some(seen), Some(name)) = (relist.as_mut(), ns.metadata.name) {
                    seen.insert(name);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = relist.take() {
                    *enabled = seen;
                }
            }
            Ok(Event::Apply(ns)) => {
                enabled.extend(ns.metadata.name);
            }
            Ok(Event::Delete(ns)) => {
                if let Some(name) = ns.metadata.name {
                    enabled.remove(&name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "namespace watch failed; retrying"),
        }
        drop(enabled);
        shared.provision_wake.notify_one();
    }
}

/// On gaining the lease, every active JobSet is evaluated: the previous leader may have left
/// work undone.
pub(super) async fn follow_leadership(shared: Arc<Shared>) {
    let mut leader = shared.leader.clone();
    loop {
        let is_leader = *leader.borrow_and_update();
        shared.metrics.is_leader.set(i64::from(is_leader));
        if is_leader {
            let keys = lock(&shared.index).active_keys();
            for key in keys {
                shared.queue.add(key, Reason::Leadership);
            }
        }
        if leader.changed().await.is_err() {
            return;
        }
    }
}
