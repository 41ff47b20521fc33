//! The structural schema of a custom resource, applied on every write as the real API server
//! does: fields the schema does not know are pruned, then the object is validated and a failure
//! is a 422 `Invalid` whose causes name each field (`status.syncedEpoch`).
//!
//! Pruning follows `properties`, `items`, `additionalProperties`,
//! `x-kubernetes-preserve-unknown-fields` and `x-kubernetes-embedded-resource` (which keeps
//! `apiVersion`, `kind` and `metadata`); a `null` in a field that is not `nullable` is dropped.
//! Validation is the schema's OpenAPI keywords (type, minimum, enum, required, pattern, ...)
//! through `jsonschema`, compiled once per schema. An error on a value the update did not change
//! is not reported (validation ratcheting, as upstream since 1.33). Not applied: CEL rules
//! (`x-kubernetes-validations`), `format`, schema defaults (`default`), and the pruning of
//! unknown fields inside `metadata`.

use std::fmt;
use std::sync::{Arc, LazyLock};

use serde_json::{Map, Value, json};

/// A CRD version's `openAPIV3Schema`, compiled.
pub struct CrdSchema {
    schema: Value,
    validator: jsonschema::Validator,
}

impl fmt::Debug for CrdSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CrdSchema")
    }
}

/// One cause of a 422 (`details.causes[]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

impl CrdSchema {
    /// The schema of `version` in a CustomResourceDefinition object.
    pub fn from_crd(crd: &Value, version: &str) -> Result<Self, String> {
        let schema = crd["spec"]["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == version))
            .map(|v| v["schema"]["openAPIV3Schema"].clone())
            .ok_or_else(|| format!("no openAPIV3Schema for version {version}"))?;
        Self::new(schema)
    }

    /// Compiles an `openAPIV3Schema` (OpenAPI 3.0, read as JSON Schema draft 4 with `nullable`).
    pub fn new(schema: Value) -> Result<Self, String> {
        let mut compiled = schema.clone();
        allow_null(&mut compiled);
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(false)
            .build(&compiled)
            .map_err(|e| e.to_string())?;
        Ok(CrdSchema { schema, validator })
    }

    /// Drops what the schema does not know, in place.
    pub fn prune(&self, object: &mut Value) {
        prune(&self.schema, object, true);
    }

    /// The validation errors of `new`, leaving out those at a value equal in `old`.
    pub fn causes(&self, new: &Value, old: Option<&Value>) -> Vec<Cause> {
        if self.validator.is_valid(new) {
            return Vec::new();
        }
        self.validator
            .iter_errors(new)
            .filter(|e| {
                let at = e.instance_path.as_str();
                old.and_then(|o| o.pointer(at))
                    .is_none_or(|o| Some(o) != new.pointer(at))
            })
            .map(|e| cause(new, &e))
            .collect()
    }

    /// Prunes `object`, then validates it: every invalid field (the store answers them as one
    /// 422, `ApiError::invalid_causes`).
    pub fn admit(&self, object: &mut Value, old: Option<&Value>) -> Result<(), Vec<Cause>> {
        self.prune(object);
        let causes = self.causes(object, old);
        if causes.is_empty() {
            Ok(())
        } else {
            Err(causes)
        }
    }
}

/// `nullable: true` becomes a type that admits `null` (JSON Schema has no `nullable`).
fn allow_null(schema: &mut Value) {
    let Some(m) = schema.as_object_mut() else {
        return;
    };
    if m.get("nullable") == Some(&Value::Bool(true))
        && let Some(Value::String(t)) = m.get("type")
    {
        let t = t.clone();
        m.insert("type".into(), json!([t, "null"]));
    }
    for (key, sub) in m.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "definitions" => {
                if let Some(props) = sub.as_object_mut() {
                    props.values_mut().for_each(allow_null);
                }
            }
            "items" | "additionalProperties" | "not" => allow_null(sub),
            "allOf" | "anyOf" | "oneOf" => {
                if let Some(list) = sub.as_array_mut() {
                    list.iter_mut().for_each(allow_null);
                }
            }
            _ => {}
        }
    }
}

