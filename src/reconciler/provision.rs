//! Service-account provisioning: every namespace with an InPlaceRestart JobSet (and every
//! namespace labelled `jobset-inplace.dev/enabled=true`, ahead of time) gets the agent's
//! ServiceAccount and a RoleBinding of the agent ClusterRole to it, and to it only. Written with
//! server-side apply under one field manager, so it is idempotent and leaves fields others own
//! alone; the subjects list is the applier's, so a subject bound by an earlier version (a service
//! account a JobSet named) is removed by the next apply.
//!
//! Only the agent's account is bound because only it is held by the agent
//! ValidatingAdmissionPolicy to its own pod's epoch annotation (deploy/base/agent-policy.yaml):
//! binding an account a JobSet author names would hand `patch pods` in the namespace to every
//! pod that runs as it (issue 11; docs/security.md). A pod template that names its own account
//! keeps it, and its owner grants it what its agent needs. The cluster's own namespaces and the
//! project's namespace are never provisioned ([`is_protected`]). The API server holds the
//! reconciler's account to exactly these objects as well (deploy/base/reconciler-policy.yaml, and
//! RBAC `resourceNames` on its patches and deletes): a stolen token cannot bind the agent role to
//! another account or in another namespace (issue 21).
//!
//! A namespace whose provisioning fails (a ServiceAccount or RoleBinding of that name that another
//! field manager owns: 409; a terminating namespace: 403; ...) is tried again after a backoff of
//! its own ([`Failures`]: 1 s doubling to 5 min), and said once per reason (and again every 10
//! minutes while it lasts), not once a second (issue 21, item 8). A RoleBinding's `roleRef` cannot
//! change (422): a binding this reconciler made for another role (an earlier
//! `--agent-cluster-role`) is deleted and created again; any other binding of that name is left
//! alone ([`is_ours`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};

use crate::retry::Backoff;

/// Label that asks for the agent's service account ahead of any JobSet.
pub const ENABLED_LABEL: &str = "jobset-inplace.dev/enabled";
/// Field manager of everything the reconciler applies.
pub const FIELD_MANAGER: &str = "jobset-inplace-reconciler";
/// Name of the RoleBinding in each namespace.
pub const ROLE_BINDING: &str = "jobset-inplace-agent";

/// What to provision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisionSettings {
    /// The agent's service account (the webhook's `serviceAccountName`).
    pub service_account: String,
    /// The ClusterRole bound to it.
    pub cluster_role: String,
    /// The project's own namespace (the reconciler's): never provisioned.
    pub own_namespace: String,
    /// The agents' FlowSchema, whose subjects follow the provisioned namespaces
    /// ([`super::flow_schema`]); None: left alone.
    pub flow_schema: Option<String>,
}

/// The namespaces provisioning never writes to: the cluster's own, and the project's. The
/// reconciler's provisioning policies (deploy/base/reconciler-policy.yaml) refuse its writes there
/// too, from the same list plus the project's namespace (tied by
/// `tests/it/deploy/`: `the_reconcilers_provisioning_is_held_to_the_agents_binding_and_account`).
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// `namespace` is one provisioning leaves alone.
pub fn is_protected(namespace: &str, settings: &ProvisionSettings) -> bool {
    SYSTEM_NAMESPACES.contains(&namespace) || namespace == settings.own_namespace
}

impl Default for ProvisionSettings {
    fn default() -> Self {
        ProvisionSettings {
            service_account: crate::admission::config::DEFAULT_SERVICE_ACCOUNT.to_owned(),
            cluster_role: "jobset-inplace-agent".to_owned(),
            own_namespace: "jobset-inplace-system".to_owned(),
            flow_schema: None,
        }
    }
}

