//! What admission reads of an AdmissionReview and its JobSet, decoded in one pass straight from the
//! request body (or from a [`Value`], for the offline commands): sparse (only the fields the rules
//! read), borrowed (strings point into the body unless they hold escapes) and lenient (a field of
//! an unexpected JSON type reads as absent, never as an error). Nothing here is ever serialized
//! back: the output is built from targeted patch operations only (docs/architecture.md, "Admission").
//!
//! # Same answers as a `Value`
//!
//! The rules used to read a `serde_json::Value` of the whole body; they must answer the same for
//! every body, including which bodies are not JSON and with which error. So:
//!
//! - every JSON value, read or skipped, goes through `deserialize_any` with a visitor that accepts
//!   every type, exactly like `Value`'s own `Deserialize`: serde_json then performs the same checks
//!   in the same order (string escapes and UTF-8, number range, the recursion limit) and reports the
//!   same first error at the same position. `IgnoredAny` would not: it skips strings and numbers
//!   without checking them and has no recursion limit;
//! - an object whose *first* key is serde_json's raw-value token is read as `Value` reads it (the
//!   crate's build has serde_json's `raw_value` feature): its value must be a string holding JSON,
//!   which is what the object stands for ([`raw_value`]);
//! - duplicate keys: the last one wins, as in a `Value` (every field is assigned on every
//!   occurrence);
//! - numbers read as `i64` exactly as `Value::as_i64` (a float never is one);
//! - a string is a `Str`: borrowed from the body without escapes, owned with them.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::wire::agent_env;

/// A JSON string: borrowed from the input when it holds no escapes.
pub(crate) type Str<'a> = Cow<'a, str>;

/// serde_json's raw-value token: a `Value` reads an object whose first key is this as the JSON text
/// held by its value.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// A view of one JSON value of the JSON type it expects. A value of another type is `None` (the
/// field reads as absent) after being consumed and checked like any other.
pub(crate) trait Shape<'de>: Sized {
    fn from_i64(_: i64) -> Option<Self> {
        None
    }
    fn from_u64(_: u64) -> Option<Self> {
        None
    }
    /// A string that does not outlive the call (it held escapes).
    fn from_str(_: &str) -> Option<Self> {
        None
    }
    fn from_borrowed_str(s: &'de str) -> Option<Self> {
        Self::from_str(s)
    }
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        skip_seq(seq).map(|()| None)
    }
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        Ok(walk_object::<Self, A>(&mut map, |_| 0, |_, _| Ok(()))?.unwrap_or(None))
    }
}

/// Reads a `T` leniently: `Lenient(None)` for a value of another JSON type. The `Deserialize` the views
/// are read through.
pub(crate) struct Lenient<T>(pub Option<T>);

impl<'de, T: Shape<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ShapeVisitor::<T>(PhantomData))
            .map(Lenient)
    }
}

impl<'de, T: Shape<'de>> Lenient<T> {
    /// Reads a view from an in-memory value (the offline commands' path). Never fails: every
    /// visitor accepts every JSON type.
    pub fn from_value(value: &'de Value) -> Option<T> {
        Lenient::<T>::deserialize(value).ok().and_then(|l| l.0)
    }
}

