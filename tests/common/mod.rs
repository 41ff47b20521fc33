//! Shared by the integration tests: the admission fixtures and the JobSet v0.12 fixtures in
//! `fixtures/jobset-v0.12/` (the released CRD's schema, and our examples in its documented shapes).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

// Shared with the fuzz targets (fuzz/src/lib.rs includes the same file).
mod value_path;
#[allow(unused_imports)]
pub use value_path::review_through_value;

use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::admission::config::InjectionArgs;
use serde_json::Value;

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `fixtures/jobset-v0.12/`: see its ORIGIN.md.
pub fn reference_dir() -> PathBuf {
    manifest_dir().join("fixtures/jobset-v0.12")
}

pub fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
