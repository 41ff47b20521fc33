//! The cluster decides the dialect: the installed JobSet CRD's `v1alpha2` status schema says which
//! epoch fields the API server keeps. `deprecatedEpoch`/`syncedEpoch` (the
//! `epoch-status-fields` patch; the released CRD never has them) mean `epoch`;
//! `previousInPlaceRestartAttempt`/`currentInPlaceRestartAttempt` alone (JobSet >= v0.11 as
//! released) mean `attempt`. [`dialect_of`] is the pure decision; [`read`] asks the API server,
//! bounded. Every component that has no `--protocol` (or injection-config `protocol`) uses it at
//! start; the agent takes the dialect the webhook injected into its env.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::Value;

use crate::protocol::Dialect;

/// The JobSet CRD's name.
pub const CRD_NAME: &str = "jobsets.jobset.x-k8s.io";

/// A dialect and why it was chosen (one line, for logs and the offline commands' note).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub dialect: Dialect,
    pub why: String,
}

/// The JobSet CRD's `v1alpha2` status schema, as far as the dialects care. Pure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusSchema<'a> {
    /// `x-kubernetes-preserve-unknown-fields`: any status field is stored.
    KeepsUnknown,
    /// The schema's `properties` (`None` when it has none).
    Properties(Option<&'a Value>),
}

/// The CRD's `v1alpha2` status schema, or a message naming the missing version. Shared by the
/// dialect choice below and the reconciler's start-up check of the fields it writes. Pure.
pub fn status_schema(crd: &Value) -> Result<StatusSchema<'_>, String> {
    let version = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|v| v.iter().find(|v| v["name"] == crate::jobset::VERSION))
        .ok_or_else(|| {
            format!(
                "the JobSet CRD {CRD_NAME} serves no {} version: install JobSet >= v0.11",
                crate::jobset::VERSION
            )
        })?;
    let status = version.pointer("/schema/openAPIV3Schema/properties/status");
    if status
        .and_then(|s| s.get("x-kubernetes-preserve-unknown-fields"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Ok(StatusSchema::KeepsUnknown);
    }
    Ok(StatusSchema::Properties(
        status.and_then(|s| s.get("properties")),
    ))
}

/// Which dialect the CRD's `v1alpha2` status schema speaks, or why none fits. Pure.
pub fn dialect_of(crd: &Value) -> Result<Choice, String> {
    let properties = match status_schema(crd)? {
        StatusSchema::KeepsUnknown => {
            return Err(format!(
                "the JobSet CRD {CRD_NAME} keeps any status field, so it does not say which \
                 dialect the cluster speaks: choose one with --protocol epoch or --protocol attempt"
            ));
        }
        StatusSchema::Properties(p) => p,
    };
    let has = |d: Dialect| {
        [d.deprecated_field(), d.synced_field()]
            .iter()
            .all(|f| properties.and_then(|p| p.get(*f)).is_some())
    };
    let fields = |d: Dialect| {
        format!(
            "status.{} and status.{}",
            d.deprecated_field(),
            d.synced_field()
        )
    };
    if has(Dialect::Epoch) {
        Ok(Choice {
            dialect: Dialect::Epoch,
            why: format!(
                "the JobSet CRD {CRD_NAME} has {} (the epoch-status-fields patch)",
                fields(Dialect::Epoch)
            ),
        })
    } else if has(Dialect::Attempt) {
        Ok(Choice {
            dialect: Dialect::Attempt,
            why: format!(
                "the JobSet CRD {CRD_NAME} has {} and no epoch fields (JobSet >= v0.11 as \
                 released)",
                fields(Dialect::Attempt)
            ),
        })
    } else {
        Err(format!(
            "the JobSet CRD {CRD_NAME} has neither {} nor {}: install JobSet >= v0.11 (attempt), \
             or apply the deploy/components/epoch-status-fields patch (epoch)",
            fields(Dialect::Epoch),
            fields(Dialect::Attempt)
        ))
    }
}

/// Reads the JobSet CRD and decides, all within `bound`.
pub async fn read(client: &kube::Client, bound: Duration) -> Result<Choice, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = match tokio::time::timeout(bound, api.get_opt(CRD_NAME)).await {
        Err(_) => {
            return Err(format!(
                "the API server did not answer the read of the JobSet CRD {CRD_NAME} within \
                 {bound:?}"
            ));
        }
        Ok(Err(e)) => return Err(format!("cannot read the JobSet CRD {CRD_NAME}: {e}")),
        Ok(Ok(None)) => {
            return Err(format!(
                "the JobSet CRD {CRD_NAME} is not installed: install JobSet first"
            ));
        }
        Ok(Ok(Some(crd))) => crd,
    };
    let value = serde_json::to_value(&crd)
        .map_err(|e| format!("cannot read the JobSet CRD {CRD_NAME}: {e}"))?;
    dialect_of(&value)
}

