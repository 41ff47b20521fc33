//! AdmissionReview handling on bad input: every body gets a documented status and a well-formed
//! answer, and nothing panics.

use jobset_inplace::admission::{self, Endpoint, InjectionConfig, ReviewOutcome};
use jobset_inplace_testkit::fixtures;
use rstest::rstest;
use serde_json::{Value, json};

fn config() -> InjectionConfig {
    InjectionConfig::defaults(Default::default())
}

fn story1() -> Value {
    fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .map(|c| c.request)
        .expect("story1-plain fixture")
}

/// A request body with one change applied to the story1 fixture.
fn edited(edit: fn(&mut Value)) -> Vec<u8> {
    let mut review = story1();
    edit(&mut review);
    serde_json::to_vec(&review).expect("serializes")
}

#[rstest]
#[case::empty_body(Vec::new(), 400)]
#[case::invalid_json(b"{\"apiVersion\": \"admission.k8s.io/v1\", ".to_vec(), 400)]
#[case::not_an_object(b"[1, 2, 3]".to_vec(), 400)]
#[case::missing_request(edited(|r| { r.as_object_mut().map(|o| o.remove("request")); }), 400)]
#[case::missing_uid(edited(|r| { r["request"].as_object_mut().map(|o| o.remove("uid")); }), 400)]
#[case::uid_not_a_string(edited(|r| r["request"]["uid"] = json!(7)), 400)]
#[case::wrong_api_version(edited(|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1")), 200)]
#[case::wrong_kind(edited(|r| r["kind"] = json!("Pod")), 200)]
#[case::missing_object(edited(|r| { r["request"].as_object_mut().map(|o| o.remove("object")); }), 200)]
#[case::null_object(edited(|r| r["request"]["object"] = Value::Null), 200)]
#[case::object_not_an_object(edited(|r| r["request"]["object"] = json!("JobSet")), 200)]
#[case::missing_operation(edited(|r| { r["request"].as_object_mut().map(|o| o.remove("operation")); }), 200)]
#[case::unknown_operation(edited(|r| r["request"]["operation"] = json!("PATCH")), 200)]
#[case::missing_kind(edited(|r| { r["request"].as_object_mut().map(|o| o.remove("kind")); }), 200)]
fn malformed_reviews_are_answered(#[case] body: Vec<u8>, #[case] status: u16) {
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let reply = admission::review(endpoint, &body, &config());
        assert_eq!(reply.http_status, status, "{endpoint:?}");
        assert_eq!(reply.decision.outcome, ReviewOutcome::Error);
        let answer: Value = serde_json::from_slice(&reply.body).expect("well-formed JSON");
        if status == 400 {
            assert_eq!(answer["kind"], "Status");
            assert_eq!(answer["code"], 400);
            assert!(answer["message"].as_str().is_some_and(|m| !m.is_empty()));
        } else {
            assert_eq!(answer["kind"], "AdmissionReview");
            assert_eq!(answer["response"]["uid"], story1()["request"]["uid"]);
            assert_eq!(answer["response"]["allowed"], false);
            assert_eq!(answer["response"]["status"]["code"], 400);
            let message = answer["response"]["status"]["message"]
                .as_str()
                .unwrap_or("");
            assert!(
                message.starts_with("malformed AdmissionReview: "),
                "{message}"
            );
        }
    }
}

/// The response echoes the request's `apiVersion`/`kind` and base64-encodes the patch as a
/// string (kube-core would write a number array).
#[test]
fn patch_is_a_base64_string() {
    let body = serde_json::to_vec(&story1()).expect("serializes");
    let reply = admission::review(Endpoint::Mutate, &body, &config());
    let answer: Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    assert!(answer["response"]["patch"].is_string());
}

/// Truncations, byte flips and splices of real requests never panic, and every answer is JSON
/// with the documented status.
#[test]
fn damaged_bodies_never_panic() {
    let bodies: Vec<Vec<u8>> = fixtures::admission_cases()
        .into_iter()
        .map(|c| c.body)
        .collect();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let config = config();
    for round in 0..3000 {
        let base = &bodies[(next() % bodies.len() as u64) as usize];
        let mut body = base.clone();
        match round % 3 {
            0 => body.truncate((next() % (base.len() as u64 + 1)) as usize),
            1 => {
                for _ in 0..1 + next() % 8 {
                    let i = (next() % body.len() as u64) as usize;
                    body[i] = (next() & 0xff) as u8;
                }
            }
            _ => {
                let other = &bodies[(next() % bodies.len() as u64) as usize];
                let cut = (next() % base.len() as u64) as usize;
                let from = (next() % other.len() as u64) as usize;
                body.truncate(cut);
                body.extend_from_slice(&other[from..]);
            }
        }
        let endpoint = if round % 2 == 0 {
            Endpoint::Mutate
        } else {
            Endpoint::Validate
        };
        let reply = admission::review(endpoint, &body, &config);
        assert!(matches!(reply.http_status, 200 | 400), "round {round}");
        let answer: Value = serde_json::from_slice(&reply.body).expect("well-formed JSON");
        assert!(answer.is_object(), "round {round}");
    }
}

