//! Commands for operators, run with a kubeconfig (or in a cluster): `doctor` (is the installation
//! working?) and `status` (where does one JobSet's group restart stand?). Both only read.
//!
//! - [`doctor`]: one finding per check, pure checks over the objects read;
//! - [`status`]: the JobSet's epoch fields and its pods, the pods the group waits for first.

mod dialect;
pub mod doctor;
pub mod finding;
pub mod kubelet_version;
pub mod kueue;
pub mod node_lost;
pub mod preflight;
pub mod status;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use crate::protocol::Dialect;
use crate::settings::{Global, parse_duration};
use crate::wire::jobset_crd::{self, Choice};

/// Each API request of these commands gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the Kubernetes API (kubeconfig or in-cluster config): {0}")]
    Client(#[source] kube::Error),
    #[error("cannot load a kubeconfig or the in-cluster config: {0}")]
    Config(#[source] kube::config::InferConfigError),
    #[error("cannot load the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// Issue 47: one line naming the server and where it was configured, with the first cause.
    #[error("cannot reach the Kubernetes API server {server} ({context}): {reason}")]
    Unreachable {
        server: String,
        context: String,
        reason: String,
    },
    #[error("cannot decide the epoch protocol dialect (--protocol auto): {0}")]
    Dialect(String),
    #[error("cannot list JobSets in {scope}: {source}")]
    List {
        scope: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "no JobSet {name} in namespace {namespace} (`status -n {namespace}` lists its \
         InPlaceRestart JobSets, `status -A` every namespace's)"
    )]
    NotFound { namespace: String, name: String },
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
    #[error("cannot render YAML: {0}")]
    Yaml(#[source] serde_saphyr::ser::Error),
}

/// Output format of `doctor` and `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    /// What `json` prints, as YAML.
    Yaml,
}

/// Which cluster `doctor` and `status` talk to (as kubectl chooses it).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ClusterArgs {
    /// The kubeconfig file (else $KUBECONFIG, ~/.kube/config, or the in-cluster config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// The kubeconfig context to use (else its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// A client with every request bounded.
pub async fn client(cluster: &ClusterArgs) -> Result<kube::Client, Error> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context: cluster.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match (&cluster.kubeconfig, &cluster.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(Error::Kubeconfig)?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(Error::Kubeconfig)?,
        (None, None) => kube::Config::infer().await.map_err(Error::Config)?,
    };
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(Error::Client)?;
    // One request first (`GET /version`, open to every client): a server that cannot be reached
    // is one line naming it, not every check's own error.
    if let Err(e) = client.apiserver_version().await {
        return Err(Error::Unreachable {
            server,
            context: context_name(cluster),
            reason: first_cause(&e),
        });
    }
    Ok(client)
}

/// Where the client's configuration came from, as kubectl names it: `context NAME of FILE`
/// (`--context`, else the kubeconfig's current context), or `the in-cluster config`.
fn context_name(cluster: &ClusterArgs) -> String {
    use kube::config::Kubeconfig;
    let file = match &cluster.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).ok(),
        None => Kubeconfig::read().ok(),
    };
    let source = match &cluster.kubeconfig {
        Some(path) => path.display().to_string(),
        None => std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".to_owned()),
    };
    match (cluster.context.clone(), file) {
        (Some(context), _) => format!("kubeconfig context {context} of {source}"),
        (None, Some(file)) => match file.current_context {
            Some(context) => format!("kubeconfig context {context} of {source}"),
            None => format!("kubeconfig {source}"),
        },
        (None, None) => "the in-cluster config".to_owned(),
    }
}

