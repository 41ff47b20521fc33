//! Certificates kept in a Kubernetes Secret and trusted through the webhook configurations'
//! `caBundle`, for the in-cluster forms: `certs --secret --patch-webhooks` once, and
//! `webhook --self-signed` at start-up and periodically after.
//!
//! The Secret (`kubernetes.io/tls`, plus `ca.crt` and `ca.key`) is the one source of truth: the
//! first replica creates it, the others read it, and a replica that finds the serving
//! certificate due for renewal replaces it with a `resourceVersion` precondition, so no replica
//! ever overwrites another's CA or a newer certificate. The `caBundle` is patched before files
//! signed by a new CA are served.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{CA_CERT_FILE, CA_KEY_FILE, Error, TLS_CERT_FILE, TLS_KEY_FILE, ensure, write_atomic};

const FILES: [&str; 4] = [CA_CERT_FILE, CA_KEY_FILE, TLS_CERT_FILE, TLS_KEY_FILE];
/// Attempts at creating or replacing the Secret before giving up (each 409 means another
/// replica wrote it first; its content is then used).
const ATTEMPTS: usize = 4;

/// The four PEM files of a certificate set, by file name.
pub type Bundle = BTreeMap<String, Vec<u8>>;

fn kube_error(what: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kubernetes { what, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn read_bundle(dir: &Path) -> Result<Bundle, Error> {
    FILES
        .iter()
        .map(|f| {
            let path = dir.join(f);
            std::fs::read(&path)
                .map(|bytes| ((*f).to_owned(), bytes))
                .map_err(|source| Error::Read { path, source })
        })
        .collect()
}

fn write_bundle(dir: &Path, bundle: &Bundle) -> Result<(), Error> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_owned(),
            source,
        })?;
    }
    for (name, bytes) in bundle {
        let mode = if name.ends_with(".key") { 0o600 } else { 0o644 };
        write_atomic(&dir.join(name), bytes, mode)?;
    }
    Ok(())
}

/// The bundle of a Secret, when it holds all four files.
fn secret_bundle(secret: &Secret) -> Option<Bundle> {
    let data = secret.data.as_ref()?;
    FILES
        .iter()
        .map(|f| Some(((*f).to_owned(), data.get(*f)?.0.clone())))
        .collect()
}

fn secret_object(
    namespace: &str,
    name: &str,
    bundle: &Bundle,
    resource_version: Option<String>,
) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            resource_version,
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "jobset-inplace".to_owned(),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(
            bundle
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Makes the Secret `namespace/name` hold a CA and a serving certificate valid for `names`,
/// using `staging` as scratch space; returns the bundle now in the Secret.
pub async fn sync_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    names: &[String],
    staging: &Path,
) -> Result<Bundle, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("secret {namespace}/{name}");
    for _ in 0..ATTEMPTS {
        let current = api.get_opt(name).await.map_err(kube_error(what.clone()))?;
        let existing = current.as_ref().and_then(secret_bundle);
        // Start from what the Secret holds (nothing when absent or incomplete).
        if staging.exists() {
            std::fs::remove_dir_all(staging).map_err(|source| Error::Write {
                path: staging.to_owned(),
                source,
            })?;
        }
        if let Some(bundle) = &existing {
            write_bundle(staging, bundle)?;
        }
        let owned_names = names.to_vec();
        let dir = staging.to_owned();
        tokio::task::spawn_blocking(move || ensure(&dir, &owned_names))
            .await
            .map_err(Error::GenerateTask)??;
        let wanted = read_bundle(staging)?;
        if existing.as_ref() == Some(&wanted) {
            return Ok(wanted);
        }
        let result = match &current {
            None => {
                api.create(
                    &PostParams::default(),
                    &secret_object(namespace, name, &wanted, None),
                )
                .await
            }
            Some(secret) => {
                let rv = secret.metadata.resource_version.clone();
                api.replace(
                    name,
                    &PostParams::default(),
                    &secret_object(namespace, name, &wanted, rv),
                )
                .await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(secret = %what, created = current.is_none(), "webhook certificates stored");
                return Ok(wanted);
            }
            // Another replica wrote it first: read theirs and decide again.
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(kube_error(what)(e)),
        }
    }
    Err(Error::Contended { what })
}

