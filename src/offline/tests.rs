use super::check::*;
use super::*;
use crate::protocol::Dialect;

const PLAIN: &str = "\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: js
spec:
  failurePolicy: {maxRestarts: 3, restartStrategy: InPlaceRestart}
  replicatedJobs:
  - name: w
    replicas: 2
    template:
      spec:
        parallelism: 2
        completions: 2
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: worker
              image: train:1
";

#[test]
fn split_keeps_text_and_markers() {
    let docs = split_yaml("a: 1\n---\nb: 2 # keep\n--- # c\n...\n---\n");
    assert_eq!(docs, vec!["a: 1\n", "b: 2 # keep\n", "", ""]);
    let docs = split_yaml("--- {a: 1}\n");
    assert_eq!(docs, vec!["", "{a: 1}\n"]);
    for input in [
        "a: 1\n---\nb: 2 # keep\n--- # c\n...\n---\n",
        "--- {a: 1}",
        "x: |\n  y",
    ] {
        let raw: String = split_yaml_raw(input)
            .into_iter()
            .map(|(raw, _)| raw)
            .collect();
        assert_eq!(raw, input);
    }
}

#[test]
fn inject_prints_untouched_documents_byte_for_byte() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    // No newline at the end of a block scalar, odd markers, a comment-only document, a
    // JobSet that is not an InPlaceRestart one: nothing to inject, so the file comes back.
    let not_ours = "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: r}\n\
                        spec:\n  replicatedJobs: []\n";
    for input in [
        format!(
            "--- # first\n{not_ours}...\n---\n# only a comment\n---\nkind: ConfigMap\ndata:\n  s: |\n    last line"
        ),
        format!("{not_ours}---\nscript: |\n  echo done"),
        "{\"kind\": \"ConfigMap\",   \"data\": {}}".to_owned(),
    ] {
        assert_eq!(inject_text("m", &input, &config).expect("injects"), input);
    }
    // Beside an injected JobSet, the others keep their bytes, the last one its missing
    // newline and its marker's comment.
    let tail = "--- # tail\nkind: ConfigMap\ndata:\n  s: |\n    no newline";
    let input = format!("{PLAIN}{tail}");
    let out = inject_text("m", &input, &config).expect("injects");
    assert!(out.ends_with(tail), "{out}");
    assert_ne!(out, input);
    let input = format!("{tail}\n---\n{PLAIN}");
    let out = inject_text("m", &input, &config).expect("injects");
    assert!(out.starts_with(&format!("{tail}\n---\n")), "{out}");
}

#[test]
fn inject_passes_other_documents_through_untouched() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let cm = "# a comment that survives\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n";
    let input = format!("{cm}---\n{PLAIN}");
    let out = inject_text("m.yaml", &input, &config).expect("injects");
    assert!(out.starts_with(cm), "{out}");
    let (_, docs) = parse_documents("out", &out).expect("parses");
    assert_eq!(docs.len(), 2);
    let js = &docs[1].value;
    assert_eq!(
        js.pointer("/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0/name"),
        Some(&Value::from("jobset-inplace-agent"))
    );
    // Injecting the output again changes nothing.
    assert_eq!(inject_text("out", &out, &config).expect("again"), out);
}

#[test]
fn inject_json_and_lists() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let js: Value = crate::settings::from_yaml(PLAIN).expect("yaml");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [js]});
    let out = inject_text("l.json", &list.to_string(), &config).expect("injects");
    let (format, docs) = parse_documents("out", &out).expect("parses");
    assert_eq!(format, Format::Json);
    assert!(
        docs[0]
            .value
            .pointer("/items/0/spec/replicatedJobs/0/template/spec/backoffLimit")
            .is_some()
    );
}

/// Issue 11: what cannot be read is not "ok".
#[test]
fn check_denies_what_it_cannot_read() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    for (edit, path, expected) in [
            (
                PLAIN.replace("            containers:\n            - name: worker\n              image: train:1\n", "            containers: worker\n"),
                "spec.replicatedJobs[0].template.spec.template.spec.containers",
                "must be an array, is a string",
            ),
            (
                "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\nspec:\n  failurePolicy: {maxRestarts: 3, restartStrategy: InPlaceRestart}\n  replicatedJobs: {w: {}}\n".to_owned(),
                "spec.replicatedJobs",
                "must be an array, is an object",
            ),
        ] {
            let checks = check_text("m.yaml", &edit, &config, true).expect("checks");
            assert!(!checks[0].allowed, "{}", checks[0].render());
            assert!(
                checks[0]
                    .violations
                    .iter()
                    .any(|v| v.path == path && v.message.contains(expected)),
                "{}",
                checks[0].render()
            );
        }
}

