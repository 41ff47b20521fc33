//! `jobset-inplace doctor`: is the installation working? One finding per check, each from what
//! the API server holds: the webhook configurations and their `caBundle` against the serving
//! certificate, the days left on that certificate and on the CA, the JobSet CRD's status fields
//! for the dialect, the reconciler's leader lease, the nodes that declare the kubelet feature the
//! agent's restart rule needs, and (with `-n`) a namespace's agent account.
//!
//! Every check is a pure function of the objects read (and the time); [`run_checks`] reads them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use rustls::pki_types::CertificateDer;

pub use super::dialect::{InstalledDialect, check_crd, installed_dialect};
pub use super::finding::{Finding, Outcome};
use super::kueue;
use crate::certs;
use crate::protocol::Dialect;
use crate::reconciler::crd;
use crate::wire::epochs;

/// What to look for, and where.
#[derive(Clone, Debug)]
pub struct Target {
    /// `--protocol`; `None`: the dialect the JobSet CRD implies.
    pub dialect: Option<Dialect>,
    /// Namespace of the webhook, the reconciler and their Secret and Lease.
    pub system_namespace: String,
    /// Name of both webhook configurations.
    pub webhook_configuration: String,
    /// The Secret whose `tls.crt` the webhook serves.
    pub tls_secret: String,
    pub lease_name: String,
    /// Tenant namespaces whose agent account to check.
    pub namespaces: Vec<String>,
    pub agent_service_account: String,
    pub agent_role_binding: String,
    /// A certificate with fewer days left is a warning.
    pub warn_days: u64,
    /// `--nodes`: the training nodes' labels; the node check looks at those nodes only.
    pub nodes: std::collections::BTreeMap<String, String>,
    /// Namespace of Kueue's `kueue-manager-config` ConfigMap.
    pub kueue_namespace: String,
}

/// The caBundles of the webhook configurations, with the Service each webhook calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebhookEntry {
    /// `mutating/mutate.jobset-inplace.dev`.
    pub name: String,
    pub ca_bundle: Vec<u8>,
    /// `service.namespace.svc` when the client config names a Service; the URL's host otherwise.
    pub server_name: Option<String>,
}

fn entries_of_mutating(c: &MutatingWebhookConfiguration) -> Vec<WebhookEntry> {
    c.webhooks
        .iter()
        .flatten()
        .map(|w| entry("mutating", &w.name, &w.client_config))
        .collect()
}

fn entries_of_validating(c: &ValidatingWebhookConfiguration) -> Vec<WebhookEntry> {
    c.webhooks
        .iter()
        .flatten()
        .map(|w| entry("validating", &w.name, &w.client_config))
        .collect()
}

fn entry(
    kind: &str,
    name: &str,
    config: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig,
) -> WebhookEntry {
    let server_name = match (&config.service, &config.url) {
        (Some(s), _) => Some(format!("{}.{}.svc", s.name, s.namespace)),
        (None, Some(url)) => url
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split(['/', ':']).next())
            .map(str::to_owned),
        (None, None) => None,
    };
    WebhookEntry {
        name: format!("{kind}/{name}"),
        ca_bundle: config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone())
            .unwrap_or_default(),
        server_name,
    }
}

/// Both configurations exist and name at least one webhook.
pub fn check_configurations(
    mutating: Option<&MutatingWebhookConfiguration>,
    validating: Option<&ValidatingWebhookConfiguration>,
    name: &str,
) -> Finding {
    const CHECK: &str = "webhook-configurations";
    let count = |n: usize, kind: &str| format!("{kind}WebhookConfiguration {name}: {n} webhook(s)");
    match (mutating, validating) {
        (Some(m), Some(v)) => {
            let (m, v) = (entries_of_mutating(m).len(), entries_of_validating(v).len());
            if m == 0 || v == 0 {
                Finding::new(
                    CHECK,
                    Outcome::Fail,
                    format!("{}; {}", count(m, "Mutating"), count(v, "Validating")),
                )
            } else {
                Finding::new(
                    CHECK,
                    Outcome::Ok,
                    format!("{}; {}", count(m, "Mutating"), count(v, "Validating")),
                )
            }
        }
        (m, v) => {
            let missing: Vec<&str> = [
                m.is_none().then_some("MutatingWebhookConfiguration"),
                v.is_none().then_some("ValidatingWebhookConfiguration"),
            ]
            .into_iter()
            .flatten()
            .collect();
            Finding::new(
                CHECK,
                Outcome::Fail,
                format!(
                    "{} {name} not found: install a variant from deploy/ (or dist/)",
                    missing.join(" and ")
                ),
            )
        }
    }
}

