//! The `agent` subcommand (docs/protocol.md; docs/architecture.md, "Agent"): the process in every worker pod. It registers the
//! pod's epoch, holds the start barrier until the JobSet's synced epoch reaches it, and exits
//! with the restart code when its epoch is deprecated, so that the pod restarts in place.
//!
//! - [`config`]: parsing its environment (pure; the names and defaults are
//!   [`crate::wire::agent_env`], shared with the webhook);
//! - [`barrier`]: the barrier endpoint (the startup probe);
//! - [`run`]: the protocol's I/O.
//!
//! It runs again on every in-place restart, on thousands of nodes at once, so start-up is kept
//! short: a current-thread runtime, the barrier bound before any API call, the pod and the
//! JobSet read concurrently, one watch.

pub mod barrier;
pub mod client;
pub mod config;
pub mod run;

use std::process::ExitCode;
use std::task::Poll;

use futures::Stream;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::settings::Global;
use crate::wire::agent_env;

pub use barrier::BarrierState;
pub use config::AgentConfig;
pub use run::{AgentExit, Signal, run_agent};

/// Exit code of a fatal configuration error (a missing or malformed variable, a barrier port
/// that cannot be bound, no Kubernetes client config). It is neither 0 (which would restart the
/// agent alone) nor, by default, the restart code (so it is not mistaken for a restart request
/// in logs; the pod's restart rule still restarts the pod on it).
pub const FATAL_EXIT_CODE: u8 = 2;

