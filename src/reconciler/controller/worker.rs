//! The workers: each takes a JobSet from the work queue ([`crate::reconciler::queue`]) while
//! this replica leads, evaluates it ([`reconcile`]: epochs, publication, deadline), and on failure
//! queues it again after a backoff, at most one retry pending per JobSet. Each pass counts why
//! it runs (`reconcile_reasons_total{reason}`) and runs in a `reconcile` span that names them,
//! so every line it logs says what triggered it.
//!
//! Our own loop rather than kube-runtime's `Controller`: writes happen only on the leader and
//! stop at its write deadline, the debounce coalesces a burst of pod events, and the deadline's
//! steps run off the workers.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::api::{ReconcileError, retry_delay};
use super::state::Shared;
use super::{alone, deadline, lost, publication, status};
use crate::reconciler::key::Key;
use crate::reconciler::queue::Reason;

pub(super) async fn work(shared: Arc<Shared>) {
    loop {
        let mut leader = shared.leader.clone();
        if leader.wait_for(|l| *l).await.is_err() {
            return;
        }
        let key = shared.queue.next().await;
        if !shared.settings.debounce.is_zero() {
            tokio::time::sleep(shared.settings.debounce).await;
        }
        let reasons = shared.queue.start(&key);
        for reason in reasons.iter() {
            shared.metrics.count_reason(reason);
        }
        // At WARN, so that the span (and its reasons) is on every line the pass logs at any
        // level the log filter keeps, its warnings included.
        let span = tracing::warn_span!("reconcile", %reasons);
        let result = async {
            tracing::debug!(namespace = %key.namespace, jobset = %key.name, "evaluating");
            let result = reconcile(&shared, &key).await;
            if let Err(e) = &result {
                tracing::warn!(namespace = %key.namespace, jobset = %key.name, error = %e, "reconcile failed; retrying");
            }
            result
        }
        .instrument(span)
        .await;
        shared.queue.done(&key);
        match result {
            Ok(()) => {
                shared.with_entry(&key, |e| e.retry = Default::default());
            }
            Err(e) => retry_later(&shared, key, e.retry_after()),
        }
    }
}

/// Requeues a key after a backoff ([`retry_delay`]). At most one retry is pending per key: a
/// key that fails again meanwhile (evaluated for a watch event) only counts the failure.
fn retry_later(shared: &Arc<Shared>, key: Key, server: Option<Duration>) {
    let delay = shared.with_entry(&key, |e| {
        e.retry.failures = e.retry.failures.saturating_add(1);
        if e.retry.pending {
            return None;
        }
        e.retry.pending = true;
        Some(retry_delay(e.retry.failures, server, fastrand::f64()))
    });
    let Some(delay) = delay else {
        return;
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        shared.with_entry(&key, |e| e.retry.pending = false);
        shared.queue.add(key, Reason::Retry);
    });
}

/// Evaluates one JobSet, writes what changed, publishes its epochs for its agents, fails the pods
/// whose agent restarted without their workers, then runs its group-restart deadline.
async fn reconcile(shared: &Arc<Shared>, key: &Key) -> Result<(), ReconcileError> {
    let restarted_alone = status::reconcile_epochs(shared, key).await?;
    publication::publish_epochs(shared, key).await?;
    alone::fail_pods(shared, key, &restarted_alone).await?;
    lost::fail_pods(shared, key).await?;
    deadline::reconcile(shared, key).await
}
