//! `inject` as a gate (issue 47: it validates what it prints; directories and `-R`) and the
//! agent's token kept from look-alikes and shared process namespaces through `inject` then
//! `check` (issue 46).

use jobset_inplace_testkit::fixtures;

use super::offline::{binary, errors, run_with_stdin};

/// The story1-plain fixture's JobSet (written as YAML) with `change` applied, and its
/// `namespace/name`.
fn plain_jobset_yaml(change: impl FnOnce(&mut serde_json::Value)) -> (String, String) {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let mut jobset = case.request["request"]["object"].clone();
    change(&mut jobset);
    let name = match (
        jobset["metadata"]["namespace"].as_str(),
        jobset["metadata"]["name"].as_str(),
    ) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_owned(),
        _ => panic!("the fixture's JobSet has a name"),
    };
    (serde_saphyr::to_string(&jobset).expect("yaml"), name)
}

/// Issue 47: `inject` never says ok to what the cluster will deny. A JobSet the injection cannot
/// fix (`backoffLimit: 0`) prints nothing on stdout, its denial on stderr, exit 1; the same
/// JobSet as it should be is printed injected, exit 0.
#[test]
fn inject_refuses_a_jobset_the_validating_webhook_would_deny() {
    let (bad, name) = plain_jobset_yaml(|js| {
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 0.into();
    });
    let mut cmd = binary();
    cmd.args(["inject", "-f", "-"]);
    let out = run_with_stdin(cmd, bad.as_bytes());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(
        errors(&out),
        format!(
            "-: JobSet {name}: denied\n  denied: spec.replicatedJobs[0].template.spec.backoffLimit: \
             must be 2147483647 (is 0): with InPlaceRestart the JobSet's maxRestarts bounds \
             restarts, and a Job that fails on its own recreates every pod\njobset-inplace: \
             inject: 1 JobSet(s) would be denied by the validating webhook once injected; \
             nothing printed\n"
        )
    );
    let (good, _) = plain_jobset_yaml(|_| {});
    let mut cmd = binary();
    cmd.args(["inject", "-f", "-"]);
    let out = run_with_stdin(cmd, good.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("name: jobset-inplace-agent"),
        "{out:?}"
    );
    assert_eq!(errors(&out), "");
}