struct ShapeVisitor<T>(PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for ShapeVisitor<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Option<T>, E> {
        Ok(T::from_i64(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Option<T>, E> {
        Ok(T::from_u64(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<T>, E> {
        Ok(T::from_str(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Option<T>, E> {
        Ok(T::from_borrowed_str(v))
    }
    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<T>, A::Error> {
        T::from_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
        T::from_map(map)
    }
}

/// Any JSON value, checked and dropped.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Skip;

impl Shape<'_> for Skip {}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Lenient<Skip>>()?.is_some() {}
    Ok(())
}

/// Walks a JSON object: `field` numbers the keys the caller reads (0: not read), `value` reads the
/// value of such a key from the map; every other value is skipped. `Some(raw)` when the object is
/// a raw value (see [`raw_value`]): the caller's view of it, read from the JSON it holds.
pub(crate) fn walk_object<'de, T: Shape<'de>, A: MapAccess<'de>>(
    map: &mut A,
    field: fn(&str) -> u8,
    mut value: impl FnMut(u8, &mut A) -> Result<(), A::Error>,
) -> Result<Option<Option<T>>, A::Error> {
    let mut first = true;
    while let Some(key) = map.next_key_seed(KeySeed { field, first })? {
        match key {
            Key::RawValue => return raw_value::<T, A>(map).map(Some),
            Key::Field(0) => {
                map.next_value::<Lenient<Skip>>()?;
            }
            Key::Field(n) => value(n, map)?,
        }
        first = false;
    }
    Ok(None)
}

enum Key {
    /// The first key is the raw-value token.
    RawValue,
    Field(u8),
}

struct KeySeed {
    field: fn(&str) -> u8,
    first: bool,
}

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        // As `Value` reads its keys.
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, key: &str) -> Result<Key, E> {
        Ok(if self.first && key == RAW_VALUE_TOKEN {
            Key::RawValue
        } else {
            Key::Field((self.field)(key))
        })
    }
}

/// An object whose first key is serde_json's raw-value token, read as `Value` reads it: its value
/// must be a string (else the error `Value` gives), which is parsed as JSON (its error wrapped as
/// `Value` wraps it), and the object stands for that JSON. The map is left after that first entry,
/// where serde_json expects its end.
fn raw_value<'de, T: Shape<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<Option<T>, A::Error> {
    let text = map.next_value_seed(RawText)?;
    let value: Value = serde_json::from_str(&text).map_err(de::Error::custom)?;
    value
        .deserialize_any(ShapeVisitor::<T>(PhantomData))
        .map_err(de::Error::custom)
}

/// The string value of a raw-value object (serde_json's `BoxedFromString`).
struct RawText;

impl<'de> DeserializeSeed<'de> for RawText {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for RawText {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The wording of serde_json's own visitor, which ends up in the error message.
        f.write_str("raw value")
    }
    fn visit_str<E>(self, s: &str) -> Result<String, E> {
        Ok(s.to_owned())
    }
    fn visit_string<E>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
}

impl<'de> Shape<'de> for Str<'de> {
    fn from_str(s: &str) -> Option<Self> {
        Some(Cow::Owned(s.to_owned()))
    }
    fn from_borrowed_str(s: &'de str) -> Option<Self> {
        Some(Cow::Borrowed(s))
    }
}

/// `Value::as_i64`: an integer in range; never a float.
impl Shape<'_> for i64 {
    fn from_i64(v: i64) -> Option<Self> {
        Some(v)
    }
    fn from_u64(v: u64) -> Option<Self> {
        i64::try_from(v).ok()
    }
}

/// An array, every element kept at its index (an element of another JSON type reads as
/// `T::default()`, whose fields are all absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct List<T>(pub Vec<T>);

impl<'de, T: Shape<'de> + Default> Shape<'de> for List<T> {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        // serde_json gives no size hint: start with room for a few.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
        while let Some(Lenient(item)) = seq.next_element::<Lenient<T>>()? {
            items.push(item.unwrap_or_default());
        }
        Ok(Some(List(items)))
    }
}

/// An array of integers: elements that are not `i64` are left out (`filter_map(Value::as_i64)`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ints(pub Vec<i64>);

impl<'de> Shape<'de> for Ints {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        while let Some(Lenient(item)) = seq.next_element::<Lenient<i64>>()? {
            items.extend(item);
        }
        Ok(Some(Ints(items)))
    }
}

/// Reads the value of the current key leniently.
fn lenient<'de, T: Shape<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<Option<T>, A::Error> {
    map.next_value::<Lenient<T>>().map(|l| l.0)
}

/// Reads the value of the current key as a `Value` (present, whatever its type, `null` included).
fn any_value<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Value>, A::Error> {
    map.next_value::<Value>().map(Some)
}

