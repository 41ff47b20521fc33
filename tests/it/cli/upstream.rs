//! Issue 36: `check` on inputs nobody here wrote. Every JobSet example of JobSet v0.12.0 with
//! `InPlaceRestart` switched on (as a user would: `spec.failurePolicy.restartStrategy`), and every
//! ClusterTrainingRuntime Kubeflow Trainer v2.3.0 releases with it switched on in its JobSet
//! template (docs/operations.md, "Kueue and Kubeflow Trainer"): only what the user wrote
//! explicitly against the rules is denied; what Kubernetes (or Trainer) would default is not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::offline::{Check, check_inputs, parse_documents};
use jobset_inplace::protocol::Dialect;
use jobset_inplace_testkit::fixtures;
use serde_json::Value;

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("reads the fixture directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Each file's documents with `switch_on` applied to those it picks, as YAML; the files with
/// none left out.
fn switched_on(dir: &Path, switch_on: fn(&mut Value) -> bool) -> Vec<(String, String)> {
    let mut inputs = Vec::new();
    for path in yaml_files(dir) {
        let text = std::fs::read_to_string(&path).expect("reads");
        let name = path
            .strip_prefix(dir)
            .expect("inside")
            .display()
            .to_string();
        let (_, docs) = parse_documents(&name, &text).expect("upstream YAML parses");
        let mut any = false;
        let mut out = String::new();
        for doc in docs {
            let mut value = doc.value;
            any |= switch_on(&mut value);
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&value).expect("yaml"));
        }
        if any {
            inputs.push((name, out));
        }
    }
    inputs
}

/// Each judged object's verdict: the fields of its denials (empty: allowed).
fn verdicts(checks: &[Check]) -> BTreeMap<String, Vec<String>> {
    let mut seen = std::collections::BTreeSet::new();
    checks
        .iter()
        .map(|c| {
            assert!(c.judged, "{}", c.render());
            let mut fields: Vec<String> = c
                .violations
                .iter()
                .map(|v| format!("{} ({})", v.path, v.rule.label()))
                .collect();
            fields.sort();
            fields.dedup();
            assert!(
                seen.insert(c.file.clone()),
                "one JobSet per file: {}",
                c.file
            );
            (c.file.clone(), fields)
        })
        .collect()
}

fn in_place_restart(js: &mut Value) -> bool {
    let Some(spec) = js.get_mut("spec").and_then(Value::as_object_mut) else {
        return false;
    };
    let policy = spec
        .entry("failurePolicy")
        .or_insert_with(|| serde_json::json!({}));
    policy["restartStrategy"] = "InPlaceRestart".into();
    true
}

fn switch_on_jobset(value: &mut Value) -> bool {
    value["kind"] == "JobSet" && in_place_restart(value)
}

fn switch_on_runtime(value: &mut Value) -> bool {
    value["kind"] == "ClusterTrainingRuntime"
        && value
            .pointer_mut("/spec/template")
            .is_some_and(in_place_restart)
}

