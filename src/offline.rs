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
    WriteYaml(#[source] serde_saphyr::ser::Error),
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
    /// Manifest file(s) or directories, YAML or JSON, multi-document; `-` reads stdin. A
    /// directory means its *.yaml, *.yml and *.json files (with `-R`, its subdirectories' too).
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,

    /// Read the directories given with `-f` recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,

    /// Accept a `-f` input with nothing to judge (no JobSet, (Cluster)TrainingRuntime, TrainJob
    /// with its runtime, or AdmissionReview of a JobSet). Without it, that is an error (exit 1).
    #[arg(long)]
    pub allow_empty: bool,

    /// Validate the manifests as written. By default they are injected first, as the cluster's
    /// mutating webhook does before its validating webhook.
    #[arg(long)]
    pub no_inject: bool,

    /// `text`: a verdict line per object judged, then its violations and warnings. `json`: one
    /// array with an object per object judged (file, document, kind, object, allowed, violations
    /// with their rule and field path in the document, warnings), for CI systems that annotate
    /// pull requests.
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

    /// The AdmissionReview request, JSON or YAML; `-` reads stdin.
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
        // Every -f argument with its files, read whole first: a TrainJob's runtime may be in
        // another file of the same invocation.
        let mut inputs = Vec::new();
        let mut owners = Vec::new();
        for (arg, path) in self.files.iter().enumerate() {
            for file in expand_input(path, self.recursive)? {
                let text = read_source(&file)?;
                inputs.push((file, text));
                owners.push(arg);
            }
        }
        let report = check_inputs(&inputs, &config, !self.no_inject)?;
        let mut judged = vec![0usize; self.files.len()];
        for check in &report.checks {
            if let Some(i) = inputs.iter().position(|(file, _)| *file == check.file) {
                judged[owners[i]] += 1;
            }
        }
        let empty: Vec<&str> = self
            .files
            .iter()
            .zip(&judged)
            .filter(|(_, n)| **n == 0)
            .map(|(path, _)| path.as_str())
            .collect();
        let denied = report.checks.iter().any(|c| !c.allowed);
        let text = match self.output {
            OutputFormat::Text if report.checks.is_empty() => "nothing to judge\n".to_owned(),
            OutputFormat::Text => report.checks.iter().map(Check::render).collect(),
            OutputFormat::Json => {
                let items: Vec<Value> = report.checks.iter().map(Check::to_json).collect();
                let mut text = serde_json::to_string_pretty(&items).map_err(Error::WriteJson)?;
                text.push('\n');
                text
            }
        };
        write_stdout(text.as_bytes())?;
        for note in &report.notes {
            eprintln!("jobset-inplace: check: {note}");
        }
        if !empty.is_empty() && !self.allow_empty {
            for path in &empty {
                eprintln!(
                    "jobset-inplace: check: {path}: nothing to judge (no JobSet, \
                     (Cluster)TrainingRuntime, TrainJob with its runtime, or AdmissionReview of \
                     a JobSet); --allow-empty accepts that"
                );
            }
            return Ok(ExitCode::FAILURE);
        }
        Ok(if denied {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// The files one `-f` argument names: `-` (stdin) and a file as they are; a directory's
/// *.yaml, *.yml and *.json files, sorted by name (and, with `recursive`, those of its
/// subdirectories; symbolic links to directories are not followed).
pub fn expand_input(path: &str, recursive: bool) -> Result<Vec<String>, Error> {
    let read_err = |path: &std::path::Path, source: std::io::Error| Error::Read {
        path: path.display().to_string(),
        source,
    };
    if path == "-" || !std::path::Path::new(path).is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(path)];
    while let Some(dir) = dirs.pop() {
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| read_err(&dir, e))? {
            entries.push(entry.map_err(|e| read_err(&dir, e))?);
        }
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in entries {
            let entry_path = entry.path();
            let kind = entry.file_type().map_err(|e| read_err(&entry_path, e))?;
            if kind.is_dir() {
                if recursive {
                    subdirs.push(entry_path);
                }
                continue;
            }
            let manifest = entry_path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if manifest && entry_path.is_file() {
                files.push(entry_path.display().to_string());
            }
        }
        // Depth first, in name order.
        dirs.extend(subdirs.into_iter().rev());
    }
    Ok(files)
}

impl ReviewArgs {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = offline_config(&self.injection, global).await?;
        let body = review_body(read_source_bytes(&self.file)?);
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

/// The body `review` sends down the server's path: JSON as read (byte for byte), a YAML
/// AdmissionReview as its JSON. Anything else is passed on as it is, for the server's own
/// answer to what it cannot read.
fn review_body(input: Vec<u8>) -> Vec<u8> {
    let first = input.iter().find(|b| !b.is_ascii_whitespace());
    if matches!(first, Some(b'{') | None) {
        return input;
    }
    std::str::from_utf8(&input)
        .ok()
        .and_then(|text| crate::settings::from_yaml::<Value>(text).ok())
        .filter(Value::is_object)
        .and_then(|value| serde_json::to_vec(&value).ok())
        .unwrap_or(input)
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

/// The outcome of `check` for one object judged: a JobSet, or the JobSet inside another object.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub file: String,
    /// The document of the file that holds the object, from 1 (as parse errors count them).
    pub document: usize,
    /// The object's kind: `JobSet`, `ClusterTrainingRuntime`, `TrainingRuntime`, `TrainJob`
    /// or `AdmissionReview`.
    pub kind: String,
    pub object: String,
    /// For a TrainJob: the runtime whose JobSet template was judged (`Kind/name`, where it is).
    pub runtime: Option<RuntimeRef>,
    pub allowed: bool,
    /// Field paths are in the document (`spec.template.spec...` in a runtime, `request.object...`
    /// in an AdmissionReview); a TrainJob's are in its runtime's document.
    pub violations: Vec<admission::Violation>,
    pub warnings: Vec<String>,
}

/// Where a TrainJob's runtime was found.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeRef {
    pub kind: String,
    pub name: String,
    pub file: String,
    pub document: usize,
}

impl Check {
    /// Human-readable lines: a verdict, then each violation with its field path, then warnings.
    pub fn render(&self) -> String {
        let via = self.runtime.as_ref().map_or_else(String::new, |r| {
            format!(" (runtime {}/{} in {})", r.kind, r.name, r.file)
        });
        let mut s = format!(
            "{}: {} {}{via}: {}\n",
            self.file,
            self.kind,
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
        let mut json = serde_json::json!({
            "file": self.file,
            "document": self.document,
            "kind": self.kind,
            "object": self.object,
            "allowed": self.allowed,
            "violations": violations,
            "warnings": self.warnings,
        });
        if let (Some(r), Some(map)) = (&self.runtime, json.as_object_mut()) {
            map.insert(
                "runtime".to_owned(),
                serde_json::json!({"kind": r.kind, "name": r.name, "file": r.file, "document": r.document}),
            );
        }
        json
    }
}

/// What `check` found in its inputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckReport {
    pub checks: Vec<Check>,
    /// What was seen but could not be judged (a TrainJob whose runtime is not in the input).
    pub notes: Vec<String>,
}

/// `check`: validates every JobSet of a manifest file (injected first unless `inject` is false).
pub fn check_text(
    path: &str,
    input: &str,
    config: &InjectionConfig,
    inject: bool,
) -> Result<Vec<Check>, Error> {
    Ok(check_inputs(&[(path.to_owned(), input.to_owned())], config, inject)?.checks)
}

/// Kubeflow Trainer's API group: TrainJob, TrainingRuntime, ClusterTrainingRuntime.
const TRAINER_GROUP: &str = "trainer.kubeflow.org";

fn kind_of(value: &Value) -> Option<&str> {
    value.get("kind").and_then(Value::as_str)
}

fn in_group(value: &Value, group: &str) -> bool {
    value
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| {
            v.strip_prefix(group)
                .is_some_and(|rest| rest.starts_with('/'))
        })
}

