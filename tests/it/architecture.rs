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

// ---- Scripts: one job each, short functions (issue 35) ----

/// The scripts' rule: no shell function of `scripts/**/*.sh` or `.ci/run` over about 80 lines
/// (a long one is a sequence of named steps), and every file of `scripts/lib/` opens with its
/// header comment: its job, then what it needs (`# Needs:`) and what it provides
/// (`# Provides:`).
const MOST_SHELL_FUNCTION_LINES: usize = 80;

/// Every `*.sh` under `dir`, at any depth.
fn sh_files(dir: &Path) -> Vec<PathBuf> {
    files_with_extension(dir, "sh")
}

/// The name of the function a line at column 0 opens (`name() {`, `function name {`), if any.
fn shell_function_start(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("function ").unwrap_or(line);
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == ':'))
        .unwrap_or(rest.len());
    let (name, after) = rest.split_at(end);
    let after = after.trim_start();
    let after = after
        .strip_prefix("()")
        .map(str::trim_start)
        .unwrap_or(after);
    let named = !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit());
    let defines = after.starts_with('{') && (line.starts_with("function ") || rest.contains("()"));
    (named && defines).then_some(name)
}

/// The delimiter of a here-document a line opens (`<<EOF`, `<<-'EOF'`, `<< "EOF"`; not a
/// here-string `<<<`), and whether its body may be indented with tabs (`<<-`).
fn heredoc_start(line: &str) -> Option<(String, bool)> {
    if line.trim_start().starts_with('#') {
        return None;
    }
    let mut from = 0;
    while let Some(at) = line[from..].find("<<").map(|i| i + from) {
        let rest = &line[at + 2..];
        if rest.starts_with('<') {
            from = at + 3;
            continue;
        }
        let (dash, rest) = match rest.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let rest = rest.trim_start().trim_start_matches(['\'', '"', '\\']);
        let word: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            return Some((word, dash));
        }
        from = at + 2;
    }
    None
}

/// Each top-level function of a shell script `text` with its length in lines, from its
/// `name() {` line to its closing `}` at column 0 (both counted; here-document bodies are
/// skipped, so a `}` at column 0 inside one does not end the function). A one-line function
/// counts 1.
fn shell_functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut open: Option<(String, usize)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        match &open {
            None => {
                if let Some(name) = shell_function_start(line) {
                    if line.trim_end().ends_with('}') {
                        out.push((name.to_string(), 1));
                    } else {
                        open = Some((name.to_string(), i));
                    }
                }
            }
            Some((name, start)) => {
                if line == "}" || line.starts_with("} ") {
                    out.push((name.clone(), i - start + 1));
                    open = None;
                }
            }
        }
        if let Some((delimiter, dash)) = heredoc_start(line) {
            while i + 1 < lines.len() {
                i += 1;
                let body = if dash {
                    lines[i].trim_start_matches('\t')
                } else {
                    lines[i]
                };
                if body == delimiter {
                    break;
                }
            }
        }
        i += 1;
    }
    if let Some((name, start)) = open {
        out.push((name, lines.len() - start));
    }
    out
}

/// What is wrong with the header comment of a `scripts/lib/` file: it must open the file (after
/// `# shellcheck` directives), say the file's job before anything else, and name what the file
/// needs and what it provides. Empty when nothing is.
fn lib_header_problems(text: &str) -> Vec<String> {
    let header: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .filter(|l| !l.starts_with("# shellcheck ") && !l.starts_with("#!"))
        .collect();
    let mut problems = Vec::new();
    let job = header.first().map(|l| l.trim_start_matches('#').trim());
    if job.is_none_or(|j| j.is_empty() || j.starts_with("Needs:") || j.starts_with("Provides:")) {
        problems.push("no header comment saying the file's job".to_string());
    }
    for field in ["# Needs:", "# Provides:"] {
        if !header.iter().any(|l| l.starts_with(field)) {
            problems.push(format!("its header comment has no `{field}` line"));
        }
    }
    problems
}

#[test]
fn no_shell_function_has_over_about_80_lines() {
    let root = Path::new(ROOT);
    let mut files = sh_files(&root.join("scripts"));
    files.push(root.join(".ci/run"));
    assert!(files.len() > 20, "the scripts were read: {files:?}");
    let mut measured = 0;
    let long: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("read");
            let functions = shell_functions(&text);
            measured += functions.len();
            functions
                .into_iter()
                .filter(|(_, n)| *n > MOST_SHELL_FUNCTION_LINES)
                .map(|(name, n)| format!("{}: {name}() {n} lines", file.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(measured > 100, "only {measured} shell functions found");
    assert!(
        long.is_empty(),
        "shell functions over {MOST_SHELL_FUNCTION_LINES} lines (cut them into named steps): \
         {long:#?}"
    );
}

#[test]
fn every_script_library_opens_with_its_header() {
    let libs = sh_files(&Path::new(ROOT).join("scripts/lib"));
    assert!(libs.len() >= 10, "the libraries were read: {libs:?}");
    let problems: Vec<String> = libs
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("read");
            lib_header_problems(&text)
                .into_iter()
                .map(move |p| format!("{}: {p}", file.display()))
        })
        .collect();
    assert!(problems.is_empty(), "scripts/lib/: {problems:#?}");
}

/// The checks on synthetic scripts: a long function is measured as long (a `}` at column 0 in a
/// here-document does not end it), one-liners and indented inner functions are not split off,
/// and a library without its header is refused.
#[test]
fn the_script_checks_see_what_they_look_for() {
    let long = [
        "#!/usr/bin/env bash\nshort() { echo hi; }\nlong() {\n  cat <<EOF\n{\n}\nEOF\n",
        &"  echo step\n".repeat(MOST_SHELL_FUNCTION_LINES),
        "}\n",
    ]
    .concat();
    let functions = shell_functions(&long);
    assert_eq!(
        functions,
        vec![
            ("short".to_string(), 1),
            ("long".to_string(), MOST_SHELL_FUNCTION_LINES + 6)
        ]
    );
    assert!(
        functions[1].1 > MOST_SHELL_FUNCTION_LINES,
        "must fail the rule"
    );
    let nested = "outer() {\n  inner() { :; }\n  y=$((1<<3))\n  cat <<-'END'\n\t}\n\tEND\n  x=$(cat <<<\"}\")\n}\n\
                  function other {\n  :\n}\n";
    assert_eq!(
        shell_functions(nested),
        vec![("outer".to_string(), 8), ("other".to_string(), 3)]
    );
    assert!(shell_function_start("  indented() {").is_none());
    assert!(shell_function_start("x=1 # name() {").is_none());

    let good = "# shellcheck shell=bash\n# Does one thing.\n#\n# Needs: die.\n# Provides: f.\nf() { :; }\n";
    assert!(lib_header_problems(good).is_empty());
    assert_eq!(
        lib_header_problems("# shellcheck shell=bash\nf() { :; }\n").len(),
        3
    );
    assert_eq!(
        lib_header_problems("# shellcheck shell=bash\n# Does one thing.\nf() { :; }\n").len(),
        2
    );
    assert_eq!(
        lib_header_problems("# shellcheck shell=bash\n# Needs: x\n# Provides: f\n").len(),
        1
    );
}

// ---- Admission: the files of src/admission/ in layers, no circle (issue 35) ----
//
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
        "src/admission/ against ADMISSION_LAYERS (tests/it/architecture.rs): {problems:#?}\n{graph:#?}"
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

// ---------------------------------------------------------------------------------------------
// Test-kit builders: no private maker of a JobSet, pod or Job
// ---------------------------------------------------------------------------------------------

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
