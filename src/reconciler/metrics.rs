//! The reconciler's Prometheus metrics (`jobset_inplace_reconciler_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::key::Key;
use super::queue::Reason;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `deprecated`, `synced`, `failed`, `restarts`.
    pub field: &'static str,
    /// `ok`, `conflict`, `error`, `timeout`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobSetLabels {
    /// Not `namespace`: Prometheus gives that name to the scrape target's namespace.
    pub jobset_namespace: String,
    pub jobset: String,
}

/// Every metric of the reconciler.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub group_restarts: Counter,
    /// Of those, the ones started by early failure detection (a pod's kubelet seen restarting
    /// it at the synced epoch, before its new agent registered the next one).
    pub early_group_restarts: Counter,
    pub group_restart_duration: Histogram,
    pub status_writes: Family<WriteLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub reconciles: Counter,
    /// Worker passes by why their JobSet was queued ([`Reason`]); a pass queued for several
    /// reasons counts under each.
    pub reconcile_reasons: Family<ReasonLabels, Counter>,
    pub pods_tracked: Gauge,
    pub jobsets_tracked: Gauge,
    pub failed_jobsets: Counter,
    pub is_leader: Gauge,
    /// One series per InPlaceRestart JobSet this replica wrote a deprecated epoch for, removed
    /// when the JobSet is deleted: bounded by the JobSets in the cluster.
    pub deprecated_epoch: Family<JobSetLabels, Gauge>,
    /// API requests that did not answer within the request timeout, by call.
    pub api_timeouts: Family<CallLabels, Counter>,
    /// Writes of JobSetEpoch objects, by result.
    pub epoch_publications: Family<ResultLabels, Counter>,
    /// Steps the group-restart deadline took, by step ([`DEADLINE_STEPS`]).
    pub deadline_steps: Family<StepLabels, Counter>,
    /// Pods the deadline's first step deleted.
    pub deadline_pods_deleted: Counter,
    /// Jobs the deadline's recreations deleted.
    pub deadline_jobs_deleted: Counter,
    /// Pods failed and deleted because their agent restarted without their workers (a node
    /// whose kubelet lacks `RestartAllContainersOnContainerExits`).
    pub agents_restarted_alone: Counter,
    /// Pods failed and deleted because their node was lost (its Ready condition `Unknown` past
    /// `--node-lost-grace`).
    pub pods_node_lost: Counter,
    /// Failed provisionings (or removals) of a namespace's agent account and binding, by reason.
    pub provision_failures: Family<ReasonLabels, Counter>,
    /// Namespaces whose provisioning fails now (each retried with its own backoff).
    pub provision_failing_namespaces: Gauge,
    /// Writes not sent, by call: too little was left of the leader's lease for them to complete
    /// before another replica could take it over.
    pub writes_fenced: Family<CallLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Of `provision_failures`: `conflict` (409), `invalid` (422), `forbidden` (403),
    /// `not_found`, `throttled`, `server_error`, `timeout`, `error`. Of `reconcile_reasons`: a
    /// [`Reason`]'s label.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, `error`, `timeout`.
    pub result: &'static str,
}

/// The steps of the group-restart deadline (docs/protocol.md, "Deadline"): the pods that did not
/// register in time deleted; every pod recreated; the JobSet failed instead, at `maxRestarts`.
pub const DEADLINE_STEPS: [&str; 3] = ["unregistered_pods_deleted", "recreated", "failed"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// One of [`DEADLINE_STEPS`].
    pub step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `status_write`, `status_read`, `epochs_write`, `provision_apply`, `event`, `crd_read`,
    /// `pod_delete`, `job_list`, `job_delete`.
    pub call: &'static str,
}

