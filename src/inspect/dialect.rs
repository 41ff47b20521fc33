//! `doctor`'s `jobset-crd` check: the dialect an installation runs (its reconciler Deployment's
//! `--protocol` or `JOBSET_INPLACE_PROTOCOL`, a value or a ConfigMap key), and whether the JobSet
//! CRD has that dialect's status fields. Pure functions of the objects read.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::finding::{Finding, Outcome};
use super::kueue;
use crate::protocol::Dialect;
use crate::reconciler::crd;

/// Where the installed reconciler takes its dialect from (its Deployment's `reconciler`
/// container): `--protocol`, else the env `JOBSET_INPLACE_PROTOCOL`, a value or a ConfigMap's key
/// (the install manifests and the chart: the key `protocol` of the ConfigMap the webhook reads
/// its config from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstalledDialect {
    /// The value and where it was written.
    Value { value: String, source: String },
    /// To read from a ConfigMap of the system namespace.
    ConfigMapKey { name: String, key: String },
    /// No reconciler Deployment, or it names no dialect (the binary's `auto`).
    Unknown,
}

pub fn installed_dialect(
    deployment: Option<&k8s_openapi::api::apps::v1::Deployment>,
    namespace: &str,
) -> InstalledDialect {
    let Some(container) = deployment
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| {
            p.containers
                .iter()
                .find(|c| c.name == kueue::RECONCILER_CONTAINER)
        })
    else {
        return InstalledDialect::Unknown;
    };
    let deployment = format!("Deployment {namespace}/{}", kueue::RECONCILER_DEPLOYMENT);
    let mut args = container.args.iter().flatten();
    let mut flag = None;
    while let Some(arg) = args.next() {
        if let Some(rest) = arg.strip_prefix("--protocol") {
            if let Some(v) = rest.strip_prefix('=') {
                flag = Some(v.to_owned());
            } else if rest.is_empty() {
                flag = args.next().cloned();
            }
        }
    }
    if let Some(value) = flag {
        return InstalledDialect::Value {
            value,
            source: format!("--protocol of {deployment}"),
        };
    }
    let Some(env) = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "JOBSET_INPLACE_PROTOCOL")
    else {
        return InstalledDialect::Unknown;
    };
    if let Some(value) = &env.value {
        return InstalledDialect::Value {
            value: value.clone(),
            source: format!("JOBSET_INPLACE_PROTOCOL of {deployment}"),
        };
    }
    match env
        .value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
    {
        Some(r) => InstalledDialect::ConfigMapKey {
            name: r.name.clone(),
            key: r.key.clone(),
        },
        None => InstalledDialect::Unknown,
    }
}

/// The CRD has the dialect's two status fields: the dialect of `--protocol`, else the one the
/// installation is configured with (`installed`: the value and where it was read; `auto` or
/// none: the one the CRD implies, which is then reported).
pub fn check_crd(
    crd: Option<&CustomResourceDefinition>,
    dialect: Option<Dialect>,
    installed: Option<(&str, &str)>,
) -> Finding {
    let mut configured = None;
    if dialect.is_none()
        && let Some((value, source)) = installed
    {
        match value.trim() {
            "auto" | "" => {}
            v => match v.parse::<Dialect>() {
                Ok(d) => configured = Some((d, source)),
                Err(_) => {
                    return Finding::new(
                        "jobset-crd",
                        Outcome::Fail,
                        format!(
                            "the installed dialect {v:?} ({source}) is none of auto, epoch, \
                             attempt"
                        ),
                    );
                }
            },
        }
    }
    let finding = check_crd_for(crd, dialect.or(configured.map(|(d, _)| d)));
    match configured {
        Some((d, source)) => Finding {
            detail: format!(
                "the installation runs the {d} protocol ({source}): {}",
                finding.detail
            ),
            ..finding
        },
        None => finding,
    }
}

fn check_crd_for(crd: Option<&CustomResourceDefinition>, dialect: Option<Dialect>) -> Finding {
    const CHECK: &str = "jobset-crd";
    let Some(crd_object) = crd else {
        return Finding::new(
            CHECK,
            Outcome::Fail,
            format!("{} not found: install JobSet first", crd::CRD_NAME),
        );
    };
    let value = match serde_json::to_value(crd_object) {
        Ok(v) => v,
        Err(e) => return Finding::new(CHECK, Outcome::Fail, e.to_string()),
    };
    let Some(dialect) = dialect else {
        return match crate::wire::jobset_crd::dialect_of(&value) {
            Ok(choice) => Finding::new(
                CHECK,
                Outcome::Ok,
                format!(
                    "the {} protocol (what --protocol auto picks): {}",
                    choice.dialect, choice.why
                ),
            ),
            Err(e) => Finding::new(CHECK, Outcome::Fail, e),
        };
    };
    match crd::missing_status_fields(&value, dialect) {
        Ok(()) => Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "{} has status.{} and status.{} ({dialect} protocol)",
                crd::CRD_NAME,
                dialect.deprecated_field(),
                dialect.synced_field()
            ),
        ),
        Err(e) => Finding::new(CHECK, Outcome::Fail, e),
    }
}