fn days_left(not_after: SystemTime, now: SystemTime) -> i64 {
    match not_after.duration_since(now) {
        Ok(left) => i64::try_from(left.as_secs() / 86_400).unwrap_or(i64::MAX),
        Err(past) => -i64::try_from(past.duration().as_secs().div_ceil(86_400)).unwrap_or(i64::MAX),
    }
}

/// The not-after time of the first certificate of a PEM text.
pub fn not_after(pem: &str) -> Result<SystemTime, String> {
    let der = certs::parse_certs(pem.as_bytes(), std::path::Path::new("certificate"))
        .map_err(|e| e.to_string())?;
    let first = der.first().ok_or("no certificate")?;
    let secs = certs::not_after(first).ok_or("not an X.509 certificate")?;
    let secs = u64::try_from(secs).map_err(|_| "not-after before 1970".to_owned())?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Every webhook's `caBundle` verifies `serving_pem` for the name the API server calls it by,
/// now.
pub fn check_ca_bundle(
    entries: &[WebhookEntry],
    serving_pem: &str,
    source: &str,
    now: SystemTime,
) -> Finding {
    const CHECK: &str = "ca-bundle";
    if entries.is_empty() {
        return Finding::new(CHECK, Outcome::Fail, "no webhook to check");
    }
    let chain = match certs::parse_certs(serving_pem.as_bytes(), std::path::Path::new(source)) {
        Ok(c) => c,
        Err(e) => return Finding::new(CHECK, Outcome::Fail, e.to_string()),
    };
    let mut problems = Vec::new();
    for e in entries {
        if e.ca_bundle.is_empty() {
            problems.push(format!("{}: caBundle is empty", e.name));
            continue;
        }
        let roots: Vec<CertificateDer<'static>> =
            match certs::parse_certs(&e.ca_bundle, std::path::Path::new("caBundle")) {
                Ok(r) => r,
                Err(err) => {
                    problems.push(format!("{}: {err}", e.name));
                    continue;
                }
            };
        let Some(server) = &e.server_name else {
            problems.push(format!("{}: neither a service nor a URL", e.name));
            continue;
        };
        if let Err(err) = certs::verify_chain(&roots, &chain, std::slice::from_ref(server), now) {
            problems.push(format!("{}: {err}", e.name));
        }
    }
    if problems.is_empty() {
        Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "the caBundle of {} webhook(s) verifies the serving certificate ({source})",
                entries.len()
            ),
        )
    } else {
        Finding::new(CHECK, Outcome::Fail, problems.join("; "))
    }
}

/// Days left on a certificate; a warning under `warn_days`, a failure once expired.
pub fn check_expiry(
    check: &str,
    what: &str,
    pem: &str,
    now: SystemTime,
    warn_days: u64,
) -> Finding {
    match not_after(pem) {
        Err(e) => Finding::new(check, Outcome::Fail, format!("cannot read the {what}: {e}")),
        Ok(at) => {
            let days = days_left(at, now);
            let when = humantime_date(at);
            if days < 0 || at <= now {
                Finding::new(
                    check,
                    Outcome::Fail,
                    format!("the {what} expired on {when}"),
                )
            } else if u64::try_from(days).unwrap_or(0) < warn_days {
                Finding::new(
                    check,
                    Outcome::Warn,
                    format!("the {what} expires in {days} day(s), on {when}: renew it"),
                )
            } else {
                Finding::new(
                    check,
                    Outcome::Ok,
                    format!("the {what} has {days} day(s) left (until {when})"),
                )
            }
        }
    }
}

/// `2027-11-26` (UTC) for a time.
fn humantime_date(at: SystemTime) -> String {
    match k8s_openapi::jiff::Timestamp::try_from(at) {
        Ok(ts) => ts.strftime("%Y-%m-%d").to_string(),
        Err(_) => "an unrepresentable date".to_owned(),
    }
}

