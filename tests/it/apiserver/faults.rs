//! Counters and faults

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_counters_and_fault_injection() {
    within(30, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let pp = PostParams::default();
        pods.create(&pp, &busybox("p", "ns", json!({})).typed::<Pod>())
            .await
            .expect("create");
        pods.get("p").await.expect("get");
        pods.list(&ListParams::default()).await.expect("list");
        pods.patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {}})),
        )
        .await
        .expect("status");
        let c = server.counters();
        assert_eq!(c.get(Verb::Create, "pods"), 1);
        assert_eq!(c.get(Verb::Get, "pods"), 1);
        assert_eq!(c.get(Verb::List, "pods"), 1);
        assert_eq!(c.get(Verb::Patch, "pods/status"), 1);
        assert_eq!(c.get(Verb::Patch, "pods"), 0);
        assert_eq!(c.resource("pods"), 4);
        assert_eq!(c.writes(), 2);
        server.reset_counters();
        assert_eq!(server.counters().total(), 0);

        // 500 and 409, for the next matching request only.
        server.fail_next(1, Verb::Get, "pods", 500);
        assert_eq!(api_err(pods.get("p").await), (500, "InternalError".into()));
        pods.get("p").await.expect("recovered");
        server.fail_next(1, Verb::Patch, "pods", 409);
        let merge = Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}}));
        assert_eq!(
            api_err(pods.patch("p", &PatchParams::default(), &merge).await),
            (409, "Conflict".into())
        );
        // Other verbs and resources are untouched by a rule.
        server.fail_next(1, Verb::Delete, "jobsets", 500);
        pods.get("p").await.expect("not a jobset delete");
        server.clear_faults();
        // 429 with Retry-After: kube's client retries by itself.
        server.reset_counters();
        server.throttle_next(2, Verb::Get, "pods", 0);
        pods.get("p").await.expect("retried through 429s");
        assert_eq!(server.counters().get(Verb::Get, "pods"), 3);
        // Any verb, any resource.
        server.fail_next(1, None, None, 503);
        server.fail_next(1, None, None, 500);
        assert_eq!(api_err(pods.list(&ListParams::default()).await).0, 500);

        // Latency, global and per verb/resource.
        server.set_latency(Duration::from_millis(150));
        let t = Instant::now();
        pods.get("p").await.expect("slow get");
        assert!(t.elapsed() >= Duration::from_millis(150));
        server.set_latency(Duration::ZERO);
        server.set_latency_for(Verb::List, "pods", Duration::from_millis(500));
        let t = Instant::now();
        pods.get("p").await.expect("fast get");
        let fast = t.elapsed();
        let t = Instant::now();
        pods.list(&ListParams::default()).await.expect("slow list");
        assert!(t.elapsed() >= Duration::from_millis(500));
        assert!(
            fast < Duration::from_millis(500),
            "a GET is not delayed by a LIST rule"
        );
        server.clear_faults();

        // Metadata-only reads (kube's `Api<PartialObjectMeta<K>>` and its watcher) get full objects, which
        // kube reads as PartialObjectMeta.
        let metas = pods
            .list_metadata(&ListParams::default())
            .await
            .expect("list_metadata");
        assert_eq!(metas.items[0].metadata.name.as_deref(), Some("p"));
        let meta_api: Api<kube::core::PartialObjectMeta<Pod>> =
            Api::namespaced(server.client(), "ns");
        let mut meta_events = drive_meta(watcher(meta_api, watcher::Config::default()));
        loop {
            if let Some(Ok(watcher::Event::InitApply(m))) = meta_events.recv().await {
                assert_eq!(m.metadata.name.as_deref(), Some("p"));
                break;
            }
        }

        // Bad requests get a 400 Status, never a panic.
        let http = http_client();
        for (method, path, ct, body) in [
            ("GET", "/api/v1/namespaces/ns/pods?limit=x", "", ""),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?labelSelector=%3D%3D",
                "",
                "",
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/pods",
                "application/json",
                "{not json",
            ),
            (
                "PUT",
                "/api/v1/namespaces/ns/pods/p",
                "application/json",
                "[1]",
            ),
            (
                "PATCH",
                "/api/v1/namespaces/ns/pods/p",
                "application/merge-patch+json",
                "nope",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/ns/pods/p",
                "application/json",
                "{",
            ),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?watch=1&resourceVersion=abc",
                "",
                "",
            ),
        ] {
            let req = http
                .request(
                    method.parse().expect("method"),
                    format!("{}{path}", server.url()),
                )
                .header("content-type", ct)
                .body(body);
            let resp = req.send().await.expect("response");
            assert_eq!(resp.status().as_u16(), 400, "{method} {path}");
            let status: Value = resp.json().await.expect("status body");
            assert_eq!(status["kind"], "Status");
            assert_eq!(status["code"], 400);
        }
        let resp = http
            .patch(format!("{}/api/v1/namespaces/ns/pods/p", server.url()))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .expect("response");
        assert_eq!(resp.status().as_u16(), 415);
        let resp = http
            .get(format!("{}/api/v1/namespaces/ns/widgets", server.url()))
            .send()
            .await
            .expect("response");
        assert_eq!(resp.status().as_u16(), 404);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_keeps_delivering_after_watches_are_cut() {
    within(30, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        server
            .create("pods", busybox("p0", "ns", json!({})).build())
            .expect("seed");
        let mut events = drive(watcher(pods, watcher::Config::default()).default_backoff());
        loop {
            if let Some(Ok(watcher::Event::InitDone)) = events.recv().await {
                break;
            }
        }
        let lists = server.counters().get(Verb::List, "pods");
        for round in 0..3 {
            wait_for_watches(&server, 1).await;
            assert_eq!(server.cut_watches(), 1);
            let name = format!("after-cut-{round}");
            server
                .create("pods", busybox(&name, "ns", json!({})).build())
                .expect("create");
            loop {
                match events.recv().await.expect("open") {
                    Ok(watcher::Event::Apply(p)) if p.metadata.name.as_deref() == Some(&name) => {
                        break;
                    }
                    _ => {}
                }
            }
        }
        // It resumed from its resourceVersion: no re-list was needed.
        assert_eq!(server.counters().get(Verb::List, "pods"), lists);
        assert!(server.counters().get(Verb::Watch, "pods") >= 4);
        server.shutdown().await;
    })
    .await;
}
