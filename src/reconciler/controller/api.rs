//! The reconciler's API calls, in one place that the status writes, the publication, the
//! provisioner, the events and the group-restart deadline all import: every request bounded by
//! the request timeout ([`Calls::bounded`]), every write fenced by the leader's write deadline
//! ([`Calls::fenced`], [`crate::reconciler::fence`]), the errors a reconcile ends with
//! ([`ReconcileError`]) and the delay before its retry ([`retry_delay`]).
//!
//! Our own code rather than kube-runtime's `Controller`: its reconciler has no notion of a write
//! deadline shared with a lease, and its error policy cannot tell a fenced write from a timeout.

use std::time::{Duration, Instant};

use kube::api::Api;
use tokio::sync::watch;

use crate::jobset::JobSet;
use crate::reconciler::fence;
use crate::reconciler::key::Key;
use crate::reconciler::metrics::Metrics;
use crate::retry::CallError;

/// Status writes retried at once after a 409 before the key goes back to the queue.
pub(super) const CONFLICT_RETRIES: usize = 3;

/// Errors of one reconcile; the JobSet is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cannot write the status of JobSet {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("cannot publish the epochs of JobSet {namespace}/{name}: {source}")]
    Publish {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("JobSet {namespace}/{name} kept changing under {CONFLICT_RETRIES} status writes")]
    Conflicts { namespace: String, name: String },
    #[error("the API server did not answer a {call} of JobSet {namespace}/{name} within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        call: &'static str,
        after: Duration,
    },
    #[error("cannot {action} of JobSet {namespace}/{name} (group-restart deadline): {source}")]
    Deadline {
        namespace: String,
        name: String,
        action: String,
        source: kube::Error,
    },
    #[error(
        "cannot fail pod {pod} of JobSet {namespace}/{name} (its agent restarted without its workers): {source}"
    )]
    FailPod {
        namespace: String,
        name: String,
        pod: String,
        source: kube::Error,
    },
}

impl ReconcileError {
    /// The delay the API server asked for, if it throttled the write.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ReconcileError::Write { source, .. }
            | ReconcileError::Publish { source, .. }
            | ReconcileError::Deadline { source, .. }
            | ReconcileError::FailPod { source, .. } => crate::retry::retry_after(source),
            ReconcileError::Conflicts { .. } | ReconcileError::Timeout { .. } => None,
        }
    }
}

/// What every API call of the controller needs: the client, the request timeout, the leader's
/// write deadline, and the metrics that count timeouts and fenced writes.
pub(super) struct Calls {
    pub(super) client: kube::Client,
    request_timeout: Duration,
    /// Until when this replica may have a write in flight (the leader's fence, [`fence`]);
    /// `None`: no leader election.
    write_until: watch::Receiver<Option<Instant>>,
    metrics: Metrics,
}

impl Calls {
    pub(super) fn new(
        client: kube::Client,
        request_timeout: Duration,
        write_until: watch::Receiver<Option<Instant>>,
        metrics: Metrics,
    ) -> Calls {
        Calls {
            client,
            request_timeout,
            write_until,
            metrics,
        }
    }