/// A view of a JSON object. Common form: `Name { "key" => field: reader, ... }`, each key read
/// into its field by `lenient` or `any_value`. General form: `fields` numbers the keys it reads
/// (from 1, 0 for the rest), `read` reads one.
macro_rules! object_view {
    ($name:ident { $($key:expr => $field:ident: $reader:ident),+ $(,)? }) => {
        object_view!(
            $name,
            |key| {
                let mut n = 0u8;
                $(
                    n += 1;
                    if key == $key {
                        return n;
                    }
                )+
                0
            },
            |v, field, map| {
                let mut n = 0u8;
                $(
                    n += 1;
                    if field == n {
                        v.$field = $reader(map)?;
                    }
                )+
            }
        );
    };
    ($name:ident, |$key:ident| $fields:expr, |$view:ident, $field:ident, $map:ident| $read:expr) => {
        impl<'de> Shape<'de> for $name<'de> {
            fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
                let mut $view = $name::default();
                let raw = walk_object::<Self, A>(
                    &mut map,
                    |$key| $fields,
                    |$field, $map| {
                        $read;
                        Ok(())
                    },
                )?;
                Ok(match raw {
                    Some(raw) => raw,
                    None => Some($view),
                })
            }
        }
    };
}

/// An AdmissionReview request body.
#[derive(Clone, Debug, Default)]
pub(crate) struct Review<'a> {
    pub api_version: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
    pub request: Option<RequestView<'a>>,
}

object_view!(Review {
    "apiVersion" => api_version: lenient,
    "kind" => kind: lenient,
    "request" => request: lenient,
});

/// `request` of an AdmissionReview.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestView<'a> {
    pub uid: Option<Str<'a>>,
    pub operation: Option<Str<'a>>,
    pub kind: Option<GroupKind<'a>>,
    /// Present when it is an object.
    pub object: Option<JobSetView<'a>>,
    pub old_object: Option<JobSetView<'a>>,
}

object_view!(RequestView {
    "uid" => uid: lenient,
    "operation" => operation: lenient,
    "kind" => kind: lenient,
    "object" => object: lenient,
    "oldObject" => old_object: lenient,
});

/// `request.kind`.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupKind<'a> {
    pub group: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
}

object_view!(GroupKind {
    "group" => group: lenient,
    "kind" => kind: lenient,
});

/// A JobSet: what validation and mutation read of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSetView<'a> {
    pub metadata: Option<Meta<'a>>,
    pub spec: Option<JobSetSpec<'a>>,
}

object_view!(JobSetView {
    "metadata" => metadata: lenient,
    "spec" => spec: lenient,
});

impl<'a> JobSetView<'a> {
    /// The view of an in-memory JobSet (the default, all absent, for a non-object).
    pub fn from_value(value: &'a Value) -> Self {
        Lenient::<JobSetView<'a>>::from_value(value).unwrap_or_default()
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
    pub name: Option<Str<'a>>,
    pub generate_name: Option<Str<'a>>,
    /// Present when it is an object.
    pub annotations: Option<Annotations<'a>>,
}

object_view!(Meta {
    "name" => name: lenient,
    "generateName" => generate_name: lenient,
    "annotations" => annotations: lenient,
});

/// The two annotations admission reads (their string values).
#[derive(Clone, Debug, Default)]
pub(crate) struct Annotations<'a> {
    /// `jobset-inplace.dev/inject`
    pub inject: Option<Str<'a>>,
    /// `jobset-inplace.dev/injected`
    pub injected: Option<Str<'a>>,
}

object_view!(Annotations {
    super::INJECT_ANNOTATION => inject: lenient,
    super::INJECTED_ANNOTATION => injected: lenient,
});

/// `spec` of a JobSet.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSetSpec<'a> {
    pub failure_policy: Option<FailurePolicy<'a>>,
    pub replicated_jobs: Option<List<ReplicatedJob<'a>>>,
}

object_view!(JobSetSpec {
    "failurePolicy" => failure_policy: lenient,
    "replicatedJobs" => replicated_jobs: lenient,
});

/// `spec.failurePolicy`.
#[derive(Clone, Debug, Default)]
pub(crate) struct FailurePolicy<'a> {
    pub restart_strategy: Option<Str<'a>>,
    pub max_restarts: Option<i64>,
}

object_view!(FailurePolicy {
    "restartStrategy" => restart_strategy: lenient,
    "maxRestarts" => max_restarts: lenient,
});

/// One `spec.replicatedJobs[i]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReplicatedJob<'a> {
    /// `template.spec`, when `template` and it are objects.
    pub job_spec: Option<JobSpec<'a>>,
}

object_view!(
    ReplicatedJob,
    |key| match key {
        "template" => 1,
        _ => 0,
    },
    |v, _field, map| v.job_spec = lenient::<JobTemplate<'de>, A>(map)?.and_then(|t| t.spec)
);

