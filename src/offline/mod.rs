//! Offline `inject`, `check` and `review`: the webhook's decisions without a cluster, so a user's
//! CI can run admission tests. All three send an AdmissionReview body through
//! [`crate::admission::review`], the server's own entry (`inject` and `check` one CREATE of each
//! JobSet, [`crate::admission::review::create_body`]), and read its [`crate::admission::Decision`].

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::admission::config::InjectionArgs;
use crate::admission::{self, Endpoint, InjectionConfig};
use crate::settings::Global;
use crate::wire::jobset_crd;

mod check;
mod documents;
mod inject;
mod trainer;

pub use check::{Check, CheckReport, RuntimeRef, check_inputs, check_text, image_placeholder};
pub use documents::{Document, Format, parse_documents, split_yaml, split_yaml_raw};
pub use inject::inject_text;

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

impl Error {
    /// The exit code (docs/reference.md, "Exit codes"): 1 for a JobSet `inject` denies, 2 for
    /// an input, a config or an output it cannot read or write (nothing was judged).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Denied { .. } => 1,
            _ => 2,
        }
    }
}

/// `check`: every judged object allowed.
pub const EXIT_ALLOWED: u8 = 0;
/// `check`: some object denied (with `--strict`, also one with warnings).
pub const EXIT_DENIED: u8 = 1;
/// Every command: a usage or input error (a bad flag, an unreadable file, a YAML error).
pub const EXIT_INPUT: u8 = 2;
/// `check`: a `-f` input with nothing judged for in-place restart (without `--allow-empty`).
pub const EXIT_NOTHING: u8 = 3;

/// Flags of `jobset-inplace inject`.
#[derive(Clone, Debug, clap::Args)]
pub struct InjectArgs {
    /// Manifest file(s) or directories, YAML or JSON, multi-document; `-` reads stdin. A
    /// directory means its *.yaml, *.yml and *.json files (with `-R`, its subdirectories' too).
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,

    /// Read the directories given with `-f` recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,

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

    /// Accept a `-f` input with nothing judged for in-place restart (no JobSet with
    /// `restartStrategy: InPlaceRestart`, in itself, a (Cluster)TrainingRuntime, a TrainJob with
    /// its runtime or an AdmissionReview). Without it, that exits 3.
    #[arg(long)]
    pub allow_empty: bool,

    /// Fail (exit 1) on an object judged with warnings too, as on a denial.
    #[arg(long)]
    pub strict: bool,

    /// Validate the manifests as written. By default they are injected first, as the cluster's
    /// mutating webhook does before its validating webhook.
    #[arg(long)]
    pub no_inject: bool,

    /// `text`: a verdict line per object found, then its violations and warnings. `json`: one
    /// array with an object per object found (file, document, kind, object, judged: whether it
    /// was judged for in-place restart, allowed, violations with their rule and field path in
    /// the document, warnings), for CI systems that annotate pull requests. `yaml`: the same
    /// as YAML.
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
    /// What `json` prints, as YAML.
    Yaml,
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

/// How long an offline command waits for a cluster to name the dialect (`--protocol auto`).
const CLUSTER_BOUND: Duration = Duration::from_secs(3);

/// The injection config with the dialect of `--protocol`, else the config file's `protocol`,
/// else `epoch`. No cluster is contacted unless `--protocol auto` was given: then the cluster's
/// JobSet CRD names it (else `epoch`), and stderr says which it used.
async fn offline_config(args: &InjectionArgs, global: Global) -> Result<InjectionConfig, Error> {
    let explicit = match global.protocol {
        Some(d) => Some((d, format!("--protocol {d}"))),
        None if global.protocol_auto_given => None,
        None => Some(admission::config::file_protocol(args).unwrap_or((
            crate::protocol::Dialect::default(),
            "the default".to_owned(),
        ))),
    };
    let dialect = match explicit {
        Some((dialect, _)) => dialect,
        None => {
            let choice = jobset_crd::for_offline(None, CLUSTER_BOUND).await;
            eprintln!(
                "{}: the {} protocol ({})",
                global.name(),
                choice.dialect,
                choice.why
            );
            choice.dialect
        }
    };
    Ok(InjectionConfig::load(args, Some(dialect)).map_err(admission::Error::from)?)
}

impl InjectArgs {
    /// Prints the manifests injected, or nothing when the cluster would deny a JobSet of them:
    /// then each denied JobSet with its reasons on stderr, exit 1 (issue 47: `inject` never says
    /// ok to what the cluster's validating webhook will deny).
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = offline_config(&self.injection, global).await?;
        let mut inputs = Vec::new();
        for path in &self.files {
            for file in expand_input(path, self.recursive)? {
                let text = read_source(&file)?;
                inputs.push((file, text));
            }
        }
        let mut out = String::new();
        for (path, input) in &inputs {
            let text = inject_text(path, input, &config)?;
            // One stream: each file's documents start under a `---` line of their own.
            if !out.is_empty() && !text.is_empty() {
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                if !text.starts_with("---") {
                    out.push_str("---\n");
                }
            }
            out.push_str(&text);
        }
        let denied = injected_denials(&inputs, &config)?;
        if !denied.is_empty() {
            let name = global.name();
            for check in &denied {
                eprint!("{}", check.render());
            }
            eprintln!(
                "{name}: inject: {} JobSet(s) would be denied by the validating webhook once \
                 injected; nothing printed",
                denied.len()
            );
            return Ok(ExitCode::from(EXIT_DENIED));
        }
        write_stdout(out.as_bytes())?;
        Ok(ExitCode::SUCCESS)
    }
}

