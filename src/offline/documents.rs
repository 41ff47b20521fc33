//! The manifest files `inject` and `check` read: YAML streams or JSON, split into documents that
//! keep their raw text (an untouched document is printed back byte for byte).

use serde_json::Value;

use super::Error;

/// How a manifest file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// One document of a manifest file: its original text (YAML), the exact bytes that carry it in
/// the file (its `---` marker line and any `...` line included, so that printing every `raw` in
/// order gives the file back), and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    pub text: String,
    pub raw: String,
    pub value: Value,
}

/// Splits a manifest file into documents. JSON input (starting with `{` or `[`) is a stream of
/// objects, a top-level array holding several; anything else is a YAML stream split on `---`.
/// Empty documents are dropped.
pub fn parse_documents(path: &str, input: &str) -> Result<(Format, Vec<Document>), Error> {
    let (format, docs) = parse_all_documents(path, input)?;
    Ok((format, non_empty(docs)))
}

/// [`parse_documents`] with empty YAML documents kept, so that their bytes can be printed back.
pub(super) fn parse_all_documents(
    path: &str,
    input: &str,
) -> Result<(Format, Vec<Document>), Error> {
    let parse_err = |document: usize, reason: String| Error::Parse {
        path: path.to_owned(),
        document,
        reason,
    };
    let trimmed = input.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut docs = Vec::new();
        for (i, value) in serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .enumerate()
        {
            match value.map_err(|e| parse_err(i + 1, e.to_string()))? {
                Value::Array(items) => docs.extend(items.into_iter().map(|value| Document {
                    text: String::new(),
                    raw: String::new(),
                    value,
                })),
                value => docs.push(Document {
                    text: String::new(),
                    raw: String::new(),
                    value,
                }),
            }
        }
        return Ok((Format::Json, docs));
    }
    let mut docs = Vec::new();
    for (i, (raw, text)) in split_yaml_raw(input).into_iter().enumerate() {
        let value: Value =
            crate::settings::from_yaml(&text).map_err(|e| parse_err(i + 1, e.to_string()))?;
        docs.push(Document { text, raw, value });
    }
    Ok((Format::Yaml, docs))
}

/// Documents that hold something (empty and comment-only documents are left out).
fn non_empty(docs: Vec<Document>) -> Vec<Document> {
    docs.into_iter().filter(|d| !d.value.is_null()).collect()
}

/// Splits a YAML stream on document markers (`---` at the start of a line), keeping each
/// document's text as written so that documents we do not touch are printed back unchanged.
pub fn split_yaml(input: &str) -> Vec<String> {
    split_yaml_raw(input)
        .into_iter()
        .map(|(_, text)| text)
        .collect()
}

/// [`split_yaml`], each document with the exact bytes that carry it: the raw parts, in order,
/// concatenate to the input.
pub fn split_yaml_raw(input: &str) -> Vec<(String, String)> {
    let mut docs = vec![(String::new(), String::new())];
    for line in input.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        if is_marker {
            let mut text = String::new();
            let rest = bare[3..].trim_start();
            if !rest.is_empty() && !rest.starts_with('#') {
                text.push_str(rest);
                text.push('\n');
            }
            docs.push((line.to_owned(), text));
        } else if let Some((raw, text)) = docs.last_mut() {
            raw.push_str(line);
            if bare != "..." {
                text.push_str(line);
            }
        }
    }
    docs
}

/// The marker line a re-rendered document keeps: its own, unless content followed the marker
/// (then that content is part of what was re-rendered).
pub(super) fn marker_line(raw: &str) -> &str {
    let first = raw.split_inclusive('\n').next().unwrap_or("");
    let bare = first.trim_end_matches(['\n', '\r']);
    let is_marker = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
    if !is_marker {
        return "";
    }
    let rest = bare[3..].trim_start();
    if rest.is_empty() || rest.starts_with('#') {
        first
    } else {
        "---\n"
    }
}
