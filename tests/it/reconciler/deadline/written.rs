//! Pods and Jobs written by the test

use super::*;

/// `pod` with the `job-name` label and the controller reference of the Job `job`, as the Job
/// controller creates it.
fn of_job(server: &TestApiServer, mut pod: Value, job: &str) -> Value {
    pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = json!(job);
    member_of(server, pod)
}

/// (c) and observe mode: JobSet's own controller writes the epochs (`--write-epoch-status=false`,
/// the attempt dialect), the JobSet's annotation sets a 1 s timeout (the reconciler's is 2 m).
/// One pod never registers: it is deleted with its UID as the precondition after 1 s; nothing
/// replaces it here, so 1 s later the reconciler raises `status.restarts` (a first write meets a
/// conflict and is decided again: the count goes up by one, not two) and deletes, in the
/// foreground, exactly the JobSet's Jobs of earlier restarts. It writes nothing else of the
/// status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_recreation_writes_and_deletes_with_jobsets_controller_writing_the_epochs() {
    bounded(async {
        let dialect = Dialect::Attempt;
        let server = Arc::new(TestApiServer::start().await);
        let js = server.create("jobsets", JobSet::new("js").namespace(NS).replicas(2).max_restarts(5).annotation(TIMEOUT_ANNOTATION, "1s").build()).expect("jobset");
        let uid = js["metadata"]["uid"].as_str().expect("uid").to_owned();
        for (name, owner, attempt) in [
            ("js-w-0", uid.as_str(), "0"),
            ("js-w-1", uid.as_str(), "0"),
            ("other", "another-jobset", "0"),
        ] {
            server.create("jobs", Job::new(name).namespace(NS).of_jobset("js", owner).label(RESTART_ATTEMPT_LABEL, attempt).build()).expect("job");
        }
        server.create("pods", of_job(&server, Pod::worker(NS, "js", "js-0").running().build(), "js-w-0")).expect("pod");
        server.create("pods", of_job(&server, Pod::worker(NS, "js", "js-1").running().build(), "js-w-1")).expect("pod");
        let mut opts = options(dialect, Some(Duration::from_secs(120)), "r1");
        opts.settings.write_epoch_status = false;
        let r = Running::start(server.client_named("reconciler"), opts).await;
        // JobSet's controller syncs 0; pod 0 restarts; it deprecates 0.
        set_epoch(&server, dialect, "js-0", 0);
        set_epoch(&server, dialect, "js-1", 0);
        let write = |status: Value| {
            server
                .patch("jobsets", NS, "js", &json!({"status": status}))
                .expect("status");
        };
        write(json!({"currentInPlaceRestartAttempt": 0}));
        set_epoch(&server, dialect, "js-0", 1);
        write(json!({"previousInPlaceRestartAttempt": 0}));
        let started = Instant::now();
        until("the unregistered pod deleted", Duration::from_secs(1) + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        assert!(started.elapsed() >= Duration::from_millis(900));
        // The test API server records a write once its handler returns, just after the store
        // changed: the pod can be seen gone before its delete is recorded (a CI run under load).
        until("the reconciler's delete recorded", SLACK, || {
            !deletes_by_reconciler(&server, "pods").is_empty()
        })
        .await;
        assert_eq!(deletes_by_reconciler(&server, "pods"), ["js-1"]);
        assert!(server.get("pods", NS, "js-0").is_some());
        // Marked Failed first, so that its Job (podReplacementPolicy: Failed) replaces it.
        let marked: Vec<_> = server
            .writes()
            .into_iter()
            .filter(|w| w.client.as_deref() == Some("reconciler") && w.resource == "pods/status")
            .filter_map(|w| w.name)
            .collect();
        assert_eq!(marked, ["js-1"]);
        // The recreation's status write meets a conflict first.
        server.fail_next(1, Verb::Patch, "jobsets/status", 409);
        until("the restart counted", Duration::from_secs(1) + SLACK, || {
            server.get("jobsets", NS, "js").is_some_and(|j| j["status"]["restarts"] == 1)
        })
        .await;
        until("the Jobs deleted", WAIT, || deletes_by_reconciler(&server, "jobs").len() == 2).await;
        let writes: Vec<_> = server
            .writes()
            .into_iter()
            .filter(|w| w.client.as_deref() == Some("reconciler") && w.resource == "jobsets/status")
            .collect();
        assert_eq!(writes.len(), 1, "one status write (the conflict is not applied): {writes:?}");
        // The recreated pods register and JobSet's controller syncs: the deadline is over.
        server.create("jobs", Job::new("js-w-0-1").namespace(NS).of_jobset("js", &uid).label(RESTART_ATTEMPT_LABEL, "1").build()).expect("job");
        let mut replacement = of_job(&server, Pod::worker(NS, "js", "js-2").running().build(), "js-w-0-1");
        replacement["metadata"]["annotations"][dialect.pod_annotation()] = json!("1");
        server.create("pods", replacement).expect("pod");
        write(json!({"currentInPlaceRestartAttempt": 1}));
        let js = server.get("jobsets", NS, "js").expect("jobset");
        assert_eq!(js["status"]["restartsCountTowardsMax"], 1);
        assert_eq!(js["status"]["previousInPlaceRestartAttempt"], 0);
        assert!(js["status"]["conditions"].is_null(), "{}", js["status"]);
        let mut deleted = deletes_by_reconciler(&server, "jobs");
        deleted.sort();
        assert_eq!(deleted, ["js-w-0", "js-w-1"]);
        for name in ["js-w-0", "js-w-1"] {
            let j = server.get("jobs", NS, name).expect("being deleted");
            assert!(j["metadata"]["deletionTimestamp"].is_string());
            assert_eq!(j["metadata"]["finalizers"], json!(["foregroundDeletion"]));
        }
        let other = server.get("jobs", NS, "other").expect("another JobSet's Job");
        assert!(other["metadata"]["deletionTimestamp"].is_null());
        for reason in ["GroupRestartTimedOut", "UnregisteredPodsDeleted", "FallingBackToRecreate"] {
            until(reason, WAIT, || !events(&server, NS, reason).is_empty()).await;
        }
        assert!(note(&server, NS, "GroupRestartTimedOut").await.contains("within 1s"));
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        assert_eq!(r.sample_reaching(&step("recreated"), 1.0).await, 1.0);
        assert_eq!(r.sample(PODS_DELETED).await, 1.0);
        assert_eq!(r.sample(JOBS_DELETED).await, 2.0);
        let metrics = r.metrics().await;
        assert!(metrics.contains("jobset_inplace_reconciler_status_writes_total{field=\"restarts\",result=\"conflict\"} 1"), "{metrics}");
        r.stop().await;
    })
    .await;
}

