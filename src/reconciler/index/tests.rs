use super::*;
use crate::protocol::JOBSET_NAME_LABEL;
use serde_json::json;

/// The controller reference the Job controller sets on the pods of `jobset`'s one Job.
fn job_owner(jobset: &str) -> serde_json::Value {
    json!([{"apiVersion": "batch/v1", "kind": "Job", "name": format!("{jobset}-job"),
                "uid": format!("{jobset}-job-uid"), "controller": true, "blockOwnerDeletion": true}])
}

/// `jobset`'s one Job, as JobSet's controller creates it (the JobSets here have UID `u`).
fn job(jobset: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    serde_json::from_value(json!({
        "name": format!("{jobset}-job"), "namespace": "ns", "uid": format!("{jobset}-job-uid"),
        "labels": {JOBSET_NAME_LABEL: jobset},
        "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                             "name": jobset, "uid": "u", "controller": true}]
    }))
    .expect("job")
}

/// An index whose Job watch has listed the Jobs of `jobsets`.
fn with_jobs(jobsets: &[&str]) -> Index {
    let mut index = Index::new(Dialect::Epoch);
    index.jobs_relisting();
    for js in jobsets {
        index.apply_job(&job(js));
    }
    index.jobs_relisted();
    index
}

fn pod(name: &str, jobset: &str, epoch: Option<&str>) -> WatchedPod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "labels": {JOBSET_NAME_LABEL: jobset},
                     "annotations": {}, "ownerReferences": job_owner(jobset)},
        "status": {"phase": "Running", "containerStatuses": [{"name": "w", "restartCount": 1}],
                   "initContainerStatuses": [{"name": "a", "restartCount": 2}]}
    });
    if let Some(e) = epoch {
        v["metadata"]["annotations"]["jobset.sigs.k8s.io/epoch"] = json!(e);
    }
    serde_json::from_value(v).expect("pod")
}

fn jobset(name: &str, synced: Option<i32>) -> JobSet {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": "u", "resourceVersion": "1"},
        "spec": {"failurePolicy": {"restartStrategy": "InPlaceRestart", "maxRestarts": 3},
                 "replicatedJobs": [{"name": "w", "replicas": 2,
                                     "template": {"spec": {"parallelism": 2}}}]},
        "status": {}
    });
    if let Some(s) = synced {
        v["status"]["syncedEpoch"] = json!(s);
    }
    serde_json::from_value(v).expect("jobset")
}

fn key(name: &str) -> Key {
    Key::new("ns", name)
}

#[test]
fn pod_view_reads_what_the_algorithm_needs() {
    let view = pod("p", "js", Some("3")).view(Dialect::Epoch);
    assert_eq!(view.epoch_annotation.as_deref(), Some("3"));
    assert_eq!(view.max_restart_count, 2);
    assert!(!view.failed && !view.terminating);
    assert_eq!(
        pod("p", "js", Some("3"))
            .view(Dialect::Attempt)
            .epoch_annotation,
        None
    );
}

#[test]
fn only_relevant_changes_trigger() {
    let mut index = with_jobs(&["js"]);
    assert_eq!(index.apply_jobset(&jobset("js", None)), Some(key("js")));
    let mut same = jobset("js", None);
    same.metadata.resource_version = Some("2".into());
    assert_eq!(
        index.apply_jobset(&same),
        None,
        "a new resourceVersion alone"
    );
    assert_eq!(
        index
            .jobset(&key("js"))
            .map(|j| j.resource_version.as_str()),
        Some("2")
    );
    assert_eq!(index.apply_jobset(&jobset("js", Some(1))), Some(key("js")));

    assert_eq!(index.apply_pod(&pod("a", "js", None)), vec![key("js")]);
    let mut relabelled = pod("a", "js", None);
    relabelled
        .metadata
        .labels
        .as_mut()
        .map(|l| l.insert("x".into(), "y".into()));
    assert!(
        index.apply_pod(&relabelled).is_empty(),
        "an unrelated label"
    );
    assert_eq!(index.apply_pod(&pod("a", "js", Some("1"))), vec![key("js")]);
    assert_eq!(index.pod_count(), 1);
    let (_, pods) = index.get(&key("js")).expect("indexed");
    assert_eq!(pods.len(), 1);
}

