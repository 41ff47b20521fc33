//! What admission reads of an AdmissionReview and its JobSet (docs/architecture.md,
//! "Admission"): the views the rules and the injection read, each a [`Shape`] of the lenient
//! reader (`lenient.rs`), decoded in one pass from the request body (no `Value` of the whole
//! review is ever built). Nothing here is ever serialized back: the output is built from targeted
//! patch operations only.

use serde::de::{MapAccess, SeqAccess};
use serde_json::Value;

use super::lenient::*;
use crate::wire::agent_env;

/// An AdmissionReview request body.
#[derive(Clone, Debug, Default)]
pub(crate) struct Review<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub api_version: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
    pub request: Option<RequestView<'a>>,
}

object_view!(Review {
    "apiVersion" => api_version: lenient_in,
    "kind" => kind: lenient_in,
    "request" => request: lenient_in,
});

/// `request` of an AdmissionReview.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestView<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub uid: Option<Str<'a>>,
    pub operation: Option<Str<'a>>,
    pub kind: Option<GroupKind<'a>>,
    /// Present when it is an object.
    pub object: Option<JobSetView<'a>>,
    pub old_object: Option<JobSetView<'a>>,
}

object_view!(RequestView {
    "uid" => uid: lenient_in,
    "operation" => operation: lenient_in,
    "kind" => kind: lenient_in,
    "object" => object: lenient_in,
    "oldObject" => old_object: lenient_in,
});

/// `request.kind`.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupKind<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub group: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
}

object_view!(GroupKind {
    "group" => group: lenient_in,
    "kind" => kind: lenient_in,
});

/// A JobSet: what validation and mutation read of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSetView<'a> {
    /// Lists of the body were cut at [`MAX_LIST_ELEMENTS`]: the view is not the whole object.
    pub truncated: bool,
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub metadata: Option<Meta<'a>>,
    pub spec: Option<JobSetSpec<'a>>,
}

object_view!(JobSetView {
    "metadata" => metadata: lenient_in,
    "spec" => spec: lenient_in,
});

impl<'a> JobSetView<'a> {
    /// The view of an in-memory JobSet (the default, all absent, for a non-object).
    pub fn from_value(value: &'a Value) -> Self {
        let (view, truncated) = with_budget(|| Lenient::<JobSetView<'a>>::from_value(value));
        let mut view = view.unwrap_or_default();
        view.truncated = truncated;
        view
    }

    fn failure_policy(&self) -> Option<&FailurePolicy<'a>> {
        self.spec.as_ref()?.failure_policy.as_ref()
    }

    /// `spec.failurePolicy.restartStrategy == InPlaceRestart`.
    pub fn in_place_restart(&self) -> bool {
        self.failure_policy()
            .and_then(|p| p.restart_strategy.as_deref())
            == Some(crate::protocol::IN_PLACE_RESTART)
    }

    pub fn max_restarts(&self) -> Option<i64> {
        self.failure_policy()?.max_restarts
    }

    pub fn replicated_jobs(&self) -> &[ReplicatedJob<'a>] {
        self.spec
            .as_ref()
            .and_then(|s| s.replicated_jobs.as_ref())
            .map_or(&[], |l| l.0.as_slice())
    }

    /// `metadata.annotations["jobset-inplace.dev/inject"]`, if a string.
    pub fn inject_annotation(&self) -> Option<&str> {
        self.metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .inject
            .as_deref()
    }

    /// `metadata.annotations["jobset-inplace.dev/worker-restart-rules"]`, if a string.
    pub fn worker_rules_annotation(&self) -> Option<&str> {
        self.metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .worker_rules
            .as_deref()
    }

    /// `metadata.name`, else `metadata.generateName`, else "".
    pub fn name(&self) -> &str {
        let meta = self.metadata.as_ref();
        meta.and_then(|m| m.name.as_deref())
            .or_else(|| meta.and_then(|m| m.generate_name.as_deref()))
            .unwrap_or("")
    }
}

/// `metadata` of a JobSet or of a pod template.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meta<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub generate_name: Option<Str<'a>>,
    /// Present when it is an object.
    pub annotations: Option<Annotations<'a>>,
}

object_view!(Meta {
    "name" => name: checked,
    "generateName" => generate_name: lenient_in,
    "annotations" => annotations: checked,
});

