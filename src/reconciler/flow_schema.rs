//! The agents' FlowSchema (API Priority and Fairness): its subjects kept to the agent's
//! ServiceAccount in every namespace the reconciler provisions, so the agents' requests go to a
//! priority level of their own (`jobset-inplace-agents`, sized for a group restart's burst)
//! instead of the built-in `workload-low`, where every agent of a namespace was one flow of at
//! most 300 queued requests (6 queues of 50) and a 5,000-pod restart was refused 429 18,591 times
//! (docs/benchmarks.md, issue 44).
//!
//! A FlowSchema's ServiceAccount subject must name its namespace (the API server refuses `*`), so
//! no static schema can match the agents' accounts across workload namespaces: the chart creates
//! the schema and its priority level without `rules`, and the reconciler applies `rules` alone
//! (server-side apply, its own field manager), one subject per provisioned namespace. Its RBAC
//! allows `patch` on this one FlowSchema only (`resourceNames`). The flows stay per user
//! (`ByUser`): each namespace's agents are one flow, queued fairly beside other tenants'.

use std::collections::BTreeSet;

use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::provision::FIELD_MANAGER;

/// The resources the agent reads and writes (src/agent/run.rs): its pod (GET, the
/// registration's PATCH), its JobSetEpoch (the streaming list, a LIST where the API server
/// refuses one, the watch) and its JobSet (the fallback where the JobSetEpoch kind is not served).
fn resource_rules() -> Value {
    json!([
        {"verbs": ["get", "patch"], "apiGroups": [""], "resources": ["pods"], "namespaces": ["*"]},
        {"verbs": ["get", "list", "watch"], "apiGroups": ["jobset-inplace.dev"],
         "resources": ["jobsetepochs"], "namespaces": ["*"]},
        {"verbs": ["get", "list", "watch"], "apiGroups": ["jobset.x-k8s.io"],
         "resources": ["jobsets"], "namespaces": ["*"]}
    ])
}

/// The server-side apply body of FlowSchema `name`: its `rules` only, one rule whose subjects are
/// `service_account` in each of `namespaces` (none: no rule, the schema matches nothing). Pure.
pub fn apply_body(name: &str, namespaces: &BTreeSet<String>, service_account: &str) -> Value {
    let subjects: Vec<Value> = namespaces
        .iter()
        .map(|ns| {
            json!({"kind": "ServiceAccount",
                   "serviceAccount": {"name": service_account, "namespace": ns}})
        })
        .collect();
    let rules = if subjects.is_empty() {
        json!([])
    } else {
        json!([{"subjects": subjects, "resourceRules": resource_rules()}])
    };
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {"rules": rules}
    })
}

/// Applies [`apply_body`] to the FlowSchema `name`, which the chart created (a 404 when it did
/// not: the caller says so).
pub async fn apply(
    client: &kube::Client,
    name: &str,
    namespaces: &BTreeSet<String>,
    service_account: &str,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::flowcontrol::v1::FlowSchema;
    let api: Api<FlowSchema> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Apply(apply_body(name, namespaces, service_account)),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_subject_per_namespace_and_the_agents_resources_only() {
        let namespaces = BTreeSet::from(["team-a".to_owned(), "team-b".to_owned()]);
        let body = apply_body("jobset-inplace-agents", &namespaces, "jobset-inplace-agent");
        assert_eq!(body["metadata"]["name"], "jobset-inplace-agents");
        // Only `rules`: the chart owns the level, the precedence and the distinguisher.
        let spec = body["spec"].as_object().expect("spec");
        assert_eq!(spec.keys().collect::<Vec<_>>(), ["rules"]);
        let rules = spec["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0]["subjects"],
            json!([
                {"kind": "ServiceAccount", "serviceAccount": {"name": "jobset-inplace-agent", "namespace": "team-a"}},
                {"kind": "ServiceAccount", "serviceAccount": {"name": "jobset-inplace-agent", "namespace": "team-b"}}
            ])
        );
        let resources: Vec<&str> = rules[0]["resourceRules"]
            .as_array()
            .expect("resource rules")
            .iter()
            .flat_map(|r| r["resources"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(resources, ["pods", "jobsetepochs", "jobsets"]);
        // No cluster-scoped request, no verb beyond what the agent sends.
        for rule in rules[0]["resourceRules"].as_array().expect("rules") {
            assert!(rule.get("clusterScope").is_none());
            assert!(
                !rule["verbs"]
                    .as_array()
                    .expect("verbs")
                    .contains(&json!("*"))
            );
        }
    }

    #[test]
    fn no_namespace_no_rule() {
        let body = apply_body("s", &BTreeSet::new(), "a");
        assert_eq!(body["spec"]["rules"], json!([]));
    }
}