/// Deeply nested JSON is refused by the parser's recursion limit, not by a stack overflow.
#[test]
fn deeply_nested_json_is_a_bad_request() {
    let depth = 100_000;
    let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let reply = admission::review(Endpoint::Validate, body.as_bytes(), &config());
    assert_eq!(reply.http_status, 400);
}

/// The patch of a mutating answer applied to `object` (unchanged without a patch).
fn patched(reply: &admission::Reply, object: &Value) -> Value {
    use base64::Engine as _;
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true, "{answer:#}");
    let mut out = object.clone();
    if let Some(patch) = answer["response"]["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("a JSON Patch");
        json_patch::patch(&mut out, &patch).expect("applies");
    }
    out
}

/// An UPDATE of `old` to `object`, as the API server sends it.
fn update_body(object: &Value, old: &Value) -> Vec<u8> {
    let mut review = story1();
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["object"] = object.clone();
    review["request"]["oldObject"] = old.clone();
    serde_json::to_vec(&review).expect("serializes")
}

/// Kubeflow Trainer's case: a client writes the JobSet again as it built it, without what the
/// webhook injected (the agent with its env and probe, the service account, its token). The
/// mutating webhook, now called on UPDATE, patches it back into the stored JobSet, so the API
/// server sees no change, and the validating webhook has nothing to deny. The stored JobSet
/// itself, or one with a metadata change only, gets no patch.
#[test]
fn an_update_without_the_injection_is_patched_back_into_the_stored_jobset() {
    let config = config();
    let plain = story1()["request"]["object"].clone();
    let create = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&story1()).expect("JSON"),
        &config,
    );
    let stored = patched(&create, &plain);
    assert_ne!(stored, plain, "the CREATE injects");

    // What the client writes: the stored JobSet (its metadata too) without our part.
    let mut written = stored.clone();
    let pod = written["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        .as_object_mut()
        .expect("pod spec");
    for key in [
        "initContainers",
        "serviceAccountName",
        "automountServiceAccountToken",
        "volumes",
    ] {
        assert!(pod.remove(key).is_some(), "{key} was injected");
    }
    let reply = admission::review(Endpoint::Mutate, &update_body(&written, &stored), &config);
    assert_eq!(reply.decision.outcome, ReviewOutcome::Patched);
    assert_eq!(
        patched(&reply, &written),
        stored,
        "patched back, JSON-equal"
    );
    let reply = admission::review(
        Endpoint::Validate,
        &update_body(&patched(&reply, &written), &stored),
        &config,
    );
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true, "{answer:#}");

    // The whole plain JobSet (Job fields and the template annotation gone too).
    let reply = admission::review(Endpoint::Mutate, &update_body(&plain, &stored), &config);
    assert_eq!(patched(&reply, &plain), stored);

    // Already carrying the injection: no patch at all.
    let mut relabelled = stored.clone();
    relabelled["metadata"]["labels"] = json!({"team": "b"});
    for object in [&stored, &relabelled] {
        let reply = admission::review(Endpoint::Mutate, &update_body(object, &stored), &config);
        assert_eq!(reply.decision.outcome, ReviewOutcome::Allowed);
        let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
        assert!(answer["response"].get("patch").is_none(), "{answer:#}");
    }

    // The same answers through the value path (`check`, `inject`, `review`).
    let reply = admission::review(Endpoint::Mutate, &update_body(&written, &stored), &config);
    assert_eq!(
        jobset_inplace_testkit::oracle::review_through_value(
            Endpoint::Mutate,
            &update_body(&written, &stored),
            &config
        ),
        Some(reply.body)
    );
}

/// A JobSet stored without the injection (admitted before the webhook was installed, or opted
/// out then) is not injected by an UPDATE: JobSet holds its replicatedJobs immutable, and it
/// must stay editable.
#[test]
fn an_update_of_a_jobset_stored_uninjected_is_not_patched() {
    let config = config();
    let plain = story1()["request"]["object"].clone();
    let mut suspended = plain.clone();
    suspended["spec"]["suspend"] = json!(true);
    let reply = admission::review(Endpoint::Mutate, &update_body(&suspended, &plain), &config);
    assert_eq!(reply.decision.outcome, ReviewOutcome::Allowed);
    assert_eq!(patched(&reply, &suspended), suspended);
}

/// The fixture of this case (`fixtures/admission/update-reinjects`): its mutated object is its
/// stored one.
#[test]
fn the_update_fixture_is_restored_to_its_old_object() {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "update-reinjects")
        .expect("update-reinjects fixture");
    let reply = admission::review(Endpoint::Mutate, &case.body, &case.config);
    assert_eq!(
        patched(&reply, &case.request["request"]["object"]),
        case.request["request"]["oldObject"]
    );
}
