//! Pods whose agent restarted without their workers (docs/protocol.md, "A node without the
//! feature"): a kubelet without `RestartAllContainersOnContainerExits` ignores the
//! `RestartAllContainers` rules, so an agent that exits with its restart code restarts alone
//! (`restartPolicy: Always`) and its workers run on from the epoch before. The decision
//! ([`crate::protocol::old_workers`], [`crate::protocol::reconcile_decide`]) names them and
//! writes no synced epoch while one is there; this room fails them: each pod marked `Failed` and
//! deleted (its UID as the precondition, as the deadline's first step does), so that its Job
//! replaces it, a Warning event on the JobSet naming the pod and its node, and a count in
//! `agents_restarted_alone_total`.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::events::EventType;

use super::api::ReconcileError;
use super::deadline::fail_and_delete;
use super::report::{CONTROLLER_NAME, emit_related, pod_reference};
use super::state::{Shared, lock};
use crate::deadline::PodRef;
use crate::protocol::AloneAgent;
use crate::reconciler::key::Key;
use crate::wire::WatchedPod;

/// The event's reason.
pub const RESTARTED_WITHOUT_WORKERS: &str = "RestartedWithoutWorkers";

/// Fails and deletes each pod, one after the other (a node without the gate fails a few pods
/// per group restart, each request bounded by the request timeout).
pub(super) async fn fail_pods(
    shared: &Arc<Shared>,
    key: &Key,
    pods: &[AloneAgent],
) -> Result<(), ReconcileError> {
    if pods.is_empty() || !shared.settings.write_epoch_status {
        return Ok(());
    }
    let Some(state) = lock(&shared.index).jobset(key).cloned() else {
        return Ok(());
    };
    let api: Api<WatchedPod> = Api::namespaced(shared.api.client.clone(), &key.namespace);
    for pod in pods {
        let node = if pod.node.is_empty() {
            "its node"
        } else {
            pod.node.as_str()
        };
        let message = format!(
            "its agent restarted without its workers, which still run from an earlier epoch: the \
             kubelet of node {node} does not apply RestartAllContainers rules (feature gate \
             RestartAllContainersOnContainerExits off); failed and deleted by {CONTROLLER_NAME} \
             so that its Job replaces it"
        );
        let target = PodRef {
            name: pod.pod.clone(),
            uid: pod.uid.clone(),
        };
        // No resourceVersion precondition: whatever the kubelet writes since, the workers that
        // outlived the agent are there until the pod goes.
        match fail_and_delete(
            shared,
            &api,
            &target,
            None,
            (RESTARTED_WITHOUT_WORKERS, &message),
        )
        .await
        {
            Ok(false) => {}
            Ok(true) => {
                shared.metrics.agents_restarted_alone.inc();
                tracing::warn!(namespace = %key.namespace, jobset = %key.name, pod = %pod.pod, node, "agent restarted without its workers (kubelet without RestartAllContainersOnContainerExits); pod failed and deleted");
                let related = pod_reference(&key.namespace, &pod.pod, &pod.uid);
                emit_related(
                    shared,
                    key,
                    &state,
                    EventType::Warning,
                    RESTARTED_WITHOUT_WORKERS,
                    format!(
                        "pod {} on node {node}: {message}; no synced epoch is written while such \
                         a pod runs",
                        pod.pod
                    ),
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
