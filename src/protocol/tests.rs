use super::*;

fn pod(name: &str, epoch: Option<&str>) -> PodView {
    PodView {
        name: name.into(),
        epoch_annotation: epoch.map(str::to_owned),
        ..PodView::default()
    }
}

fn input<'a>(
    dialect: Dialect,
    expected: i64,
    status: EpochStatus,
    pods: &'a [PodView],
) -> ReconcileInput<'a> {
    ReconcileInput {
        dialect,
        expected_pods: expected,
        max_restarts: 10,
        status,
        restarts: 0,
        restarts_count_towards_max: 0,
        last_synced: None,
        last_deprecated: None,
        pods,
    }
}

fn st(deprecated: Option<Epoch>, synced: Option<Epoch>) -> EpochStatus {
    EpochStatus { deprecated, synced }
}

#[test]
fn dialect_names_round_trip() {
    for d in Dialect::ALL {
        assert_eq!(d.as_str().parse::<Dialect>(), Ok(d));
    }
    assert!("Epoch".parse::<Dialect>().is_err());
}

#[test]
fn parse_epoch_is_strict() {
    assert_eq!(parse_epoch("0"), Ok(0));
    assert_eq!(parse_epoch("2147483647"), Ok(i32::MAX));
    for bad in [
        "",
        "-1",
        "+1",
        " 1",
        "1 ",
        "2147483648",
        "99999999999",
        "1.0",
        "x",
        "١",
    ] {
        assert!(parse_epoch(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn agent_epoch_rule() {
    assert_eq!(agent_epoch(Dialect::Epoch, None, None), 1);
    assert_eq!(agent_epoch(Dialect::Attempt, None, None), 0);
    assert_eq!(agent_epoch(Dialect::Epoch, None, Some(3)), 4);
    assert_eq!(agent_epoch(Dialect::Epoch, Some(3), None), 4);
    assert_eq!(agent_epoch(Dialect::Epoch, Some(5), Some(3)), 6);
    assert_eq!(agent_epoch(Dialect::Attempt, Some(1), Some(4)), 5);
    assert_eq!(agent_epoch(Dialect::Epoch, Some(i32::MAX), None), i32::MAX);
}

#[test]
fn agent_decisions() {
    let view = |in_place, disabled, d, s| AgentView {
        in_place_restart: in_place,
        disabled,
        status: st(d, s),
    };
    assert_eq!(
        agent_decide(2, &view(true, false, Some(2), Some(2))),
        AgentAction::Restart(Restart {
            epoch: 2,
            deprecated: 2
        })
    );
    assert_eq!(
        agent_decide(2, &view(true, false, Some(1), Some(2))),
        AgentAction::LiftBarrier
    );
    assert_eq!(
        agent_decide(2, &view(true, false, Some(1), Some(1))),
        AgentAction::Wait
    );
    assert_eq!(
        agent_decide(1, &view(true, false, None, None)),
        AgentAction::Wait
    );
    assert_eq!(
        agent_decide(1, &view(false, false, Some(5), None)),
        AgentAction::LiftBarrier
    );
    assert_eq!(
        agent_decide(1, &view(true, true, Some(5), None)),
        AgentAction::LiftBarrier
    );
}

fn begun(name: &str, epoch: &str) -> PodView {
    PodView {
        restart_begun: true,
        ..pod(name, Some(epoch))
    }
}

#[test]
fn restart_begun_counts_a_true_only_after_a_not_true_at_that_epoch_and_uid() {
    let armed = |uid: &str, epoch| Armed {
        uid: uid.into(),
        epoch,
    };
    let memories = [
        None,
        Some(armed("u", 1)),
        Some(armed("u", 2)),
        Some(armed("v", 1)),
    ];
    for memory in &memories {
        for uid in ["u", "v"] {
            for epoch in [None, Some(1), Some(2)] {
                for restarting in [None, Some(false), Some(true)] {
                    let (next, is_begun) = restart_begun(memory.as_ref(), uid, epoch, restarting);
                    let matches =
                        epoch.is_some() && memory.as_ref() == epoch.map(|e| armed(uid, e)).as_ref();
                    let case = format!("{memory:?} {uid} {epoch:?} {restarting:?}");
                    assert_eq!(is_begun, restarting == Some(true) && matches, "{case}");
                    let expected = match (epoch, restarting) {
                        (None, _) => None,
                        (Some(e), Some(true)) => matches.then(|| armed(uid, e)),
                        (Some(e), _) => Some(armed(uid, e)),
                    };
                    assert_eq!(next, expected, "{case}");
                }
            }
        }
    }
    // A stale True at first sight (a new reconciler, or a status write that never said
    // False) is not a failure, however often it is seen, until False was seen at the epoch.
    let mut memory = None;
    for (epoch, restarting, expected) in [
        (1, Some(true), false),
        (1, Some(true), false),
        (1, Some(false), false),
        (1, Some(true), true),
        (1, Some(true), true),
        (2, Some(true), false),
        (2, None, false),
        (2, Some(true), true),
    ] {
        let (next, is_begun) = restart_begun(memory.as_ref(), "u", Some(epoch), restarting);
        assert_eq!(is_begun, expected, "epoch {epoch} {restarting:?}");
        memory = next;
    }
}

#[test]
fn a_begun_restart_at_the_synced_epoch_deprecates_it_at_once() {
    let pods = [begun("a", "2"), pod("b", Some("2")), pod("c", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 3, st(Some(1), Some(2)), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(2),
            synced: None
        }
    );
    assert_eq!(d.early.as_deref(), Some("a"));
    assert_eq!(d.pods_to_restart, 3);
    // The first restart of the attempt dialect (synced 0, nothing deprecated yet).
    let pods = [begun("a", "0"), pod("b", Some("0"))];
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(None, Some(0)), &pods));
    assert_eq!(d.change.deprecated, Some(0));
    // The same as its registration of the next epoch would decide, sooner.
    let registered = [
        pod("a", Some("3")),
        pod("b", Some("2")),
        pod("c", Some("2")),
    ];
    let later = reconcile_decide(&input(Dialect::Epoch, 3, st(Some(1), Some(2)), &registered));
    assert_eq!(later.change.deprecated, Some(2));
    assert_eq!(later.early, None);
}

#[test]
fn a_begun_restart_changes_nothing_else() {
    // Deprecated already (a group restart in progress): nothing to write.
    let pods = [begun("a", "2"), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(2), Some(2)), &pods));
    assert!(d.change.is_empty() && d.early.is_none(), "{d:?}");
    // Not at the synced epoch: above it (a new agent's epoch, the normal path decides),
    // below it, or nothing synced yet (the first start).
    for (status, epochs) in [
        (st(Some(1), Some(2)), ["3", "2"]),
        (st(Some(1), Some(3)), ["2", "3"]),
        (st(None, None), ["1", "1"]),
    ] {
        let pods = [begun("a", epochs[0]), pod("b", Some(epochs[1]))];
        let plain = [pod("a", Some(epochs[0])), pod("b", Some(epochs[1]))];
        let d = reconcile_decide(&input(Dialect::Epoch, 2, status, &pods));
        let without = reconcile_decide(&input(Dialect::Epoch, 2, status, &plain));
        assert_eq!(d.change, without.change, "{status:?} {epochs:?}");
        assert_eq!(d.early, None);
    }
    // A failed or terminating pod's condition is nobody's business.
    for gone in [
        PodView {
            failed: true,
            ..begun("a", "2")
        },
        PodView {
            terminating: true,
            ..begun("a", "2")
        },
    ] {
        let pods = [gone, pod("b", Some("2")), pod("c", Some("2"))];
        let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(2)), &pods));
        assert!(d.change.is_empty() && d.early.is_none(), "{d:?}");
    }
    // Past maxRestarts the JobSet fails: no epoch is written.
    let pods = [begun("a", "2"), pod("b", Some("2"))];
    let mut over = input(Dialect::Epoch, 2, st(Some(1), Some(2)), &pods);
    over.max_restarts = 0;
    let d = reconcile_decide(&over);
    assert!(d.fail.is_some() && d.change.is_empty(), "{d:?}");
}