/// The annotations admission reads (their string values).
#[derive(Clone, Debug, Default)]
pub(crate) struct Annotations<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// `jobset-inplace.dev/inject`
    pub inject: Option<Str<'a>>,
    /// `jobset-inplace.dev/injected`
    pub injected: Option<Str<'a>>,
    /// `jobset-inplace.dev/worker-restart-rules`
    pub worker_rules: Option<Str<'a>>,
}

object_view!(Annotations {
    super::INJECT_ANNOTATION => inject: lenient_in,
    super::INJECTED_ANNOTATION => injected: lenient_in,
    super::WORKER_RULES_ANNOTATION => worker_rules: lenient_in,
});

/// `spec` of a JobSet.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSetSpec<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub failure_policy: Option<FailurePolicy<'a>>,
    pub replicated_jobs: Option<List<ReplicatedJob<'a>>>,
}

object_view!(JobSetSpec {
    "failurePolicy" => failure_policy: lenient_in,
    "replicatedJobs" => replicated_jobs: checked,
});

/// `spec.failurePolicy`.
#[derive(Clone, Debug, Default)]
pub(crate) struct FailurePolicy<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub restart_strategy: Option<Str<'a>>,
    pub max_restarts: Option<i64>,
}

object_view!(FailurePolicy {
    "restartStrategy" => restart_strategy: lenient_in,
    "maxRestarts" => max_restarts: lenient_in,
});

/// One `spec.replicatedJobs[i]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReplicatedJob<'a> {
    /// `template.spec`, when `template` and it are objects.
    pub job_spec: Option<JobSpec<'a>>,
    /// `template` or `template.spec` present but not an object.
    pub wrong: Wrong,
}

object_view!(
    ReplicatedJob,
    |key| match key {
        "template" => 1,
        _ => 0,
    },
    |v, _field, map| {
        let template = checked::<JobTemplate<'de>, A>(map, &mut v.wrong, "template")?;
        v.job_spec = None;
        if let Some(t) = template {
            v.wrong.extend(t.wrong.into_iter().map(|w| WrongType {
                key: "template.spec",
                ..w
            }));
            v.job_spec = t.spec;
        }
    }
);

/// `template` of a replicatedJob (the Job template).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobTemplate<'a> {
    pub spec: Option<JobSpec<'a>>,
    pub wrong: Wrong,
}

object_view!(
    JobTemplate,
    |key| match key {
        "spec" => 1,
        _ => 0,
    },
    |v, _field, map| v.spec = checked(map, &mut v.wrong, "spec")?
);

/// `template.spec` of a replicatedJob (the Job spec).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSpec<'a> {
    /// Present whatever its type (`null` included): shown as written in messages.
    pub backoff_limit: Option<Value>,
    pub pod_replacement_policy: Option<Value>,
    pub completions: Option<i64>,
    pub parallelism: Option<i64>,
    /// Present when it is an object.
    pub template: Option<PodTemplate<'a>>,
    /// Present when it is an object.
    pub pod_failure_policy: Option<PodFailurePolicy<'a>>,
    pub wrong: Wrong,
}

object_view!(
    JobSpec,
    |key| match key {
        "backoffLimit" => 1,
        "podReplacementPolicy" => 2,
        "completions" => 3,
        "parallelism" => 4,
        "template" => 5,
        "podFailurePolicy" => 6,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.backoff_limit = any_value(map, &mut v.wrong, "backoffLimit")?,
        2 => v.pod_replacement_policy = any_value(map, &mut v.wrong, "podReplacementPolicy")?,
        3 => v.completions = checked(map, &mut v.wrong, "completions")?,
        4 => v.parallelism = checked(map, &mut v.wrong, "parallelism")?,
        6 => v.pod_failure_policy = checked(map, &mut v.wrong, "podFailurePolicy")?,
        _ => v.template = checked(map, &mut v.wrong, "template")?,
    }
);

/// `podFailurePolicy` of a Job spec.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodFailurePolicy<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// Present when it is an array.
    pub rules: Option<List<PodFailureRule<'a>>>,
}

object_view!(PodFailurePolicy {
    "rules" => rules: checked,
});

/// One `podFailurePolicy.rules` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodFailureRule<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub action: Option<Str<'a>>,
    /// Present when it is an object.
    pub on_exit_codes: Option<OnExitCodes<'a>>,
}

