use super::*;
use proptest::prelude::*;

const S: fn(u64) -> Duration = Duration::from_secs;

fn st(deprecated: Option<Epoch>, synced: Option<Epoch>) -> EpochStatus {
    EpochStatus { deprecated, synced }
}

fn pod(name: &str, epoch: Option<&str>) -> PodView {
    PodView {
        name: name.into(),
        uid: format!("uid-{name}"),
        epoch_annotation: epoch.map(str::to_owned),
        ..PodView::default()
    }
}

fn refs(names: &[&str]) -> Vec<PodRef> {
    names
        .iter()
        .map(|n| PodRef {
            name: (*n).to_owned(),
            uid: format!("uid-{n}"),
        })
        .collect()
}

fn input<'a>(status: EpochStatus, pods: &'a [PodView], clock: Clock, now: u64) -> Input<'a> {
    Input {
        status,
        expected_pods: i64::try_from(pods.len()).unwrap_or(0),
        pods,
        restarts: 0,
        restarts_count_towards_max: 0,
        max_restarts: 3,
        timeout: Some(S(60)),
        clock: Some(clock),
        now: S(now),
    }
}

fn clock(started: u64, step: Step) -> Clock {
    Clock {
        started: S(started),
        restarts: 0,
        deprecated: 1,
        step,
    }
}

#[test]
fn in_progress_from_the_two_fields() {
    assert!(!in_progress(st(None, None)));
    assert!(!in_progress(st(None, Some(1))));
    assert!(in_progress(st(Some(1), None)));
    assert!(in_progress(st(Some(1), Some(1))));
    assert!(in_progress(st(Some(2), Some(1))));
    assert!(!in_progress(st(Some(1), Some(2))));
    // The attempt dialect's first restart deprecates 0.
    assert!(in_progress(st(Some(0), Some(0))));
}

#[test]
fn timeouts_parse_leniently_and_never_panic() {
    let ok = |t: &str, d: Duration| assert_eq!(parse_timeout(t), Ok(Some(d)), "{t}");
    ok("90s", S(90));
    ok("2m", S(120));
    ok("1h30m", S(5400));
    ok("1m30s", S(90));
    ok("1000ms", S(1));
    ok("1s500ms", Duration::from_millis(1500));
    ok(" 3 ", S(3));
    ok("3", S(3));
    ok("24h", MAX_TIMEOUT);
    ok("5m0s", S(300));
    // The grammar of every flag (issue 23): fractions and long unit names too.
    ok("1.5s", Duration::from_millis(1500));
    ok("5sec", S(5));
    ok("2min", S(120));
    ok("1d", MAX_TIMEOUT);
    assert_eq!(parse_timeout("0"), Ok(None));
    assert_eq!(parse_timeout("0s"), Ok(None));
    assert_eq!(parse_timeout("0h0m"), Ok(None));
    for bad in [
        "",
        " ",
        "-1",
        "-5s",
        "+5s",
        "s",
        "m5",
        "24h1s",
        "25h",
        "500ms",
        "999ms",
        "99999999999999999999",
        "18446744073709551615h",
        "five",
        "١s",
        "2d",
        "1.0001s",
        "1h 30m 1h 30m 1h 30m 1h 30m 1h 30m",
        "1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h",
    ] {
        let err = parse_timeout(bad).expect_err(bad);
        assert!(err.value.chars().count() <= 64);
        assert!(err.to_string().contains("1s to 24h"), "{err}");
    }
    let long: String = "9".repeat(200);
    assert_eq!(parse_timeout(&long).expect_err("long").value.len(), 64);
}

#[test]
fn the_annotation_overrides_the_default_and_a_bad_one_is_reported() {
    let d = Some(DEFAULT_TIMEOUT);
    assert_eq!(effective_timeout(None, d), (d, None));
    assert_eq!(effective_timeout(None, None), (None, None));
    assert_eq!(effective_timeout(Some("30s"), d), (Some(S(30)), None));
    assert_eq!(effective_timeout(Some("30s"), None), (Some(S(30)), None));
    assert_eq!(effective_timeout(Some("0"), d), (None, None));
    let (t, err) = effective_timeout(Some("soon"), d);
    assert_eq!(t, d);
    assert_eq!(err.map(|e| e.value), Some("soon".to_owned()));
}