/// Errors that stop the agent before it starts; each names the variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{name} is not set")]
    Missing { name: &'static str },
    #[error("{name}={value:?} is invalid: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("NAMESPACE is not set and {path} cannot be read: {source}")]
    Namespace {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("NAMESPACE is not set and {path} cannot be read: the file is empty")]
    EmptyNamespace { path: &'static str },
    #[error(
        "{name} is set: main-container mode (the agent running the worker) is not offered, the \
         kubelet backs off a container restarted in place (CrashLoopBackOff) past the \
         group-restart deadline; run the worker as its own container beside the agent sidecar \
         the webhook injects (docs/protocol.md)"
    )]
    MainContainerMode { name: &'static str },
    #[error("cannot listen on the barrier port {port} (BARRIER_PORT): {source}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot configure the kubernetes client (in-cluster config, or AGENT_API_URL): {0}")]
    Client(#[source] kube::Error),
    #[error("cannot configure the kubernetes client (in-cluster config, or AGENT_API_URL): {0}")]
    ApiUrl(#[source] hyper::http::uri::InvalidUri),
    #[error("cannot listen for SIGTERM and SIGINT: {0}")]
    Signals(#[source] std::io::Error),
}

/// Runs the agent inside a worker pod, configured from its environment:
///
/// required: POD_NAME, JOBSET_NAME (downward API); NAMESPACE (else the service account's
/// namespace file).
///
/// optional: RESTART_POD_IN_PLACE_EXIT_CODE (alias IN_PLACE_RESTART_EXIT_CODE; 1-255, default
/// 42), JOBSET_INPLACE_PROTOCOL (epoch|attempt), BARRIER_PORT (alias STARTUP_PROBE_PORT; default
/// 8080), BARRIER_PATH (alias STARTUP_PROBE_PATH; default /barrier-is-lifted), BARRIER_HOLD
/// (default 0s: barrier requests answered at once),
/// AGENT_API_TIMEOUT (per GET/PATCH and watch opening, default 10s), AGENT_WATCH_IDLE_TIMEOUT (a
/// JobSet watch silent this long is resumed, default 90s), AGENT_API_URL (API server URL instead
/// of the in-cluster config; for simulators and local runs).
///
/// Exit codes: the restart code when the pod's epoch is deprecated; 128+N on signal N; 2 on a
/// configuration error (WORKER_COMMAND set among them: main-container mode is not offered).
/// Never 0.
#[derive(Clone, Debug, clap::Args)]
#[command(after_help = ENV_HELP)]
pub struct Args {}

/// The environment of `jobset-inplace agent`, shown by `--help`.
const ENV_HELP: &str = "\
Environment (set by the webhook's injection; empty counts as unset):
  POD_NAME, JOBSET_NAME          required (downward API)
  NAMESPACE                      else the service account's namespace file
  RESTART_POD_IN_PLACE_EXIT_CODE exit code asking for an in-place restart, 1-255 (default 42;
                                 alias IN_PLACE_RESTART_EXIT_CODE)
  JOBSET_INPLACE_PROTOCOL        epoch | attempt (the --protocol flag)
  BARRIER_PORT, BARRIER_PATH     the barrier endpoint (default 8080, /barrier-is-lifted;
                                 aliases STARTUP_PROBE_PORT, STARTUP_PROBE_PATH)
  BARRIER_HOLD                   how long a barrier request is held while the barrier is up,
                                 answered when it lifts (0s: at once; at most 1h; shorter than
                                 the startup probe's timeoutSeconds)
  WORKER_COMMAND                 must not be set: main-container mode is not offered (exit 2)
  AGENT_API_TIMEOUT              timeout of each GET and PATCH, and of opening the watch (10s)
  AGENT_WATCH_IDLE_TIMEOUT       a JobSet watch with no event or bookmark this long is dead:
                                 abandoned and resumed (90s)
  AGENT_API_URL                  API server URL instead of the in-cluster config (simulators)

Exit codes: the restart code when the pod's epoch is deprecated; 128+N on signal N; 2 on a
configuration error. Never 0.";

impl Args {
    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let config = match config::from_env(
            |name| std::env::var(name).ok(),
            || std::fs::read_to_string(agent_env::SERVICE_ACCOUNT_NAMESPACE_FILE),
            global.dialect(),
        ) {
            Ok(config) => config,
            Err(e) => return Ok(fatal(&e)),
        };
        match start(config).await {
            Ok(code) => Ok(code),
            Err(e) => Ok(fatal(&e)),
        }
    }
}

fn fatal(e: &Error) -> ExitCode {
    eprintln!("jobset-inplace agent: {e}");
    ExitCode::from(FATAL_EXIT_CODE)
}

async fn start(config: AgentConfig) -> Result<ExitCode, Error> {
    let signals = unix_signals()?;
    let (barrier_tx, barrier_rx) = watch::channel(BarrierState::default());
    // The barrier answers (503) from the first moment, before any API call.
    let (port, path) = config.barrier();
    let listener = bind_barrier(port).await?;
    tokio::spawn(barrier::serve(
        listener,
        path.to_owned(),
        barrier_rx,
        config.barrier_hold,
    ));
    let client = client(&config).await?;
    let restart_exit_code = config.restart_exit_code;
    let outcome = run_agent(client, config, barrier_tx, signals).await;
    Ok(ExitCode::from(outcome.exit_code(restart_exit_code)))
}

/// Binds the barrier port on every address (IPv6 and IPv4 where the host has both).
pub async fn bind_barrier(port: u16) -> Result<TcpListener, Error> {
    match TcpListener::bind(("::", port)).await {
        Ok(l) => Ok(l),
        Err(_) => TcpListener::bind(("0.0.0.0", port))
            .await
            .map_err(|source| Error::Bind { port, source }),
    }
}

/// The Kubernetes client: `AGENT_API_URL` when set, else the in-cluster config (or a
/// kubeconfig, as `kube::Config::infer` finds), over one HTTP/2 connection where the server is
/// `https://` ([`client::agent_client`]). kube's retry layer is off: the agent owns its
/// retries, waiting a `Retry-After` stretched at random ([`crate::retry::client_without_retries`]).
pub async fn client(config: &AgentConfig) -> Result<kube::Client, Error> {
    let c = match &config.api_url {
        Some(url) => {
            let uri: hyper::Uri = url.parse().map_err(Error::ApiUrl)?;
            let plain = uri.scheme_str() == Some("http");
            let mut c = kube::Config::new(uri);
            c.default_namespace = config.namespace.clone();
            if plain {
                // No TLS over http://: skip loading the platform's roots.
                c.root_cert = Some(Vec::new());
            }
            c
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?,
    };
    client::agent_client(c).map_err(Error::Client)
}

/// SIGTERM and SIGINT as a stream.
fn unix_signals() -> Result<impl Stream<Item = Signal> + Unpin, Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    Ok(futures::stream::poll_fn(move |cx| {
        if let Poll::Ready(Some(())) = term.poll_recv(cx) {
            return Poll::Ready(Some(Signal::Term));
        }
        if let Poll::Ready(Some(())) = int.poll_recv(cx) {
            return Poll::Ready(Some(Signal::Int));
        }
        Poll::Pending
    }))
}
