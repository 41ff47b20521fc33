//! The command line: global flags and one subcommand per component. Every flag can also be set
//! from an environment variable (shown in `--help`).

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

    /// Epoch protocol dialect: `epoch` (KEP-467 status fields deprecatedEpoch/syncedEpoch) or
    /// `attempt` (JobSet >= v0.11's previous/currentInPlaceRestartAttempt).
    #[arg(long, global = true, env = "JOBSET_INPLACE_PROTOCOL", value_enum, default_value_t = Dialect::Epoch)]
    pub protocol: Dialect,

    #[command(subcommand)]
    pub command: Command,
}

/// Settings every subcommand shares.
#[derive(Clone, Copy, Debug)]
pub struct Global {
    pub protocol: Dialect,
}

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
}

impl Cli {
    pub fn global(&self) -> Global {
        Global {
            protocol: self.protocol,
        }
    }
}