#[test]
fn durations_display_as_written() {
    assert_eq!(display_duration(S(120)), "2m");
    assert_eq!(display_duration(S(90)), "1m30s");
    assert_eq!(display_duration(S(3600)), "1h");
    assert_eq!(display_duration(S(5)), "5s");
    assert_eq!(display_duration(Duration::from_millis(1500)), "1s500ms");
    assert_eq!(display_duration(Duration::from_millis(250)), "250ms");
    for t in ["2m", "1m30s", "1h", "5s", "1s250ms", "1h2m3s", "45s"] {
        let d = parse_timeout(t).ok().flatten().expect(t);
        assert_eq!(display_duration(d), t);
    }
}

#[test]
fn the_clock_starts_with_the_restart_and_again_after_a_recreation() {
    let running = st(Some(1), Some(1));
    let c = track(None, running, 0, S(5)).expect("in progress");
    assert_eq!(c.started, S(5));
    assert_eq!(c.deprecated, 1);
    assert_eq!(c.step, Step::Waiting);
    // The same restart later: the same clock, its step kept, even if D moves up meanwhile.
    let stepped = Clock {
        step: Step::UnregisteredDeleted { at: S(70) },
        ..c
    };
    assert_eq!(
        track(Some(stepped), st(Some(2), Some(1)), 0, S(80)),
        Some(stepped)
    );
    // A recreation (status.restarts moved): a new clock.
    let again = track(Some(stepped), running, 1, S(90)).expect("still in progress");
    assert_eq!((again.started, again.restarts), (S(90), 1));
    assert_eq!(again.step, Step::Waiting);
    // Completed, or no restart at all: no clock.
    assert_eq!(track(Some(c), st(Some(1), Some(2)), 0, S(9)), None);
    assert_eq!(track(None, st(None, None), 0, S(9)), None);
    assert_eq!(track(None, st(None, Some(1)), 0, S(9)), None);
    // A wiped deprecated field is no news: the clock and its step are kept until it is
    // written again (the same restart goes on) or the completion is seen.
    for wiped in [st(None, None), st(None, Some(1))] {
        assert_eq!(track(Some(stepped), wiped, 0, S(95)), Some(stepped));
    }
    assert_eq!(track(Some(stepped), running, 0, S(99)), Some(stepped));
    assert_eq!(
        track(Some(stepped), st(None, None), 1, S(99)),
        None,
        "recreated meanwhile"
    );
}

#[test]
fn step_one_deletes_the_pods_that_did_not_register_in_time() {
    let mut failed = pod("failed", Some("1"));
    failed.failed = true;
    let mut leaving = pod("leaving", None);
    leaving.terminating = true;
    let pods = [
        pod("new", Some("2")),
        pod("old", Some("1")),
        pod("none", None),
        pod("bad", Some("x")),
        failed,
        leaving,
    ];
    let status = st(Some(1), Some(1));
    let mut i = input(status, &pods, clock(100, Step::Waiting), 130);
    i.expected_pods = 4;
    let d = decide(&i);
    assert_eq!(d.action, Action::WaitFor(S(30)));
    assert_eq!(d.unregistered, 3);
    assert!(
        d.unregistered_pods.is_empty(),
        "nothing copied while it waits"
    );
    assert_eq!(d.missing, 0);
    i.now = S(160);
    let d = decide(&i);
    assert_eq!(
        d.action,
        Action::DeleteUnregistered(refs(&["bad", "none", "old"]))
    );
    assert_eq!(d.unregistered_pods, refs(&["bad", "none", "old"]));
}

