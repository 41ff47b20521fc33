//! Parity with JobSet's own in-place restart controller (the `attempt` dialect).
//!
//! Every case of JobSet v0.12.0's `pkg/controllers/in_place_restart_test.go`, translated into
//! data: the JobSet (strategy, `maxRestarts`, replicatedJobs, status before), its pods (the
//! `jobset.sigs.k8s.io/in-place-restart-attempt` annotation, phase, container restart counts) and
//! the status JobSet's controller ends with. Each case is named `TestFunction/case name` after the
//! upstream test. Upstream tests helper functions too; those cases become a whole JobSet whose
//! evaluation goes through the helper, and their expected status is what upstream's
//! `reconcileInPlaceRestart` (`in_place_restart.go`) then writes, as noted on each.
//!
//! The real reconciler runs in-process against the test API server with all cases loaded, one
//! namespace per case, twice:
//! 1. `write_epoch_status: false` (the `jobset-native` overlay, where JobSet's controller writes
//!    the two fields): it evaluates every JobSet and writes nothing to any JobSet's status.
//! 2. `write_epoch_status: true` (our reconciler the only writer): each case's status after is
//!    upstream's, or differs as listed in [`DIFFERENCES`] with a reason; an unlisted difference,
//!    or a listed one that no longer occurs, fails.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use jobset_inplace::protocol::{Dialect, IN_PLACE_RESTART};
use jobset_inplace::reconciler::metrics::Metrics;
use jobset_inplace::reconciler::{Controller, Settings};
use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
use jobset_inplace_testkit::build::{JobSet, Pod, ReplicatedJob};
use serde_json::{Value, json};

const JOBSET: &str = "test-jobset";
const LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The cases, as data
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct PodCase {
    name: &'static str,
    /// The JobSet-name label (`None`: unlabelled).
    jobset: Option<&'static str>,
    attempt: Option<&'static str>,
    phase: &'static str,
    restart_counts: &'static [i32],
    init_restart_counts: &'static [i32],
}

const fn pod(name: &'static str, attempt: Option<&'static str>) -> PodCase {
    PodCase {
        name,
        jobset: Some(JOBSET),
        attempt,
        phase: "Running",
        restart_counts: &[0],
        init_restart_counts: &[],
    }
}

const fn at(name: &'static str, attempt: &'static str) -> PodCase {
    pod(name, Some(attempt))
}

const fn bare(name: &'static str) -> PodCase {
    pod(name, None)
}

impl PodCase {
    const fn failed(self) -> PodCase {
        PodCase {
            phase: "Failed",
            ..self
        }
    }
    const fn restarts(self, counts: &'static [i32]) -> PodCase {
        PodCase {
            restart_counts: counts,
            ..self
        }
    }
    const fn init_restarts(self, counts: &'static [i32]) -> PodCase {
        PodCase {
            init_restart_counts: counts,
            ..self
        }
    }
    const fn of(self, jobset: Option<&'static str>) -> PodCase {
        PodCase { jobset, ..self }
    }
}

/// One replicatedJob: replicas, parallelism, completions (`None`: unset).
type Rj = (i32, i32, Option<i32>);

/// What the status holds of the in-place restart: the two attempt fields and whether the JobSet
/// is `Failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Outcome {
    previous: Option<i32>,
    current: Option<i32>,
    failed: bool,
}

const fn st(previous: Option<i32>, current: Option<i32>) -> Outcome {
    Outcome {
        previous,
        current,
        failed: false,
    }
}

const NONE: Outcome = st(None, None);
const FAILED: Outcome = Outcome {
    previous: None,
    current: None,
    failed: true,
};

#[derive(Clone, Debug)]
struct Case {
    name: &'static str,
    in_place: bool,
    max_restarts: i32,
    replicated: &'static [Rj],
    before: Outcome,
    /// `status.restarts`, `status.restartsCountTowardsMax`.
    recreations: (i32, i32),
    pods: &'static [PodCase],
    /// The status JobSet's controller ends with.
    upstream: Outcome,
}

const fn case(name: &'static str, max_restarts: i32, replicated: &'static [Rj]) -> Case {
    Case {
        name,
        in_place: true,
        max_restarts,
        replicated,
        before: NONE,
        recreations: (0, 0),
        pods: &[],
        upstream: NONE,
    }
}

