//! Lost nodes carried out (docs/protocol.md, "A node lost"; the decision is
//! [`crate::reconciler::nodes`], under the `--node-lost` mode): a watch of the cluster's Nodes
//! keeps each one's fence (deleted, or out of service) and silence (on this replica's clock), and
//! queues every active JobSet when a node becomes lost (a timer wakes it when the grace of a
//! silent node runs out, in `force-after-grace`); for each JobSet, the pods bound to a lost node
//! are marked `Failed` and deleted (UID precondition; the API server deletes a `Failed` pod at
//! once, with no kubelet to wait for) so that their Jobs replace them, with a Warning event
//! `NodeLost` on the JobSet naming the pod and the node, and a count in `pods_node_lost_total`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{Event, watcher};

use super::api::ReconcileError;
use super::deadline::fail_and_delete;
use super::report::{CONTROLLER_NAME, emit_related, pod_reference};
use super::settings::watch_config;
use super::state::{Shared, lock};
use crate::deadline::PodRef;
use crate::reconciler::key::Key;
use crate::reconciler::nodes::{OUT_OF_SERVICE_TAINT, lost_pods, read_node};
use crate::reconciler::queue::Reason;
use crate::retry::WatchBackoff;
use crate::wire::WatchedPod;

/// The event's reason.
pub const NODE_LOST: &str = "NodeLost";

/// Follows the Nodes (unless `--node-lost off`); queues every active JobSet when the set of lost
/// nodes grows.
pub(super) async fn watch_nodes(shared: Arc<Shared>) {
    let policy = shared.settings.node_lost;
    if !policy.watches() {
        return;
    }
    tracing::info!(mode = %policy.describe(), "following the Nodes for lost ones");
    let api: Api<Node> = Api::all(shared.api.client.clone());
    let stream = watcher(api, watch_config(&shared.settings)).backoff(WatchBackoff::new());
    futures::pin_mut!(stream);
    let mut relist: Option<BTreeSet<String>> = None;
    let mut lost_before = BTreeSet::new();
    loop {
        let wait = lock(&shared.node_health).next_due(Instant::now(), policy);
        let event = match wait {
            Some(wait) => tokio::select! {
                event = stream.next() => event,
                () = tokio::time::sleep(wait) => None,
            },
            None => stream.next().await,
        };
        let now = Instant::now();
        {
            let mut health = lock(&shared.node_health);
            match event {
                Some(Ok(Event::Init)) => relist = Some(BTreeSet::new()),
                Some(Ok(Event::InitApply(node) | Event::Apply(node))) => {
                    if let Some(name) = &node.metadata.name {
                        if let Some(seen) = relist.as_mut() {
                            seen.insert(name.clone());
                        }
                        health.observe(name, read_node(&node), now);
                    }
                }
                Some(Ok(Event::Delete(node))) => {
                    if let Some(name) = &node.metadata.name {
                        health.delete(name, now);
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    if let Some(seen) = relist.take() {
                        health.retain(&seen, now);
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "node watch failed; retrying"),
                // The timer: a silent node's grace ran out.
                None => {}
            }
        }
        let lost = {
            let mut health = lock(&shared.node_health);
            health.prune(now);
            health.lost(now, policy)
        };
        let new: Vec<&String> = lost.difference(&lost_before).collect();
        if !new.is_empty() {
            tracing::warn!(nodes = ?new, mode = %policy.describe(), "node(s) lost (deleted, out of service, or silent past the grace); their JobSet pods are failed and deleted");
            let keys = lock(&shared.index).active_keys();
            for key in keys {
                shared.queue.add(key, Reason::Node);
            }
        }
        lost_before = lost;
    }
}

/// Fails and deletes the pods of `key` bound to a lost node, one after the other.
pub(super) async fn fail_pods(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    let policy = shared.settings.node_lost;
    let lost = lock(&shared.node_health).lost(Instant::now(), policy);
    if lost.is_empty() {
        return Ok(());
    }
    let (state, pods) = {
        let index = lock(&shared.index);
        let Some((state, pods)) = index.get(key) else {
            return Ok(());
        };
        if !state.active {
            return Ok(());
        }
        (state.clone(), lost_pods(pods, &lost))
    };
    let api: Api<WatchedPod> = Api::namespaced(shared.api.client.clone(), &key.namespace);
    for pod in pods {
        let node = pod.node.as_str();
        let why = match policy.grace() {
            Some(grace) => format!(
                "deleted, tainted {OUT_OF_SERVICE_TAINT}, or its Ready condition Unknown for \
                 longer than {}s",
                grace.as_secs()
            ),
            None => format!("deleted, or tainted {OUT_OF_SERVICE_TAINT}"),
        };
        let message = format!(
            "node {node} is lost ({why}): failed and deleted by {CONTROLLER_NAME} so that its \
             Job replaces it on another node"
        );
        let target = PodRef {
            name: pod.pod.clone(),
            uid: pod.uid.clone(),
        };
        match fail_and_delete(shared, &api, &target, None, (NODE_LOST, &message)).await {
            Ok(false) => {}
            Ok(true) => {
                shared.metrics.pods_node_lost.inc();
                tracing::warn!(namespace = %key.namespace, jobset = %key.name, pod = %pod.pod, node, "node lost; pod failed and deleted");
                let related = pod_reference(&key.namespace, &pod.pod, &pod.uid);
                emit_related(
                    shared,
                    key,
                    &state,
                    EventType::Warning,
                    NODE_LOST,
                    format!("pod {}: {message}", pod.pod),
                    Some(related),
                );
            }
            Err(e) => {
                return Err(match e {
                    Some(source) => ReconcileError::FailPod {
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                        pod: pod.pod.clone(),
                        source,
                    },
                    None => shared.api.timeout(key, "pod_delete"),
                });
            }
        }
    }
    Ok(())
}