fn is_runtime(value: &Value) -> bool {
    in_group(value, TRAINER_GROUP)
        && matches!(
            kind_of(value),
            Some("ClusterTrainingRuntime" | "TrainingRuntime")
        )
}

/// The JobSet a (Cluster)TrainingRuntime's `spec.template` (a JobSet template: metadata and
/// spec) describes, named after the runtime, with `spec.mlPolicy.numNodes` (when set) as its
/// trainer job's parallelism and completions, as Trainer sets them.
fn runtime_jobset(runtime: &Value) -> Value {
    let mut js = runtime_template(runtime);
    if let Some(nodes) = runtime.pointer("/spec/mlPolicy/numNodes") {
        apply_trainer(&mut js, &serde_json::json!({"numNodes": nodes}));
    }
    js
}

fn runtime_template(runtime: &Value) -> Value {
    let template = runtime
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_default();
    let mut metadata = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if let (Some(meta), Some(own)) = (metadata.as_object_mut(), runtime.get("metadata")) {
        for key in ["name", "namespace"] {
            if let Some(v) = own.get(key) {
                meta.insert(key.to_owned(), v.clone());
            }
        }
    }
    serde_json::json!({
        "apiVersion": format!("{}/v1alpha2", crate::jobset::GROUP),
        "kind": crate::jobset::KIND,
        "metadata": metadata,
        "spec": template.get("spec").cloned().unwrap_or_default(),
    })
}

