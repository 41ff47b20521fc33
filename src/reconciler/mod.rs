//! The `reconciler` subcommand (docs/protocol.md; docs/architecture.md, "Reconciler"): watches InPlaceRestart JobSets and their pods,
//! moves the epoch status fields, fails JobSets past `maxRestarts`.
//!
//! - [`key`]: the name of one JobSet, the key of every per-JobSet map;
//! - [`index`]: the in-memory index of JobSets, their Jobs and their pods (pure);
//! - [`membership`]: which pods count toward a JobSet (pure);
//! - [`controller`]: the runtime, in rooms of one job each (watches, workers and retry, status
//!   writes, publication, reporting, the group-restart deadline carried out, provisioning, one
//!   API-call module; the deadline's decision is [`crate::deadline`]);
//! - `queue`: the work queue between the watches and the workers;
//! - [`publish`]: the published `JobSetEpoch` objects; [`fence`]: the leader's write deadline;
//! - [`crd`]: the start-up check that the installed JobSet CRD has the dialect's status fields;
//! - [`provision`]: the agent's ServiceAccount and RoleBinding in every namespace that needs them;
//! - [`metrics`]: the `jobset_inplace_reconciler_*` metrics.

pub mod controller;
pub mod crd;
pub mod fence;
pub mod flow_schema;
pub mod index;
pub mod key;
pub mod membership;
pub mod metrics;
pub mod nodes;
pub mod provision;
pub mod publish;
mod queue;

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::protocol::Dialect;
use crate::settings::Global;
use crate::telemetry;
use crate::wire::{epochs, jobset_crd};

pub use crate::deadline::DEFAULT_TIMEOUT as DEFAULT_GROUP_RESTART_TIMEOUT;
pub use controller::{Controller, DEFAULT_REQUEST_TIMEOUT, DEFAULT_WATCH_TIMEOUT, Settings};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the Kubernetes API: {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Metrics(#[from] crate::metrics_auth::StartError),
    #[error(transparent)]
    Crd(#[from] crd::CrdError),
    #[error("leader election on lease {namespace}/{name} failed: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    #[error("lost the leader lease {namespace}/{name}; exiting so that a fresh process takes over")]
    LostLease { namespace: String, name: String },
    #[error(
        "could not renew the leader lease {namespace}/{name} in time; stopped writing before \
         another replica could take it, and exiting so that a fresh process takes over"
    )]
    LeaseNotRenewed { namespace: String, name: String },
    #[error(transparent)]
    Health(#[from] telemetry::Error),
    #[error(
        "--lease-grace-seconds ({grace}) must be at least 1 and below --lease-duration-seconds \
         ({duration}): the holder renews that long before the lease expires"
    )]
    LeaseTiming { duration: u64, grace: u64 },
    #[error("the API server did not answer the read of the JobSet CRD within {0:?}")]
    CrdTimeout(Duration),
    #[error("--request-timeout must be above 0")]
    ZeroRequestTimeout,
    #[error("{0}")]
    NodeLost(String),
    #[error("cannot load a kubeconfig or the in-cluster config: {0}")]
    Config(#[source] kube::config::InferConfigError),
    #[error("cannot decide the epoch protocol dialect (--protocol auto): {0}")]
    Dialect(String),
}

/// The lease's duration and renewal grace, checked: `1 <= grace < duration` (the lease manager
/// cannot renew otherwise, and panics on it).
pub fn lease_timing(duration: u64, grace: u64) -> Result<(Duration, Duration), Error> {
    if grace == 0 || grace >= duration {
        return Err(Error::LeaseTiming { duration, grace });
    }
    Ok((Duration::from_secs(duration), Duration::from_secs(grace)))
}

