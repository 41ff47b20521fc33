//! The repository's fixtures as tests read them: the admission cases of `fixtures/admission/`
//! (requests, expected answers, configs), the JobSet v0.12 fixtures of `fixtures/jobset-v0.12/`
//! (the released CRD's schema, and our examples in its documented shapes), and readers of the
//! parts of an AdmissionResponse the fixtures pin (warnings, violation fields).

use std::path::{Path, PathBuf};

use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::admission::config::InjectionArgs;
use serde_json::Value;

/// The product crate's directory: the repository root (the test kit is `testkit/` in it).
pub fn manifest_dir() -> PathBuf {
    let testkit = Path::new(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().unwrap_or(testkit).to_path_buf()
}

/// `to` relative to the directory `from` (kustomize takes no absolute paths); both absolute.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

/// `fixtures/jobset-v0.12/`: see its ORIGIN.md.
pub fn reference_dir() -> PathBuf {
    manifest_dir().join("fixtures/jobset-v0.12")
}

pub fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One case of `fixtures/admission/<case>/`.
pub struct Case {
    pub name: String,
    pub dir: PathBuf,
    /// `request.yaml` (or `request.json`) as a value.
    pub request: Value,
    /// The request as the JSON bytes the API server would send.
    pub body: Vec<u8>,
    /// `expected.yaml`.
    pub expected: Value,
    /// `config.yaml` if present, else the defaults.
    pub config: InjectionConfig,
}

impl Case {
    /// The expected object after the mutation patch (`mutated.yaml`).
    pub fn mutated_path(&self) -> PathBuf {
        self.dir.join("mutated.yaml")
    }
}

/// Every case, sorted by name.
pub fn admission_cases() -> Vec<Case> {
    let root = manifest_dir().join("fixtures/admission");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|dir| {
            let request = if dir.join("request.json").exists() {
                read_yaml(&dir.join("request.json"))
            } else {
                read_yaml(&dir.join("request.yaml"))
            };
            let config_path = dir.join("config.yaml");
            let args = InjectionArgs {
                config: config_path.exists().then_some(config_path),
                ..InjectionArgs::default()
            };
            let config = InjectionConfig::load(&args, None)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            Case {
                name: dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                body: serde_json::to_vec(&request).expect("serializes"),
                expected: read_yaml(&dir.join("expected.yaml")),
                request,
                config,
                dir,
            }
        })
        .collect()
}

/// The released JobSet CRD (`fixtures/jobset-v0.12/`); with `epoch_fields`, with the epoch
/// dialect's status fields (`deprecatedEpoch`, `syncedEpoch`) in every version, as the epoch
/// variants install it.
pub fn jobset_crd(epoch_fields: bool) -> Value {
    let mut crd = read_yaml(&reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
    if epoch_fields {
        for v in crd["spec"]["versions"].as_array_mut().into_iter().flatten() {
            let props = &mut v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
            props["deprecatedEpoch"] = serde_json::json!({"type": "integer", "format": "int32"});
            props["syncedEpoch"] = serde_json::json!({"type": "integer", "format": "int32"});
        }
    }
    crd
}

/// The released JobSet CRD's `v1alpha2` schema, compiled.
pub fn jobset_schema() -> jsonschema::Validator {
    let crd = read_yaml(&reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
    let schema = crd["spec"]["versions"]
        .as_array()
        .and_then(|versions| versions.iter().find(|v| v["name"] == "v1alpha2"))
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .expect("the CRD has a v1alpha2 schema");
    jsonschema::validator_for(&schema).expect("the CRD schema compiles")
}

/// Schema errors of an object, one line each.
pub fn schema_errors(schema: &jsonschema::Validator, object: &Value) -> Vec<String> {
    schema
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect()
}

/// The `warnings` of an AdmissionResponse.
pub fn warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The `field` of each cause of an AdmissionResponse's denial `Status`.
pub fn violation_fields(response: &Value) -> Vec<String> {
    response["status"]["details"]["causes"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["field"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One `fixtures/admission/<case>/`: its name, its request as JSON bytes, its `config.yaml`.
pub struct Fixture {
    pub name: String,
    pub body: Vec<u8>,
    pub config: Option<PathBuf>,
}

/// Every `fixtures/admission/<case>/request.{json,yaml,yml}` (YAML converted to JSON).
pub fn fixture_requests() -> Vec<Fixture> {
    let root = manifest_dir().join("fixtures/admission");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut cases: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    let mut requests = Vec::new();
    for case in cases {
        let name = case
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let json = case.join("request.json");
        let yaml = ["request.yaml", "request.yml"]
            .into_iter()
            .map(|f| case.join(f))
            .find(|p| p.exists());
        let config = Some(case.join("config.yaml")).filter(|p| p.exists());
        let body = if json.exists() {
            std::fs::read(&json).expect("read request.json")
        } else if let Some(yaml) = yaml {
            let text = std::fs::read_to_string(&yaml).expect("read request.yaml");
            let value: serde_json::Value =
                serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", yaml.display()));
            serde_json::to_vec(&value).expect("to json")
        } else {
            continue;
        };
        requests.push(Fixture { name, body, config });
    }
    requests
}

/// The largest fixture request without a config of its own (a server runs the default one)
/// when it has at least `min_bytes`, else a synthetic JobSet review; with what it is.
pub fn largest_request(min_bytes: usize) -> (String, Vec<u8>) {
    fixture_requests()
        .into_iter()
        .filter(|f| f.config.is_none())
        .max_by_key(|f| f.body.len())
        .filter(|f| f.body.len() >= min_bytes)
        .map(|f| (format!("fixture {}", f.name), f.body))
        .unwrap_or_else(|| {
            (
                "synthetic JobSet (4 replicatedJobs x 40 env vars)".to_owned(),
                crate::generators::jobset_review("bench", 4, 40),
            )
        })
}