/// `template` of a replicatedJob (the Job template).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobTemplate<'a> {
    pub spec: Option<JobSpec<'a>>,
}

object_view!(
    JobTemplate,
    |key| match key {
        "spec" => 1,
        _ => 0,
    },
    |v, _field, map| v.spec = lenient(map)?
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
}

object_view!(
    JobSpec,
    |key| match key {
        "backoffLimit" => 1,
        "podReplacementPolicy" => 2,
        "completions" => 3,
        "parallelism" => 4,
        "template" => 5,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.backoff_limit = any_value(map)?,
        2 => v.pod_replacement_policy = any_value(map)?,
        3 => v.completions = lenient(map)?,
        4 => v.parallelism = lenient(map)?,
        _ => v.template = lenient(map)?,
    }
);

/// The pod template of a Job.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodTemplate<'a> {
    /// Present when it is an object.
    pub metadata: Option<Meta<'a>>,
    /// Present when it is an object.
    pub spec: Option<PodSpec<'a>>,
}

object_view!(PodTemplate {
    "metadata" => metadata: lenient,
    "spec" => spec: lenient,
});

/// A pod spec.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodSpec<'a> {
    pub service_account_name: Option<Str<'a>>,
    pub service_account: Option<Str<'a>>,
    /// Present when it is an array.
    pub init_containers: Option<List<ContainerView<'a>>>,
    pub containers: Option<List<ContainerView<'a>>>,
}

object_view!(PodSpec {
    "serviceAccountName" => service_account_name: lenient,
    "serviceAccount" => service_account: lenient,
    "initContainers" => init_containers: lenient,
    "containers" => containers: lenient,
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
    pub name: Option<Str<'a>>,
    pub restart_policy: Option<Str<'a>>,
    /// Present when it is an array.
    pub restart_policy_rules: Option<List<RuleView<'a>>>,
    /// Present when it is an array.
    pub env: Option<EnvList<'a>>,
    /// Present when it is an object.
    pub startup_probe: Option<Probe<'a>>,
    pub ports: Option<List<Port<'a>>>,
}

object_view!(ContainerView {
    "name" => name: lenient,
    "restartPolicy" => restart_policy: lenient,
    "restartPolicyRules" => restart_policy_rules: lenient,
    "env" => env: lenient,
    "startupProbe" => startup_probe: lenient,
    "ports" => ports: lenient,
});

/// One `restartPolicyRules` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct RuleView<'a> {
    pub action: Option<Str<'a>>,
    /// Present when it is an object.
    pub exit_codes: Option<ExitCodes<'a>>,
}

object_view!(RuleView {
    "action" => action: lenient,
    "exitCodes" => exit_codes: lenient,
});

/// `exitCodes` of a restart rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExitCodes<'a> {
    pub operator: Option<Str<'a>>,
    /// Present when it is an array; its integers.
    pub values: Option<Ints>,
}

object_view!(ExitCodes {
    "operator" => operator: lenient,
    "values" => values: lenient,
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
            | agent_env::WORKER_COMMAND
    )
}

/// A container's `env` array: the entries whose name [`is_env_name_read`], with their index (a
/// container commonly has dozens of entries the rules never look at).
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvList<'a> {
    pub read: Vec<(usize, EnvVar<'a>)>,
}

impl<'de> Shape<'de> for EnvList<'de> {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut read = Vec::new();
        let mut index = 0;
        while let Some(Lenient(entry)) = seq.next_element::<Lenient<EnvVar<'de>>>()? {
            if let Some(entry) = entry
                && entry.name.as_deref().is_some_and(is_env_name_read)
            {
                read.push((index, entry));
            }
            index += 1;
        }
        Ok(Some(EnvList { read }))
    }
}

/// One `env` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvVar<'a> {
    pub name: Option<Str<'a>>,
    pub value: Option<Str<'a>>,
    /// `valueFrom` is present (whatever its type).
    pub value_from: bool,
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
        1 => v.name = lenient(map)?,
        2 => v.value = lenient(map)?,
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
    pub failure_threshold: Option<i64>,
}

object_view!(
    Probe,
    |key| match key {
        "httpGet" => 1,
        "periodSeconds" => 2,
        "failureThreshold" => 3,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.http_get = Some(lenient(map)?.unwrap_or_default()),
        2 => v.period_seconds = lenient(map)?,
        _ => v.failure_threshold = lenient(map)?,
    }
);

