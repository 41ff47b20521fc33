//! The files of src/admission/ in layers, no circle (issue 35).

use super::*;

// `no_two_files_of_one_folder_import_each_other` reads `super::<file>` paths only, so it misses
// the grouped imports (`use super::{mutate, validate}`) that most of src/admission/ writes. Here
// every form is read, and the files of src/admission/ have layers: a file imports files of its
// own layer or below, never above, and no two files import each other, directly or through
// others. Items of `mod.rs` (`Violation`, `Validation`, `Endpoint`...) are the folder's own and
// are no file's. Only the code before a file's `#[cfg(test)]` counts (tests may reach anywhere).

/// The layers of src/admission/, lowest first: (layer, its files).
const ADMISSION_LAYERS: [(u32, &[&str]); 5] = [
    // Knows no JobSet: the lenient reader, the JSON Patch writer, the rules as values, the
    // injection config, the warnings' bounds.
    (0, &["config", "lenient", "patch", "rule", "warnings"]),
    // Reads a JobSet: its views, its replicatedJobs as written, its pod templates, the token
    // volume a view is compared with.
    (1, &["pod", "raw", "token", "view"]),
    // The pieces the rules share: the agent's spec, the restored injection, the workers' rule,
    // who holds the agent's token.
    (2, &["account", "restore", "sidecar", "worker"]),
    // The rules: validation, and the injection (which reads validation's Job defaults).
    (3, &["mutate", "validate"]),
    // The one entry: the AdmissionReview, its decision and its reply.
    (4, &["review"]),
];

/// The sibling modules `code` imports as `<prefix><name>` or `<prefix>{<name>, ...}` (nested
/// groups read to their first name), among `siblings`.
fn imported_siblings(code: &str, prefix: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        let names = if let Some(group) = rest.strip_prefix('{') {
            // The top-level entries of the group, up to its closing brace.
            let mut depth = 0usize;
            let mut entries = vec![String::new()];
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        entries.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                if let Some(last) = entries.last_mut() {
                    last.push(c);
                }
            }
            entries.iter().map(|e| ident(e)).collect()
        } else {
            vec![ident(rest)]
        };
        out.extend(names.into_iter().filter(|n| siblings.contains(n)));
    }
    out
}

/// A folder's files (no `mod.rs`, no `tests.rs`, no subfolder) to the sibling files their code
/// before `#[cfg(test)]` imports (`super::`, `crate::<folder path>::`, grouped or not).
fn folder_imports(folder: &str) -> BTreeMap<String, BTreeSet<String>> {
    let dir = src().join(folder);
    let files: BTreeMap<String, PathBuf> = std::fs::read_dir(&dir)
        .expect("folder")
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let stem = path.file_stem()?.to_str()?.to_owned();
            (path.extension().is_some_and(|x| x == "rs") && stem != "mod" && stem != "tests")
                .then_some((stem, path))
        })
        .collect();
    let siblings: BTreeSet<String> = files.keys().cloned().collect();
    let crate_prefix = format!("crate::{}::", folder.replace('/', "::"));
    files
        .iter()
        .map(|(stem, path)| {
            let text = std::fs::read_to_string(path).expect("read");
            let code: String = text
                .lines()
                .take_while(|l| !l.starts_with("#[cfg(test)]"))
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            let mut used = imported_siblings(&code, "super::", &siblings);
            used.extend(imported_siblings(&code, &crate_prefix, &siblings));
            used.remove(stem);
            (stem.clone(), used)
        })
        .collect()
}

/// What breaks the layering of `graph` (`layers`: file to layer): files with no layer, layers
/// naming no file, imports that run up, a circle.
fn layering_problems(
    graph: &BTreeMap<String, BTreeSet<String>>,
    layers: &BTreeMap<String, u32>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for file in graph.keys().filter(|f| !layers.contains_key(*f)) {
        problems.push(format!("{file} has no layer"));
    }
    for file in layers.keys().filter(|f| !graph.contains_key(*f)) {
        problems.push(format!("{file} has a layer but is no file"));
    }
    for (from, to) in graph {
        for target in to {
            if let (Some(a), Some(b)) = (layers.get(from), layers.get(target))
                && b > a
            {
                problems.push(format!("{from} (layer {a}) imports {target} (layer {b})"));
            }
        }
    }
    if let Some(found) = circle(graph) {
        problems.push(format!("a circle of imports: {found:?}"));
    }
    problems
}

fn admission_layers() -> BTreeMap<String, u32> {
    ADMISSION_LAYERS
        .iter()
        .flat_map(|(layer, files)| files.iter().map(move |f| ((*f).to_owned(), *layer)))
        .collect()
}

#[test]
fn the_files_of_admission_are_in_layers_with_no_circle() {
    let graph = folder_imports("admission");
    assert!(
        graph
            .get("review")
            .is_some_and(|to| to.contains("mutate") && to.contains("validate")),
        "the grouped imports were read: {graph:#?}"
    );
    let problems = layering_problems(&graph, &admission_layers());
    assert!(
        problems.is_empty(),
        "src/admission/ against ADMISSION_LAYERS (tests/it/architecture/): {problems:#?}\n{graph:#?}"
    );
}

/// The reader and the check on synthetic input: grouped and nested imports are read, and a
/// circle, an import up a layer and a file with no layer are each found.
#[test]
fn the_admission_layer_check_sees_what_it_looks_for() {
    let siblings: BTreeSet<String> = ["a", "b", "c", "d", "e"].map(str::to_owned).into();
    let code = "use super::{\n    a::{X, y::Z},\n    Violation,\n    b,\n};\nuse super::c::W;\nlet v = crate::admission::d::f();\nuse other::e;";
    let mut read = imported_siblings(code, "super::", &siblings);
    read.extend(imported_siblings(code, "crate::admission::", &siblings));
    assert_eq!(read, ["a", "b", "c", "d"].map(str::to_owned).into());

    let graph = |edges: &[(&str, &[&str])]| -> BTreeMap<String, BTreeSet<String>> {
        edges
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    };
    let layers: BTreeMap<String, u32> = [("low", 0), ("mid", 1), ("mid2", 1), ("top", 2)]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
    let good = graph(&[
        ("low", &[]),
        ("mid", &["low", "mid2"]),
        ("mid2", &[]),
        ("top", &["mid"]),
    ]);
    assert_eq!(layering_problems(&good, &layers), Vec::<String>::new());
    let circle = graph(&[
        ("low", &[]),
        ("mid", &["mid2"]),
        ("mid2", &["mid"]),
        ("top", &[]),
    ]);
    let found = layering_problems(&circle, &layers);
    assert!(found.iter().any(|p| p.starts_with("a circle")), "{found:?}");
    let up = graph(&[("low", &["top"]), ("mid", &[]), ("mid2", &[]), ("top", &[])]);
    let found = layering_problems(&up, &layers);
    assert!(found.iter().any(|p| p.contains("imports top")), "{found:?}");
    let unlayered = graph(&[
        ("low", &[]),
        ("mid", &[]),
        ("mid2", &[]),
        ("top", &[]),
        ("new", &[]),
    ]);
    let found = layering_problems(&unlayered, &layers);
    assert_eq!(found, vec!["new has no layer".to_owned()]);
}
