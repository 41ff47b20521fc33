//! `jobset-inplace status -n NS JOBSET`: where one JobSet's group restart stands. The JobSet's
//! two epoch fields, and per pod its epoch, phase, restarts and whether its barrier is lifted,
//! the pods the group waits for first, and the group-restart deadline the JobSet asks for (the
//! clock itself is the reconciler's, in memory). [`report`] is pure; [`fetch`] reads the two
//! inputs.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::deadline::{self, TIMEOUT_ANNOTATION, display_duration};
use crate::jobset::JobSet;
use crate::protocol::{Dialect, Epoch, JOBSET_NAME_LABEL};
use crate::wire::agent_env;

/// The released JobSet agent's container name (ours is [`agent_env::CONTAINER_NAME`]).
const RELEASED_AGENT_CONTAINER: &str = "in-place-restart-agent";

/// How one pod stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    pub name: String,
    /// `Pending`, `Running`, ... (`Unknown` when the kubelet has not written one).
    pub phase: String,
    /// `Some(node)` once scheduled.
    pub node: Option<String>,
    /// The pod's epoch annotation: a number, `None` when absent.
    pub epoch: Option<Epoch>,
    /// The annotation's text when it is not an epoch.
    pub malformed_epoch: Option<String>,
    /// Sum of every container's `restartCount` (in-place restarts show here).
    pub restarts: i32,
    /// Whether the agent's barrier is lifted: the agent container reports `started` (its startup
    /// probe, the barrier, passed). `None` when no agent container is recognised.
    pub barrier_lifted: Option<bool>,
    /// Why the group waits for this pod (`None`: it does not).
    pub waiting: Option<String>,
    /// Being deleted.
    pub terminating: bool,
}

/// Where the group restart stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state")]
pub enum GroupState {
    /// Not an InPlaceRestart JobSet, or in-place restart is disabled by annotation.
    NotInPlaceRestart,
    /// Every expected pod is registered at the synced epoch.
    Synced { epoch: Epoch },
    /// Pods are registering a new epoch, or some are missing.
    Restarting {
        epoch: Option<Epoch>,
        waiting: usize,
    },
}

/// The group-restart deadline a JobSet asks for ([`crate::deadline`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadlineSetting {
    /// Its timeout annotation, as written (`None`: the reconciler's `--group-restart-timeout`).
    pub annotation: Option<String>,
    /// The annotation's timeout (`off` for 0), when it is valid.
    pub timeout: Option<String>,
    /// Why the annotation is not valid (the reconciler then uses its own timeout).
    pub error: Option<String>,
}

impl DeadlineSetting {
    fn of(jobset: &JobSet) -> Self {
        let annotation = jobset
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TIMEOUT_ANNOTATION))
            .cloned();
        let parsed = annotation.as_deref().map(deadline::parse_timeout);
        DeadlineSetting {
            timeout: match &parsed {
                Some(Ok(Some(t))) => Some(display_duration(*t)),
                Some(Ok(None)) => Some("off".to_owned()),
                _ => None,
            },
            error: match parsed {
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            },
            annotation,
        }
    }

    /// One line: the timeout and what happens when it passes.
    fn render(&self) -> String {
        let then = "unregistered pods deleted after it, every pod recreated after as long again \
                    (counted against maxRestarts)";
        match (&self.timeout, &self.error) {
            (Some(off), _) if off == "off" => {
                format!("group-restart deadline: off ({TIMEOUT_ANNOTATION}: 0)")
            }
            (Some(t), _) => format!("group-restart deadline: {t} (annotation): {then}"),
            (None, Some(e)) => format!(
                "group-restart deadline: the reconciler's --group-restart-timeout (2m unless \
                 set); annotation {TIMEOUT_ANNOTATION}: {e}"
            ),
            (None, None) => format!(
                "group-restart deadline: the reconciler's --group-restart-timeout (2m unless \
                 set): {then}"
            ),
        }
    }
}

/// The whole answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub namespace: String,
    pub name: String,
    pub dialect: String,
    pub deprecated_field: String,
    pub synced_field: String,
    pub deprecated: Option<Epoch>,
    pub synced: Option<Epoch>,
    /// `replicas x parallelism`, summed.
    pub expected_pods: i64,
    /// Expected pods that do not exist (not yet created, or deleted and not yet replaced).
    pub missing_pods: i64,
    pub state: GroupState,
    /// The group-restart deadline it asks for.
    pub deadline: DeadlineSetting,
    /// Waiting pods first, then by name.
    pub pods: Vec<PodRow>,
}