#[test]
fn an_early_deprecation_is_never_lowered() {
    // Deprecated 2 early, then every pod restarts and registers 3 one by one: each decision
    // keeps 2 or raises, never writes below.
    let status = st(Some(2), Some(2));
    for pods in [
        vec![pod("a", Some("2")), pod("b", Some("2"))],
        vec![pod("a", Some("3")), pod("b", Some("2"))],
        vec![pod("a", Some("3")), begun("b", "2")],
    ] {
        let d = reconcile_decide(&input(Dialect::Epoch, 2, status, &pods));
        assert!(d.change.deprecated.is_none_or(|x| x >= 2), "{d:?}");
    }
    let pods = [pod("a", Some("3")), pod("b", Some("3"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, status, &pods));
    assert_eq!(d.change.synced, Some(3));
    assert_eq!(d.change.deprecated, None, "2 is already below 3");
}

#[test]
fn kep_all_pods_in_sync_no_write() {
    let pods = [pod("a", Some("2")), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(2)), &pods));
    assert!(d.change.is_empty());
    assert!(d.fail.is_none());
}

#[test]
fn kep_all_just_synced_writes_synced() {
    let pods = [pod("a", Some("2")), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(1)), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: None,
            synced: Some(2)
        }
    );
}

#[test]
fn kep_first_sync_writes_synced_only() {
    let pods = [pod("a", Some("1")), pod("b", Some("1"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(None, None), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: None,
            synced: Some(1)
        }
    );
    let pods = [pod("a", Some("0")), pod("b", Some("0"))];
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(None, None), &pods));
    assert_eq!(d.change.synced, Some(0));
    assert_eq!(d.change.deprecated, None);
}

