//! What the controller is told ([`Settings`]) and the watches' configuration drawn from it
//! (kube-runtime's `watcher::Config`, with the API server's watch timeout as configured).

use std::time::Duration;

use kube::runtime::watcher;

use crate::protocol::Dialect;
use crate::reconciler::nodes::NodeLost;
use crate::reconciler::provision::ProvisionSettings;

/// What the controller needs to know.
#[derive(Clone, Debug)]
pub struct Settings {
    pub dialect: Dialect,
    /// Watch one namespace; all when `None`.
    pub namespace: Option<String>,
    pub workers: usize,
    /// How long a JobSet waits in the queue before it is evaluated, so that a burst of pod
    /// updates coalesces into one evaluation.
    pub debounce: Duration,
    /// This replica's name, as the reporting instance of its events.
    pub identity: String,
    /// Provision the agent's service account and RoleBinding per namespace; off when `None`.
    pub provision: Option<ProvisionSettings>,
    /// Longest wait for one API request (a status write, a read, an apply, an event): a
    /// connection that goes silent costs a worker this long, then the JobSet is retried.
    pub request_timeout: Duration,
    /// How long the API server keeps each watch open; a watch that delivers nothing (no event,
    /// no bookmark) for this long plus a few seconds is abandoned and resumed.
    pub watch_timeout: Duration,
    /// Write the two epoch fields and the `Failed` condition (`true`), or leave them to JobSet's
    /// own controller (`false`, for JobSet >= v0.11 in the `attempt` dialect, which writes the
    /// same fields: two writers must never disagree) and only observe them: events, metrics,
    /// provisioning and the group-restart deadline go on (the deadline still writes
    /// `status.restarts` for a recreation, and `Failed` when one would pass `maxRestarts`).
    pub write_epoch_status: bool,
    /// Publish each InPlaceRestart JobSet's epochs in its `JobSetEpoch` object, which its agents
    /// watch ([`crate::wire::epochs`]); off where the kind is not served (agents then watch the
    /// JobSet).
    pub publish_epochs: bool,
    /// The group-restart deadline's timeout ([`crate::deadline`]), unless a JobSet's annotation
    /// says otherwise; `None`: off. It applies in both modes of `write_epoch_status`.
    pub group_restart_timeout: Option<Duration>,
    /// Which nodes are taken for lost, their pods of InPlaceRestart JobSets then failed and
    /// deleted ([`crate::reconciler::nodes`]); `Off`: Nodes are not watched.
    pub node_lost: NodeLost,
}

/// [`Settings::request_timeout`] unless configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// [`Settings::watch_timeout`] unless configured: the API server sends a bookmark about once a
/// minute, so a healthy watch is never idle this long.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// A watcher's configuration with the server-side timeout of `settings` (at least 1 s): kube's
/// watcher abandons a watch idle for that long plus a margin, and resumes it.
pub(super) fn watch_config(settings: &Settings) -> watcher::Config {
    let secs = u32::try_from(settings.watch_timeout.as_secs()).unwrap_or(u32::MAX);
    watcher::Config::default()
        .timeout(secs.max(1))
        .any_semantic()
}