/// The innermost cause of an error, where the reason is (`Connection refused (os error 111)`),
/// else its own message; an API server's refusal as its status.
fn first_cause(e: &kube::Error) -> String {
    if let kube::Error::Api(status) = e {
        return format!("{} {}: {}", status.code, status.reason, status.message);
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
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
    /// Also check this namespace's agent ServiceAccount and RoleBinding; the dry runs and the
    /// pull check run here (else in `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,

    /// Check the agent account of every namespace that holds an InPlaceRestart JobSet.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

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

    /// Namespace of Kueue's ConfigMap `kueue-manager-config` (its release's), whose
    /// `waitForPodsReady` the kueue-wait-for-pods-ready check reads.
    #[arg(long, default_value = "kueue-system")]
    pub kueue_namespace: String,

    /// Run a short-lived pod with the agent image on a training node (see --nodes) and report
    /// whether the node could pull it; the pod is deleted.
    #[arg(long)]
    pub pull_check: bool,

    /// The training nodes' labels (`pool=train,zone=a`): the nodes the node-features check
    /// looks at, and the pull-check pod's node selector.
    #[arg(long, value_name = "SELECTOR", value_parser = parse_node_selector)]
    pub nodes: Option<BTreeMap<String, String>>,

    /// The agent image to pull (else the webhook Deployment's JOBSET_INPLACE_AGENT_IMAGE).
    #[arg(long, value_name = "IMAGE")]
    pub agent_image: Option<String>,

    /// An imagePullSecret of the pull-check pod (repeatable).
    #[arg(long, value_name = "NAME")]
    pub image_pull_secret: Vec<String>,

    /// How long the pull check waits for the pod to pull or fail.
    #[arg(long, value_parser = parse_duration, default_value = "2m", value_name = "DURATION")]
    pub pull_timeout: Duration,

    /// Only read: skip the checks that send objects to the API server (the dry runs and the
    /// pull check), for an account without `create` rights.
    #[arg(long, conflicts_with = "pull_check")]
    pub read_only: bool,

    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `--nodes`: `key=value` pairs, comma-separated (equality only: it becomes a node selector).
fn parse_node_selector(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((
                k.trim().to_owned(),
                v.trim().trim_start_matches('=').to_owned(),
            )),
            _ => Err(format!(
                "{pair:?} is not key=value (the node selector takes equality only)"
            )),
        })
        .collect()
}

/// The webhook Deployment's agent image: its `JOBSET_INPLACE_AGENT_IMAGE`, else its own image.
async fn installed_agent_image(client: &kube::Client, namespace: &str) -> Option<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    let deployment = kube::Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt("jobset-inplace-webhook")
        .await
        .ok()??;
    let containers = deployment.spec?.template.spec?.containers;
    let container = containers.into_iter().find(|c| c.name == "webhook")?;
    let from_env = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "JOBSET_INPLACE_AGENT_IMAGE")
        .and_then(|e| e.value.clone());
    from_env.or(container.image)
}

/// The namespaces that hold an InPlaceRestart JobSet.
async fn in_place_restart_namespaces(client: &kube::Client) -> Result<Vec<String>, Error> {
    let list = kube::Api::<crate::jobset::JobSet>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|source| Error::List {
            scope: "every namespace".to_owned(),
            source,
        })?;
    let mut namespaces: Vec<String> = list
        .items
        .iter()
        .filter(|js| js.is_in_place_restart())
        .filter_map(|js| js.metadata.namespace.clone())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    Ok(namespaces)
}

impl DoctorArgs {
    pub fn target(&self, global: Global) -> doctor::Target {
        doctor::Target {
            dialect: global.protocol,
            system_namespace: self.system_namespace.clone(),
            webhook_configuration: self.webhook_configuration.clone(),
            tls_secret: self.tls_secret.clone(),
            lease_name: self.lease_name.clone(),
            namespaces: self.namespace.iter().cloned().collect(),
            agent_service_account: self.agent_service_account.clone(),
            agent_role_binding: crate::reconciler::provision::ROLE_BINDING.to_owned(),
            warn_days: self.warn_days,
            nodes: self.nodes.clone().unwrap_or_default(),
            kueue_namespace: self.kueue_namespace.clone(),
        }
    }

    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let client = client(&self.cluster).await?;
        let mut target = self.target(global);
        if self.all_namespaces {
            target
                .namespaces
                .extend(in_place_restart_namespaces(&client).await?);
            target.namespaces.sort();
            target.namespaces.dedup();
        }
        let mut findings = doctor::run_checks(&client, &target, SystemTime::now()).await;
        let pull = if self.pull_check {
            let image = match &self.agent_image {
                Some(image) => Some(image.clone()),
                None => installed_agent_image(&client, &self.system_namespace).await,
            };
            match image {
                Some(image) => Some(preflight::PullCheck {
                    image,
                    node_selector: self.nodes.clone().unwrap_or_default(),
                    pull_secrets: self.image_pull_secret.clone(),
                    timeout: self.pull_timeout,
                }),
                None => {
                    findings.push(
                        doctor::Finding::new(
                            "agent-image-pull",
                            doctor::Outcome::Fail,
                            format!(
                                "no agent image to pull: no Deployment {}/jobset-inplace-webhook",
                                self.system_namespace
                            ),
                        )
                        .fix("name the image with --agent-image"),
                    );
                    None
                }
            }
        } else {
            None
        };
        let probe = preflight::Probe {
            namespace: self
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            agent_service_account: self.agent_service_account.clone(),
            pull,
            read_only: self.read_only,
        };
        findings.extend(preflight::run(&client, &probe).await);
        let failed = findings.iter().any(|f| f.verdict == doctor::Outcome::Fail);
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
            Output::Yaml => yaml(&serde_json::json!({"ok": !failed, "checks": findings}))?,
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
    /// The JobSet's namespace (without a JobSet: the namespace to list).
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,

