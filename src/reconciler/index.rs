//! The reconciler's in-memory index: every InPlaceRestart-relevant JobSet and, for each, its
//! pods reduced to what the epoch algorithm reads ([`PodView`]), and the JobSets' Jobs as
//! membership reads them. Pure data: the watch loops feed it, the worker reads it. An update that
//! changes nothing the algorithm reads is reported as such, so it triggers no work.
//!
//! A pod is filed under the JobSet its label names, but only a member ([`membership`]: its
//! controller a Job that JobSet controls) is in what the decision reads ([`Index::get`]); the
//! others wait aside, and are decided again when a Job or the JobSet changes.

use std::collections::{HashMap, HashSet};

use super::membership::{ControllerRef, JobRecord, Membership, Stranger, membership};
use crate::jobset::JobSet;
use crate::protocol::{
    Armed, Dialect, Epoch, EpochStatus, PodView, ReconcileInput, parse_epoch, restart_begun,
};
use crate::wire::WatchedPod;

pub use super::key::Key;

/// What the reconciler reads of a JobSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSetState {
    pub uid: String,
    pub resource_version: String,
    /// InPlaceRestart, not finished, not suspended, not disabled: the algorithm runs.
    pub active: bool,
    /// `spec.failurePolicy.restartStrategy == InPlaceRestart` (finished or not).
    pub in_place_restart: bool,
    /// Not InPlaceRestart, or in-place restart disabled by its annotation: its agents must not
    /// wait for an epoch.
    pub bypass: bool,
    /// The service accounts its pod templates name (`None`: none named).
    pub service_accounts: Vec<Option<String>>,
    pub expected_pods: i64,
    pub max_restarts: i32,
    pub status: EpochStatus,
    pub restarts: i32,
    pub restarts_count_towards_max: i32,
    /// `status.conditions`, raw, to append a `Failed` condition to.
    pub conditions: serde_json::Value,
    /// Why the protocol cannot serve it ([`JobSet::protocol_problem`]): nothing is written.
    pub unservable: Option<String>,
    /// Its [`crate::deadline::TIMEOUT_ANNOTATION`], as written (cut at 100 characters: a longer
    /// one is malformed anyway).
    pub group_restart_timeout: Option<String>,
}

impl JobSetState {
    pub fn from_jobset(js: &JobSet, dialect: Dialect) -> Self {
        let status = js.status.as_ref();
        JobSetState {
            uid: js.metadata.uid.clone().unwrap_or_default(),
            resource_version: js.metadata.resource_version.clone().unwrap_or_default(),
            active: js.is_in_place_restart()
                && !js.is_finished()
                && !js.is_suspended()
                && !js.is_in_place_restart_disabled(),
            in_place_restart: js.is_in_place_restart(),
            bypass: !js.is_in_place_restart() || js.is_in_place_restart_disabled(),
            service_accounts: js.pod_service_accounts(),
            expected_pods: js.expected_pods(),
            max_restarts: js.max_restarts(),
            status: js.epoch_status(dialect),
            restarts: status.and_then(|s| s.restarts).unwrap_or(0),
            restarts_count_towards_max: status
                .and_then(|s| s.restarts_count_towards_max)
                .unwrap_or(0),
            conditions: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| serde_json::to_value(c).ok())
                .unwrap_or_else(|| serde_json::Value::Array(Vec::new())),
            unservable: js.protocol_problem(),
            group_restart_timeout: js
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::deadline::TIMEOUT_ANNOTATION))
                .map(|v| v.chars().take(100).collect()),
        }
    }

    /// Equal for the algorithm (the resourceVersion aside).
    fn same_input(&self, other: &JobSetState) -> bool {
        JobSetState {
            resource_version: String::new(),
            ..self.clone()
        } == JobSetState {
            resource_version: String::new(),
            ..other.clone()
        }
    }
}

/// The pods of one JobSet: a dense vector (the algorithm's input, borrowed without a copy) and
/// a slot per pod name.
#[derive(Debug, Default)]
struct PodSet {
    views: Vec<PodView>,
    slot: HashMap<String, usize>,
    /// Each pod's `resourceVersion` as last seen (kept apart from the views: it changes with
    /// every write to the pod, most of which change nothing the decision reads).
    versions: HashMap<String, String>,
    /// Early failure detection: each pod's UID and epoch at which its `AllContainersRestarting`
    /// condition was last seen absent or `False` ([`restart_begun`]).
    armed: HashMap<String, Armed>,
    /// Every pod's controller reference (members and the others), to decide its membership
    /// again when a Job or the JobSet changes.
    controllers: HashMap<String, Option<ControllerRef>>,
    /// The pods labelled with the JobSet's name that are not (or not yet known to be) its
    /// members: their views, kept for when they turn out to be, and why not.
    outside: HashMap<String, (PodView, Membership)>,
}

