//! The `jobset.x-k8s.io/v1alpha2` JobSet, modelled as far as we read it.
//!
//! Every struct keeps the fields it does not model in a flattened `extra` map, and every modelled
//! field is optional, so an object read and written back is the same JSON: nothing we do not model
//! is lost. Pod templates stay raw JSON ([`serde_json::Value`]) because they carry fields newer than
//! any typed Kubernetes crate knows; admission works on them with targeted JSON Patch operations.
//!
//! The epoch status fields are not modelled here: their names depend on the protocol dialect, and
//! [`crate::protocol::Dialect`] reads them from [`JobSetStatus::extra`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::{AgentView, DISABLE_ANNOTATION, Dialect, EpochStatus, IN_PLACE_RESTART};

pub const GROUP: &str = "jobset.x-k8s.io";
pub const VERSION: &str = "v1alpha2";
pub const API_VERSION: &str = "jobset.x-k8s.io/v1alpha2";
pub const KIND: &str = "JobSet";
pub const PLURAL: &str = "jobsets";

/// A JobSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSetSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<JobSetStatus>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `spec` of a JobSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicated_jobs: Option<Vec<ReplicatedJob>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `spec.failurePolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_strategy: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `spec.replicatedJobs[i]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<JobTemplate>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `spec.replicatedJobs[i].template` (a batch/v1 JobTemplateSpec).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSpec>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `spec.replicatedJobs[i].template.spec` (a batch/v1 JobSpec); the pod template stays raw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_replacement_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `status` of a JobSet. The dialect's epoch fields live in `extra`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts_count_towards_max: Option<i32>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A status condition (metav1.Condition, every field optional so a partial one still parses).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `kube::Resource` for a namespaced type with a static group, version, kind and plural and a
/// `metadata: ObjectMeta` field (the JobSet types here, `JobSetEpoch` in `wire::epochs`).
macro_rules! namespaced_resource {
    ($ty:ty, $kind:expr, $group:expr, $version:expr, $api_version:expr, $plural:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($api_version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use namespaced_resource;

namespaced_resource!(JobSet, KIND, GROUP, VERSION, API_VERSION, PLURAL);
namespaced_resource!(JobSetSummary, KIND, GROUP, VERSION, API_VERSION, PLURAL);

/// What an agent reads of its JobSet, and nothing more: metadata,
/// `spec.failurePolicy.restartStrategy` and the status fields. Every other field, the pod
/// templates above all, is skipped while parsing: a [`JobSet`] keeps them as JSON values behind
/// flattened maps, which costs each agent far more per watch event, and every agent of a JobSet
/// gets every event. Read-only: never written back, so what it drops is not lost.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct JobSetSummary {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<SummarySpec>,
    #[serde(default)]
    status: Option<Map<String, Value>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummarySpec {
    #[serde(default)]
    failure_policy: Option<SummaryFailurePolicy>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryFailurePolicy {
    #[serde(default)]
    restart_strategy: Option<String>,
}

impl JobSetSummary {
    /// `spec.failurePolicy.restartStrategy == InPlaceRestart`.
    pub fn is_in_place_restart(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.failure_policy.as_ref())
            .and_then(|f| f.restart_strategy.as_deref())
            == Some(IN_PLACE_RESTART)
    }

    /// The JobSet carries the annotation that disables in-place restart.
    pub fn is_in_place_restart_disabled(&self) -> bool {
        disabled_by(&self.metadata)
    }

    /// The dialect's epoch fields of the status.
    pub fn epoch_status(&self, dialect: Dialect) -> EpochStatus {
        dialect.read_status(self.status.as_ref())
    }

    /// What an agent decides on ([`crate::protocol::agent_decide`]).
    pub fn agent_view(&self, dialect: Dialect) -> AgentView {
        AgentView {
            in_place_restart: self.is_in_place_restart(),
            disabled: self.is_in_place_restart_disabled(),
            status: self.epoch_status(dialect),
        }
    }
}

/// `metadata` carries the annotation that disables in-place restart.
fn disabled_by(metadata: &ObjectMeta) -> bool {
    metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DISABLE_ANNOTATION))
}

impl JobSet {
    /// A JobSet with `apiVersion`, `kind`, name and namespace set, for builders and tests.
    pub fn new(namespace: &str, name: &str, spec: JobSetSpec) -> Self {
        JobSet {
            api_version: Some(API_VERSION.to_owned()),
            kind: Some(KIND.to_owned()),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
            extra: Map::new(),
        }
    }

    pub fn failure_policy(&self) -> Option<&FailurePolicy> {
        self.spec.as_ref()?.failure_policy.as_ref()
    }

    /// `spec.failurePolicy.restartStrategy == InPlaceRestart`.
    pub fn is_in_place_restart(&self) -> bool {
        self.failure_policy()
            .and_then(|f| f.restart_strategy.as_deref())
            == Some(IN_PLACE_RESTART)
    }

    /// The JobSet carries the annotation that disables in-place restart.
    pub fn is_in_place_restart_disabled(&self) -> bool {
        disabled_by(&self.metadata)
    }

    /// `spec.failurePolicy.maxRestarts`, 0 when absent (the JobSet API default).
    pub fn max_restarts(&self) -> i32 {
        self.failure_policy()
            .and_then(|f| f.max_restarts)
            .unwrap_or(0)
    }

    pub fn is_suspended(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
    }

    /// A `Completed` or `Failed` condition is `True`.
    pub fn is_finished(&self) -> bool {
        self.conditions()
            .iter()
            .any(|c| (c.type_ == "Completed" || c.type_ == "Failed") && c.status == "True")
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or(&[])
    }

    pub fn replicated_jobs(&self) -> &[ReplicatedJob] {
        self.spec
            .as_ref()
            .and_then(|s| s.replicated_jobs.as_deref())
            .unwrap_or(&[])
    }

    /// Sum over replicatedJobs of `replicas * parallelism` (each defaulting to 1, as the JobSet
    /// and Job APIs do).
    pub fn expected_pods(&self) -> i64 {
        self.replicated_jobs()
            .iter()
            .map(|rj| {
                let replicas = i64::from(rj.replicas.unwrap_or(1).max(0));
                let parallelism = rj
                    .template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .and_then(|s| s.parallelism)
                    .unwrap_or(1)
                    .max(0);
                replicas * i64::from(parallelism)
            })
            .sum()
    }

    /// Why the epoch protocol cannot serve this JobSet, if it cannot: a replicatedJob whose Job
    /// leaves `completions` unset or different from `parallelism` never has all its pods
    /// running at once at a known count (the reconciler would wait for pods that never come, or
    /// count pods that finished). JobSet's own controller refuses such a JobSet too, and the
    /// webhook denies it; this catches one admitted before the webhook was installed, or while
    /// it was down.
    pub fn protocol_problem(&self) -> Option<String> {
        self.replicated_jobs()
            .iter()
            .enumerate()
            .find_map(|(i, rj)| {
                let spec = rj.template.as_ref().and_then(|t| t.spec.as_ref());
                let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
                let name = &rj.name;
                match spec.and_then(|s| s.completions) {
                    None => Some(format!(
                        "spec.replicatedJobs[{i}] ({name}): completions is unset; in-place restart \
                     needs completions equal to parallelism ({parallelism})"
                    )),
                    Some(c) if c != parallelism => Some(format!(
                        "spec.replicatedJobs[{i}] ({name}): completions ({c}) differs from \
                     parallelism ({parallelism}); in-place restart needs them equal"
                    )),
                    Some(_) => None,
                }
            })
    }

    /// The service account each replicatedJob's pod template names (`serviceAccountName`, else
    /// the deprecated `serviceAccount`), `None` where it names none.
    pub fn pod_service_accounts(&self) -> Vec<Option<String>> {
        self.replicated_jobs()
            .iter()
            .map(|rj| {
                let pod_spec = rj
                    .template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .and_then(|s| s.template.as_ref())
                    .and_then(|t| t.get("spec"));
                ["serviceAccountName", "serviceAccount"]
                    .iter()
                    .find_map(|k| pod_spec?.get(*k)?.as_str().filter(|s| !s.is_empty()))
                    .map(str::to_owned)
            })
            .collect()
    }

    /// The dialect's epoch fields of the status.
    pub fn epoch_status(&self, dialect: Dialect) -> EpochStatus {
        dialect.read_status(self.status.as_ref().map(|s| &s.extra))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "ns", "annotations": {"a/b": "c"}},
            "spec": {
                "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart",
                                  "rules": [{"action": "FailJobSet"}]},
                "futureField": {"x": [1, 2]},
                "replicatedJobs": [{
                    "name": "rj", "replicas": 2, "dependsOn": [],
                    "template": {"metadata": {"labels": {"l": "v"}}, "spec": {
                        "parallelism": 3, "completions": 3, "backoffLimit": 2147483647,
                        "podReplacementPolicy": "Failed", "managedBy": "x",
                        "template": {"spec": {"containers": [{"name": "w", "newThing": true}]}}
                    }}
                }]
            },
            "status": {"restarts": 1, "restartsCountTowardsMax": 1, "syncedEpoch": 4,
                       "deprecatedEpoch": 3, "replicatedJobsStatus": [],
                       "conditions": [{"type": "Failed", "status": "False", "observedGeneration": 2}]}
        })
    }

    #[test]
    fn round_trips_unknown_fields() {
        let v = sample();
        let js: JobSet = serde_json::from_value(v.clone()).expect("parses");
        assert_eq!(serde_json::to_value(&js).expect("serializes"), v);
    }

    #[test]
    fn reads_what_the_protocol_needs() {
        let js: JobSet = serde_json::from_value(sample()).expect("parses");
        assert!(js.is_in_place_restart());
        assert!(!js.is_finished());
        assert!(!js.is_suspended());
        assert_eq!(js.max_restarts(), 3);
        assert_eq!(js.expected_pods(), 6);
        let st = js.epoch_status(Dialect::Epoch);
        assert_eq!((st.deprecated, st.synced), (Some(3), Some(4)));
        assert_eq!(js.epoch_status(Dialect::Attempt), EpochStatus::default());
        assert_eq!(js.pod_service_accounts(), vec![None]);
    }

    /// The agent's summary reads what the full JobSet reads, whatever the spec holds.
    #[test]
    fn the_summary_agrees_with_the_full_jobset() {
        let mut disabled = sample();
        disabled["metadata"]["annotations"][DISABLE_ANNOTATION] = json!("true");
        let mut recreate = sample();
        recreate["spec"]["failurePolicy"]["restartStrategy"] = json!("Recreate");
        let mut bare = json!({"metadata": {"name": "js"}});
        bare["status"] = json!({"restarts": 1});
        for v in [sample(), disabled, recreate, bare] {
            let full: JobSet = serde_json::from_value(v.clone()).expect("jobset");
            let summary: JobSetSummary = serde_json::from_value(v).expect("summary");
            assert_eq!(summary.is_in_place_restart(), full.is_in_place_restart());
            assert_eq!(
                summary.is_in_place_restart_disabled(),
                full.is_in_place_restart_disabled()
            );
            for dialect in [Dialect::Epoch, Dialect::Attempt] {
                assert_eq!(summary.epoch_status(dialect), full.epoch_status(dialect));
            }
            assert_eq!(summary.metadata, full.metadata);
        }
        // Pod templates the full type would reject do not stop an agent.
        let odd = json!({"spec": {"replicatedJobs": "not a list",
                                  "failurePolicy": {"restartStrategy": "InPlaceRestart"}}});
        assert!(serde_json::from_value::<JobSet>(odd.clone()).is_err());
        let summary: JobSetSummary = serde_json::from_value(odd).expect("summary");
        assert!(summary.is_in_place_restart());
    }

    #[test]
    fn the_protocol_needs_completions_equal_to_parallelism() {
        let js = |job: Value| -> JobSet {
            serde_json::from_value(json!({"spec": {"replicatedJobs": [
                {"name": "ok", "template": {"spec": {"parallelism": 2, "completions": 2}}},
                {"name": "w", "template": {"spec": job}}
            ]}}))
            .expect("jobset")
        };
        assert_eq!(
            js(json!({"parallelism": 3, "completions": 3})).protocol_problem(),
            None
        );
        assert_eq!(js(json!({"completions": 1})).protocol_problem(), None);
        let unset = js(json!({"parallelism": 3}))
            .protocol_problem()
            .expect("unset");
        assert!(
            unset.starts_with("spec.replicatedJobs[1] (w): completions is unset"),
            "{unset}"
        );
        let fewer = js(json!({"parallelism": 3, "completions": 1}))
            .protocol_problem()
            .expect("differs");
        assert!(
            fewer.contains("completions (1) differs from parallelism (3)"),
            "{fewer}"
        );
    }

    #[test]
    fn reads_the_v0_12_shaped_examples() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/jobset-v0.12");
        for name in [
            "jobset-sidecar-agent.yaml",
            "jobset-main-container-agent.yaml",
        ] {
            let text = std::fs::read_to_string(dir.join(name)).expect("example fixture");
            let v: Value = serde_saphyr::from_str(&text).expect("yaml");
            let js: JobSet = serde_json::from_value(v.clone()).expect("jobset");
            assert_eq!(serde_json::to_value(&js).expect("serializes"), v, "{name}");
            assert_eq!(js.expected_pods(), 4, "{name}");
            assert_eq!(
                js.pod_service_accounts(),
                vec![Some("jobset-in-place-restart".to_owned())]
            );
            assert!(js.is_in_place_restart());
        }
    }
}
