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

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

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
}

/// The namespaces provisioning never writes to: the cluster's own, and the project's. The
/// reconciler's provisioning policies (deploy/base/reconciler-policy.yaml) refuse its writes there
/// too, from the same list plus the project's namespace (tied by
/// `tests/deploy.rs`: `the_reconcilers_provisioning_is_held_to_the_agents_binding_and_account`).
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

/// The applied ServiceAccount.
pub fn service_account(namespace: &str, settings: &ProvisionSettings) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": settings.service_account, "namespace": namespace, "labels": labels()}
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

/// Applies both objects of one namespace.
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
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .patch(
            ROLE_BINDING,
            &params,
            &Patch::Apply(role_binding(namespace, subjects, settings)),
        )
        .await?;
    Ok(())
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
}
