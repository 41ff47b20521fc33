//! Offline `inject`, `check` and `review`: the webhook's decisions without a cluster, so a user's
//! CI can run admission tests. All three go through [`crate::admission::decide`] (and `review`
//! through [`crate::admission::review`] itself), the server's own code path.

use std::io::{Read, Write};
use std::process::ExitCode;

use serde_json::Value;

use crate::admission::config::InjectionArgs;
use crate::admission::{self, Endpoint, InjectionConfig, Request};
use crate::settings::Global;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: not UTF-8 text")]
    NotText { path: String },
    #[error("{path}: document {document}: {reason}")]
    Parse {
        path: String,
        document: usize,
        reason: String,
    },
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
    #[error("cannot write the output: {0}")]
    WriteYaml(#[source] serde_yaml::Error),
    #[error("cannot write the output: {0}")]
    WriteJson(#[source] serde_json::Error),
    #[error("cannot apply the injection patch to {object}: {source}")]
    Patch {
        object: String,
        #[source]
        source: json_patch::PatchError,
    },
    #[error(transparent)]
    Config(#[from] admission::Error),
}

/// Flags of `jobset-inplace inject`.
#[derive(Clone, Debug, clap::Args)]
pub struct InjectArgs {
    /// Manifest file(s), YAML or JSON, multi-document; `-` reads stdin.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,

    #[command(flatten)]
    pub injection: InjectionArgs,
}

/// Flags of `jobset-inplace check`.
#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {
    /// Manifest file(s), YAML or JSON, multi-document; `-` reads stdin.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,

    /// Validate the manifests as written. By default they are injected first, as the cluster's
    /// mutating webhook does before its validating webhook.
    #[arg(long)]
    pub no_inject: bool,

    #[command(flatten)]
    pub injection: InjectionArgs,
}

/// Flags of `jobset-inplace review`.
#[derive(Clone, Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("endpoint").required(true).args(["mutate", "validate"])))]
pub struct ReviewArgs {
    /// Answer as `POST /mutate`.
    #[arg(long)]
    pub mutate: bool,

    /// Answer as `POST /validate`.
    #[arg(long)]
    pub validate: bool,

    /// The AdmissionReview request (JSON); `-` reads stdin.
    #[arg(short = 'f', long = "filename", default_value = "-")]
    pub file: String,

    #[command(flatten)]
    pub injection: InjectionArgs,
}

impl InjectArgs {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = InjectionConfig::load(&self.injection, global.protocol)
            .map_err(admission::Error::from)?;
        let mut out = String::new();
        for path in &self.files {
            let input = read_source(path)?;
            out.push_str(&inject_text(path, &input, &config)?);
        }
        write_stdout(out.as_bytes())?;
        Ok(ExitCode::SUCCESS)
    }
}

impl CheckArgs {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = InjectionConfig::load(&self.injection, global.protocol)
            .map_err(admission::Error::from)?;
        let mut report = String::new();
        let mut denied = false;
        let mut jobsets = 0;
        for path in &self.files {
            let input = read_source(path)?;
            let checks = check_text(path, &input, &config, !self.no_inject)?;
            jobsets += checks.len();
            for check in checks {
                denied |= !check.allowed;
                report.push_str(&check.render());
            }
        }
        if jobsets == 0 {
            report.push_str("no JobSet found\n");
        }
        write_stdout(report.as_bytes())?;
        Ok(if denied {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

impl ReviewArgs {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = InjectionConfig::load(&self.injection, global.protocol)
            .map_err(admission::Error::from)?;
        let body = read_source_bytes(&self.file)?;
        let endpoint = if self.mutate {
            Endpoint::Mutate
        } else {
            Endpoint::Validate
        };
        let reply = admission::review(endpoint, &body, &config);
        write_stdout(&reply.body)?;
        Ok(if reply.http_status == 200 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

fn read_source_bytes(path: &str) -> Result<Vec<u8>, Error> {
    let read_err = |source: std::io::Error| Error::Read {
        path: path.to_owned(),
        source,
    };
    if path == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map_err(read_err)?;
        Ok(buf)
    } else {
        std::fs::read(path).map_err(read_err)
    }
}

fn read_source(path: &str) -> Result<String, Error> {
    String::from_utf8(read_source_bytes(path)?).map_err(|_| Error::NotText {
        path: path.to_owned(),
    })
}

fn write_stdout(bytes: &[u8]) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(Error::Write)
}

/// How a manifest file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// One document of a manifest file: its original text (YAML) and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    pub text: String,
    pub value: Value,
}

/// Splits a manifest file into documents. JSON input (starting with `{` or `[`) is a stream of
/// objects, a top-level array holding several; anything else is a YAML stream split on `---`.
/// Empty documents are dropped.
pub fn parse_documents(path: &str, input: &str) -> Result<(Format, Vec<Document>), Error> {
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
                    value,
                })),
                value => docs.push(Document {
                    text: String::new(),
                    value,
                }),
            }
        }
        return Ok((Format::Json, docs));
    }
    let mut docs = Vec::new();
    for (i, text) in split_yaml(input).into_iter().enumerate() {
        let value: Value =
            serde_yaml::from_str(&text).map_err(|e| parse_err(i + 1, e.to_string()))?;
        if !value.is_null() {
            docs.push(Document { text, value });
        }
    }
    Ok((Format::Yaml, docs))
}