impl Metrics {
    /// Creates the metrics and registers them (prefix `jobset_inplace_reconciler`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            group_restarts: Counter::default(),
            early_group_restarts: Counter::default(),
            // 50 ms .. ~410 s.
            group_restart_duration: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            status_writes: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.000_01, 4.0, 12)),
            reconciles: Counter::default(),
            reconcile_reasons: Family::default(),
            pods_tracked: Gauge::default(),
            jobsets_tracked: Gauge::default(),
            failed_jobsets: Counter::default(),
            is_leader: Gauge::default(),
            deprecated_epoch: Family::default(),
            api_timeouts: Family::default(),
            epoch_publications: Family::default(),
            deadline_steps: Family::default(),
            deadline_pods_deleted: Counter::default(),
            deadline_jobs_deleted: Counter::default(),
            agents_restarted_alone: Counter::default(),
            pods_node_lost: Counter::default(),
            provision_failures: Family::default(),
            provision_failing_namespaces: Gauge::default(),
            writes_fenced: Family::default(),
        };
        // Every step's series exists from the start, at 0, so that a rate over it is defined.
        for step in DEADLINE_STEPS {
            let _ = m.deadline_steps.get_or_create(&StepLabels { step });
        }
        // Every reason's series exists from the start, at 0.
        for reason in Reason::ALL {
            let _ = m.reconcile_reasons.get_or_create(&ReasonLabels {
                reason: reason.label(),
            });
        }
        let r = registry.sub_registry_with_prefix("jobset_inplace_reconciler");
        r.register(
            "group_restarts",
            "Group restarts started (a deprecated epoch written)",
            m.group_restarts.clone(),
        );
        r.register(
            "early_group_restarts",
            "Group restarts started by early failure detection (a pod's AllContainersRestarting condition at the synced epoch)",
            m.early_group_restarts.clone(),
        );
        r.register(
            "group_restart_duration_seconds",
            "Time from writing the deprecated epoch to writing the synced epoch",
            m.group_restart_duration.clone(),
        );
        r.register(
            "status_writes",
            "JobSet status writes by field and result",
            m.status_writes.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "In-memory evaluation time of one JobSet",
            m.reconcile_duration.clone(),
        );
        r.register("reconciles", "JobSets evaluated", m.reconciles.clone());
        r.register(
            "reconcile_reasons",
            "Worker passes by why their JobSet was queued (a pass for several reasons counts under each)",
            m.reconcile_reasons.clone(),
        );
        r.register(
            "api_timeouts",
            "API requests that did not answer within the request timeout, by call",
            m.api_timeouts.clone(),
        );
        r.register(
            "epoch_publications",
            "Writes of JobSetEpoch objects (the epochs agents watch), by result",
            m.epoch_publications.clone(),
        );
        r.register("pods_tracked", "Pods in the index", m.pods_tracked.clone());
        r.register(
            "jobsets_tracked",
            "JobSets in the index",
            m.jobsets_tracked.clone(),
        );
        r.register(
            "failed_jobsets",
            "JobSets failed for exceeding maxRestarts",
            m.failed_jobsets.clone(),
        );
        r.register(
            "is_leader",
            "1 while this replica holds the leader lease",
            m.is_leader.clone(),
        );
        r.register(
            "group_restart_deadline_steps",
            "Steps the group-restart deadline took: unregistered pods deleted, every pod recreated, or the JobSet failed at maxRestarts",
            m.deadline_steps.clone(),
        );
        r.register(
            "deadline_pods_deleted",
            "Pods deleted because they did not register a group restart's epoch in time",
            m.deadline_pods_deleted.clone(),
        );
        r.register(
            "deadline_jobs_deleted",
            "Jobs deleted to recreate a JobSet whose group restart did not complete",
            m.deadline_jobs_deleted.clone(),
        );
        r.register(
            "agents_restarted_alone",
            "Pods failed and deleted because their agent restarted without their workers (a node whose kubelet lacks RestartAllContainersOnContainerExits)",
            m.agents_restarted_alone.clone(),
        );
        r.register(
            "pods_node_lost",
            "Pods failed and deleted because their node was lost (Ready Unknown past --node-lost-grace)",
            m.pods_node_lost.clone(),
        );
        r.register(
            "provision_failures",
            "Failed provisionings of a namespace's agent ServiceAccount and RoleBinding, by reason (each namespace retried with a backoff of its own)",
            m.provision_failures.clone(),
        );
        r.register(
            "provision_failing_namespaces",
            "Namespaces whose agent ServiceAccount and RoleBinding cannot be provisioned now",
            m.provision_failing_namespaces.clone(),
        );
        r.register(
            "writes_fenced",
            "Writes not sent because too little was left of the leader lease for them to complete before another replica could take it",
            m.writes_fenced.clone(),
        );
        r.register(
            "jobset_deprecated_epoch",
            "The newest deprecated epoch this replica wrote for a JobSet: its group restarts",
            m.deprecated_epoch.clone(),
        );
        m
    }

    /// Records the deprecated epoch written for the JobSet `key`.
    pub fn deprecated(&self, key: &Key, epoch: i64) {
        self.deprecated_epoch
            .get_or_create(&JobSetLabels {
                jobset_namespace: key.namespace.clone(),
                jobset: key.name.clone(),
            })
            .set(epoch);
    }

    /// Drops the series of a deleted JobSet.
    pub fn forget(&self, key: &Key) {
        self.deprecated_epoch.remove(&JobSetLabels {
            jobset_namespace: key.namespace.clone(),
            jobset: key.name.clone(),
        });
    }

    /// One pass of a worker ran for `reason` (among others, perhaps).
    pub(crate) fn count_reason(&self, reason: Reason) {
        self.reconcile_reasons
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .inc();
    }

    pub fn api_timeout(&self, call: &'static str) {
        self.api_timeouts.get_or_create(&CallLabels { call }).inc();
    }

    pub fn publication(&self, result: &'static str) {
        self.epoch_publications
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// One step of the group-restart deadline ([`DEADLINE_STEPS`]).
    pub fn deadline_step(&self, step: &'static str) {
        self.deadline_steps
            .get_or_create(&StepLabels { step })
            .inc();
    }

    /// A write not sent: too little left of the lease.
    pub fn write_fenced(&self, call: &'static str) {
        self.writes_fenced.get_or_create(&CallLabels { call }).inc();
    }

    /// A failed provisioning of a namespace.
    pub fn provision_failure(&self, reason: &'static str) {
        self.provision_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn write(&self, field: &'static str, result: &'static str) {
        self.status_writes
            .get_or_create(&WriteLabels { field, result })
            .inc();
    }
}
