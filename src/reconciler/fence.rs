//! The leader's fence: a leader writes only while it knows its lease is renewed, and stops
//! before any other replica could take the lease over.
//!
//! The lease manager renews the lease and retries failed renewals, but it never says "no
//! longer leader" while it keeps failing: a leader cut off from the lease (its renewals
//! unanswered) would go on writing after another replica acquired it. The fence reads the
//! lease itself and keeps a deadline, `renewTime + duration - margin` on this replica's own
//! clock (the renewals carry this replica's clock too): another replica can acquire the lease
//! only once `duration` has passed since the last renewal, so a leader that stops at the
//! deadline has stopped before then. [`write_deadline`] is pure; [`watch`] reads the lease.
//!
//! Stopping at the deadline is not enough for a write already sent: a request may take up to the
//! request timeout (10 s), far past the margin (a quarter of the grace, 1.25 s). Every write is
//! therefore sent with a timeout of its own, [`write_budget`]: the request timeout, or what is
//! left until the deadline when that is shorter, and none at all (the write is not sent) when
//! less than [`MIN_WRITE_BUDGET`] is left. A write the client gives up on is abandoned with its
//! connection, which cancels it on the API server unless it was already being committed; the
//! margin is what covers that (issue 21, item 7). The writes whose order matters are also fenced
//! by the API server itself: status writes by `resourceVersion`, a pod's `Failed` mark by its
//! `resourceVersion`, the published epochs by the JobSetEpoch CRD's rule that they only grow.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;

/// What the last read of the lease said about this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Not read yet, or the reads fail: keep the deadline known so far.
    Unknown,
    /// This replica holds the lease, renewed so that it may write until then.
    HeldUntil(Instant),
    /// Another replica holds it (or nobody).
    NotHeld,
}

/// Until when a holder whose lease was renewed at `renewed` may write: `renewed + duration -
/// margin`, on the monotonic clock (`now_wall` and `now` are the same moment on both clocks).
pub fn write_deadline(
    renewed: SystemTime,
    now_wall: SystemTime,
    now: Instant,
    duration: Duration,
    margin: Duration,
) -> Instant {
    let valid = duration.saturating_sub(margin);
    match now_wall.duration_since(renewed) {
        // Renewed `age` ago: valid for what is left of `valid`.
        Ok(age) => now + valid.saturating_sub(age),
        // Renewed "in the future" (the clock stepped back): count from now, no longer.
        Err(_) => now + valid,
    }
}

/// A write is not sent with less than this left before the deadline.
pub const MIN_WRITE_BUDGET: Duration = Duration::from_millis(100);

/// How long a write sent at `now` may take: the request timeout, cut to what is left before
/// `until` (the leader's write deadline; `None`: no leader election, no deadline). `None`: too
/// little is left, do not send it.
pub fn write_budget(
    now: Instant,
    until: Option<Instant>,
    request_timeout: Duration,
) -> Option<Duration> {
    let Some(until) = until else {
        return Some(request_timeout);
    };
    let left = until.saturating_duration_since(now);
    (left >= MIN_WRITE_BUDGET).then(|| left.min(request_timeout))
}

/// The margin and the period of the reads for a lease renewed `grace` before it expires: a
/// quarter of the grace, and an eighth of it (at least 50 ms). A renewal is due `grace` before
/// expiry and seen within a period of it, so a healthy leader keeps 5/8 of the grace in hand
/// (3 s of the default 5) before its deadline, however busy its machine.
pub fn timing(grace: Duration) -> (Duration, Duration) {
    (grace / 4, (grace / 8).max(Duration::from_millis(50)))
}

/// What a read lease says about `identity`.
pub fn read(lease: &Lease, identity: &str, duration: Duration, margin: Duration) -> Fence {
    let spec = lease.spec.as_ref();
    if spec.and_then(|s| s.holder_identity.as_deref()) != Some(identity) {
        return Fence::NotHeld;
    }
    let renewed = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    match renewed {
        Some(at) => Fence::HeldUntil(write_deadline(
            at,
            SystemTime::now(),
            Instant::now(),
            duration,
            margin,
        )),
        None => Fence::Unknown,
    }
}

