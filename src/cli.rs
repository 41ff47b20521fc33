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

    /// Epoch protocol dialect: `auto` (the JobSet CRD's status fields decide, read at start),
    /// `epoch` (KEP-467 status fields deprecatedEpoch/syncedEpoch) or `attempt` (JobSet >=
    /// v0.11's previous/currentInPlaceRestartAttempt). A dialect overrides the cluster and the
    /// `protocol` key of an injection config file. Unset: `auto` for the webhook, the reconciler
    /// and `doctor`; for `inject`, `check` and `review` the config file's `protocol`, else
    /// `epoch`, and no cluster is contacted (only an explicit `auto` asks the cluster).
    #[arg(long, global = true, env = "JOBSET_INPLACE_PROTOCOL", value_enum)]
    pub protocol: Option<ProtocolFlag>,

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
            protocol: self.protocol.and_then(ProtocolFlag::dialect),
            protocol_auto_given: self.protocol == Some(ProtocolFlag::Auto),
            name: "",
        }
    }
}

/// The file name under which kubectl finds the binary as its plugin: `kubectl jobset-inplace ...`
/// runs `kubectl-jobset_inplace ...` from the PATH (kubectl maps the `-` of a command to `_`).
pub const KUBECTL_PLUGIN: &str = "kubectl-jobset_inplace";

/// How the binary names itself in help and errors: `kubectl jobset-inplace` when it runs as
/// kubectl's plugin (`argv[0]`'s file name is [`KUBECTL_PLUGIN`], with any extension), else
/// `jobset-inplace`.
pub fn bin_name(argv0: &std::ffi::OsStr) -> &'static str {
    let name = std::path::Path::new(argv0)
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name == KUBECTL_PLUGIN {
        "kubectl jobset-inplace"
    } else {
        "jobset-inplace"
    }
}

impl Cli {
    /// Parses a command line whose first item is the program (`argv[0]`), as a plugin of kubectl
    /// too: the same commands and flags, only the name in help and errors differs.
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let name = args.first().map_or("jobset-inplace", |a| bin_name(a));
        let matches = Cli::command().bin_name(name).try_get_matches_from(args)?;
        Cli::from_arg_matches(&matches)
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

    /// Issue 23: an error is printed whole, not its first line only.
    #[test]
    fn missing_arguments_are_named() {
        let err =
            Cli::try_parse_from(["jobset-inplace", "review", "-f", "x"]).expect_err("no mode");
        let line = one_line_error(&err);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains("--mutate") && line.contains("--validate"),
            "{line}"
        );
        let err = Cli::try_parse_from(["jobset-inplace", "webhook", "--cert-reload-interval"])
            .expect_err("no value");
        let line = one_line_error(&err);
        assert!(line.contains("--cert-reload-interval"), "{line}");
        assert!(!line.contains("expected one of"), "{line}");
    }

    /// Issue 23: every duration flag takes the one grammar (`1h30m` was the deadline's only).
    #[test]
    fn duration_flags_take_compound_durations() {
        let cli = Cli::try_parse_from([
            "jobset-inplace",
            "webhook",
            "--cert-reload-interval",
            "1h30m",
        ])
        .expect("accepted");
        let Command::Webhook(args) = cli.command else {
            panic!("webhook")
        };
        assert_eq!(
            args.cert_reload_interval,
            std::time::Duration::from_secs(5400)
        );
    }

    /// As kubectl's plugin the binary parses the same command line and names itself
    /// `kubectl jobset-inplace`.
    #[test]
    fn runs_as_a_kubectl_plugin() {
        assert_eq!(
            bin_name("/usr/local/bin/kubectl-jobset_inplace".as_ref()),
            "kubectl jobset-inplace"
        );
        assert_eq!(
            bin_name("kubectl-jobset_inplace.exe".as_ref()),
            "kubectl jobset-inplace"
        );
        assert_eq!(bin_name("/bin/jobset-inplace".as_ref()), "jobset-inplace");
        let cli = Cli::try_parse_args(["/p/kubectl-jobset_inplace", "doctor"]).expect("parses");
        assert!(matches!(cli.command, Command::Doctor(_)));
        let help = Cli::try_parse_args(["/p/kubectl-jobset_inplace", "doctor", "--help"])
            .expect_err("help")
            .render()
            .to_string();
        assert!(
            help.contains("Usage: kubectl jobset-inplace doctor"),
            "{help}"
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
