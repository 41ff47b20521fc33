//! Settings every subcommand shares: the global flags ([`Global`]), the parsers of durations and
//! sizes their flags and env use, the YAML reader of config files and manifests ([`from_yaml`]),
//! and the environment variable's tip on a command-line error. At the
//! bottom of the crate: every component reads these, none of them is read from here. See
//! docs/architecture.md ("Layers").

use std::time::Duration;

use crate::protocol::Dialect;

/// Settings every subcommand shares.
#[derive(Clone, Copy, Debug, Default)]
pub struct Global {
    /// `--protocol` / `JOBSET_INPLACE_PROTOCOL`, when it names a dialect (`None` for `auto`).
    pub protocol: Option<Dialect>,
    /// `--protocol auto` was given (flag or env), not left to its default: the offline commands
    /// ask the cluster only then.
    pub protocol_auto_given: bool,
    /// How the binary names itself in errors (`jobset-inplace`, or `kubectl jobset-inplace` as
    /// kubectl's plugin); empty means `jobset-inplace`.
    pub name: &'static str,
}

impl Global {
    /// The agent's dialect: the flag (the env the webhook injects), else `epoch`. Every other
    /// component asks the cluster when the flag is `auto` (`crate::wire::jobset_crd`).
    pub fn dialect(&self) -> Dialect {
        self.protocol.unwrap_or_default()
    }

    /// The name errors start with.
    pub fn name(&self) -> &'static str {
        if self.name.is_empty() {
            "jobset-inplace"
        } else {
            self.name
        }
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

/// A clap error (other than `--help`/`--version`) as clap renders it (issue 47: its own format,
/// with its "a similar subcommand exists" and "similar argument" tips, the accepted values and
/// the usage), plus a tip naming the environment variable that can also set the flag in error
/// (looked up in `root` and its subcommands): a value set in the environment is reported under
/// the flag's name.
pub fn with_env_tip(mut err: clap::Error, root: &clap::Command) -> clap::Error {
    use clap::builder::StyledStr;
    use clap::error::{ContextKind, ContextValue};

    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let flag = arg.split_whitespace().next().unwrap_or_default().to_owned();
    let long = flag.trim_start_matches("--");
    let env = std::iter::once(root)
        .chain(root.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned());
    if let Some(env) = env {
        let mut tips = match err.get(ContextKind::Suggested) {
            Some(ContextValue::StyledStrs(tips)) => tips.clone(),
            _ => Vec::new(),
        };
        tips.push(StyledStr::from(format!(
            "{flag} can also be set by the environment variable {env}"
        )));
        err.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    }
    err
}

/// A clap error's text on one line (for the components, whose errors land in a pod's log and
/// termination message): what clap says, its values and tips, without the usage.
pub fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let line = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    match line.strip_prefix("error: ") {
        Some(rest) => rest.to_owned(),
        None if line.is_empty() => "invalid command line".to_owned(),
        None => line,
    }
}

/// The one duration grammar of every flag, environment variable and annotation: a sequence of
/// `<number><unit>` as [`humantime::parse_duration`] reads it (`90s`, `2m`, `1h30m`, `1m30s`,
/// `500ms`, `1.5s`, `90d`; units `ms`, `s`, `m`, `h`, `d`, `w` and their long names), or a bare
/// non-negative integer of seconds (`3`, `0`). Negative values are refused; each caller refuses
/// zero where it means nothing.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("{text:?} is too large"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 90s, 2m, 1h30m or 500ms ({e})"))
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

/// One YAML document (config files, `check`/`inject` manifests) through `serde-saphyr`, kube's
/// own YAML crate, read as the YAML 1.2 core schema (`yes`, `on`, `0755`, `1_000` stay strings,
/// as for `serde_yaml`, which this replaced; a duplicate key is an error), with one-line errors
/// (no snippet of the input). Its default budget bounds aliases, depth and size.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options(text, options)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    #[test]
    fn yaml_reads_the_core_schema_with_one_line_errors() {
        let v: Value =
            from_yaml("a: yes\nb: on\nc: 0755\nd: 1_000\ne: true\nf: 12\ng: ~\n").expect("yaml");
        assert_eq!(
            v,
            json!({"a": "yes", "b": "on", "c": "0755", "d": "1_000", "e": true, "f": 12, "g": null})
        );
        let e = from_yaml::<Value>("a: 1\na: 2\n").expect_err("a duplicate key");
        assert!(!e.to_string().contains('\n'), "{e}");
        let e = from_yaml::<Value>("a: [1, 2\n").expect_err("unclosed");
        assert!(!e.to_string().trim_end().contains('\n'), "{e}");
    }

    #[test]
    fn yaml_written_reads_back_as_the_same_strings() {
        let v = json!({"a": "yes", "b": "on", "c": "0755", "d": "1", "e": "null", "f": "~",
            "g": "two\nlines", "h": "", "i": "- x", "j": "a: b", "k": "1_000", "l": 1.5, "m": false});
        let text = serde_saphyr::to_string(&v).expect("yaml");
        assert_eq!(from_yaml::<Value>(&text).expect("reads back"), v, "{text}");
        for strict in ["yes", "on", "y", "no", "off"] {
            assert!(
                !text.contains(&format!(": {strict}\n")),
                "{strict} unquoted in {text}"
            );
        }
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        // Issue 23: one grammar, the compound form included (it was the deadline's only).
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in [
            "",
            "-1",
            "-5s",
            "+5s",
            "5x",
            "m5",
            "s",
            "1h-30m",
            "18446744073709551616",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
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
