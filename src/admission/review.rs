//! AdmissionReview (`admission.k8s.io/v1`) handling: decoding a request body, deciding, and
//! encoding the response exactly as the API server expects it (the JSON Patch base64-encoded as a
//! string). The HTTPS server and the offline commands both go through [`review`] /
//! [`decide`], so they answer the same bytes.

use base64::Engine;
use serde_json::{Value, json};

use super::config::InjectionConfig;
use super::lenient::Str;
use super::view::{self, JobSetView};
use super::{
    Endpoint, Reply, ReviewOutcome, Rule, Violation, mutate, patch, raw, status_body, validate,
};

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
pub struct Verdict {
    pub allowed: bool,
    /// JSON Patch operations (mutation only; empty when nothing changes).
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
    /// Why the request is denied: a Kubernetes `Status` (without the list framing).
    pub status: Option<Value>,
    pub outcome: ReviewOutcome,
    /// The violations a denial lists (its `Status` causes), each with its rule.
    pub violations: Vec<Violation>,
    /// The rules a denial breaks, each once (also those of violations past the listed ones).
    pub rules: Vec<Rule>,
}

/// A decision as [`decide_view`] makes it: the patch as operations with their JSON text, written
/// into the response as they are.
struct Answer {
    allowed: bool,
    ops: Vec<patch::Op>,
    warnings: Vec<String>,
    status: Option<Value>,
    outcome: ReviewOutcome,
    violations: Vec<Violation>,
    rules: Vec<Rule>,
}

impl Answer {
    fn allow() -> Self {
        Answer {
            allowed: true,
            ops: Vec::new(),
            warnings: Vec::new(),
            status: None,
            outcome: ReviewOutcome::Allowed,
            violations: Vec::new(),
            rules: Vec::new(),
        }
    }

    fn malformed(reason: &str) -> Self {
        Answer {
            allowed: false,
            ops: Vec::new(),
            warnings: Vec::new(),
            status: Some(json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("malformed AdmissionReview: {reason}"),
                "reason": "BadRequest",
                "code": 400
            })),
            outcome: ReviewOutcome::Error,
            violations: Vec::new(),
            rules: Vec::new(),
        }
    }
}

impl From<Answer> for Verdict {
    fn from(a: Answer) -> Self {
        Verdict {
            allowed: a.allowed,
            patch: json_patch::Patch(a.ops.iter().map(patch::Op::to_patch_operation).collect()),
            warnings: a.warnings,
            status: a.status,
            outcome: a.outcome,
            violations: a.violations,
            rules: a.rules,
        }
    }
}

impl Verdict {
    /// The message of a denial.
    pub fn message(&self) -> Option<&str> {
        self.status.as_ref()?.get("message")?.as_str()
    }
}

/// Decides one request for one endpoint. Pure.
pub fn decide(endpoint: Endpoint, request: &Request<'_>, config: &InjectionConfig) -> Verdict {
    let object = request.object.filter(|o| o.is_object());
    let old_object = request.old_object.filter(|o| o.is_object());
    let view = object.map(JobSetView::from_value);
    let old_view = old_object.map(JobSetView::from_value);
    let new_jobs = object.map_or(&[][..], validate::replicated_jobs);
    let old_jobs = old_object.map_or(&[][..], validate::replicated_jobs);
    let size = object.map_or(0, |o| serde_json::to_vec(o).map_or(0, |v| v.len()));
    decide_view(
        endpoint,
        request.operation,
        request.group,
        request.kind,
        view.as_ref(),
        old_view.as_ref(),
        |i| new_jobs.get(i).is_some() && new_jobs.get(i) == old_jobs.get(i),
        &|i| Some((new_jobs.get(i)?.clone(), old_jobs.get(i)?.clone())),
        config,
        size,
    )
    .into()
}