impl Case {
    const fn before(mut self, before: Outcome) -> Case {
        self.before = before;
        self
    }
    const fn recreations(mut self, restarts: i32, counted: i32) -> Case {
        self.recreations = (restarts, counted);
        self
    }
    const fn pods(mut self, pods: &'static [PodCase]) -> Case {
        self.pods = pods;
        self
    }
    /// The status after; unchanged unless said.
    const fn upstream(mut self, after: Outcome) -> Case {
        self.upstream = after;
        self
    }
    const fn unchanged(mut self) -> Case {
        self.upstream = self.before;
        self
    }
    const fn recreate_strategy(mut self) -> Case {
        self.in_place = false;
        self
    }
}

const ONE: &[Rj] = &[(1, 1, Some(1))];
const TWO: &[Rj] = &[(2, 1, Some(1))];
const THREE: &[Rj] = &[(3, 1, Some(1))];

const P: Option<i32> = None;

const CASES: &[Case] = &[
        // TestIsInPlaceRestartStrategy: the strategy decides whether the logic runs at all (the
        // test's JobSets have no pods).
        case("TestIsInPlaceRestartStrategy/in-place restart strategy", 0, ONE).unchanged(),
        case("TestIsInPlaceRestartStrategy/recreate strategy", 0, ONE)
            .recreate_strategy()
            .unchanged(),
        // TestGetMaxContainerRestartCount: the maximum restart count over all containers, init
        // containers included. maxRestarts is set one below the expected maximum, so that the
        // JobSet fails (as upstream's reconcile then does) only where the maximum is computed as
        // upstream computes it; with no pods the maximum is 0 and nothing happens.
        case("TestGetMaxContainerRestartCount/single pod single container", 4, ONE)
            .pods(&[bare("pod-1").restarts(&[5])])
            .upstream(FAILED),
        case("TestGetMaxContainerRestartCount/multiple pods multiple containers", 3, TWO)
            .pods(&[bare("pod-1").restarts(&[1, 3]), bare("pod-2").restarts(&[2, 4])])
            .upstream(FAILED),
        case("TestGetMaxContainerRestartCount/init containers", 9, ONE)
            .pods(&[bare("pod-1").init_restarts(&[10]).restarts(&[5])])
            .upstream(FAILED),
        case("TestGetMaxContainerRestartCount/no pods", 0, ONE).unchanged(),
        // TestGetInPlaceRestartAttempts: the attempts read from the pods; upstream's reconcile
        // then decides on them (maxRestarts 3 throughout).
        case("TestGetInPlaceRestartAttempts/pods with valid annotations", 3, TWO)
            // [0, 1]: a mismatch, previous = max - 1.
            .pods(&[at("pod-1", "0"), at("pod-2", "1")])
            .upstream(st(Some(0), P)),
        case("TestGetInPlaceRestartAttempts/pods with missing annotations", 3, TWO)
            // [1], one pod of two missing: previous = 0.
            .pods(&[bare("pod-1"), at("pod-2", "1")])
            .upstream(st(Some(0), P)),
        case("TestGetInPlaceRestartAttempts/pods with invalid integer annotations", 3, ONE)
            // An error: upstream's reconcile writes nothing.
            .pods(&[at("pod-1", "invalid")])
            .unchanged(),
        case("TestGetInPlaceRestartAttempts/pods with negative integer annotations", 3, ONE)
            .pods(&[at("pod-1", "-1")])
            .unchanged(),
        case("TestGetInPlaceRestartAttempts/failed pod is skipped", 3, ONE)
            // The failed pod's copy (pod-1) is the JobSet's one pod: [1], all in sync, current 1.
            .pods(&[at("pod-1", "1"), at("pod-2", "1").failed()])
            .upstream(st(P, Some(1))),
        case("TestGetInPlaceRestartAttempts/no pods", 3, TWO).unchanged(),
        // TestExceededMaxRestarts: attempts and recreations against maxRestarts. Where not
        // exceeded, the attempts differ and upstream's reconcile sets previous = max - 1.
        case("TestExceededMaxRestarts/max restarts exceeded with 0 job recreations", 1, TWO)
            .pods(&[at("pod-1", "1"), at("pod-2", "2")])
            .upstream(FAILED),
        case("TestExceededMaxRestarts/max restarts not exceeded with 0 job recreations", 2, TWO)
            .pods(&[at("pod-1", "1"), at("pod-2", "2")])
            .upstream(st(Some(1), P)),
        case("TestExceededMaxRestarts/max restarts exceeded with 1 job recreation", 1, TWO)
            .recreations(1, 1)
            .pods(&[at("pod-1", "1"), at("pod-2", "2")])
            .upstream(FAILED),
        case("TestExceededMaxRestarts/max restarts not exceeded with 1 job recreation", 2, TWO)
            .recreations(1, 1)
            .pods(&[at("pod-1", "1"), at("pod-2", "2")])
            .upstream(st(Some(1), P)),
        case("TestExceededMaxRestarts/max restarts exceeded with uncounted restarts", 1, TWO)
            .recreations(2, 1)
            .pods(&[at("pod-1", "2"), at("pod-2", "3")])
            .upstream(FAILED),
        case("TestExceededMaxRestarts/max restarts not exceeded with uncounted restarts", 1, TWO)
            .recreations(2, 1)
            .pods(&[at("pod-1", "1"), at("pod-2", "2")])
            .upstream(st(Some(1), P)),
        // TestGetTotalNumberOfPods: the expected pod count (every pod at attempt 0 here, so that
        // the count decides whether current is written), or an error for a replicatedJob whose
        // completions are not its parallelism: upstream's reconcile then writes nothing.
        case(
            "TestGetTotalNumberOfPods/valid replicated jobs",
            3,
            &[(2, 2, Some(2)), (1, 3, Some(3))],
        )
        .pods(&[
            at("pod-1", "0"),
            at("pod-2", "0"),
            at("pod-3", "0"),
            at("pod-4", "0"),
            at("pod-5", "0"),
            at("pod-6", "0"),
            at("pod-7", "0"),
        ])
        .upstream(st(P, Some(0))),
        case(
            "TestGetTotalNumberOfPods/invalid replicated job (completions != parallelism)",
            3,
            &[(1, 2, Some(1))],
        )
        .pods(&[at("pod-1", "0"), at("pod-2", "0")])
        .unchanged(),
        case(
            "TestGetTotalNumberOfPods/invalid replicated job (nil completions)",
            3,
            &[(1, 2, None)],
        )
        .pods(&[at("pod-1", "0"), at("pod-2", "0")])
        .unchanged(),
        // TestAllEqual: one pod per value, as many pods as the JobSet expects; all equal sets
        // current, a mismatch sets previous = max - 1, no attempt at all does nothing.
        case("TestAllEqual/empty slice", 3, TWO)
            .pods(&[bare("pod-1"), bare("pod-2")])
            .unchanged(),
        case("TestAllEqual/single value", 3, ONE)
            .pods(&[at("pod-1", "1")])
            .upstream(st(P, Some(1))),
        case("TestAllEqual/all equal values", 3, THREE)
            .pods(&[at("pod-1", "1"), at("pod-2", "1"), at("pod-3", "1")])
            .upstream(st(P, Some(1))),
        case("TestAllEqual/different values", 3, THREE)
            .pods(&[at("pod-1", "1"), at("pod-2", "2"), at("pod-3", "1")])
            .upstream(st(Some(1), P)),
        // TestUpdateCurrentInPlaceRestartAttempt: every pod at one attempt.
        case("TestUpdateCurrentInPlaceRestartAttempt/update status", 3, TWO)
            .before(st(P, Some(0)))
            .pods(&[at("pod-1", "1"), at("pod-2", "1")])
            .upstream(st(P, Some(1))),
        case("TestUpdateCurrentInPlaceRestartAttempt/no update needed", 3, TWO)
            .before(st(P, Some(1)))
            .pods(&[at("pod-1", "1"), at("pod-2", "1")])
            .unchanged(),
        case(
            "TestUpdateCurrentInPlaceRestartAttempt/nil current attempt (all attempts 0) (JobSet synced for the first time since creation)",
            3,
            TWO,
        )
        .pods(&[at("pod-1", "0"), at("pod-2", "0")])
        .upstream(st(P, Some(0))),
        // TestUpdatePreviousInPlaceRestartAttempt: attempts that are not all in (one pod more is
        // expected than the attempts given, and has not registered), so that upstream's
        // reconcile goes to the previous attempt.
        case(
            "TestUpdatePreviousInPlaceRestartAttempt/update status (max - 1 > current)",
            3,
            THREE,
        )
        .before(st(Some(0), P))
        .pods(&[at("pod-1", "2"), at("pod-2", "1"), bare("pod-3")])
        .upstream(st(Some(1), P)),
        case(
            "TestUpdatePreviousInPlaceRestartAttempt/no update needed (max - 1 == current)",
            3,
            THREE,
        )
        .before(st(Some(1), P))
        .pods(&[at("pod-1", "2"), at("pod-2", "1"), bare("pod-3")])
        .unchanged(),
        case(
            "TestUpdatePreviousInPlaceRestartAttempt/no update needed (max - 1 < current)",
            3,
            TWO,
        )
        .before(st(Some(1), P))
        .pods(&[at("pod-1", "1"), bare("pod-2")])
        .unchanged(),
        case("TestUpdatePreviousInPlaceRestartAttempt/empty attempts", 3, TWO)
            .pods(&[bare("pod-1"), bare("pod-2")])
            .unchanged(),
        case(
            "TestUpdatePreviousInPlaceRestartAttempt/empty previous attempt (first restart)",
            3,
            THREE,
        )
        .pods(&[at("pod-1", "0"), at("pod-2", "1"), bare("pod-3")])
        .upstream(st(Some(0), P)),
        // TestGetAssociatedPods: the pods labelled with the JobSet's name are its pods (none
        // annotated in the test: nothing to write).
        case("TestGetAssociatedPods/pods associated with jobset", 3, TWO)
            .pods(&[bare("pod-1"), bare("pod-2")])
            .unchanged(),
        case("TestGetAssociatedPods/some pods not associated with jobset", 3, ONE)
            .pods(&[
                bare("pod-1"),
                bare("pod-2").of(Some("other-jobset")),
                bare("pod-3").of(None),
            ])
            .unchanged(),
        case("TestGetAssociatedPods/no pods", 3, ONE).unchanged(),
        // TestReconcileInPlaceRestart: the whole evaluation, as upstream states it.
        case(
            "TestReconcileInPlaceRestart/JobSet failed because a container exceeded max restarts",
            1,
            ONE,
        )
        .pods(&[bare("pod-1").restarts(&[2])])
        .upstream(FAILED),
        case(
            "TestReconcileInPlaceRestart/JobSet failed because a Pod in-place restart attempt exceeded max restarts",
            1,
            ONE,
        )
        .pods(&[at("pod-1", "2")])
        .upstream(FAILED),
        case(
            "TestReconcileInPlaceRestart/Current in-place restart attempt was updated because all Pods are in sync (Pod synced for the first time ever)",
            3,
            TWO,
        )
        .pods(&[at("pod-1", "0"), at("pod-2", "0")])
        .upstream(st(P, Some(0))),
        case(
            "TestReconcileInPlaceRestart/Current in-place restart attempt was updated because all Pods are in sync (Pod just finished syncing after the first restart)",
            3,
            TWO,
        )
        .before(st(Some(0), Some(0)))
        .pods(&[at("pod-1", "1"), at("pod-2", "1")])
        .upstream(st(Some(0), Some(1))),
        case(
            "TestReconcileInPlaceRestart/No need to fail JobSet or update status (JobSet just got created and is waiting for Pods to become in sync) #1 (no pods)",
            3,
            TWO,
        )
        .unchanged(),
        case(
            "TestReconcileInPlaceRestart/No need to fail JobSet or update status (JobSet just got created and is waiting for Pods to become in sync) #2 (one pod, not annotated)",
            3,
            TWO,
        )
        .pods(&[bare("pod-1")])
        .unchanged(),
        case(
            "TestReconcileInPlaceRestart/No need to fail JobSet or update status (JobSet just got created and is waiting for Pods to become in sync) #3 (one of two annotated)",
            3,
            TWO,
        )
        .pods(&[at("pod-1", "0"), bare("pod-2")])
        .unchanged(),
        case(
            "TestReconcileInPlaceRestart/No need to fail JobSet or update status (JobSet just got created and is waiting for Pods to become in sync) #4 (none annotated)",
            3,
            TWO,
        )
        .pods(&[bare("pod-1"), bare("pod-2")])
        .unchanged(),
        case(
            "TestReconcileInPlaceRestart/Updated previous in-place restart attempt because all Pods were in sync but one of them just restarted #1",
            3,
            TWO,
        )
        .before(st(P, Some(0)))
        .pods(&[at("pod-1", "0"), at("pod-2", "1")])
        .upstream(st(Some(0), Some(0))),
        case(
            "TestReconcileInPlaceRestart/Updated previous in-place restart attempt because all Pods were in sync but one of them just restarted #2",
            3,
            TWO,
        )
        .before(st(Some(0), Some(1)))
        .pods(&[at("pod-1", "1"), at("pod-2", "2")])
        .upstream(st(Some(1), Some(1))),
];

