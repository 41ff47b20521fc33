//! Writes: updates, patches, the status subresource, finalizers

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_patches_and_the_status_subresource() {
    within(20, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let pp = PostParams::default();
        let p = pods.create(&pp, &build::Pod::new("p").namespace("ns").labels(json!({})).container("main", "busybox").typed::<Pod>()).await.expect("create");
        // Stale update: 409 Conflict.
        let mut newer = p.clone();
        newer.metadata.labels = Some([("a".to_owned(), "1".to_owned())].into());
        pods.replace("p", &pp, &newer).await.expect("update");
        assert_eq!(api_err(pods.replace("p", &pp, &newer).await), (409, "Conflict".into()));

        // Merge patch and JSON patch; a failed test op is a 422.
        let pa = PatchParams::default();
        let merged = pods
            .patch("p", &pa, &Patch::Merge(json!({"metadata": {"annotations": {"k": "v"}}})))
            .await
            .expect("merge");
        assert_eq!(merged.metadata.annotations.expect("annotations")["k"], "v");
        let jp: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/annotations/k", "value": "v"},
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
        ]))
        .expect("json patch");
        let patched = pods.patch("p", &pa, &Patch::<()>::Json(jp)).await.expect("json patch");
        assert_eq!(patched.metadata.labels.expect("labels")["b"], "2");
        let failing: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/annotations/k", "value": "other"},
        ]))
        .expect("json patch");
        assert_eq!(api_err(pods.patch("p", &pa, &Patch::<()>::Json(failing)).await).0, 422);
        // A stale resourceVersion inside a merge patch is a precondition.
        let stale = Patch::Merge(json!({"metadata": {"resourceVersion": p.metadata.resource_version, "labels": {"c": "3"}}}));
        assert_eq!(api_err(pods.patch("p", &pa, &stale).await).0, 409);
        // Strategic merge patches apply as merge patches.
        let sp = pods
            .patch("p", &pa, &Patch::Strategic(json!({"metadata": {"labels": {"s": "1"}}})))
            .await
            .expect("strategic");
        assert_eq!(sp.metadata.labels.expect("labels")["s"], "1");

        // Status subresource: a status write changes only status...
        let st = pods
            .patch_status(
                "p",
                &pa,
                &Patch::Merge(json!({"metadata": {"labels": {"ignored": "x"}}, "spec": {"nodeName": "ignored"}, "status": {"phase": "Running"}})),
            )
            .await
            .expect("patch status");
        assert_eq!(st.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        assert!(!st.metadata.labels.clone().unwrap_or_default().contains_key("ignored"));
        assert_eq!(st.spec.as_ref().and_then(|s| s.node_name.as_deref()), None);
        // ...and a main-resource write leaves status alone.
        let main = pods
            .patch("p", &pa, &Patch::Merge(json!({"status": {"phase": "Failed"}, "metadata": {"labels": {"m": "1"}}})))
            .await
            .expect("patch main");
        assert_eq!(main.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        assert_eq!(main.metadata.labels.clone().expect("labels")["m"], "1");

        // The same for JobSets, through replace_status / replace.
        let js: Api<JobSet> = Api::namespaced(server.client(), "ns");
        let j: JobSet = build::JobSet::new("j").namespace("ns").replicas(2).pods(2).container("c", "i").each_job(|j| j.backoff_limit(0)).set("/spec/futureField", json!({"kept": [1, 2, 3]})).no_status().typed();
        let mut j = js.create(&pp, &j).await.expect("create");
        assert!(j.status.is_none());
        j.status = Some(serde_json::from_value(json!({"syncedEpoch": 3, "restarts": 1})).expect("status"));
        j.spec.as_mut().expect("spec").suspend = Some(true);
        let after_status = js
            .replace_status("j", &pp, &j)
            .await
            .expect("replace status");
        assert_eq!(after_status.status.as_ref().and_then(|s| s.restarts), Some(1));
        assert!(!after_status.is_suspended());
        assert_eq!(after_status.metadata.generation, Some(1));
        let mut spec_change = after_status.clone();
        spec_change.spec.as_mut().expect("spec").suspend = Some(true);
        spec_change.status = None;
        let after_main = js.replace("j", &pp, &spec_change).await.expect("replace");
        assert!(after_main.is_suspended());
        assert_eq!(after_main.metadata.generation, Some(2));
        assert_eq!(after_main.status.as_ref().and_then(|s| s.restarts), Some(1));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_with_finalizers() {
    within(20, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let mut p = busybox("p", "ns", json!({})).typed::<Pod>();
        p.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        pods.create(&PostParams::default(), &p)
            .await
            .expect("create");
        let mut w = pods
            .watch(
                &WatchParams::default().timeout(10),
                &server.resource_version().to_string(),
            )
            .await
            .expect("watch")
            .boxed();
        let marked = pods
            .delete("p", &DeleteParams::default())
            .await
            .expect("delete");
        let marked = marked.left().expect("object returned");
        assert!(marked.metadata.deletion_timestamp.is_some());
        assert!(pods.get("p").await.is_ok());
        assert!(matches!(
            w.try_next().await,
            Ok(Some(WatchEvent::Modified(_)))
        ));
        pods.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove finalizer");
        assert!(matches!(
            w.try_next().await,
            Ok(Some(WatchEvent::Deleted(_)))
        ));
        assert_eq!(api_err(pods.get("p").await).0, 404);
        // deletecollection with a selector.
        for i in 0..3 {
            server
                .create(
                    "pods",
                    busybox(&format!("c{i}"), "ns", json!({"batch": "1"})).build(),
                )
                .expect("seed");
        }
        server
            .create("pods", busybox("keep", "ns", json!({})).build())
            .expect("seed");
        let gone = pods
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("batch=1"),
            )
            .await
            .expect("delete collection");
        assert_eq!(gone.left().map(|l| l.items.len()), Some(3));
        assert_eq!(server.list("pods", Some("ns")).len(), 1);
        // Preconditions.
        let q = pods
            .create(
                &PostParams::default(),
                &busybox("q", "ns", json!({})).typed::<Pod>(),
            )
            .await
            .expect("q");
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some("not-the-uid".into()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        assert_eq!(api_err(pods.delete("q", &dp).await).0, 409);
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: q.metadata.uid.clone(),
                resource_version: q.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        pods.delete("q", &dp).await.expect("preconditions hold");
        server.shutdown().await;
    })
    .await;
}