#[test]
fn step_two_recreates_or_fails_at_the_limit() {
    let pods = [pod("a", Some("2")), pod("b", None)];
    let status = st(Some(1), Some(1));
    let stepped = clock(0, Step::UnregisteredDeleted { at: S(60) });
    let mut i = input(status, &pods, stepped, 119);
    assert_eq!(decide(&i).action, Action::WaitFor(S(1)));
    i.now = S(120);
    i.restarts = 4;
    i.restarts_count_towards_max = 2;
    assert_eq!(
        decide(&i).action,
        Action::Recreate {
            restarts: 5,
            restarts_count_towards_max: 3
        }
    );
    // maxRestarts 3 and 3 restarts counted: a fourth would pass it.
    i.restarts_count_towards_max = 3;
    assert_eq!(
        decide(&i).action,
        Action::Fail {
            restarts_count_towards_max: 3,
            max_restarts: 3
        }
    );
    // maxRestarts 0 (or absent): no recreation at all.
    i.restarts_count_towards_max = 0;
    i.max_restarts = 0;
    assert!(matches!(decide(&i).action, Action::Fail { .. }));
    // Counts at the int32 edge fail rather than wrap.
    i.max_restarts = i32::MAX;
    i.restarts = i32::MAX;
    assert!(matches!(decide(&i).action, Action::Fail { .. }));
}

#[test]
fn a_whole_group_waits_for_its_synced_write_not_for_the_deadline() {
    let pods = [pod("a", Some("2")), pod("b", Some("2"))];
    let i = input(st(Some(1), Some(1)), &pods, clock(0, Step::Waiting), 1000);
    let d = decide(&i);
    assert_eq!(d.action, Action::None);
    assert_eq!(d.unregistered, 0);
    // One pod missing: the deadline runs, with nothing to delete at step 1.
    let pods = [pod("a", Some("2"))];
    let mut i = input(st(Some(1), Some(1)), &pods, clock(0, Step::Waiting), 1000);
    i.expected_pods = 2;
    let d = decide(&i);
    assert_eq!(d.action, Action::DeleteUnregistered(Vec::new()));
    assert_eq!(d.missing, 1);
}

#[test]
fn off_or_not_in_progress_does_nothing() {
    let pods = [pod("a", None)];
    let mut i = input(st(Some(1), Some(1)), &pods, clock(0, Step::Waiting), 1000);
    i.timeout = None;
    assert_eq!(decide(&i).action, Action::None);
    let i = input(st(Some(1), Some(2)), &pods, clock(0, Step::Waiting), 1000);
    assert_eq!(decide(&i).action, Action::None);
    let mut i = input(st(Some(1), Some(1)), &pods, clock(0, Step::Waiting), 1000);
    i.clock = None;
    assert_eq!(decide(&i).action, Action::None);
}

#[test]
fn names_are_listed_up_to_a_bound() {
    assert_eq!(name_list::<&str>(&[], 3), "none");
    assert_eq!(name_list(&["a", "b"], 3), "a, b");
    assert_eq!(
        name_list(&["a", "b", "c", "d", "e"], 3),
        "a, b, c and 2 more"
    );
}

#[test]
fn recreation_deletes_the_jobs_of_earlier_restarts_the_jobset_controls() {
    let job =
        |name: &'static str, owner: Option<&'static str>, attempt: Option<&'static str>| JobView {
            name,
            uid: name,
            controller_uid: owner,
            restart_attempt: attempt,
            deleting: false,
        };
    let mut deleting = job("deleting", Some("js"), Some("0"));
    deleting.deleting = true;
    let jobs = [
        job("old", Some("js"), Some("0")),
        job("current", Some("js"), Some("1")),
        job("unlabelled", Some("js"), None),
        job("garbled", Some("js"), Some("one")),
        job("other-jobset", Some("other"), Some("0")),
        job("orphan", None, Some("0")),
        deleting,
    ];
    let names: Vec<String> = jobs_to_delete(&jobs, "js", 1)
        .into_iter()
        .map(|j| j.name)
        .collect();
    assert_eq!(names, ["old", "unlabelled", "garbled"]);
    assert!(
        jobs_to_delete(&jobs, "", 1).is_empty(),
        "no JobSet UID, no delete"
    );
}

// -----------------------------------------------------------------------------------------
// Exhaustively over small inputs, and by property over large ones
// -----------------------------------------------------------------------------------------

const EPOCHS: [Option<Epoch>; 4] = [None, Some(0), Some(1), Some(2)];
const ANNOTATIONS: [Option<&str>; 5] = [None, Some("x"), Some("0"), Some("1"), Some("2")];

/// Every pod of one kind: its annotation, failed, terminating.
fn kinds() -> Vec<PodView> {
    let mut out = Vec::new();
    for a in ANNOTATIONS {
        for (failed, terminating) in [(false, false), (true, false), (false, true)] {
            let mut p = pod("p", a);
            p.failed = failed;
            p.terminating = terminating;
            out.push(p);
        }
    }
    out
}