/// The RoleBinding subjects each namespace needs: the agent's service account, in every
/// namespace with an InPlaceRestart JobSet (`named`: its namespaces, with the accounts their pod
/// templates name, which are not bound) or labelled ahead of time (`enabled`), but the protected
/// ones. Pure.
pub fn desired_subjects(
    named: &BTreeMap<String, BTreeSet<Option<String>>>,
    enabled: &BTreeSet<String>,
    settings: &ProvisionSettings,
) -> BTreeMap<String, BTreeSet<String>> {
    enabled
        .iter()
        .chain(named.keys())
        .filter(|ns| !is_protected(ns, settings))
        .map(|ns| {
            (
                ns.clone(),
                BTreeSet::from([settings.service_account.clone()]),
            )
        })
        .collect()
}

fn labels() -> Value {
    json!({"app.kubernetes.io/managed-by": "jobset-inplace", "app.kubernetes.io/name": "jobset-inplace-agent"})
}

/// The applied ServiceAccount. Its token is never automounted (issue 34): a pod that runs as it
/// gets the token in the agent container only, from the projected volume the webhook injects;
/// a pod that names it without `automountServiceAccountToken: false` would otherwise hand the
/// token, which may patch pods, to every container.
pub fn service_account(namespace: &str, settings: &ProvisionSettings) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": settings.service_account, "namespace": namespace, "labels": labels()},
        "automountServiceAccountToken": false
    })
}

/// The applied RoleBinding.
pub fn role_binding(
    namespace: &str,
    subjects: &BTreeSet<String>,
    settings: &ProvisionSettings,
) -> Value {
    let subjects: Vec<Value> = subjects
        .iter()
        .map(|name| json!({"kind": "ServiceAccount", "name": name, "namespace": namespace}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": ROLE_BINDING, "namespace": namespace, "labels": labels()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": settings.cluster_role},
        "subjects": subjects
    })
}

/// Applies both objects of one namespace. A RoleBinding refused as invalid (422: its `roleRef`
/// cannot change) that this reconciler made ([`is_ours`]) for another role is deleted (its UID
/// and resourceVersion as preconditions) and applied again; anybody else's stays, and the 422 is
/// returned.
pub async fn apply(
    client: &kube::Client,
    namespace: &str,
    subjects: &BTreeSet<String>,
    settings: &ProvisionSettings,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER);
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .patch(
            &settings.service_account,
            &params,
            &Patch::Apply(service_account(namespace, settings)),
        )
        .await?;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace);
    let body = Patch::Apply(role_binding(namespace, subjects, settings));
    let refused = match bindings.patch(ROLE_BINDING, &params, &body).await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 422 => s,
        Err(e) => return Err(e),
    };
    let listed = bindings
        .list(
            &ListParams::default()
                .labels(MANAGED)
                .fields(&format!("metadata.name={ROLE_BINDING}")),
        )
        .await?;
    let Some(old) = listed
        .items
        .into_iter()
        .find(|b| is_ours(b) && b.role_ref.name != settings.cluster_role)
    else {
        return Err(kube::Error::Api(refused));
    };
    tracing::info!(namespace, role = %old.role_ref.name, "the agent's role binding binds another role (roleRef cannot change): deleting it and binding the agent role again");
    let preconditions = Preconditions {
        uid: old.metadata.uid.clone(),
        resource_version: old.metadata.resource_version.clone(),
    };
    let params_delete = DeleteParams {
        preconditions: Some(preconditions),
        ..DeleteParams::default()
    };
    match bindings.delete(ROLE_BINDING, &params_delete).await {
        Ok(_) => {}
        // Gone or changed meanwhile: the apply below says what is there now.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => return Err(e),
    }
    bindings.patch(ROLE_BINDING, &params, &body).await?;
    Ok(())
}