/// The number of cases in upstream's file (`name:` fields in `in_place_restart_test.go`).
const UPSTREAM_CASES: usize = 46;

/// Where our reconciler, as the only writer, ends with another status than JobSet's controller:
/// the case, our status, why.
const DIFFERENCES: &[(&str, Outcome, &str)] = &[
    (
        "TestGetInPlaceRestartAttempts/failed pod is skipped",
        st(Some(0), Some(1)),
        PREVIOUS_REWRITTEN,
    ),
    (
        "TestAllEqual/single value",
        st(Some(0), Some(1)),
        PREVIOUS_REWRITTEN,
    ),
    (
        "TestAllEqual/all equal values",
        st(Some(0), Some(1)),
        PREVIOUS_REWRITTEN,
    ),
    (
        "TestUpdateCurrentInPlaceRestartAttempt/update status",
        st(Some(0), Some(1)),
        PREVIOUS_REWRITTEN,
    ),
    (
        "TestUpdateCurrentInPlaceRestartAttempt/no update needed",
        st(Some(0), Some(1)),
        PREVIOUS_REWRITTEN,
    ),
];

/// Every pod at one attempt above the first (0) with no previous attempt in the status: upstream
/// writes current only; we also write previous = attempt - 1, because an absent previous field
/// cannot be told from one another writer wiped, and a wiped field is rewritten from the pods'
/// attempts (protocol.md, Safety 3; `reconcile_decide`: "a wiped deprecated field is rewritten
/// even while in sync"). Harmless: every pod is above it.
const PREVIOUS_REWRITTEN: &str = "absent previous read as wiped: rewritten as max attempt - 1 \
                                  (protocol.md, Safety 3); upstream leaves it unset";

