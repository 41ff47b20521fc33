use super::*;
use crate::apiserver::resources::default_resources;
use crate::build::Pod;

struct T {
    s: Store,
    pods: ResId,
    jobsets: ResId,
    leases: ResId,
    namespaces: ResId,
}

fn setup(history: usize) -> T {
    let reg = Arc::new(Registry::new(default_resources()));
    let r = |n: &str| reg.resolve(n).expect(n);
    let (pods, jobsets, leases, namespaces) =
        (r("pods"), r("jobsets"), r("leases"), r("namespaces"));
    T {
        s: Store::new(
            reg,
            StoreOptions {
                history_capacity: history,
                watcher_buffer: 4,
                graceful_pod_deletion: true,
            },
        ),
        pods,
        jobsets,
        leases,
        namespaces,
    }
}

/// The pod these tests store: one container `c`, `Running`, with `labels`.
fn running_pod(name: &str, labels: serde_json::Value) -> Pod {
    Pod::new(name)
        .labels(labels)
        .containers(json!([{"name": "c"}]))
        .phase("Running")
}

fn http() -> WriteOpts {
    WriteOpts::default()
}

fn rv_of(e: &Entry) -> String {
    e.value["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn create_sets_server_fields_and_drops_status() {
    let mut t = setup(100);
    // Without apiVersion and kind: the store sets them.
    let pod = running_pod("a", json!({}))
        .remove("/apiVersion")
        .remove("/kind")
        .build();
    let e = t.s.create(t.pods, "ns", pod, &http()).expect("create");
    let m = &e.value["metadata"];
    assert_eq!(e.value["apiVersion"], "v1");
    assert_eq!(e.value["kind"], "Pod");
    assert_eq!(m["namespace"], "ns");
    assert_eq!(m["generation"], 1);
    assert_eq!(rv_of(&e), e.rv.to_string());
    assert_eq!(m["uid"].as_str().map(str::len), Some(36));
    assert!(
        m["creationTimestamp"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z'))
    );
    assert_eq!(e.value["status"], json!({"phase": "Pending"}));
    assert_eq!(
        serde_json::from_slice::<Value>(&e.json).expect("json"),
        e.value
    );

    let js = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                        "metadata": {"name": "j"}, "spec": {"suspend": true}, "status": {"restarts": 2}});
    let e =
        t.s.create(t.jobsets, "ns", js.clone(), &http())
            .expect("jobset");
    assert!(e.value.get("status").is_none());
    let seeded = WriteOpts {
        keep_status: true,
        ..WriteOpts::default()
    };
    let mut js2 = js;
    js2["metadata"]["name"] = json!("k");
    let e = t.s.create(t.jobsets, "ns", js2, &seeded).expect("seeded");
    assert_eq!(e.value["status"], json!({"restarts": 2}));

    let err =
        t.s.create(t.pods, "ns", running_pod("a", json!({})).build(), &http())
            .expect_err("dup");
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    let err =
        t.s.create(
            t.pods,
            "ns",
            json!({"apiVersion": "v2", "metadata": {"name": "b"}}),
            &http(),
        )
        .expect_err("apiVersion");
    assert_eq!(err.code, 400);
    let err =
        t.s.create(t.pods, "ns", json!({"metadata": {}}), &http())
            .expect_err("name");
    assert_eq!(err.code, 422);
    let err =
        t.s.create(
            t.pods,
            "ns",
            running_pod("Bad_Name", json!({})).build(),
            &http(),
        )
        .expect_err("invalid");
    assert_eq!(err.code, 422);
    let err =
        t.s.create(
            t.pods,
            "ns",
            json!({"metadata": {"name": "x", "namespace": "other"}}),
            &http(),
        )
        .expect_err("namespace");
    assert_eq!(err.code, 400);
    let err =
        t.s.create(t.pods, "ns", json!([1]), &http())
            .expect_err("not an object");
    assert_eq!(err.code, 400);
    let g =
        t.s.create(
            t.pods,
            "ns",
            json!({"metadata": {"generateName": "w-"}}),
            &http(),
        )
        .expect("generateName");
    let name = g.value["metadata"]["name"].as_str().unwrap_or_default();
    assert!(name.starts_with("w-") && name.len() == 7, "{name}");
    let ns =
        t.s.create(
            t.namespaces,
            "ignored",
            json!({"metadata": {"name": "n1"}}),
            &http(),
        )
        .expect("cluster-scoped");
    assert!(ns.value["metadata"].get("namespace").is_none());
    assert!(t.s.get(t.namespaces, "whatever", "n1").is_some());
}

