//! One source per manifest: the objects of `deploy/` that the chart also renders are generated
//! from the chart by `scripts/render-deploy.sh` (`helm template` of one template with fixed
//! values, Helm's own labels and checksum taken out). Rendering them again changes nothing, and
//! no file of `deploy/` that a kustomization lists as a resource holds, by hand, an object the
//! chart renders.

use super::*;

/// The first line of every generated file (scripts/render-deploy.sh writes it).
const GENERATED: &str = "# Generated from charts/jobset-inplace/templates/";

/// Where `got` (the tracked file) first differs from `want` (the rendering): the 1-based line
/// and both lines, or `None` when the two are the same bytes.
fn first_difference(want: &str, got: &str) -> Option<String> {
    if want == got {
        return None;
    }
    let mut want_lines = want.split_inclusive('\n');
    let mut got_lines = got.split_inclusive('\n');
    let mut line = 1;
    loop {
        match (want_lines.next(), got_lines.next()) {
            (Some(w), Some(g)) if w == g => line += 1,
            (w, g) => {
                let show = |l: Option<&str>| {
                    l.map_or_else(|| "(end of file)".to_owned(), |l| format!("{l:?}"))
                };
                return Some(format!(
                    "line {line}: rendered {}, tracked {}",
                    show(w),
                    show(g)
                ));
            }
        }
    }
}

/// The generated files, as `scripts/render-deploy.sh --list` names them (relative to deploy/).
fn generated_files() -> Vec<String> {
    let out = run_bounded(
        Command::new(repo().join("scripts/render-deploy.sh")).arg("--list"),
        RUN_LIMIT,
    )
    .unwrap_or_else(|e| panic!("scripts/render-deploy.sh --list: {e}"));
    out.lines().map(str::to_owned).collect()
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path, prefix: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let rel = prefix.join(path.file_name().expect("a name"));
        if path.is_dir() {
            files_under(&path, &rel, out);
        } else {
            out.push(rel);
        }
    }
}

/// The problems of a tracked tree against its rendering: each listed file that differs (its
/// first differing line), and each tracked file that says it is generated but is not listed.
fn render_problems(tracked: &Path, rendered: &Path, listed: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for path in listed {
        let want = std::fs::read_to_string(rendered.join(path))
            .unwrap_or_else(|e| panic!("rendered {path}: {e}"));
        match std::fs::read_to_string(tracked.join(path)) {
            Ok(got) => {
                if let Some(d) = first_difference(&want, &got) {
                    problems.push(format!("deploy/{path}: {d}"));
                }
            }
            Err(e) => problems.push(format!("deploy/{path}: not there ({e})")),
        }
    }
    let mut all = Vec::new();
    files_under(tracked, Path::new(""), &mut all);
    for rel in all {
        let text = std::fs::read_to_string(tracked.join(&rel)).unwrap_or_default();
        let rel = rel.display().to_string();
        if text.starts_with(GENERATED) && !listed.contains(&rel) {
            problems.push(format!(
                "deploy/{rel}: says it is generated, but scripts/render-deploy.sh does not render it"
            ));
        }
    }
    problems
}

#[test]
fn deploy_is_what_the_chart_renders() {
    let listed = generated_files();
    // The objects the chart and deploy/ share: the base's and the whole-object components'.
    for want in [
        "base/webhook.yaml",
        "base/reconciler.yaml",
        "base/config.yaml",
        "components/self-signed/rbac.yaml",
        "components/monitoring/prometheusrule.yaml",
    ] {
        assert!(listed.iter().any(|l| l == want), "{want} is not rendered");
    }
    let Some(helm) = helm() else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    run_bounded(
        Command::new(repo().join("scripts/render-deploy.sh"))
            .arg("--out")
            .arg(dir.path())
            .env("HELM", &helm),
        RUN_LIMIT,
    )
    .unwrap_or_else(|e| panic!("scripts/render-deploy.sh: {e}"));
    let problems = render_problems(&repo().join("deploy"), dir.path(), &listed);
    assert!(
        problems.is_empty(),
        "deploy/ is not what charts/jobset-inplace renders (edit the chart, not deploy/, then run \
         scripts/render-deploy.sh):\n{}",
        problems.join("\n")
    );
}

#[test]
fn first_difference_names_the_line() {
    assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
    assert_eq!(
        first_difference("a\nb\nc\n", "a\nB\nc\n").as_deref(),
        Some("line 2: rendered \"b\\n\", tracked \"B\\n\"")
    );
    assert_eq!(
        first_difference("a\nb\n", "a\n").as_deref(),
        Some("line 2: rendered \"b\\n\", tracked (end of file)")
    );
    // A missing final newline is a difference too.
    assert!(first_difference("a\n", "a").is_some());
}