// ---------------------------------------------------------------------------------------------
// Running them
// ---------------------------------------------------------------------------------------------

fn namespace(i: usize) -> String {
    format!("case-{i:02}")
}

fn outcome(server: &TestApiServer, ns: &str) -> Outcome {
    let js = server.get("jobsets", ns, JOBSET).expect("jobset");
    let status = &js["status"];
    let field = |f: &str| status[f].as_i64().map(|v| i32::try_from(v).expect("i32"));
    let failed = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Failed" && c["status"] == "True");
    Outcome {
        previous: field(Dialect::Attempt.deprecated_field()),
        current: field(Dialect::Attempt.synced_field()),
        failed,
    }
}

fn events(server: &TestApiServer, ns: &str) -> Vec<String> {
    let mut all = server.list("events.events.k8s.io", Some(ns));
    all.extend(server.list("events", Some(ns)));
    all.iter()
        .filter_map(|e| e["reason"].as_str().map(str::to_owned))
        .collect()
}

fn settings(write_epoch_status: bool) -> Settings {
    Settings {
        write_epoch_status,
        ..jobset_inplace_testkit::reconciler::settings(Dialect::Attempt, "parity")
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one run leaves: per case, its status after and how many writes the reconciler made to
/// its JobSet (any subresource).
struct Run {
    server: TestApiServer,
    cases: &'static [Case],
    jobset_writes: Vec<usize>,
}

/// Loads every case, runs the reconciler until it has evaluated them all and gone quiet, and
/// stops it.
async fn run(write_epoch_status: bool) -> Run {
    let cases = CASES;
    assert_eq!(cases.len(), UPSTREAM_CASES, "one case per upstream case");
    let server = TestApiServer::start().await;
    for (i, c) in cases.iter().enumerate() {
        let ns = namespace(i);
        let replicated =
            c.replicated
                .iter()
                .enumerate()
                .map(|(i, (replicas, parallelism, completions))| {
                    let rj = ReplicatedJob::new(&format!("rj-{}", i + 1))
                        .replicas(i64::from(*replicas))
                        .parallelism(i64::from(*parallelism));
                    match completions {
                        Some(n) => rj.completions(i64::from(*n)),
                        None => rj.no_completions(),
                    }
                });
        let dialect = Dialect::Attempt;
        let mut js = JobSet::new(JOBSET)
            .namespace(&ns)
            .strategy(if c.in_place {
                IN_PLACE_RESTART
            } else {
                "Recreate"
            })
            .max_restarts(i64::from(c.max_restarts))
            .replicated_jobs(replicated)
            .status(
                json!({"restarts": c.recreations.0, "restartsCountTowardsMax": c.recreations.1}),
            );
        if let Some(p) = c.before.previous {
            js = js.status_field(dialect.deprecated_field(), json!(p));
        }
        if let Some(s) = c.before.current {
            js = js.status_field(dialect.synced_field(), json!(s));
        }
        server.create("jobsets", js.build()).expect("jobset");
        for p in c.pods {
            let statuses = |counts: &[i32], prefix: &str| -> Vec<Value> {
                counts
                    .iter()
                    .enumerate()
                    .map(|(i, n)| json!({"name": format!("{prefix}{i}"), "restartCount": n}))
                    .collect()
            };
            let mut pod = Pod::new(p.name).namespace(&ns).status(json!({
                "phase": p.phase,
                "containerStatuses": statuses(p.restart_counts, "w"),
                "initContainerStatuses": statuses(p.init_restart_counts, "i"),
            }));
            if let Some(jobset) = p.jobset {
                pod = pod.of_jobset(jobset);
            }
            if let Some(attempt) = p.attempt {
                pod = pod.annotation(dialect.pod_annotation(), attempt);
            }
            let pod = pod.build();
            let pod = if p.jobset == Some(JOBSET) {
                jobset_inplace_testkit::reconciler::member_of(&server, pod)
            } else {
                pod
            };
            server.create("pods", pod).expect("pod");
        }
        // The status before is the one given (the store keeps a created object's status).
        assert_eq!(outcome(&server, &ns), c.before, "{}: status before", c.name);
    }

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let reconciles = metrics.reconciles.clone();
    let (_leader_tx, leader) = tokio::sync::watch::channel(true);
    let controller = Controller::start(
        server.client(),
        settings(write_epoch_status),
        metrics,
        leader,
    );

    // Evaluated: caches synced, every JobSet in the index, every InPlaceRestart one evaluated
    // (one evaluation each at least) and given its JobSetEpoch object (published after its
    // evaluation), the Recreate one given none, nothing queued.
    let in_place = cases.iter().filter(|c| c.in_place).count();
    until("caches synced", || controller.is_ready()).await;
    until("every JobSet evaluated and published", || {
        let s = controller.state_sizes();
        s.jobsets == cases.len()
            && s.published == in_place
            && reconciles.get() >= in_place as u64
            && s.queued == 0
    })
    .await;
    // Anything its own writes set off settles too: no write for a while, nothing queued.
    let seen = Cell::new(server.writes().len());
    let quiet_since = Cell::new(tokio::time::Instant::now());
    until("quiet", || {
        let now = server.writes().len();
        if now != seen.get() || controller.state_sizes().queued != 0 {
            seen.set(now);
            quiet_since.set(tokio::time::Instant::now());
        }
        quiet_since.get().elapsed() >= Duration::from_millis(500)
    })
    .await;
    controller.shutdown().await;

    for (i, c) in cases.iter().enumerate() {
        let ns = namespace(i);
        let published = server.get("jobsetepochs", &ns, JOBSET).is_some();
        assert_eq!(published, c.in_place, "{}: JobSetEpoch object", c.name);
    }
    let writes = server.writes();
    let jobset_writes = (0..cases.len())
        .map(|i| {
            let ns = namespace(i);
            writes
                .iter()
                .filter(|w| w.namespace.as_deref() == Some(ns.as_str()))
                .filter(|w| w.resource == "jobsets" || w.resource.starts_with("jobsets/"))
                .count()
        })
        .collect();
    Run {
        server,
        cases,
        jobset_writes,
    }
}

/// Malformed annotations and unservable JobSets are reported, in both modes: the reconciler
/// read those pods and JobSets.
fn check_reported(r: &Run) {
    for (i, c) in r.cases.iter().enumerate() {
        let malformed = c.pods.iter().any(|p| {
            p.phase != "Failed"
                && p.jobset == Some(JOBSET)
                && p.attempt.is_some_and(|a| a.parse::<u32>().is_err())
        });
        let unservable = c.replicated.iter().any(|(_, p, c)| *c != Some(*p));
        let reasons = events(&r.server, &namespace(i));
        let reported = |reason: &str| reasons.iter().any(|r| r == reason);
        assert_eq!(
            reported("MalformedEpoch"),
            malformed,
            "{}: MalformedEpoch event",
            c.name
        );
        assert_eq!(
            reported("InPlaceRestartNotServable"),
            unservable,
            "{}: InPlaceRestartNotServable event",
            c.name
        );
    }
}

async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("test took too long");
}

/// `--write-epoch-status=false`: whatever JobSet's controller would write, ours writes nothing to
/// any JobSet's status, in every upstream case, and still evaluates each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_writes_no_jobset_status_in_any_upstream_case() {
    bounded(async {
        let r = run(false).await;
        for (i, c) in r.cases.iter().enumerate() {
            assert_eq!(r.jobset_writes[i], 0, "{}: a write to the JobSet", c.name);
            assert_eq!(outcome(&r.server, &namespace(i)), c.before, "{}", c.name);
        }
        let counters = r.server.counters();
        for verb in [Verb::Patch, Verb::Update] {
            assert_eq!(
                counters.get(verb, "jobsets/status"),
                0,
                "{verb:?} jobsets/status"
            );
            assert_eq!(counters.get(verb, "jobsets"), 0, "{verb:?} jobsets");
        }
        // Not vacuous: where JobSet's controller writes something, ours had something to
        // write had it been the writer (the other test shows it does).
        let upstream_writes = r.cases.iter().filter(|c| c.upstream != c.before).count();
        assert_eq!(upstream_writes, 26, "cases where upstream writes");
        check_reported(&r);
    })
    .await;
}

