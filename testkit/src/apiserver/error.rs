//! Kubernetes `Status` errors.

use std::fmt;

use serde_json::{Map, Value, json};

use super::resources::ResourceType;
use super::schema::Cause;

/// A failed request, answered as a Kubernetes `Status` body with HTTP status [`ApiError::code`].
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Expired`, `Invalid`, `BadRequest`, ...
    pub reason: String,
    pub message: String,
    /// `details` of the Status (`name`, `group`, `kind`, `causes`).
    pub details: Option<Box<Value>>,
    /// Sent as the `Retry-After` header (429, 503).
    pub retry_after: Option<u32>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(rt: &ResourceType, name: &str) -> Value {
    let mut d = Map::new();
    d.insert("name".into(), json!(name));
    if !rt.group.is_empty() {
        d.insert("group".into(), json!(rt.group));
    }
    d.insert("kind".into(), json!(rt.plural));
    Value::Object(d)
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// The reason and a generic message upstream uses for a status code.
    pub fn from_code(code: u16) -> Self {
        let (reason, message) = match code {
            400 => (
                "BadRequest",
                "the server rejected our request for an unknown reason",
            ),
            401 => ("Unauthorized", "Unauthorized"),
            403 => ("Forbidden", "forbidden (injected)"),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            405 => ("MethodNotAllowed", "the server does not allow this method"),
            409 => (
                "Conflict",
                "the object has been modified (injected conflict)",
            ),
            410 => ("Expired", "too old resource version (injected)"),
            415 => ("UnsupportedMediaType", "the media type is not supported"),
            422 => (
                "Invalid",
                "the server rejected our request due to an error in our request",
            ),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            ),
            500 => (
                "InternalError",
                "an error on the server (injected) has prevented the request from succeeding",
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted",
            ),
            _ => ("", "injected failure"),
        };
        ApiError::new(code, reason, message)
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(details(rt, name))
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .with_details(details(rt, name))
    }

    /// A stale `resourceVersion` (or a failed precondition).
    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.qualified()
            ),
        )
        .with_details(details(rt, name))
    }

    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 for an object that fails validation.
    pub fn invalid(rt: &ResourceType, name: &str, field: &str, message: &str) -> Self {
        Self::invalid_causes(
            rt,
            name,
            &[Cause {
                reason: "FieldValueInvalid",
                message: message.to_owned(),
                field: field.to_owned(),
            }],
        )
    }

    /// 422 naming every invalid field, shaped as upstream's: `JobSet.jobset.x-k8s.io "x" is
    /// invalid: [a: ..., b: ...]` with one `details.causes[]` per field.
    pub fn invalid_causes(rt: &ResourceType, name: &str, causes: &[Cause]) -> Self {
        let listed: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let listed = match listed.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let kind = if rt.group.is_empty() {
            rt.kind.to_string()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut details = Map::new();
        details.insert("name".into(), json!(name));
        if !rt.group.is_empty() {
            details.insert("group".into(), json!(rt.group));
        }
        details.insert("kind".into(), json!(rt.kind));
        details.insert(
            "causes".into(),
            causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect(),
        );
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {listed}"),
        )
        .with_details(Value::Object(details))
    }

    /// 410 for a resourceVersion older than the server's history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 410 for a continue token older than the server's history.
    pub fn continue_expired() -> Self {
        ApiError::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter.",
        )
    }

    /// Adds a `Retry-After` (and `details.retryAfterSeconds`).
    pub fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = self.details.as_deref().cloned();
        if let Some(secs) = self.retry_after {
            let d = details.get_or_insert_with(|| json!({}));
            if let Some(obj) = d.as_object_mut() {
                obj.insert("retryAfterSeconds".into(), json!(secs));
            }
        }
        if let (Some(d), Some(obj)) = (details, s.as_object_mut()) {
            obj.insert("details".into(), d);
        }
        s
    }

    /// The `Status` object as JSON bytes.
    pub fn status_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.status()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::default_resources;

    #[test]
    fn statuses_look_like_upstream() {
        let pods = &default_resources()[0];
        let s = ApiError::not_found(pods, "p").status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "pods \"p\" not found");
        assert_eq!(s["details"], json!({"name": "p", "kind": "pods"}));
        let js = &default_resources()[1];
        let s = ApiError::stale(js, "x").status();
        assert_eq!(s["details"]["group"], "jobset.x-k8s.io");
        assert!(s["message"].as_str().is_some_and(|m| {
            m.starts_with("Operation cannot be fulfilled on jobsets.jobset.x-k8s.io \"x\"")
        }));
        let mut e = ApiError::from_code(429);
        e.retry_after = Some(2);
        assert_eq!(e.status()["details"]["retryAfterSeconds"], 2);
        let k: kube::core::Status =
            serde_json::from_slice(&e.status_bytes()).expect("kube reads it");
        assert_eq!(k.code, 429);
    }
}
