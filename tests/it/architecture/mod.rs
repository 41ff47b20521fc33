//! docs/architecture.md against the tree: its module table ("Layers") lists every top-level
//! module of `src/` and no other, with its layer; no import runs from a lower layer up to a
//! higher one, and no two modules import each other, directly or through others, nor two files
//! of one folder (`super::<file>` or `crate::<folder>::<file>` between siblings); every file of
//! `src/` is named on the page, and every `*.rs` file the page names exists; no file of `src/` has
//! over about 800 lines of code before its tests.
//!
//! Imports are read as text: every `crate::<module>` path outside comments, in the files of a
//! module (`src/<module>.rs` or `src/<module>/`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn doc() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).expect("architecture.md")
}

/// The module table: module name (no `.rs`, no `/`) to its layer.
fn layers(doc: &str) -> BTreeMap<String, u32> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Layers"))
        .expect("a \"Layers\" section");
    let mut out = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| `name` | N label | what |" splits into ["", "`name`", "N label", "what", ""].
        let [_, name, layer, ..] = cells.as_slice() else {
            continue;
        };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            continue;
        };
        let layer: u32 = layer
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no layer number in {line:?}"));
        let name = name.trim_end_matches('/').trim_end_matches(".rs");
        assert!(
            out.insert(name.to_owned(), layer).is_none(),
            "{name} listed twice"
        );
    }
    out
}

fn rs_files(dir: &Path) -> Vec<PathBuf> {
    files_with_extension(dir, "rs")
}

/// Every file under `dir`, at any depth, whose extension is `extension`, sorted.
fn files_with_extension(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == extension) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn src() -> PathBuf {
    Path::new(ROOT).join("src")
}

/// The top-level modules of `src/`: its `*.rs` files and its folders.
fn modules() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .expect("src")
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let name = path.file_name()?.to_str()?.to_owned();
            if path.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs").map(str::to_owned)
            }
        })
        .collect()
}

/// Module to the other top-level modules its files import (`crate::<module>` outside comments).
fn imports(modules: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rs_files(&src()) {
        let rel = file.strip_prefix(src()).expect("under src");
        let first = rel.iter().next().and_then(|c| c.to_str()).expect("name");
        let module = first.trim_end_matches(".rs").to_owned();
        let text = std::fs::read_to_string(&file).expect("read");
        let used = out.entry(module.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != module && modules.contains(&name) {
                    used.insert(name);
                }
            }
        }
    }
    out
}

/// The modules of one circle of `graph`, if any (depth-first search).
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Within each folder of `src/`: a file (not `mod.rs`) to the sibling files or folders it imports,
/// as `super::<sibling>` or `crate::<folder path>::<sibling>` outside comments. Keys are paths
/// relative to `src/` without `.rs` (`inspect/doctor`).
fn sibling_imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rs_files(&src()) {
        let rel = file.strip_prefix(src()).expect("under src");
        let Some(dir) = rel.parent().filter(|d| !d.as_os_str().is_empty()) else {
            continue;
        };
        let stem = rel.file_stem().and_then(|s| s.to_str()).expect("name");
        if stem == "mod" {
            continue;
        }
        let dir_path = dir.to_str().expect("utf-8").replace('\\', "/");
        let siblings: BTreeSet<String> = std::fs::read_dir(src().join(dir))
            .expect("folder")
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let name = name.strip_suffix(".rs").unwrap_or(&name).to_owned();
                (name != "mod" && name != stem).then_some(name)
            })
            .collect();
        let prefixes = [
            "super::".to_owned(),
            format!("crate::{}::", dir_path.replace('/', "::")),
        ];
        let key = format!("{dir_path}/{stem}");
        let used = out.entry(key).or_default();
        let text = std::fs::read_to_string(&file).expect("read");
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            for prefix in &prefixes {
                for (at, _) in code.match_indices(prefix.as_str()) {
                    // `super::` inside a longer path (`crate::x::super::`) does not occur.
                    let name: String = code[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if siblings.contains(&name) {
                        used.insert(format!("{dir_path}/{name}"));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn the_module_table_lists_every_module_of_src_and_no_other() {
    let listed: BTreeSet<String> = layers(&doc()).into_keys().collect();
    let present = modules();
    let missing: Vec<_> = present.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&present).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/architecture.md's module table: not listed {missing:?}; listed but gone {gone:?}"
    );
}

#[test]
fn no_import_runs_up_a_layer_and_no_module_is_in_a_circle() {
    let layers = layers(&doc());
    let graph = imports(&modules());
    let mut up = Vec::new();
    for (from, to) in &graph {
        for target in to {
            if let (Some(a), Some(b)) = (layers.get(from), layers.get(target))
                && b > a
            {
                up.push(format!("{from} (layer {a}) imports {target} (layer {b})"));
            }
        }
    }
    assert!(up.is_empty(), "imports that run up: {up:#?}");
    assert_eq!(circle(&graph), None, "a circle of imports");
}

#[test]
fn every_file_is_named_and_every_named_file_exists() {
    let doc = doc();
    let named: BTreeSet<&str> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.ends_with(".rs") && !t.contains(' '))
        .collect();
    let relative = |base: &Path, files: Vec<PathBuf>| -> Vec<String> {
        files
            .iter()
            .filter_map(|f| f.strip_prefix(base).ok()?.to_str().map(str::to_owned))
            .collect()
    };
    let src_files = relative(&src(), rs_files(&src()));
    // `a/b.rs` is named by `b.rs`, `a/b.rs` or `src/a/b.rs`.
    let names = |file: &str, token: &str| {
        let token = token.trim_start_matches("src/");
        file == token || file.ends_with(&format!("/{token}"))
    };
    let unnamed: Vec<_> = src_files
        .iter()
        .filter(|f| !named.iter().any(|t| names(f, t)))
        .collect();
    assert!(
        unnamed.is_empty(),
        "files of src/ named nowhere in docs/architecture.md: {unnamed:?}"
    );
    // What the page names may also be a file of the test kit, or of tests/ or benches/.
    let root = Path::new(ROOT);
    let mut known = src_files.clone();
    known.extend(relative(
        &root.join("testkit/src"),
        rs_files(&root.join("testkit/src")),
    ));
    for dir in ["tests", "benches", "testkit/src"] {
        known.extend(relative(root, rs_files(&root.join(dir))));
    }
    let gone: Vec<_> = named
        .iter()
        .filter(|t| !known.iter().any(|f| names(f, t)))
        .collect();
    assert!(
        gone.is_empty(),
        "files docs/architecture.md names that do not exist: {gone:?}"
    );
}

/// The checks themselves: a circle is found, a table row is read.
#[test]
fn the_checks_see_what_they_look_for() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circle(&graph),
        Some(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()])
    );
    let table = "x\n## Layers\n\n| Module | Layer | What |\n|---|---|---|\n| `web/` | 3 serve | w |\n| `p.rs` | 0 base | p |\n## Next\n";
    let read = layers(table);
    assert_eq!(read.get("web"), Some(&3));
    assert_eq!(read.get("p"), Some(&0));
    assert_eq!(read.len(), 2);
}

