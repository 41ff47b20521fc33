//! The protocol's writes: epochs, restarts, dialects, pods that count

use super::*;

/// KEP-467's integration plan, as one timeline: first sync; all in sync (no write); one pod moves
/// (deprecated written); a second moves but not all (no write); all move (synced written); at
/// most two status writes per group restart; events for each step.
async fn kep_timeline(dialect: Dialect) {
    let w = World::new(dialect, &[(2, 2)], 10).await;
    let r = w.start("r1");
    let first = w.first();
    w.sync_pods(4, first, "first sync").await;
    assert_eq!(w.deprecated(), None, "no restart yet");
    w.quiet("all pods in sync").await;

    let writes = w.status_writes();
    w.set_epoch(0, first + 1);
    w.until("deprecated", |w| w.deprecated() == Some(first))
        .await;
    w.set_epoch(1, first + 1);
    w.quiet("lost sync and a second pod moved").await;
    w.set_epoch(2, first + 1);
    w.set_epoch(3, first + 1);
    w.until("synced", |w| w.synced() == Some(first + 1)).await;
    assert!(
        w.status_writes() - writes <= 2,
        "{} writes for one group restart",
        w.status_writes() - writes
    );
    w.until("events", |w| {
        w.has_event("EpochSynced")
            && w.has_event("GroupRestartStarted")
            && w.has_event("GroupRestartCompleted")
    })
    .await;
    r.stop().await.expect("clean stop");
}

/// Where the JobSetEpoch kind is not served (its CRD missing, the start-up check skipped, or the
/// CRD removed later), the reconciler publishes nothing and still writes the status, which
/// agents then watch: a whole group restart goes through.
#[tokio::test]
async fn without_the_jobsetepoch_kind_the_status_is_written_alone() {
    bounded(async {
        let resources = default_resources()
            .into_iter()
            .filter(|r| r.plural != "jobsetepochs")
            .collect();
        let server = TestApiServer::start_with(ServerOptions {
            resources,
            ..ServerOptions::default()
        })
        .await;
        let w = World::on(server, Dialect::Epoch, &[(2, 1)], 10);
        let r = w.start("r1");
        w.sync_pods(2, 1, "first sync").await;
        w.set_epoch(0, 2);
        w.until("deprecated", |w| w.deprecated() == Some(1)).await;
        w.set_epoch(1, 2);
        w.until("synced", |w| w.synced() == Some(2)).await;
        r.stop().await.expect("clean stop");
    })
    .await;
}

/// A kube-apiserver that is starting answers 404 for a custom resource's kind until its CRD
/// informer has synced. The reconciler took any 404 on the JobSetEpoch kind for "not served" and
/// published nothing more until its watch listed the objects again, which a watch that resumes
/// never does: agents watching the object then waited for ever (the failure matrix's API server
/// row, on real nodes). Here the apply of one group restart's deprecation gets a 404; the status
/// goes on alone, the watch lists again, and the synced epoch is published.
#[tokio::test]
async fn a_passing_404_on_the_jobsetepoch_kind_does_not_stop_the_publication() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        let r = w.start("r1");
        w.sync_pods(2, 1, "first sync").await;
        w.until("published 1", |w| w.published_synced() == Some(1))
            .await;
        let lists = w.server.counters().get(Verb::List, "jobsetepochs");
        w.server.fail_next(1, Verb::Patch, "jobsetepochs", 404);
        w.set_epoch(0, 2);
        w.until("deprecated", |w| w.deprecated() == Some(1)).await;
        w.set_epoch(1, 2);
        w.until("synced in the status", |w| w.synced() == Some(2))
            .await;
        w.until("synced published", |w| w.published_synced() == Some(2))
            .await;
        assert!(
            w.server.counters().get(Verb::List, "jobsetepochs") > lists,
            "the objects listed again after the 404"
        );
        r.stop().await.expect("clean stop");
    })
    .await;
}

#[tokio::test]
async fn kep_integration_plan_epoch_dialect() {
    bounded(kep_timeline(Dialect::Epoch)).await;
}

#[tokio::test]
async fn kep_integration_plan_attempt_dialect() {
    bounded(kep_timeline(Dialect::Attempt)).await;
}