/// `check` and `inject` answer as the webhook: a barrier port taken by the worker moves
/// the injected agent; no port left denies the JobSet with the pod template's path.
#[test]
fn check_and_inject_move_the_barrier_or_deny_as_the_webhook_does() {
    let mut config = InjectionConfig::defaults(Dialect::Epoch);
    let taken = PLAIN.replace(
        "              image: train:1\n",
        "              image: train:1\n              ports: [{containerPort: 8080}]\n",
    );
    let checks = check_text("m.yaml", &taken, &config, true).expect("checks");
    assert!(checks[0].allowed, "{}", checks[0].render());
    let out = inject_text("m.yaml", &taken, &config).expect("injects");
    let (_, docs) = parse_documents("out", &out).expect("parses");
    let agent = docs[0]
        .value
        .pointer("/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0")
        .cloned()
        .unwrap_or_default();
    assert_eq!(agent["startupProbe"]["httpGet"]["port"], 18080);
    assert!(
        agent["env"].as_array().is_some_and(
            |e| e.contains(&serde_json::json!({"name": "BARRIER_PORT", "value": "18080"}))
        ),
        "{agent}"
    );

    config.barrier_fallback_ports = crate::admission::config::PortRange::NONE;
    let checks = check_text("m.yaml", &taken, &config, true).expect("checks");
    assert!(!checks[0].allowed);
    let text = checks[0].render();
    assert!(
        text.contains(
            "denied: spec.replicatedJobs[0].template.spec.template.spec.initContainers: no \
                 port for the injected agent's barrier"
        ),
        "{text}"
    );
    let err = inject_text("m.yaml", &taken, &config)
        .expect_err("denied")
        .to_string();
    assert!(
        err.contains("cannot inject js") && err.contains("barrier"),
        "{err}"
    );
}

#[test]
fn check_reports_paths() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let checks = check_text("m.yaml", PLAIN, &config, true).expect("checks");
    assert_eq!(checks.len(), 1);
    assert!(checks[0].allowed, "{}", checks[0].render());
    let checks = check_text("m.yaml", PLAIN, &config, false).expect("checks");
    assert!(!checks[0].allowed);
    let text = checks[0].render();
    assert!(
        text.contains("denied: spec.replicatedJobs[0].template.spec.backoffLimit"),
        "{text}"
    );
    assert!(text.contains("initContainers"), "{text}");
}

#[test]
fn check_json_has_an_object_per_jobset_with_field_paths() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let input = format!("kind: ConfigMap\n---\n{PLAIN}");
    let checks = check_text("m.yaml", &input, &config, false).expect("checks");
    let json = checks[0].to_json();
    assert_eq!(json["file"], "m.yaml");
    assert_eq!(json["document"], 2);
    assert_eq!(json["object"], "js");
    assert_eq!(json["allowed"], false);
    let fields: Vec<&str> = json["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .filter_map(|v| v["field"].as_str())
        .collect();
    assert!(
        fields.contains(&"spec.replicatedJobs[0].template.spec.backoffLimit"),
        "{fields:?}"
    );
    assert!(json["violations"][0]["message"].is_string());
    assert!(json["warnings"].is_array());
}