/// Splits a YAML stream on document markers (`---` at the start of a line), keeping each
/// document's text as written so that documents we do not touch are printed back unchanged.
pub fn split_yaml(input: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in input.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        if is_marker {
            docs.push(String::new());
            let rest = bare[3..].trim_start();
            if !rest.is_empty()
                && !rest.starts_with('#')
                && let Some(d) = docs.last_mut()
            {
                d.push_str(rest);
                d.push('\n');
            }
        } else if bare == "..." {
            continue;
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
        }
    }
    docs
}

/// `apiVersion: jobset.x-k8s.io/...`, `kind: JobSet`.
fn is_jobset(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(crate::jobset::KIND)
        && value
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with(&format!("{}/", crate::jobset::GROUP)))
}

fn object_name(value: &Value) -> String {
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

fn create_request(object: &Value) -> Request<'_> {
    Request {
        operation: "CREATE",
        group: crate::jobset::GROUP,
        kind: crate::jobset::KIND,
        object: Some(object),
        old_object: None,
    }
}

/// Applies the mutating webhook's decision to a JobSet; returns whether it changed and its
/// warnings.
fn inject_object(object: &mut Value, config: &InjectionConfig) -> Result<Vec<String>, Error> {
    let decision = admission::decide(Endpoint::Mutate, &create_request(object), config);
    json_patch::patch(object, &decision.patch).map_err(|source| Error::Patch {
        object: object_name(object),
        source,
    })?;
    Ok(decision.warnings)
}

/// Visits every JobSet of a document, including the items of a `List`.
fn for_each_jobset(
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

/// `inject`: the manifest file with every JobSet injected. Documents without a JobSet are printed
/// as they were written; injected YAML documents are re-rendered (their comments are lost).
pub fn inject_text(path: &str, input: &str, config: &InjectionConfig) -> Result<String, Error> {
    let (format, docs) = parse_documents(path, input)?;
    let mut rendered = Vec::with_capacity(docs.len());
    for doc in docs {
        let mut value = doc.value.clone();
        for_each_jobset(&mut value, &mut |js| inject_object(js, config).map(drop))?;
        let changed = value != doc.value;
        rendered.push(match format {
            Format::Yaml if !changed => doc.text,
            Format::Yaml => serde_yaml::to_string(&value).map_err(Error::WriteYaml)?,
            Format::Json => {
                let mut text = serde_json::to_string_pretty(&value).map_err(Error::WriteJson)?;
                text.push('\n');
                text
            }
        });
    }
    Ok(match format {
        Format::Yaml => rendered
            .iter()
            .map(|d| {
                if d.ends_with('\n') {
                    d.clone()
                } else {
                    format!("{d}\n")
                }
            })
            .collect::<Vec<_>>()
            .join("---\n"),
        Format::Json => rendered.concat(),
    })
}

/// The outcome of `check` for one JobSet.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub file: String,
    pub object: String,
    pub allowed: bool,
    pub violations: Vec<admission::Violation>,
    pub warnings: Vec<String>,
}