#[test]
fn kep_one_pod_moved_writes_deprecated() {
    let pods = [pod("a", Some("3")), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(2)), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(2),
            synced: None
        }
    );
    assert_eq!(d.pods_to_restart, 1);
}

#[test]
fn kep_lost_sync_second_pod_moved_no_write() {
    let pods = [
        pod("a", Some("3")),
        pod("b", Some("3")),
        pod("c", Some("2")),
    ];
    let d = reconcile_decide(&input(Dialect::Epoch, 3, st(Some(2), Some(2)), &pods));
    assert!(d.change.is_empty());
}

#[test]
fn unregistered_pods_block_sync() {
    let pods = [pod("a", Some("1")), pod("b", None)];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(None, None), &pods));
    assert!(d.change.is_empty());
    assert_eq!(d.registered, 1);
}

#[test]
fn failed_and_terminating_pods_are_ignored() {
    let mut failed = pod("old", Some("1"));
    failed.failed = true;
    let mut terminating = pod("gone", Some("1"));
    terminating.terminating = true;
    let pods = [
        failed,
        terminating,
        pod("a", Some("2")),
        pod("b", Some("2")),
    ];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(1)), &pods));
    assert_eq!(d.change.synced, Some(2));
    assert_eq!(d.registered, 2);
}

#[test]
fn malformed_annotations_are_reported_and_ignored() {
    let pods = [pod("a", Some("x")), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(1)), &pods));
    assert_eq!(d.malformed.len(), 1);
    assert_eq!(d.malformed[0].pod, "a");
    assert!(d.change.is_empty(), "a malformed pod is not registered");
}

/// Issue 34 item 4: a pod's epoch beyond what the protocol can reach (2147483647 on a pod
/// anyone may create) is malformed, reported and skipped: it no longer fails the JobSet. An
/// epoch just past `maxRestarts` still does, as it always did.
#[test]
fn an_epoch_beyond_reach_is_malformed_not_a_failure() {
    for (dialect, status) in [
        (Dialect::Epoch, st(None, None)),
        (Dialect::Epoch, st(Some(3), Some(4))),
        (Dialect::Attempt, st(None, Some(0))),
    ] {
        let pods = [pod("a", Some("2147483647")), pod("b", Some("5"))];
        let i = input(dialect, 2, status, &pods);
        let reach = reachable_epoch(&i);
        let d = reconcile_decide(&i);
        assert_eq!(d.fail, None, "{dialect} {status:?}");
        assert_eq!(d.malformed.len(), 1, "{dialect} {status:?}");
        assert_eq!(d.malformed[0].pod, "a");
        assert!(d.malformed[0].error.to_string().contains("can reach"));
        assert_eq!(d.registered, 1);
        // At the reach: counted (and past maxRestarts: the JobSet fails, as before).
        let edge = reach.to_string();
        let pods = [pod("a", Some(&edge)), pod("b", Some("5"))];
        let d = reconcile_decide(&input(dialect, 2, status, &pods));
        assert!(d.malformed.is_empty(), "{dialect} {status:?}");
        assert!(
            matches!(d.fail, Some(MaxRestartsExceeded::ByEpoch { .. })),
            "{dialect} {status:?}"
        );
        // One above: malformed.
        let above = (reach + 1).to_string();
        let pods = [pod("a", Some(&above)), pod("b", Some("5"))];
        let d = reconcile_decide(&input(dialect, 2, status, &pods));
        assert_eq!(d.fail, None, "{dialect} {status:?}");
        assert_eq!(d.malformed.len(), 1, "{dialect} {status:?}");
    }
    // The reach: the highest epoch field, maxRestarts, restarts that do not count, margin.
    let mut i = input(Dialect::Epoch, 2, st(Some(3), Some(7)), &[]);
    i.last_deprecated = Some(9);
    i.restarts = 5;
    i.restarts_count_towards_max = 2;
    assert_eq!(reachable_epoch(&i), 9 + 10 + 3 + EPOCH_MARGIN);
}

