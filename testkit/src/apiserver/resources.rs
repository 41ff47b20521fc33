//! The kinds of objects the test API server stores, and how requests and tests name them.

use std::borrow::Cow;
use std::sync::Arc;

use super::schema::{self, CrdSchema};

/// One resource the server serves (a group/version/plural with its kind and scope).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, `""` for the core group.
    pub group: Cow<'static, str>,
    pub version: Cow<'static, str>,
    /// URL segment, e.g. `pods`.
    pub plural: Cow<'static, str>,
    pub singular: Cow<'static, str>,
    pub kind: Cow<'static, str>,
    /// Namespaced (`/namespaces/{ns}/{plural}`) or cluster-scoped.
    pub namespaced: bool,
    /// Has a `status` subresource: writes to the main resource keep `status`, writes to
    /// `/status` change only `status`, and a create drops `status`.
    pub status_subresource: bool,
    /// A PUT of an absent object creates it (true for leases and core events, as upstream).
    pub create_on_update: bool,
    /// Field-selector fields supported besides `metadata.name` and `metadata.namespace`.
    pub extra_fields: &'static [&'static str],
    /// A custom resource's schema: writes are pruned and validated against it
    /// ([`schema`](super::schema)).
    pub schema: Option<Arc<CrdSchema>>,
    /// A DELETE that removes the object answers the object (pods, service accounts and
    /// namespaces upstream); other kinds answer a `Status` of `Success`.
    pub delete_returns_object: bool,
}

impl ResourceType {
    /// A namespaced resource without subresources; adjust the public fields as needed.
    pub fn namespaced(
        group: &'static str,
        version: &'static str,
        kind: &'static str,
        plural: &'static str,
    ) -> Self {
        ResourceType {
            group: Cow::Borrowed(group),
            version: Cow::Borrowed(version),
            plural: Cow::Borrowed(plural),
            singular: Cow::Owned(kind.to_ascii_lowercase()),
            kind: Cow::Borrowed(kind),
            namespaced: true,
            status_subresource: false,
            create_on_update: false,
            extra_fields: &[],
            schema: None,
            delete_returns_object: false,
        }
    }

    /// A cluster-scoped resource without subresources.
    pub fn cluster(
        group: &'static str,
        version: &'static str,
        kind: &'static str,
        plural: &'static str,
    ) -> Self {
        ResourceType {
            namespaced: false,
            ..Self::namespaced(group, version, kind, plural)
        }
    }

    fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    fn with_create_on_update(mut self) -> Self {
        self.create_on_update = true;
        self
    }

    /// Prunes and validates writes against `schema`, as for a custom resource.
    pub fn with_schema(mut self, schema: Arc<CrdSchema>) -> Self {
        self.schema = Some(schema);
        self
    }

    fn returning_deleted_object(mut self) -> Self {
        self.delete_returns_object = true;
        self
    }

    fn with_fields(mut self, fields: &'static [&'static str]) -> Self {
        self.extra_fields = fields;
        self
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `PodList` etc.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `pods` for the core group, `plural.group` otherwise (as in error messages).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The fields a field selector may name for this resource.
    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || (field == "metadata.namespace" && self.namespaced)
            || self.extra_fields.contains(&field)
    }

    /// Core pods get `status.phase: Pending` on create, as upstream.
    pub(crate) fn initial_status(&self) -> Option<serde_json::Value> {
        (self.group.is_empty() && self.plural == "pods")
            .then(|| serde_json::json!({"phase": "Pending"}))
    }
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const EVENT_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "reason",
    "reportingController",
    "type",
];

/// The resources served by default: pods, jobsets, jobsetepochs, jobs, events (core/v1 and
/// events.k8s.io/v1),
/// leases, serviceaccounts, rolebindings, nodes, namespaces, customresourcedefinitions, secrets,
/// webhook configurations and flowschemas.
pub fn default_resources() -> Vec<ResourceType> {
    vec![
        ResourceType::namespaced("", "v1", "Pod", "pods")
            .with_status()
            .with_fields(POD_FIELDS)
            .returning_deleted_object(),
        ResourceType::namespaced(
            jobset_inplace::jobset::GROUP,
            jobset_inplace::jobset::VERSION,
            jobset_inplace::jobset::KIND,
            jobset_inplace::jobset::PLURAL,
        )
        .with_status()
        .with_schema(schema::jobset()),
        ResourceType::namespaced(
            jobset_inplace::wire::epochs::GROUP,
            jobset_inplace::wire::epochs::VERSION,
            jobset_inplace::wire::epochs::KIND,
            jobset_inplace::wire::epochs::PLURAL,
        )
        .with_schema(schema::jobset_epoch()),
        ResourceType::namespaced("batch", "v1", "Job", "jobs").with_status(),
        ResourceType::namespaced("", "v1", "Event", "events")
            .with_create_on_update()
            .with_fields(CORE_EVENT_FIELDS),
        ResourceType::namespaced("events.k8s.io", "v1", "Event", "events")
            .with_create_on_update()
            .with_fields(EVENT_FIELDS),
        ResourceType::namespaced("coordination.k8s.io", "v1", "Lease", "leases")
            .with_create_on_update(),
        ResourceType::namespaced("", "v1", "ServiceAccount", "serviceaccounts")
            .returning_deleted_object(),
        ResourceType::namespaced(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
        ),
        // The reconciler's lost-node watch (`--node-lost-grace`) lists and watches them.
        ResourceType::cluster("", "v1", "Node", "nodes").with_status(),
        ResourceType::cluster("", "v1", "Namespace", "namespaces")
            .with_status()
            .returning_deleted_object()
            .with_fields(&["status.phase"]),
        ResourceType::cluster(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        )
        .with_status(),
        ResourceType::namespaced("", "v1", "Secret", "secrets"),
        // The agents' FlowSchema, whose rules the reconciler applies (`--agent-flow-schema`).
        ResourceType::cluster(
            "flowcontrol.apiserver.k8s.io",
            "v1",
            "FlowSchema",
            "flowschemas",
        ),
        ResourceType::cluster(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
        ),
        ResourceType::cluster(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
        ),
    ]
}

