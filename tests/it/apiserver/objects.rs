//! Objects: the handle, CRUD, other resources, selectors, pages

use super::*;

#[test]
fn the_handle_can_be_shared() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TestApiServer>();
}

/// Plain `#[tokio::test]` (a current-thread runtime) works too.
#[tokio::test]
async fn works_on_a_current_thread_runtime() {
    within(10, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let mut events = drive(watcher(pods.clone(), watcher::Config::default()));
        pods.create(
            &PostParams::default(),
            &busybox("p", "ns", json!({})).typed::<Pod>(),
        )
        .await
        .expect("create");
        loop {
            match events.recv().await.expect("open") {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))
                    if p.metadata.name.as_deref() == Some("p") =>
                {
                    break;
                }
                _ => {}
            }
        }
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_crud_with_the_kube_client() {
    within(20, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let created = pods
            .create(
                &PostParams::default(),
                &busybox("p0", "ns", json!({"a": "b"})).typed::<Pod>(),
            )
            .await
            .expect("create");
        let meta = &created.metadata;
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
        assert_eq!(meta.generation, Some(1));
        let rv: u64 = meta
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .expect("numeric resourceVersion");
        assert_eq!(rv, server.resource_version());
        assert_eq!(
            created.status.and_then(|s| s.phase).as_deref(),
            Some("Pending")
        );

        let got = pods.get("p0").await.expect("get");
        assert_eq!(got.metadata.uid, meta.uid);
        assert_eq!(
            api_err(pods.create(&PostParams::default(), &got).await),
            (409, "AlreadyExists".into())
        );
        assert_eq!(api_err(pods.get("nope").await), (404, "NotFound".into()));
        assert!(pods.get_opt("nope").await.expect("get_opt").is_none());

        let mut generated = busybox("", "ns", json!({})).typed::<Pod>();
        generated.metadata.name = None;
        generated.metadata.generate_name = Some("gen-".into());
        let g = pods
            .create(&PostParams::default(), &generated)
            .await
            .expect("generateName");
        assert!(
            g.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("gen-") && n.len() == 9)
        );

        let mut changed = got.clone();
        changed.spec.as_mut().expect("spec").containers[0].image = Some("v2".into());
        let replaced = pods
            .replace("p0", &PostParams::default(), &changed)
            .await
            .expect("replace");
        assert_eq!(replaced.metadata.generation, Some(2));

        let all = pods.list(&ListParams::default()).await.expect("list");
        assert_eq!(names(&all.items).len(), 2);
        assert_eq!(all.types.kind, "PodList");
        assert_eq!(all.types.api_version, "v1");
        assert_eq!(
            all.metadata.resource_version,
            Some(server.resource_version().to_string())
        );

        let deleted = pods
            .delete("p0", &DeleteParams::default())
            .await
            .expect("delete");
        assert!(deleted.is_left());
        assert!(server.get("pods", "ns", "p0").is_none());
        assert_eq!(
            api_err(pods.delete("p0", &DeleteParams::default()).await).0,
            404
        );
        // Cluster-wide list sees other namespaces too.
        server
            .create("pods", busybox("q", "other", json!({})).build())
            .expect("seed");
        let everywhere: Api<Pod> = Api::all(server.client());
        let l = everywhere.list(&ListParams::default()).await.expect("all");
        assert_eq!(l.items.len(), 2);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_resources_round_trip() {
    within(20, async {
        let server = TestApiServer::start().await;
        let client = server.client();
        let pp = PostParams::default();
        let js: Api<JobSet> = Api::namespaced(client.clone(), "ns");
        let j: JobSet = build::JobSet::new("js").namespace("ns").replicas(2).pods(2).container("c", "i").each_job(|j| j.backoff_limit(0)).set("/spec/futureField", json!({"kept": [1, 2, 3]})).no_status().typed();
        js.create(&pp, &j).await.expect("create jobset");
        let stored = server.get("jobsets", "ns", "js").expect("stored");
        // Unknown to JobSet's CRD schema: pruned, as by the real API server.
        assert!(stored["spec"].get("futureField").is_none(), "{stored}");
        assert_eq!(js.get("js").await.expect("get").expected_pods(), 4);

        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "ns");
        sa.create(&pp, &serde_json::from_value(json!({"metadata": {"name": "agent"}})).expect("sa"))
            .await
            .expect("sa");
        let rb: Api<RoleBinding> = Api::namespaced(client.clone(), "ns");
        rb.create(&pp, &serde_json::from_value(json!({
            "metadata": {"name": "system:agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": "ns"}],
        })).expect("rb"))
            .await
            .expect("rolebinding");
        let nss: Api<Namespace> = Api::all(client.clone());
        nss.create(&pp, &serde_json::from_value(json!({"metadata": {"name": "ns"}})).expect("ns"))
            .await
            .expect("namespace");
        assert_eq!(nss.get("ns").await.expect("get ns").metadata.namespace, None);

        // CRDs: seeded directly, read through the API.
        server
            .create(
                "customresourcedefinitions",
                json!({"metadata": {"name": "jobsets.jobset.x-k8s.io"},
                       "spec": {"group": "jobset.x-k8s.io", "names": {"plural": "jobsets", "kind": "JobSet"},
                                "scope": "Namespaced", "versions": []}}),
            )
            .expect("crd");
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        assert_eq!(crds.list(&ListParams::default()).await.expect("crds").items.len(), 1);

        // Events of both groups, through kube's event recorder (create then merge patch).
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("p".into()),
            namespace: Some("ns".into()),
            ..ObjectReference::default()
        };
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Normal,
            reason: "Restarted".into(),
            note: Some("in place".into()),
            action: "Restart".into(),
            secondary: None,
        };
        recorder.publish(&ev, &reference).await.expect("event");
        recorder.publish(&ev, &reference).await.expect("event series");
        let events = server.list("events.events.k8s.io", Some("ns"));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["series"]["count"], 2);
        let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "ns");
        core.create(&pp, &serde_json::from_value(json!({
            "metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R"
        })).expect("core event"))
            .await
            .expect("core event");
        let l = core
            .list(&ListParams::default().fields("involvedObject.name=p,reason=R"))
            .await
            .expect("field selector on events");
        assert_eq!(l.items.len(), 1);

        // Typed direct access.
        let mut lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": "l", "namespace": "ns"}, "spec": {"holderIdentity": "x"}
        }))
        .expect("lease");
        let stored = server.put_as(&lease).expect("put_as");
        assert_eq!(stored.metadata.resource_version, Some(server.resource_version().to_string()));
        lease.spec = None;
        lease.metadata.resource_version = Some("1".into());
        assert_eq!(server.put_as(&lease).map(|_| ()).map_err(|e| e.code), Err(409));
        assert_eq!(server.list_as::<Lease>(None).len(), 1);
        assert_eq!(server.count("leases"), 1);
        assert!(server.get("nonsense", "ns", "x").is_none());
        assert_eq!(server.create("nonsense", json!({})).map_err(|e| e.code), Err(404));

        // Discovery and version.
        let version = client.apiserver_version().await.expect("version");
        assert_eq!(version.major, "1");
        let discovery = kube::Discovery::new(client.clone()).run().await.expect("discovery");
        assert!(discovery.has_group("jobset.x-k8s.io"));
        let (ar, caps) = discovery
            .resolve_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "Pod"))
            .expect("pods discovered");
        assert_eq!(ar.plural, "pods");
        assert!(caps.subresources.iter().any(|(s, _)| s.plural == "pods/status" || s.plural == "status"));
        let aggregated = kube::Discovery::new(client.clone())
            .run_aggregated()
            .await
            .expect("aggregated discovery");
        assert!(aggregated.has_group("coordination.k8s.io"));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_field_selectors() {
    within(20, async {
        let server = TestApiServer::start().await;
        let labels = [
            ("p0", json!({"app": "web", "tier": "front", "n": "1"})),
            ("p1", json!({"app": "web", "tier": "back", "n": "5"})),
            ("p2", json!({"app": "db"})),
            ("p3", json!({})),
        ];
        for (name, l) in &labels {
            let mut p = busybox(name, "ns", l.clone()).build();
            if *name == "p1" {
                p["spec"]["nodeName"] = json!("node-a");
            }
            server.create("pods", p).expect("seed");
        }
        server
            .create(
                "pods",
                busybox("p9", "other", json!({"app": "web"})).build(),
            )
            .expect("seed");
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let cases: &[(&str, &[&str])] = &[
            ("app=web", &["p0", "p1"]),
            ("app==web", &["p0", "p1"]),
            ("app!=web", &["p2", "p3"]),
            ("app in (web,db)", &["p0", "p1", "p2"]),
            ("app notin (web)", &["p2", "p3"]),
            ("tier", &["p0", "p1"]),
            ("!tier", &["p2", "p3"]),
            ("app=web,tier=back", &["p1"]),
            ("app in (web),!n", &[]),
            ("n>2", &["p1"]),
        ];
        for (sel, want) in cases {
            let l = pods
                .list(&ListParams::default().labels(sel))
                .await
                .unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(names(&l.items), *want, "labelSelector={sel}");
        }
        let f = |s: &'static str| ListParams::default().fields(s);
        assert_eq!(
            names(&pods.list(&f("metadata.name=p2")).await.expect("name").items),
            ["p2"]
        );
        assert_eq!(
            names(
                &pods
                    .list(&f("metadata.name!=p2,metadata.namespace=ns"))
                    .await
                    .expect("ns")
                    .items
            ),
            ["p0", "p1", "p3"]
        );
        assert_eq!(
            names(
                &pods
                    .list(&f("spec.nodeName=node-a"))
                    .await
                    .expect("node")
                    .items
            ),
            ["p1"]
        );
        assert_eq!(
            names(
                &pods
                    .list(&f("spec.nodeName="))
                    .await
                    .expect("unscheduled")
                    .items
            ),
            ["p0", "p2", "p3"]
        );
        let all: Api<Pod> = Api::all(server.client());
        assert_eq!(
            names(
                &all.list(&f("metadata.namespace=other"))
                    .await
                    .expect("other")
                    .items
            ),
            ["p9"]
        );
        assert_eq!(api_err(pods.list(&f("spec.image=x")).await).0, 400);
        assert_eq!(
            api_err(pods.list(&ListParams::default().labels("app=,")).await).0,
            400
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_with_limit_and_continue() {
    within(20, async {
        let server = TestApiServer::start().await;
        server
            .seed(
                "pods",
                (0..25).map(|i| busybox(&format!("p{i:02}"), "ns", json!({})).build()),
            )
            .expect("seed");
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let mut lp = ListParams::default().limit(10);
        let mut seen = Vec::new();
        let mut pages = 0;
        let mut first_rv = None;
        loop {
            let page = pods.list(&lp).await.expect("page");
            pages += 1;
            seen.extend(names(&page.items));
            first_rv.get_or_insert(page.metadata.resource_version.clone());
            assert_eq!(
                page.metadata.resource_version,
                *first_rv.as_ref().expect("rv")
            );
            if pages == 1 {
                // A write between pages does not show in later pages.
                server
                    .create("pods", busybox("p99", "ns", json!({})).build())
                    .expect("late");
            }
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                _ => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), 25);
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        // A continue token older than the history answers 410.
        let page = pods
            .list(&ListParams::default().limit(5))
            .await
            .expect("page");
        let token = page.metadata.continue_.expect("continue");
        server
            .create("pods", busybox("p100", "ns", json!({})).build())
            .expect("write");
        server.compact_all();
        assert_eq!(
            api_err(
                pods.list(&ListParams::default().limit(5).continue_token(&token))
                    .await
            ),
            (410, "Expired".into())
        );
        server.shutdown().await;
    })
    .await;
}
