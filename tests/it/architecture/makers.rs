//! Test-kit builders: no private maker of a JobSet, pod or Job in tests/ or benches/.

use super::*;

/// What a maker returns: the object (as JSON, typed or dynamic) or a manifest's text.
const MADE_TYPES: [&str; 6] = ["Value", "Pod", "Job", "DynamicObject", "JobSet", "String"];

/// Where the literal or comment that starts at `text[i]` ends (the index past it), if one
/// starts there: a string, a raw string, a character literal, a line comment.
fn literal_end(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    let after_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    match b[i] {
        b'/' if b.get(i + 1) == Some(&b'/') => {
            Some(text[i..].find('\n').map_or(b.len(), |n| i + n))
        }
        b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && !after_ident => {
            let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                return None;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let start = i + 2 + hashes;
            Some(
                text[start..]
                    .find(&close)
                    .map_or(b.len(), |n| start + n + close.len()),
            )
        }
        b'"' => {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            Some((j + 1).min(b.len()))
        }
        b'\'' if b.get(i + 2) == Some(&b'\'') => Some(i + 3),
        b'\'' if b.get(i + 1) == Some(&b'\\') => {
            Some(text[i + 2..].find('\'').map_or(b.len(), |n| i + 3 + n))
        }
        _ => None,
    }
}

/// The end of the block that opens at `text[open]` (a `{`), past its closing brace: a brace in a
/// literal or a comment does not count.
fn block_end(text: &str, open: usize) -> usize {
    let b = text.as_bytes();
    let (mut i, mut depth) = (open, 0usize);
    while i < b.len() {
        if let Some(end) = literal_end(text, i) {
            i = end;
            continue;
        }
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Where each `fn` of `text` (outside literals and comments) starts, with whether it is `async`.
fn fn_items(text: &str) -> Vec<(usize, bool)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if let Some(end) = literal_end(text, i) {
            i = end;
            continue;
        }
        let word_start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if word_start && b[i..].starts_with(b"fn ") {
            out.push((i, text[..i].trim_end().ends_with("async")));
        }
        i += 1;
    }
    out
}

/// Whether `body` spells a JobSet, Pod or Job object: a `"kind": "JobSet"` (or `"Pod"`,
/// `"Job"`) in a literal.
fn spells_an_object(body: &str) -> bool {
    body.match_indices("\"kind\"").any(|(at, key)| {
        let rest = body[at + key.len()..].trim_start();
        rest.strip_prefix(':').is_some_and(|v| {
            let v = v.trim_start();
            ["\"JobSet\"", "\"Pod\"", "\"Job\""]
                .iter()
                .any(|kind| v.starts_with(kind))
        })
    })
}

/// A maker's name: `jobset`, `pod` or `job`, alone or with one more word (`pod_json`,
/// `jobset_in`, `job_object`).
fn maker_name(name: &str) -> bool {
    let (head, tail) = name.split_once('_').unwrap_or((name, ""));
    ["jobset", "pod", "job"].contains(&head)
        && !tail.contains('_')
        && tail
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// The functions of `text` that make a JobSet, pod or Job of their own instead of calling the
/// test kit's builders (`jobset_inplace_testkit::build`): a function that returns an object
/// ([`MADE_TYPES`], by its last path segment) and either spells one in a literal
/// ([`spells_an_object`]; a manifest's `String` counts) or bears a maker's name
/// ([`maker_name`]; then not a `String`). A helper that wraps the builders (a scenario's JobSet)
/// spells nothing and passes; a test function returns nothing and passes; an `async` function
/// runs a scenario against a server (a maker is plain), and an object it spells there is the
/// point of its scenario (`agreement_answers`: what the API server defaults in a pod).
fn private_makers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, is_async) in fn_items(text) {
        if is_async {
            continue;
        }
        let rest = &text[at + 3..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = rest.find('{').map(|n| at + 3 + n) else {
            continue;
        };
        let signature = &text[at..open];
        if name.is_empty() || signature.contains(';') {
            continue;
        }
        let returns = signature
            .rsplit_once("->")
            .map(|(_, r)| r.split(" where").next().unwrap_or(r).trim())
            .unwrap_or("");
        let returned = returns.rsplit("::").next().unwrap_or(returns);
        if !MADE_TYPES.contains(&returned) {
            continue;
        }
        let body = &text[open..block_end(text, open)];
        if spells_an_object(body) || (returned != "String" && maker_name(&name)) {
            out.push(name);
        }
    }
    out
}

#[test]
fn no_test_or_bench_makes_its_own_jobset_pod_or_job() {
    let root = Path::new(ROOT);
    let files: Vec<PathBuf> = ["tests", "benches"]
        .iter()
        .flat_map(|d| rs_files(&root.join(d)))
        .collect();
    assert!(files.len() > 50, "the tests were read: {files:?}");
    let makers: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("read");
            private_makers(&text)
                .into_iter()
                .map(move |name| format!("{}: fn {name}", file.display()))
        })
        .collect();
    assert!(
        makers.is_empty(),
        "private makers of a JobSet, pod or Job (build it with jobset_inplace_testkit::build): \
         {makers:#?}"
    );
}

#[test]
fn the_maker_check_sees_makers_and_passes_builders_and_tests() {
    let text = r##"
fn jobset(name: &str) -> Value {
    json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}})
}
fn worker_pod(name: &str) -> serde_json::Value {
    let s = format!("{name}-}}{{");
    json!({"apiVersion": "v1", "kind" : "Pod", "metadata": {"name": s}})
}
fn manifest() -> String {
    json!({"kind":"Job", "x": '{'}).to_string()
}
fn pod_in(ns: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(fixture(ns)).expect("pod")
}
fn scenario() -> Value {
    JobSet::new("train").replicas(2).build()
}
fn jobset_api(c: &Client) -> Api<DynamicObject> {
    todo!()
}
fn pod_line(pod: &Pod) -> String {
    format!("{}", "\"kind\": \"Pod\"")
}
fn stored(&self) -> Value {
    self.server.get("jobsets", NS, "js").expect("jobset")
}
async fn answers(c: &Client) -> Value {
    let pod = json!({"apiVersion": "v1", "kind": "Pod"});
    create(c, pod).await
}
// fn pod() -> Value { json!({"kind": "Pod"}) }
fn said() -> String {
    "fn job() -> Value { json!({}) }".to_owned()
}
#[test]
fn a_test() {
    let p = json!({"kind": "Pod"});
    let _ = r#"{"kind": "JobSet"}"#;
}
"##;
    assert_eq!(
        private_makers(text),
        ["jobset", "worker_pod", "manifest", "pod_in"]
    );
    assert!(maker_name("pod_json") && maker_name("job") && !maker_name("jobset_api_of"));
    assert!(!maker_name("jobs") && !maker_name("stored_jobset"));
}