#[test]
fn max_restarts_by_epoch() {
    let pods = [pod("a", Some("5")), pod("b", Some("4"))];
    let mut i = input(Dialect::Epoch, 2, st(Some(3), Some(4)), &pods);
    i.max_restarts = 3;
    let d = reconcile_decide(&i);
    assert_eq!(
        d.fail,
        Some(MaxRestartsExceeded::ByEpoch {
            restarts: 4,
            max_restarts: 3
        })
    );
    assert!(d.change.is_empty());
    i.max_restarts = 4;
    assert!(reconcile_decide(&i).fail.is_none());
}

#[test]
fn restarts_that_do_not_count() {
    let pods = [pod("a", Some("5")), pod("b", Some("5"))];
    let mut i = input(Dialect::Epoch, 2, st(Some(4), Some(4)), &pods);
    i.max_restarts = 2;
    i.restarts = 3;
    i.restarts_count_towards_max = 1;
    // 4 epoch restarts less 2 that do not count = 2, not above 2.
    let d = reconcile_decide(&i);
    assert!(d.fail.is_none());
    assert_eq!(d.change.synced, Some(5));
}

#[test]
fn max_restarts_by_container_restart_count() {
    let mut a = pod("a", Some("1"));
    a.max_restart_count = 4;
    let pods = [a, pod("b", Some("1"))];
    let mut i = input(Dialect::Epoch, 2, st(None, None), &pods);
    i.max_restarts = 3;
    let d = reconcile_decide(&i);
    assert!(matches!(
        d.fail,
        Some(MaxRestartsExceeded::ByRestartCount { ref pod, restart_count: 4, max_restarts: 3 }) if pod == "a"
    ));
}

#[test]
fn wiped_fields_are_rewritten() {
    let pods = [pod("a", Some("3")), pod("b", Some("3"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(None, None), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(2),
            synced: Some(3)
        }
    );
    let pods = [pod("a", Some("4")), pod("b", Some("3"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(None, None), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(3),
            synced: None
        }
    );
}

/// tests/it/system/chaos.rs, attempt dialect: deprecated 1 was published and acted on, but its status
/// write failed (an injected 500); every pod restarted and registered 2. The sync to 2 also
/// raises the deprecated field left at 0 (an agent reading the status would otherwise see
/// previous 0, current 2).
#[test]
fn a_deprecated_field_left_behind_is_raised_with_the_sync() {
    let pods = [pod("a", Some("2")), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(Some(0), Some(1)), &pods));
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(1),
            synced: Some(2)
        }
    );
    // Already there, or beyond (a new failure, pods not yet registered above it): nothing.
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(Some(1), Some(2)), &pods));
    assert!(d.change.is_empty(), "{:?}", d.change);
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(Some(2), Some(2)), &pods));
    assert!(d.change.is_empty(), "{:?}", d.change);
}

#[test]
fn fields_never_decrease() {
    let pods = [pod("a", Some("2")), pod("b", Some("2"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(5), Some(6)), &pods));
    assert!(d.change.is_empty());
}

#[test]
fn attempt_dialect_first_restart() {
    let pods = [pod("a", Some("1")), pod("b", Some("0"))];
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(None, Some(0)), &pods));
    assert_eq!(d.change.deprecated, Some(0));
    let pods = [pod("a", Some("1")), pod("b", Some("1"))];
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(Some(0), Some(0)), &pods));
    assert_eq!(d.change.synced, Some(1));
}

