//! `inject`: the mutating webhook's decision applied to every JobSet of a manifest file: each
//! JobSet sent as the body of a CREATE through [`crate::admission::review`], the server's own
//! entry.

use serde_json::Value;

use super::Error;
use super::documents::{Format, marker_line, parse_all_documents};
use crate::admission::{self, Decision, Endpoint, InjectionConfig};

/// `apiVersion: jobset.x-k8s.io/...`, `kind: JobSet`.
pub(super) fn is_jobset(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(crate::jobset::KIND)
        && value
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with(&format!("{}/", crate::jobset::GROUP)))
}

pub(super) fn object_name(value: &Value) -> String {
    let meta = |k: &str| {
        value
            .pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
    };
    let name = meta("name").or(meta("generateName")).unwrap_or("<unnamed>");
    match meta("namespace") {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

/// The decision of the webhook's `endpoint` on a CREATE of `object`: the JobSet's JSON text
/// framed as an AdmissionReview body and sent through [`admission::review`], as the server
/// receives it.
pub(super) fn review_create(
    endpoint: Endpoint,
    object: &Value,
    config: &InjectionConfig,
) -> Result<Decision, Error> {
    let text = serde_json::to_vec(object).map_err(Error::WriteJson)?;
    let reply = admission::review(endpoint, &admission::review::create_body(&text), config);
    if reply.http_status != 200 {
        // Not reached: the body is a well-formed review.
        return Err(Error::Denied {
            object: object_name(object),
            message: String::from_utf8_lossy(&reply.body).into_owned(),
        });
    }
    Ok(reply.decision)
}

/// Applies the mutating webhook's decision to a JobSet; returns whether it changed and its
/// warnings.
fn inject_object(object: &mut Value, config: &InjectionConfig) -> Result<Vec<String>, Error> {
    let decision = review_create(Endpoint::Mutate, object, config)?;
    if !decision.allowed {
        return Err(Error::Denied {
            object: object_name(object),
            message: decision.message().unwrap_or("denied").to_owned(),
        });
    }
    apply_injection(object, &decision)?;
    Ok(decision.warnings)
}

/// Applies an allowed mutating decision's patch to a JobSet.
pub(super) fn apply_injection(object: &mut Value, decision: &Decision) -> Result<(), Error> {
    json_patch::patch(object, &decision.patch()).map_err(|source| Error::Patch {
        object: object_name(object),
        source,
    })
}

/// Visits every JobSet of a document, including the items of a `List`.
pub(super) fn for_each_jobset(
    value: &mut Value,
    f: &mut dyn FnMut(&mut Value) -> Result<(), Error>,
) -> Result<(), Error> {
    if is_jobset(value) {
        return f(value);
    }
    if value.get("kind").and_then(Value::as_str) == Some("List")
        && let Some(items) = value.get_mut("items").and_then(Value::as_array_mut)
    {
        for item in items {
            for_each_jobset(item, f)?;
        }
    }
    Ok(())
}

/// `inject`: the manifest file with every JobSet injected. Documents without a JobSet, and
/// JobSets the mutation leaves as they are, are printed byte for byte as they were written
/// (a file with nothing to inject comes back unchanged); injected YAML documents are re-rendered
/// under their own `---` line (their comments are lost). A JSON stream in which something changed
/// is printed again as a whole.
pub fn inject_text(path: &str, input: &str, config: &InjectionConfig) -> Result<String, Error> {
    let (format, docs) = parse_all_documents(path, input)?;
    let mut out = String::with_capacity(input.len());
    let mut changed_any = false;
    let mut json = String::new();
    for doc in docs {
        let mut value = doc.value.clone();
        for_each_jobset(&mut value, &mut |js| inject_object(js, config).map(drop))?;
        let changed = value != doc.value;
        changed_any |= changed;
        match format {
            Format::Yaml if !changed => out.push_str(&doc.raw),
            Format::Yaml => {
                // A document that follows always starts on a line of its own.
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str(marker_line(&doc.raw));
                out.push_str(&serde_saphyr::to_string(&value).map_err(Error::WriteYaml)?);
            }
            Format::Json => {
                json.push_str(&serde_json::to_string_pretty(&value).map_err(Error::WriteJson)?);
                json.push('\n');
            }
        }
    }
    Ok(match format {
        _ if !changed_any => input.to_owned(),
        Format::Yaml => out,
        Format::Json => json,
    })
}