/// A malformed annotation is said once, as a Warning, and the reconciler's timeout applies; a
/// `0` turns the deadline off for that JobSet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_annotation_is_a_warning_and_the_default_applies() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let server = TestApiServer::start().await;
        store_with_running_pods(
            &server,
            NS,
            JobSet::new("js")
                .namespace(NS)
                .replicas(2)
                .max_restarts(5)
                .annotation(TIMEOUT_ANNOTATION, "soon")
                .build(),
            &["js-0", "js-1"],
        );
        let r = Running::start(
            server.client_named("reconciler"),
            options(dialect, Some(Duration::from_secs(1)), "r1"),
        )
        .await;
        until("the warning", WAIT, || {
            !events(&server, NS, "InvalidGroupRestartTimeout").is_empty()
        })
        .await;
        let warning = &events(&server, NS, "InvalidGroupRestartTimeout")[0];
        assert_eq!(warning["type"], "Warning");
        let text = warning["note"].as_str().unwrap_or_default();
        assert!(
            text.contains("\"soon\"") && text.contains("default (1s)"),
            "{text}"
        );
        // The default (1 s) applies: the unregistered pod goes.
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced", WAIT, || {
            server
                .get("jobsets", NS, "js")
                .is_some_and(|j| j["status"]["syncedEpoch"] == 1)
        })
        .await;
        set_epoch(&server, dialect, "js-0", 2);
        until("js-1 deleted", Duration::from_secs(1) + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        // 0: off. A new pod that never registers stays.
        server
            .patch(
                "jobsets",
                NS,
                "js",
                &json!({"metadata": {"annotations": {TIMEOUT_ANNOTATION: "0"}}}),
            )
            .expect("annotation");
        server
            .create(
                "pods",
                member_of(&server, Pod::worker(NS, "js", "js-2").running().build()),
            )
            .expect("pod");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(server.get("pods", NS, "js-2").is_some());
        assert_eq!(events(&server, NS, "InvalidGroupRestartTimeout").len(), 1);
        assert_eq!(r.sample(&step("recreated")).await, 0.0);
        r.stop().await;
    })
    .await;
}

