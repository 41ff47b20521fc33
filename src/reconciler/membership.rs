//! Which pods count toward a JobSet (issue 34): a pod counts only when its controller is one of
//! that JobSet's Jobs, the Job known by the UID the pod names and itself controlled by the
//! JobSet's UID. A label is not enough: anyone who may create pods in a namespace can label one
//! with a JobSet's name (and an epoch annotation); the Job controller creates the real pods, with
//! a controller reference to their Job, and JobSet's controller the Jobs, with one to the JobSet.
//!
//! Pure: [`membership`] decides on what the watches saw ([`ControllerRef`] of the pod, the
//! [`JobRecord`] of the Job it names). A pod may be seen before its Job (two watches, no order
//! between them): it is then [`Membership::Unknown`], not counted and not reported, and decided
//! again when the Job arrives.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::jobset;
use crate::protocol::JOBSET_NAME_LABEL;

/// The Job kind a pod's controller must be.
pub const JOB_API_VERSION: &str = "batch/v1";
pub const JOB_KIND: &str = "Job";

/// An object's controller reference (the owner reference with `controller: true`), as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl ControllerRef {
    /// The controller among `refs`: the first with `controller: true` (the API server admits at
    /// most one).
    pub fn of(refs: Option<&[OwnerReference]>) -> Option<ControllerRef> {
        refs?
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| ControllerRef {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
            })
    }

    fn is_job(&self) -> bool {
        self.kind == JOB_KIND && self.api_version == JOB_API_VERSION
    }

    /// A JobSet of any served version.
    fn is_jobset(&self) -> bool {
        self.kind == jobset::KIND
            && self
                .api_version
                .split_once('/')
                .is_some_and(|(group, _)| group == jobset::GROUP)
    }
}

/// A Job as membership reads it (from a metadata-only watch): its UID, its jobset-name label and
/// its controller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobRecord {
    pub uid: String,
    /// Its `jobset.sigs.k8s.io/jobset-name` label.
    pub label: Option<String>,
    pub controller: Option<ControllerRef>,
}

impl JobRecord {
    /// `(namespace, name, record)` of a Job's metadata; `None` without a namespace or a name.
    pub fn from_meta(meta: &ObjectMeta) -> Option<(String, String, JobRecord)> {
        let record = JobRecord {
            uid: meta.uid.clone().unwrap_or_default(),
            label: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(JOBSET_NAME_LABEL))
                .cloned(),
            controller: ControllerRef::of(meta.owner_references.as_deref()),
        };
        Some((meta.namespace.clone()?, meta.name.clone()?, record))
    }

    /// The name of the JobSet controlling it, if a JobSet does.
    pub fn jobset(&self) -> Option<&str> {
        self.controller
            .as_ref()
            .filter(|c| c.is_jobset())
            .map(|c| c.name.as_str())
    }
}

/// Whether a pod labelled with a JobSet's name counts toward it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Controlled by a Job that the JobSet controls: it counts.
    Member,
    /// Not known yet (the watches have not shown all it takes): not counted, not reported.
    Unknown(Unknown),
    /// Not one of the JobSet's pods, whatever it is labelled: not counted, reported once.
    Stranger(Stranger),
}

/// Why a pod's membership is not known yet. Each resolves with an event of the Job or JobSet
/// watch, or stays: a pod of a Job that is gone is no member either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// Its Job is not in the cache (not seen yet, or deleted).
    JobNotSeen,
    /// A Job of that name is known under another UID (a Job deleted and created again: the pod
    /// is the old one's, or the cache has not seen the new one yet).
    JobRecreated,
    /// Its JobSet is not in the cache.
    JobSetNotSeen,
    /// Its Job's JobSet is known under another UID (a JobSet deleted and created again).
    JobSetRecreated,
}

/// Why a pod labelled with a JobSet's name is not one of its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stranger {
    /// No controller reference: the Job controller did not create it.
    NoController,
    /// Its controller is not a `batch/v1` Job.
    NotAJob { api_version: String, kind: String },
    /// Its Job is controlled by no JobSet.
    JobOfNoJobSet { job: String },
    /// Its Job is controlled by another JobSet.
    JobOfAnotherJobSet { job: String, jobset: String },
}