/// Flags of `jobset-inplace reconciler`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Watch JobSets and pods of this namespace only (default: all namespaces).
    #[arg(long, env = "JOBSET_INPLACE_WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// Plain-HTTP address of /healthz, /readyz (and /metrics with --metrics-secure=false).
    #[arg(
        long,
        env = "JOBSET_INPLACE_HEALTH_ADDR",
        default_value = "0.0.0.0:8081"
    )]
    pub health_addr: SocketAddr,

    #[command(flatten)]
    pub metrics: crate::metrics_auth::MetricsArgs,

    /// Elect a leader among replicas on a Lease; only the leader writes.
    #[arg(long, env = "JOBSET_INPLACE_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Name of the leader Lease.
    #[arg(
        long,
        env = "JOBSET_INPLACE_LEASE_NAME",
        default_value = "jobset-inplace-reconciler"
    )]
    pub lease_name: String,

    /// Namespace of the leader Lease (default: $POD_NAMESPACE, else `default`).
    #[arg(long, env = "JOBSET_INPLACE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// Seconds a lease stays valid without renewal.
    #[arg(
        long,
        env = "JOBSET_INPLACE_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    pub lease_duration_seconds: u64,

    /// Seconds before expiry at which the holder renews.
    #[arg(long, env = "JOBSET_INPLACE_LEASE_GRACE_SECONDS", default_value_t = 5)]
    pub lease_grace_seconds: u64,

    /// Longest wait for one API request of the reconciler (a status write or read, an apply, an
    /// event, the CRD check): past it the request is abandoned and the JobSet retried.
    #[arg(long, env = "JOBSET_INPLACE_REQUEST_TIMEOUT", value_parser = crate::settings::parse_duration, default_value = "10s")]
    pub request_timeout: Duration,

    /// How long the API server keeps each watch open (a watch silent for this long plus 5 s is
    /// abandoned and resumed); also bounds every other request the client sends (lists, the
    /// leader lease's reads and writes) at this plus 15 s.
    #[arg(long, env = "JOBSET_INPLACE_WATCH_TIMEOUT", value_parser = crate::settings::parse_duration, default_value = "60s")]
    pub watch_timeout: Duration,

    /// Write the JobSet's two epoch fields and its `Failed` condition. `false` leaves them to
    /// JobSet's own controller (JobSet >= v0.11, `--protocol attempt`, which writes the same
    /// fields): the reconciler then observes them for its events and metrics, still provisions
    /// the agent's accounts, and still runs the group-restart deadline (which writes
    /// status.restarts for a recreation, and Failed when one would pass maxRestarts).
    #[arg(long, env = "JOBSET_INPLACE_WRITE_EPOCH_STATUS", default_value_t = true, action = clap::ArgAction::Set)]
    pub write_epoch_status: bool,

    /// How long a group restart may take before the pods that have not registered its epoch are
    /// deleted (so that their Jobs replace them), and as long again before every pod of the
    /// JobSet is recreated, counted against maxRestarts. Like 90s, 2m, 1h30m; 0 turns the
    /// deadline off. A JobSet's annotation jobset-inplace.dev/group-restart-timeout overrides it.
    #[arg(long, env = "JOBSET_INPLACE_GROUP_RESTART_TIMEOUT", value_parser = parse_group_restart_timeout, default_value = "2m")]
    pub group_restart_timeout: Duration,

    /// Which nodes are taken for lost, their InPlaceRestart JobSets' pods then marked Failed and
    /// deleted so that their Jobs replace them elsewhere: `fenced` (the default) only a node
    /// deleted or tainted node.kubernetes.io/out-of-service (never two workers of one index at
    /// once); `force-after-grace` also a node whose Ready condition stays Unknown for
    /// --node-lost-grace (a partitioned node's worker may run beside its replacement); `off`.
    #[arg(long, env = "JOBSET_INPLACE_NODE_LOST", value_enum)]
    pub node_lost: Option<nodes::NodeLostMode>,

    /// With --node-lost force-after-grace: how long a node's Ready condition may stay Unknown
    /// (default 30s). Like 10s, 1m. Given alone (as before --node-lost existed) it selects
    /// force-after-grace, and 0 alone turns the Node watch off.
    #[arg(long, env = "JOBSET_INPLACE_NODE_LOST_GRACE", value_parser = crate::settings::parse_duration)]
    pub node_lost_grace: Option<Duration>,

    /// Leader identity (default: $POD_NAME, else the hostname).
    #[arg(long, env = "JOBSET_INPLACE_IDENTITY")]
    pub identity: Option<String>,

    /// JobSets evaluated concurrently.
    #[arg(long, env = "JOBSET_INPLACE_WORKERS", default_value_t = 4)]
    pub workers: usize,

    /// Milliseconds a changed JobSet waits before it is evaluated, coalescing bursts of pod
    /// updates.
    #[arg(long, env = "JOBSET_INPLACE_DEBOUNCE_MS", default_value_t = 5)]
    pub debounce_ms: u64,

    /// Provision the agent's ServiceAccount and a RoleBinding of its ClusterRole in every
    /// namespace with an InPlaceRestart JobSet or labelled jobset-inplace.dev/enabled=true.
    #[arg(long, env = "JOBSET_INPLACE_PROVISION_SERVICE_ACCOUNTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub provision_service_accounts: bool,

    /// The agent's service account (the webhook injects the same name).
    #[arg(
        long,
        env = "JOBSET_INPLACE_AGENT_SERVICE_ACCOUNT",
        default_value = "jobset-inplace-agent"
    )]
    pub agent_service_account: String,

    /// The ClusterRole bound to the agent's service account in each namespace.
    #[arg(
        long,
        env = "JOBSET_INPLACE_AGENT_CLUSTER_ROLE",
        default_value = "jobset-inplace-agent"
    )]
    pub agent_cluster_role: String,

    /// The agents' FlowSchema (created by the chart without rules): its subjects kept to the
    /// agent's service account in every provisioned namespace. Empty: left alone.
    #[arg(long, env = "JOBSET_INPLACE_AGENT_FLOW_SCHEMA", default_value = "")]
    pub agent_flow_schema: String,

    /// Skip the start-up check of the JobSet CRD's status fields.
    #[arg(long, env = "JOBSET_INPLACE_SKIP_CRD_CHECK")]
    pub skip_crd_check: bool,
}

