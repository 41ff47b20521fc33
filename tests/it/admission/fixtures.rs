//! Fixture-driven admission tests: every case of `fixtures/admission/<case>/` goes through the
//! mutating then the validating review, as the API server chains them. Adding a case is adding a
//! folder: `request.yaml` (an AdmissionReview), `expected.yaml` (each endpoint's `allowed`,
//! warnings and the fields a denial names: `validate.violations`, and `mutate.violations` where
//! a refused injection's fields are checked), `mutated.yaml` when the mutation patches, and
//! optionally `config.yaml` (an injection config file).
//!
//! `UPDATE_FIXTURES=1 cargo test --test it admission::fixtures` rewrites the `mutated.yaml` files;
//! review their diff before committing.

use base64::Engine;
use jobset_inplace::admission::{self, Endpoint};
use jobset_inplace_testkit::fixtures;
use jobset_inplace_testkit::fixtures::warnings;
use serde_json::Value;

/// The response of a review, checked for the framing every response must have.
fn response(case: &str, uid: &str, reply: &admission::Reply) -> Value {
    assert_eq!(reply.http_status, 200, "{case}: HTTP status");
    let review: Value = serde_json::from_slice(&reply.body).expect("response is JSON");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{case}");
    assert_eq!(review["kind"], "AdmissionReview", "{case}");
    assert_eq!(review["response"]["uid"], uid, "{case}: uid echoed");
    review["response"].clone()
}

/// Each expected warning is a substring of the warning at the same position; counts match.
fn check_warnings(case: &str, endpoint: &str, got: &[String], expected: &Value) {
    let expected: Vec<&str> = expected
        .as_array()
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        got.len(),
        expected.len(),
        "{case} {endpoint} warnings: {got:#?}"
    );
    for (g, e) in got.iter().zip(&expected) {
        assert!(
            g.contains(e),
            "{case} {endpoint}: warning {g:?} lacks {e:?}"
        );
    }
}

fn decode_patch(response: &Value) -> Option<json_patch::Patch> {
    let patch = response.get("patch")?;
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("the patch is a base64 string"))
        .expect("base64");
    Some(serde_json::from_slice(&bytes).expect("a JSON Patch"))
}

/// Every operation adds something new (a key that was absent, or an array append), or replaces
/// a `RestartPod` action: nothing the user wrote is removed or overwritten, so fields this code
/// does not model survive byte for byte.
fn assert_nothing_overwritten(case: &str, object: &Value, patch: &json_patch::Patch) {
    for op in &patch.0 {
        match op {
            json_patch::PatchOperation::Add(add) => {
                let path = add.path.as_str();
                assert!(
                    path.ends_with("/-") || object.pointer(path).is_none(),
                    "{case}: add overwrites {path}"
                );
            }
            json_patch::PatchOperation::Replace(replace) => {
                let path = replace.path.as_str();
                assert!(path.ends_with("/action"), "{case}: replaces {path}");
                assert_eq!(
                    object.pointer(path),
                    Some(&Value::from("RestartPod")),
                    "{case}"
                );
            }
            other => panic!("{case}: unexpected operation {other:?}"),
        }
    }
}

fn with_object(request: &Value, object: &Value) -> Vec<u8> {
    let mut request = request.clone();
    request["request"]["object"] = object.clone();
    serde_json::to_vec(&request).expect("serializes")
}

