//! AdmissionReview (`admission.k8s.io/v1`) handling: decoding a request body, deciding, and
//! encoding the response exactly as the API server expects it (the JSON Patch base64-encoded as a
//! string). The one entry: the HTTPS server and the offline commands (`inject`, `check`, `review`)
//! all send a body through [`review`], which makes one [`Decision`] and encodes it into the
//! [`Reply`] that carries both, so they cannot answer differently.

use base64::Engine;
use serde_json::{Value, json};

use super::config::InjectionConfig;
use super::lenient::Str;
use super::view::{self, JobSetView};
use super::{Endpoint, ReviewOutcome, Rule, Violation, mutate, patch, raw, status_body, validate};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// The decision on one request: what [`review`] decides, before it is encoded into the
/// response. The one decision type: the server's metrics and the offline commands read it from
/// the [`Reply`] that carries it beside the encoded body.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    /// The JSON Patch operations (mutation only; empty when nothing changes), their values
    /// already JSON text, written into the response as they are ([`Decision::patch`]: as a
    /// [`json_patch::Patch`]).
    pub(crate) ops: Vec<patch::Op>,
    pub warnings: Vec<String>,
    /// Why the request is denied: a Kubernetes `Status` (without the list framing). `None` for an
    /// HTTP error (the body is the `Status`).
    pub status: Option<Value>,
    pub outcome: ReviewOutcome,
    /// The violations a denial lists (its `Status` causes), each with its rule.
    pub violations: Vec<Violation>,
    /// The rules a denial breaks, each once (also those of violations past the listed ones):
    /// what the denial metric counts (empty for a denial of a malformed request and for every
    /// other outcome).
    pub rules: Vec<Rule>,
}

impl Decision {
    fn allow() -> Self {
        Decision {
            allowed: true,
            ops: Vec::new(),
            warnings: Vec::new(),
            status: None,
            outcome: ReviewOutcome::Allowed,
            violations: Vec::new(),
            rules: Vec::new(),
        }
    }

    /// The decision behind an HTTP error reply (its body the `Status` that says why).
    pub fn error() -> Self {
        Decision {
            allowed: false,
            outcome: ReviewOutcome::Error,
            ..Decision::allow()
        }
    }

    fn malformed(reason: &str) -> Self {
        Decision {
            status: Some(json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("malformed AdmissionReview: {reason}"),
                "reason": "BadRequest",
                "code": 400
            })),
            ..Decision::error()
        }
    }

    fn denied(status: Value, violations: Vec<Violation>, rules: Vec<Rule>) -> Self {
        Decision {
            allowed: false,
            status: Some(status),
            outcome: ReviewOutcome::Denied,
            violations,
            rules,
            ..Decision::allow()
        }
    }

    /// The patch, as a JSON Patch document (what the response carries, base64-encoded).
    pub fn patch(&self) -> json_patch::Patch {
        json_patch::Patch(self.ops.iter().map(patch::Op::to_patch_operation).collect())
    }

    /// The message of a denial.
    pub fn message(&self) -> Option<&str> {
        self.status.as_ref()?.get("message")?.as_str()
    }
}

/// The answer to one AdmissionReview body: the HTTP status and the response body, encoded from
/// the [`Decision`] it carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub http_status: u16,
    pub body: Vec<u8>,
    pub decision: Decision,
}

impl Reply {
    /// An HTTP error reply: a Kubernetes `Status` as the body ([`status_body`]).
    pub fn error(code: u16, reason: &str, message: &str) -> Self {
        Reply {
            http_status: code,
            body: status_body(code, reason, message),
            decision: Decision::error(),
        }
    }
}

/// What one admission request asks, as the decision reads it: the view of the request.
#[derive(Clone, Copy)]
struct RequestView<'r, 'a> {
    operation: &'r str,
    /// `request.kind.group` / `request.kind.kind`.
    group: &'r str,
    kind: &'r str,
    /// `request.object` and `request.oldObject`, when they are objects.
    object: Option<&'r JobSetView<'a>>,
    old_object: Option<&'r JobSetView<'a>>,
    /// The object's size in bytes as written (an upper bound).
    size: usize,
    /// `spec.replicatedJobs` of both objects, read when an UPDATE asks for them.
    jobs: &'r Jobs<'a>,
}

