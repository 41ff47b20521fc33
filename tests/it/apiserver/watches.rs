//! Watches: from a resourceVersion, bookmarks and timeouts, 410

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_resource_version_with_selector_transitions() {
    within(20, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let p0 = pods
            .create(
                &PostParams::default(),
                &busybox("p0", "ns", json!({"app": "x"})).typed::<Pod>(),
            )
            .await
            .expect("p0");
        let rv = p0.metadata.resource_version.clone().expect("rv");
        pods.create(
            &PostParams::default(),
            &busybox("p1", "ns", json!({"app": "y"})).typed::<Pod>(),
        )
        .await
        .expect("p1");
        let mut stream = pods
            .watch(&WatchParams::default().labels("app=x").timeout(10), &rv)
            .await
            .expect("watch")
            .boxed();
        // p1 enters the selection (ADDED), p0 leaves it (DELETED), p1 is deleted (DELETED).
        let merge = |l: Value| Patch::Merge(json!({"metadata": {"labels": l}}));
        pods.patch("p1", &PatchParams::default(), &merge(json!({"app": "x"})))
            .await
            .expect("enter");
        pods.patch("p0", &PatchParams::default(), &merge(json!({"app": "z"})))
            .await
            .expect("leave");
        pods.patch("p1", &PatchParams::default(), &merge(json!({"more": "1"})))
            .await
            .expect("modify");
        pods.delete("p1", &DeleteParams::default())
            .await
            .expect("delete");
        let mut got = Vec::new();
        while got.len() < 4 {
            match stream.try_next().await.expect("event").expect("open") {
                WatchEvent::Added(p) => got.push(("ADDED", p.metadata.name.unwrap_or_default())),
                WatchEvent::Modified(p) => {
                    got.push(("MODIFIED", p.metadata.name.unwrap_or_default()))
                }
                WatchEvent::Deleted(p) => {
                    got.push(("DELETED", p.metadata.name.unwrap_or_default()))
                }
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(e) => panic!("watch error {e:?}"),
            }
        }
        assert_eq!(
            got,
            [
                ("ADDED", "p1".to_owned()),
                ("DELETED", "p0".to_owned()),
                ("MODIFIED", "p1".to_owned()),
                ("DELETED", "p1".to_owned())
            ]
        );
        // From "0": synthetic ADDED for what exists now.
        let mut from_zero = pods
            .watch(&WatchParams::default().timeout(10), "0")
            .await
            .expect("watch 0")
            .boxed();
        match from_zero.try_next().await.expect("event") {
            Some(WatchEvent::Added(p)) => assert_eq!(p.metadata.name.as_deref(), Some("p0")),
            other => panic!("expected a synthetic ADDED, got {other:?}"),
        }
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_and_timeouts() {
    within(20, async {
        let server = TestApiServer::start_with(Options {
            bookmark_interval: Duration::from_millis(200),
            ..Options::default()
        })
        .await;
        server
            .create("pods", busybox("p0", "ns", json!({})).build())
            .expect("seed");
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let rv = server.resource_version().to_string();
        let started = Instant::now();
        let events: Vec<_> = pods
            .watch(&WatchParams::default().timeout(1), &rv)
            .await
            .expect("watch")
            .try_collect()
            .await
            .expect("events");
        // The stream ends on its timeout, with bookmarks on the way and at the end.
        assert!(started.elapsed() >= Duration::from_millis(900));
        let bookmarks: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
                _ => None,
            })
            .collect();
        assert!(bookmarks.len() >= 3, "{bookmarks:?}");
        assert!(bookmarks.iter().all(|b| *b == rv));
        // Without bookmarks: none.
        let events: Vec<_> = pods
            .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
            .await
            .expect("watch")
            .try_collect()
            .await
            .expect("events");
        assert!(events.is_empty());
        // Streaming lists: initial events, then the annotated bookmark.
        let events: Vec<_> = pods
            .watch(&WatchParams::default().timeout(1).initial_events(), "")
            .await
            .expect("streaming list")
            .take(2)
            .try_collect()
            .await
            .expect("events");
        assert!(
            matches!(&events[0], WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("p0"))
        );
        match &events[1] {
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
            }
            other => panic!("expected the initial-events-end bookmark, got {other:?}"),
        }
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_old_versions_answer_410_and_the_watcher_relists() {
    within(30, async {
        let server = TestApiServer::start_with(Options {
            history_capacity: 20,
            // No bookmark may advance the watcher past the compaction below.
            bookmark_interval: Duration::from_secs(600),
            ..Options::default()
        })
        .await;
        server
            .create("pods", busybox("p0", "ns", json!({})).build())
            .expect("seed");
        let old = server.resource_version();
        for i in 0..30 {
            server
                .patch(
                    "pods",
                    "ns",
                    "p0",
                    &json!({"metadata": {"labels": {"i": i.to_string()}}}),
                )
                .expect("churn");
        }
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let events: Vec<_> = pods
            .watch(&WatchParams::default().timeout(5), &old.to_string())
            .await
            .expect("a watch is a 200 even when too old")
            .try_collect()
            .await
            .expect("events");
        match events.as_slice() {
            [WatchEvent::Error(e)] => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
            other => panic!("expected one ERROR 410 event, got {other:?}"),
        }

        // kube's watcher recovers from a 410 by listing again.
        let mut events = drive(watcher(pods.clone(), watcher::Config::default()));
        loop {
            if let Some(Ok(watcher::Event::InitDone)) = events.recv().await {
                break;
            }
        }
        wait_for_watches(&server, 1).await;
        let lists_before = server.counters().get(Verb::List, "pods");
        // A change the watcher does not see, then compaction: the version it resumes from after
        // the cut is too old, so it gets an ERROR 410 and lists again.
        server
            .create(
                "leases",
                json!({"metadata": {"name": "l", "namespace": "ns"}}),
            )
            .expect("lease");
        server.compact_all();
        server.cut_watches();
        server
            .create("pods", busybox("after", "ns", json!({})).build())
            .expect("new pod");
        let mut saw_410 = false;
        let mut saw_after = false;
        while !(saw_410 && saw_after) {
            match events.recv().await.expect("open") {
                Err(watcher::Error::WatchError(e)) if e.code == 410 => saw_410 = true,
                Ok(watcher::Event::InitApply(p) | watcher::Event::Apply(p))
                    if p.metadata.name.as_deref() == Some("after") =>
                {
                    saw_after = true
                }
                _ => {}
            }
        }
        assert!(server.counters().get(Verb::List, "pods") > lists_before);
        server.shutdown().await;
    })
    .await;
}
