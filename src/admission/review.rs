//! AdmissionReview (`admission.k8s.io/v1`) handling: decoding a request body, deciding, and
//! encoding the response exactly as the API server expects it (the JSON Patch base64-encoded as a
//! string). The HTTPS server and the offline commands both go through [`review`] /
//! [`decide`], so they answer the same bytes.

use base64::Engine;
use serde_json::{Value, json};

use super::config::InjectionConfig;
use super::{Endpoint, Outcome, Reply, Violation, mutate, status_body, validate};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// What an admission request asks, as far as the decision needs it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub operation: &'a str,
    /// `request.kind.group` / `request.kind.kind`.
    pub group: &'a str,
    pub kind: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
}

/// The decision on one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    /// JSON Patch operations (mutation only; empty when nothing changes).
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
    /// Why the request is denied: a Kubernetes `Status` (without the list framing).
    pub status: Option<Value>,
    pub outcome: Outcome,
}

impl Decision {
    fn allow() -> Self {
        Decision {
            allowed: true,
            patch: json_patch::Patch(Vec::new()),
            warnings: Vec::new(),
            status: None,
            outcome: Outcome::Allowed,
        }
    }

    fn malformed(reason: &str) -> Self {
        Decision {
            allowed: false,
            patch: json_patch::Patch(Vec::new()),
            warnings: Vec::new(),
            status: Some(json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("malformed AdmissionReview: {reason}"),
                "reason": "BadRequest",
                "code": 400
            })),
            outcome: Outcome::Error,
        }
    }

    /// The violations of a denial, read back from its `Status` causes.
    pub fn violations(&self) -> Vec<Violation> {
        self.status
            .as_ref()
            .and_then(|s| s.pointer("/details/causes"))
            .and_then(Value::as_array)
            .map(|causes| {
                causes
                    .iter()
                    .map(|c| Violation {
                        path: c
                            .get("field")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        message: c
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The message of a denial.
    pub fn message(&self) -> Option<&str> {
        self.status.as_ref()?.get("message")?.as_str()
    }
}

/// Decides one request for one endpoint. Pure.
pub fn decide(endpoint: Endpoint, request: &Request<'_>, config: &InjectionConfig) -> Decision {
    let is_jobset = request.group == crate::jobset::GROUP && request.kind == crate::jobset::KIND;
    match request.operation {
        "CREATE" | "UPDATE" => {}
        "DELETE" | "CONNECT" => return Decision::allow(),
        "" => return Decision::malformed("request.operation is missing"),
        other => return Decision::malformed(&format!("unknown request.operation {other:?}")),
    }
    if request.kind.is_empty() {
        return Decision::malformed("request.kind is missing");
    }
    if !is_jobset {
        return Decision::allow();
    }
    let Some(object) = request.object.filter(|o| o.is_object()) else {
        return Decision::malformed(&format!(
            "request.object is missing for {} of a JobSet",
            request.operation
        ));
    };
    match endpoint {
        Endpoint::Mutate => {
            if request.operation != "CREATE" {
                return Decision::allow();
            }
            let m = mutate::mutate(object, config);
            let mut d = Decision::allow();
            d.warnings = m.warnings;
            if !m.patch.0.is_empty() {
                d.patch = m.patch;
                d.outcome = Outcome::Patched;
            }
            d
        }
        Endpoint::Validate => {
            let v = match request.old_object.filter(|o| o.is_object()) {
                Some(old) if request.operation == "UPDATE" => {
                    validate::validate_update(object, old, config)
                }
                _ => validate::validate(object, config),
            };
            let mut d = Decision::allow();
            d.warnings = v.warnings;
            if !v.violations.is_empty() {
                d.allowed = false;
                d.outcome = Outcome::Denied;
                d.status = Some(invalid_status(object, &v.violations));
            }
            d
        }
    }
}

/// A `422 Invalid` Status listing every violation, in the API server's own wording.
fn invalid_status(object: &Value, violations: &[Violation]) -> Value {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .or_else(|| {
            object
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
        })
        .unwrap_or("");
    let list = violations
        .iter()
        .map(|v| format!("{}: {}", v.path, v.message))
        .collect::<Vec<_>>()
        .join(", ");
    let causes: Vec<Value> = violations
        .iter()
        .map(|v| json!({"reason": "FieldValueInvalid", "message": v.message, "field": v.path}))
        .collect();
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "JobSet.{} {name:?} is invalid for InPlaceRestart: [{list}]",
            crate::jobset::GROUP
        ),
        "reason": "Invalid",
        "details": {
            "name": name,
            "group": crate::jobset::GROUP,
            "kind": crate::jobset::KIND,
            "causes": causes
        },
        "code": 422
    })
}

/// Answers one AdmissionReview request body. The HTTP layer has already checked the content type
/// and the size. Never panics: a body that is not JSON, or has no `request.uid`, gets HTTP 400
/// with a `Status`; any other malformation gets HTTP 200 and a response that denies with the
/// reason.
pub fn review(endpoint: Endpoint, body: &[u8], config: &InjectionConfig) -> Reply {
    let bad_request = |message: String| Reply {
        http_status: 400,
        body: status_body(400, "BadRequest", &message),
        outcome: Outcome::Error,
    };
    if body.is_empty() {
        return bad_request("cannot read AdmissionReview: the request body is empty".to_owned());
    }
    let review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("cannot read AdmissionReview: invalid JSON: {e}")),
    };
    let request = review.get("request");
    let Some(uid) = request
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
    else {
        return bad_request("cannot read AdmissionReview: request.uid is missing".to_owned());
    };
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = review.get("kind").and_then(Value::as_str).unwrap_or("");
    let decision = if api_version != API_VERSION || kind != KIND {
        Decision::malformed(&format!(
            "expected apiVersion {API_VERSION} kind {KIND}, got apiVersion {api_version:?} kind {kind:?}"
        ))
    } else {
        fn text(v: Option<&Value>) -> &str {
            v.and_then(Value::as_str).unwrap_or("")
        }
        let request = request.unwrap_or(&Value::Null);
        let object = |key: &str| request.get(key).filter(|v| !v.is_null());
        decide(
            endpoint,
            &Request {
                operation: text(request.get("operation")),
                group: text(request.pointer("/kind/group")),
                kind: text(request.pointer("/kind/kind")),
                object: object("object"),
                old_object: object("oldObject"),
            },
            config,
        )
    };
    Reply {
        http_status: 200,
        body: encode(uid, &decision),
        outcome: decision.outcome,
    }
}

/// The AdmissionReview response for a decision.
pub fn encode(uid: &str, decision: &Decision) -> Vec<u8> {
    let mut response = serde_json::Map::new();
    response.insert("uid".into(), json!(uid));
    response.insert("allowed".into(), json!(decision.allowed));
    if let Some(status) = &decision.status {
        response.insert("status".into(), status.clone());
    }
    if !decision.patch.0.is_empty() {
        let patch = serde_json::to_vec(&decision.patch).unwrap_or_default();
        response.insert("patchType".into(), json!("JSONPatch"));
        response.insert(
            "patch".into(),
            json!(base64::engine::general_purpose::STANDARD.encode(patch)),
        );
    }
    if !decision.warnings.is_empty() {
        response.insert("warnings".into(), json!(decision.warnings));
    }
    let review = json!({"apiVersion": API_VERSION, "kind": KIND, "response": response});
    serde_json::to_vec(&review).unwrap_or_default()
}
