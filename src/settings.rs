//! Settings every subcommand shares: the global flags ([`Global`]), the parsers of durations and
//! sizes their flags and env use, and the one-line rendering of a command-line error. At the
//! bottom of the crate: every component reads these, none of them is read from here. See
//! docs/architecture.md ("Layers").

use std::time::Duration;

use crate::protocol::Dialect;

/// Settings every subcommand shares.
#[derive(Clone, Copy, Debug, Default)]
pub struct Global {
    /// `--protocol` / `JOBSET_INPLACE_PROTOCOL`, when it names a dialect (`None` for `auto`).
    pub protocol: Option<Dialect>,
}

impl Global {
    /// The agent's dialect: the flag (the env the webhook injects), else `epoch`. Every other
    /// component asks the cluster when the flag is `auto` (`crate::wire::jobset_crd`).
    pub fn dialect(&self) -> Dialect {
        self.protocol.unwrap_or_default()
    }
}

/// The value of `--protocol`: a dialect, or `auto` (the cluster's JobSet CRD decides).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtocolFlag {
    #[default]
    Auto,
    Epoch,
    Attempt,
}

impl ProtocolFlag {
    /// The dialect it names; `None` for `auto`.
    pub fn dialect(self) -> Option<Dialect> {
        match self {
            ProtocolFlag::Auto => None,
            ProtocolFlag::Epoch => Some(Dialect::Epoch),
            ProtocolFlag::Attempt => Some(Dialect::Attempt),
        }
    }
}

/// Renders a clap error (other than `--help`/`--version`) as ONE line that names the flag, the
/// environment variable that can also set it (looked up in `root` and its subcommands), and the
/// accepted values.
pub fn one_line_error(err: &clap::Error, root: &clap::Command) -> String {
    use clap::error::{ContextKind, ContextValue};

    let rendered = err.render().to_string();
    let mut line = rendered
        .lines()
        .next()
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_owned();
    if let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) {
        let long = arg
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_start_matches("--");
        let env = std::iter::once(root)
            .chain(root.get_subcommands())
            .flat_map(|c| c.get_arguments())
            .find(|a| a.get_long() == Some(long))
            .and_then(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned());
        if let Some(env) = env {
            line.push_str(&format!(" (or env {env})"));
        }
    }
    if let Some(ContextValue::Strings(values)) = err.get(ContextKind::ValidValue) {
        line.push_str(&format!("; expected one of: {}", values.join(", ")));
    }
    line
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `90d`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 10s, 500ms, 2m"))?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        "d" => number * 86_400.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} (expected ms, s, m, h or d)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses a size in bytes: `65536`, `512Ki`, `64Mi`, `1Gi` (an optional trailing `B`).
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 64Mi, 512Ki, 65536"))?;
    let shift = match unit.trim().trim_end_matches('B') {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        other => return Err(format!("unknown unit {other:?} (expected Ki, Mi or Gi)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert!(parse_duration("5w").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("512Ki"), Ok(512 << 10));
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert!(parse_bytes("64M").is_err());
        assert!(parse_bytes("Mi").is_err());
        assert!(parse_bytes("-1").is_err());
    }
}
