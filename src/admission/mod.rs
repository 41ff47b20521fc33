//! Admission of InPlaceRestart JobSets (docs/architecture.md, "Admission"): pure validation and mutation over raw JSON,
//! the injection config, and the AdmissionReview handling shared by the HTTPS server and the
//! offline commands.
//!
//! - [`account`]: who holds the agent's token, who carries its name (injection and validation);
//! - [`validate`]: the rules' checks (`backoffLimit`, `podReplacementPolicy`, `completions`, the agent);
//! - [`rule`]: the rules as values ([`Rule`]), carried by every [`Violation`];
//! - [`mutate`]: the injection plan (agent sidecar, env, service account) as JSON Patch operations;
//! - [`sidecar`]: the agent container spec, its env entries and its token volume;
//! - [`patch`]: the JSON Patch writer;
//! - [`review`]: the one entry ([`review()`], for the server and the offline commands alike):
//!   AdmissionReview decoding, the one [`Decision`], and the [`Reply`] that carries it beside the
//!   encoded response;
//! - [`pod`]: reading containers, restart rules, env and probes of a pod template;
//! - [`view`]: the views of a review and its JobSet the rules read, decoded straight from the
//!   body (no `Value` of the whole review is ever built) by the lenient reader ([`lenient`]);
//! - [`raw`]: the replicatedJobs as written, for the UPDATE ratchet;
//! - [`restore`]: an UPDATE gets the stored injection back, as stored;
//! - [`worker`]: the workers' restart rule and the exit codes it leaves to the Job;
//! - [`config`]: the injection config (file, flags, env).

pub(crate) mod account;
pub mod config;
pub(crate) mod lenient;
pub mod mutate;
pub(crate) mod patch;
pub mod pod;
pub(crate) mod raw;
pub(crate) mod restore;
pub mod review;
pub mod rule;
pub mod sidecar;
pub(crate) mod token;
pub mod validate;
pub(crate) mod view;
pub(crate) mod warnings;
pub(crate) mod worker;

pub use config::InjectionConfig;
#[cfg(any(test, feature = "test-api"))]
pub use mutate::{mutate, mutate_update};
pub use review::{Decision, Reply, review};
pub use rule::Rule;
#[cfg(any(test, feature = "test-api"))]
pub use validate::{validate, validate_update};

/// JobSet annotation that opts a JobSet out of the injection (value `"false"`).
pub const INJECT_ANNOTATION: &str = "jobset-inplace.dev/inject";
/// JobSet annotation that opts a JobSet out of the workers' injected `restartPolicyRules` (value
/// `"false"`; the agent is still injected).
pub const WORKER_RULES_ANNOTATION: &str = "jobset-inplace.dev/worker-restart-rules";
/// Pod template annotation recording the version that injected it.
pub const INJECTED_ANNOTATION: &str = "jobset-inplace.dev/injected";

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
pub enum ReviewOutcome {
    Allowed,
    Denied,
    Patched,
    Error,
}

impl ReviewOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewOutcome::Allowed => "allowed",
            ReviewOutcome::Denied => "denied",
            ReviewOutcome::Patched => "patched",
            ReviewOutcome::Error => "error",
        }
    }
}

/// One validation failure: the JSON field path and a message a user can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule it breaks.
    pub rule: Rule,
    /// e.g. `spec.replicatedJobs[0].template.spec.backoffLimit`
    pub path: String,
    pub message: String,
}

/// The inner result of validating one JobSet (`validate::validate_view`), which [`review()`]
/// turns into its [`Decision`]. At most [`validate::MAX_VIOLATIONS`] violations and
/// [`validate::MAX_WARNINGS`] warnings are kept (the first ones); the rest are counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validation {
    pub violations: Vec<Violation>,
    pub warnings: Vec<String>,
    /// Violations found past the first [`validate::MAX_VIOLATIONS`].
    pub more_violations: usize,
    /// Warnings past the first [`validate::MAX_WARNINGS`].
    pub more_warnings: usize,
    /// The rules broken, each once, in the order first broken (those of violations past the
    /// first [`validate::MAX_VIOLATIONS`] too).
    pub rules: Vec<Rule>,
    /// Warnings that say the same of several replicatedJobs, said once (while validating).
    pub(crate) groups: Vec<warnings::WarningGroup>,
}

#[cfg(any(test, feature = "test-api"))]
/// The result of the test API's [`mutate()`] / [`mutate_update()`] (the injection over a `Value`,
/// for the tests): targeted JSON Patch operations (empty when nothing changes) and admission
/// warnings. The product's answer is [`review()`]'s [`Decision`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mutation {
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
    /// Set when the injected JobSet would be too large: why (the webhook denies it).
    pub too_large: Option<String>,
    /// Pod templates the agent cannot go into as configured (no free barrier port), with their
    /// field paths (the webhook denies the JobSet).
    pub violations: Vec<Violation>,
}

/// Largest AdmissionReview body accepted; larger bodies get HTTP 413 from the server.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// A Kubernetes `Status` object as the body of an HTTP error reply (400 when no uid can be
/// read, 413 for a body over [`MAX_BODY_BYTES`], 415 for a content type other than
/// `application/json`): the connection loop's ([`crate::serving::status_body`]).
pub use crate::serving::status_body;
