//! Publication of each InPlaceRestart JobSet's epochs in its `JobSetEpoch` object, which its
//! agents watch ([`crate::reconciler::publish`] keeps the objects as listed and the apply).
//!
//! Our own, as the status writes: a server-side apply per change, fenced by the lease, published
//! before the status write it announces, which no kube-runtime helper orders.

use std::sync::Arc;

use kube::api::Api;

use super::api::ReconcileError;
use super::state::{Shared, lock};
use crate::protocol::EpochStatus;
use crate::reconciler::key::Key;
use crate::reconciler::publish;
use crate::wire::epochs::{self, JobSetEpoch};

/// Writes a JobSet's `JobSetEpoch` object when its status's epochs moved past it (or it has
/// none): for every InPlaceRestart JobSet, and for a JobSet that no longer is one but has an
/// object (its agents must then stop waiting). Only once the watch of the objects has listed
/// them all, so that nothing is moved backwards. The epochs this replica decides are published
/// before they are written to the status ([`super::status`]); this catches up with everything
/// else (a new JobSet, a status written before, or by JobSet's own controller in observe mode,
/// where the object tells agents to watch the JobSet instead).
pub(super) async fn publish_epochs(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    if !publishing(shared) {
        return Ok(());
    }
    let (uid, status, bypass, in_place_restart) = {
        let index = lock(&shared.index);
        let Some(state) = index.jobset(key) else {
            return Ok(());
        };
        (
            state.uid.clone(),
            state.status,
            state.bypass,
            state.in_place_restart,
        )
    };
    if uid.is_empty() || (!in_place_restart && !shared.published.contains(key)) {
        return Ok(());
    }
    publish_status(shared, key, &uid, status, bypass).await
}

/// Epochs can be published now: on, the objects listed, the kind served.
pub(super) fn publishing(shared: &Shared) -> bool {
    shared.settings.publish_epochs
        && shared.published.is_synced()
        && !shared.published.is_unavailable()
}

/// Publishes `status` in a JobSet's `JobSetEpoch` ([`epochs::publish`]: monotone), if that
/// changes it.
pub(super) async fn publish_status(
    shared: &Arc<Shared>,
    key: &Key,
    uid: &str,
    status: EpochStatus,
    bypass: bool,
) -> Result<(), ReconcileError> {
    let source = epochs::Source {
        uid,
        status,
        bypass,
        delegate: !shared.settings.write_epoch_status,
    };
    let Some(content) = shared.published.next(key, &source) else {
        return Ok(());
    };
    let api: Api<JobSetEpoch> = Api::namespaced(shared.api.client.clone(), &key.namespace);
    let applied = publish::apply(&api, &shared.published, key, uid, &content);
    match shared.api.fenced("epochs_write", applied).await {
        Ok(()) => {
            shared.metrics.publication("ok");
            Ok(())
        }
        Err(Some(kube::Error::Api(status))) if status.code == 404 => {
            // The kind is not served (any more): publish nothing, write the status alone.
            shared.metrics.publication("error");
            shared.published.mark_unavailable();
            Ok(())
        }
        Err(Some(source)) => {
            shared.metrics.publication("error");
            Err(ReconcileError::Publish {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                source,
            })
        }
        Err(None) => {
            shared.metrics.publication("timeout");
            Err(shared.api.timeout(key, "epochs_write"))
        }
    }
}
