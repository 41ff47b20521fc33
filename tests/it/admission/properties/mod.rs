//! Property tests of admission (issue 6) over generated JobSets and AdmissionReviews:
//!
//! - every review gets an answer, never a panic: a well-formed AdmissionReview response carrying
//!   the request's uid (HTTP 200), or a `Status` (HTTP 400) when there is no uid to answer;
//! - the mutation patches only by adding (or by rewriting `RestartPod`), so every field of the
//!   input, unknown ones included (keys with `/` and `~` too), is in the output unchanged; the
//!   patched object is valid against the released JobSet CRD schema; mutating it again patches
//!   nothing;
//! - validation of the mutated object denies exactly where the user's explicit values conflict
//!   with the admission rules (docs/architecture.md, "Admission"): the generator draws each value from good and bad choices, and [`Model`]
//!   says which violation (field path) each bad choice makes; an UPDATE ratchets unchanged
//!   replicatedJobs; DELETE, CONNECT and other kinds are allowed; dry-run changes nothing;
//! - reviews with missing or odd fields, arbitrary JSON and arbitrary bytes: the decoder answers as
//!   reading a `Value` of the body does (`oracle::review_through_value`).
//!
//! The whole file runs in well under a minute in a debug build; `PROPTEST_CASES=N` runs N cases
//! of each property instead (e.g. `PROPTEST_CASES=5000 cargo test --release --test
//! admission_properties`).
// Strategies are spelled as the tuples they generate.
#![allow(clippy::type_complexity)]

use std::sync::OnceLock;

use base64::Engine as _;
use jobset_inplace::admission::{self, Endpoint, InjectionConfig};
use jobset_inplace::protocol::Dialect;
use jobset_inplace_testkit::fixtures::{violation_fields, warnings};
use jobset_inplace_testkit::generators::{INJECTION_CONFIGS, injection_config};
use jobset_inplace_testkit::{fixtures, oracle};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};

const MAX_BACKOFF: i64 = 2_147_483_647;
const AGENT_NAME: &str = "jobset-inplace-agent";
/// The repository of every generated injection config's image, with another tag.
const AGENT_IMAGE: &str = "ghcr.io/jobset-inplace/jobset-inplace:0.0.9";
const INJECTED: &str = "jobset-inplace.dev/injected";
const RAC: &str = "RestartAllContainers";
const RESTART_POD: &str = "RestartPod";
const RESTART: &str = "Restart";
const DEFAULT_PORT: i64 = 8080;
const DEFAULT_PATH: &str = "/barrier-is-lifted";
const DEFAULT_EXIT_CODE: u8 = 42;
const EXIT: &str = "RESTART_POD_IN_PLACE_EXIT_CODE";
const EXIT_ALIAS: &str = "IN_PLACE_RESTART_EXIT_CODE";
const PORT: &str = "BARRIER_PORT";
const PORT_ALIAS: &str = "STARTUP_PROBE_PORT";
const PATH: &str = "BARRIER_PATH";
const PATH_ALIAS: &str = "STARTUP_PROBE_PATH";
const PROTOCOL: &str = "JOBSET_INPLACE_PROTOCOL";
const WORKER_COMMAND: &str = "WORKER_COMMAND";

/// `cases` per property, unless `PROPTEST_CASES` says otherwise.
fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        // A failure prints its minimal input; it becomes a fixture or a unit test.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn schema() -> &'static jsonschema::Validator {
    static SCHEMA: OnceLock<jsonschema::Validator> = OnceLock::new();
    SCHEMA.get_or_init(fixtures::jobset_schema)
}
mod checks;
mod generators;
mod model;

use checks::*;
use generators::*;
use model::*;

// -----------------------------------------------------------------------------
// The properties.