/// The denials each example gets, by file: the replicatedJobs whose explicit `backoffLimit`
/// (0, 5 or 10) is not 2147483647, and any other field (with its rule). JobSet's own in-place
/// restart examples bring JobSet's agent (the `attempt` dialect only: denied under `epoch`), one
/// of them as the main container (not offered). No example is denied for `completions` or
/// `parallelism`: where they are unset, the webhook writes Kubernetes' defaults.
const EXPECTED_JOBSET: &[(&str, &[usize], &[&str])] = &[
    ("depends-on/depends-on.yaml", &[], &[]),
    ("depends-on/multiple-depends-on.yaml", &[], &[]),
    ("failure-policy/failjobset-action.yaml", &[0, 1], &[]),
    (
        "failure-policy/host-maintenance-event-model.yaml",
        &[0, 1],
        &[],
    ),
    (
        "failure-policy/onjobfailurereasons-present-podfailurepolicy.yaml",
        &[0, 1],
        &[],
    ),
    (
        "failure-policy/onjobfailurereasons-present.yaml",
        &[0, 1],
        &[],
    ),
    ("failure-policy/restartjob-action.yaml", &[0, 1], &[]),
    (
        "failure-policy/restartjobandignoremaxrestarts-action.yaml",
        &[0, 1],
        &[],
    ),
    ("failure-policy/restartjobset-action.yaml", &[0, 1], &[]),
    (
        "failure-policy/restartjobsetandignoremaxrestarts-action.yaml",
        &[0, 1],
        &[],
    ),
    (
        "in-place-restart/jobset-main-container-mode.yaml",
        &[],
        &[
            "spec.replicatedJobs[0].template.spec.template.spec.containers[0].env[2] (main_container_agent)",
        ],
    ),
    // JobSet's own agent as a sidecar: admitted, as the webhook admits it, with its warning
    // (below) that under epoch JobSet's agent image never completes a group restart.
    (
        "in-place-restart/jobset-sidecar-container-mode.yaml",
        &[],
        &[],
    ),
    ("pytorch/cnn-mnist/mnist.yaml", &[0], &[]),
    ("pytorch/resnet-cifar10/resnet.yaml", &[0], &[]),
    ("simple/coordinator.yaml", &[0, 1], &[]),
    ("simple/exclusive-placement.yaml", &[0], &[]),
    ("simple/failure-policy.yaml", &[0, 1], &[]),
    ("simple/group.yaml", &[0, 1], &[]),
    ("simple/jobset-with-network.yaml", &[0, 1], &[]),
    ("simple/paralleljobs.yaml", &[0, 1], &[]),
    ("simple/success-policy.yaml", &[0, 1], &[]),
    ("simple/ttl-after-finished.yaml", &[0], &[]),
    ("startup-policy/startup-driver-ready.yaml", &[0, 1], &[]),
    ("tensorflow/mnist.yaml", &[0], &[]),
    ("volume-claim-policy/single-pvc.yaml", &[], &[]),
];

#[test]
fn jobsets_own_examples_are_denied_only_for_explicit_conflicts() {
    let dir = fixtures::manifest_dir().join("fixtures/upstream/jobset-v0.12.0-examples");
    let inputs = switched_on(&dir, switch_on_jobset);
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let report = check_inputs(&inputs, &config, true).expect("checks");
    let got = verdicts(&report.checks);
    let expected: BTreeMap<String, Vec<String>> = EXPECTED_JOBSET
        .iter()
        .map(|(file, backoff, other)| {
            let mut fields: Vec<String> = backoff
                .iter()
                .map(|i| {
                    format!("spec.replicatedJobs[{i}].template.spec.backoffLimit (backoff_limit)")
                })
                .chain(other.iter().map(|f| (*f).to_owned()))
                .collect();
            fields.sort();
            ((*file).to_owned(), fields)
        })
        .collect();
    assert_eq!(
        got,
        expected,
        "{:#?}",
        report.checks.iter().map(Check::render).collect::<Vec<_>>()
    );
    for c in &report.checks {
        let own_agent = c.file.contains("in-place-restart/");
        assert_eq!(
            c.warnings
                .iter()
                .any(|w| w.contains("in-place-restart-agent is JobSet's own agent's name")),
            own_agent,
            "{}",
            c.render()
        );
    }
    // As released: every JobSet is reported; only JobSet's in-place restart examples ask for
    // it and are judged.
    let plain = switched_on(&dir, |v| v["kind"] == "JobSet");
    let report = check_inputs(&plain, &config, true).expect("checks");
    assert_eq!(report.checks.len(), EXPECTED_JOBSET.len());
    for c in &report.checks {
        let asks = c.file.starts_with("in-place-restart/");
        assert_eq!(c.judged, asks, "{}", c.render());
        // Denied only in main-container mode (not offered); the sidecar mode is the webhook's
        // warning above.
        let denied = c.file == "in-place-restart/jobset-main-container-mode.yaml";
        assert_eq!(c.allowed, !denied, "{}", c.render());
    }
}

#[test]
fn trainers_runtimes_are_judged_as_trainer_builds_them() {
    let dir = fixtures::manifest_dir().join("fixtures/upstream/trainer-v2.3.0-runtimes");
    let inputs = switched_on(&dir, switch_on_runtime);
    assert_eq!(inputs.len(), 9, "Trainer v2.3.0 releases nine runtimes");
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let report = check_inputs(&inputs, &config, true).expect("checks");
    let got = verdicts(&report.checks);
    for (file, fields) in &got {
        assert!(fields.is_empty(), "{file}: {fields:?}");
    }
    assert_eq!(got.len(), 9);
}
