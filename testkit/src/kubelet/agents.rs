//! One run of an agent container: the real `jobset-inplace agent` binary as a child process, or
//! (for large simulations) [`jobset_inplace::agent::run_agent`] as a task of this process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use jobset_inplace::agent::{self, BarrierState, Signal};
use jobset_inplace::protocol::Dialect;
use jobset_inplace::wire::agent_env;

/// A running (or ended) agent container.
pub(crate) struct AgentRun {
    kind: Kind,
    exited: Option<i32>,
}

enum Kind {
    Process {
        child: tokio::process::Child,
        pid: Option<u32>,
        barrier: Option<SocketAddr>,
    },
    InProcess {
        task: JoinHandle<agent::AgentExit>,
        signals: mpsc::UnboundedSender<Signal>,
        barrier: watch::Receiver<BarrierState>,
        restart_exit_code: u8,
    },
}

/// Where agent output goes.
pub(crate) type LogSink = std::sync::Arc<dyn Fn(String) + Send + Sync>;

impl AgentRun {
    /// Starts `binary agent` with exactly `env` (plus `PATH`), its stdout and stderr read line by
    /// line into `log`.
    pub(crate) fn spawn_process(
        binary: &Path,
        env: &[(String, String)],
        barrier: Option<SocketAddr>,
        log: LogSink,
        prefix: String,
    ) -> std::io::Result<AgentRun> {
        let mut cmd = tokio::process::Command::new(binary);
        cmd.arg("agent")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id();
        if let Some(out) = child.stdout.take() {
            let log = log.clone();
            let prefix = prefix.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log(format!("{prefix} {line}"));
                }
            });
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log(format!("{prefix} {line}"));
                }
            });
        }
        Ok(AgentRun {
            kind: Kind::Process {
                child,
                pid,
                barrier,
            },
            exited: None,
        })
    }

    /// Starts the agent as a task of this process, configured from `env` exactly as the binary
    /// would be (the same parser), on a shared client.
    pub(crate) fn spawn_in_process(
        client: kube::Client,
        env: &[(String, String)],
        dialect: Dialect,
    ) -> Result<AgentRun, agent::Error> {
        let env: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let dialect = env
            .get(agent_env::PROTOCOL)
            .and_then(|p| p.parse().ok())
            .unwrap_or(dialect);
        let config = agent::config::from_env(
            |name| env.get(name).map(|v| (*v).to_owned()),
            || {
                Err(std::io::Error::other(
                    "no service account namespace file here",
                ))
            },
            dialect,
        )?;
        let restart_exit_code = config.restart_exit_code;
        let (barrier_tx, barrier) = watch::channel(BarrierState::default());
        let (signals, mut signals_rx) = mpsc::unbounded_channel();
        let stream = futures::stream::poll_fn(move |cx| signals_rx.poll_recv(cx));
        let task = tokio::spawn(agent::run_agent(client, config, barrier_tx, stream));
        Ok(AgentRun {
            kind: Kind::InProcess {
                task,
                signals,
                barrier,
                restart_exit_code,
            },
            exited: None,
        })
    }

    /// Waits for the container to end; its exit code (`128 + N` when killed by signal N).
    /// Cancel-safe, and callable again after it returned.
    pub(crate) async fn wait(&mut self) -> i32 {
        if let Some(code) = self.exited {
            return code;
        }
        let code = match &mut self.kind {
            Kind::Process { child, .. } => match child.wait().await {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    status
                        .code()
                        .or_else(|| status.signal().map(|s| 128 + s))
                        .unwrap_or(255)
                }
                Err(_) => 255,
            },
            Kind::InProcess {
                task,
                restart_exit_code,
                ..
            } => match task.await {
                Ok(outcome) => i32::from(outcome.exit_code(*restart_exit_code)),
                Err(_) => 137,
            },
        };
        self.exited = Some(code);
        code
    }

    /// SIGKILL (an aborted task for in-process agents).
    pub(crate) fn kill(&mut self) {
        match &mut self.kind {
            Kind::Process { child, .. } => {
                let _ = child.start_kill();
            }
            Kind::InProcess { task, .. } => task.abort(),
        }
    }

    /// SIGTERM.
    pub(crate) fn terminate(&self) {
        match &self.kind {
            Kind::Process { pid, .. } => {
                if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
            }
            Kind::InProcess { signals, .. } => {
                let _ = signals.send(Signal::Term);
            }
        }
    }

    /// Stops the container as the kubelet does: SIGTERM, then SIGKILL after `grace`.
    pub(crate) async fn stop(&mut self, grace: Duration) -> i32 {
        if let Some(code) = self.exited {
            return code;
        }
        self.terminate();
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(code) => code,
            Err(_) => {
                self.kill();
                self.wait().await
            }
        }
    }

    /// The startup probe: `GET path` on the agent's barrier port answers 200 within `timeout`
    /// (the probe's `timeoutSeconds`; for in-process agents, the barrier state says lifted). The
    /// future owns what it needs, so that the pod's loop runs it beside its other branches, as
    /// the kubelet's prober runs each probe in a worker of its own (`prober/worker.go`): an agent
    /// that holds the request until its barrier lifts blocks nothing else.
    pub(crate) fn probe(
        &self,
        path: &str,
        timeout: Duration,
    ) -> futures::future::BoxFuture<'static, bool> {
        use futures::FutureExt;
        match &self.kind {
            Kind::Process {
                barrier: Some(addr),
                ..
            } => {
                let (addr, path) = (*addr, path.to_owned());
                async move { matches!(http_get(addr, &path, timeout).await, Some((200, _))) }
                    .boxed()
            }
            Kind::Process { barrier: None, .. } => futures::future::ready(false).boxed(),
            Kind::InProcess { barrier, .. } => {
                futures::future::ready(barrier.borrow().lifted).boxed()
            }
        }
    }
}

/// The probe in flight, if any (pending forever without one: the caller's `select!` guards it).
pub(crate) async fn in_flight(
    probe: &mut Option<futures::future::BoxFuture<'static, bool>>,
) -> bool {
    match probe.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// A plain `GET` over HTTP/1.1 with `Connection: close`: the status code and body, or `None`
/// when nothing answered within `timeout`.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        let status = text.split_whitespace().nth(1)?.parse::<u16>().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// A loopback port for a simulated pod's barrier, outside the kernel's ephemeral range (so no
/// outgoing connection takes it between this check and the agent's bind), free right now.
pub fn barrier_port() -> Option<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // 20000-31999: below Linux's default ephemeral range (32768-60999).
    let base = 20_000 + std::process::id() % 1_000 * 10;
    for _ in 0..2_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(base + n % 2_000).ok()?;
        let v4 = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        // A host without IPv6 cannot bind `::` at all; only "in use" counts against the port.
        let v6 = match std::net::TcpListener::bind(("::", port)) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::AddrInUse,
        };
        if v4 && v6 {
            return Some(port);
        }
    }
    None
}
