//! Offline `inject`, `check` and `review`: the webhook's decisions without a cluster, so a user's
//! CI can run admission tests. All three go through [`crate::admission::decide`] (and `review`
//! through [`crate::admission::review`] itself), the server's own code path.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::admission::config::InjectionArgs;
use crate::admission::{self, Endpoint, InjectionConfig, Request};
use crate::settings::Global;
use crate::wire::jobset_crd;

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
    #[error("cannot inject {object}: {message}")]
    Denied { object: String, message: String },
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

    /// `text`: a verdict line per JobSet, then its violations and warnings. `json`: one array
    /// with an object per JobSet (file, document, object, allowed, violations with their field
    /// paths, warnings), for CI systems that annotate pull requests.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,

    #[command(flatten)]
    pub injection: InjectionArgs,
}

/// How `check` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
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

/// How long an offline command waits for a cluster to name the dialect.
const CLUSTER_BOUND: Duration = Duration::from_secs(3);

/// The injection config with the dialect of `--protocol`, the config file's `protocol`, or the
/// cluster's JobSet CRD when one answers (else `epoch`); says on stderr which it used.
async fn offline_config(args: &InjectionArgs, global: Global) -> Result<InjectionConfig, Error> {
    let explicit = match global.protocol {
        Some(d) => Some((d, format!("--protocol {d}"))),
        None => admission::config::file_protocol(args),
    };
    let choice = jobset_crd::for_offline(explicit, CLUSTER_BOUND).await;
    eprintln!(
        "jobset-inplace: the {} protocol ({})",
        choice.dialect, choice.why
    );
    Ok(InjectionConfig::load(args, Some(choice.dialect)).map_err(admission::Error::from)?)
}