/// `startupProbe.httpGet`.
#[derive(Clone, Debug, Default)]
pub(crate) struct HttpGet<'a> {
    /// Present whatever its type: a number, or a port name.
    pub port: Option<Value>,
    pub path: Option<Str<'a>>,
}

object_view!(HttpGet {
    "port" => port: any_value,
    "path" => path: lenient,
});

/// One `ports` entry of a container.
#[derive(Clone, Debug, Default)]
pub(crate) struct Port<'a> {
    pub name: Option<Str<'a>>,
    pub container_port: Option<i64>,
}

object_view!(Port {
    "name" => name: lenient,
    "containerPort" => container_port: lenient,
});

/// Decodes an AdmissionReview body. `Ok(None)` for JSON that is not an object; `Err` exactly when
/// `serde_json::from_slice::<Value>(body)` fails, with its error.
pub(crate) fn parse_review(body: &[u8]) -> Result<Option<Review<'_>>, serde_json::Error> {
    match std::str::from_utf8(body) {
        // Valid UTF-8 text: serde_json's `str` reader checks the same as its slice reader, without
        // checking each string's UTF-8 again.
        Ok(text) => serde_json::from_str::<Lenient<Review<'_>>>(text).map(|l| l.0),
        Err(_) => serde_json::from_slice::<Lenient<Review<'_>>>(body).map(|l| l.0),
    }
}

/// `spec.replicatedJobs` of `request.object` and `request.oldObject` as written in a body (each
/// present only when every level is an object and `replicatedJobs` an array, else empty).
#[derive(Debug, Default)]
pub(crate) struct RawJobs<'a> {
    pub object: Vec<&'a RawValue>,
    pub old_object: Vec<&'a RawValue>,
}

/// Reads [`RawJobs`] from a body that [`parse_review`] accepted. `None` where the text of the jobs
/// is not in the body (an enclosing object is a raw-value object: its JSON is in a string).
pub(crate) fn raw_jobs(body: &[u8]) -> Option<RawJobs<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let review = serde_json::from_str::<Lenient<RawReview<'_>>>(text)
        .ok()?
        .0?;
    fn jobs(o: Option<RawJobSet<'_>>) -> Vec<&RawValue> {
        o.and_then(|o| o.spec)
            .and_then(|s| s.replicated_jobs)
            .map(|l| l.0)
            .unwrap_or_default()
    }
    let request = review.request.unwrap_or_default();
    Some(RawJobs {
        object: jobs(request.object),
        old_object: jobs(request.old_object),
    })
}

use serde_json::value::RawValue;

#[derive(Default)]
struct RawReview<'a> {
    request: Option<RawRequest<'a>>,
}

object_view!(
    RawReview,
    |key| match key {
        "request" => 1,
        _ => 0,
    },
    |v, _field, map| v.request = lenient(map)?
);

#[derive(Default)]
struct RawRequest<'a> {
    object: Option<RawJobSet<'a>>,
    old_object: Option<RawJobSet<'a>>,
}

object_view!(
    RawRequest,
    |key| match key {
        "object" => 1,
        "oldObject" => 2,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.object = lenient(map)?,
        _ => v.old_object = lenient(map)?,
    }
);

#[derive(Default)]
struct RawJobSet<'a> {
    spec: Option<RawSpec<'a>>,
}

object_view!(
    RawJobSet,
    |key| match key {
        "spec" => 1,
        _ => 0,
    },
    |v, _field, map| v.spec = lenient(map)?
);

#[derive(Default)]
struct RawSpec<'a> {
    replicated_jobs: Option<RawList<'a>>,
}

object_view!(
    RawSpec,
    |key| match key {
        "replicatedJobs" => 1,
        _ => 0,
    },
    |v, _field, map| v.replicated_jobs = lenient(map)?
);

/// An array's elements as written. Only in a body's text: read from anything else (a raw-value
/// object's JSON), it fails, and so does [`raw_jobs`].
struct RawList<'a>(Vec<&'a RawValue>);

impl<'de> Shape<'de> for RawList<'de> {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            items.push(item);
        }
        Ok(Some(RawList(items)))
    }
}