impl PodSet {
    fn get(&self, name: &str) -> Option<&PodView> {
        self.slot.get(name).map(|i| &self.views[*i])
    }

    fn insert(&mut self, view: PodView) {
        match self.slot.get(&view.name) {
            Some(i) => self.views[*i] = view,
            None => {
                self.slot.insert(view.name.clone(), self.views.len());
                self.views.push(view);
            }
        }
    }

    /// Takes a pod out of the views (the members); returns its view.
    fn take(&mut self, name: &str) -> Option<PodView> {
        let i = self.slot.remove(name)?;
        let view = self.views.swap_remove(i);
        if let Some(moved) = self.views.get(i) {
            self.slot.insert(moved.name.clone(), i);
        }
        Some(view)
    }

    fn remove(&mut self, name: &str) {
        self.versions.remove(name);
        self.armed.remove(name);
        self.controllers.remove(name);
        self.outside.remove(name);
        self.take(name);
    }

    /// Files a pod's view as a member or aside; true when what the decision reads changed, or
    /// a pod aside turned out a stranger, or one for another reason (so that it is reported).
    fn place(&mut self, view: PodView, membership: Membership) -> bool {
        if membership == Membership::Member {
            let was_outside = self.outside.remove(&view.name).is_some();
            if self.get(&view.name) == Some(&view) {
                return was_outside;
            }
            self.insert(view);
            return true;
        }
        let was_member = self.take(&view.name).is_some();
        let reason_changed = matches!(membership, Membership::Stranger(_))
            && self
                .outside
                .get(&view.name)
                .is_none_or(|(_, m)| *m != membership);
        self.outside.insert(view.name.clone(), (view, membership));
        was_member || reason_changed
    }

    fn is_empty(&self) -> bool {
        self.views.is_empty() && self.outside.is_empty()
    }
}

/// The index of JobSets and their pods.
#[derive(Debug)]
pub struct Index {
    dialect: Dialect,
    jobsets: HashMap<Key, JobSetState>,
    /// Pods by JobSet.
    pods: HashMap<Key, PodSet>,
    /// Pod name → its JobSet key, to handle a pod whose label changes or that is deleted.
    pod_owner: HashMap<(String, String), Key>,
    /// Per JobSet, the synced epoch this process last wrote and the pods it counted then.
    last_sync: HashMap<Key, (Epoch, HashSet<String>)>,
    /// Per JobSet, the highest deprecated epoch this process wrote.
    last_deprecated: HashMap<Key, Epoch>,
    /// The Jobs of JobSets (by their label), by `(namespace, name)`.
    jobs: HashMap<(String, String), JobRecord>,
    /// Keys seen since the last `Init` of each watch, for relist clean-up.
    jobset_relist: Option<HashSet<Key>>,
    pod_relist: Option<HashSet<(String, String)>>,
    job_relist: Option<HashSet<(String, String)>>,
    /// The Job watch has listed once: until then no pod's membership is known.
    jobs_listed: bool,
}

