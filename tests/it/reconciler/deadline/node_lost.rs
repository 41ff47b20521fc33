//! Lost nodes (`--node-lost`, docs/operations.md "Node loss"): the real reconciler against the
//! test API server, with Nodes and pods written by the test. The fenced default fails and
//! deletes the pods of a node only once it is fenced (its Node deleted, or tainted
//! `node.kubernetes.io/out-of-service` while not Ready), never for silence alone;
//! `force-after-grace` also after the grace of a silent node.

use jobset_inplace::reconciler::nodes::{NodeLost, OUT_OF_SERVICE_TAINT, resolve_node_lost};

use super::*;

const LNS: &str = "lost";
const LOST_TOTAL: &str = "jobset_inplace_reconciler_pods_node_lost_total";

/// A Node whose `Ready` condition is `ready`.
fn node(name: &str, ready: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": ready}]}
    })
}

/// A JobSet `js` of `placed.len()` running pods, each bound to its node.
fn store(server: &TestApiServer, placed: &[(&str, &str)]) {
    server
        .create(
            "jobsets",
            JobSet::new("js")
                .namespace(LNS)
                .replicas(i64::try_from(placed.len()).expect("few"))
                .max_restarts(5)
                .build(),
        )
        .expect("jobset");
    for (pod, on) in placed {
        server
            .create(
                "pods",
                member_of(
                    server,
                    Pod::worker(LNS, "js", pod).node(on).running().build(),
                ),
            )
            .expect("pod");
    }
}

fn options_with(node_lost: NodeLost) -> Options {
    let mut o = options(Dialect::Epoch, None, "r1");
    o.settings.namespace = Some(LNS.to_owned());
    o.settings.node_lost = node_lost;
    o
}

/// Alive: stored and not `Failed`.
fn alive(server: &TestApiServer, pod: &str) -> bool {
    server
        .get("pods", LNS, pod)
        .is_some_and(|p| p["status"]["phase"] != "Failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fenced_default_fails_pods_only_on_a_deleted_or_out_of_service_node() {
    bounded(async {
        let server = TestApiServer::start().await;
        for (n, ready) in [("silent", "Unknown"), ("doomed", "True"), ("tainted", "True")] {
            server.create("nodes", node(n, ready)).expect("node");
        }
        store(
            &server,
            &[("js-0", "silent"), ("js-1", "doomed"), ("js-2", "tainted")],
        );
        // The CLI's default, as resolved from no flag.
        let default = resolve_node_lost(None, None).expect("default");
        assert_eq!(default, NodeLost::Fenced);
        let r = Running::start(server.client_named("reconciler"), options_with(default)).await;
        // Silent for longer than any grace would be here, and tainted while still Ready: nothing.
        server
            .patch(
                "nodes",
                "",
                "tainted",
                &json!({"spec": {"taints": [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]}}),
            )
            .expect("taint");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for p in ["js-0", "js-1", "js-2"] {
            assert!(alive(&server, p), "{p} failed on silence alone");
        }
        assert!(events(&server, LNS, "NodeLost").is_empty());
        // The tainted node goes silent: fenced, its pod failed and deleted at once.
        let t = Instant::now();
        server
            .patch(
                "nodes",
                "",
                "tainted",
                &json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
            )
            .expect("silent");
        until("the out-of-service node's pod failed", WAIT, || {
            !alive(&server, "js-2")
        })
        .await;
        eprintln!("NODE-LOST out-of-service: pod failed {:?} after the taint and silence", t.elapsed());
        let message = note(&server, LNS, "NodeLost").await;
        assert!(
            message.contains("js-2") && message.contains("tainted") && message.contains(OUT_OF_SERVICE_TAINT),
            "{message}"
        );
        // The Node deleted (by the operator or the cloud's node lifecycle): fenced too.
        server.delete("nodes", "", "doomed").expect("delete");
        until("the deleted node's pod failed", WAIT, || {
            !alive(&server, "js-1")
        })
        .await;
        assert_eq!(r.sample_reaching(LOST_TOTAL, 2.0).await, 2.0);
        assert!(alive(&server, "js-0"), "the silent node's pod stays");
        assert_eq!(deletes_by_reconciler(&server, "pods").len(), 2);
        r.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_after_grace_fails_a_silent_nodes_pods_after_the_grace_and_off_never() {
    bounded(async {
        let grace = Duration::from_secs(1);
        for (policy, fails) in [
            (NodeLost::ForceAfterGrace(grace), true),
            (NodeLost::Off, false),
        ] {
            let server = TestApiServer::start().await;
            server
                .create("nodes", node("silent", "Unknown"))
                .expect("node");
            server.create("nodes", node("fine", "True")).expect("node");
            store(&server, &[("js-0", "silent"), ("js-1", "fine")]);
            let t = Instant::now();
            let r = Running::start(server.client_named("reconciler"), options_with(policy)).await;
            if fails {
                until("the silent node's pod failed", WAIT, || {
                    !alive(&server, "js-0")
                })
                .await;
                assert!(
                    t.elapsed() >= grace,
                    "failed before the grace: {:?}",
                    t.elapsed()
                );
                assert_eq!(r.sample_reaching(LOST_TOTAL, 1.0).await, 1.0);
            } else {
                tokio::time::sleep(grace + Duration::from_millis(500)).await;
                assert!(alive(&server, "js-0"));
                assert!(deletes_by_reconciler(&server, "pods").is_empty());
            }
            assert!(alive(&server, "js-1"), "{policy:?}");
            r.stop().await;
        }
    })
    .await;
}