/// A RoleBinding this reconciler made: its name and its labels (as [`list_provisioned`] finds
/// them), and, where the server reports field ownership (a real API server always does), a
/// `roleRef` its field manager applied: a binding someone else made is not ours even with the
/// same name and labels. Pure.
pub fn is_ours(binding: &RoleBinding) -> bool {
    let meta = &binding.metadata;
    let labelled = MANAGED.split(',').all(|pair| {
        pair.split_once('=').is_some_and(|(k, v)| {
            meta.labels
                .as_ref()
                .and_then(|l| l.get(k))
                .is_some_and(|x| x == v)
        })
    });
    let owners = meta.managed_fields.as_deref().unwrap_or_default();
    let applied_role_ref = owners.is_empty()
        || owners.iter().any(|m| {
            m.manager.as_deref() == Some(FIELD_MANAGER)
                && m.operation.as_deref() == Some("Apply")
                && m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.get("f:roleRef").is_some())
        });
    meta.name.as_deref() == Some(ROLE_BINDING) && labelled && applied_role_ref
}

/// Why provisioning failed, as the metric's `reason` label says it. Pure.
pub fn failure_reason(e: Option<&kube::Error>) -> &'static str {
    match e {
        None => "timeout",
        Some(kube::Error::Api(s)) => match s.code {
            403 => "forbidden",
            404 => "not_found",
            409 => "conflict",
            422 => "invalid",
            429 => "throttled",
            c if c >= 500 => "server_error",
            _ => "error",
        },
        Some(_) => "error",
    }
}

/// The first pause before a failing namespace is provisioned again; it doubles up to
/// [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest pause.
pub const RETRY_MAX: Duration = Duration::from_secs(300);
/// A failure that lasts (same reason) is said again this often.
pub const REPEAT_WARNING: Duration = Duration::from_secs(600);

/// What to do about one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPlan {
    /// Say it (a WARN and an event): the first failure, another reason, or the last one said
    /// [`REPEAT_WARNING`] ago.
    pub say: bool,
    /// Try the namespace again after this long.
    pub retry_in: Duration,
    /// Consecutive failures of the namespace.
    pub failures: u32,
}

/// The namespaces whose provisioning (or removal) fails: each with its own backoff, when it is
/// due again, and what was said. Pure (the caller gives the time).
#[derive(Debug, Default)]
pub struct Failures {
    by_namespace: BTreeMap<String, Failing>,
}

#[derive(Debug)]
struct Failing {
    backoff: Backoff,
    due: Instant,
    reason: &'static str,
    said: Instant,
    failures: u32,
}

impl Failures {
    /// The namespace may be tried now.
    pub fn is_due(&self, namespace: &str, now: Instant) -> bool {
        self.by_namespace
            .get(namespace)
            .is_none_or(|f| now >= f.due)
    }

    /// Records a failure: when to try again, and whether to say it.
    pub fn failed(&mut self, namespace: &str, reason: &'static str, now: Instant) -> RetryPlan {
        let mut first = false;
        let f = self
            .by_namespace
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                first = true;
                Failing {
                    backoff: Backoff::new(RETRY_MIN, RETRY_MAX),
                    due: now,
                    reason,
                    said: now,
                    failures: 0,
                }
            });
        let say =
            first || f.reason != reason || now.saturating_duration_since(f.said) >= REPEAT_WARNING;
        if say {
            f.said = now;
        }
        f.reason = reason;
        f.failures = f.failures.saturating_add(1);
        let retry_in = f.backoff.advance();
        f.due = now + retry_in;
        RetryPlan {
            say,
            retry_in,
            failures: f.failures,
        }
    }

    /// Records a success; returns the failures it ends, if any.
    pub fn succeeded(&mut self, namespace: &str) -> Option<u32> {
        self.by_namespace.remove(namespace).map(|f| f.failures)
    }

    /// When the next failing namespace is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.by_namespace.values().map(|f| f.due).min()
    }

    /// Forgets the namespaces `keep` says no more.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_namespace.retain(|ns, _| keep(ns));
    }

    /// Namespaces failing now.
    pub fn len(&self) -> usize {
        self.by_namespace.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }
}

/// The label selector of the RoleBindings this reconciler applies.
const MANAGED: &str =
    "app.kubernetes.io/managed-by=jobset-inplace,app.kubernetes.io/name=jobset-inplace-agent";