    /// Without a JobSet: list the InPlaceRestart JobSets of every namespace.
    #[arg(short = 'A', long, conflicts_with = "jobset")]
    pub all_namespaces: bool,

    /// The JobSet's name; without one, the namespace's InPlaceRestart JobSets, one line each.
    pub jobset: Option<String>,

    /// Redraw whenever something changes (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// How often `--watch` reads again.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub interval: Duration,

    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// The dialect of `doctor` and `status`: `--protocol`, else the cluster's JobSet CRD.
async fn dialect(client: &kube::Client, global: Global) -> Result<Choice, Error> {
    match global.protocol {
        Some(d) => Ok(jobset_crd::explicit(d, &format!("--protocol {d}"))),
        None => jobset_crd::read(client, REQUEST_TIMEOUT)
            .await
            .map_err(Error::Dialect),
    }
}

/// `-o yaml`: one YAML document, the same fields as `-o json`.
fn yaml(value: &impl serde::Serialize) -> Result<String, Error> {
    serde_saphyr::to_string(value).map_err(Error::Yaml)
}

fn json_line(value: &impl serde::Serialize) -> Result<String, Error> {
    let mut s = serde_json::to_string(value).map_err(Error::Json)?;
    s.push('\n');
    Ok(s)
}

/// A JobSet `status` could not read: not there (404, said plainly), or why not.
fn read_error(namespace: &str, name: &str, source: kube::Error) -> Error {
    match &source {
        kube::Error::Api(status) if status.code == 404 => Error::NotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        _ => Error::Read {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        },
    }
}

impl StatusArgs {
    /// One reading, rendered.
    async fn read(&self, client: &kube::Client, dialect: Dialect) -> Result<String, Error> {
        match &self.jobset {
            Some(name) => {
                let report = status::fetch(client, &self.namespace, name, dialect)
                    .await
                    .map_err(|source| read_error(&self.namespace, name, source))?;
                match self.output {
                    Output::Text => Ok(report.render()),
                    Output::Json => json_line(&report),
                    Output::Yaml => yaml(&report),
                }
            }
            None => {
                let namespace = (!self.all_namespaces).then_some(self.namespace.as_str());
                let rows = status::fetch_list(client, namespace, dialect)
                    .await
                    .map_err(|source| Error::List {
                        scope: namespace.map_or_else(
                            || "every namespace".to_owned(),
                            |ns| format!("namespace {ns}"),
                        ),
                        source,
                    })?;
                match self.output {
                    Output::Text => Ok(status::render_list(&rows, dialect)),
                    Output::Json => json_line(&rows),
                    Output::Yaml => yaml(&rows),
                }
            }
        }
    }

    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let client = client(&self.cluster).await?;
        let dialect = dialect(&client, global).await?.dialect;
        let first = self.read(&client, dialect).await?;
        write_stdout(&first)?;
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
            match self.read(&client, dialect).await {
                Ok(text) if text != last => {
                    // Text redraws the screen; JSON appends one line per change, YAML one
                    // document.
                    let clear = match self.output {
                        Output::Text => "\x1b[H\x1b[2J",
                        Output::Json => "",
                        Output::Yaml => "---\n",
                    };
                    write_stdout(&format!("{clear}{text}"))?;
                    last = text;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "read failed; retrying"),
            }
        }
    }
}
