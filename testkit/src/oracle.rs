//! The value path of admission, as a test oracle: read the body as a `Value` and decide on it
//! with `admission::review::value_path` (the test API's second reader: views of `Value`s, the
//! UPDATE ratchet over values, the patch written by `serde_json`). `admission::review`, the one
//! entry, decodes bodies into sparse views instead and must answer exactly these bytes. Shared by the integration tests
//! and the fuzz targets (`fuzz/src/lib.rs`).

use jobset_inplace::admission::review::value_path::{self, ValueRequest};
use jobset_inplace::admission::{Endpoint, InjectionConfig};
use serde_json::{Value, json};

/// The reply of reading `body` as a `Value` and deciding on it with the value path,
/// framed as `review` frames it; `None` when the body has no usable AdmissionReview framing.
pub fn review_through_value(
    endpoint: Endpoint,
    body: &[u8],
    config: &InjectionConfig,
) -> Option<Vec<u8>> {
    let review: Value = serde_json::from_slice(body).ok()?;
    let request = review.get("request")?;
    let uid = request.get("uid")?.as_str().filter(|u| !u.is_empty())?;
    if review.get("apiVersion") != Some(&json!("admission.k8s.io/v1"))
        || review.get("kind") != Some(&json!("AdmissionReview"))
    {
        return None;
    }
    fn text(v: Option<&Value>) -> &str {
        v.and_then(Value::as_str).unwrap_or("")
    }
    let object = |key: &str| request.get(key).filter(|v| !v.is_null());
    let decision = value_path::decide(
        endpoint,
        &ValueRequest {
            operation: text(request.get("operation")),
            group: text(request.pointer("/kind/group")),
            kind: text(request.pointer("/kind/kind")),
            object: object("object"),
            old_object: object("oldObject"),
        },
        config,
    );
    Some(value_path::encode(uid, &decision))
}