fn is_true(schema: &Value, key: &str) -> bool {
    schema.get(key) == Some(&Value::Bool(true))
}

fn prune(schema: &Value, value: &mut Value, root: bool) {
    match value {
        Value::Object(m) => prune_object(
            schema,
            m,
            root || is_true(schema, "x-kubernetes-embedded-resource"),
        ),
        Value::Array(items) => {
            if let Some(item) = schema.get("items").filter(|s| s.is_object()) {
                items.iter_mut().for_each(|v| prune(item, v, false));
            }
        }
        _ => {}
    }
}

fn prune_object(schema: &Value, m: &mut Map<String, Value>, resource: bool) {
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let preserve = is_true(schema, "x-kubernetes-preserve-unknown-fields")
        || additional == Some(&Value::Bool(true));
    m.retain(|key, v| {
        if resource && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            return true;
        }
        let sub = props
            .and_then(|p| p.get(key))
            .or(additional.filter(|a| a.is_object()));
        match sub {
            Some(sub) => {
                if v.is_null() {
                    return is_true(sub, "nullable");
                }
                prune(sub, v, false);
                true
            }
            None => preserve,
        }
    });
}

/// `status.replicatedJobs[0].name` for `/status/replicatedJobs/0/name`.
fn field_path(object: &Value, pointer: &str) -> String {
    let mut out = String::new();
    let mut at = Some(object);
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        match at {
            Some(Value::Array(a)) => {
                out.push_str(&format!("[{seg}]"));
                at = seg.parse::<usize>().ok().and_then(|i| a.get(i));
            }
            _ => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&seg);
                at = at.and_then(|v| v.get(&seg));
            }
        }
    }
    out
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A cause worded as upstream's (`Invalid value: -1: syncedEpoch in body should be greater than
/// or equal to 0`).
fn cause(object: &Value, e: &jsonschema::ValidationError<'_>) -> Cause {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    let (pointer, instance) = (e.instance_path.as_str(), e.instance.as_ref());
    let field = field_path(object, pointer);
    let leaf = pointer.rsplit('/').next().unwrap_or_default().to_owned();
    let invalid = |what: String| Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: {instance}: {what}"),
        field: field.clone(),
    };
    match &e.kind {
        K::Type { kind } => {
            let want = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(ts) => ts
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            };
            let got = json_type(instance);
            Cause {
                reason: "FieldValueTypeInvalid",
                message: format!(
                    "Invalid value: \"{got}\": {leaf} in body must be of type {want}: \"{got}\""
                ),
                field,
            }
        }
        K::Enum { options } => {
            let supported = options
                .as_array()
                .map(|o| {
                    o.iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            Cause {
                reason: "FieldValueNotSupported",
                message: format!("Unsupported value: {instance}: supported values: {supported}"),
                field,
            }
        }
        K::Required { property } => Cause {
            reason: "FieldValueRequired",
            message: "Required value".into(),
            field: match property.as_str() {
                Some(p) if field.is_empty() => p.to_owned(),
                Some(p) => format!("{field}.{p}"),
                None => field,
            },
        },
        K::Minimum { limit } => invalid(format!(
            "{leaf} in body should be greater than or equal to {limit}"
        )),
        K::Maximum { limit } => invalid(format!(
            "{leaf} in body should be less than or equal to {limit}"
        )),
        K::ExclusiveMinimum { limit } => {
            invalid(format!("{leaf} in body should be greater than {limit}"))
        }
        K::ExclusiveMaximum { limit } => {
            invalid(format!("{leaf} in body should be less than {limit}"))
        }
        K::Pattern { pattern } => invalid(format!("{leaf} in body should match '{pattern}'")),
        K::MaxLength { limit } => Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {limit} bytes"),
            field,
        },
        K::MaxItems { limit } => Cause {
            reason: "FieldValueTooMany",
            message: format!("Too many: must have at most {limit} items"),
            field,
        },
        _ => invalid(format!("{leaf} in body: {e}")),
    }
}

