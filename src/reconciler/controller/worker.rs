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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;
    use tokio::sync::{mpsc, watch};
    use tokio::time::Instant;

    use super::*;
    use crate::protocol::Dialect;
    use crate::reconciler::controller::settings::Settings;
    use crate::reconciler::metrics::{Metrics, ReasonLabels};
    use crate::reconciler::queue::Reasons;

    /// The controller's shared state with a client that is never called (nothing here sends a
    /// request: the JobSets queued are in no index), leading while the sender lives.
    fn shared(debounce: Duration) -> (Arc<Shared>, watch::Sender<bool>) {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let settings = Settings {
            dialect: Dialect::Epoch,
            namespace: None,
            workers: 1,
            debounce,
            identity: "test".to_owned(),
            provision: None,
            request_timeout: Duration::from_secs(10),
            watch_timeout: Duration::from_secs(60),
            write_epoch_status: true,
            publish_epochs: false,
            group_restart_timeout: None,
            node_lost: crate::reconciler::nodes::NodeLost::Off,
        };
        let metrics = Metrics::register(&mut Registry::default());
        let (leads, leader) = watch::channel(true);
        let (_, write_until) = watch::channel(None);
        let (events, _) = mpsc::channel(1);
        let shared = Shared::new(client, settings, metrics, leader, write_until, events);
        (Arc::new(shared), leads)
    }

    /// Lets the worker run what is ready, without moving the clock.
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    fn passes_for(shared: &Shared, reason: Reason) -> u64 {
        shared
            .metrics
            .reconcile_reasons
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .get()
    }

    /// On a paused clock: a JobSet waits the debounce once, and the triggers of a burst meanwhile
    /// make one pass, counted under each of their reasons.
    #[tokio::test(start_paused = true)]
    async fn the_debounce_gathers_a_burst_into_one_pass_with_all_its_reasons() {
        let ms = Duration::from_millis;
        let (shared, _leads) = shared(ms(500));
        let worker = tokio::spawn(work(shared.clone()));
        let key = Key::new("ns", "js");
        shared.queue.add(key.clone(), Reason::Pod);
        settle().await; // the worker takes it, and debounces
        tokio::time::advance(ms(200)).await;
        shared.queue.add(key.clone(), Reason::JobSet);
        shared.queue.add(key.clone(), Reason::Pod);
        tokio::time::advance(ms(299)).await;
        settle().await;
        assert_eq!(passes_for(&shared, Reason::Pod), 0, "still debouncing");
        tokio::time::advance(ms(1)).await;
        settle().await;
        assert_eq!(passes_for(&shared, Reason::Pod), 1);
        assert_eq!(passes_for(&shared, Reason::JobSet), 1);
        assert_eq!(shared.queue.len(), 0);
        // Nothing more: no second pass.
        tokio::time::sleep(ms(10_000)).await;
        assert_eq!(passes_for(&shared, Reason::Pod), 1);
        assert_eq!(passes_for(&shared, Reason::Retry), 0);
        worker.abort();
    }

    /// On a paused clock: a failed JobSet comes back once after its backoff (400 ms at the first
    /// failure), for a `retry`; a failure meanwhile is counted but schedules no second retry.
    #[tokio::test(start_paused = true)]
    async fn a_failed_jobset_comes_back_once_after_its_backoff() {
        let (shared, _leads) = shared(Duration::ZERO);
        let key = Key::new("ns", "js");
        let t0 = Instant::now();
        retry_later(&shared, key.clone(), None);
        retry_later(&shared, key.clone(), None);
        assert_eq!(shared.queue.len(), 0, "not before its backoff");
        assert_eq!(shared.queue.next().await, key);
        assert_eq!(t0.elapsed(), Duration::from_millis(400));
        assert_eq!(shared.queue.start(&key), Reasons::from(Reason::Retry));
        shared.queue.done(&key);
        assert_eq!(
            shared.with_entry(&key, |e| (e.retry.failures, e.retry.pending)),
            (2, false)
        );
        // The third failure in a row: 400 ms doubled twice.
        let t1 = Instant::now();
        retry_later(&shared, key.clone(), None);
        assert_eq!(shared.queue.next().await, key);
        assert_eq!(t1.elapsed(), Duration::from_millis(1_600));
    }

    /// The API server's `Retry-After` wins over a shorter backoff, stretched by at most half.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_is_waited_stretched_by_at_most_half() {
        let (shared, _leads) = shared(Duration::ZERO);
        let key = Key::new("ns", "js");
        let t0 = Instant::now();
        retry_later(&shared, key.clone(), Some(Duration::from_secs(3)));
        assert_eq!(shared.queue.next().await, key);
        let waited = t0.elapsed();
        assert!(
            (Duration::from_secs(3)..=Duration::from_millis(4_500)).contains(&waited),
            "{waited:?}"
        );
    }
}
