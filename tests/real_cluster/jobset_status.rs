//! A stolen reconciler token on JobSets' status (issue 46, item 4)

use super::*;

const POLICY: &str = "jobset-inplace-reconciler-jobset-status";

/// The status fields the reconciler writes (src/reconciler/controller/status.rs, deadline.rs):
/// the epoch fields of both dialects, restarts, the Failed condition and terminalState.
const OWNED: [&str; 8] = [
    "deprecatedEpoch",
    "syncedEpoch",
    "previousInPlaceRestartAttempt",
    "currentInPlaceRestartAttempt",
    "restarts",
    "restartsCountTowardsMax",
    "conditions",
    "terminalState",
];

/// Issue 46, item 4: with the reconciler's own token (a TokenRequest of its ServiceAccount) on
/// the real API server with JobSet's controller, a merge patch on a JobSet's status that is none
/// of the reconciler's writes is refused by the policy (RBAC grants every one of them):
/// replicatedJobsStatus changed, a condition it never writes, a Failed condition of another
/// reason, terminalState Completed or Failed without its condition, the synced epoch lowered,
/// restarts raised by two. The reconciler itself, run with the same account, still writes what it
/// writes: the synced and deprecated epochs through a group restart, then the JobSet failed past
/// maxRestarts (condition and terminalState). The policy holds every status field of this API
/// server's JobSet schema that the reconciler does not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_reconciler_token_may_write_only_its_own_jobset_status_fields() {
    with_cluster(
        "a_stolen_reconciler_token_may_write_only_its_own_jobset_status_fields",
        |cluster| async move {
            if !jobset_controller_runs(&cluster).await {
                panic!("JobSet's controller is not running (scripts/control-plane.sh starts it)");
            }
            let installed = install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-status").await;
            let admin = jobset_api(&cluster.client, &ns.name);
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            let pp = PatchParams::default();
            let mut js = fixture_object("story1-plain");
            js["metadata"] = json!({"name": "own", "namespace": ns.name});
            js["spec"]["failurePolicy"]["maxRestarts"] = json!(1);
            let job = &mut js["spec"]["replicatedJobs"][0];
            job["replicas"] = json!(1);
            job["template"]["spec"]["parallelism"] = json!(2);
            job["template"]["spec"]["completions"] = json!(2);
            job["template"]["spec"]["backoffLimit"] = json!(2147483647);
            job["template"]["spec"]["podReplacementPolicy"] = json!("Failed");
            admin
                .create(&PostParams::default(), &serde_json::from_value(js).expect("JobSet"))
                .await
                .expect("create the JobSet");
            let stolen = jobset_api(
                &token_client(&cluster, &account_token(&cluster, SYSTEM_NAMESPACE, RECONCILER_ACCOUNT).await)
                    .await,
                &ns.name,
            );
            // What JobSet's controller reports first (replicatedJobsStatus), so that changing it
            // is a change.
            eventually("JobSet's controller wrote the status", Duration::from_secs(60), || async {
                let got = admin.get("own").await.map_err(|e| e.to_string())?;
                got.data["status"]["replicatedJobsStatus"]
                    .is_array()
                    .then_some(())
                    .ok_or(format!("{}", got.data["status"]))
            })
            .await;
            let dry = PatchParams { dry_run: true, ..PatchParams::default() };
            let replicated = json!({"status": {"replicatedJobsStatus": [
                {"name": "workers", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}]}});
            let probe = merge(replicated.clone());
            until_enforced(POLICY, || stolen.patch_status("own", &dry, &probe))
            .await;

            let reconciler = Reconciler::start(&cluster, "real-cluster-status").await;
            reconciler.ready().await;
            let selector = "jobset.sigs.k8s.io/jobset-name=own";
            let made: Vec<String> = eventually("2 pods of the JobSet", Duration::from_secs(120), || async {
                let items = pods
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                (items.len() == 2)
                    .then(|| items.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect())
                    .ok_or(format!("{} pods", items.len()))
            })
            .await;
            let want = |d: Option<i64>, s: Option<i64>| {
                let admin = admin.clone();
                move || {
                    let admin = admin.clone();
                    async move {
                        let got = epochs(&admin, "own").await?;
                        (got == (d, s)).then_some(()).ok_or(format!("{got:?}"))
                    }
                }
            };
            // The reconciler's own epoch writes.
            for name in &made {
                pods.patch(name, &pp, &epoch_patch("1")).await.expect("register 1");
            }
            try_eventually(Duration::from_secs(60), want(None, Some(1)))
                .await
                .unwrap_or_else(|e| panic!("synced 1: {e}\nreconciler:\n{}", reconciler.log_tail()));

            // The attacks, each refused by the policy.
            let now = admin.get("own").await.expect("own");
            let conditions = now.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
            let with_condition = |condition: Value| {
                let mut c = conditions.clone();
                c.retain(|x| x["type"] != condition["type"]);
                c.push(condition);
                json!({"status": {"conditions": c}})
            };
            let condition = |kind: &str, reason: &str| {
                json!({"type": kind, "status": "True", "reason": reason, "message": "stolen",
                       "lastTransitionTime": "2026-01-01T00:00:00Z"})
            };
            let restarts = now.data["status"]["restarts"].as_i64().unwrap_or(0);
            let attacks = [
                ("replicatedJobsStatus changed", replicated.clone(), "change nothing of a JobSet's status but"),
                ("a condition it never writes", with_condition(condition("Completed", "AllJobsCompleted")),
                 "conditions only to fail it"),
                ("a Failed condition of another reason", with_condition(condition("Failed", "FailedJobs")),
                 "conditions only to fail it"),
                ("terminalState Completed", json!({"status": {"terminalState": "Completed"}}), "terminalState only to Failed"),
                ("terminalState Failed without its condition", json!({"status": {"terminalState": "Failed"}}),
                 "terminalState only to Failed"),
                ("the synced epoch lowered", json!({"status": {"syncedEpoch": 0}}), "only raise a JobSet's epoch fields"),
                ("restarts raised by two", json!({"status": {"restarts": restarts + 2}}), "restarts and restartsCountTowardsMax by one"),
            ];
            for (what, patch, said) in attacks {
                let (code, _, message, _) = api_error(stolen.patch_status("own", &pp, &merge(patch)).await)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(code, 403, "{what}: {message}");
                assert!(
                    message.contains(&format!("ValidatingAdmissionPolicy '{POLICY}'")) && message.contains(said),
                    "{what}: refused by {POLICY} with `{said}`: {message}"
                );
            }
            // The status endpoint of a CRD keeps everything but the status as stored.
            let _ = stolen
                .patch_status("own", &pp, &merge(json!({"metadata": {"labels": {"stolen": "yes"}}})))
                .await;
            let kept = admin.get("own").await.expect("own");
            assert!(kept.metadata.labels.as_ref().is_none_or(|l| !l.contains_key("stolen")), "{:?}", kept.metadata);
            assert_eq!(kept.data["status"]["replicatedJobsStatus"], now.data["status"]["replicatedJobsStatus"]);

            // The reconciler's own writes go on: a group restart, then one restart too many.
            pods.patch(&made[0], &pp, &epoch_patch("2")).await.expect("at 2");
            try_eventually(Duration::from_secs(30), want(Some(1), Some(1)))
                .await
                .unwrap_or_else(|e| panic!("deprecated 1: {e}\nreconciler:\n{}", reconciler.log_tail()));
            pods.patch(&made[1], &pp, &epoch_patch("2")).await.expect("at 2");
            try_eventually(Duration::from_secs(30), want(Some(1), Some(2)))
                .await
                .unwrap_or_else(|e| panic!("synced 2: {e}\nreconciler:\n{}", reconciler.log_tail()));
            pods.patch(&made[0], &pp, &epoch_patch("3")).await.expect("at 3");
            try_eventually(Duration::from_secs(30), || async {
                let got = admin.get("own").await.map_err(|e| e.to_string())?;
                let status = &got.data["status"];
                let failed = status["conditions"].as_array().into_iter().flatten().any(|c| {
                    c["type"] == "Failed" && c["status"] == "True" && c["reason"] == "ReachedMaxRestarts"
                });
                (failed && status["terminalState"] == "Failed").then_some(()).ok_or(format!("{status}"))
            })
            .await
            .unwrap_or_else(|e| panic!("failed by the reconciler: {e}\nreconciler:\n{}", reconciler.log_tail()));
            // Its events went through its events policy too.
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(cluster.client.clone(), &ns.name);
            try_eventually(Duration::from_secs(30), || async {
                let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("MaxRestartsExceeded"))
                    .then_some(())
                    .ok_or(format!("{} events", list.items.len()))
            })
            .await
            .unwrap_or_else(|e| panic!("its event: {e}\nreconciler:\n{}", reconciler.log_tail()));
            assert!(
                !reconciler.log_tail().contains("jobset-inplace-reconciler-"),
                "the reconciler met its policy:\n{}",
                reconciler.log_tail()
            );
            reconciler.kill().await;

            // Every status field of the API server's JobSet schema is the reconciler's or held.
            let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
                Api::all(cluster.client.clone());
            let crd = serde_json::to_value(crds.get("jobsets.jobset.x-k8s.io").await.expect("the JobSet CRD"))
                .expect("json");
            let fields: Vec<String> = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
                ["status"]["properties"]
                .as_object()
                .expect("status properties")
                .keys()
                .cloned()
                .collect();
            assert!(fields.iter().any(|f| f == "replicatedJobsStatus"), "{fields:?}");
            let policy = installed
                .iter()
                .find(|o| o["kind"] == "ValidatingAdmissionPolicy" && o["metadata"]["name"] == POLICY)
                .expect("the policy");
            let text = policy["spec"]["validations"].to_string();
            for field in &fields {
                let held = format!("has(variables.new.{field}) == has(variables.old.{field})");
                assert!(
                    OWNED.contains(&field.as_str()) || text.contains(&held),
                    "JobSetStatus.{field} is not held by {POLICY}"
                );
            }
            drop(ns);
        },
    )
    .await;
}

