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
    /// Another replica holds it (or nobody), as read by a request sent at `asked`: a read sent
    /// before this replica acquired the lease says nothing about its term (see [`follow`]).
    NotHeld { asked: Instant },
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

/// What a read lease says about `identity`; `asked` is when the read was sent.
pub fn read(
    lease: &Lease,
    identity: &str,
    duration: Duration,
    margin: Duration,
    asked: Instant,
) -> Fence {
    let spec = lease.spec.as_ref();
    if spec.and_then(|s| s.holder_identity.as_deref()) != Some(identity) {
        return Fence::NotHeld { asked };
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
        let asked = tokio::time::Instant::now().into_std();
        let fence = match crate::retry::bounded(request_timeout, api.get_opt(&name)).await {
            Ok(Some(lease)) => read(&lease, &identity, duration, margin, asked),
            Ok(None) => Fence::NotHeld { asked },
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

/// How following the lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The shutdown future resolved.
    Shutdown,
    /// The lease manager said this replica no longer leads (or stopped), or a read of the lease
    /// named another holder.
    Lost,
    /// No renewal was seen before the write deadline.
    NotRenewed,
}

/// The leader's side of the lease: follows the lease manager's `leader` and the fence's reads
/// ([`watch`]) until `shutdown`, publishing leadership and the write deadline on `publish`'s two
/// channels. Acquired, a leader may write for `valid` (the lease's duration less the
/// margin); each renewal read moves that deadline forward (never back); at the deadline with no
/// renewal seen it steps down ([`LeaseEnd::NotRenewed`]) before another replica could take the
/// lease over. Times are tokio's, so a test runs it on a paused clock.
pub async fn follow(
    mut leader: watch::Receiver<bool>,
    mut fence: watch::Receiver<Fence>,
    shutdown: impl std::future::Future<Output = ()>,
    valid: Duration,
    publish: (&watch::Sender<bool>, &watch::Sender<Option<Instant>>),
    lease: &str,
    identity: &str,
) -> LeaseEnd {
    let (leader_tx, write_until) = publish;
    tokio::pin!(shutdown);
    let mut was_leader = false;
    // While leader: the moment this replica must stop writing unless a renewal is seen.
    let mut deadline = tokio::time::Instant::now();
    // When this replica last saw itself become the leader: a read sent before then (in flight
    // through the acquisition, or waiting in the channel) read the lease before it was ours.
    let mut acquired = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = &mut shutdown => return LeaseEnd::Shutdown,
            changed = leader.changed() => {
                if changed.is_err() {
                    return LeaseEnd::Lost;
                }
                let is_leader = *leader.borrow_and_update();
                if is_leader {
                    tracing::info!(lease, identity, "became the leader");
                    if !was_leader {
                        // Just acquired: valid for a full term from now.
                        acquired = tokio::time::Instant::now();
                        deadline = acquired + valid;
                        let _ = write_until.send(Some(deadline.into_std()));
                    }
                } else if was_leader {
                    return LeaseEnd::Lost;
                }
                was_leader = is_leader;
                let _ = leader_tx.send(is_leader);
            }
            Ok(()) = fence.changed() => {
                match *fence.borrow_and_update() {
                    // Renewals only move forward: a read of an older one (a lease this identity
                    // held before a restart, a read that raced the acquisition) never shortens
                    // what is known.
                    Fence::HeldUntil(until) if was_leader => {
                        deadline = deadline.max(until.into());
                        let _ = write_until.send(Some(deadline.into_std()));
                    }
                    Fence::NotHeld { asked } if was_leader && asked >= acquired.into_std() => {
                        tracing::error!(lease, "the lease names another holder; stepping down");
                        return LeaseEnd::Lost;
                    }
                    Fence::NotHeld { .. } if was_leader => {
                        tracing::debug!(lease, "a read sent before the acquisition names another holder; ignored");
                    }
                    _ => {}
                }
            }
            () = tokio::time::sleep_until(deadline), if was_leader => {
                tracing::error!(lease, "no renewal of the lease seen in time; stepping down before another replica can take it");
                return LeaseEnd::NotRenewed;
            }
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
        let asked = Instant::now();
        assert_eq!(
            read(
                &lease("b", Some("2026-01-01T00:00:00.000000Z")),
                "a",
                s(15),
                s(2),
                asked
            ),
            Fence::NotHeld { asked }
        );
        assert_eq!(
            read(&lease("a", None), "a", s(15), s(2), asked),
            Fence::Unknown
        );
        // Renewed in 2026-01: long past, the deadline is now or before.
        match read(
            &lease("a", Some("2026-01-01T00:00:00.000000Z")),
            "a",
            s(15),
            s(2),
            asked,
        ) {
            Fence::HeldUntil(at) => assert!(at <= Instant::now()),
            other => panic!("{other:?}"),
        }
    }

    /// [`follow`] on a paused clock: the channels it reads and writes, and a shutdown that
    /// resolves when told.
    struct Following {
        leader: watch::Sender<bool>,
        fence: watch::Sender<Fence>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        leads: watch::Receiver<bool>,
        write_until: watch::Receiver<Option<Instant>>,
        task: tokio::task::JoinHandle<LeaseEnd>,
    }

    const VALID: Duration = Duration::from_secs(13);

    fn follow_lease() -> Following {
        let (leader, leader_rx) = watch::channel(false);
        let (fence, fence_rx) = watch::channel(Fence::Unknown);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (leads_tx, leads) = watch::channel(false);
        let (until_tx, write_until) = watch::channel(None);
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            follow(
                leader_rx,
                fence_rx,
                shutdown,
                VALID,
                (&leads_tx, &until_tx),
                "lease",
                "me",
            )
            .await
        });
        Following {
            leader,
            fence,
            stop: Some(stop),
            leads,
            write_until,
            task,
        }
    }

    /// Lets the spawned `follow` run what is ready, without moving the clock.
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquired_lease_is_valid_for_a_term_and_no_longer_without_a_renewal() {
        let t0 = now();
        let mut l = follow_lease();
        l.leader.send(true).expect("follow runs");
        settle().await;
        assert!(*l.leads.borrow_and_update());
        assert_eq!(*l.write_until.borrow(), Some(t0 + VALID));
        tokio::time::advance(VALID - Duration::from_millis(1)).await;
        settle().await;
        assert!(!l.task.is_finished(), "steps down only at the deadline");
        let end = l.task.await.expect("no panic");
        assert_eq!(end, LeaseEnd::NotRenewed);
        assert_eq!(now() - t0, VALID, "at the deadline exactly");
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_move_the_deadline_forward_never_back() {
        let t0 = now();
        let mut l = follow_lease();
        l.leader.send(true).expect("follow runs");
        settle().await;
        let s = Duration::from_secs;
        // A renewal every 5 s for 20 s, each valid 13 s from its read.
        for i in 1..=4u32 {
            tokio::time::advance(s(5)).await;
            l.fence
                .send(Fence::HeldUntil(now() + VALID))
                .expect("follow runs");
            settle().await;
            assert_eq!(*l.write_until.borrow(), Some(t0 + s(5) * i + VALID));
        }
        // An older read (a lease held before a restart) does not shorten it.
        l.fence
            .send(Fence::HeldUntil(t0 + s(1)))
            .expect("follow runs");
        settle().await;
        assert_eq!(*l.write_until.borrow(), Some(t0 + s(20) + VALID));
        // Unknown (reads failing) keeps what is known.
        l.fence.send(Fence::Unknown).expect("follow runs");
        let end = l.task.await.expect("no panic");
        assert_eq!(end, LeaseEnd::NotRenewed);
        assert_eq!(now() - t0, s(20) + VALID);
        assert!(
            *l.leads.borrow_and_update(),
            "stepping down is the caller's to say (run sends false on the way out)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_or_the_manager_s_word_ends_it_at_once() {
        // A read naming another holder.
        let t0 = now();
        let l = follow_lease();
        l.leader.send(true).expect("follow runs");
        settle().await;
        l.fence
            .send(Fence::NotHeld { asked: now() })
            .expect("follow runs");
        assert_eq!(l.task.await.expect("no panic"), LeaseEnd::Lost);
        assert_eq!(now(), t0, "no wait");
        // The manager says no longer leader.
        let l = follow_lease();
        l.leader.send(true).expect("follow runs");
        settle().await;
        l.leader.send(false).expect("follow runs");
        assert_eq!(l.task.await.expect("no panic"), LeaseEnd::Lost);
        // The manager stops.
        let l = follow_lease();
        drop(l.leader);
        assert_eq!(l.task.await.expect("no panic"), LeaseEnd::Lost);
        assert_eq!(now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn before_it_leads_nothing_ends_it_but_a_shutdown() {
        let t0 = now();
        let mut l = follow_lease();
        // Reads before the acquisition are not this leader's: ignored, and no deadline runs.
        l.fence
            .send(Fence::NotHeld { asked: now() })
            .expect("follow runs");
        l.fence
            .send(Fence::HeldUntil(t0 + Duration::from_secs(1)))
            .expect("follow runs");
        tokio::time::advance(VALID * 10).await;
        settle().await;
        assert!(!l.task.is_finished());
        assert_eq!(*l.write_until.borrow(), None);
        assert!(!*l.leads.borrow());
        if let Some(stop) = l.stop.take() {
            let _ = stop.send(());
        }
        assert_eq!(l.task.await.expect("no panic"), LeaseEnd::Shutdown);
    }

    /// A read sent before the acquisition and answered after it (the fence reads on its own
    /// clock, the manager acquires on its own) read the lease before it was this replica's: it
    /// does not depose the new leader (the CI run of 5a1bc0c lost its only replica so). A read
    /// sent after the acquisition that names another holder still does.
    #[tokio::test(start_paused = true)]
    async fn a_read_sent_before_the_acquisition_does_not_depose_the_new_leader() {
        let t0 = now();
        let mut l = follow_lease();
        tokio::time::advance(Duration::from_millis(100)).await;
        l.leader.send(true).expect("follow runs");
        settle().await;
        assert!(*l.leads.borrow_and_update());
        // Answered now, sent 100 ms ago: nobody held the lease then.
        l.fence
            .send(Fence::NotHeld { asked: t0 })
            .expect("follow runs");
        settle().await;
        assert!(!l.task.is_finished(), "a stale read deposed the leader");
        // A renewal still moves the deadline, and a fresh read naming another holder ends it.
        tokio::time::advance(Duration::from_secs(1)).await;
        l.fence
            .send(Fence::HeldUntil(now() + VALID))
            .expect("follow runs");
        settle().await;
        assert_eq!(*l.write_until.borrow(), Some(now() + VALID));
        l.fence
            .send(Fence::NotHeld { asked: now() })
            .expect("follow runs");
        assert_eq!(l.task.await.expect("no panic"), LeaseEnd::Lost);
    }
}