object_view!(PodFailureRule {
    "action" => action: checked,
    "onExitCodes" => on_exit_codes: checked,
});

/// `onExitCodes` of a pod failure policy rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct OnExitCodes<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub container_name: Option<Str<'a>>,
    pub operator: Option<Str<'a>>,
    /// Present when it is an array; its integers.
    pub values: Option<Ints>,
}

object_view!(OnExitCodes {
    "containerName" => container_name: checked,
    "operator" => operator: checked,
    "values" => values: checked,
});

/// The pod template of a Job.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodTemplate<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// Present when it is an object.
    pub metadata: Option<Meta<'a>>,
    /// Present when it is an object.
    pub spec: Option<PodSpec<'a>>,
}

object_view!(PodTemplate {
    "metadata" => metadata: checked,
    "spec" => spec: checked,
});

/// A pod spec.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodSpec<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub service_account_name: Option<Str<'a>>,
    pub service_account: Option<Str<'a>>,
    pub restart_policy: Option<Str<'a>>,
    /// Present when it is an array.
    pub init_containers: Option<List<ContainerView<'a>>>,
    pub containers: Option<List<ContainerView<'a>>>,
    /// `automountServiceAccountToken`, whatever its type.
    pub automount_token: Option<Value>,
    /// Present when it is an array: its volumes' names, and which is the agent's token volume.
    pub volumes: Option<List<Volume<'a>>>,
    /// Present whatever its type; the names of its entries when it is an array.
    pub image_pull_secrets: Option<Present<List<Named<'a>>>>,
    /// `shareProcessNamespace`, whatever its type.
    pub share_process_namespace: Option<Value>,
}

object_view!(PodSpec {
    "serviceAccountName" => service_account_name: checked,
    "serviceAccount" => service_account: checked,
    "restartPolicy" => restart_policy: checked,
    "initContainers" => init_containers: checked,
    "containers" => containers: checked,
    "automountServiceAccountToken" => automount_token: any_value,
    "volumes" => volumes: checked,
    "imagePullSecrets" => image_pull_secrets: present,
    "shareProcessNamespace" => share_process_namespace: any_value,
});

impl PodSpec<'_> {
    /// `serviceAccountName` or `serviceAccount` is a non-empty string.
    pub fn names_service_account(&self) -> bool {
        [&self.service_account_name, &self.service_account]
            .into_iter()
            .any(|s| s.as_deref().is_some_and(|s| !s.is_empty()))
    }
}

/// A container of a pod spec.
#[derive(Clone, Debug, Default)]
pub(crate) struct ContainerView<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub image: Option<Str<'a>>,
    pub restart_policy: Option<Str<'a>>,
    /// Present when it is an array.
    pub restart_policy_rules: Option<List<RuleView<'a>>>,
    /// Present when it is an array.
    pub env: Option<EnvList<'a>>,
    /// Present when it is an object.
    pub startup_probe: Option<Probe<'a>>,
    pub ports: Option<List<Port<'a>>>,
    /// Present when it is an array: the volume names of its mounts.
    pub volume_mounts: Option<List<Named<'a>>>,
}

object_view!(ContainerView {
    "name" => name: checked,
    "image" => image: checked,
    "restartPolicy" => restart_policy: checked,
    "restartPolicyRules" => restart_policy_rules: checked,
    "env" => env: checked,
    "startupProbe" => startup_probe: checked,
    "ports" => ports: checked,
    "volumeMounts" => volume_mounts: checked,
});

/// One `restartPolicyRules` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct RuleView<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub action: Option<Str<'a>>,
    /// Present when it is an object.
    pub exit_codes: Option<ExitCodes<'a>>,
}

object_view!(RuleView {
    "action" => action: checked,
    "exitCodes" => exit_codes: checked,
});

/// `exitCodes` of a restart rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExitCodes<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub operator: Option<Str<'a>>,
    /// Present when it is an array; its integers.
    pub values: Option<Ints>,
}

object_view!(ExitCodes {
    "operator" => operator: checked,
    "values" => values: checked,
});