/// The JobSet Trainer makes of a TrainJob and its runtime, as far as admission looks at it:
/// the runtime's template named after the TrainJob, with the TrainJob's `spec.labels` and
/// `spec.annotations`, and its `spec.trainer` (`numNodes` as the trainer job's parallelism and
/// completions; `image`, `command`, `args` on its `node` container). The trainer job is the
/// replicatedJob labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, else the one
/// named `node`.
fn trainjob_jobset(trainjob: &Value, runtime: &Value) -> Value {
    let mut js = runtime_jobset(runtime);
    if let Some(meta) = js.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in ["name", "namespace"] {
            match trainjob.pointer(&format!("/metadata/{key}")) {
                Some(v) => meta.insert(key.to_owned(), v.clone()),
                None => meta.remove(key),
            };
        }
        for key in ["labels", "annotations"] {
            if let Some(extra) = trainjob
                .pointer(&format!("/spec/{key}"))
                .and_then(Value::as_object)
            {
                let entry = meta
                    .entry(key.to_owned())
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(map) = entry.as_object_mut() {
                    map.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
    }
    if let Some(trainer) = trainjob.pointer("/spec/trainer") {
        apply_trainer(&mut js, trainer);
    }
    js
}

/// A TrainJob's `spec.trainer` (or a runtime's numNodes) on the trainer job of a JobSet.
fn apply_trainer(js: &mut Value, trainer: &Value) {
    let Some(jobs) = js
        .pointer_mut("/spec/replicatedJobs")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let labelled = |job: &Value| {
        job.pointer("/template/metadata/labels/trainer.kubeflow.org~1trainjob-ancestor-step")
            .and_then(Value::as_str)
            == Some("trainer")
    };
    let index = jobs.iter().position(labelled).or_else(|| {
        jobs.iter()
            .position(|j| j.get("name").and_then(Value::as_str) == Some("node"))
    });
    let Some(job) = index.and_then(|i| jobs.get_mut(i)) else {
        return;
    };
    if let Some(nodes) = trainer.get("numNodes").filter(|n| n.is_u64())
        && let Some(spec) = job
            .pointer_mut("/template/spec")
            .and_then(Value::as_object_mut)
    {
        spec.insert("parallelism".to_owned(), nodes.clone());
        spec.insert("completions".to_owned(), nodes.clone());
    }
    if let Some(containers) = job
        .pointer_mut("/template/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        && let Some(node) = containers
            .iter_mut()
            .find(|c| c.get("name").and_then(Value::as_str) == Some("node"))
            .and_then(Value::as_object_mut)
    {
        for key in ["image", "command", "args"] {
            if let Some(v) = trainer.get(key) {
                node.insert(key.to_owned(), v.clone());
            }
        }
    }
}

/// A field path of the judged JobSet as a path in the document that holds it.
fn rebase(path: &str, prefix: &str) -> String {
    if path.is_empty() || prefix.is_empty() {
        return path.to_owned();
    }
    format!("{prefix}{path}")
}

/// One JobSet to judge and where it came from.
struct Subject {
    kind: String,
    object: String,
    /// Prepended to the JobSet's `metadata...`/`spec...` paths; runtimes map `spec` and
    /// `metadata` to `spec.template.spec` and `spec.template.metadata`.
    prefix: &'static str,
    runtime: Option<RuntimeRef>,
    jobset: Value,
}

/// Image values taken for placeholders left in a template: `<...>` (`<CHANGE ME>`, `<image>`);
/// a repository path part or tag that is `CHANGE_ME`, `CHANGEME`, `CHANGE-ME`, `REPLACE_ME`,
/// `REPLACEME`, `REPLACE-ME`, `TODO` or `FIXME` (any case); an unrendered `${VAR}` or
/// `{{ .Values... }}`; the documentation registries `example.com`, `example.org`, `example.net`
/// (and their subdomains).
pub fn image_placeholder(image: &str) -> bool {
    const WORDS: [&str; 8] = [
        "CHANGE_ME",
        "CHANGEME",
        "CHANGE-ME",
        "REPLACE_ME",
        "REPLACEME",
        "REPLACE-ME",
        "TODO",
        "FIXME",
    ];
    let word = image
        .split(['/', ':', '@'])
        .any(|part| WORDS.iter().any(|w| part.eq_ignore_ascii_case(w)));
    let host = image.split('/').next().unwrap_or_default();
    let doc_host = image.contains('/')
        && ["example.com", "example.org", "example.net"]
            .iter()
            .any(|d| {
                let host = host.split(':').next().unwrap_or_default();
                host == *d || host.ends_with(&format!(".{d}"))
            });
    (image.contains('<') && image.contains('>'))
        || image.contains("${")
        || image.contains("{{")
        || word
        || doc_host
}

/// The released JobSet agent's container name (JobSet's own InPlaceRestart agent).
const JOBSET_AGENT_CONTAINER: &str = "in-place-restart-agent";

/// Warnings about a JobSet as written: placeholder images, and JobSet's own agent under the
/// `epoch` dialect (it speaks `attempt` only: its group restarts would never complete).
fn authoring_warnings(
    jobset: &Value,
    dialect: crate::protocol::Dialect,
    prefix: &str,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let jobs = jobset
        .pointer("/spec/replicatedJobs")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, job) in jobs.iter().enumerate() {
        for list in ["initContainers", "containers"] {
            let containers = job
                .pointer(&format!("/template/spec/template/spec/{list}"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for (k, c) in containers.iter().enumerate() {
                let path = rebase(
                    &format!("spec.replicatedJobs[{i}].template.spec.template.spec.{list}[{k}]"),
                    prefix,
                );
                if let Some(image) = c.get("image").and_then(Value::as_str)
                    && image_placeholder(image)
                {
                    warnings.push(format!(
                        "{path}.image: {image:?} looks like a placeholder; set the real image"
                    ));
                }
                if dialect == crate::protocol::Dialect::Epoch
                    && c.get("name").and_then(Value::as_str) == Some(JOBSET_AGENT_CONTAINER)
                {
                    warnings.push(format!(
                        "{path}: JobSet's own agent ({JOBSET_AGENT_CONTAINER}) speaks the attempt \
                         dialect only: under epoch its group restarts never complete; on a JobSet \
                         >= v0.11 cluster check with --protocol attempt, else let the webhook \
                         inject ours"
                    ));
                }
            }
        }
    }
    warnings
}

/// `check` over several files at once (a TrainJob's runtime may be in any of them): judges the
/// JobSets (and those of a `List`), the JobSet templates of (Cluster)TrainingRuntimes, the
/// JobSet of each TrainJob whose runtime is in the input, and the JobSet an AdmissionReview
/// carries as `request.object`.
pub fn check_inputs(
    inputs: &[(String, String)],
    config: &InjectionConfig,
    inject: bool,
) -> Result<CheckReport, Error> {
    let mut parsed = Vec::new();
    for (path, input) in inputs {
        let (_, docs) = parse_all_documents(path, input)?;
        parsed.push((path.as_str(), docs));
    }
    // The runtimes in the input, for the TrainJobs.
    let mut runtimes: Vec<(RuntimeRef, Option<String>, &Value)> = Vec::new();
    for (path, docs) in &parsed {
        for (index, doc) in docs.iter().enumerate() {
            if is_runtime(&doc.value) {
                let meta = |k: &str| {
                    doc.value
                        .pointer(&format!("/metadata/{k}"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                runtimes.push((
                    RuntimeRef {
                        kind: kind_of(&doc.value).unwrap_or_default().to_owned(),
                        name: meta("name").unwrap_or_default(),
                        file: (*path).to_owned(),
                        document: index + 1,
                    },
                    meta("namespace"),
                    &doc.value,
                ));
            }
        }
    }
    let mut report = CheckReport::default();
    for (path, docs) in &parsed {
        for (index, doc) in docs.iter().enumerate() {
            let mut subjects = Vec::new();
            let value = &doc.value;
            if is_runtime(value) {
                subjects.push(Subject {
                    kind: kind_of(value).unwrap_or_default().to_owned(),
                    object: object_name(value),
                    prefix: "spec.template.",
                    runtime: None,
                    jobset: runtime_jobset(value),
                });
            } else if in_group(value, TRAINER_GROUP) && kind_of(value) == Some("TrainJob") {
                let wanted_kind = value
                    .pointer("/spec/runtimeRef/kind")
                    .and_then(Value::as_str)
                    .unwrap_or("ClusterTrainingRuntime");
                let wanted = value
                    .pointer("/spec/runtimeRef/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let namespace = value.pointer("/metadata/namespace").and_then(Value::as_str);
                let found = runtimes.iter().find(|(r, ns, _)| {
                    r.kind == wanted_kind
                        && r.name == wanted
                        && (r.kind == "ClusterTrainingRuntime"
                            || ns.is_none()
                            || namespace.is_none()
                            || ns.as_deref() == namespace)
                });
                match found {
                    Some((r, _, runtime)) => subjects.push(Subject {
                        kind: "TrainJob".to_owned(),
                        object: object_name(value),
                        prefix: "spec.template.",
                        runtime: Some(r.clone()),
                        jobset: trainjob_jobset(value, runtime),
                    }),
                    None => report.notes.push(format!(
                        "{path}: document {}: TrainJob {}: its runtime {wanted_kind}/{wanted} is \
                         not in the input; not judged",
                        index + 1,
                        object_name(value)
                    )),
                }
            } else if kind_of(value) == Some("AdmissionReview")
                && let Some(object) = value.pointer("/request/object").filter(|o| is_jobset(o))
            {
                subjects.push(Subject {
                    kind: "AdmissionReview".to_owned(),
                    object: object_name(object),
                    prefix: "request.object.",
                    runtime: None,
                    jobset: object.clone(),
                });
            } else {
                let mut value = value.clone();
                for_each_jobset(&mut value, &mut |js| {
                    subjects.push(Subject {
                        kind: crate::jobset::KIND.to_owned(),
                        object: object_name(js),
                        prefix: "",
                        runtime: None,
                        jobset: js.clone(),
                    });
                    Ok(())
                })?;
            }
            for subject in subjects {
                report
                    .checks
                    .push(judge(path, index + 1, subject, config, inject)?);
            }
        }
    }
    Ok(report)
}

/// The verdict on one JobSet: injected first (unless `inject` is false) as the cluster's
/// mutating webhook does, then validated; paths and warnings rebased into the document.
fn judge(
    path: &str,
    document: usize,
    subject: Subject,
    config: &InjectionConfig,
    inject: bool,
) -> Result<Check, Error> {
    let Subject {
        kind,
        object,
        prefix,
        runtime,
        mut jobset,
    } = subject;
    let mut warnings = authoring_warnings(&jobset, config.protocol, prefix);
    let mut check = |allowed, violations: Vec<admission::Violation>, extra: Vec<String>| {
        // The webhook's warnings start with the JobSet's field path.
        warnings.extend(extra.into_iter().map(|w| {
            if w.starts_with("spec.") || w.starts_with("metadata.") {
                rebase(&w, prefix)
            } else {
                w
            }
        }));
        let rebased = |p: &str| rebase(p, prefix);
        Check {
            file: path.to_owned(),
            document,
            kind: kind.clone(),
            object: object.clone(),
            runtime: runtime.clone(),
            allowed,
            violations: violations
                .into_iter()
                .map(|v| admission::Violation {
                    path: rebased(&v.path),
                    ..v
                })
                .collect(),
            warnings: std::mem::take(&mut warnings),
        }
    };
    let mut extra = Vec::new();
    if inject {
        let injection = admission::decide(Endpoint::Mutate, &create_request(&jobset), config);
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
            return Ok(check(false, violations, injection.warnings));
        }
        apply_injection(&mut jobset, &injection)?;
        extra = injection.warnings;
    }
    let decision = admission::decide(Endpoint::Validate, &create_request(&jobset), config);
    extra.extend(decision.warnings.iter().cloned());
    Ok(check(decision.allowed, decision.violations.clone(), extra))
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
        let js: Value = crate::settings::from_yaml(PLAIN).expect("yaml");
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

    /// Issue 23: a runtime's JobSet template, a TrainJob with its runtime, an AdmissionReview are
    /// judged, their paths in the document that holds them.
    #[test]
    fn check_judges_the_jobsets_inside_other_objects() {
        let config = InjectionConfig::defaults(Dialect::Epoch);
        let body: String = PLAIN
            .lines()
            .skip_while(|l| !l.starts_with("spec:"))
            .skip(1)
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
            .replace("- name: w\n", "- name: node\n")
            .replace("- name: worker\n", "- name: node\n");
        let runtime = format!(
            "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n\
             metadata: {{name: rt}}\nspec:\n  template:\n    spec:\n{}",
            body.replace(
                "            parallelism: 2\n",
                "            backoffLimit: 0\n            parallelism: 2\n"
            )
        );
        let checks = check_text("rt.yaml", &runtime, &config, true).expect("checks");
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].kind, "ClusterTrainingRuntime");
        assert_eq!(checks[0].object, "rt");
        assert!(!checks[0].allowed, "{}", checks[0].render());
        assert!(
            checks[0].violations.iter().any(
                |v| v.path == "spec.template.spec.replicatedJobs[0].template.spec.backoffLimit"
            ),
            "{}",
            checks[0].render()
        );

        // A TrainJob whose runtime is in another input: judged as the JobSet Trainer makes.
        let trainjob = "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n\
                        metadata: {name: tj, namespace: ns}\n\
                        spec:\n  runtimeRef: {name: rt}\n  trainer: {image: 'REPLACE_ME'}\n";
        let inputs = [
            ("tj.yaml".to_owned(), trainjob.to_owned()),
            ("rt.yaml".to_owned(), runtime.clone()),
        ];
        let report = check_inputs(&inputs, &config, true).expect("checks");
        let tj = report
            .checks
            .iter()
            .find(|c| c.kind == "TrainJob")
            .expect("judged");
        assert_eq!((tj.file.as_str(), tj.object.as_str()), ("tj.yaml", "ns/tj"));
        assert_eq!(
            tj.runtime.as_ref().map(|r| r.file.as_str()),
            Some("rt.yaml")
        );
        assert!(!tj.allowed);
        assert!(
            tj.warnings
                .iter()
                .any(|w| w.contains("REPLACE_ME") && w.contains("placeholder")),
            "{}",
            tj.render()
        );
        // Without its runtime: not judged, and said so.
        let report = check_inputs(&inputs[..1], &config, true).expect("checks");
        assert!(report.checks.is_empty());
        assert!(
            report.notes[0].contains("ClusterTrainingRuntime/rt is not in the input"),
            "{:?}",
            report.notes
        );

        // An AdmissionReview: the JobSet inside.
        let js: Value = crate::settings::from_yaml(PLAIN).expect("yaml");
        let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "CREATE", "object": js}});
        let checks = check_text("r.json", &review.to_string(), &config, false).expect("checks");
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].kind, "AdmissionReview");
        assert!(
            checks[0]
                .violations
                .iter()
                .any(|v| v.path
                    == "request.object.spec.replicatedJobs[0].template.spec.backoffLimit"),
            "{}",
            checks[0].render()
        );
        assert_eq!(checks[0].to_json()["kind"], "AdmissionReview");
    }

    #[test]
    fn placeholder_images() {
        for image in [
            "<CHANGE ME>",
            "registry/<image>:1",
            "REPLACE_ME",
            "my-registry/app:TODO",
            "change-me:1",
            "example.com/team/train:1",
            "registry.example.org:5000/train",
            "${IMAGE}",
            "{{ .Values.image }}",
            "fixme",
        ] {
            assert!(image_placeholder(image), "{image}");
        }
        for image in [
            "pytorch/pytorch:2.7.1",
            "ghcr.io/todo-app/train:1",
            "example/train:1",
            "myexample.com/train:1",
            "train:1",
            "registry.k8s.io/jobset/in-place-restart-agent:v0.11.0",
        ] {
            assert!(!image_placeholder(image), "{image}");
        }
    }

    /// Issue 23: JobSet's own agent under `epoch` is a warning; under `attempt` it is what it is.
    #[test]
    fn jobsets_own_agent_under_epoch_is_a_warning() {
        let own = PLAIN.replace(
            "            containers:\n",
            "            initContainers:\n            - {name: in-place-restart-agent, image: agent:1, restartPolicy: Always}\n            containers:\n",
        );
        let js: Value = crate::settings::from_yaml(&own).expect("yaml");
        let epoch = authoring_warnings(&js, Dialect::Epoch, "");
        assert!(
            epoch
                .iter()
                .any(|w| w.contains("speaks the attempt dialect only")),
            "{epoch:?}"
        );
        assert!(authoring_warnings(&js, Dialect::Attempt, "").is_empty());
    }

    #[test]
    fn review_reads_yaml() {
        let json = br#"{"kind": "AdmissionReview"}"#.to_vec();
        assert_eq!(review_body(json.clone()), json);
        assert_eq!(
            review_body(b"kind: AdmissionReview\nrequest: {uid: u}\n".to_vec()),
            br#"{"kind":"AdmissionReview","request":{"uid":"u"}}"#.to_vec()
        );
        // Not an object: left for the server to refuse.
        assert_eq!(review_body(b"not json".to_vec()), b"not json".to_vec());
    }

    #[test]
    fn directories_list_their_manifests() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("sub/deeper")).expect("mkdir");
        for f in [
            "b.yaml",
            "a.yml",
            "c.json",
            "notes.txt",
            "sub/d.yaml",
            "sub/deeper/e.yaml",
        ] {
            std::fs::write(root.join(f), "").expect("write");
        }
        let names = |recursive| -> Vec<String> {
            expand_input(&root.display().to_string(), recursive)
                .expect("lists")
                .into_iter()
                .map(|p| p.trim_start_matches(&root.display().to_string()).to_owned())
                .collect()
        };
        assert_eq!(names(false), ["/a.yml", "/b.yaml", "/c.json"]);
        assert_eq!(
            names(true),
            [
                "/a.yml",
                "/b.yaml",
                "/c.json",
                "/sub/d.yaml",
                "/sub/deeper/e.yaml"
            ]
        );
        assert_eq!(expand_input("-", true).expect("stdin"), ["-"]);
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
