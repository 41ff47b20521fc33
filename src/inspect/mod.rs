//! Commands for operators, run with a kubeconfig (or in a cluster): `doctor` (is the installation
//! working?) and `status` (where does one JobSet's group restart stand?). Both only read.
//!
//! - [`doctor`]: one finding per check, pure checks over the objects read;
//! - [`status`]: the JobSet's epoch fields and its pods, the pods the group waits for first.

pub mod doctor;
pub mod status;

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use crate::settings::{Global, parse_duration};

/// Each API request of these commands gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the Kubernetes API (kubeconfig or in-cluster config): {0}")]
    Client(#[source] kube::Error),
    #[error("cannot load a kubeconfig or the in-cluster config: {0}")]
    Config(#[source] kube::config::InferConfigError),
    #[error("cannot read JobSet {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
    #[error("cannot render JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// Output format of `doctor` and `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// A client with every request bounded.
async fn client() -> Result<kube::Client, Error> {
    let mut config = kube::Config::infer().await.map_err(Error::Config)?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    kube::Client::try_from(config).map_err(Error::Client)
}

fn write_stdout(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Error::Write)
}

/// Flags of `jobset-inplace doctor`.
#[derive(Clone, Debug, clap::Args)]
pub struct DoctorArgs {
    /// Also check this namespace's agent ServiceAccount and RoleBinding.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,

    /// Namespace of the webhook and the reconciler.
    #[arg(long, default_value = "jobset-inplace-system")]
    pub system_namespace: String,

    /// Name of the Mutating- and ValidatingWebhookConfiguration.
    #[arg(long, default_value = "jobset-inplace")]
    pub webhook_configuration: String,

    /// The Secret whose `tls.crt` the webhook serves.
    #[arg(long, default_value = "jobset-inplace-webhook-tls")]
    pub tls_secret: String,

    /// Name of the reconciler's leader Lease (in the system namespace).
    #[arg(long, default_value = "jobset-inplace-reconciler")]
    pub lease_name: String,

    /// The agent's ServiceAccount (and RoleBinding) name in tenant namespaces.
    #[arg(long, default_value = crate::admission::config::DEFAULT_SERVICE_ACCOUNT)]
    pub agent_service_account: String,

    /// Warn when a certificate has fewer days left than this.
    #[arg(long, default_value_t = 30)]
    pub warn_days: u64,

    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl DoctorArgs {
    pub fn target(&self, global: Global) -> doctor::Target {
        doctor::Target {
            dialect: global.dialect(),
            system_namespace: self.system_namespace.clone(),
            webhook_configuration: self.webhook_configuration.clone(),
            tls_secret: self.tls_secret.clone(),
            lease_name: self.lease_name.clone(),
            namespace: self.namespace.clone(),
            agent_service_account: self.agent_service_account.clone(),
            agent_role_binding: crate::reconciler::provision::ROLE_BINDING.to_owned(),
            warn_days: self.warn_days,
        }
    }

    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let client = client().await?;
        let findings = doctor::run_checks(&client, &self.target(global), SystemTime::now()).await;
        let failed = findings.iter().any(|f| f.verdict == doctor::Verdict::Fail);
        let text = match self.output {
            Output::Text => findings.iter().map(|f| f.render() + "\n").collect(),
            Output::Json => {
                let mut s = serde_json::to_string_pretty(&serde_json::json!({
                    "ok": !failed,
                    "checks": findings,
                }))
                .map_err(Error::Json)?;
                s.push('\n');
                s
            }
        };
        write_stdout(&text)?;
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// Flags of `jobset-inplace status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    /// The JobSet's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,

    /// The JobSet's name.
    pub jobset: String,

    /// Redraw whenever something changes (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// How often `--watch` reads again.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub interval: Duration,

    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl StatusArgs {
    fn render(&self, report: &status::StatusReport) -> Result<String, Error> {
        Ok(match self.output {
            Output::Text => report.render(),
            Output::Json => {
                let mut s = serde_json::to_string(report).map_err(Error::Json)?;
                s.push('\n');
                s
            }
        })
    }

    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let client = client().await?;
        let read = || async {
            status::fetch(&client, &self.namespace, &self.jobset, global.dialect())
                .await
                .map_err(|source| Error::Read {
                    namespace: self.namespace.clone(),
                    name: self.jobset.clone(),
                    source,
                })
        };
        let first = read().await?;
        write_stdout(&self.render(&first)?)?;
        if !self.watch {
            return Ok(ExitCode::SUCCESS);
        }
        let mut last = first;
        let mut interval = tokio::time::interval(self.interval.max(Duration::from_millis(200)));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.tick().await;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
                _ = interval.tick() => {}
            }
            // A failed read is shown and retried at the next tick; the last view stays.
            match read().await {
                Ok(report) if report != last => {
                    let text = self.render(&report)?;
                    // Text redraws the screen; JSON appends one line per change.
                    let clear = if self.output == Output::Text {
                        "\x1b[H\x1b[2J"
                    } else {
                        ""
                    };
                    write_stdout(&format!("{clear}{text}"))?;
                    last = report;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "read failed; retrying"),
            }
        }
    }
}