/// Issue 47: `inject -f DIR` reads the directory's manifests as `check` does, in name order;
/// `-R` its subdirectories' too.
#[test]
fn inject_reads_directories_and_with_r_their_subdirectories() {
    let (jobset, _) = plain_jobset_yaml(|_| {});
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::fs::write(
        dir.path().join("a.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: from-a}\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("b.yml"), &jobset).expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a manifest").expect("write");
    std::fs::write(
        dir.path().join("sub/c.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: from-sub}\n",
    )
    .expect("write");
    let run = |recursive: bool| {
        let mut cmd = binary();
        cmd.arg("inject");
        if recursive {
            cmd.arg("-R");
        }
        let out = cmd.arg("-f").arg(dir.path()).output().expect("runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let flat = run(false);
    // One YAML stream: the next file's documents under a `---` line.
    assert!(
        flat.starts_with("apiVersion: v1\nkind: Namespace\nmetadata: {name: from-a}\n---\n"),
        "{flat}"
    );
    assert!(flat.contains("name: jobset-inplace-agent"), "{flat}");
    assert!(
        !flat.contains("from-sub") && !flat.contains("not a manifest"),
        "{flat}"
    );
    let deep = run(true);
    assert!(deep.starts_with(&flat), "{deep}");
    assert!(
        deep.ends_with("\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: from-sub}\n"),
        "{deep}"
    );
}

/// Issue 46 item 2, as the reviewer reproduced it (`jobset-inplace inject -f X | jobset-inplace
/// check --no-inject -f -`, which exited 0 with "ok"): a look-alike of the agent (a restartable
/// init container of its shape running `example.com/team-a/watchdog:1`), and
/// `shareProcessNamespace` with a pod-level `runAsUser`. Now `inject` refuses each (exit 1, the
/// field and the reason on stderr), `check` says the same, and `check --no-inject` on what
/// `inject` printed at 4567270 (rebuilt here: the same template injected, then the one field
/// put back) exits 1 naming the field.
#[test]
fn inject_then_check_keeps_the_agent_s_token_from_look_alikes_and_shared_process_namespaces() {
    use jobset_inplace_testkit::build::JobSet;
    use serde_json::{Value, json};

    const POD: &str = "spec.replicatedJobs[0].template.spec.template.spec";
    const POD_PTR: &str = "/spec/replicatedJobs/0/template/spec/template/spec";
    let object = |name: &str| -> Value {
        fixtures::admission_cases()
            .into_iter()
            .find(|c| c.name == name)
            .map(|c| c.request["request"]["object"].clone())
            .unwrap_or_else(|| panic!("fixture {name}"))
    };
    let yaml = |v: &Value| serde_saphyr::to_string(v).expect("yaml");
    let run = |args: &[&str], input: &str| {
        let mut cmd = binary();
        cmd.args(args);
        run_with_stdin(cmd, input.as_bytes())
    };
    // What `inject` prints for an object it injects.
    let injected = |v: &Value| -> Value {
        let out = run(&["inject", "-f", "-"], &yaml(v));
        assert!(out.status.success(), "{out:?}");
        serde_saphyr::from_slice(&out.stdout).expect("yaml")
    };

    let look_alike = object("agent-look-alike");
    let watchdog = "example.com/team-a/watchdog:1";
    assert_eq!(
        look_alike.pointer(&format!("{POD_PTR}/initContainers/0/image")),
        Some(&json!(watchdog))
    );
    // 4567270 took the watchdog for the agent: what it printed is the injection of the same
    // template with the agent's image in its place (the injection does not read the image
    // otherwise), the watchdog's image put back.
    let as_agent = JobSet::from_value(look_alike.clone())
        .set(
            &format!("{POD_PTR}/initContainers/0/image"),
            json!("ghcr.io/jobset-inplace/jobset-inplace:0.0.9"),
        )
        .build();
    let old_look_alike = JobSet::from_value(injected(&as_agent))
        .set(
            &format!("{POD_PTR}/initContainers/0/image"),
            json!(watchdog),
        )
        .build();
    assert_eq!(
        old_look_alike.pointer(&format!("{POD_PTR}/initContainers/0/volumeMounts/0/name")),
        Some(&json!("jobset-inplace-agent-token")),
        "the reproduction: the look-alike holds the token mount"
    );

    let shared = object("share-process-namespace");
    assert_eq!(
        shared.pointer(&format!("{POD_PTR}/shareProcessNamespace")),
        Some(&json!(true))
    );
    // 4567270 injected it as it injects the same template without the field.
    let old_shared = JobSet::from_value(injected(
        &JobSet::from_value(shared.clone())
            .remove(&format!("{POD_PTR}/shareProcessNamespace"))
            .build(),
    ))
    .set(&format!("{POD_PTR}/shareProcessNamespace"), json!(true))
    .build();
    assert_eq!(
        old_shared.pointer(&format!("{POD_PTR}/serviceAccountName")),
        Some(&json!("jobset-inplace-agent")),
        "the reproduction: the pod runs as the agent's account"
    );

    for (case, plain, old, fields, reason) in [
        (
            "look-alike",
            &look_alike,
            &old_look_alike,
            vec![
                format!("{POD}.initContainers[0].volumeMounts[0]"),
                format!("{POD}.initContainers[0].image"),
            ],
            "ghcr.io/jobset-inplace/jobset-inplace",
        ),
        (
            "shared process namespace",
            &shared,
            &old_shared,
            vec![format!("{POD}.shareProcessNamespace")],
            "/proc/<pid>/root",
        ),
    ] {
        let field = fields.last().expect("a field");
        // `inject` refuses it.
        let out = run(&["inject", "-f", "-"], &yaml(plain));
        assert_eq!(out.status.code(), Some(1), "{case}: {out:?}");
        assert!(out.stdout.is_empty(), "{case}: nothing printed");
        let stderr = errors(&out);
        assert!(
            stderr.contains(field.as_str()) && stderr.contains(reason),
            "{case}: {stderr}"
        );
        // `check` (inject, then validate) says the same.
        let out = run(&["check", "--output", "json", "-f", "-"], &yaml(plain));
        assert_eq!(out.status.code(), Some(1), "{case}: {out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(report[0]["allowed"], false, "{case}");
        // What 4567270's `inject` printed, checked as it is: denied, naming the field.
        let out = run(
            &["check", "--no-inject", "--output", "json", "-f", "-"],
            &yaml(old),
        );
        assert_eq!(out.status.code(), Some(1), "{case}: {out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("json");
        let violations = report[0]["violations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let got: Vec<&str> = violations
            .iter()
            .filter_map(|v| v["field"].as_str())
            .collect();
        for want in &fields {
            assert!(got.contains(&want.as_str()), "{case}: {got:?}");
        }
        assert!(
            violations.iter().any(|v| v["field"] == json!(field)
                && v["message"].as_str().is_some_and(|m| m.contains(reason))),
            "{case}: {violations:?}"
        );
        // The text report a user reads names it too.
        let out = run(&["check", "--no-inject", "-f", "-"], &yaml(old));
        assert_eq!(out.status.code(), Some(1), "{case}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("denied: {field}")), "{case}: {text}");
    }
}