impl PartialEq for CrdSchema {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for CrdSchema {}

const JOBSET_CRD: &str =
    include_str!("../../../fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml");
const EPOCH_STATUS_FIELDS: &str =
    include_str!("../../../deploy/components/epoch-status-fields/crd-status-fields.yaml");
const JOBSET_EPOCH_CRD: &str = include_str!("../../../deploy/base/jobsetepoch-crd.yaml");

fn compile(crd: &str, patch: Option<&str>, version: &str) -> Arc<CrdSchema> {
    let mut crd: Value = serde_saphyr::from_str(crd).expect("the CRD fixture is YAML");
    if let Some(patch) = patch {
        let patch: json_patch::Patch = serde_saphyr::from_str(patch).expect("a JSON patch");
        json_patch::patch(&mut crd, &patch).expect("the patch applies to the CRD");
    }
    Arc::new(CrdSchema::from_crd(&crd, version).expect("the CRD schema compiles"))
}

/// JobSet v0.12's released `v1alpha2` schema with the `epoch` dialect's status fields
/// (`deploy/components/epoch-status-fields`), as deploy/README.md installs it; compiled once.
pub fn jobset() -> Arc<CrdSchema> {
    static SCHEMA: LazyLock<Arc<CrdSchema>> =
        LazyLock::new(|| compile(JOBSET_CRD, Some(EPOCH_STATUS_FIELDS), "v1alpha2"));
    SCHEMA.clone()
}

/// The project's JobSetEpoch schema (`deploy/base/jobsetepoch-crd.yaml`); compiled once.
pub fn jobset_epoch() -> Arc<CrdSchema> {
    static SCHEMA: LazyLock<Arc<CrdSchema>> =
        LazyLock::new(|| compile(JOBSET_EPOCH_CRD, None, "v1alpha1"));
    SCHEMA.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the store answers a write: the causes as one 422.
    fn admit_as_422(
        rt: &crate::apiserver::resources::ResourceType,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), crate::apiserver::error::ApiError> {
        jobset().admit(object, old).map_err(|causes| {
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            crate::apiserver::error::ApiError::invalid_causes(rt, name, &causes)
        })
    }
    use crate::apiserver::resources::default_resources;

    fn jobset_object(status: Value) -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "ns", "anything": 1},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "bogus": true, "template": {
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}}]},
            "status": status,
        })
    }

    #[test]
    fn unknown_fields_are_pruned_known_ones_kept() {
        let mut js = jobset_object(json!({"syncedEpoch": 3, "bogusField": 1, "restarts": 0}));
        jobset().prune(&mut js);
        assert_eq!(js["status"], json!({"syncedEpoch": 3, "restarts": 0}));
        assert!(js["spec"]["replicatedJobs"][0].get("bogus").is_none());
        assert_eq!(js["spec"]["replicatedJobs"][0]["name"], "w");
        // metadata is the server's, not the schema's
        assert_eq!(js["metadata"]["anything"], 1);
        assert!(
            jobset().causes(&js, None).is_empty(),
            "{:?}",
            jobset().causes(&js, None)
        );
    }

    #[test]
    fn preserve_unknown_embedded_and_nullable() {
        let schema = CrdSchema::new(json!({
            "type": "object",
            "properties": {
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                         "properties": {"known": {"type": "object", "properties": {}}}},
                "map": {"type": "object", "additionalProperties": {"type": "object",
                        "properties": {"a": {"type": "integer"}}}},
                "embedded": {"type": "object", "x-kubernetes-embedded-resource": true,
                             "properties": {"spec": {"type": "object"}}},
                "maybe": {"type": "string", "nullable": true},
                "never": {"type": "string"},
            },
        }))
        .expect("compiles");
        let mut v = json!({
            "free": {"x": 1, "known": {"y": 2}},
            "map": {"k": {"a": 1, "b": 2}},
            "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}, "z": 1},
            "maybe": null, "never": null, "gone": 1,
        });
        schema.prune(&mut v);
        assert_eq!(
            v,
            json!({
                "free": {"x": 1, "known": {}},
                "map": {"k": {"a": 1}},
                "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
                "maybe": null,
            })
        );
        assert!(schema.causes(&v, None).is_empty());
    }

    #[test]
    fn invalid_values_are_422_with_each_field() {
        let rt = &default_resources()[1];
        let mut js = jobset_object(json!({"syncedEpoch": -1, "restarts": "a"}));
        let e = admit_as_422(rt, &mut js, None).expect_err("invalid");
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
        let status = e.status();
        assert_eq!(status["details"]["kind"], "JobSet");
        assert_eq!(status["details"]["group"], "jobset.x-k8s.io");
        let mut causes: Vec<(String, String)> = status["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["field"].as_str().unwrap_or_default().to_owned(),
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        causes.sort();
        assert_eq!(
            causes,
            [
                (
                    "status.restarts".to_owned(),
                    "FieldValueTypeInvalid".to_owned()
                ),
                (
                    "status.syncedEpoch".to_owned(),
                    "FieldValueInvalid".to_owned()
                ),
            ]
        );
        assert!(
            e.message
                .starts_with("JobSet.jobset.x-k8s.io \"js\" is invalid: ["),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("status.syncedEpoch: Invalid value: -1: syncedEpoch in body should be greater than or equal to 0"),
            "{}",
            e.message
        );
        let mut bad_enum = jobset_object(json!({}));
        bad_enum["spec"]["successPolicy"] = json!({"operator": "Bogus"});
        let e = admit_as_422(rt, &mut bad_enum, None).expect_err("enum");
        assert_eq!(
            e.status()["details"]["causes"][0]["field"],
            "spec.successPolicy.operator"
        );
        assert_eq!(
            e.status()["details"]["causes"][0]["reason"],
            "FieldValueNotSupported"
        );
        let mut bad_item = jobset_object(json!({}));
        bad_item["spec"]["replicatedJobs"][0]["replicas"] = json!("two");
        let e = admit_as_422(rt, &mut bad_item, None).expect_err("type");
        assert_eq!(
            e.status()["details"]["causes"][0]["field"],
            "spec.replicatedJobs[0].replicas"
        );
    }

    #[test]
    fn an_unchanged_invalid_value_is_not_reported_again() {
        let old = jobset_object(json!({"syncedEpoch": -1}));
        let mut new = jobset_object(json!({"syncedEpoch": -1, "restarts": 2}));
        let rt = &default_resources()[1];
        admit_as_422(rt, &mut new, Some(&old)).expect("ratcheted");
        let mut moved = jobset_object(json!({"syncedEpoch": -2}));
        assert!(admit_as_422(rt, &mut moved, Some(&old)).is_err());
    }

    #[test]
    fn compiled_once_and_cheap_per_write() {
        assert!(Arc::ptr_eq(&jobset(), &jobset()));
        let text = include_str!("../../../fixtures/jobset-v0.12/jobset-sidecar-agent.yaml");
        let mut js: Value = serde_saphyr::from_str(text).expect("yaml");
        js["status"] = json!({"restarts": 1, "syncedEpoch": 2, "deprecatedEpoch": 1});
        let rt = &default_resources()[1];
        let start = std::time::Instant::now();
        let writes = 200u32;
        for _ in 0..writes {
            let mut copy = js.clone();
            admit_as_422(rt, &mut copy, Some(&js)).expect("valid");
            assert_eq!(copy, js, "nothing pruned from a valid JobSet");
        }
        let each = start.elapsed() / writes;
        eprintln!("prune + validate of a 2-job JobSet: {each:?} per write");
        // Generous (a debug build on a busy machine): a blow-up is orders of magnitude above it.
        assert!(
            each < std::time::Duration::from_millis(20),
            "{each:?} per write"
        );
    }

    #[test]
    fn jobset_epochs_are_checked_too() {
        let mut epochs = json!({"apiVersion": "jobset-inplace.dev/v1alpha1", "kind": "JobSetEpoch",
            "metadata": {"name": "e"}, "epochs": {"synced": -1, "deprecated": 0, "extra": 1}});
        let causes: Vec<String> = {
            jobset_epoch().prune(&mut epochs);
            jobset_epoch()
                .causes(&epochs, None)
                .into_iter()
                .map(|c| c.field)
                .collect()
        };
        assert_eq!(causes, ["epochs.synced"]);
        assert!(epochs["epochs"].get("extra").is_none());
    }
}
