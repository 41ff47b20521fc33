//! The test API server answers as the real one

use super::*;

/// A suspended JobSet of one Job of plain busybox pods (no failure policy, no parallelism): the
/// same object sent to both API servers.
fn agreement_jobset(name: &str) -> DynamicObject {
    build::JobSet::new(name)
        .no_failure_policy()
        .no_status()
        .set("/spec/suspend", json!(true))
        .replicated_jobs([build::ReplicatedJob::new("w")
            .remove("/template/spec/parallelism")
            .remove("/template/spec/completions")
            .container("c", "busybox")
            .pod_spec("restartPolicy", json!("Never"))])
        .typed()
}

/// What a DELETE answers: the object (`Either::Left`: its kind and deletion fields) or a Status
/// (`Either::Right`: its status and details, the uid only as present).
async fn delete_answer(api: &Api<DynamicObject>, name: &str) -> Value {
    let answer = api
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    if let Some(o) = answer.clone().left() {
        return json!({
            "object": o.types.map(|t| t.kind),
            "deletionTimestamp": o.metadata.deletion_timestamp.is_some(),
            "deletionGracePeriodSeconds": o.metadata.deletion_grace_period_seconds,
        });
    }
    let s = answer.right().unwrap_or_default();
    json!({
        "status": s.status,
        "details": s.details.map(|d| json!({"name": d.name, "group": d.group, "kind": d.kind,
                                             "uid": !d.uid.is_empty()})),
    })
}

