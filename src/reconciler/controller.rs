//! The reconciler's runtime ([`Controller`]): it starts the tasks below and hands out the
//! readiness probe. Each room has one job, and no room imports this one:
//!
//! - `watches.rs`: the JobSet, pod, Job, `JobSetEpoch` and namespace watches feeding the index, the
//!   work queue and the provisioner, and the leadership follower;
//! - `worker.rs`: the workers that take JobSets from the queue, and their retry with backoff;
//! - `status.rs`: the pure decision run on the index, and the status writes (the epoch fields,
//!   where the synced epoch is raised: `status::write_epochs`; the `Failed` condition);
//! - `publication.rs`: each InPlaceRestart JobSet's epochs in its `JobSetEpoch` object;
//! - `report.rs`: events, progress (metrics, log lines), observe mode, malformed and unservable
//!   JobSets;
//! - `deadline.rs`: the group-restart deadline carried out (`deadline_entry.rs` is what it keeps);
//! - `alone.rs`: pods whose agent restarted without their workers, failed and deleted;
//! - `lost.rs`: the Node watch, and the pods of lost nodes failed and deleted;
//! - `provisioning.rs`: the agent's ServiceAccount and RoleBinding per namespace;
//! - `api.rs`: every API call, bounded by the request timeout and fenced by the lease, and the
//!   errors a reconcile ends with;
//! - `state.rs`: what the tasks share, and the ONE entry kept per JobSet;
//! - `settings.rs`: what the controller is told.
//!
//! The flow: a watch event updates the index and queues the JobSet; a worker decides on the
//! index ([`crate::protocol::reconcile_decide`]), writes what changed, publishes, then runs the
//! deadline. Our own runtime rather than kube-runtime's `Controller`: writes must stop at the
//! leader's write deadline, decisions need JobSets and pods joined in one index that sees
//! relists whole, and the deadline's steps run off the workers with per-namespace caps.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::metrics::Metrics;

mod alone;
mod api;
mod deadline;
mod deadline_entry;
mod lost;
mod provisioning;
mod publication;
mod report;
mod settings;
mod state;
mod status;
mod watches;
mod worker;

pub use api::ReconcileError;
pub use report::CONTROLLER_NAME;
pub use settings::{DEFAULT_REQUEST_TIMEOUT, DEFAULT_WATCH_TIMEOUT, Settings};
pub use state::StateSizes;
pub use status::REACHED_MAX_RESTARTS;

use state::Shared;

/// A running controller.
pub struct Controller {
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl Controller {
    /// Starts the watches, the workers and the event publisher. Workers write only while
    /// `leader` is true; no write has a deadline (see [`Controller::start_fenced`]).
    pub fn start(
        client: kube::Client,
        settings: Settings,
        metrics: Metrics,
        leader: watch::Receiver<bool>,
    ) -> Controller {
        let (_, write_until) = watch::channel(None);
        Controller::start_fenced(client, settings, metrics, leader, write_until)
    }

    /// As [`Controller::start`]; every write is sent only with a timeout that ends before
    /// `write_until` ([`super::fence::write_budget`]).
    pub fn start_fenced(
        client: kube::Client,
        settings: Settings,
        metrics: Metrics,
        leader: watch::Receiver<bool>,
        write_until: watch::Receiver<Option<Instant>>,
    ) -> Controller {
        let (events_tx, events_rx) = mpsc::channel(report::EVENT_QUEUE);
        let shared = Arc::new(Shared::new(
            client,
            settings,
            metrics,
            leader,
            write_until,
            events_tx,
        ));
        let mut tasks = JoinSet::new();
        tasks.spawn(watches::watch_jobsets(shared.clone()));
        tasks.spawn(watches::watch_pods(shared.clone()));
        tasks.spawn(watches::watch_jobs(shared.clone()));
        if shared.settings.publish_epochs {
            tasks.spawn(watches::watch_published(shared.clone()));
        }
        tasks.spawn(report::publish_events(shared.clone(), events_rx));
        tasks.spawn(watches::follow_leadership(shared.clone()));
        if shared.settings.node_lost.watches() {
            tasks.spawn(lost::watch_nodes(shared.clone()));
        }
        if shared.settings.provision.is_some() {
            tasks.spawn(watches::watch_namespaces(shared.clone()));
            tasks.spawn(provisioning::provision_loop(shared.clone()));
        }
        for _ in 0..shared.settings.workers.max(1) {
            tasks.spawn(worker::work(shared.clone()));
        }
        Controller { shared, tasks }
    }

    /// The three caches (JobSets, pods, Jobs) have synced once.
    pub fn is_ready(&self) -> bool {
        self.shared.synced()
    }

    /// A probe for /readyz: the three caches have synced once.
    pub fn readiness(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.synced()
    }

    /// JobSets waiting in the queue.
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }

    /// How much state is held now (the tests' check that nothing grows without bound).
    pub fn state_sizes(&self) -> StateSizes {
        self.shared.sizes()
    }

    /// Stops every task.
    pub async fn shutdown(mut self) {
        self.shared.abort_tasks();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    /// Every room of the controller, as compiled.
    const ROOMS: [(&str, &str); 13] = [
        ("alone", include_str!("controller/alone.rs")),
        ("api", include_str!("controller/api.rs")),
        ("deadline", include_str!("controller/deadline.rs")),
        (
            "deadline_entry",
            include_str!("controller/deadline_entry.rs"),
        ),
        ("lost", include_str!("controller/lost.rs")),
        ("provisioning", include_str!("controller/provisioning.rs")),
        ("publication", include_str!("controller/publication.rs")),
        ("report", include_str!("controller/report.rs")),
        ("settings", include_str!("controller/settings.rs")),
        ("state", include_str!("controller/state.rs")),
        ("status", include_str!("controller/status.rs")),
        ("watches", include_str!("controller/watches.rs")),
        ("worker", include_str!("controller/worker.rs")),
    ];

    /// The first segments of a room's `super::` paths outside its tests and comments (each name
    /// of a `super::{..}` group): what it takes from its parent, or the sibling it goes through.
    fn parent_names(source: &str) -> Vec<String> {
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut names = Vec::new();
        for (at, _) in code.match_indices("super::") {
            let rest = &code[at + "super::".len()..];
            let paths: Vec<&str> = match rest.strip_prefix('{') {
                Some(inner) => inner
                    .split('}')
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .collect(),
                None => vec![rest],
            };
            for path in paths {
                let name: String = path
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        }
        names
    }

    /// No room imports its parent's own items (the parent imports every room: that would be a
    /// two-way tie); a room reaches another room as `super::room`.
    #[test]
    fn rooms_import_siblings_never_their_parent() {
        let rooms: Vec<&str> = ROOMS.iter().map(|(name, _)| *name).collect();
        let declared: Vec<&str> = include_str!("controller.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        assert_eq!(declared, rooms, "every room of the controller is checked");
        for (room, source) in ROOMS {
            for name in parent_names(source) {
                assert!(
                    rooms.contains(&name.as_str()),
                    "controller/{room}.rs takes `super::{name}` from its parent; import the room \
                     that holds it instead"
                );
            }
        }
    }
}
