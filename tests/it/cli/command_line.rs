//! The command line itself, as a user meets it (issue 47): clap's errors with their suggestions,
//! `--version`, `completion`, `-o yaml`, and what `review` says of a plain object.

use std::process::{Command, Output};

use jobset_inplace_testkit::fixtures;
use serde_json::Value;

use super::offline::{binary, run_with_stdin};

/// The binary with no cluster to ask, no dialect from the environment, `args`, `stdin`.
fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = binary();
    cmd.env_remove("JOBSET_INPLACE_PROTOCOL").args(args);
    run_with_stdin(cmd, stdin)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_misspelt_subcommand_or_flag_is_clap_s_error_with_its_suggestion() {
    let out = run(&["chek", "-f", "x"], b"");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        "error: unrecognized subcommand 'chek'\n\n  tip: a similar subcommand exists: 'check'\n\n\
         Usage: jobset-inplace [OPTIONS] <COMMAND>\n\nFor more information, try '--help'.\n"
    );
    let out = run(&["inject", "--fliename", "x"], b"");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).starts_with(
            "error: unexpected argument '--fliename' found\n\n  tip: a similar argument exists: \
             '--filename'\n"
        ),
        "{out:?}"
    );
    // A bad value from the environment: the flag's name, and the variable's in a tip.
    let out = binary()
        .args(["check", "-f", "-"])
        .env("JOBSET_INPLACE_PROTOCOL", "epoc")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: invalid value 'epoc' for '--protocol <PROTOCOL>'\n"),
        "{err}"
    );
    assert!(
        err.contains(
            "  tip: --protocol can also be set by the environment variable \
             JOBSET_INPLACE_PROTOCOL\n"
        ),
        "{err}"
    );
}

#[test]
fn version_names_the_commit_and_the_build_date() {
    for flag in ["--version", "-V"] {
        let out = run(&[flag], b"");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(
            text(&out.stdout),
            format!("jobset-inplace {}\n", jobset_inplace::cli::VERSION)
        );
    }
    assert!(
        jobset_inplace::cli::VERSION.contains(" (commit ")
            && jobset_inplace::cli::VERSION.contains(", built "),
        "{}",
        jobset_inplace::cli::VERSION
    );
}

#[test]
fn completion_prints_a_script_for_each_shell() {
    for (shell, opening) in [
        (
            "bash",
            "complete -F _jobset__inplace -o nosort -o bashdefault -o default jobset-inplace",
        ),
        ("zsh", "#compdef jobset-inplace"),
        ("fish", "complete -c jobset-inplace"),
    ] {
        let out = run(&["completion", shell], b"");
        assert_eq!(out.status.code(), Some(0), "{shell}: {out:?}");
        let script = text(&out.stdout);
        assert!(script.contains(opening), "{shell}: {script}");
        // Long flags by name (fish writes `-l filename`).
        for word in [
            "inject",
            "check",
            "doctor",
            "completion",
            "filename",
            "protocol",
        ] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    // The bash script is bash.
    let out = run(&["completion", "bash"], b"");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("completion.bash");
    std::fs::write(&path, &out.stdout).expect("write");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("bash");
    assert!(syntax.status.success(), "{syntax:?}");
    let out = run(&["completion", "tcsh"], b"");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains("[possible values: bash, elvish, fish, powershell, zsh]"),
        "{out:?}"
    );
}

/// The story1-plain fixture's JobSet (JSON) and its name.
fn plain_jobset() -> (Value, String) {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let jobset = case.request["request"]["object"].clone();
    let name = jobset["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    (jobset, name)
}

#[test]
fn review_of_a_plain_object_says_what_it_read_and_what_to_run() {
    let (jobset, name) = plain_jobset();
    let out = run(
        &["review", "--validate", "-f", "-"],
        &serde_json::to_vec(&jobset).expect("json"),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // The server's own answer, as before, on stdout.
    let status: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["code"], 400, "{status}");
    assert_eq!(
        text(&out.stderr),
        format!(
            "jobset-inplace: review: the input is a JobSet {name}, not an AdmissionReview: review \
             answers an AdmissionReview request as the webhook does (the API server sends one per \
             admission); to judge a manifest run `check -f FILE`, to inject it `inject -f FILE`\n"
        )
    );
    // Garbage gets the server's answer alone.
    let out = run(&["review", "--validate"], b"not json");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stderr.is_empty(), "{out:?}");
}

#[test]
fn check_prints_as_yaml_what_it_prints_as_json() {
    let (jobset, _) = plain_jobset();
    let input = serde_json::to_vec(&jobset).expect("json");
    let json = run(&["check", "-o", "json", "-f", "-"], &input);
    let yaml = run(&["check", "-o", "yaml", "-f", "-"], &input);
    assert_eq!(json.status.code(), Some(0), "{json:?}");
    assert_eq!(yaml.status.code(), Some(0), "{yaml:?}");
    let from_json: Value = serde_json::from_slice(&json.stdout).expect("json");
    let from_yaml: Value = jobset_inplace::settings::from_yaml(&text(&yaml.stdout)).expect("yaml");
    assert_eq!(from_yaml, from_json);
    assert!(
        from_json.as_array().is_some_and(|a| a.len() == 1),
        "{from_json}"
    );
}