/// Issue 23: a runtime's JobSet template, a TrainJob with its runtime, an AdmissionReview are
/// judged, their paths in the document that holds them.
#[test]
fn check_judges_the_jobsets_inside_other_objects() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let body: String = PLAIN
        .lines()
        .skip_while(|l| !l.starts_with("spec:"))
        .skip(1)
        .map(|l| format!("    {l}\n"))
        .collect::<String>()
        .replace("- name: w\n", "- name: node\n")
        .replace("- name: worker\n", "- name: node\n")
        // Trainer's trainer step: the TrainJob's image goes to its `node` container.
        .replace(
            "        template:\n          spec:\n",
            "        template:\n          metadata: {labels: \
                 {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}\n          spec:\n",
        );
    let runtime = format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n\
             metadata: {{name: rt}}\nspec:\n  template:\n    spec:\n{}",
        body.replace(
            "            parallelism: 2\n",
            "            backoffLimit: 0\n            parallelism: 2\n"
        )
    );
    let checks = check_text("rt.yaml", &runtime, &config, true).expect("checks");
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert_eq!(checks[0].kind, "ClusterTrainingRuntime");
    assert_eq!(checks[0].object, "rt");
    assert!(!checks[0].allowed, "{}", checks[0].render());
    assert!(
        checks[0]
            .violations
            .iter()
            .any(|v| v.path == "spec.template.spec.replicatedJobs[0].template.spec.backoffLimit"),
        "{}",
        checks[0].render()
    );

    // A TrainJob whose runtime is in another input: judged as the JobSet Trainer makes.
    let trainjob = "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n\
                        metadata: {name: tj, namespace: ns}\n\
                        spec:\n  runtimeRef: {name: rt}\n  trainer: {image: 'REPLACE_ME'}\n";
    let inputs = [
        ("tj.yaml".to_owned(), trainjob.to_owned()),
        ("rt.yaml".to_owned(), runtime.clone()),
    ];
    let report = check_inputs(&inputs, &config, true).expect("checks");
    let tj = report
        .checks
        .iter()
        .find(|c| c.kind == "TrainJob")
        .expect("judged");
    assert_eq!((tj.file.as_str(), tj.object.as_str()), ("tj.yaml", "ns/tj"));
    assert_eq!(
        tj.runtime.as_ref().map(|r| r.file.as_str()),
        Some("rt.yaml")
    );
    assert!(!tj.allowed);
    assert!(
        tj.warnings
            .iter()
            .any(|w| w.contains("REPLACE_ME") && w.contains("placeholder")),
        "{}",
        tj.render()
    );
    // Without its runtime: not judged, and said so.
    let report = check_inputs(&inputs[..1], &config, true).expect("checks");
    assert!(report.checks.is_empty());
    assert!(
        report.notes[0].contains("ClusterTrainingRuntime/rt is not in the input"),
        "{:?}",
        report.notes
    );

    // An AdmissionReview: the JobSet inside.
    let js: Value = crate::settings::from_yaml(PLAIN).expect("yaml");
    let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "CREATE", "object": js}});
    let checks = check_text("r.json", &review.to_string(), &config, false).expect("checks");
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].kind, "AdmissionReview");
    assert!(
        checks[0]
            .violations
            .iter()
            .any(|v| v.path == "request.object.spec.replicatedJobs[0].template.spec.backoffLimit"),
        "{}",
        checks[0].render()
    );
    assert_eq!(checks[0].to_json()["kind"], "AdmissionReview");
}

#[test]
fn placeholder_images() {
    for image in [
        "<CHANGE ME>",
        "registry/<image>:1",
        "REPLACE_ME",
        "my-registry/app:TODO",
        "change-me:1",
        "example.com/team/train:1",
        "registry.example.org:5000/train",
        "${IMAGE}",
        "{{ .Values.image }}",
        "fixme",
    ] {
        assert!(image_placeholder(image), "{image}");
    }
    for image in [
        "pytorch/pytorch:2.7.1",
        "ghcr.io/todo-app/train:1",
        "example/train:1",
        "myexample.com/train:1",
        "train:1",
        "registry.k8s.io/jobset/in-place-restart-agent:v0.11.0",
    ] {
        assert!(!image_placeholder(image), "{image}");
    }
}

