//! Bounded work per request (docs/security.md): for every AdmissionReview body up to the
//! API server's 3 MiB, one review answers at most 1 MiB, allocates at most 64 MiB at its peak and
//! takes at most [`MAX_TIME_RATIO`] times as long as reading a benign body of the same size into
//! a `serde_json::Value`, measured in the same process just before (so the check holds in any
//! build and on a loaded machine: no wall-clock bound). The worst inputs known are built here, at 3 MiB, and the
//! smaller ones kept as fixtures (`fixtures/admission/hostile-*`).
//!
//! Memory: each case runs in a child process (this test binary again, one case), which reads its
//! own peak resident set (`VmHWM`) after resetting it (`/proc/self/clear_refs`) once the body is
//! built (the crate forbids `unsafe`, so no counting allocator). Bodies are built as text, so
//! the child holds nothing else.

use std::time::{Duration, Instant};

use jobset_inplace::admission::{self, Endpoint, InjectionConfig};
use jobset_inplace_testkit::fixtures;
use serde_json::{Value, json};

/// The API server's limit on a request body.
const MAX_BODY: usize = 3 * 1024 * 1024;
const MAX_ANSWER: usize = 1024 * 1024;
const MAX_PEAK: usize = 64 * 1024 * 1024;

/// Most a review may take, as a multiple of the baseline: reading a benign body of the same size
/// (small well-formed objects, as a JobSet is made of) into a `serde_json::Value`, the least any
/// JSON reader of that body does. A review reads the body once and writes a bounded answer; a
/// cost that grew with the square of the body, or a reread per element, would be far past it.
const MAX_TIME_RATIO: f64 = 8.0;

/// The baseline body: as many small well-formed objects as `bytes` holds, in one array.
fn benign(bytes: usize) -> Vec<u8> {
    let small = json!({"name": "w", "template": {"spec": {"template": {"spec": {"containers": [{"name": "w"}]}}}}});
    fill(format!("[{HOLE}]").into_bytes(), bytes, &small)
}

/// The faster of two reads of `body` into a `Value`.
fn baseline(body: &[u8]) -> Duration {
    (0..2)
        .map(|_| {
            let start = Instant::now();
            let value: Value = serde_json::from_slice(body).expect("benign JSON");
            let took = start.elapsed();
            drop(std::hint::black_box(value));
            took
        })
        .min()
        .unwrap_or_default()
}

fn story1() -> Value {
    fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .map(|c| c.request)
        .expect("story1-plain fixture")
}

/// A review of story1 whose object is edited, as bytes.
fn body(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut review = story1();
    edit(&mut review["request"]["object"]);
    serde_json::to_vec(&review).expect("serializes")
}

const HOLE: &str = "\"__items__\"";

/// Repeats `item` in an array (placed by `place`) until the body reaches about `bytes`, built
/// as text.
fn filled(bytes: usize, item: &Value, place: impl Fn(&mut Value, Vec<Value>)) -> Vec<u8> {
    let frame = body(|o| place(o, vec![json!("__items__")]));
    fill(frame, bytes, item)
}

/// Replaces every hole of `frame` by as many copies of `item` as `bytes` leaves room for.
fn fill(frame: Vec<u8>, bytes: usize, item: &Value) -> Vec<u8> {
    let frame = String::from_utf8(frame).expect("utf-8");
    let holes = frame.matches(HOLE).count().max(1);
    let item = serde_json::to_string(item).expect("json");
    let n = bytes.saturating_sub(frame.len()) / (item.len() + 1) / holes;
    let mut items = String::with_capacity(n * (item.len() + 1));
    for i in 0..n {
        if i > 0 {
            items.push(',');
        }
        items.push_str(&item);
    }
    frame.replace(HOLE, &items).into_bytes()
}

fn jobs(o: &mut Value, jobs: Vec<Value>) {
    o["spec"]["replicatedJobs"] = Value::Array(jobs);
}

fn worker_job() -> Value {
    story1()["request"]["object"]["spec"]["replicatedJobs"][0].clone()
}

/// The names of the hostile bodies.
fn case_names() -> Vec<String> {
    cases(None).into_iter().map(|(n, _)| n).collect()
}