/// `--write-epoch-status=true`: our status after each upstream case is upstream's, or differs as
/// listed in [`DIFFERENCES`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_the_only_writer_each_upstream_case_ends_as_upstream_or_as_listed() {
    bounded(async {
        let r = run(true).await;
        for (name, _, _) in DIFFERENCES {
            assert!(
                r.cases.iter().any(|c| c.name == *name),
                "difference for an unknown case {name}"
            );
        }
        let mut unexplained = Vec::new();
        for (i, c) in r.cases.iter().enumerate() {
            let ours = outcome(&r.server, &namespace(i));
            // A write where the status moved, none where it did not.
            assert_eq!(
                r.jobset_writes[i] > 0,
                ours != c.before,
                "{}: {} writes, {:?} -> {:?}",
                c.name,
                r.jobset_writes[i],
                c.before,
                ours
            );
            let listed = DIFFERENCES.iter().find(|(name, _, _)| *name == c.name);
            match listed {
                None if ours == c.upstream => {}
                Some((_, expected, _)) if ours != c.upstream && ours == *expected => {}
                _ => unexplained.push(format!(
                    "{}: ours {ours:?}, upstream {:?}, listed {:?}",
                    c.name,
                    c.upstream,
                    listed.map(|l| l.1)
                )),
            }
        }
        assert!(unexplained.is_empty(), "{}", unexplained.join("\n"));
        check_reported(&r);
    })
    .await;
}