/// Sets `caBundle` of every webhook in the two configurations named `config` to `ca_pem`.
/// Returns how many webhook entries changed.
pub async fn patch_ca_bundle(
    client: &kube::Client,
    config: &str,
    ca_pem: &[u8],
) -> Result<usize, Error> {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut changed = 0;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let what_m = format!("mutatingwebhookconfiguration {config}");
    let what_v = format!("validatingwebhookconfiguration {config}");
    let m = mutating
        .get(config)
        .await
        .map_err(kube_error(what_m.clone()))?;
    let m = serde_json::to_value(&m).unwrap_or(Value::Null);
    let v = validating
        .get(config)
        .await
        .map_err(kube_error(what_v.clone()))?;
    let v = serde_json::to_value(&v).unwrap_or(Value::Null);
    let ops_m = ca_bundle_ops(&m, &encoded);
    if !ops_m.is_empty() {
        changed += ops_m.len();
        mutating
            .patch(
                config,
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(json!(ops_m)).map_err(Error::Patch)?),
            )
            .await
            .map_err(kube_error(what_m))?;
    }
    let ops_v = ca_bundle_ops(&v, &encoded);
    if !ops_v.is_empty() {
        changed += ops_v.len();
        validating
            .patch(
                config,
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(json!(ops_v)).map_err(Error::Patch)?),
            )
            .await
            .map_err(kube_error(what_v))?;
    }
    Ok(changed)
}

/// JSON Patch operations setting every webhook's `clientConfig.caBundle` that differs. Pure.
pub fn ca_bundle_ops(configuration: &Value, encoded: &str) -> Vec<Value> {
    configuration
        .get("webhooks")
        .and_then(Value::as_array)
        .map(|hooks| {
            hooks
                .iter()
                .enumerate()
                .filter(|(_, h)| h.pointer("/clientConfig/caBundle").and_then(Value::as_str) != Some(encoded))
                .map(|(i, _)| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}))
                .collect()
        })
        .unwrap_or_default()
}

/// The in-cluster start-up and renewal step: sync the Secret, patch the `caBundle` when asked,
/// then (only then) install the files where the server reads them.
pub async fn bootstrap(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
    names: &[String],
    webhook_config: Option<&str>,
    dir: &Path,
) -> Result<(), Error> {
    let staging = dir.join(".staging");
    let bundle = sync_secret(client, namespace, secret, names, &staging).await?;
    if let (Some(config), Some(ca)) = (webhook_config, bundle.get(CA_CERT_FILE)) {
        let changed = patch_ca_bundle(client, config, ca).await?;
        if changed > 0 {
            tracing::info!(config, webhooks = changed, "caBundle patched");
        }
    }
    let installed = read_bundle(dir).ok();
    if installed.as_ref() != Some(&bundle) {
        write_bundle(dir, &bundle)?;
        tracing::info!(dir = %dir.display(), "webhook certificates installed");
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_bundle_ops_touch_only_stale_entries() {
        let config = json!({"webhooks": [
            {"name": "a", "clientConfig": {"caBundle": "old"}},
            {"name": "b", "clientConfig": {"caBundle": "new"}},
            {"name": "c", "clientConfig": {}}
        ]});
        let ops = ca_bundle_ops(&config, "new");
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0]["path"], "/webhooks/0/clientConfig/caBundle");
        assert_eq!(ops[1]["path"], "/webhooks/2/clientConfig/caBundle");
        assert!(ca_bundle_ops(&json!({}), "x").is_empty());
    }
}