#[test]
fn epoch_dialect_first_epoch_is_never_deprecated() {
    let pods = [pod("a", Some("1")), pod("b", None)];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(None, None), &pods));
    assert!(d.change.is_empty());
}

/// Early detection never deprecates below the first epoch either: a synced epoch of 0 in
/// the epoch dialect (written by someone else) is not one a restart can leave (found by the
/// fuzzer's `epoch` target).
#[test]
fn early_detection_never_deprecates_below_the_first_epoch() {
    let mut a = pod("a", Some("0"));
    a.restart_begun = true;
    let pods = [a, pod("b", Some("0"))];
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(None, Some(0)), &pods));
    assert_eq!(d.change.deprecated, None, "{d:?}");
    assert_eq!(d.early, None);
    // In the attempt dialect 0 is the first attempt, and it is deprecated early.
    let d = reconcile_decide(&input(Dialect::Attempt, 2, st(None, Some(0)), &pods));
    assert_eq!(d.change.deprecated, Some(0), "{d:?}");
    assert_eq!(d.early.as_deref(), Some("a"));
}

/// The model check's trace (tests/it/model_check.rs,
/// `regression_wipe_then_lost_node_restarts_every_pod`): pods a and b synced and ran at 1,
/// the status was wiped, b's node was lost and its replacement c read no synced epoch and
/// registered 1 too. Without memory the reconciler rewrote S=1 and c ran beside a, which
/// never restarted; with it, c was not counted at the last sync, so everything up to 1 is
/// deprecated.
#[test]
fn a_pod_that_joined_while_the_status_was_wiped_restarts_every_pod() {
    let mut a = pod("a", Some("1"));
    a.counted_in_last_sync = true;
    let pods = [a.clone(), pod("c", Some("1"))];
    let mut i = input(Dialect::Epoch, 2, st(None, None), &pods);
    assert_eq!(
        reconcile_decide(&i).change.synced,
        Some(1),
        "without memory"
    );
    i.last_synced = Some(1);
    let d = reconcile_decide(&i);
    assert_eq!(
        d.change,
        StatusChange {
            deprecated: Some(1),
            synced: None
        }
    );
    assert_eq!(d.unsynced_joiners, vec!["c".to_owned()]);
    assert_eq!(d.pods_to_restart, 2);
    // Below the last synced epoch too (the replacement started over at the first epoch).
    a.epoch_annotation = Some("3".into());
    let pods = [a.clone(), pod("c", Some("1"))];
    let mut i = input(Dialect::Epoch, 2, st(None, None), &pods);
    i.last_synced = Some(3);
    assert_eq!(reconcile_decide(&i).change.deprecated, Some(3));
    // Once c climbed above it, the group syncs as usual.
    let mut c = pod("c", Some("4"));
    c.counted_in_last_sync = false;
    a.epoch_annotation = Some("4".into());
    let pods = [a, c];
    let mut i = input(Dialect::Epoch, 2, st(Some(3), None), &pods);
    i.last_synced = Some(3);
    let d = reconcile_decide(&i);
    assert_eq!(d.change.synced, Some(4));
    assert_eq!(d.synced_pods, vec!["a".to_owned(), "c".to_owned()]);
}

#[test]
fn a_wiped_deprecated_field_is_not_rewritten_below_an_earlier_write() {
    // The reconciler wrote D=2; the status was wiped; its cache shows one pod at 2 so far.
    let pods = [pod("a", Some("2"))];
    let mut i = input(Dialect::Epoch, 2, st(None, None), &pods);
    assert_eq!(
        reconcile_decide(&i).change.deprecated,
        Some(1),
        "without memory"
    );
    i.last_deprecated = Some(2);
    assert_eq!(reconcile_decide(&i).change.deprecated, Some(2));
    // A present field is compared as before.
    let mut i = input(Dialect::Epoch, 2, st(Some(1), None), &pods);
    i.last_deprecated = Some(2);
    assert!(reconcile_decide(&i).change.is_empty());
}