/// Issue 46, item 4: with the reconciler's own token, an event about anything but a JobSet of the
/// event's namespace (a pod, a JobSet named in another namespace, a related Node) or reported as
/// another controller is refused by `jobset-inplace-reconciler-events`; an event as its recorder
/// writes it (regarding the JobSet, a pod related) is created. RBAC allows every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_reconciler_token_may_write_only_events_about_jobsets() {
    with_cluster(
        "a_stolen_reconciler_token_may_write_only_events_about_jobsets",
        |cluster| async move {
            install(&cluster, "epoch").await;
            delete_webhook_configurations(&cluster).await;
            let ns = TestNamespace::create(&cluster, "rc-events").await;
            let policy = "jobset-inplace-reconciler-events";
            let client =
                token_client(&cluster, &account_token(&cluster, SYSTEM_NAMESPACE, RECONCILER_ACCOUNT).await)
                    .await;
            let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, &ns.name);
            let event = |name: &str, regarding: Value, related: Option<Value>, controller: &str| {
                let mut e = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                    "metadata": {"name": name, "namespace": ns.name},
                    "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Warning", "reason": "Stolen",
                    "action": "Reconcile", "note": "stolen", "reportingController": controller,
                    "reportingInstance": "x", "regarding": regarding});
                if let Some(r) = related {
                    e["related"] = r;
                }
                serde_json::from_value::<k8s_openapi::api::events::v1::Event>(e).expect("event")
            };
            let jobset = |namespace: &str| {
                json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "namespace": namespace, "name": "js"})
            };
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "namespace": ns.name, "name": "p"});
            let own = "jobset-inplace-reconciler";
            let probe = event("probe", pod.clone(), None, own);
            let dry = PostParams { dry_run: true, ..PostParams::default() };
            until_enforced(policy, || events.create(&dry, &probe)).await;
            let attacks = [
                ("about a pod", event("a", pod.clone(), None, own), "only events about a JobSet of the event's namespace"),
                ("about a JobSet of another namespace", event("b", jobset("kube-system"), None, own),
                 "only events about a JobSet of the event's namespace"),
                ("a Node related", event("c", jobset(&ns.name), Some(json!({"apiVersion": "v1", "kind": "Node", "name": "n"})), own),
                 "only to a pod of the event's namespace"),
                ("reported as another controller", event("d", jobset(&ns.name), None, "kubelet"),
                 "reports its events as jobset-inplace-reconciler"),
            ];
            for (what, e, said) in attacks {
                let (code, _, message, _) = api_error(events.create(&PostParams::default(), &e).await)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(code, 403, "{what}: {message}");
                assert!(
                    message.contains(&format!("ValidatingAdmissionPolicy '{policy}'")) && message.contains(said),
                    "{what}: refused by {policy} with `{said}`: {message}"
                );
            }
            events
                .create(&PostParams::default(), &event("mine", jobset(&ns.name), Some(pod.clone()), own))
                .await
                .expect("an event as the reconciler writes it");
            drop(ns);
        },
    )
    .await;
}
