//! The offline commands, run as a user runs them: the real binary, fixtures as input.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use jobset_inplace::admission::{self, Endpoint};
use jobset_inplace::offline::review_exit_code;
use jobset_inplace_testkit::fixtures;

/// The binary with no cluster to ask (the offline commands ask none unless `--protocol auto` is
/// given; that then falls back to `epoch`, whatever kubeconfig the machine has).
pub(super) fn binary() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_jobset-inplace"));
    cmd.env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST");
    cmd
}

/// stderr without the note saying which dialect was used.
pub(super) fn errors(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("jobset-inplace: the epoch protocol ("))
        .map(|l| format!("{l}\n"))
        .collect()
}

pub(super) fn run_with_stdin(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("writes stdin");
    child.wait_with_output().expect("runs")
}

/// `review` prints exactly the bytes the server sends, for every fixture and both endpoints.
#[test]
fn review_is_byte_identical_to_the_server_path() {
    for case in fixtures::admission_cases() {
        for (flag, endpoint) in [
            ("--mutate", Endpoint::Mutate),
            ("--validate", Endpoint::Validate),
        ] {
            let mut cmd = binary();
            cmd.args(["review", flag, "-f", "-"]);
            if case.dir.join("config.yaml").exists() {
                cmd.arg("--config").arg(case.dir.join("config.yaml"));
            }
            let out = run_with_stdin(cmd, &case.body);
            let expected = admission::review(endpoint, &case.body, &case.config);
            assert_eq!(
                out.status.code(),
                Some(i32::from(review_exit_code(expected.decision.outcome))),
                "{} {flag}: {:?}",
                case.name,
                out
            );
            assert_eq!(out.stdout, expected.body, "{} {flag}", case.name);
        }
    }
}

#[test]
fn review_of_garbage_exits_non_zero_with_a_status() {
    let mut cmd = binary();
    cmd.args(["review", "--validate"]);
    let out = run_with_stdin(cmd, b"not json");
    assert_eq!(out.status.code(), Some(2));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["code"], 400);
}

/// `inject` then `check` on a plain JobSet: the injected manifest passes; the plain one, checked
/// as written, is denied with field paths and exit code 1.
#[test]
fn inject_and_check_a_plain_jobset() {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let jobset = serde_saphyr::to_string(&case.request["request"]["object"]).expect("yaml");
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("plain.yaml");
    std::fs::write(
        &plain,
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: team-a}}\n---\n{jobset}"),
    )
    .expect("write");

    let out = binary()
        .args(["inject", "-f"])
        .arg(&plain)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    let injected = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        injected.starts_with("apiVersion: v1\nkind: Namespace\n"),
        "{injected}"
    );
    assert!(
        injected.contains("name: jobset-inplace-agent"),
        "{injected}"
    );
    let injected_path = dir.path().join("injected.yaml");
    std::fs::write(&injected_path, &injected).expect("write");

    let out = binary()
        .args(["check", "--no-inject", "-f"])
        .arg(&injected_path)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = binary()
        .args(["check", "-f"])
        .arg(&plain)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = binary()
        .args(["check", "--no-inject", "-f"])
        .arg(&plain)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let report = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        report.contains("denied: spec.replicatedJobs[0].template.spec.backoffLimit"),
        "{report}"
    );
    assert!(
        report
            .contains("denied: spec.replicatedJobs[0].template.spec.template.spec.initContainers"),
        "{report}"
    );

    // stdin works too, and the attempt dialect reaches the injected agent.
    let mut cmd = binary();
    cmd.args(["--protocol", "attempt", "inject", "-f", "-"]);
    let out = run_with_stdin(cmd, jobset.as_bytes());
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("value: attempt"));
}