/// Decides one request for one endpoint. Pure.
fn decide_view(
    endpoint: Endpoint,
    request: &RequestView<'_, '_>,
    config: &InjectionConfig,
) -> Decision {
    let RequestView {
        operation,
        group,
        kind,
        object,
        old_object,
        size,
        jobs,
    } = *request;
    let is_jobset = group == crate::jobset::GROUP && kind == crate::jobset::KIND;
    match operation {
        "CREATE" | "UPDATE" => {}
        "DELETE" | "CONNECT" => return Decision::allow(),
        "" => return Decision::malformed("request.operation is missing"),
        other => return Decision::malformed(&format!("unknown request.operation {other:?}")),
    }
    if kind.is_empty() {
        return Decision::malformed("request.kind is missing");
    }
    if !is_jobset {
        return Decision::allow();
    }
    let Some(object) = object else {
        return Decision::malformed(&format!(
            "request.object is missing for {operation} of a JobSet"
        ));
    };
    match endpoint {
        Endpoint::Mutate => {
            let pair = |i| jobs.get().pair(i);
            let scope = match (operation, old_object) {
                ("CREATE", _) => mutate::Scope::Create,
                ("UPDATE", Some(old)) => mutate::Scope::Update(old, &pair),
                // An UPDATE without the stored object: nothing says what was injected.
                _ => return Decision::allow(),
            };
            let (ops, warnings) = match mutate::mutate_view(object, config, size, scope) {
                Ok(injection) => injection,
                Err(mutate::Refusal::Invalid(violations, more, rules)) => {
                    let status = invalid_status(object.name(), &violations, more);
                    return Decision::denied(status, violations, rules);
                }
                Err(mutate::Refusal::TooLarge(message)) => {
                    let status = json!({
                        "metadata": {},
                        "status": "Failure",
                        "message": message,
                        "reason": "RequestEntityTooLarge",
                        "code": 413
                    });
                    return Decision::denied(status, Vec::new(), vec![Rule::TooLarge]);
                }
            };
            let mut d = Decision::allow();
            d.warnings = warnings;
            if !ops.is_empty() {
                d.ops = ops;
                d.outcome = ReviewOutcome::Patched;
            }
            d
        }
        Endpoint::Validate => {
            let v = match old_object {
                Some(old) if operation == "UPDATE" => {
                    validate::validate_update_view(object, old, config, |i| jobs.get().unchanged(i))
                }
                _ => validate::validate_view(object, config),
            };
            let mut warnings = v.warnings;
            if v.more_warnings > 0 {
                warnings.push(format!("and {} more warnings like these", v.more_warnings));
            }
            let mut d = if !v.violations.is_empty() || v.more_violations > 0 {
                let status = invalid_status(object.name(), &v.violations, v.more_violations);
                Decision::denied(status, v.violations, v.rules)
            } else {
                Decision::allow()
            };
            d.warnings = warnings;
            d
        }
    }
}

/// A `422 Invalid` Status listing every violation, in the API server's own wording.
fn invalid_status(name: &str, violations: &[Violation], more: usize) -> Value {
    let mut list = violations
        .iter()
        .map(|v| format!("{}: {}", v.path, v.message))
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        list.push_str(&format!(", and {more} more violations"));
    }
    // A name is at most 253 characters once the API server has checked it; not yet, here.
    let name = validate::clip(name.to_owned());
    let name = name.as_str();
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
///
/// The body is decoded once into the [sparse views](super::view) the rules read, never into a `Value`;
/// it answers exactly as reading a `Value` of the whole body did, for every body.
pub fn review(endpoint: Endpoint, body: &[u8], config: &InjectionConfig) -> Reply {
    let bad_request = |message: &str| Reply::error(400, "BadRequest", message);
    if body.is_empty() {
        return bad_request("cannot read AdmissionReview: the request body is empty");
    }
    let review = match view::parse_review(body) {
        Ok(review) => review.unwrap_or_default(),
        Err(e) => return bad_request(&format!("cannot read AdmissionReview: invalid JSON: {e}")),
    };
    let Some((request, uid)) = review.request.as_ref().and_then(|r| {
        let uid = r.uid.as_deref().filter(|u| !u.is_empty())?;
        Some((r, uid))
    }) else {
        return bad_request("cannot read AdmissionReview: request.uid is missing");
    };
    let api_version = review.api_version.as_deref().unwrap_or("");
    let kind = review.kind.as_deref().unwrap_or("");
    let decision = if api_version != API_VERSION || kind != KIND {
        Decision::malformed(&format!(
            "expected apiVersion {API_VERSION} kind {KIND}, got apiVersion {api_version:?} kind {kind:?}"
        ))
    } else {
        fn text<'s>(s: Option<&'s Str<'_>>) -> &'s str {
            s.map_or("", |s| s.as_ref())
        }
        let group_kind = request.kind.as_ref();
        let operation = text(request.operation.as_ref());
        let request = RequestView {
            operation,
            group: text(group_kind.and_then(|k| k.group.as_ref())),
            kind: text(group_kind.and_then(|k| k.kind.as_ref())),
            object: request.object.as_ref(),
            old_object: request.old_object.as_ref(),
            // An UPDATE's body holds the stored object too: the new one is what gets injected.
            size: if endpoint == Endpoint::Mutate && operation == "UPDATE" {
                raw::object_len(body).unwrap_or(body.len())
            } else {
                body.len()
            },
            jobs: &Jobs::in_body(body),
        };
        decide_view(endpoint, &request, config)
    };
    let patch = (!decision.ops.is_empty()).then(|| {
        let mut patch = Vec::with_capacity(
            decision
                .ops
                .iter()
                .map(|o| o.path.len() + o.value.len() + 40)
                .sum(),
        );
        patch::write_patch(&decision.ops, &mut patch);
        patch
    });
    Reply {
        http_status: 200,
        body: encode_parts(
            uid,
            decision.allowed,
            decision.status.as_ref(),
            patch.as_deref(),
            &decision.warnings,
        )
        .unwrap_or_default(),
        decision,
    }
}