/// The report for one JobSet and its pods. Pure.
pub fn report(jobset: &JobSet, pods: &[Pod], dialect: Dialect) -> StatusReport {
    let status = jobset.epoch_status(dialect);
    let mut rows: Vec<PodRow> = pods.iter().map(|p| pod_row(p, dialect)).collect();
    // The epoch the group moves to: the highest registered, at least the synced one.
    let target = rows
        .iter()
        .filter_map(|r| r.epoch)
        .chain(status.synced)
        .max();
    for row in &mut rows {
        row.waiting = waiting_reason(row, target, status.synced);
    }
    let expected = jobset.expected_pods();
    let live = rows.iter().filter(|r| !r.terminating).count();
    let missing = (expected - i64::try_from(live).unwrap_or(i64::MAX)).max(0);
    rows.sort_by(|a, b| (a.waiting.is_none(), &a.name).cmp(&(b.waiting.is_none(), &b.name)));
    let waiting = rows.iter().filter(|r| r.waiting.is_some()).count()
        + usize::try_from(missing).unwrap_or(usize::MAX);
    let state = if !jobset.is_in_place_restart() || jobset.is_in_place_restart_disabled() {
        GroupState::NotInPlaceRestart
    } else if waiting == 0
        && let Some(epoch) = status.synced
    {
        GroupState::Synced { epoch }
    } else {
        GroupState::Restarting {
            epoch: target,
            waiting,
        }
    };
    StatusReport {
        namespace: jobset.metadata.namespace.clone().unwrap_or_default(),
        name: jobset.metadata.name.clone().unwrap_or_default(),
        dialect: dialect.to_string(),
        deprecated_field: dialect.deprecated_field().to_owned(),
        synced_field: dialect.synced_field().to_owned(),
        deprecated: status.deprecated,
        synced: status.synced,
        expected_pods: expected,
        missing_pods: missing,
        state,
        deadline: DeadlineSetting::of(jobset),
        pods: rows,
    }
}

fn waiting_reason(row: &PodRow, target: Option<Epoch>, synced: Option<Epoch>) -> Option<String> {
    if row.terminating {
        return Some("being deleted".to_owned());
    }
    if let Some(text) = &row.malformed_epoch {
        return Some(format!("malformed epoch annotation {text:?}"));
    }
    match (row.epoch, target) {
        (None, _) => Some(if row.phase == "Pending" {
            "pending: its agent has not started".to_owned()
        } else {
            "not registered: its agent has not written an epoch".to_owned()
        }),
        (Some(e), Some(t)) if e < t => Some(format!(
            "registered epoch {e}, the group moves to {t}: must restart"
        )),
        (Some(e), _) if synced != Some(e) => Some(format!("registered epoch {e}, not yet synced")),
        (Some(_), _) if row.barrier_lifted == Some(false) => {
            Some("synced, but its barrier has not lifted yet".to_owned())
        }
        _ => None,
    }
}