proptest! {
    #![proptest_config(cases(96))]

    #[test]
    fn create_mutates_safely_and_validates_exactly_the_explicit_conflicts(
        model in model(),
        uid in uid(),
        which in 0..INJECTION_CONFIGS,
        dry_run in prop::option::of(any::<bool>()),
    ) {
        create(&model, &uid, which, dry_run)?;
    }

    #[test]
    fn update_ratchets_only_unchanged_replicated_jobs(
        model in model(),
        uid in uid(),
        old in prop_oneof![
            Just(Old::Absent),
            Just(Old::Same),
            any::<Index>().prop_map(Old::JobChanged),
            Just(Old::WasRecreate),
        ],
        which in 0..INJECTION_CONFIGS,
    ) {
        update(&model, &uid, &old, which)?;
    }
}

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn other_operations_and_kinds(
        model in model(),
        uid in uid(),
        operation in select(vec!["DELETE", "CONNECT", "CREATE", "UPDATE", "PATCH", "create"]),
        kind in select(vec![
            ("jobset.x-k8s.io", "JobSet"),
            ("batch", "Job"),
            ("", "Pod"),
            ("jobset.x-k8s.io", "JobSetList"),
            ("jobset.x-k8s.io.evil", "JobSet"),
        ]),
    ) {
        other_requests(&model, &uid, operation, kind)?;
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn reviews_with_missing_or_odd_fields(
        model in model(),
        uid in uid(),
        edits in prop::collection::vec((select(ODD_PLACES.to_vec()), odd_value()), 1..4),
        operation in select(vec!["CREATE", "UPDATE"]),
        which in 0..INJECTION_CONFIGS,
    ) {
        let object = model.json();
        let mut request = review(
            &uid, operation, ("jobset.x-k8s.io", "JobSet"), Some(&object), Some(&object), None,
        );
        for (place, value) in edits {
            set(&mut request, place, value);
        }
        any_body(&serde_json::to_vec(&request).expect("JSON"), which)?;
    }

    #[test]
    fn arbitrary_json_bodies(body in json_value(5, true), which in 0..INJECTION_CONFIGS) {
        any_body(&serde_json::to_vec(&body).expect("JSON"), which)?;
        // As an AdmissionReview's request, and as its object.
        let wrapped = review("u-1", "CREATE", ("jobset.x-k8s.io", "JobSet"), Some(&body), None, None);
        any_body(&serde_json::to_vec(&wrapped).expect("JSON"), which)?;
        let mut as_request = wrapped;
        as_request["request"] = body;
        any_body(&serde_json::to_vec(&as_request).expect("JSON"), which)?;
    }

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256), which in 0..INJECTION_CONFIGS) {
        any_body(&body, which)?;
    }

    #[test]
    fn edited_bytes_of_a_review(
        model in model(),
        edits in prop::collection::vec(byte_edit(), 1..6),
        which in 0..INJECTION_CONFIGS,
    ) {
        let object = model.json();
        let mut body = serde_json::to_vec(&review(
            "u-2", "CREATE", ("jobset.x-k8s.io", "JobSet"), Some(&object), None, None,
        ))
        .expect("JSON");
        for edit in &edits {
            apply_byte_edit(&mut body, edit);
        }
        any_body(&body, which)?;
    }
}

/// The generator is not vacuous: among JobSets it draws, some mutate and some do not, some are
/// accepted after the mutation and some denied, with every kind of violation the model knows.
#[test]
fn the_generator_covers_accepted_and_denied_jobsets() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let config = injection_config(0);
    let strategy = model();
    let (mut mutates, mut accepted, mut denied) = (0, 0, 0);
    let mut kinds = std::collections::BTreeSet::new();
    for _ in 0..300 {
        let model = strategy.new_tree(&mut runner).expect("a model").current();
        if model.mutates() {
            mutates += 1;
            let violations = model.violations(true, &config);
            if violations.is_empty() {
                accepted += 1;
            } else {
                denied += 1;
            }
            for (_, path) in violations {
                let tail = path.rsplit('.').next().unwrap_or("").to_owned();
                let tail = tail.split('[').next().unwrap_or("").to_owned();
                kinds.insert(tail);
            }
        }
    }
    eprintln!("{mutates} of 300 mutate: {accepted} accepted, {denied} denied; {kinds:?}");
    assert!(mutates > 150 && mutates < 300);
    assert!(accepted > 50 && denied > 50);
    for kind in [
        "backoffLimit",
        "podReplacementPolicy",
        "completions",
        "parallelism",
        "restartPolicy",
        "restartPolicyRules",
        "env",
        "value",
        "startupProbe",
        "port",
        "path",
        "initContainers",
        "containers",
        "containerPort",
    ] {
        assert!(kinds.contains(kind), "no {kind} violation drawn: {kinds:?}");
    }
}