/// The AdmissionReview request body of a CREATE of the JobSet `object` (its JSON text, put in as
/// it is): what the offline commands send down [`review`], the server's own path.
pub fn create_body(object: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(object.len() + 200);
    // The constants are plain strings: writing them cannot fail.
    body.extend_from_slice(b"{\"apiVersion\":");
    let _ = serde_json::to_writer(&mut body, API_VERSION);
    body.extend_from_slice(b",\"kind\":");
    let _ = serde_json::to_writer(&mut body, KIND);
    body.extend_from_slice(b",\"request\":{\"uid\":\"offline\",\"kind\":{\"group\":");
    let _ = serde_json::to_writer(&mut body, crate::jobset::GROUP);
    body.extend_from_slice(b",\"version\":");
    let _ = serde_json::to_writer(&mut body, crate::jobset::VERSION);
    body.extend_from_slice(b",\"kind\":");
    let _ = serde_json::to_writer(&mut body, crate::jobset::KIND);
    body.extend_from_slice(b"},\"operation\":\"CREATE\",\"object\":");
    body.extend_from_slice(object);
    body.extend_from_slice(b"}}");
    body
}

/// `spec.replicatedJobs` of both objects of a request, read from the body the first time an
/// UPDATE asks for them.
struct Jobs<'a> {
    body: &'a [u8],
    read: std::cell::OnceCell<BodyJobs<'a>>,
}

impl<'a> Jobs<'a> {
    fn in_body(body: &'a [u8]) -> Self {
        Jobs {
            body,
            read: std::cell::OnceCell::new(),
        }
    }

    fn get(&self) -> &BodyJobs<'a> {
        self.read.get_or_init(|| BodyJobs::read(self.body))
    }
}

/// `spec.replicatedJobs` of `request.object` and of `request.oldObject` in a body, for the UPDATE
/// ratchet: as written (two jobs written alike are equal; two written differently are compared as
/// JSON values), or as values of a second, complete reading of the body where the JSON text is not
/// at hand (serde_json's raw-value objects).
enum BodyJobs<'a> {
    Raw(raw::RawJobs<'a>),
    Values(Vec<Value>, Vec<Value>),
}

impl<'a> BodyJobs<'a> {
    fn read(body: &'a [u8]) -> Self {
        if let Some(raw) = raw::raw_jobs(body) {
            return BodyJobs::Raw(raw);
        }
        let review: Value = serde_json::from_slice(body).unwrap_or_default();
        let request = review.get("request").unwrap_or(&Value::Null);
        let jobs = |key: &str| {
            request
                .get(key)
                .filter(|o| o.is_object())
                .map_or(&[][..], validate::replicated_jobs)
                .to_vec()
        };
        BodyJobs::Values(jobs("object"), jobs("oldObject"))
    }

    /// `spec.replicatedJobs[i]` of the object and of the old object, as values.
    fn pair(&self, i: usize) -> Option<(Value, Value)> {
        match self {
            BodyJobs::Raw(raw) => {
                let value = |raw: &serde_json::value::RawValue| {
                    serde_json::from_str::<Value>(raw.get()).ok()
                };
                Some((value(raw.object.get(i)?)?, value(raw.old_object.get(i)?)?))
            }
            BodyJobs::Values(new, old) => Some((new.get(i)?.clone(), old.get(i)?.clone())),
        }
    }