#[test]
fn no_two_files_of_one_folder_import_each_other() {
    let graph = sibling_imports();
    assert!(
        graph.values().any(|to| !to.is_empty()),
        "sibling imports were found at all: {graph:#?}"
    );
    assert_eq!(
        circle(&graph),
        None,
        "files of one folder in a circle of imports (move what both need below them)"
    );
}

/// The house's rule for its rooms: no file of `src/` over about 800 lines that is not mostly
/// tests. Counted up to the file's `#[cfg(test)]` module (the tests beside the code are free).
const MOST_CODE_LINES: usize = 850;

#[test]
fn no_file_of_src_has_over_about_800_lines_of_code() {
    let big: Vec<String> = rs_files(&src())
        .into_iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(&file).expect("read");
            let code = text
                .lines()
                .take_while(|l| !l.starts_with("#[cfg(test)]"))
                .count();
            (code > MOST_CODE_LINES).then(|| format!("{}: {code} lines", file.display()))
        })
        .collect();
    assert!(
        big.is_empty(),
        "files over {MOST_CODE_LINES} lines before their tests (split them by job): {big:#?}"
    );
}

/// The test estate's rule: no file of `tests/`, `testkit/` or `benches/` over about 1,000 lines
/// (a test binary of several areas is a folder of modules, one per area).
const MOST_TEST_LINES: usize = 1_050;

#[test]
fn no_file_of_the_test_estate_has_over_about_1000_lines() {
    let root = Path::new(ROOT);
    let files: Vec<PathBuf> = ["tests", "testkit", "benches"]
        .iter()
        .flat_map(|d| rs_files(&root.join(d)))
        .collect();
    assert!(files.len() > 50, "the test estate was read: {files:?}");
    let big: Vec<String> = files
        .into_iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file)
                .expect("read")
                .lines()
                .count();
            (lines > MOST_TEST_LINES).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(
        big.is_empty(),
        "test files over {MOST_TEST_LINES} lines (split them by area): {big:#?}"
    );
}

/// A module's tests over about 300 lines go to a child file (`tests.rs`) beside their code.
const MOST_INLINE_TEST_LINES: usize = 320;

/// The lines of each inline `#[cfg(test)] mod NAME { ... }` of `text` (to its closing brace at
/// column 0).
fn inline_test_modules(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .filter(|&i| {
            lines[i].starts_with("#[cfg(test)]")
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.starts_with("mod ") && l.ends_with('{'))
        })
        .map(|i| {
            lines[i + 1..]
                .iter()
                .position(|l| *l == "}")
                .map_or(lines.len() - i, |end| end + 2)
        })
        .collect()
}