fn pod_row(pod: &Pod, dialect: Dialect) -> PodRow {
    let annotations = pod.metadata.annotations.as_ref();
    let (epoch, malformed_epoch) = match annotations.map(|a| dialect.read_pod_epoch(a)) {
        None | Some(Ok(None)) => (None, None),
        Some(Ok(Some(e))) => (Some(e), None),
        Some(Err(e)) => (None, Some(e.value)),
    };
    let status = pod.status.as_ref();
    let statuses = || {
        status.into_iter().flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
    };
    let restarts = statuses()
        .map(|c| c.restart_count)
        .fold(0i32, i32::saturating_add);
    let agent = agent_container_name(pod);
    let barrier_lifted = agent.map(|name| {
        let found: Option<&ContainerStatus> = statuses().find(|c| c.name == name);
        found.is_some_and(|c| c.started == Some(true))
    });
    PodRow {
        name: pod.metadata.name.clone().unwrap_or_default(),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Unknown".to_owned()),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        epoch,
        malformed_epoch,
        restarts,
        barrier_lifted,
        waiting: None,
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// The agent container of a pod: ours or the released agent by name, else the container that
/// reads the agent's downward-API env (`JOBSET_NAME` and `POD_NAME`).
fn agent_container_name(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let all = || {
        spec.init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
    };
    let by_name =
        all().find(|c| c.name == agent_env::CONTAINER_NAME || c.name == RELEASED_AGENT_CONTAINER);
    let has_env = |c: &&Container| {
        let names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        names.contains(&agent_env::JOBSET_NAME) && names.contains(&agent_env::POD_NAME)
    };
    by_name
        .or_else(|| all().find(has_env))
        .map(|c| c.name.clone())
}

impl StatusReport {
    /// The text form: a summary, then one line per pod.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let show = |e: Option<Epoch>| e.map_or_else(|| "-".to_owned(), |e| e.to_string());
        let _ = writeln!(
            s,
            "JobSet {}/{} ({} protocol): {}={} {}={}, {} pods expected",
            self.namespace,
            self.name,
            self.dialect,
            self.deprecated_field,
            show(self.deprecated),
            self.synced_field,
            show(self.synced),
            self.expected_pods
        );
        let _ = match &self.state {
            GroupState::NotInPlaceRestart => writeln!(
                s,
                "not an InPlaceRestart JobSet (or in-place restart is disabled): nothing to sync"
            ),
            GroupState::Synced { epoch } => {
                writeln!(s, "synced: every pod runs at epoch {epoch}")
            }
            GroupState::Restarting { epoch, waiting } => writeln!(
                s,
                "group restart to epoch {}: waiting for {waiting} pod(s)",
                show(*epoch)
            ),
        };
        if self.missing_pods > 0 {
            let _ = writeln!(
                s,
                "{} expected pod(s) do not exist yet (not created, or deleted and not replaced)",
                self.missing_pods
            );
        }
        if self.state != GroupState::NotInPlaceRestart {
            let _ = writeln!(s, "{}", self.deadline.render());
        }
        let mut table: Vec<[String; 7]> = vec![
            [
                "POD",
                "PHASE",
                "EPOCH",
                "RESTARTS",
                "BARRIER",
                "NODE",
                "WAITING FOR",
            ]
            .map(str::to_owned),
        ];
        for p in &self.pods {
            table.push([
                p.name.clone(),
                p.phase.clone(),
                p.malformed_epoch
                    .as_ref()
                    .map_or_else(|| show(p.epoch), |m| format!("{m:?}")),
                p.restarts.to_string(),
                match p.barrier_lifted {
                    Some(true) => "lifted",
                    Some(false) => "down",
                    None => "?",
                }
                .to_owned(),
                p.node.clone().unwrap_or_else(|| "-".to_owned()),
                p.waiting.clone().unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        let mut widths = [0usize; 7];
        for row in &table {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in &table {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let _ = write!(line, "{cell:<w$}  ");
                }
            }
            let _ = writeln!(s, "{}", line.trim_end());
        }
        s
    }
}

/// Reads the JobSet and its pods.
pub async fn fetch(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    dialect: Dialect,
) -> Result<StatusReport, kube::Error> {
    let jobset = Api::<JobSet>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    let selector = format!("{JOBSET_NAME_LABEL}={name}");
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(report(&jobset, &pods.items, dialect))
}

/// One InPlaceRestart JobSet of `status` without a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListRow {
    pub namespace: String,
    pub name: String,
    pub deprecated: Option<Epoch>,
    pub synced: Option<Epoch>,
    pub expected_pods: i64,
    pub state: GroupState,
}

/// The InPlaceRestart JobSets among `jobsets` (by namespace, then name), each with its pods
/// (grouped by their JobSet-name label). Pure.
pub fn list(jobsets: &[JobSet], pods: &[Pod], dialect: Dialect) -> Vec<ListRow> {
    let mut by_jobset: std::collections::BTreeMap<(String, String), Vec<Pod>> =
        std::collections::BTreeMap::new();
    for pod in pods {
        let label = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(JOBSET_NAME_LABEL));
        if let Some(name) = label {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            by_jobset
                .entry((ns, name.clone()))
                .or_default()
                .push(pod.clone());
        }
    }
    let mut rows: Vec<ListRow> = jobsets
        .iter()
        .filter(|js| js.is_in_place_restart())
        .map(|js| {
            let key = (
                js.metadata.namespace.clone().unwrap_or_default(),
                js.metadata.name.clone().unwrap_or_default(),
            );
            let own = by_jobset.get(&key).map(Vec::as_slice).unwrap_or_default();
            let r = report(js, own, dialect);
            ListRow {
                namespace: r.namespace,
                name: r.name,
                deprecated: r.deprecated,
                synced: r.synced,
                expected_pods: r.expected_pods,
                state: r.state,
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// The text form of [`list`]: one line per JobSet, the dialect's field names as headers.
pub fn render_list(rows: &[ListRow], dialect: Dialect) -> String {
    if rows.is_empty() {
        return "no InPlaceRestart JobSet\n".to_owned();
    }
    let show = |e: Option<Epoch>| e.map_or_else(|| "-".to_owned(), |e| e.to_string());
    let mut table: Vec<[String; 6]> = vec![[
        "NAMESPACE".to_owned(),
        "NAME".to_owned(),
        dialect.deprecated_field().to_uppercase(),
        dialect.synced_field().to_uppercase(),
        "PODS".to_owned(),
        "STATE".to_owned(),
    ]];
    for r in rows {
        table.push([
            r.namespace.clone(),
            r.name.clone(),
            show(r.deprecated),
            show(r.synced),
            r.expected_pods.to_string(),
            match &r.state {
                GroupState::NotInPlaceRestart => "in-place restart disabled".to_owned(),
                GroupState::Synced { epoch } => format!("synced at {epoch}"),
                GroupState::Restarting { epoch, waiting } => {
                    format!("restarting to {}: waiting for {waiting}", show(*epoch))
                }
            },
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    for row in &table {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(widths) {
            let _ = write!(line, "{cell:<w$}  ");
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

/// Reads the JobSets of `namespace` (every namespace for `None`) and their pods.
pub async fn fetch_list(
    client: &kube::Client,
    namespace: Option<&str>,
    dialect: Dialect,
) -> Result<Vec<ListRow>, kube::Error> {
    let (jobsets, pods) = match namespace {
        Some(ns) => (
            Api::<JobSet>::namespaced(client.clone(), ns),
            Api::<Pod>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::<JobSet>::all(client.clone()),
            Api::<Pod>::all(client.clone()),
        ),
    };
    let jobsets = jobsets.list(&ListParams::default()).await?;
    let pods = pods
        .list(&ListParams::default().labels(JOBSET_NAME_LABEL))
        .await?;
    Ok(list(&jobsets.items, &pods.items, dialect))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jobset(status: serde_json::Value) -> JobSet {
        serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "team"},
            "spec": {"failurePolicy": {"restartStrategy": "InPlaceRestart"},
                     "replicatedJobs": [{"name": "w", "replicas": 1,
                        "template": {"spec": {"parallelism": 3, "completions": 3}}}]},
            "status": status
        }))
        .expect("jobset")
    }

    fn pod(name: &str, epoch: Option<&str>, started: bool, phase: &str) -> Pod {
        let annotations = epoch.map(|e| json!({"jobset.sigs.k8s.io/epoch": e}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team", "annotations": annotations},
            "spec": {"nodeName": "n1",
                     "initContainers": [{"name": "jobset-inplace-agent", "restartPolicy": "Always"}],
                     "containers": [{"name": "worker"}]},
            "status": {"phase": phase,
                       "initContainerStatuses": [{"name": "jobset-inplace-agent", "started": started,
                          "restartCount": 1, "ready": started, "image": "a", "imageID": ""}],
                       "containerStatuses": [{"name": "worker", "restartCount": 2,
                          "ready": started, "image": "w", "imageID": ""}]}
        }))
        .expect("pod")
    }

    #[test]
    fn synced_group() {
        let js = jobset(json!({"deprecatedEpoch": 1, "syncedEpoch": 2}));
        let pods = [
            pod("p0", Some("2"), true, "Running"),
            pod("p1", Some("2"), true, "Running"),
            pod("p2", Some("2"), true, "Running"),
        ];
        let r = report(&js, &pods, Dialect::Epoch);
        assert_eq!(r.state, GroupState::Synced { epoch: 2 });
        assert_eq!(r.missing_pods, 0);
        assert!(r.pods.iter().all(|p| p.waiting.is_none()));
        assert_eq!(r.pods[0].restarts, 3);
        assert_eq!(r.pods[0].barrier_lifted, Some(true));
        let text = r.render();
        assert!(text.contains("synced: every pod runs at epoch 2"), "{text}");
        assert!(text.contains("deprecatedEpoch=1 syncedEpoch=2"), "{text}");
    }

    #[test]
    fn restarting_group_lists_the_pods_it_waits_for_first() {
        let js = jobset(json!({"deprecatedEpoch": 1, "syncedEpoch": 2}));
        let pods = [
            pod("a-done", Some("3"), false, "Running"),
            pod("b-old", Some("2"), true, "Running"),
            pod("c-bad", Some("x7"), false, "Running"),
        ];
        let r = report(&js, &pods, Dialect::Epoch);
        assert_eq!(
            r.state,
            GroupState::Restarting {
                epoch: Some(3),
                waiting: 3
            }
        );
        let names: Vec<&str> = r.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a-done", "b-old", "c-bad"]);
        assert!(
            r.pods[0]
                .waiting
                .as_deref()
                .is_some_and(|w| w.contains("not yet synced"))
        );
        assert!(
            r.pods[1]
                .waiting
                .as_deref()
                .is_some_and(|w| w.contains("must restart"))
        );
        assert!(
            r.pods[2]
                .waiting
                .as_deref()
                .is_some_and(|w| w.contains("malformed"))
        );
        // A missing pod is waited for too; a pod that waits for nothing sorts last.
        let pods = [
            pod("a", Some("3"), true, "Running"),
            pod("z", None, false, "Pending"),
        ];
        let js = jobset(json!({"deprecatedEpoch": 2, "syncedEpoch": 3}));
        let r = report(&js, &pods, Dialect::Epoch);
        assert_eq!(r.missing_pods, 1);
        assert_eq!(r.pods[0].name, "z");
        assert_eq!(
            r.state,
            GroupState::Restarting {
                epoch: Some(3),
                waiting: 2
            }
        );
        assert!(r.render().contains("1 expected pod(s) do not exist yet"));
    }

    #[test]
    fn the_deadline_the_jobset_asks_for() {
        let mut js = jobset(json!({"deprecatedEpoch": 1, "syncedEpoch": 1}));
        let r = report(&js, &[], Dialect::Epoch);
        assert_eq!(r.deadline.annotation, None);
        assert!(
            r.render()
                .contains("group-restart deadline: the reconciler's --group-restart-timeout"),
            "{}",
            r.render()
        );
        for (value, timeout, line) in [
            (
                "90s",
                Some("1m30s"),
                "group-restart deadline: 1m30s (annotation)",
            ),
            ("0", Some("off"), "group-restart deadline: off"),
            ("soon", None, "\"soon\" is not a group-restart timeout"),
        ] {
            js.metadata.annotations = Some(
                [(TIMEOUT_ANNOTATION.to_owned(), value.to_owned())]
                    .into_iter()
                    .collect(),
            );
            let r = report(&js, &[], Dialect::Epoch);
            assert_eq!(r.deadline.annotation.as_deref(), Some(value));
            assert_eq!(r.deadline.timeout.as_deref(), timeout);
            assert_eq!(r.deadline.error.is_some(), timeout.is_none());
            assert!(r.render().contains(line), "{}", r.render());
            let json = serde_json::to_value(&r).expect("json");
            assert_eq!(json["deadline"]["annotation"], value);
        }
    }

    #[test]
    fn not_an_in_place_restart_jobset() {
        let mut js = jobset(json!({}));
        if let Some(spec) = js.spec.as_mut() {
            spec.failure_policy = None;
        }
        let r = report(&js, &[], Dialect::Epoch);
        assert_eq!(r.state, GroupState::NotInPlaceRestart);
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["state"]["state"], "NotInPlaceRestart");
    }

    #[test]
    fn the_list_shows_in_place_restart_jobsets_with_their_own_pods() {
        let mut restarting = jobset(json!({"deprecatedEpoch": 1, "syncedEpoch": 1}));
        restarting.metadata.name = Some("a".into());
        let mut synced = jobset(json!({"deprecatedEpoch": 1, "syncedEpoch": 2}));
        synced.metadata.name = Some("b".into());
        let mut other: JobSet = serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "plain", "namespace": "team"},
            "spec": {"replicatedJobs": []}
        }))
        .expect("jobset");
        other.metadata.namespace = Some("team".into());
        let labelled = |name: &str, js: &str, epoch: &str| {
            let mut p = pod(name, Some(epoch), true, "Running");
            p.metadata.labels = Some([(JOBSET_NAME_LABEL.to_owned(), js.to_owned())].into());
            p
        };
        let pods: Vec<Pod> = (0..3)
            .map(|i| labelled(&format!("b-{i}"), "b", "2"))
            .chain([labelled("a-0", "a", "2")])
            .collect();
        let rows = list(&[synced, other, restarting], &pods, Dialect::Epoch);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "sorted, the plain JobSet left out");
        assert_eq!(rows[1].state, GroupState::Synced { epoch: 2 });
        assert_eq!(
            rows[0].state,
            GroupState::Restarting {
                epoch: Some(2),
                waiting: 3
            },
            "a's one pod registered 2, unsynced, and two are missing"
        );
        let text = render_list(&rows, Dialect::Epoch);
        assert!(text.starts_with("NAMESPACE"), "{text}");
        assert!(text.contains("SYNCEDEPOCH"), "{text}");
        assert!(text.contains("synced at 2"), "{text}");
        assert!(text.contains("restarting to 2: waiting for 3"), "{text}");
        assert_eq!(
            render_list(&[], Dialect::Epoch),
            "no InPlaceRestart JobSet\n"
        );
    }
}
