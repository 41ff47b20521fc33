//! `admission::review` decodes a body into sparse views without ever building a `Value` of it.
//! These tests pin that it answers exactly as reading a `Value` of the body does:
//! - a body `serde_json` cannot read as a `Value` gets a 400 carrying serde_json's own error, even
//!   where the fault is in a field admission never reads (which a skipping parser such as
//!   `IgnoredAny` would accept);
//! - fields of an unexpected JSON type read as absent, the last of duplicate keys wins, escapes in
//!   keys are decoded, serde_json's raw-value objects stand for the JSON they hold;
//! - the byte path (`review`) and the value path (`decide` on a `Value`, the offline commands')
//!   answer the same bytes.

use jobset_inplace::admission::{self, Endpoint, InjectionConfig};
use jobset_inplace_testkit::fixtures::violation_fields;
use jobset_inplace_testkit::{fixtures, oracle};
use serde_json::{Value, json};

fn config() -> InjectionConfig {
    InjectionConfig::defaults(Default::default())
}

fn case(name: &str) -> fixtures::Case {
    fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("fixture {name}"))
}

/// The story1 request as compact JSON text.
fn story1_text() -> String {
    String::from_utf8(case("story1-plain").body).expect("UTF-8")
}

/// `text` with `from` (which must occur) replaced by `to`.
fn replaced(text: &str, from: &str, to: &[u8]) -> Vec<u8> {
    let at = text
        .find(from)
        .unwrap_or_else(|| panic!("{from} not in the body"));
    let mut body = text.as_bytes()[..at].to_vec();
    body.extend_from_slice(to);
    body.extend_from_slice(&text.as_bytes()[at + from.len()..]);
    body
}

fn response(reply: &admission::Reply) -> Value {
    assert_eq!(reply.http_status, 200);
    let review: Value = serde_json::from_slice(&reply.body).expect("JSON");
    review["response"].clone()
}