/// Another writer wipes the epoch fields during the group restart (JobSet's own controller does,
/// in the `epoch` dialect, with every status it writes): the reconciler writes them again, and the
/// deadline keeps its clock: the unregistered pod goes one window after the deprecation, however
/// often the fields are wiped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wipes_of_the_epoch_fields_do_not_postpone_the_deadline() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let timeout = Duration::from_secs(3);
        let server = TestApiServer::start().await;
        store_with_running_pods(
            &server,
            NS,
            JobSet::new("js")
                .namespace(NS)
                .replicas(2)
                .max_restarts(5)
                .annotation(TIMEOUT_ANNOTATION, "3s")
                .build(),
            &["js-0", "js-1"],
        );
        let r = Running::start(
            server.client_named("reconciler"),
            options(dialect, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        let field = |f: &str| {
            server
                .get("jobsets", NS, "js")
                .and_then(|j| j["status"][f].as_i64())
        };
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced", WAIT, || field("syncedEpoch") == Some(1)).await;
        set_epoch(&server, dialect, "js-0", 2);
        until("deprecated", WAIT, || field("deprecatedEpoch") == Some(1)).await;
        let started = Instant::now();
        let wipe = || {
            let mut js = server.get("jobsets", NS, "js").expect("jobset");
            if let Some(status) = js["status"].as_object_mut() {
                status.remove("deprecatedEpoch");
                status.remove("syncedEpoch");
            }
            if let Some(meta) = js["metadata"].as_object_mut() {
                meta.remove("resourceVersion");
            }
            server.put("jobsets", js).expect("wipe");
        };
        for at in [Duration::from_secs(1), Duration::from_millis(2_500)] {
            tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
            wipe();
            until("rewritten", WAIT, || field("deprecatedEpoch") == Some(1)).await;
        }
        until("js-1 deleted", timeout + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        let took = started.elapsed();
        // Had a wipe restarted the clock, js-1 would have gone 3 s after the last wipe, at 5.5 s.
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(1_500),
            "deleted {took:?} after the deprecation"
        );
        assert_eq!(
            r.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        r.stop().await;
    })
    .await;
}

/// The clock is kept by every replica from its JobSet watch: a standby that takes over the
/// lease during a group restart acts when the first window ends, not a window after it took
/// over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_takes_over_keeps_the_clock() {
    bounded(async {
        let dialect = Dialect::Epoch;
        let timeout = Duration::from_secs(4);
        let server = TestApiServer::start().await;
        store_with_running_pods(
            &server,
            NS,
            JobSet::new("js")
                .namespace(NS)
                .replicas(2)
                .max_restarts(5)
                .build(),
            &["js-0", "js-1"],
        );
        let lease = |identity: &str| {
            let mut o = options(dialect, Some(timeout), identity);
            o.leader_election = Some(LeaderElection {
                lease_name: "deadline-test".to_owned(),
                lease_namespace: "default".to_owned(),
                duration: Duration::from_secs(2),
                grace: Duration::from_secs(1),
            });
            o
        };
        let a = Running::start(server.client_named("reconciler"), lease("a")).await;
        for p in ["js-0", "js-1"] {
            set_epoch(&server, dialect, p, 1);
        }
        until("synced by a", WAIT, || {
            server
                .get("jobsets", NS, "js")
                .is_some_and(|j| j["status"]["syncedEpoch"] == 1)
        })
        .await;
        let b = Running::start(server.client_named("reconciler"), lease("b")).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        set_epoch(&server, dialect, "js-0", 2);
        until("deprecated by a", WAIT, || {
            server
                .get("jobsets", NS, "js")
                .is_some_and(|j| j["status"]["deprecatedEpoch"] == 1)
        })
        .await;
        let started = Instant::now();
        // a leaves a second before the window ends; b takes over.
        tokio::time::sleep(timeout - Duration::from_secs(1)).await;
        assert!(server.get("pods", NS, "js-1").is_some());
        a.stop().await;
        let deadline = Instant::now() + WAIT;
        while b.sample("jobset_inplace_reconciler_is_leader").await < 1.0 {
            assert!(Instant::now() < deadline, "b never took over");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took_over = Instant::now();
        until("js-1 deleted by b", timeout + SLACK, || {
            server.get("pods", NS, "js-1").is_none()
        })
        .await;
        let took = started.elapsed();
        // Without the standby's clock, b would wait a whole window after taking over.
        assert!(took >= timeout, "deleted {took:?} after the deprecation");
        assert!(
            took_over.elapsed() < timeout / 2,
            "deleted {:?} after taking over, {took:?} after the deprecation",
            took_over.elapsed()
        );
        assert_eq!(
            b.sample_reaching(&step("unregistered_pods_deleted"), 1.0)
                .await,
            1.0
        );
        b.stop().await;
    })
    .await;
}