impl Check {
    /// Human-readable lines: a verdict, then each violation with its field path, then warnings.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{}: JobSet {}: {}\n",
            self.file,
            self.object,
            if self.allowed { "ok" } else { "denied" }
        );
        for v in &self.violations {
            s.push_str(&format!("  denied: {}: {}\n", v.path, v.message));
        }
        for w in &self.warnings {
            s.push_str(&format!("  warning: {w}\n"));
        }
        s
    }
}

/// `check`: validates every JobSet of a manifest file (injected first unless `inject` is false).
pub fn check_text(
    path: &str,
    input: &str,
    config: &InjectionConfig,
    inject: bool,
) -> Result<Vec<Check>, Error> {
    let (_, docs) = parse_documents(path, input)?;
    let mut checks = Vec::new();
    for doc in docs {
        let mut value = doc.value;
        for_each_jobset(&mut value, &mut |js| {
            let mut warnings = if inject {
                inject_object(js, config)?
            } else {
                Vec::new()
            };
            let decision = admission::decide(Endpoint::Validate, &create_request(js), config);
            warnings.extend(decision.warnings.iter().cloned());
            checks.push(Check {
                file: path.to_owned(),
                object: object_name(js),
                allowed: decision.allowed,
                violations: decision.violations(),
                warnings,
            });
            Ok(())
        })?;
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Dialect;

    const PLAIN: &str = "\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: js
spec:
  failurePolicy: {maxRestarts: 3, restartStrategy: InPlaceRestart}
  replicatedJobs:
  - name: w
    replicas: 2
    template:
      spec:
        parallelism: 2
        completions: 2
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: worker
              image: train:1
";

    #[test]
    fn split_keeps_text_and_markers() {
        let docs = split_yaml("a: 1\n---\nb: 2 # keep\n--- # c\n...\n---\n");
        assert_eq!(docs, vec!["a: 1\n", "b: 2 # keep\n", "", ""]);
        let docs = split_yaml("--- {a: 1}\n");
        assert_eq!(docs, vec!["", "{a: 1}\n"]);
    }

    #[test]
    fn inject_passes_other_documents_through_untouched() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let cm =
            "# a comment that survives\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n";
        let input = format!("{cm}---\n{PLAIN}");
        let out = inject_text("m.yaml", &input, &config).expect("injects");
        assert!(out.starts_with(cm), "{out}");
        let (_, docs) = parse_documents("out", &out).expect("parses");
        assert_eq!(docs.len(), 2);
        let js = &docs[1].value;
        assert_eq!(
            js.pointer("/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0/name"),
            Some(&Value::from("jobset-inplace-agent"))
        );
        // Injecting the output again changes nothing.
        assert_eq!(inject_text("out", &out, &config).expect("again"), out);
    }

    #[test]
    fn inject_json_and_lists() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let js: Value = serde_yaml::from_str(PLAIN).expect("yaml");
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [js]});
        let out = inject_text("l.json", &list.to_string(), &config).expect("injects");
        let (format, docs) = parse_documents("out", &out).expect("parses");
        assert_eq!(format, Format::Json);
        assert!(
            docs[0]
                .value
                .pointer("/items/0/spec/replicatedJobs/0/template/spec/backoffLimit")
                .is_some()
        );
    }

    #[test]
    fn check_reports_paths() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let checks = check_text("m.yaml", PLAIN, &config, true).expect("checks");
        assert_eq!(checks.len(), 1);
        assert!(checks[0].allowed, "{}", checks[0].render());
        let checks = check_text("m.yaml", PLAIN, &config, false).expect("checks");
        assert!(!checks[0].allowed);
        let text = checks[0].render();
        assert!(
            text.contains("denied: spec.replicatedJobs[0].template.spec.backoffLimit"),
            "{text}"
        );
        assert!(text.contains("initContainers"), "{text}");
    }

    #[test]
    fn bad_yaml_names_file_and_document() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let err = inject_text("m.yaml", "a: 1\n---\nb: [\n", &config)
            .expect_err("bad")
            .to_string();
        assert!(err.starts_with("m.yaml: document 2:"), "{err}");
    }
}