/// The properties every decision holds, whatever its input.
fn check(i: &Input<'_>) {
    let d = decide(i);
    let deprecated = i.status.deprecated;
    let counted = |p: &&PodView| !p.failed && !p.terminating;
    let fresh = |p: &PodView| {
        p.epoch_annotation
            .as_deref()
            .and_then(|a| parse_epoch(a).ok())
            .zip(deprecated)
            .is_some_and(|(e, d)| e > d)
    };
    let active = i.timeout.is_some() && i.clock.is_some() && in_progress(i.status);
    if !active {
        assert_eq!(d.action, Action::None, "{i:?}");
        return;
    }
    // Exactly the counted pods not registered above D are unregistered.
    let mut expect: Vec<PodRef> = i
        .pods
        .iter()
        .filter(counted)
        .filter(|p| !fresh(p))
        .map(|p| PodRef {
            name: p.name.clone(),
            uid: p.uid.clone(),
        })
        .collect();
    expect.sort();
    assert_eq!(d.unregistered, expect.len(), "{i:?}");
    let acting = !matches!(d.action, Action::None | Action::WaitFor(_));
    assert_eq!(
        d.unregistered_pods,
        if acting { expect } else { Vec::new() },
        "{i:?}"
    );
    let present = i.pods.iter().filter(counted).count() as i64;
    assert_eq!(d.missing, (i.expected_pods - present).max(0));
    let (Some(timeout), Some(clock)) = (i.timeout, i.clock) else {
        unreachable!()
    };
    let from = match clock.step {
        Step::Waiting => clock.started,
        Step::UnregisteredDeleted { at } => at,
    };
    let whole = d.unregistered == 0 && d.missing == 0;
    match &d.action {
        Action::None => assert!(whole, "{i:?}"),
        Action::WaitFor(w) => {
            assert!(!whole && !w.is_zero() && *w <= timeout, "{i:?}");
            assert_eq!(i.now + *w, from + timeout, "{i:?}");
        }
        Action::DeleteUnregistered(pods) => {
            assert!(!whole && i.now >= from + timeout, "{i:?}");
            assert_eq!(clock.step, Step::Waiting);
            assert_eq!(pods, &d.unregistered_pods);
        }
        Action::Recreate {
            restarts,
            restarts_count_towards_max,
        } => {
            assert!(!whole && i.now >= from + timeout, "{i:?}");
            assert!(matches!(clock.step, Step::UnregisteredDeleted { .. }));
            assert_eq!(i64::from(*restarts), i64::from(i.restarts) + 1);
            assert_eq!(
                i64::from(*restarts_count_towards_max),
                i64::from(i.restarts_count_towards_max) + 1
            );
            assert!(
                *restarts_count_towards_max <= i.max_restarts.max(0),
                "{i:?}"
            );
        }
        Action::Fail { .. } => {
            assert!(!whole && i.now >= from + timeout, "{i:?}");
            assert!(matches!(clock.step, Step::UnregisteredDeleted { .. }));
            assert!(
                i64::from(i.restarts_count_towards_max) + 1 > i64::from(i.max_restarts.max(0))
                    || i.restarts == i32::MAX
                    || i.restarts_count_towards_max == i32::MAX,
                "{i:?}"
            );
        }
    }
}

