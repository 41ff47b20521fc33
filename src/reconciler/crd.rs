//! The start-up check that the installed JobSet CRD stores the status fields of the configured
//! dialect: without them the API server prunes every write and no group restart ever completes.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::Value;

use crate::protocol::Dialect;

pub use crate::wire::jobset_crd::CRD_NAME;

/// Why the start-up check failed (its own type, so that this module imports nothing of its
/// parent, which imports it).
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("cannot read the JobSet CRD jobsets.jobset.x-k8s.io: {0}")]
    Read(#[source] kube::Error),
    #[error("cannot read the JobSet CRD jobsets.jobset.x-k8s.io: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("{0}")]
    Fields(String),
}

/// Reads the CRD and checks it.
pub async fn check(client: &kube::Client, dialect: Dialect) -> Result<(), CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = api.get(CRD_NAME).await.map_err(CrdError::Read)?;
    let crd = serde_json::to_value(&crd).map_err(CrdError::Decode)?;
    missing_status_fields(&crd, dialect).map_err(CrdError::Fields)
}

/// Whether a CRD is installed (`Ok(false)` when the API server answers 404).
pub async fn exists(client: &kube::Client, name: &str) -> Result<bool, CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    Ok(api.get_opt(name).await.map_err(CrdError::Read)?.is_some())
}

/// `Ok` when the `v1alpha2` schema's `status` has both epoch fields of the dialect (or keeps
/// unknown fields); otherwise a message naming what is missing and what to install.
pub fn missing_status_fields(crd: &Value, dialect: Dialect) -> Result<(), String> {
    let properties = match crate::wire::jobset_crd::status_schema(crd)? {
        crate::wire::jobset_crd::StatusSchema::KeepsUnknown => return Ok(()),
        crate::wire::jobset_crd::StatusSchema::Properties(p) => p,
    };
    let missing: Vec<&str> = [dialect.deprecated_field(), dialect.synced_field()]
        .into_iter()
        .filter(|f| properties.and_then(|p| p.get(*f)).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let remedy = match dialect {
        Dialect::Epoch => {
            "patch the JobSet CRD (`kubectl patch crd jobsets.jobset.x-k8s.io --type json \
             --patch-file jobset-crd-epoch-status-fields.yaml`, a release's dist/ file; \
             deploy/components/epoch-status-fields), or run with --protocol attempt on JobSet \
             >= v0.11"
        }
        Dialect::Attempt => "install JobSet >= v0.11, or run with --protocol epoch",
    };
    Err(format!(
        "the JobSet CRD {CRD_NAME} has no status field {} for the {dialect} protocol: {remedy}",
        missing.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released_crd() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml");
        let text = std::fs::read_to_string(path).expect("released CRD fixture");
        serde_saphyr::from_str(&text).expect("yaml")
    }

    #[test]
    fn released_crd_speaks_the_attempt_dialect_only() {
        let crd = released_crd();
        assert_eq!(missing_status_fields(&crd, Dialect::Attempt), Ok(()));
        let err = missing_status_fields(&crd, Dialect::Epoch).expect_err("no epoch fields");
        assert!(err.contains("deprecatedEpoch, syncedEpoch"), "{err}");
        assert!(err.contains("epoch-status-fields"), "{err}");
    }

    #[test]
    fn patched_crd_speaks_the_epoch_dialect() {
        let mut crd = released_crd();
        let versions = crd["spec"]["versions"].as_array_mut().expect("versions");
        for v in versions {
            let props = &mut v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
            props["deprecatedEpoch"] = serde_json::json!({"type": "integer", "format": "int32"});
            props["syncedEpoch"] = serde_json::json!({"type": "integer", "format": "int32"});
        }
        assert_eq!(missing_status_fields(&crd, Dialect::Epoch), Ok(()));
    }
}