#[test]
fn bad_input_and_flags_are_one_line_errors() {
    let out = binary()
        .args(["inject", "-f", "/nonexistent.yaml"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = errors(&out);
    assert_eq!(
        err,
        String::from_utf8_lossy(&out.stderr),
        "nothing about a cluster"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent.yaml"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "barrierPort: lots\n").expect("write");
    let out = binary()
        .args(["check", "-f", "/dev/null", "--config"])
        .arg(&config)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("barrierPort"), "{err}");

    let out = binary()
        .args(["review", "--mutate", "--restart-exit-code", "0"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--restart-exit-code"), "{err}");
}

/// `check --output json`: one object per JobSet with its field paths, exit code 1 when any is
/// denied; a file with nothing to inject comes out of `inject` byte for byte.
#[test]
fn check_json_and_inject_passthrough() {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let jobset = serde_saphyr::to_string(&case.request["request"]["object"]).expect("yaml");
    let mut cmd = binary();
    cmd.args(["check", "--no-inject", "--output", "json", "-f", "-"]);
    let out = run_with_stdin(cmd, jobset.as_bytes());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let items = report.as_array().expect("an array");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["allowed"], false);
    assert_eq!(items[0]["file"], "-");
    assert!(
        items[0]["violations"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["field"]
                .as_str()
                .is_some_and(|f| f.ends_with("initContainers"))))
    );

    // Not an InPlaceRestart JobSet, and no newline at the end of its last block scalar.
    let other = fixtures::read_yaml(
        &fixtures::manifest_dir().join("fixtures/admission/not-in-place-restart/request.yaml"),
    );
    let text = format!(
        "# keep me\n{}---\nkind: ConfigMap\ndata:\n  run.sh: |\n    echo done",
        serde_saphyr::to_string(&other["request"]["object"]).expect("yaml")
    );
    let mut cmd = binary();
    cmd.args(["inject", "-f", "-"]);
    let out = run_with_stdin(cmd, text.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), text);
}

/// Lease timings the lease manager cannot work with are a start-up error, not a panic.
#[test]
fn reconciler_refuses_a_lease_grace_not_below_its_duration() {
    let out = binary()
        .args([
            "reconciler",
            "--lease-duration-seconds",
            "5",
            "--lease-grace-seconds",
            "5",
        ])
        .env_remove("KUBECONFIG")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--lease-grace-seconds (5) must be at least 1 and below"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

fn fixture(path: &str) -> std::path::PathBuf {
    fixtures::manifest_dir().join(path)
}

/// Issue 23: `check` as a CI gate. What it did not judge fails; what is inside a runtime or an
/// AdmissionReview is judged; directories and several `-f` are read.
#[test]
fn check_is_a_ci_gate() {
    // A ClusterTrainingRuntime with InPlaceRestart and backoffLimit 0, an AdmissionReview of a
    // JobSet with backoffLimit 0: denied, with the paths in their documents.
    for (file, kind, field) in [
        (
            "fixtures/check/cluster-training-runtime-backoff-limit-0.yaml",
            "ClusterTrainingRuntime",
            "spec.template.spec.replicatedJobs[0].template.spec.backoffLimit",
        ),
        (
            "fixtures/check/admission-review.yaml",
            "AdmissionReview",
            "request.object.spec.replicatedJobs[0].template.spec.backoffLimit",
        ),
    ] {
        let out = binary()
            .args(["check", "-o", "json", "-f"])
            .arg(fixture(file))
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(1), "{file}: {out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(report[0]["kind"], kind, "{report}");
        assert_eq!(report[0]["document"], 1, "{report}");
        assert_eq!(report[0]["allowed"], false, "{report}");
        assert!(
            report[0]["violations"].as_array().is_some_and(|v| v
                .iter()
                .any(|v| v["field"] == field && v["rule"].is_string())),
            "{file}: {report}"
        );
    }

    // Nothing to judge: exit 3 naming the input, unless --allow-empty.
    let empty = fixture("fixtures/check/empty.yaml");
    let out = binary()
        .args(["check", "-f"])
        .arg(&empty)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("empty.yaml: nothing judged for in-place restart")
            && err.contains("--allow-empty"),
        "{err}"
    );
    let out = binary()
        .args(["check", "--allow-empty", "-f"])
        .arg(&empty)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");

    // A TrainJob with its runtime in the input: judged, its placeholder image a warning.
    let out = binary()
        .args(["check", "-o", "json", "-f"])
        .arg(fixture("fixtures/check/trainjob-with-runtime.yaml"))
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let trainjob = report
        .as_array()
        .and_then(|items| items.iter().find(|i| i["kind"] == "TrainJob"))
        .expect("the TrainJob is judged");
    assert_eq!(trainjob["object"], "team-a/llama");
    assert_eq!(trainjob["document"], 2);
    assert_eq!(trainjob["runtime"]["name"], "torch-in-place-ok");
    assert!(
        trainjob["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w
                .as_str()
                .is_some_and(|w| w.contains("<CHANGE ME>") && w.contains("placeholder")))),
        "{trainjob}"
    );

    // A directory (its manifests only, not its subdirectories without -R), next to a file.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::fs::copy(
        fixture("fixtures/check/trainjob-with-runtime.yaml"),
        dir.path().join("ok.yaml"),
    )
    .expect("copy");
    std::fs::write(dir.path().join("README.md"), "not a manifest").expect("write");
    std::fs::copy(
        fixture("fixtures/check/admission-review.yaml"),
        dir.path().join("sub/review.yml"),
    )
    .expect("copy");
    let run = |args: &[&str]| {
        let out = binary()
            .arg("check")
            .args(args)
            .args(["-o", "json", "-f"])
            .arg(dir.path())
            .arg("-f")
            .arg(&empty)
            .arg("--allow-empty")
            .output()
            .expect("runs");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let kinds: Vec<String> = report
            .as_array()
            .map(|items| items.iter().map(|i| i["kind"].to_string()).collect())
            .unwrap_or_default();
        (out.status.code(), kinds)
    };
    let (code, kinds) = run(&[]);
    assert_eq!(code, Some(0), "{kinds:?}");
    assert_eq!(kinds, ["\"ClusterTrainingRuntime\"", "\"TrainJob\""]);
    let (code, kinds) = run(&["-R"]);
    assert_eq!(code, Some(1), "{kinds:?}");
    assert_eq!(
        kinds,
        [
            "\"ClusterTrainingRuntime\"",
            "\"TrainJob\"",
            "\"AdmissionReview\""
        ]
    );
}