/// A generated file edited by hand, and a file that claims to be generated without being
/// rendered, both fail; an untouched tree passes.
#[test]
fn a_hand_edit_of_a_generated_file_fails() {
    let rendered = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let tracked = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let text = format!("{GENERATED}x.yaml (values: the defaults) by\nkind: Service\n");
    for d in [rendered.path(), tracked.path()] {
        std::fs::create_dir_all(d.join("base")).expect("mkdir");
        std::fs::write(d.join("base/x.yaml"), &text).expect("write");
        std::fs::write(d.join("base/kustomization.yaml"), "resources: [x.yaml]\n").expect("write");
    }
    let listed = vec!["base/x.yaml".to_owned()];
    assert!(render_problems(tracked.path(), rendered.path(), &listed).is_empty());
    std::fs::write(
        tracked.path().join("base/x.yaml"),
        text.replace("Service", "ConfigMap"),
    )
    .expect("write");
    let problems = render_problems(tracked.path(), rendered.path(), &listed);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("deploy/base/x.yaml: line 2:"),
        "{problems:?}"
    );
    std::fs::write(tracked.path().join("base/x.yaml"), &text).expect("write");
    std::fs::write(tracked.path().join("base/y.yaml"), &text).expect("write");
    let problems = render_problems(tracked.path(), rendered.path(), &listed);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("deploy/base/y.yaml: says it is generated"));
    // Only the hand-written resources count as written by hand.
    assert!(hand_written_objects(tracked.path()).is_empty());
    std::fs::write(
        tracked.path().join("base/z.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n",
    )
    .expect("write");
    std::fs::write(
        tracked.path().join("base/kustomization.yaml"),
        "resources: [x.yaml, z.yaml]\n",
    )
    .expect("write");
    let hand = hand_written_objects(tracked.path());
    assert_eq!(hand.len(), 1, "{hand:?}");
    assert_eq!((hand[0].1.as_str(), hand[0].2.as_str()), ("Service", "s"));
}

/// The (kind, name) of every object in the files deploy/'s kustomizations list as `resources:`
/// that are not generated: written by hand, so none may be an object the chart renders.
fn hand_written_objects(deploy: &Path) -> Vec<(String, String, String)> {
    let mut files = Vec::new();
    files_under(deploy, Path::new(""), &mut files);
    let mut out = Vec::new();
    for k in files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "kustomization.yaml"))
    {
        let dir = deploy.join(k.parent().expect("in a directory"));
        let text = std::fs::read_to_string(deploy.join(k)).expect("kustomization");
        let kustomization: Value = serde_saphyr::from_str(&text).expect("kustomization YAML");
        for resource in strings(&kustomization["resources"]) {
            let path = dir.join(&resource);
            if !path.is_file() {
                continue; // another kustomization, whose own resources are checked
            }
            let text = std::fs::read_to_string(&path).expect("resource");
            if text.starts_with(GENERATED) {
                continue;
            }
            for o in parse_yaml_stream(&text, &path.display().to_string()) {
                out.push((
                    path.display().to_string(),
                    o["kind"].as_str().unwrap_or_default().to_owned(),
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ));
            }
        }
    }
    out
}

#[test]
fn no_object_of_the_chart_is_written_by_hand_in_deploy() {
    let hand = hand_written_objects(&repo().join("deploy"));
    assert!(
        hand.iter().any(|(_, kind, _)| kind == "Namespace"),
        "the namespace is deploy/'s own: {hand:?}"
    );
    let Some(helm) = helm() else { return };
    let mut chart = BTreeSet::new();
    for sets in [
        vec![
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.dashboard.enabled=true",
            "networkPolicy.enabled=true",
        ],
        vec!["dialect=jobset-native", "certificates=cert-manager"],
    ] {
        for o in template(&helm, &sets) {
            chart.insert((
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ));
        }
    }
    let twice: Vec<String> = hand
        .iter()
        .filter(|(_, kind, name)| chart.contains(&(kind.clone(), name.clone())))
        .map(|(file, kind, name)| format!("{file}: {kind} {name}"))
        .collect();
    assert!(
        twice.is_empty(),
        "objects written by hand in deploy/ that the chart renders (render them with \
         scripts/render-deploy.sh instead):\n{}",
        twice.join("\n")
    );
}