/// Reads the lease every `period` (each read bounded by `request_timeout`) and publishes what it
/// says; runs until the receiver is gone.
pub async fn watch(
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    grace: Duration,
    request_timeout: Duration,
    tx: watch::Sender<Fence>,
) {
    let (margin, period) = timing(grace);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let fence = match crate::retry::bounded(request_timeout, api.get_opt(&name)).await {
            Ok(Some(lease)) => read(&lease, &identity, duration, margin),
            Ok(None) => Fence::NotHeld,
            Err(crate::retry::CallError::Api(e)) => {
                tracing::debug!(error = %e, "cannot read the leader lease");
                Fence::Unknown
            }
            Err(crate::retry::CallError::Timeout(_)) => {
                tracing::debug!(after = ?request_timeout, "the leader lease read timed out");
                Fence::Unknown
            }
        };
        if fence != Fence::Unknown && tx.send(fence).is_err() {
            return;
        }
        if tx.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deadlines_count_from_the_renewal() {
        let s = Duration::from_secs;
        let now = Instant::now();
        let wall = SystemTime::now();
        // Renewed 3 s ago, valid 15 - 2 = 13 s: 10 s left.
        assert_eq!(
            write_deadline(wall - s(3), wall, now, s(15), s(2)),
            now + s(10)
        );
        // Renewed long ago: already past.
        assert_eq!(write_deadline(wall - s(60), wall, now, s(15), s(2)), now);
        // A renewal "from the future" counts from now.
        assert_eq!(
            write_deadline(wall + s(5), wall, now, s(15), s(2)),
            now + s(13)
        );
        assert_eq!(timing(s(4)), (s(1), Duration::from_millis(500)));
        assert_eq!(timing(Duration::ZERO).1, Duration::from_millis(50));
    }

    /// Issue 21, item 7: no write may outlive the leader's deadline.
    #[test]
    fn every_write_ends_before_the_deadline() {
        let ms = Duration::from_millis;
        let now = Instant::now();
        let timeout = ms(10_000);
        assert_eq!(write_budget(now, None, timeout), Some(timeout));
        assert_eq!(
            write_budget(now, Some(now + ms(60_000)), timeout),
            Some(timeout)
        );
        assert_eq!(
            write_budget(now, Some(now + ms(1_250)), timeout),
            Some(ms(1_250))
        );
        assert_eq!(write_budget(now, Some(now + ms(99)), timeout), None);
        assert_eq!(write_budget(now, Some(now), timeout), None);
        assert_eq!(write_budget(now + ms(5), Some(now), timeout), None);
        for left in [100u64, 101, 999, 3_000, 9_999, 10_000, 10_001, 40_000] {
            let until = now + ms(left);
            let budget = write_budget(now, Some(until), timeout).expect("sent");
            assert!(now + budget <= until, "{left} ms left, budget {budget:?}");
            assert!(budget <= timeout);
        }
    }

    #[test]
    fn reads_who_holds_the_lease() {
        let lease = |holder: &str, renew: Option<&str>| -> Lease {
            serde_json::from_value(json!({
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew}
            }))
            .expect("lease")
        };
        let s = Duration::from_secs;
        assert_eq!(
            read(
                &lease("b", Some("2026-01-01T00:00:00.000000Z")),
                "a",
                s(15),
                s(2)
            ),
            Fence::NotHeld
        );
        assert_eq!(read(&lease("a", None), "a", s(15), s(2)), Fence::Unknown);
        // Renewed in 2026-01: long past, the deadline is now or before.
        match read(
            &lease("a", Some("2026-01-01T00:00:00.000000Z")),
            "a",
            s(15),
            s(2),
        ) {
            Fence::HeldUntil(at) => assert!(at <= Instant::now()),
            other => panic!("{other:?}"),
        }
    }
}