/// The env names the rules look up (the agent's contract): the only entries an [`EnvList`] keeps.
pub(crate) fn is_env_name_read(name: &str) -> bool {
    matches!(
        name,
        agent_env::NAMESPACE
            | agent_env::POD_NAME
            | agent_env::JOBSET_NAME
            | agent_env::RESTART_EXIT_CODE
            | agent_env::RESTART_EXIT_CODE_ALIAS
            | agent_env::PROTOCOL
            | agent_env::BARRIER_PORT
            | agent_env::BARRIER_PORT_ALIAS
            | agent_env::BARRIER_PATH
            | agent_env::BARRIER_PATH_ALIAS
            | agent_env::BARRIER_HOLD
            | agent_env::WORKER_COMMAND
    )
}

/// A container's `env` array: the entries whose name [`is_env_name_read`], with their index (a
/// container commonly has dozens of entries the rules never look at).
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvList<'a> {
    pub read: Vec<(usize, EnvVar<'a>)>,
    /// Entries that are not objects, or whose `name` or `value` is not a string.
    pub bad: BadElements,
}

impl<'de> Shape<'de> for EnvList<'de> {
    const EXPECTED: &'static str = "an array";
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut read = Vec::new();
        let mut bad = BadElements::default();
        let mut index = 0;
        while let Some(Checked(entry)) = seq.next_element::<Checked<EnvVar<'de>>>()? {
            match entry {
                Ok(Some(entry)) => {
                    if let Some(w) = entry.wrong.first() {
                        bad.record(index, w.found);
                    }
                    if entry.name.as_deref().is_some_and(is_env_name_read) && take_element() {
                        read.push((index, entry));
                    }
                }
                Ok(None) => bad.record(index, Kind::Null),
                Err(kind) => bad.record(index, kind),
            }
            index += 1;
        }
        Ok(Some(EnvList { read, bad }))
    }
}

/// One `env` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvVar<'a> {
    pub name: Option<Str<'a>>,
    pub value: Option<Str<'a>>,
    /// `valueFrom` is present (whatever its type).
    pub value_from: bool,
    pub wrong: Wrong,
}

object_view!(
    EnvVar,
    |key| match key {
        "name" => 1,
        "value" => 2,
        "valueFrom" => 3,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.name = checked(map, &mut v.wrong, "name")?,
        2 => v.value = checked(map, &mut v.wrong, "value")?,
        _ => {
            map.next_value::<Lenient<Skip>>()?;
            v.value_from = true;
        }
    }
);

/// `startupProbe` of a container.
#[derive(Clone, Debug, Default)]
pub(crate) struct Probe<'a> {
    /// Present whatever its type; its fields are read when it is an object.
    pub http_get: Option<HttpGet<'a>>,
    pub period_seconds: Option<i64>,
    pub timeout_seconds: Option<i64>,
    pub failure_threshold: Option<i64>,
    pub wrong: Wrong,
}

object_view!(
    Probe,
    |key| match key {
        "httpGet" => 1,
        "periodSeconds" => 2,
        "failureThreshold" => 3,
        "timeoutSeconds" => 4,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.http_get = Some(checked(map, &mut v.wrong, "httpGet")?.unwrap_or_default()),
        2 => v.period_seconds = checked(map, &mut v.wrong, "periodSeconds")?,
        4 => v.timeout_seconds = checked(map, &mut v.wrong, "timeoutSeconds")?,
        _ => v.failure_threshold = checked(map, &mut v.wrong, "failureThreshold")?,
    }
);

/// `startupProbe.httpGet`.
#[derive(Clone, Debug, Default)]
pub(crate) struct HttpGet<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// Present whatever its type: a number, or a port name.
    pub port: Option<Value>,
    pub path: Option<Str<'a>>,
}

object_view!(HttpGet {
    "port" => port: any_value,
    "path" => path: checked,
});

/// An entry of a list keyed by `name` (`volumes`, `volumeMounts`, `imagePullSecrets`): its name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Named<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
}

object_view!(Named {
    "name" => name: checked,
});

impl<'a> List<Named<'a>> {
    /// Some entry is named `name`.
    pub fn has_name(&self, name: &str) -> bool {
        self.0.iter().any(|e| e.name.as_deref() == Some(name))
    }
}

