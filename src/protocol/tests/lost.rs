//! A lost member (docs/protocol.md, "A lost member"): [`member_lost`] and its path through
//! [`reconcile_decide`].

use super::*;

/// A pod counted in the last sync at `epoch`, whose deletion has begun.
fn lost(name: &str, epoch: &str) -> PodView {
    PodView {
        terminating: true,
        counted_in_last_sync: true,
        ..pod(name, Some(epoch))
    }
}

/// A pod counted in the last sync at `epoch`.
fn counted(name: &str, epoch: &str) -> PodView {
    PodView {
        counted_in_last_sync: true,
        ..pod(name, Some(epoch))
    }
}

#[test]
fn member_lost_is_a_counted_pod_of_the_synced_epoch_being_deleted_alone() {
    let synced = 2;
    let mut seen = 0;
    for terminating in [false, true] {
        for failed in [false, true] {
            for job_leaving in [false, true] {
                for leaving in [false, true] {
                    for counted in [false, true] {
                        for last_synced in [None, Some(1), Some(2), Some(3)] {
                            for annotation in [None, Some("1"), Some("2"), Some("3"), Some("x")] {
                                let p = PodView {
                                    terminating,
                                    failed,
                                    job_leaving,
                                    counted_in_last_sync: counted,
                                    ..pod("a", annotation)
                                };
                                let pods = [p];
                                let mut i = input(Dialect::Epoch, 1, st(Some(1), Some(2)), &pods);
                                i.leaving = leaving;
                                i.last_synced = last_synced;
                                let want = terminating
                                    && !failed
                                    && !job_leaving
                                    && !leaving
                                    && counted
                                    && last_synced == Some(synced)
                                    && annotation == Some("2");
                                assert_eq!(
                                    member_lost(&i, synced, &pods[0]),
                                    want,
                                    "{:?} leaving={leaving} last={last_synced:?}",
                                    pods[0]
                                );
                                seen += usize::from(want);
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(seen, 1);
}

#[test]
fn a_lost_member_deprecates_the_synced_epoch_at_once() {
    let pods = [lost("a", "2"), counted("b", "2"), counted("c", "2")];
    let mut i = input(Dialect::Epoch, 3, st(Some(1), Some(2)), &pods);
    i.last_synced = Some(2);
    let d = reconcile_decide(&i);
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(2),
            synced: None
        }
    );
    assert_eq!(d.early.as_deref(), Some("a"));
    assert!(d.early_lost);
    // The two others restart; the lost pod is not counted.
    assert_eq!(d.pods_to_restart, 2);
    // The same as its replacement's registration of the next epoch decides, sooner.
    let replaced = [
        counted("b", "2"),
        counted("c", "2"),
        pod("a-new", Some("3")),
    ];
    let mut later = input(Dialect::Epoch, 3, st(Some(1), Some(2)), &replaced);
    later.last_synced = Some(2);
    assert_eq!(reconcile_decide(&later).change, d.change);
    // The attempt dialect's first epoch.
    let pods = [lost("a", "0"), counted("b", "0")];
    let mut i = input(Dialect::Attempt, 2, st(None, Some(0)), &pods);
    i.last_synced = Some(0);
    let d = reconcile_decide(&i);
    assert_eq!(d.change.deprecated, Some(0));
    assert!(d.early_lost);
    // A begun restart found first is no lost member.
    let pods = [begun("a", "2"), counted("b", "2")];
    let mut i = input(Dialect::Epoch, 2, st(Some(1), Some(2)), &pods);
    i.last_synced = Some(2);
    assert!(!reconcile_decide(&i).early_lost);
}

#[test]
fn a_lost_member_changes_nothing_else() {
    let plain = |pods: &[PodView]| -> Vec<PodView> {
        pods.iter().filter(|p| !p.terminating).cloned().collect()
    };
    let cases: Vec<(EpochStatus, Option<Epoch>, bool, Vec<PodView>)> = vec![
        // Deprecated already (a group restart in progress).
        (
            st(Some(2), Some(2)),
            Some(2),
            false,
            vec![lost("a", "2"), counted("b", "2")],
        ),
        // The JobSet is being deleted.
        (
            st(Some(1), Some(2)),
            Some(2),
            true,
            vec![lost("a", "2"), counted("b", "2")],
        ),
        // Its Job is being deleted.
        (
            st(Some(1), Some(2)),
            Some(2),
            false,
            vec![
                PodView {
                    job_leaving: true,
                    ..lost("a", "2")
                },
                counted("b", "2"),
            ],
        ),
        // This reconciler did not write the synced epoch (a new one: the normal path).
        (
            st(Some(1), Some(2)),
            None,
            false,
            vec![lost("a", "2"), counted("b", "2")],
        ),
        // A pod left terminating from an earlier generation.
        (
            st(Some(2), Some(3)),
            Some(3),
            false,
            vec![lost("a", "2"), counted("b", "3")],
        ),
        // Deleted before it was counted (it registered the next epoch, not synced yet).
        (
            st(Some(2), Some(2)),
            Some(2),
            false,
            vec![
                PodView {
                    counted_in_last_sync: false,
                    ..lost("a", "3")
                },
                counted("b", "3"),
            ],
        ),
    ];
    for (status, last_synced, leaving, pods) in cases {
        let without = plain(&pods);
        let mut i = input(Dialect::Epoch, 2, status, &pods);
        i.last_synced = last_synced;
        i.leaving = leaving;
        let mut j = input(Dialect::Epoch, 2, status, &without);
        j.last_synced = last_synced;
        j.leaving = leaving;
        let d = reconcile_decide(&i);
        assert_eq!(d.change, reconcile_decide(&j).change, "{pods:?}");
        assert_eq!(d.early, None, "{pods:?}");
        assert!(!d.early_lost);
    }
    // Past maxRestarts the JobSet fails: no epoch is written.
    let pods = [
        lost("a", "2"),
        PodView {
            max_restart_count: 11,
            ..counted("b", "2")
        },
    ];
    let mut i = input(Dialect::Epoch, 2, st(Some(1), Some(2)), &pods);
    i.last_synced = Some(2);
    let d = reconcile_decide(&i);
    assert!(d.fail.is_some() && d.change.is_empty(), "{d:?}");
}
