//! `process_*` metrics of this process, read from `/proc/self` at each scrape, with the names
//! and meanings of the Prometheus client libraries' process collectors (client_golang's
//! `collectors.NewProcessCollector`, which JobSet and Kueue expose): `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`.
//!
//! Written here rather than taken from a crate: prometheus-client has no process collector, and
//! the crates that have one are for the `prometheus` or `metrics` crates, not prometheus-client
//! (the reading is a few lines of /proc parsing; the parsing is pure and tested below). Not on
//! Linux, or when /proc cannot be read, the series are left out rather than reported as zero.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// The kernel's `USER_HZ`, the unit of /proc's CPU times: 100 on every Linux architecture
/// (`sysconf(_SC_CLK_TCK)` would need libc; the ABI fixes it).
const TICKS_PER_SECOND: f64 = 100.0;

/// What one scrape reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<i64>,
    pub virtual_bytes: Option<i64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
    pub start_time_seconds: Option<f64>,
}

/// User plus system CPU seconds and the start time in ticks after boot, from `/proc/self/stat`
/// (the command name may hold spaces and parentheses: fields are counted after its last `)`).
pub fn parse_stat(stat: &str) -> Option<(f64, u64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Field 3 (state) is fields[0]: utime is field 14, stime 15, starttime 22.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let start: u64 = fields.get(19)?.parse().ok()?;
    Some(((utime + stime) as f64 / TICKS_PER_SECOND, start))
}

/// A `kB` line of `/proc/self/status` (`VmRSS: 1234 kB`), in bytes.
pub fn parse_status_kb(status: &str, key: &str) -> Option<i64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kb: i64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// The boot time (`btime`, Unix seconds) of `/proc/stat`.
pub fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
pub fn parse_max_fds(limits: &str) -> Option<i64> {
    limits.lines().find_map(|l| {
        let rest = l.strip_prefix("Max open files")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Reads this process's sample now.
pub fn sample() -> Sample {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let stat = read("/proc/self/stat").and_then(|s| parse_stat(&s));
    let status = read("/proc/self/status");
    let boot = read("/proc/stat").and_then(|s| parse_boot_time(&s));
    Sample {
        cpu_seconds: stat.map(|(cpu, _)| cpu),
        resident_bytes: status.as_deref().and_then(|s| parse_status_kb(s, "VmRSS")),
        virtual_bytes: status.as_deref().and_then(|s| parse_status_kb(s, "VmSize")),
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as i64),
        max_fds: read("/proc/self/limits").and_then(|s| parse_max_fds(&s)),
        start_time_seconds: match (stat, boot) {
            (Some((_, ticks)), Some(boot)) => Some(boot as f64 + ticks as f64 / TICKS_PER_SECOND),
            _ => None,
        },
    }
}

/// The collector: a [`sample`] per scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = sample();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(Unit::Bytes),
                s.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes.",
                Some(Unit::Bytes),
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                s.max_fds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, unit.as_ref(), m.metric_type())?)?;
            }
        }
        if let Some(v) = s.start_time_seconds {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(
                "process_start_time",
                "Start time of the process since unix epoch in seconds.",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_parsed() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 50 0 0 20 0 5 0 12345 1000 100";
        assert_eq!(parse_stat(stat), Some((3.0, 12345)));
        assert_eq!(parse_stat("garbage"), None);
        let status = "Name:\tx\nVmSize:\t  2048 kB\nVmRSS:\t    512 kB\n";
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(512 * 1024));
        assert_eq!(parse_status_kb(status, "VmSize"), Some(2048 * 1024));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
        assert_eq!(
            parse_boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_sanely() {
        let s = sample();
        assert!(s.resident_bytes.is_some_and(|b| b > 1024 * 1024), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(
            s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap_or(0)),
            "{s:?}"
        );
        assert!(s.cpu_seconds.is_some_and(|c| c >= 0.0), "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let started = s.start_time_seconds.unwrap_or_default();
        assert!(
            started > now - 24.0 * 3600.0 && started <= now + 1.0,
            "{started} vs {now}"
        );
    }
}