/// The hostile bodies, each at most 3 MiB (only the one named `only`, if given; the others are
/// empty).
fn cases(only: Option<&str>) -> Vec<(String, Vec<u8>)> {
    let built = std::cell::RefCell::new(Vec::new());
    let add = |name: &str, make: &dyn Fn() -> Vec<u8>| {
        let body = if only == Some(name) {
            make()
        } else {
            Vec::new()
        };
        built.borrow_mut().push((name.to_owned(), body));
    };
    add_cases(&add);
    built.into_inner()
}

/// Builds a body.
type Make<'a> = &'a dyn Fn() -> Vec<u8>;

fn add_cases(add: &dyn Fn(&str, Make<'_>)) {
    // The first hostile input found, at the size limit: `replicatedJobs: [0, 0, ...]`.
    add("zeros", &|| filled(MAX_BODY, &json!(0), jobs));
    add("empty objects", &|| filled(MAX_BODY, &json!({}), jobs));
    // 8,500 small well-formed replicatedJobs (1.9 MB), then as many as 3 MiB holds.
    let small = || json!({"name": "w", "template": {"spec": {"template": {"spec": {"containers": [{"name": "w"}]}}}}});
    add("8500 small replicatedJobs", &|| {
        filled(1_900_000, &small(), jobs)
    });
    add("small replicatedJobs", &|| filled(MAX_BODY, &small(), jobs));
    add("story1 replicatedJobs", &|| {
        filled(MAX_BODY, &worker_job(), jobs)
    });
    // Many containers in one pod: a warning each.
    add("containers", &|| {
        filled(MAX_BODY, &json!({"name": "w"}), |o, c| {
            o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"] =
                Value::Array(c);
        })
    });
    // Many RestartPod rules: a rewrite and a warning each.
    add("RestartPod rules", &|| {
        filled(MAX_BODY, &json!({"action": "RestartPod"}), |o, r| {
            o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
                [0]["restartPolicyRules"] = Value::Array(r);
        })
    });
    // Values quoted in messages: one huge value, then many jobs that quote long ones.
    add("huge quoted value", &|| {
        let huge = "x".repeat(MAX_BODY - 4096);
        body(|o| o["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = json!(huge))
    });
    add("quoting replicatedJobs", &|| {
        let long = "y".repeat(8 * 1024);
        let mut quoting = worker_job();
        quoting["template"]["spec"]["backoffLimit"] = json!(long);
        quoting["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = json!(long);
        filled(MAX_BODY, &quoting, jobs)
    });
    // serde_json's raw-value token: the object stands for the JSON its string holds.
    add("raw-value zeros", &|| {
        let mut review = story1();
        review["request"]["object"]["spec"]["replicatedJobs"] =
            json!({"$serde_json::private::RawValue": "__raw__"});
        let frame = serde_json::to_string(&review).expect("json");
        let n = (MAX_BODY - frame.len()) / 2;
        let raw = format!("[{}0]", "0,".repeat(n - 1));
        frame.replace("__raw__", &raw).into_bytes()
    });
    add("huge name", &|| {
        let huge = "n".repeat(MAX_BODY - 4096);
        body(|o| {
            o["metadata"]["name"] = json!(huge);
            o["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = json!(1);
        })
    });
    // UPDATE: the old object as large as the new one, and unchanged (the ratchet asks about
    // every replicatedJob).
    add("update of story1 replicatedJobs", &|| {
        let mut review = story1();
        review["request"]["operation"] = json!("UPDATE");
        review["request"]["object"]["spec"]["replicatedJobs"] = json!(["__items__"]);
        review["request"]["oldObject"] = review["request"]["object"].clone();
        review["request"]["object"]["metadata"]["labels"] = json!({"a": "b"});
        fill(
            serde_json::to_vec(&review).expect("json"),
            MAX_BODY,
            &worker_job(),
        )
    });
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("field")
}

/// `one_case_in_a_child`'s name as the test binary knows it: its module path without the crate.
fn child_test_name() -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::one_case_in_a_child"),
        None => "one_case_in_a_child".to_owned(),
    }
}

const CHILD_CASE: &str = "JOBSET_INPLACE_BOUNDS_CASE";
const CHILD_ENDPOINT: &str = "JOBSET_INPLACE_BOUNDS_ENDPOINT";

/// In the child: reviews one case and prints `body answer peak_kib micros`.
#[test]
fn one_case_in_a_child() {
    let (Ok(name), Ok(endpoint)) = (std::env::var(CHILD_CASE), std::env::var(CHILD_ENDPOINT))
    else {
        return;
    };
    let endpoint = if endpoint == "mutate" {
        Endpoint::Mutate
    } else {
        Endpoint::Validate
    };
    let config = InjectionConfig::defaults(Default::default());
    let (_, body) = cases(Some(&name))
        .into_iter()
        .find(|(n, _)| *n == name)
        .expect("case");
    let base = baseline(&benign(body.len().max(64 * 1024)));
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let before = status_kib("VmRSS:");
    let start = Instant::now();
    let reply = admission::review(endpoint, &body, &config);
    let took = start.elapsed();
    let peak = status_kib("VmHWM:").saturating_sub(before);
    assert_eq!(reply.http_status, 200);
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    println!(
        "RESULT {} {} {} {} {} {}",
        body.len(),
        reply.body.len(),
        peak,
        took.as_micros(),
        answer["response"]["allowed"],
        base.as_micros()
    );
}

#[test]
fn every_hostile_body_is_answered_within_bounds() {
    if std::env::var(CHILD_CASE).is_ok() {
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for name in case_names() {
        for endpoint in ["mutate", "validate"] {
            let out = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    &child_test_name(),
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_CASE, &name)
                .env(CHILD_ENDPOINT, endpoint)
                .output()
                .expect("child");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let Some(line) = stdout
                .lines()
                .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
            else {
                failures.push(format!("{name} {endpoint}: no result: {stdout}"));
                continue;
            };
            let f: Vec<&str> = line.split(' ').collect();
            let n = |i: usize| f[i].parse::<usize>().expect("number");
            let (body, answer, peak_kib, micros) = (n(0), n(1), n(2), n(3));
            let allowed = f[4];
            let base_micros = n(5).max(1);
            let ratio = micros as f64 / base_micros as f64;
            report.push(format!(
                "{name:>32} {endpoint:>8}: body {body:>8} B, answer {answer:>7} B, peak +{:>5.1} MiB, {:>4} ms = {ratio:>4.1} x baseline {:>3} ms, allowed {allowed}",
                peak_kib as f64 / 1024.0,
                micros / 1000,
                base_micros / 1000
            ));
            assert!(body <= MAX_BODY, "{name}: body of {body} bytes");
            if answer > MAX_ANSWER {
                failures.push(format!("{name} {endpoint}: answer of {answer} bytes"));
            }
            if peak_kib * 1024 > MAX_PEAK {
                failures.push(format!("{name} {endpoint}: peak of {peak_kib} KiB"));
            }
            if ratio > MAX_TIME_RATIO {
                failures.push(format!(
                    "{name} {endpoint}: {micros} µs, {ratio:.1} times the baseline's {base_micros} µs"
                ));
            }
            // Nothing hostile is let through unjudged.
            if endpoint == "validate" && !name.starts_with("update") && allowed != "false" {
                failures.push(format!("{name}: validate allowed it"));
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{failures:#?}\n{}", report.join("\n"));
}

/// The violations and warnings are the first ones, with a count of the rest, and each is cut.
#[test]
fn reports_are_the_first_ones_and_a_count() {
    let config = InjectionConfig::defaults(Default::default());
    let small = json!({"name": "w", "template": {"spec": {"template": {"spec": {"containers": [{"name": "w"}]}}}}});
    let many = body(|o| jobs(o, vec![small; 100]));
    let reply = admission::review(Endpoint::Validate, &many, &config);
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    let status = &answer["response"]["status"];
    let causes = status["details"]["causes"].as_array().expect("causes");
    assert_eq!(causes.len(), admission::validate::MAX_VIOLATIONS);
    let message = status["message"].as_str().expect("message");
    assert!(message.contains("more violations"), "{message}");
    // The warning every replicatedJob gets is said once, naming the first of them.
    let warnings = fixtures::warnings(&answer["response"]);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("spec.replicatedJobs[0, 1, 2, 3, 4, 5, 6, 7 and 92 more]"),
        "{warnings:?}"
    );
    // Warnings that differ (one per container name) are cut at the cap and counted.
    let containers: Vec<Value> = (0..100).map(|i| json!({"name": format!("w{i}")})).collect();
    let named = body(|o: &mut Value| {
        let pod = &mut o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
        pod["containers"] = Value::Array(containers);
        pod["serviceAccountName"] = json!("sa");
        pod["initContainers"] = json!([{"name": "a", "restartPolicy": "Always",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "startupProbe": {"httpGet": {"path": "/barrier-is-lifted", "port": 8080}, "periodSeconds": 1, "failureThreshold": 86400},
            "env": [{"name": "POD_NAME", "value": "p"}, {"name": "JOBSET_NAME", "value": "js"}]}]);
    });
    let reply = admission::review(Endpoint::Validate, &named, &config);
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    let warnings = fixtures::warnings(&answer["response"]);
    assert_eq!(
        warnings.len(),
        admission::validate::MAX_WARNINGS + 1,
        "{warnings:?}"
    );
    assert!(warnings.last().is_some_and(|w| w.contains("more warnings")));
}

/// A JobSet whose injected form etcd would not store is denied, saying so, not patched.
#[test]
fn a_too_large_injection_is_denied_with_the_limit() {
    let config = InjectionConfig::defaults(Default::default());
    let body = body(|o| jobs(o, vec![worker_job(); 1000]));
    let reply = admission::review(Endpoint::Mutate, &body, &config);
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    let response = &answer["response"];
    assert_eq!(response["allowed"], false, "{response:#}");
    assert!(response.get("patch").is_none());
    assert_eq!(response["status"]["code"], 413);
    let message = response["status"]["message"].as_str().unwrap_or("");
    assert!(message.contains("etcd"), "{message}");
    // A JobSet well under the limits is still patched.
    let body = body_of_jobs(50);
    let reply = admission::review(Endpoint::Mutate, &body, &config);
    let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_some());
}

fn body_of_jobs(n: usize) -> Vec<u8> {
    body(|o| {
        jobs(
            o,
            (0..n)
                .map(|i| {
                    let mut j = worker_job();
                    j["name"] = json!(format!("w{i}"));
                    j
                })
                .collect(),
        )
    })
}

/// An UPDATE's body carries the stored object beside the new one: the injected JobSet's size
/// is the new object's, not the body's. A large JobSet written again without its injection gets
/// it back; one that lacks nothing gets no patch and no refusal, whatever its size.
#[test]
fn an_update_is_held_to_the_size_of_its_object() {
    use base64::Engine as _;
    let config = InjectionConfig::defaults(Default::default());
    // Replicated jobs with a large env each: about 900 KB of JobSet, injected.
    let mut job = worker_job();
    let env: Vec<Value> = (0..60)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": "x".repeat(200)}))
        .collect();
    job["template"]["spec"]["template"]["spec"]["containers"][0]["env"] = Value::Array(env);
    let plain_jobs: Vec<Value> = (0..70)
        .map(|i| {
            let mut j = job.clone();
            j["name"] = json!(format!("w{i}"));
            j
        })
        .collect();
    let mut plain = story1()["request"]["object"].clone();
    jobs(&mut plain, plain_jobs);
    let mutation = admission::mutate(&plain, &config);
    assert!(mutation.too_large.is_none(), "{:?}", mutation.too_large);
    let mut stored = plain.clone();
    json_patch::patch(&mut stored, &mutation.patch).expect("applies");
    let size = serde_json::to_vec(&stored).expect("json").len();
    assert!(
        size > admission::mutate::MAX_INJECTED_BYTES / 2
            && size < admission::mutate::MAX_INJECTED_BYTES,
        "{size}"
    );
    let update = |object: &Value| {
        let mut review = story1();
        review["request"]["operation"] = json!("UPDATE");
        review["request"]["object"] = object.clone();
        review["request"]["oldObject"] = stored.clone();
        let reply = admission::review(
            Endpoint::Mutate,
            &serde_json::to_vec(&review).expect("json"),
            &config,
        );
        let answer: Value = serde_json::from_slice(&reply.body).expect("JSON");
        answer["response"].clone()
    };
    // Written again without the injection: patched back.
    let response = update(&plain);
    assert_eq!(response["allowed"], true, "{}", response["status"]);
    let patch: json_patch::Patch = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().expect("a patch"))
            .expect("base64"),
    )
    .expect("JSON Patch");
    let mut out = plain.clone();
    json_patch::patch(&mut out, &patch).expect("applies");
    assert_eq!(out, stored);
    // The stored JobSet itself: allowed without a patch.
    let response = update(&stored);
    assert_eq!(response["allowed"], true, "{}", response["status"]);
    assert!(response.get("patch").is_none());
}
