//! The values table of `charts/jobset-inplace/README.md`, generated from `values.yaml`'s comments
//! (no helm needed: these run in every `cargo test`). Regenerate it with
//! `UPDATE_CHART_README=1 cargo test --locked --test helm chart_readme`.

use super::*;

/// The line of charts/jobset-inplace/README.md below which the values' table is generated.
const README_MARKER: &str = "<!-- Generated from values.yaml's comments by tests/helm/readme.rs: \
                             UPDATE_CHART_README=1 cargo test --locked --test helm chart_readme -->";

/// One key of values.yaml: where it sits, its own comment (the lines just above it, no blank
/// line between), and whether its value is on its line (`key: value`) or below it.
struct Entry {
    path: Vec<String>,
    comment: String,
    inline: bool,
}

/// The keys of values.yaml in order. Lines of block lists (`- ...`) belong to the key above.
fn entries(values_yaml: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    // (indent, key) of the enclosing keys.
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    for line in values_yaml.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        // A comment block describes the key right below it; a blank line ends it (so the
        // file's header, followed by one, describes nothing).
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.trim().to_owned());
            continue;
        }
        if trimmed.starts_with("- ") || trimmed == "-" {
            comment.clear();
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            comment.clear();
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let key = key.trim().trim_matches('"').to_owned();
        let path: Vec<String> = stack
            .iter()
            .map(|(_, k)| k.clone())
            .chain([key.clone()])
            .collect();
        let text = comment.join(" ");
        comment.clear();
        let inline = !value.trim().is_empty();
        if !inline {
            stack.push((indent, key));
        }
        out.push(Entry {
            path,
            comment: text.split_whitespace().collect::<Vec<_>>().join(" "),
            inline,
        });
    }
    out
}

/// One row of the table: a key, its default (JSON), its description.
#[derive(Debug, PartialEq)]
pub(crate) struct Row {
    pub key: String,
    pub default: String,
    pub description: String,
}

/// The rows of values.yaml: a key whose value is on its line is a row; so is a key whose value
/// is a block (a map, a list) where no key below it has a comment (its default is the whole
/// block); a block with commented keys below it is a section, whose keys are the rows. Every
/// row needs a comment of its own: the keys without one are the error.
pub(crate) fn values_rows(values_yaml: &str) -> Result<Vec<Row>, Vec<String>> {
    let values: Value = serde_saphyr::from_str(values_yaml).expect("values.yaml is YAML");
    let entries = entries(values_yaml);
    let below = |i: usize| {
        let path = &entries[i].path;
        entries[i + 1..]
            .iter()
            .take_while(move |e| e.path.len() > path.len() && e.path.starts_with(path))
    };
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    let mut covered: Option<Vec<String>> = None;
    for (i, e) in entries.iter().enumerate() {
        if let Some(c) = &covered {
            if e.path.starts_with(c) {
                continue;
            }
            covered = None;
        }
        let section = !e.inline && below(i).any(|d| !d.comment.is_empty());
        if section {
            continue;
        }
        if !e.inline {
            covered = Some(e.path.clone());
        }
        let key = e.path.join(".");
        if e.comment.is_empty() {
            missing.push(format!(
                "values.yaml: `{key}` has no comment of its own (the line above it)"
            ));
            continue;
        }
        let default = e
            .path
            .iter()
            .try_fold(&values, |v, k| v.get(k))
            .unwrap_or_else(|| panic!("values.yaml: {key} not found in the parsed YAML"));
        rows.push(Row {
            key,
            default: serde_json::to_string(default).expect("JSON"),
            description: e.comment.clone(),
        });
    }
    if missing.is_empty() {
        Ok(rows)
    } else {
        Err(missing)
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn values_table(rows: &[Row]) -> String {
    let mut out = String::from("| value | default | what it is |\n|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            r.key,
            cell(&r.default),
            cell(&r.description)
        ));
    }
    out
}

/// The first line where `got` differs from `want`: its number (from 1) and both lines.
fn first_difference(want: &str, got: &str) -> Option<(usize, String, String)> {
    let (mut w, mut g) = (want.lines(), got.lines());
    for n in 1.. {
        match (w.next(), g.next()) {
            (None, None) => return None,
            (a, b) if a == b => continue,
            (a, b) => {
                return Some((
                    n,
                    a.unwrap_or("(nothing)").to_owned(),
                    b.unwrap_or("(nothing)").to_owned(),
                ));
            }
        }
    }
    None
}

