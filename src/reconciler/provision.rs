//! Service-account provisioning: every namespace with an InPlaceRestart JobSet (and every
//! namespace labelled `jobset-inplace.dev/enabled=true`, ahead of time) gets the agent's
//! ServiceAccount and a RoleBinding of the agent ClusterRole to it and to every service account
//! an InPlaceRestart JobSet's pod template names instead. Written with server-side apply under
//! one field manager, so it is idempotent and leaves fields others own alone.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, Patch, PatchParams};
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
}

impl Default for ProvisionSettings {
    fn default() -> Self {
        ProvisionSettings {
            service_account: crate::admission::config::DEFAULT_SERVICE_ACCOUNT.to_owned(),
            cluster_role: "jobset-inplace-agent".to_owned(),
        }
    }
}

/// The RoleBinding subjects each namespace needs: the agent's service account, plus every
/// service account named by its InPlaceRestart JobSets. Pure.
pub fn desired_subjects(
    named: &BTreeMap<String, BTreeSet<Option<String>>>,
    enabled: &BTreeSet<String>,
    agent: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ns in enabled {
        out.entry(ns.clone()).or_default().insert(agent.to_owned());
    }
    for (ns, accounts) in named {
        let subjects = out.entry(ns.clone()).or_default();
        subjects.insert(agent.to_owned());
        subjects.extend(accounts.iter().flatten().cloned());
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_cover_the_agent_and_named_accounts() {
        let named = BTreeMap::from([
            (
                "a".to_owned(),
                BTreeSet::from([None, Some("trainer".to_owned())]),
            ),
            ("b".to_owned(), BTreeSet::from([None])),
        ]);
        let enabled = BTreeSet::from(["c".to_owned(), "a".to_owned()]);
        let out = desired_subjects(&named, &enabled, "agent");
        assert_eq!(out.len(), 3);
        assert_eq!(
            out["a"],
            BTreeSet::from(["agent".to_owned(), "trainer".to_owned()])
        );
        assert_eq!(out["b"], BTreeSet::from(["agent".to_owned()]));
        assert_eq!(out["c"], BTreeSet::from(["agent".to_owned()]));
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