/// Issue 23, 36: JobSet's own agent under `epoch`: the webhook admits it with a warning
/// that its group restarts never complete if it runs JobSet's image, and `check` says what
/// the webhook says (allowed, that warning; `--strict` fails on warnings); under `attempt`
/// no such warning.
#[test]
fn jobsets_own_agent_under_epoch_is_the_webhooks_warning() {
    let own = PLAIN.replace(
            "            containers:\n",
            "            initContainers:\n            - {name: in-place-restart-agent, image: agent:1, restartPolicy: Always}\n            containers:\n",
        );
    let js: Value = crate::settings::from_yaml(&own).expect("yaml");
    assert!(authoring_findings(&js, "").is_empty());
    let warned = |dialect: Dialect| {
        let config = InjectionConfig::defaults(dialect);
        let checks = check_text("m.yaml", &own, &config, true).expect("checks");
        let c = &checks[0];
        assert!(c.judged && c.allowed, "{}", c.render());
        c.warnings
            .iter()
            .any(|w| w.contains("speaks the attempt dialect only"))
    };
    assert!(warned(Dialect::Epoch));
    assert!(!warned(Dialect::Attempt));
}

/// Issue 36: a JobSet that does not ask for in-place restart is reported as not judged.
#[test]
fn a_jobset_without_in_place_restart_is_not_judged() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let plain = PLAIN.replace(", restartStrategy: InPlaceRestart", "");
    let checks = check_text("m.yaml", &plain, &config, true).expect("checks");
    assert_eq!(checks.len(), 1);
    assert!(!checks[0].judged && checks[0].allowed);
    assert!(
        checks[0]
            .render()
            .contains("not judged for in-place restart"),
        "{}",
        checks[0].render()
    );
    assert_eq!(checks[0].to_json()["judged"], false);
    let checks = check_text("m.yaml", PLAIN, &config, true).expect("checks");
    assert_eq!(checks[0].to_json()["judged"], true);
    assert!(
        checks[0].render().ends_with(": ok\n"),
        "{}",
        checks[0].render()
    );
}

#[test]
fn exit_codes() {
    assert_eq!(check_exit_code(false, false), 0);
    assert_eq!(check_exit_code(true, false), 1);
    assert_eq!(check_exit_code(true, true), 1);
    assert_eq!(check_exit_code(false, true), 3);
    use admission::ReviewOutcome;
    assert_eq!(
        [
            ReviewOutcome::Allowed,
            ReviewOutcome::Patched,
            ReviewOutcome::Denied,
            ReviewOutcome::Error
        ]
        .map(review_exit_code),
        [0, 0, 1, 2]
    );
    let read = Error::Read {
        path: "x".into(),
        source: std::io::Error::other("gone"),
    };
    assert_eq!(read.exit_code(), 2);
    let denied = Error::Denied {
        object: "js".into(),
        message: "no".into(),
    };
    assert_eq!(denied.exit_code(), 1);
}

#[test]
fn review_reads_yaml() {
    let json = br#"{"kind": "AdmissionReview"}"#.to_vec();
    assert_eq!(review_body(json.clone()), json);
    assert_eq!(
        review_body(b"kind: AdmissionReview\nrequest: {uid: u}\n".to_vec()),
        br#"{"kind":"AdmissionReview","request":{"uid":"u"}}"#.to_vec()
    );
    // Not an object: left for the server to refuse.
    assert_eq!(review_body(b"not json".to_vec()), b"not json".to_vec());
}

#[test]
fn directories_list_their_manifests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("sub/deeper")).expect("mkdir");
    for f in [
        "b.yaml",
        "a.yml",
        "c.json",
        "notes.txt",
        "sub/d.yaml",
        "sub/deeper/e.yaml",
    ] {
        std::fs::write(root.join(f), "").expect("write");
    }
    let names = |recursive| -> Vec<String> {
        expand_input(&root.display().to_string(), recursive)
            .expect("lists")
            .into_iter()
            .map(|p| p.trim_start_matches(&root.display().to_string()).to_owned())
            .collect()
    };
    assert_eq!(names(false), ["/a.yml", "/b.yaml", "/c.json"]);
    assert_eq!(
        names(true),
        [
            "/a.yml",
            "/b.yaml",
            "/c.json",
            "/sub/d.yaml",
            "/sub/deeper/e.yaml"
        ]
    );
    assert_eq!(expand_input("-", true).expect("stdin"), ["-"]);
}

#[test]
fn bad_yaml_names_file_and_document() {
    let config = InjectionConfig::defaults(Dialect::Epoch);
    let err = inject_text("m.yaml", "a: 1\n---\nb: [\n", &config)
        .expect_err("bad")
        .to_string();
    assert!(err.starts_with("m.yaml: document 2:"), "{err}");
}