#[test]
fn no_inline_test_module_has_over_about_300_lines() {
    let root = Path::new(ROOT);
    let big: Vec<String> = ["src", "testkit/src"]
        .iter()
        .flat_map(|d| rs_files(&root.join(d)))
        .flat_map(|file| {
            let text = std::fs::read_to_string(&file).expect("read");
            inline_test_modules(&text)
                .into_iter()
                .filter(|n| *n > MOST_INLINE_TEST_LINES)
                .map(move |n| format!("{}: {n} lines", file.display()))
        })
        .collect();
    assert!(
        big.is_empty(),
        "inline test modules over {MOST_INLINE_TEST_LINES} lines (move them to a child \
         tests.rs): {big:#?}"
    );
}

#[test]
fn inline_test_modules_are_measured() {
    let text = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
    assert_eq!(inline_test_modules(text), vec![5]);
    assert_eq!(
        inline_test_modules("#[cfg(test)]\nmod tests;\n"),
        Vec::<usize>::new()
    );
}

/// docs/security.md names, in the last column of each of its tables, the tests that show each
/// row: every row names at least one, and every name is real — a test function (`name`, or
/// `module::path::tests::name` in that module's file, or a whole `…::tests` module), a file
/// (`tests/it/deploy/`), a fixture case (`kebab-case`, in `fixtures/admission/`). What is in
/// parentheses describes the test and is not checked.
#[test]
fn every_test_docs_security_names_exists() {
    fn outside_parentheses(text: &str) -> String {
        let mut depth = 0usize;
        text.chars()
            .filter(|c| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' => {
                    depth = depth.saturating_sub(1);
                    false
                }
                _ => depth == 0,
            })
            .collect()
    }
    let is_ident = |s: &str| {
        !s.is_empty()
            && s.split("::").all(|seg| {
                !seg.is_empty()
                    && seg
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            })
    };
    let is_fixture = |s: &str| {
        s.contains('-')
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let root = Path::new(ROOT);
    let sources: Vec<(PathBuf, String)> = ["src", "tests", "testkit/src", "benches"]
        .iter()
        .flat_map(|d| rs_files(&root.join(d)))
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("source");
            (f, text)
        })
        .collect();
    let defines = |text: &str, name: &str| {
        text.match_indices(&format!("fn {name}")).any(|(at, m)| {
            !text[at + m.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        })
    };
    let module_file = |segments: &[&str]| {
        let base = root.join("src").join(segments.join("/"));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|p| p.is_file())
    };
    let doc = std::fs::read_to_string(root.join("docs/security.md")).expect("security.md");
    let mut problems = Vec::new();
    let mut rows = 0;
    for line in doc
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
    {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let Some(tests) = cells.last().map(|c| c.trim()) else {
            continue;
        };
        if cells.len() < 4 || tests == "Test" {
            continue;
        }
        rows += 1;
        let row: String = cells[0].chars().take(60).collect();
        let mut named = 0;
        for token in outside_parentheses(tests).split('`').skip(1).step_by(2) {
            if token.contains('/') {
                if !root.join(token).exists() {
                    problems.push(format!("{row}: no file {token}"));
                }
            } else if is_ident(token) {
                named += 1;
                let segments: Vec<&str> = token.split("::").collect();
                let found = match segments.iter().position(|s| *s == "tests") {
                    // The tests inline in the module's file, or in its child `tests.rs`.
                    Some(at) => module_file(&segments[..at]).is_some_and(|f| {
                        let mut text = std::fs::read_to_string(&f).expect("module");
                        let child = match f.file_name().and_then(|n| n.to_str()) {
                            Some("mod.rs") => f.with_file_name("tests.rs"),
                            _ => f.with_extension("").join("tests.rs"),
                        };
                        if let Ok(tests) = std::fs::read_to_string(child) {
                            text.push_str(&tests);
                        }
                        text.contains("mod tests")
                            && segments[at + 1..]
                                .last()
                                .is_none_or(|name| defines(&text, name))
                    }),
                    None if segments.len() == 1 => {
                        sources.iter().any(|(_, text)| defines(text, token))
                    }
                    None => false,
                };
                if !found {
                    problems.push(format!("{row}: no test {token}"));
                }
            } else if is_fixture(token) && !root.join("fixtures/admission").join(token).is_dir() {
                problems.push(format!("{row}: no fixture case {token}"));
            }
        }
        if named == 0 {
            problems.push(format!("{row}: names no test"));
        }
    }
    assert!(
        rows >= 20,
        "only {rows} rows read: is the table still there?"
    );
    assert!(
        problems.is_empty(),
        "docs/security.md:\n{}",
        problems.join("\n")
    );
}

mod admission;
mod makers;
mod scripts;
