//! The agent's contract with its pod: the environment variables it reads, the names of the
//! released JobSet agent it also accepts, and its built-in defaults. The webhook injects these
//! and validates them; the agent parses them. One list, so the two never drift apart.

/// Name of the injected agent container.
pub const CONTAINER_NAME: &str = "jobset-inplace-agent";

/// Namespace of the pod (downward API); the agent falls back to the service account's
/// namespace file.
pub const NAMESPACE: &str = "NAMESPACE";
/// Name of the pod (downward API).
pub const POD_NAME: &str = "POD_NAME";
/// Name of the pod's JobSet (downward API from the pod annotation set by the JobSet controller).
pub const JOBSET_NAME: &str = "JOBSET_NAME";
/// Exit code with which the agent asks for an in-place restart of its pod.
pub const RESTART_EXIT_CODE: &str = "RESTART_POD_IN_PLACE_EXIT_CODE";
/// The released JobSet agent's name for [`RESTART_EXIT_CODE`].
pub const RESTART_EXIT_CODE_ALIAS: &str = "IN_PLACE_RESTART_EXIT_CODE";
/// The protocol dialect (`epoch` or `attempt`), as the global `--protocol` flag's env.
pub const PROTOCOL: &str = "JOBSET_INPLACE_PROTOCOL";
/// Port of the barrier endpoint (the startup probe).
pub const BARRIER_PORT: &str = "BARRIER_PORT";
/// The released JobSet agent's name for [`BARRIER_PORT`].
pub const BARRIER_PORT_ALIAS: &str = "STARTUP_PROBE_PORT";
/// Path of the barrier endpoint.
pub const BARRIER_PATH: &str = "BARRIER_PATH";
/// The released JobSet agent's name for [`BARRIER_PATH`].
pub const BARRIER_PATH_ALIAS: &str = "STARTUP_PROBE_PATH";
/// Optional: how long the barrier holds a probe's request while it is up, answering as soon as
/// it lifts (a duration: `290s`; `0s`, the default, answers at once). Shorter than the startup
/// probe's `timeoutSeconds`: the webhook derives it from them ([`barrier_hold_for_probe_timeout`]).
pub const BARRIER_HOLD: &str = "BARRIER_HOLD";
/// The longest [`BARRIER_HOLD`] the agent accepts.
pub const MAX_BARRIER_HOLD: std::time::Duration = std::time::Duration::from_secs(3600);

/// The barrier hold that fits a startup probe's `timeoutSeconds`: the probe's timeout less a
/// thirtieth of it (at least a second), so that the answer reaches the kubelet before it gives
/// up on the request; none (zero) for a timeout under 2 s, the API's default of 1 s among them.
pub fn barrier_hold_for_probe_timeout(timeout_seconds: i64) -> std::time::Duration {
    if timeout_seconds < 2 {
        return std::time::Duration::ZERO;
    }
    let margin = (timeout_seconds / 30).max(1);
    let hold = u64::try_from(timeout_seconds - margin).unwrap_or(0);
    std::time::Duration::from_secs(hold).min(MAX_BARRIER_HOLD)
}

/// Main-container mode's worker command (the agent running the worker as its child), which is
/// not offered: the webhook denies a container with it and the agent refuses to start.
pub const WORKER_COMMAND: &str = "WORKER_COMMAND";

/// Built-in barrier port.
pub const DEFAULT_BARRIER_PORT: u16 = 8080;
/// Built-in barrier path.
pub const DEFAULT_BARRIER_PATH: &str = "/barrier-is-lifted";
/// Built-in restart exit code.
pub const DEFAULT_RESTART_EXIT_CODE: u8 = 42;

/// Where the agent reads its namespace when `NAMESPACE` is not set.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Optional: timeout of each GET and PATCH the agent sends (a duration: `10s`, `500ms`).
pub const API_TIMEOUT: &str = "AGENT_API_TIMEOUT";
/// Optional: the API server URL (`http://127.0.0.1:PORT`), instead of the in-cluster config or
/// kubeconfig. Meant for the simulator and local runs, never needed in a cluster.
pub const API_URL: &str = "AGENT_API_URL";

/// Optional: how long the JobSet watch may deliver nothing (no event, no bookmark) before it
/// is abandoned and resumed (a duration: `90s`).
pub const WATCH_IDLE_TIMEOUT: &str = "AGENT_WATCH_IDLE_TIMEOUT";
/// Built-in watch idle timeout: the API server sends a bookmark about once a minute on a
/// healthy watch, so one that stays silent this long is dead.
pub const DEFAULT_WATCH_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// Built-in per-request API timeout.
pub const DEFAULT_API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_hold_fits_inside_the_probe_timeout() {
        for (timeout, hold) in [
            (-1, 0),
            (0, 0),
            (1, 0),
            (2, 1),
            (30, 29),
            (60, 58),
            (300, 290),
            (3601, 3481),
            (100_000, 3600),
        ] {
            assert_eq!(
                barrier_hold_for_probe_timeout(timeout),
                Duration::from_secs(hold),
                "timeoutSeconds {timeout}"
            );
        }
    }
}