/// The schema's node for a key's path, if the schema names it.
fn schema_node<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    // Keys are plain identifiers (a row never descends into a map of labels).
    path.split('.')
        .try_fold(schema, |node, k| node["properties"].get(k))
}

#[test]
fn chart_readme_lists_every_value_as_values_yaml_says() {
    let dir = chart_dir();
    let values = std::fs::read_to_string(dir.join("values.yaml")).expect("values.yaml");
    let rows = values_rows(&values).unwrap_or_else(|missing| panic!("{}", missing.join("\n")));
    let path = dir.join("README.md");
    let readme = std::fs::read_to_string(&path).expect("charts/jobset-inplace/README.md");
    let head = readme
        .split_once(README_MARKER)
        .map(|(head, _)| head)
        .unwrap_or_else(|| panic!("{} lacks the line {README_MARKER}", path.display()));
    let want = format!("{head}{README_MARKER}\n\n{}", values_table(&rows));
    if std::env::var_os("UPDATE_CHART_README").is_some() {
        std::fs::write(&path, &want).expect("write the README");
        return;
    }
    if let Some((n, w, g)) = first_difference(&want, &readme) {
        panic!(
            "{} is not what values.yaml says, first at line {n}:\n  values.yaml: {w}\n  README:      {g}\n\
             run UPDATE_CHART_README=1 cargo test --locked --test helm chart_readme",
            path.display()
        );
    }
    // The rows and the schema name the same values: every row is a key of the schema, and
    // every key of the schema's top level has a row (itself or below it).
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("values.schema.json")).expect("schema"),
    )
    .expect("schema JSON");
    for r in &rows {
        assert!(
            schema_node(&schema, &r.key).is_some(),
            "values.yaml's {} is not in values.schema.json",
            r.key
        );
    }
    for key in schema["properties"].as_object().expect("properties").keys() {
        assert!(
            rows.iter()
                .any(|r| r.key == *key || r.key.starts_with(&format!("{key}."))),
            "values.schema.json's {key} has no row (is it in values.yaml?)"
        );
    }
    // One description per row: no sentence copied over a group of keys.
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for r in &rows {
        if let Some(other) = seen.insert(&r.description, &r.key) {
            panic!(
                "{} and {other} share one description: {:?}",
                r.key, r.description
            );
        }
    }
}

#[test]
fn values_rows_take_own_comments_and_fold_uncommented_blocks() {
    let yaml = "# header\n\n# The image.\nimage:\n  # Where.\n  registry: ghcr.io\n  # Which.\n  tag: \"\"\n\
                # Its resources.\nresources:\n  requests:\n    cpu: 10m\n\
                # A list.\nlist:\n- a\n- b\n";
    let rows = values_rows(yaml).expect("every row has a comment");
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r.key.as_str(), r.default.as_str(), r.description.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("image.registry", "\"ghcr.io\"", "Where."),
            ("image.tag", "\"\"", "Which."),
            (
                "resources",
                "{\"requests\":{\"cpu\":\"10m\"}}",
                "Its resources."
            ),
            ("list", "[\"a\",\"b\"]", "A list."),
        ]
    );
    assert_eq!(
        values_table(&rows[..1]),
        "| value | default | what it is |\n|---|---|---|\n| `image.registry` | `\"ghcr.io\"` | Where. |\n"
    );
}

#[test]
fn values_rows_refuse_a_key_without_its_own_comment() {
    // The comment of the enclosing key is not inherited: `tag` has none.
    let yaml = "# The image.\nimage:\n  # Where.\n  registry: ghcr.io\n  tag: \"\"\nreplicas: 2\n";
    let missing = values_rows(yaml).expect_err("tag and replicas have no comment");
    assert_eq!(missing.len(), 2, "{missing:?}");
    assert!(missing[0].contains("`image.tag`"), "{missing:?}");
    assert!(missing[1].contains("`replicas`"), "{missing:?}");
}

#[test]
fn the_first_differing_line_is_named() {
    assert_eq!(first_difference("a\nb\nc\n", "a\nb\nc\n"), None);
    assert_eq!(
        first_difference("a\nb\nc\n", "a\nB\nc\n"),
        Some((2, "b".to_owned(), "B".to_owned()))
    );
    assert_eq!(
        first_difference("a\nb\n", "a\n"),
        Some((2, "b".to_owned(), "(nothing)".to_owned()))
    );
}