#[test]
fn update_preconditions_status_and_generation() {
    let mut t = setup(100);
    let a =
        t.s.create(t.pods, "ns", running_pod("a", json!({})).build(), &http())
            .expect("create");
    // Main resource: status kept, generation bumped on spec change.
    let mut body = a.value.clone();
    body["spec"]["containers"][0]["image"] = json!("v2");
    body["status"] = json!({"phase": "Failed"});
    let b =
        t.s.update(t.pods, "ns", "a", body, Part::Main, &http())
            .expect("update")
            .0;
    assert_eq!(b.value["status"], json!({"phase": "Pending"}));
    assert_eq!(b.value["metadata"]["generation"], 2);
    assert!(b.rv > a.rv);
    // Stale resourceVersion.
    let err =
        t.s.update(t.pods, "ns", "a", a.value.clone(), Part::Main, &http())
            .expect_err("stale");
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    // Status: only status changes, generation stays.
    let mut body = b.value.clone();
    body["status"] = json!({"phase": "Running"});
    body["spec"] = json!({"ignored": true});
    body["metadata"]["labels"] = json!({"ignored": "too"});
    let c =
        t.s.update(t.pods, "ns", "a", body, Part::Status, &http())
            .expect("status")
            .0;
    assert_eq!(c.value["status"], json!({"phase": "Running"}));
    assert_eq!(c.value["spec"], b.value["spec"]);
    assert_eq!(c.value["metadata"]["labels"], json!({}));
    assert_eq!(c.value["metadata"]["generation"], 2);
    // Metadata-only change: no generation bump. No-op: no new version.
    let mut body = c.value.clone();
    body["metadata"]["labels"] = json!({"x": "y"});
    let d =
        t.s.update(t.pods, "ns", "a", body, Part::Main, &http())
            .expect("labels")
            .0;
    assert_eq!(d.value["metadata"]["generation"], 2);
    let e =
        t.s.update(t.pods, "ns", "a", d.value.clone(), Part::Main, &http())
            .expect("noop")
            .0;
    assert_eq!(e.rv, d.rv);
    // Unconditional update (no resourceVersion), server fields preserved.
    let mut body = d.value.clone();
    if let Some(m) = body["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("uid");
        m.remove("creationTimestamp");
    }
    body["spec"]["x"] = json!(1);
    let f =
        t.s.update(t.pods, "ns", "a", body, Part::Main, &http())
            .expect("unconditional")
            .0;
    assert_eq!(f.value["metadata"]["uid"], a.value["metadata"]["uid"]);
    assert_eq!(
        f.value["metadata"]["creationTimestamp"],
        a.value["metadata"]["creationTimestamp"]
    );
    // Name mismatch, absent object, create on update for leases.
    let err =
        t.s.update(t.pods, "ns", "other", f.value.clone(), Part::Main, &http())
            .expect_err("absent");
    assert_eq!(err.code, 404);
    let err =
        t.s.update(
            t.pods,
            "ns",
            "a",
            json!({"metadata": {"name": "zz"}}),
            Part::Main,
            &http(),
        )
        .expect_err("mismatch");
    assert_eq!(err.code, 400);
    let (l, created) =
        t.s.update(
            t.leases,
            "ns",
            "l",
            json!({"metadata": {"name": "l"}, "spec": {}}),
            Part::Main,
            &http(),
        )
        .expect("lease created");
    assert!(created);
    assert_eq!(l.value["kind"], "Lease");
}