/// The same requests as a client sends them, and what the answers say about what both servers
/// must agree on: status pruning, a 422 with its field, the failed JSON patch, a pod's defaults,
/// and what a DELETE answers per kind.
async fn agreement_answers(client: &Client, namespace: &str) -> Value {
    let pp = PostParams::default();
    let jobsets = jobset_api(client, namespace);
    jobsets
        .create(&pp, &agreement_jobset("agree"))
        .await
        .expect("create JobSet");
    let patched = jobsets
        .patch_status(
            "agree",
            &PatchParams::default(),
            &merge(json!({"status": {"syncedEpoch": 3, "bogusField": 1}})),
        )
        .await
        .expect("status patch");
    let status = &patched.data["status"];
    let pruned =
        json!({"syncedEpoch": status["syncedEpoch"], "bogusField": status.get("bogusField")});
    let invalid = status_error(
        jobsets
            .patch_status(
                "agree",
                &PatchParams::default(),
                &merge(json!({"status": {"syncedEpoch": -1}})),
            )
            .await,
    );
    let test_op: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/name", "value": "other"}]))
            .expect("JSON patch");
    let failed_test = status_error(
        jobsets
            .patch(
                "agree",
                &PatchParams::default(),
                &Patch::Json::<()>(test_op),
            )
            .await,
    );

    let pods = dynamic::<Pod>(client, namespace);
    let pod: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agree"},
        "spec": {
            "initContainers": [{"name": "i", "image": "busybox:1.36"}],
            "containers": [
                {"name": "a", "image": "busybox", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "busybox:latest"},
                {"name": "c", "image": "registry.local:5000/x@sha256:0000000000000000000000000000000000000000000000000000000000000000"},
                {"name": "d", "image": "busybox:1.36", "imagePullPolicy": "Never"},
            ],
        },
    }))
    .expect("Pod");
    // The ServiceAccount admission plugin waits for the namespace's default account.
    let created = eventually("create pod", Duration::from_secs(30), || async {
        pods.create(&pp, &pod).await.map_err(|e| e.to_string())
    })
    .await;
    let spec = &created.data["spec"];
    let pick = |object: &Value, fields: &[&str]| -> Value {
        fields
            .iter()
            .map(|f| ((*f).to_owned(), object[*f].clone()))
            .collect()
    };
    let container_fields = [
        "name",
        "imagePullPolicy",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "resources",
        "ports",
    ];
    let containers = |list: &str| -> Value {
        spec[list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| pick(c, &container_fields))
            .collect()
    };
    let pod_defaults = json!({
        "spec": pick(spec, &[
            "restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy", "serviceAccountName",
            "serviceAccount", "securityContext", "schedulerName", "enableServiceLinks", "priority",
            "preemptionPolicy",
        ]),
        "initContainers": containers("initContainers"),
        "containers": containers("containers"),
    });

    // KEP-467's `RestartPod` action: refused (the 1.35 API knows `RestartAllContainers`).
    let restart_pod: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agree-restart-pod"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "w", "image": "busybox:1.36", "restartPolicy": "Never",
            "restartPolicyRules": [
                {"action": "RestartPod", "exitCodes": {"operator": "NotIn", "values": [0]}}]}]},
    }))
    .expect("Pod");
    let restart_pod = status_error(pods.create(&pp, &restart_pod).await);

    let leases = dynamic::<k8s_openapi::api::coordination::v1::Lease>(client, namespace);

    let lease: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "agree"}}))
    .expect("Lease");
    leases.create(&pp, &lease).await.expect("create Lease");
    let accounts = dynamic::<ServiceAccount>(client, namespace);
    let account: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agree"}}))
    .expect("ServiceAccount");
    accounts
        .create(&pp, &account)
        .await
        .expect("create ServiceAccount");
    let deletes = json!({
        "jobset": delete_answer(&jobsets, "agree").await,
        "pod": delete_answer(&pods, "agree").await,
        "lease": delete_answer(&leases, "agree").await,
        "serviceaccount": delete_answer(&accounts, "agree").await,
    });
    json!({
        "prunedStatus": pruned,
        "invalidStatus": serde_json::to_value(&invalid).expect("json"),
        "failedJsonPatchTest": serde_json::to_value(&failed_test).expect("json"),
        "podDefaults": pod_defaults,
        "restartPodAction": serde_json::to_value(&restart_pod).expect("json"),
        "deletes": deletes,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_api_server_answers_as_the_real_one() {
    with_cluster(
        "the_test_api_server_answers_as_the_real_one",
        |cluster| async move {
            delete_webhook_configurations(&cluster).await;
            // Left installed, as the overlays of the `epoch` dialect install them.
            ensure_epoch_status_fields(&cluster).await;
            let ns = TestNamespace::create(&cluster, "agree").await;
            // The API server serves the changed schema a moment after the CRD changes.
            let jobsets = jobset_api(&cluster.client, &ns.name);
            jobsets
                .create(&PostParams::default(), &agreement_jobset("schema-probe"))
                .await
                .expect("create JobSet");
            eventually(
                "the epoch status fields served",
                Duration::from_secs(30),
                || async {
                    let o = jobsets
                        .patch_status(
                            "schema-probe",
                            &PatchParams::default(),
                            &merge(json!({"status": {"syncedEpoch": 1}})),
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    (o.data["status"]["syncedEpoch"] == 1)
                        .then_some(())
                        .ok_or("pruned".to_owned())
                },
            )
            .await;

            let real = agreement_answers(&cluster.client, &ns.name).await;
            let server = jobset_inplace_testkit::apiserver::TestApiServer::start().await;
            let test = agreement_answers(&server.client(), &ns.name).await;
            server.shutdown().await;
            eprintln!("real API server: {real:#}");
            assert_eq!(
                test, real,
                "test API server (left) and real API server (right) disagree"
            );
            // What the comparison stands on.
            assert_eq!(
                real["prunedStatus"],
                json!({"syncedEpoch": 3, "bogusField": null})
            );
            assert_eq!(real["invalidStatus"]["code"], 422);
            assert_eq!(
                real["invalidStatus"]["details"]["causes"][0]["field"],
                "status.syncedEpoch"
            );
            assert_eq!(real["restartPodAction"]["code"], 422);
            assert_eq!(
                real["restartPodAction"]["details"]["causes"][0]["field"],
                "spec.containers[0].restartPolicyRules[0].action"
            );
            assert_eq!(real["deletes"]["jobset"]["status"], "Success");
            assert_eq!(real["deletes"]["pod"]["object"], "Pod");

            drop(ns);
        },
    )
    .await;
}