/// [`decide`] over the views of the object and the old object (present when they are objects);
/// `unchanged(i)`: `spec.replicatedJobs[i]` is in both and equal (asked by the UPDATE ratchet
/// only); `jobs(i)`: `spec.replicatedJobs[i]` of both, as values (asked by the mutation of an
/// UPDATE of an injected JobSet only); `size`: the object's size in bytes as written (an upper
/// bound).
#[allow(clippy::too_many_arguments)]
fn decide_view(
    endpoint: Endpoint,
    operation: &str,
    group: &str,
    kind: &str,
    object: Option<&JobSetView<'_>>,
    old_object: Option<&JobSetView<'_>>,
    unchanged: impl FnMut(usize) -> bool,
    jobs: &mutate::JobPair<'_>,
    config: &InjectionConfig,
    size: usize,
) -> Answer {
    let is_jobset = group == crate::jobset::GROUP && kind == crate::jobset::KIND;
    match operation {
        "CREATE" | "UPDATE" => {}
        "DELETE" | "CONNECT" => return Answer::allow(),
        "" => return Answer::malformed("request.operation is missing"),
        other => return Answer::malformed(&format!("unknown request.operation {other:?}")),
    }
    if kind.is_empty() {
        return Answer::malformed("request.kind is missing");
    }
    if !is_jobset {
        return Answer::allow();
    }
    let Some(object) = object else {
        return Answer::malformed(&format!(
            "request.object is missing for {operation} of a JobSet"
        ));
    };
    match endpoint {
        Endpoint::Mutate => {
            let scope = match (operation, old_object) {
                ("CREATE", _) => mutate::Scope::Create,
                ("UPDATE", Some(old)) => mutate::Scope::Update(old, jobs),
                // An UPDATE without the stored object: nothing says what was injected.
                _ => return Answer::allow(),
            };
            let (ops, warnings) = match mutate::mutate_view(object, config, size, scope) {
                Ok(injection) => injection,
                Err(mutate::Refusal::Invalid(violations, more, rules)) => {
                    return Answer {
                        allowed: false,
                        ops: Vec::new(),
                        warnings: Vec::new(),
                        status: Some(invalid_status(object.name(), &violations, more)),
                        outcome: ReviewOutcome::Denied,
                        violations,
                        rules,
                    };
                }
                Err(mutate::Refusal::TooLarge(message)) => {
                    return Answer {
                        allowed: false,
                        ops: Vec::new(),
                        warnings: Vec::new(),
                        status: Some(json!({
                            "metadata": {},
                            "status": "Failure",
                            "message": message,
                            "reason": "RequestEntityTooLarge",
                            "code": 413
                        })),
                        outcome: ReviewOutcome::Denied,
                        violations: Vec::new(),
                        rules: vec![Rule::TooLarge],
                    };
                }
            };
            let mut d = Answer::allow();
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
                    validate::validate_update_view(object, old, config, unchanged)
                }
                _ => validate::validate_view(object, config),
            };
            let mut d = Answer::allow();
            d.warnings = v.warnings;
            if v.more_warnings > 0 {
                d.warnings
                    .push(format!("and {} more warnings like these", v.more_warnings));
            }
            if !v.violations.is_empty() || v.more_violations > 0 {
                d.allowed = false;
                d.outcome = ReviewOutcome::Denied;
                d.status = Some(invalid_status(
                    object.name(),
                    &v.violations,
                    v.more_violations,
                ));
                d.violations = v.violations;
                d.rules = v.rules;
            }
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
    let bad_request = |message: String| Reply {
        http_status: 400,
        body: status_body(400, "BadRequest", &message),
        outcome: ReviewOutcome::Error,
        rules: Vec::new(),
    };
    if body.is_empty() {
        return bad_request("cannot read AdmissionReview: the request body is empty".to_owned());
    }
    let review = match view::parse_review(body) {
        Ok(review) => review.unwrap_or_default(),
        Err(e) => return bad_request(format!("cannot read AdmissionReview: invalid JSON: {e}")),
    };
    let Some((request, uid)) = review.request.as_ref().and_then(|r| {
        let uid = r.uid.as_deref().filter(|u| !u.is_empty())?;
        Some((r, uid))
    }) else {
        return bad_request("cannot read AdmissionReview: request.uid is missing".to_owned());
    };
    let api_version = review.api_version.as_deref().unwrap_or("");
    let kind = review.kind.as_deref().unwrap_or("");
    let answer = if api_version != API_VERSION || kind != KIND {
        Answer::malformed(&format!(
            "expected apiVersion {API_VERSION} kind {KIND}, got apiVersion {api_version:?} kind {kind:?}"
        ))
    } else {
        fn text<'s>(s: Option<&'s Str<'_>>) -> &'s str {
            s.map_or("", |s| s.as_ref())
        }
        let group_kind = request.kind.as_ref();
        let jobs = std::cell::OnceCell::new();
        let body_jobs = || jobs.get_or_init(|| BodyJobs::read(body));
        decide_view(
            endpoint,
            text(request.operation.as_ref()),
            text(group_kind.and_then(|k| k.group.as_ref())),
            text(group_kind.and_then(|k| k.kind.as_ref())),
            request.object.as_ref(),
            request.old_object.as_ref(),
            |i| body_jobs().unchanged(i),
            &|i| body_jobs().pair(i),
            config,
            // An UPDATE's body holds the stored object too: the new one is what gets injected.
            if endpoint == Endpoint::Mutate && text(request.operation.as_ref()) == "UPDATE" {
                raw::object_len(body).unwrap_or(body.len())
            } else {
                body.len()
            },
        )
    };
    let patch = (!answer.ops.is_empty()).then(|| {
        let mut patch = Vec::with_capacity(
            answer
                .ops
                .iter()
                .map(|o| o.path.len() + o.value.len() + 40)
                .sum(),
        );
        patch::write_patch(&answer.ops, &mut patch);
        patch
    });
    Reply {
        http_status: 200,
        body: encode_parts(
            uid,
            answer.allowed,
            answer.status.as_ref(),
            patch.as_deref(),
            &answer.warnings,
        )
        .unwrap_or_default(),
        outcome: answer.outcome,
        rules: answer.rules,
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

#[cfg(any(test, feature = "test-api"))]
/// The AdmissionReview response for a decision, written directly (the bytes a `Value` of it
/// would serialize to: compact, keys in this order).
pub fn encode(uid: &str, decision: &Verdict) -> Vec<u8> {
    let patch = if decision.patch.0.is_empty() {
        None
    } else {
        Some(serde_json::to_vec(&decision.patch).unwrap_or_default())
    };
    encode_parts(
        uid,
        decision.allowed,
        decision.status.as_ref(),
        patch.as_deref(),
        &decision.warnings,
    )
    .unwrap_or_default()
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
