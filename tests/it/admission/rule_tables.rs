//! The docs' tables of the rules against [`Rule::ALL`], the one list (`src/admission/rule.rs`):
//! docs/operations.md's table of the denial metric's `rule` label lists every label once, in
//! `Rule::ALL`'s order, then `request`, and nothing else, with the value each rule that requires
//! one holds; docs/reference.md's table of what validation checks names every label in its last
//! column, and no other. Adding a rule fails here until both tables have it. (The list of the
//! rules itself is exhaustive by construction: `Rule::ALL` and `Rule::label` come from the
//! `rules!` macro's one list.)

use std::collections::BTreeSet;
use std::path::Path;

use jobset_inplace::admission::Rule;
use jobset_inplace::webhook::metrics::RULE_REQUEST;

fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The cells of the rows of the Markdown table whose header row is `header`, trimmed (the
/// separator row skipped); `None` when there is no such table.
fn table(doc: &str, header: &str) -> Option<Vec<Vec<String>>> {
    let (_, after) = doc.split_once(&format!("\n{header}\n"))?;
    Some(
        after
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.trim().trim_matches('|').split('|').collect();
                cells.iter().map(|c| c.trim().to_owned()).collect()
            })
            .collect(),
    )
}

/// The `code` spans of a cell.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

const OPERATIONS_HEADER: &str = "| rule | the field of `spec.replicatedJobs[i].template.spec` |";
const REFERENCE_HEADER: &str = "| rule | field | `rule` label |";

/// What is wrong with docs/operations.md's `rule` table (`None`: nothing): its first column,
/// each cell one label in backquotes, must be `Rule::ALL`'s labels in order, then `request`.
fn operations_table_mismatch(doc: &str) -> Option<String> {
    let Some(rows) = table(doc, OPERATIONS_HEADER) else {
        return Some(format!("no table under {OPERATIONS_HEADER:?}"));
    };
    let labels: Vec<String> = rows
        .iter()
        .map(|cells| {
            let cell = cells.first().map_or("", String::as_str);
            cell.strip_prefix('`')
                .and_then(|c| c.strip_suffix('`'))
                .unwrap_or(cell)
                .to_owned()
        })
        .collect();
    let want: Vec<String> = Rule::ALL
        .iter()
        .map(|r| r.label())
        .chain([RULE_REQUEST])
        .map(str::to_owned)
        .collect();
    (labels != want)
        .then(|| format!("the rows' labels {labels:?}, Rule::ALL's then request {want:?}"))
}

/// What is wrong with docs/reference.md's table of the rules (`None`: nothing): every row names
/// at least one label in its last column, and those labels are `Rule::ALL`'s, every one.
fn reference_table_mismatch(doc: &str) -> Option<String> {
    let Some(rows) = table(doc, REFERENCE_HEADER) else {
        return Some(format!("no table under {REFERENCE_HEADER:?}"));
    };
    let mut named = BTreeSet::new();
    for cells in &rows {
        let labels = code_spans(cells.last().map_or("", String::as_str));
        if labels.is_empty() {
            return Some(format!("a row names no label: {cells:?}"));
        }
        named.extend(labels);
    }
    let want: BTreeSet<String> = Rule::ALL.iter().map(|r| r.label().to_owned()).collect();
    let missing: Vec<_> = want.difference(&named).collect();
    let unknown: Vec<_> = named.difference(&want).collect();
    (!missing.is_empty() || !unknown.is_empty())
        .then(|| format!("labels missing {missing:?}, not rules {unknown:?}"))
}

#[test]
fn the_operations_guide_lists_every_rule_label_and_its_required_value() {
    let doc = doc("operations.md");
    assert_eq!(
        operations_table_mismatch(&doc),
        None,
        "docs/operations.md's rule table against Rule::ALL"
    );
    let rows = table(&doc, OPERATIONS_HEADER).unwrap_or_default();
    let what = |rule: Rule| {
        rows.iter()
            .find(|cells| {
                cells
                    .first()
                    .is_some_and(|c| c == &format!("`{}`", rule.label()))
            })
            .and_then(|cells| cells.get(1).cloned())
            .unwrap_or_default()
    };
    let backoff = what(Rule::BackoffLimit);
    assert!(
        backoff.contains(&Rule::BACKOFF_LIMIT.to_string()),
        "{backoff}"
    );
    let policy = what(Rule::PodReplacementPolicy);
    assert!(
        policy.contains(&format!("`{}`", Rule::POD_REPLACEMENT_POLICY)),
        "{policy}"
    );
}

#[test]
fn the_reference_s_validation_table_names_every_rule_label() {
    assert_eq!(
        reference_table_mismatch(&doc("reference.md")),
        None,
        "docs/reference.md's \"What the webhook does\" table against Rule::ALL"
    );
}

/// The checks fail on a table with a row missing, a row too many, or a row out of order.
#[test]
fn the_rule_table_checks_see_a_missing_or_extra_row() {
    let operations = |labels: &[&str]| {
        let rows: String = labels.iter().map(|l| format!("| {l} | what |\n")).collect();
        format!("x\n\n{OPERATIONS_HEADER}\n|---|---|\n{rows}\nafter\n")
    };
    let mut labels: Vec<String> = Rule::ALL
        .iter()
        .map(|r| format!("`{}`", r.label()))
        .collect();
    labels.push(format!("`{RULE_REQUEST}`"));
    let all: Vec<&str> = labels.iter().map(String::as_str).collect();
    assert_eq!(operations_table_mismatch(&operations(&all)), None);
    assert!(
        operations_table_mismatch(&operations(&all[1..])).is_some(),
        "a row missing"
    );
    let mut extra = all.clone();
    extra.insert(3, "`not_a_rule`");
    assert!(
        operations_table_mismatch(&operations(&extra)).is_some(),
        "a row too many"
    );
    let mut bare = all.clone();
    bare.insert(3, "not_a_rule");
    assert!(
        operations_table_mismatch(&operations(&bare)).is_some(),
        "a row without quotes"
    );
    let mut swapped = all.clone();
    swapped.swap(0, 1);
    assert!(
        operations_table_mismatch(&operations(&swapped)).is_some(),
        "out of order"
    );
    assert!(operations_table_mismatch("no table").is_some());

    let reference = |cells: &[&str]| {
        let rows: String = cells
            .iter()
            .map(|c| format!("| a rule | a field | {c} |\n"))
            .collect();
        format!("x\n\n{REFERENCE_HEADER}\n|---|---|---|\n{rows}\nafter\n")
    };
    let (first, rest) = all.split_at(2);
    let rules = &rest[..rest.len() - 1]; // without `request`
    let mut two = vec![first.join(", ")];
    two.extend(rules.iter().map(|l| (*l).to_owned()));
    let two: Vec<&str> = two.iter().map(String::as_str).collect();
    assert_eq!(reference_table_mismatch(&reference(&two)), None);
    assert!(
        reference_table_mismatch(&reference(&two[1..])).is_some(),
        "two labels missing"
    );
    let mut extra = two.clone();
    extra.push("`not_a_rule`");
    assert!(
        reference_table_mismatch(&reference(&extra)).is_some(),
        "a label too many"
    );
    let mut empty = two.clone();
    empty.push("none");
    assert!(
        reference_table_mismatch(&reference(&empty)).is_some(),
        "a row without a label"
    );
    assert!(reference_table_mismatch("no table").is_some());
}