#[test]
fn every_fixture_case() {
    let cases = fixtures::admission_cases();
    assert!(cases.len() >= 20, "fixtures missing: {}", cases.len());
    let schema = fixtures::jobset_schema();
    let update = std::env::var_os("UPDATE_FIXTURES").is_some();
    for case in &cases {
        let name = case.name.as_str();
        let uid = case.request["request"]["uid"].as_str().expect("uid");
        let object = &case.request["request"]["object"];
        let is_jobset = case.request["request"]["kind"]["kind"] == "JobSet" && object.is_object();

        // Mutation.
        let reply = admission::review(Endpoint::Mutate, &case.body, &case.config);
        let mutate = response(name, uid, &reply);
        let exp = &case.expected["mutate"];
        assert_eq!(mutate["allowed"], exp["allowed"], "{name}: mutate allowed");
        check_warnings(name, "mutate", &warnings(&mutate), &exp["warnings"]);
        // The fields a refused injection names, where the case says them.
        if let Some(want) = exp.get("violations") {
            let fields: Vec<&str> = mutate["status"]["details"]["causes"]
                .as_array()
                .map(|c| c.iter().filter_map(|c| c["field"].as_str()).collect())
                .unwrap_or_default();
            let want: Vec<&str> = want
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            assert_eq!(fields, want, "{name}: mutate violations: {mutate:#}");
        }
        let patch = decode_patch(&mutate);
        assert_eq!(patch.is_some(), exp["patched"] == true, "{name}: patched");
        let mut mutated = object.clone();
        if let Some(patch) = &patch {
            assert_nothing_overwritten(name, object, patch);
            json_patch::patch(&mut mutated, patch).expect("the patch applies");
            let path = case.mutated_path();
            if update {
                let text = serde_saphyr::to_string(&mutated).expect("yaml");
                std::fs::write(&path, text).expect("write mutated.yaml");
            }
            let expected = fixtures::read_yaml(&path);
            assert_eq!(
                mutated, expected,
                "{name}: mutated object differs from mutated.yaml"
            );
            assert_eq!(
                reply.decision.outcome,
                admission::ReviewOutcome::Patched,
                "{name}"
            );
        } else {
            assert!(
                !case.mutated_path().exists(),
                "{name}: mutated.yaml but no patch"
            );
        }

        // A JobSet the CRD schema rejects as written (the hostile and unreadable cases) is
        // rejected by the API server whatever the webhook does; every other result must pass it.
        if is_jobset && !name.starts_with("hostile-") && !name.starts_with("unreadable-") {
            // The API server would accept the result.
            let errors = fixtures::schema_errors(&schema, &mutated);
            assert!(
                errors.is_empty(),
                "{name}: CRD schema rejects the result: {errors:#?}"
            );
            // Idempotence: mutating the mutated object yields no patch.
            let again = admission::review(
                Endpoint::Mutate,
                &with_object(&case.request, &mutated),
                &case.config,
            );
            let again = response(name, uid, &again);
            assert!(
                again.get("patch").is_none(),
                "{name}: second mutation patches: {again}"
            );
        }

        // Validation of what the mutation produced.
        let body = if object.is_object() {
            with_object(&case.request, &mutated)
        } else {
            case.body.clone()
        };
        let reply = admission::review(Endpoint::Validate, &body, &case.config);
        let validate = response(name, uid, &reply);
        let exp = &case.expected["validate"];
        assert_eq!(
            validate["allowed"], exp["allowed"],
            "{name}: validate allowed: {validate:#}"
        );
        assert!(
            validate.get("patch").is_none(),
            "{name}: validation never patches"
        );
        let fields: Vec<&str> = validate["status"]["details"]["causes"]
            .as_array()
            .map(|c| c.iter().filter_map(|c| c["field"].as_str()).collect())
            .unwrap_or_default();
        let expected_fields: Vec<&str> = exp["violations"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(fields, expected_fields, "{name}: violations: {validate:#}");
        if validate["allowed"] == false {
            assert_eq!(validate["status"]["code"], 422, "{name}");
            let message = validate["status"]["message"].as_str().unwrap_or("");
            for field in &expected_fields {
                assert!(
                    message.contains(field),
                    "{name}: message lacks {field}: {message}"
                );
            }
        }
        check_warnings(name, "validate", &warnings(&validate), &exp["warnings"]);
    }
}

/// Our examples in the two shapes JobSet v0.12 documents (image filled in): the sidecar one is
/// accepted after mutation, and the mutation adds nothing that contradicts its agent (its probe
/// still asks where the agent listens); the main-container one is denied, by its own rule.
#[test]
fn released_examples_sidecar_accepted_main_container_denied() {
    let schema = fixtures::jobset_schema();
    let config = admission::InjectionConfig::defaults(Default::default());
    let read = |file: &str| -> Value {
        let text = std::fs::read_to_string(fixtures::reference_dir().join(file)).expect("example");
        let text = text.replace(
            "<CHANGE ME>",
            "registry.example/in-place-restart-agent:v0.12",
        );
        serde_saphyr::from_str(&text).expect("yaml")
    };
    let file = "jobset-sidecar-agent.yaml";
    let object = read(file);
    let mutation = admission::mutate(&object, &config);
    let mut mutated = object.clone();
    json_patch::patch(&mut mutated, &mutation.patch).expect("applies");
    let validation = admission::validate(&mutated, &config);
    assert!(
        validation.violations.is_empty(),
        "{file}: {:#?}",
        validation.violations
    );
    assert!(
        fixtures::schema_errors(&schema, &mutated).is_empty(),
        "{file}"
    );
    // Its own service account is kept; no second agent is added.
    let pod = &mutated["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"], "jobset-in-place-restart",
        "{file}"
    );
    assert_eq!(
        pod["initContainers"].as_array().map(Vec::len),
        Some(1),
        "{file}"
    );
    let agent = &pod["initContainers"][0];
    let env = |name: &str| {
        agent["env"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == name))
            .map(|e| e["value"].clone())
    };
    // The released agent serves 8081 /barrier-is-down, which the probe asks: the env added for
    // our agent says the same.
    assert_eq!(env("BARRIER_PORT"), Some(Value::from("8081")), "{file}");
    assert_eq!(
        env("BARRIER_PATH"),
        Some(Value::from("/barrier-is-down")),
        "{file}"
    );
    // Mutating again changes nothing.
    assert!(
        admission::mutate(&mutated, &config).patch.0.is_empty(),
        "{file}"
    );

    // Main-container mode is not offered (the kubelet's back-off, docs/protocol.md): denied at
    // its WORKER_COMMAND, for that reason alone.
    let file = "jobset-main-container-agent.yaml";
    let object = read(file);
    let mut mutated = object.clone();
    json_patch::patch(&mut mutated, &admission::mutate(&object, &config).patch).expect("applies");
    let validation = admission::validate(&mutated, &config);
    assert_eq!(
        validation.rules,
        vec![admission::Rule::MainContainerAgent],
        "{file}: {:#?}",
        validation.violations
    );
    assert_eq!(validation.violations.len(), 1, "{file}");
    let denial = &validation.violations[0];
    assert!(
        denial.path.contains(".containers[0].env[")
            && denial.message.contains("WORKER_COMMAND")
            && denial.message.contains("agent sidecar"),
        "{file}: {denial:?}"
    );
}