/// How the reconciler elects its leader.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub lease_name: String,
    pub lease_namespace: String,
    pub duration: Duration,
    pub grace: Duration,
}

/// Everything [`run`] needs, resolved from flags and env.
#[derive(Clone, Debug)]
pub struct Options {
    pub settings: Settings,
    pub leader_election: Option<LeaderElection>,
    pub check_crd: bool,
}

impl Args {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let identity = self
            .identity
            .clone()
            .or_else(|| env_nonempty("POD_NAME"))
            .unwrap_or_else(hostname);
        let lease_namespace = self
            .lease_namespace
            .clone()
            .or_else(|| env_nonempty("POD_NAMESPACE"))
            .unwrap_or_else(|| "default".to_owned());
        if self.request_timeout.is_zero() {
            return Err(Error::ZeroRequestTimeout);
        }
        let (lease_duration, lease_grace) =
            lease_timing(self.lease_duration_seconds, self.lease_grace_seconds)?;
        let node_lost = nodes::resolve_node_lost(self.node_lost, self.node_lost_grace)
            .map_err(Error::NodeLost)?;
        let options = Options {
            settings: Settings {
                // Replaced below by the flag's dialect or the cluster's ([`jobset_crd`]).
                dialect: global.dialect(),
                namespace: self.namespace.clone(),
                workers: self.workers.max(1),
                debounce: Duration::from_millis(self.debounce_ms),
                identity,
                provision: self
                    .provision_service_accounts
                    .then(|| provision::ProvisionSettings {
                        service_account: self.agent_service_account.clone(),
                        cluster_role: self.agent_cluster_role.clone(),
                        flow_schema: (!self.agent_flow_schema.trim().is_empty())
                            .then(|| self.agent_flow_schema.trim().to_owned()),
                        own_namespace: self
                            .lease_namespace
                            .clone()
                            .or_else(|| env_nonempty("POD_NAMESPACE"))
                            .unwrap_or_else(|| "jobset-inplace-system".to_owned()),
                    }),
                request_timeout: self.request_timeout,
                watch_timeout: self.watch_timeout,
                write_epoch_status: self.write_epoch_status,
                // Unless the JobSetEpoch CRD is missing (checked in `run`).
                publish_epochs: true,
                group_restart_timeout: (!self.group_restart_timeout.is_zero())
                    .then_some(self.group_restart_timeout),
                node_lost,
            },
            leader_election: self.leader_elect.then(|| LeaderElection {
                lease_name: self.lease_name.clone(),
                lease_namespace,
                duration: lease_duration,
                grace: lease_grace,
            }),
            check_crd: !self.skip_crd_check,
        };
        // No request of this client waits forever: watches are resumed after `watch_timeout`
        // plus a margin by the watcher; everything else (lists, the lease) gives up at
        // `watch_timeout` + 15 s, and the reconciler's own calls at `request_timeout`. kube's
        // retry layer is off, as in the agent (crate::retry): a throttled call reaches the
        // reconciler's own backoff at once (jittered `Retry-After`, per JobSet), and no sleep
        // inside a call is counted against `request_timeout`.
        let mut config = kube::Config::infer().await.map_err(Error::Config)?;
        config.connect_timeout = Some(self.request_timeout);
        config.read_timeout = Some(self.watch_timeout + Duration::from_secs(15));
        config.write_timeout = Some(self.request_timeout);
        // The read timeout counts from each request, not from when its pooled connection idled.
        config.reset_reader_on_write = true;
        let client = crate::retry::client_without_retries_with(
            config,
            &telemetry::api_client::ApiClientLayer,
        )
        .map_err(Error::Client)?;
        let choice = match global.protocol {
            Some(d) => jobset_crd::explicit(d, &format!("--protocol {d}")),
            None => jobset_crd::read(&client, self.request_timeout)
                .await
                .map_err(Error::Dialect)?,
        };
        tracing::info!(dialect = %choice.dialect, why = %choice.why, "epoch protocol dialect");
        let mut options = options;
        options.settings.dialect = choice.dialect;
        let listener = telemetry::bind(self.health_addr, "--health-addr").await?;
        // The reviews of scrapes go through a client of their own: the reconciler's has no
        // retries and its read timeout is the watch's.
        let secure_metrics = match self.metrics.metrics_secure {
            true => Some((
                self.metrics.metrics_addr,
                crate::metrics_auth::client().await.map_err(Error::Client)?,
            )),
            false => None,
        };
        run_with_metrics(
            client,
            options,
            Some(listener),
            secure_metrics,
            crate::shutdown::shutdown_signal(),
        )
        .await?;
        Ok(ExitCode::SUCCESS)
    }
}