impl InjectArgs {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = offline_config(&self.injection, global).await?;
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
        let config = offline_config(&self.injection, global).await?;
        let mut checks = Vec::new();
        for path in &self.files {
            let input = read_source(path)?;
            checks.extend(check_text(path, &input, &config, !self.no_inject)?);
        }
        let denied = checks.iter().any(|c| !c.allowed);
        let report = match self.output {
            OutputFormat::Text if checks.is_empty() => "no JobSet found\n".to_owned(),
            OutputFormat::Text => checks.iter().map(Check::render).collect(),
            OutputFormat::Json => {
                let items: Vec<Value> = checks.iter().map(Check::to_json).collect();
                let mut text = serde_json::to_string_pretty(&items).map_err(Error::WriteJson)?;
                text.push('\n');
                text
            }
        };
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
        let config = offline_config(&self.injection, global).await?;
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
fn parse_all_documents(path: &str, input: &str) -> Result<(Format, Vec<Document>), Error> {
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
            serde_yaml::from_str(&text).map_err(|e| parse_err(i + 1, e.to_string()))?;
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
fn marker_line(raw: &str) -> &str {
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
fn apply_injection(object: &mut Value, decision: &admission::Verdict) -> Result<(), Error> {
    json_patch::patch(object, &decision.patch).map_err(|source| Error::Patch {
        object: object_name(object),
        source,
    })
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
                out.push_str(&serde_yaml::to_string(&value).map_err(Error::WriteYaml)?);
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

/// The outcome of `check` for one JobSet.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub file: String,
    /// The document of the file that holds the JobSet, from 1 (as parse errors count them).
    pub document: usize,
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
            if v.path.is_empty() {
                s.push_str(&format!("  denied: {}\n", v.message));
            } else {
                s.push_str(&format!("  denied: {}: {}\n", v.path, v.message));
            }
        }
        for w in &self.warnings {
            s.push_str(&format!("  warning: {w}\n"));
        }
        s
    }

    /// The machine-readable form of `--output json`.
    pub fn to_json(&self) -> Value {
        let violations: Vec<Value> = self
            .violations
            .iter()
            .map(|v| serde_json::json!({"rule": v.rule.label(), "field": v.path, "message": v.message}))
            .collect();
        serde_json::json!({
            "file": self.file,
            "document": self.document,
            "kind": crate::jobset::KIND,
            "object": self.object,
            "allowed": self.allowed,
            "violations": violations,
            "warnings": self.warnings,
        })
    }
}

/// `check`: validates every JobSet of a manifest file (injected first unless `inject` is false).
pub fn check_text(
    path: &str,
    input: &str,
    config: &InjectionConfig,
    inject: bool,
) -> Result<Vec<Check>, Error> {
    let (_, docs) = parse_all_documents(path, input)?;
    let mut checks = Vec::new();
    for (index, doc) in docs.into_iter().enumerate() {
        let mut value = doc.value;
        for_each_jobset(&mut value, &mut |js| {
            let mut warnings = Vec::new();
            if inject {
                let injection = admission::decide(Endpoint::Mutate, &create_request(js), config);
                if !injection.allowed {
                    // Denied by the mutating webhook, as the cluster would: with its reasons.
                    let mut violations = injection.violations.clone();
                    if violations.is_empty() {
                        violations.push(admission::Violation {
                            // A denial that lists no field: the injection would be too large.
                            rule: injection
                                .rules
                                .first()
                                .copied()
                                .unwrap_or(admission::Rule::TooLarge),
                            path: String::new(),
                            message: injection.message().unwrap_or("denied").to_owned(),
                        });
                    }
                    checks.push(Check {
                        file: path.to_owned(),
                        document: index + 1,
                        object: object_name(js),
                        allowed: false,
                        violations,
                        warnings: injection.warnings,
                    });
                    return Ok(());
                }
                apply_injection(js, &injection)?;
                warnings = injection.warnings;
            }
            let decision = admission::decide(Endpoint::Validate, &create_request(js), config);
            warnings.extend(decision.warnings.iter().cloned());
            checks.push(Check {
                file: path.to_owned(),
                document: index + 1,
                object: object_name(js),
                allowed: decision.allowed,
                violations: decision.violations.clone(),
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
        for input in [
            "a: 1\n---\nb: 2 # keep\n--- # c\n...\n---\n",
            "--- {a: 1}",
            "x: |\n  y",
        ] {
            let raw: String = split_yaml_raw(input)
                .into_iter()
                .map(|(raw, _)| raw)
                .collect();
            assert_eq!(raw, input);
        }
    }

    #[test]
    fn inject_prints_untouched_documents_byte_for_byte() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        // No newline at the end of a block scalar, odd markers, a comment-only document, a
        // JobSet that is not an InPlaceRestart one: nothing to inject, so the file comes back.
        let not_ours = "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: r}\n\
                        spec:\n  replicatedJobs: []\n";
        for input in [
            format!(
                "--- # first\n{not_ours}...\n---\n# only a comment\n---\nkind: ConfigMap\ndata:\n  s: |\n    last line"
            ),
            format!("{not_ours}---\nscript: |\n  echo done"),
            "{\"kind\": \"ConfigMap\",   \"data\": {}}".to_owned(),
        ] {
            assert_eq!(inject_text("m", &input, &config).expect("injects"), input);
        }
        // Beside an injected JobSet, the others keep their bytes, the last one its missing
        // newline and its marker's comment.
        let tail = "--- # tail\nkind: ConfigMap\ndata:\n  s: |\n    no newline";
        let input = format!("{PLAIN}{tail}");
        let out = inject_text("m", &input, &config).expect("injects");
        assert!(out.ends_with(tail), "{out}");
        assert_ne!(out, input);
        let input = format!("{tail}\n---\n{PLAIN}");
        let out = inject_text("m", &input, &config).expect("injects");
        assert!(out.starts_with(&format!("{tail}\n---\n")), "{out}");
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

    /// Issue 11: what cannot be read is not "ok".
    #[test]
    fn check_denies_what_it_cannot_read() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        for (edit, path, expected) in [
            (
                PLAIN.replace("            containers:\n            - name: worker\n              image: train:1\n", "            containers: worker\n"),
                "spec.replicatedJobs[0].template.spec.template.spec.containers",
                "must be an array, is a string",
            ),
            (
                "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\nspec:\n  failurePolicy: {maxRestarts: 3, restartStrategy: InPlaceRestart}\n  replicatedJobs: {w: {}}\n".to_owned(),
                "spec.replicatedJobs",
                "must be an array, is an object",
            ),
        ] {
            let checks = check_text("m.yaml", &edit, &config, true).expect("checks");
            assert!(!checks[0].allowed, "{}", checks[0].render());
            assert!(
                checks[0]
                    .violations
                    .iter()
                    .any(|v| v.path == path && v.message.contains(expected)),
                "{}",
                checks[0].render()
            );
        }
    }

    /// `check` and `inject` answer as the webhook: a barrier port taken by the worker moves
    /// the injected agent; no port left denies the JobSet with the pod template's path.
    #[test]
    fn check_and_inject_move_the_barrier_or_deny_as_the_webhook_does() {
        let mut config = InjectionConfig::defaults(Dialect::Epoch);
        let taken = PLAIN.replace(
            "              image: train:1\n",
            "              image: train:1\n              ports: [{containerPort: 8080}]\n",
        );
        let checks = check_text("m.yaml", &taken, &config, true).expect("checks");
        assert!(checks[0].allowed, "{}", checks[0].render());
        let out = inject_text("m.yaml", &taken, &config).expect("injects");
        let (_, docs) = parse_documents("out", &out).expect("parses");
        let agent = docs[0]
            .value
            .pointer("/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0")
            .cloned()
            .unwrap_or_default();
        assert_eq!(agent["startupProbe"]["httpGet"]["port"], 18080);
        assert!(
            agent["env"].as_array().is_some_and(
                |e| e.contains(&serde_json::json!({"name": "BARRIER_PORT", "value": "18080"}))
            ),
            "{agent}"
        );

        config.barrier_fallback_ports = crate::admission::config::PortRange::NONE;
        let checks = check_text("m.yaml", &taken, &config, true).expect("checks");
        assert!(!checks[0].allowed);
        let text = checks[0].render();
        assert!(
            text.contains(
                "denied: spec.replicatedJobs[0].template.spec.template.spec.initContainers: no \
                 port for the injected agent's barrier"
            ),
            "{text}"
        );
        let err = inject_text("m.yaml", &taken, &config)
            .expect_err("denied")
            .to_string();
        assert!(
            err.contains("cannot inject js") && err.contains("barrier"),
            "{err}"
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
    fn check_json_has_an_object_per_jobset_with_field_paths() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let input = format!("kind: ConfigMap\n---\n{PLAIN}");
        let checks = check_text("m.yaml", &input, &config, false).expect("checks");
        let json = checks[0].to_json();
        assert_eq!(json["file"], "m.yaml");
        assert_eq!(json["document"], 2);
        assert_eq!(json["object"], "js");
        assert_eq!(json["allowed"], false);
        let fields: Vec<&str> = json["violations"]
            .as_array()
            .expect("violations")
            .iter()
            .filter_map(|v| v["field"].as_str())
            .collect();
        assert!(
            fields.contains(&"spec.replicatedJobs[0].template.spec.backoffLimit"),
            "{fields:?}"
        );
        assert!(json["violations"][0]["message"].is_string());
        assert!(json["warnings"].is_array());
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