/// The schema check has teeth: a wrong type is rejected.
#[test]
fn the_crd_schema_rejects_a_broken_jobset() {
    let schema = fixtures::jobset_schema();
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("story1-plain");
    let mut object = case.request["request"]["object"].clone();
    assert!(fixtures::schema_errors(&schema, &object).is_empty());
    object["spec"]["replicatedJobs"][0]["replicas"] = Value::from("four");
    assert!(!fixtures::schema_errors(&schema, &object).is_empty());
}

/// Every rule is broken by a fixture case (by its mutating or its validating review), so a rule
/// added without a case under `fixtures/admission/` fails here, naming it; and what a denial
/// counts is its decision's rules, none for a review that is allowed.
#[test]
fn every_rule_is_broken_by_a_fixture_case() {
    let mut broken = std::collections::BTreeMap::new();
    for case in &fixtures::admission_cases() {
        let object = &case.request["request"]["object"];
        let uid = case.request["request"]["uid"].as_str().expect("uid");
        let mutate = admission::review(Endpoint::Mutate, &case.body, &case.config);
        let mut mutated = object.clone();
        if let Some(patch) = decode_patch(&response(&case.name, uid, &mutate)) {
            json_patch::patch(&mut mutated, &patch).expect("the patch applies");
        }
        let body = if object.is_object() {
            with_object(&case.request, &mutated)
        } else {
            case.body.clone()
        };
        let validate = admission::review(Endpoint::Validate, &body, &case.config);
        for reply in [&mutate, &validate] {
            if reply.decision.outcome != admission::ReviewOutcome::Denied {
                assert!(
                    reply.decision.rules.is_empty(),
                    "{}: rules of an answer that allows",
                    case.name
                );
            }
            for rule in &reply.decision.rules {
                broken.entry(*rule).or_insert_with(|| case.name.clone());
            }
        }
    }
    let missing: Vec<&str> = admission::Rule::ALL
        .iter()
        .filter(|r| !broken.contains_key(r))
        .map(|r| r.label())
        .collect();
    assert!(
        missing.is_empty(),
        "rules no case of fixtures/admission/ breaks: {missing:?} (broken: {broken:?})"
    );
}
