//! The fuzz targets of jobset-inplace: one function per target, from the fuzzer's bytes to a
//! check of what must hold for every input. Each panics (which the fuzzer records as a crash)
//! when something does not hold; none of them may panic otherwise.
//!
//! - [`review`]: the AdmissionReview decoder and decision (`admission::review`), checked against
//!   reading a `Value` of the body (`admission::review::value_path`), the patch it sends applied and sent
//!   again;
//! - [`offline`]: manifest parsing of `inject` and `check` (YAML or JSON, multi-document);
//! - [`agent_env`]: the agent's environment parsing (`agent::config::from_env`);
//! - [`epoch`]: the epoch annotation parser (`protocol::parse_epoch`) and what reads it (the
//!   pod's annotation, the JobSet status, the reconciler's and the agent's decisions).
//!
//! The binaries in `fuzz_targets/` run them under AFL++ (`cargo afl build --features afl`) or
//! replay files; `tests/it/fuzz_corpus.rs` in the main crate includes this file and replays
//! `fuzz/corpus/<target>/` in `cargo test`. See `fuzz/README.md`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use base64::Engine as _;
use jobset_inplace::admission::{self, Endpoint, ReviewOutcome};
use jobset_inplace::agent::config::from_env;
use jobset_inplace::offline;
use jobset_inplace::protocol::{
    self, AgentAction, AgentView, Dialect, EpochStatus, PodView, ReconcileInput,
};
use jobset_inplace_testkit::generators::injection_config;
use jobset_inplace_testkit::oracle;
use serde_json::Value;

/// A fuzz target: one input, any bytes; panics on a finding.
pub type Target = fn(&[u8]);

/// The targets by name, for the replaying binaries and tests.
pub const TARGETS: [(&str, Target); 4] = [
    ("review", review),
    ("offline", offline),
    ("agent_env", agent_env),
    ("epoch", epoch),
];

// ---------------------------------------------------------------------------------------------
// review