/// The JobSets of `inputs` (a `List`'s too) that the validating webhook denies once the
/// mutating webhook injected them: what `check` judges of them. Only JobSets: `inject` changes
/// nothing else.
pub fn injected_denials(
    inputs: &[(String, String)],
    config: &InjectionConfig,
) -> Result<Vec<Check>, Error> {
    Ok(check_inputs(inputs, config, true)?
        .checks
        .into_iter()
        .filter(|c| !c.allowed && c.kind == crate::jobset::KIND)
        .collect())
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
        for check in report.checks.iter().filter(|c| c.judged) {
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
        let denied = report
            .checks
            .iter()
            .any(|c| !c.allowed || (self.strict && c.judged && !c.warnings.is_empty()));
        let text = match self.output {
            OutputFormat::Text if report.checks.is_empty() => "nothing to judge\n".to_owned(),
            OutputFormat::Text => report.checks.iter().map(Check::render).collect(),
            OutputFormat::Json => {
                let items: Vec<Value> = report.checks.iter().map(Check::to_json).collect();
                let mut text = serde_json::to_string_pretty(&items).map_err(Error::WriteJson)?;
                text.push('\n');
                text
            }
            OutputFormat::Yaml => {
                let items: Vec<Value> = report.checks.iter().map(Check::to_json).collect();
                serde_saphyr::to_string(&items).map_err(Error::WriteYaml)?
            }
        };
        write_stdout(text.as_bytes())?;
        let name = global.name();
        for note in &report.notes {
            eprintln!("{name}: check: {note}");
        }
        let nothing = !empty.is_empty() && !self.allow_empty;
        if nothing {
            for path in &empty {
                eprintln!(
                    "{name}: check: {path}: nothing judged for in-place restart (no JobSet with \
                     restartStrategy InPlaceRestart, in itself, a (Cluster)TrainingRuntime, a \
                     TrainJob with its runtime or an AdmissionReview); --allow-empty accepts that"
                );
            }
        }
        Ok(ExitCode::from(check_exit_code(denied, nothing)))
    }
}

/// `check`'s exit code: a denial first, then an input with nothing judged, else 0.
pub fn check_exit_code(denied: bool, nothing_judged: bool) -> u8 {
    match (denied, nothing_judged) {
        (true, _) => EXIT_DENIED,
        (false, true) => EXIT_NOTHING,
        (false, false) => EXIT_ALLOWED,
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
        if reply.decision.outcome == admission::ReviewOutcome::Error
            && let Some(hint) = not_a_review(&body, &self.file)
        {
            eprintln!("{}: review: {hint}", global.name());
        }
        Ok(ExitCode::from(review_exit_code(reply.decision.outcome)))
    }
}

/// Issue 47: what `review` says of an object that is not an AdmissionReview (a JobSet, as a
/// user first tries), beside the server's own answer (`request.uid is missing`): what it read
/// and the commands that take a manifest.
fn not_a_review(body: &[u8], file: &str) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let kind = value.get("kind")?.as_str()?;
    if kind == "AdmissionReview" {
        return None;
    }
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map_or_else(String::new, |n| format!(" {n}"));
    let file = if file == "-" { "FILE" } else { file };
    Some(format!(
        "the input is a {kind}{name}, not an AdmissionReview: review answers an AdmissionReview \
         request as the webhook does (the API server sends one per admission); to judge a \
         manifest run `check -f {file}`, to inject it `inject -f {file}`"
    ))
}

/// `review`'s exit code: 0 allowed (patched or not), 1 denied, 2 a request the server cannot
/// read (its HTTP 400).
pub fn review_exit_code(outcome: admission::ReviewOutcome) -> u8 {
    match outcome {
        admission::ReviewOutcome::Allowed | admission::ReviewOutcome::Patched => EXIT_ALLOWED,
        admission::ReviewOutcome::Denied => EXIT_DENIED,
        admission::ReviewOutcome::Error => EXIT_INPUT,
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

#[cfg(test)]
mod tests;
