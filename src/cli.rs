//! The command line: global flags and one subcommand per component. Every flag can also be set
//! from an environment variable (shown in `--help`).

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::protocol::Dialect;
use crate::telemetry::LogFormat;

/// jobset-inplace makes JobSet's InPlaceRestart strategy usable: an admission webhook that
/// validates InPlaceRestart JobSets and injects the agent sidecar, an epoch reconciler that moves
/// the JobSet's epoch status fields, and the agent that restarts every worker pod of a JobSet
/// together, in place.
#[derive(Debug, Parser)]
#[command(name = "jobset-inplace", version, propagate_version = true)]
pub struct Cli {
    /// Log format: `text` for people, `json` for clusters.
    #[arg(long, global = true, env = "JOBSET_INPLACE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (`info`, `debug`, `jobset_inplace=debug,kube=info`, ...).
    #[arg(
        long,
        global = true,
        env = "JOBSET_INPLACE_LOG_LEVEL",
        default_value = "info"
    )]
    pub log_level: String,

    /// Epoch protocol dialect: `epoch` (KEP-467 status fields deprecatedEpoch/syncedEpoch; the
    /// default) or `attempt` (JobSet >= v0.11's previous/currentInPlaceRestartAttempt). Overrides
    /// the `protocol` key of an injection config file.
    #[arg(long, global = true, env = "JOBSET_INPLACE_PROTOCOL", value_enum)]
    pub protocol: Option<Dialect>,

    #[command(subcommand)]
    pub command: Command,
}

/// Settings every subcommand shares.
#[derive(Clone, Copy, Debug, Default)]
pub struct Global {
    /// `--protocol` / `JOBSET_INPLACE_PROTOCOL`, when given.
    pub protocol: Option<Dialect>,
}

impl Global {
    /// The dialect in force for components without an injection config: the flag, else `epoch`.
    pub fn dialect(&self) -> Dialect {
        self.protocol.unwrap_or_default()
    }
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTPS admission webhook (/mutate, /validate).
    Webhook(crate::webhook::Args),
    /// Run the epoch reconciler.
    Reconciler(crate::reconciler::Args),
    /// Run the agent inside a worker pod (configured from env).
    Agent(crate::agent::Args),
    /// Generate a CA and a serving certificate for the webhook.
    Certs(crate::certs::Args),
    /// Print manifests with the injection applied.
    Inject(crate::offline::InjectArgs),
    /// Validate manifests; exit 1 if any JobSet would be denied.
    Check(crate::offline::CheckArgs),
    /// Answer an AdmissionReview request exactly as the webhook would.
    Review(crate::offline::ReviewArgs),
    /// Check the installation: webhook configurations and certificates, the JobSet CRD, the
    /// reconciler's leader, a namespace's agent account. Exit 1 if any check fails.
    Doctor(crate::inspect::DoctorArgs),
    /// Show where a JobSet's group restart stands, pod by pod.
    Status(crate::inspect::StatusArgs),
}

impl Cli {
    pub fn global(&self) -> Global {
        Global {
            protocol: self.protocol,
        }
    }
}

/// Renders a clap error (other than `--help`/`--version`) as ONE line that names the flag, the
/// environment variable that can also set it, and the accepted values.
pub fn one_line_error(err: &clap::Error) -> String {
    use clap::CommandFactory;
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
        let root = Cli::command();
        let env = std::iter::once(&root)
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

/// Parses `10s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
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
        other => return Err(format!("unknown unit {other:?} (expected ms, s, m or h)")),
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

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = terminate => tracing::info!("SIGTERM received"),
        () = interrupt => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn bad_value_is_one_line_naming_the_env_var() {
        let err = Cli::try_parse_from(["jobset-inplace", "--protocol", "foo", "agent"])
            .expect_err("rejected");
        let line = one_line_error(&err);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("--protocol"), "{line}");
        assert!(line.contains("JOBSET_INPLACE_PROTOCOL"), "{line}");
        assert!(line.contains("epoch, attempt"), "{line}");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
