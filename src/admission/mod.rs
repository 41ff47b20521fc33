//! Admission of InPlaceRestart JobSets (design.md §3): pure validation and mutation over JSON,
//! the injection config, and the AdmissionReview handling shared by the HTTPS server and the
//! offline commands.
//!
//! STUB: the interface below is fixed; the bodies are being built.

pub mod config;

use serde_json::Value;

pub use config::InjectionConfig;

/// Errors of the admission module (config loading; review decoding is answered, not raised).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
}

/// Which webhook endpoint a review is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Mutate,
    Validate,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Mutate => "mutate",
            Endpoint::Validate => "validate",
        }
    }
}

/// How a review ended, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Allowed,
    Denied,
    Patched,
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Patched => "patched",
            Outcome::Error => "error",
        }
    }
}

/// The answer to one AdmissionReview body: HTTP status, response body, outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub http_status: u16,
    pub body: Vec<u8>,
    pub outcome: Outcome,
}

/// One validation failure: the JSON field path and a message a user can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// e.g. `spec.replicatedJobs[0].template.spec.backoffLimit`
    pub path: String,
    pub message: String,
}

/// The result of validating one JobSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validation {
    pub violations: Vec<Violation>,
    pub warnings: Vec<String>,
}

/// The result of mutating one JobSet: targeted JSON Patch operations (empty when nothing changes)
/// and admission warnings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mutation {
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
}

/// Largest AdmissionReview body accepted; larger bodies get HTTP 413 from the server.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// A Kubernetes `Status` object (`kind: Status`, `status: Failure`) as the body of an HTTP error
/// reply (400 when no uid can be read, 413 for a body over [`MAX_BODY_BYTES`], 415 for a content
/// type other than `application/json`).
pub fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    let status = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    serde_json::to_vec(&status).unwrap_or_default()
}

/// Validates a JobSet object (raw JSON). STUB.
pub fn validate(_jobset: &Value, _config: &InjectionConfig) -> Validation {
    Validation::default()
}

/// Computes the injection patch for a JobSet object (raw JSON). STUB.
pub fn mutate(_jobset: &Value, _config: &InjectionConfig) -> Mutation {
    Mutation::default()
}

/// Answers one AdmissionReview request body. The HTTP layer has already checked the content type
/// and the size. STUB.
pub fn review(_endpoint: Endpoint, _body: &[u8], _config: &InjectionConfig) -> Reply {
    Reply {
        http_status: 400,
        body: br#"{"error":"not built yet"}"#.to_vec(),
        outcome: Outcome::Error,
    }
}