/// An entry of a pod spec's `volumes`: its name, whether it is, as JSON, exactly the volume the
/// injection adds for the agent's token ([`super::token::TOKEN_VOLUME_JSON`]), and whether its
/// `projected` holds a `serviceAccountToken` (at any depth: what the kubelet would project is
/// `sources[i].serviceAccountToken`; elsewhere the key is no field, and is counted all the same).
#[derive(Clone, Debug, Default)]
pub(crate) struct Volume<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub is_token_volume: bool,
    pub projects_token: bool,
}

/// Numbers the keys of a volume by the token volume's fields (from 1; any other key is
/// `u8::MAX`, read and remembered).
fn token_volume_key(key: &str) -> u8 {
    super::token::TOKEN_VOLUME_JSON
        .fields()
        .iter()
        .position(|(k, _)| *k == key)
        .and_then(|i| u8::try_from(i + 1).ok())
        .unwrap_or(u8::MAX)
}

impl<'de> Shape<'de> for Volume<'de> {
    const EXPECTED: &'static str = "an object";
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        let fields = super::token::TOKEN_VOLUME_JSON.fields();
        let mut v = Volume::default();
        let mut seen = FixedFields::new(fields.len());
        let find = Find {
            key: "serviceAccountToken",
            found: std::cell::Cell::new(false),
        };
        let raw = walk_object::<Self, A>(&mut map, token_volume_key, |n, map| {
            let i = usize::from(n).wrapping_sub(1);
            match fields.get(i) {
                Some(("name", expected)) => {
                    v.name = checked(map, &mut v.wrong, "name")?;
                    let equal = matches!((&v.name, expected), (Some(n), Fixed::Str(e)) if n == e);
                    seen.set(i, equal);
                }
                Some((_, expected)) => {
                    seen.set(i, map.next_value_seed(Equals(*expected, Some(&find)))?);
                }
                None => {
                    map.next_value::<Lenient<Skip>>()?;
                    seen.other = true;
                }
            }
            Ok(())
        })?;
        Ok(match raw {
            Some(raw) => raw,
            None => {
                v.is_token_volume = seen.all();
                v.projects_token = find.found.get();
                Some(v)
            }
        })
    }
}

impl<'a> List<Volume<'a>> {
    /// Some entry is the injection's token volume, exactly.
    pub fn has_token_volume(&self) -> bool {
        self.0.iter().any(|v| v.is_token_volume)
    }

    /// The indices of the entries, other than the injection's token volume, that project a
    /// service account token.
    pub fn other_token_projections(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().filter_map(|(i, v)| {
            let own = v.name.as_deref() == Some(super::token::TOKEN_VOLUME);
            // One of the token volume's name is reported as that (foreign_token_volumes).
            (v.projects_token && !v.is_token_volume && !own).then_some(i)
        })
    }

    /// The indices of the entries named as the injection's token volume that are not it.
    pub fn foreign_token_volumes(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().filter_map(|(i, v)| {
            (v.name.as_deref() == Some(super::token::TOKEN_VOLUME) && !v.is_token_volume)
                .then_some(i)
        })
    }
}

/// One `ports` entry of a container.
#[derive(Clone, Debug, Default)]
pub(crate) struct Port<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub container_port: Option<i64>,
}

object_view!(Port {
    "name" => name: checked,
    "containerPort" => container_port: checked,
});