#[test]
fn status_patches_use_dialect_names() {
    let change = StatusChange {
        deprecated: Some(1),
        synced: Some(2),
    };
    assert_eq!(
        Dialect::Epoch.status_merge_patch(&change),
        Some(json!({"status": {"deprecatedEpoch": 1, "syncedEpoch": 2}}))
    );
    assert_eq!(
        Dialect::Attempt.status_merge_patch(&change),
        Some(
            json!({"status": {"previousInPlaceRestartAttempt": 1, "currentInPlaceRestartAttempt": 2}})
        )
    );
    assert_eq!(
        Dialect::Epoch.status_merge_patch(&StatusChange::default()),
        None
    );
    let status = json!({"deprecatedEpoch": 3, "syncedEpoch": -1, "other": 1});
    assert_eq!(
        Dialect::Epoch.read_status(status.as_object()),
        st(Some(3), None)
    );
}

/// A sidecar agent and one worker on a kubelet, as their statuses show them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Kubelet {
    now: i64,
    agent: ContainerRun,
    /// The agent's startup probe passed in its current run.
    agent_started: bool,
    worker: ContainerRun,
}

/// What a kubelet with the gate does, and (`gate: false`) what one without it does instead.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A second passes (or less: `startedAt` has a resolution of one second).
    Tick,
    AgentStarts,
    /// The startup probe passes and the worker starts.
    WorkerStarts,
    /// The agent (its restart code) or the worker exits: `RestartAllContainers`, or without
    /// the gate the agent alone restarts (`restartPolicy: Always`).
    AgentExits,
    /// The startup probe gives up: the agent alone restarts, its worker not started.
    ProbeGivesUp,
    /// The worker's own `Restart` rule: it alone restarts.
    WorkerRestartsAlone,
}

const STEPS: [Step; 6] = [
    Step::Tick,
    Step::AgentStarts,
    Step::WorkerStarts,
    Step::AgentExits,
    Step::ProbeGivesUp,
    Step::WorkerRestartsAlone,
];

impl Kubelet {
    /// `None` when the step cannot happen now.
    fn step(mut self, step: Step, gate: bool) -> Option<Kubelet> {
        let agent_runs = self.agent.running_since.is_some();
        let worker_runs = self.worker.running_since.is_some();
        match step {
            Step::Tick => self.now += 1,
            Step::AgentStarts if !agent_runs => self.agent.running_since = Some(self.now),
            Step::WorkerStarts if agent_runs && !self.agent_started && !worker_runs => {
                self.agent_started = true;
                self.worker.running_since = Some(self.now);
            }
            Step::AgentExits if agent_runs => {
                self.agent.restart_count += 1;
                self.agent.running_since = None;
                self.agent_started = false;
                if gate {
                    self.worker.restart_count += 1;
                    self.worker.running_since = None;
                }
            }
            Step::ProbeGivesUp if agent_runs && !self.agent_started && !worker_runs => {
                self.agent.restart_count += 1;
                self.agent.running_since = None;
            }
            Step::WorkerRestartsAlone if worker_runs => {
                self.worker.restart_count += 1;
                self.worker.running_since = Some(self.now);
            }
            _ => return None,
        }
        Some(self)
    }

    fn seen(&self) -> OldWorkers {
        old_workers(Some(self.agent), &[self.worker])
    }
}

/// Every history of `depth` steps from a fresh pod, each state visited.
fn histories(gate: bool, depth: usize, visit: &mut impl FnMut(&[Step], &Kubelet)) {
    fn go(
        k: Kubelet,
        path: &mut Vec<Step>,
        gate: bool,
        depth: usize,
        visit: &mut impl FnMut(&[Step], &Kubelet),
    ) {
        visit(path, &k);
        if path.len() == depth {
            return;
        }
        for s in STEPS {
            if let Some(next) = k.step(s, gate) {
                path.push(s);
                go(next, path, gate, depth, visit);
                path.pop();
            }
        }
    }
    go(Kubelet::default(), &mut Vec::new(), gate, depth, visit);
}

#[test]
fn a_kubelet_with_the_gate_never_shows_an_agent_restarted_alone() {
    let mut states = 0;
    histories(true, 9, &mut |path, k| {
        states += 1;
        assert_ne!(k.seen(), OldWorkers::AgentRestartedAlone, "{path:?} {k:?}");
        // Its statuses are consistent: a running agent means no worker outlived it.
        if k.agent.running_since.is_some() {
            assert_eq!(k.seen(), OldWorkers::No, "{path:?} {k:?}");
        }
    });
    assert!(states > 10_000, "{states}");
}

