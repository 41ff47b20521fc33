//! The process's one tracing subscriber. Every test of this binary shares one process, and a
//! process has one global subscriber: this one, installed by the first test that asks. It keeps
//! the WARN lines of everything that runs in memory (tests count the lines of their own
//! namespace); with `JOBSET_INPLACE_CHAOS_LOGS` set it also prints `jobset_inplace`'s INFO lines
//! (`system::chaos`).

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, fmt};

/// Installs the subscriber (once) and returns the WARN lines captured so far.
pub fn captured() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        let capture = fmt::layer()
            .with_ansi(false)
            .with_writer(move || Capture(logs))
            .with_filter(LevelFilter::WARN);
        let print = std::env::var_os("JOBSET_INPLACE_CHAOS_LOGS").map(|_| {
            fmt::layer()
                .with_timer(fmt::time::uptime())
                .with_ansi(false)
                .with_filter(EnvFilter::new("jobset_inplace=info"))
        });
        let subscriber = tracing_subscriber::registry().with(capture).with(print);
        let _ = tracing::subscriber::set_global_default(subscriber);
        logs
    })
}

/// How many captured WARN lines about `namespace` contain `text`.
pub fn warnings_about(namespace: &str, text: &str) -> usize {
    let logs = captured().lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| {
            l.contains(text)
                && (l.contains(&format!("namespace=\"{namespace}\""))
                    || l.contains(&format!("namespace={namespace} ")))
        })
        .count()
}

struct Capture(&'static Mutex<Vec<u8>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