#[tokio::test]
async fn unregistered_failed_and_terminating_pods() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 3)], 10).await;
        let _r = w.start("r1");
        w.set_epoch(0, 1);
        w.set_epoch(1, 1);
        w.quiet("a pod is not registered").await;
        assert_eq!(w.synced(), None);
        // The unregistered pod fails; its replacement registers.
        w.patch_pod(2, json!({"status": {"phase": "Failed"}}));
        w.server
            .create(
                "pods",
                member_of(&w.server, Pod::worker(NS, "js", "js-3").running().build()),
            )
            .expect("replacement");
        w.set_epoch(3, 1);
        w.until("sync with the replacement", |w| w.synced() == Some(1))
            .await;
        // A terminating pod at an old epoch does not hold the group back.
        w.patch_pod(0, json!({"metadata": {"finalizers": ["x/y"]}}));
        w.server.delete("pods", NS, "js-0").expect("delete");
        w.server
            .create(
                "pods",
                member_of(&w.server, Pod::worker(NS, "js", "js-4").running().build()),
            )
            .expect("replacement");
        w.set_epoch(4, 2);
        w.until("deprecated 1", |w| w.deprecated() == Some(1)).await;
        w.set_epoch(1, 2);
        w.set_epoch(3, 2);
        w.until("synced 2", |w| w.synced() == Some(2)).await;
    })
    .await;
}

#[tokio::test]
async fn malformed_annotation_is_a_warning_event() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        let _r = w.start("r1");
        w.set_epoch(0, 1);
        w.set_raw_epoch(1, "one");
        w.until("warning", |w| {
            w.events()
                .iter()
                .any(|e| e["reason"] == "MalformedEpoch" && e["type"] == "Warning")
        })
        .await;
        assert_eq!(w.synced(), None);
        w.set_epoch(1, 1);
        w.until("sync once fixed", |w| w.synced() == Some(1)).await;
    })
    .await;
}

/// Issue 34 item 4: a pod with an epoch of 2147483647 (any pod creator's label and annotation)
/// failed the JobSet as past maxRestarts. Beyond what the protocol can reach, it is a malformed
/// annotation now: a Warning, the pod skipped, the JobSet synced once it is fixed, never failed.
#[tokio::test]
async fn a_labelled_pod_with_an_epoch_beyond_reach_does_not_fail_the_jobset() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        let _r = w.start("r1");
        w.set_epoch(0, 1);
        w.set_epoch(1, 2_147_483_647);
        w.until("warning", |w| {
            w.events().iter().any(|e| {
                e["reason"] == "MalformedEpoch"
                    && e["type"] == "Warning"
                    && e["note"].as_str().is_some_and(|m| m.contains("can reach"))
            })
        })
        .await;
        w.quiet("the pod beyond reach").await;
        assert_ne!(w.stored()["status"]["terminalState"], "Failed");
        assert!(!w.has_event("MaxRestartsExceeded"));
        assert_eq!(w.synced(), None);
        w.set_epoch(1, 1);
        w.until("sync once fixed", |w| w.synced() == Some(1)).await;
        assert_ne!(w.stored()["status"]["terminalState"], "Failed");
    })
    .await;
}