fn violation_message(response: &Value, field: &str) -> String {
    response["status"]["details"]["causes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["field"] == field))
        .and_then(|c| c["message"].as_str())
        .unwrap_or("")
        .to_owned()
}

fn patch_paths(response: &Value) -> Vec<String> {
    use base64::Engine as _;
    let Some(patch) = response["patch"].as_str() else {
        return Vec::new();
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("base64");
    let patch: Vec<Value> = serde_json::from_slice(&bytes).expect("a JSON Patch");
    patch
        .iter()
        .filter_map(|op| op["path"].as_str().map(str::to_owned))
        .collect()
}

const BACKOFF: &str = "spec.replicatedJobs[0].template.spec.backoffLimit";

#[test]
fn invalid_json_anywhere_gets_serde_json_s_own_error() {
    let text = story1_text();
    // Faults a Value rejects but a skipping parser accepts, in a field admission never reads
    // (request.userInfo.username) and in one it reads (the JobSet's name).
    let too_deep = [vec![b'['; 130], vec![b']'; 130]].concat();
    let faults: Vec<(&str, Vec<u8>, bool)> = vec![
        ("lone surrogate", br#""\ud800""#.to_vec(), true),
        ("unpaired low surrogate", br#""\udc00x""#.to_vec(), true),
        ("number out of range", b"1e400".to_vec(), true),
        ("integer out of range", vec![b'9'; 400], true),
        ("too deep", too_deep, true),
        (
            "raw value not a string",
            br#"{"$serde_json::private::RawValue": 5}"#.to_vec(),
            false,
        ),
        (
            "raw value not JSON",
            br#"{"$serde_json::private::RawValue": "{"}"#.to_vec(),
            false,
        ),
        (
            "raw value with more keys",
            br#"{"$serde_json::private::RawValue": "1", "b": 2}"#.to_vec(),
            false,
        ),
        ("invalid UTF-8", b"\"\xff\"".to_vec(), false),
    ];
    for (what, fault, ignorable) in faults {
        for field in [r#""alice@example.com""#, r#""story1""#] {
            let body = replaced(&text, field, &fault);
            let Err(e) = serde_json::from_slice::<Value>(&body) else {
                panic!("{what}: a Value reads it");
            };
            if ignorable {
                assert!(
                    serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok(),
                    "{what}: IgnoredAny rejects it too"
                );
            }
            let expected = admission::status_body(
                400,
                "BadRequest",
                &format!("cannot read AdmissionReview: invalid JSON: {e}"),
            );
            for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
                let reply = admission::review(endpoint, &body, &config());
                assert_eq!(reply.http_status, 400, "{what} in {field}");
                assert_eq!(
                    String::from_utf8_lossy(&reply.body),
                    String::from_utf8_lossy(&expected),
                    "{what} in {field}"
                );
            }
        }
    }
}

/// An edit of a request, named.
type Edit = (&'static str, fn(&mut Value));

/// Edits of the story1 request, each a field of an unexpected type or shape.
fn lenient_edits() -> Vec<Edit> {
    fn job(r: &mut Value) -> &mut Value {
        &mut r["request"]["object"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    }
    fn container(r: &mut Value) -> &mut Value {
        &mut job(r)["template"]["spec"]["containers"][0]
    }
    vec![
        ("backoffLimit a string", |r| {
            job(r)["backoffLimit"] = json!("x")
        }),
        ("backoffLimit a float", |r| {
            job(r)["backoffLimit"] = json!(2_147_483_647.0)
        }),
        ("backoffLimit null", |r| {
            job(r)["backoffLimit"] = Value::Null
        }),
        ("backoffLimit an object", |r| {
            job(r)["backoffLimit"] = json!({"b": [1, "two"], "a": null})
        }),
        ("completions above i64", |r| {
            job(r)["completions"] = json!(u64::MAX)
        }),
        ("podReplacementPolicy a number", |r| {
            job(r)["podReplacementPolicy"] = json!(3)
        }),
        ("env a string", |r| container(r)["env"] = json!("x")),
        (
            "env entries of every type",
            |r| {
                container(r)["env"] =
                    json!([5, null, {"name": 7}, {"name": "WORKER_COMMAND", "value": 1}])
            },
        ),
        (
            "rules not objects",
            |r| container(r)["restartPolicyRules"] = json!(["x", {"action": 1}, {"action": "RestartPod", "exitCodes": {"operator": "In", "values": [42, "1", 1.5]}}]),
        ),
        ("probe httpGet null", |r| {
            container(r)["startupProbe"] = json!({"httpGet": null})
        }),
        ("containers an object", |r| {
            job(r)["template"]["spec"]["containers"] = json!({"name": "w"})
        }),
        ("initContainers a string", |r| {
            job(r)["template"]["spec"]["initContainers"] = json!("agent")
        }),
        ("pod metadata a list", |r| {
            job(r)["template"]["metadata"] = json!([])
        }),
        ("annotations a string", |r| {
            r["request"]["object"]["metadata"]["annotations"] = json!("x")
        }),
        ("replicatedJobs of every type", |r| {
            let jobs = &mut r["request"]["object"]["spec"]["replicatedJobs"];
            if let Some(jobs) = jobs.as_array_mut() {
                jobs.extend([json!(null), json!("x"), json!({"template": 5})]);
            }
        }),
        ("maxRestarts a string", |r| {
            r["request"]["object"]["spec"]["failurePolicy"]["maxRestarts"] = json!("10")
        }),
        ("object a string", |r| {
            r["request"]["object"] = json!("JobSet")
        }),
        ("kind a string", |r| r["request"]["kind"] = json!("JobSet")),
        ("uid a number", |r| r["request"]["uid"] = json!(7)),
        ("update with an old object", |r| {
            r["request"]["operation"] = json!("UPDATE");
            r["request"]["oldObject"] = r["request"]["object"].clone();
        }),
        ("update with a changed old object", |r| {
            r["request"]["operation"] = json!("UPDATE");
            let mut old = r["request"]["object"].clone();
            old["spec"]["replicatedJobs"][0]["replicas"] = json!(2);
            r["request"]["oldObject"] = old;
        }),
        ("update with an old object of another type", |r| {
            r["request"]["operation"] = json!("UPDATE");
            r["request"]["oldObject"] = json!([1]);
        }),
    ]
}

#[test]
fn the_byte_path_and_the_value_path_answer_the_same() {
    let mut bodies: Vec<(String, Vec<u8>, InjectionConfig)> = fixtures::admission_cases()
        .into_iter()
        .map(|c| (c.name, c.body, c.config))
        .collect();
    let story1 = case("story1-plain").request;
    let full = case("story1-full").request;
    for (what, edit) in lenient_edits() {
        for (base, request) in [("plain", &story1), ("full", &full)] {
            let mut review = request.clone();
            edit(&mut review);
            bodies.push((
                format!("{what} ({base})"),
                serde_json::to_vec(&review).expect("JSON"),
                config(),
            ));
        }
    }
    for (name, body, config) in &bodies {
        for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
            let reply = admission::review(endpoint, body, config);
            match oracle::review_through_value(endpoint, body, config) {
                Some(expected) => assert_eq!(
                    String::from_utf8_lossy(&reply.body),
                    String::from_utf8_lossy(&expected),
                    "{name} {endpoint:?}"
                ),
                None => assert_ne!(
                    reply.decision.outcome,
                    admission::ReviewOutcome::Patched,
                    "{name}"
                ),
            }
        }
    }
}

#[test]
fn a_wrong_type_reads_as_absent_but_present() {
    let mut review = case("story1-plain").request;
    let job = "/request/object/spec/replicatedJobs/0/template/spec";
    for (value, shown) in [
        (json!("x"), r#"(is "x")"#),
        (json!(2_147_483_647.0), "(is 2147483647.0)"),
        (Value::Null, "(is null)"),
    ] {
        if let Some(spec) = review.pointer_mut(job) {
            spec["backoffLimit"] = value;
        }
        let body = serde_json::to_vec(&review).expect("JSON");
        let validate = response(&admission::review(Endpoint::Validate, &body, &config()));
        assert!(
            violation_message(&validate, BACKOFF).contains(shown),
            "{shown}: {validate}"
        );
        // Present: the mutation never overwrites it.
        let mutate = response(&admission::review(Endpoint::Mutate, &body, &config()));
        assert!(
            !patch_paths(&mutate)
                .iter()
                .any(|p| p.ends_with("/backoffLimit")),
            "{shown}"
        );
    }
}

#[test]
fn the_last_of_duplicate_keys_wins_and_escaped_keys_are_read() {
    let text = story1_text();
    let jobs = "\"completions\":16";
    assert!(text.contains(jobs));
    let validate = |body: &[u8]| response(&admission::review(Endpoint::Validate, body, &config()));

    let last_right = replaced(
        &text,
        jobs,
        br#""backoffLimit":6,"backoffLimit":2147483647,"completions":16"#,
    );
    assert!(!violation_fields(&validate(&last_right)).contains(&BACKOFF.to_owned()));

    let last_wrong = replaced(
        &text,
        jobs,
        br#""backoffLimit":2147483647,"backoffLimit":6,"completions":16"#,
    );
    assert!(violation_message(&validate(&last_wrong), BACKOFF).contains("(is 6)"));

    let escaped = replaced(
        &text,
        jobs,
        br#""backoffLimi\u0074":2147483647,"completions":16"#,
    );
    assert!(!violation_fields(&validate(&escaped)).contains(&BACKOFF.to_owned()));
}

#[test]
fn a_raw_value_object_stands_for_the_json_it_holds() {
    let create = case("story1-plain").request;
    // An UPDATE of a JobSet with violations: the ratchet compares its replicatedJobs with the old
    // object's, whose text is not in the body when an enclosing object is a raw value.
    let mut update = create.clone();
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    let ratcheted = response(&admission::review(
        Endpoint::Validate,
        &serde_json::to_vec(&update).expect("JSON"),
        &config(),
    ));
    assert_eq!(ratcheted["allowed"], true, "{ratcheted}");
    assert!(
        ratcheted.to_string().contains("left as it was"),
        "{ratcheted}"
    );
    for (review, pointer) in [
        (&create, "/request/object"),
        (&create, "/request"),
        (&create, "/request/object/spec/replicatedJobs/0"),
        (&update, "/request/object"),
        (&update, "/request/oldObject/spec"),
        (&update, "/request"),
    ] {
        let plain = serde_json::to_vec(review).expect("JSON");
        let mut wrapped = review.clone();
        let Some(node) = wrapped.pointer_mut(pointer) else {
            panic!("{pointer}");
        };
        *node = json!({"$serde_json::private::RawValue": node.to_string()});
        let body = serde_json::to_vec(&wrapped).expect("JSON");
        for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
            assert_eq!(
                admission::review(endpoint, &body, &config()),
                admission::review(endpoint, &plain, &config()),
                "{pointer} {endpoint:?}"
            );
        }
    }
}