/// A dialect given explicitly (`source`: the flag or the config key that named it).
pub fn explicit(dialect: Dialect, source: &str) -> Choice {
    Choice {
        dialect,
        why: format!("{source} (overrides the cluster's JobSet CRD)"),
    }
}

/// The dialect of an offline command (`check`, `inject`, `review`): `explicit` when given, else
/// the cluster's JobSet CRD when a kubeconfig (or the in-cluster config) answers within `bound`,
/// else the default `epoch`. Never fails: `why` says which it was.
pub async fn for_offline(explicit_choice: Option<(Dialect, String)>, bound: Duration) -> Choice {
    if let Some((dialect, source)) = explicit_choice {
        return explicit(dialect, &source);
    }
    let fallback = |why: String| Choice {
        dialect: Dialect::default(),
        why: format!("{why}: the default"),
    };
    let mut config = match tokio::time::timeout(bound, kube::Config::infer()).await {
        Ok(Ok(config)) => config,
        Ok(Err(e)) => return fallback(format!("no cluster to ask ({e})")),
        Err(_) => return fallback(format!("no kubeconfig loaded within {bound:?}")),
    };
    config.connect_timeout = Some(bound);
    config.read_timeout = Some(bound);
    let client = match kube::Client::try_from(config) {
        Ok(c) => c,
        Err(e) => return fallback(format!("no cluster to ask ({e})")),
    };
    match read(&client, bound).await {
        Ok(choice) => Choice {
            why: format!("from the cluster: {}", choice.why),
            ..choice
        },
        Err(e) => fallback(format!("the cluster gave no dialect ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released_crd() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml");
        let text = std::fs::read_to_string(path).expect("released CRD fixture");
        crate::settings::from_yaml(&text).expect("yaml")
    }

    fn status_properties(crd: &mut Value) -> Vec<&mut Value> {
        crd["spec"]["versions"]
            .as_array_mut()
            .expect("versions")
            .iter_mut()
            .map(|v| &mut v["schema"]["openAPIV3Schema"]["properties"]["status"])
            .collect()
    }

    #[test]
    fn the_released_crd_speaks_attempt() {
        let choice = dialect_of(&released_crd()).expect("a dialect");
        assert_eq!(choice.dialect, Dialect::Attempt);
        assert!(
            choice.why.contains("previousInPlaceRestartAttempt"),
            "{}",
            choice.why
        );
    }

    #[test]
    fn the_patched_crd_speaks_epoch() {
        let mut crd = released_crd();
        for status in status_properties(&mut crd) {
            status["properties"]["deprecatedEpoch"] = serde_json::json!({"type": "integer"});
            status["properties"]["syncedEpoch"] = serde_json::json!({"type": "integer"});
        }
        let choice = dialect_of(&crd).expect("a dialect");
        assert_eq!(choice.dialect, Dialect::Epoch);
        assert!(choice.why.contains("epoch-status-fields"), "{}", choice.why);
    }

    #[test]
    fn neither_or_half_a_pair_fits_nothing() {
        let mut crd = released_crd();
        for status in status_properties(&mut crd) {
            let props = status["properties"].as_object_mut().expect("properties");
            props.remove("previousInPlaceRestartAttempt");
            // Half of the epoch pair is not the epoch dialect either.
            props.insert("syncedEpoch".into(), serde_json::json!({"type": "integer"}));
        }
        let err = dialect_of(&crd).expect_err("no dialect");
        assert!(err.contains("has neither"), "{err}");
        assert!(err.contains("install JobSet >= v0.11"), "{err}");
    }

    #[test]
    fn unknown_fields_or_no_v1alpha2_decide_nothing() {
        let mut crd = released_crd();
        for status in status_properties(&mut crd) {
            *status = serde_json::json!({"type": "object",
                "x-kubernetes-preserve-unknown-fields": true});
        }
        let err = dialect_of(&crd).expect_err("ambiguous");
        assert!(err.contains("--protocol"), "{err}");
        let err = dialect_of(&serde_json::json!({"spec": {"versions": [{"name": "v1"}]}}))
            .expect_err("no v1alpha2");
        assert!(err.contains("serves no v1alpha2"), "{err}");
    }

    #[test]
    fn an_explicit_dialect_says_where_it_came_from() {
        let choice = explicit(Dialect::Epoch, "--protocol epoch");
        assert_eq!(choice.dialect, Dialect::Epoch);
        assert!(choice.why.starts_with("--protocol epoch"), "{}", choice.why);
    }
}