/// Issue 34 item 4: a pod counts toward a JobSet only when one of its Jobs controls it. Pods
/// labelled with the JobSet's name but created by someone else (no controller; a controller
/// reference to a Job of another JobSet), at an epoch beyond reach or one above the synced
/// epoch, neither fail the JobSet nor start a group restart: each is a Warning, said once. The
/// real pods keep counting; a pod seen before its Job counts once the Job is seen.
#[tokio::test]
async fn only_the_pods_of_the_jobsets_jobs_count() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        w.server
            .create(
                "jobsets",
                JobSet::new("other")
                    .namespace(NS)
                    .max_restarts(10)
                    .replicated_jobs([ReplicatedJob::new("rj0")])
                    .build(),
            )
            .expect("other jobset");
        let other = member_of(
            &w.server,
            Pod::worker(NS, "other", "other-0").running().build(),
        );
        w.server.create("pods", other.clone()).expect("other's pod");
        let r = w.start("r1");
        w.sync_pods(2, 1, "first sync").await;

        let stranger = |name: &str, epoch: &str, owner: Option<&Value>| {
            let mut p = Pod::worker(NS, "js", name).running().build();
            p["metadata"]["annotations"][Dialect::Epoch.pod_annotation()] = json!(epoch);
            if let Some(o) = owner {
                p["metadata"]["ownerReferences"] = o.clone();
            }
            w.server.create("pods", p).expect("stranger");
        };
        stranger("forged-max", "2147483647", None);
        stranger("forged-next", "2", None);
        stranger("borrowed", "2", Some(&other["metadata"]["ownerReferences"]));
        let said = |w: &World, pod: &str| {
            w.events()
                .iter()
                .filter(|e| {
                    e["reason"] == "PodNotOfJobSet"
                        && e["type"] == "Warning"
                        && e["note"]
                            .as_str()
                            .is_some_and(|n| n.starts_with(&format!("pod {pod} ")))
                })
                .count()
        };
        w.until("each stranger said", |w| {
            ["forged-max", "forged-next", "borrowed"]
                .iter()
                .all(|p| said(w, p) == 1)
        })
        .await;
        assert!(
            w.events().iter().any(|e| e["note"]
                .as_str()
                .is_some_and(|n| n.contains("belongs to the JobSet other"))),
            "{:?}",
            w.events()
        );
        w.quiet("pods of no Job of the JobSet").await;
        assert_eq!(w.deprecated(), None, "no group restart");
        assert_eq!(w.synced(), Some(1));
        assert_ne!(w.stored()["status"]["terminalState"], "Failed");
        assert!(!w.has_event("MaxRestartsExceeded") && !w.has_event("MalformedEpoch"));

        // The real pods restart as ever.
        w.set_epoch(0, 2);
        w.until("deprecated", |w| w.deprecated() == Some(1)).await;
        w.set_epoch(1, 2);
        w.until("synced", |w| w.synced() == Some(2)).await;

        // A pod seen before its Job: the Job exists, but without the jobset-name label the
        // reconciler's Job watch does not see it yet.
        let stored = w.stored();
        let js_uid = stored["metadata"]["uid"].as_str().expect("uid");
        let late = w
            .server
            .create(
                "jobs",
                Job::new("js-late")
                    .namespace(NS)
                    .owned_by_jobset("js", js_uid)
                    .containers(json!([]))
                    .build(),
            )
            .expect("job");
        let early = Pod::worker(NS, "js", "js-late-0")
            .running()
            .epoch(Dialect::Epoch.pod_annotation(), "3")
            .owned_by_job("js-late", late["metadata"]["uid"].as_str().expect("uid"))
            .build();
        w.server.create("pods", early).expect("pod");
        w.quiet("a pod whose Job is not seen").await;
        assert_eq!(w.deprecated(), Some(1));
        assert_eq!(said(&w, "js-late-0"), 0, "not known yet is no stranger");
        w.server
            .patch(
                "jobs",
                NS,
                "js-late",
                &json!({"metadata": {"labels": {JOBSET_NAME_LABEL: "js"}}}),
            )
            .expect("label");
        w.until("the pod counts once its Job is seen", |w| {
            w.deprecated() == Some(2)
        })
        .await;
        r.stop().await.expect("clean stop");
    })
    .await;
}

#[tokio::test]
async fn max_restarts_by_epoch_and_by_restart_count() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 1).await;
        let _r = w.start("r1");
        w.sync_pods(2, 1, "sync").await;
        w.sync_pods(2, 2, "sync 2").await;
        w.set_epoch(0, 3); // a second restart: 2 > maxRestarts 1
        w.until("failed", |w| {
            w.stored()["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Failed" && c["reason"] == "ReachedMaxRestarts")
                })
        })
        .await;
        assert_eq!(w.stored()["status"]["terminalState"], "Failed");
        w.until("event", |w| w.has_event("MaxRestartsExceeded"))
            .await;
        // A finished JobSet is left alone.
        w.set_epoch(1, 3);
        w.quiet("finished").await;

        let w = World::new(Dialect::Epoch, &[(1, 2)], 2).await;
        let _r2 = w.start("r2");
        w.set_epoch(0, 1);
        w.patch_pod(
            1,
            json!({"status": {"containerStatuses": [{"name": "w", "restartCount": 3}]}}),
        );
        w.until("failed by restart count", |w| {
            w.stored()["status"]["terminalState"] == "Failed"
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn restarts_that_do_not_count_and_wiped_fields() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 1).await;
        w.server
            .patch(
                "jobsets",
                NS,
                "js",
                &json!({"status": {"restarts": 2, "restartsCountTowardsMax": 0}}),
            )
            .expect("status");
        let _r = w.start("r1");
        w.set_epoch(0, 3);
        w.set_epoch(1, 3);
        // 2 epoch restarts, 2 that do not count: not failed; both fields written (a wiped status).
        w.until("sync", |w| w.synced() == Some(3)).await;
        assert_eq!(w.deprecated(), Some(2));
        assert!(w.stored()["status"]["terminalState"].is_null());
        // Another writer wipes the fields: they are rewritten.
        w.wipe_epoch_fields();
        w.until("rewritten", |w| {
            w.synced() == Some(3) && w.deprecated() == Some(2)
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn multiple_replicated_jobs() {
    bounded(async {
        let w = World::new(Dialect::Attempt, &[(1, 1), (2, 3)], 10).await;
        let _r = w.start("r1");
        for i in 0..6 {
            w.set_epoch(i, 0);
        }
        w.quiet("one of seven missing").await;
        w.set_epoch(6, 0);
        w.until("sync", |w| w.synced() == Some(0)).await;
    })
    .await;
}
