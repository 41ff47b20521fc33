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
#[command(name = "jobset-inplace", version = VERSION, propagate_version = true)]
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
    /// Print the shell completion script: `source <(jobset-inplace completion bash)`.
    Completion(CompletionArgs),
}

/// Flags of `jobset-inplace completion`.
#[derive(Clone, Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

impl CompletionArgs {
    /// Writes the shell's completion script of the whole command line to stdout: clap's own,
    /// from the same definition as the parser (every subcommand, flag and value).
    pub fn run(self, global: Global) -> crate::Result<ExitCode> {
        use clap::CommandFactory;
        let mut out = Vec::new();
        // For the binary's own name (kubectl completes its plugins itself).
        clap_complete::generate(self.shell, &mut Cli::command(), "jobset-inplace", &mut out);
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout.write_all(&out).and_then(|()| stdout.flush()) {
            eprintln!("{}: cannot write the completion script: {e}", global.name());
            return Ok(ExitCode::from(2));
        }
        Ok(ExitCode::SUCCESS)
    }
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
            Command::Completion(args) => args.run(global)?,
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

/// What `--version` prints after the name: the package's version, the commit the binary was
/// built from and the build's date (build.rs): `0.1.0 (commit 4567270..., built 2026-12-07)`;
/// `unknown` for both where the build had no build script (the image's, .dockerignore).
pub const VERSION: &str = match option_env!("JOBSET_INPLACE_VERSION") {
    Some(version) => version,
    None => concat!(
        env!("CARGO_PKG_VERSION"),
        " (commit unknown, built unknown)"
    ),
};

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

/// A clap error (other than `--help`/`--version`) of this command line as clap renders it, with
/// a tip naming the environment variable that can also set the flag in error.
pub fn with_env_tip(err: clap::Error) -> clap::Error {
    use clap::CommandFactory;
    crate::settings::with_env_tip(err, &Cli::command())
}

/// The subcommands that run in pods, configured from env: a command-line error of theirs is one
/// line ([`crate::settings::one_line`]), as the rest of their errors.
const COMPONENTS: [&str; 3] = ["webhook", "reconciler", "agent"];

/// Whether a command line (with `argv[0]`) runs one of the [`COMPONENTS`]: its first argument
/// that names a subcommand names one of them.
pub fn runs_a_component(args: &[std::ffi::OsString]) -> bool {
    use clap::CommandFactory;
    let cli = Cli::command();
    args.iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| cli.get_subcommands().any(|c| c.get_name() == *a))
        .is_some_and(|a| COMPONENTS.contains(&a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A command line's error as `main` prints it (without colour: not a terminal).
    fn rendered(args: &[&str]) -> String {
        let err = Cli::try_parse_args(args.iter().copied()).expect_err("rejected");
        with_env_tip(err).render().to_string()
    }

    /// Issue 47: clap's own error, with the environment variable that can also set the flag.
    #[test]
    fn a_bad_value_is_clap_s_error_with_the_env_var_tip() {
        assert_eq!(
            rendered(&["jobset-inplace", "--protocol", "foo", "agent"]),
            "error: invalid value 'foo' for '--protocol <PROTOCOL>'\n  \
             [possible values: auto, epoch, attempt]\n\n  \
             tip: --protocol can also be set by the environment variable \
             JOBSET_INPLACE_PROTOCOL\n\nFor more information, try '--help'.\n"
        );
    }

    /// The components' command-line errors stay one line, with clap's values and tips.
    #[test]
    fn a_component_s_error_is_one_line() {
        let args = ["jobset-inplace", "--protocol", "v2", "agent"];
        let owned: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        assert!(runs_a_component(&owned));
        let err = with_env_tip(Cli::try_parse_args(args).expect_err("rejected"));
        assert_eq!(
            crate::settings::one_line(&err),
            "invalid value 'v2' for '--protocol <PROTOCOL>' [possible values: auto, epoch, \
             attempt] tip: --protocol can also be set by the environment variable \
             JOBSET_INPLACE_PROTOCOL"
        );
        for other in [
            &["jobset-inplace", "check", "-f", "agent"][..],
            &["jobset-inplace", "chek"],
        ] {
            let owned: Vec<std::ffi::OsString> = other.iter().map(Into::into).collect();
            assert!(!runs_a_component(&owned), "{other:?}");
        }
    }

    /// Issue 47: clap's suggestions are kept ("did you mean").
    #[test]
    fn a_misspelt_subcommand_or_flag_gets_clap_s_suggestion() {
        assert_eq!(
            rendered(&["jobset-inplace", "chek", "-f", "x"]),
            "error: unrecognized subcommand 'chek'\n\n  \
             tip: a similar subcommand exists: 'check'\n\n\
             Usage: jobset-inplace [OPTIONS] <COMMAND>\n\n\
             For more information, try '--help'.\n"
        );
        let err = rendered(&["jobset-inplace", "check", "--fliename", "x"]);
        assert!(
            err.starts_with(
                "error: unexpected argument '--fliename' found\n\n  \
                 tip: a similar argument exists: '--filename'\n"
            ),
            "{err}"
        );
        // As kubectl's plugin, the usage names the plugin.
        let err = rendered(&["kubectl-jobset_inplace", "chek"]);
        assert!(
            err.contains("Usage: kubectl jobset-inplace [OPTIONS] <COMMAND>"),
            "{err}"
        );
    }

    /// Issue 23: an error is printed whole, not its first line only.
    #[test]
    fn missing_arguments_are_named() {
        let err = rendered(&["jobset-inplace", "review", "-f", "x"]);
        assert!(
            err.contains("--mutate") && err.contains("--validate"),
            "{err}"
        );
        let err = rendered(&["jobset-inplace", "webhook", "--cert-reload-interval"]);
        assert!(err.contains("--cert-reload-interval"), "{err}");
        assert!(
            err.contains(
                "tip: --cert-reload-interval can also be set by the environment variable \
                 JOBSET_INPLACE_CERT_RELOAD_INTERVAL"
            ),
            "{err}"
        );
    }

    /// Issue 47: `--version` names the commit (git's HEAD when the build had git) and the day of
    /// the build, on every subcommand too.
    #[test]
    fn the_version_names_the_commit_and_the_build_date() {
        let printed = |args: &[&str]| {
            let err = Cli::try_parse_args(args.iter().copied()).expect_err("version");
            assert!(!err.use_stderr(), "{err}");
            err.render().to_string()
        };
        let line = printed(&["jobset-inplace", "--version"]);
        assert_eq!(line, format!("jobset-inplace {VERSION}\n"));
        assert_eq!(
            printed(&["jobset-inplace", "check", "--version"]),
            format!("jobset-inplace-check {VERSION}\n")
        );
        let rest = VERSION
            .strip_prefix(concat!(env!("CARGO_PKG_VERSION"), " (commit "))
            .expect(VERSION);
        let (commit, date) = rest
            .strip_suffix(')')
            .and_then(|r| r.split_once(", built "))
            .expect(VERSION);
        let day = |s: &str| {
            let parts: Vec<_> = s.split('-').collect();
            parts.len() == 3
                && [4, 2, 2]
                    .iter()
                    .zip(&parts)
                    .all(|(n, p)| p.len() == *n && p.bytes().all(|b| b.is_ascii_digit()))
        };
        assert!(day(date), "{VERSION}");
        let head = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        match head {
            Some(head) => assert_eq!(commit, head, "{VERSION}"),
            None => assert!(commit == "unknown" || commit.len() == 40, "{VERSION}"),
        }
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