/// The JobSetEpoch CRD is installed: agents watch its small objects rather than their JobSet.
pub fn check_epochs_crd(crd: Option<&CustomResourceDefinition>) -> Finding {
    const CHECK: &str = "jobsetepoch-crd";
    match crd {
        Some(_) => Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "{} is installed: agents watch their JobSet's epochs in it",
                epochs::CRD_NAME
            ),
        ),
        None => Finding::new(
            CHECK,
            Outcome::Warn,
            format!(
                "{} is not installed: agents watch their whole JobSet instead, and every write \
                 to it reaches every agent; apply the install manifest (it carries the CRD) and \
                 restart the reconciler",
                epochs::CRD_NAME
            ),
        ),
    }
}

/// The lease has a holder that renewed it within its duration.
pub fn check_lease(lease: Option<&Lease>, namespace: &str, name: &str, now: SystemTime) -> Finding {
    const CHECK: &str = "reconciler-leader";
    let Some(lease) = lease else {
        return Finding::new(
            CHECK,
            Outcome::Fail,
            format!("lease {namespace}/{name} not found: no reconciler has ever led"),
        );
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Finding::new(
            CHECK,
            Outcome::Fail,
            format!("lease {namespace}/{name} has no holder: no reconciler leads"),
        );
    };
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15));
    let renewed = spec.renew_time.or(spec.acquire_time).map(|t| {
        let ts = t.0.as_second();
        UNIX_EPOCH + Duration::from_secs(u64::try_from(ts).unwrap_or(0))
    });
    match renewed {
        None => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("lease {namespace}/{name} held by {holder} was never renewed"),
        ),
        Some(at) => {
            let age = now.duration_since(at).unwrap_or_default();
            if age > duration {
                Finding::new(
                    CHECK,
                    Outcome::Fail,
                    format!(
                        "lease {namespace}/{name} held by {holder} was last renewed {}s ago, \
                         past its {}s duration: the leader is gone or cannot reach the API",
                        age.as_secs(),
                        duration.as_secs()
                    ),
                )
            } else {
                Finding::new(
                    CHECK,
                    Outcome::Ok,
                    format!(
                        "{holder} leads (lease {namespace}/{name} renewed {}s ago)",
                        age.as_secs()
                    ),
                )
            }
        }
    }
}

/// The namespace has the agent's ServiceAccount and a RoleBinding that names it.
pub fn check_agent_account(
    namespace: &str,
    account: &str,
    service_account: Option<&ServiceAccount>,
    binding: Option<&RoleBinding>,
    binding_name: &str,
) -> Finding {
    const CHECK: &str = "agent-account";
    if service_account.is_none() {
        return Finding::new(
            CHECK,
            Outcome::Fail,
            format!(
                "ServiceAccount {namespace}/{account} not found: the reconciler provisions it \
                 when an InPlaceRestart JobSet is created here (or label the namespace \
                 jobset-inplace.dev/enabled=true); is the reconciler running?"
            ),
        );
    }
    let Some(binding) = binding else {
        return Finding::new(
            CHECK,
            Outcome::Fail,
            format!("RoleBinding {namespace}/{binding_name} not found"),
        );
    };
    let names_agent = binding.subjects.iter().flatten().any(|s| {
        s.kind == "ServiceAccount"
            && s.name == account
            && s.namespace.as_deref().is_none_or(|n| n == namespace)
    });
    if names_agent {
        Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "ServiceAccount {namespace}/{account} is bound to ClusterRole {}",
                binding.role_ref.name
            ),
        )
    } else {
        Finding::new(
            CHECK,
            Outcome::Fail,
            format!("RoleBinding {namespace}/{binding_name} does not name {account}"),
        )
    }
}

/// The node feature the agent's `RestartAllContainers` rule needs: a kubelet that declares it
/// (`node.status.declaredFeatures`, gate `NodeDeclaredFeatures`) has the gate
/// `RestartAllContainersOnContainerExits` on. On a kubelet without it the rule is ignored: each
/// container falls back to its own `restartPolicy`, so an agent would restart alone beside old
/// workers (docs/protocol.md, "A node without the feature").
pub const RESTART_ALL_FEATURE: &str = "RestartAllContainersOnContainerExits";