/// Decodes an AdmissionReview body. `Ok(None)` for JSON that is not an object; `Err` exactly when
/// `serde_json::from_slice::<Value>(body)` fails, with its error.
pub(crate) fn parse_review(body: &[u8]) -> Result<Option<Review<'_>>, serde_json::Error> {
    let (review, truncated) = with_budget(|| match std::str::from_utf8(body) {
        // Valid UTF-8 text: serde_json's `str` reader checks the same as its slice reader, without
        // checking each string's UTF-8 again.
        Ok(text) => serde_json::from_str::<Lenient<Review<'_>>>(text).map(|l| l.0),
        Err(_) => serde_json::from_slice::<Lenient<Review<'_>>>(body).map(|l| l.0),
    });
    let mut review = review?;
    if truncated && let Some(request) = review.as_mut().and_then(|r| r.request.as_mut()) {
        for object in [&mut request.object, &mut request.old_object]
            .into_iter()
            .flatten()
        {
            object.truncated = true;
        }
    }
    Ok(review)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::token::TOKEN_VOLUME_JSON;

    fn token_volume() -> Value {
        TOKEN_VOLUME_JSON.to_value()
    }

    /// A volume read from its text and from the `Value` of that text: the same answer, and the
    /// same as `Value`'s `==` with the token volume (or the same error).
    fn read_both(text: &str) -> Result<bool, String> {
        let from_bytes = serde_json::from_str::<Lenient<Volume<'_>>>(text)
            .map(|v| v.0.is_some_and(|v| v.is_token_volume))
            .map_err(|e| e.to_string());
        let value = serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
        let from_value = value
            .as_ref()
            .map(|v| Lenient::<Volume<'_>>::from_value(v).is_some_and(|v| v.is_token_volume));
        assert_eq!(from_bytes, from_value.map_err(Clone::clone), "{text}");
        if let Ok(v) = &value {
            assert_eq!(from_value, Ok(*v == token_volume()), "{text}");
        }
        from_bytes
    }

    #[test]
    fn the_token_volume_is_recognised_exactly_as_a_value_compares() {
        let exact = token_volume().to_string();
        assert_eq!(read_both(&exact), Ok(true));
        // Keys in another order, and escapes in a key and a value: still it.
        let reordered = exact
            .replacen("\"name\":\"jobset-inplace-agent-token\",", "", 1)
            .replacen(
                '{',
                "{\"n\\u0061me\":\"jobset-inplace-agent-tok\\u0065n\",",
                1,
            );
        assert_ne!(reordered, exact);
        assert_eq!(read_both(&reordered), Ok(true));
        let raw = |inner: &str| {
            format!(
                "{{\"$serde_json::private::RawValue\":{}}}",
                Value::from(inner)
            )
        };
        let projected = token_volume()["projected"].to_string();
        let sources = token_volume()["projected"]["sources"].to_string();
        for (text, want) in [
            // A raw-value object stands for the JSON it holds, at any depth.
            (raw(&exact), Ok(true)),
            (
                format!(
                    "{{\"name\":\"jobset-inplace-agent-token\",\"projected\":{}}}",
                    raw(&projected)
                ),
                Ok(true),
            ),
            (exact.replacen(&sources, &raw(&sources), 1), Ok(true)),
            (
                format!(
                    "{{\"name\":\"jobset-inplace-agent-token\",\"projected\":{}}}",
                    raw("[1]")
                ),
                Ok(false),
            ),
            // The last of duplicate keys counts.
            (exact.replacen('{', "{\"projected\":{},", 1), Ok(true)),
            (
                format!("{},\"projected\":{{}}}}", &exact[..exact.len() - 1]),
                Ok(false),
            ),
            // A float is not an integer; one more element, key or source is not it.
            (exact.replacen("420", "420.0", 1), Ok(false)),
            (exact.replacen("3607", "3607.0", 1), Ok(false)),
            (
                exact.replacen("\"token\"}", "\"token\",\"audience\":\"x\"}", 1),
                Ok(false),
            ),
            (
                exact.replacen("\"ca.crt\"}]", "\"ca.crt\"},{}]", 1),
                Ok(false),
            ),
            (
                format!("{},\"emptyDir\":{{}}}}", &exact[..exact.len() - 1]),
                Ok(false),
            ),
            (
                exact.replacen("\"token\"}", "\"token\"},\"emptyDir\":{}", 1),
                Ok(false),
            ),
            (
                "{\"name\":\"jobset-inplace-agent-token\"}".to_owned(),
                Ok(false),
            ),
            (
                "{\"name\":\"jobset-inplace-agent-token\",\"emptyDir\":{}}".to_owned(),
                Ok(false),
            ),
            ("{\"name\":5}".to_owned(), Ok(false)),
        ] {
            assert_eq!(read_both(&text), want, "{text}");
        }
        // Broken raw values: the error a `Value` gives.
        for text in [
            format!("{{\"name\":\"x\",\"projected\":{}}}", raw("{")),
            format!(
                "{{\"name\":\"x\",\"projected\":{}}}",
                "{\"$serde_json::private::RawValue\":5}"
            ),
            format!(
                "{{\"name\":\"x\",\"projected\":{{\"sources\":{}}}}}",
                raw("[1] 2")
            ),
        ] {
            assert!(read_both(&text).is_err(), "{text}");
        }
    }
}