impl fmt::Display for Stranger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stranger::NoController => write!(f, "it has no controller (no Job created it)"),
            Stranger::NotAJob { api_version, kind } => {
                write!(
                    f,
                    "its controller is a {kind} ({api_version}), not a batch/v1 Job"
                )
            }
            Stranger::JobOfNoJobSet { job } => {
                write!(f, "its Job {job} is controlled by no JobSet")
            }
            Stranger::JobOfAnotherJobSet { job, jobset } => {
                write!(f, "its Job {job} belongs to the JobSet {jobset}")
            }
        }
    }
}

/// Whether a pod labelled with `jobset`'s name counts toward it: `pod` is the pod's controller
/// reference, `job` the Job of the pod's namespace named by it as the cache has it, `jobset_uid`
/// the JobSet's UID as the cache has it.
pub fn membership(
    jobset: &str,
    jobset_uid: Option<&str>,
    pod: Option<&ControllerRef>,
    job: Option<&JobRecord>,
) -> Membership {
    let Some(pod) = pod else {
        return Membership::Stranger(Stranger::NoController);
    };
    if !pod.is_job() {
        return Membership::Stranger(Stranger::NotAJob {
            api_version: pod.api_version.clone(),
            kind: pod.kind.clone(),
        });
    }
    let Some(job) = job else {
        return Membership::Unknown(Unknown::JobNotSeen);
    };
    if job.uid != pod.uid {
        return Membership::Unknown(Unknown::JobRecreated);
    }
    let Some(controller) = job.controller.as_ref().filter(|c| c.is_jobset()) else {
        return Membership::Stranger(Stranger::JobOfNoJobSet {
            job: pod.name.clone(),
        });
    };
    if controller.name != jobset {
        return Membership::Stranger(Stranger::JobOfAnotherJobSet {
            job: pod.name.clone(),
            jobset: controller.name.clone(),
        });
    }
    match jobset_uid {
        None => Membership::Unknown(Unknown::JobSetNotSeen),
        Some(uid) if uid != controller.uid => Membership::Unknown(Unknown::JobSetRecreated),
        Some(_) => Membership::Member,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_ref(name: &str, uid: &str) -> ControllerRef {
        ControllerRef {
            api_version: JOB_API_VERSION.into(),
            kind: JOB_KIND.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn job(uid: &str, jobset: Option<(&str, &str)>) -> JobRecord {
        JobRecord {
            uid: uid.into(),
            label: jobset.map(|(name, _)| name.into()),
            controller: jobset.map(|(name, uid)| ControllerRef {
                api_version: jobset::API_VERSION.into(),
                kind: jobset::KIND.into(),
                name: name.into(),
                uid: uid.into(),
            }),
        }
    }

    #[test]
    fn a_pod_of_a_job_of_the_jobset_is_a_member() {
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("js-w-0", "job-uid")),
                Some(&job("job-uid", Some(("js", "js-uid"))))
            ),
            Membership::Member
        );
        // Any served version of JobSet.
        let mut v1 = job("job-uid", Some(("js", "js-uid")));
        if let Some(c) = v1.controller.as_mut() {
            c.api_version = "jobset.x-k8s.io/v1".into();
        }
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("js-w-0", "job-uid")),
                Some(&v1)
            ),
            Membership::Member
        );
    }

    #[test]
    fn a_pod_without_a_controller_is_a_stranger() {
        let member = job("job-uid", Some(("js", "js-uid")));
        assert_eq!(
            membership("js", Some("js-uid"), None, Some(&member)),
            Membership::Stranger(Stranger::NoController)
        );
        assert_eq!(
            membership("js", Some("js-uid"), None, None),
            Membership::Stranger(Stranger::NoController)
        );
    }

    #[test]
    fn a_pod_controlled_by_another_kind_is_a_stranger() {
        let member = job("job-uid", Some(("js", "js-uid")));
        for (api_version, kind) in [
            ("apps/v1", "ReplicaSet"),
            ("batch/v1", "CronJob"),
            ("batch/v2", "Job"),
            ("example.com/v1", "Job"),
            ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ] {
            let controller = ControllerRef {
                api_version: api_version.into(),
                kind: kind.into(),
                ..job_ref("js-w-0", "job-uid")
            };
            assert_eq!(
                membership("js", Some("js-uid"), Some(&controller), Some(&member)),
                Membership::Stranger(Stranger::NotAJob {
                    api_version: api_version.into(),
                    kind: kind.into()
                }),
                "{api_version} {kind}"
            );
        }
    }

    #[test]
    fn a_pod_of_a_job_of_another_jobset_is_a_stranger() {
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("other-w-0", "job-uid")),
                Some(&job("job-uid", Some(("other", "other-uid"))))
            ),
            Membership::Stranger(Stranger::JobOfAnotherJobSet {
                job: "other-w-0".into(),
                jobset: "other".into()
            })
        );
        // Same name, another UID: a Job of an earlier JobSet of that name, not yet known.
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("js-w-0", "job-uid")),
                Some(&job("job-uid", Some(("js", "old-js-uid"))))
            ),
            Membership::Unknown(Unknown::JobSetRecreated)
        );
    }

    #[test]
    fn a_pod_of_a_job_of_no_jobset_is_a_stranger() {
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("plain", "job-uid")),
                Some(&job("job-uid", None))
            ),
            Membership::Stranger(Stranger::JobOfNoJobSet {
                job: "plain".into()
            })
        );
        // A Job controlled by something else that is named like the JobSet.
        let mut by_deployment = job("job-uid", Some(("js", "js-uid")));
        if let Some(c) = by_deployment.controller.as_mut() {
            c.kind = "Deployment".into();
            c.api_version = "apps/v1".into();
        }
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("plain", "job-uid")),
                Some(&by_deployment)
            ),
            Membership::Stranger(Stranger::JobOfNoJobSet {
                job: "plain".into()
            })
        );
    }

    #[test]
    fn a_pod_of_a_recreated_job_is_not_counted() {
        // The Job of that name in the cache has another UID than the pod's reference.
        assert_eq!(
            membership(
                "js",
                Some("js-uid"),
                Some(&job_ref("js-w-0", "old-job-uid")),
                Some(&job("new-job-uid", Some(("js", "js-uid"))))
            ),
            Membership::Unknown(Unknown::JobRecreated)
        );
    }

    #[test]
    fn a_pod_seen_before_its_job_or_jobset_is_not_known_yet() {
        let pod = job_ref("js-w-0", "job-uid");
        assert_eq!(
            membership("js", Some("js-uid"), Some(&pod), None),
            Membership::Unknown(Unknown::JobNotSeen)
        );
        assert_eq!(
            membership(
                "js",
                None,
                Some(&pod),
                Some(&job("job-uid", Some(("js", "js-uid"))))
            ),
            Membership::Unknown(Unknown::JobSetNotSeen)
        );
    }

    #[test]
    fn the_controller_is_the_reference_marked_controller() {
        let owner = |name: &str, controller: Option<bool>| OwnerReference {
            api_version: JOB_API_VERSION.into(),
            kind: JOB_KIND.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            controller,
            block_owner_deletion: None,
        };
        assert_eq!(ControllerRef::of(None), None);
        assert_eq!(ControllerRef::of(Some(&[])), None);
        assert_eq!(
            ControllerRef::of(Some(&[owner("a", None), owner("b", Some(false))])),
            None,
            "owners that are not the controller"
        );
        assert_eq!(
            ControllerRef::of(Some(&[owner("a", Some(false)), owner("b", Some(true))])),
            Some(job_ref("b", "b-uid"))
        );
    }

    #[test]
    fn a_job_record_reads_its_label_and_controller() {
        let meta: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "js-w-0", "namespace": "ns", "uid": "job-uid",
            "labels": {JOBSET_NAME_LABEL: "js"},
            "ownerReferences": [{"apiVersion": jobset::API_VERSION, "kind": jobset::KIND,
                                 "name": "js", "uid": "js-uid", "controller": true}]
        }))
        .expect("meta");
        let (ns, name, record) = JobRecord::from_meta(&meta).expect("record");
        assert_eq!((ns.as_str(), name.as_str()), ("ns", "js-w-0"));
        assert_eq!(record, job("job-uid", Some(("js", "js-uid"))));
        assert_eq!(record.jobset(), Some("js"));
        assert_eq!(job("u", None).jobset(), None);
        assert_eq!(JobRecord::from_meta(&ObjectMeta::default()), None);
    }
}