/// How many node names a finding spells out.
const NODES_NAMED: usize = 8;

/// Which nodes declare [`RESTART_ALL_FEATURE`]. A node that declares nothing (a kubelet without
/// `NodeDeclaredFeatures`) is counted as not declaring it: nothing there shows the gate is on.
/// Some nodes without it is a warning (the scheduler keeps the JobSets' pods off them while it
/// runs with `NodeDeclaredFeatures`), none with it a failure.
pub fn check_nodes(nodes: &[Node]) -> Finding {
    const CHECK: &str = "node-features";
    if nodes.is_empty() {
        return Finding::new(CHECK, Outcome::Warn, "no nodes registered");
    }
    let without: Vec<&str> = nodes
        .iter()
        .filter(|n| {
            !n.status
                .as_ref()
                .and_then(|s| s.declared_features.as_ref())
                .is_some_and(|f| f.iter().any(|f| f == RESTART_ALL_FEATURE))
        })
        .map(|n| n.metadata.name.as_deref().unwrap_or("<unnamed>"))
        .collect();
    let named = |names: &[&str]| {
        let mut text = names
            .iter()
            .take(NODES_NAMED)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > NODES_NAMED {
            text.push_str(&format!(" and {} more", names.len() - NODES_NAMED));
        }
        text
    };
    if without.is_empty() {
        Finding::new(
            CHECK,
            Outcome::Ok,
            format!("all {} node(s) declare {RESTART_ALL_FEATURE}", nodes.len()),
        )
    } else if without.len() == nodes.len() {
        Finding::new(
            CHECK,
            Outcome::Fail,
            format!(
                "no node declares {RESTART_ALL_FEATURE} (node.status.declaredFeatures): {}; a kubelet without the gate ignores the agent's restart rule, so no group restart can run in place",
                named(&without)
            ),
        )
    } else {
        Finding::new(
            CHECK,
            Outcome::Warn,
            format!(
                "{} of {} node(s) do not declare {RESTART_ALL_FEATURE} (node.status.declaredFeatures): {}; pods of in-place JobSets must not run there (the scheduler keeps them off while it runs with NodeDeclaredFeatures)",
                without.len(),
                nodes.len(),
                named(&without)
            ),
        )
    }
}

/// `None` for a 404, the error otherwise.
async fn get_opt<K>(api: Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await
}

fn read_failure(check: &str, what: &str, e: &kube::Error) -> Finding {
    Finding::new(check, Outcome::Fail, format!("cannot read {what}: {e}"))
}

