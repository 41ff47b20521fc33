//! `check`: every JobSet of the input judged as the cluster's webhooks would (injected first,
//! then validated), also those inside (Cluster)TrainingRuntimes, TrainJobs whose runtime is in the
//! input, and AdmissionReviews; with authoring warnings (placeholder images) and denials (JobSet's
//! own agent under the `epoch` dialect). A JobSet that does not ask for in-place restart is
//! reported as not judged.

use serde_json::Value;

use super::Error;
use super::documents::parse_all_documents;
use super::inject::{apply_injection, for_each_jobset, is_jobset, object_name, review_create};
use super::trainer::{
    TRAINER_GROUP, in_group, is_runtime, kind_of, runtime_jobset, trainjob_jobset,
};
use crate::admission::{self, Endpoint, InjectionConfig};

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
    /// Judged for in-place restart: the JobSet asks for it (`spec.failurePolicy.restartStrategy:
    /// InPlaceRestart`). One that does not is reported, not judged (and `allowed`).
    pub judged: bool,
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
        let verdict = match (self.judged, self.allowed) {
            (false, _) => {
                "not judged for in-place restart (its restartStrategy is not InPlaceRestart)"
            }
            (true, true) => "ok",
            (true, false) => "denied",
        };
        let mut s = format!(
            "{}: {} {}{via}: {verdict}\n",
            self.file, self.kind, self.object
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
            "judged": self.judged,
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

/// What `check` says of a JobSet as written beside the webhook's verdict: warnings about
/// placeholder images. (JobSet's own agent under `epoch` is the webhook's own denial,
/// `foreign_agent`, in `admission::account`.)
pub(super) fn authoring_findings(jobset: &Value, prefix: &str) -> Vec<String> {
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
                if let Some(image) = c.get("image").and_then(Value::as_str)
                    && image_placeholder(image)
                {
                    let path = rebase(
                        &format!(
                            "spec.replicatedJobs[{i}].template.spec.template.spec.{list}[{k}]"
                        ),
                        prefix,
                    );
                    warnings.push(format!(
                        "{path}.image: {image:?} looks like a placeholder; set the real image"
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
    let judged = crate::admission::view::JobSetView::from_value(&jobset).in_place_restart();
    let mut warnings = if judged {
        authoring_findings(&jobset, prefix)
    } else {
        Vec::new()
    };
    let mut check = |allowed: bool, violations: Vec<admission::Violation>, extra: Vec<String>| {
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
            judged,
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
        let injection = review_create(Endpoint::Mutate, &jobset, config)?;
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
    let decision = review_create(Endpoint::Validate, &jobset, config)?;
    extra.extend(decision.warnings);
    Ok(check(decision.allowed, decision.violations, extra))
}
