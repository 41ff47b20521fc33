//! The scripts: one job each, short functions (issue 35).

use super::*;

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
