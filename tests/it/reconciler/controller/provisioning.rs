//! Provisioning's failures and bindings; a leader's write in flight

use super::*;

fn events_in(server: &TestApiServer, ns: &str, reason: &str) -> Vec<Value> {
    server
        .list("events.events.k8s.io", Some(ns))
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// Issue 21, item 8: a namespace whose RoleBinding the API server keeps refusing (409: one of
/// that name that another field manager owns) is retried with a backoff (1 s doubling), not every
/// second; the WARN and the Warning event `AgentProvisioningFailed` on its JobSet are said once,
/// not once per attempt; once the refusal ends, the binding is applied at the next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_failures_back_off_and_are_said_once() {
    bounded(async {
        logs::captured();
        const P: &str = "team-p";
        let server = TestApiServer::start().await;
        let mut js = JobSet::new("js")
            .namespace(NS)
            .max_restarts(10)
            .replicated_jobs([ReplicatedJob::new("rj0")])
            .build();
        js["metadata"]["namespace"] = json!(P);
        server.create("jobsets", js).expect("jobset");
        server.fail_next(1_000, Verb::Patch, "rolebindings", 409);
        let mut opts = options(Dialect::Epoch, "r1", None);
        opts.settings.provision = Some(reconciler::provision::ProvisionSettings::default());
        let r = Running::start(&server, opts);
        let window = Duration::from_secs(8);
        tokio::time::sleep(window).await;
        let attempts = server.counters().get(Verb::Patch, "rolebindings");
        let warned = logs::warnings_about(P, "cannot provision");
        let events = events_in(&server, P, "AgentProvisioningFailed");
        eprintln!(
            "over {window:?}: {attempts} attempts, {warned} WARN lines, {} events",
            events.len()
        );
        // 1 s doubling (jittered between half and all of each step): at most 5 attempts in 8 s;
        // once a second would be 8 or more.
        assert!(
            (2..=5).contains(&attempts),
            "{attempts} attempts in {window:?}"
        );
        assert_eq!(warned, 1, "said once");
        assert_eq!(events.len(), 1, "one event: {events:?}");
        assert_eq!(events[0]["type"], "Warning");
        let note = events[0]["note"].as_str().unwrap_or_default();
        assert!(note.contains("conflict") && note.contains(P), "{note}");
        server.clear_faults();
        let until = std::time::Instant::now() + LIMIT;
        while server
            .get("rolebindings", P, "jobset-inplace-agent")
            .is_none()
        {
            assert!(
                std::time::Instant::now() < until,
                "never applied after the refusal ended"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        r.stop().await.expect("stops");
    })
    .await;
}

/// Issue 21, item 8: `roleRef` cannot change (422). A binding the reconciler made for another
/// role (say, an earlier `--agent-cluster-role`) is deleted, with its UID and resourceVersion as
/// preconditions, and the agent role bound again; a user's binding of that name is never
/// deleted, and the refusal is reported (`invalid`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_of_ours_for_another_role_is_replaced_and_a_users_is_left_alone() {
    bounded(async {
        const Q: &str = "team-q";
        const U: &str = "team-u";
        let server = TestApiServer::start().await;
        let binding = |ns: &str, role: &str, labels: Value| {
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "jobset-inplace-agent", "namespace": ns, "labels": labels},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "jobset-inplace-agent", "namespace": ns}]
            })
        };
        let ours = json!({"app.kubernetes.io/managed-by": "jobset-inplace", "app.kubernetes.io/name": "jobset-inplace-agent"});
        server
            .create("rolebindings", binding(Q, "old-agent-role", ours))
            .expect("binding");
        server
            .create("rolebindings", binding(U, "edit", json!({"team": "u"})))
            .expect("binding");
        let mut js = JobSet::new("js").namespace(NS).max_restarts(10).replicated_jobs([ReplicatedJob::new("rj0")]).build();
        js["metadata"]["namespace"] = json!(Q);
        server.create("jobsets", js).expect("jobset");
        // The test server lets roleRef change: the real API server's refusal, once.
        server.fail_next(1, Verb::Patch, "rolebindings", 422);
        let mut opts = options(Dialect::Epoch, "r1", None);
        opts.settings.provision = Some(reconciler::provision::ProvisionSettings::default());
        let r = Running::start(&server, opts);
        let until = std::time::Instant::now() + LIMIT;
        while server
            .get("rolebindings", Q, "jobset-inplace-agent")
            .is_none_or(|b| b["roleRef"]["name"] != "jobset-inplace-agent")
        {
            assert!(std::time::Instant::now() < until, "never bound again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deletes: Vec<_> = server
            .writes()
            .into_iter()
            .filter(|w| w.verb == Verb::Delete && w.resource == "rolebindings")
            .map(|w| w.namespace)
            .collect();
        assert_eq!(deletes, [Some(Q.to_owned())], "ours deleted and created again");
        // A user's binding of that name: refused (422) at every attempt, never deleted.
        server.fail_next(1_000, Verb::Patch, "rolebindings", 422);
        let mut js = JobSet::new("js").namespace(NS).max_restarts(10).replicated_jobs([ReplicatedJob::new("rj0")]).build();
        js["metadata"]["namespace"] = json!(U);
        server.create("jobsets", js).expect("jobset");
        let until = std::time::Instant::now() + LIMIT;
        while events_in(&server, U, "AgentProvisioningFailed").is_empty() {
            assert!(std::time::Instant::now() < until, "no event");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let users = server.get("rolebindings", U, "jobset-inplace-agent").expect("kept");
        assert_eq!(users["roleRef"]["name"], "edit");
        assert!(
            server
                .writes()
                .iter()
                .all(|w| !(w.verb == Verb::Delete && w.namespace.as_deref() == Some(U))),
            "a user's binding is never deleted"
        );
        let note = events_in(&server, U, "AgentProvisioningFailed")[0]["note"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(note.contains("invalid"), "{note}");
        r.stop().await.expect("stops");
    })
    .await;
}

/// Issue 21, item 7: a write the leader has in flight when its lease runs out must not land after
/// the lease could pass to another replica. The leader's lease requests go unanswered, and the API
/// server takes 9 s to answer the JobSetEpoch write of the group restart it then decides (longer
/// than what is left of its 8 s lease, shorter than the 10 s request timeout). Each write is sent
/// with a timeout that ends before the leader's write deadline, so the write is abandoned (and
/// with its connection, cancelled) in time: in the server's write log no write of the old leader
/// comes later than its last lease renewal plus the lease duration. Before, the write was sent
/// with the 10 s request timeout and landed after the lease had expired. (An 8 s lease renewed 4 s
/// before expiry: with a 4 s one renewed every 2 s, a cold CI run's load once delayed a renewal
/// past the leader's deadline before its first sync, and it stepped down as it should.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_s_write_in_flight_does_not_land_after_its_lease_could_pass() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 1_000).await;
        let duration = Duration::from_secs(8);
        let lease = || lease(duration, Duration::from_secs(4));
        let a = Running::start_with(
            w.server.client_named("a"),
            options(Dialect::Epoch, "a", Some(lease())),
        );
        w.sync_pods(2, 1, "sync by a").await;
        w.server.silence_client("a", None, "leases");
        w.server
            .set_latency_for(Verb::Patch, "jobsetepochs", Duration::from_secs(9));
        // A group restart for a to publish (its write waits 9 s in the server).
        w.set_epoch(0, 2);
        let err = tokio::time::timeout(LIMIT, a.task_result())
            .await
            .expect("a stops by itself")
            .expect_err("a stops with an error");
        assert!(
            matches!(err, reconciler::Error::LeaseNotRenewed { .. }),
            "{err}"
        );
        // Past the 9 s the write would have taken (a stops 3 s or more after the silence began).
        tokio::time::sleep(Duration::from_secs(7)).await;
        let writes = w.server.writes();
        let last_renewal = writes
            .iter()
            .filter(|r| r.client.as_deref() == Some("a") && r.resource == "leases")
            .map(|r| r.at)
            .max()
            .expect("a renewed its lease");
        let expiry = last_renewal + duration;
        let late: Vec<_> = writes
            .iter()
            .filter(|r| {
                r.client.as_deref() == Some("a") && r.resource != "leases" && r.at >= expiry
            })
            .map(|r| (r.resource.clone(), r.at.saturating_duration_since(expiry)))
            .collect();
        assert!(
            late.is_empty(),
            "a's writes landed after its lease could pass: {late:?}"
        );
        assert!(
            w.server.counters().get(Verb::Patch, "jobsetepochs") >= 1,
            "a sent its write"
        );
    })
    .await;
}