#[test]
fn an_agent_restarted_alone_a_second_or_more_after_its_worker_started_is_seen() {
    let mut seen = 0;
    histories(false, 9, &mut |path, k| {
        let outlived = k.worker.running_since.is_some_and(|w| {
            k.agent.running_since.is_some_and(|a| a > w)
                && k.agent.restart_count > k.worker.restart_count
        });
        let expected = match (k.agent.running_since, k.worker.running_since) {
            (_, None) => OldWorkers::No,
            (None, Some(_)) => OldWorkers::AgentDown,
            (Some(_), Some(_)) if outlived => OldWorkers::AgentRestartedAlone,
            (Some(_), Some(_)) => OldWorkers::No,
        };
        assert_eq!(k.seen(), expected, "{path:?} {k:?}");
        if expected == OldWorkers::AgentRestartedAlone {
            seen += 1;
        }
    });
    assert!(seen > 100, "{seen}");
    // The history the issue describes: worker runs, a second later the agent exits with its
    // restart code and restarts alone.
    let k = [
        Step::AgentStarts,
        Step::WorkerStarts,
        Step::Tick,
        Step::AgentExits,
    ]
    .into_iter()
    .try_fold(Kubelet::default(), |k, s| k.step(s, false))
    .expect("history");
    assert_eq!(k.seen(), OldWorkers::AgentDown);
    let k = k.step(Step::AgentStarts, false).expect("agent starts");
    assert_eq!(k.seen(), OldWorkers::AgentRestartedAlone);
    // Within the same second it is not seen (docs/protocol.md says so).
    let k = [
        Step::AgentStarts,
        Step::WorkerStarts,
        Step::AgentExits,
        Step::AgentStarts,
    ]
    .into_iter()
    .try_fold(Kubelet::default(), |k, s| k.step(s, false))
    .expect("history");
    assert_eq!(k.seen(), OldWorkers::No);
}

#[test]
fn old_workers_needs_an_agent_and_a_running_worker() {
    let run = |restart_count, since| ContainerRun {
        restart_count,
        running_since: since,
    };
    assert_eq!(old_workers(None, &[run(0, Some(1))]), OldWorkers::No);
    assert_eq!(old_workers(Some(run(1, Some(5))), &[]), OldWorkers::No);
    assert_eq!(
        old_workers(Some(run(1, Some(5))), &[run(0, None)]),
        OldWorkers::No
    );
    assert_eq!(old_workers(Some(run(1, None)), &[]), OldWorkers::No);
    // Any running worker of several.
    assert_eq!(
        old_workers(Some(run(1, Some(5))), &[run(1, Some(5)), run(0, Some(2))]),
        OldWorkers::AgentRestartedAlone
    );
    assert_eq!(
        old_workers(Some(run(1, None)), &[run(0, None), run(0, Some(2))]),
        OldWorkers::AgentDown
    );
}

#[test]
fn no_synced_epoch_over_old_workers() {
    let mut pods = vec![pod("a", Some("2")), pod("b", Some("2"))];
    let base = input(Dialect::Epoch, 2, st(Some(1), Some(1)), &pods);
    let d = reconcile_decide(&base);
    assert_eq!(d.change.synced, Some(2));
    assert!(d.restarted_alone.is_empty() && !d.held);

    for (seen, alone) in [
        (OldWorkers::AgentDown, false),
        (OldWorkers::AgentRestartedAlone, true),
    ] {
        pods[1].old_workers = seen;
        pods[1].uid = "u-b".into();
        pods[1].node = "n1".into();
        let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(1)), &pods));
        assert_eq!(d.change.synced, None, "{seen:?}");
        assert!(d.held);
        let expected: Vec<AloneAgent> = alone
            .then(|| AloneAgent {
                pod: "b".into(),
                uid: "u-b".into(),
                node: "n1".into(),
            })
            .into_iter()
            .collect();
        assert_eq!(d.restarted_alone, expected);
        // Deprecation goes on as before.
        let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(0), Some(1)), &pods));
        assert_eq!(d.change.deprecated, Some(1));
        assert_eq!(d.change.synced, None);
    }
    // A pod failed or terminating is not counted, nor held on.
    pods[1].failed = true;
    pods.push(pod("c", Some("2")));
    let d = reconcile_decide(&input(Dialect::Epoch, 2, st(Some(1), Some(1)), &pods));
    assert_eq!(d.change.synced, Some(2));
    assert!(d.restarted_alone.is_empty() && !d.held);
}