fn restarting(name: &str, uid: &str, epoch: &str, condition: Option<&str>) -> WatchedPod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid,
                     "labels": {JOBSET_NAME_LABEL: "js"}, "ownerReferences": job_owner("js"),
                     "annotations": {"jobset.sigs.k8s.io/epoch": epoch}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    });
    if let Some(c) = condition {
        v["status"]["conditions"]
            .as_array_mut()
            .expect("conditions")
            .push(json!({"type": "AllContainersRestarting", "status": c}));
    }
    serde_json::from_value(v).expect("pod")
}

fn begun(index: &Index, name: &str) -> bool {
    let (_, pods) = index.get(&key("js")).expect("indexed");
    pods.iter().any(|p| p.name == name && p.restart_begun)
}

#[test]
fn a_restart_begins_when_the_condition_turns_true_at_an_epoch_seen_otherwise() {
    let mut index = with_jobs(&["js"]);
    index.apply_jobset(&jobset("js", Some(2)));
    index.apply_pod(&restarting("a", "u1", "2", Some("False")));
    assert!(!begun(&index, "a"));
    assert_eq!(
        index.apply_pod(&restarting("a", "u1", "2", Some("True"))),
        vec![key("js")],
        "the turn is news for the JobSet"
    );
    assert!(begun(&index, "a"));
    // The new agent registers the next epoch while the condition still says True (the
    // kubelet's False not written yet): not a new restart.
    index.apply_pod(&restarting("a", "u1", "3", Some("True")));
    assert!(!begun(&index, "a"));
    index.apply_pod(&restarting("a", "u1", "3", None));
    assert!(!begun(&index, "a"));
    index.apply_pod(&restarting("a", "u1", "3", Some("True")));
    assert!(
        begun(&index, "a"),
        "absent arms too (a pod whose status lost it)"
    );

    // True at first sight (a new reconciler): left to the normal path.
    let mut fresh = with_jobs(&["js"]);
    fresh.apply_jobset(&jobset("js", Some(3)));
    assert!(
        fresh
            .apply_pod(&restarting("a", "u1", "3", Some("True")))
            .contains(&key("js"))
    );
    assert!(!begun(&fresh, "a"));
    // Another pod under the same name (a replacement) starts unarmed.
    fresh.apply_pod(&restarting("b", "u1", "3", Some("False")));
    fresh.delete_pod("ns", "b");
    fresh.apply_pod(&restarting("b", "u2", "3", Some("True")));
    assert!(!begun(&fresh, "b"));
    fresh.apply_pod(&restarting("b", "u2", "3", Some("False")));
    fresh.apply_pod(&restarting("b", "u3", "3", Some("True")));
    assert!(!begun(&fresh, "b"), "another UID");
}

#[test]
fn pods_move_and_disappear() {
    let mut index = with_jobs(&["one", "two"]);
    index.apply_jobset(&jobset("one", None));
    index.apply_jobset(&jobset("two", None));
    index.apply_pod(&pod("a", "one", Some("1")));
    assert_eq!(
        index.apply_pod(&pod("a", "two", Some("1"))),
        vec![key("one"), key("two")]
    );
    assert_eq!(index.delete_pod("ns", "a"), Some(key("two")));
    assert_eq!(index.pod_count(), 0);

    index.apply_pod(&pod("a", "one", Some("1")));
    index.apply_pod(&pod("b", "one", Some("1")));
    index.pods_relisting();
    index.apply_pod(&pod("b", "one", Some("1")));
    assert_eq!(index.pods_relisted(), vec![key("one")]);
    assert_eq!(index.pod_count(), 1);
}