#[test]
fn patches() {
    let mut t = setup(100);
    t.s.create(
        t.pods,
        "ns",
        running_pod("a", json!({"x": "1"})).build(),
        &http(),
    )
    .expect("create");
    let (p, _) =
        t.s.patch(
            t.pods,
            "ns",
            "a",
            PatchType::Merge,
            br#"{"metadata":{"labels":{"x":null,"y":"2"}},"status":{"phase":"Failed"}}"#,
            Part::Main,
            &http(),
        )
        .expect("merge");
    assert_eq!(p.value["metadata"]["labels"], json!({"y": "2"}));
    assert_eq!(p.value["status"]["phase"], "Pending");
    let (s, _) =
        t.s.patch(
            t.pods,
            "ns",
            "a",
            PatchType::Merge,
            br#"{"metadata":{"labels":{"z":"3"}},"status":{"phase":"Running"}}"#,
            Part::Status,
            &http(),
        )
        .expect("status merge");
    assert_eq!(s.value["status"]["phase"], "Running");
    assert_eq!(s.value["metadata"]["labels"], json!({"y": "2"}));
    let stale = format!(
        r#"{{"metadata":{{"resourceVersion":"{}"}},"spec":{{"a":1}}}}"#,
        p.rv
    );
    let err =
        t.s.patch(
            t.pods,
            "ns",
            "a",
            PatchType::Merge,
            stale.as_bytes(),
            Part::Main,
            &http(),
        )
        .expect_err("stale patch");
    assert_eq!(err.code, 409);
    let err =
        t.s.patch(
            t.pods,
            "ns",
            "a",
            PatchType::Json,
            br#"[{"op":"test","path":"/metadata/labels/y","value":"9"}]"#,
            Part::Main,
            &http(),
        )
        .expect_err("test op");
    assert_eq!(err.code, 422);
    let err =
        t.s.patch(
            t.pods,
            "ns",
            "nope",
            PatchType::Merge,
            b"{}",
            Part::Main,
            &http(),
        )
        .expect_err("absent");
    assert_eq!(err.code, 404);
    // Server-side apply: creates, merges, conflicts with another manager, force wins.
    let wo = |m: &str, force: bool| WriteOpts {
        field_manager: Some(m.to_owned()),
        force,
        ..WriteOpts::default()
    };
    let cfg = |holder: &str| {
        format!(
            r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"l"}},"spec":{{"holderIdentity":"{holder}"}}}}"#
        )
    };
    let (l, created) =
        t.s.patch(
            t.leases,
            "ns",
            "l",
            PatchType::Apply,
            cfg("a").as_bytes(),
            Part::Main,
            &wo("a", false),
        )
        .expect("apply creates");
    assert!(created);
    assert_eq!(l.value["spec"]["holderIdentity"], "a");
    let err =
        t.s.patch(
            t.leases,
            "ns",
            "l",
            PatchType::Apply,
            cfg("b").as_bytes(),
            Part::Main,
            &wo("b", false),
        )
        .expect_err("conflict");
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message
            .contains("conflict with \"a\": .spec.holderIdentity"),
        "{}",
        err.message
    );
    let again =
        t.s.patch(
            t.leases,
            "ns",
            "l",
            PatchType::Apply,
            cfg("a").as_bytes(),
            Part::Main,
            &wo("a", false),
        )
        .expect("idempotent")
        .0;
    assert_eq!(again.rv, l.rv);
    let (l, _) =
        t.s.patch(
            t.leases,
            "ns",
            "l",
            PatchType::Apply,
            cfg("b").as_bytes(),
            Part::Main,
            &wo("b", true),
        )
        .expect("forced");
    assert_eq!(l.value["spec"]["holderIdentity"], "b");
    let err =
        t.s.patch(
            t.leases,
            "ns",
            "l",
            PatchType::Apply,
            cfg("b").as_bytes(),
            Part::Main,
            &http(),
        )
        .expect_err("no field manager");
    assert_eq!(err.code, 400);
}

#[test]
fn writes_are_defaulted_pruned_and_validated_as_upstream() {
    let mut t = setup(100);
    let e =
        t.s.create(t.pods, "ns", running_pod("a", json!({})).build(), &http())
            .expect("pod");
    assert_eq!(e.value["spec"]["serviceAccountName"], "default");
    assert_eq!(e.value["spec"]["restartPolicy"], "Always");
    let js = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                        "metadata": {"name": "j"}, "spec": {"suspend": true, "bogus": 1}});
    let e = t.s.create(t.jobsets, "ns", js, &http()).expect("jobset");
    assert_eq!(e.value["spec"], json!({"suspend": true}));
    let mut status = |body: &str| {
        t.s.patch(
            t.jobsets,
            "ns",
            "j",
            PatchType::Merge,
            body.as_bytes(),
            Part::Status,
            &http(),
        )
    };
    let (e, _) = status(r#"{"status":{"syncedEpoch":3,"bogusField":1}}"#).expect("status");
    assert_eq!(e.value["status"], json!({"syncedEpoch": 3}));
    let rv = e.rv;
    let err = status(r#"{"status":{"syncedEpoch":-1}}"#).expect_err("below the minimum");
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        err.status()["details"]["causes"][0]["field"],
        "status.syncedEpoch"
    );
    assert_eq!(
        t.s.get(t.jobsets, "ns", "j").map(|e| e.rv),
        Some(rv),
        "nothing written"
    );
}

