//! Serving: a reflector of 2,000 pods, server-side apply, leases, shutdown, 10,000 pods, the in-memory client

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflector_syncs_2000_pods_and_follows_updates() {
    within(40, async {
        let server = TestApiServer::start().await;
        server
            .seed(
                "pods",
                (0..2000).map(|i| {
                    busybox(
                        &format!("p{i:04}"),
                        &format!("ns{}", i % 4),
                        json!({"app": "w"}),
                    )
                    .build()
                }),
            )
            .expect("seed");
        let pods: Api<Pod> = Api::all(server.client());
        let (reader, writer) = reflector::store::<Pod>();
        let driver = tokio::spawn(
            reflector(
                writer,
                watcher(pods, watcher::Config::default().labels("app=w")),
            )
            .default_backoff()
            .touched_objects()
            .for_each(|_| async {}),
        );
        reader.wait_until_ready().await.expect("ready");
        assert_eq!(reader.state().len(), 2000);
        // 2000 pods in pages of 500.
        assert_eq!(server.counters().get(Verb::List, "pods"), 4);
        server
            .patch(
                "pods",
                "ns1",
                "p0001",
                &json!({"metadata": {"annotations": {"seen": "yes"}}}),
            )
            .expect("update");
        server.delete("pods", "ns2", "p0002").expect("delete");
        server
            .patch(
                "pods",
                "ns3",
                "p0003",
                &json!({"metadata": {"labels": {"app": "gone"}}}),
            )
            .expect("leave selection");
        server
            .create("pods", busybox("new", "ns0", json!({"app": "w"})).build())
            .expect("create");
        loop {
            let state = reader.state();
            let annotated = state.iter().any(|p| {
                p.metadata.name.as_deref() == Some("p0001")
                    && p.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key("seen"))
            });
            let names: BTreeSet<_> = state
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            if annotated
                && !names.contains("p0002")
                && !names.contains("p0003")
                && names.contains("new")
                && state.len() == 1999
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The same through a streaming list (sendInitialEvents) instead of paginated lists.
        let lists = server.counters().get(Verb::List, "pods");
        let (streamed, writer) = reflector::store::<Pod>();
        let streaming = tokio::spawn(
            reflector(
                writer,
                watcher(
                    Api::<Pod>::all(server.client()),
                    watcher::Config::default().labels("app=w").streaming_lists(),
                ),
            )
            .default_backoff()
            .touched_objects()
            .for_each(|_| async {}),
        );
        streamed.wait_until_ready().await.expect("streamed ready");
        assert_eq!(streamed.state().len(), 1999);
        assert_eq!(server.counters().get(Verb::List, "pods"), lists);
        streaming.abort();
        driver.abort();
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_conflicts_between_managers() {
    within(20, async {
        let server = TestApiServer::start().await;
        let leases: Api<Lease> = Api::namespaced(server.client(), "ns");
        let cfg = |holder: &str| {
            Patch::Apply(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "l"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 5},
            }))
        };
        let a = leases
            .patch("l", &PatchParams::apply("mgr-a"), &cfg("a"))
            .await
            .expect("apply creates");
        assert_eq!(a.spec.and_then(|s| s.holder_identity).as_deref(), Some("a"));
        // Re-applying the same configuration is a no-op.
        let again = leases
            .patch("l", &PatchParams::apply("mgr-a"), &cfg("a"))
            .await
            .expect("idempotent");
        assert_eq!(again.metadata.resource_version, a.metadata.resource_version);
        // Another manager changing a field mgr-a applied: 409 Conflict (what kube-lease-manager
        // relies on to elect one leader), unless forced.
        assert_eq!(
            api_err(leases.patch("l", &PatchParams::apply("mgr-b"), &cfg("b")).await),
            (409, "Conflict".into())
        );
        let forced = leases
            .patch("l", &PatchParams::apply("mgr-b").force(), &cfg("b"))
            .await
            .expect("forced");
        assert_eq!(forced.spec.and_then(|s| s.holder_identity).as_deref(), Some("b"));
        // A merge patch clearing the field frees it for anyone.
        leases
            .patch(
                "l",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
            )
            .await
            .expect("clear");
        leases
            .patch("l", &PatchParams::apply("mgr-a"), &cfg("a"))
            .await
            .expect("free again");
        // Apply without a field manager is refused, as upstream.
        let raw = http_client()
            .patch(format!("{}/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", server.url()))
            .header("content-type", "application/apply-patch+yaml")
            .body("apiVersion: coordination.k8s.io/v1\nkind: Lease\n")
            .send()
            .await
            .expect("response");
        assert_eq!(raw.status().as_u16(), 400);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_manager_acquires_holds_and_hands_over() {
    within(30, async {
        let server = TestApiServer::start().await;
        let build = |id: &str| {
            kube_lease_manager::LeaseManagerBuilder::new(server.client(), "leader")
                .with_namespace("ns")
                .with_identity(id)
                .with_duration(2)
                .with_grace(1)
                .build()
        };
        let a = build("a").await.expect("manager a");
        assert!(a.changed().await.expect("a acquires"));
        let lease = server.get_as::<Lease>("ns", "leader").expect("lease");
        let spec = lease.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_duration_seconds, Some(2));
        assert_eq!(spec.lease_transitions, Some(1));
        let b = build("b").await.expect("manager b");
        // While a holds (and renews) the lease, b does not become leader.
        let held = tokio::join!(
            tokio::time::timeout(Duration::from_millis(2500), b.changed()),
            tokio::time::timeout(Duration::from_millis(2500), a.changed()),
        );
        assert!(held.0.is_err(), "b must not lead while a holds the lease");
        assert!(held.1.is_err(), "a keeps the lease by renewing it");
        assert_eq!(
            server
                .get_as::<Lease>("ns", "leader")
                .and_then(|l| l.spec?.holder_identity)
                .as_deref(),
            Some("a")
        );
        a.release().await.expect("release");
        assert!(b.changed().await.expect("b takes over"));
        let spec = server
            .get_as::<Lease>("ns", "leader")
            .and_then(|l| l.spec)
            .expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(2));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_watches_and_drop_stops_the_server() {
    within(20, async {
        let server = TestApiServer::start().await;
        let url = server.url();
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let w = pods
            .watch(&WatchParams::default(), "0")
            .await
            .expect("watch")
            .boxed();
        let drained = tokio::spawn(async move { w.collect::<Vec<_>>().await.len() });
        server.shutdown().await;
        assert_eq!(drained.await.expect("watch ended"), 0);
        assert!(
            http_client()
                .get(format!("{url}/api"))
                .send()
                .await
                .is_err()
        );

        let dropped = TestApiServer::start().await;
        let url = dropped.url();
        drop(dropped);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            http_client()
                .get(format!("{url}/api"))
                .send()
                .await
                .is_err()
        );
    })
    .await;
}

/// A sanity figure, printed (run with `--nocapture`): creating 10,000 pods and listing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_sanity_figure() {
    within(60, async {
        let server = TestApiServer::start().await;
        let t = Instant::now();
        server
            .seed(
                "pods",
                (0..10_000).map(|i| build::Pod::new(&format!("p{i:05}")).namespace(&format!("ns{}", i % 10)).labels(json!({"app": "w"})).container("main", "busybox").build()),
            )
            .expect("seed");
        let seeded = t.elapsed();

        let http = http_client();
        let t = Instant::now();
        let body = http
            .get(format!("{}/api/v1/pods", server.url()))
            .send()
            .await
            .expect("list")
            .bytes()
            .await
            .expect("body");
        let raw_list = t.elapsed();

        let pods: Api<Pod> = Api::all(server.client());
        let t = Instant::now();
        let typed = pods.list(&ListParams::default()).await.expect("typed list");
        let typed_list = t.elapsed();
        assert_eq!(typed.items.len(), 10_000);

        let t = Instant::now();
        let creates = futures::stream::iter(0..1000)
            .map(|i| {
                let pods: Api<Pod> = Api::namespaced(server.client(), "created");
                async move {
                    pods.create(&PostParams::default(), &build::Pod::new(&format!("c{i}")).namespace("created").labels(json!({})).container("main", "busybox").typed::<Pod>())
                        .await
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await
            .expect("creates");
        let http_creates = t.elapsed();
        assert_eq!(creates.len(), 1000);

        // One watcher following an update of each of the 10,000 pods.
        let rv = server.resource_version().to_string();
        let mut stream = pods
            .watch(&WatchParams::default().labels("app=w").timeout(60), &rv)
            .await
            .expect("watch")
            .boxed();
        let t = Instant::now();
        for i in 0..10_000 {
            server
                .patch(
                    "pods",
                    &format!("ns{}", i % 10),
                    &format!("p{i:05}"),
                    &json!({"metadata": {"annotations": {"seen": "1"}}}),
                )
                .expect("update");
        }
        let updated = t.elapsed();
        let mut modified = 0;
        while modified < 10_000 {
            if let WatchEvent::Modified(_) = stream.try_next().await.expect("event").expect("open") {
                modified += 1;
            }
        }
        let watched = t.elapsed();
        println!(
            "10,000 pods: seeded directly in {seeded:?}; raw LIST ({} KiB) in {raw_list:?}; \
             kube typed LIST in {typed_list:?}; 1,000 HTTP creates (16 in flight) in {http_creates:?}; \
             10,000 direct updates in {updated:?}, all seen by a kube watch after {watched:?}",
            body.len() / 1024
        );
        server.shutdown().await;
    })
    .await;
}

/// The in-memory client: the same server behind no socket (what the scale bench's 10,000
/// in-process agents use): requests, watch events and their bytes, bookmarks apart, the write
/// log with its times, the headers it was given (chaos exemption), each resource's latest
/// change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_client_is_served_like_a_socket() {
    within(30, async {
        let server = TestApiServer::start_with(Options {
            bookmark_interval: Duration::from_millis(100),
            ..Options::default()
        })
        .await;
        let client =
            server.in_memory_client(&[(jobset_inplace_testkit::apiserver::EXEMPT_HEADER, "true")]);
        let pods: Api<Pod> = Api::namespaced(client, "ns");
        assert_eq!(server.last_change("pods"), 0);
        let before = Instant::now();
        pods.create(
            &PostParams::default(),
            &busybox("a", "ns", json!({})).typed::<Pod>(),
        )
        .await
        .expect("create in memory");
        let created = server.last_change("pods");
        assert!(created > 0);
        assert_eq!(server.last_change("jobsets"), 0, "other resources unmoved");

        let mut events = pods
            .watch(&WatchParams::default().timeout(5), "0")
            .await
            .expect("watch in memory")
            .boxed();
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .expect("patch in memory");
        let (mut modified, mut bookmarks) = (false, false);
        while !(modified && bookmarks) {
            match events.try_next().await.expect("watch").expect("an event") {
                WatchEvent::Modified(p) => {
                    assert_eq!(p.metadata.labels.unwrap_or_default()["x"], "1");
                    modified = true;
                }
                WatchEvent::Bookmark(_) => bookmarks = true,
                _ => {}
            }
        }
        assert!(server.last_change("pods") > created);

        let counters = server.counters();
        assert_eq!(counters.get(Verb::Create, "pods"), 1, "{counters:?}");
        assert_eq!(counters.get(Verb::Watch, "pods"), 1, "{counters:?}");
        assert_eq!(counters.get(Verb::Patch, "pods"), 1, "{counters:?}");
        let delivered = server.deliveries()["pods"];
        assert!(delivered.events >= 2, "{delivered:?}");
        assert!(delivered.bookmarks >= 1, "{delivered:?}");
        assert!(
            delivered.bytes > 0 && delivered.bookmark_bytes > 0,
            "{delivered:?}"
        );
        let writes = server.writes();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!(writes.iter().all(|w| w.at >= before), "{writes:?}");
        assert!(writes[0].at <= writes[1].at);
        server.clear_writes();
        assert!(server.writes().is_empty());
        // The headers arrive: chaos mode that fails every request leaves this client alone.
        let mut chaos = jobset_inplace_testkit::apiserver::Chaos::none(1);
        chaos.error_500 = 1.0;
        server.set_chaos(Some(chaos));
        pods.get("a")
            .await
            .expect("an exempt request is never failed by chaos");
        assert_eq!(server.chaos_stats().exempt, 1);
    })
    .await;
}
