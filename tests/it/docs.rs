//! The docs' figures have one home. A page states its current figures in bold
//! (docs/benchmarks.md: `**6.6 s**`, docs/testing.md: `**3,372 s (56 min)**`); such a figure
//! appears on no other page (`docs/*.md`, `README.md`): another page links to where it is
//! measured instead of repeating it, so that a new measurement changes one place and no page
//! keeps an old one.
//!
//! A figure is a number with a decimal point or a thousands separator followed by a unit
//! (`6.6 s`, `3,372 s`, `229.7 MiB`, `1.11x`), or a range of two (`5.9-6.6 s`, one figure), as
//! the pages write measurements; whole numbers alone (`2 min`, `10 s`) are settings as often as
//! figures, and are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The units a figure is written with.
const UNITS: &[&str] = &[
    "ms", "s", "min", "x", "%", "MiB", "KiB", "GiB", "MB", "KB", "GB", "B",
];

/// Every page: its path from the root, and its text.
fn pages() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let docs = Path::new(ROOT).join("docs");
    for entry in std::fs::read_dir(&docs).expect("docs/") {
        let path = entry.expect("an entry of docs/").path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = format!(
                "docs/{}",
                path.file_name().expect("a name").to_string_lossy()
            );
            out.insert(name, std::fs::read_to_string(&path).expect("a page"));
        }
    }
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    out.insert("README.md".to_owned(), readme);
    out
}

/// The figures in `text`: each a number with a `.` or `,` inside it, then an optional space, then
/// one of [`UNITS`] that no letter or digit follows; written back as `NUMBER UNIT`.
fn figures(text: &str) -> BTreeSet<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || matches!(chars[i - 1], '.' | ',')));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len()
            && (chars[j].is_ascii_digit()
                || (matches!(chars[j], '.' | ',')
                    && chars.get(j + 1).is_some_and(char::is_ascii_digit)))
        {
            j += 1;
        }
        // A range (`5.9-6.6 s`) is one figure, not its ends.
        if chars.get(j) == Some(&'-') && chars.get(j + 1).is_some_and(char::is_ascii_digit) {
            j += 1;
            while j < chars.len()
                && (chars[j].is_ascii_digit()
                    || (matches!(chars[j], '.' | ',')
                        && chars.get(j + 1).is_some_and(char::is_ascii_digit)))
            {
                j += 1;
            }
        }
        let number: String = chars[i..j].iter().collect();
        let mut k = j;
        if chars.get(k) == Some(&' ') {
            k += 1;
        }
        let rest: String = chars[k..chars.len().min(k + 4)].iter().collect();
        // The longest unit that matches ("ms" before "s", "MiB" before "B").
        let unit = UNITS
            .iter()
            .filter(|u| rest.starts_with(**u))
            .filter(|u| {
                chars
                    .get(k + u.chars().count())
                    .is_none_or(|c| !c.is_alphanumeric())
            })
            .max_by_key(|u| u.len());
        if let Some(unit) = unit
            && number.contains(['.', ','])
        {
            out.insert(format!("{number} {unit}"));
        }
        i = j.max(i + 1);
    }
    out
}

/// The spans of `text` between `**` and `**`.
fn bold(text: &str) -> Vec<&str> {
    text.split("**").skip(1).step_by(2).collect()
}

/// The figures a page states in bold.
fn stated(text: &str) -> BTreeSet<String> {
    bold(text).into_iter().flat_map(figures).collect()
}

#[test]
fn the_checks_see_what_they_look_for() {
    let text = "**6.6 s** and **3,372 s (56 min)**, **1.11x**, **229.7 MiB**; not **2 min**, \
                not **v1.35**, not **0.12.1**; plain 7.69 s, 12.5ms, 1,000 pods, 5.9-6.6 s";
    let want: BTreeSet<String> = ["6.6 s", "3,372 s", "1.11 x", "229.7 MiB"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(stated(text), want);
    let plain = figures(text);
    assert!(
        plain.contains("7.69 s") && plain.contains("12.5 ms"),
        "{plain:?}"
    );
    assert!(!plain.iter().any(|f| f.starts_with("1,000")), "{plain:?}");
    assert!(
        plain.contains("5.9-6.6 s"),
        "a range is one figure: {plain:?}"
    );
    assert_eq!(
        figures("5.9-6.6 s"),
        BTreeSet::from(["5.9-6.6 s".to_owned()])
    );
    // The pages do state figures in bold: the rule below has something to hold.
    let pages = pages();
    for (page, least) in [("docs/benchmarks.md", 5), ("docs/testing.md", 1)] {
        let n = stated(&pages[page]).len();
        assert!(n >= least, "{page}: {n} bold figures");
    }
}

#[test]
fn a_figure_stated_in_bold_appears_on_no_other_page() {
    let pages = pages();
    let mut home: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (page, text) in &pages {
        for figure in stated(text) {
            home.entry(figure).or_default().push(page);
        }
    }
    let mut repeated = Vec::new();
    for (figure, homes) in &home {
        for (page, text) in &pages {
            if !homes.contains(&page.as_str()) && figures(text).contains(figure) {
                repeated.push(format!("{figure} (stated in {homes:?}) repeated in {page}"));
            }
        }
        if homes.len() > 1 {
            repeated.push(format!("{figure} stated in bold on {homes:?}"));
        }
    }
    assert!(
        repeated.is_empty(),
        "a figure has one home; link to it instead:\n{}",
        repeated.join("\n")
    );
}
