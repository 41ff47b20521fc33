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
/// Set in main-container mode: the worker command the agent runs as its child.
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
