//! Orphan reaping in main-container mode. There the agent is usually PID 1 of its container, and
//! whatever the worker leaves behind (a daemonised helper, a grandchild whose parent exited)
//! becomes the agent's child; unreaped, each stays a zombie until the pod restarts. The agent
//! therefore makes itself a child subreaper (so it adopts them even when it is not PID 1) and
//! reaps every exited child except the worker, whose exit status tokio collects.
//!
//! Finding the zombies reads `/proc/<pid>/stat` ([`parse_stat`] is pure); reaping is
//! `waitpid(pid, WNOHANG)` on each, never `waitpid(-1)`, which could take the worker's status.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// How often the reaper looks without a SIGCHLD (signals coalesce; one may be missed).
const SWEEP: Duration = Duration::from_secs(5);

/// `(pid, state, ppid)` from the text of `/proc/<pid>/stat`. The command name between the
/// parentheses may hold anything, spaces and parentheses included: the fields after the last
/// `)` are read.
pub fn parse_stat(text: &str) -> Option<(u32, char, u32)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text.get(..open)?.trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((pid, state, ppid))
}

/// The zombie children of `parent`, as `/proc` under `proc_root` shows them.
pub fn zombie_children(proc_root: &Path, parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|text| parse_stat(&text))
        .filter(|&(_, state, ppid)| state == 'Z' && ppid == parent)
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Reaps every zombie child but `keep`; returns how many it reaped.
pub fn reap_once(keep: u32) -> usize {
    reap(
        zombie_children(Path::new("/proc"), std::process::id()),
        keep,
    )
}

/// Waits for each of `pids` but `keep`, without blocking.
fn reap(pids: Vec<u32>, keep: u32) -> usize {
    pids.into_iter()
        .filter(|&pid| pid != keep)
        .filter_map(|pid| i32::try_from(pid).ok())
        .filter(|&pid| waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)).is_ok())
        .count()
}

/// The pid of the running worker (0: none), which the reaper leaves alone.
#[derive(Clone, Debug, Default)]
pub struct WorkerPid(Arc<AtomicU32>);

/// [`WorkerPid`] while a worker is being spawned: its pid is not known yet, so nothing is reaped.
const SPAWNING: u32 = u32::MAX;

impl WorkerPid {
    /// Call before spawning the worker (on a multi-threaded runtime the reaper could otherwise
    /// take a worker that exits at once before its pid is recorded).
    pub fn spawning(&self) {
        self.0.store(SPAWNING, Ordering::SeqCst);
    }

    pub fn set(&self, pid: Option<u32>) {
        self.0.store(pid.unwrap_or(0), Ordering::SeqCst);
    }

    fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Becomes a child subreaper, then reaps on every SIGCHLD and every few seconds, forever (the
/// task is dropped with the agent). Failing to subscribe to SIGCHLD only leaves the sweep.
pub async fn run(worker: WorkerPid) {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "cannot become a child subreaper; orphans go to PID 1");
    }
    let mut sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGCHLD subscription; sweeping every {SWEEP:?}");
            None
        }
    };
    let mut sweep = tokio::time::interval(SWEEP);
    loop {
        match &mut sigchld {
            Some(s) => {
                tokio::select! {
                    _ = s.recv() => {}
                    _ = sweep.tick() => {}
                }
            }
            None => {
                sweep.tick().await;
            }
        }
        let keep = worker.get();
        if keep == SPAWNING {
            continue;
        }
        let reaped = reap_once(keep);
        if reaped > 0 {
            tracing::debug!(reaped, "reaped orphaned processes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        assert_eq!(parse_stat("42 (sh) Z 1 42 42 0"), Some((42, 'Z', 1)));
        assert_eq!(
            parse_stat("7 (a (weird) name) S 3 7 7 0"),
            Some((7, 'S', 3))
        );
        assert_eq!(parse_stat("7 (x) R"), None);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("x (y) Z 1"), None);
    }

    #[test]
    fn finds_and_reaps_only_zombies_of_this_process() {
        let root = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        for (pid, stat) in [
            ("10", format!("10 (a) Z {me} 1 1")),
            ("11", format!("11 (b) S {me} 1 1")),
            ("12", "12 (c) Z 999999 1 1".to_owned()),
            ("self", format!("13 (d) Z {me} 1 1")),
        ] {
            let dir = root.path().join(pid);
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::write(dir.join("stat"), stat).expect("stat");
        }
        assert_eq!(zombie_children(root.path(), me), vec![10]);
        assert!(zombie_children(&root.path().join("absent"), me).is_empty());

        // A real zombie: a child that exited and was not waited for.
        let child = std::process::Command::new("true").spawn().expect("spawns");
        let pid = child.id();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !zombie_children(Path::new("/proc"), me).contains(&pid) {
            assert!(std::time::Instant::now() < deadline, "no zombie appeared");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Kept while it is the worker; reaped once it is not. (Only this pid: other tests of
        // this process have children of their own.)
        assert_eq!(reap(vec![pid], pid), 0);
        assert!(zombie_children(Path::new("/proc"), me).contains(&pid));
        assert_eq!(reap(vec![pid], 0), 1);
        assert!(!zombie_children(Path::new("/proc"), me).contains(&pid));
        drop(child);
    }
}
