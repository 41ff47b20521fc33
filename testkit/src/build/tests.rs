use super::*;

#[test]
fn a_new_jobset_is_an_in_place_one_of_one_job_of_one_pod() {
    let js = JobSet::new("js").namespace("team-a").build();
    assert_eq!(
        js,
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "team-a"},
            "spec": {"failurePolicy": {"restartStrategy": "InPlaceRestart", "maxRestarts": 3},
                     "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                         "parallelism": 1, "completions": 1,
                         "template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}}}]},
            "status": {}
        })
    );
}

#[test]
fn jobset_setters_change_their_one_field() {
    let js = JobSet::new("js")
        .max_restarts(7)
        .strategy("Recreate")
        .replicas(2)
        .pods(3)
        .container("c", "i")
        .label("l", "1")
        .annotation("a", "2")
        .status_field("syncedEpoch", json!(4))
        .build();
    assert_eq!(
        js["spec"]["failurePolicy"],
        json!({"restartStrategy": "Recreate", "maxRestarts": 7})
    );
    let rj = &js["spec"]["replicatedJobs"][0];
    assert_eq!(rj["replicas"], 2);
    assert_eq!(rj["template"]["spec"]["parallelism"], 3);
    assert_eq!(rj["template"]["spec"]["completions"], 3);
    assert_eq!(
        rj["template"]["spec"]["template"]["spec"]["containers"],
        json!([{"name": "c", "image": "i"}])
    );
    assert_eq!(js["metadata"]["labels"], json!({"l": "1"}));
    assert_eq!(js["metadata"]["annotations"], json!({"a": "2"}));
    assert_eq!(js["status"], json!({"syncedEpoch": 4}));

    let bare = JobSet::new("js").no_failure_policy().no_status().build();
    assert!(bare["spec"].get("failurePolicy").is_none());
    assert!(bare.get("status").is_none());
}

#[test]
fn replicated_jobs_replace_the_default_and_each_sets_its_own() {
    let js = JobSet::new("js")
        .replicated_jobs([
            ReplicatedJob::new("a")
                .replicas(2)
                .parallelism(3)
                .no_completions(),
            ReplicatedJob::new("b")
                .backoff_limit(0)
                .pod_replacement_policy("Failed")
                .pod_spec("serviceAccountName", json!("trainer")),
        ])
        .build();
    let rjs = js["spec"]["replicatedJobs"].as_array().expect("array");
    assert_eq!(rjs.len(), 2);
    assert_eq!(rjs[0]["name"], "a");
    assert_eq!(rjs[0]["replicas"], 2);
    assert_eq!(rjs[0]["template"]["spec"]["parallelism"], 3);
    assert!(rjs[0]["template"]["spec"].get("completions").is_none());
    let b = &rjs[1]["template"]["spec"];
    assert_eq!(b["backoffLimit"], 0);
    assert_eq!(b["podReplacementPolicy"], "Failed");
    assert_eq!(b["template"]["spec"]["serviceAccountName"], "trainer");
}

#[test]
fn as_jobset_requires_sets_what_jobsets_webhook_asks_in_every_job() {
    let js = JobSet::new("js")
        .replicated_jobs([
            ReplicatedJob::new("a").parallelism(4).completions(1),
            ReplicatedJob::new("b").parallelism(2).no_completions(),
        ])
        .as_jobset_requires()
        .build();
    for (rj, pods) in js["spec"]["replicatedJobs"]
        .as_array()
        .expect("array")
        .iter()
        .zip([4, 2])
    {
        let job = &rj["template"]["spec"];
        assert_eq!(job["backoffLimit"], 2_147_483_647);
        assert_eq!(job["podReplacementPolicy"], "Failed");
        assert_eq!(job["completions"], pods);
        assert_eq!(job["parallelism"], pods);
    }
}

#[test]
fn set_and_remove_write_at_a_pointer() {
    let js = JobSet::new("js")
        .set("/spec/futureField/kept", json!([1, 2]))
        .set("/spec/replicatedJobs/0/replicas", json!(9))
        .set("/metadata/labels/a~1b", json!("x"))
        .remove("/spec/failurePolicy/maxRestarts")
        .remove("/spec/nothing/here")
        .build();
    assert_eq!(js["spec"]["futureField"], json!({"kept": [1, 2]}));
    assert_eq!(js["spec"]["replicatedJobs"][0]["replicas"], 9);
    assert_eq!(js["metadata"]["labels"]["a/b"], "x");
    assert_eq!(
        js["spec"]["failurePolicy"],
        json!({"restartStrategy": "InPlaceRestart"})
    );
}