/// Every status, group of up to two pods of every kind, expected count, step and moment
/// (before, at and after each window's end), timeout on or off, and restart count around
/// the limit: 4 x 4 x (1 + 15 + 15^2) x 4 x (5 + 3) x 2 x 3 decisions.
#[test]
fn exhaustively_on_small_groups() {
    let kinds = kinds();
    let mut groups: Vec<Vec<PodView>> = vec![Vec::new()];
    for a in &kinds {
        groups.push(vec![a.clone()]);
        for b in &kinds {
            let mut b = b.clone();
            b.name = "q".into();
            b.uid = "uid-q".into();
            groups.push(vec![a.clone(), b]);
        }
    }
    let mut n = 0u64;
    for deprecated in EPOCHS {
        for synced in EPOCHS {
            let status = st(deprecated, synced);
            for pods in &groups {
                for expected in 0..4 {
                    for step in [Step::Waiting, Step::UnregisteredDeleted { at: S(160) }] {
                        for now in [100, 159, 160, 219, 220] {
                            if step != Step::Waiting && now < 160 {
                                continue;
                            }
                            for timeout in [None, Some(S(60))] {
                                for count in [1, 2, 3] {
                                    let i = Input {
                                        status,
                                        expected_pods: expected,
                                        pods,
                                        restarts: count + 1,
                                        restarts_count_towards_max: count,
                                        max_restarts: 3,
                                        timeout,
                                        clock: track(
                                            Some(Clock {
                                                started: S(100),
                                                restarts: count + 1,
                                                deprecated: deprecated.unwrap_or(0),
                                                step,
                                            }),
                                            status,
                                            count + 1,
                                            S(now),
                                        ),
                                        now: S(now),
                                    };
                                    check(&i);
                                    n += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(n, 4 * 4 * (1 + 15 + 225) * 4 * (5 + 3) * 2 * 3);
}

fn any_pod() -> impl Strategy<Value = PodView> {
    (
        "[a-z]{1,3}",
        proptest::option::of(prop_oneof![
            any::<i32>().prop_map(|e| e.to_string()),
            (0i32..5).prop_map(|e| e.to_string()),
            ".{0,4}",
        ]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(name, epoch_annotation, failed, terminating)| PodView {
            uid: format!("uid-{name}"),
            name,
            failed,
            terminating,
            epoch_annotation,
            ..PodView::default()
        })
}

proptest! {
    // A failure prints its minimal input; it becomes a unit test (as in the property tests
    // of tests/it/admission/properties/, nothing is persisted).
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any input at all, extremes included: a decision that holds the properties.
    #[test]
    fn decisions_hold_on_any_input(
        deprecated in proptest::option::of(prop_oneof![any::<i32>(), 0i32..4]),
        synced in proptest::option::of(prop_oneof![any::<i32>(), 0i32..4]),
        pods in proptest::collection::vec(any_pod(), 0..12),
        expected in prop_oneof![any::<i64>(), 0i64..12],
        restarts in prop_oneof![any::<i32>(), 0i32..4],
        count in prop_oneof![any::<i32>(), 0i32..4],
        max_restarts in prop_oneof![any::<i32>(), 0i32..4],
        timeout_ms in proptest::option::of(1u64..100_000_000),
        started_ms in 0u64..1_000_000_000,
        stepped in proptest::option::of(0u64..1_000_000_000),
        now_ms in 0u64..2_000_000_000,
    ) {
        let status = st(deprecated, synced);
        let now = Duration::from_millis(now_ms.max(started_ms));
        let step = match stepped {
            Some(at) => Step::UnregisteredDeleted { at: Duration::from_millis(at.min(now_ms).max(started_ms)) },
            None => Step::Waiting,
        };
        let clock = track(
            Some(Clock { started: Duration::from_millis(started_ms), restarts, deprecated: 0, step }),
            status,
            restarts,
            now,
        );
        let i = Input {
            status,
            expected_pods: expected,
            pods: &pods,
            restarts,
            restarts_count_towards_max: count,
            max_restarts,
            timeout: timeout_ms.map(Duration::from_millis),
            clock,
            now,
        };
        check(&i);
    }

    /// A timeout the parser accepts reads back to the same duration once displayed, and any
    /// text is either accepted within bounds or refused, never a panic.
    #[test]
    fn any_text_parses_or_is_refused(text in ".{0,40}") {
        match parse_timeout(&text) {
            Ok(Some(d)) => {
                prop_assert!(MIN_TIMEOUT <= d && d <= MAX_TIMEOUT);
                prop_assert_eq!(parse_timeout(&display_duration(d)), Ok(Some(d)));
            }
            Ok(None) => prop_assert_eq!(crate::settings::parse_duration(&text), Ok(Duration::ZERO)),
            Err(e) => prop_assert!(e.value.chars().count() <= 64),
        }
    }

    #[test]
    fn every_duration_round_trips(ms in 1_000u64..=86_400_000) {
        let d = Duration::from_millis(ms);
        prop_assert_eq!(parse_timeout(&display_duration(d)), Ok(Some(d)));
    }
}