/// `--group-restart-timeout`: [`crate::deadline::parse_timeout`], off as zero.
fn parse_group_restart_timeout(text: &str) -> Result<Duration, String> {
    crate::deadline::parse_timeout(text)
        .map(Option::unwrap_or_default)
        .map_err(|e| e.to_string())
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| env_nonempty("HOSTNAME"))
        .unwrap_or_else(|| "jobset-inplace-reconciler".to_owned())
}

/// Runs the reconciler until `shutdown` resolves (Ok) or the leader lease is lost (Err).
/// `health` is the listener of /healthz, /readyz and /metrics, if any.
pub async fn run(
    client: kube::Client,
    options: Options,
    health: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    run_with_metrics(client, options, health, None, shutdown).await
}

/// [`run`]; with `secure_metrics` (an address and the client of the reviews), `/metrics` is
/// served over HTTPS there behind the API server's authentication and authorization
/// (`crate::metrics_auth`), not on `health`.
pub async fn run_with_metrics(
    client: kube::Client,
    mut options: Options,
    health: Option<tokio::net::TcpListener>,
    secure_metrics: Option<(SocketAddr, kube::Client)>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let dialect: Dialect = options.settings.dialect;
    if options.check_crd {
        let after = options.settings.request_timeout;
        tokio::time::timeout(after, crd::check(&client, dialect))
            .await
            .map_err(|_| Error::CrdTimeout(after))??;
        if options.settings.publish_epochs {
            let served = tokio::time::timeout(after, crd::exists(&client, epochs::CRD_NAME))
                .await
                .map_err(|_| Error::CrdTimeout(after))??;
            if !served {
                tracing::warn!(
                    crd = epochs::CRD_NAME,
                    "the JobSetEpoch CRD is not installed: not publishing epochs; agents watch \
                     their JobSet instead, which costs the API server far more at scale"
                );
                options.settings.publish_epochs = false;
            }
        }
    }
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    let registry = Arc::new(registry);

    // Leadership: a Lease, or always the leader.
    let (leader_tx, leader_rx) = watch::channel(options.leader_election.is_none());
    let mut lease_task = None;
    if let Some(le) = &options.leader_election {
        lease_timing(le.duration.as_secs(), le.grace.as_secs())?;
        let lease_error = |source: kube_lease_manager::LeaseManagerError| Error::Lease {
            namespace: le.lease_namespace.clone(),
            name: le.lease_name.clone(),
            source,
        };
        let manager = LeaseManagerBuilder::new(client.clone(), &le.lease_name)
            .with_namespace(&le.lease_namespace)
            .with_parameters(LeaseParams::new(
                options.settings.identity.clone(),
                le.duration.as_secs(),
                le.grace.as_secs(),
            ))
            .build()
            .await
            .map_err(lease_error)?;
        let (rx, task) = manager.watch().await;
        // The fence reads the lease on its own, so that a leader whose renewals go unanswered
        // stops writing in time (see `fence`).
        let (fence_tx, fence_rx) = watch::channel(fence::Fence::Unknown);
        let fence_task = tokio::spawn(fence::watch(
            kube::Api::namespaced(client.clone(), &le.lease_namespace),
            le.lease_name.clone(),
            options.settings.identity.clone(),
            le.duration,
            le.grace,
            options.settings.request_timeout,
            fence_tx,
        ));
        lease_task = Some((rx, task, fence_rx, fence_task));
    }

    // Until when a write may be in flight: none yet under leader election, no limit without.
    let (write_until_tx, write_until_rx) = watch::channel(
        options
            .leader_election
            .is_some()
            .then(std::time::Instant::now),
    );
    let controller = Controller::start_fenced(
        client,
        options.settings.clone(),
        metrics,
        leader_rx,
        write_until_rx,
    );
    let ready_probe = controller.readiness();
    let secure_metrics = match secure_metrics {
        Some((addr, reviews)) => {
            let registry = registry.clone();
            Some(
                crate::metrics_auth::start(
                    addr,
                    reviews,
                    Arc::new(move || telemetry::encode(&registry)),
                )
                .await?,
            )
        }
        None => None,
    };
    let (health_stop_tx, health_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let plain_metrics = secure_metrics.is_none();
    let health_task = health.map(|listener| {
        let registry = registry.clone();
        tokio::spawn(telemetry::serve_health(
            listener,
            if plain_metrics {
                telemetry::Health::new(ready_probe, move || telemetry::encode(&registry))
            } else {
                telemetry::Health::without_metrics(ready_probe)
            },
            async {
                let _ = health_stop_rx.await;
            },
        ))
    });

    let outcome = match lease_task {
        None => {
            shutdown.await;
            Ok(())
        }
        Some((rx, task, fence_rx, fence_task)) => {
            let le = options.leader_election.as_ref();
            let (namespace, name) = (
                le.map(|l| l.lease_namespace.clone()).unwrap_or_default(),
                le.map(|l| l.lease_name.clone()).unwrap_or_default(),
            );
            let lost = || Error::LostLease {
                namespace: namespace.clone(),
                name: name.clone(),
            };
            let (margin, _) = fence::timing(le.map(|l| l.grace).unwrap_or_default());
            let valid = le
                .map(|l| l.duration)
                .unwrap_or_default()
                .saturating_sub(margin);
            let end = fence::follow(
                rx,
                fence_rx,
                shutdown,
                valid,
                (&leader_tx, &write_until_tx),
                &name,
                &options.settings.identity,
            )
            .await;
            let outcome = match end {
                fence::LeaseEnd::Shutdown => Ok(()),
                fence::LeaseEnd::Lost => Err(lost()),
                fence::LeaseEnd::NotRenewed => Err(Error::LeaseNotRenewed {
                    namespace: namespace.clone(),
                    name: name.clone(),
                }),
            };
            // Stop writing first (nothing more is sent), then let the lease manager release the
            // lease.
            let _ = write_until_tx.send(Some(std::time::Instant::now()));
            let _ = leader_tx.send(false);
            fence_task.abort();
            match tokio::time::timeout(Duration::from_secs(5), task).await {
                Ok(Ok(Ok(manager))) => {
                    if outcome.is_ok() {
                        let _ = manager.release().await;
                    }
                }
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "lease manager ended with an error"),
                Ok(Err(e)) => tracing::warn!(error = %e, "lease manager task failed"),
                Err(_) => tracing::warn!("lease manager did not stop in time"),
            }
            outcome
        }
    };
    controller.shutdown().await;
    let _ = health_stop_tx.send(());
    if let Some(task) = health_task {
        let _ = task.await;
    }
    if let Some(running) = secure_metrics {
        running.stop().await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_grace_must_be_below_the_duration() {
        assert!(lease_timing(15, 5).is_ok());
        assert!(lease_timing(2, 1).is_ok());
        for (duration, grace) in [(5, 5), (5, 6), (0, 0), (15, 0), (1, 1)] {
            let err = lease_timing(duration, grace).expect_err("refused");
            assert!(err.to_string().contains("--lease-grace-seconds"), "{err}");
        }
    }
}