/// The namespaces that hold a RoleBinding this reconciler applied (by its labels and name).
pub async fn list_provisioned(client: &kube::Client) -> Result<BTreeSet<String>, kube::Error> {
    let bindings = Api::<RoleBinding>::all(client.clone())
        .list(&ListParams::default().labels(MANAGED))
        .await?;
    Ok(bindings
        .items
        .into_iter()
        .filter(|b| b.metadata.name.as_deref() == Some(ROLE_BINDING))
        .filter_map(|b| b.metadata.namespace)
        .collect())
}

/// The namespaces whose RoleBinding no JobSet needs any longer: provisioned, not desired, and
/// with no pod of a JobSet left (a pod still running may be an agent that needs its rights; it
/// goes with its JobSet, and the binding after it). Pure.
pub fn stale<'a>(
    provisioned: &'a BTreeSet<String>,
    desired: &BTreeMap<String, BTreeSet<String>>,
    with_pods: &std::collections::HashSet<String>,
) -> Vec<&'a str> {
    provisioned
        .iter()
        .filter(|ns| !desired.contains_key(*ns) && !with_pods.contains(*ns))
        .map(String::as_str)
        .collect()
}

/// Removes the agent's RoleBinding of one namespace (already gone is fine). The ServiceAccount
/// stays: without the binding it has no rights, and a pod that names it still starts.
pub async fn remove(client: &kube::Client, namespace: &str) -> Result<(), kube::Error> {
    match Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .delete(ROLE_BINDING, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_bindings_are_those_no_jobset_and_no_pod_needs() {
        let provisioned: BTreeSet<String> =
            ["a", "b", "c"].into_iter().map(str::to_owned).collect();
        let desired = BTreeMap::from([("a".to_owned(), BTreeSet::new())]);
        let with_pods = std::collections::HashSet::from(["b".to_owned()]);
        assert_eq!(stale(&provisioned, &desired, &with_pods), ["c"]);
        assert!(stale(&BTreeSet::new(), &desired, &with_pods).is_empty());
    }

    /// Issue 11: a JobSet author cannot have the agent role bound to an account they name, nor
    /// have anything written in the cluster's or the project's namespaces.
    #[test]
    fn only_the_agent_is_bound_and_never_in_protected_namespaces() {
        let settings = ProvisionSettings::default();
        let named = BTreeMap::from([
            (
                "a".to_owned(),
                BTreeSet::from([None, Some("trainer".to_owned())]),
            ),
            ("b".to_owned(), BTreeSet::from([Some("default".to_owned())])),
            ("kube-system".to_owned(), BTreeSet::from([None])),
            ("jobset-inplace-system".to_owned(), BTreeSet::from([None])),
        ]);
        let enabled = BTreeSet::from([
            "c".to_owned(),
            "a".to_owned(),
            "kube-public".to_owned(),
            "kube-node-lease".to_owned(),
        ]);
        let out = desired_subjects(&named, &enabled, &settings);
        let agent = BTreeSet::from(["jobset-inplace-agent".to_owned()]);
        assert_eq!(
            out,
            BTreeMap::from([
                ("a".to_owned(), agent.clone()),
                ("b".to_owned(), agent.clone()),
                ("c".to_owned(), agent),
            ])
        );
    }

    /// Issue 21, item 8: a failing namespace backs off (1 s doubling to 5 min, jittered), is
    /// said once per reason and again only every 10 minutes, and starts over after a success.
    #[test]
    fn failures_back_off_per_namespace_and_are_said_once_per_reason() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        assert!(f.is_due("a", t0));
        let mut at = t0;
        let mut said = 0;
        let mut pauses = Vec::new();
        for _ in 0..20 {
            assert!(f.is_due("a", at));
            let v = f.failed("a", "conflict", at);
            said += usize::from(v.say);
            pauses.push(v.retry_in);
            assert!(!f.is_due("a", at), "not again at once");
            assert!(f.is_due("b", at), "other namespaces are not held back");
            at += v.retry_in;
        }
        assert_eq!(f.next_due(), Some(at));
        assert!(
            pauses[0] <= RETRY_MIN && pauses[0] >= RETRY_MIN / 2,
            "{pauses:?}"
        );
        assert!(pauses.iter().all(|p| *p <= RETRY_MAX), "{pauses:?}");
        assert!(
            pauses[19] >= RETRY_MAX / 2,
            "capped, not stuck low: {pauses:?}"
        );
        // Twenty failures over about an hour and a half: said at the start and then at most
        // every 10 minutes, far from once per failure.
        let span = at.saturating_duration_since(t0);
        let most = 1 + (span.as_secs() / REPEAT_WARNING.as_secs()) as usize;
        assert!(said >= 2 && said <= most, "said {said} times over {span:?}");
        // Another reason is said at once.
        assert!(f.failed("a", "forbidden", at).say);
        assert!(!f.failed("a", "forbidden", at).say);
        assert_eq!(f.len(), 1);
        assert_eq!(f.succeeded("a"), Some(22));
        assert_eq!(f.succeeded("a"), None);
        let v = f.failed("a", "forbidden", at);
        assert!(
            v.say && v.retry_in <= RETRY_MIN,
            "a success starts over: {v:?}"
        );
        f.retain(|ns| ns != "a");
        assert!(f.is_empty());
    }

    #[test]
    fn failure_reasons_name_the_status() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(failure_reason(None), "timeout");
        for (code, reason) in [
            (403, "forbidden"),
            (409, "conflict"),
            (422, "invalid"),
            (429, "throttled"),
            (503, "server_error"),
            (400, "error"),
        ] {
            assert_eq!(failure_reason(Some(&api(code))), reason);
        }
    }

    /// Issue 21, item 8: only a binding this reconciler applied (its labels and its field
    /// manager's `roleRef`) is ever deleted to change its role.
    #[test]
    fn only_our_own_binding_is_ours() {
        let settings = ProvisionSettings::default();
        let mut ours = role_binding("a", &BTreeSet::from(["x".to_owned()]), &settings);
        ours["metadata"]["managedFields"] = json!([{
            "manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "rbac.authorization.k8s.io/v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:roleRef": {}, "f:subjects": {}}
        }]);
        let parse =
            |v: &Value| -> RoleBinding { serde_json::from_value(v.clone()).expect("binding") };
        assert!(is_ours(&parse(&ours)));
        // The same name and labels, made by a user.
        let mut users = ours.clone();
        users["metadata"]["managedFields"][0]["manager"] = json!("kubectl-create");
        users["metadata"]["managedFields"][0]["operation"] = json!("Update");
        assert!(!is_ours(&parse(&users)));
        // Ours once, but the labels are gone; or another name.
        let mut unlabelled = ours.clone();
        unlabelled["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "someone"});
        assert!(!is_ours(&parse(&unlabelled)));
        let mut renamed = ours.clone();
        renamed["metadata"]["name"] = json!("other");
        assert!(!is_ours(&parse(&renamed)));
        // Our labels only (our manager applied them on a user's binding, not its roleRef).
        let mut labels_only = ours;
        labels_only["metadata"]["managedFields"][0]["fieldsV1"] = json!({"f:metadata": {}});
        assert!(!is_ours(&parse(&labels_only)));
    }

    #[test]
    fn applied_objects_name_the_cluster_role() {
        let settings = ProvisionSettings::default();
        let rb = role_binding("a", &BTreeSet::from(["x".to_owned()]), &settings);
        assert_eq!(rb["roleRef"]["name"], "jobset-inplace-agent");
        assert_eq!(rb["subjects"][0]["namespace"], "a");
        assert_eq!(
            service_account("a", &settings)["metadata"]["name"],
            "jobset-inplace-agent"
        );
    }

    /// Issue 34: the agent's account never automounts its token into a pod's containers.
    #[test]
    fn the_agent_account_does_not_automount_its_token() {
        let sa = service_account("a", &ProvisionSettings::default());
        assert_eq!(sa["automountServiceAccountToken"], false);
    }
}
