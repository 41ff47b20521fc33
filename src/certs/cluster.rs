//! Certificates kept in a Kubernetes Secret and trusted through the webhook configurations'
//! `caBundle`: `webhook --self-signed` at start-up and every `--cert-renew-interval` after, and
//! `certs --secret [--patch-webhooks]` once ([`Renewer::step`]).
//!
//! The Secret is the one source of truth. Each step reads it and both webhook configurations,
//! asks [`rotation::decide`] what to do, writes the result under the `resourceVersion` it read
//! (a create when there is no Secret), and reads again; a 409 means another replica wrote first,
//! and its result is decided on instead. Once nothing is left to do, the `caBundle` of every
//! webhook is set to the CAs the Secret holds ([`rotation::trusted_bundle`], a targeted JSON
//! Patch guarded by `test` operations), and only then are the files installed where the server
//! reloads them. Every request is bounded by the request timeout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};

use super::rotation::{self, FILES, Material, NEXT_SINCE, PREVIOUS_SINCE, Policy, Step};
use super::{CA_CERT_FILE, CA_KEY_FILE, Error, TLS_CERT_FILE, TLS_KEY_FILE, write_atomic};
use crate::retry::CallError;

/// Writes (and lost races) in one step before giving up: a fresh Secret takes one, a renewal
/// that falls due with a rotation two; each 409 (another replica wrote first) takes one more.
const MAX_WRITES: usize = 6;

/// Tries at setting the caBundles, each on a fresh read after a `test` that failed.
const PATCH_ATTEMPTS: usize = 3;

/// The label every Secret written here carries.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "jobset-inplace");

