//! A pod as the reconciler and the agent read it from the API server: the few fields of the wire
//! format the epoch protocol needs (docs/protocol.md, "Pods").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::protocol::{Dialect, JOBSET_NAME_LABEL, PodView};

/// A pod as the reconciler and the agent watch it: metadata, phase and container restart counts,
/// nothing else (10,000 full pods would cost far more memory and parse time).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<WatchedPodStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub container_statuses: Option<Vec<RestartCount>>,
    #[serde(default)]
    pub init_container_statuses: Option<Vec<RestartCount>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartCount {
    #[serde(default)]
    pub restart_count: i32,
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl WatchedPod {
    /// The JobSet this pod belongs to, from its label: `(namespace, JobSet name)`.
    pub fn jobset_key(&self) -> Option<(String, String)> {
        let ns = self.metadata.namespace.clone()?;
        let name = self
            .metadata
            .labels
            .as_ref()?
            .get(JOBSET_NAME_LABEL)?
            .clone();
        Some((ns, name))
    }

    /// What the algorithm reads of this pod.
    pub fn view(&self, dialect: Dialect) -> PodView {
        let status = self.status.as_ref();
        let max_restart_count = status
            .into_iter()
            .flat_map(|s| {
                s.container_statuses
                    .iter()
                    .chain(s.init_container_statuses.iter())
                    .flatten()
            })
            .map(|c| c.restart_count)
            .max()
            .unwrap_or(0);
        PodView {
            name: self.metadata.name.clone().unwrap_or_default(),
            uid: self.metadata.uid.clone().unwrap_or_default(),
            failed: status.and_then(|s| s.phase.as_deref()) == Some("Failed"),
            terminating: self.metadata.deletion_timestamp.is_some(),
            epoch_annotation: self
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(dialect.pod_annotation()))
                .cloned(),
            max_restart_count,
            counted_in_last_sync: false,
        }
    }
}