    fn unchanged(&self, i: usize) -> bool {
        match self {
            BodyJobs::Raw(raw) => match (raw.object.get(i), raw.old_object.get(i)) {
                (Some(new), Some(old)) if new.get() == old.get() => true,
                (Some(new), Some(old)) => {
                    let value = |raw: &serde_json::value::RawValue| {
                        serde_json::from_str::<Value>(raw.get()).ok()
                    };
                    // Both parsed already as part of the body: they parse again.
                    matches!((value(new), value(old)), (Some(n), Some(o)) if n == o)
                }
                _ => false,
            },
            BodyJobs::Values(new, old) => new.get(i).is_some() && new.get(i) == old.get(i),
        }
    }
}

/// The tests' second reader (the oracle of `testkit/src/oracle.rs` and the fuzz targets): a
/// request read as a `serde_json::Value` instead of the body's bytes. Not an entry of the
/// product: [`review`] is the one, for the server and the offline commands alike.
#[cfg(any(test, feature = "test-api"))]
pub mod value_path {
    use serde_json::Value;

    use super::{BodyJobs, Decision, InjectionConfig, JobSetView, Jobs, RequestView};
    use crate::admission::{Endpoint, validate};

    /// An admission request as `Value`s.
    #[derive(Clone, Copy, Debug)]
    pub struct ValueRequest<'a> {
        pub operation: &'a str,
        /// `request.kind.group` / `request.kind.kind`.
        pub group: &'a str,
        pub kind: &'a str,
        pub object: Option<&'a Value>,
        pub old_object: Option<&'a Value>,
    }

    /// The decision [`super::review`] makes, read from `Value`s (the object's size its
    /// serialization's).
    pub fn decide(
        endpoint: Endpoint,
        request: &ValueRequest<'_>,
        config: &InjectionConfig,
    ) -> Decision {
        let object = request.object.filter(|o| o.is_object());
        let old_object = request.old_object.filter(|o| o.is_object());
        let view = object.map(JobSetView::from_value);
        let old_view = old_object.map(JobSetView::from_value);
        let jobs = |o: Option<&Value>| o.map_or(&[][..], validate::replicated_jobs).to_vec();
        let read = std::cell::OnceCell::new();
        let _ = read.set(BodyJobs::Values(jobs(object), jobs(old_object)));
        super::decide_view(
            endpoint,
            &RequestView {
                operation: request.operation,
                group: request.group,
                kind: request.kind,
                object: view.as_ref(),
                old_object: old_view.as_ref(),
                size: object.map_or(0, |o| serde_json::to_vec(o).map_or(0, |v| v.len())),
                jobs: &Jobs { body: &[], read },
            },
            config,
        )
    }

    /// The AdmissionReview response for a decision, the patch written by `serde_json` from
    /// [`Decision::patch`] (the bytes [`super::review`] writes with its own patch writer).
    pub fn encode(uid: &str, decision: &Decision) -> Vec<u8> {
        let patch = (!decision.ops.is_empty())
            .then(|| serde_json::to_vec(&decision.patch()).unwrap_or_default());
        super::encode_parts(
            uid,
            decision.allowed,
            decision.status.as_ref(),
            patch.as_deref(),
            &decision.warnings,
        )
        .unwrap_or_default()
    }
}

/// The response, `patch` the JSON Patch document (when there is one).
fn encode_parts(
    uid: &str,
    allowed: bool,
    status: Option<&Value>,
    patch: Option<&[u8]>,
    warnings: &[String],
) -> serde_json::Result<Vec<u8>> {
    let engine = &base64::engine::general_purpose::STANDARD;
    let patch_len = patch.map_or(0, |p| p.len().div_ceil(3) * 4);
    let warnings_len: usize = warnings.iter().map(|w| w.len() + 3).sum();
    let status_len = if status.is_some() { 512 } else { 0 };
    let mut out = Vec::with_capacity(160 + uid.len() + patch_len + warnings_len + status_len);
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut out, API_VERSION)?;
    out.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut out, KIND)?;
    out.extend_from_slice(b",\"response\":{\"uid\":");
    serde_json::to_writer(&mut out, uid)?;
    out.extend_from_slice(if allowed {
        b",\"allowed\":true"
    } else {
        b",\"allowed\":false"
    });
    if let Some(status) = status {
        out.extend_from_slice(b",\"status\":");
        serde_json::to_writer(&mut out, status)?;
    }
    if let Some(patch) = patch {
        // Base64 needs no JSON escaping.
        out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
        let start = out.len();
        out.resize(start + patch_len, 0);
        let written = engine.encode_slice(patch, &mut out[start..]).unwrap_or(0);
        out.truncate(start + written);
        out.push(b'"');
    }
    if !warnings.is_empty() {
        out.extend_from_slice(b",\"warnings\":");
        serde_json::to_writer(&mut out, warnings)?;
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}