/// Runs every check against the cluster; each API call bounded by the client's timeouts.
pub async fn run_checks(client: &kube::Client, target: &Target, now: SystemTime) -> Vec<Finding> {
    let mut out = Vec::new();
    let sys = &target.system_namespace;
    let name = &target.webhook_configuration;
    let mutating = get_opt(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        name,
    )
    .await;
    let validating = get_opt(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        name,
    )
    .await;
    let mut entries = Vec::new();
    match (&mutating, &validating) {
        (Ok(m), Ok(v)) => {
            out.push(check_configurations(m.as_ref(), v.as_ref(), name));
            entries.extend(m.iter().flat_map(entries_of_mutating));
            entries.extend(v.iter().flat_map(entries_of_validating));
        }
        (Err(e), _) | (_, Err(e)) => {
            out.push(read_failure(
                "webhook-configurations",
                "the webhook configurations",
                e,
            ));
        }
    }

    let secret = get_opt(
        Api::<Secret>::namespaced(client.clone(), sys),
        &target.tls_secret,
    )
    .await;
    let key = |s: &Secret, k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let source = format!("Secret {sys}/{}", target.tls_secret);
    match &secret {
        Ok(Some(s)) => match key(s, "tls.crt") {
            Some(pem) => {
                if !entries.is_empty() {
                    out.push(check_ca_bundle(&entries, &pem, &source, now));
                }
                out.push(check_expiry(
                    "serving-certificate",
                    "serving certificate",
                    &pem,
                    now,
                    target.warn_days,
                ));
            }
            None => out.push(Finding::new(
                "serving-certificate",
                Outcome::Fail,
                format!("{source} has no tls.crt"),
            )),
        },
        Ok(None) => out.push(Finding::new(
            "serving-certificate",
            Outcome::Fail,
            format!(
                "{source} not found: the webhook has no certificate to serve (run \
                 `jobset-inplace certs --secret`, or check cert-manager's Certificate)"
            ),
        )),
        Err(e) => out.push(read_failure("serving-certificate", &source, e)),
    }
    // The CA the API server trusts: the first webhook's caBundle.
    if let Some(first) = entries.iter().find(|e| !e.ca_bundle.is_empty()) {
        out.push(check_expiry(
            "ca-certificate",
            &format!("CA in the caBundle of {}", first.name),
            &String::from_utf8_lossy(&first.ca_bundle),
            now,
            target.warn_days,
        ));
    }

    let installed = installed_dialect_read(client, target).await;
    match get_opt(
        Api::<CustomResourceDefinition>::all(client.clone()),
        crd::CRD_NAME,
    )
    .await
    {
        Ok(c) => out.push(check_crd(
            c.as_ref(),
            target.dialect,
            installed.as_ref().map(|(v, s)| (v.as_str(), s.as_str())),
        )),
        Err(e) => out.push(read_failure("jobset-crd", "the JobSet CRD", &e)),
    }
    match get_opt(
        Api::<CustomResourceDefinition>::all(client.clone()),
        epochs::CRD_NAME,
    )
    .await
    {
        Ok(c) => out.push(check_epochs_crd(c.as_ref())),
        Err(e) => out.push(read_failure("jobsetepoch-crd", "the JobSetEpoch CRD", &e)),
    }

    match get_opt(
        Api::<Lease>::namespaced(client.clone(), sys),
        &target.lease_name,
    )
    .await
    {
        Ok(l) => out.push(check_lease(l.as_ref(), sys, &target.lease_name, now)),
        Err(e) => out.push(read_failure("reconciler-leader", "the leader lease", &e)),
    }

    // Listing nodes is a cluster-wide read an operator may not have: a warning, not a failure.
    let selector = target
        .nodes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    match Api::<Node>::all(client.clone())
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    {
        Ok(nodes) => {
            out.push(check_nodes(&nodes.items));
            out.push(super::kubelet_version::check_kubelet_versions(&nodes.items));
        }
        Err(e) => out.push(Finding::new(
            "node-features",
            Outcome::Warn,
            format!("cannot list the nodes: {e}"),
        )),
    }

    out.push(kueue_check(client, target).await);
    out.push(node_lost_check(client, target).await);

    for ns in &target.namespaces {
        let sa = get_opt(
            Api::<ServiceAccount>::namespaced(client.clone(), ns),
            &target.agent_service_account,
        )
        .await;
        let rb = get_opt(
            Api::<RoleBinding>::namespaced(client.clone(), ns),
            &target.agent_role_binding,
        )
        .await;
        match (sa, rb) {
            (Ok(sa), Ok(rb)) => out.push(check_agent_account(
                ns,
                &target.agent_service_account,
                sa.as_ref(),
                rb.as_ref(),
                &target.agent_role_binding,
            )),
            (Err(e), _) | (_, Err(e)) => {
                out.push(read_failure("agent-account", "the agent's account", &e));
            }
        }
    }
    out
}

/// The installed reconciler's dialect ([`installed_dialect`]) as written, and where; `None` when
/// it names none or cannot be read (the CRD check then reports the dialect the CRD implies).
async fn installed_dialect_read(
    client: &kube::Client,
    target: &Target,
) -> Option<(String, String)> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    let sys = &target.system_namespace;
    let deployment = get_opt(
        Api::<Deployment>::namespaced(client.clone(), sys),
        kueue::RECONCILER_DEPLOYMENT,
    )
    .await
    .ok()
    .flatten();
    match installed_dialect(deployment.as_ref(), sys) {
        InstalledDialect::Value { value, source } => Some((value, source)),
        InstalledDialect::ConfigMapKey { name, key } => {
            let cm = get_opt(Api::<ConfigMap>::namespaced(client.clone(), sys), &name)
                .await
                .ok()
                .flatten()?;
            let value = cm.data.and_then(|mut d| d.remove(&key))?;
            Some((value, format!("key {key} of ConfigMap {sys}/{name}")))
        }
        InstalledDialect::Unknown => None,
    }
}