/// Issue 23: `review` reads a YAML AdmissionReview and answers exactly as for its JSON.
#[test]
fn review_reads_yaml() {
    for case in fixtures::admission_cases() {
        let yaml = serde_saphyr::to_string(&case.request).expect("yaml");
        let mut cmd = binary();
        cmd.args(["review", "--validate", "-f", "-"]);
        if case.dir.join("config.yaml").exists() {
            cmd.arg("--config").arg(case.dir.join("config.yaml"));
        }
        let out = run_with_stdin(cmd, yaml.as_bytes());
        let expected = admission::review(Endpoint::Validate, &case.body, &case.config);
        assert_eq!(
            out.status.code(),
            Some(i32::from(review_exit_code(expected.decision.outcome))),
            "{}: {out:?}",
            case.name
        );
        assert_eq!(out.stdout, expected.body, "{}", case.name);
    }
}

/// Issue 23: an error is printed whole: `review` without a mode names the flags it needs.
#[test]
fn a_missing_argument_is_named() {
    let out = binary()
        .args(["review", "-f", "x.json"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    // clap's own error (issue 47): the arguments, then the usage.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "error: the following required arguments were not provided:\n  <--mutate|--validate>\n"
        ),
        "{err}"
    );
    assert!(
        err.contains("Usage: jobset-inplace review --filename <FILE> <--mutate|--validate>"),
        "{err}"
    );
}

