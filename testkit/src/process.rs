//! The real `jobset-inplace reconciler` as a child process pointed at a [`TestApiServer`]
//! through a kubeconfig, as deployed, and what benches read of a process from `/proc`: its CPU
//! time and its peak memory.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use jobset_inplace::protocol::Dialect;

use crate::apiserver::TestApiServer;

/// A running reconciler process; killed when dropped.
pub struct ReconcilerProcess {
    child: Child,
    /// Its plain-HTTP health and metrics address.
    pub health: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl ReconcilerProcess {
    /// Starts `binary reconciler` against `server` (no leader election, no CRD check, logs at
    /// `warn`), with `extra` reconciler flags.
    pub fn spawn(
        binary: &Path,
        server: &TestApiServer,
        dialect: Dialect,
        extra: &[&str],
    ) -> std::io::Result<ReconcilerProcess> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let mut f = std::fs::File::create(&kubeconfig)?;
        write!(
            f,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n\
             users:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             current-context: test\n",
            server.url()
        )?;
        let health = std::net::TcpListener::bind("127.0.0.1:0")?;
        let health_addr = health.local_addr()?;
        drop(health);
        let child = Command::new(binary)
            .args(["--protocol", dialect.as_str(), "--log-level", "warn"])
            .arg("reconciler")
            .args([
                "--leader-elect",
                "false",
                "--skip-crd-check",
                // /metrics on the health port, as the tests read it.
                "--metrics-secure=false",
                "--health-addr",
            ])
            .arg(health_addr.to_string())
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .spawn()?;
        Ok(ReconcilerProcess {
            child,
            health: health_addr,
            _dir: dir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its CPU time so far ([`cpu_ticks`]).
    pub fn cpu_ticks(&self) -> Option<u64> {
        cpu_ticks(self.pid())
    }

    /// Its peak resident memory (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        proc_status_kib(self.pid(), "VmHWM")
    }
}

impl Drop for ReconcilerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// utime + stime of a process, in clock ticks (100 Hz on Linux).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`).
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Runs a command to its end under a time limit (killed past it); stdout on success, a one-line
/// reason with stderr otherwise. For tests that run kubectl, helm and scripts.
pub fn run_bounded(cmd: &mut Command, limit: std::time::Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut stderr = child.stderr.take().ok_or("no stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{cmd:?} did not finish within {limit:?}"));
            }
            Err(e) => return Err(format!("{cmd:?}: {e}")),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{cmd:?} failed ({status}): {err}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(proc_status_kib(me, "VmHWM").is_some_and(|k| k > 0));
        assert_eq!(proc_status_kib(me, "NoSuchField"), None);
    }
}