/// `node-lost`: the reconciler's Deployment, read.
async fn node_lost_check(client: &kube::Client, target: &Target) -> Finding {
    use k8s_openapi::api::apps::v1::Deployment;
    let sys = &target.system_namespace;
    let read = get_opt(
        Api::<Deployment>::namespaced(client.clone(), sys),
        kueue::RECONCILER_DEPLOYMENT,
    )
    .await
    .map_err(|e| e.to_string());
    super::node_lost::check_node_lost(read.as_ref().map(Option::as_ref).map_err(Clone::clone), sys)
}

/// `kueue-wait-for-pods-ready`: Kueue's ConfigMap and the reconciler's Deployment, read.
async fn kueue_check(client: &kube::Client, target: &Target) -> Finding {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    let ns = &target.kueue_namespace;
    let config = match get_opt(
        Api::<ConfigMap>::namespaced(client.clone(), ns),
        kueue::CONFIG_MAP,
    )
    .await
    {
        Ok(None) => None,
        Ok(Some(cm)) => Some(
            cm.data
                .and_then(|mut d| d.remove(kueue::CONFIG_KEY))
                .ok_or_else(|| format!("no key {}", kueue::CONFIG_KEY)),
        ),
        Err(e) => Some(Err(e.to_string())),
    };
    let sys = &target.system_namespace;
    let restart = match get_opt(
        Api::<Deployment>::namespaced(client.clone(), sys),
        kueue::RECONCILER_DEPLOYMENT,
    )
    .await
    {
        Ok(d) => kueue::group_restart_timeout(d.as_ref(), sys),
        Err(e) => (
            Err(e.to_string()),
            format!("of Deployment {sys}/{}", kueue::RECONCILER_DEPLOYMENT),
        ),
    };
    kueue::check_pods_ready(config, ns, restart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DAY: Duration = Duration::from_secs(86_400);

    fn pair(days: u64) -> (certs::PemPair, certs::PemPair) {
        let ca = certs::generate_ca(Duration::from_secs(days * 2 * 86_400)).expect("ca");
        let names = certs::service_names("jobset-inplace-webhook", "jobset-inplace-system");
        let serving = certs::issue_serving(&ca, &names, DAY * u32::try_from(days).expect("days"))
            .expect("serving");
        (ca, serving)
    }

    fn entries(ca: &str) -> Vec<WebhookEntry> {
        let m: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": "jobset-inplace"},
            "webhooks": [{"name": "mutate.jobset-inplace.dev", "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"caBundle": k8s_openapi::ByteString(ca.as_bytes().to_vec()),
                    "service": {"name": "jobset-inplace-webhook",
                                "namespace": "jobset-inplace-system"}}}]
        }))
        .expect("mutating");
        entries_of_mutating(&m)
    }

    fn released_crd() -> CustomResourceDefinition {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml");
        let text = std::fs::read_to_string(path).expect("released CRD fixture");
        crate::settings::from_yaml(&text).expect("a CRD")
    }

    fn reconciler(
        env: serde_json::Value,
        args: serde_json::Value,
    ) -> k8s_openapi::api::apps::v1::Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": kueue::RECONCILER_DEPLOYMENT},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "reconciler", "env": env, "args": args}]}}}
        }))
        .expect("a Deployment")
    }

    /// Issue 36: where the installed reconciler's dialect is written: its flag, its env's value,
    /// or the ConfigMap key the install manifests and the chart point its env at.
    #[test]
    fn the_installed_dialect_is_read_from_the_reconciler() {
        let from_cm = reconciler(
            json!([{"name": "JOBSET_INPLACE_PROTOCOL", "valueFrom": {"configMapKeyRef":
                {"name": "jobset-inplace-config-h4sh", "key": "protocol"}}}]),
            json!([]),
        );
        assert_eq!(
            installed_dialect(Some(&from_cm), "sys"),
            InstalledDialect::ConfigMapKey {
                name: "jobset-inplace-config-h4sh".into(),
                key: "protocol".into()
            }
        );
        let value = reconciler(
            json!([{"name": "JOBSET_INPLACE_PROTOCOL", "value": "attempt"}]),
            json!(["--lease-name", "x"]),
        );
        assert!(matches!(
            installed_dialect(Some(&value), "sys"),
            InstalledDialect::Value { value, .. } if value == "attempt"
        ));
        for args in [json!(["--protocol", "epoch"]), json!(["--protocol=epoch"])] {
            let flag = reconciler(
                json!([{"name": "JOBSET_INPLACE_PROTOCOL", "value": "attempt"}]),
                args,
            );
            assert!(matches!(
                installed_dialect(Some(&flag), "sys"),
                InstalledDialect::Value { value, source } if value == "epoch" && source.starts_with("--protocol")
            ));
        }
        assert_eq!(installed_dialect(None, "sys"), InstalledDialect::Unknown);
        assert_eq!(
            installed_dialect(Some(&reconciler(json!([]), json!([]))), "sys"),
            InstalledDialect::Unknown
        );
    }

    /// Issue 36: an installation configured for epoch on a CRD without the epoch fields fails,
    /// with the fix; `auto` or nothing reports what the CRD implies; `--protocol` wins.
    #[test]
    fn the_crd_check_holds_the_installed_dialect() {
        let crd = released_crd();
        let epoch = check_crd(
            Some(&crd),
            None,
            Some(("epoch", "key protocol of ConfigMap s/c")),
        );
        assert_eq!(epoch.verdict, Outcome::Fail, "{}", epoch.render());
        let text = epoch.render();
        assert!(text.contains("key protocol of ConfigMap s/c"), "{text}");
        assert!(text.contains("deprecatedEpoch"), "{text}");
        assert!(
            text.contains("kubectl patch crd jobsets.jobset.x-k8s.io"),
            "{text}"
        );
        let attempt = check_crd(Some(&crd), None, Some(("attempt", "s")));
        assert_eq!(attempt.verdict, Outcome::Ok, "{}", attempt.render());
        for installed in [None, Some(("auto", "s"))] {
            let auto = check_crd(Some(&crd), None, installed);
            assert_eq!(auto.verdict, Outcome::Ok, "{}", auto.render());
            assert!(
                auto.render().contains("attempt protocol"),
                "{}",
                auto.render()
            );
        }
        let flag = check_crd(Some(&crd), Some(Dialect::Attempt), Some(("epoch", "s")));
        assert_eq!(flag.verdict, Outcome::Ok, "{}", flag.render());
        let bad = check_crd(Some(&crd), None, Some(("epochs", "s")));
        assert_eq!(bad.verdict, Outcome::Fail, "{}", bad.render());
    }

    #[test]
    fn ca_bundle_verifies_or_names_the_webhook() {
        let (ca, serving) = pair(90);
        let now = SystemTime::now();
        let ok = check_ca_bundle(&entries(&ca.cert), &serving.cert, "s", now);
        assert_eq!(ok.verdict, Outcome::Ok, "{}", ok.render());
        let (other_ca, _) = pair(90);
        let bad = check_ca_bundle(&entries(&other_ca.cert), &serving.cert, "s", now);
        assert_eq!(bad.verdict, Outcome::Fail);
        assert!(
            bad.detail.contains("mutating/mutate.jobset-inplace.dev"),
            "{}",
            bad.detail
        );
        let empty = check_ca_bundle(&entries(""), &serving.cert, "s", now);
        assert!(
            empty.detail.contains("caBundle is empty"),
            "{}",
            empty.detail
        );
        // Past the certificate's end, the same bundle no longer verifies it.
        let later = check_ca_bundle(&entries(&ca.cert), &serving.cert, "s", now + 91 * DAY);
        assert_eq!(later.verdict, Outcome::Fail);
    }

    #[test]
    fn expiry_warns_then_fails() {
        let (_, serving) = pair(20);
        let now = SystemTime::now();
        let f = check_expiry("c", "serving certificate", &serving.cert, now, 30);
        assert_eq!(f.verdict, Outcome::Warn, "{}", f.render());
        assert!(
            f.detail.contains("expires in 19 day(s)") || f.detail.contains("expires in 20 day(s)"),
            "{}",
            f.detail
        );
        let f = check_expiry("c", "serving certificate", &serving.cert, now, 14);
        assert_eq!(f.verdict, Outcome::Ok, "{}", f.render());
        let f = check_expiry(
            "c",
            "serving certificate",
            &serving.cert,
            now + 21 * DAY,
            14,
        );
        assert_eq!(f.verdict, Outcome::Fail, "{}", f.render());
        assert!(f.detail.contains("expired on"), "{}", f.detail);
        let f = check_expiry("c", "serving certificate", "garbage", now, 14);
        assert_eq!(f.verdict, Outcome::Fail);
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(humantime_date(UNIX_EPOCH), "1970-01-01");
        assert_eq!(
            humantime_date(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29"
        );
        assert_eq!(
            humantime_date(UNIX_EPOCH + Duration::from_secs(1_795_651_200)),
            "2026-11-26"
        );
    }

    #[test]
    fn lease_needs_a_recent_renewal() {
        let now = SystemTime::now();
        let lease = |renewed_secs_ago: u64| -> Lease {
            let at = now - Duration::from_secs(renewed_secs_ago);
            let secs = at.duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
            serde_json::from_value(json!({
                "metadata": {"name": "l", "namespace": "s"},
                "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15,
                         "renewTime": format!("{}", humantime_rfc3339(secs))}
            }))
            .expect("lease")
        };
        assert_eq!(
            check_lease(Some(&lease(3)), "s", "l", now).verdict,
            Outcome::Ok
        );
        let stale = check_lease(Some(&lease(60)), "s", "l", now);
        assert_eq!(stale.verdict, Outcome::Fail);
        assert!(
            stale.detail.contains("past its 15s duration"),
            "{}",
            stale.detail
        );
        assert_eq!(check_lease(None, "s", "l", now).verdict, Outcome::Fail);
    }

    fn humantime_rfc3339(secs: u64) -> String {
        let at = UNIX_EPOCH + Duration::from_secs(secs);
        k8s_openapi::jiff::Timestamp::try_from(at)
            .expect("representable")
            .to_string()
    }

    #[test]
    fn nodes_without_the_feature_are_named() {
        let node = |name: &str, features: Option<&[&str]>| -> Node {
            let mut n = json!({"metadata": {"name": name}, "status": {}});
            if let Some(f) = features {
                n["status"]["declaredFeatures"] = json!(f);
            }
            serde_json::from_value(n).expect("node")
        };
        let with = node("a", Some(&[RESTART_ALL_FEATURE]));
        assert_eq!(
            check_nodes(std::slice::from_ref(&with)).verdict,
            Outcome::Ok
        );
        let f = check_nodes(&[with.clone(), node("b", Some(&[])), node("c", None)]);
        assert_eq!(f.verdict, Outcome::Warn, "{}", f.render());
        assert!(
            f.detail.contains("2 of 3") && f.detail.contains("b, c"),
            "{}",
            f.detail
        );
        let f = check_nodes(&[node("b", Some(&["Other"]))]);
        assert_eq!(f.verdict, Outcome::Fail, "{}", f.render());
        assert!(f.detail.contains(": b;"), "{}", f.detail);
        assert_eq!(check_nodes(&[]).verdict, Outcome::Warn);
        let many: Vec<Node> = (0..10).map(|i| node(&format!("n{i}"), None)).collect();
        assert!(check_nodes(&many).detail.contains("and 2 more"));
    }

    #[test]
    fn configurations_and_accounts() {
        let f = check_configurations(None, None, "jobset-inplace");
        assert_eq!(f.verdict, Outcome::Fail);
        assert!(
            f.detail
                .contains("MutatingWebhookConfiguration and ValidatingWebhookConfiguration")
        );
        let sa = ServiceAccount::default();
        let rb: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "jobset-inplace-agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "jobset-inplace-agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "jobset-inplace-agent", "namespace": "t"}]
        }))
        .expect("rb");
        let f = check_agent_account(
            "t",
            "jobset-inplace-agent",
            Some(&sa),
            Some(&rb),
            "jobset-inplace-agent",
        );
        assert_eq!(f.verdict, Outcome::Ok, "{}", f.render());
        let f = check_agent_account("t", "other", Some(&sa), Some(&rb), "jobset-inplace-agent");
        assert_eq!(f.verdict, Outcome::Fail);
        let f = check_agent_account("t", "jobset-inplace-agent", None, None, "x");
        assert!(
            f.detail.contains("is the reconciler running"),
            "{}",
            f.detail
        );
    }
}