/// Index of a resource in the server's [`Registry`].
pub(crate) type ResId = usize;

/// The resources of one server, and the names tests use for them.
#[derive(Debug)]
pub struct Registry {
    types: Vec<ResourceType>,
    names: Vec<String>,
}

impl Registry {
    pub(crate) fn new(types: Vec<ResourceType>) -> Self {
        let names = types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let shared = types
                    .iter()
                    .enumerate()
                    .any(|(j, o)| j != i && o.plural == t.plural);
                if shared && !t.group.is_empty() {
                    t.qualified()
                } else {
                    t.plural.to_string()
                }
            })
            .collect();
        Registry { types, names }
    }

    pub fn types(&self) -> &[ResourceType] {
        &self.types
    }

    pub(crate) fn get(&self, id: ResId) -> &ResourceType {
        &self.types[id]
    }

    /// The short name of a resource in counters and fault rules: the plural when no other
    /// resource shares it (a core resource keeps the plain plural), `plural.group` otherwise.
    pub fn name(&self, id: ResId) -> &str {
        &self.names[id]
    }

    /// Resolves a name given by a test: the short name, `plural.group`, or `plural` when only one
    /// resource has it.
    pub fn resolve(&self, name: &str) -> Option<ResId> {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return Some(i);
        }
        if let Some(i) = self.types.iter().position(|t| t.qualified() == name) {
            return Some(i);
        }
        let mut found = self
            .types
            .iter()
            .enumerate()
            .filter(|(_, t)| t.plural == name);
        match (found.next(), found.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }

    /// The resource at `/api[s]/{group}/{version}/{plural}`.
    pub(crate) fn by_path(&self, group: &str, version: &str, plural: &str) -> Option<ResId> {
        self.types
            .iter()
            .position(|t| t.group == group && t.version == version && t.plural == plural)
    }

    /// The resource a typed `kube::Resource` maps to.
    pub(crate) fn by_kube<K: kube::Resource<DynamicType = ()>>(&self) -> Option<ResId> {
        self.by_path(&K::group(&()), &K::version(&()), &K::plural(&()))
    }

    /// Groups and their versions, in registration order (core group first when present).
    pub(crate) fn group_versions(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for t in &self.types {
            match out.iter_mut().find(|(g, _)| g == &t.group) {
                Some((_, versions)) => {
                    if !versions.iter().any(|v| v == &t.version) {
                        versions.push(t.version.to_string());
                    }
                }
                None => out.push((t.group.to_string(), vec![t.version.to_string()])),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_unless_shared() {
        let r = Registry::new(default_resources());
        let pods = r.resolve("pods").expect("pods");
        assert_eq!(r.name(pods), "pods");
        let core_events = r.resolve("events").expect("events");
        assert_eq!(r.get(core_events).group, "");
        let new_events = r.resolve("events.events.k8s.io").expect("events.k8s.io");
        assert_eq!(r.name(new_events), "events.events.k8s.io");
        assert_eq!(r.resolve("jobsets"), r.resolve("jobsets.jobset.x-k8s.io"));
        assert_eq!(r.name(r.resolve("jobsets").expect("jobsets")), "jobsets");
        assert!(r.resolve("configmaps").is_none());
        assert_eq!(
            r.by_kube::<k8s_openapi::api::coordination::v1::Lease>(),
            r.resolve("leases")
        );
        assert_eq!(
            r.by_kube::<jobset_inplace::jobset::JobSet>(),
            r.resolve("jobsets")
        );
        assert_eq!(
            r.by_kube::<k8s_openapi::api::events::v1::Event>(),
            Some(new_events)
        );
        assert_eq!(
            r.by_kube::<k8s_openapi::api::core::v1::Event>(),
            Some(core_events)
        );
    }
}
