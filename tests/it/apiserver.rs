//! The in-repo test API server, driven by the real `kube` client, watcher, reflector and
//! lease manager. Every test bounds its own time.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use jobset_inplace::jobset::JobSet;
use jobset_inplace_testkit::apiserver::{Options, TestApiServer, Verb};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};

async fn within<T>(secs: u64, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs} s"),
    }
}

fn pod_json(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    })
}

fn pod(ns: &str, name: &str, labels: Value) -> Pod {
    serde_json::from_value(pod_json(ns, name, labels)).expect("pod")
}

/// The HTTP status and reason of a failed kube call.
fn api_err<T: Debug>(r: kube::Result<T>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names<K: kube::ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(|o| o.name_any()).collect()
}

/// A plain HTTP client for raw requests (reqwest here needs a process-wide crypto provider).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

type WatcherItem = Result<watcher::Event<Pod>, watcher::Error>;

/// Polls a watcher stream from a task (a watcher only watches while polled) and forwards it.
fn drive(
    stream: impl futures::Stream<Item = WatcherItem> + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<WatcherItem> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    rx
}

type MetaItem = Result<watcher::Event<kube::core::PartialObjectMeta<Pod>>, watcher::Error>;

fn drive_meta(
    stream: impl futures::Stream<Item = MetaItem> + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<MetaItem> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    rx
}

async fn wait_for_watches(server: &TestApiServer, n: usize) {
    while server.watch_count() != n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn jobset_json(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"},
            "replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {
                "parallelism": 2, "completions": 2, "backoffLimit": 0,
                "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}}],
            "futureField": {"kept": [1, 2, 3]},
        },
    })
}

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
        pods.create(&PostParams::default(), &pod("ns", "p", json!({})))
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
            .create(&PostParams::default(), &pod("ns", "p0", json!({"a": "b"})))
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

        let mut generated = pod("ns", "", json!({}));
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
            .create("pods", pod_json("other", "q", json!({})))
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
        let j: JobSet = serde_json::from_value(jobset_json("ns", "js")).expect("jobset");
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
            let mut p = pod_json("ns", name, l.clone());
            if *name == "p1" {
                p["spec"]["nodeName"] = json!("node-a");
            }
            server.create("pods", p).expect("seed");
        }
        server
            .create("pods", pod_json("other", "p9", json!({"app": "web"})))
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
                (0..25).map(|i| pod_json("ns", &format!("p{i:02}"), json!({}))),
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
                    .create("pods", pod_json("ns", "p99", json!({})))
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
            .create("pods", pod_json("ns", "p100", json!({})))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_resource_version_with_selector_transitions() {
    within(20, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let p0 = pods
            .create(
                &PostParams::default(),
                &pod("ns", "p0", json!({"app": "x"})),
            )
            .await
            .expect("p0");
        let rv = p0.metadata.resource_version.clone().expect("rv");
        pods.create(
            &PostParams::default(),
            &pod("ns", "p1", json!({"app": "y"})),
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
            .create("pods", pod_json("ns", "p0", json!({})))
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
            .create("pods", pod_json("ns", "p0", json!({})))
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
            .create("pods", pod_json("ns", "after", json!({})))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_patches_and_the_status_subresource() {
    within(20, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let pp = PostParams::default();
        let p = pods.create(&pp, &pod("ns", "p", json!({}))).await.expect("create");
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
        let j: JobSet = serde_json::from_value(jobset_json("ns", "j")).expect("jobset");
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
        let mut p = pod("ns", "p", json!({}));
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
                    pod_json("ns", &format!("c{i}"), json!({"batch": "1"})),
                )
                .expect("seed");
        }
        server
            .create("pods", pod_json("ns", "keep", json!({})))
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
            .create(&PostParams::default(), &pod("ns", "q", json!({})))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_counters_and_fault_injection() {
    within(30, async {
        let server = TestApiServer::start().await;
        let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
        let pp = PostParams::default();
        pods.create(&pp, &pod("ns", "p", json!({})))
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
            .create("pods", pod_json("ns", "p0", json!({})))
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
                .create("pods", pod_json("ns", &name, json!({})))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflector_syncs_2000_pods_and_follows_updates() {
    within(40, async {
        let server = TestApiServer::start().await;
        server
            .seed(
                "pods",
                (0..2000).map(|i| {
                    pod_json(
                        &format!("ns{}", i % 4),
                        &format!("p{i:04}"),
                        json!({"app": "w"}),
                    )
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
            .create("pods", pod_json("ns0", "new", json!({"app": "w"})))
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
                (0..10_000).map(|i| pod_json(&format!("ns{}", i % 10), &format!("p{i:05}"), json!({"app": "w"}))),
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
                    pods.create(&PostParams::default(), &pod("created", &format!("c{i}"), json!({})))
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
        pods.create(&PostParams::default(), &pod("ns", "a", json!({})))
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