#[test]
fn deletes_and_finalizers() {
    let mut t = setup(100);
    let mut p = running_pod("a", json!({})).build();
    p["metadata"]["finalizers"] = json!(["x/y"]);
    t.s.create(t.pods, "ns", p, &http()).expect("create");
    let (e, gone) =
        t.s.delete(t.pods, "ns", "a", &DeleteOpts::default())
            .expect("delete");
    assert!(!gone);
    assert!(e.value["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(e.value["metadata"]["deletionGracePeriodSeconds"], 0);
    // Deleting again changes nothing.
    let (again, gone) =
        t.s.delete(t.pods, "ns", "a", &DeleteOpts::default())
            .expect("again");
    assert!(!gone);
    assert_eq!(again.rv, e.rv);
    // Removing the finalizer removes the object.
    let (last, _) =
        t.s.patch(
            t.pods,
            "ns",
            "a",
            PatchType::Merge,
            br#"{"metadata":{"finalizers":null}}"#,
            Part::Main,
            &http(),
        )
        .expect("unfinalize");
    assert!(t.s.get(t.pods, "ns", "a").is_none());
    assert!(last.rv > e.rv);
    // Foreground propagation: the finalizer of dependents first, as upstream.
    t.s.create(t.pods, "ns", running_pod("f", json!({})).build(), &http())
        .expect("f");
    let (e, gone) =
        t.s.delete(
            t.pods,
            "ns",
            "f",
            &DeleteOpts {
                foreground: true,
                ..DeleteOpts::default()
            },
        )
        .expect("foreground");
    assert!(!gone);
    assert_eq!(
        e.value["metadata"]["finalizers"],
        json!([FOREGROUND_FINALIZER])
    );
    assert!(e.value["metadata"]["deletionTimestamp"].is_string());
    t.s.patch(
        t.pods,
        "ns",
        "f",
        PatchType::Merge,
        br#"{"metadata":{"finalizers":null}}"#,
        Part::Main,
        &http(),
    )
    .expect("dependents gone");
    assert!(t.s.get(t.pods, "ns", "f").is_none());
    // Preconditions.
    let b =
        t.s.create(t.pods, "ns", running_pod("b", json!({})).build(), &http())
            .expect("b");
    let err =
        t.s.delete(
            t.pods,
            "ns",
            "b",
            &DeleteOpts {
                precondition_uid: Some("nope".into()),
                ..DeleteOpts::default()
            },
        )
        .expect_err("uid");
    assert_eq!(err.code, 409);
    let (gone_obj, gone) =
        t.s.delete(t.pods, "ns", "b", &DeleteOpts::default())
            .expect("b");
    assert!(gone);
    assert_eq!(
        gone_obj.value["metadata"]["uid"],
        b.value["metadata"]["uid"]
    );
    assert_eq!(
        t.s.delete(t.pods, "ns", "b", &DeleteOpts::default())
            .expect_err("404")
            .code,
        404
    );
    // Graceful pod deletion for a bound pod.
    let mut c = running_pod("c", json!({})).build();
    c["spec"]["nodeName"] = json!("node");
    c["spec"]["terminationGracePeriodSeconds"] = json!(5);
    t.s.create(t.pods, "ns", c, &http()).expect("c");
    let (e, gone) =
        t.s.delete(t.pods, "ns", "c", &DeleteOpts::default())
            .expect("graceful");
    assert!(!gone);
    assert_eq!(e.value["metadata"]["deletionGracePeriodSeconds"], 5);
    let (_, gone) =
        t.s.delete(
            t.pods,
            "ns",
            "c",
            &DeleteOpts {
                grace_period_seconds: Some(0),
                ..DeleteOpts::default()
            },
        )
        .expect("kubelet");
    assert!(gone);
}

fn names(p: &ListPage) -> Vec<String> {
    p.items
        .iter()
        .map(|e| {
            e.value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn lists_paginate_consistently() {
    let mut t = setup(1000);
    for ns in ["a", "b"] {
        for i in 0..5 {
            let l = if i % 2 == 0 {
                json!({"even": "y"})
            } else {
                json!({})
            };
            t.s.create(
                t.pods,
                ns,
                running_pod(&format!("p{i}"), l).build(),
                &http(),
            )
            .expect("create");
        }
    }
    let q = |ns: Option<&str>, limit, cont: Option<String>| ListQuery {
        filter: Filter {
            namespace: ns.map(str::to_owned),
            ..Filter::default()
        },
        limit,
        continue_token: cont,
        exact_rv: None,
    };
    let all = t.s.list(t.pods, &q(None, None, None)).expect("all");
    assert_eq!(all.items.len(), 10);
    assert!(all.continue_token.is_none());
    let page1 =
        t.s.list(t.pods, &q(Some("a"), Some(2), None))
            .expect("page1");
    assert_eq!(names(&page1), ["p0", "p1"]);
    let rv1 = page1.rv;
    // Changes between pages do not show: the continuation is served as of the first page.
    t.s.delete(t.pods, "a", "p2", &DeleteOpts::default())
        .expect("delete");
    t.s.create(t.pods, "a", running_pod("p25", json!({})).build(), &http())
        .expect("create");
    t.s.patch(
        t.pods,
        "a",
        "p3",
        PatchType::Merge,
        br#"{"metadata":{"labels":{"new":"1"}}}"#,
        Part::Main,
        &http(),
    )
    .expect("patch");
    let page2 =
        t.s.list(t.pods, &q(Some("a"), Some(2), page1.continue_token.clone()))
            .expect("page2");
    assert_eq!(names(&page2), ["p2", "p3"]);
    assert_eq!(page2.rv, rv1);
    assert!(
        page2.items[1].value["metadata"]["labels"]
            .get("new")
            .is_none()
    );
    let page3 =
        t.s.list(t.pods, &q(Some("a"), Some(2), page2.continue_token.clone()))
            .expect("page3");
    assert_eq!(names(&page3), ["p4"]);
    assert!(page3.continue_token.is_none());
    // Exact reads.
    let exact =
        t.s.list(
            t.pods,
            &ListQuery {
                exact_rv: Some(rv1),
                ..q(Some("a"), None, None)
            },
        )
        .expect("exact");
    assert_eq!(names(&exact), ["p0", "p1", "p2", "p3", "p4"]);
    let now = t.s.list(t.pods, &q(Some("a"), None, None)).expect("now");
    assert_eq!(names(&now), ["p0", "p1", "p25", "p3", "p4"]);
    // Selectors with limit: the page fills with matches (a/p2 is gone by now).
    let mut sel = q(None, Some(3), None);
    sel.filter.labels = LabelSelector::parse("even").expect("selector");
    let p = t.s.list(t.pods, &sel).expect("selected");
    assert_eq!(names(&p), ["p0", "p4", "p0"]);
    sel.continue_token = p.continue_token;
    let p = t.s.list(t.pods, &sel).expect("selected 2");
    assert_eq!(names(&p), ["p2", "p4"]);
    assert!(p.continue_token.is_none());
    // Compaction expires the old continue token.
    t.s.compact(t.s.rv());
    let err =
        t.s.list(t.pods, &q(Some("a"), Some(2), page1.continue_token))
            .expect_err("expired");
    assert_eq!((err.code, err.reason.as_str()), (410, "Expired"));
    let err =
        t.s.list(t.pods, &q(None, None, Some("garbage".into())))
            .expect_err("bad token");
    assert_eq!(err.code, 400);
}

fn drain(rx: &mut mpsc::Receiver<Delivery>) -> Vec<(EventType, String, u64)> {
    let mut out = Vec::new();
    while let Ok(d) = rx.try_recv() {
        out.push((
            d.ty,
            d.entry.value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            d.entry.rv,
        ));
    }
    out
}

#[test]
fn watches_follow_selectors_history_and_slowness() {
    let mut t = setup(6);
    t.s.create(
        t.pods,
        "ns",
        running_pod("a", json!({"app": "x"})).build(),
        &http(),
    )
    .expect("a");
    let start_rv = t.s.rv();
    let f = Filter {
        namespace: Some("ns".into()),
        labels: LabelSelector::parse("app=x").expect("sel"),
        ..Filter::default()
    };
    let w =
        t.s.watch(t.pods, f.clone(), WatchFrom::Current)
            .expect("watch");
    assert_eq!(w.initial.len(), 1);
    let mut rx = w.rx;
    t.s.create(
        t.pods,
        "ns",
        running_pod("b", json!({"app": "y"})).build(),
        &http(),
    )
    .expect("b");
    t.s.create(
        t.pods,
        "other",
        running_pod("c", json!({"app": "x"})).build(),
        &http(),
    )
    .expect("c");
    t.s.patch(
        t.pods,
        "ns",
        "b",
        PatchType::Merge,
        br#"{"metadata":{"labels":{"app":"x"}}}"#,
        Part::Main,
        &http(),
    )
    .expect("b enters");
    t.s.patch(
        t.pods,
        "ns",
        "a",
        PatchType::Merge,
        br#"{"metadata":{"labels":{"app":"z"}}}"#,
        Part::Main,
        &http(),
    )
    .expect("a leaves");
    let a_left = t.s.rv();
    t.s.delete(t.pods, "ns", "b", &DeleteOpts::default())
        .expect("b deleted");
    let got = drain(&mut rx);
    let types: Vec<_> = got.iter().map(|(ty, n, _)| (*ty, n.as_str())).collect();
    assert_eq!(
        types,
        [
            (EventType::Added, "b"),
            (EventType::Deleted, "a"),
            (EventType::Deleted, "b")
        ]
    );
    // A DELETED for leaving the selection carries the change's resourceVersion.
    assert_eq!(got[1].2, a_left);
    assert_eq!(t.s.bookmark_rv(&rx), Some(t.s.rv()));

    // Resuming from the history replays the same.
    let resumed =
        t.s.watch(t.pods, f.clone(), WatchFrom::After(start_rv))
            .expect("resume");
    assert_eq!(resumed.initial.len(), 3);
    // Beyond the history: 410.
    for i in 0..6 {
        t.s.create(
            t.pods,
            "ns",
            running_pod(&format!("x{i}"), json!({})).build(),
            &http(),
        )
        .expect("fill");
    }
    let err =
        t.s.watch(t.pods, f.clone(), WatchFrom::After(start_rv))
            .err()
            .expect("expired");
    assert_eq!((err.code, err.reason.as_str()), (410, "Expired"));
    // A watcher that falls behind its buffer (4) is closed.
    let mut slow =
        t.s.watch(t.pods, Filter::default(), WatchFrom::After(t.s.rv()))
            .expect("slow");
    let before = t.s.watcher_count();
    for i in 0..5 {
        t.s.create(
            t.pods,
            "ns",
            running_pod(&format!("s{i}"), json!({})).build(),
            &http(),
        )
        .expect("burst");
    }
    assert_eq!(t.s.watcher_count(), before - 1);
    assert_eq!(drain(&mut slow.rx).len(), 4);
    assert!(slow.rx.is_closed());
    // Name-pinned watchers only see their object.
    let pinned = Filter {
        namespace: Some("ns".into()),
        fields: FieldSelector::parse("metadata.name=s0", t.s.registry().get(t.pods))
            .expect("fields"),
        ..Filter::default()
    };
    let mut w =
        t.s.watch(t.pods, pinned, WatchFrom::After(t.s.rv()))
            .expect("pinned");
    t.s.patch(
        t.pods,
        "ns",
        "s1",
        PatchType::Merge,
        br#"{"spec":{"x":1}}"#,
        Part::Main,
        &http(),
    )
    .expect("s1");
    t.s.patch(
        t.pods,
        "ns",
        "s0",
        PatchType::Merge,
        br#"{"spec":{"x":1}}"#,
        Part::Main,
        &http(),
    )
    .expect("s0");
    let got = drain(&mut w.rx);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, "s0");
    assert!(t.s.close_watchers() >= 2);
    assert!(w.rx.is_closed());
}