#[test]
fn pod_set_stays_dense() {
    let mut set = PodSet::default();
    for name in ["a", "b", "c"] {
        set.insert(pod(name, "js", Some("1")).view(Dialect::Epoch));
    }
    set.remove("a");
    assert_eq!(set.views.len(), 2);
    assert_eq!(set.get("c").map(|v| v.name.as_str()), Some("c"));
    assert_eq!(set.get("b").map(|v| v.name.as_str()), Some("b"));
    set.remove("c");
    set.remove("b");
    assert!(set.is_empty() && set.slot.is_empty());
}

#[test]
fn relist_forgets_deleted_jobsets() {
    let mut index = Index::new(Dialect::Epoch);
    index.apply_jobset(&jobset("a", None));
    index.apply_jobset(&jobset("b", None));
    index.jobsets_relisting();
    index.apply_jobset(&jobset("b", None));
    assert_eq!(index.jobsets_relisted(), vec![key("a")]);
    assert_eq!(index.jobset_count(), 1);
    assert_eq!(index.active_keys(), vec![key("b")]);
}

#[test]
fn a_write_answer_does_not_bring_back_a_deleted_jobset() {
    let mut index = Index::new(Dialect::Epoch);
    index.apply_jobset(&jobset("a", None));
    index.record_write(&key("a"), &jobset("a", Some(1)));
    assert_eq!(
        index.jobset(&key("a")).map(|s| s.status.synced),
        Some(Some(1))
    );
    index.delete_jobset("ns", "a");
    index.record_write(&key("a"), &jobset("a", Some(2)));
    assert_eq!(index.jobset_count(), 0);
    assert!(index.get(&key("a")).is_none());
}