/// Issue 23: the injection config's `imagePullSecrets` in the Kubernetes shape; the injected pod
/// template gets it in that shape.
#[test]
fn image_pull_secrets_in_the_kubernetes_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "imagePullSecrets:\n- name: regcred\n- mirror\n").expect("write");
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let jobset = serde_saphyr::to_string(&case.request["request"]["object"]).expect("yaml");
    let mut cmd = binary();
    cmd.args(["inject", "-f", "-", "--config"]).arg(&config);
    let out = run_with_stdin(cmd, jobset.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let injected: serde_json::Value = serde_saphyr::from_slice(&out.stdout).expect("yaml");
    assert_eq!(
        injected["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["imagePullSecrets"],
        serde_json::json!([{"name": "regcred"}, {"name": "mirror"}])
    );
}

/// Issue 23: kubectl finds the binary as its plugin `kubectl-jobset_inplace` on the PATH and runs
/// it: `kubectl jobset-inplace ...` is the binary under another name.
#[test]
fn kubectl_runs_the_binary_as_its_plugin() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map_or(true, |o| !o.status.success())
    {
        eprintln!(
            "\n!! SKIPPED: kubectl is not installed, so the kubectl plugin was NOT tested.\n"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("kubectl-jobset_inplace");
    std::fs::copy(env!("CARGO_BIN_EXE_jobset-inplace"), &plugin).expect("copy");
    let kubectl_dir = Command::new("sh")
        .args(["-c", "dirname \"$(command -v kubectl)\""])
        .output()
        .expect("runs");
    let path = format!(
        "{}:{}",
        dir.path().display(),
        String::from_utf8_lossy(&kubectl_dir.stdout).trim()
    );
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
            .output()
            .expect("runs kubectl")
    };
    let out = kubectl(&["plugin", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains(&plugin.display().to_string()), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{out:?}"
    );

    let out = kubectl(&["jobset-inplace", "--version"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("jobset-inplace {}", jobset_inplace::cli::VERSION)
    );
    let out = kubectl(&["jobset-inplace", "doctor", "--help"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Usage: kubectl jobset-inplace doctor"),
        "{out:?}"
    );
    // doctor itself runs: without a cluster it says which configuration it could not load.
    let out = kubectl(&["jobset-inplace", "doctor"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains("unrecognized") && !said.contains("unknown command"),
        "{said}"
    );
    assert!(!said.contains("panicked"), "{said}");
}

/// The fields the webhook denies a review's JobSet by (mutate, then validate what it made, as the
/// API server chains them), or none when both allow it.
fn webhook_fields(case: &fixtures::Case) -> (bool, Vec<String>) {
    use base64::Engine;
    let causes = |response: &serde_json::Value| -> Vec<String> {
        response["status"]["details"]["causes"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|c| c["field"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let reply = admission::review(Endpoint::Mutate, &case.body, &case.config);
    let review: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
    let response = &review["response"];
    if response["allowed"] != true {
        return (false, causes(response));
    }
    let mut request = case.request.clone();
    if let Some(patch) = response["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch");
        json_patch::patch(&mut request["request"]["object"], &patch).expect("applies");
    }
    let body = serde_json::to_vec(&request).expect("json");
    let reply = admission::review(Endpoint::Validate, &body, &case.config);
    let review: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
    (
        review["response"]["allowed"] == true,
        causes(&review["response"]),
    )
}

/// Issue 34: `check` (inject, then validate) answers as the webhook does on each of the issue's
/// pod templates: the agent's account named with the token's automounting unset or true, the
/// token volume mounted by a worker, another token projected, a container named like the agent.
#[test]
fn check_agrees_with_the_webhook_on_whose_token_and_whose_name() {
    let cases = [
        "agent-account-named-token-unset",
        "agent-account-deprecated-field-token-unset",
        "agent-account-automounts-token",
        "token-volume-mounted-by-worker",
        "token-projected-for-agent-account",
        "token-volume-name-taken",
        "container-named-like-the-agent",
    ];
    let mut seen = 0;
    for case in fixtures::admission_cases()
        .into_iter()
        .filter(|c| cases.contains(&c.name.as_str()))
    {
        seen += 1;
        let (allowed, fields) = webhook_fields(&case);
        let jobset = serde_saphyr::to_string(&case.request["request"]["object"]).expect("yaml");
        let mut cmd = binary();
        cmd.args(["check", "--output", "json", "-f", "-"]);
        let out = run_with_stdin(cmd, jobset.as_bytes());
        assert_eq!(
            out.status.code(),
            Some(if allowed { 0 } else { 1 }),
            "{}: {out:?}",
            case.name
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let item = &report[0];
        assert_eq!(item["allowed"], allowed, "{}", case.name);
        let got: Vec<String> = item["violations"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(|v| v["field"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(got, fields, "{}", case.name);
    }
    assert_eq!(seen, cases.len());
}

/// A kubeconfig naming a loopback listener nobody answers on: whether anything connected shows
/// whether a command asked the cluster.
struct Listener {
    socket: std::net::TcpListener,
    _dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
}

impl Listener {
    fn new() -> Listener {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        socket.set_nonblocking(true).expect("nonblocking");
        let port = socket.local_addr().expect("addr").port();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  \
                 cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}\n\
                 users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: \
                 {{cluster: c, user: u}}\n"
            ),
        )
        .expect("write");
        Listener {
            socket,
            _dir: dir,
            kubeconfig,
        }
    }

    /// Something connected since the last call.
    fn connected(&self) -> bool {
        let mut any = false;
        while self.socket.accept().is_ok() {
            any = true;
        }
        any
    }
}

/// Issue 36: `inject`, `check` and `review` contact no cluster and say nothing about one, with
/// a kubeconfig naming a listening server or a garbage one; `--protocol auto` asks the cluster.
#[test]
fn the_offline_commands_are_offline() {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let jobset = serde_saphyr::to_string(&case.request["request"]["object"]).expect("yaml");
    let listener = Listener::new();
    let garbage = listener._dir.path().join("garbage");
    std::fs::write(&garbage, "{{{ not a kubeconfig").expect("write");
    let commands: [&[&str]; 3] = [
        &["inject", "-f", "-"],
        &["check", "-f", "-"],
        &["review", "--mutate", "-f", "-"],
    ];
    for kubeconfig in [&listener.kubeconfig, &garbage] {
        for args in commands {
            let mut cmd = binary();
            cmd.env("KUBECONFIG", kubeconfig).args(args);
            let input = if args[0] == "review" {
                case.body.clone()
            } else {
                jobset.clone().into_bytes()
            };
            let out = run_with_stdin(cmd, &input);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
            assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
            assert!(!listener.connected(), "{args:?} contacted the cluster");
        }
    }
    // Asked: it tries the cluster (nobody answers: the default), and says so.
    let mut cmd = binary();
    cmd.env("KUBECONFIG", &listener.kubeconfig)
        .args(["--protocol", "auto", "check", "-f", "-"]);
    let out = run_with_stdin(cmd, jobset.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(listener.connected(), "--protocol auto asked no cluster");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the epoch protocol"),
        "{out:?}"
    );
}

/// Issue 36: `check`'s exit codes: 0 allowed, 1 denied (or warned under --strict), 2 an input
/// or usage error, 3 nothing judged for in-place restart.
#[test]
fn check_exit_codes() {
    let case = fixtures::admission_cases()
        .into_iter()
        .find(|c| c.name == "story1-plain")
        .expect("fixture");
    let object = &case.request["request"]["object"];
    let jobset = serde_saphyr::to_string(object).expect("yaml");
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let ok = write("ok.yaml", &jobset);
    let mut denied = object.clone();
    denied["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 0.into();
    let denied = write(
        "denied.yaml",
        &serde_saphyr::to_string(&denied).expect("yaml"),
    );
    let mut warned = object.clone();
    warned["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        ["image"] = "<CHANGE ME>".into();
    let warned = write(
        "warned.yaml",
        &serde_saphyr::to_string(&warned).expect("yaml"),
    );
    let mut plain = object.clone();
    plain["spec"]["failurePolicy"] = serde_json::json!({"maxRestarts": 1});
    let plain = write(
        "plain.yaml",
        &serde_saphyr::to_string(&plain).expect("yaml"),
    );
    let config_map = write(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
    );
    let bad_yaml = write("bad.yaml", "kind: JobSet\nspec: [\n");
    let not_text = write("bin.yaml", "\u{0}");
    std::fs::write(&not_text, [0xff, 0xfe, 0x00]).expect("write");
    let code = |args: &[&str]| {
        let out = binary().arg("check").args(args).output().expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(code(&["-f", &ok]).0, Some(0));
    assert_eq!(code(&["-f", &ok, "-f", &denied]).0, Some(1));
    assert_eq!(code(&["-f", &warned]).0, Some(0));
    assert_eq!(code(&["--strict", "-f", &warned]).0, Some(1));
    assert_eq!(code(&["--strict", "-f", &ok]).0, Some(0));
    // Not judged: reported as such, and nothing else judged is exit 3.
    let (c, out) = code(&["-f", &plain]);
    assert_eq!(c, Some(3));
    assert!(out.contains("not judged for in-place restart"), "{out}");
    assert_eq!(code(&["--allow-empty", "-f", &plain]).0, Some(0));
    assert_eq!(code(&["-f", &ok, "-f", &config_map]).0, Some(3));
    assert_eq!(code(&["-f", &denied, "-f", &config_map]).0, Some(1));
    assert_eq!(
        code(&["--allow-empty", "-f", &ok, "-f", &config_map]).0,
        Some(0)
    );
    // Input and usage errors.
    for args in [
        vec!["-f", "/nonexistent.yaml"],
        vec!["-f", &bad_yaml],
        vec!["-f", &not_text],
        vec!["-f", &ok, "--output", "xml"],
        vec!["-f", &ok, "--no-such-flag"],
    ] {
        assert_eq!(code(&args).0, Some(2), "{args:?}");
    }
}

/// Issue 36: run as kubectl's plugin, errors say `kubectl jobset-inplace:` (as the docs do);
/// a command-line error is clap's (issue 47), whose usage names the plugin.
#[test]
fn the_plugin_names_itself_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("kubectl-jobset_inplace");
    std::fs::copy(env!("CARGO_BIN_EXE_jobset-inplace"), &plugin).expect("copy");
    let run = |args: &[&str]| {
        let out = Command::new(&plugin)
            .args(args)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["check", "-f", "/nonexistent.yaml"]);
    assert!(err.starts_with("kubectl jobset-inplace: "), "{err}");
    let err = run(&["check", "--no-such-flag"]);
    assert!(
        err.starts_with("error: unexpected argument '--no-such-flag' found\n"),
        "{err}"
    );
    assert!(
        err.contains("Usage: kubectl jobset-inplace check [OPTIONS]"),
        "{err}"
    );
    let out = binary()
        .args(["check", "-f", "/nonexistent.yaml"])
        .output()
        .expect("runs");
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("jobset-inplace: "),
        "{out:?}"
    );
}
