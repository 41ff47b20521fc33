//! The command line: global flags and one subcommand per component. Every flag can also be set
//! from an environment variable (shown in `--help`). This module only composes: each component
//! defines its own `Args`; the shared parsers and [`Global`] live in [`crate::settings`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::settings::{Global, ProtocolFlag};
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

    /// Epoch protocol dialect: `auto` (the default: the JobSet CRD's status fields decide, read
    /// at start), `epoch` (KEP-467 status fields deprecatedEpoch/syncedEpoch) or `attempt`
    /// (JobSet >= v0.11's previous/currentInPlaceRestartAttempt). A dialect overrides the
    /// cluster and the `protocol` key of an injection config file.
    #[arg(long, global = true, env = "JOBSET_INPLACE_PROTOCOL", value_enum, default_value_t = ProtocolFlag::Auto)]
    pub protocol: ProtocolFlag,

    #[command(subcommand)]
    pub command: Command,
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

impl Command {
    /// Runs the subcommand to its end: the exit code, or the error `main` prints.
    pub async fn run(self, global: Global) -> crate::Result<ExitCode> {
        Ok(match self {
            Command::Webhook(args) => args.run(global).await?,
            Command::Reconciler(args) => args.run(global).await?,
            Command::Agent(args) => args.run(global).await?,
            Command::Certs(args) => args.run(global).await?,
            Command::Inject(args) => args.run(global).await?,
            Command::Check(args) => args.run(global).await?,
            Command::Review(args) => args.run(global).await?,
            Command::Doctor(args) => args.run(global).await?,
            Command::Status(args) => args.run(global).await?,
        })
    }
}

impl Cli {
    pub fn global(&self) -> Global {
        Global {
            protocol: self.protocol.dialect(),
        }
    }
}

/// Renders a clap error (other than `--help`/`--version`) of this command line as ONE line that
/// names the flag, the environment variable that can also set it, and the accepted values.
pub fn one_line_error(err: &clap::Error) -> String {
    use clap::CommandFactory;
    crate::settings::one_line_error(err, &Cli::command())
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
        assert!(line.contains("auto, epoch, attempt"), "{line}");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