fn kube_error(what: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kubernetes {
        what: what.to_owned(),
        source,
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Where the certificates live and what they are for.
#[derive(Clone, Debug)]
pub struct Target {
    /// Namespace of the Secret (and of the webhook's Service).
    pub namespace: String,
    pub secret: String,
    /// The Mutating- and ValidatingWebhookConfiguration whose `caBundle` is kept; `None`: the
    /// `caBundle` is someone else's business (the next CA then takes over after the overlap
    /// alone).
    pub webhook_config: Option<String>,
    /// The serving certificate's DNS names.
    pub names: Vec<String>,
    /// Where `tls.crt`, `tls.key` and `ca.crt` (the trusted CAs) are installed.
    pub dir: PathBuf,
    /// Also install `ca.key`, the signing CA's key (`certs --out`; never the webhook's).
    pub install_ca_key: bool,
}

/// What one [`Renewer::step`] did and found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The changes written, in order.
    pub steps: Vec<Step>,
    /// Nothing falls due before this (Unix seconds).
    pub wait_until: i64,
    /// The serving certificate's notAfter.
    pub serving_not_after: Option<i64>,
    /// The signing CA's notAfter.
    pub ca_not_after: Option<i64>,
    /// The next CA's notAfter, during the first phase of a rotation.
    pub next_ca_not_after: Option<i64>,
    /// Webhook entries whose `caBundle` was set.
    pub ca_bundles_set: usize,
    /// Whether the installed files changed.
    pub installed: bool,
}

/// Keeps the certificates of a [`Target`] as [`rotation`] decides.
#[derive(Clone)]
pub struct Renewer {
    client: kube::Client,
    target: Target,
    policy: Policy,
    request_timeout: Duration,
}

impl std::fmt::Debug for Renewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewer")
            .field("target", &self.target)
            .field("policy", &self.policy)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl Renewer {
    pub fn new(
        client: kube::Client,
        target: Target,
        policy: Policy,
        request_timeout: Duration,
    ) -> Self {
        Renewer {
            client,
            target,
            policy,
            request_timeout,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The installed serving certificate and key.
    pub fn tls_files(&self) -> (PathBuf, PathBuf) {
        (
            self.target.dir.join(TLS_CERT_FILE),
            self.target.dir.join(TLS_KEY_FILE),
        )
    }

    async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Error> {
        match crate::retry::bounded(self.request_timeout, call).await {
            Ok(v) => Ok(v),
            Err(CallError::Api(e)) => Err(kube_error(what)(e)),
            Err(CallError::Timeout(after)) => Err(Error::Timeout {
                what: what.to_owned(),
                after,
            }),
        }
    }

    fn secret_what(&self) -> String {
        format!("secret {}/{}", self.target.namespace, self.target.secret)
    }

    /// Both webhook configurations as JSON (`None` when none is managed).
    async fn read_configurations(&self) -> Result<Option<[Value; 2]>, Error> {
        let Some(name) = &self.target.webhook_config else {
            return Ok(None);
        };
        let what_m = format!("mutatingwebhookconfiguration {name}");
        let what_v = format!("validatingwebhookconfiguration {name}");
        let m = self
            .bounded(
                &what_m,
                Api::<MutatingWebhookConfiguration>::all(self.client.clone()).get(name),
            )
            .await?;
        let v = self
            .bounded(
                &what_v,
                Api::<ValidatingWebhookConfiguration>::all(self.client.clone()).get(name),
            )
            .await?;
        Ok(Some([
            serde_json::to_value(&m).map_err(Error::Patch)?,
            serde_json::to_value(&v).map_err(Error::Patch)?,
        ]))
    }

    /// Sets the `caBundle` of every webhook of both configurations (as read) to `pem`. A patch
    /// whose `test` fails (another replica set it meanwhile) is made again on a fresh read.
    async fn set_ca_bundles(
        &self,
        configurations: &[Value; 2],
        pem: &[u8],
    ) -> Result<usize, Error> {
        let mut read = configurations.clone();
        for attempt in 1..=PATCH_ATTEMPTS {
            match self.try_set_ca_bundles(&read, pem).await {
                Err(Error::Kubernetes { ref source, .. })
                    if attempt < PATCH_ATTEMPTS
                        && (is_status(source, 422) || is_status(source, 409)) =>
                {
                    tracing::debug!(attempt, "caBundle changed meanwhile; reading again");
                    match self.read_configurations().await? {
                        Some(fresh) => read = fresh,
                        None => return Ok(0),
                    }
                }
                other => return other,
            }
        }
        Ok(0)
    }

    async fn try_set_ca_bundles(
        &self,
        configurations: &[Value; 2],
        pem: &[u8],
    ) -> Result<usize, Error> {
        let Some(name) = &self.target.webhook_config else {
            return Ok(0);
        };
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        let mut changed = 0;
        for (i, configuration) in configurations.iter().enumerate() {
            let ops = ca_bundle_ops(configuration, &encoded);
            if ops.is_empty() {
                continue;
            }
            changed += ops.iter().filter(|op| op["op"] == "add").count();
            let patch: json_patch::Patch =
                serde_json::from_value(Value::Array(ops)).map_err(Error::Patch)?;
            let params = PatchParams::default();
            if i == 0 {
                let what = format!("mutatingwebhookconfiguration {name}");
                let api = Api::<MutatingWebhookConfiguration>::all(self.client.clone());
                self.bounded(&what, api.patch(name, &params, &Patch::Json::<()>(patch)))
                    .await?;
            } else {
                let what = format!("validatingwebhookconfiguration {name}");
                let api = Api::<ValidatingWebhookConfiguration>::all(self.client.clone());
                self.bounded(&what, api.patch(name, &params, &Patch::Json::<()>(patch)))
                    .await?;
            }
        }
        if changed > 0 {
            tracing::info!(config = %name, webhooks = changed, "caBundle set");
        }
        Ok(changed)
    }

    /// One pass: the Secret brought up to date (writing as many steps as fall due), the
    /// `caBundle` set to its CAs, the files installed.
    pub async fn step(&self) -> Result<Report, Error> {
        let what = self.secret_what();
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.target.namespace);
        let mut steps = Vec::new();
        for _ in 0..MAX_WRITES {
            let current = self
                .bounded(&what, api.get_opt(&self.target.secret))
                .await?;
            let configurations = self.read_configurations().await?;
            let material = current.as_ref().map(material_of).unwrap_or_default();
            let now = SystemTime::now();
            let bundles: Option<Vec<Vec<CertificateDer<'static>>>> = configurations
                .as_ref()
                .map(|cs| cs.iter().flat_map(ca_bundles_of).collect());
            let facts = rotation::inspect(
                &material,
                &self.target.names,
                rotation::unix(now),
                bundles.as_deref(),
            );
            let step = rotation::decide(&facts, &self.policy, rotation::unix(now));
            if let Step::Wait { until } = step {
                let ca_bundles_set = match &configurations {
                    Some(cs) => {
                        self.set_ca_bundles(cs, &rotation::trusted_bundle(&material))
                            .await?
                    }
                    None => 0,
                };
                let target = self.target.clone();
                let to_install = material.clone();
                let installed = tokio::task::spawn_blocking(move || install(&target, &to_install))
                    .await
                    .map_err(Error::GenerateTask)??;
                if installed {
                    tracing::info!(dir = %self.target.dir.display(), "webhook certificates installed");
                }
                let not_after = |v: &rotation::Validity| v.not_after;
                return Ok(Report {
                    steps,
                    wait_until: until,
                    serving_not_after: match &facts.serving {
                        rotation::Serving::Issued { validity, .. } => Some(validity.not_after),
                        _ => None,
                    },
                    ca_not_after: facts.signing.as_ref().ok().map(not_after),
                    next_ca_not_after: match &facts.next {
                        Some(Ok(next)) => Some(next.validity.not_after),
                        _ => None,
                    },
                    ca_bundles_set,
                    installed,
                });
            }
            let (policy, names) = (self.policy, self.target.names.clone());
            let (decided, read) = (step.clone(), material);
            let updated = tokio::task::spawn_blocking(move || {
                rotation::apply(&decided, &read, &facts, &policy, &names, now)
            })
            .await
            .map_err(Error::GenerateTask)??;
            let object = secret_object(
                &self.target.namespace,
                &self.target.secret,
                current.as_ref(),
                &updated,
            );
            let written = match &current {
                None => {
                    self.bounded(&what, api.create(&PostParams::default(), &object))
                        .await
                }
                Some(_) => {
                    self.bounded(
                        &what,
                        api.replace(&self.target.secret, &PostParams::default(), &object),
                    )
                    .await
                }
            };
            match written {
                Ok(_) => {
                    tracing::info!(secret = %what, step = %step, "webhook certificates changed");
                    steps.push(step);
                }
                // Another replica wrote first: decide again on what it wrote.
                Err(Error::Kubernetes { ref source, .. }) if is_status(source, 409) => {
                    tracing::debug!(secret = %what, "lost a write race; reading again");
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Contended { what })
    }
}

/// The certificates of a Secret and its rotation annotations (unreadable ones as absent).
pub fn material_of(secret: &Secret) -> Material {
    let files = secret
        .data
        .as_ref()
        .map(|data| {
            FILES
                .iter()
                .filter_map(|f| Some(((*f).to_owned(), data.get(*f)?.0.clone())))
                .collect()
        })
        .unwrap_or_default();
    let since = |key: &str| {
        secret
            .metadata
            .annotations
            .as_ref()?
            .get(key)?
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()
            .map(|t| t.as_second())
    };
    Material {
        files,
        next_since: since(NEXT_SINCE),
        previous_since: since(PREVIOUS_SINCE),
    }
}

/// `current` (or a new `kubernetes.io/tls` Secret) holding `material`: other data keys, labels
/// and annotations are kept, and the `resourceVersion` read is the write's precondition.
pub fn secret_object(
    namespace: &str,
    name: &str,
    current: Option<&Secret>,
    material: &Material,
) -> Secret {
    let mut secret = current.cloned().unwrap_or_else(|| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Default::default()
    });
    secret.metadata.managed_fields = None;
    secret
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    for file in FILES {
        data.remove(file);
    }
    for (file, bytes) in &material.files {
        data.insert(file.clone(), ByteString(bytes.clone()));
    }
    secret.string_data = None;
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    for (key, since) in [
        (NEXT_SINCE, material.next_since),
        (PREVIOUS_SINCE, material.previous_since),
    ] {
        match since.and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok()) {
            Some(t) => annotations.insert(key.to_owned(), t.to_string()),
            None => annotations.remove(key),
        };
    }
    if annotations.is_empty() {
        secret.metadata.annotations = None;
    }
    secret
}

/// The trust anchors of each webhook's `caBundle` in a configuration (none for a missing or
/// unreadable one).
pub fn ca_bundles_of(configuration: &Value) -> Vec<Vec<CertificateDer<'static>>> {
    configuration
        .get("webhooks")
        .and_then(Value::as_array)
        .map(|hooks| {
            hooks
                .iter()
                .map(|h| {
                    h.pointer("/clientConfig/caBundle")
                        .and_then(Value::as_str)
                        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                        .and_then(|pem| super::parse_certs(&pem, Path::new("caBundle")).ok())
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// JSON Patch operations setting every webhook's `clientConfig.caBundle` that differs from
/// `encoded`, each guarded by `test` operations on the webhook's name and the `caBundle` read:
/// if the list was reordered or the `caBundle` changed since, the whole patch fails instead of
/// writing into another webhook or over a newer value. Pure.
pub fn ca_bundle_ops(configuration: &Value, encoded: &str) -> Vec<Value> {
    let Some(hooks) = configuration.get("webhooks").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    for (i, hook) in hooks.iter().enumerate() {
        let current = hook
            .pointer("/clientConfig/caBundle")
            .and_then(Value::as_str);
        if current == Some(encoded) {
            continue;
        }
        let path = format!("/webhooks/{i}/clientConfig/caBundle");
        if let Some(name) = hook.get("name").and_then(Value::as_str) {
            ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
        }
        if let Some(current) = current {
            ops.push(json!({"op": "test", "path": path, "value": current}));
        }
        ops.push(json!({"op": "add", "path": path, "value": encoded}));
    }
    ops
}

/// Writes the serving pair (key first) and the trusted CAs (`ca.crt`), and the CA key when the
/// target says so, into the target's directory (created 0700), each file only when it changed.
/// Whether anything was written.
pub fn install(target: &Target, material: &Material) -> Result<bool, Error> {
    use std::os::unix::fs::DirBuilderExt as _;
    let dir = &target.dir;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::Write {
                path: dir.clone(),
                source,
            })?;
    }
    let file = |key: &str| material.files.get(key).cloned().unwrap_or_default();
    let mut files = vec![
        (TLS_KEY_FILE, file(TLS_KEY_FILE), 0o600),
        (TLS_CERT_FILE, file(TLS_CERT_FILE), 0o644),
        (CA_CERT_FILE, rotation::trusted_bundle(material), 0o644),
    ];
    if target.install_ca_key {
        files.push((CA_KEY_FILE, file(CA_KEY_FILE), 0o600));
    }
    let mut written = false;
    for (name, bytes, mode) in files {
        let path = dir.join(name);
        if std::fs::read(&path).ok().as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        write_atomic(&path, &bytes, mode)?;
        written = true;
    }
    Ok(written)
}

/// Sets `caBundle` of every webhook in the two configurations named `config` to `ca_pem`
/// (`certs --patch-webhooks` without `--secret`), each request bounded by `timeout`. Returns
/// how many webhook entries changed.
pub async fn patch_ca_bundle(
    client: &kube::Client,
    config: &str,
    ca_pem: &[u8],
    timeout: Duration,
) -> Result<usize, Error> {
    let renewer = Renewer::new(
        client.clone(),
        Target {
            namespace: String::new(),
            secret: String::new(),
            webhook_config: Some(config.to_owned()),
            names: Vec::new(),
            dir: PathBuf::new(),
            install_ca_key: false,
        },
        Policy::DEFAULT,
        timeout,
    );
    let Some(configurations) = renewer.read_configurations().await? else {
        return Ok(0);
    };
    renewer.set_ca_bundles(&configurations, ca_pem).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_bundle_ops_touch_only_stale_entries_and_test_what_they_read() {
        let config = json!({"webhooks": [
            {"name": "a", "clientConfig": {"caBundle": "old"}},
            {"name": "b", "clientConfig": {"caBundle": "new"}},
            {"name": "c", "clientConfig": {}}
        ]});
        let ops = ca_bundle_ops(&config, "new");
        assert_eq!(
            ops,
            [
                json!({"op": "test", "path": "/webhooks/0/name", "value": "a"}),
                json!({"op": "test", "path": "/webhooks/0/clientConfig/caBundle", "value": "old"}),
                json!({"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "new"}),
                json!({"op": "test", "path": "/webhooks/2/name", "value": "c"}),
                json!({"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "new"}),
            ]
        );
        assert!(ca_bundle_ops(&json!({}), "x").is_empty());

        // Applied to what was read: only the caBundles change. Applied to a reordered list or a
        // caBundle changed since: refused as a whole.
        let mut patched = config.clone();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("patch");
        json_patch::patch(&mut patched, &patch).expect("applies");
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            assert_eq!(patched["webhooks"][i]["name"], *name);
            assert_eq!(patched["webhooks"][i]["clientConfig"]["caBundle"], "new");
        }
        let mut reordered = json!({"webhooks": [config["webhooks"][2], config["webhooks"][1], config["webhooks"][0]]});
        assert!(json_patch::patch(&mut reordered, &patch).is_err());
        let mut changed = config.clone();
        changed["webhooks"][0]["clientConfig"]["caBundle"] = json!("newer");
        assert!(json_patch::patch(&mut changed, &patch).is_err());
    }

    #[test]
    fn secrets_keep_what_is_not_ours() {
        let mut material = Material::default();
        material.files.insert(CA_CERT_FILE.into(), b"ca".to_vec());
        material.files.insert(TLS_CERT_FILE.into(), b"tls".to_vec());
        material.next_since = Some(1_800_000_000);
        let current = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                resource_version: Some("42".into()),
                annotations: Some(BTreeMap::from([
                    ("keep".to_owned(), "me".to_owned()),
                    (PREVIOUS_SINCE.to_owned(), "2026-01-01T00:00:00Z".to_owned()),
                ])),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([
                ("other".to_owned(), ByteString(b"x".to_vec())),
                (
                    rotation::PREVIOUS_CA_CERT_FILE.to_owned(),
                    ByteString(b"old".to_vec()),
                ),
            ])),
            ..Default::default()
        };
        let s = secret_object("ns", "s", Some(&current), &material);
        assert_eq!(s.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(s.type_.as_deref(), Some("Opaque"), "a type cannot change");
        let data = s.data.as_ref().expect("data");
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["ca.crt", "other", "tls.crt"],
            "the previous CA is gone, another key is kept"
        );
        let annotations = s.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations["keep"], "me");
        assert_eq!(annotations[NEXT_SINCE], "2027-01-15T08:00:00Z");
        assert!(!annotations.contains_key(PREVIOUS_SINCE));
        assert_eq!(
            s.metadata.labels.as_ref().expect("labels")[MANAGED_BY.0],
            MANAGED_BY.1
        );
        // Read back: the same material.
        assert_eq!(material_of(&s), material);
        // A new one is a kubernetes.io/tls Secret.
        let fresh = secret_object("ns", "s", None, &material);
        assert_eq!(fresh.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(fresh.metadata.resource_version, None);
        // An unreadable annotation reads as absent.
        let mut odd = s.clone();
        odd.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(NEXT_SINCE.to_owned(), "yesterday".to_owned());
        assert_eq!(material_of(&odd).next_since, None);
    }
}
