#![forbid(unsafe_code)]
// No panic on input from the network, a file or the environment: shipped code returns errors.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::ExitCode;

use jobset_inplace::cli::{self, Cli, Command};
use jobset_inplace::telemetry;

fn main() -> ExitCode {
    // Also run as kubectl's plugin (`kubectl jobset-inplace ...`): see cli::KUBECTL_PLUGIN.
    // Errors start with the name the binary was run as (`kubectl jobset-inplace` as the plugin).
    let name = std::env::args_os()
        .next()
        .map_or("jobset-inplace", |argv0| cli::bin_name(&argv0));
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_args(args.iter().cloned()) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let e = cli::with_env_tip(e);
            if cli::runs_a_component(&args) {
                eprintln!("{name}: {}", jobset_inplace::settings::one_line(&e));
            } else {
                // clap's own rendering (its tips and usage), in colour on a terminal.
                let _ = e.print();
            }
            return ExitCode::from(2);
        }
    };
    // doctor and status report every failed request themselves (an unreachable server in one
    // line): kube's client logs none of them again, unless the filter names kube.
    let log_level = match cli.command {
        Command::Doctor(_) | Command::Status(_) if !cli.log_level.contains("kube") => {
            format!("{},kube_client::client::builder=off", cli.log_level)
        }
        _ => cli.log_level.clone(),
    };
    if let Err(e) = telemetry::init_logging(cli.log_format, &log_level) {
        eprintln!("{name}: {e}");
        return ExitCode::from(2);
    }
    // The one TLS crypto provider of the process (kube's client and our server both use it).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let global = jobset_inplace::settings::Global {
        name,
        ..cli.global()
    };
    // The agent runs on every in-place restart: a single-threaded runtime starts fastest.
    let runtime = match cli.command {
        Command::Agent(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.command.run(global)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