fn counted(index: &Index, jobset: &str) -> Vec<String> {
    let mut names: Vec<String> = index
        .get(&key(jobset))
        .map(|(_, pods)| pods.iter().map(|p| p.name.clone()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn only_the_pods_of_the_jobsets_jobs_count() {
    let mut index = with_jobs(&["js", "other"]);
    index.apply_jobset(&jobset("js", Some(1)));
    index.apply_jobset(&jobset("other", Some(1)));
    index.apply_pod(&pod("real", "js", Some("1")));

    // Labelled with the JobSet's name and an epoch far beyond reach, but no controller.
    let mut forged = pod("forged", "js", Some("2147483647"));
    forged.metadata.owner_references = None;
    assert_eq!(index.apply_pod(&forged), vec![key("js")], "said once");
    // Labelled js, controlled by a Job of the JobSet other.
    let mut borrowed = pod("borrowed", "js", Some("2147483647"));
    borrowed.metadata.owner_references = pod("x", "other", None).metadata.owner_references;
    index.apply_pod(&borrowed);
    // Controlled by a ReplicaSet.
    let mut replica = pod("replica", "js", Some("5"));
    if let Some(o) = replica.metadata.owner_references.as_mut() {
        o[0].kind = "ReplicaSet".into();
        o[0].api_version = "apps/v1".into();
    }
    index.apply_pod(&replica);

    assert_eq!(counted(&index, "js"), vec!["real"]);
    assert_eq!(index.pod_count(), 4, "tracked, not counted");
    let strangers: Vec<(String, Stranger)> = index
        .strangers(&key("js"))
        .into_iter()
        .map(|(name, _, why)| (name, why))
        .collect();
    assert_eq!(
        strangers,
        vec![
            (
                "borrowed".to_owned(),
                Stranger::JobOfAnotherJobSet {
                    job: "other-job".into(),
                    jobset: "other".into()
                }
            ),
            ("forged".to_owned(), Stranger::NoController),
            (
                "replica".to_owned(),
                Stranger::NotAJob {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into()
                }
            ),
        ]
    );
    assert!(
        index.apply_pod(&forged).is_empty(),
        "a stranger seen again changes nothing"
    );
    assert_eq!(index.delete_pod("ns", "forged"), Some(key("js")));
    assert_eq!(index.strangers(&key("js")).len(), 2);
}

#[test]
fn a_pod_seen_before_its_job_counts_once_the_job_is_seen() {
    let mut index = with_jobs(&[]);
    index.apply_jobset(&jobset("js", Some(1)));
    assert!(
        index.apply_pod(&pod("a", "js", Some("1"))).is_empty(),
        "no news for the decision"
    );
    assert!(counted(&index, "js").is_empty(), "its Job not seen yet");
    assert!(
        index.strangers(&key("js")).is_empty(),
        "not known yet is no stranger"
    );
    assert_eq!(index.apply_job(&job("js")), vec![key("js")]);
    assert_eq!(counted(&index, "js"), vec!["a"]);
    // A Job status write (its metadata's resourceVersion) changes no membership.
    let mut again = job("js");
    again.resource_version = Some("9".into());
    assert!(index.apply_job(&again).is_empty());
    // The Job deleted and created again under another UID: the old pod no longer counts.
    let mut recreated = job("js");
    recreated.uid = Some("new-job-uid".into());
    assert_eq!(index.apply_job(&recreated), vec![key("js")]);
    assert!(counted(&index, "js").is_empty());
    assert_eq!(index.delete_job("ns", "js-job"), Vec::<Key>::new());
    index.apply_job(&job("js"));
    assert_eq!(counted(&index, "js"), vec!["a"]);
    assert_eq!(index.delete_job("ns", "js-job"), vec![key("js")]);
    assert!(counted(&index, "js").is_empty());
}

#[test]
fn a_pod_seen_before_its_jobset_counts_once_the_jobset_is_seen() {
    let mut index = with_jobs(&["js"]);
    index.apply_pod(&pod("a", "js", Some("1")));
    assert!(index.get(&key("js")).is_none());
    index.apply_jobset(&jobset("js", Some(1)));
    assert_eq!(counted(&index, "js"), vec!["a"]);
    // The JobSet deleted and created again under its name: the old Job's pod does not count.
    let mut recreated = jobset("js", Some(1));
    recreated.metadata.uid = Some("u2".into());
    assert_eq!(index.apply_jobset(&recreated), Some(key("js")));
    assert!(counted(&index, "js").is_empty());
    index.delete_jobset("ns", "js");
    index.apply_jobset(&jobset("js", Some(1)));
    assert_eq!(counted(&index, "js"), vec!["a"]);
}

#[test]
fn a_job_relist_forgets_deleted_jobs_and_holds_decisions() {
    let mut index = Index::new(Dialect::Epoch);
    assert!(
        index.jobs_relisting_in_progress(),
        "nothing decided before the first list"
    );
    index.jobs_relisting();
    index.apply_job(&job("js"));
    assert!(index.jobs_relisting_in_progress());
    assert!(index.jobs_relisted().is_empty());
    assert!(!index.jobs_relisting_in_progress());
    index.apply_jobset(&jobset("js", Some(1)));
    index.apply_pod(&pod("a", "js", Some("1")));
    assert_eq!(counted(&index, "js"), vec!["a"]);
    assert_eq!(index.job_count(), 1);

    index.jobs_relisting();
    assert!(index.jobs_relisting_in_progress());
    assert_eq!(index.jobs_relisted(), vec![key("js")], "its Job is gone");
    assert_eq!(index.job_count(), 0);
    assert!(counted(&index, "js").is_empty());
}

#[test]
fn a_member_keeps_its_last_sync_mark_across_a_move_aside() {
    let mut index = with_jobs(&["js"]);
    index.apply_jobset(&jobset("js", Some(1)));
    index.apply_pod(&pod("a", "js", Some("1")));
    index.record_sync(&key("js"), 1, &["a".to_owned()]);
    index.delete_job("ns", "js-job");
    index.apply_job(&job("js"));
    let (_, pods) = index.get(&key("js")).expect("indexed");
    assert!(pods[0].counted_in_last_sync);
}