impl Index {
    pub fn new(dialect: Dialect) -> Self {
        Index {
            dialect,
            jobsets: HashMap::new(),
            pods: HashMap::new(),
            pod_owner: HashMap::new(),
            last_sync: HashMap::new(),
            last_deprecated: HashMap::new(),
            jobs: HashMap::new(),
            jobset_relist: None,
            pod_relist: None,
            job_relist: None,
            jobs_listed: false,
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Number of pods tracked (members or not).
    pub fn pod_count(&self) -> usize {
        self.pod_owner.len()
    }

    /// Number of Jobs tracked.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// Number of JobSets tracked.
    pub fn jobset_count(&self) -> usize {
        self.jobsets.len()
    }

    /// Applies a JobSet; returns its key when the algorithm's input changed.
    pub fn apply_jobset(&mut self, js: &JobSet) -> Option<Key> {
        let key = Key::new(js.metadata.namespace.clone()?, js.metadata.name.clone()?);
        if let Some(seen) = self.jobset_relist.as_mut() {
            seen.insert(key.clone());
        }
        let state = JobSetState::from_jobset(js, self.dialect);
        let uid_changed = match self.jobsets.get_mut(&key) {
            Some(old) if old.same_input(&state) => {
                old.resource_version = state.resource_version;
                return None;
            }
            Some(old) => {
                let uid_changed = old.uid != state.uid;
                *old = state;
                uid_changed
            }
            None => {
                self.jobsets.insert(key.clone(), state);
                true
            }
        };
        if uid_changed {
            // Its pods' membership depends on its UID.
            self.reevaluate(&key);
        }
        Some(key)
    }

    pub fn delete_jobset(&mut self, namespace: &str, name: &str) {
        let key = Key::new(namespace, name);
        self.jobsets.remove(&key);
        self.last_sync.remove(&key);
        self.last_deprecated.remove(&key);
        self.reevaluate(&key);
    }

    /// Whether a pod labelled with `key`'s JobSet, controlled by `controller`, counts toward it.
    fn membership_of(&self, key: &Key, controller: Option<&ControllerRef>) -> Membership {
        let job = controller.and_then(|c| self.jobs.get(&(key.namespace.clone(), c.name.clone())));
        membership(
            &key.name,
            self.jobsets.get(key).map(|s| s.uid.as_str()),
            controller,
            job,
        )
    }

    /// Decides again the membership of every pod filed under `key`; true when what the
    /// decision reads changed.
    fn reevaluate(&mut self, key: &Key) -> bool {
        let Some(pods) = self.pods.get(key) else {
            return false;
        };
        let decided: Vec<(String, Membership)> = pods
            .controllers
            .iter()
            .map(|(name, c)| (name.clone(), self.membership_of(key, c.as_ref())))
            .collect();
        let counted = self.last_sync.get(key).map(|(_, c)| c);
        let mut changed = false;
        let Some(pods) = self.pods.get_mut(key) else {
            return false;
        };
        for (name, m) in decided {
            let view = match pods.outside.get(&name) {
                Some((view, _)) => view.clone(),
                None => match pods.get(&name) {
                    Some(view) => view.clone(),
                    None => continue,
                },
            };
            let mut view = view;
            view.counted_in_last_sync = counted.is_some_and(|c| c.contains(&name));
            changed |= pods.place(view, m);
        }
        changed
    }

    /// Applies a Job (its metadata); returns the keys of the JobSets whose pods' membership
    /// changed.
    pub fn apply_job(
        &mut self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Vec<Key> {
        let Some((ns, name, record)) = JobRecord::from_meta(meta) else {
            return Vec::new();
        };
        let id = (ns, name);
        if let Some(seen) = self.job_relist.as_mut() {
            seen.insert(id.clone());
        }
        let old = self.jobs.insert(id.clone(), record.clone());
        if old.as_ref() == Some(&record) {
            return Vec::new();
        }
        self.reevaluate_for_job(&id.0, [old.as_ref(), Some(&record)])
    }

    /// Removes a Job; returns the keys of the JobSets whose pods' membership changed.
    pub fn delete_job(&mut self, namespace: &str, name: &str) -> Vec<Key> {
        let Some(old) = self.jobs.remove(&(namespace.to_owned(), name.to_owned())) else {
            return Vec::new();
        };
        self.reevaluate_for_job(namespace, [Some(&old), None])
    }

    /// Decides again the pods of the JobSets a Job is labelled with or controlled by, as it was
    /// and as it is.
    fn reevaluate_for_job(
        &mut self,
        namespace: &str,
        records: [Option<&JobRecord>; 2],
    ) -> Vec<Key> {
        let mut keys: Vec<Key> = records
            .into_iter()
            .flatten()
            .flat_map(|r| [r.label.as_deref(), r.jobset()])
            .flatten()
            .map(|name| Key::new(namespace, name))
            .collect();
        keys.sort();
        keys.dedup();
        keys.retain(|k| self.reevaluate(k));
        keys
    }

    /// A Job watch (re)lists.
    pub fn jobs_relisting(&mut self) {
        self.job_relist = Some(HashSet::new());
    }

    /// The Job watch has not listed yet, or re-lists: no decision on memberships half known.
    pub fn jobs_relisting_in_progress(&self) -> bool {
        !self.jobs_listed || self.job_relist.is_some()
    }

    /// The Job relist is complete: forgets Jobs it did not contain; returns the keys whose
    /// pods' membership changed.
    pub fn jobs_relisted(&mut self) -> Vec<Key> {
        self.jobs_listed = true;
        let Some(seen) = self.job_relist.take() else {
            return Vec::new();
        };
        let gone: Vec<(String, String)> = self
            .jobs
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        let mut keys: Vec<Key> = gone
            .iter()
            .flat_map(|(ns, name)| self.delete_job(ns, name))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// The pods labelled with a JobSet's name that are not its members: name, UID and why, by
    /// name.
    pub fn strangers(&self, key: &Key) -> Vec<(String, String, Stranger)> {
        let mut out: Vec<(String, String, Stranger)> = self
            .pods
            .get(key)
            .into_iter()
            .flat_map(|p| p.outside.iter())
            .filter_map(|(name, (view, m))| match m {
                Membership::Stranger(s) => Some((name.clone(), view.uid.clone(), s.clone())),
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Applies a pod; returns the keys of the JobSets whose input changed (two when the pod moved
    /// from one JobSet to another).
    pub fn apply_pod(&mut self, pod: &WatchedPod) -> Vec<Key> {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone())
        else {
            return Vec::new();
        };
        let id = (ns, name.clone());
        if let Some(seen) = self.pod_relist.as_mut() {
            seen.insert(id.clone());
        }
        let mut changed = Vec::new();
        let new_key = pod.jobset_key().map(|(ns, name)| Key::new(ns, name));
        if let Some(old_key) = self.pod_owner.get(&id).cloned()
            && Some(&old_key) != new_key.as_ref()
        {
            self.remove_pod(&id);
            changed.push(old_key);
        }
        let Some(key) = new_key else {
            return changed;
        };
        let mut view = pod.view(self.dialect);
        view.counted_in_last_sync = self
            .last_sync
            .get(&key)
            .is_some_and(|(_, counted)| counted.contains(&name));
        let controller = ControllerRef::of(pod.metadata.owner_references.as_deref());
        let member = self.membership_of(&key, controller.as_ref());
        let pods = self.pods.entry(key.clone()).or_default();
        pods.controllers.insert(name.clone(), controller);
        if let Some(rv) = &pod.metadata.resource_version {
            pods.versions.insert(name.clone(), rv.clone());
        }
        let epoch = view
            .epoch_annotation
            .as_deref()
            .and_then(|a| parse_epoch(a).ok());
        let (armed, begun) = restart_begun(
            pods.armed.get(&name),
            &view.uid,
            epoch,
            pod.all_containers_restarting(),
        );
        view.restart_begun = begun;
        match armed {
            Some(armed) => pods.armed.insert(name.clone(), armed),
            None => pods.armed.remove(&name),
        };
        self.pod_owner.insert(id, key.clone());
        if pods.place(view, member) {
            changed.push(key);
        }
        changed
    }

    /// Removes a pod; returns its JobSet's key.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> Option<Key> {
        self.remove_pod(&(namespace.to_owned(), name.to_owned()))
    }

    fn remove_pod(&mut self, id: &(String, String)) -> Option<Key> {
        let key = self.pod_owner.remove(id)?;
        if let Some(pods) = self.pods.get_mut(&key) {
            pods.remove(&id.1);
            if pods.is_empty() {
                self.pods.remove(&key);
            }
        }
        Some(key)
    }

    /// A JobSet watch (re)lists: objects not seen before [`Index::jobsets_relisted`] are gone.
    pub fn jobsets_relisting(&mut self) {
        self.jobset_relist = Some(HashSet::new());
    }

    /// The JobSet relist is complete: forgets JobSets it did not contain (deleted while the
    /// watch was down) and returns their keys, so that state kept per JobSet elsewhere goes too.
    pub fn jobsets_relisted(&mut self) -> Vec<Key> {
        let Some(seen) = self.jobset_relist.take() else {
            return Vec::new();
        };
        let mut gone: Vec<Key> = self
            .jobsets
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.sort();
        for k in &gone {
            self.jobsets.remove(k);
        }
        gone
    }

    /// A pod watch (re)lists.
    pub fn pods_relisting(&mut self) {
        self.pod_relist = Some(HashSet::new());
    }

    /// A pod relist is in progress: the pods seen so far are listed anew, the others are as
    /// they were, so the set is no consistent view and nothing is decided on it.
    pub fn pods_relisting_in_progress(&self) -> bool {
        self.pod_relist.is_some()
    }

    /// The pod relist is complete: forgets pods it did not contain; returns the affected keys.
    pub fn pods_relisted(&mut self) -> Vec<Key> {
        let Some(seen) = self.pod_relist.take() else {
            return Vec::new();
        };
        let gone: Vec<_> = self
            .pod_owner
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        let mut keys: Vec<Key> = gone.iter().filter_map(|id| self.remove_pod(id)).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    pub fn jobset(&self, key: &Key) -> Option<&JobSetState> {
        self.jobsets.get(key)
    }

    /// Records a status this process wrote, so the next decision starts from it even before the
    /// watch delivers it. A JobSet deleted meanwhile (the watch's delete came first) stays
    /// forgotten: the answer to a write must not bring it back into the index.
    pub fn record_write(&mut self, key: &Key, js: &JobSet) {
        if let Some(state) = self.jobsets.get_mut(key) {
            *state = JobSetState::from_jobset(js, self.dialect);
        }
    }

    /// Records a synced epoch this process wrote and the pods it counted.
    pub fn record_sync(&mut self, key: &Key, epoch: Epoch, counted: &[String]) {
        let counted: HashSet<String> = counted.iter().cloned().collect();
        if let Some(pods) = self.pods.get_mut(key) {
            for view in &mut pods.views {
                view.counted_in_last_sync = counted.contains(&view.name);
            }
        }
        self.last_sync.insert(key.clone(), (epoch, counted));
    }

    /// Records a deprecated epoch this process wrote.
    pub fn record_deprecated(&mut self, key: &Key, epoch: Epoch) {
        let d = self.last_deprecated.entry(key.clone()).or_insert(epoch);
        *d = (*d).max(epoch);
    }

    /// The highest deprecated epoch this process wrote for a JobSet.
    pub fn last_deprecated(&self, key: &Key) -> Option<Epoch> {
        self.last_deprecated.get(key).copied()
    }

    /// The synced epoch this process last wrote for a JobSet.
    pub fn last_synced(&self, key: &Key) -> Option<Epoch> {
        self.last_sync.get(key).map(|(epoch, _)| *epoch)
    }

    /// A JobSet and its pods, borrowed: the worker runs the pure decision on them in place.
    /// A pod's `resourceVersion` as last seen.
    pub fn pod_resource_version(&self, key: &Key, pod: &str) -> Option<&str> {
        self.pods.get(key)?.versions.get(pod).map(String::as_str)
    }

    pub fn get(&self, key: &Key) -> Option<(&JobSetState, &[PodView])> {
        let js = self.jobsets.get(key)?;
        let pods = self
            .pods
            .get(key)
            .map(|p| p.views.as_slice())
            .unwrap_or(&[]);
        Some((js, pods))
    }

    /// Per namespace, the service accounts named by its InPlaceRestart JobSets (`None`: a pod
    /// template that names none).
    /// The namespaces with at least one pod of a JobSet in the index.
    pub fn namespaces_with_pods(&self) -> std::collections::HashSet<String> {
        self.pod_owner.keys().map(|(ns, _)| ns.clone()).collect()
    }

    pub fn service_accounts_by_namespace(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeSet<Option<String>>> {
        let mut out: std::collections::BTreeMap<_, std::collections::BTreeSet<_>> =
            std::collections::BTreeMap::new();
        for (Key { namespace: ns, .. }, js) in &self.jobsets {
            if js.in_place_restart {
                out.entry(ns.clone())
                    .or_default()
                    .extend(js.service_accounts.iter().cloned());
            }
        }
        out
    }

    /// Every active JobSet's key (for a full resync when leadership is gained).
    /// The InPlaceRestart JobSets, active or not: those with epochs to publish.
    pub fn in_place_restart_keys(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .jobsets
            .iter()
            .filter(|(_, s)| s.in_place_restart)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    pub fn active_keys(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .jobsets
            .iter()
            .filter(|(_, s)| s.active)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }
}

/// Builds the algorithm's input from a snapshot.
pub fn reconcile_input<'a>(
    dialect: Dialect,
    js: &JobSetState,
    pods: &'a [PodView],
    last_synced: Option<Epoch>,
    last_deprecated: Option<Epoch>,
) -> ReconcileInput<'a> {
    ReconcileInput {
        dialect,
        expected_pods: js.expected_pods,
        max_restarts: js.max_restarts,
        status: js.status,
        restarts: js.restarts,
        restarts_count_towards_max: js.restarts_count_towards_max,
        last_synced,
        last_deprecated,
        pods,
    }
}

#[cfg(test)]
mod tests;