#[test]
fn a_jobset_deserializes_as_the_products_type_and_a_dynamic_object() {
    let js: jobset_inplace::jobset::JobSet = JobSet::new("js").namespace("ns").typed();
    assert_eq!(js.metadata.name.as_deref(), Some("js"));
    let dynamic: kube::api::DynamicObject = JobSet::new("js").namespace("ns").typed();
    assert_eq!(dynamic.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(dynamic.data["spec"]["replicatedJobs"][0]["name"], "w");
}

#[test]
fn a_pod_of_a_jobset_is_labelled_and_annotated_and_runs() {
    let pod = Pod::new("js-0")
        .namespace("team-a")
        .of_jobset("js")
        .epoch("jobset.sigs.k8s.io/epoch", "3")
        .running()
        .build();
    assert_eq!(
        pod,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "js-0", "namespace": "team-a",
                         "labels": {JOBSET_NAME_LABEL: "js"},
                         "annotations": {JOBSET_NAME_LABEL: "js", "jobset.sigs.k8s.io/epoch": "3"}},
            "spec": {"containers": [{"name": "w", "image": "w"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "w", "restartCount": 0}]}
        })
    );
}

#[test]
fn a_reported_pod_has_a_status_for_each_container_and_its_sidecar() {
    let pod = Pod::new("p")
        .container("worker", "w")
        .agent_sidecar("a")
        .node("n")
        .service_account("sa")
        .reported(true, 1)
        .build();
    assert_eq!(pod["spec"]["nodeName"], "n");
    assert_eq!(pod["spec"]["serviceAccountName"], "sa");
    assert_eq!(
        pod["spec"]["initContainers"],
        json!([{"name": "jobset-inplace-agent", "image": "a", "restartPolicy": "Always"}])
    );
    assert_eq!(
        pod["status"],
        json!({"phase": "Running",
               "initContainerStatuses": [{"name": "jobset-inplace-agent", "started": true,
                   "ready": true, "restartCount": 1, "image": "a", "imageID": ""}],
               "containerStatuses": [{"name": "worker", "ready": true, "restartCount": 1,
                   "image": "w", "imageID": ""}]})
    );
    let pending = Pod::new("p").phase("Pending").build();
    assert_eq!(
        Pod::worker("ns", "js", "p").build(),
        Pod::new("p").namespace("ns").of_jobset("js").build()
    );
    assert_eq!(pending["status"], json!({"phase": "Pending"}));
}

#[test]
fn a_pod_owned_by_a_job_deserializes_as_k8s_openapis_pod() {
    let pod: k8s_openapi::api::core::v1::Pod = Pod::new("p")
        .namespace("ns")
        .uid("u-1")
        .resource_version("7")
        .labels(json!({"app": "x"}))
        .owned_by_job("js-w-0", "j-1")
        .typed();
    assert_eq!(pod.metadata.uid.as_deref(), Some("u-1"));
    assert_eq!(pod.metadata.resource_version.as_deref(), Some("7"));
    let owner = &pod.metadata.owner_references.expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Job", "js-w-0")
    );
    assert_eq!(owner.controller, Some(true));
    assert_eq!(pod.metadata.labels.expect("labels")["app"], "x");
}

#[test]
fn a_job_of_a_jobset_carries_its_label_and_controller_reference() {
    let job = Job::new("js-w-0")
        .namespace("ns")
        .of_jobset("js", "uid-1")
        .label("jobset.sigs.k8s.io/restart-attempt", "0")
        .build();
    assert_eq!(
        job,
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "js-w-0", "namespace": "ns",
                         "labels": {JOBSET_NAME_LABEL: "js", "jobset.sigs.k8s.io/restart-attempt": "0"},
                         "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                              "name": "js", "uid": "uid-1", "controller": true}]},
            "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}
        })
    );
    let bare = Job::new("j")
        .owned_by_jobset("js", "uid-1")
        .containers(json!([]))
        .build();
    assert!(bare["metadata"].get("labels").is_none());
    assert_eq!(bare["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(bare["spec"]["template"]["spec"]["containers"], json!([]));
    let typed: k8s_openapi::api::batch::v1::Job = Job::new("j").typed();
    assert_eq!(typed.metadata.name.as_deref(), Some("j"));
}

#[test]
fn a_fixture_is_renamed_and_changed_with_the_setters() {
    let fixture = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                         "metadata": {"name": "x"},
                         "spec": {"replicatedJobs": [{"name": "a", "template": {"spec": {"parallelism": 2}}}]}});
    let js = JobSet::from_value(fixture)
        .name("y")
        .namespace("ns")
        .each_job(|j| {
            j.remove("/template/spec/parallelism")
                .set("/replicas", json!(3))
        })
        .build();
    assert_eq!(js["metadata"], json!({"name": "y", "namespace": "ns"}));
    assert_eq!(
        js["spec"]["replicatedJobs"],
        json!([{"name": "a", "replicas": 3, "template": {"spec": {}}}])
    );
}