/// An AdmissionReview request body, to both endpoints: 200 with the uid echoed when a `Value`
/// reading of the body finds a non-empty string `request.uid` (and then the same bytes as the
/// value path), else 400 with a `Status`; a patch applies to the object, and the patched object
/// is not patched again.
pub fn review(data: &[u8]) {
    let config = injection_config(usize::from(data.len() as u8));
    let value: Option<Value> = serde_json::from_slice(data).ok();
    let uid = value
        .as_ref()
        .and_then(|v| v.pointer("/request/uid"))
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty());
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let reply = admission::review(endpoint, data, &config);
        let body: Value = match serde_json::from_slice(&reply.body) {
            Ok(b) => b,
            Err(e) => panic!("the reply is not JSON: {e}"),
        };
        let Some(uid) = uid else {
            assert_eq!(reply.http_status, 400, "no uid, yet {body}");
            assert_eq!(body["kind"], "Status");
            assert_eq!(body["code"], 400);
            assert_eq!(reply.decision.outcome, ReviewOutcome::Error);
            continue;
        };
        assert_eq!(reply.http_status, 200, "{body}");
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        let response = &body["response"];
        assert_eq!(response["uid"], uid);
        let allowed = response["allowed"].as_bool();
        assert!(allowed.is_some(), "{response}");
        if let Some(expected) = oracle::review_through_value(endpoint, data, &config) {
            assert_eq!(
                String::from_utf8_lossy(&reply.body),
                String::from_utf8_lossy(&expected),
                "the byte path and the value path disagree"
            );
        }
        let Some(patch) = response.get("patch") else {
            assert!(reply.decision.outcome != ReviewOutcome::Patched);
            continue;
        };
        assert_eq!(endpoint, Endpoint::Mutate, "validation patches");
        assert_eq!(allowed, Some(true));
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = match patch
            .as_str()
            .map(|p| base64::engine::general_purpose::STANDARD.decode(p))
        {
            Some(Ok(b)) => b,
            other => panic!("the patch is not base64: {other:?}"),
        };
        let patch: json_patch::Patch = match serde_json::from_slice(&bytes) {
            Ok(p) => p,
            Err(e) => panic!("the patch is not a JSON Patch: {e}"),
        };
        // The API server applies it to the object as it reads it.
        let Some(mut request) = value.clone() else {
            panic!("patched a body that is not JSON");
        };
        let Some(object) = request.pointer_mut("/request/object") else {
            panic!("patched a request without an object");
        };
        if let Err(e) = json_patch::patch(object, &patch) {
            panic!("the patch does not apply: {e}");
        }
        // The mutated object is not patched again.
        let again = match serde_json::to_vec(&request) {
            Ok(b) => b,
            Err(e) => panic!("cannot write the mutated request: {e}"),
        };
        let reply = admission::review(Endpoint::Mutate, &again, &config);
        assert_eq!(reply.http_status, 200);
        assert!(
            reply.decision.outcome != ReviewOutcome::Patched,
            "the mutated object is patched again: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// offline

/// A manifest file (text) through `inject` and `check`: errors are one-line reports naming the
/// file; what `inject` prints parses, and injecting it again changes nothing.
pub fn offline(data: &[u8]) {
    // The commands refuse input that is not UTF-8 before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = injection_config(usize::from(data.first().copied().unwrap_or(0)));
    let parsed = offline::parse_documents("m.yaml", text);
    if let Err(e) = &parsed {
        assert!(e.to_string().starts_with("m.yaml: document "), "{e}");
    }
    for inject in [true, false] {
        match (
            offline::check_text("m.yaml", text, &config, inject),
            &parsed,
        ) {
            (Ok(checks), Ok(_)) => {
                for check in checks {
                    let report = check.render();
                    assert!(
                        [
                            "JobSet",
                            "ClusterTrainingRuntime",
                            "TrainingRuntime",
                            "TrainJob",
                            "AdmissionReview"
                        ]
                        .contains(&check.kind.as_str()),
                        "{report}"
                    );
                    assert!(
                        report.starts_with(&format!("m.yaml: {} ", check.kind)),
                        "{report}"
                    );
                    assert_eq!(check.allowed, check.violations.is_empty(), "{report}");
                }
            }
            (Err(_), Err(_)) => {}
            (Ok(_), Err(e)) => panic!("check accepts what does not parse: {e}"),
            // The mutation's own patch always applies: only parsing fails.
            (Err(e), Ok(_)) => panic!("check fails on what parses: {e}"),
        }
    }
    let out = match (&parsed, offline::inject_text("m.yaml", text, &config)) {
        (Ok(_), Ok(out)) => out,
        (Err(_), Err(_)) => return,
        // A JobSet the mutating webhook denies (too large, no free barrier port): `inject`
        // refuses it as the webhook does, and `check` reports it denied (above).
        (Ok(_), Err(offline::Error::Denied { .. })) => return,
        (Ok(_), Err(e)) => panic!("inject fails on what parses: {e}"),
        (Err(e), Ok(_)) => panic!("inject accepts what does not parse: {e}"),
    };
    // A file with no JobSet in it comes back byte for byte.
    if parsed.as_ref().is_ok_and(|(_, docs)| {
        docs.iter().all(|d| {
            d.value.get("kind").and_then(|k| k.as_str()) != Some("JobSet")
                && d.value.get("kind").and_then(|k| k.as_str()) != Some("List")
        })
    }) {
        assert_eq!(out, text, "inject changed a file without a JobSet");
    }
    // A stream of objects (manifests) is printed so that it injects again to itself; other
    // documents (scalars in a JSON array, say) are not manifests.
    let objects = parsed.is_ok_and(|(_, docs)| docs.iter().all(|d| d.value.is_object()));
    if !objects {
        return;
    }
    let again = match offline::inject_text("out.yaml", &out, &config) {
        Ok(again) => again,
        Err(e) => panic!("inject's output does not inject: {e}\n{out}"),
    };
    assert_eq!(again, out, "inject is not idempotent");
}

// ---------------------------------------------------------------------------------------------
// agent_env

/// The agent's environment as `NAME=VALUE` lines (a line `@ns=TEXT` is the service account's
/// namespace file; without one the file is missing): never a panic; errors are one line and
/// name a variable; an accepted config holds what the agent relies on.
pub fn agent_env(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut env = BTreeMap::new();
    let mut namespace_file = None;
    // Lines hold values with newlines as `\n` escapes.
    for line in text.split('\n') {
        let line = line.replace("\\n", "\n");
        if let Some(ns) = line.strip_prefix("@ns=") {
            namespace_file = Some(ns.to_owned());
        } else if let Some((name, value)) = line.split_once('=') {
            env.insert(name.to_owned(), value.to_owned());
        }
    }
    let dialect = match env
        .get("JOBSET_INPLACE_PROTOCOL")
        .map(|v| v.parse::<Dialect>())
    {
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            assert!(e.to_string().starts_with("unknown protocol"), "{e}");
            Dialect::Epoch
        }
        None => Dialect::Epoch,
    };
    let result = from_env(
        |name| env.get(name).cloned(),
        || {
            namespace_file
                .clone()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no file"))
        },
        dialect,
    );
    match result {
        Err(e) => {
            let message = e.to_string();
            assert!(!message.contains('\n'), "a multi-line error: {message:?}");
            let named = [
                "NAMESPACE",
                "POD_NAME",
                "JOBSET_NAME",
                "RESTART_POD_IN_PLACE_EXIT_CODE",
                "IN_PLACE_RESTART_EXIT_CODE",
                "BARRIER_PORT",
                "STARTUP_PROBE_PORT",
                "BARRIER_PATH",
                "STARTUP_PROBE_PATH",
                "WORKER_COMMAND",
                "AGENT_API_TIMEOUT",
                "AGENT_API_URL",
            ]
            .iter()
            .any(|n| message.contains(n));
            assert!(named, "the error names no variable: {message}");
        }
        Ok(c) => {
            assert!(!c.namespace.is_empty() && c.namespace.trim() == c.namespace);
            assert!(!c.pod_name.is_empty() && c.pod_name.trim() == c.pod_name);
            assert!(!c.jobset_name.is_empty() && c.jobset_name.trim() == c.jobset_name);
            assert!(c.restart_exit_code > 0);
            assert!(!c.api_timeout.is_zero());
            assert_eq!(c.dialect, dialect);
            if let Some(url) = &c.api_url {
                // Schemes are case-insensitive (RFC 3986): `HTTP://` is accepted as written.
                let url = url.to_ascii_lowercase();
                assert!(
                    url.starts_with("http://") || url.starts_with("https://"),
                    "{url}"
                );
            }
            let (port, path) = c.barrier();
            assert!(port > 0);
            assert!(path.starts_with('/') && !path.contains(char::is_whitespace));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// epoch

/// Epoch annotations, one per line, of the pods of one JobSet (a line starting with `!` is a
/// failed pod, `~` a terminating one, `-` alone a pod without the annotation); the first line
/// is the status, `deprecated synced maxRestarts restarts countTowardsMax expectedPods` (each a
/// decimal or `-`). Checks the strict parser, the readers of the annotation and the status, and
/// the reconciler's and the agent's decisions on what they read.
pub fn epoch(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let header: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
    let number = |i: usize| header.get(i).and_then(|s| s.parse::<i64>().ok());
    let epoch_at = |i: usize| header.get(i).and_then(|s| protocol::parse_epoch(s).ok());
    let status = EpochStatus {
        deprecated: epoch_at(0),
        synced: epoch_at(1),
    };
    let clamp = |v: Option<i64>| {
        v.map_or(0, |v| {
            v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
        })
    };

    let mut pods = Vec::new();
    for (i, line) in lines.enumerate() {
        let (failed, terminating, raw) = match line.as_bytes().first() {
            Some(b'!') => (true, false, &line[1..]),
            Some(b'~') => (false, true, &line[1..]),
            _ => (false, false, line),
        };
        check_parse_epoch(raw);
        let annotation = (raw != "-").then(|| raw.to_owned());
        for dialect in Dialect::ALL {
            let key = dialect.pod_annotation().to_owned();
            let annotations: BTreeMap<String, String> = annotation
                .iter()
                .map(|a| (key.clone(), a.clone()))
                .collect();
            let read = dialect.read_pod_epoch(&annotations);
            assert_eq!(
                read.clone().ok().flatten(),
                annotation
                    .as_deref()
                    .and_then(|a| protocol::parse_epoch(a).ok())
            );
            assert_eq!(
                read.is_err(),
                annotation
                    .as_deref()
                    .is_some_and(|a| protocol::parse_epoch(a).is_err())
            );
        }
        pods.push(PodView {
            name: format!("p-{i}"),
            uid: format!("uid-{i}"),
            failed,
            terminating,
            epoch_annotation: annotation,
            max_restart_count: (i % 3) as i32,
            counted_in_last_sync: false,
            // Early failure detection: some pods' restart has begun at their epoch.
            restart_begun: i % 4 == 3,
            ..PodView::default()
        });
    }

    for dialect in Dialect::ALL {
        // The status as the JobSet carries it, read back.
        let mut status_json = serde_json::Map::new();
        for (field, value) in [
            (dialect.deprecated_field(), header.first()),
            (dialect.synced_field(), header.get(1)),
        ] {
            if let Some(v) = value.and_then(|v| serde_json::from_str::<Value>(v).ok()) {
                status_json.insert(field.to_owned(), v);
            }
        }
        let read = dialect.read_status(Some(&status_json));
        for v in [read.deprecated, read.synced].into_iter().flatten() {
            assert!(v >= 0);
        }

        let input = ReconcileInput {
            dialect,
            expected_pods: number(5).unwrap_or(pods.len() as i64),
            max_restarts: clamp(number(2)),
            status,
            restarts: clamp(number(3)),
            restarts_count_towards_max: clamp(number(4)),
            pods: &pods,
            last_synced: None,
            last_deprecated: None,
        };
        let decision = protocol::reconcile_decide(&input);
        // An epoch counts when it parses and is within what the protocol can reach (issue 34);
        // one beyond reach is malformed, like one that does not parse.
        let reach = protocol::reachable_epoch(&input);
        let counted: Vec<&PodView> = pods
            .iter()
            .filter(|p| !p.failed && !p.terminating)
            .collect();
        let valid = |a: &str| {
            protocol::parse_epoch(a)
                .ok()
                .filter(|e| i64::from(*e) <= reach)
        };
        let epochs: Vec<protocol::Epoch> = counted
            .iter()
            .filter_map(|p| p.epoch_annotation.as_deref())
            .filter_map(valid)
            .collect();
        assert_eq!(decision.registered, epochs.len());
        assert_eq!(decision.max_epoch, epochs.iter().copied().max());
        assert_eq!(
            decision.malformed.len(),
            counted
                .iter()
                .filter_map(|p| p.epoch_annotation.as_deref())
                .filter(|a| valid(a).is_none())
                .count()
        );
        for m in &decision.malformed {
            assert!(
                m.error.to_string().chars().count() <= 64 * 10 + 200,
                "{m:?}"
            );
        }
        if decision.fail.is_some() {
            assert!(decision.change.is_empty(), "{decision:?}");
        }
        // Neither field ever decreases; nothing below the first epoch is written.
        if let Some(d) = decision.change.deprecated {
            assert!(status.deprecated.is_none_or(|old| d > old), "{decision:?}");
            assert!(d >= dialect.first_epoch());
            assert!(decision.pods_to_restart <= decision.registered);
        }
        if let Some(pod) = &decision.early {
            assert_eq!(decision.change.deprecated, status.synced, "{decision:?}");
            assert!(pods.iter().any(|p| &p.name == pod && p.restart_begun));
        }
        if let Some(s) = decision.change.synced {
            assert!(status.synced.is_none_or(|old| s > old), "{decision:?}");
            assert_eq!(Some(s), decision.max_epoch);
        }

        // The agent of each pod: the epoch it registers, and what it does on this status.
        for pod in &pods {
            let own = pod
                .epoch_annotation
                .as_deref()
                .and_then(|a| protocol::parse_epoch(a).ok());
            let epoch = protocol::agent_epoch(dialect, own, status.synced);
            assert!(epoch >= dialect.first_epoch());
            if let Some(own) = own {
                assert!(epoch > own || own == i32::MAX);
            }
            let view = AgentView {
                in_place_restart: true,
                disabled: false,
                status,
            };
            match protocol::agent_decide(epoch, &view) {
                AgentAction::Restart(protocol::Restart { deprecated, .. }) => {
                    assert!(epoch <= deprecated)
                }
                AgentAction::LiftBarrier => assert_eq!(status.synced, Some(epoch)),
                AgentAction::Wait => {}
            }
        }
    }
}

/// `parse_epoch` accepts exactly 1-10 ASCII digits of a value in `0..=i32::MAX`, and what it
/// accepts prints back to an equal epoch; its error (logged, and sent as a Warning event) stays
/// short whatever the value.
fn check_parse_epoch(raw: &str) {
    let parsed = protocol::parse_epoch(raw);
    let digits = !raw.is_empty() && raw.len() <= 10 && raw.bytes().all(|b| b.is_ascii_digit());
    let in_range = digits && raw.parse::<u64>().is_ok_and(|v| v <= i32::MAX as u64);
    assert_eq!(parsed.is_ok(), in_range, "{raw:?}: {parsed:?}");
    match parsed {
        Ok(e) => assert_eq!(protocol::parse_epoch(&e.to_string()), Ok(e)),
        // Bounded: at most 64 characters of the value, each escaped in at most 10 (`\u{10ffff}`).
        Err(e) => assert!(e.to_string().chars().count() <= 64 * 10 + 80, "{e}"),
    }
}

/// Replays files (or, with no argument, stdin) through a target; for the binaries built without
/// AFL++.
pub fn replay(target: fn(&[u8])) -> std::process::ExitCode {
    let paths: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let mut inputs = Vec::new();
    if paths.is_empty() {
        let mut buf = Vec::new();
        if let Err(e) = std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf) {
            eprintln!("cannot read stdin: {e}");
            return std::process::ExitCode::FAILURE;
        }
        inputs.push(("<stdin>".to_owned(), buf));
    }
    for path in paths {
        let files = if path.is_dir() {
            match std::fs::read_dir(&path) {
                Ok(dir) => dir.filter_map(|e| e.ok().map(|e| e.path())).collect(),
                Err(e) => {
                    eprintln!("cannot list {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
        } else {
            vec![path]
        };
        for file in files {
            match std::fs::read(&file) {
                Ok(data) => inputs.push((file.display().to_string(), data)),
                Err(e) => {
                    eprintln!("cannot read {}: {e}", file.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
        }
    }
    for (name, data) in &inputs {
        eprintln!("{name}");
        target(data);
    }
    eprintln!("{} input(s) passed", inputs.len());
    std::process::ExitCode::SUCCESS
}