    /// The JobSets of one namespace.
    pub(super) fn jobsets_in(&self, namespace: &str) -> Api<JobSet> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// One API call bounded by the request timeout; `Err(None)` when it timed out (counted in
    /// `api_timeouts_total{call}`).
    pub(super) async fn bounded<T>(
        &self,
        call: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Option<kube::Error>> {
        match crate::retry::bounded(self.request_timeout, request).await {
            Ok(v) => Ok(v),
            Err(CallError::Api(e)) => Err(Some(e)),
            Err(CallError::Timeout(_)) => {
                self.metrics.api_timeout(call);
                tracing::warn!(call, after = ?self.request_timeout, "an API request timed out");
                Err(None)
            }
        }
    }

    /// One write, sent only with a timeout that ends before this replica's write deadline
    /// ([`fence::write_budget`]: a write sent by a leader about to lose its lease cannot land
    /// after another replica took the lease over); not sent when too little is left. `Err(None)`
    /// when it timed out or was not sent (counted in `api_timeouts_total{call}` or
    /// `writes_fenced_total{call}`).
    pub(super) async fn fenced<T>(
        &self,
        call: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Option<kube::Error>> {
        let until = *self.write_until.borrow();
        let Some(budget) = fence::write_budget(Instant::now(), until, self.request_timeout) else {
            self.metrics.write_fenced(call);
            tracing::warn!(
                call,
                "a write not sent: the leader lease may pass to another replica before it could complete"
            );
            return Err(None);
        };
        match crate::retry::bounded(budget, request).await {
            Ok(v) => Ok(v),
            Err(CallError::Api(e)) => Err(Some(e)),
            Err(CallError::Timeout(_)) => {
                self.metrics.api_timeout(call);
                tracing::warn!(call, after = ?budget, "an API write timed out (or was cut at the leader's write deadline)");
                Err(None)
            }
        }
    }

    /// A call of `key` that timed out (or was fenced).
    pub(super) fn timeout(&self, key: &Key, call: &'static str) -> ReconcileError {
        ReconcileError::Timeout {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            call,
            after: self.request_timeout,
        }
    }
}

/// A status write or read of `key` the API server refused.
pub(super) fn write_error(key: &Key, source: kube::Error) -> ReconcileError {
    ReconcileError::Write {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        source,
    }
}

/// The delay before the retry after `failures` consecutive failures: 400 ms doubling to 10 s
/// ([`crate::retry::nth_delay`]), or what the API server asked for (`Retry-After`) stretched by
/// `1 + unit / 2` when longer ([`crate::retry::jittered_delay`]; `unit` is the random draw in
/// `0..1`, injected to keep this pure). The client has kube's retry layer off
/// ([`crate::retry::client_without_retries`]): a throttled write reaches this at once, and the
/// JobSets refused together by API Priority and Fairness do not come back in the same instant.
pub(super) fn retry_delay(failures: u32, server: Option<Duration>, unit: f64) -> Duration {
    let backoff = crate::retry::nth_delay(
        Duration::from_millis(400),
        Duration::from_secs(10),
        failures,
        None,
    );
    crate::retry::jittered_delay(backoff, server, unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_and_honour_retry_after() {
        let ms = Duration::from_millis;
        for unit in [0.0, 0.5, 1.0] {
            assert_eq!(retry_delay(1, None, unit), ms(400));
            assert_eq!(retry_delay(2, None, unit), ms(800));
            assert_eq!(retry_delay(40, None, unit), ms(10_000));
            assert_eq!(retry_delay(40, Some(ms(3_000)), unit), ms(10_000));
        }
        assert_eq!(retry_delay(1, Some(ms(3_000)), 0.0), ms(3_000));
        assert_eq!(retry_delay(1, Some(ms(3_000)), 1.0), ms(4_500));
        assert_eq!(retry_delay(1, Some(ms(3_000)), f64::NAN), ms(3_000));
    }

    /// JobSets refused together with the same `Retry-After` retry spread over half of it, not
    /// in one instant.
    #[test]
    fn throttled_retries_spread_over_half_the_servers_delay() {
        let server = Some(Duration::from_secs(2));
        let mut rng = fastrand::Rng::with_seed(7);
        let delays: Vec<Duration> = (0..1000)
            .map(|_| retry_delay(1, server, rng.f64()))
            .collect();
        let min = delays.iter().min().unwrap();
        let max = delays.iter().max().unwrap();
        assert!(*min >= Duration::from_secs(2), "{min:?}");
        assert!(*max <= Duration::from_secs(3), "{max:?}");
        assert!(
            *max - *min >= Duration::from_millis(900),
            "{min:?}..{max:?}"
        );
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 300, "{} distinct delays", distinct.len());
    }
}
